/* Job logs (files under <data-dir>/logs written by agent_api_logs) and the
 * step-metrics series (table job_metrics). See joblogs.h. */
#include "daemon/joblogs.h"

#include "common/clock.h"
#include "daemon/agent_api.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_MAX_REPLY (8L * 1024 * 1024)

struct job_lookup {
    const char *tenant; /* NULL for admin */
    const char *id;
    int found, attempt, world_size;
    enum job_state state;
};

static int lookup_job(struct store_tx *tx, void *arg) {
    struct job_lookup *l = arg;
    struct store_job j;
    memset(&j, 0, sizeof j);
    int rc = store_job_get(tx, l->tenant, l->id, &j);
    if (rc == STORE_OK) {
        l->found = 1;
        l->attempt = j.attempt;
        l->world_size = j.world_size;
        l->state = j.state;
    }
    store_job_clear(&j);
    return rc == STORE_NOT_FOUND ? STORE_OK : rc;
}

static int find_job(struct http_req *req, struct job_lookup *l) {
    l->tenant = req->is_admin ? NULL : req->tenant_id;
    l->id = http_param(req, "id");
    if (!l->id) return http_error(req, 404, "JOB_NOT_FOUND", "no job id"), -1;
    if (store_read(req->ld->store, lookup_job, l) != STORE_OK)
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read the job"), -1;
    if (!l->found) return http_error(req, 404, "JOB_NOT_FOUND", "no job %s", l->id), -1;
    return 0;
}

struct follow {
    struct loomd *ld;
    char path[1400];
    char job[64];
    char stream[8];
    int rank;
    int attempt;
    off_t off;
    int64_t gone_since;
    uint64_t gen;
};

static int attempt_active(struct cluster *c, const char *job, int attempt) {
    pthread_mutex_lock(&c->mu);
    struct cluster_attempt *a = cluster_attempt_find(c, job, attempt);
    int on = a != NULL;
    pthread_mutex_unlock(&c->mu);
    return on;
}

static ssize_t follow_read(void *ctx, char *buf, size_t max) {
    struct follow *f = ctx;
    struct cluster *c = f->ld->cluster;
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = pread(fd, buf, max, f->off);
            close(fd);
            if (n > 0) {
                f->off += n;
                f->gone_since = 0;
                return n;
            }
        }
        if (http_stopping(f->ld->http)) return -1;
        if (!attempt_active(c, f->job, f->attempt)) {
            int64_t now = clock_mono_ms();
            if (!f->gone_since) f->gone_since = now;
            /* Agents ship the last bytes shortly after the exit report. */
            if (now - f->gone_since > 2500) {
                /* Still waiting to be placed (this attempt has not started
                 * yet)? Keep following. Retried? Follow the new attempt.
                 * Else the job is over. */
                struct job_lookup l = {.tenant = NULL, .id = f->job};
                if (store_read(f->ld->store, lookup_job, &l) != STORE_OK || !l.found ||
                    l.attempt < f->attempt ||
                    (l.attempt == f->attempt && job_state_terminal(l.state)))
                    return -1;
                f->gone_since = now;
                if (l.attempt > f->attempt) {
                    f->attempt = l.attempt;
                    f->off = 0;
                    agent_api_log_path(c->logs_dir, f->job, f->attempt, f->rank, f->stream, f->path,
                                       sizeof f->path);
                    int n = snprintf(buf, max, "--- loom: attempt %d ---\n", f->attempt);
                    return n > 0 && (size_t)n < max ? n : 0;
                }
            }
        }
        http_wait(f->ld->http, &c->logs, &f->gen, 500);
    }
    return 0;
}

static void follow_free(void *ctx) {
    free(ctx);
}

/* Parses ?rank= into *rank (default 0); a rank outside 0..world_size-1
 * answers 400 INVALID_RANK naming both numbers and returns -1. */
static int rank_check(struct http_req *req, const struct job_lookup *l, const char *rs, int *rank) {
    char *end = NULL;
    long r = rs ? strtol(rs, &end, 10) : 0;
    if (rs && (end == rs || *end)) {
        http_error(req, 400, "INVALID_RANK", "rank=%s is not a number", rs);
        return -1;
    }
    if (r < 0 || (l->world_size > 0 && r >= l->world_size)) {
        http_error(req, 400, "INVALID_RANK", "rank=%ld; job %s has world size %d (ranks 0..%d)", r,
                   l->id, l->world_size, l->world_size - 1);
        return -1;
    }
    *rank = (int)r;
    return 0;
}

int joblogs_logs(struct http_req *req) {
    struct job_lookup l = {0};
    if (find_job(req, &l) != 0) return 0;
    const char *rs = http_query(req, "rank"), *as = http_query(req, "attempt");
    const char *stream = http_query(req, "stream"), *fl = http_query(req, "follow");
    int rank = 0;
    if (!stream) stream = "stderr";
    if (strcmp(stream, "stderr") && strcmp(stream, "stdout"))
        return http_error(req, 400, "INVALID_STREAM", "stream=%s; use stderr or stdout", stream);
    if (rank_check(req, &l, rs, &rank) != 0) return 0;
    struct cluster *c = req->ld->cluster;
    char path[1400];
    int attempt = as ? atoi(as) : l.attempt;
    struct stat st;
    agent_api_log_path(c->logs_dir, l.id, attempt, rank, stream, path, sizeof path);
    if (!as) {
        /* The newest attempt that wrote logs (a queued retry has none yet). */
        while (attempt > 0 && stat(path, &st) != 0) {
            attempt--;
            agent_api_log_path(c->logs_dir, l.id, attempt, rank, stream, path, sizeof path);
        }
    }
    int follow = fl && (!strcmp(fl, "1") || !strcmp(fl, "true"));
    char hdr[32];
    snprintf(hdr, sizeof hdr, "%d", attempt);
    http_add_header(req, "X-Loom-Attempt", hdr);
    if (follow) {
        struct follow *f = calloc(1, sizeof *f);
        if (!f) return http_error(req, 500, "INTERNAL", "cannot follow");
        f->ld = req->ld;
        snprintf(f->path, sizeof f->path, "%s", path);
        snprintf(f->job, sizeof f->job, "%s", l.id);
        f->attempt = attempt;
        f->rank = rank;
        snprintf(f->stream, sizeof f->stream, "%s", stream);
        f->gen = http_notify_gen(&c->logs);
        return http_reply_stream(req, 200, "text/plain; charset=utf-8", follow_read, f,
                                 follow_free);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return http_reply_text(req, 200, "text/plain; charset=utf-8", "", 0);
    fstat(fd, &st);
    off_t start = st.st_size > LOG_MAX_REPLY ? st.st_size - LOG_MAX_REPLY : 0;
    size_t len = (size_t)(st.st_size - start);
    char *buf = malloc(len + 1);
    ssize_t n = buf ? pread(fd, buf, len, start) : -1;
    close(fd);
    if (n < 0) {
        free(buf);
        return http_error(req, 500, "LOG_READ_FAILED", "cannot read the log");
    }
    int rc = http_reply_text(req, 200, "text/plain; charset=utf-8", buf, (size_t)n);
    free(buf);
    return rc;
}

struct series_q {
    const char *job;
    int rank;
    json_t *series, *evals;
};

static int series_read(struct store_tx *tx, void *arg) {
    struct series_q *q = arg;
    sqlite3_stmt *st = store_stmt(tx, "SELECT attempt, step, record FROM job_metrics WHERE "
                                      "job_id = ? AND rank = ? ORDER BY step, attempt");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, q->job, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, q->rank);
    int rc;
    json_int_t last_step = INT64_MIN;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *rec = json_loads((const char *)sqlite3_column_text(st, 2), 0, NULL);
        if (!rec) continue;
        json_int_t step = sqlite3_column_int64(st, 1);
        json_object_set_new(rec, "attempt", json_integer(sqlite3_column_int(st, 0)));
        json_object_del(rec, "type");
        json_t *arr = step < 0 ? q->evals : q->series;
        if (step >= 0 && step == last_step && json_array_size(arr) > 0)
            json_array_set_new(arr, json_array_size(arr) - 1, rec); /* newer attempt wins */
        else
            json_array_append_new(arr, rec);
        last_step = step;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}

/* Every rank's step timing (rank 0's step records, the others' rank_step
 * records): [{step, rank, attempt, node, ms}], a newer attempt's row
 * replacing an older one's for the same (step, rank). */
struct ranks_q {
    const char *job;
    json_t *rows;
};

static int ranks_read(struct store_tx *tx, void *arg) {
    struct ranks_q *q = arg;
    json_t *nodes = json_object(); /* "attempt.rank" -> node */
    sqlite3_stmt *st = store_stmt(tx, "SELECT attempt, placement FROM attempts WHERE job_id = ?");
    if (!st) goto fail;
    sqlite3_bind_text(st, 1, q->job, -1, SQLITE_STATIC);
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *pl = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
        size_t i;
        json_t *p;
        json_array_foreach(pl, i, p) {
            char key[32];
            snprintf(key, sizeof key, "%d.%d", sqlite3_column_int(st, 0),
                     (int)json_integer_value(json_object_get(p, "rank")));
            json_t *node = json_object_get(p, "node");
            if (json_is_string(node)) json_object_set(nodes, key, node);
        }
        json_decref(pl);
    }
    sqlite3_reset(st);
    st = store_stmt(tx, "SELECT attempt, rank, step, record FROM job_metrics WHERE job_id = ? AND "
                        "step >= 0 ORDER BY step, rank, attempt");
    if (!st) goto fail;
    sqlite3_bind_text(st, 1, q->job, -1, SQLITE_STATIC);
    int rc;
    long last_step = -1, last_rank = -1;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *rec = json_loads((const char *)sqlite3_column_text(st, 3), 0, NULL);
        json_t *ms = json_object_get(rec, "ms");
        if (!json_is_object(ms)) {
            json_decref(rec);
            continue;
        }
        int attempt = sqlite3_column_int(st, 0), rank = sqlite3_column_int(st, 1);
        long step = (long)sqlite3_column_int64(st, 2);
        char key[32];
        snprintf(key, sizeof key, "%d.%d", attempt, rank);
        json_t *node = json_object_get(nodes, key);
        json_t *row = json_pack("{s:I, s:i, s:i, s:O, s:O}", "step", (json_int_t)step, "rank", rank,
                                "attempt", attempt, "node", node ? node : json_null(), "ms", ms);
        json_decref(rec);
        if (step == last_step && rank == last_rank && json_array_size(q->rows) > 0)
            json_array_set_new(q->rows, json_array_size(q->rows) - 1, row);
        else
            json_array_append_new(q->rows, row);
        last_step = step, last_rank = rank;
    }
    sqlite3_reset(st);
    json_decref(nodes);
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
fail:
    json_decref(nodes);
    return STORE_ERR;
}

int joblogs_metrics(struct http_req *req) {
    struct job_lookup l = {0};
    if (find_job(req, &l) != 0) return 0;
    const char *rs = http_query(req, "rank");
    int rank = 0;
    if (rank_check(req, &l, rs, &rank) != 0) return 0;
    struct series_q q = {l.id, rank, json_array(), json_array()};
    if (store_read(req->ld->store, series_read, &q) != STORE_OK) {
        json_decref(q.series);
        json_decref(q.evals);
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read metrics");
    }
    struct ranks_q rq = {l.id, json_array()};
    if (store_read(req->ld->store, ranks_read, &rq) != STORE_OK) {
        json_decref(q.series);
        json_decref(q.evals);
        json_decref(rq.rows);
        return http_error(req, 503, "STORE_UNAVAILABLE", "could not read metrics");
    }
    return http_reply_json(req, 200,
                           json_pack("{s:s, s:i, s:o, s:o, s:o}", "job", l.id, "rank", q.rank,
                                     "series", q.series, "evals", q.evals, "ranks", rq.rows));
}
