/* admin.c — the KV cache's operator endpoints (guarded by --admin-key, or
 * by --api-key when no admin key is set):
 *
 *   POST /admin/flush  returns once every page committed so far is durable
 *                      in the SSD tier: {"complete", "durable", "pending",
 *                      "failed", "seconds"}; optional body {"timeout_ms"}.
 *   GET  /admin/cache  per-tier pages, bytes, capacity, hits, promotions,
 *                      and the SSD tier's write-behind and health counters.
 */
#include "api/api.h"
#include "util/clock.h"

#define FLUSH_TIMEOUT_DEFAULT_MS 60000
#define FLUSH_TIMEOUT_MAX_MS 3600000

void ns_api_admin_flush(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    int64_t timeout_ms = FLUSH_TIMEOUT_DEFAULT_MS;
    if (req->body_len > 0) {
        json_t *body = ns_api_parse_body(a, req, resp);
        if (!body) return;
        bool ok = ns_api_get_int(body, "timeout_ms", 0, FLUSH_TIMEOUT_MAX_MS, &timeout_ms, &resp->err);
        json_decref(body);
        if (!ok) return;
    }
    ns_kv_ssd_flush_result fr;
    ns_error err = {0};
    const double t0 = ns_clock_now();
    ns_status st = ns_sched_flush(a->sched, (int)timeout_ms, &fr, &err);
    if (st == NS_ERR_UNSUPPORTED) {
        ns_http_error_set(&resp->err, 409, NULL, "ssd_cache_off", "%s", err.msg);
        return;
    }
    json_t *root = json_pack("{s:b,s:I,s:I,s:I,s:f}", "complete", st == NS_OK, "durable", (json_int_t)fr.durable,
                             "pending", (json_int_t)fr.pending, "failed", (json_int_t)fr.failed, "seconds",
                             ns_clock_now() - t0);
    if (root && st != NS_OK) json_object_set_new(root, "message", json_string(err.msg));
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}

static json_t *tier_json(const ns_kv_cache_stats *k, ns_kv_tier t) {
    json_t *o = json_pack("{s:b,s:I,s:I,s:I,s:I}", "enabled", t == NS_TIER_SSD ? k->ssd_on : k->capacity[t] >= 0,
                          "pages", (json_int_t)k->pages[t], "bytes", (json_int_t)(k->pages[t] * k->page_bytes),
                          "hit_tokens", (json_int_t)k->hit_tokens[t], "promotions", (json_int_t)k->promotions[t]);
    if (o && t != NS_TIER_SSD && k->capacity[t] >= 0) {
        json_object_set_new(o, "capacity_pages", json_integer(k->capacity[t]));
        json_object_set_new(o, "capacity_bytes", json_integer(k->capacity[t] * k->page_bytes));
    }
    return o;
}

void ns_api_admin_cache(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    ns_sched_stats st;
    ns_sched_get_stats(a->sched, &st);
    const ns_kv_cache_stats *k = &st.kv;
    json_t *dev = tier_json(k, NS_TIER_DEVICE), *ram = tier_json(k, NS_TIER_RAM), *ssd = tier_json(k, NS_TIER_SSD);
    if (dev) {
        json_object_set_new(dev, "pages_held", json_integer(k->pool_held));
        json_object_set_new(dev, "pages_free", json_integer(k->pool_free));
        json_object_set_new(dev, "pages_cached", json_integer(k->pool_cached));
    }
    if (ssd) {
        const ns_kv_ssd_stats *s = &k->ssd;
        json_object_set_new(ssd, "bytes", json_integer(s->bytes)); /* on disk, with record headers */
        json_t *extra = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b}", "commit_pending",
                                  (json_int_t)k->ssd_pending, "queue_depth", (json_int_t)s->queue_depth, "writes",
                                  (json_int_t)s->writes, "bytes_written", (json_int_t)s->bytes_written, "dropped",
                                  (json_int_t)s->dropped, "failed", (json_int_t)s->failed, "checksum_failures",
                                  (json_int_t)s->checksum_failures, "evicted", (json_int_t)s->evicted,
                                  "foreign_records", (json_int_t)s->n_foreign, "degraded", s->degraded);
        if (extra) json_object_update(ssd, extra);
        json_decref(extra);
    }
    json_t *root = json_pack("{s:i,s:I,s:s,s:I,s:{s:o,s:o,s:o},s:I,s:I}", "page_tokens", k->page_tokens, "page_bytes",
                             (json_int_t)k->page_bytes, "kv_dtype", ns_dtype_name((ns_dtype)st.kv_dtype),
                             "kv_bytes_per_token", (json_int_t)st.kv_bytes_per_token, "tiers", "device", dev, "ram",
                             ram, "ssd", ssd, "demotions", (json_int_t)k->demotions, "evictions",
                             (json_int_t)k->evictions);
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}
