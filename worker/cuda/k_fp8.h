/* FP8 (E4M3) linear layers of a frozen base (train.precision "fp8" with
 * train.lora; docs/engine.md "FP8"): per-tensor scaling kernels (k_fp8.cu)
 * and the E4M3 x E4M3 GEMM (k_linear.cu).
 *
 * Scaling, one fp32 scale per tensor, "current" scaling (from this tensor's
 * own values, every call): amax = max |x|, scale = amax > 0 ? amax / 448 : 1
 * (448: the largest finite E4M3 value), q = e4m3(x / scale) with round to
 * nearest even and saturation to +-448 (satfinite; cuda_fp8.h
 * __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)). x / scale is an IEEE
 * fp32 division. The scale is computed and read on the device: no host
 * synchronisation anywhere. */
#ifndef LOOM_CUDA_K_FP8_H
#define LOOM_CUDA_K_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "worker/cuda/cuda_util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_FP8_E4M3_MAX 448.0f

/* *amax (device fp32, overwritten) = max |x[i]| over n bf16 values. Exact and
 * deterministic (a maximum does not depend on the order). */
void lk_fp8_amax(float *amax, const uint16_t *x, size_t n, lcuda_stream s);
/* q[i] = e4m3(x[i] / scale) for i < n, scale from *amax as above; when
 * scale_out is not NULL it receives the scale (device fp32). */
void lk_fp8_quant(uint8_t *q, float *scale_out, const float *amax, const uint16_t *x, size_t n,
                  lcuda_stream s);
/* The transposed copy: qt[c * rows + r] = e4m3(x[r * cols + c] / scale)
 * (x [rows][cols] row-major, qt [cols][rows]), scale from *amax; scale_out
 * as lk_fp8_quant. */
void lk_fp8_quant_t(uint8_t *qt, float *scale_out, const float *amax, const uint16_t *x, int rows,
                    int cols, lcuda_stream s);

/* qt[c * rows + r] = q[r * cols + c]: an E4M3 matrix [rows][cols] transposed
 * byte for byte (a frozen weight kept only as W8 gives the input-gradient GEMM
 * its W8T this way). rows and cols multiples of 4; q and qt 4-byte aligned. */
void lk_fp8_transpose(uint8_t *qt, const uint8_t *q, int rows, int cols, lcuda_stream s);
/* x[i] = bf16(e4m3 q[i] * *scale) for i < n (scale device fp32): the weight
 * the E4M3 GEMMs use, for a bf16 GEMM that the E4M3 path does not take. */
void lk_fp8_dequant(uint16_t *x, const uint8_t *q, const float *scale, size_t n, lcuda_stream s);

struct lk_blas;
/* Row-major D[n][m] (bf16) = (*a_scale * *b_scale) * B[n][k] . A[m][k]^T
 * (+ bias[m], bf16, when not NULL) (+ C[n][m], bf16, when not NULL: beta 1;
 * C may equal D), A and B E4M3 (k contiguous in both: cuBLASLt's "TN" form,
 * the one Hopper's FP8 kernels take), fp32 accumulation, D rounded to bf16
 * once. Needs m, n, k multiples of 16 and 16-byte aligned pointers (the
 * caller checks: lk_fp8_shape_ok), the scale pointers included: cuBLASLt
 * (13.1, H200) refuses the call with a scale pointer that is only 4-byte
 * aligned, after its heuristic offered algorithms (checked here: -1).
 * fast_accum 1: cuBLASLt's FP8 fast accumulation
 * (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores' partial sums are not
 * promoted to fp32 along K; faster, less accurate); 0 the default
 * promotion. Returns 0, or -1 when cuBLASLt has no algorithm for it or
 * refuses it (nothing written; the caller then takes the bf16 path). */
int lk_linear_fp8(struct lk_blas *b, uint16_t *D, const uint16_t *C, const uint16_t *bias,
                  const uint8_t *A, const float *a_scale, const uint8_t *B, const float *b_scale,
                  int m, int n, int k, int fast_accum);
/* 1 when lk_linear_fp8 takes these dimensions and pointers (NULL ok). */
int lk_fp8_shape_ok(int m, int n, int k, const void *D, const void *C, const void *bias);

#ifdef __cplusplus
}
#endif

#endif
