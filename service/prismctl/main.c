/* prismctl: Prism's command line: REST commands against a prismd, and offline tools (replay). */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"jobs", prismctl_rest, "list a prismd's jobs (REST)"},
    {"blocks", prismctl_rest, "show a job's block map as a table (REST)"},
    {"config", prismctl_rest, "get or patch a job's policy config (REST)"},
    {"overrides", prismctl_rest, "set a job's force_bf16_blocks and force_int8_blocks (REST)"},
    {"delete", prismctl_rest, "delete a job with its state and files (REST, the admin token)"},
    {"plan", prismctl_plan, "plan per-device-class block precisions of a hybrid job (QSync model, offline)"},
    {"trace", prismctl_trace, "download a job's binary trace (REST) for replay"},
    {"replay", prismctl_replay, "run the policy over a recorded trace and print its telemetry JSONL"},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: prismctl [--server URL] [--token TOKEN] COMMAND [OPTIONS]\n\nCommands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`prismctl COMMAND --help` describes a command.\n");
}

int main(int argc, char **argv)
{
    /* --server and --token may come before the command too; they reach it as its defaults. */
    while (argc >= 3 && (strcmp(argv[1], "--server") == 0 || strcmp(argv[1], "--token") == 0)) {
        setenv(strcmp(argv[1], "--server") == 0 ? "PRISM_SERVER" : "PRISM_TOKEN", argv[2], 1);
        argv[2] = argv[0];
        argv += 2;
        argc -= 2;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("prismctl %s\n", PRISM_VERSION);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "prismctl: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
