/* CPU backend: the operations imported models and generation add (struct
 * backend, "imported models and generation"): scaled RoPE frequencies, RoPE
 * at explicit positions, and one-row attention against a key/value cache.
 *
 * fp32. The decode attention gives each query head to one iteration and sums
 * in increasing cache order, so results do not depend on the thread count
 * (max-subtracted softmax in fp32; not bit-equal to attention_fwd's rows,
 * which use the micro-kernels). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/cpu/cpu.h"

#define CX ((struct cpu_ctx *)ctx)

int cpu_rope_set_freqs(void *ctx, const double *inv, int half) {
    struct cpu_ctx *cx = CX;
    free(cx->rope_inv);
    cx->rope_inv = NULL;
    cx->rope_half = 0;
    free(cx->rope_tab); /* the table was built from the old frequencies */
    cx->rope_tab = NULL;
    if (!inv) return 0;
    cx->rope_inv = malloc((size_t)(half > 0 ? half : 1) * sizeof *cx->rope_inv);
    if (!cx->rope_inv) return -1;
    memcpy(cx->rope_inv, inv, (size_t)half * sizeof *inv);
    cx->rope_half = half;
    return 0;
}

void cpu_rope_at(void *ctx, void *x_, int N, int stride, int n_heads, int HD, int pos0,
                 float theta) {
    struct cpu_ctx *cx = CX;
    float *x = x_;
    int h = HD / 2;
    float *cs = malloc((size_t)h * 2 * sizeof *cs);
    if (!cs) die("rope_at: out of memory (HD=%d)", HD);
    for (int r = 0; r < N; r++) {
        for (int d = 0; d < h; d++) {
            double ang = cpu_rope_angle(cx, pos0 + r, d, HD, theta);
            cs[d] = (float)cos(ang);
            cs[h + d] = (float)sin(ang);
        }
        for (int hd = 0; hd < n_heads; hd++) {
            float *v = x + (size_t)r * stride + (size_t)hd * HD;
            for (int d = 0; d < h; d++) {
                float a = v[d], b = v[d + h];
                v[d] = a * cs[d] - b * cs[h + d];
                v[d + h] = b * cs[d] + a * cs[h + d];
            }
        }
    }
    free(cs);
}

void cpu_attention_decode(void *ctx, void *out_, const void *q_, const void *kv_, int n, int NH,
                          int NKV, int HD) {
    struct cpu_ctx *cx = CX;
    float *out = out_;
    const float *q = q_, *kv = kv_;
    size_t S = (size_t)2 * NKV * HD;
    int grp = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    float *p = malloc((size_t)NH * (n > 0 ? n : 1) * sizeof *p);
    if (!p) die("attention_decode: out of memory (n=%d)", n);
#pragma omp parallel for num_threads(cx->nt) if (CPU_PAR(cx, (size_t)NH * n * HD)) schedule(static)
    for (int h = 0; h < NH; h++) {
        const float *qh = q + (size_t)h * HD;
        const float *k = kv + (size_t)(h / grp) * HD, *v = kv + (size_t)(NKV + h / grp) * HD;
        float *ph = p + (size_t)h * n, m = -INFINITY;
        for (int t = 0; t < n; t++) {
            float s = 0;
            for (int d = 0; d < HD; d++)
                s += qh[d] * k[(size_t)t * S + d];
            ph[t] = s * scale;
            if (ph[t] > m) m = ph[t];
        }
        float z = 0;
        for (int t = 0; t < n; t++) {
            ph[t] = expf(ph[t] - m);
            z += ph[t];
        }
        float *o = out + (size_t)h * HD;
        for (int d = 0; d < HD; d++)
            o[d] = 0;
        for (int t = 0; t < n; t++) {
            float w = ph[t] / z;
            for (int d = 0; d < HD; d++)
                o[d] += w * v[(size_t)t * S + d];
        }
    }
    free(p);
}
