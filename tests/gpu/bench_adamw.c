/* AdamW kernel bandwidth on one GPU: dev_adamw_multi (dev/cuda; variant 1
 * ships as lk_adamw_multi) over N parameters in segments like a GPT-2
 * layout (alternating decay / no decay), each variant
 * timed with CUDA events (median of 20 after 3 warm-ups), reported as
 * GB/s of the 28 bytes a parameter moves (bf16 grad read, bf16 param write,
 * fp32 master/m/v read+write). The variants' outputs must be bit-identical,
 * and so must the shipping lk_adamw_multi's (reported as variant 2).
 * Usage: bench_adamw [N]   (default 124475904, GPT-2 124M). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/bench_util.h"
#include "dev/cuda/dev_kernels.h"
#include "worker/cuda/kernels.h"

/* dev_adamw_multi's variant `var`, or the shipping kernel for var 2 */
static void adamw_call(int var, lbf16 *param, float *master, const lbf16 *grad, float *m, float *v,
                       const struct lk_adamw_segs *segs, float lr, float b1, float b2, float eps,
                       float gs, int step, lcuda_stream s) {
    if (var == 2)
        lk_adamw_multi(param, master, grad, m, v, segs, lr, b1, b2, eps, gs, step, s);
    else
        dev_adamw_multi(var, param, master, grad, m, v, segs, lr, b1, b2, eps, gs, step, s);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 124475904ull;
    if (!bench_have_gpu()) return 77;
    struct lk_adamw_segs segs;
    memset(&segs, 0, sizeof segs);
    size_t per = n / 24;
    for (int i = 0; i < 24; i++) {
        segs.end[i] = (int64_t)(i == 23 ? n : per * (size_t)(i + 1) + (size_t)i * 3);
        segs.wd[i] = i % 2 ? 0.0f : 0.1f;
    }
    segs.n = 24;
    float *master, *m, *v, *hm = malloc(n * 4), *ref = malloc(n * 4);
    uint16_t *param, *grad, *hg = malloc(n * 2);
    CK(cudaMalloc((void **)&master, n * 4));
    CK(cudaMalloc((void **)&m, n * 4));
    CK(cudaMalloc((void **)&v, n * 4));
    CK(cudaMalloc((void **)&param, n * 2));
    CK(cudaMalloc((void **)&grad, n * 2));
    srand(1);
    for (size_t i = 0; i < n; i++) {
        hm[i] = (float)rand() / RAND_MAX - 0.5f;
        hg[i] = (uint16_t)(0x3c00 + (rand() & 0x3ff)) ^ (uint16_t)((rand() & 1) << 15);
    }
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int bad = 0;
    /* var 0, 1: dev/cuda's variants; 2: the shipping lk_adamw_multi (var 1) */
    for (int var = 0; var < 3; var++) {
        CK(cudaMemcpy(master, hm, n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(m, 0, n * 4));
        CK(cudaMemset(v, 0, n * 4));
        CK(cudaMemcpy(grad, hg, n * 2, cudaMemcpyHostToDevice));
        /* correctness pass: 3 steps from the same state */
        for (int st = 1; st <= 3; st++)
            adamw_call(var, (lbf16 *)param, master, (const lbf16 *)grad, m, v, &segs, 1e-3f, 0.9f,
                       0.95f, 1e-8f, 0.5f, st, s);
        CK(cudaStreamSynchronize(s));
        if (var == 0) {
            CK(cudaMemcpy(ref, master, n * 4, cudaMemcpyDeviceToHost));
        } else {
            float *got = malloc(n * 4);
            CK(cudaMemcpy(got, master, n * 4, cudaMemcpyDeviceToHost));
            size_t diff = 0;
            for (size_t i = 0; i < n; i++)
                diff += memcmp(&got[i], &ref[i], 4) != 0;
            printf("%s %d: %zu of %zu master values differ from variant 0\n",
                   var == 2 ? "shipping (variant 1)" : "variant", var, diff, n);
            bad |= diff != 0;
            free(got);
        }
        float ms[20];
        for (int it = 0; it < 23; it++) {
            CK(cudaEventRecord(a, s));
            adamw_call(var, (lbf16 *)param, master, (const lbf16 *)grad, m, v, &segs, 1e-3f, 0.9f,
                       0.95f, 1e-8f, 0.5f, 4 + it, s);
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            if (it >= 3) CK(cudaEventElapsedTime(&ms[it - 3], a, b));
        }
        float med = bench_median(ms, 20);
        printf("RESULT {\"bench\":\"adamw\",\"variant\":%d,\"n\":%zu,\"ms\":%.4f,\"gbps\":%.0f}\n",
               var, n, med, 28.0 * (double)n / (med * 1e-3) / 1e9);
    }
    return bad;
}
