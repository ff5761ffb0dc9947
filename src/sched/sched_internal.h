/* sched_internal.h — request internals shared by request.c and sched.c.
 * Private to src/sched/. Fields under "channel" are guarded by mu; fields
 * under "engine" are touched only by the engine thread. */
#ifndef NS_SCHED_INTERNAL_H
#define NS_SCHED_INTERNAL_H

#include <stdio.h>

#include "sched/sched.h"

typedef enum { RS_QUEUED = 0, RS_WAITING, RS_PREFILLING, RS_DECODING, RS_DONE } ns_req_state;

struct ns_request {
    atomic_int refs;
    atomic_bool cancel;
    int32_t *prompt;
    int32_t n_prompt;
    ns_request_params params;

    /* channel */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ns_token_event *events;
    int n_events, cap_events, ev_head;
    bool finished;
    ns_request_result result;

    /* engine */
    ns_req_state state;
    struct ns_request *next;  /* queue links */
    ns_sampler sampler;
    bool sampler_ready;
    int32_t *tokens;          /* prompt + generated */
    int32_t n_tokens, cap_tokens;
    int32_t n_ctx;            /* tokens whose KV is in pages */
    int32_t *pages;           /* page table */
    int32_t n_pages, cap_pages;
    int32_t reserve_pages;    /* pages still promised to this request */
    int32_t n_committed;      /* leading full pages already in the index */
    uint64_t last_hash;       /* chain hash of the last committed page */
    int32_t n_generated;
    double t_submit, t_first, t_last;
};

ns_status ns_request_push(ns_request *r, const ns_token_event *ev);
void ns_request_finish(ns_request *r, ns_finish why, const char *msg);

#endif
