/* responses_conv.c — OpenAI Responses request -> chat request (see
 * responses_conv.h). */
#include "api/responses_conv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "util/buf.h"

#define MAX_ITEMS 100000
#define MAX_TOOLS 256

static bool bad(ns_http_error *e, const char *param, const char *code, const char *msg) {
    ns_http_error_set(e, 400, param, code, "'%s': %s", param, msg);
    return false;
}

/* Every field /v1/responses knows; the ignored ones are documented in
 * docs/API.md. */
static const char *const k_fields[] = {
    "model",          "input",           "instructions",     "tools",      "tool_choice",
    "parallel_tool_calls", "max_output_tokens", "max_tool_calls", "temperature", "top_p",
    "stream",         "stream_options",  "store",            "include",    "prompt_cache_key",
    "prompt_cache_retention", "client_metadata", "metadata",   "user",       "safety_identifier",
    "service_tier",   "text",            "reasoning",        "truncation", "previous_response_id",
    "conversation",   "background",      "top_logprobs",     "prompt"};

static bool check_fields(json_t *body, ns_http_error *e) {
    const char *k = ns_api_unknown_key(body, k_fields, sizeof k_fields / sizeof k_fields[0]);
    if (!k) return true;
    char p[96];
    snprintf(p, sizeof p, "%.80s", k);
    return bad(e, p, "unknown_parameter", "unknown parameter");
}

/* Appends a part to b, after a newline when b already holds one (the chat
 * path joins text parts with newlines). A buffer, not string
 * concatenation: many parts must cost linear time. */
static bool join(ns_buf *b, bool *any, const char *s, size_t n) {
    if (*any && ns_buf_putc(b, '\n') != NS_OK) return false;
    *any = true;
    return ns_buf_append(b, s, n) == NS_OK;
}

/* The text of a message's content (a string or text parts): new string. */
static json_t *content_text(json_t *c, const char *param, ns_http_error *e) {
    if (!c || json_is_null(c)) return json_string("");
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) return bad(e, param, "invalid_type", "must be a string or an array of content parts"), NULL;
    ns_buf acc;
    ns_buf_init(&acc, 0);
    bool any = false;
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        const char *ty = json_is_string(t) ? json_string_value(t) : "";
        json_t *tx = NULL;
        if (!strcmp(ty, "input_text") || !strcmp(ty, "output_text") || !strcmp(ty, "text")) tx = json_object_get(p, "text");
        else if (!strcmp(ty, "refusal")) tx = json_object_get(p, "refusal");
        char pp[160];
        snprintf(pp, sizeof pp, "%s[%zu]", param, i);
        if (!json_is_string(tx)) {
            ns_buf_free(&acc);
            if (!tx && ty[0])
                ns_http_error_set(e, 400, pp, "unsupported_content_type",
                                  "'%s': content parts of type '%.40s' are not supported (this model reads text only)", pp,
                                  ty);
            else
                bad(e, pp, "invalid_type", "must be a text part with a string 'text'");
            return NULL;
        }
        if (!join(&acc, &any, json_string_value(tx), json_string_length(tx))) {
            ns_buf_free(&acc);
            ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
            return NULL;
        }
    }
    json_t *r = json_stringn(acc.data ? acc.data : "", acc.len);
    ns_buf_free(&acc);
    if (!r) bad(e, param, "invalid_value", "contains a NUL character");
    return r;
}

/* The assistant message being assembled from consecutive items. */
typedef struct pending {
    json_t *content, *calls;
    ns_buf reasoning;
    bool any_reasoning;
} pending;

static void flush(json_t *out, pending *p) {
    if (!p->content && !p->any_reasoning && !p->calls) return;
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", p->content ? p->content : json_string(""));
    if (p->any_reasoning)
        json_object_set_new(m, "reasoning_content", json_stringn(p->reasoning.data ? p->reasoning.data : "", p->reasoning.len));
    if (p->calls) json_object_set_new(m, "tool_calls", p->calls);
    json_array_append_new(out, m);
    p->content = p->calls = NULL;
    ns_buf_reset(&p->reasoning);
    p->any_reasoning = false;
}

static bool reasoning_item(json_t *it, const char *param, pending *p, ns_http_error *e) {
    json_t *c = json_object_get(it, "content");
    if (json_is_array(c) && json_array_size(c) > 0) {
        json_t *txt = content_text(c, param, e);
        if (!txt) return false;
        bool ok = join(&p->reasoning, &p->any_reasoning, json_string_value(txt), json_string_length(txt));
        json_decref(txt);
        return ok || bad(e, param, "invalid_value", "out of memory");
    }
    json_t *enc = json_object_get(it, "encrypted_content");
    const size_t tl = sizeof NS_RESP_REASONING_TAG - 1;
    if (json_is_string(enc) && json_string_length(enc) >= tl &&
        memcmp(json_string_value(enc), NS_RESP_REASONING_TAG, tl) == 0) {
        if (!join(&p->reasoning, &p->any_reasoning, json_string_value(enc) + tl, json_string_length(enc) - tl))
            return bad(e, param, "invalid_value", "out of memory");
    }
    return true; /* content null and no readable text: nothing to render */
}

static bool call_item(json_t *it, bool custom, const char *param, json_t *out, pending *p, ns_http_error *e) {
    json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    json_t *args = json_object_get(it, custom ? "input" : "arguments");
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
        return bad(e, param, "invalid_value",
                   custom ? "a custom_tool_call needs string call_id, name and input"
                          : "a function_call needs string call_id, name and arguments");
    if (!p->calls) p->calls = json_array();
    json_t *a = custom ? json_pack("{s:O}", "input", args) : json_incref(args);
    json_array_append_new(p->calls,
                          json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function", "function", "name", name,
                                    "arguments", a));
    return true;
}

static bool output_item(json_t *it, const char *param, json_t *out, pending *p, ns_http_error *e) {
    json_t *id = json_object_get(it, "call_id");
    if (!json_is_string(id)) return bad(e, param, "invalid_value", "a tool output needs a string call_id");
    char pp[160];
    snprintf(pp, sizeof pp, "%s.output", param);
    json_t *txt = content_text(json_object_get(it, "output"), pp, e);
    if (!txt) return false;
    flush(out, p);
    json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", txt));
    return true;
}

static bool message_item(json_t *it, const char *param, json_t *out, pending *p, ns_http_error *e) {
    json_t *role = json_object_get(it, "role");
    const char *r = json_is_string(role) ? json_string_value(role) : "";
    char pp[160];
    snprintf(pp, sizeof pp, "%s.content", param);
    json_t *txt = content_text(json_object_get(it, "content"), pp, e);
    if (!txt) return false;
    if (strcmp(r, "assistant") == 0) {
        if (p->content || p->calls) flush(out, p);
        p->content = txt;
        return true;
    }
    if (strcmp(r, "developer") == 0) r = "system";
    if (strcmp(r, "user") != 0 && strcmp(r, "system") != 0) {
        json_decref(txt);
        snprintf(pp, sizeof pp, "%s.role", param);
        return bad(e, pp, "invalid_value", "must be one of user, system, developer, assistant");
    }
    flush(out, p);
    json_array_append_new(out, json_pack("{s:s,s:o}", "role", r, "content", txt));
    return true;
}

static bool convert_input(json_t *body, json_t *out, ns_http_error *e) {
    json_t *ins = json_object_get(body, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) return bad(e, "instructions", "invalid_type", "must be a string");
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    }
    json_t *in = json_object_get(body, "input");
    if (!in) return bad(e, "input", "missing_required_parameter", "is required");
    if (json_is_string(in)) {
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", in));
        return true;
    }
    if (!json_is_array(in)) return bad(e, "input", "invalid_type", "must be a string or an array of items");
    if (json_array_size(in) > MAX_ITEMS) return bad(e, "input", "invalid_value", "too many items");
    pending p = {0};
    ns_buf_init(&p.reasoning, 0);
    size_t i;
    json_t *it;
    bool ok = true;
    json_array_foreach(in, i, it) {
        char param[64];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!json_is_object(it)) {
            ok = bad(e, param, "invalid_type", "must be an object");
            break;
        }
        json_t *t = json_object_get(it, "type");
        const char *ty = json_is_string(t) ? json_string_value(t) : (json_object_get(it, "role") ? "message" : "");
        if (!strcmp(ty, "message")) ok = message_item(it, param, out, &p, e);
        else if (!strcmp(ty, "reasoning")) ok = reasoning_item(it, param, &p, e);
        else if (!strcmp(ty, "function_call")) ok = call_item(it, false, param, out, &p, e);
        else if (!strcmp(ty, "custom_tool_call")) ok = call_item(it, true, param, out, &p, e);
        else if (!strcmp(ty, "function_call_output") || !strcmp(ty, "custom_tool_call_output"))
            ok = output_item(it, param, out, &p, e);
        else {
            char pp[96];
            snprintf(pp, sizeof pp, "%s.type", param);
            ns_http_error_set(e, 400, pp, "unsupported_value",
                              "'%s': input items of type '%.40s' are not supported (message, reasoning, function_call, "
                              "function_call_output, custom_tool_call, custom_tool_call_output are)",
                              pp, ty);
            ok = false;
        }
        if (!ok) break;
    }
    if (ok) flush(out, &p);
    json_decref(p.content);
    json_decref(p.calls);
    ns_buf_free(&p.reasoning);
    return ok;
}

static void note_ignored(ns_resp_conv *c, const char *name) {
    size_t n = strlen(c->ignored_tools), k = 0;
    char clean[96];
    for (const char *q = name; *q && k + 1 < sizeof clean; q++) clean[k++] = (*q > 0x20 && *q < 0x7f && *q != ',') ? *q : '_';
    clean[k] = 0;
    if (n + k + 2 < sizeof c->ignored_tools)
        snprintf(c->ignored_tools + n, sizeof c->ignored_tools - n, "%s%s", n ? "," : "", clean);
    c->n_ignored++;
}

/* One function or custom tool (ns: its namespace or NULL) onto out. */
static bool offer(ns_resp_conv *c, json_t *t, const char *ns, const char *param, json_t *out, ns_http_error *e) {
    const char *ty = json_string_value(json_object_get(t, "type"));
    const bool custom = ty && strcmp(ty, "custom") == 0;
    json_t *name = json_object_get(t, "name");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return bad(e, param, "invalid_value", "a tool needs a non-empty string 'name'");
    if (json_object_get(c->tool_info, json_string_value(name)))
        return bad(e, param, "invalid_value", "two tools have the same name");
    if (json_array_size(out) >= MAX_TOOLS) return bad(e, "tools", "invalid_value", "at most 256 tools are supported");
    json_t *params;
    if (custom) {
        /* free-form input (a Lark grammar or plain text): one string */
        params = json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties", "input", "type", "string",
                           "required", "input");
    } else {
        params = json_object_get(t, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params))
            return bad(e, param, "invalid_type", "'parameters' must be an object");
        params = json_is_object(params) ? json_incref(params) : json_pack("{s:s,s:{}}", "type", "object", "properties");
    }
    /* OpenAI's key order (name, description, parameters): templates print it */
    json_t *fn = json_pack("{s:O}", "name", name);
    json_t *d = json_object_get(t, "description");
    if (json_is_string(d)) json_object_set(fn, "description", d);
    json_object_set_new(fn, "parameters", params);
    json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    json_object_set_new(c->tool_info, json_string_value(name),
                        json_pack("{s:b,s:o}", "custom", custom, "namespace", ns ? json_string(ns) : json_null()));
    return true;
}

static bool convert_tools(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return bad(e, "tools", "invalid_type", "must be an array");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        if (!json_is_string(type)) {
            json_decref(out);
            return bad(e, param, "invalid_type", "must be an object with a string 'type'");
        }
        const char *ty = json_string_value(type);
        bool ok = true;
        if (!strcmp(ty, "function") || !strcmp(ty, "custom")) {
            ok = offer(c, t, NULL, param, out, e);
        } else if (!strcmp(ty, "namespace")) {
            json_t *ns = json_object_get(t, "name"), *inner = json_object_get(t, "tools");
            if (!json_is_string(ns) || !json_is_array(inner)) {
                ok = bad(e, param, "invalid_value", "a namespace needs a string 'name' and an array 'tools'");
            } else {
                size_t k;
                json_t *f;
                json_array_foreach(inner, k, f) {
                    char pp[96];
                    snprintf(pp, sizeof pp, "%s.tools[%zu]", param, k);
                    json_t *ft = json_is_object(f) ? json_object_get(f, "type") : NULL;
                    if (!json_is_string(ft) ||
                        (strcmp(json_string_value(ft), "function") && strcmp(json_string_value(ft), "custom"))) {
                        ok = bad(e, pp, "invalid_value", "namespace tools must be function or custom tools");
                        break;
                    }
                    if (!(ok = offer(c, f, json_string_value(ns), pp, out, e))) break;
                }
            }
        } else {
            /* hosted (web_search, tool_search, file_search, ...): the server cannot run it */
            json_t *nm = json_object_get(t, "name");
            note_ignored(c, json_is_string(nm) ? json_string_value(nm) : ty);
        }
        if (!ok) {
            json_decref(out);
            return false;
        }
    }
    if (json_array_size(out) > 0) json_object_set(c->chat, "tools", out);
    json_decref(out);
    return true;
}

static bool convert_choice(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "auto")) c->choice = NS_RESP_CHOICE_AUTO;
        else if (!strcmp(s, "none")) c->choice = NS_RESP_CHOICE_NONE;
        else if (!strcmp(s, "required")) c->choice = NS_RESP_CHOICE_REQUIRED;
        else return bad(e, "tool_choice", "invalid_value", "must be 'auto', 'none', 'required' or a tool object");
        json_object_set(c->chat, "tool_choice", tc);
    } else {
        json_t *t = json_is_object(tc) ? json_object_get(tc, "type") : NULL, *n = json_object_get(tc, "name");
        if (!json_is_string(t) || (strcmp(json_string_value(t), "function") && strcmp(json_string_value(t), "custom")) ||
            !json_is_string(n))
            return bad(e, "tool_choice", "unsupported_value",
                       "as an object must be {\"type\": \"function\" or \"custom\", \"name\": ...} (hosted tools and "
                       "allowed_tools are not supported)");
        if (!json_object_get(c->tool_info, json_string_value(n)))
            return bad(e, "tool_choice", "invalid_value", "names a tool that is not among the request's tools");
        c->choice = NS_RESP_CHOICE_NAMED;
        c->choice_name = json_string_value(n);
        json_object_set_new(c->chat, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", n));
    }
    if (c->choice >= NS_RESP_CHOICE_REQUIRED && !json_object_get(c->chat, "tools"))
        return bad(e, "tool_choice", "invalid_value", "requires at least one tool the model can call");
    return true;
}

static bool get_num(json_t *body, const char *k, double lo, double hi, double *out, ns_http_error *e) {
    json_t *v = json_object_get(body, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
        ns_http_error_set(e, 400, k, "invalid_value", "'%s' must be a number between %g and %g", k, lo, hi);
        return false;
    }
    *out = json_number_value(v);
    return true;
}

static bool check_bool(json_t *body, const char *k, ns_http_error *e) {
    json_t *v = json_object_get(body, k);
    return !v || json_is_null(v) || json_is_boolean(v) || bad(e, k, "invalid_type", "must be a boolean");
}

/* Refusals and the hosted-only fields' types. */
static bool stateless(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    json_t *v = json_object_get(body, "previous_response_id");
    if (v && !json_is_null(v))
        return bad(e, "previous_response_id", "unsupported_parameter",
                   "this server is stateless (nothing is stored): send the whole conversation in 'input'");
    v = json_object_get(body, "conversation");
    if (v && !json_is_null(v))
        return bad(e, "conversation", "unsupported_parameter",
                   "this server is stateless (no conversations): send the whole conversation in 'input'");
    v = json_object_get(body, "prompt");
    if (v && !json_is_null(v)) return bad(e, "prompt", "unsupported_parameter", "stored prompts are not supported");
    if (json_is_true(json_object_get(body, "background")))
        return bad(e, "background", "unsupported_parameter", "background responses are not supported (nothing is stored)");
    v = json_object_get(body, "top_logprobs");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
        return bad(e, "top_logprobs", "unsupported_parameter", "logprobs are not supported on /v1/responses");
    v = json_object_get(body, "truncation");
    if (v && !json_is_null(v) && !(json_is_string(v) && !strcmp(json_string_value(v), "disabled")))
        return bad(e, "truncation", "unsupported_value", "only 'disabled' is supported (the prompt is never cut)");
    if (!check_bool(body, "store", e) || !check_bool(body, "stream", e) || !check_bool(body, "parallel_tool_calls", e))
        return false;
    json_t *inc = json_object_get(body, "include");
    if (inc && !json_is_null(inc)) {
        if (!json_is_array(inc)) return bad(e, "include", "invalid_type", "must be an array of strings");
        size_t i;
        json_t *s;
        json_array_foreach(inc, i, s) {
            const char *x = json_is_string(s) ? json_string_value(s) : "";
            if (!strcmp(x, "reasoning.encrypted_content")) c->include_reasoning = true;
            else if (!strncmp(x, "message.output_text.logprobs", 28) || !strncmp(x, "message.input_image", 19) ||
                     !x[0])
                return bad(e, "include", "unsupported_value", "only reasoning.encrypted_content and hosted-tool "
                                                              "outputs (never produced here) can be included");
        }
    }
    return true;
}

static bool text_and_reasoning(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    json_t *tx = json_object_get(body, "text");
    if (tx && !json_is_null(tx)) {
        if (!json_is_object(tx)) return bad(e, "text", "invalid_type", "must be an object");
        json_t *f = json_object_get(tx, "format");
        if (f && !json_is_null(f)) {
            json_t *t = json_is_object(f) ? json_object_get(f, "type") : NULL;
            const char *ty = json_is_string(t) ? json_string_value(t) : "";
            if (!strcmp(ty, "json_schema")) {
                c->schema = json_object_get(f, "schema");
                if (!json_is_object(c->schema)) return bad(e, "text.format.schema", "invalid_type", "must be an object");
            } else if (!strcmp(ty, "json_object")) {
                c->json_object = true;
            } else if (strcmp(ty, "text") != 0) {
                return bad(e, "text.format.type", "invalid_value", "must be text, json_object or json_schema");
            }
        }
        json_t *vb = json_object_get(tx, "verbosity");
        if (vb && !json_is_null(vb) && !json_is_string(vb)) return bad(e, "text.verbosity", "invalid_type", "must be a string");
    }
    json_t *r = json_object_get(body, "reasoning");
    if (r && !json_is_null(r)) {
        if (!json_is_object(r)) return bad(e, "reasoning", "invalid_type", "must be an object");
        json_t *ef = json_object_get(r, "effort");
        if (ef && !json_is_null(ef)) json_object_set(c->chat, "reasoning_effort", ef); /* checked by the chat path */
    }
    return true;
}

static bool sampling(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    if (!get_num(body, "temperature", 0.0, 2.0, &c->temperature, e)) return false;
    if (!get_num(body, "top_p", 0.0, 1.0, &c->top_p, e)) return false;
    if (c->top_p <= 0.0) return bad(e, "top_p", "invalid_value", "must be greater than 0");
    json_t *m = json_object_get(body, "max_output_tokens");
    if (m && !json_is_null(m)) {
        if (!json_is_integer(m) || json_integer_value(m) < 1 || json_integer_value(m) > INT32_MAX)
            return bad(e, "max_output_tokens", "invalid_value", "must be a positive integer");
        c->max_tokens = json_integer_value(m);
    }
    json_t *mc = json_object_get(body, "max_tool_calls");
    if (mc && !json_is_null(mc)) {
        if (!json_is_integer(mc) || json_integer_value(mc) < 1 || json_integer_value(mc) > 128)
            return bad(e, "max_tool_calls", "invalid_value", "must be an integer between 1 and 128");
        c->max_calls = (int)json_integer_value(mc);
    }
    if (json_is_false(json_object_get(body, "parallel_tool_calls"))) c->max_calls = 1;
    c->stream = json_is_true(json_object_get(body, "stream"));
    return true;
}

bool ns_resp_convert(json_t *body, ns_resp_conv *c, ns_http_error *e) {
    memset(c, 0, sizeof *c);
    c->temperature = c->top_p = 1.0;
    if (!check_fields(body, e)) return false;
    json_t *model = json_object_get(body, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) return bad(e, "model", "invalid_type", "must be a string");
    c->chat = json_object();
    c->tool_info = json_object();
    json_t *msgs = json_array();
    json_object_set_new(c->chat, "messages", msgs);
    if (!stateless(body, c, e) || !sampling(body, c, e) || !convert_input(body, msgs, e) || !convert_tools(body, c, e) ||
        !convert_choice(body, c, e) || !text_and_reasoning(body, c, e)) {
        ns_resp_conv_free(c);
        return false;
    }
    if (json_array_size(msgs) == 0) {
        ns_resp_conv_free(c);
        return bad(e, "input", "invalid_value", "must contain at least one item");
    }
    return true;
}

void ns_resp_conv_free(ns_resp_conv *c) {
    json_decref(c->chat);
    json_decref(c->tool_info);
    c->chat = c->tool_info = NULL;
}

/* ---- streaming a custom tool's input ---- */

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at s[i..i+4) (-1: incomplete or not hex). */
static long hex4(const char *s, size_t n, size_t i) {
    if (i + 4 > n) return -1;
    long v = 0;
    for (size_t k = 0; k < 4; k++) {
        int h = hexval(s[i + k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static bool put_utf8(ns_buf *b, unsigned long cp) {
    char u[4];
    size_t k;
    if (cp < 0x80) u[0] = (char)cp, k = 1;
    else if (cp < 0x800) u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f)), k = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xe0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[2] = (char)(0x80 | (cp & 0x3f)), k = 3;
    else
        u[0] = (char)(0xf0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f)),
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), k = 4;
    return ns_buf_append(b, u, k) == NS_OK;
}

bool ns_resp_custom_input_prefix(const char *args, size_t n, ns_buf *out) {
    static const char key[] = "\"input\"";
    ns_buf_reset(out);
    size_t i = skip_ws(args, n, 0);
    if (i >= n || args[i] != '{') return false;
    i = skip_ws(args, n, i + 1);
    if (n - i < sizeof key - 1 || memcmp(args + i, key, sizeof key - 1) != 0) return false;
    i = skip_ws(args, n, i + sizeof key - 1);
    if (i >= n || args[i] != ':') return false;
    i = skip_ws(args, n, i + 1);
    if (i >= n || args[i] != '"') return false;
    for (i++; i < n && args[i] != '"';) {
        if (args[i] != '\\') {
            if (ns_buf_putc(out, args[i++]) != NS_OK) return false;
            continue;
        }
        if (i + 1 >= n) break; /* the escape is not complete yet */
        char c = args[i + 1], r;
        switch (c) {
        case 'n': r = '\n'; break;
        case 't': r = '\t'; break;
        case 'r': r = '\r'; break;
        case 'b': r = '\b'; break;
        case 'f': r = '\f'; break;
        case 'u': r = 0; break;
        default: r = c; break; /* \" \\ \/ */
        }
        if (c != 'u') {
            if (ns_buf_putc(out, r) != NS_OK) return false;
            i += 2;
            continue;
        }
        long cp = hex4(args, n, i + 2);
        if (cp < 0) break;
        size_t used = 6;
        if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair needs its second half */
            long lo = i + 7 < n && args[i + 6] == '\\' && args[i + 7] == 'u' ? hex4(args, n, i + 8) : -1;
            if (lo < 0xdc00 || lo > 0xdfff) break; /* incomplete (or invalid: left to the final parse) */
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            used = 12;
        }
        if (!put_utf8(out, (unsigned long)cp)) return false;
        i += used;
    }
    return true;
}
