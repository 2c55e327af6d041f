/* common/token: hex tokens have the asked length and alphabet, differ from
 * call to call, and cover every digit; the comparisons answer like strcmp
 * / memcmp equality over a table of cases, including lengths and NULLs. */
#include "common/token.h"
#include "tests/check.h"

#include <string.h>

static void test_hex(void) {
    static const size_t sizes[] = {1, 6, 8, 16, 32, 64};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        char a[130], b[130];
        CHECK_EQ_INT(token_hex(a, sizeof a, sizes[i]), 0);
        CHECK_EQ_INT(token_hex(b, sizeof b, sizes[i]), 0);
        CHECK_EQ_INT(strlen(a), 2 * sizes[i]);
        CHECK(strspn(a, "0123456789abcdef") == 2 * sizes[i], "%s", a);
        /* Two 6-byte (or longer) draws collide with probability <= 2^-48. */
        if (sizes[i] >= 6) CHECK(strcmp(a, b) != 0, "%s twice", a);
    }
    /* Too small an output, or more than 64 bytes: error and "" */
    char small[8] = "junk";
    CHECK_EQ_INT(token_hex(small, sizeof small, 4), -1);
    CHECK_STR(small, "");
    char big[300];
    CHECK_EQ_INT(token_hex(big, sizeof big, 65), -1);
    /* 4000 draws of 16 bytes: every hex digit shows up at every position class. */
    int seen[16] = {0};
    for (int k = 0; k < 4000; k++) {
        char t[33];
        if (token_hex(t, sizeof t, 16) != 0) {
            CHECK(!"token_hex failed");
            break;
        }
        seen[t[k % 32] <= '9' ? t[k % 32] - '0' : t[k % 32] - 'a' + 10]++;
    }
    int missing = 0;
    for (int d = 0; d < 16; d++)
        missing += seen[d] == 0;
    CHECK_EQ_INT(missing, 0);
}

static void test_random(void) {
    unsigned char a[1000], z[1000];
    memset(z, 0, sizeof z);
    memset(a, 0, sizeof a);
    CHECK_EQ_INT(token_random(a, sizeof a), 0);
    CHECK(memcmp(a, z, sizeof a) != 0);
    int zeros = 0;
    for (size_t i = 0; i < sizeof a; i++)
        zeros += a[i] == 0;
    CHECK(zeros < 20, "%d zero bytes of 1000", zeros); /* expected ~4 */
    CHECK_EQ_INT(token_random(a, 0), 0);
}

static const struct {
    const char *a, *b;
    int equal;
} str_cases[] = {
    {"loom_abc", "loom_abc", 1},
    {"loom_abc", "loom_abd", 0},
    {"loom_abc", "loom_ab", 0},
    {"loom_ab", "loom_abc", 0},
    {"", "", 1},
    {"", "x", 0},
    {NULL, "x", 0},
    {"x", NULL, 0},
    {NULL, NULL, 0},
    {"Xoom_abc", "loom_abc", 0},
};

static void test_equal(void) {
    for (size_t i = 0; i < sizeof str_cases / sizeof *str_cases; i++)
        CHECK(token_equal(str_cases[i].a, str_cases[i].b) == str_cases[i].equal, "case %zu", i);
    unsigned char x[32], y[32];
    memset(x, 0xab, sizeof x);
    memcpy(y, x, sizeof y);
    CHECK_EQ_INT(token_equal_mem(x, y, sizeof x), 1);
    for (size_t i = 0; i < sizeof x; i++) {
        y[i] ^= 1;
        CHECK(token_equal_mem(x, y, sizeof x) == 0, "byte %zu", i);
        y[i] ^= 1;
    }
    CHECK_EQ_INT(token_equal_mem(x, y, 0), 1);
}

int main(void) {
    test_hex();
    test_random();
    test_equal();
    return check_summary("test_common_token");
}
