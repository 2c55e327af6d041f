/* Host NF4 quantization throughput (worker/nf4.c): the serial reference
 * (nf4_quantize_serial) against the fast quantizer (nf4_quantize_mt) on 1, 2
 * and N threads, over N(0, 0.02) weights; each run's bytes are compared with
 * the reference's. Also the seed initialisation of the same weights
 * (model_fill_normal on N threads), the other heavy part of a QLoRA start-up
 * from a seed, for the estimate of a Llama 2 70B start-up (68.98e9 block
 * linear weights: init plus quantization, the upload overlapped).
 *
 *   bench_nf4 [--n WEIGHTS (default 67108864)] [--threads N (default: the
 *             online CPUs, capped)] [--reps 3]
 *
 * Human lines on stderr, one "RESULT {json}" line on stdout; exit 1 when a
 * variant's bytes differ from the reference. docs/perf.md "NF4 quantization". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/model.h"
#include "worker/nf4.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best of reps: weights per second (threads 0: the serial reference). */
static double run(const float *w, size_t n, uint8_t *out, int threads, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        if (threads == 0)
            nf4_quantize_serial(w, n, out);
        else
            nf4_quantize_mt(w, n, out, threads);
        t = now() - t;
        best = t < best ? t : best;
    }
    return (double)n / best;
}

int main(int argc, char **argv) {
    size_t n = (size_t)1 << 26;
    int nt = nf4_threads(), reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n"))
            n = (size_t)strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--threads"))
            nt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_nf4 [--n WEIGHTS] [--threads N] [--reps R]\n");
            return 2;
        }
    }
    if (n < 1 || nt < 1 || nt > NF4_MAX_THREADS || reps < 1) {
        fprintf(stderr, "bad --n %zu, --threads %d (1..%d) or --reps %d\n", n, nt, NF4_MAX_THREADS,
                reps);
        return 2;
    }
    size_t nb = nf4_bytes(n);
    float *w = malloc(n * sizeof *w);
    uint8_t *ref = malloc(nb), *out = malloc(nb);
    if (!w || !ref || !out) {
        fprintf(stderr, "out of memory for %zu weights\n", n);
        return 1;
    }
    uint64_t s = 0x243f6a8885a308d3ull;
    for (size_t j = 0; j < n; j += 2) { /* Box-Muller pairs */
        double u[2];
        for (int k = 0; k < 2; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            u[k] = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        }
        double r = 0.02 * sqrt(-2.0 * log(u[0]));
        w[j] = (float)(r * cos(2 * M_PI * u[1]));
        if (j + 1 < n) w[j + 1] = (float)(r * sin(2 * M_PI * u[1]));
    }
    int th[4] = {0, 1, 2, nt}, same = 1;
    double wps[4];
    const char *name[4] = {"serial", "fast_1", "fast_2", "fast_n"};
    for (int v = 0; v < 4; v++) {
        wps[v] = run(w, n, v ? out : ref, th[v], reps);
        int ok = !v || memcmp(out, ref, nb) == 0;
        same &= ok;
        fprintf(stderr, "nf4 %-7s %2d threads: %8.1f Mweights/s (%.2f ns a weight)%s\n", name[v],
                th[v] ? th[v] : 1, wps[v] / 1e6, 1e9 / wps[v], ok ? "" : "  BYTES DIFFER");
    }
    double t = now();
    model_fill_normal(w, n, 42, 0.02, 0, nt);
    double init_wps = (double)n / (now() - t);
    fprintf(stderr, "seed init (model_fill_normal) %2d threads: %8.1f Mweights/s\n", nt,
            init_wps / 1e6);
    /* 69e9 weights (a Llama 2 70B's block linear weights) at the N-thread rates */
    double est = 68.98e9 / wps[3], est_init = 68.98e9 / init_wps;
    fprintf(stderr,
            "speed-up: %.2fx on 1 thread, %.2fx on %d; 70B base: quantization %.0f s serial, "
            "%.1f s now; seed init %.1f s; start-up about %.0f s\n",
            wps[1] / wps[0], wps[3] / wps[0], nt, 68.98e9 / wps[0], est, est_init, est + est_init);
    printf("RESULT {\"bench\":\"nf4_quantize\",\"n\":%zu,\"threads\":%d,\"serial_wps\":%.4g,"
           "\"fast1_wps\":%.4g,\"fast2_wps\":%.4g,\"fastn_wps\":%.4g,\"speedup_1\":%.3f,"
           "\"speedup_n\":%.3f,\"init_wps\":%.4g,\"est_70b_quant_s\":%.2f,\"est_70b_init_s\":%.2f,"
           "\"identical\":%s}\n",
           n, nt, wps[0], wps[1], wps[2], wps[3], wps[1] / wps[0], wps[3] / wps[0], init_wps, est,
           est_init, same ? "true" : "false");
    free(w), free(ref), free(out);
    return same ? 0 : 1;
}
