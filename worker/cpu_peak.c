/* CPU peak calibration (worker/cpu_peak.h). */
#define _GNU_SOURCE
#include "worker/cpu_peak.h"

#include "common/log.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

/* One rank's share of a small model's GEMMs: big enough to reach the
 * kernels' steady rate, small enough (3 MiB) to run many times in budget. */
enum { PEAK_N = 256, PEAK_IC = 512, PEAK_OC = 512 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cpu_peak_measure(struct backend *be, double budget_s) {
    size_t nx = (size_t)PEAK_N * PEAK_IC, nw = (size_t)PEAK_OC * PEAK_IC;
    size_t no = (size_t)PEAK_N * PEAK_OC;
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w), *o = malloc(no * sizeof *o);
    double best = 0;
    if (!x || !w || !o) goto out;
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)((i * 7u) % 13u) * 0.01f - 0.06f;
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)((i * 5u) % 11u) * 0.01f - 0.05f;
    const double flops = 2.0 * PEAK_N * PEAK_IC * PEAK_OC;
    be->matmul_fwd(be->ctx, o, x, w, NULL, PEAK_N, PEAK_IC, PEAK_OC); /* warm-up */
    be->sync(be->ctx);
    double end = now_s() + budget_s;
    for (int rep = 0; rep < 3 || now_s() < end; rep++) {
        double t0 = now_s();
        be->matmul_fwd(be->ctx, o, x, w, NULL, PEAK_N, PEAK_IC, PEAK_OC);
        be->sync(be->ctx);
        double dt = now_s() - t0;
        if (dt > 0 && flops / dt / 1e9 > best) best = flops / dt / 1e9;
        if (rep > 10000) break;
    }
out:
    free(x);
    free(w);
    free(o);
    return best;
}

double cpu_peak_from_env(struct backend *be) {
    const char *v = getenv("LOOM_CPU_PEAK_GFLOPS");
    if (!v || !*v) return 0;
    char *end = NULL;
    errno = 0;
    double g = strtod(v, &end);
    if (errno || end == v || *end || !(g > 0 && g <= 1e7)) {
        log_warn("LOOM_CPU_PEAK_GFLOPS='%.40s' is not a number in (0, 1e7]: mfu not reported", v);
        return 0;
    }
    be->peak_flops = g * 1e9;
    return g;
}
