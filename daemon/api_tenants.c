/* Admin routes: create and list tenants, issue and revoke their API tokens.
 * A token's text is returned once, at issue; only its SHA-256 is stored. */
#include <ctype.h>
#include <openssl/crypto.h>
#include <string.h>

#include "daemon/artifacts.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

struct tenant_op {
    long gpu_quota;
    struct store_tenant_qos qos; /* PATCH: fields to set (negative: keep) */
    int set_ttl;                 /* PATCH: artifact_ttl_s given (ttl -1: back to the default) */
    long ttl;
    const char *name;
    const char *roots;
    const char *tenant_id;
    const char *token_id;
    unsigned scopes;    /* tokens: AUTH_SCOPE_* bits */
    int64_t expires_at; /* tokens: ms, 0 never */
    unsigned char hash[32];
    char id[32];
    json_t *out;
};

static int create_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    int rc = store_tenant_create(tx, op->name, op->roots, op->gpu_quota, op->id, sizeof op->id);
    if (rc) return rc;
    return store_tenant_get(tx, op->id, &op->out);
}

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return 0;
    return 1;
}

int api_tenants_create(struct http_req *req) {
    const char *k;
    json_t *v;
    json_object_foreach(req->json, k, v) {
        if (strcmp(k, "name") && strcmp(k, "data_roots") && strcmp(k, "gpu_quota"))
            return API_ERROR_FIELD(req, UNKNOWN_FIELD, k, "unknown field '%s'", k);
    }
    json_t *name = json_object_get(req->json, "name");
    if (!json_is_string(name))
        return API_ERROR_FIELD(req, INVALID_FIELD, "name", "'name' must be a string");
    if (!valid_name(json_string_value(name)))
        return API_ERROR_FIELD(req, INVALID_NAME, "name",
                               "tenant name must be 1-63 characters of [A-Za-z0-9._-]");
    json_t *roots = json_object_get(req->json, "data_roots");
    char *roots_text = NULL;
    if (roots) {
        size_t i;
        json_t *r;
        if (!json_is_array(roots))
            return API_ERROR_FIELD(req, INVALID_FIELD, "data_roots",
                                   "'data_roots' must be an array of absolute paths");
        json_array_foreach(roots, i, r) {
            if (!json_is_string(r) || json_string_value(r)[0] != '/' ||
                strlen(json_string_value(r)) >= 1024)
                return API_ERROR_FIELD(req, INVALID_FIELD, "data_roots",
                                       "data_roots[%zu] must be an absolute path", i);
        }
        roots_text = json_dumps(roots, JSON_COMPACT);
    }
    json_t *quota = json_object_get(req->json, "gpu_quota");
    if (quota && (!json_is_integer(quota) || json_integer_value(quota) < 0 ||
                  json_integer_value(quota) > 1000000)) {
        free(roots_text);
        return API_ERROR_FIELD(req, INVALID_FIELD, "gpu_quota",
                               "'gpu_quota' must be an integer in [0, 1000000] (0 = unlimited)");
    }
    struct tenant_op op = {.name = json_string_value(name),
                           .roots = roots_text,
                           .gpu_quota = quota ? (long)json_integer_value(quota) : 0};
    int rc = store_write(req->ld->store, create_cb, &op);
    free(roots_text);
    if (rc == STORE_CONFLICT)
        return API_ERROR_FIELD(req, TENANT_EXISTS, "name", "a tenant named '%s' exists", op.name);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not store tenant");
    return http_reply_json(req, 201, op.out);
}

static int list_cb(struct store_tx *tx, void *arg) {
    json_t **arr = arg;
    int rc = store_tenant_list(tx, arr);
    if (rc) return rc;
    size_t i;
    json_t *t;
    json_array_foreach(*arr, i, t) { /* QoS fields, as GET /v1/tenants/{id} shows them */
        rc = store_tenant_qos_json(tx, json_string_value(json_object_get(t, "id")), t);
        if (!rc) rc = artifacts_tenant_ttl_json(tx, json_string_value(json_object_get(t, "id")), t);
        if (rc) {
            json_decref(*arr);
            *arr = NULL;
            return rc;
        }
    }
    return STORE_OK;
}

int api_tenants_list(struct http_req *req) {
    json_t *arr = NULL;
    if (store_read(req->ld->store, list_cb, &arr) != STORE_OK)
        return API_ERROR(req, STORE_UNAVAILABLE, "could not read tenants");
    return http_reply_json(req, 200, json_pack("{s:o}", "items", arr));
}

static int get_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    int rc = store_tenant_get(tx, op->tenant_id, &op->out);
    if (rc) return rc;
    rc = store_tenant_qos_json(tx, op->tenant_id, op->out);
    if (rc) return rc;
    return artifacts_tenant_ttl_json(tx, op->tenant_id, op->out);
}

int api_tenants_get(struct http_req *req) {
    struct tenant_op op = {.tenant_id = http_param(req, "id")};
    int rc = store_read(req->ld->store, get_cb, &op);
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TENANT_NOT_FOUND, "no tenant '%s'", op.tenant_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not read tenant");
    return http_reply_json(req, 200, op.out);
}

/* Validates {"gpu_quota"?, "data_roots"?}; on error replies and returns -1.
 * *roots_text (caller frees) is NULL when data_roots is absent. */
static int parse_quota_roots(struct http_req *req, long *quota, char **roots_text) {
    *quota = -1;
    *roots_text = NULL;
    json_t *q = json_object_get(req->json, "gpu_quota");
    if (q) {
        if (!json_is_integer(q) || json_integer_value(q) < 0 || json_integer_value(q) > 1000000) {
            API_ERROR_FIELD(req, INVALID_FIELD, "gpu_quota",
                            "'gpu_quota' must be an integer in [0, 1000000] (0 = unlimited)");
            return -1;
        }
        *quota = (long)json_integer_value(q);
    }
    json_t *roots = json_object_get(req->json, "data_roots");
    if (roots) {
        size_t i;
        json_t *r;
        if (!json_is_array(roots)) {
            API_ERROR_FIELD(req, INVALID_FIELD, "data_roots",
                            "'data_roots' must be an array of absolute paths");
            return -1;
        }
        json_array_foreach(roots, i, r) {
            if (!json_is_string(r) || json_string_value(r)[0] != '/' ||
                strlen(json_string_value(r)) >= 1024) {
                API_ERROR_FIELD(req, INVALID_FIELD, "data_roots",
                                "data_roots[%zu] must be an absolute path", i);
                return -1;
            }
        }
        *roots_text = json_dumps(roots, JSON_COMPACT);
    }
    return 0;
}

/* ---- QoS: max_priority, max_running_jobs, gpu_hours_per_month, budget_warn_only ---- */

static int is_qos_field(const char *k) {
    return !strcmp(k, "max_priority") || !strcmp(k, "max_running_jobs") ||
           !strcmp(k, "gpu_hours_per_month") || !strcmp(k, "budget_warn_only");
}

/* Validates the QoS fields of a PATCH body into *q (absent: -2 / -1 = keep);
 * on error replies and returns -1. */
static int parse_qos(struct http_req *req, struct store_tenant_qos *q) {
    q->max_priority = -2;
    q->max_running_jobs = -1;
    q->gpu_hours_per_month = -1;
    q->budget_warn_only = -1;
    json_t *v = json_object_get(req->json, "max_priority");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > 100) {
            API_ERROR_FIELD(req, INVALID_FIELD, "max_priority",
                            "'max_priority' must be an integer in [0, 100] (-1 = no limit)");
            return -1;
        }
        q->max_priority = (long)json_integer_value(v);
    }
    v = json_object_get(req->json, "max_running_jobs");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000) {
            API_ERROR_FIELD(req, INVALID_FIELD, "max_running_jobs",
                            "'max_running_jobs' must be an integer in [0, 1000000] (0 = no limit)");
            return -1;
        }
        q->max_running_jobs = (long)json_integer_value(v);
    }
    v = json_object_get(req->json, "gpu_hours_per_month");
    if (v) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1e9) {
            API_ERROR_FIELD(req, INVALID_FIELD, "gpu_hours_per_month",
                            "'gpu_hours_per_month' must be a number in [0, 1e9] (0 = no limit)");
            return -1;
        }
        q->gpu_hours_per_month = json_number_value(v);
    }
    v = json_object_get(req->json, "budget_warn_only");
    if (v) {
        if (!json_is_boolean(v)) {
            API_ERROR_FIELD(req, INVALID_FIELD, "budget_warn_only",
                            "'budget_warn_only' must be true or false");
            return -1;
        }
        q->budget_warn_only = json_is_true(v);
    }
    return 0;
}

static int update_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    int rc = store_tenant_update(tx, op->tenant_id, op->gpu_quota, op->roots);
    if (rc) return rc;
    rc = store_tenant_qos_update(tx, op->tenant_id, &op->qos);
    if (rc) return rc;
    if (op->set_ttl && (rc = artifacts_tenant_ttl_set(tx, op->tenant_id, op->ttl)) != 0) return rc;
    return get_cb(tx, arg);
}

int api_tenants_update(struct http_req *req) {
    const char *k;
    json_t *v;
    json_object_foreach(req->json, k, v) {
        if (strcmp(k, "data_roots") && strcmp(k, "gpu_quota") && !is_qos_field(k) &&
            strcmp(k, "artifact_ttl_s"))
            return API_ERROR_FIELD(req, UNKNOWN_FIELD, k,
                                   "unknown field '%s' (gpu_quota, data_roots, max_priority, "
                                   "max_running_jobs, gpu_hours_per_month, budget_warn_only and "
                                   "artifact_ttl_s can change)",
                                   k);
    }
    struct tenant_op op = {.tenant_id = http_param(req, "id")};
    /* Artifact retention (daemon/artifacts.h): seconds, 0 = kept, null = the
     * cluster's --artifact-ttl. */
    json_t *ttl = json_object_get(req->json, "artifact_ttl_s");
    if (ttl) {
        if (!json_is_null(ttl) && (!json_is_integer(ttl) || json_integer_value(ttl) < 0 ||
                                   json_integer_value(ttl) > 315360000))
            return API_ERROR_FIELD(req, INVALID_FIELD, "artifact_ttl_s",
                                   "'artifact_ttl_s' must be an integer in [0, 315360000] seconds "
                                   "(0: kept) or null (the cluster's --artifact-ttl)");
        op.set_ttl = 1;
        op.ttl = json_is_null(ttl) ? -1 : (long)json_integer_value(ttl);
    }
    char *roots = NULL;
    if (parse_qos(req, &op.qos) != 0) return 0;
    if (parse_quota_roots(req, &op.gpu_quota, &roots) != 0) return 0;
    op.roots = roots;
    int rc = store_write(req->ld->store, update_cb, &op);
    free(roots);
    if (rc == STORE_OK) auth_forget(req->ld->auth); /* cached data_roots */
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TENANT_NOT_FOUND, "no tenant '%s'", op.tenant_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not update");
    return http_reply_json(req, 200, op.out);
}

#define MAX_EXPIRES_IN_S  (10L * 365 * 86400) /* ten years */
#define ADMIN_ONLY_TENANT 1                   /* token_cb: admin scope on another tenant */

static int token_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    json_t *t = NULL;
    int rc = store_tenant_get(tx, op->tenant_id, &t);
    if (rc == STORE_OK && (op->scopes & (AUTH_SCOPE_ADMIN | AUTH_SCOPE_METRICS)) &&
        strcmp(json_string_value(json_object_get(t, "name")), AUTH_ADMIN_TENANT) != 0)
        rc = ADMIN_ONLY_TENANT;
    json_decref(t);
    if (rc) return rc;
    return store_token_issue(tx, op->tenant_id, op->hash, op->name, op->scopes, op->expires_at,
                             op->id, sizeof op->id);
}

/* Validates {"name"?, "scopes"?, "expires_in_s"?} into op; on error replies
 * and returns -1. */
static int parse_token_fields(struct http_req *req, struct tenant_op *op, long *expires_in) {
    const char *k;
    json_t *v;
    json_object_foreach(req->json, k, v) {
        if (strcmp(k, "name") && strcmp(k, "scopes") && strcmp(k, "expires_in_s")) {
            API_ERROR_FIELD(req, UNKNOWN_FIELD, k,
                            "unknown field '%s' (name, scopes and expires_in_s are allowed)", k);
            return -1;
        }
    }
    op->name = "";
    op->scopes = AUTH_SCOPES_DEFAULT;
    *expires_in = 0;
    json_t *name = json_object_get(req->json, "name");
    if (name) {
        if (!json_is_string(name) || !valid_name(json_string_value(name))) {
            API_ERROR_FIELD(req, INVALID_NAME, "name",
                            "token name must be 1-63 characters of [A-Za-z0-9._-]");
            return -1;
        }
        op->name = json_string_value(name);
    }
    json_t *scopes = json_object_get(req->json, "scopes");
    if (scopes) {
        size_t i;
        json_t *sc;
        if (!json_is_array(scopes) || json_array_size(scopes) == 0) {
            API_ERROR_FIELD(req, INVALID_FIELD, "scopes",
                            "'scopes' must be a non-empty array of read, submit, admin");
            return -1;
        }
        op->scopes = 0;
        json_array_foreach(scopes, i, sc) {
            unsigned bit = json_is_string(sc) ? auth_scope_parse(json_string_value(sc)) : 0;
            if (!bit) {
                API_ERROR_FIELD(req, INVALID_FIELD, "scopes",
                                "scopes[%zu] is not one of read, submit, admin", i);
                return -1;
            }
            op->scopes |= bit;
        }
    }
    json_t *exp = json_object_get(req->json, "expires_in_s");
    if (exp) {
        if (!json_is_integer(exp) || json_integer_value(exp) < 1 ||
            json_integer_value(exp) > MAX_EXPIRES_IN_S) {
            API_ERROR_FIELD(req, INVALID_FIELD, "expires_in_s",
                            "'expires_in_s' must be an integer in [1, %ld] (absent: no expiry)",
                            MAX_EXPIRES_IN_S);
            return -1;
        }
        *expires_in = (long)json_integer_value(exp);
    }
    return 0;
}

int api_tenants_token_create(struct http_req *req) {
    struct tenant_op op = {.tenant_id = http_param(req, "id")};
    long expires_in = 0;
    if (parse_token_fields(req, &op, &expires_in) != 0) return 0;
    char token[80];
    if (auth_new_token(token, sizeof token) != 0)
        return API_ERROR(req, INTERNAL, "no randomness available");
    op.expires_at = expires_in ? store_now_ms() + (int64_t)expires_in * 1000 : 0;
    auth_hash(token, op.hash);
    int rc = store_write(req->ld->store, token_cb, &op);
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TENANT_NOT_FOUND, "no tenant '%s'", op.tenant_id);
    if (rc == ADMIN_ONLY_TENANT)
        return API_ERROR_FIELD(req, INVALID_FIELD, "scopes",
                               "the 'admin' and 'metrics' scopes are only for tokens of the "
                               "tenant named '%s', "
                               "not '%s'",
                               AUTH_ADMIN_TENANT, op.tenant_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not store token");
    return http_reply_json(req, 201,
                           json_pack("{s:s, s:s, s:s, s:s, s:o, s:o}", "id", op.id, "tenant_id",
                                     op.tenant_id, "token", token, "name", op.name, "scopes",
                                     auth_scopes_json(op.scopes), "expires_at",
                                     store_time_json(op.expires_at)));
}

static int token_list_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    json_t *t = NULL;
    int rc = store_tenant_get(tx, op->tenant_id, &t);
    json_decref(t);
    if (rc) return rc;
    return store_token_list(tx, op->tenant_id, &op->out);
}

int api_tenants_token_list(struct http_req *req) {
    struct tenant_op op = {.tenant_id = http_param(req, "id")};
    int rc = store_read(req->ld->store, token_list_cb, &op);
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TENANT_NOT_FOUND, "no tenant '%s'", op.tenant_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not read tokens");
    size_t i;
    json_t *t;
    json_array_foreach(op.out, i, t) {
        unsigned bits = (unsigned)json_integer_value(json_object_get(t, "scopes"));
        json_object_set_new(t, "scopes", auth_scopes_json(bits));
    }
    return http_reply_json(req, 200, json_pack("{s:o}", "items", op.out));
}

static int revoke_cb(struct store_tx *tx, void *arg) {
    struct tenant_op *op = arg;
    return store_token_revoke(tx, op->tenant_id, op->token_id);
}

int api_tenants_token_revoke(struct http_req *req) {
    struct tenant_op op = {.tenant_id = http_param(req, "id"), .token_id = http_param(req, "tid")};
    int rc = store_write(req->ld->store, revoke_cb, &op);
    if (rc == STORE_OK) auth_forget(req->ld->auth);
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TOKEN_NOT_FOUND, "tenant '%s' has no token '%s'", op.tenant_id,
                         op.token_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not revoke");
    return http_reply_json(
        req, 200,
        json_pack("{s:s, s:s, s:b}", "id", op.token_id, "tenant_id", op.tenant_id, "revoked", 1));
}

#define MAX_GRACE_S (7L * 86400) /* rotation: the old token lives at most a week on */

struct rotate_op {
    const char *tenant_id, *token_id;
    unsigned char hash[32];
    int64_t grace_ms, expires_at, old_expires_at;
    unsigned scopes;
    char id[32], name[64];
};

static int rotate_cb(struct store_tx *tx, void *arg) {
    struct rotate_op *r = arg;
    return store_token_rotate(tx, r->tenant_id, r->token_id, r->hash, r->grace_ms, r->id,
                              sizeof r->id, &r->scopes, &r->expires_at, &r->old_expires_at, r->name,
                              sizeof r->name);
}

/* POST /v1/tenants/{id}/tokens/{tid}/rotate {"grace_s"?: 0..604800}: a new
 * secret with the same name, scopes and expiry; the old one is revoked at
 * once (grace_s 0, the default) or stays valid grace_s more seconds. */
int api_tenants_token_rotate(struct http_req *req) {
    struct rotate_op r = {.tenant_id = http_param(req, "id"), .token_id = http_param(req, "tid")};
    const char *k;
    json_t *v;
    json_object_foreach(req->json, k, v) {
        if (strcmp(k, "grace_s"))
            return API_ERROR_FIELD(req, UNKNOWN_FIELD, k, "unknown field '%s' (grace_s is allowed)",
                                   k);
    }
    json_t *g = json_object_get(req->json, "grace_s");
    if (g &&
        (!json_is_integer(g) || json_integer_value(g) < 0 || json_integer_value(g) > MAX_GRACE_S))
        return API_ERROR_FIELD(req, INVALID_GRACE, "grace_s",
                               "'grace_s' must be an integer in [0, %ld] (0: the old token is "
                               "revoked at once)",
                               MAX_GRACE_S);
    r.grace_ms = g ? (int64_t)json_integer_value(g) * 1000 : 0;
    char token[80];
    if (auth_new_token(token, sizeof token) != 0)
        return API_ERROR(req, INTERNAL, "no randomness available");
    auth_hash(token, r.hash);
    int rc = store_write(req->ld->store, rotate_cb, &r);
    if (rc == STORE_OK) auth_forget(req->ld->auth); /* the old token's cached expiry */
    if (rc == STORE_NOT_FOUND)
        return API_ERROR(req, TOKEN_NOT_FOUND,
                         "tenant '%s' has no live token '%s' (revoked, expired or unknown)",
                         r.tenant_id, r.token_id);
    if (rc != STORE_OK) return API_ERROR(req, STORE_UNAVAILABLE, "could not rotate the token");
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:{s:s, s:o, s:b}}", "id", r.id, "tenant_id",
                  r.tenant_id, "token", token, "name", r.name, "scopes", auth_scopes_json(r.scopes),
                  "expires_at", store_time_json(r.expires_at), "rotated_from", "id", r.token_id,
                  "expires_at", store_time_json(r.old_expires_at), "revoked", r.grace_ms == 0);
    OPENSSL_cleanse(token, sizeof token);
    return http_reply_json(req, 201, out);
}
