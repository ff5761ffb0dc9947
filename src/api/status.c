/* status.c — GET /v1/status: the live state of the engine as JSON, for
 * the dashboard (GET /dashboard) and for scripts: every request with its
 * state (waiting with queue position, prefilling with progress, decoding
 * with tok/s, paused), prompt and cached tokens per tier, KV usage per
 * tier, recent cache breaks (where a prompt diverged from the cache) and
 * step time / batch size per second over the last minutes.
 *
 * The handler runs on the server's event loop (a GET): it only copies the
 * snapshot the engine thread published (sched_status.h: a short memcpy
 * under that module's mutex, never the scheduler's) and formats it, so it
 * neither blocks nor stalls the engine. No prompt text is included. */
#include <stdlib.h>

#include "api/api.h"
#include "sched/sched_status.h"

static json_t *tiers_json(const int32_t v[NS_TIER_COUNT]) {
    return json_pack("{s:i,s:i,s:i}", "device", v[NS_TIER_DEVICE], "ram", v[NS_TIER_RAM], "ssd", v[NS_TIER_SSD]);
}

static json_t *req_json(const ns_status_req *q) {
    json_t *o = json_pack("{s:s,s:s,s:i,s:i,s:{s:i,s:i},s:i,s:o,s:i,s:i,s:i,s:f}", "id", q->id, "state",
                          ns_status_state_name(q->state), "queue_position", q->queue_pos, "prompt_tokens", q->n_prompt,
                          "prefill", "done", q->prefill_done, "total", q->prefill_total, "cached_tokens", q->n_cached,
                          "cached_tokens_by_tier", tiers_json(q->cached_by_tier), "generated_tokens", q->n_generated,
                          "max_tokens", q->max_tokens, "pauses", q->n_pauses, "age_s", q->age_s);
    if (!o) return NULL;
    json_object_set_new(o, "ttft_s", q->ttft_s >= 0 ? json_real(q->ttft_s) : json_null());
    json_object_set_new(o, "decode_tokens_per_s", json_real(q->decode_tps));
    return o;
}

static json_t *tier_json(const ns_status_tier *t, int32_t P) {
    json_t *o = json_pack("{s:b,s:I,s:I,s:I,s:I}", "enabled", t->enabled, "used_pages", (json_int_t)t->used_pages,
                          "cached_pages", (json_int_t)t->cached_pages, "used_tokens",
                          (json_int_t)(t->used_pages * P), "cached_tokens", (json_int_t)(t->cached_pages * P));
    if (!o) return NULL;
    json_object_set_new(o, "capacity_pages",
                        t->capacity_pages >= 0 ? json_integer((json_int_t)t->capacity_pages) : json_null());
    return o;
}

static json_t *break_json(const ns_status_break *b) {
    return json_pack("{s:f,s:s,s:i,s:i,s:i,s:o}", "time", b->unix_time, "id", b->id, "prompt_tokens", b->n_prompt,
                     "diverged_at", b->diverge_at, "cached_tokens", b->n_cached, "cached_tokens_by_tier",
                     tiers_json(b->cached_by_tier));
}

static json_t *second_json(const ns_status_second *b) {
    const double n = b->steps > 0 ? b->steps : 1;
    return json_pack("{s:I,s:i,s:f,s:f,s:f,s:i,s:f,s:i}", "time", (json_int_t)b->unix_sec, "steps", b->steps,
                     "step_ms_mean", 1e3 * b->sum_step_s / n, "step_ms_max", 1e3 * b->max_step_s, "batch_tokens_mean",
                     (double)b->sum_batch_tokens / n, "batch_tokens_max", b->max_batch_tokens, "batch_seqs_mean",
                     (double)b->sum_seqs / n, "batch_seqs_max", b->max_seqs);
}

/* Builds the whole document; NULL on OOM. Borrows snap. */
static json_t *status_json(const ns_api *a, const ns_status_snapshot *snap) {
    json_t *reqs = json_array(), *breaks = json_array(), *secs = json_array();
    json_t *kv = json_object();
    json_t *root = json_pack("{s:s,s:s,s:f,s:I,s:i,s:i,s:i,s:i,s:I}", "object", "nightshift.status", "model",
                             a->model_name, "time", snap->unix_time, "snapshot", (json_int_t)snap->seq, "page_tokens",
                             snap->page_tokens, "requests_total", snap->n_requests, "requests_listed", snap->n_listed,
                             "requests_incoming", snap->n_incoming, "cache_breaks_total",
                             (json_int_t)snap->breaks_total);
    bool ok = reqs && breaks && secs && kv && root;
    if (ok) { /* the KV format (--kv-dtype) and its cost per token: fixed for the server's life */
        ns_sched_stats st;
        ns_sched_get_stats(a->sched, &st);
        ok = json_object_set_new(root, "kv_dtype", json_string(ns_dtype_name((ns_dtype)st.kv_dtype))) == 0 &&
             json_object_set_new(root, "kv_bytes_per_token", json_integer((json_int_t)st.kv_bytes_per_token)) == 0;
    }
    for (int32_t i = 0; ok && i < snap->n_listed; i++) ok = json_array_append_new(reqs, req_json(&snap->reqs[i])) == 0;
    static const char *const names[NS_TIER_COUNT] = {"device", "ram", "ssd"};
    for (int t = 0; ok && t < NS_TIER_COUNT; t++)
        ok = json_object_set_new(kv, names[t], tier_json(&snap->tiers[t], snap->page_tokens)) == 0;
    for (int32_t i = 0; ok && i < snap->n_breaks; i++) ok = json_array_append_new(breaks, break_json(&snap->breaks[i])) == 0;
    for (int32_t i = 0; ok && i < snap->n_seconds; i++)
        ok = json_array_append_new(secs, second_json(&snap->seconds[i])) == 0;
    if (!ok) {
        json_decref(reqs);
        json_decref(breaks);
        json_decref(secs);
        json_decref(kv);
        json_decref(root);
        return NULL;
    }
    json_object_set_new(root, "requests", reqs);
    json_object_set_new(root, "kv", kv);
    json_object_set_new(root, "cache_breaks", breaks);
    json_object_set_new(root, "steps_per_second", secs);
    return root;
}

void ns_api_status(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    ns_status_snapshot *snap = malloc(sizeof *snap); /* ~80 KB: not on the event loop's stack */
    if (!snap) {
        ns_http_error_set(&resp->err, 503, NULL, "server_busy", "out of memory; retry shortly");
        resp->retry_after_s = 1;
        return;
    }
    ns_sched_status_get(ns_sched_status_of(a->sched), snap);
    json_t *root = status_json(a, snap);
    free(snap);
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) {
        ns_http_error_set(&resp->err, 503, NULL, "server_busy", "out of memory; retry shortly");
        resp->retry_after_s = 1;
        return;
    }
    ns_http_set_json(resp, 200, text);
}
