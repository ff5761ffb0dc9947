/* responses_conv.h — an OpenAI Responses request (POST /v1/responses)
 * turned into the chat request the chat path renders (chat.h), so
 * templates and the prefix cache behave as for the equivalent chat
 * completion. Stateless: nothing is stored, previous_response_id and
 * conversation are refused (400).
 *
 * Mapping (Responses -> chat):
 *  - instructions -> a first "system" message; input as a string -> one
 *    user message;
 *  - input items: message (role user/system/developer/assistant, content
 *    a string or input_text/output_text parts; "developer" -> "system"),
 *    reasoning (its reasoning_text content, or the text nightshift put in
 *    encrypted_content, -> the next assistant message's
 *    reasoning_content; content null and foreign encrypted_content carry
 *    nothing readable), function_call / custom_tool_call (-> tool_calls of
 *    one assistant message; a custom call's input becomes {"input": ...}),
 *    function_call_output / custom_tool_call_output (-> "tool" messages);
 *    ids on items are accepted and not needed;
 *  - tools: function (parameters; strict accepted), custom (free-form
 *    input, e.g. apply_patch with a Lark grammar: offered as a function
 *    with one string parameter "input"), namespace (its functions and
 *    custom tools flattened under their own names); hosted tools
 *    (web_search*, tool_search, file_search, code_interpreter,
 *    image_generation, computer_use*, mcp, local_shell, ...) are not
 *    offered and are named in c->ignored_tools;
 *  - tool_choice auto/none/required/{type function|custom, name};
 *    parallel_tool_calls false -> one call; max_tool_calls -> that many;
 *  - reasoning.effort -> reasoning_effort (the template's thinking switch);
 *  - text.format json_schema / json_object -> a grammar (c->schema,
 *    c->json_object).
 * Fields that only steer OpenAI's hosted service (store, prompt_cache_key,
 * prompt_cache_retention, client_metadata, metadata, user,
 * safety_identifier, service_tier, text.verbosity, reasoning.summary,
 * truncation "disabled", stream_options) are accepted and ignored by
 * design; unknown fields are refused with a 400 naming them.
 *
 * c->tool_info maps each offered tool name to {"custom": bool,
 * "namespace": string|null}, which the response needs to shape calls.
 *
 * Ownership: c->chat and c->tool_info are owned by c; strings in c borrow
 * from body, which must outlive c.
 */
#ifndef NS_API_RESPONSES_CONV_H
#define NS_API_RESPONSES_CONV_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/http_error.h"
#include "util/buf.h"

typedef enum { NS_RESP_CHOICE_AUTO = 0, NS_RESP_CHOICE_NONE, NS_RESP_CHOICE_REQUIRED, NS_RESP_CHOICE_NAMED } ns_resp_choice;

/* The prefix nightshift writes before the reasoning text it returns in
 * encrypted_content (include: ["reasoning.encrypted_content"]), so the
 * text comes back with the reasoning item of a stateless conversation. */
#define NS_RESP_REASONING_TAG "nightshift-reasoning:"

typedef struct ns_resp_conv {
    json_t *chat;             /* the chat body */
    json_t *tool_info;        /* offered name -> {"custom", "namespace"} */
    char ignored_tools[448];  /* comma-separated hosted tools not offered */
    int n_ignored;
    bool stream;
    int64_t max_tokens;       /* max_output_tokens; 0 = as many as fit */
    double temperature, top_p;
    int max_calls;            /* 0 = any number */
    ns_resp_choice choice;
    const char *choice_name;
    json_t *schema;           /* text.format json_schema (borrowed) */
    bool json_object;         /* text.format json_object */
    bool include_reasoning;   /* include has reasoning.encrypted_content */
} ns_resp_conv;

/* Validates body and builds c. False with e set (400 naming the field);
 * c then needs no free. */
bool ns_resp_convert(json_t *body, ns_resp_conv *c, ns_http_error *e);
void ns_resp_conv_free(ns_resp_conv *c);

/* A custom tool call's input as far as the model has written it: args is
 * the call's arguments text so far, {"input": "..." (a custom tool is
 * offered as a function with that one string parameter); out gets the
 * decoded string up to the last complete character or escape. False when
 * args does not start that way (then the input is known only once the
 * call is complete). Streaming sends the growth of out as deltas. */
bool ns_resp_custom_input_prefix(const char *args, size_t n, ns_buf *out);

#endif
