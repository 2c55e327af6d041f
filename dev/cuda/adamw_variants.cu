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
    if (segs->n <= 0) return;
    size_t n = (size_t)segs->end[segs->n - 1];
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    int vec =
        !(((uintptr_t)param | (uintptr_t)master | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) &
          15);
    if (vec && var == 1) {
        size_t n4 = n / 4;
        if (n4) {
            adamw_multi2_kernel<<<(unsigned)((n4 + 511) / 512), 256, 0, (cudaStream_t)s>>>(
                (bf *)param, master, (const bf *)grad, m, v, *segs, lr, beta1, beta2, eps,
                grad_scale, bc1, bc2);
            CUDA_CHECK_LAUNCH();
        }
        if (n % 4) {
            adamw_tail_kernel<<<1, 4, 0, (cudaStream_t)s>>>((bf *)param, master, (const bf *)grad,
                                                            m, v, *segs, n4 * 4, n, lr, beta1,
                                                            beta2, eps, grad_scale, bc1, bc2);
            CUDA_CHECK_LAUNCH();
        }
        return;
    }
    size_t nb = (n / (vec ? 4 : 1) + 255) / 256 + 1;
    int blocks = nb > 132 * 16 ? 132 * 16 : (int)nb;
    adamw_multi_kernel<<<blocks, 256, 0, (cudaStream_t)s>>>((bf *)param, master, (const bf *)grad,
                                                            m, v, *segs, lr, beta1, beta2, eps,
                                                            grad_scale, bc1, bc2, vec);
    CUDA_CHECK_LAUNCH();
}

} // namespace dev_adamw
