/* Billing: usage rows cut at UTC hour boundaries (so a month boundary inside
 * an attempt splits its GPU time exactly), the cause of an attempt's end and
 * the --bill-causes policy (unbilled causes are recorded at cost 0 and do not
 * count against a budget), and the stop-cause attribution table. The times
 * are given explicitly: the ledger never reads the clock itself. */
#include "daemon/store.h"
#include "daemon/supervise.h"
#include "daemon/usage.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int64_t at(int y, int mo, int d, int h, int mi) {
    struct tm tm = {
        .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi};
    return (int64_t)timegm(&tm) * 1000;
}

static int insert_cb(struct store_tx *tx, void *arg) {
    const struct usage_row *rows = arg;
    for (int i = 0; rows[i].tenant_id; i++) {
        int rc = usage_insert(tx, &rows[i]);
        if (rc) return rc;
    }
    return STORE_OK;
}

struct month_sum {
    const char *month, *tenant;
    double gpu_h, billed_h, cost;
    int rows;
};

static int sum_cb(struct store_tx *tx, void *arg) {
    struct month_sum *m = arg;
    sqlite3_stmt *st = store_stmt(
        tx, "SELECT COALESCE(SUM(gpu_seconds),0), COALESCE(SUM(CASE WHEN billed THEN gpu_seconds "
            "END),0), COALESCE(SUM(cost),0), COUNT(*) FROM usage WHERE tenant_id = ?2 AND "
            "strftime('%Y-%m', start_ms / 1000, 'unixepoch') = ?1");
    if (!st) return STORE_ERR;
    sqlite3_bind_text(st, 1, m->month, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, m->tenant, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        m->gpu_h = sqlite3_column_double(st, 0) / 3600.0;
        m->billed_h = sqlite3_column_double(st, 1) / 3600.0;
        m->cost = sqlite3_column_double(st, 2);
        m->rows = sqlite3_column_int(st, 3);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : STORE_ERR;
}

struct hours_q {
    const char *tenant;
    int64_t since;
    double hours;
};

static int hours_cb(struct store_tx *tx, void *arg) {
    struct hours_q *q = arg;
    return store_tenant_gpu_hours(tx, q->tenant, q->since, &q->hours);
}

/* Two priced nodes: n3 (H100-SXM) with a monthly rate of 744 a GPU-month
 * (its per_gpu_hour of 9 is not used), n4 (A100-SXM) hourly only, 5 a hour. */
static int prices_cb(struct store_tx *tx, void *arg) {
    (void)arg;
    static const char *const sql[] = {
        "INSERT INTO nodes (name, kind, registered_at, last_seen, gpu_type) VALUES "
        "('n3', 'cuda', 0, 0, 'H100-SXM'), ('n4', 'cuda', 0, 0, 'A100-SXM')",
        "INSERT INTO gpu_prices (gpu_type, per_gpu_hour, per_gpu_month, currency, updated_at) "
        "VALUES ('H100-SXM', 9.0, 744.0, 'USD', 0), ('A100-SXM', 5.0, NULL, 'EUR', 0)",
    };
    for (size_t i = 0; i < sizeof sql / sizeof *sql; i++)
        if (sqlite3_exec(store_tx_db(tx), sql[i], NULL, NULL, NULL) != SQLITE_OK) return STORE_ERR;
    return STORE_OK;
}

static void month(struct store *s, const char *mo, const char *tenant, double gpu_h,
                  double billed_h, double cost, int rows) {
    struct month_sum m = {mo, tenant, 0, 0, 0, 0};
    CHECK(store_read(s, sum_cb, &m) == STORE_OK);
    CHECK_NEAR(m.gpu_h, gpu_h, 1e-9);
    CHECK_NEAR(m.billed_h, billed_h, 1e-9);
    CHECK_NEAR(m.cost, cost, 1e-9);
    CHECK(m.rows == rows, "%s %s: %d rows, expected %d", mo, tenant, m.rows, rows);
}

int main(void) {
    char dir[] = "/tmp/loom-billing-XXXXXX", path[128];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/loomd.db", dir);
    struct store *s = store_open(path, NULL);
    CHECK(s != NULL);
    if (!s) return check_summary("test_billing");

    /* t1: 2 GPUs from Nov 30 23:30 to Dec 1 01:15 at 3.0 a GPU-hour, billed:
     * 1 GPU-hour in November, 2 + 0.5 in December, in three hour rows.
     * t1 also loses 1 GPU for 40 min to a lost node (not billed), and t2
     * runs 2 h 10 min inside December, preempted (billed). */
    const struct usage_row rows[] = {
        {"t1", "j-a", 0, "n1", "cpu", 2, at(2026, 11, 30, 23, 30), at(2026, 12, 1, 1, 15), 3.0,
         "user", 1},
        {"t1", "j-b", 1, "n1", "cpu", 1, at(2026, 11, 30, 23, 40), at(2026, 12, 1, 0, 20), 3.0,
         "node_lost", 0},
        {"t2", "j-c", 0, "n2", "cpu", 1, at(2026, 12, 1, 4, 0), at(2026, 12, 1, 6, 10), 2.0,
         "preempted", 1},
        {0},
    };
    CHECK(store_write(s, insert_cb, (void *)rows) == STORE_OK);
    month(s, "2026-11", "t1", 1.0 + 20.0 / 60, 1.0, 3.0, 2);
    month(s, "2026-12", "t1", 2.5 + 20.0 / 60, 2.5, 7.5, 3);
    month(s, "2026-12", "t2", 2.0 + 10.0 / 60, 2.0 + 10.0 / 60, 2.0 * (2.0 + 10.0 / 60), 3);
    /* The budget counts billed time only. */
    struct hours_q q = {"t1", at(2026, 12, 1, 0, 0), 0};
    CHECK(store_read(s, hours_cb, &q) == STORE_OK);
    CHECK_NEAR(q.hours, 2.5, 1e-9);

    /* per_gpu_month prorated: each hour row at the monthly rate over the
     * hours of its own month. t3: 1 GPU on n3 from Nov 30 22:30 to Dec 1
     * 02:00, 1.5 h in November (744/720 an hour) and 2 h in December (744/744
     * = 1 an hour). t4 on n4 (no monthly rate): 2 h at 5. */
    CHECK(store_write(s, prices_cb, NULL) == STORE_OK);
    const struct usage_row priced[] = {
        {"t3", "j-d", 0, "n3", "nvidia", 1, at(2026, 11, 30, 22, 30), at(2026, 12, 1, 2, 0), 3.0,
         "user", 1},
        {"t4", "j-e", 0, "n4", "nvidia", 1, at(2026, 12, 10, 4, 0), at(2026, 12, 10, 6, 0), 3.0,
         "user", 1},
        {0},
    };
    CHECK(store_write(s, insert_cb, (void *)priced) == STORE_OK);
    month(s, "2026-11", "t3", 1.5, 1.5, 1.5 * 744.0 / 720.0, 2);
    month(s, "2026-12", "t3", 2.0, 2.0, 2.0, 2);
    month(s, "2026-12", "t4", 2.0, 2.0, 10.0, 2);
    static const struct {
        int y, mo;
        double hours;
    } mh[] = {{2026, 12, 744}, {2026, 11, 720}, {2026, 2, 672}, {2024, 2, 696}, {2027, 1, 744}};
    for (size_t i = 0; i < sizeof mh / sizeof *mh; i++) {
        CHECK_NEAR(usage_month_hours(at(mh[i].y, mh[i].mo, 1, 0, 0)), mh[i].hours, 1e-12);
        CHECK_NEAR(usage_month_hours(at(mh[i].y, mh[i].mo, 1, 0, 0) + 3600000LL * 24 * 27 + 59999),
                   mh[i].hours, 1e-12);
    }
    CHECK_NEAR(usage_hour_price(5.0, -1, at(2026, 2, 3, 0, 0)), 5.0, 1e-12);
    CHECK_NEAR(usage_hour_price(5.0, 1344.0, at(2026, 2, 3, 0, 0)), 2.0, 1e-12);
    CHECK_NEAR(usage_hour_price(5.0, 0.0, at(2026, 2, 3, 0, 0)), 0.0, 1e-12);

    CHECK(usage_hour_end(at(2026, 12, 1, 0, 0)) == at(2026, 12, 1, 1, 0));
    CHECK(usage_hour_end(at(2026, 12, 1, 0, 59)) == at(2026, 12, 1, 1, 0));
    CHECK(usage_cause_billed("user,preempted", "preempted") &&
          !usage_cause_billed("user,preempted", "pre") &&
          !usage_cause_billed("user,preempted", "node_lost") && !usage_cause_billed("", "user"));
    char bad[32] = "";
    CHECK(usage_policy_check("user,hang,infra", bad, sizeof bad) == 0);
    CHECK(usage_policy_check("user,lost", bad, sizeof bad) == -1 && !strcmp(bad, "lost"),
          "the wrong entry is named: %s", bad);

    static const struct {
        enum stop_cause c;
        const char *who;
    } causes[] = {
        {STOP_SUCCEEDED, "user"},     {STOP_RANK_FAILED, "user"},    {STOP_CANCELLED, "user"},
        {STOP_TIME_LIMIT, "user"},    {STOP_PREEMPTED, "preempted"}, {STOP_NODE_LOST, "node_lost"},
        {STOP_HANG, "hang"},          {STOP_START_TIMEOUT, "hang"},  {STOP_SUPERSEDED, "infra"},
        {STOP_NOT_RECORDED, "infra"}, {STOP_BUDGET, "user"}};
    for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++)
        CHECK_STR(supervise_bill_cause(causes[i].c), causes[i].who);
    store_close(s);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return check_summary("test_billing");
}
