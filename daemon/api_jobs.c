/* Tenant job routes: submit (validated by api/jobspec, Idempotency-Key),
 * list (filters, cursor pagination), get, cancel, events, and plan (validate
 * without storing). A tenant only ever sees its own jobs: every read is
 * scoped by tenant id, so another tenant's job answers 404. */
#define _GNU_SOURCE
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/gpu_types.h"
#include "api/jobspec.h"
#include "api/planner.h"
#include "common/buf.h"
#include "daemon/auth.h"
#include "daemon/handlers.h"
#include "daemon/initfrom.h"
#include "daemon/loomd.h"
#include "daemon/nodes.h"
#include "daemon/sched.h"
#include "daemon/store.h"
#include "daemon/submitcheck.h"

#define LIST_DEFAULT 50
#define LIST_MAX     1000
#define IDEM_KEY_MAX 255

static int reply_store_error(struct http_req *req, int rc, const char *id) {
    if (rc == STORE_NOT_FOUND) return API_ERROR(req, JOB_NOT_FOUND, "no job '%s'", id);
    return API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
}

static int reply_spec_error(struct http_req *req, const struct loom_error *e) {
    const struct loom_errdef *fallback = loom_errdef_of(LOOM_E_INVALID_SPEC);
    return http_error_field(req, e->status ? e->status : fallback->status,
                            e->code[0] ? e->code : fallback->code, e->field[0] ? e->field : NULL,
                            "%s", e->message);
}

/* ---------------- data roots ---------------- */

struct roots {
    char *buf; /* backing storage */
    const char *v[32];
    size_t n;
};

static void roots_from_csv(struct roots *r, const char *csv) {
    r->buf = strdup(csv ? csv : "");
    r->n = 0;
    for (char *save = NULL, *t = strtok_r(r->buf, ",", &save); t && r->n < 32;
         t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (*t) r->v[r->n++] = t;
    }
}

/* The tenant's own data_roots if it has any, else loomd's --data-roots,
 * else "/" (no restriction beyond the lexical rules). */
static int load_roots(struct http_req *req, struct roots *r) {
    char text[8192];
    if (auth_tenant_roots(req->ld->auth, req->ld->store, req->tenant_id, text, sizeof text) != 0)
        return -1;
    json_t *arr = json_loads(text, 0, NULL);
    if (json_array_size(arr) > 0) {
        size_t len = 0, i;
        json_t *v;
        json_array_foreach(arr, i, v) len += strlen(json_string_value(v)) + 1;
        r->buf = malloc(len + 1);
        r->n = 0;
        char *p = r->buf;
        json_array_foreach(arr, i, v) {
            if (r->n >= 32) break;
            size_t l = strlen(json_string_value(v));
            memcpy(p, json_string_value(v), l + 1);
            r->v[r->n++] = p;
            p += l + 1;
        }
    } else {
        roots_from_csv(r, req->ld->cfg.data_roots);
        if (r->n == 0) r->v[r->n++] = "/";
    }
    json_decref(arr);
    return 0;
}

/* Replies with the job as JSON. The stored spec text is spliced in as is:
 * it is canonical JSON already, and re-parsing and re-printing it (reals)
 * was most of the cost of a GET. */
static int reply_job(struct http_req *req, int status, const struct store_job *j) {
    char *text = store_job_dumps(j, 1);
    if (!text) return API_ERROR(req, INTERNAL, "out of memory");
    http_reply_text(req, status, "application/json", text, strlen(text));
    free(text);
    return 0;
}

/* ---- the real cluster (GPU fleet: daemon/nodes.h, api/planner.h) ---- */

/* resources.gpu_type of a parsed spec, normalized (aliases resolved) and checked
 * against the GPU type table (api/gpu_types.h). Returns the number of types,
 * or -1 with err filled (422 UNKNOWN_GPU_TYPE). */
static int job_types(const struct loom_spec *s, char (*types)[GPU_TYPE_NAME_MAX],
                     struct loom_error *err) {
    json_t *list = json_array();
    char msg[400];
    for (int i = 0; i < s->resources.n_gpu_types; i++)
        json_array_append_new(list, json_string(s->resources.gpu_type[i]));
    int n = gpu_type_list_parse(list, types, SCHED_MAX_JOB_TYPES, msg, sizeof msg);
    json_decref(list);
    if (n < 0) loom_error_set(err, 422, "UNKNOWN_GPU_TYPE", "resources.gpu_type", "%s", msg);
    return n;
}

/* The cluster /v1/plan estimates on when the body names none: the pool of
 * registered nodes the job would run on (its first listed gpu_type, else the
 * first pool that holds its ranks), at that type's price; with no node of the
 * job's kind, the planner's default node (of the first listed type). -1 with
 * err when the spec names a GPU type not in the table. */
static int known_cluster(struct loomd *ld, const json_t *body, const struct planner_fleet *f,
                         struct planner_cluster *c, struct loom_error *err) {
    planner_cluster_default(c);
    c->price_per_gpu_hour = ld->cfg.price_gpu_hour;
    char types[SCHED_MAX_JOB_TYPES][GPU_TYPE_NAME_MAX];
    struct loom_error ign;
    struct loom_spec s;
    json_t *specj = json_copy((json_t *)body);
    json_object_del(specj, "cluster");
    json_object_del(specj, "options");
    int ok = specj && jobspec_parse(&s, specj, JOBSPEC_FOR_PLAN, &ign) == 0;
    json_decref(specj);
    if (!ok) return 0; /* planner_plan_json reports what is wrong */
    int nt = job_types(&s, types, err);
    if (nt < 0) return -1;
    if (nt > 0) snprintf(c->gpu, sizeof c->gpu, "%s", types[0]);
    int idx[PLANNER_MAX_POOLS], n = planner_fleet_candidates(&s, f, types, nt, idx), pick = -1;
    int world = s.parallel.dp * s.parallel.tp * s.parallel.pp;
    for (int k = 0; k < n && pick < 0; k++)
        if (f->pool[idx[k]].gpus >= world) pick = idx[k];
    if (pick < 0 && n > 0) pick = idx[0];
    if (pick < 0) return 0;
    planner_pool_cluster(&f->pool[pick], c);
    if (c->price_per_gpu_hour <= 0) c->price_per_gpu_hour = ld->cfg.price_gpu_hour;
    return 0;
}

/* Submit-time fit against the registered nodes (planner_fleet_check): the
 * layout must fit the memory of a GPU type the job may use, and the cluster
 * must be able to hold its ranks at all (UNSCHEDULABLE otherwise). Before any
 * node of the job's kind has joined only the per-GPU memory is judged, on a
 * default node sized to the job. */
static int check_fit(struct loomd *ld, const struct loom_spec *spec, struct loom_error *err) {
    char types[SCHED_MAX_JOB_TYPES][GPU_TYPE_NAME_MAX];
    int nt = job_types(spec, types, err);
    if (nt < 0) return -1;
    if (nodes_selector_check(ld, spec, err) != 0) return -1;
    struct planner_fleet f;
    nodes_fleet(ld, &f);
    return planner_fleet_check(spec, &f, (const char(*)[GPU_TYPE_NAME_MAX])types, nt,
                               spec->resources.allow_mixed, err);
}

/* ---------------- job references ---------------- */

/* The jobs `after` names must be jobs of the submitting tenant
 * (model.init_from job:<id> is resolved, and checked, by daemon/initfrom.c). */
struct refs_op {
    const char *tenant_id;
    const char *ids[JOBSPEC_AFTER_MAX + 1];
    const char *fields[JOBSPEC_AFTER_MAX + 1];
    int n;
    int missing; /* index of the first unknown id, -1: none */
};

static int refs_cb(struct store_tx *tx, void *arg) {
    struct refs_op *op = arg;
    for (int i = 0; i < op->n; i++) {
        struct store_job j;
        memset(&j, 0, sizeof j);
        int rc = store_job_get(tx, op->tenant_id, op->ids[i], &j);
        store_job_clear(&j);
        if (rc == STORE_NOT_FOUND) {
            op->missing = i;
            return STORE_OK;
        }
        if (rc != STORE_OK) return rc;
    }
    return STORE_OK;
}

/* 0, or -1 after replying (UNKNOWN_JOB naming the field and the id). */
static int check_job_refs(struct http_req *req, const struct loom_spec *spec) {
    struct refs_op op = {.tenant_id = req->tenant_id, .missing = -1};
    for (int i = 0; i < spec->n_after; i++) {
        op.ids[op.n] = spec->after[i];
        op.fields[op.n++] = "after";
    }
    if (op.n == 0) return 0;
    if (store_read(req->ld->store, refs_cb, &op) != STORE_OK) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        return -1;
    }
    if (op.missing < 0) return 0;
    API_ERROR_FIELD(req, UNKNOWN_JOB, op.fields[op.missing],
                    "%s names job '%s', which this tenant "
                    "does not have",
                    op.fields[op.missing], op.ids[op.missing]);
    return -1;
}

/* ---------------- tenant QoS ---------------- */

struct qos_op {
    const char *tenant_id;
    int64_t month_start_ms;
    struct store_tenant_qos q;
    double used_hours;
};

static int qos_cb(struct store_tx *tx, void *arg) {
    struct qos_op *op = arg;
    int rc = store_tenant_qos_get(tx, op->tenant_id, &op->q);
    if (rc) return rc;
    if (op->q.gpu_hours_per_month <= 0) return STORE_OK;
    return store_tenant_gpu_hours(tx, op->tenant_id, op->month_start_ms, &op->used_hours);
}

/* The first millisecond of the calendar month (UTC) holding now_ms. */
static int64_t month_start_ms(int64_t now_ms) {
    time_t t = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    tm.tm_mday = 1;
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    return (int64_t)timegm(&tm) * 1000;
}

/* 0, or -1 after replying. A priority above max_priority is refused, not
 * clamped: a job that silently runs at another priority than asked would
 * surprise its owner (docs/operations.md). */
static int check_qos(struct http_req *req, const struct loom_spec *spec) {
    struct qos_op op = {.tenant_id = req->tenant_id,
                        .month_start_ms = month_start_ms(store_now_ms())};
    int rc = store_read(req->ld->store, qos_cb, &op);
    if (rc == STORE_NOT_FOUND) return 0; /* admin or a tenant row without QoS */
    if (rc != STORE_OK) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        return -1;
    }
    if (op.q.max_priority >= 0 && spec->priority > op.q.max_priority) {
        API_ERROR_FIELD(req, PRIORITY_TOO_HIGH, "priority",
                        "priority %d is above the tenant's max_priority %ld", spec->priority,
                        op.q.max_priority);
        return -1;
    }
    /* Warn-only (the tenant's or --budget-warn-only): the budget never
     * blocks; running attempts get one BUDGET_EXHAUSTED event (cluster.c). */
    if (op.q.gpu_hours_per_month > 0 && op.used_hours >= op.q.gpu_hours_per_month &&
        !op.q.budget_warn_only && !req->ld->cfg.budget_warn_only) {
        API_ERROR(req, BUDGET_EXHAUSTED,
                  "BUDGET_EXHAUSTED: the tenant used %.2f of its %.2f GPU-hours this month",
                  op.used_hours, op.q.gpu_hours_per_month);
        return -1;
    }
    return 0;
}

/* ---------------- submit ---------------- */

struct submit_op {
    const char *tenant_id;
    const char *idem_key;
    unsigned char hash[32];
    struct store_job_new nj;
    struct store_job job;
    int replayed;
};

static int submit_cb(struct store_tx *tx, void *arg) {
    struct submit_op *op = arg;
    if (op->idem_key) {
        char id[32];
        int same = 0;
        int rc = store_idem_lookup(tx, op->tenant_id, op->idem_key, op->hash, id, sizeof id, &same);
        if (rc == STORE_OK) {
            if (!same) return STORE_CONFLICT;
            op->replayed = 1;
            return store_job_get(tx, op->tenant_id, id, &op->job);
        }
        if (rc != STORE_NOT_FOUND) return rc;
    }
    int rc = store_job_insert(tx, &op->nj, &op->job);
    if (rc) return rc;
    if (op->idem_key) rc = store_idem_insert(tx, op->tenant_id, op->idem_key, op->hash, op->job.id);
    return rc;
}

/* ---------------- job arrays ---------------- */

/* An `array` submission makes one job per member (jobspec_array_member),
 * each labelled loom.array=<a-...> and loom.array_index=<i>, all in one
 * transaction: every member is checked like a single job first, and one bad
 * member stores nothing. */
struct array_op {
    int n;
    struct store_job_new *nj;
    struct store_job *jobs;
};

static int array_submit_cb(struct store_tx *tx, void *arg) {
    struct array_op *op = arg;
    for (int i = 0; i < op->n; i++) {
        int rc = store_job_insert(tx, &op->nj[i], &op->jobs[i]);
        if (rc) return rc;
    }
    return STORE_OK;
}

static int submit_array(struct http_req *req, const struct loom_spec *parent,
                        const struct roots *roots) {
    size_t n = jobspec_array_size(parent);
    struct array_op op = {(int)n, calloc(n, sizeof *op.nj), calloc(n, sizeof *op.jobs)};
    struct loom_spec *m = calloc(n, sizeof *m);
    char **canon = calloc(n, sizeof *canon), **names = calloc(n, sizeof *names);
    json_t **labels = calloc(n, sizeof *labels);
    json_t *items = NULL;
    struct loom_error err;
    memset(&err, 0, sizeof err);
    char aid[16];
    unsigned char rnd[6];
    int ret = 0, rc;
    if (!op.nj || !op.jobs || !m || !canon || !names || !labels || RAND_bytes(rnd, 6) != 1) {
        API_ERROR(req, INTERNAL, "out of memory");
        goto out;
    }
    snprintf(aid, sizeof aid, "a-%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
             rnd[5]);
    for (size_t i = 0; i < n; i++) {
        json_t *body = jobspec_array_member(parent, req->json, i);
        rc = body ? jobspec_parse(&m[i], body, 0, &err) : -1;
        if (rc == 0 && !json_object_get(body, "preemptible") &&
            m[i].priority < req->ld->cfg.preempt_below)
            m[i].preemptible = 1;
        json_decref(body);
        if (rc == 0) rc = jobspec_check_paths(&m[i], roots->v, roots->n, 0, &err);
        if (rc == 0) rc = submitcheck_vocab(&m[i], &err);
        if (rc == 0) rc = check_fit(req->ld, &m[i], &err);
        if (rc != 0) {
            char msg[sizeof err.message];
            memcpy(msg, err.message, sizeof msg);
            snprintf(err.message, sizeof err.message, "array member %zu: %.*s", i,
                     (int)sizeof err.message - 40, msg);
            reply_spec_error(req, &err);
            goto out;
        }
        canon[i] = jobspec_dumps(&m[i]);
        labels[i] = json_object();
        names[i] = NULL;
        if (!canon[i] || !labels[i] || asprintf(&names[i], "%s-%zu", m[i].name, i) < 0) {
            names[i] = NULL;
            API_ERROR(req, INTERNAL, "out of memory");
            goto out;
        }
        for (int k = 0; k < m[i].n_labels; k++)
            json_object_set_new(labels[i], m[i].labels[k].key, json_string(m[i].labels[k].value));
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        json_object_set_new(labels[i], "loom.array", json_string(aid));
        json_object_set_new(labels[i], "loom.array_index", json_string(idx));
        struct jobspec_derived d;
        jobspec_derive(&m[i], &d);
        op.nj[i] = (struct store_job_new){.tenant_id = req->tenant_id,
                                          .name = names[i],
                                          .spec_json = canon[i],
                                          .labels = labels[i],
                                          .priority = m[i].priority,
                                          .max_retries = m[i].max_retries,
                                          .world_size = d.world,
                                          .tp = m[i].parallel.tp,
                                          .gpus_per_node = m[i].resources.gpus_per_node,
                                          .device = jobspec_device_name(m[i].resources.device),
                                          .out_dir_root = req->ld->cfg.jobs_dir};
    }
    rc = store_write(req->ld->store, array_submit_cb, &op);
    if (rc != STORE_OK) {
        reply_store_error(req, rc, "");
        goto out;
    }
    http_notify_signal(&req->ld->jobs_changed);
    items = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(items, store_job_to_json(&op.jobs[i]));
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/jobs?label=loom.array=%s", aid);
    http_add_header(req, "Location", loc);
    http_reply_json(req, 201, json_pack("{s:s, s:o}", "array_id", aid, "items", items));
out:
    for (size_t i = 0; i < n; i++) {
        if (op.jobs) store_job_clear(&op.jobs[i]);
        if (canon) free(canon[i]);
        if (names) free(names[i]);
        if (labels) json_decref(labels[i]);
    }
    free(op.nj);
    free(op.jobs);
    free(m);
    free(canon);
    free(names);
    free(labels);
    return ret;
}

int api_jobs_submit(struct http_req *req) {
    struct loom_spec *spec = malloc(sizeof *spec);
    struct loom_error err;
    struct roots roots = {0};
    char *canon = NULL;
    json_t *labels = NULL, *body = NULL;
    struct submit_op op;
    memset(&op, 0, sizeof op);
    memset(&err, 0, sizeof err);
    if (!spec) return API_ERROR(req, INTERNAL, "out of memory");
    const char *key = http_header(req, "Idempotency-Key");
    if (key && (!*key || strlen(key) > IDEM_KEY_MAX)) {
        API_ERROR(req, INVALID_IDEMPOTENCY_KEY, "Idempotency-Key must be 1-%d characters",
                  IDEM_KEY_MAX);
        goto out;
    }
    if (load_roots(req, &roots) != 0) {
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        goto out;
    }
    int configured = !(roots.n == 1 && !strcmp(roots.v[0], "/") &&
                       !(req->ld->cfg.data_roots && *req->ld->cfg.data_roots));
    /* model.init_from (an HF directory, a job) fills the model's shape in
     * before the spec is parsed (daemon/initfrom.h) */
    struct initfrom_ctx ic = {.st = req->ld->store,
                              .tenant_id = req->tenant_id,
                              .roots = roots.v,
                              .nroots = roots.n,
                              .strict = configured && submitcheck_roots_visible(roots.v, roots.n)};
    if (initfrom_resolve(&ic, req->json, &body, &err) != 0 ||
        jobspec_parse(spec, body, JOBSPEC_ARRAY_MEMBERS, &err) != 0) {
        reply_spec_error(req, &err);
        goto out;
    }
    if (jobspec_check_paths(spec, roots.v, roots.n, 0, &err) != 0) {
        reply_spec_error(req, &err);
        goto out;
    }
    /* What loomd can see of the data and the tenant (daemon/submitcheck.c). */
    {
        struct jobspec_derived dd;
        jobspec_derive(spec, &dd);
        if (submitcheck_data(spec, roots.v, roots.n, configured, &err) != 0 ||
            submitcheck_vocab(spec, &err) != 0 ||
            submitcheck_quota(req->ld->store, req->tenant_id, dd.world, &err) != 0) {
            reply_spec_error(req, &err);
            goto out;
        }
    }
    if (check_job_refs(req, spec) != 0) goto out;
    if (check_qos(req, spec) != 0) goto out;
    if (check_fit(req->ld, spec, &err) != 0) {
        reply_spec_error(req, &err);
        goto out;
    }
    if (jobspec_array_size(spec) > 1) {
        if (key)
            API_ERROR(req, INVALID_IDEMPOTENCY_KEY,
                      "Idempotency-Key is not taken with an array submission (%zu jobs); submit "
                      "without it, or each member on its own",
                      jobspec_array_size(spec));
        else
            submit_array(req, spec, &roots);
        goto out;
    }
    /* A job that does not say whether it may be preempted is preemptible
     * below the cluster's threshold (--preempt-below-priority); the stored
     * spec records the answer. */
    if (!json_object_get(req->json, "preemptible") && spec->priority < req->ld->cfg.preempt_below)
        spec->preemptible = 1;
    canon = jobspec_dumps(spec);
    if (!canon) {
        API_ERROR(req, INTERNAL, "out of memory");
        goto out;
    }
    struct jobspec_derived d;
    jobspec_derive(spec, &d);
    labels = json_object();
    for (int i = 0; i < spec->n_labels; i++)
        json_object_set_new(labels, spec->labels[i].key, json_string(spec->labels[i].value));
    op.tenant_id = req->tenant_id;
    op.idem_key = key;
    if (key) {
        /* Same key + same body means the same request: hash the body in a
         * canonical form (sorted keys) so key order and spacing do not matter. */
        char *body = json_dumps(req->json, JSON_COMPACT | JSON_SORT_KEYS);
        unsigned int n = 32;
        EVP_Digest(body ? body : "", body ? strlen(body) : 0, op.hash, &n, EVP_sha256(), NULL);
        free(body);
    }
    op.nj.tenant_id = req->tenant_id;
    op.nj.name = spec->name;
    op.nj.spec_json = canon;
    op.nj.labels = labels;
    op.nj.priority = spec->priority;
    op.nj.max_retries = spec->max_retries;
    op.nj.world_size = d.world;
    op.nj.tp = spec->parallel.tp;
    op.nj.device = jobspec_device_name(spec->resources.device);
    op.nj.gpus_per_node = spec->resources.gpus_per_node;
    op.nj.out_dir_root = req->ld->cfg.jobs_dir;
    int rc = store_write(req->ld->store, submit_cb, &op);
    if (rc == STORE_CONFLICT) {
        API_ERROR(req, IDEMPOTENCY_CONFLICT, "Idempotency-Key '%s' was used with a different body",
                  key);
        goto out;
    }
    if (rc != STORE_OK) {
        reply_store_error(req, rc, "");
        goto out;
    }
    if (!op.replayed) http_notify_signal(&req->ld->jobs_changed);
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/jobs/%s", op.job.id);
    http_add_header(req, "Location", loc);
    if (op.replayed) http_add_header(req, "Idempotent-Replayed", "true");
    reply_job(req, 201, &op.job);
out:
    store_job_clear(&op.job);
    json_decref(labels);
    json_decref(body);
    free(canon);
    free(roots.buf);
    free(spec);
    return 0;
}

/* Whose jobs a request may see: its own tenant's; the admin token (on
 * routes that accept it) sees every tenant's, or one with ?tenant=. */
static const char *scope(struct http_req *req) {
    if (!req->is_admin) return req->tenant_id;
    const char *t = http_query(req, "tenant");
    return t && *t ? t : NULL;
}

/* ---------------- list ---------------- */

struct list_op {
    struct store_job_filter f;
    char *buf; /* the items, comma-separated JSON texts */
    size_t len, cap;
    int64_t last_seq;
    int count;
    int oom;
};

static int list_item_cb(const struct store_job *j, void *arg) {
    struct list_op *op = arg;
    if (op->count == op->f.limit - 1) {
        /* The extra row only tells that another page exists. */
        op->count++;
        return 0;
    }
    /* lists stay small: no spec (GET /v1/jobs/{id} has it) */
    char *t = store_job_dumps(j, 0);
    size_t tl = t ? strlen(t) - 1 : 0; /* drop the newline */
    if (!t || buf_grow_array(&op->buf, &op->cap, op->len + tl + 2, 1, 16384) != 0) {
        free(t);
        op->oom = 1;
        return 1;
    }
    if (op->count) op->buf[op->len++] = ',';
    memcpy(op->buf + op->len, t, tl);
    op->len += tl;
    free(t);
    op->last_seq = j->seq;
    op->count++;
    return 0;
}

static int list_cb(struct store_tx *tx, void *arg) {
    struct list_op *op = arg;
    int rc = store_job_foreach(tx, &op->f, list_item_cb, op);
    return rc < 0 ? rc : STORE_OK;
}

static int parse_long(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int api_jobs_list(struct http_req *req) {
    struct list_op op;
    memset(&op, 0, sizeof op);
    op.f.tenant_id = scope(req);
    op.f.skip_spec = 1;
    long long limit = LIST_DEFAULT;
    const char *q;
    if ((q = http_query(req, "limit")) && parse_long(q, 1, LIST_MAX, &limit) != 0)
        return API_ERROR(req, INVALID_QUERY, "limit=%s is not an integer in [1, %d]", q, LIST_MAX);
    op.f.limit = (int)limit + 1;
    char states[128];
    if ((q = http_query(req, "state")) && *q) {
        snprintf(states, sizeof states, "%s", q);
        for (char *save = NULL, *t = strtok_r(states, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            int s = job_state_parse(t);
            if (s < 0)
                return API_ERROR(req, INVALID_QUERY,
                                 "state=%s is not one of queued, starting, running, cancelling, "
                                 "succeeded, failed, cancelled",
                                 t);
            op.f.state_mask |= JOB_MASK(s);
        }
    }
    if ((q = http_query(req, "name")) && *q) op.f.name = q;
    char label[512];
    if ((q = http_query(req, "label")) && *q) {
        snprintf(label, sizeof label, "%s", q);
        char *eq = strchr(label, '=');
        if (!eq || eq == label)
            return API_ERROR(req, INVALID_QUERY, "label=%s is not KEY=VALUE", q);
        *eq = 0;
        op.f.label_key = label;
        op.f.label_value = eq + 1;
    }
    if ((q = http_query(req, "cursor")) && *q) {
        long long c;
        if (q[0] != 'c' || parse_long(q + 1, 1, INT64_MAX, &c) != 0)
            return API_ERROR(req, INVALID_CURSOR, "cursor '%s' was not issued by loomd", q);
        op.f.before_seq = c;
    }
    int rc = store_read(req->ld->store, list_cb, &op);
    if (rc != STORE_OK || op.oom) {
        free(op.buf);
        return op.oom ? API_ERROR(req, INTERNAL, "out of memory")
                      : reply_store_error(req, STORE_ERR, "");
    }
    char next[48] = "null";
    if (op.count == op.f.limit) snprintf(next, sizeof next, "\"c%lld\"", (long long)op.last_seq);
    size_t total = op.len + 64;
    char *out = malloc(total);
    if (!out) {
        free(op.buf);
        return API_ERROR(req, INTERNAL, "out of memory");
    }
    int n = snprintf(out, total, "{\"items\":[%.*s],\"next_cursor\":%s}\n", (int)op.len,
                     op.buf ? op.buf : "", next);
    http_reply_text(req, 200, "application/json", out, (size_t)n);
    free(out);
    free(op.buf);
    return 0;
}

/* ---------------- get / cancel / events ---------------- */

struct job_op {
    const char *tenant_id;
    const char *id;
    struct store_job job;
    json_t *events;
    int changed;
};

static int get_cb(struct store_tx *tx, void *arg) {
    struct job_op *op = arg;
    return store_job_get(tx, op->tenant_id, op->id, &op->job);
}

int api_jobs_get(struct http_req *req) {
    struct job_op op = {.tenant_id = req->is_admin ? NULL : req->tenant_id,
                        .id = http_param(req, "id")};
    int rc = store_read(req->ld->store, get_cb, &op);
    if (rc != STORE_OK) return reply_store_error(req, rc, op.id);
    reply_job(req, 200, &op.job);
    store_job_clear(&op.job);
    return 0;
}

static int cancel_cb(struct store_tx *tx, void *arg) {
    struct job_op *op = arg;
    int rc = store_job_get(tx, op->tenant_id, op->id, &op->job);
    if (rc) return rc;
    enum job_state to;
    if (op->job.state == JOB_QUEUED)
        to = JOB_CANCELLED; /* nothing runs yet: done at once */
    else if (op->job.state == JOB_STARTING || op->job.state == JOB_RUNNING)
        to = JOB_CANCELLING; /* ranks are stopped by the attempt supervisor */
    else
        return STORE_OK; /* cancelling or finished: cancel is idempotent */
    struct job_change ch = {.reason = op->tenant_id ? "cancelled by tenant" : "cancelled by admin",
                            .expect_attempt = -1};
    store_job_clear(&op->job);
    rc = store_job_transition(tx, op->id,
                              JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_RUNNING),
                              to, &ch, &op->job);
    if (rc == STORE_OK) op->changed = 1;
    return rc;
}

int api_jobs_cancel(struct http_req *req) {
    struct job_op op = {.tenant_id = req->is_admin ? NULL : req->tenant_id,
                        .id = http_param(req, "id")};
    int rc = store_write(req->ld->store, cancel_cb, &op);
    if (rc != STORE_OK) {
        store_job_clear(&op.job);
        return reply_store_error(req, rc, op.id);
    }
    if (op.changed) http_notify_signal(&req->ld->jobs_changed);
    reply_job(req, 200, &op.job);
    store_job_clear(&op.job);
    return 0;
}

static int events_cb(struct store_tx *tx, void *arg) {
    struct job_op *op = arg;
    int rc = store_job_get(tx, op->tenant_id, op->id, &op->job);
    if (rc) return rc;
    return store_job_events(tx, op->job.seq, &op->events);
}

int api_jobs_events(struct http_req *req) {
    struct job_op op = {.tenant_id = req->is_admin ? NULL : req->tenant_id,
                        .id = http_param(req, "id")};
    int rc = store_read(req->ld->store, events_cb, &op);
    store_job_clear(&op.job);
    if (rc != STORE_OK) return reply_store_error(req, rc, op.id);
    return http_reply_json(req, 200, json_pack("{s:s, s:o}", "job_id", op.id, "items", op.events));
}

/* ---------------- plan ---------------- */

/* model.init_from resolved as at submit (daemon/initfrom.h), so a plan of
 * {"model": {"init_from": DIR}} has the directory's sizes. Only for a
 * tenant's token (its data roots and jobs); the admin's plan is as given.
 * 0 with *body a new reference, or -1 after replying. */
static int plan_body(struct http_req *req, json_t **body) {
    *body = NULL;
    if (!req->tenant_id[0]) {
        *body = json_incref(req->json);
        return 0;
    }
    struct roots roots = {0};
    struct loom_error err;
    memset(&err, 0, sizeof err);
    if (load_roots(req, &roots) != 0) {
        free(roots.buf);
        API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        return -1;
    }
    int configured = !(roots.n == 1 && !strcmp(roots.v[0], "/") &&
                       !(req->ld->cfg.data_roots && *req->ld->cfg.data_roots));
    struct initfrom_ctx ic = {.st = req->ld->store,
                              .tenant_id = req->tenant_id,
                              .roots = roots.v,
                              .nroots = roots.n,
                              .strict = configured && submitcheck_roots_visible(roots.v, roots.n)};
    int rc = initfrom_resolve(&ic, req->json, body, &err);
    free(roots.buf);
    if (rc != 0) reply_spec_error(req, &err);
    return rc;
}

int api_jobs_plan(struct http_req *req) {
    struct planner_cluster c;
    struct planner_fleet f;
    struct loom_error err;
    json_t *body = NULL;
    memset(&err, 0, sizeof err);
    if (plan_body(req, &body) != 0) return 0;
    nodes_fleet(req->ld, &f);
    int rc = known_cluster(req->ld, body, &f, &c, &err);
    json_t *out = NULL;
    if (rc == 0) rc = planner_plan_json(body, &c, &out, &err);
    json_decref(body);
    if (rc != 0) return reply_spec_error(req, &err);
    /* cost on each GPU type of the cluster and the cheapest that fits it as given */
    struct loom_spec s;
    if (jobspec_parse(&s, json_object_get(out, "spec"), JOBSPEC_FOR_PLAN, &err) == 0) {
        const char *cheapest = NULL;
        json_object_set_new(out, "gpu_types", planner_fleet_costs(&s, &f, &cheapest));
        json_object_set_new(out, "cheapest_fit", cheapest ? json_string(cheapest) : json_null());
    }
    return http_reply_json(req, 200, out);
}

/* ---------------- job arrays: cancel ---------------- */

struct array_cancel_op {
    const char *tenant_id, *array_id;
    int found, changed;
};

static int array_cancel_cb(struct store_tx *tx, void *arg) {
    struct array_cancel_op *op = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT j.id FROM jobs j JOIN job_labels l ON l.job_seq = j.seq WHERE l.key = "
            "'loom.array' AND l.value = ?1 AND (?2 IS NULL OR j.tenant_id = ?2) ORDER BY j.seq");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, op->array_id, -1, SQLITE_STATIC);
    if (op->tenant_id) sqlite3_bind_text(st, 2, op->tenant_id, -1, SQLITE_STATIC);
    char(*ids)[24] = NULL;
    int n = 0, cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (BUF_GROW(ids, cap, n + 1, 16) != 0) break;
        snprintf(ids[n++], 24, "%s", (const char *)sqlite3_column_text(st, 0));
    }
    sqlite3_reset(st);
    int ret = rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
    op->found = n;
    for (int i = 0; ret == STORE_OK && i < n; i++) {
        struct job_op one = {.tenant_id = op->tenant_id, .id = ids[i]};
        ret = cancel_cb(tx, &one);
        op->changed |= one.changed;
        store_job_clear(&one.job);
    }
    free(ids);
    return ret;
}

/* POST /v1/arrays/{id}/cancel: cancels every member of the tenant's array. */
int api_arrays_cancel(struct http_req *req) {
    struct array_cancel_op op = {req->is_admin ? NULL : req->tenant_id, http_param(req, "id"), 0,
                                 0};
    int rc = store_write(req->ld->store, array_cancel_cb, &op);
    if (rc != STORE_OK) return reply_store_error(req, rc, op.array_id);
    if (!op.found) return http_error(req, 404, "NOT_FOUND", "array %s not found", op.array_id);
    if (op.changed) http_notify_signal(&req->ld->jobs_changed);
    return http_reply_json(req, 200,
                           json_pack("{s:s, s:i}", "array_id", op.array_id, "jobs", op.found));
}
