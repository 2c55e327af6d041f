/* Logging: one line per message to stderr with time, level and component.
 * Thread-safe (a single fprintf per line). The component name is set once at
 * start-up by main(); there is no other global state. */
#ifndef LOOM_COMMON_LOG_H
#define LOOM_COMMON_LOG_H

#include <stdarg.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Set the component name shown on every line (e.g. "loomd") and the lowest
 * level printed. Call once from main before threads start. */
void log_init(const char *component, enum log_level min_level);
/* Parse "debug|info|warn|error"; returns -1 on unknown names. */
int log_level_parse(const char *s);
void log_msg(enum log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_debug(...) log_msg(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Print "file:line: message" and exit(1). Only for start-up and worker device
 * code; never on a request path of loomd or the agent. */
void log_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define die(...) log_die(__FILE__, __LINE__, __VA_ARGS__)

#endif
