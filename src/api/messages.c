/* messages.c — POST /v1/messages and /v1/messages/count_tokens, the
 * Anthropic Messages API (see messages.h). */
#include "api/messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/chat.h"
#include "api/gen.h"
#include "api/messages_conv.h"
#include "api/structured.h"
#include "util/log.h"

enum { BLK_NONE = 0, BLK_THINK, BLK_TEXT, BLK_TOOL };

typedef struct msgs_job {
    ns_gen_job base; /* first: the shared path allocates and frees the job */
    ns_msgs_conv conv;
    ns_chat_prompt cp;
    /* streaming state */
    bool started;    /* message_start went out */
    int n_blocks;    /* content blocks opened so far (the next index) */
    int open;        /* the kind of the open block (BLK_*) */
    size_t sent_reasoning, sent_content;
    int sent_calls;  /* calls whose tool_use block was opened */
    size_t sent_args[NS_TOOL_MAX_CALLS];
} msgs_job;

/* ---- shapes ---- */

/* A signature for a thinking block: a hash of its text (clients keep and
 * resend it; nothing checks it). */
static void signature(const ns_buf *b, char *out, size_t cap) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < b->len; i++) h = (h ^ (unsigned char)b->data[i]) * 1099511628211ull;
    snprintf(out, cap, "nightshift-%016llx", (unsigned long long)h);
}

static const char *stop_reason(const ns_gen *g, bool streaming) {
    const char *f = ns_gen_finish_reason(g, streaming);
    if (strcmp(f, "tool_calls") == 0) return "tool_use";
    if (strcmp(f, "length") == 0) return "max_tokens";
    return ns_gen_stop_string(g) ? "stop_sequence" : "end_turn";
}

static json_t *usage_json(int32_t n_prompt, int32_t cached, int32_t created, int32_t out) {
    /* as Anthropic counts: the three input fields add up to the prompt */
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", n_prompt - cached - created, "cache_creation_input_tokens", created,
                     "cache_read_input_tokens", cached, "output_tokens", out);
}

static json_t *final_usage(const ns_gen *g) {
    return usage_json(g->n_prompt, g->res.n_cached, ns_gen_cache_created(g), g->n_ids);
}

static json_t *stop_seq_json(const ns_gen *g) {
    const char *s = ns_gen_stop_string(g);
    return s ? json_string(s) : json_null();
}

/* ---- the request ---- */

static bool msgs_params(ns_gen_job *gj, ns_http_error *e) {
    msgs_job *j = (msgs_job *)gj;
    if (!ns_msgs_convert(gj->body, false, &j->conv, e)) return false;
    ns_api_gen_params *p = &gj->gp;
    memset(p, 0, sizeof *p);
    ns_sampling_params *sp = &p->rp.sampling;
    *sp = ns_sampling_default();
    sp->temperature = (float)j->conv.temperature;
    sp->top_p = (float)j->conv.top_p;
    sp->top_k = (int32_t)j->conv.top_k;
    sp->seed = gj->a->random_seed ? gj->a->random_seed() : 0;
    p->rp.max_tokens = (int32_t)j->conv.max_tokens;
    p->stream = j->conv.stream;
    for (int i = 0; i < j->conv.n_stops; i++) p->stops[i] = j->conv.stops[i];
    p->n_stops = j->conv.n_stops;
    ns_error err;
    if (ns_sampling_validate(sp, &err) != NS_OK) {
        ns_http_error_set(e, 400, NULL, "invalid_request_error", "%s", err.msg);
        return false;
    }
    return true;
}

static bool msgs_prepare(ns_gen_job *gj, ns_gen_opts *o, ns_http_error *e) {
    msgs_job *j = (msgs_job *)gj;
    if (j->conv.n_ignored)
        NS_INFO("messages: tools not offered to the model (hosted by Anthropic, they cannot run here): %s",
                j->conv.ignored_tools);
    if (j->conv.n_ignored)
        snprintf(gj->headers, sizeof gj->headers, "X-Nightshift-Ignored-Tools: %s", j->conv.ignored_tools);
    if (!ns_chat_gen_prepare(gj, j->conv.chat, &j->cp, o, e)) return false;
    o->think_budget = j->conv.budget_tokens; /* ns_gen enforces it where the model thinks in <think> */
    ns_struct_spec spec = {0};
    if (j->conv.schema && (j->conv.choice == NS_MSGS_CHOICE_ANY || j->conv.choice == NS_MSGS_CHOICE_TOOL)) {
        ns_http_error_set(e, 400, "output_config.format", "invalid_request_error",
                          "output_config.format cannot be combined with tool_choice any/tool");
        return false;
    }
    if (j->conv.choice == NS_MSGS_CHOICE_ANY) {
        spec.kind = NS_STRUCT_TOOL_REQUIRED;
        spec.tools = json_object_get(j->conv.chat, "tools");
    } else if (j->conv.choice == NS_MSGS_CHOICE_TOOL) {
        spec.kind = NS_STRUCT_TOOL_NAMED;
        spec.tools = json_object_get(j->conv.chat, "tools");
        spec.tool_name = j->conv.choice_name;
    } else if (j->conv.schema) {
        spec.kind = NS_STRUCT_JSON_SCHEMA;
        spec.schema = j->conv.schema;
    }
    return ns_structured_attach(gj->a, &spec, o, e);
}

static void msgs_release(ns_gen_job *gj) {
    msgs_job *j = (msgs_job *)gj;
    ns_chat_prompt_free(&j->cp);
    ns_msgs_conv_free(&j->conv);
}

static json_t *message_object(ns_gen_job *gj, json_t *content, json_t *stop, json_t *stop_seq, json_t *usage) {
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:o,s:o}", "id", gj->id, "type", "message", "role", "assistant",
                     "model", gj->a->model_name, "content", content, "stop_reason", stop, "stop_sequence", stop_seq,
                     "usage", usage);
}

static json_t *msgs_whole(ns_gen_job *gj) {
    ns_gen *g = &gj->g;
    const char *finish = ns_gen_finish_reason(g, false);
    const bool calls = strcmp(finish, "tool_calls") == 0;
    json_t *content = json_array();
    if (g->reasoning.len) {
        char sig[64];
        signature(&g->reasoning, sig, sizeof sig);
        json_array_append_new(content, json_pack("{s:s,s:s%,s:s}", "type", "thinking", "thinking", g->reasoning.data,
                                                 g->reasoning.len, "signature", sig));
    }
    /* without valid calls the whole output is text, tags and all */
    const ns_buf *text = calls ? &g->tp.content : &g->content;
    if (text->len)
        json_array_append_new(content, json_pack("{s:s,s:s%}", "type", "text", "text", text->data, text->len));
    for (int i = 0; calls && i < g->tp.n_calls; i++) {
        const ns_tool_call *c = &g->tp.calls[i];
        json_error_t je;
        json_t *in = json_loadb(c->args.data ? c->args.data : "{}", c->args.len ? c->args.len : 2, 0, &je);
        if (!json_is_object(in)) {
            json_decref(in);
            in = json_object();
        }
        json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", c->id, "name",
                                                 c->name.data ? c->name.data : "", "input", in));
    }
    return message_object(gj, content, json_string(stop_reason(g, false)), stop_seq_json(g), final_usage(g));
}

/* ---- streaming ---- */

static ns_status event(ns_buf *out, const char *type, json_t *data) {
    if (data) json_object_set_new(data, "type", json_string(type));
    return ns_gen_sse_event(out, type, data);
}

static ns_status close_block(msgs_job *j, ns_buf *out) {
    if (j->open == BLK_NONE) return NS_OK;
    ns_status rc = NS_OK;
    if (j->open == BLK_THINK) {
        char sig[64];
        signature(&j->base.g.reasoning, sig, sizeof sig);
        rc = event(out, "content_block_delta",
                   json_pack("{s:i,s:{s:s,s:s}}", "index", j->n_blocks - 1, "delta", "type", "signature_delta",
                             "signature", sig));
    }
    if (rc == NS_OK) rc = event(out, "content_block_stop", json_pack("{s:i}", "index", j->n_blocks - 1));
    j->open = BLK_NONE;
    return rc;
}

/* Opens a block of kind (closing the open one) unless it is open already;
 * block is the content_block of content_block_start (stolen). */
static ns_status open_block(msgs_job *j, ns_buf *out, int kind, json_t *block) {
    if (j->open == kind && kind != BLK_TOOL) {
        json_decref(block);
        return NS_OK;
    }
    ns_status rc = close_block(j, out);
    if (rc != NS_OK) {
        json_decref(block);
        return rc;
    }
    j->open = kind;
    return event(out, "content_block_start", json_pack("{s:i,s:o}", "index", j->n_blocks++, "content_block", block));
}

static ns_status text_delta(msgs_job *j, ns_buf *out, int kind, const ns_buf *b, size_t *sent) {
    json_t *s;
    ns_status rc = ns_gen_new_text(b, sent, &s);
    if (rc != NS_OK || !s) return rc;
    const bool th = kind == BLK_THINK;
    rc = open_block(j, out, kind,
                    th ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "")
                       : json_pack("{s:s,s:s}", "type", "text", "text", ""));
    if (rc != NS_OK) {
        json_decref(s);
        return rc;
    }
    return event(out, "content_block_delta",
                 json_pack("{s:i,s:{s:s,s:o}}", "index", j->n_blocks - 1, "delta", "type",
                           th ? "thinking_delta" : "text_delta", th ? "thinking" : "text", s));
}

/* message_start goes out as soon as the engine admitted the request and
 * looked its prompt up in the prefix cache (not at the first token), so a
 * client sees the message open during a long prefill, and its usage
 * already has the reuse: input_tokens (the uncached part) and
 * cache_read_input_tokens are final. cache_creation_input_tokens is 0
 * there (what the request commits is known at its end; input_tokens then
 * gives that part back): message_delta carries the final four counters.
 * While the request waits in the queue, the stream has keep-alive
 * comments only. */
static ns_status message_start(msgs_job *j, ns_buf *out) {
    ns_gen *g = &j->base.g;
    ns_request_result r;
    ns_request_result_get(g->req, &r);
    json_t *msg = message_object(&j->base, json_array(), json_null(), json_null(),
                                 usage_json(g->n_prompt, r.n_cached, 0, 0));
    ns_status rc = event(out, "message_start", json_pack("{s:o}", "message", msg));
    if (rc == NS_OK) rc = event(out, "ping", json_object());
    j->started = true;
    return rc;
}

/* The arguments of call i not sent yet, into its open tool_use block. */
static ns_status args_delta(msgs_job *j, ns_buf *out, int i) {
    json_t *args;
    ns_status rc = ns_gen_new_text(&j->base.g.tp.calls[i].args, &j->sent_args[i], &args);
    if (rc != NS_OK || !args) return rc;
    return event(out, "content_block_delta",
                 json_pack("{s:i,s:{s:s,s:o}}", "index", j->n_blocks - 1, "delta", "type", "input_json_delta",
                           "partial_json", args));
}

/* Order matters: the open tool block gets the rest of its arguments
 * before text that follows the call opens a text block (which closes it),
 * and text written before a call goes out before the call's block. */
static ns_status msgs_delta(ns_gen_job *gj, ns_buf *out) {
    msgs_job *j = (msgs_job *)gj;
    ns_gen *g = &gj->g;
    ns_status rc = NS_OK;
    if (!j->started) {
        ns_request_result r;
        ns_request_result_get(g->req, &r);
        if (!r.admitted && g->n_ids == 0 && !g->done) return NS_OK; /* queued: keep-alives meanwhile */
        rc = message_start(j, out);
    }
    if (rc == NS_OK) rc = text_delta(j, out, BLK_THINK, &g->reasoning, &j->sent_reasoning);
    if (rc == NS_OK && j->open == BLK_TOOL) rc = args_delta(j, out, j->sent_calls - 1);
    if (rc == NS_OK) rc = text_delta(j, out, BLK_TEXT, ns_gen_content(g), &j->sent_content);
    const ns_toolparse *tp = &g->tp;
    for (int i = j->sent_calls; rc == NS_OK && g->use_tools && i < tp->n_calls; i++) {
        const ns_tool_call *c = &tp->calls[i];
        rc = open_block(j, out, BLK_TOOL,
                        json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", c->id, "name",
                                  c->name.data ? c->name.data : "", "input"));
        j->sent_calls = i + 1;
        if (rc == NS_OK) rc = args_delta(j, out, i);
    }
    return rc;
}

static ns_status msgs_end(ns_gen_job *gj, ns_buf *out, ns_http_error *err) {
    msgs_job *j = (msgs_job *)gj;
    if (err) {
        NS_WARN("messages %s: the stream ends with an error: %s", gj->id, err->message);
        return event(out, "error", json_pack("{s:{s:s,s:s}}", "error", "type", ns_http_error_anthropic_type(err->status), "message",
                                             err->message));
    }
    ns_gen *g = &gj->g;
    ns_status rc = j->started ? NS_OK : message_start(j, out);
    if (rc == NS_OK) rc = close_block(j, out);
    if (rc == NS_OK)
        rc = event(out, "message_delta",
                   json_pack("{s:{s:s,s:o},s:o}", "delta", "stop_reason", stop_reason(g, true), "stop_sequence",
                             stop_seq_json(g), "usage", final_usage(g)));
    if (rc == NS_OK) rc = event(out, "message_stop", json_object());
    return rc;
}

static const ns_gen_endpoint k_messages = {
    .job_size = sizeof(msgs_job),
    .chat = true,
    .kind = "messages",
    .id_prefix = "msg_",
    .object = "message",
    .chunk_object = "message",
    .whole_key = "content",
    .delta_key = "delta",
    .prompt_param = "messages",
    .prepare = msgs_prepare,
    .stream_delta = msgs_delta,
    .release = msgs_release,
    .parse_params = msgs_params,
    .stream_end = msgs_end,
    .whole_response = msgs_whole,
};

void ns_api_messages(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_gen_handle(&k_messages, ud, req, resp);
}

void ns_api_messages_count_tokens(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    ns_msgs_conv c;
    ns_chat_prompt cp;
    if (ns_msgs_convert(body, true, &c, &resp->err)) {
        if (ns_chat_prompt_build(a, c.chat, true, &cp, &resp->err)) {
            if (cp.too_long) {
                ns_api_context_error(a, (int64_t)cp.n_ids, true, "messages", &resp->err);
            } else {
                json_t *r = json_pack("{s:I}", "input_tokens", (json_int_t)cp.n_ids);
                ns_http_set_json(resp, 200, r ? json_dumps(r, JSON_COMPACT) : NULL);
                json_decref(r);
            }
            ns_chat_prompt_free(&cp);
        }
        ns_msgs_conv_free(&c);
    }
    json_decref(body);
}
