/* bench_offload_adamw: the offloaded optimizer's CPU AdamW (worker/offload_adamw.h)
 * in GB/s of memory traffic (bf16 gradient in and parameter out, fp32 master,
 * m and v read and written: 28 bytes per parameter) beside memcpy over the
 * same threads (bytes read + written), for every kernel set this CPU runs and
 * a few thread counts. Each thread updates the part of the arrays it first
 * touched, as the offload does. One "RESULT {json}" line per (isa, threads),
 * with the projected seconds of one update of 8.03e9 parameters (Llama 3 8B).
 * Usage: bench_offload_adamw [GIB_OF_STATE (default 3)] [THREADS...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "worker/offload_adamw.h"

struct arg {
    size_t n;
    float *ms, *m, *v;
    uint16_t *x;
    int isa, what; /* 0 touch, 1 memcpy m -> v, 2 adamw */
    struct oadam_k k;
};

static void job(void *u, int t, int T) {
    struct arg *a = u;
    size_t lo, hi;
    oadam_part(0, a->n, t, T, &lo, &hi);
    if (hi <= lo) return;
    size_t n = hi - lo;
    switch (a->what) {
    case 0:
        memset(a->ms + lo, 0, n * 4), memset(a->m + lo, 0, n * 4), memset(a->v + lo, 0, n * 4);
        memset(a->x + lo, 0, n * 2);
        break;
    case 1:
        memcpy(a->v + lo, a->m + lo, n * 4);
        memcpy(a->m + lo, a->ms + lo, n * 4);
        break;
    default:
        oadam_update(a->isa, 1, &a->k, a->x + lo, a->ms + lo, a->m + lo, a->v + lo, n);
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double timed(struct oadam_pool *p, struct arg *a, int reps) {
    double ms[16];
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_mono_msf();
        oadam_pool_run(p, job, a);
        ms[r] = clock_mono_msf() - t0;
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_d);
    return ms[reps / 2];
}

static void *map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int main(int argc, char **argv) {
    double gib = argc > 1 ? atof(argv[1]) : 3.0;
    size_t n = (size_t)(gib * (1 << 30) / 12) & ~(size_t)63;
    if (n < 1024) n = 1024;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads[8], nt = 0;
    for (int i = 2; i < argc && nt < 8; i++)
        threads[nt++] = atoi(argv[i]);
    if (!nt) {
        threads[nt++] = 1;
        if (cores >= 4) threads[nt++] = (int)(cores / 2);
        if (cores >= 2) threads[nt++] = (int)cores;
    }
    struct arg a = {.n = n};
    a.ms = map(n * 4), a.m = map(n * 4), a.v = map(n * 4), a.x = map(n * 2);
    if (!a.ms || !a.m || !a.v || !a.x) {
        fprintf(stderr, "cannot map %.2f GiB\n", n * 14.0 / (1 << 30));
        return 1;
    }
    a.k = (struct oadam_k){.lr = 1e-4f,
                           .b1 = 0.9f,
                           .b2 = 0.95f,
                           .eps = 1e-8f,
                           .wd = 0.1f,
                           .gs = 1.0f,
                           .c1 = 0.1f,
                           .c2 = 0.05f};
    fprintf(stderr, "%zu parameters (%.2f GiB of state), %ld cores, best isa %s\n", n,
            n * 14.0 / (1 << 30), cores, oadam_isa_name(oadam_isa_best()));
    for (int ti = 0; ti < nt; ti++) {
        struct oadam_pool *p = oadam_pool_new(threads[ti]);
        if (!p) return 1;
        /* the first touch of each part by its thread (pages move only when the
         * thread count changes: then a part may sit on another core's node) */
        a.what = 0;
        double touch = timed(p, &a, 1);
        a.what = 1;
        double cp = timed(p, &a, 5);
        double cp_gbps = 4.0 * n * 4 / (cp / 1e3) / 1e9; /* two copies: read + write each */
        for (int isa = OADAM_BASELINE; isa < OADAM_NISA; isa++) {
            if (oadam_isa_resolve(isa) != isa) continue;
            a.what = 2;
            a.isa = isa;
            double ms = timed(p, &a, 5);
            double gbps = 28.0 * n / (ms / 1e3) / 1e9;
            printf("RESULT {\"bench\":\"offload_adamw\",\"isa\":\"%s\",\"threads\":%d,"
                   "\"params\":%zu,\"ms\":%.2f,\"gbps\":%.1f,\"memcpy_gbps\":%.1f,"
                   "\"of_memcpy\":%.2f,\"s_per_8b_params\":%.2f,\"touch_gib_per_s\":%.1f}\n",
                   oadam_isa_name(isa), threads[ti], n, ms, gbps, cp_gbps, gbps / cp_gbps,
                   ms / 1e3 * 8.03e9 / (double)n, n * 14.0 / (1 << 30) / (touch / 1e3));
            fflush(stdout);
        }
        oadam_pool_free(p);
    }
    return 0;
}
