/* eval.h — the template interpreter: render context, scopes, statements,
 * expressions, macros and calls.
 *
 * A render walks the read-only AST with an ns_tctx that owns everything it
 * creates (the render arena). Scopes follow Jinja2: a for loop body gets a
 * fresh scope each iteration (sets inside do not leak; reads fall through
 * to the enclosing scope), macros run in a scope whose parent is the scope
 * they were defined in (so top-level sets made before the call are seen),
 * if/elif/else share the enclosing scope, and names resolve through the
 * scopes, then the render context, then the globals (range, namespace,
 * dict, raise_exception, strftime_now, cycler, joiner).
 *
 * Limits (so hostile templates cannot hang or exhaust the process): a step
 * budget counted per statement, expression and loop iteration; a macro call
 * depth; a check of the C stack actually left on the calling thread at
 * every recursion point; an output cap; and the arena byte cap. Hitting one fails the render
 * (NS_ERR_RANGE for steps/depth, NS_ERR_NOMEM for output/memory).
 *
 * Errors: the first failing node prefixes the message with
 * "template:LINE:COL: "; raise_exception's message is passed through as is.
 */
#ifndef NS_TEMPLATE_EVAL_H
#define NS_TEMPLATE_EVAL_H

#include <stdint.h>

#include "template/ast.h"
#include "template/value.h"

typedef struct ns_tframe ns_tframe;
struct ns_tframe {
    ns_tframe *parent;
    ns_tdict *vars;
};

/* A macro, or the body of a {% call %} block acting as `caller`. */
typedef struct ns_tmacro {
    const ns_tnode *node; /* NS_S_MACRO or NS_S_CALLBLOCK: params and body */
    ns_tframe *frame;     /* defining scope */
} ns_tmacro;

typedef struct ns_tloop {
    const ns_tlist *items; /* the (filtered) items being iterated */
    size_t index0;
    int changed_set;
    ns_tv changed_last;
    const ns_tnode *node; /* the for statement, for loop(...) in recursive loops */
    ns_tframe *outer;     /* scope the loop runs in */
    int depth0;           /* recursion level, 0 for the outermost loop */
} ns_tloop;

typedef struct ns_tmethod {
    ns_tv self;
    const char *name;
    size_t name_n;
} ns_tmethod;

typedef struct ns_tcycler {
    const ns_tlist *items;
    size_t pos;
} ns_tcycler;

typedef struct ns_tjoiner {
    ns_tv sep;
    int used;
} ns_tjoiner;

/* Evaluated call arguments (positional, then keyword). */
typedef struct ns_tcallargs {
    ns_tv *pos;
    size_t npos;
    const ns_tstr *kw_names;
    ns_tv *kw;
    size_t nkw;
} ns_tcallargs;

typedef struct ns_tctx {
    ns_tarena *a;
    ns_error *err;
    int located;        /* err already carries a location (or is final) */
    ns_tframe *frame;   /* current scope */
    ns_tframe *root;
    ns_tdict *context;  /* the caller's JSON context, converted */
    ns_tsb *out;        /* current output sink */
    size_t max_output;
    uint64_t steps, max_steps;
    int depth, max_depth;
    uintptr_t stack_floor; /* see stackguard.h */
} ns_tctx;

enum { NS_FLOW_NORMAL = 0, NS_FLOW_BREAK, NS_FLOW_CONTINUE };

/* Runs a statement list in the current scope. *flow reports break/continue. */
ns_status ns_texec_body(ns_tctx *c, const ns_tnodes *body, int *flow);
/* Evaluates an expression node. */
ns_status ns_teval(ns_tctx *c, const ns_tnode *n, ns_tv *out);
/* Calls any callable value (macro, global, method, joiner). */
ns_status ns_tcall_value(ns_tctx *c, const ns_tv *fn, const ns_tcallargs *args, ns_tv *out);

/* Fails the render with a message (located later by the failing node). */
ns_status ns_trt_fail(ns_tctx *c, ns_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Fails because an Undefined was used where a value is required. */
ns_status ns_tundef_fail(ns_tctx *c, const ns_tv *u);
/* An integer argument of a filter or method (a bool counts, as in Python)
 * into *out; anything else fails naming `what`. */
ns_status ns_twant_int(ns_tctx *c, const ns_tv *v, const char *what, int64_t *out);
/* An Undefined carrying a formatted message (arena-owned). */
ns_tv ns_tmk_undef(ns_tctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Charges n steps to the budget. */
ns_status ns_tstep(ns_tctx *c, uint64_t n);
/* NS_ERR_NOMEM failure for an exhausted arena. */
ns_status ns_toom(ns_tctx *c);
/* Keyword argument lookup (NULL when absent). */
const ns_tv *ns_targ_kw(const ns_tcallargs *args, const char *name);
/* Positional argument i, else keyword `name`, else NULL. */
const ns_tv *ns_targ(const ns_tcallargs *args, size_t i, const char *name);

#endif
