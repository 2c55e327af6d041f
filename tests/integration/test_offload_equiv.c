/* Optimizer offload (worker/offload.h) of the real loom-worker on the cpu
 * backend: the same training with the offload on (--offload on, i.e.
 * LOOM_OFFLOAD=on, here with 4 KiB pipeline chunks so the shard is several
 * chunks) and off must give bit-identical losses and grad norms on every
 * step, at world 1 and at dp 2 with ZeRO 1, 2 and 3 (Gloo, --nproc), with
 * gradient accumulation (2 micro-steps: ZeRO-2/3 download the last
 * micro-step's gradients during the backward) and grad clipping active. On
 * the cpu backend both paths run the same fp32 AdamW formula on the same
 * values, so anything but equality is a bug.
 *
 * Also: with offload the step line's device "optimizer" memory is only the
 * norm scalar and the memory line's host_gib.allocated is the shard times
 * (12 + 4) bytes; a checkpoint written with offload resumes without it (and
 * the reverse) onto the uninterrupted curve, bit for bit; --no-save writes
 * no checkpoint.
 *
 * --offload delayed: see delayed() below.
 *
 * Usage: test_offload_equiv LOOM_WORKER world1|dp2|resume|delayed */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "tests/integration/equiv_harness.h"

#define STEPS 12
/* tiny GPT-2 with odd sizes: uneven shards, runs that cross chunk borders */
#define N_LAYER 3
#define D_MODEL 16
#define D_FF    33
#define VOCAB   256
#define SEQ     16
#define MICRO   2

static const char *worker;
static char dir[256];

struct run {
    int steps_seen, rc;
    char loss[STEPS + 1][40], norm[STEPS + 1][40];
    double mem_opt;  /* step line mem.optimizer (GiB), last step */
    double host_gib; /* memory line host_gib.allocated */
    double host_plan;
};

/* Global batch: MICRO sequences x 2 micro-steps per dp rank at dp 2 (4 at dp 1). */
static void write_spec(const char *path, int dp, int zero) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f,
            "{\"name\":\"offload-equiv\",\"model\":{\"family\":\"gpt2\",\"n_layer\":%d,"
            "\"n_head\":2,\"d_model\":%d,\"d_ff\":%d,\"vocab_size\":%d,\"seq_len\":%d},"
            "\"data\":{\"train\":\"%s/train_*.bin\"},"
            "\"parallel\":{\"dp\":%d,\"tp\":1,\"pp\":1,\"zero_stage\":%d},"
            "\"train\":{\"steps\":%d,\"global_batch_tokens\":%d,\"micro_batch\":%d,"
            "\"lr\":0.01,\"min_lr\":0.001,\"warmup_steps\":3,\"weight_decay\":0.1,"
            "\"grad_clip\":0.5,\"seed\":11},"
            "\"checkpoint\":{\"every_steps\":6,\"keep\":5},"
            "\"resources\":{\"device\":\"cpu\"}}",
            N_LAYER, D_MODEL, D_FF, VOCAB, SEQ, dir, dp, zero, STEPS, 4 * MICRO * SEQ, MICRO);
    fclose(f);
}

/* The text after "key": up to the next ',' or '}' (exact digits). */
static void field(const char *line, const char *key, char *out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(line, pat);
    out[0] = 0;
    if (!p) return;
    p += strlen(pat);
    size_t k = 0;
    while (p[k] && p[k] != ',' && p[k] != '}' && k + 1 < n) {
        out[k] = p[k];
        k++;
    }
    out[k] = 0;
}

static void parse(const char *path, struct run *r) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && strcmp(type, "step") == 0) {
            int s = (int)json_integer_value(json_object_get(j, "step"));
            if (s >= 1 && s <= STEPS) {
                field(line, "loss", r->loss[s], sizeof(r->loss[s]));
                field(line, "grad_norm", r->norm[s], sizeof(r->norm[s]));
                r->steps_seen++;
                r->mem_opt =
                    json_real_value(json_object_get(json_object_get(j, "mem"), "optimizer"));
                CHECK(json_is_real(json_object_get(json_object_get(j, "ms"), "optimizer")),
                      "step line without ms.optimizer: %s", line);
            }
        } else if (type && strcmp(type, "memory") == 0 &&
                   json_integer_value(json_object_get(j, "rank")) == 0) {
            json_t *h = json_object_get(j, "host_gib");
            r->host_gib = json_real_value(json_object_get(h, "allocated"));
            r->host_plan = json_real_value(json_object_get(h, "planned"));
        }
        json_decref(j);
    }
    fclose(f);
}

/* One run; offload "on" / "off"; steps > 0: --steps; extra env flags. */
static void train(const char *tag, const char *out_tag, int dp, int zero, const char *offload,
                  int steps, int no_save, struct run *r) {
    char spec[512], out[512], of[512];
    snprintf(spec, sizeof(spec), "%s/%s.json", dir, tag);
    snprintf(out, sizeof(out), "%s/%s.out", dir, out_tag);
    snprintf(of, sizeof(of), "%s/%s.jsonl", dir, tag);
    write_spec(spec, dp, zero);
    setenv("LOOM_OFFLOAD", offload, 1);
    setenv("LOOM_OFFLOAD_CHUNK_KIB", "4", 1);
    if (no_save) setenv("LOOM_NO_SAVE", "1", 1);
    memset(r, 0, sizeof(*r));
    r->rc = equiv_run_worker(worker, spec, out, of, dp, NULL, NULL, steps);
    unsetenv("LOOM_OFFLOAD");
    unsetenv("LOOM_OFFLOAD_CHUNK_KIB");
    unsetenv("LOOM_NO_SAVE");
    CHECK(r->rc == 0, "%s: loom-worker exited %d", tag, r->rc);
    parse(of, r);
}

static void same(const char *tag, const struct run *a, const struct run *b, int from, int to) {
    int bad = 0;
    for (int s = from; s <= to; s++) {
        if (strcmp(a->loss[s], b->loss[s]) != 0 || strcmp(a->norm[s], b->norm[s]) != 0) {
            if (!bad)
                fprintf(stderr, "%s: step %d loss %s vs %s, norm %s vs %s\n", tag, s, a->loss[s],
                        b->loss[s], a->norm[s], b->norm[s]);
            bad++;
        }
    }
    CHECK(bad == 0 && a->loss[to][0], "%s: %d of steps %d..%d differ", tag, bad, from, to);
    if (!bad) fprintf(stderr, "%s: steps %d..%d identical (loss %s)\n", tag, from, to, a->loss[to]);
}

/* Elements of the tiny model (api/model.h layout at tp 1). */
static size_t n_params(void) {
    /* wte V*C + wpe T*C + per layer: 2 LN (4C) + qkv (3C*C + 3C) + proj (C*C + C)
     * + fc (F*C + F) + fc proj (C*F + C); final LN 2C */
    size_t C = D_MODEL, F = D_FF, V = VOCAB, T = SEQ;
    return V * C + T * C +
           N_LAYER * (4 * C + 3 * C * C + 3 * C + C * C + C + F * C + F + C * F + C) + 2 * C;
}

static void layouts(int dp) {
    const int zeros[] = {1, 2, 3};
    for (int k = 0; k < (dp == 1 ? 1 : 3); k++) {
        int z = dp == 1 ? 0 : zeros[k];
        char t0[64], t1[64];
        snprintf(t0, sizeof(t0), "dp%d-z%d-off", dp, z);
        snprintf(t1, sizeof(t1), "dp%d-z%d-on", dp, z);
        struct run a, b;
        train(t0, t0, dp, z, "off", 0, 1, &a);
        train(t1, t1, dp, z, "on", 0, 1, &b);
        CHECK(a.steps_seen == STEPS && b.steps_seen == STEPS, "%s: %d / %d step lines", t1,
              a.steps_seen, b.steps_seen);
        same(t1, &b, &a, 1, STEPS);
        /* device optimizer memory: the norm scalar only (16 bytes) */
        CHECK(fabs(b.mem_opt * 1073741824.0 - 16) < 0.5, "%s: device optimizer %.1f bytes", t1,
              b.mem_opt * 1073741824.0);
        CHECK(a.mem_opt * 1073741824.0 > 1000, "%s: no device optimizer state without offload", t0);
        /* host: rank 0's shard (the first, larger one) x (master + m + v + fp32 transfer) */
        size_t P = n_params(), S = (P + (size_t)dp - 1) / (size_t)dp;
        double want = (double)(S * 16) / 1073741824.0;
        CHECK(fabs(b.host_gib - want) < 1e-12, "%s: host %.0f bytes, want %zu", t1,
              b.host_gib * 1073741824.0, S * 16);
        CHECK(a.host_gib == 0, "%s: host bytes without offload", t0);
        /* the planner's share agrees with what the engine allocated (fp32: 16 B/element) */
        CHECK(fabs(b.host_plan - want) / want < 0.02, "%s: planner host %.0f, allocated %.0f", t1,
              b.host_plan * 1073741824.0, b.host_gib * 1073741824.0);
        /* --no-save: no checkpoint directory */
        char ck[600];
        struct stat st;
        snprintf(ck, sizeof(ck), "%s/%s.out/checkpoints/step_%08d", dir, t1, STEPS);
        CHECK(stat(ck, &st) != 0, "%s: --no-save wrote %s", t1, ck);
    }
}

/* --offload delayed (the one-step delayed update): step 1 as without
 * offload, step 2 not (it computes at the initial weights); the loss falls;
 * the flush before each checkpoint ends the delay, so a run stopped at its
 * step-6 checkpoint and resumed continues the uninterrupted delayed run bit
 * for bit (world 1, and dp 2 ZeRO-2 where the flush's param_sync gathers). */
static void delayed(int dp, int zero) {
    struct run off, full, half, rest;
    char t[4][48];
    snprintf(t[0], sizeof t[0], "dl%d-off", dp);
    snprintf(t[1], sizeof t[1], "dl%d-full", dp);
    snprintf(t[2], sizeof t[2], "dl%d-a", dp);
    snprintf(t[3], sizeof t[3], "dl%d-b", dp);
    train(t[0], t[0], dp, zero, "off", 0, 1, &off);
    train(t[1], t[1], dp, zero, "delayed", 0, 0, &full);
    CHECK(full.steps_seen == STEPS, "%s: %d step lines", t[1], full.steps_seen);
    CHECK(strcmp(full.loss[1], off.loss[1]) == 0, "%s: step 1 loss %s vs %s", t[1], full.loss[1],
          off.loss[1]);
    CHECK(strcmp(full.loss[2], off.loss[2]) != 0, "%s: step 2 did not see the initial weights",
          t[1]);
    CHECK(atof(full.loss[STEPS]) < atof(full.loss[1]), "%s: loss %s -> %s", t[1], full.loss[1],
          full.loss[STEPS]);
    char o[48];
    snprintf(o, sizeof o, "dl%d-half", dp);
    train(t[2], o, dp, zero, "delayed", STEPS / 2, 0, &half);
    train(t[3], o, dp, zero, "delayed", 0, 0, &rest);
    CHECK(rest.steps_seen == STEPS / 2, "%s: resumed run has %d step lines", t[3], rest.steps_seen);
    same(t[2], &half, &full, 1, STEPS / 2);
    same(t[3], &rest, &full, STEPS / 2 + 1, STEPS);
}

/* A checkpoint written with offload resumes without it, and the reverse,
 * onto the uninterrupted curve (dp 2, ZeRO 2; the reference without offload). */
static void resume(void) {
    struct run ref, half, rest;
    train("ref", "ref", 2, 2, "off", 0, 0, &ref);
    CHECK(ref.steps_seen == STEPS, "ref: %d step lines", ref.steps_seen);
    char ck[600];
    struct stat st;
    snprintf(ck, sizeof(ck), "%s/ref.out/checkpoints/step_%08d/manifest.json", dir, STEPS);
    CHECK(stat(ck, &st) == 0, "ref: no final checkpoint %s", ck);
    const char *mode[2][2] = {{"on", "off"}, {"off", "on"}};
    for (int k = 0; k < 2; k++) {
        char t0[80], t1[80], o[48];
        snprintf(o, sizeof(o), "resume-%s-%s", mode[k][0], mode[k][1]);
        snprintf(t0, sizeof(t0), "%s-a", o);
        snprintf(t1, sizeof(t1), "%s-b", o);
        train(t0, o, 2, 2, mode[k][0], STEPS / 2, 0, &half);
        CHECK(half.steps_seen == STEPS / 2, "%s: %d step lines", t0, half.steps_seen);
        train(t1, o, 2, 2, mode[k][1], 0, 0, &rest);
        CHECK(rest.steps_seen == STEPS / 2, "%s: resumed run has %d step lines, want %d", t1,
              rest.steps_seen, STEPS / 2);
        same(t0, &half, &ref, 1, STEPS / 2);
        same(t1, &rest, &ref, STEPS / 2 + 1, STEPS);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_offload_equiv LOOM_WORKER world1|dp2|resume\n");
        return 2;
    }
    worker = argv[1];
#ifndef LOOM_HAVE_GLOO
    if (strcmp(argv[2], "world1") != 0 && strcmp(argv[2], "delayed") != 0) {
        printf("SKIP: built without Gloo; dp > 1 on cpu needs it\n");
        return 77;
    }
#endif
    snprintf(dir, sizeof(dir), "/tmp/loom-test-offload-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char derr[256];
    CHECK(equiv_make_data(dir, derr, sizeof(derr)) == 0, "%s", derr);
    if (strcmp(argv[2], "world1") == 0)
        layouts(1);
    else if (strcmp(argv[2], "dp2") == 0)
        layouts(2);
    else if (strcmp(argv[2], "resume") == 0)
        resume();
    else if (strcmp(argv[2], "delayed") == 0) {
        delayed(1, 0);
#ifdef LOOM_HAVE_GLOO
        delayed(2, 2);
#endif
    } else
        return 2;
    if (!check_failures) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    } else {
        fprintf(stderr, "%d failures; files kept in %s\n", check_failures, dir);
    }
    (void)equiv_compare_exports;
    return check_failures ? 1 : 0;
}
