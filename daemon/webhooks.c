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

#define DUE_BATCH      16
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

int webhooks_check_url(const char *url, int allow_private, char *pin, size_t pinlen, char *code,
                       size_t codelen, char *msg, size_t msglen) {
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
    char first[INET6_ADDRSTRLEN] = "";
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
        if (!first[0]) snprintf(first, sizeof first, "%s", text);
    }
    if (pin) {
        int v6 = strchr(first, ':') != NULL;
        snprintf(pin, pinlen, "%s:%s:%s%s%s", name, port, v6 ? "[" : "", first, v6 ? "]" : "");
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

int64_t webhooks_backoff_ms(int attempts, int64_t base_ms) {
    if (attempts < 1) attempts = 1;
    int64_t d = base_ms;
    for (int i = 1; i < attempts && d < MAX_BACKOFF_MS; i++)
        d *= 2;
    return d < MAX_BACKOFF_MS ? d : MAX_BACKOFF_MS;
}

/* ---------------- the delivery thread ---------------- */

struct webhooks {
    struct loomd *ld;
    pthread_t thread;
    int started;
    _Atomic int stopping;
    _Atomic uint64_t attempts_ok, attempts_failed;
};

struct due {
    int64_t id, seq, created_at;
    int attempts;
    char webhook_id[32];
    char *url, *secret, *body;
};

struct due_list {
    int64_t now;
    struct due v[DUE_BATCH];
    int n;
    int64_t next_at; /* earliest future next_at (0: none) */
};

static int read_due(struct store_tx *tx, void *arg) {
    struct due_list *l = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT d.id, d.webhook_id, d.event_seq, d.attempts, d.created_at, w.url, w.secret, "
            "e.type, e.created_at, e.data FROM webhook_deliveries d JOIN webhooks w ON w.id = "
            "d.webhook_id JOIN events e ON e.seq = d.event_seq WHERE d.state = 'pending' AND "
            "d.next_at <= ?1 ORDER BY d.next_at, d.id LIMIT ?2");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, l->now);
    sqlite3_bind_int(st, 2, DUE_BATCH);
    while (sqlite3_step(st) == SQLITE_ROW && l->n < DUE_BATCH) {
        struct due *d = &l->v[l->n];
        memset(d, 0, sizeof *d);
        d->id = sqlite3_column_int64(st, 0);
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
    st = store_stmt(tx, "SELECT MIN(next_at) FROM webhook_deliveries WHERE state = 'pending'");
    if (st && sqlite3_step(st) == SQLITE_ROW) l->next_at = sqlite3_column_int64(st, 0);
    if (st) sqlite3_reset(st);
    return STORE_OK;
}

struct outcome {
    int64_t id;
    int ok, give_up;
    long status;
    char error[256];
    int64_t now, next_at;
};

static int record_outcome(struct store_tx *tx, void *arg) {
    struct outcome *o = arg;
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

static size_t discard(char *p, size_t size, size_t n, void *ud) {
    (void)p;
    (void)ud;
    return size * n;
}

static int abort_on_stop(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    struct webhooks *w = ud;
    return atomic_load(&w->stopping) ? 1 : 0;
}

/* One attempt: re-check the target, sign, POST. */
static void deliver(struct webhooks *w, CURL *curl, const struct due *d, struct outcome *o) {
    struct loomd *ld = w->ld;
    char pin[400], code[64];
    o->status = 0;
    o->ok = 0;
    if (!d->body) {
        snprintf(o->error, sizeof o->error, "could not build the request body");
        return;
    }
    if (webhooks_check_url(d->url, ld->cfg.webhook_allow_private, pin, sizeof pin, code,
                           sizeof code, o->error, sizeof o->error) != 0)
        return;
    long long t = (long long)time(NULL);
    char sig[65], h_sig[128], h_id[64], h_del[64];
    if (webhooks_sign(d->secret, t, d->body, strlen(d->body), sig) != 0) {
        snprintf(o->error, sizeof o->error, "signing failed");
        return;
    }
    snprintf(h_sig, sizeof h_sig, "Loom-Signature: t=%lld,v1=%s", t, sig);
    snprintf(h_id, sizeof h_id, "Loom-Event-Id: %lld", (long long)d->seq);
    snprintf(h_del, sizeof h_del, "Loom-Delivery-Id: %lld", (long long)d->id);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, h_sig);
    hdr = curl_slist_append(hdr, h_id);
    hdr = curl_slist_append(hdr, h_del);
    hdr = curl_slist_append(hdr, "Expect:");
    struct curl_slist *resolve = curl_slist_append(NULL, pin);
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, d->url);
    curl_easy_setopt(curl, CURLOPT_RESOLVE, resolve);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     ld->cfg.webhook_timeout < 5 ? ld->cfg.webhook_timeout * 1000L : 5000L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ld->cfg.webhook_timeout * 1000L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(d->body));
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "loomd-webhooks/1");
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, abort_on_stop);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, w);
    CURLcode rc = curl_easy_perform(curl);
    if (rc == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &o->status);
        o->ok = o->status >= 200 && o->status < 300;
        if (!o->ok) snprintf(o->error, sizeof o->error, "HTTP %ld", o->status);
    } else {
        snprintf(o->error, sizeof o->error, "%s", curl_easy_strerror(rc));
    }
    curl_slist_free_all(hdr);
    curl_slist_free_all(resolve);
}

static void due_clear(struct due_list *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].url);
        free(l->v[i].secret);
        free(l->v[i].body);
    }
    l->n = 0;
}

static void *delivery_main(void *arg) {
    struct webhooks *w = arg;
    struct loomd *ld = w->ld;
    CURL *curl = curl_easy_init();
    uint64_t gen = http_notify_gen(&ld->events->notify);
    while (!atomic_load(&w->stopping)) {
        struct due_list l = {.now = store_now_ms()};
        if (store_read(ld->store, read_due, &l) != STORE_OK) l.n = 0;
        for (int i = 0; i < l.n && !atomic_load(&w->stopping); i++) {
            struct due *d = &l.v[i];
            struct outcome o = {.id = d->id};
            if (curl)
                deliver(w, curl, d, &o);
            else
                snprintf(o.error, sizeof o.error, "libcurl is unavailable");
            if (atomic_load(&w->stopping) && !o.ok) break; /* aborted: retried on start */
            o.now = store_now_ms();
            o.next_at = o.now + webhooks_backoff_ms(d->attempts + 1, ld->cfg.webhook_retry_base_ms);
            o.give_up = !o.ok && o.next_at - d->created_at > ld->cfg.webhook_retry_for * 1000;
            if (o.ok)
                log_debug("webhooks: event %lld delivered to %s (%ld)", (long long)d->seq,
                          d->webhook_id, o.status);
            else
                log_info("webhooks: event %lld to %s: attempt %d failed (%s)%s", (long long)d->seq,
                         d->webhook_id, d->attempts + 1, o.error, o.give_up ? "; giving up" : "");
            store_write(ld->store, record_outcome, &o);
            atomic_fetch_add(o.ok ? &w->attempts_ok : &w->attempts_failed, 1);
        }
        int full = l.n == DUE_BATCH;
        due_clear(&l);
        if (full) continue;
        /* Sleep until a new event commits, the next retry is due, or 1 s. */
        int64_t wait = 1000;
        if (l.next_at > 0) {
            int64_t left = l.next_at - store_now_ms();
            if (left < wait) wait = left < 10 ? 10 : left;
        }
        http_wait(NULL, &ld->events->notify, &gen, (int)wait);
    }
    curl_easy_cleanup(curl);
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

int webhooks_start(struct loomd *ld) {
    struct webhooks *w = calloc(1, sizeof *w);
    if (!w) return -1;
    w->ld = ld;
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
