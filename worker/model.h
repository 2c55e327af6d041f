/* Model: the GPT-2 / Llama transformer driven through the backend.
 *
 * Pre-norm blocks: x -> x + attn(norm1(x)) -> x + mlp(norm2(x)); final norm;
 * classifier (tied wte for gpt2, lm_head for llama) with fused softmax +
 * cross-entropy. Parameters and gradients live in the engine's flat buffers
 * (api/model.h layout); the model owns the activation buffers for one
 * micro-batch of B x T tokens, allocated once in model_new.
 *
 * One micro-step is model_forward (which also runs the classifier's fused
 * backward when asked) followed by model_backward. Gradients ACCUMULATE into
 * e->grads across micro-steps; the caller zeroes them once per step.
 * Only the engine thread calls these. */
#ifndef LOOM_WORKER_MODEL_H
#define LOOM_WORKER_MODEL_H

#include <stdint.h>

#include "worker/engine.h"

struct model_block_idx {
    int n1w, n1b;   /* norm1 weight, bias (-1 without) */
    int qkvw, qkvb; /* fused q|k|v weight [QKV, C] (llama: q_proj with k, v after it) */
    int aow, aob;   /* attention output projection */
    int n2w, n2b;
    int fcw, fcb; /* gpt2 c_fc [F, C]; llama gate_proj with up_proj after it [2F, C] */
    int mpw, mpb; /* MLP output projection [C, F] */
};

struct model_acts; /* per-layer saved activations (model.c) */
struct tp_state;   /* tensor-parallel embedding / loss buffers (worker/tp.h) */
struct lora;       /* LoRA adapters (worker/lora.h) */

/* Activation recompute (spec train.recompute; docs/parallelism.md):
 * NONE: every block keeps all its activations.
 * SELECTIVE: the norm outputs (n1, n2) and the MLP activation output
 *   (GELU / SwiGLU) are shared by all blocks and recomputed in backward from
 *   the kept inputs: cheap elementwise work for C + C + d_ff values per token
 *   per block. Attention keeps only its log-sum-exp already (no score matrix),
 *   so there is nothing quadratic to drop.
 * FULL: each block keeps only its output (the next block's input); backward
 *   re-runs the block's forward first (one extra forward, incl. its tp
 *   all-reduces). With keep > 0 (the budget mode) the first `keep` blocks
 *   are not recomputed and keep what SELECTIVE keeps. Recomputation runs the
 *   same kernels on the same inputs, so losses and gradients are
 *   bit-identical to NONE. */
enum model_recompute { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL };

struct model_opts {
    int B, T;      /* micro-batch shape */
    int threads;   /* CPU backend threads (0: default) */
    int recompute; /* enum model_recompute */
    /* with MODEL_RECOMPUTE_FULL: the first `keep` blocks of this stage are
     * not recomputed but keep what SELECTIVE keeps (their norms' outputs and
     * MLP activation are recomputed, elementwise, into buffers all blocks
     * share), the rest recompute in full (the budget mode, train.recompute
     * {"budget_gib": N}; 0: every block recomputes) */
    int keep;
    /* 1: no activations yet; model_alloc_acts makes them (after
     * model_fp8_freeze has freed the bf16 base, so that the peak is lower) */
    int acts_later;
};

struct model {
    struct engine *e; /* not owned */
    int B, T;         /* micro-batch shape */
    int C, NH, NKV, HD, F, QKV, V, Vp, L;
    int wte, wpe, nfw, nfb, head; /* tensor indices; -1 when absent */
    struct model_block_idx *blk;  /* [L] */
    struct model_acts *acts;
    int32_t *tokens, *targets; /* device int32 [B*T] */
    float *losses;             /* device fp32 [B*T] */
    float *host_losses;        /* host fp32 [B*T] */
    int has_grad;              /* last forward computed classifier gradients */
    /* Parallel place (from the engine). Blocks [l0, l1) are this pipeline
     * stage's; `first` runs the embeddings, `last` the final norm and head.
     * With tp > 1, NH, NKV, F, QKV and Vp above are this rank's share (V
     * stays the whole vocabulary). */
    int l0, l1, first, last;
    int recompute;       /* enum model_recompute */
    int keep;            /* with full recompute: blocks [l0, l0 + keep) recompute as selective */
    struct tp_state *tp; /* NULL when tp == 1 */
    /* LoRA adapters (worker/lora.h; not owned), NULL without. When set, the
     * base tensors are frozen: the backward computes no gradient for them. */
    struct lora *lora;
    /* 1 once model_fp8_freeze put the block weights on the E4M3 path; its
     * counts (*n_fp8, *bytes) */
    int fp8, fp8_n;
    size_t fp8_bytes;
    int acts_ready; /* model_alloc_acts done */
};

/* Build the model over engine `e` for micro-batches of B sequences of T
 * tokens (T <= cfg.seq_len): resolves tensor indices, reserves backend
 * workspaces and allocates activations (counted in e->mem.activations).
 * Any tp / pp place of the engine works: the model covers this rank's
 * pipeline stage and tp share (tp > 1 needs backend.classifier_vp).
 * Returns NULL on failure (logged). */
struct model *model_new(struct engine *e, int B, int T, int threads);
/* As model_new, with options (recompute). */
struct model *model_new_ex(struct engine *e, const struct model_opts *o);
void model_free(struct model *m); /* NULL ok */
/* The activations of a model made with model_opts.acts_later (counted in
 * e->mem.activations); nothing when they exist. Call before any forward. 0
 * or -1 (out of memory, logged). */
int model_alloc_acts(struct model *m);

/* Deterministic initialisation from `seed` (GPT-2 scheme: N(0, 0.02),
 * residual output projections N(0, 0.02/sqrt(2L)), norms 1, biases 0,
 * padded vocabulary rows 0). Each tensor draws from its own stream keyed by
 * (seed, tensor name), so the values do not depend on layout or tp. */
int model_init_params(struct model *m, uint64_t seed);

/* train.precision "fp8" (docs/engine.md "FP8"): put this stage's block
 * linear weights (q|k|v, attention output, fc or gate|up, MLP output) on
 * the backend's E4M3 path (backend.h fp8_freeze; m->fp8 set). Call once the
 * weights are final (loaded or initialised). A frozen base (LoRA,
 * e->frozen) is held as E4M3 alone on the device, its bf16 values in host
 * memory (worker/fp8base.h), where the engine's layout allows and bf16_base
 * is 0; otherwise (bf16_base 1: the fp8-base-bf16 tuning row) it keeps the
 * bf16 base and gets E4M3 copies W8 and W8^T beside it. Trained weights (no
 * LoRA) are quantized at each use from their current values and take their
 * weight gradients in E4M3 too. Needs weights in the compute dtype (not NF4)
 * and a backend with fp8_freeze. *n_fp8: the weights on the E4M3 path (a
 * shape the FP8 GEMM does not take stays bf16), *bytes the E4M3 bytes
 * (1 a weight held alone, 2 a copied one; counted in e->mem.params, as is the
 * freed bf16 base). Later calls change nothing. 0 or -1 (logged). */
int model_fp8_freeze(struct model *m, int bf16_base, int *n_fp8, size_t *bytes);

/* Tensors of at least this many elements are initialised in parallel. */
#define MODEL_INIT_PAR_MIN ((size_t)1 << 26)
/* The normal(0, std) values model_init_params draws for one tensor whose
 * stream seed is `s`: below par_min elements one serial splitmix64 +
 * Box-Muller stream (the values tests rely on); from par_min on, 2^20-element
 * chunks each with its own stream (chunk index mixed into the seed), filled
 * by `threads` OpenMP threads (0: default); the values do not depend on the
 * thread count. Exposed for tests. */
void model_fill_normal(float *h, size_t n, uint64_t s, double std, size_t par_min, int threads);

/* Forward one micro-batch (host int32 inputs/targets [B*T], copied to the
 * device). With grad_scale > 0 the classifier also accumulates the gradient
 * of grad_scale * sum(losses) into the head and prepares model_backward.
 * Returns the sum of per-token losses of the rows with target >= 0 (summed on
 * the host in row order, in double), and their count in *count. */
double model_forward(struct model *m, const int32_t *inputs, const int32_t *targets,
                     float grad_scale, int64_t *count);
/* Backward through the blocks and embeddings after model_forward with
 * grad_scale > 0; accumulates into e->grads. `on_layer(layer, user)` (may be
 * NULL) fires when a block's gradients are final (last block first, then -1
 * for the embeddings). */
void model_backward(struct model *m, void (*on_layer)(int layer, void *user), void *user);

/* After model_forward on a single-process model (tp = pp = 1): the fp32
 * logits of row r over the real vocabulary into host out[V] (the final
 * norm's output of that row times the head; worker/hf_generate.c samples
 * from them). Allocates and frees its own device buffers. 0 or -1. */
int model_row_logits(struct model *m, int r, float *out);

/* Pipeline stages (worker/pp.c). A stage that is not first takes its input
 * from model_stage_input (written before model_forward; `inputs` may be NULL
 * there); a stage that is not last leaves its output in model_stage_output
 * (model_forward then returns 0 with *count 0; `targets` may be NULL) and
 * takes the output's gradient in model_stage_dout (written before
 * model_backward). After model_backward a stage that is not first holds its
 * input's gradient in model_stage_dinput. [B*T, C] compute-dtype device
 * buffers owned by the model. */
void *model_stage_input(struct model *m);
const void *model_stage_output(struct model *m);
void *model_stage_dout(struct model *m);
const void *model_stage_dinput(struct model *m);

#endif
