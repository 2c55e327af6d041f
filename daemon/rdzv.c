/* Rendezvous handlers (see rdzv.h). */
#include "daemon/rdzv.h"

#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RDZV_MAX_KEYS  4096
#define RDZV_MAX_VALUE (256 * 1024)

/* Finds the active attempt named by the path and checks the bearer token.
 * Caller holds c->mu. Returns the attempt, or NULL after answering. */
static struct cluster_attempt *authorize(struct http_req *req, struct cluster *c, int *answered) {
    const char *job = http_param(req, "job");
    const char *att = http_param(req, "attempt");
    const char *tok = req->bearer;
    *answered = 0;
    char *end = NULL;
    long attempt = att ? strtol(att, &end, 10) : -1;
    struct cluster_attempt *a = NULL;
    if (job && att && end && !*end && attempt >= 0) a = cluster_attempt_find(c, job, (int)attempt);
    size_t tl = tok ? strlen(tok) : 0;
    if (!a || a->phase != ATTEMPT_ACTIVE || tl != strlen(a->token) ||
        CRYPTO_memcmp(tok, a->token, tl) != 0) {
        /* Same answer whether the attempt exists or not: no probing. */
        *answered = 1;
        http_error(req, 403, "RDZV_FORBIDDEN",
                   "the token is not valid for attempt %s of job %s (or it is not running)",
                   att ? att : "?", job ? job : "?");
        return NULL;
    }
    return a;
}

struct rdzv_row {
    const char *job, *key;
    int attempt;
    char *value;
};

static int rdzv_insert(struct store_tx *tx, void *arg) {
    struct rdzv_row *r = arg;
    sqlite3_stmt *st = store_stmt(tx, "INSERT OR IGNORE INTO rdzv_keys (job_id, attempt, key, "
                                      "value) VALUES (?, ?, ?, ?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, r->job, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, r->attempt);
    sqlite3_bind_text(st, 3, r->key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    return rc;
}

int rdzv_put(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *key = http_param(req, "key");
    json_t *value = json_object_get(req->json, "value");
    if (!key || !json_is_string(value))
        return http_error(req, 400, "INVALID_RDZV_VALUE", "body must be {\"value\": \"<base64>\"}");
    if (json_string_length(value) > RDZV_MAX_VALUE)
        return http_error(req, 413, "PAYLOAD_TOO_LARGE", "value is %zu bytes; at most %d",
                          json_string_length(value), RDZV_MAX_VALUE);
    pthread_mutex_lock(&c->mu);
    int answered = 0;
    struct cluster_attempt *a = authorize(req, c, &answered);
    if (!a) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    json_t *old = json_object_get(a->rdzv, key);
    if (old && !json_equal(old, value)) {
        pthread_mutex_unlock(&c->mu);
        return http_error(req, 409, "RDZV_KEY_EXISTS", "key %s was already set to another value",
                          key);
    }
    if (!old && json_object_size(a->rdzv) >= RDZV_MAX_KEYS) {
        pthread_mutex_unlock(&c->mu);
        return http_error(req, 409, "RDZV_FULL", "attempt already holds %d keys", RDZV_MAX_KEYS);
    }
    int attempt = a->attempt;
    pthread_mutex_unlock(&c->mu);
    if (!old) {
        /* Durable first, so a loomd restart keeps what ranks were told. */
        struct rdzv_row row = {http_param(req, "job"), key, attempt,
                               json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT)};
        int rc = row.value ? store_write(req->ld->store, rdzv_insert, &row) : STORE_ERR;
        free(row.value);
        if (rc != STORE_OK)
            return http_error(req, 503, "STORE_UNAVAILABLE", "could not record the key");
        pthread_mutex_lock(&c->mu);
        a = cluster_attempt_find(c, row.job, attempt);
        if (a && !json_object_get(a->rdzv, key)) json_object_set(a->rdzv, key, value);
        pthread_mutex_unlock(&c->mu);
    }
    http_notify_signal(&c->rdzv);
    return http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

int rdzv_get_key(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *key = http_param(req, "key");
    const char *w = http_query(req, "wait_ms");
    long wait_ms = w ? strtol(w, NULL, 10) : 0;
    long cap = req->ld->cfg.longpoll_timeout * 1000;
    if (wait_ms < 0) wait_ms = 0;
    if (wait_ms > cap) wait_ms = cap;
    uint64_t gen = http_notify_gen(&c->rdzv);
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int answered = 0;
        struct cluster_attempt *a = authorize(req, c, &answered);
        if (!a) {
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
        json_t *v = json_object_get(a->rdzv, key);
        if (v) {
            json_t *reply = json_pack("{s:O}", "value", v);
            pthread_mutex_unlock(&c->mu);
            return http_reply_json(req, 200, reply);
        }
        pthread_mutex_unlock(&c->mu);
        if (wait_ms <= 0)
            return http_error(req, 404, "RDZV_KEY_NOT_FOUND", "key %s is not set (yet)", key);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int r = http_wait(req->ld->http, &c->rdzv, &gen, (int)wait_ms);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        wait_ms -= (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (r <= 0) wait_ms = 0;
    }
}
