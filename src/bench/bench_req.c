/* bench_req.c — one measured request (see bench_req.h). */
#include "bench/bench_req.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct stream_ctx {
    ns_bench_req_result *r;
    double t_first, t_last;
    bool done, failed;
    size_t text_len;
} stream_ctx;

static void append_text(ns_bench_req_result *r, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (*len + n > NS_BENCH_TEXT_CAP) {
        n = NS_BENCH_TEXT_CAP - *len;
        r->text_truncated = true;
    }
    memcpy(r->text + *len, s, n);
    *len += n;
    r->text[*len] = 0;
}

static void read_usage(ns_bench_req_result *r, json_t *u) {
    if (!json_is_object(u)) return;
    json_t *p = json_object_get(u, "prompt_tokens"), *c = json_object_get(u, "completion_tokens");
    if (json_is_integer(p)) r->prompt_tokens = json_integer_value(p);
    if (json_is_integer(c)) r->completion_tokens = json_integer_value(c);
    json_t *d = json_object_get(u, "prompt_tokens_details");
    json_t *ct = json_is_object(d) ? json_object_get(d, "cached_tokens") : NULL;
    if (json_is_integer(ct)) r->cached_tokens = json_integer_value(ct);
}

/* The generated text of choices[0] of a chunk or a whole answer: "text"
 * (completions), delta/message "content" and "reasoning_content" (chat).
 * NULL when the chunk carries none (a role-only or usage-only chunk). */
static const char *choice_text(json_t *choice, const char **reasoning) {
    *reasoning = NULL;
    json_t *t = json_object_get(choice, "text");
    if (json_is_string(t)) return json_string_value(t);
    json_t *d = json_object_get(choice, "delta");
    if (!json_is_object(d)) d = json_object_get(choice, "message");
    if (!json_is_object(d)) return NULL;
    json_t *rc = json_object_get(d, "reasoning_content");
    if (json_is_string(rc)) *reasoning = json_string_value(rc);
    json_t *c = json_object_get(d, "content");
    return json_is_string(c) ? json_string_value(c) : NULL;
}

static bool on_event(void *vctx, const char *event, const char *data, size_t data_len, double t) {
    (void)event;
    stream_ctx *x = vctx;
    ns_bench_req_result *r = x->r;
    if (data_len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        x->done = true;
        return true;
    }
    json_error_t je;
    json_t *j = json_loadb(data, data_len, 0, &je);
    if (!j) {
        snprintf(r->error, sizeof r->error, "invalid JSON in a stream event: %s", je.text);
        x->failed = true;
        return false;
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
        snprintf(r->error, sizeof r->error, "error event: %.250s", json_is_string(m) ? json_string_value(m) : "?");
        x->failed = true;
        json_decref(j);
        return false;
    }
    read_usage(r, json_object_get(j, "usage"));
    json_t *ch = json_object_get(j, "choices");
    json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
    if (json_is_object(c0)) {
        const char *reasoning = NULL, *s = choice_text(c0, &reasoning);
        if ((s && *s) || (reasoning && *reasoning)) {
            if (r->n_text_events++ == 0) x->t_first = t;
            x->t_last = t;
            if (reasoning) append_text(r, &x->text_len, reasoning);
            if (s) append_text(r, &x->text_len, s);
        }
        json_t *fr = json_object_get(c0, "finish_reason");
        if (json_is_string(fr)) snprintf(r->finish_reason, sizeof r->finish_reason, "%s", json_string_value(fr));
    }
    json_decref(j);
    return true;
}

static void result_init(ns_bench_req_result *r) {
    memset(r, 0, sizeof *r);
    r->prompt_tokens = r->completion_tokens = r->cached_tokens = -1;
    r->ttft_s = -1;
    r->text = calloc(1, NS_BENCH_TEXT_CAP + 1);
}

/* A failed status: the server's error message when it sent one. */
static void status_error(ns_bench_req_result *r, const ns_hc_response *resp) {
    const char *msg = "";
    json_t *j = resp->body ? json_loadb(resp->body, resp->body_len, 0, NULL) : NULL;
    json_t *e = j ? json_object_get(j, "error") : NULL;
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (json_is_string(m)) msg = json_string_value(m);
    snprintf(r->error, sizeof r->error, "HTTP %ld: %.280s", resp->status, msg);
    json_decref(j);
}

bool ns_bench_req_run(ns_hc *hc, const char *url, const char *const *headers, const char *body, double timeout_s,
                      ns_bench_req_result *out) {
    result_init(out);
    if (!out->text) {
        snprintf(out->error, sizeof out->error, "out of memory");
        return false;
    }
    stream_ctx x = {.r = out};
    ns_hc_opts o = {.timeout_s = timeout_s};
    ns_hc_response resp;
    ns_error err = {0};
    ns_status st = ns_hc_post(hc, url, headers, body, strlen(body), &o, on_event, &x, &resp, &err);
    out->status = resp.status;
    out->t_start = resp.t_start;
    out->total_s = resp.t_end - resp.t_start;
    if (x.failed) {
        /* the message came from on_event */
    } else if (st != NS_OK) {
        snprintf(out->error, sizeof out->error, "%.300s", resp.error[0] ? resp.error : err.msg);
    } else if (resp.status < 200 || resp.status > 299) {
        status_error(out, &resp);
    } else if (!resp.streamed) {
        snprintf(out->error, sizeof out->error, "the server answered %s, not an event stream",
                 resp.content_type[0] ? resp.content_type : "without a Content-Type");
    } else if (!x.done) {
        snprintf(out->error, sizeof out->error, "the stream ended without [DONE]");
    } else if (out->n_text_events == 0) {
        snprintf(out->error, sizeof out->error, "the stream carried no generated text");
    } else {
        out->ok = true;
        out->ttft_s = x.t_first - resp.t_start;
        int64_t n = out->completion_tokens >= 0 ? out->completion_tokens : out->n_text_events;
        out->decode_tps = n > 1 && x.t_last > x.t_first ? (double)(n - 1) / (x.t_last - x.t_first) : 0;
    }
    ns_hc_response_free(&resp);
    return out->ok;
}

bool ns_bench_req_run_whole(ns_hc *hc, const char *url, const char *const *headers, const char *body,
                            double timeout_s, ns_bench_req_result *out) {
    result_init(out);
    if (!out->text) {
        snprintf(out->error, sizeof out->error, "out of memory");
        return false;
    }
    ns_hc_opts o = {.timeout_s = timeout_s};
    ns_hc_response resp;
    ns_error err = {0};
    ns_status st = ns_hc_post(hc, url, headers, body, strlen(body), &o, NULL, NULL, &resp, &err);
    out->status = resp.status;
    out->t_start = resp.t_start;
    out->total_s = resp.t_end - resp.t_start;
    json_t *j = NULL;
    if (st != NS_OK) {
        snprintf(out->error, sizeof out->error, "%.300s", resp.error[0] ? resp.error : err.msg);
    } else if (resp.status < 200 || resp.status > 299) {
        status_error(out, &resp);
    } else if (!(j = json_loadb(resp.body ? resp.body : "", resp.body_len, 0, NULL))) {
        snprintf(out->error, sizeof out->error, "the answer is not JSON");
    } else {
        read_usage(out, json_object_get(j, "usage"));
        json_t *ch = json_object_get(j, "choices");
        json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
        const char *reasoning = NULL, *s = json_is_object(c0) ? choice_text(c0, &reasoning) : NULL;
        size_t len = 0;
        if (reasoning) append_text(out, &len, reasoning);
        if (s) append_text(out, &len, s);
        json_t *fr = json_is_object(c0) ? json_object_get(c0, "finish_reason") : NULL;
        if (json_is_string(fr)) snprintf(out->finish_reason, sizeof out->finish_reason, "%s", json_string_value(fr));
        out->ok = json_is_object(c0);
        if (!out->ok) snprintf(out->error, sizeof out->error, "the answer has no choices[0]");
        out->ttft_s = out->total_s;
    }
    json_decref(j);
    ns_hc_response_free(&resp);
    return out->ok;
}

void ns_bench_req_result_free(ns_bench_req_result *r) {
    free(r->text);
    r->text = NULL;
}
