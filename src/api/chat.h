/* chat.h — from an OpenAI chat request to the prompt the model sees.
 *
 * Validates messages/tools/tool_choice (every failure a 400 naming the
 * field, e.g. "messages[2].content[0].type") and builds the template
 * context as Hugging Face's apply_chat_template does: messages (content
 * null -> "", text parts joined with newlines, "developer" -> "system",
 * assistant tool_calls passed with arguments as the client sent them —
 * JSON strings are parsed into objects only when the template cannot take
 * a string — tool messages, reasoning_content), tools, add_generation_prompt,
 * bos_token/eos_token, the thinking switch (enable_thinking /
 * reasoning_effort, where the template has one), and chat_template_kwargs
 * merged at the top level. continue_final_message (HF, vLLM; Anthropic's
 * prefill) renders without a generation prompt and cuts the prompt after
 * the last assistant message's content, so the model continues it. Tools for a template that cannot render them
 * are refused (400 tools_not_supported) when the prompt is for a
 * generation (tokenize=true); /apply-template renders them as Hugging Face
 * does (the template leaves them out).
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
    bool single_call;         /* parallel_tool_calls: false */
    json_t *final_content;    /* continue_final_message: the content the prompt ends with (a reference) */
} ns_chat_prompt;

/* Validates body and renders the prompt; tokenize=false skips the
 * tokenizer (/apply-template). Tokenizing stops once the prompt has more
 * tokens than the model's context (p->too_long; the caller answers
 * context_length_exceeded). On failure e is set and p needs no free. */
bool ns_chat_prompt_build(ns_api *a, json_t *body, bool tokenize, ns_chat_prompt *p, ns_http_error *e);
void ns_chat_prompt_free(ns_chat_prompt *p);

struct ns_gen_job;
struct ns_gen_opts;
/* The prompt of a generation from a chat body (the chat endpoint's own,
 * or one an Anthropic/Responses request was converted to): renders and
 * tokenizes it into cp (owned by the caller's job; ns_chat_prompt_free),
 * refuses a prompt past the context, and sets the job's prompt and the
 * options every chat-shaped API shares (reasoning split, tool-call format
 * and names, parallel_tool_calls). chat_completions.c. */
bool ns_chat_gen_prepare(struct ns_gen_job *gj, json_t *chat_body, ns_chat_prompt *cp, struct ns_gen_opts *o,
                         ns_http_error *e);

/* The template renders tools (its source mentions them); tools for one
 * that does not are a 400 tools_not_supported on every API. */
bool ns_chat_template_has_tools(const ns_api *a);
/* The template has a thinking switch (Qwen3's enable_thinking), which
 * enable_thinking / reasoning_effort (chat), thinking (Anthropic) and
 * reasoning.effort (Responses) set. */
bool ns_chat_template_has_thinking_switch(const ns_api *a);

#endif
