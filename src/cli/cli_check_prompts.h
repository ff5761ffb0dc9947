/* cli_check_prompts.h — `nightshift check-prompts FILE --model DIR
 * [--json OUT]`: finds the turns of a recording (serve --record) that did
 * not extend the previous turn's prompt append-only, and says why.
 *
 * Every request is rendered and tokenized as the server would: chat
 * bodies with the model's chat template (api/chat.h
 * ns_chat_prompt_build), Anthropic Messages and Responses bodies after
 * their conversion to a chat body (the converters of those endpoints),
 * completions prompts tokenized as /v1/completions does. Requests are
 * grouped into sessions (record/session.h), and each turn is compared
 * with the previous turn of its session (record/prompt_diff.h): the
 * divergence point, the prefill tokens the break cost, and the reasons.
 *
 * Output: one line per session and one block per break (human-readable),
 * and with --json the same as JSON (sessions, turns, breaks, totals).
 * A redacted recording cannot be rendered: refused with a message.
 * Exit code: 0 when the check ran (whether or not it found breaks), 1 on
 * a runtime error (unreadable file or model), 2 on a usage error.
 */
#ifndef NS_CLI_CHECK_PROMPTS_H
#define NS_CLI_CHECK_PROMPTS_H

int ns_cli_check_prompts(int argc, char **argv);

#endif
