/* The worker's start-up memory check (worker/memcheck.c): the verdict table
 * (need against free, unknown numbers never refuse) and /proc/meminfo parsing
 * from recorded files. */
#include "worker/memcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define G (1024.0 * 1024.0 * 1024.0)

int main(void) {
    static const struct {
        const char *name;
        double need, free, total;
        int want;            /* 0 fits, -1 refused */
        const char *frag[3]; /* in the message when refused */
    } t[] = {
        {"44 GiB plan on a 24 GiB node",
         44 * G,
         23.5 * G,
         24 * G,
         -1,
         {"planner estimates 44.00 GiB", "only 23.50 GiB of 24.00 GiB is free", "MemAvailable"}},
        {"fits exactly", 8 * G, 8 * G, 16 * G, 0, {NULL}},
        {"fits with room", 1 * G, 70 * G, 80 * G, 0, {NULL}},
        {"free unknown: not refused", 100 * G, 0, 0, 0, {NULL}},
        {"no estimate: not refused", 0, 1 * G, 2 * G, 0, {NULL}},
        {"total unknown: message without it", 3 * G, 2 * G, 0, -1, {"only 2.00 GiB is free"}},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct memcheck_in in = {"host (cpu device)", "MemAvailable", t[i].need,
                                 t[i].free,           t[i].total,     "params 1.00 GiB"};
        char msg[1024] = "";
        int rc = memcheck_judge(&in, msg, sizeof msg);
        CHECK(rc == t[i].want, "[%s] rc %d, want %d", t[i].name, rc, t[i].want);
        for (int k = 0; k < 3 && t[i].frag[k]; k++)
            CHECK(strstr(msg, t[i].frag[k]) != NULL, "[%s] message lacks '%s': %s", t[i].name,
                  t[i].frag[k], msg);
        if (rc == 0) CHECK(msg[0] == 0, "[%s] a fit writes no message", t[i].name);
    }

    /* recorded /proc/meminfo heads */
    static const struct {
        const char *text;
        int rc;
        double avail, total;
    } m[] = {
        {"MemTotal:       24683148 kB\nMemFree:         1175240 kB\nMemAvailable:   "
         "23855036 kB\nBuffers:          336408 kB\n",
         0, 23855036.0 * 1024, 24683148.0 * 1024},
        {"MemTotal:       1056742144 kB\nMemFree:        98765432 kB\n", -1, 0, 0},
        {"", -1, 0, 0},
    };
    char path[] = "/tmp/test_memcheck_XXXXXX";
    for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
        int fd = mkstemp(path);
        CHECK(fd >= 0, "mkstemp");
        FILE *f = fdopen(fd, "w");
        fputs(m[i].text, f);
        fclose(f);
        double a = -1, tot = -1;
        int rc = memcheck_host(path, &a, &tot);
        CHECK(rc == m[i].rc, "meminfo %zu: rc %d, want %d", i, rc, m[i].rc);
        if (rc == 0)
            CHECK(a == m[i].avail && tot == m[i].total, "meminfo %zu: %.0f/%.0f", i, a, tot);
        remove(path);
        strcpy(path, "/tmp/test_memcheck_XXXXXX");
    }
    CHECK(memcheck_host("/nonexistent/meminfo", &(double){0}, &(double){0}) == -1, "missing file");
    if (failures) {
        fprintf(stderr, "test_memcheck: %d failures\n", failures);
        return 1;
    }
    printf("test_memcheck: ok\n");
    return 0;
}
