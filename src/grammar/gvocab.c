/* gvocab.c — token bytes and their preorder byte trie (see gvocab.h). */
#include "grammar/gvocab.h"

#include <stdlib.h>
#include <string.h>

static int cmp_tok(const void *a, const void *b, void *ctx) {
    const ns_gvocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void ns_gvocab_free(ns_gvocab *v) {
    if (!v) return;
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->tok);
    free(v->dup);
    free(v->plain);
    free(v->sok);
    free(v->height);
    free(v->maxch);
    free(v->tok_start);
    free(v->sub_toks);
    free(v);
}

bool ns_gvocab_is_eos(const ns_gvocab *v, int32_t tok) {
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == tok) return true;
    return false;
}

/* Whether b[p..n) is plain bytes and well-formed UTF-8 characters other
 * than controls, the last one possibly cut short (RFC 3629 table). */
static bool suffix_ok(const uint8_t *b, uint32_t p, uint32_t n) {
    while (p < n) {
        uint8_t c = b[p];
        if (c < 0x80) {
            if (!ns_gvocab_plain_byte(c)) return false;
            p++;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xBF;
        int more;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) more = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) more = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else return false;
        p++;
        for (int k = 0; k < more && p < n; k++, p++) {
            if (b[p] < lo || b[p] > hi) return false;
            lo = 0x80;
            hi = 0xBF;
        }
    }
    return true;
}

/* plain[], sok[], tok_start[] and sub_toks[] (see gvocab.h); n_tok tokens. */
static ns_status subtree_tables(ns_gvocab *v, int32_t n_tok) {
    const uint32_t nn = v->n_nodes;
    uint32_t *bad = malloc(((size_t)nn + 1) * sizeof(uint32_t)); /* non-plain bytes before node k */
    v->plain = malloc(nn ? nn : 1);
    v->tok_start = malloc(((size_t)nn + 1) * sizeof(uint32_t));
    v->sub_toks = malloc((size_t)(n_tok > 0 ? n_tok : 1) * sizeof(int32_t));
    if (!bad || !v->plain || !v->tok_start || !v->sub_toks) {
        free(bad);
        return NS_ERR_NOMEM;
    }
    bad[0] = 0;
    uint32_t k = 0;
    for (uint32_t i = 0; i < nn; i++) {
        bad[i + 1] = bad[i] + !ns_gvocab_plain_byte(v->byte[i]);
        v->tok_start[i] = k;
        for (int32_t t = v->tok[i]; t >= 0; t = v->dup[t]) v->sub_toks[k++] = t;
    }
    v->tok_start[nn] = k;
    for (uint32_t i = 0; i < nn; i++) v->plain[i] = bad[v->end[i]] == bad[i];
    free(bad);
    /* sok: each token clears the flag of the nodes on its path whose
     * suffix from there is not string-safe */
    v->sok = malloc(nn ? nn : 1);
    if (!v->sok) return NS_ERR_NOMEM;
    memset(v->sok, 1, nn ? nn : 1);
    uint32_t *path = malloc(((size_t)v->max_depth + 1) * sizeof(uint32_t));
    if (!path) return NS_ERR_NOMEM;
    for (uint32_t i = 0; i < nn; i++) {
        path[v->depth[i] - 1] = i;
        for (int32_t t = v->tok[i]; t >= 0; t = v->dup[t]) {
            const uint8_t *b = v->bytes + v->off[t];
            for (uint32_t d = 0; d < v->len[t]; d++)
                if (v->sok[path[d]] && !suffix_ok(b, d, v->len[t])) v->sok[path[d]] = 0;
        }
    }
    free(path);
    /* height: the deepest node below minus this one's depth, plus one */
    v->height = malloc((size_t)(nn ? nn : 1) * sizeof(uint16_t));
    uint32_t *stack = malloc(((size_t)v->max_depth + 1) * sizeof(uint32_t));
    if (!v->height || !stack) {
        free(stack);
        return NS_ERR_NOMEM;
    }
    uint32_t sp = 0;
    for (uint32_t i = 0; i < nn; i++) {
        v->height[i] = 1;
        while (sp > 0 && v->depth[stack[sp - 1]] >= v->depth[i]) sp--;
        /* every open ancestor a at depth d_a now reaches depth[i] */
        for (uint32_t a = sp; a > 0; a--) {
            uint32_t p = stack[a - 1];
            uint16_t h = (uint16_t)(v->depth[i] - v->depth[p] + 1);
            if (v->height[p] >= h) break; /* its ancestors already reach deeper */
            v->height[p] = h;
        }
        stack[sp++] = i;
    }
    /* maxch, bottom-up: a node's own character plus its deepest child's */
    v->maxch = calloc(nn ? nn : 1, sizeof(uint16_t));
    uint32_t *parent = malloc((size_t)(nn ? nn : 1) * sizeof(uint32_t));
    if (!v->maxch || !parent) {
        free(stack);
        free(parent);
        return NS_ERR_NOMEM;
    }
    sp = 0;
    for (uint32_t i = 0; i < nn; i++) {
        while (sp > 0 && v->depth[stack[sp - 1]] >= v->depth[i]) sp--;
        parent[i] = sp > 0 ? stack[sp - 1] : UINT32_MAX;
        stack[sp++] = i;
    }
    for (uint32_t i = nn; i-- > 0;) {
        uint8_t b = v->byte[i];
        uint16_t own = (uint16_t)(v->maxch[i] + (b < 0x80 || b >= 0xC0));
        v->maxch[i] = own;
        if (parent[i] != UINT32_MAX && v->maxch[parent[i]] < own) v->maxch[parent[i]] = own;
    }
    free(parent);
    free(stack);
    return NS_OK;
}

/* The preorder trie from the tokens sorted by bytes: each token adds the
 * nodes past its common prefix with the previous one. */
static ns_status build_trie(ns_gvocab *v, const int32_t *order, int32_t n) {
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += v->len[order[i]];
    if (total > UINT32_MAX - 1) return NS_ERR_RANGE;
    size_t cap = (size_t)total + 1;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof(uint16_t));
    v->end = malloc(cap * sizeof(uint32_t));
    v->tok = malloc(cap * sizeof(int32_t));
    uint32_t *path = malloc((NS_GVOCAB_MAX_TOKEN_BYTES + 1) * sizeof(uint32_t)); /* node at each depth */
    if (!v->byte || !v->depth || !v->end || !v->tok || !path) {
        free(path);
        return NS_ERR_NOMEM;
    }
    uint32_t nn = 0;
    int32_t prev = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = order[i];
        const uint8_t *b = v->bytes + v->off[t];
        uint32_t l = v->len[t], lcp = 0;
        if (prev >= 0) {
            const uint8_t *pb = v->bytes + v->off[prev];
            uint32_t pl = v->len[prev];
            while (lcp < l && lcp < pl && pb[lcp] == b[lcp]) lcp++;
            if (lcp == l && pl == l) { /* same bytes: chain the duplicate */
                int32_t h = v->tok[path[l - 1]];
                while (v->dup[h] >= 0) h = v->dup[h];
                v->dup[h] = t;
                continue;
            }
        }
        for (uint32_t d = lcp; d < l; d++) {
            v->byte[nn] = b[d];
            v->depth[nn] = (uint16_t)(d + 1);
            v->tok[nn] = -1;
            path[d] = nn++;
        }
        v->tok[path[l - 1]] = t;
        if (l > v->max_depth) v->max_depth = (uint16_t)l;
        prev = t;
    }
    /* end[i]: the next node at depth <= depth[i] (a stack of open nodes) */
    uint32_t sp = 0;
    for (uint32_t i = 0; i < nn; i++) {
        while (sp > 0 && v->depth[path[sp - 1]] >= v->depth[i]) v->end[path[--sp]] = i;
        path[sp++] = i;
    }
    while (sp > 0) v->end[path[--sp]] = nn;
    free(path);
    v->n_nodes = nn;
    return subtree_tables(v, n);
}

ns_status ns_gvocab_build(int32_t n_vocab, int32_t n_tokens, const char *const *tok_bytes, const uint32_t *tok_len,
                          const int32_t *eos, int n_eos, ns_gvocab **out, ns_error *err) {
    *out = NULL;
    if (n_vocab <= 0 || n_tokens < 0 || n_tokens > n_vocab || n_eos < 0 || n_eos > NS_GVOCAB_MAX_EOS)
        return ns_fail(err, NS_ERR_INVALID, "grammar vocabulary: bad sizes (%d tokens, %d ids, %d eos)", n_tokens,
                       n_vocab, n_eos);
    ns_gvocab *v = calloc(1, sizeof(*v));
    int32_t *order = NULL;
    ns_status rc = NS_ERR_NOMEM;
    if (!v) goto fail;
    v->n_vocab = n_vocab;
    v->n_words = (uint32_t)(((uint64_t)n_vocab + 31) / 32);
    for (int i = 0; i < n_eos; i++) {
        if (eos[i] < 0 || eos[i] >= n_vocab) {
            rc = ns_fail(err, NS_ERR_INVALID, "grammar vocabulary: eos id %d out of range", eos[i]);
            goto fail;
        }
        v->eos[v->n_eos++] = eos[i];
    }
    v->off = calloc((size_t)n_vocab, sizeof(uint64_t));
    v->len = calloc((size_t)n_vocab, sizeof(uint32_t));
    v->dup = malloc((size_t)n_vocab * sizeof(int32_t));
    order = malloc((size_t)n_vocab * sizeof(int32_t));
    if (!v->off || !v->len || !v->dup || !order) goto fail;
    uint64_t total = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        v->dup[i] = -1;
        uint32_t l = tok_bytes && tok_bytes[i] ? tok_len[i] : 0;
        if (l > NS_GVOCAB_MAX_TOKEN_BYTES || ns_gvocab_is_eos(v, i)) l = 0;
        v->off[i] = total;
        v->len[i] = l;
        total += l;
    }
    for (int32_t i = n_tokens; i < n_vocab; i++) v->dup[i] = -1;
    v->bytes = malloc(total ? (size_t)total : 1);
    if (!v->bytes) goto fail;
    int32_t n_in = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        if (!v->len[i]) continue;
        memcpy(v->bytes + v->off[i], tok_bytes[i], v->len[i]);
        order[n_in++] = i;
    }
    qsort_r(order, (size_t)n_in, sizeof(int32_t), cmp_tok, v);
    rc = build_trie(v, order, n_in);
    if (rc != NS_OK) {
        rc = ns_fail(err, rc, "grammar vocabulary: cannot build the token trie");
        goto fail;
    }
    free(order);
    *out = v;
    return NS_OK;
fail:
    if (rc == NS_ERR_NOMEM) ns_fail(err, rc, "grammar vocabulary: out of memory");
    free(order);
    ns_gvocab_free(v);
    return rc;
}
