/* Usage ledger API: GET /v1/usage?from=&to=&group_by=tenant|job|month[&tenant=ID]
 *
 * The scheduler loop writes one ledger row per node when an attempt's ranks
 * have all stopped (tenant, job, attempt, node, GPU model, gpu_type, GPUs,
 * start, end, GPU-seconds, cost and currency) through usage_insert. The cost
 * is at the price of the node's gpu_type (PUT /v1/prices, daemon/api_prices.h;
 * its per_gpu_month, when set, prorated per hour over the hours of each row's
 * month),
 * else the GPU model's price from <data-dir>/gpu_prices.json, else loomd's
 * --price-per-gpu-hour. group_by also takes gpu_type. This handler sums rows
 * whose start lies in [from, to) (RFC 3339, YYYY-MM-DD, or ms since the
 * epoch; default: everything). Tenants see only their own rows; the admin
 * sees all, or one tenant with ?tenant=. Attempts still holding devices are
 * not in the ledger yet; "running" lists them per node with their usage so
 * far (same filters). */
#ifndef LOOM_DAEMON_USAGE_H
#define LOOM_DAEMON_USAGE_H

#include <stddef.h>
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
    const char *cause; /* supervise_bill_cause(); NULL: "user" */
    int billed;        /* 0: recorded with cost 0 (the policy does not bill the cause) */
};
/* Inserts the usage inside a store write, one ledger row for each UTC hour
 * [t0, t1) touches (prorated), billed at the type price when one is set.
 * Returns a STORE_* code. */
int usage_insert(struct store_tx *tx, const struct usage_row *r);

int usage_get(struct http_req *req);
/* Is `cause` in the comma-separated policy list (--bill-causes)? */
int usage_cause_billed(const char *policy, const char *cause);
/* 0 when every entry of the list is a cause name; else -1 with the first
 * wrong entry in bad. */
int usage_policy_check(const char *policy, char *bad, size_t len);
/* Hours in the calendar month (UTC) holding t_ms: 672, 696, 720 or 744. */
double usage_month_hours(int64_t t_ms);
/* The price of one GPU-hour at t_ms: per_gpu_month / usage_month_hours(t_ms)
 * when a monthly rate is set (per_gpu_month >= 0), else per_gpu_hour. */
double usage_hour_price(double per_gpu_hour, double per_gpu_month, int64_t t_ms);
/* The end of the UTC hour holding t_ms (the first ms of the next hour). */
int64_t usage_hour_end(int64_t t_ms);
/* Parses a time bound; returns 0 and *ms, or -1 when malformed. */
int usage_parse_time(const char *s, int64_t *ms);

#endif
