/* Rendezvous: a small key/value store shared by the ranks of one attempt,
 * used to exchange the backends' connection details (Gloo listen addresses,
 * the NCCL unique id). Values are opaque bytes; a key is written once.
 *
 * Two stores behind one interface:
 * - "file:DIR": one file per key in a directory all ranks can see (standalone
 *   runs, the local launcher, tests). Writes go to a temporary name and are
 *   renamed, so a reader never sees half a value. DIR must be fresh per
 *   attempt (keys are never overwritten or deleted).
 * - "http://host:port/v1/rdzv/JOB/ATTEMPT" (LOOM_RDZV under an agent): loomd's
 *   rendezvous endpoint, through api/client.h with the attempt token:
 *     PUT  BASE/KEY  {"value":"<base64>"}      -> 2xx
 *     GET  BASE/KEY?wait_ms=N                  -> 200 {"value":"<base64>"},
 *                                                 404 when absent after the wait
 *   The server may hold a GET up to wait_ms (long-poll) or answer 404 at
 *   once; the client retries until its own deadline either way. Connection
 *   errors are retried until the deadline too (loomd restarting).
 * Keys are escaped: characters outside [A-Za-z0-9._-] become "~XX" (hex), so
 * any key is a safe file name and URL path segment.
 *
 * Thread-safe (one mutex per store). */
#ifndef LOOM_WORKER_COMM_RDZV_H
#define LOOM_WORKER_COMM_RDZV_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rdzv;

/* Open the store named by `spec`; token may be NULL. NULL on failure (err). */
struct rdzv *rdzv_open(const char *spec, const char *token, char *err, size_t errlen);
void rdzv_free(struct rdzv *r); /* accepts NULL */

/* Publish key = value (len bytes). 0, or -1 with a message in err. */
int rdzv_set(struct rdzv *r, const char *key, const void *val, size_t len, char *err,
             size_t errlen);
/* Wait up to timeout_ms for `key` and return a malloc'ed copy of its value in
 * *val (caller frees) and its length in *len. 0 found, -1 error, -2 timed out
 * (err names the key and the time waited). */
int rdzv_get(struct rdzv *r, const char *key, void **val, size_t *len, int timeout_ms, char *err,
             size_t errlen);

/* Escape `key` into out (outlen bytes). Returns -1 when it does not fit. */
int rdzv_escape_key(const char *key, char *out, size_t outlen);

#ifdef __cplusplus
}
#endif

#endif
