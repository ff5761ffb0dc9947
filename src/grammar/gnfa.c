/* gnfa.c — building the byte-level recursive transition network (see
 * gnfa.h) and the JSON lexical pieces every grammar shares. */
#include "grammar/gnfa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ns_gnfa_init(ns_gnfa *n) { memset(n, 0, sizeof(*n)); }

void ns_gnfa_free(ns_gnfa *n) {
    for (uint32_t i = 0; i < n->n; i++) {
        free(n->st[i].edges);
        free(n->st[i].eps);
        free(n->st[i].calls);
    }
    free(n->st);
    memset(n, 0, sizeof(*n));
}

uint32_t ns_gnfa_state(ns_gnfa *n) {
    if (n->oom) return 0;
    if (n->n >= NS_GNFA_MAX_STATES) {
        n->oom = true;
        return 0;
    }
    if (n->n + 2 > n->cap) {
        uint32_t nc = n->cap ? n->cap * 2 : 256;
        ns_gstate *p = realloc(n->st, (size_t)nc * sizeof(*p));
        if (!p) {
            n->oom = true;
            return 0;
        }
        if (!n->st) memset(&p[0], 0, sizeof(p[0]));
        n->st = p;
        n->cap = nc;
    }
    if (n->n == 0) n->n = 1; /* state 0 is "none" */
    memset(&n->st[n->n], 0, sizeof(n->st[0]));
    return n->n++;
}

/* Grows a per-state array by one element; false on OOM (sets n->oom). */
static bool grow(ns_gnfa *n, void **arr, uint32_t *cnt, uint32_t *cap, size_t elem) {
    if (*cnt < *cap) return true;
    uint32_t nc = *cap ? *cap * 2 : 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) {
        n->oom = true;
        return false;
    }
    *arr = p;
    *cap = nc;
    return true;
}

static bool valid(const ns_gnfa *n, uint32_t s) { return !n->oom && s > 0 && s < n->n; }

void ns_gnfa_byte(ns_gnfa *n, uint32_t from, uint8_t lo, uint8_t hi, uint32_t to) {
    if (!valid(n, from) || !valid(n, to) || lo > hi) return;
    ns_gstate *st = &n->st[from];
    if (!grow(n, (void **)&st->edges, &st->n_edges, &st->cap_edges, sizeof(ns_gedge))) return;
    st->edges[st->n_edges++] = (ns_gedge){lo, hi, to};
}

void ns_gnfa_eps(ns_gnfa *n, uint32_t from, uint32_t to) {
    if (!valid(n, from) || !valid(n, to) || from == to) return;
    ns_gstate *st = &n->st[from];
    if (!grow(n, (void **)&st->eps, &st->n_eps, &st->cap_eps, sizeof(uint32_t))) return;
    st->eps[st->n_eps++] = to;
}

void ns_gnfa_call(ns_gnfa *n, uint32_t from, uint32_t rule, uint32_t ret) {
    if (!valid(n, from) || !valid(n, rule) || !valid(n, ret)) return;
    ns_gstate *st = &n->st[from];
    if (!grow(n, (void **)&st->calls, &st->n_calls, &st->cap_calls, sizeof(ns_gcall))) return;
    st->calls[st->n_calls++] = (ns_gcall){rule, ret};
}

uint32_t ns_gnfa_rule(ns_gnfa *n) { return ns_gnfa_state(n); }

void ns_gnfa_end(ns_gnfa *n, uint32_t s) {
    if (valid(n, s)) n->st[s].accept = true;
}

uint32_t ns_gnfa_lit(ns_gnfa *n, uint32_t s, const char *bytes, size_t len) {
    for (size_t i = 0; i < len; i++) {
        uint32_t t = ns_gnfa_state(n);
        uint8_t b = (uint8_t)bytes[i];
        ns_gnfa_byte(n, s, b, b, t);
        s = t;
    }
    if (len == 0) {
        uint32_t t = ns_gnfa_state(n);
        ns_gnfa_eps(n, s, t);
        s = t;
    }
    return s;
}

uint32_t ns_gnfa_lits(ns_gnfa *n, uint32_t s, const char *str) { return ns_gnfa_lit(n, s, str, strlen(str)); }

uint32_t ns_gnfa_ws(ns_gnfa *n, uint32_t s) {
    /* "" | " " | "\n" [ \t]{0,MAX}: compact or pretty-printed JSON, and
     * never an unbounded run */
    uint32_t e = ns_gnfa_state(n), nl = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, e);
    ns_gnfa_byte(n, s, ' ', ' ', e);
    ns_gnfa_byte(n, s, '\n', '\n', nl);
    ns_gnfa_eps(n, nl, e);
    uint32_t cur = nl;
    for (int i = 0; i < NS_GNFA_MAX_WS; i++) {
        uint32_t t = ns_gnfa_state(n);
        ns_gnfa_byte(n, cur, ' ', ' ', t);
        ns_gnfa_byte(n, cur, '\t', '\t', t);
        ns_gnfa_eps(n, t, e);
        cur = t;
    }
    return e;
}

uint32_t ns_gnfa_callr(ns_gnfa *n, uint32_t s, uint32_t r) {
    uint32_t e = ns_gnfa_state(n);
    ns_gnfa_call(n, s, r, e);
    return e;
}

/* One UTF-8 continuation byte from a to b. */
static void cont(ns_gnfa *n, uint32_t a, uint32_t b) { ns_gnfa_byte(n, a, 0x80, 0xBF, b); }

/* One well-formed multi-byte UTF-8 character from s to e (RFC 3629 table:
 * no overlongs, no surrogates, nothing above U+10FFFF). */
void ns_gnfa_utf8_multi(ns_gnfa *n, uint32_t s, uint32_t e, bool no_line_sep) {
    uint32_t c1 = ns_gnfa_state(n), c2 = ns_gnfa_state(n), c3 = ns_gnfa_state(n);
    cont(n, c1, e);          /* one continuation left */
    cont(n, c2, c1);         /* two left */
    cont(n, c3, c2);         /* three left */
    ns_gnfa_byte(n, s, 0xC2, 0xDF, c1);
    uint32_t e0 = ns_gnfa_state(n), ed = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, 0xE0, 0xE0, e0);
    ns_gnfa_byte(n, e0, 0xA0, 0xBF, c1);
    if (no_line_sep) { /* E2 80 A8/A9 are U+2028/U+2029 */
        uint32_t e2 = ns_gnfa_state(n), e280 = ns_gnfa_state(n);
        ns_gnfa_byte(n, s, 0xE1, 0xE1, c2);
        ns_gnfa_byte(n, s, 0xE2, 0xE2, e2);
        ns_gnfa_byte(n, e2, 0x81, 0xBF, c1);
        ns_gnfa_byte(n, e2, 0x80, 0x80, e280);
        ns_gnfa_byte(n, e280, 0x80, 0xA7, e);
        ns_gnfa_byte(n, e280, 0xAA, 0xBF, e);
        ns_gnfa_byte(n, s, 0xE3, 0xEC, c2);
    } else {
        ns_gnfa_byte(n, s, 0xE1, 0xEC, c2);
    }
    ns_gnfa_byte(n, s, 0xED, 0xED, ed);
    ns_gnfa_byte(n, ed, 0x80, 0x9F, c1);
    ns_gnfa_byte(n, s, 0xEE, 0xEF, c2);
    uint32_t f0 = ns_gnfa_state(n), f4 = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, 0xF0, 0xF0, f0);
    ns_gnfa_byte(n, f0, 0x90, 0xBF, c2);
    ns_gnfa_byte(n, s, 0xF1, 0xF3, c3);
    ns_gnfa_byte(n, s, 0xF4, 0xF4, f4);
    ns_gnfa_byte(n, f4, 0x80, 0x8F, c2);
}

static void hexdig(ns_gnfa *n, uint32_t a, uint32_t b) {
    ns_gnfa_byte(n, a, '0', '9', b);
    ns_gnfa_byte(n, a, 'a', 'f', b);
    ns_gnfa_byte(n, a, 'A', 'F', b);
}

uint32_t ns_gnfa_char_rule(ns_gnfa *n) {
    if (n->r_char) return n->r_char;
    uint32_t r = ns_gnfa_rule(n), e = ns_gnfa_state(n);
    ns_gnfa_byte(n, r, 0x20, 0x21, e);
    ns_gnfa_byte(n, r, 0x23, 0x5B, e);
    ns_gnfa_byte(n, r, 0x5D, 0x7F, e);
    ns_gnfa_utf8_multi(n, r, e, false);
    uint32_t bs = ns_gnfa_state(n);
    ns_gnfa_byte(n, r, '\\', '\\', bs);
    static const char esc[] = "\"\\/bfnrt";
    for (const char *p = esc; *p; p++) ns_gnfa_byte(n, bs, (uint8_t)*p, (uint8_t)*p, e);
    /* \uXXXX without surrogates (D800-DFFF): a lone surrogate is not a
     * character, and a pair would count as two where the schema counts one */
    uint32_t u = ns_gnfa_state(n), h1 = ns_gnfa_state(n), hd = ns_gnfa_state(n), h2 = ns_gnfa_state(n),
             h3 = ns_gnfa_state(n);
    ns_gnfa_byte(n, bs, 'u', 'u', u);
    ns_gnfa_byte(n, u, '0', '9', h1);
    ns_gnfa_byte(n, u, 'a', 'c', h1);
    ns_gnfa_byte(n, u, 'A', 'C', h1);
    ns_gnfa_byte(n, u, 'e', 'f', h1);
    ns_gnfa_byte(n, u, 'E', 'F', h1);
    ns_gnfa_byte(n, u, 'd', 'd', hd);
    ns_gnfa_byte(n, u, 'D', 'D', hd);
    ns_gnfa_byte(n, hd, '0', '7', h2);
    hexdig(n, h1, h2);
    hexdig(n, h2, h3);
    hexdig(n, h3, e);
    ns_gnfa_end(n, e);
    n->r_char = r;
    return r;
}

/* digits: between lo and hi decimal digits from s; returns the end. */
static uint32_t digits(ns_gnfa *n, uint32_t s, int lo, int hi) {
    uint32_t e = ns_gnfa_state(n);
    uint32_t cur = s;
    for (int i = 0; i < hi; i++) {
        if (i >= lo) ns_gnfa_eps(n, cur, e);
        uint32_t t = ns_gnfa_state(n);
        ns_gnfa_byte(n, cur, '0', '9', t);
        cur = t;
    }
    ns_gnfa_eps(n, cur, e);
    return e;
}

uint32_t ns_gnfa_number_rule(ns_gnfa *n) {
    if (n->r_num) return n->r_num;
    /* -?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?: digit
     * runs are bounded so a number always ends (and stays a double) */
    uint32_t r = ns_gnfa_rule(n);
    uint32_t sg = ns_gnfa_state(n);
    ns_gnfa_eps(n, r, sg);
    ns_gnfa_byte(n, r, '-', '-', sg);
    uint32_t ip = ns_gnfa_state(n);
    ns_gnfa_byte(n, sg, '0', '0', ip);
    uint32_t d1 = ns_gnfa_state(n);
    ns_gnfa_byte(n, sg, '1', '9', d1);
    ns_gnfa_eps(n, digits(n, d1, 0, 15), ip);
    uint32_t fr = ns_gnfa_state(n);
    ns_gnfa_eps(n, ip, fr);
    uint32_t dot = ns_gnfa_state(n);
    ns_gnfa_byte(n, ip, '.', '.', dot);
    ns_gnfa_eps(n, digits(n, dot, 1, 16), fr);
    uint32_t e = ns_gnfa_state(n);
    ns_gnfa_eps(n, fr, e);
    uint32_t ex = ns_gnfa_state(n), exs = ns_gnfa_state(n);
    ns_gnfa_byte(n, fr, 'e', 'e', ex);
    ns_gnfa_byte(n, fr, 'E', 'E', ex);
    ns_gnfa_eps(n, ex, exs);
    ns_gnfa_byte(n, ex, '+', '+', exs);
    ns_gnfa_byte(n, ex, '-', '-', exs);
    ns_gnfa_eps(n, digits(n, exs, 1, 3), e);
    ns_gnfa_end(n, e);
    n->r_num = r;
    return r;
}

uint32_t ns_gnfa_string(ns_gnfa *n, uint32_t s, int64_t min, int64_t max) {
    uint32_t ch = ns_gnfa_char_rule(n);
    s = ns_gnfa_lits(n, s, "\"");
    uint32_t close = ns_gnfa_state(n);
    for (int64_t i = 0; i < min; i++) s = ns_gnfa_callr(n, s, ch);
    if (max < 0) {
        uint32_t loop = ns_gnfa_state(n);
        ns_gnfa_eps(n, s, loop);
        ns_gnfa_call(n, loop, ch, loop);
        ns_gnfa_eps(n, loop, close);
    } else {
        for (int64_t i = min; i < max; i++) {
            ns_gnfa_eps(n, s, close);
            s = ns_gnfa_callr(n, s, ch);
        }
        ns_gnfa_eps(n, s, close);
    }
    return ns_gnfa_lits(n, close, "\"");
}

/* Decimal numbers of exactly len digits between lo and hi (both len
 * characters, lo <= hi), from s to e. */
static void same_len(ns_gnfa *n, uint32_t s, const char *lo, const char *hi, size_t len, uint32_t e) {
    if (len == 0) {
        ns_gnfa_eps(n, s, e);
        return;
    }
    bool lo_min = true, hi_max = true;
    for (size_t i = 1; i < len; i++) {
        lo_min &= lo[i] == '0';
        hi_max &= hi[i] == '9';
    }
    if (lo_min && hi_max) { /* [lo0-hi0][0-9]{len-1} */
        uint32_t t = ns_gnfa_state(n);
        ns_gnfa_byte(n, s, (uint8_t)lo[0], (uint8_t)hi[0], t);
        ns_gnfa_eps(n, digits(n, t, (int)len - 1, (int)len - 1), e);
        return;
    }
    if (lo[0] == hi[0]) {
        uint32_t t = ns_gnfa_state(n);
        ns_gnfa_byte(n, s, (uint8_t)lo[0], (uint8_t)lo[0], t);
        same_len(n, t, lo + 1, hi + 1, len - 1, e);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof(nines));
    memset(zeros, '0', sizeof(zeros));
    uint32_t t1 = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, (uint8_t)lo[0], (uint8_t)lo[0], t1);
    same_len(n, t1, lo + 1, nines, len - 1, e);
    if (hi[0] - lo[0] > 1) {
        uint32_t t2 = ns_gnfa_state(n);
        ns_gnfa_byte(n, s, (uint8_t)(lo[0] + 1), (uint8_t)(hi[0] - 1), t2);
        ns_gnfa_eps(n, digits(n, t2, (int)len - 1, (int)len - 1), e);
    }
    uint32_t t3 = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, (uint8_t)hi[0], (uint8_t)hi[0], t3);
    same_len(n, t3, zeros, hi + 1, len - 1, e);
}

/* Non-negative integers in [lo, hi] without leading zeros, s to e. */
static void uint_range(ns_gnfa *n, uint32_t s, uint64_t lo, uint64_t hi, uint32_t e) {
    uint64_t p = 1; /* 10^(len-1) */
    for (size_t len = 1; len <= 19 && lo <= hi; len++, p *= 10) {
        uint64_t top = p * 10 - 1; /* largest len-digit number */
        if (lo > top) continue;
        uint64_t a = lo < p && len > 1 ? p : lo, b = hi < top ? hi : top;
        if (a <= b) {
            char sa[24], sb[24];
            snprintf(sa, sizeof(sa), "%0*llu", (int)len, (unsigned long long)a);
            snprintf(sb, sizeof(sb), "%0*llu", (int)len, (unsigned long long)b);
            same_len(n, s, sa, sb, len, e);
        }
        if (hi <= top) break;
        lo = top + 1;
    }
}

uint32_t ns_gnfa_int_range(ns_gnfa *n, uint32_t s, int64_t lo, int64_t hi) {
    uint32_t e = ns_gnfa_state(n);
    if (hi >= 0) uint_range(n, s, lo < 0 ? 0 : (uint64_t)lo, (uint64_t)hi, e);
    if (lo < 0) {
        uint32_t m = ns_gnfa_state(n);
        ns_gnfa_byte(n, s, '-', '-', m);
        uint64_t a = hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 1, b = (uint64_t)(-(lo + 1)) + 1;
        uint_range(n, m, a, b, e);
    }
    return e;
}

/* any JSON value, object and array: mutually recursive rules */
static void any_rules(ns_gnfa *n) {
    uint32_t val = ns_gnfa_rule(n), obj = ns_gnfa_rule(n), arr = ns_gnfa_rule(n);
    n->r_any = val;
    n->r_obj = obj;
    n->r_arr = arr;
    uint32_t e = ns_gnfa_state(n);
    ns_gnfa_eps(n, ns_gnfa_string(n, val, 0, -1), e);
    ns_gnfa_eps(n, ns_gnfa_callr(n, val, ns_gnfa_number_rule(n)), e);
    ns_gnfa_eps(n, ns_gnfa_lits(n, val, "true"), e);
    ns_gnfa_eps(n, ns_gnfa_lits(n, val, "false"), e);
    ns_gnfa_eps(n, ns_gnfa_lits(n, val, "null"), e);
    ns_gnfa_eps(n, ns_gnfa_callr(n, val, obj), e);
    ns_gnfa_eps(n, ns_gnfa_callr(n, val, arr), e);
    ns_gnfa_end(n, e);
    /* object: "{" ws ( string ws ":" ws value ws ( "," ws string ... )* )? "}" */
    uint32_t s = ns_gnfa_ws(n, ns_gnfa_lits(n, obj, "{"));
    uint32_t oe = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, '}', '}', oe);
    uint32_t k = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, k);
    uint32_t v = ns_gnfa_ws(n, ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_string(n, k, 0, -1)), ":"));
    uint32_t after = ns_gnfa_ws(n, ns_gnfa_callr(n, v, val));
    ns_gnfa_byte(n, after, '}', '}', oe);
    ns_gnfa_eps(n, ns_gnfa_ws(n, ns_gnfa_lits(n, after, ",")), k);
    ns_gnfa_end(n, oe);
    /* array: "[" ws ( value ws ( "," ws value ws )* )? "]" */
    s = ns_gnfa_ws(n, ns_gnfa_lits(n, arr, "["));
    uint32_t ae = ns_gnfa_state(n);
    ns_gnfa_byte(n, s, ']', ']', ae);
    uint32_t it = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, it);
    after = ns_gnfa_ws(n, ns_gnfa_callr(n, it, val));
    ns_gnfa_byte(n, after, ']', ']', ae);
    ns_gnfa_eps(n, ns_gnfa_ws(n, ns_gnfa_lits(n, after, ",")), it);
    ns_gnfa_end(n, ae);
}

uint32_t ns_gnfa_any_rule(ns_gnfa *n) {
    if (!n->r_any) any_rules(n);
    return n->r_any;
}

uint32_t ns_gnfa_any_object_rule(ns_gnfa *n) {
    if (!n->r_any) any_rules(n);
    return n->r_obj;
}
