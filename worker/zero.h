/* Data parallelism and ZeRO stages 0-3 for the engine (worker/engine.h), on
 * the comm layer (worker/comm/comm.h).
 *
 * Sharding: the flat parameter buffer (n_params elements, tensor order of
 * api/model.h) is cut into dp contiguous shards with comm_shard_range, so
 * shards differ by at most one element and any parameter count works. Rank
 * dp_idx owns shard dp_idx: its optimizer state (stage >= 1), its reduced
 * gradients (stage >= 2) and its parameters (stage 3).
 *
 * Per stage (hooks installed on the engine). With one dp rank stages 2 and 3
 * run as stage 1 (nothing to shard; zero_stage() says so).
 *   0  all-reduce of each layer's gradients on the last micro-step; every
 *      rank runs AdamW on the whole buffer (e->shard_replicated = 1).
 *   1  reduce-scatter of each layer's gradients into the owners' shards on
 *      the last micro-step (layer_grads_ready, async, overlapping the rest of
 *      the backward; grad_sync waits); AdamW on the shard; param_sync:
 *      all-gather of the parameters, one async all-gatherv per layer group in
 *      forward order, each waited for in layer_pre_forward just before that
 *      group's forward (it overlaps the next step's first blocks; with pp,
 *      waited for in param_sync).
 *   2  the gradient window is only the shard. Each block's backward writes
 *      into one of two scratch slots (layer_pre_backward points the block's
 *      gradient views there); as soon as the block is done (layer_grads_done,
 *      EVERY micro-step, as DeepSpeed does) the slot is reduce-scattered
 *      asynchronously and, before the slot is reused or in grad_sync, the
 *      owned part is added into the shard. The layer -1 group (embeddings,
 *      final norm, head: its gradients arrive in the forward's classifier
 *      and at the very end of the backward) keeps a whole gradient buffer,
 *      reduce-scattered once in grad_sync. param_sync as 1.
 *   3  as 2, and the params window is only the shard too. Blocks are
 *      all-gathered into one of two slots just before their forward
 *      (layer_pre_forward) and backward (layer_pre_backward), the next block
 *      prefetched into the other slot meanwhile; the block's parameter views
 *      point into its slot while it holds it. The layer -1 group stays
 *      gathered in its own buffer, re-gathered in param_sync after each
 *      optimizer step (when the block slots are also invalidated).
 * Clipping uses the global norm: sum over dp of each shard's squared norm.
 *
 * Memory (e->mem, the "mem" of step lines) is what the engine really holds
 * (tests/unit/test_zero_mem.c checks it against the bytes live in the
 * backend). Per rank, e the element size, P the stage's parameter count
 * (pp.h; all of them at pp 1), S this rank's shard (ceil or floor of P/dp),
 * X the tensors used off the stage range (the tied embedding's copy on the
 * last pp stage), H the stage's layer -1 group, K = min(2, blocks) x the
 * largest block (the slots):
 *   params     (P + X)*e (stage 0-2);  (S + H + K + X)*e (stage 3)
 *   grads      (P + X)*e (stage 0-1);  (S + H + K + X)*e (stage 2-3)
 *   optimizer  as allocated by engine_set_shard: moments (and a separate
 *              master on bf16) for P elements (stage 0) or S (stage >= 1);
 *              with optimizer offload only the 16-byte norm scalar, and
 *              host = (P or S) * (12 + e) (worker/offload.h)
 *   comm       by formula, not engine memory: 0 (stage 0, in place);
 *              2*ceil(P/dp)*e (stage >= 1: the Gloo reduce-scatter ring's
 *              staging; 0 on cuda, where NCCL needs no such buffer)
 * zero_new allocates these and sizes the engine's windows. The worker creates
 * the engine with empty windows (engine_place.windows_later) and initialises
 * the weights after zero_new, so set-up never holds more than the steady
 * state (tests/unit/test_zero_mem.c checks the peak); with windows already
 * full (tests that initialise first) zero_new copies what stays and shrinks
 * them, and set-up briefly peaks at the whole tp share.
 *
 * Threads: only the engine thread calls these; comm work runs on the dp
 * comm's own thread. */
#ifndef LOOM_WORKER_ZERO_H
#define LOOM_WORKER_ZERO_H

#include <stddef.h>

#include "worker/comm/comm.h"
#include "worker/engine.h"

struct zero;
struct comm_tuning;

/* Everything a rank needs to join its attempt and set up DP/ZeRO. */
struct zero_setup_opts {
    int rank, world;
    int tp, dp, pp;
    int zero_stage;     /* 0..3 */
    const char *device; /* "cpu" or "cuda" */
    const char *rdzv;   /* file:DIR or http://.../v1/rdzv/JOB/ATTEMPT */
    const char *token;  /* LOOM_RDZV_TOKEN; may be NULL */
    int timeout_ms;     /* 0: tune->timeout_ms or the comm default */
    int cuda_device;
    /* tokens of a micro-step (micro-batch x T): sizes the embedding exchange
     * of the CUDA pair path (zero.c; 0: no exchange) */
    int micro_tokens;
    /* the comm tuning rows (worker/tuning.h); NULL: their defaults */
    const struct comm_tuning *tune;
};

/* Join the world, build the tp/dp/pp communicators and install ZeRO on `e`
 * (after model_init_params, before resuming). Owns the comm objects. NULL on
 * failure with a message in err. */
struct zero *zero_setup(struct engine *e, const struct zero_setup_opts *o, char *err,
                        size_t errlen);
/* Install DP/ZeRO stage `stage` over the dp communicator `dp` (not owned) on
 * `e`: sets the shard (engine_set_shard), the hooks (e->hooks.user = the
 * result) and e->mem. For tests and callers that own their comms. */
struct zero *zero_new(struct engine *e, struct comm *dp, int stage, char *err, size_t errlen);
void zero_free(struct zero *z); /* NULL ok; frees the comms zero_setup made */

int zero_stage(const struct zero *z);         /* in effect: at most 1 with one dp rank */
struct comm *zero_world_comm(struct zero *z); /* NULL unless made by zero_setup */
struct comm *zero_dp_comm(struct zero *z);    /* the dp communicator */
/* Barrier over the whole world (ckpt_barrier_fn; ctx = struct zero *). */
int zero_barrier(void *ctx);

/* The per-rank memory by category that stage `stage` at `dp` ranks keeps
 * for engine e (formulas above); activations are copied from e->mem. */
void zero_mem_model(const struct engine *e, int stage, int dp, struct engine_mem *out);

/* Every rank: the full fp32 master weights into host h[n_params] (for export
 * and tests). Collective over dp; gathers in backend memory (a temporary
 * n_params fp32 buffer), so it works on device backends too. */
int zero_gather_master(struct zero *z, float *h);

/* Load checkpoint directory `dir` into e whatever dp size and ZeRO stage
 * wrote it (reshard on load): parameters for the whole buffer and the AdamW
 * moments of e's current shard, assembled from the shards of every rank of
 * the checkpoint (their manifest meta "offset"/"count"/"tp"). pp may change
 * too (a tp rank's flat buffer has one layout at any pp); a different tp is
 * resharded by tp_load_checkpoint (worker/tp.h). Each rank reads the files
 * itself; no communication. 0, or -1 with a message in err. */
int zero_load_checkpoint(struct engine *e, const char *dir, char *err, size_t errlen);

#endif
