/* The LoRA dropout mask (backend.h dropout): element i of a tensor whose
 * mask seed is `seed` is kept when the top 32 bits of a splitmix64 finaliser
 * of (seed, i) are at least p * 2^32. One definition for the cpu backend and
 * the CUDA kernel (k_lora.cu), so both drop the same elements and a test can
 * compare them; a pure function of (seed, i), so the backward regenerates
 * the forward's mask instead of keeping it. */
#ifndef LOOM_WORKER_LORA_MASK_H
#define LOOM_WORKER_LORA_MASK_H

#include <stdint.h>

#ifdef __CUDACC__
#define LORA_MASK_FN __host__ __device__ static inline
#else
#define LORA_MASK_FN static inline
#endif

/* p in [0, 1) as a 32-bit threshold. */
LORA_MASK_FN uint32_t lora_drop_threshold(float p) {
    return (uint32_t)((double)p * 4294967296.0);
}

LORA_MASK_FN int lora_keep(uint64_t seed, uint64_t i, uint32_t thr) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32) >= thr;
}

#endif
