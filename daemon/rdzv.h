/* Rendezvous: a per-attempt key/value store for the ranks of one attempt
 * (NCCL unique id, Gloo addresses), matching worker/comm/rdzv.h:
 *   PUT /v1/rdzv/{job}/{attempt}/{key}  {"value":"<base64>"}  -> 200 {"ok":true}
 *   GET /v1/rdzv/{job}/{attempt}/{key}?wait_ms=N -> 200 {"value":..} | 404 after the wait
 * Authorization: Bearer <attempt token> (LOOM_RDZV_TOKEN). The token is random
 * per attempt and checked in constant time against that attempt only, so a
 * token of one attempt (or any tenant's API token) cannot read another
 * attempt's keys: 403 RDZV_FORBIDDEN. Keys are written once (a different
 * second value is 409 RDZV_KEY_EXISTS). Values live in memory for as long as
 * the attempt is active. */
#ifndef LOOM_DAEMON_RDZV_H
#define LOOM_DAEMON_RDZV_H

struct http_req;

int rdzv_put(struct http_req *req);
int rdzv_get_key(struct http_req *req);

#endif
