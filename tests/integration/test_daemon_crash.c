/* Durability test: 8 keep-alive clients submit jobs as fast as they can;
 * loomd is killed with SIGKILL in the middle of the burst, restarted on the
 * same data dir, and every job that had been acknowledged (201) must be
 * there. Then the same with SIGTERM: loomd finishes in-flight requests,
 * exits 0, and the database passes PRAGMA integrity_check.
 * Usage: test_daemon_crash LOOMD_BINARY */
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon_harness.h"
#include "tests/check.h"

#define CLIENTS 8
#define MAX_ACK 20000

static const char *ADMIN = "crash-admin";
static const char *const noratelimit[] = {"--rate-limit", "0", NULL};
static char url[128], token[128], spec[1024];
static atomic_int stop;

struct client {
    int id;
    char (*acked)[16];
    int nacked;
    int errors;
};

static void *client_main(void *arg) {
    struct client *c = arg;
    while (!atomic_load(&stop) && c->nacked < MAX_ACK / CLIENTS) {
        struct hresp r;
        if (hreq(url, "POST", "/v1/jobs", token, NULL, spec, strlen(spec), NULL, &r) != 0) {
            c->errors++; /* loomd is gone: stop */
            hresp_free(&r);
            break;
        }
        if (r.status == 201) {
            const char *id = json_string_value(json_object_get(r.json, "id"));
            if (id) snprintf(c->acked[c->nacked++], 16, "%s", id);
        } else if (r.status != 503) {
            c->errors++;
        }
        hresp_free(&r);
    }
    hreq_thread_done();
    return NULL;
}

/* Runs a burst, sends `sig` after `ms`, returns the total acknowledged. */
static int burst_then_signal(struct loomd_proc *p, int sig, int ms, struct client *cl,
                             int *exit_status) {
    pthread_t th[CLIENTS];
    atomic_store(&stop, 0);
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].nacked = 0;
        cl[i].errors = 0;
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    clock_sleep_ms(ms);
    *exit_status = loomd_signal_wait(p, sig);
    atomic_store(&stop, 1);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(th[i], NULL);
    int total = 0;
    for (int i = 0; i < CLIENTS; i++)
        total += cl[i].nacked;
    return total;
}

static int verify_all(struct client *cl) {
    int missing = 0;
    for (int i = 0; i < CLIENTS; i++)
        for (int k = 0; k < cl[i].nacked; k++) {
            char path[64];
            snprintf(path, sizeof path, "/v1/jobs/%s", cl[i].acked[k]);
            struct hresp r;
            hreq(url, "GET", path, token, NULL, NULL, 0, NULL, &r);
            if (r.status != 200) {
                if (missing < 5)
                    fprintf(stderr, "acknowledged job %s: %ld after restart\n", cl[i].acked[k],
                            r.status);
                missing++;
            }
            hresp_free(&r);
        }
    return missing;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *bin = argv[1];
    char tmp[] = "/tmp/loom-test-crash-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    char dd[256];
    snprintf(dd, sizeof dd, "%s/d", tmp);
    snprintf(spec, sizeof spec,
             "{\"name\":\"burst\",\"model\":{\"family\":\"gpt2\",\"preset\":\"124m\"},"
             "\"data\":{\"train\":\"%s/train_*.bin\"},\"resources\":{\"device\":\"cpu\"}}",
             tmp);
    struct loomd_proc p;
    if (loomd_spawn(&p, bin, dd, ADMIN, noratelimit) != 0) return 1;
    snprintf(url, sizeof url, "%s", p.url);
    char tid[32];
    if (make_tenant(url, ADMIN, "burst", tid, sizeof tid, token, sizeof token) != 0) return 1;
    struct client cl[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        cl[i].id = i;
        cl[i].acked = calloc(MAX_ACK / CLIENTS, 16);
    }
    int st = 0;
    int acked = burst_then_signal(&p, SIGKILL, 700, cl, &st);
    CHECK(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    printf("kill -9 after %d acknowledged submissions\n", acked);
    CHECK(acked > 50); /* the burst really ran */
    if (loomd_spawn(&p, bin, dd, ADMIN, noratelimit) != 0) return 1;
    snprintf(url, sizeof url, "%s", p.url);
    int missing = verify_all(cl);
    CHECK(missing == 0);
    printf("after restart: %d of %d acknowledged jobs present\n", acked - missing, acked);

    /* Graceful: SIGTERM during a burst. */
    acked = burst_then_signal(&p, SIGTERM, 500, cl, &st);
    CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < CLIENTS; i++)
        CHECK(cl[i].errors <= 1); /* at most the final refusal */
    char db[300];
    snprintf(db, sizeof db, "%s/loom.db", dd);
    sqlite3 *h = NULL;
    CHECK(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK);
    sqlite3_stmt *q = NULL;
    if (h && sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        CHECK(strcmp((const char *)sqlite3_column_text(q, 0), "ok") == 0);
    else
        CHECK(!"integrity_check ran");
    sqlite3_finalize(q);
    sqlite3_close(h);
    char wal[320];
    snprintf(wal, sizeof wal, "%s-wal", db);
    struct stat sb;
    CHECK(stat(wal, &sb) != 0 || sb.st_size == 0); /* checkpointed on clean close */
    if (loomd_spawn(&p, bin, dd, ADMIN, noratelimit) != 0) return 1;
    snprintf(url, sizeof url, "%s", p.url);
    missing = verify_all(cl);
    CHECK(missing == 0);
    printf("SIGTERM during burst: %d acknowledged, %d missing, exit ok\n", acked, missing);
    loomd_signal_wait(&p, SIGTERM);
    for (int i = 0; i < CLIENTS; i++)
        free(cl[i].acked);
    hreq_thread_done();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (!check_failures && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    if (check_failures) {
        fprintf(stderr, "test_daemon_crash: %d failures (data in %s)\n", check_failures, tmp);
        return 1;
    }
    printf("test_daemon_crash: all passed\n");
    return 0;
}
