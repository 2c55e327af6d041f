/* Store engine: SQLite connections, migrations, the writer thread with group
 * commit, the read-connection pool and the per-connection statement cache.
 * See store.h for the contract. Assumes SQLite is built thread-safe (the
 * Debian build is serialized); each connection is still used by one thread
 * at a time. */
#include "daemon/store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/token.h"

#define STMT_CACHE 64

struct stmt_slot {
    char *sql; /* key: our own copy of the SQL text */
    uint64_t hash;
    sqlite3_stmt *st;
};

struct store_tx {
    sqlite3 *db;
    struct stmt_slot cache[STMT_CACHE];
    int ncache;
    struct store_tx *next_free; /* read pool link */
};

struct write_op {
    store_fn fn;
    void *arg;
    int rc;
    int done;
    pthread_cond_t cv; /* its own: a batch wakes only its callers */
    struct write_op *next;
};

/* Commit latency buckets in milliseconds (Prometheus histogram). */
static const double commit_buckets[] = {0.5, 1, 2, 5, 10, 25, 50, 100, 250, 1000};
#define NBUCKETS (sizeof commit_buckets / sizeof *commit_buckets)

struct store {
    char *path;
    struct store_options opt;
    struct store_tx *writer;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* writer waits for ops */
    int writer_idle;        /* writer is waiting on work_cv */
    struct write_op *head, *tail;
    int queued;
    int stopping;
    pthread_mutex_t pool_mu;
    struct store_tx *pool;
    int schema_version;
    store_fn commit_hook; /* store_set_commit_hook; read by the writer under mu */
    void *commit_hook_arg;
    /* metrics (updated by the writer thread, read by scrapes) */
    _Atomic uint64_t commit_count, commit_ops, commit_fail;
    _Atomic uint64_t commit_bucket[NBUCKETS + 1];
    _Atomic uint64_t commit_sum_us;
};

int64_t store_now_ms(void) {
    return clock_wall_ms();
}

int store_new_id(const char *prefix, char *out, size_t outlen) {
    size_t pl = strlen(prefix);
    if (pl >= outlen) return STORE_ERR;
    memcpy(out, prefix, pl);
    if (token_hex(out + pl, outlen - pl, 6) != 0) {
        log_error("store: no random bytes for a new %s id", prefix);
        out[0] = '\0';
        return STORE_ERR;
    }
    return STORE_OK;
}

sqlite3 *store_tx_db(struct store_tx *tx) {
    return tx->db;
}

sqlite3_stmt *store_stmt(struct store_tx *tx, const char *sql) {
    uint64_t h = loom_fnv1a_str(sql);
    for (int i = 0; i < tx->ncache; i++) {
        if (tx->cache[i].hash == h && strcmp(tx->cache[i].sql, sql) == 0) {
            sqlite3_stmt *st = tx->cache[i].st;
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            return st;
        }
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v3(tx->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
        log_error("store: prepare failed: %s", sqlite3_errmsg(tx->db));
        return NULL;
    }
    char *key = strdup(sql);
    if (!key) {
        sqlite3_finalize(st);
        return NULL;
    }
    if (tx->ncache == STMT_CACHE) {
        /* Cache full: evict the oldest entry (rare: loomd has few statement shapes). */
        sqlite3_finalize(tx->cache[0].st);
        free(tx->cache[0].sql);
        memmove(&tx->cache[0], &tx->cache[1], sizeof tx->cache[0] * (STMT_CACHE - 1));
        tx->ncache--;
    }
    tx->cache[tx->ncache].sql = key;
    tx->cache[tx->ncache].hash = h;
    tx->cache[tx->ncache].st = st;
    tx->ncache++;
    return st;
}

int store_exec(struct store_tx *tx, const char *sql) {
    char *err = NULL;
    if (sqlite3_exec(tx->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        log_error("store: %s: %s", sql, err ? err : sqlite3_errmsg(tx->db));
        sqlite3_free(err);
        return STORE_ERR;
    }
    return STORE_OK;
}

/* Runs a cached control statement (BEGIN, COMMIT, SAVEPOINT...): no parse
 * per call on the hot path. */
static int run_cached(struct store_tx *tx, const char *sql) {
    sqlite3_stmt *st = store_stmt(tx, sql);
    if (!st) return STORE_ERR;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        log_error("store: %s: %s", sql, sqlite3_errmsg(tx->db));
        return STORE_ERR;
    }
    return STORE_OK;
}

static void conn_close(struct store_tx *tx) {
    if (!tx) return;
    for (int i = 0; i < tx->ncache; i++) {
        sqlite3_finalize(tx->cache[i].st);
        free(tx->cache[i].sql);
    }
    sqlite3_close(tx->db);
    free(tx);
}

/* Busy handler: SQLite's default sleeps in steps of up to 100 ms, which
 * shows up as request-latency spikes when a reader briefly meets the WAL
 * being reset; retry every 0.5 ms instead, for up to 5 s. */
static int busy_retry(void *arg, int count) {
    (void)arg;
    if (count >= 10000) return 0;
    clock_sleep_us(500);
    return 1;
}

static struct store_tx *conn_open(struct store *s, int readonly) {
    struct store_tx *tx = calloc(1, sizeof *tx);
    if (!tx) return NULL;
    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    flags |= SQLITE_OPEN_NOMUTEX; /* one thread at a time per connection */
    if (sqlite3_open_v2(s->path, &tx->db, flags, NULL) != SQLITE_OK) {
        log_error("store: cannot open %s: %s", s->path, tx->db ? sqlite3_errmsg(tx->db) : "?");
        conn_close(tx);
        return NULL;
    }
    sqlite3_busy_handler(tx->db, busy_retry, NULL);
    sqlite3_extended_result_codes(tx->db, 1);
    if (!readonly) {
        if (store_exec(tx, "PRAGMA journal_mode=WAL") ||
            store_exec(tx, s->opt.sync_full ? "PRAGMA synchronous=FULL"
                                            : "PRAGMA synchronous=NORMAL") ||
            store_exec(tx, "PRAGMA foreign_keys=ON")) {
            conn_close(tx);
            return NULL;
        }
    } else {
        store_exec(tx, "PRAGMA query_only=1");
    }
    /* Reads of a large store come from the OS page cache through mmap
     * rather than copies into each connection's small page cache. */
    store_exec(tx, "PRAGMA mmap_size=268435456");
    store_exec(tx, "PRAGMA cache_size=-8192");
    return tx;
}

static int migrate(struct store *s) {
    struct store_tx *tx = s->writer;
    if (store_exec(tx, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
                       " name TEXT NOT NULL, applied_at INTEGER NOT NULL)"))
        return -1;
    /* Each migration is applied once, by number: areas own separate ranges
     * (001-019, 020-039, ...), so a lower number can arrive after a higher
     * one was applied and must still run. */
    int prev = 0, highest = 0;
    for (int i = 0; i < store_migrations_count; i++) {
        const struct store_migration *m = &store_migrations[i];
        if (m->version == prev) {
            log_error("store: two migrations numbered %03d (%s)", m->version, m->name);
            return -1;
        }
        prev = m->version;
        sqlite3_stmt *q = store_stmt(tx, "SELECT 1 FROM schema_version WHERE version = ?");
        if (!q) return -1;
        sqlite3_bind_int(q, 1, m->version);
        int have = sqlite3_step(q) == SQLITE_ROW;
        sqlite3_reset(q);
        if (have) {
            if (m->version > highest) highest = m->version;
            continue;
        }
        if (store_exec(tx, "BEGIN IMMEDIATE")) return -1;
        if (store_exec(tx, m->sql)) {
            log_error("store: migration %s failed", m->name);
            store_exec(tx, "ROLLBACK");
            return -1;
        }
        sqlite3_stmt *ins =
            store_stmt(tx, "INSERT INTO schema_version(version, name, applied_at) VALUES (?,?,?)");
        if (!ins) {
            store_exec(tx, "ROLLBACK");
            return -1;
        }
        sqlite3_bind_int(ins, 1, m->version);
        sqlite3_bind_text(ins, 2, m->name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(ins, 3, store_now_ms());
        int rc = sqlite3_step(ins);
        sqlite3_reset(ins);
        if (rc != SQLITE_DONE || store_exec(tx, "COMMIT")) {
            store_exec(tx, "ROLLBACK");
            return -1;
        }
        log_info("store: applied migration %s", m->name);
        if (m->version > highest) highest = m->version;
    }
    /* Report the highest number recorded (a newer binary's migrations may be
     * in the table when an older one runs). */
    sqlite3_stmt *mx = store_stmt(tx, "SELECT COALESCE(MAX(version), 0) FROM schema_version");
    if (mx && sqlite3_step(mx) == SQLITE_ROW && sqlite3_column_int(mx, 0) > highest)
        highest = sqlite3_column_int(mx, 0);
    if (mx) sqlite3_reset(mx);
    s->schema_version = highest;
    return 0;
}

int store_schema_version(struct store *s) {
    return s->schema_version;
}

/* Runs one batch: BEGIN, each op in a savepoint, COMMIT; marks ops done.
 * hook (may be NULL) runs after a successful COMMIT. */
static void run_batch(struct store *s, struct write_op *batch, store_fn hook, void *hook_arg) {
    struct store_tx *tx = s->writer;
    double t0 = clock_mono_msf();
    int nops = 0;
    int ok = run_cached(tx, "BEGIN IMMEDIATE") == STORE_OK;
    for (struct write_op *op = batch; op; op = op->next) {
        nops++;
        if (!ok) {
            op->rc = STORE_ERR;
            continue;
        }
        if (run_cached(tx, "SAVEPOINT op")) {
            op->rc = STORE_ERR;
            continue;
        }
        op->rc = op->fn(tx, op->arg);
        if (sqlite3_get_autocommit(tx->db)) {
            /* SQLite aborted the whole transaction (I/O error, full disk):
             * every op of this batch so far is lost; fail them all. */
            for (struct write_op *o = batch; o != op->next; o = o->next)
                o->rc = STORE_ERR;
            ok = 0;
            continue;
        }
        if (op->rc < 0) run_cached(tx, "ROLLBACK TO op");
        run_cached(tx, "RELEASE op");
    }
    if (ok && run_cached(tx, "COMMIT") != STORE_OK) {
        store_exec(tx, "ROLLBACK");
        ok = 0;
    }
    if (!ok) {
        if (!sqlite3_get_autocommit(tx->db)) store_exec(tx, "ROLLBACK");
        for (struct write_op *op = batch; op; op = op->next)
            op->rc = STORE_ERR;
        atomic_fetch_add(&s->commit_fail, 1);
    }
    if (ok && hook) hook(tx, hook_arg);
    double ms = clock_mono_msf() - t0;
    size_t b = 0;
    while (b < NBUCKETS && ms > commit_buckets[b])
        b++;
    atomic_fetch_add(&s->commit_bucket[b], 1);
    atomic_fetch_add(&s->commit_sum_us, (uint64_t)(ms * 1000));
    atomic_fetch_add(&s->commit_count, 1);
    atomic_fetch_add(&s->commit_ops, (uint64_t)nops);
}

static void *writer_main(void *arg) {
    struct store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping) {
            s->writer_idle = 1;
            pthread_cond_wait(&s->work_cv, &s->mu);
            s->writer_idle = 0;
        }
        if (!s->head && s->stopping) break;
        /* Take up to max_batch ops. */
        struct write_op *batch = s->head, *last = s->head;
        int n = 1;
        while (last->next && n < s->opt.max_batch) {
            last = last->next;
            n++;
        }
        s->head = last->next;
        if (!s->head) s->tail = NULL;
        last->next = NULL;
        s->queued -= n;
        store_fn hook = s->commit_hook;
        void *hook_arg = s->commit_hook_arg;
        pthread_mutex_unlock(&s->mu);
        run_batch(s, batch, hook, hook_arg);
        pthread_mutex_lock(&s->mu);
        for (struct write_op *op = batch; op;) {
            struct write_op *next = op->next; /* op may vanish once done is seen */
            op->done = 1;
            pthread_cond_signal(&op->cv);
            op = next;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int store_write(struct store *s, store_fn fn, void *arg) {
    struct write_op op = {.fn = fn, .arg = arg, .rc = STORE_ERR};
    pthread_cond_init(&op.cv, NULL);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&op.cv);
        return STORE_ERR;
    }
    if (s->tail)
        s->tail->next = &op;
    else
        s->head = &op;
    s->tail = &op;
    s->queued++;
    if (s->writer_idle) pthread_cond_signal(&s->work_cv);
    while (!op.done)
        pthread_cond_wait(&op.cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&op.cv);
    return op.rc;
}

void store_set_commit_hook(struct store *s, store_fn fn, void *arg) {
    pthread_mutex_lock(&s->mu);
    s->commit_hook = fn;
    s->commit_hook_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

int store_read(struct store *s, store_fn fn, void *arg) {
    pthread_mutex_lock(&s->pool_mu);
    struct store_tx *tx = s->pool;
    if (tx) s->pool = tx->next_free;
    pthread_mutex_unlock(&s->pool_mu);
    if (!tx) {
        tx = conn_open(s, 1);
        if (!tx) return STORE_ERR;
    }
    int rc;
    if (run_cached(tx, "BEGIN") != STORE_OK) {
        rc = STORE_ERR;
    } else {
        rc = fn(tx, arg);
        if (!sqlite3_get_autocommit(tx->db)) run_cached(tx, "COMMIT");
    }
    pthread_mutex_lock(&s->pool_mu);
    tx->next_free = s->pool;
    s->pool = tx;
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
}

struct store *store_open(const char *path, const struct store_options *opts) {
    struct store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->path = strdup(path);
    s->opt.sync_full = opts ? opts->sync_full : 1;
    s->opt.max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 256;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    s->writer = conn_open(s, 0);
    if (!s->writer || migrate(s) != 0) goto fail;
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        log_error("store: cannot start writer thread: %s", strerror(errno));
        goto fail;
    }
    s->thread_started = 1;
    log_info("store: %s open (schema version %d)", path, s->schema_version);
    return s;
fail:
    store_close(s);
    return NULL;
}

void store_close(struct store *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_broadcast(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    while (s->pool) {
        struct store_tx *tx = s->pool;
        s->pool = tx->next_free;
        conn_close(tx);
    }
    if (s->writer) {
        store_exec(s->writer, "PRAGMA wal_checkpoint(TRUNCATE)");
        conn_close(s->writer);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->pool_mu);
    pthread_cond_destroy(&s->work_cv);
    free(s->path);
    free(s);
}

void store_metrics_write(struct store *s, FILE *f) {
    fprintf(f, "# HELP loom_store_commit_seconds Duration of one group commit (BEGIN..COMMIT).\n"
               "# TYPE loom_store_commit_seconds histogram\n");
    uint64_t cum = 0;
    for (size_t b = 0; b < NBUCKETS; b++) {
        cum += atomic_load(&s->commit_bucket[b]);
        fprintf(f, "loom_store_commit_seconds_bucket{le=\"%g\"} %llu\n", commit_buckets[b] / 1000,
                (unsigned long long)cum);
    }
    cum += atomic_load(&s->commit_bucket[NBUCKETS]);
    fprintf(f, "loom_store_commit_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    fprintf(f, "loom_store_commit_seconds_sum %.6f\n", atomic_load(&s->commit_sum_us) / 1e6);
    fprintf(f, "loom_store_commit_seconds_count %llu\n",
            (unsigned long long)atomic_load(&s->commit_count));
    fprintf(f,
            "# HELP loom_store_commit_ops_total Write callbacks committed (batched).\n"
            "# TYPE loom_store_commit_ops_total counter\nloom_store_commit_ops_total %llu\n",
            (unsigned long long)atomic_load(&s->commit_ops));
    fprintf(f,
            "# HELP loom_store_commit_failures_total Group commits that failed.\n"
            "# TYPE loom_store_commit_failures_total counter\nloom_store_commit_failures_total "
            "%llu\n",
            (unsigned long long)atomic_load(&s->commit_fail));
    pthread_mutex_lock(&s->mu);
    int q = s->queued;
    pthread_mutex_unlock(&s->mu);
    fprintf(f,
            "# HELP loom_store_write_queue Write callbacks waiting for the writer.\n"
            "# TYPE loom_store_write_queue gauge\nloom_store_write_queue %d\n",
            q);
}
