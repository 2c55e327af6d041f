/* Engine context: one per worker process. Holds the rank's place in the
 * parallel layout (rank, world, tp/dp/pp indices and the comm layer's group
 * handles), the backend, the model layout and the flat device buffers that
 * parameters, gradients and optimizer state live in, and the hooks the comm
 * layer fills for data parallelism and ZeRO.
 *
 * Rank order is Megatron's: tp fastest, then dp, then pp:
 *   rank = pp_idx*dp*tp + dp_idx*tp + tp_idx.
 *
 * Flat buffers are laid out by api/model.h's table for this tp rank
 * (model_tensor.rank_offset, in elements). With world = 1 every hook keeps its
 * default behaviour (below) and the step is plain single-process training.
 *
 * The step (worker/train.c) is:
 *   for each micro-step: [hooks.layer_pre_forward] forward, backward
 *       (hooks.layer_pre_backward before each block; hooks.layer_grads_done
 *        after each layer's gradients of the micro-step are complete, and on
 *        the last micro-step also hooks.layer_grads_ready, last layer first)
 *   hooks.grad_sync          -> grads[shard range] hold the SUM over dp ranks
 *   grad norm over the shard -> hooks.allreduce_sum (dp group) -> clip factor
 *   AdamW on [shard_off, shard_off + shard_n)
 *   hooks.param_sync         -> params complete on every rank again
 * Only the engine thread calls any of this. */
#ifndef LOOM_WORKER_ENGINE_H
#define LOOM_WORKER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "api/model.h"
#include "worker/backend.h"

struct engine;

/* Hooks for the comm layer. Every pointer may be NULL: NULL means the
 * world = 1 behaviour written next to it. `user` is passed back unchanged. */
struct engine_hooks {
    void *user;
    /* After the last micro-step's backward. Must leave grads[shard_off ..
     * shard_off + shard_n) holding the sum over the dp group of every rank's
     * accumulated gradient (the engine divides by the token count through the
     * loss scale already, so a plain sum gives the global mean). NULL: no-op. */
    int (*grad_sync)(struct engine *e, void *user);
    /* After the optimizer updated params[shard range] (and master). Must leave
     * the whole params buffer current on every rank (ZeRO-1/2 all-gather).
     * NULL: no-op. */
    int (*param_sync)(struct engine *e, void *user);
    /* Sum n host doubles across the dp group in place (loss, token counts,
     * squared grad norm of each shard). NULL: identity. */
    int (*allreduce_sum)(struct engine *e, void *user, double *v, int n);
    /* Optional overlap points. layer in [0, n_layer) for blocks, -1 for the
     * embeddings / head tensors. layer_grads_ready fires only on the last
     * micro-step of a step; layer_pre_forward before each layer's forward. */
    void (*layer_grads_ready)(struct engine *e, void *user, int layer);
    /* As layer_grads_ready but on EVERY micro-step, for the layer's gradients
     * of this micro-step (ZeRO-2/3 reduce each micro-step out of a bounded
     * scratch, as DeepSpeed does). Fired by train.c and the pp runner. */
    void (*layer_grads_done)(struct engine *e, void *user, int layer);
    void (*layer_pre_forward)(struct engine *e, void *user, int layer);
    /* Before each block's backward (layer L-1 down to 0), and with -1 before
     * the embedding backward; fires on every micro-step (ZeRO-3 re-gathers a
     * layer's parameters here and releases the one done before). */
    void (*layer_pre_backward)(struct engine *e, void *user, int layer);
    /* The squared global gradient norm (every parameter of the model once:
     * tp-replicated tensors counted on one tp rank, each pipeline stage's
     * own tensors). NULL: sumsq over the shard, summed with allreduce_sum
     * unless shard_replicated. Set by worker/par.c when tp or pp > 1. */
    double (*grad_norm_sq)(struct engine *e, void *user);
    /* Replaces the backend's embedding_bwd in the backward when set (the
     * CUDA pair path exchanges the token embedding's gradient as per-token
     * rows: worker/zero.c). Same arguments as backend.h's embedding_bwd. */
    void (*embedding_bwd)(struct engine *e, void *user, void *dwte, void *dwpe, const void *dout,
                          const int32_t *tokens, int B, int T, int C);
    /* Replaces the device sync before grad_sync: a wait bounded by the comm
     * timeout, for when the compute stream may wait on a peer. 0 or -1. */
    int (*compute_sync)(struct engine *e, void *user);
};

/* Bytes of device memory by category, for the "mem" field of step lines;
 * host: bytes of HOST memory the engine holds for optimizer offload (fp32
 * master, moments, transfer buffer; worker/offload.h), 0 without offload. */
struct engine_mem {
    size_t params, grads, optimizer, activations, comm;
    size_t host;
};

struct offload;
struct fp8base;

struct engine {
    /* place in the layout */
    int rank, world, local_rank;
    int tp, dp, pp;
    int tp_idx, dp_idx, pp_idx;
    void *tp_group, *dp_group, *pp_group; /* comm layer handles; NULL at world 1 */
    /* the tp-stream row off (engine_place.tp_host_sync): tp all-reduces go
     * through the comm thread after a host sync, not onto the compute stream */
    int tp_host_sync;

    struct backend *be; /* owned by the engine (backend_free in engine_free) */
    struct model_config cfg;
    struct model_layout layout; /* for this tp degree */

    /* Flat device buffers, indexed like layout.t[i].rank_offset, but only a
     * WINDOW of the flat range is resident: params holds [p_lo, p_hi) and
     * grads [g_lo, g_hi) (world 1: everything; pp: the stage's range; ZeRO-3
     * params and ZeRO-2/3 grads: this rank's shard). Address them with
     * engine_params_at / engine_grads_at (flat offsets), and tensors with
     * engine_param / engine_grad, which also follow the per-tensor views:
     * pview[i] / gview[i], when set, is where tensor i lives outside the
     * window (ZeRO-3 gather slots, ZeRO-2 gradient scratch, the persistent
     * embeddings/head copies, the tied embedding on the last pp stage). The
     * views' buffers belong to whoever set them (worker/zero.c). */
    size_t n_params; /* layout.rank_numel */
    void *params;    /* compute dtype [p_hi - p_lo] */
    void *grads;     /* compute dtype [g_hi - g_lo] */
    size_t p_lo, p_hi, g_lo, g_hi;
    void **pview, **gview; /* [layout.n]; NULL: in the window (or absent on this rank) */
    size_t shard_off;      /* this rank's optimizer range (world 1: 0) */
    size_t shard_n;        /* (world 1: n_params) */
    /* Optimizer state of the shard. In DEVICE memory, except with offload
     * (opt_host = 1): then in HOST memory (worker/offload.h). Code outside
     * the engine and optimizer reaches it only through engine_opt_read /
     * engine_opt_write / engine_master_to_dev, which handle both. NULL until
     * allocated (engine_place.opt_later: by engine_set_shard / engine_opt_init). */
    float *master;           /* fp32 [shard_n]; == params + shard_off on fp32 backends */
    float *opt_m;            /* fp32 [shard_n] AdamW first moment */
    float *opt_v;            /* fp32 [shard_n] AdamW second moment */
    int master_aliased;      /* 1 when master points into params (never with offload) */
    int opt_host;            /* 1: master, opt_m, opt_v are host memory (offload) */
    struct offload *offload; /* optimizer offload state, NULL when off (engine_offload_enable) */
    /* 1 while the current micro-step is the step's last (set by train.c's
     * loop; 0 under other drivers, e.g. the pp runner): gradients added into
     * the shard during it are final (the offload's early download). */
    int micro_last;
    float *scalar; /* fp32 [4] device scratch for reductions (grad norm) */

    /* 1: the base parameters are frozen (engine_place.frozen, LoRA): no
     * gradient window, master or moments exist; engine_opt_read of the master
     * reads the parameters (fp32-converted), of the moments zeros. */
    int frozen;

    /* train.quantize_base "nf4": the block linear weights in NF4, their
     * views a per-block scratch (worker/nf4.h; owned: engine_free frees it).
     * NULL otherwise. engine_params_from_host(_raw) hands it their values. */
    struct nf4 *nf4;
    /* train.precision "fp8" with the frozen base held as E4M3 alone
     * (worker/fp8base.h; owned): no params window, the host copy of the base.
     * NULL otherwise. */
    struct fp8base *fp8b;

    /* 1 when every dp rank holds the same optimizer range (DP without ZeRO):
     * the shard's squared grad norm is then not summed over dp. */
    int shard_replicated;

    struct engine_hooks hooks;
    struct engine_mem mem;
};

/* Place in the layout, filled from flags or the LOOM_* env contract. */
struct engine_place {
    int rank, world, local_rank;
    int tp, dp, pp;
    /* 1: engine_new allocates no optimizer state (master, moments) until the
     * shard is known: engine_set_shard (the comm layer) or engine_opt_init
     * does. For models whose whole optimizer state would not fit before ZeRO
     * shrinks it. 0 (default): the whole buffer at once, as before. */
    int opt_later;
    /* 1: the params and grads windows start empty (nothing resident); the
     * caller sizes them before the weights are initialised: zero_new (the
     * stage range, or this rank's shard with ZeRO-2/3) or engine_set_windows.
     * Then a sharded layout never holds the whole stage, not even at
     * start-up. 0 (default): both windows cover every parameter. */
    int windows_later;
    /* 1: the tp-stream tuning row is off (worker/tuning.h; tp.c). 0 (default):
     * tp all-reduces are ordered on the compute stream where the comm can. */
    int tp_host_sync;
    /* 1: every parameter is frozen (train.lora trains separate adapters,
     * worker/lora.h): no gradient buffer, fp32 master or moments are ever
     * allocated (e->mem grads 0, optimizer the 16-byte norm scalar). */
    int frozen;
};

/* Check a place: world == tp*dp*pp and 0 <= rank < world. Returns 0, or -1
 * with a message naming the numbers in err. engine_new derives the indices. */
int engine_place_check(const struct engine_place *p, char *err, size_t errlen);

/* Create the engine: takes ownership of `be`, builds the layout for `cfg`
 * and p->tp, allocates params, grads, master and moments (whole buffer:
 * shard = everything; the comm layer may call engine_set_shard before the
 * first step; with p->opt_later no master / moments yet). Returns NULL on
 * failure (message logged; `be` freed). */
struct engine *engine_new(const struct model_config *cfg, const struct engine_place *p,
                          struct backend *be);
void engine_free(struct engine *e); /* NULL ok */

/* Restrict the optimizer to [off, off+n) of the flat buffer: reallocates the
 * moments and master for that range (contents reset to zero / copied from
 * params), in host memory when offload is on. Returns 0 or -1. */
int engine_set_shard(struct engine *e, size_t off, size_t n);
/* Allocate the optimizer state for the current shard if it is not yet
 * (engine_place.opt_later and no engine_set_shard since). 0 or -1. */
int engine_opt_init(struct engine *e);
/* 1 when master and moments are allocated. */
int engine_opt_ready(const struct engine *e);

/* Turn optimizer offload on (worker/offload.h; opts may be NULL: defaults).
 * Call before the first step. State already allocated on the device moves to
 * host memory (values kept); later engine_set_shard calls allocate on the
 * host. 0 or -1 (out of memory; offload stays off). */
struct offload_opts;
int engine_offload_enable(struct engine *e, const struct offload_opts *o);

/* Which optimizer array engine_opt_read / engine_opt_write address. */
enum engine_opt { ENGINE_OPT_MASTER = 0, ENGINE_OPT_M = 1, ENGINE_OPT_V = 2 };
/* Copy fp32 elements [off, off+n) of the shard's master / m / v (off counted
 * from shard_off) to host `dst`, resp. from host `src`, wherever the state
 * lives (device or offloaded host memory). Writing the master does not touch
 * the compute-dtype params (engine_params_from_host does both). Waits for
 * earlier device work. */
void engine_opt_read(struct engine *e, enum engine_opt which, float *dst, size_t off, size_t n);
void engine_opt_write(struct engine *e, enum engine_opt which, const float *src, size_t off,
                      size_t n);
/* The shard's fp32 master into backend (device) memory dst[shard_n]: a device
 * copy, or an upload from host memory with offload. */
void engine_master_to_dev(struct engine *e, float *dst);

/* Tensor i's parameter / gradient pointer (device, compute dtype): the view
 * when set, else inside the window; NULL when this rank holds neither. */
void *engine_param(const struct engine *e, int i);
void *engine_grad(const struct engine *e, int i);
/* The element at flat offset `off` of the resident params / grads window
 * (p_lo <= off <= p_hi, resp. g_lo..g_hi; not checked). */
void *engine_params_at(const struct engine *e, size_t off);
void *engine_grads_at(const struct engine *e, size_t off);
/* Shrink (or move) the resident windows to [plo, phi) and [glo, ghi):
 * reallocates both buffers, keeping the values of the part that stays and
 * zeroing the rest, and re-points an aliased master. Call engine_set_shard
 * after it (the shard must lie in the params window). 0 or -1. */
int engine_set_windows(struct engine *e, size_t plo, size_t phi, size_t glo, size_t ghi);
/* Zero the gradient window and every tensor's gradient view (once a step). */
void engine_zero_grads(struct engine *e);
/* Release `bytes` recorded in a category by engine_alloc, and free p. */
void engine_release(struct engine *e, void *p, size_t bytes, size_t *category);
/* Index of the tensor named `name` (Hugging Face name), or -1. */
int engine_tensor_find(const struct engine *e, const char *name);

/* Copy host fp32 values for flat params [off, off+n) (converted to the
 * compute dtype) into the part of the params window and of the parameter
 * views that this range meets, and into master where it meets the shard, so
 * a bf16 backend keeps the unrounded fp32 master. Returns 0 or -1 (out of
 * memory). */
int engine_params_from_host(struct engine *e, size_t off, const float *src, size_t n);

/* The same from host values already in the compute dtype (b->elt_size
 * bytes each, e.g. bf16 weights for a bf16 backend): uploaded as they are,
 * with no fp32 pass, and the master, where the range meets the shard,
 * widened from them (exact). For values that are exact in the compute
 * dtype the result is bit for bit engine_params_from_host's. src may be
 * page-locked (b->host_alloc) for full-speed copies. Returns 0. */
int engine_params_from_host_raw(struct engine *e, size_t off, const void *src, size_t n);

/* Record `bytes` allocated for a category in e->mem (helper for model.c). */
void *engine_alloc(struct engine *e, size_t bytes, size_t *category);

#endif
