/* server.h — HTTP plumbing on libmicrohttpd: listener, routing, body caps,
 * API-key check, streaming responses and graceful shutdown.
 *
 * Threads: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a
 * handler may block — for a whole generation — without stalling other
 * clients. The server knows nothing about models: it reads the body (up to
 * max_body_bytes; more -> 413 before the handler runs), checks the API key,
 * finds the route (unknown path -> 404, wrong method -> 405) and calls the
 * handler, which fills an ns_http_response: a complete body, an error (the
 * server renders it through http_error.h, the one place errors get their
 * shape), or a stream.
 *
 * A stream's next() runs on the connection thread and may block; it should
 * poll ns_http_client_gone() while waiting so a disconnected client is
 * noticed even before the next write fails. close() runs exactly once,
 * with completed=false when the client went away or the write failed.
 *
 * Every response may carry X-Nightshift-Max-Context-Tokens, a number the
 * embedder supplies through opts.max_context_tokens (the server does not
 * know what it means).
 *
 * Shutdown: ns_server_quiesce stops accepting connections (in-flight ones
 * continue; new requests on kept-alive connections get 503 once draining is
 * set); ns_server_active counts requests still being answered;
 * ns_server_stop closes everything and joins the connection threads.
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

/* The client side of one request (copyable; valid during the request). */
typedef struct ns_http_conn {
    struct MHD_Connection *mc;
    int fd;
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
} ns_http_response;

typedef void (*ns_http_handler)(void *ud, const ns_http_request *req, ns_http_response *resp);

typedef struct ns_http_route {
    const char *method; /* "GET" / "POST" */
    const char *path;
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
    unsigned max_connections;  /* default 512 */
    unsigned timeout_s;        /* idle connection timeout; default 3600 */
    /* Optional: called (with the routes' ud) while building every
     * response — any route, errors, 404/401/413 and streams included — on
     * the connection thread; a value >= 0 is sent as the header
     * X-Nightshift-Max-Context-Tokens, a negative one omits it. Must be
     * thread-safe and cheap. */
    long long (*max_context_tokens)(void *ud);
} ns_server_opts;

typedef struct ns_server ns_server;

/* Routes and ud are borrowed and must outlive the server. */
ns_status ns_server_start(const ns_server_opts *o, const ns_http_route *routes, int n_routes, void *ud,
                          ns_server **out, ns_error *err);
int ns_server_port(const ns_server *s);
void ns_server_set_draining(ns_server *s);
void ns_server_quiesce(ns_server *s);
int ns_server_active(const ns_server *s);
void ns_server_stop(ns_server *s);

typedef struct ns_server_counters {
    uint64_t requests, responses_2xx, responses_4xx, responses_5xx, disconnects;
} ns_server_counters;
void ns_server_get_counters(const ns_server *s, ns_server_counters *c);

/* True when the peer closed its side of the connection. (A client that
 * half-closes after sending its request looks gone too; HTTP clients do
 * not do that.) Handlers answer a request whose client is gone with 499. */
bool ns_http_client_gone(const ns_http_conn *c);
/* A request header (NULL when absent). */
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
