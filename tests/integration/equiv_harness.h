/* Helpers shared by the equivalence tests that drive the real loom-worker
 * (test_dp_equiv.c, test_par_equiv.c, test_offload_equiv.c): CHECK, run a
 * layout as a child process, read an exported model back and compare two,
 * write the small training shard. Header-only (static functions) because
 * each test is one translation unit. */
#ifndef LOOM_TESTS_EQUIV_HARNESS_H
#define LOOM_TESTS_EQUIV_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/data.h"
#include "worker/safetensors.h"
#include "tests/check.h"

/* The failed CHECKs of the test (each test is one translation unit). */

/* Run `worker --spec spec --out out --threads 1 --nproc nproc` with stdout to
 * outfile; sched (may be NULL: the worker's default) sets --pp-schedule,
 * export_path (may be NULL) --export, steps > 0 --steps. Returns the exit
 * code (128 + signal when killed). */
static int equiv_run_worker(const char *worker, const char *spec, const char *out,
                            const char *outfile, int nproc, const char *sched,
                            const char *export_path, int steps) {
    pid_t p = fork();
    if (p == 0) {
        FILE *o = freopen(outfile, "w", stdout);
        if (!o) _exit(126);
        char np[16], st[16];
        snprintf(np, sizeof(np), "%d", nproc);
        snprintf(st, sizeof(st), "%d", steps);
        const char *argv[24] = {worker, "--spec",  spec, "--out",       out,   "--threads",
                                "1",    "--nproc", np,   "--log-level", "warn"};
        int n = 11;
        if (sched) {
            argv[n++] = "--pp-schedule";
            argv[n++] = sched;
        }
        if (steps > 0) {
            argv[n++] = "--steps";
            argv[n++] = st;
        }
        if (export_path) {
            argv[n++] = "--export";
            argv[n++] = export_path;
        }
        argv[n] = NULL;
        setenv("LOOM_COMM_TIMEOUT_MS", "30000", 1);
        execv(worker, (char **)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Every tensor of a safetensors export as one fp32 array (caller frees), in
 * file order; *n = element count. NULL when the file cannot be read. */
static float *equiv_load_export(const char *path, size_t *n) {
    struct st_file *f = NULL;
    char err[256];
    if (st_open(path, &f, err, sizeof(err)) != 0) return NULL;
    size_t total = 0;
    for (size_t i = 0; i < st_count(f); i++)
        total += st_at(f, i)->nbytes / 4;
    float *h = malloc((total ? total : 1) * sizeof(float)), *p = h;
    for (size_t i = 0; h && i < st_count(f); i++) {
        const struct st_info *t = st_at(f, i);
        if (st_read(f, t->name, ST_F32, p, t->nbytes, err, sizeof(err)) != 0) {
            free(h);
            h = NULL;
            break;
        }
        p += t->nbytes / 4;
    }
    st_close(f);
    *n = total;
    return h;
}

/* DIR/train_000.bin: 40,000 byte tokens of deterministic pseudo-text. */
static int equiv_make_data(const char *dir, char *err, size_t errlen) {
    uint32_t *tok = malloc(40000 * sizeof(*tok));
    if (!tok) return -1;
    const char *words[] = {"the ", "loom ", "weaves ",  "threads ", "into ", "cloth ",
                           "and ", "a ",    "shuttle ", "moves ",   "warp ", "weft "};
    size_t n = 0;
    for (uint32_t s = 3; n < 40000; s = s * 1103515245u + 12345u)
        for (const char *c = words[(s >> 16) % 12]; *c && n < 40000; c++)
            tok[n++] = (unsigned char)*c;
    char p[512];
    snprintf(p, sizeof(p), "%s/train_000.bin", dir);
    int rc = data_shard_write(p, 1, tok, n, err, errlen);
    free(tok);
    return rc;
}

/* The exports a and b hold the same weights: every value within tol,
 * relative to 1 + |b|. Prints the worst difference under `tag`. */
static void equiv_compare_exports(const char *tag, const char *a, const char *b, double tol) {
    size_t na = 0, nb = 0;
    float *x = equiv_load_export(a, &na), *y = equiv_load_export(b, &nb);
    CHECK(x && y && na == nb && na > 0, "%s: exports unreadable or of different sizes", tag);
    if (x && y && na == nb) {
        double worst = 0;
        for (size_t i = 0; i < na; i++) {
            double d = fabs((double)x[i] - y[i]) / (1 + fabs((double)y[i]));
            worst = d > worst ? d : worst;
        }
        CHECK(worst <= tol, "%s: final weights differ by %.3g", tag, worst);
        fprintf(stderr, "%-22s final weights max diff %.2e over %zu values\n", tag, worst, na);
    }
    free(x);
    free(y);
}

#endif
