/* Micro-benchmark of the elementwise kernels the Llama step spends time in,
 * each in its two forms (fast = the elem-vec row's 16-byte kernels, scalar =
 * one element per thread), on the Llama 3.2 1B shapes at micro-batch 4, T
 * 2048: SwiGLU forward / backward (N 8192, F 8192, the fused [N][2F] input),
 * RoPE forward on the q and k heads of the fused qkv rows (32 + 8 heads of
 * 64) and the gradient norm's sum of squares over 1.24e9 bf16 values. One
 * RESULT line each: median ms and the bandwidth the bytes moved imply. The
 * two forms' outputs are compared (bf16 agreement, the sums relatively). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tests/gpu/bench_util.h"
#include "worker/cuda/kernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / 8388608.0 - 1.0);
}

static uint16_t *rand_dev(size_t n, float scale) {
    size_t chunk = (size_t)1 << 24;
    uint16_t *h = malloc(chunk * 2), *d;
    CK(cudaMalloc((void **)&d, n * 2));
    for (size_t o = 0; o < n; o += chunk) {
        size_t k = n - o < chunk ? n - o : chunk;
        for (size_t i = 0; i < k; i++)
            h[i] = lcuda_f2bf(frand() * scale);
        CK(cudaMemcpy(d + o, h, k * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

/* largest |a - b| over n bf16 values (a sample of at most 1<<22) */
static double max_diff(const uint16_t *a, const uint16_t *b, size_t n) {
    if (n > ((size_t)1 << 22)) n = (size_t)1 << 22;
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    CK(cudaMemcpy(x, a, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y, b, n * 2, cudaMemcpyDeviceToHost));
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)lcuda_bf2f(x[i]) - lcuda_bf2f(y[i]));
        if (d > m) m = d;
    }
    free(x), free(y);
    return m;
}

enum { K_SWIGLU_FWD, K_SWIGLU_BWD, K_ROPE, K_SUMSQ, NK };
static const char *const names[NK] = {"swiglu_fwd", "swiglu_bwd", "rope_fwd", "sumsq"};

struct bufs {
    int N, F, T, H, hd, ld;
    size_t ng;
    uint16_t *x2, *dy, *y, *dx2, *qkv, *g;
    float *tab, *acc, *scratch;
    double *inv;
};

static void run(const struct bufs *b, int k, int fast, cudaStream_t s) {
    lcuda_stream st = (lcuda_stream)s;
    switch (k) {
    case K_SWIGLU_FWD:
        lk_swiglu_fwd(b->y, b->x2, b->x2 + b->F, b->N, b->F, 2 * b->F, fast, st);
        break;
    case K_SWIGLU_BWD:
        lk_swiglu_bwd(b->dx2, b->dx2 + b->F, b->dy, b->x2, b->x2 + b->F, b->N, b->F, 2 * b->F, 0,
                      fast, st);
        break;
    case K_ROPE:
        if (!fast || lk_rope_tab(b->qkv, b->tab, b->N, b->T, b->H, b->hd, b->ld, 0, st) != 0)
            lk_rope(b->qkv, b->N, b->T, b->H, b->hd, b->ld, 500000.f, NULL, 0, st);
        break;
    case K_SUMSQ:
        lk_sumsq_acc(b->acc, b->g, b->ng, b->scratch, fast, st);
        break;
    }
}

/* bytes each call reads and writes */
static double bytes_of(const struct bufs *b, int k) {
    double NF = (double)b->N * b->F;
    switch (k) {
    case K_SWIGLU_FWD:
        return NF * 2 * 3;
    case K_SWIGLU_BWD:
        return NF * 2 * 5;
    case K_ROPE:
        return (double)b->N * b->H * b->hd * 2 * 2;
    default:
        return (double)b->ng * 2;
    }
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20, warm = 3;
    if (!bench_have_gpu()) return 77;
    if (iters < 1) iters = 1;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    CK(cudaStreamCreate(&s));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct bufs b = {.N = 4 * 2048, .F = 8192, .T = 2048, .H = 40, .hd = 64};
    b.ld = (32 + 2 * 8) * b.hd;
    b.ng = (size_t)1235814400; /* Llama 3.2 1B's parameters */
    size_t NF = (size_t)b.N * b.F;
    b.x2 = rand_dev(2 * NF, 2.f);
    b.dy = rand_dev(NF, 1.f);
    b.qkv = rand_dev((size_t)b.N * b.ld, 1.f);
    b.g = rand_dev(b.ng, 0.01f);
    CK(cudaMalloc((void **)&b.y, NF * 2));
    CK(cudaMalloc((void **)&b.dx2, 2 * NF * 2));
    CK(cudaMalloc((void **)&b.tab, (size_t)b.T * b.hd * 4));
    CK(cudaMalloc((void **)&b.inv, (size_t)b.hd / 2 * 8));
    CK(cudaMalloc((void **)&b.acc, 4));
    CK(cudaMalloc((void **)&b.scratch, lk_sum_scratch_bytes(0)));
    double inv[64];
    for (int i = 0; i < b.hd / 2; i++)
        inv[i] = pow(500000.0, -2.0 * i / b.hd);
    CK(cudaMemcpy(b.inv, inv, (size_t)b.hd / 2 * 8, cudaMemcpyHostToDevice));
    lk_rope_table(b.tab, b.inv, b.T, b.hd / 2, (lcuda_stream)s);
    float *ms = malloc((size_t)iters * sizeof *ms);
    int bad = 0;
    for (int k = 0; k < NK; k++) {
        float med[2];
        for (int fast = 0; fast < 2; fast++) {
            for (int it = 0; it < warm + iters; it++) {
                CK(cudaEventRecord(e0, s));
                run(&b, k, fast, s);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                if (it >= warm) CK(cudaEventElapsedTime(&ms[it - warm], e0, e1));
            }
            med[fast] = bench_median(ms, iters);
        }
        /* agreement: one call of each form from the same inputs */
        double diff = 0;
        if (k == K_SWIGLU_FWD || k == K_SWIGLU_BWD) {
            uint16_t *out = k == K_SWIGLU_FWD ? b.y : b.dx2, *keep;
            size_t n = k == K_SWIGLU_FWD ? NF : 2 * NF;
            CK(cudaMalloc((void **)&keep, n * 2));
            run(&b, k, 0, s);
            CK(cudaMemcpyAsync(keep, out, n * 2, cudaMemcpyDeviceToDevice, s));
            run(&b, k, 1, s);
            CK(cudaStreamSynchronize(s));
            diff = max_diff(keep, out, n);
            CK(cudaFree(keep));
        } else if (k == K_ROPE) { /* forward with one form, back with the other: the input */
            size_t n = (size_t)b.N * b.ld;
            uint16_t *keep;
            CK(cudaMalloc((void **)&keep, n * 2));
            CK(cudaMemcpyAsync(keep, b.qkv, n * 2, cudaMemcpyDeviceToDevice, s));
            lk_rope(b.qkv, b.N, b.T, b.H, b.hd, b.ld, 500000.f, NULL, 0, (lcuda_stream)s);
            lk_rope_tab(b.qkv, b.tab, b.N, b.T, b.H, b.hd, b.ld, 1, (lcuda_stream)s);
            CK(cudaStreamSynchronize(s));
            diff = max_diff(keep, b.qkv, n);
            CK(cudaFree(keep));
        } else {
            float r[2];
            for (int fast = 0; fast < 2; fast++) {
                CK(cudaMemsetAsync(b.acc, 0, 4, s));
                run(&b, k, fast, s);
                CK(cudaMemcpyAsync(&r[fast], b.acc, 4, cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
            }
            diff = fabs((double)r[1] - r[0]) / fabs((double)r[0]);
        }
        int ok = diff < (k == K_SUMSQ ? 1e-4 : 0.05);
        bad |= !ok;
        double by = bytes_of(&b, k);
        printf("RESULT {\"bench\":\"elem\",\"kernel\":\"%s\",\"scalar_ms\":%.4f,\"fast_ms\":%.4f,"
               "\"scalar_gbs\":%.0f,\"fast_gbs\":%.0f,\"speedup\":%.2f,\"diff\":%.2e,\"ok\":%s}\n",
               names[k], med[0], med[1], by / (med[0] * 1e-3) / 1e9, by / (med[1] * 1e-3) / 1e9,
               med[0] / med[1], diff, ok ? "true" : "false");
        fflush(stdout);
    }
    void *bufs[] = {b.x2, b.dy, b.y, b.dx2, b.qkv, b.g, b.tab, b.inv, b.acc, b.scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(cudaFree(bufs[i]));
    free(ms);
    return bad;
}
