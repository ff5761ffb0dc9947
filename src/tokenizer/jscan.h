/* jscan.h — a small, strict JSON scanner for the two big members of
 * tokenizer.json (model.vocab and model.merges).
 *
 * Why: building a jansson DOM for a 6 MB tokenizer.json (150k-entry object,
 * 280k-entry array) costs ~0.3 s of malloc/free. The loader instead locates
 * those two values in the raw text, hands jansson a copy of the document in
 * which they are replaced by {} and [], and reads the big values with this
 * scanner straight into the tokenizer's own tables.
 *
 * Strings are decoded fully (all escapes, surrogate pairs) and must be valid
 * UTF-8 without raw control characters or NUL, matching what jansson accepts.
 * The scanner never reads outside [s, s+n); errors carry the byte offset.
 */
#ifndef NS_JSCAN_H
#define NS_JSCAN_H

#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"
#include "util/status.h"

typedef struct ns_jscan {
    const char *s;
    size_t n, i;
} ns_jscan;

void ns_jscan_ws(ns_jscan *j);
/* Consumes character c (after whitespace); false if something else is there. */
bool ns_jscan_eat(ns_jscan *j, char c);
/* Decodes a string at the cursor into out (reset first). */
ns_status ns_jscan_string(ns_jscan *j, ns_buf *out);
/* Parses a number at the cursor. */
ns_status ns_jscan_number(ns_jscan *j, double *out);
/* Skips any JSON value at the cursor. */
ns_status ns_jscan_skip(ns_jscan *j);

/* Finds the value spans of "vocab" and "merges" inside the top-level "model"
 * object of doc. A span is [start, end) of the raw value text; start == end
 * when the member is absent. Returns false if the document is not shaped
 * like that (the caller then falls back to jansson for everything). */
bool ns_jscan_model_spans(const char *doc, size_t n, size_t vocab[2], size_t merges[2]);

#endif
