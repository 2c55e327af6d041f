/* Copy-engine all-reduce for two GPUs of one host: see pair.h for the
 * scheme. Written by hand rather than taken from NCCL because NCCL's
 * all-reduce always runs as SM kernels (its copy-engine collectives cover
 * all-gather-like operations only); the stream memory operations come from
 * the driver through cudaGetDriverEntryPointByVersion, so nothing here links
 * libcuda (the binaries still load on machines without a driver). */
#include "worker/nccl/pair.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "worker/comm/comm.h"
#include "worker/cuda/kernels.h"

#define PAIR_SLOTS     64
#define FLAGS_ARRIVED  0   /* uint32[PAIR_SLOTS]: step whose data the peer copied in */
#define FLAGS_FREED    256 /* uint32[PAIR_SLOTS]: step whose data from us the peer consumed */
#define FLAGS_SELFTEST 512 /* uint32: the set-up check of the stream memory operations */
#define FLAGS_BYTES    1024

typedef CUresult (*memop_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct pair_ar {
    struct comm *c;
    int rank, broken, timeout_ms;
    size_t n, elt, recv_bytes;
    char *buf;  /* the reduced buffer (ours) */
    char *mine; /* our receive area + flags (exported) */
    char *peer; /* the peer's, mapped */
    cudaStream_t compute, cs, cs2, as;
    /* copied2: the second half's copy (on cs2: a second copy engine);
     * gate: cs passed the freed waits (cs2 waits for it) */
    cudaEvent_t fence[PAIR_SLOTS], copied[PAIR_SLOTS], copied2[PAIR_SLOTS], gate, done;
    int split; /* ranges of at least this many bytes are copied in two halves */
    /* LOOM_PAIR_TRACE=N: at step N, time each range's copies and print them */
    int trace;
    cudaEvent_t t0[PAIR_SLOTS], t1[PAIR_SLOTS];
    size_t tbytes[PAIR_SLOTS];
    unsigned slot_step[PAIR_SLOTS]; /* last step each slot was used in (0: never) */
    unsigned step;                  /* the current step, from 1 */
    int used;                       /* slots started this step */
    memop_fn wait32, write32;
    char err[256];
};

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static CUdeviceptr flag(char *base, size_t recv_bytes, int which, int slot) {
    return (CUdeviceptr)(uintptr_t)(base + recv_bytes + which + 4 * slot);
}

static int cuda_ok(struct pair_ar *p, cudaError_t ce, const char *what) {
    if (ce == cudaSuccess) return 1;
    snprintf(p->err, sizeof(p->err), "pair all-reduce: %s: %s", what, cudaGetErrorString(ce));
    p->broken = 1;
    return 0;
}

static int memop_ok(struct pair_ar *p, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 1;
    snprintf(p->err, sizeof(p->err), "pair all-reduce: %s: CUresult %d", what, (int)r);
    p->broken = 1;
    return 0;
}

/* Wait on the host for ev, bounded by the timeout. */
static int host_wait(struct pair_ar *p, cudaEvent_t ev, const char *what) {
    long long t0 = now_us(), deadline = t0 + (long long)p->timeout_ms * 1000;
    for (;;) {
        cudaError_t ce = cudaEventQuery(ev);
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) return cuda_ok(p, ce, what) ? 0 : -1;
        long long t = now_us();
        if (t > deadline) {
            snprintf(p->err, sizeof(p->err),
                     "pair all-reduce: %s not complete after %d ms (the peer is gone or hung)",
                     what, p->timeout_ms);
            p->broken = 1;
            return -1;
        }
        if (t - t0 < 5000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static int load_memops(struct pair_ar *p) {
    enum cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    void *w = NULL, *x = NULL;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &w, 12000, cudaEnableDefault,
                                         &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &x, 12000, cudaEnableDefault,
                                         &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess || !w || !x) {
        snprintf(p->err, sizeof(p->err),
                 "pair all-reduce: the driver has no stream memory operations");
        return -1;
    }
    p->wait32 = (memop_fn)w;
    p->write32 = (memop_fn)x;
    return 0;
}

/* A write on one stream releasing a wait on another, on our own flag: the
 * driver accepts the operations on device memory. */
static int selftest(struct pair_ar *p) {
    CUdeviceptr f = flag(p->mine, p->recv_bytes, FLAGS_SELFTEST, 0);
    if (!memop_ok(p, p->wait32((CUstream)p->as, f, 1, CU_STREAM_WAIT_VALUE_GEQ), "wait value") ||
        !memop_ok(p, p->write32((CUstream)p->cs, f, 1, 0), "write value"))
        return -1;
    if (!cuda_ok(p, cudaEventRecord(p->done, p->as), "event")) return -1;
    return host_wait(p, p->done, "the stream memory operation check");
}

/* Streams and events; the peer mapping when peer_mapped. A broken pair may
 * have a stream stuck on a flag the peer will never write: then nothing is
 * waited for or destroyed (the process is about to exit). */
static void release(struct pair_ar *p, int peer_mapped) {
    if (p->broken) return;
    if (p->cs) cudaStreamSynchronize(p->cs);
    if (p->cs2) cudaStreamSynchronize(p->cs2);
    if (p->as) cudaStreamSynchronize(p->as);
    if (peer_mapped && p->peer) cudaIpcCloseMemHandle(p->peer);
    for (int i = 0; i < PAIR_SLOTS; i++) {
        cudaEvent_t *ev[] = {&p->fence[i], &p->copied[i], &p->copied2[i], &p->t0[i], &p->t1[i]};
        for (int k = 0; k < 5; k++)
            if (*ev[k]) cudaEventDestroy(*ev[k]);
    }
    if (p->gate) cudaEventDestroy(p->gate);
    if (p->done) cudaEventDestroy(p->done);
    if (p->cs) cudaStreamDestroy(p->cs);
    if (p->cs2) cudaStreamDestroy(p->cs2);
    if (p->as) cudaStreamDestroy(p->as);
}

struct pair_ar *pair_ar_new(struct comm *c, void *buf, size_t n, size_t elt, void *compute_stream,
                            int timeout_ms, char *err, size_t errlen) {
    if (comm_size(c) != 2 || elt != 2 || !buf || !compute_stream || n == 0) {
        snprintf(err, errlen,
                 "pair all-reduce: needs 2 ranks and a bf16 device buffer (size %d, elt %zu)",
                 comm_size(c), elt);
        return NULL; /* the same on both ranks: no agreement needed */
    }
    struct pair_ar *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "pair all-reduce: out of memory");
        return NULL;
    }
    p->c = c;
    p->rank = comm_rank(c);
    p->n = n;
    p->elt = elt;
    p->buf = buf;
    p->compute = (cudaStream_t)compute_stream;
    p->timeout_ms = timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    p->step = 1;
    p->recv_bytes = (n * elt + 255) & ~(size_t)255;
    /* LOOM_PAIR_SPLIT_KIB (default 4096): ranges from this size up are
     * copied as two halves on two streams (two copy engines); 0: never */
    const char *sp = getenv("LOOM_PAIR_SPLIT_KIB"), *tr = getenv("LOOM_PAIR_TRACE");
    p->split = sp && *sp ? atoi(sp) * 1024 : 4096 * 1024;
    p->trace = tr && *tr ? atoi(tr) : 0;
    int ok = 1, mapped = 0;
    char *dh = NULL;
    cudaIpcMemHandle_t h[2];
    if (load_memops(p) != 0) ok = 0;
    ok = ok && cuda_ok(p, cudaStreamCreateWithFlags(&p->cs, cudaStreamNonBlocking), "stream");
    ok = ok && cuda_ok(p, cudaStreamCreateWithFlags(&p->cs2, cudaStreamNonBlocking), "stream");
    ok = ok && cuda_ok(p, cudaStreamCreateWithFlags(&p->as, cudaStreamNonBlocking), "stream");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "event");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->gate, cudaEventDisableTiming), "event");
    for (int i = 0; ok && i < PAIR_SLOTS; i++)
        ok =
            cuda_ok(p, cudaEventCreateWithFlags(&p->fence[i], cudaEventDisableTiming), "event") &&
            cuda_ok(p, cudaEventCreateWithFlags(&p->copied[i], cudaEventDisableTiming), "event") &&
            cuda_ok(p, cudaEventCreateWithFlags(&p->copied2[i], cudaEventDisableTiming), "event") &&
            (!p->trace || (cuda_ok(p, cudaEventCreate(&p->t0[i]), "event") &&
                           cuda_ok(p, cudaEventCreate(&p->t1[i]), "event")));
    ok = ok &&
         cuda_ok(p, cudaMalloc((void **)&p->mine, p->recv_bytes + FLAGS_BYTES), "receive area");
    ok = ok && cuda_ok(p, cudaMemset(p->mine + p->recv_bytes, 0, FLAGS_BYTES), "memset");
    ok = ok && selftest(p) == 0;
    memset(h, 0, sizeof(h));
    ok = ok && cuda_ok(p, cudaIpcGetMemHandle(&h[p->rank], p->mine), "ipc handle");
    /* exchange the handles: the one collective every rank makes, ok or not */
    int exch = cuda_ok(p, cudaMalloc((void **)&dh, sizeof(h)), "handle buffer") &&
               cuda_ok(p, cudaMemcpy(dh, h, sizeof(h), cudaMemcpyHostToDevice), "copy") &&
               cuda_ok(p, cudaDeviceSynchronize(), "sync");
    if (!exch ||
        comm_all_gather(c, dh + p->rank * sizeof(h[0]), dh, sizeof(h), COMM_U8, NULL) != 0 ||
        !cuda_ok(p, cudaMemcpy(h, dh, sizeof(h), cudaMemcpyDeviceToHost), "copy")) {
        snprintf(err, errlen, "pair all-reduce: handle exchange: %s",
                 p->err[0] ? p->err : comm_error(c));
        if (dh) cudaFree(dh);
        release(p, 0);
        if (p->mine) cudaFree(p->mine);
        free(p);
        return NULL; /* the comm is broken or the device failed: the caller fails too */
    }
    cudaFree(dh);
    if (ok) {
        void *pp = NULL;
        cudaError_t ce = cudaIpcOpenMemHandle(&pp, h[1 - p->rank], cudaIpcMemLazyEnablePeerAccess);
        if (ce == cudaSuccess) {
            p->peer = pp;
            mapped = 1;
        } else {
            snprintf(p->err, sizeof(p->err), "pair all-reduce: cannot map the peer's memory: %s",
                     cudaGetErrorString(ce));
            ok = 0;
        }
    }
    /* both or neither: the peer may have failed where we did not */
    int agree = ok;
    if (comm_allreduce(c, &agree, 1, COMM_I32, COMM_MIN, NULL) != 0) agree = 0;
    if (!agree) {
        snprintf(err, errlen, "%s",
                 p->err[0] ? p->err : "pair all-reduce: not possible on the peer");
        release(p, mapped);
        /* the peer may still map ours until it learns the outcome: keep ours
         * alive until both have closed (a barrier), then free */
        if (comm_barrier(c, NULL) == 0 && p->mine) cudaFree(p->mine);
        free(p);
        return NULL;
    }
    return p;
}

int pair_ar_start(struct pair_ar *p, size_t lo, size_t hi) {
    if (p->broken) return -1;
    if (hi <= lo) return 0;
    if (hi > p->n || p->used == PAIR_SLOTS) {
        snprintf(p->err, sizeof(p->err), "pair all-reduce: range [%zu, %zu) of %zu, slot %d of %d",
                 lo, hi, p->n, p->used, PAIR_SLOTS);
        p->broken = 1;
        return -1;
    }
    int i = p->used++;
    unsigned s = p->step;
    size_t off = lo * p->elt, bytes = (hi - lo) * p->elt;
    size_t b1 =
        p->split > 0 && bytes >= (size_t)p->split ? (bytes / 2 + 255) & ~(size_t)255 : bytes;
    CUstream cs = (CUstream)p->cs, as = (CUstream)p->as;
    int tr = p->trace && (int)s == p->trace;
    if (!cuda_ok(p, cudaEventRecord(p->fence[i], p->compute), "fence") ||
        !cuda_ok(p, cudaStreamWaitEvent(p->cs, p->fence[i], 0), "fence wait"))
        return -1;
    if (i == 0) /* the peer consumed what we sent into its area before */
        for (int k = 0; k < PAIR_SLOTS; k++)
            if (p->slot_step[k] &&
                !memop_ok(p,
                          p->wait32(cs, flag(p->mine, p->recv_bytes, FLAGS_FREED, k),
                                    p->slot_step[k], CU_STREAM_WAIT_VALUE_GEQ),
                          "wait freed"))
                return -1;
    if (tr && !cuda_ok(p, cudaEventRecord(p->t0[i], p->cs), "event")) return -1;
    if (b1 < bytes) { /* the second half on cs2, after cs's waits */
        if (!cuda_ok(p, cudaEventRecord(p->gate, p->cs), "event") ||
            !cuda_ok(p, cudaStreamWaitEvent(p->cs2, p->gate, 0), "event wait") ||
            !cuda_ok(p,
                     cudaMemcpyAsync(p->peer + off + b1, p->buf + off + b1, bytes - b1,
                                     cudaMemcpyDeviceToDevice, p->cs2),
                     "peer copy") ||
            !cuda_ok(p, cudaEventRecord(p->copied2[i], p->cs2), "event"))
            return -1;
    }
    if (!cuda_ok(p,
                 cudaMemcpyAsync(p->peer + off, p->buf + off, b1, cudaMemcpyDeviceToDevice, p->cs),
                 "peer copy") ||
        (b1 < bytes && !cuda_ok(p, cudaStreamWaitEvent(p->cs, p->copied2[i], 0), "event wait")) ||
        (tr && !cuda_ok(p, cudaEventRecord(p->t1[i], p->cs), "event")) ||
        !cuda_ok(p, cudaEventRecord(p->copied[i], p->cs), "event") ||
        !memop_ok(p, p->write32(cs, flag(p->peer, p->recv_bytes, FLAGS_ARRIVED, i), s, 0),
                  "write arrived") ||
        !cuda_ok(p, cudaStreamWaitEvent(p->as, p->copied[i], 0), "copy wait") ||
        !memop_ok(p,
                  p->wait32(as, flag(p->mine, p->recv_bytes, FLAGS_ARRIVED, i), s,
                            CU_STREAM_WAIT_VALUE_GEQ),
                  "wait arrived"))
        return -1;
    p->tbytes[i] = bytes;
    lk_accumulate((lbf16 *)(p->buf + off), (const lbf16 *)(p->mine + off), hi - lo,
                  (lcuda_stream)p->as);
    if (!memop_ok(p, p->write32(as, flag(p->peer, p->recv_bytes, FLAGS_FREED, i), s, 0),
                  "write freed"))
        return -1;
    p->slot_step[i] = s;
    return 0;
}

int pair_ar_finish(struct pair_ar *p) {
    if (p->broken) return -1;
    if (p->used == 0) return 0;
    if (!cuda_ok(p, cudaEventRecord(p->done, p->as), "event") ||
        !cuda_ok(p, cudaStreamWaitEvent(p->compute, p->done, 0), "event wait"))
        return -1;
    int used = p->used, tr = p->trace && (int)p->step == p->trace;
    p->used = 0;
    p->step++;
    int rc = host_wait(p, p->done, "gradient exchange");
    for (int i = 0; rc == 0 && tr && i < used; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, p->t0[i], p->t1[i]);
        fprintf(stderr,
                "pair trace step %d rank %d range %d: %zu bytes copied in %.3f ms (%.1f GB/s)\n",
                p->trace, p->rank, i, p->tbytes[i], ms, ms > 0 ? p->tbytes[i] / ms / 1e6 : 0.0);
    }
    return rc;
}

const char *pair_ar_error(const struct pair_ar *p) {
    return p ? p->err : "";
}

void pair_ar_free(struct pair_ar *p) {
    if (!p) return;
    int broken = p->broken;
    release(p, 1);
    /* the peer maps our area until it has closed its mapping too */
    if (!broken && comm_barrier(p->c, NULL) == 0) cudaFree(p->mine);
    /* broken: leave it mapped and allocated, the process exits */
    free(p);
}
