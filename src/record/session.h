/* session.h — reading a recording (serve --record) and grouping its
 * requests into sessions, for `nightshift replay` and
 * `nightshift check-prompts`.
 *
 * The grouping rule (documented in docs/record.md):
 *   A request's conversation is its list of messages: chat "messages";
 *   Anthropic "system" (as a first message) + "messages"; Responses
 *   "instructions" (as a first message) + "input" (a string is one user
 *   message); completions: the "prompt" string as a single item.
 *   1. A request whose conversation strictly extends the conversation of
 *      the last turn of an open session (that turn's items are a prefix of
 *      its items, and it has more; for completions, the last prompt is a
 *      string prefix of this one) is that session's next turn. When
 *      several sessions qualify, the one with the longest such prefix
 *      wins, then the most recent.
 *   2. Otherwise, a chat-style request whose first user message equals the
 *      first user message of an open session's last turn, and which has
 *      at least as many items as that turn, is that session's next turn
 *      (an edited history: a changed system prompt, a rewritten message,
 *      stripped reasoning -- the breaks check-prompts reports).
 *   3. Otherwise it starts a new session (so an edit of the first user
 *      message itself cannot be told from a new conversation).
 *   Requests are considered in arrival order ("t"); the endpoint must be
 *   the same within a session. Records without a request body (a 400 for
 *   a body that was not JSON) are skipped.
 *
 * Ownership: an ns_recording owns every record (the parsed lines) and
 * the session arrays; ns_recording_free releases them all.
 */
#ifndef NS_RECORD_SESSION_H
#define NS_RECORD_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

/* Caps: a recording line, the number of records. */
#define NS_RECORDING_MAX_LINE ((size_t)512 << 20)
#define NS_RECORDING_MAX_RECORDS 1000000

typedef enum { NS_REC_CHAT = 0, NS_REC_COMPLETIONS, NS_REC_MESSAGES, NS_REC_RESPONSES,
               NS_REC_OTHER } ns_rec_api;

typedef struct ns_rec_entry {
    json_t *rec;           /* the whole record (owned) */
    const json_t *body;    /* its "request" (borrowed from rec) */
    const char *endpoint;  /* borrowed from rec */
    ns_rec_api kind;
    double t;              /* arrival, unix seconds */
    double duration_s;     /* recorded; 0 when absent */
    bool redacted;
    json_t *items;         /* the conversation (owned array; see the rule) */
    int line;              /* 1-based record number in the file (blank lines not counted) */
    int session, turn;     /* after grouping */
} ns_rec_entry;

typedef struct ns_rec_session {
    int *idx;              /* entry indices, in order */
    int n;
} ns_rec_session;

typedef struct ns_recording {
    ns_rec_entry *e;       /* in arrival order */
    int n;
    ns_rec_session *s;
    int n_sessions;
    int n_skipped;         /* records without a body */
    bool any_redacted;
} ns_recording;

/* Reads a JSONL recording from path (a line that is not a JSON object is
 * an error naming its line), sorts by arrival and groups the sessions.
 * On failure *out is left empty (nothing to free). */
ns_status ns_recording_load(const char *path, ns_recording *out, ns_error *err);
/* The same from records already parsed (takes ownership of each recs[i],
 * also on failure); used by the loader and the unit tests. */
ns_status ns_recording_from(json_t **recs, int n, ns_recording *out, ns_error *err);
void ns_recording_free(ns_recording *r);

/* The API kind of an endpoint path ("/v1/chat/completions", ...). */
ns_rec_api ns_rec_api_of(const char *endpoint);
/* A request body's conversation items as a new array (see the rule);
 * NULL when the body has none of the known shapes. */
json_t *ns_session_items(const json_t *body, ns_rec_api kind);

#endif
