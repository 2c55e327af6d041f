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
};

/* Build the model over engine `e` for micro-batches of B sequences of T
 * tokens (T <= cfg.seq_len): resolves tensor indices, reserves backend
 * workspaces and allocates activations (counted in e->mem.activations).
 * Only tp = pp = 1 is implemented here; other values are refused with a
 * message. Returns NULL on failure (logged). */
struct model *model_new(struct engine *e, int B, int T, int threads);
void model_free(struct model *m); /* NULL ok */

/* Deterministic initialisation from `seed` (GPT-2 scheme: N(0, 0.02),
 * residual output projections N(0, 0.02/sqrt(2L)), norms 1, biases 0,
 * padded vocabulary rows 0). Each tensor draws from its own stream keyed by
 * (seed, tensor name), so the values do not depend on layout or tp. */
int model_init_params(struct model *m, uint64_t seed);

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

#endif
