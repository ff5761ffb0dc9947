/* http_gate.h — the listener in front of libmicrohttpd: accepts every
 * connection, keeps the table of open connections (caps, request deadline,
 * eviction), and screens the head of each connection's first request
 * before libmicrohttpd sees a byte of it.
 *
 * Why. libmicrohttpd 0.9.75 answers a request it cannot parse itself, with
 * a fixed HTML body (400 for a malformed request line or header line, 505
 * for an unknown HTTP version, 400/413 for a bad Content-Length, 431 for a
 * head over its 128 KiB buffer) or by closing without a reply (a request
 * line without a space); no option changes those replies. So the gate
 * reads the head first, with MSG_PEEK (nothing is consumed: once the head
 * passes, the connection goes to libmicrohttpd through MHD_add_connection
 * and it reads the same bytes), and answers anything libmicrohttpd would
 * refuse in the one error shape (http_error.h): 400 bad_request, 414
 * uri_too_long, 431 header_too_large, 413 body_too_large, 501
 * unsupported_transfer_encoding, 505 http_version_not_supported. The check (ns_http_head_check) is stricter than
 * libmicrohttpd where the RFCs say a server must refuse (whitespace before
 * a header's colon, Content-Length and Transfer-Encoding together,
 * conflicting Content-Lengths, NUL or a bare CR in the head).
 *
 * What is not screened: later requests on a kept-alive connection (they
 * are read by libmicrohttpd alone; the limits of ns_http_head_check are
 * checked again by the server once the head is parsed, but a head
 * libmicrohttpd cannot parse gets its own reply there), and request bodies
 * (a malformed chunked body gets libmicrohttpd's 400).
 *
 * Cost. A connection being screened costs a descriptor and a record, never
 * a thread and never a buffer of its own: the gate's one thread peeks into
 * one scratch buffer of NS_HTTP_MAX_HEAD_BYTES. Re-peeking a head that
 * arrives in small pieces is bounded: below 4 KiB on every arrival, above
 * only when the queued bytes doubled or on the next tick (100 ms).
 *
 * Connection table. Every connection, screened or handed over, has one
 * ns_gate_conn from accept to close. Caps: at most max_conns in all (near
 * the cap, the connection waiting longest for a complete request is shut
 * down to make room; with none waiting, a new connection is answered 503
 * too_many_connections) and max_per_peer per client address (429
 * too_many_connections). Deadline: a request must be complete within
 * request_timeout_ms of the connection's start (or of the end of the
 * previous response: ns_gate_wait); past it a connection being screened
 * is closed and one libmicrohttpd owns is shut down, both without a reply
 * (such a client is usually not reading either).
 * Replies from the gate end with a lingering close: the gate stops
 * writing, drains what the client still sends for up to 2 s, then closes,
 * so the client reads the reply instead of a reset.
 *
 * Threads: the gate's own thread accepts, screens, reaps and evicts;
 * ns_gate_adopt/wait/closed are called from libmicrohttpd's threads; the
 * table is guarded by one mutex.
 */
#ifndef NS_HTTP_GATE_H
#define NS_HTTP_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "server/http_error.h"
#include "util/status.h"

#define NS_HTTP_MAX_URI_BYTES 8192         /* a longer request target: 414 */
#define NS_HTTP_MAX_HEADER_LINE_BYTES 8192 /* a longer header line: 431 */
#define NS_HTTP_MAX_HEAD_BYTES 32768       /* a longer head: 431 */

typedef enum { NS_HEAD_MORE, NS_HEAD_OK, NS_HEAD_BAD } ns_head_verdict;

/* Checks the start of a connection's input, p[0..n). NS_HEAD_MORE: no
 * complete head yet and nothing wrong so far; NS_HEAD_OK: a complete head
 * libmicrohttpd will parse, *head_len its length (leading blank lines
 * included); NS_HEAD_BAD: e is set (status, code, message). path (cap >=
 * 1) receives the request path when the request line got that far, else
 * "" (the error's shape follows from it). max_body: a Content-Length
 * above it is 413. */
ns_head_verdict ns_http_head_check(const char *p, size_t n, size_t max_body, size_t *head_len, ns_http_error *e,
                                   char *path, size_t path_cap);

typedef struct ns_gate ns_gate;
typedef struct ns_gate_conn ns_gate_conn;

typedef struct ns_gate_opts {
    int listen_fd;          /* bound, listening, non-blocking; owned by the gate from ns_gate_start on */
    unsigned max_conns;
    unsigned max_per_peer;  /* 0 = no cap */
    int64_t request_timeout_ms;
    size_t max_body;
    /* Hands a screened connection over; the callee owns fd afterwards
     * (even when it returns false: it closed it). Called on the gate's
     * thread without the table's lock. */
    bool (*handover)(void *ud, int fd, const struct sockaddr *sa, socklen_t len);
    void *ud;
} ns_gate_opts;

typedef struct ns_gate_counters {
    uint64_t open;      /* connections open now */
    uint64_t reaped;    /* closed for not completing a request in time */
    uint64_t evicted;   /* closed to make room near max_conns */
    uint64_t refused;   /* refused at accept (max_conns or max_per_peer) */
    uint64_t rejected;  /* heads answered by the gate with an error */
    uint64_t responses_4xx, responses_5xx; /* every answer the gate gave, refusals at accept included */
} ns_gate_counters;

/* On failure the listen socket is closed. */
ns_status ns_gate_start(const ns_gate_opts *o, ns_gate **out, ns_error *err);
/* Stops the thread, closes the listener and every connection not handed
 * over. Records of handed-over connections stay until ns_gate_closed. */
void ns_gate_stop(ns_gate *g);
/* Frees the gate (after ns_gate_stop and after libmicrohttpd closed every
 * connection). */
void ns_gate_free(ns_gate *g);

/* libmicrohttpd took fd (its connection-started notification): the record
 * handed over with it, to keep as the connection's socket context; NULL if
 * fd did not come from the gate. */
ns_gate_conn *ns_gate_adopt(ns_gate *g, int fd);
/* Starts (on=true: waiting for the next request) or stops (a complete
 * request is being answered) the request deadline. */
void ns_gate_wait(ns_gate *g, ns_gate_conn *c, bool on);
/* libmicrohttpd is about to close the connection: frees c. */
void ns_gate_closed(ns_gate *g, ns_gate_conn *c);
void ns_gate_get_counters(ns_gate *g, ns_gate_counters *c);

#endif
