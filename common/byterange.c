/* Serving files over HTTP, the parts loomd (daemon/artifacts.c) and
 * loom-agent (agent/artifacts.c) share: one Range header parsed against a
 * file size, and a file's SHA-256 (the ETag). See byterange.h. */
#include "common/byterange.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Strict unsigned decimal of [p, e); -1 when empty or not digits. */
static int parse_u64(const char *p, const char *e, uint64_t *out) {
    if (p == e) return -1;
    uint64_t v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

int byterange_parse(const char *h, uint64_t size, uint64_t *off, uint64_t *len) {
    if (!h) return 0;
    while (*h == ' ')
        h++;
    if (strncmp(h, "bytes=", 6)) return -1;
    const char *spec = h + 6, *end = spec + strlen(spec);
    while (end > spec && end[-1] == ' ')
        end--;
    if (memchr(spec, ',', (size_t)(end - spec))) return -1; /* one range only */
    const char *dash = memchr(spec, '-', (size_t)(end - spec));
    if (!dash) return -1;
    uint64_t a = 0, b = 0;
    if (dash == spec) { /* suffix: the last N bytes */
        if (parse_u64(dash + 1, end, &b) || b == 0 || size == 0) return -1;
        if (b > size) b = size;
        *off = size - b;
        *len = b;
        return 1;
    }
    if (parse_u64(spec, dash, &a) || a >= size) return -1;
    if (dash + 1 == end) {
        b = size - 1;
    } else {
        if (parse_u64(dash + 1, end, &b) || b < a) return -1;
        if (b >= size) b = size - 1;
    }
    *off = a;
    *len = b - a + 1;
    return 1;
}

int byterange_sha256_file(const char *path, char out[65]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char *buf = malloc(1 << 20);
    int ret = -1;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) goto out;
    ssize_t n;
    while ((n = read(fd, buf, 1 << 20)) > 0)
        if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1) goto out;
    if (n < 0) goto out;
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32) goto out;
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    ret = 0;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return ret;
}
