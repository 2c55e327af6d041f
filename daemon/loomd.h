/* The loomd context: one struct holding the configuration and every module's
 * state, created by main and passed explicitly (no mutable globals).
 *
 * Configuration: loomd_config_table[] (daemon/loomd.c) lists every setting
 * with type, default, range and help; `loomd --help` prints it. Values come
 * from defaults < --config FILE < LOOM_<NAME> env < flags.
 *
 * Modules with state of their own (scheduler, agent registry, rendezvous...)
 * add a pointer field below and one row to the module table in loomd.c:
 * {"sched", sched_start, sched_stop}. Start functions run in table order after
 * the store is open and before HTTP serves; stop functions run in reverse order
 * after HTTP has stopped and before the store closes. */
#ifndef LOOM_DAEMON_LOOMD_H
#define LOOM_DAEMON_LOOMD_H

#include <stddef.h>

#include "common/config.h"
#include "daemon/http.h"

struct loomd_config {
    char *listen;
    char *data_dir;
    char *config;
    char *log_level;
    char *jobs_dir;       /* default <data-dir>/jobs */
    char *data_roots;     /* comma-separated allowed data roots ("" = anywhere) */
    long max_body;        /* request body cap, bytes */
    long conn_limit;      /* concurrent HTTP connections */
    long conn_timeout;    /* idle connection timeout, s */
    long header_timeout;  /* s a new connection has to send its request head */
    long header_limit;    /* bytes of request head */
    long stream_limit;    /* open streams in all (0: conn_limit less the reserve) */
    long tenant_streams;  /* open streams per tenant */
    long rate_limit;      /* per-tenant requests/s (0 = off) */
    long rate_burst;      /* per-tenant burst */
    long shutdown_grace;  /* s to finish in-flight requests on SIGTERM */
    int store_sync_full;  /* synchronous=FULL */
    long store_batch;     /* max writes per group commit */
    long store_read_max;  /* most SQLite read connections */
    long store_read_idle; /* free read connections kept */
    double price_gpu_hour;
    long node_timeout;         /* s without heartbeat before a node is lost */
    long heartbeat;            /* s between agent heartbeats (told to agents) */
    long longpoll_timeout;     /* s a long-poll waits at most */
    long hang_timeout;         /* s without a step before an attempt counts as hung */
    int metrics_anonymous;     /* GET /metrics without a token: the aggregate series */
    int auto_approve;          /* nodes joining with the join token are approved (daemon/nodes.h) */
    int nodecheck_on_join;     /* check a never-checked node when it joins (daemon/nodecheck.h) */
    long fair_share_half_life; /* s; fair-share usage decay (daemon/fairshare.h), 0: off */
    char *bill_causes;         /* --bill-causes: attempt ends billed (daemon/usage.h) */
    long preempt_below;        /* implicit preemptible below this priority (0: none) */
    long preempt_min_runtime;  /* s running before a job may be preempted */
    long preempt_grace;        /* s of SIGTERM grace for a preempted job, plus its estimate */
    int budget_warn_only;      /* over-budget running jobs warn instead of stopping */

    /* event stream and webhooks (daemon/events.h, daemon/webhooks.h) */
    long events_heartbeat;      /* s between SSE heartbeat comments */
    long artifact_ttl;          /* s after a job ends until its artifacts go (0: kept) */
    long artifact_sweep;        /* s between retention sweeps (tuning) */
    long events_ring;           /* newest events kept in memory for streams (tuning) */
    long events_fanout_threads; /* threads that write SSE streams (tuning) */
    long events_fanout_gap_ms;  /* least ms between a fan-out thread's passes (tuning) */
    long sched_min_gap_ms;      /* least ms between scheduler passes (tuning) */
    int webhook_allow_private;  /* webhook targets may be loopback/private */
    long webhook_timeout;       /* s a webhook delivery may take */
    long webhook_retry_base_ms; /* first retry delay; doubles per attempt (tuning) */
    long webhook_retry_for;     /* s after which an undelivered event is given up */
    char *tls_cert;             /* PEM certificate (chain): serve HTTPS (daemon/tls.h) */
    char *tls_key;              /* PEM private key of tls_cert */
    long audit_retention_days;  /* audit rows older than this are deleted (0: keep) */
};

extern const struct config_entry loomd_config_table[];
extern const size_t loomd_config_count;

struct store;
struct http_server;
struct metrics;
struct ratelimit;
struct auth;
struct cluster;
struct events;
struct webhooks;

struct loomd {
    struct loomd_config cfg;
    struct store *store;
    struct http_server *http;
    struct metrics *metrics;
    struct ratelimit *rl;
    struct auth *auth;
    struct cluster *cluster;     /* nodes, attempts, scheduler loop (daemon/cluster.h) */
    struct nodecheck *nodecheck; /* node checks and degraded marks (daemon/nodecheck.h) */
    struct events *events;       /* event stream wake-ups (daemon/events.h) */
    struct webhooks *webhooks;   /* webhook delivery thread (daemon/webhooks.h) */
    int port;                    /* bound port */
    /* Signalled after a job is submitted or cancelled (the scheduler and the
     * attempt supervisor wait on it with http_wait). */
    struct http_notify jobs_changed;
    /* Other modules add their state pointers here (one line each). */
    struct audit *audit;                   /* audit log retention sweep (daemon/audit.h) */
    struct artifacts_retention *retention; /* artifact TTL sweep (daemon/artifacts.h) */
};

/* Loads configuration from argv (see config.h for the return values). */
int loomd_config_load(struct loomd *ld, int argc, char **argv);
/* Opens the data dir, store, auth, modules and starts HTTP. 0 or -1 (logged). */
int loomd_start(struct loomd *ld);
/* Graceful stop: HTTP (finishing in-flight requests), modules, store. */
void loomd_stop(struct loomd *ld);

#endif
