/* NF4 dequantization into bf16 (train.quantize_base "nf4"; worker/nf4.h,
 * the format in worker/nf4_format.h): one tensor per launch, once per block
 * and pass, into the scratch the block's matmuls read. Memory-bound: a
 * thread turns one 4-byte word of codes (8 weights, all of one 64-weight
 * block) into one 16-byte store; the tensor's 256-entry map and the code
 * table sit in shared memory. Arithmetic as nf4_dequantize: absmax =
 * fma(map[q8], scale, offset) (one rounding), weight = code * absmax, then
 * one rounding to bf16. A tp shard of the ABSMAX layout (nf4_format.h) has
 * its absmax values in fp32 already: the nf4a_ kernels below. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "worker/cuda/k_lora.h"
#include "worker/nf4_format.h"

typedef __nv_bfloat16 bf;

/* the parts of the tensor's buffer (offsets taken on the host) */
struct nf4_args {
    float code[16];
    const uint8_t *q8;
    const float *scale, *map, *offset;
};

__device__ __forceinline__ float nf4_absmax(const uint8_t *q8, const float *scale, const float *m8,
                                            float offset, size_t blk) {
    return __fmaf_rn(m8[q8[blk]], scale[blk / NF4_BLOCK2], offset);
}

/* n % 8 == 0 and 16-byte aligned output: 8 weights a thread */
__global__ void nf4_dequant8_kernel(bf *out, const uint8_t *q, size_t n, struct nf4_args a) {
    __shared__ float m8[256];
    __shared__ float code[16];
    const uint8_t *q8 = a.q8;
    const float *scale = a.scale, *map = a.map;
    float offset = *a.offset;
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        m8[i] = map[i];
    if (threadIdx.x < 16) code[threadIdx.x] = a.code[threadIdx.x];
    __syncthreads();
    size_t nw = n / 8; /* 4-byte words of codes */
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < nw;
         w += (size_t)gridDim.x * blockDim.x) {
        uint32_t c;
        memcpy(&c, q + 4 * w, 4); /* codes start the buffer: 4-byte aligned */
        float am = nf4_absmax(q8, scale, m8, offset, (8 * w) / NF4_BLOCK);
        __align__(16) bf v[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t byte = (c >> (8 * k)) & 255u;
            v[2 * k] = __float2bfloat16_rn(__fmul_rn(code[byte >> 4], am));
            v[2 * k + 1] = __float2bfloat16_rn(__fmul_rn(code[byte & 15], am));
        }
        *(uint4 *)(out + 8 * w) = *(const uint4 *)v;
    }
}

/* any n and alignment: one weight a thread */
__global__ void nf4_dequant1_kernel(bf *out, const uint8_t *q, size_t n, struct nf4_args a) {
    const uint8_t *q8 = a.q8;
    const float *scale = a.scale, *map = a.map;
    float offset = *a.offset;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n;
         j += (size_t)gridDim.x * blockDim.x) {
        uint8_t byte = q[j / 2];
        int c = j % 2 ? byte & 15 : byte >> 4;
        out[j] = __float2bfloat16_rn(
            __fmul_rn(a.code[c], nf4_absmax(q8, scale, map, offset, j / NF4_BLOCK)));
    }
}

static int nf4_grid(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

extern "C" void lk_nf4_dequant(void *out, const void *q, size_t n, int fast, lcuda_stream s) {
    if (!n) return;
    struct nf4_args a;
    for (int i = 0; i < 16; i++)
        a.code[i] = NF4_CODE[i];
    const uint8_t *b = (const uint8_t *)q;
    a.q8 = b + nf4_off_q8(n);
    a.scale = (const float *)(b + nf4_off_scale(n));
    a.map = (const float *)(b + nf4_off_map(n));
    a.offset = (const float *)(b + nf4_off_offset(n));
    if (fast && n % 8 == 0 && ((uintptr_t)out & 15) == 0)
        nf4_dequant8_kernel<<<nf4_grid(n / 8, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)out, (const uint8_t *)q, n, a);
    else
        nf4_dequant1_kernel<<<nf4_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
            (bf *)out, (const uint8_t *)q, n, a);
    CUDA_CHECK_LAUNCH();
}

/* ---- tp shards of the ABSMAX layout (nf4_format.h): one fp32 absmax a
 * block, already dequantized; weight = code * absmax, one rounding to bf16 */

struct nf4a_args {
    float code[16];
    const float *am; /* [ceil(n / 64)] */
};

__global__ void nf4a_dequant8_kernel(bf *out, const uint8_t *q, size_t n, struct nf4a_args a) {
    __shared__ float code[16];
    if (threadIdx.x < 16) code[threadIdx.x] = a.code[threadIdx.x];
    __syncthreads();
    size_t nw = n / 8;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < nw;
         w += (size_t)gridDim.x * blockDim.x) {
        uint32_t c;
        memcpy(&c, q + 4 * w, 4);
        float am = a.am[(8 * w) / NF4_BLOCK];
        __align__(16) bf v[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t byte = (c >> (8 * k)) & 255u;
            v[2 * k] = __float2bfloat16_rn(__fmul_rn(code[byte >> 4], am));
            v[2 * k + 1] = __float2bfloat16_rn(__fmul_rn(code[byte & 15], am));
        }
        *(uint4 *)(out + 8 * w) = *(const uint4 *)v;
    }
}

__global__ void nf4a_dequant1_kernel(bf *out, const uint8_t *q, size_t n, struct nf4a_args a) {
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n;
         j += (size_t)gridDim.x * blockDim.x) {
        uint8_t byte = q[j / 2];
        int c = j % 2 ? byte & 15 : byte >> 4;
        out[j] = __float2bfloat16_rn(__fmul_rn(a.code[c], a.am[j / NF4_BLOCK]));
    }
}

extern "C" void lk_nf4_dequant_absmax(void *out, const void *q, size_t n, int fast,
                                      lcuda_stream s) {
    if (!n) return;
    const uint8_t *b = (const uint8_t *)q;
    struct nf4a_args a;
    for (int i = 0; i < 16; i++)
        a.code[i] = NF4_CODE[i];
    a.am = (const float *)(b + nf4a_off_absmax(n));
    if (fast && n % 8 == 0 && ((uintptr_t)out & 15) == 0)
        nf4a_dequant8_kernel<<<nf4_grid(n / 8, 256), 256, 0, (cudaStream_t)s>>>((bf *)out, b, n, a);
    else
        nf4a_dequant1_kernel<<<nf4_grid(n, 256), 256, 0, (cudaStream_t)s>>>((bf *)out, b, n, a);
    CUDA_CHECK_LAUNCH();
}
