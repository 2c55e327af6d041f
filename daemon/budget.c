/* Running jobs against the monthly GPU-hour budget (budget.h). Only libc. */
#define _GNU_SOURCE /* timegm */
#include "daemon/budget.h"

#include <string.h>
#include <time.h>

int64_t budget_month_start_ms(int64_t now_ms) {
    time_t t = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    tm.tm_mday = 1;
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    return (int64_t)timegm(&tm) * 1000;
}

static struct budget_tenant *find(struct budget_tenant *t, int nt, const char *tenant) {
    for (int i = 0; tenant && i < nt; i++)
        if (t[i].tenant && !strcmp(t[i].tenant, tenant)) return &t[i];
    return NULL;
}

int budget_decide(struct budget_tenant *t, int nt, const struct budget_attempt *a, int na,
                  int64_t now_ms, int cluster_warn_only, enum budget_action *out) {
    int64_t month0 = budget_month_start_ms(now_ms);
    for (int i = 0; i < nt; i++)
        t[i].total_hours = t[i].used_hours;
    for (int i = 0; i < na; i++) {
        struct budget_tenant *bt = find(t, nt, a[i].tenant);
        int64_t from = a[i].started_ms > month0 ? a[i].started_ms : month0;
        if (bt && now_ms > from && a[i].gpus > 0)
            bt->total_hours += (double)a[i].gpus * (double)(now_ms - from) / 3600000.0;
    }
    int stops = 0;
    for (int i = 0; i < na; i++) {
        const struct budget_tenant *bt = find(t, nt, a[i].tenant);
        out[i] = BUDGET_OK;
        if (!bt || bt->limit_hours <= 0 || bt->total_hours < bt->limit_hours) continue;
        if (bt->warn_only || cluster_warn_only) {
            out[i] = a[i].warned ? BUDGET_OK : BUDGET_WARN;
        } else {
            out[i] = BUDGET_STOP;
            stops++;
        }
    }
    return stops;
}
