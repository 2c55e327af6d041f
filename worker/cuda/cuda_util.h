/* CUDA backend utilities: error checks that name file:line, and the device
 * arena the backend carves all of its memory from.
 *
 * The worker's device code fails fast (house style): CUDA_CHECK and
 * CUBLAS_CHECK print "file:line: what failed: why" and exit(1). Memory comes
 * from a few large cudaMalloc arenas made at start-up; nothing is allocated
 * inside a training step. An arena that cannot be made is one clear message
 * with the bytes asked for and the bytes free on the device.
 *
 * C-compatible header (the engine is C); the implementation is CUDA C++. */
#ifndef LOOM_CUDA_UTIL_H
#define LOOM_CUDA_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque CUDA stream handle for C callers (a cudaStream_t). */
typedef struct CUstream_st *lcuda_stream;

/* Fail-fast reporters behind the CHECK macros (print and exit(1)). */
void lcuda_fail(const char *file, int line, const char *expr, const char *msg);
/* Returns 0 when a CUDA device is usable; otherwise 77 after printing
 * "no GPU: <reason>" to stderr (tests exit with it: ctest's skip code). */
int lcuda_probe(void);

/* A bump allocator over one cudaMalloc'd block. Allocations are 256-byte
 * aligned. `peak` is the high-water mark of `used`. Single-threaded. */
struct lcuda_arena {
    char name[32];
    uint8_t *base;
    size_t size;
    size_t used;
    size_t peak;
};

/* Make an arena of `size` bytes. On failure prints
 * "cuda: cannot allocate arena NAME: asked N bytes (X GiB), free F of T" and
 * exits(1): an out-of-memory at start-up is fatal and says why. */
void lcuda_arena_init(struct lcuda_arena *a, const char *name, size_t size);
/* Take `bytes` (rounded up to 256) from the arena; exits with a message that
 * names the arena, the request and what is left when it does not fit (a
 * sizing bug, never a run-time condition). The memory is not cleared. */
void *lcuda_arena_alloc(struct lcuda_arena *a, size_t bytes);
/* Release everything taken since `mark` (a previous a->used value). */
void lcuda_arena_reset(struct lcuda_arena *a, size_t mark);
void lcuda_arena_free(struct lcuda_arena *a); /* accepts a zeroed arena */

/* bf16 <-> fp32 on the host (round to nearest even), for tests and I/O. */
static inline uint16_t lcuda_f2bf(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    uint32_t lsb = (v.u >> 16) & 1u;
    return (uint16_t)((v.u + 0x7fffu + lsb) >> 16);
}
static inline float lcuda_bf2f(uint16_t b) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)b << 16};
    return v.f;
}

#ifdef __cplusplus
}
#endif

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) lcuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
    } while (0)

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            lcuda_fail(__FILE__, __LINE__, #call, cublasLtGetStatusString(s_));                    \
    } while (0)

/* After a kernel launch: catches bad launch configurations at once. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#endif
