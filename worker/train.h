/* Train loop: optimizer steps with gradient accumulation, the comm hooks,
 * evaluation, checkpoint callbacks and JSON-lines reporting.
 *
 * One step (see engine.h): zero grads; for each of grad_accum micro-steps
 * fetch a batch, forward (classifier gradient scaled by 1/global tokens) and
 * backward; grad_sync hook; global grad norm; clip; AdamW at the scheduled
 * lr; param_sync hook. Losses are summed per token in double on the host and
 * over dp with the allreduce_sum hook.
 *
 * Output (one JSON object per line on opts.out; sizes in GiB, times in ms):
 *   {"type":"step","step":N,"loss":..,"lr":..,"grad_norm":..,"tokens":..,
 *    "tokens_per_s":..,"mfu":..|null,"ms":{"compute":..,"comm_exposed":..,
 *    "data_wait":..,"step":..},"mem_gib":..,"mem":{"params":..,"grads":..,"optimizer":..,
 *    "activations":..,"comm":..},"loss_tokens":..}
 *   ("loss_tokens": targets the loss counted; below "tokens" with loss-mask shards)
 *   {"type":"eval","step":N,"val_loss":..,"tokens":..}
 * "step" counts completed optimizer steps (1 after the first). Only rank 0
 * writes these lines when world > 1 (the caller passes out = NULL elsewhere).
 * The other ranks may write their own timing on opts.rank_out, one line a
 * step, for loomd's per-rank view and straggler diagnosis:
 *   {"type":"rank_step","step":N,"rank":R,"ms":{"step":..,"compute":..,
 *    "comm_exposed":..,"data_wait":..,"optimizer":..}}
 * step = compute + comm_exposed + data_wait: comm_exposed is the gradient
 * and parameter synchronisation left after the compute plus, with pp, the
 * waits on the neighbour stages (the bubble); data_wait is the time spent
 * getting batches.
 * Only the engine thread runs this. */
#ifndef LOOM_WORKER_TRAIN_H
#define LOOM_WORKER_TRAIN_H

#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "worker/model.h"
#include "worker/optim.h"

/* Batch source: fill inputs/targets [B*T] for (step, micro_step) of this
 * rank. Returns 0, or non-zero with a message in err (a data error: the
 * worker exits 2). */
struct train_source {
    int (*batch)(void *user, int64_t step, int micro, int32_t *inputs, int32_t *targets, char *err,
                 size_t errlen);
    void *user;
};

struct train_opts {
    int64_t steps; /* total optimizer steps of the run */
    int grad_accum;
    int64_t global_batch_tokens; /* tokens per optimizer step over all dp ranks */
    struct optim_cfg optim;
    struct train_source train;
    struct train_source val; /* batch NULL: no evaluation */
    int64_t eval_every;      /* 0: no periodic evaluation */
    int64_t eval_batches;
    /* Called after step `done` (completed steps) when done % save_every == 0
     * or done == steps or a stop was requested; returns 0 or non-zero. */
    int (*save)(void *user, int64_t done);
    void *save_user;
    int64_t save_every;
    volatile sig_atomic_t *stop; /* set by a signal handler; NULL: none */
    FILE *out;                   /* JSON lines; NULL: silent */
    /* Where a rank without `out` writes its rank_step lines (NULL: none),
     * its rank, and the test knob debug-slow-ms (worker/tuning.h): sleep
     * this long in every step, before the forward (0: never). */
    FILE *rank_out;
    int rank;
    long slow_ms;
    /* 1: no device sync before grad_sync only to split the step's timing
     * (tuning row diag 0): comm_exposed then also holds the backward still
     * queued on the device when grad_sync began. 0 (default): the sync. */
    int no_timing_sync;
    /* > 0 (tuning diag-ab): 0-based steps s with (s / diag_ab) odd run as
     * with no_timing_sync and write no rank_step line (on/off blocks in one
     * process, for benchmarks). */
    long diag_ab;
    double flops_per_token; /* for MFU (model_flops_per_token) */
    /* Optional replacement of the micro-step loop (pipeline schedules,
     * worker/pp.h): runs all grad_accum micro-steps of `step` on this rank
     * (batches, forward, backward, point-to-point) and ADDS the loss sum and
     * token count of this rank into sums[0], sums[1], the ms it waited on
     * communication (point-to-point receives and sends, its statistics
     * all-reduce: the pipeline bubble) into sums[2] and the ms it waited for
     * batches into sums[3]. Returns 0, -2 on a data
     * error, -1 otherwise (message in err). NULL: forward/backward per micro. */
    int (*micro_steps)(void *user, struct model *m, const struct train_opts *o, int64_t step,
                       int32_t *inputs, int32_t *targets, double *sums, char *err, size_t errlen);
    void *micro_user;
    /* Optional extra keys merged into each step line (e.g. the pipeline
     * bubble); returns a new object or NULL. Called on the rank with out. */
    json_t *(*step_extra)(void *user);
    void *step_extra_user;
    /* Optional: the targets that count in the loss over the whole of `step` (every
     * micro-step and dp rank; data_loader_step_loss_tokens). When set and > 0 the step's
     * loss and gradient are the mean over those tokens: the gradient, accumulated at scale
     * 1/global_batch_tokens, is rescaled by global_batch_tokens / count before the norm, the
     * clip and the optimizer. NULL: every token counts (the scale stays 1/global). */
    int64_t (*step_loss_tokens)(void *user, int64_t step);
    void *step_loss_tokens_user;
    /* Optional replacement of model_forward for evaluation (no gradients),
     * e.g. a pipelined forward (worker/pp.h); user = micro_user. Returns this
     * rank's loss sum and token count like model_forward. */
    double (*forward_only)(void *user, struct model *m, const int32_t *inputs,
                           const int32_t *targets, int64_t *count);
};

struct train_step_info {
    int64_t step; /* completed optimizer steps after this one (train_run) */
    double loss, lr, grad_norm;
    int64_t tokens;
    int64_t loss_tokens; /* targets the loss counted (tokens minus masked ones), all dp ranks */
    double ms_compute, ms_comm, ms_step;
    double ms_data; /* waiting for batches (the data loader); not part of ms_compute */
    double
        ms_optimizer; /* wall time of the optimizer step (part of ms_compute; offloaded or not) */
    int stop_any;     /* *o->stop was set on some dp rank when this step began its
                         loss reduction (one all-reduce carries both) */
};

/* One optimizer step with 0-based index `step`. Returns 0, -2 on a data error
 * (message in err), -1 on a hook failure. */
int train_step(struct model *m, const struct train_opts *o, int64_t step,
               struct train_step_info *info, int32_t *inputs, int32_t *targets, char *err,
               size_t errlen);

/* Mean validation loss over o->eval_batches micro-batches (dp-averaged). */
double train_eval(struct model *m, const struct train_opts *o, int32_t *inputs, int32_t *targets,
                  int64_t *tokens, char *err, size_t errlen, int *rc);

/* Writes one {"type":"rank_step"} line of `in` (completed step `done`) on
 * out and flushes it, as train_run does on opts.rank_out (also the unit of
 * tests/bench/bench_diag_cost.c). out NULL: nothing. */
void train_emit_rank_step(FILE *out, int rank, int64_t done, const struct train_step_info *in);

/* Run steps [start, o->steps). Returns 0 when finished, 1 when stopped by
 * *o->stop (after saving), -2 on a data error, -1 on another failure; the
 * message is in err. Final stats in *last (may be NULL). */
int train_run(struct model *m, const struct train_opts *o, int64_t start,
              struct train_step_info *last, char *err, size_t errlen);

#endif
