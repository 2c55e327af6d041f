/* loom-agent core: registration, heartbeats with telemetry and task states,
 * long-poll for the node's desired task set, reconciliation (start what is
 * assigned and not yet started, stop what is no longer assigned), metrics
 * and log shipping. loomd being down never stops the workers: every request
 * is retried with capped backoff and the agent re-registers when loomd
 * answers "unknown node". */
#define _GNU_SOURCE
#include "agent/agent.h"
#include "agent/artifacts.h"

#include "agent/commaddr.h"
#include "agent/cpupeak.h"
#include "agent/gpu.h"
#include "agent/nodecheck.h"
#include "agent/task.h"
#include "api/client.h"
#include "api/exit_codes.h"
#include "common/clock.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_CHUNK      (64 * 1024)
#define METRICS_MAX    20000
#define METRICS_BATCH  500
#define SHIP_PERIOD_MS 300

/* The bearer of every agent request (agent.h): the node credential loomd
 * issued at registration, else the join token. */
struct agent_cred {
    pthread_mutex_t mu;
    char token[128];
    char join[128];
    int is_node; /* token is a node credential */
    unsigned gen;
};

void agent_cred_apply(struct agent_cred *cr, struct client *cl, unsigned *seen) {
    if (!cr) return;
    pthread_mutex_lock(&cr->mu);
    if (*seen != cr->gen && client_set_token(cl, cr->token) == 0) *seen = cr->gen;
    pthread_mutex_unlock(&cr->mu);
}

static void cred_set(struct agent_cred *cr, const char *token, int is_node) {
    pthread_mutex_lock(&cr->mu);
    snprintf(cr->token, sizeof cr->token, "%s", token ? token : "");
    cr->is_node = is_node;
    cr->gen++;
    pthread_mutex_unlock(&cr->mu);
}

static int cred_is_node(struct agent_cred *cr) {
    pthread_mutex_lock(&cr->mu);
    int v = cr->is_node;
    pthread_mutex_unlock(&cr->mu);
    return v;
}

static void cred_path(const struct agent_config *cfg, char *out, size_t len) {
    snprintf(out, len, "%s/node.credential", cfg->work_dir);
}

/* Keeps the credential for the next start: written to a temporary file of
 * mode 0600 and renamed into place. */
static int cred_save(const struct agent_config *cfg, const char *token) {
    char path[1200], tmp[1300];
    cred_path(cfg, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = NULL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) f = fdopen(fd, "w");
    if (!f) {
        if (fd >= 0) close(fd);
        log_error("cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    int ok = fprintf(f, "%s\n", token) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        log_error("cannot store the node credential in %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void cred_load(const struct agent_config *cfg, struct agent_cred *cr) {
    char path[1200], tok[128] = "";
    cred_path(cfg, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(tok, sizeof tok, f)) tok[0] = 0;
        fclose(f);
        tok[strcspn(tok, "\r\n")] = 0;
    }
    if (tok[0])
        cred_set(cr, tok, 1);
    else
        cred_set(cr, cr->join, 0);
}

/* Shared by the main thread and the poll thread, reference counted: at
 * shutdown the main thread does not wait for a long-poll in flight (up to
 * --poll-wait-ms); the poll thread keeps its reference and copies of the
 * settings it needs, and the last one out frees. */
struct agent_desired {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when a new desired set arrives */
    int refs;
    char *coordinator, *name;
    struct agent_cred cred;
    long poll_wait_ms, retry_max_ms;
    json_t *tasks; /* array from the last assignments reply; NULL before the first */
    char version[128];
    int generation; /* bumped on every new reply */
    int need_register;
    int registered;
    volatile sig_atomic_t *stop;
};

struct agent {
    const struct agent_config *cfg;
    struct gpu_inv *inv;
    struct client *cl; /* main thread */
    unsigned cred_seen;
    int pending_logged;
    struct task *tasks;
    json_t *metrics; /* queued metric items */
    struct agent_desired *d;
    int seen_generation;
    json_t *desired; /* main thread's copy */
    int64_t next_hb_ms, next_ship_ms, next_register_ms;
    long backoff_ms;
    int hb_now;
    struct agent_artifacts *arts; /* artifact server (agent/artifacts.h), NULL: off */
    char artifact_url[300];       /* its URL, reported at registration */
    struct comm_addr comm;        /* where this node's workers listen, chosen at registration */
    double cpu_peak_gflops;       /* one cpu device's fp32 GEMM peak (agent/cpupeak.h), 0: none */
};

static const char *state_name(enum task_state s) {
    return s == TASK_RUNNING ? "running" : s == TASK_STOPPING ? "stopping" : "exited";
}

static json_t *task_json(const struct task *t, int64_t now) {
    json_t *o =
        json_pack("{s:s, s:i, s:i, s:s, s:i, s:b, s:I}", "job", t->job, "attempt", t->attempt,
                  "rank", t->rank, "state", state_name(t->state), "pid", (int)t->pid, "adopted",
                  t->adopted, "last_step", (json_int_t)t->last_step);
    if (t->last_step_ms > 0)
        json_object_set_new(o, "step_age_ms", json_integer((json_int_t)(now - t->last_step_ms)));
    if (t->state == TASK_EXITED) {
        json_object_set_new(o, "exit_code", json_integer(t->exit_code));
        json_object_set_new(o, "reason", json_string(t->exit_reason));
        json_object_set_new(o, "summary", json_boolean(t->summary_seen));
        if (t->exited_wall_ms > 0)
            json_object_set_new(o, "exited_at_ms", json_integer((json_int_t)t->exited_wall_ms));
    }
    return o;
}

static json_t *tasks_json(struct agent *a) {
    json_t *arr = json_array();
    int64_t now = clock_mono_ms();
    for (struct task *t = a->tasks; t; t = t->next)
        json_array_append_new(arr, task_json(t, now));
    return arr;
}

/* ---- registration and heartbeat (main thread) ---- */

/* Chooses the workers' listen address from this end of the connection to
 * loomd (a request first when none was made yet) and the overrides. */
static void choose_comm_addr(struct agent *a) {
    char err[256];
    if (!client_local_ip(a->cl)[0]) {
        long status = 0;
        json_t *reply = NULL;
        if (client_request(a->cl, "GET", "/healthz", NULL, &status, &reply, NULL, err,
                           sizeof err) != 0)
            log_debug("healthz: %s", err);
        json_decref(reply);
    }
    struct comm_addr prev = a->comm;
    if (commaddr_choose(a->cfg->comm_iface, a->cfg->comm_host, client_local_ip(a->cl), &a->comm,
                        err, sizeof err) != 0)
        log_warn("%s; workers keep their own default", err);
    if (strcmp(prev.addr, a->comm.addr) || strcmp(prev.iface, a->comm.iface))
        log_info("workers listen on %s (interface %s, from %s)",
                 a->comm.addr[0] ? a->comm.addr : "their default",
                 a->comm.iface[0] ? a->comm.iface : "?", a->comm.why);
}

static int do_register(struct agent *a) {
    choose_comm_addr(a);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    long long mem_kib = 0;
    FILE *mf = fopen("/proc/meminfo", "r");
    if (mf) {
        if (fscanf(mf, "MemTotal: %lld", &mem_kib) != 1) mem_kib = 0;
        fclose(mf);
    }
    json_t *body = json_pack(
        "{s:s, s:s, s:s, s:o, s:o, s:s, s:{s:I, s:I, s:s}, s:o}", "node", a->cfg->name, "hostname",
        host, "kind", gpu_inv_kind(a->inv), "devices", gpu_inv_telemetry(a->inv), "tasks",
        tasks_json(a), "version", "0.1", "host", "cpus", (json_int_t)sysconf(_SC_NPROCESSORS_ONLN),
        "mem_total_mib", (json_int_t)(mem_kib / 1024), "interconnect", a->cfg->interconnect,
        "inventory", gpu_inv_inventory(a->inv));
    if (a->artifact_url[0])
        json_object_set_new(body, "artifacts",
                            json_pack("{s:s, s:s}", "url", a->artifact_url, "token",
                                      agent_artifacts_token(a->arts)));
    json_object_set_new(body, "comm_addr", json_string(a->comm.addr));
    json_object_set_new(body, "comm_iface", json_string(a->comm.iface));
    if (a->cpu_peak_gflops > 0)
        json_object_set_new(body, "cpu_peak_gflops", json_real(a->cpu_peak_gflops));
    long status = 0;
    json_t *reply = NULL;
    char err[512];
    struct agent_cred *cr = &a->d->cred;
    agent_cred_apply(cr, a->cl, &a->cred_seen);
    int by_node = cred_is_node(cr);
    int rc = client_request(a->cl, "POST", "/v1/agent/register", body, &status, &reply, NULL, err,
                            sizeof err);
    json_decref(body);
    const char *cred = json_string_value(json_object_get(reply, "credential"));
    if (rc == 0 && (status == 200 || status == 202) && cred) {
        /* Issued at the first registration with the join token; valid once approved. */
        if (cred_save(a->cfg, cred) != 0)
            log_warn("the node credential is kept in memory only: a restarted agent must be "
                     "approved again");
        cred_set(cr, cred, 1);
    }
    if (rc == 0 && status == 202) {
        if (!a->pending_logged)
            log_warn("node %s is pending: waiting for an admin to approve it (loomctl node-approve "
                     "%s)",
                     a->cfg->name, a->cfg->name);
        a->pending_logged = 1;
        json_decref(reply);
        return 1;
    }
    if (rc == 0 && status == 401 && by_node) {
        /* Revoked (or a loomd that lost its store): apply again with the join token. */
        log_error("register: loomd refused the node credential of %s (revoked?); applying "
                  "again with the join token",
                  a->cfg->name);
        char path[1200];
        cred_path(a->cfg, path, sizeof path);
        unlink(path);
        cred_set(cr, cr->join, 0);
        a->pending_logged = 0;
        json_decref(reply);
        return -1;
    }
    if (rc != 0 || status != 200) {
        if (rc != 0)
            log_warn("register: %s", err);
        else
            log_warn("register: HTTP %ld %s", status,
                     client_error_message(reply) ? client_error_message(reply) : "");
        json_decref(reply);
        return -1;
    }
    a->pending_logged = 0;
    log_info("registered as node %s with %d %s device(s)", a->cfg->name, gpu_inv_count(a->inv),
             gpu_inv_kind(a->inv));
    /* Exits the new loomd has just been told about count as reported. */
    for (struct task *t = a->tasks; t; t = t->next)
        if (t->state == TASK_EXITED) t->final_reported = 1;
    json_decref(reply);
    return 0;
}

static void do_heartbeat(struct agent *a) {
    json_t *body = json_pack("{s:s, s:o, s:o}", "node", a->cfg->name, "devices",
                             gpu_inv_telemetry(a->inv), "tasks", tasks_json(a));
    long status = 0;
    json_t *reply = NULL;
    char err[512];
    agent_cred_apply(&a->d->cred, a->cl, &a->cred_seen);
    int rc = client_request(a->cl, "POST", "/v1/agent/heartbeat", body, &status, &reply, NULL, err,
                            sizeof err);
    json_decref(body);
    if (rc != 0) {
        log_debug("heartbeat: %s", err);
    } else if (status == 404 || status == 401 || status == 403) {
        log_warn("heartbeat: loomd refused node %s (HTTP %ld %s); re-registering", a->cfg->name,
                 status, client_error_message(reply) ? client_error_message(reply) : "");
        pthread_mutex_lock(&a->d->mu);
        a->d->registered = 0;
        pthread_mutex_unlock(&a->d->mu);
    } else if (status == 200) {
        for (struct task *t = a->tasks; t; t = t->next)
            if (t->state == TASK_EXITED) t->final_reported = 1;
    } else {
        log_warn("heartbeat: HTTP %ld", status);
    }
    json_decref(reply);
}

/* ---- long-poll thread ---- */

static void desired_release(struct agent_desired *d) {
    pthread_mutex_lock(&d->mu);
    int last = --d->refs == 0;
    pthread_mutex_unlock(&d->mu);
    if (!last) return;
    json_decref(d->tasks);
    free(d->coordinator);
    free(d->name);
    pthread_mutex_destroy(&d->cred.mu);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static void *poll_main(void *arg) {
    struct agent_desired *d = arg;
    struct client *c = client_new(d->coordinator, NULL);
    unsigned cred_seen = 0;
    if (!c) {
        desired_release(d);
        return NULL;
    }
    client_set_timeout_ms(c, d->poll_wait_ms + 10000);
    long backoff = 200;
    while (!*d->stop) {
        pthread_mutex_lock(&d->mu);
        int reg = d->registered;
        char version[128];
        snprintf(version, sizeof version, "%s", d->version);
        pthread_mutex_unlock(&d->mu);
        if (!reg) {
            clock_sleep_ms(50);
            continue;
        }
        char path[512];
        snprintf(path, sizeof path, "/v1/agent/assignments?node=%s&version=%s&wait_ms=%ld", d->name,
                 version, d->poll_wait_ms);
        long status = 0;
        json_t *reply = NULL;
        char err[512];
        agent_cred_apply(&d->cred, c, &cred_seen);
        int rc = client_request(c, "GET", path, NULL, &status, &reply, NULL, err, sizeof err);
        if (rc == 0 && status == 200 && json_is_array(json_object_get(reply, "tasks"))) {
            const char *v = json_string_value(json_object_get(reply, "version"));
            pthread_mutex_lock(&d->mu);
            json_decref(d->tasks);
            d->tasks = json_incref(json_object_get(reply, "tasks"));
            snprintf(d->version, sizeof d->version, "%s", v ? v : "");
            d->generation++;
            pthread_cond_signal(&d->cv);
            pthread_mutex_unlock(&d->mu);
            backoff = 200;
        } else {
            if (rc == 0 && (status == 404 || status == 401 || status == 403)) {
                pthread_mutex_lock(&d->mu);
                d->registered = 0;
                pthread_mutex_unlock(&d->mu);
            } else if (rc != 0) {
                log_debug("assignments: %s", err);
            } else {
                log_warn("assignments: HTTP %ld", status);
            }
            clock_sleep_ms(backoff);
            backoff = backoff * 2 > d->retry_max_ms ? d->retry_max_ms : backoff * 2;
        }
        json_decref(reply);
    }
    client_free(c);
    desired_release(d);
    return NULL;
}

/* ---- reconciliation ---- */

static struct task *find_task(struct agent *a, const char *job, int attempt, int rank) {
    for (struct task *t = a->tasks; t; t = t->next)
        if (t->attempt == attempt && t->rank == rank && !strcmp(t->job, job)) return t;
    return NULL;
}

/* The desired entry for task t, or NULL. An entry with stop_grace_ms asks
 * for the task to stop with that grace (a preempted attempt checkpoints). */
static json_t *desired_find(json_t *desired, const struct task *t) {
    size_t i;
    json_t *v;
    json_array_foreach(desired, i, v) {
        const char *job = json_string_value(json_object_get(v, "job"));
        if (job && !strcmp(job, t->job) &&
            json_integer_value(json_object_get(v, "attempt")) == t->attempt &&
            json_integer_value(json_object_get(v, "rank")) == t->rank)
            return v;
    }
    return NULL;
}

/* Cores per cpu device (at least 1), so the node's cpu ranks together use
 * each core once. 0 for GPU nodes (the worker's own default applies). */
static int cpu_threads_per_device(const struct agent *a) {
    int n = gpu_inv_count(a->inv);
    if (strcmp(gpu_inv_kind(a->inv), "cpu") != 0 || n <= 0) return 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / n) : 1;
    return t > 0 ? t : 1;
}

/* The cpu peak for MFU: --cpu-peak-gflops, else measured once now, with one
 * device's threads, by the worker's own GEMM (bounded at 2 s). */
static void set_cpu_peak(struct agent *a) {
    int threads = cpu_threads_per_device(a);
    if (a->cfg->cpu_peak_gflops > 0) {
        a->cpu_peak_gflops = a->cfg->cpu_peak_gflops;
        log_info("cpu peak: %.1f GFLOP/s per device (--cpu-peak-gflops)", a->cpu_peak_gflops);
        return;
    }
    int64_t t0 = clock_mono_ms();
    a->cpu_peak_gflops = cpupeak_measure(a->cfg->worker, threads, 2000);
    if (a->cpu_peak_gflops > 0)
        log_info("cpu peak: %.1f GFLOP/s per device (%d thread(s), measured in %lld ms)",
                 a->cpu_peak_gflops, threads, (long long)(clock_mono_ms() - t0));
}

static void start_one(struct agent *a, json_t *v, int64_t now) {
    const char *job = json_string_value(json_object_get(v, "job"));
    int attempt = (int)json_integer_value(json_object_get(v, "attempt"));
    int rank = (int)json_integer_value(json_object_get(v, "rank"));
    if (!job || json_object_get(v, "stop_grace_ms") || find_task(a, job, attempt, rank)) return;
    char dir[1024];
    struct stat st;
    task_dir_path(a->cfg->work_dir, job, attempt, rank, dir, sizeof dir);
    if (stat(dir, &st) == 0) return; /* started before (and forgotten): never twice */
    int device = (int)json_integer_value(json_object_get(v, "device"));
    char *spec = json_dumps(json_object_get(v, "spec"), JSON_COMPACT);
    /* --job-root: the job's directory is node-local, <job-root>/<job>, not
     * loomd's path (no shared storage; loomd proxies artifact downloads). */
    char local_out[1100];
    const char *out_dir = json_string_value(json_object_get(v, "out_dir"));
    if (a->cfg->job_root && *a->cfg->job_root && out_dir && *out_dir) {
        snprintf(local_out, sizeof local_out, "%s/%s", a->cfg->job_root, job);
        out_dir = local_out;
    }
    struct task_spec s = {
        .job = job,
        .attempt = attempt,
        .rank = rank,
        .world = (int)json_integer_value(json_object_get(v, "world")),
        .local_rank = (int)json_integer_value(json_object_get(v, "local_rank")),
        .device = device,
        .device_kind = gpu_inv_kind(a->inv),
        .device_uuid = gpu_inv_uuid(a->inv, device),
        .spec_json = spec ? spec : "{}",
        .out_dir = out_dir,
        .rdzv = json_string_value(json_object_get(v, "rdzv")),
        .rdzv_token = json_string_value(json_object_get(v, "rdzv_token")),
        .worker = a->cfg->worker,
        .threads = cpu_threads_per_device(a),
        .cpu_peak_gflops = a->cpu_peak_gflops,
        .comm_iface = !strcmp(a->comm.why ? a->comm.why : "", "comm-iface") ? a->comm.iface : NULL,
        .comm_host = a->comm.addr,
        .comm_ifname = a->comm.iface,
        .master_addr = json_string_value(json_object_get(v, "master_addr")),
        .diag = a->cfg->diag,
    };
    if (s.out_dir && *s.out_dir) {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", s.out_dir);
        for (char *p = tmp + 1; *p; p++)
            if (*p == '/') {
                *p = 0;
                mkdir(tmp, 0755);
                *p = '/';
            }
        mkdir(tmp, 0755);
    }
    /* loomd sends the rendezvous path; workers reach loomd the way we do. */
    char rdzv_url[1024];
    if (s.rdzv && s.rdzv[0] == '/') {
        snprintf(rdzv_url, sizeof rdzv_url, "%s%s", a->cfg->coordinator, s.rdzv);
        size_t cl = strlen(a->cfg->coordinator);
        if (cl > 0 && a->cfg->coordinator[cl - 1] == '/')
            snprintf(rdzv_url, sizeof rdzv_url, "%.*s%s", (int)(cl - 1), a->cfg->coordinator,
                     s.rdzv);
        s.rdzv = rdzv_url;
    }
    struct task *t = task_start(a->cfg->work_dir, &s, now);
    free(spec);
    if (!t) {
        /* Report the failure as an exited task so loomd fails the attempt
         * instead of waiting for a rank that will never come. */
        t = calloc(1, sizeof *t);
        if (!t) return;
        snprintf(t->job, sizeof t->job, "%s", job);
        t->attempt = attempt;
        t->rank = rank;
        snprintf(t->key, sizeof t->key, "%s.%d.%d", job, attempt, rank);
        task_dir_path(a->cfg->work_dir, job, attempt, rank, t->dir, sizeof t->dir);
        t->state = TASK_EXITED;
        t->exit_code = LOOM_EXIT_UNKNOWN;
        t->last_step = -1;
        snprintf(t->exit_reason, sizeof t->exit_reason, "agent could not start the worker (%s)",
                 a->cfg->worker);
    }
    t->next = a->tasks;
    a->tasks = t;
    a->hb_now = 1;
}

/* Every byte of both log files has reached loomd. */
static int logs_shipped(const struct task *t) {
    static const char *const names[2] = {"stdout.log", "stderr.log"};
    for (int s = 0; s < 2; s++) {
        char path[1100];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", t->dir, names[s]);
        if (stat(path, &st) == 0 && st.st_size > t->ship_off[s]) return 0;
    }
    return 1;
}

static void reconcile(struct agent *a, int64_t now) {
    pthread_mutex_lock(&a->d->mu);
    if (a->d->generation != a->seen_generation && a->d->tasks) {
        json_decref(a->desired);
        a->desired = json_deep_copy(a->d->tasks);
        a->seen_generation = a->d->generation;
    }
    pthread_mutex_unlock(&a->d->mu);
    if (!a->desired) return; /* nothing known yet: touch nothing */
    size_t i;
    json_t *v;
    json_array_foreach(a->desired, i, v) start_one(a, v, now);
    struct task **pp = &a->tasks;
    while (*pp) {
        struct task *t = *pp;
        json_t *d = desired_find(a->desired, t);
        json_t *grace = d ? json_object_get(d, "stop_grace_ms") : NULL;
        int want = d && !grace;
        if (grace && t->state == TASK_RUNNING) {
            const char *why = json_string_value(json_object_get(d, "stop_reason"));
            task_stop(t, now, (int)json_integer_value(grace), why ? why : "stopped by loomd");
        }
        if (!want && t->state == TASK_RUNNING)
            task_stop(t, now, (int)a->cfg->stop_grace_ms, "no longer assigned by loomd");
        if (!want && t->state == TASK_EXITED && t->final_reported && logs_shipped(t) &&
            now - t->exited_ms > 10000) {
            *pp = t->next; /* the directory stays: logs, and the never-twice marker */
            task_free(t);
            continue;
        }
        pp = &t->next;
    }
}

/* ---- shipping ---- */

static void on_line(struct task *t, void *ud, void *obj) {
    struct agent *a = ud;
    json_t *o = obj;
    const char *type = json_string_value(json_object_get(o, "type"));
    if (!type || json_array_size(a->metrics) >= METRICS_MAX) return;
    json_array_append_new(a->metrics, json_pack("{s:s, s:i, s:i, s:O}", "job", t->job, "attempt",
                                                t->attempt, "rank", t->rank, "record", o));
}

/* Replace bytes that are not valid UTF-8 with '?', keeping the length, so
 * the text can travel in JSON and offsets still count raw bytes. */
static void utf8_sanitize(unsigned char *p, long n) {
    long i = 0;
    while (i < n) {
        int len = p[i] < 0x80         ? 1
                  : (p[i] >> 5) == 6  ? 2
                  : (p[i] >> 4) == 14 ? 3
                  : (p[i] >> 3) == 30 ? 4
                                      : 0;
        int ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80) ok = 0;
        if (!ok || (len == 1 && p[i] == 0)) {
            p[i++] = '?';
            continue;
        }
        i += len;
    }
}

static int ship(struct agent *a) {
    long status = 0;
    json_t *reply = NULL;
    char err[512];
    /* Metrics in batches small enough for loomd's body limit (a step record
     * is a few hundred bytes). */
    while (json_array_size(a->metrics) > 0) {
        size_t take = json_array_size(a->metrics) < METRICS_BATCH ? json_array_size(a->metrics)
                                                                  : METRICS_BATCH;
        json_t *items = json_array();
        for (size_t i = 0; i < take; i++)
            json_array_append(items, json_array_get(a->metrics, i));
        json_t *body = json_pack("{s:s, s:o}", "node", a->cfg->name, "items", items);
        int rc = client_request(a->cl, "POST", "/v1/agent/metrics", body, &status, &reply, NULL,
                                err, sizeof err);
        json_decref(body);
        json_decref(reply);
        reply = NULL;
        if (rc != 0 || status >= 500) return -1;
        if (status != 200) /* Rejected for good (not a transient failure): drop, don't loop. */
            log_warn("metrics batch of %zu rejected (HTTP %ld); dropped", take, status);
        /* drop the shipped head in one pass (removing index 0 one item at a
         * time moved the whole queue once per item) */
        if (take == json_array_size(a->metrics)) {
            json_array_clear(a->metrics);
        } else {
            json_t *rest = json_array();
            if (!rest) return -1;
            for (size_t i = take; i < json_array_size(a->metrics); i++)
                json_array_append(rest, json_array_get(a->metrics, i));
            json_decref(a->metrics);
            a->metrics = rest;
        }
    }
    for (struct task *t = a->tasks; t; t = t->next) {
        for (int s = 0; s < 2; s++) {
            long n = 0;
            char *buf = task_read_log(t, s, LOG_CHUNK, &n);
            if (!buf) continue;
            utf8_sanitize((unsigned char *)buf, n);
            json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:s, s:I, s:s%}", "node", a->cfg->name,
                                     "job", t->job, "attempt", t->attempt, "rank", t->rank,
                                     "stream", s == 0 ? "stdout" : "stderr", "offset",
                                     (json_int_t)t->ship_off[s], "data", buf, (size_t)n);
            free(buf);
            int rc = client_request(a->cl, "POST", "/v1/agent/logs", body, &status, &reply, NULL,
                                    err, sizeof err);
            json_decref(body);
            if (rc != 0) {
                json_decref(reply);
                return -1;
            }
            if (status == 200) {
                json_int_t size = json_integer_value(json_object_get(reply, "size"));
                t->ship_off[s] = (long)size; /* loomd's length: resync after restarts */
            } else if (status >= 400 && status < 500) {
                log_warn("task %s: log chunk rejected (HTTP %ld); skipped", t->key, status);
                t->ship_off[s] += n;
            }
            json_decref(reply);
            reply = NULL;
        }
    }
    return 0;
}

/* ---- main loop ---- */

/* One turn of the main loop: register (with backoff), poll tasks, reconcile
 * with the desired set, ship metrics and logs, heartbeat. */
static void agent_tick(struct agent *a, int64_t now) {
    const struct agent_config *cfg = a->cfg;
    agent_cred_apply(&a->d->cred, a->cl, &a->cred_seen);
    pthread_mutex_lock(&a->d->mu);
    int reg = a->d->registered;
    pthread_mutex_unlock(&a->d->mu);
    if (!reg && now >= a->next_register_ms) {
        int r = do_register(a);
        if (r == 1) { /* pending approval: ask again each heartbeat period */
            a->next_register_ms = now + cfg->heartbeat_ms;
            a->backoff_ms = 200;
        } else if (r == 0) {
            pthread_mutex_lock(&a->d->mu);
            a->d->registered = 1;
            a->d->version[0] = 0; /* fetch the desired set at once */
            pthread_mutex_unlock(&a->d->mu);
            a->backoff_ms = 200;
            a->next_hb_ms = now + cfg->heartbeat_ms;
            reg = 1;
        } else {
            a->next_register_ms = now + a->backoff_ms;
            a->backoff_ms =
                a->backoff_ms * 2 > cfg->retry_max_ms ? cfg->retry_max_ms : a->backoff_ms * 2;
        }
    }
    for (struct task *t = a->tasks; t; t = t->next) {
        task_scan_stdout(t, now, on_line, a);
        if (task_poll(t, now)) {
            task_scan_stdout(t, now, on_line, a);
            a->hb_now = 1;
        }
    }
    reconcile(a, now);
    if (reg && now >= a->next_ship_ms) {
        if (ship(a) != 0) log_debug("shipping metrics/logs failed; will retry");
        a->next_ship_ms = now + SHIP_PERIOD_MS;
    }
    if (reg && a->hb_now) {
        /* A task just exited: ship its last metrics and log bytes before
         * the heartbeat that reports the exit (and may finish the job). */
        ship(a);
        a->next_ship_ms = now + SHIP_PERIOD_MS;
    }
    if (reg && (a->hb_now || now >= a->next_hb_ms)) {
        do_heartbeat(a);
        a->hb_now = 0;
        a->next_hb_ms = now + cfg->heartbeat_ms;
    }
}

/* Sleep up to 50 ms, but wake at once for a new desired set: the
 * submit-to-start latency depends on it. */
static void wait_for_work(struct agent *a) {
    pthread_mutex_lock(&a->d->mu);
    if (a->d->generation == a->seen_generation) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 50 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&a->d->cv, &a->d->mu, &dl);
    }
    pthread_mutex_unlock(&a->d->mu);
}

int agent_run(const struct agent_config *cfg, volatile sig_atomic_t *stop) {
    struct agent a;
    memset(&a, 0, sizeof a);
    a.cfg = cfg;
    a.d = calloc(1, sizeof *a.d);
    if (!a.d) return -1;
    pthread_mutex_init(&a.d->mu, NULL);
    pthread_cond_init(&a.d->cv, NULL);
    a.d->refs = 1;
    a.d->stop = stop;
    a.d->coordinator = strdup(cfg->coordinator);
    pthread_mutex_init(&a.d->cred.mu, NULL);
    snprintf(a.d->cred.join, sizeof a.d->cred.join, "%s", cfg->join_token ? cfg->join_token : "");
    a.d->name = strdup(cfg->name);
    /* The threads' view of the config: the same, plus the shared credential. */
    struct agent_config tcfg = *cfg;
    tcfg.cred = &a.d->cred;
    cfg = &tcfg;
    a.cfg = cfg;
    a.d->poll_wait_ms = cfg->poll_wait_ms;
    a.d->retry_max_ms = cfg->retry_max_ms;
    int rc = -1;
    pthread_t poller;
    int have_poller = 0;
    struct nodecheck_agent *checks = NULL; /* node checks (agent/nodecheck.h) */

    char tasks_dir[1100];
    snprintf(tasks_dir, sizeof tasks_dir, "%s/tasks", cfg->work_dir);
    if ((mkdir(cfg->work_dir, 0755) != 0 && errno != EEXIST) ||
        (mkdir(tasks_dir, 0755) != 0 && errno != EEXIST)) {
        log_error("cannot create work dir %s: %s", cfg->work_dir, strerror(errno));
        goto out;
    }
    if (cfg->artifact_listen && *cfg->artifact_listen) {
        if (cfg->job_root && *cfg->job_root && mkdir(cfg->job_root, 0755) != 0 && errno != EEXIST)
            log_warn("cannot create job root %s: %s", cfg->job_root, strerror(errno));
        a.arts = agent_artifacts_start(cfg->artifact_listen, cfg->job_root);
        if (!a.arts) goto out;
        char host[256];
        const char *colon = strrchr(cfg->artifact_listen, ':');
        snprintf(host, sizeof host, "%.*s", (int)(colon - cfg->artifact_listen),
                 cfg->artifact_listen);
        if (!strcmp(host, "0.0.0.0")) gethostname(host, sizeof host - 1);
        snprintf(a.artifact_url, sizeof a.artifact_url, "http://%s:%d", host,
                 agent_artifacts_port(a.arts));
    }
    a.inv = gpu_inv_new((int)cfg->cpu_devices);
    cred_load(cfg, &a.d->cred);
    a.cl = client_new(cfg->coordinator, NULL);
    a.metrics = json_array();
    if (!a.inv || !a.cl || !a.metrics) goto out;
    client_set_timeout_ms(a.cl, 5000);
    if (access(cfg->worker, X_OK) != 0)
        log_warn("worker binary %s is not executable: tasks will fail to start", cfg->worker);
    else if (cpu_threads_per_device(&a) > 0)
        set_cpu_peak(&a);
    a.tasks = task_scan_dir(cfg->work_dir, cfg->adopt, clock_mono_ms());
    for (struct task *t = a.tasks; t; t = t->next) {
        t->ship_off[0] = t->ship_off[1] = 0; /* loomd tells us its length */
        if (t->state != TASK_EXITED)
            log_info("task %s: found running after restart (pid %d)", t->key, (int)t->pid);
    }
    a.d->refs++; /* the poll thread's reference */
    if (pthread_create(&poller, NULL, poll_main, a.d) != 0) {
        a.d->refs--;
        goto out;
    }
    have_poller = 1;
    checks = nodecheck_agent_start(cfg, a.inv, stop);
    a.backoff_ms = 200;

    while (!*stop) {
        agent_tick(&a, clock_mono_ms());
        wait_for_work(&a);
    }
    log_info("agent stopping; %s", "workers keep running and are re-adopted on restart");
    rc = 0;
out:
    agent_artifacts_stop(a.arts);
    if (have_poller) {
        /* Do not wait out a long-poll in flight: the thread holds its own
         * reference and frees it when its request returns. */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 300 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        if (pthread_timedjoin_np(poller, NULL, &dl) != 0) pthread_detach(poller);
    }
    nodecheck_agent_stop(checks);
    while (a.tasks) {
        struct task *n = a.tasks->next;
        task_free(a.tasks);
        a.tasks = n;
    }
    json_decref(a.metrics);
    json_decref(a.desired);
    client_free(a.cl);
    gpu_inv_free(a.inv);
    desired_release(a.d);
    return rc;
}
