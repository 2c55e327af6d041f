/* loom-gpu-bench: training-step throughput of the engine on the CUDA
 * backend, for comparison with the PyTorch peer gpt2_torch_bench.py (see docs/perf.md).
 *
 * Runs the engine's own model and train_step (the code loom-worker runs)
 * on uniform random tokens, as the peer does, after `warmup` steps; reports
 * the median step time, tokens/s, MFU with the peer's formula
 * (6 * (N - wpe) + 12 * L * C * T FLOPs per token against 989 TFLOP/s), peak
 * device memory, and a breakdown of GPU time per operation class measured
 * with CUDA events around every backend call over `profile` extra steps.
 * With --lora R the base is frozen (engine_place.frozen) and rank-R adapters
 * (alpha 32, dropout --lora-dropout P, default 0) sit on every projection, as
 * llama_torch_bench.py --lora does; the FLOP count is then the peer's LoRA
 * one: 4 * N' + 12 * L * C * T, N' the parameters less an untied input
 * embedding (no weight gradients of the base: its forward and dX only; the
 * adapters' own FLOPs are not counted). mem_gib is the peak of the engine's
 * allocations plus the backend workspaces (what
 * torch.cuda.max_memory_allocated counts for the peer); max_mem_gib the
 * device's used memory (with the CUDA context).
 * Output: human lines on stderr, one "RESULT {json}" line on stdout.
 * Usage: loom-gpu-bench [--model 124m] [--family gpt2] [--mbs 16] [--T 1024]
 *        [--steps 30] [--warmup 8] [--profile 3] [--lora R] [--lora-dropout P] [--accum 1]
 *        [--recompute none|selective|full] [--keep K] [--quantize-base nf4]
 *        [--offload off|on|sync|delayed] [--offload-threads N]
 *        [--offload-pin register|alloc|off] [--precision bf16|fp8]
 *        [--data random|learnable]
 * --keep K (with --recompute full): the budget mode's mix, the first K blocks
 * kept as selective keeps them (worker/model.h model_opts.keep; the K a budget
 * gives is in `loomctl plan`'s notes).
 * --quantize-base nf4 (with --lora): QLoRA, the block linear weights in NF4
 * (worker/nf4.h), dequantized a block at a time into a bf16 scratch.
 * With --offload (worker/offload.h) the RESULT line adds the step's split:
 * optimizer wall ms on the engine thread, the CPU AdamW's ms, the exposed
 * copy and CPU waits, and the start-up (host state ready, process to first
 * step).
 * --precision fp8: the block linear layers' GEMMs in E4M3 (model_fp8_freeze;
 * docs/engine.md "FP8"): with --lora the frozen base's forward and input
 * gradient (E4M3 copies made once), without it also the weight gradient
 * (each weight quantized at each use); LOOM_FP8=0 keeps them bf16 (the fp8
 * tuning row). The
 * RESULT line adds the weights with copies and the GEMMs that ran in E4M3.
 * --data learnable: sequences the model can learn (strided walks over 4096
 * tokens) instead of uniform random ones, each step's loss on stderr ("loss
 * step K L") and the RESULT line's loss_last50 the mean of the last 50 timed
 * steps: for loss curves (tests/gpu/device/bench_fp8.sh, fp8 against bf16).
 * --ncu-step K: step K (from 0) alone between cudaProfilerStart / Stop, for
 * `ncu --profile-from-start off` (tests/gpu/device/profile_llama.sh). */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "worker/offload.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_util.h"
#include "worker/lora.h"
#include "worker/nf4.h"
#include "worker/train.h"
#include "worker/tuning.h"

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

W0(axpy_2d, C_ELEM,
   (void *x, void *d, int ldd, const void *sr, int lds, int rows, int cols, float al, int be),
   (x, d, ldd, sr, lds, rows, cols, al, be))
W0(dropout, C_ELEM, (void *x, void *o, const void *i, size_t n, float p, uint64_t s),
   (x, o, i, n, p, s))
W0(lora_gemm, C_MATMUL,
   (void *x, int ta, int tb, int m, int n, int k, float al, const void *A, int lda, const void *B,
    int ldb, float be, void *C, int ldc),
   (x, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc))
/* dropout inside the adapter's x.A kernels: charged to matmul, as the
 * lora_gemm they replace */
W0(lora_drop_fwd, C_MATMUL,
   (void *x, void *H, int ldh, const void *in, int ldx, const void *A, int N, int IC, int r,
    float al, float p, uint64_t s, size_t mld, size_t moff, void *ws),
   (x, H, ldh, in, ldx, A, N, IC, r, al, p, s, mld, moff, ws))
W0(lora_drop_bwd, C_MATMUL,
   (void *x, void *dA, void *dx, int lddx, const void *dH, int ldh, const void *in, int ldx,
    const void *A, int N, int IC, int r, float p, uint64_t s, size_t mld, size_t moff, void *ws),
   (x, dA, dx, lddx, dH, ldh, in, ldx, A, N, IC, r, p, s, mld, moff, ws))
/* NF4 dequantization of a block's weights (QLoRA): charged to elementwise */
W0(nf4_dequant, C_ELEM, (void *x, void *o, const void *q, size_t n), (x, o, q, n))

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
    if (b->axpy_2d) SETW(axpy_2d);
    if (b->dropout) SETW(dropout);
    if (b->lora_gemm) SETW(lora_gemm);
    if (b->lora_drop_fwd) SETW(lora_drop_fwd);
    if (b->lora_drop_bwd) SETW(lora_drop_bwd);
    if (b->nf4_dequant) SETW(nf4_dequant);
    /* the Llama family's operations (before: untimed, and a matmul held
     * before them was charged to nothing) */
    SETW(rmsnorm_fwd), SETW(rmsnorm_bwd), SETW(swiglu_fwd), SETW(swiglu_bwd);
    SETW(rope_fwd), SETW(rope_bwd);
#undef SETW
}

struct rnd {
    uint64_t s;
    int B, T, V;
    int learnable; /* --data learnable */
};
static uint64_t rnd_next(struct rnd *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
/* --data learnable: each sequence walks 4096 tokens with its own stride (1-7), one position in
 * eight a random jump: a loss that falls steadily, for comparing curves (fp8 against bf16) */
static void learn_batch(struct rnd *r, int32_t *in, int32_t *tg) {
    for (int b = 0; b < r->B; b++) {
        int stride = 1 + (int)(rnd_next(r) % 7);
        int32_t cur = (int32_t)(rnd_next(r) % 4096);
        for (int t = 0; t < r->T; t++) {
            uint64_t u = rnd_next(r);
            int32_t next = u % 8 == 0 ? (int32_t)((u >> 8) % 4096) : (cur + stride) % 4096;
            in[b * r->T + t] = cur;
            tg[b * r->T + t] = next;
            cur = next;
        }
    }
}
static int rnd_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    struct rnd *r = user;
    if (r->learnable) {
        learn_batch(r, in, tg);
        return 0;
    }
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
    const char *recompute = "none", *quant = "none", *precision = "bf16", *data = "random";
    int mbs = 16, T = 1024, nsteps = 30, warmup = 8, nprof = 3, rank = 0, ncu_step = -1;
    int accum = 1, offload_threads = 0, keep = 0;
    double lora_dropout = 0; /* --lora-dropout: train.lora.dropout of the adapters */
    const char *offload = "off", *pin = "register";
    double t_start = clock_mono_msf();
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
        else if (!strcmp(argv[i], "--lora"))
            rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--lora-dropout"))
            lora_dropout = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--recompute"))
            recompute = argv[i + 1];
        else if (!strcmp(argv[i], "--keep"))
            keep = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--quantize-base"))
            quant = argv[i + 1];
        else if (!strcmp(argv[i], "--accum"))
            accum = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--offload"))
            offload = argv[i + 1];
        else if (!strcmp(argv[i], "--offload-pin"))
            pin = argv[i + 1];
        else if (!strcmp(argv[i], "--offload-threads"))
            offload_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--precision"))
            precision = argv[i + 1];
        else if (!strcmp(argv[i], "--data"))
            data = argv[i + 1];
        else if (!strcmp(argv[i], "--ncu-step"))
            ncu_step = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    static const char *const rc_names[] = {"none", "selective", "full"};
    int rcm = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(recompute, rc_names[i])) rcm = i;
    int nf4 = !strcmp(quant, "nf4");
    if (!nf4 && strcmp(quant, "none") != 0) {
        fprintf(stderr, "bad --quantize-base %s (none, nf4)\n", quant);
        return 2;
    }
    if (nf4 && rank < 1) {
        fprintf(stderr, "--quantize-base nf4 needs --lora R (the base is frozen)\n");
        return 2;
    }
    int fp8 = !strcmp(precision, "fp8"), learnable = !strcmp(data, "learnable");
    if (!learnable && strcmp(data, "random") != 0) {
        fprintf(stderr, "bad --data %s (random, learnable)\n", data);
        return 2;
    }
    if (!fp8 && strcmp(precision, "bf16") != 0) {
        fprintf(stderr, "bad --precision %s (bf16, fp8)\n", precision);
        return 2;
    }
    if (fp8 && nf4) {
        fprintf(stderr, "--precision fp8 runs without --quantize-base nf4 (the E4M3 path takes "
                        "weights in bf16)\n");
        return 2;
    }
    if (keep < 0 || (keep > 0 && rcm != 2)) {
        fprintf(stderr, "--keep %d needs --recompute full (the budget mode's mix)\n", keep);
        return 2;
    }
    if (rcm < 0 || rank < 0 || nsteps < 1) {
        fprintf(stderr, "bad --recompute %s (none, selective, full), --lora %d or --steps %d\n",
                recompute, rank, nsteps);
        return 2;
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
    int off = strcmp(offload, "off") != 0;
    struct engine_place pl = {.rank = 0,
                              .world = 1,
                              .tp = 1,
                              .dp = 1,
                              .pp = 1,
                              .frozen = rank > 0,
                              .windows_later = nf4,
                              .opt_later = off};
    struct engine *e = engine_new(&cfg, &pl, backend_cuda_new(0));
    if (!e) return 1;
    if (off) { /* as loom-worker: the offload, then the host state, then the weights */
        struct offload_opts oo = {.sync = !strcmp(offload, "sync"),
                                  .delayed = !strcmp(offload, "delayed"),
                                  .threads = offload_threads,
                                  .pin = !strcmp(pin, "alloc") ? OFFLOAD_PIN_ALLOC
                                         : !strcmp(pin, "off") ? OFFLOAD_PIN_OFF
                                                               : OFFLOAD_PIN_REGISTER};
        if (engine_offload_enable(e, &oo) != 0 || engine_opt_init(e) != 0) return 1;
    }
    double t_init = clock_mono_msf();
    if (nf4) { /* the quantizer's knobs from the environment (LOOM_NF4_FAST, ...) */
        struct worker_tuning wt;
        if (worker_tuning_from_env(&wt) != 0) return 2;
        nf4_configure(&(struct nf4_opts){
            .fast = wt.nf4.fast, .threads = wt.nf4.threads, .overlap = wt.nf4.overlap});
        worker_tuning_free(&wt);
        char qerr[256];
        if (nf4_attach(e, qerr, sizeof qerr) != 0) {
            fprintf(stderr, "nf4_attach: %s\n", qerr);
            return 1;
        }
    }
    /* fp8 LoRA: the activations after the freeze, as loom-worker does (the
     * bf16 base is gone first when held as E4M3 alone) */
    struct model_opts mo = {
        .B = mbs, .T = T, .recompute = rcm, .keep = keep, .acts_later = fp8 && rank > 0};
    struct model *m = model_new_ex(e, &mo);
    if (!m || model_init_params(m, 42)) return 1;
    double nf4_init_s = (clock_mono_msf() - t_init) / 1e3;
    if (nf4) {
        int nq;
        size_t nw, nb;
        nf4_stats(e->nf4, &nq, &nw, &nb);
        fprintf(stderr,
                "nf4: %d tensors, %zu weights, %.2f GiB (%.3f bytes a weight); init %.1f s, of "
                "which quantize + upload %.1f s (%d threads)\n",
                nq, nw, nb / 1073741824.0, (double)nb / (double)nw, nf4_init_s,
                nf4_put_seconds(e->nf4), nf4_threads());
    }
    struct lora *lo = NULL;
    if (rank > 0) { /* every projection, as the peer's --lora */
        static const char *const tg_llama[] = {"q", "k", "v", "o", "gate", "up", "down"};
        static const char *const tg_gpt2[] = {"attn", "proj", "fc", "fc2"};
        int gpt2 = cfg.family == MODEL_GPT2;
        struct lora_opts lopt = {.rank = rank,
                                 .alpha = 32,
                                 .dropout = lora_dropout,
                                 .targets = gpt2 ? tg_gpt2 : tg_llama,
                                 .n_targets = gpt2 ? 4 : 7,
                                 .seed = 42};
        const char *code = NULL;
        char lerr[512];
        lo = lora_new(m, &lopt, &code, lerr, sizeof lerr);
        if (!lo) {
            fprintf(stderr, "lora_new: %s: %s\n", code ? code : "?", lerr);
            return 1;
        }
        m->lora = lo;
        fprintf(stderr, "lora: %d adapters of rank %d, %zu parameters\n", lora_count(lo), rank,
                lora_numel(lo));
    }
    if (fp8) {
        int nq = 0;
        size_t nb = 0;
        struct worker_tuning wt; /* LOOM_FP8_BASE_BF16 (the fp8-base-bf16 row) */
        if (worker_tuning_from_env(&wt) != 0) return 2;
        int base_bf16 = wt.cuda.fp8_base_bf16;
        worker_tuning_free(&wt);
        if (model_fp8_freeze(m, base_bf16, &nq, &nb) != 0) return 1;
        fprintf(stderr, "fp8: %d block linear weights on the E4M3 path, %.2f GiB (%s)\n", nq,
                nb / 1073741824.0,
                e->fp8b ? "W alone, the bf16 base in host memory" : "W and W^T copies, if frozen");
    }
    if (model_alloc_acts(m) != 0) return 1;
    double t_ready = clock_mono_msf();
    struct offload_stats ost;
    offload_get_stats(e, &ost);
    double alloc_ms = ost.ms_alloc, pin_ms = ost.ms_pin;
    double *opt_ms = calloc((size_t)(nsteps > 0 ? nsteps : 1) * 4, sizeof(double));
    struct rnd src = {.s = 1234, .B = mbs, .T = T, .V = cfg.vocab_size, .learnable = learnable};
    double loss_last = 0; /* the mean loss of the last (up to) 50 timed steps */
    int n_last = 0;
    int64_t total = warmup + nsteps + nprof;
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = total;
    o.grad_accum = accum > 0 ? accum : 1;
    o.global_batch_tokens = (int64_t)mbs * T * o.grad_accum;
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
        if (i >= warmup) {
            ms[i - warmup] = clock_mono_msf() - t0;
            offload_get_stats(e, &ost);
            double *r = opt_ms + 4 * (i - warmup);
            r[0] = info.ms_optimizer, r[1] = ost.ms_cpu, r[2] = ost.ms_copy_wait;
            r[3] = ost.ms_cpu_wait;
        }
        if (learnable) fprintf(stderr, "loss step %lld %.6f\n", (long long)i, info.loss);
        if (i >= warmup + nsteps - 50 && i >= warmup) loss_last += info.loss, n_last++;
        if (i < 3 || i == warmup + nsteps - 1)
            fprintf(stderr, "step %lld loss %.4f grad_norm %.3f\n", (long long)i, info.loss,
                    info.grad_norm);
    }
    /* the offload split: per column, the median over the timed steps */
    double split[4] = {0};
    for (int c = 0; c < 4 && nsteps > 0; c++) {
        double *col = malloc(sizeof(double) * nsteps);
        for (int i = 0; i < nsteps; i++)
            col[i] = opt_ms[4 * i + c];
        qsort(col, nsteps, sizeof *col, cmp_d);
        split[c] = col[nsteps / 2];
        free(col);
    }
    free(opt_ms);
    qsort(ms, nsteps, sizeof *ms, cmp_d);
    double med = ms[nsteps / 2];
    /* the peer's FLOP count: 6 * (params - wpe) + 12 * L * C * T */
    int64_t nparam = model_n_params(&cfg);
    int64_t nwpe = cfg.pos == MODEL_POS_LEARNED ? (int64_t)cfg.seq_len * cfg.d_model : 0;
    double fpt = 6.0 * (double)(nparam - nwpe) + 12.0 * cfg.n_layer * cfg.d_model * (double)T;
    if (rank > 0) { /* the peer's LoRA count: forward and dX of the frozen base */
        int64_t nemb = cfg.tied_embeddings ? 0 : (int64_t)cfg.vocab_size * cfg.d_model;
        fpt = 4.0 * (double)(nparam - nwpe - nemb) + 12.0 * cfg.n_layer * cfg.d_model * (double)T;
    }
    double tok = (double)mbs * T * o.grad_accum;
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
           "\"engine_gib\":%.2f,\"workspace_gib\":%.2f,\"mem_gib\":%.2f,\"loss\":%.3f,"
           "\"lora\":%d,\"trainable\":%zu,\"recompute\":\"%s\",\"quantize_base\":\"%s\"",
           preset, (long long)nparam, mbs, T, med, ms[0], tok / (med / 1e3), tflops, tflops / 989.0,
           (double)(totm - fr) / 1073741824.0, mr.engine_peak / 1073741824.0,
           mr.workspace_bytes / 1073741824.0,
           (double)(mr.engine_peak + mr.workspace_bytes) / 1073741824.0, info.loss, rank,
           lo ? lora_numel(lo) : (size_t)nparam, recompute, quant);
    printf(",\"accum\":%d,\"offload\":\"%s\",\"pin\":\"%s\",\"data\":\"%s\",\"loss_last50\":%.5f"
           ",\"keep\":%d",
           o.grad_accum, offload, pin, data, n_last ? loss_last / n_last : 0.0, keep);
    struct cuda_fp8_stats f8s;
    if (backend_cuda_fp8_stats(e->be, &f8s) == 0)
        printf(",\"precision\":\"%s\",\"fp8_weights\":%d,\"fp8_gemms_fwd\":%ld,"
               "\"fp8_gemms_bwd\":%ld,\"fp8_gemms_wgrad\":%ld,\"fp8_fallback\":%ld",
               precision, f8s.weights, f8s.fwd, f8s.bwd, f8s.wgrad, f8s.fallback);
    if (nf4)
        printf(",\"nf4_init_s\":%.2f,\"nf4_put_s\":%.2f,\"nf4_threads\":%d", nf4_init_s,
               nf4_put_seconds(e->nf4), nf4_threads());
    if (off)
        printf(",\"optimizer_ms\":%.1f,\"compute_ms\":%.1f,\"cpu_adamw_ms\":%.1f,"
               "\"copy_wait_ms\":%.1f,\"cpu_wait_ms\":%.1f,\"host_state_s\":%.2f,"
               "\"pin_s\":%.2f,\"startup_s\":%.2f",
               split[0], med - split[0], split[1], split[2], split[3], alloc_ms / 1e3, pin_ms / 1e3,
               (t_ready - t_start) / 1e3);
    if (nprof > 0) {
        printf(",\"breakdown_ms\":{");
        for (int c = 0; c < C_N; c++)
            printf("%s\"%s\":%.2f", c ? "," : "", cat_name[c], P.ms[c] / nprof);
        printf(",\"span\":%.2f}", P.span / nprof);
    }
    printf("}\n");
    free(in), free(tg), free(ms);
    if (m) m->lora = NULL;
    lora_free(lo);
    model_free(m);
    engine_free(e);
    return 0;
}
