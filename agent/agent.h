/* loom-agent core: the node's side of the agent <-> loomd protocol (see
 * docs/internals/agent.md) and the supervision loop.
 *
 * Threads: the main thread runs agent_run (reaping, reconciling, shipping,
 * heartbeats); one poll thread long-polls loomd for the node's desired task
 * set. They share only `struct agent_desired` under a mutex. */
#ifndef LOOM_AGENT_AGENT_H
#define LOOM_AGENT_AGENT_H

#include <signal.h>

struct agent_config {
    char *coordinator;
    char *join_token;
    char *name;
    char *work_dir;
    long cpu_devices;
    char *worker;
    char *interconnect; /* reported to loomd: "nvlink", "pcie", "none", ... */
    long heartbeat_ms;
    long stop_grace_ms;
    long poll_wait_ms;
    long retry_max_ms;
    int adopt;
    char *log_level;
    char *config;
    char *ca; /* CA bundle for an https coordinator (sets LOOM_CA, api/client.h) */
    char *comm_iface, *comm_host; /* overrides of the workers' listen address (commaddr.h) */
    char *job_root;               /* node-local job directories <job_root>/<job> (NULL: loomd's) */
    char *artifact_listen;   /* HOST:PORT of the artifact server (agent/artifacts.h), NULL: off */
    struct agent_cred *cred; /* set by agent_run for its threads (agent_cred_apply) */
    double cpu_peak_gflops;  /* cpu devices' peak for MFU (agent/cpupeak.h); 0: measure it */
    double token_cache_max_gib; /* loom-stage's token cache cap (LOOM_TOKEN_CACHE_MAX_GIB) */
    int diag; /* diagnosis sampling in the workers (LOOM_RANK_STEPS=1; 0: LOOM_DIAG=0) */
};

struct client;
/* The bearer the agent's clients send: the node's own credential once loomd
 * issued one (kept in <work-dir>/node.credential, mode 0600), else the join
 * token (docs/internals/agent.md "Admission"). Before each request a thread
 * calls agent_cred_apply with its client and its own *seen (start at 0):
 * the client's token is replaced when the credential changed. */
void agent_cred_apply(struct agent_cred *cr, struct client *cl, unsigned *seen);

/* Run until *stop becomes non-zero (signal handler). Workers are left
 * running on return (a restarted agent re-adopts them). Returns 0, or -1 when
 * start-up failed (message logged). */
int agent_run(const struct agent_config *cfg, volatile sig_atomic_t *stop);

#endif
