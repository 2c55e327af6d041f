/* GPU prices per gpu_type: PUT /v1/prices (admin) replaces the price list,
 * GET /v1/prices (any token) reads it. Stored in the gpu_prices table
 * (schema/060_gpu_fleet.sql), so they survive restarts. Usage rows are billed
 * at the price of their node's gpu_type (daemon/usage.h) and /v1/plan prices
 * each GPU type of the cluster with them; a type without a price falls back to
 * <data-dir>/gpu_prices.json by GPU model name, then --price-per-gpu-hour. */
#ifndef LOOM_DAEMON_API_PRICES_H
#define LOOM_DAEMON_API_PRICES_H

#include <jansson.h>

struct http_req;
struct loomd;

int api_prices_put(struct http_req *req);
int api_prices_get(struct http_req *req);

/* The stored prices as {gpu_type: {"per_gpu_hour","per_gpu_month","currency"}}
 * (caller owns); an empty object when none are set, NULL when the store cannot
 * be read. Any thread. */
json_t *prices_load(struct loomd *ld);

#endif
