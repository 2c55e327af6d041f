/* Shared by the GPU micro-benchmarks (tests/gpu/bench_*.c): a CUDA error
 * check that exits, the "no GPU" skip (exit code 77, never a pass) and the
 * median of per-iteration times. */
#ifndef LOOM_TESTS_GPU_BENCH_UTIL_H
#define LOOM_TESTS_GPU_BENCH_UTIL_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* 1 when a CUDA device is usable; else prints "SKIP: no GPU" and returns 0
 * (the caller returns 77). */
static inline int bench_have_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP: no GPU\n");
        return 0;
    }
    return 1;
}

static inline int bench_cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Sorts ms[0..n) and returns its median. */
static inline float bench_median(float *ms, int n) {
    qsort(ms, (size_t)n, sizeof *ms, bench_cmpf);
    return ms[n / 2];
}

#endif
