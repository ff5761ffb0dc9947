/* toolcall.h — incremental parser of tool calls in model output.
 *
 * Formats:
 *  - NS_TOOLFMT_HERMES (Qwen2.5/Qwen3, Hermes): anywhere in the output,
 *      <tool_call>{"name": "f", "arguments": {...}}</tool_call>
 *    possibly several in a row; text around them is content.
 *  - NS_TOOLFMT_LLAMA_JSON (Llama 3.x): the whole output is one or more
 *      {"name": "f", "parameters": {...}}
 *    objects (optionally after <|python_tag|>, separated by ';').
 * "arguments" and "parameters" are synonyms in both formats; arguments may
 * be an object or a JSON-encoded string.
 *
 * Streaming model (state + diff): the parser keeps the cumulative content
 * text and the list of calls; a streaming caller diffs them after each feed
 * (new content bytes, a call's name once it appears, new argument bytes).
 * A call is committed — it appears in `calls` with its name — as soon as its
 * "name" value is complete (and names an offered tool, when the caller gave
 * the list); its arguments then grow as the model writes them, so clients
 * see the name first and the arguments incrementally.
 *
 * Malformed input never fails: text that stops looking like a tool call
 * before the call is committed goes back to content verbatim. A committed
 * call that ends badly (truncated, arguments not a JSON object) is marked
 * !valid; a non-streaming caller then returns the whole output as content.
 *
 * Invariants: the input is consumed one byte at a time by a deterministic
 * automaton, and only complete decisions release text, so the final state
 * is identical however the input was fragmented. Whitespace between content
 * and calls is dropped once a call commits.
 */
#ifndef NS_API_TOOLCALL_H
#define NS_API_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/status.h"

typedef enum { NS_TOOLFMT_NONE = 0, NS_TOOLFMT_HERMES, NS_TOOLFMT_LLAMA_JSON } ns_toolfmt;

#define NS_TOOL_MAX_CALLS 128

typedef struct ns_tool_call {
    char id[32];   /* "call_" + 24 random characters */
    ns_buf name;
    ns_buf args;   /* JSON text as the model wrote it */
    bool complete; /* the call's object closed */
    bool valid;    /* complete and args is a JSON object */
} ns_tool_call;

typedef struct ns_toolparse {
    ns_toolfmt fmt;
    char **names; /* offered tool names (copies); n_names == 0: any name */
    int n_names;
    uint64_t rng;

    ns_buf content;       /* cumulative content */
    ns_tool_call *calls;  /* cumulative calls */
    int n_calls;
    size_t cap_calls;

    /* automaton */
    int mode, sub;
    int tagpos;           /* chars of the current tag matched */
    ns_buf ws;            /* held whitespace in text mode */
    ns_buf raw;           /* text of the uncommitted call, for reverting */
    ns_buf key;           /* current object key */
    ns_buf val;           /* collected value (name, string args, skipped) */
    ns_buf pend_args;     /* arguments seen before the name */
    int val_target;       /* where the current value goes */
    int depth;
    bool in_str, esc, scalar;
    bool have_name, have_args, args_pending_complete;
    bool cur_committed;
    bool drop_ws;         /* a call committed: drop blanks until text */
} ns_toolparse;

/* names may be NULL (any name accepted). seed feeds the id generator. */
ns_status ns_toolparse_init(ns_toolparse *p, ns_toolfmt fmt, const char *const *names, int n_names, uint64_t seed);
void ns_toolparse_free(ns_toolparse *p);
ns_status ns_toolparse_feed(ns_toolparse *p, const char *text, size_t n);
/* End of output: reverts an uncommitted call to content, marks a committed
 * but unfinished one incomplete, releases held whitespace. */
ns_status ns_toolparse_finish(ns_toolparse *p);
/* Number of calls that are complete and valid. */
int ns_toolparse_n_valid(const ns_toolparse *p);
/* True when every committed call is valid (what a non-streaming response
 * needs to return tool_calls rather than the raw text). */
bool ns_toolparse_all_valid(const ns_toolparse *p);

#endif
