/* GET /v1/events: the event stream as pages (since/next cursor), long-poll
 * (wait=SECONDS) and Server-Sent Events (Accept: text/event-stream, resume
 * with Last-Event-ID, heartbeat comments). A tenant token sees its own jobs'
 * events only; the admin token sees every tenant's (?tenant= narrows). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"
#include "common/clock.h"
#include "daemon/events.h"
#include "daemon/handlers.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#define PAGE_DEFAULT 100
#define PAGE_MAX     1000
#define SSE_BATCH    100

struct query {
    const struct events_filter *f;
    int64_t since;
    int limit;
    json_t *items; /* out: array */
    int64_t last;  /* out: seq of the last item (0: none) */
};

static int run_query(struct store_tx *tx, void *arg) {
    struct query *q = arg;
    /* A handful of SQL shapes (cached by text); values are always bound. */
    char sql[384];
    int n = snprintf(sql, sizeof sql,
                     "SELECT seq, type, job_id, created_at, data FROM events WHERE seq > ?1");
    if (q->f->tenant[0]) n += snprintf(sql + n, sizeof sql - n, " AND tenant_id = ?2");
    if (q->f->job[0]) n += snprintf(sql + n, sizeof sql - n, " AND job_id = ?3");
    if (q->f->type[0]) n += snprintf(sql + n, sizeof sql - n, " AND type = ?4");
    snprintf(sql + n, sizeof sql - n, " ORDER BY seq LIMIT ?5");
    sqlite3_stmt *st = store_stmt(tx, sql);
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, q->since);
    if (q->f->tenant[0]) sqlite3_bind_text(st, 2, q->f->tenant, -1, SQLITE_STATIC);
    if (q->f->job[0]) sqlite3_bind_text(st, 3, q->f->job, -1, SQLITE_STATIC);
    if (q->f->type[0]) sqlite3_bind_text(st, 4, q->f->type, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, q->limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_array_append_new(q->items, events_row_item(st));
        q->last = sqlite3_column_int64(st, 0);
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

static int visit_item(void *arg, const struct events_entry *e) {
    struct query *q = arg;
    json_t *it = json_loadb(e->item, e->item_len, 0, NULL);
    if (!it) return -1;
    json_array_append_new(q->items, it);
    q->last = e->seq;
    return 0;
}

/* One page after q->since: from the ring when it covers the cursor, else
 * from the store. *scanned: every event <= it was considered (returned or
 * filtered out). */
static int read_page(struct loomd *ld, struct query *q, int64_t *scanned) {
    if (events_ring_read(ld->events, q->since, q->f, q->limit, visit_item, q, scanned)) return 0;
    int64_t visible = atomic_load(&ld->events->last_seq); /* committed before the query */
    if (store_read(ld->store, run_query, q) != STORE_OK) return -1;
    *scanned = q->last ? q->last : q->since;
    if ((int)json_array_size(q->items) < q->limit && visible > *scanned) *scanned = visible;
    return 0;
}

/* Strict decimal in [min, max]; 0 ok, -1 otherwise. */
static int parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

struct job_check {
    const char *tenant, *job;
};

static int check_job(struct store_tx *tx, void *arg) {
    struct job_check *c = arg;
    struct store_job j;
    int rc = store_job_get(tx, c->tenant, c->job, &j);
    if (rc == STORE_OK) store_job_clear(&j);
    return rc;
}

/* Parses and checks the query; replies with an error and returns -1. */
static int parse_filter(struct http_req *req, struct events_filter *f) {
    memset(f, 0, sizeof *f);
    const char *tenant = http_query(req, "tenant");
    if (!req->is_admin)
        snprintf(f->tenant, sizeof f->tenant, "%s", req->tenant_id);
    else if (tenant && *tenant)
        snprintf(f->tenant, sizeof f->tenant, "%.31s", tenant);
    const char *type = http_query(req, "type");
    if (type && *type) {
        if (!events_type_valid(type)) {
            API_ERROR(req, UNKNOWN_EVENT_TYPE,
                      "type '%.64s' is not an event type (job.queued, job.started, job.retrying, "
                      "job.preempted, job.succeeded, job.failed, job.cancelled, "
                      "checkpoint.saved, export.ready, job.diagnosis)",
                      type);
            return -1;
        }
        snprintf(f->type, sizeof f->type, "%s", type);
    }
    const char *job = http_query(req, "job");
    if (job && *job) {
        if (strlen(job) >= sizeof f->job) {
            API_ERROR(req, JOB_NOT_FOUND, "no job '%.64s'", job);
            return -1;
        }
        struct job_check c = {f->tenant[0] ? f->tenant : NULL, job};
        int rc = store_read(req->ld->store, check_job, &c);
        if (rc == STORE_NOT_FOUND) {
            API_ERROR(req, JOB_NOT_FOUND, "no job '%s'", job);
            return -1;
        }
        if (rc != STORE_OK) {
            API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
            return -1;
        }
        snprintf(f->job, sizeof f->job, "%s", job);
    }
    return 0;
}

/* ---------------- Server-Sent Events ---------------- */

struct sse {
    struct loomd *ld;
    struct events_filter f;
    int64_t cursor; /* every event <= cursor was considered (sent or filtered out) */
    uint64_t gen;
    int64_t last_write_ms;
    int heartbeat_ms;
    char *pend; /* formatted bytes not yet handed to the layer */
    size_t plen, pcap, poff;
};

static void sse_free(void *arg) {
    struct sse *s = arg;
    free(s->pend);
    free(s);
}

static int sse_append(struct sse *s, const char *text, size_t n) {
    if (buf_grow_array(&s->pend, &s->pcap, s->plen + n + 1, 1, 4096) != 0) return -1;
    memcpy(s->pend + s->plen, text, n);
    s->plen += n;
    return 0;
}

static int visit_frame(void *arg, const struct events_entry *e) {
    return sse_append(arg, e->frame, e->frame_len);
}

/* The next batch as SSE frames ("id: SEQ", "event: TYPE", "data: JSON"):
 * ready-made from the ring, or formatted from a store query when the cursor
 * is older than the ring. Advances s->cursor past everything considered. */
static int sse_fill(struct sse *s) {
    int64_t scanned;
    if (events_ring_read(s->ld->events, s->cursor, &s->f, SSE_BATCH, visit_frame, s, &scanned)) {
        s->cursor = scanned;
        return 0;
    }
    int64_t visible = atomic_load(&s->ld->events->last_seq);
    struct query q = {&s->f, s->cursor, SSE_BATCH, json_array(), 0};
    int rc = store_read(s->ld->store, run_query, &q);
    if (rc != STORE_OK) {
        json_decref(q.items);
        return -1;
    }
    size_t i;
    json_t *it;
    json_array_foreach(q.items, i, it) {
        char *data = json_dumps(it, JSON_COMPACT);
        if (!data) continue;
        char head[128];
        int hn = snprintf(head, sizeof head, "id: %lld\nevent: %s\ndata: ",
                          (long long)json_integer_value(json_object_get(it, "seq")),
                          json_string_value(json_object_get(it, "type")));
        int ok = sse_append(s, head, (size_t)hn) == 0 && sse_append(s, data, strlen(data)) == 0 &&
                 sse_append(s, "\n\n", 2) == 0;
        free(data);
        if (!ok) break;
    }
    /* A full batch may have more behind it; otherwise every event up to
     * `visible` (committed before the query) was considered. */
    if ((int)json_array_size(q.items) < SSE_BATCH && visible > q.last)
        s->cursor = visible > s->cursor ? visible : s->cursor;
    else if (q.last)
        s->cursor = q.last;
    json_decref(q.items);
    return 0;
}

static ssize_t sse_read(void *arg, char *buf, size_t max) {
    struct sse *s = arg;
    struct events *ev = s->ld->events;
    if (s->poff == s->plen) {
        s->poff = s->plen = 0;
        int64_t now = clock_mono_ms();
        int left = (int)(s->last_write_ms + s->heartbeat_ms - now);
        if (atomic_load(&ev->last_seq) <= s->cursor && left > 0) {
            /* Nothing new: sleep until a commit adds events, the heartbeat
             * is due, or loomd stops. */
            int w = http_wait(s->ld->http, &ev->notify, &s->gen, left < 1000 ? left : 1000);
            if (w < 0) return -1;
        }
        if (atomic_load(&ev->last_seq) > s->cursor && sse_fill(s) != 0) return -1;
        now = clock_mono_ms();
        if (s->plen == 0 && now - s->last_write_ms >= s->heartbeat_ms)
            sse_append(s, ": heartbeat\n\n", 13);
        if (s->plen == 0) return 0;
        s->last_write_ms = now;
    }
    size_t n = s->plen - s->poff < max ? s->plen - s->poff : max;
    memcpy(buf, s->pend + s->poff, n);
    s->poff += n;
    return (ssize_t)n;
}

static int wants_sse(struct http_req *req) {
    const char *a = http_header(req, "Accept");
    return a && strcasestr(a, "text/event-stream") != NULL;
}

static int reply_sse(struct http_req *req, const struct events_filter *f, int64_t since) {
    const char *last_id = http_header(req, "Last-Event-ID");
    if (last_id && *last_id && parse_i64(last_id, 0, INT64_MAX, &since) != 0)
        return API_ERROR(req, INVALID_LAST_EVENT_ID,
                         "Last-Event-ID '%.64s' is not a non-negative event seq", last_id);
    struct sse *s = calloc(1, sizeof *s);
    if (!s) return API_ERROR(req, INTERNAL, "out of memory");
    s->ld = req->ld;
    s->f = *f;
    s->cursor = since;
    s->gen = http_notify_gen(&req->ld->events->notify);
    s->heartbeat_ms = (int)req->ld->cfg.events_heartbeat * 1000;
    s->last_write_ms = clock_mono_ms();
    /* Tell the client how soon to reconnect; the first read sends what is
     * already there. */
    sse_append(s, "retry: 2000\n\n", 13);
    http_add_header(req, "Cache-Control", "no-cache");
    http_add_header(req, "X-Accel-Buffering", "no");
    return http_reply_stream(req, 200, "text/event-stream", sse_read, s, sse_free);
}

/* ---------------- pages and long-poll ---------------- */

int api_events_list(struct http_req *req) {
    struct events_filter f;
    int64_t since = 0, wait = 0, limit = PAGE_DEFAULT;
    const char *v = http_query(req, "since");
    if (v && parse_i64(v, 0, INT64_MAX, &since) != 0)
        return API_ERROR(req, INVALID_CURSOR, "since '%.64s' is not a non-negative event seq", v);
    v = http_query(req, "limit");
    if (v && parse_i64(v, 1, PAGE_MAX, &limit) != 0)
        return API_ERROR(req, INVALID_QUERY, "limit '%.64s' is not 1..%d", v, PAGE_MAX);
    v = http_query(req, "wait");
    if (v && parse_i64(v, 0, req->ld->cfg.longpoll_timeout, &wait) != 0)
        return API_ERROR(req, INVALID_QUERY, "wait '%.64s' is not 0..%ld seconds", v,
                         req->ld->cfg.longpoll_timeout);
    if (parse_filter(req, &f) != 0) return 0;
    if (wants_sse(req)) return reply_sse(req, &f, since);

    struct events *ev = req->ld->events;
    uint64_t gen = http_notify_gen(&ev->notify);
    int64_t deadline = clock_mono_ms() + wait * 1000;
    struct query q = {&f, since, (int)limit, NULL, 0};
    for (;;) {
        int64_t scanned = since;
        json_decref(q.items);
        q.items = json_array();
        q.last = 0;
        if (read_page(req->ld, &q, &scanned) != 0) {
            json_decref(q.items);
            return API_ERROR(req, STORE_UNAVAILABLE, "the store is unavailable; retry");
        }
        if (json_array_size(q.items) > 0) break;
        /* Nothing up to `scanned`: sleep until a later commit. */
        int stop = 0;
        while (atomic_load(&ev->last_seq) <= scanned) {
            int64_t left = deadline - clock_mono_ms();
            if (left <= 0 || http_wait(req->ld->http, &ev->notify, &gen, (int)left) < 0) {
                stop = 1;
                break;
            }
        }
        if (stop) break;
    }
    int64_t next = q.last ? q.last : since;
    return http_reply_json(req, 200,
                           json_pack("{s:o, s:I}", "items", q.items, "next", (json_int_t)next));
}
