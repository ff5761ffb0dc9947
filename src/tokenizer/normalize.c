#include "tokenizer/normalize.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tokutil.h"

typedef enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_SEQ, N_PREPEND, N_REPLACE, N_LOWER, N_STRIP } norm_type;

struct ns_normalizer {
    norm_type type;
    ns_normalizer **kids; /* N_SEQ */
    size_t n_kids;
    char *str; /* N_PREPEND: prefix; N_REPLACE: content */
    size_t str_len;
    ns_pattern *pat; /* N_REPLACE */
    bool left, right; /* N_STRIP */
};

void ns_normalizer_free(ns_normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_kids; i++) ns_normalizer_free(n->kids[i]);
    free(n->kids);
    free(n->str);
    ns_pattern_free(n->pat);
    free(n);
}

/* NFC fast path. A character is "inert" when it has combining class 0, no
 * canonical decomposition, and is never the second element of a canonical
 * composition: NFC leaves it alone and nothing before it can reorder or
 * compose across it. So text can be cut before every inert character and
 * each piece normalized on its own; pieces that are one inert character are
 * copied. (Over-approximating "not inert" is always safe: it only sends more
 * text through utf8proc.) */
static uint8_t g_inert[0x110000 / 8];
static pthread_once_t g_inert_once = PTHREAD_ONCE_INIT;

static void mark(uint32_t cp, bool inert) {
    if (inert) g_inert[cp >> 3] |= (uint8_t)(1u << (cp & 7));
    else g_inert[cp >> 3] &= (uint8_t)~(1u << (cp & 7));
}

/* Planes 4-13 hold no assigned characters and 15-16 only private use:
 * all inert, so only planes 0-3 and 14 are examined (keeps this ~5 ms). */
static bool plane_examined(uint32_t cp) { return cp < 0x40000 || (cp >= 0xE0000 && cp < 0xF0000); }

static void build_inert(void) {
    memset(g_inert, 0xFF, sizeof g_inert);
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (!plane_examined(cp)) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        bool canon = p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0;
        mark(cp, p->combining_class == 0 && !canon);
    }
    /* Every non-first character of a canonical decomposition may be a
     * composition's second element. */
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (!plane_examined(cp)) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue;
        utf8proc_int32_t d[8];
        int bc = 0;
        utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 8, UTF8PROC_DECOMPOSE, &bc);
        for (utf8proc_ssize_t i = 1; i < k && i < 8; i++) mark((uint32_t)d[i], false);
    }
    /* Hangul: syllables are stable; medial vowels and finals compose backwards. */
    for (uint32_t cp = 0xAC00; cp <= 0xD7A3; cp++) mark(cp, true);
    for (uint32_t cp = 0x1161; cp <= 0x1175; cp++) mark(cp, false);
    for (uint32_t cp = 0x11A8; cp <= 0x11C2; cp++) mark(cp, false);
}

static char *dup_str(const json_t *s, size_t *len) {
    size_t n = json_string_length(s);
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, json_string_value(s), n + 1);
    *len = n;
    return p;
}

ns_status ns_normalizer_parse(const json_t *j, ns_normalizer **out, ns_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return NS_OK;
    if (!json_is_object(j)) return ns_fail(err, NS_ERR_FORMAT, "normalizer must be an object or null");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return ns_fail(err, NS_ERR_FORMAT, "normalizer has no \"type\"");
    ns_normalizer *n = calloc(1, sizeof *n);
    if (!n) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status st = NS_OK;
    if (!strcmp(type, "NFC")) {
        n->type = N_NFC;
        pthread_once(&g_inert_once, build_inert); /* at load time, not on the first request */
    }
    else if (!strcmp(type, "NFD")) n->type = N_NFD;
    else if (!strcmp(type, "NFKC")) n->type = N_NFKC;
    else if (!strcmp(type, "NFKD")) n->type = N_NFKD;
    else if (!strcmp(type, "Lowercase")) n->type = N_LOWER;
    else if (!strcmp(type, "Sequence")) {
        n->type = N_SEQ;
        const json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) {
            st = ns_fail(err, NS_ERR_FORMAT, "normalizer Sequence needs a \"normalizers\" array");
            goto done;
        }
        size_t cnt = json_array_size(arr);
        n->kids = calloc(cnt ? cnt : 1, sizeof *n->kids);
        if (!n->kids) {
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < cnt; i++) {
            if ((st = ns_normalizer_parse(json_array_get(arr, i), &n->kids[i], err)) != NS_OK) goto done;
            n->n_kids++;
        }
    } else if (!strcmp(type, "Prepend")) {
        n->type = N_PREPEND;
        const json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) {
            st = ns_fail(err, NS_ERR_FORMAT, "normalizer Prepend needs a \"prepend\" string");
            goto done;
        }
        if (!(n->str = dup_str(p, &n->str_len))) st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
    } else if (!strcmp(type, "Replace")) {
        n->type = N_REPLACE;
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(c)) {
            st = ns_fail(err, NS_ERR_FORMAT, "normalizer Replace needs a \"content\" string");
            goto done;
        }
        if (!(n->str = dup_str(c, &n->str_len))) {
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        st = ns_pattern_parse(json_object_get(j, "pattern"), "normalizer Replace", &n->pat, err);
    } else if (!strcmp(type, "Strip")) {
        n->type = N_STRIP;
        n->left = json_is_true(json_object_get(j, "strip_left"));
        n->right = json_is_true(json_object_get(j, "strip_right"));
    } else {
        st = ns_fail(err, NS_ERR_UNSUPPORTED, "normalizer type \"%s\" is not supported", type);
    }
done:
    if (st != NS_OK) {
        ns_normalizer_free(n);
        return st;
    }
    *out = n;
    return NS_OK;
}

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* One step: reads in[0..len), writes the result to out (reset first). */
static ns_status apply(const ns_normalizer *n, ns_rx_ctx *ctx, const char *in, size_t len, ns_buf *out,
                       ns_error *err);

static inline bool inert(uint32_t cp) { return cp < 0x80 || (g_inert[cp >> 3] >> (cp & 7)) & 1; }

static ns_status map_piece(int opts, const char *in, size_t len, ns_buf *out, ns_error *err);

static ns_status nfc_fast(const char *in, size_t len, ns_buf *out, ns_error *err) {
    pthread_once(&g_inert_once, build_inert);
    size_t copy_from = 0; /* [copy_from, piece) are inert characters, copied as is */
    size_t i = 0;
    while (i < len) {
        size_t piece = i;
        uint32_t cp;
        i += ns_utf8_decode(in, len, i, &cp);
        /* The piece runs until the next inert character. */
        size_t j = i;
        while (j < len) {
            uint32_t c2;
            size_t l = ns_utf8_decode(in, len, j, &c2);
            if (inert(c2)) break;
            j += l;
        }
        if (j == i && inert(cp)) continue; /* a lone inert character */
        if (ns_buf_append(out, in + copy_from, piece - copy_from) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        ns_status st = map_piece(UTF8PROC_COMPOSE, in + piece, j - piece, out, err);
        if (st != NS_OK) return st;
        i = copy_from = j;
    }
    return ns_buf_append(out, in + copy_from, len - copy_from) == NS_OK ? NS_OK
                                                                         : ns_fail(err, NS_ERR_NOMEM, "out of memory");
}

/* True when NFC leaves in[0..len) unchanged: nfc_fast's walk, comparing
 * each non-inert piece's normalization with the piece instead of copying
 * the text (scratch: one piece). */
static bool nfc_identity(const char *in, size_t len) {
    pthread_once(&g_inert_once, build_inert);
    ns_buf tmp;
    ns_buf_init(&tmp, 0);
    bool same = true;
    size_t i = 0;
    while (same && i < len) {
        size_t piece = i;
        uint32_t cp;
        i += ns_utf8_decode(in, len, i, &cp);
        size_t j = i;
        while (j < len) {
            uint32_t c2;
            size_t l = ns_utf8_decode(in, len, j, &c2);
            if (inert(c2)) break;
            j += l;
        }
        if (j == i && inert(cp)) continue;
        ns_buf_reset(&tmp);
        same = map_piece(UTF8PROC_COMPOSE, in + piece, j - piece, &tmp, NULL) == NS_OK && tmp.len == j - piece &&
               memcmp(tmp.data, in + piece, tmp.len) == 0;
        i = j;
    }
    ns_buf_free(&tmp);
    return same;
}

bool ns_normalize_is_identity(const ns_normalizer *n, const char *s, size_t len) {
    if (!n) return true;
    switch (n->type) {
    case N_NFC: return all_ascii(s, len) || nfc_identity(s, len);
    case N_NFD:
    case N_NFKC:
    case N_NFKD: return all_ascii(s, len);
    case N_LOWER:
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)s[i] >= 0x80 || (s[i] >= 'A' && s[i] <= 'Z')) return false;
        return true;
    case N_SEQ: /* each step sees the unchanged text when every step before left it so */
        for (size_t i = 0; i < n->n_kids; i++)
            if (!ns_normalize_is_identity(n->kids[i], s, len)) return false;
        return true;
    default: return false; /* Prepend, Replace, Strip: unsure, normalize */
    }
}

static ns_status apply_unicode(int opts, const char *in, size_t len, ns_buf *out, ns_error *err) {
    if (all_ascii(in, len)) return ns_buf_append(out, in, len) == NS_OK ? NS_OK : ns_fail(err, NS_ERR_NOMEM, "out of memory");
    if (opts == UTF8PROC_COMPOSE) return nfc_fast(in, len, out, err);
    return map_piece(opts, in, len, out, err);
}

static ns_status map_piece(int opts, const char *in, size_t len, ns_buf *out, ns_error *err) {
    if (len > (size_t)PTRDIFF_MAX) return ns_fail(err, NS_ERR_RANGE, "input too large");
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | opts));
    if (r < 0) {
        free(dst);
        return ns_fail(err, r == UTF8PROC_ERROR_NOMEM ? NS_ERR_NOMEM : NS_ERR_INVALID,
                       "unicode normalization failed: %s", utf8proc_errmsg(r));
    }
    ns_status st = ns_buf_append(out, dst, (size_t)r);
    free(dst);
    return st == NS_OK ? NS_OK : ns_fail(err, NS_ERR_NOMEM, "out of memory");
}

static ns_status apply_lower(const char *in, size_t len, ns_buf *out) {
    ns_status st = NS_OK;
    for (size_t i = 0; i < len && st == NS_OK;) {
        uint32_t cp;
        size_t l = ns_utf8_decode(in, len, i, &cp);
        i += l;
        char b[4];
        if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
            st = ns_buf_append(out, "i\xCC\x87", 3);
            continue;
        }
        uint32_t lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        st = ns_buf_append(out, b, ns_utf8_encode(lc, b));
    }
    return st;
}

static ns_status apply_strip(const ns_normalizer *n, const char *in, size_t len, ns_buf *out) {
    size_t a = 0, b = len;
    if (n->left) {
        while (a < b) {
            uint32_t cp;
            size_t l = ns_utf8_decode(in, len, a, &cp);
            if (!ns_uni_is_whitespace(cp)) break;
            a += l;
        }
    }
    if (n->right) {
        while (b > a) {
            size_t s = b;
            if (!ns_uni_is_whitespace(ns_utf8_prev(in, &s))) break;
            b = s;
        }
    }
    return ns_buf_append(out, in + a, b - a);
}

static ns_status apply_replace(const ns_normalizer *n, ns_rx_ctx *ctx, const char *in, size_t len, ns_buf *out,
                               ns_error *err) {
    ns_spans sp = {0};
    ns_status st = ns_pattern_spans(n->pat, ctx, in, len, &sp, err);
    for (size_t i = 0; i < sp.n && st == NS_OK; i++) {
        if (sp.v[i].match) st = ns_buf_append(out, n->str, n->str_len);
        else st = ns_buf_append(out, in + sp.v[i].start, sp.v[i].end - sp.v[i].start);
        if (st != NS_OK) st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    ns_spans_free(&sp);
    return st;
}

static ns_status apply(const ns_normalizer *n, ns_rx_ctx *ctx, const char *in, size_t len, ns_buf *out,
                       ns_error *err) {
    ns_buf_reset(out);
    ns_status st = NS_OK;
    switch (n->type) {
    case N_NFC: return apply_unicode(UTF8PROC_COMPOSE, in, len, out, err);
    case N_NFD: return apply_unicode(UTF8PROC_DECOMPOSE, in, len, out, err);
    case N_NFKC: return apply_unicode(UTF8PROC_COMPOSE | UTF8PROC_COMPAT, in, len, out, err);
    case N_NFKD: return apply_unicode(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, in, len, out, err);
    case N_PREPEND:
        if (len > 0) st = ns_buf_append(out, n->str, n->str_len);
        if (st == NS_OK) st = ns_buf_append(out, in, len);
        break;
    case N_REPLACE: return apply_replace(n, ctx, in, len, out, err);
    case N_LOWER: st = apply_lower(in, len, out); break;
    case N_STRIP: st = apply_strip(n, in, len, out); break;
    case N_SEQ: {
        /* Ping-pong between out and a temporary buffer. */
        ns_buf tmp;
        ns_buf_init(&tmp, 0);
        st = ns_buf_append(out, in, len);
        for (size_t i = 0; i < n->n_kids && st == NS_OK; i++) {
            st = apply(n->kids[i], ctx, out->data ? out->data : "", out->len, &tmp, err);
            if (st == NS_OK) {
                ns_buf t = *out;
                *out = tmp;
                tmp = t;
            }
        }
        ns_buf_free(&tmp);
        return st;
    }
    }
    return st == NS_OK ? NS_OK : ns_fail(err, st, "normalizer: out of memory");
}

ns_status ns_normalize(const ns_normalizer *n, ns_rx_ctx *ctx, const char *s, size_t len, ns_buf *out,
                       ns_error *err) {
    if (!n) {
        ns_buf_reset(out);
        return ns_buf_append(out, s, len) == NS_OK ? NS_OK : ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    return apply(n, ctx, s, len, out, err);
}
