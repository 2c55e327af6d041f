/* loomctl wait / submit --wait / submit --follow: block until a job reaches
 * a terminal state and exit by its outcome (api/exit_codes.h, enum
 * loomctl_exit). Built on the event feed: GET /v1/events?job=ID long-polls
 * (wait=) from a cursor, so a state change is seen when it commits, without
 * polling the job. --follow also prints each event and the job's new step
 * records (GET /v1/jobs/{id}/metrics, read between long-polls of at most
 * FOLLOW_POLL_S seconds); with --json the events are printed as JSON lines
 * and the final job object last. A lost connection (loomd restarting) is retried
 * from the same cursor, nothing is missed or repeated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/cli/cli.h"
#include "api/exit_codes.h"

#define WAIT_POLL_S   25 /* long-poll length while only waiting */
#define FOLLOW_POLL_S 2  /* while following: how often step records are read */
#define RETRY_MAX_S   5  /* longest pause between reconnect attempts */

/* Terminal event types and the exit code each means. */
static const struct {
    const char *type;
    int code;
} outcomes[] = {
    {"job.succeeded", LOOMCTL_EXIT_SUCCEEDED},
    {"job.failed", LOOMCTL_EXIT_JOB_FAILED},
    {"job.cancelled", LOOMCTL_EXIT_JOB_CANCELLED},
};

/* The exit code for a terminal event type, or -1 when the type is not one. */
int cli_outcome_of(const char *type) {
    for (size_t i = 0; type && i < sizeof outcomes / sizeof *outcomes; i++)
        if (!strcmp(type, outcomes[i].type)) return outcomes[i].code;
    return -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* One GET; 0 with *out, 1 for an API error (printed, *out NULL), -1 for a
 * transport error (message in err). */
static int get(struct cli *cli, const char *path, json_t **out, char *err, size_t errlen) {
    long status = 0;
    char *raw = NULL;
    *out = NULL;
    if (client_request(cli->c, "GET", path, NULL, &status, out, &raw, err, errlen) != 0) {
        free(raw);
        return -1;
    }
    if (status >= 400) {
        const char *code = client_error_code(*out), *msg = client_error_message(*out);
        fprintf(stderr, "loomctl: %ld %s: %s\n", status, code ? code : "ERROR",
                msg ? msg : (raw ? raw : "no message"));
        json_decref(*out);
        *out = NULL;
        free(raw);
        /* 5xx (store unavailable, shutting down) may pass: retried. */
        return status >= 500 ? -1 : 1;
    }
    free(raw);
    return 0;
}

static void print_event(json_t *e) {
    json_t *d = json_object_get(e, "data");
    const char *type = cli_str(e, "type");
    printf("%s %s", cli_str(e, "created_at"), type);
    if (!strncmp(type, "job.", 4)) {
        printf(" attempt %lld", (long long)json_integer_value(json_object_get(d, "attempt")));
        const char *why = json_string_value(json_object_get(d, "reason"));
        if (why && *why) printf(": %s", why);
    } else if (!strcmp(type, "checkpoint.saved")) {
        printf(" step %lld %s", (long long)json_integer_value(json_object_get(d, "step")),
               cli_str(d, "path"));
    } else if (!strcmp(type, "export.ready")) {
        printf(" %s %s", cli_str(d, "kind"), cli_str(d, "path"));
    }
    printf("\n");
}

/* Prints the step records after *last_step (rank 0's series). */
static void print_steps(struct cli *cli, const char *enc, long long total, long long *last_step) {
    char path[400], err[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/metrics?rank=0", enc);
    json_t *m = NULL;
    if (get(cli, path, &m, err, sizeof err) != 0) return; /* not fatal for a progress view */
    long long prev = *last_step;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(m, "series"), i, r) {
        long long step = json_integer_value(json_object_get(r, "step"));
        if (step <= *last_step) continue;
        *last_step = step;
        printf("step %lld", step);
        if (total > 0) printf("/%lld", total);
        json_t *v = json_object_get(r, "loss");
        if (json_is_number(v)) printf(" loss %.4f", json_number_value(v));
        v = json_object_get(r, "tokens_per_s");
        if (json_is_number(v)) printf(" %.0f tok/s", json_number_value(v));
        printf("\n");
    }
    json_array_foreach(json_object_get(m, "evals"), i, r) {
        long long step = json_integer_value(json_object_get(r, "step"));
        json_t *v = json_object_get(r, "val_loss");
        if (step > prev && step <= *last_step && json_is_number(v))
            printf("eval step %lld val_loss %.4f\n", step, json_number_value(v));
    }
    json_decref(m);
}

int cli_job_wait(struct cli *cli, const char *id, int follow, double timeout_s) {
    char enc[256], path[600], err[256];
    cli_urlencode(id, enc, sizeof enc);
    /* The job exists and is the caller's: an unknown id is an error at once. */
    json_t *job = NULL;
    snprintf(path, sizeof path, "/v1/jobs/%s", enc);
    int rc = get(cli, path, &job, err, sizeof err);
    if (rc != 0) {
        if (rc < 0) fprintf(stderr, "loomctl: cannot reach loomd at %s: %s\n", cli->url, err);
        return rc < 0 ? LOOMCTL_EXIT_UNREACHABLE : LOOMCTL_EXIT_ERROR;
    }
    long long total = json_integer_value(
        json_object_get(json_object_get(json_object_get(job, "spec"), "train"), "steps"));
    json_decref(job);
    int poll_s = follow ? FOLLOW_POLL_S : WAIT_POLL_S;
    /* The client's timeout covers the long-poll (loomd caps wait= by
     * --longpoll-timeout; 25 s is the default cap). */
    client_set_timeout_ms(cli->c, (poll_s + 15) * 1000L);
    double start = now_s(), retry = 0.25;
    long long since = 0, last_step = 0;
    int result = -1;
    while (result < 0) {
        double left = timeout_s > 0 ? timeout_s - (now_s() - start) : 1e9;
        if (left <= 0) {
            fprintf(stderr, "loomctl: job %s did not end within %.0f s (--timeout)\n", id,
                    timeout_s);
            return LOOMCTL_EXIT_WAIT_TIMEOUT;
        }
        int w = left < poll_s ? (int)ceil(left) : poll_s;
        snprintf(path, sizeof path, "/v1/events?job=%s&since=%lld&wait=%d&limit=1000", enc, since,
                 w);
        json_t *page = NULL;
        rc = get(cli, path, &page, err, sizeof err);
        if (rc > 0) return LOOMCTL_EXIT_ERROR;
        if (rc < 0) {
            /* loomd restarting or briefly unreachable: retry the same cursor. */
            fprintf(stderr, "loomctl: %s; retrying\n", *err ? err : "loomd unavailable");
            struct timespec ts = {(time_t)retry, (long)((retry - (long)retry) * 1e9)};
            nanosleep(&ts, NULL);
            retry = retry * 2 < RETRY_MAX_S ? retry * 2 : RETRY_MAX_S;
            continue;
        }
        retry = 0.25;
        size_t i;
        json_t *e;
        if (follow && !cli->json) print_steps(cli, enc, total, &last_step);
        json_array_foreach(json_object_get(page, "items"), i, e) {
            if (follow && cli->json) {
                char *line = json_dumps(e, JSON_COMPACT); /* one event a line (JSON Lines) */
                if (line) puts(line);
                free(line);
            } else if (follow) {
                print_event(e);
            }
            int code = cli_outcome_of(json_string_value(json_object_get(e, "type")));
            if (code >= 0 && result < 0) result = code;
        }
        since = json_integer_value(json_object_get(page, "next"));
        json_decref(page);
        fflush(stdout);
    }
    if (follow && !cli->json) print_steps(cli, enc, total, &last_step); /* shipped at the end */
    if (!cli->json) {
        printf("job %s %s\n", id,
               result == LOOMCTL_EXIT_SUCCEEDED    ? "succeeded"
               : result == LOOMCTL_EXIT_JOB_FAILED ? "failed"
                                                   : "cancelled");
    } else {
        snprintf(path, sizeof path, "/v1/jobs/%s", enc);
        if (get(cli, path, &job, err, sizeof err) == 0) cli_print_json(job);
        json_decref(job);
    }
    return result;
}

/* Parses --timeout S; 0 ok, -1 bad value (printed). */
int cli_parse_timeout(const char *v, double *out) {
    char *end;
    double t = v ? strtod(v, &end) : -1;
    if (!v || *end || !(t > 0) || t > 1e7) {
        fprintf(stderr, "loomctl: --timeout '%s' is not a number of seconds > 0\n", v ? v : "");
        return -1;
    }
    *out = t;
    return 0;
}

int cmd_wait(struct cli *cli, int argc, char **argv) {
    const char *id = NULL;
    int follow = 0;
    double timeout = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--follow") || !strcmp(argv[i], "-f")) {
            follow = 1;
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            if (cli_parse_timeout(argv[++i], &timeout) != 0) return LOOMCTL_EXIT_USAGE;
        } else if (argv[i][0] == '-' || id) {
            fprintf(stderr, "usage: loomctl wait JOB_ID [--follow] [--timeout S]\n");
            return LOOMCTL_EXIT_USAGE;
        } else {
            id = argv[i];
        }
    }
    if (!id) {
        fprintf(stderr, "usage: loomctl wait JOB_ID [--follow] [--timeout S]\n");
        return LOOMCTL_EXIT_USAGE;
    }
    return cli_job_wait(cli, id, follow, timeout);
}
