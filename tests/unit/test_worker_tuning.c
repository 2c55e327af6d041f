/* loom-worker's tuning and debug rows (worker/tuning.h): every knob keeps its
 * LOOM_<NAME> variable, the defaults are the values the code used before the
 * rows existed (the literal values below, not read from the table), bad
 * values are refused with a message naming the variable, the rows stay out
 * of --help and appear in --help-all marked as tuning or debug, and the
 * constructors tests use (backend_cpu_new) still see an exported variable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "worker/backend.h"
#include "worker/tuning.h"

static int fails;

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAIL %s\n", what);
        fails++;
    }
}

static int streq(const char *a, const char *b) {
    return a && b && strcmp(a, b) == 0;
}

/* The defaults, written out: what each site did with its variable unset. */
static void test_defaults(void) {
    struct worker_tuning t;
    check(worker_tuning_from_env(&t) == 0, "defaults load");
    check(t.cpu.isa == NULL, "cpu-isa unset");
    check(t.cpu.par_min == 262144, "cpu-par-min 2^18");
    check(t.cuda.fuse_dgelu == 1, "fuse-dgelu on");
    check(streq(t.cuda.attn_cudnn, "1"), "attn-cudnn 1");
    check(t.cuda.attn_cudnn_gqa == 1, "attn-cudnn-gqa on");
    check(t.cuda.blas_tune == 0 && t.cuda.blas_algo_cache == NULL, "blas off");
    check(t.cuda.xent_chunk_mib == 0, "xent-chunk-mib 0");
    check(t.cuda.lora_drop_fused == 1, "lora-drop-fused on");
    check(t.comm.timeout_ms == 0 && t.comm.backend == NULL, "comm defaults");
    check(t.comm.dp_pair == 1 && t.comm.dp_emb_exchange == 1 && t.comm.tp_stream == 1,
          "pair, exchange, tp stream on");
    check(t.comm.pair_chunk_kib == 8192 && t.comm.pair_trace == 0, "pair chunk 8 MiB, no trace");
    check(streq(t.comm.pair_priority, "default") && streq(t.comm.nccl_cta_policy, "default"),
          "priorities default");
    check(t.debug_param_hash == 0, "param hash off");
    worker_tuning_free(&t);
}

struct env_case {
    const char *var, *value;
    int ok; /* 0: refused */
    int (*holds)(const struct worker_tuning *t);
};

static int par_min_0(const struct worker_tuning *t) {
    return t->cpu.par_min == 0;
}
static int chunk_256(const struct worker_tuning *t) {
    return t->comm.pair_chunk_kib == 256;
}
static int pair_off(const struct worker_tuning *t) {
    return t->comm.dp_pair == 0;
}
static int cudnn_nd(const struct worker_tuning *t) {
    return streq(t->cuda.attn_cudnn, "nd");
}
static int cudnn_gqa_off(const struct worker_tuning *t) {
    return t->cuda.attn_cudnn_gqa == 0;
}
static int hash_on(const struct worker_tuning *t) {
    return t->debug_param_hash == 1;
}
static int gloo(const struct worker_tuning *t) {
    return streq(t->comm.backend, "gloo");
}
static int timeout_4000(const struct worker_tuning *t) {
    return t->comm.timeout_ms == 4000;
}
static int tp_stream_off(const struct worker_tuning *t) {
    return t->comm.tp_stream == 0;
}
static int lora_drop_off(const struct worker_tuning *t) {
    return t->cuda.lora_drop_fused == 0;
}
static int xent_full(const struct worker_tuning *t) {
    return t->cuda.xent_chunk_mib == 512;
}

static const struct env_case env_cases[] = {
    {"LOOM_CPU_PAR_MIN", "0", 1, par_min_0},
    {"LOOM_PAIR_CHUNK_KIB", "256", 1, chunk_256},
    {"LOOM_DP_PAIR", "0", 1, pair_off},
    {"LOOM_ATTN_CUDNN", "nd", 1, cudnn_nd},
    {"LOOM_ATTN_CUDNN_GQA", "0", 1, cudnn_gqa_off},
    {"LOOM_DEBUG_PARAM_HASH", "1", 1, hash_on},
    {"LOOM_COMM_BACKEND", "gloo", 1, gloo},
    {"LOOM_COMM_TIMEOUT_MS", "4000", 1, timeout_4000},
    {"LOOM_TP_STREAM", "0", 1, tp_stream_off},
    {"LOOM_XENT_CHUNK_MIB", "512", 1, xent_full},
    {"LOOM_LORA_DROP_FUSED", "0", 1, lora_drop_off},
    {"LOOM_LORA_DROP_FUSED", "sometimes", 0, NULL},
    {"LOOM_XENT_CHUNK_MIB", "4096", 0, NULL}, /* past the 2 GiB cap */
    {"LOOM_PAIR_CHUNK_KIB", "abc", 0, NULL},
    {"LOOM_PAIR_CHUNK_KIB", "0", 0, NULL}, /* below the row's minimum */
    {"LOOM_DP_PAIR", "maybe", 0, NULL},
    {"LOOM_CPU_PAR_MIN", "-1", 0, NULL},
};

static void test_env(void) {
    for (size_t i = 0; i < sizeof env_cases / sizeof *env_cases; i++) {
        const struct env_case *c = &env_cases[i];
        char what[128];
        snprintf(what, sizeof what, "%s=%s", c->var, c->value);
        setenv(c->var, c->value, 1);
        struct worker_tuning t;
        int rc = worker_tuning_from_env(&t);
        unsetenv(c->var);
        check(c->ok ? rc == 0 : rc == -1, what);
        if (c->ok && rc == 0) check(c->holds(&t), what);
        worker_tuning_free(&t);
    }
}

struct opts {
    char *spec;
    struct worker_tuning tune;
};

static char *help_text(const struct config_entry *rows, size_t n, int all) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    if (all)
        config_print_help_all(rows, n, "loom-worker", NULL, f);
    else
        config_print_help(rows, n, "loom-worker", NULL, f);
    fclose(f);
    return buf;
}

/* The rows join a program's table at the offset of its tuning struct: a
 * flag lands there, --help hides them, --help-all marks them. */
static void test_table(void) {
    static const struct config_entry base[] = {
        {"spec", CONFIG_STR, offsetof(struct opts, spec), NULL, 1, 0, "job spec"},
    };
    size_t n = 0;
    struct config_entry *rows = worker_config_table(base, 1, offsetof(struct opts, tune), &n);
    check(rows && n == 1 + worker_tuning_nrows, "combined table");
    if (!rows) return;
    struct opts o;
    memset(&o, 0, sizeof o);
    char *argv[] = {"loom-worker", "--spec", "s.json", "--pair-chunk-kib=64",
                    "--dp-pair",   "0",      NULL};
    check(config_load(rows, n, &o, "loom-worker", NULL, 6, argv, NULL, NULL) == 0, "flags load");
    check(streq(o.spec, "s.json"), "ordinary row");
    check(o.tune.comm.pair_chunk_kib == 64 && o.tune.comm.dp_pair == 0, "tuning flags land");
    check(o.tune.comm.tp_stream == 1, "other tuning rows keep defaults");
    config_free(rows, n, &o);

    char *s = help_text(rows, n, 0), *a = help_text(rows, n, 1);
    check(s && strstr(s, "--spec") && !strstr(s, "--pair-chunk-kib") &&
              !strstr(s, "--debug-param-hash"),
          "--help: ordinary rows only");
    char hint[96];
    snprintf(hint, sizeof hint, "%zu tuning and debug settings are not shown: --help-all",
             worker_tuning_nrows);
    check(s && strstr(s, hint), "--help points at --help-all");
    check(a && strstr(a, "--spec") && strstr(a, "--pair-chunk-kib"), "--help-all: every row");
    const char *p = a ? strstr(a, "--pair-chunk-kib") : NULL;
    const char *d = a ? strstr(a, "--debug-param-hash") : NULL;
    check(p && strstr(p, "(tuning)") && strstr(p, "(tuning)") < strchr(p, '\n') + 1,
          "pair-chunk-kib marked tuning");
    check(d && strstr(d, "(debug)") && strstr(d, "(debug)") < strchr(d, '\n') + 1,
          "debug-param-hash marked debug");
    free(s);
    free(a);
    char *hargv[] = {"loom-worker", "--help-all", NULL};
    FILE *keep = stdout;
    stdout = fopen("/dev/null", "w");
    int hrc = config_load(rows, n, &o, "loom-worker", NULL, 2, hargv, NULL, NULL);
    fclose(stdout);
    stdout = keep;
    check(hrc == 1, "--help-all returns 1 like --help");
    config_free(rows, n, &o);
    free(rows);
}

/* backend_cpu_new (tests, benches) reads the rows from the environment;
 * backend_cpu_new_tuned takes them as given. */
static void test_backend(void) {
    setenv("LOOM_CPU_ISA", "baseline", 1);
    struct backend *b = backend_cpu_new(1);
    unsetenv("LOOM_CPU_ISA");
    check(b && streq(backend_cpu_isa(b), "baseline"), "backend_cpu_new sees LOOM_CPU_ISA");
    backend_free(b);
    struct cpu_tuning ct = {.isa = "baseline", .par_min = 0};
    b = backend_cpu_new_tuned(1, &ct);
    check(b && streq(backend_cpu_isa(b), "baseline"), "backend_cpu_new_tuned takes the row");
    backend_free(b);
    setenv("LOOM_CPU_PAR_MIN", "x", 1);
    b = backend_cpu_new(1);
    unsetenv("LOOM_CPU_PAR_MIN");
    check(b == NULL, "a bad LOOM_CPU_PAR_MIN stops backend_cpu_new");
    backend_free(b);
    b = backend_cpu_new_tuned(1, NULL);
    check(b != NULL && b->caps.pair_transport == 0 && b->caps.device_collectives == 0,
          "cpu backend: no pair transport, host collectives");
    backend_free(b);
}

int main(void) {
    test_defaults();
    test_env();
    test_table();
    test_backend();
    if (fails) {
        printf("%d failure(s)\n", fails);
        return 1;
    }
    printf("ok\n");
    return 0;
}
