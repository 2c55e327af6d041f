/* The store: loomd's SQLite database (WAL mode) and the job state machine.
 *
 * Tables come from migrations schema/NNN_name.sql, embedded at build time and
 * applied in order at start-up inside one transaction each; applied versions
 * are recorded in schema_version. Numbering: 001-019 daemon (tenants, tokens,
 * jobs, events, idempotency), 020-039 agent/scheduler (nodes, attempts, usage,
 * logs), 040+ others. To add tables: drop a new file in schema/ and re-run
 * cmake; never edit a migration that has been committed.
 *
 * Writes: one writer thread owns the only write connection. store_write()
 * queues a callback and blocks until the transaction holding it has
 * committed (synchronous=FULL: on disk). Concurrent callers are batched into
 * one transaction (group commit); each callback runs inside its own SAVEPOINT,
 * so a callback that returns < 0 rolls back only its own changes.
 * Reads: store_read() runs a callback on a pooled read-only connection inside
 * a read transaction (a consistent snapshot). Both may be called from any
 * thread; callbacks must not call store_write/store_read themselves.
 *
 * Statements: store_stmt(tx, sql) returns a prepared statement cached per
 * connection (keyed by the SQL text), already reset with bindings cleared.
 * Do not finalize it. */
#ifndef LOOM_DAEMON_STORE_H
#define LOOM_DAEMON_STORE_H

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct store;
struct store_tx; /* a connection inside a transaction, handed to callbacks */

/* Return codes of store functions and callbacks. */
enum {
    STORE_OK = 0,
    STORE_ERR = -1,       /* SQLite or I/O failure (logged where it happened) */
    STORE_NOT_FOUND = -2, /* no such row (or not visible to this tenant) */
    STORE_CONFLICT = -3,  /* uniqueness / idempotency conflict */
    STORE_BAD_STATE = -4, /* transition not allowed from the current state */
};

/* One embedded migration (generated from schema/ by daemon/embed_schema.cmake). */
struct store_migration {
    int version;
    const char *name; /* file name without .sql, e.g. "001_init" */
    const char *sql;
};
extern const struct store_migration store_migrations[];
extern const int store_migrations_count;

struct store_options {
    int sync_full; /* 1: synchronous=FULL (default), 0: NORMAL */
    int max_batch; /* most callbacks per group commit (default 256) */
    int read_max;  /* most read connections open at once (0: 32); more readers wait */
    int read_idle; /* free read connections kept open (0: 4); more are closed */
};

/* Read-pool snapshot (GET /v1/system/connections). */
struct store_pool_stats {
    int open, idle, busy, waiting, max, idle_max;
};
void store_pool_stats(struct store *s, struct store_pool_stats *st);

/* Opens (creating if needed) the database at `path`, applies pending
 * migrations, starts the writer thread. Returns NULL after logging why.
 * opts may be NULL for defaults. Call from main before serving. */
struct store *store_open(const char *path, const struct store_options *opts);
/* Drains queued writes (they commit), stops the writer, checkpoints the WAL and
 * closes every connection. Accepts NULL. No store_* call may run concurrently. */
void store_close(struct store *s);

typedef int (*store_fn)(struct store_tx *tx, void *arg);
/* Durable write: runs fn on the writer thread inside a transaction and returns
 * only after that transaction committed. Returns fn's result (< 0: fn's own
 * changes were rolled back), or STORE_ERR if the commit itself failed. */
int store_write(struct store *s, store_fn fn, void *arg);
/* Read: runs fn on a pooled read-only connection in a read transaction. */
int store_read(struct store *s, store_fn fn, void *arg);
/* Post-commit hook: fn(tx, arg) runs on the writer thread after every group
 * commit that succeeded, outside any transaction (it may read through
 * store_stmt; it must not write). One hook per store; fn NULL removes it.
 * Used to wake waiters only once what they wait for is durable (events). */
void store_set_commit_hook(struct store *s, store_fn fn, void *arg);

/* Cached prepared statement for `sql` on this transaction's connection, reset
 * and with bindings cleared. NULL after logging on a prepare error. */
sqlite3_stmt *store_stmt(struct store_tx *tx, const char *sql);
sqlite3 *store_tx_db(struct store_tx *tx);
/* Runs `sql` (no result rows) once; STORE_OK or STORE_ERR (logged). */
int store_exec(struct store_tx *tx, const char *sql);

/* Milliseconds since the Unix epoch. */
int64_t store_now_ms(void);
/* RFC 3339 UTC string ("2026-11-30T07:10:01.751Z") for ms, or JSON null
 * when ms <= 0. New reference. */
json_t *store_time_json(int64_t ms);
/* Writes `prefix` + 12 random hex digits into out (size >= strlen(prefix)+13).
 * STORE_OK, or STORE_ERR (out is "") when no random bytes could be drawn. */
int store_new_id(const char *prefix, char *out, size_t outlen);
/* Schema version after migrations (highest applied). */
int store_schema_version(struct store *s);

/* Prometheus text for store internals (commit latency histogram, batch sizes,
 * queue depth) appended to `f`. */
void store_metrics_write(struct store *s, FILE *f);

/* ---------------- tenants and tokens (daemon/store_tenants.c) ---------------- */

/* Creates a tenant; id gets "t-..." (idlen >= 16). STORE_CONFLICT if the name
 * is taken. data_roots: JSON array text or NULL for "[]"; gpu_quota: most GPUs
 * its running jobs may hold (0 = unlimited). Write callback use. */
int store_tenant_create(struct store_tx *tx, const char *name, const char *data_roots,
                        long gpu_quota, char *id, size_t idlen);
/* Changes a tenant's gpu_quota (when >= 0) and data_roots (JSON array text,
 * when non-NULL). STORE_NOT_FOUND if there is no such tenant. */
int store_tenant_update(struct store_tx *tx, const char *id, long gpu_quota,
                        const char *data_roots);
/* Fills a JSON object {id,name,data_roots,gpu_quota,created_at} (caller owns)
 * or returns STORE_NOT_FOUND. */
int store_tenant_get(struct store_tx *tx, const char *id, json_t **out);
int store_tenant_list(struct store_tx *tx, json_t **out); /* JSON array */

/* Tenant QoS (schema 090): the admin's limits. max_priority -1, max_running_jobs
 * 0 and gpu_hours_per_month 0 mean no limit. */
struct store_tenant_qos {
    long max_priority;
    long max_running_jobs;
    double gpu_hours_per_month;
    int budget_warn_only; /* schema 180: 1 warn, 0 stop running jobs; update: -1 keeps it */
};
/* Sets the fields that are >= 0 (max_priority: >= -1; pass -2 to keep it);
 * STORE_NOT_FOUND when there is no such tenant. */
int store_tenant_qos_update(struct store_tx *tx, const char *id, const struct store_tenant_qos *q);
int store_tenant_qos_get(struct store_tx *tx, const char *id, struct store_tenant_qos *q);
/* Adds max_priority, max_running_jobs, gpu_hours_per_month, budget_warn_only to a tenant object. */
int store_tenant_qos_json(struct store_tx *tx, const char *id, json_t *obj);
/* GPU-hours of the tenant's usage rows that started at or after since_ms. */
int store_tenant_gpu_hours(struct store_tx *tx, const char *id, int64_t since_ms, double *hours);
/* Stores the SHA-256 `hash` of a new token for the tenant; id gets "k-...". */
int store_token_insert(struct store_tx *tx, const char *tenant_id, const unsigned char hash[32],
                       char *id, size_t idlen);
/* Marks token `token_id` of `tenant_id` revoked (idempotent). */
int store_token_revoke(struct store_tx *tx, const char *tenant_id, const char *token_id);
/* Looks up a live (not revoked) token by hash; writes its tenant id. The
 * stored hash is compared with token_equal_mem. STORE_NOT_FOUND if none. */
int store_token_lookup(struct store_tx *tx, const unsigned char hash[32], char *tenant_id,
                       size_t len);

/* A live token found by hash (store_token_find). */
struct store_token {
    char tenant_id[32];
    char id[32];
    unsigned scopes;    /* AUTH_SCOPE_* bits (daemon/auth.h) */
    int64_t expires_at; /* ms; 0: never */
};
/* Stores a new token (SHA-256 `hash`) with a name, scope bits and expiry
 * (ms, 0: never); id gets "k-...". STORE_NOT_FOUND: no such tenant. */
int store_token_issue(struct store_tx *tx, const char *tenant_id, const unsigned char hash[32],
                      const char *name, unsigned scopes, int64_t expires_at, char *id,
                      size_t idlen);
/* The live (not revoked) token with this hash, expired or not (the caller
 * decides). STORE_NOT_FOUND if none. */
int store_token_find(struct store_tx *tx, const unsigned char hash[32], struct store_token *out);
/* Rotation of token `token_id` of `tenant_id` (live: not revoked, not
 * expired): a new token (SHA-256 `hash`) with the old one's name, scopes and
 * expiry, id into new_id; the old one is revoked now (grace_ms 0) or expires
 * at now + grace_ms (sooner if it expired sooner), written to old_expires_at;
 * out_scopes and out_expires_at get the new token's. STORE_NOT_FOUND if no
 * live token. */
int store_token_rotate(struct store_tx *tx, const char *tenant_id, const char *token_id,
                       const unsigned char hash[32], int64_t grace_ms, char *new_id, size_t idlen,
                       unsigned *out_scopes, int64_t *out_expires_at, int64_t *old_expires_at,
                       char *name, size_t namelen);
/* Records a use of token `id` at `now_ms` (last_used_at). */
int store_token_touch(struct store_tx *tx, const char *id, int64_t now_ms);
/* The tenant's tokens as a JSON array of {id,name,scopes,created_at,
 * last_used_at,expires_at,revoked_at}, oldest first: never the hash. */
int store_token_list(struct store_tx *tx, const char *tenant_id, json_t **out);

/* ---------------- jobs and their state machine (daemon/store_jobs.c) ---------------- */

enum job_state {
    JOB_QUEUED,
    JOB_STARTING,
    JOB_RUNNING,
    JOB_CANCELLING,
    JOB_SUCCEEDED,
    JOB_FAILED,
    JOB_CANCELLED,
    JOB_STATE_COUNT
};
#define JOB_MASK(s) (1u << (s))

const char *job_state_name(enum job_state s);
int job_state_parse(const char *name); /* -1 when unknown */
int job_state_terminal(enum job_state s);
/* The transition table: queued->{starting,cancelled,failed};
 * starting->{running,queued(retry),cancelling,failed,cancelled};
 * running->{succeeded,failed,queued(retry),cancelling};
 * cancelling->{cancelled,failed,succeeded}; terminal states are final. */
int job_transition_allowed(enum job_state from, enum job_state to);

/* A job row as read from the store. Strings are heap copies owned by the
 * struct; store_job_clear frees them. */
struct store_job {
    int64_t seq; /* insertion order (list cursor) */
    char id[24];
    char tenant_id[24];
    char *name;
    enum job_state state;
    int attempt; /* starts at 0; +1 on every retry (-> queued from starting/running) */
    int priority;
    int max_retries;
    int world_size;
    int tp;               /* parallel.tp (tensor-parallel group size) */
    char device[8];       /* resources.device: "cuda" or "cpu" */
    int gpus_per_node;    /* resources.gpus_per_node */
    int preemptions;      /* attempts lost to preemption (they use no retry) */
    char *spec;           /* canonical spec JSON text */
    char *labels;         /* JSON object text */
    char *out_dir;        /* checkpoint/output dir, same for every attempt */
    char *pending_reason; /* NULL unless queued */
    char *placement;      /* JSON text or NULL */
    int64_t created_at, updated_at, started_at, finished_at; /* ms; 0 = unset */
};
void store_job_clear(struct store_job *j);
/* API representation (caller owns): id, name, state, attempt, priority,
 * max_retries, world_size, spec (object), labels, out_dir, pending_reason,
 * placement, created_at/updated_at/started_at/finished_at as RFC 3339 strings
 * (null when unset). */
json_t *store_job_to_json(const struct store_job *j);
/* The same as compact JSON text with a trailing newline (caller frees);
 * with_spec 0 leaves "spec" out (list items). The stored spec text is
 * spliced in without re-parsing. */
char *store_job_dumps(const struct store_job *j, int with_spec);

/* What to insert (write callback). spec_json is the canonical spec text. */
struct store_job_new {
    const char *tenant_id;
    const char *name;
    const char *spec_json;
    json_t *labels; /* object of string values, may be NULL; borrowed */
    int priority, max_retries, world_size;
    int tp, gpus_per_node;    /* from the spec (0 = 1 / 0) */
    const char *device;       /* "cuda" or "cpu" (NULL = "cuda") */
    const char *out_dir_root; /* job out_dir = out_dir_root/<id> */
    const char *pending_reason;
};
/* Inserts a queued job plus its first event ("submitted"); fills `out`. */
int store_job_insert(struct store_tx *tx, const struct store_job_new *nj, struct store_job *out);
/* Reads a job by id; tenant_id NULL = any tenant (internal callers). A job of
 * another tenant is STORE_NOT_FOUND. */
int store_job_get(struct store_tx *tx, const char *tenant_id, const char *id,
                  struct store_job *out);

struct store_job_filter {
    const char *tenant_id; /* NULL = all tenants (scheduler, admin) */
    unsigned state_mask;   /* 0 = any; else JOB_MASK bits */
    const char *name;      /* exact name or NULL */
    const char *label_key; /* label filter key=value, or NULL */
    const char *label_value;
    int64_t before_seq; /* > 0: only seq < before_seq (descending pages) */
    int64_t after_seq;  /* > 0: only seq > after_seq (ascending order) */
    int ascending;      /* 1: oldest first (the scheduler's FIFO), 0: newest first */
    int limit;          /* rows at most (> 0) */
    int skip_spec;      /* 1: leave j->spec NULL (lists; saves copying it) */
    int by_priority;    /* 1: priority DESC, then seq ASC (the scheduler's queue order);
                           overrides `ascending` */
};
/* Calls cb for each matching job in order; stops early when cb returns != 0
 * (that value is returned). Returns the count visited otherwise (>= 0). */
int store_job_foreach(struct store_tx *tx, const struct store_job_filter *f,
                      int (*cb)(const struct store_job *j, void *arg), void *arg);

/* Options of a transition. reason is required (stored in the event row). */
struct job_change {
    const char *reason;
    const char *pending_reason; /* -> queued: why it waits (default "waiting for resources") */
    const char *placement;      /* -> starting: placement JSON text (NULL keeps) */
    int expect_attempt;         /* >= 0: STORE_BAD_STATE unless job.attempt equals it;
                                   -1 = don't check (stale reports of old attempts) */
};
/* Inside a write callback: moves job `id` to `to` if its current state is in
 * `from_mask` (0 = any state from which the table allows `to`). In the same
 * transaction: writes a job_events row (from, to, attempt, reason), sets
 * updated_at; -> queued from starting/running is a retry: attempt+1, placement
 * cleared, started_at cleared; -> running sets started_at; a terminal state
 * sets finished_at; pending_reason is set on -> queued, cleared otherwise.
 * Returns STORE_OK, STORE_NOT_FOUND or STORE_BAD_STATE (nothing changed).
 * If `out` is non-NULL it receives the updated job. */
int store_job_transition(struct store_tx *tx, const char *id, unsigned from_mask, enum job_state to,
                         const struct job_change *ch, struct store_job *out);
/* Updates a queued job's pending_reason without an event row (scheduler). */
int store_job_set_pending(struct store_tx *tx, const char *id, const char *pending_reason);
/* Events of a job, oldest first, as a JSON array of {id,at,from,to,attempt,reason}. */
int store_job_events(struct store_tx *tx, int64_t job_seq, json_t **out);
/* Write callback: an event row that records an observation without a state
 * change (from = to = the job's current state), e.g. a diagnosis
 * (daemon/diagnose.h). STORE_OK, STORE_NOT_FOUND or STORE_ERR. */
int store_job_note(struct store_tx *tx, const char *id, int attempt, const char *reason);
/* Jobs counted by tenant and state: JSON object {tenant: {state: n}}. */
int store_job_counts(struct store_tx *tx, json_t **out);

/* Idempotency keys (write callback). lookup: STORE_NOT_FOUND, or STORE_OK with
 * the job id and whether the stored request hash equals `hash` (*same). */
int store_idem_lookup(struct store_tx *tx, const char *tenant_id, const char *key,
                      const unsigned char hash[32], char *job_id, size_t len, int *same);
int store_idem_insert(struct store_tx *tx, const char *tenant_id, const char *key,
                      const unsigned char hash[32], const char *job_id);

#endif
