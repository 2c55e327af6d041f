/* LoRA adapters (worker/lora.c) on the CPU backend, tiny GPT-2 and Llama models:
 * - adapter gradients (dA, dB) against central finite differences of the loss;
 * - with B = 0 the loss equals the base model's;
 * - the base weights get no gradient (the gradient buffer stays zero);
 * - with dropout (PEFT: on the adapter input) the gradients are those of the
 *   loss under the same masks (finite differences of training forwards), and
 *   an eval forward drops nothing;
 * - train.precision fp8 at worker start (lora_precision_check): refused
 *   with quantize_base nf4, off cuda, and for a full fine-tune with ZeRO-3
 *   or the optimizer offloaded, each message naming the values; taken for
 *   LoRA and full fine-tuning on cuda. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "worker/lora.h"
#include "worker/model.h"
#include "tests/check.h"

struct fcase {
    const char *name;
    enum model_family family;
    const char *const *targets;
    int n_targets;
    int recompute;
    double dropout;
};

static const char *const llama_all[] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const llama_some[] = {"k", "up"};
static const char *const gpt2_all[] = {"attn", "proj", "fc", "fc2"};

static const struct fcase cases[] = {
    {"llama all targets", MODEL_LLAMA, llama_all, 7, MODEL_RECOMPUTE_NONE, 0},
    {"llama k+up, full recompute", MODEL_LLAMA, llama_some, 2, MODEL_RECOMPUTE_FULL, 0},
    {"gpt2 all targets", MODEL_GPT2, gpt2_all, 4, MODEL_RECOMPUTE_SELECTIVE, 0},
    {"llama all targets, dropout 0.3", MODEL_LLAMA, llama_all, 7, MODEL_RECOMPUTE_NONE, 0.3},
    {"llama k+up, dropout 0.5, full recompute", MODEL_LLAMA, llama_some, 2, MODEL_RECOMPUTE_FULL,
     0.5},
};

/* A forward whose loss is evaluated with the training dropout masks (a
 * gradient scale too small to matter turns training on). */
#define TRAIN_GS 1e-30f

static struct model_config config(enum model_family f) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, f);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = f == MODEL_LLAMA ? 2 : 4;
    c.d_model = 16;
    c.d_ff = f == MODEL_LLAMA ? 24 : 64;
    c.vocab_size = 37;
    c.seq_len = 8;
    model_config_finalize(&c);
    return c;
}

static uint64_t rng_state = 0x1234567ull;
static double urand(void) { /* splitmix64 in [0, 1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

/* Mean loss over the batch (every target counts). */
static double loss(struct model *m, const int32_t *in, const int32_t *tg, float gs) {
    int64_t cnt = 0;
    double s = model_forward(m, in, tg, gs, &cnt);
    return cnt ? s / (double)cnt : 0;
}

static void run_case(const struct fcase *fc) {
    struct model_config c = config(fc->family);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    struct model_opts mo = {.B = 2, .T = c.seq_len, .threads = 1, .recompute = fc->recompute};
    struct model *m = e ? model_new_ex(e, &mo) : NULL;
    CHECK(m && model_init_params(m, 11) == 0, "%s: model", fc->name);
    if (!m) {
        engine_free(e);
        return;
    }
    int N = m->B * m->T;
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 7 + 3) % c.vocab_size);
        tg[i] = (int32_t)((i * 5 + 1) % c.vocab_size);
    }
    double base = loss(m, in, tg, 0.0f);
    struct lora_opts lo = {.rank = 3,
                           .alpha = 6,
                           .dropout = fc->dropout,
                           .targets = fc->targets,
                           .n_targets = fc->n_targets,
                           .seed = 9};
    const char *code = NULL;
    char err[256];
    struct lora *l = lora_new(m, &lo, &code, err, sizeof err);
    CHECK(l, "%s: lora_new: %s", fc->name, l ? "" : err);
    if (!l) goto out;
    CHECK(lora_count(l) == fc->n_targets * c.n_layer, "%s: %d adapters", fc->name, lora_count(l));
    m->lora = l;
    double zero_b = loss(m, in, tg, 0.0f);
    CHECK(fabs(zero_b - base) <= 1e-6 * fabs(base), "%s: B = 0 loss %.9g vs base %.9g", fc->name,
          zero_b, base);
    /* random B so that dA is not zero */
    for (int i = 0; i < lora_count(l); i++) {
        struct lora_view v;
        lora_view(l, i, &v);
        for (int k = 0; k < v.out * 3; k++)
            v.B[k] = (float)(0.4 * (urand() - 0.5));
    }
    float fgs = fc->dropout > 0 ? TRAIN_GS : 0.0f; /* the loss the gradients are of */
    if (fc->dropout > 0) {
        double ev = loss(m, in, tg, 0.0f), ev2 = loss(m, in, tg, 0.0f), tr = loss(m, in, tg, fgs);
        CHECK(ev == ev2 && fabs(tr - ev) > 1e-6 * fabs(ev),
              "%s: eval forwards drop nothing (%.9g, %.9g), a training forward does (%.9g)",
              fc->name, ev, ev2, tr);
    }
    engine_zero_grads(e);
    lora_zero_grads(l);
    loss(m, in, tg, 1.0f / (float)N);
    model_backward(m, NULL, NULL);
    const float *g = engine_grads_at(e, 0);
    size_t nz = 0;
    for (size_t k = 0; k < e->n_params; k++)
        nz += g[k] != 0.0f;
    CHECK(nz == 0, "%s: %zu base gradient values non-zero", fc->name, nz);
    /* central differences on a few entries of every A and B */
    const double h = 1e-2;
    int checked = 0;
    double gmax = 0;
    for (int i = 0; i < lora_count(l); i++) {
        struct lora_view v;
        lora_view(l, i, &v);
        for (int which = 0; which < 2; which++) {
            float *w = which ? v.B : v.A;
            const float *dw = which ? v.dB : v.dA;
            size_t n = which ? (size_t)v.out * 3 : (size_t)3 * v.in;
            for (int s = 0; s < 3; s++) {
                size_t k = (size_t)(urand() * (double)n);
                float w0 = w[k];
                w[k] = (float)(w0 + h);
                double lp = loss(m, in, tg, fgs);
                w[k] = (float)(w0 - h);
                double lm = loss(m, in, tg, fgs);
                w[k] = w0;
                double fd = (lp - lm) / (2 * h), an = dw[k];
                if (fabs(an) > gmax) gmax = fabs(an);
                CHECK(fabs(fd - an) <= 2e-5 + 3e-2 * fabs(fd),
                      "%s: %s %s[%zu]: analytic %.6g vs finite difference %.6g", fc->name, v.base,
                      which ? "B" : "A", k, an, fd);
                checked++;
            }
        }
    }
    CHECK(gmax > 2e-4, "%s: largest adapter gradient checked %.3g (too small to test)", fc->name,
          gmax);
    printf("%s: %d entries checked, largest |grad| %.3g\n", fc->name, checked, gmax);
out:
    if (m) m->lora = NULL;
    lora_free(l);
    free(in);
    free(tg);
    model_free(m);
    engine_free(e);
}

/* lora_precision_check over parsed specs: NULL want means taken */
#define PSPEC(train)                                                                               \
    "{\"model\":{\"family\":\"llama\",\"preset\":\"1b\"},\"data\":{\"train\":\"/d/t_*.bin\"},"     \
    "\"train\":{" train "}}"
#define PSPECP(par, train)                                                                         \
    "{\"model\":{\"family\":\"llama\",\"preset\":\"1b\"},\"data\":{\"train\":\"/d/t_*.bin\"},"     \
    "\"parallel\":{" par "},\"train\":{" train "}}"
static const struct {
    const char *name, *spec, *device, *want;
} pcases[] = {
    {"fp8 with nf4", PSPEC("\"precision\":\"fp8\",\"lora\":{\"rank\":4},\"quantize_base\":\"nf4\""),
     "cuda", "precision=fp8, quantize_base=nf4"},
    {"fp8 lora on cpu (--device)", PSPEC("\"precision\":\"fp8\",\"lora\":{\"rank\":4}"), "cpu",
     "device=cpu"},
    {"fp8 full fine-tune on cpu (--device)", PSPEC("\"precision\":\"fp8\""), "cpu", "device=cpu"},
    {"fp8 full fine-tune, zero_stage 3", PSPECP("\"zero_stage\":3", "\"precision\":\"fp8\""),
     "cuda", "zero_stage=3"},
    {"fp8 lora on cuda", PSPEC("\"precision\":\"fp8\",\"lora\":{\"rank\":4}"), "cuda", NULL},
    {"fp8 lora, zero_stage 2",
     PSPECP("\"zero_stage\":2", "\"precision\":\"fp8\",\"lora\":{\"rank\":4}"), "cuda", NULL},
    {"fp8 full fine-tune on cuda", PSPEC("\"precision\":\"fp8\""), "cuda", NULL},
    {"bf16 on cpu (not fp8)", PSPEC("\"precision\":\"bf16\""), "cpu", NULL},
};

static void precision_checks(void) {
    for (size_t i = 0; i < sizeof pcases / sizeof *pcases; i++) {
        struct loom_spec s;
        struct loom_error le;
        memset(&le, 0, sizeof le);
        int prc = jobspec_parse_text(&s, pcases[i].spec, strlen(pcases[i].spec), 0, &le);
        CHECK(prc == 0, "%s: spec parses: %s", pcases[i].name, le.message);
        if (prc != 0) continue;
        char err[512] = "";
        int rc = lora_precision_check(&s, pcases[i].device, err, sizeof err);
        if (pcases[i].want)
            CHECK(rc == -1 && strstr(err, pcases[i].want), "%s: refused naming '%s': %d %s",
                  pcases[i].name, pcases[i].want, rc, err);
        else
            CHECK(rc == 0, "%s: taken: %d %s", pcases[i].name, rc, err);
    }
}

int main(void) {
    precision_checks();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run_case(&cases[i]);
    /* refusals: dropout 1, ZeRO-3 */
    struct model_config c = config(MODEL_LLAMA);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    struct model *m = e ? model_new(e, 1, c.seq_len, 1) : NULL;
    const char *code = NULL;
    char err[256] = "";
    struct lora_opts lo = {
        .rank = 2, .alpha = 4, .dropout = 1, .targets = llama_all, .n_targets = 7};
    CHECK(m && !lora_new(m, &lo, &code, err, sizeof err) && code &&
              strcmp(code, "LORA_UNSUPPORTED") == 0 && strstr(err, "dropout=1"),
          "dropout 1 refused: %s %s", code ? code : "-", err);
    lo.dropout = 0;
    lo.zero_stage = 3;
    code = NULL;
    CHECK(m && !lora_new(m, &lo, &code, err, sizeof err) && code &&
              strcmp(code, "LORA_UNSUPPORTED") == 0 && strstr(err, "zero_stage 3"),
          "zero_stage 3 refused: %s %s", code ? code : "-", err);
    model_free(m);
    engine_free(e);
    return check_summary("test_lora_grad");
}
