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

#endif
