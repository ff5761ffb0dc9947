/* api.c — route table and helpers shared by the endpoints (see api.h). */
#include "api/api.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "api/messages.h"
#include "api/responses.h"
#include "util/utf8.h"

/* The POST endpoints run inside the body budget (ns_api_body_admit):
 * parsing, rendering and tokenizing cost memory in proportion to the body,
 * so the bytes of bodies being handled at once are capped. */
static void budgeted(ns_http_handler fn, void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_body_admit(a, req->body_len, resp)) return;
    fn(ud, req, resp);
    ns_api_body_release(a, req->body_len);
}
#define BUDGETED(name, fn) \
    static void name(void *ud, const ns_http_request *req, ns_http_response *resp) { budgeted(fn, ud, req, resp); }
BUDGETED(b_chat_completions, ns_api_chat_completions)
BUDGETED(b_completions, ns_api_completions)
BUDGETED(b_tokenize, ns_api_tokenize)
BUDGETED(b_detokenize, ns_api_detokenize)
BUDGETED(b_apply_template, ns_api_apply_template)
BUDGETED(b_responses, ns_api_responses)
/* (the Anthropic endpoints' errors, the body budget's 503 included, get
 * Anthropic's shape from the server, by path: http_error.h) */
BUDGETED(b_messages, ns_api_messages)
BUDGETED(b_count_tokens, ns_api_messages_count_tokens)

static const ns_http_route g_routes[] = {
    {"POST", "/v1/chat/completions", b_chat_completions, false, false},
    {"POST", "/chat/completions", b_chat_completions, false, false},
    {"POST", "/v1/completions", b_completions, false, false},
    {"POST", "/completions", b_completions, false, false},
    {"POST", "/v1/messages", b_messages, false, false},
    {"POST", "/v1/responses", b_responses, false, false},
    {"POST", "/responses", b_responses, false, false},
    {"POST", "/v1/messages/count_tokens", b_count_tokens, false, false},
    {"GET", "/v1/models", ns_api_models, false, false},
    {"GET", "/models", ns_api_models, false, false},
    {"GET", "/v1/models/*", ns_api_model_get, false, false},
    {"GET", "/models/*", ns_api_model_get, false, false},
    {"GET", "/v1/capacity", ns_api_capacity, false, false},
    {"GET", "/v1/status", ns_api_status, false, false},
    {"GET", "/dashboard", ns_api_dashboard, true, false}, /* static page, no data: see dashboard.c */
    {"GET", "/health", ns_api_health, true, false},
    {"GET", "/v1/health", ns_api_health, true, false},
    {"POST", "/tokenize", b_tokenize, false, false},
    {"POST", "/detokenize", b_detokenize, false, false},
    {"POST", "/apply-template", b_apply_template, false, false},
    {"GET", "/metrics", ns_api_metrics, false, false},
    {"POST", "/admin/flush", ns_api_admin_flush, false, true},
    {"GET", "/admin/cache", ns_api_admin_cache, false, true},
};

const ns_http_route *ns_api_routes(int *n) {
    *n = (int)(sizeof g_routes / sizeof g_routes[0]);
    return g_routes;
}

void ns_api_init(ns_api *a, const char *model_name) {
    memset(a, 0, sizeof *a);
    snprintf(a->model_name, sizeof a->model_name, "%s", model_name && *model_name ? model_name : "nightshift");
    a->created = time(NULL);
    a->max_json_depth = 128;
    a->body_budget = NS_API_BODY_BUDGET;
    atomic_init(&a->body_inflight, 0);
    atomic_init(&a->state, NS_API_LOADING);
}

bool ns_api_body_admit(ns_api *a, size_t bytes, ns_http_response *r) {
    size_t cur = atomic_load(&a->body_inflight);
    do {
        /* one body alone is always admitted (the server's max_body_bytes
         * caps it), so a budget below max_body_bytes never starves one */
        if (cur > 0 && (bytes > a->body_budget || cur > a->body_budget - bytes)) {
            ns_http_error_set(&r->err, 503, NULL, "server_busy",
                              "the server is busy with other large requests (%zu MiB of request bodies in progress); "
                              "retry shortly",
                              cur >> 20);
            r->retry_after_s = 1;
            return false;
        }
    } while (!atomic_compare_exchange_weak(&a->body_inflight, &cur, cur + bytes));
    return true;
}

void ns_api_body_release(ns_api *a, size_t bytes) { atomic_fetch_sub(&a->body_inflight, bytes); }

bool ns_api_require_ready(ns_api *a, ns_http_response *r) {
    int st = atomic_load(&a->state);
    if (st == NS_API_READY) return true;
    if (st == NS_API_LOADING) {
        ns_http_error_set(&r->err, 503, NULL, "model_loading", "the model is still loading; retry shortly");
        r->retry_after_s = 1;
    } else if (st == NS_API_DRAINING) {
        ns_http_error_set(&r->err, 503, NULL, "shutting_down", "the server is shutting down");
    } else {
        ns_http_error_set(&r->err, 503, NULL, "model_unavailable", "the model failed to load");
    }
    return false;
}

/* Maximum nesting of objects/arrays, scanning outside strings. Stops
 * early (returning cap + 1) once the cap is exceeded. */
static size_t json_depth(const char *s, size_t n, size_t cap) {
    size_t d = 0, maxd = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{' || c == '[') {
            if (++d > maxd) maxd = d;
            if (maxd > cap) return maxd;
        } else if ((c == '}' || c == ']') && d > 0) d--;
    }
    return maxd;
}

/* jansson's error text without the body bytes it quotes ("... near
 * '<token>'"): request bodies may hold secrets, and the message is both
 * sent back and logged. What is left is printable ASCII. */
static void json_error_reason(const json_error_t *je, char *out, size_t cap) {
    size_t n = 0;
    const char *near = strstr(je->text, " near ");
    size_t len = near ? (size_t)(near - je->text) : strlen(je->text);
    for (size_t i = 0; i < len && n + 1 < cap; i++) {
        unsigned char c = (unsigned char)je->text[i];
        out[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    out[n] = 0;
    if (!n) snprintf(out, cap, "syntax error");
}

json_t *ns_api_parse_body(ns_api *a, const ns_http_request *req, ns_http_response *r) {
    size_t bad = 0;
    if (req->body_len == 0) {
        ns_http_error_set(&r->err, 400, NULL, "invalid_json", "the request body is empty; expected a JSON object");
        return NULL;
    }
    if (!ns_utf8_valid(req->body, req->body_len, &bad)) {
        ns_http_error_set(&r->err, 400, NULL, "invalid_utf8", "the request body is not valid UTF-8 (byte offset %zu)",
                          bad);
        return NULL;
    }
    if (json_depth(req->body, req->body_len, a->max_json_depth) > a->max_json_depth) {
        ns_http_error_set(&r->err, 400, NULL, "json_too_deep", "the request JSON nests deeper than %zu levels",
                          a->max_json_depth);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(req->body, req->body_len, 0, &je);
    if (!root) {
        char why[sizeof je.text];
        json_error_reason(&je, why, sizeof why);
        ns_http_error_set(&r->err, 400, NULL, "invalid_json",
                          "invalid JSON in the request body: %s at line %d, column %d (byte offset %zu)", why, je.line,
                          je.column, (size_t)je.position);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        ns_http_error_set(&r->err, 400, NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static void type_error(ns_http_error *e, const char *key, const char *want, const json_t *v) {
    ns_http_error_set(e, 400, key, "invalid_type", "'%s' must be %s, not %s", key, want, type_name(v));
}

bool ns_api_get_bool(json_t *o, const char *key, bool *out, ns_http_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        type_error(e, key, "a boolean", v);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

bool ns_api_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, ns_http_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        type_error(e, key, "an integer", v);
        return false;
    }
    if (x < lo || x > hi) {
        ns_http_error_set(e, 400, key, "invalid_value", "'%s' must be between %lld and %lld (got %lld)", key,
                          (long long)lo, (long long)hi, (long long)x);
        return false;
    }
    *out = x;
    return true;
}

bool ns_api_get_num(json_t *o, const char *key, double lo, double hi, double *out, ns_http_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        type_error(e, key, "a number", v);
        return false;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        ns_http_error_set(e, 400, key, "invalid_value", "'%s' must be between %g and %g (got %g)", key, lo, hi, x);
        return false;
    }
    *out = x;
    return true;
}

const char *ns_api_unknown_key(json_t *o, const char *const *known, size_t n) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        size_t i = 0;
        while (i < n && strcmp(k, known[i]) != 0) i++;
        if (i == n) return k;
    }
    return NULL;
}

bool ns_api_get_str(json_t *o, const char *key, const char **out, ns_http_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        type_error(e, key, "a string", v);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

static bool parse_stop(json_t *body, ns_api_gen_params *p, ns_http_error *e) {
    json_t *v = json_object_get(body, "stop");
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (json_string_length(v) > NS_STOP_MAX_LEN || strlen(json_string_value(v)) != json_string_length(v)) {
            ns_http_error_set(e, 400, "stop", "invalid_value", "stop strings are limited to %d bytes", NS_STOP_MAX_LEN);
            return false;
        }
        p->stops[p->n_stops++] = json_string_value(v);
        return true;
    }
    if (!json_is_array(v)) {
        type_error(e, "stop", "a string or an array of strings", v);
        return false;
    }
    if (json_array_size(v) > NS_STOP_MAX) {
        ns_http_error_set(e, 400, "stop", "invalid_value", "at most %d stop strings are allowed", NS_STOP_MAX);
        return false;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) {
            ns_http_error_set(e, 400, "stop", "invalid_type", "'stop[%zu]' must be a string", i);
            return false;
        }
        if (json_string_length(s) > NS_STOP_MAX_LEN || strlen(json_string_value(s)) != json_string_length(s)) {
            ns_http_error_set(e, 400, "stop", "invalid_value", "stop strings are limited to %d bytes", NS_STOP_MAX_LEN);
            return false;
        }
        p->stops[p->n_stops++] = json_string_value(s);
    }
    return true;
}

/* logprobs: chat's boolean with top_logprobs, or completions' integer
 * (the number of alternatives; a boolean is accepted too). */
static bool parse_logprobs(json_t *body, bool chat, ns_api_gen_params *p, ns_http_error *e) {
    if (chat) {
        bool lp = false;
        int64_t top = 0;
        if (!ns_api_get_bool(body, "logprobs", &lp, e)) return false;
        if (!ns_api_get_int(body, "top_logprobs", 0, NS_MAX_TOP_LOGPROBS, &top, e)) return false;
        if (top > 0 && !lp) {
            ns_http_error_set(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' requires 'logprobs' to be true");
            return false;
        }
        p->rp.logprobs = lp;
        p->rp.top_logprobs = (int32_t)top;
    } else {
        json_t *lv = json_object_get(body, "logprobs");
        if (lv && json_is_boolean(lv)) {
            p->rp.logprobs = json_is_true(lv);
        } else {
            int64_t top = -1;
            if (!ns_api_get_int(body, "logprobs", 0, NS_MAX_TOP_LOGPROBS, &top, e)) return false;
            if (top >= 0) {
                p->rp.logprobs = true;
                p->rp.top_logprobs = (int32_t)top;
            }
        }
    }
    return true;
}

/* response_format: text, json_object or json_schema (the latter two are
 * enforced by a grammar the endpoint compiles: api/structured.h,
 * ns_structured_response_format); anything else is refused by name. */
static bool check_response_format(json_t *body, ns_http_error *e) {
    json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!t || !json_is_string(t)) {
            ns_http_error_set(e, 400, "response_format", "invalid_value",
                              "'response_format' must be an object with a string 'type'");
            return false;
        }
        const char *tv = json_string_value(t);
        /* json_object / json_schema are enforced by a grammar: the endpoint
         * compiles them (api/structured.h, ns_structured_response_format) */
        if (strcmp(tv, "text") != 0 && strcmp(tv, "json_object") != 0 && strcmp(tv, "json_schema") != 0) {
            ns_http_error_set(e, 400, "response_format", "unsupported_value",
                              "response_format type '%.32s' is not supported (text, json_object, json_schema are)",
                              tv);
            return false;
        }
    }
    return true;
}

bool ns_api_parse_gen_params(ns_api *a, json_t *body, bool chat, ns_api_gen_params *p, ns_http_error *e) {
    memset(p, 0, sizeof *p);
    ns_sampling_params *sp = &p->rp.sampling;
    *sp = ns_sampling_default();
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, pres = 0.0, freq = 0.0, rep = 1.0;
    int64_t top_k = 0, seed = 0, n = 1, max_tokens = 0, last_n = 0;
    if (!ns_api_get_num(body, "temperature", 0.0, 2.0, &temperature, e)) return false;
    if (!ns_api_get_num(body, "top_p", 0.0, 1.0, &top_p, e)) return false;
    if (!ns_api_get_num(body, "min_p", 0.0, 1.0, &min_p, e)) return false;
    if (!ns_api_get_num(body, "presence_penalty", -2.0, 2.0, &pres, e)) return false;
    if (!ns_api_get_num(body, "frequency_penalty", -2.0, 2.0, &freq, e)) return false;
    if (!ns_api_get_num(body, "repetition_penalty", 1e-6, 10.0, &rep, e)) return false;
    if (!ns_api_get_int(body, "top_k", -1, INT32_MAX, &top_k, e)) return false;
    if (!ns_api_get_int(body, "repetition_penalty_last_n", -1, INT32_MAX, &last_n, e)) return false;
    if (!ns_api_get_int(body, "n", 1, 1, &n, e)) {
        if (e->status) snprintf(e->message, sizeof e->message, "only n = 1 is supported");
        return false;
    }
    json_t *sv = json_object_get(body, "seed");
    if (sv && !json_is_null(sv)) {
        if (!ns_api_get_int(body, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
        p->seed_given = true;
    }
    if (top_p <= 0.0) {
        ns_http_error_set(e, 400, "top_p", "invalid_value", "'top_p' must be greater than 0");
        return false;
    }
    if (!ns_api_get_int(body, "max_tokens", 1, INT32_MAX, &max_tokens, e)) return false;
    if (chat && !ns_api_get_int(body, "max_completion_tokens", 1, INT32_MAX, &max_tokens, e)) return false;
    if (!parse_stop(body, p, e)) return false;
    if (!ns_api_get_bool(body, "stream", &p->stream, e)) return false;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            type_error(e, "stream_options", "an object", so);
            return false;
        }
        if (!ns_api_get_bool(so, "include_usage", &p->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return false;
        }
    }
    if (!parse_logprobs(body, chat, p, e)) return false;
    if (!ns_api_get_bool(body, "ignore_eos", &p->rp.ignore_eos, e)) return false;
    if (!ns_api_get_bool(body, "return_token_ids", &p->return_token_ids, e)) return false;

    if (!check_response_format(body, e)) return false;

    sp->temperature = (float)temperature;
    /* any top_p in (0, 1] is valid; one below the smallest float (1e-300)
     * must not round to 0 (which means "invalid"): it keeps the top token,
     * as FLT_MIN does */
    sp->top_p = top_p < FLT_MIN ? FLT_MIN : (float)top_p;
    sp->top_k = (int32_t)(top_k < 0 ? 0 : top_k);
    sp->min_p = (float)min_p;
    sp->presence_penalty = (float)pres;
    sp->frequency_penalty = (float)freq;
    sp->repetition_penalty = (float)rep;
    sp->penalty_last_n = (int32_t)(last_n < 0 ? 0 : last_n);
    sp->seed = p->seed_given ? (uint64_t)seed : a->random_seed ? a->random_seed() : 0;
    p->rp.max_tokens = (int32_t)max_tokens; /* 0 = as many as fit */
    ns_error err;
    if (ns_sampling_validate(sp, &err) != NS_OK) {
        ns_http_error_set(e, 400, NULL, "invalid_value", "%s", err.msg);
        return false;
    }
    return true;
}

void ns_api_random_id(const char *prefix, char *out, size_t cap) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[24];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < sizeof rnd; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            rnd[i] = (unsigned char)(x >> 56);
        }
    }
    char id[24 + 1];
    for (size_t i = 0; i < 24; i++) id[i] = alnum[rnd[i] % 62];
    id[24] = 0;
    snprintf(out, cap, "%s%s", prefix, id);
}

bool ns_api_check_context(ns_api *a, int32_t n_prompt, int64_t max_tokens, const char *param, ns_http_error *e) {
    int64_t ctx = a->cfg.max_position_embeddings;
    if (n_prompt == 0) {
        ns_http_error_set(e, 400, param, "empty_prompt", "the prompt is empty (0 tokens)");
        return false;
    }
    if (n_prompt < ctx) return true;
    /* max_tokens plays no part: the prompt alone does not fit (a max_tokens
     * past what is left is clamped), so the message names only the prompt */
    (void)max_tokens;
    ns_api_context_error(a, n_prompt, false, param, e);
    return false;
}

size_t ns_api_prompt_limit(const ns_api *a) {
    const int64_t ctx = a->cfg.max_position_embeddings;
    return ctx > 0 ? (size_t)ctx : 0;
}

void ns_api_context_error(ns_api *a, int64_t n_prompt, bool more, const char *param, ns_http_error *e) {
    const int64_t ctx = a->cfg.max_position_embeddings;
    ns_http_error_set(e, 400, param, "context_length_exceeded",
                      "This model's maximum context length is %lld tokens. However, your prompt has %s%lld tokens. "
                      "Please shorten the prompt.",
                      (long long)ctx, more ? "more than " : "", (long long)(more ? ctx : n_prompt));
    e->extra = json_pack("{s:I,s:b,s:I,s:b}", "prompt_tokens", (json_int_t)n_prompt, "prompt_tokens_exact", !more,
                         "context_tokens", (json_int_t)ctx, "retryable", 0);
}

int64_t ns_api_largest_prompt_tokens(const ns_capacity *cap) {
    /* admission refuses only a prompt of min(pool, context) tokens or more
     * (it must leave one token to generate); max_tokens beyond what is
     * left is clamped, so it does not change what fits */
    const int64_t limit = cap->pool_tokens < cap->context_tokens ? cap->pool_tokens : cap->context_tokens;
    return limit > 1 ? limit - 1 : 0;
}

void ns_api_submit_error(ns_status st, const ns_capacity *cap, const ns_error *err, ns_http_error *e) {
    if (st == NS_ERR_RANGE) {
        ns_http_error_set(e, 400, NULL, "context_exceeds_capacity", "%s", err->msg);
        e->extra = json_pack("{s:I,s:I,s:I,s:I,s:I,s:b}", "prompt_tokens", (json_int_t)cap->prompt_tokens,
                             "max_tokens", (json_int_t)cap->max_tokens, "pool_tokens", (json_int_t)cap->pool_tokens,
                             "context_tokens", (json_int_t)cap->context_tokens, "largest_prompt_tokens",
                             (json_int_t)ns_api_largest_prompt_tokens(cap), "retryable", 0);
        return;
    }
    ns_http_error_from_status(e, st, NULL, err->msg);
}
