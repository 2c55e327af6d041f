/* Unit tests of daemon/http.c helpers that other modules build on: the path
 * matcher (table of patterns and paths) and the long-poll primitives
 * (http_notify / http_wait: a signal wakes a waiter, a timeout returns 0 on
 * time, a signal before the wait is not lost). No server is started. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/http.h"
#include "tests/check.h"

static const struct {
    const char *pattern, *path;
    int match;
    const char *p1, *v1, *p2, *v2;
} cases[] = {
    {"/healthz", "/healthz", 1, NULL, NULL, NULL, NULL},
    {"/healthz", "/healthz/", 0, NULL, NULL, NULL, NULL},
    {"/v1/jobs", "/v1/jobs", 1, NULL, NULL, NULL, NULL},
    {"/v1/jobs", "/v1/job", 0, NULL, NULL, NULL, NULL},
    {"/v1/jobs", "/v1/jobsx", 0, NULL, NULL, NULL, NULL},
    {"/v1/jobs/{id}", "/v1/jobs/j-1", 1, "id", "j-1", NULL, NULL},
    {"/v1/jobs/{id}", "/v1/jobs/", 0, NULL, NULL, NULL, NULL},
    {"/v1/jobs/{id}", "/v1/jobs/a/b", 0, NULL, NULL, NULL, NULL},
    {"/v1/tenants/{id}/tokens/{tid}", "/v1/tenants/t-1/tokens/k-2", 1, "id", "t-1", "tid", "k-2"},
    {"/v1/rdzv/{job}/{attempt}/{key}", "/v1/rdzv/j/3/nccl-id", 1, "job", "j", "key", "nccl-id"},
    {"/v1/rdzv/{job}/{attempt}/{key}", "/v1/rdzv/j/3", 0, NULL, NULL, NULL, NULL},
    {"/ui/{file}", "/ui/app.js", 1, "file", "app.js", NULL, NULL},
    {"/ui/{file}", "/ui/../etc/passwd", 0, NULL, NULL, NULL, NULL},
};

static const char *value(char **names, char **values, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return values[i];
    return NULL;
}

static void test_match(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *names[HTTP_MAX_PARAMS], *values[HTTP_MAX_PARAMS];
        int n = -1;
        int m = http_match(cases[i].pattern, cases[i].path, names, values, HTTP_MAX_PARAMS, &n);
        if (m != cases[i].match) {
            fprintf(stderr, "match %s vs %s: got %d\n", cases[i].pattern, cases[i].path, m);
            check_failures++;
        }
        if (!m) CHECK(n == 0);
        if (m && cases[i].p1) {
            const char *v = value(names, values, n, cases[i].p1);
            CHECK(v && !strcmp(v, cases[i].v1));
        }
        if (m && cases[i].p2) {
            const char *v = value(names, values, n, cases[i].p2);
            CHECK(v && !strcmp(v, cases[i].v2));
        }
        for (int k = 0; m && k < n; k++) {
            free(names[k]);
            free(values[k]);
        }
    }
}

static void *signaller(void *arg) {
    usleep(50000);
    http_notify_signal(arg);
    return NULL;
}

static void test_notify(void) {
    struct http_notify n;
    http_notify_init(&n);
    uint64_t gen = http_notify_gen(&n);
    /* timeout: returns 0 after about the time asked */
    double t0 = clock_mono_s();
    CHECK(http_wait(NULL, &n, &gen, 120) == 0);
    double el = clock_mono_s() - t0;
    CHECK(el >= 0.11 && el < 2.0);
    /* a signal from another thread wakes the waiter early and moves gen */
    pthread_t th;
    uint64_t before = gen;
    pthread_create(&th, NULL, signaller, &n);
    t0 = clock_mono_s();
    CHECK(http_wait(NULL, &n, &gen, 5000) == 1);
    CHECK(clock_mono_s() - t0 < 2.0);
    CHECK(gen == before + 1);
    pthread_join(th, NULL);
    /* a signal between reading gen and waiting is not lost */
    gen = http_notify_gen(&n);
    http_notify_signal(&n);
    t0 = clock_mono_s();
    CHECK(http_wait(NULL, &n, &gen, 5000) == 1);
    CHECK(clock_mono_s() - t0 < 0.5);
    CHECK(http_stopping(NULL) == 0);
    http_notify_destroy(&n);
}

int main(void) {
    test_match();
    test_notify();
    return check_summary("test_daemon_http");
}
