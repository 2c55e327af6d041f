/* Norm kernel speed on one GPU: dev_norm_fwd, dev_residual_norm_fwd and
 * dev_norm_bwd (dev/cuda: k_norm.cu with every generation; dx, dw and db)
 * for the GPT-2 124M shape (N 16384 = 16 x 1024 rows, C 768), GPT-2 1558M
 * (N 8192, C 1600) and a Llama RMSNorm (N 16384, C 2048), each kernel
 * generation (0-4; 1 ships) in the same process. Times come from CUDA events around each call,
 * median of `iters` (default 30) after 5 warm-ups. GB/s counts the bf16
 * tensors each call must move: fwd reads x and writes out (2 N C x 2 bytes),
 * residual fwd reads a, b and writes res, out (4 N C x 2), bwd reads x, dout
 * and dx and writes dx (4 N C x 2); statistics and the small fp32 partials
 * are left out, so this is the rate against the memory floor.
 * Checks beside the times: each variant's backward repeats bit for bit from
 * the same gradients, the residual sum matches variant 0 bit for bit, and
 * out, dx, dw, db agree with variant 0's within bf16 rounding (relative L2
 * difference of the increments printed), variant 4's exactly. The backward
 * of every variant reads variant 0's forward statistics.
 * Usage: bench_norm [iters]. Exit 1 on a failed check, 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/bench_util.h"
#include "dev/cuda/dev_kernels.h"
#include "worker/cuda/kernels.h"

struct shape {
    const char *name;
    int N, C, rms;
};

static const struct shape shapes[] = {
    {"gpt2-124m", 16384, 768, 0},
    {"gpt2-1558m", 8192, 1600, 0},
    {"llama-rms-2048", 16384, 2048, 1},
};
#define NVAR 5

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / 8388608.0 - 1.0);
}

static uint16_t *rand_dev(size_t n, float scale, float offset) {
    uint16_t *h = malloc(n * 2), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = lcuda_f2bf(frand() * scale + offset);
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

/* Relative L2 difference of a - base against ref - base (base NULL: 0). */
static double rel_diff(const uint16_t *a, const uint16_t *ref, const uint16_t *base, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double z = base ? lcuda_bf2f(base[i]) : 0;
        double x = lcuda_bf2f(a[i]) - z, r = lcuda_bf2f(ref[i]) - z;
        num += (x - r) * (x - r);
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

enum op { OP_FWD, OP_RES, OP_BWD, OP_N };
static const char *op_name[OP_N] = {"fwd", "resfwd", "bwd"};

/* Device buffers of one shape. */
struct bufs {
    int N, C, rms;
    size_t n;
    uint16_t *x, *b2, *w, *bias, *out, *res, *dout, *dx, *dw, *db;
    uint16_t *dx0, *dw0, *db0; /* initial gradients */
    float *mean, *rstd, *mean0, *rstd0, *scratch;
    int var; /* the generation (dev/cuda/dev_kernels.h) */
};

static void run_op(struct bufs *B, enum op o, cudaStream_t s) {
    const uint16_t *bias = B->rms ? NULL : B->bias;
    float *mean = B->rms ? NULL : B->mean;
    if (o == OP_FWD)
        dev_norm_fwd(B->var, B->out, mean, B->rstd, B->x, B->w, bias, B->N, B->C, 1e-5f, B->rms, s);
    else if (o == OP_RES)
        dev_residual_norm_fwd(B->var, B->res, B->out, mean, B->rstd, B->x, B->b2, B->w, bias, B->N,
                              B->C, 1e-5f, B->rms, s);
    else
        dev_norm_bwd(B->var, B->dx, B->dw, B->rms ? NULL : B->db, B->scratch, B->dout, B->x, B->w,
                     B->rms ? NULL : B->mean0, B->rstd0, B->N, B->C, B->rms, s);
}

static void reset_grads(struct bufs *B) {
    CK(cudaMemcpy(B->dx, B->dx0, B->n * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(B->dw, B->dw0, (size_t)B->C * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(B->db, B->db0, (size_t)B->C * 2, cudaMemcpyDeviceToDevice));
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 30, warm = 5;
    if (!bench_have_gpu()) return 77;
    if (iters < 20) iters = 20;
    cudaStream_t s;
    cudaEvent_t ea, eb;
    CK(cudaStreamCreate(&s));
    CK(cudaEventCreate(&ea));
    CK(cudaEventCreate(&eb));
    float *ms = malloc((size_t)iters * sizeof *ms);
    int bad = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *p = &shapes[si];
        struct bufs B;
        memset(&B, 0, sizeof B);
        B.N = p->N, B.C = p->C, B.rms = p->rms, B.n = (size_t)p->N * p->C;
        size_t n = B.n, C = (size_t)p->C;
        B.x = rand_dev(n, 1.5f, 0.2f), B.b2 = rand_dev(n, 1.f, 0.f);
        B.w = rand_dev(C, 0.3f, 1.f), B.bias = rand_dev(C, 0.3f, 0.f);
        B.dout = rand_dev(n, 1.f, 0.f);
        B.dx0 = rand_dev(n, 1.f, 0.f), B.dw0 = rand_dev(C, 4.f, 0.f), B.db0 = rand_dev(C, 4.f, 0.f);
        CK(cudaMalloc((void **)&B.out, n * 2));
        CK(cudaMalloc((void **)&B.res, n * 2));
        CK(cudaMalloc((void **)&B.dx, n * 2));
        CK(cudaMalloc((void **)&B.dw, C * 2));
        CK(cudaMalloc((void **)&B.db, C * 2));
        CK(cudaMalloc((void **)&B.mean, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&B.rstd, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&B.mean0, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&B.rstd0, (size_t)p->N * 4));
        CK(cudaMalloc((void **)&B.scratch, dev_norm_scratch_bytes(p->N, p->C)));
        /* the backward's statistics: variant 0's forward of x */
        B.var = 0;
        run_op(&B, OP_FWD, s);
        CK(cudaMemcpyAsync(B.mean0, B.mean, (size_t)p->N * 4, cudaMemcpyDeviceToDevice, s));
        CK(cudaMemcpyAsync(B.rstd0, B.rstd, (size_t)p->N * 4, cudaMemcpyDeviceToDevice, s));
        CK(cudaStreamSynchronize(s));
        uint16_t *h_dx0 = bits(B.dx0, n), *h_dw0 = bits(B.dw0, C), *h_db0 = bits(B.db0, C);
        uint16_t *ref_out = NULL, *ref_rout = NULL, *ref_res = NULL;
        uint16_t *ref_g[3] = {NULL, NULL, NULL};
        float best_ms = 0, v0_ms = 0;
        int best = -1;
        for (int v = 0; v < NVAR; v++) {
            B.var = v;
            float t[OP_N];
            for (int o = 0; o < OP_N; o++) {
                if (o == OP_BWD) reset_grads(&B);
                for (int it = 0; it < warm + iters; it++) {
                    CK(cudaEventRecord(ea, s));
                    run_op(&B, (enum op)o, s);
                    CK(cudaEventRecord(eb, s));
                    CK(cudaEventSynchronize(eb));
                    if (it >= warm) CK(cudaEventElapsedTime(&ms[it - warm], ea, eb));
                }
                t[o] = bench_median(ms, iters);
            }
            /* checks: the forwards once more, then the backward twice from
             * the initial gradients */
            run_op(&B, OP_FWD, s);
            CK(cudaStreamSynchronize(s));
            uint16_t *o_f = bits(B.out, n);
            run_op(&B, OP_RES, s);
            CK(cudaStreamSynchronize(s));
            uint16_t *o_r = bits(B.out, n), *r_r = bits(B.res, n);
            uint16_t *g1[3], *g2[3];
            uint16_t *gd[3] = {B.dx, B.dw, B.db};
            size_t gn[3] = {n, C, C};
            const uint16_t *g0[3] = {h_dx0, h_dw0, h_db0};
            int ng = p->rms ? 2 : 3, same = 1;
            for (int rep = 0; rep < 2; rep++) {
                reset_grads(&B);
                run_op(&B, OP_BWD, s);
                CK(cudaStreamSynchronize(s));
                for (int i = 0; i < ng; i++)
                    (rep ? g2 : g1)[i] = bits(gd[i], gn[i]);
            }
            for (int i = 0; i < ng; i++) {
                same &= memcmp(g1[i], g2[i], gn[i] * 2) == 0;
                free(g2[i]);
            }
            double rf = 0, rr = 0, rg[3] = {0, 0, 0};
            int res_same = 1;
            if (v == 0) {
                ref_out = o_f, ref_rout = o_r, ref_res = r_r;
                for (int i = 0; i < ng; i++)
                    ref_g[i] = g1[i];
            } else {
                rf = rel_diff(o_f, ref_out, NULL, n);
                rr = rel_diff(o_r, ref_rout, NULL, n);
                res_same = memcmp(r_r, ref_res, n * 2) == 0;
                for (int i = 0; i < ng; i++) {
                    rg[i] = rel_diff(g1[i], ref_g[i], g0[i], gn[i]);
                    free(g1[i]);
                }
                free(o_f), free(o_r), free(r_r);
            }
            int ok = same && res_same && rf < 1e-2 && rr < 1e-2 && rg[0] < 1e-2 && rg[1] < 1e-2 &&
                     rg[2] < 1e-2;
            /* variant 4 is variant 0's kernels with wider loads: same values */
            if (v == 4) ok &= rf == 0 && rr == 0 && rg[0] == 0 && rg[1] == 0 && rg[2] == 0;
            bad |= !ok;
            if (v == 0) v0_ms = t[OP_FWD] + t[OP_BWD];
            if (ok && (best < 0 || t[OP_FWD] + t[OP_BWD] < best_ms))
                best = v, best_ms = t[OP_FWD] + t[OP_BWD];
            double nc2 = (double)n * 2;
            double bytes[OP_N] = {2 * nc2, 4 * nc2, 4 * nc2};
            for (int o = 0; o < OP_N; o++)
                printf("RESULT {\"bench\":\"norm\",\"shape\":\"%s\",\"N\":%d,\"C\":%d,\"rms\":%d,"
                       "\"variant\":%d,\"op\":\"%s\",\"ms\":%.4f,\"GBps\":%.0f}\n",
                       p->name, p->N, p->C, p->rms, v, op_name[o], t[o],
                       bytes[o] / (t[o] * 1e-3) / 1e9);
            printf("RESULT {\"bench\":\"norm_check\",\"shape\":\"%s\",\"variant\":%d,"
                   "\"fwd_plus_bwd_ms\":%.4f,\"bwd_repeat_bits\":%s,\"res_bits_vs_v0\":%s,"
                   "\"rel_out_vs_v0\":%.2e,\"rel_resout_vs_v0\":%.2e,"
                   "\"rel_dx_vs_v0\":%.2e,\"rel_dw_vs_v0\":%.2e,\"rel_db_vs_v0\":%.2e,"
                   "\"ok\":%s}\n",
                   p->name, v, t[OP_FWD] + t[OP_BWD], same ? "true" : "false",
                   res_same ? "true" : "false", rf, rr, rg[0], rg[1], rg[2], ok ? "true" : "false");
            fflush(stdout);
        }
        printf("RESULT {\"bench\":\"norm_best\",\"shape\":\"%s\",\"variant\":%d,"
               "\"fwd_plus_bwd_ms\":%.4f,\"v0_fwd_plus_bwd_ms\":%.4f}\n",
               p->name, best, best_ms, v0_ms);
        free(ref_out), free(ref_rout), free(ref_res), free(h_dx0), free(h_dw0), free(h_db0);
        for (int i = 0; i < 3; i++)
            free(ref_g[i]);
        void *all[] = {B.x,  B.b2,  B.w,   B.bias, B.out,  B.res,  B.dout,  B.dx,    B.dw,
                       B.db, B.dx0, B.dw0, B.db0,  B.mean, B.rstd, B.mean0, B.rstd0, B.scratch};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            CK(cudaFree(all[i]));
    }
    free(ms);
    printf("%s\n", bad ? "FAIL" : "ok");
    return bad;
}
