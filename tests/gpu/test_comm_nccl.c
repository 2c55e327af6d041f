/* GPU test of the nccl comm backend (worker/nccl) through the comm layer:
 * every collective on device buffers against a host reference (sizes
 * divisible and not by the group size, variable slices with empty ones, bf16,
 * p2p ring, barrier), one rank per GPU (2-4 GPUs, forked ranks, file:
 * rendezvous), and a killed peer making the others fail within the timeout.
 * With 2 ranks also the copy-engine pair all-reduce (worker/nccl/pair.h):
 * bit-identical to NCCL's bf16 all-reduce on both ranks over several steps
 * of ranges started while their data is still being written, and a killed
 * peer failing the survivor's step within the timeout.
 * Needs at least 2 GPUs: exits 77 (skipped, never passed) otherwise.
 * Note: written and compiled with the comm layer; first run on the GPU
 * machine belongs to the CUDA issues. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
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
#include "worker/nccl/pair.h"
#define CHECK_WITH_PID
#include "tests/check.h"
#include "worker/safetensors.h" /* st_f32_to_bf16, st_bf16_to_f32 */

static float val(uint64_t seed, int r, size_t i) {
    uint64_t x = seed * 1000003ull + (uint64_t)r * 7919ull + i * 0x100000001b3ull;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (float)((x >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

/* GPU count from a child process, so this process never initialises CUDA
 * before forking the ranks. */
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

static struct comm *join(int rank, int world, const char *rdzv, int timeout_ms,
                         struct comm_world **wout) {
    struct comm_world_opts o = {.backend = "nccl",
                                .device = "cuda",
                                .rank = rank,
                                .world = world,
                                .rdzv = rdzv,
                                .timeout_ms = timeout_ms,
                                .cuda_device = rank};
    char err[512];
    struct comm_world *w = comm_world_new(&o, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return NULL;
    }
    int ranks[8];
    for (int i = 0; i < world; i++)
        ranks[i] = i;
    struct comm *c = comm_new(w, "world", ranks, world, err, sizeof(err));
    if (!c) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        comm_world_free(w);
        return NULL;
    }
    *wout = w;
    return c;
}

static int collectives(int rank, int world, const char *rdzv) {
    struct comm_world *w = NULL;
    struct comm *c = join(rank, world, rdzv, 60000, &w);
    if (!c) return 1;
    static const size_t sizes[] = {1, 7, 1000, 65537, 1 << 20};
    size_t maxn = 1 << 20;
    float *h = malloc(maxn * sizeof(float)), *o = malloc(maxn * sizeof(float)), *d = NULL,
          *d2 = NULL;
    cudaMalloc((void **)&d, maxn * sizeof(float));
    cudaMalloc((void **)&d2, maxn * sizeof(float));
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        /* allreduce */
        for (size_t i = 0; i < n; i++)
            h[i] = val(k, rank, i);
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        CHECK(comm_allreduce(c, d, n, COMM_F32, COMM_SUM, NULL) == 0, "%s", comm_error(c));
        cudaMemcpy(o, d, n * sizeof(float), cudaMemcpyDeviceToHost);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double ref = 0;
            for (int r = 0; r < world; r++)
                ref += val(k, r, i);
            worst = fmax(worst, fabs(o[i] - ref));
        }
        CHECK(worst < 1e-5 * world, "allreduce n=%zu err %g", n, worst);
        /* reduce-scatter (in place) and all-gather (in place) */
        size_t off, cnt;
        comm_shard_range(n, world, rank, &off, &cnt);
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        CHECK(comm_reduce_scatter(c, d, d + off, n, COMM_F32, COMM_SUM, NULL) == 0, "%s",
              comm_error(c));
        cudaMemcpy(o, d + off, cnt * sizeof(float), cudaMemcpyDeviceToHost);
        worst = 0;
        for (size_t i = 0; i < cnt; i++) {
            double ref = 0;
            for (int r = 0; r < world; r++)
                ref += val(k, r, off + i);
            worst = fmax(worst, fabs(o[i] - ref));
        }
        CHECK(worst < 1e-5 * world, "reduce_scatter n=%zu err %g", n, worst);
        for (size_t i = 0; i < n; i++)
            h[i] = (float)i;
        cudaMemcpy(d + off, h + off, cnt * sizeof(float), cudaMemcpyHostToDevice);
        CHECK(comm_all_gather(c, d + off, d, n, COMM_F32, NULL) == 0, "%s", comm_error(c));
        cudaMemcpy(o, d, n * sizeof(float), cudaMemcpyDeviceToHost);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += o[i] != (float)i;
        CHECK(bad == 0, "all_gather n=%zu: %zu wrong", n, bad);
        /* broadcast from the last rank */
        for (size_t i = 0; i < n; i++)
            h[i] = rank == world - 1 ? val(k + 9, 0, i) : 0;
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        CHECK(comm_broadcast(c, d, n, COMM_F32, world - 1, NULL) == 0, "%s", comm_error(c));
        cudaMemcpy(o, d, n * sizeof(float), cudaMemcpyDeviceToHost);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += o[i] != val(k + 9, 0, i);
        CHECK(bad == 0, "broadcast n=%zu: %zu wrong", n, bad);
        /* p2p ring */
        for (size_t i = 0; i < n; i++)
            h[i] = val(k + 5, rank, i);
        cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
        int right = (rank + 1) % world, left = (rank + world - 1) % world;
        CHECK(comm_sendrecv(c, d, n, right, d2, n, left, COMM_F32) == 0, "%s", comm_error(c));
        cudaMemcpy(o, d2, n * sizeof(float), cudaMemcpyDeviceToHost);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += o[i] != val(k + 5, left, i);
        CHECK(bad == 0, "sendrecv n=%zu: %zu wrong", n, bad);
    }
    /* variable slices with an empty one */
    size_t counts[8], total = 0, myoff = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = r == 0 ? 0 : (size_t)(1000 * r + 3);
        if (r < rank) myoff += counts[r];
        total += counts[r];
    }
    for (size_t i = 0; i < total; i++)
        h[i] = val(77, rank, i);
    cudaMemcpy(d, h, total * sizeof(float), cudaMemcpyHostToDevice);
    CHECK(comm_reduce_scatterv(c, d, d + myoff, counts, COMM_F32, COMM_SUM, NULL) == 0, "%s",
          comm_error(c));
    cudaMemcpy(o, d + myoff, counts[rank] * sizeof(float), cudaMemcpyDeviceToHost);
    double worst = 0;
    for (size_t i = 0; i < counts[rank]; i++) {
        double ref = 0;
        for (int r = 0; r < world; r++)
            ref += val(77, r, myoff + i);
        worst = fmax(worst, fabs(o[i] - ref));
    }
    CHECK(worst < 1e-5 * world, "reduce_scatterv err %g", worst);
    CHECK(comm_all_gatherv(c, d + myoff, d, counts, COMM_F32, NULL) == 0, "%s", comm_error(c));
    CHECK(comm_barrier(c, NULL) == 0, "barrier: %s", comm_error(c));
    /* host buffers (the engine's loss / grad-norm sums and stop agreement):
     * staged through device memory by the backend */
    double hs[2] = {rank + 1.0, 0.5 * rank};
    CHECK(comm_allreduce(c, hs, 2, COMM_F64, COMM_SUM, NULL) == 0, "%s", comm_error(c));
    CHECK(hs[0] == world * (world + 1) / 2.0 && hs[1] == 0.25 * world * (world - 1),
          "host f64 allreduce: %g %g", hs[0], hs[1]);
    int32_t hi = rank == 1 ? 0 : 1;
    CHECK(comm_allreduce(c, &hi, 1, COMM_I32, COMM_MIN, NULL) == 0, "%s", comm_error(c));
    CHECK(hi == 0, "host i32 min allreduce: %d", (int)hi);
    int32_t hb = rank == 0 ? 1234 : -1;
    CHECK(comm_broadcast(c, &hb, 1, COMM_I32, 0, NULL) == 0, "%s", comm_error(c));
    CHECK(hb == 1234, "host broadcast: %d", (int)hb);
    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(o);
    comm_free(c);
    comm_world_free(w);
    return check_failures ? 1 : 0;
}

static int killed_peer(int rank, int world, const char *rdzv) {
    struct comm_world *w = NULL;
    struct comm *c = join(rank, world, rdzv, 5000, &w);
    if (!c) return 1;
    float *d = NULL;
    cudaMalloc((void **)&d, 4096 * sizeof(float));
    CHECK(comm_allreduce(c, d, 4096, COMM_F32, COMM_SUM, NULL) == 0, "warm-up");
    if (rank == world - 1) raise(SIGKILL);
    double t0 = clock_mono_s();
    int rc = 0;
    for (int k = 0; k < 1000 && rc == 0; k++)
        rc = comm_allreduce(c, d, 4096, COMM_F32, COMM_SUM, NULL);
    double dt = clock_mono_s() - t0;
    fprintf(stderr, "rank %d: after the kill: rc %d after %.2f s: %s\n", rank, rc, dt,
            comm_error(c));
    _exit(rc < 0 && dt < 5 + 10 ? 3 : 1);
}

/* Steps of: write each range's values (on a compute stream, after a kernel-
 * free delay made of many small copies), start its exchange at once; finish;
 * compare with the host sum and with NCCL's all-reduce of the same input.
 * Between the ranges a side message (pair_ar_side_send) goes to the peer,
 * which reads it on its stream and gives the space back; each step's must
 * arrive intact (the area is reused every step). */
static int pair_collective(int rank, int world, const char *rdzv) {
    struct comm_world *w = NULL;
    struct comm *c = join(rank, world, rdzv, 20000, &w);
    if (!c) return 1;
    const size_t n = 3000017; /* odd: unaligned range ends take the scalar path */
    static const size_t cut[] = {0, 1, 4096, 4099, 700001, 1600000, 2999999, 3000017};
    const int nr = (int)(sizeof(cut) / sizeof(cut[0])) - 1;
    uint16_t *h = malloc(n * 2), *peer = malloc(n * 2), *o = malloc(n * 2), *o2 = malloc(n * 2);
    uint16_t *d = NULL, *d2 = NULL;
    cudaStream_t cs;
    cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    cudaMalloc((void **)&d, n * 2);
    cudaMalloc((void **)&d2, n * 2);
    char err[256];
    /* 256 KiB chunks: the larger ranges are cut into several, on both copy
     * streams, with odd element counts at the ends */
    const struct pair_ar_tuning tune = {.chunk_kib = 256};
    struct pair_ar *p = pair_ar_new(c, d, n, 2, cs, 65536, 20000, &tune, err, sizeof(err));
    CHECK(p != NULL, "pair_ar_new: %s", err);
    uint32_t *sd = NULL, *hs = NULL, *got = NULL;
    const int ns = 1000;
    cudaMalloc((void **)&sd, ns * 4);
    cudaMallocHost((void **)&hs, ns * 4);
    cudaMallocHost((void **)&got, ns * 4);
    for (int step = 0; p && step < 6; step++) {
        for (size_t i = 0; i < n; i++) {
            h[i] = st_f32_to_bf16(val(100 + step, rank, i) * (1 + (i % 97)));
            peer[i] = st_f32_to_bf16(val(100 + step, 1 - rank, i) * (1 + (i % 97)));
        }
        for (int r = 0; r < nr; r++) {
            size_t lo = cut[r], hi = cut[r + 1];
            /* the rank that writes slower differs by step: ranges are started
             * while the peer is still behind or ahead */
            int reps = ((step + rank) % 2) ? 40 : 1;
            for (int k = 0; k < reps; k++)
                cudaMemcpyAsync(d + lo, h + lo, (hi - lo) * 2, cudaMemcpyHostToDevice, cs);
            CHECK(pair_ar_start(p, lo, hi) == 0, "start [%zu,%zu): %s", lo, hi, pair_ar_error(p));
            if (r == 2) {
                cudaStreamSynchronize(cs); /* hs is rewritten below */
                for (int i = 0; i < ns; i++)
                    hs[i] = (uint32_t)rank * 1000000u + (uint32_t)step * 1000u + (uint32_t)i;
                cudaMemcpyAsync(sd, hs, ns * 4, cudaMemcpyHostToDevice, cs);
                int slot = pair_ar_side_send(p, 4096, sd, ns * 4);
                CHECK(slot >= 0, "side send: %s", pair_ar_error(p));
                CHECK(pair_ar_side_wait(p, slot, cs) == 0, "side wait: %s", pair_ar_error(p));
                cudaMemcpyAsync(got, pair_ar_side_ptr(p, 4096), ns * 4, cudaMemcpyDeviceToHost, cs);
                CHECK(pair_ar_side_release(p, cs, 1) == 0, "side release: %s", pair_ar_error(p));
            }
        }
        CHECK(pair_ar_finish(p) == 0, "finish: %s", pair_ar_error(p));
        cudaStreamSynchronize(cs);
        int sbad = 0;
        for (int i = 0; i < ns; i++)
            sbad +=
                got[i] != (uint32_t)(1 - rank) * 1000000u + (uint32_t)step * 1000u + (uint32_t)i;
        CHECK(sbad == 0, "rank %d step %d: %d of %d side message words wrong", rank, step, sbad,
              ns);
        cudaMemcpyAsync(o, d, n * 2, cudaMemcpyDeviceToHost, cs);
        cudaStreamSynchronize(cs);
        /* NCCL's two-rank bf16 sum of the same input */
        cudaMemcpy(d2, h, n * 2, cudaMemcpyHostToDevice);
        CHECK(comm_allreduce(c, d2, n, COMM_BF16, COMM_SUM, NULL) == 0, "%s", comm_error(c));
        cudaMemcpy(o2, d2, n * 2, cudaMemcpyDeviceToHost);
        size_t bad = 0, bad2 = 0, first = n;
        for (size_t i = 0; i < n; i++) {
            uint16_t want = st_f32_to_bf16(st_bf16_to_f32(h[i]) + st_bf16_to_f32(peer[i]));
            if (o[i] != want && bad++ == 0) first = i;
            if (o[i] != o2[i]) bad2++;
        }
        CHECK(bad == 0, "rank %d step %d: %zu of %zu sums wrong, first at %zu: %#x vs %#x", rank,
              step, bad, n, first, first < n ? o[first] : 0,
              first < n ? st_f32_to_bf16(st_bf16_to_f32(h[first]) + st_bf16_to_f32(peer[first]))
                        : 0);
        CHECK(bad2 == 0, "rank %d step %d: %zu of %zu differ from NCCL's all-reduce", rank, step,
              bad2, n);
    }
    pair_ar_free(p);
    cudaFree(d);
    cudaFree(d2);
    cudaFree(sd);
    cudaFreeHost(hs);
    cudaFreeHost(got);
    free(h);
    free(peer);
    free(o);
    free(o2);
    comm_free(c);
    comm_world_free(w);
    return check_failures ? 1 : 0;
}

/* The peer dies after one good step: the survivor's next step fails within
 * the timeout (3 s) instead of hanging. Exit 3 = as expected. */
static int pair_killed(int rank, int world, const char *rdzv) {
    struct comm_world *w = NULL;
    struct comm *c = join(rank, world, rdzv, 3000, &w);
    if (!c) return 1;
    size_t n = 1 << 20;
    uint16_t *d = NULL;
    cudaStream_t cs;
    cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    cudaMalloc((void **)&d, n * 2);
    cudaMemsetAsync(d, 0, n * 2, cs);
    char err[256];
    struct pair_ar *p = pair_ar_new(c, d, n, 2, cs, 0, 3000, NULL, err, sizeof(err));
    if (!p) {
        fprintf(stderr, "rank %d: pair_ar_new: %s\n", rank, err);
        _exit(1);
    }
    if (pair_ar_start(p, 0, n) != 0 || pair_ar_finish(p) != 0) _exit(1);
    if (rank == 1) raise(SIGKILL);
    double t0 = clock_mono_s();
    int rc = pair_ar_start(p, 0, n);
    if (rc == 0) rc = pair_ar_finish(p);
    double dt = clock_mono_s() - t0;
    fprintf(stderr, "rank %d: pair step after the kill: rc %d after %.2f s: %s\n", rank, rc, dt,
            pair_ar_error(p));
    _exit(rc < 0 && dt < 3 + 5 ? 3 : 1);
}

static unsigned run(int world, int (*fn)(int, int, const char *), int *st) {
    char dir[] = "/tmp/loom-test-nccl-XXXXXX", spec[64];
    if (!mkdtemp(dir)) return ~0u;
    snprintf(spec, sizeof(spec), "file:%s", dir);
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(fn(r, world, spec));
    }
    unsigned bad = 0;
    for (int r = 0; r < world; r++) {
        waitpid(pids[r], &st[r], 0);
        if (!WIFEXITED(st[r]) || WEXITSTATUS(st[r]) != 0) bad |= 1u << r;
    }
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return bad;
}

int main(void) {
    log_init("test_comm_nccl", LOG_WARN);
    int n = gpu_count();
    if (n < 2) {
        printf("SKIP: %d GPU(s); the nccl comm test needs at least 2\n", n);
        return 77;
    }
    int world = n < 4 ? n : 4, st[8];
    unsigned bad = run(world, collectives, st);
    CHECK(bad == 0, "collectives on %d GPUs: ranks failed (mask %#x)", world, bad);
    bad = run(world, killed_peer, st);
    for (int r = 0; r + 1 < world; r++)
        CHECK(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 3, "killed peer: rank %d status %#x", r,
              st[r]);
    bad = run(2, pair_collective, st);
    CHECK(bad == 0, "pair all-reduce on 2 GPUs: ranks failed (mask %#x)", bad);
    bad = run(2, pair_killed, st);
    CHECK(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 3, "pair, killed peer: rank 0 status %#x",
          st[0]);
    printf("test_comm_nccl (%d GPUs): %s\n", world, check_failures ? "FAIL" : "ok");
    return check_failures ? 1 : 0;
}
