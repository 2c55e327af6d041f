/* Single-process tests of the parallelism area (docs/parallelism.md):
 *  - recompute: none / selective / full give bit-identical losses, gradient
 *    norms and final weights over 5 steps with 2 micro-steps, for GPT-2 and
 *    Llama (GQA), and the activation bytes each mode reports match the
 *    formulas of worker/model.h (table-driven: mode -> expected bytes);
 *  - tp slicing: tp_slice / tp_unslice of every tensor of both families at
 *    tp 2 and 4 rebuild the full tensor, and the shares of a column-split
 *    fused qkv hold whole heads of q, k and v.
 * Usage: test_par [recompute|slice] (no argument: all). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/tp.h"
#include "worker/train.h"
#include "tests/check.h"

struct src {
    int B, T, V, grad_accum;
};

static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    (void)err;
    (void)errlen;
    struct src *s = user;
    for (int b = 0; b < s->B; b++) {
        uint64_t h = (uint64_t)((step * s->grad_accum + micro) * s->B + b) * 0x9e3779b97f4a7c15ull;
        int stride = 1 + (int)(h % 5), x = (int)((h >> 20) % (uint64_t)s->V);
        for (int t = 0; t < s->T; t++) {
            in[b * s->T + t] = x;
            x = (x + stride) % s->V;
            tg[b * s->T + t] = t == 5 ? -1 : x; /* one ignored position */
        }
    }
    return 0;
}

static struct model_config config(enum model_family f) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, f);
    c.n_layer = 3;
    c.n_head = 4;
    c.n_kv_head = f == MODEL_LLAMA ? 2 : 4;
    c.d_model = 32;
    c.d_ff = f == MODEL_LLAMA ? 48 : 96;
    c.vocab_size = 200;
    c.seq_len = 16;
    model_config_finalize(&c);
    return c;
}

#define STEPS 5

struct result {
    double loss[STEPS], norm[STEPS];
    float *params;
    size_t n, act_bytes;
};

static int train(enum model_family f, int mode, int keep, struct result *res) {
    struct model_config c = config(f);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct src s = {.B = 2, .T = c.seq_len, .V = c.vocab_size, .grad_accum = 2};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    if (!e) return -1;
    size_t before = e->mem.activations;
    struct model_opts mo = {.B = s.B, .T = s.T, .threads = 1, .recompute = mode, .keep = keep};
    struct model *m = model_new_ex(e, &mo);
    if (!m || model_init_params(m, 7) != 0) return -1;
    res->act_bytes = e->mem.activations - before;
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = STEPS;
    o.grad_accum = s.grad_accum;
    o.global_batch_tokens = (int64_t)s.B * s.T * s.grad_accum;
    o.optim = (struct optim_cfg){.lr = 3e-3,
                                 .min_lr = 3e-4,
                                 .warmup = 1,
                                 .steps = STEPS,
                                 .schedule = OPTIM_COSINE,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 0.5};
    o.train.batch = src_batch;
    o.train.user = &s;
    int32_t in[64], tg[64];
    char err[256];
    for (int i = 0; i < STEPS; i++) {
        struct train_step_info info;
        if (train_step(m, &o, i, &info, in, tg, err, sizeof err) != 0) return -1;
        res->loss[i] = info.loss;
        res->norm[i] = info.grad_norm;
    }
    res->n = e->n_params;
    res->params = malloc(res->n * sizeof(float));
    e->be->download(e->be->ctx, res->params, e->params, res->n * sizeof(float));
    model_free(m);
    engine_free(e);
    return 0;
}

/* Activation bytes of one model (fp32, worker/model.h recompute modes; keep:
 * with full recompute, the blocks that keep every activation). */
static size_t expected_acts(enum model_family f, int mode, int keep, int B) {
    struct model_config c = config(f);
    size_t T = (size_t)c.seq_len, N = (size_t)B * T, C = (size_t)c.d_model, L = (size_t)c.n_layer;
    size_t HD = C / (size_t)c.n_head, QKV = ((size_t)c.n_head + 2 * (size_t)c.n_kv_head) * HD;
    size_t AC = (size_t)c.n_head * HD, F = (size_t)c.d_ff;
    size_t fcw = F * (c.act == MODEL_ACT_SWIGLU ? 2 : 1);
    size_t wide = C > QKV ? C : QKV;
    wide = wide > fcw ? wide : fcw;
    wide = wide > AC ? wide : AC;
    size_t stats = 4 * N + (size_t)B * c.n_head * T; /* fp32 per block: 2 norms x 2 + lse */
    /* enc, nf, dres, dnf, s1, s2 + final norm stats, tokens, targets, losses */
    size_t fixed = 4 * (4 * N * C + 2 * N * wide) + 4 * 2 * N + 4 * 3 * N;
    size_t block = 4 * (N * (4 * C + QKV + AC + fcw + F) + stats);
    switch (mode) {
    case MODEL_RECOMPUTE_NONE:
        return fixed + L * block;
    case MODEL_RECOMPUTE_SELECTIVE: /* n1 = n2 and fca shared */
        return fixed + L * (block - 4 * N * (2 * C + F)) + 4 * N * (C + F);
    default: /* each recomputed block keeps r2; one block's worth (but r2) shared, where kept
              * blocks (as selective) also put n1 = n2 and fca */
        if ((size_t)keep >= L) return expected_acts(f, MODEL_RECOMPUTE_SELECTIVE, 0, B);
        return fixed + (size_t)keep * (block - 4 * N * (2 * C + F)) +
               (L - (size_t)keep) * 4 * N * C + block - 4 * N * C;
    }
}

static void test_recompute(void) {
    static const char *names[] = {"none", "selective", "full"};
    for (int f = 0; f < 2; f++) {
        struct result r[3];
        memset(r, 0, sizeof r);
        for (int mode = 0; mode < 3; mode++) {
            int rc = train((enum model_family)f, mode, 0, &r[mode]);
            CHECK(rc == 0, "family %d recompute %s: training failed", f, names[mode]);
            if (rc != 0) return;
            size_t want = expected_acts((enum model_family)f, mode, 0, 2);
            CHECK(r[mode].act_bytes == want, "family %d %s: activations %zu bytes, formula %zu", f,
                  names[mode], r[mode].act_bytes, want);
            printf("family %s recompute %-9s activations %7zu bytes, final loss %.9f\n",
                   f ? "llama" : "gpt2", names[mode], r[mode].act_bytes, r[mode].loss[STEPS - 1]);
        }
        CHECK(r[1].act_bytes < r[0].act_bytes && r[2].act_bytes < r[1].act_bytes,
              "activation memory does not drop: %zu %zu %zu", r[0].act_bytes, r[1].act_bytes,
              r[2].act_bytes);
        for (int mode = 1; mode < 3; mode++) {
            for (int i = 0; i < STEPS; i++) {
                CHECK(r[mode].loss[i] == r[0].loss[i], "family %d %s step %d: loss %.17g vs %.17g",
                      f, names[mode], i, r[mode].loss[i], r[0].loss[i]);
                CHECK(r[mode].norm[i] == r[0].norm[i], "family %d %s step %d: norm %.17g vs %.17g",
                      f, names[mode], i, r[mode].norm[i], r[0].norm[i]);
            }
            CHECK(memcmp(r[mode].params, r[0].params, r[0].n * sizeof(float)) == 0,
                  "family %d %s: final weights differ from none", f, names[mode]);
        }
        CHECK(r[0].loss[STEPS - 1] < r[0].loss[0], "loss did not fall: %g -> %g", r[0].loss[0],
              r[0].loss[STEPS - 1]);
        /* The budget mode's mix (full recompute, the first `keep` of the 3
         * blocks recomputing only as selective does): same bits, memory
         * between full and selective's, and keeping every block is selective */
        size_t last_bytes = r[2].act_bytes;
        for (int keep = 1; keep <= 4; keep++) {
            struct result k;
            memset(&k, 0, sizeof k);
            int rc = train((enum model_family)f, MODEL_RECOMPUTE_FULL, keep, &k);
            CHECK(rc == 0, "family %d full recompute keep %d: training failed", f, keep);
            if (rc != 0) return;
            size_t want = expected_acts((enum model_family)f, MODEL_RECOMPUTE_FULL, keep, 2);
            CHECK(k.act_bytes == want, "family %d keep %d: activations %zu bytes, formula %zu", f,
                  keep, k.act_bytes, want);
            /* keeping L-1 of L blocks costs more than keeping all L (the shared
             * buffers are one block's worth): the budget mode never picks it */
            if (keep < 2)
                CHECK(k.act_bytes > last_bytes && k.act_bytes < r[1].act_bytes,
                      "family %d keep %d: activations %zu not between keep %d's %zu and "
                      "selective's %zu",
                      f, keep, k.act_bytes, keep - 1, last_bytes, r[1].act_bytes);
            else if (keep == 2)
                CHECK(k.act_bytes > r[1].act_bytes && k.act_bytes < r[0].act_bytes,
                      "family %d keep 2: %zu, selective's %zu, none's %zu", f, k.act_bytes,
                      r[1].act_bytes, r[0].act_bytes);
            else
                CHECK(k.act_bytes == r[1].act_bytes, "family %d keep %d: %zu, selective's %zu", f,
                      keep, k.act_bytes, r[1].act_bytes);
            last_bytes = k.act_bytes;
            printf("family %s full recompute keep %d activations %7zu bytes\n",
                   f ? "llama" : "gpt2", keep, k.act_bytes);
            for (int i = 0; i < STEPS; i++) {
                CHECK(k.loss[i] == r[0].loss[i], "family %d keep %d step %d: loss %.17g vs %.17g",
                      f, keep, i, k.loss[i], r[0].loss[i]);
                CHECK(k.norm[i] == r[0].norm[i], "family %d keep %d step %d: norm %.17g vs %.17g",
                      f, keep, i, k.norm[i], r[0].norm[i]);
            }
            CHECK(memcmp(k.params, r[0].params, r[0].n * sizeof(float)) == 0,
                  "family %d keep %d: final weights differ from none", f, keep);
            free(k.params);
        }
        for (int mode = 0; mode < 3; mode++)
            free(r[mode].params);
    }
}

static void test_slice(void) {
    for (int f = 0; f < 2; f++) {
        struct model_config c = config((enum model_family)f);
        for (int tp = 2; tp <= 4; tp += 2) {
            struct model_layout l;
            CHECK(model_layout_init(&l, &c, tp) == 0, "layout tp=%d", tp);
            for (int i = 0; i < l.n; i++) {
                const struct model_tensor *t = &l.t[i];
                size_t n = (size_t)t->numel, rn = (size_t)t->rank_numel;
                float *full = malloc(n * sizeof *full), *back = calloc(n, sizeof *back);
                float *part = malloc(rn * sizeof *part);
                for (size_t j = 0; j < n; j++)
                    full[j] = (float)j + 0.5f;
                for (int r = 0; r < tp; r++) {
                    tp_slice(t, tp, r, full, part);
                    tp_unslice(t, tp, r, part, back);
                    if (t->split == MODEL_SPLIT_COLUMN && t->parts == 3 && t->ndim == 2) {
                        /* share r starts with q head r*(NH/tp) */
                        size_t hd = (size_t)(c.d_model / c.n_head) * (size_t)t->shape[1];
                        size_t q0 = (size_t)r * (size_t)(c.n_head / tp) * hd;
                        CHECK(part[0] == full[q0], "%s tp=%d r=%d: first row is not q head %d",
                              t->name, tp, r, r * c.n_head / tp);
                    }
                }
                CHECK(memcmp(full, back, n * sizeof *full) == 0, "%s tp=%d: unslice(slice) != id",
                      t->name, tp);
                free(full);
                free(back);
                free(part);
            }
            model_layout_free(&l);
        }
    }
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    if (!strcmp(which, "all") || !strcmp(which, "recompute")) test_recompute();
    if (!strcmp(which, "all") || !strcmp(which, "slice")) test_slice();
    return check_summary("test_par");
}
