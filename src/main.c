/* main.c — the nightshift command line: subcommand dispatch, --version,
 * and the only place in the program that exits. Each subcommand lives in
 * src/cli/, takes the options only (argv after "nightshift CMD", see
 * cli/cli_common.h) and returns its exit code: 0 ok, 1 runtime error,
 * 2 usage error. Every subcommand answers --help/-h on stdout. */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_bench.h"
#include "cli/cli_bench_engine.h"
#include "cli/cli_check_prompts.h"
#include "cli/cli_eval.h"
#include "cli/cli_generate.h"
#include "cli/cli_serve.h"
#include "cli/cli_replay.h"
#include "cli/cli_tokenize.h"
#include "util/log.h"
#include "version.h"

/* Signals. `serve` takes SIGINT/SIGTERM synchronously on its main thread
 * (sigtimedwait in cli_serve.c), so no other thread may ever have them
 * unblocked: the kernel hands a process-directed signal to any thread that
 * does not block it, and with no handler installed that thread takes the
 * default action (exit 143, no drain). Blocking them at the top of main is
 * too late: libopenblas (the pthread build) starts its worker threads in
 * its library constructor, before main runs, and they inherit the mask of
 * that moment; a constructor of our own runs too late as well (the
 * executable's constructors run after those of the libraries it needs,
 * whatever their priority). The executable's DT_PREINIT_ARRAY runs before
 * every library constructor, so the mask is set there, and every thread of
 * the process, OpenBLAS's included, starts with SIGINT and SIGTERM blocked.
 * main then gives the other subcommands (generate, eval, ...) the mask the
 * process was started with, on the main thread only: a signal is then
 * delivered to the main thread and takes its default action, as before.
 * (openblas_set_num_threads after masking does not help: it never ends the
 * threads already started.) */
static sigset_t g_startup_mask;
static bool g_startup_mask_saved;

static void block_stop_signals(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &s, &g_startup_mask) == 0) g_startup_mask_saved = true;
}
typedef void (*preinit_fn)(int, char **, char **);
__attribute__((section(".preinit_array"), used)) static preinit_fn ns_preinit_block_signals = block_stop_signals;

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *synopsis; /* one line of the top-level usage */
} command;

static const command commands[] = {
    {"serve", ns_cli_serve, "OpenAI-compatible HTTP server"},
    {"generate", ns_cli_generate, "run one prompt, stream the text (or ids) to stdout"},
    {"tokenize", ns_cli_tokenize, "stdin text -> token ids as JSON"},
    {"replay", ns_cli_replay, "re-send a recording (serve --record) to a server, measure TTFT and cache"},
    {"check-prompts", ns_cli_check_prompts, "find where a recording's turns broke the prompt prefix, and why"},
    {"eval", ns_cli_eval, "one forward pass over token ids -> logits summary as JSON"},
    {"bench-engine", ns_cli_bench_engine, "engine throughput against the measured roofline"},
    {"bench", ns_cli_bench, "compare OpenAI-compatible servers over HTTP: paired blocks, CIs, HTML report"},
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
    /* every command but serve: SIGINT/SIGTERM as the process was started
     * with (their default action) -- see block_stop_signals */
    if (g_startup_mask_saved && !(argc >= 2 && strcmp(argv[1], "serve") == 0))
        pthread_sigmask(SIG_SETMASK, &g_startup_mask, NULL);
    const char *lvl = getenv("NS_LOG_LEVEL");
    if (lvl && ns_log_parse_level(lvl) >= 0) ns_log_set_level((ns_log_level)ns_log_parse_level(lvl));
    exit(run_main(argc, argv));
}
