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
 *  - memory: the frozen base holds no gradient, master or moments: a LoRA
 *    engine's grads + optimizer bytes are the adapters' alone, and full
 *    fine-tuning holds n_params * (2 + 12) bytes more.
 * One PASS / FAIL line per check. Exits 77 ("no GPU") where no CUDA device
 * is found. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_util.h"
#include "worker/lora.h"
#include "worker/safetensors.h"
#include "worker/train.h"

#define STEPS    30
#define TOL_STEP 5e-2
#define TOL_MEAN 2e-2
#define B_SEQ    4
#define T_SEQ    64
#define VOCAB    61
#define RANK     8

static int fails;

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

/* lora: 0 full fine-tuning, 1 adapters (frozen base) with dropout p. */
static int run_new(struct run *r, int cuda, int lora, double p) {
    struct model_config c = config();
    struct engine_place pl = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .frozen = lora};
    memset(r, 0, sizeof *r);
    struct backend *be = cuda ? backend_cuda_new(0) : backend_cpu_new(0);
    if (!be) return -1;
    r->e = engine_new(&c, &pl, be);
    if (!r->e) return -1;
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
        printf("dropout %.2f: cpu %.5f -> %.5f, cuda %.5f -> %.5f\n", p, lc[0], lc[STEPS - 1],
               lg[0], lg[STEPS - 1]);
    snprintf(what, sizeof what, "LoRA curve cuda vs cpu, dropout %.2f (worst, mean relative)", p);
    result(ok && worst <= TOL_STEP && mean <= TOL_MEAN, what, "%.3g, %.3g", worst, mean);
    snprintf(what, sizeof what, "LoRA loss falls on cuda, dropout %.2f (first, last)", p);
    result(ok && lg[STEPS - 1] < lg[0] - 0.1, what, "%.5f, %.5f", ok ? lg[0] : 0,
           ok ? lg[STEPS - 1] : 0);
    if (p == 0 && ok) { /* memory of the same layout with full fine-tuning */
        struct run rf = {0};
        double lf[1];
        int okf = run_new(&rf, 1, 0, 0) == 0 && steps(&rf, 1, lf) == 0;
        result(okf && lf[0] == lg[0],
               "step-1 LoRA loss equals full fine-tuning's on cuda bit for bit (LoRA, full)",
               "%.9f, %.9f", lg[0], okf ? lf[0] : 0);
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

int main(void) {
    int rc = lcuda_probe();
    if (rc) return rc;
    test_ops();
    test_curve(0.0);
    test_curve(0.1);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
