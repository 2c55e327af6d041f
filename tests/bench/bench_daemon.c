/* Benchmark of loomd (not a timed test): starts the real loomd on a loopback
 * port and measures, with keep-alive libcurl clients,
 *   1. durable submissions per second with 1 and with 8 concurrent clients,
 *   2. after filling the store to N jobs (default 100,000):
 *      GET /v1/jobs/{id} p50/p99 and first-page GET /v1/jobs p50/p99.
 * Usage: bench_daemon LOOMD [--jobs N] [--seconds S] [--dir DIR] [-- loomd args...]
 * Goals on a 2-core machine: >= 2,000 submissions/s with 8 clients,
 * GET p99 <= 5 ms, list p99 <= 20 ms. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon_harness.h"

static const char *ADMIN = "bench-admin";
static pid_t loomd_pid;

/* loomd's CPU time (s) so far (daemon_harness.h proc_cpu_ms): the cost
 * measure on a shared machine. */
static double loomd_cpu_s(void) {
    return proc_cpu_ms(loomd_pid) / 1000.0;
}
static char url[128], token[128], spec[1024];

struct worker {
    int mode; /* 0 submit, 1 get, 2 list */
    double until;
    long target; /* submit: stop after this many (0 = time only) */
    _Atomic long *shared_count;
    long done, errors;
    double *lat; /* ms */
    long nlat, cap;
    char (*ids)[16];
    long nids;
    unsigned seed;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    char path[128];
    while (clock_mono_s() < w->until) {
        if (w->mode == 0 && w->target && atomic_fetch_add(w->shared_count, 1) >= w->target) break;
        struct hresp r;
        double t0 = clock_mono_s();
        int rc;
        if (w->mode == 0) {
            rc = hreq(url, "POST", "/v1/jobs", token, NULL, spec, strlen(spec), NULL, &r);
        } else if (w->mode == 1) {
            snprintf(path, sizeof path, "/v1/jobs/%s", w->ids[rand_r(&w->seed) % w->nids]);
            rc = hreq(url, "GET", path, token, NULL, NULL, 0, NULL, &r);
        } else {
            rc = hreq(url, "GET", "/v1/jobs", token, NULL, NULL, 0, NULL, &r);
        }
        double ms = (clock_mono_s() - t0) * 1e3;
        int ok = rc == 0 && r.status == (w->mode == 0 ? 201 : 200);
        if (ok && w->mode == 0 && w->ids && w->nids < w->cap) {
            const char *id = json_string_value(json_object_get(r.json, "id"));
            if (id) snprintf(w->ids[w->nids++], 16, "%s", id);
        }
        hresp_free(&r);
        if (!ok) {
            w->errors++;
            continue;
        }
        w->done++;
        if (w->lat && w->nlat < w->cap) w->lat[w->nlat++] = ms;
    }
    hreq_thread_done();
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, long n, double p) {
    if (n == 0) return 0;
    long i = (long)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* Runs `nthreads` workers of `mode` for `secs` seconds (or until `target`
 * submissions). Prints and returns throughput; latencies pooled. */
static double run(const char *label, int mode, int nthreads, double secs, long target,
                  char (*ids)[16], long nids, double *p50, double *p99) {
    pthread_t th[16];
    struct worker w[16];
    _Atomic long count = 0;
    double cpu0 = loomd_cpu_s();
    double t0 = clock_mono_s();
    for (int i = 0; i < nthreads; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].mode = mode;
        w[i].until = t0 + secs;
        w[i].target = target;
        w[i].shared_count = &count;
        w[i].cap = 200000;
        w[i].lat = malloc(sizeof(double) * (size_t)w[i].cap);
        w[i].ids = ids;
        w[i].nids = nids;
        w[i].seed = (unsigned)i * 7919u + 1;
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    long done = 0, errors = 0, nlat = 0;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(th[i], NULL);
        done += w[i].done;
        errors += w[i].errors;
        nlat += w[i].nlat;
    }
    double el = clock_mono_s() - t0;
    double *all = malloc(sizeof(double) * (size_t)(nlat + 1));
    long k = 0;
    for (int i = 0; i < nthreads; i++) {
        memcpy(all + k, w[i].lat, sizeof(double) * (size_t)w[i].nlat);
        k += w[i].nlat;
        free(w[i].lat);
    }
    qsort(all, (size_t)nlat, sizeof *all, cmp_double);
    double rate = done / el;
    double cpu_us = done ? (loomd_cpu_s() - cpu0) / (double)done * 1e6 : 0;
    *p50 = pct(all, nlat, 0.50);
    *p99 = pct(all, nlat, 0.99);
    printf("%-34s clients=%d requests=%ld errors=%ld %.0f req/s p50=%.2f ms p99=%.2f ms "
           "loomd_cpu=%.0f us/req\n",
           label, nthreads, done, errors, rate, *p50, *p99, cpu_us);
    fflush(stdout);
    free(all);
    return rate;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LOOMD [--jobs N] [--seconds S] [--dir DIR] [-- loomd args]\n",
                argv[0]);
        return 2;
    }
    const char *bin = argv[1];
    long njobs = 100000;
    double secs = 5;
    const char *dir = NULL;
    const char *extra[16] = {NULL};
    int nextra = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--jobs") && i + 1 < argc)
            njobs = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--"))
            for (i++; i < argc && nextra < 15; i++)
                extra[nextra++] = argv[i];
    }
    char tmp[] = "/tmp/loom-bench-XXXXXX";
    if (!dir) {
        if (!mkdtemp(tmp)) return 1;
        dir = tmp;
    }
    char dd[512];
    snprintf(dd, sizeof dd, "%s/d", dir);
    const char *args[20] = {"--rate-limit", "0"};
    for (int i = 0; i < nextra; i++)
        args[2 + i] = extra[i];
    struct loomd_proc p;
    if (loomd_spawn(&p, bin, dd, ADMIN, args) != 0) return 1;
    snprintf(url, sizeof url, "%s", p.url);
    loomd_pid = p.pid;
    char tid[32];
    if (make_tenant(url, ADMIN, "bench", tid, sizeof tid, token, sizeof token) != 0) return 1;
    snprintf(spec, sizeof spec,
             "{\"name\":\"bench\",\"model\":{\"family\":\"gpt2\",\"preset\":\"124m\"},"
             "\"data\":{\"train\":\"%s/train_*.bin\"},\"resources\":{\"device\":\"cpu\"},"
             "\"labels\":{\"team\":\"bench\"}}",
             dir);
    printf("bench_daemon: loomd at %s, data in %s\n", url, dd);
    double p50, p99;
    double r1 = run("submit (durable)", 0, 1, secs, 0, NULL, 0, &p50, &p99);
    double r8 = run("submit (durable)", 0, 8, secs, 0, NULL, 0, &p50, &p99);
    /* Fill to njobs, keeping a sample of ids for GETs. */
    long have = (long)((r1 + r8) * secs); /* approximate: counted below */
    struct hresp r;
    hreq(url, "GET", "/metrics", NULL, NULL, NULL, 0, NULL, &r);
    const char *m = r.body ? strstr(r.body, "\nloom_store_commit_ops_total ") : NULL;
    if (m) have = atol(m + strlen("\nloom_store_commit_ops_total ")) - 2;
    hresp_free(&r);
    long ncap = 200000;
    char(*ids)[16] = calloc((size_t)ncap, 16);
    if (njobs > have) {
        printf("filling the store to %ld jobs...\n", njobs);
        fflush(stdout);
        pthread_t th[8];
        struct worker w[8];
        _Atomic long count = 0;
        long per_cap = ncap / 8;
        for (int i = 0; i < 8; i++) {
            memset(&w[i], 0, sizeof w[i]);
            w[i].mode = 0;
            w[i].until = clock_mono_s() + 3600;
            w[i].target = njobs - have;
            w[i].shared_count = &count;
            w[i].cap = per_cap;
            w[i].ids = ids + (size_t)i * (size_t)per_cap;
            pthread_create(&th[i], NULL, worker_main, &w[i]);
        }
        long nids = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            if (nids != (long)i * per_cap) memmove(ids + nids, w[i].ids, (size_t)w[i].nids * 16);
            nids += w[i].nids;
        }
        double rg, rl;
        double gr = run("GET /v1/jobs/{id}", 1, 1, secs, 0, ids, nids, &p50, &p99);
        rg = p99;
        run("GET /v1/jobs/{id}", 1, 8, secs, 0, ids, nids, &p50, &p99);
        double lr = run("GET /v1/jobs (first page, 50)", 2, 1, secs, 0, NULL, 0, &p50, &p99);
        rl = p99;
        run("GET /v1/jobs (first page, 50)", 2, 8, secs, 0, NULL, 0, &p50, &p99);
        printf("SUMMARY jobs=%ld submit1=%.0f/s submit8=%.0f/s get_p99_1client=%.2fms "
               "list_p99_1client=%.2fms get_rate=%.0f/s list_rate=%.0f/s\n",
               njobs, r1, r8, rg, rl, gr, lr);
    }
    free(ids);
    loomd_signal_wait(&p, SIGTERM);
    hreq_thread_done();
    if (dir == tmp) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    return 0;
}
