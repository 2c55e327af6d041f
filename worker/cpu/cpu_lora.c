/* CPU backend: the LoRA helpers of backend.h (strided column axpy and the
 * adapter-input dropout), fp32. */
#include "worker/cpu/cpu.h"
#include "worker/lora_mask.h"

#define CX ((struct cpu_ctx *)ctx)

void cpu_axpy_2d(void *ctx, void *dst_, int ldd, const void *src_, int lds, int rows, int cols,
                 float alpha, int beta) {
    float *dst = dst_;
    const float *src = src_;
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, (size_t)rows * cols)) schedule(static)
    for (int r = 0; r < rows; r++) {
        float *d = dst + (size_t)r * ldd;
        const float *s = src + (size_t)r * lds;
        for (int c = 0; c < cols; c++)
            d[c] = (beta ? d[c] : 0.0f) + alpha * s[c];
    }
}

void cpu_dropout(void *ctx, void *out_, const void *inp_, size_t n, float p, uint64_t seed) {
    float *out = out_;
    const float *inp = inp_;
    uint32_t thr = lora_drop_threshold(p);
    float k = 1.0f / (1.0f - p);
#pragma omp parallel for num_threads(CX->nt) if (CPU_PAR(CX, n)) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = lora_keep(seed, i, thr) ? inp[i] * k : 0.0f;
}
