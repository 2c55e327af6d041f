/* loom-nodecheck: the measuring side of a node check (loomctl node check).
 * One process per rank, started by loom-agent (agent/nodecheck.c) with the
 * worker's environment contract (LOOM_RANK, LOOM_WORLD, LOOM_RDZV,
 * LOOM_RDZV_TOKEN, CUDA_VISIBLE_DEVICES); it joins the world through the comm
 * layer (worker/comm/comm.h: Gloo for cpu devices, NCCL for cuda) and times
 * an in-place f32 sum all-reduce over message sizes, as nccl-tests'
 * all_reduce_perf does:
 *   algbw = bytes / time,   busbw = algbw * 2(n-1)/n
 * (busbw is comparable across rank counts and with the link's bandwidth).
 * Each size: one warm-up, then `iters` timed runs between barriers; the
 * reported time is the slowest rank's median. Every result is checked (each
 * element must equal n(n+1)/2), so a broken collective cannot report a
 * number. Run across the GPUs of one node it measures the intra-node fabric
 * (NVLink/PCIe); with one rank on each of two nodes it measures the path
 * between them (bandwidth of the largest size, latency of the smallest).
 *
 * Usage: loom-nodecheck [--device cpu|cuda] [--min-bytes N] [--max-bytes N] [--iters N]
 * Output (stdout, JSON lines, rank 0 only): {"type":"size",...} per size and
 * one {"type":"summary","world","backend","peak_busbw_gbps","latency_us",...}.
 * Exit 0 ok, 1 failure (message on stderr and a {"type":"error"} line). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "worker/comm/comm.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

struct opts {
    const char *device;
    size_t min_bytes, max_bytes;
    int iters;
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fail_line(int rank, const char *msg) {
    fprintf(stderr, "loom-nodecheck: rank %d: %s\n", rank, msg);
    if (rank == 0) {
        printf("{\"type\":\"error\",\"message\":\"");
        for (const char *p = msg; *p; p++)
            if (*p == '"' || *p == '\\')
                printf("\\%c", *p);
            else if ((unsigned char)*p >= 0x20)
                putchar(*p);
        printf("\"}\n");
        fflush(stdout);
    }
}

/* Host staging buffer and (for cuda) the device buffer the collective uses. */
struct buf {
    float *host;
    void *dev; /* == host for cpu */
    int cuda;
};

static int buf_init(struct buf *b, size_t n, int cuda) {
    b->cuda = cuda;
    b->host = malloc(n * sizeof(float));
    if (!b->host) return -1;
    b->dev = b->host;
#ifdef LOOM_HAVE_CUDA
    if (cuda && cudaMalloc(&b->dev, n * sizeof(float)) != cudaSuccess) return -1;
#else
    if (cuda) return -1;
#endif
    return 0;
}

static void buf_free(struct buf *b) {
#ifdef LOOM_HAVE_CUDA
    if (b->cuda && b->dev) cudaFree(b->dev);
#endif
    free(b->host);
}

/* Fill with `v`; copy to the device for cuda. */
static int buf_fill(struct buf *b, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        b->host[i] = v;
#ifdef LOOM_HAVE_CUDA
    if (b->cuda && cudaMemcpy(b->dev, b->host, n * sizeof(float), cudaMemcpyHostToDevice))
        return -1;
#endif
    return 0;
}

/* 1 when every element equals want (after copying back for cuda). */
static int buf_check(struct buf *b, size_t n, float want) {
#ifdef LOOM_HAVE_CUDA
    if (b->cuda && cudaMemcpy(b->host, b->dev, n * sizeof(float), cudaMemcpyDeviceToHost)) return 0;
#endif
    for (size_t i = 0; i < n; i++)
        if (b->host[i] != want) return 0;
    return 1;
}

static int parse(int argc, char **argv, struct opts *o) {
    *o = (struct opts){.device = "cpu", .min_bytes = 4096, .max_bytes = 16u << 20, .iters = 5};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--device") && v)
            o->device = argv[++i];
        else if (!strcmp(argv[i], "--min-bytes") && v)
            o->min_bytes = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--max-bytes") && v)
            o->max_bytes = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--iters") && v)
            o->iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: loom-nodecheck [--device cpu|cuda] [--min-bytes N] "
                            "[--max-bytes N] [--iters N]\n");
            return -1;
        }
    }
    if (o->min_bytes < 4) o->min_bytes = 4;
    if (o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
    if (o->iters < 1 || o->iters > 1000) o->iters = 5;
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda")) return -1;
    return 0;
}

/* One device: an all-reduce over one rank copies nothing between devices,
 * so a bandwidth or latency figure would only time a no-op (the old report
 * of "5.57e+04 GB/s, latency 0 us"). What still makes sense: the collective
 * path works and sums correctly, and the device memory of the largest size
 * can be allocated, written and read back. The summary names what ran and
 * what was skipped and why; bandwidth and latency are null. */
static int single_device(struct comm *c, struct buf *b, size_t maxn, struct opts o, int rank,
                         const char *backend) {
    if (buf_fill(b, maxn, 1.0f) != 0 || !buf_check(b, maxn, 1.0f)) {
        fail_line(rank, "device memory: a written buffer did not read back");
        return 1;
    }
    size_t cnt = o.min_bytes / sizeof(float);
    if (buf_fill(b, cnt, 1.0f) != 0 || comm_allreduce(c, b->dev, cnt, COMM_F32, COMM_SUM, NULL) ||
        !buf_check(b, cnt, 1.0f)) {
        fail_line(rank, comm_error(c)[0] ? comm_error(c) : "all-reduce over one rank: wrong sum");
        return 1;
    }
#ifdef LOOM_HAVE_CUDA
    if (!strcmp(o.device, "cuda")) cudaDeviceSynchronize();
#endif
    printf("{\"type\":\"summary\",\"test\":\"allreduce\",\"world\":1,\"backend\":\"%s\","
           "\"device\":\"%s\",\"peak_busbw_gbps\":null,\"peak_algbw_gbps\":null,"
           "\"latency_us\":null,\"checked\":true,"
           "\"ran\":[\"allreduce_sum\",\"device_memory\"],\"memory_bytes\":%zu,"
           "\"skipped\":[{\"test\":\"bandwidth\",\"why\":\"one device: an all-reduce over one "
           "rank moves no data between devices\"},{\"test\":\"latency\",\"why\":\"one device: "
           "no peer to exchange with\"}]}\n",
           backend, o.device, maxn * sizeof(float));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    struct opts o;
    if (parse(argc, argv, &o) != 0) return 2;
    struct comm_world_opts wo = {.device = o.device, .rank = -1, .world = 1};
    comm_world_opts_from_env(&wo);
    char err[512];
    int rc = 1, cuda = !strcmp(o.device, "cuda");
    struct comm_world *w = NULL;
    struct comm *c = NULL;
    struct buf b = {0};
    double *times = NULL, *all = NULL;
    if (wo.rank < 0) wo.rank = 0;
    w = comm_world_new(&wo, err, sizeof err);
    if (!w) {
        fail_line(wo.rank, err);
        goto out;
    }
    int rank = comm_world_rank(w), n = comm_world_size(w);
    int *ranks = malloc((size_t)n * sizeof(int));
    if (!ranks) goto out;
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    c = comm_new(w, "nodecheck", ranks, n, err, sizeof err);
    free(ranks);
    if (!c) {
        fail_line(rank, err);
        goto out;
    }
    size_t maxn = o.max_bytes / sizeof(float);
    times = calloc((size_t)o.iters, sizeof(double));
    all = calloc((size_t)n, sizeof(double));
    if (!times || !all || buf_init(&b, maxn, cuda) != 0) {
        fail_line(rank, cuda ? "cannot allocate buffers (cuda build?)" : "out of memory");
        goto out;
    }
    const float want = (float)n * (float)(n + 1) / 2.0f;
    if (n == 1) {
        rc = single_device(c, &b, maxn, o, rank, comm_world_backend(w));
        goto out;
    }
    double peak = 0, lat_us = 0, peak_alg = 0;
    size_t peak_bytes = 0;
    for (size_t bytes = o.min_bytes;; bytes *= 2) {
        if (bytes > o.max_bytes) bytes = o.max_bytes;
        size_t cnt = bytes / sizeof(float);
        for (int it = -1; it < o.iters; it++) {
            if (buf_fill(&b, cnt, (float)(rank + 1)) != 0 || comm_barrier(c, NULL) != 0) {
                fail_line(rank, comm_error(c)[0] ? comm_error(c) : "barrier/fill failed");
                goto out;
            }
            double t0 = clock_mono_s();
            int e = comm_allreduce(c, b.dev, cnt, COMM_F32, COMM_SUM, NULL);
#ifdef LOOM_HAVE_CUDA
            if (cuda) cudaDeviceSynchronize();
#endif
            double t = clock_mono_s() - t0;
            if (e != 0) {
                fail_line(rank, comm_error(c));
                goto out;
            }
            if (!buf_check(&b, cnt, want)) {
                char m[160];
                snprintf(m, sizeof m, "all-reduce of %zu bytes gave a wrong sum (want %g)", bytes,
                         (double)want);
                fail_line(rank, m);
                goto out;
            }
            if (it >= 0) times[it] = t;
        }
        qsort(times, (size_t)o.iters, sizeof *times, cmp_double);
        /* The slowest rank's median is the collective's time. */
        for (int i = 0; i < n; i++)
            all[i] = i == rank ? times[o.iters / 2] : 0;
        /* nccl comms take device buffers only: there each rank keeps its own
         * time (ranks leave a collective together, so they differ little). */
        if (!cuda && comm_allreduce(c, all, (size_t)n, COMM_F64, COMM_MAX, NULL) != 0) {
            fail_line(rank, comm_error(c));
            goto out;
        }
        double med = 0;
        for (int i = 0; i < n; i++)
            if (all[i] > med) med = all[i];
        if (med <= 0) med = times[o.iters / 2];
        double algbw = (double)bytes / med / 1e9;
        double busbw = n > 1 ? algbw * 2.0 * (n - 1) / n : algbw;
        if (bytes == o.min_bytes) lat_us = med * 1e6;
        if (busbw > peak) {
            peak = busbw;
            peak_alg = algbw;
            peak_bytes = bytes;
        }
        if (rank == 0) {
            printf("{\"type\":\"size\",\"bytes\":%zu,\"time_us\":%.2f,\"algbw_gbps\":%.4f,"
                   "\"busbw_gbps\":%.4f}\n",
                   bytes, med * 1e6, algbw, busbw);
            fflush(stdout);
        }
        if (bytes >= o.max_bytes) break;
    }
    if (rank == 0) {
        printf("{\"type\":\"summary\",\"test\":\"allreduce\",\"world\":%d,\"backend\":\"%s\","
               "\"device\":\"%s\",\"peak_busbw_gbps\":%.4f,\"peak_algbw_gbps\":%.4f,"
               "\"peak_bytes\":%zu,\"latency_us\":%.2f,\"iters\":%d,\"checked\":true}\n",
               n, comm_world_backend(w), o.device, peak, peak_alg, peak_bytes, lat_us, o.iters);
        fflush(stdout);
    }
    rc = 0;
out:
    buf_free(&b);
    free(times);
    free(all);
    comm_free(c);
    comm_world_free(w);
    return rc;
}
