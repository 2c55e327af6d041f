/* Agent protocol handlers: registration, heartbeats, the long-poll for the
 * desired task set, metrics batches and log chunks. Every handler answers
 * quickly except assignments, which waits on the cluster's `assign` notify. */
#define _GNU_SOURCE
#include "daemon/agent_api.h"

#include "common/log.h"
#include "daemon/auth.h"
#include "daemon/cluster.h"
#include "daemon/diagnose.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/nodes.h"
#include "daemon/store.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int safe_name(const char *s) {
    if (!s || !*s || strlen(s) > 63) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return 0;
    return strcmp(s, ".") && strcmp(s, "..");
}

void agent_api_log_path(const char *logs_dir, const char *job, int attempt, int rank,
                        const char *stream, char *out, size_t len) {
    snprintf(out, len, "%s/%s/%d.%d.%s.log", logs_dir, job, attempt, rank, stream);
}

struct node_row {
    const char *name, *kind, *hostname;
    const char *comm_addr, *comm_iface;
    char *devices;
    int64_t now;
    const char *gpu_type;
    const json_t *inventory;
    const char *art_url, *art_token; /* agent/artifacts.h; "" when none */
    double cpu_peak_gflops;          /* agent/cpupeak.h; 0 when none */
};

static int upsert_node(struct store_tx *tx, void *arg) {
    struct node_row *r = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "INSERT INTO nodes (name, kind, devices, hostname, registered_at, last_seen, "
            "comm_addr, comm_iface) VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7) ON CONFLICT(name) DO "
            "UPDATE SET kind = ?2, devices = ?3, hostname = ?4, last_seen = ?5, comm_addr = ?6, "
            "comm_iface = ?7");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, r->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, r->devices ? r->devices : "[]", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, r->hostname, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, r->now);
    sqlite3_bind_text(st, 6, r->comm_addr, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, r->comm_iface, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    if (rc == STORE_OK) rc = nodes_store_inventory(tx, r->name, r->gpu_type, r->inventory);
    if (rc == STORE_OK) {
        st = store_stmt(tx,
                        "UPDATE nodes SET artifact_url = ?2, artifact_token = ?3 WHERE name = ?1");
        if (!st) return STORE_ERR;
        sqlite3_bind_text(st, 1, r->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, r->art_url, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, r->art_token, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
        sqlite3_reset(st);
    }
    if (rc == STORE_OK) {
        st = store_stmt(tx, "UPDATE nodes SET cpu_peak_gflops = ?2 WHERE name = ?1");
        if (!st) return STORE_ERR;
        sqlite3_bind_text(st, 1, r->name, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 2, r->cpu_peak_gflops);
        rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
        sqlite3_reset(st);
    }
    return rc;
}

static void record_tasks(struct cluster *c, int ni, json_t *tasks, int64_t now) {
    struct cluster_node *n = &c->nodes[ni];
    json_decref(n->tasks);
    n->tasks = json_is_array(tasks) ? json_incref(tasks) : json_array();
    size_t i;
    json_t *t;
    json_array_foreach(n->tasks, i, t) cluster_task_report(c, ni, t, now);
}

/* What a registration does, decided from the caller (join token or node
 * credential) and the node's admission. */
struct reg_plan {
    int admission; /* after this registration */
    int issue;     /* a new credential is issued (and replaces any old one) */
    int event;     /* a node.pending / node.approved event is recorded */
};

/* Caller holds c->mu. 0 and *p, or an API error written to req (-1). */
static int plan_register(struct http_req *req, struct cluster *c, const char *name,
                         struct reg_plan *p) {
    int ni = cluster_node_find(c, name);
    const struct cluster_node *n = ni >= 0 ? &c->nodes[ni] : NULL;
    int autoa = req->ld->cfg.auto_approve;
    memset(p, 0, sizeof *p);
    if (req->node[0]) { /* a node credential: pending or approved */
        if (strcmp(req->node, name) != 0) {
            API_ERROR(req, NODE_MISMATCH, "the credential is node %s's, not %s's", req->node, name);
            return -1;
        }
        p->admission = n ? n->admission : NODE_PENDING;
        return 0;
    }
    int cur = n ? n->admission : NODE_REVOKED;
    if (cur == NODE_REJECTED) {
        API_ERROR(req, NODE_REJECTED,
                  "node %s was rejected; an admin can DELETE /v1/nodes/%s to let it apply again",
                  name, name);
        return -1;
    }
    if (cur == NODE_APPROVED && n->has_cred && !autoa) {
        API_ERROR(req, NODE_CREDENTIAL_REQUIRED,
                  "node %s is approved and registers with its own credential, not the join "
                  "token (restore the agent's node.credential, or DELETE /v1/nodes/%s and approve "
                  "it again)",
                  name, name);
        return -1;
    }
    p->issue = 1;
    p->admission = cur == NODE_APPROVED || autoa ? NODE_APPROVED : NODE_PENDING;
    p->event = p->admission != cur;
    return 0;
}

struct reg_write {
    struct node_row *row;
    const struct reg_plan *plan;
    const unsigned char *cred;
};

static int register_cb(struct store_tx *tx, void *arg) {
    struct reg_write *w = arg;
    int rc = upsert_node(tx, w->row);
    if (rc == STORE_OK && w->plan->issue)
        rc = nodes_store_admission(tx, w->row->name, w->plan->admission, w->cred, NULL);
    if (rc == STORE_OK && w->plan->event)
        rc = nodes_emit_event(tx, w->row->name, w->plan->admission, NULL);
    return rc;
}

/* An advertised listen address or interface name: short, and only the
 * characters of numeric IPv4/IPv6 addresses (with a %scope), host names and
 * interface names, so it can go into a worker's environment as it is. */
static int comm_token_ok(const char *s, size_t max) {
    if (!s) return 1; /* absent: an older agent, none advertised */
    if (strlen(s) >= max) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr(".:-_%", *p)))
            return 0;
    return 1;
}

int agent_api_register(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *name = json_string_value(json_object_get(req->json, "node"));
    const char *kind = json_string_value(json_object_get(req->json, "kind"));
    const char *host = json_string_value(json_object_get(req->json, "hostname"));
    json_t *devices = json_object_get(req->json, "devices");
    if (!safe_name(name))
        return http_error(req, 400, "INVALID_NODE_NAME",
                          "node name must be 1-63 characters of [A-Za-z0-9._-]");
    if (!kind || (strcmp(kind, "cuda") && strcmp(kind, "cpu")))
        return http_error(req, 400, "INVALID_DEVICE_KIND", "kind must be \"cuda\" or \"cpu\"");
    if (!json_is_array(devices) || json_array_size(devices) > 64)
        return http_error(req, 400, "INVALID_DEVICES", "devices must be an array of at most 64");
    const char *caddr = json_string_value(json_object_get(req->json, "comm_addr"));
    const char *ciface = json_string_value(json_object_get(req->json, "comm_iface"));
    if (!comm_token_ok(caddr, sizeof c->nodes[0].comm_addr) ||
        !comm_token_ok(ciface, sizeof c->nodes[0].comm_iface))
        return http_error(req, 400, "INVALID_COMM_ADDR",
                          "comm_addr '%.80s' / comm_iface '%.40s': at most %zu / %zu characters "
                          "of [A-Za-z0-9.:_%%-]",
                          caddr ? caddr : "", ciface ? ciface : "",
                          sizeof c->nodes[0].comm_addr - 1, sizeof c->nodes[0].comm_iface - 1);
    if (!caddr) caddr = "";
    if (!ciface) ciface = "";
    /* The cpu peak (agent/cpupeak.h): absent or null from an agent that has none. */
    json_t *peak = json_object_get(req->json, "cpu_peak_gflops");
    double cpu_peak = json_is_number(peak) ? json_number_value(peak) : 0;
    if (peak && !json_is_null(peak) && !(json_is_number(peak) && cpu_peak > 0 && cpu_peak <= 1e7)) {
        char *text = json_dumps(peak, JSON_ENCODE_ANY | JSON_COMPACT);
        int hr = http_error(req, 400, "INVALID_CPU_PEAK",
                            "cpu_peak_gflops %.40s: expected a number in (0, 1e7] GFLOP/s",
                            text ? text : "?");
        free(text);
        return hr;
    }
    struct reg_plan plan;
    pthread_mutex_lock(&c->mu);
    int full = cluster_node_find(c, name) < 0 && c->nnodes >= CLUSTER_MAX_NODES;
    int planned = full ? -1 : plan_register(req, c, name, &plan);
    pthread_mutex_unlock(&c->mu);
    if (full)
        return http_error(req, 503, "TOO_MANY_NODES", "the cluster holds at most %d nodes",
                          CLUSTER_MAX_NODES);
    if (planned != 0) return 0; /* answered */
    char cred_text[80] = "";
    unsigned char cred[32];
    if (plan.issue) {
        if (auth_new_token(cred_text, sizeof cred_text) != 0)
            return API_ERROR(req, INTERNAL, "no randomness for a node credential");
        auth_hash(cred_text, cred);
    }
    int64_t now = store_now_ms();
    char gpu_type[24];
    nodes_gpu_type(kind, devices, gpu_type, sizeof gpu_type);
    json_t *inventory = json_object_get(req->json, "inventory");
    /* The node's artifact server (agent/artifacts.h), optional. */
    json_t *arts = json_object_get(req->json, "artifacts");
    const char *art_url = json_string_value(json_object_get(arts, "url"));
    const char *art_token = json_string_value(json_object_get(arts, "token"));
    if (arts && (!art_url || strncmp(art_url, "http://", 7) || strlen(art_url) > 255 ||
                 !art_token || strlen(art_token) < 32 || strlen(art_token) > 128))
        return http_error(req, 400, "INVALID_ARTIFACT_SERVER",
                          "artifacts must be {\"url\": \"http://HOST:PORT\" (at most 255 "
                          "characters), \"token\": 32-128 characters}");
    struct node_row row = {name,
                           kind,
                           host ? host : "",
                           caddr,
                           ciface,
                           json_dumps(devices, JSON_COMPACT),
                           now,
                           gpu_type,
                           inventory,
                           art_url ? art_url : "",
                           art_token ? art_token : "",
                           cpu_peak};
    struct reg_write w = {&row, &plan, cred};
    int rc = store_write(req->ld->store, register_cb, &w);
    free(row.devices);
    if (rc != STORE_OK) return http_error(req, 503, "STORE_UNAVAILABLE", "could not record node");

    pthread_mutex_lock(&c->mu);
    int ni = cluster_node_find(c, name);
    if (ni < 0 && c->nnodes < CLUSTER_MAX_NODES) {
        ni = c->nnodes++;
        memset(&c->nodes[ni], 0, sizeof c->nodes[ni]);
        snprintf(c->nodes[ni].name, sizeof c->nodes[ni].name, "%s", name);
        c->nodes[ni].registered_at = now;
        c->nodes[ni].tasks = json_array();
    }
    if (ni < 0) {
        pthread_mutex_unlock(&c->mu);
        return http_error(req, 503, "TOO_MANY_NODES", "the cluster holds at most %d nodes",
                          CLUSTER_MAX_NODES);
    }
    struct cluster_node *n = &c->nodes[ni];
    int was_lost = n->lost;
    snprintf(n->kind, sizeof n->kind, "%s", kind);
    snprintf(n->hostname, sizeof n->hostname, "%s", host ? host : "");
    snprintf(n->comm_addr, sizeof n->comm_addr, "%s", caddr);
    snprintf(n->comm_iface, sizeof n->comm_iface, "%s", ciface);
    n->cpu_peak_gflops = cpu_peak;
    json_decref(n->devices);
    n->devices = json_incref(devices);
    n->ndev = (int)json_array_size(devices);
    const char *model = json_string_value(json_object_get(json_array_get(devices, 0), "name"));
    snprintf(n->gpu_model, sizeof n->gpu_model, "%s", model ? model : kind);
    json_t *hostinfo = json_object_get(req->json, "host");
    json_decref(n->host);
    n->host = json_is_object(hostinfo) ? json_deep_copy(hostinfo) : json_object();
    nodes_apply_inventory(n, inventory);
    n->admission = plan.admission;
    if (plan.issue) {
        memcpy(n->cred, cred, sizeof n->cred);
        n->has_cred = 1;
    }
    n->last_hb_ms = now;
    int approved = plan.admission == NODE_APPROVED;
    if (approved) {
        /* Tasks a pending node reports are not believed: it may not touch attempts. */
        n->lost = 0;
        n->seen = 1;
        record_tasks(c, ni, json_object_get(req->json, "tasks"), now);
    }
    cluster_changed(c);
    char epoch[20];
    snprintf(epoch, sizeof epoch, "%s", c->epoch);
    pthread_mutex_unlock(&c->mu);
    http_notify_signal(&c->assign);
    cluster_kick(req->ld);
    log_info("cluster: node %s registered (%s, %d device(s))%s%s", name, kind,
             (int)json_array_size(devices), was_lost ? " after being lost" : "",
             approved ? "" : ": pending approval (POST /v1/nodes/NAME/approve)");
    json_t *reply = json_pack("{s:s, s:s, s:I, s:s, s:I}", "node", name, "state",
                              nodes_admission_name(plan.admission), "heartbeat_ms",
                              (json_int_t)req->ld->cfg.heartbeat * 1000, "epoch", epoch,
                              "node_timeout_ms", (json_int_t)req->ld->cfg.node_timeout * 1000);
    if (plan.issue) json_object_set_new(reply, "credential", json_string(cred_text));
    OPENSSL_cleanse(cred_text, sizeof cred_text);
    return http_reply_json(req, approved ? 200 : 202, reply);
}

/* The node named in an agent request must be the credential's node. */
static int node_matches(struct http_req *req, const char *name) {
    if (!name || !req->node[0] || !strcmp(name, req->node)) return 1;
    API_ERROR(req, NODE_MISMATCH, "the credential is node %s's, not %s's", req->node, name);
    return 0;
}

/* ---- what a node may report ---- */

struct held_row {
    const char *job, *node;
    int attempt, rank;
    int found;
};

static int held_in_store(struct store_tx *tx, void *arg) {
    struct held_row *h = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT 1 FROM attempts a, json_each(a.placement) p WHERE a.job_id = ?1 AND "
                       "a.attempt = ?2 AND json_extract(p.value, '$.node') = ?3 AND "
                       "json_extract(p.value, '$.rank') = ?4 LIMIT 1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, h->job, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, h->attempt);
    sqlite3_bind_text(st, 3, h->node, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, h->rank);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    h->found = rc == SQLITE_ROW;
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* 1 when rank `rank` of (job, attempt) is placed on the credential's node:
 * the live attempt's placement, else the attempts row's (an attempt that
 * ended still ships its last log bytes and records), 0 when it is not, -1
 * when the store cannot say. Caller does not hold c->mu. */
static int node_holds(struct http_req *req, const char *job, int attempt, int rank) {
    struct cluster *c = req->ld->cluster;
    if (!job || rank < 0 || attempt < 0) return 0;
    pthread_mutex_lock(&c->mu);
    struct cluster_attempt *a = cluster_attempt_find(c, job, attempt);
    int held = -2;
    if (a)
        held = rank < a->world && a->ranks[rank].node >= 0 && a->ranks[rank].node < c->nnodes &&
               !strcmp(c->nodes[a->ranks[rank].node].name, req->node);
    pthread_mutex_unlock(&c->mu);
    if (held != -2) return held;
    struct held_row h = {job, req->node, attempt, rank, 0};
    if (store_read(req->ld->store, held_in_store, &h) != STORE_OK) return -1;
    return h.found;
}

/* Replies 403 TASK_NOT_ON_NODE (or 503) unless the node holds the task. */
static int check_holds(struct http_req *req, const char *job, json_int_t attempt, json_int_t rank) {
    int h = node_holds(req, job, (int)attempt, (int)rank);
    if (h > 0) return 0;
    if (h < 0)
        http_error(req, 503, "STORE_UNAVAILABLE", "could not check the task's placement; retry");
    else
        API_ERROR(req, TASK_NOT_ON_NODE,
                  "job %.64s attempt %lld rank %lld is not placed on node %s", job ? job : "?",
                  (long long)attempt, (long long)rank, req->node);
    return -1;
}

static void diagnose_util(struct cluster *c, int ni, json_t *notes);
static int notes_cb(struct store_tx *tx, void *arg);

int agent_api_heartbeat(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *name = json_string_value(json_object_get(req->json, "node"));
    if (!name) return http_error(req, 400, "INVALID_NODE_NAME", "node is required");
    if (!node_matches(req, name)) return 0;
    int64_t now = store_now_ms();
    pthread_mutex_lock(&c->mu);
    int ni = cluster_node_find(c, name);
    if (ni < 0 || !c->nodes[ni].seen) {
        pthread_mutex_unlock(&c->mu);
        return http_error(req, 404, "NODE_NOT_FOUND", "node %s is not registered", name);
    }
    struct cluster_node *n = &c->nodes[ni];
    if (n->lost) {
        log_info("cluster: node %s is back", n->name);
        n->lost = 0;
        cluster_changed(c);
    }
    n->last_hb_ms = now;
    json_t *devices = json_object_get(req->json, "devices");
    json_t *notes = json_array();
    if (json_is_array(devices)) {
        json_decref(n->devices);
        n->devices = json_incref(devices);
        diagnose_util(c, ni, notes);
    }
    record_tasks(c, ni, json_object_get(req->json, "tasks"), now);
    pthread_mutex_unlock(&c->mu);
    if (json_array_size(notes) > 0 && store_write(req->ld->store, notes_cb, notes) != STORE_OK)
        log_warn("cluster: diagnosis events of node %s not stored", name);
    json_decref(notes);
    cluster_kick(req->ld);
    return http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

int agent_api_assignments(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *name = http_query(req, "node");
    const char *version = http_query(req, "version");
    const char *w = http_query(req, "wait_ms");
    long wait_ms = w ? strtol(w, NULL, 10) : 0;
    long cap = req->ld->cfg.longpoll_timeout * 1000;
    if (wait_ms < 0) wait_ms = 0;
    if (wait_ms > cap) wait_ms = cap;
    if (!name) return http_error(req, 400, "INVALID_NODE_NAME", "node is required");
    if (!node_matches(req, name)) return 0;
    uint64_t gen = http_notify_gen(&c->assign);
    char cur[64];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int ni = cluster_node_find(c, name);
        if (ni < 0 || !c->nodes[ni].seen) {
            pthread_mutex_unlock(&c->mu);
            return http_error(req, 404, "NODE_NOT_FOUND", "node %s is not registered", name);
        }
        cluster_version(c, cur, sizeof cur);
        if (!version || strcmp(version, cur) || wait_ms <= 0) {
            json_t *tasks = cluster_desired(c, ni);
            pthread_mutex_unlock(&c->mu);
            return http_reply_json(req, 200,
                                   json_pack("{s:s, s:o}", "version", cur, "tasks", tasks));
        }
        pthread_mutex_unlock(&c->mu);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int r = http_wait(req->ld->http, &c->assign, &gen, (int)wait_ms);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        wait_ms -= (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (r < 0) wait_ms = 0; /* shutting down: answer now */
        if (r == 0) wait_ms = 0;
    }
}

struct metric_rows {
    json_t *items; /* borrowed */
    int64_t now;
    json_t *notes; /* borrowed: diagnosis findings {job, attempt, reason, code, rank, node, step} */
    const unsigned char *drop; /* per item: 1 leaves a rank_step record out of the store
                                * (diag_series_keep); NULL: keep all */
};

/* Rank 0's checkpoint and export records become events (daemon/events.h),
 * in the transaction that stores the batch. */
static int record_events(struct store_tx *tx, json_t *items) {
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        json_t *rec = json_object_get(it, "record");
        const char *type = json_string_value(json_object_get(rec, "type"));
        const char *job = json_string_value(json_object_get(it, "job"));
        if (!job || !type || json_integer_value(json_object_get(it, "rank")) != 0) continue;
        const char *path = json_string_value(json_object_get(rec, "path"));
        const char *kind = json_string_value(json_object_get(rec, "kind"));
        int rc = STORE_OK;
        if (!strcmp(type, "checkpoint"))
            rc = events_checkpoint_saved(
                tx, job, (int)json_integer_value(json_object_get(it, "attempt")),
                (long)json_integer_value(json_object_get(rec, "step")), path);
        else if (!strcmp(type, "export") && kind)
            rc = events_export_ready(tx, job, kind, path);
        if (rc != STORE_OK && rc != STORE_NOT_FOUND) return STORE_ERR;
    }
    return STORE_OK;
}

/* Diagnosis findings {job, attempt, reason, code, rank, node, step}: a job
 * event each, and a job.diagnosis event of the tenant's stream. */
static int write_notes(struct store_tx *tx, json_t *notes) {
    size_t k;
    json_t *note;
    json_array_foreach(notes, k, note) {
        const char *job = json_string_value(json_object_get(note, "job"));
        int rc = store_job_note(tx, job, (int)json_integer_value(json_object_get(note, "attempt")),
                                json_string_value(json_object_get(note, "reason")));
        if (rc == STORE_NOT_FOUND) continue;
        if (rc != STORE_OK) return STORE_ERR;
        /* ... and the tenant's event stream (GET /v1/events, webhooks) */
        json_t *data = json_deep_copy(note);
        json_object_del(data, "job");
        int64_t seq = events_emit(tx, "job.diagnosis", job, NULL, data);
        json_decref(data);
        if (seq < 0 && seq != STORE_NOT_FOUND) return STORE_ERR;
    }
    return STORE_OK;
}

static int notes_cb(struct store_tx *tx, void *arg) {
    return write_notes(tx, arg);
}

static int insert_metrics(struct store_tx *tx, void *arg) {
    struct metric_rows *m = arg;
    if (record_events(tx, m->items) != STORE_OK) return STORE_ERR;
    if (write_notes(tx, m->notes) != STORE_OK) return STORE_ERR;
    sqlite3_stmt *st = store_stmt(tx, "INSERT OR IGNORE INTO job_metrics (job_id, attempt, rank, "
                                      "step, at, record) VALUES (?, ?, ?, ?, ?, ?)");
    if (!st) return STORE_ERR;
    size_t i;
    json_t *it;
    json_array_foreach(m->items, i, it) {
        if (m->drop && m->drop[i]) continue;
        json_t *rec = json_object_get(it, "record");
        const char *type = json_string_value(json_object_get(rec, "type"));
        const char *job = json_string_value(json_object_get(it, "job"));
        if (!job || !type ||
            (strcmp(type, "step") && strcmp(type, "eval") && strcmp(type, "rank_step")))
            continue;
        char *text = json_dumps(rec, JSON_COMPACT);
        if (!text) continue;
        /* eval records share the step's key space shifted so they never collide */
        json_int_t step = json_integer_value(json_object_get(rec, "step"));
        if (!strcmp(type, "eval")) step = -1 - step;
        sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, json_integer_value(json_object_get(it, "attempt")));
        sqlite3_bind_int64(st, 3, json_integer_value(json_object_get(it, "rank")));
        sqlite3_bind_int64(st, 4, step);
        sqlite3_bind_int64(st, 5, m->now);
        sqlite3_bind_text(st, 6, text, -1, SQLITE_TRANSIENT);
        int rc = sqlite3_step(st);
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        free(text);
        if (rc != SQLITE_DONE) return STORE_ERR;
    }
    return STORE_OK;
}

/* Caller holds c->mu. Feeds one rank's step timing to the attempt's
 * diagnosis (daemon/diagnose.h) and appends a job event note
 * {job, attempt, reason} to `notes` for each finding. */
/* The attempt's diagnosis state, made on first use (NULL: out of memory). */
static struct diag *attempt_diag(struct cluster_attempt *a) {
    if (!a->diag) {
        /* peers: the ranks of one pipeline stage (dp x tp, tp fastest then dp) */
        const json_t *par = json_object_get(a->spec, "parallel");
        long pp = (long)json_integer_value(json_object_get(par, "pp"));
        a->diag = diag_new(a->world, pp > 1 ? a->world / (int)pp : a->world);
    }
    return a->diag;
}

static void diagnose(struct cluster *c, struct cluster_attempt *a, int rank, long step,
                     const json_t *rec, json_t *notes) {
    double st, cp, cm;
    if (a->world < 2 || diag_times(rec, &st, &cp, &cm) != 0) return;
    if (!attempt_diag(a)) return;
    struct diag_finding f[4];
    int n = diag_add(a->diag, step, rank, st, cp, cm, f, 4);
    for (int i = 0; i < n; i++) {
        char why[512];
        if (f[i].kind == DIAG_STRAGGLER) {
            int ni = a->ranks[f[i].rank].node;
            snprintf(why, sizeof why,
                     "STRAGGLER rank=%d node=%s (+%.0f%% compute: %.1f ms a step against its "
                     "peers' median %.1f ms for %d consecutive steps to step %ld; rule: above "
                     "%.1fx)",
                     f[i].rank, ni >= 0 && ni < c->nnodes ? c->nodes[ni].name : "?",
                     100 * f[i].value, f[i].compute_ms, f[i].peer_ms, f[i].streak, f[i].step,
                     DIAG_STRAGGLER_RATIO);
            log_warn("job %s attempt %d: %s", a->job_id, a->attempt, why);
        } else {
            snprintf(why, sizeof why,
                     "COMM_BOUND exposed communication is %.0f%% of the step on every rank (least: "
                     "rank %d) for %d consecutive steps to step %ld (rule: above %.0f%%); %s",
                     100 * f[i].value, f[i].rank, f[i].streak, f[i].step, 100 * DIAG_COMM_FRAC,
                     diag_comm_advice(a->spec));
            log_warn("job %s attempt %d: %s", a->job_id, a->attempt, why);
        }
        int ni = a->ranks[f[i].rank].node;
        json_array_append_new(
            notes, json_pack("{s:s, s:i, s:s, s:s, s:i, s:s, s:I}", "job", a->job_id, "attempt",
                             a->attempt, "reason", why, "code",
                             f[i].kind == DIAG_STRAGGLER ? "STRAGGLER" : "COMM_BOUND", "rank",
                             f[i].rank, "node", ni >= 0 && ni < c->nnodes ? c->nodes[ni].name : "",
                             "step", (json_int_t)f[i].step));
    }
}

/* Caller holds c->mu. Feeds node ni's device utilization (its heartbeat
 * telemetry) to the saw-tooth check of every running multi-rank attempt
 * with ranks there; findings are appended to notes. */
static void diagnose_util(struct cluster *c, int ni, json_t *notes) {
    json_t *devices = c->nodes[ni].devices;
    for (struct cluster_attempt *a = c->attempts; a; a = a->next) {
        if (a->phase != ATTEMPT_ACTIVE || !a->running || a->world < 2) continue;
        for (int r = 0; r < a->world; r++) {
            if (a->ranks[r].node != ni) continue;
            json_t *u =
                json_object_get(json_array_get(devices, (size_t)a->ranks[r].device), "util_pct");
            struct diag_finding f;
            if (!json_is_number(u) || !attempt_diag(a) ||
                !diag_util_add(a->diag, r, json_number_value(u), &f))
                continue;
            char why[512];
            snprintf(why, sizeof why,
                     "SAWTOOTH rank=%d node=%s GPU utilization swings between %.0f%% and %.0f%% "
                     "(%d swings in the last %d telemetry samples: compute, then waiting on "
                     "communication); %s",
                     r, c->nodes[ni].name, f.compute_ms, f.peer_ms, (int)f.value, DIAG_SAW_WINDOW,
                     diag_comm_advice(a->spec));
            log_warn("job %s attempt %d: %s", a->job_id, a->attempt, why);
            json_array_append_new(notes, json_pack("{s:s, s:i, s:s, s:s, s:i, s:s, s:I}", "job",
                                                   a->job_id, "attempt", a->attempt, "reason", why,
                                                   "code", "SAWTOOTH", "rank", r, "node",
                                                   c->nodes[ni].name, "step", (json_int_t)-1));
        }
    }
}

int agent_api_metrics(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *name = json_string_value(json_object_get(req->json, "node"));
    json_t *items = json_object_get(req->json, "items");
    if (!json_is_array(items))
        return http_error(req, 400, "INVALID_METRICS", "items must be an array");
    if (!node_matches(req, name)) return 0;
    /* Every item must be a task placed on this node: a node may not write
     * another node's (or another tenant's) job records. A batch with one
     * foreign item is refused whole (agents drop a refused batch). */
    size_t k;
    json_t *item;
    json_array_foreach(items, k, item) {
        if (check_holds(req, json_string_value(json_object_get(item, "job")),
                        json_integer_value(json_object_get(item, "attempt")),
                        json_integer_value(json_object_get(item, "rank"))) != 0)
            return 0;
    }
    int64_t now = store_now_ms();
    json_t *notes = json_array();
    /* calloc(0) may return NULL: one spare byte */
    unsigned char *drop = calloc(json_array_size(items) + 1, 1);
    pthread_mutex_lock(&c->mu);
    int ni = name ? cluster_node_find(c, name) : -1;
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it) {
        json_t *rec = json_object_get(it, "record");
        const char *type = json_string_value(json_object_get(rec, "type"));
        const char *job = json_string_value(json_object_get(it, "job"));
        int rank_step = type && !strcmp(type, "rank_step");
        if (!job || !type || (strcmp(type, "step") && !rank_step)) continue;
        struct cluster_attempt *a =
            cluster_attempt_find(c, job, (int)json_integer_value(json_object_get(it, "attempt")));
        int r = (int)json_integer_value(json_object_get(it, "rank"));
        if (!a || r < 0 || r >= a->world) continue;
        json_int_t step = json_integer_value(json_object_get(rec, "step"));
        diagnose(c, a, r, (long)step, rec, notes);
        if (rank_step) {
            /* timing only: progress is rank 0's step lines; the stored
             * per-rank series is thinned on long jobs (diagnosis above saw
             * every step) */
            long steps = (long)json_integer_value(
                json_object_get(json_object_get(a->spec, "train"), "steps"));
            if (drop && !diag_series_keep((long)step, steps)) drop[i] = 1;
            continue;
        }
        if (step > a->ranks[r].last_step) {
            a->ranks[r].last_step = (long)step;
            a->last_progress_ms = now;
        }
        /* Attach the device's utilization as seen by the agent right now. */
        if (ni >= 0 && a->ranks[r].node == ni) {
            json_t *dev = json_array_get(c->nodes[ni].devices, (size_t)a->ranks[r].device);
            json_t *util = json_object_get(dev, "util_pct");
            if (util) json_object_set(rec, "util_pct", util);
        }
        if (r == 0) {
            json_decref(a->last_step);
            a->last_step = json_incref(rec);
        }
    }
    pthread_mutex_unlock(&c->mu);
    struct metric_rows m = {items, now, notes, drop};
    int wrc = store_write(req->ld->store, insert_metrics, &m);
    json_decref(notes);
    free(drop);
    if (wrc != STORE_OK)
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not store metrics");
    cluster_kick(req->ld);
    return http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

int agent_api_logs(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *job = json_string_value(json_object_get(req->json, "job"));
    const char *stream = json_string_value(json_object_get(req->json, "stream"));
    json_t *jdata = json_object_get(req->json, "data");
    const char *data = json_string_value(jdata);
    size_t len = json_string_length(jdata);
    json_int_t attempt = json_integer_value(json_object_get(req->json, "attempt"));
    json_int_t rank = json_integer_value(json_object_get(req->json, "rank"));
    json_int_t offset = json_integer_value(json_object_get(req->json, "offset"));
    if (!node_matches(req, json_string_value(json_object_get(req->json, "node")))) return 0;
    if (!safe_name(job) || !stream || (strcmp(stream, "stdout") && strcmp(stream, "stderr")) ||
        !data || attempt < 0 || rank < 0 || offset < 0)
        return http_error(req, 400, "INVALID_LOG_CHUNK",
                          "need job, attempt, rank, stream (stdout|stderr), offset and data");
    if (check_holds(req, job, attempt, rank) != 0) return 0;
    char dir[1200], path[1400];
    snprintf(dir, sizeof dir, "%s/%s", c->logs_dir, job);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return http_error(req, 500, "LOG_WRITE_FAILED", "cannot create the job's log folder");
    agent_api_log_path(c->logs_dir, job, (int)attempt, (int)rank, stream, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return http_error(req, 500, "LOG_WRITE_FAILED", "cannot open the log file");
    struct stat st;
    fstat(fd, &st);
    json_int_t size = st.st_size;
    /* Idempotent append: only the bytes beyond what we already hold. */
    if (offset <= size && offset + (json_int_t)len > size) {
        size_t skip = (size_t)(size - offset);
        ssize_t w = write(fd, data + skip, len - skip);
        if (w > 0) size += w;
    }
    close(fd);
    http_notify_signal(&c->logs);
    return http_reply_json(req, 200, json_pack("{s:I}", "size", size));
}
