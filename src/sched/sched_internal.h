/* sched_internal.h — the two halves of a request, private to src/sched/.
 *
 * ns_request: the HTTP <-> engine channel. Fields under "channel" are
 * guarded by mu; prompt and params are immutable after submit (the engine
 * may clamp params.max_tokens inside submit, before the engine sees it).
 *
 * ns_seq: the engine-owned sequence state (pages, positions, tokens,
 * sampler/RNG). Created by ns_sched_submit, touched only by the engine
 * thread afterwards, freed by it when the sequence ends; it holds the
 * engine's reference on its request. */
#ifndef NS_SCHED_INTERNAL_H
#define NS_SCHED_INTERNAL_H

#include <stdio.h>

#include "sched/sched.h"

typedef enum { RS_QUEUED = 0, RS_WAITING, RS_PREFILLING, RS_DECODING, RS_PAUSED, RS_DONE } ns_req_state;

struct ns_request {
    atomic_int refs;
    atomic_bool cancel;
    int32_t *prompt;
    int32_t n_prompt;
    ns_request_params params;
    char label[48];           /* log id (immutable after submit) */

    /* channel */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ns_token_event *events;
    int n_events, cap_events, ev_head;
    bool finished;
    bool waiting, paused;     /* queued / paused by the engine (for keep-alives) */
    int32_t queue_pos;
    ns_request_result result;
};

typedef struct ns_seq {
    ns_request *req;          /* the channel; the engine's reference */
    struct ns_seq *next;      /* incoming queue link */
    ns_req_state state;
    ns_sampler sampler;
    int32_t *tokens;          /* prompt + generated */
    int32_t n_tokens;
    size_t cap_tokens;
    int32_t n_ctx;            /* tokens whose KV is in pages */
    int32_t *pages;           /* page table (device pages, one reference each) */
    int32_t n_pages;
    size_t cap_pages;
    int32_t reserve_pages;    /* pages still promised to this sequence */
    uint64_t ready_fence;     /* its promoted pages hold their bytes after this
                               * copy fence (0 = now): not planned before */
    int32_t n_committed;      /* leading full pages already in the index */
    uint64_t last_hash;       /* chain hash of the last committed page */
    int32_t n_generated;
    uint64_t admit_order;     /* first admission order: victims are the newest */
    bool primed;              /* the prompt went through the sampler's history */
    int32_t n_pauses;
    /* while paused: the bytes of the partially filled last page (partial
     * pages have no place in the lower tiers), valid when its full pages
     * [0, saved_base) come back from the cache; NULL if none */
    void *saved_page;
    int32_t saved_base, saved_fill;
    double t_submit, t_first, t_last;
    double t_served;          /* last prefill chunk planned (fair-prefill aging) */
} ns_seq;

ns_status ns_request_push(ns_request *r, const ns_token_event *ev);
void ns_request_finish(ns_request *r, ns_finish why, const char *msg);

#endif
