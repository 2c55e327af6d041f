/* Nodes API handlers and the cluster's Prometheus families. Reads the
 * in-memory cluster state under its mutex; drain flags go to the store. */
#include "daemon/nodes.h"

#include "api/gpu_types.h"
#include "api/planner.h"
#include "daemon/api_prices.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/nodecheck.h"
#include "daemon/store.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *node_state(const struct cluster_node *n) {
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

/* Caller holds c->mu. */
static json_t *node_json(struct cluster *c, int ni) {
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
    char seen[32], reg[32];
    iso_time(n->last_hb_ms, seen, sizeof seen);
    iso_time(n->registered_at, reg, sizeof reg);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:o, s:o, s:s, s:s, s:b}", "id",
                          n->name, "name", n->name, "state", node_state(n), "kind", n->kind,
                          "gpu_model", n->gpu_model, "devices_total", n->ndev, "devices_used", used,
                          "devices_free", n->lost || n->drained ? 0 : n->ndev - used, "devices",
                          devs, "tasks", n->tasks ? json_incref(n->tasks) : json_array(),
                          "last_heartbeat", seen, "registered_at", reg, "drained", n->drained);
    if (o && n->host) json_object_set(o, "host", n->host);
    if (o) /* where its workers listen (agent/commaddr.h) */
        json_object_set_new(o, "comm",
                            json_pack("{s:s, s:s}", "addr", n->comm_addr, "iface", n->comm_iface));
    if (o)
        json_object_set_new(o, "gpu_type", json_string(n->gpu_type[0] ? n->gpu_type : "unknown"));
    if (o) /* one cpu device's measured peak (agent/cpupeak.h), null when none */
        json_object_set_new(o, "cpu_peak_gflops",
                            n->cpu_peak_gflops > 0 ? json_real(n->cpu_peak_gflops) : json_null());
    if (o)
        json_object_set_new(o, "inventory",
                            n->inventory ? json_incref(n->inventory) : json_object());
    nodecheck_annotate(c->ld, n->name, o); /* health, "degraded" (daemon/nodecheck.h) */
    return o;
}

int nodes_list(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    json_t *arr = json_array();
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->nnodes; i++)
        json_array_append_new(arr, node_json(c, i));
    pthread_mutex_unlock(&c->mu);
    return http_reply_json(req, 200, json_pack("{s:o}", "nodes", arr));
}

int nodes_get(struct http_req *req) {
    struct cluster *c = req->ld->cluster;
    const char *id = http_param(req, "id");
    pthread_mutex_lock(&c->mu);
    int ni = id ? cluster_node_find(c, id) : -1;
    json_t *o = ni >= 0 ? node_json(c, ni) : NULL;
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

int nodes_load_inventory(struct store_tx *tx, struct cluster *c) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT name, inventory, cpu_peak_gflops FROM nodes");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int ni = cluster_node_find(c, (const char *)sqlite3_column_text(st, 0));
        if (ni < 0) continue;
        json_t *inv = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
        nodes_apply_inventory(&c->nodes[ni], inv);
        json_decref(inv);
        c->nodes[ni].cpu_peak_gflops = sqlite3_column_double(st, 2);
    }
    sqlite3_reset(st);
    return STORE_OK;
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
    json_t *o = node_json(c, ni);
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
    static const char *const states[] = {"ready", "drained", "lost", "unknown"};
    fprintf(f, "# HELP loom_nodes Nodes by state.\n# TYPE loom_nodes gauge\n");
    for (int s = 0; s < 4; s++) {
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
