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
 * resident params window) gives every tensor of the rank a view
 * (dp: every tensor, each rank quantizing the whole base as one process
 * does; pp: the stage's tensors, whole, the others none; tp: each rank
 * quantizes whole tensors and keeps its shard's part): the
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
struct model_config;
struct model_tensor;
struct nf4;

/* The 256 values of the signed 8-bit map (bitsandbytes' dynamic map:
 * +-10^(i-6) times the midpoints of linspace(0.1, 1, 2^i + 1) for i < 7,
 * 0 and 1), ascending. */
const float *nf4_map8(void);

/* The quantizer's knobs (loom-worker's tuning rows nf4-fast, nf4-threads,
 * nf4-overlap; docs/engine.md "QLoRA"): process-wide, set once at start-up
 * before any quantization. Default {1, 0, 1}. */
struct nf4_opts {
    int fast;     /* 0: nf4_quantize is nf4_quantize_serial (one thread) */
    long threads; /* threads of the fast quantizer; 0: the online CPUs */
    int overlap;  /* engine storage: upload a tensor's codes as they are done */
};
#define NF4_MAX_THREADS 32 /* the cap on threads (memory bandwidth bound beyond) */
void nf4_configure(const struct nf4_opts *o);
int nf4_threads(void); /* the fast quantizer's thread count */

/* Quantize w[n] into out[nf4_bytes(n)]: nf4_quantize_mt with nf4_threads(),
 * or the serial reference when nf4-fast is off. Every variant writes the
 * same bytes for any thread count (tests/unit/test_nf4_threads.c). */
void nf4_quantize(const float *w, size_t n, uint8_t *out);
/* The reference: one thread, a binary search over the table per weight. */
void nf4_quantize_serial(const float *w, size_t n, uint8_t *out);
/* Blocks over `threads` pthreads (<= 0: nf4_threads()), the nearest code by
 * comparisons with 15 exact thresholds (no branches). */
void nf4_quantize_mt(const float *w, size_t n, uint8_t *out, int threads);
/* nf4_quantize_mt in steps of 16M weights: ready(ctx, off, len) is called
 * on the calling thread with out[off, off + len) final (the codes of step
 * s - 1 while the threads quantize step s; at the end the rest of the
 * buffer), so that the caller can upload them meanwhile. */
void nf4_quantize_pipe(const float *w, size_t n, uint8_t *out, int threads,
                       void (*ready)(void *ctx, size_t off, size_t len), void *ctx);
/* w[n] from q (nf4_format.h). */
void nf4_dequantize(const uint8_t *q, size_t n, float *w);

/* 1 when tensor `name` of a block is held in NF4 (a block linear weight). */
int nf4_is_quantized(const struct engine *e, int tensor);
/* The same for a layout entry (kind, layer and rank). */
int nf4_tensor_quantized(const struct model_tensor *t);

/* ---- tensor-parallel shards (nf4_format.h "tensor-parallel shards") ---- */

/* Tensor t's shard for tp rank idx (nf4_shard_geom over its shape and
 * split); returns s->layout. */
int nf4_shard_of(const struct model_tensor *t, int tp, int idx, struct nf4_shard *s);
/* The shard s's buffer (nf4_shard_bytes(s)) from the whole tensor's
 * whole[nf4_bytes(s->numel)]: slices of it (SLICE) or the runs' codes and
 * their blocks' absmax dequantized (ABSMAX). Not for NF4_SHARD_NONE. */
void nf4_shard_extract(const struct nf4_shard *s, const uint8_t *whole, uint8_t *out);
/* w[n] from an ABSMAX buffer q (nf4a_bytes(n)): NF4_CODE[code] * absmax. */
void nf4_dequantize_absmax(const uint8_t *q, size_t n, float *w);
/* w[n] from a buffer of `layout` (NF4_SHARD_SLICE: nf4_dequantize). */
void nf4_dequantize_layout(int layout, const uint8_t *q, size_t n, float *w);
/* 0 when every block linear weight of model c splits over tp ranks on
 * 64-weight boundaries, else -1 with a message naming the tensor, its shape
 * and tp (a block on two ranks is not supported: docs/engine.md "QLoRA"). */
int nf4_tp_check(const struct model_config *c, int tp, char *err, size_t errlen);

/* Storage for engine e as above; sets e->nf4 (freed by engine_free). 0, or
 * -1 with a message (unsupported place or backend, out of memory). */
int nf4_attach(struct engine *e, char *err, size_t errlen);
void nf4_free(struct nf4 *q); /* NULL ok */

/* engine_params_from_host's hook: the quantized tensors meeting flat range
 * [off, off + n) of src (elt bytes a value: 4 fp32, 2 bf16). 1 when the
 * range is all quantized weights, 0 when not, -1 on error (out of memory, or
 * a tp share of a tensor that nf4_put_full must be given whole). */
int nf4_put(struct nf4 *q, size_t off, const void *src, size_t n, size_t elt);

/* tp > 1: 1 when layout tensor `tensor` is one this rank holds in NF4, which
 * the loaders hand over whole (nf4_put_full) instead of their tp share. */
int nf4_full_tensor(const struct nf4 *q, int tensor);
/* The whole tensor's (tp = 1 layout) weights [off, off + n) of `tensor`
 * (elt bytes a value, as nf4_put): quantized as one process does once all
 * have arrived, and this rank's shard kept (nf4_shard_extract). 0 or -1. */
int nf4_put_full(struct nf4 *q, int tensor, size_t off, const void *src, size_t n, size_t elt);

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
/* Seconds spent in nf4_put so far (widening, quantization and upload). */
double nf4_put_seconds(const struct nf4 *q);

#endif
