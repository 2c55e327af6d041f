/* QLoRA's frozen base: the block linear weights held in NF4 with double
 * quantization (worker/nf4_format.h; docs/engine.md "QLoRA"), dequantized
 * one block at a time into a compute-dtype scratch for the matmuls.
 *
 * Host quantizer: nf4_quantize writes the format of nf4_format.h for n fp32
 * weights; nf4_dequantize reads it back (the reference the backends' kernels
 * match: cpu fp32 exactly, cuda rounded to bf16 once).
 *
 * Engine storage (train.quantize_base "nf4" with train.lora): nf4_attach
 * over an engine made with engine_place.frozen and windows_later (no
 * resident params window) and tp = 1 gives every tensor of the rank a view
 * (dp: every tensor, each rank quantizing the whole base as one process
 * does; pp: the stage's tensors, whole, the others none): the
 * block linear weights ("model.layers.N.*_proj.weight", gpt2's c_attn /
 * c_proj / c_fc weights) a slot in one scratch of a block's linear weights,
 * every other tensor (embeddings, norms, biases, lm_head) its own
 * compute-dtype buffer. engine_params_from_host(_raw) then quantizes the
 * linear weights as they arrive (whole tensors, or pieces collected on the
 * host until a tensor is complete), and nf4_layer(l) fills the scratch with
 * block l's weights before the model uses them (model.c; nothing to do when
 * it holds them already). Memory (counted in e->mem.params, as the planner
 * counts it): nf4_bytes per linear weight, the scratch, the other tensors. */
#ifndef LOOM_WORKER_NF4_H
#define LOOM_WORKER_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "worker/nf4_format.h"

struct engine;
struct nf4;

/* The 256 values of the signed 8-bit map (bitsandbytes' dynamic map:
 * +-10^(i-6) times the midpoints of linspace(0.1, 1, 2^i + 1) for i < 7,
 * 0 and 1), ascending. */
const float *nf4_map8(void);

/* Quantize w[n] into out[nf4_bytes(n)] (OpenMP over blocks; the result
 * does not depend on the thread count). */
void nf4_quantize(const float *w, size_t n, uint8_t *out);
/* w[n] from q (nf4_format.h). */
void nf4_dequantize(const uint8_t *q, size_t n, float *w);

/* 1 when tensor `name` of a block is held in NF4 (a block linear weight). */
int nf4_is_quantized(const struct engine *e, int tensor);

/* Storage for engine e as above; sets e->nf4 (freed by engine_free). 0, or
 * -1 with a message (unsupported place or backend, out of memory). */
int nf4_attach(struct engine *e, char *err, size_t errlen);
void nf4_free(struct nf4 *q); /* NULL ok */

/* engine_params_from_host's hook: the quantized tensors meeting flat range
 * [off, off + n) of src (elt bytes a value: 4 fp32, 2 bf16). 0 or -1. */
int nf4_put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt);

/* Flat range [off, off + n) of this rank's base as fp32 into host dst, for
 * the exports (engine_opt_read of the frozen "master"): a quantized tensor
 * dequantized from its codes (the NF4 base, not the weights it was made
 * from) plus what the delta hook adds; every other tensor from its buffer;
 * tensors this rank does not hold (another pp stage's) as zeros. 0 or -1
 * (out of memory). */
int nf4_read(struct nf4 *q, size_t off, size_t n, float *dst);

/* The merged export (lora_merge): from now on nf4_read passes each NF4
 * tensor's dequantized weights (fp32 [rank_numel]) with the tensor's index
 * to fn, which adds (alpha/r) B A in place; NULL fn: none. The codes, which training
 * used, stay as they were, and no merged copy of the base is kept: each
 * weight is merged as the exporter reads it. */
void nf4_set_delta(struct nf4 *q, void (*fn)(void *user, int tensor, float *w), void *user);

/* Block `layer`'s linear weights dequantized into the scratch (their
 * views), unless the scratch holds them already. */
void nf4_layer(struct nf4 *q, int layer);

/* Quantized tensors, their weights and bytes (tests, logs). */
void nf4_stats(const struct nf4 *q, int *tensors, size_t *weights, size_t *bytes);

#endif
