/* loomd's side of the agent protocol (/v1/agent/..., join token). See
 * docs/internals/agent.md for the message shapes:
 *   POST /v1/agent/register     node inventory + local tasks -> {node, heartbeat_ms, epoch}
 *   POST /v1/agent/heartbeat    telemetry + task states; 404 UNKNOWN_NODE -> re-register
 *   GET  /v1/agent/assignments?node=&version=&wait_ms=   long-poll for the node's
 *                               desired task set {version, tasks:[...]}
 *   POST /v1/agent/metrics      batched worker JSON lines {node, items:[{job,attempt,rank,record}]}
 *   POST /v1/agent/logs         {node, job, attempt, rank, stream, offset, data} -> {size}
 * Handlers run on HTTP threads; they record into the cluster state and wake
 * the scheduler loop. */
#ifndef LOOM_DAEMON_AGENT_API_H
#define LOOM_DAEMON_AGENT_API_H

#include <stddef.h>

struct http_req;

int agent_api_register(struct http_req *req);
int agent_api_heartbeat(struct http_req *req);
int agent_api_assignments(struct http_req *req);
int agent_api_metrics(struct http_req *req);
int agent_api_logs(struct http_req *req);

/* Path of the stored log of (job, attempt, rank, stream) under logs_dir. */
void agent_api_log_path(const char *logs_dir, const char *job, int attempt, int rank,
                        const char *stream, char *out, size_t len);

#endif
