/* Events: the type table, the transition -> type mapping, events_emit (event
 * row + webhook outbox rows in the caller's transaction), the in-memory ring
 * of the newest events and the post-commit fan-out. See events.h for the contract. */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include "daemon/events.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/loomd.h"

const char *const events_types[] = {
    "job.queued",    "job.started",       "job.retrying",  "job.preempted",
    "job.succeeded", "job.failed",        "job.cancelled", "checkpoint.saved",
    "export.ready",  "artifacts.expired", "job.diagnosis",
};
const int events_types_count = (int)(sizeof events_types / sizeof *events_types);

int events_type_valid(const char *type) {
    for (int i = 0; type && i < events_types_count; i++)
        if (!strcmp(type, events_types[i])) return 1;
    return 0;
}

/* Event type by target state (the retry case is decided in code). */
static const char *const type_by_state[JOB_STATE_COUNT] = {
    [JOB_QUEUED] = "job.queued",       [JOB_STARTING] = NULL,
    [JOB_RUNNING] = "job.started",     [JOB_CANCELLING] = NULL,
    [JOB_SUCCEEDED] = "job.succeeded", [JOB_FAILED] = "job.failed",
    [JOB_CANCELLED] = "job.cancelled",
};

const char *events_type_for_transition(int from, int to, const char *reason) {
    if (to < 0 || to >= JOB_STATE_COUNT) return NULL;
    if (to == JOB_QUEUED && (from == JOB_STARTING || from == JOB_RUNNING)) {
        if (reason && !strncmp(reason, "PREEMPTED", 9)) return "job.preempted";
        return "job.retrying";
    }
    if (to == JOB_QUEUED && from >= 0) return NULL; /* not a transition the table allows */
    return type_by_state[to];
}

/* The job's tenant and out_dir (out_dir may be NULL when not wanted). */
static int job_owner(struct store_tx *tx, const char *job_id, char *tenant, size_t tlen,
                     char **out_dir) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT tenant_id, out_dir FROM jobs WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(tenant, tlen, "%s", (const char *)sqlite3_column_text(st, 0));
        if (out_dir) {
            const unsigned char *d = sqlite3_column_text(st, 1);
            *out_dir = d ? strdup((const char *)d) : NULL;
        }
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

int64_t events_emit(struct store_tx *tx, const char *type, const char *job_id,
                    const char *tenant_id, json_t *data) {
    char tenant[32];
    if (!tenant_id) {
        int rc = job_owner(tx, job_id, tenant, sizeof tenant, NULL);
        if (rc) return rc;
        tenant_id = tenant;
    }
    json_t *d = data ? json_deep_copy(data) : json_object();
    if (!json_is_object(d)) {
        json_decref(d);
        d = json_object();
    }
    json_object_set_new(d, "job_id", json_string(job_id));
    char *text = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(d);
    if (!text) return STORE_ERR;
    int64_t now = store_now_ms(), seq = STORE_ERR;
    sqlite3_stmt *st = store_stmt(
        tx, "INSERT INTO events(type, job_id, tenant_id, created_at, data) VALUES (?,?,?,?,?)");
    if (!st) goto out;
    sqlite3_bind_text(st, 1, type, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, now);
    sqlite3_bind_text(st, 5, text, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        log_error("events: insert: %s", sqlite3_errmsg(store_tx_db(tx)));
        goto out;
    }
    int64_t new_seq = sqlite3_last_insert_rowid(store_tx_db(tx));
    /* The outbox: one row per subscribed webhook, in this same transaction,
     * so a committed event always has its deliveries (webhooks.h). */
    st = store_stmt(tx, "INSERT OR IGNORE INTO webhook_deliveries(webhook_id, event_seq, state, "
                        "next_at, created_at) SELECT w.id, ?1, 'pending', ?2, ?2 FROM webhooks w "
                        "WHERE w.tenant_id = ?3 AND w.deleted_at IS NULL AND EXISTS (SELECT 1 "
                        "FROM json_each(w.events) e WHERE e.value = ?4 OR e.value = '*')");
    if (!st) goto out;
    sqlite3_bind_int64(st, 1, new_seq);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_text(st, 3, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, type, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        log_error("events: outbox insert: %s", sqlite3_errmsg(store_tx_db(tx)));
        goto out;
    }
    seq = new_seq;
out:
    free(text);
    return seq;
}

/* 1 when job_id already has an event of `type` whose data.key equals value. */
static int already(struct store_tx *tx, const char *job_id, const char *type, const char *key,
                   sqlite3_int64 ival, const char *sval) {
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT 1 FROM events WHERE job_id = ?1 AND type = ?2 AND json_extract(data, '$.%s')"
             " = ?3 LIMIT 1",
             key);
    sqlite3_stmt *st = store_stmt(tx, sql);
    if (!st) return -1;
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, type, -1, SQLITE_STATIC);
    if (sval)
        sqlite3_bind_text(st, 3, sval, -1, SQLITE_STATIC);
    else
        sqlite3_bind_int64(st, 3, ival);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_ROW;
}

/* path relative to out_dir when it lies under it, else as given. */
static const char *relative_to(const char *path, const char *root) {
    size_t n = root ? strlen(root) : 0;
    if (n && path && !strncmp(path, root, n) && path[n] == '/') return path + n + 1;
    return path ? path : "";
}

int events_checkpoint_saved(struct store_tx *tx, const char *job_id, int attempt, long step,
                            const char *path) {
    char tenant[32];
    char *out_dir = NULL;
    int rc = job_owner(tx, job_id, tenant, sizeof tenant, &out_dir);
    if (rc) return rc;
    int dup = already(tx, job_id, "checkpoint.saved", "step", step, NULL);
    int64_t seq = 0;
    if (dup < 0) {
        seq = STORE_ERR;
    } else if (!dup) {
        json_t *d = json_pack("{s:I, s:i, s:s}", "step", (json_int_t)step, "attempt", attempt,
                              "path", relative_to(path, out_dir));
        seq = events_emit(tx, "checkpoint.saved", job_id, tenant, d);
        json_decref(d);
    }
    free(out_dir);
    return seq < 0 ? (int)seq : STORE_OK;
}

int events_export_ready(struct store_tx *tx, const char *job_id, const char *kind,
                        const char *path) {
    char tenant[32];
    char *out_dir = NULL;
    int rc = job_owner(tx, job_id, tenant, sizeof tenant, &out_dir);
    if (rc) return rc;
    int dup = already(tx, job_id, "export.ready", "kind", 0, kind);
    int64_t seq = 0;
    if (dup < 0) {
        seq = STORE_ERR;
    } else if (!dup) {
        json_t *d = json_pack("{s:s, s:s}", "kind", kind, "path", relative_to(path, out_dir));
        seq = events_emit(tx, "export.ready", job_id, tenant, d);
        json_decref(d);
    }
    free(out_dir);
    return seq < 0 ? (int)seq : STORE_OK;
}

/* ---- the ring ---- */

json_t *events_row_item(sqlite3_stmt *st) {
    json_t *data = json_loads((const char *)sqlite3_column_text(st, 4), 0, NULL);
    return json_pack("{s:I, s:s, s:s, s:o, s:o}", "seq", (json_int_t)sqlite3_column_int64(st, 0),
                     "type", (const char *)sqlite3_column_text(st, 1), "job_id",
                     (const char *)sqlite3_column_text(st, 2), "created_at",
                     store_time_json(sqlite3_column_int64(st, 3)), "data",
                     data ? data : json_object());
}

static void entry_clear(struct events_entry *e) {
    free(e->item);
    free(e->frame);
    memset(e, 0, sizeof *e);
}

/* Formats one row (seq, type, job_id, created_at, data, tenant_id) into e. */
static int entry_fill(struct events_entry *e, sqlite3_stmt *st) {
    memset(e, 0, sizeof *e);
    json_t *it = events_row_item(st);
    char *item = it ? json_dumps(it, JSON_COMPACT) : NULL;
    json_decref(it);
    if (!item) return -1;
    e->seq = sqlite3_column_int64(st, 0);
    snprintf(e->type, sizeof e->type, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(e->job, sizeof e->job, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(e->tenant, sizeof e->tenant, "%s", (const char *)sqlite3_column_text(st, 5));
    e->item = item;
    e->item_len = strlen(item);
    /* Compact JSON has no newline, so the item is one "data:" line. */
    size_t cap = e->item_len + 128;
    e->frame = malloc(cap);
    if (!e->frame) {
        entry_clear(e);
        return -1;
    }
    e->frame_len = (size_t)snprintf(e->frame, cap, "id: %lld\nevent: %s\ndata: %s\n\n",
                                    (long long)e->seq, e->type, item);
    return 0;
}

/* Writer lock held: appends e (taken over), evicting the oldest when full. */
static void ring_push(struct events *ev, struct events_entry *e) {
    if (ev->count == ev->cap) {
        struct events_entry *old = &ev->ring[ev->head];
        ev->floor = old->seq;
        entry_clear(old);
        ev->head = (ev->head + 1) % ev->cap;
        ev->count--;
    }
    ev->ring[(ev->head + ev->count) % ev->cap] = *e;
    ev->count++;
}

static int64_t ring_newest(const struct events *ev) {
    return ev->count ? ev->ring[(ev->head + ev->count - 1) % ev->cap].seq : ev->floor;
}

static int entry_matches(const struct events_entry *e, const struct events_filter *f) {
    return (!f->tenant[0] || !strcmp(f->tenant, e->tenant)) &&
           (!f->job[0] || !strcmp(f->job, e->job)) && (!f->type[0] || !strcmp(f->type, e->type));
}

int events_ring_read(struct events *ev, int64_t since, const struct events_filter *f, int max,
                     events_visit fn, void *arg, int64_t *scanned) {
    pthread_rwlock_rdlock(&ev->ring_mu);
    if (since < ev->floor) {
        pthread_rwlock_unlock(&ev->ring_mu);
        return 0;
    }
    /* Binary search for the first entry after `since` (seqs ascend). */
    int lo = 0, hi = ev->count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ev->ring[(ev->head + mid) % ev->cap].seq <= since)
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t upto = since > ring_newest(ev) ? since : ring_newest(ev);
    int taken = 0;
    for (int i = lo; i < ev->count; i++) {
        const struct events_entry *e = &ev->ring[(ev->head + i) % ev->cap];
        if (!entry_matches(e, f)) continue;
        if (taken == max || fn(arg, e) != 0) {
            upto = e->seq - 1; /* this one was not taken */
            break;
        }
        taken++;
    }
    pthread_rwlock_unlock(&ev->ring_mu);
    *scanned = upto;
    return 1;
}

int events_ring_covers(struct events *ev, int64_t since) {
    pthread_rwlock_rdlock(&ev->ring_mu);
    int ok = since >= ev->floor;
    pthread_rwlock_unlock(&ev->ring_mu);
    return ok;
}

struct ring_load {
    struct events *ev;
    int64_t after; /* rows with seq > after */
    int newest;    /* start-up: the newest cap rows */
};

#define ROW_COLS "seq, type, job_id, created_at, data, tenant_id"

/* Reads rows after l->after into the ring (writer lock held by the caller). */
static int ring_load_rows(struct store_tx *tx, void *arg) {
    struct ring_load *l = arg;
    struct events *ev = l->ev;
    sqlite3_stmt *st = store_stmt(
        tx, l->newest ? "SELECT * FROM (SELECT " ROW_COLS " FROM events ORDER BY seq DESC LIMIT ?2)"
                        " WHERE seq > ?1 ORDER BY seq"
                      : "SELECT " ROW_COLS " FROM events WHERE seq > ?1 ORDER BY seq");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, l->after);
    if (l->newest) sqlite3_bind_int(st, 2, ev->cap);
    int rc, n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct events_entry e;
        if (entry_fill(&e, st) != 0) {
            rc = SQLITE_NOMEM;
            break;
        }
        if (l->newest && n == 0) ev->floor = e.seq - 1;
        ring_push(ev, &e);
        n++;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* ---- wake-ups ---- */

static int read_max_seq(struct store_tx *tx, void *arg) {
    int64_t *out = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT COALESCE(MAX(seq), 0) FROM events");
    if (!st) return STORE_ERR;
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : STORE_ERR;
}

/* Writer thread, after each commit: one query for the rows the commit
 * added (an indexed range on the primary key; none for most commits), into
 * the ring, then the wake-up. A failed read leaves the ring as it was and is
 * retried at the next commit (the rows are found by seq). */
static int on_commit(struct store_tx *tx, void *arg) {
    struct events *ev = arg;
    pthread_rwlock_wrlock(&ev->ring_mu);
    struct ring_load l = {ev, ring_newest(ev), 0};
    int rc = ring_load_rows(tx, &l);
    int64_t newest = ring_newest(ev);
    pthread_rwlock_unlock(&ev->ring_mu);
    if (rc != STORE_OK) log_warn("events: reading new events after a commit failed");
    if (newest > atomic_load(&ev->last_seq)) {
        atomic_store(&ev->last_seq, newest);
        http_notify_signal(&ev->notify);
        if (ev->fanout) events_fanout_kick(ev->fanout);
    }
    return STORE_OK;
}

static void ring_free(struct events *ev) {
    for (int i = 0; ev->ring && i < ev->count; i++)
        entry_clear(&ev->ring[(ev->head + i) % ev->cap]);
    free(ev->ring);
    pthread_rwlock_destroy(&ev->ring_mu);
}

int events_start(struct loomd *ld) {
    struct events *ev = calloc(1, sizeof *ev);
    if (!ev) return -1;
    http_notify_init(&ev->notify);
    /* Writer preference: the commit hook must not wait behind a steady
     * stream of readers (a thousand streams take the read lock per event). */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&ev->ring_mu, &ra);
    pthread_rwlockattr_destroy(&ra);
    ev->cap = ld->cfg.events_ring > 0 ? (int)ld->cfg.events_ring : 4096;
    ev->ring = calloc((size_t)ev->cap, sizeof *ev->ring);
    int64_t seq = 0;
    struct ring_load l = {ev, 0, 1};
    if (!ev->ring || store_read(ld->store, read_max_seq, &seq) != STORE_OK ||
        store_read(ld->store, ring_load_rows, &l) != STORE_OK) {
        ring_free(ev);
        http_notify_destroy(&ev->notify);
        free(ev);
        return -1;
    }
    /* Fewer rows than the ring holds: it has every event there is (seqs are
     * never reused, rows never deleted). Else the floor is just below the
     * oldest loaded row (ring_load_rows). */
    if (ev->count < ev->cap) ev->floor = 0;
    if (ev->count == 0) ev->floor = seq;
    atomic_store(&ev->last_seq, ring_newest(ev));
    ld->events = ev;
    ev->fanout = events_fanout_start(ld);
    if (!ev->fanout)
        log_warn("events: the stream fan-out thread did not start; streams keep a thread each");
    store_set_commit_hook(ld->store, on_commit, ev);
    return 0;
}

void events_stop(struct loomd *ld) {
    struct events *ev = ld->events;
    if (!ev) return;
    store_set_commit_hook(ld->store, NULL, NULL);
    events_fanout_stop(ev->fanout);
    ev->fanout = NULL;
    ring_free(ev);
    http_notify_destroy(&ev->notify);
    free(ev);
    ld->events = NULL;
}
