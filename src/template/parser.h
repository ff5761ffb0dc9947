/* parser.h — recursive-descent parser from tokens to the template AST.
 *
 * Follows Jinja2's grammar and operator precedence (condexpr < or < and <
 * not < comparisons/in < + - < ~ < * / // % < ** (left-assoc, as Jinja) <
 * unary - + < postfix . [] () and filters/tests). Supported statements:
 * if/elif/else, for (tuple targets, inline "if" filter, else, recursive), set (plain,
 * tuple unpacking, namespace attribute, block set), macro, call, filter,
 * with, break/continue (HF enables loopcontrols) and generation (HF's
 * AssistantTracker tag, rendered as its body). extends/include/import are
 * rejected because chat templates are single-file.
 *
 * Invariants: nesting depth is capped so hostile input cannot exhaust the
 * C stack; break/continue are only accepted inside a for body; every node
 * is allocated in the caller's arena.
 */
#ifndef NS_TEMPLATE_PARSER_H
#define NS_TEMPLATE_PARSER_H

#include "template/ast.h"
#include "template/lexer.h"

#define NS_TPL_MAX_PARSE_DEPTH 200

/* Parses the token stream into the root statement list *out (arena-owned).
 * Syntax errors: NS_ERR_FORMAT with "template:LINE:COL: message". */
ns_status ns_tparse(ns_tarena *a, const ns_ttok *toks, size_t ntoks, ns_tnodes *out, ns_error *err);

#endif
