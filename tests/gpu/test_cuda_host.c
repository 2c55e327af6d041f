/* Host-side helpers of the CUDA backend, runnable without a GPU (label
 * unit): the token bucketing behind the deterministic embedding gradient
 * (a stable counting sort) and the bf16 <-> fp32 conversions used by tests
 * and I/O (round to nearest even, NaN kept a NaN); and cuDNN attention's
 * fallback contract (worker/cuda/cudnn_attn.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cudnn_attn.h"
#include "worker/cuda/kernels.h"
#include "tests/check.h"

static void test_buckets(int N, int V, unsigned seed) {
    int32_t *tok = malloc(N * sizeof *tok), *order = malloc(N * sizeof *order);
    int32_t *starts = malloc((N + 1) * sizeof *starts), *uniq = malloc(N * sizeof *uniq);
    int *seen = calloc(N, sizeof *seen), *count = calloc(V, sizeof *count);
    srand(seed);
    for (int i = 0; i < N; i++) {
        tok[i] = rand() % V;
        count[tok[i]]++;
    }
    int nu = lk_embed_buckets(tok, N, order, starts, uniq);
    int distinct = 0;
    for (int v = 0; v < V; v++)
        distinct += count[v] > 0;
    CHECK(nu == distinct, "N=%d V=%d: %d buckets, %d distinct tokens", N, V, nu, distinct);
    CHECK(starts[0] == 0 && starts[nu] == N, "bucket bounds %d..%d", starts[0], starts[nu]);
    for (int u = 0; u < nu; u++) {
        CHECK(u == 0 || uniq[u] > uniq[u - 1], "tokens not increasing at bucket %d", u);
        CHECK(starts[u + 1] - starts[u] == count[uniq[u]], "bucket %d size", u);
        for (int j = starts[u]; j < starts[u + 1]; j++) {
            int r = order[j];
            CHECK(r >= 0 && r < N && tok[r] == uniq[u], "row %d in bucket of token %d", r, uniq[u]);
            CHECK(j == starts[u] || order[j] > order[j - 1], "bucket %d not in row order", u);
            if (r >= 0 && r < N) seen[r]++;
        }
    }
    for (int i = 0; i < N; i++)
        CHECK(seen[i] == 1, "row %d listed %d times", i, seen[i]);
    free(tok), free(order), free(starts), free(uniq), free(seen), free(count);
}

static void test_bf16(void) {
    static const struct {
        float in;
        uint16_t out;
    } cases[] = {
        {1.0f, 0x3f80},        {-2.0f, 0xc000},
        {0.0f, 0x0000},        {1.00390625f, 0x3f80}, /* 1 + 2^-8: tie, to even (down) */
        {1.01171875f, 0x3f82},                        /* 1 + 3*2^-8: tie, to even (up) */
        {1.0048828f, 0x3f81},                         /* above the tie: up */
        {65504.0f, 0x4780},    {INFINITY, 0x7f80},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t b = lcuda_f2bf(cases[i].in);
        CHECK(b == cases[i].out, "f2bf(%g) = 0x%04x, want 0x%04x", cases[i].in, b, cases[i].out);
    }
    CHECK(isnan(lcuda_bf2f(lcuda_f2bf(NAN))), "NaN must stay NaN");
    for (uint32_t b = 0; b < 0x10000; b++) {
        float f = lcuda_bf2f((uint16_t)b);
        if (isnan(f)) continue;
        CHECK(lcuda_f2bf(f) == b, "bf16 0x%04x does not round-trip", b);
    }
}

/* Without a usable library, device or engine, lcudnn_attn_new returns NULL
 * with a reason (the backend logs it and uses k_attn.cu) and never crashes;
 * where a GPU and cuDNN are present the plans may build, and are freed. A
 * head size of 7 (strides not 16-byte multiples) is refused everywhere. */
static void test_cudnn_fallback(void) {
    char why[640] = "";
    long v = lcudnn_version();
    CHECK(v == 0 || (v >= 90000 && v < 100000), "cuDNN version %ld", v);
    struct lcudnn_attn *a =
        lcudnn_attn_new(NULL, 2, 128, 2, 2, 64, 3 * 2 * 64, 2 * 64, 1, why, sizeof why);
    CHECK(a || why[0], "no plans and no reason");
    if (!a) printf("cuDNN attention not available here (version %ld): %s\n", v, why);
    lcudnn_attn_free(a);
    why[0] = 0;
    a = lcudnn_attn_new(NULL, 1, 64, 1, 1, 7, 21, 7, 1, why, sizeof why);
    CHECK(!a && why[0], "head size 7: %s", a ? "accepted" : "no reason");
    lcudnn_attn_free(a);
    /* 6 query heads do not group over 4 kv heads: refused before cuDNN is asked */
    why[0] = 0;
    a = lcudnn_attn_new(NULL, 1, 64, 6, 4, 64, 14 * 64, 6 * 64, 1, why, sizeof why);
    CHECK(!a && strstr(why, "6 query heads") && strstr(why, "4 kv heads"), "H 6 / Hkv 4: %s",
          a ? "accepted" : why);
    lcudnn_attn_free(a);
}

int main(void) {
    test_cudnn_fallback();
    test_buckets(1, 5, 1);
    test_buckets(1000, 7, 2);
    test_buckets(16384, 50257, 3);
    test_buckets(4096, 1, 4);
    test_bf16();
    printf("%s\n", check_failures ? "FAILED" : "all passed");
    return check_failures ? 1 : 0;
}
