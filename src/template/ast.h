/* ast.h — the parsed form of a template: statement and expression nodes.
 *
 * One node struct serves every kind; which fields matter is listed per
 * kind below. All nodes, arrays and strings live in the template's arena,
 * so the tree is freed in one go and is read-only after parsing (renders
 * may run concurrently on one parsed template). Every node records the
 * line and column it came from for error messages.
 */
#ifndef NS_TEMPLATE_AST_H
#define NS_TEMPLATE_AST_H

#include <stddef.h>

#include "template/arena.h"
#include "template/value.h"

typedef enum {
    /* expressions */
    NS_N_CONST,   /* value */
    NS_N_NAME,    /* name */
    NS_N_LIST,    /* items */
    NS_N_TUPLE,   /* items */
    NS_N_DICT,    /* items: key0, val0, key1, val1, ... */
    NS_N_GETATTR, /* a.name */
    NS_N_GETITEM, /* a[b] */
    NS_N_SLICE,   /* a[b:c:d], any of b/c/d may be NULL */
    NS_N_CALL,    /* a(args) */
    NS_N_FILTER,  /* a|name(args); a is NULL inside {% filter %} */
    NS_N_TEST,    /* a is name(args) */
    NS_N_UNARY,   /* op a: NS_U_NOT, NS_U_NEG, NS_U_POS */
    NS_N_BINARY,  /* a op b: arithmetic, ~, and, or */
    NS_N_COMPARE, /* a ops[0] items[0] ops[1] items[1] ... (chained) */
    NS_N_COND,    /* b if a else c (c may be NULL) */
    /* statements */
    NS_S_TEXT,     /* name: literal text */
    NS_S_OUTPUT,   /* {{ a }} */
    NS_S_IF,       /* a; body; else_body (elif is a nested IF in else_body) */
    NS_S_FOR,      /* names (targets) in a [if b]; body; else_body; flag: recursive (loop() re-enters) */
    NS_S_SET,      /* names = a | ns attr: b.name = a | block: names, body, a=filter */
    NS_S_MACRO,    /* name(params) body */
    NS_S_CALLBLOCK,/* {% call(params) a %} body */
    NS_S_FILTERBLOCK, /* {% filter a %} body (a: NS_N_FILTER chain on NULL) */
    NS_S_WITH,     /* names = items; body */
    NS_S_BREAK,
    NS_S_CONTINUE,
    NS_S_BLOCK     /* plain body: {% generation %} and similar pass-through */
} ns_tnode_kind;

enum { NS_U_NOT = 1, NS_U_NEG, NS_U_POS };
enum { NS_B_AND = 100, NS_B_OR }; /* other binary ops reuse ns_top codes */
enum { NS_C_IN = 200, NS_C_NOTIN };

typedef struct ns_tnode ns_tnode;

typedef struct ns_tstr {
    const char *p;
    size_t n;
} ns_tstr;

typedef struct ns_tnodes {
    ns_tnode **v;
    size_t n;
} ns_tnodes;

typedef struct ns_targs {
    ns_tnodes pos;
    ns_tstr *kw_names;
    ns_tnodes kw_vals;
} ns_targs;

struct ns_tnode {
    int kind;
    int op;
    int line, col;
    int flag;
    ns_tstr name;
    ns_tv value;
    ns_tnode *a, *b, *c, *d;
    ns_tnodes items;
    int *ops;
    ns_targs args;
    ns_tnodes body, else_body;
    ns_tstr *names; /* FOR/SET/WITH targets, MACRO/CALLBLOCK params */
    size_t n_names;
    ns_tnodes defaults; /* MACRO/CALLBLOCK param defaults (entries may be NULL) */
};

#endif
