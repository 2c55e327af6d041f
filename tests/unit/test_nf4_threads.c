/* The fast NF4 quantizer (worker/nf4.c: nf4_quantize_mt / nf4_quantize_pipe,
 * threshold comparisons over pthreads) writes the same bytes as the serial
 * reference (nf4_quantize_serial, a binary search per weight) for 1, 2 and 7
 * threads: odd sizes, zero blocks, values at and around every midpoint of the
 * NF4 table (the ties), large, tiny and subnormal magnitudes (an infinite
 * scale), inf and NaN, a dense sweep of the floats in [-1, 1], and normal
 * weights over several pipeline steps; the pipeline hands out every byte once,
 * in order, each final when handed out. tests/qlora/test_qlora.py checks the
 * quantizer (any thread count) against an independent numpy implementation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/nf4.h"

static int failures;

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            printf("FAIL: ");                                                                      \
        } else {                                                                                   \
            printf("ok: ");                                                                        \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double unit(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static float normal(void) {
    return (float)(sqrt(-2.0 * log(unit())) * cos(2 * M_PI * unit()));
}

/* ---- the inputs ---- */

static void fill_normal(float *w, size_t n, float std) {
    for (size_t j = 0; j < n; j++)
        w[j] = std * normal();
}

static void fill_zero(float *w, size_t n, float std) {
    (void)std;
    memset(w, 0, n * sizeof *w);
}

/* Blocks whose absmax is exactly 1 (the scale 1: x is the weight itself),
 * filled with each midpoint of adjacent NF4 values (rounded to float both
 * ways) and the floats up to 8 steps either side of it, the table values and
 * -0. */
static void fill_ties(float *w, size_t n, float std) {
    (void)std;
    size_t k = 0;
    for (int i = 0; i < 15; i++) {
        float a = NF4_CODE[i], b = NF4_CODE[i + 1];
        float mids[3] = {(a + b) * 0.5f, (float)(((double)a + b) / 2), a + (b - a) * 0.5f};
        for (int m = 0; m < 3; m++) {
            float x = mids[m];
            for (int s = 0; s < 8; s++)
                x = nextafterf(x, -2.0f);
            for (int s = 0; s <= 16; s++, x = nextafterf(x, 2.0f))
                w[k++ % n] = x;
        }
        w[k++ % n] = a;
        w[k++ % n] = b;
    }
    w[k++ % n] = -0.0f;
    while (k < n)
        w[k++] = (float)(2 * unit() - 1);
    for (size_t b = 0; b < n; b += NF4_BLOCK)
        w[b] = b % 128 ? -1.0f : 1.0f; /* each block's absmax 1 */
}

/* Magnitudes: blocks near FLT_MAX, near FLT_MIN, subnormal (1 / absmax is
 * infinite: the codes of inf and NaN), single infinities and NaNs. */
static void fill_extremes(float *w, size_t n, float std) {
    (void)std;
    static const float mag[] = {3.0e38f, 1.0e-30f, 1.5e-38f, 2.0e-39f, 1.0e-40f, 1.4e-45f, 1.0f};
    size_t nm = sizeof mag / sizeof *mag;
    for (size_t j = 0; j < n; j++) {
        float m = mag[(j / NF4_BLOCK) % nm];
        w[j] = m * (float)(2 * unit() - 1);
        if (j % 11 == 0) w[j] = 0.0f;
        if (j % 64 == 5) w[j] = -m;
    }
    if (n > 700) {
        w[300] = INFINITY;
        w[301] = 0.5f;
        w[400] = -INFINITY;
        w[500] = NAN;
        w[640] = NAN; /* a block whose only weights are NaN and zeros */
        for (size_t j = 641; j < 704; j++)
            w[j] = 0.0f;
    }
}

/* Every 257th float of [-1, 1] (in blocks with an exact 1). */
static void fill_sweep(float *w, size_t n, float std) {
    (void)std;
    uint32_t u = 0;
    for (size_t j = 0; j < n; j++) {
        float x;
        do {
            uint32_t bits = u;
            u += 257;
            memcpy(&x, &bits, sizeof x);
        } while (!(fabsf(x) <= 1.0f));
        w[j] = x;
    }
    for (size_t b = 0; b < n; b += NF4_BLOCK)
        w[b] = 1.0f;
}

static const struct {
    const char *name;
    size_t n;
    void (*fill)(float *w, size_t n, float std);
    float std;
} cases[] = {
    {"one weight", 1, fill_normal, 0.02f},
    {"63 weights", 63, fill_normal, 1.0f},
    {"64 weights", 64, fill_normal, 1.0f},
    {"65 weights", 65, fill_normal, 1.0f},
    {"odd, 3 groups and a bit", 64 * 256 * 3 + 64 * 5 + 37, fill_normal, 0.02f},
    {"all zero", 1000, fill_zero, 0},
    {"ties at the midpoints", 64 * 40 + 9, fill_ties, 0},
    {"large, tiny, subnormal, inf, NaN", 64 * 300 + 3, fill_extremes, 0},
    {"sweep of [-1, 1]", (size_t)1 << 23, fill_sweep, 0},
    {"normal, 2 pipeline steps", ((size_t)1 << 24) + 64 * 1000 + 7, fill_normal, 0.02f},
};

/* ---- the pipeline's hand-outs ---- */

struct handout {
    const uint8_t *out;
    uint8_t *copy;
    size_t next, calls;
    int in_order;
};

static void take(void *ctx, size_t off, size_t len) {
    struct handout *h = ctx;
    if (off != h->next) h->in_order = 0;
    memcpy(h->copy + off, h->out + off, len); /* final now: compared at the end */
    h->next = off + len;
    h->calls++;
}

int main(void) {
    static const int threads[] = {1, 2, 7};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = cases[c].n, nb = nf4_bytes(n);
        float *w = malloc(n * sizeof *w);
        uint8_t *ref = malloc(nb), *got = malloc(nb), *copy = malloc(nb);
        if (!w || !ref || !got || !copy) {
            printf("FAIL: out of memory\n");
            return 1;
        }
        cases[c].fill(w, n, cases[c].std);
        memset(ref, 0xa5, nb);
        nf4_quantize_serial(w, n, ref);
        for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
            memset(got, 0x5a, nb); /* stale bytes must not survive */
            nf4_quantize_mt(w, n, got, threads[t]);
            size_t at = 0;
            while (at < nb && got[at] == ref[at])
                at++;
            CHECK(at == nb,
                  "%s (n=%zu): %d threads give the serial bytes (first difference at %zu of %zu)",
                  cases[c].name, n, threads[t], at, nb);
        }
        memset(got, 0x11, nb);
        memset(copy, 0x22, nb);
        struct handout h = {.out = got, .copy = copy, .in_order = 1};
        nf4_quantize_pipe(w, n, got, 3, take, &h);
        CHECK(h.in_order && h.next == nb && memcmp(copy, ref, nb) == 0 && memcmp(got, ref, nb) == 0,
              "%s: the pipeline hands out all %zu bytes once, in order, final (%zu calls)",
              cases[c].name, nb, h.calls);
        memset(got, 0x33, nb);
        nf4_quantize(w, n, got);
        CHECK(memcmp(got, ref, nb) == 0, "%s: nf4_quantize (%d threads) gives the serial bytes",
              cases[c].name, nf4_threads());
        free(w), free(ref), free(got), free(copy);
    }
    /* the reference itself on a tie: x exactly halfway in float arithmetic
     * goes to the lower code (the rule the fast path keeps) */
    float tie[64] = {1.0f};
    float a = NF4_CODE[7], b = NF4_CODE[8];
    tie[1] = a + (b - a) / 2;
    int exact = fabsf(tie[1] - a) == fabsf(b - tie[1]);
    uint8_t q[4096], r[4096];
    nf4_quantize_serial(tie, 64, r);
    nf4_quantize_mt(tie, 64, q, 2);
    CHECK(!exact || ((r[0] & 15) == 7 && (q[0] & 15) == 7),
          "an exact tie between codes 7 and 8 goes to 7 (serial %d, fast %d; exact tie: %d)",
          r[0] & 15, q[0] & 15, exact);
    printf("failures: %d\n", failures);
    return failures ? 1 : 0;
}
