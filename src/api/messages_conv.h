/* messages_conv.h — an Anthropic Messages request (POST /v1/messages,
 * /v1/messages/count_tokens) turned into the chat request the chat path
 * renders (chat.h), so templates and the prefix cache behave the same
 * across APIs: a conversation sent through /v1/messages renders the same
 * prompt tokens as the equivalent chat completion.
 *
 * Mapping (Anthropic -> chat):
 *  - system (string or text blocks) -> a first "system" message (blocks
 *    as text parts: the chat path joins them with newlines);
 *  - messages[] with role "system" (Claude Code sends mid-conversation
 *    system content) -> a "system" message in place;
 *  - user text blocks -> a user message; tool_result blocks -> "tool"
 *    messages (tool_call_id = tool_use_id; content string or text blocks;
 *    is_error: true prefixes the content with "Error: "), in block order;
 *  - assistant text blocks -> content, thinking blocks -> reasoning_content
 *    (redacted_thinking holds opaque data: skipped), tool_use blocks ->
 *    tool_calls (arguments = input, an object);
 *  - tools (name, description, input_schema) -> function tools; tools with
 *    a "type" other than "custom" are Anthropic-hosted or Anthropic-defined
 *    (web_search_*, bash_*, text_editor_*, ...): not offered, named in
 *    c->ignored_tools;
 *  - tool_choice auto/any/tool/none -> "auto"/"required"/named/"none"
 *    (any and tool are enforced by a grammar, c->struct_kind);
 *    disable_parallel_tool_use -> parallel_tool_calls false;
 *  - thinking {type: enabled|adaptive|disabled} -> enable_thinking, and
 *    budget_tokens -> c->budget_tokens (ns_gen_opts.think_budget);
 *  - output_config.format {type: json_schema, schema} -> a grammar;
 *  - a final assistant message (a prefill) -> continue_final_message: the
 *    prompt ends inside that turn and the reply continues it.
 * Fields that only steer Anthropic's hosted service (metadata,
 * context_management, service_tier, output_config.effort, cache_control on
 * blocks) are accepted and ignored by design; a field the API does not
 * know is refused (400 naming it), as Anthropic's API does.
 *
 * Ownership: c->chat is a new JSON object owned by c (it references parts
 * of body, which must outlive it); strings in c borrow from body.
 */
#ifndef NS_API_MESSAGES_CONV_H
#define NS_API_MESSAGES_CONV_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/stop.h"
#include "server/http_error.h"

typedef enum { NS_MSGS_CHOICE_AUTO = 0, NS_MSGS_CHOICE_ANY, NS_MSGS_CHOICE_TOOL, NS_MSGS_CHOICE_NONE } ns_msgs_choice;

typedef struct ns_msgs_conv {
    json_t *chat;              /* the chat body (messages, tools, tool_choice, enable_thinking, ...) */
    char ignored_tools[448];   /* comma-separated names of tools not offered ("" = none) */
    int n_ignored;
    bool stream;
    int64_t max_tokens;        /* 0 in count mode */
    const char *stops[NS_STOP_MAX];
    int n_stops;
    double temperature, top_p; /* defaults 1.0 */
    int64_t top_k;             /* 0 = off */
    int thinking;              /* -1 not given, 0 disabled, 1 enabled/adaptive */
    ns_msgs_choice choice;
    const char *choice_name;   /* NS_MSGS_CHOICE_TOOL */
    bool single_call;          /* disable_parallel_tool_use */
    json_t *schema;            /* output_config.format json_schema (borrowed), or NULL */
    bool prefill;              /* the last message is the assistant's: continue_final_message */
    int32_t budget_tokens;     /* thinking.budget_tokens (type enabled), else 0 */
} ns_msgs_conv;

/* Validates body and builds c. count_only: /v1/messages/count_tokens
 * (max_tokens and the sampling fields are not required/allowed). False
 * with e set (400 naming the field) on failure; c then needs no free. */
bool ns_msgs_convert(json_t *body, bool count_only, ns_msgs_conv *c, ns_http_error *e);
void ns_msgs_conv_free(ns_msgs_conv *c);

#endif
