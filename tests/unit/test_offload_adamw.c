/* The offloaded optimizer's CPU AdamW (worker/offload_adamw.h):
 *  - every instruction set this CPU runs (baseline, AVX2, AVX-512F), bf16 and
 *    fp32 transfer buffers, lengths 0..70 and a few thousand (vector bodies
 *    and scalar tails), random values with zeros, denormals, huge values and
 *    NaN gradients: master, m, v and the written parameters equal a plain
 *    scalar loop written here bit for bit, over 5 steps;
 *  - bf16 rounding: nearest even at ties, NaN made quiet, through the kernels
 *    with a zero learning rate (the parameter written is the master rounded);
 *  - oadam_part covers a range exactly once for T = 1..9 with whole vectors;
 *  - the pool: every thread runs each job once (T = 1, 3, 8), start/wait runs
 *    in the background, 200 jobs in a row;
 *  - oadam_isa_parse refuses unknown names.
 * `test_offload_adamw --dump FILE` writes a 4-step fp32 case (inputs, every
 * step's gradients and outputs) for tests/unit/test_offload_adamw_ref.py,
 * which checks it against torch.optim.AdamW's formula in numpy (float64). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/offload_adamw.h"
#include "tests/check.h"

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint32_t rnd32(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static float rndf(void) { /* uniform in [-1, 1) */
    return (float)((double)rnd32() / 4294967296.0 * 2.0 - 1.0);
}
static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* reference bf16 rounding: nearest even on the 16 dropped bits, NaN quiet */
static uint16_t ref_bf16(float f) {
    uint32_t u = f_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    uint32_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
    return (uint16_t)hi;
}

/* the straightforward reference: one element at a time, as written in
 * backend.h (decoupled decay, bias-corrected moments) */
static void ref_step(const struct oadam_k *k, int bf16, void *x, float *ms, float *m, float *v,
                     size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = bf16 ? bits_f((uint32_t)((uint16_t *)x)[i] << 16) : ((float *)x)[i];
        g = g * k->gs;
        m[i] = k->b1 * m[i] + (1.0f - k->b1) * g;
        v[i] = k->b2 * v[i] + (1.0f - k->b2) * g * g;
        float mhat = m[i] / k->c1, vhat = v[i] / k->c2;
        float upd = mhat / (sqrtf(vhat) + k->eps) + k->wd * ms[i];
        ms[i] = ms[i] - k->lr * upd;
        if (bf16)
            ((uint16_t *)x)[i] = ref_bf16(ms[i]);
        else
            ((float *)x)[i] = ms[i];
    }
}

static float special(uint32_t i) {
    static const uint32_t sp[] = {0x00000000, 0x80000000, 0x00000001, 0x007fffff, 0x7f7fffff,
                                  0xff7fffff, 0x3f808000, 0x3f818000, 0x7fc00000, 0x3f800000};
    return bits_f(sp[i % 10]);
}

static void fill(float *a, size_t n, float scale, int with_special) {
    for (size_t i = 0; i < n; i++)
        a[i] = with_special && rnd32() % 11 == 0 ? special(rnd32()) : rndf() * scale;
}

/* bit for bit, except that any NaN equals any NaN (which NaN an operation
 * with two NaN operands returns depends on their order, which the compiler
 * may swap in the reference loop) */
static int same_f32(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (f_bits(a[i]) != f_bits(b[i]) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}
static int same_bf16(const uint16_t *a, const uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && !((a[i] & 0x7fff) > 0x7f80 && (b[i] & 0x7fff) > 0x7f80)) return 0;
    return 1;
}

static void check_kernels(void) {
    static const size_t lens[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 63, 70, 1000, 4099};
    for (int isa = OADAM_BASELINE; isa < OADAM_NISA; isa++) {
        if (oadam_isa_resolve(isa) != isa) {
            printf("isa %s: not on this CPU\n", oadam_isa_name(isa));
            continue;
        }
        int ok = 1;
        for (int bf = 0; bf < 2; bf++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                size_t n = lens[li], nb = n ? n : 1;
                float *ms = malloc(nb * 4), *m = malloc(nb * 4), *v = malloc(nb * 4);
                float *rms = malloc(nb * 4), *rm = malloc(nb * 4), *rv = malloc(nb * 4);
                float *g = malloc(nb * 4), *x = malloc(nb * 4), *rx = malloc(nb * 4);
                fill(ms, n, 0.5f, 0);
                fill(m, n, 1e-3f, 0);
                fill(v, n, 1e-6f, 0);
                for (size_t i = 0; i < n; i++)
                    v[i] = fabsf(v[i]);
                memcpy(rms, ms, n * 4), memcpy(rm, m, n * 4), memcpy(rv, v, n * 4);
                for (int step = 1; step <= 5; step++) {
                    fill(g, n, 0.1f, 1); /* with NaN, denormal and huge gradients */
                    if (bf) {
                        for (size_t i = 0; i < n; i++)
                            ((uint16_t *)x)[i] = (uint16_t)(f_bits(g[i]) >> 16);
                    } else {
                        memcpy(x, g, n * 4);
                    }
                    memcpy(rx, x, n * 4);
                    struct oadam_k k = {.lr = 1e-3f * (float)step,
                                        .b1 = 0.9f,
                                        .b2 = 0.95f,
                                        .eps = 1e-8f,
                                        .wd = step % 2 ? 0.1f : 0.0f,
                                        .gs = 0.7f};
                    k.c1 = 1.0f - powf(k.b1, (float)step);
                    k.c2 = 1.0f - powf(k.b2, (float)step);
                    oadam_update(isa, bf, &k, x, ms, m, v, n);
                    ref_step(&k, bf, rx, rms, rm, rv, n);
                }
                int xs = bf ? same_bf16((uint16_t *)x, (uint16_t *)rx, n) : same_f32(x, rx, n);
                if (!same_f32(ms, rms, n) || !same_f32(m, rm, n) || !same_f32(v, rv, n) || !xs) {
                    ok = 0;
                    CHECK(0, "isa %s %s n=%zu differs from the scalar reference",
                          oadam_isa_name(isa), bf ? "bf16" : "fp32", n);
                }
                free(ms), free(m), free(v), free(rms), free(rm), free(rv), free(g), free(x);
                free(rx);
            }
        printf("%s isa %s: bf16 and fp32 equal the scalar reference bit for bit\n",
               ok ? "PASS" : "FAIL", oadam_isa_name(isa));
    }
}

static void check_rounding(void) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } rows[] = {
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* tie, even below: down */
        {0x3f818000, 0x3f82}, /* tie, odd below: up */
        {0x3f808001, 0x3f81}, /* above the tie */
        {0x3f807fff, 0x3f80}, /* below the tie */
        {0xbf818000, 0xbf82}, /* negative tie, odd */
        {0x7f7fffff, 0x7f80}, /* largest float rounds to inf */
        {0x7fa00000, 0x7fe0}, /* signalling NaN made quiet */
        {0xffc00001, 0xffc0}, /* quiet NaN keeps its sign */
        {0x00000001, 0x0000}, /* smallest denormal */
        {0x80000000, 0x8000}, /* -0 */
    };
    int n = (int)(sizeof rows / sizeof *rows);
    for (int isa = OADAM_BASELINE; isa < OADAM_NISA; isa++) {
        if (oadam_isa_resolve(isa) != isa) continue;
        /* 37 copies so that vector bodies and the tail both see every row */
        size_t len = (size_t)n * 37;
        float *ms = calloc(len, 4), *m = calloc(len, 4), *v = calloc(len, 4);
        uint16_t *x = calloc(len, 2);
        for (size_t i = 0; i < len; i++)
            ms[i] = bits_f(rows[i % (size_t)n].in);
        struct oadam_k k = {
            .lr = 0, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .gs = 1, .c1 = 1, .c2 = 1};
        oadam_update(isa, 1, &k, x, ms, m, v, len);
        int bad = 0;
        for (size_t i = 0; i < len; i++)
            if (x[i] != rows[i % (size_t)n].out) {
                if (!bad)
                    CHECK(0, "isa %s: %08x rounded to %04x, want %04x", oadam_isa_name(isa),
                          rows[i % (size_t)n].in, x[i], rows[i % (size_t)n].out);
                bad = 1;
            }
        printf("%s isa %s: bf16 rounding (ties to even, NaN quiet)\n", bad ? "FAIL" : "PASS",
               oadam_isa_name(isa));
        free(ms), free(m), free(v), free(x);
    }
}

static void check_part(void) {
    int bad = 0;
    for (int T = 1; T <= 9; T++)
        for (size_t len = 0; len < 300; len += 7) {
            size_t lo = 5, hi = lo + len, next = lo;
            for (int t = 0; t < T; t++) {
                size_t a, z;
                oadam_part(lo, hi, t, T, &a, &z);
                if (z > a) {
                    bad |= a != next || (z != hi && (z - a) % 16 != 0);
                    next = z;
                }
            }
            bad |= next != hi;
        }
    CHECK(!bad, "oadam_part does not cover the range exactly once");
}

struct pool_arg {
    int *hits; /* [T] */
    long *sum;
    int n;
};

static void pool_job(void *u, int t, int T) {
    struct pool_arg *a = u;
    a->hits[t]++;
    long s = 0;
    for (int i = t; i < a->n; i += T)
        s += i;
    a->sum[t] = s;
}

static void check_pool(void) {
    static const int Ts[] = {1, 3, 8};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        int T = Ts[ti];
        struct oadam_pool *p = oadam_pool_new(T);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK_EQ_INT(oadam_pool_threads(p), T);
        int hits[8] = {0};
        long sum[8] = {0};
        struct pool_arg a = {hits, sum, 100000};
        int bad = 0;
        for (int j = 0; j < 200; j++) {
            if (j % 2)
                oadam_pool_run(p, pool_job, &a);
            else {
                oadam_pool_start(p, pool_job, &a);
                oadam_pool_wait(p);
            }
            long s = 0;
            for (int t = 0; t < T; t++)
                s += sum[t];
            bad |= s != (long)a.n * (a.n - 1) / 2;
        }
        for (int t = 0; t < T; t++)
            bad |= hits[t] != 200;
        oadam_pool_wait(p); /* no job: returns */
        oadam_pool_free(p);
        CHECK(!bad, "pool of %d threads: a thread missed or repeated a job", T);
    }
    oadam_pool_free(NULL);
}

/* The case the numpy/torch reference reads: header of int64 n, steps; the
 * hyperparameters as float32 lr b1 b2 eps wd gs; per step the float32 bias
 * corrections c1 c2 handed to the kernel; master, m, v; then per step the
 * gradients and the resulting master, m, v. */
static int dump(const char *path) {
    const size_t n = 4096;
    const int steps = 4;
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    float *ms = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4), *g = malloc(n * 4);
    fill(ms, n, 0.5f, 0);
    struct oadam_k k = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f, .wd = 0.1f, .gs = 1};
    int64_t hdr[2] = {(int64_t)n, steps};
    float hp[6] = {k.lr, k.b1, k.b2, k.eps, k.wd, k.gs};
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(hp, sizeof hp, 1, f);
    for (int s = 1; s <= steps; s++) { /* the bias corrections, as offload.c computes them */
        float c[2] = {1.0f - powf(k.b1, (float)s), 1.0f - powf(k.b2, (float)s)};
        fwrite(c, sizeof c, 1, f);
    }
    fwrite(ms, 4, n, f), fwrite(m, 4, n, f), fwrite(v, 4, n, f);
    int isa = oadam_isa_best();
    for (int s = 1; s <= steps; s++) {
        fill(g, n, 1.0f, 0);
        fwrite(g, 4, n, f);
        k.c1 = 1.0f - powf(k.b1, (float)s);
        k.c2 = 1.0f - powf(k.b2, (float)s);
        oadam_update(isa, 0, &k, g, ms, m, v, n);
        fwrite(ms, 4, n, f), fwrite(m, 4, n, f), fwrite(v, 4, n, f);
    }
    free(ms), free(m), free(v), free(g);
    printf("wrote %s (isa %s)\n", path, oadam_isa_name(isa));
    return fclose(f) != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) return dump(argv[2]);
    CHECK_EQ_INT(oadam_isa_parse("avx2"), OADAM_AVX2);
    CHECK_EQ_INT(oadam_isa_parse("auto"), OADAM_AUTO);
    CHECK_EQ_INT(oadam_isa_parse("sse9"), -1);
    CHECK(oadam_isa_resolve(OADAM_AUTO) == oadam_isa_best());
    printf("best isa on this CPU: %s\n", oadam_isa_name(oadam_isa_best()));
    check_kernels();
    check_rounding();
    check_part();
    check_pool();
    return check_summary("test_offload_adamw");
}
