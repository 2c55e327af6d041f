/* Usage ledger API: GET /v1/usage?from=&to=&group_by=tenant|job|month[&tenant=ID]
 *
 * The scheduler loop writes one ledger row per node when an attempt's ranks
 * have all stopped (tenant, job, attempt, node, GPU model, GPUs, start, end,
 * GPU-seconds, cost at the node's GPU model price from <data-dir>/gpu_prices.json,
 * else loomd's --price-per-gpu-hour). This handler sums rows
 * whose start lies in [from, to) (RFC 3339, YYYY-MM-DD, or ms since the
 * epoch; default: everything). Tenants see only their own rows; the admin
 * sees all, or one tenant with ?tenant=. Attempts still holding devices are
 * not in the ledger yet; "running" lists them per node with their usage so
 * far (same filters). */
#ifndef LOOM_DAEMON_USAGE_H
#define LOOM_DAEMON_USAGE_H

#include <stdint.h>

struct http_req;

int usage_get(struct http_req *req);
/* Parses a time bound; returns 0 and *ms, or -1 when malformed. */
int usage_parse_time(const char *s, int64_t *ms);

#endif
