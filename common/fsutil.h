/* File-system helpers written once: mkdir -p, atomic whole-file write and
 * whole-file read. Thread-safe (no shared state); errors are -1 / NULL with
 * errno set, and the caller logs them where it knows what the file is for. */
#ifndef LOOM_COMMON_FSUTIL_H
#define LOOM_COMMON_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

enum {
    /* fs_mkdir_p: fsync the parent of every directory created, so the new
     * entries survive a power loss (checkpoint trees). */
    FS_SYNC_PARENTS = 1,
    /* fs_write_atomic: skip the fsync of the file (the rename stays atomic
     * against crashes of the process, not of the machine). */
    FS_NO_FSYNC = 2,
};

/* Creates path and every missing parent with `mode` (existing ones are
 * fine). flags: 0 or FS_SYNC_PARENTS. 0 or -1 (errno). */
int fs_mkdir_p(const char *path, mode_t mode, int flags);
/* fsyncs a directory (after a rename into it). 0 or -1 (errno). */
int fs_fsync_dir(const char *path);
/* Replaces path by data[0..n) atomically: writes "path.tmp" (created with
 * `mode`), fsyncs it (unless FS_NO_FSYNC), renames it over path. On failure
 * the temporary file is removed and path is untouched. 0 or -1 (errno). */
int fs_write_atomic(const char *path, const void *data, size_t n, mode_t mode, int flags);
/* Reads the whole file into a malloc'ed, NUL-terminated buffer (the caller
 * frees it); *len (may be NULL) gets its size. Files larger than max bytes
 * (0: no limit) fail with EFBIG. NULL on error (errno). */
char *fs_read_file(const char *path, size_t max, size_t *len);

#endif
