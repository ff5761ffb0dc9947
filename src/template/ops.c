#include "template/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "template/lexer.h"
#include "template/methods.h"
#include "util/utf8.h"

static const char *op_sym(int op) {
    switch (op) {
    case NS_OP_ADD: return "+";
    case NS_OP_SUB: return "-";
    case NS_OP_MUL: return "*";
    case NS_OP_DIV: return "/";
    case NS_OP_FLOORDIV: return "//";
    case NS_OP_MOD: return "%";
    case NS_OP_POW: return "** or pow()";
    default: return "?";
    }
}

static ns_status type_error(ns_tctx *c, int op, const ns_tv *l, const ns_tv *r) {
    if (l->kind == NS_TV_UNDEF) return ns_tundef_fail(c, l);
    if (r->kind == NS_TV_UNDEF) return ns_tundef_fail(c, r);
    return ns_trt_fail(c, NS_ERR_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                       ns_tv_type_name(l), ns_tv_type_name(r));
}

static int64_t as_int(const ns_tv *v) { return v->kind == NS_TV_INT ? v->u.i : v->u.b; }
static int is_intlike(const ns_tv *v) { return v->kind == NS_TV_INT || v->kind == NS_TV_BOOL; }

static ns_status concat_str(ns_tctx *c, const ns_tv *l, const ns_tv *r, ns_tv *out) {
    ns_tv a = *l, b = *r;
    int safe = l->safe || r->safe;
    /* Markup + str escapes the plain side (markupsafe semantics) */
    if (safe && !a.safe) {
        ns_status st = ns_tescape(c, &a, &a);
        if (st != NS_OK) return st;
    }
    if (safe && !b.safe) {
        ns_status st = ns_tescape(c, &b, &b);
        if (st != NS_OK) return st;
    }
    if (a.u.s.n == 0) {
        *out = b;
    } else if (b.u.s.n == 0) {
        *out = a;
    } else {
        char *p = ns_tarena_alloc_raw(c->a, a.u.s.n + b.u.s.n + 1);
        if (!p) return ns_toom(c);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        p[a.u.s.n + b.u.s.n] = 0;
        *out = ns_tv_str(p, a.u.s.n + b.u.s.n);
    }
    out->safe = (uint8_t)safe;
    return NS_OK;
}

static ns_status repeat(ns_tctx *c, const ns_tv *seq, int64_t times, ns_tv *out) {
    if (times < 0) times = 0;
    if (seq->kind == NS_TV_STR) {
        size_t n = seq->u.s.n;
        if (n && (uint64_t)times > (((size_t)1 << 40) / n)) return ns_toom(c);
        char *p = ns_tarena_alloc_raw(c->a, n * (size_t)times + 1);
        if (!p) return ns_toom(c);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * n, seq->u.s.p, n);
        p[n * (size_t)times] = 0;
        *out = ns_tv_str(p, n * (size_t)times);
        return NS_OK;
    }
    const ns_tlist *l = seq->u.l;
    if (l->n && (uint64_t)times > (((size_t)1 << 32) / l->n)) return ns_toom(c);
    ns_status st = ns_tstep(c, l->n * (uint64_t)times);
    if (st != NS_OK) return st;
    ns_tlist *r = ns_tlist_new(c->a, l->n * (size_t)times, l->tuple);
    if (!r) return ns_toom(c);
    for (int64_t i = 0; i < times; i++) memcpy(r->v + (size_t)i * l->n, l->v, l->n * sizeof(ns_tv));
    memset(out, 0, sizeof *out);
    out->kind = NS_TV_LIST;
    out->u.l = r;
    return NS_OK;
}

ns_status ns_tbinop(ns_tctx *c, int op, const ns_tv *l, const ns_tv *r, ns_tv *out) {
    if (op == NS_OP_TILDE) {
        ns_tv a, b;
        ns_status st = ns_tv_to_str(c->a, l, &a, c->err);
        if (st == NS_OK) st = ns_tv_to_str(c->a, r, &b, c->err);
        if (st != NS_OK) return st;
        a.safe = b.safe = 0;
        return concat_str(c, &a, &b, out);
    }
    if (op == NS_OP_MOD && l->kind == NS_TV_STR) return ns_tpercent_format(c, l, r, out);
    if (ns_tv_is_num(l) && ns_tv_is_num(r)) {
        if (is_intlike(l) && is_intlike(r) && op != NS_OP_DIV) {
            int64_t x = as_int(l), y = as_int(r), z = 0;
            switch (op) {
            case NS_OP_ADD:
                if (__builtin_add_overflow(x, y, &z)) goto overflow;
                break;
            case NS_OP_SUB:
                if (__builtin_sub_overflow(x, y, &z)) goto overflow;
                break;
            case NS_OP_MUL:
                if (__builtin_mul_overflow(x, y, &z)) goto overflow;
                break;
            case NS_OP_FLOORDIV:
            case NS_OP_MOD:
                if (y == 0) return ns_trt_fail(c, NS_ERR_INVALID, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                if (op == NS_OP_FLOORDIV) {
                    z = x / y;
                    if ((x % y != 0) && ((x < 0) != (y < 0))) z--;
                } else {
                    z = x % y;
                    if (z != 0 && ((z < 0) != (y < 0))) z += y;
                }
                break;
            case NS_OP_POW:
                if (y < 0) {
                    if (x == 0) return ns_trt_fail(c, NS_ERR_INVALID, "0.0 cannot be raised to a negative power");
                    *out = ns_tv_float(pow((double)x, (double)y));
                    return NS_OK;
                }
                z = 1;
                for (int64_t base = x, e = y; e > 0; e >>= 1) {
                    if (e & 1)
                        if (__builtin_mul_overflow(z, base, &z)) goto overflow;
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                break;
            default: return type_error(c, op, l, r);
            }
            *out = ns_tv_int(z);
            return NS_OK;
        overflow:
            return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
        }
        double x = ns_tv_num(l), y = ns_tv_num(r), z;
        switch (op) {
        case NS_OP_ADD: z = x + y; break;
        case NS_OP_SUB: z = x - y; break;
        case NS_OP_MUL: z = x * y; break;
        case NS_OP_DIV:
            if (y == 0) return ns_trt_fail(c, NS_ERR_INVALID, "division by zero");
            z = x / y;
            break;
        case NS_OP_FLOORDIV:
        case NS_OP_MOD: {
            if (y == 0) return ns_trt_fail(c, NS_ERR_INVALID, "float modulo or division by zero");
            /* CPython's float_divmod */
            double mod = fmod(x, y), div = (x - mod) / y, fl;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) {
                    mod += y;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, y);
            }
            if (div != 0) {
                fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
            } else {
                fl = copysign(0.0, x / y);
            }
            z = op == NS_OP_MOD ? mod : fl;
            break;
        }
        case NS_OP_POW:
            if (x == 0 && y < 0) return ns_trt_fail(c, NS_ERR_INVALID, "0.0 cannot be raised to a negative power");
            z = pow(x, y);
            break;
        default: return type_error(c, op, l, r);
        }
        *out = ns_tv_float(z);
        return NS_OK;
    }
    if (op == NS_OP_ADD) {
        if (l->kind == NS_TV_STR && r->kind == NS_TV_STR) return concat_str(c, l, r, out);
        if (l->kind == NS_TV_LIST && r->kind == NS_TV_LIST && l->u.l->tuple == r->u.l->tuple) {
            const ns_tlist *x = l->u.l, *y = r->u.l;
            ns_tlist *z = ns_tlist_new(c->a, x->n + y->n, x->tuple);
            if (!z) return ns_toom(c);
            memcpy(z->v, x->v, x->n * sizeof(ns_tv));
            memcpy(z->v + x->n, y->v, y->n * sizeof(ns_tv));
            memset(out, 0, sizeof *out);
            out->kind = NS_TV_LIST;
            out->u.l = z;
            return NS_OK;
        }
    }
    if (op == NS_OP_MUL) {
        if ((l->kind == NS_TV_STR || l->kind == NS_TV_LIST) && is_intlike(r)) return repeat(c, l, as_int(r), out);
        if ((r->kind == NS_TV_STR || r->kind == NS_TV_LIST) && is_intlike(l)) return repeat(c, r, as_int(l), out);
    }
    return type_error(c, op, l, r);
}

ns_status ns_tunop(ns_tctx *c, int op, const ns_tv *v, ns_tv *out) {
    if (v->kind == NS_TV_UNDEF) return ns_tundef_fail(c, v);
    if (v->kind == NS_TV_FLOAT) {
        *out = ns_tv_float(op == NS_U_NEG ? -v->u.f : v->u.f);
        return NS_OK;
    }
    if (is_intlike(v)) {
        int64_t x = as_int(v);
        if (op == NS_U_NEG && x == INT64_MIN) return ns_trt_fail(c, NS_ERR_INVALID, "integer overflow");
        *out = ns_tv_int(op == NS_U_NEG ? -x : x);
        return NS_OK;
    }
    return ns_trt_fail(c, NS_ERR_INVALID, "bad operand type for unary %s: '%s'", op == NS_U_NEG ? "-" : "+",
                       ns_tv_type_name(v));
}

ns_status ns_tcontains(ns_tctx *c, const ns_tv *container, const ns_tv *item, int *res) {
    *res = 0;
    switch (container->kind) {
    case NS_TV_UNDEF: return NS_OK;
    case NS_TV_STR:
        if (item->kind != NS_TV_STR) {
            if (item->kind == NS_TV_UNDEF) return ns_tundef_fail(c, item);
            return ns_trt_fail(c, NS_ERR_INVALID, "'in <string>' requires string as left operand, not %s",
                               ns_tv_type_name(item));
        }
        *res = item->u.s.n == 0 ||
               memmem(container->u.s.p, container->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return NS_OK;
    case NS_TV_LIST: {
        const ns_tlist *l = container->u.l;
        ns_status st = ns_tstep(c, l->n);
        if (st != NS_OK) return st;
        for (size_t i = 0; i < l->n; i++)
            if (ns_tv_eq(&l->v[i], item)) {
                *res = 1;
                break;
            }
        return NS_OK;
    }
    case NS_TV_DICT:
        if (!ns_tv_hashable(item))
            return ns_trt_fail(c, NS_ERR_INVALID, "unhashable type: '%s'", ns_tv_type_name(item));
        *res = ns_tdict_get(container->u.d, item, NULL);
        return NS_OK;
    default:
        return ns_trt_fail(c, NS_ERR_INVALID, "argument of type '%s' is not iterable", ns_tv_type_name(container));
    }
}

ns_status ns_tcompare(ns_tctx *c, int op, const ns_tv *l, const ns_tv *r, int *res) {
    switch (op) {
    case NS_OP_EQ: *res = ns_tv_eq(l, r); return NS_OK;
    case NS_OP_NE: *res = !ns_tv_eq(l, r); return NS_OK;
    case NS_C_IN: return ns_tcontains(c, r, l, res);
    case NS_C_NOTIN: {
        ns_status st = ns_tcontains(c, r, l, res);
        *res = !*res;
        return st;
    }
    default: break;
    }
    if (l->kind == NS_TV_UNDEF) return ns_tundef_fail(c, l);
    if (r->kind == NS_TV_UNDEF) return ns_tundef_fail(c, r);
    int cmp;
    ns_status st = ns_tv_cmp(l, r, &cmp, c->err);
    if (st != NS_OK) {
        static const char *const sym[] = {[NS_OP_LT] = "<", [NS_OP_LE] = "<=", [NS_OP_GT] = ">", [NS_OP_GE] = ">="};
        if (st == NS_ERR_INVALID && op >= NS_OP_GT && op <= NS_OP_LE)
            return ns_trt_fail(c, st, "'%s' not supported between instances of '%s' and '%s'", sym[op],
                               ns_tv_type_name(l), ns_tv_type_name(r));
        return st;
    }
    if (l->kind == NS_TV_FLOAT || r->kind == NS_TV_FLOAT) {
        double x = ns_tv_num(l), y = ns_tv_num(r);
        if (ns_tv_is_num(l) && ns_tv_is_num(r) && (isnan(x) || isnan(y))) {
            *res = 0; /* every ordering with NaN is false */
            return NS_OK;
        }
    }
    switch (op) {
    case NS_OP_LT: *res = cmp < 0; break;
    case NS_OP_LE: *res = cmp <= 0; break;
    case NS_OP_GT: *res = cmp > 0; break;
    case NS_OP_GE: *res = cmp >= 0; break;
    default: *res = 0; break;
    }
    return NS_OK;
}

/* ---- attribute and item access ---------------------------------------------- */

static const char *obj_repr(const ns_tv *v) {
    /* Jinja's object_type_repr: "dict object", "None", ... */
    switch (v->kind) {
    case NS_TV_NONE: return "None";
    case NS_TV_DICT: return "dict object";
    case NS_TV_LIST: return v->u.l->tuple ? "tuple object" : "list object";
    case NS_TV_STR: return "str object";
    case NS_TV_INT: return "int object";
    case NS_TV_FLOAT: return "float object";
    case NS_TV_BOOL: return "bool object";
    case NS_TV_NS: return "jinja2.utils.Namespace object";
    case NS_TV_LOOP: return "jinja2.runtime.LoopContext object";
    default: return "object";
    }
}

static ns_tv undef_attr(ns_tctx *c, const ns_tv *obj, const char *name, size_t n) {
    if (obj->kind == NS_TV_NONE)
        return ns_tmk_undef(c, "'None' has no attribute '%.*s'", (int)(n > 200 ? 200 : n), name);
    return ns_tmk_undef(c, "'%s' has no attribute '%.*s'", obj_repr(obj), (int)(n > 200 ? 200 : n), name);
}

static ns_status make_method(ns_tctx *c, const ns_tv *obj, const char *name, size_t n, ns_tv *out) {
    int kind = ns_tmethod_kind(obj, name, n);
    if (kind == NS_TMETHOD_UNSAFE) {
        *out = ns_tmk_undef(c, "access to attribute '%.*s' of '%s' object is unsafe.", (int)n, name,
                            ns_tv_type_name(obj));
        return NS_OK;
    }
    ns_tmethod *m = ns_tarena_alloc(c->a, sizeof *m);
    if (!m) return ns_toom(c);
    m->self = *obj;
    m->name = name;
    m->name_n = n;
    memset(out, 0, sizeof *out);
    out->kind = NS_TV_METHOD;
    out->u.obj = m;
    return NS_OK;
}

static int str_eq(const char *a, size_t n, const char *lit) { return strlen(lit) == n && memcmp(a, lit, n) == 0; }

static ns_status loop_attr(ns_tctx *c, const ns_tv *obj, const char *name, size_t n, ns_tv *out) {
    const ns_tloop *L = obj->u.obj;
    size_t len = L->items->n, i = L->index0;
    if (str_eq(name, n, "index")) *out = ns_tv_int((int64_t)i + 1);
    else if (str_eq(name, n, "index0")) *out = ns_tv_int((int64_t)i);
    else if (str_eq(name, n, "revindex")) *out = ns_tv_int((int64_t)(len - i));
    else if (str_eq(name, n, "revindex0")) *out = ns_tv_int((int64_t)(len - i - 1));
    else if (str_eq(name, n, "first")) *out = ns_tv_bool(i == 0);
    else if (str_eq(name, n, "last")) *out = ns_tv_bool(i + 1 == len);
    else if (str_eq(name, n, "length")) *out = ns_tv_int((int64_t)len);
    else if (str_eq(name, n, "depth")) *out = ns_tv_int(L->depth0 + 1);
    else if (str_eq(name, n, "depth0")) *out = ns_tv_int(L->depth0);
    else if (str_eq(name, n, "previtem"))
        *out = i > 0 ? L->items->v[i - 1] : ns_tmk_undef(c, "there is no previous item");
    else if (str_eq(name, n, "nextitem"))
        *out = i + 1 < len ? L->items->v[i + 1] : ns_tmk_undef(c, "there is no next item");
    else if (str_eq(name, n, "cycle") || str_eq(name, n, "changed")) return make_method(c, obj, name, n, out);
    else *out = undef_attr(c, obj, name, n);
    return NS_OK;
}

ns_status ns_tgetattr(ns_tctx *c, const ns_tv *obj, const char *name, size_t n, ns_tv *out) {
    switch (obj->kind) {
    case NS_TV_UNDEF: return ns_tundef_fail(c, obj);
    case NS_TV_NS:
        if (!ns_tdict_get_str(obj->u.d, name, n, out)) *out = undef_attr(c, obj, name, n);
        return NS_OK;
    case NS_TV_LOOP: return loop_attr(c, obj, name, n, out);
    case NS_TV_CYCLER:
        if (str_eq(name, n, "current")) {
            const ns_tcycler *cy = obj->u.obj;
            *out = cy->items->v[cy->pos];
            return NS_OK;
        }
        break;
    default: break;
    }
    if (ns_tmethod_kind(obj, name, n) != NS_TMETHOD_NONE) return make_method(c, obj, name, n, out);
    if (obj->kind == NS_TV_DICT && ns_tdict_get_str(obj->u.d, name, n, out)) return NS_OK;
    *out = undef_attr(c, obj, name, n);
    return NS_OK;
}

static ns_status index_of(const ns_tv *key, int64_t len, int64_t *idx) {
    int64_t i = key->kind == NS_TV_INT ? key->u.i : key->u.b;
    if (i < 0) i += len;
    *idx = i;
    return (i >= 0 && i < len) ? NS_OK : NS_ERR_RANGE;
}

ns_status ns_tgetitem(ns_tctx *c, const ns_tv *obj, const ns_tv *key, ns_tv *out) {
    if (obj->kind == NS_TV_UNDEF) return ns_tundef_fail(c, obj);
    int intkey = key->kind == NS_TV_INT || key->kind == NS_TV_BOOL;
    switch (obj->kind) {
    case NS_TV_DICT:
        if (ns_tdict_get(obj->u.d, key, out)) return NS_OK;
        break;
    case NS_TV_LIST:
        if (intkey) {
            int64_t i;
            if (index_of(key, (int64_t)obj->u.l->n, &i) == NS_OK) {
                *out = obj->u.l->v[i];
                return NS_OK;
            }
            *out = ns_tmk_undef(c, "%s has no element %lld", obj_repr(obj), (long long)as_int(key));
            return NS_OK;
        }
        break;
    case NS_TV_STR:
        if (intkey) {
            int64_t len = ns_tv_len(obj), i;
            if (index_of(key, len, &i) == NS_OK) {
                size_t a = ns_utf8_offset(obj->u.s.p, obj->u.s.n, (size_t)i);
                size_t b = a;
                ns_utf8_next(obj->u.s.p, obj->u.s.n, &b);
                *out = ns_tv_str(obj->u.s.p + a, b - a);
                return NS_OK;
            }
            *out = ns_tmk_undef(c, "%s has no element %lld", obj_repr(obj), (long long)as_int(key));
            return NS_OK;
        }
        break;
    default: break;
    }
    if (key->kind == NS_TV_STR) {
        if (obj->kind == NS_TV_DICT) {
            if (ns_tmethod_kind(obj, key->u.s.p, key->u.s.n) != NS_TMETHOD_NONE)
                return make_method(c, obj, key->u.s.p, key->u.s.n, out);
            *out = undef_attr(c, obj, key->u.s.p, key->u.s.n);
            return NS_OK;
        }
        return ns_tgetattr(c, obj, key->u.s.p, key->u.s.n, out);
    }
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    ns_tv_repr_append(&b, key);
    ns_tv ks;
    if (ns_tsb_finish(&b, &ks, c->err) != NS_OK) return ns_toom(c);
    *out = ns_tmk_undef(c, "%s has no element %.*s", obj_repr(obj), (int)(ks.u.s.n > 200 ? 200 : ks.u.s.n), ks.u.s.p);
    return NS_OK;
}

ns_status ns_tgetattr_path(ns_tctx *c, const ns_tv *obj, const ns_tv *path, ns_tv *out) {
    if (path->kind != NS_TV_STR) return ns_tgetitem(c, obj, path, out);
    ns_tv cur = *obj;
    const char *p = path->u.s.p, *end = p + path->u.s.n;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *seg_end = dot ? dot : end;
        size_t n = (size_t)(seg_end - p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++)
            if (p[i] < '0' || p[i] > '9') digits = 0;
        ns_tv key;
        if (digits && n < 18) {
            int64_t v = 0;
            for (size_t i = 0; i < n; i++) v = v * 10 + (p[i] - '0');
            key = ns_tv_int(v);
        } else {
            key = ns_tv_str(p, n);
        }
        ns_status st = ns_tgetitem(c, &cur, &key, &cur);
        if (st != NS_OK) return st;
        if (!dot) break;
        p = dot + 1;
    }
    *out = cur;
    return NS_OK;
}

/* ---- slicing ------------------------------------------------------------------ */

static int slice_index(const ns_tv *v, int64_t *out) {
    if (!v || v->kind == NS_TV_NONE) return 0;
    *out = as_int(v);
    return 1;
}

ns_status ns_tslice(ns_tctx *c, const ns_tv *obj, const ns_tv *start, const ns_tv *stop, const ns_tv *step,
                    ns_tv *out) {
    if (obj->kind == NS_TV_UNDEF) return ns_tundef_fail(c, obj);
    /* Jinja compiles slices to a plain Python subscript (no sandbox
     * getitem fallback), so every misuse is an error, not an Undefined */
    const ns_tv *parts[3] = {start, stop, step};
    for (int i = 0; i < 3; i++)
        if (parts[i] && parts[i]->kind != NS_TV_NONE && !is_intlike(parts[i])) {
            if (parts[i]->kind == NS_TV_UNDEF) return ns_tundef_fail(c, parts[i]);
            return ns_trt_fail(c, NS_ERR_INVALID, "slice indices must be integers or None or have an __index__ method");
        }
    if (obj->kind == NS_TV_DICT) return ns_trt_fail(c, NS_ERR_INVALID, "unhashable type: 'slice'");
    if (obj->kind != NS_TV_LIST && obj->kind != NS_TV_STR)
        return ns_trt_fail(c, NS_ERR_INVALID, "'%s' object is not subscriptable", ns_tv_type_name(obj));
    int64_t st_v = 1;
    slice_index(step, &st_v);
    if (st_v == 0) return ns_trt_fail(c, NS_ERR_INVALID, "slice step cannot be zero");
    int ascii = 1;
    int64_t len;
    if (obj->kind == NS_TV_LIST) {
        len = (int64_t)obj->u.l->n;
    } else {
        len = ns_tv_len(obj);
        ascii = (size_t)len == obj->u.s.n;
    }
    int64_t lo, hi;
    int has_lo = slice_index(start, &lo), has_hi = slice_index(stop, &hi);
    if (!has_lo) lo = st_v < 0 ? len - 1 : 0;
    else {
        if (lo < 0) {
            lo += len;
            if (lo < 0) lo = st_v < 0 ? -1 : 0;
        } else if (lo >= len) lo = st_v < 0 ? len - 1 : len;
    }
    if (!has_hi) hi = st_v < 0 ? -1 : len;
    else {
        if (hi < 0) {
            hi += len;
            if (hi < 0) hi = st_v < 0 ? -1 : 0;
        } else if (hi >= len) hi = st_v < 0 ? len - 1 : len;
    }
    int64_t count = 0;
    if (st_v > 0 && hi > lo) count = (hi - lo - 1) / st_v + 1;
    if (st_v < 0 && lo > hi) count = (lo - hi - 1) / (-st_v) + 1;
    ns_status s = ns_tstep(c, (uint64_t)count);
    if (s != NS_OK) return s;
    if (obj->kind == NS_TV_LIST) {
        ns_tlist *r = ns_tlist_new(c->a, (size_t)count, obj->u.l->tuple);
        if (!r) return ns_toom(c);
        for (int64_t k = 0; k < count; k++) r->v[k] = obj->u.l->v[lo + k * st_v];
        memset(out, 0, sizeof *out);
        out->kind = NS_TV_LIST;
        out->u.l = r;
        return NS_OK;
    }
    const char *p = obj->u.s.p;
    size_t n = obj->u.s.n;
    if (st_v == 1) {
        size_t a = ascii ? (size_t)lo : ns_utf8_offset(p, n, (size_t)lo);
        size_t b = ascii ? (size_t)(lo + count) : ns_utf8_offset(p, n, (size_t)(lo + count));
        *out = ns_tv_str(p + a, b - a);
        return NS_OK;
    }
    /* general step: map code point index -> byte offset once */
    size_t *offs = NULL;
    if (!ascii) {
        offs = ns_tarena_alloc(c->a, ((size_t)len + 1) * sizeof *offs);
        if (!offs) return ns_toom(c);
        size_t i = 0, k = 0;
        while (i < n) {
            offs[k++] = i;
            ns_utf8_next(p, n, &i);
        }
        offs[k] = n;
    }
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    for (int64_t k = 0; k < count; k++) {
        int64_t idx = lo + k * st_v;
        if (ascii) ns_tsb_putc(&b, p[idx]);
        else ns_tsb_put(&b, p + offs[idx], offs[idx + 1] - offs[idx]);
    }
    return ns_tsb_finish(&b, out, c->err);
}

/* ---- iteration and escaping --------------------------------------------------------- */

ns_status ns_titer(ns_tctx *c, const ns_tv *v, const ns_tlist **out) {
    static const ns_tlist empty = {0, 0, NULL};
    switch (v->kind) {
    case NS_TV_UNDEF: *out = &empty; return NS_OK;
    case NS_TV_LIST: *out = v->u.l; return NS_OK;
    case NS_TV_DICT: {
        ns_tlist *l = ns_tlist_new(c->a, v->u.d->n, 0);
        if (!l) return ns_toom(c);
        memcpy(l->v, v->u.d->keys, v->u.d->n * sizeof(ns_tv));
        *out = l;
        return NS_OK;
    }
    case NS_TV_STR: {
        size_t len = (size_t)ns_tv_len(v);
        ns_tlist *l = ns_tlist_new(c->a, len, 0);
        if (!l) return ns_toom(c);
        size_t i = 0, k = 0;
        while (i < v->u.s.n) {
            size_t s = i;
            ns_utf8_next(v->u.s.p, v->u.s.n, &i);
            l->v[k++] = ns_tv_str(v->u.s.p + s, i - s);
        }
        *out = l;
        return NS_OK;
    }
    default:
        return ns_trt_fail(c, NS_ERR_INVALID, "'%s' object is not iterable", ns_tv_type_name(v));
    }
}

ns_status ns_tescape(ns_tctx *c, const ns_tv *v, ns_tv *out) {
    if (v->kind == NS_TV_STR && v->safe) {
        *out = *v;
        return NS_OK;
    }
    ns_tv s;
    ns_status st = ns_tv_to_str(c->a, v, &s, c->err);
    if (st != NS_OK) return st;
    ns_tsb b;
    ns_tsb_init(&b, c->a);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        switch (ch) {
        case '&': ns_tsb_puts(&b, "&amp;"); break;
        case '<': ns_tsb_puts(&b, "&lt;"); break;
        case '>': ns_tsb_puts(&b, "&gt;"); break;
        case '"': ns_tsb_puts(&b, "&#34;"); break;
        case '\'': ns_tsb_puts(&b, "&#39;"); break;
        default: ns_tsb_putc(&b, ch); break;
        }
    }
    st = ns_tsb_finish(&b, out, c->err);
    out->safe = 1;
    return st;
}
