#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_model.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/jscan.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pattern.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tok_gguf.h"
#include "tokenizer/tokutil.h"
#include "util/file.h"
#include "util/vec.h"

#define MAX_JSON_BYTES ((size_t)512 << 20)
#define MAX_ADDED_ID ((1 << 24) - 1)

typedef struct added_tok {
    char *content; /* owned */
    size_t len;
    char *norm; /* normalized content (owned) for normalized tokens */
    size_t norm_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} added_tok;

/* Byte trie over added-token strings for leftmost-longest matching. */
typedef struct trie_node {
    int32_t child, sibling, tok;
    unsigned char byte;
} trie_node;

typedef struct trie {
    trie_node *n;
    size_t count, cap;
    uint8_t first[32]; /* bitmap of first bytes */
    int n_first;       /* number of distinct first bytes */
    unsigned char only_first;
} trie;

typedef struct chat_tmpl {
    char *name, *text;
} chat_tmpl;

struct ns_tokenizer {
    ns_bpe *bpe;
    added_tok *added;
    size_t n_added, cap_added;
    ns_strmap added_map;  /* content -> index in added */
    int32_t *added_of_id; /* id -> index in added, or -1 */
    trie raw, norm;       /* non-normalized / normalized added tokens */
    ns_normalizer *normalizer;
    ns_pretok *pretok;
    ns_decoder *decoder;
    ns_ids post_pre, post_suf; /* ids around the sequence when add_special */
    int32_t n_vocab;
    char *bos, *eos;
    int32_t bos_id, eos_id;
    chat_tmpl *tmpl;
    size_t n_tmpl;
    double bl_weight[256]; /* ns_bpe_char_weight of each byte's ByteLevel character */
};

struct ns_detok {
    const ns_tokenizer *t;
    bool skip_special;
    ns_decstream *ds;
    bool hold_all; /* decoder cannot stream: collect ids, decode at flush */
    ns_ids held;
};

/* ---- trie ---- */

static void trie_free(trie *tr) {
    free(tr->n);
    memset(tr, 0, sizeof *tr);
}

static int32_t trie_new_node(trie *tr, unsigned char byte) {
    if (NS_VEC_GROW(tr->n, tr->cap, tr->count + 1, INT32_MAX) != NS_OK) return -1;
    tr->n[tr->count] = (trie_node){-1, -1, -1, byte};
    return (int32_t)tr->count++;
}

static ns_status trie_add(trie *tr, const char *s, size_t n, int32_t tok) {
    if (n == 0) return NS_OK; /* an empty token can never match */
    if (!tr->count && trie_new_node(tr, 0) < 0) return NS_ERR_NOMEM;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t c = tr->n[cur].child;
        while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
        if (c < 0) {
            if ((c = trie_new_node(tr, b)) < 0) return NS_ERR_NOMEM;
            tr->n[c].sibling = tr->n[cur].child;
            tr->n[cur].child = c;
        }
        cur = c;
    }
    if (tr->n[cur].tok < 0) tr->n[cur].tok = tok; /* duplicates: the first one wins */
    unsigned char f = (unsigned char)s[0];
    if (!(tr->first[f >> 3] & (1u << (f & 7)))) {
        tr->first[f >> 3] |= (uint8_t)(1u << (f & 7));
        tr->n_first++;
        tr->only_first = f;
    }
    return NS_OK;
}

/* Leftmost match at or after `from`; among those starting there, the longest. */
static bool trie_find(const trie *tr, const char *s, size_t n, size_t from, size_t *ms, size_t *me, int32_t *tok) {
    if (!tr->count) return false;
    for (size_t i = from; i < n; i++) {
        if (tr->n_first == 1) {
            const char *p = memchr(s + i, tr->only_first, n - i);
            if (!p) return false;
            i = (size_t)(p - s);
        } else {
            unsigned char f = (unsigned char)s[i];
            if (!(tr->first[f >> 3] & (1u << (f & 7)))) continue;
        }
        int32_t cur = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            int32_t c = tr->n[cur].child;
            while (c >= 0 && tr->n[c].byte != (unsigned char)s[j]) c = tr->n[c].sibling;
            if (c < 0) break;
            cur = c;
            if (tr->n[cur].tok >= 0) {
                best = tr->n[cur].tok;
                best_end = j + 1;
            }
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *tok = best;
            return true;
        }
    }
    return false;
}

/* ---- added-token splitting (tokenizers' AddedVocabulary::find_matches) ---- */

typedef struct seg {
    size_t start, end;
    int32_t added; /* index into t->added, or -1 for plain text */
} seg;

static uint32_t last_char(const char *s, size_t n) { return ns_utf8_prev(s, &n); }

static bool is_word_char(uint32_t cp) { return cp == '_' || ns_uni_is_alnum(cp); }

/* Lazy: segments come out one at a time, so text with millions of added
 * tokens needs no list of them (the bounded encode stops early). */
typedef struct added_iter {
    const ns_tokenizer *t;
    const trie *tr;
    const char *s;
    size_t n;
    size_t start_offset, pos;
    seg pend; /* an added token due after the plain segment just returned */
    bool have_pend, done;
} added_iter;

static void added_iter_init(added_iter *it, const ns_tokenizer *t, const trie *tr, const char *s, size_t n) {
    memset(it, 0, sizeof *it);
    it->t = t;
    it->tr = tr;
    it->s = s;
    it->n = n;
}

static bool added_next(added_iter *it, seg *out) {
    if (it->have_pend) {
        it->have_pend = false;
        *out = it->pend;
        return true;
    }
    const char *s = it->s;
    const size_t n = it->n;
    while (!it->done) {
        size_t ms, me;
        int32_t ti;
        if (!(it->pos < n && trie_find(it->tr, s, n, it->pos, &ms, &me, &ti))) {
            it->done = true;
            if (it->start_offset >= n) return false;
            *out = (seg){it->start_offset, n, -1};
            it->start_offset = n;
            return true;
        }
        const added_tok *a = &it->t->added[ti];
        it->pos = me;
        if (a->single_word) {
            uint32_t cp = 0;
            bool start_space = ms == 0 || !is_word_char(last_char(s, ms));
            if (me < n) ns_utf8_decode(s, n, me, &cp);
            bool stop_space = me == n || !is_word_char(cp);
            if (!start_space || !stop_space) continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = ns;
                if (!ns_uni_is_whitespace(ns_utf8_prev(s, &k))) break;
                ns = k;
            }
            start = ns > it->start_offset ? ns : it->start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = ns_utf8_decode(s, n, stop, &cp);
                if (!ns_uni_is_whitespace(cp)) break;
                stop += l;
            }
            if (stop > it->pos) it->pos = stop;
        }
        const seg added = {start, stop, ti};
        const size_t from = it->start_offset;
        it->start_offset = stop;
        if (from < start) {
            *out = (seg){from, start, -1};
            it->pend = added;
            it->have_pend = true;
            return true;
        }
        *out = added;
        return true;
    }
    return false;
}

/* ---- freeing / small accessors ---- */

void ns_tokenizer_free(ns_tokenizer *t) {
    if (!t) return;
    ns_bpe_free(t->bpe);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    ns_strmap_free(&t->added_map);
    free(t->added_of_id);
    trie_free(&t->raw);
    trie_free(&t->norm);
    ns_normalizer_free(t->normalizer);
    ns_pretok_free(t->pretok);
    ns_decoder_free(t->decoder);
    ns_ids_free(&t->post_pre);
    ns_ids_free(&t->post_suf);
    free(t->bos);
    free(t->eos);
    for (size_t i = 0; i < t->n_tmpl; i++) {
        free(t->tmpl[i].name);
        free(t->tmpl[i].text);
    }
    free(t->tmpl);
    free(t);
}

int32_t ns_tokenizer_n_vocab(const ns_tokenizer *t) { return t->n_vocab; }

static const added_tok *added_of(const ns_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab || t->added_of_id[id] < 0) return NULL;
    return &t->added[t->added_of_id[id]];
}

static const char *piece_of(const ns_tokenizer *t, int32_t id, size_t *len) {
    const added_tok *a = added_of(t, id);
    if (a) {
        *len = a->len;
        return a->content;
    }
    return ns_bpe_piece(t->bpe, id, len);
}

const char *ns_tokenizer_piece(const ns_tokenizer *t, int32_t id) {
    size_t len;
    return piece_of(t, id, &len);
}

static int32_t lookup(const ns_tokenizer *t, const char *s, size_t n) {
    int32_t i = ns_strmap_get(&t->added_map, s, n);
    if (i >= 0) return t->added[i].id;
    return ns_bpe_id(t->bpe, s, n);
}

int32_t ns_tokenizer_token_id(const ns_tokenizer *t, const char *piece) {
    return piece ? lookup(t, piece, strlen(piece)) : -1;
}

bool ns_tokenizer_is_special(const ns_tokenizer *t, int32_t id) {
    const added_tok *a = added_of(t, id);
    return a && a->special;
}

int32_t ns_tokenizer_bos_id(const ns_tokenizer *t) { return t->bos_id; }
int32_t ns_tokenizer_eos_id(const ns_tokenizer *t) { return t->eos_id; }
const char *ns_tokenizer_bos_token(const ns_tokenizer *t) { return t->bos; }
const char *ns_tokenizer_eos_token(const ns_tokenizer *t) { return t->eos; }

const char *ns_tokenizer_chat_template(const ns_tokenizer *t, const char *name) {
    const char *want = name ? name : "default";
    for (size_t i = 0; i < t->n_tmpl; i++)
        if (!strcmp(t->tmpl[i].name, want)) return t->tmpl[i].text;
    if (!name && t->n_tmpl == 1) return t->tmpl[0].text;
    return NULL;
}

/* ---- loading ---- */

static ns_status parse_json(const char *path, const char *buf, size_t len, json_t **out, ns_error *err) {
    json_error_t je;
    /* Integers as reals: configs carry values (model_max_length ~1e30) that
     * overflow jansson's integer type; ids are read back with ns_json_int. */
    json_t *j = json_loadb(buf, len, JSON_DECODE_INT_AS_REAL, &je);
    if (!j) return ns_fail(err, NS_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return ns_fail(err, NS_ERR_FORMAT, "%s: top level is not a JSON object", path);
    }
    *out = j;
    return NS_OK;
}

static ns_status load_json(const char *path, json_t **out, ns_error *err) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    ns_status st = ns_file_read(path, MAX_JSON_BYTES, &buf, &len, err);
    if (st != NS_OK) return st;
    st = parse_json(path, buf, len, out, err);
    free(buf);
    return st;
}

/* tokenizer.json as the loader needs it: the jansson document without the
 * two big model members, and their raw JSON text (see jscan.h). */
typedef struct tokjson {
    json_t *root;
    char *raw;             /* file contents, or json_dumps output (fallback) */
    const char *vocab;     /* text of model.vocab */
    size_t vocab_len;
    const char *merges;    /* text of model.merges (may be empty) */
    size_t merges_len;
    char *dump_merges;     /* fallback only */
} tokjson;

static void tokjson_free(tokjson *tj) {
    json_decref(tj->root);
    free(tj->raw);
    free(tj->dump_merges);
    memset(tj, 0, sizeof *tj);
}

/* Takes ownership of buf (tokenizer.json text of len bytes, NUL-terminated). */
static ns_status load_tokenizer_json(const char *path, char *buf, size_t len, tokjson *tj, ns_error *err) {
    memset(tj, 0, sizeof *tj);
    size_t v[2], m[2];
    ns_status st = NS_OK;
    tj->raw = buf;
    if (ns_jscan_model_spans(tj->raw, len, v, m) && v[1] > v[0]) {
        /* Copy the document with vocab -> {} and merges -> [], in file order. */
        size_t cut[2][2] = {{v[0], v[1]}, {m[0], m[1]}};
        const char *stub[2] = {"{}", "[]"};
        int order[2] = {0, 1};
        if (m[1] > m[0] && m[0] < v[0]) order[0] = 1, order[1] = 0;
        ns_buf doc;
        ns_buf_init(&doc, 0);
        size_t pos = 0;
        for (int k = 0; k < 2 && st == NS_OK; k++) {
            const size_t *c = cut[order[k]];
            if (c[1] <= c[0]) continue;
            if (ns_buf_append(&doc, tj->raw + pos, c[0] - pos) != NS_OK || ns_buf_puts(&doc, stub[order[k]]) != NS_OK)
                st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            pos = c[1];
        }
        if (st == NS_OK && ns_buf_append(&doc, tj->raw + pos, len - pos) != NS_OK)
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        if (st == NS_OK) st = parse_json(path, doc.data, doc.len, &tj->root, err);
        ns_buf_free(&doc);
        if (st != NS_OK) return st;
        tj->vocab = tj->raw + v[0];
        tj->vocab_len = v[1] - v[0];
        tj->merges = tj->raw + m[0];
        tj->merges_len = m[1] - m[0];
        return NS_OK;
    }
    /* Unusual layout: parse everything with jansson and re-serialize the two
     * members for the BPE reader. */
    st = parse_json(path, tj->raw, len, &tj->root, err);
    free(tj->raw);
    tj->raw = NULL;
    if (st != NS_OK) return st;
    const json_t *model = json_object_get(tj->root, "model");
    const json_t *vj = json_object_get(model, "vocab"), *mj = json_object_get(model, "merges");
    if (vj && !(tj->raw = json_dumps(vj, JSON_COMPACT | JSON_ENCODE_ANY))) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    if (mj && !(tj->dump_merges = json_dumps(mj, JSON_COMPACT | JSON_ENCODE_ANY)))
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    tj->vocab = tj->raw ? tj->raw : "";
    tj->vocab_len = strlen(tj->vocab);
    tj->merges = tj->dump_merges ? tj->dump_merges : "";
    tj->merges_len = strlen(tj->merges);
    return NS_OK;
}

static char *xstrndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* A special-token value of tokenizer_config: "str" or {"content": "str", ...}. */
static const json_t *token_content(const json_t *v) {
    if (json_is_string(v)) return v;
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return c;
    }
    return NULL;
}

static bool jbool(const json_t *o, const char *k, bool dflt) {
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static ns_status push_added(ns_tokenizer *t, const char *content, size_t len, int32_t id, bool special, bool lstrip,
                            bool rstrip, bool single_word, bool normalized) {
    if (NS_VEC_GROW(t->added, t->cap_added, t->n_added + 1, 0) != NS_OK) return NS_ERR_NOMEM;
    added_tok *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    if (!(a->content = xstrndup(content, len))) return NS_ERR_NOMEM;
    a->len = len;
    a->id = id;
    a->special = special;
    a->lstrip = lstrip;
    a->rstrip = rstrip;
    a->single_word = single_word;
    a->normalized = normalized;
    t->n_added++;
    return NS_OK;
}

static ns_status load_added(ns_tokenizer *t, const json_t *arr, const char *path, ns_error *err) {
    if (!arr || json_is_null(arr)) return NS_OK;
    if (!json_is_array(arr)) return ns_fail(err, NS_ERR_FORMAT, "%s: added_tokens must be an array", path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *o = json_array_get(arr, i);
        const json_t *c = json_object_get(o, "content");
        int64_t id;
        if (!json_is_string(c) || !ns_json_int(json_object_get(o, "id"), 0, MAX_ADDED_ID, &id))
            return ns_fail(err, NS_ERR_FORMAT, "%s: added_tokens[%zu] needs a string \"content\" and an id in [0, %d]",
                           path, i, MAX_ADDED_ID);
        bool special = jbool(o, "special", false);
        if (push_added(t, json_string_value(c), json_string_length(c), (int32_t)id, special, jbool(o, "lstrip", false),
                       jbool(o, "rstrip", false), jbool(o, "single_word", false),
                       jbool(o, "normalized", !special)) != NS_OK)
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    return NS_OK;
}

/* transformers adds the config's named special tokens as special added
 * tokens; we do it for those already in the model vocabulary. */
static ns_status add_config_special(ns_tokenizer *t, const json_t *v) {
    const json_t *c = token_content(v);
    if (!c) return NS_OK;
    const char *s = json_string_value(c);
    size_t n = json_string_length(c);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return NS_OK;
    int32_t id = ns_bpe_id(t->bpe, s, n);
    if (id < 0) return NS_OK;
    bool obj = json_is_object(v);
    return push_added(t, s, n, id, true, obj && jbool(v, "lstrip", false), obj && jbool(v, "rstrip", false),
                      obj && jbool(v, "single_word", false), obj && jbool(v, "normalized", false));
}

static ns_status build_added_index(ns_tokenizer *t, ns_error *err) {
    int32_t max_id = ns_bpe_n_ids(t->bpe) - 1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    t->n_vocab = max_id + 1;
    t->added_of_id = malloc(((size_t)t->n_vocab + 1) * sizeof *t->added_of_id);
    if (!t->added_of_id || ns_strmap_init(&t->added_map, t->n_added) != NS_OK)
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    memset(t->added_of_id, 0xFF, ((size_t)t->n_vocab + 1) * sizeof *t->added_of_id);
    ns_rx_ctx rx = {0};
    ns_buf nb;
    ns_buf_init(&nb, 0);
    ns_status st = NS_OK;
    for (size_t i = 0; i < t->n_added && st == NS_OK; i++) {
        added_tok *a = &t->added[i];
        t->added_of_id[a->id] = (int32_t)i; /* later entries for an id win, like HF's map */
        if ((st = ns_strmap_put(&t->added_map, a->content, a->len, (int32_t)i)) != NS_OK) break;
        if (!a->normalized || !t->normalizer) {
            st = trie_add(a->normalized ? &t->norm : &t->raw, a->content, a->len, (int32_t)i);
            continue;
        }
        /* Normalized tokens are matched in normalized text, so their
         * pattern is the normalized content. */
        if ((st = ns_normalize(t->normalizer, &rx, a->content, a->len, &nb, err)) != NS_OK) break;
        if (!(a->norm = xstrndup(nb.data ? nb.data : "", nb.len))) {
            st = NS_ERR_NOMEM;
            break;
        }
        a->norm_len = nb.len;
        st = trie_add(&t->norm, a->norm, a->norm_len, (int32_t)i);
    }
    ns_buf_free(&nb);
    ns_rx_ctx_free(&rx);
    if (st == NS_ERR_NOMEM) return ns_fail(err, st, "out of memory");
    return st;
}

/* Post-processor -> ids before and after the sequence. */
static ns_status parse_post(const ns_tokenizer *t, const json_t *j, ns_ids *pre, ns_ids *suf, const char *path,
                            int depth, ns_error *err) {
    if (!j || json_is_null(j)) return NS_OK;
    if (depth > 8) return ns_fail(err, NS_ERR_FORMAT, "%s: post_processor nesting too deep", path);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return ns_fail(err, NS_ERR_FORMAT, "%s: post_processor has no \"type\"", path);
    if (!strcmp(type, "ByteLevel")) return NS_OK; /* only adjusts offsets */
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(j, "processors");
        if (!json_is_array(arr)) return ns_fail(err, NS_ERR_FORMAT, "%s: post_processor Sequence needs \"processors\"", path);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            /* Each processor wraps the result of the previous ones. */
            ns_ids p2 = {0}, s2 = {0};
            ns_status st = parse_post(t, json_array_get(arr, i), &p2, &s2, path, depth + 1, err);
            if (st == NS_OK && p2.n) {
                if (ns_ids_append(&p2, pre->v, pre->n) != NS_OK) st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
                else {
                    ns_ids tmp = *pre;
                    *pre = p2;
                    p2 = tmp;
                }
            }
            if (st == NS_OK && ns_ids_append(suf, s2.v, s2.n) != NS_OK) st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            ns_ids_free(&p2);
            ns_ids_free(&s2);
            if (st != NS_OK) return st;
        }
        return NS_OK;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: post_processor type \"%s\" is not supported", path, type);
    const json_t *single = json_object_get(j, "single");
    const json_t *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single))
        return ns_fail(err, NS_ERR_FORMAT, "%s: TemplateProcessing needs a \"single\" array", path);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        const json_t *sq = json_object_get(it, "Sequence");
        const json_t *sp = json_object_get(it, "SpecialToken");
        if (sq) {
            const char *id = json_string_value(json_object_get(sq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_a++)
                return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: TemplateProcessing single template must use $A once", path);
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return ns_fail(err, NS_ERR_FORMAT, "%s: TemplateProcessing special token \"%s\" has no ids", path,
                           name ? name : "?");
        for (size_t k = 0; k < json_array_size(ids); k++) {
            int64_t v;
            if (!ns_json_int(json_array_get(ids, k), 0, t->n_vocab - 1, &v))
                return ns_fail(err, NS_ERR_FORMAT, "%s: TemplateProcessing special token \"%s\" has an invalid id", path,
                               name);
            if (ns_ids_push(seen_a ? suf : pre, (int32_t)v) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
    }
    if (!seen_a) return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: TemplateProcessing single template lacks $A", path);
    return NS_OK;
}

static ns_status load_templates(ns_tokenizer *t, const json_t *ct, const char *dir, const char *cfg_path,
                                ns_error *err) {
    if (json_is_string(ct)) {
        if (!(t->tmpl = calloc(1, sizeof *t->tmpl))) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        t->n_tmpl = 1;
        t->tmpl[0].name = xstrndup("default", 7);
        t->tmpl[0].text = xstrndup(json_string_value(ct), json_string_length(ct));
        if (!t->tmpl[0].name || !t->tmpl[0].text) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        return NS_OK;
    }
    if (json_is_array(ct)) {
        size_t n = json_array_size(ct);
        if (!(t->tmpl = calloc(n ? n : 1, sizeof *t->tmpl))) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(ct, i);
            const json_t *nm = json_object_get(e, "name"), *tx = json_object_get(e, "template");
            if (!json_is_string(nm) || !json_is_string(tx))
                return ns_fail(err, NS_ERR_FORMAT, "%s: chat_template[%zu] needs string \"name\" and \"template\"",
                               cfg_path, i);
            t->tmpl[i].name = xstrndup(json_string_value(nm), json_string_length(nm));
            t->tmpl[i].text = xstrndup(json_string_value(tx), json_string_length(tx));
            t->n_tmpl++;
            if (!t->tmpl[i].name || !t->tmpl[i].text) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
        return NS_OK;
    }
    if (ct && !json_is_null(ct))
        return ns_fail(err, NS_ERR_FORMAT, "%s: chat_template must be a string or a list", cfg_path);
    /* Newer checkpoints keep the template in its own file. */
    if (!dir) return NS_OK;
    char *p = ns_path_join(dir, "chat_template.jinja");
    if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status st = NS_OK;
    if (ns_file_exists(p)) {
        char *text = NULL;
        size_t len = 0;
        st = ns_file_read(p, 16u << 20, &text, &len, err);
        if (st == NS_OK) {
            t->tmpl = calloc(1, sizeof *t->tmpl);
            char *name = xstrndup("default", 7);
            if (!t->tmpl || !name) {
                free(name);
                free(text);
                st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            } else {
                t->tmpl[0] = (chat_tmpl){name, text};
                t->n_tmpl = 1;
            }
        }
    }
    free(p);
    return st;
}

/* The pipeline transformers 5 builds for LlamaTokenizer (see header). */
static ns_status llama_v5_pipeline(const json_t *cfg, const json_t *model, json_t **model_out, json_t **pre_out,
                                   json_t **dec_out) {
    const json_t *aps = json_object_get(cfg, "add_prefix_space");
    bool add_prefix_space = json_is_boolean(aps) ? json_is_true(aps) : true;
    bool legacy = jbool(cfg, "legacy", false);
    const char *scheme = !add_prefix_space ? "never" : legacy ? "always" : "first";
    json_t *m = json_copy((json_t *)model);
    *pre_out = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", "\xE2\x96\x81", "prepend_scheme",
                         scheme, "split", 0);
    *dec_out = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}]}", "type", "Sequence", "decoders", "type",
                         "Replace", "pattern", "String", "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type",
                         "Fuse");
    if (!m || !*pre_out || !*dec_out) goto oom;
    if (add_prefix_space) {
        json_t *strip = json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ", "start", 1, "stop", 0);
        if (!strip || json_array_append_new(json_object_get(*dec_out, "decoders"), strip) != 0) goto oom;
    }
    if (json_object_set_new(m, "unk_token", json_null()) || json_object_set_new(m, "fuse_unk", json_true()) ||
        json_object_set_new(m, "byte_fallback", json_true()) || json_object_set_new(m, "ignore_merges", json_false()) ||
        json_object_set_new(m, "dropout", json_null()) ||
        json_object_set_new(m, "continuing_subword_prefix", json_null()) ||
        json_object_set_new(m, "end_of_word_suffix", json_null()))
        goto oom;
    *model_out = m;
    return NS_OK;
oom:
    json_decref(m);
    json_decref(*pre_out);
    json_decref(*dec_out);
    *pre_out = *dec_out = NULL;
    return NS_ERR_NOMEM;
}

/* Builds a tokenizer from tokenizer.json text (tok_buf, owned and freed
 * here) and an optional parsed config (cfg, reference taken). tok_path and
 * cfg_path name the sources in messages; model_dir (may be NULL) is where a
 * chat_template.jinja would be. */
static ns_status load_impl(const char *tok_path, char *tok_buf, size_t tok_len, const char *cfg_path, json_t *cfg,
                           const char *model_dir, ns_tokenizer **out, ns_error *err) {
    *out = NULL;
    ns_status st = NS_OK;
    json_t *root = NULL, *model_ovr = NULL, *pre_ovr = NULL, *dec_ovr = NULL;
    tokjson tj;
    memset(&tj, 0, sizeof tj);
    ns_tokenizer *t = NULL;
    if (cfg) json_incref(cfg); /* released at done */
    if ((st = load_tokenizer_json(tok_path, tok_buf, tok_len, &tj, err)) != NS_OK) goto done;
    root = tj.root;
    if (!cfg && !(cfg = json_object())) {
        st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!(t = calloc(1, sizeof *t))) {
        st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    t->bos_id = t->eos_id = -1;

    /* Model. */
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        st = ns_fail(err, NS_ERR_FORMAT, "%s: no \"model\" object", tok_path);
        goto done;
    }
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!mtype && json_object_get(model, "merges")) mtype = "BPE"; /* old files omit the type */
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        st = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", tok_path,
                     mtype ? mtype : "?");
        goto done;
    }
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    bool llama_v5 = cls && (!strcmp(cls, "LlamaTokenizer") || !strcmp(cls, "LlamaTokenizerFast"));
    if (llama_v5) {
        if (llama_v5_pipeline(cfg, model, &model_ovr, &pre_ovr, &dec_ovr) != NS_OK) {
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        model = model_ovr;
    }
    if ((st = ns_bpe_create(model, tj.vocab, tj.vocab_len, tj.merges, tj.merges_len, tok_path, &t->bpe, err)) != NS_OK)
        goto done;
    for (int b = 0; b < 256; b++) t->bl_weight[b] = ns_bpe_char_weight(t->bpe, ns_bytelevel_char((unsigned char)b));

    /* Pipeline components. */
    if (!llama_v5 && (st = ns_normalizer_parse(json_object_get(root, "normalizer"), &t->normalizer, err)) != NS_OK)
        goto fail_component;
    if ((st = ns_pretok_parse(llama_v5 ? pre_ovr : json_object_get(root, "pre_tokenizer"), &t->pretok, err)) != NS_OK)
        goto fail_component;
    if ((st = ns_decoder_parse(llama_v5 ? dec_ovr : json_object_get(root, "decoder"), &t->decoder, err)) != NS_OK)
        goto fail_component;

    /* Added tokens, then the config's named special tokens. */
    if ((st = load_added(t, json_object_get(root, "added_tokens"), tok_path, err)) != NS_OK) goto done;
    static const char *const named[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if (add_config_special(t, json_object_get(cfg, named[i])) != NS_OK) goto oom;
    static const char *const lists[] = {"additional_special_tokens", "extra_special_tokens"};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        const json_t *arr = json_object_get(cfg, lists[i]);
        for (size_t k = 0; json_is_array(arr) && k < json_array_size(arr); k++)
            if (add_config_special(t, json_array_get(arr, k)) != NS_OK) goto oom;
    }
    if ((st = build_added_index(t, err)) != NS_OK) goto done;

    /* BOS/EOS and the post-processor. */
    const json_t *bos = token_content(json_object_get(cfg, "bos_token"));
    const json_t *eos = token_content(json_object_get(cfg, "eos_token"));
    if (bos) {
        if (!(t->bos = xstrndup(json_string_value(bos), json_string_length(bos)))) goto oom;
        t->bos_id = lookup(t, t->bos, strlen(t->bos));
    }
    if (eos) {
        if (!(t->eos = xstrndup(json_string_value(eos), json_string_length(eos)))) goto oom;
        t->eos_id = lookup(t, t->eos, strlen(t->eos));
    }
    if (json_object_get(cfg, "add_bos_token") || json_object_get(cfg, "add_eos_token")) {
        if (jbool(cfg, "add_bos_token", false) && t->bos_id >= 0 && ns_ids_push(&t->post_pre, t->bos_id) != NS_OK)
            goto oom;
        if (jbool(cfg, "add_eos_token", false) && t->eos_id >= 0 && ns_ids_push(&t->post_suf, t->eos_id) != NS_OK)
            goto oom;
    } else if ((st = parse_post(t, json_object_get(root, "post_processor"), &t->post_pre, &t->post_suf, tok_path, 0,
                                err)) != NS_OK) {
        goto done;
    }
    if ((st = load_templates(t, json_object_get(cfg, "chat_template"), model_dir, cfg_path, err)) != NS_OK) goto done;
    goto done;

fail_component:
    if (err) {
        /* Prefix the component error with the file it came from. */
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        ns_fail(err, st, "%s: %s", tok_path, msg);
    }
    goto done;
oom:
    st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
done:
    tokjson_free(&tj); /* owns root */
    json_decref(cfg);
    json_decref(model_ovr);
    json_decref(pre_ovr);
    json_decref(dec_ovr);
    if (st != NS_OK) {
        ns_tokenizer_free(t);
        return st;
    }
    *out = t;
    return NS_OK;
}

ns_status ns_tokenizer_load(const char *model_dir, ns_tokenizer **out, ns_error *err) {
    *out = NULL;
    char *gguf = NULL; /* a GGUF model carries its tokenizer (tok_gguf.h) */
    if (ns_gguf_model_path(model_dir, &gguf, err)) {
        free(gguf);
        return ns_tokenizer_load_gguf(model_dir, out, err);
    }
    ns_status st = NS_OK;
    json_t *cfg = NULL;
    char *buf = NULL;
    size_t len = 0;
    char *tok_path = ns_path_join(model_dir, "tokenizer.json");
    char *cfg_path = ns_path_join(model_dir, "tokenizer_config.json");
    if (!tok_path || !cfg_path) {
        st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = ns_file_read(tok_path, MAX_JSON_BYTES, &buf, &len, err)) != NS_OK) goto done;
    if (ns_file_exists(cfg_path) && (st = load_json(cfg_path, &cfg, err)) != NS_OK) {
        free(buf);
        goto done;
    }
    st = load_impl(tok_path, buf, len, cfg_path, cfg, model_dir, out, err);
done:
    json_decref(cfg);
    free(tok_path);
    free(cfg_path);
    return st;
}

ns_status ns_tokenizer_load_json(const char *tokenizer_json, const char *config_json, ns_tokenizer **out,
                                 ns_error *err) {
    *out = NULL;
    static const char tok_name[] = "tokenizer.json (in memory)", cfg_name[] = "tokenizer_config.json (in memory)";
    if (!tokenizer_json) return ns_fail(err, NS_ERR_INVALID, "%s: NULL text", tok_name);
    json_t *cfg = NULL;
    if (config_json) {
        ns_status st = parse_json(cfg_name, config_json, strlen(config_json), &cfg, err);
        if (st != NS_OK) return st;
    }
    size_t len = strlen(tokenizer_json);
    char *buf = xstrndup(tokenizer_json, len);
    if (!buf) {
        json_decref(cfg);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    ns_status st = load_impl(tok_name, buf, len, cfg_name, cfg, NULL, out, err);
    json_decref(cfg);
    return st;
}

/* ---- encoding ----
 *
 * Bounded: the encoder counts ids as it goes and, given a limit, stops as
 * soon as there are more (ns_tokenizer_encode_limit). Work and memory
 * then follow the limit, not the text:
 *  - added tokens are cut out lazily (added_iter);
 *  - a segment the normalizer would leave unchanged is read in place
 *    (ns_normalize_is_identity), else normalized into one copy;
 *  - the pre-tokenizer's first stage runs as a generator over the text
 *    (ns_pretok_iter) and its pieces are encoded in small batches;
 *  - a long word is refused before the merge (which needs ~40 bytes per
 *    character) when a lower bound on its ids (ns_bpe_min_ids) already
 *    passes the limit.
 * Below the limit the ids are exactly those of the whole-text encode. */

#define BATCH_PIECES 256
#define BATCH_BYTES ((size_t)64 << 10)
#define BOUND_MIN_BYTES 256 /* shorter words are merged without a bound */

typedef struct enc_ctx {
    const ns_tokenizer *t;
    ns_rx_ctx rx;
    ns_bpe_scratch bs;
    ns_pieces pa, pb;
    ns_buf norm;
    ns_ids ids;
    size_t limit; /* SIZE_MAX: none */
    bool over;    /* stopped: the text has more than limit ids */
    size_t at_least; /* when over: a lower bound on the whole count */
} enc_ctx;

/* Adds what is known so far; true (and c->over) once past the limit. */
static bool past_limit(enc_ctx *c, double more) {
    if (c->over) return true;
    if (c->limit == SIZE_MAX) return false;
    /* the bound is a double sum: +1 keeps rounding from ever refusing a
     * text that fits */
    if ((double)c->ids.n + more > (double)c->limit + 1.0 || c->ids.n > c->limit) {
        c->over = true;
        size_t b = c->ids.n + (size_t)more;
        c->at_least = b > c->limit ? b : c->limit + 1;
    }
    return c->over;
}

static ns_status push_id(enc_ctx *c, int32_t id, ns_error *err) {
    if (ns_ids_push(&c->ids, id) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    past_limit(c, 0.0);
    return NS_OK;
}

/* One word through the BPE model, unless its lower bound passes the limit. */
static ns_status encode_word(enc_ctx *c, const char *w, size_t n, ns_error *err) {
    if (c->limit != SIZE_MAX && n > BOUND_MIN_BYTES && past_limit(c, ns_bpe_min_ids(c->t->bpe, w, n))) return NS_OK;
    ns_status st = ns_bpe_word(c->t->bpe, &c->bs, w, n, &c->ids, err);
    if (st == NS_OK) past_limit(c, 0.0);
    return st;
}

/* Lower bound for a first-stage piece s[0..n) before the later stages
 * copy it: exact per character (REST_NONE) or per byte (a ByteLevel maps
 * each byte to one character); 0 when the later stages are unknown. */
static double raw_bound(const enc_ctx *c, ns_pretok_rest rest, const char *s, size_t n) {
    if (rest == NS_PRETOK_REST_NONE) return ns_bpe_min_ids(c->t->bpe, s, n);
    if (rest != NS_PRETOK_REST_BYTELEVEL) return 0.0;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += c->t->bl_weight[(unsigned char)s[i]];
    return sum;
}

/* Encodes the batch collected in c->pa (first-stage pieces). */
static ns_status flush_batch(enc_ctx *c, ns_error *err) {
    if (!c->pa.n) return NS_OK;
    ns_status st = ns_pretok_run_rest(c->t->pretok, &c->rx, &c->pa, &c->pb, err);
    for (size_t i = 0; i < c->pa.n && st == NS_OK && !c->over; i++)
        st = encode_word(c, c->pa.text.data + c->pa.v[i].off, c->pa.v[i].len, err);
    ns_pieces_reset(&c->pa);
    return st;
}

/* Pre-tokenizes and BPE-encodes one piece of normalized text. */
static ns_status encode_text(enc_ctx *c, const char *s, size_t n, bool first, ns_error *err) {
    if (n == 0 || c->over) return NS_OK;
    if (!c->t->pretok) return encode_word(c, s, n, err);
    ns_pretok_iter it;
    ns_pretok_rest rest;
    ns_status st = NS_OK;
    ns_pieces_reset(&c->pa);
    if (!ns_pretok_iter_init(&it, c->t->pretok, s, n, first, &rest)) {
        /* a pre-tokenizer that cannot start in place: the whole text at
         * once — after a bound, when it is a Metaspace (SentencePiece-style
         * models: then the text is one word) */
        uint32_t repl;
        if (c->limit != SIZE_MAX && n > BOUND_MIN_BYTES && ns_pretok_is_metaspace(c->t->pretok, &repl)) {
            double sum = 0.0;
            const double w_space = ns_bpe_char_weight(c->t->bpe, repl);
            for (size_t i = 0; i < n;) {
                uint32_t cp = ns_utf8_next(s, n, &i);
                sum += cp == ' ' ? w_space : ns_bpe_char_weight(c->t->bpe, cp);
            }
            if (past_limit(c, sum)) return NS_OK;
        }
        if (ns_pieces_add(&c->pa, s, n, first) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        st = ns_pretok_run(c->t->pretok, &c->rx, &c->pa, &c->pb, err);
        for (size_t i = 0; i < c->pa.n && st == NS_OK && !c->over; i++)
            st = encode_word(c, c->pa.text.data + c->pa.v[i].off, c->pa.v[i].len, err);
        ns_pieces_reset(&c->pa);
        return st;
    }
    for (;;) {
        size_t a, b;
        bool f, found;
        if ((st = ns_pretok_iter_next(&it, &c->rx, &a, &b, &f, &found, err)) != NS_OK) return st;
        if (!found) break;
        if (c->limit != SIZE_MAX && b - a > BOUND_MIN_BYTES && past_limit(c, raw_bound(c, rest, s + a, b - a)))
            break;
        if (b - a > BATCH_BYTES && (st = flush_batch(c, err)) != NS_OK) return st; /* a long piece goes alone */
        if (c->over) break;
        if (ns_pieces_add(&c->pa, s + a, b - a, f) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        if (c->pa.n >= BATCH_PIECES || c->pa.text.len >= BATCH_BYTES) {
            if ((st = flush_batch(c, err)) != NS_OK) return st;
            if (c->over) break;
        }
    }
    st = flush_batch(c, err);
    ns_pieces_reset(&c->pa);
    return st;
}

/* Normalizes one raw segment, splits out normalized added tokens, encodes. */
static ns_status encode_segment(enc_ctx *c, const char *s, size_t n, bool first, ns_error *err) {
    const ns_tokenizer *t = c->t;
    const char *ns = s;
    size_t nn = n;
    if (t->normalizer && !ns_normalize_is_identity(t->normalizer, s, n)) {
        ns_status st = ns_normalize(t->normalizer, &c->rx, s, n, &c->norm, err);
        if (st != NS_OK) return st;
        ns = c->norm.data ? c->norm.data : "";
        nn = c->norm.len;
    }
    if (nn == 0) return NS_OK;
    if (!t->norm.count) return encode_text(c, ns, nn, first, err);
    added_iter it;
    added_iter_init(&it, t, &t->norm, ns, nn);
    seg g;
    while (!c->over && added_next(&it, &g)) {
        ns_status st = g.added >= 0 ? push_id(c, t->added[g.added].id, err)
                                    : encode_text(c, ns + g.start, g.end - g.start, first && g.start == 0, err);
        if (st == NS_ERR_NOMEM) return ns_fail(err, st, "out of memory");
        if (st != NS_OK) return st;
    }
    return NS_OK;
}

ns_status ns_tokenizer_encode_limit(const ns_tokenizer *t, const char *text, size_t len, bool add_special,
                                    size_t max_ids, int32_t **ids_out, size_t *n_out, bool *exceeded,
                                    ns_error *err) {
    *ids_out = NULL;
    *n_out = 0;
    if (exceeded) *exceeded = false;
    if (!text && len) return ns_fail(err, NS_ERR_INVALID, "encode: NULL text");
    if (!text) text = "";
    size_t bad = 0;
    if (!ns_utf8_valid(text, len, &bad))
        return ns_fail(err, NS_ERR_INVALID, "encode: input is not valid UTF-8 (at byte %zu)", bad);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t;
    c.limit = max_ids;
    ns_buf_init(&c.norm, 0);
    ns_status st = NS_OK;
    if (add_special && ns_ids_append(&c.ids, t->post_pre.v, t->post_pre.n) != NS_OK) goto oom;
    added_iter it;
    added_iter_init(&it, t, &t->raw, text, len);
    seg g;
    while (st == NS_OK && !past_limit(&c, 0.0) && added_next(&it, &g)) {
        if (g.added >= 0) st = push_id(&c, t->added[g.added].id, err);
        else st = encode_segment(&c, text + g.start, g.end - g.start, g.start == 0, err);
    }
    if (st != NS_OK) goto done;
    if (add_special && !c.over && ns_ids_append(&c.ids, t->post_suf.v, t->post_suf.n) != NS_OK) goto oom;
    if (past_limit(&c, 0.0)) {
        if (!exceeded) {
            st = ns_fail(err, NS_ERR_RANGE, "encode: more than %zu tokens", max_ids);
            goto done;
        }
        *exceeded = true;
        *n_out = c.at_least;
        goto done;
    }
    if (!c.ids.v && !(c.ids.v = malloc(sizeof *c.ids.v))) goto oom; /* never hand out NULL */
    *ids_out = c.ids.v;
    *n_out = c.ids.n;
    c.ids.v = NULL;
    goto done;
oom:
    st = ns_fail(err, NS_ERR_NOMEM, "encode: out of memory");
done:
    ns_ids_free(&c.ids);
    ns_buf_free(&c.norm);
    ns_pieces_free(&c.pa);
    ns_pieces_free(&c.pb);
    ns_bpe_scratch_free(&c.bs);
    ns_rx_ctx_free(&c.rx);
    return st;
}

ns_status ns_tokenizer_encode(const ns_tokenizer *t, const char *text, size_t len, bool add_special,
                              int32_t **ids_out, size_t *n_out, ns_error *err) {
    return ns_tokenizer_encode_limit(t, text, len, add_special, SIZE_MAX, ids_out, n_out, NULL, err);
}

/* ---- decoding ---- */

ns_status ns_tokenizer_decode(const ns_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                              size_t *len_out, ns_error *err) {
    *out = NULL;
    if (len_out) *len_out = 0;
    ns_strlist toks;
    ns_strlist_init(&toks);
    ns_buf text;
    ns_buf_init(&text, 0);
    ns_rx_ctx rx = {0};
    ns_status st = NS_OK;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            st = ns_fail(err, NS_ERR_RANGE, "decode: id %d at position %zu is outside [0, %d)", ids[i], i, t->n_vocab);
            goto done;
        }
        if (skip_special && ns_tokenizer_is_special(t, ids[i])) continue;
        size_t pl;
        const char *p = piece_of(t, ids[i], &pl);
        if (!p) continue; /* an unused id: HF skips it */
        if (ns_strlist_push(&toks, p, pl) != NS_OK) {
            st = ns_fail(err, NS_ERR_NOMEM, "decode: out of memory");
            goto done;
        }
    }
    if ((st = ns_decoder_run(t->decoder, &rx, &toks, &text, err)) != NS_OK) goto done;
    if (!(*out = ns_buf_take(&text, len_out))) st = ns_fail(err, NS_ERR_NOMEM, "decode: out of memory");
done:
    ns_strlist_free(&toks);
    ns_buf_free(&text);
    ns_rx_ctx_free(&rx);
    return st;
}

/* ---- streaming detokenizer ---- */

ns_status ns_detok_create(const ns_tokenizer *t, bool skip_special, ns_detok **out) {
    *out = NULL;
    ns_detok *d = calloc(1, sizeof *d);
    if (!d) return NS_ERR_NOMEM;
    d->t = t;
    d->skip_special = skip_special;
    if (ns_decstream_create(t->decoder, &d->ds) != NS_OK) {
        free(d);
        return NS_ERR_NOMEM;
    }
    d->hold_all = !ns_decstream_streamable(d->ds);
    *out = d;
    return NS_OK;
}

void ns_detok_free(ns_detok *d) {
    if (!d) return;
    ns_decstream_free(d->ds);
    ns_ids_free(&d->held);
    free(d);
}

ns_status ns_detok_push(ns_detok *d, int32_t id, ns_buf *out) {
    const ns_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab) return NS_ERR_RANGE;
    if (d->skip_special && ns_tokenizer_is_special(t, id)) return NS_OK;
    size_t pl;
    const char *p = piece_of(t, id, &pl);
    if (!p) return NS_OK;
    if (d->hold_all) return ns_ids_push(&d->held, id);
    return ns_decstream_push(d->ds, p, pl, out);
}

ns_status ns_detok_flush(ns_detok *d, ns_buf *out) {
    ns_status st;
    if (d->hold_all) {
        char *s = NULL;
        size_t n = 0;
        st = ns_tokenizer_decode(d->t, d->held.v, d->held.n, false, &s, &n, NULL);
        if (st == NS_OK) st = ns_buf_append(out, s, n);
        free(s);
        d->held.n = 0;
    } else {
        st = ns_decstream_flush(d->ds, out);
    }
    ns_decstream_reset(d->ds);
    return st;
}
