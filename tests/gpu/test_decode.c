/* GPU test: the CUDA backend's generation and imported-model operations
 * (backend.h "imported models and generation": attention_decode, rope_at,
 * rope_set_freqs; worker/cuda/k_decode.cu) against references computed here
 * in double precision from the same bf16 inputs.
 *
 * - attention_decode: a table of shapes (multi-head, grouped-query, head
 *   dims 32-256, caches of 1 row to past several 64-row chunks, sharp and
 *   flat softmax); output poisoned with NaN first; bound per element
 *   |gpu - ref| <= 2^-8 |ref| + 1e-4 max|v| (one bf16 rounding of an fp32
 *   result, fp32 sums); bit-repeatable.
 * - rope_at: positions pos0 + r, q and k heads of a fused qkv row rotated, v
 *   heads untouched bit for bit; bound per pair 2^-8 |pair| + angle error
 *   (fp32 angle: 1e-6 + 8e-7 pos radians). rope_at at pos0 gives the same bits
 *   as rope_fwd's row pos0 (so decoding caches the keys the forward makes).
 * - rope_set_freqs: a llama3-style table of inverse frequencies used by
 *   rope_at and rope_fwd, rope_bwd undoing rope_fwd; NULL restores
 *   theta^(-2i/HD) bit for bit.
 * Prints one PASS / FAIL line per case and exits 77 when no GPU is found. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "worker/backend.h"
#include "worker/cuda/cuda_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}
static float nrand(void) {
    return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()));
}

static struct backend *gpu;

/* n bf16 values N(0, s^2) (bits in b, their exact value in f) */
static void fill(uint16_t *b, double *f, size_t n, float s) {
    for (size_t i = 0; i < n; i++) {
        b[i] = lcuda_f2bf(nrand() * s);
        f[i] = lcuda_bf2f(b[i]);
    }
}

static void *up(const void *h, size_t bytes) {
    void *d = gpu->alloc(gpu->ctx, bytes);
    gpu->upload(gpu->ctx, d, h, bytes);
    return d;
}

static void report(const char *what, int before, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(const char *what, int before, const char *fmt, ...) {
    va_list ap;
    printf("%s %s: ", check_failures == before ? "PASS" : "FAIL", what);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* ---- attention_decode ---- */

static const struct dcase {
    int NH, NKV, HD, n;
    float qs; /* query scale: 1 flat-ish softmax, 4 sharp */
} dcases[] = {
    {4, 4, 64, 1, 1},     {4, 2, 32, 7, 1},     {8, 2, 128, 64, 1},   {8, 8, 128, 65, 4},
    {4, 1, 256, 300, 1},  {6, 3, 96, 130, 1},   {2, 2, 64, 4097, 1},  {32, 8, 128, 1000, 1},
    {14, 2, 64, 5000, 4}, {12, 12, 64, 257, 4}, {4, 2, 32, 20000, 1},
};

static void test_decode(const struct dcase *c) {
    int before = check_failures;
    int NH = c->NH, NKV = c->NKV, HD = c->HD, n = c->n;
    size_t S = (size_t)2 * NKV * HD, nq = (size_t)NH * HD, nkv = (size_t)n * S;
    uint16_t *qb = malloc(nq * 2), *kvb = malloc(nkv * 2), *ob = malloc(nq * 2),
             *ob2 = malloc(nq * 2);
    double *qf = malloc(nq * sizeof *qf), *kvf = malloc(nkv * sizeof *kvf);
    double *p = malloc((size_t)n * sizeof *p);
    fill(qb, qf, nq, c->qs);
    fill(kvb, kvf, nkv, 1.0f);
    double vmax = 0;
    for (int t = 0; t < n; t++)
        for (size_t j = (size_t)NKV * HD; j < S; j++)
            vmax = fmax(vmax, fabs(kvf[(size_t)t * S + j]));
    void *dq = up(qb, nq * 2), *dkv = up(kvb, nkv * 2), *dout = gpu->alloc(gpu->ctx, nq * 2);
    for (size_t i = 0; i < nq; i++)
        ob[i] = 0x7fc0; /* NaN: an unwritten element fails */
    gpu->upload(gpu->ctx, dout, ob, nq * 2);
    gpu->attention_decode(gpu->ctx, dout, dq, dkv, n, NH, NKV, HD);
    gpu->download(gpu->ctx, ob, dout, nq * 2);
    gpu->attention_decode(gpu->ctx, dout, dq, dkv, n, NH, NKV, HD);
    gpu->download(gpu->ctx, ob2, dout, nq * 2);
    double worst = 0; /* error / bound */
    int grp = NH / NKV;
    for (int h = 0; h < NH; h++) {
        const double *k = kvf + (size_t)(h / grp) * HD, *v = kvf + (size_t)(NKV + h / grp) * HD;
        double m = -INFINITY, z = 0;
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int d = 0; d < HD; d++)
                s += qf[(size_t)h * HD + d] * k[(size_t)t * S + d];
            p[t] = s / sqrt((double)HD);
            m = fmax(m, p[t]);
        }
        for (int t = 0; t < n; t++)
            z += (p[t] = exp(p[t] - m));
        for (int d = 0; d < HD; d++) {
            double r = 0;
            for (int t = 0; t < n; t++)
                r += p[t] / z * v[(size_t)t * S + d];
            double g = lcuda_bf2f(ob[(size_t)h * HD + d]);
            double bound = ldexp(fabs(r), -8) + 1e-4 * vmax, err = fabs(g - r);
            if (!(err <= bound)) /* NaN fails too */
                CHECK(0, "decode NH=%d NKV=%d HD=%d n=%d: head %d elem %d: %.6g vs %.6g", NH, NKV,
                      HD, n, h, d, g, r);
            if (err / bound > worst) worst = err / bound;
        }
    }
    CHECK(memcmp(ob, ob2, nq * 2) == 0, "decode NH=%d HD=%d n=%d: two runs differ", NH, HD, n);
    char what[96];
    snprintf(what, sizeof what, "attention_decode NH=%d NKV=%d HD=%d n=%d q*%g", NH, NKV, HD, n,
             (double)c->qs);
    report(what, before, "worst error %.2f of its bound, repeat bit-exact %s", worst,
           memcmp(ob, ob2, nq * 2) == 0 ? "yes" : "no");
    gpu->free(gpu->ctx, dq);
    gpu->free(gpu->ctx, dkv);
    gpu->free(gpu->ctx, dout);
    free(qb);
    free(kvb);
    free(ob);
    free(ob2);
    free(qf);
    free(kvf);
    free(p);
}

/* ---- RoPE ---- */

/* Rows [N][stride] with heads of HD from column 0: rotate the first nrot
 * heads of row r by (pos0 + r) * inv[d] (double reference) and compare; the
 * rest of each row must be unchanged bits. sign -1: the inverse rotation. */
static double rope_check(const char *what, const uint16_t *in, const uint16_t *got, int N,
                         int stride, int nrot, int HD, int pos0, const double *inv, double sign) {
    int h2 = HD / 2;
    double worst = 0;
    for (int r = 0; r < N; r++) {
        for (int hd = 0; hd < nrot; hd++)
            for (int d = 0; d < h2; d++) {
                size_t i = (size_t)r * stride + (size_t)hd * HD + d, j = i + h2;
                double a = lcuda_bf2f(in[i]), b = lcuda_bf2f(in[j]);
                double ang = sign * (double)(pos0 + r) * inv[d];
                double ra = a * cos(ang) - b * sin(ang), rb = b * cos(ang) + a * sin(ang);
                double mag = sqrt(a * a + b * b);
                double bound = ldexp(mag, -8) + (1e-6 + 8e-7 * (pos0 + r)) * mag + 1e-30;
                double e = fmax(fabs(lcuda_bf2f(got[i]) - ra), fabs(lcuda_bf2f(got[j]) - rb));
                if (!(e <= bound))
                    CHECK(0, "%s: row %d head %d pair %d: (%.6g, %.6g) vs (%.6g, %.6g)", what, r,
                          hd, d, lcuda_bf2f(got[i]), lcuda_bf2f(got[j]), ra, rb);
                if (e / bound > worst) worst = e / bound;
            }
        for (int col = nrot * HD; col < stride; col++) {
            size_t i = (size_t)r * stride + col;
            if (in[i] != got[i]) {
                CHECK(0, "%s: row %d column %d (not rotated) changed", what, r, col);
                break;
            }
        }
    }
    return worst;
}

static void theta_freqs(double *inv, int HD, double theta) {
    for (int d = 0; d < HD / 2; d++)
        inv[d] = pow(theta, -2.0 * d / HD);
}

/* transformers' llama3 rule (_compute_llama3_parameters), written here for
 * the test: long wavelengths divided by factor, short ones kept, a smooth
 * blend between. */
static void llama3_freqs(double *inv, int HD, double theta, double factor, double lo, double hi,
                         double old) {
    for (int d = 0; d < HD / 2; d++) {
        double f = pow(theta, -2.0 * d / HD), wl = 2 * 3.141592653589793 / f;
        if (wl < old / hi) {
            inv[d] = f;
        } else if (wl > old / lo) {
            inv[d] = f / factor;
        } else {
            double sm = (old / wl - lo) / (hi - lo);
            inv[d] = (1 - sm) * f / factor + sm * f;
        }
    }
}

static const struct rcase {
    int NH, NKV, HD, N, pos0;
    float theta;
} rcases[] = {
    {4, 2, 32, 1, 0, 10000.f},   {4, 2, 32, 1, 37, 10000.f}, {8, 2, 128, 3, 4095, 500000.f},
    {4, 4, 64, 1, 20000, 1e6f},  {14, 2, 64, 5, 123, 1e6f},  {32, 8, 128, 1, 8191, 500000.f},
    {2, 1, 256, 2, 77, 10000.f},
};

static void test_rope(const struct rcase *c) {
    int before = check_failures;
    int HD = c->HD, stride = (c->NH + 2 * c->NKV) * HD, nrot = c->NH + c->NKV, N = c->N;
    size_t n = (size_t)N * stride;
    uint16_t *xb = malloc(n * 2), *got = malloc(n * 2);
    double *xf = malloc(n * sizeof *xf), *inv = malloc((size_t)HD / 2 * sizeof *inv);
    fill(xb, xf, n, 1.0f);
    theta_freqs(inv, HD, c->theta);
    void *dx = up(xb, n * 2);
    gpu->rope_at(gpu->ctx, dx, N, stride, nrot, HD, c->pos0, c->theta);
    gpu->download(gpu->ctx, got, dx, n * 2);
    char what[96];
    snprintf(what, sizeof what, "rope_at NH=%d NKV=%d HD=%d N=%d pos0=%d theta=%g", c->NH, c->NKV,
             HD, N, c->pos0, (double)c->theta);
    double w = rope_check(what, xb, got, N, stride, nrot, HD, c->pos0, inv, 1);
    /* the same rows at positions pos0.. of a sequence through rope_fwd: the
     * training forward's bits (T = pos0 + N rows, the last N compared) */
    int T = c->pos0 + N;
    size_t nt = (size_t)T * stride;
    uint16_t *seq = calloc(nt, 2), *sg = malloc(nt * 2);
    memcpy(seq + (size_t)c->pos0 * stride, xb, n * 2);
    void *ds = up(seq, nt * 2);
    gpu->rope_fwd(gpu->ctx, ds, T, T, stride, nrot, HD, c->theta);
    gpu->download(gpu->ctx, sg, ds, nt * 2);
    int same = memcmp(sg + (size_t)c->pos0 * stride, got, n * 2) == 0;
    CHECK(same, "%s: not the bits of rope_fwd's rows %d..", what, c->pos0);
    report(what, before, "worst error %.2f of its bound, bits of rope_fwd %s", w,
           same ? "yes" : "no");
    gpu->free(gpu->ctx, dx);
    gpu->free(gpu->ctx, ds);
    free(xb);
    free(got);
    free(xf);
    free(inv);
    free(seq);
    free(sg);
}

/* rope_set_freqs: llama3 scaling through rope_at, rope_fwd and rope_bwd; NULL
 * restores the unscaled bits. */
static void test_rope_freqs(void) {
    int before = check_failures;
    const int NH = 8, NKV = 2, HD = 64, T = 160, stride = (NH + 2 * NKV) * HD, nrot = NH + NKV;
    const float theta = 500000.f;
    size_t n = (size_t)T * stride;
    uint16_t *xb = malloc(n * 2), *fw = malloc(n * 2), *at = malloc(n * 2), *bw = malloc(n * 2),
             *plain = malloc(n * 2), *again = malloc(n * 2);
    double *xf = malloc(n * sizeof *xf), inv[32], unscaled[32];
    fill(xb, xf, n, 1.0f);
    llama3_freqs(inv, HD, theta, 8.0, 1.0, 4.0, 64.0);
    theta_freqs(unscaled, HD, theta);
    void *dx = up(xb, n * 2);
    gpu->rope_fwd(gpu->ctx, dx, T, T, stride, nrot, HD, theta);
    gpu->download(gpu->ctx, plain, dx, n * 2);
    CHECK(gpu->rope_set_freqs(gpu->ctx, inv, HD / 2) == 0);
    gpu->upload(gpu->ctx, dx, xb, n * 2);
    gpu->rope_fwd(gpu->ctx, dx, T, T, stride, nrot, HD, theta);
    gpu->download(gpu->ctx, fw, dx, n * 2);
    double w1 = rope_check("rope_fwd llama3", xb, fw, T, stride, nrot, HD, 0, inv, 1);
    /* rope_bwd rotates back by the same angles: the input again within two
     * bf16 roundings of each pair (2^-7 of its magnitude); v heads unchanged */
    gpu->rope_bwd(gpu->ctx, dx, T, T, stride, nrot, HD, theta);
    gpu->download(gpu->ctx, bw, dx, n * 2);
    double w2 = 0;
    int bad = 0;
    for (int r = 0; r < T && !bad; r++)
        for (int col = 0; col < stride && !bad; col++) {
            size_t i = (size_t)r * stride + col;
            if (col >= nrot * HD) {
                bad = bw[i] != xb[i];
                CHECK(!bad, "rope_bwd llama3: row %d column %d (not rotated) changed", r, col);
                continue;
            }
            int d = col % HD, pair = d < HD / 2 ? col + HD / 2 : col - HD / 2;
            double a = lcuda_bf2f(xb[i]), b = lcuda_bf2f(xb[(size_t)r * stride + pair]);
            double e = fabs(lcuda_bf2f(bw[i]) - a);
            double bound = ldexp(sqrt(a * a + b * b), -7) + 1e-6;
            bad = !(e <= bound);
            CHECK(!bad, "rope_bwd(rope_fwd(x)) llama3: row %d column %d: %.6g vs %.6g", r, col,
                  lcuda_bf2f(bw[i]), a);
            if (e / bound > w2) w2 = e / bound;
        }
    /* rope_at rows 100..104 with the table: rope_fwd's bits */
    void *dr = up(xb + (size_t)100 * stride, (size_t)5 * stride * 2);
    gpu->rope_at(gpu->ctx, dr, 5, stride, nrot, HD, 100, theta);
    gpu->download(gpu->ctx, at, dr, (size_t)5 * stride * 2);
    CHECK(memcmp(at, fw + (size_t)100 * stride, (size_t)5 * stride * 2) == 0,
          "rope_at llama3 rows 100..104: not rope_fwd's bits");
    /* the scaled table differs from the plain one where it should */
    int differs = memcmp(fw, plain, n * 2) != 0;
    CHECK(differs, "rope_set_freqs: the llama3 table changed nothing");
    CHECK(gpu->rope_set_freqs(gpu->ctx, NULL, 0) == 0);
    gpu->upload(gpu->ctx, dx, xb, n * 2);
    gpu->rope_fwd(gpu->ctx, dx, T, T, stride, nrot, HD, theta);
    gpu->download(gpu->ctx, again, dx, n * 2);
    CHECK(memcmp(again, plain, n * 2) == 0, "rope_set_freqs(NULL): not the unscaled bits");
    double w3 = rope_check("rope_fwd after NULL", xb, again, T, stride, nrot, HD, 0, unscaled, 1);
    report("rope_set_freqs llama3 (HD 64, 160 positions)", before,
           "fwd worst %.2f, bwd(fwd) worst %.2f, unscaled again worst %.2f of the bounds", w1, w2,
           w3);
    gpu->free(gpu->ctx, dx);
    gpu->free(gpu->ctx, dr);
    free(xb);
    free(fw);
    free(at);
    free(bw);
    free(plain);
    free(again);
    free(xf);
}

int main(void) {
    int probe = lcuda_probe();
    if (probe) return probe;
    gpu = backend_cuda_new(0);
    if (!gpu) {
        fprintf(stderr, "FAIL: the cuda backend did not start\n");
        return 1;
    }
    CHECK(gpu->attention_decode && gpu->rope_at && gpu->rope_set_freqs,
          "the cuda backend lacks the decode operations");
    if (!gpu->attention_decode || !gpu->rope_at || !gpu->rope_set_freqs) {
        backend_free(gpu);
        return check_summary("test_decode");
    }
    struct backend_limits lim = {
        .B = 1, .T = 64, .C = 256, .NH = 4, .NKV = 2, .HD = 64, .F = 512, .Vp = 256};
    CHECK(gpu->reserve(gpu->ctx, &lim) == 0);
    for (size_t i = 0; i < sizeof dcases / sizeof *dcases; i++)
        test_decode(&dcases[i]);
    for (size_t i = 0; i < sizeof rcases / sizeof *rcases; i++)
        test_rope(&rcases[i]);
    test_rope_freqs();
    backend_free(gpu);
    return check_summary("test_decode");
}
