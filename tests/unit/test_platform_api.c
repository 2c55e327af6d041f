/* Unit tests of the platform API's pure parts: webhook signatures against the
 * openssl command line (an independent HMAC-SHA256), the private-address
 * classifier, URL checks, backoff, the Range parser, the artifact path
 * classifier, the transition -> event type table, and the {name*} route
 * segment. Usage: test_platform_api [openssl binary] */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/check.h"
#include "daemon/artifacts.h"
#include "daemon/events.h"
#include "daemon/http.h"
#include "daemon/metrics.h"
#include "daemon/store.h"
#include "daemon/webhooks.h"

/* HMAC-SHA256 by `openssl dgst -sha256 -hmac KEY` over the bytes "<t>.<body>". */
static int openssl_hmac(const char *openssl, const char *key, long long t, const char *body,
                        char out[65]) {
    char path[] = "/tmp/test_platform_api.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    fprintf(f, "%lld.%s", t, body);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' dgst -sha256 -hmac '%s' -r '%s'", openssl, key, path);
    FILE *p = popen(cmd, "r");
    int rc = -1;
    if (p && fscanf(p, "%64s", out) == 1 && strlen(out) == 64) rc = 0;
    if (p) pclose(p);
    unlink(path);
    return rc;
}

static void test_signatures(const char *openssl) {
    static const struct {
        const char *secret, *body;
        long long t;
    } cases[] = {
        {"whsec_0123456789abcdef", "{\"id\":1,\"type\":\"job.queued\"}", 1796120799},
        {"k", "", 0},
        {"a longer secret with spaces", "{\"data\":{\"x\":\"\\u00e9\"}}", 1700000000},
        {"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
         "[1,2,3]", 42},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char ours[65], ref[65];
        CHECK(webhooks_sign(cases[i].secret, cases[i].t, cases[i].body, strlen(cases[i].body),
                            ours) == 0);
        if (openssl_hmac(openssl, cases[i].secret, cases[i].t, cases[i].body, ref) != 0) {
            fprintf(stderr, "openssl (%s) did not run\n", openssl);
            CHECK(0);
            continue;
        }
        if (strcmp(ours, ref)) fprintf(stderr, "case %zu: %s != openssl %s\n", i, ours, ref);
        CHECK(strcmp(ours, ref) == 0);
    }
    /* The body is signed with its timestamp: another t gives another MAC. */
    char a[65], b[65];
    webhooks_sign("s", 1, "x", 1, a);
    webhooks_sign("s", 2, "x", 1, b);
    CHECK(strcmp(a, b) != 0);
}

static void test_private(void) {
    static const struct {
        const char *ip;
        int priv;
    } cases[] = {
        {"127.0.0.1", 1},
        {"127.255.255.254", 1},
        {"10.0.0.1", 1},
        {"172.16.0.1", 1},
        {"172.31.255.255", 1},
        {"172.32.0.1", 0},
        {"172.15.255.255", 0},
        {"192.168.1.1", 1},
        {"192.169.0.1", 0},
        {"169.254.169.254", 1},
        {"100.64.0.1", 1},
        {"100.127.255.255", 1},
        {"100.128.0.1", 0},
        {"0.0.0.0", 1},
        {"224.0.0.1", 1},
        {"239.255.255.250", 1},
        {"255.255.255.255", 1},
        {"198.18.0.1", 1},
        {"198.20.0.1", 0},
        {"192.0.2.5", 1},
        {"8.8.8.8", 0},
        {"93.184.216.34", 0},
        {"1.1.1.1", 0},
        {"::1", 1},
        {"::", 1},
        {"fe80::1", 1},
        {"fc00::1", 1},
        {"fd12:3456::1", 1},
        {"ff02::1", 1},
        {"2001:db8::1", 1},
        {"::ffff:127.0.0.1", 1},
        {"::ffff:10.1.2.3", 1},
        {"::ffff:8.8.8.8", 0},
        {"64:ff9b::a00:1", 1},
        {"64:ff9b::808:808", 0},
        {"2002:c0a8:0101::1", 1},
        {"2002:0808:0808::1", 0},
        {"2606:4700:4700::1111", 0},
        {"2a00:1450:4001::1", 0},
        {"::127.0.0.1", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = webhooks_ip_private(cases[i].ip);
        if (got != cases[i].priv)
            fprintf(stderr, "%s: private=%d, want %d\n", cases[i].ip, got, cases[i].priv);
        CHECK(got == cases[i].priv);
    }
    CHECK(webhooks_ip_private("localhost") == -1);
    CHECK(webhooks_ip_private("1.2.3") == -1);
}

static void test_urls(void) {
    static const struct {
        const char *url;
        int allow;
        const char *code; /* NULL: accepted */
    } cases[] = {
        {"http://127.0.0.1:8080/hook", 1, NULL},
        {"http://127.0.0.1:8080/hook", 0, "WEBHOOK_PRIVATE_ADDRESS"},
        {"http://[::1]:9/x", 0, "WEBHOOK_PRIVATE_ADDRESS"},
        {"https://93.184.216.34/h", 0, NULL},
        {"ftp://93.184.216.34/h", 1, "INVALID_WEBHOOK_URL"},
        {"file:///etc/passwd", 1, "INVALID_WEBHOOK_URL"},
        {"gopher://127.0.0.1/", 1, "INVALID_WEBHOOK_URL"},
        {"not a url", 1, "INVALID_WEBHOOK_URL"},
        {"", 1, "INVALID_WEBHOOK_URL"},
        {"http://no-such-host.invalid/", 1, "WEBHOOK_HOST_UNRESOLVED"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char code[64] = "", msg[512] = "";
        int rc =
            webhooks_check_url(cases[i].url, cases[i].allow, 1, code, sizeof code, msg, sizeof msg);
        if (cases[i].code) {
            CHECK(rc == -1 && !strcmp(code, cases[i].code));
            if (rc != -1 || strcmp(code, cases[i].code))
                fprintf(stderr, "%s: rc %d code %s (%s)\n", cases[i].url, rc, code, msg);
        } else {
            CHECK(rc == 0);
        }
    }
    /* the delivery-time form check: no lookup, so an unresolvable or private host passes
     * (the connect-time check below refuses private addresses), a bad URL does not */
    char code[64], msg[512];
    CHECK(webhooks_check_url("http://no-such-host.invalid/", 0, 0, code, sizeof code, msg,
                             sizeof msg) == 0);
    CHECK(webhooks_check_url("http://127.0.0.1:8080/x", 0, 0, code, sizeof code, msg, sizeof msg) ==
          0);
    CHECK(webhooks_check_url("ftp://93.184.216.34/h", 0, 0, code, sizeof code, msg, sizeof msg) ==
              -1 &&
          !strcmp(code, "INVALID_WEBHOOK_URL"));
}

/* webhooks_open_socket: the address curl is about to connect to. Private
 * ones are refused (and named) unless allowed; public ones get a socket.
 * curl's struct curl_sockaddr ends in a struct sockaddr that curl backs with
 * room for any address (sockaddr_storage): so does this one. */
union test_sockaddr {
    struct curl_sockaddr a;
    struct {
        int family, socktype, protocol;
        unsigned int addrlen;
        struct sockaddr_storage ss;
    } room;
};

static void sock_addr(union test_sockaddr *u, const char *ip) {
    memset(u, 0, sizeof *u);
    u->room.socktype = SOCK_STREAM;
    u->room.protocol = IPPROTO_TCP;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&u->room.ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&u->room.ss;
    if (inet_pton(AF_INET, ip, &v4->sin_addr) == 1) {
        u->room.family = v4->sin_family = AF_INET;
        u->room.addrlen = sizeof *v4;
    } else if (inet_pton(AF_INET6, ip, &v6->sin6_addr) == 1) {
        u->room.family = v6->sin6_family = AF_INET6;
        u->room.addrlen = sizeof *v6;
    }
}

static void test_open_socket(void) {
    static const struct {
        const char *ip;
        int allow, want_socket;
    } cases[] = {
        {"127.0.0.1", 0, 0},     {"127.0.0.1", 1, 1},
        {"10.1.2.3", 0, 0},      {"169.254.169.254", 0, 0},
        {"::1", 0, 0},           {"::ffff:127.0.0.1", 0, 0},
        {"93.184.216.34", 0, 1}, {"2606:2800:220:1::", 0, 1},
    };
    CHECK(offsetof(struct curl_sockaddr, addr) == offsetof(union test_sockaddr, room.ss));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        union test_sockaddr u;
        sock_addr(&u, cases[i].ip);
        struct webhooks_sock_check c = {.allow_private = cases[i].allow};
        curl_socket_t fd = webhooks_open_socket(&c, CURLSOCKTYPE_IPCXN, &u.a);
        int got = fd != CURL_SOCKET_BAD;
        CHECK(got == cases[i].want_socket);
        if (got != cases[i].want_socket)
            fprintf(stderr, "%s allow %d: socket %d\n", cases[i].ip, cases[i].allow, (int)fd);
        if (got) {
            CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
            CHECK(c.refused[0] == 0);
            close(fd);
        } else {
            /* the refused address is named for the delivery's error */
            char want[64];
            const void *ip = u.room.family == AF_INET
                                 ? (const void *)&((struct sockaddr_in *)&u.room.ss)->sin_addr
                                 : (const void *)&((struct sockaddr_in6 *)&u.room.ss)->sin6_addr;
            inet_ntop(u.room.family, ip, want, sizeof want);
            CHECK(!strcmp(c.refused, want));
        }
    }
    union test_sockaddr un;
    memset(&un, 0, sizeof un);
    un.room.family = AF_UNIX;
    struct webhooks_sock_check c = {.allow_private = 1};
    CHECK(webhooks_open_socket(&c, CURLSOCKTYPE_IPCXN, &un.a) == CURL_SOCKET_BAD && c.refused[0]);
}

static void test_backoff(void) {
    static const struct {
        int attempts;
        int64_t base, want;
    } cases[] = {{1, 1000, 1000},     {2, 1000, 2000},      {3, 1000, 4000}, {10, 1000, 512000},
                 {13, 1000, 3600000}, {100, 1000, 3600000}, {0, 200, 200},   {5, 200, 3200}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK(webhooks_backoff_ms(cases[i].attempts, cases[i].base) == cases[i].want);
}

static void test_ranges(void) {
    static const struct {
        const char *h;
        uint64_t size;
        int rc;
        uint64_t off, len;
    } cases[] = {
        {NULL, 100, 0, 0, 0},
        {"bytes=0-9", 100, 1, 0, 10},
        {"bytes=10-", 100, 1, 10, 90},
        {"bytes=-10", 100, 1, 90, 10},
        {"bytes=-1000", 100, 1, 0, 100},
        {"bytes=90-1000", 100, 1, 90, 10},
        {"bytes=99-99", 100, 1, 99, 1},
        {"bytes=100-", 100, -1, 0, 0},
        {"bytes=100-200", 100, -1, 0, 0},
        {"bytes=5-2", 100, -1, 0, 0},
        {"bytes=0-1,4-5", 100, -1, 0, 0},
        {"bytes=-0", 100, -1, 0, 0},
        {"bytes=-", 100, -1, 0, 0},
        {"bytes=x-1", 100, -1, 0, 0},
        {"bytes=1-x", 100, -1, 0, 0},
        {"bytes=1", 100, -1, 0, 0},
        {"items=0-1", 100, -1, 0, 0},
        {"bytes=0-", 0, -1, 0, 0},
        {"bytes=-5", 0, -1, 0, 0},
        {"bytes=99999999999999999999999-", 100, -1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint64_t off = 7, len = 7;
        int rc = artifacts_parse_range(cases[i].h, cases[i].size, &off, &len);
        CHECK(rc == cases[i].rc);
        if (rc == 1) CHECK(off == cases[i].off && len == cases[i].len);
        if (rc != cases[i].rc)
            fprintf(stderr, "Range %s: %d, want %d\n", cases[i].h ? cases[i].h : "(none)", rc,
                    cases[i].rc);
    }
}

static void test_classify(void) {
    static const struct {
        const char *rel;
        enum artifact_kind kind;
        long step;
        int dir;
    } cases[] = {
        {"checkpoints/step_00000200/manifest.json", ARTIFACT_CHECKPOINT, 200, 0},
        {"checkpoints/step_00000200/rank_00001.safetensors", ARTIFACT_CHECKPOINT, 200, 0},
        {"checkpoints/step_00000200", ARTIFACT_CHECKPOINT, 200, 1},
        {"checkpoints/.tmp.step_00000200/x", ARTIFACT_NONE, -1, 0},
        {"checkpoints/step_/x", ARTIFACT_NONE, -1, 0},
        {"checkpoints/step_12a/x", ARTIFACT_NONE, -1, 0},
        {"checkpoints/step_1/a/b", ARTIFACT_NONE, -1, 0},
        {"checkpoints", ARTIFACT_NONE, -1, 0},
        {"export/hf/config.json", ARTIFACT_MODEL, -1, 0},
        {"export/hf/sub/model-00001-of-00002.safetensors", ARTIFACT_MODEL, -1, 0},
        {"export/hf", ARTIFACT_MODEL, -1, 1},
        {"export/hfx/a", ARTIFACT_NONE, -1, 0},
        {"export/lora/adapter_model.safetensors", ARTIFACT_ADAPTER, -1, 0},
        {"export/lora", ARTIFACT_ADAPTER, -1, 1},
        {"logs/0.0.stderr.log", ARTIFACT_LOG, -1, 0},
        {"logs/a/b", ARTIFACT_NONE, -1, 0},
        {"spec.json", ARTIFACT_NONE, -1, 0},
        {"export/hf/../../x", ARTIFACT_NONE, -1, 0},
        {"export/hf/./x", ARTIFACT_NONE, -1, 0},
        {"export/hf//x", ARTIFACT_NONE, -1, 0},
        {"/etc/passwd", ARTIFACT_NONE, -1, 0},
        {"logs/..", ARTIFACT_NONE, -1, 0},
        {"", ARTIFACT_NONE, -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        long step = 99;
        int dir = 9;
        enum artifact_kind k = artifacts_classify(cases[i].rel, &step, &dir);
        int ok = k == cases[i].kind &&
                 (k == ARTIFACT_NONE || (step == cases[i].step && dir == cases[i].dir));
        if (!ok)
            fprintf(stderr, "classify %s: kind %d step %ld dir %d\n", cases[i].rel, k, step, dir);
        CHECK(ok);
    }
}

static void test_event_types(void) {
    static const struct {
        int from, to;
        const char *reason, *want;
    } cases[] = {
        {-1, JOB_QUEUED, "submitted", "job.queued"},
        {JOB_QUEUED, JOB_STARTING, "placed", NULL},
        {JOB_STARTING, JOB_RUNNING, "every rank started", "job.started"},
        {JOB_RUNNING, JOB_QUEUED, "rank 1 exited with 3", "job.retrying"},
        {JOB_STARTING, JOB_QUEUED, "node lost", "job.retrying"},
        {JOB_RUNNING, JOB_QUEUED, "PREEMPTED by j-1", "job.preempted"},
        {JOB_RUNNING, JOB_SUCCEEDED, "", "job.succeeded"},
        {JOB_RUNNING, JOB_FAILED, "no retries left", "job.failed"},
        {JOB_QUEUED, JOB_FAILED, "DEPENDENCY_FAILED", "job.failed"},
        {JOB_RUNNING, JOB_CANCELLING, "cancel", NULL},
        {JOB_CANCELLING, JOB_CANCELLED, "every rank stopped", "job.cancelled"},
        {JOB_QUEUED, JOB_CANCELLED, "cancelled by tenant", "job.cancelled"},
        {JOB_RUNNING, 99, "", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *t = events_type_for_transition(cases[i].from, cases[i].to, cases[i].reason);
        CHECK(cases[i].want ? t && !strcmp(t, cases[i].want) : t == NULL);
        if (t) CHECK(events_type_valid(t));
    }
    CHECK(events_types_count == 11 && events_type_valid("job.diagnosis") &&
          events_type_valid("artifacts.expired"));
    CHECK(!events_type_valid("job.nope") && !events_type_valid(NULL) && !events_type_valid("*"));
}

static void test_rest_segment(void) {
    static const struct {
        const char *path;
        const char *value; /* NULL: no match */
    } cases[] = {
        {"/v1/jobs/j-1/artifacts/a", "a"},
        {"/v1/jobs/j-1/artifacts/checkpoints/step_1/manifest.json",
         "checkpoints/step_1/manifest.json"},
        {"/v1/jobs/j-1/artifacts/", NULL},
        {"/v1/jobs/j-1/artifacts", NULL},
        {"/v1/jobs/j-1/artifacts/a//b", NULL},
        {"/v1/jobs/j-1/artifacts/a/", NULL},
        {"/v1/jobs//artifacts/a", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *names[HTTP_MAX_PARAMS], *values[HTTP_MAX_PARAMS];
        int n = 0;
        int m = http_match("/v1/jobs/{id}/artifacts/{path*}", cases[i].path, names, values,
                           HTTP_MAX_PARAMS, &n);
        if (cases[i].value) {
            CHECK(m == 1 && n == 2 && !strcmp(names[1], "path") &&
                  !strcmp(values[1], cases[i].value) && !strcmp(values[0], "j-1"));
        } else {
            CHECK(m == 0 && n == 0);
        }
        for (int k = 0; k < n; k++) {
            free(names[k]);
            free(values[k]);
        }
    }
    int n = 0;
    /* An ordinary {name} segment still takes exactly one segment. */
    CHECK(!http_match("/v1/jobs/{id}", "/v1/jobs/a/b", NULL, NULL, 0, &n));
}

/* The aggregate /metrics view: lines with a job or tenant label go, the
 * rest (comments, unlabelled and other-labelled samples) stay byte for
 * byte; label names are matched whole, values may hold escaped quotes,
 * commas and braces. */
static void test_metrics_filter(void) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"", ""},
        {"# HELP loom_jobs Jobs.\n# TYPE loom_jobs gauge\n",
         "# HELP loom_jobs Jobs.\n# TYPE loom_jobs gauge\n"},
        {"loom_events_last_seq 12\n", "loom_events_last_seq 12\n"},
        {"loom_jobs{tenant=\"t-1\",state=\"queued\"} 3\nloom_jobs_by_state{state=\"queued\"} 3\n",
         "loom_jobs_by_state{state=\"queued\"} 3\n"},
        {"loom_job_mfu{job=\"j-1\"} 0.4\nloom_nodes{state=\"ready\"} 2\n",
         "loom_nodes{state=\"ready\"} 2\n"},
        {"x{node=\"n\",job_id=\"j\"} 1\n", ""},
        {"x{a=\"1\", tenant_id=\"t\"} 1\n", ""},
        /* whole names only: jobs=, my_tenant= and a value "job=" stay */
        {"x{jobs=\"2\"} 1\nx{my_tenant=\"a\"} 1\n", "x{jobs=\"2\"} 1\nx{my_tenant=\"a\"} 1\n"},
        {"x{route=\"/v1/x?job=1\"} 1\n", "x{route=\"/v1/x?job=1\"} 1\n"},
        {"x{route=\"a\\\",job=\\\"b}\"} 1\n", "x{route=\"a\\\",job=\\\"b}\"} 1\n"},
        {"x{route=\"a,b\",job=\"j\"} 1\ny 2", "y 2"},
        {"x{job=\"j\"} 1", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *buf = strdup(cases[i].in);
        size_t n = metrics_public_filter(buf, strlen(buf));
        if (n != strlen(cases[i].want) || memcmp(buf, cases[i].want, n) != 0) {
            fprintf(stderr, "metrics filter case %zu: got '%.*s'\n", i, (int)n, buf);
            CHECK(0);
        }
        free(buf);
    }
}

int main(int argc, char **argv) {
    const char *openssl = argc > 1 ? argv[1] : "openssl";
    test_signatures(openssl);
    test_private();
    test_open_socket();
    test_urls();
    test_backoff();
    test_ranges();
    test_classify();
    test_event_types();
    test_rest_segment();
    test_metrics_filter();
    return check_summary("platform_api");
}
