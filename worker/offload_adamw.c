/* CPU AdamW kernels and thread pool of the optimizer offload
 * (offload_adamw.h). Compiled with -ffp-contract=off (worker/CMakeLists.txt):
 * the vector bodies must not fuse a multiply into an add, or they would
 * round differently from the scalar loop.
 *
 * The pool is written by hand (pthreads) rather than using OpenMP: the
 * delayed update runs a job in the background while the engine thread goes
 * on issuing device work, which an OpenMP parallel region (it blocks its
 * caller) cannot do. */
#include "worker/offload_adamw.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define OADAM_X86 1
#else
#define OADAM_X86 0
#endif

static const char *const isa_names[OADAM_NISA] = {"auto", "baseline", "avx2", "avx512"};

int oadam_isa_parse(const char *s) {
    if (!s || !*s) return OADAM_AUTO;
    for (int i = 0; i < OADAM_NISA; i++)
        if (strcmp(s, isa_names[i]) == 0) return i;
    return -1;
}

const char *oadam_isa_name(int isa) {
    return isa >= 0 && isa < OADAM_NISA ? isa_names[isa] : "?";
}

static int isa_ok(int isa) {
    switch (isa) {
    case OADAM_BASELINE:
        return 1;
#if OADAM_X86
    case OADAM_AVX2:
        return __builtin_cpu_supports("avx2");
    case OADAM_AVX512:
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

int oadam_isa_best(void) {
    if (isa_ok(OADAM_AVX512)) return OADAM_AVX512;
    if (isa_ok(OADAM_AVX2)) return OADAM_AVX2;
    return OADAM_BASELINE;
}

int oadam_isa_resolve(int isa) {
    if (isa == OADAM_AUTO) return oadam_isa_best();
    return isa_ok(isa) ? isa : -1;
}

/* bf16 <-> fp32 (bf16 is the top half of an fp32). */
static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

/* One element, the contract's order of operations. */
static inline float adam1(const struct oadam_k *k, float g, float *master, float *m, float *v) {
    g = g * k->gs;
    float mi = k->b1 * *m + (1.0f - k->b1) * g;
    float vi = k->b2 * *v + (1.0f - k->b2) * g * g;
    *m = mi;
    *v = vi;
    float mh = mi / k->c1, vh = vi / k->c2;
    float w = *master;
    w -= k->lr * (mh / (sqrtf(vh) + k->eps) + k->wd * w);
    *master = w;
    return w;
}

static void base_bf16(const struct oadam_k *k, uint16_t *x, float *ms, float *m, float *v,
                      size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = f32_bf16(adam1(k, bf16_f32(x[i]), ms + i, m + i, v + i));
}

static void base_f32(const struct oadam_k *k, float *x, float *ms, float *m, float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = adam1(k, x[i], ms + i, m + i, v + i);
}

#if OADAM_X86
#pragma GCC push_options
#pragma GCC target("avx2")
/* 8 lanes: the contract's operations one by one */
#define AVX2_BODY(G, W_OUT)                                                                        \
    do {                                                                                           \
        __m256 g = _mm256_mul_ps((G), gs);                                                         \
        __m256 mi =                                                                                \
            _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(o1, g));        \
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),                       \
                                  _mm256_mul_ps(_mm256_mul_ps(o2, g), g));                         \
        _mm256_storeu_ps(m + i, mi);                                                               \
        _mm256_storeu_ps(v + i, vi);                                                               \
        __m256 mh = _mm256_div_ps(mi, c1), vh = _mm256_div_ps(vi, c2);                             \
        __m256 w = _mm256_loadu_ps(ms + i);                                                        \
        __m256 q = _mm256_div_ps(mh, _mm256_add_ps(_mm256_sqrt_ps(vh), eps));                      \
        w = _mm256_sub_ps(w, _mm256_mul_ps(lr, _mm256_add_ps(q, _mm256_mul_ps(wd, w))));           \
        _mm256_storeu_ps(ms + i, w);                                                               \
        W_OUT;                                                                                     \
    } while (0)
#define AVX2_CONSTS                                                                                \
    const __m256 gs = _mm256_set1_ps(k->gs), b1 = _mm256_set1_ps(k->b1),                           \
                 b2 = _mm256_set1_ps(k->b2), o1 = _mm256_set1_ps(1.0f - k->b1),                    \
                 o2 = _mm256_set1_ps(1.0f - k->b2), c1 = _mm256_set1_ps(k->c1),                    \
                 c2 = _mm256_set1_ps(k->c2), eps = _mm256_set1_ps(k->eps),                         \
                 lr = _mm256_set1_ps(k->lr), wd = _mm256_set1_ps(k->wd)

/* fp32 -> bf16 of 8 lanes, nearest even, NaN quiet (f32_bf16's integer steps) */
static inline __m128i avx2_to_bf16(__m256 w) {
    __m256i u = _mm256_castps_si256(w);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    r = _mm256_srli_epi32(r, 16);
    r = _mm256_blendv_epi8(r, qn, nan);
    r = _mm256_and_si256(r, _mm256_set1_epi32(0xffff));
    __m256i p = _mm256_packus_epi32(r, r); /* per 128-bit lane: lo4 lo4 | hi4 hi4 */
    p = _mm256_permute4x64_epi64(p, 0x08);
    return _mm256_castsi256_si128(p);
}

static void avx2_bf16(const struct oadam_k *k, uint16_t *x, float *ms, float *m, float *v,
                      size_t n) {
    AVX2_CONSTS;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(x + i));
        __m256 gx = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        AVX2_BODY(gx, _mm_storeu_si128((__m128i *)(x + i), avx2_to_bf16(w)));
    }
    base_bf16(k, x + i, ms + i, m + i, v + i, n - i);
}

static void avx2_f32(const struct oadam_k *k, float *x, float *ms, float *m, float *v, size_t n) {
    AVX2_CONSTS;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        AVX2_BODY(_mm256_loadu_ps(x + i), _mm256_storeu_ps(x + i, w));
    base_f32(k, x + i, ms + i, m + i, v + i, n - i);
}

static void avx2_widen(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++)
        dst[i] = bf16_f32(src[i]);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
#define AVX512_BODY(G, W_OUT)                                                                      \
    do {                                                                                           \
        __m512 g = _mm512_mul_ps((G), gs);                                                         \
        __m512 mi =                                                                                \
            _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(o1, g));        \
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),                       \
                                  _mm512_mul_ps(_mm512_mul_ps(o2, g), g));                         \
        _mm512_storeu_ps(m + i, mi);                                                               \
        _mm512_storeu_ps(v + i, vi);                                                               \
        __m512 mh = _mm512_div_ps(mi, c1), vh = _mm512_div_ps(vi, c2);                             \
        __m512 w = _mm512_loadu_ps(ms + i);                                                        \
        __m512 q = _mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), eps));                      \
        w = _mm512_sub_ps(w, _mm512_mul_ps(lr, _mm512_add_ps(q, _mm512_mul_ps(wd, w))));           \
        _mm512_storeu_ps(ms + i, w);                                                               \
        W_OUT;                                                                                     \
    } while (0)
#define AVX512_CONSTS                                                                              \
    const __m512 gs = _mm512_set1_ps(k->gs), b1 = _mm512_set1_ps(k->b1),                           \
                 b2 = _mm512_set1_ps(k->b2), o1 = _mm512_set1_ps(1.0f - k->b1),                    \
                 o2 = _mm512_set1_ps(1.0f - k->b2), c1 = _mm512_set1_ps(k->c1),                    \
                 c2 = _mm512_set1_ps(k->c2), eps = _mm512_set1_ps(k->eps),                         \
                 lr = _mm512_set1_ps(k->lr), wd = _mm512_set1_ps(k->wd)

static inline __m256i avx512_to_bf16(__m512 w) {
    __m512i u = _mm512_castps_si512(w);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i qn = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    r = _mm512_mask_blend_epi32(nan, r, qn);
    return _mm512_cvtepi32_epi16(r); /* truncates to the low 16 bits */
}

static void avx512_bf16(const struct oadam_k *k, uint16_t *x, float *ms, float *m, float *v,
                        size_t n) {
    AVX512_CONSTS;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(x + i));
        __m512 gx = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        AVX512_BODY(gx, _mm256_storeu_si256((__m256i *)(x + i), avx512_to_bf16(w)));
    }
    base_bf16(k, x + i, ms + i, m + i, v + i, n - i);
}

static void avx512_f32(const struct oadam_k *k, float *x, float *ms, float *m, float *v, size_t n) {
    AVX512_CONSTS;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        AVX512_BODY(_mm512_loadu_ps(x + i), _mm512_storeu_ps(x + i, w));
    base_f32(k, x + i, ms + i, m + i, v + i, n - i);
}
#pragma GCC pop_options
#endif

void oadam_update(int isa, int bf16, const struct oadam_k *k, void *x, float *master, float *m,
                  float *v, size_t n) {
#if OADAM_X86
    if (isa == OADAM_AVX512) {
        if (bf16)
            avx512_bf16(k, x, master, m, v, n);
        else
            avx512_f32(k, x, master, m, v, n);
        return;
    }
    if (isa == OADAM_AVX2) {
        if (bf16)
            avx2_bf16(k, x, master, m, v, n);
        else
            avx2_f32(k, x, master, m, v, n);
        return;
    }
#else
    (void)isa;
#endif
    if (bf16)
        base_bf16(k, x, master, m, v, n);
    else
        base_f32(k, x, master, m, v, n);
}

void oadam_widen_bf16(float *dst, const uint16_t *src, size_t n) {
#if OADAM_X86
    if (isa_ok(OADAM_AVX2)) {
        avx2_widen(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_f32(src[i]);
}

void oadam_part(size_t lo, size_t hi, int t, int T, size_t *a, size_t *z) {
    size_t len = hi - lo, per = (len + (size_t)T - 1) / (size_t)T;
    per = (per + 15) & ~(size_t)15; /* whole vectors (and 64-byte lines of fp32) per thread */
    *a = lo + per * (size_t)t;
    if (*a > hi) *a = hi;
    *z = *a + per < hi ? *a + per : hi;
}

/* ---- thread pool ---- */

struct oadam_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *th;
    int T, started; /* threads running */
    unsigned long gen;
    int pending; /* threads still in the current job */
    int active;  /* a job was started and not waited for */
    int quit;
    oadam_job fn;
    void *arg;
};

struct oadam_worker {
    struct oadam_pool *p;
    int t;
};

static void *worker(void *u) {
    struct oadam_worker *w = u;
    struct oadam_pool *p = w->p;
    int t = w->t;
    free(w);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        oadam_job fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, t, p->T);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct oadam_pool *oadam_pool_new(int T) {
    if (T < 1) T = 1;
    struct oadam_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->T = T;
    p->th = calloc((size_t)T, sizeof *p->th);
    if (!p->th || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->th);
        free(p);
        return NULL;
    }
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int t = 0; t < T; t++) {
        struct oadam_worker *w = malloc(sizeof *w);
        if (!w) break;
        *w = (struct oadam_worker){p, t};
        if (pthread_create(&p->th[t], NULL, worker, w) != 0) {
            free(w);
            break;
        }
        p->started++;
    }
    if (p->started < T) {
        oadam_pool_free(p);
        return NULL;
    }
    return p;
}

void oadam_pool_free(struct oadam_pool *p) {
    if (!p) return;
    oadam_pool_wait(p);
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < p->started; t++)
        pthread_join(p->th[t], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

int oadam_pool_threads(const struct oadam_pool *p) {
    return p->T;
}

void oadam_pool_start(struct oadam_pool *p, oadam_job fn, void *arg) {
    oadam_pool_wait(p); /* one job at a time */
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->T;
    p->active = 1;
    p->gen++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

void oadam_pool_wait(struct oadam_pool *p) {
    pthread_mutex_lock(&p->mu);
    while (p->active && p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    p->active = 0;
    pthread_mutex_unlock(&p->mu);
}

void oadam_pool_run(struct oadam_pool *p, oadam_job fn, void *arg) {
    oadam_pool_start(p, fn, arg);
    oadam_pool_wait(p);
}
