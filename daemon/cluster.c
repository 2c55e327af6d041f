/* The cluster module: start/stop, the scheduler loop, the desired task sets,
 * and the store mirror of nodes and attempts.
 *
 * One loop pass: read the non-terminal jobs (a consistent snapshot), then
 * under the cluster mutex run its stages (pass_nodes: node loss;
 * pass_supervise: each active attempt judged by supervise_decide(), see
 * daemon/supervise.h; pass_reap: stopped attempts end; pass_orphans;
 * pass_place: sched_place) into a list of store changes, then apply them in
 * one durable write outside the mutex (pass_commit). Only this thread changes
 * job states for scheduling, so decisions never race. */
#define _GNU_SOURCE
#include "daemon/cluster.h"

#include "api/exit_codes.h"
#include "api/gpu_types.h"
#include "api/jobspec.h"
#include "common/buf.h"
#include "common/log.h"
#include "common/token.h"
#include "daemon/auth.h"
#include "daemon/budget.h"
#include "daemon/loomd.h"
#include "daemon/nodecheck.h"
#include "daemon/nodes.h"
#include "daemon/deps.h"
#include "daemon/diagnose.h"
#include "daemon/fairshare.h"
#include "daemon/preempt.h"
#include "daemon/sched.h"
#include "daemon/store.h"
#include "daemon/usage.h"

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
    int preemptions; /* attempts lost to preemption (no retry used) */
    int tp, per_node;
    char kind[8];
    int64_t created_at;
    int64_t queued_since; /* submit, or the retry's transition back to queued */
    char *out_dir, *pending;
    /* resources.gpu_type (normalized, preference order) and allow_mixed */
    char gpu_types[SCHED_MAX_JOB_TYPES][GPU_TYPE_NAME_MAX];
    const char *gpu_type_ptrs[SCHED_MAX_JOB_TYPES];
    int ngpu_types, allow_mixed;
    /* `after` (queued jobs only): DEPS_READY unless snap_deps found one */
    enum deps_verdict deps;
    char deps_reason[SCHED_REASON_LEN];
    double fair_usage;  /* the tenant's decayed GPU-hours (queued jobs; snap_fair_share) */
    struct jobsel *sel; /* resources.pool / labels (queued jobs naming one; snap_selectors) */
    int min_cc;         /* train.precision fp8: GPU_FP8_MIN_CC (snap_fp8); 0 otherwise */
};

/* A queued job's node selector: resources.pool and resources.labels. */
struct jobsel {
    char pool[JOBSPEC_POOL_MAX];
    int n;
    char keys[JOBSPEC_NODE_LABELS_MAX][JOBSPEC_LABEL_KEY_MAX];
    char vals[JOBSPEC_NODE_LABELS_MAX][JOBSPEC_LABEL_VAL_MAX];
    const char *kp[JOBSPEC_NODE_LABELS_MAX], *vp[JOBSPEC_NODE_LABELS_MAX];
};

struct snapshot {
    struct jobinfo *jobs;
    int n, cap;
    struct sched_quota *quotas;
    char (*quota_tenants)[24];
    char (*quota_names)[64];
    int nq;
    long fs_half_life_s; /* in: --fair-share-half-life (0: fair share off) */
    /* tenants with a gpu_hours_per_month (daemon/budget.h): ids and names
     * are the arrays below, used_hours their billed rows of this month */
    struct budget_tenant *budgets;
    char (*budget_ids)[24];
    char (*budget_names)[64];
    int nb;
};

static void snapshot_free(struct snapshot *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->jobs[i].out_dir);
        free(s->jobs[i].pending);
        free(s->jobs[i].sel);
    }
    free(s->jobs);
    free(s->quotas);
    free(s->quota_tenants);
    free(s->quota_names);
    free(s->budgets);
    free(s->budget_ids);
    free(s->budget_names);
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
    ji->preemptions = j->preemptions;
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

/* GPU types of the queued jobs that name resources.gpu_type or allow_mixed
 * (the snapshot reads no spec text). The partial index of schema 060 holds
 * just those jobs, so untyped queues cost no JSON parsing here. */
/* The queued job `id` of the snapshot, or NULL (beyond the queue depth). */
static struct jobinfo *snap_queued(struct snapshot *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (s->jobs[i].state == JOB_QUEUED && !strcmp(s->jobs[i].id, id)) return &s->jobs[i];
    return NULL;
}

static int snap_gpu_types(struct store_tx *tx, struct snapshot *s) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, json_extract(spec, '$.resources.gpu_type'), "
            "json_extract(spec, '$.resources.allow_mixed') FROM jobs INDEXED BY jobs_gpu_placement "
            "WHERE state = 'queued' AND (json_extract(spec, '$.resources.gpu_type') IS NOT NULL "
            "OR json_extract(spec, '$.resources.allow_mixed') = 1)");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        struct jobinfo *ji = snap_queued(s, id);
        if (!ji) continue; /* beyond the queue depth */
        const char *types = (const char *)sqlite3_column_text(st, 1);
        json_t *tj = types ? json_loads(types, JSON_DECODE_ANY, NULL) : NULL;
        ji->ngpu_types = gpu_type_list_parse(tj, ji->gpu_types, SCHED_MAX_JOB_TYPES, NULL, 0);
        if (ji->ngpu_types < 0) ji->ngpu_types = 0; /* refused at submit; not reached */
        json_decref(tj);
        ji->allow_mixed = sqlite3_column_int(st, 2) == 1;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* The queued fp8 jobs (train.precision), through the partial index of
 * schema 200: they need nodes with FP8 tensor cores. */
static int snap_fp8(struct store_tx *tx, struct snapshot *s) {
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT id FROM jobs INDEXED BY jobs_fp8 WHERE state = "
                       "'queued' AND json_extract(spec, '$.train.precision') = 'fp8'");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct jobinfo *ji = snap_queued(s, (const char *)sqlite3_column_text(st, 0));
        if (ji) ji->min_cc = GPU_FP8_MIN_CC;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* Node selectors of the queued jobs that name resources.pool or labels,
 * through the partial index of schema 160 (untyped queues parse nothing). */
static int snap_selectors(struct store_tx *tx, struct snapshot *s) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, json_extract(spec, '$.resources.pool'), "
            "json_extract(spec, '$.resources.labels') FROM jobs INDEXED BY jobs_node_selector "
            "WHERE state = 'queued' AND (json_extract(spec, '$.resources.pool') IS NOT NULL "
            "OR json_extract(spec, '$.resources.labels') IS NOT NULL)");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct jobinfo *ji = snap_queued(s, (const char *)sqlite3_column_text(st, 0));
        if (!ji) continue; /* beyond the queue depth */
        struct jobsel *js = calloc(1, sizeof *js);
        if (!js) break;
        const char *pool = (const char *)sqlite3_column_text(st, 1);
        snprintf(js->pool, sizeof js->pool, "%s", pool ? pool : "");
        const char *lt = (const char *)sqlite3_column_text(st, 2);
        json_t *labels = lt ? json_loads(lt, 0, NULL) : NULL;
        const char *k;
        json_t *v;
        json_object_foreach(labels, k, v) {
            if (js->n == JOBSPEC_NODE_LABELS_MAX || !json_is_string(v)) continue;
            snprintf(js->keys[js->n], sizeof js->keys[js->n], "%s", k);
            snprintf(js->vals[js->n], sizeof js->vals[js->n], "%s", json_string_value(v));
            js->kp[js->n] = js->keys[js->n];
            js->vp[js->n] = js->vals[js->n];
            js->n++;
        }
        json_decref(labels);
        free(ji->sel);
        ji->sel = js;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* The state of one job by id (any tenant: `after` was checked at submit to
 * name the tenant's own jobs); NULL when there is none. */
static const char *dep_state(struct store_tx *tx, const char *id, char *buf, size_t len) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT state FROM jobs WHERE id = ?");
    if (!st) return "queued"; /* unknown for now: keep waiting */
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    const char *out = NULL;
    if (sqlite3_step(st) == SQLITE_ROW) {
        snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
        out = buf;
    }
    sqlite3_reset(st);
    return out;
}

/* `after` of the queued jobs in the snapshot, decided by deps_decide(). Only
 * jobs whose spec has a non-empty `after` are read. */
static int snap_deps(struct store_tx *tx, struct snapshot *s) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT id, json_extract(spec, '$.after') FROM jobs WHERE state = 'queued' AND "
            "json_array_length(spec, '$.after') > 0");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        struct jobinfo *ji = snap_queued(s, id);
        if (!ji) continue; /* beyond the queue depth */
        json_t *after = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
        const char *ids[JOBSPEC_AFTER_MAX], *states[JOBSPEC_AFTER_MAX];
        char bufs[JOBSPEC_AFTER_MAX][16];
        int n = 0;
        size_t k;
        json_t *v;
        json_array_foreach(after, k, v) {
            if (n == JOBSPEC_AFTER_MAX || !json_is_string(v)) break;
            ids[n] = json_string_value(v);
            states[n] = dep_state(tx, ids[n], bufs[n], sizeof bufs[n]);
            n++;
        }
        ji->deps = deps_decide(ids, states, n, ji->deps_reason, sizeof ji->deps_reason);
        json_decref(after);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* Fair share: each queued job gets its tenant's decayed GPU-hours. Usage is
 * summed per tenant and hour of start in SQL (one row per tenant-hour within
 * the horizon, ordered by tenant), then each tenant's total is handed to its
 * queued jobs once. */
static void fair_assign(struct snapshot *s, const char *tenant, double usage) {
    for (int i = 0; i < s->n; i++)
        if (s->jobs[i].state == JOB_QUEUED && !strcmp(s->jobs[i].tenant_id, tenant))
            s->jobs[i].fair_usage = usage;
}

static int snap_fair_share(struct store_tx *tx, struct snapshot *s) {
    if (s->fs_half_life_s <= 0) return STORE_OK;
    int64_t now = store_now_ms();
    int64_t horizon = (int64_t)s->fs_half_life_s * 1000 * FAIRSHARE_HORIZON_HALF_LIVES;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT tenant_id, start_ms / 3600000, SUM(gpu_seconds) FROM usage "
                       "WHERE start_ms >= ? GROUP BY 1, 2 ORDER BY 1");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, now - horizon);
    char cur[24] = "";
    double sum = 0.0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *tenant = (const char *)sqlite3_column_text(st, 0);
        if (strcmp(cur, tenant)) {
            if (cur[0]) fair_assign(s, cur, sum);
            snprintf(cur, sizeof cur, "%s", tenant);
            sum = 0.0;
        }
        /* usage counts from the middle of the hour it started in */
        struct fairshare_row row = {sqlite3_column_double(st, 2) / 3600.0,
                                    sqlite3_column_int64(st, 1) * 3600000 + 1800000};
        sum += fairshare_usage(&row, 1, now, s->fs_half_life_s);
    }
    if (cur[0]) fair_assign(s, cur, sum);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* Tenants with a monthly GPU-hour budget and their billed hours of this
 * month's usage rows (the submit check's count). */
static int snap_budgets(struct store_tx *tx, struct snapshot *s) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT id, name, gpu_hours_per_month, budget_warn_only "
                                      "FROM tenants WHERE gpu_hours_per_month > 0");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int n = s->nb + 1;
        struct budget_tenant *b = realloc(s->budgets, sizeof *b * (size_t)n);
        if (b) s->budgets = b;
        char(*id)[24] = realloc(s->budget_ids, sizeof *id * (size_t)n);
        if (id) s->budget_ids = id;
        char(*nm)[64] = realloc(s->budget_names, sizeof *nm * (size_t)n);
        if (nm) s->budget_names = nm;
        if (!b || !id || !nm) break;
        snprintf(s->budget_ids[s->nb], 24, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(s->budget_names[s->nb], 64, "%s", (const char *)sqlite3_column_text(st, 1));
        s->budgets[s->nb] = (struct budget_tenant){NULL, sqlite3_column_double(st, 2), 0,
                                                   sqlite3_column_int(st, 3), 0};
        s->nb++;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return STORE_ERR;
    int64_t month0 = budget_month_start_ms(store_now_ms());
    for (int i = 0; i < s->nb; i++) {
        s->budgets[i].tenant = s->budget_ids[i];
        if (store_tenant_gpu_hours(tx, s->budget_ids[i], month0, &s->budgets[i].used_hours) !=
            STORE_OK)
            return STORE_ERR;
    }
    return STORE_OK;
}

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
    if (snap_gpu_types(tx, s) != STORE_OK) return STORE_ERR;
    if (snap_selectors(tx, s) != STORE_OK) return STORE_ERR;
    if (snap_fp8(tx, s) != STORE_OK) return STORE_ERR;
    if (snap_deps(tx, s) != STORE_OK) return STORE_ERR;
    if (snap_fair_share(tx, s) != STORE_OK) return STORE_ERR;
    if (snap_budgets(tx, s) != STORE_OK) return STORE_ERR;
    sqlite3_stmt *st = store_stmt(tx, "SELECT id, gpu_quota, name, max_running_jobs FROM tenants "
                                      "WHERE gpu_quota > 0 OR max_running_jobs > 0");
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
        s->quotas[s->nq].max_running = sqlite3_column_int(st, 3);
        s->quotas[s->nq].running = 0;
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

enum change_kind {
    CH_TRANSITION,
    CH_PENDING,
    CH_ATTEMPT_INSERT,
    CH_ATTEMPT_END,
    CH_USAGE,
    CH_NOTE /* an event row without a state change (store_job_note) */
};

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
    double price;      /* per GPU-hour for this row's model */
    const char *cause; /* usage rows: supervise_bill_cause() (static) */
    int billed;
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
        case CH_NOTE: /* a job event without a state change */
            c->result = store_job_note(tx, c->job_id, c->attempt, c->text);
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
            struct usage_row row = {.tenant_id = c->tenant_id,
                                    .job_id = c->job_id,
                                    .attempt = c->attempt,
                                    .node = c->node,
                                    .gpu_model = c->model,
                                    .gpus = c->gpus,
                                    .t0 = c->t0,
                                    .t1 = c->t1,
                                    .price = c->price,
                                    .cause = c->cause,
                                    .billed = c->billed};
            c->result = usage_insert(tx, &row);
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

static const double hist_bounds[CLUSTER_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                         0.5,   1,    2.5,   5,    10,  60};

static void hist_observe(struct cluster_hist *h, double v) {
    int b = 0;
    while (b < CLUSTER_HIST_BUCKETS && v > hist_bounds[b])
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

struct cluster_attempt *cluster_attempt_find(struct cluster *c, const char *job_id, int attempt) {
    for (struct cluster_attempt *a = c->attempts; a; a = a->next)
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

static void attempt_free(struct cluster_attempt *a) {
    if (!a) return;
    json_decref(a->spec);
    free(a->out_dir);
    free(a->ranks);
    json_decref(a->rdzv);
    json_decref(a->last_step);
    diag_free(a->diag);
    free(a);
}

void cluster_task_report(struct cluster *c, int ni, json_t *task, int64_t now) {
    const char *job = json_string_value(json_object_get(task, "job"));
    if (!job) return;
    struct cluster_attempt *a =
        cluster_attempt_find(c, job, (int)json_integer_value(json_object_get(task, "attempt")));
    if (!a) return;
    int r = (int)json_integer_value(json_object_get(task, "rank"));
    if (r < 0 || r >= a->world || a->ranks[r].node != ni) return;
    struct cluster_rank *rk = &a->ranks[r];
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
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase == ATTEMPT_STOPPING && a->stop_grace_ms > 0) {
            /* A preempted attempt: its ranks are told how long they have to
             * checkpoint (the agent never starts such an entry). */
            for (int r = 0; r < a->world; r++) {
                struct cluster_rank *rk = &a->ranks[r];
                if (rk->node != ni || rk->state == RANK_EXITED || rk->released) continue;
                json_array_append_new(arr,
                                      json_pack("{s:s, s:i, s:i, s:i, s:s}", "job", a->job_id,
                                                "attempt", a->attempt, "rank", r, "stop_grace_ms",
                                                a->stop_grace_ms, "stop_reason", a->stop_reason));
            }
            continue;
        }
        if (a->phase != ATTEMPT_ACTIVE) continue;
        for (int r = 0; r < a->world; r++) {
            struct cluster_rank *rk = &a->ranks[r];
            if (rk->node != ni || rk->state == RANK_EXITED) continue;
            char rdzv[128];
            snprintf(rdzv, sizeof rdzv, "/v1/rdzv/%s/%d", a->job_id, a->attempt);
            /* The spec is shared, not copied: nothing modifies it after the
             * attempt is made, jansson's reference counts are atomic
             * (JANSSON_THREAD_SAFE_REFCOUNT) and json_dumps() only reads
             * (its loop check is a per-call table since 2.13; Debian 12 has
             * 2.14), so replies may serialise it concurrently, after the
             * mutex is released or the attempt freed. */
            json_t *task =
                json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:O, s:s, s:s, s:s}", "job", a->job_id,
                          "attempt", a->attempt, "rank", r, "world", a->world, "local_rank",
                          rk->local_rank, "device", rk->device, "spec", a->spec, "out_dir",
                          a->out_dir, "rdzv", rdzv, "rdzv_token", a->token);
            /* rank 0's advertised address, for the workers' rendezvous */
            int n0 = a->ranks[0].node;
            if (task && n0 >= 0 && n0 < c->nnodes && c->nodes[n0].comm_addr[0])
                json_object_set_new(task, "master_addr", json_string(c->nodes[n0].comm_addr));
            json_array_append_new(arr, task);
        }
    }
    return arr;
}

static void avoid_set(struct cluster *c, const char *job, const char *node) {
    struct cluster_avoid *v = c->avoid;
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
    for (struct cluster_avoid **pp = &c->avoid; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->job_id, job)) continue;
        int ni = cluster_node_find(c, (*pp)->node);
        if (forget) {
            struct cluster_avoid *v = *pp;
            *pp = v->next;
            free(v);
        }
        return ni;
    }
    return -1;
}

/* Does node ni's latest report (received after `after_ms`) still show the
 * rank as alive? */
static int node_shows_alive(struct cluster_node *n, const char *job, int attempt, int rank) {
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

static void stop_attempt(struct cluster *c, struct cluster_attempt *a, int64_t now,
                         enum stop_cause cause, const char *reason) {
    if (a->phase == ATTEMPT_STOPPING) return;
    a->phase = ATTEMPT_STOPPING;
    a->stop_ms = now;
    a->stop_cause = cause;
    snprintf(a->stop_reason, sizeof a->stop_reason, "%.*s", (int)sizeof a->stop_reason - 1, reason);
    cluster_changed(c);
    log_info("cluster: stopping attempt %d of job %s: %s", a->attempt, a->job_id, reason);
}

static void finalize_attempt(struct cluster *c, struct changes *cs, struct cluster_attempt *a,
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
        u->cause = supervise_bill_cause(a->stop_cause);
        u->billed = usage_cause_billed(c->ld->cfg.bill_causes, u->cause);
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

/* What one pass works with: the jobs' snapshot, the store changes it
 * decides, its clock, and a scratch array for the supervisor's input. */
struct pass {
    struct loomd *ld;
    struct cluster *c;
    struct snapshot snap;
    struct changes cs;
    int64_t now;
    struct supervise_rank *ranks;
    int ranks_cap;
};

/* 1. nodes that stopped heartbeating are lost */
static void pass_nodes(struct pass *p) {
    struct cluster *c = p->c;
    for (int i = 0; i < c->nnodes; i++) {
        struct cluster_node *n = &c->nodes[i];
        if (!n->lost && supervise_node_expired(n->last_hb_ms, p->now, p->ld->cfg.node_timeout)) {
            n->lost = 1;
            log_warn("cluster: node %s lost (no heartbeat for %.1f s)", n->name,
                     (p->now - n->last_hb_ms) / 1000.0);
            cluster_changed(c);
        }
    }
}

static enum supervise_job job_view(const struct jobinfo *j, const struct cluster_attempt *a) {
    if (!j || j->attempt != a->attempt || job_state_terminal(j->state)) return SUPERVISE_JOB_GONE;
    if (j->state == JOB_CANCELLING) return SUPERVISE_JOB_CANCELLING;
    if (j->state == JOB_QUEUED) return SUPERVISE_JOB_QUEUED;
    return SUPERVISE_JOB_ACTIVE;
}

/* The supervisor's view of one attempt; in->ranks points into p->ranks.
 * -1 when out of memory (the attempt is judged on the next pass). */
static int gather(struct pass *p, const struct cluster_attempt *a, const struct jobinfo *j,
                  const struct supervise_node *nodes, struct supervise_input *in) {
    if (a->world > p->ranks_cap) {
        struct supervise_rank *r = realloc(p->ranks, sizeof *r * (size_t)a->world);
        if (!r) return -1;
        p->ranks = r;
        p->ranks_cap = a->world;
    }
    for (int r = 0; r < a->world; r++) {
        const struct cluster_rank *rk = &a->ranks[r];
        p->ranks[r] =
            (struct supervise_rank){rk->node, rk->state, rk->exit_code, rk->exited_at, rk->reason};
    }
    memset(in, 0, sizeof *in);
    in->job = job_view(j, a);
    in->attempt = a->attempt;
    in->max_retries = j ? j->max_retries : 0;
    in->preemptions = j ? j->preemptions : 0;
    in->world = a->world;
    in->running = a->running;
    json_t *limit = a->spec ? json_object_get(a->spec, "max_runtime_s") : NULL;
    in->max_runtime_s = json_is_integer(limit) ? (long)json_integer_value(limit) : 0;
    in->started_ms = a->started_ms;
    in->last_progress_ms = a->last_progress_ms;
    in->now_ms = p->now;
    in->ranks = p->ranks;
    in->nodes = nodes;
    in->cfg.node_timeout_s = p->ld->cfg.node_timeout;
    in->cfg.hang_timeout_s = p->ld->cfg.hang_timeout;
    return 0;
}

/* The supervisor's answer as attempt and store changes. */
static void apply_decision(struct pass *p, struct cluster_attempt *a,
                           const struct supervise_decision *d) {
    struct cluster *c = p->c;
    unsigned live = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING);
    if (d->started) {
        ch_transition(&p->cs, a->job_id, JOB_MASK(JOB_STARTING), JOB_RUNNING, a->attempt,
                      d->start_reason, NULL);
        a->running = 1;
        if (d->cause == STOP_NONE) {
            a->running_ms = p->now;
            a->last_progress_ms = p->now;
            hist_observe(&c->start_lat, (p->now - a->started_ms) / 1000.0);
        }
    }
    if (d->cause == STOP_NONE) return;
    if (d->cause == STOP_SUCCEEDED)
        ch_transition(&p->cs, a->job_id, JOB_MASK(JOB_RUNNING), JOB_SUCCEEDED, a->attempt,
                      d->reason, NULL);
    if (d->cause == STOP_RANK_FAILED) avoid_set(c, a->job_id, c->nodes[d->node].name);
    stop_attempt(c, a, p->now, d->cause, d->why);
    if (supervise_is_failure(d->cause))
        ch_transition(&p->cs, a->job_id, live, d->retry ? JOB_QUEUED : JOB_FAILED, a->attempt,
                      d->reason, d->retry ? d->pending : NULL);
}

/* 2. active attempts: the supervisor decides, we apply */
static void pass_supervise(struct pass *p) {
    struct cluster *c = p->c;
    struct supervise_node nodes[CLUSTER_MAX_NODES];
    for (int i = 0; i < c->nnodes; i++)
        nodes[i] = (struct supervise_node){c->nodes[i].name, c->nodes[i].lost};
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase != ATTEMPT_ACTIVE) continue;
        struct supervise_input in;
        struct supervise_decision d;
        if (gather(p, a, snap_find(&p->snap, a->job_id), nodes, &in) != 0) continue;
        supervise_decide(&in, &d);
        apply_decision(p, a, &d);
    }
}

/* A stopping attempt's rank is released once it exited, its node is lost,
 * or its node's first report after the stop no longer shows it alive. */
static int release_ranks(struct cluster *c, struct cluster_attempt *a) {
    int all = 1;
    for (int r = 0; r < a->world; r++) {
        struct cluster_rank *rk = &a->ranks[r];
        struct cluster_node *n = &c->nodes[rk->node];
        if (!rk->released &&
            (rk->state == RANK_EXITED || n->lost ||
             (n->last_hb_ms > a->stop_ms + 300 && !node_shows_alive(n, a->job_id, a->attempt, r))))
            rk->released = 1;
        if (!rk->released) all = 0;
    }
    return all;
}

/* 3. stopping attempts: release ranks; finish when all are gone */
static void pass_reap(struct pass *p) {
    struct cluster *c = p->c;
    struct cluster_attempt **pp = &c->attempts;
    while (*pp) {
        struct cluster_attempt *a = *pp;
        if (a->phase != ATTEMPT_STOPPING || !release_ranks(c, a)) {
            pp = &a->next;
            continue;
        }
        int okc = 0;
        for (int r = 0; r < a->world; r++)
            if (a->ranks[r].state == RANK_EXITED && a->ranks[r].exit_code == LOOM_EXIT_OK) okc++;
        const char *end = supervise_end_state(a->stop_cause, okc == a->world);
        finalize_attempt(c, &p->cs, a, p->now, end);
        if (a->stop_cause == STOP_CANCELLED)
            ch_transition(&p->cs, a->job_id, JOB_MASK(JOB_CANCELLING), JOB_CANCELLED, -1,
                          "every rank stopped", NULL);
        log_info("cluster: attempt %d of job %s ended (%s): %s", a->attempt, a->job_id, end,
                 a->stop_reason);
        *pp = a->next;
        attempt_free(a);
    }
}

/* 4. jobs without a live attempt: cancelling -> cancelled; orphans. Avoid-
 * node hints of jobs that ended are dropped. */
static void pass_orphans(struct pass *p) {
    struct cluster *c = p->c;
    for (int i = 0; i < p->snap.n; i++) {
        struct jobinfo *j = &p->snap.jobs[i];
        if (j->state == JOB_QUEUED) continue;
        if (cluster_attempt_find(c, j->id, j->attempt)) continue;
        if (j->state == JOB_CANCELLING)
            ch_transition(&p->cs, j->id, JOB_MASK(JOB_CANCELLING), JOB_CANCELLED, -1,
                          "no rank was running", NULL);
        else if (j->state == JOB_STARTING || j->state == JOB_RUNNING)
            ch_transition(&p->cs, j->id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING),
                          supervise_retries_left(j->attempt, j->preemptions, j->max_retries) > 0
                              ? JOB_QUEUED
                              : JOB_FAILED,
                          j->attempt, "attempt state was lost (loomd restarted without it)",
                          "retrying: attempt state was lost");
    }
    for (struct cluster_avoid **pp = &c->avoid; *pp;) {
        if (snap_find(&p->snap, (*pp)->job_id)) {
            pp = &(*pp)->next;
            continue;
        }
        struct cluster_avoid *v = *pp;
        *pp = v->next;
        free(v);
    }
}

/* The attempt for a placed job: ranks, spec (parsed once, here), token, and
 * the placement transition plus the attempts row it is recorded with. */
static void place_one(struct pass *p, const struct jobinfo *j, const struct sched_decision *sd) {
    struct cluster *c = p->c;
    int64_t now = p->now;
    avoid_take(c, j->id, 1);
    struct cluster_attempt *a = calloc(1, sizeof *a);
    struct cluster_rank *ranks = calloc((size_t)j->world, sizeof *ranks);
    if (!a || !ranks || auth_new_token(a->token, sizeof a->token) != 0) {
        free(a);
        free(ranks);
        return;
    }
    snprintf(a->job_id, sizeof a->job_id, "%s", j->id);
    snprintf(a->tenant_id, sizeof a->tenant_id, "%s", j->tenant_id);
    a->attempt = j->attempt;
    a->world = j->world;
    a->ranks = ranks;
    struct spec_read sr = {j->id, NULL};
    store_read(p->ld->store, read_spec, &sr);
    a->spec = sr.spec ? json_loads(sr.spec, 0, NULL) : NULL;
    if (!a->spec) a->spec = json_object();
    free(sr.spec);
    a->out_dir = strdup(j->out_dir);
    a->stop_cause = STOP_NONE;
    a->started_ms = now;
    a->last_progress_ms = now;
    a->rdzv = json_object();
    json_t *pl = json_array();
    char summary[256] = "";
    size_t off = 0;
    for (int r = 0; r < j->world; r++) {
        ranks[r].node = sd->ranks[r].node;
        ranks[r].device = sd->ranks[r].device;
        ranks[r].last_step = -1;
        for (int q = 0; q < r; q++)
            if (ranks[q].node == ranks[r].node) ranks[r].local_rank++;
        json_array_append_new(pl, json_pack("{s:i, s:s, s:i, s:i}", "rank", r, "node",
                                            c->nodes[ranks[r].node].name, "device", ranks[r].device,
                                            "local_rank", ranks[r].local_rank));
        if ((r == 0 || ranks[r].node != ranks[r - 1].node) && off < sizeof summary)
            off += (size_t)snprintf(summary + off, sizeof summary - off, "%s%s", r ? ", " : "",
                                    c->nodes[ranks[r].node].name);
    }
    char *pltext = json_dumps(pl, JSON_COMPACT);
    json_decref(pl);
    char reason[400];
    snprintf(reason, sizeof reason, "placed %d rank(s) on %s", j->world, summary);
    ch_transition(&p->cs, j->id, JOB_MASK(JOB_QUEUED), JOB_STARTING, j->attempt, reason, NULL);
    p->cs.v[p->cs.n - 1].text2 = pltext;
    struct change *ins = ch_add(&p->cs, CH_ATTEMPT_INSERT, j->id);
    if (ins) {
        ins->attempt = a->attempt;
        ins->world = a->world;
        snprintf(ins->tenant_id, sizeof ins->tenant_id, "%s", a->tenant_id);
        ins->t0 = now;
        ins->text = pltext ? strdup(pltext) : strdup("[]");
        ins->text2 = strdup(a->token);
    }
    if (sd->cross_island > 0) { /* tp larger than every NVLink island of the node */
        const struct cluster_node *n0 = &c->nodes[sd->ranks[0].node];
        int big = 0;
        for (int k = 0; k < n0->nislands; k++) {
            int sz = __builtin_popcountll(n0->islands[k]);
            if (sz > big) big = sz;
        }
        char note[300];
        snprintf(note, sizeof note,
                 "WARNING: %d tp group(s) of tp=%d span NVLink islands (largest island on %s: %d "
                 "GPUs); their all-reduces cross PCIe",
                 sd->cross_island, j->tp, n0->name, big);
        struct change *nc = ch_add(&p->cs, CH_NOTE, j->id);
        if (nc) {
            nc->attempt = a->attempt;
            nc->text = strdup(note);
        }
        log_warn("cluster: job %s: %s", j->id, note);
    }
    a->next = c->attempts;
    c->attempts = a;
    hist_observe(&c->queue_wait, (now - j->queued_since) / 1000.0);
    cluster_changed(c);
}

int cluster_node_cc(const struct cluster_node *n) {
    const struct gpu_type *t = gpu_type_find(n->gpu_type);
    if (t) return t->cc;
    json_t *gpus = json_object_get(n->inventory, "gpus"), *g;
    size_t i;
    int least = 0;
    json_array_foreach(gpus, i, g) {
        const char *s = json_string_value(json_object_get(g, "compute_capability"));
        int major, minor;
        if (!s || sscanf(s, "%d.%d", &major, &minor) != 2 || major < 1 || minor < 0 || minor > 9)
            return 0;
        int cc = major * 10 + minor;
        if (!least || cc < least) least = cc;
    }
    return least;
}

/* The scheduler's view of the nodes: state, and the devices that unreleased
 * ranks hold (which also count against their tenants' quotas). */
static void sched_nodes(struct pass *p, struct sched_node *sn) {
    struct cluster *c = p->c;
    for (int i = 0; i < c->nnodes; i++) {
        struct cluster_node *n = &c->nodes[i];
        sn[i].name = n->name;
        sn[i].kind = n->kind;
        sn[i].ndev = n->ndev > SCHED_MAX_NODE_DEVICES ? SCHED_MAX_NODE_DEVICES : n->ndev;
        sn[i].gpu_type = n->gpu_type;
        sn[i].islands = n->islands;
        sn[i].nislands = n->nislands;
        sn[i].pool = n->pool;
        sn[i].label_keys = n->label_kp;
        sn[i].label_vals = n->label_vp;
        sn[i].nlabels = n->nlabels;
        sn[i].cc = cluster_node_cc(n);
        sn[i].state = n->lost || !n->seen || n->admission != NODE_APPROVED ? SCHED_NODE_LOST
                      : n->drained || nodecheck_avoid(c->ld, n->name)      ? SCHED_NODE_DRAINED
                                                                           : SCHED_NODE_READY;
    }
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        int held = 0;
        for (int r = 0; r < a->world; r++) {
            if (a->ranks[r].released) continue;
            if (a->ranks[r].device < 64)
                sn[a->ranks[r].node].busy |= (uint64_t)1 << a->ranks[r].device;
            for (int q = 0; q < p->snap.nq; q++)
                if (!strcmp(p->snap.quotas[q].tenant, a->tenant_id)) p->snap.quotas[q].used_gpus++;
            held = 1;
        }
        for (int q = 0; held && q < p->snap.nq; q++) /* QoS max_running_jobs */
            if (!strcmp(p->snap.quotas[q].tenant, a->tenant_id)) p->snap.quotas[q].running++;
    }
}

/* Another attempt of the job is still stopping (a preempted one writing its
 * checkpoint, or a failed one): the next may not start beside it, since both
 * would use the job's checkpoint directory. */
static const struct cluster_attempt *older_attempt(struct cluster *c, const char *job_id) {
    for (const struct cluster_attempt *a = c->attempts; a; a = a->next)
        if (!strcmp(a->job_id, job_id)) return a;
    return NULL;
}

/* SIGTERM grace for a preempted attempt: --preempt-grace plus two of its
 * steps (as observed) plus a checkpoint-time estimate (16 bytes a parameter:
 * weights, fp32 master and AdamW moments, written at 1 GB/s). */
static int preempt_grace_ms(const struct pass *p, const struct cluster_attempt *a) {
    int64_t ms = (int64_t)p->ld->cfg.preempt_grace * 1000;
    long steps = a->ranks[0].last_step;
    if (steps > 0 && a->last_progress_ms > a->running_ms)
        ms += 2 * (a->last_progress_ms - a->running_ms) / steps;
    struct loom_spec *s = malloc(sizeof *s);
    struct loom_error e;
    if (s && a->spec && jobspec_parse(s, a->spec, 0, &e) == 0)
        ms += model_n_params(&s->model) * 16 / 1000000;
    free(s);
    return ms > 86400000 ? 86400000 : (int)ms;
}

/* 6. preemption: the backfill head (the first job in order that would fit
 * on the idle cluster but not now) may stop running preemptible jobs of lower
 * priority (daemon/preempt.h). One preemption is in flight at a time; the
 * head starts on the freed devices once they are released. */
static void pass_preempt(struct pass *p, struct sched_node *sn, const struct sched_job *sj,
                         const struct sched_decision *sd, int nq) {
    struct cluster *c = p->c;
    int head = -1;
    for (int k = 0; k < nq && head < 0; k++)
        if (sd[k].reserved) head = k;
    if (head < 0) return;
    int nv = 0;
    size_t tot = 0, off = 0;
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase == ATTEMPT_STOPPING && a->stop_cause == STOP_PREEMPTED) return;
        nv++;
        tot += (size_t)a->world;
    }
    for (int k = 0; k < nq; k++) /* devices placed in this pass are taken */
        for (int r = 0; sd[k].placed && r < sj[k].world; r++)
            sn[sd[k].ranks[r].node].busy |= (uint64_t)1 << sd[k].ranks[r].device;
    struct preempt_victim *v = calloc((size_t)(nv ? nv : 1), sizeof *v);
    struct cluster_attempt **va = calloc((size_t)(nv ? nv : 1), sizeof *va);
    struct sched_rank *rk = calloc(tot ? tot : 1, sizeof *rk);
    int *chosen = calloc((size_t)(nv ? nv : 1), sizeof *chosen);
    if (!v || !va || !rk || !chosen) goto out;
    nv = 0;
    int64_t min_ms = (int64_t)p->ld->cfg.preempt_min_runtime * 1000;
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        const struct jobinfo *j = snap_find(&p->snap, a->job_id);
        if (a->phase != ATTEMPT_ACTIVE || !a->running || !j) continue;
        struct sched_rank *r = rk + off;
        off += (size_t)a->world;
        int n = 0;
        for (int q = 0; q < a->world; q++)
            if (!a->ranks[q].released && a->ranks[q].device < SCHED_MAX_NODE_DEVICES)
                r[n++] = (struct sched_rank){a->ranks[q].node, a->ranks[q].device};
        int preemptible = a->spec && json_is_true(json_object_get(a->spec, "preemptible"));
        v[nv] = (struct preempt_victim){a->job_id,
                                        a->tenant_id,
                                        j->priority,
                                        a->running_ms,
                                        preemptible && p->now - a->running_ms >= min_ms,
                                        r,
                                        n};
        va[nv++] = a;
    }
    struct sched_cluster cl = {sn, c->nnodes, p->snap.quotas, p->snap.nq};
    char why[256];
    if (preempt_choose(&cl, &sj[head], v, nv, chosen, why, sizeof why) <= 0) goto out;
    for (int i = 0; i < nv; i++) {
        if (!chosen[i]) continue;
        struct cluster_attempt *a = va[i];
        char reason[256], pending[200];
        snprintf(reason, sizeof reason, "PREEMPTED by %s (priority %d over %d)", sj[head].id,
                 sj[head].priority, v[i].priority);
        snprintf(pending, sizeof pending,
                 "preempted by %s; resumes from its checkpoint when devices free up", sj[head].id);
        a->stop_grace_ms = preempt_grace_ms(p, a);
        stop_attempt(c, a, p->now, STOP_PREEMPTED, reason);
        ch_transition(&p->cs, a->job_id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING), JOB_QUEUED,
                      a->attempt, reason, pending);
        log_info("cluster: %s; SIGTERM grace %d ms", reason, a->stop_grace_ms);
    }
out:
    free(v);
    free(va);
    free(rk);
    free(chosen);
}

/* 4b. budgets: once a tenant's GPU-hours of this month (ended attempts'
 * billed rows plus its live attempts so far) reach its gpu_hours_per_month,
 * its live attempts checkpoint and stop, the job failing with
 * BUDGET_EXHAUSTED (not retried), the SIGTERM grace being the preemption's;
 * warn-only (the tenant's or --budget-warn-only): one job event per attempt,
 * which goes on (daemon/budget.h). */
static void pass_budget(struct pass *p) {
    struct cluster *c = p->c;
    struct snapshot *snap = &p->snap;
    if (snap->nb == 0) return;
    int na = 0;
    for (struct cluster_attempt *a = c->attempts; a; a = a->next)
        na++;
    struct budget_attempt *ba = calloc((size_t)(na ? na : 1), sizeof *ba);
    enum budget_action *act = calloc((size_t)(na ? na : 1), sizeof *act);
    struct cluster_attempt **va = calloc((size_t)(na ? na : 1), sizeof *va);
    if (!ba || !act || !va) goto out;
    na = 0;
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        /* Stopping attempts still use their devices: they count, and are
         * not acted on (warned = 1 keeps warn-only quiet about them). */
        int gpus = 0;
        for (int r = 0; r < a->world; r++)
            if (!a->ranks[r].released) gpus++;
        ba[na] = (struct budget_attempt){a->tenant_id, gpus, a->started_ms,
                                         a->budget_warned || a->phase != ATTEMPT_ACTIVE};
        va[na++] = a;
    }
    /* Attempts that ended in this pass are in neither the snapshot's usage
     * rows nor the attempt list: their rows, not yet written, count here. */
    int64_t month0 = budget_month_start_ms(p->now);
    for (int i = 0; i < p->cs.n; i++) {
        const struct change *u = &p->cs.v[i];
        int64_t from = u->t0 > month0 ? u->t0 : month0;
        if (u->kind != CH_USAGE || !u->billed || u->t1 <= from) continue;
        for (int k = 0; k < snap->nb; k++)
            if (!strcmp(snap->budget_ids[k], u->tenant_id))
                snap->budgets[k].used_hours += u->gpus * (double)(u->t1 - from) / 3600000.0;
    }
    budget_decide(snap->budgets, snap->nb, ba, na, p->now, p->ld->cfg.budget_warn_only, act);
    for (int i = 0; i < na; i++) {
        struct cluster_attempt *a = va[i];
        if (act[i] == BUDGET_OK || a->phase != ATTEMPT_ACTIVE) continue;
        int k = 0;
        while (k < snap->nb && strcmp(snap->budget_ids[k], a->tenant_id))
            k++;
        if (k == snap->nb) continue;
        const struct budget_tenant *bt = &snap->budgets[k];
        char reason[400];
        if (act[i] == BUDGET_WARN) {
            snprintf(reason, sizeof reason,
                     "BUDGET_EXHAUSTED (warn-only) tenant %s used %.4f of its %.4f GPU-hours this "
                     "month (%.4f in ended attempts); attempt %d goes on",
                     snap->budget_names[k], bt->total_hours, bt->limit_hours, bt->used_hours,
                     a->attempt);
            struct change *ch = ch_add(&p->cs, CH_NOTE, a->job_id);
            if (!ch) continue;
            ch->attempt = a->attempt;
            ch->text = strdup(reason);
            a->budget_warned = 1;
            log_warn("cluster: job %s: %s", a->job_id, reason);
            continue;
        }
        snprintf(reason, sizeof reason,
                 "BUDGET_EXHAUSTED tenant %s used %.4f of its %.4f GPU-hours this month (%.4f in "
                 "ended attempts); attempt %d checkpoints and stops, not retried",
                 snap->budget_names[k], bt->total_hours, bt->limit_hours, bt->used_hours,
                 a->attempt);
        a->stop_grace_ms = preempt_grace_ms(p, a);
        stop_attempt(c, a, p->now, STOP_BUDGET, reason);
        ch_transition(&p->cs, a->job_id, JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING), JOB_FAILED,
                      a->attempt, reason, NULL);
        log_info("cluster: job %s: %s; SIGTERM grace %d ms", a->job_id, reason, a->stop_grace_ms);
    }
out:
    free(ba);
    free(act);
    free(va);
}

/* A queued job of a tenant whose budget is used up (not warn-only) waits:
 * 1 and the pending reason in why. Totals are pass_budget's. */
static int budget_holds(const struct pass *p, const char *tenant, char *why, size_t len) {
    const struct snapshot *snap = &p->snap;
    if (p->ld->cfg.budget_warn_only) return 0;
    for (int k = 0; k < snap->nb; k++) {
        const struct budget_tenant *bt = &snap->budgets[k];
        if (strcmp(snap->budget_ids[k], tenant) || bt->warn_only ||
            bt->total_hours < bt->limit_hours)
            continue;
        snprintf(why, len,
                 "BUDGET_EXHAUSTED tenant %s used its %g GPU-hours of this month; waits for "
                 "next month or a larger gpu_hours_per_month",
                 snap->budget_names[k], bt->limit_hours);
        return 1;
    }
    return 0;
}

/* 5. placement */
static void pass_place(struct pass *p) {
    struct cluster *c = p->c;
    struct snapshot *snap = &p->snap;
    size_t nj = (size_t)(snap->n ? snap->n : 1);
    struct sched_node *sn = calloc((size_t)(c->nnodes ? c->nnodes : 1), sizeof *sn);
    struct sched_job *sj = calloc(nj, sizeof *sj);
    struct sched_decision *sd = calloc(nj, sizeof *sd);
    struct jobinfo **qj = calloc(nj, sizeof *qj);
    int nq = 0;
    if (!sn || !sj || !sd || !qj) goto out;
    sched_nodes(p, sn);
    for (int i = 0; i < snap->n; i++) {
        struct jobinfo *j = &snap->jobs[i];
        if (j->state != JOB_QUEUED || cluster_attempt_find(c, j->id, j->attempt)) continue;
        const struct cluster_attempt *old = older_attempt(c, j->id);
        if (old) {
            char why[SCHED_REASON_LEN];
            snprintf(why, sizeof why, "waiting for attempt %d to stop (%s)", old->attempt,
                     old->stop_cause == STOP_PREEMPTED ? "writing its checkpoint" : "ending");
            if (!j->pending || strcmp(j->pending, why)) {
                struct change *ch = ch_add(&p->cs, CH_PENDING, j->id);
                if (ch) ch->text = strdup(why);
            }
            continue;
        }
        if (j->deps == DEPS_FAILED) {
            ch_transition(&p->cs, j->id, JOB_MASK(JOB_QUEUED), JOB_FAILED, j->attempt,
                          j->deps_reason, NULL);
            continue;
        }
        if (j->deps == DEPS_WAIT) {
            if (!j->pending || strcmp(j->pending, j->deps_reason)) {
                struct change *ch = ch_add(&p->cs, CH_PENDING, j->id);
                if (ch) ch->text = strdup(j->deps_reason);
            }
            continue;
        }
        char bwhy[SCHED_REASON_LEN];
        if (budget_holds(p, j->tenant_id, bwhy, sizeof bwhy)) {
            if (!j->pending || strcmp(j->pending, bwhy)) {
                struct change *ch = ch_add(&p->cs, CH_PENDING, j->id);
                if (ch) ch->text = strdup(bwhy);
            }
            continue;
        }
        for (int t = 0; t < j->ngpu_types; t++)
            j->gpu_type_ptrs[t] = j->gpu_types[t];
        sj[nq] = (struct sched_job){j->id,
                                    j->tenant_id,
                                    j->kind,
                                    j->priority,
                                    j->created_at,
                                    j->world,
                                    j->tp,
                                    j->per_node,
                                    avoid_take(c, j->id, 0),
                                    j->gpu_type_ptrs,
                                    j->ngpu_types,
                                    j->allow_mixed,
                                    j->fair_usage,
                                    j->sel ? j->sel->pool : NULL,
                                    j->sel ? j->sel->kp : NULL,
                                    j->sel ? j->sel->vp : NULL,
                                    j->sel ? j->sel->n : 0,
                                    j->min_cc};
        qj[nq++] = j;
    }
    struct sched_cluster cl = {sn, c->nnodes, snap->quotas, snap->nq};
    if (nq == 0 || sched_place(&cl, sj, nq, sd) < 0) goto out;
    for (int k = 0; k < nq; k++) {
        struct jobinfo *j = qj[k];
        if (sd[k].placed) {
            place_one(p, j, &sd[k]);
        } else if (!j->pending || strcmp(j->pending, sd[k].reason)) {
            struct change *ch = ch_add(&p->cs, CH_PENDING, j->id);
            if (ch) ch->text = strdup(sd[k].reason);
        }
    }
    pass_preempt(p, sn, sj, sd, nq);
    sched_decisions_free(sd, nq);
out:
    free(sn);
    free(sj);
    free(sd);
    free(qj);
}

/* After the mutex: publish, write, and stop placements whose write failed. */
static void pass_commit(struct pass *p, int changed) {
    struct cluster *c = p->c;
    /* Publish new placements and stops at once: agents act on them while the
     * store write commits (an agent start is harmless if the write failed:
     * the next pass removes the attempt and the agent stops it). */
    if (changed) http_notify_signal(&c->assign);
    if (p->cs.n == 0) return;
    store_write(p->ld->store, apply_changes, &p->cs);
    /* Placements whose transition failed (cancelled meanwhile): drop. */
    pthread_mutex_lock(&c->mu);
    int dropped = 0;
    for (int i = 0; i < p->cs.n; i++) {
        struct change *ch = &p->cs.v[i];
        if (ch->kind != CH_ATTEMPT_INSERT || ch->result == STORE_OK) continue;
        for (struct cluster_attempt *a = c->attempts; a; a = a->next)
            if (a->attempt == ch->attempt && !strcmp(a->job_id, ch->job_id) &&
                a->phase == ATTEMPT_ACTIVE) {
                stop_attempt(c, a, p->now, STOP_NOT_RECORDED, "placement was not recorded");
                dropped = 1;
            }
    }
    pthread_mutex_unlock(&c->mu);
    if (dropped) http_notify_signal(&c->assign);
}

static void loop_pass(struct loomd *ld) {
    struct cluster *c = ld->cluster;
    struct pass p = {.ld = ld, .c = c};
    p.cs.price = ld->cfg.price_gpu_hour;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    p.snap.fs_half_life_s = ld->cfg.fair_share_half_life;
    if (store_read(ld->store, snapshot_read, &p.snap) != STORE_OK) {
        snapshot_free(&p.snap);
        return;
    }
    p.now = store_now_ms();

    pthread_mutex_lock(&c->mu);
    uint64_t gen0 = c->gen;
    pass_nodes(&p);
    pass_supervise(&p);
    pass_reap(&p);
    pass_orphans(&p);
    pass_budget(&p);
    pass_place(&p);
    int changed = c->gen != gen0;
    pthread_mutex_unlock(&c->mu);

    pass_commit(&p, changed);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_lock(&c->mu);
    hist_observe(&c->sched_lat,
                 (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    pthread_mutex_unlock(&c->mu);
    free(p.ranks);
    changes_free(&p.cs);
    snapshot_free(&p.snap);
}

static void *loop_main(void *arg) {
    struct loomd *ld = arg;
    struct cluster *c = ld->cluster;
    uint64_t gen = http_notify_gen(&c->wake);
    while (!c->stopping) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        loop_pass(ld);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        /* Pacing: a pass reads every active job and up to SCHED_QUEUE_DEPTH
         * queued ones, and under a stream of submits each one woke the next
         * pass at once: at 500 submits/s with a deep queue the passes were
         * half of loomd's CPU (bench_events, docs/perf.md). So the next pass
         * starts at least sched-min-gap-ms after this one began, and the loop
         * spends at most a quarter of the time in passes (a gap of three
         * times the pass just run); wake-ups meanwhile are kept, not lost. */
        int64_t took_us =
            (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000 + (int64_t)(t1.tv_nsec - t0.tv_nsec) / 1000;
        int64_t hold_us = ld->cfg.sched_min_gap_ms * 1000 - took_us;
        if (hold_us < 3 * took_us) hold_us = 3 * took_us;
        if (hold_us > 250000) hold_us = 250000;
        if (hold_us > 0 && !c->stopping) {
            struct timespec hs = {(time_t)(hold_us / 1000000), (long)(hold_us % 1000000) * 1000};
            while (nanosleep(&hs, &hs) != 0 && errno == EINTR && !c->stopping) {
            }
        }
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
        store_stmt(tx, "SELECT name, kind, devices, drained, hostname, registered_at, comm_addr, "
                       "comm_iface FROM nodes");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW && c->nnodes < CLUSTER_MAX_NODES) {
        struct cluster_node *n = &c->nodes[c->nnodes++];
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
        snprintf(n->comm_addr, sizeof n->comm_addr, "%s", (const char *)sqlite3_column_text(st, 6));
        snprintf(n->comm_iface, sizeof n->comm_iface, "%s",
                 (const char *)sqlite3_column_text(st, 7));
        n->tasks = json_array();
        n->last_hb_ms = now; /* a grace of one node timeout to reconnect */
        n->seen = 0;
    }
    sqlite3_reset(st);
    if (nodes_load_inventory(tx, c) != STORE_OK) return STORE_ERR;
    st = store_stmt(tx, "SELECT a.job_id, a.attempt, a.tenant_id, a.token, a.placement, a.world, "
                        "a.started_at, j.spec, j.out_dir, j.state FROM attempts a JOIN jobs j ON "
                        "j.id = a.job_id WHERE a.state = 'active'");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *pl = json_loads((const char *)sqlite3_column_text(st, 4), 0, NULL);
        int world = sqlite3_column_int(st, 5);
        struct cluster_attempt *a = calloc(1, sizeof *a);
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
        a->spec = json_loads((const char *)sqlite3_column_text(st, 7), 0, NULL);
        if (!a->spec) a->spec = json_object();
        a->out_dir = strdup((const char *)sqlite3_column_text(st, 8));
        const char *jstate = (const char *)sqlite3_column_text(st, 9);
        a->running = jstate && !strcmp(jstate, "running");
        a->stop_cause = STOP_NONE;
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
        struct cluster_attempt *a = cluster_attempt_find(
            c, (const char *)sqlite3_column_text(st, 0), sqlite3_column_int(st, 1));
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
        struct cluster_attempt *n = c->attempts->next;
        attempt_free(c->attempts);
        c->attempts = n;
    }
    while (c->avoid) {
        struct cluster_avoid *n = c->avoid->next;
        free(c->avoid);
        c->avoid = n;
    }
    for (int i = 0; i < c->nnodes; i++) {
        json_decref(c->nodes[i].devices);
        json_decref(c->nodes[i].tasks);
        json_decref(c->nodes[i].host);
        json_decref(c->nodes[i].inventory);
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
