/* chat.h — from an OpenAI chat request to the prompt the model sees.
 *
 * Validates messages/tools/tool_choice (every failure a 400 naming the
 * field, e.g. "messages[2].content[0].type") and builds the template
 * context as Hugging Face's apply_chat_template does: messages (content
 * null -> "", text parts joined with newlines, "developer" -> "system",
 * assistant tool_calls passed with arguments as the client sent them —
 * JSON strings are parsed into objects only when the template cannot take
 * a string — tool messages, reasoning_content), tools, add_generation_prompt,
 * bos_token/eos_token, and chat_template_kwargs merged at the top level.
 * Then renders the model's template and tokenizes the result without
 * adding special tokens (the template already wrote them).
 */
#ifndef NS_API_CHAT_H
#define NS_API_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"

#define NS_CHAT_MAX_TOOLS 256

typedef struct ns_chat_prompt {
    char *text;               /* rendered prompt (malloc'd) */
    size_t len;
    int32_t *ids;             /* its tokens (malloc'd; NULL when too_long) */
    size_t n_ids;             /* too_long: a lower bound (> the context) */
    bool too_long;            /* tokenizing stopped past the model's context */
    const char *tool_names[NS_CHAT_MAX_TOOLS]; /* borrowed from the body */
    int n_tools;
    bool tools_enabled;       /* tools given and tool_choice != "none" */
} ns_chat_prompt;

/* Validates body and renders the prompt; tokenize=false skips the
 * tokenizer (/apply-template). Tokenizing stops once the prompt has more
 * tokens than the model's context (p->too_long; the caller answers
 * context_length_exceeded). On failure e is set and p needs no free. */
bool ns_chat_prompt_build(ns_api *a, json_t *body, bool tokenize, ns_chat_prompt *p, ns_http_error *e);
void ns_chat_prompt_free(ns_chat_prompt *p);

#endif
