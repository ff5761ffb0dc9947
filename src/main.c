/* main.c — the nightshift command line: subcommand dispatch, --version,
 * and the only place in the program that exits. Each subcommand lives in
 * src/cli/, takes the options only (argv after "nightshift CMD", see
 * cli/cli_common.h) and returns its exit code: 0 ok, 1 runtime error,
 * 2 usage error. Every subcommand answers --help/-h on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_bench_engine.h"
#include "cli/cli_eval.h"
#include "cli/cli_generate.h"
#include "cli/cli_serve.h"
#include "cli/cli_tokenize.h"
#include "util/log.h"
#include "version.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *synopsis; /* one line of the top-level usage */
} command;

static const command commands[] = {
    {"serve", ns_cli_serve, "OpenAI-compatible HTTP server"},
    {"generate", ns_cli_generate, "run one prompt, stream the text (or ids) to stdout"},
    {"tokenize", ns_cli_tokenize, "stdin text -> token ids as JSON"},
    {"eval", ns_cli_eval, "one forward pass over token ids -> logits summary as JSON"},
    {"bench-engine", ns_cli_bench_engine, "engine throughput against the measured roofline"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
    fprintf(f,
            "nightshift %s — a local LLM inference server for coding agents\n"
            "\n"
            "usage: nightshift <command> [options]\n"
            "       nightshift <command> --help     that command's options, with their defaults\n"
            "       nightshift --version            version, commit and backends of this build\n"
            "\n"
            "commands:\n",
            NS_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].synopsis);
    fprintf(f, "  %-13s %s\n", "version", "same as --version");
    fprintf(f, "  %-13s %s\n", "help [CMD]", "this text, or CMD --help");
    fprintf(f,
            "\n"
            "Without --model, serve/generate/eval use a small built-in demo model with RANDOM\n"
            "weights (its output is noise), so every path can be tried without a download:\n"
            "  nightshift generate --prompt \"Hello\" -n 32\n"
            "  nightshift serve --model DIR --port 8080\n");
}

static void version(void) {
#ifdef NS_HAVE_CUDA
    const char *backends = "cpu cuda";
#else
    const char *backends = "cpu (built without cuda)";
#endif
    printf("nightshift %s\n"
           "commit:   %s\n"
           "backends: %s\n",
           NS_VERSION, NS_GIT_COMMIT, backends);
}

static const command *find_command(const char *name) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static int run_main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        if (argc > 2) {
            fprintf(stderr, "nightshift: %s takes no arguments\n", cmd);
            return 2;
        }
        version();
        return 0;
    }
    if (strcmp(cmd, "help") == 0) {
        if (argc == 2) {
            usage(stdout);
            return 0;
        }
        const command *c = find_command(argv[2]);
        if (!c || argc > 3) {
            if (!c) fprintf(stderr, "nightshift help: unknown command \"%s\"\n", argv[2]);
            else fprintf(stderr, "nightshift help: give one command\n");
            usage(stderr);
            return 2;
        }
        char help[] = "--help";
        char *hargv[] = {help, NULL};
        return c->run(1, hargv);
    }
    const command *c = find_command(cmd);
    if (!c) {
        fprintf(stderr, "nightshift: unknown command \"%s\"\n", cmd);
        usage(stderr);
        return 2;
    }
    return c->run(argc - 2, argv + 2);
}

int main(int argc, char **argv) {
    const char *lvl = getenv("NS_LOG_LEVEL");
    if (lvl && ns_log_parse_level(lvl) >= 0) ns_log_set_level((ns_log_level)ns_log_parse_level(lvl));
    exit(run_main(argc, argv));
}
