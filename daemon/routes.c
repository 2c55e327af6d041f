/* The route table of loomd: one row per route (method, path pattern, who may
 * call it, body kind, handler). Other modules add their rows here and
 * declare their handlers in their own headers. api/openapi.yaml lists the
 * same set of paths (a test checks it). */
#include "daemon/handlers.h"
#include "daemon/http.h"

const struct http_route http_routes[] = {
    /* system */
    {"GET", "/healthz", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, api_system_healthz},
    {"GET", "/metrics", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, api_system_metrics},
    /* tenants (admin) */
    {"POST", "/v1/tenants", HTTP_AUTH_ADMIN, HTTP_BODY_JSON, api_tenants_create},
    {"GET", "/v1/tenants", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_tenants_list},
    {"GET", "/v1/tenants/{id}", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_tenants_get},
    {"POST", "/v1/tenants/{id}/tokens", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT,
     api_tenants_token_create},
    {"DELETE", "/v1/tenants/{id}/tokens/{tid}", HTTP_AUTH_ADMIN, HTTP_BODY_NONE,
     api_tenants_token_revoke},
    /* jobs (tenant) */
    {"POST", "/v1/jobs", HTTP_AUTH_TENANT, HTTP_BODY_JSON, api_jobs_submit},
    {"GET", "/v1/jobs", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_jobs_list},
    {"GET", "/v1/jobs/{id}", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_jobs_get},
    {"POST", "/v1/jobs/{id}/cancel", HTTP_AUTH_TENANT, HTTP_BODY_JSON_OPT, api_jobs_cancel},
    {"GET", "/v1/jobs/{id}/events", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_jobs_events},
    {"POST", "/v1/plan", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_JSON, api_jobs_plan},
};
const size_t http_routes_count = sizeof http_routes / sizeof *http_routes;
