/* The AdamW device code shared by worker/cuda/k_optim.cu (the kernels the
 * product launches) and dev/cuda/adamw_variants.cu (bench_adamw, which checks
 * that the two multi-range kernels give the same bits and times them): the
 * per-element update, the single-range kernel, the grid-stride multi-range
 * kernel and the vectorised multi-range kernel with its scalar tail, and the
 * multi-range launch.
 *
 * Include after <cuda_bf16.h>, <cuda_runtime.h>, <math.h>, <stdint.h>,
 * worker/cuda/kernels.h and a `typedef __nv_bfloat16 bf;`. The header has no
 * includes of its own so that dev/cuda/adamw_variants.cu can include it
 * inside its namespace (the kernels there keep these names without colliding
 * with the product's at link time). */
#pragma once

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

/* The multi-range update's launch: the vectorised kernel (and its tail) for
 * 16-byte aligned ranges where multi2 is set, else the grid-stride kernel. */
static void adamw_multi_launch(int multi2, lbf16 *param, float *master, const lbf16 *grad, float *m,
                               float *v, const struct lk_adamw_segs *segs, float lr, float beta1,
                               float beta2, float eps, float grad_scale, int step, lcuda_stream s) {
    if (segs->n <= 0) return;
    size_t n = (size_t)segs->end[segs->n - 1];
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)step));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)step));
    int vec =
        !(((uintptr_t)param | (uintptr_t)master | (uintptr_t)grad | (uintptr_t)m | (uintptr_t)v) &
          15);
    if (vec && multi2) {
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
