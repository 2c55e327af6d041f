/* Handlers of loomd's own routes (tenants, jobs, plan, health, metrics).
 * Each answers one row of the route table in daemon/routes.c. */
#ifndef LOOM_DAEMON_HANDLERS_H
#define LOOM_DAEMON_HANDLERS_H

#include "api/errors.h"
#include "daemon/http.h"

/* http_error / http_error_field with a code of api/errors.h, given as a
 * token (a code outside the table does not compile), and that row's
 * status. */
#define API_ERROR(req, code, ...)                                                                  \
    http_error((req), loom_errdef_of(LOOM_E_##code)->status, #code, __VA_ARGS__)
#define API_ERROR_FIELD(req, code, field, ...)                                                     \
    http_error_field((req), loom_errdef_of(LOOM_E_##code)->status, #code, (field), __VA_ARGS__)

/* daemon/api_tenants.c (admin) */
int api_tenants_create(struct http_req *req);
int api_tenants_list(struct http_req *req);
int api_tenants_get(struct http_req *req);
int api_tenants_update(struct http_req *req);
int api_tenants_token_create(struct http_req *req);
int api_tenants_token_list(struct http_req *req);
int api_tenants_token_revoke(struct http_req *req);

/* daemon/api_jobs.c (tenant) */
int api_jobs_submit(struct http_req *req);
int api_jobs_list(struct http_req *req);
int api_jobs_get(struct http_req *req);
int api_jobs_cancel(struct http_req *req);
int api_arrays_cancel(struct http_req *req); /* POST /v1/arrays/{id}/cancel */
int api_jobs_events(struct http_req *req);
int api_jobs_plan(struct http_req *req);

/* daemon/api_system.c (anyone) */
int api_system_healthz(struct http_req *req);
int api_system_metrics(struct http_req *req);
/* GET /v1/system/connections (admin): open connections, streams, read pool */
int api_system_connections(struct http_req *req);

#endif
