/* gen.c — the HTTP side of one generation (see gen.h). */
#include "api/gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record/record_gen.h"
#include "api/structured.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokutil.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/utf8.h"
#include "util/vec.h"

#define TEXT_CAP ((size_t)256 << 20)

/* Releases the output pipeline (detokenizer, stop matcher, parsers and
 * their buffers); shared by the failed-start and the finish paths. */
static void free_parsers(ns_gen *g) {
    ns_detok_free(g->detok);
    g->detok = NULL;
    ns_stop_free(&g->stop);
    ns_toolparse_free(&g->tp);
    ns_reason_free(&g->reason);
    ns_buf_free(&g->text);
    ns_buf_free(&g->reasoning);
    ns_buf_free(&g->content);
    ns_buf_free(&g->s1);
    ns_buf_free(&g->s2);
    ns_buf_free(&g->s3);
    ns_buf_free(&g->raw);
}

bool ns_gen_start(ns_gen *g, ns_api *a, const int32_t *prompt, int32_t n_prompt, const ns_gen_opts *o,
                  const ns_http_conn *conn, const char *id, ns_http_error *e) {
    memset(g, 0, sizeof *g);
    g->api = a;
    g->conn = *conn;
    g->kind = o->kind ? o->kind : "request";
    g->n_prompt = n_prompt;
    g->logprobs = o->rp.logprobs;
    g->top_logprobs = o->rp.top_logprobs;
    g->ignore_eos = o->rp.ignore_eos;
    snprintf(g->id, sizeof g->id, "%s", id);
    ns_buf_init(&g->text, TEXT_CAP);
    ns_buf_init(&g->reasoning, TEXT_CAP);
    ns_buf_init(&g->content, TEXT_CAP);
    ns_buf_init(&g->s1, TEXT_CAP);
    ns_buf_init(&g->s2, TEXT_CAP);
    ns_buf_init(&g->s3, TEXT_CAP);
    ns_buf_init(&g->raw, TEXT_CAP);
    g->max_calls = o->max_calls;
    ns_reason_init(&g->reason, o->reasoning, o->in_think);
    g->use_tools = o->toolfmt != NS_TOOLFMT_NONE;
    ns_error err = {0};
    ns_status rc = ns_stop_init(&g->stop, o->stops, o->n_stops, &err);
    if (rc == NS_OK)
        rc = ns_toolparse_init(&g->tp, o->toolfmt, o->tool_names, o->n_tool_names, o->rp.sampling.seed ^ 0x5bd1e995u);
    if (rc == NS_OK) rc = ns_toolparse_set_schemas(&g->tp, o->tools);
    /* Mistral's [TOOL_CALLS] is a special token: keep its text for the parser */
    if (rc == NS_OK) rc = ns_detok_create(a->tok, o->toolfmt != NS_TOOLFMT_MISTRAL, &g->detok);
    if (rc != NS_OK) {
        ns_http_error_from_status(e, rc, "stop", err.msg[0] ? err.msg : "out of memory");
        goto fail;
    }
    if (o->think_budget > 0 && o->reasoning && !o->rp.grammar) {
        g->prompt = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *g->prompt);
        if (!g->prompt) {
            ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
            goto fail;
        }
        memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
        g->think_budget = o->think_budget;
        g->rp = o->rp;
    }
    g->req = ns_request_new(prompt, n_prompt, &o->rp);
    g->req_made = g->req != NULL;
    if (!g->req) {
        ns_http_error_set(e, 500, NULL, "internal_error", "out of memory creating the request");
        goto fail;
    }
    ns_request_set_label(g->req, ns_log_context());
    ns_capacity cap = {0};
    rc = ns_sched_submit(a->sched, g->req, &cap, &err);
    if (rc != NS_OK) {
        ns_api_submit_error(rc, &cap, &err, e);
        goto fail;
    }
    g->t0 = ns_clock_now();
    return true;
fail:
    if (g->req) ns_request_release(g->req);
    g->req = NULL;
    free_parsers(g);
    free(g->prompt);
    g->prompt = NULL;
    return false;
}

/* Text after stop strings: reasoning split, then tool-call parsing. */
static ns_status stage2(ns_gen *g, const char *t, size_t n) {
    if (n == 0) return NS_OK;
    ns_status rc = ns_buf_append(&g->text, t, n);
    if (rc != NS_OK) return rc;
    ns_buf_reset(&g->s3);
    rc = ns_reason_feed(&g->reason, t, n, &g->reasoning, &g->s3);
    if (rc != NS_OK || g->s3.len == 0) return rc;
    rc = ns_buf_append(&g->content, g->s3.data, g->s3.len);
    if (rc == NS_OK && g->use_tools) rc = ns_toolparse_feed(&g->tp, g->s3.data, g->s3.len);
    if (rc == NS_OK && g->use_tools && g->max_calls > 0 && !g->stopped &&
        ns_toolparse_n_valid(&g->tp) >= g->max_calls) {
        /* enough calls: end here, like a stop string (the text after the
         * last call is not wanted) */
        g->stopped = true;
        ns_request_cancel(g->req);
    }
    return rc;
}

static ns_status feed_text(ns_gen *g, const char *t, size_t n) {
    if (n == 0 || g->stopped) return NS_OK;
    ns_buf_reset(&g->s2);
    bool matched = false;
    ns_status rc = g->stop.n > 0 ? ns_buf_append(&g->raw, t, n) : NS_OK;
    if (rc == NS_OK) rc = ns_stop_feed(&g->stop, t, n, &g->s2, &matched);
    if (rc != NS_OK) return rc;
    if (matched) {
        g->stopped = true;
        ns_request_cancel(g->req);
    }
    return stage2(g, g->s2.data, g->s2.len);
}

static bool is_eos(const ns_gen *g, int32_t tok) { return ns_config_is_eos(&g->api->cfg, tok); }

static ns_status on_token(ns_gen *g, const ns_token_event *ev) {
    if (g->stopped || g->cutting) return NS_OK;
    if (NS_VEC_GROW(g->ids, g->cap_ids, (size_t)g->n_ids + 1, INT32_MAX) != NS_OK) return NS_ERR_NOMEM;
    g->ids[g->n_ids++] = ev->token;
    if (g->logprobs) {
        if (NS_VEC_GROW(g->lps, g->cap_lps, (size_t)g->n_lps + 1, INT32_MAX) != NS_OK) return NS_ERR_NOMEM;
        g->lps[g->n_lps++] = *ev;
    }
    if (!g->ignore_eos && is_eos(g, ev->token)) return NS_OK;
    ns_buf_reset(&g->s1);
    ns_status rc = ns_detok_push(g->detok, ev->token, &g->s1);
    if (rc == NS_ERR_RANGE) rc = NS_OK; /* an id outside the vocabulary has no text */
    if (rc != NS_OK) return rc;
    rc = feed_text(g, g->s1.data, g->s1.len);
    if (rc == NS_OK && g->think_budget > 0 && !g->continued && g->reason.state == NS_REASON_THINK &&
        ++g->think_tokens >= g->think_budget && !g->stopped) {
        g->cutting = true; /* continue_after_budget takes over once the request is done */
        ns_request_cancel(g->req);
    }
    return rc;
}

/* The thinking budget is spent (ns_gen_opts.think_budget): "\n</think>\n\n"
 * goes through the pipeline as if the model had written it, and a new
 * request continues from the prompt, the tokens so far and those of the
 * tag. The first request's prefix reuse stays the one reported. */
static ns_status continue_after_budget(ns_gen *g) {
    static const char k_close[] = "\n</think>\n\n";
    ns_request_result_get(g->req, &g->first);
    g->cutting = false;
    g->continued = true;
    int32_t *tag = NULL;
    size_t n_tag = 0;
    ns_error err;
    ns_status rc = ns_tokenizer_encode(g->api->tok, k_close, sizeof k_close - 1, false, &tag, &n_tag, &err);
    for (size_t i = 0; rc == NS_OK && i < n_tag; i++) {
        if (NS_VEC_GROW(g->ids, g->cap_ids, (size_t)g->n_ids + 1, INT32_MAX) != NS_OK) rc = NS_ERR_NOMEM;
        else g->ids[g->n_ids++] = tag[i];
        ns_buf_reset(&g->s1);
        if (rc == NS_OK) rc = ns_detok_push(g->detok, tag[i], &g->s1);
        if (rc == NS_OK) rc = feed_text(g, g->s1.data, g->s1.len);
    }
    free(tag);
    if (rc != NS_OK) return rc;
    const int64_t left = g->rp.max_tokens > 0 ? (int64_t)g->rp.max_tokens - g->n_ids : INT32_MAX;
    const int64_t total = (int64_t)g->n_prompt + g->n_ids;
    if (left <= 0 || g->stopped || total > INT32_MAX) return NS_ERR_RANGE; /* nothing left to generate: as cut */
    int32_t *p = malloc((size_t)total * sizeof *p);
    if (!p) return NS_ERR_NOMEM;
    memcpy(p, g->prompt, (size_t)g->n_prompt * sizeof *p);
    memcpy(p + g->n_prompt, g->ids, (size_t)g->n_ids * sizeof *p);
    ns_request_params rp = g->rp;
    rp.max_tokens = g->rp.max_tokens > 0 ? (int32_t)left : 0;
    ns_request *r = ns_request_new(p, (int32_t)total, &rp);
    free(p);
    if (!r) return NS_ERR_NOMEM;
    ns_request_set_label(r, ns_log_context());
    ns_capacity cap = {0};
    rc = ns_sched_submit(g->api->sched, r, &cap, &err);
    if (rc != NS_OK) {
        ns_request_release(r);
        return rc;
    }
    NS_INFO("%s %s: thinking budget of %d tokens spent: continuing after </think> (prompt %lld tokens)", g->kind, g->id,
            g->think_budget, (long long)total);
    ns_request_release(g->req);
    g->req = r;
    return NS_OK;
}

static ns_status finalize(ns_gen *g) {
    ns_status rc = NS_OK;
    if (!g->stopped) {
        ns_buf_reset(&g->s1);
        rc = ns_detok_flush(g->detok, &g->s1);
        if (rc == NS_OK) rc = feed_text(g, g->s1.data, g->s1.len);
        if (rc == NS_OK && !g->stopped) {
            ns_buf_reset(&g->s2);
            rc = ns_stop_flush(&g->stop, &g->s2);
            if (rc == NS_OK) rc = stage2(g, g->s2.data, g->s2.len);
        }
    }
    if (rc != NS_OK) return rc;
    ns_buf_reset(&g->s3);
    rc = ns_reason_flush(&g->reason, &g->reasoning, &g->s3);
    if (rc == NS_OK && g->s3.len) {
        rc = ns_buf_append(&g->content, g->s3.data, g->s3.len);
        if (rc == NS_OK && g->use_tools) rc = ns_toolparse_feed(&g->tp, g->s3.data, g->s3.len);
    }
    if (rc == NS_OK && g->use_tools) rc = ns_toolparse_finish(&g->tp);
    ns_request_result_get(g->req, &g->res);
    if (g->continued) { /* the request's reuse is the first request's, not the continuation's */
        g->res.n_cached = g->first.n_cached;
        memcpy(g->res.n_cached_by_tier, g->first.n_cached_by_tier, sizeof g->res.n_cached_by_tier);
    }
    return rc;
}

ns_status ns_gen_pump(ns_gen *g, int timeout_ms) {
    if (g->done) return NS_OK;
    ns_token_event ev[32];
    bool done = false;
    int n = ns_request_poll(g->req, ev, 32, timeout_ms, &done);
    if (n > 0 && g->t_first == 0) g->t_first = ns_clock_now();
    ns_status rc = NS_OK;
    for (int i = 0; i < n && rc == NS_OK; i++) rc = on_token(g, &ev[i]);
    if (rc != NS_OK) {
        ns_request_cancel(g->req);
        return rc;
    }
    if (done && g->cutting) {
        rc = continue_after_budget(g);
        if (rc == NS_ERR_RANGE) { /* max_tokens spent by the tag (or a stop string in it): end here */
            const bool stop = g->stopped;
            rc = finalize(g);
            if (!stop) g->res.finish = NS_FINISH_LENGTH;
            g->done = true;
        } else if (rc != NS_OK) {
            ns_request_cancel(g->req);
        }
        return rc;
    }
    if (done) {
        rc = finalize(g);
        g->done = true;
        return rc;
    }
    if (ns_http_client_gone(&g->conn)) {
        g->gone = true;
        ns_request_cancel(g->req);
        return NS_ERR_CANCELLED;
    }
    return NS_OK;
}

const ns_buf *ns_gen_content(const ns_gen *g) { return g->use_tools ? &g->tp.content : &g->content; }

bool ns_gen_failed(const ns_gen *g, ns_http_error *e) {
    static const char k_invalid[] = "model_output_invalid:"; /* the scheduler's prefix for a -1 token */
    if (g->res.finish == NS_FINISH_ERROR && strncmp(g->res.error, k_invalid, sizeof k_invalid - 1) == 0) {
        ns_http_error_set(e, 500, NULL, "model_output_invalid", "the model produced non-finite logits");
        return true;
    }
    if (g->res.finish == NS_FINISH_ERROR) {
        ns_http_error_set(e, 500, NULL, "engine_error", "generation failed: %s",
                          g->res.error[0] ? g->res.error : "engine error");
        return true;
    }
    if (g->res.finish == NS_FINISH_CANCELLED && !g->stopped) {
        ns_http_error_set(e, 503, NULL, "cancelled", "the generation was cancelled: %s",
                          g->res.error[0] ? g->res.error : "cancelled");
        return true;
    }
    return false;
}

const char *ns_gen_finish_reason(const ns_gen *g, bool streaming) {
    bool calls = g->use_tools && (streaming ? g->tp.n_calls > 0
                                            : g->tp.n_calls > 0 && ns_toolparse_all_valid(&g->tp));
    if (g->stopped) return calls ? "tool_calls" : "stop";
    switch (g->res.finish) {
    case NS_FINISH_LENGTH:
    case NS_FINISH_CONTEXT:
        return "length";
    default:
        return calls ? "tool_calls" : "stop";
    }
}

const char *ns_gen_stop_string(const ns_gen *g) {
    if (!g->stop.matched) return NULL;
    /* released text is a prefix of the text fed, and the match starts
     * right after it: the stop string is the one found there (the
     * shortest, when one is a prefix of another: it completed first) */
    const size_t at = g->text.len;
    const char *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < g->stop.n; i++) {
        const size_t len = g->stop.len[i];
        if (at + len > g->raw.len || memcmp(g->raw.data + at, g->stop.s[i], len) != 0) continue;
        if (!best || len < best_len) {
            best = g->stop.s[i];
            best_len = len;
        }
    }
    return best;
}

int32_t ns_gen_cache_created(const ns_gen *g) {
    ns_sched_stats st;
    ns_sched_get_stats(g->api->sched, &st);
    if (st.page_tokens <= 0) return 0;
    const int32_t full = g->n_prompt / st.page_tokens * st.page_tokens;
    return full > g->res.n_cached ? full - g->res.n_cached : 0;
}

json_t *ns_gen_usage(const ns_gen *g) {
    /* cached_tokens stays the total (OpenAI's field); the per-tier split
     * is nightshift's: where the reused prefix came from */
    const int32_t *t = g->res.n_cached_by_tier;
    return json_pack("{s:i,s:i,s:i,s:{s:i,s:{s:i,s:i,s:i}}}", "prompt_tokens", g->n_prompt, "completion_tokens",
                     g->n_ids, "total_tokens", g->n_prompt + g->n_ids, "prompt_tokens_details", "cached_tokens",
                     g->res.n_cached, "cached_tokens_by_tier", "device", t[NS_TIER_DEVICE], "ram", t[NS_TIER_RAM],
                     "ssd", t[NS_TIER_SSD]);
}

/* A token's text and UTF-8 bytes, as OpenAI reports them. Byte-level BPE
 * tokens that hold part of a character decode to U+FFFD; their exact
 * bytes come from the vocabulary piece through the GPT-2 byte alphabet. */
static void token_text(const ns_gen *g, int32_t id, json_t **str, json_t **bytes) {
    char *s = NULL;
    size_t len = 0;
    ns_error err;
    if (ns_tokenizer_decode(g->api->tok, &id, 1, false, &s, &len, &err) != NS_OK) {
        s = NULL;
        len = 0;
    }
    *bytes = json_array();
    bool repl = s && memmem(s, len, "\xef\xbf\xbd", 3) != NULL;
    const char *piece = repl ? ns_tokenizer_piece(g->api->tok, id) : NULL;
    bool done = false;
    if (piece) {
        json_t *b = json_array();
        size_t pl = strlen(piece), i = 0;
        bool ok = ns_utf8_valid(piece, pl, NULL);
        while (ok && i < pl) {
            uint32_t cp;
            i += ns_utf8_decode(piece, pl, i, &cp);
            int byte = ns_bytelevel_byte(cp);
            if (byte < 0) ok = false;
            else json_array_append_new(b, json_integer(byte));
        }
        if (ok) {
            json_decref(*bytes);
            *bytes = b;
            done = true;
        } else {
            json_decref(b);
        }
    }
    if (!done)
        for (size_t i = 0; i < len; i++) json_array_append_new(*bytes, json_integer((unsigned char)s[i]));
    *str = json_stringn(s ? s : "", len);
    if (!*str) *str = json_string("");
    free(s);
}

void ns_gen_chat_logprobs(const ns_gen *g, int32_t from, int32_t to, json_t *arr) {
    for (int32_t i = from; i < to && i < g->n_lps; i++) {
        const ns_token_event *ev = &g->lps[i];
        json_t *s, *b;
        token_text(g, ev->token, &s, &b);
        json_t *tops = json_array();
        for (int32_t k = 0; k < ev->n_top && k < g->top_logprobs; k++) {
            json_t *ts, *tb;
            token_text(g, ev->top_ids[k], &ts, &tb);
            json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", ts, "logprob", (double)ev->top_logprobs[k],
                                                  "bytes", tb));
        }
        json_array_append_new(arr, json_pack("{s:o,s:f,s:o,s:o}", "token", s, "logprob", (double)ev->logprob, "bytes",
                                             b, "top_logprobs", tops));
    }
}

json_t *ns_gen_completion_logprobs(const ns_gen *g, int32_t from, int32_t to, size_t *text_off) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int32_t i = from; i < to && i < g->n_lps; i++) {
        const ns_token_event *ev = &g->lps[i];
        json_t *s, *b;
        token_text(g, ev->token, &s, &b);
        json_decref(b);
        json_array_append_new(offs, json_integer((json_int_t)*text_off));
        *text_off += json_string_length(s);
        json_array_append_new(tokens, s);
        json_array_append_new(lps, json_real(ev->logprob));
        json_t *top = json_object();
        for (int32_t k = 0; k < ev->n_top && k < g->top_logprobs; k++) {
            json_t *ts, *tb;
            token_text(g, ev->top_ids[k], &ts, &tb);
            json_decref(tb);
            json_object_setn_new(top, json_string_value(ts), json_string_length(ts),
                                 json_real(ev->top_logprobs[k]));
            json_decref(ts);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

static const char *finish_name(ns_finish f) {
    switch (f) {
    case NS_FINISH_LENGTH: return "length";
    case NS_FINISH_EOS: return "eos";
    case NS_FINISH_CANCELLED: return "cancelled";
    case NS_FINISH_CONTEXT: return "context";
    case NS_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void ns_gen_free(ns_gen *g) {
    if (!g->req) return;
    if (!g->done) {
        ns_request_cancel(g->req);
        ns_request_result_get(g->req, &g->res);
    }
    const char *why = g->gone ? "client-gone" : g->stopped ? "stop-string" : finish_name(g->res.finish);
    NS_INFO("%s %s: prompt=%d cached=%d generated=%d finish=%s tool_calls=%d duration=%.3fs%s", g->kind, g->id,
            g->n_prompt, g->res.n_cached, g->n_ids, why, g->use_tools ? g->tp.n_calls : 0, ns_clock_now() - g->t0,
            g->done ? "" : " (abandoned)");
    ns_request_release(g->req);
    g->req = NULL;
    free_parsers(g);
    free(g->ids);
    free(g->lps);
    free(g->prompt);
    g->prompt = NULL;
}

/* ---- one completion request: the path shared by the endpoints ---- */

#define KEEPALIVE_S 15.0
#define KEEPALIVE_QUEUED_S 5.0

static void job_free(ns_gen_job *j) {
    if (!j) return;
    ns_record_end(&j->rec, j, NULL, NULL); /* a stream that closed (no-op when recorded already or off) */
    ns_gen_free(&j->g); /* cancels a generation that is not done */
    if (j->ep->release) j->ep->release(j);
    json_decref(j->body);
    free(j);
}

/* The logprobs not sent yet (null when there are none or they are off). */
static json_t *pending_logprobs(ns_gen_job *j) {
    if (!j->gp.rp.logprobs || j->sent_lps >= j->g.n_lps) return json_null();
    json_t *lp = j->ep->logprobs(j, j->sent_lps, j->g.n_lps);
    j->sent_lps = j->g.n_lps;
    return lp;
}

/* id, object, created, model, system_fingerprint, choices, and "usage":
 * null when the client asked for a usage chunk (as OpenAI sends it). */
static json_t *chunk(ns_gen_job *j, json_t *choices) {
    json_t *c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", j->id, "object", j->ep->chunk_object, "created",
                          (json_int_t)j->created, "model", j->a->model_name, "system_fingerprint", j->a->fingerprint,
                          "choices", choices);
    if (c && j->gp.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

ns_status ns_gen_job_emit(ns_gen_job *j, ns_buf *out, json_t *value, const char *finish) {
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, j->ep->delta_key, value, "logprobs",
                               pending_logprobs(j), "finish_reason", finish ? json_string(finish) : json_null());
    j->last_emit = ns_clock_now();
    return ns_sse_json(out, choice ? chunk(j, json_pack("[o]", choice)) : NULL);
}

ns_status ns_gen_sse_event(ns_buf *out, const char *name, json_t *data) {
    char *txt = data ? json_dumps(data, JSON_COMPACT) : NULL;
    json_decref(data);
    if (!txt) return NS_ERR_NOMEM;
    ns_status rc = ns_buf_printf(out, "event: %s\ndata: ", name);
    if (rc == NS_OK) rc = ns_buf_puts(out, txt);
    if (rc == NS_OK) rc = ns_buf_puts(out, "\n\n");
    free(txt);
    return rc;
}

ns_status ns_gen_new_text(const ns_buf *b, size_t *sent, json_t **str) {
    *str = NULL;
    if (b->len <= *sent) return NS_OK;
    size_t end = ns_utf8_complete(b->data, *sent, b->len);
    if (end <= *sent) return NS_OK;
    *str = json_stringn(b->data + *sent, end - *sent);
    *sent = end;
    return *str ? NS_OK : NS_ERR_NOMEM;
}

/* The end of a stream: an error event, or the last chunk (finish_reason)
 * and the usage chunk; then [DONE]. */
static ns_status stream_end(ns_gen_job *j, ns_buf *out) {
    ns_http_error e = {0};
    ns_status rc;
    if (j->ep->stream_end) {
        rc = j->ep->stream_end(j, out, ns_gen_failed(&j->g, &e) ? &e : NULL);
        ns_http_error_clear(&e);
        j->finished = true;
        return rc;
    }
    if (ns_gen_failed(&j->g, &e)) {
        rc = ns_sse_error(out, &e);
    } else {
        rc = ns_gen_job_emit(j, out, j->ep->final_delta(j), ns_gen_finish_reason(&j->g, true));
        if (rc == NS_OK && j->gp.include_usage) {
            json_t *c = chunk(j, json_array());
            if (c) json_object_set_new(c, "usage", ns_gen_usage(&j->g));
            rc = ns_sse_json(out, c);
        }
    }
    if (rc == NS_OK) rc = ns_sse_done(out);
    j->finished = true;
    return rc;
}

static ns_status stream_next(void *ctx, ns_buf *out, bool *eof) {
    ns_gen_job *j = ctx;
    if (j->finished) {
        *eof = true;
        return NS_OK;
    }
    if (!j->started) {
        j->started = true;
        if (j->ep->stream_start) return j->ep->stream_start(j, out);
    }
    for (;;) {
        ns_status rc = ns_gen_pump(&j->g, 50);
        if (rc == NS_ERR_CANCELLED) return rc; /* client gone: drop the connection */
        if (rc != NS_OK) {
            ns_http_error e = {0};
            ns_http_error_from_status(&e, rc, NULL, "generation failed");
            if (j->ep->stream_end) {
                rc = j->ep->stream_end(j, out, &e);
                ns_http_error_clear(&e);
            } else {
                rc = ns_sse_error(out, &e);
                if (rc == NS_OK) rc = ns_sse_done(out);
            }
            j->finished = *eof = true;
            return rc;
        }
        rc = j->ep->stream_delta(j, out);
        if (rc != NS_OK) return rc;
        if (j->g.done) {
            *eof = true;
            return stream_end(j, out);
        }
        if (out->len) return NS_OK;
        /* keep the connection warm through a long prefill, a queue or a
         * pause, and tell the client which (an SSE comment: clients
         * ignore it, people reading the stream see it) */
        bool paused = false;
        int32_t pos = 0;
        const bool queued = ns_request_waiting(j->g.req, &paused, &pos);
        /* often enough for a client or proxy with the server's idle limit
         * (conn.keepalive_s = min(15 s, --timeout / 3)); at once when the
         * client finished sending, to learn whether it still reads */
        const double ka = j->g.conn.keepalive_s > 0 && j->g.conn.keepalive_s < KEEPALIVE_S ? j->g.conn.keepalive_s
                                                                                          : KEEPALIVE_S;
        const double every = queued && KEEPALIVE_QUEUED_S < ka ? KEEPALIVE_QUEUED_S : ka;
        if (ns_http_client_probe_due(&j->g.conn) || ns_clock_now() - j->last_emit > every) {
            j->last_emit = ns_clock_now();
            if (!queued) return ns_sse_keepalive(out);
            return ns_buf_printf(out, ": %s, queue position %d\n\n", paused ? "paused" : "waiting", pos);
        }
    }
}

static void stream_close(void *ctx, bool completed) {
    (void)completed; /* ns_gen_free cancels a generation that is not done */
    job_free(ctx);
}

static void respond_whole(ns_gen_job *j, ns_http_response *resp) {
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
    if (j->ep->whole_response) {
        json_t *body = j->ep->whole_response(j);
        ns_http_set_json(resp, 200, body ? json_dumps(body, JSON_COMPACT) : NULL); /* NULL: 500 */
        json_decref(body);
        return;
    }
    const char *finish = ns_gen_finish_reason(&j->g, false);
    json_t *lp = j->gp.rp.logprobs ? j->ep->logprobs(j, 0, j->g.n_lps) : json_null();
    json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, j->ep->whole_key, j->ep->whole_output(j, finish),
                               "logprobs", lp, "finish_reason", finish);
    if (choice && j->gp.return_token_ids) {
        json_t *ids = json_array();
        for (int32_t i = 0; i < j->g.n_ids; i++) json_array_append_new(ids, json_integer(j->g.ids[i]));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_t *root = json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o}", "id", j->id, "object", j->ep->object, "created",
                             (json_int_t)j->created, "model", j->a->model_name, "system_fingerprint",
                             j->a->fingerprint, "choices", choice, "usage", ns_gen_usage(&j->g));
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL); /* NULL: 500 */
    json_decref(root);
}

void ns_gen_handle(const ns_gen_endpoint *ep, void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    ns_record_req *rec = ns_record_begin(a, req); /* NULL unless serve --record */
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) {
        ns_record_end(&rec, NULL, req, resp);
        return;
    }
    ns_gen_job *j = calloc(1, ep->job_size);
    if (!j) {
        json_decref(body);
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        ns_record_end(&rec, NULL, req, resp);
        return;
    }
    j->ep = ep;
    j->a = a;
    j->body = body;
    j->rec = rec;
    j->created = time(NULL);
    ns_api_random_id(ep->id_prefix, j->id, sizeof j->id);
    ns_log_set_context("%s", j->id); /* every line of this request carries its id */
    if (ep->parse_params ? !ep->parse_params(j, &resp->err) : !ns_api_parse_gen_params(a, body, ep->chat, &j->gp, &resp->err))
        goto done;
    ns_gen_opts go = {
        .rp = j->gp.rp,
        .stops = j->gp.stops,
        .n_stops = j->gp.n_stops,
        .kind = ep->kind,
        .max_calls = 0,
    };
    /* a grammar prepare attached (structured.h) belongs to go until the
     * request takes it: every failure before that frees it */
    if (!ep->prepare(j, &go, &resp->err) ||
        !ns_api_check_context(a, (int32_t)(j->n_prompt > INT32_MAX ? INT32_MAX : j->n_prompt), j->gp.rp.max_tokens,
                              ep->prompt_param, &resp->err)) {
        ns_structured_detach(&go);
        goto done;
    }
    if (!ns_gen_start(&j->g, a, j->prompt, (int32_t)j->n_prompt, &go, &req->conn, j->id, &resp->err)) {
        if (!j->g.req_made) ns_structured_detach(&go);
        goto done;
    }
    snprintf(resp->headers, sizeof resp->headers, "%s", j->headers);
    if (j->gp.stream) {
        j->last_emit = ns_clock_now();
        resp->status = 200;
        resp->content_type = "text/event-stream";
        resp->stream.ctx = j;
        resp->stream.next = stream_next;
        resp->stream.close = stream_close;
        return;
    }
    respond_whole(j, resp);
done: /* also the end of a non-streaming request */
    ns_record_end(&j->rec, j, req, resp);
    job_free(j);
}
