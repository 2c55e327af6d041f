/* Webhook delivery: signatures (OpenSSL HMAC), the target address policy
 * (a prefix table), URL checks, backoff, and the delivery thread that walks
 * the outbox. See webhooks.h for the contract. */
#define _GNU_SOURCE
#include "daemon/webhooks.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/errors.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/events.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#define MAX_BACKOFF_MS 3600000LL

/* ---------------- signatures ---------------- */

int webhooks_sign(const char *secret, long long t, const char *body, size_t len, char out[65]) {
    char head[32];
    int hn = snprintf(head, sizeof head, "%lld.", t);
    size_t n = (size_t)hn + len;
    unsigned char *msg = malloc(n ? n : 1);
    if (!msg) return -1;
    memcpy(msg, head, (size_t)hn);
    memcpy(msg + hn, body, len);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;
    unsigned char *r = HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, n, mac, &maclen);
    free(msg);
    if (!r || maclen != 32) return -1;
    for (unsigned i = 0; i < maclen; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
    return 0;
}

/* ---------------- the address policy ---------------- */

/* Non-public ranges: (bytes of the prefix, its length in bits). IPv4 entries
 * are matched against IPv4 addresses and IPv4-mapped/compatible IPv6 ones. */
struct prefix {
    unsigned char b[16];
    int bits;
};
static const struct prefix v4_private[] = {
    {{0}, 8},             /* 0.0.0.0/8 "this network" */
    {{10}, 8},            /* RFC 1918 */
    {{100, 64}, 10},      /* CGNAT (RFC 6598) */
    {{127}, 8},           /* loopback */
    {{169, 254}, 16},     /* link-local (cloud metadata) */
    {{172, 16}, 12},      /* RFC 1918 */
    {{192, 0, 0}, 24},    /* IETF protocol assignments */
    {{192, 0, 2}, 24},    /* TEST-NET-1 */
    {{192, 88, 99}, 24},  /* 6to4 relay anycast (deprecated) */
    {{192, 168}, 16},     /* RFC 1918 */
    {{198, 18}, 15},      /* benchmarking */
    {{198, 51, 100}, 24}, /* TEST-NET-2 */
    {{203, 0, 113}, 24},  /* TEST-NET-3 */
    {{224}, 4},           /* multicast */
    {{240}, 4},           /* reserved, broadcast */
};
static const struct prefix v6_private[] = {
    {{0}, 128},                                              /* :: unspecified */
    {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128}, /* ::1 loopback */
    {{0x01, 0x00}, 64},                                      /* 100::/64 discard */
    {{0x20, 0x01, 0x0d, 0xb8}, 32},                          /* documentation */
    {{0x20, 0x01, 0x00, 0x00}, 23}, /* IETF protocol assignments (Teredo, ...) */
    {{0xfc}, 7},                    /* unique local */
    {{0xfe, 0x80}, 10},             /* link-local */
    {{0xfe, 0xc0}, 10},             /* site-local (deprecated) */
    {{0xff}, 8},                    /* multicast */
};

static int prefix_match(const unsigned char *a, const struct prefix *p) {
    int full = p->bits / 8, rest = p->bits % 8;
    if (memcmp(a, p->b, (size_t)full) != 0) return 0;
    if (!rest) return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (a[full] & mask) == (p->b[full] & mask);
}

static int v4_is_private(const unsigned char *a) {
    for (size_t i = 0; i < sizeof v4_private / sizeof *v4_private; i++)
        if (prefix_match(a, &v4_private[i])) return 1;
    return 0;
}

int webhooks_addr_private(int family, const void *addr) {
    if (family == AF_INET) return v4_is_private(addr);
    if (family != AF_INET6) return 1;
    const unsigned char *a = addr;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
    static const unsigned char zero[12] = {0};
    /* IPv4 inside IPv6 (mapped ::ffff:a.b.c.d, NAT64 64:ff9b::a.b.c.d,
     * compatible ::a.b.c.d): judge the IPv4 address. */
    if (!memcmp(a, mapped, 12) || !memcmp(a, nat64, 12)) return v4_is_private(a + 12);
    if (!memcmp(a, zero, 12)) {
        if ((a[12] | a[13] | a[14]) == 0 && a[15] <= 1) return 1; /* :: and ::1 */
        return v4_is_private(a + 12);
    }
    for (size_t i = 0; i < sizeof v6_private / sizeof *v6_private; i++)
        if (prefix_match(a, &v6_private[i])) return 1;
    /* 6to4 2002::/16 embeds an IPv4 address in bits 16..47. */
    if (a[0] == 0x20 && a[1] == 0x02) return v4_is_private(a + 2);
    return 0;
}

int webhooks_ip_private(const char *ip) {
    unsigned char buf[16];
    if (inet_pton(AF_INET, ip, buf) == 1) return webhooks_addr_private(AF_INET, buf);
    if (inet_pton(AF_INET6, ip, buf) == 1) return webhooks_addr_private(AF_INET6, buf);
    return -1;
}

/* ---------------- URL checks ---------------- */

int webhooks_check_url(const char *url, int allow_private, int resolve, char *code, size_t codelen,
                       char *msg, size_t msglen) {
    int ret = -1;
    char *scheme = NULL, *host = NULL, *port = NULL;
    struct addrinfo *res = NULL;
    CURLU *u = curl_url();
    if (!u) {
        snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_INTERNAL)->code);
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    if (!url || strlen(url) > 2048 ||
        curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK) {
        snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_INVALID_WEBHOOK_URL)->code);
        snprintf(msg, msglen, "url '%.200s' is not an absolute http(s) URL", url ? url : "");
        goto out;
    }
    if (strcmp(scheme, "http") && strcmp(scheme, "https")) {
        snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_INVALID_WEBHOOK_URL)->code);
        snprintf(msg, msglen, "url scheme '%.20s' is not http or https", scheme);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !*host ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK) {
        snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_INVALID_WEBHOOK_URL)->code);
        snprintf(msg, msglen, "url '%.200s' has no host", url);
        goto out;
    }
    if (!resolve) {
        ret = 0;
        goto out;
    }
    /* curl keeps IPv6 literals in brackets; getaddrinfo wants them bare. */
    char name[300];
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']')
        snprintf(name, sizeof name, "%.*s", (int)(hl - 2), host + 1);
    else
        snprintf(name, sizeof name, "%s", host);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int gai = getaddrinfo(name, port, &hints, &res);
    if (gai != 0 || !res) {
        snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_WEBHOOK_HOST_UNRESOLVED)->code);
        snprintf(msg, msglen, "host '%.200s' does not resolve: %s", name, gai_strerror(gai));
        goto out;
    }
    /* Every address must pass: curl could pick any of them. */
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        const void *a = ai->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        char text[INET6_ADDRSTRLEN];
        inet_ntop(ai->ai_family, a, text, sizeof text);
        if (!allow_private && webhooks_addr_private(ai->ai_family, a)) {
            snprintf(code, codelen, "%s", loom_errdef_of(LOOM_E_WEBHOOK_PRIVATE_ADDRESS)->code);
            snprintf(msg, msglen,
                     "host '%.200s' resolves to %s, a loopback/private/reserved address "
                     "(loomd --webhook-allow-private permits it)",
                     name, text);
            goto out;
        }
    }
    ret = 0;
out:
    if (res) freeaddrinfo(res);
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return ret;
}

curl_socket_t webhooks_open_socket(void *cp, curlsocktype purpose, struct curl_sockaddr *a) {
    struct webhooks_sock_check *c = cp;
    (void)purpose;
    const void *ip = NULL;
    if (a->family == AF_INET && a->addrlen >= sizeof(struct sockaddr_in))
        ip = &((const struct sockaddr_in *)&a->addr)->sin_addr;
    else if (a->family == AF_INET6 && a->addrlen >= sizeof(struct sockaddr_in6))
        ip = &((const struct sockaddr_in6 *)&a->addr)->sin6_addr;
    if (!ip) { /* neither IPv4 nor IPv6 (a unix socket, say): never a webhook target */
        snprintf(c->refused, sizeof c->refused, "an address of family %d", a->family);
        return CURL_SOCKET_BAD;
    }
    if (!c->allow_private && webhooks_addr_private(a->family, ip)) {
        inet_ntop(a->family, ip, c->refused, sizeof c->refused);
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

int64_t webhooks_backoff_ms(int attempts, int64_t base_ms) {
    if (attempts < 1) attempts = 1;
    int64_t d = base_ms;
    for (int i = 1; i < attempts && d < MAX_BACKOFF_MS; i++)
        d *= 2;
    return d < MAX_BACKOFF_MS ? d : MAX_BACKOFF_MS;
}

/* ---------------- the delivery thread ----------------
 *
 * One thread drives every attempt through a libcurl multi handle: up to
 * --webhook-inflight transfers at once, at most --webhook-inflight-hook of
 * them to one webhook, so a slow or hanging target holds a few slots and the
 * others keep flowing. Each slot keeps its easy handle; connections live in
 * the multi's cache and are reused (HTTP/1.1 keep-alive) by later attempts to
 * the same host and port. Outcomes are collected and committed together: one
 * store_write per round (at most COMMIT_GAP_MS after the first outcome of the
 * round, or at once when nothing else is in flight). A row stays "held" (in a
 * slot or in the uncommitted outcomes) until its outcome committed, so it is
 * never started twice meanwhile; a crash before the commit re-sends it once
 * after the restart (at least once). A second thread only turns event
 * commits (the events notify, a futex) into curl_multi_wakeup. */

#define COMMIT_GAP_MS 5
#define REFILL_GAP_MS 5 /* events while attempts are in flight: one read per 5 ms */
#define IDLE_WAIT_MS  1000

struct due {
    int64_t id, seq, created_at;
    int attempts;
    char webhook_id[32];
    char *url, *secret, *body;
};

struct outcome {
    int64_t id;
    char webhook_id[32];
    int ok, give_up;
    long status;
    char error[256];
    int64_t now, next_at;
};

/* A transfer slot: its easy handle and the attempt it carries. */
struct slot {
    CURL *easy;
    int busy;
    struct due d;
    struct curl_slist *hdr;
    struct webhooks_sock_check sock; /* the connect-time address check */
};

struct webhooks {
    struct loomd *ld;
    pthread_t thread, waker;
    int started;
    _Atomic int stopping;
    _Atomic uint64_t attempts_ok, attempts_failed;
    CURLM *multi;
    struct slot *slots;
    int nslots, inflight;
    struct outcome *out; /* finished, not yet committed */
    int nout, capout;
    int64_t first_out_ms; /* mono ms of the oldest uncommitted outcome */
    /* webhooks not deleted, as of the last read (-1: not read yet). With
     * none, a committed event has no outbox rows (events_emit inserts one
     * per subscribed webhook), so events are not read for; a new webhook
     * forces the next read (webhooks_kick). */
    long hooks;
    _Atomic int force;
};

static void due_free(struct due *d) {
    free(d->url);
    free(d->secret);
    free(d->body);
    memset(d, 0, sizeof *d);
}

/* 1 when delivery row `id` is in a slot or among the uncommitted outcomes. */
static int held(const struct webhooks *w, int64_t id) {
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].busy && w->slots[i].d.id == id) return 1;
    for (int i = 0; i < w->nout; i++)
        if (w->out[i].id == id) return 1;
    return 0;
}

static int hook_inflight(const struct webhooks *w, const char *webhook_id) {
    int n = 0;
    for (int i = 0; i < w->nslots; i++)
        n += w->slots[i].busy && !strcmp(w->slots[i].d.webhook_id, webhook_id);
    return n;
}

/* The most rows one webhook holds (in slots or uncommitted outcomes). */
static int max_held_per_hook(const struct webhooks *w) {
    int best = 0;
    for (int i = 0; i < w->nslots; i++) {
        if (!w->slots[i].busy) continue;
        const char *id = w->slots[i].d.webhook_id;
        int n = hook_inflight(w, id);
        for (int k = 0; k < w->nout; k++)
            n += !strcmp(w->out[k].webhook_id, id);
        if (n > best) best = n;
    }
    for (int k = 0; k < w->nout; k++) {
        int n = hook_inflight(w, w->out[k].webhook_id);
        for (int j = 0; j < w->nout; j++)
            n += !strcmp(w->out[j].webhook_id, w->out[k].webhook_id);
        if (n > best) best = n;
    }
    return best;
}

struct due_list {
    struct webhooks *w;
    int64_t now;
    int per_hook, limit;
    struct due *v;
    int n;
    int64_t next_at; /* earliest future next_at (0: none) */
    long hooks;      /* webhooks not deleted */
};

/* The due rows, oldest first, at most per_hook of each webhook: each
 * webhook's rows are read on their own through the partial index of pending
 * rows (migration 190), so one webhook's backlog can neither fill the page
 * nor make the read scan it (a deleted webhook has none: its pending rows
 * were cancelled with it). Rows already held are left out here, before
 * their bodies are built. */
static int read_due(struct store_tx *tx, void *arg) {
    struct due_list *l = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT q.id, q.webhook_id, q.event_seq, q.attempts, q.created_at, w.url, w.secret, "
            "e.type, e.created_at, e.data FROM webhooks w JOIN webhook_deliveries q ON q.id IN "
            "(SELECT p.id FROM webhook_deliveries p WHERE p.webhook_id = w.id AND p.state = "
            "'pending' AND p.next_at <= ?1 ORDER BY p.next_at, p.id LIMIT ?2) JOIN events e ON "
            "e.seq = q.event_seq WHERE w.deleted_at IS NULL ORDER BY q.next_at, q.id LIMIT ?3");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, l->now);
    sqlite3_bind_int(st, 2, l->per_hook);
    sqlite3_bind_int(st, 3, l->limit);
    while (sqlite3_step(st) == SQLITE_ROW && l->n < l->limit) {
        int64_t id = sqlite3_column_int64(st, 0);
        if (held(l->w, id)) continue;
        struct due *d = &l->v[l->n];
        memset(d, 0, sizeof *d);
        d->id = id;
        snprintf(d->webhook_id, sizeof d->webhook_id, "%s",
                 (const char *)sqlite3_column_text(st, 1));
        d->seq = sqlite3_column_int64(st, 2);
        d->attempts = sqlite3_column_int(st, 3);
        d->created_at = sqlite3_column_int64(st, 4);
        d->url = strdup((const char *)sqlite3_column_text(st, 5));
        d->secret = strdup((const char *)sqlite3_column_text(st, 6));
        json_t *data = json_loads((const char *)sqlite3_column_text(st, 9), 0, NULL);
        json_t *body = json_pack("{s:I, s:s, s:o, s:o}", "id", (json_int_t)d->seq, "type",
                                 (const char *)sqlite3_column_text(st, 7), "created_at",
                                 store_time_json(sqlite3_column_int64(st, 8)), "data",
                                 data ? data : json_object());
        d->body = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        l->n++;
    }
    sqlite3_reset(st);
    st = store_stmt(tx, "SELECT MIN(next_at) FROM webhook_deliveries WHERE state = 'pending' "
                        "AND next_at > ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, l->now);
    if (sqlite3_step(st) == SQLITE_ROW) l->next_at = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    st = store_stmt(tx, "SELECT COUNT(*) FROM webhooks WHERE deleted_at IS NULL");
    if (!st) return STORE_ERR;
    l->hooks = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 1;
    sqlite3_reset(st);
    return STORE_OK;
}

static int record_one(struct store_tx *tx, const struct outcome *o) {
    sqlite3_stmt *st;
    if (o->ok) {
        st = store_stmt(tx, "UPDATE webhook_deliveries SET state = 'delivered', attempts = "
                            "attempts + 1, last_status = ?2, last_error = NULL, delivered_at = ?3 "
                            "WHERE id = ?1");
    } else {
        st = store_stmt(tx, "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = "
                            "?2, last_error = ?4, next_at = ?5, state = CASE WHEN ?6 THEN "
                            "'failed' ELSE state END WHERE id = ?1 AND state = 'pending'");
    }
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, o->id);
    sqlite3_bind_int64(st, 2, o->status);
    if (o->ok) {
        sqlite3_bind_int64(st, 3, o->now);
    } else {
        sqlite3_bind_text(st, 4, o->error, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 5, o->next_at);
        sqlite3_bind_int(st, 6, o->give_up);
    }
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* Every outcome of the round in one transaction. */
static int record_outcomes(struct store_tx *tx, void *arg) {
    struct webhooks *w = arg;
    for (int i = 0; i < w->nout; i++)
        if (record_one(tx, &w->out[i]) != STORE_OK) return STORE_ERR;
    return STORE_OK;
}

static void commit_outcomes(struct webhooks *w) {
    if (!w->nout) return;
    if (store_write(w->ld->store, record_outcomes, w) != STORE_OK)
        log_error("webhooks: recording %d delivery outcomes failed; they are retried", w->nout);
    w->nout = 0;
}

static size_t discard(char *p, size_t size, size_t n, void *ud) {
    (void)p;
    (void)ud;
    return size * n;
}

/* The outcome (ok, HTTP status, error text) of the attempt in slot s, queued for the
 * next commit; frees the slot. */
static void finish(struct webhooks *w, struct slot *s, int ok, long status, const char *error) {
    struct loomd *ld = w->ld;
    struct due *d = &s->d;
    if (w->nout == w->capout) {
        int cap = w->capout ? w->capout * 2 : 64;
        struct outcome *o = realloc(w->out, sizeof *o * (size_t)cap);
        if (!o) { /* not recorded: the row stays pending and is sent again */
            log_error("webhooks: out of memory recording event %lld", (long long)d->seq);
            goto out;
        }
        w->out = o;
        w->capout = cap;
    }
    if (!w->nout) w->first_out_ms = clock_mono_ms();
    struct outcome *o = &w->out[w->nout++];
    memset(o, 0, sizeof *o);
    o->id = d->id;
    snprintf(o->webhook_id, sizeof o->webhook_id, "%s", d->webhook_id);
    o->ok = ok;
    o->status = status;
    snprintf(o->error, sizeof o->error, "%s", error ? error : "");
    o->now = store_now_ms();
    o->next_at = o->now + webhooks_backoff_ms(d->attempts + 1, ld->cfg.webhook_retry_base_ms);
    o->give_up = !ok && o->next_at - d->created_at > ld->cfg.webhook_retry_for * 1000;
    if (ok)
        log_debug("webhooks: event %lld delivered to %s (%ld)", (long long)d->seq, d->webhook_id,
                  status);
    else
        log_info("webhooks: event %lld to %s: attempt %d failed (%s)%s", (long long)d->seq,
                 d->webhook_id, d->attempts + 1, o->error, o->give_up ? "; giving up" : "");
    atomic_fetch_add(ok ? &w->attempts_ok : &w->attempts_failed, 1);
out:
    curl_slist_free_all(s->hdr);
    s->hdr = NULL;
    due_free(d);
    s->busy = 0;
}

/* Starts the attempt for d in a free slot (taking d's strings): re-checks
 * the URL's form, signs, adds the transfer. A failure before the transfer
 * (a bad URL, signing) is an outcome at once. No name is looked up here:
 * curl resolves it asynchronously and webhooks_open_socket checks each
 * address it connects to. */
static void start(struct webhooks *w, struct due *d) {
    struct loomd *ld = w->ld;
    struct slot *s = NULL;
    for (int i = 0; i < w->nslots && !s; i++)
        if (!w->slots[i].busy) s = &w->slots[i];
    if (!s) { /* cannot happen: callers count free slots */
        due_free(d);
        return;
    }
    s->busy = 1;
    s->d = *d;
    memset(d, 0, sizeof *d);
    d = &s->d;
    if (!d->body || !d->url || !d->secret) {
        finish(w, s, 0, 0, "could not build the request body");
        return;
    }
    char code[64], error[256];
    if (webhooks_check_url(d->url, ld->cfg.webhook_allow_private, 0, code, sizeof code, error,
                           sizeof error) != 0) {
        finish(w, s, 0, 0, error);
        return;
    }
    long long t = (long long)time(NULL);
    char sig[65], h_sig[128], h_id[64], h_del[64];
    if (webhooks_sign(d->secret, t, d->body, strlen(d->body), sig) != 0) {
        finish(w, s, 0, 0, "signing failed");
        return;
    }
    snprintf(h_sig, sizeof h_sig, "Loom-Signature: t=%lld,v1=%s", t, sig);
    snprintf(h_id, sizeof h_id, "Loom-Event-Id: %lld", (long long)d->seq);
    snprintf(h_del, sizeof h_del, "Loom-Delivery-Id: %lld", (long long)d->id);
    s->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    s->hdr = curl_slist_append(s->hdr, h_sig);
    s->hdr = curl_slist_append(s->hdr, h_id);
    s->hdr = curl_slist_append(s->hdr, h_del);
    s->hdr = curl_slist_append(s->hdr, "Expect:");
    s->sock.allow_private = ld->cfg.webhook_allow_private;
    s->sock.refused[0] = 0;
    CURL *curl = s->easy;
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_PRIVATE, s);
    curl_easy_setopt(curl, CURLOPT_URL, d->url);
    curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, webhooks_open_socket);
    curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, &s->sock);
    curl_easy_setopt(curl, CURLOPT_PROXY, ""); /* direct: the checked address is the target's */
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     ld->cfg.webhook_timeout < 5 ? ld->cfg.webhook_timeout * 1000L : 5000L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ld->cfg.webhook_timeout * 1000L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, s->hdr);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(d->body));
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "loomd-webhooks/1");
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
    if (!s->hdr || curl_multi_add_handle(w->multi, curl) != CURLM_OK) {
        finish(w, s, 0, 0, "libcurl could not start the request");
        return;
    }
    w->inflight++;
}

/* Collects the transfers that finished. */
static void reap(struct webhooks *w) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(w->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        struct slot *s = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&s);
        CURLcode rc = m->data.result;
        curl_multi_remove_handle(w->multi, m->easy_handle);
        w->inflight--;
        if (!s) continue;
        long status = 0;
        char error[256];
        int ok = 0;
        if (rc == CURLE_OK) {
            curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
            ok = status >= 200 && status < 300;
            snprintf(error, sizeof error, "HTTP %ld", status);
        } else if (s->sock.refused[0]) {
            snprintf(error, sizeof error,
                     "%s: the host resolves to %s, a loopback/private/reserved address "
                     "(loomd --webhook-allow-private permits it)",
                     curl_easy_strerror(rc), s->sock.refused);
        } else {
            snprintf(error, sizeof error, "%s", curl_easy_strerror(rc));
        }
        finish(w, s, ok, status, ok ? NULL : error);
    }
}

/* Fills free slots from the due rows. Returns the earliest future next_at
 * (0: none) or -1 when the read failed. */
static int64_t refill(struct webhooks *w) {
    int free_slots = w->nslots - w->inflight;
    if (free_slots <= 0) return 0;
    atomic_store(&w->force, 0); /* a kick from here on reads again */
    int nheld = w->inflight + w->nout;
    struct due_list l = {.w = w, .now = store_now_ms()};
    /* Held rows are still pending and come back from the read: leave room
     * for the most that one webhook holds. */
    l.per_hook = (int)w->ld->cfg.webhook_inflight_hook + max_held_per_hook(w);
    l.limit = free_slots + nheld;
    l.v = calloc((size_t)l.limit, sizeof *l.v);
    if (!l.v) return -1;
    if (store_read(w->ld->store, read_due, &l) != STORE_OK) {
        for (int i = 0; i < l.n; i++)
            due_free(&l.v[i]);
        free(l.v);
        return -1;
    }
    w->hooks = l.hooks;
    for (int i = 0; i < l.n; i++) {
        struct due *d = &l.v[i];
        if (w->inflight >= w->nslots ||
            hook_inflight(w, d->webhook_id) >= w->ld->cfg.webhook_inflight_hook) {
            due_free(d); /* picked up again when a slot frees */
            continue;
        }
        start(w, d);
    }
    free(l.v);
    return l.next_at;
}

/* Turns event commits into curl_multi_wakeup of the delivery thread. */
static void *waker_main(void *arg) {
    struct webhooks *w = arg;
    uint64_t gen = http_notify_gen(&w->ld->events->notify);
    while (!atomic_load(&w->stopping))
        if (http_wait(NULL, &w->ld->events->notify, &gen, 200) > 0) curl_multi_wakeup(w->multi);
    return NULL;
}

static void *delivery_main(void *arg) {
    struct webhooks *w = arg;
    struct loomd *ld = w->ld;
    int waker = 0;
    w->nslots = (int)ld->cfg.webhook_inflight;
    w->slots = calloc((size_t)w->nslots, sizeof *w->slots);
    w->multi = curl_multi_init();
    int ok = w->slots && w->multi;
    for (int i = 0; ok && i < w->nslots; i++)
        ok = (w->slots[i].easy = curl_easy_init()) != NULL;
    if (ok) {
        /* Idle keep-alive connections kept: one per slot. */
        curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long)w->nslots);
        ok = pthread_create(&w->waker, NULL, waker_main, w) == 0;
        waker = ok;
    }
    if (!ok) {
        /* Nothing is lost: the rows stay pending until a start that works. */
        log_error("webhooks: libcurl is unavailable; deliveries wait in the outbox");
        while (!atomic_load(&w->stopping))
            clock_sleep_ms(200);
    }
    uint64_t gen = http_notify_gen(&ld->events->notify) - 1; /* read at once */
    int64_t next_at = 0;
    int committed = 1;
    int64_t last_refill = 0; /* mono ms */
    while (ok && !atomic_load(&w->stopping)) {
        /* Commit the round: COMMIT_GAP_MS after its first outcome, or at
         * once when nothing else is in flight to join it. Slots freed
         * meanwhile are refilled after the commit (their rows are held
         * until then anyway). */
        if (w->nout && (!w->inflight || clock_mono_ms() - w->first_out_ms >= COMMIT_GAP_MS)) {
            commit_outcomes(w);
            committed = 1;
        }
        /* New events are read at once when idle; while attempts are in
         * flight, those committing within REFILL_GAP_MS of the last read
         * wait for the next one (a read per event would cost more than the
         * deliveries when the targets are busy). */
        uint64_t g = http_notify_gen(&ld->events->notify);
        int retry_due = next_at > 0 && next_at <= store_now_ms();
        int64_t since = clock_mono_ms() - last_refill;
        int events = g != gen && (!w->inflight || since >= REFILL_GAP_MS);
        if (events && w->hooks == 0 && !atomic_load(&w->force)) {
            gen = g; /* no webhook: these events made no outbox rows */
            events = 0;
        }
        events |= atomic_load(&w->force);
        if (w->inflight < w->nslots && (events || committed || retry_due)) {
            gen = g;
            committed = 0;
            last_refill = clock_mono_ms();
            int64_t n = refill(w);
            next_at = n < 0 ? store_now_ms() + 1000 : n; /* a failed read: again in 1 s */
        }
        int running = 0;
        if (w->inflight) curl_multi_perform(w->multi, &running);
        int before = w->nout;
        reap(w);
        if (w->nout != before) continue; /* an outcome: maybe the round ends */
        int timeout = IDLE_WAIT_MS;
        if (next_at > 0) {
            int64_t left = next_at - store_now_ms();
            if (left < timeout) timeout = left < 10 ? 10 : (int)left;
        }
        if (w->nout) {
            int64_t left = w->first_out_ms + COMMIT_GAP_MS - clock_mono_ms();
            if (left < timeout) timeout = left < 0 ? 0 : (int)left;
        }
        if (g != gen && w->inflight < w->nslots) { /* events deferred above */
            int64_t left = last_refill + REFILL_GAP_MS - clock_mono_ms();
            if (left < timeout) timeout = left < 0 ? 0 : (int)left;
        }
        curl_multi_poll(w->multi, NULL, 0, timeout, NULL);
    }
    /* Stopping: what finished is recorded; attempts still in flight are
     * abandoned unrecorded (their rows stay pending and go out after the
     * next start, with the same Loom-Event-Id). */
    if (ok) {
        reap(w);
        commit_outcomes(w);
    }
    atomic_store(&w->stopping, 1);
    if (waker) pthread_join(w->waker, NULL);
    for (int i = 0; w->slots && i < w->nslots; i++) {
        struct slot *s = &w->slots[i];
        if (s->busy && w->multi) curl_multi_remove_handle(w->multi, s->easy);
        if (s->easy) curl_easy_cleanup(s->easy);
        curl_slist_free_all(s->hdr);
        due_free(&s->d);
    }
    if (w->multi) curl_multi_cleanup(w->multi);
    free(w->slots);
    free(w->out);
    return NULL;
}

struct state_counts {
    long long n[4]; /* pending, delivered, failed, cancelled */
};
static const char *const delivery_states[4] = {"pending", "delivered", "failed", "cancelled"};

static int count_states(struct store_tx *tx, void *arg) {
    struct state_counts *c = arg;
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT state, COUNT(*) FROM webhook_deliveries GROUP BY state");
    if (!st) return STORE_ERR;
    while (sqlite3_step(st) == SQLITE_ROW)
        for (int i = 0; i < 4; i++)
            if (!strcmp((const char *)sqlite3_column_text(st, 0), delivery_states[i]))
                c->n[i] = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    return STORE_OK;
}

void webhooks_metrics_write(struct loomd *ld, FILE *f) {
    if (ld->events)
        fprintf(f,
                "# HELP loom_events_last_seq Seq of the newest committed event (GET /v1/events).\n"
                "# TYPE loom_events_last_seq gauge\nloom_events_last_seq %lld\n",
                (long long)atomic_load(&ld->events->last_seq));
    struct webhooks *w = ld->webhooks;
    if (!w) return;
    fprintf(f,
            "# HELP loom_webhook_attempts_total Webhook delivery attempts since start, by result.\n"
            "# TYPE loom_webhook_attempts_total counter\n"
            "loom_webhook_attempts_total{result=\"ok\"} %llu\n"
            "loom_webhook_attempts_total{result=\"failed\"} %llu\n",
            (unsigned long long)atomic_load(&w->attempts_ok),
            (unsigned long long)atomic_load(&w->attempts_failed));
    struct state_counts c = {{0}};
    if (store_read(ld->store, count_states, &c) != STORE_OK) return;
    fprintf(f, "# HELP loom_webhook_deliveries Webhook deliveries in the outbox, by state.\n"
               "# TYPE loom_webhook_deliveries gauge\n");
    for (int i = 0; i < 4; i++)
        fprintf(f, "loom_webhook_deliveries{state=\"%s\"} %lld\n", delivery_states[i], c.n[i]);
}

/* Only the flag: until an event commits there is nothing new to deliver,
 * and that event's wake-up (waker_main) then finds it set. */
void webhooks_kick(struct loomd *ld) {
    struct webhooks *w = ld->webhooks;
    if (w) atomic_store(&w->force, 1);
}

int webhooks_start(struct loomd *ld) {
    struct webhooks *w = calloc(1, sizeof *w);
    if (!w) return -1;
    w->ld = ld;
    w->hooks = -1;
    ld->webhooks = w;
    if (pthread_create(&w->thread, NULL, delivery_main, w) != 0) {
        log_error("webhooks: cannot start the delivery thread");
        return -1;
    }
    w->started = 1;
    return 0;
}

void webhooks_stop(struct loomd *ld) {
    struct webhooks *w = ld->webhooks;
    if (!w) return;
    atomic_store(&w->stopping, 1);
    if (ld->events) http_notify_signal(&ld->events->notify);
    if (w->started) pthread_join(w->thread, NULL);
    free(w);
    ld->webhooks = NULL;
}
