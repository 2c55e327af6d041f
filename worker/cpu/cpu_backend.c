/* CPU backend: the struct backend table, memory, and the optimizer
 * primitives (AdamW, sum of squares, scale) in fp32 with OpenMP.
 *
 * Device memory is host memory (64-byte aligned). The backend is the fp32
 * reference the CUDA backend is checked against; it is also what tests and
 * small runs train on. Layer kernels live in cpu_nn.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/cpu/cpu.h"
#include "worker/tuning.h"

#define CX ((struct cpu_ctx *)ctx)

/* Rows of logits per classifier chunk (fixed: results must not depend on
 * anything but the shapes). */
#define CLS_CHUNK 64
/* Elements per sum-of-squares partial. */
#define SUMSQ_CHUNK 16384

static void *cpu_alloc(void *ctx, size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (!p) log_error("cpu backend: out of memory allocating %zu bytes", bytes);
    return p;
}

static void cpu_free(void *ctx, void *p) {
    free(p);
}

static void cpu_zero(void *ctx, void *p, size_t bytes) {
    memset(p, 0, bytes);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (dst != src) memmove(dst, src, bytes);
}

static void cpu_sync(void *ctx) {}

static void cpu_from_f32(void *ctx, void *dst, const float *src, size_t n) {
    cpu_copy(ctx, dst, src, n * sizeof(float));
}

static void cpu_to_f32(void *ctx, float *dst, const void *src, size_t n) {
    cpu_copy(ctx, dst, src, n * sizeof(float));
}

static int cpu_reserve(void *ctx, const struct backend_limits *lim) {
    struct cpu_ctx *cx = CX;
    free(cx->attn_scratch);
    free(cx->logits);
    cx->lim = *lim;
    if (lim->threads > 0) cx->nt = lim->threads;
    int rows = lim->B * lim->T;
    cx->cls_chunk = CLS_CHUNK;
    cx->attn_scratch = malloc((size_t)cx->nt * 2 * (lim->T > 0 ? lim->T : 1) * sizeof(float));
    cx->logits = malloc((size_t)CLS_CHUNK * (lim->Vp > 0 ? lim->Vp : 1) * sizeof(float));
    if (!cx->attn_scratch || !cx->logits) {
        log_error("cpu backend: out of memory reserving workspaces (rows=%d Vp=%d)", rows, lim->Vp);
        return -1;
    }
    return 0;
}

static void cpu_residual_fwd(void *ctx, void *out_, const void *a_, const void *b_, size_t n) {
    float *out = out_;
    const float *a = a_, *b = b_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n)) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static void cpu_accumulate(void *ctx, void *dst_, const void *src_, size_t n) {
    float *dst = dst_;
    const float *src = src_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n)) schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static void cpu_adamw(void *ctx, const struct backend_adamw *a) {
    float *param = a->param, *master = a->master, *m = a->m, *v = a->v;
    const float *grad = a->grad;
    float b1 = a->beta1, b2 = a->beta2;
    float c1 = 1.0f - powf(b1, (float)a->step), c2 = 1.0f - powf(b2, (float)a->step);
    float lr = a->lr, eps = a->eps, wd = a->weight_decay, gs = a->grad_scale;
    size_t n = a->n;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n * 8)) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mh = mi / c1, vh = vi / c2;
        float w = master[i];
        w -= lr * (mh / (sqrtf(vh) + eps) + wd * w);
        master[i] = w;
        param[i] = w;
    }
}

static void cpu_sumsq(void *ctx, float *acc, const void *grad_, size_t n) {
    struct cpu_ctx *cx = CX;
    const float *g = grad_;
    size_t nc = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nc > cx->partials_n) {
        double *p = realloc(cx->partials, nc * sizeof *p);
        if (!p) die("cpu backend: out of memory (sumsq partials %zu)", nc);
        cx->partials = p;
        cx->partials_n = nc;
    }
    double *part = cx->partials;
#pragma omp parallel for num_threads(cx->nt) if (CPU_PAR(cx, n)) schedule(static)
    for (size_t c = 0; c < nc; c++) {
        size_t i0 = c * SUMSQ_CHUNK, i1 = i0 + SUMSQ_CHUNK < n ? i0 + SUMSQ_CHUNK : n;
        double s = 0;
        for (size_t i = i0; i < i1; i++)
            s += (double)g[i] * g[i];
        part[c] = s;
    }
    double s = 0;
    for (size_t c = 0; c < nc; c++)
        s += part[c];
    *acc += (float)s;
}

static void cpu_scale(void *ctx, void *x_, size_t n, float s) {
    float *x = x_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n)) schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static void cpu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    cpu_copy(ctx, dst, src, bytes);
}

static void cpu_download(void *ctx, void *dst, const void *src, size_t bytes) {
    cpu_copy(ctx, dst, src, bytes);
}

static void cpu_destroy(void *ctx) {
    struct cpu_ctx *cx = CX;
    if (!cx) return;
    free(cx->attn_scratch);
    free(cx->logits);
    free(cx->rope_tab);
    free(cx->rope_inv);
    free(cx->partials);
    free(cx);
}

struct backend *backend_cpu_new_tuned(int threads, const struct cpu_tuning *t) {
    struct backend *b = calloc(1, sizeof *b);
    struct cpu_ctx *cx = calloc(1, sizeof *cx);
    if (!b || !cx) {
        free(b);
        free(cx);
        log_error("cpu backend: out of memory");
        return NULL;
    }
    cx->k = cpu_kernels_select(t ? t->isa : NULL);
    cx->par_min = t ? (size_t)t->par_min : CPU_PAR_MIN_DEFAULT;
#ifdef _OPENMP
    cx->nt = threads > 0 ? threads : omp_get_max_threads();
#else
    cx->nt = 1;
#endif
    *b = (struct backend){
        .name = "cpu",
        .dtype = BACKEND_F32,
        .elt_size = sizeof(float),
        .ctx = cx,
        .reserve = cpu_reserve,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .zero = cpu_zero,
        .upload = cpu_upload,
        .download = cpu_download,
        .copy = cpu_copy,
        .from_f32 = cpu_from_f32,
        .to_f32 = cpu_to_f32,
        .sync = cpu_sync,
        .destroy = cpu_destroy,
        .embedding_fwd = cpu_embedding_fwd,
        .embedding_bwd = cpu_embedding_bwd,
        .layernorm_fwd = cpu_layernorm_fwd,
        .layernorm_bwd = cpu_layernorm_bwd,
        .rmsnorm_fwd = cpu_rmsnorm_fwd,
        .rmsnorm_bwd = cpu_rmsnorm_bwd,
        .matmul_fwd = cpu_matmul_fwd,
        .matmul_bwd = cpu_matmul_bwd,
        .gelu_fwd = cpu_gelu_fwd,
        .gelu_bwd = cpu_gelu_bwd,
        .swiglu_fwd = cpu_swiglu_fwd,
        .swiglu_bwd = cpu_swiglu_bwd,
        .rope_fwd = cpu_rope_fwd,
        .rope_bwd = cpu_rope_bwd,
        .attention_fwd = cpu_attention_fwd,
        .attention_bwd = cpu_attention_bwd,
        .residual_fwd = cpu_residual_fwd,
        .accumulate = cpu_accumulate,
        .classifier = cpu_classifier,
        .adamw = cpu_adamw,
        .sumsq = cpu_sumsq,
        .scale = cpu_scale,
        .classifier_vp = cpu_classifier_vp,
        .rope_set_freqs = cpu_rope_set_freqs,
        .rope_at = cpu_rope_at,
        .attention_decode = cpu_attention_decode,
        .set_doc_starts = cpu_set_doc_starts,
        .axpy_2d = cpu_axpy_2d,
        .dropout = cpu_dropout,
        .nf4_dequant = cpu_nf4_dequant,
        .nf4_dequant_absmax = cpu_nf4_dequant_absmax,
    };
    return b;
}

const char *backend_cpu_isa(const struct backend *b) {
    return ((const struct cpu_ctx *)b->ctx)->k->name;
}

struct backend *backend_cpu_new(int threads) {
    struct worker_tuning t;
    if (worker_tuning_from_env(&t) != 0) {
        worker_tuning_free(&t);
        return NULL;
    }
    struct backend *b = backend_cpu_new_tuned(threads, &t.cpu);
    worker_tuning_free(&t);
    return b;
}
