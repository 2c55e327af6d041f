/* LoRA adapters (spec train.lora; docs/engine.md "LoRA").
 *
 * Each targeted projection y = W x of every block gets A [r, in] and
 * B [out, r]: y = W x + (alpha / r) * B (A x). W (and every other base
 * tensor) is frozen: the model computes no gradient for it and the optimizer
 * leaves it alone; the adapters are trained by their own fp32 AdamW (the
 * adapter values are their own master). A starts kaiming-uniform
 * (U(-1/sqrt(in), 1/sqrt(in)), the bound PEFT's kaiming_uniform_(a=sqrt(5))
 * gives) from a stream keyed by (seed, tensor name); B starts at zero, so the
 * first forward equals the base model's.
 *
 * Targets: llama q, k, v, o, gate, up, down (q|k|v and gate|up are column
 * ranges of the fused projections); gpt2 attn, proj, fc, fc2.
 *
 * Supported: the cpu backend (fp32), data parallelism (tp = pp = 1; ZeRO 0,
 * checked by the worker), no optimizer offload, dropout 0. lora_new refuses
 * anything else with LORA_UNSUPPORTED. */
#ifndef LOOM_WORKER_LORA_H
#define LOOM_WORKER_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "worker/optim.h"

struct model;
struct lora;

/* The projection sites of a block the model calls the adapters at. */
enum lora_site { LORA_SITE_QKV = 0, LORA_SITE_O, LORA_SITE_FC, LORA_SITE_DOWN, LORA_NSITES };

struct lora_opts {
    int rank;
    double alpha, dropout;
    const char *const *targets; /* spec names (api/jobspec.c) */
    int n_targets;
    uint64_t seed;
};

/* Adapters for every block of model m (which must have tp = pp = 1 on the cpu
 * backend). On refusal returns NULL with a code ("LORA_UNSUPPORTED",
 * "OUT_OF_MEMORY") and a message naming the values in code / err. */
struct lora *lora_new(struct model *m, const struct lora_opts *o, const char **code, char *err,
                      size_t errlen);
void lora_free(struct lora *l); /* NULL ok */

/* Forward at a site: out [N, W] (the site's base projection output, row
 * stride W) += scale * B (A inp) for each adapter of (layer, site), inp
 * [N, in]. Saves A inp for the backward. */
void lora_fwd(struct lora *l, int layer, enum lora_site site, float *out, const float *inp);
/* Backward at a site, after the base projection's: accumulates dA, dB and
 * dinp [N, in] from dout [N, W] and the forward's inp. */
void lora_bwd(struct lora *l, int layer, enum lora_site site, float *dinp, const float *dout,
              const float *inp);

void lora_zero_grads(struct lora *l);
/* dp > 1: sum dA and dB over the dp group (engine hooks.allreduce_sum), so
 * every rank holds the global gradient and takes the same AdamW step. Only
 * the adapters travel. 0 or -1. */
int lora_grad_sync(struct lora *l);
double lora_grad_norm_sq(const struct lora *l);
/* AdamW over every adapter (formula of worker/optim.h, weight decay on all
 * adapters), gradients times grad_scale (the clip factor); step from 1. */
void lora_adamw(struct lora *l, const struct optim_cfg *c, double lr, double grad_scale,
                int64_t step);

/* Adapters in the model, and their values (tests): index i in [0, count). */
int lora_count(const struct lora *l);
struct lora_view {
    const char *base; /* HF name of the base weight ("model.layers.0.self_attn.q_proj.weight") */
    int layer, in, out;
    float *A, *B, *dA, *dB; /* [r, in], [out, r] and their gradients */
};
void lora_view(const struct lora *l, int i, struct lora_view *v);
int lora_rank(const struct lora *l);
double lora_scale(const struct lora *l);

/* Write the PEFT adapter: DIR/adapter_config.json and
 * DIR/adapter_model.safetensors. base_name: base_model_name_or_path. 0 or
 * -1 with a message in err. */
int lora_export_peft(const struct lora *l, const char *dir, const char *base_name, char *err,
                     size_t errlen);
/* Fold the adapters into the base weights (params and master):
 * W += scale * B A, for an exported merged model. 0 or -1. */
int lora_merge(struct lora *l);

#endif
