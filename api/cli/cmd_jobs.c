/* loomctl job commands: submit, list, get, cancel, events. Tables for people,
 * --json for scripts. */
#define _GNU_SOURCE /* strptime, timegm */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/cli/cli.h"

static int fail(int rc) {
    return rc == -3 ? 3 : 1;
}

static int need_args(int argc, int n, const char *usage) {
    if (argc < n) {
        fprintf(stderr, "usage: loomctl %s\n", usage);
        return 1;
    }
    return 0;
}

/* Seconds since the epoch of an API time ("2026-12-01T11:11:13.263Z"); -1 if none. */
static double api_time(json_t *v) {
    if (!json_is_string(v)) return -1;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(json_string_value(v), "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest) return -1;
    double frac = *rest == '.' ? atof(rest) : 0;
    return (double)timegm(&tm) + frac;
}

void cli_progress_of(json_t *job, json_t *metrics, struct cli_progress *p) {
    p->step = 0;
    p->total = json_integer_value(
        json_object_get(json_object_get(json_object_get(job, "spec"), "train"), "steps"));
    p->loss = p->val_loss = p->tokens_per_s = NAN;
    p->elapsed_s = p->eta_s = -1;
    json_t *series = json_object_get(metrics, "series");
    size_t n = json_array_size(series);
    if (n) {
        json_t *last = json_array_get(series, n - 1);
        p->step = json_integer_value(json_object_get(last, "step"));
        if (json_is_number(json_object_get(last, "loss")))
            p->loss = json_number_value(json_object_get(last, "loss"));
        if (json_is_number(json_object_get(last, "tokens_per_s")))
            p->tokens_per_s = json_number_value(json_object_get(last, "tokens_per_s"));
    }
    json_t *evals = json_object_get(metrics, "evals");
    size_t ne = json_array_size(evals);
    if (ne && json_is_number(json_object_get(json_array_get(evals, ne - 1), "val_loss")))
        p->val_loss = json_number_value(json_object_get(json_array_get(evals, ne - 1), "val_loss"));
    double t0 = api_time(json_object_get(job, "started_at"));
    double t1 = api_time(json_object_get(job, "finished_at"));
    if (t0 > 0) {
        if (t1 <= 0) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            t1 = (double)now.tv_sec + now.tv_nsec / 1e9;
        }
        p->elapsed_s = t1 - t0;
    }
    /* ETA: the remaining steps at the mean step time of the last 20 records. */
    const char *state = cli_str(job, "state");
    if (!strcmp(state, "running") && n && p->total > p->step) {
        double ms = 0;
        int k = 0;
        for (size_t i = n > 20 ? n - 20 : 0; i < n; i++) {
            json_t *v = json_object_get(json_object_get(json_array_get(series, i), "ms"), "step");
            if (json_is_number(v)) ms += json_number_value(v), k++;
        }
        if (k) p->eta_s = (double)(p->total - p->step) * ms / k / 1e3;
    }
}

static void fmt_duration(double s, char *out, size_t len) {
    if (s < 0)
        snprintf(out, len, "-");
    else if (s < 60)
        snprintf(out, len, "%.0fs", s);
    else if (s < 3600)
        snprintf(out, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(out, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

static void fmt_num(double v, const char *f, char *out, size_t len) {
    if (isnan(v))
        snprintf(out, len, "-");
    else
        snprintf(out, len, f, v);
}

/* The job's metrics (rank 0) or NULL; errors are not fatal for a summary. */
static json_t *job_metrics(struct cli *cli, const char *id) {
    char enc[256], path[400];
    cli_urlencode(id, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?rank=0", enc);
    json_t *out = NULL;
    if (client_request(cli->c, "GET", path, NULL, &(long){0}, &out, NULL, NULL, 0) != 0)
        return NULL;
    return out;
}

/* The job object with its spec, or NULL. */
static json_t *job_get(struct cli *cli, const char *id) {
    char enc[256], path[400];
    long status = 0;
    cli_urlencode(id, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/jobs/%s", enc);
    json_t *out = NULL;
    if (client_request(cli->c, "GET", path, NULL, &status, &out, NULL, NULL, 0) != 0) return NULL;
    if (status >= 400) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* The reason of the newest event that ended or retried an attempt, or NULL. */
static const char *failure_reason(json_t *events) {
    json_t *items = json_object_get(events, "items");
    for (size_t i = json_array_size(items); i-- > 0;) {
        json_t *e = json_array_get(items, i);
        const char *to = cli_str(e, "to"), *from = cli_str(e, "from");
        if (!strcmp(to, "failed") || !strcmp(to, "cancelled") ||
            (!strcmp(to, "queued") && strcmp(from, "-")))
            return json_string_value(json_object_get(e, "reason"));
    }
    return NULL;
}

static void print_job(json_t *j, json_t *metrics, json_t *events) {
    static const char *const keys[] = {"id",         "name",        "state",          "attempt",
                                       "priority",   "world_size",  "pending_reason", "created_at",
                                       "started_at", "finished_at", "out_dir"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(j, keys[i]);
        if (json_is_integer(v))
            printf("%-15s %lld\n", keys[i], (long long)json_integer_value(v));
        else
            printf("%-15s %s\n", keys[i], json_is_string(v) ? json_string_value(v) : "-");
    }
    struct cli_progress p;
    cli_progress_of(j, metrics, &p);
    char a[32], b[32];
    printf("%-15s %lld/%lld\n", "step", p.step, p.total);
    fmt_num(p.loss, "%.4f", a, sizeof a);
    printf("%-15s %s\n", "loss", a);
    fmt_num(p.val_loss, "%.4f", a, sizeof a);
    printf("%-15s %s\n", "val_loss", a);
    fmt_num(p.tokens_per_s, "%.0f", a, sizeof a);
    printf("%-15s %s\n", "tokens_per_s", a);
    fmt_duration(p.elapsed_s, a, sizeof a);
    fmt_duration(p.eta_s, b, sizeof b);
    printf("%-15s %s\n%-15s %s\n", "elapsed", a, "eta", b);
    const char *why = failure_reason(events);
    if (why) printf("%-15s %s\n", "reason", why);
    json_t *labels = json_object_get(j, "labels");
    if (json_object_size(labels)) {
        const char *k;
        json_t *v;
        printf("%-15s", "labels");
        json_object_foreach(labels, k, v) printf(" %s=%s", k, json_string_value(v));
        printf("\n");
    }
    json_t *placement = json_object_get(j, "placement");
    if (placement && !json_is_null(placement)) {
        char *s = json_dumps(placement, JSON_COMPACT);
        printf("%-15s %s\n", "placement", s ? s : "");
        free(s);
    }
}

int cmd_jobs_submit(struct cli *cli, int argc, char **argv) {
    static const char usage[] =
        "submit FILE.json [--idempotency-key KEY] [--wait | --follow] [--timeout S]";
    if (need_args(argc, 2, usage)) return 2;
    const char *file = NULL, *key = NULL;
    int wait = 0, follow = 0;
    double timeout = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--idempotency-key") && i + 1 < argc) {
            key = argv[++i];
        } else if (!strcmp(argv[i], "--wait")) {
            wait = 1;
        } else if (!strcmp(argv[i], "--follow") || !strcmp(argv[i], "-f")) {
            follow = 1;
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            if (cli_parse_timeout(argv[++i], &timeout) != 0) return 2;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "loomctl: unknown option '%s'\nusage: loomctl %s\n", argv[i], usage);
            return 2;
        } else {
            file = argv[i];
        }
    }
    if (timeout > 0 && !wait && !follow) {
        fprintf(stderr, "loomctl: --timeout goes with --wait or --follow\n");
        return 2;
    }
    if (!file) return need_args(0, 1, "submit FILE.json") ? 2 : 2;
    json_t *spec = cli_read_json_file(file);
    if (!spec) return 2;
    char hdr[320];
    if (key) {
        snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
        client_set_header(cli->c, hdr);
    }
    json_t *out = NULL;
    int rc = cli_call(cli, "POST", "/v1/jobs", spec, &out);
    json_decref(spec);
    if (rc) return fail(rc);
    if (cli->json && !wait && !follow)
        cli_print_json(out);
    else if (!cli->json)
        printf("submitted %s (%s)\n", cli_str(out, "id"), cli_str(out, "state"));
    if (wait || follow) {
        char id[64];
        snprintf(id, sizeof id, "%s", cli_str(out, "id"));
        json_decref(out);
        fflush(stdout);
        return cli_job_wait(cli, id, follow, timeout);
    }
    json_decref(out);
    return 0;
}

int cmd_jobs_list(struct cli *cli, int argc, char **argv) {
    char q[1024] = "", enc[512];
    int all = 0;
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (!strcmp(opt, "--all")) {
            all = 1;
            continue;
        }
        if (i + 1 >= argc || strncmp(opt, "--", 2) != 0 ||
            (strcmp(opt, "--state") && strcmp(opt, "--name") && strcmp(opt, "--label") &&
             strcmp(opt, "--limit") && strcmp(opt, "--tenant"))) {
            fprintf(stderr, "usage: loomctl list [--state S] [--name N] [--label K=V] "
                            "[--limit N] [--tenant T (admin)] [--all]\n");
            return 2;
        }
        cli_urlencode(argv[++i], enc, sizeof enc);
        n += (size_t)snprintf(q + n, sizeof q - n, "%s%s=%s", n ? "&" : "", opt + 2, enc);
    }
    char cursor[64] = "";
    json_t *items = json_array(), *next_cursor = json_null();
    int rc = 0;
    for (;;) {
        char path[1200];
        snprintf(path, sizeof path, "/v1/jobs?%s%s%s", q, cursor[0] ? "&cursor=" : "", cursor);
        json_t *out = NULL;
        rc = cli_call(cli, "GET", path, NULL, &out);
        if (rc) break;
        json_array_extend(items, json_object_get(out, "items"));
        json_t *next = json_object_get(out, "next_cursor");
        json_decref(next_cursor);
        next_cursor = next ? json_incref(next) : json_null();
        int more = all && json_is_string(next);
        if (more) snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        json_decref(out);
        if (!more) break;
    }
    if (rc) {
        json_decref(items);
        json_decref(next_cursor);
        return fail(rc);
    }
    if (cli->json) {
        /* The API's page object: items and next_cursor (null after --all). */
        json_t *page = json_pack("{s:o, s:o}", "items", items, "next_cursor", next_cursor);
        cli_print_json(page);
        json_decref(page);
        return 0;
    }
    printf("%-16s %-24s %-10s %-7s %-11s %-8s %-8s %-8s %-24s %s\n", "ID", "NAME", "STATE",
           "ATTEMPT", "STEP", "LOSS", "VAL", "ELAPSED", "CREATED", "PENDING");
    size_t i;
    json_t *j;
    json_array_foreach(items, i, j) {
        struct cli_progress p;
        /* The list leaves out specs: the step total comes from the job itself. */
        int started = strcmp(cli_str(j, "state"), "queued") != 0;
        json_t *m = started ? job_metrics(cli, cli_str(j, "id")) : NULL;
        json_t *full = started ? job_get(cli, cli_str(j, "id")) : NULL;
        cli_progress_of(full ? full : j, m, &p);
        json_decref(m);
        json_decref(full);
        char st[32], loss[16], val[16], el[16];
        snprintf(st, sizeof st, "%lld/%lld", p.step, p.total);
        fmt_num(p.loss, "%.4f", loss, sizeof loss);
        fmt_num(p.val_loss, "%.4f", val, sizeof val);
        fmt_duration(p.elapsed_s, el, sizeof el);
        printf("%-16s %-24.24s %-10s %-7lld %-11s %-8s %-8s %-8s %-24s %s\n", cli_str(j, "id"),
               cli_str(j, "name"), cli_str(j, "state"),
               (long long)json_integer_value(json_object_get(j, "attempt")), st, loss, val, el,
               cli_str(j, "created_at"), cli_str(j, "pending_reason"));
    }
    json_decref(items);
    json_decref(next_cursor);
    return 0;
}

static int job_call(struct cli *cli, int argc, char **argv, const char *method, const char *suffix,
                    json_t **out) {
    if (argc < 2) {
        fprintf(stderr, "usage: loomctl %s JOB_ID\n", argv[0]);
        return -2;
    }
    char enc[256], path[400];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/jobs/%s%s", enc, suffix);
    return cli_call(cli, method, path, NULL, out);
}

int cmd_jobs_get(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int rc = job_call(cli, argc, argv, "GET", "", &out);
    if (rc) return rc == -2 ? 2 : fail(rc);
    if (cli->json) {
        cli_print_json(out);
    } else {
        json_t *m = job_metrics(cli, cli_str(out, "id")), *ev = NULL;
        char enc[256], path[400];
        cli_urlencode(cli_str(out, "id"), enc, sizeof enc);
        snprintf(path, sizeof path, "/v1/jobs/%s/events", enc);
        if (client_request(cli->c, "GET", path, NULL, &(long){0}, &ev, NULL, NULL, 0) != 0)
            ev = NULL;
        print_job(out, m, ev);
        json_decref(m);
        json_decref(ev);
    }
    json_decref(out);
    return 0;
}

int cmd_jobs_cancel(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int rc = job_call(cli, argc, argv, "POST", "/cancel", &out);
    if (rc) return rc == -2 ? 2 : fail(rc);
    if (cli->json)
        cli_print_json(out);
    else
        printf("%s %s\n", cli_str(out, "id"), cli_str(out, "state"));
    json_decref(out);
    return 0;
}

int cmd_jobs_events(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int rc = job_call(cli, argc, argv, "GET", "/events", &out);
    if (rc) return rc == -2 ? 2 : fail(rc);
    if (cli->json) {
        cli_print_json(out);
    } else {
        printf("%-24s %-10s %-10s %-7s %s\n", "AT", "FROM", "TO", "ATTEMPT", "REASON");
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(out, "items"), i, e) {
            printf("%-24s %-10s %-10s %-7lld %s\n", cli_str(e, "at"), cli_str(e, "from"),
                   cli_str(e, "to"), (long long)json_integer_value(json_object_get(e, "attempt")),
                   cli_str(e, "reason"));
        }
    }
    json_decref(out);
    return 0;
}
