/* Benchmark (not a test): N long-poll subscribers on GET /v1/events while a
 * client submits jobs; reports the latency from an event's creation (its
 * created_at, set inside the transaction that commits it) to a subscriber
 * holding the reply, as p50/p99/max over every (event, subscriber) pair.
 *
 * Usage: bench_events LOOMD [--subscribers N] [--jobs J] [--rate PER_S] [--dir DIR]
 * Results and the measuring conditions are in docs/perf.md. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon_harness.h"

#define ADMIN "bench-admin-token"

struct bench {
    const char *url;
    char token[128];
    int subscribers, jobs, rate;
    _Atomic int done;
    _Atomic long long last_seq; /* set once every submit was acknowledged */
    pthread_mutex_t mu;
    double *lat; /* ms */
    size_t nlat, cap;
};

/* "2026-12-01T10:26:20.873Z" -> ms since the epoch. */
static long long parse_ms(const char *s) {
    struct tm tm = {0};
    int ms = 0;
    if (!s || sscanf(s, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (long long)timegm(&tm) * 1000 + ms;
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
            pthread_mutex_lock(&b->mu);
            if (b->nlat == b->cap) {
                b->cap = b->cap ? b->cap * 2 : 4096;
                b->lat = realloc(b->lat, sizeof *b->lat * b->cap);
            }
            b->lat[b->nlat++] = (double)(now - at);
            pthread_mutex_unlock(&b->mu);
        }
        since = json_integer_value(json_object_get(r.json, "next"));
        hresp_free(&r);
    }
    hreq_thread_done();
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_events LOOMD [--subscribers N] [--jobs J] [--rate R] "
                        "[--dir DIR]\n");
        return 2;
    }
    struct bench b = {.subscribers = 100, .jobs = 500, .rate = 50};
    char dir[512] = "";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--subscribers")) b.subscribers = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--jobs")) b.jobs = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--rate")) b.rate = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--dir")) snprintf(dir, sizeof dir, "%s", argv[i + 1]);
    }
    if (!dir[0]) snprintf(dir, sizeof dir, "/tmp/bench_events.%d", (int)getpid());
    pthread_mutex_init(&b.mu, NULL);
    struct loomd_proc p;
    const char *extra[] = {"--conn-limit", "4096", "--rate-limit", "0", NULL};
    if (loomd_spawn(&p, argv[1], dir, ADMIN, extra) != 0) return 1;
    b.url = p.url;
    char tenant[64];
    if (make_tenant(p.url, ADMIN, "bench", tenant, sizeof tenant, b.token, sizeof b.token) != 0)
        return 1;
    pthread_t *th = calloc((size_t)b.subscribers, sizeof *th);
    for (int i = 0; i < b.subscribers; i++)
        pthread_create(&th[i], NULL, subscriber, &b);
    clock_sleep_ms(500); /* every subscriber is waiting */
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
    double t0 = clock_mono_msf();
    int ok = 0;
    for (int k = 0; k < b.jobs; k++) {
        double due = t0 + 1000.0 * k / b.rate;
        while (clock_mono_msf() < due)
            clock_sleep_us(200);
        struct hresp r;
        if (hreq(p.url, "POST", "/v1/jobs", b.token, NULL, spec, strlen(spec), NULL, &r) == 0 &&
            r.status == 201)
            ok++;
        hresp_free(&r);
    }
    /* The submits' events are seqs 1..ok (one job.queued each, nothing else runs). */
    atomic_store(&b.last_seq, ok);
    for (int i = 0; i < b.subscribers; i++)
        pthread_join(th[i], NULL);
    qsort(b.lat, b.nlat, sizeof *b.lat, cmp);
    size_t n = b.nlat;
    printf("subscribers %d, jobs %d acknowledged of %d at %d/s: %zu deliveries (want %lld)\n",
           b.subscribers, ok, b.jobs, b.rate, n, (long long)ok * b.subscribers);
    if (n)
        printf("event created -> subscriber has it: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
               b.lat[n / 2], b.lat[(size_t)(n * 0.99)], b.lat[n - 1]);
    loomd_signal_wait(&p, 15);
    free(th);
    free(b.lat);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return n == (size_t)ok * (size_t)b.subscribers ? 0 : 1;
}
