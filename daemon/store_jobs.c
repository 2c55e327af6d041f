/* Jobs in the store: insert, read, filtered listing, idempotency keys and the
 * job state machine (transition table + event rows). All functions run inside
 * a store_read/store_write callback; see store.h. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "daemon/events.h"
#include "daemon/store.h"

static const char *const state_names[JOB_STATE_COUNT] = {
    "queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled"};

/* allowed[from] = mask of states reachable from `from`. */
static const unsigned allowed[JOB_STATE_COUNT] = {
    [JOB_QUEUED] = JOB_MASK(JOB_STARTING) | JOB_MASK(JOB_CANCELLED) | JOB_MASK(JOB_FAILED),
    [JOB_STARTING] = JOB_MASK(JOB_RUNNING) | JOB_MASK(JOB_QUEUED) | JOB_MASK(JOB_CANCELLING) |
                     JOB_MASK(JOB_FAILED) | JOB_MASK(JOB_CANCELLED),
    [JOB_RUNNING] = JOB_MASK(JOB_SUCCEEDED) | JOB_MASK(JOB_FAILED) | JOB_MASK(JOB_QUEUED) |
                    JOB_MASK(JOB_CANCELLING),
    [JOB_CANCELLING] = JOB_MASK(JOB_CANCELLED) | JOB_MASK(JOB_FAILED) | JOB_MASK(JOB_SUCCEEDED),
    [JOB_SUCCEEDED] = 0,
    [JOB_FAILED] = 0,
    [JOB_CANCELLED] = 0,
};

const char *job_state_name(enum job_state s) {
    return (unsigned)s < JOB_STATE_COUNT ? state_names[s] : "unknown";
}

int job_state_parse(const char *name) {
    for (int i = 0; name && i < JOB_STATE_COUNT; i++)
        if (strcmp(name, state_names[i]) == 0) return i;
    return -1;
}

int job_state_terminal(enum job_state s) {
    return s == JOB_SUCCEEDED || s == JOB_FAILED || s == JOB_CANCELLED;
}

int job_transition_allowed(enum job_state from, enum job_state to) {
    if ((unsigned)from >= JOB_STATE_COUNT || (unsigned)to >= JOB_STATE_COUNT) return 0;
    return (allowed[from] & JOB_MASK(to)) != 0;
}

static char *dup_col(sqlite3_stmt *st, int i) {
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

void store_job_clear(struct store_job *j) {
    if (!j) return;
    free(j->name);
    free(j->spec);
    free(j->labels);
    free(j->out_dir);
    free(j->pending_reason);
    free(j->placement);
    memset(j, 0, sizeof *j);
}

#define JOB_COLS                                                                                   \
    "seq, id, tenant_id, name, state, attempt, priority, max_retries, world_size, spec, labels, "  \
    "out_dir, pending_reason, placement, created_at, updated_at, started_at, finished_at, tp, "    \
    "device, gpus_per_node, preemptions"

#define JOB_COLS_NO_SPEC                                                                           \
    "seq, id, tenant_id, name, state, attempt, priority, max_retries, world_size, NULL, labels, "  \
    "out_dir, pending_reason, placement, created_at, updated_at, started_at, finished_at, tp, "    \
    "device, gpus_per_node, preemptions"

static void job_from_row(sqlite3_stmt *st, struct store_job *j) {
    memset(j, 0, sizeof *j);
    j->seq = sqlite3_column_int64(st, 0);
    snprintf(j->id, sizeof j->id, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(j->tenant_id, sizeof j->tenant_id, "%s", (const char *)sqlite3_column_text(st, 2));
    j->name = dup_col(st, 3);
    int s = job_state_parse((const char *)sqlite3_column_text(st, 4));
    j->state = s < 0 ? JOB_FAILED : (enum job_state)s;
    j->attempt = sqlite3_column_int(st, 5);
    j->priority = sqlite3_column_int(st, 6);
    j->max_retries = sqlite3_column_int(st, 7);
    j->world_size = sqlite3_column_int(st, 8);
    j->spec = dup_col(st, 9);
    j->labels = dup_col(st, 10);
    j->out_dir = dup_col(st, 11);
    j->pending_reason = dup_col(st, 12);
    j->placement = dup_col(st, 13);
    j->created_at = sqlite3_column_int64(st, 14);
    j->updated_at = sqlite3_column_int64(st, 15);
    j->started_at = sqlite3_column_int64(st, 16);
    j->finished_at = sqlite3_column_int64(st, 17);
    j->tp = sqlite3_column_int(st, 18);
    const unsigned char *dev = sqlite3_column_text(st, 19);
    snprintf(j->device, sizeof j->device, "%s", dev ? (const char *)dev : "cuda");
    j->gpus_per_node = sqlite3_column_int(st, 20);
    j->preemptions = sqlite3_column_int(st, 21);
}

json_t *store_time_json(int64_t ms) {
    if (ms <= 0) return json_null();
    time_t sec = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    char buf[96];
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    return json_string(buf);
}

static json_t *json_or(const char *text, json_t *dflt) {
    json_t *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    if (v) {
        json_decref(dflt);
        return v;
    }
    return dflt;
}

json_t *store_job_to_json(const struct store_job *j) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "tenant_id", json_string(j->tenant_id));
    json_object_set_new(o, "name", json_string(j->name ? j->name : ""));
    json_object_set_new(o, "state", json_string(job_state_name(j->state)));
    json_object_set_new(o, "attempt", json_integer(j->attempt));
    json_object_set_new(o, "priority", json_integer(j->priority));
    json_object_set_new(o, "max_retries", json_integer(j->max_retries));
    json_object_set_new(o, "preemptions", json_integer(j->preemptions));
    json_object_set_new(o, "world_size", json_integer(j->world_size));
    json_object_set_new(o, "labels", json_or(j->labels, json_object()));
    json_object_set_new(o, "pending_reason",
                        j->pending_reason ? json_string(j->pending_reason) : json_null());
    json_object_set_new(o, "placement", json_or(j->placement, json_null()));
    json_object_set_new(o, "out_dir", json_string(j->out_dir ? j->out_dir : ""));
    json_object_set_new(o, "created_at", store_time_json(j->created_at));
    json_object_set_new(o, "updated_at", store_time_json(j->updated_at));
    json_object_set_new(o, "started_at", store_time_json(j->started_at));
    json_object_set_new(o, "finished_at", store_time_json(j->finished_at));
    if (j->spec) json_object_set_new(o, "spec", json_or(j->spec, json_object()));
    return o;
}

char *store_job_dumps(const struct store_job *j, int with_spec) {
    /* The JSON-text columns (labels, placement, spec) were written by loomd
     * as JSON; splice them in rather than parse and print them again. */
    struct store_job tmp = *j;
    tmp.spec = tmp.labels = tmp.placement = NULL;
    json_t *o = store_job_to_json(&tmp);
    json_object_del(o, "labels");
    json_object_del(o, "placement");
    char *head = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!head) return NULL;
    const char *labels = j->labels && j->labels[0] ? j->labels : "{}";
    const char *placement = j->placement && j->placement[0] ? j->placement : "null";
    const char *spec = with_spec && j->spec && j->spec[0] ? j->spec : NULL;
    size_t hl = strlen(head), ll = strlen(labels), pl = strlen(placement);
    size_t sl = spec ? strlen(spec) : 0;
    char *out = malloc(hl + ll + pl + sl + 48);
    if (!out) {
        free(head);
        return NULL;
    }
    size_t n = hl - 1; /* head ends with '}' */
    memcpy(out, head, n);
    n += (size_t)sprintf(out + n, ",\"labels\":");
    memcpy(out + n, labels, ll);
    n += ll;
    n += (size_t)sprintf(out + n, ",\"placement\":");
    memcpy(out + n, placement, pl);
    n += pl;
    if (spec) {
        n += (size_t)sprintf(out + n, ",\"spec\":");
        memcpy(out + n, spec, sl);
        n += sl;
    }
    out[n++] = '}';
    out[n++] = '\n';
    out[n] = 0;
    free(head);
    return out;
}

static int insert_event(struct store_tx *tx, int64_t seq, int64_t at, const char *from,
                        const char *to, int attempt, const char *reason) {
    sqlite3_stmt *st = store_stmt(tx, "INSERT INTO job_events(job_seq, at, from_state, to_state, "
                                      "attempt, reason) VALUES (?,?,?,?,?,?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, seq);
    sqlite3_bind_int64(st, 2, at);
    if (from)
        sqlite3_bind_text(st, 3, from, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_text(st, 4, to, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, attempt);
    sqlite3_bind_text(st, 6, reason ? reason : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        log_error("store: event insert: %s", sqlite3_errmsg(store_tx_db(tx)));
        return STORE_ERR;
    }
    return STORE_OK;
}

int store_job_insert(struct store_tx *tx, const struct store_job_new *nj, struct store_job *out) {
    char id[24];
    if (store_new_id("j-", id, sizeof id) != STORE_OK) return STORE_ERR;
    char *labels = nj->labels ? json_dumps(nj->labels, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char out_dir[4096];
    snprintf(out_dir, sizeof out_dir, "%s/%s", nj->out_dir_root ? nj->out_dir_root : ".", id);
    const char *pending = nj->pending_reason ? nj->pending_reason : "waiting for the scheduler";
    int64_t now = store_now_ms();
    int ret = STORE_ERR;
    sqlite3_stmt *st = store_stmt(
        tx,
        "INSERT INTO jobs(id, tenant_id, name, state, attempt, priority, max_retries, "
        "world_size, spec, labels, out_dir, pending_reason, created_at, updated_at, tp, device, "
        "gpus_per_node) VALUES (?,?,?,'queued',0,?,?,?,?,?,?,?,?,?,?,?,?)");
    if (!st) goto out;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, nj->tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, nj->name ? nj->name : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, nj->priority);
    sqlite3_bind_int(st, 5, nj->max_retries);
    sqlite3_bind_int(st, 6, nj->world_size);
    sqlite3_bind_text(st, 7, nj->spec_json, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, labels ? labels : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, out_dir, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, pending, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 11, now);
    sqlite3_bind_int64(st, 12, now);
    sqlite3_bind_int(st, 13, nj->tp > 0 ? nj->tp : 1);
    sqlite3_bind_text(st, 14, nj->device ? nj->device : "cuda", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 15, nj->gpus_per_node);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        log_error("store: job insert: %s", sqlite3_errmsg(store_tx_db(tx)));
        ret = rc == SQLITE_CONSTRAINT_UNIQUE ? STORE_CONFLICT : STORE_ERR;
        goto out;
    }
    int64_t seq = sqlite3_last_insert_rowid(store_tx_db(tx));
    if (insert_event(tx, seq, now, NULL, "queued", 0, "submitted")) goto out;
    {
        json_t *d = json_pack("{s:s, s:s, s:i, s:s}", "name", nj->name ? nj->name : "", "state",
                              "queued", "attempt", 0, "reason", "submitted");
        int64_t ev = events_emit(tx, "job.queued", id, nj->tenant_id, d);
        json_decref(d);
        if (ev < 0) goto out;
    }
    if (nj->labels) {
        sqlite3_stmt *ls =
            store_stmt(tx, "INSERT OR IGNORE INTO job_labels(job_seq, key, value) VALUES (?,?,?)");
        if (!ls) goto out;
        const char *k;
        json_t *v;
        json_object_foreach(nj->labels, k, v) {
            if (!json_is_string(v)) continue;
            sqlite3_reset(ls);
            sqlite3_bind_int64(ls, 1, seq);
            sqlite3_bind_text(ls, 2, k, -1, SQLITE_STATIC);
            sqlite3_bind_text(ls, 3, json_string_value(v), -1, SQLITE_STATIC);
            if (sqlite3_step(ls) != SQLITE_DONE) {
                sqlite3_reset(ls);
                goto out;
            }
        }
        sqlite3_reset(ls);
    }
    if (out) {
        memset(out, 0, sizeof *out);
        out->seq = seq;
        snprintf(out->id, sizeof out->id, "%s", id);
        snprintf(out->tenant_id, sizeof out->tenant_id, "%s", nj->tenant_id);
        out->name = strdup(nj->name ? nj->name : "");
        out->state = JOB_QUEUED;
        out->priority = nj->priority;
        out->max_retries = nj->max_retries;
        out->world_size = nj->world_size;
        out->tp = nj->tp > 0 ? nj->tp : 1;
        snprintf(out->device, sizeof out->device, "%s", nj->device ? nj->device : "cuda");
        out->gpus_per_node = nj->gpus_per_node;
        out->spec = strdup(nj->spec_json);
        out->labels = strdup(labels ? labels : "{}");
        out->out_dir = strdup(out_dir);
        out->pending_reason = strdup(pending);
        out->created_at = out->updated_at = now;
    }
    ret = STORE_OK;
out:
    free(labels);
    return ret;
}

int store_job_get(struct store_tx *tx, const char *tenant_id, const char *id,
                  struct store_job *out) {
    sqlite3_stmt *st =
        tenant_id ? store_stmt(tx, "SELECT " JOB_COLS " FROM jobs WHERE id = ? AND tenant_id = ?")
                  : store_stmt(tx, "SELECT " JOB_COLS " FROM jobs WHERE id = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (tenant_id) sqlite3_bind_text(st, 2, tenant_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) job_from_row(st, out);
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : rc == SQLITE_DONE ? STORE_NOT_FOUND : STORE_ERR;
}

int store_job_foreach(struct store_tx *tx, const struct store_job_filter *f,
                      int (*cb)(const struct store_job *j, void *arg), void *arg) {
    /* The SQL varies with the filter, so it is built here and cached by text
     * (a handful of shapes). Every value is bound, never formatted in. */
    char sql[1024];
    int n = snprintf(sql, sizeof sql, "SELECT %s FROM jobs WHERE 1",
                     f->skip_spec ? JOB_COLS_NO_SPEC : JOB_COLS);
    if (f->tenant_id) n += snprintf(sql + n, sizeof sql - n, " AND tenant_id = ?1");
    int nstates = 0;
    for (int s = 0; s < JOB_STATE_COUNT; s++)
        nstates += (f->state_mask & JOB_MASK(s)) != 0;
    if (nstates == 1) {
        /* '=' lets SQLite walk the (tenant_id, state, seq) index in order. */
        for (int s = 0; s < JOB_STATE_COUNT; s++)
            if (f->state_mask & JOB_MASK(s))
                n += snprintf(sql + n, sizeof sql - n, " AND state = '%s'", state_names[s]);
    } else if (f->state_mask) {
        n += snprintf(sql + n, sizeof sql - n, " AND state IN (");
        int first = 1;
        for (int s = 0; s < JOB_STATE_COUNT; s++) {
            if (!(f->state_mask & JOB_MASK(s))) continue;
            n += snprintf(sql + n, sizeof sql - n, "%s'%s'", first ? "" : ",", state_names[s]);
            first = 0;
        }
        n += snprintf(sql + n, sizeof sql - n, ")");
    }
    if (f->name) n += snprintf(sql + n, sizeof sql - n, " AND name = ?2");
    if (f->label_key)
        n += snprintf(sql + n, sizeof sql - n,
                      " AND seq IN (SELECT job_seq FROM job_labels WHERE key = ?3 AND value = ?4)");
    if (f->before_seq > 0) n += snprintf(sql + n, sizeof sql - n, " AND seq < ?5");
    if (f->after_seq > 0) n += snprintf(sql + n, sizeof sql - n, " AND seq > ?6");
    if (f->by_priority)
        n += snprintf(sql + n, sizeof sql - n, " ORDER BY priority DESC, seq ASC LIMIT ?7");
    else
        n += snprintf(sql + n, sizeof sql - n, " ORDER BY seq %s LIMIT ?7",
                      f->ascending ? "ASC" : "DESC");
    sqlite3_stmt *st = store_stmt(tx, sql);
    if (!st) return STORE_ERR;
    if (f->tenant_id) sqlite3_bind_text(st, 1, f->tenant_id, -1, SQLITE_STATIC);
    if (f->name) sqlite3_bind_text(st, 2, f->name, -1, SQLITE_STATIC);
    if (f->label_key) {
        sqlite3_bind_text(st, 3, f->label_key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, f->label_value ? f->label_value : "", -1, SQLITE_STATIC);
    }
    if (f->before_seq > 0) sqlite3_bind_int64(st, 5, f->before_seq);
    if (f->after_seq > 0) sqlite3_bind_int64(st, 6, f->after_seq);
    sqlite3_bind_int(st, 7, f->limit > 0 ? f->limit : 100);
    int rc, count = 0, ret = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct store_job j;
        job_from_row(st, &j);
        ret = cb(&j, arg);
        store_job_clear(&j);
        count++;
        if (ret != 0) break;
    }
    sqlite3_reset(st);
    if (ret != 0) return ret;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        log_error("store: job list: %s", sqlite3_errmsg(store_tx_db(tx)));
        return STORE_ERR;
    }
    return count;
}

int store_job_transition(struct store_tx *tx, const char *id, unsigned from_mask, enum job_state to,
                         const struct job_change *ch, struct store_job *out) {
    struct store_job j;
    int rc = store_job_get(tx, NULL, id, &j);
    if (rc) return rc;
    int ret = STORE_BAD_STATE;
    if (from_mask && !(from_mask & JOB_MASK(j.state))) goto out;
    if (!job_transition_allowed(j.state, to)) goto out;
    if (ch && ch->expect_attempt >= 0 && ch->expect_attempt != j.attempt) goto out;
    int64_t now = store_now_ms();
    int retry = to == JOB_QUEUED && (j.state == JOB_STARTING || j.state == JOB_RUNNING);
    int attempt = j.attempt + (retry ? 1 : 0);
    /* A requeue for a higher-priority job uses no retry (migration 140). */
    int preempted = retry && ch && ch->reason && !strncmp(ch->reason, "PREEMPTED", 9);
    const char *pending = NULL;
    if (to == JOB_QUEUED)
        pending = ch && ch->pending_reason ? ch->pending_reason : "waiting for resources";
    sqlite3_stmt *st = store_stmt(
        tx, "UPDATE jobs SET state = ?2, attempt = ?3, pending_reason = ?4, updated_at = ?5, "
            "placement = CASE WHEN ?6 THEN NULL WHEN ?7 IS NOT NULL THEN ?7 ELSE placement END, "
            "started_at = CASE WHEN ?6 THEN NULL WHEN ?8 THEN ?5 ELSE started_at END, "
            "finished_at = CASE WHEN ?9 THEN ?5 ELSE finished_at END, "
            "preemptions = preemptions + ?10 WHERE seq = ?1");
    if (!st) {
        ret = STORE_ERR;
        goto out;
    }
    sqlite3_bind_int64(st, 1, j.seq);
    sqlite3_bind_text(st, 2, state_names[to], -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, attempt);
    if (pending)
        sqlite3_bind_text(st, 4, pending, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 4);
    sqlite3_bind_int64(st, 5, now);
    sqlite3_bind_int(st, 6, retry);
    if (ch && ch->placement && to == JOB_STARTING)
        sqlite3_bind_text(st, 7, ch->placement, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 7);
    sqlite3_bind_int(st, 8, to == JOB_RUNNING);
    sqlite3_bind_int(st, 9, job_state_terminal(to));
    sqlite3_bind_int(st, 10, preempted);
    rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        log_error("store: job transition: %s", sqlite3_errmsg(store_tx_db(tx)));
        ret = STORE_ERR;
        goto out;
    }
    const char *reason = ch && ch->reason ? ch->reason : "";
    if (insert_event(tx, j.seq, now, state_names[j.state], state_names[to], attempt, reason)) {
        ret = STORE_ERR;
        goto out;
    }
    /* The typed event of the stream (daemon/events.h), same transaction. */
    const char *etype = events_type_for_transition((int)j.state, (int)to, reason);
    if (etype) {
        json_t *d = json_pack("{s:s, s:s, s:s, s:i, s:s}", "name", j.name ? j.name : "", "state",
                              state_names[to], "from", state_names[j.state], "attempt", attempt,
                              "reason", reason);
        int64_t ev = events_emit(tx, etype, j.id, j.tenant_id, d);
        json_decref(d);
        if (ev < 0) {
            ret = STORE_ERR;
            goto out;
        }
    }
    ret = STORE_OK;
    if (out) ret = store_job_get(tx, NULL, id, out);
out:
    store_job_clear(&j);
    return ret;
}

int store_job_set_pending(struct store_tx *tx, const char *id, const char *pending_reason) {
    sqlite3_stmt *st =
        store_stmt(tx, "UPDATE jobs SET pending_reason = ? WHERE id = ? AND state = 'queued'");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, pending_reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return STORE_ERR;
    return sqlite3_changes(store_tx_db(tx)) ? STORE_OK : STORE_NOT_FOUND;
}

int store_job_events(struct store_tx *tx, int64_t job_seq, json_t **out) {
    sqlite3_stmt *st = store_stmt(tx, "SELECT id, at, from_state, to_state, attempt, reason "
                                      "FROM job_events WHERE job_seq = ? ORDER BY id");
    if (!st) return STORE_ERR;
    sqlite3_bind_int64(st, 1, job_seq);
    json_t *arr = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *from = sqlite3_column_text(st, 2);
        json_array_append_new(arr, json_pack("{s:I, s:o, s:o, s:s, s:i, s:s}", "id",
                                             (json_int_t)sqlite3_column_int64(st, 0), "at",
                                             store_time_json(sqlite3_column_int64(st, 1)), "from",
                                             from ? json_string((const char *)from) : json_null(),
                                             "to", (const char *)sqlite3_column_text(st, 3),
                                             "attempt", sqlite3_column_int(st, 4), "reason",
                                             (const char *)sqlite3_column_text(st, 5)));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        json_decref(arr);
        return STORE_ERR;
    }
    *out = arr;
    return STORE_OK;
}

int store_job_counts(struct store_tx *tx, json_t **out) {
    sqlite3_stmt *st =
        store_stmt(tx, "SELECT tenant_id, state, COUNT(*) FROM jobs GROUP BY tenant_id, state");
    if (!st) return STORE_ERR;
    json_t *o = json_object();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        json_t *per = json_object_get(o, t);
        if (!per) {
            per = json_object();
            json_object_set_new(o, t, per);
        }
        json_object_set_new(per, (const char *)sqlite3_column_text(st, 1),
                            json_integer(sqlite3_column_int64(st, 2)));
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        json_decref(o);
        return STORE_ERR;
    }
    *out = o;
    return STORE_OK;
}

int store_idem_lookup(struct store_tx *tx, const char *tenant_id, const char *key,
                      const unsigned char hash[32], char *job_id, size_t len, int *same) {
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT request_hash, job_id FROM idempotency WHERE tenant_id = ? AND key = ?");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st), ret = STORE_NOT_FOUND;
    if (rc == SQLITE_ROW) {
        const void *h = sqlite3_column_blob(st, 0);
        *same = h && sqlite3_column_bytes(st, 0) == 32 && memcmp(h, hash, 32) == 0;
        snprintf(job_id, len, "%s", (const char *)sqlite3_column_text(st, 1));
        ret = STORE_OK;
    } else if (rc != SQLITE_DONE) {
        ret = STORE_ERR;
    }
    sqlite3_reset(st);
    return ret;
}

int store_idem_insert(struct store_tx *tx, const char *tenant_id, const char *key,
                      const unsigned char hash[32], const char *job_id) {
    sqlite3_stmt *st = store_stmt(tx, "INSERT INTO idempotency(tenant_id, key, request_hash, "
                                      "job_id, created_at) VALUES (?,?,?,?,?)");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, tenant_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, hash, 32, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, job_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, store_now_ms());
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) return STORE_CONFLICT;
    return rc == SQLITE_DONE ? STORE_OK : STORE_ERR;
}
