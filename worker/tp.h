/* Tensor parallelism (Megatron): the pieces of the model that talk to the tp
 * group, and the slicing of full tensors into tp shares.
 *
 * Layout (api/model.h): column-split tensors (qkv, c_fc / gate|up) hold this
 * rank's output features (whole heads, whole kv heads), row-split tensors
 * (attention and MLP output projections) this rank's input features, and the
 * vocabulary-split embedding / lm_head the rows [tp_idx*Vr, (tp_idx+1)*Vr) of
 * the padded vocabulary. Norm weights, the row-parallel biases and the
 * position embedding are replicated.
 *
 * Per block the forward all-reduces the two row-parallel outputs (attention
 * and MLP) over tp, and the backward all-reduces the input gradient of the
 * two column-parallel matmuls before the norms' backward, so the residual
 * stream and its gradient are replicated and every replicated parameter gets
 * the same gradient on every tp rank (no extra synchronisation needed).
 * The replicated biases of row-parallel layers are added by tp rank 0 only.
 *
 * Embedding: each rank looks up the tokens that fall in its vocabulary rows
 * (others produce zero rows), one all-reduce sums the parts. Cross-entropy:
 * each rank computes its rows' logits in chunks (never the full logits), the
 * per-row log-sum-exp is combined over tp (max, then sum of exponentials),
 * the target logit comes from the rank that owns it, and the gradient pass
 * uses the global log-sum-exp; the head's input gradient is all-reduced.
 *
 * Communication failures are fatal (die with the comm error): the worker's
 * launcher or agent stops the other ranks. Only the engine thread calls. */
#ifndef LOOM_WORKER_TP_H
#define LOOM_WORKER_TP_H

#include <stddef.h>
#include <stdint.h>

#include "api/model.h"
#include "worker/model.h"

struct tp_state;

/* Buffers for the vocabulary-parallel embedding and loss of model m
 * (m->B, m->T, m->C, m->Vp rows held). NULL on failure (logged). */
struct tp_state *tp_state_new(struct model *m);
void tp_state_free(struct model *m, struct tp_state *s); /* NULL ok */

/* Sum n compute-dtype elements of device buffer buf over the tp group, in
 * place (syncs the backend first). No-op when tp == 1. */
void tp_allreduce(struct engine *e, void *buf, size_t n);

/* out [N, C] = wte[tokens] (+ wpe[pos]) with wte split by vocabulary rows;
 * tokens_host are the global token ids (host int32 [N]). */
void tp_embedding_fwd(struct model *m, void *out, const int32_t *tokens_host, const void *wte,
                      const void *wpe);
/* dwte (this rank's rows) and dwpe (may be NULL) accumulate from dout. Uses
 * the tokens of the last tp_embedding_fwd. */
void tp_embedding_bwd(struct model *m, void *dwte, void *dwpe, const void *dout);

/* Vocabulary-parallel fused head + cross-entropy. losses (device fp32 [N],
 * overwritten, the same on every tp rank); with dinp/dW non-NULL accumulates
 * the gradient of grad_scale * sum(losses) (dinp is summed over tp, so it is
 * complete on every rank; dW is this rank's rows). targets_host are global
 * ids (host int32 [N], < 0 ignored). */
void tp_classifier(struct model *m, float *losses, void *dinp, void *dW, const void *inp,
                   const void *W, const int32_t *targets_host, float grad_scale);

/* Rank idx's share (of tp) of the full fp32 tensor `full` (t->numel values,
 * t->shape) into out (t->rank_numel values), following t->split/parts. */
void tp_slice(const struct model_tensor *t, int tp, int idx, const float *full, float *out);
/* The inverse: place rank idx's share `part` into `full`. */
void tp_unslice(const struct model_tensor *t, int tp, int idx, const float *part, float *full);

/* Load checkpoint `dir` written at tensor-parallel degree old_tp (any dp,
 * pp and ZeRO stage) into e at its own tp: every tp rank's shards are
 * assembled into whole tensors (params and AdamW moments, on the host) and
 * e's share is cut out of them. Each rank reads the files itself. 0, or -1
 * with a message in err. Used by zero_load_checkpoint when tp differs. */
int tp_load_checkpoint(struct engine *e, const char *dir, int old_tp, char *err, size_t errlen);

/* 1 when tensor t's gradient is the same on every tp rank (replicated
 * parameters); such tensors count once in the global gradient norm. */
static inline int tp_replicated(const struct model_tensor *t) {
    return t->split == MODEL_SPLIT_REPLICATED;
}

#endif
