/* Vocabulary-parallel classifier of the CPU backend (tensor parallelism;
 * contract in worker/backend.h, struct backend.classifier_vp; caller in
 * worker/tp.c). Works in the same row chunks as cpu_classifier, over the
 * reserved logits workspace, so no [N, Vr] logits buffer exists. fp32; each
 * row is handled by one iteration (deterministic for any thread count). */
#include <math.h>
#include <string.h>

#include "worker/cpu/cpu.h"

#define CX ((struct cpu_ctx *)ctx)

void cpu_classifier_vp(void *ctx, float *lse, float *tl, void *dinp_, void *dW, const void *inp_,
                       const void *W, const int32_t *targets, const float *lse_in, int N, int C,
                       int Vv, int Vr, float grad_scale) {
    struct cpu_ctx *cx = CX;
    float *dinp = dinp_;
    const float *inp = inp_;
    for (int r0 = 0; r0 < N; r0 += cx->cls_chunk) {
        int n = N - r0 < cx->cls_chunk ? N - r0 : cx->cls_chunk;
        float *lg = cx->logits;
        cpu_matmul_fwd(ctx, lg, inp + (size_t)r0 * C, W, NULL, n, C, Vr);
#pragma omp parallel for num_threads(cx->nt) if (CPU_PAR(cx, (size_t)n * Vr * 4)) schedule(static)
        for (int i = 0; i < n; i++) {
            float *l = lg + (size_t)i * Vr;
            int r = r0 + i, tg = targets[r];
            if (!lse_in) {
                float m = -INFINITY;
                for (int v = 0; v < Vv; v++)
                    if (l[v] > m) m = l[v];
                double s = 0;
                for (int v = 0; v < Vv; v++)
                    s += exp((double)l[v] - m);
                lse[r] = Vv > 0 ? (float)(m + log(s)) : -INFINITY;
                tl[r] = tg >= 0 && tg < Vv ? l[tg] : 0.0f;
                continue;
            }
            float z = lse_in[r];
            if (isinf(z)) { /* ignored row: no gradient */
                memset(l, 0, (size_t)Vr * sizeof *l);
                continue;
            }
            for (int v = 0; v < Vv; v++)
                l[v] = grad_scale * expf(l[v] - z);
            for (int v = Vv; v < Vr; v++)
                l[v] = 0;
            if (tg >= 0 && tg < Vv) l[tg] -= grad_scale;
        }
        if (lse_in && (dinp || dW))
            cpu_matmul_bwd(ctx, dinp ? dinp + (size_t)r0 * C : NULL, dW, NULL, lg,
                           inp + (size_t)r0 * C, W, n, C, Vr);
    }
}
