/* gschema.h — JSON Schema compiled to the grammar automaton (gnfa.h): the
 * bytes the automaton accepts are exactly JSON texts (with bounded
 * whitespace) that the schema validates, restricted as said below.
 *
 * Supported keywords: type (a name or a list), properties, required,
 * additionalProperties (false, true or a schema), items, enum, const,
 * anyOf, allOf (one subschema), $ref (any "#..." JSON pointer in the same
 * document, recursion included) with $defs / definitions, minLength /
 * maxLength, minItems / maxItems, minimum / maximum / exclusiveMinimum /
 * exclusiveMaximum for integers, pattern (gregex.h). Annotations are
 * accepted and ignored: $schema, $id, $comment, title, description,
 * default, examples, deprecated, readOnly, writeOnly. Boolean schemas.
 * Any other keyword, or a supported one with a bad value, is an error
 * naming it and where it is ("#/properties/x").
 *
 * What is generated (always valid, sometimes a subset of what validates):
 * object properties in the schema's order, each at most once; properties
 * not listed in "properties" are never generated (additionalProperties
 * only matters without "properties": a map of its schema); integers
 * without bounds within +-(2^53-1); numbers with at most 16 integer and
 * 16 fraction digits and a 3-digit exponent; strings without surrogate
 * escapes; whitespace runs of at most NS_GNFA_MAX_WS blanks.
 */
#ifndef NS_GRAMMAR_GSCHEMA_H
#define NS_GRAMMAR_GSCHEMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "grammar/gnfa.h"

/* Caps that keep a hostile schema from building a huge automaton. */
#define NS_GSCHEMA_MAX_DEPTH 64       /* nesting of subschemas */
#define NS_GSCHEMA_MAX_UNROLL 10000   /* maxLength / maxItems */

/* Emits a value valid against schema (also the root that $refs resolve
 * in) after s; *end gets the end state. False with err (NUL-terminated
 * message naming the keyword and its location) set; the NFA may then hold
 * unused states. */
bool ns_gschema_emit(ns_gnfa *n, const json_t *schema, uint32_t s, uint32_t *end, char *err, size_t errcap);
/* The same for a subschema of root: $refs resolve in root, and messages
 * locate keywords under path (a JSON pointer into root, "" = root). */
bool ns_gschema_emit_in(ns_gnfa *n, const json_t *root, const json_t *schema, const char *path, uint32_t s,
                        uint32_t *end, char *err, size_t errcap);

#endif
