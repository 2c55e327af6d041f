/* loom-stage: stages a job's data into the node-local cache, then execs the
 * worker (agent/stage.h). Set it as loom-agent's worker binary
 * (`worker = /usr/local/bin/loom-stage`); it takes the worker's command line
 * unchanged and is configured through the agent's environment, which the
 * agent passes on to workers:
 *   LOOM_STAGE_DIR      cache root (e.g. /var/cache/loom-agent); unset: no
 *                       staging, the worker is exec'ed at once
 *   LOOM_STAGE_MAX_GB   cache size limit (default 100)
 *   LOOM_STAGE_WORKER   the real worker (default: loom-worker beside loom-stage)
 *   LOOM_TOKEN_CACHE_MAX_GIB  the token cache's cap (LOOM_STAGE_DIR/tokens; default 50, 0
 *                       none; loom-agent --token-cache-max-gib sets it): least recently used
 *                       entries no running job holds are evicted past it
 * The staged spec is written next to the original (SPEC.staged.json) and
 * passed with --spec. Local rank 0 prints one JSON line
 * {"type":"stage","files","cache_hits","bytes","copied_bytes","seconds",
 * "evicted","cache_bytes"[,"error"]} and reports it to loomd
 * (POST /v1/jobs/{id}/staging with the attempt's token), which records a job
 * event. Ranks of one job on one node serialise on the cache lock: the first
 * copies, the others find the files cached. If staging fails the worker reads
 * the original paths (the event says why).
 *
 * Raw data (data.format text, jsonl, chat, completion, webdataset) is tokenized first into
 * LOOM_STAGE_DIR/tokens (agent/stage/tokenize.h; LOOM_STAGE_THREADS encoding threads,
 * default 2) and the spec pointed at the shards; those are node-local already, so they are
 * not copied again. Local rank 0 reports the progress (a {"type":"stage","phase":
 * "tokenizing","progress"} line and a staging report per 10% or 5 s) and the result. A
 * tokenizing failure cannot fall back (the worker reads shards only): loom-stage prints the
 * worker's error record ({"type":"error","code":"DATA_INVALID","message"}), reports it to
 * loomd as fatal and exits 2 (bad data: the job fails without retry) or 1. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/stage.h"
#include "agent/stage/tokenize.h"
#include "api/client.h"
#include "api/exit_codes.h"
#include "common/clock.h"
#include "data/prepare.h"

/* loomd's base URL from LOOM_RDZV (http://host:port/v1/rdzv/JOB/ATTEMPT). */
static int coordinator_of(char *out, size_t len) {
    const char *r = getenv("LOOM_RDZV");
    if (!r || strncmp(r, "http", 4)) return -1;
    const char *v = strstr(r, "/v1/");
    if (!v) return -1;
    snprintf(out, len, "%.*s", (int)(v - r), r);
    return 0;
}

static void report(json_t *line) {
    char base[512], path[256], host[128] = "";
    const char *job = getenv("LOOM_JOB"), *tok = getenv("LOOM_RDZV_TOKEN");
    const char *att = getenv("LOOM_ATTEMPT");
    if (!job || !tok || !att || coordinator_of(base, sizeof base) != 0) return;
    gethostname(host, sizeof host - 1);
    json_t *body = json_deep_copy(line);
    json_object_del(body, "type");
    json_object_set_new(body, "attempt", json_integer(atoi(att)));
    json_object_set_new(body, "host", json_string(host));
    snprintf(path, sizeof path, "/v1/jobs/%s/staging", job);
    client_global_init();
    struct client *c = client_new(base, tok);
    if (c) {
        long status = 0;
        json_t *reply = NULL;
        client_set_timeout_ms(c, 5000);
        if (client_request(c, "POST", path, body, &status, &reply, NULL, NULL, 0) != 0 ||
            status >= 400)
            fprintf(stderr, "loom-stage: could not report staging to loomd (HTTP %ld)\n", status);
        json_decref(reply);
        client_free(c);
    }
    json_decref(body);
}

static int is_rank0(void) {
    const char *lr = getenv("LOOM_LOCAL_RANK");
    return !lr || !strcmp(lr, "0");
}

static void emit(json_t *line) {
    char *s = json_dumps(line, JSON_COMPACT);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
}

struct progress {
    double last_s;
    int last_tenth;
};

/* Tokenizing progress: a line and a report to loomd at every tenth and at most every 5 s
 * between them (never more than once a second). */
static void on_progress(void *user, uint64_t done, uint64_t total) {
    struct progress *p = user;
    double now = clock_mono_s(), f = total ? (double)done / (double)total : 1.0;
    int tenth = (int)(f * 10);
    if (tenth == 10 && p->last_tenth == 10) return; /* the end is said once */
    if (done != 0 && done != total && now - p->last_s < 1.0) return;
    if (done != 0 && done != total && tenth == p->last_tenth && now - p->last_s < 5.0) return;
    p->last_s = now;
    p->last_tenth = tenth;
    json_t *line =
        json_pack("{s:s,s:s,s:f,s:I,s:I}", "type", "stage", "phase", "tokenizing", "progress", f,
                  "done_bytes", (json_int_t)done, "total_bytes", (json_int_t)total);
    emit(line);
    report(line);
    json_decref(line);
}

/* Tokenizes raw data into the cache; 0 (spec rewritten, or nothing to do) or the exit
 * status the job fails with. *tokenized tells whether the data is now cached shards. */
static int tokenize(const char *dir, json_t *spec, int *tokenized) {
    const char *th = getenv("LOOM_STAGE_THREADS");
    int threads = th && *th ? atoi(th) : 2;
    const char *cg = getenv("LOOM_TOKEN_CACHE_MAX_GIB");
    long long max_bytes = (long long)((cg && *cg ? atof(cg) : 50.0) * 1073741824.0);
    struct progress pr = {0, -1};
    struct stage_tok_report r;
    char err[1024] = "";
    int rank0 = is_rank0();
    int rc = stage_tokenize_spec(dir, spec, threads, max_bytes, rank0 ? on_progress : NULL, &pr, &r,
                                 err, sizeof err);
    *tokenized = r.tokenized;
    if (!r.tokenized) return 0;
    if (rc == PREP_OK && rank0) {
        json_t *line = json_pack("{s:s,s:s,s:i,s:i,s:s,s:I,s:I,s:I,s:I,s:f,s:i,s:I}", "type",
                                 "stage", "phase", "tokenized", "splits", r.splits, "cache_hits",
                                 r.hits, "key", r.key, "examples", (json_int_t)r.examples,
                                 "train_tokens", (json_int_t)r.train_tokens, "val_tokens",
                                 (json_int_t)r.val_tokens, "loss_tokens", (json_int_t)r.loss_tokens,
                                 "seconds", r.seconds, "token_cache_evicted", r.evicted,
                                 "token_cache_bytes", (json_int_t)r.cache_bytes);
        emit(line);
        report(line);
        json_decref(line);
    }
    if (rc == PREP_OK) return 0;
    json_t *line =
        json_pack("{s:s,s:s,s:s}", "type", "error", "code", "DATA_INVALID", "message", err);
    emit(line);
    json_decref(line);
    fprintf(stderr, "loom-stage: tokenizing failed: %s\n", err);
    if (rank0) {
        json_t *rep = json_pack("{s:s,s:s,s:s,s:b}", "type", "stage", "phase", "tokenizing",
                                "error", err, "fatal", 1);
        report(rep);
        json_decref(rep);
    }
    return rc == PREP_EDATA ? LOOM_EXIT_BAD_SPEC : 1;
}

int main(int argc, char **argv) {
    char worker[PATH_MAX + 16];
    const char *w = getenv("LOOM_STAGE_WORKER");
    if (w && *w) {
        snprintf(worker, sizeof worker, "%s", w);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        char *slash = strrchr(self, '/');
        if (slash) slash[1] = 0;
        snprintf(worker, sizeof worker, "%sloom-worker", n > 0 ? self : "");
    }
    const char *dir = getenv("LOOM_STAGE_DIR");
    int spec_i = -1;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--spec")) spec_i = i + 1;
    char staged[PATH_MAX + 16];
    /* Raw data is tokenized whether or not files are staged: the worker reads shards only. */
    if (spec_i > 0) {
        json_error_t je;
        json_t *spec = json_load_file(argv[spec_i], 0, &je);
        int tokenized = 0;
        int trc = spec ? tokenize(dir, spec, &tokenized) : 0;
        if (trc != 0) {
            json_decref(spec);
            return trc;
        }
        if (tokenized) {
            snprintf(staged, sizeof staged, "%s.staged.json", argv[spec_i]);
            if (json_dump_file(spec, staged, JSON_COMPACT) != 0) {
                fprintf(stderr, "loom-stage: cannot write %s\n", staged);
                json_decref(spec);
                return 1;
            }
            argv[spec_i] = staged;
            dir = NULL; /* the shards are in the node-local cache already */
        }
        json_decref(spec);
    }
    if (dir && *dir && spec_i > 0) {
        json_error_t je;
        json_t *spec = json_load_file(argv[spec_i], 0, &je);
        const char *mg = getenv("LOOM_STAGE_MAX_GB");
        struct stage_opts o = {dir, (long long)((mg && *mg ? atof(mg) : 100.0) * 1e9)};
        struct stage_report r;
        char err[512] = "";
        const char *job = getenv("LOOM_JOB");
        int rc =
            spec ? stage_spec(&o, job && *job ? job : "standalone", spec, &r, err, sizeof err) : -1;
        if (!spec) snprintf(err, sizeof err, "cannot read %.300s: %.150s", argv[spec_i], je.text);
        if (rc == 0) {
            snprintf(staged, sizeof staged, "%s.staged.json", argv[spec_i]);
            if (json_dump_file(spec, staged, JSON_COMPACT) == 0) {
                argv[spec_i] = staged;
            } else {
                snprintf(err, sizeof err, "cannot write %.400s", staged);
                rc = -1;
            }
        }
        if (is_rank0()) {
            json_t *line =
                json_pack("{s:s, s:i, s:i, s:I, s:I, s:f, s:i, s:I}", "type", "stage", "files",
                          rc == 0 ? r.files : 0, "cache_hits", rc == 0 ? r.hits : 0, "bytes",
                          (json_int_t)(rc == 0 ? r.bytes : 0), "copied_bytes",
                          (json_int_t)(rc == 0 ? r.copied : 0), "seconds",
                          rc == 0 ? r.seconds : 0.0, "evicted", rc == 0 ? r.evicted : 0,
                          "cache_bytes", (json_int_t)(rc == 0 ? r.cache_bytes : 0));
            if (rc != 0) json_object_set_new(line, "error", json_string(err));
            char *s = json_dumps(line, JSON_COMPACT);
            if (s) printf("%s\n", s);
            fflush(stdout);
            free(s);
            report(line);
            json_decref(line);
        }
        if (rc != 0) fprintf(stderr, "loom-stage: staging failed (%s); reading the source\n", err);
        json_decref(spec);
    }
    argv[0] = worker;
    execv(worker, argv);
    fprintf(stderr, "loom-stage: cannot exec %s: %s\n", worker, strerror(errno));
    return 127;
}
