/* loomctl internals shared by the command files: the client context and
 * small output helpers. Each command group lives in its own cmd_*.c file and
 * is listed, one row per command, in api/cli/commands.def. */
#ifndef LOOM_CLI_CLI_H
#define LOOM_CLI_CLI_H

#include <jansson.h>
#include <stdio.h>

#include "api/client.h"

struct cli {
    struct client *c;
    const char *url;   /* LOOM_URL or --url, default http://127.0.0.1:8420 */
    const char *token; /* LOOM_TOKEN or --token */
    int json;          /* --json: print the server's JSON instead of tables */
};

/* A command: argv[0] is the command name; returns the process exit code. */
typedef int (*cli_fn)(struct cli *cli, int argc, char **argv);

/* Sends a request; on a transport error or an HTTP status >= 400 prints
 * "loomctl: STATUS CODE: message" to stderr and returns -1 (out is NULL).
 * Else returns 0 with *out the parsed reply (caller owns; may be NULL). */
int cli_call(struct cli *cli, const char *method, const char *path, json_t *body, json_t **out);
/* GET path for a command that prints a table unless --json: with --json the
 * reply is printed here (returns 1: the command is done); -1 after an error
 * (printed by cli_call); 0 with *out for the caller to print (caller frees). */
int cli_get(struct cli *cli, const char *path, json_t **out);
/* Prints `j` as indented JSON on stdout. */
void cli_print_json(json_t *j);
/* Reads a JSON file ("-" = stdin); prints the parse error and returns NULL. */
json_t *cli_read_json_file(const char *path);
/* String field or "-" for null/missing (for tables). */
const char *cli_str(json_t *obj, const char *key);
/* URL-encodes s into out (percent-encoding of everything but unreserved). */
void cli_urlencode(const char *s, char *out, size_t len);

/* Prints `loomctl NAME --help`: usage, help and the command's options. */
void cli_command_help(const char *name, const char *usage, const char *help, FILE *f);
/* Progress of a job from its step records: fills what it finds, returns 0.
 * The job object is the API's (borrowed); `metrics` may be NULL. */
struct cli_progress {
    long long step, total;
    double loss, val_loss, tokens_per_s; /* NaN when unknown */
    double elapsed_s, eta_s;             /* negative when unknown */
};
void cli_progress_of(json_t *job, json_t *metrics, struct cli_progress *p);

/* Blocks until job `id` ends (api/cli/cmd_wait.c): with `follow`, prints its
 * events and step records as they come. timeout_s <= 0: no limit. Returns
 * the exit code (enum loomctl_exit in api/exit_codes.h). */
int cli_job_wait(struct cli *cli, const char *id, int follow, double timeout_s);
/* The exit code a terminal event type means, or -1 for other types. */
int cli_outcome_of(const char *type);
/* Parses a --timeout value in seconds; 0 or -1 (message printed). */
int cli_parse_timeout(const char *v, double *out);

/* Prototypes of every command, from commands.def. */
#define CLI_COMMAND(name, fn, usage, help) int fn(struct cli *cli, int argc, char **argv);
#include "api/cli/commands.def"
#undef CLI_COMMAND

#endif
