/* loomctl nodes, node, drain, undrain, label: cluster state from GET /v1/nodes,
 * the admin drain switch and a node's pool and labels (PATCH /v1/nodes/{id}). */
#include "api/cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_nodes(struct cli *cli, int argc, char **argv) {
    json_t *out = NULL;
    int got = cli_get(cli, "/v1/nodes", &out);
    if (got != 0) return got < 0;
    printf("%-20s %-8s %-5s %-10s %-24s %5s %5s %5s  %s\n", "NODE", "STATE", "KIND", "GPU_TYPE",
           "MODEL", "TOTAL", "USED", "FREE", "LAST HEARTBEAT");
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(out, "nodes"), i, n) {
        printf("%-20s %-8s %-5s %-10s %-24s %5lld %5lld %5lld  %s\n", cli_str(n, "name"),
               cli_str(n, "state"), cli_str(n, "kind"), cli_str(n, "gpu_type"),
               cli_str(n, "gpu_model"),
               (long long)json_integer_value(json_object_get(n, "devices_total")),
               (long long)json_integer_value(json_object_get(n, "devices_used")),
               (long long)json_integer_value(json_object_get(n, "devices_free")),
               cli_str(n, "last_heartbeat"));
    }
    json_decref(out);
    return 0;
}

int cmd_node(struct cli *cli, int argc, char **argv) {
    /* `loomctl node check ...`: node checks (api/cli/cmd_nodecheck.c) */
    if (argc >= 2 && !strcmp(argv[1], "check")) return cmd_node_check(cli, argc - 1, argv + 1);
    if (argc != 2) {
        fprintf(stderr, "usage: loomctl node NODE\n");
        return 2;
    }
    char enc[256], path[512];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodes/%s", enc);
    json_t *out = NULL;
    int got = cli_get(cli, path, &out);
    if (got != 0) return got < 0;
    printf("node %s: %s, %s, %lld/%lld devices used, last heartbeat %s\n", cli_str(out, "name"),
           cli_str(out, "state"), cli_str(out, "kind"),
           (long long)json_integer_value(json_object_get(out, "devices_used")),
           (long long)json_integer_value(json_object_get(out, "devices_total")),
           cli_str(out, "last_heartbeat"));
    char *labels = json_dumps(json_object_get(out, "labels"), JSON_COMPACT | JSON_SORT_KEYS);
    char *isl = json_dumps(json_object_get(out, "nvlink_islands"), JSON_COMPACT);
    printf("pool \"%s\", labels %s, NVLink islands %s\n", cli_str(out, "pool"),
           labels ? labels : "{}", isl ? isl : "[]");
    free(labels);
    free(isl);
    printf("%-4s %-24s %-12s %10s %10s %5s %6s %5s  %s\n", "DEV", "NAME", "UUID", "MEM USED",
           "MEM TOTAL", "UTIL", "POWER", "TEMP", "TASK");
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(out, "devices"), i, d) {
        printf("%-4zu %-24s %-12.12s %7lldMiB %7lldMiB %4lld%% %5lldW %4lldC  %s\n", i,
               cli_str(d, "name"), cli_str(d, "uuid"),
               (long long)json_integer_value(json_object_get(d, "mem_used_mib")),
               (long long)json_integer_value(json_object_get(d, "mem_total_mib")),
               (long long)json_integer_value(json_object_get(d, "util_pct")),
               (long long)json_integer_value(json_object_get(d, "power_w")),
               (long long)json_integer_value(json_object_get(d, "temp_c")), cli_str(d, "task"));
    }
    json_decref(out);
    return 0;
}

static int drain(struct cli *cli, int argc, char **argv, const char *verb) {
    if (argc != 2) {
        fprintf(stderr, "usage: loomctl %s NODE\n", verb);
        return 2;
    }
    char enc[256], path[512];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodes/%s/%s", enc, verb);
    json_t *out = NULL;
    if (cli_call(cli, "POST", path, NULL, &out)) return 1;
    if (cli->json)
        cli_print_json(out);
    else
        printf("node %s: %s\n", cli_str(out, "name"), cli_str(out, "state"));
    json_decref(out);
    return 0;
}

int cmd_drain(struct cli *cli, int argc, char **argv) {
    return drain(cli, argc, argv, "drain");
}

int cmd_undrain(struct cli *cli, int argc, char **argv) {
    return drain(cli, argc, argv, "undrain");
}

/* loomctl label NODE [--pool P] [KEY=VALUE | KEY-]...: one PATCH with the
 * pool and a merge patch of the labels (KEY- sends null: removed). */
int cmd_label(struct cli *cli, int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: loomctl label NODE [--pool P] [KEY=VALUE | KEY-]...\n");
        return 2;
    }
    json_t *body = json_object(), *labels = json_object();
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t l = strlen(a);
        if (!strcmp(a, "--pool") && i + 1 < argc) {
            json_object_set_new(body, "pool", json_string(argv[++i]));
        } else if (eq && eq > a) {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
            json_object_set_new(labels, key, json_string(eq + 1));
        } else if (l > 1 && a[l - 1] == '-' && a[0] != '-') {
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(l - 1), a);
            json_object_set_new(labels, key, json_null());
        } else {
            fprintf(stderr, "loomctl label: '%s' is not --pool P, KEY=VALUE or KEY-\n", a);
            json_decref(body);
            json_decref(labels);
            return 2;
        }
    }
    if (json_object_size(labels)) json_object_set(body, "labels", labels);
    json_decref(labels);
    char enc[256], path[512];
    cli_urlencode(argv[1], enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodes/%s", enc);
    json_t *out = NULL;
    int rc = cli_call(cli, "PATCH", path, body, &out);
    json_decref(body);
    if (rc) return 1;
    if (cli->json) {
        cli_print_json(out);
    } else {
        char *lj = json_dumps(json_object_get(out, "labels"), JSON_COMPACT | JSON_SORT_KEYS);
        printf("node %s: pool \"%s\", labels %s\n", cli_str(out, "name"), cli_str(out, "pool"),
               lj ? lj : "{}");
        free(lj);
    }
    json_decref(out);
    return 0;
}
