/* loom-agent: the per-node agent. Reads its settings from the config table
 * below (defaults < --config file < LOOM_* environment < flags), then runs
 * the supervision loop in agent.c until SIGTERM/SIGINT. */
#include "agent/agent.h"

#include "api/client.h"
#include "common/config.h"
#include "common/log.h"

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

#define C(f) offsetof(struct agent_config, f)
static const struct config_entry table[] = {
    {"coordinator", CONFIG_STR, C(coordinator), "http://127.0.0.1:8420", 1, 0, "loomd base URL"},
    {"join-token", CONFIG_STR, C(join_token), NULL, 1, 0,
     "cluster join token (also LOOM_JOIN_TOKEN)"},
    {"name", CONFIG_STR, C(name), NULL, 1, 0, "node name (default: the host name)"},
    {"work-dir", CONFIG_STR, C(work_dir), "./loom-agent-data", 1, 0,
     "task directories: spec, pid file, per-rank logs"},
    {"cpu-devices", CONFIG_INT, C(cpu_devices), "0", 0, 64,
     "offer N cpu devices instead of GPUs (cpu backend, tests)"},
    {"worker", CONFIG_STR, C(worker), NULL, 1, 0,
     "worker binary (default: loom-worker beside loom-agent)"},
    {"interconnect", CONFIG_STR, C(interconnect), "unknown", 1, 0,
     "intra-node GPU interconnect reported to loomd (nvlink, pcie, none)"},
    {"heartbeat-ms", CONFIG_INT, C(heartbeat_ms), "2000", 100, 60000, "heartbeat period"},
    {"stop-grace-ms", CONFIG_INT, C(stop_grace_ms), "3000", 0, 600000,
     "SIGTERM to SIGKILL grace when stopping a worker"},
    {"poll-wait-ms", CONFIG_INT, C(poll_wait_ms), "25000", 100, 120000,
     "long-poll wait for assignments"},
    {"retry-max-ms", CONFIG_INT, C(retry_max_ms), "2000", 100, 60000,
     "cap of the retry backoff while loomd is unreachable"},
    {"adopt", CONFIG_BOOL, C(adopt), "true", 1, 0,
     "re-adopt workers found running after a restart (false: kill them)"},
    {"log-level", CONFIG_STR, C(log_level), "info", 1, 0, "debug|info|warn|error"},
    {"config", CONFIG_STR, C(config), NULL, 1, 0, "config file (name = value lines)"},
    {"ca", CONFIG_STR, C(ca), NULL, 1, 0,
     "PEM CA bundle to verify an https coordinator (also LOOM_CA; workers inherit it)"},
    {"job-root", CONFIG_STR, C(job_root), NULL, 1, 0,
     "keep job directories on this node under DIR/<job> (no storage shared with loomd)"},
    {"artifact-listen", CONFIG_STR, C(artifact_listen), NULL, 1, 0,
     "HOST:PORT to serve --job-root's artifacts to loomd (port 0: any)"},
    {"comm-iface", CONFIG_STR, C(comm_iface), NULL, 1, 0,
     "interface for worker-to-worker traffic (default: the one that reaches loomd)"},
    {"comm-host", CONFIG_STR, C(comm_host), NULL, 1, 0,
     "address workers listen on (default: this end of the connection to loomd)"},
    {"cpu-peak-gflops", CONFIG_DOUBLE, C(cpu_peak_gflops), "0", 0, 1e7,
     "fp32 peak GFLOP/s of one cpu device, for MFU (0: measure it at start, about 0.5 s)"},
    {"diag", CONFIG_BOOL, C(diag), "true", 1, 0,
     "diagnosis sampling: every rank of a job reports its step timing (LOOM_RANK_STEPS=1 to the "
     "workers); false: the workers get LOOM_DIAG=0 (no rank_step lines, no timing sync), for "
     "A/B runs"},
    {"token-cache-max-gib", CONFIG_DOUBLE, C(token_cache_max_gib), "50", 0, 1e9,
     "size cap of the staging step's token cache (LOOM_STAGE_DIR/tokens): least recently used "
     "entries no job is using are evicted past it; 0: no cap"},
};
#define NTABLE (sizeof table / sizeof *table)

int main(int argc, char **argv) {
    struct agent_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int r = config_load(table, NTABLE, &cfg, "loom-agent",
                        "--coordinator URL [--join-token T] [--name NODE] "
                        "[--work-dir DIR] [--cpu-devices N]",
                        argc, argv, NULL, NULL);
    if (r != 0) {
        config_free(table, NTABLE, &cfg);
        return r > 0 ? 0 : 2;
    }
    if (cfg.ca && *cfg.ca) setenv("LOOM_CA", cfg.ca, 1);
    {
        /* loom-stage (the worker binary, agent/stage/main.c) reads the cap from the
         * environment workers inherit */
        char cap[64];
        snprintf(cap, sizeof cap, "%.17g", cfg.token_cache_max_gib);
        setenv("LOOM_TOKEN_CACHE_MAX_GIB", cap, 1);
    }
    int lvl = log_level_parse(cfg.log_level);
    log_init("loom-agent", lvl < 0 ? LOG_INFO : (enum log_level)lvl);
    if (!cfg.name) {
        char host[256] = "node";
        gethostname(host, sizeof host - 1);
        cfg.name = strdup(host);
    }
    if (!cfg.worker) {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = 0;
            char *slash = strrchr(self, '/');
            if (slash) *slash = 0;
            size_t len = strlen(self) + 16;
            cfg.worker = malloc(len);
            if (cfg.worker) snprintf(cfg.worker, len, "%s/loom-worker", self);
        }
        if (!cfg.worker) cfg.worker = strdup("loom-worker");
    }
    if (cfg.worker[0] != '/') {
        /* Workers run in their task directory: make the path absolute. */
        char abs[PATH_MAX];
        if (realpath(cfg.worker, abs)) {
            free(cfg.worker);
            cfg.worker = strdup(abs);
        }
    }
    if (!cfg.join_token) log_warn("no join token (--join-token or LOOM_JOIN_TOKEN)");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    client_global_init();
    log_info("node %s, coordinator %s, work dir %s, worker %s", cfg.name, cfg.coordinator,
             cfg.work_dir, cfg.worker);
    int rc = agent_run(&cfg, &stop_flag);
    config_free(table, NTABLE, &cfg);
    return rc == 0 ? 0 : 1;
}
