#include "template/parser.h"

#include "template/stackguard.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    ns_tarena *a;
    const ns_ttok *t;
    size_t n, i;
    int depth;
    int loop_depth; /* for bodies enclosing the current point (reset by macro) */
    uintptr_t stack_floor;
    ns_error *err;
} parser;

typedef struct {
    ns_tnode **v;
    size_t n, cap;
} nvec;

static ns_status pfail(parser *P, const ns_ttok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ns_status pfail(parser *P, const ns_ttok *t, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ns_fail(P->err, NS_ERR_FORMAT, "template:%d:%d: %s", t->line, t->col, msg);
}

static ns_status oom(parser *P) { return ns_fail(P->err, NS_ERR_NOMEM, "template too large to parse"); }

static const ns_ttok *cur(const parser *P) { return &P->t[P->i]; }
static const ns_ttok *peek(const parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->n - 1]; }
static void advance(parser *P) {
    if (P->i + 1 < P->n) P->i++;
}

static int tok_is_name(const ns_ttok *t, const char *s) {
    return t->type == NS_TT_NAME && t->n == strlen(s) && memcmp(t->p, s, t->n) == 0;
}
static int tok_is_op(const ns_ttok *t, int op) { return t->type == NS_TT_OP && t->op == op; }
static int is_name(const parser *P, const char *s) { return tok_is_name(cur(P), s); }
static int is_op(const parser *P, int op) { return tok_is_op(cur(P), op); }

/* Describes a token for "expected X, got Y" messages. */
static void describe(const ns_ttok *t, char *buf, size_t n) {
    switch (t->type) {
    case NS_TT_EOF: snprintf(buf, n, "end of template"); break;
    case NS_TT_DATA: snprintf(buf, n, "template data"); break;
    case NS_TT_VAR_BEGIN: snprintf(buf, n, "'{{'"); break;
    case NS_TT_VAR_END: snprintf(buf, n, "end of print statement"); break;
    case NS_TT_BLOCK_BEGIN: snprintf(buf, n, "'{%%'"); break;
    case NS_TT_BLOCK_END: snprintf(buf, n, "end of statement block"); break;
    case NS_TT_NAME: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); break;
    case NS_TT_INT: snprintf(buf, n, "integer"); break;
    case NS_TT_FLOAT: snprintf(buf, n, "float"); break;
    case NS_TT_STRING: snprintf(buf, n, "string"); break;
    case NS_TT_OP: snprintf(buf, n, "'%s'", ns_top_str(t->op)); break;
    default: snprintf(buf, n, "token"); break;
    }
}

static ns_status unexpected(parser *P, const char *wanted) {
    char got[64];
    describe(cur(P), got, sizeof got);
    if (wanted) return pfail(P, cur(P), "expected %s, got %s", wanted, got);
    return pfail(P, cur(P), "unexpected %s", got);
}

static ns_status expect_op(parser *P, int op) {
    if (!is_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", ns_top_str(op));
        return unexpected(P, w);
    }
    advance(P);
    return NS_OK;
}

static ns_status expect_block_end(parser *P) {
    if (cur(P)->type != NS_TT_BLOCK_END) return unexpected(P, "end of statement block");
    advance(P);
    return NS_OK;
}

static ns_status expect_name_tok(parser *P, ns_tstr *out) {
    if (cur(P)->type != NS_TT_NAME) return unexpected(P, "name");
    out->p = cur(P)->p;
    out->n = cur(P)->n;
    advance(P);
    return NS_OK;
}

static ns_tnode *mk(parser *P, int kind, const ns_ttok *at) {
    ns_tnode *n = ns_tarena_alloc(P->a, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static ns_status nvec_push(parser *P, nvec *v, ns_tnode *x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        ns_tnode **nv = ns_tarena_grow(P->a, v->v, v->n * sizeof *nv, nc * sizeof *nv);
        if (!nv) return oom(P);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return NS_OK;
}

static ns_tnodes nvec_done(nvec *v) {
    ns_tnodes r = {v->v, v->n};
    return r;
}

#define TRY(x)                              \
    do {                                    \
        ns_status _st = (x);                \
        if (_st != NS_OK) return _st;       \
    } while (0)
#define NEW(var, kind, at)                  \
    do {                                    \
        (var) = mk(P, (kind), (at));        \
        if (!(var)) return oom(P);          \
    } while (0)

static ns_status enter(parser *P) {
    if (++P->depth > NS_TPL_MAX_PARSE_DEPTH || ns_tstack_exhausted(P->stack_floor))
        return pfail(P, cur(P), "template nested too deeply");
    return NS_OK;
}

static ns_status parse_expression(parser *P, int with_condexpr, ns_tnode **out);
static ns_status parse_or(parser *P, ns_tnode **out);
static ns_status parse_unary(parser *P, int with_filter, ns_tnode **out);
static ns_status parse_primary(parser *P, ns_tnode **out);
static ns_status parse_postfix(parser *P, ns_tnode **node);
static ns_status parse_filter_expr(parser *P, ns_tnode **node);
static ns_status parse_filter(parser *P, ns_tnode *node, int start_inline, ns_tnode **out);
static ns_status parse_body(parser *P, const char *const *ends, ns_tnodes *out);

/* ---- expressions ----------------------------------------------------------- */

static int is_tuple_end(parser *P, const char *extra_end) {
    const ns_ttok *t = cur(P);
    if (t->type == NS_TT_VAR_END || t->type == NS_TT_BLOCK_END || t->type == NS_TT_EOF) return 1;
    if (tok_is_op(t, NS_OP_RPAREN)) return 1;
    return extra_end && tok_is_name(t, extra_end);
}

/* Jinja's parse_tuple: a, b, c (a tuple) or a single expression. */
static ns_status parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens,
                             ns_tnode **out) {
    const ns_ttok *start = cur(P);
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) TRY(expect_op(P, NS_OP_COMMA));
        if (is_tuple_end(P, extra_end)) break;
        ns_tnode *e;
        if (simplified) TRY(parse_primary(P, &e));
        else TRY(parse_expression(P, with_condexpr, &e));
        TRY(nvec_push(P, &items, e));
        if (is_op(P, NS_OP_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) {
            *out = items.v[0];
            return NS_OK;
        }
        if (!explicit_parens) return unexpected(P, "an expression");
    }
    ns_tnode *t;
    NEW(t, NS_N_TUPLE, start);
    t->items = nvec_done(&items);
    *out = t;
    return NS_OK;
}

static ns_status parse_call_args(parser *P, ns_targs *args) {
    const ns_ttok *open = cur(P);
    TRY(expect_op(P, NS_OP_LPAREN));
    nvec pos = {0}, kwv = {0};
    ns_tstr *names = NULL;
    size_t names_cap = 0;
    int need_comma = 0;
    while (!is_op(P, NS_OP_RPAREN)) {
        if (need_comma) {
            TRY(expect_op(P, NS_OP_COMMA));
            if (is_op(P, NS_OP_RPAREN)) break;
        }
        if (is_op(P, NS_OP_MUL) || is_op(P, NS_OP_POW))
            return pfail(P, cur(P), "*args and **kwargs in calls are not supported");
        if (cur(P)->type == NS_TT_NAME && tok_is_op(peek(P), NS_OP_ASSIGN)) {
            if (kwv.n == names_cap) {
                size_t nc = names_cap ? names_cap * 2 : 4;
                ns_tstr *nn = ns_tarena_grow(P->a, names, kwv.n * sizeof *nn, nc * sizeof *nn);
                if (!nn) return oom(P);
                names = nn;
                names_cap = nc;
            }
            names[kwv.n].p = cur(P)->p;
            names[kwv.n].n = cur(P)->n;
            advance(P);
            advance(P);
            ns_tnode *v;
            TRY(parse_expression(P, 1, &v));
            TRY(nvec_push(P, &kwv, v));
        } else {
            if (kwv.n) return pfail(P, open, "invalid syntax for function call expression");
            ns_tnode *v;
            TRY(parse_expression(P, 1, &v));
            TRY(nvec_push(P, &pos, v));
        }
        need_comma = 1;
    }
    TRY(expect_op(P, NS_OP_RPAREN));
    args->pos = nvec_done(&pos);
    args->kw_vals = nvec_done(&kwv);
    args->kw_names = names;
    return NS_OK;
}

static ns_status parse_list(parser *P, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_N_LIST, cur(P));
    TRY(expect_op(P, NS_OP_LBRACKET));
    nvec items = {0};
    while (!is_op(P, NS_OP_RBRACKET)) {
        if (items.n) TRY(expect_op(P, NS_OP_COMMA));
        if (is_op(P, NS_OP_RBRACKET)) break;
        ns_tnode *e;
        TRY(parse_expression(P, 1, &e));
        TRY(nvec_push(P, &items, e));
    }
    TRY(expect_op(P, NS_OP_RBRACKET));
    n->items = nvec_done(&items);
    *out = n;
    return NS_OK;
}

static ns_status parse_dict(parser *P, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_N_DICT, cur(P));
    TRY(expect_op(P, NS_OP_LBRACE));
    nvec items = {0};
    while (!is_op(P, NS_OP_RBRACE)) {
        if (items.n) TRY(expect_op(P, NS_OP_COMMA));
        if (is_op(P, NS_OP_RBRACE)) break;
        ns_tnode *k, *v;
        TRY(parse_expression(P, 1, &k));
        TRY(expect_op(P, NS_OP_COLON));
        TRY(parse_expression(P, 1, &v));
        TRY(nvec_push(P, &items, k));
        TRY(nvec_push(P, &items, v));
    }
    TRY(expect_op(P, NS_OP_RBRACE));
    n->items = nvec_done(&items);
    *out = n;
    return NS_OK;
}

static ns_status parse_primary(parser *P, ns_tnode **out) {
    const ns_ttok *t = cur(P);
    ns_tnode *n = NULL;
    switch (t->type) {
    case NS_TT_NAME:
        if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") || tok_is_name(t, "False")) {
            NEW(n, NS_N_CONST, t);
            n->value = ns_tv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            NEW(n, NS_N_CONST, t);
            n->value = ns_tv_none();
        } else {
            NEW(n, NS_N_NAME, t);
            n->name.p = t->p;
            n->name.n = t->n;
        }
        advance(P);
        break;
    case NS_TT_STRING: {
        NEW(n, NS_N_CONST, t);
        advance(P);
        if (cur(P)->type != NS_TT_STRING) {
            n->value = ns_tv_str(t->p, t->n);
            break;
        }
        /* adjacent literals concatenate: "a" "b" == "ab" */
        size_t total = t->n;
        for (size_t k = P->i; P->t[k].type == NS_TT_STRING; k++) total += P->t[k].n;
        char *buf = ns_tarena_alloc(P->a, total + 1);
        if (!buf) return oom(P);
        memcpy(buf, t->p, t->n);
        size_t o = t->n;
        while (cur(P)->type == NS_TT_STRING) {
            memcpy(buf + o, cur(P)->p, cur(P)->n);
            o += cur(P)->n;
            advance(P);
        }
        n->value = ns_tv_str(buf, o);
        break;
    }
    case NS_TT_INT:
        NEW(n, NS_N_CONST, t);
        n->value = ns_tv_int(t->i);
        advance(P);
        break;
    case NS_TT_FLOAT:
        NEW(n, NS_N_CONST, t);
        n->value = ns_tv_float(t->f);
        advance(P);
        break;
    case NS_TT_OP:
        if (t->op == NS_OP_LPAREN) {
            advance(P);
            TRY(parse_tuple(P, 0, 1, NULL, 1, &n));
            TRY(expect_op(P, NS_OP_RPAREN));
            break;
        }
        if (t->op == NS_OP_LBRACKET) {
            TRY(parse_list(P, &n));
            break;
        }
        if (t->op == NS_OP_LBRACE) {
            TRY(parse_dict(P, &n));
            break;
        }
        return unexpected(P, NULL);
    default:
        return unexpected(P, NULL);
    }
    *out = n;
    return NS_OK;
}

/* One element inside [...]: an expression or a slice a:b:c. */
static ns_status parse_subscribed(parser *P, ns_tnode **out, int *is_slice, ns_tnode *sl[3]) {
    *is_slice = 0;
    sl[0] = sl[1] = sl[2] = NULL;
    if (!is_op(P, NS_OP_COLON)) {
        ns_tnode *e;
        TRY(parse_expression(P, 1, &e));
        if (!is_op(P, NS_OP_COLON)) {
            *out = e;
            return NS_OK;
        }
        sl[0] = e;
    }
    advance(P); /* the first ':' */
    *is_slice = 1;
    if (!is_op(P, NS_OP_COLON) && !is_op(P, NS_OP_RBRACKET) && !is_op(P, NS_OP_COMMA))
        TRY(parse_expression(P, 1, &sl[1]));
    if (is_op(P, NS_OP_COLON)) {
        advance(P);
        if (!is_op(P, NS_OP_RBRACKET) && !is_op(P, NS_OP_COMMA)) TRY(parse_expression(P, 1, &sl[2]));
    }
    return NS_OK;
}

static ns_status parse_subscript(parser *P, ns_tnode **node) {
    const ns_ttok *t = cur(P);
    if (t->op == NS_OP_DOT) {
        advance(P);
        const ns_ttok *at = cur(P);
        ns_tnode *n;
        if (at->type == NS_TT_NAME) {
            NEW(n, NS_N_GETATTR, t);
            n->a = *node;
            n->name.p = at->p;
            n->name.n = at->n;
        } else if (at->type == NS_TT_INT) {
            ns_tnode *k;
            NEW(k, NS_N_CONST, at);
            k->value = ns_tv_int(at->i);
            NEW(n, NS_N_GETITEM, t);
            n->a = *node;
            n->b = k;
        } else {
            return unexpected(P, "name or number");
        }
        advance(P);
        *node = n;
        return NS_OK;
    }
    /* '[' */
    advance(P);
    nvec args = {0};
    ns_tnode *slice_parts[3] = {0};
    int any_slice = 0;
    while (!is_op(P, NS_OP_RBRACKET)) {
        if (args.n) TRY(expect_op(P, NS_OP_COMMA));
        ns_tnode *e = NULL;
        int is_slice;
        ns_tnode *sl[3];
        TRY(parse_subscribed(P, &e, &is_slice, sl));
        if (is_slice) {
            any_slice = 1;
            memcpy(slice_parts, sl, sizeof sl);
        }
        TRY(nvec_push(P, &args, e));
    }
    TRY(expect_op(P, NS_OP_RBRACKET));
    if (args.n == 0) return pfail(P, t, "expected a subscript");
    ns_tnode *n;
    if (any_slice) {
        if (args.n != 1) return pfail(P, t, "multi-dimensional slices are not supported");
        NEW(n, NS_N_SLICE, t);
        n->a = *node;
        n->b = slice_parts[0];
        n->c = slice_parts[1];
        n->d = slice_parts[2];
    } else {
        NEW(n, NS_N_GETITEM, t);
        n->a = *node;
        if (args.n == 1) {
            n->b = args.v[0];
        } else {
            ns_tnode *tup;
            NEW(tup, NS_N_TUPLE, t);
            tup->items = nvec_done(&args);
            n->b = tup;
        }
    }
    *node = n;
    return NS_OK;
}

static ns_status parse_call(parser *P, ns_tnode **node) {
    ns_tnode *n;
    NEW(n, NS_N_CALL, cur(P));
    /* report call errors at the callee ("foo(" points at foo) */
    n->line = (*node)->line;
    n->col = (*node)->col;
    n->a = *node;
    TRY(parse_call_args(P, &n->args));
    *node = n;
    return NS_OK;
}

static ns_status parse_postfix(parser *P, ns_tnode **node) {
    for (;;) {
        if (is_op(P, NS_OP_DOT) || is_op(P, NS_OP_LBRACKET)) TRY(parse_subscript(P, node));
        else if (is_op(P, NS_OP_LPAREN)) TRY(parse_call(P, node));
        else return NS_OK;
    }
}

static ns_status parse_dotted_name(parser *P, ns_tstr *name) {
    TRY(expect_name_tok(P, name));
    while (is_op(P, NS_OP_DOT)) {
        /* dotted filter/test names: keep the whole spelling */
        advance(P);
        ns_tstr part = {NULL, 0};
        TRY(expect_name_tok(P, &part));
        name->n = (size_t)(part.p + part.n - name->p);
    }
    return NS_OK;
}

static ns_status parse_filter(parser *P, ns_tnode *node, int start_inline, ns_tnode **out) {
    while (is_op(P, NS_OP_PIPE) || start_inline) {
        if (!start_inline) advance(P);
        start_inline = 0;
        ns_tnode *f;
        NEW(f, NS_N_FILTER, cur(P));
        TRY(parse_dotted_name(P, &f->name));
        if (is_op(P, NS_OP_LPAREN)) TRY(parse_call_args(P, &f->args));
        f->a = node;
        node = f;
    }
    *out = node;
    return NS_OK;
}

static ns_status parse_test(parser *P, ns_tnode **node) {
    const ns_ttok *is_tok = cur(P);
    advance(P); /* 'is' */
    int negated = 0;
    if (is_name(P, "not")) {
        advance(P);
        negated = 1;
    }
    ns_tnode *t;
    NEW(t, NS_N_TEST, cur(P));
    TRY(parse_dotted_name(P, &t->name));
    t->a = *node;
    const ns_ttok *c = cur(P);
    if (is_op(P, NS_OP_LPAREN)) {
        TRY(parse_call_args(P, &t->args));
    } else if ((c->type == NS_TT_NAME || c->type == NS_TT_STRING || c->type == NS_TT_INT || c->type == NS_TT_FLOAT ||
                tok_is_op(c, NS_OP_LBRACKET) || tok_is_op(c, NS_OP_LBRACE)) &&
               !tok_is_name(c, "else") && !tok_is_name(c, "or") && !tok_is_name(c, "and")) {
        if (tok_is_name(c, "is")) return pfail(P, c, "You cannot chain multiple tests with is");
        ns_tnode *arg;
        TRY(parse_primary(P, &arg));
        TRY(parse_postfix(P, &arg));
        ns_tnode **one = ns_tarena_alloc(P->a, sizeof *one);
        if (!one) return oom(P);
        one[0] = arg;
        t->args.pos.v = one;
        t->args.pos.n = 1;
    }
    if (negated) {
        ns_tnode *n;
        NEW(n, NS_N_UNARY, is_tok);
        n->op = NS_U_NOT;
        n->a = t;
        t = n;
    }
    *node = t;
    return NS_OK;
}

static ns_status parse_filter_expr(parser *P, ns_tnode **node) {
    for (;;) {
        if (is_op(P, NS_OP_PIPE)) TRY(parse_filter(P, *node, 0, node));
        else if (is_name(P, "is")) TRY(parse_test(P, node));
        else if (is_op(P, NS_OP_LPAREN)) TRY(parse_call(P, node));
        else return NS_OK;
    }
}

static ns_status parse_unary(parser *P, int with_filter, ns_tnode **out) {
    TRY(enter(P));
    const ns_ttok *t = cur(P);
    ns_tnode *n;
    if (is_op(P, NS_OP_SUB) || is_op(P, NS_OP_ADD)) {
        advance(P);
        ns_tnode *operand;
        TRY(parse_unary(P, 0, &operand));
        NEW(n, NS_N_UNARY, t);
        n->op = t->op == NS_OP_SUB ? NS_U_NEG : NS_U_POS;
        n->a = operand;
    } else {
        TRY(parse_primary(P, &n));
    }
    TRY(parse_postfix(P, &n));
    if (with_filter) TRY(parse_filter_expr(P, &n));
    P->depth--;
    *out = n;
    return NS_OK;
}

static ns_status mk_binary(parser *P, const ns_ttok *at, int op, ns_tnode *l, ns_tnode *r, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_N_BINARY, at);
    n->op = op;
    n->a = l;
    n->b = r;
    *out = n;
    return NS_OK;
}

/* One left-associative level of binary operators, `sub (op sub)*`, as
 * Jinja's parser has one per precedence: match returns the binary op code
 * the current token continues the chain with, or 0 (NS_OP_NONE). */
typedef ns_status (*subexpr_fn)(parser *P, ns_tnode **out);
static ns_status parse_left_assoc(parser *P, subexpr_fn sub, int (*match)(const parser *P), ns_tnode **out) {
    ns_tnode *l;
    TRY(sub(P, &l));
    int op;
    while ((op = match(P)) != 0) {
        const ns_ttok *t = cur(P);
        advance(P);
        ns_tnode *r;
        TRY(sub(P, &r));
        TRY(mk_binary(P, t, op, l, r, &l));
    }
    *out = l;
    return NS_OK;
}

static int match_pow(const parser *P) { return is_op(P, NS_OP_POW) ? NS_OP_POW : 0; }
static int match_math2(const parser *P) {
    int m = is_op(P, NS_OP_MUL) || is_op(P, NS_OP_DIV) || is_op(P, NS_OP_FLOORDIV) || is_op(P, NS_OP_MOD);
    return m ? cur(P)->op : 0;
}
static int match_concat(const parser *P) { return is_op(P, NS_OP_TILDE) ? NS_OP_TILDE : 0; }
static int match_math1(const parser *P) { return is_op(P, NS_OP_ADD) || is_op(P, NS_OP_SUB) ? cur(P)->op : 0; }
static int match_and(const parser *P) { return is_name(P, "and") ? NS_B_AND : 0; }
static int match_or(const parser *P) { return is_name(P, "or") ? NS_B_OR : 0; }

static ns_status parse_unary_filtered(parser *P, ns_tnode **out) { return parse_unary(P, 1, out); }
static ns_status parse_pow(parser *P, ns_tnode **out) {
    return parse_left_assoc(P, parse_unary_filtered, match_pow, out);
}
static ns_status parse_math2(parser *P, ns_tnode **out) { return parse_left_assoc(P, parse_pow, match_math2, out); }
static ns_status parse_concat(parser *P, ns_tnode **out) { return parse_left_assoc(P, parse_math2, match_concat, out); }
static ns_status parse_math1(parser *P, ns_tnode **out) { return parse_left_assoc(P, parse_concat, match_math1, out); }

static ns_status parse_compare(parser *P, ns_tnode **out) {
    const ns_ttok *start = cur(P);
    ns_tnode *first;
    TRY(parse_math1(P, &first));
    nvec operands = {0};
    int *ops = NULL;
    size_t ops_cap = 0;
    for (;;) {
        const ns_ttok *t = cur(P);
        int op = 0;
        if (t->type == NS_TT_OP && (t->op == NS_OP_EQ || t->op == NS_OP_NE || t->op == NS_OP_GT ||
                                    t->op == NS_OP_GE || t->op == NS_OP_LT || t->op == NS_OP_LE)) {
            op = t->op;
            advance(P);
        } else if (tok_is_name(t, "in")) {
            op = NS_C_IN;
            advance(P);
        } else if (tok_is_name(t, "not") && tok_is_name(peek(P), "in")) {
            op = NS_C_NOTIN;
            advance(P);
            advance(P);
        } else {
            break;
        }
        ns_tnode *r;
        TRY(parse_math1(P, &r));
        if (operands.n == ops_cap) {
            size_t nc = ops_cap ? ops_cap * 2 : 2;
            int *no = ns_tarena_grow(P->a, ops, operands.n * sizeof *no, nc * sizeof *no);
            if (!no) return oom(P);
            ops = no;
            ops_cap = nc;
        }
        ops[operands.n] = op;
        TRY(nvec_push(P, &operands, r));
    }
    if (!operands.n) {
        *out = first;
        return NS_OK;
    }
    ns_tnode *n;
    NEW(n, NS_N_COMPARE, start);
    n->a = first;
    n->items = nvec_done(&operands);
    n->ops = ops;
    *out = n;
    return NS_OK;
}

static ns_status parse_not(parser *P, ns_tnode **out) {
    if (is_name(P, "not")) {
        const ns_ttok *t = cur(P);
        advance(P);
        TRY(enter(P));
        ns_tnode *operand;
        TRY(parse_not(P, &operand));
        P->depth--;
        ns_tnode *n;
        NEW(n, NS_N_UNARY, t);
        n->op = NS_U_NOT;
        n->a = operand;
        *out = n;
        return NS_OK;
    }
    return parse_compare(P, out);
}

static ns_status parse_and(parser *P, ns_tnode **out) { return parse_left_assoc(P, parse_not, match_and, out); }
static ns_status parse_or(parser *P, ns_tnode **out) { return parse_left_assoc(P, parse_and, match_or, out); }

static ns_status parse_condexpr(parser *P, ns_tnode **out) {
    TRY(enter(P));
    ns_tnode *e1;
    TRY(parse_or(P, &e1));
    while (is_name(P, "if")) {
        const ns_ttok *t = cur(P);
        advance(P);
        ns_tnode *cond, *e3 = NULL;
        TRY(parse_or(P, &cond));
        if (is_name(P, "else")) {
            advance(P);
            TRY(parse_condexpr(P, &e3));
        }
        ns_tnode *n;
        NEW(n, NS_N_COND, t);
        n->a = cond;
        n->b = e1;
        n->c = e3;
        e1 = n;
    }
    P->depth--;
    *out = e1;
    return NS_OK;
}

static ns_status parse_expression(parser *P, int with_condexpr, ns_tnode **out) {
    return with_condexpr ? parse_condexpr(P, out) : parse_or(P, out);
}

/* ---- statements -------------------------------------------------------------- */

/* Assignment targets: "a", "a, b" or "(a, b)". */
static ns_status parse_targets(parser *P, const char *extra_end, ns_tstr **names, size_t *n) {
    ns_tstr buf[16];
    size_t k = 0;
    int paren = 0;
    if (is_op(P, NS_OP_LPAREN)) {
        paren = 1;
        advance(P);
    }
    for (;;) {
        if (k == 16) return pfail(P, cur(P), "too many assignment targets");
        TRY(expect_name_tok(P, &buf[k]));
        k++;
        if (!is_op(P, NS_OP_COMMA)) break;
        advance(P);
        if (paren && is_op(P, NS_OP_RPAREN)) break;
        if (!paren && (cur(P)->type == NS_TT_BLOCK_END || (extra_end && is_name(P, extra_end)) || is_op(P, NS_OP_ASSIGN)))
            break;
    }
    if (paren) TRY(expect_op(P, NS_OP_RPAREN));
    *names = ns_tarena_alloc(P->a, k * sizeof **names);
    if (!*names) return oom(P);
    memcpy(*names, buf, k * sizeof *buf);
    *n = k;
    return NS_OK;
}

/* Consumes {% endNAME %} when the body parser stopped at it. */
static ns_status expect_end(parser *P, const char *name) {
    if (!is_name(P, name)) {
        char w[32];
        snprintf(w, sizeof w, "'%s'", name);
        return unexpected(P, w);
    }
    advance(P);
    return expect_block_end(P);
}

static ns_status parse_params(parser *P, ns_tnode *n) {
    TRY(expect_op(P, NS_OP_LPAREN));
    ns_tstr buf[64];
    ns_tnode *defs[64];
    size_t k = 0;
    while (!is_op(P, NS_OP_RPAREN)) {
        if (k) TRY(expect_op(P, NS_OP_COMMA));
        if (is_op(P, NS_OP_RPAREN)) break;
        if (k == 64) return pfail(P, cur(P), "too many macro parameters");
        TRY(expect_name_tok(P, &buf[k]));
        defs[k] = NULL;
        if (is_op(P, NS_OP_ASSIGN)) {
            advance(P);
            TRY(parse_expression(P, 1, &defs[k]));
        } else if (k && defs[k - 1]) {
            return pfail(P, cur(P), "non-default argument follows default argument");
        }
        k++;
    }
    TRY(expect_op(P, NS_OP_RPAREN));
    n->names = ns_tarena_alloc(P->a, (k ? k : 1) * sizeof *n->names);
    n->defaults.v = ns_tarena_alloc(P->a, (k ? k : 1) * sizeof *n->defaults.v);
    if (!n->names || !n->defaults.v) return oom(P);
    memcpy(n->names, buf, k * sizeof *buf);
    memcpy(n->defaults.v, defs, k * sizeof *defs);
    n->n_names = k;
    n->defaults.n = k;
    return NS_OK;
}

static ns_status parse_for(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_FOR, at);
    TRY(parse_targets(P, "in", &n->names, &n->n_names));
    if (!is_name(P, "in")) return unexpected(P, "'in'");
    advance(P);
    TRY(parse_tuple(P, 0, 0, "recursive", 0, &n->a));
    if (is_name(P, "if")) {
        advance(P);
        TRY(parse_expression(P, 1, &n->b));
    }
    if (is_name(P, "recursive")) {
        advance(P);
        n->flag = 1;
    }
    TRY(expect_block_end(P));
    static const char *const body_ends[] = {"endfor", "else", NULL};
    static const char *const else_ends[] = {"endfor", NULL};
    P->loop_depth++;
    TRY(parse_body(P, body_ends, &n->body));
    P->loop_depth--;
    if (is_name(P, "else")) {
        advance(P);
        TRY(expect_block_end(P));
        TRY(parse_body(P, else_ends, &n->else_body));
    }
    TRY(expect_end(P, "endfor"));
    *out = n;
    return NS_OK;
}

static ns_status parse_if(parser *P, const ns_ttok *at, ns_tnode **out) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const else_ends[] = {"endif", NULL};
    ns_tnode *root;
    NEW(root, NS_S_IF, at);
    ns_tnode *n = root;
    TRY(parse_tuple(P, 0, 0, NULL, 0, &n->a));
    TRY(expect_block_end(P));
    TRY(parse_body(P, ends, &n->body));
    for (;;) {
        if (is_name(P, "elif")) {
            ns_tnode *e;
            NEW(e, NS_S_IF, cur(P));
            advance(P);
            TRY(parse_tuple(P, 0, 0, NULL, 0, &e->a));
            TRY(expect_block_end(P));
            TRY(parse_body(P, ends, &e->body));
            ns_tnode **one = ns_tarena_alloc(P->a, sizeof *one);
            if (!one) return oom(P);
            one[0] = e;
            n->else_body.v = one;
            n->else_body.n = 1;
            n = e;
            continue;
        }
        if (is_name(P, "else")) {
            advance(P);
            TRY(expect_block_end(P));
            TRY(parse_body(P, else_ends, &n->else_body));
        }
        break;
    }
    TRY(expect_end(P, "endif"));
    *out = root;
    return NS_OK;
}

static ns_status parse_set(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_SET, at);
    if (cur(P)->type == NS_TT_NAME && tok_is_op(peek(P), NS_OP_DOT)) {
        /* namespace attribute: {% set ns.attr = value %} */
        ns_tnode *target;
        NEW(target, NS_N_NAME, cur(P));
        target->name.p = cur(P)->p;
        target->name.n = cur(P)->n;
        advance(P);
        advance(P);
        TRY(expect_name_tok(P, &n->name));
        n->b = target;
    } else {
        TRY(parse_targets(P, NULL, &n->names, &n->n_names));
    }
    if (is_op(P, NS_OP_ASSIGN)) {
        advance(P);
        TRY(parse_tuple(P, 0, 1, NULL, 0, &n->a));
        TRY(expect_block_end(P));
        *out = n;
        return NS_OK;
    }
    /* block set: {% set x %}...{% endset %}, optionally with filters */
    if (n->n_names > 1) return unexpected(P, "'='");
    n->flag = 1;
    if (is_op(P, NS_OP_PIPE)) {
        advance(P);
        TRY(parse_filter(P, NULL, 1, &n->a));
    }
    TRY(expect_block_end(P));
    static const char *const ends[] = {"endset", NULL};
    TRY(parse_body(P, ends, &n->body));
    TRY(expect_end(P, "endset"));
    *out = n;
    return NS_OK;
}

static ns_status parse_macro(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_MACRO, at);
    TRY(expect_name_tok(P, &n->name));
    TRY(parse_params(P, n));
    TRY(expect_block_end(P));
    static const char *const ends[] = {"endmacro", NULL};
    int saved = P->loop_depth;
    P->loop_depth = 0;
    TRY(parse_body(P, ends, &n->body));
    P->loop_depth = saved;
    TRY(expect_end(P, "endmacro"));
    *out = n;
    return NS_OK;
}

static ns_status parse_callblock(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_CALLBLOCK, at);
    if (is_op(P, NS_OP_LPAREN)) TRY(parse_params(P, n));
    const ns_ttok *ct = cur(P);
    TRY(parse_expression(P, 1, &n->a));
    if (n->a->kind != NS_N_CALL) return pfail(P, ct, "expected call");
    TRY(expect_block_end(P));
    static const char *const ends[] = {"endcall", NULL};
    int saved = P->loop_depth;
    P->loop_depth = 0;
    TRY(parse_body(P, ends, &n->body));
    P->loop_depth = saved;
    TRY(expect_end(P, "endcall"));
    *out = n;
    return NS_OK;
}

static ns_status parse_filterblock(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_FILTERBLOCK, at);
    TRY(parse_filter(P, NULL, 1, &n->a));
    TRY(expect_block_end(P));
    static const char *const ends[] = {"endfilter", NULL};
    TRY(parse_body(P, ends, &n->body));
    TRY(expect_end(P, "endfilter"));
    *out = n;
    return NS_OK;
}

static ns_status parse_with(parser *P, const ns_ttok *at, ns_tnode **out) {
    ns_tnode *n;
    NEW(n, NS_S_WITH, at);
    ns_tstr buf[32];
    nvec vals = {0};
    size_t k = 0;
    while (cur(P)->type != NS_TT_BLOCK_END) {
        if (k) TRY(expect_op(P, NS_OP_COMMA));
        if (k == 32) return pfail(P, cur(P), "too many with-assignments");
        TRY(expect_name_tok(P, &buf[k]));
        TRY(expect_op(P, NS_OP_ASSIGN));
        ns_tnode *v;
        TRY(parse_expression(P, 1, &v));
        TRY(nvec_push(P, &vals, v));
        k++;
    }
    TRY(expect_block_end(P));
    n->names = ns_tarena_alloc(P->a, (k ? k : 1) * sizeof *n->names);
    if (!n->names) return oom(P);
    memcpy(n->names, buf, k * sizeof *buf);
    n->n_names = k;
    n->items = nvec_done(&vals);
    static const char *const ends[] = {"endwith", NULL};
    TRY(parse_body(P, ends, &n->body));
    TRY(expect_end(P, "endwith"));
    *out = n;
    return NS_OK;
}

static ns_status parse_statement(parser *P, ns_tnode **out) {
    const ns_ttok *at = cur(P);
    if (at->type != NS_TT_NAME) return unexpected(P, "a tag name");
    TRY(enter(P));
    advance(P);
    ns_status st;
    if (tok_is_name(at, "for")) st = parse_for(P, at, out);
    else if (tok_is_name(at, "if")) st = parse_if(P, at, out);
    else if (tok_is_name(at, "set")) st = parse_set(P, at, out);
    else if (tok_is_name(at, "macro")) st = parse_macro(P, at, out);
    else if (tok_is_name(at, "call")) st = parse_callblock(P, at, out);
    else if (tok_is_name(at, "filter")) st = parse_filterblock(P, at, out);
    else if (tok_is_name(at, "with")) st = parse_with(P, at, out);
    else if (tok_is_name(at, "break") || tok_is_name(at, "continue")) {
        if (!P->loop_depth) return pfail(P, at, "'%.*s' outside of a loop", (int)at->n, at->p);
        ns_tnode *n;
        NEW(n, tok_is_name(at, "break") ? NS_S_BREAK : NS_S_CONTINUE, at);
        st = expect_block_end(P);
        *out = n;
    } else if (tok_is_name(at, "generation")) {
        ns_tnode *n;
        NEW(n, NS_S_BLOCK, at);
        static const char *const ends[] = {"endgeneration", NULL};
        st = expect_block_end(P);
        if (st == NS_OK) st = parse_body(P, ends, &n->body);
        if (st == NS_OK) st = expect_end(P, "endgeneration");
        *out = n;
    } else {
        return pfail(P, at, "Encountered unknown tag '%.*s'", (int)(at->n > 40 ? 40 : at->n), at->p);
    }
    P->depth--;
    return st;
}

static ns_status parse_body(parser *P, const char *const *ends, ns_tnodes *out) {
    nvec body = {0};
    for (;;) {
        const ns_ttok *t = cur(P);
        if (t->type == NS_TT_EOF) {
            if (ends) return pfail(P, t, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        ns_tnode *n = NULL;
        if (t->type == NS_TT_DATA) {
            NEW(n, NS_S_TEXT, t);
            n->name.p = t->p;
            n->name.n = t->n;
            advance(P);
        } else if (t->type == NS_TT_VAR_BEGIN) {
            NEW(n, NS_S_OUTPUT, t);
            advance(P);
            TRY(parse_tuple(P, 0, 1, NULL, 0, &n->a));
            if (cur(P)->type != NS_TT_VAR_END) return unexpected(P, "end of print statement");
            advance(P);
        } else if (t->type == NS_TT_BLOCK_BEGIN) {
            advance(P);
            if (ends)
                for (size_t k = 0; ends[k]; k++)
                    if (is_name(P, ends[k])) goto done;
            TRY(parse_statement(P, &n));
        } else {
            return unexpected(P, NULL);
        }
        TRY(nvec_push(P, &body, n));
    }
done:
    *out = nvec_done(&body);
    return NS_OK;
}

ns_status ns_tparse(ns_tarena *a, const ns_ttok *toks, size_t ntoks, ns_tnodes *out, ns_error *err) {
    parser P;
    memset(&P, 0, sizeof P);
    P.a = a;
    P.t = toks;
    P.n = ntoks;
    P.err = err;
    P.stack_floor = ns_tstack_floor();
    return parse_body(&P, NULL, out);
}
