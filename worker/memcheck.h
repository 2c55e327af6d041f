/* Start-up memory check (docs/planner.md "Start-up memory check"): before the
 * engine allocates anything, the worker compares the planner's estimate for
 * its own layout with the memory the device really has free (cuda:
 * cudaMemGetInfo after the context exists; cpu: the node's MemAvailable) and
 * fails at once with OUT_OF_MEMORY naming both numbers, instead of dying
 * part-way through the allocation or in the first step. */
#ifndef LOOM_WORKER_MEMCHECK_H
#define LOOM_WORKER_MEMCHECK_H

#include <stddef.h>

struct memcheck_in {
    const char *what;   /* "device 0 (cuda)", "host (cpu device)", "host (optimizer offload)" */
    const char *source; /* where free came from: "cudaMemGetInfo", "MemAvailable" */
    double need;        /* bytes the planner expects this rank to allocate there */
    double free;        /* bytes free now */
    double total;       /* the memory's size (0: unknown) */
    const char *detail; /* the estimate's split, shown in the message (may be NULL) */
};

/* 0 when need <= free (or either is unknown, <= 0); else -1 with a message
 * naming both numbers (GiB), the source and the advice into msg. Pure. */
int memcheck_judge(const struct memcheck_in *in, char *msg, size_t len);

/* MemAvailable and MemTotal of /proc/meminfo (or the file `path`, for tests)
 * in bytes. Returns 0, or -1 when they cannot be read. */
int memcheck_host(const char *path, double *avail, double *total);

#endif
