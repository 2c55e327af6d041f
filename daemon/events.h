/* The event stream: typed, tenant-scoped, replayable events over every job
 * (job.queued ... job.cancelled, checkpoint.saved, export.ready), read with
 * GET /v1/events (pages, long-poll, Server-Sent Events) and delivered to
 * webhooks (daemon/webhooks.h).
 *
 * Durability: events_emit() runs inside a store write callback and inserts
 * the event row (table `events`, migration 070) together with the webhook
 * outbox rows, in the transaction of the change it reports; so an event
 * exists if and only if its change committed. `seq` grows monotonically and
 * is the replay cursor.
 *
 * Wake-ups: the store's post-commit hook reads the newest seq; when it grew,
 * events->notify is signalled, so long-polls and streams wake only once the
 * event is durable, and compare seqs before they query (no query per wake-up
 * for a subscriber whose filter cannot have changed). */
#ifndef LOOM_DAEMON_EVENTS_H
#define LOOM_DAEMON_EVENTS_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "daemon/http.h"
#include "daemon/store.h"

struct loomd;

/* Module state (ld->events). */
struct events {
    struct http_notify notify; /* signalled after a commit that added events */
    _Atomic int64_t last_seq;  /* newest committed seq */
};

/* The event types, in the order of the docs. */
extern const char *const events_types[];
extern const int events_types_count;
/* 1 when `type` is one of events_types[]. */
int events_type_valid(const char *type);

/* The event type a job state transition produces, or NULL for transitions
 * that have none (queued -> starting, -> cancelling). from < 0: the job was
 * just submitted. A retry (-> queued from starting/running) is job.preempted
 * when the reason starts with the PREEMPTED code, job.retrying otherwise.
 * Pure (table-tested). */
const char *events_type_for_transition(int from, int to, const char *reason);

/* Inside a store write callback: appends an event of `type` for job `job_id`
 * (tenant_id NULL: read from the job row) with `data` (borrowed; may be NULL;
 * "job_id" is added), and one pending webhook delivery per live webhook of
 * the tenant subscribed to the type. Returns the new seq (> 0) or a STORE_*
 * error (< 0). */
int64_t events_emit(struct store_tx *tx, const char *type, const char *job_id,
                    const char *tenant_id, json_t *data);

/* Inside a write callback: checkpoint.saved for (job, step) unless one was
 * already recorded (agents may ship a record twice). path: where the worker
 * wrote it; shown relative to out_dir when under it. */
int events_checkpoint_saved(struct store_tx *tx, const char *job_id, int attempt, long step,
                            const char *path);
/* Inside a write callback: export.ready for (job, kind) unless recorded. */
int events_export_ready(struct store_tx *tx, const char *job_id, const char *kind,
                        const char *path);

/* Module table entries (daemon/loomd.c). */
int events_start(struct loomd *ld);
void events_stop(struct loomd *ld);

/* GET /v1/events (daemon/api_events.c). */
int api_events_list(struct http_req *req);

#endif
