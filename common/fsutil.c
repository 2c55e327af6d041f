/* File-system helpers (see fsutil.h). POSIX only; paths are bounded by
 * PATH_MAX (longer ones fail with ENAMETOOLONG). */
#include "common/fsutil.h"

#include "common/buf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* mkdir one level; with FS_SYNC_PARENTS, fsync the parent when it was created. */
static int mkdir_one(char *path, mode_t mode, int flags) {
    if (mkdir(path, mode) != 0) return errno == EEXIST ? 0 : -1;
    if (!(flags & FS_SYNC_PARENTS)) return 0;
    char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    *slash = '\0';
    fs_fsync_dir(path); /* best effort: the directory exists either way */
    *slash = '/';
    return 0;
}

int fs_mkdir_p(const char *path, mode_t mode, int flags) {
    char tmp[PATH_MAX];
    if (!path || !*path) {
        errno = ENOENT;
        return -1;
    }
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int rc = mkdir_one(tmp, mode, flags);
        *p = '/';
        if (rc != 0) return -1;
    }
    return mkdir_one(tmp, mode, flags);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int fs_write_atomic(const char *path, const void *data, size_t n, mode_t mode, int flags) {
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    int rc = write_all(fd, data, n);
    if (rc == 0 && !(flags & FS_NO_FSYNC)) rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlink(tmp);
        errno = e;
    }
    return rc;
}

char *fs_read_file(const char *path, size_t max, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    struct buf b = BUF_INIT;
    int err = 0;
    for (;;) {
        if (buf_reserve(&b, 64 * 1024) != 0) {
            err = ENOMEM;
            break;
        }
        size_t r = fread(b.p + b.len, 1, b.cap - b.len - 1, f);
        b.len += r;
        b.p[b.len] = '\0';
        if (max && b.len > max) {
            err = EFBIG;
            break;
        }
        if (r == 0) {
            if (ferror(f)) err = EIO;
            break;
        }
    }
    fclose(f);
    if (err) {
        buf_free(&b);
        errno = err;
        return NULL;
    }
    if (len) *len = b.len;
    return buf_release(&b);
}
