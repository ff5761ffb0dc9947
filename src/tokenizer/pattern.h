/* pattern.h — the "pattern" of tokenizer.json components: either a literal
 * string ({"String": "..."}) or a regular expression ({"Regex": "..."}).
 *
 * Regexes are compiled with PCRE2 (UTF + UCP, JIT when available). Hugging
 * Face tokenizers runs them with Oniguruma, whose \s is the Unicode
 * White_Space property; PCRE2's \s also matches U+180E, so the pattern is
 * rewritten to spell \s out as the White_Space set (\S outside classes too).
 *
 * A compiled ns_pattern is immutable and may be shared between threads; the
 * per-call matching state lives in ns_rx_ctx, which one thread owns.
 *
 * find_matches follows tokenizers' Pattern::find_matches: the input is cut
 * into consecutive spans, each flagged as match or not; empty matches are
 * skipped (the engine then advances one character).
 */
#ifndef NS_PATTERN_H
#define NS_PATTERN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

typedef struct ns_pattern ns_pattern;

/* Per-call scratch for regex matching; zero-initialize, then ns_rx_ctx_free. */
typedef struct ns_rx_ctx {
    void *md;    /* pcre2_match_data * */
    void *mctx;  /* pcre2_match_context * */
    void *stack; /* pcre2_jit_stack * */
} ns_rx_ctx;

void ns_rx_ctx_free(ns_rx_ctx *ctx);

typedef struct ns_span {
    size_t start, end;
    bool match;
} ns_span;

typedef struct ns_spans {
    ns_span *v;
    size_t n, cap;
} ns_spans;

void ns_spans_free(ns_spans *s);

/* Parses {"String": s} or {"Regex": r}; `what` names the field in errors.
 * *out is owned by the caller (ns_pattern_free). */
ns_status ns_pattern_parse(const json_t *j, const char *what, ns_pattern **out, ns_error *err);
/* Builds a literal pattern (owned by the caller). */
ns_status ns_pattern_literal(const char *s, size_t n, ns_pattern **out);
void ns_pattern_free(ns_pattern *p);
/* True when the pattern is a literal of exactly one character. */
bool ns_pattern_is_single_char(const ns_pattern *p);
/* The literal bytes of a String pattern (NULL for a regex). */
const char *ns_pattern_lit(const ns_pattern *p, size_t *len);

/* Finds the first non-empty match in s[from..n); s is valid UTF-8 and from a
 * character boundary. */
ns_status ns_pattern_find(const ns_pattern *p, ns_rx_ctx *ctx, const char *s, size_t n, size_t from, bool *found,
                          size_t *ms, size_t *me, ns_error *err);
/* Replaces out->n spans with the match/non-match partition of s[0..n). An
 * empty input gives no spans. */
ns_status ns_pattern_spans(const ns_pattern *p, ns_rx_ctx *ctx, const char *s, size_t n, ns_spans *out,
                           ns_error *err);

#endif
