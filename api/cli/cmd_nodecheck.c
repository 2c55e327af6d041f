/* loomctl node check NODE|--all (also `loomctl node-check`): queue node
 * checks (daemon/nodecheck.h), wait for them and print a table. --all checks
 * every ready/drained/degraded node alone (all-reduce over its devices) and
 * every neighbouring pair in a ring (one rank per node: the path between
 * them). --clear removes a node's degraded marks (use it anyway); --history
 * lists past checks. Exit codes: 0 every check passed, 4 a check found a
 * node degraded or failed, else loomctl's usual codes (1 refused, 2 usage). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/cli/cli.h"
#include "common/clock.h"

#define MAX_CHECKS 512

static void usage(void) {
    fprintf(stderr, "usage: loomctl node check NODE|--all [--peer NODE] [--expect-busbw GBPS]\n"
                    "         [--min-ratio R] [--max-bytes N] [--force] [--no-wait]\n"
                    "       loomctl node check NODE --clear      (drop its degraded marks)\n"
                    "       loomctl node check [NODE] --history  (past checks, newest first)\n");
}

static int finished(json_t *c) {
    const char *s = json_string_value(json_object_get(c, "state"));
    return s && strcmp(s, "queued") && strcmp(s, "running");
}

static void print_row(json_t *c) {
    char nodes[160] = "";
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(c, "nodes"), i, n) {
        if (i) strncat(nodes, ",", sizeof nodes - strlen(nodes) - 1);
        strncat(nodes, json_string_value(n) ? json_string_value(n) : "?",
                sizeof nodes - strlen(nodes) - 1);
    }
    json_t *s = json_object_get(c, "summary");
    char bw[32] = "-", lat[32] = "-";
    /* A one-device check has null bandwidth and latency (skipped): "-". */
    if (json_is_number(json_object_get(s, "peak_busbw_gbps")))
        snprintf(bw, sizeof bw, "%.3g", json_number_value(json_object_get(s, "peak_busbw_gbps")));
    if (json_is_number(json_object_get(s, "latency_us")))
        snprintf(lat, sizeof lat, "%.0f", json_number_value(json_object_get(s, "latency_us")));
    printf("%-15s %-5s %-25s %-9s %9s %9.3g %8s  %s\n", cli_str(c, "id"), cli_str(c, "kind"), nodes,
           cli_str(c, "state"), bw, json_number_value(json_object_get(c, "expect_busbw_gbps")), lat,
           cli_str(c, "reason"));
}

static void print_header(void) {
    printf("%-15s %-5s %-25s %-9s %9s %9s %8s  %s\n", "CHECK", "KIND", "NODES", "STATE", "BUSBW",
           "EXPECTED", "LAT_US", "REASON");
}

static int queue(struct cli *cli, const char *node, json_t *opts, const char *peer, json_t **ids) {
    char enc[256], path[512];
    cli_urlencode(node, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodes/%s/check", enc);
    json_t *body = json_deep_copy(opts), *out = NULL;
    if (peer) json_object_set_new(body, "peer", json_string(peer));
    int rc = cli_call(cli, "POST", path, body, &out);
    json_decref(body);
    if (rc) return -1;
    json_array_append_new(*ids, json_string(cli_str(out, "id")));
    json_decref(out);
    return 0;
}

static int history(struct cli *cli, const char *node) {
    char enc[256] = "", path[512];
    if (node) cli_urlencode(node, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodechecks?limit=50%s%s", node ? "&node=" : "", enc);
    json_t *out = NULL;
    if (cli_call(cli, "GET", path, NULL, &out)) return 1;
    if (cli->json) {
        cli_print_json(out);
    } else {
        print_header();
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(out, "items"), i, c) print_row(c);
    }
    json_decref(out);
    return 0;
}

struct check_args {
    const char *node, *peer;
    int all, wait, clear, hist;
    json_t *opts; /* the POST body's options (caller frees) */
};

/* Parses argv into a; 0, or -1 on a usage error (usage printed). */
static int parse_args(int argc, char **argv, struct check_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--all"))
            a->all = 1;
        else if (!strcmp(o, "--no-wait"))
            a->wait = 0;
        else if (!strcmp(o, "--clear"))
            a->clear = 1;
        else if (!strcmp(o, "--history"))
            a->hist = 1;
        else if (!strcmp(o, "--force"))
            json_object_set_new(a->opts, "force", json_true());
        else if (!strcmp(o, "--peer") && v)
            a->peer = argv[++i];
        else if (!strcmp(o, "--expect-busbw") && v)
            json_object_set_new(a->opts, "expect_busbw_gbps", json_real(atof(argv[++i])));
        else if (!strcmp(o, "--min-ratio") && v)
            json_object_set_new(a->opts, "min_ratio", json_real(atof(argv[++i])));
        else if (!strcmp(o, "--max-bytes") && v)
            json_object_set_new(a->opts, "max_bytes", json_integer(atoll(argv[++i])));
        else if (o[0] != '-' && !a->node)
            a->node = o;
        else {
            usage();
            return -1;
        }
    }
    return 0;
}

static int clear_marks(struct cli *cli, const char *node) {
    char enc[256], path[512];
    cli_urlencode(node, enc, sizeof enc);
    snprintf(path, sizeof path, "/v1/nodes/%s/degraded", enc);
    json_t *out = NULL;
    if (cli_call(cli, "DELETE", path, NULL, &out)) return 1;
    printf("node %s: %lld degraded mark(s) cleared\n", node,
           (long long)json_integer_value(json_object_get(out, "cleared")));
    json_decref(out);
    return 0;
}

/* --all: every checkable node alone, then neighbouring pairs in a ring. 0, or 1 when
 * something could not be queued (what could be is in ids). */
static int queue_all(struct cli *cli, json_t *opts, json_t **ids) {
    json_t *nodes = NULL;
    if (cli_call(cli, "GET", "/v1/nodes", NULL, &nodes)) return 1;
    int rc = 0;
    const char *names[MAX_CHECKS];
    int n = 0;
    size_t i;
    json_t *nd;
    json_array_foreach(json_object_get(nodes, "nodes"), i, nd) {
        const char *st = cli_str(nd, "state");
        if (n < MAX_CHECKS &&
            (!strcmp(st, "ready") || !strcmp(st, "drained") || !strcmp(st, "degraded")))
            names[n++] = cli_str(nd, "name");
        else
            fprintf(stderr, "loomctl: skipping node %s (%s)\n", cli_str(nd, "name"), st);
    }
    for (int k = 0; k < n; k++)
        if (queue(cli, names[k], opts, NULL, ids)) rc = 1;
    /* pairs in a ring: each node is measured against two neighbours,
     * so a bad link and a bad node can be told apart */
    for (int k = 0; n > 1 && k < (n == 2 ? 1 : n); k++)
        if (queue(cli, names[k], opts, names[(k + 1) % n], ids)) rc = 1;
    json_decref(nodes);
    return rc;
}

/* Waits for every check in ids (each part has 180 s on loomd's side), prints them and
 * gives the exit code: rc, else 4 when one did not pass, 1 when one could not be read. */
static int wait_all(struct cli *cli, json_t *ids, int rc) {
    json_t *results = json_array();
    size_t i;
    json_t *id;
    json_array_foreach(ids, i, id) {
        char path[256];
        snprintf(path, sizeof path, "/v1/nodechecks/%s", json_string_value(id));
        json_t *c = NULL;
        for (int tries = 0; tries < 2400; tries++) {
            json_decref(c);
            c = NULL;
            if (cli_call(cli, "GET", path, NULL, &c)) break;
            if (finished(c)) break;
            clock_sleep_ms(250);
        }
        if (c) json_array_append_new(results, c);
    }
    if (cli->json) {
        cli_print_json(results);
    } else {
        print_header();
        json_array_foreach(results, i, id) print_row(id);
    }
    json_array_foreach(results, i, id) {
        const char *s = cli_str(id, "state");
        if (strcmp(s, "passed") && rc == 0) rc = 4;
    }
    if (json_array_size(results) < json_array_size(ids) && rc == 0) rc = 1;
    json_decref(results);
    return rc;
}

int cmd_node_check(struct cli *cli, int argc, char **argv) {
    struct check_args a = {.wait = 1, .opts = json_object()};
    int rc = 0;
    json_t *ids = NULL;
    if (parse_args(argc, argv, &a) != 0) {
        rc = 2;
    } else if (a.hist) {
        rc = history(cli, a.node);
    } else if ((!a.node && !a.all) || (a.node && a.all) || (a.clear && !a.node)) {
        usage();
        rc = 2;
    } else if (a.clear) {
        rc = clear_marks(cli, a.node);
    } else {
        ids = json_array();
        if (a.node)
            rc = queue(cli, a.node, a.opts, a.peer, &ids) ? 1 : 0;
        else
            rc = queue_all(cli, a.opts, &ids);
        if (json_array_size(ids) && a.wait) {
            rc = wait_all(cli, ids, rc);
        } else {
            size_t i;
            json_t *id;
            json_array_foreach(ids, i, id) printf("queued %s\n", json_string_value(id));
        }
    }
    json_decref(a.opts);
    json_decref(ids);
    return rc;
}
