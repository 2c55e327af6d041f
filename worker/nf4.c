/* NF4 with double quantization: the host quantizer and the engine storage
 * of QLoRA's frozen base. See nf4.h and nf4_format.h.
 *
 * Written here rather than taken from bitsandbytes: it is a Python / CUDA
 * library outside Debian, and the format is a few lines of arithmetic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/engine.h"
#include "worker/nf4.h"

/* ---- the 8-bit map of the absmax values ---- */

static float map8[256];
static int map8_ready;

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

const float *nf4_map8(void) {
    if (map8_ready) return map8;
    /* computed in double, rounded once; 254 + 0 + 1 values */
    int k = 0;
    float v[256];
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1; /* linspace(0.1, 1, items): items - 1 midpoints */
        double scale = pow(10.0, (double)(i - 6));
        for (int j = 0; j + 1 < items; j++) {
            double b0 = 0.1 + 0.9 * j / (items - 1), b1 = 0.1 + 0.9 * (j + 1) / (items - 1);
            double mid = (b0 + b1) / 2;
            v[k++] = (float)(scale * mid);
            v[k++] = (float)(-scale * mid);
        }
    }
    v[k++] = 0.0f;
    v[k++] = 1.0f;
    qsort(v, 256, sizeof *v, cmp_f);
    memcpy(map8, v, sizeof v);
    map8_ready = 1; /* idempotent: racing first calls write the same values */
    return map8;
}

/* Index of the value of tab[n] (ascending) nearest x; ties to the lower. */
static int nearest(const float *tab, int n, float x) {
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) { /* tab[lo] <= x < tab[hi] once inside */
        int mid = (lo + hi) / 2;
        if (tab[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return fabsf(x - tab[lo]) <= fabsf(tab[hi] - x) ? lo : hi;
}

void nf4_quantize(const float *w, size_t n, uint8_t *out) {
    const float *m8 = nf4_map8();
    size_t nb = nf4_nblocks(n), nb2 = nf4_nblocks2(n);
    uint8_t *codes = out, *q8 = out + nf4_off_q8(n);
    float *scale = (float *)(void *)(out + nf4_off_scale(n));
    float *absmax = malloc((nb ? nb : 1) * sizeof *absmax);
    if (!absmax) { /* tiny; fall back to a serial pass over a stack value */
        log_error("nf4: out of host memory for %zu block maxima", nb);
        abort();
    }
    memset(out, 0, nf4_bytes(n));
#pragma omp parallel for schedule(static)
    for (long b = 0; b < (long)nb; b++) {
        size_t j0 = (size_t)b * NF4_BLOCK, j1 = j0 + NF4_BLOCK < n ? j0 + NF4_BLOCK : n;
        float m = 0;
        for (size_t j = j0; j < j1; j++)
            m = fabsf(w[j]) > m ? fabsf(w[j]) : m;
        absmax[b] = m;
        float inv = m > 0 ? 1.0f / m : 0.0f;
        for (size_t j = j0; j < j1; j++) { /* 64-weight blocks: bytes never straddle */
            int c = nearest(NF4_CODE, 16, w[j] * inv);
            codes[j / 2] |= (uint8_t)(j % 2 ? c : c << 4);
        }
    }
    double sum = 0;
    for (size_t b = 0; b < nb; b++)
        sum += absmax[b];
    float offset = nb ? (float)(sum / (double)nb) : 0.0f;
#pragma omp parallel for schedule(static)
    for (long c = 0; c < (long)nb2; c++) {
        size_t b0 = (size_t)c * NF4_BLOCK2, b1 = b0 + NF4_BLOCK2 < nb ? b0 + NF4_BLOCK2 : nb;
        float s = 0;
        for (size_t b = b0; b < b1; b++)
            s = fabsf(absmax[b] - offset) > s ? fabsf(absmax[b] - offset) : s;
        scale[c] = s;
        float inv = s > 0 ? 1.0f / s : 0.0f;
        for (size_t b = b0; b < b1; b++)
            q8[b] = (uint8_t)nearest(m8, 256, (absmax[b] - offset) * inv);
    }
    memcpy(out + nf4_off_offset(n), &offset, sizeof offset);
    memcpy(out + nf4_off_map(n), m8, 256 * sizeof(float));
    free(absmax);
}

void nf4_dequantize(const uint8_t *q, size_t n, float *w) {
    const uint8_t *q8 = q + nf4_off_q8(n);
    const float *scale = (const float *)(const void *)(q + nf4_off_scale(n));
    const float *m8 = (const float *)(const void *)(q + nf4_off_map(n));
    float offset;
    memcpy(&offset, q + nf4_off_offset(n), sizeof offset);
    size_t nb = nf4_nblocks(n);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long b = 0; b < (long)nb; b++) {
        /* fmaf: one rounding, as the cuda kernel's __fmaf_rn */
        float a = fmaf(m8[q8[b]], scale[(size_t)b / NF4_BLOCK2], offset);
        size_t j0 = (size_t)b * NF4_BLOCK, j1 = j0 + NF4_BLOCK < n ? j0 + NF4_BLOCK : n;
        for (size_t j = j0; j < j1; j++) {
            int c = j % 2 ? q[j / 2] & 15 : q[j / 2] >> 4;
            w[j] = NF4_CODE[c] * a;
        }
    }
}

/* ---- engine storage ---- */

struct nf4_t {
    int tensor;
    size_t lo, n;   /* flat range (rank offsets) */
    void *dev;      /* nf4_bytes(n), backend memory */
    float *pending; /* host fp32 [n] while pieces arrive, else NULL */
    size_t got;
};

struct nf4 {
    struct engine *e;
    struct nf4_t *t;
    int nt;
    /* nf4_set_delta: added to a weight as nf4_read dequantizes it (NULL: none) */
    void (*delta)(void *user, int tensor, float *w);
    void *delta_user;
    int *of;       /* [layout.n]: index into t, or -1 */
    void *scratch; /* compute dtype: one block's linear weights */
    void *rest;    /* compute dtype: every other tensor, in layout order */
    size_t scratch_bytes, rest_bytes, q_bytes;
    size_t weights;
    int loaded; /* block in the scratch, -1 */
};

int nf4_is_quantized(const struct engine *e, int i) {
    const struct model_tensor *t = &e->layout.t[i];
    return t->kind == MODEL_T_LINEAR_W && t->layer >= 0 && t->ndim == 2;
}

void nf4_free(struct nf4 *q) {
    if (!q) return;
    struct engine *e = q->e;
    struct backend *b = e->be;
    for (int i = 0; i < q->nt; i++) {
        b->free(b->ctx, q->t[i].dev);
        free(q->t[i].pending);
    }
    b->free(b->ctx, q->scratch);
    b->free(b->ctx, q->rest);
    e->mem.params -= q->scratch_bytes + q->rest_bytes + q->q_bytes;
    for (int i = 0; q->of && i < e->layout.n; i++)
        e->pview[i] = NULL;
    if (e->nf4 == q) e->nf4 = NULL;
    free(q->t);
    free(q->of);
    free(q);
}

/* 1 when this rank uses tensor i: every tensor, or with pp its stage's
 * (the last stage's copy of a tied embedding included). */
static int nf4_on_stage(const struct engine *e, int i) {
    return e->pp <= 1 || model_tensor_on_stage(&e->cfg, &e->layout.t[i], e->pp, e->pp_idx);
}

int nf4_attach(struct engine *e, char *err, size_t errlen) {
    struct backend *b = e->be;
    if (!b->nf4_dequant) {
        snprintf(err, errlen, "train.quantize_base nf4: the %s backend cannot dequantize NF4",
                 b->name);
        return -1;
    }
    /* dp: every rank holds the whole base, quantized as one process does;
     * pp: a stage its own tensors, whole. tp would quantize shards, whose
     * blocks and scales differ from the whole tensor's (docs/engine.md
     * "QLoRA"). */
    if (e->tp != 1 || !e->frozen || e->p_hi > e->p_lo) {
        snprintf(err, errlen,
                 "train.quantize_base nf4 needs tp=1 and a frozen base (tp=%d, frozen=%d, "
                 "resident params %zu)",
                 e->tp, e->frozen, e->p_hi - e->p_lo);
        return -1;
    }
    struct nf4 *q = calloc(1, sizeof *q);
    int n = e->layout.n;
    if (!q || !(q->t = calloc((size_t)n, sizeof *q->t)) ||
        !(q->of = malloc((size_t)n * sizeof *q->of)))
        goto oom;
    q->e = e;
    q->loaded = -1;
    /* one block's linear weights (the widest block) and the rest */
    size_t es = b->elt_size, blk = 0, cur = 0, rest = 0;
    int layer = -2;
    for (int i = 0; i < n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        q->of[i] = -1;
        if (!nf4_on_stage(e, i)) continue; /* pp: another stage's (no view) */
        if (!nf4_is_quantized(e, i)) {
            rest += (size_t)t->rank_numel;
            continue;
        }
        if (t->layer != layer) cur = 0, layer = t->layer;
        cur += (size_t)t->rank_numel;
        blk = cur > blk ? cur : blk;
        q->of[i] = q->nt;
        q->t[q->nt++] =
            (struct nf4_t){.tensor = i, .lo = (size_t)t->rank_offset, .n = (size_t)t->rank_numel};
    }
    q->scratch_bytes = (blk ? blk : 1) * es;
    q->rest_bytes = (rest ? rest : 1) * es;
    q->scratch = engine_alloc(e, q->scratch_bytes, &e->mem.params);
    if (!q->scratch) q->scratch_bytes = 0;
    q->rest = engine_alloc(e, q->rest_bytes, &e->mem.params);
    if (!q->rest) q->rest_bytes = 0;
    if (!q->scratch || !q->rest) goto oom;
    b->zero(b->ctx, q->rest, q->rest_bytes);
    for (int k = 0; k < q->nt; k++) {
        size_t nb = nf4_bytes(q->t[k].n);
        q->t[k].dev = engine_alloc(e, nb, &e->mem.params);
        if (!q->t[k].dev) goto oom;
        q->q_bytes += nb;
        q->weights += q->t[k].n;
        b->zero(b->ctx, q->t[k].dev, nb);
    }
    /* the views: a block's linear weights side by side in the scratch (in
     * layout order, so q|k|v and gate|up stay adjacent), the others packed
     * in layout order in rest (adjacent biases stay adjacent) */
    size_t ro = 0, so = 0;
    layer = -2;
    for (int i = 0; i < n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        if (!nf4_on_stage(e, i)) continue;
        if (q->of[i] < 0) {
            e->pview[i] = backend_at(b, q->rest, ro);
            ro += (size_t)t->rank_numel;
            continue;
        }
        if (t->layer != layer) so = 0, layer = t->layer;
        e->pview[i] = backend_at(b, q->scratch, so);
        so += (size_t)t->rank_numel;
    }
    e->nf4 = q;
    return 0;
oom:
    if (q) {
        q->e = e;
        /* the views are not set yet: nf4_free clears none that matter */
        nf4_free(q);
    }
    snprintf(err, errlen, "out of memory for the NF4 base");
    return -1;
}

/* Quantize t's fp32 values v and upload them. */
static int quantize_one(struct nf4 *q, struct nf4_t *t, const float *v) {
    struct backend *b = q->e->be;
    size_t nb = nf4_bytes(t->n);
    uint8_t *h = malloc(nb);
    if (!h) return -1;
    nf4_quantize(v, t->n, h);
    b->upload(b->ctx, t->dev, h, nb);
    b->sync(b->ctx);
    free(h);
    return 0;
}

static void widen(float *dst, const void *src, size_t n, size_t elt) {
    if (elt == sizeof(float)) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = src; /* bf16 */
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

int nf4_put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt) {
    size_t covered = 0;
    const unsigned char *s = src;
    for (int k = 0; k < q->nt; k++) {
        struct nf4_t *t = &q->t[k];
        size_t a = off > t->lo ? off : t->lo, z = off + n < t->lo + t->n ? off + n : t->lo + t->n;
        if (z <= a) continue;
        covered += z - a;
        q->loaded = -1;
        if (a == t->lo && z == t->lo + t->n && !t->pending) { /* the whole tensor */
            float *v = elt == sizeof(float) ? NULL : malloc(t->n * sizeof *v);
            if (elt != sizeof(float) && !v) return -1;
            if (v) widen(v, s + (a - off) * elt, t->n, elt);
            int rc = quantize_one(q, t, v ? v : (const float *)(const void *)(s + (a - off) * elt));
            free(v);
            if (rc != 0) return -1;
            continue;
        }
        if (!t->pending && !(t->pending = calloc(t->n, sizeof(float)))) return -1;
        widen(t->pending + (a - t->lo), s + (a - off) * elt, z - a, elt);
        t->got += z - a;
        if (t->got >= t->n) {
            int rc = quantize_one(q, t, t->pending);
            free(t->pending);
            t->pending = NULL;
            t->got = 0;
            if (rc != 0) return -1;
        }
    }
    return covered == n ? 1 : 0;
}

void nf4_layer(struct nf4 *q, int layer) {
    if (!q || q->loaded == layer) return;
    struct engine *e = q->e;
    struct backend *b = e->be;
    for (int k = 0; k < q->nt; k++) {
        const struct nf4_t *t = &q->t[k];
        if (e->layout.t[t->tensor].layer == layer)
            b->nf4_dequant(b->ctx, e->pview[t->tensor], t->dev, t->n);
    }
    q->loaded = layer;
}

/* ---- reading the base back (exports) ---- */

/* Tensor t's values as fp32 into host dst[t->n]: the codes dequantized on
 * the host (nf4_dequantize: the values the cpu backend computes with; the
 * cuda kernel rounds these to bf16), plus the delta hook's. 0 or -1. */
static int read_quantized(struct nf4 *q, const struct nf4_t *t, float *dst) {
    struct backend *b = q->e->be;
    size_t nb = nf4_bytes(t->n);
    uint8_t *h = malloc(nb);
    if (!h) return -1;
    b->download(b->ctx, h, t->dev, nb);
    nf4_dequantize(h, t->n, dst);
    free(h);
    if (q->delta) q->delta(q->delta_user, t->tensor, dst);
    return 0;
}

/* A compute-dtype device tensor src[n] as fp32 into host dst (bf16: in
 * slices through a small fp32 device buffer). 0 or -1. */
static int read_plain(struct backend *b, const void *src, float *dst, size_t n) {
    if (b->dtype == BACKEND_F32) {
        b->download(b->ctx, dst, src, n * sizeof *dst);
        return 0;
    }
    size_t chunk = n < ((size_t)1 << 24) ? n : ((size_t)1 << 24);
    float *f = b->alloc(b->ctx, (chunk ? chunk : 1) * sizeof *f);
    if (!f) return -1;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        b->to_f32(b->ctx, f, backend_at(b, src, i), k);
        b->download(b->ctx, dst + i, f, k * sizeof *dst);
    }
    b->free(b->ctx, f);
    return 0;
}

int nf4_read(struct nf4 *q, size_t off, size_t n, float *dst) {
    struct engine *e = q->e;
    struct backend *b = e->be;
    float *v = NULL;
    size_t vn = 0;
    int rc = -1;
    memset(dst, 0, n * sizeof *dst); /* tensors of other stages: zeros */
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *mt = &e->layout.t[i];
        size_t lo = (size_t)mt->rank_offset, tn = (size_t)mt->rank_numel;
        size_t a = off > lo ? off : lo, z = off + n < lo + tn ? off + n : lo + tn;
        if (z <= a || (q->of[i] < 0 && !e->pview[i])) continue;
        if (tn > vn) { /* one tensor's values at a time */
            free(v);
            if (!(v = malloc(tn * sizeof *v))) goto out;
            vn = tn;
        }
        if ((q->of[i] >= 0 ? read_quantized(q, &q->t[q->of[i]], v)
                           : read_plain(b, e->pview[i], v, tn)) != 0)
            goto out;
        memcpy(dst + (a - off), v + (a - lo), (z - a) * sizeof *dst);
    }
    rc = 0;
out:
    free(v);
    return rc;
}

void nf4_set_delta(struct nf4 *q, void (*fn)(void *user, int tensor, float *w), void *user) {
    q->delta = fn;
    q->delta_user = user;
}

void nf4_stats(const struct nf4 *q, int *tensors, size_t *weights, size_t *bytes) {
    *tensors = q->nt;
    *weights = q->weights;
    *bytes = q->q_bytes;
}
