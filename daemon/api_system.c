/* GET /healthz and GET /metrics (Prometheus text format). */
#include <stdio.h>
#include <stdlib.h>

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

int api_system_metrics(struct http_req *req) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return API_ERROR(req, INTERNAL, "out of memory");
    metrics_write(req->ld, f);
    fclose(f);
    http_reply_text(req, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
    free(buf);
    return 0;
}
