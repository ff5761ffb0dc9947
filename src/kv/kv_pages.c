/* kv_pages.c — see kv_pages.h. */
#include "kv/kv_pages.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

ns_status ns_kv_pages_init(ns_kv_pages *kp, int32_t n_pages, ns_error *err) {
    memset(kp, 0, sizeof *kp);
    if (n_pages <= 0) return ns_fail(err, NS_ERR_INVALID, "KV pool needs at least one page");
    kp->n_pages = n_pages;
    kp->refcount = calloc((size_t)n_pages, sizeof(int32_t));
    kp->free_list = malloc((size_t)n_pages * sizeof(int32_t));
    kp->lru_prev = malloc((size_t)n_pages * sizeof(int32_t));
    kp->lru_next = malloc((size_t)n_pages * sizeof(int32_t));
    kp->in_lru = calloc((size_t)n_pages, 1);
    if (!kp->refcount || !kp->free_list || !kp->lru_prev || !kp->lru_next || !kp->in_lru) {
        ns_kv_pages_free(kp);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    /* Stack order: page 0 is handed out first. */
    for (int32_t i = 0; i < n_pages; i++) kp->free_list[i] = n_pages - 1 - i;
    kp->n_free = n_pages;
    kp->lru_head = kp->lru_tail = -1;
    return NS_OK;
}

void ns_kv_pages_free(ns_kv_pages *kp) {
    free(kp->refcount);
    free(kp->free_list);
    free(kp->lru_prev);
    free(kp->lru_next);
    free(kp->in_lru);
    memset(kp, 0, sizeof *kp);
}

static void lru_remove(ns_kv_pages *kp, int32_t p) {
    int32_t a = kp->lru_prev[p], b = kp->lru_next[p];
    if (a >= 0) kp->lru_next[a] = b;
    else kp->lru_head = b;
    if (b >= 0) kp->lru_prev[b] = a;
    else kp->lru_tail = a;
    kp->in_lru[p] = 0;
    kp->n_cached--;
}

static void lru_push(ns_kv_pages *kp, int32_t p) {
    kp->lru_prev[p] = kp->lru_tail;
    kp->lru_next[p] = -1;
    if (kp->lru_tail >= 0) kp->lru_next[kp->lru_tail] = p;
    else kp->lru_head = p;
    kp->lru_tail = p;
    kp->in_lru[p] = 1;
    kp->n_cached++;
}

int32_t ns_kv_pages_alloc(ns_kv_pages *kp) {
    int32_t p;
    if (kp->n_free > 0) {
        p = kp->free_list[--kp->n_free];
    } else if (kp->lru_head >= 0) {
        /* Bounded scan: the veto is expected to refuse few pages (leaves
         * are released before their parents, so the head is usually a
         * leaf); the bound keeps a pathological LRU from costing O(n). */
        p = kp->lru_head;
        if (kp->can_evict) {
            int32_t q = kp->lru_head;
            for (int n = 0; q >= 0 && n < 256; q = kp->lru_next[q], n++)
                if (kp->can_evict(kp->evict_ctx, q)) break;
            if (q >= 0 && kp->can_evict(kp->evict_ctx, q)) p = q;
        }
        lru_remove(kp, p);
        if (kp->on_evict) kp->on_evict(kp->evict_ctx, p);
    } else {
        return -1;
    }
    kp->refcount[p] = 1;
    return p;
}

void ns_kv_pages_ref(ns_kv_pages *kp, int32_t p) {
    if (kp->in_lru[p]) lru_remove(kp, p);
    kp->refcount[p]++;
}

void ns_kv_pages_unref(ns_kv_pages *kp, int32_t p, bool keep) {
    if (kp->refcount[p] <= 0) return; /* double release: ignore rather than corrupt lists */
    if (--kp->refcount[p] > 0) return;
    if (keep) lru_push(kp, p);
    else kp->free_list[kp->n_free++] = p;
}

int32_t ns_kv_pages_available(const ns_kv_pages *kp) { return kp->n_free + kp->n_cached; }

void ns_kv_pages_touch(ns_kv_pages *kp, int32_t p) {
    if (!kp->in_lru[p]) return;
    lru_remove(kp, p);
    lru_push(kp, p);
}

void ns_kv_pages_check(const ns_kv_pages *kp) {
#ifdef NS_DEBUG_CHECKS
    int32_t held = 0, cached = 0;
    for (int32_t p = 0; p < kp->n_pages; p++) {
        held += kp->refcount[p] > 0;
        cached += kp->in_lru[p] != 0;
        assert(!(kp->refcount[p] > 0 && kp->in_lru[p]));
    }
    assert(cached == kp->n_cached);
    assert(kp->n_free + held + cached == kp->n_pages);
    int32_t walked = 0;
    for (int32_t p = kp->lru_head; p >= 0; p = kp->lru_next[p]) walked++;
    assert(walked == kp->n_cached);
#else
    (void)kp;
#endif
}
