/* Optimizer tests: the LR schedule and clipping against hand-computed values,
 * the CPU AdamW primitive against a hand-computed three-step trajectory
 * (values worked out independently in Python, double precision), and
 * optim_step's weight-decay runs (decay only on 2-D linear weights) over a
 * real engine layout. Tolerances: schedule 1e-12 relative (pure double math);
 * AdamW 1e-6 relative (fp32 arithmetic; 3e-5 for v, as 1 - 0.999f carries a
 * 1.3e-5 relative representation error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/optim.h"

static int fails;

static void near(const char *what, double got, double want, double rtol) {
    if (!(fabs(got - want) <= rtol * fabs(want) + 1e-15)) {
        printf("FAIL %s: got %.12g want %.12g\n", what, got, want);
        fails++;
    }
}

struct lr_case {
    enum optim_schedule sched;
    int64_t step;
    double want;
};

static void test_schedule(void) {
    struct optim_cfg c = {.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .steps = 110};
    static const struct lr_case cases[] = {
        {OPTIM_COSINE, 0, 1e-4},                  /* warmup: lr * 1/10 */
        {OPTIM_COSINE, 4, 5e-4},                  /* lr * 5/10 */
        {OPTIM_COSINE, 9, 1e-3},                  /* last warmup step reaches lr */
        {OPTIM_COSINE, 10, 1e-3},                 /* decay starts at p = 0 */
        {OPTIM_COSINE, 35, 8.681980515339464e-4}, /* p = 1/4 */
        {OPTIM_COSINE, 60, 5.5e-4},               /* p = 1/2: midpoint */
        {OPTIM_COSINE, 110, 1e-4},                /* end: min_lr */
        {OPTIM_COSINE, 500, 1e-4},                /* past the end stays at min_lr */
        {OPTIM_LINEAR, 35, 7.75e-4},
        {OPTIM_LINEAR, 60, 5.5e-4},
        {OPTIM_LINEAR, 110, 1e-4},
        {OPTIM_CONSTANT, 3, 4e-4},
        {OPTIM_CONSTANT, 80, 1e-3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        c.schedule = cases[i].sched;
        char what[64];
        snprintf(what, sizeof what, "lr(sched=%d, step=%lld)", cases[i].sched,
                 (long long)cases[i].step);
        near(what, optim_lr(&c, cases[i].step), cases[i].want, 1e-12);
    }
    c.warmup = 0;
    c.schedule = OPTIM_COSINE;
    near("lr without warmup at step 0", optim_lr(&c, 0), 1e-3, 1e-12);
}

static void test_clip(void) {
    near("clip norm 5 to 1", optim_clip_scale(5.0, 1.0), 1.0 / (5.0 + 1e-6), 1e-12);
    near("clip below threshold", optim_clip_scale(0.5, 1.0), 1.0, 0);
    near("clip disabled", optim_clip_scale(50.0, 0.0), 1.0, 0);
}

static void test_adamw(void) {
    struct backend *b = backend_cpu_new(1);
    float w = 1.0f, m = 0, v = 0, g;
    /* hand-computed trajectory: lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.1 */
    const float grads[3] = {0.5f, -0.25f, 2.0f};
    const double want_w[3] = {0.890000002, 0.8544662986878464, 0.7788568715222747};
    const double want_m[3] = {0.05, 0.02, 0.218};
    const double want_v[3] = {0.00025, 0.00031225, 0.00431193775};
    for (int t = 1; t <= 3; t++) {
        g = grads[t - 1];
        struct backend_adamw a = {.param = &w,
                                  .master = &w,
                                  .grad = &g,
                                  .m = &m,
                                  .v = &v,
                                  .n = 1,
                                  .lr = 0.1f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.999f,
                                  .eps = 1e-8f,
                                  .weight_decay = 0.1f,
                                  .grad_scale = 1.0f,
                                  .step = t};
        b->adamw(b->ctx, &a);
        char what[32];
        snprintf(what, sizeof what, "adamw w step %d", t);
        near(what, w, want_w[t - 1], 1e-6);
        snprintf(what, sizeof what, "adamw m step %d", t);
        near(what, m, want_m[t - 1], 1e-6);
        snprintf(what, sizeof what, "adamw v step %d", t);
        /* 1 - 0.999f is 0.00099998713 in fp32: 1.3e-5 relative from exact */
        near(what, v, want_v[t - 1], 3e-5);
    }
    /* grad_scale folds in: g=1 scaled by 0.5 equals g=0.5 */
    float w1 = 1, m1 = 0, v1 = 0, g1 = 1.0f;
    struct backend_adamw a = {.param = &w1,
                              .master = &w1,
                              .grad = &g1,
                              .m = &m1,
                              .v = &v1,
                              .n = 1,
                              .lr = 0.1f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-8f,
                              .weight_decay = 0.1f,
                              .grad_scale = 0.5f,
                              .step = 1};
    b->adamw(b->ctx, &a);
    near("adamw grad_scale", m1, 0.05, 1e-6);
    /* sum of squares: 1..1000 squared = n(n+1)(2n+1)/6 */
    float *x = malloc(1000 * sizeof *x), acc = 1.0f;
    for (int i = 0; i < 1000; i++)
        x[i] = (float)(i + 1);
    b->sumsq(b->ctx, &acc, x, 1000);
    near("sumsq accumulates", acc, 1.0 + 1000.0 * 1001.0 * 2001.0 / 6.0, 1e-7);
    free(x);
    backend_free(b);
}

/* With zero gradients and moments, AdamW changes only decayed tensors:
 * w -> w * (1 - lr * wd). */
static void test_decay_runs(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_GPT2);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_kv_head = 2;
    c.d_model = 8;
    c.d_ff = 32;
    c.vocab_size = 20;
    c.seq_len = 4;
    model_config_finalize(&c);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    if (!e) {
        printf("FAIL engine_new\n");
        fails++;
        return;
    }
    float *w = e->params;
    for (size_t i = 0; i < e->n_params; i++)
        w[i] = 1.0f;
    struct optim_cfg oc = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.5};
    optim_step(e, &oc, 0.1, 1.0, 1);
    int bad = 0, decayed = 0;
    for (int i = 0; i < e->layout.n; i++) {
        const struct model_tensor *t = &e->layout.t[i];
        float want = t->decay ? 1.0f - 0.1f * 0.5f : 1.0f;
        decayed += t->decay;
        for (int64_t j = 0; j < t->numel; j++)
            if (fabsf(w[t->rank_offset + j] - want) > 1e-6f) bad++;
    }
    if (bad || decayed != 2 * c.n_layer * 2) {
        printf("FAIL decay runs: %d wrong elements, %d decayed tensors\n", bad, decayed);
        fails++;
    }
    /* sharded optimizer: only the shard moves */
    for (size_t i = 0; i < e->n_params; i++)
        w[i] = 1.0f;
    size_t off = e->n_params / 3, n = e->n_params / 3;
    if (engine_set_shard(e, off, n) != 0) fails++;
    oc.decay_all = 1;
    optim_step(e, &oc, 0.1, 1.0, 1);
    bad = 0;
    for (size_t i = 0; i < e->n_params; i++) {
        float want = i >= off && i < off + n ? 0.95f : 1.0f;
        if (fabsf(w[i] - want) > 1e-6f) bad++;
    }
    if (bad) {
        printf("FAIL sharded step: %d wrong elements\n", bad);
        fails++;
    }
    engine_free(e);
}

int main(void) {
    test_schedule();
    test_clip();
    test_adamw();
    test_decay_runs();
    printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
