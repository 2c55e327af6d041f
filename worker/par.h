/* The parallel layout glue for tp and pp > 1 on top of DP/ZeRO
 * (worker/zero.h): engine hooks that make the step see the whole model.
 *
 * Installed after zero_setup, wrapping zero's hooks:
 * - grad_norm_sq: every parameter once: each rank sums the squares of its
 *   optimizer shard's gradients, skipping tp-replicated tensors on tp ranks
 *   other than 0 (and everything on dp ranks other than 0 under ZeRO-0, where
 *   the shard is replicated); the world all-reduce adds tp shares, pipeline
 *   stages and dp shards.
 * - allreduce_sum: over the whole world divided by tp (loss sums come from
 *   the last stage only, once per tp rank).
 * - grad_sync (pp > 1, tied embeddings): the last stage sends its wte
 *   gradient (the head's) to stage 0, which adds it, then zero's grad_sync.
 * - param_sync: zero's, then (pp > 1, tied) stage 0 sends the updated wte to
 *   the last stage. A frozen base (train.lora) skips both wte transfers.
 * - pp > 1: the micro-step loop is the pipeline runner (worker/pp.h).
 * Only the engine thread calls these. */
#ifndef LOOM_WORKER_PAR_H
#define LOOM_WORKER_PAR_H

#include <stddef.h>

#include "worker/pp.h"
#include "worker/train.h"
#include "worker/zero.h"

struct par;

/* Install on e (after zero_setup built the comms; z not owned). m is the
 * worker's model (pipeline slot 0), mo its options; schedule "1f1b" or
 * "gpipe". NULL on failure (err). */
struct par *par_setup(struct engine *e, struct zero *z, struct model *m,
                      const struct model_opts *mo, const char *schedule, char *err, size_t errlen);
void par_free(struct par *p); /* NULL ok */

/* Every rank (collective over the world): the whole model's fp32 master
 * weights in the tp = 1 layout (api/model.h offsets) into host h[numel],
 * assembled from every rank's optimizer range (all stages, tp shares, dp
 * shards; a frozen base, train.lora: its parameters). For --export. 0 or -1. */
int par_gather_full(struct par *p, float *h);

/* Fill the train options this layout needs (pipeline runner, step extras). */
void par_train_opts(struct par *p, struct train_opts *o);

#endif
