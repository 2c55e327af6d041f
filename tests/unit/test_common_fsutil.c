/* common/fsutil: mkdir -p (new, existing, through a file), atomic writes
 * (content, mode, replacement, no temporary left, failure leaves the old
 * file) and whole-file reads (empty, large, limit, missing). Checked with
 * stat/open/read of the files, not with fsutil itself. */
#include "common/fsutil.h"
#include "tests/check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static int is_dir(const char *p, mode_t *mode) {
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    if (mode) *mode = st.st_mode & 0777;
    return 1;
}

/* Reads a file with plain read(2); returns bytes read or -1. */
static long raw_read(const char *p, char *out, size_t cap) {
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -1;
    long n = read(fd, out, cap);
    close(fd);
    return n;
}

static void test_mkdir(void) {
    char p[512];
    static const struct {
        const char *rel;
        int flags;
    } cases[] = {{"a/b/c", 0}, {"a/b/c", 0}, {"a/b/d/", 0}, {"s/t/u", FS_SYNC_PARENTS}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(p, sizeof p, "%s/%s", root, cases[i].rel);
        CHECK(fs_mkdir_p(p, 0750, cases[i].flags) == 0, "%s", p);
        mode_t m = 0;
        CHECK(is_dir(p, &m), "%s", p);
        CHECK(m == 0750, "%s mode %o", p, (unsigned)m);
    }
    /* A file in the way is an error (ENOTDIR), not success. */
    snprintf(p, sizeof p, "%s/file", root);
    CHECK_EQ_INT(fs_write_atomic(p, "x", 1, 0644, 0), 0);
    snprintf(p, sizeof p, "%s/file/sub", root);
    errno = 0;
    CHECK_EQ_INT(fs_mkdir_p(p, 0755, 0), -1);
    CHECK_EQ_INT(errno, ENOTDIR);
    CHECK_EQ_INT(fs_mkdir_p("", 0755, 0), -1);
}

static void test_write(void) {
    char p[512], tmp[520], got[64];
    snprintf(p, sizeof p, "%s/w.txt", root);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK_EQ_INT(fs_write_atomic(p, "first\n", 6, 0600, 0), 0);
    long n = raw_read(p, got, sizeof got);
    CHECK(n == 6 && memcmp(got, "first\n", 6) == 0);
    struct stat st;
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(access(tmp, F_OK) != 0);
    /* Replacing with shorter content leaves nothing of the old bytes. */
    CHECK_EQ_INT(fs_write_atomic(p, "2", 1, 0600, FS_NO_FSYNC), 0);
    n = raw_read(p, got, sizeof got);
    CHECK(n == 1 && got[0] == '2');
    /* An empty write gives an empty file. */
    CHECK_EQ_INT(fs_write_atomic(p, "", 0, 0600, 0), 0);
    CHECK_EQ_INT(raw_read(p, got, sizeof got), 0);
    /* Into a missing directory: fails, errno says why. */
    snprintf(p, sizeof p, "%s/missing/w.txt", root);
    errno = 0;
    CHECK_EQ_INT(fs_write_atomic(p, "x", 1, 0600, 0), -1);
    CHECK_EQ_INT(errno, ENOENT);
    /* Renaming over a directory fails; the directory stays and no temporary is left. */
    snprintf(p, sizeof p, "%s/adir", root);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK_EQ_INT(fs_mkdir_p(p, 0755, 0), 0);
    CHECK_EQ_INT(fs_write_atomic(p, "x", 1, 0600, 0), -1);
    CHECK(is_dir(p, NULL));
    CHECK(access(tmp, F_OK) != 0);
}

static void test_read(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/r.bin", root);
    static const size_t sizes[] = {0, 1, 4095, 65535, 65536, 65537, 300000};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *data = malloc(n + 1);
        for (size_t k = 0; k < n; k++)
            data[k] = (unsigned char)(k * 7 + i);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && write(fd, data, n) == (ssize_t)n);
        if (fd >= 0) close(fd);
        size_t len = 12345;
        char *got = fs_read_file(p, 0, &len);
        CHECK(got != NULL, "size %zu", n);
        CHECK(len == n, "size %zu: read %zu", n, len);
        CHECK(got && memcmp(got, data, n) == 0 && got[n] == '\0', "size %zu", n);
        free(got);
        /* A limit below the size refuses the file; at the size it is accepted. */
        if (n > 1) {
            errno = 0;
            CHECK(fs_read_file(p, n - 1, NULL) == NULL && errno == EFBIG, "limit %zu", n - 1);
            got = fs_read_file(p, n, NULL);
            CHECK(got != NULL, "limit %zu", n);
            free(got);
        }
        free(data);
    }
    snprintf(p, sizeof p, "%s/none", root);
    errno = 0;
    CHECK(fs_read_file(p, 0, NULL) == NULL && errno == ENOENT);
}

static void rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/test_common_fsutil.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    umask(022);
    test_mkdir();
    test_write();
    test_read();
    rm_tree(root);
    return check_summary("test_common_fsutil");
}
