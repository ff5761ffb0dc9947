/* runner.h — runs one sequence through an engine, outside any scheduler.
 *
 * The CLI's generate/eval and the benchmarks use it: it owns a page table
 * for one sequence, allocates pages as the sequence grows, and feeds tokens
 * in chunks of at most max_batch_tokens. The server uses the scheduler
 * (src/sched/) instead, which batches many sequences per step.
 */
#ifndef NS_RUNNER_H
#define NS_RUNNER_H

#include "engine/engine.h"
#include "kv/kv_pages.h"

typedef struct ns_runner {
    ns_engine *e;        /* borrowed */
    ns_kv_pages pages;
    int32_t *page_table; /* [max_pages] */
    int32_t max_pages;
    int32_t n_held;      /* pages in page_table */
    int32_t n_ctx;       /* tokens whose KV is stored */
    float *logits;       /* host copy of the last step's logits [max_logits, vocab] */
} ns_runner;

ns_status ns_runner_init(ns_runner *r, ns_engine *e, ns_error *err);
void ns_runner_free(ns_runner *r);
/* Forgets the sequence (pages return to the pool). */
void ns_runner_reset(ns_runner *r);

/* Called per chunk with host logits of rows [first_pos, first_pos+n_rows). */
typedef void (*ns_runner_logits_fn)(void *ctx, int32_t first_pos, int32_t n_rows, const float *logits);

/* Appends tokens to the sequence. If all_logits, on_logits receives every
 * position's logits; else only the last token's (after the last chunk).
 * Fails with NS_ERR_FULL when the pool or max context is exhausted. */
ns_status ns_runner_feed(ns_runner *r, const int32_t *tokens, int32_t n, bool all_logits, ns_runner_logits_fn on_logits,
                         void *ctx, ns_error *err);

#endif
