/* Metrics: request counters per route and status, request latency histograms
 * per route (lock-free atomics), and the Prometheus text exposition. Gauges
 * that live in the store (jobs by tenant and state) are read at scrape time. */
#include "daemon/metrics.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/nodecheck.h"
#include "daemon/webhooks.h"
#include "daemon/store.h"

/* Other modules: one row each, e.g. {sched_metrics_write}. */
static const metrics_collector collectors[] = {
    NULL, /* keeps the table non-empty; skipped */
    /* nodes, devices, queue wait, scheduling latency: daemon/nodes.c */
    cluster_metrics_write,
    /* node checks: degraded nodes, measured vs expected bandwidth (daemon/nodecheck.h) */
    nodecheck_metrics_write,
    /* event stream and webhook deliveries (daemon/webhooks.h) */
    webhooks_metrics_write,
};

static const int statuses[] = {200, 201, 202, 204, 400, 401, 403, 404, 405,
                               409, 413, 415, 422, 429, 499, 500, 503};
#define NSTATUS (sizeof statuses / sizeof *statuses)
static const double lat_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                     0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define NLAT (sizeof lat_buckets / sizeof *lat_buckets)

struct route_stats {
    _Atomic uint64_t by_status[NSTATUS + 1]; /* last: other statuses */
    _Atomic uint64_t lat[NLAT + 1];
    _Atomic uint64_t lat_sum_us;
};

struct metrics {
    size_t nroutes;
    struct route_stats *r; /* nroutes + 1 (unmatched) */
};

struct metrics *metrics_new(size_t nroutes) {
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->nroutes = nroutes;
    m->r = calloc(nroutes + 1, sizeof *m->r);
    if (!m->r) {
        free(m);
        return NULL;
    }
    return m;
}

void metrics_free(struct metrics *m) {
    if (!m) return;
    free(m->r);
    free(m);
}

void metrics_observe(struct metrics *m, size_t route, int status, double seconds) {
    if (route > m->nroutes) route = m->nroutes;
    struct route_stats *r = &m->r[route];
    size_t s = 0;
    while (s < NSTATUS && statuses[s] != status)
        s++;
    atomic_fetch_add(&r->by_status[s], 1);
    size_t b = 0;
    while (b < NLAT && seconds > lat_buckets[b])
        b++;
    atomic_fetch_add(&r->lat[b], 1);
    atomic_fetch_add(&r->lat_sum_us, (uint64_t)(seconds * 1e6));
}

/* Routes that hold a request open until something happens (agent and
 * rendezvous long-polls, followed logs, waited events): their durations are
 * waits, not latency, so they go to their own histogram and do not drown the
 * request-latency one. */
static const char *const long_polls[][2] = {
    {"GET", "/v1/agent/assignments"},
    {"GET", "/v1/agent/checks"},
    {"GET", "/v1/rdzv/{job}/{attempt}/{key}"},
    {"GET", "/v1/nodechecks/{id}/rdzv/{key}"},
    {"GET", "/v1/jobs/{id}/logs"},
    {"GET", "/v1/events"},
};

static int is_long_poll(const struct metrics *m, size_t i) {
    if (i >= m->nroutes) return 0;
    for (size_t k = 0; k < sizeof long_polls / sizeof *long_polls; k++)
        if (!strcmp(http_routes[i].method, long_polls[k][0]) &&
            !strcmp(http_routes[i].pattern, long_polls[k][1]))
            return 1;
    return 0;
}

static void route_label(const struct metrics *m, size_t i, char *buf, size_t len) {
    if (i >= m->nroutes)
        snprintf(buf, len, "method=\"other\",route=\"unmatched\"");
    else
        snprintf(buf, len, "method=\"%s\",route=\"%s\"", http_routes[i].method,
                 http_routes[i].pattern);
}

static int counts_cb(struct store_tx *tx, void *arg) {
    return store_job_counts(tx, arg);
}

static void write_jobs(struct loomd *ld, FILE *f) {
    json_t *counts = NULL;
    fprintf(f, "# HELP loom_jobs Jobs by tenant and state.\n# TYPE loom_jobs gauge\n");
    if (store_read(ld->store, counts_cb, &counts) != STORE_OK || !counts) return;
    const char *tenant;
    json_t *per;
    long long all[JOB_STATE_COUNT] = {0};
    json_object_foreach(counts, tenant, per) {
        for (int s = 0; s < JOB_STATE_COUNT; s++) {
            json_t *v = json_object_get(per, job_state_name(s));
            long long n = v ? (long long)json_integer_value(v) : 0LL;
            all[s] += n;
            fprintf(f, "loom_jobs{tenant=\"%s\",state=\"%s\"} %lld\n", tenant, job_state_name(s),
                    n);
        }
    }
    json_decref(counts);
    /* The sum over tenants: what the aggregate view keeps. */
    fprintf(f, "# HELP loom_jobs_by_state Jobs by state, all tenants.\n"
               "# TYPE loom_jobs_by_state gauge\n");
    for (int s = 0; s < JOB_STATE_COUNT; s++)
        fprintf(f, "loom_jobs_by_state{state=\"%s\"} %lld\n", job_state_name(s), all[s]);
}

/* Labels that name a job or a tenant. */
static const char *const private_labels[] = {"job", "job_id", "tenant", "tenant_id"};

/* 1 when the sample line [s, e) has a label named in private_labels. */
static int line_private(const char *s, const char *e) {
    if (s == e || *s == '#') return 0;
    const char *b = memchr(s, '{', (size_t)(e - s));
    if (!b) return 0;
    const char *p = b + 1;
    while (p < e && *p != '}') {
        const char *eq = memchr(p, '=', (size_t)(e - p));
        if (!eq) return 0;
        for (size_t i = 0; i < sizeof private_labels / sizeof *private_labels; i++)
            if ((size_t)(eq - p) == strlen(private_labels[i]) &&
                !memcmp(p, private_labels[i], (size_t)(eq - p)))
                return 1;
        /* Skip the quoted value (with its escapes) and the comma. */
        p = eq + 1;
        if (p < e && *p == '"') {
            for (p++; p < e && *p != '"'; p++)
                if (*p == '\\') p++;
            p++;
        }
        while (p < e && (*p == ',' || *p == ' '))
            p++;
    }
    return 0;
}

size_t metrics_public_filter(char *text, size_t len) {
    size_t out = 0, i = 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) + 1 : len - i;
        if (!line_private(text + i, text + i + n)) {
            memmove(text + out, text + i, n);
            out += n;
        }
        i += n;
    }
    if (out < len) text[out] = 0;
    return out;
}

void metrics_write(struct loomd *ld, FILE *f) {
    struct metrics *m = ld->metrics;
    char lbl[256];
    fprintf(f, "# HELP loom_http_requests_total HTTP requests by route and status.\n"
               "# TYPE loom_http_requests_total counter\n");
    for (size_t i = 0; i <= m->nroutes; i++) {
        route_label(m, i, lbl, sizeof lbl);
        for (size_t s = 0; s <= NSTATUS; s++) {
            uint64_t v = atomic_load(&m->r[i].by_status[s]);
            if (!v) continue;
            if (s < NSTATUS)
                fprintf(f, "loom_http_requests_total{%s,status=\"%d\"} %llu\n", lbl, statuses[s],
                        (unsigned long long)v);
            else
                fprintf(f, "loom_http_requests_total{%s,status=\"other\"} %llu\n", lbl,
                        (unsigned long long)v);
        }
    }
    static const struct {
        const char *name, *help;
        int long_poll;
    } hists[] = {
        {"loom_http_request_duration_seconds", "Request latency by route (long-polls excluded).",
         0},
        {"loom_http_long_poll_duration_seconds",
         "How long long-poll routes (agent assignments and checks, rendezvous, followed logs, "
         "waited events) held a request.",
         1},
    };
    for (size_t h = 0; h < sizeof hists / sizeof *hists; h++) {
        const char *name = hists[h].name;
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, hists[h].help, name);
        for (size_t i = 0; i <= m->nroutes; i++) {
            if (is_long_poll(m, i) != hists[h].long_poll) continue;
            uint64_t total = 0;
            for (size_t b = 0; b <= NLAT; b++)
                total += atomic_load(&m->r[i].lat[b]);
            if (!total) continue;
            route_label(m, i, lbl, sizeof lbl);
            uint64_t cum = 0;
            for (size_t b = 0; b < NLAT; b++) {
                cum += atomic_load(&m->r[i].lat[b]);
                fprintf(f, "%s_bucket{%s,le=\"%g\"} %llu\n", name, lbl, lat_buckets[b],
                        (unsigned long long)cum);
            }
            fprintf(f, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, lbl, (unsigned long long)total);
            fprintf(f, "%s_sum{%s} %.6f\n", name, lbl, atomic_load(&m->r[i].lat_sum_us) / 1e6);
            fprintf(f, "%s_count{%s} %llu\n", name, lbl, (unsigned long long)total);
        }
    }
    store_metrics_write(ld->store, f);
    write_jobs(ld, f);
    for (size_t i = 0; i < sizeof collectors / sizeof *collectors; i++)
        if (collectors[i]) collectors[i](ld, f);
}
