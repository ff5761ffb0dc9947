/* http_client.h — a small HTTP/1.1 client over libcurl, for the tools that
 * drive a server over the network (`nightshift replay`, `nightshift bench`):
 * GET, or POST a body (JSON) with headers, and receive either
 *   - the whole response (status, Content-Type, body), or
 *   - a Server-Sent-Events stream, each event handed to a callback with the
 *     time it arrived (ns_clock_now seconds: what TTFT and decode rates are
 *     measured with), when the server answers text/event-stream.
 *
 * Contract:
 * - ns_hc_global_init() runs curl_global_init once per process (it is not
 *   thread-safe in libcurl itself, so it is behind a pthread_once);
 *   ns_hc_new calls it, so a caller need not, but a program that starts
 *   threads may call it first from main. There is no global cleanup: the
 *   process exit releases it (curl_global_cleanup is not thread-safe either).
 * - One ns_hc per thread: a handle (a curl easy handle that keeps its
 *   connection alive between requests) must never be used by two threads
 *   at once. Different handles may be used in parallel.
 * - Every response is capped: a body (or one SSE event, or the bytes of a
 *   stream in all) over opts.max_response_bytes ends the transfer with
 *   NS_ERR_NOMEM ("response too large"), so a misbehaving server cannot
 *   exhaust memory. Timeouts: connect, whole transfer, and idle (no byte
 *   for idle_timeout_s) end it with NS_ERR_IO and a message.
 * - A non-2xx status is not a transport failure: ns_hc_post returns NS_OK
 *   with resp.status set and the (error) body kept whole, also in SSE mode
 *   (an error answer is JSON, not a stream).
 * - The response (ns_hc_response) owns its body; ns_hc_response_free
 *   releases it. Strings passed in (url, headers, body) are borrowed for
 *   the call only.
 */
#ifndef NS_CLIENT_HTTP_CLIENT_H
#define NS_CLIENT_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

typedef struct ns_hc ns_hc;

typedef struct ns_hc_opts {
    double connect_timeout_s;  /* 0 = 10 s */
    double timeout_s;          /* whole transfer; 0 = no limit */
    double idle_timeout_s;     /* fail when no body byte arrives for this long (checked about once a
                                * second); 0 = 300 s. A whole (non-streamed) answer sends nothing
                                * until it is done: give it the whole limit. */
    size_t max_response_bytes; /* 0 = NS_HC_DEFAULT_MAX_RESPONSE */
} ns_hc_opts;

#define NS_HC_DEFAULT_MAX_RESPONSE ((size_t)64 << 20)

typedef struct ns_hc_response {
    long status;            /* HTTP status; 0 when no response arrived */
    char content_type[128]; /* "" when the server sent none */
    char *body;             /* whole body (NUL-terminated), or NULL for a stream delivered as events */
    size_t body_len;
    bool streamed;          /* the answer was text/event-stream and went to the callback */
    long n_events;          /* events delivered */
    double t_start;         /* ns_clock_now() when the request was started */
    double t_headers;       /* when the status line and headers had arrived (0: never) */
    double t_end;           /* when the transfer ended */
    char error[512];        /* transport failure, "" when none */
} ns_hc_response;

/* One SSE event: its "event:" name ("" when none), its data (the "data:"
 * lines joined with '\n', NUL-terminated; borrowed for the call only) and
 * the time the chunk that completed it arrived. Return false to stop the
 * transfer (ns_hc_post then returns NS_ERR_CANCELLED). Comments (": ...")
 * are not events. */
typedef bool (*ns_hc_event_fn)(void *ctx, const char *event, const char *data, size_t data_len, double t_arrival);

/* curl_global_init, once per process. NS_ERR_INTERNAL when it failed. */
ns_status ns_hc_global_init(void);

/* A handle for one thread (see the contract). NULL on failure (err set).
 * The caller owns it: ns_hc_free. */
ns_hc *ns_hc_new(ns_error *err);
void ns_hc_free(ns_hc *c);

/* POSTs body (body_len bytes; Content-Type application/json unless a
 * header says otherwise) to url with extra headers ("Name: value", a
 * NULL-terminated array, may be NULL). With on_event non-NULL and a
 * text/event-stream answer, the events go to on_event and resp->body
 * stays NULL; otherwise the whole body lands in resp->body. resp is
 * always initialized (free it with ns_hc_response_free, also on failure).
 * NS_OK when a response (of any status) arrived whole; NS_ERR_IO on a
 * transport failure or timeout; NS_ERR_NOMEM over the size cap;
 * NS_ERR_CANCELLED when on_event asked to stop. resp->error and err say
 * what happened. */
ns_status ns_hc_post(ns_hc *c, const char *url, const char *const *headers, const char *body, size_t body_len,
                     const ns_hc_opts *o, ns_hc_event_fn on_event, void *ctx, ns_hc_response *resp, ns_error *err);

/* GET url, the whole body into resp (same rules as ns_hc_post). */
ns_status ns_hc_get(ns_hc *c, const char *url, const char *const *headers, const ns_hc_opts *o, ns_hc_response *resp,
                    ns_error *err);

void ns_hc_response_free(ns_hc_response *resp);

/* The SSE parser ns_hc_post uses, exposed for tests: feed bytes in any
 * chunking, events are delivered to fn as they complete. Owns its line
 * buffers (capped at cap bytes per event); ns_hc_sse_free releases them. */
typedef struct ns_hc_sse {
    char *line;
    size_t line_len, line_alloc;
    char *data;
    size_t data_len, data_alloc;
    char event[64];
    bool have_data, skip_lf;
    size_t cap;
    ns_hc_event_fn fn;
    void *ctx;
    long n_events;
} ns_hc_sse;

void ns_hc_sse_init(ns_hc_sse *p, size_t cap, ns_hc_event_fn fn, void *ctx);
/* NS_ERR_NOMEM when an event passes the cap, NS_ERR_CANCELLED when fn
 * returned false. */
ns_status ns_hc_sse_feed(ns_hc_sse *p, const char *bytes, size_t n, double t_arrival);
void ns_hc_sse_free(ns_hc_sse *p);

#endif
