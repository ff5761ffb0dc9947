/* metrics.c — GET /metrics: Prometheus text exposition (version 0.0.4) of
 * the scheduler's snapshot (requests, tokens, prefix cache, KV pages, step
 * and latency histograms) and the HTTP server's counters. */
#include <math.h>
#include <stdlib.h>

#include "api/api.h"
#include "record/recorder.h"

static void gauge(ns_buf *b, const char *name, const char *help, double v) {
    ns_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void counter(ns_buf *b, const char *name, const char *help, uint64_t v) {
    ns_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void histogram(ns_buf *b, const char *name, const char *help, const ns_histogram *h) {
    ns_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < NS_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        if (isinf(h->bounds[i])) break;
        ns_buf_printf(b, "%s_bucket{le=\"%.6g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    ns_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->count,
                  name, h->sum, name, (unsigned long long)h->count);
}

/* Per-tier KV cache series (labelled tier="device|ram|ssd") and the SSD
 * tier's write-behind and health counters. */
static void kv_tier_metrics(ns_buf *b, const ns_kv_cache_stats *k) {
    static const char *const fam[][3] = {
        {"nightshift_kv_cache_pages", "gauge", "Pages of cached KV held by each tier."},
        {"nightshift_kv_cache_bytes", "gauge", "Bytes of cached KV held by each tier."},
        {"nightshift_kv_cache_hit_tokens_total", "counter", "Prompt tokens served from each tier."},
        {"nightshift_kv_cache_promotions_total", "counter", "Pages brought onto the device from each tier."},
    };
    for (int f = 0; f < 4; f++) {
        ns_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam[f][0], fam[f][2], fam[f][0], fam[f][1]);
        for (int t = 0; t < NS_TIER_COUNT; t++) {
            double v = f == 0   ? (double)k->pages[t]
                       : f == 1 ? (double)k->pages[t] * (double)k->page_bytes
                       : f == 2 ? (double)k->hit_tokens[t]
                                : (double)k->promotions[t];
            ns_buf_printf(b, "%s{tier=\"%s\"} %.17g\n", fam[f][0], ns_kv_tier_name((ns_kv_tier)t), v);
        }
    }
    counter(b, "nightshift_kv_cache_demotions_total", "Device pages demoted to the RAM tier.", k->demotions);
    counter(b, "nightshift_kv_cache_evictions_total", "Cached pages dropped from every tier.", k->evictions);
    const ns_kv_ssd_stats *s = &k->ssd;
    gauge(b, "nightshift_kv_ssd_enabled", "1 when the SSD tier is open.", k->ssd_on);
    gauge(b, "nightshift_kv_ssd_degraded", "1 after an I/O error or a full disk stopped SSD writes.", s->degraded);
    gauge(b, "nightshift_kv_ssd_write_queue_pages", "Pages waiting to be written to the SSD tier (queued + not yet handed over).",
          (double)(s->queue_depth + k->ssd_pending));
    counter(b, "nightshift_kv_ssd_bytes_written_total", "Bytes written to SSD segment files.", (uint64_t)s->bytes_written);
    counter(b, "nightshift_kv_ssd_writes_total", "Page records written to the SSD tier.", (uint64_t)s->writes);
    counter(b, "nightshift_kv_ssd_dropped_total", "Pages not written: queue full or tier degraded.", (uint64_t)s->dropped);
    counter(b, "nightshift_kv_ssd_write_failures_total", "Page records whose write failed.", (uint64_t)s->failed);
    counter(b, "nightshift_kv_ssd_checksum_failures_total", "Records skipped because verification failed.",
            (uint64_t)s->checksum_failures);
    counter(b, "nightshift_kv_ssd_foreign_records", "Records of other models/formats seen at start (never served).",
            (uint64_t)s->n_foreign);
    ns_buf_printf(b, "# HELP nightshift_kv_ssd_fsync_seconds Segment fsync latency.\n"
                     "# TYPE nightshift_kv_ssd_fsync_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < NS_KV_SSD_FSYNC_BUCKETS; i++) {
        cum += s->fsync_counts[i];
        if (isinf(s->fsync_bounds[i])) break;
        ns_buf_printf(b, "nightshift_kv_ssd_fsync_seconds_bucket{le=\"%.6g\"} %llu\n", s->fsync_bounds[i],
                      (unsigned long long)cum);
    }
    ns_buf_printf(b,
                  "nightshift_kv_ssd_fsync_seconds_bucket{le=\"+Inf\"} %llu\nnightshift_kv_ssd_fsync_seconds_sum %.9g\n"
                  "nightshift_kv_ssd_fsync_seconds_count %llu\n",
                  (unsigned long long)s->fsync_count, s->fsync_sum, (unsigned long long)s->fsync_count);
}

void ns_api_metrics(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    ns_sched_stats st;
    ns_sched_get_stats(a->sched, &st);
    ns_buf b;
    ns_buf_init(&b, 1u << 20);
    gauge(&b, "nightshift_requests_running", "Requests prefilling or decoding.", st.requests_running);
    gauge(&b, "nightshift_requests_waiting", "Requests queued for admission.", st.requests_waiting);
    counter(&b, "nightshift_requests_total", "Requests submitted to the scheduler.", st.requests_total);
    counter(&b, "nightshift_requests_rejected_total", "Requests refused because they can never fit.",
            st.requests_rejected);
    counter(&b, "nightshift_requests_cancelled_total", "Requests cancelled (client gone, stop string, shutdown).",
            st.requests_cancelled);
    counter(&b, "nightshift_prompt_tokens_total", "Prompt tokens submitted.", st.prompt_tokens_total);
    counter(&b, "nightshift_generated_tokens_total", "Tokens generated.", st.generated_tokens_total);
    counter(&b, "nightshift_prefix_cache_lookup_tokens_total", "Prompt tokens looked up in the prefix cache.",
            st.prefix_lookup_tokens_total);
    counter(&b, "nightshift_prefix_cache_hit_tokens_total", "Prompt tokens whose KV was reused.",
            st.prefix_hit_tokens_total);
    gauge(&b, "nightshift_kv_pages_total", "KV pages in the pool.", st.pages_total);
    ns_buf_printf(&b,
                  "# HELP nightshift_kv_pages KV pages by state.\n# TYPE nightshift_kv_pages gauge\n"
                  "nightshift_kv_pages{state=\"used\"} %d\nnightshift_kv_pages{state=\"free\"} %d\n"
                  "nightshift_kv_pages{state=\"cached\"} %d\n",
                  st.pages_used, st.pages_free, st.pages_cached);
    gauge(&b, "nightshift_kv_page_tokens", "Tokens per KV page.", st.page_tokens);
    gauge(&b, "nightshift_kv_bytes_per_token", "KV bytes per token (all layers, K and V; FP8 includes its scales).",
          st.kv_bytes_per_token);
    ns_buf_printf(&b,
                  "# HELP nightshift_kv_dtype_info KV element type (--kv-dtype) as a label.\n"
                  "# TYPE nightshift_kv_dtype_info gauge\nnightshift_kv_dtype_info{dtype=\"%s\"} 1\n",
                  ns_dtype_name((ns_dtype)st.kv_dtype));
    kv_tier_metrics(&b, &st.kv);
    histogram(&b, "nightshift_step_duration_seconds", "Engine step wall time.", &st.step_seconds);
    histogram(&b, "nightshift_batch_tokens", "Tokens per engine step.", &st.batch_tokens);
    histogram(&b, "nightshift_time_to_first_token_seconds", "Submit to first generated token.", &st.ttft_seconds);
    histogram(&b, "nightshift_inter_token_latency_seconds", "Time between generated tokens.", &st.itl_seconds);
    if (a->recorder) { /* serve --record */
        ns_recorder_stats rs;
        ns_recorder_stats_get(a->recorder, &rs);
        counter(&b, "nightshift_record_lines_total", "Request records written (serve --record).", rs.written);
        counter(&b, "nightshift_record_dropped_total", "Request records dropped: the writer queue was full.",
                rs.dropped);
        counter(&b, "nightshift_record_write_errors_total", "Request records lost to a failed write.",
                rs.write_errors);
        counter(&b, "nightshift_record_rotations_total", "Recording files rotated by size.", rs.rotations);
    }
    if (a->server) {
        ns_server_counters c;
        ns_server_get_counters(a->server, &c);
        counter(&b, "nightshift_http_requests_total", "HTTP requests received.", c.requests);
        ns_buf_printf(&b,
                      "# HELP nightshift_http_responses_total HTTP responses by status class.\n"
                      "# TYPE nightshift_http_responses_total counter\n"
                      "nightshift_http_responses_total{class=\"2xx\"} %llu\n"
                      "nightshift_http_responses_total{class=\"4xx\"} %llu\n"
                      "nightshift_http_responses_total{class=\"5xx\"} %llu\n",
                      (unsigned long long)c.responses_2xx, (unsigned long long)c.responses_4xx,
                      (unsigned long long)c.responses_5xx);
        counter(&b, "nightshift_http_client_disconnects_total", "Responses the client left before the end.",
                c.disconnects);
        gauge(&b, "nightshift_http_connections_open", "Connections open now.", (double)c.connections_open);
        counter(&b, "nightshift_http_request_timeouts_total",
                "Connections closed for not completing a request within --request-timeout.", c.request_timeouts);
        counter(&b, "nightshift_http_connection_evictions_total",
                "Idle connections closed to make room near --max-connections.", c.evictions);
    }
    size_t len = 0;
    char *text = ns_buf_take(&b, &len);
    if (!text) {
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        return;
    }
    resp->status = 200;
    resp->content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp->body = text;
    resp->body_len = len;
}
