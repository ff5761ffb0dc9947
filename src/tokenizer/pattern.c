#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pattern.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokutil.h"
#include "util/buf.h"
#include "util/vec.h"

struct ns_pattern {
    char *lit; /* literal bytes (NULL for a regex) */
    size_t lit_len;
    pcre2_code *re;
    bool jit;
};

/* Unicode White_Space, the meaning of \s in Oniguruma. */
#define WS_SET "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Rewrites \s / \S (see header). Tracks character classes so that \s inside
 * [...] is spliced in without brackets. \S inside a class is left to PCRE2
 * (it differs only on U+180E). Other escapes are copied verbatim. */
static ns_status rewrite_regex(const char *p, size_t n, ns_buf *out) {
    ns_status st = NS_OK;
    bool in_class = false;
    size_t class_start = 0; /* index just after '[' or '[^' */
    for (size_t i = 0; i < n && st == NS_OK; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's') st = ns_buf_puts(out, in_class ? WS_SET : "[" WS_SET "]");
            else if (d == 'S' && !in_class) st = ns_buf_puts(out, "[^" WS_SET "]");
            else st = ns_buf_append(out, p + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            st = ns_buf_putc(out, c);
            if (i + 1 < n && p[i + 1] == '^') {
                if (st == NS_OK) st = ns_buf_putc(out, '^');
                i++;
            }
            class_start = i + 1;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class [:name:] inside a bracket expression. */
            const char *end = memchr(p + i + 2, ']', n - i - 2);
            size_t stop = end ? (size_t)(end - p) : n - 1;
            st = ns_buf_append(out, p + i, stop - i + 1);
            i = stop;
            continue;
        }
        if (in_class && c == ']' && i != class_start) in_class = false;
        st = ns_buf_putc(out, c);
    }
    return st;
}

ns_status ns_pattern_literal(const char *s, size_t n, ns_pattern **out) {
    ns_pattern *p = calloc(1, sizeof *p);
    if (!p) return NS_ERR_NOMEM;
    p->lit = malloc(n + 1);
    if (!p->lit) {
        free(p);
        return NS_ERR_NOMEM;
    }
    memcpy(p->lit, s, n);
    p->lit[n] = 0;
    p->lit_len = n;
    *out = p;
    return NS_OK;
}

ns_status ns_pattern_parse(const json_t *j, const char *what, ns_pattern **out, ns_error *err) {
    *out = NULL;
    if (!json_is_object(j)) return ns_fail(err, NS_ERR_FORMAT, "%s: pattern must be an object", what);
    const json_t *s = json_object_get(j, "String");
    const json_t *r = json_object_get(j, "Regex");
    if (json_is_string(s)) {
        if (ns_pattern_literal(json_string_value(s), json_string_length(s), out) != NS_OK)
            return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", what);
        return NS_OK;
    }
    if (!json_is_string(r))
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: pattern must have a \"String\" or \"Regex\" member", what);

    ns_buf rx;
    ns_buf_init(&rx, 0);
    ns_status st = rewrite_regex(json_string_value(r), json_string_length(r), &rx);
    if (st != NS_OK) {
        ns_buf_free(&rx);
        return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", what);
    }
    int ec = 0;
    PCRE2_SIZE eo = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(rx.data ? rx.data : ""), rx.len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    ns_buf_free(&rx);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: cannot compile regex /%s/: %s", what, json_string_value(r),
                       (const char *)msg);
    }
    ns_pattern *p = calloc(1, sizeof *p);
    if (!p) {
        pcre2_code_free(re);
        return ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", what);
    }
    p->re = re;
    p->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    *out = p;
    return NS_OK;
}

void ns_pattern_free(ns_pattern *p) {
    if (!p) return;
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    free(p);
}

bool ns_pattern_is_single_char(const ns_pattern *p) {
    return p->lit && p->lit_len > 0 && ns_utf8_len((unsigned char)p->lit[0]) == p->lit_len;
}

const char *ns_pattern_lit(const ns_pattern *p, size_t *len) {
    *len = p->lit_len;
    return p->lit;
}

void ns_rx_ctx_free(ns_rx_ctx *ctx) {
    if (ctx->md) pcre2_match_data_free(ctx->md);
    if (ctx->mctx) pcre2_match_context_free(ctx->mctx);
    if (ctx->stack) pcre2_jit_stack_free(ctx->stack);
    ctx->md = ctx->mctx = ctx->stack = NULL;
}

static ns_status rx_ctx_ready(ns_rx_ctx *ctx, ns_error *err) {
    if (ctx->md) return NS_OK;
    ctx->md = pcre2_match_data_create(1, NULL);
    ctx->mctx = pcre2_match_context_create(NULL);
    /* Long runs of whitespace or letters backtrack deeply; give the JIT a
     * stack that grows up to 16 MiB instead of the 32 KiB default. */
    ctx->stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, NULL);
    if (!ctx->md || !ctx->mctx || !ctx->stack) {
        ns_rx_ctx_free(ctx);
        return ns_fail(err, NS_ERR_NOMEM, "regex: out of memory");
    }
    pcre2_jit_stack_assign(ctx->mctx, NULL, ctx->stack);
    return NS_OK;
}

ns_status ns_pattern_find(const ns_pattern *p, ns_rx_ctx *ctx, const char *s, size_t n, size_t from, bool *found,
                          size_t *ms, size_t *me, ns_error *err) {
    *found = false;
    if (p->lit) {
        if (p->lit_len == 0 || from >= n) return NS_OK;
        const char *hit = memmem(s + from, n - from, p->lit, p->lit_len);
        if (hit) {
            *found = true;
            *ms = (size_t)(hit - s);
            *me = *ms + p->lit_len;
        }
        return NS_OK;
    }
    ns_status st = rx_ctx_ready(ctx, err);
    if (st != NS_OK) return st;
    size_t at = from;
    while (at <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, ctx->md, ctx->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) return NS_OK;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ns_fail(err, rc == PCRE2_ERROR_JIT_STACKLIMIT ? NS_ERR_NOMEM : NS_ERR_INTERNAL,
                           "regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ctx->md);
        if (ov[1] > ov[0]) {
            *found = true;
            *ms = ov[0];
            *me = ov[1];
            return NS_OK;
        }
        /* Empty match: skip it and retry one character further on. */
        if (ov[0] >= n) return NS_OK;
        at = ov[0] + ns_utf8_len((unsigned char)s[ov[0]]);
    }
    return NS_OK;
}

void ns_spans_free(ns_spans *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static ns_status spans_push(ns_spans *s, size_t a, size_t b, bool m) {
    if (NS_VEC_GROW(s->v, s->cap, s->n + 1, 0) != NS_OK) return NS_ERR_NOMEM;
    s->v[s->n++] = (ns_span){a, b, m};
    return NS_OK;
}

ns_status ns_pattern_spans(const ns_pattern *p, ns_rx_ctx *ctx, const char *s, size_t n, ns_spans *out,
                           ns_error *err) {
    out->n = 0;
    size_t prev = 0;
    while (prev < n) {
        bool found;
        size_t a, b;
        ns_status st = ns_pattern_find(p, ctx, s, n, prev, &found, &a, &b, err);
        if (st != NS_OK) return st;
        if (!found) break;
        if ((a > prev && spans_push(out, prev, a, false) != NS_OK) || spans_push(out, a, b, true) != NS_OK)
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        prev = b;
    }
    if (prev < n && spans_push(out, prev, n, false) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    return NS_OK;
}
