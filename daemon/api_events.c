/* GET /v1/events: the event stream as pages (since/next cursor), long-poll
 * (wait=SECONDS) and Server-Sent Events (Accept: text/event-stream, resume
 * with Last-Event-ID, heartbeat comments). A tenant token sees its own jobs'
 * events only; the admin token sees every tenant's (?tenant= narrows). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

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
                      "checkpoint.saved, export.ready, artifacts.expired, job.diagnosis)",
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

/* ---------------- the fan-out thread ---------------- */

/* One adopted stream. The loop thread alone touches it once it is in
 * fo->subs; the connection thread sleeps until release. */
struct fan_sub {
    struct sse *s;
    int fd, chunked;
    struct http_adopted *a;
    char *out; /* framed bytes being written */
    size_t olen, ooff, ocap;
    int armed; /* EPOLLOUT is on: the socket was full */
    int dead;
    int64_t blocked_ms;   /* when the socket filled up (0: not full) */
    struct fan_sub *next; /* fo->incoming */
};

/* One fan-out thread and the streams it holds (--events-fanout-threads of
 * them; a new stream goes to the next one in turn). */
struct fan_worker {
    struct events_fanout *top;
    struct loomd *ld;
    pthread_t thread;
    int epfd, evfd, started;
    pthread_mutex_t mu;
    struct fan_sub *incoming; /* adopted, not yet seen by the loop (mu) */
    struct fan_sub **subs;    /* loop thread only */
    size_t n, cap;
};

#define FAN_WORKERS_MAX 16

struct events_fanout {
    struct loomd *ld;
    _Atomic int stop;
    _Atomic int held;      /* streams adopted and not yet released */
    _Atomic unsigned next; /* the worker the next stream goes to */
    int nw;
    struct fan_worker w[FAN_WORKERS_MAX];
};

#define FAN_EVENTS  256
#define FAN_ROUNDS  4   /* batches of SSE_BATCH per stream per pass (fairness) */
#define FAN_TICK_MS 200 /* heartbeats, shutdown and slow clients are checked this often */

static void fan_kick(struct fan_worker *w) {
    uint64_t one = 1;
    ssize_t n = write(w->evfd, &one, sizeof one);
    (void)n; /* a full counter (EAGAIN) is a pending wake-up already */
}

void events_fanout_kick(struct events_fanout *fo) {
    for (int i = 0; i < fo->nw; i++)
        fan_kick(&fo->w[i]);
}

int events_fanout_held(struct events_fanout *fo) {
    return fo ? atomic_load(&fo->held) : 0;
}

static void fan_release(struct fan_worker *fo, struct fan_sub *f, int how) {
    atomic_fetch_sub(&fo->top->held, 1);
    epoll_ctl(fo->epfd, EPOLL_CTL_DEL, f->fd, NULL);
    free(f->out);
    struct http_adopted *a = f->a;
    free(f);
    http_adopt_release(a, how); /* last: the connection thread frees the sse */
}

static int fan_arm(struct fan_worker *fo, struct fan_sub *f, int out) {
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0), .data.ptr = f};
    f->armed = out;
    return epoll_ctl(fo->epfd, EPOLL_CTL_MOD, f->fd, &e);
}

/* Writes what is pending: 1 all written, 0 the socket is full, -1 gone. */
static int fan_flush(struct fan_worker *fo, struct fan_sub *f, int64_t now) {
    while (f->ooff < f->olen) {
        ssize_t n = send(f->fd, f->out + f->ooff, f->olen - f->ooff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            f->ooff += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!f->blocked_ms) f->blocked_ms = now;
            if (!f->armed && fan_arm(fo, f, 1) != 0) return -1;
            return 0;
        }
        return -1;
    }
    f->olen = f->ooff = 0;
    f->blocked_ms = 0;
    if (f->armed && fan_arm(fo, f, 0) != 0) return -1;
    return 1;
}

/* Moves the stream's formatted bytes (s->pend) into f->out as one chunk. */
static int fan_frame(struct fan_sub *f) {
    struct sse *s = f->s;
    size_t n = s->plen - s->poff;
    if (!n) return 0;
    if (buf_grow_array(&f->out, &f->ocap, n + 24, 1, 4096) != 0) return -1;
    size_t h = f->chunked ? (size_t)snprintf(f->out, 24, "%zx\r\n", n) : 0;
    memcpy(f->out + h, s->pend + s->poff, n);
    if (f->chunked) memcpy(f->out + h + n, "\r\n", 2);
    f->olen = h + n + (f->chunked ? 2 : 0);
    f->ooff = 0;
    s->plen = s->poff = 0;
    return 0;
}

/* One stream's turn in a pass: what is pending, then new events (a few
 * batches at most, so one stream far behind does not hold up the rest),
 * then a heartbeat when it has been quiet. -1: drop it. */
static int fan_pump(struct fan_worker *fo, struct fan_sub *f, int64_t last, int64_t now) {
    struct sse *s = f->s;
    int r = fan_flush(fo, f, now);
    if (r <= 0) {
        /* A client that reads nothing for conn-timeout is let go (it can
         * resume with Last-Event-ID). */
        if (r == 0 && now - f->blocked_ms > fo->ld->cfg.conn_timeout * 1000) return -1;
        return r;
    }
    for (int round = 0; round < FAN_ROUNDS && last > s->cursor; round++) {
        if (sse_fill(s) != 0 || fan_frame(f) != 0) return -1;
        if (!f->olen) continue; /* nothing matched */
        s->last_write_ms = now;
        if ((r = fan_flush(fo, f, now)) <= 0) return r;
    }
    if (now - s->last_write_ms >= s->heartbeat_ms) {
        s->last_write_ms = now;
        if (sse_append(s, ": heartbeat\n\n", 13) != 0 || fan_frame(f) != 0) return -1;
        if ((r = fan_flush(fo, f, now)) < 0) return r;
    }
    return 0;
}

/* 1 when a readable stream socket says its client has gone (an SSE client
 * sends nothing after its request; stray bytes are read and dropped). */
static int fan_gone(struct fan_sub *f, uint32_t events) {
    if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) return 1;
    char junk[512];
    for (;;) {
        ssize_t n = recv(f->fd, junk, sizeof junk, MSG_DONTWAIT);
        if (n > 0) continue;
        if (n == 0) return 1;
        return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    }
}

static void fan_take_incoming(struct fan_worker *fo) {
    pthread_mutex_lock(&fo->mu);
    struct fan_sub *in = fo->incoming;
    fo->incoming = NULL;
    pthread_mutex_unlock(&fo->mu);
    while (in) {
        struct fan_sub *f = in;
        in = in->next;
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = f};
        if (buf_grow_array(&fo->subs, &fo->cap, fo->n + 1, sizeof *fo->subs, 64) != 0 ||
            epoll_ctl(fo->epfd, EPOLL_CTL_ADD, f->fd, &e) != 0) {
            atomic_fetch_sub(&fo->top->held, 1);
            free(f->out);
            http_adopt_release(f->a, HTTP_ADOPT_CLOSE);
            free(f);
            continue;
        }
        fo->subs[fo->n++] = f;
    }
}

static void fan_release_all(struct fan_worker *fo) {
    fan_take_incoming(fo);
    for (size_t i = 0; i < fo->n; i++)
        fan_release(fo, fo->subs[i],
                    fo->subs[i]->ooff < fo->subs[i]->olen ? HTTP_ADOPT_CLOSE : HTTP_ADOPT_END);
    fo->n = 0;
}

static void *fan_loop(void *arg) {
    struct fan_worker *fo = arg;
    struct events *ev = fo->ld->events;
    struct epoll_event evs[FAN_EVENTS];
    int64_t done_seq = -1, last_tick = 0, last_pass = 0;
    int64_t gap = fo->ld->cfg.events_fanout_gap_ms;
    int wait_ms = FAN_TICK_MS;
    while (!atomic_load(&fo->top->stop)) {
        int k = epoll_wait(fo->epfd, evs, FAN_EVENTS, wait_ms);
        wait_ms = FAN_TICK_MS;
        for (int i = 0; i < k; i++) {
            struct fan_sub *f = evs[i].data.ptr;
            if (!f) {
                uint64_t v;
                ssize_t r = read(fo->evfd, &v, sizeof v);
                (void)r;
                continue;
            }
            if ((evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) &&
                fan_gone(f, evs[i].events))
                f->dead = 1;
        }
        fan_take_incoming(fo);
        /* Only while streams are held: their connection threads keep
         * http_stop from freeing the server until they are released. */
        if (fo->n && http_stopping(fo->ld->http)) {
            fan_release_all(fo);
            continue;
        }
        /* A pass over every stream when events arrived, a socket drained or
         * a client left, and at each tick (heartbeats, slow clients). */
        int64_t now = clock_mono_ms(), last = atomic_load(&ev->last_seq);
        if (k == 0 && last == done_seq && now - last_tick < FAN_TICK_MS) continue;
        /* Coalescing: within `gap` of the previous pass, wait for the gap's
         * end, so that a burst of commits costs each stream one send per gap
         * rather than one per commit (at 500 events/s to 1,000 streams the
         * sends were most of loomd's CPU). The first event after a quiet
         * spell goes out at once. Nothing is lost meanwhile: the pass after
         * the gap sees last_seq, the sockets' state and the incoming list. */
        if (gap > 0 && now - last_pass < gap) {
            wait_ms = (int)(gap - (now - last_pass));
            continue;
        }
        last_pass = now;
        last_tick = now;
        done_seq = last;
        for (size_t i = 0; i < fo->n;) {
            struct fan_sub *f = fo->subs[i];
            if (f->dead || fan_pump(fo, f, last, now) < 0) {
                fo->subs[i] = fo->subs[--fo->n];
                fan_release(fo, f, HTTP_ADOPT_CLOSE);
                continue;
            }
            i++;
        }
    }
    fan_release_all(fo);
    return NULL;
}

/* http_stream_adopt for event streams (connection thread). A stream whose
 * cursor is older than the ring keeps its own thread until it has caught
 * up from the store, so store reads never hold up the fan-out. */
static int sse_adopt(void *ctx, int fd, int chunked, struct http_adopted *a) {
    struct sse *s = ctx;
    struct events_fanout *fo = s->ld->events->fanout;
    if (!fo || atomic_load(&fo->stop)) return -1;
    if (!events_ring_covers(s->ld->events, s->cursor)) return 1;
    struct fan_sub *f = calloc(1, sizeof *f);
    if (!f) return 1;
    f->s = s;
    f->fd = fd;
    f->chunked = chunked;
    f->a = a;
    /* Bytes the layer has not been handed yet go first. */
    if (fan_frame(f) != 0) {
        free(f);
        return 1;
    }
    atomic_fetch_add(&fo->held, 1);
    struct fan_worker *w = &fo->w[atomic_fetch_add(&fo->next, 1) % (unsigned)fo->nw];
    pthread_mutex_lock(&w->mu);
    f->next = w->incoming;
    w->incoming = f;
    pthread_mutex_unlock(&w->mu);
    fan_kick(w);
    return 0;
}

static void fan_worker_free(struct fan_worker *w) {
    if (w->started) pthread_join(w->thread, NULL);
    if (w->epfd >= 0) close(w->epfd);
    if (w->evfd >= 0) close(w->evfd);
    pthread_mutex_destroy(&w->mu);
    free(w->subs);
}

struct events_fanout *events_fanout_start(struct loomd *ld) {
    struct events_fanout *fo = calloc(1, sizeof *fo);
    if (!fo) return NULL;
    fo->ld = ld;
    long nw = ld->cfg.events_fanout_threads;
    fo->nw = nw < 1 ? 1 : nw > FAN_WORKERS_MAX ? FAN_WORKERS_MAX : (int)nw;
    int ok = 1, made = 0;
    for (; made < fo->nw && ok; made++) {
        struct fan_worker *w = &fo->w[made];
        w->top = fo;
        w->ld = ld;
        pthread_mutex_init(&w->mu, NULL);
        w->epfd = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
        ok = w->epfd >= 0 && w->evfd >= 0 && epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->evfd, &e) == 0 &&
             pthread_create(&w->thread, NULL, fan_loop, w) == 0;
        w->started = ok;
    }
    if (!ok) {
        atomic_store(&fo->stop, 1);
        fo->nw = made;
        events_fanout_kick(fo);
        for (int i = 0; i < made; i++)
            fan_worker_free(&fo->w[i]);
        free(fo);
        return NULL;
    }
    return fo;
}

void events_fanout_stop(struct events_fanout *fo) {
    if (!fo) return;
    atomic_store(&fo->stop, 1);
    events_fanout_kick(fo);
    for (int i = 0; i < fo->nw; i++)
        fan_worker_free(&fo->w[i]);
    free(fo);
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
    return http_reply_stream_adoptable(req, 200, "text/event-stream", sse_read, sse_adopt, s,
                                       sse_free);
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
