/* methods.h — Python methods on template values and Jinja's globals.
 *
 * Methods: the str methods chat templates use (startswith, endswith,
 * split/rsplit, strip family with optional chars, lower/upper/title/
 * capitalize/swapcase, replace, find/rfind/index/count, join, splitlines,
 * format, partition, removeprefix/suffix, center/ljust/rjust/zfill, is*
 * predicates), dict items/keys/values/get/copy, list/tuple count/index/copy,
 * loop.cycle/changed and cycler.next/reset. Mutating methods (append,
 * update, pop, ...) are classified unsafe so the caller can refuse them as
 * Jinja's ImmutableSandboxedEnvironment does.
 *
 * Globals: range (capped at 100000 items like the sandbox), dict, namespace,
 * cycler, joiner, and HF's raise_exception(msg) and strftime_now(fmt).
 *
 * Also the two string formatters: printf-style `"%s" % x` (the `format`
 * filter) and str.format's field/spec mini-language (common subset).
 * Every produced string lives in the render arena.
 */
#ifndef NS_TEMPLATE_METHODS_H
#define NS_TEMPLATE_METHODS_H

#include "template/eval.h"

enum { NS_TMETHOD_NONE = 0, NS_TMETHOD_SAFE, NS_TMETHOD_UNSAFE };

/* Whether self has a Python method called name (and if it mutates). */
int ns_tmethod_kind(const ns_tv *self, const char *name, size_t n);
ns_status ns_tmethod_call(ns_tctx *c, const ns_tmethod *m, const ns_tcallargs *args, ns_tv *out);

/* Looks a global function up by name; 1 when found. */
int ns_tglobal_lookup(const char *name, size_t n, ns_tv *out);
ns_status ns_tglobal_call(ns_tctx *c, uint32_t id, const ns_tcallargs *args, ns_tv *out);

/* Python `fmt % args` (args: a tuple, a dict for %(name)s, or one value). */
ns_status ns_tpercent_format(ns_tctx *c, const ns_tv *fmt, const ns_tv *args, ns_tv *out);

/* String helpers shared with the filters. */
enum { NS_TCASE_LOWER, NS_TCASE_UPPER, NS_TCASE_TITLE, NS_TCASE_CAPITALIZE, NS_TCASE_SWAP };
ns_status ns_tstr_case(ns_tctx *c, const ns_tv *s, int mode, ns_tv *out);
/* chars NULL/None strips whitespace. */
ns_status ns_tstr_strip(ns_tctx *c, const ns_tv *s, const ns_tv *chars, int left, int right, ns_tv *out);
ns_status ns_tstr_replace(ns_tctx *c, const ns_tv *s, const ns_tv *old, const ns_tv *rep, int64_t count, ns_tv *out);
/* sep NULL/None splits on whitespace runs; maxsplit < 0 = unlimited. */
ns_status ns_tstr_split(ns_tctx *c, const ns_tv *s, const ns_tv *sep, int64_t maxsplit, int right, ns_tv *out);
ns_status ns_tstr_splitlines(ns_tctx *c, const ns_tv *s, int keepends, ns_tv *out);
/* sep.join(items): every item must be a string. */
ns_status ns_tstr_join(ns_tctx *c, const ns_tv *sep, const ns_tlist *items, ns_tv *out);

#endif
