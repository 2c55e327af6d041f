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
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common/buf.h"
#include "common/log.h"

#define OFFLOAD_CHUNK_DEFAULT ((size_t)64 << 20)
#define OFFLOAD_PAGE          4096
/* below this many elements a chunk is updated by one thread (a parallel
 * region costs more than the work) */
#define OFFLOAD_PAR_MIN 65536

struct oq { /* a queued gradient download */
    size_t lo, hi;
    uint64_t t;
};

struct orun { /* a decay run of the step */
    size_t lo, hi;
    float wd;
};

struct offload {
    struct engine *e;
    struct backend *b;
    size_t chunk; /* elements per pipeline chunk */
    int async;    /* backend copies are asynchronous */
    int threads;
    size_t n; /* shard elements held */
    float *master, *m, *v;
    void *xfer;
    int xfer_pinned;
    size_t nchunks;
    uint64_t *ct; /* [nchunks] newest download ticket of each chunk */
    struct oq *q; /* downloads queued this step */
    int nq, capq;
    struct orun *runs;
    int nruns, capruns;
    uint64_t last_up; /* newest upload ticket */
    uint64_t last_dn; /* newest download ticket */
    size_t bytes;     /* host bytes held (e->mem.host share) */
};

size_t offload_host_bytes(size_t n, size_t es) {
    return n * (3 * sizeof(float) + es);
}

static int nthreads(const struct offload *o) {
#ifdef _OPENMP
    return o->threads > 0 ? o->threads : omp_get_max_threads();
#else
    (void)o;
    return 1;
#endif
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
    o->async = !(opts && opts->sync) && b->d2h_async && b->h2d_async && b->wait && b->copy_fence;
    o->threads = opts ? opts->threads : 0;
    return o;
}

static void *page_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, OFFLOAD_PAGE, bytes ? bytes : OFFLOAD_PAGE) != 0) return NULL;
    return p;
}

/* Wait for every copy in flight (they read or write the transfer buffer). */
static void drain(struct offload *o) {
    if (!o->async) return;
    o->b->wait(o->b->ctx, o->last_up);
    o->b->wait(o->b->ctx, o->last_dn);
}

void offload_release(struct offload *o) {
    if (!o) return;
    struct engine *e = o->e;
    drain(o);
    free(o->master);
    free(o->m);
    free(o->v);
    if (o->xfer_pinned)
        o->b->host_free(o->b->ctx, o->xfer);
    else
        free(o->xfer);
    free(o->ct);
    o->master = o->m = o->v = NULL;
    o->xfer = NULL;
    o->ct = NULL;
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
    free(o->q);
    free(o->runs);
    free(o);
}

/* The split of chunk [c0, c1) that thread t of T updates: the same for the
 * first touch and every step, so each thread works on the pages it placed. */
/* The calling OpenMP thread's part [*a, *z) of [c0, c1): the first touch and
 * the update split a chunk the same way, so each thread updates the pages it
 * placed (NUMA). */
static void my_part(size_t c0, size_t c1, size_t *a, size_t *z) {
    int t = 0, T = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    T = omp_get_num_threads();
#endif
    size_t len = c1 - c0, per = (len + (size_t)T - 1) / (size_t)T;
    *a = c0 + per * (size_t)t;
    *z = *a + per < c1 ? *a + per : c1;
    if (*a > c1) *a = c1;
}

int offload_alloc(struct offload *o, size_t n) {
    struct engine *e = o->e;
    struct backend *b = o->b;
    offload_release(o);
    size_t fb = (n ? n : 1) * sizeof(float), xb = (n ? n : 1) * b->elt_size;
    o->master = page_alloc(fb);
    o->m = page_alloc(fb);
    o->v = page_alloc(fb);
    o->xfer = b->host_alloc ? b->host_alloc(b->ctx, xb) : NULL;
    o->xfer_pinned = o->xfer != NULL;
    if (!o->xfer) {
        if (b->host_alloc)
            log_warn("offload: cannot pin %zu bytes for the transfer buffer; using pageable "
                     "memory (copies will not overlap)",
                     xb);
        o->xfer = page_alloc(xb);
    }
    o->nchunks = (n + o->chunk - 1) / o->chunk;
    o->ct = calloc(o->nchunks ? o->nchunks : 1, sizeof *o->ct);
    if (!o->master || !o->m || !o->v || !o->xfer || !o->ct) {
        log_error("offload: out of host memory for the optimizer state of %zu elements "
                  "(%.2f GiB)",
                  n, (double)offload_host_bytes(n, b->elt_size) / (1 << 30));
        offload_release(o);
        return -1;
    }
    o->n = n;
    int T = nthreads(o);
    float *ms = o->master, *mm = o->m, *vv = o->v;
    /* first touch: each chunk split across the threads as offload_step does */
    for (size_t c0 = 0; c0 < n; c0 += o->chunk) {
        size_t c1 = c0 + o->chunk < n ? c0 + o->chunk : n;
#pragma omp parallel num_threads(T) if (c1 - c0 >= OFFLOAD_PAR_MIN)
        {
            size_t a, z;
            my_part(c0, c1, &a, &z);
            if (z > a) {
                memset(ms + a, 0, (z - a) * sizeof(float));
                memset(mm + a, 0, (z - a) * sizeof(float));
                memset(vv + a, 0, (z - a) * sizeof(float));
            }
        }
    }
    o->bytes = offload_host_bytes(n, b->elt_size);
    e->mem.host += o->bytes;
    e->master = o->master;
    e->opt_m = o->m;
    e->opt_v = o->v;
    e->opt_host = 1;
    e->master_aliased = 0;
    return 0;
}

/* bf16 <-> fp32 on the host (bf16 is the top half of an fp32). */
static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

void offload_master_from_params(struct offload *o) {
    struct engine *e = o->e;
    struct backend *b = o->b;
    size_t n = o->n;
    if (!n) return;
    drain(o);
    b->download(b->ctx, o->xfer, engine_params_at(e, e->shard_off), n * b->elt_size);
    if (b->dtype == BACKEND_F32) {
        memcpy(o->master, o->xfer, n * sizeof(float));
        return;
    }
    const uint16_t *x = o->xfer;
    float *ms = o->master;
#pragma omp parallel for num_threads(nthreads(o)) if (n >= OFFLOAD_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++)
        ms[i] = bf16_f32(x[i]);
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
    if (!o || !o->n) return;
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
    if (!o || !o->n) return;
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

struct adam_k {
    float lr, b1, b2, eps, gs, c1, c2;
};

/* AdamW on [a, z) with weight decay wd, exactly as the CPU backend's adamw
 * (and backend.h's formula); the gradient is read from and the new parameter
 * written to the transfer buffer x (compute dtype). */
static void adam_f32(const struct adam_k *k, float wd, float *x, float *master, float *m, float *v,
                     size_t a, size_t z) {
    for (size_t i = a; i < z; i++) {
        float g = x[i] * k->gs;
        float mi = k->b1 * m[i] + (1.0f - k->b1) * g;
        float vi = k->b2 * v[i] + (1.0f - k->b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / k->c1, vh = vi / k->c2;
        float w = master[i];
        w -= k->lr * (mh / (sqrtf(vh) + k->eps) + wd * w);
        master[i] = w;
        x[i] = w;
    }
}

static void adam_bf16(const struct adam_k *k, float wd, uint16_t *x, float *master, float *m,
                      float *v, size_t a, size_t z) {
    for (size_t i = a; i < z; i++) {
        float g = bf16_f32(x[i]) * k->gs;
        float mi = k->b1 * m[i] + (1.0f - k->b1) * g;
        float vi = k->b2 * v[i] + (1.0f - k->b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / k->c1, vh = vi / k->c2;
        float w = master[i];
        w -= k->lr * (mh / (sqrtf(vh) + k->eps) + wd * w);
        master[i] = w;
        x[i] = f32_bf16(w);
    }
}

void offload_step(struct engine *e, const struct optim_cfg *c, double lr, double grad_scale,
                  int64_t step) {
    struct offload *o = e->offload;
    struct backend *b = o->b;
    size_t n = o->n, es = b->elt_size;
    if (!n) return;
    offload_fetch_grads(e);
    /* newest download of each chunk */
    memset(o->ct, 0, o->nchunks * sizeof *o->ct);
    for (int i = 0; i < o->nq; i++) {
        const struct oq *q = &o->q[i];
        for (size_t k = q->lo / o->chunk; k * o->chunk < q->hi && k < o->nchunks; k++)
            if (q->t > o->ct[k]) o->ct[k] = q->t;
    }
    o->nq = 0;
    o->nruns = 0;
    optim_runs(e, c, add_run, o);
    float wd = (float)c->weight_decay;
    struct adam_k k = {.lr = (float)lr,
                       .b1 = (float)c->beta1,
                       .b2 = (float)c->beta2,
                       .eps = (float)c->eps,
                       .gs = (float)grad_scale};
    k.c1 = 1.0f - powf(k.b1, (float)step);
    k.c2 = 1.0f - powf(k.b2, (float)step);
    int T = nthreads(o), bf = b->dtype == BACKEND_BF16;
    float *ms = o->master, *mm = o->m, *vv = o->v;
    void *xf = o->xfer;
    const struct orun *runs = o->runs;
    int nruns = o->nruns;
    for (size_t ci = 0; ci < o->nchunks; ci++) {
        size_t c0 = ci * o->chunk, c1 = c0 + o->chunk < n ? c0 + o->chunk : n;
        if (o->async) b->wait(b->ctx, o->ct[ci]);
#pragma omp parallel num_threads(T) if (c1 - c0 >= OFFLOAD_PAR_MIN)
        {
            size_t a, z;
            my_part(c0, c1, &a, &z);
            for (int r = 0; r < nruns && z > a; r++) {
                size_t lo = runs[r].lo > a ? runs[r].lo : a, hi = runs[r].hi < z ? runs[r].hi : z;
                if (hi <= lo) continue;
                float w = runs[r].wd * wd;
                if (bf)
                    adam_bf16(&k, w, xf, ms, mm, vv, lo, hi);
                else
                    adam_f32(&k, w, xf, ms, mm, vv, lo, hi);
            }
        }
        void *dst = engine_params_at(e, e->shard_off + c0);
        const void *src = (const char *)xf + c0 * es;
        if (o->async)
            o->last_up = b->h2d_async(b->ctx, dst, src, (c1 - c0) * es);
        else
            b->upload(b->ctx, dst, src, (c1 - c0) * es);
    }
    /* the next device work (param_sync, the next forward) reads the params */
    if (o->async) b->copy_fence(b->ctx);
}
