/* QLoRA under tensor parallelism (worker/nf4.c, the shards of
 * worker/nf4_format.h): a tp rank quantizes the whole tensor as one process
 * does and keeps its shard, so the shard's dequantized weights must be the
 * whole tensor's dequantized weights at the shard's places, bit for bit.
 *
 * 1. The shard functions (nf4_shard_geom, nf4_shard_extract,
 *    nf4_dequantize_layout) on column shards (a row range of each fused part)
 *    and row shards (a column range of every row), tp 2 and 4, in both layouts
 *    (SLICE where the runs sit on 16384-weight boundaries, ABSMAX where only on
 *    64-weight ones), against the whole tensor's nf4_dequantize sliced here by
 *    index arithmetic; the shard sizes; shards whose boundaries fall inside a
 *    64-weight block (in/tp not a multiple of 64) reported NF4_SHARD_NONE.
 * 2. The engine storage on the cpu backend: every tp rank of llama and gpt2
 *    configs (tp 2 and 4) given the whole tensors (nf4_put_full, one tensor in
 *    pieces), the views after nf4_layer and the export read (nf4_read) equal
 *    the whole tensors' dequantized slices; a tp share through nf4_put is
 *    refused; a config with a block on two ranks is refused by nf4_attach and
 *    nf4_tp_check naming the tensor and the sizes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/model.h"
#include "worker/nf4.h"

static int failures;

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        int ok_ = (c);                                                                             \
        failures += !ok_;                                                                          \
        printf("%s: ", ok_ ? "ok" : "FAIL");                                                       \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

/* Deterministic weights with zeros, a constant run and a few large values. */
static void values(float *v, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t j = 0; j < n; j++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
        v[j] = (float)(u * 0.08 * (1.0 + (double)(j % 37) / 20));
        if (j % 1409 == 0) v[j] = 0.5f;
        if (j % 5003 < 64) v[j] = 0.0f;    /* a zero block now and then */
        if (j % 7919 < 70) v[j] = 0.0123f; /* constant runs */
    }
}

/* Rank idx's shard of whole w [d0][d1] in rank order, by index arithmetic:
 * split 1 (column) rows k * (d0 / parts) + idx * per + i of each part k,
 * split 2 (row) columns idx * (d1 / tp) + j of every row. */
static void slice_ref(const float *w, size_t d0, size_t d1, int split, int parts, int tp, int idx,
                      float *out) {
    size_t o = 0;
    if (split == 1) {
        size_t blk = d0 / (size_t)parts, per = blk / (size_t)tp;
        for (int k = 0; k < parts; k++)
            for (size_t i = 0; i < per; i++)
                for (size_t j = 0; j < d1; j++)
                    out[o++] = w[((size_t)k * blk + (size_t)idx * per + i) * d1 + j];
    } else {
        size_t r1 = d1 / (size_t)tp;
        for (size_t i = 0; i < d0; i++)
            for (size_t j = 0; j < r1; j++)
                out[o++] = w[i * d1 + (size_t)idx * r1 + j];
    }
}

static size_t count_diff(const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        bad += memcmp(a + j, b + j, sizeof *a) != 0;
    return bad;
}

static const struct {
    size_t d0, d1;
    int split, parts, tp, layout; /* the layout of every rank's shard */
} geo[] = {
    {512, 128, 1, 1, 2, NF4_SHARD_SLICE},     /* q-like: 32768 weights a rank */
    {512, 128, 1, 1, 4, NF4_SHARD_SLICE},     /* 16384 a rank */
    {1536, 128, 1, 3, 4, NF4_SHARD_SLICE},    /* fused q|k|v, 3 runs of 16384 */
    {512, 96, 1, 1, 2, NF4_SHARD_ABSMAX},     /* 24576 a rank: 64- but not 16384-aligned */
    {512, 96, 1, 1, 4, NF4_SHARD_ABSMAX},     /* 12288 */
    {768, 64, 1, 3, 2, NF4_SHARD_ABSMAX},     /* fused, 3 runs of 8192 */
    {700, 64, 1, 2, 2, NF4_SHARD_ABSMAX},     /* gate|up, 2 runs of 11200 */
    {96, 1024, 2, 1, 2, NF4_SHARD_ABSMAX},    /* o / down: in/tp 512 */
    {96, 1024, 2, 1, 4, NF4_SHARD_ABSMAX},    /* in/tp 256 */
    {128, 128, 2, 1, 2, NF4_SHARD_ABSMAX},    /* in/tp 64 */
    {3, 16384 * 2, 2, 1, 2, NF4_SHARD_SLICE}, /* row runs of 16384: slices too */
    {128, 128, 2, 1, 4, NF4_SHARD_NONE},      /* in/tp 32: a block on two ranks */
    {128, 96, 2, 1, 2, NF4_SHARD_NONE},       /* in/tp 48 (the tiny llama's down_proj) */
    {6, 96, 1, 1, 2, NF4_SHARD_NONE},         /* 288 weights a rank */
    {1000, 1000, 1, 1, 1, NF4_SHARD_SLICE},   /* tp 1: the whole tensor (odd tail block) */
};

static void test_functions(void) {
    for (size_t c = 0; c < sizeof geo / sizeof *geo; c++) {
        size_t d0 = geo[c].d0, d1 = geo[c].d1, N = d0 * d1;
        float *w = malloc(N * sizeof *w), *deq = malloc(N * sizeof *deq);
        float *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
        uint8_t *whole = malloc(nf4_bytes(N)), *sh = malloc(nf4_bytes(N) + 8 * N);
        if (!w || !deq || !want || !got || !whole || !sh) {
            CHECK(0, "out of memory");
            return;
        }
        values(w, N, c);
        nf4_quantize(w, N, whole);
        nf4_dequantize(whole, N, deq);
        for (int idx = 0; idx < geo[c].tp; idx++) {
            struct nf4_shard s;
            int lay = nf4_shard_geom(d0, d1, geo[c].split, geo[c].parts, geo[c].tp, idx, &s);
            size_t n = s.count * s.len;
            const char *ln = lay == NF4_SHARD_SLICE    ? "SLICE"
                             : lay == NF4_SHARD_ABSMAX ? "ABSMAX"
                                                       : "NONE";
            if (geo[c].layout == NF4_SHARD_NONE) {
                /* rank 0 starts on a block: some other rank's boundary is inside one */
                if (idx == geo[c].tp - 1)
                    CHECK(lay == NF4_SHARD_NONE, "[%zu, %zu] split %d tp %d: rank %d is %s", d0, d1,
                          geo[c].split, geo[c].tp, idx, ln);
                continue;
            }
            CHECK(lay == geo[c].layout && n * (size_t)geo[c].tp == N,
                  "[%zu, %zu] split %d parts %d tp %d rank %d: layout %s, %zu weights", d0, d1,
                  geo[c].split, geo[c].parts, geo[c].tp, idx, ln, n);
            if (lay != geo[c].layout) continue;
            size_t bytes = nf4_shard_bytes(&s);
            size_t want_bytes =
                lay == NF4_SHARD_SLICE ? nf4_bytes(n) : (n + 1) / 2 + 4 * ((n + 63) / 64);
            CHECK(bytes == want_bytes, "rank %d: %zu bytes (want %zu)", idx, bytes, want_bytes);
            memset(sh, 0xa5, bytes);
            nf4_shard_extract(&s, whole, sh);
            nf4_dequantize_layout(lay, sh, n, got);
            if (geo[c].tp == 1)
                memcpy(want, deq, N * sizeof *want);
            else
                slice_ref(deq, d0, d1, geo[c].split, geo[c].parts, geo[c].tp, idx, want);
            size_t bad = count_diff(got, want, n);
            CHECK(bad == 0,
                  "[%zu, %zu] %s-parallel tp %d rank %d (%s): the shard's dequantized weights "
                  "equal the whole tensor's at its places (%zu of %zu differ)",
                  d0, d1, geo[c].split == 2 ? "row" : "column", geo[c].tp, idx, ln, bad, n);
        }
        free(w), free(deq), free(want), free(got), free(whole), free(sh);
    }
}

/* ---- the engine storage ---- */

static struct model_config cfg(enum model_family f, int C, int F, int heads, int kv) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, f);
    c.n_layer = 2;
    c.n_head = heads;
    c.n_kv_head = kv;
    c.d_model = C;
    c.d_ff = F;
    c.vocab_size = 96;
    c.seq_len = 32;
    model_config_finalize(&c);
    return c;
}

static void test_engine(const char *what, struct model_config c, int tp) {
    size_t checked = 0, bad = 0, bad_read = 0, tensors = 0;
    int ok = 1, refused_share = 1;
    for (int rank = 0; rank < tp && ok; rank++) {
        struct engine_place pl = {
            .rank = rank, .world = tp, .tp = tp, .dp = 1, .pp = 1, .frozen = 1, .windows_later = 1};
        struct backend *be = backend_cpu_new(1);
        struct engine *e = be ? engine_new(&c, &pl, be) : NULL;
        char err[512] = "";
        ok = e && nf4_attach(e, err, sizeof err) == 0;
        CHECK(ok, "%s tp %d rank %d: nf4_attach %s", what, tp, rank, err);
        for (int i = 0; ok && i < e->layout.n; i++) {
            const struct model_tensor *t = &e->layout.t[i];
            size_t N = (size_t)t->numel;
            float *w = malloc(N * sizeof *w);
            if (!w) {
                ok = 0;
                break;
            }
            values(w, N, (uint64_t)i + 100);
            if (!nf4_is_quantized(e, i)) { /* the rest: its share as usual (replicated here) */
                if (t->split == MODEL_SPLIT_REPLICATED)
                    ok = engine_params_from_host(e, (size_t)t->rank_offset, w, N) == 0;
                free(w);
                continue;
            }
            ok = nf4_full_tensor(e->nf4, i);
            if (ok && i % 3 == 0) { /* in two pieces, the first an odd count */
                size_t h = N / 2 + 7;
                ok = nf4_put_full(e->nf4, i, 0, w, h, sizeof *w) == 0 &&
                     nf4_put_full(e->nf4, i, h, w + h, N - h, sizeof *w) == 0;
            } else if (ok) {
                ok = nf4_put_full(e->nf4, i, 0, w, N, sizeof *w) == 0;
            }
            free(w);
        }
        /* a tp share through the rank-offset path cannot be quantized as the whole tensor */
        for (int i = 0; ok && i < e->layout.n; i++)
            if (nf4_is_quantized(e, i)) {
                float *z = calloc((size_t)e->layout.t[i].rank_numel, sizeof *z);
                refused_share &=
                    z && engine_params_from_host(e, (size_t)e->layout.t[i].rank_offset, z,
                                                 (size_t)e->layout.t[i].rank_numel) != 0;
                free(z);
                break;
            }
        float *all = ok ? malloc((size_t)e->n_params * sizeof *all) : NULL;
        ok = ok && all && nf4_read(e->nf4, 0, e->n_params, all) == 0;
        for (int l = 0; ok && l < c.n_layer; l++) {
            nf4_layer(e->nf4, l);
            for (int i = 0; ok && i < e->layout.n; i++) {
                const struct model_tensor *t = &e->layout.t[i];
                if (!nf4_is_quantized(e, i) || t->layer != l) continue;
                size_t N = (size_t)t->numel, n = (size_t)t->rank_numel;
                float *w = malloc(N * sizeof *w), *deq = malloc(N * sizeof *deq);
                float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
                uint8_t *q = malloc(nf4_bytes(N));
                ok = w && deq && want && got && q;
                if (ok) {
                    values(w, N, (uint64_t)i + 100);
                    nf4_quantize_serial(w, N, q); /* the one-process bytes */
                    nf4_dequantize(q, N, deq);
                    slice_ref(deq, (size_t)t->shape[0], (size_t)t->shape[1], (int)t->split,
                              t->parts, tp, e->tp_idx, want);
                    e->be->download(e->be->ctx, got, e->pview[i], n * sizeof *got);
                    bad += count_diff(got, want, n);
                    bad_read += count_diff(all + t->rank_offset, want, n);
                    checked += n;
                    tensors++;
                }
                free(w), free(deq), free(want), free(got), free(q);
            }
        }
        free(all);
        engine_free(e);
    }
    CHECK(ok && tensors > 0 && bad == 0 && bad_read == 0,
          "%s tp %d: every rank's NF4 views after nf4_layer and its nf4_read equal the whole "
          "tensors' dequantized weights at the shard's places (%zu, %zu of %zu differ, %zu "
          "tensors)",
          what, tp, bad, bad_read, checked, tensors);
    CHECK(refused_share, "%s tp %d: a tp share through engine_params_from_host is refused", what,
          tp);
}

static void test_refused(void) {
    struct model_config c = cfg(MODEL_LLAMA, 128, 96, 4, 2); /* down_proj: 48 columns a rank */
    char err[512] = "";
    CHECK(nf4_tp_check(&c, 2, err, sizeof err) != 0 && strstr(err, "down_proj") &&
              strstr(err, "[128, 96]") && strstr(err, "tp=2") && strstr(err, "48 weights"),
          "nf4_tp_check refuses d_ff 96 at tp 2: %s", err);
    CHECK(nf4_tp_check(&c, 1, err, sizeof err) == 0, "tp 1 is never refused");
    struct engine_place pl = {
        .rank = 0, .world = 2, .tp = 2, .dp = 1, .pp = 1, .frozen = 1, .windows_later = 1};
    struct backend *be = backend_cpu_new(1);
    struct engine *e = be ? engine_new(&c, &pl, be) : NULL;
    err[0] = 0;
    CHECK(e && nf4_attach(e, err, sizeof err) != 0 && !e->nf4 && strstr(err, "down_proj"),
          "nf4_attach refuses it too: %s", err);
    engine_free(e);
}

int main(void) {
    test_functions();
    test_engine("llama C128 F128", cfg(MODEL_LLAMA, 128, 128, 4, 2), 2);
    test_engine("llama C256 F512", cfg(MODEL_LLAMA, 256, 512, 8, 4), 4);
    test_engine("gpt2 C128", cfg(MODEL_GPT2, 128, 512, 4, 4), 2);
    test_refused();
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures ? 1 : 0;
}
