/* redact.h — `serve --record-redact`: a copy of a request body in which
 * every message text is replaced by its token count and a hash, so a
 * recording shows the shape of a workload (sizes, turns, roles, tools,
 * where prompts repeat) without its content.
 *
 * What is replaced: under the body's message-bearing fields ("messages",
 * "prompt", "system", "instructions", "input"), every string except the
 * values of structural keys (role, type, name, id, tool_call_id,
 * tool_use_id, call_id, status) becomes
 *     {"redacted_tokens": N, "chars": C, "xxh3": "<32 hex digits>"}
 * (N from the count callback: the model's tokenizer; C the UTF-8 bytes;
 * the hash is XXH3-128 of the bytes: equal texts have equal hashes, so a
 * repeated prefix is still visible). An array of token ids under "prompt"
 * becomes the same object (the ids are the text). Everything else (model,
 * sampling parameters, tool definitions, stop strings) is kept: these are
 * configuration, not conversation. XXH3 is not a cryptographic hash: a
 * short, guessable text (e.g. "yes") can be found by trying candidates.
 *
 * A redacted body cannot be replayed or re-rendered verbatim; the record
 * says "redacted": true so the tools can refuse it clearly.
 */
#ifndef NS_RECORD_REDACT_H
#define NS_RECORD_REDACT_H

#include <jansson.h>
#include <stddef.h>

/* Tokens in s[0..n): the caller's tokenizer; may return -1 when it cannot
 * tell (the field is then null). */
typedef long long (*ns_redact_count_fn)(void *ctx, const char *s, size_t n);

/* A new body (the caller owns it: json_decref) with the texts replaced;
 * body is not modified. NULL when out of memory. count may be NULL
 * (redacted_tokens is then null). */
json_t *ns_redact_body(const json_t *body, ns_redact_count_fn count, void *ctx);

/* True for the object ns_redact_body puts where a text was. */
int ns_redact_is_placeholder(const json_t *v);

#endif
