/* Price API handlers (see api_prices.h). A PUT is validated whole before
 * anything is written, then replaces the table in one transaction: a bad item
 * changes nothing. */
#include "daemon/api_prices.h"

#include "api/gpu_types.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRICES_MAX 64
#define PRICE_MAX  1e6 /* per GPU-hour or month, any currency */

struct price {
    char gpu_type[GPU_TYPE_NAME_MAX];
    double per_hour, per_month; /* per_month < 0: none */
    char currency[4];
};

struct price_set {
    struct price v[PRICES_MAX];
    int n;
    int64_t now;
};

static int currency_ok(const char *s) {
    if (!s || strlen(s) != 3) return 0;
    for (int i = 0; i < 3; i++)
        if (!isupper((unsigned char)s[i])) return 0;
    return 1;
}

/* Parses and checks one item; on error fills field/message and returns -1. */
static int parse_item(const json_t *it, size_t i, struct price *p, char *field, size_t flen,
                      char *msg, size_t mlen) {
    static const char *const keys[] = {"gpu_type", "per_gpu_hour", "per_gpu_month", "currency"};
    const char *key;
    json_t *v;
    if (!json_is_object(it)) {
        snprintf(field, flen, "items[%zu]", i);
        snprintf(msg, mlen, "items[%zu] must be an object", i);
        return -1;
    }
    json_object_foreach((json_t *)it, key, v) {
        int known = 0;
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            known |= strcmp(key, keys[k]) == 0;
        if (!known) {
            snprintf(field, flen, "items[%zu].%.40s", i, key);
            snprintf(msg, mlen,
                     "unknown field items[%zu].%.40s (known: gpu_type, per_gpu_hour, "
                     "per_gpu_month, currency)",
                     i, key);
            return -1;
        }
    }
    const char *type = json_string_value(json_object_get(it, "gpu_type"));
    const struct gpu_type *t = gpu_type_find(type);
    if (!t) {
        char names[256];
        gpu_type_names(names, sizeof names);
        snprintf(field, flen, "items[%zu].gpu_type", i);
        snprintf(msg, mlen, "items[%zu].gpu_type \"%.40s\" is not a GPU type (known: %s cpu)", i,
                 type ? type : "", names);
        return -1;
    }
    snprintf(p->gpu_type, sizeof p->gpu_type, "%s", t->name);
    json_t *h = json_object_get(it, "per_gpu_hour"), *m = json_object_get(it, "per_gpu_month");
    if (!json_is_number(h) || json_number_value(h) < 0 || json_number_value(h) > PRICE_MAX) {
        snprintf(field, flen, "items[%zu].per_gpu_hour", i);
        snprintf(msg, mlen, "items[%zu].per_gpu_hour must be a number in [0, %g] (%s)", i,
                 PRICE_MAX, t->name);
        return -1;
    }
    p->per_hour = json_number_value(h);
    p->per_month = -1;
    if (m && !json_is_null(m)) {
        if (!json_is_number(m) || json_number_value(m) < 0 || json_number_value(m) > PRICE_MAX) {
            snprintf(field, flen, "items[%zu].per_gpu_month", i);
            snprintf(msg, mlen, "items[%zu].per_gpu_month must be a number in [0, %g] (%s)", i,
                     PRICE_MAX, t->name);
            return -1;
        }
        p->per_month = json_number_value(m);
    }
    const char *cur = json_string_value(json_object_get(it, "currency"));
    if (!currency_ok(cur)) {
        snprintf(field, flen, "items[%zu].currency", i);
        snprintf(msg, mlen, "items[%zu].currency \"%.16s\" must be an ISO 4217 code such as USD", i,
                 cur ? cur : "");
        return -1;
    }
    snprintf(p->currency, sizeof p->currency, "%s", cur);
    return 0;
}

static int replace_cb(struct store_tx *tx, void *arg) {
    struct price_set *ps = arg;
    sqlite3_stmt *st = store_stmt(tx, "DELETE FROM gpu_prices");
    if (!st) return STORE_ERR;
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    for (int i = 0; i < ps->n && rc == STORE_OK; i++) {
        st = store_stmt(tx, "INSERT INTO gpu_prices (gpu_type, per_gpu_hour, per_gpu_month, "
                            "currency, updated_at, updated_by) VALUES (?, ?, ?, ?, ?, 'admin')");
        if (!st) return STORE_ERR;
        sqlite3_bind_text(st, 1, ps->v[i].gpu_type, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 2, ps->v[i].per_hour);
        if (ps->v[i].per_month >= 0)
            sqlite3_bind_double(st, 3, ps->v[i].per_month);
        else
            sqlite3_bind_null(st, 3);
        sqlite3_bind_text(st, 4, ps->v[i].currency, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, ps->now);
        rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    }
    return rc;
}

static int load_cb(struct store_tx *tx, void *arg) {
    json_t *out = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT gpu_type, per_gpu_hour, per_gpu_month, currency "
                                      "FROM gpu_prices ORDER BY gpu_type");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *o = json_pack("{s:f, s:s}", "per_gpu_hour", sqlite3_column_double(st, 1),
                              "currency", (const char *)sqlite3_column_text(st, 3));
        json_object_set_new(o, "per_gpu_month",
                            sqlite3_column_type(st, 2) == SQLITE_NULL
                                ? json_null()
                                : json_real(sqlite3_column_double(st, 2)));
        json_object_set_new(out, (const char *)sqlite3_column_text(st, 0), o);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

json_t *prices_load(struct loomd *ld) {
    json_t *m = json_object();
    if (!m) return NULL;
    if (store_read(ld->store, load_cb, m) != STORE_OK) {
        json_decref(m);
        return NULL;
    }
    return m;
}

static json_t *items_json(const json_t *map) {
    json_t *items = json_array();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)map, k, v) {
        json_t *o = json_deep_copy(v);
        json_object_set_new(o, "gpu_type", json_string(k));
        json_array_append_new(items, o);
    }
    return items;
}

static int reply_list(struct http_req *req) {
    json_t *m = prices_load(req->ld);
    if (!m) return http_error(req, 503, "STORE_UNAVAILABLE", "could not read the prices");
    json_t *out = json_pack("{s:o, s:f}", "items", items_json(m), "default_per_gpu_hour",
                            req->ld->cfg.price_gpu_hour);
    json_decref(m);
    return http_reply_json(req, 200, out);
}

int api_prices_get(struct http_req *req) {
    return reply_list(req);
}

int api_prices_put(struct http_req *req) {
    struct price_set *ps = calloc(1, sizeof *ps);
    char field[96] = "items", msg[400] = "";
    int rc = -1;
    if (!ps) return http_error(req, 500, "INTERNAL", "out of memory");
    json_t *items = json_object_get(req->json, "items");
    const char *key;
    json_t *v;
    json_object_foreach(req->json, key, v) if (strcmp(key, "items") != 0) {
        rc = http_error_field(req, 422, "UNKNOWN_FIELD", key,
                              "unknown field %.40s (the body is "
                              "{\"items\":[...]})",
                              key);
        goto out;
    }
    if (!json_is_array(items) || json_array_size(items) > PRICES_MAX) {
        rc = http_error_field(req, 422, "INVALID_PRICES", "items",
                              "items must be an array of at most %d prices", PRICES_MAX);
        goto out;
    }
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        struct price *p = &ps->v[ps->n];
        if (parse_item(it, i, p, field, sizeof field, msg, sizeof msg) != 0) {
            rc = http_error_field(req, 422, "INVALID_PRICE", field, "%s", msg);
            goto out;
        }
        for (int k = 0; k < ps->n; k++)
            if (strcmp(ps->v[k].gpu_type, p->gpu_type) == 0) {
                snprintf(field, sizeof field, "items[%zu].gpu_type", i);
                rc = http_error_field(req, 422, "DUPLICATE_PRICE", field,
                                      "items[%zu]: gpu_type %s is listed twice", i, p->gpu_type);
                goto out;
            }
        ps->n++;
    }
    ps->now = store_now_ms();
    if (store_write(req->ld->store, replace_cb, ps) != STORE_OK) {
        rc = http_error(req, 503, "STORE_UNAVAILABLE", "could not record the prices");
        goto out;
    }
    rc = reply_list(req);
out:
    free(ps);
    return rc;
}
