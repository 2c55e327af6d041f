/* The offloaded optimizer's CPU side (worker/offload.c): AdamW kernels over
 * host arrays, vectorised (AVX-512F, AVX2, portable C) with the instruction
 * set picked at run time, and a fixed pool of threads that runs them over the
 * shard.
 *
 * Kernel contract, for i in [0, n):
 *   g = grad[i] * gs                       (grad: x[i], bf16 or fp32)
 *   m = b1 * m + (1 - b1) * g
 *   v = b2 * v + ((1 - b2) * g) * g
 *   w = master[i]
 *   w = w - lr * ((m / c1) / (sqrt(v / c2) + eps) + wd * w)
 *   master[i] = w; x[i] = w (bf16: rounded to nearest even, NaN kept quiet)
 * every operation an IEEE fp32 multiply, add, divide or square root in that
 * order (no fused multiply-add), so every variant gives the same bits as the
 * scalar loop and as the CPU backend's AdamW (worker/backend.h's formula).
 * c1 = 1 - b1^step and c2 = 1 - b2^step are the caller's.
 *
 * Pool: oadam_pool_new(T) starts T threads once; oadam_pool_run hands every
 * thread t of T the same job fn(arg, t, T) and returns when all are done
 * (start + wait); oadam_pool_start alone returns at once and oadam_pool_wait
 * waits for the job (one job at a time). Only one thread drives a pool. */
#ifndef LOOM_WORKER_OFFLOAD_ADAMW_H
#define LOOM_WORKER_OFFLOAD_ADAMW_H

#include <stddef.h>
#include <stdint.h>

enum oadam_isa { OADAM_AUTO = 0, OADAM_BASELINE, OADAM_AVX2, OADAM_AVX512, OADAM_NISA };

struct oadam_k {
    float lr, b1, b2, eps, wd, gs, c1, c2;
};

/* "auto", "baseline", "avx2", "avx512" -> enum; -1 for anything else. */
int oadam_isa_parse(const char *s);
const char *oadam_isa_name(int isa);
/* The best set this CPU runs (never OADAM_AUTO). */
int oadam_isa_best(void);
/* isa if this CPU runs it (OADAM_AUTO: the best), else -1. */
int oadam_isa_resolve(int isa);

/* The update above over n elements with the given (resolved) isa; x holds
 * bf16 (uint16_t) when bf16 is 1, else fp32. */
void oadam_update(int isa, int bf16, const struct oadam_k *k, void *x, float *master, float *m,
                  float *v, size_t n);

/* bf16 bits -> fp32 over n elements (dst[i] = src[i] << 16). */
void oadam_widen_bf16(float *dst, const uint16_t *src, size_t n);

struct oadam_pool;
typedef void (*oadam_job)(void *arg, int t, int T);
/* T >= 1 threads; NULL on failure. */
struct oadam_pool *oadam_pool_new(int T);
void oadam_pool_free(struct oadam_pool *p); /* NULL ok; waits for a started job */
int oadam_pool_threads(const struct oadam_pool *p);
void oadam_pool_start(struct oadam_pool *p, oadam_job fn, void *arg);
void oadam_pool_wait(struct oadam_pool *p); /* no-op without a started job */
void oadam_pool_run(struct oadam_pool *p, oadam_job fn, void *arg);

/* Thread t's part [*a, *z) of [lo, hi) split T ways (the same split for the
 * first touch and every update, so each thread updates the pages it placed). */
void oadam_part(size_t lo, size_t hi, int t, int T, size_t *a, size_t *z);

#endif
