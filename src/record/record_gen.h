/* record_gen.h — what the completion endpoints record (`serve --record`):
 * one JSON object per request, built from the request and its generation
 * (api/gen.h) and queued to the recorder (record/recorder.h).
 *
 * A record (one line of DIR/requests.jsonl; "v" is the format version):
 *   {"v":1, "time":"2026-11-30T22:40:01.123Z" (arrival, UTC), "t":<unix s>,
 *    "endpoint":"/v1/chat/completions", "id":"chatcmpl-...", "status":200,
 *    "stream":true, "redacted":false,
 *    "prompt_tokens":N, "cached_tokens":N,
 *    "cached_tokens_by_tier":{"device":N,"ram":N,"ssd":N},
 *    "ttft_s":S|null (arrival to first generated token), "duration_s":S,
 *    "output_tokens":N, "finish_reason":"stop"|"length"|"tool_calls"|null,
 *    "client_gone":false,
 *    "output":{"content":"...","reasoning":"...","ids":[...]} (what was
 *            generated, when it finished; redacted: texts as placeholders
 *            and no ids; "tool_calls":N with tools),
 *    "error":{"code":"...","message":"..."} (only when it failed; a stream
 *            that failed after its 200 keeps status 200 and says so here),
 *    "request":{ the body as received, or redacted (record/redact.h) }}
 * A body that is not JSON (a 400 invalid_json) has "request":null and
 * "request_bytes":N instead.
 *
 * Hook protocol (gen.c): ns_record_begin at the top of the handler (NULL
 * when recording is off: everything else is then a no-op);
 * ns_record_end once, where the request ends — in the handler for a
 * whole response or a failure before the stream (resp set), or when a
 * stream closes (resp NULL). The record is built on that (HTTP) thread,
 * after the generation finished, and queued; the disk is written by the
 * recorder's thread.
 */
#ifndef NS_RECORD_RECORD_GEN_H
#define NS_RECORD_RECORD_GEN_H

#include <stdbool.h>

#include "api/gen.h"

typedef struct ns_record_req ns_record_req;

/* Starts a record for req (arrival time, endpoint); NULL when a->recorder
 * is NULL (recording off) or out of memory. Owned by the caller until ns_record_end. */
ns_record_req *ns_record_begin(ns_api *a, const ns_http_request *req);
/* Builds and queues the record and frees *r (sets it NULL; no-op when
 * NULL). j: the job (NULL when the body was not parsed: req must then be
 * the live request, for its size). resp: the response of a whole answer
 * or an early failure; NULL when a stream closed. */
void ns_record_end(ns_record_req **r, const ns_gen_job *j, const ns_http_request *req, const ns_http_response *resp);

#endif
