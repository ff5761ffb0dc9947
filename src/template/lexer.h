/* lexer.h — turns Jinja2 source into tokens, applying Hugging Face's
 * whitespace settings (trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False).
 *
 * Whitespace control is resolved here, exactly as Jinja2's lexer does it:
 * newlines are normalised to \n and one trailing newline is dropped; the
 * first newline after a block or comment tag is removed; spaces/tabs
 * between a line start and a block or comment tag are removed; "{%-" and
 * "-%}" (also for {{ }} and {# #}) strip all adjacent whitespace; "+"
 * disables the automatic stripping for one tag. Comments vanish and
 * {% raw %} bodies become plain data, so the parser only sees DATA,
 * VAR/BLOCK begin and end markers, and expression tokens.
 *
 * Invariants: tokens and decoded strings live in the caller's arena; DATA
 * and NAME texts point into an arena copy of the source; the token array
 * ends with one NS_TT_EOF; string literals are decoded with Python's
 * escape rules; brackets inside a tag are balanced before a tag end is
 * recognised (so "{{ {'a': {}} }}" works).
 */
#ifndef NS_TEMPLATE_LEXER_H
#define NS_TEMPLATE_LEXER_H

#include <stddef.h>
#include <stdint.h>

#include "template/arena.h"
#include "util/status.h"

typedef enum {
    NS_TT_EOF,
    NS_TT_DATA,
    NS_TT_VAR_BEGIN,
    NS_TT_VAR_END,
    NS_TT_BLOCK_BEGIN,
    NS_TT_BLOCK_END,
    NS_TT_NAME,
    NS_TT_INT,
    NS_TT_FLOAT,
    NS_TT_STRING,
    NS_TT_OP
} ns_ttok_type;

typedef enum {
    NS_OP_NONE,
    NS_OP_ADD, NS_OP_SUB, NS_OP_MUL, NS_OP_DIV, NS_OP_FLOORDIV, NS_OP_MOD, NS_OP_POW,
    NS_OP_TILDE,
    NS_OP_LBRACKET, NS_OP_RBRACKET, NS_OP_LPAREN, NS_OP_RPAREN, NS_OP_LBRACE, NS_OP_RBRACE,
    NS_OP_EQ, NS_OP_NE, NS_OP_GT, NS_OP_GE, NS_OP_LT, NS_OP_LE,
    NS_OP_ASSIGN, NS_OP_DOT, NS_OP_COLON, NS_OP_PIPE, NS_OP_COMMA, NS_OP_SEMICOLON
} ns_top;

typedef struct ns_ttok {
    int type; /* ns_ttok_type */
    int op;   /* ns_top for NS_TT_OP */
    int line, col; /* 1-based; col counts bytes */
    const char *p; /* DATA, NAME, STRING (decoded) text */
    size_t n;
    int64_t i;  /* NS_TT_INT */
    double f;   /* NS_TT_FLOAT */
} ns_ttok;

/* Tokenises src[0..len). On failure returns NS_ERR_FORMAT with
 * "template:LINE:COL: message". *toks is arena-owned. */
ns_status ns_tlex(ns_tarena *a, const char *src, size_t len, ns_ttok **toks, size_t *ntoks, ns_error *err);

/* Spelling of an operator, for error messages. */
const char *ns_top_str(int op);

#endif
