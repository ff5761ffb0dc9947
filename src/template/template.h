/* template.h — Jinja2-subset renderer for Hugging Face chat templates.
 *
 * Renders tokenizer_config.json's chat_template exactly as transformers'
 * apply_chat_template does: Jinja2 with trim_blocks=True,
 * lstrip_blocks=True, keep_trailing_newline=False, the loopcontrols
 * extension, an ImmutableSandboxedEnvironment (no list.append & co.), HF's
 * tojson (json.dumps with ensure_ascii=False), raise_exception(msg) and
 * strftime_now(fmt). The headers beside this one list the supported statements,
 * expressions, filters, tests and methods.
 *
 * Ownership: a parsed template is immutable and may be rendered by several
 * threads at once; each render allocates only its own memory. The context
 * is borrowed for the duration of the call and never modified.
 *
 * Errors carry "template:LINE:COL: message" (syntax errors:
 * NS_ERR_FORMAT; runtime errors: NS_ERR_INVALID, or NS_ERR_UNSUPPORTED
 * for a filter/test/method this engine lacks). A template's own
 * raise_exception(msg) fails with NS_ERR_INVALID and exactly msg. Limits:
 * output beyond max_output and render memory beyond a multiple of it fail
 * with NS_ERR_NOMEM; too many evaluation steps, too deep macro recursion,
 * or recursion that would exhaust the calling thread's C stack fail with
 * NS_ERR_RANGE, so hostile templates cannot hang or overflow. Real chat
 * templates need well under 256 KiB of stack; a thread with less may see
 * NS_ERR_RANGE for deeply nested templates.
 */
#ifndef NS_TEMPLATE_TEMPLATE_H
#define NS_TEMPLATE_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

#include "util/status.h"

#define NS_TEMPLATE_MAX_SOURCE ((size_t)4 << 20)      /* bytes of template source */
#define NS_TEMPLATE_DEFAULT_OUTPUT ((size_t)64 << 20) /* max_output == 0 */
#define NS_TEMPLATE_MAX_STEPS 20000000ULL             /* statements + expressions + iterations */
#define NS_TEMPLATE_MAX_DEPTH 100                     /* nested macro calls */

typedef struct ns_template ns_template;

/* Parses Jinja source. On syntax error returns NS_ERR_FORMAT with
 * "template:LINE:COL: message" in err. *out is owned by the caller
 * (ns_template_free). */
ns_status ns_template_parse(const char *src, size_t len, ns_template **out, ns_error *err);

/* Renders with a JSON object as the global context (messages, tools,
 * add_generation_prompt, bos_token, eos_token, chat_template_kwargs merged
 * at top level, ...); NULL means an empty context. The context is borrowed.
 * *out is a malloc'd NUL-terminated string the caller frees; *len_out (if
 * non-NULL) gets its length. max_output caps the output (0 = 64 MiB). */
ns_status ns_template_render(const ns_template *t, const json_t *context, size_t max_output, char **out,
                             size_t *len_out, ns_error *err);

void ns_template_free(ns_template *t);

#endif
