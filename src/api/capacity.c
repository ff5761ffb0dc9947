/* capacity.c — what a client may ask for right now, from
 * ns_sched_get_capacity:
 *
 *   GET /v1/capacity  running/waiting/paused requests, admissible and
 *                     largest-fits-alone tokens, context and pool tokens,
 *                     and per KV tier free/used/cached tokens.
 *   X-Nightshift-Max-Context-Tokens on every response: the server calls
 *                     ns_api_max_context_tokens while building each one.
 */
#include "api/api.h"

long long ns_api_max_context_tokens(void *ud) {
    ns_api *a = ud;
    /* only READY guarantees a->sched was published (the loader may still
     * be writing it while a shutdown that began during loading drains) */
    if (!a || atomic_load(&a->state) != NS_API_READY || !a->sched) return -1;
    ns_sched_capacity c;
    ns_sched_get_capacity(a->sched, &c);
    int64_t v = c.admissible_tokens < c.context_tokens ? c.admissible_tokens : c.context_tokens;
    return v < 0 ? 0 : (long long)v;
}

static json_t *tier_json(const ns_tier_capacity *t) {
    return json_pack("{s:b,s:I,s:I,s:I}", "enabled", t->enabled, "free_tokens", (json_int_t)t->free_tokens,
                     "used_tokens", (json_int_t)t->used_tokens, "cached_tokens", (json_int_t)t->cached_tokens);
}

void ns_api_capacity(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    ns_sched_capacity c;
    ns_sched_get_capacity(a->sched, &c);
    json_t *root = json_pack("{s:i,s:i,s:i,s:I,s:I,s:I,s:I,s:{s:o,s:o,s:o}}", "running", c.running, "waiting",
                             c.waiting, "paused", c.paused, "admissible_tokens", (json_int_t)c.admissible_tokens,
                             "largest_fits_alone_tokens", (json_int_t)c.largest_fits_alone_tokens, "context_tokens",
                             (json_int_t)c.context_tokens, "pool_tokens", (json_int_t)c.pool_tokens, "tiers", "device",
                             tier_json(&c.tiers[NS_TIER_DEVICE]), "ram", tier_json(&c.tiers[NS_TIER_RAM]), "ssd",
                             tier_json(&c.tiers[NS_TIER_SSD]));
    if (root) { /* the KV format and its cost per token (--kv-dtype): what the pool's tokens are made of */
        ns_sched_stats st;
        ns_sched_get_stats(a->sched, &st);
        json_object_set_new(root, "kv_dtype", json_string(ns_dtype_name((ns_dtype)st.kv_dtype)));
        json_object_set_new(root, "kv_bytes_per_token", json_integer((json_int_t)st.kv_bytes_per_token));
    }
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}
