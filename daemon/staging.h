/* Data-staging reports: POST /v1/jobs/{id}/staging, sent by loom-stage
 * (agent/stage/main.c) on a node before the worker starts, authorised by the
 * attempt's rendezvous token (the same bearer the worker uses for
 * /v1/rdzv). Records a job event (state unchanged) such as
 *   "data staged on gpu-07: 3 files, 1.20 GB (2 from the cache, 400 MB
 *    copied) in 4.1 s"
 * so `GET /v1/jobs/{id}/events` shows what staging cost. Body: {attempt, host,
 * files, cache_hits, bytes, copied_bytes, seconds, evicted, cache_bytes
 * [, error]}. Tokenizing raw data adds reports with "phase": "tokenizing" and
 * {progress, done_bytes, total_bytes} ("tokenizing on gpu-07: 40% (12 MB of
 * 30 MB)") or {error, fatal} ("tokenizing on gpu-07 failed: chat.jsonl line 3:
 * ...; the job fails"), and "tokenized" with {splits, cache_hits, key,
 * examples, train_tokens, val_tokens, loss_tokens, seconds}. */
#ifndef LOOM_DAEMON_STAGING_H
#define LOOM_DAEMON_STAGING_H

struct http_req;

int staging_report(struct http_req *req);

#endif
