/* sched.h — the engine thread: request queue, continuous batching, prefix
 * cache, and the per-request channel back to the HTTP side.
 *
 * Threads: HTTP threads create requests (tokenized prompt + parameters),
 * submit them, and consume events; the single engine thread owned by the
 * scheduler runs steps (ragged batches of decode tokens + packed prefill
 * chunks) and pushes events. Raw JSON never reaches this module.
 *
 * Request life cycle: QUEUED -> PREFILLING -> DECODING -> FINISHED, plus
 * WAITING (admission found no room yet), PAUSED (the pool ran out: its KV
 * went back to the cache tiers, its sampler/RNG and tokens are kept; it
 * resumes exactly, re-prefilling only what the tiers no longer hold),
 * CANCELLED (client gone: the engine drops it at the next step; pages it
 * completed stay in the prefix cache). A request whose prompt can never
 * fit is refused by ns_sched_submit with NS_ERR_RANGE and the numbers in
 * *cap; admitted work is never aborted for lack of memory.
 *
 * Two halves: ns_request is the HTTP <-> engine channel (prompt, typed
 * parameters, cancel flag, event queue, result), shared by both sides;
 * the sequence state (page table, positions, tokens, sampler and RNG) is
 * engine-owned (sched_internal.h's ns_seq), created at submit and freed by
 * the engine thread. KV state lives in src/kv/kv_cache, which the engine
 * reaches only through its API.
 *
 * Ownership: a request is reference counted; ns_request_new returns one
 * reference (the HTTP side's); submit adds the engine's (held by the
 * sequence). Each side calls ns_request_release when done with it.
 */
#ifndef NS_SCHED_H
#define NS_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kv/kv_cache.h"

#define NS_MAX_TOP_LOGPROBS 20

typedef enum {
    NS_FINISH_NONE = 0,
    NS_FINISH_LENGTH,    /* max_tokens reached */
    NS_FINISH_EOS,       /* model emitted an end-of-sequence token */
    NS_FINISH_CANCELLED, /* client cancelled / disconnected / stop string */
    NS_FINISH_CONTEXT,   /* sequence hit the model's context length */
    NS_FINISH_ERROR      /* engine failure; message in error */
} ns_finish;

typedef enum { NS_EV_TOKEN = 1, NS_EV_DONE = 2 } ns_event_type;

typedef struct ns_token_event {
    int32_t token;
    float logprob;                        /* valid when logprobs requested */
    int32_t n_top;
    int32_t top_ids[NS_MAX_TOP_LOGPROBS];
    float top_logprobs[NS_MAX_TOP_LOGPROBS];
} ns_token_event;

typedef struct ns_request ns_request;

typedef struct ns_request_params {
    ns_sampling_params sampling;
    int32_t max_tokens;      /* > 0 */
    bool logprobs;           /* report each token's logprob */
    int32_t top_logprobs;    /* 0..NS_MAX_TOP_LOGPROBS */
    bool ignore_eos;
    /* Structured output: the grammar matcher (grammar/gmatch.h) whose
     * mask constrains every sampled token, or NULL. Owned by the request
     * once ns_request_new succeeds (freed with it); built for this model's
     * vocabulary (checked at submit). An end-of-sequence token the grammar
     * allows ends the request even with ignore_eos. */
    struct ns_gmatch *grammar;
    /* Test-only knob: the engine pauses the sequence after every this many
     * generated tokens (0 = never), to prove a pause/resume is exact. */
    int32_t test_pause_every;
} ns_request_params;

/* Creates a request owning a copy of the prompt and taking over
 * params->grammar (on NULL the caller keeps it). NULL on OOM.
 * params->max_tokens <= 0 means "as many as fit" (context and pool); a
 * larger max_tokens than fits is clamped (finish LENGTH when reached). */
ns_request *ns_request_new(const int32_t *prompt, int32_t n_prompt, const ns_request_params *params);
void ns_request_release(ns_request *r);
/* A short id for the engine's log lines about this request (e.g. the API's
 * "chatcmpl-..." id), so they match the HTTP side's lines. Call before
 * submit; copied (cut at 47 bytes). */
void ns_request_set_label(ns_request *r, const char *label);
/* Sets the cancel flag; the engine notices within one step. */
void ns_request_cancel(ns_request *r);
/* Pops up to max events into out (tokens in order). Blocks until at least
 * one event is available or timeout_ms passes (-1 = forever). Returns the
 * number popped; *done is set once the DONE event has been popped. */
int ns_request_poll(ns_request *r, ns_token_event *out, int max, int timeout_ms, bool *done);
/* True while the engine has the request paused (its KV released to the
 * cache tiers) or queued; *queue_pos (if non-NULL) is its place among the
 * waiting and paused requests, 1 = next. For the stream's keep-alives. */
bool ns_request_waiting(ns_request *r, bool *paused, int32_t *queue_pos);

/* Results, valid once done (the prefix reuse once admitted): */
typedef struct ns_request_result {
    ns_finish finish;
    int32_t n_prompt;
    int32_t n_cached;        /* prompt tokens whose KV was reused */
    int32_t n_cached_by_tier[NS_TIER_COUNT]; /* ... by the tier it came from */
    int32_t n_generated;
    char error[256];
    /* where the prompt diverged from the closest cached sequence (-1: none) */
    int32_t diverge_at;
    /* The engine admitted the request and looked its prompt up in the
     * prefix cache: n_cached, n_cached_by_tier and diverge_at are final
     * from here on, before the prefill and the first token (an Anthropic
     * stream's message_start goes out then, with its usage). */
    bool admitted;
} ns_request_result;
void ns_request_result_get(ns_request *r, ns_request_result *out);

/* What happens when the KV pool cannot hold every admitted sequence:
 * PAUSE admits on the pages a request needs now (its uncached prompt and
 * a page of decode headroom) and, when a running sequence needs a page
 * the pool cannot give, pauses the newest admitted one (its KV stays in
 * the cache tiers; it resumes exactly, FIFO, when it fits again).
 * RESERVE admits only when prompt + max_tokens fit next to every running
 * request's worst case, so nothing is ever paused (fewer run at once). */
typedef enum { NS_PAUSE_POLICY_PAUSE = 0, NS_PAUSE_POLICY_RESERVE = 1 } ns_pause_policy;

typedef struct ns_sched_opts {
    int32_t max_batch_tokens; /* per-step token budget (<= engine's) */
    int32_t max_running;      /* sequences decoding/prefilling at once (<= engine max_logits) */
    int32_t prefill_chunk;    /* max prefill tokens of one request per step */
    double aging_seconds;     /* a waiting request older than this blocks later ones (FIFO) */
    double target_step_ms;    /* while streams decode, prefill chunks shrink so a step
                               * is predicted to take at most this (0 = 50 ms) */
    /* Optional: renders token ids as text for the per-request log line
     * (where a prompt diverged from the cache). Called on the engine
     * thread; must be thread-safe w.r.t. the HTTP threads. */
    void (*describe)(void *ctx, const int32_t *tokens, int32_t n, char *out, size_t cap);
    void *describe_ctx;
    /* KV cache tiers below the device pool (see kv_cache.h) */
    int64_t ram_cache_bytes;  /* host-RAM tier, 0 = off */
    const char *ssd_dir;      /* SSD tier directory, NULL = off */
    int64_t ssd_bytes;        /* SSD tier size cap (0 = 32 GiB) */
    ns_pause_policy pause_policy;
    /* log prompt text (divergence excerpts) at INFO; otherwise only at
     * DEBUG: prompts may hold secrets */
    bool log_prompts;
} ns_sched_opts;

typedef struct ns_capacity {
    int64_t prompt_tokens;
    int64_t max_tokens;
    int64_t pool_tokens;      /* tokens the pool can hold for one request */
    int64_t context_tokens;   /* model context length */
} ns_capacity;

typedef struct ns_sched ns_sched;

/* The engine (and its backend) is used only by the scheduler's thread
 * after ns_sched_start. */
ns_status ns_sched_create(ns_engine *e, const ns_sched_opts *opts, ns_sched **out, ns_error *err);
ns_status ns_sched_start(ns_sched *s, ns_error *err);
/* Stops the engine thread: running requests finish as CANCELLED. */
void ns_sched_stop(ns_sched *s);
void ns_sched_free(ns_sched *s);
/* Queues r. NS_ERR_RANGE (never fits: *cap says why), NS_ERR_INVALID. */
ns_status ns_sched_submit(ns_sched *s, ns_request *r, ns_capacity *cap, ns_error *err);
/* Makes every page committed before the call durable in the SSD tier:
 * the engine hands all pending pages to the tier, then this waits for the
 * tier's fsync + index commit (up to timeout_ms in all). NS_ERR_UNSUPPORTED
 * when the SSD tier is off. Thread-safe (HTTP threads). */
ns_status ns_sched_flush(ns_sched *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err);

/* A consistent snapshot for /metrics and logs (thread-safe). */
#define NS_HIST_BUCKETS 16
typedef struct ns_histogram {
    double bounds[NS_HIST_BUCKETS]; /* upper bounds; the last is +Inf */
    uint64_t counts[NS_HIST_BUCKETS];
    double sum;
    uint64_t count;
} ns_histogram;

typedef struct ns_sched_stats {
    int32_t requests_running, requests_waiting, requests_paused;
    int64_t reserved_pages;   /* pages promised to running sequences, not yet taken */
    uint64_t requests_total, requests_rejected, requests_cancelled;
    uint64_t pauses_total, resumes_total;
    uint64_t prompt_tokens_total, generated_tokens_total;
    uint64_t prefix_lookup_tokens_total, prefix_hit_tokens_total;
    int32_t pages_total, pages_used, pages_free, pages_cached;
    int32_t page_tokens;
    int32_t kv_dtype;            /* ns_dtype of the KV pages (--kv-dtype), fixed at creation */
    int64_t kv_bytes_per_token;  /* page bytes / page tokens, rounded up (FP8: codes + scales) */
    ns_histogram step_seconds, batch_tokens, ttft_seconds, itl_seconds;
    ns_kv_cache_stats kv; /* per-tier pages, hits, demotions/promotions, SSD */
} ns_sched_stats;
void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out);

/* What a client may ask for right now (GET /v1/capacity, the
 * X-Nightshift-Max-Context-Tokens header, /v1/models), from the same
 * snapshot as ns_sched_get_stats (refreshed once per engine step). Per
 * tier: free (+ reclaimable cached), used (held by running sequences:
 * paused ones give their pages back to the cache) and cached tokens
 * (indexed content, which overlaps used for pages a running sequence
 * shares); for the device tier free + used = the pool. admissible_tokens
 * is 0 while every running slot (--max-running) is taken. */
typedef struct ns_tier_capacity {
    bool enabled;
    int64_t free_tokens, used_tokens, cached_tokens;
} ns_tier_capacity;
typedef struct ns_sched_capacity {
    int32_t running, waiting, paused;
    int64_t admissible_tokens;         /* KV a new request could get now */
    int64_t largest_fits_alone_tokens; /* prompt + max_tokens that fit an idle server */
    int64_t context_tokens;            /* the model's context */
    int64_t pool_tokens;               /* the device pool */
    ns_tier_capacity tiers[NS_TIER_COUNT];
} ns_sched_capacity;
void ns_sched_get_capacity(ns_sched *s, ns_sched_capacity *out);

#endif
