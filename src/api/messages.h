/* messages.h — the Anthropic Messages API: POST /v1/messages (whole and
 * streamed) and POST /v1/messages/count_tokens.
 *
 * The request is converted to the chat request (messages_conv.h) and runs
 * the shared generation path (gen.h) with Anthropic's shapes:
 *  - whole: {"id": "msg_...", "type": "message", "role": "assistant",
 *    "model", "content": [thinking?, text?, tool_use*], "stop_reason"
 *    (end_turn / max_tokens / stop_sequence / tool_use), "stop_sequence",
 *    "usage"};
 *  - streamed: message_start, ping, then per content block
 *    content_block_start / content_block_delta (thinking_delta then
 *    signature_delta, text_delta, input_json_delta with the tool input as
 *    the model writes it) / content_block_stop, then message_delta
 *    (stop_reason, stop_sequence, usage) and message_stop; a failure is an
 *    "error" event. message_start is sent as soon as the engine admitted
 *    the request and looked the prompt up in the prefix cache (before the
 *    prefill), so its usage already says what the prefix cache reused;
 *    cache_creation_input_tokens is known at the end only (message_delta).
 *  - usage: cache_read_input_tokens = the reused prefix,
 *    cache_creation_input_tokens = prompt tokens this request newly
 *    committed to the cache (its whole pages past the reused prefix),
 *    input_tokens = the rest of the prompt (neither read nor committed), so
 *    the three add up to the prompt as Anthropic counts; output_tokens.
 *  - errors: {"type": "error", "error": {"type": "invalid_request_error" |
 *    "authentication_error" | "permission_error" | "not_found_error" |
 *    "request_too_large" | "rate_limit_error" | "api_error" |
 *    "overloaded_error", "message"}}: the handlers set resp->err as every
 *    endpoint does and the server renders it in this shape by the path
 *    (http_error.h), as it does the refusals before any handler (401, 404,
 *    405, 413, 415, 503).
 * Thinking blocks carry a signature nightshift makes from the text (not a
 * cryptographic one: nothing is verified when it comes back).
 */
#ifndef NS_API_MESSAGES_H
#define NS_API_MESSAGES_H

#include "server/server.h"

void ns_api_messages(void *ud, const ns_http_request *req, ns_http_response *resp);
void ns_api_messages_count_tokens(void *ud, const ns_http_request *req, ns_http_response *resp);

#endif
