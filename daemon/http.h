/* loomd's HTTP layer on libmicrohttpd: the route table, the request context
 * handed to handlers, reply helpers (one JSON error shape), long-poll waits
 * and streaming replies.
 *
 * Threading: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler may block: a durable write
 * waits for its group commit, a long-poll waits on an http_notify, a stream
 * callback waits for data. Blocking waits must go through http_wait() so
 * they end promptly at shutdown. Connection count, idle timeout and body
 * size are capped by loomd's config.
 *
 * Adding a route: one row in the table in daemon/routes.c, e.g.
 *   {"GET", "/v1/nodes/{id}", HTTP_AUTH_ANY_TOKEN, HTTP_BODY_NONE, nodes_get},
 * and declare the handler in your module's header. Path patterns are literal
 * segments and {name} segments (one whole segment each); a last segment
 * {name*} takes the rest of the path, slashes included (artifact paths). The layer, before
 * calling the handler: matches the route (404 NOT_FOUND / 405
 * METHOD_NOT_ALLOWED), authenticates (401 UNAUTHORIZED / 403 FORBIDDEN),
 * applies the per-tenant rate limit (429 RATE_LIMITED), checks Content-Type
 * (415 UNSUPPORTED_MEDIA_TYPE) and body size (413 PAYLOAD_TOO_LARGE), and
 * parses a JSON body (400 INVALID_JSON). The handler then answers with exactly
 * one of the http_reply_* / http_error calls and returns 0. */
#ifndef LOOM_DAEMON_HTTP_H
#define LOOM_DAEMON_HTTP_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct loomd;
struct http_server;
struct http_req;

/* Who may call a route. */
enum http_auth {
    HTTP_AUTH_ANYONE,    /* no token (healthz, metrics) */
    HTTP_AUTH_ADMIN,     /* the admin token only */
    HTTP_AUTH_TENANT,    /* a tenant token (req->tenant_id set); admin gets 403 */
    HTTP_AUTH_ANY_TOKEN, /* a tenant token or the admin token (req->is_admin) */
    HTTP_AUTH_JOIN,      /* agent registration: the join token or a node credential
                            (req->node set for a credential, pending nodes too) */
    HTTP_AUTH_NODE,      /* the credential of an approved node (req->node); daemon/nodes.h */
    HTTP_AUTH_BEARER,    /* any bearer token, checked by the handler itself
                            (attempt-scoped rendezvous tokens): req->bearer */
};

/* What body a route takes. */
enum http_body {
    HTTP_BODY_NONE,     /* any body is ignored */
    HTTP_BODY_JSON,     /* a JSON object is required (req->json) */
    HTTP_BODY_JSON_OPT, /* a JSON object if one is sent, else req->json == NULL */
};

typedef int (*http_handler)(struct http_req *req);

struct http_route {
    const char *method;  /* "GET", "POST", "PUT", "DELETE" */
    const char *pattern; /* "/v1/jobs/{id}/cancel" */
    enum http_auth auth;
    enum http_body body;
    http_handler handler;
};

/* The route table (daemon/routes.c) and its length. */
extern const struct http_route http_routes[];
extern const size_t http_routes_count;

#define HTTP_MAX_PARAMS 6

/* The request context, valid until the handler returns (stream callbacks get
 * their own context). Strings are owned by the layer. */
struct http_req {
    struct loomd *ld; /* the server context */
    const struct http_route *route;
    const char *method;
    const char *path;
    int nparams;
    char *param_name[HTTP_MAX_PARAMS];
    char *param_value[HTTP_MAX_PARAMS];
    const char *body; /* raw body bytes (NUL-terminated copy), NULL when empty */
    size_t body_len;
    json_t *json;       /* parsed body for HTTP_BODY_JSON*, borrowed (layer frees) */
    char tenant_id[32]; /* set for tenant tokens */
    int is_admin;       /* the admin token (or an admin-scoped token) was used */
    char token_id[32];  /* the tenant token's id ("k-..."); "admin" for the admin token */
    unsigned scopes;    /* the tenant token's AUTH_SCOPE_* bits (daemon/auth.h) */
    const char *bearer; /* raw bearer token (HTTP_AUTH_BEARER routes) */
    char node[64];      /* the node whose credential was used (HTTP_AUTH_JOIN/NODE) */
    /* internal */
    struct http_conn *conn;
};

/* Path parameter by name ("id" for /v1/jobs/{id}); NULL if absent. */
const char *http_param(struct http_req *req, const char *name);
/* Query argument (?state=queued); NULL if absent. */
const char *http_query(struct http_req *req, const char *name);
/* Request header (case-insensitive name); NULL if absent. */
const char *http_header(struct http_req *req, const char *name);

/* Reply with `body` as JSON (stolen; NULL sends an empty 204-style body). */
int http_reply_json(struct http_req *req, int status, json_t *body);
/* Reply with text of the given content type (copied). */
int http_reply_text(struct http_req *req, int status, const char *content_type, const char *text,
                    size_t len);
/* The one error shape: {"error":{"code":CODE,"message":MSG}} (+ "field" when
 * field is non-NULL, for 422s naming a JSON path). */
int http_error(struct http_req *req, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int http_error_field(struct http_req *req, int status, const char *code, const char *field,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Adds a header to the reply about to be sent (call before http_reply_*). */
void http_add_header(struct http_req *req, const char *name, const char *value);

/* Streaming reply (chunked transfer encoding), e.g. logs?follow=1. The layer
 * calls read(ctx, buf, max) from the connection's thread until it returns -1
 * (end) or the client goes away or the server shuts down; it returns the
 * number of bytes written into buf, or 0 when nothing is available yet: a
 * read callback should first wait (http_stream_wait) so 0 is not returned in
 * a tight loop. free_ctx(ctx) runs once when the stream ends (may be NULL). */
typedef ssize_t (*http_stream_read)(void *ctx, char *buf, size_t max);
int http_reply_stream(struct http_req *req, int status, const char *content_type,
                      http_stream_read read, void *ctx, void (*free_ctx)(void *));

/* A stream whose body another thread writes (the event fan-out,
 * daemon/api_events.c), so that a thousand streams do not need a thousand
 * threads woken per event. After the stream's first chunk has gone out (the
 * response head with it), the layer offers the client socket to adopt(ctx,
 * fd, chunked, a) from the connection's thread at each read; it returns 1
 * for "not now" (read is called as usual), -1 for "never", 0 when it took
 * the socket: from then on the adopter writes the body bytes to fd itself
 * (non-blocking; framed as HTTP/1.1 chunks when chunked is 1, raw for an
 * HTTP/1.0 client), watches it for a close, and calls
 * http_adopt_release(a, how) once it no longer touches fd or ctx. The
 * connection's thread sleeps until then and ends the stream (HTTP_ADOPT_END:
 * the closing chunk; HTTP_ADOPT_CLOSE: the connection is closed, after a
 * partial write or a gone client). The adopter must release every stream it
 * holds once http_stopping() is true. Never offered under TLS (the socket
 * carries TLS records) nor to an HTTP/1.1 client that asked for
 * "Connection: close" (libmicrohttpd's framing then is not fixed). */
enum { HTTP_ADOPT_HELD = 0, HTTP_ADOPT_END = 1, HTTP_ADOPT_CLOSE = 2 };
struct http_adopted {
    _Atomic uint32_t how; /* HTTP_ADOPT_*; a futex word */
};
typedef int (*http_stream_adopt)(void *ctx, int fd, int chunked, struct http_adopted *a);
int http_reply_stream_adoptable(struct http_req *req, int status, const char *content_type,
                                http_stream_read read, http_stream_adopt adopt, void *ctx,
                                void (*free_ctx)(void *));
void http_adopt_release(struct http_adopted *a, int how);

/* Reply with len bytes of the open file fd from offset (sendfile where the
 * platform has it). fd is owned by the layer from here on (closed when the
 * reply is done, also on error). */
int http_reply_fd(struct http_req *req, int status, const char *content_type, int fd,
                  uint64_t offset, uint64_t len);

/* A wake-up channel for long-polls and streams: producers call
 * http_notify_signal after they changed something; waiters sleep in
 * http_wait until it is signalled. A generation counter that is also a
 * futex word (http.c says why not a condition variable). */
struct http_notify {
    _Atomic uint32_t gen;
};
void http_notify_init(struct http_notify *n);
void http_notify_destroy(struct http_notify *n);
void http_notify_signal(struct http_notify *n);
uint64_t http_notify_gen(struct http_notify *n);
/* Long-poll wait: sleeps until n's generation differs from *gen (returns 1 and
 * updates *gen), timeout_ms passes (0) or the server starts shutting down
 * (-1). Typical use:
 *   uint64_t gen = http_notify_gen(&x->notify);
 *   while (!have_data()) { if (http_wait(req->ld->http, &x->notify, &gen, left_ms) <= 0) break; }
 * Then reply (an empty result on timeout). */
int http_wait(struct http_server *srv, struct http_notify *n, uint64_t *gen, int timeout_ms);
/* 1 once shutdown has begun (long-polls should answer now). */
int http_stopping(struct http_server *srv);

/* ----- server lifecycle (daemon/loomd.c calls these) ----- */
/* Abuse limits (docs/operations.md "Connection limits"). */
struct http_limits {
    long header_timeout_s;  /* a new connection must send its request head within this */
    long header_limit;      /* bytes of request line + headers (431 above) */
    long stream_total;      /* open streams, all tenants (0: conn_limit minus the reserve) */
    long stream_per_tenant; /* open streams of one tenant (or of the admin token) */
};
/* Snapshot for GET /v1/system/connections. */
struct http_conn_stats {
    int connections, streams, inflight;
    long conn_limit, stream_total, stream_per_tenant;
    unsigned long long refused_streams, refused_conns;
};
void http_conn_stats(struct http_server *srv, struct http_conn_stats *st);
/* Calls fn once per tenant with open streams (under the layer's lock: keep fn short). */
void http_each_stream_tenant(struct http_server *srv,
                             void (*fn)(void *arg, const char *tenant, int n), void *arg);
struct http_options {
    const char *listen;       /* "127.0.0.1:8420"; port 0 = ephemeral */
    long max_body;            /* bytes */
    long conn_limit;          /* concurrent connections */
    long conn_timeout_s;      /* idle keep-alive timeout */
    const char *tls_cert_pem; /* PEM text: serve HTTPS only (NULL: plain HTTP) */
    const char *tls_key_pem;
    struct http_limits limits;
};
/* Binds and starts serving. Returns NULL after logging why. */
struct http_server *http_start(struct loomd *ld, const struct http_options *o);
/* The bound port (useful with port 0). */
int http_port(struct http_server *srv);
/* Stops accepting, wakes long-polls, waits up to grace_ms for in-flight
 * requests to finish, then closes every connection and frees. Accepts NULL. */
void http_stop(struct http_server *srv, int grace_ms);

/* Path pattern matcher (exposed for tests): 1 if `path` matches `pattern`,
 * filling names/values (heap copies the caller frees) up to max. */
int http_match(const char *pattern, const char *path, char **names, char **values, int max, int *n);

#endif
