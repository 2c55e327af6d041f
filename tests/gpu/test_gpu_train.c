/* GPU training tests through the real engine (worker/model.c, train.c):
 *  - loss curve: 50 steps of a small GPT-2 and a small Llama (GQA, RoPE,
 *    RMSNorm, SwiGLU) on the CUDA backend follow the cpu fp32 backend's
 *    curve: every step within 5% relative, the mean within 2% (bf16
 *    tolerance of the kind llm.c and Megatron use), and the loss must fall;
 *  - resume: 10 steps, snapshot of params / master / moments to the host,
 *    a fresh engine restored from it and 10 more steps give the same losses
 *    and final parameters bit for bit as 20 uninterrupted steps;
 *  - determinism: the same 20 steps twice give the same bits;
 *  - optimizer offload variants: the portable CPU kernels with one
 *    cudaHostAlloc give the same bits as the default (SIMD, registered
 *    pieces); the delayed update gives the same bits with async and
 *    synchronous copies, learns, and differs from the undelayed run;
 *  - optimizer offload (worker/offload.h): 20 steps with the fp32 master and
 *    moments in host memory and AdamW on the CPU follow the on-device run
 *    within the curve tolerances above (the CPU and the GPU round AdamW's
 *    intermediate results differently), the async copies (copy streams,
 *    early downloads, chunked pipeline) give the same bits as the synchronous
 *    fallback, and the device holds no optimizer state (16-byte norm scalar),
 *    the host shard * (12 + 2) bytes.
 * Exits 77 ("no GPU") where no CUDA device is found. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_util.h"
#include "worker/offload.h"
#include "worker/offload_adamw.h"
#include "worker/train.h"

#define STEPS    50
#define TOL_STEP 5e-2
#define TOL_MEAN 2e-2
#define B_SEQ    4
#define T_SEQ    64
#define VOCAB    61

static int fails;

static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    for (int b = 0; b < B_SEQ; b++) {
        int64_t sample = step * B_SEQ + b;
        uint64_t h = (uint64_t)sample * 0x9e3779b97f4a7c15ull + 12345;
        int stride = 1 + (int)(h % 5);
        int32_t cur = (int32_t)((h >> 20) % VOCAB);
        for (int t = 0; t < T_SEQ; t++) {
            uint64_t nz = (h >> (t % 40)) & 7;
            int32_t next = (cur + stride + (nz == 0)) % VOCAB; /* a little noise */
            in[b * T_SEQ + t] = cur;
            tg[b * T_SEQ + t] = next;
            cur = next;
        }
    }
    return 0;
}

static struct model_config config(enum model_family f) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, f);
    c.n_layer = 2;
    c.n_head = f == MODEL_LLAMA ? 4 : 2;
    c.n_kv_head = f == MODEL_LLAMA ? 2 : 2;
    c.d_model = f == MODEL_LLAMA ? 128 : 64;
    c.d_ff = f == MODEL_LLAMA ? 128 : 256;
    c.vocab_size = VOCAB;
    c.seq_len = T_SEQ;
    model_config_finalize(&c);
    return c;
}

static struct train_opts opts(int64_t steps) {
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = steps;
    o.grad_accum = 1;
    o.global_batch_tokens = (int64_t)B_SEQ * T_SEQ;
    o.optim = (struct optim_cfg){.lr = 3e-3,
                                 .min_lr = 3e-4,
                                 .warmup = 5,
                                 .steps = steps,
                                 .schedule = OPTIM_COSINE,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 1.0};
    o.train.batch = src_batch;
    return o;
}

struct run {
    struct engine *e;
    struct model *m;
};

/* offload: 0 off, 1 on (async copies), 2 on with synchronous copies, 3 on
 * with the portable CPU kernels and one cudaHostAlloc (offload-isa baseline,
 * offload-pin alloc), 4 the delayed update (async), 5 the delayed update with
 * synchronous copies; small chunks (64 KiB) so that the pipeline has several. */
static int run_new_ex(struct run *r, enum model_family f, int cuda, int offload) {
    struct model_config c = config(f);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    p.opt_later = offload != 0;
    struct backend *be = cuda ? backend_cuda_new(0) : backend_cpu_new(0);
    if (!be) return -1;
    r->e = engine_new(&c, &p, be);
    if (!r->e) return -1;
    struct offload_opts oo = {.chunk_bytes = 64 << 10,
                              .sync = offload == 2 || offload == 5,
                              .isa = offload == 3 ? OADAM_BASELINE : OADAM_AUTO,
                              .pin = offload == 3 ? OFFLOAD_PIN_ALLOC : OFFLOAD_PIN_REGISTER,
                              .delayed = offload >= 4};
    if (offload && (engine_offload_enable(r->e, &oo) != 0 || engine_opt_init(r->e) != 0)) return -1;
    r->m = model_new(r->e, B_SEQ, T_SEQ, 0);
    if (!r->m || model_init_params(r->m, 42) != 0) return -1;
    return 0;
}

static int run_new(struct run *r, enum model_family f, int cuda) {
    return run_new_ex(r, f, cuda, 0);
}

static void run_free(struct run *r) {
    model_free(r->m);
    engine_free(r->e);
}

/* Steps [from, to) of run r; losses into out[step]. */
static int steps(struct run *r, int64_t from, int64_t to, int64_t total, double *out) {
    struct train_opts o = opts(total);
    int32_t in[B_SEQ * T_SEQ], tg[B_SEQ * T_SEQ];
    char err[256];
    for (int64_t i = from; i < to; i++) {
        struct train_step_info info;
        if (train_step(r->m, &o, i, &info, in, tg, err, sizeof err) != 0) {
            printf("train_step failed: %s\n", err);
            return -1;
        }
        out[i] = info.loss;
    }
    return 0;
}

static void test_curve(enum model_family f) {
    const char *fam = model_family_name(f);
    double lc[STEPS], lg[STEPS];
    struct run rc, rg;
    if (run_new(&rc, f, 0) || steps(&rc, 0, STEPS, STEPS, lc) || run_new(&rg, f, 1) ||
        steps(&rg, 0, STEPS, STEPS, lg)) {
        printf("FAIL %s curve: set-up or step failed\n", fam);
        fails++;
        return;
    }
    double worst = 0, mean = 0;
    int worst_at = 0;
    for (int i = 0; i < STEPS; i++) {
        double d = fabs(lg[i] - lc[i]) / lc[i];
        if (!(d <= worst)) worst = d, worst_at = i; /* NaN lands here too */
        mean += d / STEPS;
    }
    int falls = lg[STEPS - 1] < 0.7 * lg[0];
    int ok = worst <= TOL_STEP && mean <= TOL_MEAN && falls;
    printf("%s %s curve: cpu %.4f -> %.4f, cuda %.4f -> %.4f; worst rel %.2e at step %d "
           "(bound %.0e), mean %.2e (bound %.0e)%s\n",
           ok ? "ok" : "FAIL", fam, lc[0], lc[STEPS - 1], lg[0], lg[STEPS - 1], worst, worst_at,
           TOL_STEP, mean, TOL_MEAN, falls ? "" : ", loss did not fall below 70% of its start");
    for (int i = 0; i < STEPS; i += 10)
        printf("   step %2d cpu %.5f cuda %.5f\n", i, lc[i], lg[i]);
    if (!ok) fails++;
    run_free(&rc);
    run_free(&rg);
}

struct snap {
    void *params;
    float *master, *m, *v;
};

static void snap_take(struct run *r, struct snap *s) {
    struct engine *e = r->e;
    struct backend *b = e->be;
    s->params = malloc(e->n_params * b->elt_size);
    s->master = malloc(e->shard_n * 4);
    s->m = malloc(e->shard_n * 4);
    s->v = malloc(e->shard_n * 4);
    b->download(b->ctx, s->params, e->params, e->n_params * b->elt_size);
    engine_opt_read(e, ENGINE_OPT_MASTER, s->master, 0, e->shard_n);
    engine_opt_read(e, ENGINE_OPT_M, s->m, 0, e->shard_n);
    engine_opt_read(e, ENGINE_OPT_V, s->v, 0, e->shard_n);
}

static void snap_put(struct run *r, const struct snap *s) {
    struct engine *e = r->e;
    struct backend *b = e->be;
    b->upload(b->ctx, e->params, s->params, e->n_params * b->elt_size);
    engine_opt_write(e, ENGINE_OPT_MASTER, s->master, 0, e->shard_n);
    engine_opt_write(e, ENGINE_OPT_M, s->m, 0, e->shard_n);
    engine_opt_write(e, ENGINE_OPT_V, s->v, 0, e->shard_n);
}

static void snap_free(struct snap *s) {
    free(s->params), free(s->master), free(s->m), free(s->v);
}

static int snap_same(struct run *r, const struct snap *a, const struct snap *b) {
    size_t np = r->e->n_params * r->e->be->elt_size, ns = r->e->shard_n * 4;
    return !memcmp(a->params, b->params, np) && !memcmp(a->master, b->master, ns) &&
           !memcmp(a->m, b->m, ns) && !memcmp(a->v, b->v, ns);
}

static void test_resume(enum model_family f) {
    const char *fam = model_family_name(f);
    double la[20], lb[20], lc[20];
    struct run ra, rb, rc;
    struct snap sa, sb, mid, sc;
    if (run_new(&ra, f, 1) || steps(&ra, 0, 20, 20, la)) goto setup;
    snap_take(&ra, &sa);
    if (run_new(&rb, f, 1) || steps(&rb, 0, 20, 20, lb)) goto setup;
    snap_take(&rb, &sb);
    int det = !memcmp(la, lb, sizeof la) && snap_same(&ra, &sa, &sb);
    printf("%s %s determinism: two 20-step runs %s\n", det ? "ok" : "FAIL", fam,
           det ? "identical bit for bit" : "differ");
    if (!det) fails++;
    run_free(&rb);
    /* 10 steps, snapshot, fresh engine, restore, 10 more */
    if (run_new(&rb, f, 1) || steps(&rb, 0, 10, 20, lc)) goto setup;
    snap_take(&rb, &mid);
    run_free(&rb);
    if (run_new(&rc, f, 1)) goto setup;
    snap_put(&rc, &mid);
    if (steps(&rc, 10, 20, 20, lc)) goto setup;
    snap_take(&rc, &sc);
    int res = !memcmp(la, lc, sizeof la) && snap_same(&ra, &sa, &sc);
    printf("%s %s resume: 10 + restore + 10 steps vs 20 steps: %s (loss %.6f vs %.6f)\n",
           res ? "ok" : "FAIL", fam, res ? "identical bit for bit" : "differ", lc[19], la[19]);
    if (!res) fails++;
    run_free(&ra);
    run_free(&rc);
    snap_free(&sa), snap_free(&sb), snap_free(&mid), snap_free(&sc);
    return;
setup:
    printf("FAIL %s resume: set-up or step failed\n", fam);
    fails++;
}

static void test_offload(enum model_family f) {
    const char *fam = model_family_name(f);
    double l0[20], l1[20], l2[20];
    struct run r0, r1, r2;
    struct snap s1, s2;
    if (run_new_ex(&r0, f, 1, 0) || steps(&r0, 0, 20, 20, l0) || run_new_ex(&r1, f, 1, 1) ||
        steps(&r1, 0, 20, 20, l1) || run_new_ex(&r2, f, 1, 2) || steps(&r2, 0, 20, 20, l2)) {
        printf("FAIL %s offload: set-up or step failed\n", fam);
        fails++;
        return;
    }
    struct engine *e = r1.e;
    int mem = e->mem.optimizer == 16 && e->mem.host == offload_host_bytes(e->shard_n, 2) &&
              e->mem.host == e->shard_n * 14 && r0.e->mem.host == 0;
    printf("%s %s offload memory: device optimizer %zu bytes (want 16), host %zu (want %zu)\n",
           mem ? "ok" : "FAIL", fam, e->mem.optimizer, e->mem.host, e->shard_n * 14);
    if (!mem) fails++;
    double worst = 0, mean = 0;
    for (int i = 0; i < 20; i++) {
        double d = fabs(l1[i] - l0[i]) / l0[i];
        if (!(d <= worst)) worst = d;
        mean += d / 20;
    }
    int ok = worst <= TOL_STEP && mean <= TOL_MEAN && l1[19] < 0.9 * l1[0];
    printf("%s %s offload vs on-device: %.5f -> %.5f vs %.5f -> %.5f, worst rel %.2e, mean %.2e\n",
           ok ? "ok" : "FAIL", fam, l1[0], l1[19], l0[0], l0[19], worst, mean);
    if (!ok) fails++;
    snap_take(&r1, &s1);
    snap_take(&r2, &s2);
    int same = !memcmp(l1, l2, sizeof l1) && snap_same(&r1, &s1, &s2);
    printf("%s %s offload async copies vs synchronous: %s\n", same ? "ok" : "FAIL", fam,
           same ? "identical bit for bit" : "differ");
    if (!same) fails++;
    snap_free(&s1), snap_free(&s2);
    run_free(&r0), run_free(&r1), run_free(&r2);
    /* the portable kernels and the one-call pinned buffer: the same bits */
    double l3[20], l4[20], l5[20];
    struct run r3, r4, r5;
    struct snap s4, s5;
    if (run_new_ex(&r3, f, 1, 3) || steps(&r3, 0, 20, 20, l3) || run_new_ex(&r4, f, 1, 4) ||
        steps(&r4, 0, 20, 20, l4) || run_new_ex(&r5, f, 1, 5) || steps(&r5, 0, 20, 20, l5)) {
        printf("FAIL %s offload variants: set-up or step failed\n", fam);
        fails++;
        return;
    }
    same = !memcmp(l3, l2, sizeof l3);
    printf("%s %s offload portable kernels + cudaHostAlloc vs %s kernels: %s\n",
           same ? "ok" : "FAIL", fam, oadam_isa_name(oadam_isa_best()),
           same ? "identical bit for bit" : "differ");
    if (!same) fails++;
    /* delayed: async copies (uploads of update s-1 before the downloads of
     * step s into the same buffer) as the synchronous ones; it learns */
    offload_flush(r4.e);
    offload_flush(r5.e);
    snap_take(&r4, &s4);
    snap_take(&r5, &s5);
    same = !memcmp(l4, l5, sizeof l4) && snap_same(&r4, &s4, &s5) && l4[19] < 0.9 * l4[0] &&
           l4[2] != l2[2];
    printf("%s %s offload delayed, async vs synchronous copies: %s (loss %.5f -> %.5f; undelayed "
           "%.5f)\n",
           same ? "ok" : "FAIL", fam, same ? "identical bit for bit" : "differ", l4[0], l4[19],
           l2[19]);
    if (!same) fails++;
    snap_free(&s4), snap_free(&s5);
    run_free(&r3), run_free(&r4), run_free(&r5);
}

int main(void) {
    int rc = lcuda_probe();
    if (rc) return rc;
    test_curve(MODEL_GPT2);
    test_curve(MODEL_LLAMA);
    test_resume(MODEL_GPT2);
    test_resume(MODEL_LLAMA);
    test_offload(MODEL_GPT2);
    test_offload(MODEL_LLAMA);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
