/* Random tokens and constant-time comparison (see token.h), on libcrypto. */
#include "common/token.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <string.h>

int token_random(void *out, size_t n) {
    unsigned char *p = out;
    while (n > 0) {
        int k = n > INT_MAX ? INT_MAX : (int)n;
        if (RAND_bytes(p, k) != 1) {
            OPENSSL_cleanse(out, (size_t)(p - (unsigned char *)out) + n);
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int token_hex(char *out, size_t outlen, size_t nbytes) {
    static const char digits[] = "0123456789abcdef";
    unsigned char r[64];
    if (outlen) out[0] = '\0';
    if (nbytes > sizeof r || outlen < 2 * nbytes + 1) return -1;
    if (token_random(r, nbytes) != 0) return -1;
    for (size_t i = 0; i < nbytes; i++) {
        out[2 * i] = digits[r[i] >> 4];
        out[2 * i + 1] = digits[r[i] & 15];
    }
    out[2 * nbytes] = '\0';
    OPENSSL_cleanse(r, sizeof r);
    return 0;
}

int token_equal_mem(const void *a, const void *b, size_t n) {
    return CRYPTO_memcmp(a, b, n) == 0;
}

int token_equal(const char *a, const char *b) {
    if (!a || !b) return 0;
    size_t n = strlen(a);
    if (strlen(b) != n) return 0;
    return CRYPTO_memcmp(a, b, n) == 0;
}
