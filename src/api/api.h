/* api.h — the OpenAI-compatible API: shared state of the endpoints and
 * the helpers every endpoint uses (body parsing, parameter validation,
 * ids). One file per endpoint implements the handlers listed here.
 *
 * Life cycle: the server starts with the API in LOADING (every endpoint but
 * /health answers 503); the loader fills tok/tmpl/sched/cfg and then
 * publishes READY with a sequentially consistent store, after which those
 * fields are read-only and shared by all HTTP threads (the tokenizer and
 * the parsed template are immutable; the scheduler is thread-safe).
 * DRAINING refuses new generation while shutdown waits for running ones.
 *
 * Threads: handlers run on HTTP connection threads. They do all JSON,
 * template, tokenizer and parsing work; the engine only sees ns_request.
 */
#ifndef NS_API_H
#define NS_API_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "api/stop.h"
#include "api/toolcall.h"
#include "model/model.h"
#include "sched/sched.h"
#include "server/server.h"

struct ns_tokenizer;
struct ns_template;

typedef enum { NS_API_LOADING = 0, NS_API_READY, NS_API_FAILED, NS_API_DRAINING } ns_api_state;

typedef struct ns_api {
    /* fixed at start-up */
    char model_name[256];
    time_t created;
    size_t max_json_depth;      /* default 128 */
    size_t body_budget;         /* bytes of request bodies handled at once; default NS_API_BODY_BUDGET */
    atomic_size_t body_inflight;
    ns_server *server;          /* for /metrics counters (may be NULL) */
    atomic_int state;

    /* published with READY */
    struct ns_tokenizer *tok;
    struct ns_template *tmpl;   /* parsed chat template; NULL if the model has none */
    const char *tmpl_src;
    bool tmpl_wants_string_args; /* template handles `arguments is string` */
    ns_sched *sched;
    ns_model_config cfg;
    char fingerprint[48];       /* system_fingerprint */
    ns_toolfmt toolfmt;
    bool reasoning;             /* template knows <think> */
    uint64_t (*random_seed)(void);
    /* serve --record: the request recorder (record/recorder.h; NULL = off),
     * set before the server starts; record_redact: --record-redact */
    struct ns_recorder *recorder;
    bool record_redact;
} ns_api;

/* Default body budget (see ns_api_body_admit). */
#define NS_API_BODY_BUDGET ((size_t)256 << 20)

void ns_api_init(ns_api *a, const char *model_name);

/* The body budget: handling a request body (parse, template, tokenize;
 * a non-streaming generation keeps it until it answers) costs memory in
 * proportion to its size, so the POST endpoints admit a body only while
 * the bytes of bodies in progress stay within a->body_budget. Otherwise
 * 503 server_busy with Retry-After: 1 (a lone body is always admitted).
 * Thread-safe; every admitted body is released once. */
bool ns_api_body_admit(ns_api *a, size_t bytes, ns_http_response *r);
void ns_api_body_release(ns_api *a, size_t bytes);
/* The route table (static). */
const ns_http_route *ns_api_routes(int *n);

/* ---- helpers shared by the endpoints (api.c) ---- */

/* 503 unless READY. Returns true when the handler may proceed. */
bool ns_api_require_ready(ns_api *a, ns_http_response *r);
/* Parses the body as a JSON object: invalid UTF-8, depth over the cap,
 * bad JSON or a non-object are 400s. NULL on failure (r->err set). */
json_t *ns_api_parse_body(ns_api *a, const ns_http_request *req, ns_http_response *r);

/* Typed field getters: absent or null leaves *out untouched and returns
 * true; a wrong type or range sets e (naming key) and returns false. */
bool ns_api_get_bool(json_t *o, const char *key, bool *out, ns_http_error *e);
bool ns_api_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, ns_http_error *e);
bool ns_api_get_num(json_t *o, const char *key, double lo, double hi, double *out, ns_http_error *e);
bool ns_api_get_str(json_t *o, const char *key, const char **out, ns_http_error *e);
/* The first key of o that is not one of known[0..n) (borrowed from o), or
 * NULL when every key is known: an endpoint refuses a field nobody
 * handles instead of ignoring it silently. */
const char *ns_api_unknown_key(json_t *o, const char *const *known, size_t n);

/* Generation parameters common to chat and completions. */
typedef struct ns_api_gen_params {
    ns_request_params rp;
    bool stream, include_usage;
    const char *stops[NS_STOP_MAX];
    int n_stops;
    bool seed_given;
    bool return_token_ids;
} ns_api_gen_params;

/* Parses the fields both completion endpoints share: sampling
 * (temperature, top_p, top_k, min_p, presence/frequency/repetition
 * penalties, repetition_penalty_last_n), seed (else a.random_seed()),
 * n (only 1), max_tokens (chat also max_completion_tokens), stop,
 * stream/stream_options.include_usage, logprobs (chat: a bool plus
 * top_logprobs; completions: an integer count, or a bool), ignore_eos,
 * return_token_ids and response_format (its type: text, json_object or json_schema;
 * the endpoint compiles the latter two, api/structured.h). Strings point into
 * body. False with e set (400 naming the field) on a bad value. */
bool ns_api_parse_gen_params(ns_api *a, json_t *body, bool chat, ns_api_gen_params *p, ns_http_error *e);

/* "prefix-" + 24 random alphanumerics into out (>= 32 bytes). */
void ns_api_random_id(const char *prefix, char *out, size_t cap);
/* Checks n_prompt against the context: 400 empty_prompt for 0 tokens,
 * 400 context_length_exceeded (with the numbers) when it does not fit. */
bool ns_api_check_context(ns_api *a, int32_t n_prompt, int64_t max_tokens, const char *param, ns_http_error *e);
/* The most prompt tokens worth counting: the model's context. A prompt
 * with more can never fit, so tokenizing stops there
 * (ns_tokenizer_encode_limit). */
size_t ns_api_prompt_limit(const ns_api *a);
/* Sets e to 400 context_length_exceeded for a prompt of n_prompt tokens,
 * or, when `more`, for one whose tokenization stopped once it had more
 * tokens than the context (n_prompt of them; the message says "more than
 * <context> tokens"). Extra fields: prompt_tokens, prompt_tokens_exact
 * (false when `more`: prompt_tokens is then a lower bound),
 * context_tokens, retryable:false. */
void ns_api_context_error(ns_api *a, int64_t n_prompt, bool more, const char *param, ns_http_error *e);
/* The largest prompt the scheduler admits (min(pool, context) - 1: one
 * token must be left to generate; max_tokens past that is clamped); >= 0. */
int64_t ns_api_largest_prompt_tokens(const ns_capacity *cap);
/* Maps a submit failure (never fits -> 400 context_exceeds_capacity with
 * the numbers, largest_prompt_tokens and retryable false). */
void ns_api_submit_error(ns_status st, const ns_capacity *cap, const ns_error *err, ns_http_error *e);

/* ---- endpoints (one file each) ---- */
void ns_api_chat_completions(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_completions(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_models(void *ud, const ns_http_request *req, ns_http_response *resp);
/* GET /v1/models/{id} (models.c) */
void ns_api_model_get(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_health(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_tokenize(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_detokenize(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_apply_template(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_metrics(void *ud, const ns_http_request *req, ns_http_response *resp);
/* GET /v1/capacity (capacity.c) */
void ns_api_capacity(void *ud, const ns_http_request *req, ns_http_response *resp);
/* The X-Nightshift-Max-Context-Tokens value (ns_server_opts.max_context_tokens,
 * ud = the ns_api): min(model context, admissible tokens) once the model is
 * READY, -1 (no header) otherwise. Thread-safe. */
long long ns_api_max_context_tokens(void *ud);
/* POST /admin/flush, GET /admin/cache (admin.c) */
void ns_api_admin_flush(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_admin_cache(void *ud, const ns_http_request *req, ns_http_response *resp);
/* GET /v1/status: the engine's live state as JSON (status.c);
 * GET /dashboard: the HTML page that shows it (dashboard.c) */
void ns_api_status(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_dashboard(void *ud, const ns_http_request *req, ns_http_response *resp);

#endif
