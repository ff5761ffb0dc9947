/* gen.h — one generation as the HTTP side sees it: submits the request to
 * the scheduler, then turns the token events into text through the
 * pipeline
 *
 *   tokens -> streaming detokenizer -> stop strings -> <think> splitter
 *          -> tool-call parser
 *
 * and keeps the cumulative result (raw text, reasoning, content, tool
 * calls, token ids, logprob records). Endpoints diff that state to stream
 * deltas, or format it once at the end.
 *
 * Invariants: text after a matched stop string never enters the state, and
 * the request is cancelled as soon as it matched; tokens the engine still
 * produced afterwards are not counted. The end-of-sequence token is
 * counted but has no text. A client that disconnects (seen while waiting
 * for events) cancels the request. Everything is owned by the ns_gen and
 * released by ns_gen_free, which also writes the request's log line.
 *
 * Threads: an ns_gen belongs to one HTTP connection thread.
 */
#ifndef NS_API_GEN_H
#define NS_API_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"
#include "api/reasoning.h"
#include "api/stop.h"
#include "api/toolcall.h"
#include "util/buf.h"

struct ns_detok;

typedef struct ns_gen_opts {
    ns_request_params rp;
    const char *const *stops;
    int n_stops;
    bool reasoning;   /* split <think> blocks */
    bool in_think;    /* the prompt left a <think> open */
    ns_toolfmt toolfmt;
    const char *const *tool_names;
    int n_tool_names;
    const char *kind; /* "chat" / "completion", for the log line */
} ns_gen_opts;

typedef struct ns_gen {
    ns_api *api;
    ns_request *req;
    ns_http_conn conn;
    struct ns_detok *detok;
    ns_stop stop;
    ns_reason reason;
    ns_toolparse tp;
    bool use_tools, logprobs, ignore_eos;
    int top_logprobs;

    ns_buf text;       /* everything released after stop strings */
    ns_buf reasoning;  /* cumulative reasoning */
    ns_buf content;    /* cumulative content (before tool-call parsing) */
    ns_buf s1, s2, s3; /* scratch between pipeline stages */
    int32_t *ids;      /* generated tokens that count */
    int32_t n_ids;
    size_t cap_ids;
    ns_token_event *lps; /* logprob records, one per counted token */
    int32_t n_lps;
    size_t cap_lps;

    bool done, stopped, gone;
    ns_request_result res;
    int32_t n_prompt;
    double t0;
    char id[64];
    const char *kind;
} ns_gen;

/* Creates and submits the request. On failure e is set (the prompt does
 * not fit: 400 with the numbers) and g needs no ns_gen_free. */
bool ns_gen_start(ns_gen *g, ns_api *a, const int32_t *prompt, int32_t n_prompt, const ns_gen_opts *o,
                  const ns_http_conn *conn, const char *id, ns_http_error *e);
/* Waits up to timeout_ms for events and runs them through the pipeline.
 * Sets g->done after the last one. NS_ERR_CANCELLED: the client is gone
 * (the request was cancelled). */
ns_status ns_gen_pump(ns_gen *g, int timeout_ms);
/* Content after tool-call parsing (or all content when tools are off). */
const ns_buf *ns_gen_content(const ns_gen *g);
/* True when the generation failed or was cut by shutdown; e is set. */
bool ns_gen_failed(const ns_gen *g, ns_http_error *e);
/* "stop", "length" or "tool_calls" (streaming: any committed call;
 * otherwise only when every call is valid). */
const char *ns_gen_finish_reason(const ns_gen *g, bool streaming);
/* {"prompt_tokens", "completion_tokens", "total_tokens",
 *  "prompt_tokens_details": {"cached_tokens"}} */
json_t *ns_gen_usage(const ns_gen *g);
/* Chat logprob entries for records [from, to) appended to arr. */
void ns_gen_chat_logprobs(const ns_gen *g, int32_t from, int32_t to, json_t *arr);
/* Completions logprobs object for records [from, to); *text_off advances. */
json_t *ns_gen_completion_logprobs(const ns_gen *g, int32_t from, int32_t to, size_t *text_off);
void ns_gen_free(ns_gen *g);

#endif
