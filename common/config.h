/* Config tables: one table per program lists every setting with its name,
 * type, default, range and help. Values are filled, in increasing precedence,
 * from the defaults, a config file (`name = value` lines, `#` comments), the
 * environment (LOOM_<NAME> with '-' as '_', upper case) and command-line flags
 * (`--name value` or `--name=value`). `--help` prints the table's ordinary
 * rows; `--help-all` adds the tuning and debug rows (redis's DEBUG_CONFIG
 * idea: knobs for measurements and diagnosis, set like any other row, kept
 * out of the short help so that it lists what a user decides).
 *
 * Values land in a caller-owned struct through offsets, so programs keep one
 * context struct and no globals. Strings are heap copies owned by the struct;
 * config_free releases them. */
#ifndef LOOM_COMMON_CONFIG_H
#define LOOM_COMMON_CONFIG_H

#include <stddef.h>
#include <stdio.h>

/* A row's type, optionally OR-ed with one of the flags: CONFIG_TUNING (a
 * performance knob) or CONFIG_DEBUG (a diagnostic switch); both are hidden
 * from --help and listed by --help-all. The flags sit in the type so that
 * existing positional tables keep their seven fields. */
enum config_type {
    CONFIG_STR,
    CONFIG_INT,
    CONFIG_DOUBLE,
    CONFIG_BOOL,
    CONFIG_TYPE_MASK = 0xff,
    CONFIG_TUNING = 0x100,
    CONFIG_DEBUG = 0x200,
};

struct config_entry {
    const char *name; /* flag name without "--", e.g. "data-dir" */
    enum config_type type;
    size_t offset;   /* offsetof(struct, field): char*, long, double or int */
    const char *def; /* default as text (NULL: unset string) */
    double min, max; /* range for INT and DOUBLE (min > max: unbounded) */
    const char *help;
};

/* Fill `out` from defaults, file, env and argv. `positional` (may be NULL)
 * receives arguments that are not flags, up to *npositional; on return
 * *npositional holds the count. A `--config FILE` flag is honoured when the
 * table has an entry named "config". Returns 0, 1 when --help, --help-all or --version was
 * printed, or
 * -1 after printing a message that names the bad setting and value to stderr. */
int config_load(const struct config_entry *table, size_t n, void *out, const char *prog,
                const char *usage, int argc, char **argv, char **positional, int *npositional);
/* Print the table (name, type, default, range, help) to `f`: the ordinary
 * rows and a pointer to --help-all when there are hidden ones. */
void config_print_help(const struct config_entry *table, size_t n, const char *prog,
                       const char *usage, FILE *f);
/* The same with the tuning and debug rows too, each marked as such. */
void config_print_help_all(const struct config_entry *table, size_t n, const char *prog,
                           const char *usage, FILE *f);
/* Free the string values held in `out`. */
void config_free(const struct config_entry *table, size_t n, void *out);

#endif
