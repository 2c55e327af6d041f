/* Kernel variants that lost a measurement, kept for the GPU kernel test
 * (tests/gpu/test_kernels.c) and the benches (tests/gpu/bench_*.c) that
 * compare them with the shipping kernels; the product (worker/cuda/) links
 * none of this. Each function is the shipping entry point of the same name
 * (lk_* in worker/cuda/kernels.h) as it was when the variants were measured,
 * with the variant an argument:
 *   dev_norm_*   var 0-4: the norm generations (k_norm.cu's top comment;
 *                1 is the one that ships);
 *   dev_attn_*   fwd var 0-1 the 64-query kernel at two register budgets,
 *                2 the 128-query kernel (ships); bwd var 0-1 the two-kernel
 *                scheme at two budgets, 2-4 the fused backward, 5 (ships)
 *                var 1's dK/dV kernel with the 128-query dQ kernel;
 *   dev_adamw_*  var 0 the grid-stride kernel, 1 (ships) two quads a thread.
 * Same shapes and contracts as the lk_* functions. */
#ifndef LOOM_DEV_CUDA_DEV_KERNELS_H
#define LOOM_DEV_CUDA_DEV_KERNELS_H

#include <stddef.h>

#include "worker/cuda/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void dev_norm_fwd(int var, lbf16 *out, float *mean, float *rstd, const lbf16 *x, const lbf16 *w,
                  const lbf16 *bias, int N, int C, float eps, int rms, lcuda_stream s);
void dev_residual_norm_fwd(int var, lbf16 *res, lbf16 *out, float *mean, float *rstd,
                           const lbf16 *a, const lbf16 *b, const lbf16 *w, const lbf16 *bias, int N,
                           int C, float eps, int rms, lcuda_stream s);
size_t dev_norm_scratch_bytes(int N, int C);
void dev_norm_bwd(int var, lbf16 *dx, lbf16 *dw, lbf16 *dbias, float *scratch, const lbf16 *dout,
                  const lbf16 *x, const lbf16 *w, const float *mean, const float *rstd, int N,
                  int C, int rms, lcuda_stream s);

void dev_attn_fwd(int var, lbf16 *out, float *lse, const lbf16 *q, const lbf16 *k, const lbf16 *v,
                  int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv, int hd,
                  lcuda_stream s);
size_t dev_attn_scratch_bytes(int B, int T, int H, int Hkv, int hd);
void dev_attn_bwd(int var, lbf16 *dq, lbf16 *dk, lbf16 *dv, float *scratch, const lbf16 *dout,
                  const lbf16 *out, const float *lse, const lbf16 *q, const lbf16 *k,
                  const lbf16 *v, int ld_q, int ld_kv, int ld_o, int B, int T, int H, int Hkv,
                  int hd, int accumulate, lcuda_stream s);

void dev_adamw_multi(int var, lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                     const struct lk_adamw_segs *segs, float lr, float beta1, float beta2,
                     float eps, float grad_scale, int step, lcuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
