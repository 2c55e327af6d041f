/* Training tests on the CPU backend with tiny GPT-2 and Llama models:
 *  - whole-model gradient check: the engine's gradients of the mean loss
 *    against central finite differences of the fp32 loss (h = 1e-2 on fp32
 *    parameters of a model small enough that the loss is smooth there),
 *    |g - fd| <= 2e-3 + 5e-2 |fd|, on the 40 largest-|g| parameters of every
 *    tensor kind plus random ones; this checks the wiring of the layers
 *    (residuals, RoPE placement, tied head) that test_ops cannot;
 *  - overfitting one batch: loss falls below initial / 5 within 80 steps;
 *  - determinism: the same run twice, and with 1 vs 2 threads, gives the
 *    same losses bit for bit;
 *  - gradient accumulation: B=4 x 1 micro-step and B=2 x 2 micro-steps over
 *    the same samples give the same losses to 2e-5 relative;
 *  - the AVX2 and baseline kernel sets give the same losses bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/train.h"

static int fails;

struct src {
    int B, T, V, grad_accum;
    int fixed; /* 1: every step reads the same batch */
};

/* Sample s: a noisy arithmetic sequence, so the next token is learnable. */
static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    struct src *s = user;
    for (int b = 0; b < s->B; b++) {
        int64_t sample = s->fixed ? b : (step * s->grad_accum + micro) * s->B + b;
        int32_t seq[1025];
        uint64_t h = (uint64_t)sample * 0x9e3779b97f4a7c15ull + 12345;
        int stride = 1 + (int)(h % 5);
        seq[0] = (int32_t)((h >> 20) % (uint64_t)s->V);
        for (int t = 1; t <= s->T; t++)
            seq[t] = (seq[t - 1] + stride) % s->V;
        for (int t = 0; t < s->T; t++) {
            in[b * s->T + t] = seq[t];
            tg[b * s->T + t] = seq[t + 1];
        }
    }
    return 0;
}

static struct model_config config(enum model_family f) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, f);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = f == MODEL_LLAMA ? 2 : 4;
    c.d_model = 32;
    c.d_ff = f == MODEL_LLAMA ? 64 : 128;
    c.vocab_size = 61;
    c.seq_len = 16;
    model_config_finalize(&c);
    return c;
}

struct run {
    struct engine *e;
    struct model *m;
};

static int run_new(struct run *r, enum model_family f, int B, int threads, uint64_t seed) {
    struct model_config c = config(f);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    r->e = engine_new(&c, &p, backend_cpu_new(threads));
    if (!r->e) return -1;
    r->m = model_new(r->e, B, c.seq_len, threads);
    if (!r->m || model_init_params(r->m, seed) != 0) return -1;
    return 0;
}

static void run_free(struct run *r) {
    model_free(r->m);
    engine_free(r->e);
}

static struct train_opts opts(struct src *s, int64_t steps, double lr) {
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = steps;
    o.grad_accum = s->grad_accum;
    o.global_batch_tokens = (int64_t)s->B * s->T * s->grad_accum;
    o.optim = (struct optim_cfg){.lr = lr,
                                 .min_lr = lr / 10,
                                 .warmup = 2,
                                 .steps = steps,
                                 .schedule = OPTIM_COSINE,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 1.0};
    o.train.batch = src_batch;
    o.train.user = s;
    return o;
}

/* Losses of `steps` steps into out[]. */
static int train_losses(enum model_family f, struct src *s, int threads, int64_t steps, double lr,
                        double *out) {
    struct run r;
    if (run_new(&r, f, s->B, threads, 42) != 0) return -1;
    struct train_opts o = opts(s, steps, lr);
    int32_t *in = malloc(sizeof(int32_t) * s->B * s->T),
            *tg = malloc(sizeof(int32_t) * s->B * s->T);
    char err[256];
    int rc = 0;
    for (int64_t i = 0; i < steps && rc == 0; i++) {
        struct train_step_info info;
        rc = train_step(r.m, &o, i, &info, in, tg, err, sizeof err);
        out[i] = info.loss;
    }
    free(in);
    free(tg);
    run_free(&r);
    return rc;
}

static double loss_at(struct run *r, const int32_t *in, const int32_t *tg) {
    int64_t cnt = 0;
    double s = model_forward(r->m, in, tg, 0.0f, &cnt);
    return s / (double)cnt;
}

static void test_gradcheck(enum model_family f) {
    const char *fam = model_family_name(f);
    struct run r;
    struct src s = {.B = 2, .T = 16, .V = 61, .grad_accum = 1, .fixed = 1};
    if (run_new(&r, f, s.B, 1, 7) != 0) {
        printf("FAIL %s: set-up\n", fam);
        fails++;
        return;
    }
    /* Larger weights than the init make every path's gradient visible. */
    float *w = r.e->params;
    uint64_t st = 99;
    for (size_t i = 0; i < r.e->n_params; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        w[i] += 0.1f * (float)((double)(st >> 11) / 9007199254740992.0 - 0.5);
    }
    int32_t in[32], tg[32];
    char err[64];
    src_batch(&s, 0, 0, in, tg, err, sizeof err);
    r.e->be->zero(r.e->be->ctx, r.e->grads, r.e->n_params * sizeof(float));
    int64_t cnt = 0;
    model_forward(r.m, in, tg, 1.0f / 32, &cnt);
    model_backward(r.m, NULL, NULL);
    const float *g = r.e->grads;
    int checked = 0, bad = 0;
    double maxerr = 0;
    for (int ti = 0; ti < r.e->layout.n; ti++) {
        const struct model_tensor *t = &r.e->layout.t[ti];
        /* the largest |g| elements of this tensor, and 3 random ones */
        int64_t picks[8];
        int np = 0;
        for (int k = 0; k < 5; k++) {
            int64_t best = -1;
            for (int64_t j = 0; j < t->numel; j++) {
                int taken = 0;
                for (int q = 0; q < np; q++)
                    taken |= picks[q] == j;
                if (!taken && (best < 0 || fabsf(g[t->offset + j]) > fabsf(g[t->offset + best])))
                    best = j;
            }
            picks[np++] = best;
        }
        for (int k = 0; k < 3; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            picks[np++] = (int64_t)((st >> 33) % (uint64_t)t->numel);
        }
        for (int q = 0; q < np; q++) {
            size_t idx = (size_t)(t->offset + picks[q]);
            float save = w[idx], h = 1e-2f;
            w[idx] = save + h;
            double lp = loss_at(&r, in, tg);
            w[idx] = save - h;
            double lm = loss_at(&r, in, tg);
            w[idx] = save;
            double fd = (lp - lm) / (2.0 * h);
            double err = fabs(g[idx] - fd);
            if (err > maxerr) maxerr = err;
            checked++;
            if (!(err <= 2e-3 + 5e-2 * fabs(fd))) {
                if (bad++ < 5)
                    printf("  %s %s[%lld]: grad %.6g fd %.6g\n", fam, t->name, (long long)picks[q],
                           g[idx], fd);
            }
        }
    }
    printf("%s gradcheck: %d parameters, %d bad, max |g - fd| %.2e\n", fam, checked, bad, maxerr);
    if (bad) fails++;
    run_free(&r);
}

static void test_overfit(enum model_family f) {
    struct src s = {.B = 4, .T = 16, .V = 61, .grad_accum = 1, .fixed = 1};
    double l[80];
    if (train_losses(f, &s, 1, 80, 3e-3, l) != 0) {
        fails++;
        return;
    }
    int ok = l[79] < l[0] / 5;
    printf("%s overfit: loss %.4f -> %.4f (%s)\n", model_family_name(f), l[0], l[79],
           ok ? "ok" : "FAIL: not below initial/5");
    if (!ok) fails++;
}

static void test_determinism(enum model_family f) {
    struct src s = {.B = 4, .T = 16, .V = 61, .grad_accum = 2, .fixed = 0};
    double a[12], b[12], c[12];
    if (train_losses(f, &s, 1, 12, 3e-3, a) || train_losses(f, &s, 1, 12, 3e-3, b) ||
        train_losses(f, &s, 2, 12, 3e-3, c)) {
        fails++;
        return;
    }
    int same = memcmp(a, b, sizeof a) == 0, same_t = memcmp(a, c, sizeof a) == 0;
    printf("%s determinism: repeat %s, 1 vs 2 threads %s (last loss %.17g)\n", model_family_name(f),
           same ? "identical" : "FAIL", same_t ? "identical" : "FAIL", a[11]);
    if (!same || !same_t) fails++;
}

static void test_accumulation(enum model_family f) {
    struct src s1 = {.B = 4, .T = 16, .V = 61, .grad_accum = 1, .fixed = 0};
    struct src s2 = {.B = 2, .T = 16, .V = 61, .grad_accum = 2, .fixed = 0};
    double a[6], b[6];
    if (train_losses(f, &s1, 1, 6, 3e-3, a) || train_losses(f, &s2, 1, 6, 3e-3, b)) {
        fails++;
        return;
    }
    double worst = 0;
    for (int i = 0; i < 6; i++) {
        double d = fabs(a[i] - b[i]) / fabs(a[i]);
        if (d > worst) worst = d;
    }
    int ok = worst <= 2e-5;
    printf("%s accumulation: B4x1 vs B2x2 max rel diff %.2e (%s)\n", model_family_name(f), worst,
           ok ? "ok" : "FAIL");
    if (!ok) fails++;
}

/* The AVX2 and baseline kernel sets give the same losses bit for bit (the
 * CPU backend's results do not depend on the machine). */
static void test_isa(enum model_family f) {
    struct src s = {.B = 4, .T = 16, .V = 61, .grad_accum = 2, .fixed = 0};
    double a[6], b[6];
    setenv("LOOM_CPU_ISA", "baseline", 1);
    int rc = train_losses(f, &s, 1, 6, 3e-3, a);
    unsetenv("LOOM_CPU_ISA");
    if (rc || train_losses(f, &s, 1, 6, 3e-3, b)) {
        fails++;
        return;
    }
    struct backend *be = backend_cpu_new(1);
    int same = memcmp(a, b, sizeof a) == 0;
    printf("%s kernel sets: baseline vs %s %s\n", model_family_name(f), backend_cpu_isa(be),
           same ? "identical" : "FAIL: differ");
    backend_free(be);
    if (!same) fails++;
}

int main(void) {
    /* every parallel region threaded, so 1 vs 2 threads is a real comparison */
    setenv("LOOM_CPU_PAR_MIN", "0", 1);
    enum model_family fams[] = {MODEL_GPT2, MODEL_LLAMA};
    for (int i = 0; i < 2; i++) {
        test_gradcheck(fams[i]);
        test_overfit(fams[i]);
        test_determinism(fams[i]);
        test_accumulation(fams[i]);
        test_isa(fams[i]);
    }
    printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
