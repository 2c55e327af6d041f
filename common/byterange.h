/* Serving files over HTTP: Range parsing and the SHA-256 ETag, shared by
 * loomd's artifact routes and loom-agent's artifact server. */
#ifndef LOOM_COMMON_BYTERANGE_H
#define LOOM_COMMON_BYTERANGE_H

#include <stdint.h>

/* Parses a Range header against a file of `size` bytes. Returns 0 when there
 * is no header (serve everything), 1 with *off and *len set for one
 * satisfiable range ("bytes=A-B", "bytes=A-" and "bytes=-N"), -1 for anything
 * else (416): malformed, several ranges, or not satisfiable. Pure. */
int byterange_parse(const char *header, uint64_t size, uint64_t *off, uint64_t *len);

/* Lowercase hex SHA-256 of the file at path into out (65 bytes with the
 * NUL). 0, or -1 when it cannot be read. Any thread. */
int byterange_sha256_file(const char *path, char out[65]);

#endif
