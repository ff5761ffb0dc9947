/* completions.c — POST /v1/completions: a raw prompt (text, or token ids)
 * continued by the model, streaming and not. No chat template, no
 * reasoning or tool-call parsing; stop strings apply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "api/gen.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"

#define MAX_PROMPT_IDS (1 << 24)
#define KEEPALIVE_S 15.0

typedef struct cmpl_job {
    ns_api *a;
    json_t *body;
    int32_t *ids;
    size_t n_ids;
    ns_api_gen_params gp;
    ns_gen g;
    char id[64];
    time_t created;
    bool finished, started;
    size_t sent_text, text_off;
    int32_t sent_lps;
    double last_emit;
} cmpl_job;

static void job_free(cmpl_job *j) {
    if (!j) return;
    ns_gen_free(&j->g);
    free(j->ids);
    json_decref(j->body);
    free(j);
}

static bool ids_from_array(ns_api *a, json_t *arr, cmpl_job *j, ns_http_error *e) {
    size_t n = json_array_size(arr);
    if (n > MAX_PROMPT_IDS) {
        ns_http_error_set(e, 400, "prompt", "invalid_value", "the prompt has too many tokens");
        return false;
    }
    j->ids = malloc((n ? n : 1) * sizeof *j->ids);
    if (!j->ids) {
        ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
        return false;
    }
    int32_t vocab = a->cfg.vocab_size;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            ns_http_error_set(e, 400, "prompt", "invalid_value",
                              "'prompt[%zu]' must be a token id in [0, %d)", i, vocab);
            return false;
        }
        j->ids[i] = (int32_t)json_integer_value(v);
    }
    j->n_ids = n;
    return true;
}

static bool parse_prompt(ns_api *a, json_t *body, cmpl_job *j, ns_http_error *e) {
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) {
        ns_http_error_set(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        return false;
    }
    if (json_is_array(p) && json_array_size(p) >= 1 && !json_is_integer(json_array_get(p, 0))) {
        if (json_array_size(p) > 1) {
            ns_http_error_set(e, 400, "prompt", "unsupported_value", "only one prompt per request is supported");
            return false;
        }
        p = json_array_get(p, 0); /* ["text"] or [[ids]] */
    }
    if (json_is_string(p)) {
        ns_error err = {0};
        ns_status rc = ns_tokenizer_encode(a->tok, json_string_value(p), json_string_length(p), true, &j->ids,
                                           &j->n_ids, &err);
        if (rc != NS_OK) {
            j->ids = NULL;
            ns_http_error_from_status(e, rc, "prompt", err.msg);
            return false;
        }
        return true;
    }
    if (json_is_array(p)) return ids_from_array(a, p, j, e);
    ns_http_error_set(e, 400, "prompt", "invalid_type",
                      "'prompt' must be a string, an array of token ids, or a one-element array of either");
    return false;
}

static bool check_unsupported(json_t *body, ns_http_error *e) {
    bool echo = false;
    if (!ns_api_get_bool(body, "echo", &echo, e)) return false;
    if (echo) {
        ns_http_error_set(e, 400, "echo", "unsupported_value", "'echo' is not supported");
        return false;
    }
    const char *suffix = NULL;
    if (!ns_api_get_str(body, "suffix", &suffix, e)) return false;
    if (suffix && *suffix) {
        ns_http_error_set(e, 400, "suffix", "unsupported_value", "'suffix' is not supported");
        return false;
    }
    int64_t best_of = 1;
    if (!ns_api_get_int(body, "best_of", 1, 1, &best_of, e)) {
        snprintf(e->message, sizeof e->message, "only best_of = 1 is supported");
        return false;
    }
    return true;
}

static json_t *chunk(cmpl_job *j, const char *text, size_t len, json_t *logprobs, const char *finish) {
    json_t *choice = json_pack("{s:i,s:s%,s:o,s:o}", "index", 0, "text", text, len, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", j->id, "object", "text_completion", "created",
                          (json_int_t)j->created, "model", j->a->model_name, "system_fingerprint", j->a->fingerprint,
                          "choices", choice);
    if (c && j->gp.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static json_t *pending_logprobs(cmpl_job *j) {
    if (!j->gp.rp.logprobs || j->sent_lps >= j->g.n_lps) return NULL;
    json_t *lp = ns_gen_completion_logprobs(&j->g, j->sent_lps, j->g.n_lps, &j->text_off);
    j->sent_lps = j->g.n_lps;
    return lp;
}

static ns_status cmpl_next(void *ctx, ns_buf *out, bool *eof) {
    cmpl_job *j = ctx;
    if (j->finished) {
        *eof = true;
        return NS_OK;
    }
    for (;;) {
        ns_status rc = ns_gen_pump(&j->g, 50);
        if (rc == NS_ERR_CANCELLED) return rc;
        if (rc != NS_OK) {
            ns_http_error e = {0};
            ns_http_error_from_status(&e, rc, NULL, "generation failed");
            rc = ns_sse_error(out, &e);
            if (rc == NS_OK) rc = ns_sse_done(out);
            j->finished = *eof = true;
            return rc;
        }
        const ns_buf *t = &j->g.text;
        if (t->len > j->sent_text) {
            rc = ns_sse_json(out, chunk(j, t->data + j->sent_text, t->len - j->sent_text, pending_logprobs(j), NULL));
            j->sent_text = t->len;
            if (rc != NS_OK) return rc;
        }
        if (j->g.done) {
            ns_http_error e = {0};
            if (ns_gen_failed(&j->g, &e)) {
                rc = ns_sse_error(out, &e);
            } else {
                rc = ns_sse_json(out, chunk(j, "", 0, pending_logprobs(j), ns_gen_finish_reason(&j->g, true)));
                if (rc == NS_OK && j->gp.include_usage) {
                    json_t *c = chunk(j, "", 0, NULL, NULL);
                    json_object_set_new(c, "choices", json_array());
                    json_object_set_new(c, "usage", ns_gen_usage(&j->g));
                    rc = ns_sse_json(out, c);
                }
            }
            if (rc == NS_OK) rc = ns_sse_done(out);
            j->finished = *eof = true;
            return rc;
        }
        if (out->len) {
            j->last_emit = ns_clock_now();
            return NS_OK;
        }
        if (ns_clock_now() - j->last_emit > KEEPALIVE_S) { /* long prefill: keep the connection warm */
            j->last_emit = ns_clock_now();
            return ns_sse_keepalive(out);
        }
    }
}

static void cmpl_close(void *ctx, bool completed) {
    (void)completed;
    job_free(ctx);
}

static void respond_whole(cmpl_job *j, ns_http_response *resp) {
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
    json_t *c = chunk(j, j->g.text.data ? j->g.text.data : "", j->g.text.len, pending_logprobs(j),
                      ns_gen_finish_reason(&j->g, false));
    if (!c) {
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        return;
    }
    json_object_set_new(c, "object", json_string("text_completion"));
    json_object_set_new(c, "usage", ns_gen_usage(&j->g));
    if (j->gp.return_token_ids) {
        json_t *ids = json_array();
        for (int32_t i = 0; i < j->g.n_ids; i++) json_array_append_new(ids, json_integer(j->g.ids[i]));
        json_object_set_new(json_array_get(json_object_get(c, "choices"), 0), "token_ids", ids);
    }
    ns_http_set_json(resp, 200, json_dumps(c, JSON_COMPACT));
    json_decref(c);
}

void ns_api_completions(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    cmpl_job *j = calloc(1, sizeof *j);
    if (!j) {
        json_decref(body);
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        return;
    }
    j->a = a;
    j->body = body;
    j->created = time(NULL);
    ns_api_random_id("cmpl-", j->id, sizeof j->id);
    if (!ns_api_parse_gen_params(a, body, false, &j->gp, &resp->err)) goto done;
    if (!check_unsupported(body, &resp->err)) goto done;
    if (!parse_prompt(a, body, j, &resp->err)) goto done;
    if (!ns_api_check_context(a, (int32_t)(j->n_ids > INT32_MAX ? INT32_MAX : j->n_ids), j->gp.rp.max_tokens,
                              "prompt", &resp->err))
        goto done;
    ns_gen_opts go = {
        .rp = j->gp.rp,
        .stops = j->gp.stops,
        .n_stops = j->gp.n_stops,
        .kind = "completion",
    };
    if (!ns_gen_start(&j->g, a, j->ids, (int32_t)j->n_ids, &go, &req->conn, j->id, &resp->err)) goto done;
    if (j->gp.stream) {
        j->last_emit = ns_clock_now();
        resp->status = 200;
        resp->content_type = "text/event-stream";
        resp->stream.ctx = j;
        resp->stream.next = cmpl_next;
        resp->stream.close = cmpl_close;
        return;
    }
    respond_whole(j, resp);
done:
    job_free(j);
}
