/* chat_completions.c — POST /v1/chat/completions, streaming and not.
 *
 * The request is validated and rendered on this (HTTP) thread, submitted
 * to the scheduler, and its events turned into text by ns_gen. Streaming
 * responses are OpenAI chat.completion.chunk events: a first chunk with the
 * role, then reasoning_content / content / tool_calls deltas (a call's id
 * and name first, then its arguments as they are generated), a last chunk
 * with finish_reason, an optional usage chunk, and [DONE]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "api/chat.h"
#include "api/gen.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/utf8.h"

#define KEEPALIVE_S 15.0

typedef struct chat_job {
    ns_api *a;
    json_t *body;          /* keeps the strings gen borrows alive */
    ns_chat_prompt cp;
    ns_api_gen_params gp;
    ns_gen g;
    char id[64];
    time_t created;
    /* streaming cursors */
    bool sent_role, finished;
    size_t sent_reasoning, sent_content;
    int sent_calls;        /* calls whose header (id, name) went out */
    size_t sent_args[NS_TOOL_MAX_CALLS];
    int32_t sent_lps;
    double last_emit;
} chat_job;

static void job_free(chat_job *j) {
    if (!j) return;
    ns_gen_free(&j->g);
    ns_chat_prompt_free(&j->cp);
    json_decref(j->body);
    free(j);
}

static json_t *chunk_base(chat_job *j) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", j->id, "object", "chat.completion.chunk", "created",
                          (json_int_t)j->created, "model", j->a->model_name, "system_fingerprint", j->a->fingerprint);
    if (c && j->gp.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* One chunk with a delta (stolen); attaches pending logprobs. */
static ns_status emit_delta(chat_job *j, ns_buf *out, json_t *delta, const char *finish) {
    json_t *c = chunk_base(j);
    json_t *lp = json_null();
    if (j->gp.rp.logprobs && j->sent_lps < j->g.n_lps) {
        json_t *arr = json_array();
        ns_gen_chat_logprobs(&j->g, j->sent_lps, j->g.n_lps, arr);
        j->sent_lps = j->g.n_lps;
        json_decref(lp);
        lp = json_pack("{s:o}", "content", arr);
    }
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", lp, "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    j->last_emit = ns_clock_now();
    return ns_sse_json(out, c);
}

static ns_status emit_text(chat_job *j, ns_buf *out, const char *field, const ns_buf *b, size_t *sent) {
    if (b->len <= *sent) return NS_OK;
    size_t end = ns_utf8_complete(b->data, *sent, b->len);
    if (end <= *sent) return NS_OK;
    json_t *d = json_object();
    json_object_set_new(d, field, json_stringn(b->data + *sent, end - *sent));
    *sent = end;
    return emit_delta(j, out, d, NULL);
}

static ns_status emit_diffs(chat_job *j, ns_buf *out) {
    ns_status rc = emit_text(j, out, "reasoning_content", &j->g.reasoning, &j->sent_reasoning);
    if (rc == NS_OK) rc = emit_text(j, out, "content", ns_gen_content(&j->g), &j->sent_content);
    const ns_toolparse *tp = &j->g.tp;
    for (int i = 0; rc == NS_OK && j->g.use_tools && i < tp->n_calls; i++) {
        const ns_tool_call *c = &tp->calls[i];
        if (i >= j->sent_calls) {
            json_t *d = json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", i, "id", c->id, "type",
                                  "function", "function", "name", c->name.data ? c->name.data : "", "arguments", "");
            j->sent_calls = i + 1;
            rc = emit_delta(j, out, d, NULL);
            if (rc != NS_OK) break;
        }
        if (c->args.len > j->sent_args[i]) {
            size_t end = ns_utf8_complete(c->args.data, j->sent_args[i], c->args.len);
            if (end > j->sent_args[i]) {
                json_t *d = json_pack("{s:[{s:i,s:{s:s%}}]}", "tool_calls", "index", i, "function", "arguments",
                                      c->args.data + j->sent_args[i], end - j->sent_args[i]);
                j->sent_args[i] = end;
                rc = emit_delta(j, out, d, NULL);
            }
        }
    }
    return rc;
}

static ns_status emit_end(chat_job *j, ns_buf *out) {
    ns_http_error e = {0};
    ns_status rc;
    if (ns_gen_failed(&j->g, &e)) {
        rc = ns_sse_error(out, &e);
    } else {
        rc = emit_delta(j, out, json_object(), ns_gen_finish_reason(&j->g, true));
        if (rc == NS_OK && j->gp.include_usage) {
            json_t *c = chunk_base(j);
            json_object_set_new(c, "choices", json_array());
            json_object_set_new(c, "usage", ns_gen_usage(&j->g));
            rc = ns_sse_json(out, c);
        }
    }
    if (rc == NS_OK) rc = ns_sse_done(out);
    j->finished = true;
    return rc;
}

static ns_status chat_next(void *ctx, ns_buf *out, bool *eof) {
    chat_job *j = ctx;
    if (j->finished) {
        *eof = true;
        return NS_OK;
    }
    if (!j->sent_role) {
        j->sent_role = true;
        return emit_delta(j, out, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL);
    }
    for (;;) {
        ns_status rc = ns_gen_pump(&j->g, 50);
        if (rc == NS_ERR_CANCELLED) return rc; /* client gone: drop the connection */
        if (rc != NS_OK) {
            ns_http_error e = {0};
            ns_http_error_from_status(&e, rc, NULL, "generation failed");
            rc = ns_sse_error(out, &e);
            if (rc == NS_OK) rc = ns_sse_done(out);
            j->finished = true;
            *eof = true;
            return rc;
        }
        rc = emit_diffs(j, out);
        if (rc != NS_OK) return rc;
        if (j->g.done) {
            rc = emit_end(j, out);
            *eof = true;
            return rc;
        }
        if (out->len) return NS_OK;
        if (ns_clock_now() - j->last_emit > KEEPALIVE_S) {
            j->last_emit = ns_clock_now();
            return ns_sse_keepalive(out);
        }
    }
}

static void chat_close(void *ctx, bool completed) {
    (void)completed; /* ns_gen_free cancels a generation that is not done */
    job_free(ctx);
}

static json_t *final_message(chat_job *j, const char **finish) {
    ns_gen *g = &j->g;
    *finish = ns_gen_finish_reason(g, false);
    bool calls = strcmp(*finish, "tool_calls") == 0;
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

static void respond_whole(chat_job *j, ns_http_response *resp) {
    for (;;) {
        ns_status rc = ns_gen_pump(&j->g, 100);
        if (rc == NS_ERR_CANCELLED) {
            /* nobody reads this; 499 (nginx's "client closed request") is counted as a disconnect */
            ns_http_error_set(&resp->err, 499, NULL, "client_disconnected", "the client disconnected");
            return;
        }
        if (rc != NS_OK) {
            ns_http_error_from_status(&resp->err, rc, NULL, "generation failed");
            return;
        }
        if (j->g.done) break;
    }
    if (ns_gen_failed(&j->g, &resp->err)) return;
    const char *finish;
    json_t *msg = final_message(j, &finish);
    json_t *lp = json_null();
    if (j->gp.rp.logprobs) {
        json_t *arr = json_array();
        ns_gen_chat_logprobs(&j->g, 0, j->g.n_lps, arr);
        json_decref(lp);
        lp = json_pack("{s:o}", "content", arr);
    }
    json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "message", msg, "logprobs", lp, "finish_reason", finish);
    if (choice && j->gp.return_token_ids) {
        json_t *ids = json_array();
        for (int32_t i = 0; i < j->g.n_ids; i++) json_array_append_new(ids, json_integer(j->g.ids[i]));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_t *root = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", j->id, "object", "chat.completion", "created",
                             (json_int_t)j->created, "model", j->a->model_name, "system_fingerprint",
                             j->a->fingerprint, "choices", choice, "usage", ns_gen_usage(&j->g));
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}

void ns_api_chat_completions(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    chat_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(body);
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        return;
    }
    j->a = a;
    j->body = body;
    j->created = time(NULL);
    ns_api_random_id("chatcmpl-", j->id, sizeof j->id);
    if (!ns_api_parse_gen_params(a, body, true, &j->gp, &resp->err)) goto fail;
    if (!ns_chat_prompt_build(a, body, true, &j->cp, &resp->err)) goto fail;
    if (!ns_api_check_context(a, (int32_t)(j->cp.n_ids > INT32_MAX ? INT32_MAX : j->cp.n_ids), j->gp.rp.max_tokens,
                              "messages", &resp->err))
        goto fail;
    ns_gen_opts go = {
        .rp = j->gp.rp,
        .stops = j->gp.stops,
        .n_stops = j->gp.n_stops,
        .reasoning = a->reasoning,
        .in_think = a->reasoning && ns_reason_prompt_opens_think(j->cp.text, j->cp.len),
        .toolfmt = j->cp.tools_enabled ? a->toolfmt : NS_TOOLFMT_NONE,
        .tool_names = j->cp.tool_names,
        .n_tool_names = j->cp.n_tools,
        .kind = "chat",
    };
    if (!ns_gen_start(&j->g, a, j->cp.ids, (int32_t)j->cp.n_ids, &go, &req->conn, j->id, &resp->err)) goto fail;
    if (j->gp.stream) {
        j->last_emit = ns_clock_now();
        resp->status = 200;
        resp->content_type = "text/event-stream";
        resp->stream.ctx = j;
        resp->stream.next = chat_next;
        resp->stream.close = chat_close;
        return;
    }
    respond_whole(j, resp);
fail: /* also the end of a non-streaming request */
    job_free(j);
}
