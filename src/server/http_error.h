/* http_error.h — the one place where failures get their HTTP error shape.
 *
 * Every error the server sends, as a response or as an error event of a
 * stream, has the OpenAI shape
 *   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
 * (plus optional extra fields such as the numbers of a capacity refusal),
 * rendered by ns_http_error_json. The "type" follows from the HTTP status
 * alone (ns_http_error_type): 401 -> invalid_request_error (as OpenAI; the
 * code says invalid_api_key), 403 -> permission_error, 404 ->
 * not_found_error, 429 -> rate_limit_error, other 4xx ->
 * invalid_request_error, 5xx -> server_error.
 *
 * Anthropic's endpoints (/v1/messages and the paths under it) answer in
 * Anthropic's shape instead,
 *   {"type": "error", "error": {"type": ..., "message": ...}}
 * with Anthropic's types (ns_http_error_anthropic_type). The shape follows
 * from the request path (ns_http_error_shape_of), so the errors the server
 * gives before any handler runs (401, 404, 405, 413, 415, ...) have the
 * endpoint's shape too: an Anthropic SDK reads their message and type
 * instead of failing to parse an OpenAI body.
 *
 * Who picks the status: code that rejects a request for a reason it knows
 * names the status, the offending param and a code itself with
 * ns_http_error_set (for example the server: 401, 403 for a foreign Host or
 * Origin, 404, 405, 413, 414, 415, 431, 503 once draining; handlers: 400 naming a bad field, 503 while the model loads,
 * 499 for a client that went away, 500 when out of memory). A failure that
 * arrives as an ns_status is mapped in one place,
 * ns_http_error_from_status.
 */
#ifndef NS_HTTP_ERROR_H
#define NS_HTTP_ERROR_H

#include <jansson.h>
#include <stddef.h>

#include "util/status.h"

typedef struct ns_http_error {
    int status;         /* HTTP status; 0 = no error */
    char param[96];     /* offending request field ("" = null) */
    char code[64];      /* machine-readable code ("" = null) */
    char message[1024];
    json_t *extra;      /* optional object merged into "error" (owned) */
} ns_http_error;

/* Sets e (any previous extra is released). The message is printf-style. */
void ns_http_error_set(ns_http_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Maps an ns_status failure: INVALID, FORMAT -> 400 invalid_value;
 * RANGE -> 400 out_of_range; UNSUPPORTED -> 400 unsupported; FULL -> 503
 * overloaded; CANCELLED -> 503 cancelled; anything else (NOMEM, IO,
 * INTERNAL) -> 500 internal_error. The message is msg, or the status name
 * when msg is NULL or empty. */
void ns_http_error_from_status(ns_http_error *e, ns_status st, const char *param, const char *msg);
/* The error "type" for an HTTP status (see above). */
const char *ns_http_error_type(int status);
/* Serializes e into a malloc'd JSON text ({"error": {...}}); message and
 * param that are not valid UTF-8 have their non-ASCII bytes replaced, and
 * a body that cannot be built becomes a fixed internal-error body. */
char *ns_http_error_json(const ns_http_error *e, size_t *len);
void ns_http_error_clear(ns_http_error *e);

typedef enum ns_http_shape {
    NS_HTTP_SHAPE_OPENAI = 0,
    NS_HTTP_SHAPE_ANTHROPIC,
} ns_http_shape;
/* The shape of the errors of path (without the query string):
 * ANTHROPIC for /v1/messages and every path under it, else OPENAI. NULL is
 * OPENAI. */
ns_http_shape ns_http_error_shape_of(const char *path);
/* Anthropic's error type for an HTTP status: 401 authentication_error,
 * 403 permission_error, 404 not_found_error, 413 request_too_large, 429
 * rate_limit_error, 503 overloaded_error, other 5xx api_error, other 4xx
 * invalid_request_error. */
const char *ns_http_error_anthropic_type(int status);
/* ns_http_error_json in the given shape (the caller frees the text; never
 * NULL but out of memory). The Anthropic shape has no param, code or
 * extra fields. */
char *ns_http_error_json_shaped(const ns_http_error *e, ns_http_shape shape, size_t *len);

#endif
