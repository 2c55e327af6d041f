/* Usage ledger queries (see usage.h). The GROUP BY column comes from a fixed
 * table, never from the request text. */
#define _GNU_SOURCE
#include "daemon/usage.h"

#include "common/buf.h"
#include "daemon/api_prices.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int usage_parse_time(const char *s, int64_t *ms) {
    if (!s || !*s) return -1;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end && !*end) {
        *ms = v;
        return 0;
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p) {
        memset(&tm, 0, sizeof tm);
        p = strptime(s, "%Y-%m-%d", &tm);
    }
    if (!p || (*p && strcmp(p, "Z") && strcmp(p, "+00:00"))) return -1;
    *ms = (int64_t)timegm(&tm) * 1000;
    return 0;
}

static const struct {
    const char *name;
    const char *expr;
} groups[] = {
    {"tenant", "tenant_id"},
    {"job", "job_id"},
    {"month", "strftime('%Y-%m', start_ms / 1000, 'unixepoch')"},
    {"node", "node"},
    {"gpu_model", "gpu_model"},
    {"gpu_type", "gpu_type"},
    {"cause", "cause"},
};

int usage_cause_billed(const char *policy, const char *cause) {
    size_t n = strlen(cause);
    for (const char *p = policy ? policy : ""; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, cause, n)) return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

int usage_policy_check(const char *policy, char *bad, size_t len) {
    static const char *const causes[] = {"user", "preempted", "node_lost", "hang", "infra"};
    for (const char *p = policy ? policy : ""; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int ok = 0;
        for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++)
            ok |= strlen(causes[i]) == n && !strncmp(p, causes[i], n);
        if (!ok) {
            snprintf(bad, len, "%.*s", (int)n, p);
            return -1;
        }
        p += n + (e ? 1 : 0);
    }
    return 0;
}

int64_t usage_hour_end(int64_t t_ms) {
    const int64_t hour = 3600000;
    int64_t h = t_ms >= 0 ? t_ms / hour : (t_ms - hour + 1) / hour;
    return (h + 1) * hour;
}

double usage_month_hours(int64_t t_ms) {
    time_t t = (time_t)(t_ms >= 0 ? t_ms / 1000 : (t_ms - 999) / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    tm.tm_mday = 1;
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    time_t start = timegm(&tm);
    tm.tm_mon += 1; /* timegm normalises December + 1 into January */
    time_t end = timegm(&tm);
    return (double)(end - start) / 3600.0;
}

double usage_hour_price(double per_gpu_hour, double per_gpu_month, int64_t t_ms) {
    if (per_gpu_month < 0) return per_gpu_hour;
    return per_gpu_month / usage_month_hours(t_ms);
}

int usage_insert(struct store_tx *tx, const struct usage_row *r) {
    double price = r->price, monthly = -1;
    char gpu_type[32] = "", currency[8] = "";
    sqlite3_stmt *st = store_stmt(tx, "SELECT n.gpu_type, p.per_gpu_hour, p.currency, "
                                      "p.per_gpu_month FROM nodes n "
                                      "LEFT JOIN gpu_prices p ON p.gpu_type = n.gpu_type "
                                      "WHERE n.name = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, r->node, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        snprintf(gpu_type, sizeof gpu_type, "%s", (const char *)sqlite3_column_text(st, 0));
        if (sqlite3_column_type(st, 1) != SQLITE_NULL) {
            price = sqlite3_column_double(st, 1);
            snprintf(currency, sizeof currency, "%s", (const char *)sqlite3_column_text(st, 2));
            if (sqlite3_column_type(st, 3) != SQLITE_NULL) monthly = sqlite3_column_double(st, 3);
        }
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    st = store_stmt(tx, "INSERT INTO usage (tenant_id, job_id, attempt, node, gpu_model, gpus, "
                        "start_ms, end_ms, gpu_seconds, cost, gpu_type, currency, cause, billed) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!st) return STORE_ERR;
    int rc = STORE_OK;
    int64_t t1 = r->t1 > r->t0 ? r->t1 : r->t0;
    /* One row per UTC hour: a month (or hour) boundary inside the attempt
     * splits it exactly, and each row is priced in its own month (a monthly
     * rate over that month's hours). A zero-length attempt still gets its
     * one row. */
    for (int64_t a = r->t0; rc == STORE_OK && (a < t1 || a == r->t0);) {
        int64_t b = usage_hour_end(a) < t1 ? usage_hour_end(a) : t1;
        double secs = r->gpus * (double)(b - a) / 1000.0;
        sqlite3_bind_text(st, 1, r->tenant_id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, r->job_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, r->attempt);
        sqlite3_bind_text(st, 4, r->node, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, r->gpu_model, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 6, r->gpus);
        sqlite3_bind_int64(st, 7, a);
        sqlite3_bind_int64(st, 8, b);
        sqlite3_bind_double(st, 9, secs);
        sqlite3_bind_double(st, 10,
                            r->billed ? secs / 3600.0 * usage_hour_price(price, monthly, a) : 0.0);
        sqlite3_bind_text(st, 11, gpu_type, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 12, currency, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 13, r->cause ? r->cause : "user", -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 14, r->billed ? 1 : 0);
        rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        if (b == a) break;
        a = b;
    }
    return rc;
}

struct usage_q {
    const char *expr;
    const char *tenant; /* NULL: all */
    int64_t from, to;
    json_t *rows;
    double gpu_seconds, cost;
};

static int usage_read(struct store_tx *tx, void *arg) {
    struct usage_q *q = arg;
    char sql[512];
    snprintf(sql, sizeof sql,
             "SELECT %s AS k, SUM(gpu_seconds), SUM(cost), COUNT(*), MIN(tenant_id) FROM usage "
             "WHERE start_ms >= ?1 AND start_ms < ?2 AND (?3 IS NULL OR tenant_id = ?3) "
             "GROUP BY k ORDER BY k",
             q->expr);
    sqlite3_stmt *st = store_stmt(tx, sql);
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, q->from);
    sqlite3_bind_int64(st, 2, q->to);
    if (q->tenant) sqlite3_bind_text(st, 3, q->tenant, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        double secs = sqlite3_column_double(st, 1), cost = sqlite3_column_double(st, 2);
        json_array_append_new(q->rows, json_pack("{s:s, s:f, s:f, s:f, s:i}", "key",
                                                 (const char *)sqlite3_column_text(st, 0),
                                                 "gpu_seconds", secs, "gpu_hours", secs / 3600.0,
                                                 "cost", cost, "rows", sqlite3_column_int(st, 3)));
        q->gpu_seconds += secs;
        q->cost += cost;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* The invoice: one CSV line per month, tenant, GPU type and currency. The
 * rows are cut at hour boundaries (usage_insert), so a month holds exactly
 * the time spent in it. */
struct invoice_q {
    const char *tenant; /* NULL: all */
    int64_t from, to;
    struct buf out;
};

static int invoice_read(struct store_tx *tx, void *arg) {
    struct invoice_q *q = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT strftime('%Y-%m', start_ms / 1000, 'unixepoch') AS m, tenant_id, gpu_type, "
            "currency, SUM(gpu_seconds), SUM(CASE WHEN billed THEN gpu_seconds ELSE 0 END), "
            "SUM(cost) FROM usage WHERE start_ms >= ?1 AND start_ms < ?2 AND (?3 IS NULL OR "
            "tenant_id = ?3) GROUP BY m, tenant_id, gpu_type, currency "
            "ORDER BY m, tenant_id, gpu_type, currency");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, q->from);
    sqlite3_bind_int64(st, 2, q->to);
    if (q->tenant) sqlite3_bind_text(st, 3, q->tenant, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *cur = (const char *)sqlite3_column_text(st, 3);
        buf_printf(&q->out, "%s,%s,%s,%s,%.6f,%.6f,%.6f\n", sqlite3_column_text(st, 0),
                   sqlite3_column_text(st, 1), sqlite3_column_text(st, 2), cur && *cur ? cur : "",
                   sqlite3_column_double(st, 4) / 3600.0, sqlite3_column_double(st, 5) / 3600.0,
                   sqlite3_column_double(st, 6));
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

static int usage_csv(struct http_req *req, const char *tenant, int64_t from, int64_t to) {
    struct invoice_q q = {tenant, from, to, BUF_INIT};
    buf_printf(&q.out, "month,tenant,gpu_type,currency,gpu_hours,billed_gpu_hours,cost\n");
    if (store_read(req->ld->store, invoice_read, &q) != STORE_OK || !q.out.p) {
        buf_free(&q.out);
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read the usage ledger");
    }
    int rc = http_reply_text(req, 200, "text/csv; charset=utf-8", q.out.p, q.out.len);
    buf_free(&q.out);
    return rc;
}

int usage_get(struct http_req *req) {
    const char *from = http_query(req, "from"), *to = http_query(req, "to");
    const char *group = http_query(req, "group_by");
    struct usage_q q = {0};
    q.from = 0;
    q.to = INT64_MAX;
    if (from && usage_parse_time(from, &q.from) != 0)
        return http_error(req, 400, "INVALID_TIME", "from=%s is not RFC 3339, YYYY-MM-DD or ms",
                          from);
    if (to && usage_parse_time(to, &q.to) != 0)
        return http_error(req, 400, "INVALID_TIME", "to=%s is not RFC 3339, YYYY-MM-DD or ms", to);
    const char *format = http_query(req, "format");
    if (format && strcmp(format, "csv") && strcmp(format, "json"))
        return http_error(req, 400, "INVALID_FORMAT", "format=%s; use json or csv", format);
    if (format && !strcmp(format, "csv"))
        return usage_csv(req, req->is_admin ? http_query(req, "tenant") : req->tenant_id, q.from,
                         q.to);
    if (!group) group = "tenant";
    for (size_t i = 0; i < sizeof groups / sizeof *groups; i++)
        if (!strcmp(groups[i].name, group)) q.expr = groups[i].expr;
    if (!q.expr)
        return http_error(req, 400, "INVALID_GROUP_BY",
                          "group_by=%s; use tenant, job, month, node, gpu_model or gpu_type",
                          group);
    q.tenant = req->is_admin ? http_query(req, "tenant") : req->tenant_id;
    q.rows = json_array();
    if (store_read(req->ld->store, usage_read, &q) != STORE_OK) {
        json_decref(q.rows);
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read the usage ledger");
    }
    json_t *reply =
        json_pack("{s:s, s:f, s:o, s:{s:f, s:f, s:f}}", "group_by", group, "price_per_gpu_hour",
                  req->ld->cfg.price_gpu_hour, "rows", q.rows, "total", "gpu_seconds",
                  q.gpu_seconds, "gpu_hours", q.gpu_seconds / 3600.0, "cost", q.cost);
    if (q.tenant) json_object_set_new(reply, "tenant", json_string(q.tenant));
    /* Attempts still holding devices are not in the ledger yet: list them
     * with their usage so far, per node, so a running job's cost shows. */
    json_t *running = json_array();
    struct cluster *c = req->ld->cluster;
    json_t *type_prices = prices_load(req->ld); /* before the cluster lock: a store read */
    if (c) {
        int64_t now = store_now_ms();
        pthread_mutex_lock(&c->mu);
        for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
            if ((q.tenant && strcmp(q.tenant, a->tenant_id)) || a->started_ms < q.from ||
                a->started_ms >= q.to)
                continue;
            for (int r = 0; r < a->world; r++) {
                int ni = a->ranks[r].node, first = 1, gpus = 0;
                for (int k = 0; k < a->world; k++) {
                    if (a->ranks[k].node != ni) continue;
                    if (k < r) first = 0;
                    gpus++;
                }
                if (!first) continue;
                double secs = gpus * (double)(now - a->started_ms) / 1000.0;
                json_t *p = json_object_get(c->prices, c->nodes[ni].gpu_model);
                json_t *tp = json_object_get(type_prices, c->nodes[ni].gpu_type);
                json_t *tm = json_object_get(tp, "per_gpu_month");
                double price =
                    tp ? usage_hour_price(json_number_value(json_object_get(tp, "per_gpu_hour")),
                                          json_is_number(tm) ? json_number_value(tm) : -1, now)
                    : json_is_number(p) ? json_number_value(p)
                                        : req->ld->cfg.price_gpu_hour;
                json_t *row =
                    json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:f, s:f}", "tenant", a->tenant_id,
                              "job", a->job_id, "attempt", a->attempt, "node", c->nodes[ni].name,
                              "gpu_model", c->nodes[ni].gpu_model, "gpus", gpus, "gpu_seconds",
                              secs, "cost", secs / 3600.0 * price);
                json_object_set_new(row, "gpu_type", json_string(c->nodes[ni].gpu_type));
                if (tp) json_object_set(row, "currency", json_object_get(tp, "currency"));
                json_array_append_new(running, row);
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    json_object_set_new(reply, "running", running);
    if (req->ld->cluster && req->ld->cluster->prices)
        json_object_set(reply, "gpu_prices", req->ld->cluster->prices); /* read-only after start */
    if (type_prices) json_object_set_new(reply, "gpu_type_prices", type_prices);
    return http_reply_json(req, 200, reply);
}
