#include "cli/cli_eval.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "engine/runner.h"
#include "sample/sample.h"

typedef struct {
    const int32_t *tokens;
    int32_t n_tokens, vocab, top_k;
    int32_t *argmax;
    double *next_lp;
    float *last;       /* copy of the last position's logits */
} eval_ctx;

static void on_logits(void *p, int32_t first, int32_t n_rows, const float *logits) {
    eval_ctx *x = p;
    for (int32_t r = 0; r < n_rows; r++) {
        const float *row = logits + (size_t)r * (size_t)x->vocab;
        int32_t pos = first + r, best = 0;
        for (int32_t i = 1; i < x->vocab; i++)
            if (row[i] > row[best]) best = i;
        x->argmax[pos] = best;
        if (pos + 1 < x->n_tokens) x->next_lp[pos] = row[x->tokens[pos + 1]] - ns_logsumexp(row, x->vocab);
        if (pos == x->n_tokens - 1) memcpy(x->last, row, (size_t)x->vocab * sizeof(float));
    }
}

#define EVAL_DEFAULT_TOP 10
/* One forward over the whole prompt: the engine needs a logits row per
 * position, so eval raises the batch defaults (see ns_cli_eval). */
#define EVAL_BATCH_TOKENS 128

static void eval_defaults(ns_cli_engine_opts *o) {
    ns_cli_engine_opts_default(o);
    o->max_logits = EVAL_BATCH_TOKENS;
    o->max_batch_tokens = EVAL_BATCH_TOKENS;
}

static void usage(FILE *f) {
    ns_cli_engine_opts d;
    eval_defaults(&d);
    fprintf(f,
            "usage: nightshift eval [--model DIR] --tokens 1,2,3 [options]\n"
            "  One forward pass over the given token ids; prints one JSON object: the argmax at\n"
            "  every position, the last position's top-K logits and logsumexp, and the\n"
            "  log-probability of each next prompt token. Example:\n"
            "    nightshift eval --model DIR --tokens 1,2,3 --top 5\n"
            "  --tokens 1,2,3           token ids (required)\n"
            "  --top K                  logits listed for the last position (default %d)\n",
            EVAL_DEFAULT_TOP);
    ns_cli_engine_usage(f, &d);
}

int ns_cli_eval(int argc, char **argv) {
    ns_cli_engine_opts o;
    eval_defaults(&o);
    const char *tokens_arg = NULL;
    long top_k = EVAL_DEFAULT_TOP;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (ns_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        ns_error ferr = {0};
        int r = ns_cli_parse_engine_flag(&o, argc, argv, &i, &ferr);
        if (r < 0) return ns_cli_usage_error("eval", usage, "%s", ferr.msg);
        if (r > 0) continue;
        if (strcmp(a, "--tokens") != 0 && strcmp(a, "--top") != 0)
            return ns_cli_usage_error("eval", usage, "unknown option %s", a);
        const char *v = ns_cli_flag_value(argc, argv, &i);
        if (!v) return ns_cli_usage_error("eval", usage, "%s needs a value", a);
        if (strcmp(a, "--tokens") == 0) {
            tokens_arg = v;
        } else {
            char *end;
            errno = 0;
            top_k = strtol(v, &end, 10);
            if (errno || end == v || *end || top_k < 1 || top_k > 100000)
                return ns_cli_usage_error("eval", usage, "--top must be an integer in [1, 100000], not \"%s\"", v);
        }
    }
    if (!tokens_arg) return ns_cli_usage_error("eval", usage, "--tokens is required");
    ns_error err = {0};
    int32_t *tokens = NULL, n = 0;
    if (ns_cli_parse_tokens(tokens_arg, &tokens, &n, &err) != NS_OK)
        return ns_cli_usage_error("eval", usage, "%s", err.msg);
    int rc = 1;
    ns_cli_engine ce;
    ns_runner run = {0};
    eval_ctx x = {0};
    if (ns_cli_engine_open(&o, &ce, &err) != NS_OK) {
        fprintf(stderr, "nightshift eval: %s\n", err.msg);
        free(tokens);
        return 1;
    }
    const int32_t V = ce.model->cfg.vocab_size;
    if (top_k > V) top_k = V;
    x.tokens = tokens;
    x.n_tokens = n;
    x.vocab = V;
    x.argmax = calloc((size_t)n, sizeof *x.argmax);
    x.next_lp = calloc((size_t)n, sizeof *x.next_lp);
    x.last = malloc((size_t)V * sizeof *x.last);
    int32_t *ids = malloc((size_t)top_k * sizeof *ids);
    float *lps = malloc((size_t)top_k * sizeof *lps);
    if (!x.argmax || !x.next_lp || !x.last || !ids || !lps) {
        fprintf(stderr, "nightshift eval: out of memory\n");
        goto done;
    }
    if (ns_runner_init(&run, ce.engine, &err) != NS_OK ||
        ns_runner_feed(&run, tokens, n, true, on_logits, &x, &err) != NS_OK) {
        fprintf(stderr, "nightshift eval: %s\n", err.msg);
        goto done;
    }
    double lse = ns_logsumexp(x.last, V);
    ns_top_logprobs(x.last, V, (int32_t)top_k, ids, lps);
    printf("{\"argmax\":[");
    for (int32_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", x.argmax[i]);
    printf("],\"top\":[");
    for (int32_t i = 0; i < top_k; i++) printf("%s[%d,%.6f]", i ? "," : "", ids[i], (double)x.last[ids[i]]);
    printf("],\"logsumexp\":%.6f,\"next_token_logprob\":[", lse);
    for (int32_t i = 0; i + 1 < n; i++) printf("%s%.6f", i ? "," : "", x.next_lp[i]);
    printf("]}\n");
    rc = 0;
done:
    free(ids);
    free(lps);
    free(x.argmax);
    free(x.next_lp);
    free(x.last);
    ns_runner_free(&run);
    ns_cli_engine_close(&ce);
    free(tokens);
    return rc;
}
