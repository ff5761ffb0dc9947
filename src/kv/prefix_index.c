#include "kv/prefix_index.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* Open-addressing hash table of full-page entries keyed by h, plus a
 * per-page record (for eviction and partials). Capacity is fixed at
 * 2x the page count: the index can never hold more entries than pages. */
typedef struct entry {
    uint64_t h;       /* 0 = empty slot; tombstones use TOMB */
    int32_t page;
} entry;

#define TOMB 1ULL

typedef struct page_rec {
    uint8_t kind;      /* 0 none, 1 full, 2 partial */
    uint64_t h;        /* full: own hash */
    uint64_t parent;   /* parent hash (full and partial) */
    int32_t n_fill;    /* partial: tokens held */
    int32_t next_sib;  /* next page with the same parent (children list), -1 end */
    int32_t prev_sib;
} page_rec;

/* children lists: parent hash -> first child page, in a second table */
typedef struct child_head {
    uint64_t parent;
    int32_t first;
} child_head;

struct ns_prefix_index {
    ns_kv_pages *kp;
    int32_t P;
    uint64_t seed;
    entry *tab;
    size_t tab_cap; /* power of two */
    child_head *kids;
    size_t kids_cap;
    page_rec *recs;   /* [n_pages] */
    int32_t *tokens;  /* [n_pages * P] copy of each indexed page's tokens */
};

uint64_t ns_prefix_seed(uint64_t fp, int kv_dtype, int32_t page_tokens) {
    uint64_t parts[4] = {fp, (uint64_t)kv_dtype, (uint64_t)page_tokens, 0x6e73707265666978ULL};
    uint64_t h = XXH64(parts, sizeof parts, 0);
    return h <= TOMB ? h + 2 : h;
}

uint64_t ns_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n) {
    uint64_t h = XXH64(tokens, (size_t)n * sizeof(int32_t), parent);
    return h <= TOMB ? h + 2 : h; /* 0 and 1 are reserved slot markers */
}

static size_t slot_of(size_t cap, uint64_t h) { return (size_t)(h * 0x9E3779B97F4A7C15ULL) & (cap - 1); }

static entry *tab_find(ns_prefix_index *ix, uint64_t h) {
    for (size_t i = slot_of(ix->tab_cap, h), n = 0; n < ix->tab_cap; i = (i + 1) & (ix->tab_cap - 1), n++) {
        if (ix->tab[i].h == 0) return NULL;
        if (ix->tab[i].h == h) return &ix->tab[i];
    }
    return NULL;
}

static void tab_insert(ns_prefix_index *ix, uint64_t h, int32_t page) {
    for (size_t i = slot_of(ix->tab_cap, h);; i = (i + 1) & (ix->tab_cap - 1)) {
        if (ix->tab[i].h == 0 || ix->tab[i].h == TOMB) {
            ix->tab[i].h = h;
            ix->tab[i].page = page;
            return;
        }
    }
}

static child_head *kids_find(ns_prefix_index *ix, uint64_t parent, bool create) {
    child_head *tomb = NULL;
    for (size_t i = slot_of(ix->kids_cap, parent), n = 0; n < ix->kids_cap; i = (i + 1) & (ix->kids_cap - 1), n++) {
        child_head *k = &ix->kids[i];
        if (k->parent == parent) return k;
        if (k->parent == TOMB && !tomb) tomb = k;
        if (k->parent == 0) {
            if (!create) return NULL;
            k = tomb ? tomb : k;
            k->parent = parent;
            k->first = -1;
            return k;
        }
    }
    if (create && tomb) {
        tomb->parent = parent;
        tomb->first = -1;
        return tomb;
    }
    return NULL;
}

static void link_child(ns_prefix_index *ix, uint64_t parent, int32_t page) {
    child_head *k = kids_find(ix, parent, true);
    page_rec *r = &ix->recs[page];
    r->prev_sib = -1;
    r->next_sib = k ? k->first : -1;
    if (k) {
        if (k->first >= 0) ix->recs[k->first].prev_sib = page;
        k->first = page;
    }
}

static void unlink_child(ns_prefix_index *ix, int32_t page) {
    page_rec *r = &ix->recs[page];
    if (r->prev_sib >= 0) {
        ix->recs[r->prev_sib].next_sib = r->next_sib;
    } else {
        child_head *k = kids_find(ix, r->parent, false);
        if (k) {
            k->first = r->next_sib;
            if (k->first < 0) k->parent = TOMB;
        }
    }
    if (r->next_sib >= 0) ix->recs[r->next_sib].prev_sib = r->prev_sib;
    r->next_sib = r->prev_sib = -1;
}

static void drop_page(ns_prefix_index *ix, int32_t page) {
    page_rec *r = &ix->recs[page];
    if (r->kind == 0) return;
    if (r->kind == 1) {
        entry *e = tab_find(ix, r->h);
        if (e && e->page == page) e->h = TOMB;
    }
    unlink_child(ix, page);
    r->kind = 0;
}

static void on_evict(void *ctx, int32_t page) { drop_page(ctx, page); }

ns_status ns_prefix_index_create(ns_kv_pages *kp, int32_t P, uint64_t seed, ns_prefix_index **out, ns_error *err) {
    *out = NULL;
    ns_prefix_index *ix = calloc(1, sizeof *ix);
    if (!ix) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ix->kp = kp;
    ix->P = P;
    ix->seed = seed;
    size_t cap = 16;
    while (cap < (size_t)kp->n_pages * 2) cap <<= 1;
    ix->tab_cap = ix->kids_cap = cap;
    ix->tab = calloc(cap, sizeof *ix->tab);
    ix->kids = calloc(cap, sizeof *ix->kids);
    ix->recs = calloc((size_t)kp->n_pages, sizeof *ix->recs);
    ix->tokens = malloc((size_t)kp->n_pages * (size_t)P * sizeof(int32_t));
    if (!ix->tab || !ix->kids || !ix->recs || !ix->tokens) {
        ns_prefix_index_free(ix);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory for the prefix index");
    }
    for (int32_t i = 0; i < kp->n_pages; i++) ix->recs[i].next_sib = ix->recs[i].prev_sib = -1;
    kp->on_evict = on_evict;
    kp->evict_ctx = ix;
    *out = ix;
    return NS_OK;
}

void ns_prefix_index_free(ns_prefix_index *ix) {
    if (!ix) return;
    if (ix->kp && ix->kp->evict_ctx == ix) {
        ix->kp->on_evict = NULL;
        ix->kp->evict_ctx = NULL;
    }
    free(ix->tab);
    free(ix->kids);
    free(ix->recs);
    free(ix->tokens);
    free(ix);
}

uint64_t ns_prefix_index_seed(const ns_prefix_index *ix) { return ix->seed; }

/* Tombstones accumulate; rebuild when the table gets crowded. */
static void maybe_rehash(ns_prefix_index *ix) {
    size_t used = 0;
    for (size_t i = 0; i < ix->tab_cap; i++) used += ix->tab[i].h != 0;
    if (used * 4 < ix->tab_cap * 3) return;
    memset(ix->tab, 0, ix->tab_cap * sizeof *ix->tab);
    for (int32_t p = 0; p < ix->kp->n_pages; p++)
        if (ix->recs[p].kind == 1) tab_insert(ix, ix->recs[p].h, p);
}

bool ns_prefix_index_commit(ns_prefix_index *ix, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t page) {
    if (tab_find(ix, h)) return false;
    drop_page(ix, page); /* a page reused for new content loses its old entry */
    maybe_rehash(ix);
    tab_insert(ix, h, page);
    page_rec *r = &ix->recs[page];
    r->kind = 1;
    r->h = h;
    r->parent = parent;
    memcpy(ix->tokens + (size_t)page * (size_t)ix->P, tokens, (size_t)ix->P * sizeof(int32_t));
    link_child(ix, parent, page);
    return true;
}

void ns_prefix_index_commit_partial(ns_prefix_index *ix, uint64_t parent, const int32_t *tokens, int32_t n_fill,
                                    int32_t page) {
    if (n_fill <= 0 || n_fill >= ix->P) return;
    drop_page(ix, page);
    page_rec *r = &ix->recs[page];
    r->kind = 2;
    r->h = 0;
    r->parent = parent;
    r->n_fill = n_fill;
    memcpy(ix->tokens + (size_t)page * (size_t)ix->P, tokens, (size_t)n_fill * sizeof(int32_t));
    link_child(ix, parent, page);
}

bool ns_prefix_index_has_page(const ns_prefix_index *ix, int32_t page) { return ix->recs[page].kind != 0; }

void ns_prefix_index_lookup(ns_prefix_index *ix, const int32_t *tokens, int32_t n, int32_t max_tokens,
                            int32_t max_pages, ns_prefix_match *m) {
    const int32_t P = ix->P;
    m->n_full = 0;
    m->partial_page = -1;
    m->n_partial = 0;
    m->diverge_at = -1;
    m->n_diverge_cached = 0;
    if (max_tokens > n) max_tokens = n;
    uint64_t h = ix->seed;
    int32_t pos = 0;
    while (pos + P <= max_tokens && m->n_full < max_pages) {
        uint64_t hn = ns_prefix_hash(h, tokens + pos, P);
        entry *e = tab_find(ix, hn);
        if (!e) break;
        const int32_t *pt = ix->tokens + (size_t)e->page * (size_t)P;
        if (memcmp(pt, tokens + pos, (size_t)P * sizeof(int32_t)) != 0) break; /* hash collision */
        m->pages[m->n_full++] = e->page;
        h = hn;
        pos += P;
    }
    m->last_hash = h;
    /* Among the cached continuations of h (full or partial pages), find
     * the one sharing the most tokens with the rest of the prompt: it
     * seeds a copy-on-write page, and if it disagrees it tells where the
     * prompt diverged from what was cached. */
    child_head *k = kids_find(ix, h, false);
    int32_t best = 0, best_page = -1, best_len = 0;
    for (int32_t c = k ? k->first : -1; c >= 0; c = ix->recs[c].next_sib) {
        const page_rec *r = &ix->recs[c];
        int32_t len = r->kind == 1 ? P : r->n_fill;
        const int32_t *ct = ix->tokens + (size_t)c * (size_t)P;
        int32_t lcp = 0;
        while (lcp < len && pos + lcp < n && ct[lcp] == tokens[pos + lcp]) lcp++;
        if (lcp > best || best_page < 0) {
            best = lcp;
            best_page = c;
            best_len = len;
        }
    }
    if (best_page >= 0) {
        int32_t usable = best;
        if (pos + usable > max_tokens) usable = max_tokens - pos;
        if (usable > 0) {
            m->partial_page = best_page;
            m->n_partial = usable;
        }
        if (best < best_len && pos + best < n) {
            /* the prompt and the cache disagree inside this page */
            m->diverge_at = pos + best;
            const int32_t *ct = ix->tokens + (size_t)best_page * (size_t)P;
            for (int32_t i = best; i < best_len && m->n_diverge_cached < 16; i++)
                m->diverge_cached[m->n_diverge_cached++] = ct[i];
        }
    }
}
