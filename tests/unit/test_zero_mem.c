/* Memory that ZeRO-2/3 and pipeline parallelism promise is really allocated:
 * for a table of layouts (dp x tp x pp <= 4 ranks, ZeRO 0-3, gpt2 with tied
 * embeddings and llama), every rank builds the engine, the model and ZeRO
 * (zero_setup over a file rendezvous, forked processes) on a CPU backend
 * whose alloc/free are counted, and checks:
 *   1. the bytes live in the backend == e->mem params + grads + optimizer +
 *      activations (the step lines report what is allocated);
 *   2. e->mem params / grads / optimizer == zero_mem_model (worker/zero.h);
 *   3. both == the formulas written out here from the layout table:
 *        stage range P (pp: this stage's tensors), S = ceil(P/dp),
 *        X = tensors used off the range (tied embedding on the last stage),
 *        H = the stage's layer -1 group, K = min(2, blocks) x largest block;
 *        params  = (zero 3 ? S + H + K : P) + X
 *        grads   = (zero >= 2 ? S + H + K : P) + X
 *        optimizer = 8 * (zero >= 1 ? S : P) + 16   (fp32 CPU: master aliased)
 *   4. the windows really are that small: zero 3 params and zero >= 2 grads
 *      windows hold S elements; pp windows hold P.
 * Needs Gloo (exits 77 without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/pp.h"
#include "worker/zero.h"
#include "tests/check.h"

/* ---- counting backend: wraps the CPU backend's alloc/free */

#define MAXLIVE 4096
static void *(*real_alloc)(void *, size_t);
static void (*real_free)(void *, void *);
static struct {
    void *p;
    size_t n;
} live[MAXLIVE];
static size_t live_bytes, peak_bytes;

static void *count_alloc(void *ctx, size_t bytes) {
    void *p = real_alloc(ctx, bytes);
    for (int i = 0; p && i < MAXLIVE; i++)
        if (!live[i].p) {
            live[i].p = p;
            live[i].n = bytes;
            live_bytes += bytes;
            if (live_bytes > peak_bytes) peak_bytes = live_bytes;
            return p;
        }
    return p; /* table full: the byte check below then fails */
}

static void count_free(void *ctx, void *p) {
    for (int i = 0; p && i < MAXLIVE; i++)
        if (live[i].p == p) {
            live_bytes -= live[i].n;
            live[i].p = NULL;
            break;
        }
    real_free(ctx, p);
}

struct mcase {
    int llama, dp, tp, pp, zero;
};

static const struct mcase cases[] = {
    {0, 2, 1, 1, 0}, {0, 2, 1, 1, 1}, {0, 2, 1, 1, 2}, {0, 2, 1, 1, 3}, {0, 3, 1, 1, 2},
    {0, 3, 1, 1, 3}, {0, 4, 1, 1, 3}, {1, 2, 1, 1, 3}, {1, 4, 1, 1, 2}, {0, 1, 1, 2, 0},
    {0, 1, 1, 2, 3}, {0, 2, 1, 2, 2}, {0, 2, 1, 2, 3}, {1, 2, 1, 2, 3}, {0, 1, 1, 4, 1},
    {1, 1, 1, 4, 2}, {0, 2, 2, 1, 3}, {1, 2, 2, 1, 2}, {0, 1, 2, 2, 3}, {0, 1, 2, 2, 0},
};

static void model_cfg(int llama, struct model_config *c) {
    memset(c, 0, sizeof *c);
    model_config_family_defaults(c, llama ? MODEL_LLAMA : MODEL_GPT2);
    c->n_layer = 8;
    c->n_head = llama ? 8 : 4;
    c->n_kv_head = 4;
    c->d_model = llama ? 32 : 16;
    c->d_ff = llama ? 48 : 32;
    c->vocab_size = 100; /* padded to 128 */
    c->seq_len = 16;
    model_config_finalize(c);
}

/* One rank of case k; returns the number of failed checks. */
static int run_rank(const struct mcase *k, int rank, const char *dir) {
    int world = k->dp * k->tp * k->pp;
    struct model_config c;
    model_cfg(k->llama, &c);
    struct backend *be = backend_cpu_new(1);
    if (!be) return 1;
    real_alloc = be->alloc;
    real_free = be->free;
    be->alloc = count_alloc;
    be->free = count_free;
    /* the worker's order (worker/main.c): empty windows and no optimizer
     * state until ZeRO has sized them, then the weights */
    struct engine_place p = {.rank = rank,
                             .world = world,
                             .local_rank = rank,
                             .tp = k->tp,
                             .dp = k->dp,
                             .pp = k->pp,
                             .opt_later = 1,
                             .windows_later = 1};
    struct engine *e = engine_new(&c, &p, be);
    struct model *m = e ? model_new(e, 2, 16, 1) : NULL;
    if (!m) return 1;
    char rdzv[600], err[256];
    snprintf(rdzv, sizeof rdzv, "file:%s", dir);
    struct zero_setup_opts o = {.rank = rank,
                                .world = world,
                                .tp = k->tp,
                                .dp = k->dp,
                                .pp = k->pp,
                                .zero_stage = k->zero,
                                .device = "cpu",
                                .rdzv = rdzv,
                                .timeout_ms = 20000};
    struct zero *z = zero_setup(e, &o, err, sizeof err);
    if (!z) {
        fprintf(stderr, "rank %d: zero_setup: %s\n", rank, err);
        return 1;
    }
    if (engine_opt_init(e) != 0 || model_init_params(m, 5) != 0) return 1;
    char tag[96];
    snprintf(tag, sizeof tag, "%s dp%d tp%d pp%d z%d rank %d", k->llama ? "llama" : "gpt2", k->dp,
             k->tp, k->pp, k->zero, rank);
    const struct engine_mem *r = &e->mem;
    /* 1. reported == allocated */
    size_t rep = r->params + r->grads + r->optimizer + r->activations;
    CHECK(rep == live_bytes, "%s: reported %zu bytes, %zu live in the backend", tag, rep,
          live_bytes);
    /* 2. == zero_mem_model */
    struct engine_mem f;
    zero_mem_model(e, k->zero, k->dp, &f);
    CHECK(r->params == f.params && r->grads == f.grads && r->optimizer == f.optimizer,
          "%s: engine %zu/%zu/%zu, zero_mem_model %zu/%zu/%zu", tag, r->params, r->grads,
          r->optimizer, f.params, f.grads, f.optimizer);
    /* 3. == the formulas from the layout table */
    const struct model_layout *lay = &e->layout;
    int st = e->pp_idx, L = c.n_layer, nb = L / k->pp;
    size_t P = 0, X = 0, H = 0, B = 0;
    for (int i = 0; i < lay->n; i++) {
        const struct model_tensor *t = &lay->t[i];
        size_t n = (size_t)t->rank_numel;
        if (!model_tensor_on_stage(&c, t, k->pp, st)) continue;
        int owned = !(t->kind == MODEL_T_EMBED && st != 0);
        if (!owned) {
            X += n;
            continue;
        }
        P += n;
        if (t->layer < 0) H += n;
        if (t->layer == st * nb) B += n;
    }
    int di = rank / k->tp % k->dp; /* this rank's shard: the first P % dp are one larger */
    size_t S = P / k->dp + ((size_t)di < P % k->dp ? 1 : 0), K = (nb < 2 ? nb : 2) * B;
    int zs = k->dp == 1 && k->zero > 1 ? 1 : k->zero; /* dp 1: nothing to shard */
    size_t wp = (zs == 3 ? S + H + K : P) + X, wg = (zs >= 2 ? S + H + K : P) + X;
    size_t wo = 8 * (zs >= 1 ? S : P) + 16;
    CHECK(r->params == wp * 4 && r->grads == wg * 4 && r->optimizer == wo,
          "%s: engine %zu/%zu/%zu, formula %zu/%zu/%zu", tag, r->params, r->grads, r->optimizer,
          wp * 4, wg * 4, wo);
    /* 5. set-up never held more than the steady state (no whole-stage
     * buffers before ZeRO shrinks them); the empty windows' 1-element
     * placeholders are the only slack */
    CHECK(peak_bytes <= live_bytes + 2 * sizeof(float), "%s: set-up peak %zu bytes, steady %zu",
          tag, peak_bytes, live_bytes);
    /* 4. the windows */
    size_t pw = e->p_hi - e->p_lo, gw = e->g_hi - e->g_lo;
    CHECK(pw == (zs == 3 ? e->shard_n : P), "%s: params window %zu", tag, pw);
    CHECK(gw == (zs >= 2 ? e->shard_n : P), "%s: grads window %zu", tag, gw);
    CHECK(e->shard_n == (zs >= 1 ? S : P), "%s: shard of %zu elements (P=%zu dp=%d)", tag,
          e->shard_n, P, k->dp);
    /* 8 blocks, small vocabulary: without pp the shard plus the working set
     * is below the whole stage (with pp, 4 blocks per stage, it need not be) */
    if (zs == 3 && k->dp > 1 && k->pp == 1)
        CHECK(r->params < P * 4, "%s: no parameter saving", tag);
    if (zs >= 2 && k->dp > 1 && k->pp == 1) CHECK(r->grads < P * 4, "%s: no gradient saving", tag);
    printf("%-32s params %6zu grads %6zu optimizer %6zu bytes (whole stage: %zu)\n", tag, r->params,
           r->grads, r->optimizer, P * 4);
    fflush(stdout);
    CHECK(zero_barrier(z) == 0, "%s: final barrier", tag); /* nobody leaves early */
    zero_free(z);
    model_free(m);
    engine_free(e);
    return check_failures;
}

int main(void) {
#ifndef LOOM_HAVE_GLOO
    (void)cases, (void)run_rank;
    fprintf(stderr, "SKIP: built without Gloo (multi-rank cpu worlds need it)\n");
    return 77;
#else
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct mcase *k = &cases[i];
        int world = k->dp * k->tp * k->pp;
        char dir[] = "/tmp/loom-test-zmem-XXXXXX";
        if (!mkdtemp(dir)) return 1;
        fflush(stdout);
        pid_t pid[8];
        for (int r = 0; r < world; r++) {
            pid[r] = fork();
            if (pid[r] == 0) _exit(run_rank(k, r, dir) ? 1 : 0);
        }
        for (int r = 0; r < world; r++) {
            int status = 0;
            waitpid(pid[r], &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "case %zu rank %d failed\n", i, r);
                bad++;
            }
        }
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    if (bad) {
        fprintf(stderr, "test_zero_mem: %d rank(s) failed\n", bad);
        return 1;
    }
    printf("test_zero_mem: all checks passed\n");
    return 0;
#endif
}
