/* Unit tests of common/config: precedence (default < file < env < flag),
 * range and type errors, bool flags, positional arguments. */
#include "common/config.h"
#include "tests/check.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cfg {
    char *listen;
    long port;
    double price;
    int verbose;
    char *config;
};

static const struct config_entry table[] = {
    {"listen", CONFIG_STR, offsetof(struct cfg, listen), "127.0.0.1", 1, 0, "address"},
    {"port", CONFIG_INT, offsetof(struct cfg, port), "8420", 1, 65535, "port"},
    {"price", CONFIG_DOUBLE, offsetof(struct cfg, price), "2.5", 0, 1000, "price"},
    {"verbose", CONFIG_BOOL, offsetof(struct cfg, verbose), "false", 1, 0, "verbose"},
    {"config", CONFIG_STR, offsetof(struct cfg, config), NULL, 1, 0, "config file"},
};
#define N (sizeof table / sizeof *table)

static int load(struct cfg *c, int argc, char **argv, char **pos, int *npos) {
    memset(c, 0, sizeof *c);
    return config_load(table, N, c, "test", NULL, argc, argv, pos, npos);
}

int main(void) {
    struct cfg c;
    char *pos[4];
    int npos = 4;

    char *a1[] = {"t", NULL};
    CHECK(load(&c, 1, a1, pos, &npos) == 0);
    CHECK(strcmp(c.listen, "127.0.0.1") == 0 && c.port == 8420 && c.price == 2.5 && !c.verbose);
    config_free(table, N, &c);

    /* file < env < flag */
    const char *path = "test_config.tmp";
    FILE *f = fopen(path, "w");
    fprintf(f, "# comment\nport = 9000\nprice=3\nlisten = 0.0.0.0\n");
    fclose(f);
    setenv("LOOM_PORT", "9001", 1);
    char *a2[] = {"t", "--config", (char *)path, "--price=4.5", "--verbose", "job.json", NULL};
    npos = 4;
    CHECK(load(&c, 6, a2, pos, &npos) == 0);
    CHECK(c.port == 9001);                               /* env beats file */
    CHECK(c.price == 4.5);                               /* flag beats file */
    CHECK(strcmp(c.listen, "0.0.0.0") == 0);             /* file beats default */
    CHECK(c.verbose == 1);                               /* bare bool flag */
    CHECK(npos == 1 && strcmp(pos[0], "job.json") == 0); /* not eaten by --verbose */
    config_free(table, N, &c);
    unsetenv("LOOM_PORT");

    struct {
        int argc;
        char *argv[4];
    } bad[] = {
        {3, {"t", "--port", "70000"}}, /* out of range */
        {3, {"t", "--port", "12x"}},   /* not an integer */
        {2, {"t", "--nope=1"}},        /* unknown flag */
        {2, {"t", "--verbose=maybe"}}, /* not a bool */
        {2, {"t", "--port"}},          /* missing value */
        {3, {"t", "--price", "nan"}},  /* not finite */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        npos = 0;
        CHECK(load(&c, bad[i].argc, bad[i].argv, NULL, &npos) == -1);
        config_free(table, N, &c);
    }
    f = fopen(path, "w");
    fprintf(f, "bogus = 1\n");
    fclose(f);
    char *a3[] = {"t", "--config", (char *)path, NULL};
    npos = 0;
    CHECK(load(&c, 3, a3, NULL, &npos) == -1);
    config_free(table, N, &c);
    remove(path);

    return check_summary("test_config");
}
