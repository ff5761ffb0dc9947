/* sched_grammar.h — the engine's grammar hook (structured output): masks
 * of the rows that carry a grammar, computed for step N+1 on a worker
 * thread while step N+1's forward pass runs, and applied at sampling.
 *
 * Per step, on the engine thread:
 *   1. ns_sched_grammar_prepare (before sampling) waits for the worker's
 *      batch, computes any mask still missing inline (a sequence's first
 *      token, or one the worker failed), and points each grammar row's
 *      sampler at its matcher's mask (sampler->allow);
 *   2. the backend samples (masked rows are drawn from their allowed
 *      tokens only, on every backend: see ns_sampler_sample);
 *   3. ns_sched_grammar_clear unhooks the masks, the engine advances each
 *      matcher on its sampled token (ns_gmatch_accept);
 *   4. ns_sched_grammar_kick hands the still-running grammar requests to
 *      the worker, which computes their next masks during the next
 *      forward pass.
 * The worker holds a reference to each request it works on, so a request
 * finished or cancelled meanwhile stays alive until the worker is done.
 * A matcher is touched by the worker only between a kick and the next
 * prepare, and by the engine only outside that window.
 *
 * Ownership: the hook owns its thread (started on the first kick, so a
 * server that never sees a grammar runs none) and its arrays;
 * ns_sched_grammar_free joins the thread and releases held requests.
 */
#ifndef NS_SCHED_GRAMMAR_H
#define NS_SCHED_GRAMMAR_H

#include <stdbool.h>
#include <stdint.h>

#include "sample/sample.h"
#include "sched/sched.h"

typedef struct ns_sched_grammar ns_sched_grammar;

/* max_rows: the most sampled rows in one step. NULL on OOM. */
ns_sched_grammar *ns_sched_grammar_new(int32_t max_rows);
void ns_sched_grammar_free(ns_sched_grammar *h);
/* Rows [0, n): reqs[i] and samplers[i] of the step's sampled rows. For a
 * request with a grammar, sets samplers[i]->allow to its mask; failed[i]
 * is set (and the message copied to msg, cap bytes) for a row whose mask
 * could not be computed (the caller fails that request after sampling;
 * its sampler then draws without a mask and its token is discarded). */
void ns_sched_grammar_prepare(ns_sched_grammar *h, ns_request *const *reqs, ns_sampler *const *samplers, int32_t n,
                              bool *failed, char *msg, size_t cap);
/* Unhooks the masks set by prepare (allow = NULL). */
void ns_sched_grammar_clear(ns_sampler *const *samplers, int32_t n);
/* Queues the next masks of reqs[0, n) (requests with a grammar, not done)
 * on the worker; takes a reference to each. */
void ns_sched_grammar_kick(ns_sched_grammar *h, ns_request *const *reqs, int32_t n);

#endif
