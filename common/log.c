/* Logging to stderr, one line per message, safe from any thread. */
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *log_component = "loom";
static enum log_level log_min = LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_init(const char *component, enum log_level min_level) {
    log_component = component;
    log_min = min_level;
}

int log_level_parse(const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0) return i;
    return -1;
}

static void log_vline(const char *lvl, const char *file, int line, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s %s:%d: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            log_component, lvl, base, line, msg);
}

void log_msg(enum log_level lvl, const char *file, int line, const char *fmt, ...) {
    if (lvl < log_min) return;
    va_list ap;
    va_start(ap, fmt);
    log_vline(level_names[lvl], file, line, fmt, ap);
    va_end(ap);
}

void log_die(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vline("fatal", file, line, fmt, ap);
    va_end(ap);
    exit(1);
}
