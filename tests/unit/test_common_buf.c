/* common/buf: appends, printf growth across the doubling boundary, release
 * and reset, and typed-array growth. The expected bytes are built
 * independently with snprintf into fixed arrays. */
#include "common/buf.h"
#include "tests/check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void test_append(void) {
    struct buf b = BUF_INIT;
    CHECK(b.p == NULL && b.len == 0);
    CHECK_EQ_INT(buf_append(&b, "abc", 3), 0);
    CHECK_EQ_INT(buf_append_str(&b, "def"), 0);
    CHECK_EQ_INT(buf_append_ch(&b, '!'), 0);
    CHECK_EQ_INT(b.len, 7);
    CHECK_STR(b.p, "abcdef!");
    CHECK(b.cap > b.len);
    /* Bytes with NULs inside are kept; the buffer still ends with a NUL. */
    CHECK_EQ_INT(buf_append(&b, "x\0y", 3), 0);
    CHECK_EQ_INT(b.len, 10);
    CHECK(memcmp(b.p, "abcdef!x\0y", 11) == 0);
    buf_reset(&b);
    CHECK_EQ_INT(b.len, 0);
    CHECK_STR(b.p, "");
    buf_free(&b);
    CHECK(b.p == NULL && b.cap == 0);
    buf_free(NULL);
}

/* Many appends of every size 0..299: the content equals a reference built by hand. */
static void test_growth(void) {
    struct buf b = BUF_INIT;
    size_t total = 0;
    for (int i = 0; i < 300; i++)
        total += (size_t)i;
    unsigned char *ref = malloc(total + 1);
    size_t off = 0;
    for (int i = 0; i < 300; i++) {
        unsigned char chunk[300];
        for (int k = 0; k < i; k++)
            chunk[k] = (unsigned char)(i * 31 + k);
        memcpy(ref + off, chunk, (size_t)i);
        off += (size_t)i;
        if (buf_append(&b, chunk, (size_t)i) != 0) CHECK(!"append failed");
    }
    CHECK_EQ_INT(b.len, total);
    CHECK(b.p && memcmp(b.p, ref, total) == 0);
    CHECK(b.p && b.p[b.len] == '\0');
    /* Capacity doubles: far fewer than 300 distinct capacities, and a power-of-two multiple. */
    CHECK(b.cap >= total + 1 && b.cap < 2 * (total + 1) + 64);
    free(ref);
    buf_free(&b);
}

static const struct {
    int n;
    const char *s;
} printf_cases[] = {
    {42, "short"},
    {-7, "a string longer than the first capacity of sixty-four bytes, twice over, "
         "so that vsnprintf has to run a second time after the buffer grows"},
    {3, ""},
};

static void test_printf(void) {
    for (size_t i = 0; i < sizeof printf_cases / sizeof *printf_cases; i++) {
        struct buf b = BUF_INIT;
        char want[512];
        /* Prefix first, so a printf into a non-empty buffer is covered. */
        CHECK_EQ_INT(buf_append_str(&b, "pre-"), 0);
        int n = snprintf(want, sizeof want, "pre-%d|%s", printf_cases[i].n, printf_cases[i].s);
        CHECK(buf_printf(&b, "%d|%s", printf_cases[i].n, printf_cases[i].s) == 0, "case %zu", i);
        CHECK_EQ_INT(b.len, n);
        CHECK_STR(b.p, want);
        buf_free(&b);
    }
    /* Repeated printf appends exactly. */
    struct buf b = BUF_INIT;
    char want[4096] = "";
    size_t wl = 0;
    for (int i = 0; i < 200; i++) {
        CHECK_EQ_INT(buf_printf(&b, "%d,", i), 0);
        wl += (size_t)snprintf(want + wl, sizeof want - wl, "%d,", i);
    }
    CHECK_EQ_INT(b.len, wl);
    CHECK_STR(b.p, want);
    buf_free(&b);
}

static void test_release(void) {
    struct buf b = BUF_INIT;
    char *s = buf_release(&b);
    CHECK(s != NULL && s[0] == '\0');
    free(s);
    CHECK_EQ_INT(buf_printf(&b, "%s-%d", "job", 9), 0);
    s = buf_release(&b);
    CHECK_STR(s, "job-9");
    CHECK(b.p == NULL && b.len == 0 && b.cap == 0);
    free(s);
    /* Reserve does not change the length and leaves room. */
    CHECK_EQ_INT(buf_reserve(&b, 1000), 0);
    CHECK_EQ_INT(b.len, 0);
    CHECK(b.cap >= 1001);
    CHECK_STR(b.p, "");
    /* An impossible size fails and leaves the buffer as it was. */
    CHECK_EQ_INT(buf_append_str(&b, "kept"), 0);
    CHECK_EQ_INT(buf_reserve(&b, SIZE_MAX - 2), -1);
    CHECK_STR(b.p, "kept");
    buf_free(&b);
}

static void test_grow_array(void) {
    int *v = NULL;
    size_t cap = 0;
    for (size_t n = 0; n < 1000; n++) {
        if (buf_grow_array(&v, &cap, n + 1, sizeof *v, 16) != 0) {
            CHECK(!"grow failed");
            break;
        }
        CHECK(cap >= n + 1);
        v[n] = (int)(n * n);
    }
    CHECK_EQ_INT(cap, 1024); /* 16 doubled six times */
    long bad = 0;
    for (size_t n = 0; n < 1000; n++)
        bad += v[n] != (int)(n * n);
    CHECK_EQ_INT(bad, 0);
    size_t before = cap;
    CHECK_EQ_INT(buf_grow_array(&v, &cap, 10, sizeof *v, 16), 0);
    CHECK_EQ_INT(cap, before);
    CHECK_EQ_INT(buf_grow_array(&v, &cap, SIZE_MAX / 2, sizeof *v, 16), -1);
    CHECK_EQ_INT(cap, before);
    free(v);
}

int main(void) {
    test_append();
    test_growth();
    test_printf();
    test_release();
    test_grow_array();
    return check_summary("test_common_buf");
}
