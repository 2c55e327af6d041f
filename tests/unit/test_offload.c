/* Optimizer offload at the engine level (worker/offload.h, worker/engine.h)
 * on the CPU backend:
 *  - training a tiny GPT-2 and Llama for 12 steps (2 micro-steps, clipping
 *    active) with the offload on gives the same losses and grad norms bit for
 *    bit as with it off, for several pipeline chunk sizes and with the state
 *    moved to the host after allocation (engine_offload_enable on a running
 *    engine) or allocated there (engine_place.opt_later);
 *  - the delayed update (offload_opts.delayed) equals a one-step delay made
 *    by hand on an engine without offload, bit for bit (losses, norms, final
 *    weights after offload_flush), and differs from the undelayed run;
 *  - memory: with offload e->mem.optimizer is only the 16-byte norm scalar
 *    and e->mem.host = shard * (12 + 4) bytes (offload_host_bytes), also
 *    after engine_set_shard; opt_later leaves the state unallocated until
 *    engine_opt_init; engine_opt_read / engine_opt_write round-trip;
 *  - the parallel init (model_fill_normal): the chunked streams give the
 *    same values with 1 and 8 threads, differ from the serial stream, and are
 *    N(0, std); below the threshold the serial stream is unchanged;
 *    model_init_params (small tensors drawn side by side) gives the same
 *    weights with 1 and 4 OpenMP threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "worker/offload.h"
#include "worker/train.h"
#include "tests/check.h"

struct src {
    int B, T, V, grad_accum;
};

static int src_batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                     size_t errlen) {
    struct src *s = user;
    (void)err, (void)errlen;
    for (int b = 0; b < s->B; b++) {
        uint64_t h = (uint64_t)((step * s->grad_accum + micro) * s->B + b) * 0x9e3779b97f4a7c15ull;
        int stride = 1 + (int)(h % 5), x = (int)((h >> 20) % (uint64_t)s->V);
        for (int t = 0; t < s->T; t++) {
            in[b * s->T + t] = x;
            x = (x + stride) % s->V;
            tg[b * s->T + t] = x;
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

/* DELAYED: --offload delayed; EMULATED: the undelayed offload (the same bits
 * as none, and a master apart from the parameters, unlike the fp32 engine's
 * aliased one) with the one-step delay done by hand on the parameters between
 * the steps (the next step computes at those before the last update, as the
 * delayed offload defines them). */
enum mode { OFF, ON_EARLY, ON_MOVED, DELAYED, EMULATED };

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *c = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

#define STEPS 12

/* Train STEPS steps; losses and norms into out. chunk: offload chunk bytes. */
static int train_h(enum model_family f, enum mode mode, size_t chunk, double *loss, double *norm,
                   uint64_t *hash) {
    struct model_config c = config(f);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    p.opt_later = mode == ON_EARLY || mode == DELAYED || mode == EMULATED;
    struct engine *e = engine_new(&c, &p, backend_cpu_new(2));
    struct model *m = NULL;
    struct src s = {.B = 2, .T = 16, .V = 61, .grad_accum = 2};
    int32_t in[64], tg[64];
    char err[256];
    int rc = -1;
    if (!e) return -1;
    struct offload_opts oo = {.chunk_bytes = chunk, .threads = 2, .delayed = mode == DELAYED};
    float *prev = NULL, *held = NULL, *tmp = NULL;
    if (mode == ON_EARLY || mode == DELAYED || mode == EMULATED) {
        CHECK(!engine_opt_ready(e), "opt_later: state allocated by engine_new");
        CHECK(e->mem.optimizer == 16, "opt_later: optimizer %zu bytes before the shard",
              e->mem.optimizer);
        if (engine_offload_enable(e, &oo) != 0 || engine_opt_init(e) != 0) goto out;
    }
    m = model_new(e, s.B, s.T, 2);
    if (!m || model_init_params(m, 5) != 0) goto out;
    if (mode == ON_MOVED && engine_offload_enable(e, &oo) != 0) goto out;
    if (mode != OFF) {
        CHECK(e->opt_host && e->mem.optimizer == 16, "offload: device optimizer %zu bytes",
              e->mem.optimizer);
        CHECK(e->mem.host == offload_host_bytes(e->n_params, 4) && e->mem.host == e->n_params * 16,
              "offload: host %zu bytes, want %zu", e->mem.host, e->n_params * 16);
    }
    struct train_opts o;
    memset(&o, 0, sizeof o);
    o.steps = STEPS;
    o.grad_accum = s.grad_accum;
    o.global_batch_tokens = (int64_t)s.B * s.T * s.grad_accum;
    o.optim = (struct optim_cfg){.lr = 3e-3,
                                 .min_lr = 3e-4,
                                 .warmup = 2,
                                 .steps = STEPS,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-8,
                                 .weight_decay = 0.1,
                                 .grad_clip = 0.3};
    o.train.batch = src_batch;
    o.train.user = &s;
    rc = 0;
    size_t pb = e->n_params * sizeof(float);
    float *pw = engine_params_at(e, 0); /* cpu "device" memory is host memory */
    if (mode == EMULATED) {
        prev = malloc(pb), held = malloc(pb), tmp = malloc(pb);
        if (!prev || !held || !tmp) rc = -1;
    }
    for (int i = 0; i < STEPS && rc == 0; i++) {
        struct train_step_info info;
        if (mode == EMULATED) memcpy(prev, pw, pb);
        rc = train_step(m, &o, i, &info, in, tg, err, sizeof err);
        if (mode == EMULATED) { /* the update just made lands one step later */
            memcpy(tmp, pw, pb);
            memcpy(pw, i == 0 ? prev : held, pb);
            memcpy(held, tmp, pb);
        }
        loss[i] = info.loss;
        norm[i] = info.grad_norm;
        CHECK(info.ms_optimizer >= 0 && info.ms_optimizer <= info.ms_step,
              "ms_optimizer %.3f of step %.3f", info.ms_optimizer, info.ms_step);
    }
    CHECK(norm[0] > 0.3, "clipping inactive: first norm %g <= clip 0.3", norm[0]);
    if (mode == EMULATED && rc == 0) memcpy(pw, held, pb);
    if (mode == DELAYED) offload_flush(e);
    if (hash) *hash = fnv(pw, pb);
out:
    free(prev), free(held), free(tmp);
    model_free(m);
    engine_free(e);
    return rc;
}

static int train(enum model_family f, enum mode mode, size_t chunk, double *loss, double *norm) {
    return train_h(f, mode, chunk, loss, norm, NULL);
}

/* The delayed update is the hand-made one-step delay bit for bit (losses,
 * norms, the final weights after the flush), and not the undelayed run. */
static void test_delayed(enum model_family f) {
    double l0[STEPS], n0[STEPS], l1[STEPS], n1[STEPS], l2[STEPS], n2[STEPS];
    uint64_t h1 = 0, h2 = 1;
    const char *fam = model_family_name(f);
    CHECK(train(f, OFF, 0, l0, n0) == 0, "%s: training without offload", fam);
    CHECK(train_h(f, EMULATED, 0, l1, n1, &h1) == 0, "%s: emulated delay", fam);
    CHECK(train_h(f, DELAYED, 4096, l2, n2, &h2) == 0, "%s: delayed offload", fam);
    int same = 1;
    for (int i = 0; i < STEPS; i++)
        if (l1[i] != l2[i] || n1[i] != n2[i]) {
            CHECK(0, "%s delayed step %d: loss %.17g vs %.17g, norm %.17g vs %.17g", fam, i, l2[i],
                  l1[i], n2[i], n1[i]);
            same = 0;
            break;
        }
    CHECK(h1 == h2, "%s delayed: final weights differ from the emulation", fam);
    CHECK(l2[0] == l0[0], "%s: step 0 loss %.17g vs %.17g", fam, l2[0], l0[0]);
    CHECK(l2[1] != l0[1], "%s: step 1 did not compute at the initial weights", fam);
    CHECK(l2[STEPS - 1] < l2[0], "%s delayed: loss did not fall (%g -> %g)", fam, l2[0],
          l2[STEPS - 1]);
    if (same && h1 == h2)
        printf("ok %s delayed: %d steps and the final weights identical to the emulation (loss "
               "%.6f -> %.6f; undelayed %.6f)\n",
               fam, STEPS, l2[0], l2[STEPS - 1], l0[STEPS - 1]);
}

static void test_equal(enum model_family f) {
    double l0[STEPS], n0[STEPS], l1[STEPS], n1[STEPS];
    const char *fam = model_family_name(f);
    CHECK(train(f, OFF, 0, l0, n0) == 0, "%s: training without offload", fam);
    const struct {
        enum mode mode;
        size_t chunk;
    } cases[] = {{ON_EARLY, 0}, {ON_EARLY, 4096}, {ON_MOVED, 4096 + 64}, {ON_MOVED, 1 << 20}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        memset(l1, 0, sizeof l1);
        CHECK(train(f, cases[k].mode, cases[k].chunk, l1, n1) == 0, "%s: training with offload",
              fam);
        int same = 1;
        for (int i = 0; i < STEPS; i++)
            if (l1[i] != l0[i] || n1[i] != n0[i]) {
                CHECK(0, "%s case %zu step %d: loss %.17g vs %.17g, norm %.17g vs %.17g", fam, k, i,
                      l1[i], l0[i], n1[i], n0[i]);
                same = 0;
                break;
            }
        CHECK(l0[STEPS - 1] < l0[0], "%s: loss did not fall (%g -> %g)", fam, l0[0], l0[STEPS - 1]);
        if (same)
            printf("ok %s case %zu: %d steps identical (loss %.6f -> %.6f)\n", fam, k, STEPS, l0[0],
                   l0[STEPS - 1]);
    }
}

/* Shards, accounting and the state accessors. */
static void test_state(void) {
    struct model_config c = config(MODEL_GPT2);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1, .opt_later = 1};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    CHECK(e != NULL, "engine_new");
    if (!e) return;
    struct model *m = model_new(e, 2, 16, 1);
    CHECK(m && model_init_params(m, 3) == 0, "model");
    CHECK(engine_offload_enable(e, NULL) == 0, "enable");
    CHECK(e->mem.host == 0, "host bytes %zu before any state", e->mem.host);
    size_t off = 1000, n = 777;
    CHECK(engine_set_shard(e, off, n) == 0, "set_shard");
    CHECK(e->mem.host == n * 16 && e->mem.optimizer == 16, "shard: host %zu optimizer %zu",
          e->mem.host, e->mem.optimizer);
    /* master = the params of the shard; moments zero */
    float *pw = engine_params_at(e, off), buf[777], back[777];
    engine_opt_read(e, ENGINE_OPT_MASTER, buf, 0, n);
    CHECK(memcmp(buf, pw, n * sizeof(float)) == 0, "master != params of the shard");
    engine_opt_read(e, ENGINE_OPT_V, buf, 0, n);
    int zero = 1;
    for (size_t i = 0; i < n; i++)
        zero &= buf[i] == 0.0f;
    CHECK(zero, "v not zero after the shard was set");
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)i * 0.5f;
    engine_opt_write(e, ENGINE_OPT_M, buf + 7, 7, n - 7);
    engine_opt_read(e, ENGINE_OPT_M, back, 0, n);
    CHECK(back[0] == 0 && memcmp(back + 7, buf + 7, (n - 7) * sizeof(float)) == 0, "m round trip");
    /* engine_params_from_host writes the host master where it meets the shard */
    float x[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    CHECK(engine_params_from_host(e, off - 5, x, 10) == 0, "params_from_host");
    engine_opt_read(e, ENGINE_OPT_MASTER, back, 0, 5);
    CHECK(memcmp(back, x + 5, 5 * sizeof(float)) == 0, "master not written by params_from_host");
    float *d = malloc(n * sizeof(float));
    engine_master_to_dev(e, d); /* cpu "device" memory is host memory */
    CHECK(d && memcmp(d, back, 5 * sizeof(float)) == 0, "engine_master_to_dev");
    free(d);
    /* a second shard replaces the first */
    CHECK(engine_set_shard(e, 0, 100) == 0 && e->mem.host == 1600, "reshard: host %zu",
          e->mem.host);
    model_free(m);
    engine_free(e);
}

static void test_fill(void) {
    const size_t n = 3 * ((size_t)1 << 20) + 5, pm = (size_t)1 << 20;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    float *c = malloc(n * sizeof(float));
    if (!a || !b || !c) {
        CHECK(0, "out of memory");
        return;
    }
    model_fill_normal(a, n, 1234, 0.02, pm, 1);
    model_fill_normal(b, n, 1234, 0.02, pm, 8);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0, "chunked init differs between 1 and 8 threads");
    model_fill_normal(c, n, 1234, 0.02, n + 1, 8); /* below the threshold: serial */
    CHECK(memcmp(a, c, 1000 * sizeof(float)) != 0, "chunked init equals the serial stream");
    CHECK(memcmp(a + pm, a, 1000 * sizeof(float)) != 0, "chunks repeat the same stream");
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i], s2 += (double)a[i] * a[i];
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    CHECK(fabs(mean) < 1e-4 && fabs(sd - 0.02) < 2e-4, "chunked init mean %g sd %g", mean, sd);
    /* the serial stream is the one model_init_params always used: pairs of
     * Box-Muller values from one splitmix64 state, independent of threads */
    model_fill_normal(b, 1001, 99, 1.0, MODEL_INIT_PAR_MIN, 8);
    model_fill_normal(c, 1001, 99, 1.0, MODEL_INIT_PAR_MIN, 1);
    CHECK(memcmp(b, c, 1001 * sizeof(float)) == 0, "serial stream depends on threads");
    CHECK(MODEL_INIT_PAR_MIN == ((size_t)1 << 26), "threshold %zu", (size_t)MODEL_INIT_PAR_MIN);
    free(a);
    free(b);
    free(c);
}

/* The weights model_init_params makes with `threads` OpenMP threads (host copy). */
static float *init_weights(int threads, size_t *n) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    struct model_config c = config(MODEL_LLAMA);
    struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
    struct engine *e = engine_new(&c, &p, backend_cpu_new(1));
    struct model *m = e ? model_new(e, 2, 16, 1) : NULL;
    float *w = NULL;
    if (m && model_init_params(m, 77) == 0) {
        *n = e->n_params;
        w = malloc(*n * sizeof *w);
        if (w) memcpy(w, e->params, *n * sizeof *w);
    }
    model_free(m);
    engine_free(e);
    return w;
}

static void test_init_threads(void) {
    size_t n1 = 0, n4 = 0;
    float *a = init_weights(1, &n1), *b = init_weights(4, &n4);
    CHECK(a && b && n1 == n4 && memcmp(a, b, n1 * sizeof *a) == 0,
          "model_init_params differs between 1 and 4 threads");
    double s2 = 0;
    for (size_t i = 0; a && i < n1; i++)
        s2 += (double)a[i] * a[i];
    CHECK(a && s2 > 0, "model_init_params left the weights zero");
    free(a);
    free(b);
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
}

int main(void) {
    test_fill();
    test_init_threads();
    test_state();
    test_equal(MODEL_GPT2);
    test_equal(MODEL_LLAMA);
    test_delayed(MODEL_GPT2);
    test_delayed(MODEL_LLAMA);
    if (check_failures) {
        printf("%d failures\n", check_failures);
        return 1;
    }
    printf("all offload tests passed\n");
    return 0;
}
