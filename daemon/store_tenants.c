/* Tenants and their API tokens in the store. Tokens are kept only as SHA-256
 * hashes; the text is shown once when issued (daemon/auth.c makes it). */
#include <string.h>

#include "common/log.h"
#include "common/token.h"
#include "daemon/store.h"

static const char *col_text(sqlite3_stmt *st, int i) {
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? (const char *)t : "";
}

int store_tenant_create(struct store_tx *tx, const char *name, const char *data_roots,
                        long gpu_quota, char *id, size_t idlen) {
    sqlite3_stmt *st = store_stmt(
        tx, "INSERT INTO tenants(id, name, data_roots, created_at, gpu_quota) VALUES (?,?,?,?,?)");
    if (!st) return STORE_ERR;
    if (store_new_id("t-", id, idlen) != STORE_OK) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, data_roots ? data_roots : "[]", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, store_now_ms());
    sqlite3_bind_int64(st, 5, gpu_quota);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_UNIQUE) return STORE_CONFLICT;
    if (rc != SQLITE_DONE) {
        log_error("store: tenant insert: %s", sqlite3_errmsg(store_tx_db(tx)));
        return STORE_ERR;
    }
    return STORE_OK;
}

int store_tenant_update(struct store_tx *tx, const char *id, long gpu_quota,
                        const char *data_roots) {
    sqlite3_stmt *st = store_stmt(
        tx, "UPDATE tenants SET gpu_quota = CASE WHEN ?2 >= 0 THEN ?2 ELSE gpu_quota END, "
            "data_roots = COALESCE(?3, data_roots) WHERE id = ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, gpu_quota);
    if (data_roots)
        sqlite3_bind_text(st, 3, data_roots, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 3);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    return sqlite3_changes(store_tx_db(tx)) ? STORE_OK : STORE_NOT_FOUND;
}

static json_t *tenant_row(sqlite3_stmt *st) {
    json_t *roots = json_loads(col_text(st, 2), 0, NULL);
    return json_pack("{s:s, s:s, s:o, s:I, s:o}", "id", col_text(st, 0), "name", col_text(st, 1),
                     "data_roots", roots ? roots : json_array(), "gpu_quota",
                     (json_int_t)sqlite3_column_int64(st, 3), "created_at",
                     store_time_json(sqlite3_column_int64(st, 4)));
}

int store_tenant_get(struct store_tx *tx, const char *id, json_t **out) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, name, data_roots, gpu_quota, created_at FROM tenants WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *out = tenant_row(st);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

int store_tenant_list(struct store_tx *tx, json_t **out) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, name, data_roots, gpu_quota, created_at FROM tenants ORDER BY created_at");
    if (!st) return STORE_ERR;
    json_t *arr = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(arr, tenant_row(st));
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        json_decref(arr);
        return STORE_ERR;
    }
    *out = arr;
    return STORE_OK;
}

int store_token_insert(struct store_tx *tx, const char *tenant_id, const unsigned char hash[32],
                       char *id, size_t idlen) {
    sqlite3_stmt *st =
        store_stmt(tx, "INSERT INTO tokens(id, tenant_id, hash, created_at) VALUES (?,?,?,?)");
    if (!st) return STORE_ERR;
    if (store_new_id("k-", id, idlen) != STORE_OK) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, hash, 32, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, store_now_ms());
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) return STORE_NOT_FOUND;
    if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) return STORE_CONFLICT;
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int store_token_revoke(struct store_tx *tx, const char *tenant_id, const char *token_id) {
    sqlite3_stmt *st = store_stmt(tx, "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) "
                                      "WHERE id = ? AND tenant_id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, store_now_ms());
    sqlite3_bind_text(st, 2, token_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, tenant_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    return sqlite3_changes(store_tx_db(tx)) ? STORE_OK : STORE_NOT_FOUND;
}

int store_token_lookup(struct store_tx *tx, const unsigned char hash[32], char *tenant_id,
                       size_t len) {
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT tenant_id, hash FROM tokens WHERE hash = ? AND revoked_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    int rc = sqlite3_step(st), out = STORE_NOT_FOUND;
    if (rc == SQLITE_ROW) {
        const void *h = sqlite3_column_blob(st, 1);
        /* The index lookup already matched; the constant-time compare keeps the
         * final decision free of early-exit timing on the stored value. */
        if (h && sqlite3_column_bytes(st, 1) == 32 && token_equal_mem(h, hash, 32)) {
            snprintf(tenant_id, len, "%s", col_text(st, 0));
            out = STORE_OK;
        }
    } else if (rc != SQLITE_DONE) {
        out = STORE_ERR;
    }
    sqlite3_reset(st);
    return out;
}

/* ---------------- QoS (schema 090) ---------------- */

int store_tenant_qos_update(struct store_tx *tx, const char *id, const struct store_tenant_qos *q) {
    sqlite3_stmt *st = store_stmt(
        tx, "UPDATE tenants SET "
            "max_priority = CASE WHEN ?2 >= -1 THEN ?2 ELSE max_priority END, "
            "max_running_jobs = CASE WHEN ?3 >= 0 THEN ?3 ELSE max_running_jobs END, "
            "gpu_hours_per_month = CASE WHEN ?4 >= 0 THEN ?4 ELSE gpu_hours_per_month END, "
            "budget_warn_only = CASE WHEN ?5 >= 0 THEN ?5 ELSE budget_warn_only END "
            "WHERE id = ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, q->max_priority);
    sqlite3_bind_int64(st, 3, q->max_running_jobs);
    sqlite3_bind_double(st, 4, q->gpu_hours_per_month);
    sqlite3_bind_int(st, 5, q->budget_warn_only);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    return sqlite3_changes(store_tx_db(tx)) ? STORE_OK : STORE_NOT_FOUND;
}

int store_tenant_qos_get(struct store_tx *tx, const char *id, struct store_tenant_qos *q) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT max_priority, max_running_jobs, gpu_hours_per_month, budget_warn_only "
            "FROM tenants WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        q->max_priority = (long)sqlite3_column_int64(st, 0);
        q->max_running_jobs = (long)sqlite3_column_int64(st, 1);
        q->gpu_hours_per_month = sqlite3_column_double(st, 2);
        q->budget_warn_only = sqlite3_column_int(st, 3);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

int store_tenant_qos_json(struct store_tx *tx, const char *id, json_t *obj) {
    struct store_tenant_qos q;
    int rc = store_tenant_qos_get(tx, id, &q);
    if (rc) return rc;
    json_object_set_new(obj, "max_priority", json_integer(q.max_priority));
    json_object_set_new(obj, "max_running_jobs", json_integer(q.max_running_jobs));
    json_object_set_new(obj, "gpu_hours_per_month", json_real(q.gpu_hours_per_month));
    json_object_set_new(obj, "budget_warn_only", json_boolean(q.budget_warn_only));
    return STORE_OK;
}

int store_tenant_gpu_hours(struct store_tx *tx, const char *id, int64_t since_ms, double *hours) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT COALESCE(SUM(gpu_seconds), 0) FROM usage WHERE tenant_id = ? AND start_ms >= ? "
            "AND billed = 1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, since_ms);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *hours = sqlite3_column_double(st, 0) / 3600.0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : STORE_ERR;
}
int store_token_issue(struct store_tx *tx, const char *tenant_id, const unsigned char hash[32],
                      const char *name, unsigned scopes, int64_t expires_at, char *id,
                      size_t idlen) {
    sqlite3_stmt *st = store_stmt(tx, "INSERT INTO tokens(id, tenant_id, hash, created_at, name, "
                                      "scopes, expires_at) VALUES (?,?,?,?,?,?,?)");
    if (!st) return STORE_ERR;
    if (store_new_id("k-", id, idlen) != STORE_OK) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, hash, 32, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, store_now_ms());
    sqlite3_bind_text(st, 5, name ? name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)scopes);
    if (expires_at > 0)
        sqlite3_bind_int64(st, 7, expires_at);
    else
        sqlite3_bind_null(st, 7);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) return STORE_NOT_FOUND;
    if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) return STORE_CONFLICT;
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int store_token_rotate(struct store_tx *tx, const char *tenant_id, const char *token_id,
                       const unsigned char hash[32], int64_t grace_ms, char *new_id, size_t idlen,
                       unsigned *out_scopes, int64_t *out_expires_at, int64_t *old_expires_at,
                       char *name, size_t namelen) {
    int64_t now = store_now_ms();
    sqlite3_stmt *st = store_stmt(tx, "SELECT name, scopes, COALESCE(expires_at, 0) FROM tokens "
                                      "WHERE id = ? AND tenant_id = ? AND revoked_at IS NULL AND "
                                      "(expires_at IS NULL OR expires_at > ?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, token_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(name, namelen, "%s", col_text(st, 0));
        *out_scopes = (unsigned)sqlite3_column_int64(st, 1);
        *out_expires_at = sqlite3_column_int64(st, 2);
    }
    sqlite3_reset(st);
    if (rc == SQLITE_DONE) return STORE_NOT_FOUND;
    if (rc != SQLITE_ROW) return STORE_ERR;
    rc = store_token_issue(tx, tenant_id, hash, name, *out_scopes, *out_expires_at, new_id, idlen);
    if (rc != STORE_OK) return rc;
    if (grace_ms <= 0) {
        *old_expires_at = now;
        return store_token_revoke(tx, tenant_id, token_id);
    }
    int64_t until = now + grace_ms;
    if (*out_expires_at > 0 && *out_expires_at < until) until = *out_expires_at;
    *old_expires_at = until;
    st = store_stmt(tx, "UPDATE tokens SET expires_at = ? WHERE id = ? AND tenant_id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, until);
    sqlite3_bind_text(st, 2, token_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, tenant_id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int store_token_find(struct store_tx *tx, const unsigned char hash[32], struct store_token *out) {
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT tenant_id, hash, id, scopes, COALESCE(expires_at, 0) FROM tokens "
                       "WHERE hash = ? AND revoked_at IS NULL");
    if (!st) return STORE_ERR;
    sqlite3_bind_blob(st, 1, hash, 32, SQLITE_STATIC);
    int rc = sqlite3_step(st), res = STORE_NOT_FOUND;
    if (rc == SQLITE_ROW) {
        const void *h = sqlite3_column_blob(st, 1);
        if (h && sqlite3_column_bytes(st, 1) == 32 && token_equal_mem(h, hash, 32)) {
            snprintf(out->tenant_id, sizeof out->tenant_id, "%s", col_text(st, 0));
            snprintf(out->id, sizeof out->id, "%s", col_text(st, 2));
            out->scopes = (unsigned)sqlite3_column_int64(st, 3);
            out->expires_at = sqlite3_column_int64(st, 4);
            res = STORE_OK;
        }
    } else if (rc != SQLITE_DONE) {
        res = STORE_ERR;
    }
    sqlite3_reset(st);
    return res;
}

int store_token_touch(struct store_tx *tx, const char *id, int64_t now_ms) {
    sqlite3_stmt *st = store_stmt(tx, "UPDATE tokens SET last_used_at = ? WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, now_ms);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int store_token_list(struct store_tx *tx, const char *tenant_id, json_t **out) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, name, scopes, created_at, COALESCE(last_used_at, 0), "
            "COALESCE(expires_at, 0), COALESCE(revoked_at, 0) FROM tokens WHERE tenant_id = ? "
            "ORDER BY created_at, id");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, tenant_id, -1, SQLITE_STATIC);
    json_t *arr = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:I, s:o, s:o, s:o, s:o}", "id", col_text(st, 0), "name",
                           col_text(st, 1), "scopes", (json_int_t)sqlite3_column_int64(st, 2),
                           "created_at", store_time_json(sqlite3_column_int64(st, 3)),
                           "last_used_at", store_time_json(sqlite3_column_int64(st, 4)),
                           "expires_at", store_time_json(sqlite3_column_int64(st, 5)), "revoked_at",
                           store_time_json(sqlite3_column_int64(st, 6))));
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        json_decref(arr);
        return STORE_ERR;
    }
    *out = arr;
    return STORE_OK;
}
