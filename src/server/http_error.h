/* http_error.h — the one place where failures become HTTP error responses.
 *
 * Every error the server sends has the OpenAI shape
 *   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
 * (plus optional extra fields such as the numbers of a capacity refusal).
 * The HTTP status decides the type ("invalid_request_error" for 4xx,
 * "server_error" for 5xx, ...); ns_status codes map to a status in
 * ns_http_error_from_status, so handlers never pick numbers ad hoc.
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
/* Maps an internal failure: INVALID/FORMAT/RANGE/UNSUPPORTED -> 400,
 * FULL -> 503, CANCELLED -> 499-like 400, NOMEM/IO/INTERNAL -> 500. */
void ns_http_error_from_status(ns_http_error *e, ns_status st, const char *param, const char *msg);
/* "invalid_request_error", "authentication_error", ... for a status. */
const char *ns_http_error_type(int status);
/* Serializes e into a malloc'd JSON text ({"error": {...}}). */
char *ns_http_error_json(const ns_http_error *e, size_t *len);
void ns_http_error_clear(ns_http_error *e);

#endif
