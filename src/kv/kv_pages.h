/* kv_pages.h — bookkeeping for the KV page pool (which page is free, who
 * holds it). The bytes live in the backend (ns_backend.kv); this module
 * only hands out page ids.
 *
 * Invariants: a page is either free (on the free list, refcount 0) or held
 * (refcount > 0) or cached (refcount 0, kept for the prefix index, on the
 * LRU list, reclaimable). n_free + n_held + n_cached == n_pages at all
 * times. Single-threaded: owned by the engine thread.
 */
#ifndef NS_KV_PAGES_H
#define NS_KV_PAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

typedef struct ns_kv_pages {
    int32_t n_pages;
    int32_t *refcount;  /* [n_pages] */
    int32_t *free_list; /* stack of free page ids */
    int32_t n_free;
    int32_t n_cached;
    /* LRU of cached pages: doubly linked through prev/next, head = oldest */
    int32_t *lru_prev, *lru_next;
    uint8_t *in_lru;
    int32_t lru_head, lru_tail;
    /* Called when a cached page is reclaimed, before its bytes are reused,
     * so the owner can demote or forget it (may be NULL). */
    void (*on_evict)(void *ctx, int32_t page);
    /* Optional veto: a cached page for which this returns false is passed
     * over by the eviction scan (the KV cache refuses pages whose chained
     * successor is still on the device, so a chain is evicted from its
     * leaf and never orphans descendants). The scan falls back to the
     * oldest page if every candidate it looks at is refused. */
    bool (*can_evict)(void *ctx, int32_t page);
    void *evict_ctx;
} ns_kv_pages;

ns_status ns_kv_pages_init(ns_kv_pages *kp, int32_t n_pages, ns_error *err);
void ns_kv_pages_free(ns_kv_pages *kp);
/* Takes a page (refcount 1): a free one, else the least recently used
 * evictable cached one (evicting it). Returns -1 when every page is held. */
int32_t ns_kv_pages_alloc(ns_kv_pages *kp);
void ns_kv_pages_ref(ns_kv_pages *kp, int32_t page);
/* Drops a reference. At zero the page becomes cached if keep is true (its
 * contents stay reusable), else free. */
void ns_kv_pages_unref(ns_kv_pages *kp, int32_t page, bool keep);
/* Pages that an allocation could get right now (free + cached). */
int32_t ns_kv_pages_available(const ns_kv_pages *kp);
/* Marks a cached page as recently used (prefix hit); no-op if held. */
void ns_kv_pages_touch(ns_kv_pages *kp, int32_t page);
/* Checks n_free + n_held + n_cached == n_pages and the lists' consistency
 * (sanitizer builds, which define NS_DEBUG_CHECKS; a no-op otherwise:
 * it is O(n_pages)). */
void ns_kv_pages_check(const ns_kv_pages *kp);

#endif
