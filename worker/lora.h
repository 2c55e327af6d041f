/* LoRA adapters (spec train.lora; docs/engine.md "LoRA fine-tuning").
 *
 * Each targeted projection y = W x of every block gets A [r, in] and
 * B [out, r]: y = W x + (alpha / r) * B (A dropout(x)) (PEFT's form: the
 * dropout acts on the adapter's input only, in training forwards). W (and
 * every other base tensor) is frozen: the model computes no gradient for it
 * and, with engine_place.frozen, the engine holds no gradient, master or
 * moments for it. The adapters have their own compute-dtype values and
 * gradients (one flat arena in backend memory) and an fp32 master with AdamW
 * moments (the master is the values on an fp32 backend). A starts
 * kaiming-uniform (U(-1/sqrt(in), 1/sqrt(in)), the bound PEFT's
 * kaiming_uniform_(a=sqrt(5)) gives) from a stream keyed by (seed, tensor
 * name); B starts at zero, so the first forward equals the base model's.
 *
 * Every product runs through the backend's op table (matmul_fwd / _bwd,
 * scale, accumulate, and the LoRA members axpy_2d and dropout), so the same
 * code runs on the cpu (fp32) and cuda (bf16) backends.
 *
 * Targets: llama q, k, v, o, gate, up, down (q|k|v and gate|up are column
 * ranges of the fused projections); gpt2 attn, proj, fc, fc2.
 *
 * Supported: any dp (gradients all-reduced, or with ZeRO 1-2
 * reduce-scattered over the adapter state: lora_opts.zero_stage), tp (the
 * adapters split like their base layer, lora.c) and pp (each stage holds
 * its blocks' adapters), no optimizer offload. lora_new refuses anything
 * else with LORA_UNSUPPORTED. */
#ifndef LOOM_WORKER_LORA_H
#define LOOM_WORKER_LORA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "worker/optim.h"

struct model;
struct lora;

/* The projection sites of a block the model calls the adapters at. */
enum lora_site { LORA_SITE_QKV = 0, LORA_SITE_O, LORA_SITE_FC, LORA_SITE_DOWN, LORA_NSITES };

struct comm;
struct ckpt_writer;

struct lora_opts {
    int rank;
    double alpha, dropout;
    const char *const *targets; /* spec names (api/jobspec.c) */
    int n_targets;
    uint64_t seed;
    struct comm *dp; /* the dp communicator (zero_dp_comm), NULL with one rank */
    int zero_stage;  /* 0: every rank holds the adapter state; 1, 2: sharded over dp */
    /* the world communicator (zero_world_comm; NULL with one rank): tp or
     * pp > 1 gather the full adapters and the gradient norm over it; the tp
     * group is the engine's tp_group */
    struct comm *world;
};

/* Adapters for every block of model m (tp = pp = 1, a backend with the
 * LoRA ops). On refusal returns NULL with a code ("LORA_UNSUPPORTED",
 * "OUT_OF_MEMORY") and a message naming the values in code / err. Their
 * memory is counted in e->mem (values: params, gradients: grads, master and
 * moments: optimizer, saved products and scratch: activations). */
struct lora *lora_new(struct model *m, const struct lora_opts *o, const char **code, char *err,
                      size_t errlen);
void lora_free(struct lora *l); /* NULL ok */

/* train.precision "fp8" (docs/engine.md "FP8"): the block linear layers'
 * GEMMs in E4M3 on the cuda device, the frozen base of train.lora or the
 * trained weights of a full fine-tune. Refused (-1, PRECISION_UNSUPPORTED, a
 * message naming the values): with train.quantize_base nf4 (the NF4 base is
 * dequantized into one shared scratch, which cannot hold per-weight fp8
 * copies), on a device other than cuda (`device`: what the worker runs,
 * --device may override the spec), and a full fine-tune with zero_stage 3
 * (weights gathered into shared per-block windows). 0 otherwise (any other
 * precision too). */
struct loom_spec;
int lora_precision_check(const struct loom_spec *s, const char *device, char *err, size_t len);

/* The dropout masks are a function of (seed, adapter, step, micro): the
 * train loop names the micro-batch (its index in the global batch, micro-step
 * * dp + dp rank) before its forward, and the model
 * says whether a forward trains (eval forwards drop nothing). */
void lora_begin_micro(struct lora *l, int64_t step, int64_t micro);
/* Pipeline slots: several micro-batches in flight each keep their own saved
 * products. lora_reserve_slots makes n sets (0 or -1, counted as
 * activations); lora_use_slot(s) makes the forward / backward that follow
 * use set s (pp.c calls it with lora_begin_micro before each). */
int lora_reserve_slots(struct lora *l, int n);
void lora_use_slot(struct lora *l, int slot);
void lora_set_training(struct lora *l, int training);

/* Forward at a site: out [N, W] (the site's base projection output, or
 * that plus its residual where the model fuses the two; row stride W)
 * += scale * B (A inp) for each adapter of (layer, site), inp
 * [N, in] (compute dtype, backend memory). Saves scale * A inp for the
 * backward. */
void lora_fwd(struct lora *l, int layer, enum lora_site site, void *out, const void *inp);
/* Backward at a site, after the base projection's: accumulates dA, dB and
 * dinp [N, in] from dout [N, W] and the forward's inp. */
void lora_bwd(struct lora *l, int layer, enum lora_site site, void *dinp, const void *dout,
              const void *inp);

void lora_zero_grads(struct lora *l);
/* dp > 1: sum the adapter gradients over the dp group (an all-reduce; ZeRO
 * 1-2: a reduce-scatter into this rank's shard). Only the adapters travel.
 * 0 or -1. */
int lora_grad_sync(struct lora *l);
/* The squared global norm of the adapter gradients (after lora_grad_sync). */
double lora_grad_norm_sq(const struct lora *l);
/* AdamW over the adapter shard (backend adamw, weight decay on all
 * adapters), gradients times grad_scale (the clip factor); step from 1.
 * ZeRO 1-2: then all-gathers the values. 0 or -1. */
int lora_adamw(struct lora *l, const struct optim_cfg *c, double lr, double grad_scale,
               int64_t step);

/* Adapters in the model, and their values (tests): index i in [0, count). */
int lora_count(const struct lora *l);
struct lora_view {
    const char *base; /* HF name of the base weight ("model.layers.0.self_attn.q_proj.weight") */
    int layer, in, out;
    /* [r, in], [out, r] and their gradients: backend memory in the compute
     * dtype (host-addressable fp32 on the cpu backend only) */
    float *A, *B, *dA, *dB;
};
void lora_view(const struct lora *l, int i, struct lora_view *v);
int lora_rank(const struct lora *l);
double lora_scale(const struct lora *l);
/* Adapter parameters (sum of r * (in + out)), without the arena's padding. */
size_t lora_numel(const struct lora *l);
/* Every adapter value from host fp32 h (the arena's layout, as
 * lora_export_peft reads it): values and master. 0 or -1. */
int lora_set_values(struct lora *l, const float *h);

/* Checkpoints: this rank's shard of the adapter master and moments
 * (lora_master, lora_adam_m, lora_adam_v) and its rank-meta object (under
 * "lora"; the arrays stay valid until the next lora_ckpt_add or lora_free, as
 * the writer reads them at ckpt_commit); lora_ckpt_load reads them back from checkpoint dir for
 * `rank` (the same train.lora: refused otherwise). A checkpoint of another layout (world, dp,
 * tp, pp, ZeRO stage) is resharded: every rank reads every shard, assembles the whole adapters'
 * state and takes its own. 0 or -1. */
int lora_ckpt_add(struct lora *l, struct ckpt_writer *cw);
json_t *lora_ckpt_meta(const struct lora *l);
int lora_ckpt_load(struct lora *l, const char *dir, int rank, char *err, size_t errlen);

/* Continue from a PEFT adapter directory (adapter_config.json with the same
 * r and lora_alpha, adapter_model.safetensors with every adapter's lora_A /
 * lora_B, fp32 or bf16). 0 or -1 with a message naming the file. */
int lora_load_peft(struct lora *l, const char *dir, char *err, size_t errlen);

/* Write the PEFT adapter: DIR/adapter_config.json and
 * DIR/adapter_model.safetensors, whole tensors of every block (as at tp =
 * pp = 1). base_name: base_model_name_or_path. Every rank calls it (with tp
 * or pp > 1 the adapters are gathered over the world); rank 0 writes. 0 or
 * -1 with a message in err. */
int lora_export_peft(struct lora *l, const char *dir, const char *base_name, char *err,
                     size_t errlen);
/* Fold the adapters into the base weights (params, and master where the
 * engine has one):
 * W += scale * B A, for an exported merged model. 0 or -1. */
int lora_merge(struct lora *l);

#endif
