/* prefix_index.h — maps token prefixes to cached KV pages, in any tier.
 *
 * A full page i of a sequence is keyed by the chained hash
 *   h_i = XXH64(tokens of page i, seed = h_{i-1}),  h_{-1} = model seed
 * where the model seed folds in the weights fingerprint, KV dtype and page
 * size, so one model's KV is never served to another. Each cached page is
 * a *node* that keeps the page's tokens: a hit is verified token by token,
 * so a hash collision can cost a miss but never a wrong answer.
 *
 * A node says where its bytes are: on a device page (dev >= 0), in a
 * host-RAM slot (ram >= 0), in the SSD tier (ssd) — possibly several at
 * once (a promoted page keeps its lower copies). This module only keeps
 * the map; src/kv/kv_cache moves the bytes and sets those fields.
 *
 * Partial pages (the last, not-yet-full page of a finished or cancelled
 * sequence) are nodes with n_fill < P and no hash, listed only among the
 * children of their parent hash h_{i-1}; a new prompt that extends the
 * cached one copies the matching slots into a fresh page (copy on write).
 *
 * Capacity: nodes grow on demand up to max_nodes; add fails (-1) beyond.
 * Single-threaded (engine thread).
 */
#ifndef NS_PREFIX_INDEX_H
#define NS_PREFIX_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

typedef struct ns_prefix_index ns_prefix_index;

typedef struct ns_prefix_node {
    uint64_t h;          /* full page: its chain hash; partial: 0 */
    uint64_t parent;     /* h of the previous page (or the seed) */
    int32_t n_fill;      /* tokens held: P for a full page; 0 = unused node */
    int32_t dev;         /* device page holding it, or -1 */
    int32_t ram;         /* host-RAM slot holding it, or -1 */
    uint8_t ssd;         /* handed to the SSD tier (queued or durable) */
    uint8_t ssd_pending; /* committed, not yet handed to the SSD tier */
    int32_t next_sib, prev_sib; /* children list of parent */
} ns_prefix_node;

/* Seed for the hash chain of one model + KV format + page size. */
uint64_t ns_prefix_seed(uint64_t model_fingerprint, int kv_dtype, int32_t page_tokens);
/* h_i from h_{i-1} and the page's tokens. Never 0 or 1 (reserved). */
uint64_t ns_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n);

ns_status ns_prefix_index_create(int32_t page_tokens, uint64_t seed, int32_t max_nodes, ns_prefix_index **out,
                                 ns_error *err);
void ns_prefix_index_free(ns_prefix_index *ix);
uint64_t ns_prefix_index_seed(const ns_prefix_index *ix);

/* Node access. The pointer is valid until the next add (nodes may move). */
ns_prefix_node *ns_prefix_index_node(ns_prefix_index *ix, int32_t id);
const int32_t *ns_prefix_index_tokens(const ns_prefix_index *ix, int32_t id);
int32_t ns_prefix_index_n_nodes(const ns_prefix_index *ix);
/* Full node with hash h, or -1. */
int32_t ns_prefix_index_find(ns_prefix_index *ix, uint64_t h);
/* Adds a node: full when n_fill == P (h its hash; if h is already indexed
 * returns that node and sets *existed), partial when 0 < n_fill < P (h
 * ignored). The new node has no tier (dev = ram = -1, ssd = 0). Returns -1
 * when max_nodes are in use or memory runs out. */
int32_t ns_prefix_index_add(ns_prefix_index *ix, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t n_fill,
                            bool *existed);
/* Forgets a node (no tier must still reference it). */
void ns_prefix_index_remove(ns_prefix_index *ix, int32_t id);
/* Children of a hash: first child id (or -1), then node->next_sib. */
int32_t ns_prefix_index_first_child(ns_prefix_index *ix, uint64_t parent);

typedef struct ns_prefix_match {
    int32_t n_full;        /* full pages matched (node ids in nodes[]) */
    int32_t *nodes;        /* caller-provided [max_pages] */
    uint64_t last_hash;    /* h of the last matched full page (or seed) */
    /* best device-resident continuation after the full pages: copy
     * n_partial slots from partial_node's device page (-1 if none) */
    int32_t partial_node;
    int32_t n_partial;
    /* divergence against the closest cached continuation: prompt index
     * where they differ (-1 if no cached continuation disagrees) and up to
     * 16 cached tokens from that point */
    int32_t diverge_at;
    int32_t n_diverge_cached;
    int32_t diverge_cached[16];
} ns_prefix_match;

/* Finds the longest cached prefix of tokens[0, n) (any tier), using at
 * most max_tokens of it (callers keep >= 1 token to compute). Takes no
 * references and moves nothing. */
void ns_prefix_index_lookup(ns_prefix_index *ix, const int32_t *tokens, int32_t n, int32_t max_tokens,
                            int32_t max_pages, ns_prefix_match *m);

#endif
