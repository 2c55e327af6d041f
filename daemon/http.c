/* HTTP layer of loomd on libmicrohttpd (thread per connection): request
 * accumulation with a body cap, routing by table, authentication, rate
 * limiting, JSON parsing, reply helpers, streaming and long-poll waits,
 * graceful stop. See http.h for the contract and why threads per connection. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* POLLRDHUP */
#endif
#include "daemon/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/audit.h"
#include "daemon/auth.h"
#include "daemon/loomd.h"
#include "daemon/metrics.h"
#include "daemon/nodes.h"
#include "daemon/ratelimit.h"
#include "daemon/tls.h"

#define MAX_EXTRA_HEADERS 6
/* Most tenants with an open stream tracked at once (beyond: refused). */
#define STREAM_TENANTS 256
/* A stream's read callback waits at most this long before the layer checks
 * whether the client is still there. */
#define STREAM_POLL_MS 1000

struct stream_count {
    char tenant[64];
    int n;
};

struct http_server {
    struct loomd *ld;
    struct MHD_Daemon *mhd;
    int listen_fd;
    int port;
    int tls;
    long max_body;
    long conn_limit, conn_timeout_s;
    _Atomic int stopping;
    _Atomic int inflight;
    struct http_limits lim;
    _Atomic int conns;   /* open TCP connections (MHD_OPTION_NOTIFY_CONNECTION) */
    _Atomic int streams; /* open streaming replies, all tenants */
    pthread_mutex_t stream_mu;
    struct stream_count stream_by[STREAM_TENANTS];
    /* refusals by limit, and when each was last logged */
    _Atomic uint64_t refused_streams, refused_conns;
    _Atomic int64_t refused_log_ms;
    struct MHD_OptionItem opts[8];
};

/* Per-request state, allocated on the first handler call. */
struct http_conn {
    struct http_req req;
    struct MHD_Connection *mc;
    struct http_server *srv;
    double t0;
    size_t route_idx; /* http_routes_count = unmatched */
    char *path_copy;  /* req->path points here: valid until completion */
    char method_copy[16];
    char *buf;
    size_t len, cap;
    int too_large;     /* over max_body: what arrives is dropped, then 413 */
    long long claimed; /* Content-Length of a refused body, -1 when unknown */
    long long dropped; /* bytes of it read and dropped */
    int replied;       /* a response was queued */
    int status;
    struct MHD_Response *resp;
    char object_id[64]; /* "id" of a 2xx JSON reply (audit) */
    int http10;         /* the request line said HTTP/1.0 */
    int nhdr;
    char *hdr_name[MAX_EXTRA_HEADERS];
    char *hdr_value[MAX_EXTRA_HEADERS];
};

struct stream_ctx {
    struct http_server *srv;
    int fd; /* the client socket, watched for a close */
    char tenant[64];
    http_stream_read read;
    void *ctx;
    void (*free_ctx)(void *);
    http_stream_adopt adopt; /* NULL: this thread reads to the end */
    int chunked;             /* the body framing libmicrohttpd uses (adopt only) */
    unsigned calls;
    struct http_adopted adopted;
};

/* ---------------- matching ---------------- */

int http_match(const char *pattern, const char *path, char **names, char **values, int max,
               int *n) {
    *n = 0;
    const char *p = pattern, *u = path;
    while (*p && *u) {
        if (*p != '/' || *u != '/') return 0;
        p++;
        u++;
        const char *pe = strchr(p, '/'), *ue = strchr(u, '/');
        size_t pl = pe ? (size_t)(pe - p) : strlen(p), ul = ue ? (size_t)(ue - u) : strlen(u);
        if (!pe && pl >= 3 && p[0] == '{' && p[pl - 2] == '*' && p[pl - 1] == '}') {
            /* {name*} as the last segment takes the rest of the path (one or
             * more non-empty segments): artifact paths have slashes, and
             * libmicrohttpd decodes %2F before we see the URL. */
            size_t rl = strlen(u);
            if (rl == 0 || strstr(u, "//") || u[rl - 1] == '/') goto fail;
            if (names && *n < max) {
                names[*n] = strndup(p + 1, pl - 3);
                values[*n] = strndup(u, rl);
                (*n)++;
            }
            return 1;
        }
        if (pl >= 2 && p[0] == '{' && p[pl - 1] == '}') {
            if (ul == 0) goto fail;
            if (names && *n < max) {
                names[*n] = strndup(p + 1, pl - 2);
                values[*n] = strndup(u, ul);
                (*n)++;
            }
        } else if (pl != ul || strncmp(p, u, pl) != 0) {
            goto fail;
        }
        p += pl;
        u += ul;
    }
    if (*p || *u) goto fail;
    return 1;
fail:
    for (int i = 0; names && i < *n; i++) {
        free(names[i]);
        free(values[i]);
    }
    *n = 0;
    return 0;
}

/* ---------------- request accessors ---------------- */

const char *http_param(struct http_req *req, const char *name) {
    for (int i = 0; i < req->nparams; i++)
        if (strcmp(req->param_name[i], name) == 0) return req->param_value[i];
    return NULL;
}

const char *http_query(struct http_req *req, const char *name) {
    return MHD_lookup_connection_value(req->conn->mc, MHD_GET_ARGUMENT_KIND, name);
}

const char *http_header(struct http_req *req, const char *name) {
    return MHD_lookup_connection_value(req->conn->mc, MHD_HEADER_KIND, name);
}

/* ---------------- replies ---------------- */

static void finish_response(struct http_conn *c, int status, struct MHD_Response *r,
                            const char *ctype) {
    if (!r) {
        /* Allocation failure: nothing sensible can be sent; MHD closes. */
        return;
    }
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    for (int i = 0; i < c->nhdr; i++)
        MHD_add_response_header(r, c->hdr_name[i], c->hdr_value[i]);
    if (c->resp) MHD_destroy_response(c->resp);
    c->resp = r;
    c->status = status;
}

void http_add_header(struct http_req *req, const char *name, const char *value) {
    struct http_conn *c = req->conn;
    if (c->nhdr >= MAX_EXTRA_HEADERS) return;
    c->hdr_name[c->nhdr] = strdup(name);
    c->hdr_value[c->nhdr] = strdup(value);
    c->nhdr++;
}

int http_reply_text(struct http_req *req, int status, const char *content_type, const char *text,
                    size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    finish_response(req->conn, status, r, content_type);
    return 0;
}

int http_reply_json(struct http_req *req, int status, json_t *body) {
    if (!body) return http_reply_text(req, status, NULL, "", 0);
    const char *oid = json_string_value(json_object_get(body, "id"));
    if (status < 300 && oid) snprintf(req->conn->object_id, sizeof req->conn->object_id, "%s", oid);
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!s) return http_reply_text(req, 500, "application/json", "{}", 2);
    size_t n = strlen(s);
    /* Newline-terminated so curl output ends cleanly in a shell. */
    char *t = realloc(s, n + 2);
    if (t) {
        s = t;
        s[n++] = '\n';
        s[n] = 0;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!r) free(s);
    finish_response(req->conn, status, r, "application/json");
    return 0;
}

/* Messages quote client input (paths, ids, query values); JSON strings must
 * be valid UTF-8, so invalid bytes become '?' (and a cut multi-byte tail). */
static void utf8_sanitize(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80             ? 1
                : (*p & 0xE0) == 0xC0 ? 2
                : (*p & 0xF0) == 0xE0 ? 3
                : (*p & 0xF8) == 0xF0 ? 4
                                      : 0;
        int ok = n > 0;
        for (int i = 1; ok && i < n; i++)
            ok = (p[i] & 0xC0) == 0x80;
        if (ok && n == 2 && *p < 0xC2) ok = 0; /* overlong */
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

static int verror(struct http_req *req, int status, const char *code, const char *field,
                  const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    utf8_sanitize(msg);
    json_t *e = json_pack("{s:s, s:s}", "code", code, "message", msg);
    if (field) {
        char f[256];
        snprintf(f, sizeof f, "%s", field);
        utf8_sanitize(f);
        json_object_set_new(e, "field", json_string(f));
    }
    return http_reply_json(req, status, json_pack("{s:o}", "error", e));
}

int http_error(struct http_req *req, int status, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = verror(req, status, code, NULL, fmt, ap);
    va_end(ap);
    return rc;
}

int http_error_field(struct http_req *req, int status, const char *code, const char *field,
                     const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = verror(req, status, code, field, fmt, ap);
    va_end(ap);
    return rc;
}

static void futex_wake_all(_Atomic uint32_t *w);
static void futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *rel);

/* 1 when the client closed its end (FIN or RST) or the socket failed. A
 * follow stream's client sends nothing after its request, so readable with
 * zero bytes to peek means it has gone. Done here because libmicrohttpd
 * (thread per connection) only learns of a close when a write fails, and a
 * quiet log gives it nothing to write: the socket would sit in CLOSE_WAIT. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return 1;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Never hands 0 to libmicrohttpd (which would retry at once, a busy loop):
 * waits in slices of at most STREAM_POLL_MS (the read callback's own wait),
 * checking between slices that the client is still there. */
static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream_ctx *s = cls;
    /* From the second call on, everything handed to libmicrohttpd before has
     * been sent (it asks for more only once its write buffer is empty), so
     * the socket is at a chunk boundary and another thread may take it. */
    if (s->adopt && s->calls++ > 0 && !atomic_load(&s->srv->stopping)) {
        int r = s->adopt(s->ctx, s->fd, s->chunked, &s->adopted);
        if (r == 0) {
            uint32_t how;
            while ((how = atomic_load(&s->adopted.how)) == HTTP_ADOPT_HELD) {
                struct timespec rel = {1, 0};
                futex_wait(&s->adopted.how, HTTP_ADOPT_HELD, &rel);
            }
            return how == HTTP_ADOPT_END ? MHD_CONTENT_READER_END_OF_STREAM
                                         : MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (r < 0) s->adopt = NULL;
    }
    for (;;) {
        if (atomic_load(&s->srv->stopping)) return MHD_CONTENT_READER_END_OF_STREAM;
        ssize_t n = s->read(s->ctx, buf, max);
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n > 0) return n;
        /* Only after a quiet slice: while data flows, a gone client makes
         * the write fail, and a poll per chunk would be one more system
         * call per event for every stream. */
        if (peer_gone(s->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static int *stream_slot(struct http_server *srv, const char *tenant, int add) {
    int free_i = -1;
    for (int i = 0; i < STREAM_TENANTS; i++) {
        if (srv->stream_by[i].n > 0 && strcmp(srv->stream_by[i].tenant, tenant) == 0)
            return &srv->stream_by[i].n;
        if (free_i < 0 && srv->stream_by[i].n == 0) free_i = i;
    }
    if (!add || free_i < 0) return NULL;
    snprintf(srv->stream_by[free_i].tenant, sizeof srv->stream_by[free_i].tenant, "%s", tenant);
    return &srv->stream_by[free_i].n;
}

static void stream_free(void *cls) {
    struct stream_ctx *s = cls;
    if (s->free_ctx) s->free_ctx(s->ctx);
    pthread_mutex_lock(&s->srv->stream_mu);
    int *n = stream_slot(s->srv, s->tenant, 0);
    if (n && *n > 0) (*n)--;
    pthread_mutex_unlock(&s->srv->stream_mu);
    atomic_fetch_sub(&s->srv->streams, 1);
    free(s);
}

/* Logs a refusal by a limit at most once per 10 s (with the count since),
 * so a flood is visible without filling the log. */
static void log_refusal(struct http_server *srv, const char *what) {
    int64_t now = clock_mono_ms(), last = atomic_load(&srv->refused_log_ms);
    if (last && now - last < 10000) return;
    if (!atomic_compare_exchange_strong(&srv->refused_log_ms, &last, now)) return;
    log_warn("http: refused %s (totals: %llu streams over a limit, %llu connections over "
             "conn-limit; open connections %d, streams %d)",
             what, (unsigned long long)atomic_load(&srv->refused_streams),
             (unsigned long long)atomic_load(&srv->refused_conns), atomic_load(&srv->conns),
             atomic_load(&srv->streams));
}

/* Takes a stream place for the request's tenant; on refusal replies 429. */
static int stream_admit(struct http_req *req, char *tenant, size_t tlen) {
    struct http_server *srv = req->conn->srv;
    snprintf(tenant, tlen, "%s", req->is_admin || !req->tenant_id[0] ? "(admin)" : req->tenant_id);
    enum { ADMIT_OK, ADMIT_TOTAL, ADMIT_TENANT } why = ADMIT_OK;
    pthread_mutex_lock(&srv->stream_mu);
    int *n = stream_slot(srv, tenant, 1);
    if (atomic_load(&srv->streams) >= srv->lim.stream_total) {
        why = ADMIT_TOTAL;
    } else if (!n || *n >= srv->lim.stream_per_tenant) {
        why = ADMIT_TENANT;
    } else {
        (*n)++;
        atomic_fetch_add(&srv->streams, 1);
    }
    pthread_mutex_unlock(&srv->stream_mu);
    if (why == ADMIT_OK) return 0;
    atomic_fetch_add(&srv->refused_streams, 1);
    long limit = why == ADMIT_TOTAL ? srv->lim.stream_total : srv->lim.stream_per_tenant;
    char what[160];
    snprintf(what, sizeof what, "a stream of tenant %s (%s, limit %ld)", tenant,
             why == ADMIT_TOTAL ? "stream-limit" : "tenant-streams", limit);
    log_refusal(srv, what);
    http_add_header(req, "Retry-After", "5");
    if (why == ADMIT_TOTAL)
        http_error(req, 429, "TOO_MANY_STREAMS",
                   "loomd holds its most open streams (%ld, stream-limit)", limit);
    else
        http_error(req, 429, "TENANT_STREAM_LIMIT",
                   "tenant %s holds its most open streams (%ld, tenant-streams)", tenant, limit);
    return -1;
}

static int reply_stream(struct http_req *req, int status, const char *content_type,
                        http_stream_read read, http_stream_adopt adopt, void *ctx,
                        void (*free_ctx)(void *));

int http_reply_stream(struct http_req *req, int status, const char *content_type,
                      http_stream_read read, void *ctx, void (*free_ctx)(void *)) {
    return reply_stream(req, status, content_type, read, NULL, ctx, free_ctx);
}

int http_reply_stream_adoptable(struct http_req *req, int status, const char *content_type,
                                http_stream_read read, http_stream_adopt adopt, void *ctx,
                                void (*free_ctx)(void *)) {
    return reply_stream(req, status, content_type, read, adopt, ctx, free_ctx);
}

void http_adopt_release(struct http_adopted *a, int how) {
    atomic_store(&a->how, (uint32_t)how);
    futex_wake_all(&a->how);
}

/* The body framing libmicrohttpd gives a reply of unknown size: raw to an
 * HTTP/1.0 client (closed at the end), chunked to HTTP/1.1; -1 where it is
 * not certain (an HTTP/1.1 client asking to close) or the socket is not
 * plain (TLS). */
static int stream_framing(struct http_conn *c) {
    if (c->srv->tls) return -1;
    if (c->http10) return 0;
    const char *conn = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Connection");
    if (conn && strcasestr(conn, "close")) return -1;
    return strcmp(c->req.method, "HEAD") ? 1 : -1;
}

static int reply_stream(struct http_req *req, int status, const char *content_type,
                        http_stream_read read, http_stream_adopt adopt, void *ctx,
                        void (*free_ctx)(void *)) {
    char tenant[64];
    if (stream_admit(req, tenant, sizeof tenant) != 0) {
        if (free_ctx) free_ctx(ctx);
        return 0;
    }
    struct stream_ctx *s = calloc(1, sizeof *s);
    if (!s) {
        if (free_ctx) free_ctx(ctx);
        struct http_server *srv = req->conn->srv;
        pthread_mutex_lock(&srv->stream_mu);
        int *n = stream_slot(srv, tenant, 0);
        if (n && *n > 0) (*n)--;
        pthread_mutex_unlock(&srv->stream_mu);
        atomic_fetch_sub(&srv->streams, 1);
        return http_error(req, 500, "INTERNAL", "out of memory");
    }
    s->srv = req->conn->srv;
    snprintf(s->tenant, sizeof s->tenant, "%s", tenant);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    s->read = read;
    s->ctx = ctx;
    s->free_ctx = free_ctx;
    s->chunked = stream_framing(req->conn);
    s->adopt = s->fd >= 0 && s->chunked >= 0 ? adopt : NULL;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_cb, s, stream_free);
    if (!r) {
        stream_free(s);
        return http_error(req, 500, "INTERNAL", "out of memory");
    }
    finish_response(req->conn, status, r, content_type);
    return 0;
}

int http_reply_fd(struct http_req *req, int status, const char *content_type, int fd,
                  uint64_t offset, uint64_t len) {
    struct MHD_Response *r = MHD_create_response_from_fd_at_offset64(len, fd, offset);
    if (!r) {
        close(fd);
        return http_error(req, 500, "INTERNAL", "out of memory");
    }
    finish_response(req->conn, status, r, content_type);
    return 0;
}

/* ---------------- notify / long-poll ---------------- */

/* The wake-up is a futex on the generation word, not a mutex and condition
 * variable: pthread_cond_broadcast wakes every waiter only for each of them
 * to re-take the mutex in turn, and with a thousand event-stream threads on
 * one notify that convoy was most of the fan-out's time (perf: lll_lock_wait
 * and lll_lock_wake). A futex wake lets all of them run with nothing shared
 * to take; they then read what changed under their module's own locks. */
static void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *w == val, at most rel; a changed value, a signal or a
 * spurious wake return early (the caller re-checks). */
static void futex_wait(_Atomic uint32_t *w, uint32_t val, const struct timespec *rel) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, rel, NULL, 0);
}

void http_notify_init(struct http_notify *n) {
    atomic_store(&n->gen, 0);
}

void http_notify_destroy(struct http_notify *n) {
    (void)n;
}

void http_notify_signal(struct http_notify *n) {
    atomic_fetch_add(&n->gen, 1);
    futex_wake_all(&n->gen);
}

uint64_t http_notify_gen(struct http_notify *n) {
    return atomic_load(&n->gen);
}

int http_stopping(struct http_server *srv) {
    return srv ? atomic_load(&srv->stopping) : 0;
}

int http_wait(struct http_server *srv, struct http_notify *n, uint64_t *gen, int timeout_ms) {
    int64_t end = clock_mono_ms() + timeout_ms;
    for (;;) {
        uint32_t g = atomic_load(&n->gen);
        if (g != (uint32_t)*gen) {
            *gen = g;
            return 1;
        }
        if (http_stopping(srv)) return -1;
        int64_t left = end - clock_mono_ms();
        if (left <= 0) return 0;
        /* Wake at least every 200 ms to notice shutdown. */
        if (left > 200) left = 200;
        struct timespec rel = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
        futex_wait(&n->gen, g, &rel);
    }
}

/* ---------------- request processing ---------------- */

static const char *bearer_token(struct MHD_Connection *mc) {
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}

/* Authenticates per the route; on failure replies and returns -1. */
static int authenticate(struct http_conn *c) {
    struct http_req *req = &c->req;
    struct loomd *ld = c->srv->ld;
    enum http_auth need = req->route->auth;
    if (need == HTTP_AUTH_ANYONE) return 0;
    const char *tok = bearer_token(c->mc);
    if (!tok) {
        http_add_header(req, "WWW-Authenticate", "Bearer");
        http_error(req, 401, "UNAUTHORIZED", "missing 'Authorization: Bearer TOKEN' header");
        return -1;
    }
    req->bearer = tok;
    if (need == HTTP_AUTH_BEARER) return 0;
    if (need == HTTP_AUTH_JOIN || need == HTTP_AUTH_NODE) {
        /* A node credential (daemon/nodes.h); the join token only registers. */
        int adm = nodes_auth(ld, tok, req->node, sizeof req->node);
        if (adm == NODE_APPROVED || (adm > 0 && need == HTTP_AUTH_JOIN)) return 0;
        if (adm > 0) {
            http_error(req, 403, "NODE_NOT_APPROVED",
                       "node %s is %s: an admin must approve it (POST /v1/nodes/%s/approve)",
                       req->node, nodes_admission_name(adm), req->node);
            return -1;
        }
        req->node[0] = 0;
        if (need == HTTP_AUTH_JOIN && auth_is_join(ld->auth, tok)) return 0;
        http_add_header(req, "WWW-Authenticate", "Bearer");
        http_error(req, 401, "UNAUTHORIZED",
                   need == HTTP_AUTH_JOIN
                       ? "invalid join token or node credential"
                       : "unknown or revoked node credential (the join token only registers)");
        return -1;
    }
    if (auth_is_admin(ld->auth, tok)) {
        req->is_admin = 1;
        snprintf(req->token_id, sizeof req->token_id, "admin");
        if (need == HTTP_AUTH_ADMIN || need == HTTP_AUTH_ANY_TOKEN) return 0;
        http_error(req, 403, "FORBIDDEN", "this route takes a tenant token, not the admin token");
        return -1;
    }
    struct auth_token_info info;
    int rc = auth_tenant_token(ld->auth, ld->store, tok, &info);
    if (rc == -2) {
        http_error(req, 503, "STORE_UNAVAILABLE", "the store could not be read; retry");
        return -1;
    }
    if (rc == -3) {
        /* Named in the audit row of the refused request. */
        snprintf(req->tenant_id, sizeof req->tenant_id, "%s", info.tenant_id);
        snprintf(req->token_id, sizeof req->token_id, "%s", info.token_id);
        http_add_header(req, "WWW-Authenticate", "Bearer error=\"invalid_token\"");
        http_error(req, 401, "TOKEN_EXPIRED", "token %s of tenant %s has expired", info.token_id,
                   info.tenant_id);
        return -1;
    }
    if (rc != 0) {
        http_add_header(req, "WWW-Authenticate", "Bearer");
        http_error(req, 401, "UNAUTHORIZED", "unknown or revoked token");
        return -1;
    }
    snprintf(req->tenant_id, sizeof req->tenant_id, "%s", info.tenant_id);
    snprintf(req->token_id, sizeof req->token_id, "%s", info.token_id);
    req->scopes = info.scopes;
    if (need == HTTP_AUTH_ADMIN) {
        if (!(info.scopes & AUTH_SCOPE_ADMIN)) {
            http_error(req, 403, "FORBIDDEN", "this route needs the admin token");
            return -1;
        }
        req->is_admin = 1;
        return 0;
    }
    unsigned want = auth_route_scope(req->route->method, req->route->pattern);
    if (!(info.scopes & want)) {
        http_error(req, 403, "INSUFFICIENT_SCOPE", "token %s lacks the '%s' scope for %s %s",
                   info.token_id, want == AUTH_SCOPE_READ ? "read" : "submit", req->route->method,
                   req->route->pattern);
        return -1;
    }
    double retry = 0;
    if (ld->rl && !ratelimit_allow(ld->rl, req->tenant_id, &retry)) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", (int)(retry + 0.999));
        http_add_header(req, "Retry-After", ra);
        http_error(req, 429, "RATE_LIMITED", "tenant %s is over %ld requests/s (burst %ld)",
                   req->tenant_id, ld->cfg.rate_limit, ld->cfg.rate_burst);
        return -1;
    }
    return 0;
}

static int is_json_type(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ')
        ct++;
    size_t n = strlen("application/json");
    return strncasecmp(ct, "application/json", n) == 0 &&
           (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

static int has_body(struct MHD_Connection *mc) {
    const char *cl =
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoll(cl, NULL, 10) > 0) return 1;
    const char *te =
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    return te != NULL;
}

/* How much of a refused body is read and dropped before the 413: enough for
 * a client that sends without waiting to see the answer, bounded so that a
 * claimed or streamed giant costs the server little. */
static long long drain_cap(const struct http_server *s) {
    long long cap = 4LL * s->max_body;
    return cap < (16LL << 20) ? (16LL << 20) : cap;
}

static void refuse_too_large(struct http_conn *c) {
    if (c->claimed >= 0)
        http_error(&c->req, 413, "PAYLOAD_TOO_LARGE",
                   "body of %lld bytes is over the %ld byte limit", c->claimed, c->srv->max_body);
    else
        http_error(&c->req, 413, "PAYLOAD_TOO_LARGE", "body is over the %ld byte limit",
                   c->srv->max_body);
}

/* First call: route, auth, content checks. Returns 0 to continue, -1 when a
 * reply has been prepared. */
static int begin_request(struct http_conn *c, const char *url, const char *method) {
    struct http_req *req = &c->req;
    c->route_idx = http_routes_count;
    int path_matched = 0;
    /* HEAD is answered as GET; libmicrohttpd leaves the body out. */
    if (strcmp(method, "HEAD") == 0) method = "GET";
    char allow[128] = "";
    for (size_t i = 0; i < http_routes_count; i++) {
        const struct http_route *r = &http_routes[i];
        int n = 0;
        if (strcmp(r->method, method) != 0) {
            if (http_match(r->pattern, url, NULL, NULL, 0, &n)) {
                path_matched = 1;
                size_t l = strlen(allow);
                snprintf(allow + l, sizeof allow - l, "%s%s", l ? ", " : "", r->method);
            }
            continue;
        }
        if (http_match(r->pattern, url, req->param_name, req->param_value, HTTP_MAX_PARAMS, &n)) {
            req->nparams = n;
            req->route = r;
            c->route_idx = i;
            break;
        }
    }
    if (!req->route) {
        if (path_matched) {
            http_add_header(req, "Allow", allow);
            http_error(req, 405, "METHOD_NOT_ALLOWED", "%s is not allowed on %s (allowed: %s)",
                       method, url, allow);
        } else {
            http_error(req, 404, "NOT_FOUND", "no route for %s %s", method, url);
        }
        return -1;
    }
    if (authenticate(c) != 0) return -1;
    enum http_body b = req->route->body;
    if ((b == HTTP_BODY_JSON || b == HTTP_BODY_JSON_OPT) && has_body(c->mc) &&
        !is_json_type(
            MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        http_error(req, 415, "UNSUPPORTED_MEDIA_TYPE",
                   "send the body with 'Content-Type: application/json'");
        return -1;
    }
    const char *cl =
        MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    c->claimed = -1;
    if (cl && strtoll(cl, NULL, 10) > c->srv->max_body) {
        c->too_large = 1;
        c->claimed = strtoll(cl, NULL, 10);
        /* A client that waits for "100 Continue" has sent nothing yet: refuse
         * now. One that is already sending gets its body read and dropped
         * first, up to drain_cap: answering early makes libmicrohttpd stop
         * reading and close with the rest unread, the kernel then resets the
         * connection, and the reset can reach the client before the 413. */
        const char *expect =
            MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        if ((expect && strcasecmp(expect, "100-continue") == 0) || c->claimed > drain_cap(c->srv))
            return refuse_too_large(c), -1;
    }
    return 0;
}

/* Returns 1 when a refused body has passed drain_cap: answer now. */
static int append_body(struct http_conn *c, const char *data, size_t n) {
    if (!c->too_large && c->len + n > (size_t)c->srv->max_body) {
        c->too_large = 1;
        c->dropped = (long long)c->len;
        free(c->buf);
        c->buf = NULL;
        c->len = c->cap = 0;
    }
    if (c->too_large) {
        c->dropped += (long long)n;
        return c->dropped > drain_cap(c->srv);
    }
    if (buf_grow_array(&c->buf, &c->cap, c->len + n + 1, 1, 4096) != 0) return -1;
    memcpy(c->buf + c->len, data, n);
    c->len += n;
    c->buf[c->len] = 0;
    return 0;
}

/* Last call: body checks and the handler. */
static void run_handler(struct http_conn *c) {
    struct http_req *req = &c->req;
    if (c->too_large) {
        refuse_too_large(c);
        return;
    }
    req->body = c->len ? c->buf : NULL;
    req->body_len = c->len;
    enum http_body b = req->route->body;
    if (b == HTTP_BODY_JSON || (b == HTTP_BODY_JSON_OPT && c->len)) {
        if (!c->len) {
            http_error(req, 400, "INVALID_JSON", "a JSON object body is required");
            return;
        }
        json_error_t err;
        req->json = json_loadb(c->buf, c->len, JSON_REJECT_DUPLICATES, &err);
        if (!req->json) {
            http_error(req, 400, "INVALID_JSON", "malformed JSON at line %d column %d: %s",
                       err.line, err.column, err.text);
            return;
        }
        if (!json_is_object(req->json)) {
            http_error(req, 400, "INVALID_JSON", "the body must be a JSON object");
            return;
        }
    }
    req->route->handler(req);
    if (!c->resp) http_error(req, 500, "INTERNAL", "the handler sent no reply");
}

/* One audit row (daemon/audit.h) for a state-changing request, before its reply. */
static void record_audit(struct http_conn *c, struct MHD_Connection *mc) {
    char remote[INET6_ADDRSTRLEN] = "";
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, remote, sizeof remote);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, remote,
                      sizeof remote);
    }
    struct http_req *req = &c->req;
    const char *object = c->object_id;
    for (int i = 0; !*object && i < c->nhdr; i++) /* a created object's Location */
        if (c->status < 300 && strcasecmp(c->hdr_name[i], "Location") == 0 &&
            strrchr(c->hdr_value[i], '/'))
            object = strrchr(c->hdr_value[i], '/') + 1;
    if (!*object && req->nparams > 0) object = req->param_value[req->nparams - 1];
    struct audit_event e = {.actor = req->token_id,
                            .tenant_id = req->tenant_id,
                            .method = req->route->method,
                            .route = req->route->pattern,
                            .path = req->path,
                            .object_id = object,
                            .remote = remote,
                            .status = c->status ? c->status : 499};
    audit_record(c->srv->ld, &e);
}

static enum MHD_Result queue(struct http_conn *c) {
    c->replied = 1;
    if (!c->resp) return MHD_NO;
    /* The audit row is durable before the client sees the reply. */
    if (c->req.route &&
        audit_wanted(c->req.route->method, c->req.route->pattern, (int)c->req.route->auth))
        record_audit(c, c->mc);
    enum MHD_Result r = MHD_queue_response(c->mc, (unsigned)c->status, c->resp);
    MHD_destroy_response(c->resp);
    c->resp = NULL;
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    struct http_server *srv = cls;
    struct http_conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        *con_cls = c;
        atomic_fetch_add(&srv->inflight, 1);
        c->t0 = clock_mono_s();
        c->srv = srv;
        c->mc = mc;
        c->req.conn = c;
        c->req.ld = srv->ld;
        snprintf(c->method_copy, sizeof c->method_copy, "%s", method);
        c->http10 = version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
        c->path_copy = strdup(url);
        c->req.method = c->method_copy;
        c->req.path = c->path_copy ? c->path_copy : "";
        /* The head is in: from now on the idle timeout is conn-timeout, not
         * the shorter header-timeout a new connection gets. */
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)srv->conn_timeout_s);
        if (atomic_load(&srv->stopping)) {
            http_add_header(&c->req, "Connection", "close");
            http_error(&c->req, 503, "SHUTTING_DOWN", "loomd is shutting down");
            return queue(c);
        }
        if (begin_request(c, url, method) != 0) return queue(c);
        return MHD_YES;
    }
    if (c->replied) {
        *upload_data_size = 0; /* discard what arrives after an early reply */
        return MHD_YES;
    }
    if (*upload_data_size) {
        int r = append_body(c, upload_data, *upload_data_size);
        if (r < 0) return MHD_NO;
        *upload_data_size = 0;
        if (r > 0) {
            refuse_too_large(c);
            return queue(c);
        }
        return MHD_YES;
    }
    run_handler(c);
    return queue(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct http_server *srv = cls;
    struct http_conn *c = *con_cls;
    if (!c) return;
    struct loomd *ld = srv->ld;
    double secs = clock_mono_s() - c->t0;
    log_debug("http: %s %s %d %.2f ms%s", c->req.method ? c->req.method : "?",
              c->req.path ? c->req.path : "?", c->status ? c->status : 499, secs * 1e3,
              toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (not completed)");
    if (ld->metrics) metrics_observe(ld->metrics, c->route_idx, c->status ? c->status : 499, secs);
    for (int i = 0; i < c->req.nparams; i++) {
        free(c->req.param_name[i]);
        free(c->req.param_value[i]);
    }
    for (int i = 0; i < c->nhdr; i++) {
        free(c->hdr_name[i]);
        free(c->hdr_value[i]);
    }
    if (c->resp) MHD_destroy_response(c->resp);
    json_decref(c->req.json);
    free(c->buf);
    free(c->path_copy);
    free(c);
    *con_cls = NULL;
    atomic_fetch_sub(&srv->inflight, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    struct http_server *srv = cls;
    if (strstr(msg, "connection limit") || strstr(msg, "too many connections")) {
        atomic_fetch_add(&srv->refused_conns, 1);
        char what[600];
        snprintf(what, sizeof what, "a connection: %s", msg);
        log_refusal(srv, what);
        return;
    }
    log_debug("http: %s", msg);
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)mc;
    (void)socket_context;
    struct http_server *srv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&srv->conns, 1);
    else
        atomic_fetch_sub(&srv->conns, 1);
}

void http_conn_stats(struct http_server *srv, struct http_conn_stats *st) {
    memset(st, 0, sizeof *st);
    if (!srv) return;
    st->connections = atomic_load(&srv->conns);
    st->streams = atomic_load(&srv->streams);
    st->inflight = atomic_load(&srv->inflight);
    st->conn_limit = srv->conn_limit;
    st->stream_total = srv->lim.stream_total;
    st->stream_per_tenant = srv->lim.stream_per_tenant;
    st->refused_streams = atomic_load(&srv->refused_streams);
    st->refused_conns = atomic_load(&srv->refused_conns);
}

void http_each_stream_tenant(struct http_server *srv,
                             void (*fn)(void *arg, const char *tenant, int n), void *arg) {
    if (!srv) return;
    pthread_mutex_lock(&srv->stream_mu);
    for (int i = 0; i < STREAM_TENANTS; i++)
        if (srv->stream_by[i].n > 0) fn(arg, srv->stream_by[i].tenant, srv->stream_by[i].n);
    pthread_mutex_unlock(&srv->stream_mu);
}

/* The abuse-limit options, passed as one MHD_OPTION_ARRAY. Streams may take
 * all connections but a reserve (a quarter, at least 16) so /healthz,
 * loomctl and scrapes still get in when clients hold many streams. MHD's
 * memory pool per connection holds the request head and the write buffer
 * (16 KiB for streams), hence header-limit plus that. */
static void limit_options(struct http_server *srv, const struct http_options *o) {
    srv->lim = o->limits;
    if (srv->lim.header_timeout_s <= 0) srv->lim.header_timeout_s = 10;
    if (srv->lim.header_limit <= 0) srv->lim.header_limit = 32768;
    long reserve = o->conn_limit / 4 > 16 ? o->conn_limit / 4 : 16;
    long room = o->conn_limit - reserve > 1 ? o->conn_limit - reserve : 1;
    if (srv->lim.stream_total <= 0 || srv->lim.stream_total > room) srv->lim.stream_total = room;
    if (srv->lim.stream_per_tenant <= 0) srv->lim.stream_per_tenant = 64;
    struct MHD_OptionItem *it = srv->opts;
    *it++ = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                    (intptr_t)srv->lim.header_timeout_s, NULL};
    *it++ = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                    (intptr_t)(srv->lim.header_limit + 16384 + 4096), NULL};
    *it++ = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, srv};
    *it++ = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

/* ---------------- lifecycle ---------------- */

static int open_listener(const char *addr, int *port_out) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host) {
        log_error("http: --listen '%s' is not HOST:PORT", addr);
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535) {
        log_error("http: --listen '%s': bad port", addr);
        return -1;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (strcmp(host, "localhost") == 0) snprintf(host, sizeof host, "127.0.0.1");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        log_error("http: --listen '%s': host must be an IPv4 address", addr);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        log_error("http: cannot listen on %s: %s", addr, strerror(errno));
        close(fd);
        return -1;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    *port_out = ntohs(sa.sin_port);
    return fd;
}

struct http_server *http_start(struct loomd *ld, const struct http_options *o) {
    struct http_server *srv = calloc(1, sizeof *srv);
    if (!srv) return NULL;
    srv->ld = ld;
    srv->max_body = o->max_body;
    srv->conn_limit = o->conn_limit;
    srv->conn_timeout_s = o->conn_timeout_s;
    pthread_mutex_init(&srv->stream_mu, NULL);
    limit_options(srv, o);
    srv->listen_fd = open_listener(o->listen, &srv->port);
    if (srv->listen_fd < 0) {
        free(srv);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    /* TLS (daemon/tls.h): the listener then speaks HTTPS only. */
    struct MHD_OptionItem tls[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)o->tls_cert_pem},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)o->tls_key_pem},
        {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)TLS_PRIORITIES},
        {MHD_OPTION_END, 0, NULL},
    };
    srv->tls = o->tls_cert_pem && o->tls_key_pem;
    if (srv->tls)
        flags |= MHD_USE_TLS;
    else
        tls[0].option = MHD_OPTION_END;
    srv->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
                                mhd_log, srv, MHD_OPTION_LISTEN_SOCKET, srv->listen_fd,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->conn_limit,
                                MHD_OPTION_ARRAY, srv->opts, MHD_OPTION_NOTIFY_COMPLETED,
                                on_completed, srv, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20),
                                MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (!srv->mhd) {
        log_error("http: libmicrohttpd failed to start on %s", o->listen);
        close(srv->listen_fd);
        free(srv);
        return NULL;
    }
    return srv;
}

int http_port(struct http_server *srv) {
    return srv->port;
}

void http_stop(struct http_server *srv, int grace_ms) {
    if (!srv) return;
    atomic_store(&srv->stopping, 1);
    MHD_socket fd = MHD_quiesce_daemon(srv->mhd); /* stop accepting */
    double end = clock_mono_s() + grace_ms / 1000.0;
    while (atomic_load(&srv->inflight) > 0 && clock_mono_s() < end)
        usleep(10000);
    if (atomic_load(&srv->inflight) > 0)
        log_warn("http: %d requests still in flight after %d ms; closing them",
                 atomic_load(&srv->inflight), grace_ms);
    MHD_stop_daemon(srv->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    pthread_mutex_destroy(&srv->stream_mu);
    free(srv);
}
