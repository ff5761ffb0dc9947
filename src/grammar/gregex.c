/* gregex.c — simple ECMAScript regexes to JSON string content (gregex.h):
 * a recursive-descent parser builds a small AST, which is emitted (possibly
 * several times, for counted repeats) into the NFA. */
#include "grammar/gregex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_NODES 4096
#define RX_MAX_KIDS 256
#define RX_MAX_REPEAT 1000

typedef enum { RX_SET, RX_LIT, RX_CAT, RX_ALT, RX_REP } rx_type;

typedef struct rx_node {
    rx_type type;
    uint8_t set[16];    /* RX_SET: ASCII members (bit per byte 0..127) */
    bool nonascii;      /* RX_SET: every non-ASCII character too */
    char lit[4];        /* RX_LIT: one UTF-8 character */
    int lit_len;
    int kids[RX_MAX_KIDS]; /* RX_CAT / RX_ALT / RX_REP (kids[0]) */
    int n_kids;
    int min, max;       /* RX_REP; max < 0: unbounded */
} rx_node;

typedef struct rx {
    const char *p, *end;
    rx_node *nodes;
    int n;
    char *err;
    size_t errcap;
    bool failed;
    bool anch_start, anch_end;
} rx;

static int fail(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(rx *r, const char *fmt, ...) {
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->errcap, fmt, ap);
        va_end(ap);
        r->failed = true;
    }
    return -1;
}

static int node(rx *r, rx_type t) {
    if (r->n >= RX_MAX_NODES) return fail(r, "pattern too complex (over %d parts)", RX_MAX_NODES);
    rx_node *x = &r->nodes[r->n];
    memset(x, 0, sizeof(*x));
    x->type = t;
    return r->n++;
}

static void set_add(rx_node *x, int lo, int hi) {
    for (int c = lo; c <= hi && c < 128; c++) x->set[c >> 3] |= (uint8_t)(1u << (c & 7));
}
static bool set_has(const rx_node *x, int c) { return c < 128 && (x->set[c >> 3] >> (c & 7)) & 1; }

/* \d \w \s into x (negated: the ASCII complement) */
static void shorthand(rx_node *x, char c) {
    rx_node t;
    memset(&t, 0, sizeof(t));
    char l = (char)(c | 0x20);
    if (l == 'd') set_add(&t, '0', '9');
    if (l == 'w') {
        set_add(&t, '0', '9');
        set_add(&t, 'a', 'z');
        set_add(&t, 'A', 'Z');
        set_add(&t, '_', '_');
    }
    if (l == 's') {
        set_add(&t, ' ', ' ');
        set_add(&t, '\t', '\r');
    }
    bool neg = c != l;
    for (int i = 0; i < 16; i++) x->set[i] |= neg ? (uint8_t)~t.set[i] : t.set[i];
}

static int escape_char(rx *r, char c) {
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return fail(r, "unsupported escape \\%c in pattern", c);
    return (unsigned char)c;
}

static int parse_class(rx *r) {
    int id = node(r, RX_SET);
    if (id < 0) return -1;
    rx_node *x = &r->nodes[id];
    bool neg = false;
    if (r->p < r->end && *r->p == '^') {
        neg = true;
        r->p++;
    }
    bool first = true;
    while (r->p < r->end && (*r->p != ']' || first)) {
        first = false;
        int lo;
        unsigned char c = (unsigned char)*r->p++;
        if (c >= 0x80) return fail(r, "non-ASCII character inside a pattern's [...] class is not supported");
        if (c == '\\') {
            if (r->p >= r->end) return fail(r, "pattern ends inside an escape");
            char e = *r->p++;
            if (strchr("dwsDWS", e)) {
                shorthand(x, e);
                continue;
            }
            if (e == 'b') lo = '\b';
            else if ((lo = escape_char(r, e)) < 0) return -1;
        } else {
            lo = c;
        }
        int hi = lo;
        if (r->p + 1 < r->end && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            unsigned char d = (unsigned char)*r->p++;
            if (d >= 0x80) return fail(r, "non-ASCII character inside a pattern's [...] class is not supported");
            if (d == '\\') {
                if (r->p >= r->end) return fail(r, "pattern ends inside an escape");
                if ((hi = escape_char(r, *r->p++)) < 0) return -1;
            } else {
                hi = d;
            }
            if (hi < lo) return fail(r, "bad range in pattern class");
        }
        set_add(x, lo, hi);
    }
    if (r->p >= r->end) return fail(r, "unterminated [ in pattern");
    r->p++;
    if (neg) {
        for (int i = 0; i < 16; i++) x->set[i] = (uint8_t)~x->set[i];
        x->nonascii = true;
    }
    return id;
}

static int parse_alt(rx *r, bool top);

static int parse_atom(rx *r) {
    unsigned char c = (unsigned char)*r->p++;
    if (c == '(') {
        if (r->p < r->end && *r->p == '?') {
            if (r->p + 1 < r->end && r->p[1] == ':') r->p += 2;
            else return fail(r, "lookaround and named groups are not supported in pattern");
        }
        int id = parse_alt(r, false);
        if (id < 0) return -1;
        if (r->p >= r->end || *r->p != ')') return fail(r, "unbalanced ( in pattern");
        r->p++;
        return id;
    }
    if (c == '[') return parse_class(r);
    if (c == '.') {
        int id = node(r, RX_SET);
        if (id < 0) return -1;
        set_add(&r->nodes[id], 0, 127);
        r->nodes[id].set['\n' >> 3] &= (uint8_t)~(1u << ('\n' & 7));
        r->nodes[id].set['\r' >> 3] &= (uint8_t)~(1u << ('\r' & 7));
        r->nodes[id].nonascii = true;
        return id;
    }
    if (c == '\\') {
        if (r->p >= r->end) return fail(r, "pattern ends inside an escape");
        char e = *r->p++;
        int id = node(r, RX_SET);
        if (id < 0) return -1;
        if (strchr("dwsDWS", e)) {
            shorthand(&r->nodes[id], e);
            return id;
        }
        if (e >= '1' && e <= '9') return fail(r, "backreferences are not supported in pattern");
        int v = escape_char(r, e);
        if (v < 0) return -1;
        set_add(&r->nodes[id], v, v);
        return id;
    }
    if (c == '^' || c == '$') return fail(r, "anchor '%c' inside a pattern is not supported (only at its ends)", c);
    if (c == '*' || c == '+' || c == '?' || c == '{') return fail(r, "quantifier '%c' without an operand in pattern", c);
    if (c == ')' || c == '|') return fail(r, "unexpected '%c' in pattern", c);
    int id = node(r, RX_LIT);
    if (id < 0) return -1;
    rx_node *x = &r->nodes[id];
    x->lit[0] = (char)c;
    x->lit_len = 1;
    int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (c >= 0x80 && c < 0xC0) return fail(r, "pattern is not valid UTF-8");
    for (int i = 0; i < more; i++) {
        if (r->p >= r->end || ((unsigned char)*r->p & 0xC0) != 0x80) return fail(r, "pattern is not valid UTF-8");
        x->lit[x->lit_len++] = *r->p++;
    }
    return id;
}

static bool read_int(rx *r, int *out) {
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return false;
    long v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        v = v * 10 + (*r->p++ - '0');
        if (v > RX_MAX_REPEAT) v = RX_MAX_REPEAT + 1;
    }
    *out = (int)v;
    return true;
}

static int parse_quant(rx *r, int atom) {
    if (r->p >= r->end) return atom;
    int min, max;
    char c = *r->p;
    if (c == '*') min = 0, max = -1;
    else if (c == '+') min = 1, max = -1;
    else if (c == '?') min = 0, max = 1;
    else if (c == '{') {
        const char *save = r->p;
        r->p++;
        if (!read_int(r, &min)) {
            r->p = save;
            return fail(r, "bad {n,m} quantifier in pattern");
        }
        max = min;
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            if (!read_int(r, &max)) max = -1;
        }
        if (r->p >= r->end || *r->p != '}') return fail(r, "bad {n,m} quantifier in pattern");
        if (min > RX_MAX_REPEAT || max > RX_MAX_REPEAT)
            return fail(r, "pattern repeat count above %d is not supported", RX_MAX_REPEAT);
        if (max >= 0 && max < min) return fail(r, "bad {n,m} quantifier in pattern (m < n)");
    } else {
        return atom;
    }
    r->p++;
    if (r->p < r->end && *r->p == '?') r->p++; /* lazy: same language */
    int id = node(r, RX_REP);
    if (id < 0) return -1;
    r->nodes[id].kids[0] = atom;
    r->nodes[id].n_kids = 1;
    r->nodes[id].min = min;
    r->nodes[id].max = max;
    if (r->p < r->end && strchr("*+?{", *r->p)) return fail(r, "nested quantifier in pattern");
    return id;
}

static int parse_seq(rx *r, bool top, bool first_alt) {
    int id = node(r, RX_CAT);
    if (id < 0) return -1;
    if (top && r->p < r->end && *r->p == '^') {
        if (!first_alt) return fail(r, "anchors with top-level alternation are not supported in pattern");
        r->anch_start = true;
        r->p++;
    }
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (top && *r->p == '$' && r->p + 1 == r->end) {
            r->anch_end = true;
            r->p++;
            break;
        }
        int a = parse_atom(r);
        if (a < 0) return -1;
        a = parse_quant(r, a);
        if (a < 0) return -1;
        if (r->nodes[id].n_kids >= RX_MAX_KIDS) return fail(r, "pattern too long");
        r->nodes[id].kids[r->nodes[id].n_kids++] = a;
    }
    return id;
}

static int parse_alt(rx *r, bool top) {
    int id = node(r, RX_ALT);
    if (id < 0) return -1;
    bool first = true;
    for (;;) {
        int s = parse_seq(r, top, first);
        if (s < 0) return -1;
        if (r->nodes[id].n_kids >= RX_MAX_KIDS) return fail(r, "too many alternatives in pattern");
        r->nodes[id].kids[r->nodes[id].n_kids++] = s;
        if (r->p < r->end && *r->p == '|') {
            if (top && (r->anch_start || r->anch_end))
                return fail(r, "anchors with top-level alternation are not supported in pattern");
            r->p++;
            first = false;
            continue;
        }
        break;
    }
    return id;
}

/* One character c (ASCII) as JSON string content, s to e. */
static void emit_ascii(ns_gnfa *n, uint32_t s, int c, uint32_t e) {
    char buf[8];
    if (c == '"' || c == '\\') snprintf(buf, sizeof(buf), "\\%c", c);
    else if (c == '\n') snprintf(buf, sizeof(buf), "\\n");
    else if (c == '\t') snprintf(buf, sizeof(buf), "\\t");
    else if (c == '\r') snprintf(buf, sizeof(buf), "\\r");
    else if (c < 0x20) snprintf(buf, sizeof(buf), "\\u%04x", c);
    else {
        ns_gnfa_byte(n, s, (uint8_t)c, (uint8_t)c, e);
        return;
    }
    ns_gnfa_eps(n, ns_gnfa_lits(n, s, buf), e);
}

static uint32_t emit(ns_gnfa *n, const rx *r, int id, uint32_t s, long *budget);

static uint32_t emit_rep(ns_gnfa *n, const rx *r, const rx_node *x, uint32_t s, long *budget) {
    for (int i = 0; i < x->min; i++) s = emit(n, r, x->kids[0], s, budget);
    uint32_t e = ns_gnfa_state(n);
    if (x->max < 0) {
        uint32_t l = ns_gnfa_state(n);
        ns_gnfa_eps(n, s, l);
        ns_gnfa_eps(n, emit(n, r, x->kids[0], l, budget), l);
        ns_gnfa_eps(n, l, e);
        return e;
    }
    for (int i = x->min; i < x->max; i++) {
        ns_gnfa_eps(n, s, e);
        s = emit(n, r, x->kids[0], s, budget);
    }
    ns_gnfa_eps(n, s, e);
    return e;
}

static uint32_t emit(ns_gnfa *n, const rx *r, int id, uint32_t s, long *budget) {
    const rx_node *x = &r->nodes[id];
    if (--*budget < 0) {
        n->oom = true; /* the caller reports "too large" */
        return s;
    }
    switch (x->type) {
    case RX_SET: {
        uint32_t e = ns_gnfa_state(n);
        for (int c = 0; c < 128; c++) {
            if (!set_has(x, c)) continue;
            bool plain = c >= 0x20 && c != '"' && c != '\\';
            if (!plain) {
                emit_ascii(n, s, c, e);
                continue;
            }
            int hi = c;
            while (hi + 1 < 128 && set_has(x, hi + 1) && hi + 1 != '"' && hi + 1 != '\\') hi++;
            ns_gnfa_byte(n, s, (uint8_t)c, (uint8_t)hi, e);
            c = hi;
        }
        if (x->nonascii) ns_gnfa_utf8_multi(n, s, e, true);
        return e;
    }
    case RX_LIT:
        if (x->lit_len == 1) {
            uint32_t e = ns_gnfa_state(n);
            emit_ascii(n, s, (unsigned char)x->lit[0], e);
            return e;
        }
        return ns_gnfa_lit(n, s, x->lit, (size_t)x->lit_len);
    case RX_CAT:
        for (int i = 0; i < x->n_kids; i++) s = emit(n, r, x->kids[i], s, budget);
        if (x->n_kids == 0) return ns_gnfa_lit(n, s, "", 0);
        return s;
    case RX_ALT: {
        uint32_t e = ns_gnfa_state(n);
        for (int i = 0; i < x->n_kids; i++) ns_gnfa_eps(n, emit(n, r, x->kids[i], s, budget), e);
        return e;
    }
    case RX_REP: return emit_rep(n, r, x, s, budget);
    }
    return s;
}

/* Any JSON string characters (the unanchored ends). */
static uint32_t any_chars(ns_gnfa *n, uint32_t s) {
    uint32_t ch = ns_gnfa_char_rule(n), l = ns_gnfa_state(n), e = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, l);
    ns_gnfa_call(n, l, ch, l);
    ns_gnfa_eps(n, l, e);
    return e;
}

bool ns_gregex_emit(ns_gnfa *n, const char *pattern, uint32_t s, uint32_t *end, char *err, size_t errcap) {
    rx r = {.p = pattern, .end = pattern + strlen(pattern), .err = err, .errcap = errcap};
    r.nodes = calloc(RX_MAX_NODES, sizeof(rx_node));
    if (!r.nodes) {
        snprintf(err, errcap, "out of memory");
        return false;
    }
    int root = parse_alt(&r, true);
    if (root >= 0 && r.p != r.end) root = fail(&r, "unbalanced ) in pattern");
    bool ok = root >= 0;
    if (ok) {
        long budget = 200000; /* AST nodes emitted, counting repeats */
        if (!r.anch_start) s = any_chars(n, s);
        s = emit(n, &r, root, s, &budget);
        if (!r.anch_end) s = any_chars(n, s);
        if (budget < 0) {
            snprintf(err, errcap, "pattern too large once its repeats are expanded");
            ok = false;
        }
        *end = s;
    }
    free(r.nodes);
    return ok;
}
