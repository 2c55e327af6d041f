/* GET /healthz, GET /metrics (Prometheus text format) and the admin's
 * GET /v1/system/connections (what the abuse limits see). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/auth.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/loomd.h"
#include "daemon/metrics.h"
#include "daemon/store.h"

int api_system_healthz(struct http_req *req) {
    return http_reply_json(req, 200,
                           json_pack("{s:s, s:i}", "status",
                                     http_stopping(req->ld->http) ? "stopping" : "ok",
                                     "schema_version", store_schema_version(req->ld->store)));
}

/* Who may see the full /metrics: the admin token, or a token of the admin
 * tenant with the admin or metrics scope (Prometheus: docs/operations.md).
 * 1 full, 0 aggregate (no token), -1 replied with an error. */
static int metrics_access(struct http_req *req) {
    struct loomd *ld = req->ld;
    const char *h = http_header(req, "Authorization");
    if (!h || !*h) {
        if (ld->cfg.metrics_anonymous) return 0;
        http_add_header(req, "WWW-Authenticate", "Bearer");
        API_ERROR(req, UNAUTHORIZED,
                  "GET /metrics needs a token with the 'metrics' or 'admin' scope "
                  "(--metrics-anonymous is off)");
        return -1;
    }
    if (strncasecmp(h, "Bearer ", 7) != 0 || !h[7]) {
        http_add_header(req, "WWW-Authenticate", "Bearer");
        API_ERROR(req, UNAUTHORIZED, "the Authorization header is not 'Bearer TOKEN'");
        return -1;
    }
    const char *tok = h + 7;
    if (auth_is_admin(ld->auth, tok)) return 1;
    struct auth_token_info info;
    int rc = auth_tenant_token(ld->auth, ld->store, tok, &info);
    if (rc == -2) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store could not be read; retry");
        return -1;
    }
    if (rc == -3) {
        http_add_header(req, "WWW-Authenticate", "Bearer error=\"invalid_token\"");
        API_ERROR(req, TOKEN_EXPIRED, "token %s of tenant %s has expired", info.token_id,
                  info.tenant_id);
        return -1;
    }
    if (rc != 0) {
        http_add_header(req, "WWW-Authenticate", "Bearer");
        API_ERROR(req, UNAUTHORIZED, "unknown or revoked token");
        return -1;
    }
    if (info.scopes & (AUTH_SCOPE_ADMIN | AUTH_SCOPE_METRICS)) return 1;
    /* A tenant token: the full series name other tenants' jobs. */
    API_ERROR(req, FORBIDDEN,
              "token %s lacks the 'metrics' scope: the per-job and per-tenant series need the "
              "admin token or a 'metrics' token of the admin tenant (without a token: the "
              "aggregate series)",
              info.token_id);
    return -1;
}

int api_system_metrics(struct http_req *req) {
    int full = metrics_access(req);
    if (full < 0) return 0;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return API_ERROR(req, INTERNAL, "out of memory");
    metrics_write(req->ld, f);
    fclose(f);
    if (!full) len = metrics_public_filter(buf, len);
    http_reply_text(req, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
    free(buf);
    return 0;
}

static void add_tenant(void *arg, const char *tenant, int n) {
    json_object_set_new(arg, tenant, json_integer(n));
}

int api_system_connections(struct http_req *req) {
    struct http_conn_stats hs;
    http_conn_stats(req->ld->http, &hs);
    struct store_pool_stats ps;
    store_pool_stats(req->ld->store, &ps);
    json_t *by = json_object();
    http_each_stream_tenant(req->ld->http, add_tenant, by);
    json_t *r =
        json_pack("{s:{s:i, s:i, s:I, s:I}, s:{s:i, s:I, s:I, s:o}, s:{s:I}, "
                  "s:{s:i, s:i, s:i, s:i, s:i, s:i}}",
                  "connections", "open", hs.connections, "in_flight", hs.inflight, "limit",
                  (json_int_t)hs.conn_limit, "refused", (json_int_t)hs.refused_conns, "streams",
                  "open", hs.streams, "limit", (json_int_t)hs.stream_total, "per_tenant_limit",
                  (json_int_t)hs.stream_per_tenant, "by_tenant", by, "refused", "streams",
                  (json_int_t)hs.refused_streams, "read_pool", "open", ps.open, "idle", ps.idle,
                  "busy", ps.busy, "waiting", ps.waiting, "max", ps.max, "idle_max", ps.idle_max);
    /* Event streams written by the fan-out thread (the rest keep a thread each). */
    json_object_set_new(json_object_get(r, "streams"), "fanout",
                        json_integer(events_fanout_held(req->ld->events->fanout)));
    return http_reply_json(req, 200, r);
}
