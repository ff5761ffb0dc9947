/* reasoning.h — splits streamed model output into reasoning and content.
 *
 * Models in the Qwen3/DeepSeek-R1 family write their chain of thought as
 * "<think>…</think>" before the answer. The parser recognizes "<think>"
 * only at the start of the output (after leading whitespace); when the
 * chat template already opened the block (the rendered prompt ends inside
 * "<think>"), the parser starts inside it. Everything up to "</think>" is
 * reasoning; what follows is content. Like the Qwen3 template, newlines
 * around the reasoning are stripped (reasoning.strip('\n')) and newlines
 * right after "</think>" are dropped (content.lstrip('\n')).
 *
 * Invariants: text that may still turn into a tag (a partial "<think>" at
 * the start, a partial "</think>", trailing newlines of the reasoning) is
 * held back, so the concatenation of released text does not depend on how
 * the input was fragmented. A disabled parser passes everything through as
 * content.
 */
#ifndef NS_API_REASONING_H
#define NS_API_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"
#include "util/status.h"

typedef enum {
    NS_REASON_START = 0, /* nothing but whitespace seen yet */
    NS_REASON_THINK,     /* inside <think> */
    NS_REASON_AFTER,     /* just after </think>: dropping newlines */
    NS_REASON_CONTENT    /* plain content from here on */
} ns_reason_state;

typedef struct ns_reason {
    ns_reason_state state;
    bool think_began;    /* a reasoning character was released */
    ns_buf hold;
} ns_reason;

/* enabled=false: pass-through. in_think: the prompt left a <think> open. */
void ns_reason_init(ns_reason *r, bool enabled, bool in_think);
void ns_reason_free(ns_reason *r);
ns_status ns_reason_feed(ns_reason *r, const char *text, size_t n, ns_buf *reasoning, ns_buf *content);
/* End of output: releases held text (a partial tag is reasoning or content
 * text; trailing reasoning newlines are dropped). */
ns_status ns_reason_flush(ns_reason *r, ns_buf *reasoning, ns_buf *content);

/* True when a rendered prompt ends inside an open <think> block. */
bool ns_reason_prompt_opens_think(const char *prompt, size_t n);

#endif
