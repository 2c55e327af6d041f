/* Node checks: scheduling, rendezvous, judging and storing (see
 * daemon/nodecheck.h for the flow). Checks live in a small in-memory list
 * while they are queued or running; finished ones stay in the list for a
 * while (recent history for GET) and are always in the store. */
#include "daemon/nodecheck.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/token.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/rdzv.h"
#include "daemon/store.h"

#define NC_MAX_CHECKS      256 /* kept in memory (finished ones are dropped first) */
#define NC_PART_TIMEOUT_MS 180000
#define NC_MAX_WAIT_MS     30000
#define NC_MAX_MARKS       512

enum nc_state { NC_QUEUED, NC_RUNNING, NC_PASSED, NC_DEGRADED, NC_FAILED };
static const char *const state_names[] = {"queued", "running", "passed", "degraded", "failed"};

struct nc_part {
    char node[64];
    int first_rank, nranks; /* ranks first_rank .. first_rank+nranks-1 */
    int taken, reported, ok;
    json_t *result; /* the agent's report (owned) */
};

struct nc_check {
    char id[24];
    char kind[8]; /* "node" | "pair" */
    char token[48];
    char device_kind[8];
    enum nc_state state;
    int world;
    struct nc_part parts[2];
    int nparts;
    double expect_gbps, min_ratio;
    long max_bytes;
    int iters;
    int timeout_ms; /* a part not reported by then fails the check */
    int64_t created_ms, started_ms, finished_ms;
    char reason[512];
    json_t *rdzv;    /* key -> base64 value */
    json_t *summary; /* rank 0's summary */
    struct nc_check *next;
};

struct nc_mark {
    char node[64];
    char kind[8];
    char reason[512];
    char check_id[24];
    int64_t at;
};

struct nodecheck {
    pthread_mutex_t mu;
    struct http_notify work; /* a check started or a part became available */
    struct http_notify rdzv; /* a rendezvous key was written */
    struct http_notify done; /* a check finished */
    struct nc_check *checks; /* newest first */
    struct nc_mark marks[NC_MAX_MARKS];
    int nmarks;
    char joined[CLUSTER_MAX_NODES][64]; /* nodes considered for nodecheck-on-join */
    int njoined;
};

/* ---------- expected figures ---------- */

/* Expected all-reduce bus bandwidth, GB/s, first match wins. Figures are what
 * a healthy machine of the kind reaches with nccl-tests (8 GPUs, large
 * messages) or, for cpu devices, a floor the Gloo loopback path clears on
 * any machine; min_ratio (0.5) of it is the bar. */
static const struct {
    const char *check;                                /* "node", "pair" or NULL (any) */
    const char *device, *interconnect, *model_substr; /* NULL: any */
    double gbps;
} expected[] = {
    {"node", "cuda", "nvlink", "B200", 650},
    {"node", "cuda", "nvlink", "H200", 360},
    {"node", "cuda", "nvlink", "H100", 360},
    {"node", "cuda", "nvlink", "A100", 200},
    {"node", "cuda", "nvlink", NULL, 150},
    {"node", "cuda", "pcie", NULL, 12},
    {"node", "cuda", NULL, NULL, 10},
    {"pair", "cuda", NULL, NULL, 10}, /* one 100 Gb/s NIC path = 12.5 GB/s */
    {NULL, "cpu", NULL, NULL, 0.01},
};

double nodecheck_expected_gbps(const char *check_kind, const char *device_kind,
                               const char *interconnect, const char *gpu_model) {
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++) {
        if (expected[i].check && strcmp(expected[i].check, check_kind)) continue;
        if (expected[i].device && strcmp(expected[i].device, device_kind ? device_kind : ""))
            continue;
        if (expected[i].interconnect &&
            (!interconnect || strcasecmp(expected[i].interconnect, interconnect)))
            continue;
        if (expected[i].model_substr &&
            (!gpu_model || !strstr(gpu_model, expected[i].model_substr)))
            continue;
        return expected[i].gbps;
    }
    return 0.05;
}

/* ---------- helpers ---------- */

static struct nodecheck *nc_of(struct loomd *ld) {
    return ld->nodecheck;
}

static struct nc_check *find_check(struct nodecheck *nc, const char *id) {
    for (struct nc_check *k = nc->checks; k; k = k->next)
        if (!strcmp(k->id, id)) return k;
    return NULL;
}

static void check_free(struct nc_check *k) {
    if (!k) return;
    for (int i = 0; i < k->nparts; i++)
        json_decref(k->parts[i].result);
    json_decref(k->rdzv);
    json_decref(k->summary);
    free(k);
}

static int has_node(const struct nc_check *k, const char *node) {
    for (int i = 0; i < k->nparts; i++)
        if (!strcmp(k->parts[i].node, node)) return 1;
    return 0;
}

static int node_checking(struct nodecheck *nc, const char *node) {
    for (struct nc_check *k = nc->checks; k; k = k->next)
        if (k->state == NC_RUNNING && has_node(k, node)) return 1;
    return 0;
}

static json_t *check_json(const struct nc_check *k) {
    json_t *nodes = json_array(), *parts = json_array();
    for (int i = 0; i < k->nparts; i++) {
        json_array_append_new(nodes, json_string(k->parts[i].node));
        json_array_append_new(parts,
                              json_pack("{s:s, s:i, s:i, s:b, s:b, s:O?}", "node", k->parts[i].node,
                                        "first_rank", k->parts[i].first_rank, "ranks",
                                        k->parts[i].nranks, "reported", k->parts[i].reported, "ok",
                                        k->parts[i].ok, "result", k->parts[i].result));
    }
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:o, s:i, s:s, s:f, s:f, s:I, s:o, s:o, s:o, s:s, s:O?, s:o}",
                  "id", k->id, "kind", k->kind, "state", state_names[k->state], "nodes", nodes,
                  "world", k->world, "device", k->device_kind, "expect_busbw_gbps", k->expect_gbps,
                  "min_ratio", k->min_ratio, "max_bytes", (json_int_t)k->max_bytes, "created_at",
                  store_time_json(k->created_ms), "started_at", store_time_json(k->started_ms),
                  "finished_at", store_time_json(k->finished_ms), "reason", k->reason, "summary",
                  k->summary, "parts", parts);
    double peak = json_number_value(json_object_get(k->summary, "peak_busbw_gbps"));
    if (k->summary && k->expect_gbps > 0)
        json_object_set_new(o, "ratio", json_real(peak / k->expect_gbps));
    return o;
}

/* ---------- store ---------- */

struct row_op {
    const struct nc_check *k;
    json_t *doc; /* check_json */
    int mark;    /* 1 set marks, 0 clear marks, -1 leave */
    int create;  /* the queued row: never overwrites a newer one */
    const char *clear_node;
};

static int write_check(struct store_tx *tx, void *arg) {
    struct row_op *op = arg;
    const struct nc_check *k = op->k;
    char *doc = json_dumps(op->doc, JSON_COMPACT);
    /* The creating request may commit after a fast check already stored its
     * result: its insert then does nothing. */
    sqlite3_stmt *st =
        op->create
            ? store_stmt(tx, "INSERT OR IGNORE INTO node_checks(id, kind, nodes, state, "
                             "created_at, finished_at, doc) VALUES (?,?,?,?,?,?,?)")
            : store_stmt(tx, "INSERT INTO node_checks(id, kind, nodes, state, created_at, "
                             "finished_at, doc) VALUES (?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE "
                             "SET state = excluded.state, finished_at = excluded.finished_at, "
                             "doc = excluded.doc");
    if (!st || !doc) {
        free(doc);
        return STORE_ERR;
    }
    char nodes[160];
    snprintf(nodes, sizeof nodes, "%s%s%s", k->parts[0].node, k->nparts > 1 ? "," : "",
             k->nparts > 1 ? k->parts[1].node : "");
    sqlite3_bind_text(st, 1, k->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, k->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, nodes, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, state_names[k->state], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, k->created_ms);
    if (k->finished_ms) sqlite3_bind_int64(st, 6, k->finished_ms);
    sqlite3_bind_text(st, 7, doc, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    free(doc);
    if (rc != SQLITE_DONE) return STORE_ERR;
    if (op->mark < 0) return STORE_OK;
    for (int i = 0; i < k->nparts; i++) {
        sqlite3_stmt *m =
            op->mark ? store_stmt(tx, "INSERT INTO node_health(node, kind, degraded, reason, "
                                      "check_id, checked_at) VALUES (?,?,1,?,?,?) ON "
                                      "CONFLICT(node, kind) DO UPDATE SET degraded = 1, reason = "
                                      "excluded.reason, check_id = excluded.check_id, checked_at "
                                      "= excluded.checked_at")
                     : store_stmt(tx, "DELETE FROM node_health WHERE node = ? AND kind = ?");
        if (!m) return STORE_ERR;
        sqlite3_bind_text(m, 1, k->parts[i].node, -1, SQLITE_STATIC);
        sqlite3_bind_text(m, 2, k->kind, -1, SQLITE_STATIC);
        if (op->mark) {
            sqlite3_bind_text(m, 3, k->reason, -1, SQLITE_STATIC);
            sqlite3_bind_text(m, 4, k->id, -1, SQLITE_STATIC);
            sqlite3_bind_int64(m, 5, k->finished_ms);
        }
        rc = sqlite3_step(m);
        sqlite3_reset(m);
        if (rc != SQLITE_DONE) return STORE_ERR;
    }
    return STORE_OK;
}

static int clear_marks(struct store_tx *tx, void *arg) {
    sqlite3_stmt *st = store_stmt(tx, "DELETE FROM node_health WHERE node = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

static int load_marks(struct store_tx *tx, void *arg) {
    struct nodecheck *nc = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT node, kind, reason, check_id, checked_at FROM "
                                      "node_health WHERE degraded = 1 ORDER BY node, kind");
    if (!st) return STORE_ERR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && nc->nmarks < NC_MAX_MARKS) {
        struct nc_mark *m = &nc->marks[nc->nmarks++];
        snprintf(m->node, sizeof m->node, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(m->kind, sizeof m->kind, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(m->reason, sizeof m->reason, "%s", (const char *)sqlite3_column_text(st, 2));
        snprintf(m->check_id, sizeof m->check_id, "%s", (const char *)sqlite3_column_text(st, 3));
        m->at = sqlite3_column_int64(st, 4);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? STORE_OK : STORE_ERR;
}

/* Checks that were queued or running when loomd stopped cannot finish. */
static int fail_stale(struct store_tx *tx, void *arg) {
    (void)arg;
    return store_exec(tx, "UPDATE node_checks SET state = 'failed' WHERE state IN "
                          "('queued','running')");
}

/* ---------- module ---------- */

int nodecheck_start(struct loomd *ld) {
    struct nodecheck *nc = calloc(1, sizeof *nc);
    if (!nc) return -1;
    pthread_mutex_init(&nc->mu, NULL);
    http_notify_init(&nc->work);
    http_notify_init(&nc->rdzv);
    http_notify_init(&nc->done);
    if (store_write(ld->store, fail_stale, NULL) != STORE_OK ||
        store_read(ld->store, load_marks, nc) != STORE_OK) {
        log_error("nodecheck: cannot read node_checks / node_health from the store");
        http_notify_destroy(&nc->work);
        http_notify_destroy(&nc->rdzv);
        http_notify_destroy(&nc->done);
        pthread_mutex_destroy(&nc->mu);
        free(nc);
        return -1;
    }
    if (nc->nmarks) log_info("nodecheck: %d degraded mark(s) restored", nc->nmarks);
    ld->nodecheck = nc;
    return 0;
}

void nodecheck_stop(struct loomd *ld) {
    struct nodecheck *nc = nc_of(ld);
    if (!nc) return;
    ld->nodecheck = NULL;
    for (struct nc_check *k = nc->checks, *nx; k; k = nx) {
        nx = k->next;
        check_free(k);
    }
    http_notify_destroy(&nc->work);
    http_notify_destroy(&nc->rdzv);
    http_notify_destroy(&nc->done);
    pthread_mutex_destroy(&nc->mu);
    free(nc);
}

int nodecheck_avoid(struct loomd *ld, const char *node) {
    struct nodecheck *nc = nc_of(ld);
    if (!nc || !node) return 0;
    int r = 0;
    pthread_mutex_lock(&nc->mu);
    for (int i = 0; i < nc->nmarks && !r; i++)
        if (!strcmp(nc->marks[i].node, node)) r = 1;
    if (!r) r = node_checking(nc, node);
    pthread_mutex_unlock(&nc->mu);
    return r;
}

void nodecheck_annotate(struct loomd *ld, const char *node, json_t *o) {
    struct nodecheck *nc = nc_of(ld);
    if (!nc || !o) return;
    json_t *reasons = json_array(), *last = NULL;
    pthread_mutex_lock(&nc->mu);
    for (int i = 0; i < nc->nmarks; i++)
        if (!strcmp(nc->marks[i].node, node))
            json_array_append_new(reasons, json_string(nc->marks[i].reason));
    int checking = node_checking(nc, node);
    for (struct nc_check *k = nc->checks; k && !last; k = k->next)
        if (has_node(k, node) && k->finished_ms)
            last = json_pack("{s:s, s:s, s:s, s:o}", "id", k->id, "kind", k->kind, "state",
                             state_names[k->state], "finished_at", store_time_json(k->finished_ms));
    pthread_mutex_unlock(&nc->mu);
    int degraded = json_array_size(reasons) > 0;
    json_object_set_new(o, "health",
                        json_pack("{s:b, s:o, s:b, s:o}", "degraded", degraded, "reasons", reasons,
                                  "checking", checking, "last_check", last ? last : json_null()));
    const char *state = json_string_value(json_object_get(o, "state"));
    if (degraded && state && !strcmp(state, "ready"))
        json_object_set_new(o, "state", json_string("degraded"));
}

/* Starts queued checks whose nodes are free of running checks (oldest
 * first). Caller holds nc->mu. Returns 1 when one started. */
static int dispatch(struct nodecheck *nc, int64_t now) {
    int started = 0;
    /* The list is newest first: walk to find the oldest startable. */
    for (;;) {
        struct nc_check *pick = NULL;
        for (struct nc_check *k = nc->checks; k; k = k->next) {
            if (k->state != NC_QUEUED) continue;
            int free_nodes = 1;
            for (int i = 0; i < k->nparts; i++)
                if (node_checking(nc, k->parts[i].node)) free_nodes = 0;
            if (free_nodes) pick = k; /* keeps the oldest */
        }
        if (!pick) break;
        pick->state = NC_RUNNING;
        pick->started_ms = now;
        started = 1;
    }
    return started;
}

/* Removes finished checks beyond the memory cap. Caller holds nc->mu. */
static void trim(struct nodecheck *nc) {
    int n = 0;
    struct nc_check **pp = &nc->checks;
    while (*pp) {
        struct nc_check *k = *pp;
        if (++n > NC_MAX_CHECKS && k->finished_ms) {
            *pp = k->next;
            check_free(k);
            continue;
        }
        pp = &k->next;
    }
}

static void set_marks(struct nodecheck *nc, const struct nc_check *k, int on) {
    for (int p = 0; p < k->nparts; p++) {
        const char *node = k->parts[p].node;
        int i = 0;
        while (i < nc->nmarks &&
               !(!strcmp(nc->marks[i].node, node) && !strcmp(nc->marks[i].kind, k->kind)))
            i++;
        if (!on) {
            if (i < nc->nmarks) nc->marks[i] = nc->marks[--nc->nmarks];
            continue;
        }
        if (i == nc->nmarks) {
            if (nc->nmarks >= NC_MAX_MARKS) continue;
            nc->nmarks++;
        }
        struct nc_mark *m = &nc->marks[i];
        snprintf(m->node, sizeof m->node, "%s", node);
        snprintf(m->kind, sizeof m->kind, "%s", k->kind);
        snprintf(m->reason, sizeof m->reason, "%s", k->reason);
        snprintf(m->check_id, sizeof m->check_id, "%s", k->id);
        m->at = k->finished_ms;
    }
}

/* Judges a check whose parts all reported, or that timed out. Caller holds
 * nc->mu. Fills *op for the store write done after unlocking. */
static void finish(struct nodecheck *nc, struct nc_check *k, int64_t now, const char *fail_why,
                   struct row_op *op) {
    k->finished_ms = now;
    op->k = k;
    op->mark = -1;
    if (fail_why) {
        k->state = NC_FAILED;
        snprintf(k->reason, sizeof k->reason, "%s", fail_why);
    } else {
        for (int i = 0; i < k->nparts; i++)
            if (!k->summary)
                k->summary = json_incref(json_object_get(k->parts[i].result, "summary"));
        double peak = json_number_value(json_object_get(k->summary, "peak_busbw_gbps"));
        double lat = json_number_value(json_object_get(k->summary, "latency_us"));
        char what[200];
        if (!strcmp(k->kind, "pair"))
            snprintf(what, sizeof what, "node-to-node bandwidth %s<->%s", k->parts[0].node,
                     k->parts[1].node);
        else
            snprintf(what, sizeof what, "all-reduce bus bandwidth over %d devices of %s", k->world,
                     k->parts[0].node);
        json_t *skipped = json_object_get(k->summary, "skipped");
        if (!k->summary) {
            k->state = NC_FAILED;
            snprintf(k->reason, sizeof k->reason, "no rank reported a summary");
        } else if (json_array_size(skipped) > 0 &&
                   json_is_null(json_object_get(k->summary, "peak_busbw_gbps"))) {
            /* One device: the probe ran what makes sense there and says
             * what it skipped; there is no bandwidth to judge. */
            k->state = NC_PASSED;
            size_t n = (size_t)snprintf(
                k->reason, sizeof k->reason,
                "one device on %s: ran all-reduce sum and device memory "
                "(%lld bytes) checks; skipped",
                k->parts[0].node,
                (long long)json_integer_value(json_object_get(k->summary, "memory_bytes")));
            size_t i;
            json_t *sk;
            json_array_foreach(skipped, i, sk) {
                if (n >= sizeof k->reason) break;
                n += (size_t)snprintf(k->reason + n, sizeof k->reason - n, "%s %s (%s)",
                                      i ? ";" : "", json_string_value(json_object_get(sk, "test")),
                                      json_string_value(json_object_get(sk, "why")));
            }
            op->mark = 0;
        } else if (peak < k->min_ratio * k->expect_gbps) {
            k->state = NC_DEGRADED;
            snprintf(k->reason, sizeof k->reason,
                     "%s %.3g GB/s is %.0f%% of the expected %.3g GB/s (bar %.0f%%); latency "
                     "%.0f us",
                     what, peak, 100.0 * peak / k->expect_gbps, k->expect_gbps,
                     100.0 * k->min_ratio, lat);
            op->mark = 1;
        } else {
            k->state = NC_PASSED;
            snprintf(k->reason, sizeof k->reason,
                     "%s %.3g GB/s (%.0f%% of the expected %.3g GB/s); latency %.0f us", what, peak,
                     100.0 * peak / k->expect_gbps, k->expect_gbps, lat);
            op->mark = 0;
        }
    }
    if (op->mark >= 0) set_marks(nc, k, op->mark);
    op->doc = check_json(k);
    log_info("nodecheck: %s (%s) %s: %s", k->id, k->kind, state_names[k->state], k->reason);
}

/* Fails running checks with a part not reported in time. Caller holds mu;
 * returns how many ops it filled (at most max). */
static int expire(struct nodecheck *nc, int64_t now, struct row_op *ops, int max) {
    int n = 0;
    for (struct nc_check *k = nc->checks; k && n < max; k = k->next) {
        if (k->state != NC_RUNNING || now - k->started_ms < k->timeout_ms) continue;
        char why[200] = "timed out";
        for (int i = 0; i < k->nparts; i++)
            if (!k->parts[i].reported)
                snprintf(why, sizeof why, "node %s did not report its part within %d s",
                         k->parts[i].node, k->timeout_ms / 1000);
        finish(nc, k, now, why, &ops[n++]);
    }
    return n;
}

static void persist(struct loomd *ld, struct row_op *ops, int n) {
    for (int i = 0; i < n; i++) {
        if (store_write(ld->store, write_check, &ops[i]) != STORE_OK)
            log_error("nodecheck: could not store check %s", ops[i].k->id);
        json_decref(ops[i].doc);
    }
}

/* Fails overdue checks and starts what can start; any thread without locks.
 * Called by the agents' polls and by readers, so a check whose agent died
 * still ends while someone watches it. */
static void sweep(struct loomd *ld) {
    struct nodecheck *nc = nc_of(ld);
    struct row_op ops[8];
    int64_t now = store_now_ms();
    pthread_mutex_lock(&nc->mu);
    int n = expire(nc, now, ops, 8);
    if (n && dispatch(nc, now)) http_notify_signal(&nc->work);
    pthread_mutex_unlock(&nc->mu);
    if (n) {
        persist(ld, ops, n);
        http_notify_signal(&nc->done);
        cluster_kick(ld);
    }
}

/* ---------- /metrics ---------- */

void nodecheck_metrics_write(struct loomd *ld, FILE *f) {
    struct nodecheck *nc = nc_of(ld);
    struct cluster *c = ld->cluster;
    if (!nc) return;
    char(*names)[64] = calloc(CLUSTER_MAX_NODES, sizeof *names); /* scrapes run concurrently */
    int nn = 0;
    if (!names) return;
    if (c) {
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < c->nnodes && nn < CLUSTER_MAX_NODES; i++)
            snprintf(names[nn++], sizeof names[0], "%s", c->nodes[i].name);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&nc->mu);
    fprintf(f, "# HELP loom_node_degraded 1 while a node check marks the node degraded.\n"
               "# TYPE loom_node_degraded gauge\n");
    for (int i = 0; i < nn; i++) {
        int d = 0;
        for (int m = 0; m < nc->nmarks && !d; m++)
            if (!strcmp(nc->marks[m].node, names[i])) d = 1;
        fprintf(f, "loom_node_degraded{node=\"%s\"} %d\n", names[i], d);
    }
    /* Newest judged check per (node, kind, peer): the list is newest first. */
    static const char *const fam[2] = {"loom_nodecheck_busbw_gbps", "loom_nodecheck_expected_gbps"};
    static const char *const help[2] = {"Peak all-reduce bus bandwidth of the newest node check.",
                                        "Bus bandwidth the newest node check was judged against."};
    for (int which = 0; which < 2; which++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", fam[which], help[which], fam[which]);
        const struct nc_check *seen[NC_MAX_CHECKS];
        int nseen = 0;
        for (struct nc_check *k = nc->checks; k; k = k->next) {
            if ((k->state != NC_PASSED && k->state != NC_DEGRADED) || !k->summary) continue;
            int dup = 0;
            for (int s = 0; s < nseen && !dup; s++)
                dup = !strcmp(seen[s]->kind, k->kind) &&
                      !strcmp(seen[s]->parts[0].node, k->parts[0].node) &&
                      (k->nparts < 2 || !strcmp(seen[s]->parts[1].node, k->parts[1].node));
            if (dup || nseen >= NC_MAX_CHECKS) continue;
            seen[nseen++] = k;
            /* A one-device check measures no bandwidth: no sample. */
            if (json_is_null(json_object_get(k->summary, "peak_busbw_gbps"))) continue;
            double v = which ? k->expect_gbps
                             : json_number_value(json_object_get(k->summary, "peak_busbw_gbps"));
            for (int p = 0; p < k->nparts; p++)
                fprintf(f, "%s{node=\"%s\",kind=\"%s\",peer=\"%s\"} %g\n", fam[which],
                        k->parts[p].node, k->kind, k->nparts > 1 ? k->parts[1 - p].node : "", v);
        }
    }
    pthread_mutex_unlock(&nc->mu);
    free(names);
}

/* ---------- admin API ---------- */

struct node_facts {
    int found, lost, busy;
    char kind[8], model[96], interconnect[32];
    int ndev;
};

static void node_facts(struct loomd *ld, const char *name, struct node_facts *f) {
    memset(f, 0, sizeof *f);
    struct cluster *c = ld->cluster;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    int ni = cluster_node_find(c, name);
    if (ni >= 0) {
        struct cluster_node *n = &c->nodes[ni];
        f->found = 1;
        f->lost = n->lost || !n->seen;
        f->ndev = n->ndev;
        snprintf(f->kind, sizeof f->kind, "%s", n->kind);
        snprintf(f->model, sizeof f->model, "%s", n->gpu_model);
        const char *ic = json_string_value(json_object_get(n->host, "interconnect"));
        snprintf(f->interconnect, sizeof f->interconnect, "%s", ic ? ic : "");
        for (struct cluster_attempt *a = c->attempts; a; a = a->next)
            for (int r = 0; r < a->world; r++)
                if (a->ranks[r].node == ni && !a->ranks[r].released) f->busy++;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Queues a check of `node` (with `peer`: a pair check) whose nodes were
 * validated by the caller (fa: facts of `node`). expect <= 0: the table's
 * figure; max_bytes <= 0: the device kind's default. Returns the check as
 * JSON (caller owns) or NULL when out of memory or of random bytes. No locks
 * held by the caller. */
static json_t *queue_check(struct loomd *ld, const char *node, const char *peer,
                           const struct node_facts *fa, double expect, double min_ratio,
                           long max_bytes, int iters, int timeout_ms) {
    struct nodecheck *nc = nc_of(ld);
    struct nc_check *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    snprintf(k->id, sizeof k->id, "c-");
    if (token_hex(k->id + 2, sizeof k->id - 2, 6) != 0 ||
        token_hex(k->token, sizeof k->token, 16) != 0) {
        log_error("nodecheck: no random bytes for a check id and token");
        free(k);
        return NULL;
    }
    snprintf(k->kind, sizeof k->kind, "%s", peer ? "pair" : "node");
    snprintf(k->device_kind, sizeof k->device_kind, "%s", fa->kind);
    k->state = NC_QUEUED;
    k->created_ms = store_now_ms();
    k->rdzv = json_object();
    k->min_ratio = min_ratio;
    k->max_bytes = max_bytes > 0 ? max_bytes : (!strcmp(fa->kind, "cuda") ? 1L << 30 : 16L << 20);
    k->iters = iters;
    k->timeout_ms = timeout_ms;
    k->expect_gbps = expect > 0
                         ? expect
                         : nodecheck_expected_gbps(k->kind, fa->kind, fa->interconnect, fa->model);
    snprintf(k->parts[0].node, sizeof k->parts[0].node, "%s", node);
    if (peer) {
        k->nparts = 2;
        k->world = 2;
        k->parts[0].nranks = 1;
        snprintf(k->parts[1].node, sizeof k->parts[1].node, "%s", peer);
        k->parts[1].first_rank = 1;
        k->parts[1].nranks = 1;
    } else {
        k->nparts = 1;
        k->world = fa->ndev;
        k->parts[0].nranks = fa->ndev;
    }
    struct row_op op = {.k = k, .mark = -1, .create = 1};
    pthread_mutex_lock(&nc->mu);
    k->next = nc->checks;
    nc->checks = k;
    int started = dispatch(nc, k->created_ms);
    trim(nc);
    op.doc = check_json(k);
    pthread_mutex_unlock(&nc->mu);
    if (started) http_notify_signal(&nc->work);
    cluster_kick(ld); /* the scheduler re-reads which nodes to avoid */
    persist(ld, &op, 1);
    pthread_mutex_lock(&nc->mu);
    json_t *out = check_json(k);
    pthread_mutex_unlock(&nc->mu);
    log_info("nodecheck: %s queued (%s on %s%s%s, expect %.3g GB/s)", k->id, k->kind, node,
             peer ? " and " : "", peer ? peer : "", k->expect_gbps);
    return out;
}

int nodecheck_api_create(struct http_req *req) {
    const char *node = http_param(req, "id");
    json_t *b = req->json;
    const char *peer = json_string_value(json_object_get(b, "peer"));
    json_t *je = json_object_get(b, "expect_busbw_gbps"), *jr = json_object_get(b, "min_ratio"),
           *jm = json_object_get(b, "max_bytes"), *ji = json_object_get(b, "iters"),
           *jt = json_object_get(b, "timeout_s");
    int force = json_is_true(json_object_get(b, "force"));
    if (je && (!json_is_number(je) || json_number_value(je) <= 0))
        return http_error_field(req, 422, "INVALID_FIELD", "expect_busbw_gbps",
                                "expect_busbw_gbps must be a number > 0");
    if (jr && (!json_is_number(jr) || json_number_value(jr) <= 0 || json_number_value(jr) > 1))
        return http_error_field(req, 422, "INVALID_FIELD", "min_ratio",
                                "min_ratio must be a number in (0, 1]");
    if (jm && (!json_is_integer(jm) || json_integer_value(jm) < 4096 ||
               json_integer_value(jm) > (1LL << 32)))
        return http_error_field(req, 422, "INVALID_FIELD", "max_bytes",
                                "max_bytes must be an integer in [4096, 4294967296]");
    if (ji && (!json_is_integer(ji) || json_integer_value(ji) < 1 || json_integer_value(ji) > 100))
        return http_error_field(req, 422, "INVALID_FIELD", "iters",
                                "iters must be an integer in [1, 100]");
    if (jt && (!json_is_integer(jt) || json_integer_value(jt) < 2 || json_integer_value(jt) > 3600))
        return http_error_field(req, 422, "INVALID_FIELD", "timeout_s",
                                "timeout_s must be an integer in [2, 3600]");
    struct node_facts fa, fb;
    node_facts(req->ld, node, &fa);
    if (!fa.found) return http_error(req, 404, "NODE_NOT_FOUND", "no node '%s'", node);
    if (fa.lost)
        return http_error(req, 409, "NODE_NOT_READY", "node '%s' is lost or unknown", node);
    if (fa.ndev < 1)
        return http_error(req, 409, "NODE_NOT_READY", "node '%s' has no devices", node);
    if (fa.busy && !force)
        return http_error(req, 409, "NODE_BUSY",
                          "node '%s' runs %d job rank(s): drain it and wait for them to finish, "
                          "or pass \"force\": true (results will be disturbed)",
                          node, fa.busy);
    if (peer) {
        if (!strcmp(peer, node))
            return http_error_field(req, 422, "INVALID_FIELD", "peer",
                                    "peer must be another node than '%s'", node);
        node_facts(req->ld, peer, &fb);
        if (!fb.found) return http_error(req, 404, "NODE_NOT_FOUND", "no node '%s'", peer);
        if (fb.lost)
            return http_error(req, 409, "NODE_NOT_READY", "node '%s' is lost or unknown", peer);
        if (fb.busy && !force)
            return http_error(req, 409, "NODE_BUSY", "node '%s' runs %d job rank(s)", peer,
                              fb.busy);
        if (strcmp(fa.kind, fb.kind))
            return http_error(req, 409, "KIND_MISMATCH", "node '%s' is %s, '%s' is %s", node,
                              fa.kind, peer, fb.kind);
    }
    json_t *out = queue_check(
        req->ld, node, peer, &fa, je ? json_number_value(je) : 0, jr ? json_number_value(jr) : 0.5,
        jm ? (long)json_integer_value(jm) : 0, ji ? (int)json_integer_value(ji) : 5,
        jt ? (int)json_integer_value(jt) * 1000 : NC_PART_TIMEOUT_MS);
    if (!out) return http_error(req, 500, "INTERNAL", "cannot queue a check");
    return http_reply_json(req, 202, out);
}

int nodecheck_api_clear(struct http_req *req) {
    struct nodecheck *nc = nc_of(req->ld);
    const char *node = http_param(req, "id");
    struct node_facts f;
    node_facts(req->ld, node, &f);
    if (!f.found) return http_error(req, 404, "NODE_NOT_FOUND", "no node '%s'", node);
    if (store_write(req->ld->store, clear_marks, (void *)node) != STORE_OK)
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not clear the marks");
    int cleared = 0;
    pthread_mutex_lock(&nc->mu);
    for (int i = 0; i < nc->nmarks;)
        if (!strcmp(nc->marks[i].node, node)) {
            nc->marks[i] = nc->marks[--nc->nmarks];
            cleared++;
        } else {
            i++;
        }
    pthread_mutex_unlock(&nc->mu);
    cluster_kick(req->ld);
    log_info("nodecheck: %d degraded mark(s) of %s cleared by the admin", cleared, node);
    return http_reply_json(req, 200, json_pack("{s:s, s:i}", "node", node, "cleared", cleared));
}

struct list_q {
    const char *node;
    int limit;
    json_t *items;
};

static int list_read(struct store_tx *tx, void *arg) {
    struct list_q *q = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT doc FROM node_checks WHERE ?1 IS NULL OR ',' || nodes || ',' "
                       "LIKE '%,' || ?1 || ',%' ORDER BY created_at DESC LIMIT ?2");
    if (!st) return STORE_ERR;
    if (q->node) sqlite3_bind_text(st, 1, q->node, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, q->limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *d = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
        if (d) json_array_append_new(q->items, d);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

int nodecheck_api_list(struct http_req *req) {
    const char *node = http_query(req, "node"), *lim = http_query(req, "limit");
    int limit = lim ? atoi(lim) : 50;
    if (limit < 1 || limit > 1000)
        return http_error(req, 400, "INVALID_QUERY", "limit=%s is not an integer in [1, 1000]",
                          lim);
    struct list_q q = {node && *node ? node : NULL, limit, json_array()};
    sweep(req->ld);
    if (store_read(req->ld->store, list_read, &q) != STORE_OK) {
        json_decref(q.items);
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read node checks");
    }
    /* Queued and running ones: their stored doc is from creation; show live state. */
    struct nodecheck *nc = nc_of(req->ld);
    pthread_mutex_lock(&nc->mu);
    size_t i;
    json_t *it;
    json_array_foreach(q.items, i, it) {
        struct nc_check *k = find_check(nc, json_string_value(json_object_get(it, "id")));
        if (k) json_array_set_new(q.items, i, check_json(k));
    }
    pthread_mutex_unlock(&nc->mu);
    return http_reply_json(req, 200, json_pack("{s:o}", "items", q.items));
}

struct get_q {
    const char *id;
    json_t *doc;
};

static int get_read(struct store_tx *tx, void *arg) {
    struct get_q *q = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT doc FROM node_checks WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, q->id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        q->doc = json_loads((const char *)sqlite3_column_text(st, 0), 0, NULL);
    sqlite3_reset(st);
    return STORE_OK;
}

int nodecheck_api_get(struct http_req *req) {
    struct nodecheck *nc = nc_of(req->ld);
    const char *id = http_param(req, "id");
    sweep(req->ld);
    pthread_mutex_lock(&nc->mu);
    struct nc_check *k = find_check(nc, id);
    json_t *out = k ? check_json(k) : NULL;
    pthread_mutex_unlock(&nc->mu);
    if (out) return http_reply_json(req, 200, out);
    struct get_q q = {id, NULL};
    if (store_read(req->ld->store, get_read, &q) != STORE_OK)
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read node checks");
    if (!q.doc) return http_error(req, 404, "CHECK_NOT_FOUND", "no node check '%s'", id);
    return http_reply_json(req, 200, q.doc);
}

/* ---------- agent API ---------- */

/* This node's untaken parts of running checks, marked taken. Caller holds mu. */
static json_t *take_parts(struct nodecheck *nc, const char *node) {
    json_t *arr = json_array();
    for (struct nc_check *k = nc->checks; k; k = k->next) {
        if (k->state != NC_RUNNING) continue;
        for (int i = 0; i < k->nparts; i++) {
            struct nc_part *p = &k->parts[i];
            if (strcmp(p->node, node) || p->taken) continue;
            p->taken = 1;
            char rdzv[96];
            snprintf(rdzv, sizeof rdzv, "/v1/nodechecks/%s/rdzv", k->id);
            json_array_append_new(
                arr,
                json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:s, s:I, s:i}", "id", k->id, "kind",
                          k->kind, "world", k->world, "first_rank", p->first_rank, "ranks",
                          p->nranks, "rdzv", rdzv, "token", k->token, "device", k->device_kind,
                          "max_bytes", (json_int_t)k->max_bytes, "iters", k->iters));
        }
    }
    return arr;
}

static int ever_checked(struct store_tx *tx, void *arg) {
    const char **q = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT 1 FROM node_checks WHERE ',' || nodes || ',' LIKE "
                                      "'%,' || ? || ',%' LIMIT 1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, q[0], -1, SQLITE_STATIC);
    q[1] = sqlite3_step(st) == SQLITE_ROW ? "yes" : NULL;
    sqlite3_reset(st);
    return STORE_OK;
}

/* nodecheck-on-join: the first poll of a registered, idle node that was
 * never checked queues a node check (once per node per loomd process). */
static void check_on_join(struct loomd *ld, const char *node) {
    struct nodecheck *nc = nc_of(ld);
    if (!ld->cfg.nodecheck_on_join) return;
    pthread_mutex_lock(&nc->mu);
    int seen = 0;
    for (int i = 0; i < nc->njoined && !seen; i++)
        seen = !strcmp(nc->joined[i], node);
    pthread_mutex_unlock(&nc->mu);
    if (seen) return;
    struct node_facts f;
    node_facts(ld, node, &f);
    if (!f.found) return; /* not registered yet: the next poll tries again */
    pthread_mutex_lock(&nc->mu);
    if (nc->njoined < CLUSTER_MAX_NODES)
        snprintf(nc->joined[nc->njoined++], sizeof nc->joined[0], "%s", node);
    pthread_mutex_unlock(&nc->mu);
    const char *q[2] = {node, NULL};
    if (f.lost || f.busy || f.ndev < 1 || store_read(ld->store, ever_checked, q) != STORE_OK ||
        q[1])
        return;
    json_t *k = queue_check(ld, node, NULL, &f, 0, 0.5, 0, 5, NC_PART_TIMEOUT_MS);
    if (k)
        log_info("nodecheck: %s joined and was never checked: check %s queued", node,
                 json_string_value(json_object_get(k, "id")));
    json_decref(k);
}

int nodecheck_agent_poll(struct http_req *req) {
    struct nodecheck *nc = nc_of(req->ld);
    const char *node = http_query(req, "node"), *w = http_query(req, "wait_ms");
    if (!node || !*node) return http_error(req, 400, "INVALID_QUERY", "node= is required");
    if (req->node[0] && strcmp(node, req->node)) /* the credential's node only (nodes.h) */
        return http_error(req, 403, "NODE_MISMATCH", "the credential is node %s's, not %s's",
                          req->node, node);
    check_on_join(req->ld, node);
    int wait = w ? atoi(w) : 0;
    if (wait < 0) wait = 0;
    if (wait > NC_MAX_WAIT_MS) wait = NC_MAX_WAIT_MS;
    int64_t deadline = store_now_ms() + wait;
    uint64_t gen = http_notify_gen(&nc->work);
    json_t *parts = NULL;
    for (;;) {
        struct row_op ops[8];
        int64_t now = store_now_ms();
        pthread_mutex_lock(&nc->mu);
        int nexp = expire(nc, now, ops, 8);
        if (nexp && dispatch(nc, now)) http_notify_signal(&nc->work);
        parts = take_parts(nc, node);
        pthread_mutex_unlock(&nc->mu);
        if (nexp) {
            persist(req->ld, ops, nexp);
            http_notify_signal(&nc->done);
            cluster_kick(req->ld);
        }
        if (json_array_size(parts) || now >= deadline) break;
        json_decref(parts);
        parts = NULL;
        int left = (int)(deadline - now);
        if (left > 5000) left = 5000; /* wake now and then to expire stuck checks */
        if (http_wait(req->ld->http, &nc->work, &gen, left) < 0) break;
    }
    if (!parts) parts = json_array();
    return http_reply_json(req, 200, json_pack("{s:o}", "checks", parts));
}

int nodecheck_agent_report(struct http_req *req) {
    struct nodecheck *nc = nc_of(req->ld);
    const char *id = http_param(req, "id");
    const char *node = json_string_value(json_object_get(req->json, "node"));
    if (!node) return http_error_field(req, 422, "INVALID_FIELD", "node", "node is required");
    if (req->node[0] && strcmp(node, req->node))
        return http_error(req, 403, "NODE_MISMATCH", "the credential is node %s's, not %s's",
                          req->node, node);
    struct row_op op = {0};
    int finished = 0;
    pthread_mutex_lock(&nc->mu);
    struct nc_check *k = find_check(nc, id);
    struct nc_part *p = NULL;
    for (int i = 0; k && i < k->nparts; i++)
        if (!strcmp(k->parts[i].node, node)) p = &k->parts[i];
    if (!k || !p || k->state != NC_RUNNING || p->reported) {
        pthread_mutex_unlock(&nc->mu);
        if (!k) return http_error(req, 404, "CHECK_NOT_FOUND", "no node check '%s'", id);
        return http_error(req, 409, "CHECK_NOT_RUNNING",
                          "check '%s' has no open part for node '%s' (state %s)", id, node,
                          state_names[k->state]);
    }
    p->reported = 1;
    p->ok = json_is_true(json_object_get(req->json, "ok"));
    p->result = json_deep_copy(req->json);
    int64_t now = store_now_ms();
    if (!p->ok) {
        const char *e = json_string_value(json_object_get(req->json, "error"));
        char why[400];
        snprintf(why, sizeof why, "node %s: %s", node, e ? e : "the probe failed");
        finish(nc, k, now, why, &op);
        finished = 1;
    } else {
        int all = 1;
        for (int i = 0; i < k->nparts; i++)
            if (!k->parts[i].reported) all = 0;
        if (all) {
            finish(nc, k, now, NULL, &op);
            finished = 1;
        }
    }
    if (finished && dispatch(nc, now)) http_notify_signal(&nc->work);
    pthread_mutex_unlock(&nc->mu);
    if (finished) {
        persist(req->ld, &op, 1);
        http_notify_signal(&nc->done);
        cluster_kick(req->ld);
    }
    return http_reply_json(req, 200, json_pack("{s:b}", "ok", 1));
}

/* ---------- rendezvous (rdzv.c's protocol, check-scoped token) ---------- */

/* The key table of the running check `id` whose token is the request's bearer. Caller holds mu. */
static json_t *check_table(struct http_req *req, void *arg) {
    struct nc_check *k = find_check(arg, http_param(req, "id"));
    if (!k || k->state != NC_RUNNING || !token_equal(req->bearer, k->token)) return NULL;
    return k->rdzv;
}

static int check_deny(struct http_req *req, void *arg) {
    return http_error(req, 403, "RDZV_FORBIDDEN", "not a token of a running node check");
}

static struct rdzv_scope check_scope(struct nodecheck *nc) {
    return (struct rdzv_scope){.mu = &nc->mu,
                               .notify = &nc->rdzv,
                               .max_wait_ms = NC_MAX_WAIT_MS,
                               .arg = nc,
                               .table = check_table,
                               .deny = check_deny};
}

int nodecheck_rdzv_put(struct http_req *req) {
    struct rdzv_scope s = check_scope(nc_of(req->ld));
    return rdzv_scope_put(req, &s);
}

int nodecheck_rdzv_get(struct http_req *req) {
    struct rdzv_scope s = check_scope(nc_of(req->ld));
    return rdzv_scope_get(req, &s);
}
