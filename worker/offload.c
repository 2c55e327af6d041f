/* Optimizer offload (offload.h): host optimizer state, the chunked
 * download / CPU AdamW / upload pipeline, and the early gradient downloads
 * the ZeRO hooks queue during the backward.
 *
 * Ranges below are counted in elements from the shard's start unless named
 * "flat". Tickets come from the backend's async copies (0 = nothing to wait
 * for); copies of one direction complete in order, so the newest ticket of a
 * range covers every older copy into it. */
#include "worker/offload.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/offload_adamw.h"

#define OFFLOAD_CHUNK_DEFAULT ((size_t)64 << 20)
#define OFFLOAD_PAGE          4096
/* below this many elements a chunk is updated by one thread (handing it to
 * the pool costs more than the work) */
#define OFFLOAD_PAR_MIN 65536

struct oq { /* a queued gradient download */
    size_t lo, hi;
    uint64_t t;
};

struct orun { /* a decay run of the step */
    size_t lo, hi;
    float wd;
};

enum xfer_kind { XFER_PAGEABLE, XFER_ALLOC, XFER_REGISTERED };

/* The pool's job: what every thread does over [c0, c1) of the shard. */
enum job_kind { JOB_TOUCH, JOB_WIDEN, JOB_UPDATE, JOB_REGISTER };

struct ojob {
    enum job_kind kind;
    size_t c0, c1; /* element range: JOB_UPDATE / JOB_WIDEN chunk(s) */
    struct adam_k_all {
        struct oadam_k k;
        float wd; /* weight decay of decayed runs */
    } a;
    int rc[OFFLOAD_MAX_THREADS]; /* JOB_REGISTER: per thread */
    double t_end[OFFLOAD_MAX_THREADS];
};

struct offload {
    struct engine *e;
    struct backend *b;
    size_t chunk; /* elements per pipeline chunk */
    int async;    /* backend copies are asynchronous */
    int threads;
    int isa;     /* resolved oadam isa */
    int delayed; /* one-step delayed update (offload.h) */
    int pin;     /* OFFLOAD_PIN_* */
    size_t n;    /* shard elements held */
    float *master, *m, *v;
    size_t fbytes; /* mapped bytes of each of master, m, v */
    void *xfer;
    size_t xbytes;
    enum xfer_kind xkind;
    size_t reg_chunks; /* chunks per registered piece (XFER_REGISTERED) */
    int nreg;          /* pieces registered */
    size_t nchunks;
    uint64_t *ct; /* [nchunks] newest download ticket of each chunk */
    uint64_t *ut; /* [nchunks] upload ticket of each chunk (delayed) */
    struct oq *q; /* downloads queued this step */
    int nq, capq;
    struct orun *runs;
    int nruns, capruns;
    uint64_t last_up; /* newest upload ticket */
    uint64_t last_dn; /* newest download ticket */
    size_t bytes;     /* host bytes held (e->mem.host share) */
    struct oadam_pool *pool;
    struct ojob job;
    int pending;      /* delayed: an update was started; its parameters are not uploaded */
    double job_start; /* ms, when the CPU update started */
    struct offload_stats st;
};

size_t offload_host_bytes(size_t n, size_t es) {
    return n * (3 * sizeof(float) + es);
}

static int nthreads(const struct offload *o) {
    int t = o->threads;
#ifdef _OPENMP
    if (t <= 0) t = omp_get_max_threads();
#endif
    if (t <= 0) t = 1;
    return t > OFFLOAD_MAX_THREADS ? OFFLOAD_MAX_THREADS : t;
}

struct offload *offload_new(struct engine *e, const struct offload_opts *opts) {
    struct offload *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    struct backend *b = e->be;
    o->e = e;
    o->b = b;
    size_t cb = opts && opts->chunk_bytes ? opts->chunk_bytes : OFFLOAD_CHUNK_DEFAULT;
    o->chunk = cb / b->elt_size;
    if (o->chunk < 1024) o->chunk = 1024;
    o->chunk = (o->chunk + 15) & ~(size_t)15;
    o->async = !(opts && opts->sync) && b->d2h_async && b->h2d_async && b->wait && b->copy_fence;
    o->threads = opts ? opts->threads : 0;
    o->delayed = opts ? opts->delayed : 0;
    o->pin = opts ? opts->pin : OFFLOAD_PIN_REGISTER;
    o->isa = oadam_isa_resolve(opts ? opts->isa : OADAM_AUTO);
    if (o->isa < 0) {
        log_warn("offload: this CPU lacks the %s instructions; using %s", oadam_isa_name(opts->isa),
                 oadam_isa_name(oadam_isa_best()));
        o->isa = oadam_isa_best();
    }
    o->pool = oadam_pool_new(nthreads(o));
    if (!o->pool) {
        free(o);
        return NULL;
    }
    return o;
}

/* Anonymous pages (transparent huge pages asked for: faulting in ~100 GiB
 * with 4 KiB pages costs tens of seconds); not touched here. */
static void *map_pages(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

static size_t map_size(size_t bytes) {
    return (bytes + OFFLOAD_PAGE - 1) / OFFLOAD_PAGE * OFFLOAD_PAGE;
}

/* The delayed update in flight, if any: wait for the CPU. */
static void cpu_wait(struct offload *o) {
    double t0 = clock_mono_msf();
    oadam_pool_wait(o->pool);
    o->st.ms_cpu_wait += clock_mono_msf() - t0;
    if (!o->pending) return;
    double end = 0; /* the update's wall time: its start to its last thread's end */
    for (int t = 0; t < oadam_pool_threads(o->pool); t++)
        if (o->job.t_end[t] > end) end = o->job.t_end[t];
    o->st.ms_cpu = end > o->job_start ? end - o->job_start : 0;
}

/* Wait for every copy in flight (they read or write the transfer buffer). */
static void drain(struct offload *o) {
    if (!o->async) return;
    o->b->wait(o->b->ctx, o->last_up);
    o->b->wait(o->b->ctx, o->last_dn);
}

static void unregister_pieces(struct offload *o) {
    for (int i = 0; i < o->nreg; i++) {
        size_t c = (size_t)i * o->reg_chunks;
        o->b->host_unregister(o->b->ctx, (char *)o->xfer + c * o->chunk * o->b->elt_size);
    }
    o->nreg = 0;
}

static void free_xfer(struct offload *o) {
    if (!o->xfer) return;
    switch (o->xkind) {
    case XFER_ALLOC:
        o->b->host_free(o->b->ctx, o->xfer);
        break;
    case XFER_REGISTERED:
        unregister_pieces(o);
        munmap(o->xfer, o->xbytes);
        break;
    case XFER_PAGEABLE:
        munmap(o->xfer, o->xbytes);
        break;
    }
    o->xfer = NULL;
}

void offload_release(struct offload *o) {
    if (!o) return;
    struct engine *e = o->e;
    oadam_pool_wait(o->pool);
    o->pending = 0;
    drain(o);
    if (o->master) munmap(o->master, o->fbytes);
    if (o->m) munmap(o->m, o->fbytes);
    if (o->v) munmap(o->v, o->fbytes);
    free_xfer(o);
    free(o->ct);
    free(o->ut);
    o->master = o->m = o->v = NULL;
    o->ct = o->ut = NULL;
    o->n = o->nchunks = 0;
    o->nq = 0;
    e->mem.host -= o->bytes;
    o->bytes = 0;
    if (e->opt_host) {
        e->master = e->opt_m = e->opt_v = NULL;
        e->opt_host = 0;
    }
}

void offload_free(struct offload *o) {
    if (!o) return;
    offload_release(o);
    oadam_pool_free(o->pool);
    free(o->q);
    free(o->runs);
    free(o);
}

static void update_range(struct offload *o, const struct ojob *j, size_t a, size_t z) {
    int bf = o->b->dtype == BACKEND_BF16;
    size_t es = o->b->elt_size;
    for (int r = 0; r < o->nruns && z > a; r++) {
        size_t lo = o->runs[r].lo > a ? o->runs[r].lo : a;
        size_t hi = o->runs[r].hi < z ? o->runs[r].hi : z;
        if (hi <= lo) continue;
        struct oadam_k k = j->a.k;
        k.wd = o->runs[r].wd * j->a.wd;
        oadam_update(o->isa, bf, &k, (char *)o->xfer + lo * es, o->master + lo, o->m + lo,
                     o->v + lo, hi - lo);
    }
}

/* Thread t of T over the job's chunks [c0, c1), each chunk split T ways
 * (oadam_part), so a thread always works on the pages it first touched. */
static void job_fn(void *arg, int t, int T) {
    struct offload *o = arg;
    struct ojob *j = &o->job;
    size_t es = o->b->elt_size;
    if (j->kind == JOB_REGISTER) { /* whole pieces of reg_chunks chunks */
        int rc = 0;
        for (size_t c = (size_t)t * o->reg_chunks; c < o->nchunks && !rc;
             c += (size_t)T * o->reg_chunks) {
            size_t lo = c * o->chunk, hi = (c + o->reg_chunks) * o->chunk;
            if (hi > o->n) hi = o->n;
            rc =
                o->b->host_register(o->b->ctx, (char *)o->xfer + lo * es, map_size((hi - lo) * es));
        }
        j->rc[t] = rc;
        return;
    }
    for (size_t c0 = j->c0; c0 < j->c1; c0 += o->chunk) {
        size_t c1 = c0 + o->chunk < j->c1 ? c0 + o->chunk : j->c1, a, z;
        if (c1 - c0 < OFFLOAD_PAR_MIN) { /* one thread */
            a = t == 0 ? c0 : c1;
            z = c1;
        } else {
            oadam_part(c0, c1, t, T, &a, &z);
        }
        if (z <= a) continue;
        switch (j->kind) {
        case JOB_TOUCH:
            memset(o->master + a, 0, (z - a) * sizeof(float));
            memset(o->m + a, 0, (z - a) * sizeof(float));
            memset(o->v + a, 0, (z - a) * sizeof(float));
            memset((char *)o->xfer + a * es, 0, (z - a) * es);
            break;
        case JOB_WIDEN:
            if (o->b->dtype == BACKEND_F32)
                memcpy(o->master + a, (float *)o->xfer + a, (z - a) * sizeof(float));
            else
                oadam_widen_bf16(o->master + a, (uint16_t *)o->xfer + a, z - a);
            break;
        case JOB_UPDATE:
            update_range(o, j, a, z);
            break;
        case JOB_REGISTER:
            break;
        }
    }
    j->t_end[t] = clock_mono_msf();
}

static void run_job(struct offload *o, enum job_kind kind, size_t c0, size_t c1) {
    o->job.kind = kind;
    o->job.c0 = c0;
    o->job.c1 = c1;
    oadam_pool_run(o->pool, job_fn, o);
}

/* The transfer buffer: page-locked for the async copies. OFFLOAD_PIN_REGISTER:
 * mapped, touched and registered in pieces by the pool's threads at once
 * (cudaHostAlloc of one 16 GiB buffer runs on one thread); OFFLOAD_PIN_ALLOC:
 * the backend's host_alloc in one call; pageable memory when neither works. */
static int alloc_xfer(struct offload *o, size_t xb) {
    struct backend *b = o->b;
    double t0 = clock_mono_msf();
    if (o->pin == OFFLOAD_PIN_REGISTER && b->host_register && b->host_unregister) {
        o->xbytes = map_size(xb);
        o->xfer = map_pages(o->xbytes);
        if (!o->xfer) return -1;
        o->xkind = XFER_PAGEABLE;
        int T = oadam_pool_threads(o->pool);
        /* one piece per thread (at most), each whole chunks; pieces must not
         * share a page, so chunks that are not whole pages make one piece */
        o->reg_chunks = (o->nchunks + (size_t)T - 1) / (size_t)T;
        if (o->reg_chunks < 1) o->reg_chunks = 1;
        if (o->chunk * b->elt_size % OFFLOAD_PAGE) o->reg_chunks = o->nchunks ? o->nchunks : 1;
        run_job(o, JOB_TOUCH, 0, o->n); /* also places master, m, v */
        run_job(o, JOB_REGISTER, 0, o->n);
        int bad = 0;
        for (int t = 0; t < T; t++)
            bad |= o->job.rc[t];
        o->nreg = (int)((o->nchunks + o->reg_chunks - 1) / o->reg_chunks);
        if (bad) { /* undo the pieces that did register (piece i is thread i's) */
            for (int i = 0; i < o->nreg && i < T; i++) {
                size_t c = (size_t)i * o->reg_chunks;
                if (!o->job.rc[i])
                    b->host_unregister(b->ctx, (char *)o->xfer + c * o->chunk * b->elt_size);
            }
            o->nreg = 0;
            log_warn("offload: cannot page-lock the %zu-byte transfer buffer; using pageable "
                     "memory (copies will not overlap)",
                     xb);
        } else {
            o->xkind = XFER_REGISTERED;
        }
        o->st.ms_pin = clock_mono_msf() - t0;
        return 0;
    }
    if (o->pin != OFFLOAD_PIN_OFF && b->host_alloc) {
        o->xfer = b->host_alloc(b->ctx, xb);
        if (o->xfer) {
            o->xkind = XFER_ALLOC;
            o->xbytes = xb;
            run_job(o, JOB_TOUCH, 0, o->n);
            o->st.ms_pin = clock_mono_msf() - t0;
            return 0;
        }
        log_warn("offload: cannot pin %zu bytes for the transfer buffer; using pageable "
                 "memory (copies will not overlap)",
                 xb);
    }
    o->xbytes = map_size(xb);
    o->xfer = map_pages(o->xbytes);
    o->xkind = XFER_PAGEABLE;
    if (!o->xfer) return -1;
    run_job(o, JOB_TOUCH, 0, o->n);
    o->st.ms_pin = clock_mono_msf() - t0;
    return 0;
}

int offload_alloc(struct offload *o, size_t n) {
    struct engine *e = o->e;
    struct backend *b = o->b;
    offload_release(o);
    double t0 = clock_mono_msf();
    size_t xb = (n ? n : 1) * b->elt_size;
    o->fbytes = map_size((n ? n : 1) * sizeof(float));
    o->master = map_pages(o->fbytes);
    o->m = map_pages(o->fbytes);
    o->v = map_pages(o->fbytes);
    o->n = n;
    o->nchunks = (n + o->chunk - 1) / o->chunk;
    o->ct = calloc(o->nchunks ? o->nchunks : 1, sizeof *o->ct);
    o->ut = calloc(o->nchunks ? o->nchunks : 1, sizeof *o->ut);
    if (!o->master || !o->m || !o->v || !o->ct || !o->ut || alloc_xfer(o, xb) != 0) {
        log_error("offload: out of host memory for the optimizer state of %zu elements "
                  "(%.2f GiB)",
                  n, (double)offload_host_bytes(n, b->elt_size) / (1 << 30));
        if (o->master) munmap(o->master, o->fbytes);
        if (o->m) munmap(o->m, o->fbytes);
        if (o->v) munmap(o->v, o->fbytes);
        o->master = o->m = o->v = NULL;
        offload_release(o);
        return -1;
    }
    o->bytes = offload_host_bytes(n, b->elt_size);
    e->mem.host += o->bytes;
    e->master = o->master;
    e->opt_m = o->m;
    e->opt_v = o->v;
    e->opt_host = 1;
    e->master_aliased = 0;
    o->st.ms_alloc = clock_mono_msf() - t0;
    log_info("offload: %.2f GiB of host state ready in %.2f s (%d threads, transfer buffer %s "
             "in %.2f s; AdamW %s%s)",
             (double)o->bytes / (1 << 30), o->st.ms_alloc / 1e3, oadam_pool_threads(o->pool),
             o->xkind == XFER_REGISTERED ? "registered in pieces"
             : o->xkind == XFER_ALLOC    ? "pinned"
                                         : "pageable",
             o->st.ms_pin / 1e3, oadam_isa_name(o->isa), o->delayed ? ", delayed by one step" : "");
    return 0;
}

void offload_master_from_params(struct offload *o) {
    struct engine *e = o->e;
    struct backend *b = o->b;
    size_t n = o->n, es = b->elt_size;
    if (!n) return;
    oadam_pool_wait(o->pool);
    o->pending = 0;
    drain(o);
    /* chunk by chunk: a copy never spans two registered pieces */
    for (size_t c0 = 0; c0 < n; c0 += o->chunk) {
        size_t c1 = c0 + o->chunk < n ? c0 + o->chunk : n;
        b->download(b->ctx, (char *)o->xfer + c0 * es, engine_params_at(e, e->shard_off + c0),
                    (c1 - c0) * es);
    }
    run_job(o, JOB_WIDEN, 0, n);
}

/* Queue the download of shard range [lo, hi) in chunk-aligned pieces. */
static void queue_download(struct offload *o, size_t lo, size_t hi) {
    struct engine *e = o->e;
    struct backend *b = o->b;
    size_t es = b->elt_size;
    while (lo < hi) {
        size_t z = (lo / o->chunk + 1) * o->chunk;
        if (z > hi) z = hi;
        void *dst = (char *)o->xfer + lo * es;
        const void *src = engine_grads_at(e, e->shard_off + lo);
        uint64_t t = 0;
        if (o->async) {
            t = b->d2h_async(b->ctx, dst, src, (z - lo) * es);
            o->last_dn = t;
        } else {
            b->download(b->ctx, dst, src, (z - lo) * es);
        }
        if (BUF_GROW(o->q, o->capq, o->nq + 1, 64) != 0) {
            /* cannot record it: wait now, the data is then in place */
            if (o->async) b->wait(b->ctx, t);
            lo = z;
            continue;
        }
        o->q[o->nq++] = (struct oq){lo, z, t};
        lo = z;
    }
}

void offload_grads_final(struct engine *e, size_t off, size_t n) {
    struct offload *o = e->offload;
    /* delayed: the transfer buffer is the CPU's until offload_step */
    if (!o || !o->n || o->delayed) return;
    size_t s0 = e->shard_off, s1 = s0 + e->shard_n;
    size_t a = off > s0 ? off : s0, z = off + n < s1 ? off + n : s1;
    if (z > a) queue_download(o, a - s0, z - s0);
}

static int cmp_oq(const void *x, const void *y) {
    const struct oq *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

void offload_fetch_grads(struct engine *e) {
    struct offload *o = e->offload;
    if (!o || !o->n || o->delayed) return;
    /* the gaps between the ranges queued so far */
    int nq = o->nq;
    if (nq > 1) qsort(o->q, (size_t)nq, sizeof *o->q, cmp_oq); /* q is NULL when none */
    size_t covered = 0;
    for (int i = 0; i < nq; i++) {
        if (o->q[i].lo > covered) queue_download(o, covered, o->q[i].lo);
        if (o->q[i].hi > covered) covered = o->q[i].hi;
    }
    if (covered < o->n) queue_download(o, covered, o->n);
}

static void add_run(size_t lo, size_t hi, int decay, void *user) {
    struct offload *o = user;
    if (BUF_GROW(o->runs, o->capruns, o->nruns + 1, 16) != 0) {
        log_error("offload: out of memory for the decay runs");
        abort(); /* fail fast in the worker's step: no partial update */
    }
    size_t s0 = o->e->shard_off;
    o->runs[o->nruns++] = (struct orun){lo - s0, hi - s0, decay ? 1.0f : 0.0f};
}

/* The step's constants and decay runs into o->job. */
static void prepare(struct offload *o, const struct optim_cfg *c, double lr, double grad_scale,
                    int64_t step) {
    o->nruns = 0;
    optim_runs(o->e, c, add_run, o);
    struct oadam_k k = {.lr = (float)lr,
                        .b1 = (float)c->beta1,
                        .b2 = (float)c->beta2,
                        .eps = (float)c->eps,
                        .gs = (float)grad_scale};
    k.c1 = 1.0f - powf(k.b1, (float)step);
    k.c2 = 1.0f - powf(k.b2, (float)step);
    o->job.a.k = k;
    o->job.a.wd = (float)c->weight_decay;
}

static void wait_copy(struct offload *o, uint64_t t) {
    if (!o->async || !t) return;
    double t0 = clock_mono_msf();
    o->b->wait(o->b->ctx, t);
    o->st.ms_copy_wait += clock_mono_msf() - t0;
}

static void upload_chunk(struct offload *o, size_t ci) {
    struct backend *b = o->b;
    size_t es = b->elt_size, c0 = ci * o->chunk, c1 = c0 + o->chunk < o->n ? c0 + o->chunk : o->n;
    void *dst = engine_params_at(o->e, o->e->shard_off + c0);
    const void *src = (const char *)o->xfer + c0 * es;
    if (o->async)
        o->ut[ci] = o->last_up = b->h2d_async(b->ctx, dst, src, (c1 - c0) * es);
    else
        b->upload(b->ctx, dst, src, (c1 - c0) * es);
}

/* Delayed: the finished update's parameters go up (all chunks queued),
 * then each chunk's new gradients come down into the same bytes once its
 * upload has read them. */
static void swap_delayed(struct offload *o) {
    struct backend *b = o->b;
    size_t es = b->elt_size;
    if (o->pending) {
        cpu_wait(o);
        for (size_t ci = 0; ci < o->nchunks; ci++)
            upload_chunk(o, ci);
    }
    for (size_t ci = 0; ci < o->nchunks; ci++) {
        size_t c0 = ci * o->chunk, c1 = c0 + o->chunk < o->n ? c0 + o->chunk : o->n;
        if (o->pending) wait_copy(o, o->ut[ci]);
        void *dst = (char *)o->xfer + c0 * es;
        const void *src = engine_grads_at(o->e, o->e->shard_off + c0);
        if (o->async)
            o->last_dn = b->d2h_async(b->ctx, dst, src, (c1 - c0) * es);
        else
            b->download(b->ctx, dst, src, (c1 - c0) * es);
    }
    wait_copy(o, o->last_dn);
    if (o->pending && o->async) b->copy_fence(b->ctx);
    o->pending = 0;
}

void offload_step(struct engine *e, const struct optim_cfg *c, double lr, double grad_scale,
                  int64_t step) {
    struct offload *o = e->offload;
    if (!o->n) return;
    double t0 = clock_mono_msf();
    o->st.ms_cpu_wait = o->st.ms_copy_wait = 0;
    if (o->delayed) {
        swap_delayed(o);
        prepare(o, c, lr, grad_scale, step);
        /* the update runs while the device computes the next step */
        o->job.kind = JOB_UPDATE;
        o->job.c0 = 0;
        o->job.c1 = o->n;
        o->job_start = clock_mono_msf();
        oadam_pool_start(o->pool, job_fn, o);
        o->pending = 1;
        o->st.ms_step = clock_mono_msf() - t0;
        return;
    }
    offload_fetch_grads(e);
    /* newest download of each chunk */
    memset(o->ct, 0, o->nchunks * sizeof *o->ct);
    for (int i = 0; i < o->nq; i++) {
        const struct oq *q = &o->q[i];
        for (size_t k = q->lo / o->chunk; k * o->chunk < q->hi && k < o->nchunks; k++)
            if (q->t > o->ct[k]) o->ct[k] = q->t;
    }
    o->nq = 0;
    prepare(o, c, lr, grad_scale, step);
    double cpu = 0;
    for (size_t ci = 0; ci < o->nchunks; ci++) {
        size_t c0 = ci * o->chunk, c1 = c0 + o->chunk < o->n ? c0 + o->chunk : o->n;
        wait_copy(o, o->ct[ci]);
        double tc = clock_mono_msf();
        run_job(o, JOB_UPDATE, c0, c1);
        cpu += clock_mono_msf() - tc;
        upload_chunk(o, ci);
    }
    /* the next device work (param_sync, the next forward) reads the params */
    if (o->async) o->b->copy_fence(o->b->ctx);
    o->st.ms_cpu = cpu;
    o->st.ms_cpu_wait = cpu;
    o->st.ms_step = clock_mono_msf() - t0;
}

void offload_flush(struct engine *e) {
    struct offload *o = e ? e->offload : NULL;
    if (!o || !o->pending) return;
    cpu_wait(o);
    for (size_t ci = 0; ci < o->nchunks; ci++)
        upload_chunk(o, ci);
    if (o->async) o->b->copy_fence(o->b->ctx);
    o->pending = 0;
    /* ranks that hold more than their shard gather the new values */
    if (e->hooks.param_sync) e->hooks.param_sync(e, e->hooks.user);
}

int offload_delayed(const struct engine *e) {
    return e && e->offload && e->offload->delayed;
}

void offload_get_stats(const struct engine *e, struct offload_stats *st) {
    memset(st, 0, sizeof *st);
    if (e && e->offload) *st = e->offload->st;
}
