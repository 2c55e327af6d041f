/* Node checks in loomd: prove a node's GPUs and links before jobs land on it
 * (the cluster-guide ritual of nccl-tests within a node and a bandwidth test
 * between nodes), store the results per node with the date, and mark a node
 * far below the expected figure `degraded` so the scheduler avoids it.
 *
 * Two kinds of check:
 *   node  all-reduce over every device of one node (intra-node fabric:
 *         NVLink / PCIe; the cpu comm backend on --cpu-devices nodes);
 *   pair  one rank on device 0 of each of two nodes (the path between them:
 *         bandwidth of the largest message, latency of the smallest).
 * The measuring is done by loom-nodecheck (agent/nodecheck/probe.c) which
 * the agents start, one process per rank, through the comm layer training
 * uses; this module schedules, serves the rendezvous and judges.
 *
 * Flow: POST /v1/nodes/{id}/check (admin) queues a check; a check starts
 * once none of its nodes runs another check; agents long-poll
 * GET /v1/agent/checks?node= for their part (ranks + devices, rendezvous
 * path, check-scoped token), run it and POST /v1/agent/checks/{id} with
 * rank 0's summary; when every part reported, the peak bus bandwidth is
 * compared with the expected figure (table by device kind / interconnect /
 * GPU model, or the request's expect_busbw_gbps): below min_ratio (0.5) of it
 * marks the node(s) degraded with a reason; a passing check of the same kind
 * clears its mark. A part not reported within 180 s fails the check (no
 * mark). Nodes that run job ranks refuse a check (409 NODE_BUSY) unless
 * "force": true; while a node is being checked, and while it is degraded,
 * the scheduler places nothing on it (DELETE /v1/nodes/{id}/degraded clears
 * the mark: the operator's "use it anyway").
 *
 * State: checks in memory while queued/running, every check and the marks in
 * the store (schema/040_node_checks.sql), so marks survive a restart.
 * Locking: one mutex in struct nodecheck. Callers holding the cluster mutex
 * may call nodecheck_degraded / nodecheck_annotate (they take only the
 * nodecheck mutex); this module never takes the cluster mutex while holding
 * its own. */
#ifndef LOOM_DAEMON_NODECHECK_H
#define LOOM_DAEMON_NODECHECK_H

#include <jansson.h>
#include <stdio.h>

struct loomd;
struct http_req;

/* Module hooks (row in loomd.c's module table). */
int nodecheck_start(struct loomd *ld);
void nodecheck_stop(struct loomd *ld);

/* 1 when the scheduler should place nothing on `node`: degraded by a check
 * or being checked now. Any thread; may be called with the cluster mutex held. */
int nodecheck_avoid(struct loomd *ld, const char *node);
/* Adds "health" ({degraded, reasons, checking, last_check}) to a node object
 * and turns "state":"ready" into "degraded" when marked. Same threading. */
void nodecheck_annotate(struct loomd *ld, const char *node, json_t *node_obj);

/* Prometheus families (row in metrics.c's collector table):
 *   loom_node_degraded{node}                       1 while marked, else 0
 *   loom_nodecheck_busbw_gbps{node,kind,peer}      newest measured peak busbw
 *   loom_nodecheck_expected_gbps{node,kind,peer}   the figure it was judged against
 * (peer is "" for node checks). Takes the cluster mutex, then its own. */
void nodecheck_metrics_write(struct loomd *ld, FILE *f);

/* Routes (daemon/routes.c). */
int nodecheck_api_create(struct http_req *req);   /* POST /v1/nodes/{id}/check (admin) */
int nodecheck_api_clear(struct http_req *req);    /* DELETE /v1/nodes/{id}/degraded (admin) */
int nodecheck_api_list(struct http_req *req);     /* GET /v1/nodechecks?node=&limit= */
int nodecheck_api_get(struct http_req *req);      /* GET /v1/nodechecks/{id} */
int nodecheck_agent_poll(struct http_req *req);   /* GET /v1/agent/checks?node=&wait_ms= (join) */
int nodecheck_agent_report(struct http_req *req); /* POST /v1/agent/checks/{id} (join) */
int nodecheck_rdzv_put(struct http_req *req); /* PUT /v1/nodechecks/{id}/rdzv/{key} (check token) */
int nodecheck_rdzv_get(struct http_req *req); /* GET /v1/nodechecks/{id}/rdzv/{key}?wait_ms= */

/* Expected all-reduce bus bandwidth (GB/s) for a check: kind "node" or
 * "pair", device kind "cpu"/"cuda", interconnect ("nvlink", "pcie", ...,
 * may be NULL) and GPU model name (may be NULL). Exposed for tests. */
double nodecheck_expected_gbps(const char *check_kind, const char *device_kind,
                               const char *interconnect, const char *gpu_model);

#endif
