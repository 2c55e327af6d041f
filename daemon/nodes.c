/* Nodes API handlers and the cluster's Prometheus families. Reads the
 * in-memory cluster state under its mutex; drain flags go to the store. */
#include "daemon/nodes.h"

#include "api/gpu_types.h"
#include "api/jobspec.h"
#include "api/planner.h"
#include "common/log.h"
#include "common/token.h"
#include "daemon/api_prices.h"
#include "daemon/auth.h"
#include "daemon/cluster.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/nodecheck.h"
#include "daemon/sched.h"
#include "daemon/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------- NVLink islands, pools and labels ---------------- */

/* n->islands from the inventory's topology matrix (agent/gpu.h): a pair is
 * linked when its entry is "NV<links>" (NVML reports NVLink peer access). */
static void node_islands(struct cluster_node *n) {
    n->nislands = 0;
    const json_t *topo = json_object_get(n->inventory, "topology");
    int nd = json_is_array(topo) ? (int)json_array_size(topo) : 0;
    if (nd <= 1 || nd > CLUSTER_NODE_DEVICES) return;
    unsigned char *linked = calloc((size_t)nd * (size_t)nd, 1);
    if (!linked) return;
    for (int a = 0; a < nd; a++)
        for (int b = 0; b < nd; b++) {
            const char *v =
                json_string_value(json_array_get(json_array_get(topo, (size_t)a), (size_t)b));
            linked[a * nd + b] = a != b && v && strncmp(v, "NV", 2) == 0;
        }
    n->nislands = sched_islands(nd, linked, n->islands);
    free(linked);
}

/* Node pool names: what resources.pool accepts. */
static int pool_name_ok(const char *v) {
    size_t l = strlen(v);
    if (l >= CLUSTER_POOL_MAX) return 0;
    for (size_t i = 0; i < l; i++) {
        char c = v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Label keys as job labels take them (api/jobspec.h). */
static int label_key_ok(const char *k) {
    size_t l = strlen(k);
    if (l == 0 || l >= CLUSTER_LABEL_KEY_MAX) return 0;
    for (size_t i = 0; i < l; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/'))
            return 0;
    }
    return 1;
}

static int label_val_ok(const char *v) {
    size_t l = strlen(v);
    if (l >= CLUSTER_LABEL_VAL_MAX) return 0;
    for (size_t i = 0; i < l; i++)
        if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f) return 0;
    return 1;
}

/* Sets n's pool and labels (an object of strings, already checked). */
static void node_set_selectors(struct cluster_node *n, const char *pool, const json_t *labels) {
    snprintf(n->pool, sizeof n->pool, "%s", pool ? pool : "");
    n->nlabels = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)labels, k, v) {
        if (n->nlabels == CLUSTER_NODE_LABELS || !json_is_string(v)) continue;
        snprintf(n->label_keys[n->nlabels], CLUSTER_LABEL_KEY_MAX, "%s", k);
        snprintf(n->label_vals[n->nlabels], CLUSTER_LABEL_VAL_MAX, "%s", json_string_value(v));
        n->label_kp[n->nlabels] = n->label_keys[n->nlabels];
        n->label_vp[n->nlabels] = n->label_vals[n->nlabels];
        n->nlabels++;
    }
}

static json_t *node_labels_json(const struct cluster_node *n) {
    json_t *o = json_object();
    for (int i = 0; i < n->nlabels; i++)
        json_object_set_new(o, n->label_keys[i], json_string(n->label_vals[i]));
    return o;
}

static json_t *node_islands_json(const struct cluster_node *n) {
    json_t *a = json_array();
    for (int k = 0; k < n->nislands; k++) {
        json_t *isl = json_array();
        for (int d = 0; d < CLUSTER_NODE_DEVICES; d++)
            if ((n->islands[k] >> d) & 1) json_array_append_new(isl, json_integer(d));
        json_array_append_new(a, isl);
    }
    return a;
}

static const char *const admission_names[] = {
    [NODE_APPROVED] = "approved",
    [NODE_PENDING] = "pending",
    [NODE_REJECTED] = "rejected",
    [NODE_REVOKED] = "revoked",
};
#define NADMISSION ((int)(sizeof admission_names / sizeof *admission_names))

const char *nodes_admission_name(int admission) {
    return admission >= 0 && admission < NADMISSION ? admission_names[admission] : "approved";
}

int nodes_admission_parse(const char *name) {
    for (int i = 0; name && i < NADMISSION; i++)
        if (!strcmp(name, admission_names[i])) return i;
    return NODE_APPROVED;
}

static const char *node_state(const struct cluster_node *n) {
    if (n->admission != NODE_APPROVED) return nodes_admission_name(n->admission);
    if (n->lost) return "lost";
    if (!n->seen) return "unknown";
    return n->drained ? "drained" : "ready";
}

static void iso_time(int64_t ms, char *buf, size_t len) {
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The device fields a tenant sees: capacity, never what runs there (the
 * admin's view adds telemetry and "task": "JOB/RANK"). */
static const char *const tenant_device_keys[] = {"index", "name", "gpu_type", "mem_total_mib"};

static json_t *tenant_devices(const json_t *devs) {
    json_t *out = json_array();
    size_t i;
    json_t *d;
    json_array_foreach((json_t *)devs, i, d) {
        json_t *o = json_object();
        for (size_t k = 0; k < sizeof tenant_device_keys / sizeof *tenant_device_keys; k++) {
            json_t *v = json_object_get(d, tenant_device_keys[k]);
            if (v) json_object_set(o, tenant_device_keys[k], v);
        }
        json_array_append_new(out, o);
    }
    return out;
}

/* Caller holds c->mu. full: the admin's view (tasks with job ids and task
 * states, per-device telemetry and task, hostname, admission); else a
 * tenant's view: state, capacity, GPU types and the hardware inventory, no
 * job id or task state of anyone. */
static json_t *node_json(struct cluster *c, int ni, int full) {
    struct cluster_node *n = &c->nodes[ni];
    int used = 0;
    json_t *devs = json_deep_copy(n->devices ? n->devices : json_array());
    if (!devs) devs = json_array();
    for (struct cluster_attempt *a = c->attempts; a; a = a->next)
        for (int r = 0; r < a->world; r++) {
            if (a->ranks[r].node != ni || a->ranks[r].released) continue;
            used++;
            json_t *d = json_array_get(devs, (size_t)a->ranks[r].device);
            if (d) {
                char who[64];
                snprintf(who, sizeof who, "%s/%d", a->job_id, r);
                json_object_set_new(d, "task", json_string(who));
            }
        }
    if (!full) {
        json_t *t = tenant_devices(devs);
        json_decref(devs);
        devs = t;
    }
    char seen[32], reg[32];
    iso_time(n->last_hb_ms, seen, sizeof seen);
    iso_time(n->registered_at, reg, sizeof reg);
    int usable = !n->lost && !n->drained && n->admission == NODE_APPROVED;
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:o, s:s, s:b}", "id", n->name,
                          "name", n->name, "state", node_state(n), "kind", n->kind, "gpu_model",
                          n->gpu_model, "devices_total", n->ndev, "devices_used", used,
                          "devices_free", usable ? n->ndev - used : 0, "devices", devs,
                          "last_heartbeat", seen, "drained", n->drained);
    if (o) {
        json_object_set_new(o, "gpu_type", json_string(n->gpu_type[0] ? n->gpu_type : "unknown"));
        /* hardware: cpus, memory, interconnect; GPU models, SMs, NVLink/PCIe topology */
        if (n->host) json_object_set(o, "host", n->host);
        /* one cpu device's measured peak (agent/cpupeak.h), null when none */
        json_object_set_new(o, "cpu_peak_gflops",
                            n->cpu_peak_gflops > 0 ? json_real(n->cpu_peak_gflops) : json_null());
        json_object_set_new(o, "inventory",
                            n->inventory ? json_incref(n->inventory) : json_object());
        /* placement (docs/scheduling.md): admin-set pool and labels, NVLink islands */
        json_object_set_new(o, "pool", json_string(n->pool));
        json_object_set_new(o, "labels", node_labels_json(n));
        json_object_set_new(o, "nvlink_islands", node_islands_json(n));
    }
    if (o && full) {
        json_object_set_new(o, "tasks", n->tasks ? json_incref(n->tasks) : json_array());
        json_object_set_new(o, "registered_at", json_string(reg));
        json_object_set_new(o, "admission", json_string(nodes_admission_name(n->admission)));
        json_object_set_new(o, "hostname", json_string(n->hostname));
        /* where its workers listen (agent/commaddr.h) */
        json_object_set_new(o, "comm",
                            json_pack("{s:s, s:s}", "addr", n->comm_addr, "iface", n->comm_iface));
    }
    nodecheck_annotate(c->ld, n->name, o); /* health, "degraded" (daemon/nodecheck.h) */
    return o;
}

int nodes_list(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    json_t *arr = json_array();
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nnodes; i++)
        json_array_append_new(arr, node_json(c, i, req->is_admin));
    pthread_mutex_unlock(&c->mu);
    return http_reply_json(req, 200, json_pack("{s:o}", "nodes", arr));
}

int nodes_get(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *id = http_param(req, "id");
    pthread_mutex_lock(&c->mu);
    int ni = id ? cluster_node_find(c, id) : -1;
    json_t *o = ni >= 0 ? node_json(c, ni, req->is_admin) : NULL;
    pthread_mutex_unlock(&c->mu);
    if (!o) return http_error(req, 404, "NODE_NOT_FOUND", "no node named %s", id ? id : "");
    return http_reply_json(req, 200, o);
}

void nodes_gpu_type(const char *kind, const json_t *devices, char *out, size_t len) {
    const char *common = NULL;
    int mixed = 0;
    size_t i;
    json_t *d;
    if (kind && strcmp(kind, "cpu") == 0) {
        snprintf(out, len, "cpu");
        return;
    }
    json_array_foreach((json_t *)devices, i, d) {
        const struct gpu_type *t = gpu_type_find(json_string_value(json_object_get(d, "gpu_type")));
        if (!t || !t->cc) {
            double mib = (double)json_integer_value(json_object_get(d, "mem_total_mib"));
            t = gpu_type_normalize(json_string_value(json_object_get(d, "name")),
                                   mib * 1024.0 * 1024.0);
        }
        const char *name = t ? t->name : "unknown";
        if (!common)
            common = name;
        else if (strcmp(common, name) != 0)
            mixed = 1;
    }
    snprintf(out, len, "%s", mixed ? "mixed" : common ? common : "unknown");
}

void nodes_apply_inventory(struct cluster_node *n, json_t *inventory) {
    nodes_gpu_type(n->kind, n->devices, n->gpu_type, sizeof n->gpu_type);
    json_decref(n->inventory);
    n->inventory = json_is_object(inventory) ? json_incref(inventory) : json_object();
    node_islands(n);
}

int nodes_store_inventory(struct store_tx *tx, const char *name, const char *gpu_type,
                          const json_t *inventory) {
    sqlite3_stmt *st =
        store_stmt(tx, "UPDATE nodes SET gpu_type = ?, inventory = ? WHERE name = ?");
    if (!st) return STORE_ERR;
    char *text = json_is_object(inventory) ? json_dumps(inventory, JSON_COMPACT) : NULL;
    sqlite3_bind_text(st, 1, gpu_type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, text ? text : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    free(text);
    return rc;
}

static int hex_to_hash(const char *hex, unsigned char out[32]) {
    if (!hex || strlen(hex) != 64) return -1;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

int nodes_load_inventory(struct store_tx *tx, struct cluster *c) {
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT name, inventory, admission, cred_hash, cpu_peak_gflops, pool, "
                       "labels FROM nodes");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int ni = cluster_node_find(c, (const char *)sqlite3_column_text(st, 0));
        if (ni < 0) continue;
        struct cluster_node *n = &c->nodes[ni];
        json_t *inv = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
        nodes_apply_inventory(n, inv);
        json_decref(inv);
        n->admission = nodes_admission_parse((const char *)sqlite3_column_text(st, 2));
        n->has_cred = hex_to_hash((const char *)sqlite3_column_text(st, 3), n->cred) == 0;
        n->cpu_peak_gflops = sqlite3_column_double(st, 4);
        json_t *labels = json_loads((const char *)sqlite3_column_text(st, 6), 0, NULL);
        node_set_selectors(n, (const char *)sqlite3_column_text(st, 5), labels);
        json_decref(labels);
    }
    sqlite3_reset(st);
    return STORE_OK;
}

int nodes_auth(struct loomd *ld, const char *token, char *node, size_t len) {
    struct cluster *c = ld->cluster;
    if (!c || !token) return -1;
    unsigned char h[32];
    auth_hash(token, h);
    int found = -1;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].has_cred && token_equal_mem(h, c->nodes[i].cred, 32) && found < 0)
            found = i;
    int adm = found >= 0 ? c->nodes[found].admission : -1;
    if (found >= 0) snprintf(node, len, "%s", c->nodes[found].name);
    pthread_mutex_unlock(&c->mu);
    return adm;
}

int nodes_store_admission(struct store_tx *tx, const char *name, int admission,
                          const unsigned char cred[32], const char *by) {
    sqlite3_stmt *st = store_stmt(tx, "UPDATE nodes SET admission = ?1, cred_hash = ?2, "
                                      "admitted_at = coalesce(?3, admitted_at), admitted_by = "
                                      "coalesce(?4, admitted_by) WHERE name = ?5");
    if (!st) return STORE_ERR;
    char hex[65];
    for (int i = 0; cred && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", cred[i]);
    sqlite3_bind_text(st, 1, nodes_admission_name(admission), -1, SQLITE_STATIC);
    if (cred)
        sqlite3_bind_text(st, 2, hex, 64, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 2);
    if (by) {
        sqlite3_bind_int64(st, 3, store_now_ms());
        sqlite3_bind_text(st, 4, by, -1, SQLITE_STATIC);
    }
    sqlite3_bind_text(st, 5, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc;
}

int nodes_emit_event(struct store_tx *tx, const char *name, int admission, const char *by) {
    char type[32];
    snprintf(type, sizeof type, "node.%s", nodes_admission_name(admission));
    json_t *d = json_pack("{s:s, s:s}", "node", name, "by", by ? by : "join token");
    int64_t seq = events_emit(tx, type, "", "", d);
    json_decref(d);
    return seq > 0 ? STORE_OK : STORE_ERR;
}

struct admit_arg {
    const char *name, *by;
    int to;
    const unsigned char *cred; /* kept on approve, cleared otherwise */
};

static int admit_cb(struct store_tx *tx, void *arg) {
    struct admit_arg *a = arg;
    int rc = nodes_store_admission(tx, a->name, a->to, a->cred, a->by);
    if (rc == STORE_OK) rc = nodes_emit_event(tx, a->name, a->to, a->by);
    return rc;
}

/* approve and reject act on pending nodes (repeating one is a no-op);
 * revoke on any node. */
static int admit(struct http_req *req, int to) {
    struct cluster *c = req->ld->cluster;
    const char *id = http_param(req, "id");
    unsigned char cred[32];
    pthread_mutex_lock(&c->mu);
    int ni = id ? cluster_node_find(c, id) : -1;
    int cur = ni >= 0 ? c->nodes[ni].admission : -1;
    int has = ni >= 0 && c->nodes[ni].has_cred;
    if (has) memcpy(cred, c->nodes[ni].cred, 32);
    pthread_mutex_unlock(&c->mu);
    if (ni < 0) return API_ERROR(req, NODE_NOT_FOUND, "no node named %s", id ? id : "");
    if (cur != to) {
        if (to != NODE_REVOKED && (cur != NODE_PENDING || !has))
            return API_ERROR(req, NODE_NOT_PENDING,
                             "node %s is %s; only a pending node can be %s (a revoked node "
                             "applies again when its agent registers)",
                             id, nodes_admission_name(cur),
                             to == NODE_APPROVED ? "approved" : "rejected");
        struct admit_arg a = {id, req->token_id, to, to == NODE_APPROVED ? cred : NULL};
        if (store_write(req->ld->store, admit_cb, &a) != STORE_OK)
            return API_ERROR(req, STORE_UNAVAILABLE, "could not record the admission of %s", id);
        pthread_mutex_lock(&c->mu);
        struct cluster_node *n = &c->nodes[ni];
        n->admission = to;
        if (to != NODE_APPROVED) {
            n->has_cred = 0;
            memset(n->cred, 0, sizeof n->cred);
        }
        if (to == NODE_REVOKED) n->lost = 1; /* its ranks: the lost-node handling */
        cluster_changed(c);
        pthread_mutex_unlock(&c->mu);
        http_notify_signal(&c->assign);
        cluster_kick(req->ld);
        log_info("cluster: node %s %s by %s", id, nodes_admission_name(to), req->token_id);
    }
    pthread_mutex_lock(&c->mu);
    json_t *o = node_json(c, ni, 1);
    pthread_mutex_unlock(&c->mu);
    return http_reply_json(req, 200, o);
}

int nodes_approve(struct http_req *req) {
    return admit(req, NODE_APPROVED);
}

int nodes_reject(struct http_req *req) {
    return admit(req, NODE_REJECTED);
}

int nodes_revoke(struct http_req *req) {
    return admit(req, NODE_REVOKED);
}

static int pool_is_cpu_name(const char *type) {
    return strcmp(type, "cpu") == 0;
}

void nodes_fleet(struct loomd *ld, struct planner_fleet *f) {
    memset(f, 0, sizeof *f);
    struct cluster *c = ld->cluster;
    json_t *prices = prices_load(ld);
    if (!c) {
        json_decref(prices);
        return;
    }
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nnodes; i++) {
        const struct cluster_node *n = &c->nodes[i];
        const char *type = !strcmp(n->kind, "cpu") ? "cpu"
                           : n->gpu_type[0]        ? n->gpu_type
                                                   : "unknown";
        if (n->ndev <= 0) continue;
        int k = 0;
        while (k < f->n && strcmp(f->pool[k].gpu, type) != 0)
            k++;
        if (k == f->n) {
            if (f->n == PLANNER_MAX_POOLS) continue;
            struct planner_pool *p = &f->pool[f->n++];
            snprintf(p->gpu, sizeof p->gpu, "%s", type);
            json_t *tp = json_object_get(prices, type);
            json_t *legacy = json_object_get(c->prices, n->gpu_model);
            p->price_per_gpu_hour = tp ? json_number_value(json_object_get(tp, "per_gpu_hour"))
                                    : json_is_number(legacy) ? json_number_value(legacy)
                                                             : ld->cfg.price_gpu_hour;
            snprintf(p->currency, sizeof p->currency, "%s",
                     tp ? json_string_value(json_object_get(tp, "currency")) : "");
        }
        struct planner_pool *p = &f->pool[k];
        int cc = cluster_node_cc(n); /* the least of its nodes; one unknown: unknown */
        if (!p->nodes || (cc && p->cc && cc < p->cc))
            p->cc = cc;
        else if (!cc)
            p->cc = 0;
        p->nodes++;
        p->gpus += n->ndev;
        if (n->ndev > p->gpus_per_node) p->gpus_per_node = n->ndev;
        size_t d;
        json_t *dv;
        json_array_foreach(n->devices, d, dv) {
            double gib = (double)json_integer_value(json_object_get(dv, "mem_total_mib")) / 1024.0;
            if (gib > 0 && (p->gpu_mem_gib <= 0 || gib < p->gpu_mem_gib)) p->gpu_mem_gib = gib;
        }
        double host =
            (double)json_integer_value(json_object_get(n->host, "mem_total_mib")) / 1024.0;
        if (host > 0 && (p->host_mem_gib <= 0 || host < p->host_mem_gib)) p->host_mem_gib = host;
        /* cpu pools plan at the slowest node's measured peak (agent/cpupeak.h): a job's
         * step waits for its slowest rank */
        double tf = n->cpu_peak_gflops / 1000.0;
        if (pool_is_cpu_name(type) && tf > 0 && (p->peak_tflops <= 0 || tf < p->peak_tflops))
            p->peak_tflops = tf;
    }
    pthread_mutex_unlock(&c->mu);
    json_decref(prices);
}

struct drain_arg {
    const char *name;
    int drained;
};

static int set_drained(struct store_tx *tx, void *arg) {
    struct drain_arg *d = arg;
    sqlite3_stmt *st = store_stmt(tx, "UPDATE nodes SET drained = ? WHERE name = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_int(st, 1, d->drained);
    sqlite3_bind_text(st, 2, d->name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    return rc;
}

static int drain(struct http_req *req, int on) {
    struct cluster *c = req->ld->cluster;
    const char *id = http_param(req, "id");
    pthread_mutex_lock(&c->mu);
    int ni = id ? cluster_node_find(c, id) : -1;
    pthread_mutex_unlock(&c->mu);
    if (ni < 0) return http_error(req, 404, "NODE_NOT_FOUND", "no node named %s", id ? id : "");
    struct drain_arg d = {id, on};
    if (store_write(req->ld->store, set_drained, &d) != STORE_OK)
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not record the drain flag");
    pthread_mutex_lock(&c->mu);
    c->nodes[ni].drained = on;
    json_t *o = node_json(c, ni, 1);
    pthread_mutex_unlock(&c->mu);
    cluster_kick(req->ld);
    return http_reply_json(req, 200, o);
}

int nodes_drain(struct http_req *req) {
    return drain(req, 1);
}

int nodes_undrain(struct http_req *req) {
    return drain(req, 0);
}

/* ---------------- PATCH /v1/nodes/{id}: pool and labels ---------------- */

struct selectors_arg {
    const char *name, *pool;
    const json_t *labels;
};

static int store_selectors(struct store_tx *tx, void *arg) {
    struct selectors_arg *a = arg;
    sqlite3_stmt *st = store_stmt(tx, "UPDATE nodes SET pool = ?, labels = ? WHERE name = ?");
    if (!st) return STORE_ERR;
    char *text = json_dumps(a->labels, JSON_COMPACT | JSON_SORT_KEYS);
    sqlite3_bind_text(st, 1, a->pool, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, text ? text : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, a->name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st) == SQLITE_DONE ? STORE_OK : STORE_ERR;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    free(text);
    return rc;
}

/* Body {"pool": "train" | "" (none), "labels": {"k": "v" | null}}: pool
 * replaces the node's; labels is a JSON merge patch (RFC 7386) of the node's
 * labels (a string sets a key, null removes it). Either may be left out. */
int nodes_update(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *id = http_param(req, "id");
    const char *k;
    json_t *v;
    json_object_foreach(req->json, k, v) {
        if (strcmp(k, "pool") && strcmp(k, "labels"))
            return API_ERROR_FIELD(req, UNKNOWN_FIELD, k,
                                   "unknown field '%s' (a node takes pool and labels)", k);
    }
    json_t *pool = json_object_get(req->json, "pool"),
           *patch = json_object_get(req->json, "labels");
    if (pool && !json_is_string(pool))
        return API_ERROR_FIELD(req, WRONG_TYPE, "pool", "pool must be a string (\"\": none)");
    if (pool && !pool_name_ok(json_string_value(pool)))
        return API_ERROR_FIELD(req, INVALID_VALUE, "pool",
                               "pool=\"%.64s\" is not a pool name (0-%d of [A-Za-z0-9._-])",
                               json_string_value(pool), CLUSTER_POOL_MAX - 1);
    if (patch && !json_is_object(patch))
        return API_ERROR_FIELD(req, WRONG_TYPE, "labels",
                               "labels must be an object of strings (null removes a key)");
    json_object_foreach(patch, k, v) {
        char path[96];
        snprintf(path, sizeof path, "labels.%.80s", k);
        if (!label_key_ok(k))
            return API_ERROR_FIELD(req, INVALID_LABEL, path,
                                   "label keys are 1-%d characters of [A-Za-z0-9._/-]",
                                   CLUSTER_LABEL_KEY_MAX - 1);
        if (!json_is_string(v) && !json_is_null(v))
            return API_ERROR_FIELD(req, WRONG_TYPE, path, "%s must be a string or null", path);
        if (json_is_string(v) && !label_val_ok(json_string_value(v)))
            return API_ERROR_FIELD(req, INVALID_VALUE, path,
                                   "%s must be at most %d characters, no control characters", path,
                                   CLUSTER_LABEL_VAL_MAX - 1);
    }
    pthread_mutex_lock(&c->mu);
    int ni = id ? cluster_node_find(c, id) : -1;
    json_t *labels = ni >= 0 ? node_labels_json(&c->nodes[ni]) : NULL;
    char cur_pool[CLUSTER_POOL_MAX] = "";
    if (ni >= 0) snprintf(cur_pool, sizeof cur_pool, "%s", c->nodes[ni].pool);
    pthread_mutex_unlock(&c->mu);
    if (ni < 0) return API_ERROR(req, NODE_NOT_FOUND, "no node named %s", id ? id : "");
    json_object_foreach(patch, k, v) {
        if (json_is_null(v))
            json_object_del(labels, k);
        else
            json_object_set(labels, k, v);
    }
    if (json_object_size(labels) > CLUSTER_NODE_LABELS) {
        size_t n = json_object_size(labels);
        json_decref(labels);
        return API_ERROR_FIELD(req, OUT_OF_RANGE, "labels",
                               "node %s would have %zu labels, at most %d", id, n,
                               CLUSTER_NODE_LABELS);
    }
    const char *np = pool ? json_string_value(pool) : cur_pool;
    struct selectors_arg a = {id, np, labels};
    if (store_write(req->ld->store, store_selectors, &a) != STORE_OK) {
        json_decref(labels);
        return API_ERROR(req, STORE_UNAVAILABLE, "could not record the labels of %s", id);
    }
    pthread_mutex_lock(&c->mu);
    node_set_selectors(&c->nodes[ni], np, labels);
    json_t *o = node_json(c, ni, 1);
    pthread_mutex_unlock(&c->mu);
    json_decref(labels);
    cluster_kick(req->ld);
    log_info("cluster: node %s pool '%s', %d labels, set by %s", id, np,
             (int)json_object_size(json_object_get(o, "labels")), req->token_id);
    return http_reply_json(req, 200, o);
}

/* ---------------- submit-time selector check ---------------- */

int nodes_selector_check(struct loomd *ld, const struct loom_spec *s, struct loom_error *e) {
    if (!s->resources.pool[0] && s->resources.n_node_labels == 0) return 0;
    const char *kind = s->resources.device == JOBSPEC_DEV_CPU ? "cpu" : "cuda";
    const char *keys[JOBSPEC_NODE_LABELS_MAX], *vals[JOBSPEC_NODE_LABELS_MAX];
    for (int k = 0; k < s->resources.n_node_labels; k++) {
        keys[k] = s->resources.node_labels[k].key;
        vals[k] = s->resources.node_labels[k].value;
    }
    struct sched_job j = {.kind = kind,
                          .pool = s->resources.pool,
                          .sel_keys = keys,
                          .sel_vals = vals,
                          .nsel = s->resources.n_node_labels};
    struct cluster *c = ld->cluster;
    int nodes = 0, match = 0;
    char pools[160] = "";
    size_t off = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nnodes; i++) {
        const struct cluster_node *n = &c->nodes[i];
        if (strcmp(n->kind, kind) || n->admission == NODE_REJECTED || n->admission == NODE_REVOKED)
            continue;
        struct sched_node sn = {.name = n->name,
                                .kind = n->kind,
                                .pool = n->pool,
                                .label_keys = n->label_kp,
                                .label_vals = n->label_vp,
                                .nlabels = n->nlabels};
        nodes++;
        match += sched_selector_ok(&sn, &j);
        if (off < sizeof pools && nodes <= 4)
            off += (size_t)snprintf(pools + off, sizeof pools - off, "%s%s: pool \"%s\"",
                                    nodes > 1 ? ", " : "", n->name, n->pool);
    }
    pthread_mutex_unlock(&c->mu);
    if (nodes == 0 || match > 0) return 0; /* no node of the kind yet: the job waits */
    char sel[200] = "";
    int so = 0;
    if (s->resources.pool[0])
        so = snprintf(sel, sizeof sel, "resources.pool=%s", s->resources.pool);
    for (int k = 0; k < s->resources.n_node_labels && so >= 0 && (size_t)so < sizeof sel; k++)
        so += snprintf(sel + so, sizeof sel - (size_t)so, "%s%s=%s",
                       k    ? " "
                       : so ? ", resources.labels "
                            : "resources.labels ",
                       keys[k], vals[k]);
    return loom_error_set(e, 422, "UNSCHEDULABLE",
                          s->resources.pool[0] ? "resources.pool" : "resources.labels",
                          "%s matches none of the cluster's %d %s node%s (%s%s)", sel, nodes, kind,
                          nodes == 1 ? "" : "s", pools, nodes > 4 ? ", ..." : "");
}

static void hist_write(FILE *f, const char *name, const char *help, const struct cluster_hist *h) {
    static const double b[CLUSTER_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                   0.5,   1,    2.5,   5,    10,  60};
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < CLUSTER_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)cum);
    }
    cum += h->counts[CLUSTER_HIST_BUCKETS];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->n);
}

void cluster_metrics_write(struct loomd *ld, FILE *f) {
    struct cluster *c = ld->cluster;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    static const char *const states[] = {"ready",   "drained",  "lost",   "unknown",
                                         "pending", "rejected", "revoked"};
    fprintf(f, "# HELP loom_nodes Nodes by state.\n# TYPE loom_nodes gauge\n");
    for (int s = 0; s < (int)(sizeof states / sizeof *states); s++) {
        int cnt = 0;
        for (int i = 0; i < c->nnodes; i++)
            if (!strcmp(node_state(&c->nodes[i]), states[s])) cnt++;
        fprintf(f, "loom_nodes{state=\"%s\"} %d\n", states[s], cnt);
    }
    fprintf(f, "# HELP loom_devices Devices by node and use.\n# TYPE loom_devices gauge\n");
    for (int i = 0; i < c->nnodes; i++) {
        int used = 0;
        for (struct cluster_attempt *a = c->attempts; a; a = a->next)
            for (int r = 0; r < a->world; r++)
                if (a->ranks[r].node == i && !a->ranks[r].released) used++;
        fprintf(f, "loom_devices{node=\"%s\",kind=\"%s\",use=\"used\"} %d\n", c->nodes[i].name,
                c->nodes[i].kind, used);
        fprintf(f, "loom_devices{node=\"%s\",kind=\"%s\",use=\"free\"} %d\n", c->nodes[i].name,
                c->nodes[i].kind, c->nodes[i].ndev - used);
    }
    fprintf(f, "# HELP loom_device_utilization_percent Device utilization reported by the agent.\n"
               "# TYPE loom_device_utilization_percent gauge\n");
    for (int i = 0; i < c->nnodes; i++) {
        size_t k;
        json_t *d;
        json_array_foreach(c->nodes[i].devices, k, d) fprintf(
            f, "loom_device_utilization_percent{node=\"%s\",device=\"%zu\"} %lld\n",
            c->nodes[i].name, k, (long long)json_integer_value(json_object_get(d, "util_pct")));
    }
    fprintf(f, "# HELP loom_device_memory_used_bytes Device memory in use.\n"
               "# TYPE loom_device_memory_used_bytes gauge\n");
    for (int i = 0; i < c->nnodes; i++) {
        size_t k;
        json_t *d;
        json_array_foreach(c->nodes[i].devices, k, d) fprintf(
            f, "loom_device_memory_used_bytes{node=\"%s\",device=\"%zu\"} %lld\n", c->nodes[i].name,
            k, (long long)json_integer_value(json_object_get(d, "mem_used_mib")) * 1048576LL);
    }
    fprintf(f, "# HELP loom_job_tokens_per_second Latest tokens/s of each running job (rank 0).\n"
               "# TYPE loom_job_tokens_per_second gauge\n");
    for (struct cluster_attempt *a = c->attempts; a; a = a->next)
        if (a->last_step && a->phase == ATTEMPT_ACTIVE)
            fprintf(f, "loom_job_tokens_per_second{job=\"%s\"} %g\n", a->job_id,
                    json_number_value(json_object_get(a->last_step, "tokens_per_s")));
    fprintf(f, "# HELP loom_job_mfu Latest model FLOPs utilization of each running job.\n"
               "# TYPE loom_job_mfu gauge\n");
    for (struct cluster_attempt *a = c->attempts; a; a = a->next)
        if (a->last_step && a->phase == ATTEMPT_ACTIVE)
            fprintf(f, "loom_job_mfu{job=\"%s\"} %g\n", a->job_id,
                    json_number_value(json_object_get(a->last_step, "mfu")));
    hist_write(f, "loom_queue_wait_seconds", "Time from submit (or retry) to placement.",
               &c->queue_wait);
    hist_write(f, "loom_scheduling_pass_seconds", "Duration of one scheduler pass.", &c->sched_lat);
    hist_write(f, "loom_start_latency_seconds", "Time from placement to every rank running.",
               &c->start_lat);
    pthread_mutex_unlock(&c->mu);
}
