#include "template/value.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/ustr.h"
#include "util/hash.h"
#include "util/utf8.h"

/* ---- string builder ------------------------------------------------------ */

void ns_tsb_init(ns_tsb *b, ns_tarena *a) {
    b->a = a;
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = 0;
    b->heap = 0;
}

void ns_tsb_init_heap(ns_tsb *b) {
    ns_tsb_init(b, NULL);
    b->heap = 1;
}

char *ns_tsb_take(ns_tsb *b, size_t *len) {
    if (b->oom || !b->heap) return NULL;
    if (!b->p) {
        b->p = malloc(1);
        if (!b->p) return NULL;
        b->p[0] = 0;
    }
    char *p = b->p;
    if (len) *len = b->n;
    b->p = NULL;
    b->n = b->cap = 0;
    return p;
}

void ns_tsb_release(ns_tsb *b) {
    if (b->heap) free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static int sb_reserve(ns_tsb *b, size_t extra) {
    if (b->oom) return 0;
    if (extra > ((size_t)1 << 40)) {
        b->oom = 1;
        return 0;
    }
    if (b->n + extra + 1 <= b->cap) return 1;
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + extra + 1) nc *= 2;
    char *np = b->heap ? realloc(b->p, nc) : ns_tarena_grow(b->a, b->p, b->n, nc);
    if (!np) {
        b->oom = 1;
        return 0;
    }
    b->p = np;
    b->cap = nc;
    return 1;
}

void ns_tsb_put(ns_tsb *b, const char *s, size_t n) {
    if (!n || !sb_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ns_tsb_puts(ns_tsb *b, const char *s) { ns_tsb_put(b, s, strlen(s)); }
void ns_tsb_putc(ns_tsb *b, char c) { ns_tsb_put(b, &c, 1); }

void ns_tsb_putcp(ns_tsb *b, uint32_t cp) {
    char tmp[4];
    ns_tsb_put(b, tmp, ns_utf8_encode(cp, tmp));
}

void ns_tsb_printf(ns_tsb *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        ns_tsb_put(b, tmp, (size_t)n);
        return;
    }
    if (!sb_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

ns_status ns_tsb_finish(ns_tsb *b, ns_tv *out, ns_error *err) {
    if (b->oom) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
    *out = ns_tv_str(b->p ? b->p : "", b->n);
    return NS_OK;
}

/* ---- lists --------------------------------------------------------------- */

ns_tlist *ns_tlist_new(ns_tarena *a, size_t n, int tuple) {
    ns_tlist *l = ns_tarena_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (n > ((size_t)1 << 32)) return NULL;
    l->v = ns_tarena_alloc(a, n * sizeof(ns_tv));
    if (!l->v) return NULL;
    l->n = n;
    l->tuple = tuple;
    return l;
}

ns_status ns_tvec_push(ns_tarena *a, ns_tvec *vec, ns_tv v, ns_error *err) {
    if (vec->n == vec->cap) {
        size_t nc = vec->cap ? vec->cap * 2 : 8;
        ns_tv *nv = ns_tarena_grow(a, vec->v, vec->n * sizeof(ns_tv), nc * sizeof(ns_tv));
        if (!nv) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        vec->v = nv;
        vec->cap = nc;
    }
    vec->v[vec->n++] = v;
    return NS_OK;
}

ns_status ns_tvec_finish(ns_tarena *a, ns_tvec *vec, int tuple, ns_tv *out, ns_error *err) {
    ns_tlist *l = ns_tarena_alloc(a, sizeof *l);
    if (!l) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
    l->v = vec->v;
    l->n = vec->n;
    l->tuple = tuple;
    memset(out, 0, sizeof *out);
    out->kind = NS_TV_LIST;
    out->u.l = l;
    return NS_OK;
}

/* ---- hashing and dicts ----------------------------------------------------- */

/* Returns 0 for unhashable values. Equal values hash equal across
 * int/float/bool as in Python (1 == 1.0 == True). */
static int tv_hash(const ns_tv *v, uint64_t *h, int depth) {
    switch (v->kind) {
    case NS_TV_NONE: *h = 0x9e3779b97f4a7c15ULL; return 1;
    case NS_TV_UNDEF: *h = 0x1234567ULL; return 1;
    case NS_TV_BOOL: *h = ns_mix64((uint64_t)v->u.b); return 1;
    case NS_TV_INT: *h = ns_mix64((uint64_t)v->u.i); return 1;
    case NS_TV_FLOAT: {
        double f = v->u.f;
        if (f == floor(f) && fabs(f) < 9.2e18) {
            *h = ns_mix64((uint64_t)(int64_t)f);
        } else {
            uint64_t bits;
            memcpy(&bits, &f, sizeof bits);
            *h = ns_mix64(bits);
        }
        return 1;
    }
    case NS_TV_STR: {
        uint64_t x = 1469598103934665603ULL;
        for (size_t i = 0; i < v->u.s.n; i++) {
            x ^= (unsigned char)v->u.s.p[i];
            x *= 1099511628211ULL;
        }
        *h = x;
        return 1;
    }
    case NS_TV_LIST: {
        if (!v->u.l->tuple || depth > NS_TV_MAX_DEPTH) return 0;
        uint64_t x = 0x345678;
        for (size_t i = 0; i < v->u.l->n; i++) {
            uint64_t e;
            if (!tv_hash(&v->u.l->v[i], &e, depth + 1)) return 0;
            x = ns_mix64(x ^ e) + i;
        }
        *h = x;
        return 1;
    }
    case NS_TV_DICT:
    case NS_TV_NS:
        return 0;
    default:
        *h = ns_mix64((uint64_t)(uintptr_t)v->u.obj);
        return 1;
    }
}

int ns_tv_hashable(const ns_tv *v) {
    uint64_t h;
    return tv_hash(v, &h, 0);
}

ns_tdict *ns_tdict_new(ns_tarena *a, size_t cap_hint) {
    ns_tdict *d = ns_tarena_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap_hint) {
        if (cap_hint > ((size_t)1 << 30)) return NULL;
        d->keys = ns_tarena_alloc(a, cap_hint * sizeof(ns_tv));
        d->vals = ns_tarena_alloc(a, cap_hint * sizeof(ns_tv));
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap_hint;
    }
    return d;
}

static long dict_find(const ns_tdict *d, const ns_tv *key) {
    if (d->idx) {
        uint64_t h;
        if (!tv_hash(key, &h, 0)) return -1;
        size_t mask = d->idx_cap - 1;
        for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
            uint32_t e = d->idx[i];
            if (!e) return -1;
            if (ns_tv_eq(&d->keys[e - 1], key)) return (long)(e - 1);
        }
    }
    for (size_t i = 0; i < d->n; i++)
        if (ns_tv_eq(&d->keys[i], key)) return (long)i;
    return -1;
}

int ns_tdict_get(const ns_tdict *d, const ns_tv *key, ns_tv *out) {
    long i = dict_find(d, key);
    if (i < 0) return 0;
    if (out) *out = d->vals[i];
    return 1;
}

int ns_tdict_get_str(const ns_tdict *d, const char *k, size_t kn, ns_tv *out) {
    if (!d->idx) { /* common case: small dict, compare bytes directly */
        for (size_t i = 0; i < d->n; i++) {
            const ns_tv *key = &d->keys[i];
            if (key->kind == NS_TV_STR && key->u.s.n == kn && memcmp(key->u.s.p, k, kn) == 0) {
                if (out) *out = d->vals[i];
                return 1;
            }
        }
        return 0;
    }
    ns_tv key = ns_tv_str(k, kn);
    return ns_tdict_get(d, &key, out);
}

static int dict_reindex(ns_tarena *a, ns_tdict *d) {
    size_t ic = 16;
    while (ic < d->cap * 2) ic *= 2;
    uint32_t *idx = ns_tarena_alloc(a, ic * sizeof(uint32_t));
    if (!idx) return 0;
    for (size_t e = 0; e < d->n; e++) {
        uint64_t h;
        tv_hash(&d->keys[e], &h, 0);
        size_t i = (size_t)h & (ic - 1);
        while (idx[i]) i = (i + 1) & (ic - 1);
        idx[i] = (uint32_t)(e + 1);
    }
    d->idx = idx;
    d->idx_cap = ic;
    return 1;
}

ns_status ns_tdict_set(ns_tarena *a, ns_tdict *d, ns_tv key, ns_tv val, ns_error *err) {
    uint64_t h;
    if (!tv_hash(&key, &h, 0)) return ns_fail(err, NS_ERR_INVALID, "unhashable type: '%s'", ns_tv_type_name(&key));
    long i = dict_find(d, &key);
    if (i >= 0) {
        d->vals[i] = val;
        return NS_OK;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        if (nc > ((size_t)1 << 30)) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        ns_tv *nk = ns_tarena_grow(a, d->keys, d->n * sizeof(ns_tv), nc * sizeof(ns_tv));
        ns_tv *nv = ns_tarena_grow(a, d->vals, d->n * sizeof(ns_tv), nc * sizeof(ns_tv));
        if (!nk || !nv) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        d->keys = nk;
        d->vals = nv;
        d->cap = nc;
        d->idx = NULL; /* rebuilt below for the new capacity */
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    if (d->n > 8) {
        if (!d->idx) {
            if (!dict_reindex(a, d)) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        } else {
            size_t j = (size_t)h & (d->idx_cap - 1);
            while (d->idx[j]) j = (j + 1) & (d->idx_cap - 1);
            d->idx[j] = (uint32_t)d->n;
        }
    }
    return NS_OK;
}

/* ---- semantics ------------------------------------------------------------ */

int ns_tv_truthy(const ns_tv *v) {
    switch (v->kind) {
    case NS_TV_UNDEF:
    case NS_TV_NONE: return 0;
    case NS_TV_BOOL: return v->u.b;
    case NS_TV_INT: return v->u.i != 0;
    case NS_TV_FLOAT: return v->u.f != 0.0;
    case NS_TV_STR: return v->u.s.n != 0;
    case NS_TV_LIST: return v->u.l->n != 0;
    case NS_TV_DICT: return v->u.d->n != 0;
    default: return 1;
    }
}

static int tv_eq(const ns_tv *a, const ns_tv *b, int depth) {
    if (depth > NS_TV_MAX_DEPTH) return 0;
    if (ns_tv_is_num(a) && ns_tv_is_num(b)) {
        if (a->kind != NS_TV_FLOAT && b->kind != NS_TV_FLOAT) {
            int64_t x = a->kind == NS_TV_INT ? a->u.i : a->u.b;
            int64_t y = b->kind == NS_TV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return ns_tv_num(a) == ns_tv_num(b);
    }
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case NS_TV_UNDEF:
    case NS_TV_NONE: return 1;
    case NS_TV_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case NS_TV_LIST: {
        const ns_tlist *x = a->u.l, *y = b->u.l;
        if (x == y) return 1;
        if (x->tuple != y->tuple || x->n != y->n) return 0;
        for (size_t i = 0; i < x->n; i++)
            if (!tv_eq(&x->v[i], &y->v[i], depth + 1)) return 0;
        return 1;
    }
    case NS_TV_DICT: {
        const ns_tdict *x = a->u.d, *y = b->u.d;
        if (x == y) return 1;
        if (x->n != y->n) return 0;
        for (size_t i = 0; i < x->n; i++) {
            ns_tv other;
            if (!ns_tdict_get(y, &x->keys[i], &other)) return 0;
            if (!tv_eq(&x->vals[i], &other, depth + 1)) return 0;
        }
        return 1;
    }
    case NS_TV_NS: return a->u.d == b->u.d;
    case NS_TV_FUNC: return a->aux == b->aux;
    default: return a->u.obj == b->u.obj;
    }
}

int ns_tv_eq(const ns_tv *a, const ns_tv *b) { return tv_eq(a, b, 0); }

static ns_status tv_cmp(const ns_tv *a, const ns_tv *b, int *res, int depth, ns_error *err) {
    if (depth > NS_TV_MAX_DEPTH) return ns_fail(err, NS_ERR_RANGE, "values nested too deeply to compare");
    if (ns_tv_is_num(a) && ns_tv_is_num(b)) {
        if (a->kind != NS_TV_FLOAT && b->kind != NS_TV_FLOAT) {
            int64_t x = a->kind == NS_TV_INT ? a->u.i : a->u.b;
            int64_t y = b->kind == NS_TV_INT ? b->u.i : b->u.b;
            *res = x < y ? -1 : x > y;
        } else {
            double x = ns_tv_num(a), y = ns_tv_num(b);
            *res = x < y ? -1 : x > y ? 1 : 0; /* NaN compares "equal": no order */
        }
        return NS_OK;
    }
    if (a->kind == NS_TV_STR && b->kind == NS_TV_STR) {
        /* UTF-8 byte order is code point order */
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = n ? memcmp(a->u.s.p, b->u.s.p, n) : 0;
        *res = c < 0 ? -1 : c > 0 ? 1 : a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
        return NS_OK;
    }
    if (a->kind == NS_TV_LIST && b->kind == NS_TV_LIST && a->u.l->tuple == b->u.l->tuple) {
        const ns_tlist *x = a->u.l, *y = b->u.l;
        size_t n = x->n < y->n ? x->n : y->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_eq(&x->v[i], &y->v[i], depth + 1)) continue;
            return tv_cmp(&x->v[i], &y->v[i], res, depth + 1, err);
        }
        *res = x->n < y->n ? -1 : x->n > y->n;
        return NS_OK;
    }
    return ns_fail(err, NS_ERR_INVALID, "'<' not supported between instances of '%s' and '%s'", ns_tv_type_name(a),
                   ns_tv_type_name(b));
}

ns_status ns_tv_cmp(const ns_tv *a, const ns_tv *b, int *res, ns_error *err) { return tv_cmp(a, b, res, 0, err); }

const char *ns_tv_type_name(const ns_tv *v) {
    switch (v->kind) {
    case NS_TV_UNDEF: return "Undefined";
    case NS_TV_NONE: return "NoneType";
    case NS_TV_BOOL: return "bool";
    case NS_TV_INT: return "int";
    case NS_TV_FLOAT: return "float";
    case NS_TV_STR: return "str";
    case NS_TV_LIST: return v->u.l->tuple ? "tuple" : "list";
    case NS_TV_DICT: return "dict";
    case NS_TV_NS: return "Namespace";
    case NS_TV_MACRO: return "Macro";
    case NS_TV_FUNC: return "function";
    case NS_TV_METHOD: return "builtin_function_or_method";
    case NS_TV_LOOP: return "LoopContext";
    case NS_TV_CYCLER: return "Cycler";
    case NS_TV_JOINER: return "Joiner";
    }
    return "object";
}

int64_t ns_tv_len(const ns_tv *v) {
    switch (v->kind) {
    case NS_TV_UNDEF: return 0;
    case NS_TV_STR: return (int64_t)ns_utf8_count(v->u.s.p, v->u.s.n);
    case NS_TV_LIST: return (int64_t)v->u.l->n;
    case NS_TV_DICT: return (int64_t)v->u.d->n;
    default: return -1;
    }
}

/* ---- printing --------------------------------------------------------------- */

size_t ns_tv_fmt_float(double x, char *buf) {
    if (isnan(x)) return (size_t)sprintf(buf, "nan");
    if (isinf(x)) return (size_t)sprintf(buf, x < 0 ? "-inf" : "inf");
    /* shortest digit string that reads back as x (Python's repr rule) */
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    if (prec > 17) prec = 17;
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    while (*p && *p != 'e') {
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
        p++;
    }
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    size_t o = 0;
    if (neg) buf[o++] = '-';
    int decpt = exp10 + 1;
    if (decpt <= -4 || decpt > 16) {
        buf[o++] = digits[0];
        if (nd > 1) {
            buf[o++] = '.';
            for (size_t i = 1; i < nd; i++) buf[o++] = digits[i];
        }
        o += (size_t)sprintf(buf + o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        buf[o++] = '0';
        buf[o++] = '.';
        for (int i = 0; i < -decpt; i++) buf[o++] = '0';
        for (size_t i = 0; i < nd; i++) buf[o++] = digits[i];
    } else if ((size_t)decpt >= nd) {
        for (size_t i = 0; i < nd; i++) buf[o++] = digits[i];
        for (size_t i = nd; i < (size_t)decpt; i++) buf[o++] = '0';
        buf[o++] = '.';
        buf[o++] = '0';
    } else {
        for (size_t i = 0; i < nd; i++) {
            if (i == (size_t)decpt) buf[o++] = '.';
            buf[o++] = digits[i];
        }
    }
    buf[o] = 0;
    return o;
}

static void repr_str(ns_tsb *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    ns_tsb_putc(b, q);
    size_t i = 0;
    while (i < n) {
        uint32_t c = ns_utf8_next(s, n, &i);
        if (c == (uint32_t)q || c == '\\') {
            ns_tsb_putc(b, '\\');
            ns_tsb_putc(b, (char)c);
        } else if (c == '\n') ns_tsb_puts(b, "\\n");
        else if (c == '\r') ns_tsb_puts(b, "\\r");
        else if (c == '\t') ns_tsb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7F) ns_tsb_printf(b, "\\x%02x", c);
        else if (c < 0x7F || ns_u_isprintable(c)) ns_tsb_putcp(b, c);
        else if (c <= 0xFF) ns_tsb_printf(b, "\\x%02x", c);
        else if (c <= 0xFFFF) ns_tsb_printf(b, "\\u%04x", c);
        else ns_tsb_printf(b, "\\U%08x", c);
    }
    ns_tsb_putc(b, q);
}

/* Containers being printed, innermost last: Python's repr prints a
 * container that contains itself as [...] or {...}. */
typedef struct print_stack {
    const void *open[NS_TV_MAX_DEPTH + 2];
    int n;
} print_stack;

static int on_stack(const print_stack *ps, const void *p) {
    for (int i = 0; i < ps->n; i++)
        if (ps->open[i] == p) return 1;
    return 0;
}

static void tv_print(ns_tsb *b, const ns_tv *v, int repr, print_stack *ps) {
    if (ps->n > NS_TV_MAX_DEPTH) {
        ns_tsb_puts(b, "...");
        return;
    }
    char num[40];
    switch (v->kind) {
    case NS_TV_UNDEF:
        if (repr) ns_tsb_puts(b, "Undefined");
        return;
    case NS_TV_NONE: ns_tsb_puts(b, "None"); return;
    case NS_TV_BOOL: ns_tsb_puts(b, v->u.b ? "True" : "False"); return;
    case NS_TV_INT: ns_tsb_printf(b, "%lld", (long long)v->u.i); return;
    case NS_TV_FLOAT: ns_tsb_put(b, num, ns_tv_fmt_float(v->u.f, num)); return;
    case NS_TV_STR:
        if (!repr) {
            ns_tsb_put(b, v->u.s.p, v->u.s.n);
        } else if (v->safe) {
            ns_tsb_puts(b, "Markup(");
            repr_str(b, v->u.s.p, v->u.s.n);
            ns_tsb_putc(b, ')');
        } else {
            repr_str(b, v->u.s.p, v->u.s.n);
        }
        return;
    case NS_TV_LIST: {
        const ns_tlist *l = v->u.l;
        if (on_stack(ps, l)) {
            ns_tsb_puts(b, l->tuple ? "(...)" : "[...]");
            return;
        }
        ps->open[ps->n++] = l;
        ns_tsb_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) ns_tsb_puts(b, ", ");
            tv_print(b, &l->v[i], 1, ps);
        }
        if (l->tuple && l->n == 1) ns_tsb_putc(b, ',');
        ns_tsb_putc(b, l->tuple ? ')' : ']');
        ps->n--;
        return;
    }
    case NS_TV_NS:
        ns_tsb_puts(b, "<Namespace ");
        /* fall through */
    case NS_TV_DICT: {
        const ns_tdict *d = v->u.d;
        if (on_stack(ps, d)) {
            ns_tsb_puts(b, "{...}");
        } else {
            ps->open[ps->n++] = d;
            ns_tsb_putc(b, '{');
            for (size_t i = 0; i < d->n; i++) {
                if (i) ns_tsb_puts(b, ", ");
                tv_print(b, &d->keys[i], 1, ps);
                ns_tsb_puts(b, ": ");
                tv_print(b, &d->vals[i], 1, ps);
            }
            ns_tsb_putc(b, '}');
            ps->n--;
        }
        if (v->kind == NS_TV_NS) ns_tsb_putc(b, '>');
        return;
    }
    default:
        ns_tsb_printf(b, "<%s object>", ns_tv_type_name(v));
        return;
    }
}

void ns_tv_str_append(ns_tsb *b, const ns_tv *v) {
    print_stack ps;
    ps.n = 0;
    tv_print(b, v, 0, &ps);
}

void ns_tv_repr_append(ns_tsb *b, const ns_tv *v) {
    print_stack ps;
    ps.n = 0;
    tv_print(b, v, 1, &ps);
}

ns_status ns_tv_to_str(ns_tarena *a, const ns_tv *v, ns_tv *out, ns_error *err) {
    if (v->kind == NS_TV_STR) {
        *out = *v;
        return NS_OK;
    }
    if (v->kind == NS_TV_UNDEF) {
        *out = ns_tv_str("", 0);
        return NS_OK;
    }
    ns_tsb b;
    ns_tsb_init(&b, a);
    ns_tv_str_append(&b, v);
    return ns_tsb_finish(&b, out, err);
}

/* ---- JSON import -------------------------------------------------------------- */

static ns_status from_json(ns_tarena *a, const json_t *j, ns_tv *out, int depth, ns_error *err) {
    if (depth > NS_TV_MAX_DEPTH) return ns_fail(err, NS_ERR_RANGE, "template context nested too deeply");
    memset(out, 0, sizeof *out);
    switch (json_typeof(j)) {
    case JSON_NULL: out->kind = NS_TV_NONE; return NS_OK;
    case JSON_TRUE: *out = ns_tv_bool(1); return NS_OK;
    case JSON_FALSE: *out = ns_tv_bool(0); return NS_OK;
    case JSON_INTEGER: *out = ns_tv_int((int64_t)json_integer_value(j)); return NS_OK;
    case JSON_REAL: *out = ns_tv_float(json_real_value(j)); return NS_OK;
    case JSON_STRING: *out = ns_tv_str(json_string_value(j), json_string_length(j)); return NS_OK;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        ns_tlist *l = ns_tlist_new(a, n, 0);
        if (!l) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        for (size_t i = 0; i < n; i++) {
            ns_status st = from_json(a, json_array_get(j, i), &l->v[i], depth + 1, err);
            if (st != NS_OK) return st;
        }
        out->kind = NS_TV_LIST;
        out->u.l = l;
        return NS_OK;
    }
    case JSON_OBJECT: {
        ns_tdict *d = ns_tdict_new(a, json_object_size(j));
        if (!d) return ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        const char *key;
        size_t klen;
        json_t *val;
        json_object_keylen_foreach((json_t *)j, key, klen, val) {
            ns_tv v;
            ns_status st = from_json(a, val, &v, depth + 1, err);
            if (st != NS_OK) return st;
            st = ns_tdict_set(a, d, ns_tv_str(key, klen), v, err);
            if (st != NS_OK) return st;
        }
        out->kind = NS_TV_DICT;
        out->u.d = d;
        return NS_OK;
    }
    }
    return ns_fail(err, NS_ERR_INVALID, "unsupported JSON value in template context");
}

ns_status ns_tv_from_json(ns_tarena *a, const json_t *j, ns_tv *out, ns_error *err) {
    return from_json(a, j, out, 0, err);
}
