/* Rendezvous (see rdzv.h): the key/value protocol once, in rdzv_scope_put /
 * rdzv_scope_get, and the attempt scope (tables in struct cluster_attempt, keys
 * recorded in rdzv_keys so a loomd restart keeps what ranks were told). The
 * node-check scope is in nodecheck.c. */
#include "daemon/rdzv.h"

#include "common/clock.h"
#include "common/token.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#include <stdlib.h>
#include <string.h>

/* ---- the protocol ---- */

/* Locks the scope and finds the request's key table. NULL after answering
 * the 403 (*rc is the handler's result; the lock is released then). */
static json_t *lock_table(struct http_req *req, const struct rdzv_scope *s, int *rc) {
    pthread_mutex_lock(s->mu);
    json_t *t = s->table(req, s->arg);
    if (!t) {
        *rc = s->deny(req, s->arg);
        pthread_mutex_unlock(s->mu);
    }
    return t;
}

int rdzv_scope_put(struct http_req *req, const struct rdzv_scope *s) {
    const char *key = http_param(req, "key");
    json_t *value = json_object_get(req->json, "value");
    if (!key || !json_is_string(value))
        return http_error(req, 400, "INVALID_RDZV_VALUE", "body must be {\"value\": \"<base64>\"}");
    if (json_string_length(value) > RDZV_MAX_VALUE)
        return http_error(req, 413, "PAYLOAD_TOO_LARGE", "value is %zu bytes; at most %d",
                          json_string_length(value), RDZV_MAX_VALUE);
    int rc = 0;
    json_t *t = lock_table(req, s, &rc);
    if (!t) return rc;
    json_t *old = json_object_get(t, key);
    if (old && !json_equal(old, value)) {
        pthread_mutex_unlock(s->mu);
        return http_error(req, 409, "RDZV_KEY_EXISTS", "key %s was already set to another value",
                          key);
    }
    if (!old && json_object_size(t) >= RDZV_MAX_KEYS) {
        pthread_mutex_unlock(s->mu);
        return http_error(req, 409, "RDZV_FULL", "this rendezvous already holds %d keys",
                          RDZV_MAX_KEYS);
    }
    if (!old && s->persist) {
        /* Durable first, then published; the world may have ended meanwhile. */
        pthread_mutex_unlock(s->mu);
        if (s->persist(req, key, value, s->arg) != 0)
            return http_error(req, 503, "STORE_UNAVAILABLE", "could not record the key");
        pthread_mutex_lock(s->mu);
        t = s->table(req, s->arg);
    }
    if (!old && t && !json_object_get(t, key)) json_object_set(t, key, value);
    pthread_mutex_unlock(s->mu);
    http_notify_signal(s->notify);
    return http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

int rdzv_scope_get(struct http_req *req, const struct rdzv_scope *s) {
    const char *key = http_param(req, "key");
    const char *w = http_query(req, "wait_ms");
    long wait_ms = w ? strtol(w, NULL, 10) : 0;
    if (wait_ms < 0) wait_ms = 0;
    if (wait_ms > s->max_wait_ms) wait_ms = s->max_wait_ms;
    uint64_t gen = http_notify_gen(s->notify);
    for (;;) {
        int rc = 0;
        json_t *t = lock_table(req, s, &rc);
        if (!t) return rc;
        json_t *v = json_object_get(t, key);
        if (v) {
            json_t *reply = json_pack("{s:O}", "value", v);
            pthread_mutex_unlock(s->mu);
            return http_reply_json(req, 200, reply);
        }
        pthread_mutex_unlock(s->mu);
        if (wait_ms <= 0)
            return http_error(req, 404, "RDZV_KEY_NOT_FOUND", "key %s is not set (yet)", key);
        int64_t t0 = clock_mono_ms();
        int r = http_wait(req->ld->http, s->notify, &gen, (int)wait_ms);
        wait_ms -= (long)(clock_mono_ms() - t0);
        if (r <= 0) wait_ms = 0;
    }
}

/* ---- the attempt scope ---- */

/* The active attempt named by the path, when the bearer is its token. Caller holds c->mu. */
static struct cluster_attempt *attempt_of(struct http_req *req) {
    const char *job = http_param(req, "job");
    const char *att = http_param(req, "attempt");
    char *end = NULL;
    long attempt = att ? strtol(att, &end, 10) : -1;
    struct cluster_attempt *a = NULL;
    if (job && att && end && !*end && attempt >= 0)
        a = cluster_attempt_find(req->ld->cluster, job, (int)attempt);
    if (!a || a->phase != ATTEMPT_ACTIVE || !token_equal(req->bearer, a->token)) return NULL;
    return a;
}

static json_t *attempt_table(struct http_req *req, void *arg) {
    struct cluster_attempt *a = attempt_of(req);
    return a ? a->rdzv : NULL;
}

static int attempt_deny(struct http_req *req, void *arg) {
    /* Same answer whether the attempt exists or not: no probing. */
    const char *job = http_param(req, "job"), *att = http_param(req, "attempt");
    return http_error(req, 403, "RDZV_FORBIDDEN",
                      "the token is not valid for attempt %s of job %s (or it is not running)",
                      att ? att : "?", job ? job : "?");
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

static int attempt_persist(struct http_req *req, const char *key, json_t *value, void *arg) {
    struct rdzv_row row = {http_param(req, "job"), key,
                           (int)strtol(http_param(req, "attempt"), NULL, 10),
                           json_dumps(value, JSON_ENCODE_ANY | JSON_COMPACT)};
    int rc = row.value ? store_write(req->ld->store, rdzv_insert, &row) : STORE_ERR;
    free(row.value);
    return rc == STORE_OK ? 0 : -1;
}

static struct rdzv_scope attempt_scope(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    return (struct rdzv_scope){.mu = &c->mu,
                               .notify = &c->rdzv,
                               .max_wait_ms = req->ld->cfg.longpoll_timeout * 1000,
                               .table = attempt_table,
                               .deny = attempt_deny,
                               .persist = attempt_persist};
}

int rdzv_put(struct http_req *req) {
    struct rdzv_scope s = attempt_scope(req);
    return rdzv_scope_put(req, &s);
}

int rdzv_get_key(struct http_req *req) {
    struct rdzv_scope s = attempt_scope(req);
    return rdzv_scope_get(req, &s);
}
