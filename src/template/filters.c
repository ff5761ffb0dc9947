#include "template/filters.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "template/lexer.h"
#include "template/methods.h"
#include "template/ops.h"
#include "template/tojson.h"
#include "template/ustr.h"
#include "util/utf8.h"

static int name_is(const char *a, size_t n, const char *lit) { return strlen(lit) == n && memcmp(a, lit, n) == 0; }

/* Binds positional and keyword arguments to a filter's parameter names. */
static ns_status bind(ns_tctx *c, const char *fname, const ns_tcallargs *a, const char *const *params, size_t np,
                      const ns_tv **slots) {
    if (a->npos > np)
        return ns_trt_fail(c, NS_ERR_INVALID, "too many arguments for filter '%s' (takes at most %zu)", fname, np);
    for (size_t i = 0; i < np; i++) slots[i] = i < a->npos ? &a->pos[i] : NULL;
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (name_is(a->kw_names[k].p, a->kw_names[k].n, params[i])) break;
        if (i == np)
            return ns_trt_fail(c, NS_ERR_INVALID, "filter '%s' got an unexpected keyword argument '%.*s'", fname,
                               (int)a->kw_names[k].n, a->kw_names[k].p);
        if (slots[i])
            return ns_trt_fail(c, NS_ERR_INVALID, "filter '%s' got multiple values for argument '%s'", fname, params[i]);
        slots[i] = &a->kw[k];
    }
    return NS_OK;
}

static int truthy_opt(const ns_tv *v, int def) { return v ? ns_tv_truthy(v) : def; }

static ns_status want_str(ns_tctx *c, const ns_tv *v, const char *what) {
    if (v->kind == NS_TV_STR) return NS_OK;
    if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
    return ns_trt_fail(c, NS_ERR_INVALID, "%s must be a string, not %s", what, ns_tv_type_name(v));
}

static ns_status to_str(ns_tctx *c, const ns_tv *v, ns_tv *out) { return ns_tv_to_str(c->a, v, out, c->err); }

static ns_tv list_val(ns_tlist *l) {
    ns_tv v = {0};
    v.kind = NS_TV_LIST;
    v.u.l = l;
    return v;
}

/* Jinja's ignore_case postprocessing for sort/unique/min/max keys. */
static ns_status fold_key(ns_tctx *c, const ns_tv *v, int case_sensitive, ns_tv *out) {
    if (!case_sensitive && v->kind == NS_TV_STR) return ns_tstr_case(c, v, NS_TCASE_LOWER, out);
    *out = *v;
    return NS_OK;
}

/* Keys for sort/unique/min/max: optional attribute path, then case fold. */
static ns_status make_keys(ns_tctx *c, const ns_tlist *items, const ns_tv *attribute, int case_sensitive,
                           ns_tv **keys_out) {
    ns_tv *keys = ns_tarena_alloc(c->a, (items->n ? items->n : 1) * sizeof *keys);
    if (!keys) return ns_toom(c);
    ns_status st = ns_tstep(c, items->n);
    if (st != NS_OK) return st;
    for (size_t i = 0; i < items->n; i++) {
        ns_tv k = items->v[i];
        if (attribute && attribute->kind != NS_TV_NONE && (st = ns_tgetattr_path(c, &items->v[i], attribute, &k)) != NS_OK)
            return st;
        if ((st = fold_key(c, &k, case_sensitive, &keys[i])) != NS_OK) return st;
    }
    *keys_out = keys;
    return NS_OK;
}

static ns_status key_cmp(ns_tctx *c, const ns_tv *a, const ns_tv *b, int *res) {
    if (a->kind == NS_TV_UNDEF) return ns_tundef_fail(c, a);
    if (b->kind == NS_TV_UNDEF) return ns_tundef_fail(c, b);
    ns_status st = ns_tv_cmp(a, b, res, c->err);
    if (st == NS_ERR_INVALID)
        return ns_trt_fail(c, st, "'<' not supported between instances of '%s' and '%s'", ns_tv_type_name(a),
                           ns_tv_type_name(b));
    return st;
}

/* Stable merge sort of idx[0..n) by keys; reverse keeps equal items in order
 * like Python's sorted(reverse=True). */
static ns_status merge_sort(ns_tctx *c, const ns_tv *keys, size_t *idx, size_t *tmp, size_t n, int reverse) {
    if (n < 2) return NS_OK;
    size_t h = n / 2;
    ns_status st = merge_sort(c, keys, idx, tmp, h, reverse);
    if (st == NS_OK) st = merge_sort(c, keys, idx + h, tmp, n - h, reverse);
    if (st != NS_OK) return st;
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int r;
        if ((st = key_cmp(c, &keys[idx[j]], &keys[idx[i]], &r)) != NS_OK) return st;
        /* take from the right only when strictly before the left item */
        if (reverse ? r > 0 : r < 0) tmp[o++] = idx[j++];
        else tmp[o++] = idx[i++];
    }
    while (i < h) tmp[o++] = idx[i++];
    while (j < n) tmp[o++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return NS_OK;
}

static ns_status sorted_order(ns_tctx *c, const ns_tv *keys, size_t n, int reverse, size_t **order) {
    size_t *idx = ns_tarena_alloc(c->a, (n ? n : 1) * sizeof *idx);
    size_t *tmp = ns_tarena_alloc(c->a, (n ? n : 1) * sizeof *tmp);
    if (!idx || !tmp) return ns_toom(c);
    for (size_t i = 0; i < n; i++) idx[i] = i;
    ns_status st = ns_tstep(c, n * 8);
    if (st == NS_OK) st = merge_sort(c, keys, idx, tmp, n, reverse);
    *order = idx;
    return st;
}

/* ---- numeric parsing like Python's int()/float() --------------------------------- */

/* Copies s without surrounding whitespace and with digit-separating
 * underscores removed; returns 0 when underscores are misplaced. */
static int clean_number(const ns_tv *s, char *buf, size_t cap) {
    const char *p = s->u.s.p;
    size_t lo = 0, hi = s->u.s.n;
    while (lo < hi && (p[lo] == ' ' || (p[lo] >= '\t' && p[lo] <= '\r'))) lo++;
    while (hi > lo && (p[hi - 1] == ' ' || (p[hi - 1] >= '\t' && p[hi - 1] <= '\r'))) hi--;
    if (hi - lo + 1 > cap) return 0;
    size_t o = 0;
    for (size_t i = lo; i < hi; i++) {
        if (p[i] == '_') {
            int ok = i > lo && i + 1 < hi && isalnum((unsigned char)p[i - 1]) && isalnum((unsigned char)p[i + 1]);
            if (!ok) return 0;
            continue;
        }
        buf[o++] = p[i];
    }
    buf[o] = 0;
    return 1;
}

static int py_float(const ns_tv *s, double *out) {
    char buf[128];
    if (!clean_number(s, buf, sizeof buf) || !buf[0]) return 0;
    const char *q = buf;
    if (*q == '+' || *q == '-') q++;
    if (!strcasecmp(q, "inf") || !strcasecmp(q, "infinity") || !strcasecmp(q, "nan")) {
        *out = strtod(buf, NULL);
        return 1;
    }
    /* digits [. digits] [e [sign] digits], at least one digit in mantissa */
    const char *r = q;
    int digits = 0;
    while (*r >= '0' && *r <= '9') r++, digits++;
    if (*r == '.') {
        r++;
        while (*r >= '0' && *r <= '9') r++, digits++;
    }
    if (!digits) return 0;
    if (*r == 'e' || *r == 'E') {
        r++;
        if (*r == '+' || *r == '-') r++;
        if (!(*r >= '0' && *r <= '9')) return 0;
        while (*r >= '0' && *r <= '9') r++;
    }
    if (*r) return 0;
    *out = strtod(buf, NULL);
    return 1;
}

static int py_int(const ns_tv *s, int base, int64_t *out, int *overflow) {
    char buf[128];
    *overflow = 0;
    if (!clean_number(s, buf, sizeof buf) || !buf[0]) return 0;
    const char *q = buf;
    int neg = 0;
    if (*q == '+' || *q == '-') neg = *q++ == '-';
    if (q[0] == '0' && q[1] && strchr("xXoObB", q[1])) {
        int pb = (q[1] | 32) == 'x' ? 16 : (q[1] | 32) == 'o' ? 8 : 2;
        if (base == 0 || base == pb) {
            base = pb;
            q += 2;
        }
    }
    if (base == 0) base = 10;
    if (!*q) return 0;
    for (const char *r = q; *r; r++) {
        int d = *r >= '0' && *r <= '9' ? *r - '0' : (*r | 32) >= 'a' && (*r | 32) <= 'z' ? (*r | 32) - 'a' + 10 : 99;
        if (d >= base) return 0;
    }
    errno = 0;
    unsigned long long v = strtoull(q, NULL, base);
    if (errno == ERANGE || v > (unsigned long long)INT64_MAX + (unsigned)neg) {
        *overflow = 1;
        return 0;
    }
    *out = neg ? (int64_t)(0ULL - v) : (int64_t)v;
    return 1;
}

/* ---- filters ------------------------------------------------------------------------ */

static ns_status f_int(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"default", "base"};
    const ns_tv *s[2];
    ns_status st = bind(c, "int", a, P, 2, s);
    if (st != NS_OK) return st;
    int64_t base = 10;
    if (s[1] && (st = ns_twant_int(c, s[1], "base", &base)) != NS_OK) return st;
    ns_tv def = s[0] ? *s[0] : ns_tv_int(0);
    switch (v->kind) {
    case NS_TV_INT: *out = *v; return NS_OK;
    case NS_TV_BOOL: *out = ns_tv_int(v->u.b); return NS_OK;
    case NS_TV_FLOAT:
        if (isnan(v->u.f) || isinf(v->u.f)) return ns_trt_fail(c, NS_ERR_INVALID, "cannot convert float to integer");
        if (fabs(v->u.f) >= 9.2e18) return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
        *out = ns_tv_int((int64_t)v->u.f);
        return NS_OK;
    case NS_TV_STR: {
        int64_t iv;
        int of;
        if (py_int(v, (int)base, &iv, &of)) {
            *out = ns_tv_int(iv);
            return NS_OK;
        }
        if (of) return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
        double d;
        if (py_float(v, &d)) {
            if (isnan(d) || isinf(d)) return ns_trt_fail(c, NS_ERR_INVALID, "cannot convert float to integer");
            if (fabs(d) >= 9.2e18) return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
            *out = ns_tv_int((int64_t)d);
            return NS_OK;
        }
        *out = def;
        return NS_OK;
    }
    default: *out = def; return NS_OK;
    }
}

static ns_status f_float(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"default"};
    const ns_tv *s[1];
    ns_status st = bind(c, "float", a, P, 1, s);
    if (st != NS_OK) return st;
    double d;
    if (ns_tv_is_num(v)) *out = ns_tv_float(ns_tv_num(v));
    else if (v->kind == NS_TV_STR && py_float(v, &d)) *out = ns_tv_float(d);
    else *out = s[0] ? *s[0] : ns_tv_float(0.0);
    return NS_OK;
}

static ns_status f_length(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    int64_t n = ns_tv_len(v);
    if (n < 0) return ns_trt_fail(c, NS_ERR_INVALID, "object of type '%s' has no len()", ns_tv_type_name(v));
    *out = ns_tv_int(n);
    return NS_OK;
}

static ns_status f_tojson(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    const ns_tv *s[4];
    ns_status st = bind(c, "tojson", a, P, 4, s);
    if (st != NS_OK) return st;
    ns_tjson_opts o;
    ns_tjson_opts_default(&o);
    o.ensure_ascii = truthy_opt(s[0], 0);
    o.sort_keys = truthy_opt(s[3], 0);
    if (s[1] && s[1]->kind != NS_TV_NONE) {
        o.indent_set = 1;
        if (s[1]->kind == NS_TV_STR) {
            o.indent = s[1]->u.s.p;
            o.indent_n = s[1]->u.s.n;
        } else {
            int64_t w;
            if ((st = ns_twant_int(c, s[1], "indent", &w)) != NS_OK) return st;
            if (w > 1024) w = 1024;
            if (w < 0) w = 0;
            char *sp = ns_tarena_alloc(c->a, (size_t)w + 1);
            if (!sp) return ns_toom(c);
            memset(sp, ' ', (size_t)w);
            o.indent = sp;
            o.indent_n = (size_t)w;
        }
    }
    if (s[2] && s[2]->kind != NS_TV_NONE) {
        const ns_tv *sep = s[2];
        if (sep->kind != NS_TV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].kind != NS_TV_STR ||
            sep->u.l->v[1].kind != NS_TV_STR)
            return ns_trt_fail(c, NS_ERR_INVALID, "tojson separators must be a pair of strings");
        o.item_sep = sep->u.l->v[0].u.s.p;
        o.item_sep_n = sep->u.l->v[0].u.s.n;
        o.key_sep = sep->u.l->v[1].u.s.p;
        o.key_sep_n = sep->u.l->v[1].u.s.n;
    }
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    if ((st = ns_tv_tojson(&b, v, &o, c->err)) != NS_OK) return st;
    return ns_tsb_finish(&b, out, c->err);
}

static ns_status f_default(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"default_value", "boolean"};
    const ns_tv *s[2];
    ns_status st = bind(c, "default", a, P, 2, s);
    if (st != NS_OK) return st;
    if (v->kind == NS_TV_UNDEF || (truthy_opt(s[1], 0) && !ns_tv_truthy(v)))
        *out = s[0] ? *s[0] : ns_tv_str("", 0);
    else
        *out = *v;
    return NS_OK;
}

static ns_status f_join(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"d", "attribute"};
    const ns_tv *s[2];
    ns_status st = bind(c, "join", a, P, 2, s);
    if (st != NS_OK) return st;
    ns_tv sep = ns_tv_str("", 0);
    if (s[0] && (st = to_str(c, s[0], &sep)) != NS_OK) return st;
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    if ((st = ns_tstep(c, items->n)) != NS_OK) return st;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    for (size_t i = 0; i < items->n; i++) {
        ns_tv it = items->v[i];
        if (s[1] && s[1]->kind != NS_TV_NONE && (st = ns_tgetattr_path(c, &it, s[1], &it)) != NS_OK) return st;
        if (i) ns_tsb_put(&b, sep.u.s.p, sep.u.s.n);
        ns_tv_str_append(&b, &it);
    }
    return ns_tsb_finish(&b, out, c->err);
}

static ns_status f_first_last(ns_tctx *c, const ns_tv *v, int last, ns_tv *out) {
    const ns_tlist *items;
    if (v->kind == NS_TV_STR && v->u.s.n) {
        size_t i = last ? v->u.s.n : 0, j;
        if (last) {
            ns_utf8_prev(v->u.s.p, &i);
            j = v->u.s.n;
        } else {
            j = 0;
            ns_utf8_next(v->u.s.p, v->u.s.n, &j);
        }
        *out = ns_tv_str(v->u.s.p + i, j - i);
        return NS_OK;
    }
    ns_status st = ns_titer(c, v, &items);
    if (st != NS_OK) return st;
    if (!items->n) {
        *out = ns_tmk_undef(c, last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
        return NS_OK;
    }
    *out = items->v[last ? items->n - 1 : 0];
    return NS_OK;
}

static ns_status f_list(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    const ns_tlist *items;
    ns_status st = ns_titer(c, v, &items);
    if (st != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, items->n, 0);
    if (!l) return ns_toom(c);
    if (items->n) memcpy(l->v, items->v, items->n * sizeof(ns_tv));
    *out = list_val(l);
    return NS_OK;
}

static ns_status f_items(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    if (v->kind == NS_TV_UNDEF) {
        ns_tlist *l = ns_tlist_new(c->a, 0, 0);
        if (!l) return ns_toom(c);
        *out = list_val(l);
        return NS_OK;
    }
    if (v->kind != NS_TV_DICT) return ns_trt_fail(c, NS_ERR_INVALID, "Can only get item pairs from a mapping.");
    ns_tmethod m = {*v, "items", 5};
    ns_tcallargs none = {0};
    return ns_tmethod_call(c, &m, &none, out);
}

static ns_status f_indent(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"width", "first", "blank"};
    const ns_tv *s[3];
    ns_status st = bind(c, "indent", a, P, 3, s);
    if (st != NS_OK) return st;
    ns_tv ind;
    if (s[0] && s[0]->kind == NS_TV_STR) {
        ind = *s[0];
    } else {
        int64_t w = 4;
        if (s[0] && (st = ns_twant_int(c, s[0], "indent width", &w)) != NS_OK) return st;
        if (w < 0) w = 0;
        if (w > 4096) w = 4096;
        char *sp = ns_tarena_alloc(c->a, (size_t)w + 1);
        if (!sp) return ns_toom(c);
        memset(sp, ' ', (size_t)w);
        ind = ns_tv_str(sp, (size_t)w);
    }
    int first = truthy_opt(s[1], 0), blank = truthy_opt(s[2], 0);
    /* Jinja starts with `s += "\n"`, which only strings survive */
    if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
    if (v->kind != NS_TV_STR)
        return ns_trt_fail(c, NS_ERR_INVALID, "unsupported operand type(s) for +=: '%s' and 'str'", ns_tv_type_name(v));
    ns_tv text = *v;
    /* Jinja appends "\n" before splitlines() so a trailing newline survives */
    char *tmp = ns_tarena_alloc(c->a, text.u.s.n + 2);
    if (!tmp) return ns_toom(c);
    memcpy(tmp, text.u.s.p, text.u.s.n);
    tmp[text.u.s.n] = '\n';
    ns_tv with_nl = ns_tv_str(tmp, text.u.s.n + 1), lines;
    if ((st = ns_tstr_splitlines(c, &with_nl, 0, &lines)) != NS_OK) return st;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    if (first) ns_tsb_put(&b, ind.u.s.p, ind.u.s.n);
    const ns_tlist *l = lines.u.l;
    for (size_t i = 0; i < l->n; i++) {
        const ns_tv *ln = &l->v[i];
        if (i) {
            ns_tsb_putc(&b, '\n');
            if (blank || ln->u.s.n) ns_tsb_put(&b, ind.u.s.p, ind.u.s.n);
        }
        ns_tsb_put(&b, ln->u.s.p, ln->u.s.n);
    }
    return ns_tsb_finish(&b, out, c->err);
}

/* Arguments for a nested filter/test call: args from index `from` on. */
static ns_tcallargs tail_args(const ns_tcallargs *a, size_t from) {
    ns_tcallargs t = *a;
    t.pos = a->npos > from ? a->pos + from : NULL;
    t.npos = a->npos > from ? a->npos - from : 0;
    return t;
}

/* Jinja's map/select family start with `if value:`, so a falsy input
 * (None, 0, "", Undefined) yields nothing instead of failing. */
static ns_status iter_truthy(ns_tctx *c, const ns_tv *v, const ns_tlist **items) {
    static const ns_tlist empty = {0, 0, NULL};
    if (!ns_tv_truthy(v)) {
        *items = &empty;
        return NS_OK;
    }
    return ns_titer(c, v, items);
}

static ns_status f_map(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    const ns_tlist *items;
    ns_status st = iter_truthy(c, v, &items);
    if (st != NS_OK) return st;
    if ((st = ns_tstep(c, items->n)) != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, items->n, 0);
    if (!l) return ns_toom(c);
    const ns_tv *attr = ns_targ_kw(a, "attribute");
    if (attr) {
        const ns_tv *def = ns_targ_kw(a, "default");
        for (size_t i = 0; i < items->n; i++) {
            if ((st = ns_tgetattr_path(c, &items->v[i], attr, &l->v[i])) != NS_OK) return st;
            if (def && l->v[i].kind == NS_TV_UNDEF) l->v[i] = *def;
        }
    } else {
        if (!a->npos || a->pos[0].kind != NS_TV_STR) return ns_trt_fail(c, NS_ERR_INVALID, "map requires a filter name");
        ns_tcallargs sub = tail_args(a, 1);
        for (size_t i = 0; i < items->n; i++)
            if ((st = ns_tfilter(c, a->pos[0].u.s.p, a->pos[0].u.s.n, &items->v[i], &sub, &l->v[i])) != NS_OK) return st;
    }
    *out = list_val(l);
    return NS_OK;
}

/* select/reject (attr_mode 0) and selectattr/rejectattr (attr_mode 1). */
static ns_status f_select(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, int want, int attr_mode, ns_tv *out) {
    const ns_tlist *items;
    ns_status st = iter_truthy(c, v, &items);
    if (st != NS_OK) return st;
    if ((st = ns_tstep(c, items->n)) != NS_OK) return st;
    size_t ti = attr_mode ? 1 : 0;
    if (attr_mode && !a->npos) return ns_trt_fail(c, NS_ERR_INVALID, "Missing parameter for attribute name");
    const ns_tv *test = a->npos > ti ? &a->pos[ti] : NULL;
    if (test && (st = want_str(c, test, "test name")) != NS_OK) return st;
    ns_tcallargs sub = tail_args(a, ti + 1);
    ns_tvec vec = {0};
    for (size_t i = 0; i < items->n; i++) {
        ns_tv x = items->v[i];
        if (attr_mode && (st = ns_tgetattr_path(c, &x, &a->pos[0], &x)) != NS_OK) return st;
        int r;
        if (test) {
            if ((st = ns_ttest(c, test->u.s.p, test->u.s.n, &x, &sub, &r)) != NS_OK) return st;
        } else {
            r = ns_tv_truthy(&x);
        }
        if (!r == !want && (st = ns_tvec_push(c->a, &vec, items->v[i], c->err)) != NS_OK) return st;
    }
    return ns_tvec_finish(c->a, &vec, 0, out, c->err);
}

static ns_status f_sort(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"reverse", "case_sensitive", "attribute"};
    const ns_tv *s[3];
    ns_status st = bind(c, "sort", a, P, 3, s);
    if (st != NS_OK) return st;
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    ns_tv *keys;
    size_t *order;
    if ((st = make_keys(c, items, s[2], truthy_opt(s[1], 0), &keys)) != NS_OK) return st;
    if ((st = sorted_order(c, keys, items->n, truthy_opt(s[0], 0), &order)) != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, items->n, 0);
    if (!l) return ns_toom(c);
    for (size_t i = 0; i < items->n; i++) l->v[i] = items->v[order[i]];
    *out = list_val(l);
    return NS_OK;
}

static ns_status f_dictsort(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"case_sensitive", "by", "reverse"};
    const ns_tv *s[3];
    ns_status st = bind(c, "dictsort", a, P, 3, s);
    if (st != NS_OK) return st;
    if (v->kind != NS_TV_DICT) return ns_trt_fail(c, NS_ERR_INVALID, "dictsort requires a mapping");
    int by_value = 0;
    if (s[1]) {
        if ((st = want_str(c, s[1], "dictsort by")) != NS_OK) return st;
        if (name_is(s[1]->u.s.p, s[1]->u.s.n, "value")) by_value = 1;
        else if (!name_is(s[1]->u.s.p, s[1]->u.s.n, "key"))
            return ns_trt_fail(c, NS_ERR_INVALID, "You can only sort by either \"key\" or \"value\"");
    }
    const ns_tdict *d = v->u.d;
    ns_tlist src = {d->n, 0, by_value ? d->vals : d->keys};
    ns_tv *keys;
    size_t *order;
    if ((st = make_keys(c, &src, NULL, truthy_opt(s[0], 0), &keys)) != NS_OK) return st;
    if ((st = sorted_order(c, keys, d->n, truthy_opt(s[2], 0), &order)) != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, d->n, 0);
    if (!l) return ns_toom(c);
    for (size_t i = 0; i < d->n; i++) {
        ns_tlist *pair = ns_tlist_new(c->a, 2, 1);
        if (!pair) return ns_toom(c);
        pair->v[0] = d->keys[order[i]];
        pair->v[1] = d->vals[order[i]];
        l->v[i] = list_val(pair);
    }
    *out = list_val(l);
    return NS_OK;
}

static ns_status f_unique(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"case_sensitive", "attribute"};
    const ns_tv *s[2];
    ns_status st = bind(c, "unique", a, P, 2, s);
    if (st != NS_OK) return st;
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    ns_tv *keys;
    if ((st = make_keys(c, items, s[1], truthy_opt(s[0], 0), &keys)) != NS_OK) return st;
    ns_tdict *seen = ns_tdict_new(c->a, 0);
    if (!seen) return ns_toom(c);
    ns_tvec vec = {0};
    for (size_t i = 0; i < items->n; i++) {
        if (ns_tdict_get(seen, &keys[i], NULL)) continue;
        if ((st = ns_tdict_set(c->a, seen, keys[i], ns_tv_none(), c->err)) != NS_OK) return st;
        if ((st = ns_tvec_push(c->a, &vec, items->v[i], c->err)) != NS_OK) return st;
    }
    return ns_tvec_finish(c->a, &vec, 0, out, c->err);
}

static ns_status f_minmax(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, int want_max, ns_tv *out) {
    static const char *const P[] = {"case_sensitive", "attribute"};
    const ns_tv *s[2];
    ns_status st = bind(c, want_max ? "max" : "min", a, P, 2, s);
    if (st != NS_OK) return st;
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    if (!items->n) {
        *out = ns_tmk_undef(c, "No aggregated item, sequence was empty.");
        return NS_OK;
    }
    ns_tv *keys;
    if ((st = make_keys(c, items, s[1], truthy_opt(s[0], 0), &keys)) != NS_OK) return st;
    size_t best = 0;
    for (size_t i = 1; i < items->n; i++) {
        int r;
        if ((st = key_cmp(c, &keys[i], &keys[best], &r)) != NS_OK) return st;
        if (want_max ? r > 0 : r < 0) best = i;
    }
    ns_tv k = items->v[best];
    if (s[1] && s[1]->kind != NS_TV_NONE) return ns_tgetattr_path(c, &k, s[1], out);
    *out = k;
    return NS_OK;
}

static ns_status f_sum(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"attribute", "start"};
    const ns_tv *s[2];
    ns_status st = bind(c, "sum", a, P, 2, s);
    if (st != NS_OK) return st;
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    ns_tv acc = s[1] ? *s[1] : ns_tv_int(0);
    for (size_t i = 0; i < items->n; i++) {
        ns_tv x = items->v[i];
        if (s[0] && s[0]->kind != NS_TV_NONE && (st = ns_tgetattr_path(c, &x, s[0], &x)) != NS_OK) return st;
        if ((st = ns_tbinop(c, NS_OP_ADD, &acc, &x, &acc)) != NS_OK) return st;
    }
    *out = acc;
    return NS_OK;
}

static ns_status f_round(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"precision", "method"};
    const ns_tv *s[2];
    ns_status st = bind(c, "round", a, P, 2, s);
    if (st != NS_OK) return st;
    int64_t prec = 0;
    if (s[0] && (st = ns_twant_int(c, s[0], "precision", &prec)) != NS_OK) return st;
    const char *method = "common";
    if (s[1]) {
        if ((st = want_str(c, s[1], "round method")) != NS_OK) return st;
        if (name_is(s[1]->u.s.p, s[1]->u.s.n, "ceil")) method = "ceil";
        else if (name_is(s[1]->u.s.p, s[1]->u.s.n, "floor")) method = "floor";
        else if (!name_is(s[1]->u.s.p, s[1]->u.s.n, "common"))
            return ns_trt_fail(c, NS_ERR_INVALID, "method must be common, ceil or floor");
    }
    if (!ns_tv_is_num(v)) {
        if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
        return ns_trt_fail(c, NS_ERR_INVALID, "type %s doesn't define __round__ method", ns_tv_type_name(v));
    }
    double x = ns_tv_num(v);
    if (method[0] == 'c' && method[1] == 'o') {
        if (v->kind != NS_TV_FLOAT) {
            *out = ns_tv_int(v->kind == NS_TV_INT ? v->u.i : v->u.b);
            return NS_OK;
        }
        if (prec == 0) {
            *out = ns_tv_float(nearbyint(x)); /* half to even, like Python */
            return NS_OK;
        }
        if (prec > 300 || !isfinite(x)) {
            *out = *v;
            return NS_OK;
        }
        char buf[400];
        if (prec > 0) {
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = ns_tv_float(strtod(buf, NULL));
        } else {
            double p = pow(10.0, (double)-prec);
            *out = ns_tv_float(nearbyint(x / p) * p);
        }
        return NS_OK;
    }
    double p = pow(10.0, (double)prec);
    double r = method[0] == 'c' ? ceil(x * p) / p : floor(x * p) / p;
    *out = ns_tv_float(r);
    return NS_OK;
}

/* Jinja's title filter: upper-case the first character of each run that
 * follows one of -, whitespace, (, {, [, < and lower-case the rest. */
static ns_status f_title(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    ns_tv s;
    ns_status st = to_str(c, v, &s);
    if (st != NS_OK) return st;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    size_t i = 0;
    int at_start = 1;
    while (i < s.u.s.n) {
        uint32_t cp = ns_utf8_next(s.u.s.p, s.u.s.n, &i);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ns_u_isspace(cp);
        if (sep) {
            ns_tsb_putcp(&b, cp);
            at_start = 1;
        } else {
            ns_tsb_putcp(&b, at_start ? ns_u_upper(cp) : ns_u_lower(cp));
            at_start = 0;
        }
    }
    return ns_tsb_finish(&b, out, c->err);
}

static ns_status f_reverse(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    if (v->kind == NS_TV_STR) {
        ns_tv neg = ns_tv_int(-1);
        return ns_tslice(c, v, NULL, NULL, &neg, out);
    }
    const ns_tlist *items;
    ns_status st = ns_titer(c, v, &items);
    if (st != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, items->n, 0);
    if (!l) return ns_toom(c);
    for (size_t i = 0; i < items->n; i++) l->v[i] = items->v[items->n - 1 - i];
    *out = list_val(l);
    return NS_OK;
}

static ns_status f_batch(ns_tctx *c, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    static const char *const P[] = {"linecount", "fill_with"};
    const ns_tv *s[2];
    ns_status st = bind(c, "batch", a, P, 2, s);
    if (st != NS_OK) return st;
    int64_t per;
    if (!s[0]) return ns_trt_fail(c, NS_ERR_INVALID, "batch requires a line count");
    if ((st = ns_twant_int(c, s[0], "linecount", &per)) != NS_OK) return st;
    if (per <= 0) return ns_trt_fail(c, NS_ERR_INVALID, "batch line count must be positive");
    const ns_tlist *items;
    if ((st = ns_titer(c, v, &items)) != NS_OK) return st;
    size_t groups = (items->n + (size_t)per - 1) / (size_t)per;
    ns_tlist *l = ns_tlist_new(c->a, groups, 0);
    if (!l) return ns_toom(c);
    for (size_t g = 0; g < groups; g++) {
        size_t from = g * (size_t)per, cnt = items->n - from < (size_t)per ? items->n - from : (size_t)per;
        size_t len = (s[1] && cnt < (size_t)per) ? (size_t)per : cnt;
        ns_tlist *row = ns_tlist_new(c->a, len, 0);
        if (!row) return ns_toom(c);
        for (size_t k = 0; k < len; k++) row->v[k] = k < cnt ? items->v[from + k] : *s[1];
        l->v[g] = list_val(row);
    }
    *out = list_val(l);
    return NS_OK;
}

static ns_status f_wordcount(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    ns_tv s;
    ns_status st = to_str(c, v, &s);
    if (st != NS_OK) return st;
    int64_t words = 0;
    int in_word = 0;
    size_t i = 0;
    while (i < s.u.s.n) {
        uint32_t cp = ns_utf8_next(s.u.s.p, s.u.s.n, &i);
        int w = cp == '_' || ns_u_isalpha(cp) || ns_u_isnumeric(cp);
        if (w && !in_word) words++;
        in_word = w;
    }
    *out = ns_tv_int(words);
    return NS_OK;
}

static ns_status simple_str_filter(ns_tctx *c, const ns_tv *v, int mode, ns_tv *out) {
    ns_tv s;
    ns_status st = to_str(c, v, &s);
    if (st != NS_OK) return st;
    return ns_tstr_case(c, &s, mode, out);
}

static const char *const FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL};

int ns_tfilter_exists(const char *name, size_t n) {
    for (size_t i = 0; FILTERS[i]; i++)
        if (name_is(name, n, FILTERS[i])) return 1;
    return 0;
}

ns_status ns_tfilter(ns_tctx *c, const char *name, size_t n, const ns_tv *v, const ns_tcallargs *a, ns_tv *out) {
    ns_status st;
#define IS(lit) name_is(name, n, lit)
    if (IS("tojson")) return f_tojson(c, v, a, out);
    if (IS("trim")) {
        static const char *const P[] = {"chars"};
        const ns_tv *s[1];
        ns_tv str;
        if ((st = bind(c, "trim", a, P, 1, s)) != NS_OK || (st = to_str(c, v, &str)) != NS_OK) return st;
        return ns_tstr_strip(c, &str, s[0], 1, 1, out);
    }
    if (IS("length") || IS("count")) return f_length(c, v, out);
    if (IS("default") || IS("d")) return f_default(c, v, a, out);
    if (IS("join")) return f_join(c, v, a, out);
    if (IS("first")) return f_first_last(c, v, 0, out);
    if (IS("last")) return f_first_last(c, v, 1, out);
    if (IS("string")) {
        int safe = v->kind == NS_TV_STR && v->safe;
        st = to_str(c, v, out);
        out->safe = (uint8_t)safe;
        return st;
    }
    if (IS("int")) return f_int(c, v, a, out);
    if (IS("float")) return f_float(c, v, a, out);
    if (IS("list")) return f_list(c, v, out);
    if (IS("items")) return f_items(c, v, out);
    if (IS("map")) return f_map(c, v, a, out);
    if (IS("select")) return f_select(c, v, a, 1, 0, out);
    if (IS("reject")) return f_select(c, v, a, 0, 0, out);
    if (IS("selectattr")) return f_select(c, v, a, 1, 1, out);
    if (IS("rejectattr")) return f_select(c, v, a, 0, 1, out);
    if (IS("indent")) return f_indent(c, v, a, out);
    if (IS("upper")) return simple_str_filter(c, v, NS_TCASE_UPPER, out);
    if (IS("lower")) return simple_str_filter(c, v, NS_TCASE_LOWER, out);
    if (IS("capitalize")) return simple_str_filter(c, v, NS_TCASE_CAPITALIZE, out);
    if (IS("title")) return f_title(c, v, out);
    if (IS("replace")) {
        static const char *const P[] = {"old", "new", "count"};
        const ns_tv *s[3];
        ns_tv str;
        int64_t count = -1;
        if ((st = bind(c, "replace", a, P, 3, s)) != NS_OK || (st = to_str(c, v, &str)) != NS_OK) return st;
        if (!s[0] || !s[1]) return ns_trt_fail(c, NS_ERR_INVALID, "replace needs old and new strings");
        if (s[2] && s[2]->kind != NS_TV_NONE && (st = ns_twant_int(c, s[2], "count", &count)) != NS_OK) return st;
        ns_tv o, r;
        if ((st = to_str(c, s[0], &o)) != NS_OK || (st = to_str(c, s[1], &r)) != NS_OK) return st;
        return ns_tstr_replace(c, &str, &o, &r, count, out);
    }
    if (IS("safe")) {
        st = to_str(c, v, out);
        out->safe = 1;
        return st;
    }
    if (IS("escape") || IS("e")) return ns_tescape(c, v, out);
    if (IS("forceescape")) {
        ns_tv plain = *v;
        plain.safe = 0;
        return ns_tescape(c, &plain, out);
    }
    if (IS("abs")) {
        if (v->kind == NS_TV_FLOAT) *out = ns_tv_float(fabs(v->u.f));
        else if (v->kind == NS_TV_INT || v->kind == NS_TV_BOOL) {
            int64_t x = v->kind == NS_TV_INT ? v->u.i : v->u.b;
            if (x == INT64_MIN) return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
            *out = ns_tv_int(x < 0 ? -x : x);
        } else if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
        else return ns_trt_fail(c, NS_ERR_INVALID, "bad operand type for abs(): '%s'", ns_tv_type_name(v));
        return NS_OK;
    }
    if (IS("attr")) {
        const ns_tv *an = ns_targ(a, 0, "name");
        if (!an || (st = want_str(c, an, "attribute name")) != NS_OK) return an ? st : ns_trt_fail(c, NS_ERR_INVALID, "attr needs a name");
        if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
        /* attribute only: dict keys are not attributes */
        if (v->kind == NS_TV_DICT && !ns_tmethod_kind(v, an->u.s.p, an->u.s.n)) {
            *out = ns_tmk_undef(c, "'dict object' has no attribute '%.*s'", (int)an->u.s.n, an->u.s.p);
            return NS_OK;
        }
        return ns_tgetattr(c, v, an->u.s.p, an->u.s.n, out);
    }
    if (IS("format")) {
        ns_tv fmt;
        if ((st = to_str(c, v, &fmt)) != NS_OK) return st;
        if (a->npos && a->nkw) return ns_trt_fail(c, NS_ERR_INVALID, "can't handle positional and keyword arguments at the same time");
        if (a->nkw) {
            ns_tdict *d = ns_tdict_new(c->a, a->nkw);
            if (!d) return ns_toom(c);
            for (size_t i = 0; i < a->nkw; i++)
                if ((st = ns_tdict_set(c->a, d, ns_tv_str(a->kw_names[i].p, a->kw_names[i].n), a->kw[i], c->err)) != NS_OK)
                    return st;
            ns_tv dv = {0};
            dv.kind = NS_TV_DICT;
            dv.u.d = d;
            return ns_tpercent_format(c, &fmt, &dv, out);
        }
        ns_tlist *t = ns_tlist_new(c->a, a->npos, 1);
        if (!t) return ns_toom(c);
        if (a->npos) memcpy(t->v, a->pos, a->npos * sizeof(ns_tv));
        ns_tv tv = list_val(t);
        return ns_tpercent_format(c, &fmt, &tv, out);
    }
    if (IS("center")) {
        static const char *const P[] = {"width"};
        const ns_tv *s[1];
        ns_tv str;
        if ((st = bind(c, "center", a, P, 1, s)) != NS_OK || (st = to_str(c, v, &str)) != NS_OK) return st;
        ns_tv w = s[0] ? *s[0] : ns_tv_int(80);
        ns_tcallargs ca = {&w, 1, NULL, NULL, 0};
        ns_tmethod m = {str, "center", 6};
        return ns_tmethod_call(c, &m, &ca, out);
    }
    if (IS("sort")) return f_sort(c, v, a, out);
    if (IS("dictsort")) return f_dictsort(c, v, a, out);
    if (IS("unique")) return f_unique(c, v, a, out);
    if (IS("max")) return f_minmax(c, v, a, 1, out);
    if (IS("min")) return f_minmax(c, v, a, 0, out);
    if (IS("sum")) return f_sum(c, v, a, out);
    if (IS("round")) return f_round(c, v, a, out);
    if (IS("reverse")) return f_reverse(c, v, out);
    if (IS("batch")) return f_batch(c, v, a, out);
    if (IS("wordcount")) return f_wordcount(c, v, out);
#undef IS
    return ns_trt_fail(c, NS_ERR_UNSUPPORTED, "No filter named '%.*s'.", (int)(n > 64 ? 64 : n), name);
}

/* ---- tests ------------------------------------------------------------------------------ */

static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter", "float",
    "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=",
    ">", ">=", NULL};

int ns_ttest_exists(const char *name, size_t n) {
    for (size_t i = 0; TESTS[i]; i++)
        if (name_is(name, n, TESTS[i])) return 1;
    return 0;
}

static ns_status mod2(ns_tctx *c, const ns_tv *v, int64_t *r) {
    ns_tv two = ns_tv_int(2), m;
    ns_status st = ns_tbinop(c, NS_OP_MOD, v, &two, &m);
    if (st != NS_OK) return st;
    *r = m.kind == NS_TV_FLOAT ? (m.u.f == 0 ? 0 : m.u.f == 1 ? 1 : 2) : m.u.i;
    return NS_OK;
}

ns_status ns_ttest(ns_tctx *c, const char *name, size_t n, const ns_tv *v, const ns_tcallargs *a, int *out) {
#define IS(lit) name_is(name, n, lit)
    const ns_tv *arg = ns_targ(a, 0, NULL);
    ns_status st;
    int k = v->kind;
    if (IS("defined")) *out = k != NS_TV_UNDEF;
    else if (IS("undefined")) *out = k == NS_TV_UNDEF;
    else if (IS("none")) *out = k == NS_TV_NONE;
    else if (IS("string")) *out = k == NS_TV_STR;
    else if (IS("mapping")) *out = k == NS_TV_DICT;
    /* Undefined has __len__ and __getitem__, so Jinja calls it a sequence */
    else if (IS("sequence")) *out = k == NS_TV_STR || k == NS_TV_LIST || k == NS_TV_DICT || k == NS_TV_UNDEF;
    else if (IS("iterable")) *out = k == NS_TV_STR || k == NS_TV_LIST || k == NS_TV_DICT || k == NS_TV_UNDEF;
    else if (IS("number")) *out = k == NS_TV_INT || k == NS_TV_FLOAT || k == NS_TV_BOOL;
    else if (IS("integer")) *out = k == NS_TV_INT;
    else if (IS("float")) *out = k == NS_TV_FLOAT;
    else if (IS("boolean")) *out = k == NS_TV_BOOL;
    else if (IS("true")) *out = k == NS_TV_BOOL && v->u.b;
    else if (IS("false")) *out = k == NS_TV_BOOL && !v->u.b;
    else if (IS("callable")) *out = k == NS_TV_MACRO || k == NS_TV_FUNC || k == NS_TV_METHOD || k == NS_TV_JOINER;
    else if (IS("escaped")) *out = k == NS_TV_STR && v->safe;
    else if (IS("odd") || IS("even")) {
        int64_t r;
        if ((st = mod2(c, v, &r)) != NS_OK) return st;
        *out = IS("odd") ? r == 1 : r == 0;
    } else if (IS("divisibleby")) {
        if (!arg) return ns_trt_fail(c, NS_ERR_INVALID, "divisibleby needs a number");
        ns_tv m;
        if ((st = ns_tbinop(c, NS_OP_MOD, v, arg, &m)) != NS_OK) return st;
        *out = !ns_tv_truthy(&m);
    } else if (IS("lower") || IS("upper")) {
        ns_tv s;
        if ((st = to_str(c, v, &s)) != NS_OK) return st;
        ns_tmethod m = {s, IS("lower") ? "islower" : "isupper", 7};
        ns_tcallargs none = {0};
        ns_tv r;
        if ((st = ns_tmethod_call(c, &m, &none, &r)) != NS_OK) return st;
        *out = r.u.b;
    } else if (IS("sameas")) {
        if (!arg) return ns_trt_fail(c, NS_ERR_INVALID, "sameas needs a value");
        if (k != arg->kind) *out = 0;
        else if (k == NS_TV_NONE || k == NS_TV_UNDEF) *out = 1;
        else if (k == NS_TV_BOOL || k == NS_TV_INT) *out = ns_tv_eq(v, arg);
        else if (k == NS_TV_STR) *out = v->u.s.p == arg->u.s.p && v->u.s.n == arg->u.s.n;
        else *out = v->u.obj == arg->u.obj;
    } else if (IS("in")) {
        if (!arg) return ns_trt_fail(c, NS_ERR_INVALID, "in needs a container");
        return ns_tcontains(c, arg, v, out);
    } else if (IS("filter") || IS("test")) {
        *out = k == NS_TV_STR && (IS("filter") ? ns_tfilter_exists(v->u.s.p, v->u.s.n) : ns_ttest_exists(v->u.s.p, v->u.s.n));
    } else {
        int op = 0;
        if (IS("eq") || IS("equalto") || IS("==")) op = NS_OP_EQ;
        else if (IS("ne") || IS("!=")) op = NS_OP_NE;
        else if (IS("lt") || IS("lessthan") || IS("<")) op = NS_OP_LT;
        else if (IS("le") || IS("<=")) op = NS_OP_LE;
        else if (IS("gt") || IS("greaterthan") || IS(">")) op = NS_OP_GT;
        else if (IS("ge") || IS(">=")) op = NS_OP_GE;
        if (!op) return ns_trt_fail(c, NS_ERR_UNSUPPORTED, "No test named '%.*s'.", (int)(n > 64 ? 64 : n), name);
        if (!arg) return ns_trt_fail(c, NS_ERR_INVALID, "test '%.*s' needs a value to compare with", (int)n, name);
        return ns_tcompare(c, op, v, arg, out);
    }
#undef IS
    return NS_OK;
}
