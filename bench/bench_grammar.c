/* bench_grammar.c — the cost of structured output's token masks on the
 * real Qwen3 vocabulary (151k tokens).
 *
 * Usage: build/bench/bench_grammar TOKENIZER_DIR [REPEATS]
 *   (TOKENIZER_DIR: e.g. tests/fixtures/models/tiny-qwen3; REPEATS default 7)
 *
 * A typical agent-style schema (nested object, bounded and unbounded
 * strings, integers with bounds, an enum, an array of objects, an optional
 * field) is compiled once per repeat. A fixed valid answer is tokenized
 * with the model's own tokenizer and replayed token by token: at every
 * step the mask of the next token is computed (ns_gmatch_fill_mask), then
 * the token is accepted. Reported (median over repeats, CPU time of this
 * single thread):
 *   - cold: a fresh grammar, every state met for the first time (the
 *     automaton and masks are built on the fly): ms per step, and the
 *     worst step;
 *   - warm: the same answer replayed on the same grammar (what a server
 *     sees once a schema has been used: every mask is a cached copy);
 *   - per-state cold cost of a few states (inside a string, after '{',
 *     inside a number, in an enum) as one full walk of the vocabulary trie.
 * Also: vocabulary build time and trie size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "grammar/gmatch.h"
#include "grammar/gschema.h"
#include "grammar/gvocab.h"
#include "grammar/gvocab_tok.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"description\":\"file to edit\"},"
    "\"mode\":{\"enum\":[\"replace\",\"insert\",\"delete\"]},"
    "\"line\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":100000},"
    "\"title\":{\"type\":\"string\",\"maxLength\":40},"
    "\"edits\":{\"type\":\"array\",\"maxItems\":8,\"items\":{\"type\":\"object\",\"properties\":{"
    "\"old\":{\"type\":\"string\"},\"new\":{\"type\":\"string\"},\"count\":{\"type\":\"integer\"}},"
    "\"required\":[\"old\",\"new\"],\"additionalProperties\":false}},"
    "\"dry_run\":{\"type\":\"boolean\"}},"
    "\"required\":[\"path\",\"mode\",\"edits\"],\"additionalProperties\":false}";

static const char *k_answer =
    "{\"path\": \"src/api/structured.c\", \"mode\": \"replace\", \"line\": 1234, "
    "\"title\": \"Fix the \\\"cache\\\" key\", \"edits\": [{\"old\": \"if (x == NULL) return;\\n\", "
    "\"new\": \"if (!x) {\\n    log_warn(\\\"missing x\\\");\\n    return;\\n}\\n\", \"count\": 2}, "
    "{\"old\": \"int n = 0;\", \"new\": \"size_t n = 0; // überall\"}], \"dry_run\": false}";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static ns_grammar *compile(const ns_gvocab *v) {
    json_t *j = json_loads(k_schema, 0, NULL);
    ns_gnfa n;
    ns_gnfa_init(&n);
    uint32_t r = ns_gnfa_rule(&n), e;
    n.root = r;
    char msg[512];
    ns_grammar *g = NULL;
    if (j && ns_gschema_emit(&n, j, ns_gnfa_ws(&n, r), &e, msg, sizeof msg)) {
        ns_gnfa_end(&n, ns_gnfa_ws(&n, e));
        ns_error err = {0};
        if (ns_grammar_new(&n, v, &g, &err) != NS_OK) fprintf(stderr, "grammar: %s\n", err.msg);
    } else {
        fprintf(stderr, "schema: %s\n", msg);
    }
    json_decref(j);
    ns_gnfa_free(&n);
    return g;
}

/* Replays ids through a matcher, timing each mask. Returns the total
 * seconds; *worst gets the slowest step. -1 on a failure. */
static double replay(ns_grammar *g, const int32_t *ids, size_t n, int32_t eos, double *worst) {
    ns_gmatch *m = NULL;
    ns_error err = {0};
    if (ns_gmatch_new(g, &m, &err) != NS_OK) return -1;
    double total = 0;
    *worst = 0;
    for (size_t i = 0; i <= n; i++) {
        double t0 = now();
        if (ns_gmatch_fill_mask(m, &err) != NS_OK) return -1;
        double dt = now() - t0;
        total += dt;
        if (dt > *worst) *worst = dt;
        int32_t t = i < n ? ids[i] : eos;
        const uint32_t *mask = ns_gmatch_mask(m);
        if (!((mask[t >> 5] >> (t & 31)) & 1u)) {
            fprintf(stderr, "token %zu (%d) is not in its mask\n", i, t);
            ns_gmatch_free(m);
            return -1;
        }
        if (ns_gmatch_accept(m, t, &err) != NS_OK) {
            fprintf(stderr, "token %zu: %s\n", i, err.msg);
            ns_gmatch_free(m);
            return -1;
        }
    }
    ns_gmatch_free(m);
    return total;
}

/* The cold mask of the state after prefix (fresh grammar), seconds. */
static double state_cost(const ns_gvocab *v, const char *prefix, int *n_allowed) {
    ns_grammar *g = compile(v);
    ns_gmatch *m = NULL;
    ns_error err = {0};
    double dt = -1;
    if (g && ns_gmatch_new(g, &m, &err) == NS_OK && ns_gmatch_accept_bytes(m, prefix, strlen(prefix))) {
        double t0 = now();
        if (ns_gmatch_fill_mask(m, &err) == NS_OK) dt = now() - t0;
        const uint32_t *mask = ns_gmatch_mask(m);
        *n_allowed = 0;
        for (uint32_t w = 0; mask && w < v->n_words; w++) *n_allowed += __builtin_popcount(mask[w]);
    }
    ns_gmatch_free(m);
    ns_grammar_release(g);
    return dt;
}

/* The sampler's cost on one masked row of the whole vocabulary (what a
 * constrained row adds on the host: the CUDA backend copies masked rows to
 * the host and samples there), greedy and at temperature 1, with the mask
 * of a string state (almost everything allowed) and of a structural state
 * (a handful allowed); and an unmasked temperature-1 row for reference. */
static void sampler_cost(const ns_gvocab *v, int reps) {
    const int32_t n = v->n_vocab;
    float *base = malloc((size_t)n * sizeof(float)), *row = malloc((size_t)n * sizeof(float));
    uint32_t x = 1;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        base[i] = (float)((x >> 8) % 20000) / 1000.0f - 10.0f; /* logits in [-10, 10) */
    }
    static const struct {
        const char *name, *prefix;
    } masks[] = {{"string state", "{\"path\": \"src/a"}, {"after '{'", "{"}};
    for (size_t k = 0; k < 3; k++) {
        ns_grammar *g = compile(v);
        ns_gmatch *m = NULL;
        ns_error err = {0};
        const uint32_t *mask = NULL;
        if (k < 2 && g && ns_gmatch_new(g, &m, &err) == NS_OK &&
            ns_gmatch_accept_bytes(m, masks[k].prefix, strlen(masks[k].prefix)) && ns_gmatch_fill_mask(m, &err) == NS_OK)
            mask = ns_gmatch_mask(m);
        for (int temp = 0; temp < 2; temp++) {
            if (k == 2 && temp == 0) continue;
            ns_sampling_params p = ns_sampling_default();
            p.temperature = temp ? 1.0f : 0.0f;
            ns_sampler s;
            ns_sampler_init(&s, &p, n, &err);
            s.allow = mask;
            double *c = calloc((size_t)reps * 5, sizeof(double));
            for (int r = 0; r < reps * 5; r++) {
                memcpy(row, base, (size_t)n * sizeof(float));
                double t0 = now();
                (void)ns_sampler_sample(&s, row);
                c[r] = now() - t0;
            }
            printf("  sample one row, %-14s %s: %7.3f ms\n", k < 2 ? masks[k].name : "no mask", temp ? "temperature 1" : "greedy       ",
                   median(c, reps * 5) * 1e3);
            free(c);
            ns_sampler_free(&s);
        }
        ns_gmatch_free(m);
        ns_grammar_release(g);
    }
    free(base);
    free(row);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TOKENIZER_DIR [REPEATS]\n", argv[0]);
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 1000) reps = 7;
    ns_tokenizer *tok = NULL;
    ns_error err = {0};
    if (ns_tokenizer_load(argv[1], &tok, &err) != NS_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    int32_t eos = ns_tokenizer_eos_id(tok);
    int32_t n_vocab = ns_tokenizer_n_vocab(tok);
    if (n_vocab < 151936 && ns_tokenizer_token_id(tok, "<|im_end|>") >= 0) n_vocab = 151936; /* Qwen3's padded head */
    ns_gvocab *v = NULL;
    double t0 = now();
    if (ns_gvocab_from_tokenizer(tok, n_vocab, &eos, 1, &v, &err) != NS_OK) {
        fprintf(stderr, "vocab: %s\n", err.msg);
        return 1;
    }
    printf("vocabulary: %d ids, %u trie nodes (max depth %u), built in %.1f ms\n", v->n_vocab, v->n_nodes,
           (unsigned)v->max_depth, (now() - t0) * 1e3);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (ns_tokenizer_encode(tok, k_answer, strlen(k_answer), false, &ids, &n_ids, &err) != NS_OK) {
        fprintf(stderr, "encode: %s\n", err.msg);
        return 1;
    }
    printf("answer: %zu bytes, %zu tokens (+ EOS)\n", strlen(k_answer), n_ids);
    double *cold = calloc((size_t)reps, sizeof(double)), *coldw = calloc((size_t)reps, sizeof(double)),
           *warm = calloc((size_t)reps, sizeof(double)), *warmw = calloc((size_t)reps, sizeof(double));
    for (int r = 0; r < reps; r++) {
        ns_grammar *g = compile(v);
        if (!g) return 1;
        double w;
        double c = replay(g, ids, n_ids, eos, &w);
        if (c < 0) return 1;
        cold[r] = c / (double)(n_ids + 1);
        coldw[r] = w;
        c = replay(g, ids, n_ids, eos, &w);
        if (c < 0) return 1;
        warm[r] = c / (double)(n_ids + 1);
        warmw[r] = w;
        ns_grammar_stats st;
        ns_grammar_get_stats(g, &st);
        if (r == 0)
            printf("automaton after both passes: %u stacks, %u states, %u masks, %.1f MB\n", st.stacks, st.sets,
                   st.masks, (double)st.bytes / 1e6);
        ns_grammar_release(g);
    }
    printf("cold (fresh grammar): %.3f ms/step median, worst step %.3f ms\n", median(cold, reps) * 1e3,
           median(coldw, reps) * 1e3);
    printf("warm (schema seen before): %.4f ms/step median, worst step %.4f ms\n", median(warm, reps) * 1e3,
           median(warmw, reps) * 1e3);
    static const struct {
        const char *name, *prefix;
    } states[] = {
        {"start (before '{')", ""},
        {"after '{' (a key or '}')", "{"},
        {"inside an unbounded string", "{\"path\": \"src/a"},
        {"inside a maxLength 40 string", "{\"path\": \"a\", \"mode\": \"insert\", \"title\": \"ab"},
        {"inside an integer 1..100000", "{\"path\": \"a\", \"mode\": \"insert\", \"line\": 12"},
        {"inside an enum", "{\"path\": \"a\", \"mode\": \"re"},
    };
    for (size_t s = 0; s < sizeof states / sizeof states[0]; s++) {
        double *c = calloc((size_t)reps, sizeof(double));
        int allowed = 0;
        for (int r = 0; r < reps; r++) c[r] = state_cost(v, states[s].prefix, &allowed);
        printf("  cold mask %-32s %8.3f ms  (%d tokens allowed)\n", states[s].name, median(c, reps) * 1e3, allowed);
        free(c);
    }
    sampler_cost(v, reps);
    free(cold);
    free(coldw);
    free(warm);
    free(warmw);
    free(ids);
    ns_gvocab_free(v);
    ns_tokenizer_free(tok);
    return 0;
}
