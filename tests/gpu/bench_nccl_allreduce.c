/* All-reduce bus bandwidth through the engine's comm layer on the nccl
 * backend (worker/comm + worker/nccl), one forked rank per GPU with a file:
 * rendezvous: for each size from --min-mb to --max-mb (doubling), an in-place
 * f32 sum, warmed up twice, then `iters` timed calls (each call blocks until
 * complete, as the engine uses it); rank 0 reports the median as algorithm
 * bandwidth (bytes / time) and bus bandwidth (algbw * 2(n-1)/n, the nccl-tests
 * convention), comparable with tests/gpu/torch_allreduce.py.
 * Every size is checked (rank r holds r+1; the sum is n(n+1)/2 everywhere),
 * so a wrong collective never reports a number. Exits 77 below 2 GPUs.
 * Usage: bench_nccl_allreduce [--min-mb 1] [--max-mb 1024] [--iters 20]
 * Output: one JSON line per size on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/comm/comm.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GPU count from a child, so this process never initialises CUDA before forking. */
static int gpu_count(void) {
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 8 ? 8 : n);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

static void fill_host(float *h, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        h[i] = v;
}

static int rank_main(int rank, int world, const char *rdzv, double min_mb, double max_mb,
                     int iters) {
    struct comm_world_opts o = {.backend = "nccl",
                                .device = "cuda",
                                .rank = rank,
                                .world = world,
                                .rdzv = rdzv,
                                .timeout_ms = 120000,
                                .cuda_device = rank};
    char err[512];
    struct comm_world *w = comm_world_new(&o, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    int ranks[8];
    for (int i = 0; i < world; i++)
        ranks[i] = i;
    struct comm *c = comm_new(w, "bench", ranks, world, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        comm_world_free(w);
        return 1;
    }
    size_t maxn = (size_t)(max_mb * 1048576.0) / sizeof(float);
    float *d = NULL, probe[2];
    float *h = malloc(maxn * sizeof(float));
    if (!h || cudaMalloc((void **)&d, maxn * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "rank %d: cannot allocate %zu floats\n", rank, maxn);
        return 1;
    }
    fill_host(h, maxn, (float)(rank + 1));
    double *t = calloc((size_t)iters, sizeof(double));
    int bad = 0;
    for (double mb = min_mb; mb <= max_mb * 1.0001 && !bad; mb *= 2) {
        size_t n = (size_t)(mb * 1048576.0) / sizeof(float);
        /* check once on fresh data: every element becomes n(n+1)/2 */
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        if (comm_allreduce(c, d, n, COMM_F32, COMM_SUM, NULL) != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, comm_error(c));
            bad = 1;
            break;
        }
        float want = (float)(world * (world + 1) / 2);
        cudaMemcpy(&probe[0], d, sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(&probe[1], d + n - 1, sizeof(float), cudaMemcpyDeviceToHost);
        if (probe[0] != want || probe[1] != want) {
            fprintf(stderr, "rank %d: %.0f MiB: got %g/%g, want %g\n", rank, mb, probe[0], probe[1],
                    want);
            bad = 1;
            break;
        }
        comm_allreduce(c, d, n, COMM_F32, COMM_SUM, NULL); /* warm-up (values grow: fine) */
        for (int k = 0; k < iters; k++) {
            comm_barrier(c, NULL);
            double t0 = clock_mono_s();
            if (comm_allreduce(c, d, n, COMM_F32, COMM_SUM, NULL) != 0) bad = 1;
            t[k] = clock_mono_s() - t0;
        }
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        double med = t[iters / 2], bytes = (double)n * sizeof(float);
        double alg = bytes / med / 1e9, bus = alg * 2.0 * (world - 1) / world;
        if (rank == 0)
            printf("{\"impl\":\"loom-nccl\",\"ranks\":%d,\"mib\":%.0f,\"us\":%.1f,"
                   "\"algbw_gbs\":%.2f,\"busbw_gbs\":%.2f}\n",
                   world, mb, med * 1e6, alg, bus);
        fflush(stdout);
    }
    free(t);
    free(h);
    cudaFree(d);
    comm_free(c);
    comm_world_free(w);
    return bad;
}

int main(int argc, char **argv) {
    double min_mb = 1, max_mb = 1024;
    int iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--min-mb") == 0)
            min_mb = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--max-mb") == 0)
            max_mb = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
    }
    if (min_mb <= 0 || max_mb < min_mb || iters < 1) {
        fprintf(stderr, "usage: bench_nccl_allreduce [--min-mb X] [--max-mb Y] [--iters N]\n");
        return 2;
    }
    log_init("bench_nccl_allreduce", LOG_WARN);
    int world = gpu_count();
    if (world < 2) {
        printf("SKIP: %d GPU(s); the all-reduce benchmark needs at least 2\n", world);
        return 77;
    }
    char dir[] = "/tmp/loom-bench-nccl-XXXXXX", spec[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(spec, sizeof(spec), "file:%s", dir);
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(r, world, spec, min_mb, max_mb, iters));
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return bad;
}
