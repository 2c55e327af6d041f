/* Usage ledger API: GET /v1/usage?from=&to=&group_by=tenant|job|month[&tenant=ID]
 *
 * The scheduler loop writes one ledger row per node when an attempt's ranks
 * have all stopped (tenant, job, attempt, node, GPU model, gpu_type, GPUs,
 * start, end, GPU-seconds, cost and currency) through usage_insert. The cost
 * is at the price of the node's gpu_type (PUT /v1/prices, daemon/api_prices.h),
 * else the GPU model's price from <data-dir>/gpu_prices.json, else loomd's
 * --price-per-gpu-hour. group_by also takes gpu_type. This handler sums rows
 * whose start lies in [from, to) (RFC 3339, YYYY-MM-DD, or ms since the
 * epoch; default: everything). Tenants see only their own rows; the admin
 * sees all, or one tenant with ?tenant=. Attempts still holding devices are
 * not in the ledger yet; "running" lists them per node with their usage so
 * far (same filters). */
#ifndef LOOM_DAEMON_USAGE_H
#define LOOM_DAEMON_USAGE_H

#include <stdint.h>

struct http_req;
struct store_tx;

/* One ledger row: `price` is the fallback per GPU-hour (gpu_prices.json or
 * --price-per-gpu-hour) used when the node's gpu_type has no stored price. */
struct usage_row {
    const char *tenant_id, *job_id;
    int attempt;
    const char *node, *gpu_model;
    int gpus;
    int64_t t0, t1; /* ms */
    double price;
};
/* Inserts the row inside a store write, billed at the type price when one is
 * set. Returns a STORE_* code. */
int usage_insert(struct store_tx *tx, const struct usage_row *r);

int usage_get(struct http_req *req);
/* Parses a time bound; returns 0 and *ms, or -1 when malformed. */
int usage_parse_time(const char *s, int64_t *ms);

#endif
