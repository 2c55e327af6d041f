/* train.precision "fp8" on the CUDA backend (docs/engine.md "FP8"): the
 * E4M3 frozen base of LoRA, checked against independent host references.
 *  (a) quantize kernels (worker/cuda/k_fp8.cu): amax equals the host maximum
 *      of |x|, the scale equals amax / 448 (fp32), and every byte of the
 *      E4M3 copy and of its transpose equals CUDA's host conversion
 *      (cuda_fp8.h __nv_cvt_float_to_fp8, satfinite, round to nearest even;
 *      tests/gpu/fp8_ref.cu) of x / scale; an all-zero tensor gets scale 1.
 *  (b) the GEMMs through the backend (fp8_freeze, then matmul_fwd,
 *      matmul_residual_fwd, matmul_bwd with dW = NULL): against a host fp64
 *      GEMM of the dequantized E4M3 operands (the host's own quantization of
 *      W, X and dY), forward, forward + residual (beta 1), input gradient
 *      overwriting (a zeroed output) and accumulating (beta 1), the weight
 *      gradient dW += dY^T X from the transposed E4M3 dY and X (beta 1 into
 *      bf16 values; a weight frozen with wgrad), for Llama-like
 *      shapes (N 256, IC 512, OC 1536; OC < IC; a smaller one). Tolerance:
 *      2^-8 of (|A.B| + |D|) plus 2^-10 of the sum of |terms|. Why: on an
 *      H200 (cuBLASLt 13.1, 2026-12-01, the first version of this test with
 *      2^-8 |D| + 2^-12 sum|terms|) the forward alone came to 1.07-1.68 of
 *      that bound, where D is small: the FP8 tensor cores accumulate with
 *      fewer bits than fp32 between cuBLASLt's promotions, about 2^-11 of the
 *      sum of |terms| at worst; and the beta-1 calls (+ residual, the weight
 *      gradient into bf16 values) to 3.9-9.2, where C nearly cancels the
 *      product: the epilogue rounds the product (to bf16, 2^-9 |A.B|) before
 *      adding C, so the error follows |A.B|, not |D|. Each term of the bound
 *      is twice what was measured. A real fault stays far outside: a wrong
 *      scale, a transposed or missing operand or a missing C are errors of
 *      the order of |A.B| or |C| itself (a typical |A.B| is the sum of
 *      |terms| / sqrt(K), 20 to 40 times the 2^-10 term at these K). On an
 *      H200 (2026-12-02) the widened bound held with the worst check at 0.98
 *      of it (a weight gradient). The backend's counters prove
 *      the E4M3 GEMM ran. A weight whose OC or IC is not a multiple of 16 is
 *      not taken (fp8_freeze returns 1) and a frozen weight called with N not
 *      a multiple of 16 falls back: both then match the bf16 GEMM of the bf16
 *      operands within the same bound, and the counters show that no E4M3
 *      GEMM ran (the fallback counted).
 *  (c) a LoRA curve of a tiny Llama (rank 8 on every projection, 30 steps):
 *      fp8 on cuda against the cpu fp32 curve, every step within 5 %
 *      relative and the mean within 2 % (E4M3 keeps 3 mantissa bits: a
 *      product's relative error is up to 2^-4 per operand, but the loss
 *      averages over 256 tokens x 61 classes and the blocks' branches add to
 *      a bf16 residual stream, so the loss moves far less; the bf16 curve
 *      of gpu.lora is held to the same bounds), the first step within 2 % of
 *      the bf16 cuda run's, the loss falls, and every block linear layer ran
 *      in E4M3 (forward and input-gradient counters); then the same for a
 *      full fine-tune (weight gradients in E4M3 too, the weights quantized at
 *      each use from their current values) against the cpu full fine-tune.
 *  (d) weights held by handle (W8 alone, fp8_freeze's handle): the GEMMs of
 *      (b) with the bf16 W zeroed after the freeze, the N 50 fallback on the
 *      dequantized W8, and a LoRA run with the base held as E4M3
 *      (worker/fp8base.h) against the copied layout (test_held).
 * One PASS / FAIL line per check; exit 1 on any failure, 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_util.h"
#include "worker/cuda/k_fp8.h"
#include "worker/lora.h"
#include "worker/safetensors.h"
#include "worker/train.h"
#include "worker/tuning.h"

uint8_t fp8_ref_e4m3(float v); /* tests/gpu/fp8_ref.cu */
float fp8_ref_value(uint8_t q);

static int fails;

static void result(int ok, const char *what, const char *fmt, double a, double b) {
    printf("%s: %s (", ok ? "PASS" : "FAIL", what);
    printf(fmt, a, b);
    printf(")\n");
    fflush(stdout);
    fails += !ok;
}

/* deterministic values, bf16-exact, with a spread of magnitudes */
static uint64_t rng = 0x243f6a8885a308d3ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static void fill(uint16_t *h, float *f, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) {
        double u = urand() * 2 - 1, mag = pow(10.0, -3.0 * urand()); /* 1e-3 .. 1 */
        h[i] = st_f32_to_bf16((float)(scale * u * mag));
        f[i] = st_bf16_to_f32(h[i]);
    }
}

/* host reference: amax, scale and E4M3 bytes */
static float ref_quant(const float *x, size_t n, uint8_t *q) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = fp8_ref_e4m3(x[i] / scale);
    return scale;
}

static void *dev(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

/* (a) */
static void test_quant(void) {
    enum { R = 96, C = 200 };
    size_t n = (size_t)R * C;
    uint16_t *h = malloc(n * 2);
    float *f = malloc(n * sizeof *f);
    uint8_t *want = malloc(n), *got = malloc(n), *wt = malloc(n);
    uint16_t *dx = dev(n * 2 + 16);
    uint8_t *dq = dev(n + 16), *dqt = dev(n);
    float *ds = dev(2 * sizeof(float));
    if (!h || !f || !want || !got || !wt || !dx || !dq || !dqt || !ds) {
        result(0, "quantize set-up", "%g %g", 0, 0);
        goto out;
    }
    for (int pass = 0; pass < 3; pass++) {
        /* 0: 16-byte vector path; 1: an odd count at an odd element offset
         * (the scalar path); 2: all zeros */
        size_t cnt = pass == 1 ? n - 3 : n;
        uint16_t *x = pass == 1 ? dx + 1 : dx;
        uint8_t *q = pass == 1 ? dq + 1 : dq;
        fill(h, f, cnt, pass == 0 ? 7.5 : 0.02);
        if (pass == 0) { /* the largest magnitude maps to -448 exactly */
            h[5] = st_f32_to_bf16(-7.5f);
            f[5] = st_bf16_to_f32(h[5]);
        }
        if (pass == 2)
            for (size_t i = 0; i < cnt; i++)
                h[i] = 0, f[i] = 0.0f;
        float rs = ref_quant(f, cnt, want);
        cudaMemcpy(x, h, cnt * 2, cudaMemcpyHostToDevice);
        lk_fp8_amax(ds, x, cnt, NULL);
        lk_fp8_quant(q, ds + 1, ds, x, cnt, NULL);
        float s[2];
        cudaMemcpy(got, q, cnt, cudaMemcpyDeviceToHost);
        cudaMemcpy(s, ds, sizeof s, cudaMemcpyDeviceToHost);
        float amax = 0;
        for (size_t i = 0; i < cnt; i++)
            if (fabsf(f[i]) > amax) amax = fabsf(f[i]);
        size_t bad = 0;
        for (size_t i = 0; i < cnt; i++)
            bad += got[i] != want[i];
        static const char *const what[] = {"vector path", "scalar path (odd offset and count)",
                                           "all zeros"};
        char msg[160];
        snprintf(msg, sizeof msg, "quantize, %s: amax and scale = amax/448 (1 for zeros)",
                 what[pass]);
        result(s[0] == amax && s[1] == rs && (pass != 2 || s[1] == 1.0f), msg, "scale %.9g, %.9g",
               s[1], rs);
        snprintf(msg, sizeof msg, "quantize, %s: E4M3 bytes equal cuda_fp8.h's host conversion",
                 what[pass]);
        result(bad == 0, msg, "%g of %g differ", (double)bad, (double)cnt);
    }
    /* the transposed copy of a [R][C] tensor, same scale */
    fill(h, f, n, 3.0);
    float rst = ref_quant(f, n, want);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            wt[(size_t)c * R + r] = want[(size_t)r * C + c];
    cudaMemcpy(dx, h, n * 2, cudaMemcpyHostToDevice);
    lk_fp8_amax(ds, dx, n, NULL);
    CUDA_CHECK(cudaMemset(ds + 1, 0, sizeof(float)));
    lk_fp8_quant_t(dqt, ds + 1, ds, dx, R, C, NULL);
    float st[2];
    cudaMemcpy(got, dqt, n, cudaMemcpyDeviceToHost);
    cudaMemcpy(st, ds, sizeof st, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += got[i] != wt[i];
    result(bad == 0 && st[1] == rst && cudaGetLastError() == cudaSuccess,
           "cast-transpose [96][200] -> [200][96]: bytes and scale equal the host's",
           "%g of %g bytes differ", (double)bad, (double)n);
out:
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(dqt);
    cudaFree(ds);
    free(h);
    free(f);
    free(want);
    free(got);
    free(wt);
}

/* (b) */
struct mm_case {
    int N, IC, OC;
};

static struct backend *gemm_backend(int N, int C) {
    struct backend *b = backend_cuda_new(0);
    if (!b) return NULL;
    struct backend_limits lim = {
        .B = 1, .T = N, .C = C, .NH = 4, .NKV = 4, .HD = 32, .F = C, .Vp = 64, .frozen_head = 1};
    if (b->reserve(b->ctx, &lim) != 0) {
        backend_free(b);
        return NULL;
    }
    return b;
}

/* host fp64: out[n][o] = sum_k a[n][k] * w[o][k] (row-major, K contiguous in both); mag the
 * sum of |terms| */
static void ref_gemm(double *out, double *mag, const float *a, const float *w, int N, int K,
                     int O) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double t = (double)a[(size_t)n * K + k] * w[(size_t)o * K + k];
                s += t;
                m += fabs(t);
            }
            out[(size_t)n * O + o] = s;
            mag[(size_t)n * O + o] = m;
        }
}

/* worst |got - (ref + base)| / tolerance over all elements (<= 1 passes) */
static double worst(const uint16_t *got, const double *ref, const double *mag, const float *base,
                    size_t n, double rel) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double want = ref[i] + (base ? base[i] : 0.0);
        double tol = rel * (fabs(ref[i]) + fabs(want)) + mag[i] / 1024 + 1e-30;
        double e = fabs((double)st_bf16_to_f32(got[i]) - want) / tol;
        if (!(e <= w)) w = e; /* NaN counts as a failure */
    }
    return w;
}

static void dequant(float *out, const uint8_t *q, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        out[i] = fp8_ref_value(q[i]) * scale;
}

/* trained 0: a frozen weight (E4M3 copies made by fp8_freeze); 1: a trained one (quantized at
 * each use, weight gradient in E4M3 too); 2: a frozen weight held by handle (W8 alone, W8^T
 * transposed at each use; the bf16 W zeroed after the freeze, so nothing may read it) */
static void test_gemm_case(const struct mm_case *k, int mode) {
    int trained = mode == 1;
    int N = k->N, IC = k->IC, OC = k->OC;
    size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, ny = (size_t)N * OC;
    struct backend *b = gemm_backend(N, IC > OC ? IC : OC);
    uint16_t *hx = malloc(nx * 2), *hw = malloc(nw * 2), *hy = malloc(ny * 2), *hr = malloc(ny * 2),
             *got = malloc((nx > ny ? nx : ny) * 2);
    float *fx = malloc(nx * 4), *fw = malloc(nw * 4), *fy = malloc(ny * 4), *fr = malloc(ny * 4),
          *wt = malloc(nw * 4), *fq = malloc((nx > ny ? nx : ny) * 4), *fwq = malloc(nw * 4),
          *fd = malloc(nx * 4);
    uint8_t *q = malloc(nx > ny ? nx : ny), *qw = malloc(nw);
    double *ref = malloc((nx > ny ? nx : ny) * 8), *mag = malloc((nx > ny ? nx : ny) * 8);
    void *dx = b ? b->alloc(b->ctx, nx * 2) : NULL, *dw = b ? b->alloc(b->ctx, nw * 2) : NULL;
    void *dy = b ? b->alloc(b->ctx, ny * 2) : NULL, *dr = b ? b->alloc(b->ctx, ny * 2) : NULL;
    void *dd = b ? b->alloc(b->ctx, nx * 2) : NULL, *dout = b ? b->alloc(b->ctx, ny * 2) : NULL;
    void *dgw = b ? b->alloc(b->ctx, nw * 2) : NULL;
    uint16_t *hg = malloc(nw * 2);
    float *fg = malloc(nw * 4), *xqt = malloc(nx * 4), *yqt = malloc(ny * 4), *fxq = malloc(nx * 4);
    double *wref = malloc(nw * 8), *wmag = malloc(nw * 8);
    char what[200];
    if (!b || !hx || !hw || !hy || !hr || !got || !fx || !fw || !fy || !fr || !wt || !fq || !fwq ||
        !fd || !q || !qw || !ref || !mag || !dx || !dw || !dy || !dr || !dd || !dout || !dgw ||
        !hg || !fg || !xqt || !yqt || !fxq || !wref || !wmag) {
        result(0, "gemm set-up", "N %g IC %g", N, IC);
        goto out;
    }
    fill(hx, fx, nx, 2.0);
    fill(hw, fw, nw, 0.05);
    fill(hy, fy, ny, 0.01);
    fill(hr, fr, ny, 1.0);
    b->upload(b->ctx, dx, hx, nx * 2);
    b->upload(b->ctx, dw, hw, nw * 2);
    b->upload(b->ctx, dy, hy, ny * 2);
    b->upload(b->ctx, dr, hr, ny * 2);
    void *handle = NULL, *W = dw;
    int frc = b->fp8_freeze(b->ctx, dw, OC, IC, trained, mode == 2 ? &handle : NULL);
    if (mode == 2) {
        W = handle;
        b->zero(b->ctx, dw, nw * 2);
    }
    const char *kind = mode == 2 ? "held" : trained ? "trained" : "frozen";
    snprintf(what, sizeof what, "%s N %d IC %d OC %d: fp8_freeze takes the weight", kind, N, IC,
             OC);
    result(frc == 0 && (mode != 2 || (handle && handle != dw)), what, "rc %g, want %g", frc, 0);
    /* the host's operands: E4M3 W and X, dequantized */
    float sw = ref_quant(fw, nw, qw);
    dequant(fwq, qw, nw, sw);
    float sx = ref_quant(fx, nx, q);
    dequant(fq, q, nx, sx);
    memcpy(fxq, fq, nx * 4);
    struct cuda_fp8_stats st0, st1;
    backend_cuda_fp8_stats(b, &st0);
    b->matmul_fwd(b->ctx, dout, dx, W, NULL, N, IC, OC);
    b->download(b->ctx, got, dout, ny * 2);
    backend_cuda_fp8_stats(b, &st1);
    ref_gemm(ref, mag, fq, fwq, N, IC, OC);
    double w = worst(got, ref, mag, NULL, ny, 1.0 / 256);
    snprintf(what, sizeof what,
             "%s N %d IC %d OC %d forward: E4M3 GEMM equals the fp64 GEMM of the dequantized "
             "operands",
             kind, N, IC, OC);
    result(w <= 1 && st1.fwd == st0.fwd + 1, what, "worst %.3g of the tolerance, %g E4M3 GEMMs", w,
           (double)(st1.fwd - st0.fwd));
    /* + residual through the bf16 C operand (beta 1), out == residual */
    b->matmul_residual_fwd(b->ctx, dr, dx, W, NULL, dr, N, IC, OC);
    b->download(b->ctx, got, dr, ny * 2);
    w = worst(got, ref, mag, fr, ny, 1.0 / 256);
    snprintf(what, sizeof what, "%s N %d IC %d OC %d forward + residual (beta 1, in place)", kind,
             N, IC, OC);
    result(w <= 1, what, "worst %.3g of the tolerance (bound %g)", w, 1);
    /* input gradient: dX = dY . W through W^T in E4M3; the host's own E4M3 dY */
    float sy = ref_quant(fy, ny, q);
    dequant(fq, q, ny, sy);
    for (int o = 0; o < OC; o++) /* W^T [IC][OC] of the dequantized W */
        for (int i = 0; i < IC; i++)
            wt[(size_t)i * OC + o] = fwq[(size_t)o * IC + i];
    ref_gemm(ref, mag, fq, wt, N, OC, IC);
    backend_cuda_fp8_stats(b, &st0);
    b->zero(b->ctx, dd, nx * 2);
    b->matmul_bwd(b->ctx, dd, NULL, NULL, dy, dx, W, N, IC, OC);
    b->download(b->ctx, got, dd, nx * 2);
    w = worst(got, ref, mag, NULL, nx, 1.0 / 256);
    for (size_t i = 0; i < nx; i++)
        fd[i] = st_bf16_to_f32(got[i]);
    snprintf(what, sizeof what, "%s N %d IC %d OC %d input gradient (zeroed output, beta 0)", kind,
             N, IC, OC);
    /* the accumulating input gradient together with the weight gradient, dW += dY^T X from
     * the transposed E4M3 dY and X, into a dW holding bf16 values (beta 1) */
    fill(hg, fg, nw, 0.5);
    b->upload(b->ctx, dgw, hg, nw * 2);
    b->matmul_bwd(b->ctx, dd, trained ? dgw : NULL, NULL, dy, dx, W, N, IC, OC);
    backend_cuda_fp8_stats(b, &st1);
    result(w <= 1, what, "worst %.3g of the tolerance (bound %g)", w, 1);
    b->download(b->ctx, got, dd, nx * 2);
    w = worst(got, ref, mag, fd, nx, 1.0 / 256);
    snprintf(what, sizeof what, "%s N %d IC %d OC %d input gradient accumulated (beta 1)", kind, N,
             IC, OC);
    result(w <= 1 && st1.bwd == st0.bwd + 2 && st1.dequant == 0 && st1.held == (mode == 2), what,
           "worst %.3g of the tolerance, %g E4M3 GEMMs", w, (double)(st1.bwd - st0.bwd));
    if (!trained) goto out;
    /* host: dW[o][i] = sum_n dYq[n][o] Xq[n][i], K = N contiguous in the transposes */
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++)
            yqt[(size_t)o * N + n] = fq[(size_t)n * OC + o];
        for (int i = 0; i < IC; i++)
            xqt[(size_t)i * N + n] = fxq[(size_t)n * IC + i];
    }
    ref_gemm(wref, wmag, yqt, xqt, OC, N, IC);
    b->download(b->ctx, hw, dgw, nw * 2);
    w = worst(hw, wref, wmag, fg, nw, 1.0 / 256);
    snprintf(what, sizeof what, "%s N %d IC %d OC %d weight gradient accumulated (beta 1)", kind, N,
             IC, OC);
    result(w <= 1 && st1.wgrad == st0.wgrad + 1, what, "worst %.3g of the tolerance, %g E4M3 GEMMs",
           w, (double)(st1.wgrad - st0.wgrad));
out:
    if (b) {
        b->free(b->ctx, dx);
        b->free(b->ctx, dw);
        b->free(b->ctx, dy);
        b->free(b->ctx, dr);
        b->free(b->ctx, dd);
        b->free(b->ctx, dout);
        b->free(b->ctx, dgw);
    }
    free(hg), free(fg), free(xqt), free(yqt), free(fxq), free(wref), free(wmag);
    backend_free(b);
    free(hx), free(hw), free(hy), free(hr), free(got), free(fx), free(fw), free(fy), free(fr);
    free(wt), free(fq), free(fwq), free(fd), free(q), free(qw), free(ref), free(mag);
}

/* Shapes the E4M3 GEMM does not take: the bf16 path (no E4M3 GEMM counted), its result checked
 * against the fp64 GEMM of the bf16 operands. */
static void test_fallback(void) {
    enum { N = 64, IC = 520, OC = 256, NB = 50 }; /* IC % 16 = 8; NB % 16 = 2 */
    size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, ny = (size_t)N * OC;
    struct backend *b = gemm_backend(N, IC);
    uint16_t *hx = malloc(nx * 2), *hw = malloc(nw * 2), *got = malloc(ny * 2);
    float *fx = malloc(nx * 4), *fw = malloc(nw * 4);
    double *ref = malloc(nx * 8), *mag = malloc(nx * 8); /* nx >= ny, >= NB x 512 */
    void *dx = b ? b->alloc(b->ctx, nx * 2) : NULL, *dw = b ? b->alloc(b->ctx, nw * 2) : NULL;
    void *dy = b ? b->alloc(b->ctx, ny * 2) : NULL, *dw2 = b ? b->alloc(b->ctx, nw * 2) : NULL;
    if (!b || !hx || !hw || !got || !fx || !fw || !ref || !mag || !dx || !dw || !dy || !dw2) {
        result(0, "fallback set-up", "%g %g", 0, 0);
        goto out;
    }
    fill(hx, fx, nx, 2.0);
    fill(hw, fw, nw, 0.05);
    b->upload(b->ctx, dx, hx, nx * 2);
    b->upload(b->ctx, dw, hw, nw * 2);
    struct cuda_fp8_stats st0, st1;
    int frc = b->fp8_freeze(b->ctx, dw, OC, IC, 0, NULL);
    backend_cuda_fp8_stats(b, &st0);
    b->matmul_fwd(b->ctx, dy, dx, dw, NULL, N, IC, OC);
    b->download(b->ctx, got, dy, ny * 2);
    backend_cuda_fp8_stats(b, &st1);
    ref_gemm(ref, mag, fx, fw, N, IC, OC);
    double w = worst(got, ref, mag, NULL, ny, 1.0 / 256);
    result(frc == 1 && st1.weights == 0 && st1.fwd == st0.fwd && w <= 1,
           "IC 520 (not a multiple of 16): fp8_freeze returns 1 and the GEMM is bf16's",
           "rc %g, worst %.3g of the bf16 tolerance", frc, w);
    /* a frozen weight (IC 512 view of the same data) called with N = 50 */
    int IC2 = 512;
    for (int o = 0; o < OC; o++)
        memmove(hw + (size_t)o * IC2, hw + (size_t)o * IC, IC2 * 2);
    for (size_t i = 0; i < (size_t)OC * IC2; i++)
        fw[i] = st_bf16_to_f32(hw[i]);
    for (int n = 0; n < NB; n++)
        memmove(hx + (size_t)n * IC2, hx + (size_t)n * IC, IC2 * 2);
    for (size_t i = 0; i < (size_t)NB * IC2; i++)
        fx[i] = st_bf16_to_f32(hx[i]);
    b->upload(b->ctx, dw2, hw, (size_t)OC * IC2 * 2);
    b->upload(b->ctx, dx, hx, (size_t)NB * IC2 * 2);
    frc = b->fp8_freeze(b->ctx, dw2, OC, IC2, 0, NULL);
    backend_cuda_fp8_stats(b, &st0);
    b->matmul_fwd(b->ctx, dy, dx, dw2, NULL, NB, IC2, OC);
    b->download(b->ctx, got, dy, (size_t)NB * OC * 2);
    backend_cuda_fp8_stats(b, &st1);
    ref_gemm(ref, mag, fx, fw, NB, IC2, OC);
    w = worst(got, ref, mag, NULL, (size_t)NB * OC, 1.0 / 256);
    result(frc == 0 && st1.fwd == st0.fwd && st1.fallback == st0.fallback + 1 && w <= 1,
           "frozen weight, N 50 (not a multiple of 16): the bf16 GEMM, counted as a fallback",
           "worst %.3g of the bf16 tolerance, %g fallbacks", w,
           (double)(st1.fallback - st0.fallback));
    /* the same weight held by handle (its bf16 W zeroed after the freeze): the bf16 GEMM on
     * W8 dequantized, against the fp64 GEMM of the bf16 X and the host's dequantized E4M3 W
     * rounded to bf16 */
    void *handle = NULL;
    frc = b->fp8_freeze(b->ctx, dw2, OC, IC2, 0, &handle);
    b->zero(b->ctx, dw2, (size_t)OC * IC2 * 2);
    uint8_t *qw = malloc((size_t)OC * IC2);
    float *fwq = malloc((size_t)OC * IC2 * 4);
    if (!qw || !fwq || frc != 0 || !handle) {
        result(0, "held weight, N 50: set-up", "rc %g %g", frc, 0);
        free(qw), free(fwq);
        goto out;
    }
    dequant(fwq, qw, (size_t)OC * IC2, ref_quant(fw, (size_t)OC * IC2, qw));
    for (size_t i = 0; i < (size_t)OC * IC2; i++) /* rounded to bf16, as the workspace holds it */
        fwq[i] = st_bf16_to_f32(st_f32_to_bf16(fwq[i]));
    backend_cuda_fp8_stats(b, &st0);
    b->matmul_fwd(b->ctx, dy, dx, handle, NULL, NB, IC2, OC);
    b->download(b->ctx, got, dy, (size_t)NB * OC * 2);
    backend_cuda_fp8_stats(b, &st1);
    ref_gemm(ref, mag, fx, fwq, NB, IC2, OC);
    w = worst(got, ref, mag, NULL, (size_t)NB * OC, 1.0 / 256);
    result(st1.fwd == st0.fwd && st1.dequant == st0.dequant + 1 && st1.held == 1 && w <= 1,
           "held weight, N 50: the bf16 GEMM on the dequantized E4M3 W",
           "worst %.3g of the bf16 tolerance, %g dequantized", w,
           (double)(st1.dequant - st0.dequant));
    /* its input gradient, N 50: dX = dY . deq(W8) in bf16 (dY: the forward's output) */
    for (size_t i = 0; i < (size_t)NB * OC; i++)
        fx[i] = st_bf16_to_f32(got[i]);
    for (int o = 0; o < OC; o++) /* deq(W8)^T [IC2][OC] into fw */
        for (int i = 0; i < IC2; i++)
            fw[(size_t)i * OC + o] = fwq[(size_t)o * IC2 + i];
    ref_gemm(ref, mag, fx, fw, NB, OC, IC2);
    b->zero(b->ctx, dw, (size_t)NB * IC2 * 2);
    b->matmul_bwd(b->ctx, dw, NULL, NULL, dy, dx, handle, NB, IC2, OC);
    b->download(b->ctx, hx, dw, (size_t)NB * IC2 * 2);
    backend_cuda_fp8_stats(b, &st0);
    w = worst(hx, ref, mag, NULL, (size_t)NB * IC2, 1.0 / 256);
    result(st0.bwd == st1.bwd && st0.dequant == st1.dequant + 1 && w <= 1,
           "held weight, N 50: the input gradient in bf16 on the dequantized E4M3 W",
           "worst %.3g of the bf16 tolerance, %g dequantized", w,
           (double)(st0.dequant - st1.dequant));
    free(qw), free(fwq);
out:
    if (b) {
        b->free(b->ctx, dx);
        b->free(b->ctx, dw);
        b->free(b->ctx, dy);
        b->free(b->ctx, dw2);
    }
    backend_free(b);
    free(hx), free(hw), free(got), free(fx), free(fw), free(ref), free(mag);
}

/* (c) the LoRA curve */
#define STEPS     30
#define TOL_STEP  5e-2
#define TOL_MEAN  2e-2
#define TOL_STEP1 2e-2
#define B_SEQ     4
#define T_SEQ     64
#define VOCAB     61

static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    (void)user, (void)micro, (void)err, (void)errlen;
    for (int b = 0; b < B_SEQ; b++) {
        uint64_t h = (uint64_t)(step * B_SEQ + b) * 0x9e3779b97f4a7c15ull + 777;
        int stride = 1 + (int)(h % 5);
        int32_t cur = (int32_t)((h >> 20) % VOCAB);
        for (int t = 0; t < T_SEQ; t++) {
            int32_t next = (cur + stride + (((h >> (t % 40)) & 7) == 0)) % VOCAB;
            in[b * T_SEQ + t] = cur;
            tg[b * T_SEQ + t] = next;
            cur = next;
        }
    }
    return 0;
}

static const char *const targets[] = {"q", "k", "v", "o", "gate", "up", "down"};

/* What test_held compares of a LoRA fp8 run: the engine's params bytes, its
 * block linear weights' count, the frozen base as read for an export after
 * training and after lora_merge (fp32 [n]). */
struct base_out {
    size_t params, n;
    float *base, *merged;
};

/* device 0 cpu, 1 cuda bf16, 2 cuda fp8 with the bf16 base and E4M3 copies
 * (fp8-base-bf16), 3 cuda fp8 with the base held as E4M3 alone; lora 1:
 * rank-8 adapters over a frozen base, 0: a full fine-tune; bo (NULL: not
 * wanted) as above; 0 or -1 */
static int curve(int device, int lora, double *loss, struct cuda_fp8_stats *st,
                 struct base_out *bo) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_LLAMA);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 128;
    c.d_ff = 256;
    c.vocab_size = VOCAB;
    c.seq_len = T_SEQ;
    model_config_finalize(&c);
    struct engine_place pl = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .frozen = lora};
    struct backend *be = device ? backend_cuda_new(0) : backend_cpu_new(0);
    struct engine *e = be ? engine_new(&c, &pl, be) : NULL;
    struct model *m = e ? model_new(e, B_SEQ, T_SEQ, 0) : NULL;
    struct lora *l = NULL;
    int rc = -1;
    if (!m || model_init_params(m, 42) != 0) goto out;
    struct lora_opts lo = {
        .rank = 8, .alpha = 16, .dropout = 0, .targets = targets, .n_targets = 7, .seed = 3};
    const char *code = NULL;
    char err[256];
    if (lora && !(l = lora_new(m, &lo, &code, err, sizeof err))) {
        printf("lora_new: %s %s\n", code ? code : "", err);
        goto out;
    }
    m->lora = l;
    if (device >= 2) {
        int n = 0;
        size_t bytes = 0;
        if (model_fp8_freeze(m, device == 2, &n, &bytes) != 0 || n != 4 * c.n_layer || !m->fp8 ||
            (lora && (device == 3) != (e->fp8b != NULL))) {
            printf("model_fp8_freeze: %d weights, held %d\n", n, e->fp8b != NULL);
            goto out;
        }
    }
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = STEPS;
    o.grad_accum = 1;
    o.global_batch_tokens = (int64_t)B_SEQ * T_SEQ;
    o.optim = (struct optim_cfg){.lr = 3e-3,
                                 .min_lr = 3e-3,
                                 .steps = STEPS,
                                 .schedule = OPTIM_CONSTANT,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.01,
                                 .grad_clip = 1.0};
    o.train.batch = src_batch;
    int32_t in[B_SEQ * T_SEQ], tg[B_SEQ * T_SEQ];
    for (int i = 0; i < STEPS; i++) {
        struct train_step_info info;
        if (train_step(m, &o, i, &info, in, tg, err, sizeof err) != 0) {
            printf("train_step: %s\n", err);
            goto out;
        }
        loss[i] = info.loss;
    }
    if (st && backend_cuda_fp8_stats(e->be, st) != 0) goto out;
    if (bo) {
        bo->params = e->mem.params;
        bo->n = e->n_params;
        bo->base = malloc(bo->n * sizeof(float));
        bo->merged = malloc(bo->n * sizeof(float));
        if (!bo->base || !bo->merged) goto out;
        engine_opt_read(e, ENGINE_OPT_MASTER, bo->base, 0, bo->n);
        if (lora_merge(l) != 0) goto out;
        engine_opt_read(e, ENGINE_OPT_MASTER, bo->merged, 0, bo->n);
    }
    rc = 0;
out:
    if (m) m->lora = NULL;
    lora_free(l);
    model_free(m);
    engine_free(e);
    return rc;
}

static void test_curve(int lora) {
    const char *what = lora ? "LoRA" : "full fine-tune";
    double cpu[STEPS], bf[STEPS], f8[STEPS];
    struct cuda_fp8_stats st;
    memset(&st, 0, sizeof st);
    char msg[200];
    if (curve(0, lora, cpu, NULL, NULL) || curve(1, lora, bf, NULL, NULL) ||
        curve(2 + lora, lora, f8, &st, NULL)) {
        snprintf(msg, sizeof msg, "%s curves ran (cpu, cuda bf16, cuda fp8)", what);
        result(0, msg, "%g %g", 0, 0);
        return;
    }
    double wstep = 0, mean = 0;
    for (int i = 0; i < STEPS; i++) {
        double r = fabs(f8[i] - cpu[i]) / cpu[i];
        if (!(r <= wstep)) wstep = r;
        mean += r / STEPS;
        printf("  step %2d %s  cpu %.5f  bf16 %.5f  fp8 %.5f\n", i, what, cpu[i], bf[i], f8[i]);
    }
    snprintf(msg, sizeof msg, "%s fp8 curve: every step within 5%% of the cpu fp32 curve", what);
    result(wstep <= TOL_STEP, msg, "worst %.4f, bound %.2f", wstep, TOL_STEP);
    snprintf(msg, sizeof msg, "%s fp8 curve: mean relative gap to cpu within 2%%", what);
    result(mean <= TOL_MEAN, msg, "mean %.4f, bound %.2f", mean, TOL_MEAN);
    double r1 = fabs(f8[0] - bf[0]) / bf[0];
    snprintf(msg, sizeof msg, "%s fp8 first step within 2%% of the bf16 cuda run's", what);
    result(r1 <= TOL_STEP1, msg, "%.5f vs %.5f", f8[0], bf[0]);
    snprintf(msg, sizeof msg, "%s fp8 loss falls", what);
    result(f8[STEPS - 1] < f8[0] - 0.1, msg, "%.4f -> %.4f", f8[0], f8[STEPS - 1]);
    /* 2 layers x 4 linears: a forward each per step, an input gradient each (the q|k|v one
     * too: the norm's gradient needs it), and without LoRA a weight gradient each */
    long want = 8L * STEPS;
    snprintf(msg, sizeof msg,
             "%s: every block linear layer in E4M3 (forward, input-gradient%s GEMMs, no "
             "fallback)",
             what, lora ? "" : ", weight-gradient");
    result(st.weights == 8 && st.fwd >= want && st.bwd >= want &&
               (lora ? st.wgrad == 0 : st.wgrad >= want) && st.fallback == 0,
           msg, "%g forward, %g input-gradient GEMMs", (double)st.fwd, (double)st.bwd);
}

/* (d) the LoRA base held as E4M3 alone against the bf16 base with E4M3 copies: the same
 * curve bit for bit (W8^T is W8 transposed byte for byte), 3 bytes a block weight less
 * device memory, every GEMM in E4M3 with nothing
 * dequantized, and the base an export reads, before and after lora_merge, bit for bit the
 * same (the host copy against the device's bf16 base) */
static void test_held(void) {
    double cp[STEPS], hd[STEPS];
    struct cuda_fp8_stats sc, sh;
    struct base_out bc = {0}, bh = {0};
    if (curve(2, 1, cp, &sc, &bc) || curve(3, 1, hd, &sh, &bh) || bc.n != bh.n) {
        result(0, "held base: both LoRA fp8 runs", "%g %g", 0, 0);
        goto out;
    }
    int same = 1;
    for (int i = 0; i < STEPS; i++)
        same &= cp[i] == hd[i];
    result(same, "held base: the LoRA fp8 curve equals the copies' bit for bit",
           "last %.9f vs %.9f", cp[STEPS - 1], hd[STEPS - 1]);
    size_t nb = sh.bytes, saved = bc.params - bh.params;
    result(sh.held == 8 && sc.held == 0 && bh.params < bc.params && saved == 3 * nb,
           "held base: 8 weights held, device params 3 bytes a block weight less",
           "saved %g of %g bytes", (double)saved, (double)(3 * nb));
    result(sh.fwd == sc.fwd && sh.bwd == sc.bwd && sh.fallback == 0 && sh.dequant == 0,
           "held base: every GEMM in E4M3, none dequantized", "%g forward, %g input-gradient",
           (double)sh.fwd, (double)sh.bwd);
    size_t db = 0, dm = 0, changed = 0;
    for (size_t i = 0; i < bc.n; i++) {
        db += memcmp(&bc.base[i], &bh.base[i], 4) != 0;
        dm += memcmp(&bc.merged[i], &bh.merged[i], 4) != 0;
        changed += bh.merged[i] != bh.base[i];
    }
    result(db == 0 && dm == 0 && changed > 0,
           "held base: the base and the merged base read from the host copy equal the device's",
           "%g differ, %g merged values changed", (double)(db + dm), (double)changed);
out:
    free(bc.base), free(bc.merged), free(bh.base), free(bh.merged);
}

int main(void) {
    int rc = lcuda_probe();
    if (rc) return rc;
    test_quant();
    static const struct mm_case cases[] = {{256, 512, 1536}, {256, 1536, 512}, {128, 256, 768}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int trained = 0; trained < 2; trained++)
            test_gemm_case(&cases[i], trained);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_gemm_case(&cases[i], 2);
    test_fallback();
    test_curve(1);
    test_curve(0);
    test_held();
    printf("test_fp8: %d failure(s)\n", fails);
    return fails ? 1 : 0;
}
