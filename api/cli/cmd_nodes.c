/* loomctl nodes, node, drain, undrain: cluster state from GET /v1/nodes and
 * the admin drain switch. */
#include "api/cli/cli.h"

#include <stdio.h>
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
