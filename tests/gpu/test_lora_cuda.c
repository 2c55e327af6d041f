/* LoRA on the CUDA backend (worker/lora.c through the backend op table),
 * against the cpu fp32 backend on the same tiny Llama:
 *  - ops: dropout and axpy_2d on cuda give the cpu results rounded to bf16
 *    bit for bit (the same mask, worker/lora_mask.h);
 *  - first step: with B = 0 the LoRA loss equals full fine-tuning's on cuda
 *    bit for bit (the base runs the same kernels; each adapter adds an exact
 *    zero);
 *  - loss curve: 30 steps of rank-8 adapters on every target, dropout 0 and
 *    0.1, follow the cpu curve: every step within 5% relative, the mean
 *    within 2% (the bf16 tolerance gpu.train uses), and the loss falls;
 *  - lora_gemm (the fused path's strided GEMM, every transpose pair, alpha,
 *    beta 0 / 1, column ranges of wider rows) against a host fp64 product of
 *    the same bf16 operands;
 *  - the curve and step-1 checks run twice: the fused adapter path (one
 *    x.A GEMM per projection group, (xA).B accumulated by the GEMM) and the
 *    per-adapter path (the lora-fused row off, LOOM_LORA_FUSED=0); the two
 *    cuda curves agree within the bf16 tolerance;
 *  - NF4 (QLoRA): the cuda dequantization (8-a-thread and one-a-thread
 *    kernels, the nf4-vec row) equals the host nf4_dequantize rounded to
 *    bf16 bit for bit; a QLoRA run (train.quantize_base nf4: the block linear
 *    weights in NF4, dequantized a block at a time) follows the cpu QLoRA
 *    curve, its loss falls, and its params bytes are the NF4 storage + the
 *    one-block scratch + the other tensors in bf16, below the bf16 base's;
 *  - dropout in the x.A kernels (backend lora_drop_fwd / lora_drop_bwd, the
 *    lora-drop-fused row): H = alpha dropout(x) A^T, dA += dH^T dropout(x)
 *    and dx += mask o (dH A) / (1 - p) against a host fp64 reference with
 *    the mask of worker/lora_mask.h (r 8 / 16 / 64, in 64 / 1000 / 2048 /
 *    5632, x a column range of wider rows, a column slice's mask index, N not
 *    a multiple of the row block, several row chunks; the tensor-core kernels
 *    the backend uses and the CUDA-core ones); cells outside the
 *    outputs untouched; two runs give the same bytes; the dropout-0.1 curve
 *    with those kernels off (LOOM_LORA_DROP_FUSED=0, a masked copy of the
 *    input) also follows the cpu curve and the kernels' curve;
 *  - memory: the frozen base holds no gradient, master or moments: a LoRA
 *    engine's grads + optimizer bytes are the adapters' alone, and full
 *    fine-tuning holds n_params * (2 + 12) bytes more.
 * One PASS / FAIL line per check. Exits 77 ("no GPU") where no CUDA device
 * is found. */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_util.h"
#include "worker/cuda/k_lora.h"
#include "worker/lora_mask.h"
#include "worker/lora.h"
#include "worker/nf4.h"
#include "worker/safetensors.h"
#include "worker/train.h"
#include "worker/tuning.h"

#define STEPS    30
#define TOL_STEP 5e-2
#define TOL_MEAN 2e-2
#define B_SEQ    4
#define T_SEQ    64
#define VOCAB    61
#define RANK     8

static int fails;
static int unfused;   /* 1: the cuda backend without lora_gemm (lora-fused off) */
static int nf4_plain; /* 1: the one-weight-a-thread NF4 kernel (nf4-vec off) */
static int drop_off;  /* 1: without lora_drop_fwd / _bwd (lora-drop-fused off) */

static struct backend *cuda_backend(void) {
    struct worker_tuning t;
    if (worker_tuning_from_env(&t) != 0) return NULL;
    t.cuda.lora_fused = unfused ? 0 : t.cuda.lora_fused;
    t.cuda.nf4_vec = nf4_plain ? 0 : t.cuda.nf4_vec;
    t.cuda.lora_drop_fused = drop_off ? 0 : t.cuda.lora_drop_fused;
    struct backend *b = backend_cuda_new_tuned(0, &t.cuda);
    worker_tuning_free(&t);
    return b;
}

static void result(int ok, const char *what, const char *fmt, double a, double b) {
    printf("%s: %s (", ok ? "PASS" : "FAIL", what);
    printf(fmt, a, b);
    printf(")\n");
    fails += !ok;
}

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

static struct model_config config(void) {
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
    return c;
}

static const char *const targets[] = {"q", "k", "v", "o", "gate", "up", "down"};

struct run {
    struct engine *e;
    struct model *m;
    struct lora *l;
};

/* lora: 0 full fine-tuning, 1 adapters (frozen base) with dropout p, 2
 * adapters over an NF4 base (QLoRA). */
static int run_new(struct run *r, int cuda, int lora, double p) {
    struct model_config c = config();
    struct engine_place pl = {.rank = 0,
                              .world = 1,
                              .tp = 1,
                              .dp = 1,
                              .pp = 1,
                              .frozen = lora > 0,
                              .windows_later = lora == 2};
    memset(r, 0, sizeof *r);
    struct backend *be = cuda ? cuda_backend() : backend_cpu_new(0);
    if (!be) return -1;
    r->e = engine_new(&c, &pl, be);
    if (!r->e) return -1;
    char qerr[256];
    if (lora == 2 && nf4_attach(r->e, qerr, sizeof qerr) != 0) {
        printf("nf4_attach: %s\n", qerr);
        return -1;
    }
    r->m = model_new(r->e, B_SEQ, T_SEQ, 0);
    if (!r->m || model_init_params(r->m, 42) != 0) return -1;
    if (!lora) return 0;
    struct lora_opts lo = {
        .rank = RANK, .alpha = 16, .dropout = p, .targets = targets, .n_targets = 7, .seed = 3};
    const char *code = NULL;
    char err[256];
    r->l = lora_new(r->m, &lo, &code, err, sizeof err);
    if (!r->l) {
        printf("lora_new: %s %s\n", code ? code : "", err);
        return -1;
    }
    r->m->lora = r->l;
    return 0;
}

static void run_free(struct run *r) {
    if (r->m) r->m->lora = NULL;
    lora_free(r->l);
    model_free(r->m);
    engine_free(r->e);
}

static int steps(struct run *r, int n, double *out) {
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = n;
    o.grad_accum = 1;
    o.global_batch_tokens = (int64_t)B_SEQ * T_SEQ;
    o.optim = (struct optim_cfg){.lr = 3e-3,
                                 .min_lr = 3e-3,
                                 .steps = n,
                                 .schedule = OPTIM_CONSTANT,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.01,
                                 .grad_clip = 1.0};
    o.train.batch = src_batch;
    int32_t in[B_SEQ * T_SEQ], tg[B_SEQ * T_SEQ];
    char err[256];
    for (int i = 0; i < n; i++) {
        struct train_step_info info;
        if (train_step(r->m, &o, i, &info, in, tg, err, sizeof err) != 0) {
            printf("train_step failed: %s\n", err);
            return -1;
        }
        out[i] = info.loss;
    }
    return 0;
}

/* dropout and axpy_2d: cuda equals the cpu result rounded to bf16. */
static void test_ops(void) {
    enum { R = 37, C = 53, LD = 61 };
    size_t n = (size_t)R * LD;
    struct backend *cb = backend_cpu_new(1), *gb = backend_cuda_new(0);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *want = malloc(n * sizeof *want);
    uint16_t *hb = malloc(n * 2), *got = malloc(n * 2);
    void *dx = gb ? gb->alloc(gb->ctx, n * 2) : NULL, *dy = gb ? gb->alloc(gb->ctx, n * 2) : NULL;
    if (!cb || !gb || !x || !y || !want || !hb || !got || !dx || !dy) {
        result(0, "ops set-up", "%g %g", 0, 0);
        goto out;
    }
    for (size_t i = 0; i < n; i++) { /* bf16-exact values */
        x[i] = st_bf16_to_f32(st_f32_to_bf16((float)sin((double)i * 0.37) * 3.0f));
        y[i] = st_bf16_to_f32(st_f32_to_bf16((float)cos((double)i * 0.11)));
        hb[i] = st_f32_to_bf16(x[i]);
    }
    size_t bad = 0, dropped = 0;
    cb->dropout(cb->ctx, want, x, n, 0.25f, 0x1234abcdull);
    gb->upload(gb->ctx, dx, hb, n * 2);
    gb->dropout(gb->ctx, dy, dx, n, 0.25f, 0x1234abcdull);
    gb->download(gb->ctx, got, dy, n * 2);
    for (size_t i = 0; i < n; i++) {
        bad += got[i] != st_f32_to_bf16(want[i]);
        dropped += want[i] == 0.0f && x[i] != 0.0f;
    }
    result(bad == 0 && dropped > n / 8 && dropped < n * 3 / 8,
           "dropout p=0.25: cuda equals cpu rounded to bf16", "%g mismatches, %g dropped",
           (double)bad, (double)dropped);
    /* axpy_2d: columns [5, 5 + C) of a [R, LD] buffer += 0.5 * a [R, C] source */
    memcpy(want, y, n * sizeof *y);
    cb->axpy_2d(cb->ctx, want + 5, LD, x, C, R, C, 0.5f, 1);
    for (size_t i = 0; i < n; i++)
        hb[i] = st_f32_to_bf16(y[i]);
    gb->upload(gb->ctx, dy, hb, n * 2);
    for (size_t i = 0; i < n; i++)
        hb[i] = st_f32_to_bf16(x[i]);
    gb->upload(gb->ctx, dx, hb, n * 2);
    gb->axpy_2d(gb->ctx, (uint16_t *)dy + 5, LD, dx, C, R, C, 0.5f, 1);
    gb->download(gb->ctx, got, dy, n * 2);
    bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += got[i] != st_f32_to_bf16(want[i]);
    result(bad == 0, "axpy_2d (strided, beta 1): cuda equals cpu rounded to bf16", "%g of %g",
           (double)bad, (double)n);
out:
    if (gb) {
        gb->free(gb->ctx, dx);
        gb->free(gb->ctx, dy);
    }
    backend_free(cb);
    backend_free(gb);
    free(x);
    free(y);
    free(want);
    free(hb);
    free(got);
}

/* lora_gemm against a host fp64 reference of the same bf16 operands: C
 * [m][n] at column 3 of rows of ldc, operands at column offsets of wider
 * rows, every (ta, tb), beta 0 and 1. Tolerance: one bf16 rounding of the
 * result plus fp32 accumulation (2^-8 relative of the magnitude sum). */
static void test_gemm(void) {
    struct backend *gb = cuda_backend();
    struct worker_tuning t;
    int row_on = worker_tuning_from_env(&t) == 0 && t.cuda.lora_fused;
    worker_tuning_free(&t);
    if (!gb || !row_on || !gb->lora_gemm) { /* LOOM_LORA_FUSED=0 takes the member away */
        result(gb && !row_on == !gb->lora_gemm,
               "lora_gemm on the cuda backend as the lora-fused row says (row, member)", "%g, %g",
               row_on, gb && gb->lora_gemm ? 1 : 0);
        backend_free(gb);
        return;
    }
    enum { M = 40, N = 24, K = 72, PAD = 8 }; /* 16-byte aligned rows, as the model's */
    /* the cuBLASLt handle and workspace come with reserve (any small shape) */
    struct backend_limits lim = {1, 64, 128, 4, 2, 32, 256, 64, 0, 0};
    if (gb->reserve(gb->ctx, &lim) != 0) {
        result(0, "cuda backend reserve for lora_gemm", "%g %g", 0, 0);
        backend_free(gb);
        return;
    }
    size_t na = (size_t)(K + PAD) * (M + PAD) + PAD, nc = (size_t)M * (N + 2 * PAD);
    float *ha = malloc(na * 4), *hb = malloc(na * 4), *hc = malloc(nc * 4);
    uint16_t *ba = malloc(na * 2), *bb = malloc(na * 2), *bc = malloc(nc * 2);
    void *da = gb->alloc(gb->ctx, na * 2), *db = gb->alloc(gb->ctx, na * 2),
         *dc = gb->alloc(gb->ctx, nc * 2);
    for (size_t i = 0; i < na; i++) {
        ha[i] = st_bf16_to_f32(st_f32_to_bf16((float)sin((double)i * 0.731) * 2.0f));
        hb[i] = st_bf16_to_f32(st_f32_to_bf16((float)cos((double)i * 0.293)));
        ba[i] = st_f32_to_bf16(ha[i]);
        bb[i] = st_f32_to_bf16(hb[i]);
    }
    gb->upload(gb->ctx, da, ba, na * 2);
    gb->upload(gb->ctx, db, bb, na * 2);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) {
                /* op(A)[i][p] = A[i][p] (row stride lda) or A[p][i]; both offset PAD */
                int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + 2 * PAD;
                float alpha = 0.625f;
                for (size_t i = 0; i < nc; i++) {
                    hc[i] = st_bf16_to_f32(st_f32_to_bf16((float)(i % 7) - 3.0f));
                    bc[i] = st_f32_to_bf16(hc[i]);
                }
                gb->upload(gb->ctx, dc, bc, nc * 2);
                gb->lora_gemm(gb->ctx, ta, tb, M, N, K, alpha, (uint16_t *)da + PAD, lda,
                              (uint16_t *)db + PAD, ldb, (float)beta, (uint16_t *)dc + PAD, ldc);
                gb->download(gb->ctx, bc, dc, nc * 2);
                double worst = 0;
                size_t outside = 0;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < ldc; j++) {
                        double got = st_bf16_to_f32(bc[(size_t)i * ldc + j]);
                        double old = hc[(size_t)i * ldc + j];
                        if (j < PAD || j >= PAD + N) { /* outside C: untouched */
                            outside += got != old;
                            continue;
                        }
                        double acc = 0, mag = 0;
                        for (int p = 0; p < K; p++) {
                            double x =
                                ta ? ha[PAD + (size_t)p * lda + i] : ha[PAD + (size_t)i * lda + p];
                            size_t c = (size_t)(j - PAD); /* op(B)[p][c]: B[p][c] or B[c][p] */
                            double y = tb ? hb[PAD + c * ldb + p] : hb[PAD + (size_t)p * ldb + c];
                            acc += x * y;
                            mag += fabs(x * y);
                        }
                        double want = alpha * acc + (beta ? old : 0);
                        double tol = (alpha * mag + fabs(old)) * (1.0 / 128) + 1e-6;
                        double d = fabs(got - want) / tol;
                        worst = d > worst ? d : worst;
                    }
                char what[128];
                snprintf(what, sizeof what,
                         "lora_gemm ta=%d tb=%d beta=%d vs host (worst error / tolerance, cells "
                         "outside C changed)",
                         ta, tb, beta);
                result(worst <= 1.0 && outside == 0, what, "%.3g, %g", worst, (double)outside);
            }
    gb->free(gb->ctx, da);
    gb->free(gb->ctx, db);
    gb->free(gb->ctx, dc);
    backend_free(gb);
    free(ha), free(hb), free(hc), free(ba), free(bb), free(bc);
}

static double curve_fused[2][STEPS]; /* the cuda curves of the fused path, dropout 0 / 0.1 */
static double curve_drop[STEPS];     /* the fused path's dropout-0.1 curve, dropout kernels on */

/* One shape of the dropout kernels' check. x is columns xoff .. xoff + in of
 * rows of ldx; the mask index n * mld + moff + c. */
struct drop_case {
    int N, in, r, ldx, xoff, ldh;
    size_t mld, moff;
    float p;
};

static const struct drop_case drop_cases[] = {
    {37, 64, 8, 72, 0, 8, 64, 0, 0.1f},
    {100, 2048, 16, 3 * 2048, 2048, 48, 2048, 0, 0.1f},
    {300, 5632, 64, 5632 + 64, 8, 64, 5632, 0, 0.25f},
    {77, 1000, 16, 1000, 0, 16, 3000, 1000, 0.5f},
    {1030, 2048, 16, 2048, 0, 16, 2048, 0, 0.1f},
};

/* Run the forward and backward of one case on the device; H, dA, dx (host
 * bf16) hold the outputs' initial contents and receive the results. cores:
 * 0 the backend's members (the tensor-core kernels), 1 the CUDA-core kernels
 * of k_lora.cu called directly on the backend's stream. */
static int drop_run(struct backend *gb, const struct drop_case *k, const uint16_t *x,
                    const uint16_t *A, const uint16_t *dH, uint16_t *H, uint16_t *dA, uint16_t *dx,
                    uint64_t seed, float alpha, int cores) {
    size_t nx = (size_t)k->N * k->ldx, na = (size_t)k->r * k->in, nh = (size_t)k->N * k->ldh;
    size_t ndx = (size_t)k->N * k->ldx, ws = gb->lora_drop_ws(gb->ctx, k->N, k->in, k->r);
    void *dxp = gb->alloc(gb->ctx, nx * 2), *dap = gb->alloc(gb->ctx, na * 2),
         *dhp = gb->alloc(gb->ctx, nh * 2), *hp = gb->alloc(gb->ctx, nh * 2),
         *gap = gb->alloc(gb->ctx, na * 2), *gxp = gb->alloc(gb->ctx, ndx * 2),
         *wsp = gb->alloc(gb->ctx, ws ? ws : 4);
    int ok = dxp && dap && dhp && hp && gap && gxp && wsp;
    if (ok) {
        gb->upload(gb->ctx, dxp, x, nx * 2);
        gb->upload(gb->ctx, dap, A, na * 2);
        gb->upload(gb->ctx, dhp, dH, nh * 2);
        gb->upload(gb->ctx, hp, H, nh * 2);
        gb->upload(gb->ctx, gap, dA, na * 2);
        gb->upload(gb->ctx, gxp, dx, ndx * 2);
        const uint16_t *xs = (const uint16_t *)dxp + k->xoff;
        /* dx: the same layout as x (a column range of wider rows) */
        uint16_t *gx = (uint16_t *)gxp + k->xoff;
        lcuda_stream st = (lcuda_stream)backend_cuda_stream(gb);
        if (cores) {
            lk_lora_drop_fwd(hp, k->ldh, xs, k->ldx, dap, k->N, k->in, k->r, alpha, k->p, seed,
                             k->mld, k->moff, wsp, 0, st);
            lk_lora_drop_bwd(gap, gx, k->ldx, dhp, k->ldh, xs, k->ldx, dap, k->N, k->in, k->r, k->p,
                             seed, k->mld, k->moff, wsp, 0, st);
        } else {
            gb->lora_drop_fwd(gb->ctx, hp, k->ldh, xs, k->ldx, dap, k->N, k->in, k->r, alpha, k->p,
                              seed, k->mld, k->moff, wsp);
            gb->lora_drop_bwd(gb->ctx, gap, gx, k->ldx, dhp, k->ldh, xs, k->ldx, dap, k->N, k->in,
                              k->r, k->p, seed, k->mld, k->moff, wsp);
        }
        gb->download(gb->ctx, H, hp, nh * 2);
        gb->download(gb->ctx, dA, gap, na * 2);
        gb->download(gb->ctx, dx, gxp, ndx * 2);
    }
    void *bufs[] = {dxp, dap, dhp, hp, gap, gxp, wsp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) gb->free(gb->ctx, bufs[i]);
    return ok ? 0 : -1;
}

static void test_drop_kernels(void) {
    struct backend *gb = cuda_backend();
    if (!gb || !gb->lora_drop_fwd || !gb->lora_drop_bwd || !gb->lora_drop_ws) {
        result(0, "lora_drop_fwd / lora_drop_bwd / lora_drop_ws on the cuda backend", "%g, %g",
               gb != NULL, gb && gb->lora_drop_fwd);
        backend_free(gb);
        return;
    }
    for (size_t cv = 0; cv < 2 * sizeof drop_cases / sizeof *drop_cases; cv++) {
        size_t ci = cv / 2;
        int cores = (int)(cv % 2);
        const char *kind = cores ? "CUDA-core" : "tensor-core";
        const struct drop_case *k = &drop_cases[ci];
        int N = k->N, in = k->in, r = k->r;
        size_t nx = (size_t)N * k->ldx, na = (size_t)r * in, nh = (size_t)N * k->ldh;
        uint64_t seed = 0x5eed0000ull + ci * 7919;
        float alpha = 1.75f, kk = 1.0f / (1.0f - k->p);
        uint32_t thr = lora_drop_threshold(k->p);
        uint16_t *x = malloc(nx * 2), *A = malloc(na * 2), *dH = malloc(nh * 2),
                 *H0 = malloc(nh * 2), *dA0 = malloc(na * 2), *dx0 = malloc(nx * 2);
        uint16_t *H[2] = {malloc(nh * 2), malloc(nh * 2)},
                 *dA[2] = {malloc(na * 2), malloc(na * 2)},
                 *dx[2] = {malloc(nx * 2), malloc(nx * 2)};
        unsigned char *keep = malloc((size_t)N * in);
        int ok = x && A && dH && H0 && dA0 && dx0 && H[0] && H[1] && dA[0] && dA[1] && dx[0] &&
                 dx[1] && keep;
        for (size_t i = 0; ok && i < nx; i++) {
            x[i] = st_f32_to_bf16((float)sin((double)i * 0.0173 + 0.3) * 2.0f);
            dx0[i] = st_f32_to_bf16((float)cos((double)i * 0.031) * 0.5f);
        }
        for (size_t i = 0; ok && i < na; i++) {
            A[i] = st_f32_to_bf16((float)cos((double)i * 0.0571) * 0.1f);
            dA0[i] = st_f32_to_bf16((float)sin((double)i * 0.013) * 0.25f);
        }
        for (size_t i = 0; ok && i < nh; i++) {
            dH[i] = st_f32_to_bf16((float)sin((double)i * 0.291 + 1.0));
            H0[i] = st_f32_to_bf16((float)(i % 5) - 2.0f);
        }
        for (int run = 0; ok && run < 2; run++) {
            memcpy(H[run], H0, nh * 2);
            memcpy(dA[run], dA0, na * 2);
            memcpy(dx[run], dx0, nx * 2);
            ok = drop_run(gb, k, x, A, dH, H[run], dA[run], dx[run], seed, alpha, cores) == 0;
        }
        size_t kept = 0;
        for (int n = 0; ok && n < N; n++)
            for (int c = 0; c < in; c++) {
                keep[(size_t)n * in + c] =
                    (unsigned char)lora_keep(seed, (uint64_t)n * k->mld + k->moff + c, thr);
                kept += keep[(size_t)n * in + c];
            }
#define XV(n, c)   ((double)st_bf16_to_f32(x[(size_t)(n)*k->ldx + k->xoff + (c)]))
#define DROP(n, c) (keep[(size_t)(n)*in + (c)] ? XV(n, c) * kk : 0.0)
        double wf = 0, wa = 0, wx = 0;
        size_t outside = 0;
        for (int n = 0; ok && n < N; n++) /* forward */
            for (int j = 0; j < k->ldh; j++) {
                double got = st_bf16_to_f32(H[0][(size_t)n * k->ldh + j]);
                if (j >= r) {
                    outside += H[0][(size_t)n * k->ldh + j] != H0[(size_t)n * k->ldh + j];
                    continue;
                }
                double acc = 0, mag = 0;
                for (int c = 0; c < in; c++) {
                    double v = DROP(n, c) * st_bf16_to_f32(A[(size_t)j * in + c]);
                    acc += v;
                    mag += fabs(v);
                }
                double d = fabs(got - alpha * acc) / (alpha * mag / 128 + 1e-6);
                wf = d > wf ? d : wf;
            }
        for (int j = 0; ok && j < r; j++) /* dA */
            for (int c = 0; c < in; c++) {
                double old = st_bf16_to_f32(dA0[(size_t)j * in + c]), acc = 0, mag = 0;
                for (int n = 0; n < N; n++) {
                    double v = st_bf16_to_f32(dH[(size_t)n * k->ldh + j]) * DROP(n, c);
                    acc += v;
                    mag += fabs(v);
                }
                double got = st_bf16_to_f32(dA[0][(size_t)j * in + c]);
                double d = fabs(got - (old + acc)) / ((mag + fabs(old)) / 128 + 1e-6);
                wa = d > wa ? d : wa;
            }
        for (int n = 0; ok && n < N; n++) /* dx */
            for (int c = 0; c < k->ldx; c++) {
                size_t at = (size_t)n * k->ldx + c;
                int cc = c - k->xoff;
                if (cc < 0 || cc >= in) {
                    outside += dx[0][at] != dx0[at];
                    continue;
                }
                double old = st_bf16_to_f32(dx0[at]), acc = 0, mag = 0;
                for (int j = 0; j < r; j++) {
                    double v = (double)st_bf16_to_f32(dH[(size_t)n * k->ldh + j]) *
                               st_bf16_to_f32(A[(size_t)j * in + cc]);
                    acc += v;
                    mag += fabs(v);
                }
                double want = old + (keep[(size_t)n * in + cc] ? kk * acc : 0);
                double tol = (kk * mag + fabs(old)) / 128 + 1e-6;
                double d = fabs(st_bf16_to_f32(dx[0][at]) - want) / tol;
                wx = d > wx ? d : wx;
            }
#undef XV
#undef DROP
        double frac = ok ? (double)kept / ((double)N * in) : 0;
        int same = ok && !memcmp(H[0], H[1], nh * 2) && !memcmp(dA[0], dA[1], na * 2) &&
                   !memcmp(dx[0], dx[1], nx * 2);
        char what[200];
        snprintf(what, sizeof what,
                 "%s dropout kernels N=%d in=%d r=%d ldx=%d mask at n*%zu+%zu p=%.2f: forward vs "
                 "host fp64 (worst error / tolerance, kept fraction)",
                 kind, N, in, r, k->ldx, k->mld, k->moff, (double)k->p);
        result(ok && wf <= 1.0 && fabs(frac - (1.0 - k->p)) < 0.05, what, "%.3g, %.3f", wf, frac);
        snprintf(what, sizeof what,
                 "%s dropout kernels N=%d in=%d r=%d: dA and dx vs host fp64 (worst error / "
                 "tolerance)",
                 kind, N, in, r);
        result(ok && wa <= 1.0 && wx <= 1.0, what, "%.3g, %.3g", wa, wx);
        snprintf(what, sizeof what,
                 "%s dropout kernels N=%d in=%d r=%d: cells outside the outputs untouched, two "
                 "runs give the same bytes (changed cells, same)",
                 kind, N, in, r);
        result(ok && outside == 0 && same, what, "%g, %g", (double)outside, same);
        free(x), free(A), free(dH), free(H0), free(dA0), free(dx0), free(keep);
        for (int i = 0; i < 2; i++)
            free(H[i]), free(dA[i]), free(dx[i]);
    }
    backend_free(gb);
}

static void test_curve(double p) {
    double lc[STEPS], lg[STEPS];
    struct run rc = {0}, rg = {0};
    char what[128];
    int ok = run_new(&rc, 0, 1, p) == 0 && steps(&rc, STEPS, lc) == 0 &&
             run_new(&rg, 1, 1, p) == 0 && steps(&rg, STEPS, lg) == 0;
    double worst = 0, mean = 0;
    for (int i = 0; ok && i < STEPS; i++) {
        double d = fabs(lg[i] - lc[i]) / fabs(lc[i]);
        worst = d > worst ? d : worst;
        mean += d / STEPS;
    }
    if (ok)
        printf("%s path%s, dropout %.2f: cpu %.5f -> %.5f, cuda %.5f -> %.5f\n",
               unfused ? "per-adapter" : "fused", drop_off ? " (dropout kernels off)" : "", p,
               lc[0], lc[STEPS - 1], lg[0], lg[STEPS - 1]);
    const char *path =
        unfused ? (drop_off ? "per-adapter path, dropout kernels off" : "per-adapter path")
                : (drop_off ? "fused path, dropout kernels off" : "fused path");
    if (ok && p > 0 && !unfused && !drop_off) memcpy(curve_drop, lg, sizeof lg);
    if (ok && p > 0 && drop_off) { /* a masked copy, then cuBLASLt: the kernels' curve */
        double w3 = 0;
        for (int i = 0; i < STEPS; i++) {
            double d = fabs(lg[i] - curve_drop[i]) / fabs(lg[i]);
            w3 = d > w3 ? d : w3;
        }
        snprintf(what, sizeof what,
                 "LoRA curve cuda, %s vs the dropout kernels' (fused path), dropout %.2f (worst "
                 "relative)",
                 path, p);
        result(w3 <= TOL_STEP, what, "%.3g, %g", w3, TOL_STEP);
    }
    if (ok && !unfused) memcpy(curve_fused[p > 0], lg, sizeof lg);
    if (ok && unfused) { /* the two cuda paths: the same curve within bf16 */
        double w2 = 0;
        for (int i = 0; i < STEPS; i++) {
            double d = fabs(lg[i] - curve_fused[p > 0][i]) / fabs(lg[i]);
            w2 = d > w2 ? d : w2;
        }
        snprintf(what, sizeof what,
                 "LoRA curve cuda fused vs per-adapter path, dropout %.2f (worst relative)", p);
        result(w2 <= TOL_STEP, what, "%.3g, %g", w2, TOL_STEP);
    }
    snprintf(what, sizeof what, "LoRA curve cuda vs cpu, %s, dropout %.2f (worst, mean relative)",
             path, p);
    result(ok && worst <= TOL_STEP && mean <= TOL_MEAN, what, "%.3g, %.3g", worst, mean);
    snprintf(what, sizeof what, "LoRA loss falls on cuda, %s, dropout %.2f (first, last)", path, p);
    result(ok && lg[STEPS - 1] < lg[0] - 0.1, what, "%.5f, %.5f", ok ? lg[0] : 0,
           ok ? lg[STEPS - 1] : 0);
    if (p == 0 && ok) { /* memory of the same layout with full fine-tuning */
        struct run rf = {0};
        double lf[1];
        int okf = run_new(&rf, 1, 0, 0) == 0 && steps(&rf, 1, lf) == 0;
        snprintf(what, sizeof what,
                 "step-1 LoRA loss equals full fine-tuning's on cuda bit for bit, %s (LoRA, full)",
                 path);
        result(okf && lf[0] == lg[0], what, "%.9f, %.9f", lg[0], okf ? lf[0] : 0);
        const struct engine_mem *ml = &rg.e->mem, *mf = &rf.e->mem;
        size_t np = rg.e->n_params, na = lora_numel(rg.l);
        /* adapters: values + gradients 2 bytes, master and moments 12, padded
         * to 64 elements a tensor; the 16-byte norm scalar and a 4-byte one */
        size_t pad = (size_t)lora_count(rg.l) * 2 * 64;
        size_t gl = ml->grads, ol = ml->optimizer;
        printf("memory (bytes): LoRA params %zu grads %zu optimizer %zu; full params %zu grads %zu "
               "optimizer %zu; %zu base parameters, %zu adapter parameters\n",
               ml->params, gl, ol, mf->params, mf->grads, mf->optimizer, np, na);
        result(okf && gl >= 2 * na && gl <= 2 * (na + pad),
               "LoRA grads are the adapters' only (bytes, 2 x adapter parameters)", "%g, %g",
               (double)gl, (double)(2 * na));
        result(okf && ol >= 12 * na + 16 && ol <= 12 * (na + pad) + 64,
               "LoRA optimizer is the adapters' fp32 master + AdamW only (bytes, 12 x adapters)",
               "%g, %g", (double)ol, (double)(12 * na));
        double saved = okf ? (double)(mf->grads + mf->optimizer) - (double)(gl + ol) : 0;
        result(okf && saved >= 14.0 * (double)np - 14.0 * (double)(na + pad),
               "memory saved vs full fine-tuning (bytes, >= 14 x base parameters - adapters)",
               "%g, %g", saved, 14.0 * (double)np);
        run_free(&rf);
    }
    run_free(&rc);
    run_free(&rg);
}

/* cuda NF4 dequantization == host nf4_dequantize rounded to bf16. */
static void test_nf4_kernel(void) {
    static const size_t sizes[] = {64 * 256 * 2 + 64 * 7, 64 * 300 + 13};
    for (int plain = 0; plain < 2; plain++)
        for (size_t si = 0; si < 2; si++) {
            size_t n = sizes[si], nb = nf4_bytes(n);
            nf4_plain = plain;
            struct backend *gb = cuda_backend();
            nf4_plain = 0;
            float *w = malloc(n * 4), *d = malloc(n * 4);
            uint8_t *q = malloc(nb);
            uint16_t *got = malloc(n * 2);
            void *dq = gb ? gb->alloc(gb->ctx, nb) : NULL,
                 *dout = gb ? gb->alloc(gb->ctx, n * 2) : NULL;
            size_t bad = 0;
            int ok = gb && gb->nf4_dequant && w && d && q && got && dq && dout;
            if (ok) {
                for (size_t i = 0; i < n; i++)
                    w[i] = (float)(sin((double)i * 0.173) * 0.05 * (1.0 + (double)(i % 97) / 50));
                nf4_quantize(w, n, q);
                nf4_dequantize(q, n, d);
                gb->upload(gb->ctx, dq, q, nb);
                gb->nf4_dequant(gb->ctx, dout, dq, n);
                gb->download(gb->ctx, got, dout, n * 2);
                for (size_t i = 0; i < n; i++)
                    bad += got[i] != st_f32_to_bf16(d[i]);
            }
            char what[160];
            snprintf(what, sizeof what,
                     "NF4 dequantization on cuda (%s kernel, n=%zu) equals the host's rounded to "
                     "bf16 (mismatches, n)",
                     plain ? "one-a-thread" : "8-a-thread", n);
            result(ok && bad == 0, what, "%g, %g", (double)bad, (double)n);
            if (gb) {
                gb->free(gb->ctx, dq);
                gb->free(gb->ctx, dout);
            }
            backend_free(gb);
            free(w), free(d), free(q), free(got);
        }
}

/* QLoRA: the cuda curve over the NF4 base against the cpu one, and its
 * params memory. */
static void test_qlora(void) {
    double lc[STEPS], lg[STEPS], lb[1];
    struct run rc = {0}, rg = {0}, rb = {0};
    int ok = run_new(&rc, 0, 2, 0) == 0 && steps(&rc, STEPS, lc) == 0 &&
             run_new(&rg, 1, 2, 0) == 0 && steps(&rg, STEPS, lg) == 0 &&
             run_new(&rb, 1, 1, 0) == 0 && steps(&rb, 1, lb) == 0;
    double worst = 0;
    for (int i = 0; ok && i < STEPS; i++) {
        double d = fabs(lg[i] - lc[i]) / fabs(lc[i]);
        worst = d > worst ? d : worst;
    }
    if (ok)
        printf("qlora: cpu %.5f -> %.5f, cuda %.5f -> %.5f (bf16 base step 1: %.5f)\n", lc[0],
               lc[STEPS - 1], lg[0], lg[STEPS - 1], lb[0]);
    result(ok && worst <= TOL_STEP, "QLoRA curve cuda vs cpu over the NF4 base (worst relative)",
           "%.3g, %g", worst, TOL_STEP);
    result(ok && lg[STEPS - 1] < lg[0] - 0.1, "QLoRA loss falls on cuda (first, last)",
           "%.5f, %.5f", ok ? lg[0] : 0, ok ? lg[STEPS - 1] : 0);
    if (ok) {
        /* NF4 storage of each block linear weight, the one-block scratch and
         * the other tensors in bf16 (+ the empty window's one element), the
         * adapters' values */
        const struct model_layout *lay = &rg.e->layout;
        double want = 2, blk = 0, other = 0;
        for (int i = 0; i < lay->n; i++) {
            const struct model_tensor *t = &lay->t[i];
            if (t->kind == MODEL_T_LINEAR_W && t->layer >= 0) {
                want += (double)nf4_bytes((size_t)t->numel);
                if (t->layer == 0) blk += (double)t->numel;
            } else {
                other += (double)t->numel;
            }
        }
        double adapters = (double)rb.e->mem.params - 2.0 * (double)rb.e->n_params;
        want += 2 * blk + 2 * other + adapters;
        result((double)rg.e->mem.params == want && rg.e->mem.params < rb.e->mem.params,
               "QLoRA params bytes: NF4 + scratch + bf16 rest + adapters, below the bf16 base's "
               "(QLoRA, bf16 LoRA)",
               "%g, %g", (double)rg.e->mem.params, (double)rb.e->mem.params);
    }
    run_free(&rc);
    run_free(&rg);
    run_free(&rb);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Timings (no pass / fail: the numbers docs/perf.md quotes come from the
 * bench): the dropout kernels on the 1B shape's adapter inputs ([8192,
 * 2048] and [8192, 8192], rank 16), tensor-core and CUDA-core, beside the
 * elementwise dropout pass of the copy path over the same input. */
static void time_drop_kernels(void) {
    struct backend *gb = cuda_backend();
    static const int ins[] = {2048, 8192};
    enum { N = 8192, R = 16, REP = 10 };
    for (size_t ii = 0; gb && gb->lora_drop_fwd && ii < 2; ii++) {
        int in = ins[ii];
        size_t nx = (size_t)N * in, ws = gb->lora_drop_ws(gb->ctx, N, in, R);
        void *x = gb->alloc(gb->ctx, nx * 2), *dx = gb->alloc(gb->ctx, nx * 2),
             *y = gb->alloc(gb->ctx, nx * 2), *A = gb->alloc(gb->ctx, (size_t)R * in * 2),
             *dA = gb->alloc(gb->ctx, (size_t)R * in * 2),
             *H = gb->alloc(gb->ctx, (size_t)N * R * 2), *w = gb->alloc(gb->ctx, ws);
        if (!x || !dx || !y || !A || !dA || !H || !w) break;
        gb->zero(gb->ctx, x, nx * 2), gb->zero(gb->ctx, dx, nx * 2);
        gb->zero(gb->ctx, A, (size_t)R * in * 2), gb->zero(gb->ctx, dA, (size_t)R * in * 2);
        gb->zero(gb->ctx, H, (size_t)N * R * 2);
        lcuda_stream st = (lcuda_stream)backend_cuda_stream(gb);
        double t[5];
        for (int v = 0; v < 5; v++) {
            for (int rep = 0; rep <= REP; rep++) {
                if (rep == 1) { /* the first call warms up */
                    gb->sync(gb->ctx);
                    t[v] = now_ms();
                }
                if (v == 0)
                    lk_lora_drop_fwd(H, R, x, in, A, N, in, R, 1.0f, 0.1f, 7, in, 0, w, 1, st);
                if (v == 1)
                    lk_lora_drop_bwd(dA, dx, in, H, R, x, in, A, N, in, R, 0.1f, 7, in, 0, w, 1,
                                     st);
                if (v == 2)
                    lk_lora_drop_fwd(H, R, x, in, A, N, in, R, 1.0f, 0.1f, 7, in, 0, w, 0, st);
                if (v == 3)
                    lk_lora_drop_bwd(dA, dx, in, H, R, x, in, A, N, in, R, 0.1f, 7, in, 0, w, 0,
                                     st);
                if (v == 4) gb->dropout(gb->ctx, y, x, nx, 0.1f, 7);
            }
            gb->sync(gb->ctx);
            t[v] = (now_ms() - t[v]) / REP;
        }
        printf("TIME dropout kernels [%d, %d] r=%d (ms a call): tensor-core fwd %.4f bwd %.4f, "
               "CUDA-core fwd %.4f bwd %.4f; the copy path's dropout pass %.4f\n",
               N, in, R, t[0], t[1], t[2], t[3], t[4]);
        void *bufs[] = {x, dx, y, A, dA, H, w};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            gb->free(gb->ctx, bufs[i]);
    }
    backend_free(gb);
}

int main(void) {
    int rc = lcuda_probe();
    if (rc) return rc;
    test_ops();
    test_gemm();
    test_curve(0.0);
    test_curve(0.1);
    unfused = 1;
    test_curve(0.0);
    test_curve(0.1);
    unfused = 0;
    test_drop_kernels();
    time_drop_kernels();
    drop_off = 1; /* dropout 0.1 with a masked copy of the input, both paths */
    test_curve(0.1);
    unfused = 1;
    test_curve(0.1);
    unfused = 0;
    drop_off = 0;
    test_nf4_kernel();
    test_qlora();
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
