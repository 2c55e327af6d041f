/* The AdamW kernel variants that worker/cuda/k_optim.cu had, for
 * bench_adamw, which checks that they give the same bits and times them:
 * var 1 (the shipping one: two quads a thread, every load before any math,
 * streaming cache hints) and var 0 (the grid-stride kernel, which the
 * shipping file keeps only for ranges not 16-byte aligned). The kernels are
 * worker/cuda/k_optim_adamw.cuh, included in a namespace so that they do not
 * collide with the product's; the variant is passed by the caller instead of
 * LOOM_ADAMW_VARIANT. Not linked into the product. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "dev/cuda/dev_kernels.h"
#include "worker/cuda/kernels.h"

namespace dev_adamw {

typedef __nv_bfloat16 bf;

#include "worker/cuda/k_optim_adamw.cuh"

extern "C" void dev_adamw_multi(int var, lbf16 *param, float *master, const lbf16 *grad, float *m,
                                float *v, const struct lk_adamw_segs *segs, float lr, float beta1,
                                float beta2, float eps, float grad_scale, int step,
                                lcuda_stream s) {
    adamw_multi_launch(var == 1, param, master, grad, m, v, segs, lr, beta1, beta2, eps, grad_scale,
                       step, s);
}

} // namespace dev_adamw
