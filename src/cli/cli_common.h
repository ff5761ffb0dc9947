/* cli_common.h — pieces shared by the CLI subcommands: parsing token
 * lists, and bringing up backend + model + engine from common flags.
 * Subcommands return an exit code; only main.c exits. */
#ifndef NS_CLI_COMMON_H
#define NS_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"

typedef struct ns_cli_engine_opts {
    const char *model_dir;      /* NULL = built-in demo model */
    const char *device;         /* "cpu" (default) or "cuda" */
    int threads;                /* 0 = all cores */
    int32_t page_tokens;        /* default 16 */
    int32_t max_batch_tokens;   /* default 512 */
    int32_t max_logits;         /* default 1 */
    int64_t kv_tokens;          /* pool capacity in tokens (--kv-tokens) */
    int64_t kv_pages;           /* ... or in pages (--kv-pages) */
    int64_t kv_memory;          /* ... or in bytes (--kv-memory, suffixes K/M/G) */
    double gpu_memory;          /* ... or --gpu-memory: bytes (> 1) or a fraction (<= 1)
                                 * of the device memory free after loading the weights */
                                /* none given: default_pool_contexts x the model's
                                 * context (CPU, capped at a quarter of RAM), or 90% of
                                 * the free device memory (CUDA) */
    int32_t default_pool_contexts; /* 1 for one-shot CLI commands; serve uses 4 so
                                    * several unbounded requests fit at once */
} ns_cli_engine_opts;

typedef struct ns_cli_engine {
    ns_backend *be;
    ns_model *model;
    ns_engine *engine;
} ns_cli_engine;

void ns_cli_engine_opts_default(ns_cli_engine_opts *o);
/* Handles one engine flag at argv[*i] (advancing *i past its value).
 * Returns 1 if consumed, 0 if not an engine flag, -1 on a bad value. */
int ns_cli_parse_engine_flag(ns_cli_engine_opts *o, int argc, char **argv, int *i);
ns_status ns_cli_engine_open(const ns_cli_engine_opts *o, ns_cli_engine *ce, ns_error *err);
void ns_cli_engine_close(ns_cli_engine *ce);

struct ns_tokenizer;
/* Opens the tokenizer of model_dir, or the demo model's when NULL. */
ns_status ns_cli_tokenizer_open(const char *model_dir, struct ns_tokenizer **out, ns_error *err);
/* A seed from the OS for requests that did not give one. */
uint64_t ns_cli_random_seed(void);

/* Parses "1,2,3" into a malloc'd array (caller frees). */
ns_status ns_cli_parse_tokens(const char *s, int32_t **out, int32_t *n_out, ns_error *err);
int ns_cli_default_threads(void);

#endif
