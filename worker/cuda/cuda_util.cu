/* CUDA backend utilities: fail-fast error reporting, the device probe used
 * by GPU tests, and the start-up arenas (see cuda_util.h). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_util.h"

extern "C" void lcuda_fail(const char *file, int line, const char *expr, const char *msg) {
    fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, expr, msg);
    fflush(stderr);
    exit(1);
}

extern "C" int lcuda_probe(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        fprintf(stderr, "no GPU: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found");
        return 77;
    }
    return 0;
}

extern "C" void lcuda_arena_init(struct lcuda_arena *a, const char *name, size_t size) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    size = (size + 255) & ~(size_t)255;
    if (size == 0) return;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        fprintf(stderr,
                "cuda: cannot allocate arena %s: asked %zu bytes (%.2f GiB), device has %zu free "
                "(%.2f GiB) of %zu (%s)\n",
                name, size, size / 1073741824.0, fr, fr / 1073741824.0, tot, cudaGetErrorString(e));
        exit(1);
    }
    a->base = (uint8_t *)p;
    a->size = size;
}

extern "C" void *lcuda_arena_alloc(struct lcuda_arena *a, size_t bytes) {
    size_t want = (bytes + 255) & ~(size_t)255;
    if (a->used + want > a->size) {
        fprintf(stderr, "cuda: arena %s exhausted: asked %zu bytes, %zu of %zu used\n", a->name,
                bytes, a->used, a->size);
        exit(1);
    }
    void *p = a->base + a->used;
    a->used += want;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

extern "C" void lcuda_arena_reset(struct lcuda_arena *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}

extern "C" void lcuda_arena_free(struct lcuda_arena *a) {
    if (!a || !a->base) return;
    cudaFree(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}
