/* 64-bit FNV-1a, the one non-cryptographic hash of the code base (prepared
 * statement cache keys, rate-limit buckets, data-loader fingerprints, the
 * worker's weight hash). Chain calls by passing the last result as h. */
#ifndef LOOM_COMMON_HASH_H
#define LOOM_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define LOOM_FNV1A_INIT 0xcbf29ce484222325ULL

static inline uint64_t loom_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static inline uint64_t loom_fnv1a_str(const char *s) {
    return loom_fnv1a(LOOM_FNV1A_INIT, s, strlen(s));
}

#endif
