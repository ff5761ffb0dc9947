#include "template/tojson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/utf8.h"

void ns_tjson_opts_default(ns_tjson_opts *o) { memset(o, 0, sizeof *o); }

static void put_json_str(ns_tsb *b, const char *s, size_t n, int ascii) {
    ns_tsb_putc(b, '"');
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        /* ensure_ascii escapes everything outside ' '..'~' (so DEL too) */
        if (c >= 0x20 && c != '"' && c != '\\' && (ascii ? c < 0x7F : 1)) {
            i++;
            run++;
            continue;
        }
        ns_tsb_put(b, s + i - run, run);
        run = 0;
        if (c >= 0x7F) {
            uint32_t cp = ns_utf8_next(s, n, &i);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                ns_tsb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                ns_tsb_printf(b, "\\u%04x", cp);
            }
            continue;
        }
        i++;
        switch (c) {
        case '"': ns_tsb_puts(b, "\\\""); break;
        case '\\': ns_tsb_puts(b, "\\\\"); break;
        case '\n': ns_tsb_puts(b, "\\n"); break;
        case '\r': ns_tsb_puts(b, "\\r"); break;
        case '\t': ns_tsb_puts(b, "\\t"); break;
        case '\b': ns_tsb_puts(b, "\\b"); break;
        case '\f': ns_tsb_puts(b, "\\f"); break;
        default: ns_tsb_printf(b, "\\u%04x", c); break;
        }
    }
    ns_tsb_put(b, s + i - run, run);
    ns_tsb_putc(b, '"');
}

static void put_json_float(ns_tsb *b, double f) {
    if (isnan(f)) ns_tsb_puts(b, "NaN");
    else if (isinf(f)) ns_tsb_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else {
        char num[40];
        ns_tsb_put(b, num, ns_tv_fmt_float(f, num));
    }
}

static void newline_indent(ns_tsb *b, const ns_tjson_opts *o, int level) {
    ns_tsb_putc(b, '\n');
    for (int i = 0; i < level; i++) ns_tsb_put(b, o->indent, o->indent_n);
}

static void put_item_sep(ns_tsb *b, const ns_tjson_opts *o, int level) {
    if (o->item_sep) ns_tsb_put(b, o->item_sep, o->item_sep_n);
    else ns_tsb_puts(b, o->indent_set ? "," : ", ");
    if (o->indent_set) newline_indent(b, o, level);
}

static void put_key_sep(ns_tsb *b, const ns_tjson_opts *o) {
    if (o->key_sep) ns_tsb_put(b, o->key_sep, o->key_sep_n);
    else ns_tsb_puts(b, ": ");
}

/* Python converts non-string keys before writing them. */
static ns_status put_key(ns_tsb *b, const ns_tv *k, const ns_tjson_opts *o, ns_error *err) {
    char num[40];
    switch (k->kind) {
    case NS_TV_STR: put_json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii); return NS_OK;
    case NS_TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)k->u.i);
        put_json_str(b, num, strlen(num), 0);
        return NS_OK;
    case NS_TV_FLOAT:
        if (isnan(k->u.f)) snprintf(num, sizeof num, "NaN");
        else if (isinf(k->u.f)) snprintf(num, sizeof num, k->u.f < 0 ? "-Infinity" : "Infinity");
        else ns_tv_fmt_float(k->u.f, num);
        put_json_str(b, num, strlen(num), 0);
        return NS_OK;
    case NS_TV_BOOL: ns_tsb_puts(b, k->u.b ? "\"true\"" : "\"false\""); return NS_OK;
    case NS_TV_NONE: ns_tsb_puts(b, "\"null\""); return NS_OK;
    default:
        return ns_fail(err, NS_ERR_INVALID, "keys must be str, int, float, bool or None, not %s",
                       ns_tv_type_name(k));
    }
}


static ns_status sort_indices(const ns_tdict *d, size_t *ord, ns_error *err) {
    /* insertion sort is fine: dicts printed by templates are small, and a
     * stable order keeps equal-comparing keys (1 and 1.0) as inserted */
    for (size_t i = 0; i < d->n; i++) ord[i] = i;
    for (size_t i = 1; i < d->n; i++) {
        size_t cur = ord[i], j = i;
        while (j > 0) {
            int c;
            ns_status st = ns_tv_cmp(&d->keys[ord[j - 1]], &d->keys[cur], &c, err);
            if (st != NS_OK) return st;
            if (c <= 0) break;
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = cur;
    }
    return NS_OK;
}

static ns_status dump(ns_tsb *b, const ns_tv *v, const ns_tjson_opts *o, int level, ns_error *err) {
    if (level > NS_TV_MAX_DEPTH) return ns_fail(err, NS_ERR_RANGE, "tojson: value nested too deeply");
    char num[40];
    switch (v->kind) {
    case NS_TV_NONE: ns_tsb_puts(b, "null"); return NS_OK;
    case NS_TV_BOOL: ns_tsb_puts(b, v->u.b ? "true" : "false"); return NS_OK;
    case NS_TV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        ns_tsb_puts(b, num);
        return NS_OK;
    case NS_TV_FLOAT: put_json_float(b, v->u.f); return NS_OK;
    case NS_TV_STR: put_json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii); return NS_OK;
    case NS_TV_LIST: {
        const ns_tlist *l = v->u.l;
        if (l->n == 0) {
            ns_tsb_puts(b, "[]");
            return NS_OK;
        }
        ns_tsb_putc(b, '[');
        if (o->indent_set) newline_indent(b, o, level + 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i) put_item_sep(b, o, level + 1);
            ns_status st = dump(b, &l->v[i], o, level + 1, err);
            if (st != NS_OK) return st;
        }
        if (o->indent_set) newline_indent(b, o, level);
        ns_tsb_putc(b, ']');
        return NS_OK;
    }
    case NS_TV_DICT: {
        const ns_tdict *d = v->u.d;
        if (d->n == 0) {
            ns_tsb_puts(b, "{}");
            return NS_OK;
        }
        size_t *ord = NULL;
        if (o->sort_keys) {
            ord = ns_tarena_alloc(b->a, d->n * sizeof *ord);
            if (!ord) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
            ns_status st = sort_indices(d, ord, err);
            if (st != NS_OK) return st;
        }
        ns_tsb_putc(b, '{');
        if (o->indent_set) newline_indent(b, o, level + 1);
        for (size_t i = 0; i < d->n; i++) {
            size_t k = ord ? ord[i] : i;
            if (i) put_item_sep(b, o, level + 1);
            ns_status st = put_key(b, &d->keys[k], o, err);
            if (st != NS_OK) return st;
            put_key_sep(b, o);
            st = dump(b, &d->vals[k], o, level + 1, err);
            if (st != NS_OK) return st;
        }
        if (o->indent_set) newline_indent(b, o, level);
        ns_tsb_putc(b, '}');
        return NS_OK;
    }
    default:
        return ns_fail(err, NS_ERR_INVALID, "Object of type %s is not JSON serializable", ns_tv_type_name(v));
    }
}

ns_status ns_tv_tojson(ns_tsb *b, const ns_tv *v, const ns_tjson_opts *o, ns_error *err) {
    return dump(b, v, o, 0, err);
}
