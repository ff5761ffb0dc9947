/* toolcall.h — incremental parser of tool calls in model output, and the
 * choice of format from a chat template.
 *
 * Formats:
 *  - NS_TOOLFMT_HERMES (Qwen2.5/Qwen3, Hermes): anywhere in the output,
 *      <tool_call>{"name": "f", "arguments": {...}}</tool_call>
 *    possibly several in a row; text around them is content.
 *  - NS_TOOLFMT_LLAMA_JSON (Llama 3.x): the whole output is one or more
 *      {"name": "f", "parameters": {...}}
 *    objects (optionally after <|python_tag|>, separated by ';').
 *  - NS_TOOLFMT_QWEN_XML (Qwen3-Coder, and the Qwen templates that copied
 *    its layout): anywhere in the output,
 *      <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
 *      ...</function>\n</tool_call>
 *    The <tool_call> wrapper may be missing (a bare <function=...> block,
 *    which these models also write). A value is the text between the tags,
 *    less the one leading and one trailing newline the template writes
 *    around it; it is typed by the tool's JSON schema (set_schemas): a
 *    parameter whose schema type is only "string" — or that has no schema,
 *    or whose tool has none — stays that text verbatim (the template
 *    prints strings raw); any other is parsed as JSON (Python's True /
 *    False / None accepted, as the template's `|string` prints them) and
 *    becomes a string when it does not parse or parses to a type the
 *    schema does not allow. The arguments are the JSON object text these
 *    values make, in order: "{" when the name commits, each parameter when
 *    it completes (string values already as they arrive), "}" at
 *    </function>.
 *    Both <tool_call> formats accept both bodies (JSON or <function=...>)
 *    after the tag, since Qwen-family models mix them.
 *  - NS_TOOLFMT_MISTRAL: after the [TOOL_CALLS] marker (content may come
 *    before it), either a JSON array of {"name", "arguments", "id"}
 *    objects (tokenizer v3) or one or more name-first calls
 *      [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}
 *    with an optional [CALL_ID]id between name and [ARGS] (v7+) or no
 *    [ARGS] at all (f{...}, v11). [TOOL_CALLS] is a special token in these
 *    tokenizers, so the detokenizer must keep special tokens' text for this
 *    format. Ids are 9 alphanumeric characters: the Mistral templates
 *    refuse any other id when the call comes back in the history.
 * "arguments" and "parameters" are synonyms in the JSON formats; arguments
 * may be an object or a JSON-encoded string.
 *
 * Streaming model (state + diff): the parser keeps the cumulative content
 * text and the list of calls; a streaming caller diffs them after each feed
 * (new content bytes, a call's name once it appears, new argument bytes).
 * Content and arguments only ever grow (a byte once there never changes),
 * and calls are never removed. A call is committed — it appears in `calls`
 * with its name — as soon as its name is complete (and names an offered
 * tool, when the caller gave the list); its arguments then grow as the
 * model writes them, so clients see the name first and the arguments
 * incrementally.
 *
 * Malformed input never fails: text that stops looking like a tool call
 * before the call is committed goes back to content verbatim. A committed
 * call that ends badly (truncated, arguments not a JSON object, XML tags
 * out of order) is marked !valid and what follows is content again; a
 * non-streaming caller then returns the whole output as content.
 *
 * Invariants: the input is consumed one byte at a time by a deterministic
 * automaton, and only complete decisions release text, so the final state
 * is identical however the input was fragmented. Whitespace between content
 * and calls is dropped once a call commits. Every buffer has a cap (64 MiB;
 * names and keys 256 bytes; NS_TOOL_MAX_CALLS calls): past it, text is
 * content or the call is invalid, never a failure.
 *
 * Threads: one parser belongs to one generation on one HTTP thread.
 */
#ifndef NS_API_TOOLCALL_H
#define NS_API_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/status.h"

typedef enum {
    NS_TOOLFMT_NONE = 0,
    NS_TOOLFMT_HERMES,
    NS_TOOLFMT_LLAMA_JSON,
    NS_TOOLFMT_QWEN_XML,
    NS_TOOLFMT_MISTRAL
} ns_toolfmt;

#define NS_TOOL_MAX_CALLS 128

typedef struct ns_tool_call {
    char id[32];   /* "call_" + 24 random characters; Mistral: 9 alphanumerics */
    ns_buf name;
    ns_buf args;   /* JSON text as the model wrote it (XML: as built from the parameters) */
    bool complete; /* the call's object closed */
    bool valid;    /* complete and args is a JSON object */
} ns_tool_call;

typedef struct ns_toolparse {
    ns_toolfmt fmt;
    char **names; /* offered tool names (copies); n_names == 0: any name */
    int n_names;
    json_t *schemas; /* {tool name: its "properties" object} (owned), or NULL */
    uint64_t rng;

    ns_buf content;       /* cumulative content */
    ns_tool_call *calls;  /* cumulative calls */
    int n_calls;
    size_t cap_calls;

    /* automaton */
    int mode, sub, ctx;
    char tag[16];         /* bytes of a tag being matched */
    int tagpos;
    ns_buf ws;            /* held whitespace in text mode */
    ns_buf raw;           /* text of the uncommitted call, for reverting */
    ns_buf key;           /* current object key / XML parameter name / call id */
    ns_buf val;           /* collected value (name, string args, XML value) */
    ns_buf pend_args;     /* arguments seen before the name */
    int val_target;       /* where the current value goes */
    int depth;
    bool in_str, esc, scalar, vstarted;
    bool have_name, have_args, args_pending_complete;
    bool cur_committed;
    bool drop_ws;         /* a call committed: drop blanks until text */
    /* XML parameters */
    unsigned pmask;       /* JSON types the parameter's schema allows (0: any) */
    bool pstream;         /* string parameter: streamed as it arrives */
    size_t val_sent;      /* bytes of val already in the arguments */
    int n_params;         /* parameters already in the arguments */
} ns_toolparse;

/* names may be NULL (any name accepted). seed feeds the id generator. */
ns_status ns_toolparse_init(ns_toolparse *p, ns_toolfmt fmt, const char *const *names, int n_names, uint64_t seed);
/* The request's tools, for typing XML parameter values: an array of
 * OpenAI chat tools ({"type": "function", "function": {"name",
 * "parameters"}}), Responses tools ({"type": "function", "name",
 * "parameters"}) or Anthropic tools ({"name", "input_schema"}); other
 * entries are skipped. The schemas are copied (tools stays the caller's).
 * Call before the first feed. NULL or not an array: no schemas (every XML
 * value is a string). NS_ERR_NOMEM only on allocation failure. */
ns_status ns_toolparse_set_schemas(ns_toolparse *p, const json_t *tools);
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

/* The format a chat template's model writes, from the template's text:
 * Qwen3-Coder XML (it prints <function=...> and <parameter=...>), Mistral
 * ([TOOL_CALLS]), Hermes (<tool_call>), else Llama 3 JSON. NULL: NONE. */
ns_toolfmt ns_toolfmt_detect(const char *template_src);
/* "hermes", "llama-json", "qwen-xml", "mistral" or "none". */
const char *ns_toolfmt_name(ns_toolfmt fmt);

#endif
