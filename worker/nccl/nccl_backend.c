/* The cuda comm backend: NCCL behind the C backend interface of
 * worker/comm/comm_backend.h. Buffers are device memory of the rank's GPU.
 *
 * - Set-up: comm rank 0 makes the unique id and publishes it in the attempt's
 *   rendezvous under "nccl/<comm key>/id"; the others wait for it there (the
 *   same store and timeout as the cpu backend). Communicators are created
 *   non-blocking (config.blocking = 0) so that set-up and every operation can
 *   be abandoned at the deadline: on a timeout or an asynchronous error the
 *   comm is aborted (ncclCommAbort) and the call fails with a message naming
 *   the cause, instead of spinning forever on a dead peer.
 * - Semantics match the other backends: an operation is complete when the
 *   call returns (it is enqueued on the comm's stream, then the stream is
 *   polled to completion). The caller must have finished the work producing
 *   the input (synchronised its compute stream) before the call. Overlap with
 *   compute comes from comm.c running the call on the comm's own thread.
 * - Uneven slices (total not divisible by the group size, or the v-variants): reduce-scatter is
 *   a group of ncclReduce calls (one per shard, rooted at its owner) and
 *   all-gather a group of ncclBroadcast calls; the divisible case uses
 *   ncclReduceScatter / ncclAllGather directly.
 * - Host buffers: the engine all-reduces a few host scalars (loss and grad-norm
 *   sums as f64, the stop agreement as i32). allreduce and broadcast detect a
 *   host pointer and stage it through a device buffer of the comm (grown on
 *   demand, a few bytes in practice); the other collectives need device memory.
 * - Ordering after the compute stream without a host wait: nccl_order.h.
 * - NCCL_NVLS_ENABLE=0 comes from the agent's environment contract.
 * Compiled wherever CUDA is; exercised by the GPU tests of the CUDA issues. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>

#include "common/clock.h"
#include "worker/comm/comm_backend.h"
#include "worker/nccl/nccl_order.h"

struct nccl_world {
    const struct comm_backend_world *w;
    int device;
};

struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size, device, timeout_ms;
    float *scratch; /* one float for the barrier */
    void *stage;    /* device staging for host buffers */
    size_t stage_bytes;
    int aborted;
    cudaEvent_t sev; /* after the last allreduce_stream operation */
    int sev_pending;
};

struct nccl_p2p {
    cudaEvent_t done;
};

/* nccl_order.h: fences keyed by the device range they guard. The engine
 * thread marks a range after issuing the work that produces (or last touches)
 * it; an operation on a buffer overlapping a marked range makes its stream
 * wait for that range's latest fence. Keyed by range, not "latest fence",
 * because the engine issues the whole backward far ahead of the GPU: a
 * single latest fence would make every reduction wait for the end of the
 * backward (measured: 19 ms exposed of a 37 ms step). Process-wide (one
 * compute stream per worker); the mutex orders the engine thread's records
 * against the comm threads' waits. */
#define ORDER_MAX 256
static struct {
    pthread_mutex_t mu;
    cudaStream_t compute;
    int on;
    unsigned long long seq;
    struct {
        uintptr_t lo, hi;
        cudaEvent_t ev;
        unsigned long long seq; /* 0: free */
    } f[ORDER_MAX];
} order = {.mu = PTHREAD_MUTEX_INITIALIZER};

int nccl_order_attach(void *compute_stream) {
    pthread_mutex_lock(&order.mu);
    order.compute = (cudaStream_t)compute_stream;
    order.on = 1;
    pthread_mutex_unlock(&order.mu);
    return 0;
}

void nccl_order_mark(const void *p, size_t bytes) {
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    pthread_mutex_lock(&order.mu);
    if (!order.on || bytes == 0) goto out;
    int k = -1, oldest = 0;
    for (int i = 0; i < ORDER_MAX && k < 0; i++) {
        if (order.f[i].seq && order.f[i].lo == lo && order.f[i].hi == hi) k = i;
        if (order.f[i].seq < order.f[oldest].seq) oldest = i;
    }
    if (k < 0) {
        k = oldest;
        if (order.f[k].seq) {
            /* reusing a fence another range may still need: let its work
             * finish first, so a later wait that no longer finds it is moot */
            cudaEventSynchronize(order.f[k].ev);
        } else if (cudaEventCreateWithFlags(&order.f[k].ev, cudaEventDisableTiming) !=
                   cudaSuccess) {
            cudaStreamSynchronize(order.compute); /* no event: order by a host wait */
            goto out;
        }
        order.f[k].lo = lo;
        order.f[k].hi = hi;
    }
    cudaEventRecord(order.f[k].ev, order.compute);
    order.f[k].seq = ++order.seq;
out:
    pthread_mutex_unlock(&order.mu);
}

void nccl_order_detach(void) {
    pthread_mutex_lock(&order.mu);
    for (int i = 0; i < ORDER_MAX; i++) {
        if (order.f[i].ev) cudaEventDestroy(order.f[i].ev);
        order.f[i].ev = NULL;
        order.f[i].seq = 0;
    }
    order.on = 0;
    pthread_mutex_unlock(&order.mu);
}

/* Make stream s wait for the fences of every marked range overlapping
 * [p, p + bytes). */
static void order_wait(cudaStream_t s, const void *p, size_t bytes) {
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    if (!p || bytes == 0) return;
    pthread_mutex_lock(&order.mu);
    for (int i = 0; order.on && i < ORDER_MAX; i++)
        if (order.f[i].seq && order.f[i].lo < hi && lo < order.f[i].hi)
            cudaStreamWaitEvent(s, order.f[i].ev, 0);
    pthread_mutex_unlock(&order.mu);
}

/* Between polls of a wait that began at t0 (now_us): spin (yielding) for the
 * first 5 ms, then sleep 20 us. A sleep at every poll cost ~190 us per call
 * (timer slack on the VM), 3.5x torch's latency at 1 MiB; gradient buckets
 * are such calls, and the last ones are exposed at the end of the backward. */
static void poll_pause(long long t0) {
    if (clock_mono_us() - t0 < 5000)
        sched_yield();
    else
        clock_sleep_us(20);
}

static ncclDataType_t nccl_type(enum comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
        return ncclFloat32;
    case COMM_F64:
        return ncclFloat64;
    case COMM_BF16:
        return ncclBfloat16;
    case COMM_F16:
        return ncclFloat16;
    case COMM_I32:
        return ncclInt32;
    case COMM_I64:
        return ncclInt64;
    case COMM_U8:
        return ncclUint8;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(enum comm_op op) {
    return op == COMM_MAX ? ncclMax : op == COMM_MIN ? ncclMin : ncclSum;
}

/* Wait for a non-blocking call to leave ncclInProgress. */
static int settle(struct nccl_comm *nc, ncclResult_t r, const char *what, long long deadline,
                  char *err, size_t errlen) {
    long long t0 = clock_mono_us();
    while (r == ncclInProgress) {
        if (clock_mono_ms() > deadline) {
            snprintf(err, errlen, "nccl %s: timed out after %d ms", what, nc->timeout_ms);
            return -1;
        }
        poll_pause(t0);
        if (ncclCommGetAsyncError(nc->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) {
        snprintf(err, errlen, "nccl %s: %s (%s)", what, ncclGetErrorString(r),
                 ncclGetLastError(nc->comm));
        return -1;
    }
    return 0;
}

/* Poll the stream (or an event) until done, a comm error or the deadline. */
static int finish(struct nccl_comm *nc, cudaEvent_t ev, const char *what, char *err,
                  size_t errlen) {
    long long deadline = clock_mono_ms() + nc->timeout_ms, t0 = clock_mono_us();
    for (;;) {
        cudaError_t ce = ev ? cudaEventQuery(ev) : cudaStreamQuery(nc->stream);
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) {
            snprintf(err, errlen, "nccl %s: cuda: %s", what, cudaGetErrorString(ce));
            return -1;
        }
        ncclResult_t ar = ncclSuccess;
        ncclCommGetAsyncError(nc->comm, &ar);
        if (ar != ncclSuccess && ar != ncclInProgress) {
            snprintf(err, errlen, "nccl %s: %s (%s); a peer likely failed", what,
                     ncclGetErrorString(ar), ncclGetLastError(nc->comm));
            ncclCommAbort(nc->comm);
            nc->aborted = 1;
            return -1;
        }
        if (clock_mono_ms() > deadline) {
            snprintf(err, errlen,
                     "nccl %s: not complete after %d ms (a peer is gone or hung); comm aborted",
                     what, nc->timeout_ms);
            ncclCommAbort(nc->comm);
            nc->aborted = 1;
            return -1;
        }
        poll_pause(t0);
    }
}

static void *world_init(const struct comm_backend_world *w, char *err, size_t errlen) {
    cudaError_t ce = cudaSetDevice(w->cuda_device);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "nccl: cudaSetDevice(%d): %s", w->cuda_device,
                 cudaGetErrorString(ce));
        return NULL;
    }
    struct nccl_world *nw = calloc(1, sizeof(*nw));
    if (!nw) {
        snprintf(err, errlen, "nccl: out of memory");
        return NULL;
    }
    nw->w = w;
    nw->device = w->cuda_device;
    return nw;
}

static void world_fini(void *impl) {
    free(impl);
}

static void *comm_init(const struct comm_backend_comm *c, char *err, size_t errlen) {
    struct nccl_world *nw = c->world_impl;
    struct nccl_comm *nc = calloc(1, sizeof(*nc));
    ncclUniqueId id;
    char key[256];
    void *val = NULL;
    size_t len = 0;
    if (!nc) {
        snprintf(err, errlen, "nccl: out of memory");
        return NULL;
    }
    nc->rank = c->rank;
    nc->size = c->size;
    nc->device = nw->device;
    nc->timeout_ms = c->world->timeout_ms;
    cudaSetDevice(nc->device);
    snprintf(key, sizeof(key), "nccl/%s/id", c->name);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            snprintf(err, errlen, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
            goto fail;
        }
        if (c->size > 1 && rdzv_set(c->world->rdzv, key, &id, sizeof(id), err, errlen) != 0)
            goto fail;
    } else {
        int rc = rdzv_get(c->world->rdzv, key, &val, &len, c->world->timeout_ms, err, errlen);
        if (rc != 0 || len != sizeof(id)) {
            if (rc == 0) snprintf(err, errlen, "nccl: unique id has %zu bytes", len);
            free(val);
            goto fail;
        }
        memcpy(&id, val, sizeof(id));
        free(val);
    }
    /* nccl-stream-priority=high (LOOM_NCCL_STREAM_PRIORITY): the comm stream
     * at the device's highest priority, so a collective's blocks are scheduled
     * ahead of queued compute blocks instead of waiting for SMs (measured in
     * docs/perf.md). */
    int lo_prio = 0, hi_prio = 0, prio = 0;
    const char *ps = c->world->nccl_stream_priority;
    if (strcmp(ps, "high") == 0 &&
        cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio) == cudaSuccess)
        prio = hi_prio;
    if (cudaStreamCreateWithPriority(&nc->stream, cudaStreamNonBlocking, prio) != cudaSuccess ||
        cudaMalloc((void **)&nc->scratch, sizeof(float)) != cudaSuccess) {
        snprintf(err, errlen, "nccl: cannot create the comm stream / scratch");
        goto fail;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = c->name;
    /* nccl-cta-policy=efficiency|zero (LOOM_NCCL_CTA_POLICY): fewer (or no)
     * SMs for NCCL's kernels, leaving them to the compute that the
     * collectives overlap (A/B in docs/perf.md) */
    const char *cp = c->world->nccl_cta_policy;
    if (strcmp(cp, "efficiency") == 0) cfg.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
    if (strcmp(cp, "zero") == 0) cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    ncclResult_t r = ncclCommInitRankConfig(&nc->comm, c->size, id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "nccl: ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        goto fail;
    }
    if (settle(nc, r, "init", clock_mono_ms() + nc->timeout_ms, err, errlen) != 0) {
        ncclCommAbort(nc->comm);
        nc->comm = NULL;
        goto fail;
    }
    return nc;
fail:
    if (nc->stream) cudaStreamDestroy(nc->stream);
    if (nc->scratch) cudaFree(nc->scratch);
    free(nc);
    return NULL;
}

static void comm_fini(void *impl) {
    struct nccl_comm *nc = impl;
    if (!nc) return;
    cudaSetDevice(nc->device);
    if (nc->sev) {
        if (nc->sev_pending && !nc->aborted) {
            char err[256];
            if (finish(nc, nc->sev, "allreduce (stream)", err, sizeof(err)) != 0)
                fprintf(stderr, "%s\n", err);
        }
        cudaEventDestroy(nc->sev);
    }
    if (nc->comm && !nc->aborted) {
        char err[256];
        ncclResult_t r = ncclCommFinalize(nc->comm);
        if (settle(nc, r, "finalize", clock_mono_ms() + nc->timeout_ms, err, sizeof(err)) == 0)
            ncclCommDestroy(nc->comm);
        else
            ncclCommAbort(nc->comm);
    }
    cudaStreamDestroy(nc->stream);
    cudaFree(nc->scratch);
    cudaFree(nc->stage);
    free(nc);
}

/* 1 when p is host memory (pageable or pinned) rather than device memory. */
static int is_host(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* clear: an unknown pointer is plain host memory */
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

/* Device copy of a host buffer on the comm's stream; NULL on failure. */
static void *stage_in(struct nccl_comm *nc, const void *host, size_t bytes, char *err,
                      size_t errlen) {
    if (bytes > nc->stage_bytes) {
        size_t want = bytes < 4096 ? 4096 : bytes;
        cudaFree(nc->stage);
        nc->stage = NULL;
        nc->stage_bytes = 0;
        if (cudaMalloc(&nc->stage, want) != cudaSuccess) {
            cudaGetLastError();
            snprintf(err, errlen, "nccl: cannot allocate %zu bytes to stage a host buffer", want);
            return NULL;
        }
        nc->stage_bytes = want;
    }
    if (cudaMemcpyAsync(nc->stage, host, bytes, cudaMemcpyHostToDevice, nc->stream) !=
        cudaSuccess) {
        snprintf(err, errlen, "nccl: staging %zu host bytes failed", bytes);
        return NULL;
    }
    return nc->stage;
}

/* Copy the staged result back to the host buffer and wait for it. */
static int stage_out(struct nccl_comm *nc, void *host, size_t bytes, const char *what, char *err,
                     size_t errlen) {
    if (cudaMemcpyAsync(host, nc->stage, bytes, cudaMemcpyDeviceToHost, nc->stream) !=
        cudaSuccess) {
        snprintf(err, errlen, "nccl %s: copying %zu staged bytes back failed", what, bytes);
        return -1;
    }
    return finish(nc, NULL, what, err, errlen);
}

/* Enqueue with `r` the result of the NCCL call (or of ncclGroupEnd), then run
 * the stream to completion. */
static int complete(struct nccl_comm *nc, ncclResult_t r, const char *what, char *err,
                    size_t errlen) {
    if (settle(nc, r, what, clock_mono_ms() + nc->timeout_ms, err, errlen) != 0) return -1;
    return finish(nc, NULL, what, err, errlen);
}

static int allreduce(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                     char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    cudaSetDevice(nc->device);
    order_wait(nc->stream, buf, n * comm_dtype_size(dt));
    if (n > 0 && is_host(buf)) {
        size_t bytes = n * comm_dtype_size(dt);
        void *d = stage_in(nc, buf, bytes, err, errlen);
        if (!d) return -1;
        ncclResult_t r = ncclAllReduce(d, d, n, nccl_type(dt), nccl_op(op), nc->comm, nc->stream);
        if (complete(nc, r, "allreduce (host)", err, errlen) != 0) return -1;
        return stage_out(nc, buf, bytes, "allreduce (host)", err, errlen);
    }
    ncclResult_t r = ncclAllReduce(buf, buf, n, nccl_type(dt), nccl_op(op), nc->comm, nc->stream);
    return complete(nc, r, "allreduce", err, errlen);
}

/* comm_allreduce_stream: NCCL straight on the caller's (compute) stream, so
 * the GPU goes from the producing kernel to the collective to the consuming
 * kernel without a host round trip (tensor parallelism's all-reduces sit on
 * the critical path; the comm thread's hand-off, a stream sync before and a
 * host poll after cost ~0.1 ms each). Failure detection stays: before the
 * next one, the previous operation's event is polled with the comm's
 * timeout (finish() aborts the communicator on a dead peer), which also
 * bounds how far the host runs ahead. */
static int allreduce_stream(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                            void *stream, char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    cudaSetDevice(nc->device);
    if (nc->aborted) {
        snprintf(err, errlen, "nccl allreduce (stream): communicator aborted earlier");
        return -1;
    }
    if (!nc->sev && cudaEventCreateWithFlags(&nc->sev, cudaEventDisableTiming) != cudaSuccess) {
        snprintf(err, errlen, "nccl allreduce (stream): cannot create an event");
        return -1;
    }
    if (nc->sev_pending && finish(nc, nc->sev, "allreduce (stream)", err, errlen) != 0) return -1;
    nc->sev_pending = 0;
    ncclResult_t r =
        ncclAllReduce(buf, buf, n, nccl_type(dt), nccl_op(op), nc->comm, (cudaStream_t)stream);
    if (settle(nc, r, "allreduce (stream)", clock_mono_ms() + nc->timeout_ms, err, errlen) != 0)
        return -1;
    if (cudaEventRecord(nc->sev, (cudaStream_t)stream) != cudaSuccess) {
        snprintf(err, errlen, "nccl allreduce (stream): cannot record its event");
        return -1;
    }
    nc->sev_pending = 1;
    return 0;
}

/* 1 when every slice has the same size (the plain NCCL collectives apply). */
static int even(const struct nccl_comm *nc, const size_t *counts) {
    for (int i = 1; i < nc->size; i++)
        if (counts[i] != counts[0]) return 0;
    return 1;
}

static int reduce_scatter(void *impl, const void *send, void *recv, size_t total,
                          const size_t *counts, enum comm_dtype dt, enum comm_op op, char *err,
                          size_t errlen) {
    struct nccl_comm *nc = impl;
    size_t es = comm_dtype_size(dt);
    cudaSetDevice(nc->device);
    order_wait(nc->stream, send, total * es);
    order_wait(nc->stream, recv, counts[nc->rank] * es);
    if (even(nc, counts)) {
        ncclResult_t r = ncclReduceScatter(send, recv, total / (size_t)nc->size, nccl_type(dt),
                                           nccl_op(op), nc->comm, nc->stream);
        return complete(nc, r, "reduce_scatter", err, errlen);
    }
    ncclResult_t r = ncclGroupStart();
    size_t off = 0;
    for (int i = 0; i < nc->size && r == ncclSuccess; off += counts[i], i++) {
        size_t cnt = counts[i];
        if (cnt == 0) continue;
        r = ncclReduce((const char *)send + off * es, recv, cnt, nccl_type(dt), nccl_op(op), i,
                       nc->comm, nc->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    return complete(nc, r != ncclSuccess ? r : e, "reduce_scatter (uneven)", err, errlen);
}

static int all_gather(void *impl, const void *send, void *recv, size_t total, const size_t *counts,
                      enum comm_dtype dt, char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    size_t es = comm_dtype_size(dt);
    cudaSetDevice(nc->device);
    order_wait(nc->stream, send, counts[nc->rank] * es);
    order_wait(nc->stream, recv, total * es);
    if (even(nc, counts)) {
        ncclResult_t r = ncclAllGather(send, recv, total / (size_t)nc->size, nccl_type(dt),
                                       nc->comm, nc->stream);
        return complete(nc, r, "all_gather", err, errlen);
    }
    ncclResult_t r = ncclGroupStart();
    size_t off = 0;
    for (int i = 0; i < nc->size && r == ncclSuccess; off += counts[i], i++) {
        size_t cnt = counts[i];
        if (cnt == 0) continue;
        r = ncclBroadcast(i == nc->rank ? send : NULL, (char *)recv + off * es, cnt, nccl_type(dt),
                          i, nc->comm, nc->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    return complete(nc, r != ncclSuccess ? r : e, "all_gather (uneven)", err, errlen);
}

static int broadcast(void *impl, void *buf, size_t n, enum comm_dtype dt, int root, char *err,
                     size_t errlen) {
    struct nccl_comm *nc = impl;
    cudaSetDevice(nc->device);
    order_wait(nc->stream, buf, n * comm_dtype_size(dt));
    if (n > 0 && is_host(buf)) {
        size_t bytes = n * comm_dtype_size(dt);
        void *d = stage_in(nc, buf, bytes, err, errlen);
        if (!d) return -1;
        ncclResult_t r = ncclBroadcast(d, d, n, nccl_type(dt), root, nc->comm, nc->stream);
        if (complete(nc, r, "broadcast (host)", err, errlen) != 0) return -1;
        return stage_out(nc, buf, bytes, "broadcast (host)", err, errlen);
    }
    ncclResult_t r = ncclBroadcast(buf, buf, n, nccl_type(dt), root, nc->comm, nc->stream);
    return complete(nc, r, "broadcast", err, errlen);
}

static int barrier(void *impl, char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    cudaSetDevice(nc->device);
    ncclResult_t r =
        ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat32, ncclSum, nc->comm, nc->stream);
    return complete(nc, r, "barrier", err, errlen);
}

static int post_p2p(struct nccl_comm *nc, const void *sbuf, void *rbuf, size_t bytes, int peer,
                    void **h, char *err, size_t errlen) {
    struct nccl_p2p *p = calloc(1, sizeof(*p));
    if (!p || cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming) != cudaSuccess) {
        free(p);
        snprintf(err, errlen, "nccl p2p: cannot create an event");
        return -1;
    }
    cudaSetDevice(nc->device);
    order_wait(nc->stream, sbuf ? sbuf : rbuf, bytes);
    ncclResult_t r = sbuf ? ncclSend(sbuf, bytes, ncclUint8, peer, nc->comm, nc->stream)
                          : ncclRecv(rbuf, bytes, ncclUint8, peer, nc->comm, nc->stream);
    if (settle(nc, r, sbuf ? "send" : "recv", clock_mono_ms() + nc->timeout_ms, err, errlen) != 0) {
        cudaEventDestroy(p->done);
        free(p);
        return -1;
    }
    cudaEventRecord(p->done, nc->stream);
    *h = p;
    return 0;
}

static int isend(void *impl, const void *buf, size_t bytes, int peer, void **h, char *err,
                 size_t errlen) {
    return post_p2p(impl, buf, NULL, bytes, peer, h, err, errlen);
}

static int irecv(void *impl, void *buf, size_t bytes, int peer, void **h, char *err,
                 size_t errlen) {
    return post_p2p(impl, NULL, buf, bytes, peer, h, err, errlen);
}

static int p2p_wait(void *impl, void *h, char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    struct nccl_p2p *p = h;
    int rc = finish(nc, p->done, "p2p", err, errlen);
    cudaEventDestroy(p->done);
    free(p);
    return rc;
}

static int sendrecv(void *impl, const void *sendbuf, size_t sbytes, int dst, void *recvbuf,
                    size_t rbytes, int src, char *err, size_t errlen) {
    struct nccl_comm *nc = impl;
    cudaSetDevice(nc->device);
    order_wait(nc->stream, sendbuf, sbytes);
    order_wait(nc->stream, recvbuf, rbytes);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclSend(sendbuf, sbytes, ncclUint8, dst, nc->comm, nc->stream);
    if (r == ncclSuccess) r = ncclRecv(recvbuf, rbytes, ncclUint8, src, nc->comm, nc->stream);
    ncclResult_t e = ncclGroupEnd();
    return complete(nc, r != ncclSuccess ? r : e, "sendrecv", err, errlen);
}

static const struct comm_backend_ops nccl_ops = {
    .name = "nccl",
    .world_init = world_init,
    .world_fini = world_fini,
    .comm_init = comm_init,
    .comm_fini = comm_fini,
    .allreduce = allreduce,
    .reduce_scatter = reduce_scatter,
    .all_gather = all_gather,
    .broadcast = broadcast,
    .barrier = barrier,
    .isend = isend,
    .irecv = irecv,
    .p2p_wait = p2p_wait,
    .sendrecv = sendrecv,
    .allreduce_stream = allreduce_stream,
};

const struct comm_backend_ops *comm_backend_nccl(void) {
    return &nccl_ops;
}
