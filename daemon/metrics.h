/* Metrics: per-route request counters by status and latency histograms
 * (lock-free atomics, updated by the HTTP layer), and the Prometheus text
 * exposition for GET /metrics. Other modules add their metrics as one row in
 * the collector table in daemon/metrics.c: a function that appends
 * Prometheus text for its own families to a FILE. */
#ifndef LOOM_DAEMON_METRICS_H
#define LOOM_DAEMON_METRICS_H

#include <stddef.h>
#include <stdio.h>

struct loomd;
struct metrics;

/* nroutes: the route table length (an extra slot counts unmatched paths). */
struct metrics *metrics_new(size_t nroutes);
void metrics_free(struct metrics *m);
/* Records one request: route index (nroutes for unmatched), status, seconds. */
void metrics_observe(struct metrics *m, size_t route, int status, double seconds);

/* The aggregate view (GET /metrics without a token): drops, in place, every
 * sample line with a label that names a job or a tenant (job, job_id,
 * tenant, tenant_id) and returns the new length. Done on the text, not per
 * collector, so a family added later cannot leak ids by forgetting a flag.
 * Pure (unit-tested). */
size_t metrics_public_filter(char *text, size_t len);

typedef void (*metrics_collector)(struct loomd *ld, FILE *f);
/* Writes every family (HTTP, store, jobs, then the collector table) to f. */
void metrics_write(struct loomd *ld, FILE *f);

#endif
