/* chat.c — chat request -> template context -> prompt (see chat.h). */
#include "api/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

#define MAX_MESSAGES 100000

static bool fail_type(ns_http_error *e, const char *param, const char *want) {
    ns_http_error_set(e, 400, param, "invalid_type", "'%s' must be %s", param, want);
    return false;
}

/* content: string | null | [parts] -> a JSON string (new reference). */
static json_t *content_text(json_t *c, size_t mi, ns_http_error *e) {
    char param[96];
    if (!c || json_is_null(c)) return json_string("");
    if (json_is_string(c)) return json_incref(c);
    snprintf(param, sizeof param, "messages[%zu].content", mi);
    if (!json_is_array(c)) {
        fail_type(e, param, "a string, null or an array of content parts");
        return NULL;
    }
    /* text parts joined with newlines */
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, i);
        if (!json_is_object(part)) {
            fail_type(e, param, "an object");
            return NULL;
        }
        json_t *t = json_object_get(part, "type");
        if (!json_is_string(t)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].type", mi, i);
            fail_type(e, param, "a string");
            return NULL;
        }
        if (strcmp(json_string_value(t), "text") != 0) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].type", mi, i);
            ns_http_error_set(e, 400, param, "unsupported_content_type",
                              "content parts of type '%.64s' are not supported (only 'text')", json_string_value(t));
            return NULL;
        }
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu].text", mi, i);
            fail_type(e, param, "a string");
            return NULL;
        }
        total += json_string_length(tx) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf) {
        ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
        return NULL;
    }
    size_t n = 0;
    json_array_foreach(c, i, part) {
        json_t *tx = json_object_get(part, "text");
        if (i) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(tx), json_string_length(tx));
        n += json_string_length(tx);
    }
    json_t *s = json_stringn(buf, n);
    free(buf);
    if (!s) ns_http_error_set(e, 400, param, "invalid_value", "content contains a NUL character");
    return s;
}

static json_t *tool_call_copy(ns_api *a, json_t *tc, size_t mi, size_t ti, ns_http_error *e) {
    char param[128];
    snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu]", mi, ti);
    if (!json_is_object(tc)) {
        fail_type(e, param, "an object");
        return NULL;
    }
    json_t *fn = json_object_get(tc, "function");
    snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function", mi, ti);
    if (!json_is_object(fn)) {
        fail_type(e, param, "an object");
        return NULL;
    }
    json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name)) {
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.name", mi, ti);
        fail_type(e, param, "a string");
        return NULL;
    }
    json_t *args = json_object_get(fn, "arguments");
    json_t *args_out;
    if (!args || json_is_null(args)) {
        args_out = json_object();
    } else if (json_is_string(args)) {
        args_out = NULL;
        if (!a->tmpl_wants_string_args) { /* the template would tojson a string twice */
            json_error_t je;
            args_out = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
        }
        if (!args_out) args_out = json_incref(args);
    } else if (json_is_object(args)) {
        args_out = json_incref(args);
    } else {
        snprintf(param, sizeof param, "messages[%zu].tool_calls[%zu].function.arguments", mi, ti);
        fail_type(e, param, "a JSON string or an object");
        return NULL;
    }
    json_t *out = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", name, "arguments", args_out);
    json_t *id = json_object_get(tc, "id");
    if (out && json_is_string(id)) json_object_set(out, "id", id);
    return out;
}

static json_t *message_copy(ns_api *a, json_t *m, size_t mi, ns_http_error *e) {
    char param[96];
    snprintf(param, sizeof param, "messages[%zu]", mi);
    if (!json_is_object(m)) {
        fail_type(e, param, "an object");
        return NULL;
    }
    json_t *role = json_object_get(m, "role");
    snprintf(param, sizeof param, "messages[%zu].role", mi);
    if (!json_is_string(role)) {
        if (!role) {
            ns_http_error_set(e, 400, param, "missing_required_parameter", "'%s' is required", param);
            return NULL;
        }
        fail_type(e, param, "a string");
        return NULL;
    }
    const char *r = json_string_value(role);
    if (strcmp(r, "developer") == 0) r = "system"; /* newer clients' name for it */
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
        ns_http_error_set(e, 400, param, "invalid_value",
                          "'%s' must be one of system, developer, user, assistant, tool (got '%.32s')", param, r);
        return NULL;
    }
    json_t *content = content_text(json_object_get(m, "content"), mi, e);
    if (!content) return NULL;
    json_t *out = json_pack("{s:s,s:o}", "role", r, "content", content);
    if (!out) {
        ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
        return NULL;
    }
    const char *opt_str[] = {"name", "tool_call_id"};
    for (size_t k = 0; k < 2; k++) {
        json_t *v = json_object_get(m, opt_str[k]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) {
            snprintf(param, sizeof param, "messages[%zu].%s", mi, opt_str[k]);
            json_decref(out);
            return fail_type(e, param, "a string"), NULL;
        }
        json_object_set(out, opt_str[k], v);
    }
    if (strcmp(r, "assistant") == 0) {
        json_t *rc = json_object_get(m, "reasoning_content");
        if (!rc || json_is_null(rc)) rc = json_object_get(m, "reasoning");
        if (rc && !json_is_null(rc)) {
            if (!json_is_string(rc)) {
                snprintf(param, sizeof param, "messages[%zu].reasoning_content", mi);
                json_decref(out);
                return fail_type(e, param, "a string"), NULL;
            }
            json_object_set(out, "reasoning_content", rc);
        }
        json_t *tcs = json_object_get(m, "tool_calls");
        if (tcs && !json_is_null(tcs)) {
            if (!json_is_array(tcs)) {
                snprintf(param, sizeof param, "messages[%zu].tool_calls", mi);
                json_decref(out);
                return fail_type(e, param, "an array"), NULL;
            }
            if (json_array_size(tcs) > 0) {
                json_t *arr = json_array();
                size_t ti;
                json_t *tc;
                json_array_foreach(tcs, ti, tc) {
                    json_t *c = tool_call_copy(a, tc, mi, ti, e);
                    if (!c) {
                        json_decref(arr);
                        json_decref(out);
                        return NULL;
                    }
                    json_array_append_new(arr, c);
                }
                json_object_set_new(out, "tool_calls", arr);
            }
        }
    }
    return out;
}

static bool tools_copy(json_t *body, json_t **out, ns_chat_prompt *p, ns_http_error *e) {
    *out = NULL;
    json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return fail_type(e, "tools", "an array");
    if (json_array_size(tools) > NS_CHAT_MAX_TOOLS) {
        ns_http_error_set(e, 400, "tools", "invalid_value", "at most %d tools are supported", NS_CHAT_MAX_TOOLS);
        return false;
    }
    size_t i;
    json_t *t;
    char param[64];
    json_array_foreach(tools, i, t) {
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t)) return fail_type(e, param, "an object");
        json_t *type = json_object_get(t, "type");
        if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)) {
            snprintf(param, sizeof param, "tools[%zu].type", i);
            ns_http_error_set(e, 400, param, "invalid_value", "only tools of type 'function' are supported");
            return false;
        }
        json_t *fn = json_object_get(t, "function");
        snprintf(param, sizeof param, "tools[%zu].function", i);
        if (!json_is_object(fn)) return fail_type(e, param, "an object");
        json_t *name = json_object_get(fn, "name");
        snprintf(param, sizeof param, "tools[%zu].function.name", i);
        if (!json_is_string(name) || json_string_length(name) == 0) return fail_type(e, param, "a non-empty string");
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
            return fail_type(e, param, "an object");
        }
        p->tool_names[p->n_tools++] = json_string_value(name);
    }
    if (json_array_size(tools) > 0) *out = json_incref(tools);
    return true;
}

/* tool_choice {"type": "function", "function": {"name": N}}: N must be one
 * of the request's tools (OpenAI answers 400 otherwise). "required" and a
 * named function are enforced by a grammar (chat_completions.c,
 * api/structured.h); the calls are parsed like "auto". */
static bool check_named_choice(json_t *tc, const ns_chat_prompt *p, ns_http_error *e) {
    json_t *type = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
    json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if ((type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) ||
        !json_is_string(name)) {
        ns_http_error_set(e, 400, "tool_choice", "invalid_value",
                          "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        return false;
    }
    const char *n = json_string_value(name);
    for (int i = 0; i < p->n_tools; i++)
        if (strcmp(p->tool_names[i], n) == 0) return true;
    if (p->n_tools == 0)
        ns_http_error_set(e, 400, "tool_choice", "invalid_value",
                          "'tool_choice' names the function '%.64s' but the request has no tools", n);
    else
        ns_http_error_set(e, 400, "tool_choice", "invalid_value",
                          "'tool_choice' names the function '%.64s', which is not among the request's tools", n);
    return false;
}

static bool parse_tool_choice(json_t *body, const ns_chat_prompt *p, bool *none, ns_http_error *e) {
    *none = false;
    json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "none") == 0) *none = true;
        else if (strcmp(s, "auto") != 0 && strcmp(s, "required") != 0) {
            ns_http_error_set(e, 400, "tool_choice", "invalid_value",
                              "'tool_choice' must be 'none', 'auto', 'required' or a function object");
            return false;
        }
        return true;
    }
    if (json_is_object(tc)) return check_named_choice(tc, p, e);
    return fail_type(e, "tool_choice", "a string or an object");
}

/* An API without the template's source (an embedder that set only tmpl)
 * cannot tell: tools are passed on, as before the check existed. */
bool ns_chat_template_has_tools(const ns_api *a) { return !a->tmpl_src || strstr(a->tmpl_src, "tools") != NULL; }

bool ns_chat_template_has_thinking_switch(const ns_api *a) {
    return a->tmpl_src && strstr(a->tmpl_src, "enable_thinking") != NULL;
}

/* The thinking switch: enable_thinking (bool) or reasoning_effort
 * ("none" turns thinking off; "minimal", "low", "medium", "high", "xhigh"
 * leave it on — the templates have an on/off switch, not levels). Set in
 * ctx only where the template has the switch; elsewhere the request is
 * still served and the log says the setting has no effect (the model
 * either never thinks or always does). chat_template_kwargs, merged
 * later, wins over both. */
static bool thinking_switch(ns_api *a, json_t *body, json_t *ctx, ns_http_error *e) {
    json_t *et = json_object_get(body, "enable_thinking");
    json_t *re = json_object_get(body, "reasoning_effort");
    int on = -1;
    if (re && !json_is_null(re)) {
        static const char *const levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
        const char *v = json_is_string(re) ? json_string_value(re) : NULL;
        size_t k = 0;
        while (v && k < sizeof levels / sizeof levels[0] && strcmp(v, levels[k]) != 0) k++;
        if (!v || k == sizeof levels / sizeof levels[0]) {
            ns_http_error_set(e, 400, "reasoning_effort", "invalid_value",
                              "'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh");
            return false;
        }
        on = k != 0;
    }
    if (et && !json_is_null(et)) {
        if (!json_is_boolean(et)) return fail_type(e, "enable_thinking", "a boolean");
        on = json_is_true(et);
    }
    if (on < 0) return true;
    if (ns_chat_template_has_thinking_switch(a)) json_object_set_new(ctx, "enable_thinking", json_boolean(on));
    else
        NS_INFO("thinking %s requested, but the chat template has no thinking switch: the model %s", on ? "on" : "off",
                a->reasoning ? "thinks as its template makes it" : "does not think");
    return true;
}

/* continue_final_message (HF / vLLM; the Anthropic API's prefill): the
 * last message is an assistant turn the model continues. It needs a
 * non-empty string content, which the rendered prompt is cut after. */
static bool continue_final(json_t *msgs, bool agp_given_true, ns_chat_prompt *p, ns_http_error *e) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    json_t *c = json_object_get(last, "content");
    if (agp_given_true) {
        ns_http_error_set(e, 400, "continue_final_message", "invalid_value",
                          "'continue_final_message' and 'add_generation_prompt' cannot both be true");
        return false;
    }
    if (!role || strcmp(role, "assistant") != 0 || !json_is_string(c) || json_string_length(c) == 0 ||
        json_object_get(last, "tool_calls")) {
        ns_http_error_set(e, 400, "continue_final_message", "invalid_value",
                          "'continue_final_message' needs a last assistant message with text content and no tool calls");
        return false;
    }
    p->final_content = json_incref(c);
    return true;
}

/* Cuts the rendered prompt right after the final message's content (its
 * last occurrence), dropping the end-of-turn the template wrote, as HF's
 * continue_final_message does. */
static bool cut_after_final(ns_chat_prompt *p, ns_http_error *e) {
    const char *fin = json_string_value(p->final_content);
    const size_t fl = json_string_length(p->final_content);
    const char *hit = NULL;
    for (const char *q = p->text; q && (size_t)(q - p->text) + fl <= p->len;) {
        const char *f = memmem(q, p->len - (size_t)(q - p->text), fin, fl);
        if (!f) break;
        hit = f;
        q = f + 1;
    }
    if (!hit) {
        ns_http_error_set(e, 400, "continue_final_message", "invalid_value",
                          "the chat template does not print the final message's content verbatim, so it cannot be "
                          "continued");
        return false;
    }
    p->len = (size_t)(hit - p->text) + fl;
    p->text[p->len] = 0;
    return true;
}

static json_t *build_context(ns_api *a, json_t *body, bool generate, ns_chat_prompt *p, ns_http_error *e) {
    json_t *msgs = json_object_get(body, "messages");
    if (!msgs) {
        ns_http_error_set(e, 400, "messages", "missing_required_parameter", "'messages' is required");
        return NULL;
    }
    if (!json_is_array(msgs)) return fail_type(e, "messages", "an array"), NULL;
    if (json_array_size(msgs) == 0) {
        ns_http_error_set(e, 400, "messages", "invalid_value", "'messages' must contain at least one message");
        return NULL;
    }
    if (json_array_size(msgs) > MAX_MESSAGES) {
        ns_http_error_set(e, 400, "messages", "invalid_value", "at most %d messages are supported", MAX_MESSAGES);
        return NULL;
    }
    json_t *ctx = json_object(), *out_msgs = json_array();
    json_object_set_new(ctx, "messages", out_msgs);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *c = message_copy(a, m, i, e);
        if (!c) goto fail;
        json_array_append_new(out_msgs, c);
    }
    json_t *tools;
    if (!tools_copy(body, &tools, p, e)) goto fail;
    bool none = false;
    if (!parse_tool_choice(body, p, &none, e)) {
        json_decref(tools);
        goto fail;
    }
    /* generation refuses tools the model would never see; /apply-template
     * renders as Hugging Face does (the template leaves them out) */
    if (tools && generate && !ns_chat_template_has_tools(a)) {
        json_decref(tools);
        ns_http_error_set(e, 400, "tools", "tools_not_supported",
                          "this model's chat template does not support tools; send the request without 'tools'");
        goto fail;
    }
    p->tools_enabled = tools && !none;
    if (tools) json_object_set_new(ctx, "tools", tools);
    bool parallel = true;
    if (!ns_api_get_bool(body, "parallel_tool_calls", &parallel, e)) goto fail;
    p->single_call = !parallel;
    if (!thinking_switch(a, body, ctx, e)) goto fail;
    bool agp = true, cont = false;
    json_t *agp_v = json_object_get(body, "add_generation_prompt");
    if (!ns_api_get_bool(body, "add_generation_prompt", &agp, e)) goto fail;
    if (!ns_api_get_bool(body, "continue_final_message", &cont, e)) goto fail;
    if (cont && !continue_final(out_msgs, json_is_true(agp_v), p, e)) goto fail;
    if (cont) agp = false;
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(agp));
    const char *bos = ns_tokenizer_bos_token(a->tok), *eos = ns_tokenizer_eos_token(a->tok);
    if (bos) json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos) json_object_set_new(ctx, "eos_token", json_string(eos));
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) {
            fail_type(e, "chat_template_kwargs", "an object");
            goto fail;
        }
        const char *k;
        json_t *v;
        json_object_foreach(kw, k, v) {
            if (strcmp(k, "messages") == 0 || strcmp(k, "tools") == 0) continue;
            json_object_set(ctx, k, v);
        }
    }
    return ctx;
fail:
    json_decref(ctx);
    return NULL;
}

bool ns_chat_prompt_build(ns_api *a, json_t *body, bool tokenize, ns_chat_prompt *p, ns_http_error *e) {
    memset(p, 0, sizeof *p);
    if (!a->tmpl) {
        ns_http_error_set(e, 400, "messages", "no_chat_template",
                          "this model has no chat template; use /v1/completions with a raw prompt");
        return false;
    }
    json_t *ctx = build_context(a, body, tokenize, p, e);
    if (!ctx) {
        ns_chat_prompt_free(p); /* p needs no free after a failure */
        return false;
    }
    ns_error err = {0};
    ns_status rc = ns_template_render(a->tmpl, ctx, 0, &p->text, &p->len, &err);
    json_decref(ctx);
    if (rc != NS_OK) {
        int status = rc == NS_ERR_UNSUPPORTED || rc == NS_ERR_INTERNAL ? 500 : 400;
        ns_http_error_set(e, status, "messages", "template_error", "the chat template failed: %s", err.msg);
        p->text = NULL;
        ns_chat_prompt_free(p);
        return false;
    }
    if (p->final_content && !cut_after_final(p, e)) {
        ns_chat_prompt_free(p);
        return false;
    }
    if (tokenize) {
        rc = ns_tokenizer_encode_limit(a->tok, p->text, p->len, false, ns_api_prompt_limit(a), &p->ids, &p->n_ids,
                                       &p->too_long, &err);
        if (rc != NS_OK) {
            ns_http_error_from_status(e, rc, "messages", err.msg);
            p->ids = NULL;
            ns_chat_prompt_free(p);
            return false;
        }
    }
    return true;
}

void ns_chat_prompt_free(ns_chat_prompt *p) {
    free(p->text);
    free(p->ids);
    json_decref(p->final_content);
    memset(p, 0, sizeof *p);
}
