/* gnfa.h — the byte-level grammar automaton: a recursive transition
 * network (one NFA per rule; a "call" edge enters another rule and
 * continues at its return state when that rule accepts). Together with a
 * stack of return states (gmatch.c) this is a pushdown automaton over
 * bytes; JSON Schema (gschema), simple regexes (gregex) and the tool-call
 * syntaxes (api/structured.c) compile to it.
 *
 * Building: emitters take a state `s`, add edges leaving it and return a
 * fresh state `e` with no edges yet where the emitted piece ends, so pieces
 * compose by chaining (s = lit(s, "{"); s = ws(s); ...). A rule is a start
 * state (ns_gnfa_rule) whose end state is marked accepting.
 *
 * Invariants: state 0 is unused (0 means "none"); every edge target is a
 * valid state; the NFA is capped at NS_GNFA_MAX_STATES states (a schema
 * that would need more is refused, never truncated).
 *
 * Ownership: an ns_gnfa owns its states; ns_gnfa_free releases them. Once
 * built it is read-only and may be shared by threads.
 */
#ifndef NS_GRAMMAR_GNFA_H
#define NS_GRAMMAR_GNFA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

#define NS_GNFA_MAX_STATES (1u << 22)
/* Whitespace between JSON tokens is "", " ", or a newline and at most this
 * many spaces/tabs (an indentation), so a model can never loop on blanks
 * forever. */
#define NS_GNFA_MAX_WS 20

typedef struct ns_gedge {
    uint8_t lo, hi;  /* byte range, inclusive */
    uint32_t to;
} ns_gedge;

typedef struct ns_gcall {
    uint32_t rule;   /* start state of the called rule */
    uint32_t ret;    /* where to continue once it accepts */
} ns_gcall;

typedef struct ns_gstate {
    ns_gedge *edges;
    uint32_t n_edges, cap_edges;
    uint32_t *eps;
    uint32_t n_eps, cap_eps;
    ns_gcall *calls;
    uint32_t n_calls, cap_calls;
    bool accept;     /* the rule ends here (return to the caller) */
} ns_gstate;

typedef struct ns_gnfa {
    ns_gstate *st;
    uint32_t n, cap;
    uint32_t root;   /* start state of the root rule */
    /* shared rules, created on first use (0 = not yet) */
    uint32_t r_char, r_num, r_any, r_obj, r_arr, r_str;
    bool oom;        /* an allocation failed or the cap was reached: sticky */
} ns_gnfa;

void ns_gnfa_init(ns_gnfa *n);
void ns_gnfa_free(ns_gnfa *n);
/* A new state (0 when out of memory or over the cap: n->oom is set and
 * every later call is a no-op, so builders check once at the end). */
uint32_t ns_gnfa_state(ns_gnfa *n);
void ns_gnfa_byte(ns_gnfa *n, uint32_t from, uint8_t lo, uint8_t hi, uint32_t to);
void ns_gnfa_eps(ns_gnfa *n, uint32_t from, uint32_t to);
void ns_gnfa_call(ns_gnfa *n, uint32_t from, uint32_t rule, uint32_t ret);
/* A new rule: returns its start state. Finish it with ns_gnfa_end. */
uint32_t ns_gnfa_rule(ns_gnfa *n);
void ns_gnfa_end(ns_gnfa *n, uint32_t s);

/* ---- emitters: add a piece after s, return its end state ---- */
uint32_t ns_gnfa_lit(ns_gnfa *n, uint32_t s, const char *bytes, size_t len);
uint32_t ns_gnfa_lits(ns_gnfa *n, uint32_t s, const char *str);
/* Optional bounded JSON whitespace: "" | " " | "\n" [ \t]{0,NS_GNFA_MAX_WS}. */
uint32_t ns_gnfa_ws(ns_gnfa *n, uint32_t s);
/* Calls rule r once. */
uint32_t ns_gnfa_callr(ns_gnfa *n, uint32_t s, uint32_t r);
/* Rules shared by every grammar built on this NFA (created on first use):
 * one JSON string character (a UTF-8 character other than '"', '\\' and
 * controls, or an escape; \u escapes of surrogates are refused so a
 * character is always one code point), a JSON number, and any JSON value
 * (any object, any array...). */
uint32_t ns_gnfa_char_rule(ns_gnfa *n);
uint32_t ns_gnfa_number_rule(ns_gnfa *n);
uint32_t ns_gnfa_any_rule(ns_gnfa *n);
uint32_t ns_gnfa_any_object_rule(ns_gnfa *n);
/* One well-formed multi-byte UTF-8 character from s to e (no overlongs,
 * surrogates or code points above U+10FFFF); no_line_sep leaves out
 * U+2028 and U+2029 (what a regex "." does not match). */
void ns_gnfa_utf8_multi(ns_gnfa *n, uint32_t s, uint32_t e, bool no_line_sep);
/* A JSON string of min..max characters (max < 0: unbounded). */
uint32_t ns_gnfa_string(ns_gnfa *n, uint32_t s, int64_t min, int64_t max);
/* A JSON integer in [lo, hi] (canonical: no leading zeros, no "-0"). */
uint32_t ns_gnfa_int_range(ns_gnfa *n, uint32_t s, int64_t lo, int64_t hi);

#endif
