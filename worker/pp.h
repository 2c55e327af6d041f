/* Pipeline parallelism: stage placement in the flat buffer, the GPipe and
 * 1F1B schedules, and the micro-step runner that executes a schedule on one
 * stage with point-to-point activations and gradients.
 *
 * Stages are contiguous: stage s runs blocks [s*L/pp, (s+1)*L/pp); the
 * embeddings are on stage 0, the final norm and head on stage pp-1
 * (api/model.h model_tensor_on_stage). Every rank allocates the whole flat
 * buffer of its tp share (the engine's layout) but owns, optimizes and
 * checkpoints only its stage's range (pp_stage_range). With tied embeddings
 * the last stage uses its copy of wte as the head: its head gradient is sent
 * to stage 0 and added there before the dp reduction, and stage 0 sends the
 * updated wte back after the optimizer step (worker/par.c), so the two copies
 * stay identical.
 *
 * Schedules (M micro-batches, P stages, stage s):
 *   GPipe: F0 .. F(M-1), then B0 .. B(M-1); M micro-batches in flight.
 *   1F1B:  w = min(P-s-1, M) warm-up forwards, then (F, B) pairs, then the
 *          remaining backwards; at most min(P-s, M) micro-batches in flight.
 * Both have the ideal bubble (P-1)/(M+P-1) of a step with equal stage times.
 * Sends are asynchronous (a send completes when the peer received it) and
 * receives block, so neither schedule can deadlock; the time a stage spends
 * blocked in receives is its measured bubble.
 *
 * Only the engine thread calls these. */
#ifndef LOOM_WORKER_PP_H
#define LOOM_WORKER_PP_H

#include <stddef.h>

#include "worker/train.h"

enum pp_schedule { PP_1F1B = 0, PP_GPIPE = 1 };

/* "1f1b" / "gpipe" <-> enum; parse returns -1 on an unknown name. */
int pp_schedule_parse(const char *s);
const char *pp_schedule_name(enum pp_schedule s);

/* One action of a schedule: forward (fwd = 1) or backward of micro-batch. */
struct pp_action {
    int fwd, micro;
};

/* The actions of stage `stage` of `pp` for M micro-batches into out[2*M];
 * returns the count (2*M). */
int pp_schedule_actions(enum pp_schedule s, int pp, int stage, int M, struct pp_action *out);
/* Most micro-batches a stage holds at once under the schedule (activation
 * slots it needs): GPipe M, 1F1B min(pp - stage, M). */
int pp_schedule_slots(enum pp_schedule s, int pp, int stage, int M);
/* Ideal bubble fraction of a step, (pp-1)/(M+pp-1), for equal stage times. */
double pp_bubble_ideal(int pp, int M);

/* [*lo, *hi): the flat-buffer range of the tensors this rank's stage owns
 * (pp = 1: the whole buffer). Contiguous by the layout order. */
void pp_stage_range(const struct engine *e, size_t *lo, size_t *hi);

struct pp;

/* The runner for model m (slot 0; the other slots are made with the same
 * options `mo`). The pp communicator is e->pp_group. NULL on failure. */
struct pp *pp_new(struct model *m, const struct model_opts *mo, enum pp_schedule s, char *err,
                  size_t errlen);
void pp_free(struct pp *p); /* NULL ok; frees the extra slots, not m */

/* train_opts.micro_steps (user = struct pp *). Collective over the world
 * (gathers each stage's bubble). */
/* Allocate the activation slots (extra models) and schedule buffers for M
 * micro-batches now rather than at the first step, so that the memory report
 * at start-up includes them. pp_micro_steps calls it too. 0 or -1. */
int pp_reserve(struct pp *p, int M);
int pp_micro_steps(void *user, struct model *m, const struct train_opts *o, int64_t step,
                   int32_t *inputs, int32_t *targets, double *sums, char *err, size_t errlen);
/* train_opts.step_extra: {"pp":{"schedule":..,"micro":M,"bubble_ms":[per
 * stage],"bubble_frac":[per stage],"bubble_ideal":..,"inflight":[per stage],
 * "stage_params":[per stage, this tp share]}} of the last step. pp_new logs
 * a warning when the heaviest stage holds > 1.25x the lightest one's
 * parameters. */
json_t *pp_step_extra(void *user);

/* train_opts.forward_only (user = struct pp *): one micro-batch through the
 * pipeline without gradients (evaluation); the loss sum and count are this
 * rank's (non-zero on the last stage only). A failed send/recv is fatal. */
double pp_forward_only(void *user, struct model *m, const int32_t *inputs, const int32_t *targets,
                       int64_t *count);

#endif
