/* log.h — leveled logging to stderr, safe from any thread.
 *
 * One line per call: time, level, the calling thread's log context (when
 * set), then the message. Level is set once at start-up (NS_LOG_LEVEL env
 * or --log-level) before threads start.
 *
 * Safe by default: the formatted message (and the context) is escaped
 * before it is written, so nothing a client sends can forge a log line or
 * drive a terminal. Every C0 control byte (CR, LF, TAB, ESC, ...), DEL, the
 * UTF-8 encodings of the C1 controls (U+0080..U+009F) and of the line and
 * paragraph separators (U+2028, U+2029), and every byte that is not part of
 * well-formed UTF-8 are written as \xNN (two lowercase hex digits per
 * byte). Everything else, backslash included, is written as is. Each call
 * writes exactly one line ending in '\n'. A message longer than
 * NS_LOG_MAX_MESSAGE bytes (after formatting, before escaping) is cut and
 * ends with "...".
 *
 * Log context: a short thread-local label (a request id, "req 12") that
 * every line logged by that thread carries in brackets after the level,
 * until it is cleared:
 *
 *     ns_log_set_context("req %llu", id);   ...   ns_log_clear_context();
 *
 * It is per thread: the HTTP thread serving a request and the engine thread
 * (around its per-request lines) each set their own.
 *
 * Prompt text: no prompt or completion text may be logged at INFO or above
 * unless ns_log_prompts() is true (`serve --log-prompts`); excerpts are
 * otherwise DEBUG only.
 */
#ifndef NS_LOG_H
#define NS_LOG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { NS_LOG_DEBUG = 0, NS_LOG_INFO, NS_LOG_WARN, NS_LOG_ERROR, NS_LOG_OFF } ns_log_level;

/* Formatted messages are cut at this many bytes (before escaping). */
#define NS_LOG_MAX_MESSAGE 2048
/* Contexts are cut at this many bytes (before escaping). */
#define NS_LOG_MAX_CONTEXT 64

void ns_log_set_level(ns_log_level lvl);
ns_log_level ns_log_get_level(void);
/* Parses "debug|info|warn|error|off"; returns -1 when unknown. */
int ns_log_parse_level(const char *s);
void ns_log(ns_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's log context: set (printf-style; cut at
 * NS_LOG_MAX_CONTEXT bytes; NULL or "" clears), clear, read ("" when none).
 * ns_log_context's pointer is valid until the thread's next set/clear. */
void ns_log_set_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ns_log_clear_context(void);
const char *ns_log_context(void);

/* Whether prompt/completion excerpts may be logged at INFO (default false;
 * `serve --log-prompts` sets it at start-up). Without it such text is
 * logged only at DEBUG. */
bool ns_log_prompts(void);
void ns_log_set_prompts(bool on);

/* Writes the escaped form of s[0..n) (the escaping ns_log applies, see
 * above) into out[0..cap) NUL-terminated, never cutting an escape in two;
 * returns the number of input bytes consumed (n unless out is too small).
 * At most 4 * n + 1 bytes are ever needed. */
size_t ns_log_escape(const char *s, size_t n, char *out, size_t cap);

#define NS_DEBUG(...) ns_log(NS_LOG_DEBUG, __VA_ARGS__)
#define NS_INFO(...) ns_log(NS_LOG_INFO, __VA_ARGS__)
#define NS_WARN(...) ns_log(NS_LOG_WARN, __VA_ARGS__)
#define NS_ERROR(...) ns_log(NS_LOG_ERROR, __VA_ARGS__)

#endif
