/* gregex.h — JSON Schema "pattern" (a simple ECMAScript regex) compiled to
 * the content of a JSON string in the grammar automaton.
 *
 * Semantics: JSON Schema patterns are unanchored (they match anywhere), so
 * a pattern without a leading '^' may be preceded, and one without a
 * trailing '$' followed, by any characters. The generated string content
 * is the JSON-escaped form of text the regex matches: plain characters as
 * themselves, '"' and '\\' as \" and \\, tab/newline/CR as \t \n \r.
 *
 * Supported: literals (ASCII and UTF-8), '.', classes [a-z0-9_] and [^...]
 * with ranges and \d \w \s inside, escapes \d \w \s \D \W \S and escaped
 * punctuation, groups (...) and (?:...), alternation |, quantifiers * + ?
 * {n} {n,} {n,m} (a lazy '?' suffix is accepted: it does not change which
 * strings match). Negated shorthands (\D \W \S) generate ASCII only, a
 * subset of what they match. Anything else (backreferences, lookaround,
 * \b, anchors inside the pattern, \p{...}, non-ASCII inside a class) is an
 * error naming it.
 *
 * Ownership: nothing is kept; the NFA gets the states.
 */
#ifndef NS_GRAMMAR_GREGEX_H
#define NS_GRAMMAR_GREGEX_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/gnfa.h"

/* Emits the string content (between the quotes) matching pattern after s;
 * *end gets the end state. False with err (NUL-terminated) set. */
bool ns_gregex_emit(ns_gnfa *n, const char *pattern, uint32_t s, uint32_t *end, char *err, size_t errcap);

#endif
