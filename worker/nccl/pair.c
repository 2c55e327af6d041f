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

#include "common/clock.h"
#include "worker/comm/comm.h"
#include "worker/cuda/kernels.h"

#define PAIR_SLOTS       1024 /* chunks a step */
#define PAIR_MAX_CHUNKS  16   /* per range */
#define FLAGS_ARRIVED    0    /* uint32[PAIR_SLOTS]: the step whose chunk the peer copied in */
#define FLAGS_FREED      4096 /* uint32: chunks of ours the peer has consumed, in total */
#define FLAGS_SELFTEST   4352 /* uint32: the set-up check of the stream memory operations */
#define FLAGS_SIDE_FREED 4480 /* uint32: side messages of ours the peer has consumed, in total */
#define FLAGS_BYTES      4608

typedef CUresult (*memop_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct pair_ar {
    struct comm *c;
    int rank, broken, timeout_ms;
    size_t n, elt, recv_bytes;
    char *buf;  /* the reduced buffer (ours) */
    char *mine; /* our receive area + flags (exported) */
    char *peer; /* the peer's, mapped */
    /* cs[0], cs[1]: copy streams (chunks alternate: two copy engines busy);
     * as: the adds; gate: cs[0] passed the step's freed wait */
    cudaStream_t compute, cs[2], as;
    cudaEvent_t fence, gate, done, *copied; /* copied[PAIR_SLOTS] */
    /* side messages (pair_ar_side_send): copied on ss into the peer's side
     * area (after the flags); mark: the add stream's position at
     * pair_ar_mark; cdone: the compute stream's for pair_ar_sync_compute */
    cudaStream_t ss;
    cudaEvent_t mark, cdone;
    size_t side_bytes;
    unsigned side_sent, side_consumed;
    size_t chunk;      /* bytes: ranges are cut into chunks of about this size */
    unsigned step;     /* the current step, from 1 */
    int used;          /* chunks started this step */
    unsigned sent;     /* chunks sent to the peer, in total */
    unsigned consumed; /* the peer's chunks we added, in total */
    memop_fn wait32, write32;
    /* LOOM_PAIR_TRACE=N: at step N, time each chunk's copy and print it */
    int trace;
    cudaEvent_t *t0, *t1, *ta, tb; /* copy start, copy end, add end; compute at finish */
    size_t *tbytes;
    char err[256];
};

static CUdeviceptr flag(char *base, size_t recv_bytes, int which, int slot) {
    return (CUdeviceptr)(uintptr_t)(base + recv_bytes + which + 4 * (size_t)slot);
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
    long long t0 = clock_mono_us(), deadline = t0 + (long long)p->timeout_ms * 1000;
    for (;;) {
        cudaError_t ce = cudaEventQuery(ev);
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) return cuda_ok(p, ce, what) ? 0 : -1;
        long long t = clock_mono_us();
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
            clock_sleep_us(20);
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
        !memop_ok(p, p->write32((CUstream)p->cs[0], f, 1, 0), "write value"))
        return -1;
    if (!cuda_ok(p, cudaEventRecord(p->done, p->as), "event")) return -1;
    return host_wait(p, p->done, "the stream memory operation check");
}

/* Streams and events; the peer mapping when peer_mapped. A broken pair may
 * have a stream stuck on a flag the peer will never write: then nothing is
 * waited for or destroyed (the process is about to exit). */
static void release(struct pair_ar *p, int peer_mapped) {
    if (p->broken) return;
    for (int k = 0; k < 2; k++)
        if (p->cs[k]) cudaStreamSynchronize(p->cs[k]);
    if (p->as) cudaStreamSynchronize(p->as);
    if (peer_mapped && p->peer) cudaIpcCloseMemHandle(p->peer);
    for (int i = 0; i < PAIR_SLOTS; i++) {
        if (p->copied && p->copied[i]) cudaEventDestroy(p->copied[i]);
        if (p->t0 && p->t0[i]) cudaEventDestroy(p->t0[i]);
        if (p->t1 && p->t1[i]) cudaEventDestroy(p->t1[i]);
        if (p->ta && p->ta[i]) cudaEventDestroy(p->ta[i]);
    }
    if (p->ss) cudaStreamSynchronize(p->ss);
    cudaEvent_t ev[] = {p->fence, p->gate, p->done, p->mark, p->cdone};
    for (int k = 0; k < 5; k++)
        if (ev[k]) cudaEventDestroy(ev[k]);
    if (p->ss) cudaStreamDestroy(p->ss);
    for (int k = 0; k < 2; k++)
        if (p->cs[k]) cudaStreamDestroy(p->cs[k]);
    if (p->as) cudaStreamDestroy(p->as);
    free(p->copied);
    free(p->t0);
    free(p->t1);
    free(p->ta);
    if (p->tb) cudaEventDestroy(p->tb);
    free(p->tbytes);
    p->copied = p->t0 = p->t1 = p->ta = NULL;
    p->tbytes = NULL;
}

struct pair_ar *pair_ar_new(struct comm *c, void *buf, size_t n, size_t elt, void *compute_stream,
                            size_t side_bytes, int timeout_ms, const struct pair_ar_tuning *t,
                            char *err, size_t errlen) {
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
    p->side_bytes = (side_bytes + 255) & ~(size_t)255;
    p->timeout_ms = timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    p->step = 1;
    p->recv_bytes = (n * elt + 255) & ~(size_t)255;
    /* pair-chunk-kib (default 8192): ranges are cut into chunks of about
     * this size (at most 16 a range), copied alternately on two streams,
     * each added as soon as it has arrived */
    p->chunk = (size_t)(t && t->chunk_kib > 0 ? t->chunk_kib : 8192) * 1024;
    p->trace = t ? (int)t->trace : 0;
    int ok = 1, mapped = 0;
    char *dh = NULL;
    cudaIpcMemHandle_t h[2];
    if (load_memops(p) != 0) ok = 0;
    p->copied = calloc(PAIR_SLOTS, sizeof(cudaEvent_t));
    p->tbytes = calloc(PAIR_SLOTS, sizeof(size_t));
    if (p->trace) {
        p->t0 = calloc(PAIR_SLOTS, sizeof(cudaEvent_t));
        p->t1 = calloc(PAIR_SLOTS, sizeof(cudaEvent_t));
        p->ta = calloc(PAIR_SLOTS, sizeof(cudaEvent_t));
    }
    if (!p->copied || !p->tbytes || (p->trace && (!p->t0 || !p->t1 || !p->ta))) {
        snprintf(p->err, sizeof(p->err), "pair all-reduce: out of memory");
        ok = 0;
    }
    /* pair-priority=high: the copy and add streams at the device's highest
     * priority (their blocks are scheduled ahead of the backward's pending
     * ones), else the default */
    const char *pr = t ? t->priority : NULL;
    int lo_pri = 0, hi_pri = 0;
    if (pr && strcmp(pr, "high") == 0) cudaDeviceGetStreamPriorityRange(&lo_pri, &hi_pri);
    (void)lo_pri;
    for (int k = 0; k < 2; k++)
        ok =
            ok && cuda_ok(p, cudaStreamCreateWithPriority(&p->cs[k], cudaStreamNonBlocking, hi_pri),
                          "stream");
    ok = ok &&
         cuda_ok(p, cudaStreamCreateWithPriority(&p->as, cudaStreamNonBlocking, hi_pri), "stream");
    ok = ok && cuda_ok(p, cudaStreamCreateWithFlags(&p->ss, cudaStreamNonBlocking), "stream");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->mark, cudaEventDisableTiming), "event");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->cdone, cudaEventDisableTiming), "event");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "event");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->gate, cudaEventDisableTiming), "event");
    ok = ok && cuda_ok(p, cudaEventCreateWithFlags(&p->fence, cudaEventDisableTiming), "event");
    for (int i = 0; ok && i < PAIR_SLOTS; i++)
        ok = cuda_ok(p, cudaEventCreateWithFlags(&p->copied[i], cudaEventDisableTiming), "event") &&
             (!p->trace || (cuda_ok(p, cudaEventCreate(&p->t0[i]), "event") &&
                            cuda_ok(p, cudaEventCreate(&p->t1[i]), "event") &&
                            cuda_ok(p, cudaEventCreate(&p->ta[i]), "event")));
    ok = ok && (!p->trace || cuda_ok(p, cudaEventCreate(&p->tb), "event"));
    ok =
        ok && cuda_ok(p, cudaMalloc((void **)&p->mine, p->recv_bytes + FLAGS_BYTES + p->side_bytes),
                      "receive area");
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

/* Before a copy: the copy streams wait for what the compute stream has
 * issued so far; at the first copy of a step, for the peer to have consumed
 * everything we sent it before (its receive and side areas are free again). */
static int begin(struct pair_ar *p) {
    if (!cuda_ok(p, cudaEventRecord(p->fence, p->compute), "fence")) return -1;
    cudaStream_t all[] = {p->cs[0], p->cs[1], p->ss};
    for (int k = 0; k < 3; k++)
        if (!cuda_ok(p, cudaStreamWaitEvent(all[k], p->fence, 0), "fence wait")) return -1;
    if (p->used > 0) return 0;
    if (p->step > 1 &&
        (!memop_ok(p,
                   p->wait32((CUstream)p->cs[0], flag(p->mine, p->recv_bytes, FLAGS_FREED, 0),
                             p->sent, CU_STREAM_WAIT_VALUE_GEQ),
                   "wait freed") ||
         !memop_ok(p,
                   p->wait32((CUstream)p->cs[0], flag(p->mine, p->recv_bytes, FLAGS_SIDE_FREED, 0),
                             p->side_sent, CU_STREAM_WAIT_VALUE_GEQ),
                   "wait side freed")))
        return -1;
    if (!cuda_ok(p, cudaEventRecord(p->gate, p->cs[0]), "event")) return -1;
    for (int k = 1; k < 3; k++)
        if (!cuda_ok(p, cudaStreamWaitEvent(all[k], p->gate, 0), "event wait")) return -1;
    return 0;
}

int pair_ar_start(struct pair_ar *p, size_t lo, size_t hi) {
    if (p->broken) return -1;
    if (hi <= lo) return 0;
    size_t bytes = (hi - lo) * p->elt, nch = (bytes + p->chunk - 1) / p->chunk;
    if (nch > PAIR_MAX_CHUNKS) nch = PAIR_MAX_CHUNKS;
    if (hi > p->n || p->used + (int)nch > PAIR_SLOTS) {
        snprintf(p->err, sizeof(p->err),
                 "pair all-reduce: range [%zu, %zu) of %zu, %zu chunks after %d of %d", lo, hi,
                 p->n, nch, p->used, PAIR_SLOTS);
        p->broken = 1;
        return -1;
    }
    unsigned s = p->step;
    CUstream as = (CUstream)p->as;
    if (begin(p) != 0) return -1;
    /* chunk boundaries on 256-byte multiples */
    size_t per = ((bytes + nch - 1) / nch + 255) & ~(size_t)255;
    for (size_t off = lo * p->elt, end = hi * p->elt; off < end; off += per) {
        size_t cb = end - off < per ? end - off : per;
        int i = p->used++;
        cudaStream_t st = p->cs[i & 1];
        int tr = p->trace && (int)s == p->trace;
        if ((tr && !cuda_ok(p, cudaEventRecord(p->t0[i], st), "event")) ||
            !cuda_ok(p,
                     cudaMemcpyAsync(p->peer + off, p->buf + off, cb, cudaMemcpyDeviceToDevice, st),
                     "peer copy") ||
            (tr && !cuda_ok(p, cudaEventRecord(p->t1[i], st), "event")) ||
            !cuda_ok(p, cudaEventRecord(p->copied[i], st), "event") ||
            !memop_ok(
                p, p->write32((CUstream)st, flag(p->peer, p->recv_bytes, FLAGS_ARRIVED, i), s, 0),
                "write arrived") ||
            /* the add overwrites what our copy reads: after it */
            !cuda_ok(p, cudaStreamWaitEvent(p->as, p->copied[i], 0), "copy wait") ||
            !memop_ok(p,
                      p->wait32(as, flag(p->mine, p->recv_bytes, FLAGS_ARRIVED, i), s,
                                CU_STREAM_WAIT_VALUE_GEQ),
                      "wait arrived"))
            return -1;
        lk_accumulate((lbf16 *)(p->buf + off), (const lbf16 *)(p->mine + off), cb / p->elt,
                      (lcuda_stream)p->as);
        if (tr && !cuda_ok(p, cudaEventRecord(p->ta[i], p->as), "event")) return -1;
        if (!memop_ok(
                p, p->write32(as, flag(p->peer, p->recv_bytes, FLAGS_FREED, 0), ++p->consumed, 0),
                "write freed"))
            return -1;
        p->tbytes[i] = cb;
        p->sent++;
    }
    return 0;
}

int pair_ar_finish(struct pair_ar *p) {
    if (p->broken) return -1;
    if (p->used == 0) return 0;
    /* done covers the side copies too (their sources may be rewritten next) */
    if (p->side_sent && (!cuda_ok(p, cudaEventRecord(p->done, p->ss), "event") ||
                         !cuda_ok(p, cudaStreamWaitEvent(p->as, p->done, 0), "event wait")))
        return -1;
    if (!cuda_ok(p, cudaEventRecord(p->done, p->as), "event") ||
        !cuda_ok(p, cudaStreamWaitEvent(p->compute, p->done, 0), "event wait"))
        return -1;
    int used = p->used, tr = p->trace && (int)p->step == p->trace;
    /* trace: the compute stream's position now (the caller synchronised it:
     * the end of the backward) */
    if (tr && !cuda_ok(p, cudaEventRecord(p->tb, p->compute), "event")) return -1;
    p->used = 0;
    p->step++;
    int rc = host_wait(p, p->done, "gradient exchange");
    for (int i = 0; rc == 0 && tr && i < used; i++) {
        if (!p->tbytes[i]) continue; /* a side message */
        float ms = 0, c0 = 0, a1 = 0;
        cudaEventElapsedTime(&ms, p->t0[i], p->t1[i]);
        cudaEventElapsedTime(&c0, p->tb, p->t0[i]);
        cudaEventElapsedTime(&a1, p->tb, p->ta[i]);
        fprintf(stderr,
                "pair trace step %d rank %d chunk %d (stream %d): %zu bytes in %.3f ms (%.1f "
                "GB/s); copy start %+.3f ms, add end %+.3f ms from the end of the backward\n",
                p->trace, p->rank, i, i & 1, p->tbytes[i], ms,
                ms > 0 ? p->tbytes[i] / ms / 1e6 : 0.0, c0, a1);
    }
    return rc;
}

int pair_ar_side_send(struct pair_ar *p, size_t off, const void *src, size_t bytes) {
    if (p->broken) return -1;
    if (off + bytes > p->side_bytes || p->used + 1 > PAIR_SLOTS) {
        snprintf(p->err, sizeof(p->err),
                 "pair all-reduce: side message [%zu, +%zu) of %zu, slot %d of %d", off, bytes,
                 p->side_bytes, p->used, PAIR_SLOTS);
        p->broken = 1;
        return -1;
    }
    if (begin(p) != 0) return -1;
    int i = p->used++;
    char *dst = p->peer + p->recv_bytes + FLAGS_BYTES + off;
    if ((bytes && !cuda_ok(p, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, p->ss),
                           "side copy")) ||
        !memop_ok(
            p,
            p->write32((CUstream)p->ss, flag(p->peer, p->recv_bytes, FLAGS_ARRIVED, i), p->step, 0),
            "write arrived"))
        return -1;
    p->tbytes[i] = 0;
    p->side_sent++;
    return i;
}

int pair_ar_side_wait(struct pair_ar *p, int slot, void *stream) {
    if (p->broken || slot < 0) return -1;
    return memop_ok(p,
                    p->wait32((CUstream)stream, flag(p->mine, p->recv_bytes, FLAGS_ARRIVED, slot),
                              p->step, CU_STREAM_WAIT_VALUE_GEQ),
                    "wait side arrived")
               ? 0
               : -1;
}

void *pair_ar_side_ptr(struct pair_ar *p, size_t off) {
    return p->mine + p->recv_bytes + FLAGS_BYTES + off;
}

int pair_ar_side_release(struct pair_ar *p, void *stream, int count) {
    if (p->broken) return -1;
    p->side_consumed += (unsigned)count;
    return memop_ok(p,
                    p->write32((CUstream)stream, flag(p->peer, p->recv_bytes, FLAGS_SIDE_FREED, 0),
                               p->side_consumed, 0),
                    "write side freed")
               ? 0
               : -1;
}

int pair_ar_mark(struct pair_ar *p) {
    if (p->broken) return -1;
    return cuda_ok(p, cudaEventRecord(p->mark, p->as), "mark") ? 0 : -1;
}

int pair_ar_wait_mark(struct pair_ar *p, void *stream) {
    if (p->broken) return -1;
    return cuda_ok(p, cudaStreamWaitEvent((cudaStream_t)stream, p->mark, 0), "mark wait") ? 0 : -1;
}

int pair_ar_sync_compute(struct pair_ar *p) {
    if (p->broken) return -1;
    if (!cuda_ok(p, cudaEventRecord(p->cdone, p->compute), "event")) return -1;
    return host_wait(p, p->cdone, "compute waiting for the peer");
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
