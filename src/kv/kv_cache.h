/* kv_cache.h — the one home of KV state: the device page pool, the prefix
 * index, and the lower tiers (host RAM, SSD). The scheduler talks to it
 * through this API only (look up, acquire = pin + promote, alloc, commit,
 * release, persist) and never reads pool fields directly.
 *
 * Tiers, fastest first: device (the backend's page pool; on the CPU
 * backend this already is RAM), host RAM (--ram-cache), SSD (--ssd-cache,
 * durable across restarts: see kv_ssd.h). Page bytes move only through the
 * backend's whole-page copy ops, never re-quantized, so a page restored
 * from any tier is bit-identical to the one that was computed.
 *
 * Invariants
 * - Leaves go first: a page is never evicted from the device (or from RAM)
 *   while a page chained after it is still in that tier or a faster one,
 *   so partial eviction keeps the longest possible prefix reachable.
 *   (Sequences release their pages leaf first; the eviction scan also
 *   vetoes pages with a device-resident child.)
 * - Eviction demotes: a device page leaving the pool is copied to a RAM
 *   slot when that tier is on; a full page committed while the SSD tier is
 *   on is written behind to SSD (persist), so dropping it from RAM or the
 *   device loses nothing durable.
 * - Partial pages live only on the device (they are dropped on eviction).
 * - Every device page is held (refcount > 0), cached (indexed, LRU) or
 *   free; see kv_pages.h. page_node[p] names the index node a device page
 *   holds, or -1.
 *
 * Single-threaded: owned by the engine thread, except ns_kv_cache_get_stats
 * and the SSD store's own flush, which are thread-safe.
 */
#ifndef NS_KV_CACHE_H
#define NS_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv_ssd.h"
#include "kv/prefix_index.h"
#include "util/status.h"

typedef enum { NS_TIER_DEVICE = 0, NS_TIER_RAM = 1, NS_TIER_SSD = 2, NS_TIER_COUNT = 3 } ns_kv_tier;
const char *ns_kv_tier_name(ns_kv_tier t);

typedef struct ns_kv_cache ns_kv_cache;

typedef struct ns_kv_cache_opts {
    ns_backend *be;          /* borrowed; its KV pool (be->kv) is allocated */
    uint64_t seed;           /* prefix chain seed (ns_prefix_seed) */
    int64_t ram_bytes;       /* host-RAM tier budget, 0 = off */
    const char *ssd_dir;     /* SSD tier directory, NULL = off */
    int64_t ssd_bytes;       /* SSD tier size cap */
    int32_t ssd_queue_pages; /* write-behind queue bound in pages (16..65536);
                                0 = 256 MiB worth */
} ns_kv_cache_opts;

/* Creates the cache over be's pool. An SSD tier that cannot be opened is
 * logged and left off (the server still serves); records it already holds
 * are learned into the prefix index. */
ns_status ns_kv_cache_create(const ns_kv_cache_opts *opts, ns_kv_cache **out, ns_error *err);
/* Frees everything. First hands every committed full page not yet on
 * the SSD tier to it and waits until they are durable (however many:
 * persist and flush alternate past the write-behind queue's bound), so a
 * graceful shutdown loses no completed work; logs how many it wrote. */
void ns_kv_cache_free(ns_kv_cache *kc);

int32_t ns_kv_cache_page_tokens(const ns_kv_cache *kc);
int32_t ns_kv_cache_n_pages(const ns_kv_cache *kc);
uint64_t ns_kv_cache_seed(const ns_kv_cache *kc);
bool ns_kv_cache_tier_on(const ns_kv_cache *kc, ns_kv_tier t);

/* A lookup: the longest cached prefix and where each of its pages is. */
typedef struct ns_kv_lookup {
    ns_prefix_match m;       /* m.nodes points into the cache's scratch */
    uint8_t *tier;           /* [m.n_full] fastest tier holding page i (scratch) */
    int32_t n_by_tier[NS_TIER_COUNT];
} ns_kv_lookup;

/* Finds the longest cached prefix of tokens[0, n) using at most max_tokens.
 * Valid until the next call that changes the cache. */
void ns_kv_cache_lookup(ns_kv_cache *kc, const int32_t *tokens, int32_t n, int32_t max_tokens, ns_kv_lookup *out);
/* Measured seconds to bring one page from tier t onto the device (0 for
 * the device itself). Starts from a conservative prior, then follows an
 * exponential average of real transfers. */
/* Chain hash after the first k matched pages (k >= 1). */
uint64_t ns_kv_cache_lookup_hash(ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t k);
double ns_kv_cache_restore_seconds(const ns_kv_cache *kc, ns_kv_tier t);
/* Device pages not held by anyone = what allocations can get now. */
int32_t ns_kv_cache_available(const ns_kv_cache *kc);
/* How many of the first n_use matched pages sit in the device LRU (an
 * acquire takes them out of what is available). */
int32_t ns_kv_cache_lookup_reclaimable(const ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t n_use);

/* Pins the first n_use matched pages on the device for a sequence: device
 * pages get a reference, lower-tier pages are promoted into newly
 * allocated pages. Writes their device pages to pages_out and, per tier,
 * how many came from where. Stops early if a promotion fails (no page, a
 * record that fails verification): returns the number of pages acquired;
 * the caller recomputes the rest. The caller owns one reference on each
 * page in pages_out (give them back with ns_kv_cache_release).
 * Promotions from RAM may still be in flight on return (backends with
 * asynchronous copies): *ready_fence (if non-NULL) is the fence after
 * which every acquired page holds its bytes (0 = all there now); until
 * ns_kv_cache_ready says so the pages must not be read by compute. */
int32_t ns_kv_cache_acquire(ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t n_use, int32_t *pages_out,
                            int32_t by_tier[NS_TIER_COUNT], uint64_t *ready_fence);
/* True once the copies up to fence are done (never blocks). */
bool ns_kv_cache_ready(ns_kv_cache *kc, uint64_t fence);
/* Makes compute enqueued from now on wait (on the device) for fence. */
void ns_kv_cache_compute_after(ns_kv_cache *kc, uint64_t fence);
/* Copy on write of a partial continuation: a fresh page (one reference,
 * the caller's) holding the first n_slots of node's device page; -1 if no
 * page could be had. */
int32_t ns_kv_cache_copy_partial(ns_kv_cache *kc, int32_t node, int32_t n_slots);
/* Bytes of one device page to/from host memory (page_bytes): a paused
 * sequence keeps its partially filled last page this way, since partial
 * pages have no place in the lower tiers. Sync points. */
size_t ns_kv_cache_page_bytes(const ns_kv_cache *kc);
ns_status ns_kv_cache_page_read(ns_kv_cache *kc, int32_t page, void *dst, ns_error *err);
ns_status ns_kv_cache_page_write(ns_kv_cache *kc, int32_t page, const void *src, ns_error *err);
/* A fresh device page (one reference, the caller's), evicting (and
 * demoting) the least recently used cached page if none is free; -1 when
 * every page is held. */
int32_t ns_kv_cache_alloc(ns_kv_cache *kc);
/* Indexes a full page (tokens: P of them) held on device page `page` under
 * chain hash h, and queues it for the SSD tier. No-op if h is already
 * indexed on the device (the page then stays unindexed and is freed on
 * release). */
void ns_kv_cache_commit(ns_kv_cache *kc, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t page);
/* Gives back a sequence's references on pages[0, n_pages). If the last
 * page is partially filled (n_fill_last in 1..P-1 tokens, its tokens in
 * last_tokens, parent hash last_parent) it is indexed as a partial
 * continuation. Pages are released leaf first, so a chain's tail is
 * evicted before its head. */
void ns_kv_cache_release(ns_kv_cache *kc, const int32_t *pages, int32_t n_pages, uint64_t last_parent,
                         const int32_t *last_tokens, int32_t n_fill_last);

/* Hands up to max_pages committed pages to the SSD tier (write-behind);
 * returns how many are still waiting. Cheap when there is nothing to do. */
int32_t ns_kv_cache_persist(ns_kv_cache *kc, int32_t max_pages);
/* Waits (up to timeout_ms) for the SSD tier to make everything handed to
 * it durable. Call after ns_kv_cache_persist returned 0. Thread-safe. */
ns_status ns_kv_cache_ssd_flush(ns_kv_cache *kc, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err);

typedef struct ns_kv_cache_stats {
    int32_t page_tokens;
    int64_t page_bytes;
    int64_t pages[NS_TIER_COUNT];       /* pages of cached content held per tier */
    int64_t capacity[NS_TIER_COUNT];    /* pages each tier can hold (-1: off) */
    uint64_t hit_tokens[NS_TIER_COUNT]; /* prompt tokens served from each tier */
    uint64_t demotions, promotions[NS_TIER_COUNT];
    uint64_t evictions;                 /* cached pages dropped from every tier */
    int32_t pool_free, pool_cached, pool_held;
    int64_t ssd_pending;                /* committed pages not yet handed to SSD */
    bool ssd_on;
    ns_kv_ssd_stats ssd;
} ns_kv_cache_stats;
/* Engine thread only (the scheduler snapshots it into its own stats). */
void ns_kv_cache_get_stats(ns_kv_cache *kc, ns_kv_cache_stats *out);
/* Adds served-from-tier counts (after an acquire the caller used). */
void ns_kv_cache_count_hits(ns_kv_cache *kc, const int32_t tokens_by_tier[NS_TIER_COUNT]);
/* Checks the pool and index invariants (NS_DEBUG_CHECKS builds only). */
void ns_kv_cache_check(const ns_kv_cache *kc);

#endif
