/* LoRA kernels: the strided column axpy (an adapter's product added into its
 * column range of a fused projection output, or that range gathered for the
 * backward) and the adapter-input dropout with the mask of worker/lora_mask.h.
 * Both are memory-bound elementwise passes over [rows, cols] / n values;
 * grid-stride loops, one element per thread step, deterministic. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "worker/cuda/k_lora.h"
#include "worker/lora_mask.h"

typedef __nv_bfloat16 bf;

static int lora_grid(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    return (int)(g > 65535 * 8 ? 65535 * 8 : (g ? g : 1));
}

__global__ void lora_axpy_2d_kernel(bf *dst, int ldd, const bf *src, int lds, int rows, int cols,
                                    float alpha, int beta) {
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, c = i % cols;
        bf *d = dst + r * ldd + c;
        float v = alpha * __bfloat162float(src[r * lds + c]);
        if (beta) v += __bfloat162float(*d);
        *d = __float2bfloat16(v);
    }
}

extern "C" void lk_lora_axpy_2d(uint16_t *dst, int ldd, const uint16_t *src, int lds, int rows,
                                int cols, float alpha, int beta, lcuda_stream s) {
    size_t n = (size_t)rows * cols;
    if (!n) return;
    lora_axpy_2d_kernel<<<lora_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)dst, ldd, (const bf *)src, lds, rows, cols, alpha, beta);
    CUDA_CHECK_LAUNCH();
}

__global__ void lora_dropout_kernel(bf *out, const bf *inp, size_t n, uint32_t thr, float k,
                                    uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = __bfloat162float(inp[i]);
        out[i] = __float2bfloat16(lora_keep(seed, i, thr) ? v * k : 0.0f);
    }
}

extern "C" void lk_lora_dropout(uint16_t *out, const uint16_t *inp, size_t n, float p,
                                uint64_t seed, lcuda_stream s) {
    if (!n) return;
    lora_dropout_kernel<<<lora_grid(n, 256), 256, 0, (cudaStream_t)s>>>(
        (bf *)out, (const bf *)inp, n, lora_drop_threshold(p), 1.0f / (1.0f - p), seed);
    CUDA_CHECK_LAUNCH();
}
