/* Nodes API: GET /v1/nodes, GET /v1/nodes/{id} (tenants and admin: read),
 * POST /v1/nodes/{id}/drain and /undrain (admin). A node object carries its
 * state (ready | drained | lost | unknown), device kind, devices with live
 * telemetry, devices free/used, the tasks its agent reported and timestamps.
 * Drained nodes finish their tasks and take no new ones; the flag is stored,
 * so it survives a loomd restart. */
#ifndef LOOM_DAEMON_NODES_H
#define LOOM_DAEMON_NODES_H

struct http_req;

int nodes_list(struct http_req *req);
int nodes_get(struct http_req *req);
int nodes_drain(struct http_req *req);
int nodes_undrain(struct http_req *req);

#endif
