#include "kv/prefix_index.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* Two open-addressing tables: full-node hash -> node id, and parent hash
 * -> first child node id. Keys 0 (empty) and 1 (tombstone) are reserved,
 * which is why ns_prefix_hash never returns them. Both tables are rebuilt
 * (grown if needed) when live + dead slots pass 70%. */
#define TOMB 1ULL

typedef struct slot {
    uint64_t key;
    int32_t val;
} slot;

typedef struct table {
    slot *s;
    size_t cap; /* power of two */
    size_t used; /* live + tombstones */
    size_t live;
} table;

struct ns_prefix_index {
    int32_t P;
    uint64_t seed;
    int32_t max_nodes;
    ns_prefix_node *nodes;
    int32_t *tokens; /* [cap_nodes * P] */
    int32_t n_nodes, cap_nodes;
    int32_t *free_ids;
    int32_t n_free;
    table full;
    table kids;
};

uint64_t ns_prefix_seed(uint64_t fp, int kv_dtype, int32_t page_tokens) {
    uint64_t parts[4] = {fp, (uint64_t)kv_dtype, (uint64_t)page_tokens, 0x6e73707265666978ULL};
    uint64_t h = XXH64(parts, sizeof parts, 0);
    return h <= TOMB ? h + 2 : h;
}

uint64_t ns_prefix_hash(uint64_t parent, const int32_t *tokens, int32_t n) {
    uint64_t h = XXH64(tokens, (size_t)n * sizeof(int32_t), parent);
    return h <= TOMB ? h + 2 : h;
}

static size_t slot_of(size_t cap, uint64_t h) { return (size_t)(h * 0x9E3779B97F4A7C15ULL) & (cap - 1); }

static slot *tab_find(const table *t, uint64_t key) {
    for (size_t i = slot_of(t->cap, key), n = 0; n < t->cap; i = (i + 1) & (t->cap - 1), n++) {
        if (t->s[i].key == 0) return NULL;
        if (t->s[i].key == key) return &t->s[i];
    }
    return NULL;
}

static ns_status tab_rebuild(table *t, size_t want_live) {
    size_t cap = 64;
    while (cap < want_live * 2 + 16) cap <<= 1;
    slot *ns = calloc(cap, sizeof *ns);
    if (!ns) return NS_ERR_NOMEM;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->s[i].key <= TOMB) continue;
        size_t j = slot_of(cap, t->s[i].key);
        while (ns[j].key != 0) j = (j + 1) & (cap - 1);
        ns[j] = t->s[i];
    }
    free(t->s);
    t->s = ns;
    t->cap = cap;
    t->used = t->live;
    return NS_OK;
}

/* Inserts key (must be absent). */
static ns_status tab_insert(table *t, uint64_t key, int32_t val) {
    if ((t->used + 1) * 10 > t->cap * 7) {
        ns_status rc = tab_rebuild(t, t->live + 1);
        if (rc != NS_OK) return rc;
    }
    for (size_t i = slot_of(t->cap, key);; i = (i + 1) & (t->cap - 1)) {
        if (t->s[i].key <= TOMB) {
            if (t->s[i].key == 0) t->used++;
            t->s[i].key = key;
            t->s[i].val = val;
            t->live++;
            return NS_OK;
        }
    }
}

static void tab_erase(table *t, slot *s) {
    s->key = TOMB;
    t->live--;
}

ns_status ns_prefix_index_create(int32_t P, uint64_t seed, int32_t max_nodes, ns_prefix_index **out, ns_error *err) {
    *out = NULL;
    if (P <= 0 || max_nodes <= 0) return ns_fail(err, NS_ERR_INVALID, "prefix index needs a page size and a node cap");
    ns_prefix_index *ix = calloc(1, sizeof *ix);
    if (!ix) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ix->P = P;
    ix->seed = seed;
    ix->max_nodes = max_nodes;
    if (tab_rebuild(&ix->full, 64) != NS_OK || tab_rebuild(&ix->kids, 64) != NS_OK) {
        ns_prefix_index_free(ix);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory for the prefix index");
    }
    *out = ix;
    return NS_OK;
}

void ns_prefix_index_free(ns_prefix_index *ix) {
    if (!ix) return;
    free(ix->nodes);
    free(ix->tokens);
    free(ix->free_ids);
    free(ix->full.s);
    free(ix->kids.s);
    free(ix);
}

uint64_t ns_prefix_index_seed(const ns_prefix_index *ix) { return ix->seed; }
ns_prefix_node *ns_prefix_index_node(ns_prefix_index *ix, int32_t id) { return &ix->nodes[id]; }
const int32_t *ns_prefix_index_tokens(const ns_prefix_index *ix, int32_t id) {
    return ix->tokens + (size_t)id * (size_t)ix->P;
}
int32_t ns_prefix_index_n_nodes(const ns_prefix_index *ix) { return ix->n_nodes - ix->n_free; }

int32_t ns_prefix_index_find(ns_prefix_index *ix, uint64_t h) {
    slot *s = tab_find(&ix->full, h);
    return s ? s->val : -1;
}

int32_t ns_prefix_index_first_child(ns_prefix_index *ix, uint64_t parent) {
    slot *s = tab_find(&ix->kids, parent);
    return s ? s->val : -1;
}

/* Makes room for one more node id; returns the id or -1. */
static int32_t new_id(ns_prefix_index *ix) {
    if (ix->n_free > 0) return ix->free_ids[--ix->n_free];
    if (ix->n_nodes >= ix->max_nodes) return -1;
    if (ix->n_nodes == ix->cap_nodes) {
        int32_t nc = ix->cap_nodes ? ix->cap_nodes * 2 : 256;
        if (nc > ix->max_nodes) nc = ix->max_nodes;
        ns_prefix_node *n = realloc(ix->nodes, (size_t)nc * sizeof *n);
        if (!n) return -1;
        ix->nodes = n;
        int32_t *t = realloc(ix->tokens, (size_t)nc * (size_t)ix->P * sizeof(int32_t));
        if (!t) return -1;
        ix->tokens = t;
        int32_t *f = realloc(ix->free_ids, (size_t)nc * sizeof(int32_t));
        if (!f) return -1;
        ix->free_ids = f;
        ix->cap_nodes = nc;
    }
    return ix->n_nodes++;
}

static void link_child(ns_prefix_index *ix, int32_t id) {
    ns_prefix_node *n = &ix->nodes[id];
    slot *s = tab_find(&ix->kids, n->parent);
    n->prev_sib = -1;
    if (s) {
        n->next_sib = s->val;
        ix->nodes[s->val].prev_sib = id;
        s->val = id;
    } else {
        n->next_sib = -1;
        if (tab_insert(&ix->kids, n->parent, id) != NS_OK) n->prev_sib = -2; /* unlisted: lookups miss it */
    }
}

static void unlink_child(ns_prefix_index *ix, int32_t id) {
    ns_prefix_node *n = &ix->nodes[id];
    if (n->prev_sib == -2) return;
    if (n->prev_sib >= 0) {
        ix->nodes[n->prev_sib].next_sib = n->next_sib;
    } else {
        slot *s = tab_find(&ix->kids, n->parent);
        if (s) {
            if (n->next_sib >= 0) s->val = n->next_sib;
            else tab_erase(&ix->kids, s);
        }
    }
    if (n->next_sib >= 0) ix->nodes[n->next_sib].prev_sib = n->prev_sib;
    n->next_sib = n->prev_sib = -1;
}

int32_t ns_prefix_index_add(ns_prefix_index *ix, uint64_t parent, uint64_t h, const int32_t *tokens, int32_t n_fill,
                            bool *existed) {
    if (existed) *existed = false;
    if (n_fill <= 0 || n_fill > ix->P) return -1;
    const bool full = n_fill == ix->P;
    if (full) {
        int32_t have = ns_prefix_index_find(ix, h);
        if (have >= 0) {
            if (existed) *existed = true;
            return have;
        }
    }
    int32_t id = new_id(ix);
    if (id < 0) return -1;
    ns_prefix_node *n = &ix->nodes[id];
    memset(n, 0, sizeof *n);
    n->h = full ? h : 0;
    n->parent = parent;
    n->n_fill = n_fill;
    n->dev = n->ram = -1;
    memcpy(ix->tokens + (size_t)id * (size_t)ix->P, tokens, (size_t)n_fill * sizeof(int32_t));
    if (full && tab_insert(&ix->full, h, id) != NS_OK) {
        n->n_fill = 0;
        ix->free_ids[ix->n_free++] = id;
        return -1;
    }
    link_child(ix, id);
    return id;
}

void ns_prefix_index_remove(ns_prefix_index *ix, int32_t id) {
    ns_prefix_node *n = &ix->nodes[id];
    if (n->n_fill == 0) return;
    if (n->h) {
        slot *s = tab_find(&ix->full, n->h);
        if (s && s->val == id) tab_erase(&ix->full, s);
    }
    unlink_child(ix, id);
    n->n_fill = 0;
    ix->free_ids[ix->n_free++] = id;
}

void ns_prefix_index_lookup(ns_prefix_index *ix, const int32_t *tokens, int32_t n, int32_t max_tokens,
                            int32_t max_pages, ns_prefix_match *m) {
    const int32_t P = ix->P;
    m->n_full = 0;
    m->partial_node = -1;
    m->n_partial = 0;
    m->diverge_at = -1;
    m->n_diverge_cached = 0;
    if (max_tokens > n) max_tokens = n;
    uint64_t h = ix->seed;
    int32_t pos = 0;
    while (pos + P <= max_tokens && m->n_full < max_pages) {
        uint64_t hn = ns_prefix_hash(h, tokens + pos, P);
        int32_t id = ns_prefix_index_find(ix, hn);
        if (id < 0) break;
        if (memcmp(ns_prefix_index_tokens(ix, id), tokens + pos, (size_t)P * sizeof(int32_t)) != 0)
            break; /* hash collision */
        m->nodes[m->n_full++] = id;
        h = hn;
        pos += P;
    }
    m->last_hash = h;
    /* Among the cached continuations of h (full or partial pages), find
     * the one sharing the most tokens with the rest of the prompt: if it
     * is on the device it seeds a copy-on-write page, and if it disagrees
     * it tells where the prompt diverged from what was cached. */
    int32_t best = 0, best_id = -1, best_len = 0, best_dev = 0, best_dev_id = -1;
    for (int32_t c = ns_prefix_index_first_child(ix, h); c >= 0; c = ix->nodes[c].next_sib) {
        const ns_prefix_node *cn = &ix->nodes[c];
        const int32_t *ct = ns_prefix_index_tokens(ix, c);
        int32_t lcp = 0;
        while (lcp < cn->n_fill && pos + lcp < n && ct[lcp] == tokens[pos + lcp]) lcp++;
        if (lcp > best || best_id < 0) {
            best = lcp;
            best_id = c;
            best_len = cn->n_fill;
        }
        if (cn->dev >= 0 && (lcp > best_dev || best_dev_id < 0)) {
            best_dev = lcp;
            best_dev_id = c;
        }
    }
    if (best_dev_id >= 0) {
        int32_t usable = best_dev;
        if (pos + usable > max_tokens) usable = max_tokens - pos;
        if (usable > 0) {
            m->partial_node = best_dev_id;
            m->n_partial = usable;
        }
    }
    if (best_id >= 0 && best < best_len && pos + best < n) {
        /* the prompt and the cache disagree inside this page */
        m->diverge_at = pos + best;
        const int32_t *ct = ns_prefix_index_tokens(ix, best_id);
        for (int32_t i = best; i < best_len && m->n_diverge_cached < 16; i++)
            m->diverge_cached[m->n_diverge_cached++] = ct[i];
    }
}
