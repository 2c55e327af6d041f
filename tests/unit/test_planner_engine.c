/* The planner's per-rank memory estimate against what the engine really
 * allocates on the CPU backend (worker/engine.c, worker/model.c), category by
 * category, for several models, micro-batch shapes and ZeRO-1 shards (the
 * shard a dp rank keeps, set with engine_set_shard as the comm layer does).
 * Tolerance: +-10% per category (the bar); the parameter and gradient
 * buffers must match exactly since both come from the same layout table.
 * With the argument "cuda" the same table runs on the CUDA backend (bf16;
 * exits 77 when built without CUDA or no GPU is found).
 * train.lora cases: the frozen base (engine_place.frozen) and the adapters
 * (worker/lora.c), also over an NF4 base (train.quantize_base nf4,
 * worker/nf4.h); params, grads and optimizer must match exactly. */
#include "api/planner.h"
#include "tests/check.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/lora.h"
#include "worker/nf4.h"
#include "worker/model.h"
#include "worker/pp.h"

#ifdef LOOM_HAVE_CUDA
#include "worker/cuda/cuda_util.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lcase {
    const char *family, *preset;
    int B, T, dp, zero;
};

static const struct lcase cases[] = {
    {"gpt2", "tiny", 2, 64, 1, 0},   {"gpt2", "tiny", 4, 32, 2, 1},  {"gpt2", "mini", 2, 128, 1, 0},
    {"gpt2", "mini", 1, 128, 4, 1},  {"llama", "tiny", 2, 64, 1, 0}, {"llama", "tiny", 3, 64, 2, 1},
    {"llama", "mini", 2, 128, 1, 0}, {"llama", "mini", 4, 64, 4, 1},
};

struct lora_case {
    const char *family, *preset, *sizes,
        *targets; /* sizes: more model fields; targets: a JSON list body */
    int B, T, rank;
    double dropout;
    int nf4; /* train.quantize_base nf4 (worker/nf4.h) */
    int tp;  /* > 1: tp rank 0 of tp (an NF4 base's shards, worker/nf4.c nf4_attach) */
};

static const struct lora_case lora_cases[] = {
    {"llama", "tiny", "", "\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"", 2, 64, 8, 0, 0, 1},
    {"llama", "mini", "", "\"q\",\"v\"", 2, 128, 16, 0.1, 0, 1},
    {"gpt2", "tiny", "", "\"attn\",\"proj\",\"fc\",\"fc2\"", 2, 64, 4, 0.05, 0, 1},
    {"llama", "tiny", "", "\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"", 2, 64, 8, 0, 1, 1},
    {"gpt2", "tiny", "", "\"attn\",\"fc\"", 2, 64, 4, 0, 1, 1},
    /* tp: shards on 64-weight blocks (d_ff 512: down_proj's rows 256 a rank at tp 2) */
    {"llama", "mini", ",\"d_ff\":512", "\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"", 2, 64, 8,
     0, 1, 2},
    {"gpt2", "mini", "", "\"attn\",\"proj\",\"fc\",\"fc2\"", 2, 64, 4, 0, 1, 2},
    {"llama", "mini", ",\"d_model\":256,\"d_ff\":512", "\"q\",\"v\",\"o\",\"down\"", 2, 64, 8, 0, 1,
     4},
};

/* Case k's spec (nf4: with train.quantize_base nf4). 0 or -1. */
static int lora_spec(const struct lora_case *k, int cuda, int nf4, struct loom_spec *s) {
    char text[768];
    snprintf(text, sizeof text,
             "{\"model\":{\"family\":\"%s\",\"preset\":\"%s\",\"seq_len\":%d%s},"
             "\"parallel\":{\"tp\":%d},"
             "\"resources\":{\"device\":\"%s\"},\"train\":{\"micro_batch\":%d,"
             "\"lora\":{\"rank\":%d,\"alpha\":16,\"dropout\":%g,\"targets\":[%s]}%s}}",
             k->family, k->preset, k->T, k->sizes, k->tp > 1 ? k->tp : 1, cuda ? "cuda" : "cpu",
             k->B, k->rank, k->dropout, k->targets, nf4 ? ",\"quantize_base\":\"nf4\"" : "");
    struct loom_error err;
    if (jobspec_parse_text(s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) == 0) return 0;
    fprintf(stderr, "lora case %s %s: %s %s\n", k->family, k->preset, err.code, err.message);
    return -1;
}

/* The backend a case runs on: cuda (bf16) or cpu (one thread). */
static struct backend *new_backend(int cuda) {
#ifdef LOOM_HAVE_CUDA
    if (cuda) return backend_cuda_new(0);
#endif
    return cuda ? NULL : backend_cpu_new(1);
}

/* tp rank 0's params with an NF4 base (worker/nf4.c nf4_attach: its shards,
 * the scratch and the rest) against the planner's. The adapters need the tp
 * communicator (lora_new), which one process has not: the check is on the
 * difference to the same spec over a plain frozen base, where the adapters'
 * bytes cancel: planned(nf4) - planned(plain) = allocated(nf4) -
 * allocated(plain), both allocations real engines. */
static void nf4_tp_case(const struct lora_case *k, int cuda) {
    struct loom_spec sq, sp;
    struct planner_estimate eq, ep;
    struct loom_error err;
    if (lora_spec(k, cuda, 1, &sq) != 0 || lora_spec(k, cuda, 0, &sp) != 0) {
        check_failures++;
        return;
    }
    CHECK(planner_estimate(&sq, NULL, NULL, &eq, &err) == 0);
    CHECK(planner_estimate(&sp, NULL, NULL, &ep, &err) == 0);
    size_t got[2] = {0, 0};
    for (int nf4 = 0; nf4 < 2; nf4++) {
        struct engine_place p = {.rank = 0,
                                 .world = k->tp,
                                 .tp = k->tp,
                                 .dp = 1,
                                 .pp = 1,
                                 .frozen = 1,
                                 .windows_later = nf4};
        struct backend *be = new_backend(cuda);
        struct engine *e = be ? engine_new(nf4 ? &sq.model : &sp.model, &p, be) : NULL;
        char qerr[256] = "";
        int ok = e && (!nf4 || nf4_attach(e, qerr, sizeof qerr) == 0);
        CHECK(ok, "nf4 tp case %s %s: %s", k->family, k->preset, qerr);
        if (ok) got[nf4] = e->mem.params;
        engine_free(e);
    }
    double want = (double)got[1] - (double)got[0], plan = eq.mem.params - ep.mem.params;
    printf("%s lora nf4 tp%d rank 0 %-5s %-4s%s: params over plain %.0f/%.0f (real/estimate, "
           "bytes; nf4 %zu plain %zu)\n",
           cuda ? "cuda" : "cpu", k->tp, k->family, k->preset, k->sizes, want, plan, got[1],
           got[0]);
    CHECK(got[0] > 0 && got[1] > 0 && plan == want);
}

static int within(double est, double real, double tol) {
    if (real == 0) return est == 0;
    return fabs(est - real) / real <= tol;
}

/* pp 2, four micro-batches a step: the planner's most loaded stage holds one set of
 * base activations and one set of saved LoRA products per micro-batch in
 * flight (1F1B: pp - stage), as worker/pp.c ensure_slots allocates them (a
 * model per slot, lora_reserve_slots). The stage's windows are set as
 * worker/zero.c does for a frozen base. */
static void lora_pp_case(int cuda) {
    const char *text =
        "{\"model\":{\"family\":\"llama\",\"preset\":\"tiny\",\"seq_len\":64,"
        "\"tied_embeddings\":false},"
        "\"parallel\":{\"pp\":2},\"resources\":{\"device\":\"%s\"},"
        "\"train\":{\"micro_batch\":2,\"global_batch_tokens\":512,\"lora\":{\"rank\":32,"
        "\"alpha\":16,\"targets\":[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\","
        "\"down\"]}}}";
    char buf[768];
    snprintf(buf, sizeof buf, text, cuda ? "cuda" : "cpu");
    struct loom_spec s;
    struct loom_error err;
    if (jobspec_parse_text(&s, buf, strlen(buf), JOBSPEC_FOR_PLAN, &err) != 0) {
        fprintf(stderr, "lora pp case: %s %s\n", err.code, err.message);
        check_failures++;
        return;
    }
    struct planner_estimate est;
    CHECK(planner_estimate(&s, NULL, NULL, &est, &err) == 0);
    int st = est.mem.worst_stage, slots = est.mem.inflight;
    CHECK(st == 0 && slots == 2, "lora pp case: worst stage %d with %d in flight", st, slots);
    struct engine_place p = {
        .rank = st, .world = 2, .tp = 1, .dp = 1, .pp = 2, .frozen = 1, .windows_later = 1};
    struct backend *be = new_backend(cuda);
    struct engine *e = be ? engine_new(&s.model, &p, be) : NULL;
    size_t lo = 0, hi = 0;
    if (e) pp_stage_range(e, &lo, &hi);
    int ok = e && engine_set_windows(e, lo, hi, 0, 0) == 0 && engine_set_shard(e, lo, hi - lo) == 0;
    CHECK(ok, "lora pp case: stage %d's windows", st);
    struct model *m[4] = {0};
    struct model_opts mo = {.B = 2, .T = 64};
    for (int i = 0; ok && i < slots && i < 4; i++)
        ok = (m[i] = model_new_ex(e, &mo)) != NULL;
    const char *tg[] = {"q", "k", "v", "o", "gate", "up", "down"};
    /* lora_new only keeps the world communicator, for the gradient-norm
     * all-reduce and the export gather that this test never calls: a stand-in
     * pointer satisfies its check that a two-rank layout has one */
    static char no_comm;
    struct lora_opts lopt = {.rank = 32,
                             .alpha = 16,
                             .targets = tg,
                             .n_targets = 7,
                             .seed = 1,
                             .world = (struct comm *)&no_comm};
    const char *code = NULL;
    char lerr[256] = "";
    size_t base_acts = e ? e->mem.activations : 0;
    struct lora *l = ok ? lora_new(m[0], &lopt, &code, lerr, sizeof lerr) : NULL;
    CHECK(l != NULL, "lora pp case: %s", lerr);
    if (l) {
        CHECK(lora_reserve_slots(l, slots) == 0);
        const struct engine_mem *r = &e->mem;
        /* the adapters' share alone, exactly: against the same spec planned
         * without train.lora (the base's activations do not change) */
        struct loom_spec s0 = s;
        s0.train.lora.enabled = 0;
        struct planner_estimate e0;
        CHECK(planner_estimate(&s0, NULL, NULL, &e0, &err) == 0);
        double plan = est.mem.activations - e0.mem.activations;
        double real = (double)(r->activations - base_acts);
        printf("%s lora pp2 stage %d: adapters' activations %.0f/%.0f (real/estimate, bytes)\n",
               cuda ? "cuda" : "cpu", st, real, plan);
        CHECK(plan == real);
        printf("%s lora pp2 stage %d, %d in flight: params %zu/%.0f grads %zu/%.0f optimizer "
               "%zu/%.0f activations %zu/%.0f (real/estimate, bytes)\n",
               cuda ? "cuda" : "cpu", st, slots, r->params, est.mem.params, r->grads, est.mem.grads,
               r->optimizer, est.mem.optimizer, r->activations, est.mem.activations);
        CHECK(est.mem.params == (double)r->params && est.mem.grads == (double)r->grads &&
              est.mem.optimizer == (double)r->optimizer);
        CHECK(within(est.mem.activations, (double)r->activations, 0.10));
    }
    lora_free(l);
    for (int i = 0; i < 4; i++)
        model_free(m[i]);
    engine_free(e);
}

/* cuda, train.precision fp8 with LoRA on one GPU: the base held as E4M3
 * alone (worker/fp8base.h, model_fp8_freeze): params exactly the planner's
 * (the window less 1 byte a block linear weight), grads and optimizer the
 * adapters'. */
static void lora_fp8_case(const char *family, const char *targets) {
    char text[768];
    snprintf(text, sizeof text,
             "{\"model\":{\"family\":\"%s\",\"preset\":\"mini\",\"seq_len\":128},"
             "\"resources\":{\"device\":\"cuda\"},\"train\":{\"micro_batch\":2,"
             "\"precision\":\"fp8\",\"lora\":{\"rank\":8,\"alpha\":16,\"targets\":[%s]}}}",
             family, targets);
    struct loom_spec s;
    struct loom_error err;
    struct planner_estimate est;
    if (jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) != 0 ||
        planner_estimate(&s, NULL, NULL, &est, &err) != 0) {
        fprintf(stderr, "lora fp8 case %s: %s %s\n", family, err.code, err.message);
        check_failures++;
        return;
    }
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .frozen = 1};
    struct backend *be = new_backend(1);
    struct engine *e = be ? engine_new(&s.model, &p, be) : NULL;
    struct model *m = e ? model_new(e, 2, 128, 1) : NULL;
    const char *tg[JOBSPEC_LORA_TARGETS_MAX];
    for (int t = 0; t < s.train.lora.n_targets; t++)
        tg[t] = s.train.lora.targets[t];
    struct lora_opts lo = {
        .rank = 8, .alpha = 16, .targets = tg, .n_targets = s.train.lora.n_targets, .seed = 1};
    const char *code = NULL;
    char lerr[256] = "";
    struct lora *l = m ? lora_new(m, &lo, &code, lerr, sizeof lerr) : NULL;
    int n = 0;
    size_t bytes = 0;
    CHECK(l != NULL && model_fp8_freeze(m, 0, &n, &bytes) == 0 && e->fp8b != NULL,
          "lora fp8 case %s: %s", family, lerr);
    if (l && e->fp8b) {
        const struct engine_mem *r = &e->mem;
        printf("cuda lora fp8 %-5s mini B=2 T=128: %d weights held (%zu bytes); params %zu/%.0f "
               "grads %zu/%.0f optimizer %zu/%.0f (real/estimate, bytes)\n",
               family, n, bytes, r->params, est.mem.params, r->grads, est.mem.grads, r->optimizer,
               est.mem.optimizer);
        CHECK(est.mem.params == (double)r->params && est.mem.grads == (double)r->grads &&
              est.mem.optimizer == (double)r->optimizer);
    }
    if (m) m->lora = NULL;
    lora_free(l);
    model_free(m);
    engine_free(e);
}

int main(int argc, char **argv) {
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (cuda) {
#ifdef LOOM_HAVE_CUDA
        int rc = lcuda_probe();
        if (rc) return rc;
#else
        fprintf(stderr, "no GPU: built without CUDA\n");
        return 77;
#endif
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct lcase *k = &cases[i];
        char text[512];
        snprintf(text, sizeof text,
                 "{\"model\":{\"family\":\"%s\",\"preset\":\"%s\",\"seq_len\":%d},"
                 "\"parallel\":{\"dp\":%d,\"zero_stage\":%d},\"resources\":{\"device\":\"%s\"},"
                 "\"train\":{\"micro_batch\":%d}}",
                 k->family, k->preset, k->T, k->dp, k->zero, cuda ? "cuda" : "cpu", k->B);
        struct loom_spec s;
        struct loom_error err;
        if (jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) != 0) {
            fprintf(stderr, "case %zu: %s %s\n", i, err.code, err.message);
            check_failures++;
            continue;
        }
        struct planner_estimate est;
        CHECK(planner_estimate(&s, NULL, NULL, &est, &err) == 0);

        struct engine_place p = {.rank = 0, .world = k->dp, .tp = 1, .dp = k->dp, .pp = 1};
        struct backend *be = new_backend(cuda);
        CHECK(be != NULL);
        if (!be) continue;
        struct engine *e = engine_new(&s.model, &p, be);
        CHECK(e != NULL);
        if (!e) continue;
        size_t n = e->n_params, per = (n + k->dp - 1) / k->dp;
        if (k->zero >= 1) CHECK(engine_set_shard(e, 0, per) == 0);
        struct model *m = model_new(e, k->B, k->T, 1);
        CHECK(m != NULL);
        const struct engine_mem *r = &e->mem;
        int ok = est.mem.params == (double)r->params && est.mem.grads == (double)r->grads &&
                 within(est.mem.optimizer, (double)r->optimizer, 0.10) &&
                 within(est.mem.activations, (double)r->activations, 0.10);
        double est_sum = est.mem.params + est.mem.grads + est.mem.optimizer + est.mem.activations;
        double real_sum = (double)(r->params + r->grads + r->optimizer + r->activations);
        ok &= within(est_sum, real_sum, 0.10);
        printf("%s %-5s %-4s B=%d T=%3d dp=%d zero=%d: params %zu/%.0f grads %zu/%.0f optimizer "
               "%zu/%.0f activations %zu/%.0f (real/estimate, bytes; total off by %+.2f%%)\n",
               cuda ? "cuda" : "cpu", k->family, k->preset, k->B, k->T, k->dp, k->zero, r->params,
               est.mem.params, r->grads, est.mem.grads, r->optimizer, est.mem.optimizer,
               r->activations, est.mem.activations, 100 * (est_sum - real_sum) / real_sum);
        CHECK(ok);
        model_free(m);
        engine_free(e);
    }
    /* recompute: full, the budget mode ({"budget_gib": N} halfway between
     * full and none: the planner's keep, allocated by the engine) and selective */
    static const char *const rc_fam[] = {"gpt2", "llama"};
    for (int fi = 0; fi < 2; fi++) {
        for (int budget = 0; budget < 3; budget++) {
            int sel = budget == 2;
            const char *fmt = "{\"model\":{\"family\":\"%s\",\"preset\":\"mini\",\"seq_len\":"
                              "128},\"resources\":{\"device\":\"%s\"},\"train\":{\"micro_batch\":2,"
                              "\"recompute\":%s}}";
            const char *dev = cuda ? "cuda" : "cpu";
            char text[512], rcs[64];
            snprintf(rcs, sizeof rcs, "%s", sel ? "\"selective\"" : "\"full\"");
            struct loom_spec s;
            struct loom_error err;
            struct planner_estimate lo, hi, est;
            int keep = 0;
            if (budget == 1) { /* the two ends first */
                snprintf(text, sizeof text, fmt, rc_fam[fi], dev, "\"full\"");
                CHECK(jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) == 0 &&
                      planner_estimate(&s, NULL, NULL, &lo, &err) == 0);
                snprintf(text, sizeof text, fmt, rc_fam[fi], dev, "\"none\"");
                CHECK(jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) == 0 &&
                      planner_estimate(&s, NULL, NULL, &hi, &err) == 0);
                snprintf(rcs, sizeof rcs, "{\"budget_gib\":%.9f}",
                         (lo.mem.total + hi.mem.total) / 2 / 1073741824.0);
            }
            snprintf(text, sizeof text, fmt, rc_fam[fi], dev, rcs);
            if (jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) != 0) {
                fprintf(stderr, "recompute case: %s %s\n", err.code, err.message);
                check_failures++;
                continue;
            }
            CHECK(planner_estimate(&s, NULL, NULL, &est, &err) == 0);
            double floor_gib;
            if (budget == 1) {
                CHECK(planner_recompute_keep(&s, 0, &keep, &floor_gib, &err) == 0);
                CHECK(keep > 0 && keep < est.mem.layers);
            }
            struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
            struct backend *be = new_backend(cuda);
            CHECK(be != NULL);
            if (!be) continue;
            struct engine *e = engine_new(&s.model, &p, be);
            CHECK(e != NULL);
            if (!e) continue;
            struct model_opts mo = {.B = 2,
                                    .T = 128,
                                    .threads = 1,
                                    .recompute =
                                        sel ? MODEL_RECOMPUTE_SELECTIVE : MODEL_RECOMPUTE_FULL,
                                    .keep = keep};
            struct model *m = model_new_ex(e, &mo);
            CHECK(m != NULL);
            const struct engine_mem *r = &e->mem;
            printf("%s %-5s mini B=2 T=128 recompute %s (keep %d of %d): activations %zu/%.0f "
                   "(real/estimate, bytes)\n",
                   dev, rc_fam[fi],
                   sel      ? "selective"
                   : budget ? "budget"
                            : "full",
                   keep, est.mem.layers, r->activations, est.mem.activations);
            CHECK(within(est.mem.activations, (double)r->activations, 0.10));
            model_free(m);
            engine_free(e);
        }
    }
    for (size_t i = 0; i < sizeof lora_cases / sizeof *lora_cases; i++) {
        const struct lora_case *k = &lora_cases[i];
        if (k->tp > 1) {
            nf4_tp_case(k, cuda);
            continue;
        }
        char text[768];
        snprintf(text, sizeof text,
                 "{\"model\":{\"family\":\"%s\",\"preset\":\"%s\",\"seq_len\":%d%s},"
                 "\"parallel\":{\"tp\":%d},"
                 "\"resources\":{\"device\":\"%s\"},\"train\":{\"micro_batch\":%d,"
                 "\"lora\":{\"rank\":%d,\"alpha\":16,\"dropout\":%g,\"targets\":[%s]}%s}}",
                 k->family, k->preset, k->T, k->sizes, k->tp > 1 ? k->tp : 1, cuda ? "cuda" : "cpu",
                 k->B, k->rank, k->dropout, k->targets, k->nf4 ? ",\"quantize_base\":\"nf4\"" : "");
        struct loom_spec s;
        struct loom_error err;
        if (jobspec_parse_text(&s, text, strlen(text), JOBSPEC_FOR_PLAN, &err) != 0) {
            fprintf(stderr, "lora case %zu: %s %s\n", i, err.code, err.message);
            check_failures++;
            continue;
        }
        struct planner_estimate est;
        CHECK(planner_estimate(&s, NULL, NULL, &est, &err) == 0);
        int tp = k->tp > 1 ? k->tp : 1;
        struct engine_place p = {.rank = 0,
                                 .world = tp,
                                 .tp = tp,
                                 .dp = 1,
                                 .pp = 1,
                                 .frozen = 1,
                                 .windows_later = k->nf4};
        struct backend *be = new_backend(cuda);
        struct engine *e = be ? engine_new(&s.model, &p, be) : NULL;
        char qerr[256] = "";
        if (e && k->nf4 && nf4_attach(e, qerr, sizeof qerr) != 0) {
            fprintf(stderr, "lora case %zu: %s\n", i, qerr);
            engine_free(e);
            e = NULL;
        }
        struct model *m = e ? model_new(e, k->B, k->T, 1) : NULL;
        const char *tg[JOBSPEC_LORA_TARGETS_MAX];
        for (int t = 0; t < s.train.lora.n_targets; t++)
            tg[t] = s.train.lora.targets[t];
        struct lora_opts lo = {.rank = s.train.lora.rank,
                               .alpha = s.train.lora.alpha,
                               .dropout = s.train.lora.dropout,
                               .targets = tg,
                               .n_targets = s.train.lora.n_targets,
                               .seed = 1};
        const char *code = NULL;
        char lerr[256] = "";
        struct lora *l = m ? lora_new(m, &lo, &code, lerr, sizeof lerr) : NULL;
        CHECK(l != NULL, "lora case %zu: %s", i, lerr);
        if (!l) {
            model_free(m);
            engine_free(e);
            continue;
        }
        const struct engine_mem *r = &e->mem;
        int ok = est.mem.params == (double)r->params && est.mem.grads == (double)r->grads &&
                 est.mem.optimizer == (double)r->optimizer &&
                 within(est.mem.activations, (double)r->activations, 0.10);
        printf(
            "%s lora%s tp%d %-5s %-4s B=%d T=%3d r=%d dropout=%g: params %zu/%.0f grads %zu/%.0f "
            "optimizer %zu/%.0f activations %zu/%.0f (real/estimate, bytes)\n",
            cuda ? "cuda" : "cpu", k->nf4 ? " nf4" : "", tp, k->family, k->preset, k->B, k->T,
            k->rank, k->dropout, r->params, est.mem.params, r->grads, est.mem.grads, r->optimizer,
            est.mem.optimizer, r->activations, est.mem.activations);
        CHECK(ok);
        lora_free(l);
        model_free(m);
        engine_free(e);
    }
    lora_pp_case(cuda);
    if (cuda) {
        lora_fp8_case("llama", "\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"");
        lora_fp8_case("gpt2", "\"attn\",\"proj\",\"fc\",\"fc2\"");
    }
    return check_summary("test_planner_engine");
}
