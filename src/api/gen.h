/* gen.h — the one request path of the generation endpoints
 * (/v1/chat/completions, /v1/completions, and through hooks the
 * event-based /v1/messages and /v1/responses), in two layers.
 *
 * ns_gen — one generation as the HTTP side sees it: submits the request to
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
 * ns_gen_job — one whole request: ns_gen_handle parses the body and the
 * common parameters (ns_api_parse_gen_params), lets the endpoint build the
 * prompt, checks the context, submits, and answers either as one JSON
 * object or as an SSE stream (deltas, a last chunk with finish_reason, an
 * optional usage chunk, [DONE]; keep-alive comments while nothing comes;
 * engine failures as an error event). What differs between the endpoints
 * (the prompt, the output shape, the logprobs shape) is an ns_gen_endpoint;
 * the event-based APIs also replace the parameter parsing, the end of the
 * stream and the whole response (their hooks), and everything else —
 * submit, pipeline, keep-alives, cancellation, the log line — is shared.
 * A generation may end early on its own terms too: after max_calls
 * complete tool calls (parallel_tool_calls false), like a stop string.
 *
 * Invariants: text after a matched stop string never enters the state, and
 * the request is cancelled as soon as it matched; tokens the engine still
 * produced afterwards are not counted. The end-of-sequence token is
 * counted but has no text. A client that disconnects (seen while waiting
 * for events) cancels the request. Everything is owned by the ns_gen and
 * released by ns_gen_free, which also writes the request's log line.
 *
 * Threads: an ns_gen (and its job) belongs to one HTTP connection thread.
 */
#ifndef NS_API_GEN_H
#define NS_API_GEN_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

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
    bool think_closed; /* the prompt ends with a closed <think></think> (thinking
                        * switched off): structured output starts at once */
    ns_toolfmt toolfmt;
    const char *const *tool_names;
    int n_tool_names;
    const json_t *tools; /* the request's tools (borrowed): schemas that type XML tool-call arguments */
    const char *kind; /* "chat" / "completion", for the log line */
    /* > 0: the generation ends (as if a stop string matched) once this
     * many tool calls are complete and valid — parallel_tool_calls false
     * (chat, Responses) and disable_parallel_tool_use (Anthropic), so a
     * second call is never generated rather than generated and hidden */
    int max_calls;
    /* > 0: a thinking budget (Anthropic thinking.budget_tokens). Once the
     * model has written this many tokens inside <think> without closing
     * it, the request is cut there and continued as a new request whose
     * prompt is the old one, the tokens so far and "\n</think>\n\n" (all
     * but the last partial page come from the prefix cache), so the answer
     * follows within max_tokens. Needs o->reasoning and no grammar. */
    int32_t think_budget;
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
    ns_buf raw;        /* text fed to the stop matcher (only with stop strings):
                        * tells which stop string matched */
    int max_calls;     /* see ns_gen_opts */
    /* thinking budget (see ns_gen_opts.think_budget) */
    int32_t think_budget, think_tokens;
    bool cutting;      /* the budget is spent: the request is being cancelled, its late tokens dropped */
    bool continued;    /* the generation goes on in a continuation request */
    int32_t *prompt;   /* a copy of the prompt (only with a budget) */
    ns_request_params rp; /* the request's parameters (only with a budget) */
    ns_request_result first; /* the first request's result: its prefix reuse is the request's */
    int32_t *ids;      /* generated tokens that count */
    int32_t n_ids;
    size_t cap_ids;
    ns_token_event *lps; /* logprob records, one per counted token */
    int32_t n_lps;
    size_t cap_lps;

    bool done, stopped, gone;
    bool req_made;     /* ns_request_new took o->rp.grammar (even if submit failed) */
    ns_request_result res;
    int32_t n_prompt;
    double t0;
    double t_first;    /* ns_clock_now() when the first token event arrived (0: none yet) */
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
/* The stop string that ended the generation (borrowed from the matcher;
 * NULL when none matched). Anthropic reports it as stop_sequence. */
const char *ns_gen_stop_string(const ns_gen *g);
/* Prompt tokens this request newly committed to the prefix cache: its
 * whole pages past the reused prefix (Anthropic's
 * cache_creation_input_tokens). Valid once g->done. */
int32_t ns_gen_cache_created(const ns_gen *g);
/* {"prompt_tokens", "completion_tokens", "total_tokens",
 *  "prompt_tokens_details": {"cached_tokens",
 *                            "cached_tokens_by_tier": {"device", "ram", "ssd"}}} */
json_t *ns_gen_usage(const ns_gen *g);
/* Chat logprob entries for records [from, to) appended to arr. */
void ns_gen_chat_logprobs(const ns_gen *g, int32_t from, int32_t to, json_t *arr);
/* Completions logprobs object for records [from, to); *text_off advances. */
json_t *ns_gen_completion_logprobs(const ns_gen *g, int32_t from, int32_t to, size_t *text_off);
void ns_gen_free(ns_gen *g);

/* ---- one completion request (ns_gen_handle) ---- */

typedef struct ns_gen_job ns_gen_job;

/* What one completion endpoint adds to the shared path. Its job struct
 * starts with an ns_gen_job (job_size bytes, zeroed, are allocated). */
typedef struct ns_gen_endpoint {
    size_t job_size;
    bool chat;                /* chat parameter rules (ns_api_parse_gen_params) */
    const char *kind;         /* "chat" / "completion", for the log line */
    const char *id_prefix;    /* "chatcmpl-" / "cmpl-" */
    const char *object;       /* "object" of the whole response */
    const char *chunk_object; /* "object" of a stream chunk */
    const char *whole_key;    /* the choice's output field: "message" / "text" */
    const char *delta_key;    /* the same in a chunk: "delta" / "text" */
    const char *prompt_param; /* the field a context error names */
    /* Parses the endpoint's own fields and builds the prompt: sets
     * j->prompt/n_prompt (owned by the endpoint's job) and the endpoint's
     * fields of o. False with e set on failure. */
    bool (*prepare)(ns_gen_job *j, ns_gen_opts *o, ns_http_error *e);
    /* Streaming: the first chunk, before any generated token (NULL: none). */
    ns_status (*stream_start)(ns_gen_job *j, ns_buf *out);
    /* Streaming: chunks for what is new since the last call (may add none). */
    ns_status (*stream_delta)(ns_gen_job *j, ns_buf *out);
    /* Streaming: the delta_key value of the last chunk (with finish_reason). */
    json_t *(*final_delta)(ns_gen_job *j);
    /* The "logprobs" value for logprob records [from, to). */
    json_t *(*logprobs)(ns_gen_job *j, int32_t from, int32_t to);
    /* Whole response: the whole_key value for the finished generation. */
    json_t *(*whole_output)(ns_gen_job *j, const char *finish);
    /* Releases what prepare allocated (NULL: nothing). */
    void (*release)(ns_gen_job *j);

    /* Hooks of the event-based APIs (Anthropic Messages, OpenAI
     * Responses), whose parameters, stream ends and whole responses have
     * their own shapes. Each NULL keeps the chat/completions behaviour. */
    /* Parses the request's generation parameters into j->gp (stream,
     * sampling, max tokens, stops); NULL: ns_api_parse_gen_params. */
    bool (*parse_params)(ns_gen_job *j, ns_http_error *e);
    /* Streaming: the end of the stream. err == NULL: the generation
     * finished (final events and usage); otherwise it failed and err (to
     * be cleared by the hook) says why, to be sent as the API's error
     * event. NULL: the last chunk with finish_reason, the usage chunk
     * when asked for, an error event, and [DONE]. */
    ns_status (*stream_end)(ns_gen_job *j, ns_buf *out, ns_http_error *err);
    /* Whole response: the complete JSON body (NULL: the "choices" shape
     * built from whole_output). */
    json_t *(*whole_response)(ns_gen_job *j);
} ns_gen_endpoint;

struct ns_gen_job {
    const ns_gen_endpoint *ep;
    ns_api *a;
    json_t *body;             /* keeps the strings gen borrows alive */
    ns_api_gen_params gp;
    ns_gen g;
    char id[64];
    time_t created;
    const int32_t *prompt;    /* set by prepare */
    size_t n_prompt;
    bool started, finished;   /* streaming state */
    int32_t sent_lps;         /* logprob records already sent */
    double last_emit;         /* when the last chunk went out (keep-alive) */
    struct ns_record_req *rec; /* serve --record (record/record_gen.h); NULL = off */
    char headers[512];        /* extra response headers (ns_http_response.headers), set by prepare */
};

/* The handler body of a completion endpoint. */
void ns_gen_handle(const ns_gen_endpoint *ep, void *ud, const ns_http_request *req, ns_http_response *resp);
/* Streaming: appends one chunk whose single choice holds value (stolen)
 * under ep->delta_key, the logprobs not sent yet, and finish_reason
 * (NULL: null). */
ns_status ns_gen_job_emit(ns_gen_job *j, ns_buf *out, json_t *value, const char *finish);
/* A named server-sent event ("event: <name>\ndata: <compact json>\n\n"),
 * as the event-based APIs stream them; steals data. */
ns_status ns_gen_sse_event(ns_buf *out, const char *name, json_t *data);
/* The text of b past *sent up to the end of its last whole UTF-8
 * character, as a JSON string in *str (NULL when there is none yet);
 * *sent advances. NS_ERR_NOMEM when the string cannot be made. */
ns_status ns_gen_new_text(const ns_buf *b, size_t *sent, json_t **str);

#endif
