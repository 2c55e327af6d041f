/* GPU test: every CUDA backend operation against the cpu fp32 reference
 * backend on fresh random inputs of several shapes.
 *
 * Inputs are drawn at random (seed printed; LOOM_TEST_SEED repeats a run),
 * rounded to bf16, and given to both backends, so differences come from the
 * CUDA side's bf16 outputs and its summation order only. Forward outputs on
 * the GPU are poisoned with NaN first, so an unwritten element fails.
 * Gradient outputs accumulate (backend.h), so they start from random values
 * and the test compares the increments (an unwritten element shows as a
 * relative error near 1). Metric: ||gpu - cpu|| / ||cpu|| over the tensor;
 * each bound is stated next to its check. Exits 77 when no GPU is found. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dev/cuda/dev_kernels.h"
#include "worker/backend.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/kernels.h"
#include "worker/tuning.h"

/* Relative-error bounds (bf16 storage has 2^-8 relative precision). */
#define TOL_ELEM  6e-3 /* one bf16 rounding of an fp32 result */
#define TOL_MM    8e-3 /* matmul / norm: one rounding + fp32 order */
#define TOL_ATTN  2e-2 /* attention forward: P rounded to bf16 before P.V */
#define TOL_ATTNB 3e-2 /* attention backward: several bf16 roundings chained */
#define TOL_CLS   2e-2 /* classifier gradients: bf16 logits and dlogits */
#define TOL_F32   1e-5 /* fp32 outputs computed from identical inputs */

static uint64_t rng_state;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float nrand(void) {
    return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()));
}

static struct backend *cpu, *gpu;
static int failures, checks;

/* A tensor held by both backends: h = host fp32 truth (bf16-rounded when
 * the GPU stores bf16), c = cpu copy (fp32), g = gpu copy (bf16 or fp32). */
struct tens {
    size_t n;
    int f32; /* gpu storage fp32 (stats, losses, master, moments) */
    float *h, *init;
    void *c, *g;
};

static void t_alloc(struct tens *t, size_t n, int f32) {
    memset(t, 0, sizeof *t);
    t->n = n;
    t->f32 = f32;
    t->h = calloc(n, sizeof(float));
    t->init = calloc(n, sizeof(float));
    t->c = cpu->alloc(cpu->ctx, n * sizeof(float));
    t->g = gpu->alloc(gpu->ctx, n * (f32 ? 4 : 2));
}

static void t_upload(struct tens *t) {
    memcpy(t->c, t->h, t->n * sizeof(float));
    if (t->f32) {
        gpu->upload(gpu->ctx, t->g, t->h, t->n * 4);
    } else {
        uint16_t *b = malloc(t->n * 2);
        for (size_t i = 0; i < t->n; i++)
            b[i] = lcuda_f2bf(t->h[i]);
        gpu->upload(gpu->ctx, t->g, b, t->n * 2);
        free(b);
    }
    memcpy(t->init, t->h, t->n * sizeof(float));
}

/* Random normal * scale (+ offset), rounded to the GPU's storage. */
static void t_rand(struct tens *t, size_t n, int f32, float scale, float offset) {
    t_alloc(t, n, f32);
    for (size_t i = 0; i < n; i++) {
        float v = nrand() * scale + offset;
        t->h[i] = f32 ? v : lcuda_bf2f(lcuda_f2bf(v));
    }
    t_upload(t);
}

/* An output: poisoned with NaN on the GPU (and the CPU). */
static void t_out(struct tens *t, size_t n, int f32) {
    t_alloc(t, n, f32);
    for (size_t i = 0; i < n; i++)
        t->h[i] = NAN;
    t_upload(t);
    memset(t->init, 0, n * sizeof(float));
}

static void t_free(struct tens *t) {
    cpu->free(cpu->ctx, t->c);
    gpu->free(gpu->ctx, t->g);
    free(t->h);
    free(t->init);
}

/* Compare; delta=1 compares increments over t->init (accumulating outputs). */
static void t_check(struct tens *t, const char *what, const char *shape, double tol, int delta) {
    float *gv = malloc(t->n * sizeof(float));
    if (t->f32) {
        gpu->download(gpu->ctx, gv, t->g, t->n * 4);
    } else {
        uint16_t *b = malloc(t->n * 2);
        gpu->download(gpu->ctx, b, t->g, t->n * 2);
        for (size_t i = 0; i < t->n; i++)
            gv[i] = lcuda_bf2f(b[i]);
        free(b);
    }
    const float *cv = t->c;
    double num = 0, den = 0;
    size_t bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        double base = delta ? t->init[i] : 0;
        double a = gv[i] - base, r = cv[i] - base;
        if (!isfinite(gv[i])) bad++;
        num += (a - r) * (a - r);
        den += r * r;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = bad == 0 && rel <= tol;
    checks++;
    if (!ok) failures++;
    printf("%-4s %-22s %-26s rel=%.2e bound=%.0e%s\n", ok ? "ok" : "FAIL", what, shape, rel, tol,
           bad ? " (non-finite values)" : "");
    free(gv);
}

static void reserve_both(int B, int T, int C, int NH, int NKV, int HD, int F, int Vp) {
    struct backend_limits lim = {B, T, C, NH, NKV, HD, F, Vp, 0, 0};
    if (cpu->reserve(cpu->ctx, &lim) || gpu->reserve(gpu->ctx, &lim)) {
        fprintf(stderr, "reserve failed\n");
        exit(1);
    }
}

/* ---- cases ---- */

static void test_matmul(int N, int IC, int OC, int bias) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d IC%d OC%d%s", N, IC, OC, bias ? " +b" : "");
    struct tens x, w, b, y, dy, dx, dw, db;
    t_rand(&x, (size_t)N * IC, 0, 1, 0);
    t_rand(&w, (size_t)OC * IC, 0, 0.1f, 0);
    t_rand(&b, OC, 0, 0.5f, 0);
    t_out(&y, (size_t)N * OC, 0);
    cpu->matmul_fwd(cpu->ctx, y.c, x.c, w.c, bias ? b.c : NULL, N, IC, OC);
    gpu->matmul_fwd(gpu->ctx, y.g, x.g, w.g, bias ? b.g : NULL, N, IC, OC);
    t_check(&y, "matmul_fwd", shape, TOL_MM, 0);
    if (OC % 8 == 0) { /* matmul_fwd then gelu_fwd of its output: fused on the GPU */
        struct tens ya;
        t_out(&ya, y.n, 0);
        for (size_t i = 0; i < y.n; i++)
            y.h[i] = NAN;
        t_upload(&y);
        memset(y.init, 0, y.n * 4);
        cpu->matmul_fwd(cpu->ctx, y.c, x.c, w.c, bias ? b.c : NULL, N, IC, OC);
        cpu->gelu_fwd(cpu->ctx, ya.c, y.c, y.n);
        gpu->matmul_fwd(gpu->ctx, y.g, x.g, w.g, bias ? b.g : NULL, N, IC, OC);
        gpu->gelu_fwd(gpu->ctx, ya.g, y.g, y.n);
        t_check(&y, "matmul_fwd (+gelu) out", shape, TOL_MM, 0);
        t_check(&ya, "matmul_fwd + gelu_fwd", shape, TOL_MM, 0);
        t_free(&ya);
    }
    t_rand(&dy, (size_t)N * OC, 0, 1, 0);
    t_rand(&dx, (size_t)N * IC, 0, 1, 0);
    t_rand(&dw, (size_t)OC * IC, 0, 4, 0);
    t_rand(&db, OC, 0, 4, 0);
    cpu->matmul_bwd(cpu->ctx, dx.c, dw.c, bias ? db.c : NULL, dy.c, x.c, w.c, N, IC, OC);
    gpu->matmul_bwd(gpu->ctx, dx.g, dw.g, bias ? db.g : NULL, dy.g, x.g, w.g, N, IC, OC);
    t_check(&dx, "matmul_bwd dinp", shape, TOL_MM, 1);
    t_check(&dw, "matmul_bwd dW", shape, TOL_MM, 1);
    if (bias) t_check(&db, "matmul_bwd dbias", shape, TOL_MM, 1);
    /* zero() then accumulate: the CUDA backend overwrites instead (deferred zero) */
    cpu->zero(cpu->ctx, dx.c, dx.n * 4);
    gpu->zero(gpu->ctx, dx.g, dx.n * 2);
    cpu->matmul_bwd(cpu->ctx, dx.c, NULL, NULL, dy.c, x.c, w.c, N, IC, OC);
    gpu->matmul_bwd(gpu->ctx, dx.g, NULL, NULL, dy.g, x.g, w.g, N, IC, OC);
    memset(dx.init, 0, dx.n * 4);
    t_check(&dx, "zero + matmul_bwd dinp", shape, TOL_MM, 0);
    if (IC % 8 == 0) {
        /* matmul_bwd into a zeroed scratch, then gelu_bwd of it into another
         * zeroed buffer (the MLP's backward): on the GPU one GEMM with the
         * DGELU epilogue, the scratch left unwritten; then the same with an
         * accumulating gelu_bwd (not fused: both kernels run) */
        struct tens pre, dz;
        t_rand(&pre, dx.n, 0, 1.5f, 0);
        t_rand(&dz, dx.n, 0, 1, 0);
        for (int acc = 0; acc < 2; acc++) {
            cpu->zero(cpu->ctx, dx.c, dx.n * 4);
            gpu->zero(gpu->ctx, dx.g, dx.n * 2);
            cpu->matmul_bwd(cpu->ctx, dx.c, NULL, NULL, dy.c, x.c, w.c, N, IC, OC);
            gpu->matmul_bwd(gpu->ctx, dx.g, NULL, NULL, dy.g, x.g, w.g, N, IC, OC);
            if (!acc) {
                cpu->zero(cpu->ctx, dz.c, dz.n * 4);
                gpu->zero(gpu->ctx, dz.g, dz.n * 2);
                memset(dz.init, 0, dz.n * 4);
            }
            cpu->gelu_bwd(cpu->ctx, dz.c, pre.c, dx.c, dz.n);
            gpu->gelu_bwd(gpu->ctx, dz.g, pre.g, dx.g, dz.n);
            t_check(&dz, acc ? "matmul_bwd + gelu_bwd +=" : "matmul_bwd + gelu_bwd", shape, TOL_MM,
                    0);
            if (acc) t_check(&dx, "matmul_bwd before +=gelu", shape, TOL_MM, 0);
        }
        t_free(&pre), t_free(&dz);
    }
    t_free(&x), t_free(&w), t_free(&b), t_free(&y), t_free(&dy), t_free(&dx), t_free(&dw);
    t_free(&db);
}

static uint16_t *t_bits(const struct tens *t);

/* The norm generation that ships (k_norm.cu); the others are in dev/cuda. */
#define NORM_SHIPS 1

/* The norm calls of test_norm: the shipping generation through the backend,
 * the others from dev/cuda, called the way the backend calls lk_norm_*
 * (after a sync, so that no held work is pending). */
static void norm_fwd_call(int var, int rms, void *y, float *mean, float *rstd, const void *x,
                          const void *w, const void *b, int N, int C) {
    if (var == NORM_SHIPS && rms) {
        gpu->rmsnorm_fwd(gpu->ctx, y, rstd, x, w, N, C, 1e-5f);
    } else if (var == NORM_SHIPS) {
        gpu->layernorm_fwd(gpu->ctx, y, mean, rstd, x, w, b, N, C, 1e-5f);
    } else {
        gpu->sync(gpu->ctx);
        dev_norm_fwd(var, y, rms ? NULL : mean, rstd, x, w, rms ? NULL : b, N, C, 1e-5f, rms,
                     (lcuda_stream)backend_cuda_stream(gpu));
    }
}

static void norm_bwd_call(int var, int rms, void *dx, void *dw, void *db, const void *dy,
                          const void *x, const void *w, const float *mean, const float *rstd, int N,
                          int C) {
    if (var == NORM_SHIPS && rms) {
        gpu->rmsnorm_bwd(gpu->ctx, dx, dw, dy, x, w, rstd, N, C);
    } else if (var == NORM_SHIPS) {
        gpu->layernorm_bwd(gpu->ctx, dx, dw, db, dy, x, w, mean, rstd, N, C);
    } else {
        gpu->sync(gpu->ctx);
        float *scratch = gpu->alloc(gpu->ctx, dev_norm_scratch_bytes(N, C));
        dev_norm_bwd(var, dx, dw, rms ? NULL : db, scratch, dy, x, w, rms ? NULL : mean, rstd, N, C,
                     rms, (lcuda_stream)backend_cuda_stream(gpu));
        gpu->sync(gpu->ctx);
        gpu->free(gpu->ctx, scratch);
    }
}

/* Norm forward and backward against the cpu, with the norm kernels'
 * generation `var` (NORM_SHIPS: the backend's; else dev/cuda's); the
 * backward is run a second time from the same gradients and must repeat bit
 * for bit. The workspace is reserved for the shape (the norm scratch depends
 * on N, C). */
static void test_norm(int N, int C, int rms, int var) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d C%d v%d", N, C, var);
    const char *nm = rms ? "rmsnorm" : "layernorm";
    char what[40];
    reserve_both(1, N, C, 1, 1, 64, C, 64);
    struct tens x, w, b, y, mean, rstd, dy, dx, dw, db;
    t_rand(&x, (size_t)N * C, 0, 2, 0.5f);
    t_rand(&w, C, 0, 0.3f, 1);
    t_rand(&b, C, 0, 0.3f, 0);
    t_out(&y, (size_t)N * C, 0);
    t_out(&mean, N, 1);
    t_out(&rstd, N, 1);
    if (rms)
        cpu->rmsnorm_fwd(cpu->ctx, y.c, rstd.c, x.c, w.c, N, C, 1e-5f);
    else
        cpu->layernorm_fwd(cpu->ctx, y.c, mean.c, rstd.c, x.c, w.c, b.c, N, C, 1e-5f);
    norm_fwd_call(var, rms, y.g, mean.g, rstd.g, x.g, w.g, b.g, N, C);
    snprintf(what, sizeof what, "%s_fwd", nm);
    t_check(&y, what, shape, TOL_MM, 0);
    snprintf(what, sizeof what, "%s rstd", nm);
    t_check(&rstd, what, shape, 1e-4, 0);
    if (!rms) t_check(&mean, "layernorm mean", shape, 1e-4, 0);
    t_rand(&dy, (size_t)N * C, 0, 1, 0);
    t_rand(&dx, (size_t)N * C, 0, 1, 0);
    t_rand(&dw, C, 0, 8, 0);
    t_rand(&db, C, 0, 8, 0);
    struct tens *grads[3] = {&dx, &dw, &db};
    uint16_t *first[3] = {NULL, NULL, NULL};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0 && rms)
            cpu->rmsnorm_bwd(cpu->ctx, dx.c, dw.c, dy.c, x.c, w.c, rstd.c, N, C);
        else if (pass == 0)
            cpu->layernorm_bwd(cpu->ctx, dx.c, dw.c, db.c, dy.c, x.c, w.c, mean.c, rstd.c, N, C);
        norm_bwd_call(var, rms, dx.g, dw.g, db.g, dy.g, x.g, w.g, mean.g, rstd.g, N, C);
        if (pass == 0) {
            snprintf(what, sizeof what, "%s_bwd dinp", nm);
            t_check(&dx, what, shape, TOL_MM, 1);
            snprintf(what, sizeof what, "%s_bwd dw", nm);
            t_check(&dw, what, shape, TOL_MM, 1);
            if (!rms) t_check(&db, "layernorm_bwd db", shape, TOL_MM, 1);
        }
        int same = 1;
        for (int i = 0; i < 3; i++) {
            uint16_t *bb = t_bits(grads[i]);
            if (pass == 0) {
                first[i] = bb;
                /* back to the initial gradients for the repeat */
                memcpy(grads[i]->h, grads[i]->init, grads[i]->n * sizeof(float));
                t_upload(grads[i]);
            } else {
                same &= memcmp(first[i], bb, grads[i]->n * 2) == 0;
                free(first[i]);
                free(bb);
            }
        }
        if (pass == 1) {
            snprintf(what, sizeof what, "%s_bwd repeats", nm);
            checks++, failures += !same;
            printf("%-4s %-22s %-26s\n", same ? "ok" : "FAIL", what, shape);
        }
    }
    t_free(&x), t_free(&w), t_free(&b), t_free(&y), t_free(&mean), t_free(&rstd), t_free(&dy);
    t_free(&dx), t_free(&dw), t_free(&db);
}

/* Device copy of n random bf16 values (normal * scale + offset); the host
 * bits are kept in *keep when not NULL (caller frees). */
static void *norm_dev(size_t n, float scale, float offset, uint16_t **keep) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = lcuda_f2bf(nrand() * scale + offset);
    void *d = gpu->alloc(gpu->ctx, n * 2);
    gpu->upload(gpu->ctx, d, h, n * 2);
    if (keep)
        *keep = h;
    else
        free(h);
    return d;
}

static uint16_t *norm_bits(const void *d, size_t n) {
    uint16_t *h = malloc(n * 2);
    gpu->download(gpu->ctx, h, d, n * 2);
    return h;
}

/* ||(a - base) - (r - base)|| / ||r - base|| over bf16 bits (base NULL:
 * zeros), the increments' relative difference. */
static double norm_rel(const uint16_t *a, const uint16_t *r, const uint16_t *base, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double z = base ? lcuda_bf2f(base[i]) : 0;
        double x = lcuda_bf2f(a[i]) - z, y = lcuda_bf2f(r[i]) - z;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void norm_verdict(int ok, const char *what, const char *shape, double rel) {
    checks++, failures += !ok;
    if (rel >= 0)
        printf("%-4s %-22s %-26s rel=%.2e\n", ok ? "ok" : "FAIL", what, shape, rel);
    else
        printf("%-4s %-22s %-26s\n", ok ? "ok" : "FAIL", what, shape);
}

/* dev_norm_* (dev/cuda) called directly, every generation on the same
 * inputs, and the shipping lk_norm_* beside generation NORM_SHIPS: the same
 * bits for res, out and every gradient. Residual
 * forward: res bit for bit and out, rstd (and mean) within bounds of
 * variant 0's. Backward (from variant 0's forward results): dx, dw, db
 * within TOL_MM of variant 0's increments; the full call repeats bit for
 * bit; a call without dx gives the same dw, db bits and one without dw, db
 * the same dx within TOL_MM (it may take other kernels). Variant 4 (variant
 * 0 with wider loads) must give variant 0's bits for out, dx, dw and db. */
static void test_norm_paths(int N, int C, int rms) {
    lcuda_stream st = (lcuda_stream)backend_cuda_stream(gpu);
    size_t n = (size_t)N * C;
    float eps = 1e-5f;
    uint16_t *h_dx, *h_dw, *h_db;
    void *a = norm_dev(n, 1.5f, 0.3f, NULL), *a2 = norm_dev(n, 1.f, 0.f, NULL);
    void *w = norm_dev(C, 0.3f, 1.f, NULL), *b = rms ? NULL : norm_dev(C, 0.3f, 0.f, NULL);
    void *dy = norm_dev(n, 1.f, 0.f, NULL), *dx = norm_dev(n, 1.f, 0.f, &h_dx);
    void *dw = norm_dev(C, 8.f, 0.f, &h_dw), *db = norm_dev(C, 8.f, 0.f, &h_db);
    void *res = gpu->alloc(gpu->ctx, n * 2), *out = gpu->alloc(gpu->ctx, n * 2);
    void *res0 = gpu->alloc(gpu->ctx, n * 2);
    float *mean = gpu->alloc(gpu->ctx, N * 4), *rstd = gpu->alloc(gpu->ctx, N * 4);
    float *mean0 = gpu->alloc(gpu->ctx, N * 4), *rstd0 = gpu->alloc(gpu->ctx, N * 4);
    size_t sb = dev_norm_scratch_bytes(N, C);
    if (lk_norm_scratch_bytes(N, C) > sb) sb = lk_norm_scratch_bytes(N, C);
    float *scratch = gpu->alloc(gpu->ctx, sb);
    float *hm = malloc(N * 4), *hr = malloc(N * 4), *hm0 = malloc(N * 4), *hr0 = malloc(N * 4);
    uint16_t *ref_res = NULL, *ref_out = NULL, *ref[3] = {NULL, NULL, NULL};
    void *gd[3] = {dx, dw, db};
    uint16_t *gh[3] = {h_dx, h_dw, h_db};
    size_t gn[3] = {n, (size_t)C, (size_t)C};
    int ng = rms ? 2 : 3;
    for (int var = 0; var < 5; var++) {
        char shape[64], what[40];
        snprintf(shape, sizeof shape, "N%d C%d v%d", N, C, var);
        const char *nm = rms ? "rms" : "ln";
        dev_residual_norm_fwd(var, res, out, rms ? NULL : mean, rstd, a, a2, w, b, N, C, eps, rms,
                              st);
        uint16_t *r = norm_bits(res, n), *o = norm_bits(out, n);
        if (var == NORM_SHIPS) { /* the product carries this generation */
            lk_residual_norm_fwd(res, out, rms ? NULL : mean, rstd, a, a2, w, b, N, C, eps, rms,
                                 st);
            uint16_t *r1 = norm_bits(res, n), *o1 = norm_bits(out, n);
            snprintf(what, sizeof what, "%s res+norm ships", nm);
            norm_verdict(!memcmp(r1, r, n * 2) && !memcmp(o1, o, n * 2), what, shape, -1);
            free(r1), free(o1);
        }
        gpu->download(gpu->ctx, hr, rstd, N * 4);
        if (!rms) gpu->download(gpu->ctx, hm, mean, N * 4);
        if (var == 0) {
            ref_res = r, ref_out = o;
            gpu->download(gpu->ctx, hr0, rstd, N * 4);
            if (!rms) gpu->download(gpu->ctx, hm0, mean, N * 4);
            gpu->upload(gpu->ctx, res0, r, n * 2);
            gpu->upload(gpu->ctx, rstd0, hr0, N * 4);
            if (!rms) gpu->upload(gpu->ctx, mean0, hm0, N * 4);
        } else {
            double dstat = 0;
            for (int i = 0; i < N; i++) {
                double e = fabs(hr[i] - hr0[i]) / fabs(hr0[i]);
                if (!rms) e += fabs(hm[i] - hm0[i]) / (fabs(hm0[i]) + 1e-3);
                if (e > dstat) dstat = e;
            }
            snprintf(what, sizeof what, "%s res+norm res", nm);
            norm_verdict(memcmp(r, ref_res, n * 2) == 0, what, shape, -1);
            double ro = norm_rel(o, ref_out, NULL, n);
            snprintf(what, sizeof what, "%s res+norm out", nm);
            /* variant 4 is variant 0 with wider loads: the same bits */
            norm_verdict(var == 4 ? memcmp(o, ref_out, n * 2) == 0 : ro <= TOL_MM, what, shape, ro);
            snprintf(what, sizeof what, "%s res+norm stats", nm);
            norm_verdict(dstat <= 1e-5, what, shape, dstat);
            free(r), free(o);
        }
        /* backward: full call, repeat, dw/db only, dx only */
        uint16_t *full[3] = {NULL, NULL, NULL};
        int repeat = 1, wonly = 1;
        double dxonly = 0;
        for (int call = 0; call < 4; call++) {
            for (int i = 0; i < ng; i++)
                gpu->upload(gpu->ctx, gd[i], gh[i], gn[i] * 2);
            void *cdx = call == 2 ? NULL : dx;
            void *cdw = call == 3 ? NULL : dw, *cdb = call == 3 || rms ? NULL : db;
            dev_norm_bwd(var, cdx, cdw, cdb, scratch, dy, res0, w, rms ? NULL : mean0, rstd0, N, C,
                         rms, st);
            for (int i = 0; i < ng; i++) {
                if ((call == 2 && i == 0) || (call == 3 && i > 0)) continue;
                uint16_t *g = norm_bits(gd[i], gn[i]);
                if (call == 0) {
                    full[i] = g;
                    continue;
                }
                if (call == 1)
                    repeat &= memcmp(g, full[i], gn[i] * 2) == 0;
                else if (call == 2)
                    wonly &= memcmp(g, full[i], gn[i] * 2) == 0;
                else
                    dxonly = norm_rel(g, full[i], gh[i], gn[i]);
                free(g);
            }
        }
        snprintf(what, sizeof what, "%s_bwd repeats", nm);
        norm_verdict(repeat, what, shape, -1);
        if (var == NORM_SHIPS) { /* lk_norm_bwd: the same bits as dev generation 1 */
            for (int i = 0; i < ng; i++)
                gpu->upload(gpu->ctx, gd[i], gh[i], gn[i] * 2);
            lk_norm_bwd(dx, dw, rms ? NULL : db, scratch, dy, res0, w, rms ? NULL : mean0, rstd0, N,
                        C, rms, st);
            int ships = 1;
            for (int i = 0; i < ng; i++) {
                uint16_t *g = norm_bits(gd[i], gn[i]);
                ships &= memcmp(g, full[i], gn[i] * 2) == 0;
                free(g);
            }
            snprintf(what, sizeof what, "%s_bwd ships", nm);
            norm_verdict(ships, what, shape, -1);
        }
        snprintf(what, sizeof what, "%s_bwd no dx: dw bits", nm);
        norm_verdict(wonly, what, shape, -1);
        snprintf(what, sizeof what, "%s_bwd dx only", nm);
        norm_verdict(dxonly <= TOL_MM, what, shape, dxonly);
        static const char *gname[3] = {"dx", "dw", "db"};
        for (int i = 0; i < ng; i++) {
            if (var == 0) {
                ref[i] = full[i];
                continue;
            }
            double rd = norm_rel(full[i], ref[i], gh[i], gn[i]);
            snprintf(what, sizeof what, "%s_bwd %s vs v0", nm, gname[i]);
            int ok = var == 4 ? memcmp(full[i], ref[i], gn[i] * 2) == 0 : rd <= TOL_MM;
            norm_verdict(ok, what, shape, rd);
            free(full[i]);
        }
    }
    for (int i = 0; i < 3; i++)
        free(ref[i]);
    free(ref_res), free(ref_out), free(hm), free(hr), free(hm0), free(hr0);
    free(h_dx), free(h_dw), free(h_db);
    void *bufs[] = {a, a2, w, b, dy, dx, dw, db, res, out, res0, mean, rstd, mean0, rstd0, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) gpu->free(gpu->ctx, bufs[i]);
}

static void test_act(int N, int F) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d F%d", N, F);
    size_t n = (size_t)N * F;
    struct tens x, y, dy, dx, x2, y2, dx2;
    t_rand(&x, n, 0, 2, 0);
    t_out(&y, n, 0);
    cpu->gelu_fwd(cpu->ctx, y.c, x.c, n);
    gpu->gelu_fwd(gpu->ctx, y.g, x.g, n);
    t_check(&y, "gelu_fwd", shape, TOL_ELEM, 0);
    t_rand(&dy, n, 0, 1, 0);
    t_rand(&dx, n, 0, 1, 0);
    cpu->gelu_bwd(cpu->ctx, dx.c, x.c, dy.c, n);
    gpu->gelu_bwd(gpu->ctx, dx.g, x.g, dy.g, n);
    t_check(&dx, "gelu_bwd", shape, TOL_ELEM, 1);
    struct tens dz;
    t_rand(&dz, n, 0, 1, 0);
    cpu->zero(cpu->ctx, dz.c, n * 4);
    gpu->zero(gpu->ctx, dz.g, n * 2);
    gpu->zero(gpu->ctx, y.g, n * 2); /* a second pending range, used as an input below */
    cpu->zero(cpu->ctx, y.c, n * 4);
    cpu->gelu_bwd(cpu->ctx, dz.c, x.c, dy.c, n);
    gpu->gelu_bwd(gpu->ctx, dz.g, x.g, dy.g, n);
    cpu->gelu_bwd(cpu->ctx, dz.c, x.c, y.c, n);
    gpu->gelu_bwd(gpu->ctx, dz.g, x.g, y.g, n);
    memset(dz.init, 0, n * 4);
    t_check(&dz, "zero + gelu_bwd", shape, TOL_ELEM, 0);
    t_free(&dz);
    t_rand(&x2, 2 * n, 0, 2, 0);
    t_out(&y2, n, 0);
    cpu->swiglu_fwd(cpu->ctx, y2.c, x2.c, N, F);
    gpu->swiglu_fwd(gpu->ctx, y2.g, x2.g, N, F);
    t_check(&y2, "swiglu_fwd", shape, TOL_ELEM, 0);
    t_rand(&dx2, 2 * n, 0, 1, 0);
    cpu->swiglu_bwd(cpu->ctx, dx2.c, x2.c, dy.c, N, F);
    gpu->swiglu_bwd(gpu->ctx, dx2.g, x2.g, dy.g, N, F);
    t_check(&dx2, "swiglu_bwd", shape, TOL_ELEM, 1);
    /* residual / accumulate / scale on the same sizes */
    struct tens r;
    t_out(&r, n, 0);
    cpu->residual_fwd(cpu->ctx, r.c, x.c, dy.c, n);
    gpu->residual_fwd(gpu->ctx, r.g, x.g, dy.g, n);
    t_check(&r, "residual_fwd", shape, TOL_ELEM, 0);
    cpu->accumulate(cpu->ctx, dx.c, x.c, n);
    gpu->accumulate(gpu->ctx, dx.g, x.g, n);
    t_check(&dx, "accumulate", shape, TOL_ELEM, 1);
    memcpy(x.init, x.c, n * sizeof(float));
    cpu->scale(cpu->ctx, x.c, n, 0.37f);
    gpu->scale(gpu->ctx, x.g, n, 0.37f);
    memset(x.init, 0, n * sizeof(float));
    t_check(&x, "scale", shape, TOL_ELEM, 0);
    t_free(&x), t_free(&y), t_free(&dy), t_free(&dx), t_free(&x2), t_free(&y2), t_free(&dx2);
    t_free(&r);
}

/* Llama 3's RoPE scaling ("rope_type": "llama3", as Hugging Face's
 * _compute_llama3_parameters writes it), fp64: inverse frequencies whose
 * wavelength is past orig / lo divided by factor, those under orig / hi
 * kept, the band between interpolated. */
static void llama3_inv_freq(double *inv, int HD, double theta, double factor, double lo, double hi,
                            double orig) {
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < HD / 2; i++) {
        double f = 1.0 / pow(theta, (2.0 * i) / HD), wl = 2 * pi / f;
        double scaled = wl > orig / lo ? f / factor : f;
        if (!(wl < orig / hi) && !(wl > orig / lo)) {
            double sm = (orig / wl - lo) / (hi - lo);
            scaled = (1 - sm) * scaled / factor + sm * scaled;
        }
        inv[i] = scaled;
    }
}

/* RoPE in place on the q and k heads of fused qkv rows, forward then
 * backward, against the cpu (B > 1: positions wrap at T); scaled = 1: both backends given Llama 3
 * frequencies (an original context of 64 positions, so that at T >= 128
 * every band, scaled, interpolated and kept, is in use), and the gpu
 * result must also differ from the unscaled rotation (the frequencies are
 * used, not dropped). */
static void test_rope(int B, int T, int NH, int NKV, int HD, int scaled) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d%s", B, T, NH, NKV, HD,
             scaled ? " llama3" : "");
    reserve_both(B, T, NH * HD, NH, NKV, HD, 64, 64);
    int N = B * T, stride = (NH + 2 * NKV) * HD;
    double inv[256];
    if (scaled) {
        llama3_inv_freq(inv, HD, 10000.0, 8.0, 1.0, 4.0, 64.0);
        if (cpu->rope_set_freqs(cpu->ctx, inv, HD / 2) || !gpu->rope_set_freqs ||
            gpu->rope_set_freqs(gpu->ctx, inv, HD / 2)) {
            checks++, failures++;
            printf("FAIL rope_set_freqs         %s\n", shape);
            return;
        }
    }
    struct tens x;
    t_rand(&x, (size_t)N * stride, 0, 1, 0);
    memset(x.init, 0, x.n * sizeof(float));
    cpu->rope_fwd(cpu->ctx, x.c, N, T, stride, NH + NKV, HD, 10000.f);
    gpu->rope_fwd(gpu->ctx, x.g, N, T, stride, NH + NKV, HD, 10000.f);
    t_check(&x, "rope_fwd", shape, TOL_ELEM, 0);
    if (scaled) { /* the unscaled rotation of the same input is far from it */
        float *plain = malloc(x.n * sizeof(float));
        memcpy(plain, x.h, x.n * sizeof(float));
        cpu->rope_set_freqs(cpu->ctx, NULL, 0);
        cpu->rope_fwd(cpu->ctx, plain, N, T, stride, NH + NKV, HD, 10000.f);
        cpu->rope_set_freqs(cpu->ctx, inv, HD / 2);
        double num = 0, den = 0;
        for (size_t i = 0; i < x.n; i++) {
            double d = (double)plain[i] - ((float *)x.c)[i];
            num += d * d, den += (double)plain[i] * plain[i];
        }
        int far = den > 0 && sqrt(num / den) > 100 * TOL_ELEM;
        checks++, failures += !far;
        printf("%-4s %-22s %-26s rel=%.2e\n", far ? "ok" : "FAIL", "rope llama3 != plain", shape,
               den > 0 ? sqrt(num / den) : 0.0);
        free(plain);
    }
    cpu->rope_bwd(cpu->ctx, x.c, N, T, stride, NH + NKV, HD, 10000.f);
    gpu->rope_bwd(gpu->ctx, x.g, N, T, stride, NH + NKV, HD, 10000.f);
    t_check(&x, "rope_bwd", shape, TOL_ELEM * 2, 0);
    if (scaled) {
        cpu->rope_set_freqs(cpu->ctx, NULL, 0);
        gpu->rope_set_freqs(gpu->ctx, NULL, 0);
    }
    t_free(&x);
}

/* The gradient norm's sum of squares against the cpu: an aligned start and
 * a length with a tail past the vectors (the 16-byte kernel), and a start
 * one element in (not 16-byte aligned: the scalar kernel). */
static void test_sumsq(size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n%zu", n);
    struct tens g, acc;
    t_rand(&g, n + 1, 0, 0.02f, 0);
    t_alloc(&acc, 1, 1);
    acc.h[0] = 0.5f;
    t_upload(&acc);
    cpu->sumsq(cpu->ctx, acc.c, g.c, n);
    gpu->sumsq(gpu->ctx, acc.g, g.g, n);
    t_check(&acc, "sumsq aligned", shape, 1e-5, 1);
    cpu->sumsq(cpu->ctx, acc.c, (float *)g.c + 1, n);
    gpu->sumsq(gpu->ctx, acc.g, (uint16_t *)g.g + 1, n);
    t_check(&acc, "sumsq offset", shape, 1e-5, 1);
    float first, again;
    gpu->download(gpu->ctx, &first, acc.g, 4);
    gpu->upload(gpu->ctx, acc.g, &acc.init[0], 4);
    gpu->sumsq(gpu->ctx, acc.g, g.g, n);
    gpu->sumsq(gpu->ctx, acc.g, (uint16_t *)g.g + 1, n);
    gpu->download(gpu->ctx, &again, acc.g, 4);
    int same = memcmp(&first, &again, 4) == 0;
    checks++, failures += !same;
    printf("%-4s %-22s %-26s\n", same ? "ok" : "FAIL", "sumsq repeats", shape);
    t_free(&g), t_free(&acc);
}

/* SwiGLU, RoPE (plain and Llama 3 scaled) and the sum of squares on `gpu`
 * (the elem-vec row's either setting) */
static void elem_cases(int quick) {
    reserve_both(4, 256, 768, 12, 12, 64, 3072, 1024);
    test_act(64, 256);
    test_act(13, 100); /* F not a multiple of 8: the scalar SwiGLU kernels */
    if (!quick) test_act(37, 3072);
    test_rope(2, 64, 4, 2, 64, 0);
    test_rope(1, 128, 2, 2, 128, 0);
    test_rope(2, 128, 4, 2, 64, 1);
    test_rope(1, 256, 2, 1, 128, 1);
    if (!quick) test_rope(1, 96, 3, 1, 40, 0); /* hd 40: not a multiple of 16 (scalar) */
    test_sumsq(5000);
    if (!quick) test_sumsq(3u << 20);
    reserve_both(4, 256, 768, 12, 12, 64, 3072, 1024);
}

/* Download a bf16 gpu tensor's raw bits (caller frees). */
static uint16_t *t_bits(const struct tens *t) {
    uint16_t *b = malloc(t->n * 2);
    gpu->download(gpu->ctx, b, t->g, t->n * 2);
    return b;
}

/* The attention kernels attention_case runs: -1 the backend's (the ones
 * that ship, or cuDNN's), else that variant of dev/cuda/attn_variants.cu
 * (forward and backward variant alike; dev_kernels.h lists them). */
static int attn_var = -1;

/* The backend's attention calls, or dev_attn_* called as the backend calls
 * lk_attn_* (q, k, v strided inside qkv; the backward accumulates). */
static void attn_fwd_call(void *out, float *lse, const void *qkv, int B, int T, int NH, int NKV,
                          int HD) {
    if (attn_var < 0) {
        gpu->attention_fwd(gpu->ctx, out, lse, qkv, B, T, NH, NKV, HD);
        return;
    }
    const lbf16 *q = qkv;
    int ld = (NH + 2 * NKV) * HD;
    gpu->sync(gpu->ctx);
    dev_attn_fwd(attn_var, out, lse, q, q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH,
                 NKV, HD, (lcuda_stream)backend_cuda_stream(gpu));
}

static void attn_bwd_call(void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int NH, int NKV, int HD) {
    if (attn_var < 0) {
        gpu->attention_bwd(gpu->ctx, dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
        return;
    }
    const lbf16 *q = qkv;
    lbf16 *dq = dqkv;
    int ld = (NH + 2 * NKV) * HD;
    gpu->sync(gpu->ctx);
    float *scratch = gpu->alloc(gpu->ctx, dev_attn_scratch_bytes(B, T, NH, NKV, HD));
    dev_attn_bwd(attn_var, dq, dq + NH * HD, dq + (NH + NKV) * HD, scratch, dout, out, lse, q,
                 q + NH * HD, q + (NH + NKV) * HD, ld, ld, NH * HD, B, T, NH, NKV, HD, 1,
                 (lcuda_stream)backend_cuda_stream(gpu));
    gpu->sync(gpu->ctx);
    gpu->free(gpu->ctx, scratch);
}

/* One attention case against the cpu: forward, then the backward from the
 * cpu's own forward results on both sides (only the backward kernels
 * differ), run twice from the same inputs: the two must give the same bits.
 * zeroed = 0: the gradient starts random and the GPU accumulates into it;
 * 1: it starts zeroed through zero(), the path whose output is overwritten
 * (the one cuDNN's backward takes). */
static void attention_case(int B, int T, int NH, int NKV, int HD, const char *shape, int zeroed) {
    int N = B * T, W = (NH + 2 * NKV) * HD;
    size_t bytes = (size_t)N * W * 2;
    struct tens qkv, out, lse, dout, dqkv;
    t_rand(&qkv, (size_t)N * W, 0, 1.5f, 0);
    t_out(&out, (size_t)N * NH * HD, 0);
    t_out(&lse, (size_t)B * NH * T, 1);
    cpu->attention_fwd(cpu->ctx, out.c, lse.c, qkv.c, B, T, NH, NKV, HD);
    attn_fwd_call(out.g, lse.g, qkv.g, B, T, NH, NKV, HD);
    t_check(&out, "attention_fwd out", shape, TOL_ATTN, 0);
    t_check(&lse, "attention_fwd lse", shape, 1e-3, 0);
    memcpy(out.h, out.c, out.n * sizeof(float));
    for (size_t i = 0; i < out.n; i++)
        out.h[i] = lcuda_bf2f(lcuda_f2bf(out.h[i]));
    t_upload(&out);
    memcpy(lse.h, lse.c, lse.n * sizeof(float));
    t_upload(&lse);
    t_rand(&dout, out.n, 0, 1, 0);
    if (zeroed) {
        t_out(&dqkv, qkv.n, 0);
        memset(dqkv.c, 0, dqkv.n * sizeof(float));
        gpu->zero(gpu->ctx, dqkv.g, bytes);
    } else {
        t_rand(&dqkv, qkv.n, 0, 0.05f, 0);
    }
    cpu->attention_bwd(cpu->ctx, dqkv.c, dout.c, qkv.c, out.c, lse.c, B, T, NH, NKV, HD);
    attn_bwd_call(dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, NH, NKV, HD);
    t_check(&dqkv, "attention_bwd dqkv", shape, TOL_ATTNB, !zeroed);
    uint16_t *first = t_bits(&dqkv), *again;
    if (zeroed) {
        gpu->zero(gpu->ctx, dqkv.g, bytes);
    } else {
        memcpy(dqkv.h, dqkv.init, dqkv.n * sizeof(float));
        t_upload(&dqkv);
    }
    attn_bwd_call(dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, NH, NKV, HD);
    again = t_bits(&dqkv);
    int same = memcmp(first, again, bytes) == 0;
    checks++, failures += !same;
    printf("%-4s %-22s %-26s\n", same ? "ok" : "FAIL", "attention_bwd repeats", shape);
    free(first), free(again);
    t_free(&qkv), t_free(&out), t_free(&lse), t_free(&dout), t_free(&dqkv);
}

/* k_attn.cu's kernels (var 5: the backend's, the ones that ship) or a
 * dev/cuda variant (var 0-4; the fused backward's dQ shares are summed in
 * an order kept by counters, so it repeats bit for bit). */
static void test_attention(int B, int T, int NH, int NKV, int HD, int var) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d v%d", B, T, NH, NKV, HD, var);
    reserve_both(B, T, NH * HD, NH, NKV, HD, 64, 64);
    attn_var = var == 5 ? -1 : var;
    attention_case(B, T, NH, NKV, HD, shape, 0);
    attn_var = -1;
}

/* The product carries the chosen attention kernels: the backend's forward
 * and backward give the bits of dev/cuda's forward 2 / backward 5 on the
 * same inputs (the backward accumulating into the same initial gradient). */
static void test_attention_ships(int B, int T, int NH, int NKV, int HD) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d", B, T, NH, NKV, HD);
    reserve_both(B, T, NH * HD, NH, NKV, HD, 64, 64);
    int N = B * T, W = (NH + 2 * NKV) * HD;
    struct tens qkv, out, lse, dout, dqkv;
    t_rand(&qkv, (size_t)N * W, 0, 1.5f, 0);
    t_out(&out, (size_t)N * NH * HD, 0);
    t_out(&lse, (size_t)B * NH * T, 1);
    t_rand(&dout, out.n, 0, 1, 0);
    t_rand(&dqkv, qkv.n, 0, 0.05f, 0);
    uint16_t *o[2], *d[2];
    float *l[2];
    for (int k = 0; k < 2; k++) { /* 0: the backend; 1: dev/cuda */
        attn_var = k ? 2 : -1;    /* forward 2 */
        attn_fwd_call(out.g, lse.g, qkv.g, B, T, NH, NKV, HD);
        memcpy(dqkv.h, dqkv.init, dqkv.n * sizeof(float));
        t_upload(&dqkv);
        attn_var = k ? 5 : -1; /* backward 5 */
        attn_bwd_call(dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, NH, NKV, HD);
        o[k] = t_bits(&out);
        d[k] = t_bits(&dqkv);
        l[k] = malloc(lse.n * sizeof(float));
        gpu->download(gpu->ctx, l[k], lse.g, lse.n * sizeof(float));
    }
    attn_var = -1;
    int same = !memcmp(o[0], o[1], out.n * 2) && !memcmp(l[0], l[1], lse.n * sizeof(float)) &&
               !memcmp(d[0], d[1], dqkv.n * 2);
    checks++, failures += !same;
    printf("%-4s %-22s %-26s\n", same ? "ok" : "FAIL", "attention ships v2/v5", shape);
    for (int k = 0; k < 2; k++)
        free(o[k]), free(d[k]), free(l[k]);
    t_free(&qkv), t_free(&out), t_free(&lse), t_free(&dout), t_free(&dqkv);
}

/* cuDNN's fused attention through the backend (`gpu` is then a backend made
 * with LOOM_ATTN_CUDNN=1), the backward into a zeroed gradient (calls that
 * accumulate use k_attn.cu); NKV < NH: grouped-query attention, dK / dV
 * summed over each kv head's query heads. Where cuDNN is not available the
 * case says NOT RUN and counts neither way, except that a grouped shape the
 * multi-head shape of the same size builds for must build too (a GQA graph
 * cuDNN rejects would silently leave Llama models on k_attn.cu). */
static void test_attention_cudnn(int B, int T, int NH, int NKV, int HD) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d cudnn", B, T, NH, NKV, HD);
    int mha_ok = 1;
    if (NKV != NH) {
        reserve_both(B, T, NH * HD, NH, NH, HD, 64, 64);
        mha_ok = strcmp(backend_cuda_attn_path(gpu), "cudnn") == 0;
    }
    reserve_both(B, T, NH * HD, NH, NKV, HD, 64, 64);
    const char *path = backend_cuda_attn_path(gpu);
    if (strcmp(path, "cudnn") != 0) {
        int bad = NKV != NH && mha_ok;
        checks += bad, failures += bad;
        printf("%s cuDNN attention %s: %s\n", bad ? "FAIL" : "NOT RUN", shape, path);
        return;
    }
    attention_case(B, T, NH, NKV, HD, shape, 1);
}

static void test_embed(int B, int T, int C, int Vp) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d C%d V%d", B, T, C, Vp);
    reserve_both(B, T, C, 1, 1, C, C, Vp);
    int N = B * T;
    int32_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++)
        tok[i] = (int)(urand() * (Vp / 4)); /* repeats, to exercise the buckets */
    int32_t *tc = cpu->alloc(cpu->ctx, N * 4), *tg = gpu->alloc(gpu->ctx, N * 4);
    memcpy(tc, tok, N * 4);
    gpu->upload(gpu->ctx, tg, tok, N * 4);
    struct tens wte, wpe, out, dout, dwte, dwpe;
    t_rand(&wte, (size_t)Vp * C, 0, 1, 0);
    t_rand(&wpe, (size_t)T * C, 0, 1, 0);
    t_out(&out, (size_t)N * C, 0);
    cpu->embedding_fwd(cpu->ctx, out.c, tc, wte.c, wpe.c, B, T, C);
    gpu->embedding_fwd(gpu->ctx, out.g, tg, wte.g, wpe.g, B, T, C);
    t_check(&out, "embedding_fwd", shape, TOL_ELEM, 0);
    t_rand(&dout, (size_t)N * C, 0, 1, 0);
    t_rand(&dwte, wte.n, 0, 1, 0);
    t_rand(&dwpe, wpe.n, 0, 1, 0);
    cpu->embedding_bwd(cpu->ctx, dwte.c, dwpe.c, dout.c, tc, B, T, C);
    gpu->embedding_bwd(gpu->ctx, dwte.g, dwpe.g, dout.g, tg, B, T, C);
    t_check(&dwte, "embedding_bwd dwte", shape, TOL_MM, 1);
    t_check(&dwpe, "embedding_bwd dwpe", shape, TOL_MM, 1);
    /* new tokens uploaded without a forward: the backend must not reuse the
     * token copy it took during the forward */
    for (int i = 0; i < N; i++)
        tok[i] = (int)(urand() * (Vp / 2));
    memcpy(tc, tok, N * 4);
    gpu->upload(gpu->ctx, tg, tok, N * 4);
    memcpy(dwte.init, dwte.c, dwte.n * 4);
    cpu->embedding_bwd(cpu->ctx, dwte.c, NULL, dout.c, tc, B, T, C);
    gpu->embedding_bwd(gpu->ctx, dwte.g, NULL, dout.g, tg, B, T, C);
    /* both sides now hold init + first + second; compare the second only
     * against the cpu's own running value */
    t_check(&dwte, "embedding_bwd (new tokens)", shape, TOL_MM * 2, 0);
    cpu->free(cpu->ctx, tc), gpu->free(gpu->ctx, tg), free(tok);
    t_free(&wte), t_free(&wpe), t_free(&out), t_free(&dout), t_free(&dwte), t_free(&dwpe);
}

static void test_classifier(int N, int C, int V, int Vp) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d C%d V%d/%d", N, C, V, Vp);
    reserve_both(1, N, C, 1, 1, C, C, Vp);
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int i = 0; i < N; i++)
        tgt[i] = (i % 17 == 5) ? -1 : (int)(urand() * V);
    int32_t *tc = cpu->alloc(cpu->ctx, N * 4), *tg = gpu->alloc(gpu->ctx, N * 4);
    memcpy(tc, tgt, N * 4);
    gpu->upload(gpu->ctx, tg, tgt, N * 4);
    struct tens x, w, loss, dx, dw;
    t_rand(&x, (size_t)N * C, 0, 1, 0);
    t_rand(&w, (size_t)Vp * C, 0, 0.1f, 0);
    t_out(&loss, N, 1);
    /* initial gradients small next to the increments (~grad_scale * |W|), so
     * the bf16 rounding of init + increment does not swamp the increment */
    t_rand(&dx, x.n, 0, 1e-5f, 0);
    t_rand(&dw, w.n, 0, 1e-5f, 0);
    float gs = 1.0f / N;
    cpu->classifier(cpu->ctx, loss.c, dx.c, dw.c, x.c, w.c, tc, N, C, V, Vp, gs);
    gpu->classifier(gpu->ctx, loss.g, dx.g, dw.g, x.g, w.g, tg, N, C, V, Vp, gs);
    t_check(&loss, "classifier losses", shape, 3e-3, 0);
    t_check(&dx, "classifier dinp", shape, TOL_CLS, 1);
    t_check(&dw, "classifier dW", shape, TOL_CLS, 1);
    cpu->free(cpu->ctx, tc), gpu->free(gpu->ctx, tg), free(tgt);
    t_free(&x), t_free(&w), t_free(&loss), t_free(&dx), t_free(&dw);
}

/* The classifier in row chunks (the xent-chunk-mib row; gpu here is a
 * backend made with 1 MiB chunks): the reserved logits chunk must hold
 * exactly `rows` rows (a count below N, so several chunks run, the last one
 * partial when N is not a multiple), then the same checks as
 * test_classifier against the cpu reference (loss, dinp, dW accumulated
 * over the chunks). */
static void test_classifier_chunked(int N, int C, int V, int Vp, int rows) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d C%d V%d/%d rows %d", N, C, V, Vp, rows);
    reserve_both(1, N, C, 1, 1, C, C, Vp);
    struct cuda_mem_report mr;
    int ok =
        backend_cuda_mem(gpu, &mr) == 0 && mr.logits_bytes == (size_t)rows * Vp * 2 && rows < N;
    checks++;
    if (!ok) failures++;
    printf("%-4s %-22s %-26s logits chunk %zu bytes, want %zu\n", ok ? "ok" : "FAIL",
           "classifier chunk rows", shape, mr.logits_bytes, (size_t)rows * Vp * 2);
    test_classifier(N, C, V, Vp);
}

/* matmul_residual_fwd (optional fusion) against the cpu's matmul_fwd +
 * residual_fwd, out distinct from and equal to the residual. */
static void test_matmul_residual(int N, int IC, int OC) {
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%dx%d", N, IC, OC);
    struct tens x, w, bias, r, y, tmp;
    t_rand(&x, (size_t)N * IC, 0, 1, 0);
    t_rand(&w, (size_t)OC * IC, 0, 0.05f, 0);
    t_rand(&bias, OC, 0, 0.1f, 0);
    t_rand(&r, (size_t)N * OC, 0, 1, 0);
    t_out(&y, (size_t)N * OC, 0);
    t_out(&tmp, (size_t)N * OC, 0);
    cpu->matmul_fwd(cpu->ctx, tmp.c, x.c, w.c, bias.c, N, IC, OC);
    cpu->residual_fwd(cpu->ctx, y.c, r.c, tmp.c, y.n);
    gpu->matmul_residual_fwd(gpu->ctx, y.g, x.g, w.g, bias.g, r.g, N, IC, OC);
    t_check(&y, "matmul_residual_fwd", shape, TOL_MM, 0);
    /* in place on the residual stream */
    cpu->residual_fwd(cpu->ctx, r.c, r.c, tmp.c, r.n);
    gpu->matmul_residual_fwd(gpu->ctx, r.g, x.g, w.g, NULL, r.g, N, IC, OC);
    /* the gpu call had no bias: reference r + x.W^T = (r + x.W^T + b) - b */
    float *rc = r.c, *bc = bias.c;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++)
            rc[(size_t)i * OC + o] -= bc[o];
    t_check(&r, "matmul_residual_fwd in place", shape, TOL_MM, 0);
    t_free(&x), t_free(&w), t_free(&bias), t_free(&r), t_free(&y), t_free(&tmp);
}

/* Vocabulary-parallel classifier (tensor parallelism): this rank's Vr rows
 * of W, the first Vv real. Statistics pass, then the gradient pass with a
 * global log-sum-exp = local + 0.3 (other ranks' share) and one ignored row
 * (+inf). Local targets: some < 0 (elsewhere), some in the padding. */
static void test_classifier_vp(int N, int C, int Vv, int Vr) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d C%d Vv%d/%d", N, C, Vv, Vr);
    reserve_both(1, N, C, 1, 1, C, C, Vr);
    int32_t *tgt = malloc(N * sizeof *tgt);
    for (int i = 0; i < N; i++)
        tgt[i] = (i % 5 == 1) ? -1 : (i % 13 == 2) ? Vv + (i % (Vr - Vv + 1)) : (int)(urand() * Vv);
    int32_t *tc = cpu->alloc(cpu->ctx, N * 4), *tg = gpu->alloc(gpu->ctx, N * 4);
    memcpy(tc, tgt, N * 4);
    gpu->upload(gpu->ctx, tg, tgt, N * 4);
    struct tens x, w, lse, tl, z, dx, dw;
    t_rand(&x, (size_t)N * C, 0, 1, 0);
    t_rand(&w, (size_t)Vr * C, 0, 0.1f, 0);
    t_out(&lse, N, 1);
    t_out(&tl, N, 1);
    cpu->classifier_vp(cpu->ctx, lse.c, tl.c, NULL, NULL, x.c, w.c, tc, NULL, N, C, Vv, Vr, 0.f);
    gpu->classifier_vp(gpu->ctx, lse.g, tl.g, NULL, NULL, x.g, w.g, tg, NULL, N, C, Vv, Vr, 0.f);
    t_check(&lse, "classifier_vp lse", shape, 3e-3, 0);
    t_check(&tl, "classifier_vp target logit", shape, 1e-2, 0);
    t_alloc(&z, N, 1);
    const float *lc = lse.c;
    for (int i = 0; i < N; i++)
        z.h[i] = i == 3 ? INFINITY : lc[i] + 0.3f;
    t_upload(&z);
    t_rand(&dx, x.n, 0, 1e-5f, 0);
    t_rand(&dw, w.n, 0, 1e-5f, 0);
    float gs = 1.0f / N;
    cpu->classifier_vp(cpu->ctx, NULL, NULL, dx.c, dw.c, x.c, w.c, tc, z.c, N, C, Vv, Vr, gs);
    gpu->classifier_vp(gpu->ctx, NULL, NULL, dx.g, dw.g, x.g, w.g, tg, z.g, N, C, Vv, Vr, gs);
    t_check(&dx, "classifier_vp dinp", shape, TOL_CLS, 1);
    t_check(&dw, "classifier_vp dW", shape, TOL_CLS, 1);
    cpu->free(cpu->ctx, tc), gpu->free(gpu->ctx, tg), free(tgt);
    t_free(&x), t_free(&w), t_free(&lse), t_free(&tl), t_free(&z), t_free(&dx), t_free(&dw);
}

static void test_optim(size_t n) {
    char shape[64];
    snprintf(shape, sizeof shape, "n%zu", n);
    struct tens p, master, g, m, v, acc;
    t_rand(&master, n, 1, 1, 0);
    t_alloc(&p, n, 0);
    for (size_t i = 0; i < n; i++)
        p.h[i] = lcuda_bf2f(lcuda_f2bf(master.h[i]));
    t_upload(&p);
    t_rand(&g, n, 0, 0.01f, 0);
    t_rand(&m, n, 1, 0.001f, 0);
    t_alloc(&v, n, 1);
    for (size_t i = 0; i < n; i++)
        v.h[i] = (float)(urand() * 1e-4);
    t_upload(&v);
    /* three adjacent ranges per step with different decay, as the engine
     * calls it per run of tensors (the CUDA backend merges them) */
    size_t cut[4] = {0, n / 3, n / 3 + 5, n};
    float wd[3] = {0.1f, 0.0f, 0.1f};
    for (int step = 1; step <= 3; step++) {
        for (int r = 0; r < 3; r++) {
            size_t o = cut[r], k = cut[r + 1] - cut[r];
            struct backend_adamw a = {(float *)p.c + o,
                                      (float *)master.c + o,
                                      (float *)g.c + o,
                                      (float *)m.c + o,
                                      (float *)v.c + o,
                                      k,
                                      6e-4f,
                                      0.9f,
                                      0.95f,
                                      1e-8f,
                                      wd[r],
                                      0.7f,
                                      step};
            cpu->adamw(cpu->ctx, &a);
            a.param = (uint16_t *)p.g + o, a.master = (float *)master.g + o;
            a.grad = (uint16_t *)g.g + o, a.m = (float *)m.g + o, a.v = (float *)v.g + o;
            gpu->adamw(gpu->ctx, &a);
        }
    }
    memset(master.init, 0, n * 4), memset(p.init, 0, n * 4), memset(m.init, 0, n * 4);
    memset(v.init, 0, n * 4);
    t_check(&master, "adamw master", shape, TOL_F32, 0);
    t_check(&m, "adamw m", shape, TOL_F32, 0);
    t_check(&v, "adamw v", shape, TOL_F32, 0);
    t_check(&p, "adamw param (bf16)", shape, TOL_ELEM, 0);
    t_alloc(&acc, 1, 1);
    acc.h[0] = 0.25f;
    t_upload(&acc);
    cpu->sumsq(cpu->ctx, acc.c, g.c, n);
    cpu->sumsq(cpu->ctx, acc.c, g.c, n / 2);
    gpu->sumsq(gpu->ctx, acc.g, g.g, n);
    gpu->sumsq(gpu->ctx, acc.g, g.g, n / 2);
    t_check(&acc, "sumsq (accumulating)", shape, 1e-5, 1);
    t_free(&p), t_free(&master), t_free(&g), t_free(&m), t_free(&v), t_free(&acc);
}

/* Fused paths of kernels.h that struct backend does not expose (GELU and
 * residual epilogues, GELU-gradient epilogue, residual + LayerNorm), against
 * the cpu backend's unfused sequence. */
static void test_fused(int N, int IC, int OC) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d IC%d OC%d", N, IC, OC);
    lcuda_stream st = (lcuda_stream)backend_cuda_stream(gpu);
    struct lcuda_arena ar;
    lcuda_arena_init(&ar, "test-blas", 80u << 20);
    struct lk_blas *bl = lk_blas_new(st, &ar, 0, NULL);
    struct tens x, w, b, acc, pre, y, t, dout, dx, lw, lb, res, ln, mean, rstd;
    t_rand(&x, (size_t)N * IC, 0, 1, 0);
    t_rand(&w, (size_t)OC * IC, 0, 0.1f, 0);
    t_rand(&b, OC, 0, 0.5f, 0);
    t_rand(&acc, (size_t)N * OC, 0, 1, 0);
    t_out(&pre, (size_t)N * OC, 0);
    t_out(&y, (size_t)N * OC, 0);
    cpu->matmul_fwd(cpu->ctx, pre.c, x.c, w.c, b.c, N, IC, OC);
    cpu->gelu_fwd(cpu->ctx, y.c, pre.c, y.n);
    lk_linear_fwd(bl, y.g, pre.g, x.g, w.g, b.g, NULL, N, IC, OC, 1);
    t_check(&pre, "linear+gelu pre", shape, TOL_MM, 0);
    t_check(&y, "linear+gelu out", shape, TOL_MM, 0);
    t_out(&t, (size_t)N * OC, 0);
    cpu->matmul_fwd(cpu->ctx, t.c, x.c, w.c, b.c, N, IC, OC);
    cpu->residual_fwd(cpu->ctx, t.c, t.c, acc.c, t.n);
    lk_linear_fwd(bl, t.g, NULL, x.g, w.g, b.g, acc.g, N, IC, OC, 0);
    t_check(&t, "linear+residual", shape, TOL_MM, 0);
    /* dx = (dout . W^T-shaped) * gelu'(pre) with the [N][OC] layer as input */
    t_rand(&dout, (size_t)N * IC, 0, 1, 0);
    t_out(&dx, (size_t)N * OC, 0);
    struct tens tmp;
    t_alloc(&tmp, (size_t)N * OC, 0);
    memset(tmp.c, 0, tmp.n * 4);
    memset(dx.c, 0, dx.n * 4);
    /* the layer here maps OC -> IC with weight [IC][OC]: reuse w's memory */
    cpu->matmul_bwd(cpu->ctx, tmp.c, NULL, NULL, dout.c, NULL, w.c, N, OC, IC);
    cpu->gelu_bwd(cpu->ctx, dx.c, pre.c, tmp.c, dx.n);
    lk_linear_bwd_data(bl, dx.g, dout.g, w.g, pre.g, N, OC, IC, 0);
    t_check(&dx, "linear bwd + dgelu", shape, TOL_MM, 0);
    t_rand(&lw, OC, 0, 0.3f, 1);
    t_rand(&lb, OC, 0, 0.3f, 0);
    t_out(&res, (size_t)N * OC, 0);
    t_out(&ln, (size_t)N * OC, 0);
    t_out(&mean, N, 1);
    t_out(&rstd, N, 1);
    cpu->residual_fwd(cpu->ctx, res.c, acc.c, y.c, res.n);
    for (size_t i = 0; i < res.n; i++) /* the GPU normalises the bf16-rounded sum */
        ((float *)res.c)[i] = lcuda_bf2f(lcuda_f2bf(((float *)res.c)[i]));
    cpu->layernorm_fwd(cpu->ctx, ln.c, mean.c, rstd.c, res.c, lw.c, lb.c, N, OC, 1e-5f);
    /* same GPU inputs: y.g holds the GPU's gelu output, so feed the CPU's */
    struct tens yc;
    t_alloc(&yc, y.n, 0);
    memcpy(yc.h, y.c, y.n * 4);
    for (size_t i = 0; i < y.n; i++)
        yc.h[i] = lcuda_bf2f(lcuda_f2bf(yc.h[i]));
    t_upload(&yc);
    cpu->residual_fwd(cpu->ctx, res.c, acc.c, yc.c, res.n);
    for (size_t i = 0; i < res.n; i++)
        ((float *)res.c)[i] = lcuda_bf2f(lcuda_f2bf(((float *)res.c)[i]));
    cpu->layernorm_fwd(cpu->ctx, ln.c, mean.c, rstd.c, res.c, lw.c, lb.c, N, OC, 1e-5f);
    lk_residual_norm_fwd(res.g, ln.g, mean.g, rstd.g, acc.g, yc.g, lw.g, lb.g, N, OC, 1e-5f, 0, st);
    t_check(&res, "residual+norm res", shape, TOL_ELEM, 0);
    t_check(&ln, "residual+norm out", shape, TOL_MM, 0);
    gpu->sync(gpu->ctx);
    lk_blas_free(bl);
    lcuda_arena_free(&ar);
    t_free(&x), t_free(&w), t_free(&b), t_free(&acc), t_free(&pre), t_free(&y), t_free(&t);
    t_free(&dout), t_free(&dx), t_free(&tmp), t_free(&lw), t_free(&lb), t_free(&res), t_free(&ln);
    t_free(&mean), t_free(&rstd), t_free(&yc);
}

/* ---- linear layers with measured algorithm choice (LOOM_BLAS_TUNE) ---- */

/* A handle made with the given blas-tune / blas-algo-cache rows (the
 * values of LOOM_BLAS_TUNE / LOOM_BLAS_ALGO_CACHE; NULL: unset). */
static struct lk_blas *blas_with_env(lcuda_stream st, struct lcuda_arena *ar, const char *name,
                                     const char *tune, const char *table) {
    lcuda_arena_init(ar, name, 80u << 20);
    return lk_blas_new(st, ar, tune && !strcmp(tune, "1"), table);
}

enum tv_kind { TV_FWD, TV_DGRAD, TV_WGRAD };
/* The linear variants: epilogues, beta 1 in place and out of place. The
 * in-place residual comes before the out-of-place one (same configuration),
 * so that it is the call that gets timed. */
static const struct tune_variant {
    const char *name;
    enum tv_kind kind;
    int bias, gelu, acc; /* fwd: acc 1 = residual from acc, 2 = in place (out starts as acc) */
} tune_variants[] = {
    {"fwd", TV_FWD, 0, 0, 0},
    {"fwd+bias", TV_FWD, 1, 0, 0},
    {"fwd+bias+gelu", TV_FWD, 1, 1, 0},
    {"fwd+bias+residual in place", TV_FWD, 1, 0, 2},
    {"fwd+bias+residual", TV_FWD, 1, 0, 1},
    {"dgrad", TV_DGRAD, 0, 0, 0},
    {"dgrad accumulate", TV_DGRAD, 0, 0, 1},
    {"dgrad+dgelu", TV_DGRAD, 0, 1, 0},
    {"wgrad+dbias (accumulate)", TV_WGRAD, 1, 0, 1},
};
#define TV_N (sizeof tune_variants / sizeof tune_variants[0])

/* Device operands of one shape (bf16 unless said), host copies of the
 * output's initial contents, and up to two outputs per variant. */
struct tune_bufs {
    int N, IC, OC;
    void *x, *w, *bias, *acc, *dout, *pre_in, *scratch; /* scratch: fp32 bias partials */
    void *out[2];
    size_t n_out[2];
    uint16_t *init[2];
};

/* n random bf16 values (normal * scale) on the GPU. */
static void *dev_bf16(size_t n, float scale) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = lcuda_f2bf(nrand() * scale);
    void *d = gpu->alloc(gpu->ctx, n * 2);
    gpu->upload(gpu->ctx, d, h, n * 2);
    free(h);
    return d;
}

/* Set the variant's outputs to their initial contents: random for
 * accumulating ones (the same draw every time), acc for the in-place
 * residual, NaN for overwritten ones. */
static void tune_reset(struct tune_bufs *t, const struct tune_variant *v, int *nout) {
    size_t NI = (size_t)t->N * t->IC, NO = (size_t)t->N * t->OC, W = (size_t)t->OC * t->IC;
    int n = 0;
    if (v->kind == TV_FWD) {
        t->n_out[n++] = NO;
        if (v->gelu) t->n_out[n++] = NO;
    } else if (v->kind == TV_DGRAD) {
        t->n_out[n++] = NI;
    } else {
        t->n_out[n++] = W;
        t->n_out[n++] = (size_t)t->OC;
    }
    uint64_t saved = rng_state;
    rng_state = 0x9e3779b97f4a7c15ull; /* the same initial values for every run */
    for (int o = 0; o < n; o++) {
        for (size_t i = 0; i < t->n_out[o]; i++)
            t->init[o][i] = (v->acc == 1 && v->kind != TV_FWD) ? lcuda_f2bf(nrand()) : 0x7fc0;
        if (v->acc == 2) gpu->download(gpu->ctx, t->init[o], t->acc, NO * 2);
        gpu->upload(gpu->ctx, t->out[o], t->init[o], t->n_out[o] * 2);
    }
    rng_state = saved;
    *nout = n;
}

static void tune_run(struct lk_blas *bl, struct tune_bufs *t, const struct tune_variant *v) {
    int N = t->N, IC = t->IC, OC = t->OC;
    if (v->kind == TV_FWD) {
        const void *acc = v->acc == 1 ? t->acc : v->acc == 2 ? t->out[0] : NULL;
        lk_linear_fwd(bl, t->out[0], v->gelu ? t->out[1] : NULL, t->x, t->w,
                      v->bias ? t->bias : NULL, acc, N, IC, OC, v->gelu);
    } else if (v->kind == TV_DGRAD) {
        lk_linear_bwd_data(bl, t->out[0], t->dout, t->w, v->gelu ? t->pre_in : NULL, N, IC, OC,
                           v->acc);
    } else {
        lk_linear_bwd_weight(bl, t->out[0], t->out[1], t->scratch, t->dout, t->x, N, IC, OC);
    }
}

/* ||(a - init) - (r - init)|| / ||r - init||: the increments compared, so
 * an output added twice shows as an error near 1. */
static double tune_relerr(const uint16_t *a, const uint16_t *r, const uint16_t *init, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double base = init[i] == 0x7fc0 ? 0 : lcuda_bf2f(init[i]);
        double da = lcuda_bf2f(a[i]) - base, dr = lcuda_bf2f(r[i]) - base;
        num += (da - dr) * (da - dr);
        den += dr * dr;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

static void tune_expect(int ok, const char *what, const char *shape, const char *detail) {
    checks++;
    if (!ok) failures++;
    printf("%-4s %-48s %-26s %s\n", ok ? "ok" : "FAIL", what, shape, detail ? detail : "");
}

/* Every linear variant through four handles: the default (heuristic #0),
 * LOOM_BLAS_TUNE=1, LOOM_BLAS_TUNE=1 writing a table, and a handle that
 * only reads that table. Checks: tuned results equal the default's within
 * TOL_MM (increments, so no double accumulation); the tuning call (the first
 * of its configuration, which times the candidates) gives the same bits as
 * the next, cached call; the table handle times nothing and repeats the
 * writer's bits. */
static void test_blas_tune(int N, int IC, int OC) {
    char shape[64];
    snprintf(shape, sizeof shape, "N%d IC%d OC%d (tuned)", N, IC, OC);
    lcuda_stream st = (lcuda_stream)backend_cuda_stream(gpu);
    char table[96];
    snprintf(table, sizeof table, "/tmp/loom-blas-test-%d.txt", (int)getpid());
    char lockf[112];
    snprintf(lockf, sizeof lockf, "%s.lock", table);
    unlink(table);
    struct lcuda_arena ar[4];
    struct lk_blas *ref = blas_with_env(st, &ar[0], "blas-ref", NULL, NULL);
    struct lk_blas *tun = blas_with_env(st, &ar[1], "blas-tune", "1", NULL);
    struct lk_blas *wr = blas_with_env(st, &ar[2], "blas-table-w", "1", table);

    struct tune_bufs t;
    memset(&t, 0, sizeof t);
    t.N = N, t.IC = IC, t.OC = OC;
    size_t NI = (size_t)N * IC, NO = (size_t)N * OC, W = (size_t)OC * IC;
    size_t maxo = NI > NO ? NI : NO;
    if (W > maxo) maxo = W;
    t.x = dev_bf16(NI, 1);
    t.w = dev_bf16(W, 0.1f);
    t.bias = dev_bf16(OC, 0.5f);
    t.acc = dev_bf16(NO, 1);
    t.dout = dev_bf16(NO, 1);
    t.pre_in = dev_bf16(NI, 1);
    t.scratch = gpu->alloc(gpu->ctx, lk_bias_scratch_bytes(N, OC));
    uint16_t *res[4][TV_N][2]; /* ref, tuned 1st call, tuned 2nd call, table writer */
    for (int o = 0; o < 2; o++) {
        t.out[o] = gpu->alloc(gpu->ctx, maxo * 2);
        t.init[o] = malloc(maxo * 2);
    }
    struct lk_blas *order[4] = {ref, tun, tun, wr};
    for (size_t v = 0; v < TV_N; v++) {
        for (int h = 0; h < 4; h++) {
            int nout = 0;
            tune_reset(&t, &tune_variants[v], &nout);
            tune_run(order[h], &t, &tune_variants[v]);
            for (int o = 0; o < 2; o++) {
                res[h][v][o] = NULL;
                if (o >= nout) continue;
                res[h][v][o] = malloc(t.n_out[o] * 2);
                gpu->download(gpu->ctx, res[h][v][o], t.out[o], t.n_out[o] * 2);
            }
        }
        int nout = 0;
        tune_reset(&t, &tune_variants[v], &nout); /* t.init for the comparisons */
        for (int o = 0; o < nout; o++) {
            char what[96], detail[96];
            double e1 = tune_relerr(res[1][v][o], res[0][v][o], t.init[o], t.n_out[o]);
            double e3 = tune_relerr(res[3][v][o], res[0][v][o], t.init[o], t.n_out[o]);
            snprintf(what, sizeof what, "tuned %s out%d vs default", tune_variants[v].name, o);
            snprintf(detail, sizeof detail, "rel=%.2e,%.2e bound=%.0e", e1, e3, TOL_MM);
            tune_expect(e1 <= TOL_MM && e3 <= TOL_MM, what, shape, detail);
            snprintf(what, sizeof what, "tuning call = cached call %s out%d", tune_variants[v].name,
                     o);
            tune_expect(!memcmp(res[1][v][o], res[2][v][o], t.n_out[o] * 2), what, shape,
                        "bitwise");
        }
    }
    struct lk_blas_stats s_tun, s_wr, s_rd;
    lk_blas_get_stats(tun, &s_tun);
    lk_blas_get_stats(wr, &s_wr);
    char detail[96];
    snprintf(detail, sizeof detail, "%d of %d (%d not #0) in %.0f ms", s_tun.tuned, s_tun.configs,
             s_tun.not_first, s_tun.tune_ms);
    tune_expect(s_tun.tuned == s_tun.configs && s_tun.configs >= 7, "tuned every configuration",
                shape, detail);

    /* the table: read by a handle without LOOM_BLAS_TUNE, same bits as its writer */
    FILE *f = fopen(table, "r");
    tune_expect(f != NULL, "algorithm table written", shape, table);
    if (f) fclose(f);
    struct lk_blas *rd = blas_with_env(st, &ar[3], "blas-table-r", NULL, table);
    for (size_t v = 0; v < TV_N; v++) {
        int nout = 0;
        tune_reset(&t, &tune_variants[v], &nout);
        tune_run(rd, &t, &tune_variants[v]);
        for (int o = 0; o < nout; o++) {
            uint16_t *got = malloc(t.n_out[o] * 2);
            gpu->download(gpu->ctx, got, t.out[o], t.n_out[o] * 2);
            char what[96];
            snprintf(what, sizeof what, "table read = table written %s out%d",
                     tune_variants[v].name, o);
            tune_expect(!memcmp(got, res[3][v][o], t.n_out[o] * 2), what, shape, "bitwise");
            free(got);
        }
    }
    lk_blas_get_stats(rd, &s_rd);
    snprintf(detail, sizeof detail, "%d of %d read, %d timed", s_rd.from_table, s_rd.configs,
             s_rd.tuned);
    tune_expect(s_rd.tuned == 0 && s_rd.from_table == s_wr.tuned && s_rd.configs == s_wr.configs,
                "table read: every configuration, no timing", shape, detail);

    gpu->sync(gpu->ctx);
    struct lk_blas *all[4] = {ref, tun, wr, rd};
    for (int h = 0; h < 4; h++) {
        lk_blas_free(all[h]);
        lcuda_arena_free(&ar[h]);
    }
    for (int h = 0; h < 4; h++)
        for (size_t v = 0; v < TV_N; v++)
            free(res[h][v][0]), free(res[h][v][1]);
    for (int o = 0; o < 2; o++) {
        gpu->free(gpu->ctx, t.out[o]);
        free(t.init[o]);
    }
    void *dev[] = {t.x, t.w, t.bias, t.acc, t.dout, t.pre_in, t.scratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        gpu->free(gpu->ctx, dev[i]);
    unlink(table);
    unlink(lockf);
}

/* ---- documents packed in a row (set_doc_starts; train.packing "document") ----
 * Checked against a plain host reference written here in double precision (not
 * the cpu backend): softmax attention where query i of a sequence sees the keys
 * from its document's start to i, its log-sum-exp and the gradients of q, k, v;
 * RoPE and the learned position embedding at the position within the document. */

/* Document starts [B*T] for a layout: 0 one document per row; 1 many short
 * documents (1-20 tokens); 2 documents on 64-row tile edges (none crosses a
 * tile); 3 long documents crossing tiles at odd places; 4 every row its own
 * document in sequence 0 and one document in the others. */
static void doc_layout(int32_t *ds, int B, int T, int layout) {
    for (int b = 0; b < B; b++) {
        int start = 0, next = 0;
        for (int t = 0; t < T; t++) {
            if (t == next) {
                start = t;
                int len = layout == 0   ? T
                          : layout == 1 ? 1 + (int)(urand() * 20)
                          : layout == 2 ? 64 * (1 + (int)(urand() * 2))
                          : layout == 3 ? 37 + (int)(urand() * 90)
                                        : (b == 0 ? 1 : T);
                next = t + len;
            }
            ds[(size_t)b * T + t] = start;
        }
    }
}

static const char *doc_layout_name[] = {"one doc", "short docs", "tile-aligned docs",
                                        "docs crossing tiles", "1-token docs"};

/* The reference: out [N][NH*HD], lse [B][NH][T] (natural log), and with dout the
 * gradients dqkv [N][W] (overwritten) from out rounded as the GPU stores it. */
static void ref_attn_doc(const float *qkv, const int32_t *ds, int B, int T, int NH, int NKV, int HD,
                         double *out, double *lse, const float *dout, const float *out_bf,
                         double *dqkv) {
    int W = (NH + 2 * NKV) * HD, grp = NH / NKV;
    double sc = 1.0 / sqrt((double)HD);
    double *p = malloc((size_t)T * sizeof(double));
    if (dqkv) memset(dqkv, 0, (size_t)B * T * W * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int hk = h / grp;
            for (int i = 0; i < T; i++) {
                size_t ri = (size_t)b * T + i;
                const float *qi = qkv + ri * W + h * HD;
                int j0 = ds[ri];
                double mx = -INFINITY, sum = 0;
                for (int j = j0; j <= i; j++) {
                    const float *kj = qkv + ((size_t)b * T + j) * W + (NH + hk) * HD;
                    double s = 0;
                    for (int d = 0; d < HD; d++)
                        s += (double)qi[d] * kj[d];
                    p[j] = s * sc;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = j0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - mx));
                if (!dqkv) {
                    lse[((size_t)b * NH + h) * T + i] = mx + log(sum);
                    for (int d = 0; d < HD; d++) {
                        double o = 0;
                        for (int j = j0; j <= i; j++)
                            o += p[j] / sum *
                                 qkv[((size_t)b * T + j) * W + (NH + NKV + hk) * HD + d];
                        out[ri * NH * HD + h * HD + d] = o;
                    }
                    continue;
                }
                const float *go = dout + ri * NH * HD + h * HD,
                            *oi = out_bf + ri * NH * HD + h * HD;
                double di = 0;
                for (int d = 0; d < HD; d++)
                    di += (double)go[d] * oi[d];
                for (int j = j0; j <= i; j++) {
                    size_t rj = (size_t)b * T + j;
                    const float *vj = qkv + rj * W + (NH + NKV + hk) * HD;
                    const float *kj = qkv + rj * W + (NH + hk) * HD;
                    double pj = p[j] / sum, dp = 0;
                    for (int d = 0; d < HD; d++)
                        dp += (double)go[d] * vj[d];
                    double dsc = pj * (dp - di) * sc;
                    for (int d = 0; d < HD; d++) {
                        dqkv[ri * W + h * HD + d] += dsc * kj[d];
                        dqkv[rj * W + (NH + hk) * HD + d] += dsc * qi[d];
                        dqkv[rj * W + (NH + NKV + hk) * HD + d] += pj * go[d];
                    }
                }
            }
        }
    free(p);
}

static double rel_err(const float *a, const double *r, const float *base, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i] - (base ? base[i] : 0);
        if (!isfinite(a[i])) return INFINITY;
        num += (x - r[i]) * (x - r[i]);
        den += r[i] * r[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void verdict(int ok, const char *what, const char *shape, double rel, double tol) {
    checks++, failures += !ok;
    printf("%-4s %-22s %-26s rel=%.2e bound=%.0e\n", ok ? "PASS" : "FAIL", what, shape, rel, tol);
}

static float *dl_bf16(void *g, size_t n) {
    uint16_t *b = malloc(n * 2);
    float *f = malloc(n * sizeof(float));
    gpu->download(gpu->ctx, b, g, n * 2);
    for (size_t i = 0; i < n; i++)
        f[i] = lcuda_bf2f(b[i]);
    free(b);
    return f;
}

static void *up_bf16(const float *h, size_t n) {
    uint16_t *b = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        b[i] = lcuda_f2bf(h[i]);
    void *g = gpu->alloc(gpu->ctx, n * 2);
    gpu->upload(gpu->ctx, g, b, n * 2);
    free(b);
    return g;
}

static float *rand_bf16(size_t n, float scale) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = lcuda_bf2f(lcuda_f2bf(nrand() * scale));
    return h;
}

/* Document attention forward and backward (accumulating into a random
 * gradient) through the backend; `label` names the backend (tile skipping on
 * or off). Returns the GPU's out and dqkv increments (caller frees) so the
 * two backends can be compared. */
static void attention_doc_case(int B, int T, int NH, int NKV, int HD, int layout, const char *label,
                               float **out_g, float **dq_g) {
    char shape[96];
    snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d %s %s", B, T, NH, NKV, HD,
             doc_layout_name[layout], label);
    int N = B * T, W = (NH + 2 * NKV) * HD;
    size_t nq = (size_t)N * W, no = (size_t)N * NH * HD, nl = (size_t)B * NH * T;
    int32_t *ds = malloc((size_t)N * sizeof(int32_t));
    doc_layout(ds, B, T, layout);
    float *qkv = rand_bf16(nq, 1.5f), *dout = rand_bf16(no, 1.f), *dinit = rand_bf16(nq, 0.05f);
    double *out = malloc(no * sizeof(double)), *lse = malloc(nl * sizeof(double));
    double *dref = malloc(nq * sizeof(double));
    ref_attn_doc(qkv, ds, B, T, NH, NKV, HD, out, lse, NULL, NULL, NULL);
    float *out_bf = malloc(no * sizeof(float)), *lse_f = malloc(nl * sizeof(float));
    for (size_t i = 0; i < no; i++)
        out_bf[i] = lcuda_bf2f(lcuda_f2bf((float)out[i]));
    for (size_t i = 0; i < nl; i++)
        lse_f[i] = (float)lse[i];
    ref_attn_doc(qkv, ds, B, T, NH, NKV, HD, NULL, NULL, dout, out_bf, dref);

    gpu->set_doc_starts(gpu->ctx, ds, N);
    void *gq = up_bf16(qkv, nq), *gd = up_bf16(dout, no), *gdq = up_bf16(dinit, nq);
    void *go = gpu->alloc(gpu->ctx, no * 2);
    float *gl = gpu->alloc(gpu->ctx, nl * sizeof(float));
    gpu->attention_fwd(gpu->ctx, go, gl, gq, B, T, NH, NKV, HD);
    float *o = dl_bf16(go, no), *l = malloc(nl * sizeof(float));
    gpu->download(gpu->ctx, l, gl, nl * sizeof(float));
    double *lsed = malloc(nl * sizeof(double));
    for (size_t i = 0; i < nl; i++)
        lsed[i] = lse[i];
    double r = rel_err(o, out, NULL, no);
    verdict(r <= TOL_ATTN, "attention_fwd doc out", shape, r, TOL_ATTN);
    r = rel_err(l, lsed, NULL, nl);
    verdict(r <= 1e-3, "attention_fwd doc lse", shape, r, 1e-3);
    /* the backward from the reference's forward (bf16 out, fp32 lse) */
    gpu->upload(gpu->ctx, gl, lse_f, nl * sizeof(float));
    void *gob = up_bf16(out_bf, no);
    gpu->attention_bwd(gpu->ctx, gdq, gd, gq, gob, gl, B, T, NH, NKV, HD);
    float *dq = dl_bf16(gdq, nq);
    for (size_t i = 0; i < nq; i++)
        dq[i] -= dinit[i];
    r = rel_err(dq, dref, NULL, nq);
    verdict(r <= TOL_ATTNB, "attention_bwd doc dqkv", shape, r, TOL_ATTNB);
    /* grouped-query heads' dK, dV and every head's dQ, on their own */
    static const char *part[3] = {"attention_bwd doc dq", "attention_bwd doc dk",
                                  "attention_bwd doc dv"};
    for (int pt = 0; pt < 3; pt++) {
        int c0 = pt == 0 ? 0 : pt == 1 ? NH * HD : (NH + NKV) * HD;
        int c1 = pt == 0 ? NH * HD : pt == 1 ? (NH + NKV) * HD : W;
        double num = 0, den = 0;
        for (int row = 0; row < N; row++)
            for (int c = c0; c < c1; c++) {
                size_t i = (size_t)row * W + c;
                num += (dq[i] - dref[i]) * (dq[i] - dref[i]);
                den += dref[i] * dref[i];
            }
        double rp = den > 0 ? sqrt(num / den) : sqrt(num);
        verdict(rp <= TOL_ATTNB, part[pt], shape, rp, TOL_ATTNB);
    }
    gpu->set_doc_starts(gpu->ctx, NULL, 0);
    gpu->free(gpu->ctx, gq), gpu->free(gpu->ctx, gd), gpu->free(gpu->ctx, gdq);
    gpu->free(gpu->ctx, go), gpu->free(gpu->ctx, gl), gpu->free(gpu->ctx, gob);
    *out_g = o;
    *dq_g = dq;
    free(l), free(lsed), free(ds), free(qkv), free(dout), free(dinit), free(out), free(lse);
    free(dref), free(out_bf), free(lse_f);
}

/* Every layout on `gpu` (tiles skipped) and on `noskip` (the attn-doc-skip row
 * off: masked only); both against the reference, and the two alike. */
static void test_attention_doc(int B, int T, int NH, int NKV, int HD, struct backend *noskip) {
    reserve_both(B, T, NH * HD, NH, NKV, HD, 64, 64);
    struct backend_limits lim = {B, T, NH * HD, NH, NKV, HD, 64, 64, 0, 0};
    if (noskip->reserve(noskip->ctx, &lim)) {
        fprintf(stderr, "reserve failed\n");
        exit(1);
    }
    for (int layout = 0; layout < 5; layout++) {
        float *o[2], *d[2];
        struct backend *keep = gpu;
        uint64_t seed = rng_state; /* the same case on both */
        attention_doc_case(B, T, NH, NKV, HD, layout, "skip", &o[0], &d[0]);
        rng_state = seed;
        gpu = noskip;
        attention_doc_case(B, T, NH, NKV, HD, layout, "noskip", &o[1], &d[1]);
        gpu = keep;
        size_t no = (size_t)B * T * NH * HD, nq = (size_t)B * T * (NH + 2 * NKV) * HD;
        double num = 0, den = 0;
        for (size_t i = 0; i < no; i++)
            num += fabs(o[0][i] - o[1][i]), den += fabs(o[1][i]);
        for (size_t i = 0; i < nq; i++)
            num += fabs(d[0][i] - d[1][i]), den += fabs(d[1][i]);
        char shape[96];
        snprintf(shape, sizeof shape, "B%d T%d H%d/%d hd%d %s", B, T, NH, NKV, HD,
                 doc_layout_name[layout]);
        verdict(num <= 1e-6 * den, "attention doc skip=noskip", shape, den > 0 ? num / den : num,
                1e-6);
        free(o[0]), free(o[1]), free(d[0]), free(d[1]);
    }
}

/* RoPE and the learned position embedding at positions within documents,
 * against the host: rows rotated by pos * theta^(-2i/HD), out = wte[tok] +
 * wpe[pos], dwpe[p] += the sum of the rows at position p. */
static void test_doc_positions(int B, int T, int NH, int HD, int C) {
    char shape[64];
    snprintf(shape, sizeof shape, "B%d T%d H%d hd%d C%d", B, T, NH, HD, C);
    reserve_both(B, T, C, NH, NH, HD, 64, 256);
    int N = B * T, V = 50;
    int32_t *ds = malloc((size_t)N * sizeof(int32_t)), *tok = malloc((size_t)N * sizeof(int32_t));
    doc_layout(ds, B, T, 1);
    for (int r = 0; r < N; r++)
        tok[r] = (int32_t)(urand() * V);
    gpu->set_doc_starts(gpu->ctx, ds, N);
    int stride = NH * HD;
    size_t nx = (size_t)N * stride;
    float *x = rand_bf16(nx, 1.f);
    double *ref = malloc((nx > (size_t)N * C ? nx : (size_t)N * C) * sizeof(double));
    for (int r = 0; r < N; r++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                double ang = (r % T - ds[r]) * pow(10000.0, -2.0 * i / HD);
                size_t a = (size_t)r * stride + h * HD + i, b2 = a + HD / 2;
                ref[a] = x[a] * cos(ang) - x[b2] * sin(ang);
                ref[b2] = x[b2] * cos(ang) + x[a] * sin(ang);
            }
    void *gx = up_bf16(x, nx);
    gpu->rope_fwd(gpu->ctx, gx, N, T, stride, NH, HD, 10000.f);
    float *y = dl_bf16(gx, nx);
    double r = rel_err(y, ref, NULL, nx);
    verdict(r <= TOL_ELEM, "rope_fwd doc positions", shape, r, TOL_ELEM);
    gpu->rope_bwd(gpu->ctx, gx, N, T, stride, NH, HD, 10000.f); /* back to x */
    free(y);
    y = dl_bf16(gx, nx);
    for (size_t i = 0; i < nx; i++)
        ref[i] = x[i];
    r = rel_err(y, ref, NULL, nx);
    verdict(r <= 2 * TOL_ELEM, "rope_bwd doc positions", shape, r, 2 * TOL_ELEM);
    free(y), free(x);
    gpu->free(gpu->ctx, gx);
    /* embedding */
    float *wte = rand_bf16((size_t)V * C, 1.f), *wpe = rand_bf16((size_t)T * C, 1.f);
    float *dout = rand_bf16((size_t)N * C, 1.f), *dw0 = rand_bf16((size_t)T * C, 0.1f);
    void *gwte = up_bf16(wte, (size_t)V * C), *gwpe = up_bf16(wpe, (size_t)T * C);
    void *gdo = up_bf16(dout, (size_t)N * C), *gdw = up_bf16(dw0, (size_t)T * C);
    void *gout = gpu->alloc(gpu->ctx, (size_t)N * C * 2);
    int32_t *gtok = gpu->alloc(gpu->ctx, (size_t)N * sizeof(int32_t));
    gpu->upload(gpu->ctx, gtok, tok, (size_t)N * sizeof(int32_t));
    gpu->embedding_fwd(gpu->ctx, gout, gtok, gwte, gwpe, B, T, C);
    for (int rr = 0; rr < N; rr++)
        for (int c = 0; c < C; c++)
            ref[(size_t)rr * C + c] =
                (double)wte[(size_t)tok[rr] * C + c] + wpe[(size_t)(rr % T - ds[rr]) * C + c];
    y = dl_bf16(gout, (size_t)N * C);
    r = rel_err(y, ref, NULL, (size_t)N * C);
    verdict(r <= TOL_ELEM, "embedding_fwd doc wpe", shape, r, TOL_ELEM);
    free(y);
    gpu->embedding_bwd(gpu->ctx, NULL, gdw, gdo, gtok, B, T, C);
    memset(ref, 0, (size_t)T * C * sizeof(double));
    for (int rr = 0; rr < N; rr++)
        for (int c = 0; c < C; c++)
            ref[(size_t)(rr % T - ds[rr]) * C + c] += dout[(size_t)rr * C + c];
    y = dl_bf16(gdw, (size_t)T * C);
    r = rel_err(y, ref, dw0, (size_t)T * C);
    verdict(r <= TOL_MM, "embedding_bwd doc dwpe", shape, r, TOL_MM);
    free(y);
    gpu->set_doc_starts(gpu->ctx, NULL, 0);
    gpu->free(gpu->ctx, gwte), gpu->free(gpu->ctx, gwpe), gpu->free(gpu->ctx, gdo);
    gpu->free(gpu->ctx, gdw), gpu->free(gpu->ctx, gout), gpu->free(gpu->ctx, gtok);
    free(wte), free(wpe), free(dout), free(dw0), free(ref), free(ds), free(tok);
}

int main(void) {
    int rc = lcuda_probe();
    if (rc) return rc;
    const char *s = getenv("LOOM_TEST_SEED");
    rng_state = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) * 2654435761u + 1;
    printf("seed %llu (LOOM_TEST_SEED repeats it)\n", (unsigned long long)rng_state);
    cpu = backend_cpu_new(0);
    /* k_attn.cu's kernels here (the attn-cudnn row off); cuDNN's attention on
     * a second backend below */
    struct cuda_tuning ct = {
        .fuse_dgelu = 1, .attn_cudnn = "0", .attn_cudnn_gqa = 1, .elem_vec = 1, .attn_doc_skip = 1};
    gpu = backend_cuda_new_tuned(0, &ct);
    ct.attn_cudnn = "1";
    struct backend *gpu_cudnn = backend_cuda_new_tuned(0, &ct);
    /* the elem-vec row off: the one-element-per-thread kernels */
    ct.attn_cudnn = "0", ct.elem_vec = 0;
    struct backend *gpu_scalar = backend_cuda_new_tuned(0, &ct);
    /* packed documents with the attn-doc-skip row off (masked, no tile skipped); cuDNN on,
     * which a document batch must not take */
    ct.attn_cudnn = "1", ct.elem_vec = 1, ct.attn_doc_skip = 0;
    struct backend *gpu_noskip = backend_cuda_new_tuned(0, &ct);
    /* the classifier in 1 MiB logits chunks (the others: chunks of up to 2 GiB) */
    ct.attn_doc_skip = 1, ct.elem_vec = 1, ct.xent_chunk_mib = 1;
    struct backend *gpu_chunk = backend_cuda_new_tuned(0, &ct);
    if (!cpu || !gpu || !gpu_cudnn || !gpu_scalar || !gpu_noskip || !gpu_chunk) return 1;
    /* LOOM_TEST_QUICK=1 (used under compute-sanitizer): the first, smaller
     * shapes of every table only. */
    int quick = getenv("LOOM_TEST_QUICK") != NULL;
    /* LOOM_TEST_DOC_ONLY=1 (tests/gpu/device/check_packing.sh): the packed-document
     * checks only */
    int doc_only = getenv("LOOM_TEST_DOC_ONLY") != NULL;
    reserve_both(4, 256, 768, 12, 12, 64, 3072, 1024);
    if (doc_only) goto docs;

    static const int mm[][4] = {
        {64, 64, 192, 1}, {512, 256, 40, 0}, {256, 768, 2304, 1}, {128, 1024, 768, 1}};
    for (size_t i = 0; i < (quick ? 2 : sizeof mm / sizeof mm[0]); i++)
        test_matmul(mm[i][0], mm[i][1], mm[i][2], mm[i][3]);
    /* norms: every kernel generation (0-4: dev/cuda; NORM_SHIPS through the
     * backend); C 520 and 1600
     * leave the last 256-column vector partly empty, 4096 is past the
     * one-pass kernels (variant 0's kernels), N 300 and 1000 end in a
     * partial row block */
    static const int nm[][2] = {{64, 64},  {33, 1600},  {300, 768},   {40, 256}, {128, 2048},
                                {97, 520}, {200, 1024}, {1000, 1600}, {70, 4096}};
    for (int v = 0; v < (quick ? 2 : 5); v++)
        for (size_t i = 0; i < (quick ? 2 : sizeof nm / sizeof nm[0]); i++) {
            test_norm(nm[i][0], nm[i][1], 0, v);
            test_norm(nm[i][0], nm[i][1], 1, v);
        }
    static const int np[][3] = {{300, 768, 0}, {300, 768, 1},  {1000, 1600, 0}, {128, 2048, 1},
                                {97, 520, 0},  {200, 1024, 0}, {64, 64, 1},     {70, 4096, 1}};
    for (size_t i = 0; i < (quick ? 2 : sizeof np / sizeof np[0]); i++)
        test_norm_paths(np[i][0], np[i][1], np[i][2]);
    elem_cases(quick);
    {
        struct backend *vec_gpu = gpu;
        gpu = gpu_scalar;
        elem_cases(quick);
        gpu = vec_gpu;
    }
    /* T % 128 == 64 shapes exercise scheme 2's half-empty 128-query CTA */
    static const int at[][5] = {{1, 64, 1, 1, 64},  {2, 128, 2, 1, 32},  {1, 192, 2, 2, 128},
                                {2, 128, 4, 4, 64}, {1, 256, 4, 2, 64},  {1, 320, 3, 1, 64},
                                {2, 384, 4, 2, 32}, {1, 256, 2, 1, 128}, {1, 1024, 2, 2, 64}};
    static const int attn_vars[] = {5, 0, 1, 2, 3, 4}; /* the shipping one first */
    for (size_t v = 0; v < (quick ? 1 : sizeof attn_vars / sizeof attn_vars[0]); v++)
        for (size_t i = 0; i < (quick ? 3 : sizeof at / sizeof at[0]); i++)
            test_attention(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], attn_vars[v]);
    for (size_t i = 0; i < (quick ? 2 : sizeof at / sizeof at[0]); i++)
        test_attention_ships(at[i][0], at[i][1], at[i][2], at[i][3], at[i][4]);
    {
        struct backend *k_attn_gpu = gpu;
        gpu = gpu_cudnn;
        /* B T NH NKV HD: multi-head, then grouped-query (groups of 2, 4 and
         * 8 query heads, one kv head, Llama 3.2 1B's 32/8 and 3B's 24/8) */
        static const int ac[][5] = {
            {2, 256, 4, 4, 64},   {1, 1024, 2, 2, 64}, {2, 128, 2, 2, 128},
            {4, 512, 12, 12, 64}, {2, 256, 4, 2, 64},  {1, 512, 8, 2, 128},
            {1, 256, 8, 1, 64},   {1, 384, 32, 8, 64}, {1, 256, 24, 8, 128}};
        for (size_t i = 0; i < (quick ? 1 : sizeof ac / sizeof ac[0]); i++)
            test_attention_cudnn(ac[i][0], ac[i][1], ac[i][2], ac[i][3], ac[i][4]);
        if (quick) test_attention_cudnn(2, 256, 4, 2, 64);
        gpu = k_attn_gpu;
        reserve_both(4, 256, 768, 12, 12, 64, 3072, 1024);
    }
docs:;
    /* documents packed in a row: B T NH NKV HD, every head size, grouped-query heads,
     * T % 128 == 64 */
    static const int ad[][5] = {{2, 128, 2, 2, 64}, {1, 192, 4, 2, 32}, {2, 256, 4, 1, 128},
                                {1, 384, 8, 2, 64}, {2, 64, 2, 1, 64},  {1, 320, 3, 3, 128}};
    for (size_t i = 0; i < (quick ? 2 : sizeof ad / sizeof ad[0]); i++)
        test_attention_doc(ad[i][0], ad[i][1], ad[i][2], ad[i][3], ad[i][4], gpu_noskip);
    test_doc_positions(2, 128, 2, 64, 64);
    reserve_both(4, 256, 768, 12, 12, 64, 3072, 1024);
    if (doc_only) goto done;
    test_embed(2, 64, 64, 256);
    if (!quick) test_embed(4, 128, 768, 1024);
    test_classifier(64, 64, 250, 256);
    if (!quick) test_classifier(300, 128, 1000, 1024);
    if (!quick) test_classifier(16, 64, 70000, 70016); /* a large vocabulary */
    test_classifier_vp(64, 64, 120, 128);
    test_matmul_residual(64, 64, 192);
    if (!quick) test_matmul_residual(512, 768, 768);
    if (!quick) test_classifier_vp(300, 128, 25088, 25152); /* GPT-2 vocabulary over tp 2 */
    {
        /* the classifier in 1 MiB row chunks (xent-chunk-mib 1): rows per
         * chunk 1 MiB / (Vp * 2), rounded down to 64 from 64 up; N not a
         * multiple of the chunk, V below the padded Vp */
        struct backend *full_gpu = gpu;
        gpu = gpu_chunk;
        /* one chunk */
        test_classifier(64, 64, 250, 256);
        if (!quick) test_classifier(300, 128, 1000, 1024);
        test_classifier_chunked(16, 64, 70000, 70016, 7);                 /* 7 + 7 + 2 rows */
        test_classifier_chunked(300, 64, 2500, 2560, 192);                /* 192 + 108 */
        if (!quick) test_classifier_chunked(1000, 128, 4000, 4096, 128);  /* 7 x 128 + 104 */
        if (!quick) test_classifier_chunked(300, 128, 128000, 128256, 4); /* a Llama 3 vocabulary */
        /* tensor-parallel pieces, chunked the same way (20 rows of 25152) */
        test_classifier_vp(64, 64, 25000, 25152);
        if (!quick) test_classifier_vp(300, 128, 25088, 25152);
        gpu = full_gpu;
    }
    test_optim(1000);
    if (!quick) test_optim(1 << 20);
    test_fused(64, 128, 256);
    if (!quick) test_fused(256, 768, 3072);
    test_blas_tune(64, 128, 256);
    if (!quick) test_blas_tune(1024, 768, 3072);
done:

    backend_free(gpu_noskip);
    backend_free(gpu_chunk);
    backend_free(gpu_scalar);
    backend_free(gpu_cudnn);
    backend_free(gpu);
    backend_free(cpu);
    printf("%d of %d checks passed\n", checks - failures, checks);
    return failures ? 1 : 0;
}
