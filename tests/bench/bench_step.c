/* loom-gpu-bench: training-step throughput of the engine on the CUDA
 * backend, for comparison with the PyTorch peer gpt2_torch_bench.py (see docs/perf.md).
 *
 * Runs the engine's own model and train_step (the code loom-worker runs)
 * on uniform random tokens, as the peer does, after `warmup` steps; reports
 * the median step time, tokens/s, MFU with the peer's formula
 * (6 * (N - wpe) + 12 * L * C * T FLOPs per token against 989 TFLOP/s), peak
 * device memory, and a breakdown of GPU time per operation class measured
 * with CUDA events around every backend call over `profile` extra steps.
 * Output: human lines on stderr, one "RESULT {json}" line on stdout.
 * Usage: loom-gpu-bench [--model 124m] [--family gpt2] [--mbs 16] [--T 1024]
 *        [--steps 30] [--warmup 8] [--profile 3] [--ncu-step K]
 * --ncu-step K: step K (from 0) alone between cudaProfilerStart / Stop, for
 * `ncu --profile-from-start off` (tests/gpu/device/profile_llama.sh). */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_util.h"
#include "worker/train.h"

enum cat { C_MATMUL, C_ATTN, C_CLS, C_NORM, C_ELEM, C_OPTIM, C_MEM, C_N };
static const char *cat_name[C_N] = {"matmul",      "attention", "classifier", "norm",
                                    "elementwise", "optimizer", "memcpy/zero"};

#define MAX_EV 8192
/* Profiling state: the bench wraps the backend's function pointers, and the
 * wrappers only receive the backend's ctx, so this one context is global. */
static struct prof {
    struct backend orig;
    const struct backend *be;
    cudaStream_t s;
    cudaEvent_t ev[MAX_EV];
    int cat[MAX_EV / 2];
    int n;
    int on;
    double ms[C_N];
    double span; /* first event to last of each profiled step, summed */
} P;

static void pbeg(void) {
    if (P.on && P.n + 2 <= MAX_EV) cudaEventRecord(P.ev[P.n], P.s);
}
static void pend(int c) {
    if (P.on && P.n + 2 <= MAX_EV) {
        cudaEventRecord(P.ev[P.n + 1], P.s);
        P.cat[P.n / 2] = c;
        P.n += 2;
    }
}
static void pcollect(void) {
    cudaStreamSynchronize(P.s);
    if (P.n >= 2) {
        float sp = 0;
        cudaEventElapsedTime(&sp, P.ev[0], P.ev[P.n - 1]);
        P.span += sp;
    }
    for (int i = 0; i < P.n; i += 2) {
        float ms = 0;
        cudaEventElapsedTime(&ms, P.ev[i], P.ev[i + 1]);
        P.ms[P.cat[i / 2]] += ms;
    }
    P.n = 0;
}

/* The CUDA backend holds a matmul_fwd back one call (to fuse a following
 * gelu_fwd) and batches AdamW ranges; issue held work before each timed
 * call so it is charged to its own class. */
static void pre(void) {
    if (!P.on) return;
    if (backend_cuda_held(P.be, 1)) {
        pbeg();
        backend_cuda_issue_held(P.be, 1);
        pend(C_MATMUL);
    }
    if (backend_cuda_held(P.be, 2)) {
        pbeg();
        backend_cuda_issue_held(P.be, 2);
        pend(C_OPTIM);
    }
    if (backend_cuda_held(P.be, 3)) {
        pbeg();
        backend_cuda_issue_held(P.be, 3);
        pend(C_MATMUL);
    }
}

#define W0(name, c, params, args)                                                                  \
    static void w_##name params {                                                                  \
        pre();                                                                                     \
        pbeg();                                                                                    \
        P.orig.name args;                                                                          \
        pend(c);                                                                                   \
    }
W0(matmul_fwd, C_MATMUL,
   (void *x, void *o, const void *i, const void *w, const void *b, int N, int IC, int OC),
   (x, o, i, w, b, N, IC, OC))
W0(matmul_bwd, C_MATMUL,
   (void *x, void *di, void *dw, void *db, const void *d, const void *i, const void *w, int N,
    int IC, int OC),
   (x, di, dw, db, d, i, w, N, IC, OC))
W0(attention_fwd, C_ATTN,
   (void *x, void *o, float *l, const void *q, int B, int T, int H, int K, int D),
   (x, o, l, q, B, T, H, K, D))
W0(attention_bwd, C_ATTN,
   (void *x, void *dq, const void *d, const void *q, const void *o, const float *l, int B, int T,
    int H, int K, int D),
   (x, dq, d, q, o, l, B, T, H, K, D))
W0(classifier, C_CLS,
   (void *x, float *l, void *di, void *dw, const void *i, const void *w, const int32_t *t, int N,
    int C, int V, int Vp, float g),
   (x, l, di, dw, i, w, t, N, C, V, Vp, g))
W0(layernorm_fwd, C_NORM,
   (void *x, void *o, float *m, float *r, const void *i, const void *w, const void *b, int N, int C,
    float e),
   (x, o, m, r, i, w, b, N, C, e))
W0(rmsnorm_fwd, C_NORM,
   (void *x, void *o, float *r, const void *i, const void *w, int N, int C, float e),
   (x, o, r, i, w, N, C, e))
W0(rmsnorm_bwd, C_NORM,
   (void *x, void *di, void *dw, const void *d, const void *i, const void *w, const float *r, int N,
    int C),
   (x, di, dw, d, i, w, r, N, C))
W0(swiglu_fwd, C_ELEM, (void *x, void *o, const void *i, int N, int F), (x, o, i, N, F))
W0(swiglu_bwd, C_ELEM, (void *x, void *di, const void *i, const void *d, int N, int F),
   (x, di, i, d, N, F))
W0(rope_fwd, C_ELEM, (void *x, void *p, int N, int T, int s, int h, int D, float th),
   (x, p, N, T, s, h, D, th))
W0(rope_bwd, C_ELEM, (void *x, void *p, int N, int T, int s, int h, int D, float th),
   (x, p, N, T, s, h, D, th))
W0(layernorm_bwd, C_NORM,
   (void *x, void *di, void *dw, void *db, const void *d, const void *i, const void *w,
    const float *m, const float *r, int N, int C),
   (x, di, dw, db, d, i, w, m, r, N, C))
/* gelu_fwd right after a held matmul_fwd runs as its epilogue: charged to
 * matmul (the class then reads "matmul incl. fused GELU"). */
static void w_gelu_fwd(void *x, void *o, const void *i, size_t n) {
    int fused = backend_cuda_held(P.be, 1);
    if (!fused) pre();
    pbeg();
    P.orig.gelu_fwd(x, o, i, n);
    pend(fused ? C_MATMUL : C_ELEM);
}
/* gelu_bwd of a held matmul_bwd's output runs as its DGELU epilogue: charged
 * to matmul. zero() leaves that GEMM held (the backend records the range). */
static void w_gelu_bwd(void *x, void *di, const void *i, const void *d, size_t n) {
    int fused = backend_cuda_held(P.be, 3);
    if (!fused) pre();
    pbeg();
    P.orig.gelu_bwd(x, di, i, d, n);
    pend(fused ? C_MATMUL : C_ELEM);
}
W0(residual_fwd, C_ELEM, (void *x, void *o, const void *a, const void *b, size_t n),
   (x, o, a, b, n))
W0(accumulate, C_ELEM, (void *x, void *d, const void *s, size_t n), (x, d, s, n))
W0(embedding_fwd, C_ELEM,
   (void *x, void *o, const int32_t *t, const void *a, const void *b, int B, int T, int C),
   (x, o, t, a, b, B, T, C))
W0(embedding_bwd, C_ELEM,
   (void *x, void *a, void *b, const void *d, const int32_t *t, int B, int T, int C),
   (x, a, b, d, t, B, T, C))
W0(adamw, C_OPTIM, (void *x, const struct backend_adamw *a), (x, a))
W0(sumsq, C_OPTIM, (void *x, float *a, const void *g, size_t n), (x, a, g, n))
W0(scale, C_OPTIM, (void *x, void *p, size_t n, float s), (x, p, n, s))
static void w_zero(void *x, void *p, size_t n) {
    int held = backend_cuda_held(P.be, 3);
    if (held) { /* keep the matmul_bwd held for a following gelu_bwd */
        P.orig.zero(x, p, n);
        return;
    }
    pre();
    pbeg();
    P.orig.zero(x, p, n);
    pend(C_MEM);
}
W0(copy, C_MEM, (void *x, void *d, const void *s, size_t n), (x, d, s, n))
W0(upload, C_MEM, (void *x, void *d, const void *s, size_t n), (x, d, s, n))
W0(download, C_MEM, (void *x, void *d, const void *s, size_t n), (x, d, s, n))

W0(matmul_residual_fwd, C_MATMUL,
   (void *x, void *o, const void *i, const void *w, const void *b, const void *r, int N, int IC,
    int OC),
   (x, o, i, w, b, r, N, IC, OC))

static void prof_install(struct backend *b) {
    P.orig = *b;
    P.be = b;
    P.s = (cudaStream_t)backend_cuda_stream(b);
    for (int i = 0; i < MAX_EV; i++)
        CUDA_CHECK(cudaEventCreate(&P.ev[i]));
#define SETW(name) b->name = w_##name
    SETW(matmul_fwd), SETW(matmul_bwd), SETW(attention_fwd), SETW(attention_bwd);
    SETW(classifier), SETW(layernorm_fwd), SETW(layernorm_bwd), SETW(gelu_fwd), SETW(gelu_bwd);
    SETW(residual_fwd), SETW(accumulate), SETW(embedding_fwd), SETW(embedding_bwd), SETW(adamw);
    SETW(sumsq), SETW(scale), SETW(zero), SETW(copy), SETW(upload), SETW(download);
    if (b->matmul_residual_fwd) SETW(matmul_residual_fwd);
    /* the Llama family's operations (before: untimed, and a matmul held
     * before them was charged to nothing) */
    SETW(rmsnorm_fwd), SETW(rmsnorm_bwd), SETW(swiglu_fwd), SETW(swiglu_bwd);
    SETW(rope_fwd), SETW(rope_bwd);
#undef SETW
}

struct rnd {
    uint64_t s;
    int B, T, V;
};
static int rnd_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    struct rnd *r = user;
    for (int b = 0; b < r->B; b++) {
        int32_t prev = 0;
        for (int t = 0; t <= r->T; t++) {
            r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
            int32_t tok = (int32_t)(r->s % (uint64_t)r->V);
            if (t > 0) {
                in[b * r->T + t - 1] = prev;
                tg[b * r->T + t - 1] = tok;
            }
            prev = tok;
        }
    }
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *preset = "124m", *family = "gpt2";
    int mbs = 16, T = 1024, nsteps = 30, warmup = 8, nprof = 3, ncu_step = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            preset = argv[i + 1];
        else if (!strcmp(argv[i], "--family"))
            family = argv[i + 1];
        else if (!strcmp(argv[i], "--mbs"))
            mbs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--T"))
            T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            nsteps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--profile"))
            nprof = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ncu-step"))
            ncu_step = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    int rc = lcuda_probe();
    if (rc) return rc;
    int fam = model_family_parse(family);
    const struct model_preset *mp = fam < 0 ? NULL : model_preset_find(fam, preset);
    if (!mp) {
        fprintf(stderr, "unknown model %s %s\n", family, preset);
        return 2;
    }
    struct model_config cfg = mp->config;
    if (T > cfg.seq_len) cfg.seq_len = T;
    struct engine_place pl = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct engine *e = engine_new(&cfg, &pl, backend_cuda_new(0));
    if (!e) return 1;
    struct model *m = model_new(e, mbs, T, 0);
    if (!m || model_init_params(m, 42)) return 1;
    struct rnd src = {.s = 1234, .B = mbs, .T = T, .V = cfg.vocab_size};
    int64_t total = warmup + nsteps + nprof;
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = total;
    o.grad_accum = 1;
    o.global_batch_tokens = (int64_t)mbs * T;
    o.optim = (struct optim_cfg){.lr = 3e-4,
                                 .min_lr = 3e-5,
                                 .warmup = 2,
                                 .steps = total,
                                 .schedule = OPTIM_COSINE,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 1.0};
    o.train.batch = rnd_batch;
    o.train.user = &src;
    int32_t *in = malloc(sizeof(int32_t) * mbs * T), *tg = malloc(sizeof(int32_t) * mbs * T);
    double *ms = malloc(sizeof(double) * (nsteps > 0 ? nsteps : 1));
    char err[256];
    struct train_step_info info = {0};
    for (int64_t i = 0; i < warmup + nsteps; i++) {
        e->be->sync(e->be->ctx);
        if (i == ncu_step) cudaProfilerStart();
        double t0 = clock_mono_msf();
        if (train_step(m, &o, i, &info, in, tg, err, sizeof err)) {
            fprintf(stderr, "train_step: %s\n", err);
            return 1;
        }
        e->be->sync(e->be->ctx);
        if (i == ncu_step) cudaProfilerStop();
        if (i >= warmup) ms[i - warmup] = clock_mono_msf() - t0;
        if (i < 3 || i == warmup + nsteps - 1)
            fprintf(stderr, "step %lld loss %.4f grad_norm %.3f\n", (long long)i, info.loss,
                    info.grad_norm);
    }
    qsort(ms, nsteps, sizeof *ms, cmp_d);
    double med = ms[nsteps / 2];
    /* the peer's FLOP count: 6 * (params - wpe) + 12 * L * C * T */
    int64_t nparam = model_n_params(&cfg);
    int64_t nwpe = cfg.pos == MODEL_POS_LEARNED ? (int64_t)cfg.seq_len * cfg.d_model : 0;
    double fpt = 6.0 * (double)(nparam - nwpe) + 12.0 * cfg.n_layer * cfg.d_model * (double)T;
    double tok = (double)mbs * T;
    double tflops = tok * fpt / (med / 1e3) / 1e12;
    struct cuda_mem_report mr;
    backend_cuda_mem(e->be, &mr);
    size_t fr = 0, totm = 0;
    cudaMemGetInfo(&fr, &totm);

    if (nprof > 0) {
        prof_install(e->be);
        for (int i = 0; i < nprof; i++) {
            P.on = 1;
            if (train_step(m, &o, warmup + nsteps + i, &info, in, tg, err, sizeof err)) return 1;
            P.on = 0;
            pcollect();
        }
        double sum = 0;
        for (int c = 0; c < C_N; c++)
            sum += P.ms[c] / nprof;
        fprintf(stderr,
                "GPU time per step by class (%d profiled steps, events around each call):\n",
                nprof);
        for (int c = 0; c < C_N; c++)
            fprintf(stderr, "  %-12s %8.2f ms  %5.1f%%\n", cat_name[c], P.ms[c] / nprof,
                    100 * P.ms[c] / nprof / med);
        fprintf(stderr, "  %-12s %8.2f ms of %.2f ms step (rest: launch gaps, host sync)\n", "sum",
                sum, med);
        fprintf(stderr,
                "  %-12s %8.2f ms from the first timed call to the last: %.2f ms between calls "
                "(idle device or untimed work)\n",
                "span", P.span / nprof, (P.span - sum * nprof) / nprof);
    }
    printf("RESULT {\"impl\":\"loom-cuda\",\"model\":\"%s\",\"params\":%lld,\"mbs\":%d,\"T\":%d,"
           "\"step_ms_median\":%.2f,\"step_ms_min\":%.2f,\"tokens_per_s\":%.0f,"
           "\"tflops_per_gpu\":%.1f,\"mfu_vs_989\":%.3f,\"max_mem_gib\":%.2f,"
           "\"engine_gib\":%.2f,\"workspace_gib\":%.2f,\"loss\":%.3f",
           preset, (long long)nparam, mbs, T, med, ms[0], tok / (med / 1e3), tflops, tflops / 989.0,
           (double)(totm - fr) / 1073741824.0, mr.engine_peak / 1073741824.0,
           mr.workspace_bytes / 1073741824.0, info.loss);
    if (nprof > 0) {
        printf(",\"breakdown_ms\":{");
        for (int c = 0; c < C_N; c++)
            printf("%s\"%s\":%.2f", c ? "," : "", cat_name[c], P.ms[c] / nprof);
        printf(",\"span\":%.2f}", P.span / nprof);
    }
    printf("}\n");
    free(in), free(tg), free(ms);
    model_free(m);
    engine_free(e);
    return 0;
}
