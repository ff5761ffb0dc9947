/* server.h — HTTP plumbing on libmicrohttpd: listener, connection limits
 * and deadlines, request checks (size limits, Host, Origin/CORS,
 * Content-Type), routing, API-key check, streaming responses and graceful
 * shutdown.
 *
 * Connection model. All socket I/O is event-driven. The gate
 * (http_gate.h, one thread) owns the listening socket: it accepts, applies
 * the connection caps and the request deadline, and screens the head of
 * each connection's first request (peeked, not consumed) so that a request
 * libmicrohttpd would answer with its own HTML page gets an error in the
 * one shape instead. A screened connection goes to one of 2-4 libmicrohttpd
 * daemons (MHD_USE_NO_LISTEN_SOCKET + MHD_add_connection, each an epoll
 * loop on its own thread), which read request heads and bodies and write
 * responses. A connection that sends nothing, sends half a request, or
 * stops reading costs a file descriptor and its buffer, never a thread.
 *
 * Handlers run in one of two places:
 *   - GET routes run inline on the event loop. They must not block: they
 *     read state (/health, /v1/models, /v1/capacity, /metrics, /admin/cache).
 *   - Every other route (the POST routes parse bodies, render templates,
 *     tokenize and generate, which blocks for a whole generation) runs on a
 *     thread of its own, started once the request is complete, within the
 *     limits, authorized and routed. Its connection is suspended
 *     (MHD_suspend_connection) while the handler runs and resumed when it
 *     returns; the event loop goes on serving every other connection.
 * A stream (SSE) is produced on that same thread: it calls next() (which
 * may block on the request's event channel) and appends to a buffer; the
 * producer never waits for the client. A client that stops reading lets
 * the buffer grow to stream_buffer_bytes (default 4 MiB); past that its
 * generation is cancelled (its committed KV pages stay cached), the warning
 * is logged once, and the thread ends. What was produced is still
 * delivered as the client reads: bytes left in the server's buffer keep the
 * connection (a descriptor, no thread) under the timeout_s idle limit; once
 * they are in the socket, the connection is closed and the kernel keeps
 * sending its send queue on its own. The stream ends without its
 * terminator, so the client can tell it was cut. libmicrohttpd
 * drains the buffer through a content-reader callback which, when the buffer
 * is empty, suspends the connection and returns 0 ("no data yet"); the
 * producer resumes it when it appends or ends. (Returning 0 without
 * suspending would spin in internal-thread mode.) Why a thread per admitted
 * request and not a fully event-driven pump: the scheduler's event channel
 * (ns_request_poll) is a condition variable, not a pollable descriptor; a
 * thread waits on it as designed, and only a complete, checked request gets
 * one, for as long as its generation runs.
 *
 * Deadlines. A request must arrive complete (head and body) within
 * request_timeout_s of the connection's start, or of the end of the
 * previous response on a kept-alive connection; the gate closes
 * connections past the deadline, without a reply (one libmicrohttpd holds
 * is shut down with shutdown(2) and libmicrohttpd closes it). A complete request has no deadline: a queued or
 * running generation lives as long as it needs. timeout_s is the idle limit
 * of a connection the server is writing to (libmicrohttpd's inactivity
 * timeout; a suspended connection, waiting for its handler or its stream's
 * next bytes, never times out). Streams send a keep-alive comment at least
 * every keepalive_s = min(15 s, timeout_s / 3) (ns_http_conn.keepalive_s),
 * so a client or proxy with the same idle limit never sees a silent stream.
 *
 * Limits (the gate's). At most max_connections connections (RLIMIT_NOFILE
 * is raised to its hard limit to match; if that is still too low,
 * max_connections is cut and a warning says so). When nearly all are taken
 * (the last 1/16), each new connection shuts down the connection that has
 * been waiting longest for a complete request, so an idle crowd cannot lock
 * out /health; with none waiting, a new connection is answered 503
 * too_many_connections. max_connections_per_peer caps the connections of
 * one client address (429 too_many_connections). The head limits are
 * answered in the one error shape, by the gate for a first request and
 * again here once libmicrohttpd parsed a later one: a request URI over
 * 8 KiB -> 414 uri_too_long; a header line over 8 KiB or a head over
 * 32 KiB -> 431 header_too_large (libmicrohttpd's own buffer is 128 KiB).
 * What is left to libmicrohttpd's own replies: a later request on a
 * kept-alive connection that it cannot parse, and a malformed chunked
 * body (see http_gate.h).
 *
 * Request checks, in order, as soon as the head is complete (before the body
 * is read): 414/431 sizes; the Host header (when check_host is set and the
 * server listens on a loopback address, or allowed_hosts is given: Host must
 * be localhost, 127.0.0.1, [::1], the --host value or an allowed_hosts entry,
 * any port; else 403 host_not_allowed, against DNS rebinding; a request
 * without Host passes); the Origin header (a request carrying Origin comes
 * from a browser: it passes only when the origin is in cors_origins or is
 * the server's own, else 403 origin_not_allowed; an allowed origin gets
 * Access-Control-Allow-Origin on every response, and OPTIONS preflights get
 * 204); 413 for a Content-Length over max_body_bytes; the route (unknown
 * path 404, wrong method 405); the API key (401); 503 shutting_down while
 * draining (routes marked open still run); for POST, Content-Type must be
 * absent or application/json (parameters allowed), else 415
 * unsupported_media_type: the types a browser can send without a preflight
 * (text/plain, application/x-www-form-urlencoded, multipart/form-data) are
 * refused with the rest. Then the body is read (a chunked upload past the
 * cap: 413) and the handler runs. A handler fills an ns_http_response: a
 * complete body, an error (rendered through http_error.h, the one place
 * errors get their shape), or a stream.
 *
 * A stream's next() should poll ns_http_client_gone() while it waits, so a
 * client that went away is noticed before a write fails, and send a
 * keep-alive when ns_http_client_probe_due() says so. close() runs exactly
 * once, on the producing thread, with completed=false when the client went
 * away, a write failed or the server stopped.
 *
 * Every response may carry X-Nightshift-Max-Context-Tokens, a number the
 * embedder supplies through opts.max_context_tokens (the server does not
 * know what it means).
 *
 * Shutdown: ns_server_quiesce (= ns_server_set_draining) makes new requests
 * on routes not marked open answer 503 shutting_down with Connection: close;
 * the listener stays open, so /health can say "shutting_down" (503) instead
 * of refusing connections. ns_server_active counts requests being answered
 * (complete ones; a connection still sending its request is not counted);
 * ns_server_stop waits for the handler threads (streams stop producing),
 * then closes everything.
 */
#ifndef NS_SERVER_H
#define NS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/http_error.h"
#include "util/buf.h"
#include "util/status.h"

struct MHD_Connection;
struct ns_http_job;

/* The client side of one request (copyable; valid during the request). */
typedef struct ns_http_conn {
    struct MHD_Connection *mc;
    int fd;
    double keepalive_s;      /* a stream sends a keep-alive after this long without output; 0 = its default */
    struct ns_http_job *job; /* server-internal; NULL for handlers run inline */
} ns_http_conn;

typedef struct ns_http_request {
    const char *method;
    const char *path;      /* without the query string */
    const char *body;      /* NUL-terminated ("" when none) */
    size_t body_len;
    ns_http_conn conn;
} ns_http_request;

typedef struct ns_http_stream {
    void *ctx;
    /* Appends the next bytes to out, blocking until there are some; sets
     * *eof when the body is complete. A failure aborts the connection. */
    ns_status (*next)(void *ctx, ns_buf *out, bool *eof);
    /* Releases ctx; completed=false when the client did not get it all. */
    void (*close)(void *ctx, bool completed);
} ns_http_stream;

typedef struct ns_http_response {
    int status;               /* 200 when left 0 */
    const char *content_type; /* static string; "application/json" if NULL */
    char *body;               /* malloc'd, freed by the server */
    size_t body_len;
    ns_http_stream stream;    /* used when stream.next is set */
    ns_http_error err;        /* used when err.status is set */
    int retry_after_s;        /* > 0: Retry-After header */
    /* Extra headers of a body or a stream (not of an error): "Name: value"
     * lines joined by '\n', printable ASCII only (a line that is not is
     * skipped, so a value can never split the head); "" = none. */
    char headers[512];
} ns_http_response;

typedef void (*ns_http_handler)(void *ud, const ns_http_request *req, ns_http_response *resp);

typedef struct ns_http_route {
    const char *method; /* "GET" (runs on the event loop: must not block) / "POST" (own thread) */
    const char *path;   /* exact; or ending in a slash and a star: every longer path under it */
    ns_http_handler fn;
    bool open;          /* reachable without the API key (/health) */
    bool admin;         /* an admin route: needs the admin key if one is set, else the API key */
} ns_http_route;

typedef struct ns_server_opts {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0 = any free port */
    const char *api_key;       /* NULL = no authentication */
    const char *admin_key;     /* NULL = admin routes take the API key */
    size_t max_body_bytes;     /* default 32 MiB */
    unsigned max_connections;  /* default 1024 */
    unsigned max_connections_per_peer; /* 0 = no per-address cap */
    unsigned timeout_s;        /* idle limit of a connection being written to; default 300 */
    unsigned request_timeout_s; /* a request must arrive complete within this; default 30 */
    size_t stream_buffer_bytes; /* unread bytes of a stream before its generation is cancelled; default 4 MiB */
    bool check_host;           /* check Host when listening on loopback (serve sets it) */
    const char *allowed_hosts; /* comma-separated extra Host names ("*" = any); also
                                * turns the check on for a non-loopback address */
    const char *cors_origins;  /* comma-separated origins allowed cross-origin ("*" = any); NULL = none */
    /* Optional: called (with the routes' ud) while building every
     * response — any route, errors, 404/401/413 and streams included — on
     * the event loop; a value >= 0 is sent as the header
     * X-Nightshift-Max-Context-Tokens, a negative one omits it. Must be
     * thread-safe, cheap and non-blocking. */
    long long (*max_context_tokens)(void *ud);
} ns_server_opts;

typedef struct ns_server ns_server;

/* Routes and ud are borrowed and must outlive the server. */
ns_status ns_server_start(const ns_server_opts *o, const ns_http_route *routes, int n_routes, void *ud,
                          ns_server **out, ns_error *err);
int ns_server_port(const ns_server *s);
/* "http://127.0.0.1:8080", "http://[::]:8080" (IPv6 literals bracketed). */
void ns_server_url(const ns_server *s, char *out, size_t cap);
/* True when the listen address is a loopback address. */
bool ns_server_is_loopback(const ns_server *s);
void ns_server_set_draining(ns_server *s);
void ns_server_quiesce(ns_server *s);
int ns_server_active(const ns_server *s);
void ns_server_stop(ns_server *s);

typedef struct ns_server_counters {
    uint64_t requests, responses_2xx, responses_4xx, responses_5xx, disconnects;
    uint64_t connections_open;  /* now */
    uint64_t request_timeouts;  /* connections closed for not completing a request in time */
    uint64_t evictions;         /* waiting connections closed to make room near max_connections */
} ns_server_counters;
void ns_server_get_counters(const ns_server *s, ns_server_counters *c);

/* True when the client is gone: its connection was reset or failed, a
 * write to it failed, or the server closed it or is stopping. A client that
 * only shut down its sending side (half-close) is not gone; it still reads.
 * Only a write tells the two apart, so when the client's end of stream is
 * first seen, the server checks: while a handler answers a whole response on
 * HTTP/1.1 it sends an interim "100 Continue" (clients ignore an unexpected
 * 1xx); for a stream, ns_http_client_probe_due() asks the producer for a
 * keep-alive. A reset comes back from a closed client and the next call says
 * gone. HTTP/1.0 has no interim responses (a 1xx would be read as the
 * answer), so while a whole response to an HTTP/1.0 request is prepared the
 * client's end of stream is taken for a half-close: the request runs to its
 * end and a client that really closed is noticed only when the answer is
 * written (the work is lost, the client is not). Handlers answer a request
 * whose client is gone with 499. */
bool ns_http_client_gone(const ns_http_conn *c);
/* True once after ns_http_client_gone saw the client's end of stream during
 * a stream: write something (a keep-alive comment) now. */
bool ns_http_client_probe_due(const ns_http_conn *c);
/* A request header (NULL when absent); valid while the handler runs. */
const char *ns_http_header(const ns_http_conn *c, const char *name);

/* Server-sent events: "data: <compact json>\n\n" (steals j), the
 * terminating "data: [DONE]\n\n", an error event in the one error shape,
 * and a comment line that keeps idle proxies and clients from timing out. */
ns_status ns_sse_json(ns_buf *out, json_t *j);
ns_status ns_sse_done(ns_buf *out);
ns_status ns_sse_error(ns_buf *out, ns_http_error *e);
ns_status ns_sse_keepalive(ns_buf *out);

/* Helpers for handlers: a JSON body (takes ownership of a json_dumps text). */
void ns_http_set_json(ns_http_response *r, int status, char *json_text);
void ns_http_set_text(ns_http_response *r, int status, const char *content_type, const char *text);

#endif
