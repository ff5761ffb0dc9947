/* cli_replay.h — `nightshift replay FILE --url ROOT`: re-sends a recording
 * (serve --record) to a server and measures it.
 *
 * The recording is grouped into sessions (record/session.h gives the
 * rule); sessions run in parallel (at most --concurrency at once), the
 * turns of a session in order. --speed recorded (default) keeps the
 * recorded timing: each session starts at its recorded offset from the
 * first request, and each turn waits the recorded think time (its arrival
 * minus the end of the previous turn) after the previous answer; --speed
 * max sends each turn as soon as the previous one ended.
 *
 * Each recorded body goes verbatim to ROOT + its recorded endpoint
 * (/v1/chat/completions, /v1/completions, /v1/messages, /v1/responses),
 * with one change: a streamed chat/completions request gets
 * stream_options.include_usage = true, so the server reports the usage
 * (cached tokens) of a stream; with --stream every request is sent
 * streamed, so TTFT is measured for all of them. Per request it prints
 * and writes (--json):
 * status, TTFT (streams only: to the first event with generated content),
 * decode rate ((output tokens - 1) / (last content event - first); streams
 * only), latency, prompt/cached/output tokens as the server reported them,
 * and the recorded cached tokens; then a summary (medians and p90s).
 *
 * A redacted recording (serve --record-redact) has no texts to send: it is
 * refused with a message saying so. Exit code: 0 when every request got
 * the recorded HTTP status; 1 when one failed or got another status, or
 * with --expect-cached when a request's cached tokens differ from the
 * recorded ones; 2 on a usage error.
 */
#ifndef NS_CLI_REPLAY_H
#define NS_CLI_REPLAY_H

int ns_cli_replay(int argc, char **argv);

#endif
