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

extern "C" size_t lk_sum_scratch_bytes(size_t n) {
    (void)n;
    return SUM_BLOCKS * sizeof(float);
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

extern "C" void lk_sumsq_acc(float *acc, const lbf16 *g, size_t n, float *scratch, lcuda_stream s) {
    cudaStream_t st = (cudaStream_t)s;
    int blocks = sum_blocks(n);
    sum_part_kernel<bf, 1><<<blocks, SUM_THREADS, 0, st>>>(scratch, (const bf *)g, n);
    CUDA_CHECK_LAUNCH();
    sum_final_kernel<<<1, 512, 0, st>>>(acc, scratch, blocks, 1);
    CUDA_CHECK_LAUNCH();
}

/* AdamW as torch.optim.AdamW (decoupled decay, bias correction):
 * w -= lr * (mh / (sqrt(vh) + eps) + wd * w), g = grad * grad_scale. */
__device__ __forceinline__ float adamw_one(float g, float *m, float *v, float w, float lr, float b1,
                                           float b2, float eps, float wd, float bc1, float bc2) {
    float mi = b1 * *m + (1.f - b1) * g;
    float vi = b2 * *v + (1.f - b2) * g * g;
    *m = mi;
    *v = vi;
    return w - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * w);
}

/* vec: all pointers 16-byte aligned; then four elements a thread per step
 * (float4 master/moments, 8-byte bf16 loads), and a scalar tail. */
__global__ void adamw_kernel(bf *param, float *master, const bf *grad, float *m, float *v, size_t n,
                             float lr, float b1, float b2, float eps, float wd, float gscale,
                             float bc1, float bc2, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t n4 = vec ? n / 4 : 0;
    for (size_t q = tid; q < n4; q += stride) {
        float4 w = ((const float4 *)master)[q], mm = ((const float4 *)m)[q],
               vv = ((const float4 *)v)[q];
        uint2 graw = ((const uint2 *)grad)[q];
        float2 g01 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.x);
        float2 g23 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.y);
        w.x = adamw_one(g01.x * gscale, &mm.x, &vv.x, w.x, lr, b1, b2, eps, wd, bc1, bc2);
        w.y = adamw_one(g01.y * gscale, &mm.y, &vv.y, w.y, lr, b1, b2, eps, wd, bc1, bc2);
        w.z = adamw_one(g23.x * gscale, &mm.z, &vv.z, w.z, lr, b1, b2, eps, wd, bc1, bc2);
        w.w = adamw_one(g23.y * gscale, &mm.w, &vv.w, w.w, lr, b1, b2, eps, wd, bc1, bc2);
        ((float4 *)master)[q] = w;
        ((float4 *)m)[q] = mm;
        ((float4 *)v)[q] = vv;
        __nv_bfloat162 p01 = __floats2bfloat162_rn(w.x, w.y), p23 = __floats2bfloat162_rn(w.z, w.w);
        uint2 praw;
        praw.x = *(uint32_t *)&p01;
        praw.y = *(uint32_t *)&p23;
        ((uint2 *)param)[q] = praw;
    }
    for (size_t i = n4 * 4 + tid; i < n; i += stride) {
        float w = adamw_one(__bfloat162float(grad[i]) * gscale, &m[i], &v[i], master[i], lr, b1, b2,
                            eps, wd, bc1, bc2);
        master[i] = w;
        param[i] = __float2bfloat16(w);
    }
}

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

/* Several adjacent AdamW ranges sharing every hyper-parameter but the weight
 * decay, in one launch: the segment table goes to shared memory. A thread's
 * elements only move forward (grid-stride loop), so it finds its first
 * segment by one binary search and then advances a running segment index;
 * a binary search per element cost twice the memory floor (1.9 vs 0.9 ms on
 * GPT-2 124M). */
__device__ __forceinline__ int adamw_seg_find(const int64_t *send, int ns, int64_t i) {
    int lo = 0, hi = ns - 1; /* first segment whose end > i */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (send[mid] > i)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

__global__ void adamw_multi_kernel(bf *param, float *master, const bf *grad, float *m, float *v,
                                   struct lk_adamw_segs segs, float lr, float b1, float b2,
                                   float eps, float gscale, float bc1, float bc2, int vec) {
    __shared__ int64_t send[LK_ADAMW_MAXSEG];
    __shared__ float swd[LK_ADAMW_MAXSEG];
    int ns = segs.n;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
        send[i] = segs.end[i];
        swd[i] = segs.wd[i];
    }
    __syncthreads();
    size_t n = (size_t)send[ns - 1];
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t n4 = vec ? n / 4 : 0;
    int seg = tid < n4 ? adamw_seg_find(send, ns, (int64_t)(tid * 4)) : 0;
    for (size_t q = tid; q < n4; q += stride) {
        float wd4[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t i = (int64_t)(q * 4 + j);
            while (send[seg] <= i)
                seg++;
            wd4[j] = swd[seg];
        }
        float4 w = ((const float4 *)master)[q], mm = ((const float4 *)m)[q],
               vv = ((const float4 *)v)[q];
        uint2 graw = ((const uint2 *)grad)[q];
        float2 g01 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.x);
        float2 g23 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.y);
        w.x = adamw_one(g01.x * gscale, &mm.x, &vv.x, w.x, lr, b1, b2, eps, wd4[0], bc1, bc2);
        w.y = adamw_one(g01.y * gscale, &mm.y, &vv.y, w.y, lr, b1, b2, eps, wd4[1], bc1, bc2);
        w.z = adamw_one(g23.x * gscale, &mm.z, &vv.z, w.z, lr, b1, b2, eps, wd4[2], bc1, bc2);
        w.w = adamw_one(g23.y * gscale, &mm.w, &vv.w, w.w, lr, b1, b2, eps, wd4[3], bc1, bc2);
        ((float4 *)master)[q] = w;
        ((float4 *)m)[q] = mm;
        ((float4 *)v)[q] = vv;
        __nv_bfloat162 p01 = __floats2bfloat162_rn(w.x, w.y), p23 = __floats2bfloat162_rn(w.z, w.w);
        uint2 praw;
        praw.x = *(uint32_t *)&p01;
        praw.y = *(uint32_t *)&p23;
        ((uint2 *)param)[q] = praw;
    }
    size_t t0 = n4 * 4 + tid;
    if (t0 < n) seg = adamw_seg_find(send, ns, (int64_t)t0);
    for (size_t i = t0; i < n; i += stride) {
        while (send[seg] <= (int64_t)i)
            seg++;
        float w = adamw_one(__bfloat162float(grad[i]) * gscale, &m[i], &v[i], master[i], lr, b1, b2,
                            eps, swd[seg], bc1, bc2);
        master[i] = w;
        param[i] = __float2bfloat16(w);
    }
}

/* The multi-range kernel for 16-byte aligned ranges (the grid-stride kernel
 * above serves the others; as the vectorised path it lost the measurement
 * and lives on in dev/cuda/adamw_variants.cu): two quads per thread and
 * iteration with every load issued before any math (more bytes in flight
 * per thread), streaming cache hints (each byte is touched once), and one
 * block per 256 quads with no grid-stride cap. Same arithmetic per element
 * as adamw_multi_kernel, so results are bit-identical. */
__device__ __forceinline__ void adamw_quad(float4 &w, float4 &mm, float4 &vv, uint2 graw,
                                           const float *wd4, float lr, float b1, float b2,
                                           float eps, float gscale, float bc1, float bc2) {
    float2 g01 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.x);
    float2 g23 = __bfloat1622float2(*(const __nv_bfloat162 *)&graw.y);
    w.x = adamw_one(g01.x * gscale, &mm.x, &vv.x, w.x, lr, b1, b2, eps, wd4[0], bc1, bc2);
    w.y = adamw_one(g01.y * gscale, &mm.y, &vv.y, w.y, lr, b1, b2, eps, wd4[1], bc1, bc2);
    w.z = adamw_one(g23.x * gscale, &mm.z, &vv.z, w.z, lr, b1, b2, eps, wd4[2], bc1, bc2);
    w.w = adamw_one(g23.y * gscale, &mm.w, &vv.w, w.w, lr, b1, b2, eps, wd4[3], bc1, bc2);
}

__device__ __forceinline__ uint2 bf16x4(float4 w) {
    __nv_bfloat162 p01 = __floats2bfloat162_rn(w.x, w.y), p23 = __floats2bfloat162_rn(w.z, w.w);
    uint2 praw;
    praw.x = *(uint32_t *)&p01;
    praw.y = *(uint32_t *)&p23;
    return praw;
}

__global__ void adamw_multi2_kernel(bf *param, float *master, const bf *grad, float *m, float *v,
                                    struct lk_adamw_segs segs, float lr, float b1, float b2,
                                    float eps, float gscale, float bc1, float bc2) {
    __shared__ int64_t send[LK_ADAMW_MAXSEG];
    __shared__ float swd[LK_ADAMW_MAXSEG];
    int ns = segs.n;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
        send[i] = segs.end[i];
        swd[i] = segs.wd[i];
    }
    __syncthreads();
    size_t n4 = (size_t)send[ns - 1] / 4;
    /* block b covers quads [b*512, b*512 + 512): thread t does t and t+256 */
    size_t q0 = (size_t)blockIdx.x * 512 + threadIdx.x, q1 = q0 + 256;
    if (q0 >= n4) return;
    int has1 = q1 < n4;
    float4 w0 = __ldcs((const float4 *)master + q0), m0 = __ldcs((const float4 *)m + q0),
           v0 = __ldcs((const float4 *)v + q0);
    uint2 g0 = __ldcs((const uint2 *)grad + q0);
    float4 w1 = w0, m1 = m0, v1 = v0;
    uint2 g1 = g0;
    if (has1) {
        w1 = __ldcs((const float4 *)master + q1), m1 = __ldcs((const float4 *)m + q1),
        v1 = __ldcs((const float4 *)v + q1);
        g1 = __ldcs((const uint2 *)grad + q1);
    }
    int seg = adamw_seg_find(send, ns, (int64_t)(q0 * 4));
    float wd4[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        while (send[seg] <= (int64_t)(q0 * 4 + j))
            seg++;
        wd4[j] = swd[seg];
    }
    adamw_quad(w0, m0, v0, g0, wd4, lr, b1, b2, eps, gscale, bc1, bc2);
    __stcs((float4 *)master + q0, w0);
    __stcs((float4 *)m + q0, m0);
    __stcs((float4 *)v + q0, v0);
    __stcs((uint2 *)param + q0, bf16x4(w0));
    if (has1) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            while (send[seg] <= (int64_t)(q1 * 4 + j))
                seg++;
            wd4[j] = swd[seg];
        }
        adamw_quad(w1, m1, v1, g1, wd4, lr, b1, b2, eps, gscale, bc1, bc2);
        __stcs((float4 *)master + q1, w1);
        __stcs((float4 *)m + q1, m1);
        __stcs((float4 *)v + q1, v1);
        __stcs((uint2 *)param + q1, bf16x4(w1));
    }
}

/* the scalar tail of variant 1 (n % 4 elements) */
__global__ void adamw_tail_kernel(bf *param, float *master, const bf *grad, float *m, float *v,
                                  struct lk_adamw_segs segs, size_t lo, size_t n, float lr,
                                  float b1, float b2, float eps, float gscale, float bc1,
                                  float bc2) {
    size_t i = lo + threadIdx.x;
    if (i >= n) return;
    int seg = 0;
    while (segs.end[seg] <= (int64_t)i)
        seg++;
    float w = adamw_one(__bfloat162float(grad[i]) * gscale, &m[i], &v[i], master[i], lr, b1, b2,
                        eps, segs.wd[seg], bc1, bc2);
    master[i] = w;
    param[i] = __float2bfloat16(w);
}

extern "C" void lk_adamw_multi(lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                               const struct lk_adamw_segs *segs, float lr, float beta1, float beta2,
                               float eps, float grad_scale, int step, lcuda_stream s) {
    if (segs->n <= 0) return;
    size_t n = (size_t)segs->end[segs->n - 1];
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    int vec =
        !(((uintptr_t)param | (uintptr_t)master | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) &
          15);
    if (vec) {
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
