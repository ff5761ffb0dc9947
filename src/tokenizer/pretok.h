/* pretok.h — tokenizer.json "pre_tokenizer" components and the piece list
 * they operate on.
 *
 * Supported types: Sequence; Split (String/Regex pattern, behaviors Removed,
 * Isolated, MergedWithPrevious, MergedWithNext, Contiguous, and invert);
 * ByteLevel (add_prefix_space, use_regex with the GPT-2 regex, then every
 * byte mapped to its GPT-2 alphabet character); Metaspace (replacement,
 * prepend_scheme always/first/never or legacy add_prefix_space, split).
 * Other types are rejected at load time with NS_ERR_UNSUPPORTED.
 *
 * A piece remembers whether it starts at original offset 0 of the input
 * (`first`), which is what Metaspace's prepend_scheme "first" looks at.
 * Empty pieces are dropped, as Hugging Face drops empty splits.
 * A parsed pre-tokenizer is immutable and thread-safe.
 */
#ifndef NS_PRETOK_H
#define NS_PRETOK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/pattern.h"
#include "util/buf.h"
#include "util/status.h"

typedef struct ns_piece {
    size_t off, len; /* bytes [off, off+len) of the owning ns_pieces' text */
    bool first;
} ns_piece;

/* Owns its text and piece array; zero-initialize, ns_pieces_free to release. */
typedef struct ns_pieces {
    ns_buf text;
    ns_piece *v;
    size_t n, cap;
} ns_pieces;

void ns_pieces_reset(ns_pieces *p);
void ns_pieces_free(ns_pieces *p);
/* Appends a piece with a copy of s[0..n); empty input is ignored. */
ns_status ns_pieces_add(ns_pieces *p, const char *s, size_t n, bool first);

typedef struct ns_pretok ns_pretok;

/* Parses j (JSON null gives *out = NULL). *out is owned by the caller. */
ns_status ns_pretok_parse(const json_t *j, ns_pretok **out, ns_error *err);
void ns_pretok_free(ns_pretok *p);

/* Runs the pre-tokenizer over *io in place; tmp is caller-owned scratch
 * (both are ns_pieces the caller frees). */
ns_status ns_pretok_run(const ns_pretok *p, ns_rx_ctx *ctx, ns_pieces *io, ns_pieces *tmp, ns_error *err);

/* ---- incremental pre-tokenization (the bounded encode) ----
 *
 * ns_pretok_run cuts a whole text at once: its piece list is about 25
 * bytes per piece plus a copy of the text. For stopping early, the first
 * stage of the pre-tokenizer — a Split, or a ByteLevel with its regex —
 * can instead run as a generator over the caller's text, in place: each
 * call yields the next first-stage piece, and the caller runs the later
 * stages (ns_pretok_run_rest) on what it collected. Every stage after the
 * first works on each piece on its own, so the pieces are exactly those
 * of ns_pretok_run. The regex runs on the whole text (from the current
 * position), so lookarounds see what they would see in one run. */
typedef struct ns_pretok_iter {
    const ns_pretok *first; /* the stage run incrementally */
    const char *s;
    size_t n;
    bool first_flag; /* the text starts at original offset 0 */
    /* span generator (ns_pattern_spans, one span at a time) */
    size_t prev;
    bool have_match;
    size_t ma, mb;
    /* behavior transducer (split_spans, streaming) */
    bool have_pend, pend_match, prev_match;
    size_t ps, pe;
    bool done;
} ns_pretok_iter;

typedef enum {
    NS_PRETOK_REST_NONE,      /* no stage after the first */
    NS_PRETOK_REST_BYTELEVEL, /* one ByteLevel without regex: each byte becomes one character
                                 (plus, with add_prefix_space, maybe a leading space) */
    NS_PRETOK_REST_OTHER,
} ns_pretok_rest;

/* Starts an iterator over s[0..n) (valid UTF-8, borrowed). False when p's
 * first stage cannot run incrementally (a Metaspace; a ByteLevel without
 * regex, or one that would prepend a space to this text; no
 * pre-tokenizer): run ns_pretok_run on a copy then. *rest says what the
 * later stages are. */
bool ns_pretok_iter_init(ns_pretok_iter *it, const ns_pretok *p, const char *s, size_t n, bool first,
                         ns_pretok_rest *rest);
/* The next first-stage piece, as a byte range of the text and its `first`
 * flag; *found false at the end. */
ns_status ns_pretok_iter_next(ns_pretok_iter *it, ns_rx_ctx *ctx, size_t *start, size_t *end, bool *first,
                              bool *found, ns_error *err);
/* True when p is one Metaspace (no other stage); *repl is its replacement
 * character. It turns each ' ' into *repl, may prepend one, and drops
 * nothing: a lower bound summed over the text's characters (spaces as
 * *repl) holds for its pieces together, before any copy is made. */
bool ns_pretok_is_metaspace(const ns_pretok *p, uint32_t *repl);
/* Runs the stages after the first on io, in place (tmp: scratch). For a
 * first stage that is a ByteLevel, that includes its byte mapping. */
ns_status ns_pretok_run_rest(const ns_pretok *p, ns_rx_ctx *ctx, ns_pieces *io, ns_pieces *tmp, ns_error *err);

#endif
