#include "template/eval.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "template/filters.h"
#include "template/lexer.h"
#include "template/methods.h"
#include "template/ops.h"
#include "template/stackguard.h"

/* ---- errors, limits, small helpers ---------------------------------------------------- */

ns_status ns_trt_fail(ns_tctx *c, ns_status st, const char *fmt, ...) {
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ns_fail(c->err, st, "%s", msg);
}

ns_status ns_tundef_fail(ns_tctx *c, const ns_tv *u) {
    if (!u->u.s.n) return ns_trt_fail(c, NS_ERR_INVALID, "undefined value used");
    return ns_trt_fail(c, NS_ERR_INVALID, "%.*s", (int)(u->u.s.n > 400 ? 400 : u->u.s.n), u->u.s.p);
}

ns_status ns_twant_int(ns_tctx *c, const ns_tv *v, const char *what, int64_t *out) {
    if (v->kind == NS_TV_INT) *out = v->u.i;
    else if (v->kind == NS_TV_BOOL) *out = v->u.b;
    else if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
    else return ns_trt_fail(c, NS_ERR_INVALID, "%s must be an integer, not %s", what, ns_tv_type_name(v));
    return NS_OK;
}

ns_tv ns_tmk_undef(ns_tctx *c, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    char *p = ns_tarena_strndup(c->a, msg, (size_t)n);
    if (!p) return ns_tv_undef("undefined value used", 20);
    return ns_tv_undef(p, (size_t)n);
}

ns_status ns_tstep(ns_tctx *c, uint64_t n) {
    if (ns_tstack_exhausted(c->stack_floor))
        return ns_trt_fail(c, NS_ERR_RANGE, "template nested too deeply for the available stack");
    c->steps += n;
    if (c->steps > c->max_steps)
        return ns_trt_fail(c, NS_ERR_RANGE, "template exceeded its evaluation budget (%llu steps)",
                           (unsigned long long)c->max_steps);
    return NS_OK;
}

ns_status ns_toom(ns_tctx *c) { return ns_trt_fail(c, NS_ERR_NOMEM, "template memory limit exceeded"); }

const ns_tv *ns_targ_kw(const ns_tcallargs *a, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < a->nkw; i++)
        if (a->kw_names[i].n == n && memcmp(a->kw_names[i].p, name, n) == 0) return &a->kw[i];
    return NULL;
}

const ns_tv *ns_targ(const ns_tcallargs *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    return name ? ns_targ_kw(a, name) : NULL;
}

/* Prefixes the error with the node's position once (innermost node wins). */
static ns_status locate(ns_tctx *c, const ns_tnode *n, ns_status st) {
    if (st == NS_OK || c->located) return st;
    c->located = 1;
    if (c->err) {
        char msg[sizeof c->err->msg];
        memcpy(msg, c->err->msg, sizeof msg);
        msg[sizeof msg - 1] = 0;
        ns_fail(c->err, st, "template:%d:%d: %s", n->line, n->col, msg);
    }
    return st;
}

static ns_tframe *new_frame(ns_tctx *c, ns_tframe *parent) {
    ns_tframe *f = ns_tarena_alloc(c->a, sizeof *f);
    if (!f) return NULL;
    f->parent = parent;
    f->vars = ns_tdict_new(c->a, 4);
    return f->vars ? f : NULL;
}

static ns_status frame_set(ns_tctx *c, ns_tframe *f, const char *name, size_t n, ns_tv v) {
    return ns_tdict_set(c->a, f->vars, ns_tv_str(name, n), v, c->err);
}

static ns_status lookup(ns_tctx *c, const char *name, size_t n, ns_tv *out) {
    for (ns_tframe *f = c->frame; f; f = f->parent)
        if (ns_tdict_get_str(f->vars, name, n, out)) return NS_OK;
    if (c->context && ns_tdict_get_str(c->context, name, n, out)) return NS_OK;
    if (ns_tglobal_lookup(name, n, out)) return NS_OK;
    *out = ns_tmk_undef(c, "'%.*s' is undefined", (int)(n > 200 ? 200 : n), name);
    return NS_OK;
}

static ns_status emit_str(ns_tctx *c, const char *p, size_t n) {
    if (n > c->max_output || c->out->n > c->max_output - n)
        return ns_trt_fail(c, NS_ERR_NOMEM, "template output exceeds the %zu-byte limit", c->max_output);
    ns_tsb_put(c->out, p, n);
    return c->out->oom ? ns_toom(c) : NS_OK;
}

static ns_status emit_value(ns_tctx *c, const ns_tv *v) {
    if (v->kind == NS_TV_STR) return emit_str(c, v->u.s.p, v->u.s.n);
    if (v->kind == NS_TV_UNDEF) return NS_OK;
    ns_tv s;
    ns_status st = ns_tv_to_str(c->a, v, &s, c->err);
    if (st != NS_OK) return st;
    return emit_str(c, s.u.s.p, s.u.s.n);
}

/* Binds `value` to one or more target names (tuple unpacking). */
static ns_status assign(ns_tctx *c, ns_tframe *f, const ns_tstr *names, size_t k, const ns_tv *value) {
    if (k == 1) return frame_set(c, f, names[0].p, names[0].n, *value);
    if (value->kind == NS_TV_UNDEF) return ns_tundef_fail(c, value);
    const ns_tlist *items;
    ns_status st = ns_titer(c, value, &items);
    if (st != NS_OK) return st;
    if (items->n < k)
        return ns_trt_fail(c, NS_ERR_INVALID, "not enough values to unpack (expected %zu, got %zu)", k, items->n);
    if (items->n > k) return ns_trt_fail(c, NS_ERR_INVALID, "too many values to unpack (expected %zu)", k);
    for (size_t i = 0; i < k; i++)
        if ((st = frame_set(c, f, names[i].p, names[i].n, items->v[i])) != NS_OK) return st;
    return NS_OK;
}

/* ---- expressions ----------------------------------------------------------------------------- */

static ns_status eval_args(ns_tctx *c, const ns_targs *na, ns_tcallargs *out) {
    memset(out, 0, sizeof *out);
    size_t np = na->pos.n, nk = na->kw_vals.n;
    if (np) {
        out->pos = ns_tarena_alloc(c->a, np * sizeof(ns_tv));
        if (!out->pos) return ns_toom(c);
    }
    if (nk) {
        out->kw = ns_tarena_alloc(c->a, nk * sizeof(ns_tv));
        if (!out->kw) return ns_toom(c);
    }
    ns_status st;
    for (size_t i = 0; i < np; i++)
        if ((st = ns_teval(c, na->pos.v[i], &out->pos[i])) != NS_OK) return st;
    for (size_t i = 0; i < nk; i++)
        if ((st = ns_teval(c, na->kw_vals.v[i], &out->kw[i])) != NS_OK) return st;
    out->npos = np;
    out->nkw = nk;
    out->kw_names = na->kw_names;
    return NS_OK;
}

/* Applies a filter node; `base` replaces the missing operand of
 * {% filter %} and block-set filter chains. */
static ns_status eval_filter(ns_tctx *c, const ns_tnode *n, const ns_tv *base, ns_tv *out) {
    ns_tv v;
    ns_status st = NS_OK;
    if (!n->a) v = base ? *base : ns_tv_str("", 0);
    else if (n->a->kind == NS_N_FILTER && base) st = eval_filter(c, n->a, base, &v);
    else st = ns_teval(c, n->a, &v);
    if (st != NS_OK) return st;
    ns_tcallargs args;
    if ((st = eval_args(c, &n->args, &args)) != NS_OK) return st;
    st = ns_tfilter(c, n->name.p, n->name.n, &v, &args, out);
    return locate(c, n, st);
}

static ns_status call_macro(ns_tctx *c, const ns_tmacro *m, const ns_tcallargs *a, const ns_tv *caller, ns_tv *out);
static ns_status call_loop(ns_tctx *c, const ns_tloop *L, const ns_tcallargs *a, ns_tv *out);

ns_status ns_tcall_value(ns_tctx *c, const ns_tv *fn, const ns_tcallargs *args, ns_tv *out) {
    switch (fn->kind) {
    case NS_TV_FUNC: return ns_tglobal_call(c, fn->aux, args, out);
    case NS_TV_MACRO: return call_macro(c, fn->u.obj, args, NULL, out);
    case NS_TV_METHOD: return ns_tmethod_call(c, fn->u.obj, args, out);
    case NS_TV_JOINER: {
        ns_tjoiner *j = fn->u.obj;
        if (!j->used) {
            j->used = 1;
            *out = ns_tv_str("", 0);
        } else {
            *out = j->sep;
        }
        return NS_OK;
    }
    case NS_TV_LOOP: return call_loop(c, fn->u.obj, args, out);
    case NS_TV_UNDEF: return ns_tundef_fail(c, fn);
    default: return ns_trt_fail(c, NS_ERR_INVALID, "'%s' object is not callable", ns_tv_type_name(fn));
    }
}

/* A left-deep chain like  a + b + c ~ d  (+ and ~ only). Python builds
 * every intermediate string; while the running value is a plain string
 * the parts are kept aside instead and joined once, which keeps Python's
 * evaluation order and error behaviour but copies each byte once. With
 * `emit` set, a result that is still in parts goes straight to the output
 * (*emitted = 1) without being joined at all. */
#define CHAIN_MAX 16 /* longer chains nest: small frames matter more */
static ns_status eval_chain(ns_tctx *c, const ns_tnode *n, ns_tv *out, int emit, int *emitted) {
    const ns_tnode *chain[CHAIN_MAX];
    size_t k = 0;
    const ns_tnode *leaf = n;
    while (k < CHAIN_MAX && leaf->kind == NS_N_BINARY && (leaf->op == NS_OP_ADD || leaf->op == NS_OP_TILDE)) {
        chain[k++] = leaf;
        leaf = leaf->a;
    }
    ns_tv parts[CHAIN_MAX + 1];
    size_t np = 0, total = 0;
    int pend = 0; /* the running value is the concatenation of parts */
    ns_tv acc, r;
    ns_status st = ns_teval(c, leaf, &acc);
    if (st != NS_OK) return st;
    if (acc.kind == NS_TV_STR && !acc.safe) {
        parts[np++] = acc;
        total = acc.u.s.n;
        pend = 1;
    }
    for (size_t i = k; i-- > 0;) {
        const ns_tnode *node = chain[i];
        if ((st = ns_tstep(c, 1)) != NS_OK) return locate(c, node, st);
        if ((st = ns_teval(c, node->b, &r)) != NS_OK) return st;
        if (node->op == NS_OP_TILDE) {
            if (!pend) {
                if ((st = ns_tv_to_str(c->a, &acc, &acc, c->err)) != NS_OK) return locate(c, node, st);
                acc.safe = 0;
                parts[0] = acc;
                np = 1;
                total = acc.u.s.n;
                pend = 1;
            }
            if ((st = ns_tv_to_str(c->a, &r, &r, c->err)) != NS_OK) return locate(c, node, st);
            r.safe = 0;
        } else if (!pend || r.kind != NS_TV_STR || r.safe) {
            if (pend) {
                ns_tsb b;
                ns_tsb_init(&b, c->a);
                for (size_t j = 0; j < np; j++) ns_tsb_put(&b, parts[j].u.s.p, parts[j].u.s.n);
                if (np > 1 && (st = ns_tsb_finish(&b, &acc, c->err)) != NS_OK) return locate(c, node, st);
                if (np == 1) acc = parts[0];
            }
            if ((st = ns_tbinop(c, NS_OP_ADD, &acc, &r, &acc)) != NS_OK) return locate(c, node, st);
            pend = acc.kind == NS_TV_STR && !acc.safe;
            np = 0;
            total = 0;
            if (pend) {
                parts[np++] = acc;
                total = acc.u.s.n;
            }
            continue;
        }
        parts[np++] = r;
        total += r.u.s.n;
    }
    if (!pend) {
        *out = acc;
        return NS_OK;
    }
    if (emit) {
        for (size_t j = 0; j < np; j++)
            if ((st = emit_str(c, parts[j].u.s.p, parts[j].u.s.n)) != NS_OK) return st;
        *emitted = 1;
        return NS_OK;
    }
    if (np == 1) {
        *out = parts[0];
        return NS_OK;
    }
    char *p = ns_tarena_alloc_raw(c->a, total + 1);
    if (!p) return ns_toom(c);
    size_t o = 0;
    for (size_t j = 0; j < np; j++) {
        memcpy(p + o, parts[j].u.s.p, parts[j].u.s.n);
        o += parts[j].u.s.n;
    }
    p[o] = 0;
    *out = ns_tv_str(p, o);
    return NS_OK;
}

static ns_status eval_node(ns_tctx *c, const ns_tnode *n, ns_tv *out) {
    ns_status st = NS_OK;
    ns_tv l, r;
    switch (n->kind) {
    case NS_N_CONST: *out = n->value; return NS_OK;
    case NS_N_NAME: return lookup(c, n->name.p, n->name.n, out);
    case NS_N_LIST:
    case NS_N_TUPLE: {
        ns_tlist *list = ns_tlist_new(c->a, n->items.n, n->kind == NS_N_TUPLE);
        if (!list) return ns_toom(c);
        for (size_t i = 0; i < n->items.n; i++)
            if ((st = ns_teval(c, n->items.v[i], &list->v[i])) != NS_OK) return st;
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_LIST;
        out->u.l = list;
        return NS_OK;
    }
    case NS_N_DICT: {
        ns_tdict *d = ns_tdict_new(c->a, n->items.n / 2);
        if (!d) return ns_toom(c);
        for (size_t i = 0; i + 1 < n->items.n; i += 2) {
            if ((st = ns_teval(c, n->items.v[i], &l)) != NS_OK) return st;
            if ((st = ns_teval(c, n->items.v[i + 1], &r)) != NS_OK) return st;
            if ((st = ns_tdict_set(c->a, d, l, r, c->err)) != NS_OK) return st;
        }
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_DICT;
        out->u.d = d;
        return NS_OK;
    }
    case NS_N_GETATTR:
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        return ns_tgetattr(c, &l, n->name.p, n->name.n, out);
    case NS_N_GETITEM:
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if ((st = ns_teval(c, n->b, &r)) != NS_OK) return st;
        return ns_tgetitem(c, &l, &r, out);
    case NS_N_SLICE: {
        ns_tv parts[3];
        const ns_tnode *pn[3] = {n->b, n->c, n->d};
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        for (int i = 0; i < 3; i++)
            if (pn[i] && (st = ns_teval(c, pn[i], &parts[i])) != NS_OK) return st;
        return ns_tslice(c, &l, n->b ? &parts[0] : NULL, n->c ? &parts[1] : NULL, n->d ? &parts[2] : NULL, out);
    }
    case NS_N_CALL: {
        ns_tcallargs args;
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if ((st = eval_args(c, &n->args, &args)) != NS_OK) return st;
        return ns_tcall_value(c, &l, &args, out);
    }
    case NS_N_FILTER: return eval_filter(c, n, NULL, out);
    case NS_N_TEST: {
        ns_tcallargs args;
        int res;
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if ((st = eval_args(c, &n->args, &args)) != NS_OK) return st;
        if ((st = ns_ttest(c, n->name.p, n->name.n, &l, &args, &res)) != NS_OK) return st;
        *out = ns_tv_bool(res);
        return NS_OK;
    }
    case NS_N_UNARY:
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if (n->op == NS_U_NOT) {
            *out = ns_tv_bool(!ns_tv_truthy(&l));
            return NS_OK;
        }
        return ns_tunop(c, n->op, &l, out);
    case NS_N_BINARY:
        if (n->op == NS_OP_ADD || n->op == NS_OP_TILDE) {
            int emitted = 0;
            return eval_chain(c, n, out, 0, &emitted);
        }
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if (n->op == NS_B_AND || n->op == NS_B_OR) {
            int t = ns_tv_truthy(&l);
            if ((n->op == NS_B_AND) ? !t : t) {
                *out = l;
                return NS_OK;
            }
            return ns_teval(c, n->b, out);
        }
        if ((st = ns_teval(c, n->b, &r)) != NS_OK) return st;
        return ns_tbinop(c, n->op, &l, &r, out);
    case NS_N_COMPARE: {
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        for (size_t i = 0; i < n->items.n; i++) {
            int res;
            if ((st = ns_teval(c, n->items.v[i], &r)) != NS_OK) return st;
            if ((st = ns_tcompare(c, n->ops[i], &l, &r, &res)) != NS_OK) return st;
            if (!res) {
                *out = ns_tv_bool(0);
                return NS_OK;
            }
            l = r;
        }
        *out = ns_tv_bool(1);
        return NS_OK;
    }
    case NS_N_COND:
        if ((st = ns_teval(c, n->a, &l)) != NS_OK) return st;
        if (ns_tv_truthy(&l)) return ns_teval(c, n->b, out);
        if (n->c) return ns_teval(c, n->c, out);
        *out = ns_tmk_undef(c, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                            n->line);
        return NS_OK;
    default: return ns_trt_fail(c, NS_ERR_INTERNAL, "unexpected node in expression");
    }
}

ns_status ns_teval(ns_tctx *c, const ns_tnode *n, ns_tv *out) {
    ns_status st = ns_tstep(c, 1);
    if (st == NS_OK) st = eval_node(c, n, out);
    return locate(c, n, st);
}

/* ---- macros and capture ------------------------------------------------------------------------- */

/* Runs body with output redirected into a fresh string. */
static ns_status capture(ns_tctx *c, const ns_tnodes *body, ns_tv *out) {
    ns_tsb sb;
    ns_tsb_init(&sb, c->a);
    ns_tsb *saved = c->out;
    c->out = &sb;
    int flow = NS_FLOW_NORMAL;
    ns_status st = ns_texec_body(c, body, &flow);
    c->out = saved;
    if (st != NS_OK) return st;
    return ns_tsb_finish(&sb, out, c->err);
}

static ns_status call_macro(ns_tctx *c, const ns_tmacro *m, const ns_tcallargs *a, const ns_tv *caller, ns_tv *out) {
    const ns_tnode *node = m->node;
    if (c->depth >= c->max_depth)
        return ns_trt_fail(c, NS_ERR_RANGE, "maximum macro recursion depth (%d) exceeded", c->max_depth);
    ns_tframe *f = new_frame(c, m->frame);
    if (!f) return ns_toom(c);
    ns_tframe *saved_frame = c->frame;
    ns_status st = NS_OK;
    size_t np = node->n_names;
    ns_tvec varargs = {0};
    ns_tdict *kwargs = ns_tdict_new(c->a, 0);
    if (!kwargs) return ns_toom(c);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (node->names[i].n == a->kw_names[k].n && memcmp(node->names[i].p, a->kw_names[k].p, node->names[i].n) == 0)
                break;
        if (i < np && i < a->npos)
            return ns_trt_fail(c, NS_ERR_INVALID, "macro '%.*s' got multiple values for argument '%.*s'",
                               (int)node->name.n, node->name.p, (int)node->names[i].n, node->names[i].p);
        if (i == np &&
            (st = ns_tdict_set(c->a, kwargs, ns_tv_str(a->kw_names[k].p, a->kw_names[k].n), a->kw[k], c->err)) != NS_OK)
            return st;
    }
    c->frame = f; /* defaults see the parameters bound before them */
    for (size_t i = 0; i < np && st == NS_OK; i++) {
        ns_tv v;
        const ns_tv *kw = NULL;
        for (size_t k = 0; k < a->nkw && !kw; k++)
            if (node->names[i].n == a->kw_names[k].n && memcmp(node->names[i].p, a->kw_names[k].p, node->names[i].n) == 0)
                kw = &a->kw[k];
        if (i < a->npos) v = a->pos[i];
        else if (kw) v = *kw;
        else if (node->defaults.v[i]) st = ns_teval(c, node->defaults.v[i], &v);
        else v = ns_tmk_undef(c, "parameter '%.*s' was not provided", (int)node->names[i].n, node->names[i].p);
        if (st == NS_OK) st = frame_set(c, f, node->names[i].p, node->names[i].n, v);
    }
    for (size_t i = np; i < a->npos && st == NS_OK; i++) st = ns_tvec_push(c->a, &varargs, a->pos[i], c->err);
    ns_tv vv, kv = {0};
    kv.kind = NS_TV_DICT;
    kv.u.d = kwargs;
    if (st == NS_OK) st = ns_tvec_finish(c->a, &varargs, 1, &vv, c->err);
    if (st == NS_OK) st = frame_set(c, f, "varargs", 7, vv);
    if (st == NS_OK) st = frame_set(c, f, "kwargs", 6, kv);
    if (st == NS_OK && caller) st = frame_set(c, f, "caller", 6, *caller);
    if (st == NS_OK) {
        c->depth++;
        st = capture(c, &node->body, out);
        c->depth--;
    }
    c->frame = saved_frame;
    return st;
}

/* ---- statements ----------------------------------------------------------------------------------- */

/* Runs for-statement n over `iterable` in scope `outer`; depth0 > 0 when
 * re-entered through loop(...) of a recursive loop. */
static ns_status run_for(ns_tctx *c, const ns_tnode *n, const ns_tv *iterable, ns_tframe *outer, int depth0) {
    const ns_tlist *items;
    ns_status st = ns_titer(c, iterable, &items);
    if (st != NS_OK) return locate(c, n->a, st);
    ns_tframe *saved = c->frame;
    c->frame = outer;
    ns_tframe *f = new_frame(c, outer);
    if (!f) return ns_toom(c);
    if (n->b) {
        /* `for x in y if cond`: filter first so loop.length/index count kept items */
        ns_tvec kept = {0};
        for (size_t i = 0; i < items->n && st == NS_OK; i++) {
            f->vars->n = 0;
            f->vars->idx = NULL;
            c->frame = f;
            ns_tv cond;
            st = assign(c, f, n->names, n->n_names, &items->v[i]);
            if (st == NS_OK) st = ns_teval(c, n->b, &cond);
            if (st == NS_OK && ns_tv_truthy(&cond)) st = ns_tvec_push(c->a, &kept, items->v[i], c->err);
        }
        c->frame = outer;
        ns_tv kl;
        if (st == NS_OK) st = ns_tvec_finish(c->a, &kept, 0, &kl, c->err);
        if (st != NS_OK) {
            c->frame = saved;
            return st;
        }
        items = kl.u.l;
    }
    int flow = NS_FLOW_NORMAL;
    /* Jinja clears its "no iteration" flag at the end of the loop body, so
     * {% else %} also runs when every iteration ended in break/continue */
    int completed = 0;
    ns_tloop *L = ns_tarena_alloc(c->a, sizeof *L);
    if (!L) {
        c->frame = saved;
        return ns_toom(c);
    }
    L->items = items;
    L->node = n;
    L->outer = outer;
    L->depth0 = depth0;
    ns_tv loopv = {0};
    loopv.kind = NS_TV_LOOP;
    loopv.u.obj = L;
    for (size_t i = 0; i < items->n; i++) {
        if ((st = ns_tstep(c, 1)) != NS_OK) break;
        L->index0 = i;
        /* each iteration starts from a clean scope, as in Jinja */
        f->vars->n = 0;
        f->vars->idx = NULL;
        if ((st = assign(c, f, n->names, n->n_names, &items->v[i])) != NS_OK) break;
        if ((st = frame_set(c, f, "loop", 4, loopv)) != NS_OK) break;
        c->frame = f;
        flow = NS_FLOW_NORMAL;
        st = ns_texec_body(c, &n->body, &flow);
        c->frame = outer;
        if (st != NS_OK || flow == NS_FLOW_BREAK) break;
        if (flow == NS_FLOW_NORMAL) completed = 1;
    }
    if (st == NS_OK && !completed && n->else_body.n) {
        /* the loop variables are gone in the else block */
        f->vars->n = 0;
        f->vars->idx = NULL;
        c->frame = f;
        flow = NS_FLOW_NORMAL;
        st = ns_texec_body(c, &n->else_body, &flow);
    }
    c->frame = saved;
    return st;
}

static ns_status exec_for(ns_tctx *c, const ns_tnode *n) {
    ns_tv iterable;
    ns_status st = ns_teval(c, n->a, &iterable);
    if (st != NS_OK) return st;
    return run_for(c, n, &iterable, c->frame, 0);
}

/* loop(items) inside a recursive for: renders the loop body over items one
 * level deeper and returns the text. */
static ns_status call_loop(ns_tctx *c, const ns_tloop *L, const ns_tcallargs *a, ns_tv *out) {
    if (!L->node->flag)
        return ns_trt_fail(c, NS_ERR_INVALID, "The loop must have the 'recursive' marker to be called recursively.");
    if (a->npos != 1 || a->nkw) return ns_trt_fail(c, NS_ERR_INVALID, "loop() takes exactly one argument");
    if (c->depth >= c->max_depth)
        return ns_trt_fail(c, NS_ERR_RANGE, "maximum recursion depth (%d) exceeded", c->max_depth);
    ns_tsb sb;
    ns_tsb_init(&sb, c->a);
    ns_tsb *saved = c->out;
    c->out = &sb;
    c->depth++;
    ns_status st = run_for(c, L->node, &a->pos[0], L->outer, L->depth0 + 1);
    c->depth--;
    c->out = saved;
    if (st != NS_OK) return st;
    return ns_tsb_finish(&sb, out, c->err);
}

static ns_status exec_set(ns_tctx *c, const ns_tnode *n) {
    ns_tv v;
    ns_status st;
    if (n->flag) {
        if ((st = capture(c, &n->body, &v)) != NS_OK) return st;
        if (n->a && (st = eval_filter(c, n->a, &v, &v)) != NS_OK) return st;
    } else if ((st = ns_teval(c, n->a, &v)) != NS_OK) {
        return st;
    }
    if (n->b) {
        ns_tv target;
        if ((st = lookup(c, n->b->name.p, n->b->name.n, &target)) != NS_OK) return st;
        if (target.kind != NS_TV_NS)
            return ns_trt_fail(c, NS_ERR_INVALID, "cannot assign attribute on non-namespace object");
        return ns_tdict_set(c->a, target.u.d, ns_tv_str(n->name.p, n->name.n), v, c->err);
    }
    return assign(c, c->frame, n->names, n->n_names, &v);
}

static ns_status exec_stmt(ns_tctx *c, const ns_tnode *n, int *flow) {
    ns_status st = ns_tstep(c, 1);
    if (st != NS_OK) return locate(c, n, st);
    ns_tv v;
    switch (n->kind) {
    case NS_S_TEXT: st = emit_str(c, n->name.p, n->name.n); break;
    case NS_S_OUTPUT:
        if (n->a->kind == NS_N_BINARY && (n->a->op == NS_OP_ADD || n->a->op == NS_OP_TILDE)) {
            /* {{ a + b + c }}: write the pieces without joining them */
            int emitted = 0;
            st = ns_tstep(c, 1);
            if (st == NS_OK) st = locate(c, n->a, eval_chain(c, n->a, &v, 1, &emitted));
            if (st == NS_OK && !emitted) st = emit_value(c, &v);
            break;
        }
        st = ns_teval(c, n->a, &v);
        if (st == NS_OK) st = emit_value(c, &v);
        break;
    case NS_S_IF:
        st = ns_teval(c, n->a, &v);
        if (st == NS_OK) st = ns_texec_body(c, ns_tv_truthy(&v) ? &n->body : &n->else_body, flow);
        break;
    case NS_S_FOR: st = exec_for(c, n); break;
    case NS_S_SET: st = exec_set(c, n); break;
    case NS_S_MACRO: {
        ns_tmacro *m = ns_tarena_alloc(c->a, sizeof *m);
        if (!m) {
            st = ns_toom(c);
            break;
        }
        m->node = n;
        m->frame = c->frame;
        memset(&v, 0, sizeof v);
        v.kind = NS_TV_MACRO;
        v.u.obj = m;
        st = frame_set(c, c->frame, n->name.p, n->name.n, v);
        break;
    }
    case NS_S_CALLBLOCK: {
        const ns_tnode *call = n->a;
        ns_tv fn, res;
        ns_tcallargs args;
        st = ns_teval(c, call->a, &fn);
        if (st == NS_OK) st = eval_args(c, &call->args, &args);
        if (st != NS_OK) break;
        if (fn.kind != NS_TV_MACRO) {
            st = fn.kind == NS_TV_UNDEF ? ns_tundef_fail(c, &fn)
                                        : ns_trt_fail(c, NS_ERR_INVALID, "{%% call %%} needs a macro");
            break;
        }
        ns_tmacro *cm = ns_tarena_alloc(c->a, sizeof *cm);
        if (!cm) {
            st = ns_toom(c);
            break;
        }
        cm->node = n;
        cm->frame = c->frame;
        ns_tv callerv = {0};
        callerv.kind = NS_TV_MACRO;
        callerv.u.obj = cm;
        st = call_macro(c, fn.u.obj, &args, &callerv, &res);
        if (st == NS_OK) st = emit_value(c, &res);
        break;
    }
    case NS_S_FILTERBLOCK:
        st = capture(c, &n->body, &v);
        if (st == NS_OK) st = eval_filter(c, n->a, &v, &v);
        if (st == NS_OK) st = emit_value(c, &v);
        break;
    case NS_S_WITH: {
        ns_tframe *f = new_frame(c, c->frame);
        if (!f) {
            st = ns_toom(c);
            break;
        }
        for (size_t i = 0; i < n->n_names && st == NS_OK; i++) {
            st = ns_teval(c, n->items.v[i], &v);
            if (st == NS_OK) st = frame_set(c, f, n->names[i].p, n->names[i].n, v);
        }
        if (st != NS_OK) break;
        ns_tframe *saved = c->frame;
        c->frame = f;
        st = ns_texec_body(c, &n->body, flow);
        c->frame = saved;
        break;
    }
    case NS_S_BREAK: *flow = NS_FLOW_BREAK; break;
    case NS_S_CONTINUE: *flow = NS_FLOW_CONTINUE; break;
    case NS_S_BLOCK: st = ns_texec_body(c, &n->body, flow); break;
    default: st = ns_trt_fail(c, NS_ERR_INTERNAL, "unexpected node in statement list"); break;
    }
    return locate(c, n, st);
}

ns_status ns_texec_body(ns_tctx *c, const ns_tnodes *body, int *flow) {
    for (size_t i = 0; i < body->n; i++) {
        ns_status st = exec_stmt(c, body->v[i], flow);
        if (st != NS_OK) return st;
        if (*flow != NS_FLOW_NORMAL) return NS_OK;
    }
    return NS_OK;
}
