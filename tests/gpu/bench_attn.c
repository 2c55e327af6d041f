/* Causal attention kernel speed on one GPU: dev_attn_fwd and dev_attn_bwd
 * (dev/cuda: k_attn.cu with every variant) on the fused qkv layout of the
 * engine, for GPT-2 124M (B 16, H 12, T 1024, hd 64) and GPT-2 1558M (B 8,
 * H 25), each kernel variant (0-5; 5 ships) in the same process. Times come from
 * CUDA events around each call, median of 30 after 5 warm-ups; TFLOP/s
 * counts causal work: fwd 2*B*H*T^2*hd (two matmuls over half of T x T),
 * bwd 2.5x that. Checks beside the times: each variant's backward repeats
 * bit for bit over the timed iterations, and its outputs agree with
 * variant 0's within bf16 rounding (relative L2 difference printed).
 * Two more rows run cuDNN's fused attention (worker/cuda/cudnn_attn.c) in
 * the same process: "cudnn" (deterministic backward, must repeat bit for
 * bit) and "cudnn-nd" (atomic dQ, repeat not required); where cuDNN cannot
 * be loaded the rows say so ("available":false) and are not counted.
 * Usage: bench_attn [iters]. Exit 1 on a failed check, 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/bench_util.h"
#include "worker/cuda/cudnn_attn.h"
#include "dev/cuda/dev_kernels.h"
#include "worker/cuda/kernels.h"

struct shape {
    const char *name;
    int B, H, Hkv, T, hd;
};

static const struct shape shapes[] = {
    {"gpt2-124m", 16, 12, 12, 1024, 64},
    {"gpt2-1558m", 8, 25, 25, 1024, 64},
    {"llama-1b", 4, 32, 8, 2048, 64},  /* Llama 3.2 1B: grouped-query attention */
    {"llama-3b", 4, 24, 8, 2048, 128}, /* Llama 3.2 3B */
};
static const char *variants[] = {"0", "1", "2", "3", "4", "5", "cudnn", "cudnn-nd"};
#define NVAR   8
#define NKATTN 6 /* variants below this index are k_attn.cu's */

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
    int iters = argc > 1 ? atoi(argv[1]) : 30, warm = 5;
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
        double ffwd = 2.0 * B * H * (double)T * T * hd, fbwd = 2.5 * ffwd;
        uint16_t *qkv = rand_dev(nqkv, 1.5f), *dout = rand_dev(nout, 1.f), *out, *dqkv;
        float *lse, *scratch;
        CK(cudaMalloc((void **)&out, nout * 2));
        CK(cudaMalloc((void **)&dqkv, nqkv * 2));
        CK(cudaMalloc((void **)&lse, (size_t)B * H * T * 4));
        CK(cudaMalloc((void **)&scratch, dev_attn_scratch_bytes(B, T, H, Hkv, hd)));
        const uint16_t *q = qkv, *k = qkv + H * hd, *v = qkv + (H + Hkv) * hd;
        uint16_t *dq = dqkv, *dk = dqkv + H * hd, *dv = dqkv + (H + Hkv) * hd;
        uint16_t *ref_out = NULL, *ref_d = NULL;
        for (int vi = 0; vi < NVAR; vi++) {
            struct lcudnn_attn *cda = NULL;
            /* k_attn.cu's variants from dev/cuda (5 ships) */
            int var = vi < NKATTN ? atoi(variants[vi]) : 5;
            if (vi >= NKATTN) {
                char why[640];
                cda =
                    lcudnn_attn_new(s, B, T, H, Hkv, hd, ld, H * hd, vi == NKATTN, why, sizeof why);
                if (!cda) {
                    printf("RESULT {\"bench\":\"attn\",\"shape\":\"%s\",\"variant\":\"%s\","
                           "\"available\":false,\"why\":\"%s\"}\n",
                           p->name, variants[vi], why);
                    lcudnn_attn_free(cda);
                    continue;
                }
            }
#define FWD()                                                                                      \
    (cda ? (void)lcudnn_attn_fwd(cda, out, lse, qkv)                                               \
         : dev_attn_fwd(var, out, lse, q, k, v, ld, ld, H * hd, B, T, H, Hkv, hd, s))
#define BWD()                                                                                      \
    (cda ? (void)lcudnn_attn_bwd(cda, dqkv, dout, out, lse, qkv)                                   \
         : dev_attn_bwd(var, dq, dk, dv, scratch, dout, out, lse, q, k, v, ld, ld, H * hd, B, T,   \
                        H, Hkv, hd, 0, s))
            float fwd_ms = 0, bwd_ms = 0;
            for (int pass = 0; pass < 2; pass++) {
                for (int it = 0; it < warm + iters; it++) {
                    CK(cudaEventRecord(a, s));
                    if (pass == 0)
                        FWD();
                    else
                        BWD();
                    CK(cudaEventRecord(b, s));
                    CK(cudaEventSynchronize(b));
                    if (it >= warm) CK(cudaEventElapsedTime(&ms[it - warm], a, b));
                }
                float med = bench_median(ms, iters);
                if (pass == 0)
                    fwd_ms = med;
                else
                    bwd_ms = med;
            }
            CK(cudaStreamSynchronize(s));
            /* repeat check: one more backward must give the same bits */
            uint16_t *o = bits(out, nout), *d1 = bits(dqkv, nqkv), *d2;
            BWD();
            CK(cudaStreamSynchronize(s));
            d2 = bits(dqkv, nqkv);
            int same = memcmp(d1, d2, nqkv * 2) == 0;
            double ro = 0, rd = 0;
            if (vi == 0) {
                ref_out = o;
                ref_d = d1;
            } else {
                /* the backward reads the forward's own out and lse, so
                 * compare the backward only where the forward agreed */
                ro = rel_diff(o, ref_out, nout);
                rd = rel_diff(d1, ref_d, nqkv);
            }
            int ok = (same || vi == NKATTN + 1) && ro < 2e-2 && rd < 3e-2;
            bad |= !ok;
            printf("RESULT {\"bench\":\"attn\",\"shape\":\"%s\",\"variant\":\"%s\",\"fwd_ms\":%.4f,"
                   "\"fwd_tflops\":%.1f,\"bwd_ms\":%.4f,\"bwd_tflops\":%.1f,\"repeat_bits\":%s,"
                   "\"rel_out_vs_v0\":%.2e,\"rel_dqkv_vs_v0\":%.2e,\"ok\":%s}\n",
                   p->name, variants[vi], fwd_ms, ffwd / (fwd_ms * 1e-3) / 1e12, bwd_ms,
                   fbwd / (bwd_ms * 1e-3) / 1e12, same ? "true" : "false", ro, rd,
                   ok ? "true" : "false");
            fflush(stdout);
            if (vi > 0) free(o), free(d1);
            free(d2);
            lcudnn_attn_free(cda);
#undef FWD
#undef BWD
        }
        free(ref_out), free(ref_d);
        void *bufs[] = {qkv, dout, out, dqkv, lse, scratch};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            CK(cudaFree(bufs[i]));
    }
    free(ms);
    printf("%s\n", bad ? "FAIL" : "ok");
    return bad;
}
