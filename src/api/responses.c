/* responses.c — POST /v1/responses, the OpenAI Responses API (see
 * responses.h). */
#include "api/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/chat.h"
#include "api/gen.h"
#include "api/responses_conv.h"
#include "api/structured.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

enum { IT_NONE = 0, IT_REASONING, IT_MESSAGE, IT_CALL };

typedef struct resp_job {
    ns_gen_job base; /* first: the shared path allocates and frees the job */
    ns_resp_conv conv;
    ns_chat_prompt cp;
    /* streaming state */
    long seq;            /* sequence_number of the next event */
    int n_items;         /* output items opened (the next output_index) */
    int open;            /* the open item's kind (IT_*) */
    char open_id[48];
    size_t open_from;    /* where the open item's text starts (reasoning / content) */
    size_t sent_reasoning, sent_content;
    int sent_calls;
    size_t sent_args[NS_TOOL_MAX_CALLS];
    json_t *items;       /* the finished output items, for response.completed */
    ns_buf custom;       /* the open custom call's input decoded so far */
} resp_job;

/* ---- shapes ---- */

static json_t *usage_json(ns_gen_job *gj) {
    const ns_gen *g = &gj->g;
    size_t n_reason = 0;
    if (g->reasoning.len) {
        int32_t *ids = NULL;
        ns_error err;
        if (ns_tokenizer_encode(gj->a->tok, g->reasoning.data, g->reasoning.len, false, &ids, &n_reason, &err) != NS_OK)
            n_reason = 0;
        free(ids);
    }
    if (n_reason > (size_t)g->n_ids) n_reason = (size_t)g->n_ids;
    return json_pack("{s:i,s:{s:i},s:i,s:{s:I},s:i}", "input_tokens", g->n_prompt, "input_tokens_details",
                     "cached_tokens", g->res.n_cached, "output_tokens", g->n_ids, "output_tokens_details",
                     "reasoning_tokens", (json_int_t)n_reason, "total_tokens", g->n_prompt + g->n_ids);
}

static json_t *echo(json_t *body, const char *key, json_t *dflt) {
    json_t *v = json_object_get(body, key);
    if (v && !json_is_null(v)) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

/* The response object; status "in_progress" / "completed" / "incomplete";
 * output and usage are stolen (usage may be NULL: null). */
static json_t *response_object(resp_job *j, const char *status, json_t *output, json_t *usage) {
    ns_gen_job *gj = &j->base;
    json_t *b = gj->body;
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:b,s:n,s:n,s:s,s:o}", "id", gj->id, "object", "response", "created_at",
                          (json_int_t)gj->created, "status", status, "background", 0, "error", "incomplete_details",
                          "model", gj->a->model_name, "output", output);
    if (!r) {
        json_decref(usage);
        return NULL;
    }
    if (strcmp(status, "incomplete") == 0)
        json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    json_object_set_new(r, "instructions", echo(b, "instructions", json_null()));
    json_object_set_new(r, "max_output_tokens", echo(b, "max_output_tokens", json_null()));
    json_object_set_new(r, "metadata", echo(b, "metadata", json_object()));
    json_object_set_new(r, "parallel_tool_calls", echo(b, "parallel_tool_calls", json_true()));
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "reasoning", echo(b, "reasoning", json_pack("{s:n,s:n}", "effort", "summary")));
    json_object_set_new(r, "store", json_false()); /* stateless: nothing is kept */
    json_object_set_new(r, "temperature", json_real(j->conv.temperature));
    json_object_set_new(r, "text", echo(b, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
    json_object_set_new(r, "tool_choice", echo(b, "tool_choice", json_string("auto")));
    json_object_set_new(r, "tools", echo(b, "tools", json_array()));
    json_object_set_new(r, "top_p", json_real(j->conv.top_p));
    json_object_set_new(r, "truncation", json_string("disabled"));
    json_object_set_new(r, "usage", usage ? usage : json_null());
    json_object_set_new(r, "user", echo(b, "user", json_null()));
    return r;
}

static json_t *reasoning_item(resp_job *j, const char *id, const char *text, size_t n, const char *status) {
    json_t *it = json_pack("{s:s,s:s,s:[],s:[{s:s,s:s%}],s:s}", "id", id, "type", "reasoning", "summary", "content",
                           "type", "reasoning_text", "text", text ? text : "", n, "status", status);
    if (it && j->conv.include_reasoning) {
        char *enc = NULL;
        if (asprintf(&enc, "%s%.*s", NS_RESP_REASONING_TAG, (int)n, text ? text : "") >= 0) {
            json_object_set_new(it, "encrypted_content", json_string(enc));
            free(enc);
        }
    }
    return it;
}

static json_t *message_item(const char *id, const char *text, size_t n, const char *status) {
    if (strcmp(status, "in_progress") == 0) /* as OpenAI announces it: no part yet */
        return json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", id, "type", "message", "status", status, "role", "assistant",
                         "content");
    return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:s%,s:[],s:[]}]}", "id", id, "type", "message", "status", status,
                     "role", "assistant", "content", "type", "output_text", "text", text ? text : "", n,
                     "annotations", "logprobs");
}

/* A custom tool's input: the string the model wrote as {"input": ...}. */
static json_t *custom_input(const ns_tool_call *c) {
    json_error_t je;
    json_t *a = c->args.len ? json_loadb(c->args.data, c->args.len, 0, &je) : NULL;
    json_t *in = json_is_object(a) ? json_object_get(a, "input") : NULL;
    json_t *r;
    if (json_is_string(in)) {
        r = json_incref(in);
    } else if (in) {
        char *s = json_dumps(in, JSON_COMPACT | JSON_ENCODE_ANY);
        r = json_string(s ? s : "");
        free(s);
    } else {
        r = json_stringn(c->args.data ? c->args.data : "", c->args.len);
    }
    json_decref(a);
    return r ? r : json_string("");
}

static bool is_custom(resp_job *j, const ns_tool_call *c, json_t **ns) {
    json_t *info = json_object_get(j->conv.tool_info, c->name.data ? c->name.data : "");
    *ns = json_object_get(info, "namespace");
    return json_is_true(json_object_get(info, "custom"));
}

/* A call's item; arguments/input as far as they are known now. */
static json_t *call_item(resp_job *j, const ns_tool_call *c, const char *id, bool done) {
    json_t *ns;
    const bool custom = is_custom(j, c, &ns);
    const char *name = c->name.data ? c->name.data : "";
    json_t *it;
    if (custom)
        it = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "id", id, "type", "custom_tool_call", "call_id", c->id, "name",
                       name, "input", done ? custom_input(c) : json_string(""), "status",
                       done ? "completed" : "in_progress");
    else
        it = json_pack("{s:s,s:s,s:s,s:s,s:s%,s:s}", "id", id, "type", "function_call", "call_id", c->id, "name", name,
                       "arguments", done && c->args.data ? c->args.data : "", done ? c->args.len : 0, "status",
                       done ? "completed" : "in_progress");
    if (it && json_is_string(ns)) json_object_set(it, "namespace", ns);
    return it;
}

static const char *final_status(const ns_gen *g, bool streaming) {
    return strcmp(ns_gen_finish_reason(g, streaming), "length") == 0 ? "incomplete" : "completed";
}

/* ---- the request ---- */

static bool resp_params(ns_gen_job *gj, ns_http_error *e) {
    resp_job *j = (resp_job *)gj;
    if (!ns_resp_convert(gj->body, &j->conv, e)) return false;
    ns_api_gen_params *p = &gj->gp;
    memset(p, 0, sizeof *p);
    ns_sampling_params *sp = &p->rp.sampling;
    *sp = ns_sampling_default();
    sp->temperature = (float)j->conv.temperature;
    sp->top_p = (float)j->conv.top_p;
    sp->seed = gj->a->random_seed ? gj->a->random_seed() : 0;
    p->rp.max_tokens = (int32_t)j->conv.max_tokens;
    p->stream = j->conv.stream;
    ns_error err;
    if (ns_sampling_validate(sp, &err) != NS_OK) {
        ns_http_error_set(e, 400, NULL, "invalid_value", "%s", err.msg);
        return false;
    }
    return true;
}

static bool resp_prepare(ns_gen_job *gj, ns_gen_opts *o, ns_http_error *e) {
    resp_job *j = (resp_job *)gj;
    if (j->conv.n_ignored)
        NS_INFO("responses: hosted tools not offered to the model (they cannot run here): %s", j->conv.ignored_tools);
    if (j->conv.n_ignored)
        snprintf(gj->headers, sizeof gj->headers, "X-Nightshift-Ignored-Tools: %s", j->conv.ignored_tools);
    if (!ns_chat_gen_prepare(gj, j->conv.chat, &j->cp, o, e)) return false;
    if (j->conv.max_calls > 0) o->max_calls = j->conv.max_calls;
    ns_struct_spec spec = {0};
    if ((j->conv.schema || j->conv.json_object) && j->conv.choice >= NS_RESP_CHOICE_REQUIRED) {
        ns_http_error_set(e, 400, "text.format", "invalid_value",
                          "'text.format' cannot be combined with tool_choice required or a named tool");
        return false;
    }
    if (j->conv.choice == NS_RESP_CHOICE_REQUIRED) {
        spec.kind = NS_STRUCT_TOOL_REQUIRED;
        spec.tools = json_object_get(j->conv.chat, "tools");
    } else if (j->conv.choice == NS_RESP_CHOICE_NAMED) {
        spec.kind = NS_STRUCT_TOOL_NAMED;
        spec.tools = json_object_get(j->conv.chat, "tools");
        spec.tool_name = j->conv.choice_name;
    } else if (j->conv.schema) {
        spec.kind = NS_STRUCT_JSON_SCHEMA;
        spec.schema = j->conv.schema;
    } else if (j->conv.json_object) {
        spec.kind = NS_STRUCT_JSON_OBJECT;
    }
    return ns_structured_attach(gj->a, &spec, o, e);
}

static void resp_release(ns_gen_job *gj) {
    resp_job *j = (resp_job *)gj;
    ns_chat_prompt_free(&j->cp);
    ns_resp_conv_free(&j->conv);
    json_decref(j->items);
    ns_buf_free(&j->custom);
}

static json_t *resp_whole(ns_gen_job *gj) {
    resp_job *j = (resp_job *)gj;
    ns_gen *g = &gj->g;
    const bool calls = strcmp(ns_gen_finish_reason(g, false), "tool_calls") == 0;
    json_t *out = json_array();
    char id[48];
    if (g->reasoning.len) {
        ns_api_random_id("rs_", id, sizeof id);
        json_array_append_new(out, reasoning_item(j, id, g->reasoning.data, g->reasoning.len, "completed"));
    }
    /* without valid calls the whole output is text, tags and all */
    const ns_buf *text = calls ? &g->tp.content : &g->content;
    if (text->len) {
        ns_api_random_id("msg_", id, sizeof id);
        json_array_append_new(out, message_item(id, text->data, text->len, "completed"));
    }
    for (int i = 0; calls && i < g->tp.n_calls; i++) {
        ns_tool_call *c = &g->tp.calls[i];
        json_t *ns;
        ns_api_random_id(is_custom(j, c, &ns) ? "ctc_" : "fc_", id, sizeof id);
        json_array_append_new(out, call_item(j, c, id, true));
    }
    return response_object(j, final_status(g, false), out, usage_json(gj));
}

/* ---- streaming ---- */

static ns_status event(resp_job *j, ns_buf *out, const char *type, json_t *data) {
    if (data) {
        json_object_set_new(data, "type", json_string(type));
        json_object_set_new(data, "sequence_number", json_integer(j->seq++));
    }
    return ns_gen_sse_event(out, type, data);
}

static ns_status close_item(resp_job *j, ns_buf *out) {
    ns_gen *g = &j->base.g;
    const int idx = j->n_items - 1;
    json_t *item = NULL;
    ns_status rc = NS_OK;
    if (j->open == IT_REASONING) {
        const char *t = g->reasoning.data + j->open_from;
        const size_t n = j->sent_reasoning - j->open_from;
        rc = event(j, out, "response.reasoning_text.done",
                   json_pack("{s:s,s:i,s:i,s:s%}", "item_id", j->open_id, "output_index", idx, "content_index", 0,
                             "text", t, n));
        item = reasoning_item(j, j->open_id, t, n, "completed");
    } else if (j->open == IT_MESSAGE) {
        const ns_buf *c = ns_gen_content(g);
        const char *t = c->data + j->open_from;
        const size_t n = j->sent_content - j->open_from;
        rc = event(j, out, "response.output_text.done",
                   json_pack("{s:s,s:i,s:i,s:s%,s:[]}", "item_id", j->open_id, "output_index", idx, "content_index", 0,
                             "text", t, n, "logprobs"));
        if (rc == NS_OK)
            rc = event(j, out, "response.content_part.done",
                       json_pack("{s:s,s:i,s:i,s:{s:s,s:s%,s:[]}}", "item_id", j->open_id, "output_index", idx,
                                 "content_index", 0, "part", "type", "output_text", "text", t, n, "annotations"));
        item = message_item(j->open_id, t, n, "completed");
    } else if (j->open == IT_CALL) {
        const ns_tool_call *c = &g->tp.calls[j->sent_calls - 1];
        json_t *ns;
        item = call_item(j, c, j->open_id, true);
        if (is_custom(j, c, &ns)) {
            json_t *in = custom_input(c);
            /* the rest of the input past what the deltas carried (all of it
             * when it could not be decoded as it grew) */
            const size_t sent = j->sent_args[j->sent_calls - 1];
            const char *full = json_string_value(in);
            const size_t fl = json_string_length(in);
            if (sent <= fl && sent <= j->custom.len && memcmp(full, j->custom.data ? j->custom.data : "", sent) == 0 &&
                fl > sent)
                rc = event(j, out, "response.custom_tool_call_input.delta",
                           json_pack("{s:s,s:i,s:s%}", "item_id", j->open_id, "output_index", idx, "delta", full + sent,
                                     fl - sent));
            if (rc == NS_OK)
                rc = event(j, out, "response.custom_tool_call_input.done",
                           json_pack("{s:s,s:i,s:O}", "item_id", j->open_id, "output_index", idx, "input", in));
            json_decref(in);
        } else {
            rc = event(j, out, "response.function_call_arguments.done",
                       json_pack("{s:s,s:i,s:s,s:s%}", "item_id", j->open_id, "output_index", idx, "name",
                                 c->name.data ? c->name.data : "", "arguments", c->args.data ? c->args.data : "",
                                 c->args.len));
        }
    } else {
        return NS_OK;
    }
    j->open = IT_NONE;
    if (!item) return NS_ERR_NOMEM;
    json_array_append(j->items, item);
    if (rc == NS_OK) rc = event(j, out, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    else json_decref(item);
    return rc;
}

/* Opens an output item (closing the open one); item is stolen. */
static ns_status open_item(resp_job *j, ns_buf *out, int kind, const char *id, json_t *item) {
    ns_status rc = close_item(j, out);
    if (rc != NS_OK) {
        json_decref(item);
        return rc;
    }
    j->open = kind;
    snprintf(j->open_id, sizeof j->open_id, "%s", id);
    const int idx = j->n_items++;
    rc = event(j, out, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", idx, "item", item));
    if (rc == NS_OK && kind == IT_MESSAGE)
        rc = event(j, out, "response.content_part.added",
                   json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", id, "output_index", idx, "content_index", 0,
                             "part", "type", "output_text", "text", "", "annotations"));
    return rc;
}

static ns_status text_delta(resp_job *j, ns_buf *out, int kind, const ns_buf *b, size_t *sent) {
    const size_t from = *sent;
    json_t *s;
    ns_status rc = ns_gen_new_text(b, sent, &s);
    if (rc != NS_OK || !s) return rc;
    if (j->open != kind) {
        char id[48];
        ns_api_random_id(kind == IT_REASONING ? "rs_" : "msg_", id, sizeof id);
        rc = open_item(j, out, kind, id,
                       kind == IT_REASONING ? reasoning_item(j, id, "", 0, "in_progress")
                                            : message_item(id, "", 0, "in_progress"));
        /* reasoning_item's encrypted_content of an empty text is dropped by the done item */
        j->open_from = from;
    }
    if (rc != NS_OK) {
        json_decref(s);
        return rc;
    }
    const int idx = j->n_items - 1;
    if (kind == IT_REASONING)
        return event(j, out, "response.reasoning_text.delta",
                     json_pack("{s:s,s:i,s:i,s:o}", "item_id", j->open_id, "output_index", idx, "content_index", 0,
                               "delta", s));
    return event(j, out, "response.output_text.delta",
                 json_pack("{s:s,s:i,s:i,s:o,s:[]}", "item_id", j->open_id, "output_index", idx, "content_index", 0,
                           "delta", s, "logprobs"));
}

static ns_status args_delta(resp_job *j, ns_buf *out, int i) {
    const ns_tool_call *c = &j->base.g.tp.calls[i];
    json_t *ns;
    json_t *a;
    if (is_custom(j, c, &ns)) {
        /* the input string decoded as it grows (its JSON escapes resolved) */
        if (!ns_resp_custom_input_prefix(c->args.data ? c->args.data : "", c->args.len, &j->custom)) return NS_OK;
        ns_status rc = ns_gen_new_text(&j->custom, &j->sent_args[i], &a);
        if (rc != NS_OK || !a) return rc;
        return event(j, out, "response.custom_tool_call_input.delta",
                     json_pack("{s:s,s:i,s:o}", "item_id", j->open_id, "output_index", j->n_items - 1, "delta", a));
    }
    ns_status rc = ns_gen_new_text(&c->args, &j->sent_args[i], &a);
    if (rc != NS_OK || !a) return rc;
    return event(j, out, "response.function_call_arguments.delta",
                 json_pack("{s:s,s:i,s:o}", "item_id", j->open_id, "output_index", j->n_items - 1, "delta", a));
}

static ns_status resp_start(ns_gen_job *gj, ns_buf *out) {
    resp_job *j = (resp_job *)gj;
    j->items = json_array();
    ns_buf_init(&j->custom, 0);
    ns_status rc = event(j, out, "response.created",
                         json_pack("{s:o}", "response", response_object(j, "in_progress", json_array(), NULL)));
    if (rc == NS_OK)
        rc = event(j, out, "response.in_progress",
                   json_pack("{s:o}", "response", response_object(j, "in_progress", json_array(), NULL)));
    return rc;
}

/* The same order rules as the Anthropic stream (messages.c). */
static ns_status resp_delta(ns_gen_job *gj, ns_buf *out) {
    resp_job *j = (resp_job *)gj;
    ns_gen *g = &gj->g;
    ns_status rc = text_delta(j, out, IT_REASONING, &g->reasoning, &j->sent_reasoning);
    if (rc == NS_OK && j->open == IT_CALL) rc = args_delta(j, out, j->sent_calls - 1);
    if (rc == NS_OK) rc = text_delta(j, out, IT_MESSAGE, ns_gen_content(g), &j->sent_content);
    for (int i = j->sent_calls; rc == NS_OK && g->use_tools && i < g->tp.n_calls; i++) {
        const ns_tool_call *c = &g->tp.calls[i];
        json_t *ns;
        char id[48];
        ns_api_random_id(is_custom(j, c, &ns) ? "ctc_" : "fc_", id, sizeof id);
        rc = open_item(j, out, IT_CALL, id, call_item(j, c, id, false));
        j->sent_calls = i + 1;
        if (rc == NS_OK) rc = args_delta(j, out, i);
    }
    return rc;
}

static ns_status resp_end(ns_gen_job *gj, ns_buf *out, ns_http_error *err) {
    resp_job *j = (resp_job *)gj;
    if (err) {
        /* as OpenAI ends a stream whose generation failed: response.failed
         * with the error in the response (clients such as Codex act on it;
         * what was generated before is in output) */
        NS_WARN("responses %s: the stream ends with an error: %s", gj->id, err->message);
        ns_status rc = close_item(j, out);
        json_t *r = response_object(j, "failed", j->items ? json_incref(j->items) : json_array(), NULL);
        if (r)
            json_object_set_new(r, "error", json_pack("{s:s,s:s}", "code", err->code[0] ? err->code : "server_error",
                                                      "message", err->message));
        if (rc == NS_OK) rc = event(j, out, "response.failed", json_pack("{s:o}", "response", r));
        else json_decref(r);
        return rc;
    }
    ns_status rc = close_item(j, out);
    const char *status = final_status(&gj->g, true);
    if (rc == NS_OK)
        rc = event(j, out, strcmp(status, "completed") == 0 ? "response.completed" : "response.incomplete",
                   json_pack("{s:o}", "response", response_object(j, status, json_incref(j->items), usage_json(gj))));
    return rc;
}

static const ns_gen_endpoint k_responses = {
    .job_size = sizeof(resp_job),
    .chat = true,
    .kind = "responses",
    .id_prefix = "resp_",
    .object = "response",
    .chunk_object = "response",
    .whole_key = "output",
    .delta_key = "delta",
    .prompt_param = "input",
    .prepare = resp_prepare,
    .stream_start = resp_start,
    .stream_delta = resp_delta,
    .release = resp_release,
    .parse_params = resp_params,
    .stream_end = resp_end,
    .whole_response = resp_whole,
};

void ns_api_responses(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_gen_handle(&k_responses, ud, req, resp);
}
