/* The cluster module of loomd: nodes, attempts and the scheduler loop.
 *
 * State lives in memory under one mutex (struct cluster, reached through
 * ld->cluster) and is mirrored in the store (tables nodes, attempts; see
 * schema/020_cluster.sql) so that a restarted loomd rebuilds it: running
 * attempts continue, agents re-register, nothing is started twice.
 *
 * An attempt is one try of a job: a placement (node + device per rank), an
 * attempt-scoped rendezvous token, and per-rank states reported by the agents.
 * The scheduler loop (one thread) is the only place that changes job states
 * for scheduling and failures: it places queued jobs (sched_place), asks the
 * supervisor (daemon/supervise.h) about each active attempt (running, rank
 * failed, node lost, hang, start timeout, success, cancel; retry or fail)
 * and applies the answer, and writes usage rows when an attempt's ranks have
 * all stopped. HTTP handlers only record reports and wake the loop.
 *
 * Agents learn their work as a desired task set per node (long-poll on
 * `assign`): a rank is in the set while its attempt is active and the rank has
 * not exited; removal is the kill signal. See docs/internals/agent.md. */
#ifndef LOOM_DAEMON_CLUSTER_H
#define LOOM_DAEMON_CLUSTER_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/http.h"
#include "daemon/supervise.h"

struct loomd;

#define CLUSTER_MAX_NODES     256
#define CLUSTER_NODE_DEVICES  64 /* SCHED_MAX_NODE_DEVICES */
#define CLUSTER_POOL_MAX      64 /* JOBSPEC_POOL_MAX */
#define CLUSTER_NODE_LABELS   16 /* labels an admin may set on a node */
#define CLUSTER_LABEL_KEY_MAX 64 /* JOBSPEC_LABEL_KEY_MAX */
#define CLUSTER_LABEL_VAL_MAX 128

struct cluster_rank {
    int node;       /* index into cluster.nodes */
    int device;     /* device index on the node */
    int local_rank; /* index among the attempt's ranks on that node */
    enum rank_state state;
    int exit_code;
    int64_t exited_at; /* agent's wall clock of the exit (0: unknown) */
    char reason[160];
    long last_step;
    int released; /* its device is free again (stopped, exited or node lost) */
};

enum attempt_phase { ATTEMPT_ACTIVE = 0, ATTEMPT_STOPPING = 1 };

struct cluster_attempt {
    char job_id[24];
    char tenant_id[24];
    int attempt;
    int world;
    char token[72];
    json_t *spec;  /* the job spec, parsed once when the attempt is made (owned) */
    char *out_dir; /* owned */
    enum attempt_phase phase;
    enum stop_cause stop_cause; /* why it is stopping (STOP_NONE while active) */
    int running;                /* job moved to running */
    int64_t started_ms, stop_ms, last_progress_ms, running_ms;
    int stop_grace_ms; /* > 0: agents stop its ranks with this SIGTERM grace (preemption, budget) */
    int budget_warned; /* a warn-only BUDGET_EXHAUSTED event was written for it */
    char stop_reason[256];
    struct cluster_rank *ranks; /* world entries */
    json_t *rdzv;               /* key -> value (rendezvous) */
    json_t *last_step;          /* rank 0's latest step record (for /metrics) */
    struct diag *diag;          /* per-rank step timing diagnosis (daemon/diagnose.h), owned */
    struct cluster_attempt *next;
};

struct cluster_node {
    char name[64];
    char kind[8];
    char hostname[128];
    char gpu_model[96];
    int ndev;
    json_t *devices; /* latest telemetry array */
    json_t *tasks;   /* latest reported task array */
    json_t *host;    /* {cpus, mem_total_mib, interconnect} from registration */
    int drained;
    int lost;
    int seen;           /* registered or heard from since loomd started */
    int64_t last_hb_ms; /* wall ms of the last register/heartbeat */
    int64_t registered_at;
    /* GPU fleet (daemon/nodes.h): api/gpu_types.h name, "cpu", "mixed" or "unknown";
     * the agent's GPU inventory from registration (agent/gpu.h) */
    char gpu_type[24];
    json_t *inventory;
    /* where its workers listen (agent/commaddr.h): rank 0's is every rank's
     * LOOM_MASTER_ADDR; "" when the agent advertised none */
    char comm_addr[64];
    char comm_iface[32];
    /* admission (daemon/nodes.h): enum node_admission; SHA-256 of the node's
     * own credential (has_cred 0: none issued, or cleared by reject/revoke) */
    int admission;
    int has_cred;
    unsigned char cred[32];
    /* one cpu device's measured fp32 peak (agent/cpupeak.h), GFLOP/s; 0: none */
    double cpu_peak_gflops;
    /* NVLink islands from the inventory's topology (nodes_islands): device
     * masks; nislands 0 when the node reports no NVLink pair */
    uint64_t islands[CLUSTER_NODE_DEVICES];
    int nislands;
    /* admin-set pool ("" none) and labels (PATCH /v1/nodes/{id}, schema 160);
     * label_kp/label_vp point into label_keys/label_vals for the scheduler */
    char pool[CLUSTER_POOL_MAX];
    int nlabels;
    char label_keys[CLUSTER_NODE_LABELS][CLUSTER_LABEL_KEY_MAX];
    char label_vals[CLUSTER_NODE_LABELS][CLUSTER_LABEL_VAL_MAX];
    const char *label_kp[CLUSTER_NODE_LABELS];
    const char *label_vp[CLUSTER_NODE_LABELS];
};

/* A node's compute capability x10 for placement (train.precision fp8): its
 * gpu_type's (api/gpu_types.h), or for a type the table lacks ("unknown",
 * "mixed") the least the agent's inventory reports; 0 when a GPU reports
 * none. */
int cluster_node_cc(const struct cluster_node *n);

/* Histogram with fixed buckets (seconds), for /metrics. */
#define CLUSTER_HIST_BUCKETS 12
struct cluster_hist {
    uint64_t counts[CLUSTER_HIST_BUCKETS + 1];
    double sum;
    uint64_t n;
};

/* A job's next attempt prefers other nodes than the one it last failed on. */
struct cluster_avoid {
    char job_id[24];
    char node[64];
    struct cluster_avoid *next;
};

struct cluster {
    struct loomd *ld;
    pthread_mutex_t mu;
    struct http_notify assign; /* desired task sets changed */
    struct http_notify rdzv;   /* a rendezvous key was written */
    struct http_notify logs;   /* log bytes arrived */
    struct http_notify wake;   /* wake the scheduler loop */
    char epoch[20];            /* random per loomd process: versions never repeat */
    uint64_t gen;              /* bumped whenever any desired set changes */
    struct cluster_node nodes[CLUSTER_MAX_NODES];
    int nnodes;
    struct cluster_attempt *attempts;
    struct cluster_avoid *avoid; /* per retried job, until it is placed again */
    pthread_t loop, forward;
    int loop_started, forward_started;
    volatile int stopping;
    char logs_dir[1024];
    json_t *prices; /* <data-dir>/gpu_prices.json: {"GPU model": price per GPU-hour} */
    struct cluster_hist queue_wait; /* submit -> placed, seconds */
    struct cluster_hist sched_lat;  /* one scheduling pass, seconds */
    struct cluster_hist start_lat;  /* placed -> all ranks running, seconds */
};

/* Module hooks (one row in loomd.c's module table). */
int cluster_start(struct loomd *ld);
void cluster_stop(struct loomd *ld);

/* Wake the scheduler loop (after a submit, cancel or report). Any thread. */
void cluster_kick(struct loomd *ld);

/* Helpers for the other cluster files; caller holds c->mu. */
int cluster_node_find(struct cluster *c, const char *name); /* index or -1 */
struct cluster_attempt *cluster_attempt_find(struct cluster *c, const char *job_id, int attempt);
/* Bumps the desired-set generation; caller signals c->assign after unlocking. */
void cluster_changed(struct cluster *c);
/* Records one task object reported by node `ni` (heartbeat/register). */
void cluster_task_report(struct cluster *c, int ni, json_t *task, int64_t now_ms);
/* Desired task set of node `ni` as a JSON array (caller owns). */
json_t *cluster_desired(struct cluster *c, int ni);
/* Version string of the desired sets ("EPOCH:GEN") into buf. */
void cluster_version(struct cluster *c, char *buf, size_t len);

/* Prometheus families (nodes by state, devices free/used, per-device
 * utilization and memory, queue wait and scheduling latency, per-job
 * tokens/s and MFU). Row in metrics.c's collector table. */
void cluster_metrics_write(struct loomd *ld, FILE *f);

#endif
