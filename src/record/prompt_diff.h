/* prompt_diff.h — why a turn of a session did not reuse the previous
 * turn's cache (`nightshift check-prompts`).
 *
 * What the cache holds after turn P: P's prompt tokens followed by the
 * tokens P generated (record "output.ids"). Turn C is an append-only
 * extension when its prompt tokens start with all of those (without the
 * generated ids — an older recording, or a failed turn — with P's prompt
 * tokens). Otherwise C diverges at token d (the common prefix), and every
 * prompt token of C from d on is prefilled again: that is the break's
 * cost (prefill_tokens = n(C) - d; lost_tokens = how many of the reusable
 * tokens were lost, n(ref) - d).
 *
 * Why, from the conversations (lists of chat messages: session.h), the
 * tools and P's output, each as one reason (several may apply):
 *   SYSTEM_CHANGED      the first (system) message differs, or was added
 *                       or removed; detail: the differing text
 *   TOOLS_CHANGED       the tools differ; detail: added/removed/changed names
 *   MESSAGE_EDITED      message N differs from the same message in P (or P's
 *                       answer differs from what P generated); detail: diff
 *   MESSAGE_REMOVED     C has fewer of P's messages (history truncated)
 *   REASONING_STRIPPED  an assistant message lost its reasoning (the
 *                       reasoning_content P had, or P generated)
 *   WHITESPACE_TRIMMED  an assistant message equals the original except for
 *                       leading/trailing whitespace (Qwen Code trims the
 *                       previous answer's leading spaces)
 *   TEMPLATE_RERENDER   the messages are append-only, yet the rendered
 *                       prompt differs before the new part: the template
 *                       renders earlier turns differently once more follow
 *                       (detail: the rendered text around the divergence)
 * Reasons are looked for only when the turn broke (an edit that renders
 * to the same tokens costs nothing and is not reported). A broken turn
 * with none of the message-level reasons gets TEMPLATE_RERENDER — also
 * when the divergence is inside the previous answer because its text
 * re-tokenizes differently from the tokens generated.
 *
 * Ownership: ns_pdiff_result owns its reasons and detail strings
 * (ns_pdiff_result_free). Inputs are borrowed.
 */
#ifndef NS_RECORD_PROMPT_DIFF_H
#define NS_RECORD_PROMPT_DIFF_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    NS_PDIFF_SYSTEM_CHANGED = 0,
    NS_PDIFF_TOOLS_CHANGED,
    NS_PDIFF_MESSAGE_EDITED,
    NS_PDIFF_MESSAGE_REMOVED,
    NS_PDIFF_REASONING_STRIPPED,
    NS_PDIFF_WHITESPACE_TRIMMED,
    NS_PDIFF_TEMPLATE_RERENDER,
} ns_pdiff_kind;

/* One turn as the analysis sees it (all borrowed). */
typedef struct ns_pdiff_turn {
    const json_t *items;       /* the conversation: an array of chat messages */
    const json_t *tools;       /* the request's "tools" (NULL: none) */
    const char *out_content;   /* what the turn generated (NULL: unknown) */
    const char *out_reasoning; /* its reasoning ("" or NULL: none) */
    const int32_t *out_ids;    /* its generated ids (NULL: unknown) */
    size_t n_out_ids;
    const int32_t *ids;        /* the rendered prompt's tokens */
    size_t n_ids;
    const char *text;          /* the rendered prompt (for TEMPLATE_RERENDER's detail; may be NULL) */
} ns_pdiff_turn;

typedef struct ns_pdiff_reason {
    ns_pdiff_kind kind;
    int message;   /* the message index it concerns (-1: none) */
    char *detail;  /* owned */
} ns_pdiff_reason;

typedef struct ns_pdiff_result {
    bool append_only;       /* C starts with all reusable tokens of P */
    size_t reusable;        /* n(P's prompt) + n(its generated ids) */
    size_t diverge_at;      /* tokens in common with the reusable sequence */
    size_t prefill_tokens;  /* n(C) - diverge_at when broken, else 0 */
    size_t lost_tokens;     /* reusable - diverge_at when broken, else 0 */
    ns_pdiff_reason *reasons;
    int n_reasons;
} ns_pdiff_result;

/* Compares C against P. False only when out of memory. */
bool ns_pdiff_compare(const ns_pdiff_turn *p, const ns_pdiff_turn *c, ns_pdiff_result *out);
void ns_pdiff_result_free(ns_pdiff_result *r);
/* "system_prompt_changed", "tools_changed", "message_edited", ... */
const char *ns_pdiff_kind_name(ns_pdiff_kind k);

/* A short human-readable diff of two texts: the common prefix and suffix
 * cut to a little context, then -"old" +"new" (each middle cut to cap
 * bytes, on UTF-8 boundaries, escaped for one line). Owned by the caller. */
char *ns_pdiff_text_diff(const char *a, size_t na, const char *b, size_t nb, size_t cap);

#endif
