/* Gang scheduler: a pure function from cluster state and queue to placements.
 *
 * sched_place() takes a snapshot (nodes with their busy devices, per-tenant
 * GPU quotas and usage) and the queued jobs, and decides which jobs start now
 * and on which devices. It keeps no state, does no I/O and allocates only the
 * rank arrays it returns, so loomd's scheduler loop calls it with a fresh
 * snapshot each round and the unit tests call it with tables.
 *
 * Rules (see docs/internals/agent.md):
 * - gang: every rank of a job is placed, or none;
 * - tensor-parallel groups (tp consecutive ranks, tp fastest) sit on one node
 *   on an aligned block of tp adjacent devices (devices tp*k .. tp*k+tp-1);
 * - pack onto the fewest nodes; among equally few, best fit (the fullest node
 *   that still holds the remainder) so large blocks stay free;
 * - order: priority (higher first), then the tenant's decayed GPU-hours
 *   (fair share, daemon/fairshare.h: less recent use first), then submit
 *   time, then id;
 * - per-tenant quota on concurrently held devices (max_gpus <= 0: no limit)
 *   and on jobs running at once (max_running <= 0: no limit);
 * - backfill: the first job (in order) that does not fit now but would fit once
 *   running work ends is the head; it gets a reservation (the devices of its
 *   placement on the cluster with every running attempt gone). Later jobs may
 *   start only on devices outside that reservation, so they never delay it.
 * - a retried job avoids the node its last attempt failed on when another
 *   placement needs no more nodes (a soft preference);
 * - every job left queued gets a pending reason a person can act on;
 * - GPU types: a job with gpu_types runs only on nodes of those types; one job's
 *   ranks all sit on nodes of one type unless allow_mixed. Among the types that
 *   can hold a job now, the listed order decides (first listed wins); a job with
 *   no list takes the type whose placement needs the fewest nodes, then the
 *   one with the fewest free devices (best fit, keeping large pools free), then
 *   by name. Nodes with no type (NULL) are all of one type "".
 * - NVLink islands (docs/scheduling.md): on a node that reports islands (sets of
 *   GPUs joined by NVLink), a tp group sits inside one island: any tp free
 *   devices of an island (lowest first) form a group. A job waits (pending
 *   reason) while no island has a free block, even if enough devices are free
 *   across islands. Only where tp is larger than every island of the node do
 *   its groups span islands (aligned adjacent blocks as on a node without
 *   islands); the decision counts them in cross_island so loomd can warn.
 * - node selectors: a job with a pool and/or labels runs only on nodes whose
 *   admin-set pool equals it and whose labels hold every key=value; a job left
 *   queued because no ready node matches gets a reason naming the selector.
 * Nodes that are drained or lost take no new work. */
#ifndef LOOM_DAEMON_SCHED_H
#define LOOM_DAEMON_SCHED_H

#include <stdint.h>

#define SCHED_MAX_NODE_DEVICES 64
#define SCHED_REASON_LEN       256
#define SCHED_MAX_JOB_TYPES    8 /* resources.gpu_type entries a job may list */

enum sched_node_state { SCHED_NODE_READY = 0, SCHED_NODE_DRAINED = 1, SCHED_NODE_LOST = 2 };

struct sched_node {
    const char *name; /* borrowed; shown in pending reasons */
    const char *kind; /* device kind offered: "cuda" or "cpu" */
    int ndev;         /* devices 0..ndev-1, at most SCHED_MAX_NODE_DEVICES */
    uint64_t busy;    /* bit d set: device d is held by a running attempt */
    enum sched_node_state state;
    const char *gpu_type; /* borrowed; api/gpu_types.h name ("H100-SXM", "cpu"); NULL: "" */
    /* NVLink islands: device masks, each device in at most one; nislands 0: none
     * reported (no NVLink, or unknown): the node is one domain. Borrowed. */
    const uint64_t *islands;
    int nislands;
    /* admin-set pool (NULL or "": none) and labels (nlabels key/value pairs); borrowed */
    const char *pool;
    const char *const *label_keys;
    const char *const *label_vals;
    int nlabels;
    int cc; /* the gpu_type's compute capability x10 (api/gpu_types.h); 0: unknown, cpu */
};

struct sched_quota {
    const char *tenant; /* borrowed; matched against sched_job.tenant */
    int max_gpus;       /* <= 0: unlimited */
    int used_gpus;      /* devices held now by the tenant's running attempts */
    const char *name;   /* shown in pending reasons (NULL: the tenant id) */
    int max_running;    /* QoS max_running_jobs: jobs running at once; <= 0: unlimited */
    int running;        /* the tenant's jobs holding an attempt now */
};

struct sched_cluster {
    const struct sched_node *nodes;
    int nnodes;
    const struct sched_quota *quotas; /* tenants not listed have no limit */
    int nquotas;
};

struct sched_job {
    const char *id;               /* borrowed */
    const char *tenant;           /* borrowed */
    const char *kind;             /* "cuda" or "cpu": only nodes of that kind qualify */
    int priority;                 /* higher runs first */
    int64_t submit_ms;            /* earlier runs first at equal priority */
    int world;                    /* ranks = devices needed (dp*tp*pp) */
    int tp;                       /* tensor-parallel group size; divides world */
    int max_per_node;             /* cap on ranks per node (0: none) */
    int avoid_node;               /* index of a node to avoid (the one its last attempt failed
                                     on), used only if avoiding it costs no extra node; -1: none */
    const char *const *gpu_types; /* acceptable node gpu_types, in preference order; borrowed */
    int ngpu_types;               /* 0: any type */
    int allow_mixed;              /* 1: ranks may sit on nodes of different types */
    double fair_usage;            /* the tenant's decayed GPU-hours (fair share); 0: none */
    const char *pool;             /* resources.pool; NULL or "": any node */
    const char *const *sel_keys;  /* resources.labels: nsel key/value pairs every node must hold */
    const char *const *sel_vals;
    int nsel;
    /* > 0: only nodes with at least this compute capability (x10, sched_node.cc)
     * qualify: train.precision fp8 asks GPU_FP8_MIN_CC (api/gpu_types.h) */
    int min_cc;
};

struct sched_rank {
    int node;   /* index into sched_cluster.nodes */
    int device; /* device index on that node */
};

struct sched_decision {
    int placed;                    /* 1: start now on `ranks` */
    struct sched_rank *ranks;      /* world entries (rank order) when placed; owned */
    int reserved;                  /* 1: this job is the backfill head holding a reservation */
    char reason[SCHED_REASON_LEN]; /* pending reason when not placed */
    int cross_island;              /* placed: tp groups spanning NVLink islands (tp > island) */
};

/* Decide placements for `jobs` (any order). `out` has njobs entries, filled in
 * the same order as `jobs`. Returns the number of jobs placed, or -1 when out
 * of memory. Free with sched_decisions_free. Any thread; no shared state. */
int sched_place(const struct sched_cluster *c, const struct sched_job *jobs, int njobs,
                struct sched_decision *out);
void sched_decisions_free(struct sched_decision *d, int n); /* accepts NULL */

/* 1 when node n carries the job's pool and every label it selects. Pure. */
int sched_selector_ok(const struct sched_node *n, const struct sched_job *j);

/* NVLink islands of a node from its pairwise links: linked is an n x n
 * row-major matrix (nonzero: NVLink between devices a and b, either
 * direction counts), n <= SCHED_MAX_NODE_DEVICES. Writes the connected
 * components (device masks, ordered by lowest device; devices without a link
 * are islands of one) into out[n] and returns their count, or 0 when no pair
 * is linked (the node is one PCIe domain: no island constraint). Pure. */
int sched_islands(int n, const unsigned char *linked, uint64_t *out);

#endif
