/* NF4 with double quantization: the host quantizer and the engine storage
 * of QLoRA's frozen base. See nf4.h and nf4_format.h.
 *
 * Written here rather than taken from bitsandbytes: it is a Python / CUDA
 * library outside Debian, and the format is a few lines of arithmetic. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
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

/* ---- the quantizer ---- */

static struct nf4_opts opts = {.fast = 1, .threads = 0, .overlap = 1};

void nf4_configure(const struct nf4_opts *o) {
    opts = *o;
}

int nf4_threads(void) {
    long t = opts.threads;
    if (t <= 0) t = sysconf(_SC_NPROCESSORS_ONLN);
    if (t < 1) t = 1;
    return t > NF4_MAX_THREADS ? NF4_MAX_THREADS : (int)t;
}

/* The reference: one thread, a binary search per weight (kept as the
 * nf4-fast=0 path and as what the fast one is tested against). */
void nf4_quantize_serial(const float *w, size_t n, uint8_t *out) {
    const float *m8 = nf4_map8();
    size_t nb = nf4_nblocks(n), nb2 = nf4_nblocks2(n);
    uint8_t *codes = out, *q8 = out + nf4_off_q8(n);
    float *scale = (float *)(void *)(out + nf4_off_scale(n));
    float *absmax = malloc((nb ? nb : 1) * sizeof *absmax);
    if (!absmax) {
        log_error("nf4: out of host memory for %zu block maxima", nb);
        abort();
    }
    memset(out, 0, nf4_bytes(n));
    for (size_t b = 0; b < nb; b++) {
        size_t j0 = b * NF4_BLOCK, j1 = j0 + NF4_BLOCK < n ? j0 + NF4_BLOCK : n;
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
    for (size_t c = 0; c < nb2; c++) {
        size_t b0 = c * NF4_BLOCK2, b1 = b0 + NF4_BLOCK2 < nb ? b0 + NF4_BLOCK2 : nb;
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

/* The fast nearest code. nearest() picks lo over hi = lo + 1 when
 * fl(x - tab[lo]) <= fl(tab[hi] - x); over [tab[lo], tab[hi]] the left side
 * grows and the right one shrinks with x, so the pick is lo exactly up to one
 * float, thr[lo] (found by bisection over the floats in between, once), and
 * the code is the number of thresholds below x. That is nearest() for every
 * x in [-inf, 1) (ties included: they sit at or below thr); above the table
 * nearest() compares fl(x - tab[14]) with fl(x - 1), equal for +inf (an
 * absmax under 1 / FLT_MAX makes the scale infinite), and NaN (0 times an
 * infinite scale) falls to code 1: two corrections, both without branches. */
static float thr[15];
static int thr_ready;

static uint32_t f2key(float f) { /* order-preserving: floats to unsigned keys */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static float key2f(uint32_t k) {
    uint32_t u = k & 0x80000000u ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static const float *nf4_thresholds(void) {
    if (thr_ready) return thr;
    for (int i = 0; i < 15; i++) {
        float a = NF4_CODE[i], b = NF4_CODE[i + 1];
        uint32_t lo = f2key(a), hi = f2key(b); /* pred(lo) holds, pred(hi) does not */
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            float x = key2f(mid);
            if (fabsf(x - a) <= fabsf(b - x))
                lo = mid;
            else
                hi = mid;
        }
        thr[i] = key2f(lo);
    }
    thr_ready = 1; /* idempotent, as map8 */
    return thr;
}

/* One 64-weight block: its codes (32 bytes) and its absmax. Written for the
 * vectorizer: the maximum in 8 lanes (max ignores order, and NaN falls out
 * of `>` in every lane as in the serial loop), the codes as 15 passes of
 * compare-and-count over the 64 values. */
#ifdef __GNUC__
__attribute__((always_inline)) /* into each clone of quant_blocks */
#endif
static inline float
quant_block(const float *w, uint8_t *codes, const float *t) {
    float lane[8] = {0};
    for (int j = 0; j < NF4_BLOCK; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] = fabsf(w[j + l]) > lane[l] ? fabsf(w[j + l]) : lane[l];
    float m = 0;
    for (int l = 0; l < 8; l++)
        m = lane[l] > m ? lane[l] : m;
    float inv = m > 0 ? 1.0f / m : 0.0f, x[NF4_BLOCK];
    int32_t k[NF4_BLOCK];
    for (int j = 0; j < NF4_BLOCK; j++) {
        x[j] = w[j] * inv;
        /* NaN: code 1; +inf (and any x >= 1 where fl(x - c14) <= fl(1 - x)): 14 */
        k[j] =
            (x[j] != x[j]) - ((x[j] >= 1.0f) & (fabsf(x[j] - NF4_CODE[14]) <= fabsf(1.0f - x[j])));
    }
    for (int i = 0; i < 15; i++) {
        float ti = t[i];
        for (int j = 0; j < NF4_BLOCK; j++)
            k[j] += x[j] > ti;
    }
    for (int j = 0; j < NF4_BLOCK / 2; j++)
        codes[j] = (uint8_t)(k[2 * j] << 4 | k[2 * j + 1]);
    return m;
}

/* The last block when shorter: zeros after the weights change neither the
 * absmax nor the codes kept; an odd count's last low nibble stays 0. */
static float quant_tail(const float *w, size_t len, uint8_t *codes, const float *t) {
    float v[NF4_BLOCK] = {0};
    uint8_t c[NF4_BLOCK / 2];
    memcpy(v, w, len * sizeof *v);
    float m = quant_block(v, c, t);
    memcpy(codes, c, (len + 1) / 2);
    if (len % 2) codes[len / 2] &= 0xf0;
    return m;
}

/* Blocks [b0, b1) of w[n]: codes into out, absmax values. x86-64: built for
 * AVX2 beside the baseline, chosen at load time (the same operations in
 * IEEE single precision either way: the same bytes). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
quant_blocks(const float *w, size_t n, size_t b0, size_t b1, uint8_t *out, float *absmax,
             const float *t) {
    for (size_t b = b0; b < b1; b++) {
        size_t j0 = b * NF4_BLOCK;
        absmax[b] = n - j0 >= NF4_BLOCK ? quant_block(w + j0, out + j0 / 2, t)
                                        : quant_tail(w + j0, n - j0, out + j0 / 2, t);
    }
}

/* A job over blocks [b0, b1) of one tensor: phase 1 codes and absmax,
 * phase 2 (scale groups [b0, b1)) the double quantization. */
struct qjob {
    const float *w;
    size_t n, b0, b1;
    uint8_t *out;
    float *absmax, offset;
    int phase;
};

static void *qjob_run(void *arg) {
    struct qjob *j = arg;
    size_t n = j->n, nb = nf4_nblocks(n);
    if (j->phase == 1) {
        quant_blocks(j->w, n, j->b0, j->b1, j->out, j->absmax, nf4_thresholds());
        return NULL;
    }
    const float *m8 = nf4_map8();
    uint8_t *q8 = j->out + nf4_off_q8(n);
    float *scale = (float *)(void *)(j->out + nf4_off_scale(n)), off = j->offset;
    for (size_t c = j->b0; c < j->b1; c++) { /* as nf4_quantize_serial */
        size_t b0 = c * NF4_BLOCK2, b1 = b0 + NF4_BLOCK2 < nb ? b0 + NF4_BLOCK2 : nb;
        float s = 0;
        for (size_t b = b0; b < b1; b++)
            s = fabsf(j->absmax[b] - off) > s ? fabsf(j->absmax[b] - off) : s;
        scale[c] = s;
        float inv = s > 0 ? 1.0f / s : 0.0f;
        for (size_t b = b0; b < b1; b++)
            q8[b] = (uint8_t)nearest(m8, 256, (j->absmax[b] - off) * inv);
    }
    return NULL;
}

/* Items [lo, hi) split evenly over nt jobs: qpar_start starts them (the
 * caller runs the first itself when `own`, else it is free meanwhile: the
 * upload of the previous step), qpar_join waits. A job whose thread could not
 * be started runs inline in qpar_join: the result never depends on how the
 * items were split. */
struct qpar {
    pthread_t th[NF4_MAX_THREADS];
    struct qjob job[NF4_MAX_THREADS];
    int started[NF4_MAX_THREADS], nj;
};

static void qpar_start(struct qpar *p, const struct qjob *tmpl, size_t lo, size_t hi, int nt,
                       int own) {
    size_t items = hi - lo;
    if ((size_t)nt > items) nt = items ? (int)items : 1;
    p->nj = nt;
    for (int k = 0; k < nt; k++) {
        p->job[k] = *tmpl;
        p->job[k].b0 = lo + items * (size_t)k / (size_t)nt;
        p->job[k].b1 = lo + items * (size_t)(k + 1) / (size_t)nt;
        p->started[k] = own && k == 0 ? 2 /* the caller's */ : 0;
        if (!p->started[k])
            p->started[k] = pthread_create(&p->th[k], NULL, qjob_run, &p->job[k]) == 0;
    }
    if (own) qjob_run(&p->job[0]);
}

static void qpar_join(struct qpar *p) {
    for (int k = 0; k < p->nj; k++) {
        if (p->started[k] == 1)
            pthread_join(p->th[k], NULL);
        else if (p->started[k] == 0)
            qjob_run(&p->job[k]);
    }
}

/* Blocks per pipeline step of nf4_quantize_pipe: 16M weights, 8 MiB of codes. */
#define NF4_PIPE_BLOCKS ((size_t)1 << 18)

void nf4_quantize_pipe(const float *w, size_t n, uint8_t *out, int threads,
                       void (*ready)(void *ctx, size_t off, size_t len), void *ctx) {
    if (threads <= 0) threads = nf4_threads();
    if (threads > NF4_MAX_THREADS) threads = NF4_MAX_THREADS;
    size_t nb = nf4_nblocks(n), nb2 = nf4_nblocks2(n);
    float *absmax = malloc((nb ? nb : 1) * sizeof *absmax);
    struct qpar *p = malloc(sizeof *p);
    if (!absmax || !p) {
        log_error("nf4: out of host memory for %zu block maxima", nb);
        abort();
    }
    (void)nf4_thresholds(); /* the tables, before any thread reads them */
    (void)nf4_map8();
    struct qjob tmpl = {.w = w, .n = n, .out = out, .absmax = absmax, .phase = 1};
    /* phase 1 in steps when someone takes the codes as they are done (the
     * upload of step s - 1 while step s is quantized), else in one */
    size_t step = ready ? NF4_PIPE_BLOCKS : (nb ? nb : 1), done = 0;
    for (size_t b = 0; b < nb; b += step) {
        size_t e = b + step < nb ? b + step : nb;
        qpar_start(p, &tmpl, b, e, threads, !ready);
        if (ready && done < b) ready(ctx, done * NF4_BLOCK / 2, (b - done) * NF4_BLOCK / 2);
        done = b;
        qpar_join(p);
    }
    /* the offset: one sum in block order, as the reference (n / 64 additions) */
    double sum = 0;
    for (size_t b = 0; b < nb; b++)
        sum += absmax[b];
    float offset = nb ? (float)(sum / (double)nb) : 0.0f;
    tmpl.phase = 2;
    tmpl.offset = offset;
    int t2 = nb2 < 16 ? 1 : threads; /* small tensors: not worth a thread */
    qpar_start(p, &tmpl, 0, nb2, t2, 1);
    size_t q8 = nf4_off_q8(n), sc = nf4_off_scale(n);
    memset(out + q8 + nb, 0, sc - q8 - nb); /* the padding */
    memcpy(out + nf4_off_offset(n), &offset, sizeof offset);
    memcpy(out + nf4_off_map(n), nf4_map8(), 256 * sizeof(float));
    qpar_join(p);
    if (ready) ready(ctx, done * NF4_BLOCK / 2, nf4_bytes(n) - done * NF4_BLOCK / 2);
    free(p);
    free(absmax);
}

void nf4_quantize_mt(const float *w, size_t n, uint8_t *out, int threads) {
    nf4_quantize_pipe(w, n, out, threads, NULL, NULL);
}

void nf4_quantize(const float *w, size_t n, uint8_t *out) {
    if (opts.fast)
        nf4_quantize_mt(w, n, out, 0);
    else
        nf4_quantize_serial(w, n, out);
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

/* ---- tensor-parallel shards ---- */

int nf4_tensor_quantized(const struct model_tensor *t) {
    return t->kind == MODEL_T_LINEAR_W && t->layer >= 0 && t->ndim == 2;
}

int nf4_shard_of(const struct model_tensor *t, int tp, int idx, struct nf4_shard *s) {
    return nf4_shard_geom((size_t)t->shape[0], (size_t)t->shape[1], (int)t->split, t->parts, tp,
                          idx, s);
}

void nf4_shard_extract(const struct nf4_shard *s, const uint8_t *whole, uint8_t *out) {
    size_t N = s->numel, n = s->count * s->len, L = s->len;
    const uint8_t *wq8 = whole + nf4_off_q8(N);
    const float *wsc = (const float *)(const void *)(whole + nf4_off_scale(N));
    const float *m8 = (const float *)(const void *)(whole + nf4_off_map(N));
    float offset;
    memcpy(&offset, whole + nf4_off_offset(N), sizeof offset);
    memset(out, 0, nf4_shard_bytes(s));
    /* runs start on a 64-weight boundary: their codes are whole bytes, and
     * every run but a last one at the tensor's end is whole blocks */
    for (size_t r = 0; r < s->count; r++) {
        size_t at = s->base + r * s->stride;
        memcpy(out + r * L / 2, whole + at / 2, (L + 1) / 2);
    }
    if (s->layout == NF4_SHARD_SLICE) {
        uint8_t *q8 = out + nf4_off_q8(n);
        float *sc = (float *)(void *)(out + nf4_off_scale(n));
        for (size_t r = 0; r < s->count; r++) {
            size_t at = s->base + r * s->stride;
            memcpy(q8 + r * L / NF4_BLOCK, wq8 + at / NF4_BLOCK, nf4_nblocks(L));
            memcpy(sc + r * L / (NF4_BLOCK * NF4_BLOCK2), wsc + at / (NF4_BLOCK * NF4_BLOCK2),
                   nf4_nblocks2(L) * sizeof *sc);
        }
        memcpy(out + nf4_off_offset(n), &offset, sizeof offset);
        memcpy(out + nf4_off_map(n), m8, 256 * sizeof *m8);
        return;
    }
    float *am = (float *)(void *)(out + nf4a_off_absmax(n));
    for (size_t r = 0; r < s->count; r++) {
        size_t b0 = (s->base + r * s->stride) / NF4_BLOCK, nb = nf4_nblocks(L);
        for (size_t b = 0; b < nb; b++) /* nf4_dequantize's absmax, the same rounding */
            am[r * L / NF4_BLOCK + b] = fmaf(m8[wq8[b0 + b]], wsc[(b0 + b) / NF4_BLOCK2], offset);
    }
}

void nf4_dequantize_absmax(const uint8_t *q, size_t n, float *w) {
    const float *am = (const float *)(const void *)(q + nf4a_off_absmax(n));
    size_t nb = nf4_nblocks(n);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (long b = 0; b < (long)nb; b++) {
        float a = am[b];
        size_t j0 = (size_t)b * NF4_BLOCK, j1 = j0 + NF4_BLOCK < n ? j0 + NF4_BLOCK : n;
        for (size_t j = j0; j < j1; j++) {
            int c = j % 2 ? q[j / 2] & 15 : q[j / 2] >> 4;
            w[j] = NF4_CODE[c] * a;
        }
    }
}

void nf4_dequantize_layout(int layout, const uint8_t *q, size_t n, float *w) {
    if (layout == NF4_SHARD_ABSMAX)
        nf4_dequantize_absmax(q, n, w);
    else
        nf4_dequantize(q, n, w);
}

int nf4_tp_check(const struct model_config *c, int tp, char *err, size_t errlen) {
    struct model_layout l;
    int rc = 0;
    if (tp <= 1) return 0;
    if (model_layout_init(&l, c, tp) != 0) return 0; /* the layout's own check refuses it */
    for (int i = 0; i < l.n && rc == 0; i++) {
        const struct model_tensor *t = &l.t[i];
        struct nf4_shard s;
        if (!nf4_tensor_quantized(t)) continue;
        for (int k = 0; k < tp && rc == 0; k++) {
            if (nf4_shard_of(t, tp, k, &s) != NF4_SHARD_NONE) continue;
            snprintf(err, errlen,
                     "train.quantize_base nf4 with tp=%d: %s [%lld, %lld] (%s-parallel) would "
                     "put a 64-weight NF4 block on two tp ranks (tp rank %d holds %zu runs of "
                     "%zu weights starting at %zu, every %zu; an NF4 shard needs multiples of "
                     "64); use a tp under which every shard is whole 64-weight blocks, or dp / pp "
                     "(parallel.tp=1)",
                     tp, t->name, (long long)t->shape[0], (long long)t->shape[1],
                     t->split == MODEL_SPLIT_ROW ? "row" : "column", k, s.count, s.len, s.base,
                     s.stride);
            rc = -1;
        }
    }
    model_layout_free(&l);
    return rc;
}

/* ---- engine storage ---- */

struct nf4_t {
    int tensor;
    size_t lo, n;   /* flat range (rank offsets) */
    void *dev;      /* bytes, backend memory */
    size_t bytes;   /* nf4_shard_bytes(&sh): nf4_bytes(n) for a SLICE */
    float *pending; /* host fp32 [n] (tp > 1: [sh.numel]) while pieces arrive, else NULL */
    size_t got;
    struct nf4_shard sh; /* tp = 1: the whole tensor, one run */
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
    /* host buffers of quantize_one (codes) and nf4_put (bf16 widened), kept
     * from tensor to tensor until `done` reaches nt */
    void *hq;
    void *hw;
    size_t hq_bytes, hw_bytes;
    int done;
    double put_ms; /* time in nf4_put (widen, quantize, upload) */
};

int nf4_is_quantized(const struct engine *e, int i) {
    return nf4_tensor_quantized(&e->layout.t[i]);
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
    free(q->hq);
    free(q->hw);
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
     * pp: a stage its own tensors, whole; tp: each rank quantizes the whole
     * tensors and keeps its shard's part of them (nf4_put_full,
     * nf4_shard_extract), so the weights are the one-process run's */
    if (!e->frozen || e->p_hi > e->p_lo) {
        snprintf(err, errlen,
                 "train.quantize_base nf4 needs a frozen base (frozen=%d, resident params %zu)",
                 e->frozen, e->p_hi - e->p_lo);
        return -1;
    }
    if (nf4_tp_check(&e->cfg, e->tp, err, errlen) != 0) return -1;
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
        struct nf4_t *qt = &q->t[q->nt++];
        *qt = (struct nf4_t){.tensor = i, .lo = (size_t)t->rank_offset, .n = (size_t)t->rank_numel};
        nf4_shard_of(t, e->tp, e->tp_idx, &qt->sh); /* nf4_tp_check: never NONE */
        qt->bytes = nf4_shard_bytes(&qt->sh);
        if (qt->sh.layout == NF4_SHARD_ABSMAX && !b->nf4_dequant_absmax) {
            snprintf(err, errlen,
                     "train.quantize_base nf4 with tp=%d: the %s backend cannot dequantize the "
                     "shard of %s",
                     e->tp, b->name, t->name);
            free(q->t), free(q->of), free(q);
            return -1;
        }
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
        size_t nb = q->t[k].bytes;
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

/* Quantize t's fp32 values v and upload them: with nf4-overlap the codes go
 * up in steps while the next step is quantized (nf4_quantize_pipe). The host
 * buffer is kept for the next tensor until every tensor is done. */
struct upload {
    struct backend *b;
    void *dev;
    const uint8_t *h;
};

static void upload_ready(void *ctx, size_t off, size_t len) {
    struct upload *u = ctx; /* the buffer is raw bytes: offsets are bytes */
    u->b->upload(u->b->ctx, (char *)u->dev + off, u->h + off, len);
}

static void *host_buf(void **p, size_t *have, size_t want) {
    if (*have >= want) return *p;
    free(*p);
    *p = malloc(want);
    *have = *p ? want : 0;
    return *p;
}

static void host_bufs_done(struct nf4 *q) {
    if (++q->done < q->nt) return;
    q->done = 0;
    free(q->hq), free(q->hw);
    q->hq = q->hw = NULL;
    q->hq_bytes = q->hw_bytes = 0;
}

/* tp > 1: the whole tensor's v[sh.numel] quantized as one process does,
 * this rank's part of it uploaded. */
static int quantize_shard(struct nf4 *q, struct nf4_t *t, const float *v) {
    struct backend *b = q->e->be;
    size_t nw = nf4_bytes(t->sh.numel);
    uint8_t *h = host_buf(&q->hq, &q->hq_bytes, nw + t->bytes);
    if (!h) return -1;
    nf4_quantize(v, t->sh.numel, h);
    nf4_shard_extract(&t->sh, h, h + nw);
    b->upload(b->ctx, t->dev, h + nw, t->bytes);
    b->sync(b->ctx);
    return 0;
}

static int quantize_one(struct nf4 *q, struct nf4_t *t, const float *v) {
    struct backend *b = q->e->be;
    if (q->e->tp > 1) return quantize_shard(q, t, v);
    size_t nb = nf4_bytes(t->n);
    uint8_t *h = host_buf(&q->hq, &q->hq_bytes, nb);
    if (!h) return -1;
    if (opts.fast && opts.overlap) {
        struct upload u = {.b = b, .dev = t->dev, .h = h};
        nf4_quantize_pipe(v, t->n, h, 0, upload_ready, &u);
    } else {
        nf4_quantize(v, t->n, h);
        b->upload(b->ctx, t->dev, h, nb);
    }
    b->sync(b->ctx);
    return 0;
}

/* bf16 (or fp32) src[n] as fp32 into dst, over the quantizer's threads. */
struct widen_job {
    float *dst;
    const void *src;
    size_t lo, hi, elt;
};

static void *widen_run(void *arg) {
    const struct widen_job *j = arg;
    if (j->elt == sizeof(float)) {
        memcpy(j->dst + j->lo, (const float *)j->src + j->lo, (j->hi - j->lo) * sizeof(float));
        return NULL;
    }
    const uint16_t *s = j->src; /* bf16 */
    for (size_t i = j->lo; i < j->hi; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(j->dst + i, &u, sizeof u);
    }
    return NULL;
}

static void widen(float *dst, const void *src, size_t n, size_t elt) {
    int nt = opts.fast && n >= ((size_t)1 << 22) ? nf4_threads() : 1;
    pthread_t th[NF4_MAX_THREADS];
    struct widen_job job[NF4_MAX_THREADS];
    int started[NF4_MAX_THREADS];
    for (int k = 0; k < nt; k++) {
        job[k] = (struct widen_job){.dst = dst, .src = src, .elt = elt};
        job[k].lo = n * (size_t)k / (size_t)nt;
        job[k].hi = n * (size_t)(k + 1) / (size_t)nt;
        started[k] = k > 0 && pthread_create(&th[k], NULL, widen_run, &job[k]) == 0;
    }
    widen_run(&job[0]);
    for (int k = 1; k < nt; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        else
            widen_run(&job[k]);
    }
}

static int put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt);

int nf4_put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt) {
    double t0 = clock_mono_msf();
    int rc = put(q, off, src, n, elt);
    q->put_ms += clock_mono_msf() - t0;
    return rc;
}

static int put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt) {
    size_t covered = 0;
    const unsigned char *s = src;
    for (int k = 0; k < q->nt; k++) {
        struct nf4_t *t = &q->t[k];
        size_t a = off > t->lo ? off : t->lo, z = off + n < t->lo + t->n ? off + n : t->lo + t->n;
        if (z <= a) continue;
        if (q->e->tp > 1) { /* a share cannot be quantized as the whole tensor is */
            log_error("nf4: %s got its tp share only; with tp=%d an NF4 tensor is loaded whole "
                      "(nf4_put_full)",
                      q->e->layout.t[t->tensor].name, q->e->tp);
            return -1;
        }
        covered += z - a;
        q->loaded = -1;
        if (a == t->lo && z == t->lo + t->n && !t->pending) { /* the whole tensor */
            float *v = NULL;
            if (elt != sizeof(float)) {
                v = host_buf(&q->hw, &q->hw_bytes, t->n * sizeof *v);
                if (!v) return -1;
                widen(v, s + (a - off) * elt, t->n, elt);
            }
            int rc = quantize_one(q, t, v ? v : (const float *)(const void *)(s + (a - off) * elt));
            if (rc != 0) return -1;
            host_bufs_done(q);
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
            host_bufs_done(q);
        }
    }
    return covered == n ? 1 : 0;
}

int nf4_full_tensor(const struct nf4 *q, int tensor) {
    return q && q->e->tp > 1 && q->of[tensor] >= 0;
}

int nf4_put_full(struct nf4 *q, int tensor, size_t off, const void *src, size_t n, size_t elt) {
    double t0 = clock_mono_msf();
    int rc = -1;
    if (!nf4_full_tensor(q, tensor)) goto out;
    struct nf4_t *t = &q->t[q->of[tensor]];
    size_t N = t->sh.numel;
    if (off > N || n > N - off) goto out;
    q->loaded = -1;
    if (off == 0 && n == N && !t->pending) { /* the whole tensor at once */
        const float *v = src;
        if (elt != sizeof(float)) {
            float *w = host_buf(&q->hw, &q->hw_bytes, N * sizeof *w);
            if (!w) goto out;
            widen(w, src, N, elt);
            v = w;
        }
        if (quantize_one(q, t, v) != 0) goto out;
        host_bufs_done(q);
        rc = 0;
        goto out;
    }
    if (!t->pending && !(t->pending = calloc(N, sizeof(float)))) goto out;
    widen(t->pending + off, src, n, elt);
    t->got += n;
    rc = 0;
    if (t->got >= N) {
        rc = quantize_one(q, t, t->pending);
        free(t->pending);
        t->pending = NULL;
        t->got = 0;
        if (rc == 0) host_bufs_done(q);
    }
out:
    q->put_ms += clock_mono_msf() - t0;
    return rc;
}

void nf4_layer(struct nf4 *q, int layer) {
    if (!q || q->loaded == layer) return;
    struct engine *e = q->e;
    struct backend *b = e->be;
    for (int k = 0; k < q->nt; k++) {
        const struct nf4_t *t = &q->t[k];
        if (e->layout.t[t->tensor].layer != layer) continue;
        if (t->sh.layout == NF4_SHARD_ABSMAX)
            b->nf4_dequant_absmax(b->ctx, e->pview[t->tensor], t->dev, t->n);
        else
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
    uint8_t *h = malloc(t->bytes);
    if (!h) return -1;
    b->download(b->ctx, h, t->dev, t->bytes);
    nf4_dequantize_layout(t->sh.layout, h, t->n, dst);
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

double nf4_put_seconds(const struct nf4 *q) {
    return q->put_ms / 1e3;
}
