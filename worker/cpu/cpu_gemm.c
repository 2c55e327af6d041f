/* CPU backend: the micro-kernels behind matmul forward/backward, the
 * classifier and attention.
 *
 * The matmul kernels are register-tiled with 8-wide vectors (GCC vector extensions). All
 * kernels (cpu_gemm_impl.h) are compiled twice, for AVX2 and for baseline x86-64; the backend
 * picks one set when it is created (cpu_kernels_select: AVX2 when the CPU has it, unless
 * LOOM_CPU_ISA=baseline). Neither set can fuse multiply-add (no FMA target), so the two
 * produce the same bits and results do not depend on the machine (tests compare them). Every
 * output element is computed the same way whatever tile it falls in:
 *  - mm_nt:  out = dot(x, w) with lane k summing i = k mod 8 in increasing
 *    i, lanes added in a fixed tree, then the IC % 8 tail in order;
 *  - mm_acc: C += (sum over k in increasing order, starting from 0). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "worker/cpu/cpu.h"

/* The 32-byte vector helpers are always inlined, so each kernel set compiles them
 * for its own target and no vector crosses a call (an out-of-line helper
 * built for the baseline would return its vector in memory while an AVX2
 * caller expects a register: that breaks -O0 builds). */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));

static inline __attribute__((always_inline)) v8 ld(const float *p) {
    return *(const v8u *)p;
}

static inline __attribute__((always_inline)) void st(float *p, v8 v) {
    *(v8u *)p = v;
}

static inline __attribute__((always_inline)) float hsum(v8 v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

static inline __attribute__((always_inline)) float dot_tail(float s, const float *a, const float *b,
                                                            int i0, int n) {
    for (int i = i0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- exp ---- */

static inline __attribute__((always_inline)) v8 vsel(v8i m, v8 a, v8 b) { /* m ? a : b, lane-wise */
    return (v8)(((v8i)a & m) | ((v8i)b & ~m));
}

static inline __attribute__((always_inline)) v8 splat(float f) {
    return (v8){f, f, f, f, f, f, f, f};
}

/* exp(x) for 8 lanes: Cephes' expf (range reduction by ln 2 in two parts, a
 * degree-6 polynomial, 2^k by exponent bits), about 1 ulp on [-87, 88];
 * below -87.3 it returns 0, above 88.7 the value at 88.7. Every lane runs the
 * same operations, so a value's result does not depend on its lane. */
static inline __attribute__((always_inline)) v8 vexp(v8 x) {
    v8 lo = splat(-87.3f), hi = splat(88.7f);
    v8i under = x < lo;
    x = vsel(x > hi, hi, x);
    x = vsel(under, lo, x);
    v8 t = x * splat(1.44269504088896341f) + splat(0.5f);
    v8 k = __builtin_convertvector(__builtin_convertvector(t, v8i), v8);
    k += __builtin_convertvector(k > t, v8); /* truncation -> floor: -1 where k > t */
    v8 r = x - k * splat(0.693359375f) + k * splat(2.12194440e-4f);
    v8 y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    y = y * r * r + r + splat(1.0f);
    v8i e = (__builtin_convertvector(k, v8i) + 127) << 23;
    y = y * (v8)e;
    return vsel(under, splat(0.0f), y);
}

/* p[i] = exp(p[i] - shift) for i < n; returns the sum of the results (lanes
 * summed in a fixed tree, then the partial tail lane block). */
static inline __attribute__((always_inline)) float vexp_shift_sum(float *p, int n, float shift) {
    int n8 = n & ~7;
    v8 acc = {0}, sh = splat(shift);
    for (int i = 0; i < n8; i += 8) {
        v8 y = vexp(ld(p + i) - sh);
        st(p + i, y);
        acc += y;
    }
    float s = hsum(acc);
    if (n8 < n) {
        float tmp[8] = {0};
        memcpy(tmp, p + n8, (size_t)(n - n8) * sizeof(float));
        v8 y = vexp(ld(tmp) - sh);
        st(tmp, y);
        for (int i = 0; i < n - n8; i++) {
            p[n8 + i] = tmp[i];
            s += tmp[i];
        }
    }
    return s;
}

/* ---- attention rows ---- */

/* Dot product with the lane order of mm_nt. */
static inline __attribute__((always_inline)) float vdot(const float *a, const float *b, int n) {
    int n8 = n & ~7;
    v8 acc = {0};
    for (int i = 0; i < n8; i += 8)
        acc += ld(a + i) * ld(b + i);
    return dot_tail(hsum(acc), a, b, n8, n);
}

static inline __attribute__((always_inline)) void vaxpy(float *restrict y, float a,
                                                        const float *restrict x, int n) {
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        st(y + i, ld(y + i) + a * ld(x + i));
    for (int i = n8; i < n; i++)
        y[i] += a * x[i];
}

/* ---- the two kernel sets ---- */

#pragma GCC push_options
#pragma GCC target("avx2")
#define KFN(name) name##_avx2
#include "worker/cpu/cpu_gemm_impl.h"
#undef KFN
#pragma GCC pop_options

#define KFN(name) name##_base
#include "worker/cpu/cpu_gemm_impl.h"
#undef KFN

static const struct cpu_kernels kernels_avx2 = {
    "avx2", mm_nt_avx2, mm_acc_avx2, xent_row_avx2, attn_fwd_row_avx2, attn_bwd_row_avx2};
static const struct cpu_kernels kernels_base = {
    "baseline", mm_nt_base, mm_acc_base, xent_row_base, attn_fwd_row_base, attn_bwd_row_base};

const struct cpu_kernels *cpu_kernels_select(const char *isa) {
    if (isa && strcmp(isa, "baseline") == 0) return &kernels_base;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? &kernels_avx2 : &kernels_base;
}
