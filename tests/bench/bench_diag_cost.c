/* What diagnosis sampling adds per training step, piece by piece, on this
 * host (docs/perf.md "Diagnosis cost"): the end-to-end A/B of bench_diag.py
 * cannot resolve a fraction of a percent on a loaded machine, so the work
 * itself is timed here, each piece in a loop of N repetitions:
 *   line     a rank writes its rank_step line (train_emit_rank_step: pack,
 *            dump, fprintf and fflush, one write(2) a line) to a file, as
 *            the worker does to the task's stdout.log under loom-agent;
 *   clock    one clock_mono_msf() read (about ten a step);
 *   parse    the line parsed back (json_loads), as the agent does per line
 *            and loomd per item of a metrics batch, plus diag_times;
 *   judge    diag_add of one record at world W (2, 8, 64, 512): loomd's rule
 *            work per rank per step, a full step judged every W records.
 * Usage: bench_diag_cost [N] (default 200000). Prints one line per piece and
 * 'RESULT {json}' with ns per operation; exits 1 when a check fails (the
 * file holds N lines, every line parses, no finding for equal ranks). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/diagnose.h"
#include "worker/train.h"

static double ns_per(double ms, long n) {
    return ms * 1e6 / (double)n;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    if (n < 10) n = 10;
    int fail = 0;
    char path[] = "/tmp/loom-bench-diag-cost-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w+") : NULL;
    if (!f) {
        fprintf(stderr, "bench_diag_cost: cannot create %s\n", path);
        return 1;
    }
    struct train_step_info in = {.ms_step = 35.25,
                                 .ms_compute = 30.125,
                                 .ms_comm = 4.0625,
                                 .ms_data = 1.0625,
                                 .ms_optimizer = 2.5};
    /* line */
    double t0 = clock_mono_msf();
    for (long i = 0; i < n; i++)
        train_emit_rank_step(f, 1, i + 1, &in);
    double line_ns = ns_per(clock_mono_msf() - t0, n);
    /* clock */
    double sink = 0;
    t0 = clock_mono_msf();
    for (long i = 0; i < n; i++)
        sink += clock_mono_msf();
    double clock_ns = ns_per(clock_mono_msf() - t0, n);
    /* parse: read the lines back */
    rewind(f);
    char *buf = NULL;
    size_t cap = 0;
    long lines = 0, bad = 0;
    double st, cp, cm, parse_ms = 0;
    while (getline(&buf, &cap, f) > 0) {
        double p0 = clock_mono_msf();
        json_t *j = json_loads(buf, 0, NULL);
        int rc = j ? diag_times(j, &st, &cp, &cm) : -1;
        json_decref(j);
        parse_ms += clock_mono_msf() - p0;
        lines++;
        if (rc != 0 || st != in.ms_step || cp != in.ms_compute + in.ms_data) bad++;
    }
    free(buf);
    fclose(f);
    unlink(path);
    if (lines != n || bad) {
        fprintf(stderr, "FAIL: %ld lines written, %ld read, %ld wrong\n", n, lines, bad);
        fail = 1;
    }
    double parse_ns = ns_per(parse_ms, lines > 0 ? lines : 1);
    printf("line   %8.0f ns  a rank_step line written and flushed (one per rank and step)\n",
           line_ns);
    printf("clock  %8.1f ns  a monotonic clock read (about ten per step)\n", clock_ns);
    printf("parse  %8.0f ns  a line parsed back (agent per line, loomd per record)\n", parse_ns);
    /* judge */
    static const int worlds[] = {2, 8, 64, 512};
    double judge_ns[4];
    for (int w = 0; w < 4; w++) {
        int W = worlds[w];
        struct diag *d = diag_new(W, W);
        if (!d) return 1;
        struct diag_finding out[8];
        long steps = n / W > 20 ? n / W : 20, found = 0;
        t0 = clock_mono_msf();
        for (long s = 1; s <= steps; s++)
            for (int r = 0; r < W; r++)
                found += diag_add(d, s, r, 35.0, 30.0 + 0.01 * r, 5.0 - 0.01 * r, out, 8);
        judge_ns[w] = ns_per(clock_mono_msf() - t0, steps * W);
        diag_free(d);
        if (found) {
            fprintf(stderr, "FAIL: world %d: %ld findings for equal ranks\n", W, found);
            fail = 1;
        }
        printf("judge  %8.0f ns  a record into diag_add at world %d\n", judge_ns[w], W);
    }
    double per_rank = line_ns + 10 * clock_ns;
    printf("per rank and step on the worker: %.1f us; against a 35 ms step: %.4f %%\n",
           per_rank / 1e3, 100 * per_rank / 35e6);
    printf("RESULT {\"n\":%ld,\"line_ns\":%.0f,\"clock_ns\":%.1f,\"parse_ns\":%.0f,"
           "\"judge_ns\":{\"2\":%.0f,\"8\":%.0f,\"64\":%.0f,\"512\":%.0f},\"sink\":%d}\n",
           n, line_ns, clock_ns, parse_ns, judge_ns[0], judge_ns[1], judge_ns[2], judge_ns[3],
           sink > 0);
    return fail;
}
