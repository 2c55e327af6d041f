/* Nodes API: GET /v1/nodes, GET /v1/nodes/{id} (tenants and admin: read),
 * POST /v1/nodes/{id}/drain and /undrain (admin). A node object carries its
 * state (ready | drained | lost | unknown), device kind, gpu_type, devices with
 * live telemetry, the agent's GPU inventory (models, memory, SMs, compute
 * capability, driver and CUDA versions, NVLink/PCIe topology), devices
 * free/used, the tasks its agent reported and timestamps.
 * Drained nodes finish their tasks and take no new ones; the flag is stored,
 * so it survives a loomd restart. */
#ifndef LOOM_DAEMON_NODES_H
#define LOOM_DAEMON_NODES_H

#include <jansson.h>
#include <stddef.h>

struct http_req;
struct loomd;
struct planner_fleet;
struct cluster_node;
struct cluster;
struct store_tx;

int nodes_list(struct http_req *req);
int nodes_get(struct http_req *req);
int nodes_drain(struct http_req *req);
int nodes_undrain(struct http_req *req);

/* The node's gpu_type from its device array (registration or telemetry): each
 * device's "gpu_type" when the agent sent a known one, else normalized from its
 * "name" and "mem_total_mib" (agents that predate the field). "cpu" for cpu
 * nodes, "unknown" when no device is recognised, "mixed" when the devices differ.
 * Pure; any thread. */
void nodes_gpu_type(const char *kind, const json_t *devices, char *out, size_t len);

/* Sets n->gpu_type from n->kind and n->devices, and n->inventory (a new
 * reference to `inventory`, or an empty object for NULL). Caller holds c->mu. */
void nodes_apply_inventory(struct cluster_node *n, json_t *inventory);

/* Writes the gpu_type and inventory columns of node `name` (inside a store
 * write). Returns a STORE_* code. */
int nodes_store_inventory(struct store_tx *tx, const char *name, const char *gpu_type,
                          const json_t *inventory);

/* Loads the stored inventories into c's nodes (start-up, inside a store
 * transaction, c->nodes already loaded). Returns a STORE_* code. */
int nodes_load_inventory(struct store_tx *tx, struct cluster *c);

/* The fleet as the planner sees it (api/planner.h): one pool per gpu_type
 * ("cpu" for cpu nodes) with its nodes in any state, devices, the least device
 * memory reported (cpu devices: the node's memory split evenly), the smallest
 * host memory, and the type's price (PUT /v1/prices, else gpu_prices.json by
 * model, else --price-per-gpu-hour). Takes c->mu; any thread but not with it
 * held (it reads the store first). */
void nodes_fleet(struct loomd *ld, struct planner_fleet *f);

#endif
