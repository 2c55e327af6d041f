/* Gradient checks of every CPU backend layer.
 *
 * For each layer a double-precision reference forward (written here,
 * independently of worker/cpu) defines L = sum_i w_i * out_i with random
 * weights w. The test checks
 *   1. the backend forward against the reference forward:
 *      |a - r| <= 1e-5 + 1e-4 |r|   (fp32 vs double);
 *   2. every backend gradient (backward called with dout = w) against central
 *      finite differences of the double reference, h = 1e-6:
 *      |g - fd| <= 1e-4 + 1e-3 |fd|  (fp32 backward vs double);
 *   3. that backward accumulates: gradient buffers start at 0.25 and the
 *      backend must add to them (rope_bwd, in place, is the stated exception).
 * Shapes are small and odd-sized to catch indexing errors; tokens include
 * repeats; the classifier case has padded vocabulary columns (V=11, Vp=16)
 * and an ignored row (target -1). Also checks 1 vs 2 threads give identical
 * bits for every layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/backend.h"

enum {
    B = 2,
    T = 5,
    N = B * T,
    C = 12,
    OC = 7,
    F = 6,
    NH = 4,
    NKV = 2,
    HD = 4,
    QKV = (NH + 2 * NKV) * HD,
    V = 11,
    VP = 16,
    NH2 = 2, /* attention with 8-wide vector paths: HD2 = 16, grouped 2:1 */
    NKV2 = 1,
    HD2 = 16,
    QKV2 = (NH2 + 2 * NKV2) * HD2,
    IC2 = 37, /* wider matmul: covers the 16-column vector tiles and their tails */
    OC2 = 21,
};
#define EPS 1e-5f
#define GS  0.37f

#define MAXIN 5

struct gc_case;
typedef void (*ref_fn)(double **in, double *out);
typedef void (*fwd_fn)(struct backend *b, float **in, float *out);
typedef void (*bwd_fn)(struct backend *b, float **in, const float *dout, float **din);

struct gc_case {
    const char *name;
    int nin;
    size_t in_n[MAXIN];
    int diff[MAXIN]; /* 1: gradient checked */
    size_t out_n;
    ref_fn ref;
    fwd_fn fwd;
    bwd_fn bwd;
    int uniform_dout; /* classifier: loss weights are all GS */
    int in_place_bwd; /* rope: gradient overwritten, not accumulated */
};

static int32_t tokens[N] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
static int32_t targets[N] = {2, 7, 1, 8, -1, 8, 1, 0, 10, 4};
/* stats saved between backend forward and backward */
static float s_mean[N], s_rstd[N], s_lse[B * NH * T], s_out[N * NH * HD], s_loss[N];
static float s_lse2[B * NH2 * T], s_out2[N * NH2 * HD2];

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---- reference forwards (double) ---- */

static void ref_embedding(double **in, double *out) {
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            out[r * C + c] = in[0][tokens[r] * C + c] + in[1][(r % T) * C + c];
}
static void ref_layernorm(double **in, double *out) {
    for (int r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += in[0][r * C + c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (in[0][r * C + c] - m) * (in[0][r * C + c] - m);
        double rs = 1.0 / sqrt(v / C + EPS);
        for (int c = 0; c < C; c++)
            out[r * C + c] = (in[0][r * C + c] - m) * rs * in[1][c] + in[2][c];
    }
}
static void ref_rmsnorm(double **in, double *out) {
    for (int r = 0; r < N; r++) {
        double s = 0;
        for (int c = 0; c < C; c++)
            s += in[0][r * C + c] * in[0][r * C + c];
        double rs = 1.0 / sqrt(s / C + EPS);
        for (int c = 0; c < C; c++)
            out[r * C + c] = in[0][r * C + c] * rs * in[1][c];
    }
}
static void ref_matmul(double **in, double *out) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = in[2][o];
            for (int i = 0; i < C; i++)
                s += in[0][r * C + i] * in[1][o * C + i];
            out[r * OC + o] = s;
        }
}
static void ref_matmul2(double **in, double *out) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC2; o++) {
            double s = in[2][o];
            for (int i = 0; i < IC2; i++)
                s += in[0][r * IC2 + i] * in[1][o * IC2 + i];
            out[r * OC2 + o] = s;
        }
}
static void ref_gelu(double **in, double *out) {
    for (int i = 0; i < N * C; i++) {
        double x = in[0][i];
        out[i] = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}
static void ref_swiglu(double **in, double *out) {
    for (int r = 0; r < N; r++)
        for (int j = 0; j < F; j++) {
            double g = in[0][r * 2 * F + j], u = in[0][r * 2 * F + F + j];
            out[r * F + j] = g / (1 + exp(-g)) * u;
        }
}
static void ref_rope(double **in, double *out) {
    const double theta = 10000.0;
    memcpy(out, in[0], sizeof(double) * N * QKV);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < NH + NKV; h++)
            for (int d = 0; d < HD / 2; d++) {
                double ang = (r % T) * pow(theta, -2.0 * d / HD);
                double a = in[0][r * QKV + h * HD + d], b = in[0][r * QKV + h * HD + d + HD / 2];
                out[r * QKV + h * HD + d] = a * cos(ang) - b * sin(ang);
                out[r * QKV + h * HD + d + HD / 2] = b * cos(ang) + a * sin(ang);
            }
}
static void attention_ref(const double *x, double *out, int nh, int nkv, int hd) {
    int S = (nh + 2 * nkv) * hd;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                int kvh = h / (nh / nkv);
                double s[T], m = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int k = 0; k < hd; k++)
                        d += x[(b * T + t) * S + h * hd + k] *
                             x[(b * T + j) * S + (nh + kvh) * hd + k];
                    s[j] = d / sqrt((double)hd);
                    if (s[j] > m) m = s[j];
                }
                for (int j = 0; j <= t; j++)
                    sum += (s[j] = exp(s[j] - m));
                for (int k = 0; k < hd; k++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += s[j] / sum * x[(b * T + j) * S + (nh + nkv + kvh) * hd + k];
                    out[(b * T + t) * nh * hd + h * hd + k] = o;
                }
            }
}
static void ref_attention(double **in, double *out) {
    attention_ref(in[0], out, NH, NKV, HD);
}
static void ref_attention2(double **in, double *out) {
    attention_ref(in[0], out, NH2, NKV2, HD2);
}
static void ref_residual(double **in, double *out) {
    for (int i = 0; i < N * C; i++)
        out[i] = in[0][i] + in[1][i];
}
static void ref_classifier(double **in, double *out) {
    for (int r = 0; r < N; r++) {
        if (targets[r] < 0) {
            out[r] = 0;
            continue;
        }
        double lg[V], m = -1e300, s = 0;
        for (int v = 0; v < V; v++) {
            lg[v] = 0;
            for (int c = 0; c < C; c++)
                lg[v] += in[0][r * C + c] * in[1][v * C + c];
            if (lg[v] > m) m = lg[v];
        }
        for (int v = 0; v < V; v++)
            s += exp(lg[v] - m);
        out[r] = m + log(s) - lg[targets[r]];
    }
}

/* ---- backend calls ---- */

static void be_embedding_f(struct backend *b, float **in, float *out) {
    b->embedding_fwd(b->ctx, out, tokens, in[0], in[1], B, T, C);
}
static void be_embedding_b(struct backend *b, float **in, const float *dout, float **din) {
    b->embedding_bwd(b->ctx, din[0], din[1], dout, tokens, B, T, C);
}
static void be_layernorm_f(struct backend *b, float **in, float *out) {
    b->layernorm_fwd(b->ctx, out, s_mean, s_rstd, in[0], in[1], in[2], N, C, EPS);
}
static void be_layernorm_b(struct backend *b, float **in, const float *dout, float **din) {
    b->layernorm_bwd(b->ctx, din[0], din[1], din[2], dout, in[0], in[1], s_mean, s_rstd, N, C);
}
static void be_rmsnorm_f(struct backend *b, float **in, float *out) {
    b->rmsnorm_fwd(b->ctx, out, s_rstd, in[0], in[1], N, C, EPS);
}
static void be_rmsnorm_b(struct backend *b, float **in, const float *dout, float **din) {
    b->rmsnorm_bwd(b->ctx, din[0], din[1], dout, in[0], in[1], s_rstd, N, C);
}
static void be_matmul_f(struct backend *b, float **in, float *out) {
    b->matmul_fwd(b->ctx, out, in[0], in[1], in[2], N, C, OC);
}
static void be_matmul_b(struct backend *b, float **in, const float *dout, float **din) {
    b->matmul_bwd(b->ctx, din[0], din[1], din[2], dout, in[0], in[1], N, C, OC);
}
static void be_matmul2_f(struct backend *b, float **in, float *out) {
    b->matmul_fwd(b->ctx, out, in[0], in[1], in[2], N, IC2, OC2);
}
static void be_matmul2_b(struct backend *b, float **in, const float *dout, float **din) {
    b->matmul_bwd(b->ctx, din[0], din[1], din[2], dout, in[0], in[1], N, IC2, OC2);
}
static void be_gelu_f(struct backend *b, float **in, float *out) {
    b->gelu_fwd(b->ctx, out, in[0], N * C);
}
static void be_gelu_b(struct backend *b, float **in, const float *dout, float **din) {
    b->gelu_bwd(b->ctx, din[0], in[0], dout, N * C);
}
static void be_swiglu_f(struct backend *b, float **in, float *out) {
    b->swiglu_fwd(b->ctx, out, in[0], N, F);
}
static void be_swiglu_b(struct backend *b, float **in, const float *dout, float **din) {
    b->swiglu_bwd(b->ctx, din[0], in[0], dout, N, F);
}
static void be_rope_f(struct backend *b, float **in, float *out) {
    memcpy(out, in[0], sizeof(float) * N * QKV);
    b->rope_fwd(b->ctx, out, N, T, QKV, NH + NKV, HD, 10000.0f);
}
static void be_rope_b(struct backend *b, float **in, const float *dout, float **din) {
    memcpy(din[0], dout, sizeof(float) * N * QKV);
    b->rope_bwd(b->ctx, din[0], N, T, QKV, NH + NKV, HD, 10000.0f);
}
static void be_attention_f(struct backend *b, float **in, float *out) {
    b->attention_fwd(b->ctx, out, s_lse, in[0], B, T, NH, NKV, HD);
    memcpy(s_out, out, sizeof s_out);
}
static void be_attention_b(struct backend *b, float **in, const float *dout, float **din) {
    b->attention_bwd(b->ctx, din[0], dout, in[0], s_out, s_lse, B, T, NH, NKV, HD);
}
static void be_attention2_f(struct backend *b, float **in, float *out) {
    b->attention_fwd(b->ctx, out, s_lse2, in[0], B, T, NH2, NKV2, HD2);
    memcpy(s_out2, out, sizeof s_out2);
}
static void be_attention2_b(struct backend *b, float **in, const float *dout, float **din) {
    b->attention_bwd(b->ctx, din[0], dout, in[0], s_out2, s_lse2, B, T, NH2, NKV2, HD2);
}
static void be_residual_f(struct backend *b, float **in, float *out) {
    b->residual_fwd(b->ctx, out, in[0], in[1], N * C);
}
static void be_residual_b(struct backend *b, float **in, const float *dout, float **din) {
    b->accumulate(b->ctx, din[0], dout, N * C);
    b->accumulate(b->ctx, din[1], dout, N * C);
}
static void be_classifier_f(struct backend *b, float **in, float *out) {
    b->classifier(b->ctx, out, NULL, NULL, in[0], in[1], targets, N, C, V, VP, GS);
}
static void be_classifier_b(struct backend *b, float **in, const float *dout, float **din) {
    b->classifier(b->ctx, s_loss, din[0], din[1], in[0], in[1], targets, N, C, V, VP, GS);
}

static const struct gc_case cases[] = {
    {"embedding",
     2,
     {VP * C, T *C},
     {1, 1},
     N *C,
     ref_embedding,
     be_embedding_f,
     be_embedding_b,
     0,
     0},
    {"layernorm",
     3,
     {N * C, C, C},
     {1, 1, 1},
     N *C,
     ref_layernorm,
     be_layernorm_f,
     be_layernorm_b,
     0,
     0},
    {"rmsnorm", 2, {N * C, C}, {1, 1}, N *C, ref_rmsnorm, be_rmsnorm_f, be_rmsnorm_b, 0, 0},
    {"matmul", 3, {N * C, OC *C, OC}, {1, 1, 1}, N *OC, ref_matmul, be_matmul_f, be_matmul_b, 0, 0},
    {"matmul2",
     3,
     {N * IC2, OC2 *IC2, OC2},
     {1, 1, 1},
     N *OC2,
     ref_matmul2,
     be_matmul2_f,
     be_matmul2_b,
     0,
     0},
    {"gelu", 1, {N * C}, {1}, N *C, ref_gelu, be_gelu_f, be_gelu_b, 0, 0},
    {"swiglu", 1, {N * 2 * F}, {1}, N *F, ref_swiglu, be_swiglu_f, be_swiglu_b, 0, 0},
    {"rope", 1, {N * QKV}, {1}, N *QKV, ref_rope, be_rope_f, be_rope_b, 0, 1},
    {"attention",
     1,
     {N * QKV},
     {1},
     N *NH *HD,
     ref_attention,
     be_attention_f,
     be_attention_b,
     0,
     0},
    {"attention2",
     1,
     {N * QKV2},
     {1},
     N *NH2 *HD2,
     ref_attention2,
     be_attention2_f,
     be_attention2_b,
     0,
     0},
    {"residual", 2, {N * C, N *C}, {1, 1}, N *C, ref_residual, be_residual_f, be_residual_b, 0, 0},
    {"classifier",
     2,
     {N * C, VP *C},
     {1, 1},
     N,
     ref_classifier,
     be_classifier_f,
     be_classifier_b,
     1,
     0},
};

static int run_case(const struct gc_case *k, struct backend *b1, struct backend *b2) {
    int fails = 0;
    double *din[MAXIN], *tmp[MAXIN];
    float *fin[MAXIN], *fgrad[MAXIN], *fgrad2[MAXIN];
    double *ref = malloc(sizeof(double) * k->out_n), *w = malloc(sizeof(double) * k->out_n);
    float *out = malloc(sizeof(float) * k->out_n), *out2 = malloc(sizeof(float) * k->out_n);
    float *dout = malloc(sizeof(float) * k->out_n);
    for (int i = 0; i < k->nin; i++) {
        din[i] = malloc(sizeof(double) * k->in_n[i]);
        tmp[i] = din[i];
        fin[i] = malloc(sizeof(float) * k->in_n[i]);
        fgrad[i] = malloc(sizeof(float) * k->in_n[i]);
        fgrad2[i] = malloc(sizeof(float) * k->in_n[i]);
        for (size_t j = 0; j < k->in_n[i]; j++) {
            fin[i][j] = (float)urand();
            din[i][j] = fin[i][j]; /* the reference sees exactly the fp32 inputs */
            fgrad[i][j] = fgrad2[i][j] = 0.25f;
        }
    }
    for (size_t j = 0; j < k->out_n; j++) {
        w[j] = k->uniform_dout ? GS : (double)(float)urand();
        dout[j] = (float)w[j];
    }
    /* 1. forward */
    k->ref(din, ref);
    k->fwd(b1, fin, out);
    for (size_t j = 0; j < k->out_n; j++)
        if (!(fabs(out[j] - ref[j]) <= 1e-5 + 1e-4 * fabs(ref[j]))) {
            if (fails++ < 5)
                printf("  %s fwd[%zu]: backend %.8g reference %.8g\n", k->name, j, out[j], ref[j]);
        }
    /* 2./3. backward vs finite differences (accumulating onto 0.25) */
    k->bwd(b1, fin, dout, fgrad);
    double maxerr = 0;
    double *o = malloc(sizeof(double) * k->out_n);
    for (int i = 0; i < k->nin; i++) {
        if (!k->diff[i]) continue;
        for (size_t j = 0; j < k->in_n[i]; j++) {
            double save = din[i][j], h = 1e-6, lp = 0, lm = 0;
            din[i][j] = save + h;
            k->ref(tmp, o);
            for (size_t q = 0; q < k->out_n; q++)
                lp += w[q] * o[q];
            din[i][j] = save - h;
            k->ref(tmp, o);
            for (size_t q = 0; q < k->out_n; q++)
                lm += w[q] * o[q];
            din[i][j] = save;
            double fd = (lp - lm) / (2 * h);
            double g = fgrad[i][j] - (k->in_place_bwd ? 0.0 : 0.25);
            double err = fabs(g - fd);
            if (err > maxerr) maxerr = err;
            if (!(err <= 1e-4 + 1e-3 * fabs(fd))) {
                if (fails++ < 5)
                    printf("  %s grad in%d[%zu]: backend %.8g finite-diff %.8g\n", k->name, i, j, g,
                           fd);
            }
        }
    }
    /* 4. thread-count independence: forward and backward bit-identical */
    k->fwd(b2, fin, out2);
    if (memcmp(out, out2, sizeof(float) * k->out_n) != 0) {
        printf("  %s: forward differs between 1 and 2 threads\n", k->name);
        fails++;
    }
    k->fwd(b1, fin, out); /* restore saved stats of the 1-thread run */
    k->bwd(b2, fin, dout, fgrad2);
    for (int i = 0; i < k->nin; i++)
        if (memcmp(fgrad[i], fgrad2[i], sizeof(float) * k->in_n[i]) != 0) {
            printf("  %s: gradient of input %d differs between 1 and 2 threads\n", k->name, i);
            fails++;
        }
    printf("%-10s %s (max |grad - fd| = %.2e)\n", k->name, fails ? "FAIL" : "ok", maxerr);
    for (int i = 0; i < k->nin; i++) {
        free(din[i]);
        free(fin[i]);
        free(fgrad[i]);
        free(fgrad2[i]);
    }
    free(o);
    free(ref);
    free(w);
    free(out);
    free(out2);
    free(dout);
    return fails;
}

int main(void) {
    /* every parallel region threaded, so 1 vs 2 threads is a real comparison */
    setenv("LOOM_CPU_PAR_MIN", "0", 1);
    struct backend *b1 = backend_cpu_new(1), *b2 = backend_cpu_new(2);
    if (!b1 || !b2) return 1;
    struct backend_limits lim;
    memset(&lim, 0, sizeof lim);
    lim.B = B;
    lim.T = T;
    lim.C = C;
    lim.NH = NH;
    lim.NKV = NKV;
    lim.HD = HD;
    lim.F = F;
    lim.Vp = VP;
    lim.threads = 1;
    if (b1->reserve(b1->ctx, &lim) != 0) return 1;
    lim.threads = 2;
    if (b2->reserve(b2->ctx, &lim) != 0) return 1;
    int fails = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        fails += run_case(&cases[i], b1, b2);
    backend_free(b1);
    backend_free(b2);
    printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
