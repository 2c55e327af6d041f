/* Attempt lifecycle and failure handling: the cluster module's start/stop,
 * the scheduler loop, and the store mirror of nodes and attempts.
 *
 * One loop pass: read the non-terminal jobs (a consistent snapshot), then
 * under the cluster mutex decide everything (node loss, rank failures, hangs,
 * successes, cancels, placements, pending reasons) into a list of store
 * changes, then apply them in one durable write outside the mutex. Only this
 * thread changes job states for scheduling, so decisions never race. */
#define _GNU_SOURCE
#include "daemon/attempts.h"

#include "common/buf.h"
#include "common/log.h"
#include "common/token.h"
#include "daemon/auth.h"
#include "daemon/loomd.h"
#include "daemon/nodecheck.h"
#include "daemon/sched.h"
#include "daemon/store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- snapshot of the jobs the loop cares about ---- */

struct jobinfo {
    char id[24];
    char tenant_id[24];
    enum job_state state;
    int attempt, priority, max_retries, world;
    int tp, per_node;
    char kind[8];
    int64_t created_at;
    int64_t queued_since; /* submit, or the retry's transition back to queued */
    char *out_dir, *pending;
};

struct snapshot {
    struct jobinfo *jobs;
    int n, cap;
    struct sched_quota *quotas;
    char (*quota_tenants)[24];
    char (*quota_names)[64];
    int nq;
};

static void snapshot_free(struct snapshot *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->jobs[i].out_dir);
        free(s->jobs[i].pending);
    }
    free(s->jobs);
    free(s->quotas);
    free(s->quota_tenants);
    free(s->quota_names);
    memset(s, 0, sizeof *s);
}

static int snap_job(const struct store_job *j, void *arg) {
    struct snapshot *s = arg;
    if (BUF_GROW(s->jobs, s->cap, s->n + 1, 64) != 0) return -1;
    struct jobinfo *ji = &s->jobs[s->n];
    memset(ji, 0, sizeof *ji);
    snprintf(ji->id, sizeof ji->id, "%s", j->id);
    snprintf(ji->tenant_id, sizeof ji->tenant_id, "%s", j->tenant_id);
    ji->state = j->state;
    ji->attempt = j->attempt;
    ji->priority = j->priority;
    ji->max_retries = j->max_retries;
    ji->world = j->world_size;
    ji->created_at = j->created_at;
    ji->queued_since = j->attempt > 0 && j->updated_at > 0 ? j->updated_at : j->created_at;
    /* Placement inputs come from columns (migration 002): no spec parsing
     * per pass. The spec itself is read only for the jobs placed. */
    ji->out_dir = strdup(j->out_dir ? j->out_dir : "");
    ji->pending = j->pending_reason ? strdup(j->pending_reason) : NULL;
    ji->tp = j->tp > 0 ? j->tp : 1;
    snprintf(ji->kind, sizeof ji->kind, "%s", j->device[0] ? j->device : "cuda");
    /* gpus_per_node sizes the planner's node; for placement it caps the
     * ranks per node. */
    ji->per_node = j->gpus_per_node > 0 ? j->gpus_per_node : 0;
    s->n++;
    return 0;
}

/* Queued jobs a pass considers: the head of the queue in priority, then
 * submission order (Slurm's main scheduler likewise looks at a bounded queue
 * depth). A job further back keeps the pending reason it had; it moves up as
 * the head drains. Without the bound a pass over 100,000 queued jobs cost
 * more CPU than the API it shares the machine with. */
#define SCHED_QUEUE_DEPTH 1000

static int snapshot_read(struct store_tx *tx, void *arg) {
    struct snapshot *s = arg;
    struct store_job_filter f = {0};
    f.state_mask = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_CANCELLING);
    f.ascending = 1;
    f.limit = 100000;
    f.skip_spec = 1;
    if (store_job_foreach(tx, &f, snap_job, s) < 0) return STORE_ERR;
    f.state_mask = JOB_MASK(JOB_QUEUED);
    f.by_priority = 1;
    f.limit = SCHED_QUEUE_DEPTH;
    if (store_job_foreach(tx, &f, snap_job, s) < 0) return STORE_ERR;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT id, gpu_quota, name FROM tenants WHERE gpu_quota > 0");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int n = s->nq + 1;
        struct sched_quota *q = realloc(s->quotas, sizeof *q * (size_t)n);
        if (q) s->quotas = q;
        char(*t)[24] = realloc(s->quota_tenants, sizeof *t * (size_t)n);
        if (t) s->quota_tenants = t;
        char(*nm)[64] = realloc(s->quota_names, sizeof *nm * (size_t)n);
        if (nm) s->quota_names = nm;
        if (!q || !t || !nm) break;
        snprintf(s->quota_tenants[s->nq], 24, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(s->quota_names[s->nq], 64, "%s", (const char *)sqlite3_column_text(st, 2));
        s->quotas[s->nq].max_gpus = sqlite3_column_int(st, 1);
        s->quotas[s->nq].used_gpus = 0;
        s->nq++;
    }
    sqlite3_reset(st);
    for (int i = 0; i < s->nq; i++) {
        s->quotas[i].tenant = s->quota_tenants[i];
        s->quotas[i].name = s->quota_names[i];
    }
    return STORE_OK;
}

static struct jobinfo *snap_find(struct snapshot *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->jobs[i].id, id)) return &s->jobs[i];
    return NULL;
}

struct spec_read {
    const char *id;
    char *spec; /* out, malloc'ed */
};

static int read_spec(struct store_tx *tx, void *arg) {
    struct spec_read *r = arg;
    struct store_job j;
    memset(&j, 0, sizeof j);
    int rc = store_job_get(tx, NULL, r->id, &j);
    if (rc == STORE_OK && j.spec) r->spec = strdup(j.spec);
    store_job_clear(&j);
    return rc;
}

/* ---- store changes decided under the mutex, applied after ---- */

enum change_kind { CH_TRANSITION, CH_PENDING, CH_ATTEMPT_INSERT, CH_ATTEMPT_END, CH_USAGE };

struct change {
    enum change_kind kind;
    char job_id[24];
    unsigned from_mask;
    enum job_state to;
    int expect_attempt;
    char *text;  /* reason / pending reason / attempt end state */
    char *text2; /* pending reason on retry / placement JSON / token */
    int attempt, world;
    char tenant_id[24];
    int64_t t0, t1;
    char node[64], model[96];
    int gpus;
    double price; /* per GPU-hour for this row's model */
    int result;
};

struct changes {
    struct change *v;
    int n, cap;
    double price;
};

static struct change *ch_add(struct changes *cs, enum change_kind k, const char *job_id) {
    if (BUF_GROW(cs->v, cs->cap, cs->n + 1, 32) != 0) return NULL;
    struct change *c = &cs->v[cs->n++];
    memset(c, 0, sizeof *c);
    c->kind = k;
    c->expect_attempt = -1;
    snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
    return c;
}

static void ch_transition(struct changes *cs, const char *job_id, unsigned from, enum job_state to,
                          int expect_attempt, const char *reason, const char *pending) {
    struct change *c = ch_add(cs, CH_TRANSITION, job_id);
    if (!c) return;
    c->from_mask = from;
    c->to = to;
    c->expect_attempt = expect_attempt;
    c->text = strdup(reason);
    c->text2 = pending ? strdup(pending) : NULL;
}

static void changes_free(struct changes *cs) {
    for (int i = 0; i < cs->n; i++) {
        free(cs->v[i].text);
        free(cs->v[i].text2);
    }
    free(cs->v);
    memset(cs, 0, sizeof *cs);
}

static int apply_changes(struct store_tx *tx, void *arg) {
    struct changes *cs = arg;
    for (int i = 0; i < cs->n; i++) {
        struct change *c = &cs->v[i];
        sqlite3_stmt *st;
        switch (c->kind) {
        case CH_TRANSITION: {
            struct job_change jc = {0};
            jc.reason = c->text;
            jc.expect_attempt = c->expect_attempt;
            if (c->to == JOB_QUEUED) jc.pending_reason = c->text2;
            if (c->to == JOB_STARTING) jc.placement = c->text2;
            c->result = store_job_transition(tx, c->job_id, c->from_mask, c->to, &jc, NULL);
            break;
        }
        case CH_PENDING:
            c->result = store_job_set_pending(tx, c->job_id, c->text);
            break;
        case CH_ATTEMPT_INSERT: {
            /* Only when the placement transition just before it succeeded. */
            if (i == 0 || cs->v[i - 1].result != STORE_OK) {
                c->result = STORE_BAD_STATE;
                break;
            }
            unsigned char h[32];
            char hex[65];
            auth_hash(c->text2, h);
            for (int k = 0; k < 32; k++)
                snprintf(hex + 2 * k, 3, "%02x", h[k]);
            st = store_stmt(tx, "INSERT OR REPLACE INTO attempts (job_id, attempt, tenant_id, "
                                "state, token_hash, token, placement, world, started_at) VALUES "
                                "(?, ?, ?, 'active', ?, ?, ?, ?, ?)");
            if (!st) {
                c->result = STORE_ERR;
                break;
            }
            sqlite3_bind_text(st, 1, c->job_id, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 2, c->attempt);
            sqlite3_bind_text(st, 3, c->tenant_id, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, hex, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 5, c->text2, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 6, c->text, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 7, c->world);
            sqlite3_bind_int64(st, 8, c->t0);
            c->result = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
            sqlite3_reset(st);
            break;
        }
        case CH_ATTEMPT_END:
            st = store_stmt(tx, "UPDATE attempts SET state = ?, ended_at = ?, reason = ? WHERE "
                                "job_id = ? AND attempt = ?");
            if (!st) {
                c->result = STORE_ERR;
                break;
            }
            sqlite3_bind_text(st, 1, c->text2 ? c->text2 : "stopped", -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, c->t1);
            sqlite3_bind_text(st, 3, c->text ? c->text : "", -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, c->job_id, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 5, c->attempt);
            c->result = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
            sqlite3_reset(st);
            st = store_stmt(tx, "DELETE FROM rdzv_keys WHERE job_id = ? AND attempt = ?");
            if (st) {
                sqlite3_bind_text(st, 1, c->job_id, -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 2, c->attempt);
                sqlite3_step(st);
                sqlite3_reset(st);
            }
            break;
        case CH_USAGE: {
            st = store_stmt(tx, "INSERT INTO usage (tenant_id, job_id, attempt, node, gpu_model, "
                                "gpus, start_ms, end_ms, gpu_seconds, cost) VALUES "
                                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
            if (!st) {
                c->result = STORE_ERR;
                break;
            }
            double secs = c->gpus * (double)(c->t1 - c->t0) / 1000.0;
            if (secs < 0) secs = 0;
            sqlite3_bind_text(st, 1, c->tenant_id, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, c->job_id, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 3, c->attempt);
            sqlite3_bind_text(st, 4, c->node, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 5, c->model, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 6, c->gpus);
            sqlite3_bind_int64(st, 7, c->t0);
            sqlite3_bind_int64(st, 8, c->t1);
            sqlite3_bind_double(st, 9, secs);
            sqlite3_bind_double(st, 10, secs / 3600.0 * c->price);
            c->result = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
            sqlite3_reset(st);
            break;
        }
        }
        if (c->result != STORE_OK && c->kind != CH_TRANSITION && c->kind != CH_PENDING &&
            c->kind != CH_ATTEMPT_INSERT)
            log_warn("cluster: store change %d for job %s failed (%d)", c->kind, c->job_id,
                     c->result);
    }
    return STORE_OK;
}

/* ---- helpers ---- */

static const double hist_bounds[CL_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,    2.5,   5,    10,  60};

static void hist_observe(struct cl_hist *h, double v) {
    int b = 0;
    while (b < CL_HIST_BUCKETS && v > hist_bounds[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->n++;
}

int cluster_node_find(struct cluster *c, const char *name) {
    for (int i = 0; i < c->nnodes; i++)
        if (!strcmp(c->nodes[i].name, name)) return i;
    return -1;
}

struct cl_attempt *cluster_attempt_find(struct cluster *c, const char *job_id, int attempt) {
    for (struct cl_attempt *a = c->attempts; a; a = a->next)
        if (a->attempt == attempt && !strcmp(a->job_id, job_id)) return a;
    return NULL;
}

void cluster_changed(struct cluster *c) {
    c->gen++;
}

void cluster_version(struct cluster *c, char *buf, size_t len) {
    snprintf(buf, len, "%s:%llu", c->epoch, (unsigned long long)c->gen);
}

void cluster_kick(struct loomd *ld) {
    if (ld && ld->cluster) http_notify_signal(&ld->cluster->wake);
}

static void attempt_free(struct cl_attempt *a) {
    if (!a) return;
    free(a->spec);
    free(a->out_dir);
    free(a->ranks);
    json_decref(a->rdzv);
    json_decref(a->last_step);
    free(a);
}

void cluster_task_report(struct cluster *c, int ni, json_t *task, int64_t now) {
    const char *job = json_string_value(json_object_get(task, "job"));
    if (!job) return;
    struct cl_attempt *a =
        cluster_attempt_find(c, job, (int)json_integer_value(json_object_get(task, "attempt")));
    if (!a) return;
    int r = (int)json_integer_value(json_object_get(task, "rank"));
    if (r < 0 || r >= a->world || a->ranks[r].node != ni) return;
    struct cl_rank *rk = &a->ranks[r];
    const char *state = json_string_value(json_object_get(task, "state"));
    json_int_t step = json_integer_value(json_object_get(task, "last_step"));
    if (json_object_get(task, "last_step") && step > rk->last_step) {
        rk->last_step = (long)step;
        a->last_progress_ms = now;
    }
    if (!state || rk->state == RANK_EXITED) return;
    if (!strcmp(state, "exited")) {
        rk->state = RANK_EXITED;
        rk->exit_code = (int)json_integer_value(json_object_get(task, "exit_code"));
        rk->exited_at = json_integer_value(json_object_get(task, "exited_at_ms"));
        if (rk->exited_at <= 0) rk->exited_at = now;
        const char *why = json_string_value(json_object_get(task, "reason"));
        snprintf(rk->reason, sizeof rk->reason, "%s", why ? why : "");
    } else if (rk->state == RANK_PENDING) {
        rk->state = RANK_RUNNING;
    }
}

json_t *cluster_desired(struct cluster *c, int ni) {
    json_t *arr = json_array();
    for (struct cl_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase != ATTEMPT_ACTIVE) continue;
        for (int r = 0; r < a->world; r++) {
            struct cl_rank *rk = &a->ranks[r];
            if (rk->node != ni || rk->state == RANK_EXITED) continue;
            char rdzv[128];
            snprintf(rdzv, sizeof rdzv, "/v1/rdzv/%s/%d", a->job_id, a->attempt);
            json_t *spec = json_loads(a->spec, 0, NULL);
            json_array_append_new(
                arr,
                json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:o, s:s, s:s, s:s}", "job", a->job_id,
                          "attempt", a->attempt, "rank", r, "world", a->world, "local_rank",
                          rk->local_rank, "device", rk->device, "spec", spec ? spec : json_object(),
                          "out_dir", a->out_dir, "rdzv", rdzv, "rdzv_token", a->token));
        }
    }
    return arr;
}

static void avoid_set(struct cluster *c, const char *job, const char *node) {
    struct cl_avoid *v = c->avoid;
    while (v && strcmp(v->job_id, job))
        v = v->next;
    if (!v) {
        v = calloc(1, sizeof *v);
        if (!v) return;
        snprintf(v->job_id, sizeof v->job_id, "%s", job);
        v->next = c->avoid;
        c->avoid = v;
    }
    snprintf(v->node, sizeof v->node, "%s", node);
}

/* Node index to avoid for `job` (-1: none); forget = drop the entry. */
static int avoid_take(struct cluster *c, const char *job, int forget) {
    for (struct cl_avoid **pp = &c->avoid; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->job_id, job)) continue;
        int ni = cluster_node_find(c, (*pp)->node);
        if (forget) {
            struct cl_avoid *v = *pp;
            *pp = v->next;
            free(v);
        }
        return ni;
    }
    return -1;
}

/* Does node ni's latest report (received after `after_ms`) still show the
 * rank as alive? */
static int node_shows_alive(struct cl_node *n, const char *job, int attempt, int rank) {
    size_t i;
    json_t *t;
    json_array_foreach(n->tasks, i, t) {
        const char *j = json_string_value(json_object_get(t, "job"));
        const char *st = json_string_value(json_object_get(t, "state"));
        if (j && !strcmp(j, job) && json_integer_value(json_object_get(t, "attempt")) == attempt &&
            json_integer_value(json_object_get(t, "rank")) == rank && st &&
            strcmp(st, "exited") != 0)
            return 1;
    }
    return 0;
}

static void stop_attempt(struct cluster *c, struct cl_attempt *a, int64_t now, const char *reason,
                         int outcome) {
    if (a->phase == ATTEMPT_STOPPING) return;
    a->phase = ATTEMPT_STOPPING;
    a->stop_ms = now;
    a->outcome = outcome;
    snprintf(a->stop_reason, sizeof a->stop_reason, "%s", reason);
    cluster_changed(c);
    log_info("cluster: stopping attempt %d of job %s: %s", a->attempt, a->job_id, reason);
}

/* A failed attempt: stop it everywhere and retry or fail the job. */
static void fail_attempt(struct cluster *c, struct changes *cs, struct cl_attempt *a,
                         const struct jobinfo *j, int64_t now, const char *why, int no_retry) {
    char reason[512], pending[300];
    unsigned from = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING);
    stop_attempt(c, a, now, why, -1);
    if (no_retry) {
        snprintf(reason, sizeof reason, "attempt %d failed: %s; not retried", a->attempt, why);
        ch_transition(cs, a->job_id, from, JOB_FAILED, a->attempt, reason, NULL);
    } else if (j->attempt < j->max_retries) {
        snprintf(reason, sizeof reason, "attempt %d failed: %s; retrying (retry %d of %d)",
                 a->attempt, why, j->attempt + 1, j->max_retries);
        snprintf(pending, sizeof pending, "retrying after: %.*s", 270, why);
        ch_transition(cs, a->job_id, from, JOB_QUEUED, a->attempt, reason, pending);
    } else {
        snprintf(reason, sizeof reason, "attempt %d failed: %s; no retries left (max_retries=%d)",
                 a->attempt, why, j->max_retries);
        ch_transition(cs, a->job_id, from, JOB_FAILED, a->attempt, reason, NULL);
    }
}

static void finalize_attempt(struct cluster *c, struct changes *cs, struct cl_attempt *a,
                             int64_t now, const char *end_state) {
    /* One usage row per node the attempt used. */
    for (int r = 0; r < a->world; r++) {
        int ni = a->ranks[r].node, seen_before = 0;
        for (int q = 0; q < r; q++)
            if (a->ranks[q].node == ni) seen_before = 1;
        if (seen_before) continue;
        int gpus = 0;
        for (int q = 0; q < a->world; q++)
            if (a->ranks[q].node == ni) gpus++;
        struct change *u = ch_add(cs, CH_USAGE, a->job_id);
        if (!u) break;
        snprintf(u->tenant_id, sizeof u->tenant_id, "%s", a->tenant_id);
        u->attempt = a->attempt;
        snprintf(u->node, sizeof u->node, "%s", c->nodes[ni].name);
        snprintf(u->model, sizeof u->model, "%s", c->nodes[ni].gpu_model);
        u->gpus = gpus;
        json_t *p = json_object_get(c->prices, c->nodes[ni].gpu_model);
        u->price = json_is_number(p) ? json_number_value(p) : cs->price;
        u->t0 = a->started_ms;
        u->t1 = now;
    }
    struct change *e = ch_add(cs, CH_ATTEMPT_END, a->job_id);
    if (e) {
        e->attempt = a->attempt;
        e->t1 = now;
        e->text = strdup(a->stop_reason);
        e->text2 = strdup(end_state);
    }
}

/* ---- one pass of the loop ---- */

static void loop_pass(struct loomd *ld) {
    struct cluster *c = ld->cluster;
    struct snapshot snap = {0};
    struct changes cs = {0};
    cs.price = ld->cfg.price_gpu_hour;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (store_read(ld->store, snapshot_read, &snap) != STORE_OK) {
        snapshot_free(&snap);
        return;
    }
    int64_t now = store_now_ms();
    int64_t node_timeout_ms = ld->cfg.node_timeout * 1000;
    int64_t hang_ms = ld->cfg.hang_timeout * 1000;
    int64_t start_timeout_ms = (ld->cfg.hang_timeout > 60 ? ld->cfg.hang_timeout : 60) * 1000;

    pthread_mutex_lock(&c->mu);
    uint64_t gen0 = c->gen;
    /* 1. nodes that stopped heartbeating are lost */
    for (int i = 0; i < c->nnodes; i++) {
        struct cl_node *n = &c->nodes[i];
        if (!n->lost && now - n->last_hb_ms > node_timeout_ms) {
            n->lost = 1;
            log_warn("cluster: node %s lost (no heartbeat for %.1f s)", n->name,
                     (now - n->last_hb_ms) / 1000.0);
            cluster_changed(c);
        }
    }
    /* 2. active attempts: cancel, node loss, rank exits, hangs, success */
    for (struct cl_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase != ATTEMPT_ACTIVE) continue;
        struct jobinfo *j = snap_find(&snap, a->job_id);
        if (!j || j->attempt != a->attempt || job_state_terminal(j->state)) {
            stop_attempt(c, a, now, "job is no longer running this attempt", -1);
            continue;
        }
        if (j->state == JOB_CANCELLING) {
            stop_attempt(c, a, now, "cancelled", JOB_CANCELLED);
            continue;
        }
        if (j->state == JOB_QUEUED) continue; /* placement write still pending */
        char why[300] = "";
        int running = 0, ok = 0, no_retry = 0;
        /* The rank that failed first is the cause; ranks that exit a moment
         * later usually only noticed their peer was gone. Agents see exits
         * at their 50 ms polls, so a rank killed by a signal counts as 250 ms
         * earlier: its peers' "connection lost" exits are the consequence. */
        int first = -1;
        int64_t first_key = 0;
        for (int r = 0; r < a->world; r++) {
            struct cl_rank *rk = &a->ranks[r];
            if (rk->state != RANK_EXITED || rk->exit_code == 0) continue;
            int64_t key = rk->exited_at - (rk->exit_code > 128 ? 250 : 0);
            if (first < 0 || key < first_key) {
                first = r;
                first_key = key;
            }
        }
        if (first >= 0) {
            struct cl_rank *rk = &a->ranks[first];
            avoid_set(c, a->job_id, c->nodes[rk->node].name);
            snprintf(why, sizeof why, "rank %d on node %s %s", first, c->nodes[rk->node].name,
                     rk->reason[0] ? rk->reason : "exited non-zero");
            if (rk->exit_code == 2) no_retry = 1; /* bad spec or data */
        }
        for (int r = 0; r < a->world && !why[0]; r++) {
            struct cl_rank *rk = &a->ranks[r];
            struct cl_node *n = &c->nodes[rk->node];
            if (rk->state == RANK_EXITED) {
                ok++;
            } else if (n->lost) {
                snprintf(why, sizeof why,
                         "node %s lost (no heartbeat for %ld s); rank %d was on it", n->name,
                         ld->cfg.node_timeout, r);
            } else if (rk->state == RANK_RUNNING) {
                running++;
            }
        }
        if (why[0]) {
            fail_attempt(c, &cs, a, j, now, why, no_retry);
        } else if (ok == a->world) {
            char reason[128];
            snprintf(reason, sizeof reason, "all %d ranks exited 0", a->world);
            if (!a->running)
                ch_transition(&cs, a->job_id, JOB_MASK(JOB_STARTING), JOB_RUNNING, a->attempt,
                              "all ranks started", NULL);
            ch_transition(&cs, a->job_id, JOB_MASK(JOB_RUNNING), JOB_SUCCEEDED, a->attempt, reason,
                          NULL);
            a->running = 1;
            stop_attempt(c, a, now, reason, -1);
        } else if (!a->running && running + ok == a->world) {
            char reason[160];
            snprintf(reason, sizeof reason, "all %d ranks started (%.0f ms after placement)",
                     a->world, (double)(now - a->started_ms));
            ch_transition(&cs, a->job_id, JOB_MASK(JOB_STARTING), JOB_RUNNING, a->attempt, reason,
                          NULL);
            a->running = 1;
            a->running_ms = now;
            a->last_progress_ms = now;
            hist_observe(&c->start_lat, (now - a->started_ms) / 1000.0);
        } else if (a->running && now - a->last_progress_ms > hang_ms) {
            snprintf(why, sizeof why, "no step progress for %ld s (hang timeout)",
                     (long)((now - a->last_progress_ms) / 1000));
            fail_attempt(c, &cs, a, j, now, why, 0);
        } else if (!a->running && now - a->started_ms > start_timeout_ms) {
            snprintf(why, sizeof why, "ranks did not all start within %ld s",
                     (long)(start_timeout_ms / 1000));
            fail_attempt(c, &cs, a, j, now, why, 0);
        }
    }
    /* 3. stopping attempts: release ranks; finish when all are gone */
    struct cl_attempt **pp = &c->attempts;
    while (*pp) {
        struct cl_attempt *a = *pp;
        if (a->phase != ATTEMPT_STOPPING) {
            pp = &a->next;
            continue;
        }
        int all = 1;
        for (int r = 0; r < a->world; r++) {
            struct cl_rank *rk = &a->ranks[r];
            struct cl_node *n = &c->nodes[rk->node];
            if (!rk->released && (rk->state == RANK_EXITED || n->lost ||
                                  (n->last_hb_ms > a->stop_ms + 300 &&
                                   !node_shows_alive(n, a->job_id, a->attempt, r))))
                rk->released = 1;
            if (!rk->released) all = 0;
        }
        if (!all) {
            pp = &a->next;
            continue;
        }
        const char *end = a->outcome == JOB_CANCELLED ? "cancelled" : "stopped";
        int okc = 0;
        for (int r = 0; r < a->world; r++)
            if (a->ranks[r].state == RANK_EXITED && a->ranks[r].exit_code == 0) okc++;
        if (okc == a->world)
            end = "succeeded";
        else if (a->outcome != JOB_CANCELLED && strstr(a->stop_reason, "no longer") == NULL)
            end = "failed";
        finalize_attempt(c, &cs, a, now, end);
        if (a->outcome == JOB_CANCELLED)
            ch_transition(&cs, a->job_id, JOB_MASK(JOB_CANCELLING), JOB_CANCELLED, -1,
                          "every rank stopped", NULL);
        log_info("cluster: attempt %d of job %s ended (%s): %s", a->attempt, a->job_id, end,
                 a->stop_reason);
        *pp = a->next;
        attempt_free(a);
    }
    /* 4. jobs without a live attempt: cancelling -> cancelled; orphans */
    for (int i = 0; i < snap.n; i++) {
        struct jobinfo *j = &snap.jobs[i];
        if (j->state == JOB_QUEUED) continue;
        struct cl_attempt *a = cluster_attempt_find(c, j->id, j->attempt);
        if (a) continue;
        if (j->state == JOB_CANCELLING)
            ch_transition(&cs, j->id, JOB_MASK(JOB_CANCELLING), JOB_CANCELLED, -1,
                          "no rank was running", NULL);
        else if (j->state == JOB_STARTING || j->state == JOB_RUNNING)
            ch_transition(&cs, j->id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING),
                          j->attempt < j->max_retries ? JOB_QUEUED : JOB_FAILED, j->attempt,
                          "attempt state was lost (loomd restarted without it)",
                          "retrying: attempt state was lost");
    }
    /* Avoid-node hints of jobs that ended are dropped. */
    for (struct cl_avoid **pp = &c->avoid; *pp;) {
        if (snap_find(&snap, (*pp)->job_id)) {
            pp = &(*pp)->next;
            continue;
        }
        struct cl_avoid *v = *pp;
        *pp = v->next;
        free(v);
    }
    /* 5. placement */
    struct sched_node *sn = calloc((size_t)(c->nnodes ? c->nnodes : 1), sizeof *sn);
    struct sched_job *sj = calloc((size_t)(snap.n ? snap.n : 1), sizeof *sj);
    struct sched_decision *sd = calloc((size_t)(snap.n ? snap.n : 1), sizeof *sd);
    struct jobinfo **qj = calloc((size_t)(snap.n ? snap.n : 1), sizeof *qj);
    int nq = 0;
    if (sn && sj && sd && qj) {
        for (int i = 0; i < c->nnodes; i++) {
            struct cl_node *n = &c->nodes[i];
            sn[i].name = n->name;
            sn[i].kind = n->kind;
            sn[i].ndev = n->ndev > SCHED_MAX_NODE_DEVICES ? SCHED_MAX_NODE_DEVICES : n->ndev;
            sn[i].state = n->lost || !n->seen                             ? SCHED_NODE_LOST
                          : n->drained || nodecheck_avoid(c->ld, n->name) ? SCHED_NODE_DRAINED
                                                                          : SCHED_NODE_READY;
        }
        for (struct cl_attempt *a = c->attempts; a; a = a->next)
            for (int r = 0; r < a->world; r++) {
                if (a->ranks[r].released) continue;
                if (a->ranks[r].device < 64)
                    sn[a->ranks[r].node].busy |= (uint64_t)1 << a->ranks[r].device;
                for (int q = 0; q < snap.nq; q++)
                    if (!strcmp(snap.quotas[q].tenant, a->tenant_id)) snap.quotas[q].used_gpus++;
            }
        for (int i = 0; i < snap.n; i++) {
            struct jobinfo *j = &snap.jobs[i];
            if (j->state != JOB_QUEUED || cluster_attempt_find(c, j->id, j->attempt)) continue;
            sj[nq] = (struct sched_job){j->id,       j->tenant_id,  j->kind,
                                        j->priority, j->created_at, j->world,
                                        j->tp,       j->per_node,   avoid_take(c, j->id, 0)};
            qj[nq++] = j;
        }
        struct sched_cluster cl = {sn, c->nnodes, snap.quotas, snap.nq};
        if (nq > 0 && sched_place(&cl, sj, nq, sd) >= 0) {
            for (int k = 0; k < nq; k++) {
                struct jobinfo *j = qj[k];
                if (!sd[k].placed) {
                    if (!j->pending || strcmp(j->pending, sd[k].reason)) {
                        struct change *p = ch_add(&cs, CH_PENDING, j->id);
                        if (p) p->text = strdup(sd[k].reason);
                    }
                    continue;
                }
                avoid_take(c, j->id, 1);
                struct cl_attempt *a = calloc(1, sizeof *a);
                struct cl_rank *ranks = calloc((size_t)j->world, sizeof *ranks);
                if (!a || !ranks || auth_new_token(a->token, sizeof a->token) != 0) {
                    free(a);
                    free(ranks);
                    continue;
                }
                snprintf(a->job_id, sizeof a->job_id, "%s", j->id);
                snprintf(a->tenant_id, sizeof a->tenant_id, "%s", j->tenant_id);
                a->attempt = j->attempt;
                a->world = j->world;
                a->ranks = ranks;
                struct spec_read sr = {j->id, NULL};
                store_read(ld->store, read_spec, &sr);
                a->spec = sr.spec ? sr.spec : strdup("{}");
                a->out_dir = strdup(j->out_dir);
                a->outcome = -1;
                a->started_ms = now;
                a->last_progress_ms = now;
                a->rdzv = json_object();
                json_t *pl = json_array();
                char summary[256] = "";
                size_t off = 0;
                for (int r = 0; r < j->world; r++) {
                    ranks[r].node = sd[k].ranks[r].node;
                    ranks[r].device = sd[k].ranks[r].device;
                    ranks[r].last_step = -1;
                    for (int q = 0; q < r; q++)
                        if (ranks[q].node == ranks[r].node) ranks[r].local_rank++;
                    json_array_append_new(pl, json_pack("{s:i, s:s, s:i, s:i}", "rank", r, "node",
                                                        c->nodes[ranks[r].node].name, "device",
                                                        ranks[r].device, "local_rank",
                                                        ranks[r].local_rank));
                    if ((r == 0 || ranks[r].node != ranks[r - 1].node) && off < sizeof summary)
                        off += (size_t)snprintf(summary + off, sizeof summary - off, "%s%s",
                                                r ? ", " : "", c->nodes[ranks[r].node].name);
                }
                char *pltext = json_dumps(pl, JSON_COMPACT);
                json_decref(pl);
                char reason[400];
                snprintf(reason, sizeof reason, "placed %d rank(s) on %s", j->world, summary);
                ch_transition(&cs, j->id, JOB_MASK(JOB_QUEUED), JOB_STARTING, j->attempt, reason,
                              NULL);
                cs.v[cs.n - 1].text2 = pltext;
                struct change *ins = ch_add(&cs, CH_ATTEMPT_INSERT, j->id);
                if (ins) {
                    ins->attempt = a->attempt;
                    ins->world = a->world;
                    snprintf(ins->tenant_id, sizeof ins->tenant_id, "%s", a->tenant_id);
                    ins->t0 = now;
                    ins->text = pltext ? strdup(pltext) : strdup("[]");
                    ins->text2 = strdup(a->token);
                }
                a->next = c->attempts;
                c->attempts = a;
                hist_observe(&c->queue_wait, (now - j->queued_since) / 1000.0);
                cluster_changed(c);
            }
            sched_decisions_free(sd, nq);
        }
    }
    free(sn);
    free(sj);
    free(sd);
    free(qj);
    int changed = c->gen != gen0;
    pthread_mutex_unlock(&c->mu);

    /* Publish new placements and stops at once: agents act on them while the
     * store write commits (an agent start is harmless if the write failed:
     * the next pass removes the attempt and the agent stops it). */
    if (changed) http_notify_signal(&c->assign);
    if (cs.n > 0) {
        store_write(ld->store, apply_changes, &cs);
        /* Placements whose transition failed (cancelled meanwhile): drop. */
        pthread_mutex_lock(&c->mu);
        int dropped = 0;
        for (int i = 0; i < cs.n; i++) {
            struct change *ch = &cs.v[i];
            if (ch->kind != CH_ATTEMPT_INSERT || ch->result == STORE_OK) continue;
            struct cl_attempt **ap = &c->attempts;
            while (*ap) {
                struct cl_attempt *a = *ap;
                if (a->attempt == ch->attempt && !strcmp(a->job_id, ch->job_id) &&
                    a->phase == ATTEMPT_ACTIVE) {
                    stop_attempt(c, a, now, "placement was not recorded", -1);
                    dropped = 1;
                }
                ap = &a->next;
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (dropped) http_notify_signal(&c->assign);
    }
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_lock(&c->mu);
    hist_observe(&c->sched_lat,
                 (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    pthread_mutex_unlock(&c->mu);
    changes_free(&cs);
    snapshot_free(&snap);
}

static void *loop_main(void *arg) {
    struct loomd *ld = arg;
    struct cluster *c = ld->cluster;
    uint64_t gen = http_notify_gen(&c->wake);
    while (!c->stopping) {
        loop_pass(ld);
        /* Woken by reports, submits and cancels; a pass at least every
         * second also covers timeouts (lost nodes, hangs, stop deadlines) and
         * routes that do not kick us. Not faster: a pass reads every active
         * job, and with 100,000 queued jobs a 100 ms tick took a core's worth
         * of CPU from the API (list p99 211 ms in bench_daemon). */
        http_wait(NULL, &c->wake, &gen, 1000); /* NULL: our own stop flag ends it */
    }
    return NULL;
}

/* Submits and cancels signal ld->jobs_changed; forward them to the loop's
 * own wake-up so a new job is placed at once, not at the next 100 ms tick. */
static void *forward_main(void *arg) {
    struct loomd *ld = arg;
    struct cluster *c = ld->cluster;
    uint64_t gen = http_notify_gen(&ld->jobs_changed);
    while (!c->stopping)
        if (http_wait(NULL, &ld->jobs_changed, &gen, 200) > 0) http_notify_signal(&c->wake);
    return NULL;
}

/* ---- start-up: rebuild from the store ---- */

static int load_state(struct store_tx *tx, void *arg) {
    struct cluster *c = arg;
    int64_t now = store_now_ms();
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT name, kind, devices, drained, hostname, registered_at FROM nodes");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW && c->nnodes < CL_MAX_NODES) {
        struct cl_node *n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(n->kind, sizeof n->kind, "%s", (const char *)sqlite3_column_text(st, 1));
        n->devices = json_loads((const char *)sqlite3_column_text(st, 2), 0, NULL);
        if (!json_is_array(n->devices)) {
            json_decref(n->devices);
            n->devices = json_array();
        }
        n->ndev = (int)json_array_size(n->devices);
        const char *model =
            json_string_value(json_object_get(json_array_get(n->devices, 0), "name"));
        snprintf(n->gpu_model, sizeof n->gpu_model, "%s", model ? model : n->kind);
        n->drained = sqlite3_column_int(st, 3);
        snprintf(n->hostname, sizeof n->hostname, "%s", (const char *)sqlite3_column_text(st, 4));
        n->registered_at = sqlite3_column_int64(st, 5);
        n->tasks = json_array();
        n->last_hb_ms = now; /* a grace of one node timeout to reconnect */
        n->seen = 0;
    }
    sqlite3_reset(st);
    st = store_stmt(tx, "SELECT a.job_id, a.attempt, a.tenant_id, a.token, a.placement, a.world, "
                        "a.started_at, j.spec, j.out_dir, j.state FROM attempts a JOIN jobs j ON "
                        "j.id = a.job_id WHERE a.state = 'active'");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *pl = json_loads((const char *)sqlite3_column_text(st, 4), 0, NULL);
        int world = sqlite3_column_int(st, 5);
        struct cl_attempt *a = calloc(1, sizeof *a);
        if (!a || !json_is_array(pl) || (int)json_array_size(pl) != world || world <= 0) {
            free(a);
            json_decref(pl);
            continue;
        }
        snprintf(a->job_id, sizeof a->job_id, "%s", (const char *)sqlite3_column_text(st, 0));
        a->attempt = sqlite3_column_int(st, 1);
        snprintf(a->tenant_id, sizeof a->tenant_id, "%s", (const char *)sqlite3_column_text(st, 2));
        snprintf(a->token, sizeof a->token, "%s", (const char *)sqlite3_column_text(st, 3));
        a->world = world;
        a->started_ms = sqlite3_column_int64(st, 6);
        a->spec = strdup((const char *)sqlite3_column_text(st, 7));
        a->out_dir = strdup((const char *)sqlite3_column_text(st, 8));
        const char *jstate = (const char *)sqlite3_column_text(st, 9);
        a->running = jstate && !strcmp(jstate, "running");
        a->outcome = -1;
        a->last_progress_ms = now;
        a->rdzv = json_object();
        a->ranks = calloc((size_t)world, sizeof *a->ranks);
        int bad = !a->ranks;
        for (int r = 0; !bad && r < world; r++) {
            json_t *e = json_array_get(pl, (size_t)r);
            const char *node = json_string_value(json_object_get(e, "node"));
            int ni = node ? cluster_node_find(c, node) : -1;
            if (ni < 0) {
                bad = 1;
                break;
            }
            a->ranks[r].node = ni;
            a->ranks[r].device = (int)json_integer_value(json_object_get(e, "device"));
            a->ranks[r].local_rank = (int)json_integer_value(json_object_get(e, "local_rank"));
            a->ranks[r].last_step = -1;
            /* Assume running: the agents' first reports tell the truth. */
            a->ranks[r].state = a->running ? RANK_RUNNING : RANK_PENDING;
        }
        json_decref(pl);
        if (bad) {
            attempt_free(a);
            continue;
        }
        a->next = c->attempts;
        c->attempts = a;
        log_info("cluster: resumed attempt %d of job %s (%d ranks)", a->attempt, a->job_id, world);
    }
    sqlite3_reset(st);
    st = store_stmt(tx, "SELECT k.job_id, k.attempt, k.key, k.value FROM rdzv_keys k JOIN "
                        "attempts a ON a.job_id = k.job_id AND a.attempt = k.attempt WHERE "
                        "a.state = 'active'");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        struct cl_attempt *a = cluster_attempt_find(c, (const char *)sqlite3_column_text(st, 0),
                                                    sqlite3_column_int(st, 1));
        json_t *v = json_loads((const char *)sqlite3_column_text(st, 3), JSON_DECODE_ANY, NULL);
        if (a && v) json_object_set(a->rdzv, (const char *)sqlite3_column_text(st, 2), v);
        json_decref(v);
    }
    sqlite3_reset(st);
    return STORE_OK;
}

int cluster_start(struct loomd *ld) {
    struct cluster *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->ld = ld;
    pthread_mutex_init(&c->mu, NULL);
    http_notify_init(&c->assign);
    http_notify_init(&c->rdzv);
    http_notify_init(&c->logs);
    http_notify_init(&c->wake);
    if (token_hex(c->epoch, sizeof c->epoch, 8) != 0) {
        log_error("cluster: no random bytes for the epoch");
        free(c);
        return -1;
    }
    snprintf(c->logs_dir, sizeof c->logs_dir, "%s/logs", ld->cfg.data_dir);
    if (mkdir(c->logs_dir, 0755) != 0 && errno != EEXIST) {
        log_error("cluster: cannot create %s: %s", c->logs_dir, strerror(errno));
        free(c);
        return -1;
    }
    /* Optional per-model prices; models not listed use --price-per-gpu-hour. */
    char ppath[1100];
    snprintf(ppath, sizeof ppath, "%s/gpu_prices.json", ld->cfg.data_dir);
    if (access(ppath, R_OK) == 0) {
        json_error_t jerr;
        c->prices = json_load_file(ppath, 0, &jerr);
        if (!json_is_object(c->prices)) {
            log_error("cluster: %s: expected {\"GPU model\": price per GPU-hour}: %s", ppath,
                      jerr.text);
            json_decref(c->prices);
            free(c);
            return -1;
        }
        log_info("cluster: %zu GPU model price(s) from %s", json_object_size(c->prices), ppath);
    }
    ld->cluster = c;
    if (store_read(ld->store, load_state, c) != STORE_OK) {
        log_error("cluster: cannot load nodes and attempts from the store");
        return -1;
    }
    if (pthread_create(&c->loop, NULL, loop_main, ld) != 0) {
        log_error("cluster: cannot start the scheduler loop");
        return -1;
    }
    c->loop_started = 1;
    if (pthread_create(&c->forward, NULL, forward_main, ld) != 0) {
        log_error("cluster: cannot start the submit forwarder");
        return -1;
    }
    c->forward_started = 1;
    return 0;
}

void cluster_stop(struct loomd *ld) {
    struct cluster *c = ld->cluster;
    if (!c) return;
    c->stopping = 1;
    http_notify_signal(&c->wake);
    if (c->loop_started) pthread_join(c->loop, NULL);
    if (c->forward_started) pthread_join(c->forward, NULL);
    while (c->attempts) {
        struct cl_attempt *n = c->attempts->next;
        attempt_free(c->attempts);
        c->attempts = n;
    }
    while (c->avoid) {
        struct cl_avoid *n = c->avoid->next;
        free(c->avoid);
        c->avoid = n;
    }
    for (int i = 0; i < c->nnodes; i++) {
        json_decref(c->nodes[i].devices);
        json_decref(c->nodes[i].tasks);
        json_decref(c->nodes[i].host);
    }
    json_decref(c->prices);
    http_notify_destroy(&c->assign);
    http_notify_destroy(&c->rdzv);
    http_notify_destroy(&c->logs);
    http_notify_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    free(c);
    ld->cluster = NULL;
}
