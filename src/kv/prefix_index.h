/* prefix_index.h — maps token prefixes to KV pages that already hold them.
 *
 * A full page i of a sequence is keyed by the chained hash
 *   h_i = XXH64(tokens of page i, seed = h_{i-1}),  h_{-1} = model seed
 * where the model seed folds in the weights fingerprint, KV dtype and page
 * size, so one model's KV is never served to another. Entries also keep
 * the page's tokens: a hit is verified token by token, so a hash collision
 * can cost a miss but never a wrong answer.
 *
 * Partial pages (the last, not-yet-full page of a finished or cancelled
 * sequence) are kept as "partials" under their parent hash h_{i-1} with
 * their fill count; a new prompt that extends the cached one copies the
 * matching slots into a fresh page (copy on write) and prefills only the
 * rest.
 *
 * Pages themselves are owned by ns_kv_pages (refcounts, LRU); the index
 * only refers to them and drops an entry when ns_kv_pages evicts the page.
 * Single-threaded (engine thread).
 */
#ifndef NS_PREFIX_INDEX_H
#define NS_PREFIX_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kv_pages.h"
#include "util/status.h"

typedef struct ns_prefix_index ns_prefix_index;

/* Seed for the hash chain of one model + KV format + page size. */
uint64_t ns_prefix_seed(uint64_t model_fingerprint, int kv_dtype, int32_t page_tokens);
/* h_i from h_{i-1} and the page's tokens. */
uint64_t ns_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n);

/* The index registers itself as kp's eviction hook. */
ns_status ns_prefix_index_create(ns_kv_pages *kp, int32_t page_tokens, uint64_t seed, ns_prefix_index **out,
                                 ns_error *err);
void ns_prefix_index_free(ns_prefix_index *ix);
uint64_t ns_prefix_index_seed(const ns_prefix_index *ix);

/* Registers a full page (tokens has page_tokens entries) under hash h with
 * parent hash parent. No-op if h is already indexed (another sequence
 * committed the same content first) — returns false then. */
bool ns_prefix_index_commit(ns_prefix_index *ix, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t page);
/* Registers a partial page holding n_fill < page_tokens tokens. */
void ns_prefix_index_commit_partial(ns_prefix_index *ix, uint64_t parent, const int32_t *tokens, int32_t n_fill,
                                    int32_t page);
/* True if page is referenced by the index (full or partial entry). */
bool ns_prefix_index_has_page(const ns_prefix_index *ix, int32_t page);

typedef struct ns_prefix_match {
    int32_t n_full;        /* full pages matched (in pages[]) */
    int32_t *pages;        /* caller-provided [max_pages] */
    uint64_t last_hash;    /* h of the last matched full page (or seed) */
    /* best partial continuation after the full pages: copy n_partial
     * slots from partial_page (-1 if none) */
    int32_t partial_page;
    int32_t n_partial;
    /* divergence against the closest cached continuation: prompt index
     * where they differ (-1 if no cached continuation disagrees) and up to
     * 16 cached tokens from that point */
    int32_t diverge_at;
    int32_t n_diverge_cached;
    int32_t diverge_cached[16];
} ns_prefix_match;

/* Finds the longest cached prefix of tokens[0, n), using at most
 * max_tokens of it (callers keep >= 1 token to compute). Takes no
 * references: the caller refs the pages it decides to use before any
 * allocation can evict them. */
void ns_prefix_index_lookup(ns_prefix_index *ix, const int32_t *tokens, int32_t n, int32_t max_tokens,
                            int32_t max_pages, ns_prefix_match *m);

#endif
