/* Attention with documents packed in a row (train.packing "document") on one GPU: k_attn.cu's
 * lk_attn_fwd / lk_attn_bwd (causal, the baseline) against lk_attn_fwd_doc / lk_attn_bwd_doc
 * with documents of L tokens (L = T: one document, the mask's cost alone; L = 512, 128, 32:
 * packed short examples), tiles skipped (the attn-doc-skip row, the default) and masked only,
 * on the GPT-2 124M shape (B 16, H 12, T 1024, hd 64) and Llama 3.2 1B's (B 4, H 32/8, T 2048,
 * hd 64). Times: CUDA events around each call, median of ITERS after 5 warm-ups. Checks beside
 * the times: the skipping and masking runs give the same outputs (relative L2 difference
 * printed, must be <= 1e-6), and with L = T the document kernels give the causal kernels'
 * results within bf16 rounding (<= 1e-2). One RESULT line per (shape, L, skip); "speedup" is
 * causal time over document time for fwd + bwd.
 * Usage: bench_attn_doc [ITERS=20]. Exit 1 on a failed check, 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/bench_util.h"
#include "worker/cuda/kernels.h"

struct shape {
    const char *name;
    int B, H, Hkv, T, hd;
};

static const struct shape shapes[] = {
    {"gpt2-124m", 16, 12, 12, 1024, 64},
    {"llama-1b", 4, 32, 8, 2048, 64},
};

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / 8388608.0 - 1.0);
}

static uint16_t *rand_dev(size_t n, float scale) {
    uint16_t *h = malloc(n * 2), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = lcuda_f2bf(frand() * scale);
    CK(cudaMalloc((void **)&d, n * 2));
    CK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static uint16_t *bits(const uint16_t *d, size_t n) {
    uint16_t *h = malloc(n * 2);
    CK(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost));
    return h;
}

static double rel_diff(const uint16_t *a, const uint16_t *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = lcuda_bf2f(a[i]), r = lcuda_bf2f(ref[i]);
        num += (x - r) * (x - r);
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20, warm = 5;
    if (!bench_have_gpu()) return 77;
    if (iters < 1) iters = 1;
    cudaStream_t s;
    cudaEvent_t a, b;
    CK(cudaStreamCreate(&s));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float *ms = malloc((size_t)iters * sizeof *ms);
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *p = &shapes[si];
        int B = p->B, H = p->H, Hkv = p->Hkv, T = p->T, hd = p->hd, ld = (H + 2 * Hkv) * hd;
        size_t N = (size_t)B * T, nqkv = N * ld, nout = N * H * hd;
        uint16_t *qkv = rand_dev(nqkv, 1.5f), *dout = rand_dev(nout, 1.f), *out, *dqkv;
        float *lse, *scratch;
        int32_t *ds, *hds = malloc(N * sizeof *hds);
        CK(cudaMalloc((void **)&out, nout * 2));
        CK(cudaMalloc((void **)&dqkv, nqkv * 2));
        CK(cudaMalloc((void **)&lse, (size_t)B * H * T * 4));
        CK(cudaMalloc((void **)&scratch, lk_attn_scratch_bytes(B, T, H, Hkv, hd)));
        CK(cudaMalloc((void **)&ds, N * sizeof *ds));
        const uint16_t *q = qkv, *k = qkv + H * hd, *v = qkv + (H + Hkv) * hd;
        uint16_t *dq = dqkv, *dk = dqkv + H * hd, *dv = dqkv + (H + Hkv) * hd;
        /* run 0: causal; then per L: skip 1, skip 0 */
        static const int lens[] = {0, 1, 512, 128, 32}; /* 0: causal, 1: L = T */
        float base_ms = 0;
        uint16_t *causal_o = NULL, *causal_d = NULL;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int L = lens[li] == 1 ? T : lens[li];
            if (L)
                for (size_t r = 0; r < N; r++)
                    hds[r] = (int32_t)((r % T) / L * L);
            CK(cudaMemcpy(ds, hds, N * sizeof *ds, cudaMemcpyHostToDevice));
            uint16_t *skip_o = NULL, *skip_d = NULL;
            for (int skip = 1; skip >= (L ? 0 : 1); skip--) {
                const int32_t *dsp = L ? ds : NULL;
                float t[2];
                for (int pass = 0; pass < 2; pass++) {
                    for (int it = 0; it < warm + iters; it++) {
                        CK(cudaEventRecord(a, s));
                        if (pass == 0)
                            lk_attn_fwd_doc(out, lse, q, k, v, ld, ld, H * hd, B, T, H, Hkv, hd,
                                            dsp, skip, s);
                        else
                            lk_attn_bwd_doc(dq, dk, dv, scratch, dout, out, lse, q, k, v, ld, ld,
                                            H * hd, B, T, H, Hkv, hd, 0, dsp, skip, s);
                        CK(cudaEventRecord(b, s));
                        CK(cudaEventSynchronize(b));
                        if (it >= warm) CK(cudaEventElapsedTime(&ms[it - warm], a, b));
                    }
                    t[pass] = bench_median(ms, iters);
                }
                uint16_t *o = bits(out, nout), *d = bits(dqkv, nqkv);
                double agree = 0;
                const char *vs = "";
                int ok = 1;
                if (!L) {
                    base_ms = t[0] + t[1];
                    causal_o = o, causal_d = d;
                } else if (skip) {
                    if (L == T) { /* one document: the causal results */
                        agree = fmax(rel_diff(o, causal_o, nout), rel_diff(d, causal_d, nqkv));
                        vs = "causal";
                        ok = agree <= 1e-2;
                    }
                    skip_o = o, skip_d = d;
                } else {
                    agree = fmax(rel_diff(o, skip_o, nout), rel_diff(d, skip_d, nqkv));
                    vs = "skip";
                    ok = agree <= 1e-6;
                }
                bad |= !ok;
                printf("RESULT {\"bench\":\"attn_doc\",\"shape\":\"%s\",\"doc_len\":%d,"
                       "\"skip\":%d,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"speedup\":%.2f,"
                       "\"agree_with\":\"%s\",\"rel_diff\":%.2e,\"ok\":%s}\n",
                       p->name, L ? L : 0, L ? skip : -1, t[0], t[1], base_ms / (t[0] + t[1]), vs,
                       agree, ok ? "true" : "false");
                fflush(stdout);
                if (L && !skip) free(o), free(d);
            }
            if (L) free(skip_o), free(skip_d);
        }
        free(causal_o), free(causal_d), free(hds);
        cudaFree(qkv), cudaFree(dout), cudaFree(out), cudaFree(dqkv), cudaFree(lse);
        cudaFree(scratch), cudaFree(ds);
    }
    free(ms);
    return bad ? 1 : 0;
}
