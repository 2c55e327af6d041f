/* libFuzzer target for loomd's request path: the real loomd (daemon/, libmicrohttpd, the
 * store) runs inside the fuzzer on a loopback port, and each input is sent as the raw bytes
 * of one connection: request line, headers and body, so routing (path patterns, {path*},
 * percent-decoding), authentication (bearer parsing, admin, tenant, join and node
 * credentials), Content-Type and size checks, the strict JSON body parser and the handlers
 * behind them see whatever the fuzzer makes. The words @ADMIN@, @TENANT@ and @JOIN@ in an
 * input become the admin token, a tenant token and the join token, so the corpus reaches
 * past authentication.
 *
 * Properties: every reply starts with an HTTP/1.x status line, and no request gets a 500
 * (a handler that sent no reply, or an internal failure); every 64 inputs /healthz must
 * still answer 200 within five tries (the server is not wedged). ASan/UBSan watch the whole
 * process. Coverage-guided (LOOM_FUZZ=ON with clang, tests/fuzz.cmake); leak checking is off for it
 * (loomd's caches outlive an input by design). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/client.h"
#include "common/log.h"
#include "daemon/http.h"
#include "daemon/loomd.h"

#define ADMIN_TOKEN "fuzz-admin-token"
#define JOIN_TOKEN  "fuzz-join-token"
#define MAX_REQ     (1 << 17)
#define READ_MS     1500 /* long-polls and streams are cut here: not a failure */

static struct loomd ld;
static int port;
static char tenant_token[128];
static unsigned long inputs;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_http: %s: %.300s\n", what, detail ? detail : "");
    abort();
}

static int now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int)(t.tv_sec * 1000 + t.tv_nsec / 1000000);
}

/* Sends req[0..len) on a new connection, half-closes it and reads the reply (up to cap
 * bytes, READ_MS) into out. Returns the bytes read, -1 when no connection could be made. */
static ssize_t exchange(const char *req, size_t len, char *out, size_t cap) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* libFuzzer's -timeout alarm interrupts blocking calls (EINTR): a fresh
     * socket is tried again rather than the input counted as a crash */
    int fd = -1;
    for (int tries = 0;; tries++) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) break;
        int e = errno;
        close(fd);
        if (e != EINTR || tries >= 100) {
            errno = e;
            return -1;
        }
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, req + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break; /* the server may close early (431, 413): read what it said */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t got = 0;
    int deadline = now_ms() + READ_MS;
    for (;;) {
        int left = deadline - now_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0) break;
        int pr = poll(&p, 1, left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) break;
        ssize_t r = recv(fd, out + got, cap - 1 - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
        if (got >= cap - 1) break;
    }
    out[got] = 0;
    close(fd);
    return (ssize_t)got;
}

/* Replaces @ADMIN@, @TENANT@ and @JOIN@ in data into out; returns the length. */
static size_t expand(const uint8_t *data, size_t size, char *out, size_t cap) {
    static const struct {
        const char *word, *value;
    } words[] = {{"@ADMIN@", ADMIN_TOKEN}, {"@TENANT@", tenant_token}, {"@JOIN@", JOIN_TOKEN}};
    size_t o = 0;
    for (size_t i = 0; i < size && o < cap;) {
        size_t k = 0;
        for (; k < sizeof words / sizeof *words; k++) {
            size_t wl = strlen(words[k].word);
            if (i + wl <= size && memcmp(data + i, words[k].word, wl) == 0) break;
        }
        if (k < sizeof words / sizeof *words) {
            size_t vl = strlen(words[k].value);
            if (o + vl > cap) break;
            memcpy(out + o, words[k].value, vl);
            o += vl;
            i += strlen(words[k].word);
        } else {
            out[o++] = (char)data[i++];
        }
    }
    return o;
}

static int status_of(const char *reply) {
    int st = 0;
    if (strncmp(reply, "HTTP/1.", 7) != 0 || sscanf(reply + 9, "%3d", &st) != 1) return -1;
    return st;
}

static void check_health(void) {
    static const char h[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    static char reply[8192];
    /* A loaded machine (other fuzzers, the suite) may delay one answer: wedged means five
     * tries over about ten seconds without a 200. */
    for (int i = 0; i < 5; i++) {
        ssize_t n = exchange(h, sizeof h - 1, reply, sizeof reply);
        if (n > 0 && status_of(reply) == 200) return;
        sleep(1);
    }
    fail("/healthz no longer answers 200", reply);
}

/* A tenant and its token, made through the API as any client would. */
static void make_tenant(void) {
    static char reply[16384];
    const char *body = "{\"name\":\"fuzz\"}";
    char req[1024];
    int n = snprintf(req, sizeof req,
                     "POST /v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     ADMIN_TOKEN, strlen(body), body);
    exchange(req, (size_t)n, reply, sizeof reply);
    const char *id = strstr(reply, "\"id\":\"");
    if (!id) fail("cannot create the tenant", reply);
    char tid[64];
    if (sscanf(id + 6, "%63[^\"]", tid) != 1) fail("no tenant id", reply);
    n = snprintf(req, sizeof req,
                 "POST /v1/tenants/%s/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                 "Content-Length: 0\r\nConnection: close\r\n\r\n",
                 tid, ADMIN_TOKEN);
    exchange(req, (size_t)n, reply, sizeof reply);
    const char *tok = strstr(reply, "\"token\":\"");
    if (!tok || sscanf(tok + 9, "%127[^\"]", tenant_token) != 1) fail("no tenant token", reply);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static char dir[] = "/tmp/loom-fuzz-http-XXXXXX";
    if (!mkdtemp(dir)) fail("mkdtemp", strerror(errno));
    setenv("LOOM_ADMIN_TOKEN", ADMIN_TOKEN, 1);
    setenv("LOOM_JOIN_TOKEN", JOIN_TOKEN, 1);
    char *args[] = {"loomd",       "--listen",
                    "127.0.0.1:0", "--data-dir",
                    dir,           "--log-level",
                    "error",       "--store-sync-full",
                    "false",       "--rate-limit",
                    "0",           "--data-roots",
                    dir,           NULL};
    int n = (int)(sizeof args / sizeof *args) - 1;
    signal(SIGPIPE, SIG_IGN);
    client_global_init();
    memset(&ld, 0, sizeof ld);
    if (loomd_config_load(&ld, n, args) != 0) fail("config", NULL);
    if (loomd_start(&ld) != 0) fail("loomd did not start", NULL);
    port = http_port(ld.http);
    make_tenant();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char req[MAX_REQ + 4096], reply[1 << 16];
    size_t len = expand(data, size, req, MAX_REQ);
    ssize_t n = exchange(req, len, reply, sizeof reply);
    if (n < 0) fail("cannot connect to loomd", strerror(errno));
    if (n > 0) {
        int st = status_of(reply);
        if (st < 100 || st > 599) fail("a reply without an HTTP status line", reply);
        if (st == 500) fail("HTTP 500", reply);
    }
    if (++inputs % 64 == 0) check_health();
    return 0;
}
