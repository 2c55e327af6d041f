/* Webhooks: tenants subscribe a URL to event types; loomd POSTs each event
 * there, signed, at least once.
 *
 * Outbox: events_emit() (daemon/events.h) inserts one `webhook_deliveries`
 * row per subscribed webhook in the transaction of the event (migration 071),
 * so a committed event always has its pending deliveries, across kill -9.
 * One delivery thread walks the due rows (state pending, next_at <= now) and
 * POSTs them concurrently with libcurl's multi interface: at most
 * --webhook-inflight attempts in flight, at most --webhook-inflight-hook to
 * one webhook (so a slow target holds only its own slots), connections kept
 * alive and reused per target. The outcomes of a round (those that finish
 * within a few ms of each other) are recorded in one durable write: 2xx is
 * delivered; anything else is retried with exponential backoff
 * (--webhook-retry-base-ms doubling, capped at 1 h) until --webhook-retry-for
 * (24 h) has passed since the event, then failed. A crash after the target
 * answered 2xx and before that write commits re-sends the event once more:
 * receivers dedupe on Loom-Event-Id (the event seq). On shutdown, outcomes
 * already in are recorded and attempts still in flight are abandoned (sent
 * again after the next start).
 *
 * Request: POST url, body {"id":SEQ,"type","created_at","data"}, headers
 * Content-Type: application/json, Loom-Event-Id: SEQ, Loom-Delivery-Id,
 * Loom-Signature: t=UNIX,v1=HEX(HMAC-SHA256(secret, "<t>.<body>")).
 *
 * Targets: http(s) only; a host resolving to a loopback, private, link-local,
 * CGNAT, multicast or otherwise non-public address is refused unless loomd
 * runs with --webhook-allow-private. The host is resolved when the webhook
 * is created and again before every delivery, and curl is pinned to the
 * address that was checked (CURLOPT_RESOLVE), so DNS rebinding cannot turn a
 * checked name into an internal address. Attempts started together to the
 * same URL share one check; a kept-alive connection is reused only for the
 * same host and port and leads to an address that passed the check when it
 * was opened. The lookup is synchronous on the delivery thread: a slow DNS
 * server delays every target. Redirects are not followed. */
#ifndef LOOM_DAEMON_WEBHOOKS_H
#define LOOM_DAEMON_WEBHOOKS_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/socket.h>

#include <curl/curl.h>

#include "daemon/http.h"

struct loomd;

/* hex HMAC-SHA256(secret, "<t>.<body>") into out (65 bytes). 0 or -1. */
int webhooks_sign(const char *secret, long long t, const char *body, size_t len, char out[65]);

/* 1 when an address must not be a webhook target without
 * --webhook-allow-private (loopback, RFC 1918, CGNAT, link-local, unique-local,
 * multicast, unspecified, reserved, documentation, IPv4-mapped forms of
 * those), 0 when it is public. family AF_INET (addr: struct in_addr) or
 * AF_INET6 (struct in6_addr). Pure. */
int webhooks_addr_private(int family, const void *addr);
/* The same for an IP literal; -1 when `ip` is not one. */
int webhooks_ip_private(const char *ip);

/* Checks a target URL: scheme http/https and a host; with `resolve`, also
 * that the host resolves and (unless allow_private) that every address it
 * resolves to is public (a synchronous lookup: webhook creation only).
 * Returns 0, or -1 with an upper-case code and a message. */
int webhooks_check_url(const char *url, int allow_private, int resolve, char *code, size_t codelen,
                       char *msg, size_t msglen);

/* The delivery-time check, on the address curl is about to connect to
 * (CURLOPT_OPENSOCKETFUNCTION with this as its data): curl resolves names
 * itself, asynchronously, and every address it tries passes through here,
 * so a slow DNS server holds up only its own attempt and an answer that
 * changes to an internal address (DNS rebinding) is still refused. */
struct webhooks_sock_check {
    int allow_private;
    char refused[64]; /* the last address refused ("" none) */
};
/* Returns a new close-on-exec socket for `address`, or CURL_SOCKET_BAD
 * (after noting the address in c->refused) when it is private and c does
 * not allow that (c: a struct webhooks_sock_check). */
curl_socket_t webhooks_open_socket(void *c, curlsocktype purpose, struct curl_sockaddr *address);

/* Retry delay in ms after `attempts` failed attempts (>= 1). Pure. */
int64_t webhooks_backoff_ms(int attempts, int64_t base_ms);

/* Prometheus text (daemon/metrics.c collector row): loom_events_last_seq,
 * loom_webhook_attempts_total{result}, loom_webhook_deliveries{state}. */
void webhooks_metrics_write(struct loomd *ld, FILE *f);

/* Module table entries: the delivery thread. */
int webhooks_start(struct loomd *ld);
/* A webhook was created: the delivery thread reads the outbox for the next
 * event even if it saw no webhook before (it skips those reads while there
 * is none). */
void webhooks_kick(struct loomd *ld);
void webhooks_stop(struct loomd *ld);

/* Routes (daemon/api_webhooks.c; tenant tokens). */
int api_webhooks_create(struct http_req *req);
int api_webhooks_list(struct http_req *req);
int api_webhooks_get(struct http_req *req);
int api_webhooks_delete(struct http_req *req);
int api_webhooks_deliveries(struct http_req *req);

#endif
