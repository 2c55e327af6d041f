/* Secrets: random tokens and their constant-time comparison, written once.
 * Random bytes come from OpenSSL's RAND_bytes (the kernel CSPRNG behind it);
 * when it fails the call fails: there is no weaker fallback, so a caller
 * never hands out a guessable token or id. Thread-safe. */
#ifndef LOOM_COMMON_TOKEN_H
#define LOOM_COMMON_TOKEN_H

#include <stddef.h>

/* n cryptographically random bytes into out. 0, or -1 when the generator
 * failed (out is then zeroed and must not be used). */
int token_random(void *out, size_t n);
/* 2*nbytes lower-case hex digits of nbytes random bytes, NUL-terminated,
 * into out (outlen >= 2*nbytes+1). 0 or -1 (generator failed, or out too
 * small; out is then ""). */
int token_hex(char *out, size_t outlen, size_t nbytes);
/* 1 when a[0..n) equals b[0..n), in time that depends only on n. */
int token_equal_mem(const void *a, const void *b, size_t n);
/* 1 when the strings are equal (NULL equals nothing). The time depends on
 * the lengths, never on where the contents differ. */
int token_equal(const char *a, const char *b);

#endif
