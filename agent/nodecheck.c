/* Node checks on the agent (see agent/nodecheck.h): poll, run the probe
 * processes of this node's part, report. A node runs one part at a time;
 * loomd does not hand out a second check to a node while one runs. */
#include "agent/nodecheck.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/gpu.h"
#include "api/client.h"
#include "common/clock.h"
#include "common/log.h"

#define NC_POLL_WAIT_MS    10000
#define NC_PART_TIMEOUT_MS 150000
#define NC_MAX_RANKS       64

extern char **environ;

struct nodecheck_agent {
    const struct agent_config *cfg;
    const struct gpu_inv *inv;
    volatile sig_atomic_t *stop;
    struct client *cl;
    unsigned cred_seen; /* agent_cred_apply */
    char probe[PATH_MAX];
    char dir[PATH_MAX];
    pthread_t thread;
};

/* Starts one probe rank; returns its pid or -1. Runs in the check thread. */
static pid_t spawn_rank(struct nodecheck_agent *n, json_t *chk, int local, const char *uuid) {
    const char *id = json_string_value(json_object_get(chk, "id"));
    const char *rdzv = json_string_value(json_object_get(chk, "rdzv"));
    const char *token = json_string_value(json_object_get(chk, "token"));
    const char *device = json_string_value(json_object_get(chk, "device"));
    int world = (int)json_integer_value(json_object_get(chk, "world"));
    int rank = (int)json_integer_value(json_object_get(chk, "first_rank")) + local;
    char maxb[32], iters[16];
    snprintf(maxb, sizeof maxb, "%lld",
             (long long)json_integer_value(json_object_get(chk, "max_bytes")));
    snprintf(iters, sizeof iters, "%lld",
             (long long)json_integer_value(json_object_get(chk, "iters")));
    char out[PATH_MAX + 64], err[PATH_MAX + 64];
    snprintf(out, sizeof out, "%s/%s.%d.out", n->dir, id, rank);
    snprintf(err, sizeof err, "%s/%s.%d.err", n->dir, id, rank);
    /* Environment: ours minus tokens and LOOM_* job variables, plus the contract. */
    char e_rank[32], e_world[32], e_local[32], e_rdzv[1200], e_tok[160], e_cuda[160];
    snprintf(e_rank, sizeof e_rank, "LOOM_RANK=%d", rank);
    snprintf(e_world, sizeof e_world, "LOOM_WORLD=%d", world);
    snprintf(e_local, sizeof e_local, "LOOM_LOCAL_RANK=%d", local);
    snprintf(e_rdzv, sizeof e_rdzv, "LOOM_RDZV=%s%s", n->cfg->coordinator, rdzv ? rdzv : "");
    snprintf(e_tok, sizeof e_tok, "LOOM_RDZV_TOKEN=%s", token ? token : "");
    snprintf(e_cuda, sizeof e_cuda, "CUDA_VISIBLE_DEVICES=%s", uuid ? uuid : "");
    size_t ne = 0;
    while (environ[ne])
        ne++;
    const char **envp = calloc(ne + 10, sizeof *envp);
    if (!envp) return -1;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        const char *v = environ[i];
        if (!strncmp(v, "LOOM_", 5) || !strncmp(v, "CUDA_VISIBLE_DEVICES=", 21)) continue;
        envp[k++] = v;
    }
    envp[k++] = e_rank;
    envp[k++] = e_world;
    envp[k++] = e_local;
    envp[k++] = e_rdzv;
    envp[k++] = e_tok;
    envp[k++] = e_cuda;
    envp[k++] = "NCCL_NVLS_ENABLE=0";
    envp[k] = NULL;
    const char *argv[] = {
        n->probe, "--device", device ? device : "cpu", "--max-bytes", maxb, "--iters", iters, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        int fi = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fo < 0 || fe < 0 || fi < 0) _exit(127);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        execve(n->probe, (char *const *)argv, (char *const *)envp);
        static const char msg[] = "loom-agent: execve of loom-nodecheck failed\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    free(envp);
    return pid;
}

/* Reads the probe's JSON lines: "size" records into sizes, the summary or
 * error line into *summary / errbuf. */
static void read_output(const char *path, json_t *sizes, json_t **summary, char *errbuf,
                        size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        if (type && !strcmp(type, "size")) {
            json_object_del(j, "type");
            json_array_append(sizes, j);
        } else if (type && !strcmp(type, "summary")) {
            json_decref(*summary);
            *summary = json_incref(j);
        } else if (type && !strcmp(type, "error")) {
            snprintf(errbuf, errlen, "%s", json_string_value(json_object_get(j, "message")));
        }
        json_decref(j);
    }
    fclose(f);
}

/* Last line of a rank's stderr, for a failure message. */
static void tail_err(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0]) snprintf(buf, len, "%.300s", line);
    }
    fclose(f);
}

static void run_part(struct nodecheck_agent *n, json_t *chk) {
    const char *id = json_string_value(json_object_get(chk, "id"));
    int ranks = (int)json_integer_value(json_object_get(chk, "ranks"));
    int first = (int)json_integer_value(json_object_get(chk, "first_rank"));
    const char *kind = json_string_value(json_object_get(chk, "kind"));
    if (!id) return;
    char err[600] = "";
    json_t *sizes = json_array(), *summary = NULL;
    pid_t pids[NC_MAX_RANKS];
    int status[NC_MAX_RANKS], nstarted = 0, ok = 1;
    int64_t t0 = clock_mono_ms();
    if (ranks < 1 || ranks > NC_MAX_RANKS || ranks > gpu_inv_count(n->inv)) {
        snprintf(err, sizeof err, "part of %d ranks but the node has %d device(s)", ranks,
                 gpu_inv_count(n->inv));
        ok = 0;
    }
    if (ok && access(n->probe, X_OK) != 0) {
        snprintf(err, sizeof err, "probe %.500s is not executable", n->probe);
        ok = 0;
    }
    log_info("nodecheck %s: running %d rank(s) of a %s check", id, ranks, kind ? kind : "?");
    for (int r = 0; ok && r < ranks; r++) {
        const char *uuid = strcmp(gpu_inv_kind(n->inv), "cuda") ? "" : gpu_inv_uuid(n->inv, r);
        pids[r] = spawn_rank(n, chk, r, uuid);
        if (pids[r] < 0) {
            snprintf(err, sizeof err, "cannot start rank %d: %s", first + r, strerror(errno));
            ok = 0;
            break;
        }
        status[r] = -1;
        nstarted++;
    }
    /* Wait for every rank; past the timeout (or on agent stop) kill them. */
    int left = nstarted, killed = 0;
    while (left > 0) {
        for (int r = 0; r < nstarted; r++) {
            if (status[r] != -1) continue;
            int st;
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == pids[r]) {
                status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                left--;
            }
        }
        if (!left) break;
        if (!killed && (clock_mono_ms() - t0 > NC_PART_TIMEOUT_MS || *n->stop)) {
            for (int r = 0; r < nstarted; r++)
                if (status[r] == -1) kill(-pids[r], SIGKILL);
            killed = 1;
            if (!err[0])
                snprintf(err, sizeof err, "%s",
                         *n->stop ? "agent stopping" : "probe did not finish within 150 s");
        }
        clock_sleep_ms(20);
    }
    for (int r = 0; r < nstarted; r++) {
        char path[PATH_MAX + 64];
        if (first + r == 0) {
            snprintf(path, sizeof path, "%s/%s.%d.out", n->dir, id, first + r);
            read_output(path, sizes, &summary, err, sizeof err);
        }
        if (status[r] != 0) {
            ok = 0;
            if (!err[0]) {
                char tail[400] = "";
                snprintf(path, sizeof path, "%s/%s.%d.err", n->dir, id, first + r);
                tail_err(path, tail, sizeof tail);
                snprintf(err, sizeof err, "rank %d exited with %d%s%s", first + r, status[r],
                         tail[0] ? ": " : "", tail);
            }
        }
    }
    if (first == 0 && ok && !summary) {
        ok = 0;
        if (!err[0]) snprintf(err, sizeof err, "rank 0 printed no summary");
    }
    json_t *body = json_pack("{s:s, s:b, s:o, s:I}", "node", n->cfg->name, "ok", ok, "sizes", sizes,
                             "ms", (json_int_t)(clock_mono_ms() - t0));
    if (summary) json_object_set_new(body, "summary", summary);
    if (!ok) json_object_set_new(body, "error", json_string(err));
    char path[200];
    snprintf(path, sizeof path, "/v1/agent/checks/%s", id);
    for (int attempt = 0; attempt < 5 && !*n->stop; attempt++) {
        long status_code = 0;
        json_t *reply = NULL;
        char cerr[256];
        agent_cred_apply(n->cfg->cred, n->cl, &n->cred_seen);
        int rc = client_request(n->cl, "POST", path, body, &status_code, &reply, NULL, cerr,
                                sizeof cerr);
        json_decref(reply);
        if (rc == 0 && status_code < 500) {
            if (status_code >= 400)
                log_warn("nodecheck %s: loomd refused the report (HTTP %ld)", id, status_code);
            break;
        }
        clock_sleep_ms(500L << attempt);
    }
    log_info("nodecheck %s: %s in %lld ms%s%s", id, ok ? "done" : "failed",
             (long long)(clock_mono_ms() - t0), ok ? "" : ": ", ok ? "" : err);
    json_decref(body);
}

static void *thread_main(void *arg) {
    struct nodecheck_agent *n = arg;
    long backoff = 500;
    while (!*n->stop) {
        char path[256];
        snprintf(path, sizeof path, "/v1/agent/checks?node=%s&wait_ms=%d", n->cfg->name,
                 NC_POLL_WAIT_MS);
        long status = 0;
        json_t *reply = NULL;
        agent_cred_apply(n->cfg->cred, n->cl, &n->cred_seen);
        int rc = client_request(n->cl, "GET", path, NULL, &status, &reply, NULL, NULL, 0);
        if (rc != 0 || status != 200) {
            /* loomd away, not yet registered, or an older loomd without checks */
            json_decref(reply);
            for (long w = 0; w < backoff && !*n->stop; w += 100)
                clock_sleep_ms(100);
            backoff = backoff * 2 > 10000 ? 10000 : backoff * 2;
            continue;
        }
        backoff = 500;
        size_t i;
        json_t *chk;
        json_array_foreach(json_object_get(reply, "checks"), i, chk) run_part(n, chk);
        json_decref(reply);
    }
    return NULL;
}

struct nodecheck_agent *nodecheck_agent_start(const struct agent_config *cfg,
                                              const struct gpu_inv *inv,
                                              volatile sig_atomic_t *stop) {
    struct nodecheck_agent *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->cfg = cfg;
    n->inv = inv;
    n->stop = stop;
    const char *env = getenv("LOOM_NODECHECK_BIN");
    if (env && *env) {
        snprintf(n->probe, sizeof n->probe, "%s", env);
    } else {
        const char *w = cfg->worker ? cfg->worker : "";
        const char *slash = strrchr(w, '/');
        snprintf(n->probe, sizeof n->probe, "%.*sloom-nodecheck", slash ? (int)(slash - w + 1) : 0,
                 w);
    }
    snprintf(n->dir, sizeof n->dir, "%s/checks", cfg->work_dir);
    if (mkdir(n->dir, 0755) != 0 && errno != EEXIST) {
        log_warn("nodecheck: cannot create %s (%s): node checks disabled", n->dir, strerror(errno));
        free(n);
        return NULL;
    }
    n->cl = client_new(cfg->coordinator, cfg->join_token);
    if (!n->cl) {
        free(n);
        return NULL;
    }
    client_set_timeout_ms(n->cl, NC_POLL_WAIT_MS + 5000);
    if (pthread_create(&n->thread, NULL, thread_main, n) != 0) {
        client_free(n->cl);
        free(n);
        return NULL;
    }
    if (access(n->probe, X_OK) != 0)
        log_warn("nodecheck: probe %s is not executable: checks will fail", n->probe);
    return n;
}

void nodecheck_agent_stop(struct nodecheck_agent *n) {
    if (!n) return;
    pthread_join(n->thread, NULL);
    client_free(n->cl);
    free(n);
}
