/* bench_req.h — one measured request of `nightshift bench`: POSTs a JSON
 * body to an OpenAI-compatible endpoint with stream=true and
 * stream_options.include_usage, and measures from the SSE events' arrival
 * times (client/http_client.h):
 *   ttft_s      request start -> first event carrying generated text
 *   decode_tps  (completion tokens - 1) / (last text event - first), per stream
 * plus the text generated, the usage as the server reported it (prompt,
 * completion and cached tokens; -1 when absent: not every server sends
 * cached_tokens) and the finish reason. Works with /v1/completions
 * (choices[0].text) and /v1/chat/completions (choices[0].delta.content /
 * reasoning_content).
 *
 * Failures are results, not aborts: a transport error, a non-2xx status,
 * an error event in the stream or a stream without [DONE] sets ok=false
 * and a one-line error, so the report can show it.
 *
 * Ownership: ns_bench_req_result owns text (ns_bench_req_result_free).
 * The body and headers are borrowed for the call. */
#ifndef NS_BENCH_REQ_H
#define NS_BENCH_REQ_H

#include <stdbool.h>
#include <stdint.h>

#include "client/http_client.h"

/* Text kept per request: enough for the identity gate's comparison. */
#define NS_BENCH_TEXT_CAP 4096

typedef struct ns_bench_req_result {
    bool ok;
    char error[320];
    long status;
    double t_start, ttft_s, total_s, decode_tps;
    int64_t prompt_tokens, completion_tokens, cached_tokens; /* -1: not reported */
    int64_t n_text_events;
    char finish_reason[32];
    char *text; /* NUL-terminated, at most NS_BENCH_TEXT_CAP bytes (truncated flagged) */
    bool text_truncated;
} ns_bench_req_result;

/* Sends body (a JSON object text; streamed as it is) to url. headers:
 * NULL-terminated "Name: value" list or NULL. The result is always
 * initialized; returns out->ok. timeout_s bounds the whole request. */
bool ns_bench_req_run(ns_hc *hc, const char *url, const char *const *headers, const char *body, double timeout_s,
                      ns_bench_req_result *out);
/* Non-streamed variant (the identity probe): the whole JSON answer; text
 * and usage from it, ttft_s = total_s. */
bool ns_bench_req_run_whole(ns_hc *hc, const char *url, const char *const *headers, const char *body,
                            double timeout_s, ns_bench_req_result *out);
void ns_bench_req_result_free(ns_bench_req_result *r);

#endif
