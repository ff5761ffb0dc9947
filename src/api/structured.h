/* structured.h — structured output enforced by a grammar: what a request
 * asks for (a JSON object, a JSON Schema, a forced tool call) turned into
 * a token-level matcher (src/grammar) attached to its generation.
 *
 * Kinds:
 *  - NS_STRUCT_JSON_OBJECT: any JSON object (response_format json_object).
 *  - NS_STRUCT_JSON_SCHEMA: a value valid against `schema` (response_format
 *    json_schema; the supported keywords are listed in grammar/gschema.h;
 *    any other keyword is a 400 naming it).
 *  - NS_STRUCT_TOOL_REQUIRED: one or more calls, each to one of `tools`
 *    (OpenAI-shaped: [{"type": "function", "function": {"name",
 *    "parameters"}}]), arguments valid against that tool's parameters.
 *  - NS_STRUCT_TOOL_NAMED: calls to the tool `tool_name` only.
 * Tool calls are written in the model's own tool-call syntax (o->toolfmt,
 * chosen from the chat template: Hermes `<tool_call>{"name": ...,
 * "arguments": {...}}</tool_call>`, Llama 3 `{"name": ..., "parameters":
 * {...}}`, Qwen3-Coder XML `<function=NAME><parameter=P>` with raw string
 * values), so the existing tool-call parser reads them back. Mistral's
 * [TOOL_CALLS] (a special token) is refused.
 *
 * Thinking models: when the template knows <think> (o->reasoning), the
 * grammar lets the reasoning block come first — an optional
 * `<think>...</think>` (or, when the prompt already opened <think>
 * (o->in_think), free text up to `</think>`) — and the constrained output
 * starts after it: reasoning is never constrained, the answer always is.
 * When the prompt already closed an empty block (o->think_closed: thinking
 * switched off) the answer starts at once.
 *
 * Ownership: on success the compiled grammar's matcher is stored in
 * o->rp.grammar and belongs to o until ns_gen_start hands it to the
 * request (ns_request_new takes it over; the request frees it). A caller
 * that never calls ns_gen_start frees it with ns_structured_detach.
 * spec and its JSON are borrowed for the call only.
 *
 * Errors: a schema with an unsupported keyword or a bad value -> 400 whose
 * message names the keyword and its JSON pointer (param "response_format"
 * or "tools"); a named tool that is not offered -> 400 (param
 * "tool_choice"); a model without a tool-call format -> 400
 * tools_not_supported; out of memory -> 500.
 *
 * Threads: called on HTTP handler threads; compiled grammars are cached
 * (by schema text) and shared between requests, their state behind a
 * lock (grammar/gmatch.h).
 */
#ifndef NS_API_STRUCTURED_H
#define NS_API_STRUCTURED_H

#include <jansson.h>
#include <stdbool.h>

#include "api/api.h"
#include "api/gen.h"
#include "server/http_error.h"

typedef enum {
    NS_STRUCT_NONE = 0,
    NS_STRUCT_JSON_OBJECT,
    NS_STRUCT_JSON_SCHEMA,
    NS_STRUCT_TOOL_REQUIRED,
    NS_STRUCT_TOOL_NAMED
} ns_struct_kind;

typedef struct ns_struct_spec {
    ns_struct_kind kind;
    const json_t *schema; /* NS_STRUCT_JSON_SCHEMA */
    const json_t *tools;  /* OpenAI-shaped tools array (tool kinds) */
    const char *tool_name; /* NS_STRUCT_TOOL_NAMED */
} ns_struct_spec;

/* Compiles the spec and stores its matcher in o->rp.grammar (see above).
 * NS_STRUCT_NONE: nothing to do, true. Reads o->toolfmt, o->reasoning,
 * o->in_think, o->think_closed and o->max_calls, so call it after those
 * are set (ns_chat_gen_prepare sets them for chat-shaped requests). False with e set. */
bool ns_structured_attach(ns_api *a, const ns_struct_spec *spec, ns_gen_opts *o, ns_http_error *e);
/* Reads body's "response_format" (OpenAI chat / completions) into spec:
 * absent, null or {"type": "text"} -> NS_STRUCT_NONE; {"type":
 * "json_object"}; {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}} (schema required). spec borrows from body. False
 * with e set (400 naming the field) on a malformed value. */
bool ns_structured_response_format(json_t *body, ns_struct_spec *spec, ns_http_error *e);
/* The forced tool choice of an OpenAI chat body into spec: "required" ->
 * NS_STRUCT_TOOL_REQUIRED, {"type": "function", "function": {"name"}} ->
 * NS_STRUCT_TOOL_NAMED; "auto", "none" or absent leave spec unchanged.
 * tools = the body's "tools". The body is already validated
 * (ns_chat_prompt_build). */
void ns_structured_tool_choice(json_t *body, ns_struct_spec *spec);
/* Frees a matcher ns_structured_attach stored in o and never handed to a
 * request (o->rp.grammar becomes NULL). Safe when there is none. */
void ns_structured_detach(ns_gen_opts *o);

#endif
