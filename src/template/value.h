/* value.h — the template engine's value model (Python/Jinja2 semantics).
 *
 * A value is a small tagged struct passed by copy. Strings are immutable
 * (pointer, length) UTF-8 ranges that may point into the borrowed JSON
 * context, the template's AST or the render arena; lists, tuples and dicts
 * live in the render arena and are never mutated once built, except a
 * namespace's dict (the one mutable object Jinja allows). Nothing is freed
 * individually: every allocation belongs to an ns_tarena.
 *
 * Semantics follow Python as Jinja2 exposes it: truthiness, == across
 * int/float/bool, str() and repr() text (including float repr such as
 * 1e+16 and 0.1), dict insertion order, and Jinja's Undefined (prints as
 * "", is falsy, equals only another Undefined). Recursive walks (repr,
 * equality) stop at NS_TV_MAX_DEPTH so a self-nesting namespace cannot
 * blow the C stack.
 */
#ifndef NS_TEMPLATE_VALUE_H
#define NS_TEMPLATE_VALUE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "template/arena.h"
#include "util/status.h"

#define NS_TV_MAX_DEPTH 200

typedef enum {
    NS_TV_UNDEF = 0, /* u.s holds the message an error on use reports */
    NS_TV_NONE,
    NS_TV_BOOL,
    NS_TV_INT,
    NS_TV_FLOAT,
    NS_TV_STR,
    NS_TV_LIST,  /* list or tuple (u.l->tuple) */
    NS_TV_DICT,
    NS_TV_NS,    /* namespace(): a mutable dict reached by attribute */
    NS_TV_MACRO, /* u.obj: interpreter-owned objects from here on */
    NS_TV_FUNC,  /* builtin global function, id in aux */
    NS_TV_METHOD,
    NS_TV_LOOP,
    NS_TV_CYCLER,
    NS_TV_JOINER
} ns_tv_kind;

typedef struct ns_tlist ns_tlist;
typedef struct ns_tdict ns_tdict;

typedef struct ns_tv {
    uint8_t kind;
    uint8_t safe; /* NS_TV_STR: Jinja Markup (from |safe, |escape, macros) */
    uint32_t aux; /* NS_TV_FUNC: builtin id */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        ns_tlist *l;
        ns_tdict *d;
        void *obj;
    } u;
} ns_tv;

struct ns_tlist {
    size_t n;
    int tuple;
    ns_tv *v;
};

struct ns_tdict {
    size_t n, cap;
    ns_tv *keys, *vals;
    uint32_t *idx; /* open-addressing index of entry+1, built past 8 entries */
    size_t idx_cap;
};

static inline ns_tv ns_tv_none(void) {
    ns_tv v = {0};
    v.kind = NS_TV_NONE;
    return v;
}
static inline ns_tv ns_tv_bool(int b) {
    ns_tv v = {0};
    v.kind = NS_TV_BOOL;
    v.u.b = b ? 1 : 0;
    return v;
}
static inline ns_tv ns_tv_int(int64_t i) {
    ns_tv v = {0};
    v.kind = NS_TV_INT;
    v.u.i = i;
    return v;
}
static inline ns_tv ns_tv_float(double f) {
    ns_tv v = {0};
    v.kind = NS_TV_FLOAT;
    v.u.f = f;
    return v;
}
/* Borrows p: the bytes must outlive the render. */
static inline ns_tv ns_tv_str(const char *p, size_t n) {
    ns_tv v = {0};
    v.kind = NS_TV_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
/* An Undefined whose use fails with msg (borrowed, like ns_tv_str). */
static inline ns_tv ns_tv_undef(const char *msg, size_t n) {
    ns_tv v = {0};
    v.kind = NS_TV_UNDEF;
    v.u.s.p = msg;
    v.u.s.n = n;
    return v;
}
static inline int ns_tv_is_num(const ns_tv *v) {
    return v->kind == NS_TV_INT || v->kind == NS_TV_FLOAT || v->kind == NS_TV_BOOL;
}
static inline double ns_tv_num(const ns_tv *v) {
    return v->kind == NS_TV_FLOAT ? v->u.f : v->kind == NS_TV_INT ? (double)v->u.i : (double)v->u.b;
}

/* ---- string builder in the arena ---------------------------------------
 * Appends never fail at the call site: running out of arena sets a sticky
 * flag that ns_tsb_finish reports, which keeps builders short to use. */
typedef struct ns_tsb {
    ns_tarena *a;
    char *p;
    size_t n, cap;
    int oom;
    int heap; /* storage is malloc'd (realloc growth) instead of arena */
} ns_tsb;

void ns_tsb_init(ns_tsb *b, ns_tarena *a);
/* A builder whose storage is malloc'd, for the top-level render output:
 * realloc grows big buffers without copying, and ns_tsb_take hands the
 * bytes to the caller. The owner must ns_tsb_take or ns_tsb_release it. */
void ns_tsb_init_heap(ns_tsb *b);
/* Heap builders: transfers the NUL-terminated bytes (never NULL unless the
 * builder ran out of memory) to the caller. */
char *ns_tsb_take(ns_tsb *b, size_t *len);
void ns_tsb_release(ns_tsb *b);
void ns_tsb_put(ns_tsb *b, const char *s, size_t n);
void ns_tsb_puts(ns_tsb *b, const char *s);
void ns_tsb_putc(ns_tsb *b, char c);
void ns_tsb_putcp(ns_tsb *b, uint32_t cp);
void ns_tsb_printf(ns_tsb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Produces the built string (NUL-terminated, arena-owned) as a value;
 * NS_ERR_NOMEM when the arena cap was hit during building. */
ns_status ns_tsb_finish(ns_tsb *b, ns_tv *out, ns_error *err);

/* ---- lists and dicts ---------------------------------------------------- */
/* A list of n UNDEF items (arena-owned); NULL when out of arena. */
ns_tlist *ns_tlist_new(ns_tarena *a, size_t n, int tuple);

/* Growable list under construction (arena-owned storage). */
typedef struct ns_tvec {
    ns_tv *v;
    size_t n, cap;
} ns_tvec;
ns_status ns_tvec_push(ns_tarena *a, ns_tvec *vec, ns_tv v, ns_error *err);
/* Wraps the vector as a list value without copying. */
ns_status ns_tvec_finish(ns_tarena *a, ns_tvec *vec, int tuple, ns_tv *out, ns_error *err);

ns_tdict *ns_tdict_new(ns_tarena *a, size_t cap_hint);
/* Finds key; returns 1 and sets *out (if non-NULL) when present. */
int ns_tdict_get(const ns_tdict *d, const ns_tv *key, ns_tv *out);
int ns_tdict_get_str(const ns_tdict *d, const char *k, size_t kn, ns_tv *out);
/* Whether v can be a dict key (Python hashability: no list/dict/namespace). */
int ns_tv_hashable(const ns_tv *v);
/* Inserts or replaces; fails for unhashable keys or when out of arena. */
ns_status ns_tdict_set(ns_tarena *a, ns_tdict *d, ns_tv key, ns_tv val, ns_error *err);

/* ---- semantics ---------------------------------------------------------- */
int ns_tv_truthy(const ns_tv *v);
/* Python ==, with Undefined == Undefined. */
int ns_tv_eq(const ns_tv *a, const ns_tv *b);
/* Python ordering: *res = -1/0/1; TypeError-like failure for mixed types. */
ns_status ns_tv_cmp(const ns_tv *a, const ns_tv *b, int *res, ns_error *err);
/* Python type name: "str", "int", "list", "dict", "NoneType", ... */
const char *ns_tv_type_name(const ns_tv *v);
/* Length in Python terms (code points for str); -1 when it has none. */
int64_t ns_tv_len(const ns_tv *v);

/* Python repr() of a float (shortest round-trip, 1e+16, 1e-05, inf, nan)
 * into buf (>= 32 bytes); returns the length. */
size_t ns_tv_fmt_float(double x, char *buf);
/* Appends str(v) / repr(v) as Python prints them. */
void ns_tv_str_append(ns_tsb *b, const ns_tv *v);
void ns_tv_repr_append(ns_tsb *b, const ns_tv *v);
/* str(v) as a string value; strings are returned as they are. */
ns_status ns_tv_to_str(ns_tarena *a, const ns_tv *v, ns_tv *out, ns_error *err);

/* Converts a borrowed JSON value; strings and keys point into json, which
 * must outlive the render. */
ns_status ns_tv_from_json(ns_tarena *a, const json_t *j, ns_tv *out, ns_error *err);

#endif
