/* CUDA kernels of the LoRA adapters (k_lora.cu; backend.h axpy_2d and
 * dropout). bf16 storage, fp32 arithmetic; enqueued on `s`. */
#ifndef LOOM_CUDA_K_LORA_H
#define LOOM_CUDA_K_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "worker/cuda/cuda_util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[r*ldd + c] = (beta ? dst[r*ldd + c] : 0) + alpha * src[r*lds + c]. */
void lk_lora_axpy_2d(uint16_t *dst, int ldd, const uint16_t *src, int lds, int rows, int cols,
                     float alpha, int beta, lcuda_stream s);
/* out[i] = lora_keep(seed, i, p) ? inp[i] / (1 - p) : 0 (out may equal inp). */
void lk_lora_dropout(uint16_t *out, const uint16_t *inp, size_t n, float p, uint64_t seed,
                     lcuda_stream s);

/* out[n] (bf16) = the n weights of the NF4 tensor q (worker/nf4_format.h,
 * device memory; k_nf4.cu): fp32 arithmetic as nf4_dequantize, one
 * rounding to bf16. fast = 1: 8 weights a thread where n % 8 == 0 and out
 * is 16-byte aligned (the nf4-vec row), else one a thread. */
void lk_nf4_dequant(void *out, const void *q, size_t n, int fast, lcuda_stream s);
/* The same for an NF4 tp shard of the ABSMAX layout (nf4_format.h; one fp32
 * absmax a block): as nf4_dequantize_absmax, one rounding to bf16. */
void lk_nf4_dequant_absmax(void *out, const void *q, size_t n, int fast, lcuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
