/* ops.h — Python operator semantics for template values: arithmetic,
 * comparison, membership, attribute/item access, slicing and iteration.
 *
 * Matches what Jinja2 (sandboxed) does with Python objects: int/float/bool
 * arithmetic with Python's floor division and modulo signs, true division
 * yielding floats, str/list concatenation and repetition, Markup-aware
 * "+", dict-key fallback for `a.b` and method fallback for `a['b']`,
 * negative indices and extended slices by code point, and Jinja's Undefined
 * rules (using an Undefined in arithmetic, ordering, attribute or item
 * access fails with its message; `x.y` on a non-Undefined without y yields
 * a new Undefined). Mutating methods (list.append, dict.update, ...) are
 * refused like ImmutableSandboxedEnvironment does. Integers are 64-bit: an
 * overflow is an error rather than a bignum.
 */
#ifndef NS_TEMPLATE_OPS_H
#define NS_TEMPLATE_OPS_H

#include "template/eval.h"

/* op: an ns_top arithmetic code (ADD SUB MUL DIV FLOORDIV MOD POW TILDE). */
ns_status ns_tbinop(ns_tctx *c, int op, const ns_tv *l, const ns_tv *r, ns_tv *out);
/* op: NS_U_NEG or NS_U_POS. */
ns_status ns_tunop(ns_tctx *c, int op, const ns_tv *v, ns_tv *out);
/* op: NS_OP_EQ NE LT LE GT GE, NS_C_IN, NS_C_NOTIN. */
ns_status ns_tcompare(ns_tctx *c, int op, const ns_tv *l, const ns_tv *r, int *res);
/* Python `item in container`. */
ns_status ns_tcontains(ns_tctx *c, const ns_tv *container, const ns_tv *item, int *res);
/* Jinja `obj.name`: attribute (method) first, then item. */
ns_status ns_tgetattr(ns_tctx *c, const ns_tv *obj, const char *name, size_t n, ns_tv *out);
/* Jinja `obj[key]`: item first, then attribute for string keys. */
ns_status ns_tgetitem(ns_tctx *c, const ns_tv *obj, const ns_tv *key, ns_tv *out);
/* obj[start:stop:step]; NULL parts mean None. Only str, list and tuple
 * slice; anything else fails (Jinja slices without the sandbox fallback). */
ns_status ns_tslice(ns_tctx *c, const ns_tv *obj, const ns_tv *start, const ns_tv *stop, const ns_tv *step,
                    ns_tv *out);
/* The items Python's iter(v) yields: list/tuple items, dict keys, string
 * characters; Undefined yields nothing; other types fail. */
ns_status ns_titer(ns_tctx *c, const ns_tv *v, const ns_tlist **out);
/* HTML-escapes str(v) (& < > " ') into a Markup string; Markup passes. */
ns_status ns_tescape(ns_tctx *c, const ns_tv *v, ns_tv *out);
/* Attribute path "a.b.0" as Jinja's attribute= arguments use it. */
ns_status ns_tgetattr_path(ns_tctx *c, const ns_tv *obj, const ns_tv *path, ns_tv *out);

#endif
