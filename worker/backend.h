/* Backend: the compute interface of the training engine.
 *
 * The model code (worker/model.c) drives every layer through a struct of
 * function pointers plus an opaque context, so the same forward/backward/
 * optimizer sequence runs on the CPU backend (worker/cpu/, fp32 reference)
 * and the CUDA backend (worker/cuda/, bf16). docs/internals/engine.md
 * describes the contract in prose; the comments here are the reference.
 *
 * Element types
 * - "compute" dtype (b->dtype, b->elt_size bytes): parameters, gradients and
 *   activations. CPU: fp32 (4). CUDA: bf16 (2). Model code never assumes an
 *   element size: it offsets device pointers with backend_at().
 * - fp32 always: master weights, AdamW moments, LayerNorm/RMSNorm statistics
 *   (mean, rstd), attention log-sum-exp, per-token losses, norm accumulators.
 * - int32 always: token ids and targets.
 * When b->dtype is fp32 the engine may pass the parameter buffer as its own
 * master (master == param in adamw); the backend must handle that alias.
 *
 * Layouts (all row-major, N = B*T rows, row r is batch r / T, position r % T)
 * - activations [N, C]; linear weights W [OC, IC] (out = in @ W^T + b, the
 *   nn.Linear / llm.c order); biases [OC]; norm weights [C].
 * - qkv [N, (NH + 2*NKV) * HD]: per row the NH query heads, then NKV key heads,
 *   then NKV value heads, each head HD contiguous values (GPT-2 c_attn and
 *   Llama q_proj|k_proj|v_proj stacked in that order).
 * - attention output [N, NH * HD] (head-major within a row).
 * - SwiGLU input [N, 2F]: per row gate (F values) then up (F values); output
 *   [N, F] = silu(gate) * up.
 * - RoPE: Hugging Face "rotate_half" convention: within a head, element d is
 *   paired with d + HD/2 (d < HD/2), angle pos * theta^(-2d/HD).
 *
 * Gradients: every *_bwd ACCUMULATES (+=) into every gradient output it is
 * given (input gradients and parameter gradients alike); the caller zeroes a
 * buffer before its first use. The only exception is rope_bwd, which
 * transforms the gradient in place. Forward outputs are OVERWRITTEN. A
 * gradient output passed as NULL is not computed (e.g. dbias for a layer
 * without bias). Outputs never alias inputs unless stated.
 *
 * Threads: one thread (the engine thread that created the backend) makes
 * every call. Backends may use threads internally (OpenMP on the CPU) and may
 * run calls asynchronously in issue order (a CUDA stream); download() and
 * sync() return only when all earlier work is done. upload() returns when its
 * host source may be reused. Results must be deterministic run to run for the
 * same shapes and inputs (fixed reduction order).
 *
 * Errors: device code fails fast (prints file:line and exits) as STYLE.md
 * says for the worker; functions returning int return 0 or negative. */
#ifndef LOOM_WORKER_BACKEND_H
#define LOOM_WORKER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

enum backend_dtype { BACKEND_F32 = 0, BACKEND_BF16 = 1 };

/* Largest shapes the engine will use; passed once to reserve() so a backend
 * sizes its workspaces (attention scratch, classifier chunk) at start-up
 * instead of allocating during a step. */
struct backend_limits {
    int B;       /* micro-batch sequences */
    int T;       /* sequence length */
    int C;       /* d_model */
    int NH;      /* query heads (this tp rank) */
    int NKV;     /* key/value heads (this tp rank) */
    int HD;      /* head dim */
    int F;       /* MLP hidden width (this tp rank) */
    int Vp;      /* padded vocabulary rows held by this rank */
    int threads; /* CPU: OpenMP threads (0: library default); CUDA: ignored */
    /* 1: the classifier weight takes no gradient (a frozen base, LoRA): more
     * classifier row chunks then cost no extra dW traffic, so the cuda
     * backend takes smaller ones by default (less workspace) */
    int frozen_head;
};

/* Arguments of one AdamW update over a contiguous range of n elements. All
 * pointers already point at the range start. Update (t = step >= 1):
 *   g  = grad * grad_scale                  (grad_scale: clipping and averaging)
 *   m  = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
 *   mh = m / (1-beta1^t);        vh = v / (1-beta2^t)
 *   w  = master;  w -= lr * (mh / (sqrt(vh) + eps) + weight_decay * w)
 *   master = w;   param = (compute dtype) w
 * i.e. decoupled weight decay (torch.optim.AdamW). master may equal param when
 * dtype is fp32. Computed in fp32. */
struct backend_adamw {
    void *param;      /* compute dtype [n] (written) */
    float *master;    /* fp32 [n] (read/written); == param allowed on fp32 */
    const void *grad; /* compute dtype [n] */
    float *m, *v;     /* fp32 [n] moments (read/written) */
    size_t n;
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int step; /* 1-based, for bias correction */
};

/* What a backend can do beyond the calls below, so that engine code asks
 * for a capability instead of comparing backend names. */
struct backend_caps {
    /* Device buffers that another process of the host can map (CUDA IPC)
     * and a compute stream to order copies after: the dp pair transport
     * (worker/nccl/dp_transport.h) can run on it. */
    int pair_transport;
    /* Its collectives run on the device (NCCL) and take uneven slices
     * without a staging buffer of the engine's: ZeRO reports no comm memory
     * by formula (worker/zero.c). */
    int device_collectives;
    /* Attention covers whole tiles of this many positions (0 or 1: any
     * count): a forward over a few tokens (scoring) pads up to it. */
    int attn_pos_multiple;
};

struct backend {
    const char *name; /* "cpu" or "cuda": for logs and reports only */
    struct backend_caps caps;
    enum backend_dtype dtype; /* compute dtype of params, grads, activations */
    size_t elt_size;          /* bytes per compute element */
    void *ctx;                /* opaque; passed as the first argument below */
    double peak_flops;        /* dense peak FLOP/s of one device in the compute dtype, for
                                 MFU (H200 bf16: 989e12); 0 when unknown (MFU reported null) */

    /* ---- life cycle and memory ---- */
    /* Size internal workspaces for the largest shapes; call once before any
     * layer call. Returns 0 or negative (out of memory). */
    int (*reserve)(void *ctx, const struct backend_limits *lim);
    /* Allocate `bytes` of device memory (64-byte aligned, uninitialised);
     * NULL on failure. The engine allocates its arenas (flat params, grads,
     * master, moments, activations) at start-up and frees them at exit. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p); /* accepts NULL */
    void (*zero)(void *ctx, void *p, size_t bytes);
    /* Host <-> device raw byte copies; download waits for earlier work. */
    void (*upload)(void *ctx, void *dst_dev, const void *src_host, size_t bytes);
    void (*download)(void *ctx, void *dst_host, const void *src_dev, size_t bytes);
    void (*copy)(void *ctx, void *dst_dev, const void *src_dev, size_t bytes);
    /* fp32 device values -> compute dtype (round to nearest even for bf16),
     * and back; dst and src may not alias unless dtype is fp32 (then a copy
     * or no-op when dst == src). */
    void (*from_f32)(void *ctx, void *dst, const float *src, size_t n);
    void (*to_f32)(void *ctx, float *dst, const void *src, size_t n);
    /* Wait for all issued work. */
    void (*sync)(void *ctx);
    /* Optional (NULL: nothing is held): issue the work the backend holds
     * back to fuse with a following call, without waiting (backend_flush). */
    void (*flush)(void *ctx);
    /* Release the backend and its workspaces (not the engine's allocations,
     * which the engine frees first). Accepts NULL ctx. */
    void (*destroy)(void *ctx);

    /* ---- layers (shapes in elements; pointers in compute dtype unless
     * stated) ---- */

    /* out[r,:] = wte[tokens[r],:] + (wpe ? wpe[r % T,:] : 0).
     * tokens int32 [B*T]; wte [Vp, C]; wpe [>=T, C] or NULL. */
    void (*embedding_fwd)(void *ctx, void *out, const int32_t *tokens, const void *wte,
                          const void *wpe, int B, int T, int C);
    /* dwte[tokens[r],:] += dout[r,:]; dwpe[r % T,:] += dout[r,:] (dwpe may be
     * NULL). Deterministic: each row of dwte summed in increasing r order
     * (or an order fixed for the shape). */
    void (*embedding_bwd)(void *ctx, void *dwte, void *dwpe, const void *dout,
                          const int32_t *tokens, int B, int T, int C);

    /* LayerNorm over the last dim: out = (x - mean) * rstd * w + b.
     * mean, rstd fp32 [N] (written, kept for backward); b may be NULL. */
    void (*layernorm_fwd)(void *ctx, void *out, float *mean, float *rstd, const void *inp,
                          const void *w, const void *b, int N, int C, float eps);
    /* dinp, dw, db accumulate; db may be NULL. */
    void (*layernorm_bwd)(void *ctx, void *dinp, void *dw, void *db, const void *dout,
                          const void *inp, const void *w, const float *mean, const float *rstd,
                          int N, int C);
    /* RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd fp32 [N]. */
    void (*rmsnorm_fwd)(void *ctx, void *out, float *rstd, const void *inp, const void *w, int N,
                        int C, float eps);
    void (*rmsnorm_bwd)(void *ctx, void *dinp, void *dw, const void *dout, const void *inp,
                        const void *w, const float *rstd, int N, int C);

    /* out [N, OC] = inp [N, IC] @ W[OC, IC]^T + bias[OC] (bias may be NULL). */
    void (*matmul_fwd)(void *ctx, void *out, const void *inp, const void *W, const void *bias,
                       int N, int IC, int OC);
    /* dinp [N, IC] += dout @ W; dW [OC, IC] += dout^T @ inp; dbias += sum_r
     * dout[r,:]. Any of dinp, dW, dbias may be NULL. */
    void (*matmul_bwd)(void *ctx, void *dinp, void *dW, void *dbias, const void *dout,
                       const void *inp, const void *W, int N, int IC, int OC);

    /* GELU, tanh approximation (GPT-2): out = 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))). */
    void (*gelu_fwd)(void *ctx, void *out, const void *inp, size_t n);
    void (*gelu_bwd)(void *ctx, void *dinp, const void *inp, const void *dout, size_t n);
    /* SwiGLU: inp [N, 2F] (gate | up), out [N, F] = gate * sigmoid(gate) * up. */
    void (*swiglu_fwd)(void *ctx, void *out, const void *inp, int N, int F);
    void (*swiglu_bwd)(void *ctx, void *dinp, const void *inp, const void *dout, int N, int F);

    /* RoPE in place on the first n_heads heads of each row of x [N, stride]
     * (stride in elements; heads of HD values start at column 0), position
     * of row r = r % T. Forward rotates by +angle; backward rotates a
     * gradient in place by -angle (the transpose), so dx overwrites dy. */
    void (*rope_fwd)(void *ctx, void *x, int N, int T, int stride, int n_heads, int HD,
                     float theta);
    void (*rope_bwd)(void *ctx, void *dx, int N, int T, int stride, int n_heads, int HD,
                     float theta);

    /* Causal self-attention with grouped-query heads (query head h uses
     * kv head h / (NH / NKV)), scale 1/sqrt(HD). qkv [B*T, (NH+2*NKV)*HD]
     * (layout above), out [B*T, NH*HD] (overwritten), lse fp32 [B, NH, T]
     * (written: log-sum-exp of each scaled score row, kept for backward).
     * No T x T buffer is part of the interface; a backend may use its reserved
     * workspace. */
    void (*attention_fwd)(void *ctx, void *out, float *lse, const void *qkv, int B, int T, int NH,
                          int NKV, int HD);
    /* dqkv [B*T, (NH+2*NKV)*HD] accumulates; needs the forward's qkv, out
     * and lse. */
    void (*attention_bwd)(void *ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                          const float *lse, int B, int T, int NH, int NKV, int HD);

    /* out = a + b (n elements; out may alias a or b). */
    void (*residual_fwd)(void *ctx, void *out, const void *a, const void *b, size_t n);
    /* dst += src (residual backward and general accumulation). */
    void (*accumulate)(void *ctx, void *dst, const void *src, size_t n);

    /* Fused classifier + softmax + cross-entropy over the padded vocabulary,
     * computed in row chunks so neither the full logits nor the probability
     * tensor is kept:
     *   logits[r,:] = inp[r,:] @ W^T   (W [Vp, C], the tied wte or lm_head)
     *   losses[r]   = logsumexp(logits[r, 0:V]) - logits[r, targets[r]]
     * columns V..Vp-1 (padding) are excluded from the softmax and get zero
     * gradient; a row with targets[r] < 0 is ignored (loss 0, no gradient).
     * losses fp32 [N] (overwritten). When dinp or dW is non-NULL the gradient
     * of  grad_scale * sum_r losses[r]  is ACCUMULATED into them
     * (dlogits = grad_scale * (softmax - onehot)). targets int32 [N]. */
    void (*classifier)(void *ctx, float *losses, void *dinp, void *dW, const void *inp,
                       const void *W, const int32_t *targets, int N, int C, int V, int Vp,
                       float grad_scale);

    /* ---- optimizer ---- */
    void (*adamw)(void *ctx, const struct backend_adamw *a);
    /* *acc (fp32, device) += sum of squares of grad[0..n), fp32 accumulation
     * in a fixed order. Call once per range; download acc once per step. */
    void (*sumsq)(void *ctx, float *acc, const void *grad, size_t n);
    /* x[0..n) *= s (compute dtype; e.g. scaling gradients). */
    void (*scale)(void *ctx, void *x, size_t n, float s);

    /* ---- tensor parallelism (worker/tp.c); optional: NULL on a backend
     * without it, and the model then refuses tp > 1 ---- */
    /* Vocabulary-parallel classifier over this rank's Vr rows of W [Vr, C],
     * of which the first Vv are real vocabulary (the rest padding, excluded).
     * targets int32 [N] are local row indices (< 0: the target is elsewhere or
     * the row is ignored). Chunked like classifier (no full logits kept).
     * lse_in == NULL: writes lse[r] = logsumexp(logits[r, 0:Vv]) (-inf when
     * Vv == 0) and tl[r] = logits[r, targets[r]] (0 when targets[r] < 0),
     * fp32 [N]. lse_in != NULL (fp32 [N], the log-sum-exp over the whole
     * vocabulary, +inf for an ignored row): ACCUMULATES the gradient
     * dlogits = grad_scale * (exp(logits - lse_in[r]) - onehot(targets[r]))
     * into dinp [N, C] and dW [Vr, C] (either may be NULL). */
    void (*classifier_vp)(void *ctx, float *lse, float *tl, void *dinp, void *dW, const void *inp,
                          const void *W, const int32_t *targets, const float *lse_in, int N, int C,
                          int Vv, int Vr, float grad_scale);

    /* ---- optional fusions: NULL on a backend without them, and the model
     * then makes the separate calls ---- */
    /* out [N, OC] = residual [N, OC] + inp [N, IC] @ W[OC, IC]^T + bias[OC]
     * (bias may be NULL): matmul_fwd then residual_fwd in one pass, without
     * the intermediate product. out may equal residual. */
    void (*matmul_residual_fwd)(void *ctx, void *out, const void *inp, const void *W,
                                const void *bias, const void *residual, int N, int IC, int OC);

    /* ---- optional: imported models and generation (worker/hf.c,
     * worker/hf_generate.c). NULL on a backend without them: the model then
     * refuses a config that needs rope_set_freqs, and generation refuses the
     * backend. ----
     * rope_set_freqs: from now on rope_fwd / rope_bwd / rope_at use
     * inv[0..half) (half = HD/2) as the inverse frequencies instead of
     * theta^(-2d/HD) (RoPE scaling, api/model.h); inv == NULL restores them.
     * 0 or negative (out of memory).
     * rope_at: rope_fwd on N rows of x [N, stride] whose positions are
     * pos0 + r (not r % T).
     * attention_decode: the attention of one new query row per head against
     * a cache of n rows: q [NH*HD] (the row's query heads), kv [n, 2*NKV*HD]
     * (per row the NKV key heads, then the NKV value heads; the new row's
     * own k|v included as row n-1), out [NH*HD] (overwritten); grouped-query
     * heads and scale as attention_fwd. */
    int (*rope_set_freqs)(void *ctx, const double *inv, int half);
    void (*rope_at)(void *ctx, void *x, int N, int stride, int n_heads, int HD, int pos0,
                    float theta);
    void (*attention_decode)(void *ctx, void *out, const void *q, const void *kv, int n, int NH,
                             int NKV, int HD);

    /* ---- optional: documents packed in a row (train.packing "document"). NULL on a backend
     * without it: the worker then refuses that packing. ----
     * set_doc_starts: from now on, until called with NULL, row r (of N = B*T) belongs to the
     * document that starts at position starts[r] of its sequence (starts[r] <= r % T, equal
     * along a document): embedding_fwd/bwd and rope_fwd/bwd use the position r % T -
     * starts[r], and attention_fwd/bwd let a query attend only to keys of its own document.
     * The array (host memory) is read, not copied, by every later call. */
    void (*set_doc_starts)(void *ctx, const int32_t *starts, int N);

    /* ---- optional: LoRA adapters (worker/lora.c). NULL on a backend
     * without them: lora_new refuses it. ----
     * axpy_2d: for r < rows, c < cols (compute dtype, fp32 arithmetic):
     *   dst[r*ldd + c] = (beta ? dst[r*ldd + c] : 0) + alpha * src[r*lds + c]
     * (a column range of a fused projection's output, or gathering one into
     * a contiguous buffer); dst and src do not overlap.
     * dropout: out[i] = lora_keep(seed, i, p) ? inp[i] / (1 - p) : 0 for
     * i < n (worker/lora_mask.h: the same mask on every backend, a pure
     * function of seed and i, so the backward regenerates it); out may equal
     * inp. */
    void (*axpy_2d)(void *ctx, void *dst, int ldd, const void *src, int lds, int rows, int cols,
                    float alpha, int beta);
    void (*dropout)(void *ctx, void *out, const void *inp, size_t n, float p, uint64_t seed);
    /* lora_gemm (optional; NULL: lora.c runs the per-adapter path above):
     * row-major C[m][n] (row stride ldc) = alpha * op(A) op(B) + beta * C,
     * op(A) [m][k] = A (ta = 0, A [m][k]) or A^T (ta = 1, A [k][m]), row
     * stride lda; op(B) [k][n] = B (tb = 0) or B^T (tb = 1, B [n][k]), row
     * stride ldb; compute dtype, fp32 accumulation, one rounding. */
    void (*lora_gemm)(void *ctx, int ta, int tb, int m, int n, int k, float alpha, const void *A,
                      int lda, const void *B, int ldb, float beta, void *C, int ldc);
    /* lora_drop_fwd / lora_drop_bwd / lora_drop_ws (optional, all three or
     * none; NULL: lora.c masks a copy of the input with dropout first): the
     * dropout of an adapter's input applied in registers, never written out.
     * x [N, in] row stride ldx, A [r, in] and dA contiguous, r <=
     * BACKEND_LORA_DROP_RMAX; element (n, c) of x is kept when
     * lora_keep(seed, n * mld + moff + c, p) (worker/lora_mask.h: dropout's
     * mask of the [N, mld] input x is columns moff .. moff + in of), and
     * drop(x) = kept ? x / (1 - p) : 0.
     * fwd: H[n*ldh + j] = alpha * sum_c drop(x)[n, c] A[j*in + c] (j < r); ws as
     * below (the forward may sum K ranges through it).
     * bwd: dA[j*in + c] += sum_n dH[n*ldh + j] drop(x)[n, c], and, dx not
     * NULL, dx[n*lddx + c] += (kept ? 1 / (1 - p) : 0) sum_j dH[n*ldh + j]
     * A[j*in + c]; ws: lora_drop_ws(ctx, N, in, r) bytes of backend memory.
     * fp32 arithmetic, deterministic (a fixed summation order). */
    void (*lora_drop_fwd)(void *ctx, void *H, int ldh, const void *x, int ldx, const void *A, int N,
                          int in, int r, float alpha, float p, uint64_t seed, size_t mld,
                          size_t moff, void *ws);
    void (*lora_drop_bwd)(void *ctx, void *dA, void *dx, int lddx, const void *dH, int ldh,
                          const void *x, int ldx, const void *A, int N, int in, int r, float p,
                          uint64_t seed, size_t mld, size_t moff, void *ws);
    size_t (*lora_drop_ws)(void *ctx, int N, int in, int r);
    /* nf4_dequant (optional; train.quantize_base "nf4", worker/nf4.h): out
     * [n] (compute dtype) = the n weights of q, one tensor in the format of
     * worker/nf4_format.h (backend memory): nf4_dequantize's fp32 values,
     * rounded once to the compute dtype. */
    void (*nf4_dequant)(void *ctx, void *out, const void *q, size_t n);
    /* nf4_dequant_absmax (optional; an NF4 tp shard of the ABSMAX layout,
     * worker/nf4_format.h): out [n] = nf4_dequantize_absmax's fp32 values
     * of q, rounded once to the compute dtype. */
    void (*nf4_dequant_absmax)(void *ctx, void *out, const void *q, size_t n);

    /* ---- optional: host memory and asynchronous copies (optimizer offload,
     * worker/offload.h). NULL on a backend without them (the CPU backend,
     * whose "device" memory is host memory): the caller then uses malloc and
     * the synchronous upload / download. ----
     * host_alloc: `bytes` of page-locked host memory that the device copies
     * to and from at full speed (cudaHostAlloc); NULL on failure (the caller
     * may fall back to malloc). host_free releases it (NULL ok).
     * d2h_async / h2d_async: copy `bytes` between device and host on the
     * backend's copy streams (one per direction, so the two overlap), ordered
     * AFTER all work issued so far on the compute stream (held-back work is
     * issued first); return a ticket (> 0). The host buffer must not be
     * touched (h2d: rewritten; d2h: read) until wait(ticket) returned.
     * Copies of one direction complete in issue order; tickets increase.
     * wait: block the host until the copy with that ticket is done (0: no-op).
     * copy_fence: compute-stream work issued after it waits for every copy
     * issued so far, both directions (no host stall). sync() does NOT wait for
     * these copies. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    uint64_t (*d2h_async)(void *ctx, void *dst_host, const void *src_dev, size_t bytes);
    uint64_t (*h2d_async)(void *ctx, void *dst_dev, const void *src_host, size_t bytes);
    void (*wait)(void *ctx, uint64_t ticket);
    void (*copy_fence)(void *ctx);
    /* host_register: page-lock `bytes` of existing host memory at p (mapped,
     * ideally already touched) for the async copies; 0, or -1 (nothing
     * locked). Thread-safe: the offload registers pieces from several
     * threads at once. host_unregister undoes one registration (by its p). */
    int (*host_register)(void *ctx, void *p, size_t bytes);
    void (*host_unregister)(void *ctx, void *p);

    /* ---- optional: FP8 linear layers (train.precision "fp8";
     * docs/engine.md "FP8"). NULL on a backend without them (the CPU
     * backend): the worker refuses fp8 there. ----
     * fp8_freeze: put the linear weight W [OC, IC] (compute dtype) on the
     * E4M3 path. From then on matmul_fwd and matmul_residual_fwd with this
     * W, and matmul_bwd with this W, run their GEMMs in E4M3 (the input X and
     * the output gradient dY quantized per call with their own per-tensor
     * scales; the input gradient through W8^T [IC, OC]) where the shapes
     * allow (N, IC, OC multiples of 16), else as before. wgrad = 0 (a frozen
     * weight): the E4M3 copies W8 [OC, IC] and W8^T are made now from W's
     * current values, one per-tensor scale, 2 bytes a weight of backend
     * memory; W must not change afterwards (the copies would be stale; call
     * again to remake them). wgrad = 1 (a trained weight): nothing is kept,
     * W8 or W8^T is made from W's current values at each use, and the weight
     * gradient dW += dY^T X runs in E4M3 too (from transposed E4M3 copies of
     * dY and X); the buffers for these are made here. 0 done, 1 not taken
     * (shape, or the fp8 tuning row off: W stays on the compute-dtype path),
     * negative out of memory.
     * handle (frozen weights only; NULL: as above): the backend keeps W8
     * alone, 1 byte a weight, with W8^T made from it at each input-gradient
     * GEMM, and keeps no reference to W: the caller may free W after the
     * call, and from then on passes *handle (a device address the backend
     * owns, set here) where it passed W. Every call with *handle, E4M3 path
     * or not, computes with W8's values (a GEMM the E4M3 path does not take
     * runs in bf16 on W8 dequantized into a workspace). Called again with
     * *handle already set, W8 and its scale are made again from W. */
    int (*fp8_freeze)(void *ctx, const void *W, int OC, int IC, int wgrad, void **handle);
};

/* The largest adapter rank lora_drop_fwd / lora_drop_bwd take. */
#define BACKEND_LORA_DROP_RMAX 64

/* Pointer `elems` compute elements past `base` (device pointers are plain
 * addresses on every backend, so this is host arithmetic). */
static inline void *backend_at(const struct backend *b, const void *base, size_t elems) {
    return (char *)base + elems * b->elt_size;
}

/* Constructors. The caller owns the result; backend_free releases it.
 * threads: OpenMP threads for the CPU backend (0: OMP default). Returns NULL
 * with a message logged on failure. */
struct backend *backend_cpu_new(int threads);
/* The same with the tuning rows given (worker/tuning.h; NULL: their
 * defaults); backend_cpu_new reads them from the environment through the
 * config table, for tests and benches. loom-worker passes what it parsed. */
struct cpu_tuning;
struct backend *backend_cpu_new_tuned(int threads, const struct cpu_tuning *t);
/* Kernel set a CPU backend uses: "avx2" or "baseline" (LOOM_CPU_ISA=baseline
 * forces the latter; both give identical results). */
const char *backend_cpu_isa(const struct backend *b);
/* Implemented in worker/cuda/ (only built with CUDA; LOOM_HAVE_CUDA defined).
 * device: CUDA ordinal within CUDA_VISIBLE_DEVICES. */
struct backend *backend_cuda_new(int device);
/* The same with the CUDA tuning rows given (worker/tuning.h; NULL: their
 * defaults); backend_cuda_new (worker/backend.c) reads them from the
 * environment through the config table, for tests and benches. */
struct cuda_tuning;
struct backend *backend_cuda_new_tuned(int device, const struct cuda_tuning *t);
void backend_free(struct backend *b); /* calls b->destroy(b->ctx), frees b; NULL ok */
/* b->flush when the backend has one. */
static inline void backend_flush(struct backend *b) {
    if (b->flush) b->flush(b->ctx);
}

#endif
