/* Engine context: place in the parallel layout, backend, model layout and the
 * flat device buffers (params, grads, fp32 master, AdamW moments). See
 * engine.h for the step and the hooks the comm layer fills. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/engine.h"
#include "worker/fp8base.h"
#include "worker/nf4.h"
#include "worker/offload.h"

int engine_place_check(const struct engine_place *p, char *err, size_t errlen) {
    if (p->tp < 1 || p->dp < 1 || p->pp < 1) {
        snprintf(err, errlen, "tp=%d dp=%d pp=%d must all be >= 1", p->tp, p->dp, p->pp);
        return -1;
    }
    if ((long)p->tp * p->dp * p->pp != p->world) {
        snprintf(err, errlen, "world=%d but dp*tp*pp = %d*%d*%d = %ld", p->world, p->dp, p->tp,
                 p->pp, (long)p->tp * p->dp * p->pp);
        return -1;
    }
    if (p->rank < 0 || p->rank >= p->world) {
        snprintf(err, errlen, "rank=%d is outside [0, world=%d)", p->rank, p->world);
        return -1;
    }
    return 0;
}

static void *ealloc(struct engine *e, size_t bytes, size_t *cat) {
    void *p = e->be->alloc(e->be->ctx, bytes);
    if (p && cat) *cat += bytes;
    return p;
}

void *engine_alloc(struct engine *e, size_t bytes, size_t *category) {
    return ealloc(e, bytes, category);
}

void engine_release(struct engine *e, void *p, size_t bytes, size_t *category) {
    if (!p) return;
    e->be->free(e->be->ctx, p);
    if (category) *category -= bytes;
}

void *engine_params_at(const struct engine *e, size_t off) {
    return backend_at(e->be, e->params, off - e->p_lo);
}

void *engine_grads_at(const struct engine *e, size_t off) {
    return backend_at(e->be, e->grads, off - e->g_lo);
}

/* Move one window to [nlo, nhi), keeping the overlap. */
static int move_window(struct engine *e, void **buf, size_t *lo, size_t *hi, size_t nlo, size_t nhi,
                       size_t *cat) {
    struct backend *b = e->be;
    size_t es = b->elt_size, n = nhi - nlo;
    void *nb = ealloc(e, (n ? n : 1) * es, cat);
    if (!nb) return -1;
    b->zero(b->ctx, nb, (n ? n : 1) * es);
    size_t a = *lo > nlo ? *lo : nlo, z = *hi < nhi ? *hi : nhi;
    if (*buf && z > a)
        b->copy(b->ctx, backend_at(b, nb, a - nlo), backend_at(b, *buf, a - *lo), (z - a) * es);
    b->sync(b->ctx);
    if (*buf) engine_release(e, *buf, ((*hi - *lo) ? (*hi - *lo) : 1) * es, cat);
    *buf = nb;
    *lo = nlo;
    *hi = nhi;
    return 0;
}

int engine_set_windows(struct engine *e, size_t plo, size_t phi, size_t glo, size_t ghi) {
    if (plo > phi || phi > e->n_params || glo > ghi || ghi > e->n_params) {
        log_error("engine: windows [%zu, %zu) / [%zu, %zu) outside %zu parameters", plo, phi, glo,
                  ghi, e->n_params);
        return -1;
    }
    if (e->frozen) /* no gradient window at all */
        glo = ghi = 0;
    if (move_window(e, &e->params, &e->p_lo, &e->p_hi, plo, phi, &e->mem.params) != 0 ||
        (!e->frozen &&
         move_window(e, &e->grads, &e->g_lo, &e->g_hi, glo, ghi, &e->mem.grads) != 0)) {
        log_error("engine: out of memory for the parameter / gradient windows");
        return -1;
    }
    if (e->master_aliased) {
        if (e->shard_off < plo || e->shard_off + e->shard_n > phi) {
            /* the caller sets a shard inside the new window next */
            e->master = NULL;
            e->master_aliased = 0;
        } else {
            e->master = (float *)engine_params_at(e, e->shard_off);
        }
    }
    return 0;
}

void engine_zero_grads(struct engine *e) {
    struct backend *b = e->be;
    if (!e->grads) return; /* frozen */
    b->zero(b->ctx, e->grads, (e->g_hi - e->g_lo) * b->elt_size);
    for (int i = 0; i < e->layout.n; i++)
        if (e->gview[i])
            b->zero(b->ctx, e->gview[i], (size_t)e->layout.t[i].rank_numel * b->elt_size);
}

static void free_opt(struct engine *e) {
    struct backend *b = e->be;
    if (e->opt_host) { /* host memory of the offload */
        offload_release(e->offload);
        return;
    }
    if (!e->master_aliased) b->free(b->ctx, e->master);
    b->free(b->ctx, e->opt_m);
    b->free(b->ctx, e->opt_v);
    e->master = e->opt_m = e->opt_v = NULL;
}

int engine_set_shard(struct engine *e, size_t off, size_t n) {
    struct backend *b = e->be;
    if (off + n > e->n_params) {
        log_error("engine: shard [%zu, %zu) exceeds %zu parameters", off, off + n, e->n_params);
        return -1;
    }
    free_opt(e);
    e->mem.optimizer = e->scalar ? 4 * sizeof(float) : 0;
    e->shard_off = off;
    e->shard_n = n;
    if (e->frozen) return 0; /* nothing is optimized */
    if (e->offload) {
        if (off < e->p_lo || off + n > e->p_hi) {
            log_error("engine: shard [%zu, %zu) outside the params window [%zu, %zu)", off, off + n,
                      e->p_lo, e->p_hi);
            return -1;
        }
        if (offload_alloc(e->offload, n) != 0) return -1;
        offload_master_from_params(e->offload);
        return 0;
    }
    size_t bytes = (n ? n : 1) * sizeof(float);
    e->opt_m = ealloc(e, bytes, &e->mem.optimizer);
    e->opt_v = ealloc(e, bytes, &e->mem.optimizer);
    if (off < e->p_lo || off + n > e->p_hi) {
        log_error("engine: shard [%zu, %zu) outside the params window [%zu, %zu)", off, off + n,
                  e->p_lo, e->p_hi);
        return -1;
    }
    if (b->dtype == BACKEND_F32) {
        e->master = (float *)engine_params_at(e, off);
        e->master_aliased = 1;
    } else {
        e->master = ealloc(e, bytes, &e->mem.optimizer);
        e->master_aliased = 0;
        if (e->master) b->to_f32(b->ctx, e->master, engine_params_at(e, off), n);
    }
    if (!e->opt_m || !e->opt_v || !e->master) {
        log_error("engine: out of memory for optimizer state (%zu elements)", n);
        return -1;
    }
    b->zero(b->ctx, e->opt_m, bytes);
    b->zero(b->ctx, e->opt_v, bytes);
    return 0;
}

struct engine *engine_new(const struct model_config *cfg, const struct engine_place *p,
                          struct backend *be) {
    char err[256];
    struct engine *e = NULL;
    if (engine_place_check(p, err, sizeof err) != 0) {
        log_error("engine: %s", err);
        goto fail;
    }
    e = calloc(1, sizeof *e);
    if (!e) goto fail;
    e->be = be;
    e->cfg = *cfg;
    e->rank = p->rank;
    e->world = p->world;
    e->local_rank = p->local_rank;
    e->tp = p->tp;
    e->dp = p->dp;
    e->pp = p->pp;
    e->tp_idx = p->rank % p->tp;
    e->dp_idx = (p->rank / p->tp) % p->dp;
    e->pp_idx = p->rank / (p->tp * p->dp);
    if (model_layout_init(&e->layout, cfg, p->tp) != 0) {
        log_error("engine: cannot build the parameter layout (tp=%d)", p->tp);
        goto fail;
    }
    e->n_params = (size_t)e->layout.rank_numel;
    e->p_hi = e->g_hi = p->windows_later ? 0 : e->n_params;
    e->tp_host_sync = p->tp_host_sync;
    e->frozen = p->frozen;
    if (e->frozen) e->g_hi = 0;
    size_t bytes = (e->p_hi ? e->p_hi : 1) * be->elt_size; /* an empty window holds 1 */
    e->params = ealloc(e, bytes, &e->mem.params);
    e->grads = e->frozen ? NULL : ealloc(e, bytes, &e->mem.grads);
    e->pview = calloc((size_t)e->layout.n, sizeof(void *));
    e->gview = calloc((size_t)e->layout.n, sizeof(void *));
    if (!e->params || (!e->grads && !e->frozen) || !e->pview || !e->gview) {
        log_error("engine: out of memory for %zu parameters", e->n_params);
        goto fail;
    }
    e->scalar = ealloc(e, 4 * sizeof(float), &e->mem.optimizer);
    if (!e->scalar) goto fail;
    be->zero(be->ctx, e->params, bytes);
    if (e->grads) be->zero(be->ctx, e->grads, bytes);
    e->shard_off = 0;
    e->shard_n = e->n_params;
    if (!p->opt_later && engine_set_shard(e, 0, e->n_params) != 0) goto fail;
    return e;
fail:
    if (e) {
        engine_free(e);
    } else {
        backend_free(be);
    }
    return NULL;
}

void engine_free(struct engine *e) {
    if (!e) return;
    struct backend *b = e->be;
    if (b) {
        free_opt(e);
        offload_free(e->offload);
        nf4_free(e->nf4);
        fp8base_free(e->fp8b);
        b->free(b->ctx, e->params);
        b->free(b->ctx, e->grads);
        b->free(b->ctx, e->scalar);
        backend_free(b);
    }
    free(e->pview);
    free(e->gview);
    model_layout_free(&e->layout);
    free(e);
}

void *engine_param(const struct engine *e, int i) {
    if (e->pview[i]) return e->pview[i];
    size_t lo = (size_t)e->layout.t[i].rank_offset, hi = lo + (size_t)e->layout.t[i].rank_numel;
    return lo >= e->p_lo && hi <= e->p_hi ? engine_params_at(e, lo) : NULL;
}

void *engine_grad(const struct engine *e, int i) {
    if (e->gview[i]) return e->gview[i];
    size_t lo = (size_t)e->layout.t[i].rank_offset, hi = lo + (size_t)e->layout.t[i].rank_numel;
    return lo >= e->g_lo && hi <= e->g_hi ? engine_grads_at(e, lo) : NULL;
}

int engine_tensor_find(const struct engine *e, const char *name) {
    for (int i = 0; i < e->layout.n; i++)
        if (strcmp(e->layout.t[i].name, name) == 0) return i;
    return -1;
}

/* Write host fp32 src (flat [off, off+n)) where it meets [lo, hi) into dst
 * (device, compute dtype, holding flat [lo, hi)); stage: the range as fp32 on
 * the device (bf16 backends), or NULL. */
static void put(struct backend *b, void *dst, size_t lo, size_t hi, const float *src,
                const float *stage, size_t off, size_t n) {
    size_t a = off > lo ? off : lo, z = off + n < hi ? off + n : hi;
    if (!dst || z <= a) return;
    if (stage)
        b->from_f32(b->ctx, backend_at(b, dst, a - lo), stage + (a - off), z - a);
    else
        b->upload(b->ctx, backend_at(b, dst, a - lo), src + (a - off), (z - a) * sizeof(float));
}

int engine_params_from_host(struct engine *e, size_t off, const float *src, size_t n) {
    struct backend *b = e->be;
    if (n == 0) return 0;
    if (e->nf4) { /* quantized weights: nothing more to write when the range is all of them */
        int rc = nf4_put(e->nf4, off, src, n, sizeof(float));
        if (rc != 0) return rc < 0 ? -1 : 0;
    }
    if (e->fp8b && fp8base_put(e->fp8b, off, src, n, sizeof(float)) != 0) return -1;
    float *stage = NULL;
    if (b->dtype != BACKEND_F32) {
        stage = b->alloc(b->ctx, n * sizeof(float));
        if (!stage) return -1;
        b->upload(b->ctx, stage, src, n * sizeof(float));
    }
    put(b, e->params, e->p_lo, e->p_hi, src, stage, off, n);
    for (int i = 0; i < e->layout.n; i++) {
        size_t lo = (size_t)e->layout.t[i].rank_offset;
        if (e->pview[i] && !fp8base_holds(e->fp8b, i))
            put(b, e->pview[i], lo, lo + (size_t)e->layout.t[i].rank_numel, src, stage, off, n);
    }
    if (e->opt_host && e->master) { /* offload: the fp32 master in host memory */
        size_t lo = off > e->shard_off ? off : e->shard_off;
        size_t hi = off + n < e->shard_off + e->shard_n ? off + n : e->shard_off + e->shard_n;
        if (lo < hi)
            memcpy(e->master + (lo - e->shard_off), src + (lo - off), (hi - lo) * sizeof(float));
    }
    if (stage) {
        size_t lo = off > e->shard_off ? off : e->shard_off;
        size_t hi = off + n < e->shard_off + e->shard_n ? off + n : e->shard_off + e->shard_n;
        if (!e->master_aliased && !e->opt_host && e->master && lo < hi)
            b->copy(b->ctx, e->master + (lo - e->shard_off), stage + (lo - off),
                    (hi - lo) * sizeof(float));
        b->sync(b->ctx);
        b->free(b->ctx, stage);
    }
    return 0;
}

/* Upload compute-dtype host src (flat [off, off+n)) where it meets [lo, hi)
 * into dst (device, holding flat [lo, hi)). */
static void put_raw(struct backend *b, void *dst, size_t lo, size_t hi, const void *src, size_t off,
                    size_t n) {
    size_t a = off > lo ? off : lo, z = off + n < hi ? off + n : hi;
    if (!dst || z <= a) return;
    b->upload(b->ctx, backend_at(b, dst, a - lo), backend_at(b, src, a - off),
              (z - a) * b->elt_size);
}

int engine_params_from_host_raw(struct engine *e, size_t off, const void *src, size_t n) {
    struct backend *b = e->be;
    if (n == 0) return 0;
    if (e->nf4) {
        int rc = nf4_put(e->nf4, off, src, n, b->elt_size);
        if (rc != 0) return rc < 0 ? -1 : 0;
    }
    if (e->fp8b && fp8base_put(e->fp8b, off, src, n, b->elt_size) != 0) return -1;
    put_raw(b, e->params, e->p_lo, e->p_hi, src, off, n);
    for (int i = 0; i < e->layout.n; i++) {
        size_t lo = (size_t)e->layout.t[i].rank_offset;
        if (e->pview[i] && !fp8base_holds(e->fp8b, i))
            put_raw(b, e->pview[i], lo, lo + (size_t)e->layout.t[i].rank_numel, src, off, n);
    }
    size_t lo = off > e->shard_off ? off : e->shard_off;
    size_t hi = off + n < e->shard_off + e->shard_n ? off + n : e->shard_off + e->shard_n;
    if (!e->master || e->master_aliased || lo >= hi) return 0;
    if (e->opt_host) { /* offload: the master in host memory, widened here */
        for (size_t k = lo; k < hi; k++) {
            if (b->dtype == BACKEND_F32) {
                memcpy(e->master + (k - e->shard_off), (const float *)src + (k - off), 4);
            } else {
                uint16_t h;
                memcpy(&h, (const uint16_t *)src + (k - off), 2);
                uint32_t u = (uint32_t)h << 16;
                memcpy(e->master + (k - e->shard_off), &u, 4);
            }
        }
        return 0;
    }
    /* the shard lies in the params window, just written: widen it there */
    b->to_f32(b->ctx, e->master + (lo - e->shard_off), engine_params_at(e, lo), hi - lo);
    b->sync(b->ctx);
    return 0;
}

int engine_opt_ready(const struct engine *e) {
    return e->frozen || e->opt_m != NULL;
}

int engine_opt_init(struct engine *e) {
    return engine_opt_ready(e) ? 0 : engine_set_shard(e, e->shard_off, e->shard_n);
}

int engine_offload_enable(struct engine *e, const struct offload_opts *opts) {
    struct backend *b = e->be;
    if (e->offload) return 0;
    struct offload *o = offload_new(e, opts);
    if (!o) {
        log_error("engine: out of memory for the optimizer offload");
        return -1;
    }
    if (!engine_opt_ready(e)) { /* allocated on the host when the shard is set */
        e->offload = o;
        return 0;
    }
    /* move the device state to the host, values kept */
    float *dm = e->master, *dmm = e->opt_m, *dv = e->opt_v;
    int aliased = e->master_aliased;
    size_t n = e->shard_n, bytes = (n ? n : 1) * sizeof(float);
    e->master = e->opt_m = e->opt_v = NULL;
    e->offload = o;
    if (offload_alloc(o, n) != 0) {
        offload_free(o);
        e->offload = NULL;
        e->master = dm;
        e->opt_m = dmm;
        e->opt_v = dv;
        e->master_aliased = aliased;
        return -1;
    }
    b->download(b->ctx, e->master, dm, n * sizeof(float));
    b->download(b->ctx, e->opt_m, dmm, n * sizeof(float));
    b->download(b->ctx, e->opt_v, dv, n * sizeof(float));
    if (!aliased) engine_release(e, dm, bytes, &e->mem.optimizer);
    engine_release(e, dmm, bytes, &e->mem.optimizer);
    engine_release(e, dv, bytes, &e->mem.optimizer);
    return 0;
}

static float *opt_array(const struct engine *e, enum engine_opt which) {
    return which == ENGINE_OPT_M ? e->opt_m : which == ENGINE_OPT_V ? e->opt_v : e->master;
}

/* Frozen: the shard's parameters as fp32 into host dst (the "master"). */
static void frozen_params_read(struct engine *e, float *dst, size_t off, size_t n) {
    struct backend *b = e->be;
    if (e->nf4) { /* QLoRA: no window; the views and the NF4 codes (worker/nf4.h) */
        if (nf4_read(e->nf4, e->shard_off + off, n, dst) != 0)
            die("engine: out of memory reading %zu NF4 base parameters", n);
        return;
    }
    if (e->fp8b) { /* fp8: the host copy (worker/fp8base.h) */
        fp8base_read(e->fp8b, e->shard_off + off, n, dst);
        return;
    }
    const void *src = engine_params_at(e, e->shard_off + off);
    if (b->dtype == BACKEND_F32) {
        b->download(b->ctx, dst, src, n * sizeof(float));
        return;
    }
    /* bf16: converted in slices through a small fp32 device buffer */
    size_t chunk = n < ((size_t)1 << 24) ? n : ((size_t)1 << 24);
    float *f = b->alloc(b->ctx, chunk * sizeof(float));
    if (!f) die("engine: out of memory reading %zu frozen parameters", n);
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        b->to_f32(b->ctx, f, backend_at(b, src, i), k);
        b->download(b->ctx, dst + i, f, k * sizeof(float));
    }
    b->free(b->ctx, f);
}

void engine_opt_read(struct engine *e, enum engine_opt which, float *dst, size_t off, size_t n) {
    struct backend *b = e->be;
    if (e->frozen && n) {
        if (which == ENGINE_OPT_MASTER)
            frozen_params_read(e, dst, off, n);
        else
            memset(dst, 0, n * sizeof(float)); /* a frozen tensor has no moments */
        return;
    }
    const float *p = opt_array(e, which);
    if (!n || !p) return;
    if (e->opt_host)
        memcpy(dst, p + off, n * sizeof(float));
    else
        b->download(b->ctx, dst, p + off, n * sizeof(float));
}

void engine_opt_write(struct engine *e, enum engine_opt which, const float *src, size_t off,
                      size_t n) {
    struct backend *b = e->be;
    float *p = opt_array(e, which);
    if (!n || !p) return;
    if (e->opt_host) {
        memcpy(p + off, src, n * sizeof(float));
    } else {
        b->upload(b->ctx, p + off, src, n * sizeof(float));
    }
}

void engine_master_to_dev(struct engine *e, float *dst) {
    struct backend *b = e->be;
    if (!e->shard_n || !e->master) return;
    if (e->opt_host)
        b->upload(b->ctx, dst, e->master, e->shard_n * sizeof(float));
    else
        b->copy(b->ctx, dst, e->master, e->shard_n * sizeof(float));
}
