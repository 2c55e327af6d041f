/* The event stream: typed, tenant-scoped, replayable events over every job
 * (job.queued ... job.cancelled, checkpoint.saved, export.ready, and
 * job.diagnosis: STRAGGLER / COMM_BOUND / SAWTOOTH findings), read with
 * GET /v1/events (pages, long-poll, Server-Sent Events) and delivered to
 * webhooks (daemon/webhooks.h).
 *
 * Durability: events_emit() runs inside a store write callback and inserts
 * the event row (table `events`, migration 070) together with the webhook
 * outbox rows, in the transaction of the change it reports; so an event
 * exists if and only if its change committed. `seq` grows monotonically and
 * is the replay cursor.
 *
 * Fan-out: the store's post-commit hook (writer thread) reads the events the
 * commit added, once, and appends them to an in-memory ring of the newest
 * `--events-ring` events, each held as its API item (JSON text) and as its
 * ready SSE frame; then it publishes the newest seq and signals
 * events->notify. Long-polls and streams wake only once the event is
 * durable, and read from the ring under a read lock (a filter test and a
 * memcpy per event): no store query per subscriber per commit. A cursor
 * older than the ring (a replay from far back, or after a restart: the ring
 * is refilled from the store's newest rows at start) reads the store. */
#ifndef LOOM_DAEMON_EVENTS_H
#define LOOM_DAEMON_EVENTS_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "daemon/http.h"
#include "daemon/store.h"

struct loomd;

/* One event held in the ring. */
struct events_entry {
    int64_t seq;
    char tenant[32], job[32], type[32];
    char *item;  /* {"seq","type","job_id","created_at","data"}, compact JSON */
    char *frame; /* "id: SEQ\nevent: TYPE\ndata: ITEM\n\n" */
    size_t item_len, frame_len;
};

/* Module state (ld->events). */
struct events {
    struct http_notify notify;    /* signalled after a commit that added events */
    _Atomic int64_t last_seq;     /* newest committed seq (in the ring once published) */
    pthread_rwlock_t ring_mu;     /* guards the ring fields below */
    struct events_entry *ring;    /* circular, in seq order */
    int cap, head, count;         /* head: index of the oldest entry */
    int64_t floor;                /* every event with seq > floor is in the ring */
    struct events_fanout *fanout; /* the thread that writes SSE streams (api_events.c) */
};

/* What a reader wants: empty strings match everything. */
struct events_filter {
    char tenant[32]; /* "" = every tenant (admin) */
    char job[32];    /* "" = every job */
    char type[32];   /* "" = every type */
};

/* Called under the ring's read lock for each matching entry (must not block
 * or call back into events); non-zero stops the scan. */
typedef int (*events_visit)(void *arg, const struct events_entry *e);

/* Any thread: visits the ring's entries with seq > since matching f, in seq
 * order, at most max of them. Returns 1 when the ring covers `since` (then
 * *scanned is the seq up to which every event was considered: events in
 * (since, *scanned] that were not visited do not match or are beyond max), 0
 * when `since` is older than the ring (read the store instead). */
int events_ring_read(struct events *ev, int64_t since, const struct events_filter *f, int max,
                     events_visit fn, void *arg, int64_t *scanned);
/* 1 when every event after `since` is in the ring. */
int events_ring_covers(struct events *ev, int64_t since);
/* The API item of a stored event row (columns seq, type, job_id, created_at,
 * data), as the store path and the ring both serve it. New reference. */
json_t *events_row_item(sqlite3_stmt *st);

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

/* The SSE fan-out (daemon/api_events.c): one thread that holds the sockets
 * of the event streams (adopted from their connection threads, http.h) and,
 * after each commit that added events, copies the ring's ready frames to
 * every stream whose filter matches, with non-blocking writes. Started and
 * stopped by the events module; NULL when it could not start (streams then
 * keep their own thread). kick: after the ring grew (any thread). */
struct events_fanout *events_fanout_start(struct loomd *ld);
void events_fanout_kick(struct events_fanout *fo);
void events_fanout_stop(struct events_fanout *fo);
/* Streams the fan-out thread holds now (GET /v1/system/connections). */
int events_fanout_held(struct events_fanout *fo);

#endif
