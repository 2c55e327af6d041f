/* The audit log: recording, the retention sweep and GET /v1/audit (see
 * audit.h). */
#include "daemon/audit.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"
#include "daemon/usage.h"

#define SWEEP_EVERY_S 3600
#define LIST_DEFAULT  100
#define LIST_MAX      1000
#define DAY_MS        86400000LL

struct audit {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int started;
};

int audit_wanted(const char *method, const char *route_pattern, int route_auth) {
    if (route_auth != HTTP_AUTH_ADMIN && route_auth != HTTP_AUTH_TENANT &&
        route_auth != HTTP_AUTH_ANY_TOKEN)
        return 0;
    return auth_route_scope(method, route_pattern) != AUTH_SCOPE_READ;
}

static int record_cb(struct store_tx *tx, void *arg) {
    const struct audit_event *e = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "INSERT INTO audit(at, actor, tenant_id, method, route, "
                       "path, object_id, remote, status) VALUES (?,?,?,?,?,?,?,?,?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, store_now_ms());
    sqlite3_bind_text(st, 2, e->actor ? e->actor : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, e->tenant_id ? e->tenant_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, e->method, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, e->route, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, e->path, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, e->object_id ? e->object_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, e->remote ? e->remote : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 9, e->status);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

void audit_record(struct loomd *ld, const struct audit_event *e) {
    if (!ld->store) return;
    if (store_write(ld->store, record_cb, (void *)e) != STORE_OK)
        log_warn("audit: could not record %s %s (%d) by '%s'", e->method, e->path, e->status,
                 e->actor ? e->actor : "");
}

struct sweep {
    int64_t before;
    long deleted;
};

static int sweep_cb(struct store_tx *tx, void *arg) {
    struct sweep *sw = arg;
    sqlite3_stmt *st = store_stmt(tx, "DELETE FROM audit WHERE at < ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, sw->before);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    sw->deleted = sqlite3_changes(store_tx_db(tx));
    return STORE_OK;
}

long audit_sweep(struct loomd *ld, long days) {
    if (days <= 0) return 0;
    struct sweep sw = {.before = store_now_ms() - (int64_t)days * DAY_MS};
    if (store_write(ld->store, sweep_cb, &sw) != STORE_OK) {
        log_warn("audit: retention sweep failed");
        return -1;
    }
    if (sw.deleted) log_info("audit: deleted %ld rows older than %ld days", sw.deleted, days);
    return sw.deleted;
}

static void *sweep_main(void *arg) {
    struct loomd *ld = arg;
    struct audit *a = ld->audit;
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        pthread_mutex_unlock(&a->mu);
        audit_sweep(ld, ld->cfg.audit_retention_days);
        pthread_mutex_lock(&a->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += SWEEP_EVERY_S;
        while (!a->stop && pthread_cond_timedwait(&a->cv, &a->mu, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int audit_start(struct loomd *ld) {
    struct audit *a = calloc(1, sizeof *a);
    if (!a) return -1;
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    ld->audit = a;
    /* The first sweep runs before the listener opens. */
    if (audit_sweep(ld, ld->cfg.audit_retention_days) < 0) return -1;
    if (pthread_create(&a->thread, NULL, sweep_main, ld) != 0) {
        log_error("audit: cannot start the retention thread");
        return -1;
    }
    a->started = 1;
    return 0;
}

void audit_stop(struct loomd *ld) {
    struct audit *a = ld->audit;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    if (a->started) pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
    ld->audit = NULL;
}

struct list_op {
    int64_t since;
    const char *actor;
    long limit;
    json_t *items;
};

static const char *col_text(sqlite3_stmt *st, int i) {
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

static int list_cb(struct store_tx *tx, void *arg) {
    struct list_op *op = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT seq, at, actor, tenant_id, method, route, path, object_id, remote, status "
            "FROM audit WHERE at >= ?1 AND (?2 IS NULL OR actor = ?2) ORDER BY seq LIMIT ?3");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, op->since);
    if (op->actor)
        sqlite3_bind_text(st, 2, op->actor, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 2);
    sqlite3_bind_int64(st, 3, op->limit);
    op->items = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(op->items,
                              json_pack("{s:I, s:o, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i}", "seq",
                                        (json_int_t)sqlite3_column_int64(st, 0), "at",
                                        store_time_json(sqlite3_column_int64(st, 1)), "actor",
                                        col_text(st, 2), "tenant_id", col_text(st, 3), "method",
                                        col_text(st, 4), "route", col_text(st, 5), "path",
                                        col_text(st, 6), "object_id", col_text(st, 7), "remote",
                                        col_text(st, 8), "status", sqlite3_column_int(st, 9)));
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        json_decref(op->items);
        op->items = NULL;
        return STORE_ERR;
    }
    return STORE_OK;
}

int audit_api_list(struct http_req *req) {
    struct list_op op = {.limit = LIST_DEFAULT};
    const char *since = http_query(req, "since");
    if (since && usage_parse_time(since, &op.since) != 0)
        return API_ERROR(req, INVALID_TIME, "since=%s is not RFC 3339, YYYY-MM-DD or ms", since);
    op.actor = http_query(req, "actor");
    if (op.actor && (!*op.actor || strlen(op.actor) > 63))
        return API_ERROR(req, INVALID_QUERY, "actor must be a token id or 'admin' (1-63 chars)");
    const char *limit = http_query(req, "limit");
    if (limit) {
        char *end;
        errno = 0;
        long n = strtol(limit, &end, 10);
        if (!*limit || *end || errno || n < 1 || n > LIST_MAX)
            return API_ERROR(req, INVALID_QUERY, "limit=%s is not an integer in [1, %d]", limit,
                             LIST_MAX);
        op.limit = n;
    }
    if (store_read(req->ld->store, list_cb, &op) != STORE_OK)
        return API_ERROR(req, STORE_UNAVAILABLE, "could not read the audit log");
    return http_reply_json(req, 200, json_pack("{s:o}", "items", op.items));
}
