/* All-reduce bandwidth of the comm layer's cpu backend (Gloo, TCP loopback):
 * for each rank count and message size, the median time of an in-place f32
 * sum over all ranks, reported as algorithm bandwidth (bytes / time) and bus
 * bandwidth (algbw * 2(n-1)/n, the nccl-tests convention, comparable across
 * rank counts). Ranks are forked from this process with a file: rendezvous.
 * Every result is checked (each rank holds sum over ranks of r+1 = n(n+1)/2),
 * so a wrong collective cannot report a number.
 *
 * Usage: bench_allreduce [--ranks 2,4] [--min-mb 1] [--max-mb 64] [--iters 5]
 * Output: one JSON line per measurement on stdout, a table on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/comm/comm.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One rank: for every size, warm up once, time `iters` all-reduces, write the
 * median (rank 0) to the pipe. Returns 0 when all results were right. */
static int rank_main(int rank, int world, const char *rdzv, double min_mb, double max_mb, int iters,
                     int out_fd) {
    struct comm_world_opts o = {.backend = "gloo", .rank = rank, .world = world, .rdzv = rdzv};
    char err[512];
    struct comm_world *w = comm_world_new(&o, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    int ranks[64];
    for (int i = 0; i < world; i++)
        ranks[i] = i;
    struct comm *c = comm_new(w, "bench", ranks, world, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    size_t maxn = (size_t)(max_mb * 1048576.0) / sizeof(float);
    float *buf = malloc(maxn * sizeof(float));
    double *t = malloc(sizeof(double) * (size_t)iters);
    int bad = 0;
    float want = (float)(world * (world + 1) / 2);
    for (double mb = min_mb; mb <= max_mb * 1.0001 && !bad; mb *= 2) {
        size_t n = (size_t)(mb * 1048576.0) / sizeof(float);
        for (int k = -1; k < iters && !bad; k++) {
            for (size_t i = 0; i < n; i++)
                buf[i] = (float)(rank + 1);
            comm_barrier(c, NULL);
            double t0 = clock_mono_s();
            if (comm_allreduce(c, buf, n, COMM_F32, COMM_SUM, NULL) != 0) bad = 1;
            double dt = clock_mono_s() - t0;
            if (k >= 0) t[k] = dt;
            for (size_t i = 0; i < n && !bad; i += 4099)
                if (buf[i] != want) bad = 1;
            if (buf[n - 1] != want) bad = 1;
        }
        /* Rank 0's median; the slowest rank bounds the collective anyway. */
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        double med = t[iters / 2];
        if (rank == 0 && !bad && write(out_fd, &med, sizeof(med)) != sizeof(med)) bad = 1;
    }
    if (bad) fprintf(stderr, "rank %d: all-reduce failed or gave a wrong result\n", rank);
    free(buf);
    free(t);
    comm_free(c);
    comm_world_free(w);
    return bad;
}

int main(int argc, char **argv) {
    char ranks_arg[64] = "2,4";
    double min_mb = 1, max_mb = 64;
    int iters = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--ranks") == 0)
            snprintf(ranks_arg, sizeof(ranks_arg), "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--min-mb") == 0)
            min_mb = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--max-mb") == 0)
            max_mb = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_allreduce [--ranks 2,4] [--min-mb 1] [--max-mb 64] "
                            "[--iters 5]\n");
            return 2;
        }
    }
#ifndef LOOM_HAVE_GLOO
    printf("SKIP: built without Gloo\n");
    return 77;
#endif
    log_init("bench_allreduce", LOG_WARN);
    if (iters < 1 || min_mb <= 0 || max_mb < min_mb) {
        fprintf(stderr, "bench_allreduce: bad arguments\n");
        return 2;
    }
    int status = 0;
    fprintf(stderr, "%6s %10s %12s %12s %12s\n", "ranks", "MiB", "ms", "algbw GB/s", "busbw GB/s");
    for (char *tok = strtok(ranks_arg, ","); tok; tok = strtok(NULL, ",")) {
        int world = atoi(tok);
        if (world < 2 || world > 64) continue;
        char dir[] = "/tmp/loom-bench-XXXXXX", spec[64];
        if (!mkdtemp(dir)) return 1;
        snprintf(spec, sizeof(spec), "file:%s", dir);
        int fds[2];
        if (pipe(fds) != 0) return 1;
        for (int r = 0; r < world; r++) {
            if (fork() == 0) {
                close(fds[0]);
                _exit(rank_main(r, world, spec, min_mb, max_mb, iters, fds[1]));
            }
        }
        close(fds[1]);
        double med;
        for (double mb = min_mb; mb <= max_mb * 1.0001; mb *= 2) {
            if (read(fds[0], &med, sizeof(med)) != sizeof(med)) break;
            double bytes = mb * 1048576.0, alg = bytes / med / 1e9;
            double bus = alg * 2.0 * (world - 1) / world;
            fprintf(stderr, "%6d %10.2f %12.3f %12.3f %12.3f\n", world, mb, med * 1e3, alg, bus);
            printf("{\"bench\":\"allreduce\",\"backend\":\"gloo\",\"ranks\":%d,\"bytes\":%.0f,"
                   "\"ms\":%.3f,\"algbw_gbps\":%.3f,\"busbw_gbps\":%.3f}\n",
                   world, bytes, med * 1e3, alg, bus);
        }
        close(fds[0]);
        int st;
        while (wait(&st) > 0)
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) status = 1;
    }
    return status;
}
