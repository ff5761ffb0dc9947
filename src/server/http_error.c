/* http_error.c — OpenAI- and Anthropic-shaped error bodies (see http_error.h). */
#include "server/http_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ns_http_error_clear(ns_http_error *e) {
    json_decref(e->extra);
    memset(e, 0, sizeof *e);
}

void ns_http_error_set(ns_http_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    ns_http_error_clear(e);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void ns_http_error_from_status(ns_http_error *e, ns_status st, const char *param, const char *msg) {
    int status;
    const char *code;
    switch (st) {
    case NS_ERR_INVALID:
    case NS_ERR_FORMAT:
        status = 400, code = "invalid_value";
        break;
    case NS_ERR_RANGE:
        status = 400, code = "out_of_range";
        break;
    case NS_ERR_UNSUPPORTED:
        status = 400, code = "unsupported";
        break;
    case NS_ERR_FULL:
        status = 503, code = "overloaded";
        break;
    case NS_ERR_CANCELLED:
        status = 503, code = "cancelled";
        break;
    default:
        status = 500, code = "internal_error";
        break;
    }
    ns_http_error_set(e, status, param, code, "%s", msg && *msg ? msg : ns_status_name(st));
}

const char *ns_http_error_type(int status) {
    switch (status) {
    case 401:
        return "invalid_request_error"; /* as OpenAI: code says invalid_api_key */
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 429:
        return "rate_limit_error";
    default:
        if (status >= 500) return "server_error";
        return "invalid_request_error";
    }
}

/* Messages and params may quote client bytes: keep them valid UTF-8 for
 * JSON by replacing every non-ASCII byte when the text is not valid. */
static json_t *safe_string(const char *s) {
    json_t *j = json_string(s);
    if (j) return j;
    char tmp[1024];
    size_t i = 0;
    for (; s[i] && i + 1 < sizeof tmp; i++) tmp[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
    tmp[i] = 0;
    return json_string(tmp);
}

char *ns_http_error_json(const ns_http_error *e, size_t *len) {
    json_t *o = json_object();
    if (e->extra && json_is_object(e->extra)) json_object_update(o, e->extra);
    json_object_set_new(o, "message", safe_string(e->message));
    json_object_set_new(o, "type", json_string(ns_http_error_type(e->status)));
    json_object_set_new(o, "param", e->param[0] ? safe_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code[0] ? json_string(e->code) : json_null());
    json_t *root = json_pack("{s:o}", "error", o);
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) { /* json_string fails on invalid UTF-8 in a message we built */
        s = strdup("{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    }
    if (len && s) *len = strlen(s);
    return s;
}

ns_http_shape ns_http_error_shape_of(const char *path) {
    static const char k_messages[] = "/v1/messages";
    const size_t n = sizeof k_messages - 1;
    if (path && strncmp(path, k_messages, n) == 0 && (path[n] == 0 || path[n] == '/')) return NS_HTTP_SHAPE_ANTHROPIC;
    return NS_HTTP_SHAPE_OPENAI;
}

const char *ns_http_error_anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *ns_http_error_json_shaped(const ns_http_error *e, ns_http_shape shape, size_t *len) {
    if (shape != NS_HTTP_SHAPE_ANTHROPIC) return ns_http_error_json(e, len);
    json_t *root = json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type",
                             ns_http_error_anthropic_type(e->status), "message", safe_string(e->message));
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!s) s = strdup("{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"internal error\"}}");
    if (len && s) *len = strlen(s);
    return s;
}
