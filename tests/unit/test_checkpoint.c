/* Unit tests of worker/checkpoint: single-rank round trip (bit-exact, manifest
 * keys, rank meta), a three-rank save through a real barrier (threads), a
 * failing rank aborts the save without hanging anyone, `keep` honoured,
 * re-saving a step replaces it, and every corruption case (table-driven:
 * truncated / flipped / missing shard, missing or garbage manifest, wrong
 * world, edited checksum, trailing bytes, leftover temp directory) is skipped
 * by ckpt_find_latest and refused by ckpt_verify / ckpt_open. */
#include "worker/checkpoint.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "tests/check.h"

static char root[256];

/* Deterministic pseudo-random floats (splitmix-style) for buffer contents. */
static void fill(float *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ULL;
        p[i] = (float)((double)(z >> 40) / (double)(1 << 24) - 0.5);
    }
}

#define NP 1000

/* One single-rank save of `step` with buffers filled from `seed`. */
static int save1(const char *out, int64_t step, uint64_t seed, int keep) {
    float params[NP], m[NP], v[NP];
    fill(params, NP, seed);
    fill(m, NP, seed + 1);
    fill(v, NP, seed + 2);
    int64_t counter = step * 10;
    struct ckpt_opts o = {.out_dir = out, .rank = 0, .world = 1, .keep = keep};
    struct ckpt_writer *w = NULL;
    char err[512] = "", path[1024] = "";
    int rc = ckpt_begin(&o, step, &w, err, sizeof err);
    if (rc) {
        fprintf(stderr, "begin: %s\n", err);
        return rc;
    }
    CHECK(ckpt_add_f32(w, "params", params, NP) == 0);
    CHECK(ckpt_add_f32(w, "adam_m", m, NP) == 0);
    CHECK(ckpt_add_f32(w, "adam_v", v, NP) == 0);
    CHECK(ckpt_add(w, "adam_t", ST_I64, &counter, 0, NULL) == 0);
    CHECK(ckpt_add_f32(w, "params", params, NP) == CKPT_EINVAL); /* duplicate name */
    CHECK(ckpt_set_rank_meta(w, json_pack("{s:i,s:i}", "dp", 0, "offset", 0)) == 0);
    json_t *man =
        json_pack("{s:{s:s},s:{s:I},s:{s:s},s:{s:i,s:i,s:i,s:i},s:i}", "spec", "name", "tiny",
                  "data", "step", (json_int_t)step, "rng", "state", "0123456789abcdef", "layout",
                  "dp", 1, "tp", 1, "pp", 1, "zero_stage", 0, "step", 999 /* reserved: ignored */);
    rc = ckpt_commit(w, man, path, sizeof path, err, sizeof err);
    json_decref(man);
    if (rc) fprintf(stderr, "commit: %s\n", err);
    return rc;
}

/* Read step's checkpoint back and compare with the buffers of `seed`. */
static int check_load(const char *dir, int64_t step, uint64_t seed) {
    float want[NP], got[NP];
    char err[512] = "";
    struct ckpt_reader *r = NULL;
    if (ckpt_open(dir, 0, &r, err, sizeof err) != 0) {
        fprintf(stderr, "open %s: %s\n", dir, err);
        return -1;
    }
    int ok = ckpt_step(r) == step && ckpt_world(r) == 1;
    static const char *const names[] = {"params", "adam_m", "adam_v"};
    for (int k = 0; k < 3; k++) {
        fill(want, NP, seed + (uint64_t)k);
        ok &= ckpt_read_f32(r, names[k], got, NP, err, sizeof err) == 0;
        ok &= memcmp(want, got, sizeof got) == 0;
    }
    int64_t counter = -1;
    ok &= ckpt_read(r, "adam_t", ST_I64, &counter, sizeof counter, err, sizeof err) == 0;
    ok &= counter == step * 10;
    ckpt_close(r);
    return ok ? 0 : -1;
}

static void test_roundtrip_keep(void) {
    char out[512], err[512], path[1024];
    snprintf(out, sizeof out, "%s/run1", root);
    int64_t step = -1;
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 0); /* nothing yet */
    CHECK(save1(out, 10, 100, 0) == 0);
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 1);
    CHECK(step == 10 && strstr(path, "/checkpoints/step_00000010") != NULL);
    CHECK(check_load(path, 10, 100) == 0);
    CHECK(ckpt_verify(path, 1, err, sizeof err) == 0);
    CHECK(ckpt_verify(path, 2, err, sizeof err) == CKPT_ECORRUPT);
    CHECK(strstr(err, "written by 1 ranks, this run has 2") != NULL);

    /* Manifest content. */
    struct ckpt_reader *r = NULL;
    CHECK(ckpt_open(path, 0, &r, err, sizeof err) == 0);
    if (r) {
        const json_t *m = ckpt_manifest(r);
        CHECK(strcmp(json_string_value(json_object_get(m, "format")), "loom-checkpoint") == 0);
        CHECK(json_integer_value(json_object_get(m, "step")) == 10); /* not the caller's 999 */
        CHECK(strcmp(json_string_value(json_object_get(json_object_get(m, "spec"), "name")),
                     "tiny") == 0);
        CHECK(json_integer_value(json_object_get(json_object_get(m, "layout"), "dp")) == 1);
        CHECK(json_is_object(json_object_get(m, "rng")) &&
              json_is_object(json_object_get(m, "data")));
        json_t *s0 = json_array_get(json_object_get(m, "shards"), 0);
        CHECK(strcmp(json_string_value(json_object_get(s0, "file")), "rank_00000.safetensors") ==
              0);
        CHECK(strlen(json_string_value(json_object_get(s0, "sha256"))) == 64);
        CHECK(json_array_size(json_object_get(s0, "tensors")) == 4);
        CHECK(json_integer_value(json_object_get(ckpt_rank_meta(r), "dp")) == 0);
        const struct st_info *in = ckpt_find(r, "adam_v");
        CHECK(in && in->dtype == ST_F32 && in->ndim == 1 && in->shape[0] == NP);
        CHECK(ckpt_find(r, "nope") == NULL);
        float small[10];
        CHECK(ckpt_read_f32(r, "params", small, 10, err, sizeof err) == CKPT_EINVAL);
        CHECK(ckpt_read_f32(r, "nope", small, 10, err, sizeof err) == CKPT_ENOTFOUND);
        ckpt_close(r);
    }
    CHECK(ckpt_open(path, 1, &r, err, sizeof err) == CKPT_ENOTFOUND);

    /* keep = 2: after five saves only the newest two remain, no temp dirs. */
    for (int64_t s = 20; s <= 50; s += 10)
        CHECK(save1(out, s, 100 + (uint64_t)s, 2) == 0);
    int64_t *steps = NULL;
    size_t n = 0;
    CHECK(ckpt_list(out, &steps, &n) == 0);
    CHECK(n == 2 && steps[0] == 40 && steps[1] == 50);
    free(steps);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s/checkpoints | wc -l) -eq 2", out);
    CHECK(system(cmd) == 0);
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 1 && step == 50);
    CHECK(check_load(path, 50, 150) == 0);

    /* Re-saving an existing step replaces it. */
    CHECK(save1(out, 50, 777, 2) == 0);
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 1 && step == 50);
    CHECK(check_load(path, 50, 777) == 0);
    CHECK(system(cmd) == 0);

    /* keep <= 0 keeps everything. */
    CHECK(save1(out, 60, 160, 0) == 0);
    CHECK(ckpt_list(out, &steps, &n) == 0 && n == 3);
    free(steps);
    CHECK(ckpt_prune(out, 1) == 2);
    CHECK(ckpt_list(out, &steps, &n) == 0 && n == 1 && steps[0] == 60);
    free(steps);
}

/* ---- corruption table ------------------------------------------------------ */

static void truncate_shard(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", d);
    struct stat st;
    stat(p, &st);
    CHECK(truncate(p, st.st_size - 100) == 0);
}
static void flip_byte(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", d);
    FILE *f = fopen(p, "r+b");
    fseek(f, -50, SEEK_END);
    int c = fgetc(f);
    fseek(f, -50, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}
static void append_bytes(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", d);
    FILE *f = fopen(p, "ab");
    fputs("junk", f);
    fclose(f);
}
static void remove_shard(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", d);
    CHECK(unlink(p) == 0);
}
static void remove_manifest(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/manifest.json", d);
    CHECK(unlink(p) == 0);
}
static void garbage_manifest(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/manifest.json", d);
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"loom-checkpoint\", \"version\": 1, \"step\":", f);
    fclose(f);
}
static void edit_checksum(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/manifest.json", d);
    json_t *m = json_load_file(p, 0, NULL);
    json_t *s0 = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(s0, "sha256",
                        json_string("00000000000000000000000000000000"
                                    "00000000000000000000000000000000"));
    json_dump_file(m, p, 0);
    json_decref(m);
}
static void wrong_step(const char *d) {
    char p[1100];
    snprintf(p, sizeof p, "%s/manifest.json", d);
    json_t *m = json_load_file(p, 0, NULL);
    json_object_set_new(m, "step", json_integer(12345));
    json_dump_file(m, p, 0);
    json_decref(m);
}
static void corrupt_header(const char *d) {
    /* Same size, valid checksum recomputed: the safetensors header itself is bad. */
    char p[1100], hex[65];
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", d);
    FILE *f = fopen(p, "r+b");
    fseek(f, 8, SEEK_SET);
    fputc('[', f);
    fclose(f);
    uint64_t bytes = 0;
    st_sha256_file(p, hex, &bytes, NULL, 0);
    snprintf(p, sizeof p, "%s/manifest.json", d);
    json_t *m = json_load_file(p, 0, NULL);
    json_object_set_new(json_array_get(json_object_get(m, "shards"), 0), "sha256",
                        json_string(hex));
    json_dump_file(m, p, 0);
    json_decref(m);
}

static void test_corruption(void) {
    static const struct {
        const char *name;
        void (*corrupt)(const char *dir);
        const char *want; /* in ckpt_verify's message */
    } cases[] = {
        {"truncated shard", truncate_shard, "truncated"},
        {"flipped byte", flip_byte, "SHA-256 mismatch"},
        {"trailing bytes", append_bytes, "wrong size"},
        {"missing shard", remove_shard, "missing"},
        {"missing manifest (partial)", remove_manifest, "missing (incomplete checkpoint)"},
        {"garbage manifest", garbage_manifest, "manifest.json"},
        {"edited checksum", edit_checksum, "SHA-256 mismatch"},
        {"step differs from dir", wrong_step, "step differs from its directory"},
        {"bad safetensors header", corrupt_header, "header is not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[512], path[1024], err[512] = "";
        snprintf(out, sizeof out, "%s/corrupt%zu", root, i);
        CHECK(save1(out, 10, 1, 0) == 0);
        CHECK(save1(out, 20, 2, 0) == 0);
        snprintf(path, sizeof path, "%s/checkpoints/step_00000020", out);
        cases[i].corrupt(path);
        int vrc = ckpt_verify(path, 1, err, sizeof err);
        if (vrc == 0 || !strstr(err, cases[i].want)) {
            fprintf(stderr, "case %s: verify rc %d, message \"%s\" (want \"%s\")\n", cases[i].name,
                    vrc, err, cases[i].want);
            check_failures++;
        }
        struct ckpt_reader *r = (struct ckpt_reader *)1;
        CHECK(ckpt_open(path, 0, &r, err, sizeof err) != 0 && r == NULL);
        int64_t step = -1;
        char found[1024] = "";
        int frc = ckpt_find_latest(out, 1, found, sizeof found, &step);
        if (frc != 1 || step != 10) {
            fprintf(stderr, "case %s: find_latest rc %d step %lld (want the older step 10)\n",
                    cases[i].name, frc, (long long)step);
            check_failures++;
        } else {
            CHECK(check_load(found, 10, 1) == 0);
        }
    }

    /* A crash before the rename leaves only a temp directory: never listed,
     * removed by the next prune. */
    char out[512], tmp[1024], path[1200];
    snprintf(out, sizeof out, "%s/crash", root);
    CHECK(save1(out, 10, 1, 0) == 0);
    snprintf(tmp, sizeof tmp, "%s/checkpoints/.tmp.step_00000020", out);
    CHECK(mkdir(tmp, 0755) == 0);
    snprintf(path, sizeof path, "%s/rank_00000.safetensors", tmp);
    FILE *f = fopen(path, "w");
    fputs("partial", f);
    fclose(f);
    int64_t step = -1;
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 1 && step == 10);
    CHECK(ckpt_prune(out, 5) == 1);
    CHECK(access(tmp, F_OK) != 0);
    /* A later save of the same step works over a stale temp directory. */
    CHECK(mkdir(tmp, 0755) == 0);
    CHECK(save1(out, 20, 3, 0) == 0);
    CHECK(ckpt_find_latest(out, 1, path, sizeof path, &step) == 1 && step == 20);
    CHECK(check_load(path, 20, 3) == 0);
}

/* ---- multi-rank ------------------------------------------------------------ */

#define WORLD 3
struct rank_arg {
    pthread_barrier_t *bar;
    const char *out;
    int rank;
    int64_t step;
    int fail; /* this rank writes a bad tensor */
    int rc;
    char err[512];
};

static int thread_barrier(void *ctx) {
    int rc = pthread_barrier_wait(ctx);
    return rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD ? 0 : -1;
}

static void *rank_main(void *p) {
    struct rank_arg *a = p;
    float shard[300];
    fill(shard, 300, (uint64_t)(a->rank * 1000 + a->step));
    struct ckpt_opts o = {.out_dir = a->out,
                          .rank = a->rank,
                          .world = WORLD,
                          .barrier = thread_barrier,
                          .barrier_ctx = a->bar,
                          .keep = 3};
    struct ckpt_writer *w = NULL;
    a->rc = ckpt_begin(&o, a->step, &w, a->err, sizeof a->err);
    if (a->rc) return NULL;
    ckpt_add_f32(w, "params", shard, 300);
    if (a->fail) {
        int64_t shape[1] = {10};
        ckpt_add(w, "broken", ST_F32, NULL, 1, shape); /* NULL data: the write fails */
    }
    ckpt_set_rank_meta(w, json_pack("{s:i,s:i}", "offset", a->rank * 300, "count", 300));
    json_t *man = a->rank == 0 ? json_pack("{s:{s:i}}", "layout", "dp", WORLD) : NULL;
    a->rc = ckpt_commit(w, man, NULL, 0, a->err, sizeof a->err);
    json_decref(man);
    return NULL;
}

static void run_ranks(const char *out, int64_t step, int failing_rank, struct rank_arg *a) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, WORLD);
    pthread_t th[WORLD];
    for (int r = 0; r < WORLD; r++) {
        a[r] = (struct rank_arg){
            .bar = &bar, .out = out, .rank = r, .step = step, .fail = r == failing_rank};
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    }
    for (int r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
}

/* ckpt_find_latest_shared on WORLD threads; the agreement is an AND over a
 * shared array between two barriers. */
struct agree_ctx {
    pthread_barrier_t *bar;
    int *slots;
    int rank;
    const char *out;
    int found;
    int64_t step;
};

static int thread_agree(void *p, int *ok) {
    struct agree_ctx *c = p;
    c->slots[c->rank] = *ok;
    pthread_barrier_wait(c->bar);
    int all = 1;
    for (int r = 0; r < WORLD; r++)
        all &= c->slots[r];
    pthread_barrier_wait(c->bar);
    *ok = all;
    return 0;
}

static void *find_main(void *p) {
    struct agree_ctx *c = p;
    char path[1024];
    c->found = ckpt_find_latest_shared(c->out, WORLD, c->rank, thread_agree, c, path, sizeof path,
                                       &c->step);
    return NULL;
}

static void find_shared(const char *out, int *found, int64_t *steps) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, WORLD);
    int slots[WORLD];
    struct agree_ctx c[WORLD];
    pthread_t th[WORLD];
    for (int r = 0; r < WORLD; r++) {
        c[r] = (struct agree_ctx){.bar = &bar, .slots = slots, .rank = r, .out = out, .step = -1};
        pthread_create(&th[r], NULL, find_main, &c[r]);
    }
    for (int r = 0; r < WORLD; r++) {
        pthread_join(th[r], NULL);
        found[r] = c[r].found;
        steps[r] = c[r].step;
    }
    pthread_barrier_destroy(&bar);
}

static void test_multi_rank(void) {
    char out[512], path[1024], err[512];
    snprintf(out, sizeof out, "%s/multi", root);
    struct rank_arg a[WORLD];
    run_ranks(out, 100, -1, a);
    for (int r = 0; r < WORLD; r++) {
        if (a[r].rc) fprintf(stderr, "rank %d: %s\n", r, a[r].err);
        CHECK(a[r].rc == 0);
    }
    int64_t step = -1;
    CHECK(ckpt_find_latest(out, WORLD, path, sizeof path, &step) == 1 && step == 100);
    CHECK(ckpt_find_latest(out, 2, path, sizeof path, &step) == 0); /* other world: skipped */
    snprintf(path, sizeof path, "%s/checkpoints/step_00000100", out);
    CHECK(ckpt_verify(path, WORLD, err, sizeof err) == 0);
    for (int r = 0; r < WORLD; r++) {
        struct ckpt_reader *rd = NULL;
        CHECK(ckpt_open(path, r, &rd, err, sizeof err) == 0);
        if (!rd) continue;
        float want[300], got[300];
        fill(want, 300, (uint64_t)(r * 1000 + 100));
        CHECK(ckpt_read_f32(rd, "params", got, 300, err, sizeof err) == 0);
        CHECK(memcmp(want, got, sizeof got) == 0);
        CHECK(json_integer_value(json_object_get(ckpt_rank_meta(rd), "offset")) == r * 300);
        CHECK(ckpt_world(rd) == WORLD);
        ckpt_close(rd);
    }
    /* Rank 1 fails: nobody hangs, everybody gets an error, nothing is renamed. */
    run_ranks(out, 200, 1, a);
    for (int r = 0; r < WORLD; r++)
        CHECK(a[r].rc != 0);
    CHECK(strstr(a[0].err, "rank 1 did not write its shard") != NULL);
    CHECK(strstr(a[1].err, "NULL data") != NULL);
    CHECK(strstr(a[2].err, "was not completed by rank 0") != NULL);
    CHECK(ckpt_find_latest(out, WORLD, path, sizeof path, &step) == 1 && step == 100);
    /* Re-saving an existing step with a failing rank: the old save stays, and
     * no rank mistakes it for the new one. */
    run_ranks(out, 100, 1, a);
    for (int r = 0; r < WORLD; r++)
        CHECK(a[r].rc != 0);
    CHECK(strstr(a[2].err, "is not this save's") != NULL);
    CHECK(ckpt_find_latest(out, WORLD, path, sizeof path, &step) == 1 && step == 100);
    /* The next good save cleans the leftover temp directories. */
    run_ranks(out, 300, -1, a);
    for (int r = 0; r < WORLD; r++)
        CHECK(a[r].rc == 0);
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "test \"$(ls -A %s/checkpoints | tr '\\n' ' ')\" = "
             "'step_00000100 step_00000300 '",
             out);
    CHECK(system(cmd) == 0);

    /* Shared verification: all ranks agree on 300; after a flipped byte in rank
     * 2's shard (only rank 2 hashes it) all agree on 100. */
    int found[WORLD];
    int64_t steps[WORLD];
    find_shared(out, found, steps);
    for (int r = 0; r < WORLD; r++)
        CHECK(found[r] == 1 && steps[r] == 300);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000300/rank_00002.safetensors", out);
    FILE *f = fopen(path, "r+b");
    fseek(f, -7, SEEK_END);
    int byte = fgetc(f);
    fseek(f, -7, SEEK_END);
    fputc(byte ^ 0x5a, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000300", out);
    CHECK(ckpt_verify_rank(path, WORLD, 0, err, sizeof err) == 0);
    CHECK(ckpt_verify_rank(path, WORLD, 2, err, sizeof err) == CKPT_ECORRUPT);
    CHECK(strstr(err, "rank_00002.safetensors: SHA-256 mismatch") != NULL);
    find_shared(out, found, steps);
    for (int r = 0; r < WORLD; r++)
        CHECK(found[r] == 1 && steps[r] == 100);
}

int main(void) {
    log_init("test_checkpoint", LOG_ERROR); /* skipped checkpoints warn by design */
    snprintf(root, sizeof root, "/tmp/loom_test_ckpt_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip_keep();
    test_corruption();
    test_multi_rank();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (check_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    if (check_failures)
        fprintf(stderr, "%d check(s) failed (files kept in %s)\n", check_failures, root);
    return check_failures ? 1 : 0;
}
