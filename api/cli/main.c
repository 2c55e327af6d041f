/* loomctl: the command-line client of loomd. Global options (--url, --token,
 * --json) may come before or after the command; LOOM_URL, LOOM_TOKEN and LOOM_CA
 * (--ca) are the defaults. Commands come from the table in commands.def. Exit codes:
 * 0 ok, 1 the server refused (its message printed), 2 usage error,
 * 3 loomd unreachable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/cli/cli.h"
#include "common/version.h"

struct command {
    const char *name;
    cli_fn fn;
    const char *usage;
    const char *help;
};

static const struct command commands[] = {
#define CLI_COMMAND(name, fn, usage, help) {name, fn, usage, help},
#include "api/cli/commands.def"
#undef CLI_COMMAND
};
#define NCOMMANDS (sizeof commands / sizeof *commands)

static void usage(FILE *f) {
    fprintf(f,
            "usage: loomctl [--url URL] [--token TOKEN] [--ca FILE] [--json] [--version] COMMAND "
            "[ARGS]\n"
            "  loomctl COMMAND --help: the command's options.\n"
            "  URL defaults to $LOOM_URL or http://127.0.0.1:8420, TOKEN to $LOOM_TOKEN, FILE (CA "
            "bundle for https URLs) to $LOOM_CA.\n"
            "commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-52s %s\n", commands[i].usage, commands[i].help);
}

int main(int argc, char **argv) {
    struct cli cli = {0};
    cli.url = getenv("LOOM_URL");
    cli.token = getenv("LOOM_TOKEN");
    /* Pull global options out of argv, keep the rest in order. */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            cli.json = 1;
        } else if (!strcmp(argv[i], "--ca") && i + 1 < argc) {
            setenv("LOOM_CA", argv[++i], 1); /* read by client_new (api/client.h) */
        } else if ((!strcmp(argv[i], "--url") || !strcmp(argv[i], "--token")) && i + 1 < argc) {
            if (argv[i][2] == 'u')
                cli.url = argv[++i];
            else
                cli.token = argv[++i];
        } else if (!strcmp(argv[i], "--version")) {
            printf("loomctl %s\n", LOOM_VERSION);
            free(rest);
            return 0;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            /* After a command name: that command's help. */
            const struct command *c = NULL;
            for (size_t k = 0; nrest > 0 && k < NCOMMANDS; k++)
                if (!strcmp(commands[k].name, rest[0])) c = &commands[k];
            if (c)
                cli_command_help(c->name, c->usage, c->help, stdout);
            else
                usage(stdout);
            free(rest);
            return 0;
        } else {
            rest[nrest++] = argv[i];
        }
    }
    if (!cli.url || !*cli.url) cli.url = "http://127.0.0.1:8420";
    if (nrest == 0) {
        usage(stderr);
        free(rest);
        return 2;
    }
    const struct command *cmd = NULL;
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(commands[i].name, rest[0])) cmd = &commands[i];
    if (!cmd) {
        fprintf(stderr, "loomctl: unknown command '%s'\n", rest[0]);
        usage(stderr);
        free(rest);
        return 2;
    }
    client_global_init();
    cli.c = client_new(cli.url, cli.token);
    int rc = cli.c ? cmd->fn(&cli, nrest, rest) : 3;
    client_free(cli.c);
    free(rest);
    return rc;
}
