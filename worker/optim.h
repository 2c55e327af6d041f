/* Optimizer: learning-rate schedule, global-norm gradient clipping and AdamW
 * over the engine's optimizer shard.
 *
 * Schedule (step is the 0-based index of the optimizer step being taken):
 *   step < warmup:  lr * (step + 1) / warmup                  (linear warmup)
 *   otherwise, p = (step - warmup) / max(1, steps - warmup), clamped to [0,1]:
 *     cosine:   min_lr + 0.5 * (1 + cos(pi * p)) * (lr - min_lr)
 *     linear:   lr - p * (lr - min_lr)
 *     constant: lr
 * Clipping (torch.nn.utils.clip_grad_norm_): with norm = sqrt(sum g^2) over
 * all gradients, the update uses g * min(1, clip / (norm + 1e-6)); clip <= 0
 * disables it.
 * AdamW: decoupled weight decay (backend.h), applied only to tensors whose
 * layout entry has decay = 1 (2-D linear weights and lm_head; not norms,
 * biases or embeddings) unless decay_all is set. */
#ifndef LOOM_WORKER_OPTIM_H
#define LOOM_WORKER_OPTIM_H

#include <stdint.h>

#include "worker/engine.h"

enum optim_schedule { OPTIM_COSINE = 0, OPTIM_LINEAR = 1, OPTIM_CONSTANT = 2 };

struct optim_cfg {
    double lr, min_lr;
    int64_t warmup, steps;
    enum optim_schedule schedule;
    double beta1, beta2, eps, weight_decay, grad_clip;
    int decay_all; /* 1: decay every tensor (default 0: layout's decay flag) */
};

/* Learning rate of 0-based optimizer step `step`. Pure. */
double optim_lr(const struct optim_cfg *c, int64_t step);
/* Clip multiplier for a gradient norm. Pure. */
double optim_clip_scale(double norm, double clip);

/* Squared L2 norm of e->grads over this rank's shard (one device reduction,
 * one download), summed over the dp group through e->hooks.allreduce_sum. */
double optim_grad_norm_sq(struct engine *e);

/* The runs optim_step updates: fn(lo, hi, decay, user) for each maximal
 * flat range [lo, hi) inside the shard whose tensors share a decay flag, in
 * order (the offloaded step uses the same runs). */
void optim_runs(const struct engine *e, const struct optim_cfg *c,
                void (*fn)(size_t lo, size_t hi, int decay, void *user), void *user);

/* One AdamW update of the shard with learning rate lr and gradient multiplier
 * grad_scale (clip factor); step is 1-based (bias correction). Calls the
 * backend once per run of tensors with the same decay flag; with optimizer
 * offload on (e->offload) runs offload_step instead (worker/offload.h). */
void optim_step(struct engine *e, const struct optim_cfg *c, double lr, double grad_scale,
                int64_t step);

#endif
