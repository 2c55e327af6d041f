/* The loomd context: configuration table, start-up in dependency order
 * (data dir, store, auth, modules, HTTP) and the graceful stop in reverse. */
#include "daemon/cluster.h"
#include "daemon/events.h"
#include "daemon/nodecheck.h"
#include "daemon/webhooks.h"
#include "daemon/loomd.h"
#include "daemon/usage.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "daemon/artifacts.h"
#include "daemon/audit.h"
#include "daemon/auth.h"
#include "daemon/http.h"
#include "daemon/metrics.h"
#include "daemon/ratelimit.h"
#include "daemon/store.h"
#include "daemon/tls.h"
#include <openssl/crypto.h>

#define OFF(f)    offsetof(struct loomd_config, f)
#define UNBOUNDED 1, 0

const struct config_entry loomd_config_table[] = {
    {"listen", CONFIG_STR, OFF(listen), "127.0.0.1:8420", UNBOUNDED,
     "HOST:PORT to serve HTTP on (port 0: any free port, written to <data-dir>/loomd.addr)"},
    {"data-dir", CONFIG_STR, OFF(data_dir), "./loom-data", UNBOUNDED,
     "state directory: loom.db, admin.token, join.token"},
    {"config", CONFIG_STR, OFF(config), NULL, UNBOUNDED, "config file of 'name = value' lines"},
    {"log-level", CONFIG_STR, OFF(log_level), "info", UNBOUNDED, "debug, info, warn or error"},
    {"jobs-dir", CONFIG_STR, OFF(jobs_dir), NULL, UNBOUNDED,
     "root of job output dirs (checkpoints); default <data-dir>/jobs"},
    {"data-roots", CONFIG_STR, OFF(data_roots), "", UNBOUNDED,
     "comma-separated directories job data paths must resolve under (empty: no restriction);"
     " a tenant's own data_roots override"},
    {"max-body", CONFIG_INT, OFF(max_body), "1048576", 1024, 1073741824,
     "largest request body in bytes (413 above)"},
    {"conn-limit", CONFIG_INT, OFF(conn_limit), "2048", 4, 65536,
     "most concurrent HTTP connections (one thread each; long-polls hold one)"},
    {"conn-timeout", CONFIG_INT, OFF(conn_timeout), "120", 1, 86400,
     "seconds an idle connection is kept open"},
    {"header-timeout", CONFIG_INT, OFF(header_timeout), "10", 1, 3600,
     "seconds a new connection has to send its request line and headers"},
    {"header-limit", CONFIG_INT, OFF(header_limit), "32768", 4096, 1048576,
     "request line plus headers in bytes: each connection's buffer is this plus 20 KiB (for"
     " the reply), a head that does not fit gets 431"},
    {"stream-limit", CONFIG_INT, OFF(stream_limit), "0", 0, 65536,
     "most open log-follow streams in all (0, or more than this: conn-limit less a quarter,"
     " at least 16 connections kept for other requests)"},
    {"tenant-streams", CONFIG_INT, OFF(tenant_streams), "64", 1, 65536,
     "most open log-follow streams per tenant (429 TENANT_STREAM_LIMIT above)"},
    {"rate-limit", CONFIG_INT, OFF(rate_limit), "1000", 0, 1000000,
     "requests per second per tenant (0: unlimited); 429 above"},
    {"rate-burst", CONFIG_INT, OFF(rate_burst), "2000", 1, 10000000,
     "requests a tenant may burst above the rate"},
    {"shutdown-grace", CONFIG_INT, OFF(shutdown_grace), "10", 0, 600,
     "seconds to let in-flight requests finish on SIGTERM"},
    {"store-sync-full", CONFIG_BOOL, OFF(store_sync_full), "true", UNBOUNDED,
     "fsync every commit (synchronous=FULL); false: NORMAL (survives kill -9, not power loss)"},
    {"store-batch", CONFIG_INT, OFF(store_batch), "256", 1, 100000,
     "most writes batched into one commit"},
    {"store-read-max", CONFIG_INT, OFF(store_read_max), "32", 1, 4096,
     "most SQLite read connections open at once (more readers wait up to 5 s, then 503)"},
    {"store-read-idle", CONFIG_INT, OFF(store_read_idle), "4", 1, 4096,
     "free SQLite read connections kept open after a burst (the rest are closed)"},
    {"price-per-gpu-hour", CONFIG_DOUBLE, OFF(price_gpu_hour), "2.0", 0, 1e6,
     "price of one GPU-hour for usage and cost reports"},
    {"node-timeout", CONFIG_INT, OFF(node_timeout), "15", 1, 3600,
     "seconds without heartbeat before a node is lost"},
    {"heartbeat", CONFIG_INT, OFF(heartbeat), "2", 1, 600, "seconds between agent heartbeats"},
    {"longpoll-timeout", CONFIG_INT, OFF(longpoll_timeout), "25", 1, 600,
     "seconds a long-poll waits at most"},
    {"hang-timeout", CONFIG_INT, OFF(hang_timeout), "600", 5, 86400,
     "seconds without a training step before an attempt counts as hung"},
    {"bill-causes", CONFIG_STR, OFF(bill_causes), "user,preempted", UNBOUNDED,
     "attempt ends that are billed, comma-separated from user, preempted, node_lost, hang, "
     "infra (the others are recorded at cost 0)"},
    {"preempt-below-priority", CONFIG_INT, OFF(preempt_below), "0", 0, 101,
     "a job that does not set preemptible is preemptible when its priority is below this (0: "
     "only jobs that ask)"},
    {"preempt-min-runtime", CONFIG_INT, OFF(preempt_min_runtime), "300", 0, 86400,
     "seconds a job runs before it may be preempted (again): anti-thrash"},
    {"preempt-grace", CONFIG_INT, OFF(preempt_grace), "60", 1, 86400,
     "seconds a preempted job has to checkpoint, on top of two of its steps and its "
     "checkpoint-time estimate, before SIGKILL"},
    {"budget-warn-only", CONFIG_BOOL, OFF(budget_warn_only), "false", 1, 0,
     "a tenant past its gpu_hours_per_month gets one event per running attempt, which goes on, "
     "and may still submit (default: running jobs checkpoint and fail with BUDGET_EXHAUSTED)"},
    {"fair-share-half-life", CONFIG_INT, OFF(fair_share_half_life), "604800", 0, 315360000,
     "seconds for a tenant's past GPU-hours to weigh half in the fair-share order (0: off)"},
    {"metrics-anonymous", CONFIG_BOOL, OFF(metrics_anonymous), "true", 1, 0,
     "GET /metrics without a token serves the aggregate series (no job or tenant labels); "
     "false: 401. The full series need the admin token or a 'metrics' scoped token"},
    {"auto-approve", CONFIG_BOOL, OFF(auto_approve), "false", 1, 0,
     "approve every node that registers with the join token (tests, quickstart); else a new "
     "node is pending until POST /v1/nodes/{id}/approve"},
    {"nodecheck-on-join", CONFIG_BOOL, OFF(nodecheck_on_join), "false", 1, 0,
     "run a node check (all-reduce over its devices) when a never-checked node joins"},
    {"artifact-ttl", CONFIG_INT, OFF(artifact_ttl), "0", 0, 315360000,
     "seconds after a job ends until its checkpoints and exports are deleted (0: kept; a "
     "tenant's artifact_ttl_s, set by an admin, overrides it)"},
    {"artifact-sweep", CONFIG_INT | CONFIG_TUNING, OFF(artifact_sweep), "60", 1, 86400,
     "seconds between artifact retention sweeps"},
    {"sched-min-gap-ms", CONFIG_INT | CONFIG_TUNING, OFF(sched_min_gap_ms), "20", 0, 1000,
     "least milliseconds from the start of one scheduler pass to the next (wake-ups meanwhile "
     "wait; passes also never take more than a quarter of the time)"},
    {"events-heartbeat", CONFIG_INT, OFF(events_heartbeat), "15", 1, 3600,
     "seconds between heartbeat comments on a GET /v1/events Server-Sent Events stream"},
    {"events-fanout-threads", CONFIG_INT | CONFIG_TUNING, OFF(events_fanout_threads), "1", 1, 16,
     "threads that write Server-Sent Event streams (each holds its share of the streams)"},
    {"events-fanout-gap-ms", CONFIG_INT | CONFIG_TUNING, OFF(events_fanout_gap_ms), "10", 0, 1000,
     "least milliseconds between two passes of a fan-out thread over its streams: events that "
     "commit sooner after a pass go out together in the next one (0: a pass per commit)"},
    {"events-ring", CONFIG_INT | CONFIG_TUNING, OFF(events_ring), "4096", 16, 1000000,
     "newest events held in memory for streams and long-polls (older cursors read "
     "the store)"},
    {"webhook-allow-private", CONFIG_BOOL, OFF(webhook_allow_private), "false", 1, 0,
     "allow webhook targets on loopback, private and link-local addresses (tests, closed "
     "networks)"},
    {"webhook-timeout", CONFIG_INT, OFF(webhook_timeout), "10", 1, 300,
     "seconds one webhook delivery attempt may take (connect: at most 5)"},
    {"webhook-retry-base-ms", CONFIG_INT, OFF(webhook_retry_base_ms), "1000", 10, 3600000,
     "tuning: delay before the first webhook retry; doubles per attempt up to 1 h"},
    {"webhook-retry-for", CONFIG_INT, OFF(webhook_retry_for), "86400", 1, 2592000,
     "seconds a webhook delivery is retried before it is marked failed"},
    {"tls-cert", CONFIG_STR, OFF(tls_cert), NULL, UNBOUNDED,
     "PEM certificate (chain) file: serve HTTPS only, TLS 1.2+ (with --tls-key)"},
    {"tls-key", CONFIG_STR, OFF(tls_key), NULL, UNBOUNDED, "PEM private key file of --tls-cert"},
    {"audit-retention-days", CONFIG_INT, OFF(audit_retention_days), "90", 0, 36500,
     "days audit rows are kept (deleted at start-up and hourly; 0: forever)"},
};
const size_t loomd_config_count = sizeof loomd_config_table / sizeof *loomd_config_table;

/* Modules with their own state: one row each, started in order after the
 * store is open, stopped in reverse before it closes. */
struct loomd_module {
    const char *name;
    int (*start)(struct loomd *ld);
    void (*stop)(struct loomd *ld);
};
static const struct loomd_module modules[] = {
    {"none", NULL, NULL}, /* keeps the table non-empty */
    /* event wake-ups, then webhook delivery (waits on them): before every
     * module that changes jobs */
    {"events", events_start, events_stop},
    {"webhooks", webhooks_start, webhooks_stop},
    /* node checks (before cluster: its scheduler loop asks nodecheck_avoid) */
    {"nodecheck", nodecheck_start, nodecheck_stop},
    /* nodes, attempts, scheduler loop: daemon/cluster.h */
    {"cluster", cluster_start, cluster_stop},
    /* artifact retention (daemon/artifacts.h) */
    {"artifacts", artifacts_start, artifacts_stop},
    /* audit log retention (daemon/audit.h) */
    {"audit", audit_start, audit_stop},
};
#define NMODULES (sizeof modules / sizeof *modules)

int loomd_config_load(struct loomd *ld, int argc, char **argv) {
    memset(&ld->cfg, 0, sizeof ld->cfg);
    int rc = config_load(loomd_config_table, loomd_config_count, &ld->cfg, "loomd",
                         "loomd [--listen 127.0.0.1:8420] [--data-dir ./loom-data] "
                         "[--config FILE] [options]",
                         argc, argv, NULL, NULL);
    if (rc != 0) return rc;
    int lvl = log_level_parse(ld->cfg.log_level);
    if (lvl < 0) {
        fprintf(stderr, "loomd: --log-level '%s' is not debug|info|warn|error\n",
                ld->cfg.log_level);
        return -1;
    }
    log_init("loomd", (enum log_level)lvl);
    char bad[64];
    if (usage_policy_check(ld->cfg.bill_causes, bad, sizeof bad) != 0) {
        fprintf(stderr,
                "loomd: --bill-causes '%s': '%s' is not one of user, preempted, node_lost, hang, "
                "infra\n",
                ld->cfg.bill_causes, bad);
        return -1;
    }
    return 0;
}

static void write_addr_file(struct loomd *ld) {
    char path[PATH_MAX], line[300];
    snprintf(path, sizeof path, "%s/loomd.addr", ld->cfg.data_dir);
    char host[256];
    snprintf(host, sizeof host, "%s", ld->cfg.listen);
    char *colon = strrchr(host, ':');
    if (colon) *colon = 0;
    int n = snprintf(line, sizeof line, "%s://%s:%d\n", ld->cfg.tls_cert ? "https" : "http", host,
                     ld->port);
    if (fs_write_atomic(path, line, (size_t)n, 0644, 0) != 0)
        log_warn("loomd: cannot write %s: %s", path, strerror(errno));
}

int loomd_start(struct loomd *ld) {
    char path[PATH_MAX];
    http_notify_init(&ld->jobs_changed);
    if (fs_mkdir_p(ld->cfg.data_dir, 0700, 0) != 0) {
        log_error("loomd: cannot create data dir %s: %s", ld->cfg.data_dir, strerror(errno));
        return -1;
    }
    /* Absolute paths: agents and workers get the jobs dir in assignments. */
    char *abs = realpath(ld->cfg.data_dir, NULL);
    if (abs) {
        free(ld->cfg.data_dir);
        ld->cfg.data_dir = abs;
    }
    if (!ld->cfg.jobs_dir || !*ld->cfg.jobs_dir) {
        free(ld->cfg.jobs_dir);
        snprintf(path, sizeof path, "%s/jobs", ld->cfg.data_dir);
        ld->cfg.jobs_dir = strdup(path);
    }
    if (fs_mkdir_p(ld->cfg.jobs_dir, 0700, 0) != 0) {
        log_error("loomd: cannot create jobs dir %s: %s", ld->cfg.jobs_dir, strerror(errno));
        return -1;
    }
    ld->auth = auth_new(ld->cfg.data_dir);
    if (!ld->auth) return -1;
    snprintf(path, sizeof path, "%s/loom.db", ld->cfg.data_dir);
    struct store_options so = {.sync_full = ld->cfg.store_sync_full,
                               .max_batch = (int)ld->cfg.store_batch,
                               .read_max = (int)ld->cfg.store_read_max,
                               .read_idle = (int)ld->cfg.store_read_idle};
    ld->store = store_open(path, &so);
    if (!ld->store) return -1;
    ld->metrics = metrics_new(http_routes_count);
    ld->rl = ratelimit_new((double)ld->cfg.rate_limit, (double)ld->cfg.rate_burst);
    if (!ld->metrics || !ld->rl) return -1;
    for (size_t i = 0; i < NMODULES; i++) {
        if (modules[i].start && modules[i].start(ld) != 0) {
            log_error("loomd: module %s failed to start", modules[i].name);
            return -1;
        }
    }
    char *cert_pem = NULL, *key_pem = NULL;
    int want_tls = (ld->cfg.tls_cert && *ld->cfg.tls_cert) || (ld->cfg.tls_key && *ld->cfg.tls_key);
    if (want_tls) {
        if (!ld->cfg.tls_cert || !*ld->cfg.tls_cert || !ld->cfg.tls_key || !*ld->cfg.tls_key) {
            log_error("loomd: --tls-cert and --tls-key go together (one is missing)");
            return -1;
        }
        if (tls_load(ld->cfg.tls_cert, ld->cfg.tls_key, &cert_pem, &key_pem) != 0) return -1;
    }
    struct http_options ho = {.listen = ld->cfg.listen,
                              .max_body = ld->cfg.max_body,
                              .conn_limit = ld->cfg.conn_limit,
                              .conn_timeout_s = ld->cfg.conn_timeout,
                              .tls_cert_pem = cert_pem,
                              .tls_key_pem = key_pem,
                              .limits = {.header_timeout_s = ld->cfg.header_timeout,
                                         .header_limit = ld->cfg.header_limit,
                                         .stream_total = ld->cfg.stream_limit,
                                         .stream_per_tenant = ld->cfg.tenant_streams}};
    ld->http = http_start(ld, &ho);
    /* libmicrohttpd copies the PEM text at start. */
    free(cert_pem);
    if (key_pem) OPENSSL_cleanse(key_pem, strlen(key_pem));
    free(key_pem);
    if (!ld->http) return -1;
    ld->port = http_port(ld->http);
    write_addr_file(ld);
    log_info("loomd: listening on %s://%.*s:%d, data in %s", want_tls ? "https" : "http",
             (int)strcspn(ld->cfg.listen, ":"), ld->cfg.listen, ld->port, ld->cfg.data_dir);
    return 0;
}

void loomd_stop(struct loomd *ld) {
    http_stop(ld->http, (int)ld->cfg.shutdown_grace * 1000);
    ld->http = NULL;
    for (size_t i = NMODULES; i-- > 0;)
        if (modules[i].stop) modules[i].stop(ld);
    store_close(ld->store);
    ld->store = NULL;
    ratelimit_free(ld->rl);
    metrics_free(ld->metrics);
    auth_free(ld->auth);
    ld->rl = NULL;
    ld->metrics = NULL;
    ld->auth = NULL;
    http_notify_destroy(&ld->jobs_changed);
    config_free(loomd_config_table, loomd_config_count, &ld->cfg);
}
