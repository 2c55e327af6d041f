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

/* Node admission. A node registering with the join token gets its own
 * credential (a random "loom_" token; loomd keeps its SHA-256 only) in the
 * reply and is `pending` until an admin approves it, unless --auto-approve.
 * Every later agent call carries the credential instead of the join token;
 * pending nodes get no task. Reject (pending only) and DELETE (revoke, any
 * state) clear the credential: the agent's calls then get 401, the scheduler
 * places nothing on the node and its running ranks are handled as on a lost
 * node. A rejected node cannot apply again until it is deleted; a revoked one
 * applies again as pending. Each change is an audit row (the HTTP layer) and
 * a node.* event (job_id "", admin only). */
enum node_admission { NODE_APPROVED = 0, NODE_PENDING, NODE_REJECTED, NODE_REVOKED };
const char *nodes_admission_name(int admission);
int nodes_admission_parse(const char *name); /* NODE_*, or NODE_APPROVED for NULL/unknown */
/* Looks `token` up among the node credentials: the node's admission
 * (NODE_APPROVED, NODE_PENDING; name into node) or -1 when no node has it.
 * Constant-time compares; takes c->mu (any thread, not with it held). */
int nodes_auth(struct loomd *ld, const char *token, char *node, size_t len);
/* Inside a store write: the admission columns of node `name`; cred NULL
 * clears the credential, by: the admin's token id (NULL at registration). */
int nodes_store_admission(struct store_tx *tx, const char *name, int admission,
                          const unsigned char cred[32], const char *by);
/* Inside a store write: a node.<admission> event for node `name`. */
int nodes_emit_event(struct store_tx *tx, const char *name, int admission, const char *by);
/* POST /v1/nodes/{id}/approve, POST /v1/nodes/{id}/reject, DELETE /v1/nodes/{id} (admin). */
int nodes_approve(struct http_req *req);
int nodes_reject(struct http_req *req);
int nodes_revoke(struct http_req *req);

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

/* PATCH /v1/nodes/{id} (admin): {"pool": "NAME" | "", "labels": {"k": "v" | null}}
 * sets the node's pool and merges its labels (null removes a key); stored
 * (schema 160) and shown in GET /v1/nodes. Jobs select nodes with
 * resources.pool and resources.labels (docs/scheduling.md). */
int nodes_update(struct http_req *req);

/* Submit-time: a job with resources.pool / resources.labels must match at
 * least one registered node of its device kind (not rejected or revoked);
 * else -1 with UNSCHEDULABLE naming the selector and the nodes' pools. 0
 * also when no node of the kind has joined yet. Takes c->mu. */
struct loom_spec;
struct loom_error;
int nodes_selector_check(struct loomd *ld, const struct loom_spec *s, struct loom_error *e);

/* The fleet as the planner sees it (api/planner.h): one pool per gpu_type
 * ("cpu" for cpu nodes) with its nodes in any state, devices, the least device
 * memory reported (cpu devices: the node's memory split evenly), the smallest
 * host memory, for cpu pools the slowest node's measured cpu_peak_gflops, and
 * the type's price (PUT /v1/prices, else gpu_prices.json by
 * model, else --price-per-gpu-hour). Takes c->mu; any thread but not with it
 * held (it reads the store first). */
void nodes_fleet(struct loomd *ld, struct planner_fleet *f);

#endif
