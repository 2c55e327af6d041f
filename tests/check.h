/* The assertion vocabulary of every C test (after libuv's test/task.h).
 * A failed check prints "file:line: CHECK(expr) failed[: message]" to stderr
 * and counts; the test goes on, so one run reports every failure. main()
 * ends with `return check_summary("test_name");`.
 *
 *   CHECK(cond)                      CHECK(cond, "fmt", args...)
 *   CHECK_EQ_INT(a, b)               integers, both values printed
 *   CHECK_NEAR(a, b, tol)            |a - b| <= tol, doubles
 *   CHECK_STR(a, b)                  strcmp equal (NULL equals nothing)
 *
 * check_failures is per translation unit (static), so a test that forks
 * reads it in the child to pick the child's exit code; such a test defines
 * CHECK_WITH_PID before the include to prefix each failure with the pid. */
#ifndef LOOM_TESTS_CHECK_H
#define LOOM_TESTS_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#ifdef CHECK_WITH_PID
#include <unistd.h>
#endif

static int check_failures;

__attribute__((format(printf, 4, 5), unused)) static void
check_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
#ifdef CHECK_WITH_PID
    fprintf(stderr, "[pid %d] ", (int)getpid());
#endif
    fprintf(stderr, "%s:%d: CHECK(%s) failed", file, line, expr);
    if (fmt[0]) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    check_failures++;
}

/* CHECK(cond) or CHECK(cond, fmt, ...): the message is pasted after "", so
 * the one-argument form passes an empty format (hence the pragma, for this
 * header's users only: tests). */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) check_fail(__FILE__, __LINE__, #cond, "" __VA_ARGS__);                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        if (check_a_ != check_b_)                                                                  \
            check_fail(__FILE__, __LINE__, #a " == " #b, "%lld != %lld", check_a_, check_b_);      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double check_a_ = (double)(a), check_b_ = (double)(b), check_t_ = (double)(tol);           \
        if (!(fabs(check_a_ - check_b_) <= check_t_))                                              \
            check_fail(__FILE__, __LINE__, #a " ~ " #b, "%.9g vs %.9g (tolerance %.3g)", check_a_, \
                       check_b_, check_t_);                                                        \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *check_a_ = (a), *check_b_ = (b);                                               \
        if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_) != 0)                             \
            check_fail(__FILE__, __LINE__, #a " == " #b, "\"%s\" != \"%s\"",                       \
                       check_a_ ? check_a_ : "(null)", check_b_ ? check_b_ : "(null)");            \
    } while (0)

/* Prints "name: ok" or "name: N failure(s)" and gives main's exit code. */
__attribute__((unused)) static int check_summary(const char *name) {
    if (check_failures)
        fprintf(stderr, "%s: %d failure(s)\n", name, check_failures);
    else
        fprintf(stderr, "%s: ok\n", name);
    return check_failures ? 1 : 0;
}

#endif
