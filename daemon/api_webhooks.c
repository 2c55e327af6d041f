/* /v1/webhooks routes: create (URL policy, event types, secret generated
 * through common/token.h when absent and shown once), list, get, delete
 * (pending deliveries are cancelled) and the delivery log. Tenant tokens
 * only; another tenant's webhook, or a deleted one, is 404 WEBHOOK_NOT_FOUND. */
#include <stdlib.h>
#include <string.h>

#include "common/token.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/loomd.h"
#include "daemon/store.h"
#include "daemon/webhooks.h"

#define SECRET_MIN     16
#define SECRET_MAX     256
#define WEBHOOKS_MAX   100 /* per tenant */
#define DELIVERIES_MAX 1000

static int store_unavailable(struct http_req *req) {
    return API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
}

static json_t *webhook_row_json(sqlite3_stmt *st) {
    json_t *events = json_loads((const char *)sqlite3_column_text(st, 2), 0, NULL);
    return json_pack("{s:s, s:s, s:o, s:o}", "id", (const char *)sqlite3_column_text(st, 0), "url",
                     (const char *)sqlite3_column_text(st, 1), "events",
                     events ? events : json_array(), "created_at",
                     store_time_json(sqlite3_column_int64(st, 3)));
}

/* ---------------- create ---------------- */

struct create_op {
    const char *tenant, *url, *events, *secret;
    char id[32];
    int64_t now;
    int too_many;
};

static int create_cb(struct store_tx *tx, void *arg) {
    struct create_op *op = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT COUNT(*) FROM webhooks WHERE tenant_id = ? AND deleted_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->tenant, -1, SQLITE_STATIC);
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
    sqlite3_reset(st);
    if (n >= WEBHOOKS_MAX) {
        op->too_many = 1;
        return STORE_CONFLICT;
    }
    store_new_id("wh-", op->id, sizeof op->id);
    st = store_stmt(tx, "INSERT INTO webhooks(id, tenant_id, url, events, secret, created_at) "
                        "VALUES (?,?,?,?,?,?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, op->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, op->url, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, op->events, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, op->secret, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, op->now);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* The "events" field: a non-empty array of known types, or ["*"]. Returns a
 * new array (sorted, without duplicates) or NULL after replying. */
static json_t *parse_types(struct http_req *req, json_t *v) {
    if (!json_is_array(v) || json_array_size(v) == 0 ||
        json_array_size(v) > (size_t)events_types_count + 1) {
        API_ERROR_FIELD(req, INVALID_WEBHOOK_EVENTS, "events",
                        "events must be a non-empty array of event types or [\"*\"]");
        return NULL;
    }
    int want[64] = {0}, all = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *t = json_string_value(e);
        if (t && !strcmp(t, "*")) {
            all = 1;
            continue;
        }
        int k = -1;
        for (int j = 0; t && j < events_types_count; j++)
            if (!strcmp(t, events_types[j])) k = j;
        if (k < 0) {
            API_ERROR_FIELD(req, UNKNOWN_EVENT_TYPE, "events",
                            "events[%zu] '%.64s' is not an event type (job.queued, job.started, "
                            "job.retrying, job.preempted, job.succeeded, job.failed, "
                            "job.cancelled, checkpoint.saved, export.ready, artifacts.expired, "
                            "job.diagnosis, or \"*\")",
                            i, t ? t : "(not a string)");
            return NULL;
        }
        want[k] = 1;
    }
    json_t *out = json_array();
    if (all) {
        json_array_append_new(out, json_string("*"));
        return out;
    }
    for (int j = 0; j < events_types_count; j++)
        if (want[j]) json_array_append_new(out, json_string(events_types[j]));
    return out;
}

int api_webhooks_create(struct http_req *req) {
    json_t *types = NULL;
    char *types_text = NULL;
    int ret = 0;
    static const char *const known[] = {"url", "events", "secret"};
    const char *key;
    json_t *val;
    json_object_foreach(req->json, key, val) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof *known; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok)
            return API_ERROR_FIELD(req, UNKNOWN_FIELD, key,
                                   "unknown field '%.64s' (url, events, secret)", key);
    }
    const char *url = json_string_value(json_object_get(req->json, "url"));
    if (!url)
        return API_ERROR_FIELD(req, INVALID_WEBHOOK_URL, "url",
                               "url (an http or https URL string) is required");
    char code[64], msg[512];
    if (webhooks_check_url(url, req->ld->cfg.webhook_allow_private, 1, code, sizeof code, msg,
                           sizeof msg) != 0)
        return http_error_field(req, loom_errdef_find(code) ? loom_errdef_find(code)->status : 400,
                                code, "url", "%s", msg);
    types = parse_types(req, json_object_get(req->json, "events"));
    if (!types) return 0;
    json_t *sv = json_object_get(req->json, "secret");
    char secret[SECRET_MAX + 1];
    if (sv && !json_is_null(sv)) {
        const char *s = json_string_value(sv);
        size_t n = s ? strlen(s) : 0;
        if (!s || n < SECRET_MIN || n > SECRET_MAX) {
            ret = API_ERROR_FIELD(req, INVALID_WEBHOOK_SECRET, "secret",
                                  "secret must be a string of %d to %d characters (got %zu)",
                                  SECRET_MIN, SECRET_MAX, n);
            goto out;
        }
        snprintf(secret, sizeof secret, "%s", s);
    } else {
        char hex[65];
        if (token_hex(hex, sizeof hex, 32) != 0) {
            ret = API_ERROR(req, INTERNAL, "no random bytes for a secret; retry");
            goto out;
        }
        snprintf(secret, sizeof secret, "whsec_%s", hex);
    }
    types_text = json_dumps(types, JSON_COMPACT);
    struct create_op op = {req->tenant_id, url, types_text, secret, "", store_now_ms(), 0};
    int rc = store_write(req->ld->store, create_cb, &op);
    if (op.too_many) {
        ret = API_ERROR(req, TOO_MANY_WEBHOOKS, "tenant %s has %d webhooks already", req->tenant_id,
                        WEBHOOKS_MAX);
        goto out;
    }
    if (rc != STORE_OK) {
        ret = store_unavailable(req);
        goto out;
    }
    webhooks_kick(req->ld);
    char loc[80];
    snprintf(loc, sizeof loc, "/v1/webhooks/%s", op.id);
    http_add_header(req, "Location", loc);
    ret =
        http_reply_json(req, 201,
                        json_pack("{s:s, s:s, s:O, s:s, s:o}", "id", op.id, "url", url, "events",
                                  types, "secret", secret, "created_at", store_time_json(op.now)));
out:
    json_decref(types);
    free(types_text);
    return ret;
}

/* ---------------- list, get, delete ---------------- */

struct read_op {
    const char *tenant, *id;
    int limit;
    json_t *out;
};

static int list_cb(struct store_tx *tx, void *arg) {
    struct read_op *op = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT id, url, events, created_at FROM webhooks WHERE "
                       "tenant_id = ? AND deleted_at IS NULL ORDER BY created_at, id");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->tenant, -1, SQLITE_STATIC);
    op->out = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(op->out, webhook_row_json(st));
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

static int get_cb(struct store_tx *tx, void *arg) {
    struct read_op *op = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT id, url, events, created_at FROM webhooks WHERE id = ? AND "
                       "tenant_id = ? AND deleted_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, op->tenant, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) op->out = webhook_row_json(st);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

static int not_found(struct http_req *req, const char *id) {
    return API_ERROR(req, WEBHOOK_NOT_FOUND, "no webhook '%.64s'", id);
}

int api_webhooks_list(struct http_req *req) {
    struct read_op op = {req->tenant_id, NULL, 0, NULL};
    if (store_read(req->ld->store, list_cb, &op) != STORE_OK) {
        json_decref(op.out);
        return store_unavailable(req);
    }
    return http_reply_json(req, 200, json_pack("{s:o}", "items", op.out));
}

int api_webhooks_get(struct http_req *req) {
    const char *id = http_param(req, "id");
    struct read_op op = {req->tenant_id, id, 0, NULL};
    int rc = store_read(req->ld->store, get_cb, &op);
    if (rc == STORE_NOT_FOUND) return not_found(req, id);
    if (rc != STORE_OK) return store_unavailable(req);
    return http_reply_json(req, 200, op.out);
}

static int delete_cb(struct store_tx *tx, void *arg) {
    struct read_op *op = arg;
    sqlite3_stmt *st = store_stmt(tx, "UPDATE webhooks SET deleted_at = ? WHERE id = ? AND "
                                      "tenant_id = ? AND deleted_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, store_now_ms());
    sqlite3_bind_text(st, 2, op->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, op->tenant, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    if (sqlite3_changes(store_tx_db(tx)) == 0) return STORE_NOT_FOUND;
    st = store_stmt(tx, "UPDATE webhook_deliveries SET state = 'cancelled' WHERE webhook_id = ? "
                        "AND state = 'pending'");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int api_webhooks_delete(struct http_req *req) {
    const char *id = http_param(req, "id");
    struct read_op op = {req->tenant_id, id, 0, NULL};
    int rc = store_write(req->ld->store, delete_cb, &op);
    if (rc == STORE_NOT_FOUND) return not_found(req, id);
    if (rc != STORE_OK) return store_unavailable(req);
    return http_reply_json(req, 200, json_pack("{s:s, s:b}", "id", id, "deleted", 1));
}

/* ---------------- deliveries ---------------- */

static int deliveries_cb(struct store_tx *tx, void *arg) {
    struct read_op *op = arg;
    int rc = get_cb(tx, op);
    if (rc) return rc;
    json_decref(op->out);
    op->out = json_array();
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT d.id, d.event_seq, e.type, e.job_id, d.state, d.attempts, d.last_status, "
            "d.last_error, d.next_at, d.created_at, d.delivered_at FROM webhook_deliveries d JOIN "
            "events e ON e.seq = d.event_seq WHERE d.webhook_id = ? ORDER BY d.id DESC LIMIT ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, op->limit);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *state = (const char *)sqlite3_column_text(st, 4);
        const unsigned char *err = sqlite3_column_text(st, 7);
        json_array_append_new(
            op->out,
            json_pack(
                "{s:I, s:I, s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:o}", "id",
                (json_int_t)sqlite3_column_int64(st, 0), "event_seq",
                (json_int_t)sqlite3_column_int64(st, 1), "type",
                (const char *)sqlite3_column_text(st, 2), "job_id",
                (const char *)sqlite3_column_text(st, 3), "state", state, "attempts",
                sqlite3_column_int(st, 5), "last_status",
                sqlite3_column_type(st, 6) == SQLITE_NULL ? json_null()
                                                          : json_integer(sqlite3_column_int(st, 6)),
                "last_error", err ? json_string((const char *)err) : json_null(), "next_attempt_at",
                strcmp(state, "pending") ? json_null()
                                         : store_time_json(sqlite3_column_int64(st, 8)),
                "created_at", store_time_json(sqlite3_column_int64(st, 9)), "delivered_at",
                store_time_json(sqlite3_column_int64(st, 10))));
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int api_webhooks_deliveries(struct http_req *req) {
    const char *id = http_param(req, "id");
    int limit = 100;
    const char *l = http_query(req, "limit");
    if (l) {
        char *end;
        long v = strtol(l, &end, 10);
        if (!*l || *end || v < 1 || v > DELIVERIES_MAX)
            return API_ERROR(req, INVALID_QUERY, "limit '%.64s' is not 1..%d", l, DELIVERIES_MAX);
        limit = (int)v;
    }
    struct read_op op = {req->tenant_id, id, limit, NULL};
    int rc = store_read(req->ld->store, deliveries_cb, &op);
    if (rc == STORE_NOT_FOUND) {
        json_decref(op.out);
        return not_found(req, id);
    }
    if (rc != STORE_OK) {
        json_decref(op.out);
        return store_unavailable(req);
    }
    return http_reply_json(req, 200, json_pack("{s:o}", "items", op.out));
}
