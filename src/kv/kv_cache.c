/* kv_cache.c — device pool + prefix index + RAM and SSD tiers. See
 * kv_cache.h for the contract and invariants. */
#include "kv/kv_cache.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_pages.h"
#include "util/clock.h"
#include "util/log.h"

/* Nodes the index may hold beyond the device pages and RAM slots: SSD-only
 * pages learned at startup or left behind by demotion. */
#define MAX_NODES_CAP (1 << 24)
/* Write-behind queue bound in bytes (the SSD store copies each page). */
#define SSD_QUEUE_BYTES (256ll << 20)

/* Priors for restore costs until real transfers were measured: a host
 * memcpy / PCIe copy and a modest NVMe read. */
#define PRIOR_RAM_BPS 4e9
#define PRIOR_SSD_BPS 5e8

struct ns_kv_cache {
    ns_backend *be;
    int32_t P;
    size_t page_bytes;
    uint64_t seed;
    ns_kv_pages pool;
    ns_prefix_index *ix;
    int32_t *page_node; /* [n_pages] node held by each device page, -1 none */
    int32_t n_dev_nodes; /* device pages with page_node >= 0 */

    /* host-RAM tier: n_ram slots of page_bytes; LRU of unpinned slots */
    int32_t n_ram;
    unsigned char *ram;
    bool ram_pinned_alloc; /* ram came from the backend's host_alloc */
    /* Asynchronous copies (CUDA: a copy stream overlapping compute), used
     * for RAM demotions and promotions when ram is pinned. ram_fence[s]:
     * the last device->host copy into slot s (the host waits for it before
     * reading the slot); page_fence[p]: the last copy touching device page
     * p (compute waits for it before reusing the page). */
    bool async;
    uint64_t *ram_fence, *page_fence;
    bool ram_bw_measured; /* the first async promotion batch is timed */
    uint64_t last_fence;
    int32_t *ram_node, *ram_prev, *ram_next, *ram_free;
    uint8_t *ram_pinned;
    int32_t n_ram_free, ram_head, ram_tail, n_ram_lru;

    /* SSD tier */
    ns_kv_ssd *ssd;
    int32_t *pending; /* node ids waiting to be handed to SSD (FIFO) */
    int32_t pend_head, pend_len, pend_cap;
    int64_t n_pending;
    unsigned char *staging; /* one page */
    int32_t *staging_tokens;

    /* lookup scratch */
    int32_t *match_nodes;
    uint8_t *match_tier;

    double bps[NS_TIER_COUNT]; /* measured restore bandwidth per tier */
    ns_kv_cache_stats st;
};

const char *ns_kv_tier_name(ns_kv_tier t) {
    switch (t) {
    case NS_TIER_DEVICE: return "device";
    case NS_TIER_RAM: return "ram";
    case NS_TIER_SSD: return "ssd";
    default: return "?";
    }
}

/* ------------------------------------------------------------ RAM slots */

static void set_page_node(ns_kv_cache *kc, int32_t page, int32_t id) {
    kc->n_dev_nodes += (id >= 0) - (kc->page_node[page] >= 0);
    kc->page_node[page] = id;
}

static void ram_lru_remove(ns_kv_cache *kc, int32_t s) {
    int32_t a = kc->ram_prev[s], b = kc->ram_next[s];
    if (a >= 0) kc->ram_next[a] = b;
    else kc->ram_head = b;
    if (b >= 0) kc->ram_prev[b] = a;
    else kc->ram_tail = a;
    kc->ram_prev[s] = kc->ram_next[s] = -1;
    kc->n_ram_lru--;
}

static void ram_lru_push(ns_kv_cache *kc, int32_t s) {
    kc->ram_prev[s] = kc->ram_tail;
    kc->ram_next[s] = -1;
    if (kc->ram_tail >= 0) kc->ram_next[kc->ram_tail] = s;
    else kc->ram_head = s;
    kc->ram_tail = s;
    kc->n_ram_lru++;
}

static unsigned char *ram_bytes(ns_kv_cache *kc, int32_t s) { return kc->ram + (size_t)s * kc->page_bytes; }

static void wait_slot(ns_kv_cache *kc, int32_t slot) {
    if (kc->async && kc->ram_fence[slot]) kc->be->ops->fence_wait(kc->be, kc->ram_fence[slot]);
}

/* Forgets node id if no tier holds it any more. */
static void maybe_drop_node(ns_kv_cache *kc, int32_t id) {
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    if (n->n_fill == 0 || n->dev >= 0 || n->ram >= 0 || n->ssd) return;
    if (n->ssd_pending) kc->n_pending--;
    ns_prefix_index_remove(kc->ix, id);
    kc->st.evictions++;
}

static void ssd_put_from(ns_kv_cache *kc, int32_t id, const void *bytes);

/* A child of node id still in the RAM tier or faster. */
static bool has_child_at_or_above(ns_kv_cache *kc, int32_t id, bool ram_counts) {
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    if (!n->h) return false;
    for (int32_t c = ns_prefix_index_first_child(kc->ix, n->h); c >= 0;) {
        ns_prefix_node *cn = ns_prefix_index_node(kc->ix, c);
        if (cn->dev >= 0 || (ram_counts && cn->ram >= 0)) return true;
        c = cn->next_sib;
    }
    return false;
}

/* Frees RAM slot s (its node loses its RAM copy). A page still waiting for
 * the SSD tier is handed to it first, from these very bytes. */
static void ram_evict_slot(ns_kv_cache *kc, int32_t s) {
    int32_t id = kc->ram_node[s];
    kc->ram_node[s] = -1;
    if (id < 0) return;
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    if (n->ssd_pending && kc->ssd) {
        wait_slot(kc, s);
        ssd_put_from(kc, id, ram_bytes(kc, s));
    }
    n = ns_prefix_index_node(kc->ix, id);
    n->ram = -1;
    maybe_drop_node(kc, id);
}

/* A RAM slot for new content, evicting the least recently used one whose
 * chained successors are gone from RAM and device. -1 if all are pinned. */
static int32_t ram_alloc(ns_kv_cache *kc) {
    if (kc->n_ram_free > 0) return kc->ram_free[--kc->n_ram_free];
    int32_t s = kc->ram_head, pick = -1;
    for (int n = 0; s >= 0 && n < 256; s = kc->ram_next[s], n++) {
        int32_t id = kc->ram_node[s];
        if (id < 0 || !has_child_at_or_above(kc, id, true)) {
            pick = s;
            break;
        }
    }
    if (pick < 0) pick = kc->ram_head;
    if (pick < 0) return -1;
    ram_lru_remove(kc, pick);
    ram_evict_slot(kc, pick);
    return pick;
}

/* ------------------------------------------------------------ SSD */

static void pending_push(ns_kv_cache *kc, int32_t id) {
    if (kc->pend_head + kc->pend_len == kc->pend_cap) {
        if (kc->pend_head > 0) {
            memmove(kc->pending, kc->pending + kc->pend_head, (size_t)kc->pend_len * sizeof(int32_t));
            kc->pend_head = 0;
        } else {
            int32_t nc = kc->pend_cap ? kc->pend_cap * 2 : 1024;
            int32_t *p = nc <= MAX_NODES_CAP ? realloc(kc->pending, (size_t)nc * sizeof(int32_t)) : NULL;
            if (!p) return; /* not queued: the page just stays unpersisted */
            kc->pending = p;
            kc->pend_cap = nc;
        }
    }
    kc->pending[kc->pend_head + kc->pend_len++] = id;
}

/* Hands a full page to the SSD store from host bytes. */
static void ssd_put_from(ns_kv_cache *kc, int32_t id, const void *bytes) {
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    if (!n->ssd_pending) return;
    ns_status rc = ns_kv_ssd_put(kc->ssd, n->h, n->parent, ns_prefix_index_tokens(kc->ix, id), bytes);
    if (rc == NS_OK) {
        n->ssd = 1;
        n->ssd_pending = 0;
        kc->n_pending--;
    } else if (rc == NS_ERR_IO) {
        n->ssd_pending = 0; /* degraded tier: stop trying */
        kc->n_pending--;
    }
}

static void learn_ssd_record(void *ctx, uint64_t h, uint64_t parent, const int32_t *tokens) {
    ns_kv_cache *kc = ctx;
    int32_t id = ns_prefix_index_add(kc->ix, parent, h, tokens, kc->P, NULL);
    if (id >= 0) ns_prefix_index_node(kc->ix, id)->ssd = 1;
}

/* ------------------------------------------------------------ device pool */

static bool pool_can_evict(void *ctx, int32_t page) {
    ns_kv_cache *kc = ctx;
    int32_t id = kc->page_node[page];
    return id < 0 || !has_child_at_or_above(kc, id, false);
}

/* The pool is about to reuse a cached page: demote its content first. */
static void pool_on_evict(void *ctx, int32_t page) {
    ns_kv_cache *kc = ctx;
    int32_t id = kc->page_node[page];
    set_page_node(kc, page, -1);
    if (id < 0) return;
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    n->dev = -1;
    if (n->n_fill < kc->P) { /* partial pages live only on the device */
        ns_prefix_index_remove(kc->ix, id);
        return;
    }
    if (n->ram < 0 && kc->n_ram > 0) {
        int32_t s = ram_alloc(kc);
        n = ns_prefix_index_node(kc->ix, id);
        if (s >= 0) {
            ns_error err = {0};
            ns_status rc = NS_OK;
            if (kc->async) {
                /* on the copy stream; the next compute that writes this
                 * page waits for it on the device, the host goes on */
                uint64_t f = kc->be->ops->kv_page_read_async(kc->be, page, ram_bytes(kc, s));
                kc->ram_fence[s] = kc->page_fence[page] = f;
                if (f > kc->last_fence) kc->last_fence = f;
                kc->be->ops->compute_after(kc->be, f);
            } else {
                rc = kc->be->ops->kv_page_read(kc->be, page, ram_bytes(kc, s), &err);
            }
            if (rc == NS_OK) {
                n->ram = s;
                kc->ram_node[s] = id;
                ram_lru_push(kc, s);
                kc->st.demotions++;
            } else {
                NS_WARN("kv cache: demotion to RAM failed: %s", err.msg);
                kc->ram_free[kc->n_ram_free++] = s;
            }
        }
    }
    if (n->ssd_pending && kc->ssd) {
        if (n->ram >= 0) {
            /* stays pending: persist() writes it from RAM later */
        } else {
            ns_error err = {0};
            if (kc->be->ops->kv_page_read(kc->be, page, kc->staging, &err) == NS_OK) ssd_put_from(kc, id, kc->staging);
        }
    }
    maybe_drop_node(kc, id);
}

/* ------------------------------------------------------------ life cycle */

ns_status ns_kv_cache_create(const ns_kv_cache_opts *o, ns_kv_cache **out, ns_error *err) {
    *out = NULL;
    ns_kv_cache *kc = calloc(1, sizeof *kc);
    if (!kc) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status rc = NS_OK;
    kc->be = o->be;
    kc->P = o->be->kv.page_tokens;
    kc->page_bytes = o->be->kv.page_size_bytes;
    kc->seed = o->seed;
    const int32_t n_pages = o->be->kv.n_pages;
    rc = ns_kv_pages_init(&kc->pool, n_pages, err);
    if (rc != NS_OK) goto fail;
    kc->pool.on_evict = pool_on_evict;
    kc->pool.can_evict = pool_can_evict;
    kc->pool.evict_ctx = kc;
    kc->page_node = malloc((size_t)n_pages * sizeof(int32_t));
    kc->match_nodes = malloc((size_t)n_pages * sizeof(int32_t));
    kc->match_tier = malloc((size_t)n_pages);
    kc->staging = malloc(kc->page_bytes);
    kc->staging_tokens = malloc((size_t)kc->P * sizeof(int32_t));
    if (!kc->page_node || !kc->match_nodes || !kc->match_tier || !kc->staging || !kc->staging_tokens) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory for the KV cache");
        goto fail;
    }
    for (int32_t i = 0; i < n_pages; i++) kc->page_node[i] = -1;

    if (o->ram_bytes > 0) {
        int64_t n = o->ram_bytes / (int64_t)kc->page_bytes;
        if (n > INT32_MAX / 2) n = INT32_MAX / 2;
        kc->n_ram = (int32_t)n;
    }
    if (kc->n_ram > 0) {
        const size_t n = (size_t)kc->n_ram;
        if (kc->be->ops->host_alloc) kc->ram = kc->be->ops->host_alloc(kc->be, n * kc->page_bytes);
        kc->ram_pinned_alloc = kc->ram != NULL;
        if (!kc->ram) kc->ram = malloc(n * kc->page_bytes);
        kc->ram_node = malloc(n * sizeof(int32_t));
        kc->ram_prev = malloc(n * sizeof(int32_t));
        kc->ram_next = malloc(n * sizeof(int32_t));
        kc->ram_free = malloc(n * sizeof(int32_t));
        kc->ram_pinned = calloc(n, 1);
        kc->ram_fence = calloc(n, sizeof(uint64_t));
        if (!kc->ram || !kc->ram_node || !kc->ram_prev || !kc->ram_next || !kc->ram_free || !kc->ram_pinned ||
            !kc->ram_fence) {
            rc = ns_fail(err, NS_ERR_NOMEM, "cannot allocate the %lld-byte RAM cache tier",
                         (long long)o->ram_bytes);
            goto fail;
        }
        for (int32_t i = 0; i < kc->n_ram; i++) {
            kc->ram_node[i] = kc->ram_prev[i] = kc->ram_next[i] = -1;
            kc->ram_free[i] = kc->n_ram - 1 - i;
        }
        kc->n_ram_free = kc->n_ram;
    }
    kc->ram_head = kc->ram_tail = -1;
    const ns_backend_ops *ops = kc->be->ops;
    kc->async = kc->n_ram > 0 && kc->ram_pinned_alloc && ops->kv_page_read_async && ops->kv_page_write_async &&
                ops->fence_done && ops->fence_wait && ops->compute_after;
    if (kc->async) {
        kc->page_fence = calloc((size_t)n_pages, sizeof(uint64_t));
        if (!kc->page_fence) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory for the KV cache");
            goto fail;
        }
    }

    int64_t max_nodes = (int64_t)n_pages + kc->n_ram + 1024;
    if (o->ssd_dir && o->ssd_bytes > 0) max_nodes += o->ssd_bytes / (int64_t)kc->page_bytes;
    if (max_nodes > MAX_NODES_CAP) max_nodes = MAX_NODES_CAP;
    rc = ns_prefix_index_create(kc->P, o->seed, (int32_t)max_nodes, &kc->ix, err);
    if (rc != NS_OK) goto fail;

    if (o->ssd_dir) {
        int64_t q = o->ssd_queue_pages > 0 ? o->ssd_queue_pages : SSD_QUEUE_BYTES / (int64_t)kc->page_bytes;
        ns_kv_ssd_opts so = {
            .dir = o->ssd_dir,
            .seed = o->seed,
            .page_tokens = kc->P,
            .page_bytes = kc->page_bytes,
            .cap_bytes = o->ssd_bytes > 0 ? o->ssd_bytes : (32ll << 30),
            .max_queue_pages = (int32_t)(q < 16 ? 16 : q > 65536 ? 65536 : q),
        };
        ns_error serr = {0};
        if (ns_kv_ssd_open(&so, &kc->ssd, &serr) != NS_OK) {
            NS_WARN("SSD cache tier off: %s", serr.msg);
            kc->ssd = NULL;
        } else {
            int64_t n = ns_kv_ssd_enumerate(kc->ssd, learn_ssd_record, kc);
            NS_INFO("SSD cache tier: %s, %lld pages of this model restored into the prefix index", o->ssd_dir,
                    (long long)n);
        }
    }
    kc->bps[NS_TIER_DEVICE] = 0;
    kc->bps[NS_TIER_RAM] = PRIOR_RAM_BPS;
    kc->bps[NS_TIER_SSD] = PRIOR_SSD_BPS;
    *out = kc;
    return NS_OK;
fail:
    ns_kv_cache_free(kc);
    return rc;
}

/* Shutdown: every committed full page goes to the SSD tier before the
 * store closes, so a graceful stop keeps all completed work. One persist
 * pass stops when the write-behind queue is full (SSD_QUEUE_BYTES: a few
 * hundred pages of a large model, a few thousand tokens), which used to
 * drop the rest of a long prompt's pages on every graceful stop; so
 * persist and flush alternate until nothing is pending or a pass makes no
 * progress (a degraded tier clears its pending pages; a failed copy
 * leaves them: neither loops). */
static void ssd_drain_and_close(ns_kv_cache *kc) {
    const int64_t before = kc->n_pending;
    int32_t left = ns_kv_cache_persist(kc, INT32_MAX);
    while (left > 0) {
        ns_kv_ssd_flush_result fr;
        ns_kv_ssd_flush(kc->ssd, -1, &fr, NULL); /* the queue is empty after this */
        const int32_t prev = left;
        left = ns_kv_cache_persist(kc, INT32_MAX);
        if (left >= prev) break;
    }
    /* one line an operator (or a supervisor) can wait for */
    ns_kv_ssd_flush_result fr = {0};
    ns_kv_ssd_flush(kc->ssd, -1, &fr, NULL);
    ns_kv_ssd_stats st;
    ns_kv_ssd_get_stats(kc->ssd, &st);
    NS_INFO("SSD cache tier: closed, %lld pages of this model durable (%lld handed over at shutdown)%s",
            (long long)st.records, (long long)(before - kc->n_pending),
            st.degraded || kc->n_pending > 0 ? "; some pages could not be written (see the warnings above)" : "");
    ns_kv_ssd_close(kc->ssd);
    kc->ssd = NULL;
}

void ns_kv_cache_free(ns_kv_cache *kc) {
    if (!kc) return;
    if (kc->ssd) ssd_drain_and_close(kc);
    if (kc->async && kc->be->ops->fence_wait) kc->be->ops->fence_wait(kc->be, kc->last_fence);
    ns_prefix_index_free(kc->ix);
    ns_kv_pages_free(&kc->pool);
    free(kc->page_node);
    if (kc->ram_pinned_alloc) kc->be->ops->host_free(kc->be, kc->ram);
    else free(kc->ram);
    free(kc->ram_node);
    free(kc->ram_prev);
    free(kc->ram_next);
    free(kc->ram_free);
    free(kc->ram_pinned);
    free(kc->ram_fence);
    free(kc->page_fence);
    free(kc->pending);
    free(kc->staging);
    free(kc->staging_tokens);
    free(kc->match_nodes);
    free(kc->match_tier);
    free(kc);
}

int32_t ns_kv_cache_page_tokens(const ns_kv_cache *kc) { return kc->P; }
int32_t ns_kv_cache_n_pages(const ns_kv_cache *kc) { return kc->pool.n_pages; }
uint64_t ns_kv_cache_seed(const ns_kv_cache *kc) { return kc->seed; }
bool ns_kv_cache_tier_on(const ns_kv_cache *kc, ns_kv_tier t) {
    return t == NS_TIER_DEVICE || (t == NS_TIER_RAM && kc->n_ram > 0) || (t == NS_TIER_SSD && kc->ssd);
}

/* ------------------------------------------------------------ lookup */

void ns_kv_cache_lookup(ns_kv_cache *kc, const int32_t *tokens, int32_t n, int32_t max_tokens, ns_kv_lookup *out) {
    memset(out, 0, sizeof *out);
    out->m.nodes = kc->match_nodes;
    out->tier = kc->match_tier;
    ns_prefix_index_lookup(kc->ix, tokens, n, max_tokens, kc->pool.n_pages, &out->m);
    for (int32_t i = 0; i < out->m.n_full; i++) {
        const ns_prefix_node *nd = ns_prefix_index_node(kc->ix, out->m.nodes[i]);
        ns_kv_tier t = nd->dev >= 0 ? NS_TIER_DEVICE : nd->ram >= 0 ? NS_TIER_RAM : NS_TIER_SSD;
        out->tier[i] = (uint8_t)t;
        out->n_by_tier[t]++;
    }
}

uint64_t ns_kv_cache_lookup_hash(ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t k) {
    if (k <= 0) return kc->seed;
    return ns_prefix_index_node(kc->ix, lk->m.nodes[k - 1])->h;
}

double ns_kv_cache_restore_seconds(const ns_kv_cache *kc, ns_kv_tier t) {
    if (t == NS_TIER_DEVICE || kc->bps[t] <= 0) return 0;
    return (double)kc->page_bytes / kc->bps[t];
}

int32_t ns_kv_cache_available(const ns_kv_cache *kc) { return ns_kv_pages_available(&kc->pool); }

int32_t ns_kv_cache_lookup_reclaimable(const ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t n_use) {
    int32_t n = 0;
    for (int32_t i = 0; i < n_use && i < lk->m.n_full; i++) {
        const ns_prefix_node *nd = ns_prefix_index_node(kc->ix, lk->m.nodes[i]);
        if (nd->dev >= 0 && kc->pool.in_lru[nd->dev]) n++;
    }
    return n;
}

/* ------------------------------------------------------------ acquire */

static void note_bandwidth(ns_kv_cache *kc, ns_kv_tier t, double seconds) {
    if (seconds <= 0) return;
    double bps = (double)kc->page_bytes / seconds;
    kc->bps[t] = 0.8 * kc->bps[t] + 0.2 * bps;
}

/* Brings node id onto a fresh device page. -1 on failure (the node loses
 * a tier whose bytes failed verification). */
/* A device page for new content. A page whose last asynchronous copy may
 * still run (a demotion reading it, a promotion writing it) is reused only
 * after that copy: compute enqueued from now on waits for it on the
 * device. */
static int32_t alloc_page(ns_kv_cache *kc) {
    int32_t p = ns_kv_pages_alloc(&kc->pool);
    if (p >= 0 && kc->async && kc->page_fence[p]) kc->be->ops->compute_after(kc->be, kc->page_fence[p]);
    return p;
}

/* Brings node id onto a fresh device page. -1 on failure (the node loses
 * a tier whose bytes failed verification). A RAM promotion on a backend
 * with asynchronous copies is only issued: *fence says when it is done. */
static int32_t promote(ns_kv_cache *kc, int32_t id, uint64_t *fence) {
    int32_t page = alloc_page(kc);
    if (page < 0) return -1;
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    ns_error err = {0};
    double t0 = ns_clock_now();
    ns_status rc = NS_OK;
    ns_kv_tier from;
    bool issued = false;
    if (n->ram >= 0) {
        from = NS_TIER_RAM;
        if (kc->async) {
            /* the copy stream orders it after a demotion into the same
             * slot and after compute that still reads the page */
            uint64_t f = kc->be->ops->kv_page_write_async(kc->be, page, ram_bytes(kc, n->ram));
            kc->page_fence[page] = f;
            if (f > kc->last_fence) kc->last_fence = f;
            if (f > *fence) *fence = f;
            issued = true;
        } else {
            rc = kc->be->ops->kv_page_write(kc->be, page, ram_bytes(kc, n->ram), &err);
        }
    } else if (n->ssd && kc->ssd) {
        from = NS_TIER_SSD;
        rc = ns_kv_ssd_get(kc->ssd, n->h, kc->staging_tokens, kc->staging, &err);
        n = ns_prefix_index_node(kc->ix, id);
        if (rc == NS_OK &&
            memcmp(kc->staging_tokens, ns_prefix_index_tokens(kc->ix, id), (size_t)kc->P * sizeof(int32_t)) != 0)
            rc = ns_fail(&err, NS_ERR_FORMAT, "SSD record tokens differ from the index");
        if (rc == NS_OK) rc = kc->be->ops->kv_page_write(kc->be, page, kc->staging, &err);
        if (rc != NS_OK && rc != NS_ERR_INTERNAL) {
            n->ssd = 0; /* gone or corrupt: never served again */
            NS_INFO("kv cache: SSD page not restored (%s); recomputing", err.msg);
        }
    } else {
        rc = NS_ERR_RANGE;
        from = NS_TIER_SSD;
    }
    if (rc != NS_OK) {
        ns_kv_pages_unref(&kc->pool, page, false);
        maybe_drop_node(kc, id);
        return -1;
    }
    if (!issued) note_bandwidth(kc, from, ns_clock_now() - t0);
    n = ns_prefix_index_node(kc->ix, id);
    n->dev = page;
    set_page_node(kc, page, id);
    kc->st.promotions[from]++;
    return page;
}

int32_t ns_kv_cache_acquire(ns_kv_cache *kc, const ns_kv_lookup *lk, int32_t n_use, int32_t *pages_out,
                            int32_t by_tier[NS_TIER_COUNT], uint64_t *ready_fence) {
    for (int t = 0; t < NS_TIER_COUNT; t++) by_tier[t] = 0;
    uint64_t fence = 0;
    int32_t n_async = 0;
    const double t_issue = ns_clock_now();
    if (n_use > lk->m.n_full) n_use = lk->m.n_full;
    /* Pin first, so the allocations of the promotions below cannot evict
     * a page of this very prefix: device pages get their reference, RAM
     * slots leave the RAM LRU. */
    for (int32_t i = 0; i < n_use; i++) {
        ns_prefix_node *nd = ns_prefix_index_node(kc->ix, lk->m.nodes[i]);
        pages_out[i] = -1;
        if (nd->dev >= 0) {
            ns_kv_pages_ref(&kc->pool, nd->dev);
            pages_out[i] = nd->dev;
        } else if (nd->ram >= 0 && !kc->ram_pinned[nd->ram]) {
            ram_lru_remove(kc, nd->ram);
            kc->ram_pinned[nd->ram] = 1;
        }
    }
    int32_t got = n_use;
    for (int32_t i = 0; i < n_use; i++) {
        if (pages_out[i] >= 0) continue;
        const bool from_ram = ns_prefix_index_node(kc->ix, lk->m.nodes[i])->ram >= 0;
        int32_t pg = promote(kc, lk->m.nodes[i], &fence);
        if (pg < 0) {
            got = i;
            break;
        }
        n_async += kc->async && from_ram;
        pages_out[i] = pg;
    }
    /* Unpin RAM slots (most recently used now); drop what was not used. */
    for (int32_t i = 0; i < n_use; i++) {
        int32_t id = lk->m.nodes[i];
        ns_prefix_node *nd = ns_prefix_index_node(kc->ix, id);
        if (nd->n_fill && nd->ram >= 0 && kc->ram_pinned[nd->ram]) {
            kc->ram_pinned[nd->ram] = 0;
            ram_lru_push(kc, nd->ram);
        }
        if (i >= got && pages_out[i] >= 0) {
            ns_kv_pages_unref(&kc->pool, pages_out[i], true);
            pages_out[i] = -1;
        }
    }
    /* where the pages that were used came from (as looked up) */
    for (int t = 0; t < NS_TIER_COUNT; t++) by_tier[t] = 0;
    for (int32_t i = 0; i < got; i++) by_tier[lk->tier[i]]++;
    /* asynchronous RAM promotions: the restore-vs-recompute plan needs the
     * tier's real rate, so the first batch of a cache is waited for and
     * timed; later ones overlap with compute */
    if (n_async >= 4 && !kc->ram_bw_measured) {
        kc->be->ops->fence_wait(kc->be, fence);
        kc->bps[NS_TIER_RAM] = (double)kc->page_bytes * n_async / (ns_clock_now() - t_issue);
        kc->ram_bw_measured = true;
    }
    if (ready_fence) *ready_fence = fence;
    return got;
}

int32_t ns_kv_cache_copy_partial(ns_kv_cache *kc, int32_t node, int32_t n_slots) {
    ns_prefix_node *nd = ns_prefix_index_node(kc->ix, node);
    int32_t src = nd->dev;
    if (src < 0) return -1;
    /* pin the source: the allocation could otherwise evict it */
    ns_kv_pages_ref(&kc->pool, src);
    int32_t dst = alloc_page(kc);
    if (dst >= 0) kc->be->ops->kv_page_copy(kc->be, dst, src, n_slots);
    ns_kv_pages_unref(&kc->pool, src, kc->page_node[src] >= 0);
    return dst;
}

int32_t ns_kv_cache_alloc(ns_kv_cache *kc) { return alloc_page(kc); }

bool ns_kv_cache_ready(ns_kv_cache *kc, uint64_t fence) {
    return fence == 0 || !kc->async || kc->be->ops->fence_done(kc->be, fence);
}

void ns_kv_cache_compute_after(ns_kv_cache *kc, uint64_t fence) {
    if (fence && kc->async) kc->be->ops->compute_after(kc->be, fence);
}

size_t ns_kv_cache_page_bytes(const ns_kv_cache *kc) { return kc->page_bytes; }

ns_status ns_kv_cache_page_read(ns_kv_cache *kc, int32_t page, void *dst, ns_error *err) {
    return kc->be->ops->kv_page_read(kc->be, page, dst, err);
}

ns_status ns_kv_cache_page_write(ns_kv_cache *kc, int32_t page, const void *src, ns_error *err) {
    return kc->be->ops->kv_page_write(kc->be, page, src, err);
}

void ns_kv_cache_commit(ns_kv_cache *kc, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t page) {
    if (kc->page_node[page] >= 0) return; /* already indexed (it was restored from the cache) */
    bool existed = false;
    int32_t id = ns_prefix_index_add(kc->ix, parent, h, tokens, kc->P, &existed);
    if (id < 0) return;
    ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
    if (existed && n->dev >= 0) return; /* another sequence computed it first */
    n->dev = page;
    set_page_node(kc, page, id);
    if (kc->ssd && !n->ssd && !n->ssd_pending) {
        n->ssd_pending = 1;
        kc->n_pending++;
        pending_push(kc, id);
    }
}

void ns_kv_cache_release(ns_kv_cache *kc, const int32_t *pages, int32_t n_pages, uint64_t last_parent,
                         const int32_t *last_tokens, int32_t n_fill_last) {
    if (n_pages <= 0) return;
    int32_t last = pages[n_pages - 1];
    if (n_fill_last > 0 && n_fill_last < kc->P && kc->page_node[last] < 0) {
        int32_t id = ns_prefix_index_add(kc->ix, last_parent, 0, last_tokens, n_fill_last, NULL);
        if (id >= 0) {
            ns_prefix_index_node(kc->ix, id)->dev = last;
            set_page_node(kc, last, id);
        }
    }
    /* leaf first: the chain's tail enters the LRU (is evicted) before its head */
    for (int32_t i = n_pages - 1; i >= 0; i--) ns_kv_pages_unref(&kc->pool, pages[i], kc->page_node[pages[i]] >= 0);
}

/* ------------------------------------------------------------ persist */

int32_t ns_kv_cache_persist(ns_kv_cache *kc, int32_t max_pages) {
    if (!kc->ssd) return 0;
    int32_t done = 0;
    while (kc->pend_len > 0 && done < max_pages) {
        int32_t id = kc->pending[kc->pend_head];
        ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
        if (n->n_fill == kc->P && n->ssd_pending) {
            const void *bytes = NULL;
            ns_error err = {0};
            if (n->ram >= 0) {
                wait_slot(kc, n->ram);
                bytes = ram_bytes(kc, n->ram);
            } else if (n->dev >= 0) {
                if (kc->be->ops->kv_page_read(kc->be, n->dev, kc->staging, &err) == NS_OK) bytes = kc->staging;
            }
            if (!bytes) {
                n->ssd_pending = 0;
                kc->n_pending--;
            } else {
                ssd_put_from(kc, id, bytes);
                n = ns_prefix_index_node(kc->ix, id);
                if (n->ssd_pending) break; /* queue full: retry at the next step */
            }
            done++;
        }
        kc->pend_head++;
        kc->pend_len--;
    }
    if (kc->pend_len == 0) kc->pend_head = 0;
    return kc->pend_len;
}

ns_status ns_kv_cache_ssd_flush(ns_kv_cache *kc, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err) {
    memset(out, 0, sizeof *out);
    if (!kc->ssd) return ns_fail(err, NS_ERR_UNSUPPORTED, "the SSD cache tier is off");
    return ns_kv_ssd_flush(kc->ssd, timeout_ms, out, err);
}

/* ------------------------------------------------------------ stats */

void ns_kv_cache_get_stats(ns_kv_cache *kc, ns_kv_cache_stats *out) {
    kc->st.page_tokens = kc->P;
    kc->st.page_bytes = (int64_t)kc->page_bytes;
    kc->st.pool_free = kc->pool.n_free;
    kc->st.pool_cached = kc->pool.n_cached;
    kc->st.pool_held = kc->pool.n_pages - kc->pool.n_free - kc->pool.n_cached;
    kc->st.pages[NS_TIER_DEVICE] = kc->n_dev_nodes;
    kc->st.pages[NS_TIER_RAM] = kc->n_ram - kc->n_ram_free;
    kc->st.capacity[NS_TIER_DEVICE] = kc->pool.n_pages;
    kc->st.capacity[NS_TIER_RAM] = kc->n_ram > 0 ? kc->n_ram : -1;
    kc->st.ssd_on = kc->ssd != NULL;
    kc->st.ssd_pending = kc->n_pending;
    if (kc->ssd) {
        ns_kv_ssd_get_stats(kc->ssd, &kc->st.ssd);
        kc->st.pages[NS_TIER_SSD] = kc->st.ssd.records;
        kc->st.capacity[NS_TIER_SSD] = kc->st.ssd.records; /* bounded by bytes, not pages */
    } else {
        memset(&kc->st.ssd, 0, sizeof kc->st.ssd);
        kc->st.pages[NS_TIER_SSD] = 0;
        kc->st.capacity[NS_TIER_SSD] = -1;
    }
    *out = kc->st;
}

void ns_kv_cache_count_hits(ns_kv_cache *kc, const int32_t tokens_by_tier[NS_TIER_COUNT]) {
    for (int t = 0; t < NS_TIER_COUNT; t++) kc->st.hit_tokens[t] += (uint64_t)tokens_by_tier[t];
}

void ns_kv_cache_check(const ns_kv_cache *kc) {
#ifdef NS_DEBUG_CHECKS
    ns_kv_pages_check(&kc->pool);
    for (int32_t p = 0; p < kc->pool.n_pages; p++) {
        int32_t id = kc->page_node[p];
        if (id < 0) continue;
        const ns_prefix_node *n = ns_prefix_index_node(kc->ix, id);
        assert(n->dev == p && n->n_fill > 0);          /* page and node agree */
        assert(kc->pool.refcount[p] > 0 || kc->pool.in_lru[p]); /* indexed pages are never free */
    }
    int32_t in_lru = 0, pinned = 0;
    for (int32_t s = kc->ram_head; s >= 0; s = kc->ram_next[s]) in_lru++;
    for (int32_t s = 0; s < kc->n_ram; s++) pinned += kc->ram_pinned[s];
    assert(in_lru == kc->n_ram_lru);
    assert(pinned == 0); /* pins never outlive an acquire */
    for (int32_t s = 0; s < kc->n_ram; s++)
        if (kc->ram_node[s] >= 0) assert(ns_prefix_index_node(kc->ix, kc->ram_node[s])->ram == s);
#else
    (void)kc;
#endif
}
