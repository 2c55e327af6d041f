/* Start-up memory check. See memcheck.h. */
#include "worker/memcheck.h"

#include <stdio.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

int memcheck_judge(const struct memcheck_in *in, char *msg, size_t len) {
    if (in->need <= 0 || in->free <= 0 || in->need <= in->free) return 0;
    char tot[48] = "";
    if (in->total > 0) snprintf(tot, sizeof tot, " of %.2f GiB", in->total / GIB);
    snprintf(msg, len,
             "%s: the planner estimates %.2f GiB for this rank%s%s%s but only %.2f GiB%s is "
             "free (%s); use more ranks with ZeRO, train.recompute, a smaller "
             "train.micro_batch, train.lora or a larger device (loomctl plan shows the "
             "options), or free the memory",
             in->what, in->need / GIB, in->detail ? " (" : "", in->detail ? in->detail : "",
             in->detail ? ")" : "", in->free / GIB, tot, in->source);
    return -1;
}

int memcheck_host(const char *path, double *avail, double *total) {
    FILE *f = fopen(path ? path : "/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    unsigned long long a = 0, t = 0, v;
    int have_a = 0, have_t = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
            a = v;
            have_a = 1;
        }
        if (sscanf(line, "MemTotal: %llu kB", &v) == 1) {
            t = v;
            have_t = 1;
        }
    }
    fclose(f);
    if (!have_a || !have_t) return -1;
    *avail = (double)a * 1024.0;
    *total = (double)t * 1024.0;
    return 0;
}
