#include "template/methods.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "template/ops.h"
#include "template/ustr.h"
#include "util/utf8.h"

#define MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

static int name_is(const char *a, size_t n, const char *lit) { return strlen(lit) == n && memcmp(a, lit, n) == 0; }

static int in_list(const char *const *list, const char *name, size_t n) {
    for (size_t i = 0; list[i]; i++)
        if (name_is(name, n, list[i])) return 1;
    return 0;
}

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill",
    NULL};
static const char *const DICT_SAFE[] = {"copy", "fromkeys", "get", "items", "keys", "values", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_SAFE[] = {"copy", "count", "index", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};
static const char *const TUPLE_SAFE[] = {"count", "index", NULL};
static const char *const CYCLER_METHODS[] = {"next", "reset", NULL};

int ns_tmethod_kind(const ns_tv *self, const char *name, size_t n) {
    switch (self->kind) {
    case NS_TV_STR: return in_list(STR_METHODS, name, n) ? NS_TMETHOD_SAFE : NS_TMETHOD_NONE;
    case NS_TV_DICT:
        if (in_list(DICT_SAFE, name, n)) return NS_TMETHOD_SAFE;
        return in_list(DICT_UNSAFE, name, n) ? NS_TMETHOD_UNSAFE : NS_TMETHOD_NONE;
    case NS_TV_LIST:
        if (self->u.l->tuple) return in_list(TUPLE_SAFE, name, n) ? NS_TMETHOD_SAFE : NS_TMETHOD_NONE;
        if (in_list(LIST_SAFE, name, n)) return NS_TMETHOD_SAFE;
        return in_list(LIST_UNSAFE, name, n) ? NS_TMETHOD_UNSAFE : NS_TMETHOD_NONE;
    case NS_TV_CYCLER: return in_list(CYCLER_METHODS, name, n) ? NS_TMETHOD_SAFE : NS_TMETHOD_NONE;
    case NS_TV_LOOP: return (name_is(name, n, "cycle") || name_is(name, n, "changed")) ? NS_TMETHOD_SAFE : 0;
    default: return NS_TMETHOD_NONE;
    }
}

/* ---- small helpers ----------------------------------------------------------------- */

static ns_status want_str(ns_tctx *c, const ns_tv *v, const char *what) {
    if (v && v->kind == NS_TV_STR) return NS_OK;
    if (v && v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
    return ns_trt_fail(c, NS_ERR_INVALID, "%s must be str, not %s", what, v ? ns_tv_type_name(v) : "nothing");
}

static ns_status mk_list(ns_tctx *c, ns_tvec *vec, int tuple, ns_tv *out) {
    return ns_tvec_finish(c->a, vec, tuple, out, c->err);
}

static ns_status push(ns_tctx *c, ns_tvec *vec, ns_tv v) { return ns_tvec_push(c->a, vec, v, c->err); }

static int is_none(const ns_tv *v) { return !v || v->kind == NS_TV_NONE; }

/* Does code point cp appear in chars? */
static int cp_in(uint32_t cp, const ns_tv *chars) {
    size_t i = 0;
    while (i < chars->u.s.n)
        if (ns_utf8_next(chars->u.s.p, chars->u.s.n, &i) == cp) return 1;
    return 0;
}

/* ---- string helpers ------------------------------------------------------------------- */

/* Python's unconditional one-to-many case mappings (SpecialCasing.txt)
 * that the simple mappings lack: upper, then title spelling. */
static const struct {
    uint32_t cp;
    const char *upper, *title;
} SPECIAL_CASE[] = {
    {0x00DF, "SS", "Ss"},
    {0xFB00, "FF", "Ff"},
    {0xFB01, "FI", "Fi"},
    {0xFB02, "FL", "Fl"},
    {0xFB03, "FFI", "Ffi"},
    {0xFB04, "FFL", "Ffl"},
    {0xFB05, "ST", "St"},
    {0xFB06, "ST", "St"},
    {0x0149, "\xCA\xBCN", "\xCA\xBCN"},
    {0x01F0, "J\xCC\x8C", "J\xCC\x8C"},
    {0x0587, "\xD4\xB5\xD5\x92", "\xD4\xB5\xD6\x82"},
};

static const char *special_case(uint32_t cp, int title) {
    if (cp < 0xDF) return NULL;
    for (size_t i = 0; i < sizeof SPECIAL_CASE / sizeof SPECIAL_CASE[0]; i++)
        if (SPECIAL_CASE[i].cp == cp) return title ? SPECIAL_CASE[i].title : SPECIAL_CASE[i].upper;
    return NULL;
}

/* Python lowers a capital sigma at the end of a word to final sigma. */
static int final_sigma(const char *p, size_t n, size_t at, size_t next) {
    if (at == 0) return 0;
    size_t j = at;
    if (!ns_u_iscased(ns_utf8_prev(p, &j))) return 0;
    if (next >= n) return 1;
    size_t k = next;
    return !ns_u_iscased(ns_utf8_next(p, n, &k));
}

ns_status ns_tstr_case(ns_tctx *c, const ns_tv *s, int mode, ns_tv *out) {
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    size_t i = 0;
    int prev_cased = 0, first = 1;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    while (i < n) {
        size_t at = i;
        uint32_t cp = ns_utf8_next(p, n, &i), o = cp;
        int to_upper = 0, to_title = 0, to_lower = 0;
        switch (mode) {
        case NS_TCASE_LOWER: to_lower = 1; break;
        case NS_TCASE_UPPER: to_upper = 1; break;
        case NS_TCASE_SWAP:
            if (ns_u_isupper(cp)) to_lower = 1;
            else if (ns_u_islower(cp)) to_upper = 1;
            break;
        case NS_TCASE_CAPITALIZE:
            if (first) to_title = 1;
            else to_lower = 1;
            break;
        case NS_TCASE_TITLE:
            if (prev_cased) to_lower = 1;
            else to_title = 1;
            prev_cased = ns_u_iscased(cp);
            break;
        }
        first = 0;
        const char *sp = (to_upper || to_title) ? special_case(cp, to_title) : NULL;
        if (sp) {
            ns_tsb_puts(&b, sp);
            continue;
        }
        if (to_lower && cp == 0x0130) { /* İ -> i + combining dot above */
            ns_tsb_puts(&b, "i\xCC\x87");
            continue;
        }
        if (to_lower) o = (cp == 0x03A3 && final_sigma(p, n, at, i)) ? 0x03C2 : ns_u_lower(cp);
        else if (to_upper) o = ns_u_upper(cp);
        else if (to_title) o = ns_u_title(cp);
        ns_tsb_putcp(&b, o);
    }
    return ns_tsb_finish(&b, out, c->err);
}

ns_status ns_tstr_strip(ns_tctx *c, const ns_tv *s, const ns_tv *chars, int left, int right, ns_tv *out) {
    if (!is_none(chars)) {
        ns_status st = want_str(c, chars, "strip arg");
        if (st != NS_OK) return st;
    }
    const char *p = s->u.s.p;
    size_t lo = 0, hi = s->u.s.n;
    if (left)
        while (lo < hi) {
            size_t j = lo;
            uint32_t cp = ns_utf8_next(p, hi, &j);
            if (is_none(chars) ? !ns_u_isspace(cp) : !cp_in(cp, chars)) break;
            lo = j;
        }
    if (right)
        while (hi > lo) {
            size_t j = hi;
            uint32_t cp = ns_utf8_prev(p, &j);
            if (j < lo || (is_none(chars) ? !ns_u_isspace(cp) : !cp_in(cp, chars))) break;
            hi = j;
        }
    *out = ns_tv_str(p + lo, hi - lo);
    return NS_OK;
}

ns_status ns_tstr_replace(ns_tctx *c, const ns_tv *s, const ns_tv *old, const ns_tv *rep, int64_t count, ns_tv *out) {
    ns_status st = want_str(c, old, "replace() argument 1");
    if (st == NS_OK) st = want_str(c, rep, "replace() argument 2");
    if (st != NS_OK) return st;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, on = old->u.s.n;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    if (count < 0) count = INT64_MAX;
    if (on == 0) {
        /* Python inserts rep before every code point and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (done < count) {
            ns_tsb_put(&b, rep->u.s.p, rep->u.s.n);
            done++;
            if (i >= n) break;
            size_t j = i;
            ns_utf8_next(p, n, &j);
            ns_tsb_put(&b, p + i, j - i);
            i = j;
        }
        ns_tsb_put(&b, p + i, n - i);
        return ns_tsb_finish(&b, out, c->err);
    }
    size_t i = 0;
    int64_t done = 0;
    while (done < count) {
        const char *hit = memmem(p + i, n - i, old->u.s.p, on);
        if (!hit) break;
        size_t k = (size_t)(hit - p);
        ns_tsb_put(&b, p + i, k - i);
        ns_tsb_put(&b, rep->u.s.p, rep->u.s.n);
        i = k + on;
        done++;
    }
    if (done == 0) {
        *out = *s;
        out->safe = 0;
        return NS_OK;
    }
    ns_tsb_put(&b, p + i, n - i);
    return ns_tsb_finish(&b, out, c->err);
}

ns_status ns_tstr_split(ns_tctx *c, const ns_tv *s, const ns_tv *sep, int64_t maxsplit, int right, ns_tv *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    ns_tvec v = {0};
    ns_status st = NS_OK;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (is_none(sep)) {
        if (!right) {
            size_t i = 0;
            while (maxsplit-- > 0) {
                while (i < n) {
                    size_t j = i;
                    if (!ns_u_isspace(ns_utf8_next(p, n, &j))) break;
                    i = j;
                }
                if (i == n) break;
                size_t start = i;
                while (i < n) {
                    size_t j = i;
                    if (ns_u_isspace(ns_utf8_next(p, n, &j))) break;
                    i = j;
                }
                if ((st = push(c, &v, ns_tv_str(p + start, i - start))) != NS_OK) return st;
            }
            if (i < n) {
                while (i < n) {
                    size_t j = i;
                    if (!ns_u_isspace(ns_utf8_next(p, n, &j))) break;
                    i = j;
                }
                if (i < n && (st = push(c, &v, ns_tv_str(p + i, n - i))) != NS_OK) return st;
            }
            return mk_list(c, &v, 0, out);
        }
        /* rsplit on whitespace: collect from the right, then reverse */
        size_t i = n;
        while (maxsplit-- > 0) {
            while (i > 0) {
                size_t j = i;
                if (!ns_u_isspace(ns_utf8_prev(p, &j))) break;
                i = j;
            }
            if (i == 0) break;
            size_t end = i;
            while (i > 0) {
                size_t j = i;
                if (ns_u_isspace(ns_utf8_prev(p, &j))) break;
                i = j;
            }
            if ((st = push(c, &v, ns_tv_str(p + i, end - i))) != NS_OK) return st;
        }
        if (i > 0) {
            while (i > 0) {
                size_t j = i;
                if (!ns_u_isspace(ns_utf8_prev(p, &j))) break;
                i = j;
            }
            if (i > 0 && (st = push(c, &v, ns_tv_str(p, i))) != NS_OK) return st;
        }
    } else {
        if ((st = want_str(c, sep, "separator")) != NS_OK) return st;
        size_t sn = sep->u.s.n;
        if (sn == 0) return ns_trt_fail(c, NS_ERR_INVALID, "empty separator");
        if (!right) {
            size_t i = 0;
            while (maxsplit-- > 0) {
                const char *hit = memmem(p + i, n - i, sep->u.s.p, sn);
                if (!hit) break;
                size_t k = (size_t)(hit - p);
                if ((st = push(c, &v, ns_tv_str(p + i, k - i))) != NS_OK) return st;
                i = k + sn;
            }
            if ((st = push(c, &v, ns_tv_str(p + i, n - i))) != NS_OK) return st;
            return mk_list(c, &v, 0, out);
        }
        size_t end = n;
        while (maxsplit-- > 0) {
            size_t k = end;
            int found = 0;
            while (k >= sn) {
                if (memcmp(p + k - sn, sep->u.s.p, sn) == 0) {
                    found = 1;
                    break;
                }
                k--;
            }
            if (!found) break;
            if ((st = push(c, &v, ns_tv_str(p + k, end - k))) != NS_OK) return st;
            end = k - sn;
        }
        if ((st = push(c, &v, ns_tv_str(p, end))) != NS_OK) return st;
    }
    for (size_t a = 0, z = v.n ? v.n - 1 : 0; a < z; a++, z--) {
        ns_tv t = v.v[a];
        v.v[a] = v.v[z];
        v.v[z] = t;
    }
    return mk_list(c, &v, 0, out);
}

ns_status ns_tstr_splitlines(ns_tctx *c, const ns_tv *s, int keepends, ns_tv *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0, start = 0;
    ns_tvec v = {0};
    ns_status st;
    while (i < n) {
        size_t j = i;
        uint32_t cp = ns_utf8_next(p, n, &j);
        if (!ns_u_islinebreak(cp)) {
            i = j;
            continue;
        }
        size_t eol = j;
        if (cp == '\r' && eol < n && p[eol] == '\n') eol++;
        if ((st = push(c, &v, ns_tv_str(p + start, (keepends ? eol : i) - start))) != NS_OK) return st;
        i = start = eol;
    }
    if (start < n && (st = push(c, &v, ns_tv_str(p + start, n - start))) != NS_OK) return st;
    return mk_list(c, &v, 0, out);
}

ns_status ns_tstr_join(ns_tctx *c, const ns_tv *sep, const ns_tlist *items, ns_tv *out) {
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    for (size_t i = 0; i < items->n; i++) {
        const ns_tv *it = &items->v[i];
        if (it->kind != NS_TV_STR)
            return ns_trt_fail(c, NS_ERR_INVALID, "sequence item %zu: expected str instance, %s found", i,
                               ns_tv_type_name(it));
        if (i) ns_tsb_put(&b, sep->u.s.p, sep->u.s.n);
        ns_tsb_put(&b, it->u.s.p, it->u.s.n);
    }
    return ns_tsb_finish(&b, out, c->err);
}

/* Code point range [lo, hi) of s selected by optional start/end args. */
static ns_status sub_range(ns_tctx *c, const ns_tv *s, const ns_tv *start, const ns_tv *end, int64_t *lo,
                           int64_t *hi) {
    int64_t len = ns_tv_len(s);
    *lo = 0;
    *hi = len;
    ns_status st;
    if (!is_none(start)) {
        if ((st = ns_twant_int(c, start, "slice index", lo)) != NS_OK) return st;
        if (*lo < 0) *lo = *lo + len < 0 ? 0 : *lo + len;
        if (*lo > len) *lo = len;
    }
    if (!is_none(end)) {
        if ((st = ns_twant_int(c, end, "slice index", hi)) != NS_OK) return st;
        if (*hi < 0) *hi = *hi + len < 0 ? 0 : *hi + len;
        if (*hi > len) *hi = len;
    }
    return NS_OK;
}

static ns_tv sub_str(const ns_tv *s, int64_t lo, int64_t hi) {
    if (hi < lo) hi = lo;
    size_t a = ns_utf8_offset(s->u.s.p, s->u.s.n, (size_t)lo);
    size_t b = a + ns_utf8_offset(s->u.s.p + a, s->u.s.n - a, (size_t)(hi - lo));
    return ns_tv_str(s->u.s.p + a, b - a);
}

static int has_affix(const ns_tv *s, const ns_tv *affix, int suffix) {
    if (affix->u.s.n > s->u.s.n) return 0;
    const char *at = suffix ? s->u.s.p + s->u.s.n - affix->u.s.n : s->u.s.p;
    return memcmp(at, affix->u.s.p, affix->u.s.n) == 0;
}

static ns_status str_affix(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, int suffix, ns_tv *out) {
    const ns_tv *what = ns_targ(a, 0, NULL);
    if (!what) return ns_trt_fail(c, NS_ERR_INVALID, "%s() takes at least 1 argument", suffix ? "endswith" : "startswith");
    int64_t lo, hi;
    ns_status st = sub_range(c, self, ns_targ(a, 1, NULL), ns_targ(a, 2, NULL), &lo, &hi);
    if (st != NS_OK) return st;
    ns_tv s = (lo == 0 && hi == ns_tv_len(self)) ? *self : sub_str(self, lo, hi);
    if (what->kind == NS_TV_STR) {
        *out = ns_tv_bool(lo <= hi && has_affix(&s, what, suffix));
        return NS_OK;
    }
    if (what->kind == NS_TV_LIST && what->u.l->tuple) {
        for (size_t i = 0; i < what->u.l->n; i++) {
            if ((st = want_str(c, &what->u.l->v[i], "tuple item")) != NS_OK) return st;
            if (lo <= hi && has_affix(&s, &what->u.l->v[i], suffix)) {
                *out = ns_tv_bool(1);
                return NS_OK;
            }
        }
        *out = ns_tv_bool(0);
        return NS_OK;
    }
    if (what->kind == NS_TV_UNDEF) return ns_tundef_fail(c, what);
    return ns_trt_fail(c, NS_ERR_INVALID, "%s first arg must be str or a tuple of str, not %s",
                       suffix ? "endswith" : "startswith", ns_tv_type_name(what));
}

/* find/rfind/index/rindex/count */
static ns_status str_find(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, int reverse, int count, int strict,
                          ns_tv *out) {
    const ns_tv *sub = ns_targ(a, 0, NULL);
    ns_status st = want_str(c, sub, "substring");
    if (st != NS_OK) return st;
    int64_t lo, hi;
    if ((st = sub_range(c, self, ns_targ(a, 1, NULL), ns_targ(a, 2, NULL), &lo, &hi)) != NS_OK) return st;
    if (hi < lo) {
        if (count) *out = ns_tv_int(0);
        else if (strict) return ns_trt_fail(c, NS_ERR_INVALID, "substring not found");
        else *out = ns_tv_int(-1);
        return NS_OK;
    }
    ns_tv s = sub_str(self, lo, hi);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, sn = sub->u.s.n;
    if (count) {
        int64_t k = 0;
        if (sn == 0) k = (int64_t)ns_utf8_count(p, n) + 1;
        else
            for (size_t i = 0; i + sn <= n;) {
                const char *hit = memmem(p + i, n - i, sub->u.s.p, sn);
                if (!hit) break;
                k++;
                i = (size_t)(hit - p) + sn;
            }
        *out = ns_tv_int(k);
        return NS_OK;
    }
    long found = -1;
    if (!reverse) {
        const char *hit = sn ? memmem(p, n, sub->u.s.p, sn) : p;
        if (hit) found = (long)(hit - p);
    } else if (sn <= n) {
        for (size_t k = n - sn + 1; k-- > 0;)
            if (memcmp(p + k, sub->u.s.p, sn) == 0) {
                found = (long)k;
                break;
            }
    }
    if (found < 0) {
        if (strict) return ns_trt_fail(c, NS_ERR_INVALID, "substring not found");
        *out = ns_tv_int(-1);
        return NS_OK;
    }
    *out = ns_tv_int(lo + (int64_t)ns_utf8_count(p, (size_t)found));
    return NS_OK;
}

static ns_status str_pad(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, int mode, ns_tv *out) {
    /* mode: 0 center, 1 ljust, 2 rjust, 3 zfill */
    const ns_tv *w = ns_targ(a, 0, "width");
    int64_t width;
    if (!w) return ns_trt_fail(c, NS_ERR_INVALID, "missing width argument");
    ns_status st = ns_twant_int(c, w, "width", &width);
    if (st != NS_OK) return st;
    const char *fill = " ";
    size_t fill_n = 1;
    const ns_tv *f = mode == 3 ? NULL : ns_targ(a, 1, "fillchar");
    if (f) {
        if ((st = want_str(c, f, "fill character")) != NS_OK) return st;
        if (ns_utf8_count(f->u.s.p, f->u.s.n) != 1)
            return ns_trt_fail(c, NS_ERR_INVALID, "The fill character must be exactly one character long");
        fill = f->u.s.p;
        fill_n = f->u.s.n;
    }
    int64_t len = ns_tv_len(self);
    if (width <= len) {
        *out = *self;
        return NS_OK;
    }
    if (width > (1 << 24)) return ns_toom(c);
    int64_t pad = width - len, left;
    if (mode == 0) left = pad / 2 + (pad & width & 1);
    else if (mode == 1) left = 0;
    else left = pad;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    size_t body = 0;
    if (mode == 3) {
        fill = "0";
        if (self->u.s.n && (self->u.s.p[0] == '+' || self->u.s.p[0] == '-')) {
            ns_tsb_putc(&b, self->u.s.p[0]);
            body = 1;
        }
    }
    for (int64_t i = 0; i < left; i++) ns_tsb_put(&b, fill, fill_n);
    ns_tsb_put(&b, self->u.s.p + body, self->u.s.n - body);
    for (int64_t i = left; i < pad; i++) ns_tsb_put(&b, fill, fill_n);
    return ns_tsb_finish(&b, out, c->err);
}

static ns_status str_partition(ns_tctx *c, const ns_tv *self, const ns_tv *sep, int right, ns_tv *out) {
    ns_status st = want_str(c, sep, "separator");
    if (st != NS_OK) return st;
    if (!sep->u.s.n) return ns_trt_fail(c, NS_ERR_INVALID, "empty separator");
    ns_tlist *l = ns_tlist_new(c->a, 3, 1);
    if (!l) return ns_toom(c);
    const char *p = self->u.s.p;
    size_t n = self->u.s.n, sn = sep->u.s.n;
    long at = -1;
    if (!right) {
        const char *hit = memmem(p, n, sep->u.s.p, sn);
        if (hit) at = (long)(hit - p);
    } else if (sn <= n) {
        for (size_t k = n - sn + 1; k-- > 0;)
            if (memcmp(p + k, sep->u.s.p, sn) == 0) {
                at = (long)k;
                break;
            }
    }
    if (at < 0) {
        l->v[0] = right ? ns_tv_str("", 0) : *self;
        l->v[1] = ns_tv_str("", 0);
        l->v[2] = right ? *self : ns_tv_str("", 0);
    } else {
        l->v[0] = ns_tv_str(p, (size_t)at);
        l->v[1] = *sep;
        l->v[2] = ns_tv_str(p + at + sn, n - (size_t)at - sn);
    }
    memset(out, 0, sizeof *out);
    out->kind = NS_TV_LIST;
    out->u.l = l;
    return NS_OK;
}

static int pred(uint32_t cp, int which) {
    switch (which) {
    case 0: return ns_u_isdigit(cp);
    case 1: return ns_u_isalpha(cp);
    case 2: return ns_u_isalpha(cp) || ns_u_isnumeric(cp);
    case 3: return ns_u_isspace(cp);
    case 4: return ns_u_isnumeric(cp);
    case 5: return cp < 0x80;
    default: return 0;
    }
}

static ns_tv str_is(const ns_tv *s, const char *name, size_t n) {
    const char *p = s->u.s.p;
    size_t len = s->u.s.n, i = 0;
    if (name_is(name, n, "islower") || name_is(name, n, "isupper")) {
        int want_lower = name_is(name, n, "islower"), cased = 0;
        while (i < len) {
            uint32_t cp = ns_utf8_next(p, len, &i);
            if (want_lower ? ns_u_isupper(cp) : ns_u_islower(cp)) return ns_tv_bool(0);
            if (ns_u_iscased(cp)) cased = 1;
        }
        return ns_tv_bool(cased);
    }
    if (name_is(name, n, "istitle")) {
        int prev_cased = 0, any = 0;
        while (i < len) {
            uint32_t cp = ns_utf8_next(p, len, &i);
            if (ns_u_isupper(cp)) {
                if (prev_cased) return ns_tv_bool(0);
                prev_cased = any = 1;
            } else if (ns_u_islower(cp)) {
                if (!prev_cased) return ns_tv_bool(0);
                prev_cased = any = 1;
            } else {
                prev_cased = 0;
            }
        }
        return ns_tv_bool(any);
    }
    if (name_is(name, n, "isidentifier")) {
        int first = 1;
        if (!len) return ns_tv_bool(0);
        while (i < len) {
            uint32_t cp = ns_utf8_next(p, len, &i);
            if (!(cp == '_' || ns_u_isalpha(cp) || (!first && ns_u_isdigit(cp)))) return ns_tv_bool(0);
            first = 0;
        }
        return ns_tv_bool(1);
    }
    if (name_is(name, n, "isprintable")) {
        while (i < len)
            if (!ns_u_isprintable(ns_utf8_next(p, len, &i))) return ns_tv_bool(0);
        return ns_tv_bool(1);
    }
    int which = name_is(name, n, "isdigit") || name_is(name, n, "isdecimal") ? 0
                : name_is(name, n, "isalpha")                                ? 1
                : name_is(name, n, "isalnum")                                ? 2
                : name_is(name, n, "isspace")                                ? 3
                : name_is(name, n, "isnumeric")                              ? 4
                                                                             : 5;
    if (which == 5) return ns_tv_bool(1); /* isascii: empty is True */
    if (!len) return ns_tv_bool(0);
    while (i < len)
        if (!pred(ns_utf8_next(p, len, &i), which)) return ns_tv_bool(0);
    return ns_tv_bool(1);
}

static ns_status str_format(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, ns_tv *out);

static ns_status str_method(ns_tctx *c, const ns_tv *self, const char *name, size_t n, const ns_tcallargs *a,
                            ns_tv *out) {
    ns_status st;
    if (name_is(name, n, "startswith")) return str_affix(c, self, a, 0, out);
    if (name_is(name, n, "endswith")) return str_affix(c, self, a, 1, out);
    if (name_is(name, n, "strip")) return ns_tstr_strip(c, self, ns_targ(a, 0, "chars"), 1, 1, out);
    if (name_is(name, n, "lstrip")) return ns_tstr_strip(c, self, ns_targ(a, 0, "chars"), 1, 0, out);
    if (name_is(name, n, "rstrip")) return ns_tstr_strip(c, self, ns_targ(a, 0, "chars"), 0, 1, out);
    if (name_is(name, n, "lower") || name_is(name, n, "casefold")) return ns_tstr_case(c, self, NS_TCASE_LOWER, out);
    if (name_is(name, n, "upper")) return ns_tstr_case(c, self, NS_TCASE_UPPER, out);
    if (name_is(name, n, "title")) return ns_tstr_case(c, self, NS_TCASE_TITLE, out);
    if (name_is(name, n, "capitalize")) return ns_tstr_case(c, self, NS_TCASE_CAPITALIZE, out);
    if (name_is(name, n, "swapcase")) return ns_tstr_case(c, self, NS_TCASE_SWAP, out);
    if (name_is(name, n, "split") || name_is(name, n, "rsplit")) {
        const ns_tv *ms = ns_targ(a, 1, "maxsplit");
        int64_t maxsplit = -1;
        if (ms && (st = ns_twant_int(c, ms, "maxsplit", &maxsplit)) != NS_OK) return st;
        return ns_tstr_split(c, self, ns_targ(a, 0, "sep"), maxsplit, name[0] == 'r', out);
    }
    if (name_is(name, n, "splitlines")) {
        const ns_tv *k = ns_targ(a, 0, "keepends");
        return ns_tstr_splitlines(c, self, k && ns_tv_truthy(k), out);
    }
    if (name_is(name, n, "replace")) {
        const ns_tv *cnt = ns_targ(a, 2, "count");
        int64_t count = -1;
        if (cnt && (st = ns_twant_int(c, cnt, "count", &count)) != NS_OK) return st;
        return ns_tstr_replace(c, self, ns_targ(a, 0, NULL), ns_targ(a, 1, NULL), count, out);
    }
    if (name_is(name, n, "find")) return str_find(c, self, a, 0, 0, 0, out);
    if (name_is(name, n, "rfind")) return str_find(c, self, a, 1, 0, 0, out);
    if (name_is(name, n, "index")) return str_find(c, self, a, 0, 0, 1, out);
    if (name_is(name, n, "rindex")) return str_find(c, self, a, 1, 0, 1, out);
    if (name_is(name, n, "count")) return str_find(c, self, a, 0, 1, 0, out);
    if (name_is(name, n, "join")) {
        const ns_tv *it = ns_targ(a, 0, NULL);
        if (!it) return ns_trt_fail(c, NS_ERR_INVALID, "join() takes exactly one argument");
        const ns_tlist *items;
        if ((st = ns_titer(c, it, &items)) != NS_OK) return st;
        return ns_tstr_join(c, self, items, out);
    }
    if (name_is(name, n, "format")) return str_format(c, self, a, out);
    if (name_is(name, n, "partition")) return str_partition(c, self, ns_targ(a, 0, NULL), 0, out);
    if (name_is(name, n, "rpartition")) return str_partition(c, self, ns_targ(a, 0, NULL), 1, out);
    if (name_is(name, n, "removeprefix") || name_is(name, n, "removesuffix")) {
        const ns_tv *x = ns_targ(a, 0, NULL);
        if ((st = want_str(c, x, "argument")) != NS_OK) return st;
        int suffix = name[6] == 's';
        *out = *self;
        if (has_affix(self, x, suffix)) {
            out->u.s.n -= x->u.s.n;
            if (!suffix) out->u.s.p += x->u.s.n;
        }
        return NS_OK;
    }
    if (name_is(name, n, "center")) return str_pad(c, self, a, 0, out);
    if (name_is(name, n, "ljust")) return str_pad(c, self, a, 1, out);
    if (name_is(name, n, "rjust")) return str_pad(c, self, a, 2, out);
    if (name_is(name, n, "zfill")) return str_pad(c, self, a, 3, out);
    if (n > 2 && name[0] == 'i' && name[1] == 's') {
        *out = str_is(self, name, n);
        return NS_OK;
    }
    return ns_trt_fail(c, NS_ERR_UNSUPPORTED, "str.%.*s() is not supported", (int)n, name);
}

static ns_status list_index_count(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, int count, ns_tv *out) {
    const ns_tv *x = ns_targ(a, 0, NULL);
    if (!x) return ns_trt_fail(c, NS_ERR_INVALID, "missing argument");
    const ns_tlist *l = self->u.l;
    int64_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (ns_tv_eq(&l->v[i], x)) {
            if (!count) {
                *out = ns_tv_int((int64_t)i);
                return NS_OK;
            }
            k++;
        }
    if (!count) return ns_trt_fail(c, NS_ERR_INVALID, "value is not in list");
    *out = ns_tv_int(k);
    return NS_OK;
}

static ns_status dict_method(ns_tctx *c, const ns_tv *self, const char *name, size_t n, const ns_tcallargs *a,
                             ns_tv *out) {
    const ns_tdict *d = self->u.d;
    ns_status st = ns_tstep(c, d->n);
    if (st != NS_OK) return st;
    if (name_is(name, n, "get")) {
        const ns_tv *k = ns_targ(a, 0, NULL), *def = ns_targ(a, 1, NULL);
        if (!k) return ns_trt_fail(c, NS_ERR_INVALID, "get expected at least 1 argument, got 0");
        if (!ns_tdict_get(d, k, out)) *out = def ? *def : ns_tv_none();
        return NS_OK;
    }
    if (name_is(name, n, "copy")) {
        ns_tdict *nd = ns_tdict_new(c->a, d->n);
        if (!nd) return ns_toom(c);
        for (size_t i = 0; i < d->n; i++)
            if ((st = ns_tdict_set(c->a, nd, d->keys[i], d->vals[i], c->err)) != NS_OK) return st;
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_DICT;
        out->u.d = nd;
        return NS_OK;
    }
    int items = name_is(name, n, "items"), keys = name_is(name, n, "keys"), vals = name_is(name, n, "values");
    if (items || keys || vals) {
        ns_tlist *l = ns_tlist_new(c->a, d->n, 0);
        if (!l) return ns_toom(c);
        for (size_t i = 0; i < d->n; i++) {
            if (items) {
                ns_tlist *pair = ns_tlist_new(c->a, 2, 1);
                if (!pair) return ns_toom(c);
                pair->v[0] = d->keys[i];
                pair->v[1] = d->vals[i];
                l->v[i].kind = NS_TV_LIST;
                l->v[i].u.l = pair;
            } else {
                l->v[i] = keys ? d->keys[i] : d->vals[i];
            }
        }
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_LIST;
        out->u.l = l;
        return NS_OK;
    }
    return ns_trt_fail(c, NS_ERR_UNSUPPORTED, "dict.%.*s() is not supported", (int)n, name);
}

ns_status ns_tmethod_call(ns_tctx *c, const ns_tmethod *m, const ns_tcallargs *a, ns_tv *out) {
    const ns_tv *self = &m->self;
    const char *name = m->name;
    size_t n = m->name_n;
    switch (self->kind) {
    case NS_TV_STR: return str_method(c, self, name, n, a, out);
    case NS_TV_DICT: return dict_method(c, self, name, n, a, out);
    case NS_TV_LIST:
        if (name_is(name, n, "count")) return list_index_count(c, self, a, 1, out);
        if (name_is(name, n, "index")) return list_index_count(c, self, a, 0, out);
        if (name_is(name, n, "copy")) {
            ns_tlist *l = ns_tlist_new(c->a, self->u.l->n, 0);
            if (!l) return ns_toom(c);
            memcpy(l->v, self->u.l->v, self->u.l->n * sizeof(ns_tv));
            memset(out, 0, sizeof *out);
            out->kind = NS_TV_LIST;
            out->u.l = l;
            return NS_OK;
        }
        break;
    case NS_TV_LOOP: {
        ns_tloop *L = self->u.obj;
        if (name_is(name, n, "cycle")) {
            if (!a->npos) return ns_trt_fail(c, NS_ERR_INVALID, "no items for cycling given");
            *out = a->pos[L->index0 % a->npos];
            return NS_OK;
        }
        if (name_is(name, n, "changed")) {
            ns_tlist *l = ns_tlist_new(c->a, a->npos, 1);
            if (!l) return ns_toom(c);
            memcpy(l->v, a->pos, a->npos * sizeof(ns_tv));
            ns_tv now = {0};
            now.kind = NS_TV_LIST;
            now.u.l = l;
            int changed = !L->changed_set || !ns_tv_eq(&now, &L->changed_last);
            L->changed_set = 1;
            L->changed_last = now;
            *out = ns_tv_bool(changed);
            return NS_OK;
        }
        break;
    }
    case NS_TV_CYCLER: {
        ns_tcycler *cy = self->u.obj;
        if (name_is(name, n, "next")) {
            *out = cy->items->v[cy->pos];
            cy->pos = (cy->pos + 1) % cy->items->n;
            return NS_OK;
        }
        if (name_is(name, n, "reset")) {
            cy->pos = 0;
            *out = ns_tv_none();
            return NS_OK;
        }
        break;
    }
    default: break;
    }
    return ns_trt_fail(c, NS_ERR_UNSUPPORTED, "%s.%.*s() is not supported", ns_tv_type_name(self), (int)n, name);
}

/* ---- printf-style and str.format formatting ------------------------------------------------ */

/* *v = *v * 10 + digit (an unset -1 counts as 0); false once the number
 * passes FMT_MAX_NUM, so a width, precision or index of many digits fails
 * instead of overflowing (Python refuses them too). */
#define FMT_MAX_NUM ((int64_t)1 << 40)
static bool push_digit(int64_t *v, char digit) {
    int64_t x = (*v < 0 ? 0 : *v) * 10 + (digit - '0');
    if (x > FMT_MAX_NUM) return false;
    *v = x;
    return true;
}

typedef struct {
    char fill[4];
    size_t fill_n;
    char align; /* '<' '>' '^' '=' or 0 */
    char sign;  /* '+' '-' ' ' or 0 */
    int alt, zero;
    int64_t width, prec; /* -1 = unset */
    char type;           /* 0 = default */
} fspec;

static void put_padded(ns_tsb *b, const fspec *f, const char *s, size_t n, char def_align) {
    int64_t len = (int64_t)ns_utf8_count(s, n);
    int64_t pad = f->width > len ? f->width - len : 0;
    if (pad > (1 << 24)) pad = 1 << 24;
    char align = f->align ? f->align : def_align;
    const char *fill = f->fill_n ? f->fill : " ";
    size_t fill_n = f->fill_n ? f->fill_n : 1;
    int64_t left = align == '>' ? pad : align == '^' ? pad / 2 : 0;
    if (align == '=' && n && (s[0] == '-' || s[0] == '+' || s[0] == ' ')) {
        ns_tsb_putc(b, s[0]);
        s++;
        n--;
        left = pad;
    } else if (align == '=') {
        left = pad;
    }
    for (int64_t i = 0; i < left; i++) ns_tsb_put(b, fill, fill_n);
    ns_tsb_put(b, s, n);
    for (int64_t i = left; i < pad; i++) ns_tsb_put(b, fill, fill_n);
}

/* Formats one value per spec (shared by % and str.format). */
static ns_status format_one(ns_tctx *c, ns_tsb *b, const ns_tv *v, const fspec *f, int percent) {
    char buf[512];
    char type = f->type;
    if (type == 's' || type == 'r' || (type == 0 && !ns_tv_is_num(v))) {
        if (type == 0 && v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
        ns_tsb tmp;
        ns_tsb_init(&tmp, c->a);
        if (type == 'r') ns_tv_repr_append(&tmp, v);
        else ns_tv_str_append(&tmp, v);
        ns_tv s;
        ns_status st = ns_tsb_finish(&tmp, &s, c->err);
        if (st != NS_OK) return st;
        size_t n = s.u.s.n;
        if (f->prec >= 0) n = ns_utf8_offset(s.u.s.p, s.u.s.n, (size_t)f->prec);
        put_padded(b, f, s.u.s.p, n, '<');
        return NS_OK;
    }
    if (!ns_tv_is_num(v)) {
        if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
        return ns_trt_fail(c, NS_ERR_INVALID, "%%%c format: a real number is required, not %s", type ? type : 'd',
                           ns_tv_type_name(v));
    }
    char sign = f->sign == '-' ? 0 : f->sign;
    int prec = f->prec >= 0 ? (int)(f->prec > 200 ? 200 : f->prec) : 6;
    int zero_w = (f->zero && !f->align && f->width > 0) ? (int)(f->width > 400 ? 400 : f->width) : 0;
    if (type == 'd' || type == 'i' || type == 'u' || type == 'x' || type == 'X' || type == 'o' || type == 'c' ||
        (type == 0 && v->kind != NS_TV_FLOAT)) {
        /* Python's %-formatting: %d/%i/%u truncate a float (its exact integer
         * value, however large: '%d' % 1e20 is 100000000000000000000), while
         * %x/%o/%c refuse one. A bare cast would be undefined behaviour past
         * 2^63 (the fuzzer found '%d' % 7e159). */
        long long iv = 0;
        char digs[400]; /* most significant digit first; a double's integer part has <= 309 */
        int k = 0;
        bool neg;
        if (v->kind == NS_TV_FLOAT) {
            double fv = v->u.f;
            if (!percent && type != 0) return ns_trt_fail(c, NS_ERR_INVALID, "Unknown format code '%c' for float", type);
            if (type == 'x' || type == 'X' || type == 'o')
                return ns_trt_fail(c, NS_ERR_INVALID, "%%%c format: an integer is required, not float", type);
            if (type == 'c') return ns_trt_fail(c, NS_ERR_INVALID, "%%c requires int or char");
            if (isnan(fv)) return ns_trt_fail(c, NS_ERR_INVALID, "cannot convert float NaN to integer");
            if (isinf(fv)) return ns_trt_fail(c, NS_ERR_INVALID, "cannot convert float infinity to integer");
            fv = trunc(fv);
            neg = fv < 0;
            /* glibc prints a double's exact decimal value with %.0f */
            int n = snprintf(digs, sizeof digs, "%.0f", fabs(fv));
            if (n <= 0 || (size_t)n >= sizeof digs) return ns_trt_fail(c, NS_ERR_INVALID, "float too large to format");
            k = n;
        } else {
            iv = v->kind == NS_TV_INT ? v->u.i : v->u.b;
            neg = iv < 0;
            if (type == 'c') {
                /* Python: OverflowError for anything outside range(0x110000);
                 * a surrogate could not be written out as UTF-8 either. */
                if (iv < 0 || iv >= 0x110000 || (iv >= 0xD800 && iv < 0xE000))
                    return ns_trt_fail(c, NS_ERR_INVALID, "%%c arg not in range(0x110000) (or a surrogate)");
                char u[4];
                size_t un = ns_utf8_encode((uint32_t)iv, u);
                put_padded(b, f, u, un, '<');
                return NS_OK;
            }
            int base = (type == 'x' || type == 'X') ? 16 : type == 'o' ? 8 : 10;
            unsigned long long mag = neg ? 0ULL - (unsigned long long)iv : (unsigned long long)iv;
            char rev[72];
            do {
                int d = (int)(mag % (unsigned)base);
                rev[k++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
                mag /= (unsigned)base;
            } while (mag);
            for (int i = 0; i < k; i++) digs[i] = rev[k - 1 - i];
        }
        char ibuf[4 + 400 + sizeof digs];
        size_t o = 0;
        if (neg) ibuf[o++] = '-';
        else if (sign) ibuf[o++] = sign;
        if (f->alt && (type == 'x' || type == 'X' || type == 'o')) {
            ibuf[o++] = '0';
            ibuf[o++] = type == 'o' ? 'o' : type;
        }
        for (int64_t z = (int64_t)o + k; z < zero_w; z++) ibuf[o++] = '0';
        memcpy(ibuf + o, digs, (size_t)k);
        o += (size_t)k;
        put_padded(b, f, ibuf, o, '>');
        return NS_OK;
    }
    double x = ns_tv_num(v);
    if (type == 0) {
        /* str.format with no type on a float: repr, or 'g'-like with precision */
        if (f->prec < 0) {
            size_t k = ns_tv_fmt_float(x, buf);
            if (sign && x >= 0 && !signbit(x)) {
                memmove(buf + 1, buf, k + 1);
                buf[0] = sign;
                k++;
            }
            put_padded(b, f, buf, k, '>');
            return NS_OK;
        }
        type = 'g';
    }
    if (!strchr("eEfFgG%", type)) return ns_trt_fail(c, NS_ERR_INVALID, "unsupported format character '%c'", type);
    int pct = type == '%';
    if (pct) {
        x *= 100.0;
        type = 'f';
    }
    size_t o = 0;
    if (!signbit(x) && sign) buf[o++] = sign;
    int w = zero_w ? zero_w - pct - (int)o : 0;
    if (w < 0) w = 0;
    switch (type) {
    case 'e': snprintf(buf + o, sizeof buf - o, "%0*.*e", w, prec, x); break;
    case 'E': snprintf(buf + o, sizeof buf - o, "%0*.*E", w, prec, x); break;
    case 'g': snprintf(buf + o, sizeof buf - o, "%0*.*g", w, prec, x); break;
    case 'G': snprintf(buf + o, sizeof buf - o, "%0*.*G", w, prec, x); break;
    default: snprintf(buf + o, sizeof buf - o, "%0*.*f", w, prec, x); break;
    }
    if (isinf(x) || isnan(x)) {
        /* Python spells these inf/nan (INF/NAN for upper-case types) */
        const char *word = isnan(x) ? "nan" : "inf";
        snprintf(buf, sizeof buf, "%s%s", (signbit(x) && !isnan(x)) ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "",
                 word);
        if (type == 'E' || type == 'F' || type == 'G')
            for (char *q = buf; *q; q++) *q = (char)(*q >= 'a' && *q <= 'z' ? *q - 32 : *q);
    }
    if (pct) strncat(buf, "%", sizeof buf - strlen(buf) - 1);
    put_padded(b, f, buf, strlen(buf), '>');
    return NS_OK;
}

ns_status ns_tpercent_format(ns_tctx *c, const ns_tv *fmt, const ns_tv *args, ns_tv *out) {
    const char *p = fmt->u.s.p;
    size_t n = fmt->u.s.n, i = 0, argi = 0;
    const ns_tv *list = NULL;
    size_t nargs = 1;
    if (args->kind == NS_TV_LIST && args->u.l->tuple) {
        list = args->u.l->v;
        nargs = args->u.l->n;
    } else {
        list = args;
    }
    int mapping = args->kind == NS_TV_DICT;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    while (i < n) {
        const char *pc = memchr(p + i, '%', n - i);
        size_t k = pc ? (size_t)(pc - p) : n;
        ns_tsb_put(&b, p + i, k - i);
        if (!pc) break;
        i = k + 1;
        if (i >= n) return ns_trt_fail(c, NS_ERR_INVALID, "incomplete format");
        const ns_tv *arg = NULL;
        ns_tv keyed;
        if (p[i] == '(') {
            const char *close = memchr(p + i, ')', n - i);
            if (!close || !mapping) return ns_trt_fail(c, NS_ERR_INVALID, "format requires a mapping");
            if (!ns_tdict_get_str(args->u.d, p + i + 1, (size_t)(close - p) - i - 1, &keyed))
                return ns_trt_fail(c, NS_ERR_INVALID, "format key '%.*s' not found", (int)((size_t)(close - p) - i - 1),
                                   p + i + 1);
            arg = &keyed;
            i = (size_t)(close - p) + 1;
        }
        fspec f;
        memset(&f, 0, sizeof f);
        f.width = f.prec = -1;
        for (; i < n && strchr("-+ #0", p[i]); i++) {
            if (p[i] == '-') f.align = '<';
            else if (p[i] == '+') f.sign = '+';
            else if (p[i] == ' ' && f.sign != '+') f.sign = ' ';
            else if (p[i] == '#') f.alt = 1;
            else if (p[i] == '0') f.zero = 1;
        }
        if (f.align) f.zero = 0;
        for (; i < n && p[i] >= '0' && p[i] <= '9'; i++)
            if (!push_digit(&f.width, p[i])) return ns_trt_fail(c, NS_ERR_INVALID, "width too big");
        if (i < n && p[i] == '.') {
            f.prec = 0;
            for (i++; i < n && p[i] >= '0' && p[i] <= '9'; i++)
                if (!push_digit(&f.prec, p[i])) return ns_trt_fail(c, NS_ERR_INVALID, "precision too big");
        }
        if (i >= n) return ns_trt_fail(c, NS_ERR_INVALID, "incomplete format");
        char conv = p[i++];
        if (conv == '%') {
            ns_tsb_putc(&b, '%');
            continue;
        }
        if (!strchr("sdiuxXoeEfFgGrc", conv))
            return ns_trt_fail(c, NS_ERR_INVALID, "unsupported format character '%c'", conv);
        if (!arg) {
            if (mapping) arg = args;
            else if (argi >= nargs) return ns_trt_fail(c, NS_ERR_INVALID, "not enough arguments for format string");
            else arg = &list[argi++];
        }
        f.type = conv;
        if (f.width >= 0 && !f.align && !f.zero) f.align = '>';
        if (f.width >= 0 && f.zero && (conv == 's' || conv == 'r')) {
            f.zero = 0;
            f.align = '>';
        }
        if (f.zero && strchr("diuxXoeEfFgG", conv)) f.align = 0;
        else if (f.zero) f.zero = 0;
        ns_status st = format_one(c, &b, arg, &f, 1);
        if (st != NS_OK) return st;
    }
    if (!mapping && ((list != args && argi < nargs) || (list == args && argi == 0 && args->kind != NS_TV_LIST)))
        return ns_trt_fail(c, NS_ERR_INVALID, "not all arguments converted during string formatting");
    return ns_tsb_finish(&b, out, c->err);
}

static ns_status parse_spec(ns_tctx *c, const char *s, size_t n, fspec *f) {
    memset(f, 0, sizeof *f);
    f->width = f->prec = -1;
    size_t i = 0;
    /* [[fill]align] */
    size_t j = 0;
    if (n) ns_utf8_next(s, n, &j);
    if (j < n && strchr("<>=^", s[j])) {
        memcpy(f->fill, s, j);
        f->fill_n = j;
        f->align = s[j];
        i = j + 1;
    } else if (n && strchr("<>=^", s[0])) {
        f->align = s[0];
        i = 1;
    }
    if (i < n && strchr("+- ", s[i])) f->sign = s[i++];
    if (i < n && s[i] == '#') {
        f->alt = 1;
        i++;
    }
    if (i < n && s[i] == '0') {
        f->zero = 1;
        if (!f->align) {
            f->align = '=';
            f->fill[0] = '0';
            f->fill_n = 1;
        }
        i++;
    }
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        if (!push_digit(&f->width, s[i]))
            return ns_trt_fail(c, NS_ERR_INVALID, "Too many decimal digits in format string");
    if (i < n && s[i] == '.') {
        f->prec = 0;
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            if (!push_digit(&f->prec, s[i]))
                return ns_trt_fail(c, NS_ERR_INVALID, "Too many decimal digits in format string");
    }
    if (i < n) f->type = s[i++];
    if (i != n) return ns_trt_fail(c, NS_ERR_INVALID, "Invalid format specifier '%.*s'", (int)n, s);
    f->zero = 0; /* zero padding is expressed through fill/align above */
    return NS_OK;
}

static ns_status str_format(ns_tctx *c, const ns_tv *self, const ns_tcallargs *a, ns_tv *out) {
    const char *p = self->u.s.p;
    size_t n = self->u.s.n, i = 0, auto_idx = 0;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    ns_status st;
    while (i < n) {
        char ch = p[i];
        if (ch == '}') {
            if (i + 1 < n && p[i + 1] == '}') {
                ns_tsb_putc(&b, '}');
                i += 2;
                continue;
            }
            return ns_trt_fail(c, NS_ERR_INVALID, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            ns_tsb_putc(&b, ch);
            i++;
            continue;
        }
        if (i + 1 < n && p[i + 1] == '{') {
            ns_tsb_putc(&b, '{');
            i += 2;
            continue;
        }
        const char *close = memchr(p + i, '}', n - i);
        if (!close) return ns_trt_fail(c, NS_ERR_INVALID, "Single '{' encountered in format string");
        size_t fs = i + 1, fe = (size_t)(close - p);
        i = fe + 1;
        size_t colon = fe, bang = fe;
        for (size_t k = fs; k < fe; k++) {
            if (p[k] == '!' && bang == fe && colon == fe) bang = k;
            if (p[k] == ':') {
                colon = k;
                break;
            }
        }
        size_t name_end = bang < colon ? bang : colon;
        /* field name: [arg_name]("." attr | "[" key "]")* */
        size_t k = fs;
        while (k < name_end && p[k] != '.' && p[k] != '[') k++;
        ns_tv val;
        if (k == fs || (p[fs] >= '0' && p[fs] <= '9')) {
            size_t idx = auto_idx++;
            if (k > fs) idx = (size_t)strtoul(p + fs, NULL, 10);
            if (idx >= a->npos)
                return ns_trt_fail(c, NS_ERR_INVALID, "Replacement index %zu out of range for positional args tuple", idx);
            val = a->pos[idx];
        } else {
            size_t j;
            for (j = 0; j < a->nkw; j++)
                if (a->kw_names[j].n == k - fs && memcmp(a->kw_names[j].p, p + fs, k - fs) == 0) break;
            if (j == a->nkw) return ns_trt_fail(c, NS_ERR_INVALID, "KeyError: '%.*s'", (int)(k - fs), p + fs);
            val = a->kw[j];
        }
        while (k < name_end) {
            if (p[k] == '.') {
                size_t s0 = ++k;
                while (k < name_end && p[k] != '.' && p[k] != '[') k++;
                if ((st = ns_tgetattr(c, &val, p + s0, k - s0, &val)) != NS_OK) return st;
            } else {
                size_t s0 = ++k;
                while (k < name_end && p[k] != ']') k++;
                ns_tv key = ns_tv_str(p + s0, k - s0);
                int digits = k > s0;
                int64_t iv = 0;
                for (size_t q = s0; q < k; q++) {
                    if (p[q] < '0' || p[q] > '9') digits = 0;
                    else if (digits && !push_digit(&iv, p[q]))
                        return ns_trt_fail(c, NS_ERR_INVALID, "Too many decimal digits in format string");
                }
                if (digits) key = ns_tv_int(iv);
                if ((st = ns_tgetitem(c, &val, &key, &val)) != NS_OK) return st;
                k++;
            }
        }
        fspec f;
        if ((st = parse_spec(c, p + colon + (colon < fe), colon < fe ? fe - colon - 1 : 0, &f)) != NS_OK) return st;
        if (bang < fe && bang + 1 < n) {
            char conv = p[bang + 1];
            if (conv == 'r' || conv == 's') {
                ns_tsb tmp;
                ns_tsb_init(&tmp, c->a);
                if (conv == 'r') ns_tv_repr_append(&tmp, &val);
                else ns_tv_str_append(&tmp, &val);
                if ((st = ns_tsb_finish(&tmp, &val, c->err)) != NS_OK) return st;
            }
        }
        if ((st = format_one(c, &b, &val, &f, 0)) != NS_OK) return st;
    }
    return ns_tsb_finish(&b, out, c->err);
}

/* ---- globals ----------------------------------------------------------------------------------- */

enum { G_RANGE = 1, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME, G_CYCLER, G_JOINER };

static const struct {
    const char *name;
    uint32_t id;
} GLOBALS[] = {
    {"range", G_RANGE},   {"dict", G_DICT},     {"namespace", G_NAMESPACE}, {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME}, {"cycler", G_CYCLER}, {"joiner", G_JOINER},
};

int ns_tglobal_lookup(const char *name, size_t n, ns_tv *out) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (name_is(name, n, GLOBALS[i].name)) {
            memset(out, 0, sizeof *out);
            out->kind = NS_TV_FUNC;
            out->aux = GLOBALS[i].id;
            return 1;
        }
    return 0;
}

static ns_status fill_dict(ns_tctx *c, ns_tdict *d, const ns_tcallargs *a) {
    ns_status st;
    if (a->npos > 1) return ns_trt_fail(c, NS_ERR_INVALID, "dict expected at most 1 argument, got %zu", a->npos);
    if (a->npos == 1) {
        const ns_tv *src = &a->pos[0];
        if (src->kind == NS_TV_DICT || src->kind == NS_TV_NS) {
            for (size_t i = 0; i < src->u.d->n; i++)
                if ((st = ns_tdict_set(c->a, d, src->u.d->keys[i], src->u.d->vals[i], c->err)) != NS_OK) return st;
        } else {
            const ns_tlist *items;
            if ((st = ns_titer(c, src, &items)) != NS_OK) return st;
            for (size_t i = 0; i < items->n; i++) {
                const ns_tv *pair = &items->v[i];
                if (pair->kind != NS_TV_LIST || pair->u.l->n != 2)
                    return ns_trt_fail(c, NS_ERR_INVALID, "dictionary update sequence element #%zu has wrong length", i);
                if ((st = ns_tdict_set(c->a, d, pair->u.l->v[0], pair->u.l->v[1], c->err)) != NS_OK) return st;
            }
        }
    }
    for (size_t i = 0; i < a->nkw; i++)
        if ((st = ns_tdict_set(c->a, d, ns_tv_str(a->kw_names[i].p, a->kw_names[i].n), a->kw[i], c->err)) != NS_OK)
            return st;
    return NS_OK;
}

static ns_status do_range(ns_tctx *c, const ns_tcallargs *a, ns_tv *out) {
    int64_t v[3] = {0, 0, 1};
    ns_status st;
    if (a->npos < 1 || a->npos > 3)
        return ns_trt_fail(c, NS_ERR_INVALID, "range expected 1 to 3 arguments, got %zu", a->npos);
    for (size_t i = 0; i < a->npos; i++)
        if ((st = ns_twant_int(c, &a->pos[i], "range() argument", &v[a->npos == 1 ? 1 : i])) != NS_OK) return st;
    int64_t start = v[0], stop = v[1], step = v[2];
    if (step == 0) return ns_trt_fail(c, NS_ERR_INVALID, "range() arg 3 must not be zero");
    int64_t count = 0;
    if (step > 0 && stop > start) count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step) + 1;
    if (step < 0 && start > stop) count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-step)) + 1;
    if (count > MAX_RANGE)
        return ns_trt_fail(c, NS_ERR_RANGE,
                           "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    if ((st = ns_tstep(c, (uint64_t)count)) != NS_OK) return st;
    ns_tlist *l = ns_tlist_new(c->a, (size_t)count, 0);
    if (!l) return ns_toom(c);
    for (int64_t i = 0; i < count; i++) l->v[i] = ns_tv_int(start + i * step);
    memset(out, 0, sizeof *out);
    out->kind = NS_TV_LIST;
    out->u.l = l;
    return NS_OK;
}

static ns_status do_strftime(ns_tctx *c, const ns_tcallargs *a, ns_tv *out) {
    const ns_tv *fmt = ns_targ(a, 0, "format");
    ns_status st = want_str(c, fmt, "strftime_now() format");
    if (st != NS_OK) return st;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    time_t secs = tv.tv_sec;
    localtime_r(&secs, &tm);
    /* Python's naive datetime: %f is microseconds, %z and %Z are empty */
    ns_tsb f;
    ns_tsb_init(&f, c->a);
    for (size_t i = 0; i < fmt->u.s.n; i++) {
        char ch = fmt->u.s.p[i];
        if (ch == '%' && i + 1 < fmt->u.s.n) {
            char d = fmt->u.s.p[i + 1];
            if (d == 'f') {
                ns_tsb_printf(&f, "%06ld", (long)tv.tv_usec);
                i++;
                continue;
            }
            if (d == 'z' || d == 'Z') {
                i++;
                continue;
            }
            ns_tsb_putc(&f, ch);
            ns_tsb_putc(&f, d);
            i++;
            continue;
        }
        ns_tsb_putc(&f, ch);
    }
    ns_tv cf;
    if ((st = ns_tsb_finish(&f, &cf, c->err)) != NS_OK) return st;
    if (cf.u.s.n == 0) {
        *out = ns_tv_str("", 0);
        return NS_OK;
    }
    size_t cap = 256 + cf.u.s.n * 16;
    if (cap > 65536) cap = 65536;
    char *buf = ns_tarena_alloc(c->a, cap);
    if (!buf) return ns_toom(c);
    /* the format is the template's own (that is what strftime_now is for) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t k = strftime(buf, cap, cf.u.s.p, &tm);
#pragma GCC diagnostic pop
    *out = ns_tv_str(buf, k);
    return NS_OK;
}

ns_status ns_tglobal_call(ns_tctx *c, uint32_t id, const ns_tcallargs *a, ns_tv *out) {
    ns_status st;
    switch (id) {
    case G_RANGE: return do_range(c, a, out);
    case G_DICT:
    case G_NAMESPACE: {
        ns_tdict *d = ns_tdict_new(c->a, a->nkw + 4);
        if (!d) return ns_toom(c);
        if ((st = fill_dict(c, d, a)) != NS_OK) return st;
        memset(out, 0, sizeof *out);
        out->kind = id == G_DICT ? NS_TV_DICT : NS_TV_NS;
        out->u.d = d;
        return NS_OK;
    }
    case G_RAISE: {
        const ns_tv *msg = ns_targ(a, 0, "message");
        ns_tv s = ns_tv_str("", 0);
        if (!msg) return ns_trt_fail(c, NS_ERR_INVALID, "raise_exception() missing 1 required positional argument: 'message'");
        if ((st = ns_tv_to_str(c->a, msg, &s, c->err)) != NS_OK) return st;
        c->located = 1; /* the template author's message is final */
        return ns_fail(c->err, NS_ERR_INVALID, "%.*s", (int)(s.u.s.n > 480 ? 480 : s.u.s.n), s.u.s.p);
    }
    case G_STRFTIME: return do_strftime(c, a, out);
    case G_CYCLER: {
        if (!a->npos) return ns_trt_fail(c, NS_ERR_INVALID, "cycler() needs at least one item");
        ns_tcycler *cy = ns_tarena_alloc(c->a, sizeof *cy);
        ns_tlist *l = ns_tlist_new(c->a, a->npos, 1);
        if (!cy || !l) return ns_toom(c);
        memcpy(l->v, a->pos, a->npos * sizeof(ns_tv));
        cy->items = l;
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_CYCLER;
        out->u.obj = cy;
        return NS_OK;
    }
    case G_JOINER: {
        ns_tjoiner *j = ns_tarena_alloc(c->a, sizeof *j);
        if (!j) return ns_toom(c);
        const ns_tv *sep = ns_targ(a, 0, "sep");
        j->sep = sep ? *sep : ns_tv_str(", ", 2);
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_JOINER;
        out->u.obj = j;
        return NS_OK;
    }
    default: return ns_trt_fail(c, NS_ERR_INTERNAL, "unknown global function");
    }
}
