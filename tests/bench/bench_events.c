/* Benchmark (not a test): N subscribers on GET /v1/events while clients
 * submit jobs; reports the latency from an event's creation (its created_at,
 * set inside the transaction that commits it) to a subscriber holding it, as
 * p50/p99/max over every (event, subscriber) pair.
 *
 * Subscribers long-poll (a thread each, libcurl) or, with --sse, hold one
 * Server-Sent Events stream each, all read by one epoll thread over plain
 * sockets (HTTP/1.0, so the body is the raw stream): a thousand client
 * threads would compete with loomd for the same cores and measure the
 * benchmark's own scheduling rather than loomd's fan-out.
 *
 * Usage: bench_events LOOMD [--subscribers N] [--jobs J] [--rate PER_S]
 *                     [--submitters K] [--sse] [--dir DIR] [--loomd-arg ARG]...
 * (--loomd-arg: one more loomd argument, e.g. --loomd-arg --events-fanout-threads
 * --loomd-arg 4)
 * Results and the measuring conditions are in docs/perf.md. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon_harness.h"

#define ADMIN "bench-admin-token"

struct bench {
    const char *url;
    char token[128];
    int subscribers, jobs, rate, submitters, sse;
    _Atomic int done;
    struct paced_submits ps; /* the submitters (daemon_harness.h) */
    const char *spec;
    _Atomic long long last_seq; /* set once every submit was acknowledged */
    pthread_mutex_t mu;
    double *lat; /* ms */
    size_t nlat, cap;
};

/* "2026-12-01T10:26:20.873Z" -> ms since the epoch (0 when malformed). The
 * reader calls this for every (event, stream) pair, up to 500,000 times a
 * second on the cores loomd runs on: the digits are read in place, and
 * timegm runs once per distinct day (sscanf + timegm per frame was 14% of a
 * core in the benchmark's own profile). */
static int digits(const char *s, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static long long parse_ms(const char *s) {
    static __thread char day[10];
    static __thread long long day_ms = -1;
    if (!s || strlen(s) < 24 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
        s[16] != ':' || s[19] != '.' || s[23] != 'Z')
        return 0;
    if (day_ms < 0 || memcmp(day, s, 10) != 0) {
        struct tm tm = {0};
        tm.tm_year = digits(s, 4) - 1900;
        tm.tm_mon = digits(s + 5, 2) - 1;
        tm.tm_mday = digits(s + 8, 2);
        if (tm.tm_year < 0 || tm.tm_mon < 0 || tm.tm_mday < 1) return 0;
        day_ms = (long long)timegm(&tm) * 1000;
        memcpy(day, s, 10);
    }
    int h = digits(s + 11, 2), mi = digits(s + 14, 2), se = digits(s + 17, 2),
        ms = digits(s + 20, 3);
    if (h < 0 || mi < 0 || se < 0 || ms < 0) return 0;
    return day_ms + ((long long)(h * 60 + mi) * 60 + se) * 1000 + ms;
}

static void record(struct bench *b, double ms) {
    pthread_mutex_lock(&b->mu);
    if (b->nlat == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 4096;
        b->lat = realloc(b->lat, sizeof *b->lat * b->cap);
    }
    b->lat[b->nlat++] = ms;
    pthread_mutex_unlock(&b->mu);
}

static void *subscriber(void *arg) {
    struct bench *b = arg;
    long long since = 0;
    char path[128];
    for (;;) {
        long long stop = atomic_load(&b->last_seq);
        if (stop > 0 && since >= stop) break;
        snprintf(path, sizeof path, "/v1/events?since=%lld&wait=20&limit=1000", since);
        struct hresp r;
        if (hreq(b->url, "GET", path, b->token, NULL, NULL, 0, NULL, &r) != 0 || r.status != 200) {
            hresp_free(&r);
            break;
        }
        long long now = clock_wall_ms();
        size_t i;
        json_t *it;
        json_array_foreach(json_object_get(r.json, "items"), i, it) {
            long long at = parse_ms(json_string_value(json_object_get(it, "created_at")));
            record(b, (double)(now - at));
        }
        since = json_integer_value(json_object_get(r.json, "next"));
        hresp_free(&r);
    }
    hreq_thread_done();
    return NULL;
}

/* One SSE stream: its socket and the bytes of a line not yet complete. */
struct stream {
    int fd;
    char line[4096];
    size_t len;
    long long last_id;
};

static int sse_connect(struct bench *b, struct stream *st) {
    int port = 0;
    char host[64] = "";
    if (sscanf(b->url, "http://%63[^:]:%d", host, &port) != 2) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    st->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (st->fd < 0 || connect(st->fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET /v1/events?since=0 HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                     "Accept: text/event-stream\r\n\r\n",
                     host, b->token);
    if (write(st->fd, req, (size_t)n) != n) return -1;
    fcntl(st->fd, F_SETFL, fcntl(st->fd, F_GETFL) | O_NONBLOCK);
    return 0;
}

/* A complete line of a stream (the response head's lines pass through
 * too: they start with neither "id: " nor "data: "). */
static void sse_line(struct bench *b, struct stream *st, const char *line, long long now) {
    if (!strncmp(line, "id: ", 4)) st->last_id = atoll(line + 4);
    if (strncmp(line, "data: ", 6) != 0) return;
    const char *at = strstr(line, "\"created_at\":\"");
    if (at) record(b, (double)(now - parse_ms(at + 14)));
}

/* Reads every stream until each has seen the last seq (or 30 s pass after
 * the submits end). Returns the number of streams that got everything. */
static int sse_run(struct bench *b, struct stream *sts) {
    int ep = epoll_create1(0);
    for (int i = 0; i < b->subscribers; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, sts[i].fd, &e);
    }
    struct epoll_event evs[256];
    char buf[65536];
    long long end_at = 0;
    int complete = 0;
    for (;;) {
        long long stop = atomic_load(&b->last_seq);
        if (stop > 0) {
            complete = 0;
            for (int i = 0; i < b->subscribers; i++)
                complete += sts[i].last_id >= stop;
            if (complete == b->subscribers) break;
            if (!end_at) end_at = clock_mono_ms() + 30000;
            if (clock_mono_ms() > end_at) break;
        }
        int n = epoll_wait(ep, evs, 256, 100);
        long long now = clock_wall_ms();
        for (int k = 0; k < n; k++) {
            struct stream *st = &sts[evs[k].data.u32];
            ssize_t r;
            while ((r = read(st->fd, buf, sizeof buf - 1)) > 0) {
                /* Whole lines are parsed in place (memchr, not a byte loop:
                 * at 500 events/s to 1,000 streams the reader must keep up
                 * with half a million frames a second); only a line cut by
                 * the read boundary is copied. */
                buf[r] = 0;
                char *p = buf, *end = buf + r;
                while (p < end) {
                    char *nl = memchr(p, '\n', (size_t)(end - p));
                    size_t n = (size_t)((nl ? nl : end) - p);
                    if (st->len || !nl) {
                        size_t room = sizeof st->line - 1 - st->len;
                        memcpy(st->line + st->len, p, n < room ? n : room);
                        st->len += n < room ? n : room;
                    }
                    if (!nl) break;
                    if (st->len) {
                        st->line[st->len] = 0;
                        sse_line(b, st, st->line, now);
                        st->len = 0;
                    } else {
                        *nl = 0;
                        sse_line(b, st, p, now);
                    }
                    p = nl + 1;
                }
            }
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, st->fd, NULL);
            }
        }
    }
    close(ep);
    return complete;
}

/* Joins the submitters, then publishes the last seq: the submits' events
 * are seqs 1..acked (one job.queued each; nothing else runs). */
struct joiner_args {
    pthread_t *sub;
    int n;
    struct bench *b;
};
static void *join_submitters(void *arg) {
    struct joiner_args *j = arg;
    for (int i = 0; i < j->n; i++)
        pthread_join(j->sub[i], NULL);
    atomic_store(&j->b->last_seq, atomic_load(&j->b->ps.acked));
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_events LOOMD [--subscribers N] [--jobs J] [--rate R] "
                        "[--submitters K] [--sse] [--dir DIR] [--loomd-arg ARG]...\n");
        return 2;
    }
    struct bench b = {.subscribers = 100, .jobs = 500, .rate = 50, .submitters = 1};
    char dir[512] = "";
    const char *extra[32] = {"--conn-limit",     "4096", "--rate-limit",   "0",
                             "--tenant-streams", "4096", "--stream-limit", "3072"};
    int nextra = 8;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--sse")) {
            b.sse = 1;
            continue;
        }
        if (i + 1 >= argc) break;
        if (!strcmp(argv[i], "--subscribers")) b.subscribers = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--jobs")) b.jobs = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--rate")) b.rate = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--submitters")) b.submitters = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--dir")) snprintf(dir, sizeof dir, "%s", argv[i + 1]);
        if (!strcmp(argv[i], "--loomd-arg")) {
            if (nextra == 31) {
                fprintf(stderr, "too many --loomd-arg (at most 23)\n");
                return 2;
            }
            extra[nextra++] = argv[i + 1];
        }
        i++;
    }
    if (b.submitters < 1) b.submitters = 1;
    /* One descriptor per stream, here and in loomd. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (!dir[0]) snprintf(dir, sizeof dir, "/tmp/bench_events.%d", (int)getpid());
    pthread_mutex_init(&b.mu, NULL);
    struct loomd_proc p;
    extra[nextra] = NULL;
    if (loomd_spawn(&p, argv[1], dir, ADMIN, extra) != 0) return 1;
    b.url = p.url;
    char tenant[64];
    if (make_tenant(p.url, ADMIN, "bench", tenant, sizeof tenant, b.token, sizeof b.token) != 0)
        return 1;
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
    pthread_t *th = calloc((size_t)b.subscribers, sizeof *th);
    struct stream *sts = calloc((size_t)b.subscribers, sizeof *sts);
    for (int i = 0; i < b.subscribers; i++) {
        if (!b.sse) {
            pthread_create(&th[i], NULL, subscriber, &b);
        } else if (sse_connect(&b, &sts[i]) != 0) {
            fprintf(stderr, "stream %d: connect: %s\n", i, strerror(errno));
            return 1;
        }
    }
    clock_sleep_ms(b.sse ? 2000 : 500); /* every subscriber is waiting */
    double cpu0 = proc_cpu_ms(p.pid);
    pthread_t *sub = calloc((size_t)b.submitters, sizeof *sub);
    for (int i = 0; i < b.submitters; i++)
        pthread_create(&sub[i], NULL, paced_submit_main, &b.ps);
    /* The submitters set last_seq when done; the SSE reader runs here. */
    pthread_t waiter;
    int complete = 0;
    if (b.sse) {
        struct joiner_args j = {sub, b.submitters, &b};
        pthread_create(&waiter, NULL, join_submitters, &j);
        complete = sse_run(&b, sts);
        pthread_join(waiter, NULL);
        for (int i = 0; i < b.subscribers; i++)
            close(sts[i].fd);
    } else {
        for (int i = 0; i < b.submitters; i++)
            pthread_join(sub[i], NULL);
        /* The submits' events are seqs 1..ok (one job.queued each, nothing else runs). */
        atomic_store(&b.last_seq, atomic_load(&b.ps.acked));
        for (int i = 0; i < b.subscribers; i++)
            pthread_join(th[i], NULL);
        complete = b.subscribers;
    }
    int ok = atomic_load(&b.ps.acked);
    double cpu = proc_cpu_ms(p.pid) - cpu0;
    qsort(b.lat, b.nlat, sizeof *b.lat, cmp);
    size_t n = b.nlat;
    printf("%s subscribers %d (%d complete), jobs %d acknowledged of %d at %d/s by %d "
           "submitters: %zu deliveries (want %lld)\n",
           b.sse ? "SSE" : "long-poll", b.subscribers, complete, ok, b.jobs, b.rate, b.submitters,
           n, (long long)ok * b.subscribers);
    if (n)
        printf("event created -> subscriber has it: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
               b.lat[n / 2], b.lat[(size_t)(n * 0.99)], b.lat[n - 1]);
    printf("loomd CPU time: %.0f ms in all, %.2f ms per event, %.1f us per delivery\n", cpu,
           ok ? cpu / ok : 0.0, n ? cpu * 1000.0 / (double)n : 0.0);
    /* the benchmark's own share of the same cores: its reader and submitters */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        printf("benchmark CPU time (reader, submitters): %.0f ms\n",
               (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
                   (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3);
    loomd_signal_wait(&p, 15);
    free(th);
    free(sub);
    free(sts);
    free(b.lat);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return n == (size_t)ok * (size_t)b.subscribers ? 0 : 1;
}
