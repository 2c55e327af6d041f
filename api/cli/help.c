/* loomctl per-command help: `loomctl COMMAND --help` prints the command's
 * usage line (commands.def) and every option it takes, from the table below
 * (one row per option, grouped by command). A command without rows takes no
 * options besides the global ones. */
#include <stdio.h>
#include <string.h>

#include "api/cli/cli.h"

struct cli_option {
    const char *command, *option, *help;
};

static const struct cli_option options[] = {
    {"submit", "--idempotency-key KEY", "retrying with the same key never submits twice"},
    {"submit", "--wait", "block until the job ends; exit 0 succeeded, 4 failed, 5 cancelled"},
    {"submit", "--follow, -f", "like --wait, printing the job's events and step records"},
    {"submit", "--timeout S", "with --wait/--follow: give up after S seconds (exit 6)"},
    {"wait", "--follow, -f", "print the job's events and step records while waiting"},
    {"wait", "--timeout S", "give up after S seconds (exit 6)"},
    {"list", "--state S", "only jobs in state S (queued, running, succeeded, ...)"},
    {"list", "--name N", "only jobs named N"},
    {"list", "--label K=V", "only jobs with label K=V"},
    {"list", "--limit N", "at most N jobs a page"},
    {"list", "--tenant T", "admin: only tenant T's jobs"},
    {"list", "--all", "follow next_cursor to the last page"},
    {"tenant-create", "--data-root DIR", "confine the tenant's data paths to DIR (repeatable)"},
    {"tenant-create", "--gpu-quota N", "at most N GPUs in use at once (0: no limit)"},
    {"tenant-update", "--gpu-quota N", "new GPU quota"},
    {"tenant-update", "--data-root DIR", "new data roots (repeatable; replaces the list)"},
    {"plan", "--local", "estimate here without asking loomd"},
    {"plan", "--cluster FILE",
     "what-if: the cluster from a JSON file (keys as the flags below: "
     "nodes, gpus_per_node, gpu, ...); flags override it"},
    {"plan", "--alternatives N", "rank N alternative layouts"},
    {"plan", "--nodes N", "cluster: number of nodes"},
    {"plan", "--gpus-per-node G", "cluster: GPUs per node"},
    {"plan", "--gpu NAME", "cluster: GPU type (e.g. H100-SXM, H200)"},
    {"plan", "--gpu-mem-gib X", "cluster: memory per GPU in GiB"},
    {"plan", "--intra-link NAME", "cluster: link inside a node (nvlink, pcie, ...)"},
    {"plan", "--inter-link NAME", "cluster: link between nodes (ib, ethernet, ...)"},
    {"plan", "--nics-per-node N", "cluster: network cards per node"},
    {"plan", "--host-mem-gib X", "cluster: host memory per node in GiB"},
    {"plan", "--price P", "price per GPU-hour for the cost estimate"},
    {"node-check", "--all", "check every node"},
    {"node-check", "--peer NODE", "bandwidth between NODE and the node checked"},
    {"node-check", "--expect-busbw G", "expected bus bandwidth in GB/s"},
    {"node-check", "--min-ratio R", "degraded below R x the expected bandwidth"},
    {"node-check", "--max-bytes B", "largest all-reduce size"},
    {"node-check", "--no-wait", "start the check and return"},
    {"node-check", "--force", "check a node that is running tasks"},
    {"node-check", "--clear", "clear the node's degraded mark"},
    {"node-check", "--history", "list past checks of the node"},
    {"label", "--pool P", "put the node in pool P (\"\": no pool)"},
    {"label", "KEY=VALUE", "set label KEY (repeatable)"},
    {"label", "KEY-", "remove label KEY (repeatable)"},
    {"logs", "--rank R", "rank R (default 0)"},
    {"logs", "--attempt A", "attempt A (default the newest one with logs)"},
    {"logs", "--stream stdout|stderr", "stdout (default: step records, shown as text) or stderr"},
    {"logs", "-f, --follow", "keep printing while the job runs"},
    {"logs", "--raw", "print the records as the worker wrote them (JSON lines); also --json"},
    {"metrics", "--rank R", "rank R (default 0)"},
    {"usage", "--from T", "from time T (RFC 3339)"},
    {"usage", "--to T", "to time T"},
    {"usage", "--group-by K", "tenant, job or month"},
    {"usage", "--tenant ID", "admin: one tenant"},
};

void cli_command_help(const char *name, const char *usage, const char *help, FILE *f) {
    fprintf(f, "usage: loomctl %s\n  %s\n", usage, help);
    int any = 0;
    for (size_t i = 0; i < sizeof options / sizeof *options; i++) {
        if (strcmp(options[i].command, name)) continue;
        if (!any) fprintf(f, "options:\n");
        any = 1;
        fprintf(f, "  %-26s %s\n", options[i].option, options[i].help);
    }
    fprintf(f, "global options: --url URL ($LOOM_URL), --token TOKEN ($LOOM_TOKEN), --json, "
               "--version\n");
}
