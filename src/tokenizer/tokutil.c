#include "tokenizer/tokutil.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "util/vec.h"

/* ---- Unicode predicates ---- */

bool ns_uni_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

bool ns_uni_is_alnum(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    switch (cat) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return true;
    default: return false;
    }
}

/* ---- ByteLevel ---- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map, in increasing order, to U+0100.. */
static bool bl_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 non-printable bytes are 0x00-0x20, 0x7F-0xA0 and 0xAD, numbered
 * 0..67 in that order. */
uint32_t ns_bytelevel_char(unsigned char b) {
    if (bl_printable(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int ns_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return bl_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 66) return (int)(0x7F + k - 33);
    return 0xAD;
}

/* ---- strmap ---- */

uint64_t ns_strhash(const char *s, size_t n) { return XXH3_64bits(s, n); }

ns_status ns_strmap_init(ns_strmap *m, size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2 + 2) {
        if (cap > SIZE_MAX / 4 / sizeof(ns_strmap_ent)) return NS_ERR_NOMEM;
        cap *= 2;
    }
    m->e = calloc(cap, sizeof *m->e);
    if (!m->e) return NS_ERR_NOMEM;
    m->cap = cap;
    m->n = 0;
    return NS_OK;
}

void ns_strmap_free(ns_strmap *m) {
    free(m->e);
    m->e = NULL;
    m->cap = m->n = 0;
}

static ns_status strmap_grow(ns_strmap *m) {
    ns_strmap nm;
    ns_status st = ns_strmap_init(&nm, m->cap);
    if (st != NS_OK) return st;
    for (size_t i = 0; i < m->cap; i++) {
        ns_strmap_ent *e = &m->e[i];
        if (!e->key) continue;
        size_t j = (size_t)ns_strhash(e->key, e->len) & (nm.cap - 1);
        while (nm.e[j].key) j = (j + 1) & (nm.cap - 1);
        nm.e[j] = *e;
        nm.n++;
    }
    free(m->e);
    *m = nm;
    return NS_OK;
}

static inline bool ent_eq(const ns_strmap_ent *e, uint32_t h32, const char *key, size_t len) {
    if (e->hash32 != h32 || e->len != len) return false;
    size_t hl = len < NS_STRMAP_HEAD ? len : NS_STRMAP_HEAD;
    if (memcmp(e->head, key, hl) != 0) return false;
    return len <= NS_STRMAP_HEAD || memcmp(e->key + NS_STRMAP_HEAD, key + NS_STRMAP_HEAD, len - NS_STRMAP_HEAD) == 0;
}

ns_status ns_strmap_put(ns_strmap *m, const char *key, size_t len, int32_t val) {
    if (len > UINT32_MAX) return NS_ERR_RANGE;
    if ((m->n + 1) * 2 > m->cap) {
        ns_status st = strmap_grow(m);
        if (st != NS_OK) return st;
    }
    uint64_t h = ns_strhash(key, len);
    size_t j = (size_t)h & (m->cap - 1);
    for (;;) {
        ns_strmap_ent *e = &m->e[j];
        if (!e->key) {
            e->key = key;
            e->len = (uint32_t)len;
            e->hash32 = (uint32_t)(h >> 32);
            e->val = val;
            memcpy(e->head, key, len < NS_STRMAP_HEAD ? len : NS_STRMAP_HEAD);
            m->n++;
            return NS_OK;
        }
        if (ent_eq(e, (uint32_t)(h >> 32), key, len)) {
            e->val = val;
            return NS_OK;
        }
        j = (j + 1) & (m->cap - 1);
    }
}

int32_t ns_strmap_get(const ns_strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    uint64_t h = ns_strhash(key, len);
    size_t j = (size_t)h & (m->cap - 1);
    for (;;) {
        const ns_strmap_ent *e = &m->e[j];
        if (!e->key) return -1;
        if (ent_eq(e, (uint32_t)(h >> 32), key, len)) return e->val;
        j = (j + 1) & (m->cap - 1);
    }
}

/* ---- JSON ---- */

bool ns_json_int(const json_t *j, int64_t lo, int64_t hi, int64_t *out) {
    if (json_is_integer(j)) {
        json_int_t v = json_integer_value(j);
        if (v < lo || v > hi) return false;
        *out = (int64_t)v;
        return true;
    }
    if (!json_is_real(j)) return false;
    double d = json_real_value(j);
    /* Compare in double before converting: out-of-range conversion is UB. */
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d) return false;
    *out = (int64_t)d;
    return true;
}

/* ---- ids ---- */

static ns_status ids_reserve(ns_ids *a, size_t extra) {
    if (extra > SIZE_MAX / sizeof(int32_t) - a->n) return NS_ERR_NOMEM;
    return NS_VEC_GROW(a->v, a->cap, a->n + extra, 0);
}

ns_status ns_ids_push(ns_ids *a, int32_t id) {
    ns_status st = ids_reserve(a, 1);
    if (st != NS_OK) return st;
    a->v[a->n++] = id;
    return NS_OK;
}

ns_status ns_ids_append(ns_ids *a, const int32_t *ids, size_t n) {
    ns_status st = ids_reserve(a, n);
    if (st != NS_OK) return st;
    if (n) memcpy(a->v + a->n, ids, n * sizeof *ids);
    a->n += n;
    return NS_OK;
}

void ns_ids_free(ns_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- strlist ---- */

void ns_strlist_init(ns_strlist *l) {
    ns_buf_init(&l->text, 0);
    l->off = NULL;
    l->n = l->cap = 0;
}

void ns_strlist_reset(ns_strlist *l) {
    ns_buf_reset(&l->text);
    l->n = 0;
    if (l->off) l->off[0] = 0;
}

void ns_strlist_free(ns_strlist *l) {
    ns_buf_free(&l->text);
    free(l->off);
    l->off = NULL;
    l->n = l->cap = 0;
}

ns_status ns_strlist_begin(ns_strlist *l) {
    if (NS_VEC_GROW(l->off, l->cap, l->n + 2, 0) != NS_OK) return NS_ERR_NOMEM;
    l->off[l->n] = l->text.len;
    l->off[l->n + 1] = l->text.len;
    l->n++;
    return NS_OK;
}

ns_status ns_strlist_extend(ns_strlist *l, const char *s, size_t n) {
    ns_status st = ns_buf_append(&l->text, s, n);
    if (st != NS_OK) return st;
    l->off[l->n] = l->text.len;
    return NS_OK;
}

ns_status ns_strlist_push(ns_strlist *l, const char *s, size_t n) {
    ns_status st = ns_strlist_begin(l);
    if (st != NS_OK) return st;
    return ns_strlist_extend(l, s, n);
}
