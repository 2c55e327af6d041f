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

/* Dropout fused into an adapter's x.A products (backend.h lora_drop_fwd /
 * lora_drop_bwd; r <= 64). The mask of element (n, c) of x [N, in] (row
 * stride ldx) is lora_keep(seed, n * mld + moff + c, p): mld = in, moff = 0
 * for a whole input, the whole row and the column offset for a column slice.
 * fwd: H[n*ldh + j] = alpha * sum_c drop(x)[n, c] A[j*in + c].
 * bwd: dA[j*in + c] += sum_n dH[n*ldh + j] drop(x)[n, c] (per row-chunk fp32
 * partials in ws, lk_lora_drop_ws_bytes of them, summed in a fixed order);
 * dx (NULL: none) [n*lddx + c] += keep(n, c) / (1 - p) * sum_j dH[n*ldh + j]
 * A[j*in + c]. The forward may split K over blocks and sum the ranges'
 * partials through ws (worker/lora_drop.h). Deterministic: the same bytes on
 * every run. tc = 1: the
 * tensor-core kernels (the masked x rounded to bf16 once), 0: the CUDA-core
 * ones (fp32 throughout); the backend uses tc = 1. */
size_t lk_lora_drop_ws_bytes(int N, int in, int r);
void lk_lora_drop_fwd(uint16_t *H, int ldh, const uint16_t *x, int ldx, const uint16_t *A, int N,
                      int in, int r, float alpha, float p, uint64_t seed, uint64_t mld,
                      uint64_t moff, float *ws, int tc, lcuda_stream s);
void lk_lora_drop_bwd(uint16_t *dA, uint16_t *dx, int lddx, const uint16_t *dH, int ldh,
                      const uint16_t *x, int ldx, const uint16_t *A, int N, int in, int r, float p,
                      uint64_t seed, uint64_t mld, uint64_t moff, float *ws, int tc,
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
