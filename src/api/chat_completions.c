/* chat_completions.c — POST /v1/chat/completions, streaming and not.
 *
 * The shared request path is ns_gen_handle (gen.h); this file adds what is
 * chat's own: the prompt is the rendered chat template (chat.h), the
 * output is split into reasoning_content, content and tool calls, and
 * logprobs come as {"content": [...]}. Streaming responses are OpenAI
 * chat.completion.chunk events: a first chunk with the role, then
 * reasoning_content / content / tool_calls deltas (a call's id and name
 * first, then its arguments as they are generated), a last chunk with
 * finish_reason, an optional usage chunk, and [DONE]. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/chat.h"
#include "api/gen.h"
#include "api/structured.h"

typedef struct chat_job {
    ns_gen_job base; /* first: the shared path allocates and frees the job */
    ns_chat_prompt cp;
    /* streaming cursors */
    size_t sent_reasoning, sent_content;
    int sent_calls; /* calls whose header (id, name) went out */
    size_t sent_args[NS_TOOL_MAX_CALLS];
} chat_job;

/* Thinking switched off: the prompt ends with a closed <think></think>,
 * as Qwen3's template renders enable_thinking false. */
static bool prompt_closes_think(const char *t, size_t n) {
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == ' ' || t[n - 1] == '\r' || t[n - 1] == '\t')) n--;
    return n >= 8 && !memcmp(t + n - 8, "</think>", 8);
}

bool ns_chat_gen_prepare(ns_gen_job *gj, json_t *chat_body, ns_chat_prompt *cp, ns_gen_opts *o, ns_http_error *e) {
    ns_api *a = gj->a;
    if (!ns_chat_prompt_build(a, chat_body, true, cp, e)) return false;
    if (cp->too_long) {
        ns_api_context_error(a, (int64_t)cp->n_ids, true, gj->ep->prompt_param, e); /* "messages" / "input" */
        return false;
    }
    gj->prompt = cp->ids;
    gj->n_prompt = cp->n_ids;
    o->reasoning = a->reasoning;
    o->in_think = a->reasoning && ns_reason_prompt_opens_think(cp->text, cp->len);
    o->think_closed = a->reasoning && !o->in_think && prompt_closes_think(cp->text, cp->len);
    o->toolfmt = cp->tools_enabled ? a->toolfmt : NS_TOOLFMT_NONE;
    o->tool_names = cp->tool_names;
    o->n_tool_names = cp->n_tools;
    o->tools = json_object_get(chat_body, "tools");
    o->max_calls = cp->single_call ? 1 : 0;
    return true;
}

/* Structured output of a chat request: response_format json_object /
 * json_schema, or a forced tool_choice ("required", a named function),
 * enforced by a grammar (api/structured.h). Both at once is a 400: the
 * answer is either a JSON value or tool calls. */
static bool chat_structured(ns_gen_job *gj, ns_gen_opts *o, ns_http_error *e) {
    chat_job *j = (chat_job *)gj;
    ns_struct_spec spec, tc = {0};
    if (!ns_structured_response_format(gj->body, &spec, e)) return false;
    if (j->cp.tools_enabled) ns_structured_tool_choice(gj->body, &tc);
    if (tc.kind != NS_STRUCT_NONE) {
        if (spec.kind != NS_STRUCT_NONE) {
            ns_http_error_set(e, 400, "response_format", "invalid_value",
                              "response_format json_object/json_schema cannot be combined with tool_choice "
                              "'required' or a named function");
            return false;
        }
        spec = tc;
    }
    return ns_structured_attach(gj->a, &spec, o, e);
}

static bool chat_prepare(ns_gen_job *gj, ns_gen_opts *o, ns_http_error *e) {
    chat_job *j = (chat_job *)gj;
    return ns_chat_gen_prepare(gj, gj->body, &j->cp, o, e) && chat_structured(gj, o, e);
}

static void chat_release(ns_gen_job *gj) { ns_chat_prompt_free(&((chat_job *)gj)->cp); }

static json_t *chat_logprobs(ns_gen_job *gj, int32_t from, int32_t to) {
    json_t *arr = json_array();
    ns_gen_chat_logprobs(&gj->g, from, to, arr);
    return json_pack("{s:o}", "content", arr);
}

static ns_status chat_stream_start(ns_gen_job *gj, ns_buf *out) {
    return ns_gen_job_emit(gj, out, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL);
}

static ns_status emit_text(ns_gen_job *gj, ns_buf *out, const char *field, const ns_buf *b, size_t *sent) {
    json_t *s;
    ns_status rc = ns_gen_new_text(b, sent, &s);
    if (rc != NS_OK || !s) return rc;
    json_t *d = json_object();
    json_object_set_new(d, field, s);
    return ns_gen_job_emit(gj, out, d, NULL);
}

static ns_status chat_stream_delta(ns_gen_job *gj, ns_buf *out) {
    chat_job *j = (chat_job *)gj;
    ns_status rc = emit_text(gj, out, "reasoning_content", &gj->g.reasoning, &j->sent_reasoning);
    if (rc == NS_OK) rc = emit_text(gj, out, "content", ns_gen_content(&gj->g), &j->sent_content);
    const ns_toolparse *tp = &gj->g.tp;
    for (int i = 0; rc == NS_OK && gj->g.use_tools && i < tp->n_calls; i++) {
        const ns_tool_call *c = &tp->calls[i];
        if (i >= j->sent_calls) {
            json_t *d = json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", i, "id", c->id, "type",
                                  "function", "function", "name", c->name.data ? c->name.data : "", "arguments", "");
            j->sent_calls = i + 1;
            rc = ns_gen_job_emit(gj, out, d, NULL);
            if (rc != NS_OK) break;
        }
        json_t *args;
        rc = ns_gen_new_text(&c->args, &j->sent_args[i], &args);
        if (rc == NS_OK && args) {
            json_t *d = json_pack("{s:[{s:i,s:{s:o}}]}", "tool_calls", "index", i, "function", "arguments", args);
            rc = ns_gen_job_emit(gj, out, d, NULL);
        }
    }
    return rc;
}

static json_t *chat_final_delta(ns_gen_job *gj) { return json_object(); }

static json_t *chat_whole_output(ns_gen_job *gj, const char *finish) {
    ns_gen *g = &gj->g;
    bool calls = strcmp(finish, "tool_calls") == 0;
    /* without valid calls the whole output is content, tags and all */
    const ns_buf *content = calls ? &g->tp.content : &g->content;
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    if (calls && content->len == 0) json_object_set_new(msg, "content", json_null());
    else json_object_set_new(msg, "content", json_stringn(content->data ? content->data : "", content->len));
    if (g->reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(g->reasoning.data, g->reasoning.len));
    if (calls) {
        json_t *arr = json_array();
        for (int i = 0; i < g->tp.n_calls; i++) {
            const ns_tool_call *c = &g->tp.calls[i];
            json_array_append_new(arr, json_pack("{s:s,s:s,s:{s:s,s:s%}}", "id", c->id, "type", "function", "function",
                                                 "name", c->name.data, "arguments", c->args.data ? c->args.data : "",
                                                 c->args.len));
        }
        json_object_set_new(msg, "tool_calls", arr);
    }
    return msg;
}

static const ns_gen_endpoint k_chat = {
    .job_size = sizeof(chat_job),
    .chat = true,
    .kind = "chat",
    .id_prefix = "chatcmpl-",
    .object = "chat.completion",
    .chunk_object = "chat.completion.chunk",
    .whole_key = "message",
    .delta_key = "delta",
    .prompt_param = "messages",
    .prepare = chat_prepare,
    .stream_start = chat_stream_start,
    .stream_delta = chat_stream_delta,
    .final_delta = chat_final_delta,
    .logprobs = chat_logprobs,
    .whole_output = chat_whole_output,
    .release = chat_release,
};

void ns_api_chat_completions(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_gen_handle(&k_chat, ud, req, resp);
}
