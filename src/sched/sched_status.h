/* sched_status.h — the live status snapshot behind GET /v1/status and the
 * dashboard: every request the engine holds (state, queue position,
 * prefill progress, decode rate, cached tokens per tier), KV usage per
 * tier, a ring of recent cache breaks (where a prompt diverged from the
 * closest cached sequence) and step time / batch size over the last
 * minutes.
 *
 * Threads and consistency: the engine thread is the only writer. It
 * records step samples and cache breaks into engine-private rings (no lock
 * on the hot path) and, at most every NS_STATUS_PUBLISH_MS (or at once
 * when the set of requests changed), copies everything into a published
 * snapshot under the module's own mutex — never the scheduler's, so a
 * slow reader cannot stall admission. HTTP threads copy the published
 * snapshot out under that mutex (ns_sched_status_get). Every field of one
 * snapshot therefore comes from the same instant of the engine loop.
 *
 * Bounds: at most NS_STATUS_MAX_REQS requests are listed (the snapshot
 * says how many there were in all), NS_STATUS_BREAKS breaks and
 * NS_STATUS_SECONDS one-second step buckets are kept: memory is fixed at
 * create time. Per-second buckets rather than per-step samples because a
 * GPU runs hundreds of steps a second: a per-step ring of any sane size
 * would cover seconds, not minutes.
 *
 * Privacy: no prompt text is ever stored here (the dashboard may be open
 * to anyone holding the API key); a break records token positions only. */
#ifndef NS_SCHED_STATUS_H
#define NS_SCHED_STATUS_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kv_cache.h"

#define NS_STATUS_MAX_REQS 256
#define NS_STATUS_BREAKS 32
#define NS_STATUS_SECONDS 600
#define NS_STATUS_PUBLISH_MS 100

typedef enum {
    NS_STATUS_WAITING = 0,  /* admitted to the queue, not yet running */
    NS_STATUS_PAUSED,       /* pool ran dry: KV back in the tiers, resumes FIFO */
    NS_STATUS_PREFILLING,
    NS_STATUS_DECODING,
} ns_status_state;

const char *ns_status_state_name(ns_status_state s);

typedef struct ns_status_req {
    char id[48];                 /* the request's label (API id), or "request N" */
    ns_status_state state;
    int32_t queue_pos;           /* 1 = next (waiting/paused), 0 otherwise */
    int32_t n_prompt;            /* prompt tokens */
    int32_t prefill_done;        /* tokens whose KV is computed or reused */
    int32_t prefill_total;       /* tokens to have KV for before the next token */
    int32_t n_cached;            /* prompt tokens reused at admission */
    int32_t cached_by_tier[NS_TIER_COUNT];
    int32_t n_generated, max_tokens;
    int32_t n_pauses;
    double age_s;                /* since submit */
    double ttft_s;               /* -1 before the first token */
    double decode_tps;           /* tokens/s since the first token (0 before the second) */
} ns_status_req;

typedef struct ns_status_break {
    double unix_time;
    char id[48];
    int32_t n_prompt;
    int32_t diverge_at;          /* first prompt token not in the closest cached sequence */
    int32_t n_cached;            /* tokens reused (page-aligned: <= diverge_at) */
    int32_t cached_by_tier[NS_TIER_COUNT];
} ns_status_break;

typedef struct ns_status_second {
    int64_t unix_sec;            /* the wall-clock second it covers (0 = empty slot) */
    int32_t steps;
    int32_t max_batch_tokens, max_seqs;
    int64_t sum_batch_tokens, sum_seqs;
    double sum_step_s, max_step_s;
} ns_status_second;

typedef struct ns_status_tier {
    bool enabled;
    int64_t used_pages;          /* device: held by running sequences; RAM/SSD: cached pages */
    int64_t cached_pages;        /* indexed content (device: may overlap used) */
    int64_t capacity_pages;      /* -1: unknown / off */
} ns_status_tier;

typedef struct ns_status_snapshot {
    double unix_time;            /* when the engine published it */
    uint64_t seq;                /* publication counter */
    int32_t page_tokens;
    int32_t n_requests;          /* all the engine holds (reqs[] may list fewer) */
    int32_t n_listed;
    int32_t n_incoming;          /* submitted, not yet seen by the engine loop */
    ns_status_req reqs[NS_STATUS_MAX_REQS];
    ns_status_tier tiers[NS_TIER_COUNT];
    int32_t n_breaks;            /* valid entries in breaks[], newest first */
    uint64_t breaks_total;
    ns_status_break breaks[NS_STATUS_BREAKS];
    int32_t n_seconds;           /* valid entries in seconds[], oldest first */
    ns_status_second seconds[NS_STATUS_SECONDS];
} ns_status_snapshot;

typedef struct ns_sched_status ns_sched_status;

/* NULL on OOM. Freed by ns_sched_status_free (after the engine stopped). */
ns_sched_status *ns_sched_status_new(void);
void ns_sched_status_free(ns_sched_status *st);

/* ---- engine thread only ---- */
/* One step just ended (wall clock now): step_s seconds over batch_tokens
 * tokens of n_seqs sequences. */
void ns_sched_status_step(ns_sched_status *st, double step_s, int32_t batch_tokens, int32_t n_seqs);
/* A new request's prompt diverged from the closest cached sequence
 * (b->unix_time is set here). */
void ns_sched_status_break(ns_sched_status *st, const ns_status_break *b);
/* Publishes a snapshot when one is due (NS_STATUS_PUBLISH_MS since the
 * last, or force: the set of requests changed). running/waiting are the
 * scheduler's arrays (borrowed for the call; waiting in queue order),
 * n_incoming the submitted requests the loop has not taken yet, kv the
 * cache's stats of this loop, n_pages the device pool, ssd_bytes the
 * SSD tier's byte cap (0 = its 32 GiB default). */
struct ns_seq;
void ns_sched_status_publish(ns_sched_status *st, bool force, struct ns_seq *const *running, int32_t n_running,
                             struct ns_seq *const *waiting, int32_t n_waiting, int32_t n_incoming,
                             const ns_kv_cache_stats *kv, int32_t n_pages, int64_t ssd_bytes);

/* ---- any thread ---- */
/* The scheduler's status (defined in sched.c; lives as long as it). */
struct ns_sched;
ns_sched_status *ns_sched_status_of(struct ns_sched *s);
/* Copies the latest published snapshot into *out (caller-owned; it is
 * large: allocate it). */
void ns_sched_status_get(ns_sched_status *st, ns_status_snapshot *out);

#endif
