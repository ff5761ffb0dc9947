/* messages_conv.c — Anthropic Messages request -> chat request (see
 * messages_conv.h). */
#include "api/messages_conv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "util/buf.h"

#define MAX_MESSAGES 100000
#define MAX_TOOLS 256

static bool bad(ns_http_error *e, const char *param, const char *msg) {
    ns_http_error_set(e, 400, param, "invalid_request_error", "%s: %s", param, msg);
    return false;
}

/* The fields /v1/messages knows. Those marked ignored steer only the
 * hosted service (documented in docs/API.md); anything else is refused. */
static const char *const k_fields[] = {"model",       "messages",    "system",   "max_tokens",     "stop_sequences",
                                       "temperature", "top_p",       "top_k",    "stream",         "tools",
                                       "tool_choice", "thinking",    "metadata", "output_config", "context_management",
                                       "service_tier"};

static bool check_fields(json_t *body, ns_http_error *e) {
    const char *k = ns_api_unknown_key(body, k_fields, sizeof k_fields / sizeof k_fields[0]);
    if (!k) return true;
    char param[96];
    snprintf(param, sizeof param, "%.80s", k);
    ns_http_error_set(e, 400, param, "invalid_request_error", "%s: Extra inputs are not permitted", param);
    return false;
}

/* Text of a block list (text blocks only) or a string, for tool results:
 * a new JSON string, or NULL with e set. */
static json_t *result_text(json_t *c, const char *param, ns_http_error *e) {
    if (!c || json_is_null(c)) return json_string("");
    if (json_is_string(c)) return json_incref(c);
    if (!json_is_array(c)) return bad(e, param, "must be a string or an array of content blocks"), NULL;
    json_t *parts = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;
        json_t *tx = json_is_object(b) ? json_object_get(b, "text") : NULL;
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(tx)) {
            json_decref(parts);
            char p2[128];
            snprintf(p2, sizeof p2, "%s[%zu]", param, i);
            ns_http_error_set(e, 400, p2, "invalid_request_error",
                              "%s: only text blocks are supported in tool results (this model reads text only)", p2);
            return NULL;
        }
        json_array_append(parts, tx);
    }
    /* joined with newlines, as the chat path joins text parts */
    size_t total = 0;
    json_array_foreach(parts, i, b) total += json_string_length(b) + 1;
    char *buf = malloc(total + 1);
    if (!buf) {
        json_decref(parts);
        ns_http_error_set(e, 500, NULL, "api_error", "out of memory");
        return NULL;
    }
    size_t n = 0;
    json_array_foreach(parts, i, b) {
        if (i) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(b), json_string_length(b));
        n += json_string_length(b);
    }
    json_t *s = json_stringn(buf, n);
    free(buf);
    json_decref(parts);
    return s;
}

/* Appends the pending user text parts as one user message. */
static void flush_user(json_t *out, json_t **parts) {
    if (!*parts) return;
    if (json_array_size(*parts) > 0) json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", *parts));
    json_decref(*parts);
    *parts = NULL;
}

static bool user_message(json_t *content, size_t mi, json_t *out, ns_http_error *e) {
    char param[128];
    json_t *parts = NULL;
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, i);
        json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;
        if (!json_is_string(t)) {
            json_decref(parts);
            return bad(e, param, "must be a content block with a string 'type'");
        }
        const char *ty = json_string_value(t);
        if (strcmp(ty, "text") == 0) {
            json_t *tx = json_object_get(b, "text");
            if (!json_is_string(tx)) {
                json_decref(parts);
                return bad(e, param, "a text block needs a string 'text'");
            }
            if (!parts) parts = json_array();
            json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
        } else if (strcmp(ty, "tool_result") == 0) {
            flush_user(out, &parts);
            json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) return bad(e, param, "a tool_result block needs a string 'tool_use_id'");
            char p2[160];
            snprintf(p2, sizeof p2, "%s.content", param);
            json_t *txt = result_text(json_object_get(b, "content"), p2, e);
            if (!txt) return false;
            json_t *err = json_object_get(b, "is_error");
            if (err && !json_is_null(err) && !json_is_boolean(err)) {
                json_decref(txt);
                return bad(e, param, "'is_error' must be a boolean");
            }
            if (json_is_true(err)) {
                /* the chat templates have no error flag: say it in the text */
                char *s = NULL;
                if (asprintf(&s, "Error: %s", json_string_value(txt)) < 0) s = NULL;
                json_decref(txt);
                txt = s ? json_string(s) : NULL;
                free(s);
                if (!txt) return bad(e, param, "the tool result contains a NUL character");
            }
            json_array_append_new(out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", txt));
        } else {
            json_decref(parts);
            ns_http_error_set(e, 400, param, "invalid_request_error",
                              "%s: content blocks of type '%.40s' are not supported in user messages (text and "
                              "tool_result are)",
                              param, ty);
            return false;
        }
    }
    flush_user(out, &parts);
    return true;
}

/* Appends tx to b, after a newline when b already holds a part (parts are
 * joined with newlines, as the chat path joins text parts). A buffer, not
 * string concatenation: many blocks must cost linear time. */
static bool append_part(ns_buf *b, bool *any, json_t *tx) {
    if (*any && ns_buf_putc(b, '\n') != NS_OK) return false;
    *any = true;
    return ns_buf_append(b, json_string_value(tx), json_string_length(tx)) == NS_OK;
}

static json_t *buf_string(const ns_buf *b) { return json_stringn(b->data ? b->data : "", b->len); }

static bool assistant_message(json_t *content, size_t mi, json_t *out, ns_http_error *e) {
    char param[128];
    ns_buf text, reasoning;
    ns_buf_init(&text, 0);
    ns_buf_init(&reasoning, 0);
    bool any_text = false, any_reasoning = false;
    json_t *calls = NULL;
    size_t i;
    json_t *b;
    bool ok = true;
    json_array_foreach(content, i, b) {
        snprintf(param, sizeof param, "messages[%zu].content[%zu]", mi, i);
        json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL;
        if (!json_is_string(t)) {
            ok = bad(e, param, "must be a content block with a string 'type'");
            break;
        }
        const char *ty = json_string_value(t);
        if (strcmp(ty, "text") == 0 || strcmp(ty, "thinking") == 0) {
            const bool th = ty[1] == 'h';
            json_t *tx = json_object_get(b, th ? "thinking" : "text");
            if (!json_is_string(tx)) {
                ok = bad(e, param, th ? "a thinking block needs a string 'thinking'" : "a text block needs a string 'text'");
                break;
            }
            if (!append_part(th ? &reasoning : &text, th ? &any_reasoning : &any_text, tx)) {
                ns_http_error_set(e, 500, NULL, "api_error", "out of memory");
                ok = false;
                break;
            }
        } else if (strcmp(ty, "redacted_thinking") == 0) {
            continue; /* opaque data: nothing a local model can read */
        } else if (strcmp(ty, "tool_use") == 0) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *in = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_is_object(in)) {
                ok = bad(e, param, "a tool_use block needs string 'id' and 'name' and an object 'input'");
                break;
            }
            if (!calls) calls = json_array();
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", in));
        } else {
            ns_http_error_set(e, 400, param, "invalid_request_error",
                              "%s: content blocks of type '%.40s' are not supported in assistant messages (text, "
                              "thinking, redacted_thinking and tool_use are)",
                              param, ty);
            ok = false;
            break;
        }
    }
    if (ok) {
        json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", buf_string(&text));
        if (any_reasoning) json_object_set_new(m, "reasoning_content", buf_string(&reasoning));
        if (calls) json_object_set(m, "tool_calls", calls);
        ok = m != NULL;
        if (!ok) bad(e, param, "contains a NUL character");
        else json_array_append_new(out, m);
    }
    ns_buf_free(&text);
    ns_buf_free(&reasoning);
    json_decref(calls);
    return ok;
}

static bool convert_messages(json_t *body, json_t *out, ns_http_error *e) {
    json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        if (json_is_string(sys)) {
            json_array_append_new(out, json_pack("{s:s,s:O}", "role", "system", "content", sys));
        } else if (json_is_array(sys)) {
            json_t *parts = json_array();
            size_t i;
            json_t *b;
            json_array_foreach(sys, i, b) {
                json_t *t = json_is_object(b) ? json_object_get(b, "type") : NULL, *tx = json_object_get(b, "text");
                if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(tx)) {
                    json_decref(parts);
                    char p[64];
                    snprintf(p, sizeof p, "system[%zu]", i);
                    return bad(e, p, "system blocks must be text blocks");
                }
                json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
            }
            json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", parts));
        } else {
            return bad(e, "system", "must be a string or an array of text blocks");
        }
    }
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) return bad(e, "messages", msgs ? "must be an array" : "Field required");
    if (json_array_size(msgs) == 0) return bad(e, "messages", "at least one message is required");
    if (json_array_size(msgs) > MAX_MESSAGES) return bad(e, "messages", "too many messages");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        if (!json_is_string(role)) return bad(e, param, "must be an object with a string 'role'");
        const char *r = json_string_value(role);
        json_t *c = json_object_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (!json_is_string(c) && !json_is_array(c)) return bad(e, param, "must be a string or an array of content blocks");
        if (strcmp(r, "system") == 0) {
            /* mid-conversation system content (Claude Code) */
            json_t *txt = result_text(c, param, e);
            if (!txt) return false;
            json_array_append_new(out, json_pack("{s:s,s:o}", "role", "system", "content", txt));
            continue;
        }
        if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
            snprintf(param, sizeof param, "messages[%zu].role", i);
            return bad(e, param, "must be 'user' or 'assistant' (or 'system')");
        }
        if (json_is_string(c)) {
            json_array_append_new(out, json_pack("{s:s,s:O}", "role", r, "content", c));
            continue;
        }
        if (!(r[0] == 'u' ? user_message(c, i, out, e) : assistant_message(c, i, out, e))) return false;
    }
    return true;
}

static void note_ignored(ns_msgs_conv *c, const char *name) {
    size_t n = strlen(c->ignored_tools);
    /* names are echoed in a header: keep printable ASCII only */
    char clean[96];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof clean; p++)
        clean[k++] = (*p >= 0x21 && *p < 0x7f && *p != ',') ? *p : '_';
    clean[k] = 0;
    if (n + k + 2 < sizeof c->ignored_tools)
        snprintf(c->ignored_tools + n, sizeof c->ignored_tools - n, "%s%s", n ? "," : "", clean);
    c->n_ignored++;
}

static bool convert_tools(json_t *body, ns_msgs_conv *c, ns_http_error *e) {
    json_t *tools = json_object_get(body, "tools");
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return bad(e, "tools", "must be an array");
    if (json_array_size(tools) > MAX_TOOLS) return bad(e, "tools", "at most 256 tools are supported");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *name = json_is_object(t) ? json_object_get(t, "name") : NULL;
        if (!json_is_string(name) || json_string_length(name) == 0) {
            json_decref(out);
            return bad(e, param, "must be an object with a non-empty string 'name'");
        }
        json_t *type = json_object_get(t, "type");
        if (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "custom") != 0)) {
            note_ignored(c, json_string_value(name)); /* hosted or Anthropic-defined: no schema to offer */
            continue;
        }
        json_t *schema = json_object_get(t, "input_schema");
        if (!json_is_object(schema)) {
            json_decref(out);
            snprintf(param, sizeof param, "tools[%zu].input_schema", i);
            return bad(e, param, "Field required (an object)");
        }
        /* the key order of OpenAI's tools (name, description, parameters):
         * templates print them with tojson, so it decides the tokens */
        json_t *fn = json_pack("{s:O}", "name", name);
        json_t *d = json_object_get(t, "description");
        if (json_is_string(d)) json_object_set(fn, "description", d);
        json_object_set(fn, "parameters", schema);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    if (json_array_size(out) > 0) json_object_set(c->chat, "tools", out);
    json_decref(out);
    return true;
}

static bool convert_choice(json_t *body, ns_msgs_conv *c, ns_http_error *e) {
    json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc)) return true;
    json_t *type = json_is_object(tc) ? json_object_get(tc, "type") : NULL;
    if (!json_is_string(type)) return bad(e, "tool_choice", "must be an object with a string 'type'");
    const char *t = json_string_value(type);
    json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp))
        return bad(e, "tool_choice.disable_parallel_tool_use", "must be a boolean");
    c->single_call = json_is_true(dp);
    if (c->single_call) json_object_set_new(c->chat, "parallel_tool_calls", json_false());
    if (strcmp(t, "auto") == 0) {
        c->choice = NS_MSGS_CHOICE_AUTO;
        json_object_set_new(c->chat, "tool_choice", json_string("auto"));
    } else if (strcmp(t, "any") == 0) {
        c->choice = NS_MSGS_CHOICE_ANY;
        json_object_set_new(c->chat, "tool_choice", json_string("required"));
    } else if (strcmp(t, "none") == 0) {
        c->choice = NS_MSGS_CHOICE_NONE;
        json_object_set_new(c->chat, "tool_choice", json_string("none"));
    } else if (strcmp(t, "tool") == 0) {
        json_t *name = json_object_get(tc, "name");
        if (!json_is_string(name)) return bad(e, "tool_choice.name", "Field required (a string)");
        c->choice = NS_MSGS_CHOICE_TOOL;
        c->choice_name = json_string_value(name);
        json_object_set_new(c->chat, "tool_choice",
                            json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name));
    } else {
        return bad(e, "tool_choice.type", "must be one of auto, any, tool, none");
    }
    if (c->choice != NS_MSGS_CHOICE_AUTO && c->choice != NS_MSGS_CHOICE_NONE && !json_object_get(c->chat, "tools"))
        return bad(e, "tool_choice", "requires at least one tool the model can call");
    return true;
}

static bool convert_thinking(json_t *body, ns_msgs_conv *c, bool count_only, ns_http_error *e) {
    json_t *th = json_object_get(body, "thinking");
    if (!th || json_is_null(th)) return true;
    json_t *type = json_is_object(th) ? json_object_get(th, "type") : NULL;
    if (!json_is_string(type)) return bad(e, "thinking", "must be an object with a string 'type'");
    const char *t = json_string_value(type);
    if (strcmp(t, "disabled") == 0) {
        c->thinking = 0;
    } else if (strcmp(t, "adaptive") == 0) {
        c->thinking = 1; /* the model decides how much: Qwen3 with thinking on does */
    } else if (strcmp(t, "enabled") == 0) {
        json_t *b = json_object_get(th, "budget_tokens");
        if (!json_is_integer(b)) return bad(e, "thinking.budget_tokens", "Field required (an integer)");
        if (json_integer_value(b) < 1024) return bad(e, "thinking.budget_tokens", "must be at least 1024");
        if (!count_only && json_integer_value(b) >= c->max_tokens)
            return bad(e, "thinking.budget_tokens", "must be less than max_tokens");
        if (json_integer_value(b) > INT32_MAX) return bad(e, "thinking.budget_tokens", "is too large");
        c->budget_tokens = (int32_t)json_integer_value(b);
        c->thinking = 1;
    } else {
        return bad(e, "thinking.type", "must be one of enabled, adaptive, disabled");
    }
    json_object_set_new(c->chat, "enable_thinking", json_boolean(c->thinking));
    return true;
}

static bool get_num(json_t *body, const char *k, double lo, double hi, double *out, ns_http_error *e) {
    json_t *v = json_object_get(body, k);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return bad(e, k, "must be a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        ns_http_error_set(e, 400, k, "invalid_request_error", "%s: must be between %g and %g", k, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

static bool sampling(json_t *body, ns_msgs_conv *c, ns_http_error *e) {
    json_t *mt = json_object_get(body, "max_tokens");
    if (!mt) return bad(e, "max_tokens", "Field required");
    if (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > INT32_MAX)
        return bad(e, "max_tokens", "must be a positive integer");
    c->max_tokens = json_integer_value(mt);
    if (!get_num(body, "temperature", 0.0, 1.0, &c->temperature, e)) return false;
    if (!get_num(body, "top_p", 0.0, 1.0, &c->top_p, e)) return false;
    if (c->top_p <= 0.0) return bad(e, "top_p", "must be greater than 0");
    json_t *tk = json_object_get(body, "top_k");
    if (tk && !json_is_null(tk)) {
        if (!json_is_integer(tk) || json_integer_value(tk) < 0 || json_integer_value(tk) > INT32_MAX)
            return bad(e, "top_k", "must be a non-negative integer");
        c->top_k = json_integer_value(tk);
    }
    json_t *st = json_object_get(body, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st)) return bad(e, "stream", "must be a boolean");
    c->stream = json_is_true(st);
    json_t *ss = json_object_get(body, "stop_sequences");
    if (ss && !json_is_null(ss)) {
        if (!json_is_array(ss)) return bad(e, "stop_sequences", "must be an array of strings");
        if (json_array_size(ss) > NS_STOP_MAX) return bad(e, "stop_sequences", "at most 16 stop sequences are supported");
        size_t i;
        json_t *s;
        json_array_foreach(ss, i, s) {
            if (!json_is_string(s) || json_string_length(s) > NS_STOP_MAX_LEN ||
                strlen(json_string_value(s)) != json_string_length(s))
                return bad(e, "stop_sequences", "each stop sequence must be a string of at most 1024 bytes");
            c->stops[c->n_stops++] = json_string_value(s);
        }
    }
    return true;
}

static bool output_config(json_t *body, ns_msgs_conv *c, ns_http_error *e) {
    json_t *oc = json_object_get(body, "output_config");
    if (!oc || json_is_null(oc)) return true;
    if (!json_is_object(oc)) return bad(e, "output_config", "must be an object");
    const char *k;
    json_t *v;
    json_object_foreach(oc, k, v) {
        if (strcmp(k, "effort") == 0) continue; /* steers the hosted model's spend: ignored by design */
        if (strcmp(k, "format") == 0 && !json_is_null(v)) {
            json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
            json_t *schema = json_is_object(v) ? json_object_get(v, "schema") : NULL;
            if (!json_is_string(t) || strcmp(json_string_value(t), "json_schema") != 0 || !json_is_object(schema))
                return bad(e, "output_config.format", "must be {\"type\": \"json_schema\", \"schema\": {...}}");
            c->schema = schema;
            continue;
        }
        if (strcmp(k, "format") == 0) continue;
        char param[96];
        snprintf(param, sizeof param, "output_config.%.60s", k);
        return bad(e, param, "Extra inputs are not permitted");
    }
    return true;
}

bool ns_msgs_convert(json_t *body, bool count_only, ns_msgs_conv *c, ns_http_error *e) {
    memset(c, 0, sizeof *c);
    c->temperature = c->top_p = 1.0;
    c->thinking = -1;
    if (!check_fields(body, e)) return false;
    json_t *model = json_object_get(body, "model");
    if (!json_is_string(model)) return bad(e, "model", model ? "must be a string" : "Field required");
    json_t *md = json_object_get(body, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) return bad(e, "metadata", "must be an object");
    if (!count_only && !sampling(body, c, e)) return false;
    c->chat = json_object();
    json_t *msgs = json_array();
    json_object_set_new(c->chat, "messages", msgs);
    if (!convert_messages(body, msgs, e) || !convert_tools(body, c, e) || !convert_choice(body, c, e) ||
        !convert_thinking(body, c, count_only, e) || !output_config(body, c, e)) {
        ns_msgs_conv_free(c);
        return false;
    }
    /* a final assistant message is a prefill: the reply continues it */
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (last && strcmp(json_string_value(json_object_get(last, "role")), "assistant") == 0) {
        const bool calls = json_object_get(last, "tool_calls") != NULL;
        if (calls || json_string_length(json_object_get(last, "content")) == 0) {
            ns_msgs_conv_free(c);
            return bad(e, "messages", calls ? "tool_use blocks must be followed by a user message with their tool_result "
                                              "blocks"
                                            : "the final assistant message (a prefill) must hold text");
        }
        c->prefill = true;
        json_object_set_new(c->chat, "continue_final_message", json_true());
    }
    return true;
}

void ns_msgs_conv_free(ns_msgs_conv *c) {
    json_decref(c->chat);
    c->chat = NULL;
}
