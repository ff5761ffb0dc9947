/* filters.h — Jinja2's builtin filters and tests, plus HF's tojson.
 *
 * Filters: abs attr batch capitalize center count d default dictsort e
 * escape first float forceescape format indent int items join last length
 * list lower map max min reject rejectattr replace reverse round safe
 * select selectattr sort string sum title tojson trim unique upper
 * wordcount. tojson is Hugging Face's json.dumps wrapper (ensure_ascii,
 * indent, separators, sort_keys; positional order as HF declares it).
 * map/select/reject return lists where Jinja returns generators, which
 * only differs if a template prints the generator object itself.
 *
 * Tests: boolean callable defined divisibleby eq equalto escaped even false
 * filter float ge greaterthan gt in integer iterable le lessthan lower lt
 * mapping ne none number odd sameas sequence string test true undefined
 * upper, and the operator spellings == != < <= > >=.
 *
 * Unknown names fail at render time (like Jinja for filters in branches not
 * taken, they cost nothing unless evaluated).
 */
#ifndef NS_TEMPLATE_FILTERS_H
#define NS_TEMPLATE_FILTERS_H

#include "template/eval.h"

ns_status ns_tfilter(ns_tctx *c, const char *name, size_t n, const ns_tv *value, const ns_tcallargs *args,
                     ns_tv *out);
ns_status ns_ttest(ns_tctx *c, const char *name, size_t n, const ns_tv *value, const ns_tcallargs *args, int *out);
int ns_tfilter_exists(const char *name, size_t n);
int ns_ttest_exists(const char *name, size_t n);

#endif
