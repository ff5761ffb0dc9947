/* record_gen.c — one record per completion request (see record_gen.h). */
#include "record/record_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "record/recorder.h"
#include "record/redact.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"

struct ns_record_req {
    ns_api *a;
    struct timespec wall; /* arrival, CLOCK_REALTIME */
    double t_arrive;      /* arrival, ns_clock_now */
    char endpoint[128];
};

ns_record_req *ns_record_begin(ns_api *a, const ns_http_request *req) {
    if (!a || !a->recorder) return NULL;
    ns_record_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->a = a;
    clock_gettime(CLOCK_REALTIME, &r->wall);
    r->t_arrive = ns_clock_now();
    snprintf(r->endpoint, sizeof r->endpoint, "%s", req && req->path ? req->path : "");
    return r;
}

static long long count_tokens(void *ctx, const char *s, size_t n) {
    ns_api *a = ctx;
    if (!a->tok) return -1;
    int32_t *ids = NULL;
    size_t k = 0;
    if (ns_tokenizer_encode(a->tok, s, n, false, &ids, &k, NULL) != NS_OK) return -1;
    free(ids);
    return (long long)k;
}

/* "time" and "t" from the arrival wall clock. */
static void set_time(json_t *o, const struct timespec *w) {
    struct tm tm;
    time_t secs = w->tv_sec;
    gmtime_r(&secs, &tm);
    char iso[64];
    snprintf(iso, sizeof iso, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, w->tv_nsec / 1000000L);
    json_object_set_new(o, "time", json_string(iso));
    json_object_set_new(o, "t", json_real((double)w->tv_sec + (double)w->tv_nsec * 1e-9));
}

/* What the client was sent: content (after tool-call parsing), reasoning
 * and the generated token ids (what the prefix cache holds after the
 * prompt; check-prompts compares the next turn against prompt + these).
 * Redacted: the texts as placeholders, no ids. */
static json_t *output_obj(ns_api *a, const ns_gen *g) {
    const ns_buf *c = ns_gen_content(g);
    json_t *content = json_stringn(c->data ? c->data : "", c->len);
    json_t *reasoning = json_stringn(g->reasoning.data ? g->reasoning.data : "", g->reasoning.len);
    json_t *o = json_object();
    if (!content || !reasoning || !o) {
        json_decref(content);
        json_decref(reasoning);
        json_decref(o);
        return json_null();
    }
    if (a->record_redact) {
        json_t *rc = ns_redact_body(content, count_tokens, a), *rr = ns_redact_body(reasoning, count_tokens, a);
        json_decref(content);
        json_decref(reasoning);
        content = rc ? rc : json_null();
        reasoning = rr ? rr : json_null();
    }
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "reasoning", reasoning);
    if (g->use_tools) json_object_set_new(o, "tool_calls", json_integer(g->tp.n_calls));
    if (!a->record_redact) {
        json_t *ids = json_array();
        for (int32_t i = 0; ids && i < g->n_ids; i++) json_array_append_new(ids, json_integer(g->ids[i]));
        json_object_set_new(o, "ids", ids ? ids : json_null());
    }
    return o;
}

/* The generation's numbers: only when it was submitted (g->req set). */
static void set_gen(json_t *o, const ns_record_req *r, const ns_gen_job *j, bool failed) {
    const ns_gen *g = &j->g;
    json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)j->n_prompt));
    if (!g->req) {
        json_object_set_new(o, "cached_tokens", json_integer(0));
        json_object_set_new(o, "output_tokens", json_integer(0));
        json_object_set_new(o, "ttft_s", json_null());
        json_object_set_new(o, "finish_reason", json_null());
        return;
    }
    ns_request_result res = g->res;
    if (!g->done) ns_request_result_get(g->req, &res); /* a stream cut short */
    const int32_t *t = res.n_cached_by_tier;
    json_object_set_new(o, "cached_tokens", json_integer(res.n_cached));
    json_object_set_new(o, "cached_tokens_by_tier",
                        json_pack("{s:i,s:i,s:i}", "device", t[NS_TIER_DEVICE], "ram", t[NS_TIER_RAM], "ssd",
                                  t[NS_TIER_SSD]));
    json_object_set_new(o, "output_tokens", json_integer(g->n_ids));
    json_object_set_new(o, "ttft_s", g->t_first > 0 ? json_real(g->t_first - r->t_arrive) : json_null());
    json_object_set_new(o, "finish_reason",
                        g->done && !failed ? json_string(ns_gen_finish_reason(g, j->gp.stream)) : json_null());
    json_object_set_new(o, "client_gone", json_boolean(g->gone));
    if (g->done && !failed) json_object_set_new(o, "output", output_obj(r->a, g));
}

static json_t *error_obj(const ns_http_error *e) {
    return json_pack("{s:s,s:s}", "code", e->code[0] ? e->code : "error", "message", e->message);
}

void ns_record_end(ns_record_req **rp, const ns_gen_job *j, const ns_http_request *req, const ns_http_response *resp) {
    ns_record_req *r = rp ? *rp : NULL;
    if (!r) return;
    *rp = NULL;
    ns_api *a = r->a;
    json_t *o = json_object();
    if (!o) goto out;
    json_object_set_new(o, "v", json_integer(1));
    set_time(o, &r->wall);
    json_object_set_new(o, "endpoint", json_string(r->endpoint));
    if (j && j->id[0]) json_object_set_new(o, "id", json_string(j->id));
    /* the HTTP status: a stream answered 200 before it ran */
    int status = resp ? (resp->err.status ? resp->err.status : resp->status ? resp->status : 200) : 200;
    json_object_set_new(o, "status", json_integer(status));
    json_object_set_new(o, "stream", json_boolean(j && j->gp.stream));
    json_object_set_new(o, "redacted", json_boolean(a->record_redact));
    ns_http_error ge = {0};
    bool failed = j && j->g.req && j->g.done && ns_gen_failed(&j->g, &ge);
    if (j) set_gen(o, r, j, failed);
    json_object_set_new(o, "duration_s", json_real(ns_clock_now() - r->t_arrive));
    if (resp && resp->err.status) json_object_set_new(o, "error", error_obj(&resp->err));
    else if (failed) json_object_set_new(o, "error", error_obj(&ge));
    ns_http_error_clear(&ge);
    if (j && j->body) {
        json_t *body = a->record_redact ? ns_redact_body(j->body, count_tokens, a) : json_incref(j->body);
        json_object_set_new(o, "request", body ? body : json_null());
    } else {
        json_object_set_new(o, "request", json_null());
        json_object_set_new(o, "request_bytes", json_integer(req ? (json_int_t)req->body_len : 0));
    }
    char *line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (line) ns_recorder_push(a->recorder, line, strlen(line));
out:
    json_decref(o);
    free(r);
}
