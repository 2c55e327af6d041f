/* E4M3 per-tensor scaling kernels (k_fp8.h): the amax reduction, the cast and
 * the cast-transpose that make the frozen weights' fp8 copies and quantize a
 * linear layer's input (forward) or output gradient (input gradient) before
 * each FP8 GEMM. All three read what they need from device memory (the amax
 * the previous kernel wrote), so the host never waits. Memory-bound: 16-byte
 * loads where the pointer and the count allow. */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "worker/cuda/k_fp8.h"

#define FP8_THREADS 256
#define FP8_MAXGRID 2048

static int grid_for(size_t work) {
    size_t g = (work + FP8_THREADS - 1) / FP8_THREADS;
    if (g < 1) g = 1;
    return g > FP8_MAXGRID ? FP8_MAXGRID : (int)g;
}

static int vec_ok(const void *p, size_t n) {
    return ((uintptr_t)p & 15) == 0 && n % 8 == 0;
}

/* Nonnegative floats order as their bit patterns do: atomicMax on the bits
 * is an exact, order-free maximum. */
__global__ void __launch_bounds__(FP8_THREADS)
    fp8_amax_kernel(unsigned *out, const __nv_bfloat16 *x, size_t n, int vec) {
    float m = 0.f;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        const uint4 *xv = (const uint4 *)x;
        for (size_t i = tid; i < n / 8; i += stride) {
            uint4 v = xv[i];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
    } else {
        for (size_t i = tid; i < n; i += stride)
            m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    }
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __shared__ float sh[FP8_THREADS / 32];
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = sh[0];
        for (int w = 1; w < FP8_THREADS / 32; w++)
            b = fmaxf(b, sh[w]);
        atomicMax(out, __float_as_uint(b));
    }
}

__device__ __forceinline__ float fp8_scale_of(float amax) {
    return amax > 0.f ? __fdiv_rn(amax, LK_FP8_E4M3_MAX) : 1.f;
}

__device__ __forceinline__ uint8_t fp8_q(float v, float scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
}

__global__ void __launch_bounds__(FP8_THREADS)
    fp8_quant_kernel(uint8_t *q, float *scale_out, const float *amax, const __nv_bfloat16 *x,
                     size_t n, int vec) {
    float sc = fp8_scale_of(*amax);
    if (scale_out && blockIdx.x == 0 && threadIdx.x == 0) *scale_out = sc;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        const uint4 *xv = (const uint4 *)x;
        uint2 *qv = (uint2 *)q;
        for (size_t i = tid; i < n / 8; i += stride) {
            uint4 v = xv[i];
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
            uint8_t b[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h[j]);
                b[2 * j] = fp8_q(f.x, sc);
                b[2 * j + 1] = fp8_q(f.y, sc);
            }
            uint2 o;
            o.x =
                (unsigned)b[0] | (unsigned)b[1] << 8 | (unsigned)b[2] << 16 | (unsigned)b[3] << 24;
            o.y =
                (unsigned)b[4] | (unsigned)b[5] << 8 | (unsigned)b[6] << 16 | (unsigned)b[7] << 24;
            qv[i] = o;
        }
    } else {
        for (size_t i = tid; i < n; i += stride)
            q[i] = fp8_q(__bfloat162float(x[i]), sc);
    }
}

/* 32 x 32 tiles through shared memory: reads along x's rows, writes along
 * qt's rows. Block (32, 8). */
__global__ void fp8_quant_t_kernel(uint8_t *qt, float *scale_out, const float *amax,
                                   const __nv_bfloat16 *x, int rows, int cols) {
    __shared__ float tile[32][33];
    float sc = fp8_scale_of(*amax);
    if (scale_out && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        *scale_out = sc;
    int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += 8) {
        int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = __bfloat162float(x[(size_t)r * cols + c]);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        int c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) qt[(size_t)c * rows + r] = fp8_q(tile[threadIdx.x][j], sc);
    }
}

extern "C" void lk_fp8_amax(float *amax, const uint16_t *x, size_t n, lcuda_stream s) {
    cudaStream_t st = (cudaStream_t)s;
    CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), st));
    if (!n) return;
    int vec = vec_ok(x, n);
    fp8_amax_kernel<<<grid_for(vec ? n / 8 : n), FP8_THREADS, 0, st>>>(
        (unsigned *)amax, (const __nv_bfloat16 *)x, n, vec);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_fp8_quant(uint8_t *q, float *scale_out, const float *amax, const uint16_t *x,
                             size_t n, lcuda_stream s) {
    int vec = vec_ok(x, n) && ((uintptr_t)q & 7) == 0;
    fp8_quant_kernel<<<grid_for(vec ? n / 8 : n), FP8_THREADS, 0, (cudaStream_t)s>>>(
        q, scale_out, amax, (const __nv_bfloat16 *)x, n, vec);
    CUDA_CHECK_LAUNCH();
}

extern "C" void lk_fp8_quant_t(uint8_t *qt, float *scale_out, const float *amax, const uint16_t *x,
                               int rows, int cols, lcuda_stream s) {
    if (rows <= 0 || cols <= 0) return;
    dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
    fp8_quant_t_kernel<<<grid, block, 0, (cudaStream_t)s>>>(qt, scale_out, amax,
                                                            (const __nv_bfloat16 *)x, rows, cols);
    CUDA_CHECK_LAUNCH();
}

/* 64 x 64 byte tiles: each thread reads 4 bytes along a row of q and writes
 * 4 bytes along a row of qt, gathered from four rows of the tile. Block
 * (16, 16); shapes are multiples of 16 (fp8_freeze), so a tile's edge rows and
 * columns come in whole 4-byte words. */
__global__ void fp8_transpose_kernel(uint8_t *qt, const uint8_t *q, int rows, int cols) {
    __shared__ uint8_t tile[64][68];
    int c0 = blockIdx.x * 64, r0 = blockIdx.y * 64;
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int j = ty; j < 64; j += 16) {
        int r = r0 + j, c = c0 + 4 * tx;
        if (r < rows && c < cols) {
            unsigned v = *(const unsigned *)(q + (size_t)r * cols + c);
            tile[j][4 * tx] = (uint8_t)v;
            tile[j][4 * tx + 1] = (uint8_t)(v >> 8);
            tile[j][4 * tx + 2] = (uint8_t)(v >> 16);
            tile[j][4 * tx + 3] = (uint8_t)(v >> 24);
        }
    }
    __syncthreads();
    for (int j = ty; j < 64; j += 16) {
        int c = c0 + j, r = r0 + 4 * tx;
        if (c < cols && r < rows) {
            unsigned v = (unsigned)tile[4 * tx][j] | (unsigned)tile[4 * tx + 1][j] << 8 |
                         (unsigned)tile[4 * tx + 2][j] << 16 | (unsigned)tile[4 * tx + 3][j] << 24;
            *(unsigned *)(qt + (size_t)c * rows + r) = v;
        }
    }
}

extern "C" void lk_fp8_transpose(uint8_t *qt, const uint8_t *q, int rows, int cols,
                                 lcuda_stream s) {
    if (rows <= 0 || cols <= 0) return;
    dim3 grid((cols + 63) / 64, (rows + 63) / 64), block(16, 16);
    fp8_transpose_kernel<<<grid, block, 0, (cudaStream_t)s>>>(qt, q, rows, cols);
    CUDA_CHECK_LAUNCH();
}

__global__ void __launch_bounds__(FP8_THREADS)
    fp8_dequant_kernel(__nv_bfloat16 *x, const uint8_t *q, const float *scale, size_t n) {
    float sc = *scale;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < n; i += stride) {
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q[i], __NV_E4M3);
        x[i] = __float2bfloat16_rn(__half2float(__half(h)) * sc);
    }
}

extern "C" void lk_fp8_dequant(uint16_t *x, const uint8_t *q, const float *scale, size_t n,
                               lcuda_stream s) {
    if (!n) return;
    fp8_dequant_kernel<<<grid_for(n), FP8_THREADS, 0, (cudaStream_t)s>>>((__nv_bfloat16 *)x, q,
                                                                         scale, n);
    CUDA_CHECK_LAUNCH();
}
