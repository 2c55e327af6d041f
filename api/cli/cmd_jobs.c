/* loomctl job commands: submit, list, get, cancel, events. Tables for people,
 * --json for scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void print_job(json_t *j) {
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
    if (need_args(argc, 2, "submit FILE.json [--idempotency-key KEY]")) return 2;
    const char *file = NULL, *key = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--idempotency-key") && i + 1 < argc)
            key = argv[++i];
        else
            file = argv[i];
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
    if (cli->json)
        cli_print_json(out);
    else
        printf("submitted %s (%s)\n", cli_str(out, "id"), cli_str(out, "state"));
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
    json_t *items = json_array();
    int rc = 0;
    for (;;) {
        char path[1200];
        snprintf(path, sizeof path, "/v1/jobs?%s%s%s", q, cursor[0] ? "&cursor=" : "", cursor);
        json_t *out = NULL;
        rc = cli_call(cli, "GET", path, NULL, &out);
        if (rc) break;
        json_array_extend(items, json_object_get(out, "items"));
        json_t *next = json_object_get(out, "next_cursor");
        int more = all && json_is_string(next);
        if (more) snprintf(cursor, sizeof cursor, "%s", json_string_value(next));
        json_decref(out);
        if (!more) break;
    }
    if (rc) {
        json_decref(items);
        return fail(rc);
    }
    if (cli->json) {
        cli_print_json(items);
    } else {
        printf("%-16s %-24s %-10s %-7s %-24s %s\n", "ID", "NAME", "STATE", "ATTEMPT", "CREATED",
               "PENDING");
        size_t i;
        json_t *j;
        json_array_foreach(items, i, j) {
            printf("%-16s %-24.24s %-10s %-7lld %-24s %s\n", cli_str(j, "id"), cli_str(j, "name"),
                   cli_str(j, "state"),
                   (long long)json_integer_value(json_object_get(j, "attempt")),
                   cli_str(j, "created_at"), cli_str(j, "pending_reason"));
        }
    }
    json_decref(items);
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
    if (cli->json)
        cli_print_json(out);
    else
        print_job(out);
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
