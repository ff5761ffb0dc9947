#include "template/lexer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/ustr.h"
#include "util/utf8.h"

#define MAX_TAG_NESTING 256

typedef struct {
    ns_tarena *a;
    const char *s; /* normalised source (arena) */
    size_t n, pos;
    size_t *lines; /* start offset of each line */
    size_t nlines;
    ns_ttok *toks;
    size_t ntoks, cap;
    int line_starting; /* previous token ended with a newline */
    ns_error *err;
} lexer;

static const struct {
    const char *s;
    int op;
} OPS[] = {
    {"**", NS_OP_POW}, {"//", NS_OP_FLOORDIV}, {"==", NS_OP_EQ}, {"!=", NS_OP_NE}, {">=", NS_OP_GE},
    {"<=", NS_OP_LE},  {"+", NS_OP_ADD},       {"-", NS_OP_SUB}, {"*", NS_OP_MUL},  {"/", NS_OP_DIV},
    {"%", NS_OP_MOD},  {"~", NS_OP_TILDE},     {"[", NS_OP_LBRACKET}, {"]", NS_OP_RBRACKET},
    {"(", NS_OP_LPAREN}, {")", NS_OP_RPAREN},  {"{", NS_OP_LBRACE}, {"}", NS_OP_RBRACE}, {">", NS_OP_GT},
    {"<", NS_OP_LT},   {"=", NS_OP_ASSIGN},    {".", NS_OP_DOT}, {":", NS_OP_COLON}, {"|", NS_OP_PIPE},
    {",", NS_OP_COMMA}, {";", NS_OP_SEMICOLON},
};

const char *ns_top_str(int op) {
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
        if (OPS[i].op == op) return OPS[i].s;
    return "?";
}

static void line_col(const lexer *L, size_t off, int *line, int *col) {
    size_t lo = 0, hi = L->nlines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (L->lines[mid] <= off) lo = mid;
        else hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(off - L->lines[lo]) + 1;
}

static ns_status lex_fail(lexer *L, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ns_status lex_fail(lexer *L, size_t off, const char *fmt, ...) {
    int line, col;
    line_col(L, off, &line, &col);
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ns_fail(L->err, NS_ERR_FORMAT, "template:%d:%d: %s", line, col, msg);
}

static ns_ttok *push(lexer *L, int type, size_t off) {
    if (L->ntoks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        ns_ttok *nt = ns_tarena_grow(L->a, L->toks, L->ntoks * sizeof(ns_ttok), nc * sizeof(ns_ttok));
        if (!nt) return NULL;
        L->toks = nt;
        L->cap = nc;
    }
    ns_ttok *t = &L->toks[L->ntoks++];
    memset(t, 0, sizeof *t);
    t->type = type;
    line_col(L, off, &t->line, &t->col);
    return t;
}

#define PUSH_OR_FAIL(t, L, type, off)                                                         \
    do {                                                                                      \
        (t) = push((L), (type), (off));                                                       \
        if (!(t)) return ns_fail((L)->err, NS_ERR_NOMEM, "template too large to tokenise"); \
    } while (0)

/* Python \s over one code point at s[i]; returns its byte length or 0. */
static size_t ws_at(const lexer *L, size_t i) {
    if (i >= L->n) return 0;
    size_t j = i;
    uint32_t cp = ns_utf8_next(L->s, L->n, &j);
    return ns_u_isspace(cp) ? j - i : 0;
}

static size_t skip_ws(const lexer *L, size_t i) {
    size_t k;
    while ((k = ws_at(L, i)) != 0) i += k;
    return i;
}

/* End of s[start..end) after removing trailing Unicode whitespace. */
static size_t rstrip_end(const lexer *L, size_t start, size_t end) {
    while (end > start) {
        size_t j = end;
        uint32_t cp = ns_utf8_prev(L->s, &j);
        if (j < start || !ns_u_isspace(cp)) break;
        end = j;
    }
    return end;
}

/* Emits the text s[start..end) that precedes a tag, applying the tag's
 * strip sign and lstrip_blocks (which never applies to {{ }}). */
static ns_status emit_text(lexer *L, size_t start, size_t end, char sign, int is_var) {
    if (sign == '-') {
        end = rstrip_end(L, start, end);
    } else if (sign != '+' && !is_var) {
        size_t l_pos = start;
        for (size_t i = end; i > start; i--)
            if (L->s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if ((l_pos > start || L->line_starting) && l_pos < end) {
            size_t i = l_pos;
            size_t k;
            while (i < end && (k = ws_at(L, i)) != 0) i += k;
            if (i >= end) end = l_pos;
        }
    }
    if (end > start) {
        ns_ttok *t;
        PUSH_OR_FAIL(t, L, NS_TT_DATA, start);
        t->p = L->s + start;
        t->n = end - start;
    }
    return NS_OK;
}

/* Consumes what follows a block/comment end marker at L->pos. */
static void after_end(lexer *L, char sign, int trim) {
    if (sign == '-') {
        L->pos = skip_ws(L, L->pos);
    } else if (sign != '+' && trim && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
    }
    L->line_starting = L->pos > 0 && L->s[L->pos - 1] == '\n';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal body with Python's unicode-escape rules. */
static ns_status decode_string(lexer *L, size_t start, size_t end, ns_ttok *t) {
    char *out = ns_tarena_alloc(L->a, end - start + 1);
    if (!out) return ns_fail(L->err, NS_ERR_NOMEM, "template too large to tokenise");
    size_t o = 0, i = start;
    const char *s = L->s;
    while (i < end) {
        if (s[i] != '\\' || i + 1 >= end) {
            out[o++] = s[i++];
            continue;
        }
        char c = s[i + 1];
        size_t esc = i;
        i += 2;
        switch (c) {
        case '\n': break; /* line continuation */
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'v': out[o++] = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i < end ? hexval(s[i]) : -1;
                if (h < 0) return lex_fail(L, esc, "truncated \\%s escape in string literal", c == 'x' ? "x" : c == 'u' ? "u" : "U");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return lex_fail(L, esc, "escape out of range in string literal");
            o += ns_utf8_encode(cp, out + o);
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                uint32_t cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < end && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += ns_utf8_encode(cp, out + o);
            } else {
                /* unknown escapes keep their backslash, as in Python */
                out[o++] = '\\';
                i--;
            }
            break;
        }
    }
    out[o] = 0;
    t->p = out;
    t->n = o;
    return NS_OK;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* Matches (\d+_)*\d+ at i; returns end or i when no match. */
static size_t match_digits(const lexer *L, size_t i) {
    size_t j = i;
    if (j >= L->n || !is_digit(L->s[j])) return i;
    while (j < L->n && is_digit(L->s[j])) {
        j++;
        if (j + 1 < L->n && L->s[j] == '_' && is_digit(L->s[j + 1])) j++;
    }
    return j;
}

static ns_status lex_number(lexer *L) {
    size_t start = L->pos, n = L->n;
    const char *s = L->s;
    size_t j = match_digits(L, start);
    size_t fend = 0;
    /* float: not directly after a dot (so x.0.1 is two subscripts) */
    if (!(start > 0 && s[start - 1] == '.')) {
        size_t k = j;
        int have_frac = 0;
        if (k < n && s[k] == '.') {
            size_t m = match_digits(L, k + 1);
            if (m > k + 1) {
                k = m;
                have_frac = 1;
            }
        }
        if (k < n && (s[k] == 'e' || s[k] == 'E')) {
            size_t m = k + 1;
            if (m < n && (s[m] == '+' || s[m] == '-')) m++;
            size_t m2 = match_digits(L, m);
            if (m2 > m) fend = m2;
        }
        if (!fend && have_frac) fend = k;
    }
    char buf[128];
    ns_ttok *t;
    if (fend) {
        size_t o = 0;
        for (size_t i = start; i < fend && o < sizeof buf - 1; i++)
            if (s[i] != '_') buf[o++] = s[i];
        buf[o] = 0;
        PUSH_OR_FAIL(t, L, NS_TT_FLOAT, start);
        t->f = strtod(buf, NULL);
        L->pos = fend;
        return NS_OK;
    }
    int base = 10;
    size_t digits_at = start;
    if (s[start] == '0' && start + 1 < n && (s[start + 1] | 32) != 0 && strchr("box", s[start + 1] | 32)) {
        base = (s[start + 1] | 32) == 'b' ? 2 : (s[start + 1] | 32) == 'o' ? 8 : 16;
        digits_at = start + 2;
        j = digits_at;
        while (j < n && (hexval(s[j]) >= 0 && hexval(s[j]) < base)) {
            j++;
            if (j + 1 < n && s[j] == '_' && hexval(s[j + 1]) >= 0 && hexval(s[j + 1]) < base) j++;
        }
        if (j == digits_at) return lex_fail(L, start, "invalid integer literal");
    } else if (s[start] == '0') {
        /* Jinja only accepts 0, 00, 0_0 ... for leading zeros */
        j = start + 1;
        while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0'))) j++;
    }
    size_t o = 0;
    for (size_t i = digits_at; i < j && o < sizeof buf - 1; i++)
        if (s[i] != '_') buf[o++] = s[i];
    buf[o] = 0;
    errno = 0;
    long long v = strtoll(buf, NULL, base);
    if (errno == ERANGE) return lex_fail(L, start, "integer literal too large");
    PUSH_OR_FAIL(t, L, NS_TT_INT, start);
    t->i = v;
    L->pos = j;
    return NS_OK;
}

/* Lexes the inside of a {{ }} or {% %} tag up to and including its end. */
static ns_status lex_tag(lexer *L, int is_block, size_t tag_start) {
    char stack[MAX_TAG_NESTING];
    int depth = 0;
    const char *s = L->s;
    for (;;) {
        L->pos = skip_ws(L, L->pos);
        size_t p = L->pos;
        if (p >= L->n)
            return lex_fail(L, tag_start, "unexpected end of template: tag opened here is never closed");
        if (depth == 0) {
            const char *close = is_block ? "%}" : "}}";
            char sign = 0;
            size_t endpos = 0;
            /* "-%}" / "+%}" / "-}}" (the source is NUL-terminated, so
             * comparing past its end just fails) */
            if ((s[p] == '-' || (is_block && s[p] == '+')) && strncmp(s + p + 1, close, 2) == 0) {
                sign = s[p];
                endpos = p + 3;
            } else if (strncmp(s + p, close, 2) == 0) {
                endpos = p + 2;
            }
            if (endpos) {
                ns_ttok *t;
                PUSH_OR_FAIL(t, L, is_block ? NS_TT_BLOCK_END : NS_TT_VAR_END, p);
                L->pos = endpos;
                after_end(L, sign, is_block);
                return NS_OK;
            }
        }
        char c = s[p];
        if (is_digit(c)) {
            ns_status st = lex_number(L);
            if (st != NS_OK) return st;
            continue;
        }
        if (is_name_start(c)) {
            size_t j = p;
            while (j < L->n && is_name_char(s[j])) j++;
            ns_ttok *t;
            PUSH_OR_FAIL(t, L, NS_TT_NAME, p);
            t->p = s + p;
            t->n = j - p;
            L->pos = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t j = p + 1;
            while (j < L->n && s[j] != c) j += (s[j] == '\\' && j + 1 < L->n) ? 2 : 1;
            if (j >= L->n) return lex_fail(L, p, "unterminated string literal");
            ns_ttok *t;
            PUSH_OR_FAIL(t, L, NS_TT_STRING, p);
            ns_status st = decode_string(L, p + 1, j, t);
            if (st != NS_OK) return st;
            L->pos = j + 1;
            continue;
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
            size_t ln = strlen(OPS[k].s);
            if (p + ln <= L->n && memcmp(s + p, OPS[k].s, ln) == 0) {
                op = OPS[k].op;
                oplen = ln;
                break;
            }
        }
        if (!op) {
            char what[8] = {0};
            size_t j = p;
            ns_utf8_next(s, L->n, &j);
            memcpy(what, s + p, j - p < 7 ? j - p : 7);
            return lex_fail(L, p, "unexpected character '%s'", what);
        }
        if (op == NS_OP_LPAREN || op == NS_OP_LBRACKET || op == NS_OP_LBRACE) {
            if (depth >= MAX_TAG_NESTING) return lex_fail(L, p, "brackets nested too deeply");
            stack[depth++] = (char)(op == NS_OP_LPAREN ? ')' : op == NS_OP_LBRACKET ? ']' : '}');
        } else if (op == NS_OP_RPAREN || op == NS_OP_RBRACKET || op == NS_OP_RBRACE) {
            char want = ns_top_str(op)[0];
            if (depth == 0) return lex_fail(L, p, "unexpected '%s'", ns_top_str(op));
            if (stack[depth - 1] != want) {
                char m[2] = {stack[depth - 1], 0};
                return lex_fail(L, p, "unexpected bracket: expected '%s'", m);
            }
            depth--;
        }
        ns_ttok *t;
        PUSH_OR_FAIL(t, L, NS_TT_OP, p);
        t->op = op;
        L->pos = p + oplen;
    }
}

/* At s[i] == "{%": matches {%[-+]?\s*WORD\s*(-%}\s*|+%}|%}) and returns the
 * offset just past "%}" (0 when no match); *sign_out gets the begin sign
 * and *end_sign the end sign. */
static size_t match_word_tag(const lexer *L, size_t i, const char *word, char *sign_out, char *end_sign) {
    const char *s = L->s;
    size_t j = i + 2;
    char sign = 0;
    if (j < L->n && (s[j] == '-' || s[j] == '+')) sign = s[j++];
    j = skip_ws(L, j);
    size_t wl = strlen(word);
    if (j + wl > L->n || memcmp(s + j, word, wl) != 0) return 0;
    j = skip_ws(L, j + wl);
    char es = 0;
    if (j < L->n && (s[j] == '-' || s[j] == '+')) es = s[j++];
    if (j + 2 > L->n || s[j] != '%' || s[j + 1] != '}') return 0;
    *sign_out = sign;
    *end_sign = es;
    return j + 2;
}

static ns_status lex_raw(lexer *L, size_t tag_at, char end_sign_begin) {
    /* {% raw %} ends with no trim_blocks newline removal (Jinja quirk) */
    if (end_sign_begin == '-') L->pos = skip_ws(L, L->pos);
    L->line_starting = L->pos > 0 && L->s[L->pos - 1] == '\n';
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->s[i] != '{' || L->s[i + 1] != '%') continue;
        char sign, es;
        size_t after = match_word_tag(L, i, "endraw", &sign, &es);
        if (!after) continue;
        ns_status st = emit_text(L, L->pos, i, sign, 0);
        if (st != NS_OK) return st;
        L->pos = after;
        after_end(L, es, 1);
        return NS_OK;
    }
    return lex_fail(L, tag_at, "missing end of raw directive");
}

ns_status ns_tlex(ns_tarena *a, const char *src, size_t len, ns_ttok **toks, size_t *ntoks, ns_error *err) {
    lexer L;
    memset(&L, 0, sizeof L);
    L.a = a;
    L.err = err;
    /* normalise \r\n and \r to \n; drop one trailing newline */
    char *s = ns_tarena_alloc(a, len + 1);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "template too large");
    size_t n = 0, nl = 1;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '\r') {
            if (i + 1 < len && src[i + 1] == '\n') i++;
            c = '\n';
        }
        if (c == '\n') nl++;
        s[n++] = c;
    }
    if (n > 0 && s[n - 1] == '\n') {
        n--;
        nl--;
    }
    s[n] = 0;
    L.s = s;
    L.n = n;
    L.lines = ns_tarena_alloc(a, nl * sizeof(size_t));
    if (!L.lines) return ns_fail(err, NS_ERR_NOMEM, "template too large");
    L.lines[L.nlines++] = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\n' && L.nlines < nl) L.lines[L.nlines++] = i + 1;
    L.line_starting = 1;

    ns_status st;
    while (L.pos < L.n) {
        size_t i = L.pos;
        const char *hit = NULL;
        while (i + 1 < L.n) {
            hit = memchr(s + i, '{', L.n - i - 1);
            if (!hit) break;
            i = (size_t)(hit - s);
            if (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#') break;
            i++;
            hit = NULL;
        }
        if (!hit) {
            st = emit_text(&L, L.pos, L.n, '+', 1);
            if (st != NS_OK) return st;
            break;
        }
        char kind = s[i + 1];
        size_t j = i + 2;
        char sign = 0;
        if (j < L.n && (s[j] == '-' || s[j] == '+')) sign = s[j++];
        if (kind == '%') {
            char rs, res;
            size_t after = match_word_tag(&L, i, "raw", &rs, &res);
            if (after && res != '+') {
                st = emit_text(&L, L.pos, i, rs, 0);
                if (st != NS_OK) return st;
                L.pos = after;
                st = lex_raw(&L, i, res);
                if (st != NS_OK) return st;
                continue;
            }
        }
        st = emit_text(&L, L.pos, i, sign, kind == '{');
        if (st != NS_OK) return st;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t k = j; k + 1 < L.n; k++)
                if (s[k] == '#' && s[k + 1] == '}') {
                    e = s + k;
                    break;
                }
            if (!e) return lex_fail(&L, i, "missing end of comment tag");
            size_t k = (size_t)(e - s);
            char es = (k > j && (s[k - 1] == '-' || s[k - 1] == '+')) ? s[k - 1] : 0;
            L.pos = k + 2;
            after_end(&L, es, 1);
            continue;
        }
        ns_ttok *t;
        PUSH_OR_FAIL(t, &L, kind == '%' ? NS_TT_BLOCK_BEGIN : NS_TT_VAR_BEGIN, i);
        L.pos = j;
        st = lex_tag(&L, kind == '%', i);
        if (st != NS_OK) return st;
    }
    ns_ttok *t;
    PUSH_OR_FAIL(t, &L, NS_TT_EOF, L.n);
    *toks = L.toks;
    *ntoks = L.ntoks;
    return NS_OK;
}
