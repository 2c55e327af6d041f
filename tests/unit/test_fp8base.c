/* The LoRA base held by handle (worker/fp8base.h, model_fp8_freeze) on the
 * cpu backend, with a stand-in for the device's fp8_freeze: it keeps an exact
 * copy of each weight in a buffer of its own (the handle) and makes it again
 * when called with the handle set, so the cpu GEMMs on a handle compute what
 * they computed on the weight. What is checked is the engine's bookkeeping
 * around the E4M3 store, which gpu.fp8 can check only on a GPU:
 *  - the held layout is taken: the params window is gone, each held weight's
 *    view is its handle, the other tensors of a fused weight (k and v, up)
 *    have none, every other tensor a view holding its values;
 *  - a LoRA loss curve equals the plain layout's bit for bit (every tensor
 *    reached through the right view), for Llama (fused q|k|v and gate|up) and
 *    GPT-2 (biases beside the held weights);
 *  - e->mem.params is the window less (element size - 1) bytes a held weight
 *    (its compute-dtype bytes out, an E4M3 byte in);
 *  - the frozen base an export reads (engine_opt_read of the master) equals
 *    the plain run's before and after lora_merge bit for bit, and after the
 *    merge every held weight was made again from the merged values: the next
 *    step's loss equals the plain layout's;
 *  - with fp8-base-bf16 (model_fp8_freeze's bf16_base) the window stays, and
 *    when the backend takes no weight (the fp8 row off) it is back.
 * Exit 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "worker/engine.h"
#include "worker/fp8base.h"
#include "worker/lora.h"
#include "worker/model.h"
#include "worker/train.h"

#define STEPS 8
#define B_SEQ 2
#define T_SEQ 32
#define VOCAB 61
#define MAXH  64

/* the stand-in's handles */
static struct {
    struct backend *b;
    void *h[MAXH];
    size_t bytes[MAXH];
    int n, remade, take;
} S;

static int standin_freeze(void *ctx, const void *W, int OC, int IC, int wgrad, void **handle) {
    if (!handle || wgrad || !S.take) return 1; /* the copied layout: not taken, W stays */
    size_t bytes = (size_t)OC * IC * S.b->elt_size;
    if (!*handle) {
        if (S.n == MAXH || !(*handle = S.b->alloc(ctx, bytes))) return -1;
        S.h[S.n] = *handle;
        S.bytes[S.n++] = bytes;
    } else {
        int k = 0;
        while (k < S.n && S.h[k] != *handle)
            k++;
        if (k == S.n || S.bytes[k] != bytes) return -1;
        S.remade++;
    }
    S.b->copy(ctx, *handle, W, bytes);
    return 0;
}

static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    (void)user, (void)micro, (void)err, (void)errlen;
    for (int b = 0; b < B_SEQ; b++)
        for (int t = 0; t < T_SEQ; t++) {
            int32_t v = (int32_t)((step * 7 + b * 13 + t * (b + 2)) % VOCAB);
            in[b * T_SEQ + t] = v;
            tg[b * T_SEQ + t] = (v * 3 + 1) % VOCAB;
        }
    return 0;
}

struct run {
    double loss[STEPS + 1];
    size_t params, n, held_vals;
    float *base, *merged;
    int held, views_ok, adapters, remade;
};

/* mode 0: plain (no model_fp8_freeze); 1: held; 2: model_fp8_freeze with bf16_base 1; 3: held
 * asked, the stand-in not taking the handle */
static int run(enum model_family fam, int mode, struct run *r) {
    static const char *const tl[] = {"q", "k", "v", "o", "gate", "up", "down"};
    static const char *const tg[] = {"attn", "proj", "fc", "fc2"};
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, fam);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = fam == MODEL_LLAMA ? 2 : 4;
    c.d_model = 64;
    c.d_ff = fam == MODEL_LLAMA ? 128 : 256;
    c.vocab_size = VOCAB;
    c.seq_len = T_SEQ;
    model_config_finalize(&c);
    struct engine_place pl = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .frozen = 1};
    struct backend *be = backend_cpu_new(1);
    if (!be) return -1;
    memset(&S, 0, sizeof S);
    S.b = be;
    S.take = mode != 3;
    be->fp8_freeze = standin_freeze;
    struct engine *e = engine_new(&c, &pl, be);
    struct model_opts mo = {.B = B_SEQ, .T = T_SEQ, .threads = 1, .acts_later = mode != 0};
    struct model *m = e ? model_new_ex(e, &mo) : NULL;
    struct lora *l = NULL;
    int rc = -1;
    memset(r, 0, sizeof *r);
    if (!m || model_init_params(m, 7) != 0) goto out;
    struct lora_opts lo = {.rank = 4,
                           .alpha = 8,
                           .targets = fam == MODEL_LLAMA ? tl : tg,
                           .n_targets = fam == MODEL_LLAMA ? 7 : 4,
                           .seed = 5};
    const char *code = NULL;
    char err[256];
    if (!(l = lora_new(m, &lo, &code, err, sizeof err))) goto out;
    m->lora = l;
    size_t window = e->mem.params;
    if (mode != 0) {
        int n = 0;
        size_t bytes = 0;
        if (model_fp8_freeze(m, mode == 2, &n, &bytes) != 0 || model_alloc_acts(m) != 0) goto out;
        r->held = e->fp8b != NULL;
        r->held_vals = bytes;
    }
    if (r->held) { /* the views: handles for the held weights, values for the rest */
        r->views_ok = e->params == NULL && S.n == 4 * c.n_layer;
        for (int i = 0; i < e->layout.n; i++) {
            int is_handle = 0;
            for (int k = 0; k < S.n; k++)
                is_handle |= e->pview[i] == S.h[k];
            r->views_ok &= fp8base_holds(e->fp8b, i) == is_handle;
        }
        r->views_ok &= window - e->mem.params == r->held_vals * (be->elt_size - 1);
    }
    r->params = e->mem.params;
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = STEPS + 1;
    o.grad_accum = 1;
    o.global_batch_tokens = (int64_t)B_SEQ * T_SEQ;
    o.optim = (struct optim_cfg){.lr = 1e-2,
                                 .min_lr = 1e-2,
                                 .steps = STEPS + 1,
                                 .schedule = OPTIM_CONSTANT,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .grad_clip = 1.0};
    o.train.batch = src_batch;
    int32_t in[B_SEQ * T_SEQ], tgt[B_SEQ * T_SEQ];
    struct train_step_info info;
    for (int i = 0; i < STEPS; i++) {
        if (train_step(m, &o, i, &info, in, tgt, err, sizeof err) != 0) goto out;
        r->loss[i] = info.loss;
    }
    r->n = e->n_params;
    r->base = malloc(r->n * sizeof(float));
    r->merged = malloc(r->n * sizeof(float));
    if (!r->base || !r->merged) goto out;
    engine_opt_read(e, ENGINE_OPT_MASTER, r->base, 0, r->n);
    if (lora_merge(l) != 0) goto out;
    engine_opt_read(e, ENGINE_OPT_MASTER, r->merged, 0, r->n);
    /* one more step over the merged base (the adapters still on: the same in both layouts) */
    if (train_step(m, &o, STEPS, &info, in, tgt, err, sizeof err) != 0) goto out;
    r->loss[STEPS] = info.loss;
    r->adapters = lora_count(l);
    r->remade = S.remade;
    rc = 0;
out:
    if (m) m->lora = NULL;
    lora_free(l);
    model_free(m);
    for (int k = 0; k < S.n; k++)
        be->free(be->ctx, S.h[k]);
    engine_free(e);
    return rc;
}

static void compare(const char *name, enum model_family fam) {
    struct run p, h, k, x;
    int ok = run(fam, 0, &p) == 0 && run(fam, 1, &h) == 0;
    CHECK(ok, "%s: plain and held runs", name);
    if (ok) {
        CHECK(h.held && h.views_ok && h.held_vals > 0,
              "%s: the held layout (window gone, handles as views, params less %zu values x 3)",
              name, h.held_vals);
        int same = 1;
        for (int i = 0; i <= STEPS; i++)
            same &= memcmp(&p.loss[i], &h.loss[i], sizeof(double)) == 0;
        CHECK(same, "%s: the held curve equals the plain one bit for bit (last %.9f vs %.9f)", name,
              p.loss[STEPS], h.loss[STEPS]);
        CHECK(p.n == h.n && memcmp(p.base, h.base, p.n * sizeof(float)) == 0 &&
                  memcmp(p.merged, h.merged, p.n * sizeof(float)) == 0 &&
                  memcmp(p.base, p.merged, p.n * sizeof(float)) != 0,
              "%s: the base and merged base an export reads equal the plain layout's", name);
        /* each adapter's merged tensor written once: its held weight made again */
        CHECK(h.remade == h.adapters, "%s: lora_merge made the held weights again (%d of %d)", name,
              h.remade, h.adapters);
        printf("%s: loss %.6f -> %.6f, merged step %.6f; params %zu (plain) / %zu (held, %zu "
               "block weights at 1 byte)\n",
               name, p.loss[0], p.loss[STEPS - 1], p.loss[STEPS], p.params, h.params, h.held_vals);
    }
    free(p.base), free(p.merged), free(h.base), free(h.merged);
    ok = run(fam, 2, &k) == 0 && run(fam, 3, &x) == 0;
    CHECK(ok && !k.held && !x.held && k.params == p.params && x.params == p.params,
          "%s: fp8-base-bf16, or a backend not taking the handle, keeps the window", name);
    free(k.base), free(k.merged), free(x.base), free(x.merged);
}

int main(void) {
    compare("llama", MODEL_LLAMA);
    compare("gpt2", MODEL_GPT2);
    return check_summary("test_fp8base");
}
