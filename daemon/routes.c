/* The route table of loomd: one row per route (method, path pattern, who may
 * call it, body kind, handler). Other modules add their rows here and
 * declare their handlers in their own headers. api/openapi.yaml lists the
 * same set of paths (a test checks it). */
#include "daemon/agent_api.h"
#include "daemon/api_prices.h"
#include "daemon/artifacts.h"
#include "daemon/audit.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/http.h"
#include "daemon/joblogs.h"
#include "daemon/nodecheck.h"
#include "daemon/nodes.h"
#include "daemon/rdzv.h"
#include "daemon/staging.h"
#include "daemon/ui.h"
#include "daemon/usage.h"
#include "daemon/webhooks.h"

const struct http_route http_routes[] = {
    /* system */
    {"GET", "/healthz", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, api_system_healthz},
    {"GET", "/metrics", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, api_system_metrics},
    {"GET", "/v1/system/connections", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_system_connections},
    /* tenants (admin) */
    {"POST", "/v1/tenants", HTTP_AUTH_ADMIN, HTTP_BODY_JSON, api_tenants_create},
    {"GET", "/v1/tenants", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_tenants_list},
    {"GET", "/v1/tenants/{id}", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_tenants_get},
    {"PATCH", "/v1/tenants/{id}", HTTP_AUTH_ADMIN, HTTP_BODY_JSON, api_tenants_update},
    {"POST", "/v1/tenants/{id}/tokens", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT,
     api_tenants_token_create},
    {"GET", "/v1/tenants/{id}/tokens", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, api_tenants_token_list},
    {"DELETE", "/v1/tenants/{id}/tokens/{tid}", HTTP_AUTH_ADMIN, HTTP_BODY_NONE,
     api_tenants_token_revoke},
    {"POST", "/v1/tenants/{id}/tokens/{tid}/rotate", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT,
     api_tenants_token_rotate},
    /* audit log (admin; daemon/audit.h) */
    {"GET", "/v1/audit", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, audit_api_list},
    /* jobs: tenants see their own; the admin token sees all (?tenant= narrows) */
    {"POST", "/v1/jobs", HTTP_AUTH_TENANT, HTTP_BODY_JSON, api_jobs_submit},
    {"GET", "/v1/jobs", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, api_jobs_list},
    {"GET", "/v1/jobs/{id}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, api_jobs_get},
    {"POST", "/v1/jobs/{id}/cancel", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_JSON_OPT, api_jobs_cancel},
    {"GET", "/v1/jobs/{id}/events", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, api_jobs_events},
    {"POST", "/v1/arrays/{id}/cancel", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_JSON_OPT, api_arrays_cancel},
    {"POST", "/v1/plan", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_JSON, api_jobs_plan},
    /* cluster: nodes, logs, metrics, usage, agents, rendezvous (docs/internals/agent.md) */
    {"GET", "/v1/jobs/{id}/logs", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, joblogs_logs},
    {"GET", "/v1/jobs/{id}/metrics", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, joblogs_metrics},
    {"GET", "/v1/nodes", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, nodes_list},
    {"GET", "/v1/nodes/{id}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, nodes_get},
    {"POST", "/v1/nodes/{id}/drain", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT, nodes_drain},
    {"POST", "/v1/nodes/{id}/undrain", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT, nodes_undrain},
    /* node admission (daemon/nodes.h) */
    {"POST", "/v1/nodes/{id}/approve", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT, nodes_approve},
    {"POST", "/v1/nodes/{id}/reject", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT, nodes_reject},
    {"DELETE", "/v1/nodes/{id}", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, nodes_revoke},
    {"PATCH", "/v1/nodes/{id}", HTTP_AUTH_ADMIN, HTTP_BODY_JSON, nodes_update},
    {"GET", "/v1/usage", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, usage_get},
    /* GPU prices per gpu_type (daemon/api_prices.h) */
    {"PUT", "/v1/prices", HTTP_AUTH_ADMIN, HTTP_BODY_JSON, api_prices_put},
    {"GET", "/v1/prices", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, api_prices_get},
    {"POST", "/v1/agent/register", HTTP_AUTH_JOIN, HTTP_BODY_JSON, agent_api_register},
    {"POST", "/v1/agent/heartbeat", HTTP_AUTH_NODE, HTTP_BODY_JSON, agent_api_heartbeat},
    {"GET", "/v1/agent/assignments", HTTP_AUTH_NODE, HTTP_BODY_NONE, agent_api_assignments},
    {"POST", "/v1/agent/metrics", HTTP_AUTH_NODE, HTTP_BODY_JSON, agent_api_metrics},
    {"POST", "/v1/agent/logs", HTTP_AUTH_NODE, HTTP_BODY_JSON, agent_api_logs},
    {"PUT", "/v1/rdzv/{job}/{attempt}/{key}", HTTP_AUTH_BEARER, HTTP_BODY_JSON, rdzv_put},
    {"GET", "/v1/rdzv/{job}/{attempt}/{key}", HTTP_AUTH_BEARER, HTTP_BODY_NONE, rdzv_get_key},
    /* node checks (daemon/nodecheck.h) */
    {"POST", "/v1/nodes/{id}/check", HTTP_AUTH_ADMIN, HTTP_BODY_JSON_OPT, nodecheck_api_create},
    {"DELETE", "/v1/nodes/{id}/degraded", HTTP_AUTH_ADMIN, HTTP_BODY_NONE, nodecheck_api_clear},
    {"GET", "/v1/nodechecks", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, nodecheck_api_list},
    {"GET", "/v1/nodechecks/{id}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, nodecheck_api_get},
    {"GET", "/v1/agent/checks", HTTP_AUTH_NODE, HTTP_BODY_NONE, nodecheck_agent_poll},
    {"POST", "/v1/agent/checks/{id}", HTTP_AUTH_NODE, HTTP_BODY_JSON, nodecheck_agent_report},
    {"PUT", "/v1/nodechecks/{id}/rdzv/{key}", HTTP_AUTH_BEARER, HTTP_BODY_JSON, nodecheck_rdzv_put},
    {"GET", "/v1/nodechecks/{id}/rdzv/{key}", HTTP_AUTH_BEARER, HTTP_BODY_NONE, nodecheck_rdzv_get},
    /* data staging reports from loom-stage (daemon/staging.h) */
    {"POST", "/v1/jobs/{id}/staging", HTTP_AUTH_BEARER, HTTP_BODY_JSON, staging_report},
    /* event stream, webhooks, artifacts (daemon/events.h, webhooks.h, artifacts.h) */
    {"GET", "/v1/events", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, api_events_list},
    {"POST", "/v1/webhooks", HTTP_AUTH_TENANT, HTTP_BODY_JSON, api_webhooks_create},
    {"GET", "/v1/webhooks", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_webhooks_list},
    {"GET", "/v1/webhooks/{id}", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_webhooks_get},
    {"DELETE", "/v1/webhooks/{id}", HTTP_AUTH_TENANT, HTTP_BODY_NONE, api_webhooks_delete},
    {"GET", "/v1/webhooks/{id}/deliveries", HTTP_AUTH_TENANT, HTTP_BODY_NONE,
     api_webhooks_deliveries},
    {"GET", "/v1/jobs/{id}/artifacts", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, artifacts_api_list},
    {"GET", "/v1/jobs/{id}/artifacts/{path*}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE,
     artifacts_api_get},
    {"DELETE", "/v1/jobs/{id}/artifacts/{path*}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE,
     artifacts_api_delete},
    /* web view: static files embedded in the binary (daemon/ui.h) */
    {"GET", "/ui", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, ui_index},
    {"GET", "/ui/{file}", HTTP_AUTH_ANYONE, HTTP_BODY_NONE, ui_get},
};
const size_t http_routes_count = sizeof http_routes / sizeof *http_routes;
