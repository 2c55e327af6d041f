/* Unit tests of worker/data: every malformed-shard case (table-driven), v1/v2
 * round trip, the permutation is a bijection, dp ranks read disjoint samples,
 * an epoch visits every sample once, batches are a pure function of
 * (seed, step) (a loader opened again, as on resume, reads the same batches),
 * layout equivalence (dp x accum with the same product), the position's JSON
 * round trip and mismatch detection, validation order, vocab checks. */
#include "worker/data.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void path_in(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", dir, name);
}

/* Write raw bytes: a header (magic, version, count) and `nbytes` body bytes. */
static void write_raw(const char *path, int magic, int version, int count, size_t header_bytes,
                      size_t nbytes) {
    FILE *f = fopen(path, "wb");
    int32_t h[DATA_HEADER_INTS] = {magic, version, count};
    fwrite(h, 1, header_bytes, f);
    for (size_t i = 0; i < nbytes; i++)
        fputc((int)(i * 7 % 251), f);
    fclose(f);
}

static void test_malformed(void) {
    static const struct {
        const char *name;
        int magic, version, count;
        size_t header_bytes, body_bytes;
        int want_rc;
        const char *want_msg;
    } cases[] = {
        {"empty.bin", 0, 0, 0, 0, 0, DATA_EFORMAT, "shorter than the 1024-byte header"},
        {"short.bin", DATA_MAGIC, 1, 10, 500, 0, DATA_EFORMAT, "shorter than the 1024-byte header"},
        {"magic.bin", 12345, 1, 10, 1024, 20, DATA_EFORMAT, "magic number is 12345"},
        {"text.bin", 0x6c6c6568, 1, 10, 1024, 20, DATA_EFORMAT, "not a token shard"},
        {"version0.bin", DATA_MAGIC, 0, 10, 1024, 20, DATA_EFORMAT, "unsupported shard version 0"},
        {"version3.bin", DATA_MAGIC, 3, 10, 1024, 40, DATA_EFORMAT, "unsupported shard version 3"},
        {"trunc_v1.bin", DATA_MAGIC, 1, 100, 1024, 150, DATA_EFORMAT,
         "truncated: header says 100 tokens (1224 bytes) but the file has 1174 bytes"},
        {"trunc_v2.bin", DATA_MAGIC, 2, 100, 1024, 200, DATA_EFORMAT,
         "truncated: header says 100 tokens (1424 bytes)"},
        {"v1_as_v2.bin", DATA_MAGIC, 2, 100, 1024, 200, DATA_EFORMAT, "truncated"},
        {"trailing.bin", DATA_MAGIC, 1, 10, 1024, 21, DATA_EFORMAT, "1 unexpected trailing bytes"},
        {"odd_trunc.bin", DATA_MAGIC, 1, 10, 1024, 19, DATA_EFORMAT, "truncated"},
        {"ok_v1.bin", DATA_MAGIC, 1, 10, 1024, 20, 0, ""},
        {"ok_v2.bin", DATA_MAGIC, 2, 10, 1024, 40, 0, ""},
        {"ok_zero.bin", DATA_MAGIC, 1, 0, 1024, 0, 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[512], err[512] = "";
        path_in(p, sizeof p, cases[i].name);
        write_raw(p, cases[i].magic, cases[i].version, cases[i].count, cases[i].header_bytes,
                  cases[i].body_bytes);
        int version = -1;
        uint64_t n = 0;
        int rc = data_shard_check(p, &version, &n, err, sizeof err);
        if (rc != cases[i].want_rc || !strstr(err, cases[i].want_msg) ||
            (rc && !strstr(err, cases[i].name))) {
            fprintf(stderr, "case %s: rc %d (want %d), message \"%s\" (want \"%s\" and the name)\n",
                    cases[i].name, rc, cases[i].want_rc, err, cases[i].want_msg);
            check_failures++;
        }
        if (rc == 0) {
            CHECK(version == cases[i].version);
            CHECK(n == (uint64_t)cases[i].count);
        }
        /* The loader refuses the same file with the same message. */
        if (rc != 0) {
            struct data_loader_opts o = {
                .pattern = p, .B = 1, .T = 4, .dp_size = 1, .grad_accum = 1};
            struct data_loader *dl = (struct data_loader *)1;
            char err2[512] = "";
            CHECK(data_loader_open(&o, &dl, err2, sizeof err2) == cases[i].want_rc);
            CHECK(dl == NULL);
            CHECK(strcmp(err, err2) == 0);
        }
    }
    /* Not a regular file, missing file, no glob match, empty pattern. */
    char err[512] = "";
    CHECK(data_shard_check(dir, NULL, NULL, err, sizeof err) == DATA_EFORMAT);
    CHECK(strstr(err, "not a regular file") != NULL);
    char p[512];
    path_in(p, sizeof p, "missing.bin");
    CHECK(data_shard_check(p, NULL, NULL, err, sizeof err) == DATA_EIO);
    CHECK(strstr(err, "missing.bin") && strstr(err, "cannot open"));
    char **paths = NULL;
    size_t np = 0;
    path_in(p, sizeof p, "nothing_*.bin");
    CHECK(data_glob(p, &paths, &np, err, sizeof err) == DATA_EEMPTY);
    CHECK(strstr(err, "nothing_*.bin") != NULL && paths == NULL && np == 0);
    CHECK(data_glob("", &paths, &np, err, sizeof err) == DATA_EINVAL);
    /* Writer refuses tokens that do not fit version 1. */
    uint32_t big[2] = {5, 70000};
    path_in(p, sizeof p, "big.bin");
    CHECK(data_shard_write(p, 1, big, 2, err, sizeof err) == DATA_EINVAL);
    CHECK(strstr(err, "70000") != NULL);
    CHECK(access(p, F_OK) != 0);
    CHECK(data_shard_write(p, 2, big, 2, err, sizeof err) == 0);
}

/* A data set of `ns` shards in subdir `name` with token = shard * 1000000 + index (v2)
 * or index % 65536 (v1). */
static void make_set(const char *name, int ns, const size_t *lens, int version) {
    char d[512], p[600], err[256];
    path_in(d, sizeof d, name);
    mkdir(d, 0755);
    for (int s = 0; s < ns; s++) {
        uint32_t *t = malloc(lens[s] * sizeof *t);
        for (size_t i = 0; i < lens[s]; i++)
            t[i] = version == 2 ? (uint32_t)(s * 1000000 + i) : (uint32_t)((s * 1000 + i) % 65536);
        snprintf(p, sizeof p, "%s/shard_%03d.bin", d, s);
        if (data_shard_write(p, version, t, lens[s], err, sizeof err) != 0) {
            fprintf(stderr, "write %s: %s\n", p, err);
            check_failures++;
        }
        free(t);
    }
}

static struct data_loader *open_dl(const char *name, int B, int T, int dp, int accum, uint64_t seed,
                                   int shuffle) {
    char p[512], err[512] = "";
    path_in(p, sizeof p, name);
    struct data_loader_opts o = {.pattern = p,
                                 .B = B,
                                 .T = T,
                                 .dp_size = dp,
                                 .grad_accum = accum,
                                 .seed = seed,
                                 .shuffle = shuffle};
    struct data_loader *dl = NULL;
    if (data_loader_open(&o, &dl, err, sizeof err) != 0) {
        fprintf(stderr, "open %s: %s\n", p, err);
        check_failures++;
    }
    return dl;
}

static void test_roundtrip_sequential(void) {
    static const size_t lens[] = {1000, 17, 5, 333};
    for (int version = 1; version <= 2; version++) {
        char name[32];
        snprintf(name, sizeof name, "rt_v%d", version);
        make_set(name, 4, lens, version);
        const int T = 8, B = 3;
        struct data_loader *dl = open_dl(name, B, T, 1, 1, 7, 0);
        if (!dl) continue;
        /* windows per shard: (len-1)/T = 124, 2, 0, 41 */
        CHECK(data_loader_samples(dl) == 124 + 2 + 0 + 41);
        CHECK(data_loader_tokens(dl) == 1000 + 17 + 5 + 333);
        CHECK(data_loader_num_shards(dl) == 4);
        CHECK(data_loader_steps_per_epoch(dl) == 167 / 3);
        int32_t in[3 * 8], tg[3 * 8];
        char err[256];
        /* step 41: samples 123, 124, 125 = shard 0 window 123, shard 1 windows 0, 1 */
        CHECK(data_loader_batch(dl, 41, 0, 0, in, tg, err, sizeof err) == 0);
        const int64_t want_first[3] = {123 * 8, 1000000 + 0, 1000000 + 8};
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                int64_t tok = want_first[b] + t;
                if (version == 1) tok = (tok >= 1000000 ? tok - 1000000 + 1000 : tok) % 65536;
                CHECK(in[b * T + t] == tok);
                CHECK(tg[b * T + t] == (version == 1 ? (tok + 1) % 65536 : tok + 1));
            }
        /* Wrap-around: step 55 reads samples 165, 166, 0 (next epoch). */
        CHECK(data_loader_sample(dl, 55, 0, 0, 2) == 0);
        CHECK(data_loader_sample(dl, 55, 0, 0, 0) == 165);
        /* Bad arguments. */
        CHECK(data_loader_batch(dl, -1, 0, 0, in, tg, err, sizeof err) == DATA_EINVAL);
        CHECK(data_loader_batch(dl, 0, 1, 0, in, tg, err, sizeof err) == DATA_EINVAL);
        CHECK(data_loader_batch(dl, 0, 0, 1, in, tg, err, sizeof err) == DATA_EINVAL);
        CHECK(data_loader_sample(dl, 0, 0, 0, 3) == -1);
        data_loader_free(dl);
    }
}

static void test_permutation(void) {
    static const uint64_t ns[] = {1, 2, 3, 4, 5, 7, 16, 100, 1000, 4097, 65536};
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        uint64_t n = ns[k];
        unsigned char *seen = calloc(n, 1);
        int ok = 1;
        uint64_t fixed = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = data_permute(i, n, 42, 3);
            if (j >= n || seen[j]) ok = 0;
            if (j < n) seen[j] = 1;
            if (j == i) fixed++;
        }
        if (!ok) fprintf(stderr, "permutation of %llu is not a bijection\n", (unsigned long long)n);
        CHECK(ok);
        /* A shuffle, not the identity: few fixed points for large n. */
        if (n >= 100) CHECK(fixed < n / 10);
        free(seen);
    }
    /* Different epochs and seeds give different orders; same inputs the same. */
    int diff_epoch = 0, diff_seed = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        diff_epoch += data_permute(i, 1000, 42, 0) != data_permute(i, 1000, 42, 1);
        diff_seed += data_permute(i, 1000, 42, 0) != data_permute(i, 1000, 43, 0);
        CHECK(data_permute(i, 1000, 42, 5) == data_permute(i, 1000, 42, 5));
    }
    CHECK(diff_epoch > 900 && diff_seed > 900);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sorted sample indices of one global step. */
static void step_samples(const struct data_loader *dl, int64_t step, int dp, int accum, int B,
                         int64_t *out) {
    int k = 0;
    for (int m = 0; m < accum; m++)
        for (int r = 0; r < dp; r++)
            for (int b = 0; b < B; b++)
                out[k++] = data_loader_sample(dl, step, m, r, b);
    qsort(out, (size_t)k, sizeof *out, cmp_i64);
}

static void test_disjoint_epoch_layout(void) {
    static const size_t lens[] = {4801, 2401, 1201}; /* T=16: 300 + 150 + 75 = 525 samples */
    make_set("ds", 3, lens, 2);
    const int B = 2, T = 16, dp = 4, accum = 3; /* G = 24 */
    struct data_loader *dl = open_dl("ds", B, T, dp, accum, 1234, 1);
    if (!dl) return;
    int64_t N = data_loader_samples(dl);
    CHECK(N == 525);
    CHECK(data_loader_samples_per_step(dl) == 24);
    /* Disjoint within each step, and one epoch's positions cover every sample once. */
    unsigned char *seen = calloc((size_t)N, 1);
    int64_t s[24];
    int64_t covered = 0;
    for (int64_t step = 0; step < 21; step++) { /* 21 * 24 = 504 positions of epoch 0 */
        step_samples(dl, step, dp, accum, B, s);
        for (int i = 0; i < 24; i++) {
            CHECK(s[i] >= 0 && s[i] < N);
            if (i) CHECK(s[i] != s[i - 1]);
            if (s[i] >= 0 && s[i] < N && !seen[s[i]]) {
                seen[s[i]] = 1;
                covered++;
            }
        }
    }
    CHECK(covered == 504);
    /* Step 21 holds the epoch's last 21 positions and the next epoch's first 3. */
    for (int m = 0; m < accum; m++)
        for (int r = 0; r < dp; r++)
            for (int b = 0; b < B; b++) {
                int64_t p = 21 * 24 + (m * dp + r) * B + b;
                int64_t g = data_loader_sample(dl, 21, m, r, b);
                if (p < N) {
                    CHECK(!seen[g]);
                    seen[g] = 1;
                    covered++;
                }
            }
    CHECK(covered == N);
    free(seen);
    /* Window contents of different ranks are different windows (tokens unique). */
    int32_t w0[2 * 17], w1[2 * 17];
    char err[256];
    CHECK(data_loader_window(dl, 5, 1, 0, w0, err, sizeof err) == 0);
    CHECK(data_loader_window(dl, 5, 1, 1, w1, err, sizeof err) == 0);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            CHECK(w0[i * 17] != w1[j * 17]);
    /* Each window is T+1 consecutive tokens of one shard. */
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 16; t++)
            CHECK(w0[b * 17 + t + 1] == w0[b * 17 + t] + 1);

    /* Layout equivalence: same G, same samples per step. */
    struct data_loader *a = open_dl("ds", 4, T, 2, 1, 99, 1);
    struct data_loader *b = open_dl("ds", 4, T, 1, 2, 99, 1);
    struct data_loader *c = open_dl("ds", 2, T, 1, 4, 99, 1);
    if (a && b && c)
        for (int64_t step = 0; step < 200; step += 7) {
            int64_t sa[8], sb[8], sc[8];
            step_samples(a, step, 2, 1, 4, sa);
            step_samples(b, step, 1, 2, 4, sb);
            step_samples(c, step, 1, 4, 2, sc);
            CHECK(memcmp(sa, sb, sizeof sa) == 0);
            CHECK(memcmp(sa, sc, sizeof sa) == 0);
        }
    data_loader_free(a);
    data_loader_free(b);
    data_loader_free(c);
    data_loader_free(dl);
}

static void test_determinism_resume(void) {
    const int B = 3, T = 16, dp = 2, accum = 2;
    struct data_loader *x = open_dl("ds", B, T, dp, accum, 7, 1);
    struct data_loader *y = open_dl("ds", B, T, dp, accum, 7, 1); /* "resumed" process */
    struct data_loader *z = open_dl("ds", B, T, dp, accum, 8, 1); /* other seed */
    if (!x || !y || !z) goto out;
    size_t n = (size_t)B * T;
    int32_t *ix = malloc(n * 4), *tx = malloc(n * 4), *iy = malloc(n * 4), *ty = malloc(n * 4);
    char err[256];
    int differ_seed = 0;
    /* Steps 0..120 cross several epochs (N = 525, G = 12). */
    for (int64_t step = 0; step <= 120; step++)
        for (int m = 0; m < accum; m++)
            for (int r = 0; r < dp; r++) {
                CHECK(data_loader_batch(x, step, m, r, ix, tx, err, sizeof err) == 0);
                CHECK(data_loader_batch(y, step, m, r, iy, ty, err, sizeof err) == 0);
                CHECK(memcmp(ix, iy, n * 4) == 0 && memcmp(tx, ty, n * 4) == 0);
                CHECK(data_loader_batch(z, step, m, r, iy, ty, err, sizeof err) == 0);
                differ_seed += memcmp(ix, iy, n * 4) != 0;
            }
    CHECK(differ_seed > 400);
    /* Position at step 100 (1200 samples consumed: epoch 2, index 150) round-trips. */
    struct data_position pos, back;
    data_loader_position(x, 100, &pos);
    CHECK(pos.step == 100 && pos.epoch == 2 && pos.sample_in_epoch == 150);
    CHECK(pos.samples_consumed == 1200 && pos.samples_per_step == 12 && pos.shards == 3);
    json_t *j = data_position_to_json(&pos);
    char *s = json_dumps(j, JSON_COMPACT);
    json_t *j2 = json_loads(s, 0, NULL);
    CHECK(data_position_from_json(j2, &back, err, sizeof err) == 0);
    CHECK(memcmp(&pos, &back, sizeof pos) == 0);
    CHECK(data_loader_check_position(y, &back, err, sizeof err) == 0);
    /* Another seed or batch shape is reported. */
    CHECK(data_loader_check_position(z, &back, err, sizeof err) == DATA_EMISMATCH);
    CHECK(strstr(err, "seed was 7, is now 8") != NULL);
    struct data_loader *w = open_dl("ds", B, T, dp, 1, 7, 1);
    if (w) {
        CHECK(data_loader_check_position(w, &back, err, sizeof err) == DATA_EMISMATCH);
        CHECK(strstr(err, "samples per step was 12, is now 6") != NULL);
    }
    data_loader_free(w);
    json_object_del(j2, "seed");
    CHECK(data_position_from_json(j2, &back, err, sizeof err) == DATA_EINVAL);
    CHECK(strstr(err, "seed") != NULL);
    json_decref(j);
    json_decref(j2);
    free(s);
    free(ix);
    free(tx);
    free(iy);
    free(ty);
out:
    data_loader_free(x);
    data_loader_free(y);
    data_loader_free(z);
}

static void test_val_and_vocab(void) {
    /* Validation: sequential, disjoint across ranks. */
    struct data_loader *v = open_dl("ds", 2, 16, 3, 1, 0, 0);
    if (v) {
        CHECK(data_loader_steps_per_epoch(v) == 525 / 6);
        for (int i = 0; i < 5; i++)
            for (int r = 0; r < 3; r++)
                for (int b = 0; b < 2; b++)
                    CHECK(data_loader_sample(v, i, 0, r, b) == i * 6 + r * 2 + b);
    }
    data_loader_free(v);

    /* Vocab: token 300 >= 256 rejected at open (scan) or when read (no scan). */
    uint32_t t[200];
    for (int i = 0; i < 200; i++)
        t[i] = (uint32_t)(i % 200);
    t[150] = 300;
    char p[512], err[512] = "";
    path_in(p, sizeof p, "vocab.bin");
    CHECK(data_shard_write(p, 1, t, 200, err, sizeof err) == 0);
    struct data_loader_opts o = {.pattern = p,
                                 .vocab_size = 256,
                                 .B = 1,
                                 .T = 10,
                                 .dp_size = 1,
                                 .grad_accum = 1,
                                 .token_check = DATA_CHECK_OPEN};
    struct data_loader *dl = NULL;
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == DATA_EVOCAB);
    CHECK(strstr(err, "vocab.bin") && strstr(err, "token 300 at index 150") &&
          strstr(err, "vocab_size 256"));
    o.token_check = DATA_CHECK_AUTO; /* small data: scanned at open too */
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == DATA_EVOCAB);
    o.token_check = DATA_CHECK_READ;
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == 0);
    if (dl) {
        int32_t in[10], tg[10];
        CHECK(data_loader_batch(dl, 0, 0, 0, in, tg, err, sizeof err) == 0);
        CHECK(data_loader_batch(dl, 15, 0, 0, in, tg, err, sizeof err) == DATA_EVOCAB);
        CHECK(strstr(err, "token 300 at index 150") != NULL);
        data_loader_free(dl);
    }
    o.vocab_size = 301;
    o.token_check = DATA_CHECK_OPEN;
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == 0);
    data_loader_free(dl);

    /* Too little data for one sequence. */
    o.T = 200;
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == DATA_EEMPTY);
    CHECK(strstr(err, "seq_len+1 = 201") != NULL);

    /* Comma lists and directories expand in order. */
    char **paths = NULL;
    size_t np = 0;
    char pat[1200], d1[512], d2[512];
    path_in(d1, sizeof d1, "rt_v1");
    path_in(d2, sizeof d2, "ds/shard_00[12].bin");
    snprintf(pat, sizeof pat, "%s,%s", d2, d1);
    CHECK(data_glob(pat, &paths, &np, err, sizeof err) == 0);
    CHECK(np == 6);
    if (np == 6) {
        CHECK(strstr(paths[0], "ds/shard_001.bin") && strstr(paths[1], "ds/shard_002.bin"));
        CHECK(strstr(paths[2], "rt_v1/shard_000.bin") && strstr(paths[5], "rt_v1/shard_003.bin"));
        CHECK(paths[6] == NULL);
    }
    data_paths_free(paths);
}

/* Loss masks: shard_001.mask beside shard_001.bin turns the targets whose token is masked
 * into -1; shard_000 has no mask (every target counts); a mask of the wrong size is refused
 * naming it. */
static void test_mask(void) {
    static const size_t lens[] = {17, 33};
    make_set("mask", 2, lens, 2);
    char p[600], err[512] = "";
    uint8_t m[33];
    for (int i = 0; i < 33; i++)
        m[i] = (uint8_t)(i % 3 != 0); /* tokens 0, 3, 6, ... are not targets */
    path_in(p, sizeof p, "mask/shard_001.mask");
    CHECK(data_mask_write(p, m, 33, err, sizeof err) == 0);
    const int T = 8, B = 1;
    struct data_loader *dl = open_dl("mask", B, T, 1, 1, 1, 0);
    if (!dl) return;
    int32_t in[8], tg[8];
    /* sequential: samples 0, 1 are shard 0, samples 2..5 shard 1 */
    CHECK(data_loader_batch(dl, 1, 0, 0, in, tg, err, sizeof err) == 0);
    for (int t = 0; t < T; t++)
        CHECK(tg[t] == 8 + t + 1);
    for (int w = 0; w < 4; w++) {
        CHECK(data_loader_batch(dl, 2 + w, 0, 0, in, tg, err, sizeof err) == 0);
        for (int t = 0; t < T; t++) {
            int tok = w * T + t + 1; /* index in shard 1 of the token predicted */
            CHECK(in[t] == 1000000 + tok - 1);
            CHECK(tg[t] == (tok % 3 ? 1000000 + tok : -1));
        }
    }
    data_loader_free(dl);
    /* A step's counted targets, over every micro-step and dp rank: the targets the batches
     * of that step leave at >= 0 (shuffled, dp 2 x accum 2 x B 1 = 4 of the 6 windows). */
    dl = open_dl("mask", 1, T, 2, 2, 7, 1);
    for (int64_t step = 0; dl && step < 5; step++) {
        int64_t want = 0;
        for (int mi = 0; mi < 2; mi++)
            for (int r = 0; r < 2; r++) {
                CHECK(data_loader_batch(dl, step, mi, r, in, tg, err, sizeof err) == 0);
                for (int t = 0; t < T; t++)
                    want += tg[t] >= 0;
            }
        CHECK(data_loader_step_loss_tokens(dl, step) == want);
        CHECK(want < 4 * T); /* 4 of 6 windows: at least 2 from the masked shard */
    }
    CHECK(!dl || data_loader_step_loss_tokens(dl, -1) == -1);
    data_loader_free(dl);
    CHECK(data_mask_write(p, m, 32, err, sizeof err) == 0);
    path_in(p, sizeof p, "mask");
    struct data_loader_opts o = {.pattern = p, .B = 1, .T = 8, .dp_size = 1, .grad_accum = 1};
    CHECK(data_loader_open(&o, &dl, err, sizeof err) == DATA_EFORMAT);
    CHECK(strstr(err, "shard_001.mask") && strstr(err, "33 tokens"));
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/loom_test_data_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_malformed();
    test_roundtrip_sequential();
    test_permutation();
    test_disjoint_epoch_layout();
    test_determinism_resume();
    test_val_and_vocab();
    test_mask();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (check_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    if (check_failures)
        fprintf(stderr, "%d check(s) failed (files kept in %s)\n", check_failures, dir);
    return check_failures ? 1 : 0;
}
