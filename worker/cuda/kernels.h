/* CUDA kernels of the training step, callable from C.
 *
 * Storage conventions (shared with the cpu reference backend):
 * - Activations and weights are bf16 (passed as `lbf16`, the raw 16-bit
 *   pattern); every reduction and matmul accumulates in fp32.
 * - Gradients (of activations and of parameters) are bf16 and are
 *   accumulated (+=) unless said otherwise; master weights and AdamW moments
 *   are fp32 (worker/backend.h's contract).
 * - Row-major tensors; linear weights are [out, in] (api/model.h), so a
 *   linear layer computes out[N][OC] = inp[N][IC] . W[OC][IC]^T + bias[OC].
 * - Attention works in place on the fused qkv layout: q, k and v are rows of
 *   a [B*T][row_stride] array, head h at columns h*hd (kv head h/(H/Hkv)).
 * All functions enqueue work on `s` and return at once; pointers are device
 * pointers unless said otherwise. Every kernel is deterministic (fixed
 * reduction order, no float atomics), so a resumed run repeats bit for bit.
 * Scratch buffers are sized by the *_scratch_bytes helpers. */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "worker/cuda/cuda_util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t lbf16;

/* cuBLASLt handle + workspace, bound to one stream. Created at start-up.
 * tune (the blas-tune row, LOOM_BLAS_TUNE=1): time up to 8 heuristic
 * algorithms the first time each GEMM configuration is met and keep the
 * fastest; algo_cache (blas-algo-cache, LOOM_BLAS_ALGO_CACHE; NULL or "":
 * none): a table of those choices, read instead of timing when the file
 * exists, written when tuning (copied). k_linear.cu's top comment has the
 * details. Default: the heuristic's first algorithm. */
struct lk_blas;
struct lk_blas *lk_blas_new(lcuda_stream s, struct lcuda_arena *arena, int tune,
                            const char *algo_cache);
void lk_blas_free(struct lk_blas *b); /* accepts NULL */
/* How the handle's algorithms were chosen so far (tests, logs). */
struct lk_blas_stats {
    int configs;    /* GEMM configurations cached */
    int tuned;      /* of which decided by the tuner (timed; #0 where unsafe to time) */
    int from_table; /* of which read from LOOM_BLAS_ALGO_CACHE */
    int not_first;  /* tuned or read choices other than the heuristic's #0 */
    double tune_ms; /* host time spent timing candidates */
};
void lk_blas_get_stats(const struct lk_blas *b, struct lk_blas_stats *st);

/* ---- linear layers (cuBLASLt) ---- */
/* out = inp . W^T (+ bias). With gelu=1: pre_gelu (may not be NULL) receives
 * inp . W^T + bias and out = gelu_tanh(pre_gelu) (fused epilogue). `acc`,
 * when not NULL, is added (out = acc + inp . W^T + bias; acc may equal out):
 * the residual add fused into the matmul. */
void lk_linear_fwd(struct lk_blas *b, lbf16 *out, lbf16 *pre_gelu, const lbf16 *inp, const lbf16 *w,
                   const lbf16 *bias, const lbf16 *acc, int N, int IC, int OC, int gelu);
/* dinp (+)= dout . W (accumulate=1 adds into dinp). When pre_gelu is not
 * NULL (the layer's input was gelu(pre_gelu)), the product is multiplied by
 * gelu'(pre_gelu), the gradient w.r.t. pre_gelu (not with accumulate). */
void lk_linear_bwd_data(struct lk_blas *b, lbf16 *dinp, const lbf16 *dout, const lbf16 *w,
                        const lbf16 *pre_gelu, int N, int IC, int OC, int accumulate);
/* dw (may be NULL) += dout^T . inp; dbias (may be NULL) += column sums of
 * dout (fp32 sums, one bf16 rounding). `scratch` holds
 * lk_bias_scratch_bytes(N, OC) bytes. */
void lk_linear_bwd_weight(struct lk_blas *b, lbf16 *dw, lbf16 *dbias, float *scratch,
                          const lbf16 *dout, const lbf16 *inp, int N, int IC, int OC);
size_t lk_bias_scratch_bytes(int N, int OC);
/* Row-major C[m][n] (row stride ldc) = alpha * op(A) op(B) + beta * C, bf16
 * operands, fp32 accumulation: op(A) [m][k] is A [m][k] (ta = 0) or the
 * transpose of A [k][m] (ta = 1), row stride lda; op(B) [k][n] likewise
 * (tb = 1: B [n][k]). Any strides: the LoRA adapters read and write column
 * ranges of the fused projections in place (backend.h lora_gemm). */
void lk_gemm_rm(struct lk_blas *b, int ta, int tb, int m, int n, int k, float alpha, const lbf16 *A,
                int lda, const lbf16 *B, int ldb, float beta, lbf16 *C, int ldc);

/* ---- normalisation ---- */
/* rms=0: LayerNorm (w, bias); rms=1: RMSNorm (w only, bias NULL).
 * out = norm(x); mean (LayerNorm only) and rstd are saved, fp32 [N]. */
void lk_norm_fwd(lbf16 *out, float *mean, float *rstd, const lbf16 *x, const lbf16 *w,
                 const lbf16 *bias, int N, int C, float eps, int rms, lcuda_stream s);
/* Fused residual + norm: res = a + b (written), out = norm(res). */
void lk_residual_norm_fwd(lbf16 *res, lbf16 *out, float *mean, float *rstd, const lbf16 *a,
                          const lbf16 *b, const lbf16 *w, const lbf16 *bias, int N, int C,
                          float eps, int rms, lcuda_stream s);
/* dx += dnorm/dx . dout; dw, dbias += (any may be NULL; dbias NULL for rms).
 * scratch: lk_norm_scratch_bytes(N, C). */
void lk_norm_bwd(lbf16 *dx, lbf16 *dw, lbf16 *dbias, float *scratch, const lbf16 *dout,
                 const lbf16 *x, const lbf16 *w, const float *mean, const float *rstd, int N, int C,
                 int rms, lcuda_stream s);
size_t lk_norm_scratch_bytes(int N, int C);
/* The norm kernels are one generation (k_norm.cu); the others measured are
 * in dev/cuda/dev_kernels.h (dev_norm_*). */

/* ---- elementwise ---- */
void lk_gelu_fwd(lbf16 *out, const lbf16 *inp, size_t n, lcuda_stream s);
/* dinp (+)= gelu'(inp) * dout (accumulate=1 adds). */
void lk_gelu_bwd(lbf16 *dinp, const lbf16 *inp, const lbf16 *dout, size_t n, int accumulate,
                 lcuda_stream s);
/* out = silu(gate) * up, elementwise; rows of F, gate and up with their own
 * row strides (elements) so a fused [N][2F] projection can be used in place.
 * fast = 1: 16-byte vector kernels where F, ld_in and the pointers allow
 * (the elem-vec row), else one element per thread. */
void lk_swiglu_fwd(lbf16 *out, const lbf16 *gate, const lbf16 *up, int N, int F, int ld_in,
                   int fast, lcuda_stream s);
void lk_swiglu_bwd(lbf16 *dgate, lbf16 *dup, const lbf16 *dout, const lbf16 *gate, const lbf16 *up,
                   int N, int F, int ld_in, int accumulate, int fast, lcuda_stream s);
/* Rotary embedding in place (rotate-half convention of Llama / Hugging Face:
 * pairs (i, i + hd/2), angle pos * inv_i, pos = row % T, inv_i =
 * theta^(-2i/hd), or inv[i] (device, fp32) when inv is not NULL: RoPE
 * scaling). x rows of `ld` elements, n_heads heads of hd at columns h*hd.
 * inverse=1 rotates by -angle (the backward pass). One thread per pair. */
void lk_rope(lbf16 *x, int N, int T, int n_heads, int hd, int ld, float theta, const float *inv,
             int inverse, lcuda_stream s);
/* The cos / sin table of lk_rope_tab: tab [2][T][half] fp32 from the device
 * inverse frequencies inv[half] (fp64 angles). */
void lk_rope_table(float *tab, const double *inv, int T, int half, lcuda_stream s);
/* lk_rope with the table's cos / sin, 8 pairs per thread in 16-byte vectors;
 * -1 (nothing launched) unless hd % 16 == 0, ld % 8 == 0 and x and tab are
 * 16-byte aligned. T: the table's rows (positions row % T). */
int lk_rope_tab(lbf16 *x, const float *tab, int N, int T, int n_heads, int hd, int ld, int inverse,
                lcuda_stream s);
void lk_add(lbf16 *out, const lbf16 *a, const lbf16 *b, size_t n, lcuda_stream s);
/* dst += src; x *= sc. */
void lk_accumulate(lbf16 *dst, const lbf16 *src, size_t n, lcuda_stream s);
void lk_scale(lbf16 *x, size_t n, float sc, lcuda_stream s);

/* ---- embeddings ---- */
/* out[b*T+t] = wte[tok] + (wpe ? wpe[t] : 0). */
void lk_embed_fwd(lbf16 *out, const int32_t *tokens, const lbf16 *wte, const lbf16 *wpe, int N,
                  int T, int C, lcuda_stream s);
/* Deterministic embedding backward. `order` holds the N row indices sorted by
 * token (stable), `starts` the n_uniq+1 bucket starts into order and `uniq`
 * the token of each bucket (built on the host by lk_embed_buckets). dwte and
 * dwpe (dwpe may be NULL) +=; each dwte row is summed in increasing row order. */
void lk_embed_bwd(lbf16 *dwte, lbf16 *dwpe, const lbf16 *dout, const int32_t *order,
                  const int32_t *starts, const int32_t *uniq, int n_uniq, int N, int T, int C,
                  lcuda_stream s);
/* The embedding gradient in two halves, for exchanging it between ranks:
 * rows[u][C] = the sum of token uniq[u]'s dout rows (compact, stored), and
 * dwte[uniq[u]] += rows[u] for u < n_rows, skipping uniq[u] < 0 (padding). */
void lk_embed_rows(lbf16 *rows, const lbf16 *dout, const int32_t *order, const int32_t *starts,
                   int n_uniq, int C, lcuda_stream s);
void lk_embed_scatter_add(lbf16 *dwte, const lbf16 *rows, const int32_t *uniq, int n_rows, int C,
                          lcuda_stream s);
/* Host helper: fill order[N], starts[N+1], uniq[N] from host tokens[N];
 * returns n_uniq. */
int lk_embed_buckets(const int32_t *tokens, int N, int32_t *order, int32_t *starts, int32_t *uniq);

/* ---- generation and imported models (k_decode.cu) ---- */
/* lk_rope with row r at position pos0 + (T > 0 ? r % T : r), and with the
 * inverse frequencies inv[0..hd/2) (device fp32; RoPE scaling) instead of
 * theta^(-2i/hd) when inv is not NULL. With inv NULL, T > 0 and pos0 0 it
 * gives lk_rope's bits. */
void lk_rope_ex(lbf16 *x, int N, int T, int pos0, int n_heads, int hd, int ld, float theta,
                const float *inv, int inverse, lcuda_stream s);
/* One new query row per head against a key/value cache of n >= 1 rows:
 * q [H*hd], kv [n][2*Hkv*hd] (per row the Hkv key heads, then the Hkv value
 * heads), out [H*hd] = softmax(q k^T / sqrt(hd)) v per head (kv head
 * h / (H / Hkv)). hd <= LK_DECODE_MAX_HD; fp32 scores and sums, bf16 out.
 * scratch: lk_attn_decode_scratch_bytes(H, hd) (any n). */
#define LK_DECODE_MAX_HD    256
#define LK_DECODE_MAX_SPLIT 64
void lk_attn_decode(lbf16 *out, float *scratch, const lbf16 *q, const lbf16 *kv, int n, int H,
                    int Hkv, int hd, lcuda_stream s);
size_t lk_attn_decode_scratch_bytes(int H, int hd);

/* ---- attention (flash-style, causal, never materialises T x T) ---- */
/* out[N][ld_o] (head h at h*hd) = softmax(q k^T / sqrt(hd), causal) v;
 * lse[B][H][T] fp32 saves the log-sum-exp for the backward pass.
 * hd in {32, 64, 128}; T a multiple of 64. */
void lk_attn_fwd(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v, int ld_q,
                 int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd, lcuda_stream s);
/* Gradients dq, dk, dv in the layouts of q, k, v (accumulate=1 adds into
 * them, 0 overwrites). dk/dv of a kv head sum over its query heads in a fixed
 * order. scratch: lk_attn_scratch_bytes(B, T, H, Hkv, hd). */
void lk_attn_bwd(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                 const lbf16 *out, const float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                 int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd,
                 int accumulate, lcuda_stream s);
size_t lk_attn_scratch_bytes(int B, int T, int H, int Hkv, int hd);
/* Documents packed in a row (train.packing "document"): lk_attn_fwd / lk_attn_bwd
 * with doc_start [B*T] (device; the position in its sequence where each row's
 * document starts, non-decreasing along a sequence and <= the row's position):
 * a query attends to the keys of its own document only. skip = 1 leaves out the
 * tiles wholly outside every row's document (the attn-doc-skip row), 0 masks
 * them; the results are the same either way up to summation order. doc_start
 * NULL: the causal kernels. */
void lk_attn_fwd_doc(lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                     int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd,
                     const int32_t *doc_start, int skip, lcuda_stream s);
void lk_attn_bwd_doc(lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                     const lbf16 *out, const float *lse, const lbf16 *q, const lbf16 *k,
                     const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv,
                     int hd, int accumulate, const int32_t *doc_start, int skip, lcuda_stream s);
/* Positions within documents (k_doc.cu): row r (of N) at position r % T - doc_start[r].
 * lk_embed_fwd_doc: lk_embed_fwd with wpe at that position. lk_rope_doc: lk_rope at that
 * position, with cos / sin from lk_rope_table's tab [2][T][hd/2] when tab is not NULL (the
 * bits lk_rope_tab gives a row at the same position), else from inv (device fp32, or NULL for
 * theta^(-2i/hd)) as lk_rope computes them. */
void lk_embed_fwd_doc(lbf16 *out, const int32_t *tokens, const lbf16 *wte, const lbf16 *wpe,
                      const int32_t *doc_start, int N, int T, int C, lcuda_stream s);
void lk_rope_doc(lbf16 *x, const float *tab, const float *inv, float theta,
                 const int32_t *doc_start, int N, int T, int n_heads, int hd, int ld, int inverse,
                 lcuda_stream s);

/* ---- classifier + cross-entropy (fused) ---- */
/* logits [N][Vp] bf16 are replaced, row by row, by d loss / d logits =
 * (softmax - onehot(target)) * dscale (padding columns >= V set to 0);
 * losses[N] (fp32) = logsumexp - logit[target]. Rows whose target is < 0 get
 * loss 0 and zero gradient. No fp32 logits are written. */
void lk_xent_fwd_bwd(lbf16 *logits, float *losses, const int32_t *targets, int N, int V, int Vp,
                     float dscale, lcuda_stream s);
/* Vocabulary-parallel pieces (tensor parallelism; backend.h classifier_vp):
 * logits [N][Vr] bf16, of which the first Vv columns are real vocabulary.
 * stats: lse[r] = logsumexp(logits[r, 0:Vv]) (-inf when Vv == 0) and tl[r] =
 * logits[r, targets[r]] (0 when the local target is < 0 or >= Vv).
 * grad: logits replaced by dscale * (exp(logits - lse_in[r]) - onehot) over
 * the Vv columns, 0 on padding; a row with lse_in infinite gets 0.
 * Vr % 8 == 0. */
void lk_xent_vp_stats(const lbf16 *logits, float *lse, float *tl, const int32_t *targets, int N,
                      int Vv, int Vr, lcuda_stream s);
void lk_xent_vp_grad(lbf16 *logits, const float *lse_in, const int32_t *targets, int N, int Vv,
                     int Vr, float dscale, lcuda_stream s);
/* *out = sum of x[0..n) (fp32, fixed order). scratch: lk_sum_scratch_bytes. */
void lk_sum(float *out, const float *x, size_t n, float *scratch, lcuda_stream s);
size_t lk_sum_scratch_bytes(size_t n);

/* ---- optimiser ---- */
/* *acc += sum of squares of g[0..n) (fp32, fixed order). scratch:
 * lk_sum_scratch_bytes. fast = 1: 16-byte vector loads when g is aligned
 * (the elem-vec row; another fixed order). */
void lk_sumsq_acc(float *acc, const lbf16 *g, size_t n, float *scratch, int fast, lcuda_stream s);
/* Fused AdamW over one contiguous range (torch.optim.AdamW math, see
 * worker/backend.h): g = grad * grad_scale; moments and fp32 master updated,
 * bf16 param written. step is 1-based. */
void lk_adamw(lbf16 *param, float *master, const lbf16 *grad, float *m, float *v, size_t n,
              float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
              int step, lcuda_stream s);
/* Adjacent ranges updated in one launch: segment s covers
 * [end[s-1], end[s]) (end[-1] = 0) of the arrays and decays with wd[s]. */
#define LK_ADAMW_MAXSEG 256
struct lk_adamw_segs {
    int n;
    int64_t end[LK_ADAMW_MAXSEG];
    float wd[LK_ADAMW_MAXSEG];
};
void lk_adamw_multi(lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                    const struct lk_adamw_segs *segs, float lr, float beta1, float beta2, float eps,
                    float grad_scale, int step, lcuda_stream s);
/* (two quads a thread with streaming hints, 0.85 vs 0.90 ms for 124M
 * parameters on an H200 against the grid-stride variant, same bits; that
 * one is dev_adamw_multi in dev/cuda/dev_kernels.h) */
/* pbf = bf16(p), n elements. */
void lk_f32_to_bf16(lbf16 *dst, const float *src, size_t n, lcuda_stream s);
void lk_bf16_to_f32(float *dst, const lbf16 *src, size_t n, lcuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
