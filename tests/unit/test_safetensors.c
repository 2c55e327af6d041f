/* Unit tests of worker/safetensors: files written by st_write are parsed back
 * by an independent reader written here (length prefix, header JSON, offsets,
 * raw bytes), F32 -> BF16 rounding against hand-computed values, transposed
 * writes, SHA-256 against the FIPS 180-2 "abc" vector, st_open refusing every
 * malformed-file case (table-driven), and the Hugging Face export of the
 * "tiny" GPT-2 and Llama presets (names, shapes, transposes, vocab rows).
 *
 * `test_safetensors --write FILE` writes the tiny GPT-2 export (parameter i =
 * (i % 1000) / 1000) for tests/unit/check_safetensors.py. */
#include "worker/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/model.h"
#include "tests/check.h"

static char dir[256];

/* ---- independent reader ---------------------------------------------------- */

struct raw {
    unsigned char *bytes;
    size_t size;
    uint64_t hlen;
    json_t *header;
};

static int raw_load(const char *path, struct raw *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    r->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    r->bytes = malloc(r->size ? r->size : 1);
    size_t got = fread(r->bytes, 1, r->size, f);
    fclose(f);
    if (got != r->size || r->size < 8) return -1;
    for (int i = 7; i >= 0; i--) /* little-endian u64, byte by byte */
        r->hlen = (r->hlen << 8) | r->bytes[i];
    if (8 + r->hlen > r->size) return -1;
    r->header = json_loadb((const char *)r->bytes + 8, r->hlen, 0, NULL);
    return r->header ? 0 : -1;
}

static void raw_free(struct raw *r) {
    free(r->bytes);
    json_decref(r->header);
}

/* Pointer to tensor `name`'s bytes after checking dtype and shape; NULL on mismatch. */
static const unsigned char *raw_tensor(const struct raw *r, const char *name, const char *dtype,
                                       int ndim, const int64_t *shape, size_t elem) {
    json_t *t = json_object_get(r->header, name);
    if (!t || strcmp(json_string_value(json_object_get(t, "dtype")), dtype) != 0) return NULL;
    json_t *sh = json_object_get(t, "shape");
    if ((int)json_array_size(sh) != ndim) return NULL;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (json_integer_value(json_array_get(sh, (size_t)i)) != shape[i]) return NULL;
        n *= (size_t)shape[i];
    }
    json_t *off = json_object_get(t, "data_offsets");
    size_t b = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
    if (e - b != n * elem || 8 + r->hlen + e > r->size) return NULL;
    return r->bytes + 8 + r->hlen + b;
}

/* ---- tests ----------------------------------------------------------------- */

static void test_write_read(void) {
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    /* bf16 rounding: exact, round down, tie to even (down), tie to even (up), NaN, inf */
    float b[6];
    uint32_t bu[6] = {0x3f800000, 0x40490fdb, 0x3f808000, 0x3f818000, 0x7fc00001, 0x7f800000};
    const uint16_t b_want[6] = {0x3f80, 0x4049, 0x3f80, 0x3f82, 0x7fc0, 0x7f80};
    memcpy(b, bu, sizeof b);
    float m[6] = {0, 1, 2, 10, 11, 12}; /* memory [2][3]; file [3][2] transposed */
    int64_t counter = 123456789012345LL;
    struct st_tensor t[] = {
        {.name = "a", .dtype = ST_F32, .src_dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = ST_BF16, .src_dtype = ST_F32, .ndim = 1, .shape = {6}, .data = b},
        {.name = "m.t",
         .dtype = ST_F32,
         .src_dtype = ST_F32,
         .ndim = 2,
         .shape = {3, 2},
         .data = m,
         .transpose = 1},
        {.name = "count", .dtype = ST_I64, .src_dtype = ST_I64, .ndim = 0, .data = &counter},
        {.name = "empty", .dtype = ST_F32, .src_dtype = ST_F32, .ndim = 2, .shape = {0, 4}},
    };
    json_t *md = json_pack("{s:s}", "k", "v");
    unsigned char sha[32];
    uint64_t bytes = 0;
    CHECK(st_write(path, t, 5, md, sha, &bytes, err, sizeof err) == 0);

    struct raw r;
    CHECK(raw_load(path, &r) == 0);
    CHECK(bytes == r.size);
    CHECK((8 + r.hlen) % 8 == 0);
    CHECK(r.size == 8 + r.hlen + 24 + 12 + 24 + 8);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(r.header, "__metadata__"), "k")),
                 "v") == 0);
    const unsigned char *p = raw_tensor(&r, "a", "F32", 2, (int64_t[]){2, 3}, 4);
    CHECK(p && memcmp(p, a, 24) == 0);
    p = raw_tensor(&r, "b", "BF16", 1, (int64_t[]){6}, 2);
    CHECK(p != NULL);
    for (int i = 0; p && i < 6; i++) {
        uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        if (h != b_want[i]) fprintf(stderr, "bf16[%d] = %04x, want %04x\n", i, h, b_want[i]);
        CHECK(h == b_want[i]);
    }
    p = raw_tensor(&r, "m.t", "F32", 2, (int64_t[]){3, 2}, 4);
    const float mt[6] = {0, 10, 1, 11, 2, 12};
    CHECK(p && memcmp(p, mt, 24) == 0);
    p = raw_tensor(&r, "count", "I64", 0, NULL, 8);
    CHECK(p && memcmp(p, &counter, 8) == 0);
    CHECK(raw_tensor(&r, "empty", "F32", 2, (int64_t[]){0, 4}, 4) != NULL);
    raw_free(&r);

    /* Checksum matches a re-read of the file. */
    char hex[65], hex2[65];
    st_hex(sha, hex);
    CHECK(st_sha256_file(path, hex2, NULL, err, sizeof err) == 0 && strcmp(hex, hex2) == 0);

    /* Our own reader agrees, converts BF16 -> F32, refuses wrong sizes. */
    struct st_file *f = NULL;
    CHECK(st_open(path, &f, err, sizeof err) == 0);
    if (f) {
        CHECK(st_count(f) == 5);
        CHECK(strcmp(json_string_value(json_object_get(st_metadata(f), "k")), "v") == 0);
        float got[6];
        CHECK(st_read(f, "a", ST_F32, got, sizeof got, err, sizeof err) == 0);
        CHECK(memcmp(got, a, sizeof a) == 0);
        CHECK(st_read(f, "b", ST_F32, got, sizeof got, err, sizeof err) == 0);
        CHECK(got[0] == 1.0f && got[1] == 3.140625f && got[3] == 1.015625f && isnan(got[4]) &&
              isinf(got[5]));
        CHECK(st_read(f, "a", ST_F32, got, 20, err, sizeof err) == ST_EINVAL);
        CHECK(st_read(f, "a", ST_I32, got, 24, err, sizeof err) == ST_EINVAL);
        CHECK(st_read(f, "zz", ST_F32, got, 24, err, sizeof err) == ST_ENOTFOUND);
        const struct st_info *in = st_find(f, "count");
        CHECK(in && in->ndim == 0 && in->nbytes == 8 && in->dtype == ST_I64);
        st_close(f);
    }

    /* Writer argument checks. */
    struct st_tensor dup[2] = {t[0], t[0]};
    CHECK(st_write(path, dup, 2, NULL, NULL, NULL, err, sizeof err) == ST_EINVAL);
    CHECK(strstr(err, "duplicate") != NULL);
    struct st_tensor bad = t[0];
    bad.src_dtype = ST_I32;
    CHECK(st_write(path, &bad, 1, NULL, NULL, NULL, err, sizeof err) == ST_EINVAL);
    bad = t[1];
    bad.transpose = 1;
    CHECK(st_write(path, &bad, 1, NULL, NULL, NULL, err, sizeof err) == ST_EINVAL);
    bad = t[0];
    bad.name = "__metadata__";
    CHECK(st_write(path, &bad, 1, NULL, NULL, NULL, err, sizeof err) == ST_EINVAL);
    json_t *badmd = json_pack("{s:i}", "k", 1);
    CHECK(st_write(path, t, 1, badmd, NULL, NULL, err, sizeof err) == ST_EINVAL);
    json_decref(badmd);
    json_decref(md);
}

static void test_sha256(void) {
    char path[512], hex[65], err[256];
    snprintf(path, sizeof path, "%s/abc.txt", dir);
    FILE *f = fopen(path, "w");
    fputs("abc", f);
    fclose(f);
    uint64_t n = 0;
    CHECK(st_sha256_file(path, hex, &n, err, sizeof err) == 0 && n == 3);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
}

/* Write `body` (header JSON) with a correct or given length prefix and `data` bytes. */
static void write_file(const char *path, const char *body, int64_t hlen, size_t data) {
    FILE *f = fopen(path, "wb");
    uint64_t h = hlen >= 0 ? (uint64_t)hlen : strlen(body);
    fwrite(&h, 8, 1, f);
    fwrite(body, 1, strlen(body), f);
    for (size_t i = 0; i < data; i++)
        fputc(0, f);
    fclose(f);
}

static void test_malformed(void) {
    static const struct {
        const char *name, *body;
        int64_t hlen;
        size_t data;
        const char *want;
    } cases[] = {
        {"ok", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8, NULL},
        {"tiny file", "", 0, 0, "header length 0"},
        {"huge header length", "{}", 1 << 30, 0, "not a safetensors file or truncated"},
        {"header past end", "{}", 100, 0, "truncated"},
        {"not json", "hello!!!", -1, 0, "not a JSON object"},
        {"json array", "[1,2]   ", -1, 0, "not a JSON object"},
        {"bad dtype", "{\"x\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 8,
         "bad header entry"},
        {"shape mismatch", "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1,
         8, "do not match"},
        {"negative dim", "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", -1, 8,
         "bad shape"},
        {"hole", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", -1, 12,
         "overlap or hole"},
        {"overlap",
         "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         -1, 8, "overlap or hole"},
        {"truncated data", "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", -1,
         10, "truncated"},
        {"trailing data", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", -1, 9,
         "trailing bytes"},
        {"bad metadata", "{\"__metadata__\":{\"a\":1}}", -1, 0, "__metadata__"},
        {"duplicate key",
         "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         -1, 8, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[512], err[512] = "";
        snprintf(path, sizeof path, "%s/bad%zu.safetensors", dir, i);
        write_file(path, cases[i].body, cases[i].hlen, cases[i].data);
        struct st_file *f = (struct st_file *)1;
        int rc = st_open(path, &f, err, sizeof err);
        int ok = cases[i].want
                     ? (rc != 0 && f == NULL && strstr(err, cases[i].want) && strstr(err, path))
                     : (rc == 0 && f != NULL);
        if (!ok) {
            fprintf(stderr, "case %s: rc %d, message \"%s\" (want \"%s\")\n", cases[i].name, rc,
                    err, cases[i].want ? cases[i].want : "success");
            check_failures++;
        }
        if (rc == 0) st_close(f);
    }
    char err[256];
    struct st_file *f = NULL;
    CHECK(st_open("/nonexistent/x.safetensors", &f, err, sizeof err) == ST_EIO);
}

/* Build a layout for a preset and params[i] = (i % 1000) / 1000. */
static float *tiny_params(enum model_family fam, struct model_config *c, struct model_layout *l) {
    const struct model_preset *p = model_preset_find(fam, "tiny");
    if (!p) return NULL;
    *c = p->config;
    if (model_layout_init(l, c, 1) != 0) return NULL;
    float *params = malloc((size_t)l->numel * sizeof *params);
    for (int64_t i = 0; i < l->numel; i++)
        params[i] = (float)(i % 1000) / 1000.0f;
    return params;
}

static int write_gpt2(const char *path, struct model_config *c, struct model_layout *l,
                      float **params) {
    char err[512] = "";
    *params = tiny_params(MODEL_GPT2, c, l);
    if (!*params) return -1;
    int rc = st_export_model(path, c, l, *params, ST_F32, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "export: %s\n", err);
    return rc;
}

static const struct model_tensor *find_t(const struct model_layout *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0) return &l->t[i];
    return NULL;
}

static void test_export(void) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/gpt2.safetensors", dir);
    struct model_config c;
    struct model_layout l;
    float *params = NULL;
    if (write_gpt2(path, &c, &l, &params) != 0) {
        CHECK(!"gpt2 export");
        return;
    }
    struct raw r;
    CHECK(raw_load(path, &r) == 0);
    int64_t d = c.d_model;
    CHECK(strcmp(json_string_value(
                     json_object_get(json_object_get(r.header, "__metadata__"), "format")),
                 "pt") == 0);
    CHECK(json_object_get(r.header, "lm_head.weight") == NULL); /* tied */
    /* wte: vocab_size rows (not padded_vocab), untouched values. */
    const struct model_tensor *wte = find_t(&l, "transformer.wte.weight");
    const float *p = (const float *)raw_tensor(&r, "transformer.wte.weight", "F32", 2,
                                               (int64_t[]){c.vocab_size, d}, 4);
    CHECK(wte && p && memcmp(p, params + wte->offset, (size_t)c.vocab_size * d * 4) == 0);
    /* c_attn: HF Conv1D [in, out] = [d, 3d], element [i][j] = memory [j][i]. */
    const struct model_tensor *qkv = find_t(&l, "transformer.h.1.attn.c_attn.weight");
    p = (const float *)raw_tensor(&r, "transformer.h.1.attn.c_attn.weight", "F32", 2,
                                  (int64_t[]){d, 3 * d}, 4);
    CHECK(qkv && p);
    int bad = 0;
    for (int64_t i = 0; p && qkv && i < d; i++)
        for (int64_t j = 0; j < 3 * d; j++)
            bad += p[i * 3 * d + j] != params[qkv->offset + j * d + i];
    CHECK(bad == 0);
    /* mlp.c_proj: memory [d, 4d] -> file [4d, d]. */
    CHECK(raw_tensor(&r, "transformer.h.0.mlp.c_proj.weight", "F32", 2, (int64_t[]){c.d_ff, d},
                     4) != NULL);
    CHECK(raw_tensor(&r, "transformer.h.0.mlp.c_fc.weight", "F32", 2, (int64_t[]){d, c.d_ff}, 4) !=
          NULL);
    CHECK(raw_tensor(&r, "transformer.h.0.ln_1.bias", "F32", 1, (int64_t[]){d}, 4) != NULL);
    CHECK(raw_tensor(&r, "transformer.wpe.weight", "F32", 2, (int64_t[]){c.seq_len, d}, 4));
    CHECK(raw_tensor(&r, "transformer.ln_f.weight", "F32", 1, (int64_t[]){d}, 4) != NULL);
    /* Every layout tensor but none else (+ metadata). */
    CHECK(json_object_size(r.header) == (size_t)l.n + 1);
    raw_free(&r);
    model_layout_free(&l);
    free(params);

    /* Llama: untied lm_head with vocab rows, linear weights not transposed, BF16. */
    params = tiny_params(MODEL_LLAMA, &c, &l);
    CHECK(params != NULL);
    if (!params) return;
    snprintf(path, sizeof path, "%s/llama.safetensors", dir);
    CHECK(st_export_model(path, &c, &l, params, ST_BF16, NULL, err, sizeof err) == 0);
    CHECK(raw_load(path, &r) == 0);
    d = c.d_model;
    CHECK(raw_tensor(&r, "lm_head.weight", "BF16", 2, (int64_t[]){c.vocab_size, d}, 2) != NULL);
    const struct model_tensor *kp = find_t(&l, "model.layers.0.self_attn.k_proj.weight");
    CHECK(kp != NULL);
    if (kp) {
        const unsigned char *b = raw_tensor(&r, kp->name, "BF16", 2, kp->shape, 2);
        CHECK(b != NULL);
        for (int64_t i = 0; b && i < kp->numel; i += 37) {
            uint16_t h = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
            CHECK(h == st_f32_to_bf16(params[kp->offset + i]));
        }
    }
    raw_free(&r);
    /* A tp > 1 layout is refused (export needs the full tensors). */
    struct model_layout l2;
    if (model_layout_init(&l2, &c, 2) == 0) {
        CHECK(st_export_model(path, &c, &l2, params, ST_F32, NULL, err, sizeof err) == ST_EINVAL);
        model_layout_free(&l2);
    }
    model_layout_free(&l);
    free(params);
}

/* fp16 conversions against IEEE 754 binary16 encodings worked out by hand:
 * normals, rounding to nearest even, overflow, subnormals, underflow. */
static void test_f16(void) {
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.0f, 0x7bff},
        {65520.0f, 0x7c00},
        {1e9f, 0x7c00},
        {0.1f, 0x2e66},
        {1.0f / 3, 0x3555},
        {0x1p-14f, 0x0400},
        {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},
        {0x1.8p-25f, 0x0001},
        {0x1.8p-24f, 0x0002},
        {0x1p-15f, 0x0200},
        {1.0f + 0x1p-11f, 0x3c00},
        {1.0f + 0x1.8p-10f, 0x3c02},
        {1.0f + 0x1.8p-11f, 0x3c01},
        {-0.0f, 0x8000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t h = st_f32_to_f16(cases[i].f);
        if (h != cases[i].h)
            fprintf(stderr, "f16(%a) = %04x, want %04x\n", (double)cases[i].f, h, cases[i].h);
        CHECK(h == cases[i].h);
    }
    CHECK((st_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (st_f32_to_f16(NAN) & 0x3ff) != 0);
    /* every finite fp16 value survives fp16 -> fp32 -> fp16 bit for bit */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7c00) != 0x7c00 && st_f32_to_f16(st_f16_to_f32((uint16_t)h)) != h) bad++;
    CHECK(bad == 0);
    CHECK(st_f16_to_f32(0x0001) == 0x1p-24f && st_f16_to_f32(0x7bff) == 65504.0f);
}

/* The stable codes a caller maps to errors: a header length that cannot
 * fit the file, and an unknown dtype name. */
static void test_codes(void) {
    static const struct {
        const char *body;
        int64_t hlen;
        size_t data;
        int want;
    } cases[] = {
        {"{}", 1 << 30, 0, ST_EHEADER},
        {"{}", 100, 0, ST_EHEADER},
        {"", 0, 0, ST_EHEADER},
        {"{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", -1, 2, ST_EDTYPE},
        {"{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", -1, 8, ST_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[512], err[512] = "";
        snprintf(path, sizeof path, "%s/code%zu.safetensors", dir, i);
        write_file(path, cases[i].body, cases[i].hlen, cases[i].data);
        struct st_file *f = NULL;
        int rc = st_open(path, &f, err, sizeof err);
        if (rc != cases[i].want) fprintf(stderr, "code case %zu: rc %d (%s)\n", i, rc, err);
        CHECK(rc == cases[i].want && f == NULL);
        st_close(f);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0) {
        struct model_config c;
        struct model_layout l;
        float *params = NULL;
        int rc = write_gpt2(argv[2], &c, &l, &params);
        if (rc == 0)
            printf("%d %d %d %d %d\n", c.n_layer, c.d_model, c.vocab_size, c.seq_len, c.d_ff);
        model_layout_free(&l);
        free(params);
        return rc ? 1 : 0;
    }
    snprintf(dir, sizeof dir, "/tmp/loom_test_st_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_write_read();
    test_sha256();
    test_malformed();
    test_f16();
    test_codes();
    test_export();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (check_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    if (check_failures)
        fprintf(stderr, "%d check(s) failed (files kept in %s)\n", check_failures, dir);
    return check_failures ? 1 : 0;
}
