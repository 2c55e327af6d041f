/* Benchmark: webhook delivery throughput and latency through loomd's outbox.
 *
 * K loopback HTTP/1.1 receivers (one epoll thread serves them all, with
 * keep-alive, so the receivers cost little of the cores loomd runs on) verify
 * every Loom-Signature with libcrypto's HMAC and answer 200; W webhooks
 * subscribed to job.queued point at them round-robin (webhook i at receiver
 * i % K, path /h/i); J jobs are submitted at R per second. Reported:
 * deliveries per second (first submit to the last (event, webhook) pair
 * received), the latency from an event's created_at to its receipt
 * (p50/p99/max, separately for fast and slow receivers), loomd's CPU time per
 * delivery (/proc/PID/stat) and duplicates. Exits 1 unless every (event,
 * webhook) pair arrived at least once with a valid signature and matching
 * Loom-Event-Id before --timeout-s.
 *
 * --slow N: the first N receivers answer each request after --slow-ms (2000)
 * ms, to show whether one slow target holds up the others (the fast
 * receivers' latency is reported on its own line).
 * --backlog 1: the receivers answer nothing until every submit was
 * acknowledged; deliveries/s and loomd's CPU then measure draining the
 * outbox alone, not the submits (latencies include the wait).
 *
 * The HTTP server is written here rather than taken from libmicrohttpd so
 * that the bench controls exactly when a slow receiver answers (a timer per
 * connection in the epoll loop) without a thread per connection.
 *
 * Usage: bench_webhooks LOOMD [--receivers K] [--webhooks W] [--jobs J]
 *                      [--rate R] [--submitters S] [--slow N] [--slow-ms MS]
 *                      [--backlog 0|1] [--timeout-s S] [--dir DIR]
 *                      [--loomd-arg ARG]...
 * Results and the measuring conditions are in docs/perf.md. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon_harness.h"

#define ADMIN     "bench-admin-token"
#define SECRET    "bench-webhook-secret-0123456789"
#define CONN_BUF  65536
#define MAX_CONNS 4096

struct lat {
    double *v;
    size_t n, cap;
};

struct conn {
    int fd, rx; /* receiver index */
    char buf[CONN_BUF];
    size_t len;
    long long reply_at; /* mono ms when the held reply goes out (0: none) */
};

struct bench {
    const char *url;
    char token[128];
    int receivers, webhooks, jobs, rate, submitters, slow, slow_ms, timeout_s, backlog;
    const char *spec;
    struct paced_submits ps; /* the submitters (daemon_harness.h) */
    _Atomic int stop;
    int lfd[256];
    /* Written by the server thread only; read by main after it joined. */
    unsigned char *seen; /* [seq][webhook] receipt counts (saturating) */
    long long seen_seqs;
    _Atomic long long unique;     /* distinct (event, webhook) pairs */
    _Atomic long long last_rx_ms; /* wall ms of the newest new pair */
    long long requests, dups, bad_sig, bad_req, accepted;
    struct lat fast, slowl;
    struct conn *conns[MAX_CONNS];
};

static void lat_add(struct lat *l, double ms) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->v = realloc(l->v, sizeof *l->v * l->cap);
    }
    l->v[l->n++] = ms;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void lat_print(const char *name, struct lat *l) {
    if (!l->n) return;
    qsort(l->v, l->n, sizeof *l->v, cmp);
    printf("%s: %zu receipts, event created -> received: p50 %.1f ms, p99 %.1f ms, max %.1f "
           "ms\n",
           name, l->n, l->v[l->n / 2], l->v[(size_t)((double)l->n * 0.99)], l->v[l->n - 1]);
}

/* "2026-12-01T10:26:20.873Z" -> ms since the epoch (0 when malformed). */
static long long parse_ms(const char *s) {
    struct tm tm = {0};
    int ms = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (long long)timegm(&tm) * 1000 + ms;
}

/* Value of header `name` in the request head [h, end) into out; 0 or -1. */
static int header(const char *h, const char *end, const char *name, char *out, size_t outlen) {
    size_t nl = strlen(name);
    for (const char *p = h; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        if ((size_t)(eol - p) > nl + 1 && !strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (v < eol && *v == ' ')
                v++;
            size_t n = (size_t)(eol - v);
            if (n && v[n - 1] == '\r') n--;
            if (n >= outlen) return -1;
            memcpy(out, v, n);
            out[n] = 0;
            return 0;
        }
        p = eol + 1;
    }
    return -1;
}

static void mark(struct bench *b, long long seq, int hook, double lat_ms, int slow) {
    if (seq < 1 || hook < 0 || hook >= b->webhooks) {
        b->bad_req++;
        return;
    }
    if (seq >= b->seen_seqs) {
        long long n = seq * 2 + 64;
        b->seen = realloc(b->seen, (size_t)(n * b->webhooks));
        memset(b->seen + b->seen_seqs * b->webhooks, 0, (size_t)((n - b->seen_seqs) * b->webhooks));
        b->seen_seqs = n;
    }
    unsigned char *c = &b->seen[seq * b->webhooks + hook];
    if (*c) {
        b->dups++;
    } else {
        atomic_fetch_add(&b->unique, 1);
        atomic_store(&b->last_rx_ms, clock_wall_ms());
        lat_add(slow ? &b->slowl : &b->fast, lat_ms);
    }
    if (*c < 255) (*c)++;
}

/* One complete request at c->buf of head length hl and body length bl:
 * verify it and record the receipt. */
static void handle(struct bench *b, struct conn *c, size_t hl, size_t bl) {
    long long now = clock_wall_ms();
    b->requests++;
    const char *h = c->buf, *end = c->buf + hl, *body = c->buf + hl;
    int hook = -1;
    if (sscanf(h, "POST /h/%d ", &hook) != 1) {
        b->bad_req++;
        return;
    }
    char sig[256], eid[64], t[32] = "", v1[80] = "";
    if (header(h, end, "Loom-Signature", sig, sizeof sig) != 0 ||
        header(h, end, "Loom-Event-Id", eid, sizeof eid) != 0 ||
        sscanf(sig, "t=%31[0-9],v1=%79[0-9a-f]", t, v1) != 2) {
        b->bad_sig++;
        return;
    }
    /* HMAC-SHA256(secret, "<t>.<body>"), computed here with libcrypto. */
    size_t tl = strlen(t), ml = tl + 1 + bl;
    unsigned char *msg = malloc(ml);
    memcpy(msg, t, tl);
    msg[tl] = '.';
    memcpy(msg + tl + 1, body, bl);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;
    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), msg, ml, mac, &maclen);
    free(msg);
    char hex[65];
    for (unsigned i = 0; i < maclen && i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    long long ts = atoll(t);
    if (maclen != 32 || strcmp(hex, v1) != 0 || llabs(now / 1000 - ts) > 300) {
        b->bad_sig++;
        return;
    }
    /* The body: {"id":SEQ,"type":"job.queued","created_at":"...","data":{...}} */
    char tmp[CONN_BUF];
    memcpy(tmp, body, bl);
    tmp[bl] = 0;
    long long seq = -1;
    const char *ca = strstr(tmp, "\"created_at\":\"");
    if (sscanf(tmp, "{\"id\":%lld,", &seq) != 1 || seq != atoll(eid) || !ca ||
        !strstr(tmp, "\"type\":\"job.queued\"")) {
        b->bad_req++;
        return;
    }
    long long at = parse_ms(ca + 14);
    mark(b, seq, hook, (double)(now - at), c->rx < b->slow);
}

static const char REPLY[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

static void conn_close(struct bench *b, int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    for (int i = 0; i < MAX_CONNS; i++)
        if (b->conns[i] == c) b->conns[i] = NULL;
    free(c);
}

/* Parses and answers the complete requests buffered on c; a slow receiver
 * holds its reply (and reads nothing more) until reply_at. -1: close it. */
static int serve(struct bench *b, struct conn *c) {
    while (!c->reply_at) {
        char *he = memmem(c->buf, c->len, "\r\n\r\n", 4);
        if (!he) return c->len == sizeof c->buf ? -1 : 0;
        size_t hl = (size_t)(he - c->buf) + 4;
        char cl[32];
        size_t bl = header(c->buf, he, "Content-Length", cl, sizeof cl) == 0 ? (size_t)atol(cl) : 0;
        if (hl + bl > sizeof c->buf - 1) return -1;
        if (c->len < hl + bl) return 0;
        handle(b, c, hl, bl);
        memmove(c->buf, c->buf + hl + bl, c->len - hl - bl);
        c->len -= hl + bl;
        if (c->rx < b->slow) {
            c->reply_at = clock_mono_ms() + b->slow_ms;
            return 0;
        }
        if (write(c->fd, REPLY, sizeof REPLY - 1) != (ssize_t)(sizeof REPLY - 1)) return -1;
    }
    return 0;
}

static void *server(void *arg) {
    struct bench *b = arg;
    int ep = epoll_create1(0);
    for (int i = 0; i < b->receivers; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, b->lfd[i], &e);
    }
    struct epoll_event evs[256];
    while (!atomic_load(&b->stop)) {
        /* Held replies that are due go out; the wait ends at the next one. */
        long long now = clock_mono_ms(), next = now + 100;
        for (int i = 0; i < MAX_CONNS; i++) {
            struct conn *c = b->conns[i];
            if (!c || !c->reply_at) continue;
            if (c->reply_at <= now) {
                c->reply_at = 0;
                if (write(c->fd, REPLY, sizeof REPLY - 1) != (ssize_t)(sizeof REPLY - 1) ||
                    serve(b, c) != 0)
                    conn_close(b, ep, c);
            } else if (c->reply_at < next) {
                next = c->reply_at;
            }
        }
        int n = epoll_wait(ep, evs, 256, (int)(next - now));
        for (int k = 0; k < n; k++) {
            uint64_t tag = evs[k].data.u64;
            if (tag < 256) { /* a listening socket */
                int fd = accept4(b->lfd[tag], NULL, NULL, SOCK_NONBLOCK);
                if (fd < 0) continue;
                int slot = -1;
                for (int i = 0; i < MAX_CONNS && slot < 0; i++)
                    if (!b->conns[i]) slot = i;
                if (slot < 0) {
                    close(fd);
                    continue;
                }
                b->accepted++;
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct conn *c = calloc(1, sizeof *c);
                c->fd = fd;
                c->rx = (int)tag;
                b->conns[slot] = c;
                struct epoll_event e = {.events = EPOLLIN, .data.u64 = 256 + (uint64_t)slot};
                epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                continue;
            }
            struct conn *c = b->conns[tag - 256];
            if (!c) continue;
            ssize_t r = 1;
            int dead = 0;
            while (c->len < sizeof c->buf &&
                   (r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len)) != 0) {
                if (r < 0) {
                    dead = errno != EAGAIN && errno != EWOULDBLOCK;
                    break;
                }
                c->len += (size_t)r;
            }
            if (r == 0) dead = 1;
            if (serve(b, c) != 0) dead = 1;
            if (dead) conn_close(b, ep, c);
        }
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (b->conns[i]) conn_close(b, ep, b->conns[i]);
    close(ep);
    return NULL;
}

static int listen_loopback(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        return -1;
    *port = ntohs(sa.sin_port);
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_webhooks LOOMD [--receivers K] [--webhooks W] [--jobs J] "
                        "[--rate R] [--submitters S] [--slow N] [--slow-ms MS] [--backlog 0|1] "
                        "[--timeout-s S] "
                        "[--dir DIR] [--loomd-arg ARG]...\n");
        return 2;
    }
    static struct bench b = {.receivers = 4,
                             .webhooks = 8,
                             .jobs = 500,
                             .rate = 100,
                             .submitters = 2,
                             .slow_ms = 2000,
                             .timeout_s = 120};
    char dir[512] = "";
    const char *extra[40] = {"--conn-limit", "4096", "--rate-limit", "0",
                             "--webhook-allow-private"};
    int nextra = 5;
    for (int i = 2; i < argc; i += 2) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_webhooks: option '%s' needs a value\n", k);
            return 2;
        }
        if (!strcmp(k, "--receivers"))
            b.receivers = atoi(v);
        else if (!strcmp(k, "--webhooks"))
            b.webhooks = atoi(v);
        else if (!strcmp(k, "--jobs"))
            b.jobs = atoi(v);
        else if (!strcmp(k, "--rate"))
            b.rate = atoi(v);
        else if (!strcmp(k, "--submitters"))
            b.submitters = atoi(v);
        else if (!strcmp(k, "--slow"))
            b.slow = atoi(v);
        else if (!strcmp(k, "--slow-ms"))
            b.slow_ms = atoi(v);
        else if (!strcmp(k, "--backlog"))
            b.backlog = atoi(v);
        else if (!strcmp(k, "--timeout-s"))
            b.timeout_s = atoi(v);
        else if (!strcmp(k, "--dir"))
            snprintf(dir, sizeof dir, "%s", v);
        else if (!strcmp(k, "--loomd-arg") && nextra < 39)
            extra[nextra++] = v;
        else {
            fprintf(stderr, "bench_webhooks: unknown option '%s'\n", k);
            return 2;
        }
    }
    if (b.receivers < 1 || b.receivers > 256 || b.webhooks < 1 || b.webhooks > 100 || b.jobs < 1 ||
        b.rate < 1 || b.submitters < 1 || b.slow < 0 || b.slow > b.receivers) {
        fprintf(stderr, "bench_webhooks: need 1 <= receivers <= 256, 1 <= webhooks <= 100 (the "
                        "per-tenant limit), jobs, rate, submitters >= 1, 0 <= slow <= "
                        "receivers\n");
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (!dir[0]) snprintf(dir, sizeof dir, "/tmp/bench_webhooks.%d", (int)getpid());
    int ports[256];
    for (int i = 0; i < b.receivers; i++)
        if ((b.lfd[i] = listen_loopback(&ports[i])) < 0) {
            fprintf(stderr, "receiver %d: %s\n", i, strerror(errno));
            return 1;
        }
    struct loomd_proc p;
    extra[nextra] = NULL;
    if (loomd_spawn(&p, argv[1], dir, ADMIN, extra) != 0) return 1;
    b.url = p.url;
    int rc = 1;
    char tenant[64];
    if (make_tenant(p.url, ADMIN, "bench", tenant, sizeof tenant, b.token, sizeof b.token) != 0)
        goto out;
    for (int i = 0; i < b.webhooks; i++) {
        char body[256];
        int n = snprintf(body, sizeof body,
                         "{\"url\":\"http://127.0.0.1:%d/h/%d\",\"events\":[\"job.queued\"],"
                         "\"secret\":\"%s\"}",
                         ports[i % b.receivers], i, SECRET);
        struct hresp r;
        int ok =
            hreq(p.url, "POST", "/v1/webhooks", b.token, NULL, body, (size_t)n, NULL, &r) == 0 &&
            r.status == 201;
        if (!ok) fprintf(stderr, "create webhook %d: %ld %s\n", i, r.status, r.body ? r.body : "");
        hresp_free(&r);
        if (!ok) goto out;
    }
    char data[600], spec[1200];
    snprintf(data, sizeof data, "%s/train.bin", dir);
    FILE *df = fopen(data, "w");
    if (df) fclose(df);
    snprintf(
        spec, sizeof spec,
        "{\"name\":\"b\",\"model\":{\"family\":\"gpt2\",\"n_layer\":2,\"n_head\":2,\"d_model\":64,"
        "\"d_ff\":256,\"vocab_size\":256,\"seq_len\":32},\"data\":{\"train\":\"%s\"},"
        "\"parallel\":{\"dp\":1},\"train\":{\"steps\":1,\"global_batch_tokens\":128,"
        "\"micro_batch\":4,\"precision\":\"fp32\"},\"resources\":{\"device\":\"cpu\","
        "\"gpus_per_node\":1}}",
        data);
    b.spec = spec;
    b.ps = (struct paced_submits){
        .url = b.url, .token = b.token, .spec = spec, .jobs = b.jobs, .rate = b.rate};
    pthread_t srv;
    if (!b.backlog) pthread_create(&srv, NULL, server, &b);
    double cpu0 = proc_cpu_ms(p.pid);
    long long t0 = clock_wall_ms();
    pthread_t *sub = calloc((size_t)b.submitters, sizeof *sub);
    for (int i = 0; i < b.submitters; i++)
        pthread_create(&sub[i], NULL, paced_submit_main, &b.ps);
    for (int i = 0; i < b.submitters; i++)
        pthread_join(sub[i], NULL);
    free(sub);
    double submit_s = (double)(clock_wall_ms() - t0) / 1000.0;
    if (b.backlog) {
        /* Every event is in the outbox; the receivers start answering now
         * and the clock (and loomd's CPU) count the drain alone. */
        cpu0 = proc_cpu_ms(p.pid);
        t0 = clock_wall_ms();
        pthread_create(&srv, NULL, server, &b);
    }
    long long want = (long long)atomic_load(&b.ps.acked) * b.webhooks;
    long long deadline = clock_mono_ms() + (long long)b.timeout_s * 1000;
    while (atomic_load(&b.unique) < want && clock_mono_ms() < deadline)
        clock_sleep_ms(20);
    double cpu = proc_cpu_ms(p.pid) - cpu0;
    clock_sleep_ms(500); /* late duplicates still count */
    atomic_store(&b.stop, 1);
    pthread_join(srv, NULL);
    long long got = atomic_load(&b.unique);
    double secs = (double)(atomic_load(&b.last_rx_ms) - t0) / 1000.0;
    printf("receivers %d (%d slow, %d ms), webhooks %d, jobs %d acknowledged of %d at %d/s: "
           "%lld of %lld (event, webhook) pairs received, %lld requests on %lld connections, "
           "%lld duplicates, %lld bad signatures, %lld bad requests\n",
           b.receivers, b.slow, b.slow ? b.slow_ms : 0, b.webhooks, atomic_load(&b.ps.acked),
           b.jobs, b.rate, got, want, b.requests, b.accepted, b.dups, b.bad_sig, b.bad_req);
    printf("throughput: %.1f deliveries/s (%lld in %.2f s from the %s to the last new "
           "receipt; the submits took %.2f s)\n",
           secs > 0 ? (double)got / secs : 0.0, got, secs,
           b.backlog ? "receivers' start after every submit" : "first submit", submit_s);
    lat_print(b.slow ? "fast receivers" : "all receivers", &b.fast);
    if (b.slow) lat_print("slow receivers", &b.slowl);
    printf("loomd CPU time: %.0f ms in all, %.1f us per delivery\n", cpu,
           got ? cpu * 1000.0 / (double)got : 0.0);
    rc = got == want && b.bad_sig == 0 && b.bad_req == 0 && want > 0 ? 0 : 1;
    if (rc) fprintf(stderr, "bench_webhooks: FAIL: not every pair arrived signed and intact\n");
out:
    loomd_signal_wait(&p, 15);
    for (int i = 0; i < b.receivers; i++)
        close(b.lfd[i]);
    free(b.seen);
    free(b.fast.v);
    free(b.slowl.v);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
