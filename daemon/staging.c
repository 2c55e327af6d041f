/* POST /v1/jobs/{id}/staging: a staging report becomes a job event (see
 * daemon/staging.h). Reports with "phase" come from tokenizing raw data on the node:
 * "tokenizing" with "progress" (0..1, done_bytes, total_bytes) or with "error" (fatal: the
 * job fails), and "tokenized" with the counts of the result. The event keeps the job's state (from
 * = to = current) and the reporting attempt; nothing else changes. */
#include "daemon/staging.h"

#include <stdio.h>
#include <string.h>

#include "common/token.h"
#include "daemon/cluster.h"
#include "daemon/http.h"
#include "daemon/loomd.h"
#include "daemon/store.h"

struct event_op {
    const char *job;
    int attempt;
    const char *reason;
};

/* One job_events row with the job's state unchanged (store_job_note). */
static int add_event(struct store_tx *tx, void *arg) {
    struct event_op *op = arg;
    return store_job_note(tx, op->job, op->attempt, op->reason);
}

static void human(double b, char *out, size_t len) {
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) {
        b /= 1000;
        u++;
    }
    snprintf(out, len, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

int staging_report(struct http_req *req) {
    const char *job = http_param(req, "id");
    json_t *b = req->json;
    json_t *ja = json_object_get(b, "attempt");
    if (!json_is_integer(ja))
        return http_error_field(req, 422, "INVALID_FIELD", "attempt", "attempt is required");
    int attempt = (int)json_integer_value(ja);
    /* The attempt's rendezvous token, compared in constant time. */
    struct cluster *c = req->ld->cluster;
    int ok = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        struct cluster_attempt *a = cluster_attempt_find(c, job, attempt);
        ok = a && token_equal(req->bearer, a->token);
        pthread_mutex_unlock(&c->mu);
    }
    if (!ok)
        return http_error(req, 403, "STAGING_FORBIDDEN",
                          "not the token of attempt %d of job '%s' (or it is not active)", attempt,
                          job);
    const char *host = json_string_value(json_object_get(b, "host"));
    const char *err = json_string_value(json_object_get(b, "error"));
    const char *phase = json_string_value(json_object_get(b, "phase"));
    char reason[700], bytes[32], copied[32];
    if (!host) host = "?";
    human((double)json_integer_value(json_object_get(b, "bytes")), bytes, sizeof bytes);
    human((double)json_integer_value(json_object_get(b, "copied_bytes")), copied, sizeof copied);
    if (phase && !strcmp(phase, "tokenizing") && err)
        /* the worker cannot read raw data: the job fails (loom-stage exits 2 or 1) */
        snprintf(reason, sizeof reason, "tokenizing on %.100s failed: %.500s; the job fails", host,
                 err);
    else if (phase && !strcmp(phase, "tokenizing")) {
        double f = json_number_value(json_object_get(b, "progress"));
        human((double)json_integer_value(json_object_get(b, "done_bytes")), bytes, sizeof bytes);
        human((double)json_integer_value(json_object_get(b, "total_bytes")), copied, sizeof copied);
        snprintf(reason, sizeof reason, "tokenizing on %.100s: %d%% (%s of %s)", host,
                 (int)(f * 100 + 1e-9), bytes, copied);
    } else if (phase && !strcmp(phase, "tokenized")) {
        long long splits = (long long)json_integer_value(json_object_get(b, "splits"));
        long long hits = (long long)json_integer_value(json_object_get(b, "cache_hits"));
        const char *key = json_string_value(json_object_get(b, "key"));
        snprintf(reason, sizeof reason,
                 "data tokenized on %.100s%s: %lld examples, %lld train tokens (%lld in the "
                 "loss), %lld val tokens in %.2f s (cache %.12s)",
                 host, hits == splits ? " (found in the cache)" : "",
                 (long long)json_integer_value(json_object_get(b, "examples")),
                 (long long)json_integer_value(json_object_get(b, "train_tokens")),
                 (long long)json_integer_value(json_object_get(b, "loss_tokens")),
                 (long long)json_integer_value(json_object_get(b, "val_tokens")),
                 json_number_value(json_object_get(b, "seconds")), key ? key : "?");
    } else if (err)
        snprintf(reason, sizeof reason,
                 "data staging on %.100s failed (%.400s); reading the source", host, err);
    else
        snprintf(
            reason, sizeof reason,
            "data staged on %.100s: %lld files, %s (%lld from the cache, %s copied) in %.2f s%s",
            host, (long long)json_integer_value(json_object_get(b, "files")), bytes,
            (long long)json_integer_value(json_object_get(b, "cache_hits")), copied,
            json_number_value(json_object_get(b, "seconds")),
            json_integer_value(json_object_get(b, "evicted")) ? ", evicted old files" : "");
    struct event_op op = {job, attempt, reason};
    int rc = store_write(req->ld->store, add_event, &op);
    if (rc == STORE_NOT_FOUND) return http_error(req, 404, "JOB_NOT_FOUND", "no job '%s'", job);
    if (rc != STORE_OK) return http_error(req, 503, "STORE_UNAVAILABLE", "could not record");
    return http_reply_json(req, 200, json_pack("{s:s}", "event", reason));
}
