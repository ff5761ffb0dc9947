/* main.c — the nightshift command line: subcommand dispatch and the only
 * place in the program that exits. Each subcommand lives in src/cli/ and
 * returns its exit code (0 ok, 1 runtime error, 2 usage error). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_bench_engine.h"
#include "cli/cli_eval.h"
#include "cli/cli_generate.h"
#include "cli/cli_serve.h"
#include "cli/cli_tokenize.h"
#include "util/log.h"

static void usage(FILE *f) {
    fprintf(f,
            "nightshift — a local LLM inference server for coding agents\n"
            "\n"
            "usage: nightshift <command> [options]\n"
            "  serve     [--model DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY]   OpenAI-compatible server\n"
            "  generate  [--model DIR] (--prompt TEXT | --tokens 1,2,3) [-n N] [--temperature T] [--top-p P]\n"
            "            [--top-k K] [--min-p P] [--seed S] [--ids]        stream text, or ids as JSON\n"
            "  tokenize  --model DIR [--add-special] [--jsonl]       stdin text -> token ids (JSON)\n"
            "  eval      --model DIR --tokens 1,2,3 [--top K]        logits summary as JSON\n"
            "  bench-engine (--model DIR | --dummy-weights CONFIG) [--device cuda|cpu]   engine throughput vs roofline\n"
            "\n"
            "common options: --model DIR (omit for the built-in random-weight demo model),\n"
            "  --device cpu|cuda, --threads N, --page-size P, --max-batch-tokens N, --log-level L\n");
}

int main(int argc, char **argv) {
    const char *lvl = getenv("NS_LOG_LEVEL");
    if (lvl && ns_log_parse_level(lvl) >= 0) ns_log_set_level((ns_log_level)ns_log_parse_level(lvl));
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub_argv = argv + 2;
    int rc;
    if (strcmp(cmd, "eval") == 0) rc = ns_cli_eval(sub_argc, sub_argv);
    else if (strcmp(cmd, "generate") == 0) rc = ns_cli_generate(sub_argc, sub_argv);
    else if (strcmp(cmd, "tokenize") == 0) rc = ns_cli_tokenize(sub_argc, sub_argv);
    else if (strcmp(cmd, "serve") == 0) rc = ns_cli_serve(sub_argc, sub_argv);
    else if (strcmp(cmd, "bench-engine") == 0) rc = ns_cli_bench_engine(sub_argc, sub_argv);
    else {
        fprintf(stderr, "nightshift: unknown command \"%s\"\n", cmd);
        usage(stderr);
        rc = 2;
    }
    exit(rc);
}
