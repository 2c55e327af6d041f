/* The agent's side of node checks (loomctl node check; daemon/nodecheck.h):
 * one thread that long-polls loomd for this node's part of a check
 * (GET /v1/agent/checks?node=), starts loom-nodecheck once per rank of the
 * part (the worker's environment contract: LOOM_RANK, LOOM_WORLD,
 * LOOM_LOCAL_RANK, LOOM_RDZV = the check's rendezvous under the coordinator,
 * LOOM_RDZV_TOKEN, CUDA_VISIBLE_DEVICES = the GPU's UUID), waits for them
 * (150 s at most, then SIGKILL), and reports rank 0's size table and summary,
 * or why it failed, with POST /v1/agent/checks/{id}.
 *
 * The probe binary is `loom-nodecheck` beside the worker binary, or
 * $LOOM_NODECHECK_BIN. Its output goes to WORK_DIR/checks/ID.RANK.{out,err}.
 * Threads: the check thread only; it reads the (immutable) inventory and
 * config and has its own HTTP client. */
#ifndef LOOM_AGENT_NODECHECK_H
#define LOOM_AGENT_NODECHECK_H

#include <signal.h>

struct agent_config;
struct gpu_inv;
struct nodecheck_agent;

/* Starts the check thread; it runs until *stop becomes non-zero. Returns NULL
 * (after logging) when it cannot start: the agent runs on without checks.
 * cfg and inv must outlive the thread (until nodecheck_agent_stop). */
struct nodecheck_agent *nodecheck_agent_start(const struct agent_config *cfg,
                                              const struct gpu_inv *inv,
                                              volatile sig_atomic_t *stop);
/* Joins the thread (returns within the poll wait, ~10 s, after *stop is set;
 * a running probe is killed first) and frees. Accepts NULL. */
void nodecheck_agent_stop(struct nodecheck_agent *n);

#endif
