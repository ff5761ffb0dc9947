/* responses.h — the OpenAI Responses API, stateless: POST /v1/responses
 * (whole and streamed).
 *
 * The request is converted to the chat request (responses_conv.h) and runs
 * the shared generation path (gen.h) with the Responses shapes:
 *  - whole: a "response" object (id "resp_...", status completed, or
 *    incomplete with incomplete_details.reason "max_output_tokens"; store
 *    false) whose output holds, in order, a reasoning item (content
 *    [{"type": "reasoning_text"}], and encrypted_content when include asks
 *    for reasoning.encrypted_content: the reasoning text behind
 *    NS_RESP_REASONING_TAG, so a stateless client sends it back), message
 *    items (output_text), function_call items and custom_tool_call items
 *    (a custom tool's input is the "input" string the model wrote; calls
 *    to a namespaced tool carry "namespace");
 *  - streamed: response.created, response.in_progress, then per item
 *    response.output_item.added, its deltas (response.reasoning_text.delta,
 *    response.content_part.added + response.output_text.delta,
 *    response.function_call_arguments.delta, response.custom_tool_call_input
 *    .delta with the input decoded as it grows) and their .done events,
 *    response.output_item.done; then
 *    response.completed (or response.incomplete) with the whole response.
 *    Every event has a sequence_number. A generation that fails ends the
 *    stream with response.failed (status "failed", error {code, message}).
 *  - usage: input_tokens, input_tokens_details.cached_tokens (the prefix
 *    cache's reuse), output_tokens, output_tokens_details.reasoning_tokens
 *    (the reasoning text's tokens), total_tokens.
 * Errors have the OpenAI shape.
 */
#ifndef NS_API_RESPONSES_H
#define NS_API_RESPONSES_H

#include "server/server.h"

void ns_api_responses(void *ud, const ns_http_request *req, ns_http_response *resp);

#endif
