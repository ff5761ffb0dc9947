/* tojson.h — Python json.dumps for template values, byte for byte.
 *
 * Hugging Face replaces Jinja's tojson filter with
 *   json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
 * so chat templates that print tool schemas depend on Python's exact text:
 * ", " and ": " separators (",", ": " once indent is set), float repr
 * (1.0, 1e-05, NaN, Infinity), lowercase \u00XX escapes for control
 * characters only (ensure_ascii=False keeps other text raw), tuples as
 * arrays, non-string keys converted like Python does, and "[]"/"{}" for
 * empty containers even when indenting.
 */
#ifndef NS_TEMPLATE_TOJSON_H
#define NS_TEMPLATE_TOJSON_H

#include "template/value.h"

typedef struct ns_tjson_opts {
    int ensure_ascii;
    int indent_set;     /* indent is not None */
    const char *indent; /* indent unit (borrowed) when indent_set */
    size_t indent_n;
    const char *item_sep, *key_sep; /* NULL = Python's defaults */
    size_t item_sep_n, key_sep_n;
    int sort_keys;
} ns_tjson_opts;

/* HF's defaults: ensure_ascii=False, indent=None, separators=None. */
void ns_tjson_opts_default(ns_tjson_opts *o);
/* Appends json.dumps(v) to b. Fails (NS_ERR_INVALID) for values Python
 * cannot serialise (Undefined, namespace, macro, unhashable key types). */
ns_status ns_tv_tojson(ns_tsb *b, const ns_tv *v, const ns_tjson_opts *o, ns_error *err);

#endif
