#include "tokenizer/bpe.h"

#include "tokenizer/jscan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"
#include "util/vec.h"

/* Vocabularies larger than this are treated as corrupt (ids index arrays). */
#define NS_BPE_MAX_ID (1 << 24)
/* Words longer than this are not memoized (HF caches short words too). */
#define CACHE_MAX_WORD 256
#define CACHE_MAX_SLOTS (1u << 18)
/* Words with at least this many symbols merge through the bucket queue. */
#define BQ_MIN_SYMBOLS 2048

struct ns_bpe {
    char *arena;          /* all piece strings, NUL-terminated */
    const char **piece;   /* id -> string in arena, NULL for unused ids */
    uint32_t *piece_len;
    int32_t n_ids;
    ns_strmap vocab;

    uint64_t *mkey; /* (left << 32 | right), UINT64_MAX = empty slot */
    uint32_t *mrank;
    int32_t *mnew;
    size_t mcap; /* power of two */
    uint32_t n_ranks; /* number of merges (ranks are 0..n_ranks-1) */

    int32_t *char_id; /* codepoint < 0x10000 -> id of that one-char piece, or -1 */
    /* codepoint < 0x10000 -> length in characters of the longest piece that
     * contains it (0: not a known one-char piece, or longer than 65535);
     * only with char_id (see ns_bpe_min_ids) */
    uint16_t *char_maxlen;
    int32_t byte_id[256];
    int32_t unk_id;   /* -1 if the unk token is not in the vocabulary */
    bool has_unk;     /* an unk_token is configured */
    char *unk_name;
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* NULL = none */
    size_t prefix_len, suffix_len;
};

void ns_bpe_free(ns_bpe *b) {
    if (!b) return;
    free(b->arena);
    free(b->piece);
    free(b->piece_len);
    ns_strmap_free(&b->vocab);
    free(b->mkey);
    free(b->mrank);
    free(b->mnew);
    free(b->char_id);
    free(b->char_maxlen);
    free(b->unk_name);
    free(b->prefix);
    free(b->suffix);
    free(b);
}

int32_t ns_bpe_n_ids(const ns_bpe *b) { return b->n_ids; }

const char *ns_bpe_piece(const ns_bpe *b, int32_t id, size_t *len) {
    if (id < 0 || id >= b->n_ids || !b->piece[id]) return NULL;
    if (len) *len = b->piece_len[id];
    return b->piece[id];
}

int32_t ns_bpe_id(const ns_bpe *b, const char *s, size_t n) { return ns_strmap_get(&b->vocab, s, n); }

static inline bool merge_get(const ns_bpe *b, int32_t l, int32_t r, uint32_t *rank, int32_t *nid) {
    if (!b->mcap) return false;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t j = (size_t)ns_mix64(key) & (b->mcap - 1);
    for (;;) {
        uint64_t k = b->mkey[j];
        if (k == key) {
            *rank = b->mrank[j];
            *nid = b->mnew[j];
            return true;
        }
        if (k == UINT64_MAX) return false;
        j = (j + 1) & (b->mcap - 1);
    }
}

/* Later duplicates overwrite earlier ones, like HF's HashMap collect. */
static void merge_put(ns_bpe *b, int32_t l, int32_t r, uint32_t rank, int32_t nid) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    size_t j = (size_t)ns_mix64(key) & (b->mcap - 1);
    while (b->mkey[j] != UINT64_MAX && b->mkey[j] != key) j = (j + 1) & (b->mcap - 1);
    b->mkey[j] = key;
    b->mrank[j] = rank;
    b->mnew[j] = nid;
}

static char *dup_opt_string(const json_t *j, size_t *len, bool *oom) {
    if (!json_is_string(j)) return NULL;
    size_t n = json_string_length(j);
    char *p = malloc(n + 1);
    if (!p) {
        *oom = true;
        return NULL;
    }
    memcpy(p, json_string_value(j), n + 1);
    *len = n;
    return p;
}

typedef struct ventry {
    size_t off;
    uint32_t len;
    int32_t id;
} ventry;

/* Reads the vocab object text {"piece": id, ...} into the arena and maps. */
static ns_status load_vocab(ns_bpe *b, const char *txt, size_t n, const char *where, ns_error *err) {
    ns_jscan j = {txt, n, 0};
    ns_buf arena, key;
    ns_buf_init(&arena, 0);
    ns_buf_init(&key, 0);
    ventry *ent = NULL;
    size_t cnt = 0, cap = 0;
    int64_t max_id = -1;
    ns_status st = NS_OK;
    if (!ns_jscan_eat(&j, '{')) {
        st = ns_fail(err, NS_ERR_FORMAT, "%s: model.vocab must be an object", where);
        goto done;
    }
    if (!ns_jscan_eat(&j, '}')) {
        for (;;) {
            double d;
            ns_status s1 = ns_jscan_string(&j, &key);
            if (s1 == NS_OK && !ns_jscan_eat(&j, ':')) s1 = NS_ERR_FORMAT;
            if (s1 == NS_OK) s1 = ns_jscan_number(&j, &d);
            if (s1 != NS_OK) {
                st = ns_fail(err, s1, "%s: model.vocab: %s at entry %zu", where,
                             s1 == NS_ERR_NOMEM ? "out of memory" : "malformed JSON", cnt);
                goto done;
            }
            if (!(d >= 0 && d < NS_BPE_MAX_ID) || d != (double)(int32_t)d) {
                st = ns_fail(err, NS_ERR_FORMAT, "%s: model.vocab[\"%.64s\"] is not an id in [0, %d)", where,
                             key.data, NS_BPE_MAX_ID);
                goto done;
            }
            if (NS_VEC_GROW(ent, cap, cnt + 1, 0) != NS_OK) {
                st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for the vocabulary", where);
                goto done;
            }
            if (key.len > UINT32_MAX) {
                st = ns_fail(err, NS_ERR_RANGE, "%s: vocab piece too long", where);
                goto done;
            }
            ent[cnt++] = (ventry){arena.len, (uint32_t)key.len, (int32_t)d};
            if ((int64_t)d > max_id) max_id = (int64_t)d;
            if (ns_buf_append(&arena, key.data, key.len + 1) != NS_OK) { /* with its NUL */
                st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for the vocabulary", where);
                goto done;
            }
            if (ns_jscan_eat(&j, ',')) continue;
            if (ns_jscan_eat(&j, '}')) break;
            st = ns_fail(err, NS_ERR_FORMAT, "%s: model.vocab: malformed JSON after entry %zu", where, cnt);
            goto done;
        }
    }
    b->n_ids = (int32_t)(max_id + 1);
    b->piece = calloc((size_t)b->n_ids + 1, sizeof *b->piece);
    b->piece_len = calloc((size_t)b->n_ids + 1, sizeof *b->piece_len);
    if (!b->piece || !b->piece_len || ns_strmap_init(&b->vocab, cnt) != NS_OK) {
        st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for the vocabulary", where);
        goto done;
    }
    b->arena = ns_buf_take(&arena, NULL);
    if (!b->arena) {
        st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for the vocabulary", where);
        goto done;
    }
    for (size_t i = 0; i < cnt; i++) {
        const char *p = b->arena + ent[i].off;
        b->piece[ent[i].id] = p;
        b->piece_len[ent[i].id] = ent[i].len;
        if (ns_strmap_put(&b->vocab, p, ent[i].len, ent[i].id) != NS_OK) {
            st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for the vocabulary", where);
            goto done;
        }
    }
done:
    free(ent);
    ns_buf_free(&arena);
    ns_buf_free(&key);
    return st;
}

/* Reads the merges array text (["a b", ...] or [["a", "b"], ...]). */
static ns_status load_merges(ns_bpe *b, const char *txt, size_t n, const char *where, ns_error *err) {
    ns_jscan j = {txt, n, 0};
    if (n == 0) return NS_OK;
    ns_jscan_ws(&j);
    if (n - j.i >= 4 && !memcmp(txt + j.i, "null", 4)) return NS_OK;
    if (!ns_jscan_eat(&j, '[')) return ns_fail(err, NS_ERR_FORMAT, "%s: model.merges must be an array", where);
    /* Size the table from a cheap upper bound: one merge per comma, plus one. */
    size_t est = 1;
    for (size_t i = j.i; i < n; i++) est += txt[i] == ',';
    if (est > UINT32_MAX / 4) return ns_fail(err, NS_ERR_RANGE, "%s: too many merges", where);
    size_t cap = 16;
    while (cap < est * 2 + 2) cap *= 2;
    b->mkey = malloc(cap * sizeof *b->mkey);
    b->mrank = malloc(cap * sizeof *b->mrank);
    b->mnew = malloc(cap * sizeof *b->mnew);
    if (!b->mkey || !b->mrank || !b->mnew) return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory for merges", where);
    memset(b->mkey, 0xFF, cap * sizeof *b->mkey);
    b->mcap = cap;
    ns_buf sa, sc, cat;
    ns_buf_init(&sa, 0);
    ns_buf_init(&sc, 0);
    ns_buf_init(&cat, 0);
    ns_status st = NS_OK;
    if (ns_jscan_eat(&j, ']')) goto done;
    for (size_t i = 0;; i++) {
        const char *a, *c;
        size_t al, cl;
        ns_status s1;
        uint32_t rank = (uint32_t)i;
        if (ns_jscan_eat(&j, '[')) {
            s1 = ns_jscan_string(&j, &sa);
            if (s1 == NS_OK && !ns_jscan_eat(&j, ',')) s1 = NS_ERR_FORMAT;
            if (s1 == NS_OK) s1 = ns_jscan_string(&j, &sc);
            /* ["a", "b", rank]: an explicit rank, which several merges may
             * share (then the leftmost pair merges first). Only the GGUF
             * SentencePiece converter (tok_gguf.c) writes it: SentencePiece
             * merges by piece score, and equal scores tie by position. */
            if (s1 == NS_OK && ns_jscan_eat(&j, ',')) {
                double r = -1;
                s1 = ns_jscan_number(&j, &r);
                if (s1 == NS_OK && !(r >= 0 && r < (double)est && r == (double)(uint32_t)r)) s1 = NS_ERR_FORMAT;
                if (s1 == NS_OK) rank = (uint32_t)r;
            }
            if (s1 == NS_OK && !ns_jscan_eat(&j, ']')) s1 = NS_ERR_FORMAT;
            if (s1 != NS_OK) {
                st = ns_fail(err, s1, "%s: merge %zu must be a string or a pair of strings", where, i);
                goto done;
            }
            a = sa.data, al = sa.len, c = sc.data, cl = sc.len;
        } else {
            if ((s1 = ns_jscan_string(&j, &sa)) != NS_OK) {
                st = ns_fail(err, s1, "%s: merge %zu must be a string or a pair of strings", where, i);
                goto done;
            }
            /* "a b": exactly one space, as tokenizers requires. */
            a = sa.data;
            const char *sp = NULL;
            int spaces = 0;
            for (size_t k = 0; k < sa.len; k++)
                if (a[k] == ' ' && !spaces++) sp = a + k;
            if (spaces != 1) {
                st = ns_fail(err, NS_ERR_FORMAT, "%s: merge %zu \"%.64s\" is not two pieces separated by a space",
                             where, i, a);
                goto done;
            }
            al = (size_t)(sp - a);
            c = sp + 1;
            cl = sa.len - al - 1;
        }
        int32_t ida = ns_strmap_get(&b->vocab, a, al), idc = ns_strmap_get(&b->vocab, c, cl);
        /* The merged piece drops the right side's continuing-subword prefix. */
        size_t skip = b->prefix && cl >= b->prefix_len ? b->prefix_len : 0;
        ns_buf_reset(&cat);
        if (ns_buf_append(&cat, a, al) != NS_OK || ns_buf_append(&cat, c + skip, cl - skip) != NS_OK) {
            st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
            goto done;
        }
        int32_t idn = ns_strmap_get(&b->vocab, cat.data, cat.len);
        if (ida < 0 || idc < 0 || idn < 0) {
            st = ns_fail(err, NS_ERR_FORMAT, "%s: merge %zu (\"%.*s\" + \"%.*s\") uses a piece missing from the vocab",
                         where, i, (int)(al > 64 ? 64 : al), a, (int)(cl > 64 ? 64 : cl), c);
            goto done;
        }
        merge_put(b, ida, idc, rank, idn);
        if (rank + 1 > b->n_ranks) b->n_ranks = rank + 1;
        if (ns_jscan_eat(&j, ',')) continue;
        if (ns_jscan_eat(&j, ']')) break;
        st = ns_fail(err, NS_ERR_FORMAT, "%s: model.merges: malformed JSON after merge %zu", where, i);
        goto done;
    }
done:
    ns_buf_free(&sa);
    ns_buf_free(&sc);
    ns_buf_free(&cat);
    return st;
}

/* char_maxlen: for every piece, its length in characters raises the entry
 * of each character it contains. A merged piece is the concatenation of
 * the pieces it merges (load_merges), so a token made of k initial
 * symbols is a piece of >= k characters, each character of the word
 * giving at most one symbol of its own. */
static ns_status build_char_maxlen(ns_bpe *b, ns_error *err, const char *where) {
    b->char_maxlen = calloc(0x10000, sizeof *b->char_maxlen);
    if (!b->char_maxlen) return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
    uint8_t *too_long = calloc(0x10000 / 8, 1);
    if (!too_long) return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
    for (int32_t id = 0; id < b->n_ids; id++) {
        const char *p = b->piece[id];
        if (!p) continue;
        const size_t n = b->piece_len[id], chars = ns_utf8_count(p, n);
        for (size_t i = 0; i < n;) {
            uint32_t cp = ns_utf8_next(p, n, &i);
            if (cp >= 0x10000) continue;
            if (chars > UINT16_MAX) too_long[cp >> 3] |= (uint8_t)(1u << (cp & 7));
            else if (chars > b->char_maxlen[cp]) b->char_maxlen[cp] = (uint16_t)chars;
        }
    }
    for (uint32_t cp = 0; cp < 0x10000; cp++)
        if (b->char_id[cp] < 0 || (too_long[cp >> 3] & (1u << (cp & 7)))) b->char_maxlen[cp] = 0;
    free(too_long);
    return NS_OK;
}

double ns_bpe_char_weight(const ns_bpe *b, uint32_t cp) {
    if (!b->char_maxlen || cp >= 0x10000 || !b->char_maxlen[cp]) return 0.0;
    return 1.0 / b->char_maxlen[cp];
}

double ns_bpe_min_ids(const ns_bpe *b, const char *w, size_t n) {
    if (!b->char_maxlen) return 0.0;
    double sum = 0.0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = ns_utf8_next(w, n, &i);
        if (cp < 0x10000 && b->char_maxlen[cp]) sum += 1.0 / b->char_maxlen[cp];
    }
    return sum;
}

ns_status ns_bpe_create(const json_t *model, const char *vocab, size_t vocab_len, const char *merges,
                        size_t merges_len, const char *where, ns_bpe **out, ns_error *err) {
    *out = NULL;
    ns_bpe *b = calloc(1, sizeof *b);
    if (!b) return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
    ns_status st;
    bool oom = false;
    const json_t *drop = json_object_get(model, "dropout");
    if (json_is_number(drop) && json_number_value(drop) > 0.0) {
        st = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: BPE dropout %g is not supported (training-time only)", where,
                     json_number_value(drop));
        goto fail;
    }
    b->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    b->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    b->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    b->prefix = dup_opt_string(json_object_get(model, "continuing_subword_prefix"), &b->prefix_len, &oom);
    b->suffix = dup_opt_string(json_object_get(model, "end_of_word_suffix"), &b->suffix_len, &oom);
    size_t unk_len = 0;
    b->unk_name = dup_opt_string(json_object_get(model, "unk_token"), &unk_len, &oom);
    if (oom) {
        st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
        goto fail;
    }
    /* An empty prefix/suffix changes nothing; treat it as absent. */
    if (b->prefix && !b->prefix_len) free(b->prefix), b->prefix = NULL;
    if (b->suffix && !b->suffix_len) free(b->suffix), b->suffix = NULL;

    if ((st = load_vocab(b, vocab, vocab_len, where, err)) != NS_OK) goto fail;
    if ((st = load_merges(b, merges, merges_len, where, err)) != NS_OK) goto fail;

    b->has_unk = b->unk_name != NULL;
    b->unk_id = b->unk_name ? ns_strmap_get(&b->vocab, b->unk_name, unk_len) : -1;
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = ns_strmap_get(&b->vocab, name, 6);
    }
    if (!b->prefix && !b->suffix) {
        b->char_id = malloc(0x10000 * sizeof *b->char_id);
        if (!b->char_id) {
            st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", where);
            goto fail;
        }
        memset(b->char_id, 0xFF, 0x10000 * sizeof *b->char_id);
        for (int32_t id = 0; id < b->n_ids; id++) {
            const char *p = b->piece[id];
            if (!p || !b->piece_len[id] || ns_utf8_len((unsigned char)p[0]) != b->piece_len[id]) continue;
            uint32_t cp;
            ns_utf8_decode(p, b->piece_len[id], 0, &cp);
            /* The map may hold a different id for this string (duplicate
             * ids); the map is authoritative, as lookups elsewhere use it. */
            if (cp < 0x10000) b->char_id[cp] = ns_strmap_get(&b->vocab, p, b->piece_len[id]);
        }
        if ((st = build_char_maxlen(b, err, where)) != NS_OK) goto fail;
    }
    *out = b;
    return NS_OK;
fail:
    ns_bpe_free(b);
    return st;
}

/* ---- encoding ---- */

typedef struct sym {
    int32_t id;
    int32_t prev, next;
    int32_t alive;
} sym;

typedef struct hent {
    uint32_t rank;
    uint32_t pos;
    int32_t nid;
} hent;

static inline bool hless(const hent *a, const hent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

/* A 4-ary min-heap: shallower than a binary heap, which matters for words of
 * hundreds of thousands of symbols (SentencePiece models without a
 * pre-tokenizer split hand the whole text to BPE as one word). */
static void heap_push(hent *h, size_t *n, hent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!hless(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static hent heap_pop(hent *h, size_t *n) {
    hent top = h[0];
    hent last = h[--(*n)];
    size_t i = 0, cnt = *n;
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= cnt) break;
        size_t best = c, end = c + 4 < cnt ? c + 4 : cnt;
        for (size_t k = c + 1; k < end; k++)
            if (hless(&h[k], &h[best])) best = k;
        if (!hless(&h[best], &last)) break;
        h[i] = h[best];
        i = best;
    }
    if (cnt) h[i] = last;
    return top;
}

/* Word cache: open addressing over (hash, key bytes) -> ids slice. */
typedef struct cslot {
    uint64_t hash;
    uint32_t key_off, key_len;
    uint32_t ids_off, ids_n;
    int used;
} cslot;

typedef struct wcache {
    cslot *slot;
    size_t cap, n;
    ns_buf keys;
    ns_ids ids;
} wcache;

static void wcache_free(wcache *c) {
    if (!c) return;
    free(c->slot);
    ns_buf_free(&c->keys);
    ns_ids_free(&c->ids);
    free(c);
}

/* ---- bucket queue for very long words ----
 * Pops entries in exactly the heap's (rank, pos) order, but keeps one small
 * pos-ordered heap per rank plus a heap of the ranks that have entries. The
 * single big heap thrashes the cache when a word has ~10^6 symbols; buckets
 * stay small, and initial entries arrive in increasing pos (O(1) pushes). */
typedef struct bq_ent {
    uint32_t pos;
    int32_t nid;
} bq_ent;

typedef struct bucket {
    bq_ent *v;
    size_t cap;
    uint32_t n;
    uint32_t rank;
} bucket;

typedef struct bqueue {
    int32_t *bidx; /* rank -> index in bk, or -1 */
    size_t bidx_n;
    bucket *bk;
    size_t nbk, capbk; /* buckets in use / allocated (their arrays are reused) */
    uint32_t *rh;      /* min-heap of ranks with a non-empty bucket */
    size_t rh_n, rh_cap;
} bqueue;

static void bqueue_free(bqueue *q) {
    if (!q) return;
    for (size_t i = 0; i < q->capbk; i++) free(q->bk[i].v);
    free(q->bk);
    free(q->bidx);
    free(q->rh);
    free(q);
}

static ns_status bq_prepare(bqueue *q, uint32_t n_ranks) {
    if (q->bidx_n < n_ranks) {
        int32_t *v = realloc(q->bidx, n_ranks * sizeof *v);
        if (!v) return NS_ERR_NOMEM;
        memset(v + q->bidx_n, 0xFF, (n_ranks - q->bidx_n) * sizeof *v);
        q->bidx = v;
        q->bidx_n = n_ranks;
    }
    return NS_OK;
}

/* Forgets all entries (keeps the memory). */
static void bq_clear(bqueue *q) {
    for (size_t i = 0; i < q->nbk; i++) q->bidx[q->bk[i].rank] = -1;
    q->nbk = 0;
    q->rh_n = 0;
}

static ns_status bq_push(bqueue *q, uint32_t rank, uint32_t pos, int32_t nid) {
    int32_t bi = q->bidx[rank];
    if (bi < 0) {
        size_t old = q->capbk;
        if (NS_VEC_GROW(q->bk, q->capbk, q->nbk + 1, 0) != NS_OK) return NS_ERR_NOMEM;
        if (q->capbk > old) memset(q->bk + old, 0, (q->capbk - old) * sizeof *q->bk);
        bi = (int32_t)q->nbk++;
        q->bk[bi].n = 0;
        q->bk[bi].rank = rank;
        q->bidx[rank] = bi;
    }
    bucket *b = &q->bk[bi];
    if (b->n == 0) { /* the rank becomes active */
        if (NS_VEC_GROW(q->rh, q->rh_cap, q->rh_n + 1, 0) != NS_OK) return NS_ERR_NOMEM;
        size_t i = q->rh_n++;
        while (i > 0 && q->rh[(i - 1) / 2] > rank) {
            q->rh[i] = q->rh[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        q->rh[i] = rank;
    }
    if (NS_VEC_GROW(b->v, b->cap, (size_t)b->n + 1, UINT32_MAX) != NS_OK) return NS_ERR_NOMEM;
    uint32_t i = b->n++;
    while (i > 0 && b->v[(i - 1) / 2].pos > pos) {
        b->v[i] = b->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->v[i] = (bq_ent){pos, nid};
    return NS_OK;
}

/* Pops the entry with the smallest (rank, pos); false when empty. */
static bool bq_pop(bqueue *q, hent *out) {
    if (!q->rh_n) return false;
    uint32_t rank = q->rh[0];
    bucket *b = &q->bk[q->bidx[rank]];
    *out = (hent){rank, b->v[0].pos, b->v[0].nid};
    bq_ent last = b->v[--b->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= b->n) break;
        if (c + 1 < b->n && b->v[c + 1].pos < b->v[c].pos) c++;
        if (b->v[c].pos >= last.pos) break;
        b->v[i] = b->v[c];
        i = c;
    }
    if (b->n) b->v[i] = last;
    if (b->n == 0) { /* the rank is exhausted: pop it from the rank heap */
        uint32_t lr = q->rh[--q->rh_n];
        size_t k = 0;
        for (;;) {
            size_t c = 2 * k + 1;
            if (c >= q->rh_n) break;
            if (c + 1 < q->rh_n && q->rh[c + 1] < q->rh[c]) c++;
            if (q->rh[c] >= lr) break;
            q->rh[k] = q->rh[c];
            k = c;
        }
        if (q->rh_n) q->rh[k] = lr;
    }
    return true;
}

void ns_bpe_scratch_free(ns_bpe_scratch *s) {
    bqueue_free(s->bq);
    free(s->syms);
    free(s->heap);
    wcache_free(s->cache);
    ns_buf_free(&s->tmp);
    memset(s, 0, sizeof *s);
}

static const cslot *wcache_get(const wcache *c, const char *w, size_t n, uint64_t h) {
    size_t j = (size_t)h & (c->cap - 1);
    while (c->slot[j].used) {
        const cslot *e = &c->slot[j];
        if (e->hash == h && e->key_len == n && memcmp(c->keys.data + e->key_off, w, n) == 0) return e;
        j = (j + 1) & (c->cap - 1);
    }
    return NULL;
}

/* Best effort: a full or failing cache is simply not extended. */
static void wcache_put(wcache *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t k) {
    if ((c->n + 1) * 2 > c->cap) {
        if (c->cap >= CACHE_MAX_SLOTS) return;
        size_t nc = c->cap * 2;
        cslot *ns = calloc(nc, sizeof *ns);
        if (!ns) return;
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->slot[i].used) continue;
            size_t j = (size_t)c->slot[i].hash & (nc - 1);
            while (ns[j].used) j = (j + 1) & (nc - 1);
            ns[j] = c->slot[i];
        }
        free(c->slot);
        c->slot = ns;
        c->cap = nc;
    }
    if (c->keys.len > UINT32_MAX - n || c->ids.n > UINT32_MAX - k) return;
    size_t koff = c->keys.len, ioff = c->ids.n;
    if (ns_buf_append(&c->keys, w, n) != NS_OK) return;
    if (ns_ids_append(&c->ids, ids, k) != NS_OK) return;
    size_t j = (size_t)h & (c->cap - 1);
    while (c->slot[j].used) j = (j + 1) & (c->cap - 1);
    c->slot[j] = (cslot){h, (uint32_t)koff, (uint32_t)n, (uint32_t)ioff, (uint32_t)k, 1};
    c->n++;
}

/* Looks up the symbol for one character (with prefix/suffix decoration). */
static int32_t char_symbol(const ns_bpe *b, ns_bpe_scratch *s, const char *c, size_t cl, bool first, bool last,
                           const char **str, size_t *str_len) {
    *str = c;
    *str_len = cl;
    if (b->char_id && cl <= 3) {
        uint32_t cp;
        ns_utf8_decode(c, cl, 0, &cp);
        return b->char_id[cp];
    }
    if (!b->prefix && !b->suffix) return ns_strmap_get(&b->vocab, c, cl);
    ns_buf_reset(&s->tmp);
    if (b->prefix && !first && ns_buf_append(&s->tmp, b->prefix, b->prefix_len) != NS_OK) return -2;
    if (ns_buf_append(&s->tmp, c, cl) != NS_OK) return -2;
    if (b->suffix && last && ns_buf_append(&s->tmp, b->suffix, b->suffix_len) != NS_OK) return -2;
    *str = s->tmp.data;
    *str_len = s->tmp.len;
    return ns_strmap_get(&b->vocab, s->tmp.data, s->tmp.len);
}

ns_status ns_bpe_word(const ns_bpe *b, ns_bpe_scratch *s, const char *w, size_t n, ns_ids *out, ns_error *err) {
    if (n == 0) return NS_OK;
    if (b->ignore_merges) {
        int32_t id = ns_strmap_get(&b->vocab, w, n);
        if (id >= 0) return ns_ids_push(out, id) == NS_OK ? NS_OK : ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    uint64_t h = 0;
    wcache *cache = s->cache;
    if (n <= CACHE_MAX_WORD) {
        if (!cache) {
            cache = calloc(1, sizeof *cache);
            if (cache && !(cache->slot = calloc(4096, sizeof *cache->slot))) {
                free(cache);
                cache = NULL;
            }
            if (cache) {
                cache->cap = 4096;
                ns_buf_init(&cache->keys, 0);
            }
            s->cache = cache;
        }
        if (cache) {
            h = ns_strhash(w, n);
            const cslot *e = wcache_get(cache, w, n, h);
            if (e)
                return ns_ids_append(out, cache->ids.v + e->ids_off, e->ids_n) == NS_OK
                           ? NS_OK
                           : ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
    }

    /* 1. Characters -> symbols. */
    if (ns_vec_grow(&s->syms, &s->syms_cap, n + 1, sizeof(sym), 0) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    sym *sy = s->syms;
    size_t ns = 0;
    int32_t pending_unk = -1; /* unk symbol not yet added (fuse_unk) */
    for (size_t i = 0; i < n;) {
        size_t cl = ns_utf8_len((unsigned char)w[i]);
        if (cl > n - i) cl = n - i;
        const char *str;
        size_t str_len;
        int32_t id = char_symbol(b, s, w + i, cl, i == 0, i + cl == n, &str, &str_len);
        if (id == -2) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        i += cl;
        if (id >= 0) {
            if (pending_unk >= 0) sy[ns++].id = pending_unk, pending_unk = -1;
            sy[ns++].id = id;
            continue;
        }
        if (b->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < str_len && all; k++) all = b->byte_id[(unsigned char)str[k]] >= 0;
            if (all) {
                /* Byte symbols go straight in; a pending unk stays pending. */
                if (ns_vec_grow(&s->syms, &s->syms_cap, ns + str_len + (n - i) + 2, sizeof(sym), 0) != NS_OK)
                    return ns_fail(err, NS_ERR_NOMEM, "out of memory");
                sy = s->syms;
                for (size_t k = 0; k < str_len; k++) sy[ns++].id = b->byte_id[(unsigned char)str[k]];
                continue;
            }
        }
        if (b->has_unk) {
            if (b->unk_id < 0)
                return ns_fail(err, NS_ERR_FORMAT, "unk token \"%s\" is not in the vocabulary", b->unk_name);
            if (pending_unk >= 0 && !b->fuse_unk) sy[ns++].id = pending_unk;
            pending_unk = b->unk_id;
        }
        /* No unk token: the character is dropped, as in tokenizers. */
    }
    if (pending_unk >= 0) sy[ns++].id = pending_unk;

    /* 2. Merge lowest-rank pairs (see Word::merge_all). */
    size_t first_out = out->n;
    if (ns >= 2 && b->mcap) {
        for (size_t k = 0; k < ns; k++) {
            sy[k].prev = (int32_t)k - 1;
            sy[k].next = k + 1 < ns ? (int32_t)k + 1 : -1;
            sy[k].alive = 1;
        }
        /* Long words use the bucket queue, short ones a plain heap; both
         * yield entries in (rank, pos) order. */
        bqueue *q = NULL;
        hent *hp = NULL;
        size_t hn = 0;
        if (ns >= BQ_MIN_SYMBOLS) {
            if (!s->bq && !(s->bq = calloc(1, sizeof(bqueue)))) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
            q = s->bq;
            if (bq_prepare(q, b->n_ranks) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        } else {
            if (ns_vec_grow(&s->heap, &s->heap_cap, ns * 2 + 8, sizeof(hent), 0) != NS_OK)
                return ns_fail(err, NS_ERR_NOMEM, "out of memory");
            hp = s->heap;
        }
        ns_status qst = NS_OK;
#define QPUSH(r, p, id)                                                             \
    do {                                                                            \
        if (q) {                                                                    \
            if (qst == NS_OK) qst = bq_push(q, (r), (p), (id));                     \
        } else {                                                                    \
            if (ns_vec_grow(&s->heap, &s->heap_cap, hn + 1, sizeof(hent), 0) != NS_OK)             \
                qst = NS_ERR_NOMEM;                                                 \
            else {                                                                  \
                hp = s->heap;                                                       \
                heap_push(hp, &hn, (hent){(r), (p), (id)});                         \
            }                                                                       \
        }                                                                           \
    } while (0)
        for (size_t k = 0; k + 1 < ns; k++) {
            uint32_t rank;
            int32_t nid;
            if (merge_get(b, sy[k].id, sy[k + 1].id, &rank, &nid)) QPUSH(rank, (uint32_t)k, nid);
        }
        for (;;) {
            hent top;
            if (q) {
                if (!bq_pop(q, &top)) break;
            } else {
                if (!hn) break;
                top = heap_pop(hp, &hn);
            }
            sym *cur = &sy[top.pos];
            if (!cur->alive || cur->next < 0) continue;
            sym *right = &sy[cur->next];
            uint32_t rank;
            int32_t nid;
            if (!merge_get(b, cur->id, right->id, &rank, &nid) || nid != top.nid) continue; /* stale */
            cur->id = top.nid;
            right->alive = 0;
            cur->next = right->next;
            if (right->next >= 0) sy[right->next].prev = (int32_t)top.pos;
            if (cur->prev >= 0 && merge_get(b, sy[cur->prev].id, cur->id, &rank, &nid))
                QPUSH(rank, (uint32_t)cur->prev, nid);
            if (cur->next >= 0 && merge_get(b, cur->id, sy[cur->next].id, &rank, &nid)) QPUSH(rank, top.pos, nid);
            if (qst != NS_OK) break;
        }
#undef QPUSH
        if (q) bq_clear(q);
        if (qst != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        for (int32_t k = 0; k >= 0; k = sy[k].next)
            if (ns_ids_push(out, sy[k].id) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    } else {
        for (size_t k = 0; k < ns; k++)
            if (ns_ids_push(out, sy[k].id) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    /* a word whose every character was dropped (no unk token) has no ids,
     * and out may still be an empty vector with no storage: cache the
     * empty result without forming NULL + 0 (undefined; fuzz_gguf) */
    if (cache && n <= CACHE_MAX_WORD)
        wcache_put(cache, w, n, h, out->n > first_out ? out->v + first_out : NULL, out->n - first_out);
    return NS_OK;
}
