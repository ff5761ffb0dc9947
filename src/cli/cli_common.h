/* cli_common.h — pieces shared by the CLI subcommands: the argument
 * conventions, parsing token lists, and bringing up backend + model +
 * engine from common flags.
 *
 * Every subcommand entry point ns_cli_CMD(argc, argv) follows one
 * convention, so the CLI behaves the same everywhere:
 * - argv holds the options only: main.c strips "nightshift CMD", so
 *   argv[0] is the first option (a standalone driver passes argv + 1);
 * - --help / -h prints the usage to stdout and returns 0;
 * - an unknown flag, a missing or bad value prints one message naming the
 *   flag, then the usage, to stderr and returns 2;
 * - a runtime failure prints one message and returns 1.
 * Subcommands return the exit code; only main.c exits. */
#ifndef NS_CLI_COMMON_H
#define NS_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine.h"
#include "model/model.h"

typedef struct ns_cli_engine_opts {
    const char *model_dir;      /* NULL = built-in demo model */
    const char *dummy_config;   /* a config.json: random bf16 weights of that shape
                                 * (serve --dummy-weights); excludes model_dir */
    const char *device;         /* "cpu" (default) or "cuda" */
    int threads;                /* 0 = all cores */
    int32_t page_tokens;        /* 0 = per backend: NS_CLI_PAGE_TOKENS_CPU/_CUDA */
    int32_t max_batch_tokens;   /* 0 = per backend: NS_CLI_BATCH_TOKENS_CPU/_CUDA */
    int32_t max_logits;         /* default 1 */
    int64_t kv_tokens;          /* pool capacity in tokens (--kv-tokens) */
    int64_t kv_pages;           /* ... or in pages (--kv-pages) */
    int64_t kv_memory;          /* ... or in bytes (--kv-memory, suffixes K/M/G) */
    double gpu_memory;          /* ... or --gpu-memory: bytes (> 1) or a fraction (<= 1)
                                 * of the device memory free after loading the weights */
                                /* none given: default_pool_contexts x the model's
                                 * context (CPU, capped at a quarter of RAM), or 90% of
                                 * the free device memory (CUDA) */
    const char *kv_dtype;       /* --kv-dtype auto|bf16|f32|fp8; NULL = auto: f32 on the
                                 * CPU, bf16 on CUDA (ns_kv_dtype_choose, backend.h) */
    int32_t default_pool_contexts; /* 1 for one-shot CLI commands; serve uses 4 so
                                    * several unbounded requests fit at once */
} ns_cli_engine_opts;

/* Default engine step budget (--max-batch-tokens) per backend: a CUDA step
 * of 8k tokens costs little more per token than one of 512 (a cold 30k
 * prompt on an H200, Qwen3-8B shapes: 2.69 s vs 3.75 s), while on the CPU
 * a step is long enough already; the scheduler shrinks prefill chunks while
 * other streams decode either way. */
#define NS_CLI_BATCH_TOKENS_CPU 512
#define NS_CLI_BATCH_TOKENS_CUDA 8192

/* Default KV page size (--page-size) per backend. On CUDA the Hopper
 * prefill attention copies K/V by one TMA box per page and 64-dim half,
 * so 64-token pages take 8 boxes per 128-key tile where 16-token pages
 * take 32: a 100k-token prompt 8.23 -> 7.75 s, 32k prefill +3%, decode
 * unchanged (H200, Qwen3-8B shapes; docs/cuda.md v25). 64 is also the
 * largest page the tensor-core decode's TMA copy takes whole (64-key
 * tiles). The prefix cache copies partial pages, so reuse is not limited
 * to whole pages at either size. */
#define NS_CLI_PAGE_TOKENS_CPU 16
#define NS_CLI_PAGE_TOKENS_CUDA 64

typedef struct ns_cli_engine {
    ns_backend *be;
    ns_model *model;
    ns_engine *engine;
} ns_cli_engine;

typedef void (*ns_cli_usage_fn)(FILE *f);

/* True for "--help" and "-h". */
bool ns_cli_is_help(const char *arg);
/* "512M", "8G", "1.5GiB", "4096" -> bytes (K/M/G are powers of 1024);
 * 0 on success, -1 if s is not a positive size below 1e15. */
int ns_cli_parse_size(const char *s, double *out);
/* The value of the flag at argv[*i], advancing *i past it; NULL (and *i
 * unchanged) when the flag is the last argument. */
const char *ns_cli_flag_value(int argc, char **argv, int *i);
/* Prints "nightshift CMD: <message>" and then the usage to stderr;
 * returns 2, the usage-error exit code. */
int ns_cli_usage_error(const char *cmd, ns_cli_usage_fn usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void ns_cli_engine_opts_default(ns_cli_engine_opts *o);

/* The page size o stands for: page_tokens, or when 0 the default of
 * o->device (ns_cli_default_page_tokens). */
int32_t ns_cli_page_tokens(const ns_cli_engine_opts *o);
/* Inline: bench-engine (linked without the CLI objects) uses it too. */
static inline int32_t ns_cli_default_page_tokens(const char *device) {
    return device && strcmp(device, "cuda") == 0 ? NS_CLI_PAGE_TOKENS_CUDA : NS_CLI_PAGE_TOKENS_CPU;
}

/* The step budget o stands for: max_batch_tokens, or when 0 the default of
 * o->device. ns_cli_engine_open uses it; a caller that sizes something else
 * by it (the scheduler) resolves it first with o->max_batch_tokens = this. */
int32_t ns_cli_batch_tokens(const ns_cli_engine_opts *o);
/* Reads a config.json for --dummy-weights (the model's shape only). */
ns_status ns_cli_dummy_config(const char *path, ns_model_config *cfg, ns_error *err);
/* Handles one engine flag (--model, --device, --threads, --page-size,
 * --max-batch-tokens, the KV pool flags, --log-level) at argv[*i],
 * advancing *i past its value. Returns 1 if consumed, 0 if not an engine
 * flag, -1 on a missing or bad value (err says which). */
int ns_cli_parse_engine_flag(ns_cli_engine_opts *o, int argc, char **argv, int *i, ns_error *err);
/* Prints the engine flags with the defaults held in d (so the text cannot
 * drift from the code). */
void ns_cli_engine_usage(FILE *f, const ns_cli_engine_opts *d);
ns_status ns_cli_engine_open(const ns_cli_engine_opts *o, ns_cli_engine *ce, ns_error *err);
void ns_cli_engine_close(ns_cli_engine *ce);

struct ns_tokenizer;
/* Opens the tokenizer of model_dir, or the demo model's when NULL. */
ns_status ns_cli_tokenizer_open(const char *model_dir, struct ns_tokenizer **out, ns_error *err);
/* The tokenizer for an opened engine: model_dir's, else the demo byte-level
 * tokenizer widened to the model's vocabulary (with --dummy-weights every
 * id then has text, see ns_demo_tokenizer_json_n). */
ns_status ns_cli_engine_tokenizer(const ns_cli_engine_opts *o, const ns_cli_engine *ce, struct ns_tokenizer **out,
                                  ns_error *err);
/* A seed from the OS for requests that did not give one. */
uint64_t ns_cli_random_seed(void);

/* Parses "1,2,3" into a malloc'd array (caller frees). */
ns_status ns_cli_parse_tokens(const char *s, int32_t **out, int32_t *n_out, ns_error *err);
int ns_cli_default_threads(void);

#endif
