/* Rendezvous: a key/value store for the ranks of one world (NCCL unique id,
 * Gloo addresses), matching worker/comm/rdzv.h. Two kinds of world use it:
 *   attempts:    /v1/rdzv/{job}/{attempt}/{key}   bearer = the attempt's token
 *   node checks: /v1/nodechecks/{id}/rdzv/{key}   bearer = the check's token
 * with one protocol:
 *   PUT .../{key}  {"value":"<base64>"}  -> 200 {"ok":true}
 *   GET .../{key}?wait_ms=N -> 200 {"value":..} | 404 RDZV_KEY_NOT_FOUND after the wait
 * The token is random per world and compared in constant time against that
 * world only, so a token of one world (or any tenant's API token) cannot read
 * another's keys: 403 RDZV_FORBIDDEN. Keys are written once (a different
 * second value is 409 RDZV_KEY_EXISTS; more than RDZV_MAX_KEYS is 409
 * RDZV_FULL); a value that is not a string is 400 INVALID_RDZV_VALUE, one over
 * RDZV_MAX_VALUE bytes 413 PAYLOAD_TOO_LARGE. Values live in memory for as
 * long as the world runs; attempts also record them in the store first. */
#ifndef LOOM_DAEMON_RDZV_H
#define LOOM_DAEMON_RDZV_H

#include <jansson.h>
#include <pthread.h>

#define RDZV_MAX_KEYS  4096
#define RDZV_MAX_VALUE (256 * 1024)

struct http_req;
struct http_notify;

/* Where the keys of one kind of world live. All callbacks are called by the
 * request's thread; `table` and `deny` with *mu held. */
struct rdzv_scope {
    pthread_mutex_t *mu;        /* guards the key tables */
    struct http_notify *notify; /* signalled after every new key */
    long max_wait_ms;           /* cap on ?wait_ms */
    void *arg;
    /* The key table (a JSON object, borrowed) of the world the request names,
     * when the bearer token is that world's; NULL otherwise. */
    json_t *(*table)(struct http_req *req, void *arg);
    /* Answers the 403 for a request whose table() was NULL. */
    int (*deny)(struct http_req *req, void *arg);
    /* Optional (may be NULL), called without the lock before a new key is
     * published: make it durable. 0 ok, else the PUT answers 503. */
    int (*persist)(struct http_req *req, const char *key, json_t *value, void *arg);
};

/* PUT and GET of one key in the scope (the HTTP handlers' bodies). */
int rdzv_scope_put(struct http_req *req, const struct rdzv_scope *s);
int rdzv_scope_get(struct http_req *req, const struct rdzv_scope *s);

/* The attempt routes. */
int rdzv_put(struct http_req *req);
int rdzv_get_key(struct http_req *req);

#endif
