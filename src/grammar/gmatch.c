/* gmatch.c — the shared lazy DFA over pushdown configurations and the
 * token masks it yields (see gmatch.h).
 *
 * Stacks are hash-consed nodes (state, parent): node 0 is the empty stack,
 * reached when the root rule accepts, i.e. the grammar may end. A DFA
 * state ("set") is the sorted list of closed stacks: those whose top NFA
 * state has byte edges (epsilon, call and accept moves already taken),
 * plus node 0 when reachable. */
#include "grammar/gmatch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"

#define T_UNKNOWN (-1)
#define T_DEAD (-2)

struct ns_gmatch {
    ns_grammar *g;
    int32_t set;      /* current DFA state */
    bool done;        /* EOS accepted */
    bool mask_ok;
    uint32_t *mask;   /* [n_words] */
    ns_gmatch *prev, *next; /* the grammar's live matchers (for resets) */
};

struct ns_grammar {
    atomic_int refs;
    pthread_mutex_t mu;
    ns_gnfa nfa;
    const ns_gvocab *v;
    /* stack nodes */
    uint32_t *nd_state, *nd_parent;
    uint16_t *nd_depth;
    uint32_t *nd_mark;
    uint32_t n_nd, cap_nd;
    uint32_t *nd_ht;  /* node ids, 0 = empty slot */
    uint32_t nd_ht_cap;
    uint32_t mark_gen;
    /* sets */
    uint32_t *set_off, *set_len;
    int32_t **set_trans;
    uint32_t **set_mask;
    bool *set_end;
    int16_t *set_prun; /* plain-byte run: see run_len; -1 not known yet */
    int16_t *set_crun; /* the same for whole characters (plain bytes and UTF-8) */
    uint32_t n_set, cap_set;
    uint32_t *items;
    size_t n_items, cap_items;
    uint32_t *set_ht; /* set id + 1, 0 = empty slot */
    uint32_t set_ht_cap;
    int32_t start;    /* the start set (-1: not built yet) */
    /* closure scratch */
    uint32_t *work, *out;
    size_t cap_work, cap_out;
    /* walk scratch: the set at each trie depth */
    int32_t *walk;
    size_t bytes, cap_bytes;
    uint64_t mask_hits, mask_misses, resets;
    ns_gmatch *live;
};

static bool grow_arr(void **p, uint32_t *cap, uint32_t need, size_t elem, size_t *bytes) {
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return false;
    *bytes += (size_t)(nc - *cap) * elem;
    *p = q;
    *cap = nc;
    return true;
}

/* ---- stack nodes ---- */

static ns_status nd_rehash(ns_grammar *g) {
    uint32_t nc = g->nd_ht_cap ? g->nd_ht_cap * 2 : 4096;
    uint32_t *t = calloc(nc, sizeof(uint32_t));
    if (!t) return NS_ERR_NOMEM;
    for (uint32_t id = 1; id < g->n_nd; id++) {
        uint32_t h = (uint32_t)ns_mix64(((uint64_t)g->nd_state[id] << 32) | g->nd_parent[id]) & (nc - 1);
        while (t[h]) h = (h + 1) & (nc - 1);
        t[h] = id;
    }
    g->bytes += (size_t)(nc - g->nd_ht_cap) * sizeof(uint32_t);
    free(g->nd_ht);
    g->nd_ht = t;
    g->nd_ht_cap = nc;
    return NS_OK;
}

/* The node (state, parent); 0 on OOM (never a valid result: node 0 is
 * the empty stack and states are > 0). */
static uint32_t intern(ns_grammar *g, uint32_t state, uint32_t parent) {
    if ((uint64_t)(g->n_nd + 1) * 2 > g->nd_ht_cap && nd_rehash(g) != NS_OK) return 0;
    uint32_t h = (uint32_t)ns_mix64(((uint64_t)state << 32) | parent) & (g->nd_ht_cap - 1);
    for (uint32_t id; (id = g->nd_ht[h]); h = (h + 1) & (g->nd_ht_cap - 1))
        if (g->nd_state[id] == state && g->nd_parent[id] == parent) return id;
    uint32_t need = g->n_nd + 1, c = g->cap_nd;
    size_t b = 0;
    if (!grow_arr((void **)&g->nd_state, &c, need, sizeof(uint32_t), &b)) return 0;
    c = g->cap_nd;
    if (!grow_arr((void **)&g->nd_parent, &c, need, sizeof(uint32_t), &b)) return 0;
    c = g->cap_nd;
    if (!grow_arr((void **)&g->nd_mark, &c, need, sizeof(uint32_t), &b)) return 0;
    c = g->cap_nd;
    if (!grow_arr((void **)&g->nd_depth, &c, need, sizeof(uint16_t), &b)) return 0;
    if (c != g->cap_nd) {
        for (uint32_t i = g->cap_nd; i < c; i++) g->nd_mark[i] = 0;
        g->cap_nd = c;
    }
    g->bytes += b;
    uint32_t id = g->n_nd++;
    g->nd_state[id] = state;
    g->nd_parent[id] = parent;
    g->nd_depth[id] = (uint16_t)(parent ? g->nd_depth[parent] + 1 : 1);
    g->nd_mark[id] = 0;
    g->nd_ht[h] = id;
    return id;
}

static bool push_work(ns_grammar *g, size_t *n, uint32_t x) {
    if (*n == g->cap_work) {
        size_t nc = g->cap_work ? g->cap_work * 2 : 256;
        uint32_t *p = realloc(g->work, nc * sizeof(uint32_t));
        if (!p) return false;
        g->work = p;
        g->cap_work = nc;
    }
    g->work[(*n)++] = x;
    return true;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Closes the stacks in g->work[0..n): g->out gets the sorted closed set.
 * Returns its size, or -1 (NOMEM) / -2 (over NS_GMATCH_MAX_SET). */
static long closure(ns_grammar *g, size_t n) {
    if (++g->mark_gen == 0) {
        memset(g->nd_mark, 0, (size_t)g->cap_nd * sizeof(uint32_t));
        g->mark_gen = 1;
    }
    const uint32_t gen = g->mark_gen;
    bool empty_seen = false;
    size_t n_out = 0;
    while (n > 0) {
        uint32_t x = g->work[--n];
        if (x == 0) {
            empty_seen = true;
            continue;
        }
        if (g->nd_mark[x] == gen) continue;
        g->nd_mark[x] = gen;
        const ns_gstate *st = &g->nfa.st[g->nd_state[x]];
        uint32_t par = g->nd_parent[x];
        if (st->n_edges) {
            if (n_out >= NS_GMATCH_MAX_SET) return -2;
            if (n_out == g->cap_out) {
                size_t nc = g->cap_out ? g->cap_out * 2 : 256;
                uint32_t *p = realloc(g->out, nc * sizeof(uint32_t));
                if (!p) return -1;
                g->out = p;
                g->cap_out = nc;
            }
            g->out[n_out++] = x;
        }
        for (uint32_t i = 0; i < st->n_eps; i++) {
            uint32_t y = intern(g, st->eps[i], par);
            if (!y || !push_work(g, &n, y)) return -1;
        }
        if (g->nd_depth[x] < NS_GMATCH_MAX_DEPTH) {
            for (uint32_t i = 0; i < st->n_calls; i++) {
                uint32_t ret = intern(g, st->calls[i].ret, par);
                uint32_t y = ret ? intern(g, st->calls[i].rule, ret) : 0;
                if (!y || !push_work(g, &n, y)) return -1;
            }
        }
        if (st->accept && !push_work(g, &n, par)) return -1;
    }
    qsort(g->out, n_out, sizeof(uint32_t), cmp_u32);
    if (empty_seen) { /* node 0 sorts first */
        if (n_out == g->cap_out) {
            uint32_t *p = realloc(g->out, (g->cap_out + 16) * sizeof(uint32_t));
            if (!p) return -1;
            g->out = p;
            g->cap_out += 16;
        }
        memmove(g->out + 1, g->out, n_out * sizeof(uint32_t));
        g->out[0] = 0;
        n_out++;
    }
    return (long)n_out;
}

/* ---- sets ---- */

static uint32_t set_hash(const uint32_t *it, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    for (size_t i = 0; i < n; i++) h = ns_mix64(h ^ it[i]) + i;
    return (uint32_t)h;
}

static ns_status set_rehash(ns_grammar *g) {
    uint32_t nc = g->set_ht_cap ? g->set_ht_cap * 2 : 1024;
    uint32_t *t = calloc(nc, sizeof(uint32_t));
    if (!t) return NS_ERR_NOMEM;
    for (uint32_t s = 0; s < g->n_set; s++) {
        uint32_t h = set_hash(g->items + g->set_off[s], g->set_len[s]) & (nc - 1);
        while (t[h]) h = (h + 1) & (nc - 1);
        t[h] = s + 1;
    }
    g->bytes += (size_t)(nc - g->set_ht_cap) * sizeof(uint32_t);
    free(g->set_ht);
    g->set_ht = t;
    g->set_ht_cap = nc;
    return NS_OK;
}

/* The set of g->out[0..n) (sorted); -1 on OOM. */
static int32_t set_intern(ns_grammar *g, size_t n) {
    if ((uint64_t)(g->n_set + 1) * 2 > g->set_ht_cap && set_rehash(g) != NS_OK) return -1;
    uint32_t h = set_hash(g->out, n) & (g->set_ht_cap - 1);
    for (uint32_t e; (e = g->set_ht[h]); h = (h + 1) & (g->set_ht_cap - 1)) {
        uint32_t s = e - 1;
        if (g->set_len[s] == n && !memcmp(g->items + g->set_off[s], g->out, n * sizeof(uint32_t))) return (int32_t)s;
    }
    if (g->n_set >= (uint32_t)INT32_MAX - 1) return -1;
    if (g->n_items + n > g->cap_items) {
        size_t nc = g->cap_items ? g->cap_items : 4096;
        while (nc < g->n_items + n) nc *= 2;
        uint32_t *p = realloc(g->items, nc * sizeof(uint32_t));
        if (!p) return -1;
        g->bytes += (nc - g->cap_items) * sizeof(uint32_t);
        g->items = p;
        g->cap_items = nc;
    }
    uint32_t need = g->n_set + 1;
    size_t b = 0;
    uint32_t c = g->cap_set;
    if (!grow_arr((void **)&g->set_off, &c, need, sizeof(uint32_t), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_len, &c, need, sizeof(uint32_t), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_trans, &c, need, sizeof(int32_t *), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_mask, &c, need, sizeof(uint32_t *), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_end, &c, need, sizeof(bool), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_prun, &c, need, sizeof(int16_t), &b)) return -1;
    c = g->cap_set;
    if (!grow_arr((void **)&g->set_crun, &c, need, sizeof(int16_t), &b)) return -1;
    g->cap_set = c;
    g->bytes += b;
    uint32_t s = g->n_set++;
    g->set_off[s] = (uint32_t)g->n_items;
    g->set_len[s] = (uint32_t)n;
    memcpy(g->items + g->n_items, g->out, n * sizeof(uint32_t));
    g->n_items += n;
    g->set_trans[s] = NULL;
    g->set_mask[s] = NULL;
    g->set_end[s] = n > 0 && g->out[0] == 0;
    g->set_prun[s] = -1;
    g->set_crun[s] = -1;
    g->set_ht[h] = s + 1;
    return (int32_t)s;
}

/* The set reached from s on byte b: a set id, T_DEAD, or -3 (NOMEM) /
 * -4 (set too large). Cached in s's transition row. */
static int32_t step(ns_grammar *g, int32_t s, uint8_t b) {
    int32_t *tr = g->set_trans[s];
    if (tr && tr[b] != T_UNKNOWN) return tr[b];
    if (!tr) {
        tr = malloc(256 * sizeof(int32_t));
        if (!tr) return -3;
        for (int i = 0; i < 256; i++) tr[i] = T_UNKNOWN;
        g->set_trans[s] = tr;
        g->bytes += 256 * sizeof(int32_t);
    }
    size_t n = 0;
    const uint32_t off = g->set_off[s], len = g->set_len[s];
    for (uint32_t i = 0; i < len; i++) {
        uint32_t x = g->items[off + i];
        if (!x) continue;
        const ns_gstate *st = &g->nfa.st[g->nd_state[x]];
        for (uint32_t k = 0; k < st->n_edges; k++) {
            if (b < st->edges[k].lo || b > st->edges[k].hi) continue;
            uint32_t y = intern(g, st->edges[k].to, g->nd_parent[x]);
            if (!y || !push_work(g, &n, y)) return -3;
        }
    }
    int32_t r = T_DEAD;
    if (n > 0) {
        long m = closure(g, n);
        if (m == -1) return -3;
        if (m == -2) return -4;
        if (m > 0) {
            r = set_intern(g, (size_t)m);
            if (r < 0) return -3;
        }
    }
    g->set_trans[s][b] = r; /* set_trans may have moved: index again */
    return r;
}

static ns_status step_error(int32_t r, ns_error *err) {
    if (r == -4)
        return ns_fail(err, NS_ERR_FULL, "grammar: more than %d alternatives open at once", NS_GMATCH_MAX_SET);
    return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
}

static int32_t start_set(ns_grammar *g) {
    if (g->start >= 0) return g->start;
    size_t n = 0;
    uint32_t x = intern(g, g->nfa.root, 0);
    if (!x || !push_work(g, &n, x)) return -3;
    long m = closure(g, n);
    if (m < 0) return m == -2 ? -4 : -3;
    g->start = set_intern(g, (size_t)m);
    return g->start < 0 ? -3 : g->start;
}

/* ---- reset: empties the shared automaton and re-interns live states ---- */

static void free_tables(ns_grammar *g) {
    for (uint32_t s = 0; s < g->n_set; s++) {
        free(g->set_trans[s]);
        free(g->set_mask[s]);
    }
}

static ns_status reset_cache(ns_grammar *g) {
    /* each live matcher's stacks as state lists, bottom first */
    size_t cap = 0, n = 0;
    uint32_t *buf = NULL;
    for (ns_gmatch *m = g->live; m; m = m->next) {
        if (m->set < 0) continue;
        uint32_t off = g->set_off[m->set], len = g->set_len[m->set];
        size_t need = n + 1;
        for (uint32_t i = 0; i < len; i++) need += 1 + (g->items[off + i] ? g->nd_depth[g->items[off + i]] : 0);
        if (need > cap) {
            cap = need * 2;
            uint32_t *p = realloc(buf, cap * sizeof(uint32_t));
            if (!p) {
                free(buf);
                return NS_ERR_NOMEM;
            }
            buf = p;
        }
        buf[n++] = len;
        for (uint32_t i = 0; i < len; i++) {
            uint32_t x = g->items[off + i], d = x ? g->nd_depth[x] : 0;
            buf[n++] = d;
            for (uint32_t k = d; k > 0; k--, x = g->nd_parent[x]) buf[n + k - 1] = g->nd_state[x];
            n += d;
        }
    }
    free_tables(g);
    g->n_set = 0;
    g->n_items = 0;
    g->n_nd = 1;
    memset(g->nd_ht, 0, (size_t)g->nd_ht_cap * sizeof(uint32_t));
    memset(g->set_ht, 0, (size_t)g->set_ht_cap * sizeof(uint32_t));
    g->start = -1;
    g->bytes = 0;
    g->resets++;
    size_t p = 0;
    ns_status rc = NS_OK;
    for (ns_gmatch *m = g->live; m; m = m->next) {
        if (m->set < 0) continue;
        uint32_t len = buf[p++];
        size_t k = 0;
        for (uint32_t i = 0; i < len; i++) {
            uint32_t d = buf[p++], x = 0;
            for (uint32_t j = 0; j < d; j++) {
                x = x || j == 0 ? intern(g, buf[p + j], x) : 0;
                if (!x) rc = NS_ERR_NOMEM;
            }
            p += d;
            if (!push_work(g, &k, x)) rc = NS_ERR_NOMEM;
        }
        if (rc != NS_OK) break;
        /* the stacks were already closed: intern them as they are */
        if (k > g->cap_out) {
            uint32_t *q = realloc(g->out, k * sizeof(uint32_t));
            if (!q) {
                rc = NS_ERR_NOMEM;
                break;
            }
            g->out = q;
            g->cap_out = k;
        }
        memcpy(g->out, g->work, k * sizeof(uint32_t));
        qsort(g->out, k, sizeof(uint32_t), cmp_u32);
        m->set = set_intern(g, k);
        if (m->set < 0) rc = NS_ERR_NOMEM;
    }
    free(buf);
    return rc;
}

static ns_status maybe_reset(ns_grammar *g, ns_error *err) {
    if (g->bytes <= g->cap_bytes) return NS_OK;
    if (reset_cache(g) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory while resetting its cache");
    return NS_OK;
}

/* ---- grammar ---- */

ns_status ns_grammar_new(ns_gnfa *nfa, const ns_gvocab *v, ns_grammar **out, ns_error *err) {
    *out = NULL;
    if (nfa->oom || !nfa->root) return ns_fail(err, NS_ERR_INVALID, "grammar: incomplete automaton");
    ns_grammar *g = calloc(1, sizeof(*g));
    if (!g) return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
    g->walk = malloc(((size_t)v->max_depth + 1) * sizeof(int32_t));
    if (!g->walk) {
        free(g);
        return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
    }
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->mu, NULL);
    g->nfa = *nfa;
    memset(nfa, 0, sizeof(*nfa));
    g->v = v;
    g->n_nd = 1; /* node 0: the empty stack */
    g->start = -1;
    g->cap_bytes = NS_GMATCH_MAX_BYTES;
    *out = g;
    return NS_OK;
}

void ns_grammar_retain(ns_grammar *g) { atomic_fetch_add(&g->refs, 1); }

void ns_grammar_release(ns_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    free_tables(g);
    free(g->nd_state);
    free(g->nd_parent);
    free(g->nd_depth);
    free(g->nd_mark);
    free(g->nd_ht);
    free(g->set_off);
    free(g->set_len);
    free(g->set_trans);
    free(g->set_mask);
    free(g->set_end);
    free(g->set_prun);
    free(g->set_crun);
    free(g->items);
    free(g->set_ht);
    free(g->work);
    free(g->out);
    free(g->walk);
    ns_gnfa_free(&g->nfa);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

const ns_gvocab *ns_grammar_vocab(const ns_grammar *g) { return g->v; }

void ns_grammar_set_memory_cap(ns_grammar *g, size_t bytes) {
    pthread_mutex_lock(&g->mu);
    g->cap_bytes = bytes;
    pthread_mutex_unlock(&g->mu);
}

void ns_grammar_get_stats(ns_grammar *g, ns_grammar_stats *out) {
    pthread_mutex_lock(&g->mu);
    out->stacks = g->n_nd;
    out->sets = g->n_set;
    out->masks = 0;
    for (uint32_t s = 0; s < g->n_set; s++) out->masks += g->set_mask[s] != NULL;
    out->bytes = g->bytes;
    out->mask_hits = g->mask_hits;
    out->mask_misses = g->mask_misses;
    out->resets = g->resets;
    pthread_mutex_unlock(&g->mu);
}

/* ---- masks ---- */

/* step() for checks: the target, or -9 for dead / failure (never a set). */
static int32_t st(ns_grammar *g, int32_t s, int b) {
    if (s < 0) return -9;
    int32_t t = step(g, s, (uint8_t)b);
    return t < 0 ? -9 : t;
}

/* All of step(from, lo..hi) equal want (a live set). */
static bool all_to(ns_grammar *g, int32_t from, int lo, int hi, int32_t want) {
    if (from < 0 || want < 0) return false;
    for (int b = lo; b <= hi; b++)
        if (st(g, from, b) != want) return false;
    return true;
}

/* Plain-byte runs. When every plain string byte takes set s to one and
 * the same live set (s itself inside an unbounded string, the next
 * position inside a length-bounded one), the state after k plain bytes
 * does not depend on which bytes they are. plain_run(s) is how many such
 * uniform steps stay alive from s: PRUN_INF when the chain returns to a
 * set already on it (it never dies), else the count k (0..PRUN_MAX) and
 * *dead says whether the chain then dies on every plain byte (tokens of k
 * plain bytes or fewer are allowed, longer ones not) rather than stops
 * being uniform (unknown: walk). Chains longer than PRUN_MAX count as
 * PRUN_MAX, not dead. Returns -1 on an automaton failure. */
#define PRUN_INF 32767
#define PRUN_MAX 4096
#define PRUN_DEAD 0x4000 /* flag in set_prun: the chain ends dead */

/* The common target of every plain byte from s: a set, T_DEAD when all
 * die, -3 when they differ, < -3 on failure. */
static int32_t plain_next(ns_grammar *g, int32_t s) {
    int32_t t0 = -5;
    for (int b = 0x20; b <= 0x7F; b++) {
        if (!ns_gvocab_plain_byte((uint8_t)b)) continue;
        int32_t t = step(g, s, (uint8_t)b);
        if (t < T_DEAD) return -4;
        if (t0 == -5) t0 = t;
        else if (t != t0) return -3;
    }
    return t0;
}

static int32_t char_next(ns_grammar *g, int32_t s);

/* See "Plain-byte runs" above; chars: the run over whole characters
 * (char_next, set_crun) instead of plain bytes (plain_next, set_prun). */
static int run_len(ns_grammar *g, int32_t s, bool *dead, bool chars) {
    /* the memo array is fetched at each use: steps may grow (move) it */
#define MEMO (chars ? g->set_crun : g->set_prun)
    int16_t known = MEMO[s];
    if (known < 0) {
        /* follow the chain (at most PRUN_MAX steps), then fill it backwards */
        int32_t chain[65];
        int n = 0, val = 0;
        bool ends_dead = false;
        int32_t cur = s;
        for (;;) {
            int16_t k = MEMO[cur];
            if (k >= 0) {
                val = k == PRUN_INF ? PRUN_INF : (k & ~PRUN_DEAD);
                ends_dead = k != PRUN_INF && (k & PRUN_DEAD);
                break;
            }
            int32_t t = chars ? char_next(g, cur) : plain_next(g, cur);
            if (t < -3) {
                for (int j = 0; j < n; j++) MEMO[chain[j]] = -1; /* drop the on-chain marks */
                return -1;
            }
            if (t == -3 || t == T_DEAD) {
                MEMO[cur] = (int16_t)(t == T_DEAD ? PRUN_DEAD : 0);
                val = 0;
                ends_dead = t == T_DEAD;
                break;
            }
            if (t == cur) {
                MEMO[cur] = PRUN_INF;
                val = PRUN_INF;
                break;
            }
            if (n == 64) { /* long chain: memoize in pieces */
                int r = run_len(g, t, dead, chars);
                if (r < 0) {
                    for (int j = 0; j < n; j++) MEMO[chain[j]] = -1;
                    return -1;
                }
                val = r;
                ends_dead = *dead;
                chain[n++] = cur;
                break;
            }
            MEMO[cur] = PRUN_INF; /* on the stack: a cycle back here never dies */
            chain[n++] = cur;
            cur = t;
        }
        for (int j = n - 1; j >= 0; j--) {
            if (val != PRUN_INF) val = val + 1 > PRUN_MAX ? PRUN_MAX : val + 1;
            if (val == PRUN_MAX) ends_dead = false;
            MEMO[chain[j]] = (int16_t)(val == PRUN_INF ? PRUN_INF : (val | (ends_dead ? PRUN_DEAD : 0)));
        }
        known = MEMO[s];
    }
    if (known == PRUN_INF) {
        *dead = false;
        return PRUN_INF;
    }
    *dead = (known & PRUN_DEAD) != 0;
    return known & ~PRUN_DEAD;
}
#undef MEMO

/* Sets the bits of the tokens of node i's subtree no deeper than levels
 * below it (levels 1: node i's own tokens). */
static void allow_subtree(const ns_gvocab *v, uint32_t i, int levels, uint32_t *mask) {
    if (levels >= v->height[i]) {
        for (uint32_t k = v->tok_start[i], e = v->tok_start[v->end[i]]; k < e; k++)
            mask[v->sub_toks[k] >> 5] |= 1u << (v->sub_toks[k] & 31);
        return;
    }
    const uint32_t lim = v->depth[i] + (uint32_t)levels - 1;
    for (uint32_t j = i, e = v->end[i]; j < e;) {
        if (v->depth[j] > lim) {
            j = v->end[j];
            continue;
        }
        for (int32_t k = v->tok[j]; k >= 0; k = v->dup[k]) mask[k >> 5] |= 1u << (k & 31);
        j++;
    }
}

/* The common target of every whole character from s (plain bytes and
 * well-formed UTF-8, through continuation states shared by characters of
 * one shape, every byte range checked exhaustively, RFC 3629 table): a set, T_DEAD
 * when every character dies, -3 otherwise (< -3: failure). */
static int32_t char_next(ns_grammar *g, int32_t s) {
    int32_t t = plain_next(g, s);
    if (t < -3 || t == -3) return t;
    if (t == T_DEAD) {
        for (int b = 0xC2; b <= 0xF4; b++) {
            int32_t r = step(g, s, (uint8_t)b);
            if (r < T_DEAD) return -4;
            if (r != T_DEAD) return -3;
        }
        return T_DEAD;
    }
    int32_t T2 = st(g, s, 0xC2);
    int32_t U = st(g, s, 0xE1), U2 = st(g, U, 0x80);
    int32_t V = st(g, s, 0xF1), V2 = st(g, V, 0x80), V3 = st(g, V2, 0x80);
    bool ok = all_to(g, s, 0xC2, 0xDF, T2) && all_to(g, T2, 0x80, 0xBF, t) && all_to(g, s, 0xE1, 0xEC, U) &&
              all_to(g, s, 0xEE, 0xEF, U) && all_to(g, U, 0x80, 0xBF, U2) && all_to(g, U2, 0x80, 0xBF, t) &&
              all_to(g, st(g, s, 0xE0), 0xA0, 0xBF, U2) && all_to(g, st(g, s, 0xED), 0x80, 0x9F, U2) &&
              all_to(g, s, 0xF1, 0xF3, V) && all_to(g, V, 0x80, 0xBF, V2) && all_to(g, V2, 0x80, 0xBF, V3) &&
              all_to(g, V3, 0x80, 0xBF, t) && all_to(g, st(g, s, 0xF0), 0x90, 0xBF, V2) &&
              all_to(g, st(g, s, 0xF4), 0x80, 0x8F, V2);
    return ok ? t : -3;
}

/* The mask of set s, computed by walking the vocabulary trie. */
static ns_status compute_mask(ns_grammar *g, int32_t s, uint32_t *mask, ns_error *err) {
    const ns_gvocab *v = g->v;
    memset(mask, 0, (size_t)v->n_words * sizeof(uint32_t));
    int32_t *at = g->walk;
    at[0] = s;
    const uint32_t nn = v->n_nodes;
    for (uint32_t i = 0; i < nn;) {
        int32_t from = at[v->depth[i] - 1];
        if (v->plain[i]) { /* a subtree of plain bytes: decided by the run from here */
            bool dead;
            int r = run_len(g, from, &dead, false);
            if (r < 0) return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
            if (r >= v->height[i] || dead) {
                allow_subtree(v, i, r, mask);
                i = v->end[i];
                continue;
            }
        } else if (v->sok[i]) { /* whole characters: enough of a run for the longest token below */
            bool dead;
            int r = run_len(g, from, &dead, true);
            if (r < 0) return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
            if (r >= v->maxch[i]) {
                allow_subtree(v, i, PRUN_INF, mask);
                i = v->end[i];
                continue;
            }
        }
        const int32_t *tr = g->set_trans[from];
        int32_t t = tr ? tr[v->byte[i]] : T_UNKNOWN;
        if (t == T_UNKNOWN) {
            t = step(g, from, v->byte[i]);
            if (t < T_DEAD) return step_error(t, err);
        }
        if (t == T_DEAD) {
            i = v->end[i];
            continue;
        }
        at[v->depth[i]] = t;
        for (int32_t k = v->tok[i]; k >= 0; k = v->dup[k]) mask[k >> 5] |= 1u << (k & 31);
        i++;
    }
    if (g->set_end[s])
        for (int i = 0; i < v->n_eos; i++) mask[v->eos[i] >> 5] |= 1u << (v->eos[i] & 31);
    return NS_OK;
}

/* ---- matcher ---- */

ns_status ns_gmatch_new(ns_grammar *g, ns_gmatch **out, ns_error *err) {
    *out = NULL;
    ns_gmatch *m = calloc(1, sizeof(*m));
    uint32_t *mask = malloc((size_t)g->v->n_words * sizeof(uint32_t));
    if (!m || !mask) {
        free(m);
        free(mask);
        return ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
    }
    m->mask = mask;
    m->g = g;
    ns_grammar_retain(g);
    pthread_mutex_lock(&g->mu);
    int32_t s = start_set(g);
    if (s >= 0) {
        m->set = s;
        m->next = g->live;
        if (g->live) g->live->prev = m;
        g->live = m;
    }
    pthread_mutex_unlock(&g->mu);
    if (s < 0) {
        ns_status rc = step_error(s, err);
        free(m->mask);
        free(m);
        ns_grammar_release(g);
        return rc;
    }
    *out = m;
    return NS_OK;
}

void ns_gmatch_free(ns_gmatch *m) {
    if (!m) return;
    ns_grammar *g = m->g;
    pthread_mutex_lock(&g->mu);
    if (m->prev) m->prev->next = m->next;
    else g->live = m->next;
    if (m->next) m->next->prev = m->prev;
    pthread_mutex_unlock(&g->mu);
    free(m->mask);
    free(m);
    ns_grammar_release(g);
}

ns_grammar *ns_gmatch_grammar(const ns_gmatch *m) { return m->g; }

void ns_gmatch_reset(ns_gmatch *m) {
    pthread_mutex_lock(&m->g->mu);
    int32_t s = start_set(m->g);
    if (s >= 0) m->set = s;
    pthread_mutex_unlock(&m->g->mu);
    m->done = false;
    m->mask_ok = false;
}

ns_status ns_gmatch_fill_mask(ns_gmatch *m, ns_error *err) {
    if (m->mask_ok) return NS_OK;
    ns_grammar *g = m->g;
    const size_t words = (size_t)g->v->n_words;
    if (m->done) { /* nothing may follow the end */
        memset(m->mask, 0, words * sizeof(uint32_t));
        m->mask_ok = true;
        return NS_OK;
    }
    pthread_mutex_lock(&g->mu);
    ns_status rc = maybe_reset(g, err);
    if (rc == NS_OK) {
        const int32_t s = m->set;
        if (g->set_mask[s]) {
            g->mask_hits++;
        } else {
            uint32_t *mask = malloc(words * sizeof(uint32_t));
            if (!mask) rc = ns_fail(err, NS_ERR_NOMEM, "grammar: out of memory");
            else rc = compute_mask(g, s, mask, err);
            if (rc == NS_OK) {
                g->set_mask[s] = mask;
                g->bytes += words * sizeof(uint32_t);
                g->mask_misses++;
            } else {
                free(mask);
            }
        }
        if (rc == NS_OK) memcpy(m->mask, g->set_mask[s], words * sizeof(uint32_t));
    }
    pthread_mutex_unlock(&g->mu);
    m->mask_ok = rc == NS_OK;
    return rc;
}

const uint32_t *ns_gmatch_mask(const ns_gmatch *m) { return m->mask_ok ? m->mask : NULL; }

/* Walks bytes from the current set: the new set, T_DEAD, or < T_DEAD. */
static int32_t walk_bytes(ns_grammar *g, int32_t s, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n && s >= 0; i++) s = step(g, s, b[i]);
    return s;
}

ns_status ns_gmatch_accept(ns_gmatch *m, int32_t token, ns_error *err) {
    ns_grammar *g = m->g;
    const ns_gvocab *v = g->v;
    if (m->done) return ns_fail(err, NS_ERR_INVALID, "grammar: token %d after the end", token);
    if (token < 0 || token >= v->n_vocab) return ns_fail(err, NS_ERR_INVALID, "grammar: token %d out of range", token);
    pthread_mutex_lock(&g->mu);
    ns_status rc = maybe_reset(g, err);
    if (rc != NS_OK) goto out;
    if (ns_gvocab_is_eos(v, token)) {
        if (g->set_end[m->set]) m->done = true;
        else rc = ns_fail(err, NS_ERR_INVALID, "grammar: end of sequence before the grammar is complete");
        goto out;
    }
    if (!v->len[token]) {
        rc = ns_fail(err, NS_ERR_INVALID, "grammar: token %d is never allowed", token);
        goto out;
    }
    int32_t t = walk_bytes(g, m->set, v->bytes + v->off[token], v->len[token]);
    if (t == T_DEAD) rc = ns_fail(err, NS_ERR_INVALID, "grammar: token %d is not allowed here", token);
    else if (t < T_DEAD) rc = step_error(t, err);
    else m->set = t;
out:
    pthread_mutex_unlock(&g->mu);
    if (rc == NS_OK) m->mask_ok = false;
    return rc;
}

bool ns_gmatch_accept_bytes(ns_gmatch *m, const char *bytes, size_t len) {
    if (m->done) return len == 0;
    pthread_mutex_lock(&m->g->mu);
    int32_t t = walk_bytes(m->g, m->set, (const uint8_t *)bytes, len);
    if (t >= 0) m->set = t;
    pthread_mutex_unlock(&m->g->mu);
    if (t >= 0) m->mask_ok = false;
    return t >= 0;
}

bool ns_gmatch_would_accept_bytes(ns_gmatch *m, const char *bytes, size_t len) {
    if (m->done) return len == 0;
    pthread_mutex_lock(&m->g->mu);
    int32_t t = walk_bytes(m->g, m->set, (const uint8_t *)bytes, len);
    pthread_mutex_unlock(&m->g->mu);
    return t >= 0;
}

bool ns_gmatch_can_end(ns_gmatch *m) {
    pthread_mutex_lock(&m->g->mu);
    bool r = m->done || m->g->set_end[m->set];
    pthread_mutex_unlock(&m->g->mu);
    return r;
}

bool ns_gmatch_done(const ns_gmatch *m) { return m->done; }
