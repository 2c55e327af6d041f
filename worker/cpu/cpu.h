/* CPU backend internals shared by the worker/cpu sources (not for other folders).
 *
 * fp32 everywhere, OpenMP threads. Determinism rule: every output element is
 * computed by exactly one thread with a loop order fixed by the shapes (never
 * by the thread count), so 1 and 2 threads give the same bits. */
#ifndef LOOM_WORKER_CPU_CPU_H
#define LOOM_WORKER_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "worker/backend.h"

#ifdef _OPENMP
#include <omp.h>
static inline int cpu_thread_id(void) {
    return omp_get_thread_num();
}
#else
static inline int cpu_thread_id(void) {
    return 0;
}
#endif

/* Parallel regions run on one thread below par_min work (roughly flops; on
 * a busy 2-core machine a barrier costs more than a small kernel). The split
 * never changes results: each element is computed by one iteration. The
 * cpu-par-min tuning row (LOOM_CPU_PAR_MIN, worker/tuning.h) overrides the
 * default (tests set 0 to run every region threaded); it must equal this. */
#define CPU_PAR_MIN_DEFAULT (1u << 18)
#define CPU_PAR(c, work)    ((size_t)(work) >= (c)->par_min)

struct cpu_ctx {
    int nt;                      /* threads for every parallel region */
    size_t par_min;              /* least work for a threaded region */
    const struct cpu_kernels *k; /* micro-kernel set (LOOM_CPU_ISA) */
    struct backend_limits lim;
    float *attn_scratch; /* [nt, 2T] softmax rows per thread */
    float *logits;       /* [CLS_CHUNK, Vp] classifier chunk */
    int cls_chunk;       /* rows per classifier chunk */
    float *rope_tab;     /* [T, HD/2] cos then [T, HD/2] sin */
    int rope_T, rope_HD;
    float rope_theta;
    double *rope_inv; /* [HD/2] scaled inverse frequencies (rope_set_freqs), or NULL */
    int rope_half;
    const int32_t *doc_start; /* [N] document start per row (set_doc_starts), or NULL */
    double *partials;         /* sumsq chunk partials */
    size_t partials_n;
};

/* Micro-kernels (worker/cpu/cpu_gemm.c), one set per instruction set.
 * mm_nt: out[r, o] = dot(X[r, :], W[o, :]) + bias[o] for rows [r0, r1),
 *   all OC columns (X [.., IC], W [OC, IC], out [.., OC]; bias may be NULL).
 * mm_acc: C[m, j] += sum_k A[m*sam + k*sak] * B[k*ldb + j] for rows
 *   [m0, m1) and columns [0, J), k in [0, K) in increasing order.
 * xent_row: softmax cross-entropy of one logits row l[0..Vp): returns
 *   logsumexp(l[0..V)) - l[target]; with grads, l becomes
 *   grad_scale * (softmax - onehot) on [0, V) and 0 on the padding [V, Vp).
 * attn_fwd_row / attn_bwd_row: one causal attention row (query t of one
 *   head): k, v point at row 0 of the kv head, rows S apart; the forward's
 *   scratch p holds t+1 floats, the backward's 2*(t+1); the backward
 *   accumulates into dq [HD] and into dk, dv rows 0..t (stride S). */
struct cpu_kernels {
    const char *name; /* "avx2" or "baseline" */
    void (*mm_nt)(float *out, const float *X, const float *W, const float *bias, int r0, int r1,
                  int IC, int OC);
    void (*mm_acc)(float *C, size_t ldc, const float *A, size_t sam, size_t sak, const float *B,
                   size_t ldb, int m0, int m1, int J, int K);
    float (*xent_row)(float *l, int V, int Vp, int target, float grad_scale, int grads);
    void (*attn_fwd_row)(float *o, float *lse, const float *q, const float *k, const float *v,
                         size_t S, int t, int HD, float scale, float *p);
    void (*attn_bwd_row)(float *dq, float *dk, float *dv, const float *q, const float *k,
                         const float *v, const float *dy, const float *o, float lse, size_t S,
                         int t, int HD, float scale, float *p);
};

/* The set to use: "baseline" forces the baseline set; anything else (NULL,
 * "auto") picks AVX2 when the CPU supports it. Both give identical bits. */
const struct cpu_kernels *cpu_kernels_select(const char *isa);

/* Layer kernels (worker/cpu/cpu_nn.c); signatures as in struct backend. */
void cpu_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const void *wte,
                       const void *wpe, int B, int T, int C);
void cpu_embedding_bwd(void *ctx, void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                       int B, int T, int C);
void cpu_layernorm_fwd(void *ctx, void *out, float *mean, float *rstd, const void *inp,
                       const void *w, const void *b, int N, int C, float eps);
void cpu_layernorm_bwd(void *ctx, void *dinp, void *dw, void *db, const void *dout, const void *inp,
                       const void *w, const float *mean, const float *rstd, int N, int C);
void cpu_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *inp, const void *w, int N,
                     int C, float eps);
void cpu_rmsnorm_bwd(void *ctx, void *dinp, void *dw, const void *dout, const void *inp,
                     const void *w, const float *rstd, int N, int C);
void cpu_matmul_fwd(void *ctx, void *out, const void *inp, const void *W, const void *bias, int N,
                    int IC, int OC);
void cpu_matmul_bwd(void *ctx, void *dinp, void *dW, void *dbias, const void *dout, const void *inp,
                    const void *W, int N, int IC, int OC);
void cpu_gelu_fwd(void *ctx, void *out, const void *inp, size_t n);
void cpu_gelu_bwd(void *ctx, void *dinp, const void *inp, const void *dout, size_t n);
void cpu_swiglu_fwd(void *ctx, void *out, const void *inp, int N, int F);
void cpu_swiglu_bwd(void *ctx, void *dinp, const void *inp, const void *dout, int N, int F);
void cpu_rope_fwd(void *ctx, void *x, int N, int T, int stride, int n_heads, int HD, float theta);
void cpu_rope_bwd(void *ctx, void *dx, int N, int T, int stride, int n_heads, int HD, float theta);
void cpu_attention_fwd(void *ctx, void *out, float *lse, const void *qkv, int B, int T, int NH,
                       int NKV, int HD);
void cpu_attention_bwd(void *ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                       const float *lse, int B, int T, int NH, int NKV, int HD);
void cpu_classifier(void *ctx, float *losses, void *dinp, void *dW, const void *inp, const void *W,
                    const int32_t *targets, int N, int C, int V, int Vp, float grad_scale);
/* Imported models and generation (worker/cpu/cpu_decode.c; struct backend). */
int cpu_rope_set_freqs(void *ctx, const double *inv, int half);
void cpu_rope_at(void *ctx, void *x, int N, int stride, int n_heads, int HD, int pos0, float theta);
/* Documents packed in a row (struct backend's set_doc_starts; worker/cpu/cpu_nn.c). */
void cpu_set_doc_starts(void *ctx, const int32_t *starts, int N);
void cpu_attention_decode(void *ctx, void *out, const void *q, const void *kv, int n, int NH,
                          int NKV, int HD);
/* Angle of RoPE pair d at position t: t * theta^(-2d/HD), or t * rope_inv[d]
 * after rope_set_freqs (shared by the table and rope_at). */
double cpu_rope_angle(const struct cpu_ctx *cx, int t, int d, int HD, float theta);

/* Vocabulary-parallel classifier (worker/cpu/cpu_vocab.c; struct backend). */
void cpu_classifier_vp(void *ctx, float *lse, float *tl, void *dinp, void *dW, const void *inp,
                       const void *W, const int32_t *targets, const float *lse_in, int N, int C,
                       int Vv, int Vr, float grad_scale);

/* LoRA helpers (worker/cpu/cpu_lora.c; struct backend axpy_2d, dropout). */
void cpu_axpy_2d(void *ctx, void *dst, int ldd, const void *src, int lds, int rows, int cols,
                 float alpha, int beta);
void cpu_dropout(void *ctx, void *out, const void *inp, size_t n, float p, uint64_t seed);
/* NF4 base weights (worker/cpu/cpu_nf4.c; struct backend nf4_dequant). */
void cpu_nf4_dequant(void *ctx, void *out, const void *q, size_t n);
void cpu_nf4_dequant_absmax(void *ctx, void *out, const void *q, size_t n);

#endif
