/* loomctl plan: validate a job spec and print the planner's estimate (memory
 * per GPU by category, communication, time, cost) and the ranked alternative
 * layouts as tables. Asks loomd (POST /v1/plan) by default; --local runs the
 * same planner library in-process, so it works without a server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli/cli.h"
#include "api/planner.h"

#define USAGE                                                                                      \
    "plan FILE.json [--local] [--nodes N] [--gpus-per-node G] [--gpu NAME] [--gpu-mem-gib M] "     \
    "[--intra-link L] [--inter-link L] [--nics-per-node N] [--host-mem-gib M] [--price P] "        \
    "[--alternatives N]"

static double num(json_t *o, const char *k) {
    return json_number_value(json_object_get(o, k));
}

static void human_bytes(double b, char *out, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, n, "%.3g %s", b, u[i]);
}

static void print_layout(json_t *l) {
    printf("dp=%lld tp=%lld pp=%lld zero_stage=%lld offload_optimizer=%s recompute=%s "
           "micro_batch=%lld grad_accum=%lld (%lld GPUs on %lld node%s)",
           (long long)json_integer_value(json_object_get(l, "dp")),
           (long long)json_integer_value(json_object_get(l, "tp")),
           (long long)json_integer_value(json_object_get(l, "pp")),
           (long long)json_integer_value(json_object_get(l, "zero_stage")),
           json_is_true(json_object_get(l, "offload_optimizer")) ? "true" : "false",
           cli_str(l, "recompute"),
           (long long)json_integer_value(json_object_get(l, "micro_batch")),
           (long long)json_integer_value(json_object_get(l, "grad_accum")),
           (long long)json_integer_value(json_object_get(l, "gpus")),
           (long long)json_integer_value(json_object_get(l, "nodes")),
           json_integer_value(json_object_get(l, "nodes")) == 1 ? "" : "s");
}

static void print_plan(json_t *out) {
    json_t *spec = json_object_get(out, "spec");
    json_t *model = json_object_get(spec, "model");
    json_t *der = json_object_get(out, "derived");
    json_t *est = json_object_get(out, "estimate");
    json_t *cl = json_object_get(out, "cluster");
    printf("%-10s %s %s: %.3g B parameters, %.3g FLOP/token\n", "model", cli_str(model, "family"),
           cli_str(model, "preset"),
           (double)json_integer_value(json_object_get(der, "n_params")) / 1e9,
           num(der, "flops_per_token"));
    if (!est) {
        printf("%-10s valid (the server sent no estimate)\n", "spec");
        return;
    }
    printf("%-10s ", "layout");
    print_layout(json_object_get(est, "layout"));
    printf("\n%-10s %lld x %lld %s (%.0f GiB), %s %.0f GB/s in a node, %s %.1f GB/s between\n",
           "cluster", (long long)json_integer_value(json_object_get(cl, "nodes")),
           (long long)json_integer_value(json_object_get(cl, "gpus_per_node")), cli_str(cl, "gpu"),
           num(cl, "gpu_mem_gib"), cli_str(cl, "intra_link"), num(cl, "intra_gbps"),
           cli_str(cl, "inter_link"), num(cl, "inter_gbps"));
    printf("%-10s %s\n", "fits", json_is_true(json_object_get(out, "fits")) ? "yes" : "NO");
    json_t *reasons = json_object_get(out, "reasons");
    size_t i;
    json_t *v;
    json_array_foreach(reasons, i, v) printf("%-10s %s\n", i ? "" : "notes", json_string_value(v));

    json_t *mem = json_object_get(est, "memory_gib");
    static const char *const cats[] = {"params", "grads",     "optimizer", "activations",
                                       "comm",   "workspace", "reserved",  "total"};
    printf("\nmemory per GPU, GiB (stage %lld, %lld micro-batch%s in flight)\n ",
           (long long)json_integer_value(json_object_get(mem, "stage")),
           (long long)json_integer_value(json_object_get(mem, "inflight_micro_batches")),
           json_integer_value(json_object_get(mem, "inflight_micro_batches")) == 1 ? "" : "es");
    for (size_t k = 0; k < sizeof cats / sizeof *cats; k++)
        printf(" %11s", cats[k]);
    printf(" %11s\n ", "gpu");
    for (size_t k = 0; k < sizeof cats / sizeof *cats; k++)
        printf(" %11.2f", num(mem, cats[k]));
    printf(" %11.0f\n", num(mem, "gpu"));
    if (num(mem, "host_offload_per_node") > 0)
        printf("  host memory for the offloaded optimizer: %.1f GiB per node\n",
               num(mem, "host_offload_per_node"));

    json_t *comm = json_object_get(est, "communication");
    if (json_array_size(comm)) {
        printf("\ncommunication per step\n  %-6s %-15s %5s %5s %11s %8s %8s %9s %9s\n", "group",
               "op", "ranks", "cross", "bytes/call", "calls", "GB/s", "seconds", "exposed");
        json_array_foreach(comm, i, v) {
            char b[32];
            human_bytes(num(v, "bytes"), b, sizeof b);
            printf("  %-6s %-15s %5lld %5s %11s %8.0f %8.1f %9.3g %9.3g\n", cli_str(v, "group"),
                   cli_str(v, "op"), (long long)json_integer_value(json_object_get(v, "ranks")),
                   json_is_true(json_object_get(v, "cross_node")) ? "yes" : "no", b,
                   num(v, "count"), num(v, "gbps"), num(v, "seconds"), num(v, "exposed_seconds"));
        }
    }
    json_t *t = json_object_get(est, "time");
    printf("\n%-10s step %.4g s = compute %.4g + bubble %.3g + exposed comm %.3g + optimizer "
           "%.3g; %.4g tokens/s; MFU %.1f%%\n",
           "time", num(t, "step_s"), num(t, "compute_s"), num(t, "bubble_s"),
           num(t, "comm_exposed_s"), num(t, "optimizer_s"), num(t, "tokens_per_s"),
           100 * num(t, "mfu"));
    json_t *run = json_object_get(est, "run");
    printf("%-10s %lld steps: %.3g h, %.4g GPU-hours, cost %.2f at %.2f per GPU-hour\n", "run",
           (long long)json_integer_value(json_object_get(json_object_get(spec, "train"), "steps")),
           num(run, "hours"), num(run, "gpu_hours"), num(run, "cost"),
           num(cl, "price_per_gpu_hour"));

    json_t *alts = json_object_get(out, "alternatives");
    json_t *rec = json_object_get(out, "recommended");
    long long rec_rank = json_integer_value(json_object_get(rec, "rank"));
    if (json_array_size(alts)) {
        printf("\nalternatives (%lld layouts considered; * = recommended)\n",
               (long long)json_integer_value(json_object_get(out, "layouts_considered")));
        printf("  %3s %5s %4s %3s %3s %4s %4s %-9s %3s %8s %9s %5s  %s\n", "#", "gpus", "dp", "tp",
               "pp", "zero", "off", "recompute", "mb", "GiB/GPU", "s/step", "MFU", "why");
        json_array_foreach(alts, i, v) {
            json_t *l = json_object_get(v, "layout");
            long long r = json_integer_value(json_object_get(v, "rank"));
            printf(
                "  %2lld%s %5lld %4lld %3lld %3lld %4lld %4s %-9s %3lld %8.1f %9.4g %4.0f%%  %s\n",
                r, r == rec_rank ? "*" : " ",
                (long long)json_integer_value(json_object_get(l, "gpus")),
                (long long)json_integer_value(json_object_get(l, "dp")),
                (long long)json_integer_value(json_object_get(l, "tp")),
                (long long)json_integer_value(json_object_get(l, "pp")),
                (long long)json_integer_value(json_object_get(l, "zero_stage")),
                json_is_true(json_object_get(l, "offload_optimizer")) ? "yes" : "no",
                cli_str(l, "recompute"),
                (long long)json_integer_value(json_object_get(l, "micro_batch")),
                num(json_object_get(v, "memory_gib"), "total"),
                num(json_object_get(v, "time"), "step_s"),
                100 * num(json_object_get(v, "time"), "mfu"), cli_str(v, "why"));
        }
    }
    if (json_is_object(rec)) {
        printf("\n%-10s ", "recommend");
        print_layout(json_object_get(rec, "layout"));
        printf("\n%-10s %s\n", "", cli_str(rec, "why"));
    } else {
        printf("\n%-10s no layout of this model fits the cluster\n", "recommend");
    }
    /* a full fine-tune that does not fit as submitted: as LoRA, as QLoRA */
    json_array_foreach(json_object_get(out, "lora_options"), i, v)
        printf("%-10s %s\n", i ? "" : "adapters", cli_str(v, "why"));
}

/* Flags that fill the "cluster" object: flag, key, 1 = integer, 0 = number, 2 = string. */
static const struct {
    const char *flag, *key;
    int kind;
} cluster_flags[] = {
    {"--nodes", "nodes", 1},
    {"--gpus-per-node", "gpus_per_node", 1},
    {"--gpu", "gpu", 2},
    {"--gpu-mem-gib", "gpu_mem_gib", 0},
    {"--intra-link", "intra_link", 2},
    {"--inter-link", "inter_link", 2},
    {"--nics-per-node", "nics_per_node", 1},
    {"--host-mem-gib", "host_mem_gib", 0},
    {"--price", "price_per_gpu_hour", 0},
};

int cmd_plan(struct cli *cli, int argc, char **argv) {
    const char *file = NULL;
    int local = 0;
    long alternatives = 10;
    json_t *cluster = json_object();
    int rc = 2;
    json_t *body = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        int used = 0;
        for (size_t k = 0; k < sizeof cluster_flags / sizeof *cluster_flags && !used; k++) {
            if (strcmp(argv[i], cluster_flags[k].flag) || i + 1 >= argc) continue;
            const char *v = argv[++i];
            char *end = NULL;
            json_t *jv = NULL;
            if (cluster_flags[k].kind == 2) {
                jv = json_string(v);
            } else {
                double d = strtod(v, &end);
                if (!end || *end || end == v) {
                    fprintf(stderr, "loomctl plan: %s needs a number, got '%s'\n",
                            cluster_flags[k].flag, v);
                    goto out;
                }
                jv = cluster_flags[k].kind == 1 ? json_integer((json_int_t)d) : json_real(d);
            }
            json_object_set_new(cluster, cluster_flags[k].key, jv);
            used = 1;
        }
        if (used) continue;
        if (!strcmp(argv[i], "--cluster") && i + 1 < argc) {
            /* What-if: a cluster description (the "cluster" object's keys)
             * from a file; flags given on the command line override it. */
            json_t *f = cli_read_json_file(argv[++i]);
            if (!json_is_object(f)) {
                if (f)
                    fprintf(stderr, "loomctl plan: %s: the cluster must be a JSON object\n",
                            argv[i]);
                json_decref(f);
                goto out;
            }
            json_object_update(f, cluster);
            json_decref(cluster);
            cluster = f;
        } else if (!strcmp(argv[i], "--local"))
            local = 1;
        else if (!strcmp(argv[i], "--alternatives") && i + 1 < argc)
            alternatives = strtol(argv[++i], NULL, 10);
        else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "usage: loomctl %s\n", USAGE);
            goto out;
        } else
            file = argv[i];
    }
    if (!file) {
        fprintf(stderr, "usage: loomctl %s\n", USAGE);
        goto out;
    }
    body = cli_read_json_file(file);
    if (!body) goto out;
    if (!json_is_object(body)) {
        fprintf(stderr, "loomctl plan: %s: the spec must be a JSON object\n", file);
        goto out;
    }
    if (json_object_size(cluster)) {
        json_t *have = json_object_get(body, "cluster");
        if (json_is_object(have))
            json_object_update(have, cluster);
        else
            json_object_set(body, "cluster", cluster);
    }
    json_t *opts = json_object_get(body, "options");
    if (!json_is_object(opts)) {
        opts = json_object();
        json_object_set_new(body, "options", opts);
    }
    json_object_set_new(opts, "max_alternatives", json_integer(alternatives));

    if (local) {
        struct loom_error e;
        if (planner_plan_json(body, NULL, &out, &e) != 0) {
            fprintf(stderr, "loomctl: %d %s: %s%s%s\n", e.status, e.code, e.message,
                    e.field[0] ? " at " : "", e.field);
            rc = 1;
            goto out;
        }
    } else {
        int crc = cli_call(cli, "POST", "/v1/plan", body, &out);
        if (crc != 0) {
            rc = crc == -3 ? 3 : 1; /* 3: loomd unreachable, as the other commands */
            goto out;
        }
    }
    if (cli->json)
        cli_print_json(out);
    else
        print_plan(out);
    rc = 0;
out:
    json_decref(out);
    json_decref(body);
    json_decref(cluster);
    return rc;
}
