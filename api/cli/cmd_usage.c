/* loomctl usage: GPU-hours and cost from GET /v1/usage. */
#include "api/cli/cli.h"

#include <stdio.h>
#include <string.h>

int cmd_usage(struct cli *cli, int argc, char **argv) {
    char q[1024] = "", enc[256];
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (i + 1 >= argc || (strcmp(opt, "--from") && strcmp(opt, "--to") &&
                              strcmp(opt, "--group-by") && strcmp(opt, "--tenant"))) {
            fprintf(stderr, "usage: loomctl usage [--from T] [--to T] "
                            "[--group-by tenant|job|month|node|gpu_model] [--tenant ID]\n");
            return 2;
        }
        cli_urlencode(argv[++i], enc, sizeof enc);
        n += (size_t)snprintf(q + n, sizeof q - n, "%s%s=%s", n ? "&" : "?",
                              !strcmp(opt, "--group-by") ? "group_by" : opt + 2, enc);
    }
    char path[1200];
    snprintf(path, sizeof path, "/v1/usage%s", q);
    json_t *out = NULL;
    int got = cli_get(cli, path, &out);
    if (got != 0) return got < 0;
    printf("%-24s %12s %12s %6s\n", cli_str(out, "group_by"), "GPU-HOURS", "COST", "ROWS");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(out, "rows"), i, r) {
        printf("%-24s %12.4f %12.4f %6lld\n", cli_str(r, "key"),
               json_number_value(json_object_get(r, "gpu_hours")),
               json_number_value(json_object_get(r, "cost")),
               (long long)json_integer_value(json_object_get(r, "rows")));
    }
    json_t *t = json_object_get(out, "total");
    printf("%-24s %12.4f %12.4f   (price %.2f per GPU-hour)\n", "total",
           json_number_value(json_object_get(t, "gpu_hours")),
           json_number_value(json_object_get(t, "cost")),
           json_number_value(json_object_get(out, "price_per_gpu_hour")));
    json_t *run = json_object_get(out, "running");
    if (json_array_size(run) > 0) {
        printf("\nrunning (not in the ledger yet):\n%-18s %-7s %-20s %5s %12s %12s\n", "JOB",
               "ATTEMPT", "NODE", "GPUS", "GPU-HOURS", "COST");
        json_array_foreach(run, i, r) {
            printf("%-18s %-7lld %-20s %5lld %12.4f %12.4f\n", cli_str(r, "job"),
                   (long long)json_integer_value(json_object_get(r, "attempt")), cli_str(r, "node"),
                   (long long)json_integer_value(json_object_get(r, "gpus")),
                   json_number_value(json_object_get(r, "gpu_seconds")) / 3600.0,
                   json_number_value(json_object_get(r, "cost")));
        }
    }
    json_decref(out);
    return 0;
}
