/* Fused classifier loss (softmax cross-entropy that turns bf16 logits into
 * their gradient in place), deterministic sums, the gradient norm and the
 * fused AdamW update (clipping folded into its gradient scale). Block reductions run in a fixed
 * tree order and sums over blocks go through a partial array summed by one
 * block, so results repeat bit for bit. */
#include <stdlib.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "worker/cuda/kernels.h"

typedef __nv_bfloat16 bf;

#define SUM_BLOCKS  512
#define SUM_THREADS 256
/* the 16-byte sum of squares: blocks of its partial sums (a multiple of
 * every H100 / H200 SM count's share: 8 blocks of 256 threads fill an SM) */
#define SUMV_BLOCKS 1056

/* Block-wide sum (all threads get it); blockDim.x a multiple of 32, <= 1024. */
__device__ float block_sum(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x / 32, l = threadIdx.x & 31, nw = blockDim.x / 32;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : 0.f;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x / 32, l = threadIdx.x & 31, nw = blockDim.x / 32;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

struct __align__(16) bf8 {
    __nv_bfloat162 h[4];
};

/* One block per row. Pass 1: online max / sum of exp over the V real
 * columns (16-byte loads); pass 2: write the gradient over all Vp columns. */
__global__ void __launch_bounds__(512)
    xent_kernel(bf *logits, float *losses, const int32_t *targets, int V, int Vp, float dscale) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    bf *x = logits + (size_t)row * Vp;
    int tgt = targets[row];
    float m = -INFINITY, s = 0.f;
    for (int i = threadIdx.x * 8; i < Vp; i += blockDim.x * 8) {
        bf8 v = *(const bf8 *)(x + i);
        float f[8];
        float lm = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 t = __bfloat1622float2(v.h[j]);
            f[2 * j] = (i + 2 * j < V) ? t.x : -INFINITY;
            f[2 * j + 1] = (i + 2 * j + 1 < V) ? t.y : -INFINITY;
            lm = fmaxf(lm, fmaxf(f[2 * j], f[2 * j + 1]));
        }
        if (lm == -INFINITY) continue;
        float nm = fmaxf(m, lm);
        s *= __expf(m - nm);
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += __expf(f[j] - nm);
        m = nm;
    }
    float gm = block_max(m, sh);
    s = (m == -INFINITY) ? 0.f : s * __expf(m - gm);
    float gs = block_sum(s, sh);
    float lse = gm + logf(gs);
    float xt = tgt >= 0 ? __bfloat162float(x[tgt]) : 0.f;
    __syncthreads(); /* everyone read x[tgt] before it is overwritten */
    float scale = tgt >= 0 ? dscale : 0.f;
    for (int i = threadIdx.x * 8; i < Vp; i += blockDim.x * 8) {
        bf8 v = *(const bf8 *)(x + i);
        bf8 o;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 t = __bfloat1622float2(v.h[j]);
            int c0 = i + 2 * j, c1 = c0 + 1;
            float g0 = c0 < V ? (__expf(t.x - lse) - (c0 == tgt)) * scale : 0.f;
            float g1 = c1 < V ? (__expf(t.y - lse) - (c1 == tgt)) * scale : 0.f;
            o.h[j] = __floats2bfloat162_rn(g0, g1);
        }
        *(bf8 *)(x + i) = o;
    }
    if (threadIdx.x == 0) losses[row] = tgt >= 0 ? lse - xt : 0.f;
}

extern "C" void lk_xent_fwd_bwd(lbf16 *logits, float *losses, const int32_t *targets, int N, int V,
                                int Vp, float dscale, lcuda_stream s) {
    if (Vp % 8) lcuda_fail(__FILE__, __LINE__, "lk_xent_fwd_bwd", "Vp must be a multiple of 8");
    /* Two passes over the row; the second mostly hits L2 (a row is Vp * 2
     * bytes and a few rows per SM are in flight). A register-resident
     * one-pass variant measured slower on the H200 (1.78 ms vs about 1.1 ms
     * for GPT-2 124M, mbs 16): one 1024-thread block per SM could not
     * overlap loading the next row with finishing the current one. */
    /* A persistent grid of one 1024-thread block per SM (a row per SM in
     * flight, so the second pass reads from L2) measured no faster on the
     * 1B shape in an A/B of three runs each (classifier 18.4-18.8 ms against
     * 18.2-18.6 ms, docs/perf.md) and was removed. */
    xent_kernel<<<N, 512, 0, (cudaStream_t)s>>>((bf *)logits, losses, targets, V, Vp, dscale);
    CUDA_CHECK_LAUNCH();
}

/* Vocabulary-parallel statistics: one block per row, the same online
 * max / sum as xent_kernel over the Vv real columns of this rank's slice. */
__global__ void __launch_bounds__(512)
    xent_vp_stats_kernel(const bf *logits, float *lse, float *tl, const int32_t *targets, int Vv,
                         int Vr) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    const bf *x = logits + (size_t)row * Vr;
    float m = -INFINITY, s = 0.f;
    for (int i = threadIdx.x * 8; i < Vv; i += blockDim.x * 8) {
        bf8 v = *(const bf8 *)(x + i);
        float f[8];
        float lm = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 t = __bfloat1622float2(v.h[j]);
            f[2 * j] = (i + 2 * j < Vv) ? t.x : -INFINITY;
            f[2 * j + 1] = (i + 2 * j + 1 < Vv) ? t.y : -INFINITY;
            lm = fmaxf(lm, fmaxf(f[2 * j], f[2 * j + 1]));
        }
        if (lm == -INFINITY) continue;
        float nm = fmaxf(m, lm);
        s *= __expf(m - nm);
#pragma unroll
        for (int j = 0; j < 8; j++)
            s += __expf(f[j] - nm);
        m = nm;
    }
    float gm = block_max(m, sh);
    s = (m == -INFINITY) ? 0.f : s * __expf(m - gm);
    float gs = block_sum(s, sh);
    if (threadIdx.x == 0) {
        int tgt = targets[row];
        lse[row] = Vv > 0 ? gm + logf(gs) : -INFINITY;
        tl[row] = tgt >= 0 && tgt < Vv ? __bfloat162float(x[tgt]) : 0.f;
    }
}

/* Vocabulary-parallel gradient in place, given the global log-sum-exp. */
__global__ void __launch_bounds__(512)
    xent_vp_grad_kernel(bf *logits, const float *lse_in, const int32_t *targets, int Vv, int Vr,
                        float dscale) {
    int row = blockIdx.x;
    bf *x = logits + (size_t)row * Vr;
    float z = lse_in[row];
    int tgt = targets[row];
    int skip = isinf(z);
    for (int i = threadIdx.x * 8; i < Vr; i += blockDim.x * 8) {
        bf8 v = *(const bf8 *)(x + i);
        bf8 o;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 t = __bfloat1622float2(v.h[j]);
            int c0 = i + 2 * j, c1 = c0 + 1;
            float g0 = !skip && c0 < Vv ? (__expf(t.x - z) - (c0 == tgt)) * dscale : 0.f;
            float g1 = !skip && c1 < Vv ? (__expf(t.y - z) - (c1 == tgt)) * dscale : 0.f;
            o.h[j] = __floats2bfloat162_rn(g0, g1);
        }
        *(bf8 *)(x + i) = o;
    }
}

extern "C" void lk_xent_vp_stats(const lbf16 *logits, float *lse, float *tl, const int32_t *targets,
                                 int N, int Vv, int Vr, lcuda_stream s) {
    if (Vr % 8) lcuda_fail(__FILE__, __LINE__, "lk_xent_vp_stats", "Vr must be a multiple of 8");
    if (N <= 0) return;
    xent_vp_stats_kernel<<<N, 512, 0, (cudaStream_t)s>>>((const bf *)logits, lse, tl, targets, Vv,
                                                         Vr);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_xent_vp_grad(lbf16 *logits, const float *lse_in, const int32_t *targets, int N,
                                int Vv, int Vr, float dscale, lcuda_stream s) {
    if (Vr % 8) lcuda_fail(__FILE__, __LINE__, "lk_xent_vp_grad", "Vr must be a multiple of 8");
    if (N <= 0) return;
    xent_vp_grad_kernel<<<N, 512, 0, (cudaStream_t)s>>>((bf *)logits, lse_in, targets, Vv, Vr,
                                                        dscale);
    CUDA_CHECK_LAUNCH();
}

/* Partial sums over a grid-stride range; T is float or bf16, SQ squares. */
template <typename T, int SQ> __global__ void sum_part_kernel(float *part, const T *x, size_t n) {
    __shared__ float sh[32];
    float acc = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        acc += SQ ? v * v : v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
/* *out = (acc ? *out : 0) + sum of part[0..np). */
__global__ void sum_final_kernel(float *out, const float *part, int np, int acc) {
    __shared__ float sh[32];
    float s = 0.f;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = acc ? *out + s : s;
}

/* The sum of squares of bf16 x in 16-byte vectors (x 16-byte aligned), two
 * vectors in flight per thread, the tail past the last whole pair of vectors
 * by block 0; each thread's range and the block tree are fixed by n, so the
 * result repeats bit for bit. */
__global__ void sumsq_vec_kernel(float *part, const bf *x, size_t n) {
    __shared__ float sh[32];
    float a0 = 0.f, a1 = 0.f;
    size_t stride = (size_t)gridDim.x * blockDim.x, n16 = n / 16;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < n16; v += stride) {
        bf8 p = ((const bf8 *)x)[2 * v], q = ((const bf8 *)x)[2 * v + 1];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 s = __bfloat1622float2(p.h[j]), t = __bfloat1622float2(q.h[j]);
            a0 += s.x * s.x + s.y * s.y;
            a1 += t.x * t.x + t.y * t.y;
        }
    }
    if (blockIdx.x == 0)
        for (size_t i = n16 * 16 + threadIdx.x; i < n; i += blockDim.x) {
            float f = __bfloat162float(x[i]);
            a0 += f * f;
        }
    float acc = block_sum(a0 + a1, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

extern "C" size_t lk_sum_scratch_bytes(size_t n) {
    (void)n;
    return (SUM_BLOCKS > SUMV_BLOCKS ? SUM_BLOCKS : SUMV_BLOCKS) * sizeof(float);
}

static int sum_blocks(size_t n) {
    size_t nb = (n + SUM_THREADS - 1) / SUM_THREADS;
    return nb > SUM_BLOCKS ? SUM_BLOCKS : (nb ? (int)nb : 1);
}

extern "C" void lk_sum(float *out, const float *x, size_t n, float *scratch, lcuda_stream s) {
    cudaStream_t st = (cudaStream_t)s;
    int blocks = sum_blocks(n);
    sum_part_kernel<float, 0><<<blocks, SUM_THREADS, 0, st>>>(scratch, x, n);
    CUDA_CHECK_LAUNCH();
    sum_final_kernel<<<1, 512, 0, st>>>(out, scratch, blocks, 0);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_sumsq_acc(float *acc, const lbf16 *g, size_t n, float *scratch, int fast,
                             lcuda_stream s) {
    cudaStream_t st = (cudaStream_t)s;
    int blocks = sum_blocks(n);
    if (fast && !((uintptr_t)g & 15) && n >= (size_t)16 * SUM_THREADS) {
        size_t nb = (n / 16 + SUM_THREADS - 1) / SUM_THREADS;
        blocks = nb > SUMV_BLOCKS ? SUMV_BLOCKS : (int)nb;
        sumsq_vec_kernel<<<blocks, SUM_THREADS, 0, st>>>(scratch, (const bf *)g, n);
    } else {
        sum_part_kernel<bf, 1><<<blocks, SUM_THREADS, 0, st>>>(scratch, (const bf *)g, n);
    }
    CUDA_CHECK_LAUNCH();
    sum_final_kernel<<<1, 512, 0, st>>>(acc, scratch, blocks, 1);
    CUDA_CHECK_LAUNCH();
}

#include "worker/cuda/k_optim_adamw.cuh"

extern "C" void lk_adamw(lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int step, lcuda_stream s) {
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    int vec =
        !(((uintptr_t)param | (uintptr_t)master | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) &
          15);
    size_t nb = (n / (vec ? 4 : 1) + 255) / 256 + 1;
    int blocks = nb > 132 * 16 ? 132 * 16 : (int)nb;
    adamw_kernel<<<blocks, 256, 0, (cudaStream_t)s>>>((bf *)param, master, (const bf *)grad, m, v,
                                                      n, lr, beta1, beta2, eps, weight_decay,
                                                      grad_scale, bc1, bc2, vec);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_adamw_multi(lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                               const struct lk_adamw_segs *segs, float lr, float beta1, float beta2,
                               float eps, float grad_scale, int step, lcuda_stream s) {
    adamw_multi_launch(1, param, master, grad, m, v, segs, lr, beta1, beta2, eps, grad_scale, step,
                       s);
}
