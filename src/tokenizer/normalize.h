/* normalize.h — tokenizer.json "normalizer" components.
 *
 * Supported types: NFC, NFD, NFKC, NFKD (utf8proc), Sequence, Prepend,
 * Replace (String or Regex pattern), Lowercase (Rust char::to_lowercase,
 * i.e. full mappings, no final-sigma rule) and Strip (Unicode White_Space).
 * Anything else is rejected at load time with NS_ERR_UNSUPPORTED.
 *
 * Like Hugging Face tokenizers, the normalizer runs separately on each piece
 * of text left between added tokens; Prepend does nothing to empty input.
 * A parsed normalizer is immutable and thread-safe; scratch is per call.
 */
#ifndef NS_NORMALIZE_H
#define NS_NORMALIZE_H

#include <jansson.h>
#include <stddef.h>

#include "tokenizer/pattern.h"
#include "util/buf.h"
#include "util/status.h"

typedef struct ns_normalizer ns_normalizer;

/* Parses j (a JSON object; JSON null gives *out = NULL = no normalizer).
 * *out is owned by the caller (ns_normalizer_free). */
ns_status ns_normalizer_parse(const json_t *j, ns_normalizer **out, ns_error *err);
void ns_normalizer_free(ns_normalizer *n);

/* Normalizes s[0..len) (valid UTF-8) into out, which is reset first. */
ns_status ns_normalize(const ns_normalizer *n, ns_rx_ctx *ctx, const char *s, size_t len, ns_buf *out,
                       ns_error *err);

/* True when ns_normalize would return s[0..len) unchanged, decided
 * without a copy of the text (the bounded encode then reads the text in
 * place). Exact for NFC (piece by piece, like the NFC fast path), the
 * other Unicode forms on ASCII, Lowercase on text without upper case, and
 * Sequences of those; false — "normalize to find out" — otherwise. */
bool ns_normalize_is_identity(const ns_normalizer *n, const char *s, size_t len);

#endif
