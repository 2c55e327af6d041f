/* Tensor / pipeline parallel equivalence of the real loom-worker on the cpu
 * backend (Gloo), launched with --nproc (worker/launch.c).
 *
 * The oracle is the single-process run with the same global batch: for each
 * layout of the table (family, dp, tp, pp, zero stage, schedule, micro-steps)
 * the per-step loss and global grad norm must match it within REL_TOL
 * relative over all STEPS steps (grad_clip low enough that clipping is
 * active, so the global norm over tp shares, stages and shards matters).
 * Also checked on the step lines (table-driven, docs/parallelism.md):
 * - pipeline: "pp.inflight" per stage = the schedule's bound (GPipe M, 1F1B
 *   min(pp - stage, M)), "pp.bubble_ideal" = (pp-1)/(M+pp-1), a measured
 *   bubble per stage; GPipe's stage-0 activation memory = M/min(pp, M) times
 *   1F1B's (one activation slot per micro-batch in flight);
 * - memory: rank 0's params/grads/optimizer = its stage's tp share of the
 *   parameters (api/model.h layout) as the ZeRO formulas say.
 * Checkpoints: a tp2 x pp2 run stopped at step STEPS/2 resumes in one process
 * and at dp2 (reshard across tp, pp and dp) and continues on the curve.
 *
 * Models: GPT-2 (tied embeddings, biases, LayerNorm, GELU) and Llama
 * (grouped-query attention 8/4 heads, RMSNorm, SwiGLU, RoPE, untied head),
 * 4 layers, tiny widths so each run takes a few seconds.
 *
 * Usage: test_par_equiv LOOM_WORKER tp|pp|mix|ckpt */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "api/jobspec.h"
#include "api/model.h"
#include "api/planner.h"
#include "worker/data.h"
#include "worker/safetensors.h"
#include "tests/integration/equiv_harness.h"

#define STEPS   20
#define REL_TOL 1e-5
/* final weights (--export): max |a - b| / (1 + |b|); Adam turns grad-norm
 * differences of 1e-6 into weight differences of this order */
#define PARAM_TOL 5e-5
#define SEQ       16
#define MICRO     2
#define MAXPP     4

static const char *worker;
static char dir[256];

struct layout {
    const char *tag;
    int llama;
    int dp, tp, pp, zero;
    const char *sched; /* "1f1b" / "gpipe" */
    int micro_total;   /* micro-batches per step over all dp ranks */
    int layers;        /* 0: 4 */
    int recompute;     /* 0 none, 1 selective, 2 full */
    int pp_balance;    /* parallel.pp_balance: blocks split by work, not n_layer/pp */
};

/* > 0: the next spec written has train.recompute {"budget_gib": N} instead
 * of the layout's `recompute` (budget()) */
static double spec_budget_gib;

struct run {
    int ok, steps_seen;
    double loss[STEPS + 1], norm[STEPS + 1];
    double val[STEPS + 1]; /* val_loss of the eval lines (0: none at that step) */
    int evals;
    double mem[5]; /* params, grads, optimizer, activations, comm (GiB), last step */
    int have_pp, pp_micro, inflight[MAXPP], nbubble;
    double bubble_ideal, bubble_ms[MAXPP];
    double start_act; /* activations (GiB) allocated per the start-up memory line; -1: none */
};

static void model_cfg(int llama, int layers, int pp_balance, struct model_config *c) {
    memset(c, 0, sizeof *c);
    model_config_family_defaults(c, llama ? MODEL_LLAMA : MODEL_GPT2);
    c->n_layer = layers ? layers : 4;
    c->n_head = llama ? 8 : 4;
    c->n_kv_head = llama ? 4 : 4;
    c->d_model = llama ? 32 : 16;
    c->d_ff = llama ? 48 : 32;
    c->vocab_size = 256;
    c->seq_len = SEQ;
    model_config_finalize(c);
    c->pp_balance = pp_balance;
}

static void write_spec(const char *path, const struct layout *l) {
    struct model_config c;
    model_cfg(l->llama, l->layers, l->pp_balance, &c);
    char rc[64];
    if (spec_budget_gib > 0)
        snprintf(rc, sizeof rc, "{\"budget_gib\":%.12g}", spec_budget_gib);
    else
        snprintf(rc, sizeof rc, "\"%s\"",
                 l->recompute == 2   ? "full"
                 : l->recompute == 1 ? "selective"
                                     : "none");
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f,
            "{\"name\":\"par-equiv\",\"model\":{\"family\":\"%s\",\"n_layer\":%d,\"n_head\":%d,"
            "\"n_kv_head\":%d,\"d_model\":%d,\"d_ff\":%d,\"vocab_size\":%d,\"seq_len\":%d},"
            "\"data\":{\"train\":\"%s/train_*.bin\",\"val\":\"%s/train_000.bin\"},"
            "\"parallel\":{\"dp\":%d,\"tp\":%d,\"pp\":%d,\"zero_stage\":%d,\"pp_balance\":%s},"
            "\"train\":{\"steps\":%d,\"global_batch_tokens\":%d,\"micro_batch\":%d,"
            "\"lr\":0.003,\"min_lr\":0.0003,\"warmup_steps\":3,\"weight_decay\":0.1,"
            "\"grad_clip\":0.5,\"seed\":7,\"eval_every\":%d,\"eval_batches\":2,"
            "\"recompute\":%s},"
            "\"checkpoint\":{\"every_steps\":%d,\"keep\":5},"
            "\"resources\":{\"device\":\"cpu\"}}",
            l->llama ? "llama" : "gpt2", c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.d_ff,
            c.vocab_size, SEQ, dir, dir, l->dp, l->tp, l->pp, l->zero,
            l->pp_balance ? "true" : "false", STEPS, l->micro_total * MICRO * SEQ, MICRO, STEPS / 2,
            rc, STEPS / 2);
    fclose(f);
}

static void parse(const char *path, struct run *r) {
    memset(r, 0, sizeof(*r));
    r->start_act = -1;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "memory") == 0)
            r->start_act = json_real_value(
                json_object_get(json_object_get(j, "allocated_gib"), "activations"));
        if (type && strcmp(type, "eval") == 0) {
            int s = (int)json_integer_value(json_object_get(j, "step"));
            if (s >= 1 && s <= STEPS) {
                r->val[s] = json_real_value(json_object_get(j, "val_loss"));
                r->evals++;
            }
        }
        if (type && strcmp(type, "step") == 0) {
            int s = (int)json_integer_value(json_object_get(j, "step"));
            if (s >= 1 && s <= STEPS) {
                r->loss[s] = json_real_value(json_object_get(j, "loss"));
                r->norm[s] = json_real_value(json_object_get(j, "grad_norm"));
                r->steps_seen++;
                json_t *m = json_object_get(j, "mem");
                static const char *keys[] = {"params", "grads", "optimizer", "activations", "comm"};
                for (int k = 0; k < 5; k++)
                    r->mem[k] = json_real_value(json_object_get(m, keys[k]));
                json_t *pp = json_object_get(j, "pp");
                if (pp) {
                    r->have_pp = 1;
                    r->pp_micro = (int)json_integer_value(json_object_get(pp, "micro"));
                    r->bubble_ideal = json_real_value(json_object_get(pp, "bubble_ideal"));
                    json_t *inf = json_object_get(pp, "inflight"),
                           *ms = json_object_get(pp, "bubble_ms");
                    r->nbubble = (int)json_array_size(ms);
                    for (size_t k = 0; k < json_array_size(inf) && k < MAXPP; k++)
                        r->inflight[k] = (int)json_integer_value(json_array_get(inf, k));
                    for (size_t k = 0; k < json_array_size(ms) && k < MAXPP; k++)
                        r->bubble_ms[k] = json_real_value(json_array_get(ms, k));
                }
            }
        }
        json_decref(j);
    }
    fclose(f);
}

static void train(const struct layout *l, struct run *r, const char *out_dir, int steps) {
    char spec[512], out[512], of[512], ex[512];
    snprintf(spec, sizeof(spec), "%s/%s.json", dir, l->tag);
    snprintf(out, sizeof(out), "%s/%s", dir, out_dir ? out_dir : l->tag);
    snprintf(of, sizeof(of), "%s/%s.%d.jsonl", dir, l->tag, steps);
    write_spec(spec, l);
    snprintf(ex, sizeof(ex), "%s/%s.safetensors", dir, l->tag);
    int rc = equiv_run_worker(worker, spec, out, of, l->dp * l->tp * l->pp,
                              l->sched ? l->sched : "1f1b", steps == 0 ? ex : NULL, steps);
    CHECK(rc == 0, "%s: loom-worker exited %d (see stderr)", l->tag, rc);
    parse(of, r);
    r->ok = rc == 0;
}

static double rel(double a, double b) {
    return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12);
}

/* val: also compare the evaluation losses (dp = 1 only: eval_batches counts
 * per dp rank, so a dp2 run evaluates a different, larger set). */
static void compare(const char *tag, const struct run *a, const struct run *ref, int from, int to,
                    int val) {
    double worst = 0, worst_norm = 0;
    for (int s = from; s <= to; s++) {
        double d = rel(a->loss[s], ref->loss[s]), dn = rel(a->norm[s], ref->norm[s]);
        worst = d > worst ? d : worst;
        worst_norm = dn > worst_norm ? dn : worst_norm;
    }
    CHECK(worst <= REL_TOL, "%s: loss differs from the single-process run by %.3g relative", tag,
          worst);
    CHECK(worst_norm <= REL_TOL, "%s: grad norm differs by %.3g relative", tag, worst_norm);
    double worst_val = 0;
    int evals = 0;
    for (int s = from; s <= to; s++) {
        if (ref->val[s] == 0) continue;
        evals++;
        double d = rel(a->val[s], ref->val[s]);
        worst_val = d > worst_val ? d : worst_val;
    }
    if (val)
        CHECK(evals >= 1 && worst_val <= REL_TOL, "%s: %d evaluations, val_loss differs by %.3g",
              tag, evals, worst_val);
    fprintf(stderr, "%-22s loss rel diff max %.2e, grad-norm %.2e, val %.2e%s (steps %d..%d)\n",
            tag, worst, worst_norm, worst_val, val ? "" : " (dp>1: other eval set)", from, to);
}

/* The exports (--export, gathered from every tp share and stage) of a layout
 * and of its single-process reference hold the same weights. */
static void compare_weights(const char *tag, const char *ref_tag) {
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/%s.safetensors", dir, tag);
    snprintf(b, sizeof b, "%s/%s.safetensors", dir, ref_tag);
    equiv_compare_exports(tag, a, b, PARAM_TOL);
}

/* The pipeline figures of rank 0's step lines against the schedule's formulas. */
static void check_pipeline(const struct layout *l, const struct run *r) {
    if (l->pp == 1) {
        CHECK(!r->have_pp, "%s: pp figures without a pipeline", l->tag);
        return;
    }
    int M = l->micro_total / l->dp, gpipe = strcmp(l->sched, "gpipe") == 0;
    CHECK(r->have_pp && r->pp_micro == M, "%s: pp.micro %d, want %d", l->tag, r->pp_micro, M);
    /* the micro-batch slots exist before the first step: the start-up memory
     * line (planner beside allocation) already counts them */
    CHECK(r->start_act > 0 && fabs(r->start_act - r->mem[3]) <= 1e-9,
          "%s: start-up memory line %.9f GiB of activations, steps hold %.9f", l->tag, r->start_act,
          r->mem[3]);
    CHECK(fabs(r->bubble_ideal - (double)(l->pp - 1) / (M + l->pp - 1)) < 1e-12,
          "%s: bubble_ideal %g, want (pp-1)/(M+pp-1)", l->tag, r->bubble_ideal);
    CHECK(r->nbubble == l->pp, "%s: %d bubble figures for %d stages", l->tag, r->nbubble, l->pp);
    for (int s = 0; s < l->pp && s < MAXPP; s++) {
        int want = gpipe ? M : (l->pp - s < M ? l->pp - s : M);
        CHECK(r->inflight[s] == want, "%s: stage %d held %d micro-batches, schedule bound %d",
              l->tag, s, r->inflight[s], want);
        CHECK(r->bubble_ms[s] >= 0, "%s: stage %d bubble %g ms", l->tag, s, r->bubble_ms[s]);
    }
}

/* Rank 0 (stage 0, tp rank 0, dp rank 0) reports its stage's tp share. */
static void check_memory(const struct layout *l, const struct run *r) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    struct model_config c;
    model_cfg(l->llama, l->layers, l->pp_balance, &c);
    struct model_layout lay;
    if (model_layout_init(&lay, &c, l->tp) != 0) {
        CHECK(0, "%s: layout", l->tag);
        return;
    }
    double P = (double)model_layout_stage_numel(&lay, &c, l->pp, 0);
    /* ZeRO >= 2 keep the stage's embeddings/head group whole (stage 3: its
     * parameters gathered, stage >= 2: its gradients) plus two block slots */
    double head = 0, block = 0;
    for (int i = 0; i < lay.n; i++) {
        if (lay.t[i].layer < 0 && model_tensor_on_stage(&c, &lay.t[i], l->pp, 0))
            head += (double)lay.t[i].rank_numel;
        if (lay.t[i].layer == 0) block += (double)lay.t[i].rank_numel;
    }
    int nb = c.n_layer / l->pp;
    double work = head + (nb < 2 ? nb : 2) * block;
    model_layout_free(&lay);
    double S = ceil(P / l->dp);
    int zs = l->dp == 1 && l->zero > 1 ? 1 : l->zero; /* dp 1: nothing to shard */
    double want[3] = {(zs == 3 ? S + work : P) * 4, (zs >= 2 ? S + work : P) * 4,
                      8 * (zs >= 1 ? S : P) + 16};
    static const char *names[] = {"params", "grads", "optimizer"};
    for (int k = 0; k < 3; k++)
        if (want[k] >= 0)
            CHECK(fabs(r->mem[k] * GiB - want[k]) <= 0.5, "%s: mem.%s = %.0f bytes, formula %.0f",
                  l->tag, names[k], r->mem[k] * GiB, want[k]);
}

/* The layouts of each part; every layout is run for both families. */
/* tp runs are communication-bound on a small CI machine (several
 * all-reduces per block and micro-step): 2 layers, 2 micro-batches. */
static const struct layout tp_part[] = {
    {"tp2", 0, 1, 2, 1, 0, "1f1b", 2, 2, 0, 0},
    {"tp4", 0, 1, 4, 1, 0, "1f1b", 2, 2, 0, 0},
    {"dp2xtp2.z1", 0, 2, 2, 1, 1, "1f1b", 2, 2, 0, 0},
    {"dp2xtp2.z3", 0, 2, 2, 1, 3, "1f1b", 2, 2, 0, 0},
};
static const struct layout pp_part[] = {
    {"pp2.1f1b", 0, 1, 1, 2, 0, "1f1b", 4, 0, 0, 0},
    {"pp2.gpipe", 0, 1, 1, 2, 0, "gpipe", 4, 0, 0, 0},
    {"pp4.1f1b", 0, 1, 1, 4, 0, "1f1b", 4, 0, 0, 0},
    {"pp4.gpipe", 0, 1, 1, 4, 0, "gpipe", 4, 0, 0, 0},
    {"pp2.accum8", 0, 1, 1, 2, 0, "1f1b", 8, 0, 0, 0},
    /* blocks split by work: gpt2's head weighs 1.6 blocks here (3 + 1, 2 + 1 + 1);
     * llama's under 1 block (2 + 2, 2 + 1 + 1) */
    {"pp2.balance", 0, 1, 1, 2, 0, "1f1b", 4, 0, 0, 1},
    {"pp3.balance", 0, 1, 1, 3, 0, "1f1b", 4, 0, 0, 1},
};
static const struct layout mix_part[] = {
    {"tp2xpp2", 0, 1, 2, 2, 0, "1f1b", 2, 2, 0, 0},
    {"tp2xpp2.recompute-full", 0, 1, 2, 2, 0, "1f1b", 2, 2, 2, 0},
    {"pp2.recompute-sel", 0, 1, 1, 2, 0, "gpipe", 4, 0, 1, 0},
    {"dp2xpp2", 0, 2, 1, 2, 0, "1f1b", 4, 0, 0, 0},
    {"dp2xpp2.z1", 0, 2, 1, 2, 1, "gpipe", 4, 0, 0, 0},
};

static void equivalence(const struct layout *tab, int n) {
    for (int fam = 0; fam < 2; fam++) {
        for (int i = 0; i < n; i++) {
            struct layout l = tab[i];
            l.llama = fam;
            char tag[48], rtag[48];
            snprintf(tag, sizeof tag, "%s.%s", fam ? "llama" : "gpt2", tab[i].tag);
            snprintf(rtag, sizeof rtag, "%s.%s.ref", fam ? "llama" : "gpt2", tab[i].tag);
            /* the single-process run of the same model and global batch */
            struct layout one = {rtag, fam, 1, 1, 1, 0, "1f1b", l.micro_total, l.layers, 0, 0};
            struct run ref, r;
            train(&one, &ref, NULL, 0);
            CHECK(ref.steps_seen == STEPS, "%s: %d steps", rtag, ref.steps_seen);
            l.tag = tag;
            train(&l, &r, NULL, 0);
            CHECK(r.steps_seen == STEPS, "%s: %d step lines, want %d", tag, r.steps_seen, STEPS);
            if (r.steps_seen != STEPS || ref.steps_seen != STEPS) continue;
            compare(tag, &r, &ref, 1, STEPS, l.dp == 1);
            if (l.pp_balance && fam == 0) { /* gpt2's head weighs 1.6 blocks: uneven */
                struct model_config c;
                int a0, a1, z0, z1;
                model_cfg(fam, l.layers, 1, &c);
                model_stage_layers(&c, l.pp, 0, &a0, &a1);
                model_stage_layers(&c, l.pp, l.pp - 1, &z0, &z1);
                CHECK(a1 - a0 > z1 - z0, "%s: stage 0 has %d blocks, the last %d", tag, a1 - a0,
                      z1 - z0);
            }
            compare_weights(tag, rtag);
            check_pipeline(&l, &r);
            check_memory(&l, &r);
        }
    }
}

/* GPipe keeps every micro-batch's activations, 1F1B at most pp - stage. */
static void activation_ratio(void) {
    struct layout a = {"gpt2.act.1f1b", 0, 1, 1, 2, 0, "1f1b", 4, 0, 0, 0};
    struct layout b = {"gpt2.act.gpipe", 0, 1, 1, 2, 0, "gpipe", 4, 0, 0, 0};
    struct run ra, rb;
    train(&a, &ra, NULL, 2);
    train(&b, &rb, NULL, 2);
    double ratio = rb.mem[3] / ra.mem[3];
    CHECK(fabs(ratio - 2.0) < 1e-9, "stage-0 activations gpipe/1f1b = %.6f, want 4/2", ratio);
    fprintf(stderr, "activations stage 0: 1f1b %.0f bytes, gpipe %.0f bytes (ratio %.3f)\n",
            ra.mem[3] * 1073741824.0, rb.mem[3] * 1073741824.0, ratio);
}

/* tp2 x pp2 stopped at STEPS/2, resumed in one process and at dp2. */
static void checkpoints(void) {
    for (int fam = 0; fam < 2; fam++) {
        const char *fn = fam ? "llama" : "gpt2";
        char t0[32], t1[32], t2[32], t3[32];
        snprintf(t0, sizeof t0, "%s.ref4", fn);
        snprintf(t1, sizeof t1, "%s.tp2xpp2.half", fn);
        snprintf(t2, sizeof t2, "%s.resume.dp1", fn);
        snprintf(t3, sizeof t3, "%s.resume.dp2", fn);
        struct layout ref = {t0, fam, 1, 1, 1, 0, "1f1b", 4, 0, 0, 0};
        struct layout half = {t1, fam, 1, 2, 2, 0, "1f1b", 4, 0, 0, 0};
        struct layout one = {t2, fam, 1, 1, 1, 0, "1f1b", 4, 0, 0, 0};
        struct layout two = {t3, fam, 2, 1, 1, 1, "1f1b", 4, 0, 0, 0};
        struct run rr, rh, r1, r2;
        train(&ref, &rr, NULL, 0);
        train(&half, &rh, NULL, STEPS / 2);
        CHECK(rh.steps_seen == STEPS / 2, "%s: %d steps", t1, rh.steps_seen);
        /* copy the checkpoint dir for the second resume */
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "cp -r %s/%s %s/%s.copy", dir, t1, dir, t1);
        CHECK(system(cmd) == 0, "copy");
        char copy[64];
        snprintf(copy, sizeof copy, "%s.copy", t1);
        train(&one, &r1, t1, 0);
        train(&two, &r2, copy, 0);
        CHECK(r1.steps_seen == STEPS / 2 && r2.steps_seen == STEPS / 2,
              "resumed runs did %d and %d steps, want %d", r1.steps_seen, r2.steps_seen, STEPS / 2);
        compare(t1, &rh, &rr, 1, STEPS / 2, 1);
        compare(t2, &r1, &rr, STEPS / 2 + 1, STEPS, 1);
        compare(t3, &r2, &rr, STEPS / 2 + 1, STEPS, 0);
    }
}

/* The planner's memory (the worst stage, bytes) of a layout's spec. */
static double planned_total(const struct layout *l) {
    char spec[512];
    snprintf(spec, sizeof spec, "%s/%s.plan.json", dir, l->tag);
    write_spec(spec, l);
    FILE *f = fopen(spec, "r");
    char text[4096];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    struct loom_spec s;
    struct loom_error err;
    struct planner_estimate est;
    if (jobspec_parse_text(&s, text, n, JOBSPEC_FOR_PLAN, &err) != 0 ||
        planner_estimate(&s, NULL, NULL, &est, &err) != 0) {
        CHECK(0, "%s: planner: %s %s", l->tag, err.code, err.message);
        return 0;
    }
    return est.mem.total;
}

/* train.recompute {"budget_gib": N} (the worker asks the planner how many
 * blocks keep their activations, the rest recompute): a budget halfway
 * between every block recomputed and none trains the same curve as no
 * recompute, with activations between the two. */
static void budget(void) {
    for (int fam = 0; fam < 2; fam++) {
        for (int pp = 1; pp <= 2; pp++) {
            char tn[48], tf[48], tb[48];
            const char *f = fam ? "llama" : "gpt2";
            snprintf(tn, sizeof tn, "%s.pp%d.rc-none", f, pp);
            snprintf(tf, sizeof tf, "%s.pp%d.rc-full", f, pp);
            snprintf(tb, sizeof tb, "%s.pp%d.rc-budget", f, pp);
            struct layout none = {tn, fam, 1, 1, pp, 0, "1f1b", 4, 8, 0, 0};
            struct layout full = none, bud = none;
            full.tag = tf;
            full.recompute = 2;
            bud.tag = tb;
            double lo = planned_total(&full), hi = planned_total(&none);
            CHECK(lo > 0 && hi > lo, "%s: planned %.0f (full) and %.0f (none) bytes", tb, lo, hi);
            double gib = (lo + hi) / 2 / (1024.0 * 1024.0 * 1024.0);
            struct run rn, rf, rb;
            train(&none, &rn, NULL, 0);
            train(&full, &rf, NULL, 0);
            spec_budget_gib = gib;
            train(&bud, &rb, NULL, 0);
            spec_budget_gib = 0;
            CHECK(rb.steps_seen == STEPS && rn.steps_seen == STEPS, "%s: %d and %d steps", tb,
                  rb.steps_seen, rn.steps_seen);
            if (rb.steps_seen != STEPS || rn.steps_seen != STEPS) continue;
            compare(tb, &rb, &rn, 1, STEPS, 1);
            for (int s = 1; pp == 1 && s <= STEPS; s++)
                CHECK(rb.loss[s] == rn.loss[s], "%s step %d: loss %.17g, without recompute %.17g",
                      tb, s, rb.loss[s], rn.loss[s]);
            double an = rn.mem[3], af = rf.mem[3], ab = rb.mem[3];
            fprintf(stderr, "%-22s budget %.6f GiB: activations %.6f GiB (full %.6f, none %.6f)\n",
                    tb, gib, ab, af, an);
            if (pp == 1)
                CHECK(ab > af && ab < an,
                      "%s: activations %.9g GiB not between full %.9g and none "
                      "%.9g",
                      tb, ab, af, an);
            else
                CHECK(ab >= af && ab <= an,
                      "%s: activations %.9g GiB outside full %.9g .. none "
                      "%.9g",
                      tb, ab, af, an);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_par_equiv LOOM_WORKER tp|pp|mix|ckpt|budget\n");
        return 2;
    }
#ifndef LOOM_HAVE_GLOO
    printf("SKIP: built without Gloo; tp/pp > 1 on cpu needs it\n");
    return 77;
#endif
    worker = argv[1];
    snprintf(dir, sizeof(dir), "/tmp/loom-test-par-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char derr[256];
    CHECK(equiv_make_data(dir, derr, sizeof(derr)) == 0, "%s", derr);
    if (strcmp(argv[2], "tp") == 0)
        equivalence(tp_part, sizeof tp_part / sizeof *tp_part);
    else if (strcmp(argv[2], "pp") == 0) {
        equivalence(pp_part, sizeof pp_part / sizeof *pp_part);
        activation_ratio();
    } else if (strcmp(argv[2], "mix") == 0)
        equivalence(mix_part, sizeof mix_part / sizeof *mix_part);
    else if (strcmp(argv[2], "ckpt") == 0)
        checkpoints();
    else if (strcmp(argv[2], "budget") == 0)
        budget();
    else
        return 2;
    if (!check_failures) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "test_par_equiv %s: %d failure(s); files kept in %s\n", argv[2],
                check_failures, dir);
    }
    return check_failures ? 1 : 0;
}
