/* The fp8 base held as E4M3 alone on the device (worker/fp8base.h): the host
 * copy of the frozen parameters, the device buffer of the tensors that stay
 * in the compute dtype, and the held weights' handles. */
#include "worker/fp8base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/safetensors.h"

struct fp8base {
    struct engine *e;    /* not owned */
    unsigned char *host; /* the frozen parameters [n_params], compute dtype (es bytes a value) */
    size_t es;           /* the backend element size */
    char *held;          /* [layout.n]: 1 for a held weight's first tensor */
    void *rest;          /* device: every tensor that is not a held weight */
    size_t rest_bytes;   /* as counted in e->mem.params */
    struct fp8base_weight *w;
    void **handle; /* [n]: NULL for a weight the backend did not take */
    int n;
    size_t max_span; /* the widest held weight, in values */
};

static size_t span_off(const struct engine *e, const struct fp8base_weight *w) {
    return (size_t)e->layout.t[w->t].rank_offset;
}

/* held weight k's E4M3 values from the host copy through a device staging
 * buffer of the widest weight (made and freed here); *handle is set on the
 * first call */
static int quantize(struct fp8base *f, int k, void *stage) {
    struct engine *e = f->e;
    struct backend *b = e->be;
    const struct fp8base_weight *w = &f->w[k];
    size_t nw = (size_t)w->oc * w->ic;
    b->upload(b->ctx, stage, f->host + span_off(e, w) * f->es, nw * f->es);
    return b->fp8_freeze(b->ctx, stage, w->oc, w->ic, 0, &f->handle[k]);
}

static int taken(const struct engine *e) {
    const struct backend *b = e->be;
    if (!e->frozen || e->nf4 || e->offload || e->opt_host || e->tp != 1 || e->dp != 1 ||
        e->pp != 1 || !b->fp8_freeze || e->p_lo != 0 || e->p_hi != e->n_params || !e->params)
        return 0;
    for (int i = 0; i < e->layout.n; i++)
        if (e->pview[i]) return 0;
    return 1;
}

int fp8base_attach(struct engine *e, const struct fp8base_weight *w, int n, int *held,
                   size_t *bytes) {
    struct backend *b = e->be;
    *held = 0;
    *bytes = 0;
    if (!taken(e) || n <= 0) return 1;
    struct fp8base *f = calloc(1, sizeof *f);
    size_t np = e->n_params, es = b->elt_size;
    void *stage = NULL;
    if (!f) return -1;
    f->e = e;
    f->es = es;
    f->n = n;
    f->host = malloc(np * es);
    f->held = calloc((size_t)e->layout.n, 1);
    f->w = malloc((size_t)n * sizeof *f->w);
    f->handle = calloc((size_t)n, sizeof *f->handle);
    if (!f->host || !f->held || !f->w || !f->handle) goto oom;
    memcpy(f->w, w, (size_t)n * sizeof *w);
    for (int k = 0; k < n; k++) {
        size_t nw = (size_t)w[k].oc * w[k].ic;
        if (nw > f->max_span) f->max_span = nw;
    }
    /* the window to the host, then freed: W8 is made from the host copy */
    b->download(b->ctx, f->host, e->params, np * es);
    engine_release(e, e->params, np * es, &e->mem.params);
    e->params = NULL;
    e->p_lo = e->p_hi = 0;
    e->fp8b = f;
    if (!(stage = engine_alloc(e, f->max_span * es, NULL))) goto oom;
    for (int k = 0; k < n; k++) {
        int rc = quantize(f, k, stage);
        if (rc < 0) goto fail;
        if (rc == 0) {
            f->held[w[k].t] = 1;
            (*held)++;
            *bytes += (size_t)w[k].oc * w[k].ic;
        }
    }
    engine_release(e, stage, f->max_span * es, NULL);
    stage = NULL;
    if (*held == 0) { /* the backend took none (the fp8 row off): the window again */
        void *win = engine_alloc(e, np * es, &e->mem.params);
        if (!win) goto oom;
        b->upload(b->ctx, win, f->host, np * es);
        b->sync(b->ctx);
        e->params = win;
        e->p_hi = np;
        e->fp8b = NULL;
        fp8base_free(f);
        return 1;
    }
    /* every tensor outside a held weight at its window offset less the held
     * spans before it (each a multiple of 512 bytes: OC and IC are multiples
     * of 16), so adjacent tensors stay adjacent and aligned as in the window */
    char *covered = calloc((size_t)e->layout.n, 1);
    size_t held_vals = 0;
    if (!covered) goto oom;
    for (int k = 0; k < n; k++)
        if (f->handle[k]) held_vals += (size_t)w[k].oc * w[k].ic;
    for (int i = 0; i < e->layout.n; i++) {
        size_t lo = (size_t)e->layout.t[i].rank_offset, hi = lo + (size_t)e->layout.t[i].rank_numel;
        for (int k = 0; k < n && !covered[i]; k++) {
            size_t a = span_off(e, &w[k]);
            covered[i] = f->handle[k] && lo >= a && hi <= a + (size_t)w[k].oc * w[k].ic;
        }
    }
    f->rest_bytes = np > held_vals ? (np - held_vals) * es : 1;
    f->rest = engine_alloc(e, f->rest_bytes, &e->mem.params);
    if (!f->rest) {
        free(covered);
        goto oom;
    }
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        if (covered[i]) continue;
        size_t lo = (size_t)t->rank_offset, before = 0;
        for (int k = 0; k < n; k++)
            if (f->handle[k] && span_off(e, &w[k]) < lo) before += (size_t)w[k].oc * w[k].ic;
        e->pview[i] = (char *)f->rest + (lo - before) * es;
        b->upload(b->ctx, e->pview[i], f->host + lo * es, (size_t)t->rank_numel * es);
    }
    for (int k = 0; k < n; k++)
        if (f->handle[k]) e->pview[w[k].t] = f->handle[k];
    free(covered);
    b->sync(b->ctx);
    e->mem.params += *bytes;
    return 0;
oom:
    log_error("fp8: out of memory moving the frozen base (%zu parameters) to E4M3", np);
fail:
    if (stage) engine_release(e, stage, f->max_span * es, NULL);
    if (e->fp8b != f) fp8base_free(f);
    return -1;
}

void fp8base_free(struct fp8base *f) {
    if (!f) return;
    if (f->rest) engine_release(f->e, f->rest, f->rest_bytes, &f->e->mem.params);
    free(f->host);
    free(f->held);
    free(f->w);
    free(f->handle);
    free(f);
}

int fp8base_holds(const struct fp8base *f, int i) {
    return f && f->held[i];
}

int fp8base_put(struct fp8base *f, size_t off, const void *src, size_t n, size_t elt) {
    struct engine *e = f->e;
    if (elt == f->es) { /* the compute dtype (raw), or fp32 on an fp32 backend */
        memcpy(f->host + off * f->es, src, n * elt);
    } else { /* fp32 onto a bf16 copy: rounded as the backend's from_f32 rounds */
        const float *s = src;
        uint16_t *h = (uint16_t *)f->host + off;
        for (size_t i = 0; i < n; i++)
            h[i] = st_f32_to_bf16(s[i]);
    }
    void *stage = NULL;
    int rc = 0;
    for (int k = 0; k < f->n && rc == 0; k++) {
        size_t lo = span_off(e, &f->w[k]), hi = lo + (size_t)f->w[k].oc * f->w[k].ic;
        if (!f->handle[k] || hi <= off || lo >= off + n) continue;
        if (!stage && !(stage = engine_alloc(e, f->max_span * f->es, NULL))) return -1;
        rc = quantize(f, k, stage) == 0 ? 0 : -1;
    }
    if (stage) engine_release(e, stage, f->max_span * f->es, NULL);
    return rc;
}

void fp8base_read(const struct fp8base *f, size_t off, size_t n, float *dst) {
    if (f->es == sizeof(float)) {
        memcpy(dst, f->host + off * f->es, n * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)f->host + off;
    for (size_t i = 0; i < n; i++)
        dst[i] = st_bf16_to_f32(h[i]);
}
