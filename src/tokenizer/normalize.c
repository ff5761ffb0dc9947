#include "tokenizer/normalize.h"

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
    if (!strcmp(type, "NFC")) n->type = N_NFC;
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

static ns_status apply_unicode(int opts, const char *in, size_t len, ns_buf *out, ns_error *err) {
    if (all_ascii(in, len)) return ns_buf_append(out, in, len) == NS_OK ? NS_OK : ns_fail(err, NS_ERR_NOMEM, "out of memory");
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
            size_t s = b - 1;
            while (s > a && ((unsigned char)in[s] & 0xC0) == 0x80) s--;
            uint32_t cp;
            ns_utf8_decode(in, len, s, &cp);
            if (!ns_uni_is_whitespace(cp)) break;
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
