/* CPU backend throughput: tokens/s of training steps (forward, backward,
 * AdamW) for a small GPT with 1 and 2 threads.
 *
 *   bench_cpu [n_layer d_model seq_len micro_batch vocab steps]
 *   defaults: 6 256 256 4 256 5  (byte-level vocabulary, as the quick start)
 *
 * Synthetic tokens; one warm-up step is not timed. Prints one JSON line per
 * thread count, with wall-clock tokens/s and tokens per CPU-second (the
 * latter is what one thread achieves when the machine is shared). Not a ctest (timings are not
 * pass/fail); results go to docs/perf.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/train.h"

struct src {
    int B, T, V;
};

static int batch(void *user, int64_t step, int micro, int32_t *in, int32_t *tg, char *err,
                 size_t errlen) {
    struct src *s = user;
    uint64_t h = (uint64_t)(step * 131 + micro) * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < s->B * s->T; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        in[i] = (int32_t)(h % (uint64_t)s->V);
        tg[i] = (int32_t)((h >> 32) % (uint64_t)s->V);
    }
    return 0;
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int L = argc > 1 ? atoi(argv[1]) : 6, C = argc > 2 ? atoi(argv[2]) : 256;
    int T = argc > 3 ? atoi(argv[3]) : 256, B = argc > 4 ? atoi(argv[4]) : 4;
    int V = argc > 5 ? atoi(argv[5]) : 256, steps = argc > 6 ? atoi(argv[6]) : 5;
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_GPT2);
    c.n_layer = L;
    c.n_head = C / 64 > 0 ? C / 64 : 1;
    c.n_kv_head = c.n_head;
    c.d_model = C;
    c.d_ff = 4 * C;
    c.vocab_size = V;
    c.seq_len = T;
    model_config_finalize(&c);
    for (int threads = 1; threads <= 2; threads++) {
        struct engine_place p = {.rank = 0, .world = 1, .tp = 1, .dp = 1, .pp = 1};
        struct engine *e = engine_new(&c, &p, backend_cpu_new(threads));
        struct model *m = e ? model_new(e, B, T, threads) : NULL;
        if (!m || model_init_params(m, 1) != 0) return 1;
        struct src s = {B, T, V};
        struct train_opts o;
        memset(&o, 0, sizeof o);
        o.steps = steps + 1;
        o.grad_accum = 1;
        o.global_batch_tokens = (int64_t)B * T;
        o.optim = (struct optim_cfg){.lr = 1e-3,
                                     .min_lr = 1e-4,
                                     .warmup = 1,
                                     .steps = steps + 1,
                                     .beta1 = 0.9,
                                     .beta2 = 0.95,
                                     .eps = 1e-8,
                                     .weight_decay = 0.1,
                                     .grad_clip = 1.0};
        o.train = (struct train_source){batch, &s};
        int32_t *in = malloc(sizeof(int32_t) * B * T), *tg = malloc(sizeof(int32_t) * B * T);
        char err[128];
        struct train_step_info info;
        train_step(m, &o, 0, &info, in, tg, err, sizeof err); /* warm-up */
        double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 1; i <= steps; i++)
            train_step(m, &o, i, &info, in, tg, err, sizeof err);
        double dt = clock_s(CLOCK_MONOTONIC) - t0, dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        double tps = (double)steps * B * T / dt;
        printf(
            "{\"bench\":\"cpu_train_step\",\"threads\":%d,\"n_layer\":%d,\"d_model\":%d,"
            "\"seq_len\":%d,\"micro_batch\":%d,\"vocab\":%d,\"params\":%lld,\"ms_per_step\":%.1f,"
            "\"tokens_per_s\":%.0f,\"gflops\":%.2f,\"tokens_per_cpu_s\":%.0f,\"loss\":%.4f}\n",
            threads, L, C, T, B, V, (long long)model_n_params(&c), dt / steps * 1e3, tps,
            tps * model_flops_per_token(&c, T) / 1e9, (double)steps * B * T / dc, info.loss);
        free(in);
        free(tg);
        model_free(m);
        engine_free(e);
    }
    return 0;
}
