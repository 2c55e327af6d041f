/* Data staging: copy a job's data files (spec data.train / data.val, paths or
 * glob patterns) from a remote mount to a node-local cache before the worker
 * starts, so training reads local disk.
 *
 * Cache layout under DIR:
 *   blobs/SHA256      file contents, named by their SHA-256: shared across jobs
 *                     and paths by content; mtime = last use (for LRU)
 *   index/KEY         KEY = SHA-256 of "path\nsize\nmtime" of a source file; holds
 *                     the blob's SHA-256, so an unchanged source is not re-read
 *   views/JOB/train/NAME, views/JOB/val/NAME
 *                     symlinks with the source files' names to their blobs; the
 *                     spec is rewritten to the same pattern under the view, so
 *                     the worker expands it to the same files in the same order
 *   lock              flock: one stager at a time per node (ranks of one job
 *                     start together; the first copies, the others hit)
 * A copy is written to a temporary file while hashing the source, read back
 * and hashed again; only when both hashes (and sizes) agree is it renamed
 * into blobs/ (checksum verification). After staging, blobs not used by this
 * job are evicted oldest-use first until the cache is within max_bytes.
 *
 * Threads: none; one call per process (loom-stage). Errors leave the spec
 * untouched (the worker then reads the original paths). */
#ifndef LOOM_AGENT_STAGE_H
#define LOOM_AGENT_STAGE_H

#include <jansson.h>

struct stage_opts {
    const char *dir;     /* cache root (created if missing) */
    long long max_bytes; /* cache size limit; <= 0: no limit */
};

struct stage_report {
    int files;             /* source files staged (hits included) */
    int hits;              /* files already in the cache */
    long long bytes;       /* total size of the job's files */
    long long copied;      /* bytes copied this time */
    double seconds;        /* wall time of the staging */
    int evicted;           /* blobs evicted for space */
    long long cache_bytes; /* cache size after eviction */
};

/* Stages `spec`'s data files for `job` and rewrites data.train / data.val in
 * `spec` to the staged view. Returns 0, or -1 with a message in err (spec
 * unchanged). */
int stage_spec(const struct stage_opts *o, const char *job, json_t *spec, struct stage_report *r,
               char *err, size_t errlen);

/* Hex SHA-256 of a file (65 bytes with NUL); 0 or -1. Exposed for tests. */
int stage_file_sha256(const char *path, char out[65]);

#endif
