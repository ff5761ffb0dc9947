/* server.c — libmicrohttpd listener, connection model, request checks,
 * routing and response plumbing (see server.h). */
#include "server/server.h"

#include "server/http_gate.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "util/clock.h"
#include "util/log.h"

#define DEFAULT_MAX_CONNECTIONS 1024u
#define DEFAULT_TIMEOUT_S 300u
#define DEFAULT_REQUEST_TIMEOUT_S 30u
#define KEEPALIVE_MAX_S 15.0
#define MHD_POOL_BYTES ((size_t)128 << 10) /* libmicrohttpd's buffer per connection */
#define MAX_URI_BYTES NS_HTTP_MAX_URI_BYTES
#define MAX_HEADER_LINE_BYTES NS_HTTP_MAX_HEADER_LINE_BYTES
#define MAX_HEAD_BYTES NS_HTTP_MAX_HEAD_BYTES
#define MAX_DAEMONS 4
#define STREAM_BUFFER_DEFAULT ((size_t)4 << 20) /* unread stream bytes before the generation is cancelled */
#define STREAM_COMPACT_BYTES ((size_t)64 << 10)   /* the reader compacts a stream's buffer past this */
#define FD_RESERVE 128 /* descriptors kept for everything but connections */

typedef struct str_list {
    char **v;
    int n;
    bool any; /* "*" */
} str_list;

struct ns_server {
    /* libmicrohttpd daemons without listen sockets: the gate accepts and
     * hands connections to them in turn */
    struct MHD_Daemon *d[MAX_DAEMONS];
    unsigned n_daemons;
    atomic_uint next_daemon;
    ns_gate *gate;
    const ns_http_route *routes;
    int n_routes;
    void *ud;
    long long (*max_context_tokens)(void *ud);
    char *api_key;
    char *admin_key; /* NULL: admin routes are guarded by api_key */
    size_t max_body;
    int port;
    char host[256];
    bool ipv6, loopback;
    unsigned max_conns;
    int64_t request_timeout_ms;
    double keepalive_s;
    size_t stream_cap; /* unread bytes of one stream at most (see produce) */
    bool host_check;
    str_list hosts, origins;
    atomic_int active;
    atomic_bool draining, stopping;
    atomic_uint_fast64_t n_req, n_2xx, n_4xx, n_5xx, n_gone;
    atomic_uint_fast64_t n_job_ids; /* request ids of handler threads, for the log */

    /* handler threads */
    pthread_mutex_t jobs_mu;
    pthread_cond_t jobs_cv;
    int n_jobs;
};

/* A request handled off the event loop, and the stream it may produce.
 * Shared by the request (libmicrohttpd's con_cls), the handler thread and
 * the stream response; freed by the last of them. */
typedef struct ns_http_job ns_http_job;
struct ns_http_job {
    ns_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    struct MHD_Connection *mc; /* NULL once libmicrohttpd is done with the request */
    int fd;
    bool http10;
    const ns_http_route *route;
    char method[16];
    char *path;
    ns_buf body;
    ns_http_request req;
    ns_http_response resp;
    bool handled;   /* the handler returned; resp is set */
    bool queued;    /* resp was given to libmicrohttpd */
    bool suspended; /* the connection is suspended, waiting for this job */
    bool detached;  /* libmicrohttpd finished or closed the request */
    /* stream */
    ns_buf pending;
    size_t off;
    bool eof, failed, delivered;
    /* half-close */
    bool peer_eof, probe_sent, probe_due;
};

/* Per-request state, kept in libmicrohttpd's con_cls from the request line
 * (the URI log callback) to the end of the request. */
typedef struct req_state {
    size_t uri_len;
    bool checked; /* the head passed the checks; the body is being read */
    bool too_big;
    bool counted; /* counted in active */
    const ns_http_route *route;
    ns_buf body;
    struct ns_http_job *job;
} req_state;

/* ---------------- helpers for handlers ---------------- */

void ns_http_set_json(ns_http_response *r, int status, char *json_text) {
    free(r->body);
    r->status = status;
    r->content_type = "application/json";
    r->body = json_text;
    r->body_len = json_text ? strlen(json_text) : 0;
    if (!json_text) ns_http_error_set(&r->err, 500, NULL, "internal_error", "out of memory");
}

void ns_http_set_text(ns_http_response *r, int status, const char *content_type, const char *text) {
    free(r->body);
    r->status = status;
    r->content_type = content_type;
    r->body = strdup(text);
    r->body_len = r->body ? strlen(text) : 0;
    if (!r->body) ns_http_error_set(&r->err, 500, NULL, "internal_error", "out of memory");
}

ns_status ns_sse_json(ns_buf *out, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return NS_ERR_NOMEM;
    ns_status rc = ns_buf_puts(out, "data: ");
    if (rc == NS_OK) rc = ns_buf_puts(out, s);
    if (rc == NS_OK) rc = ns_buf_puts(out, "\n\n");
    free(s);
    return rc;
}

ns_status ns_sse_done(ns_buf *out) { return ns_buf_puts(out, "data: [DONE]\n\n"); }

ns_status ns_sse_error(ns_buf *out, ns_http_error *e) {
    size_t len = 0;
    char *s = ns_http_error_json(e, &len);
    ns_http_error_clear(e);
    if (!s) return NS_ERR_NOMEM;
    ns_status rc = ns_buf_puts(out, "data: ");
    if (rc == NS_OK) rc = ns_buf_append(out, s, len);
    if (rc == NS_OK) rc = ns_buf_puts(out, "\n\n");
    free(s);
    return rc;
}

ns_status ns_sse_keepalive(ns_buf *out) { return ns_buf_puts(out, ": keep-alive\n\n"); }

/* ---------------- the client side of a request ---------------- */

static const char k_probe[] = "HTTP/1.1 100 Continue\r\n\r\n";

bool ns_http_client_gone(const ns_http_conn *c) {
    ns_http_job *j = c->job;
    if (!j) return false; /* inline handlers answer at once */
    if (atomic_load(&j->srv->stopping)) return true;
    pthread_mutex_lock(&j->mu);
    /* j->mu held and not detached: libmicrohttpd has not closed the
     * descriptor (it detaches the job before it closes a connection) */
    bool gone = j->detached;
    if (!gone) {
        struct pollfd p = {.fd = j->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&p, 1, 0) > 0) {
            if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) {
                gone = true; /* reset, or both directions closed */
            } else if (p.revents & (POLLIN | POLLRDHUP)) {
                char b;
                ssize_t r = recv(j->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
                if (r == 0) j->peer_eof = true; /* > 0: a pipelined request */
                else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) gone = true;
            }
        }
    }
    if (!gone && j->peer_eof && !j->probe_sent) {
        /* the client finished sending: half-closed (still reading) or
         * closed? Only a write can tell; a closed client answers a reset */
        j->probe_sent = true;
        if (j->handled) {
            j->probe_due = true; /* a stream: its producer writes a keep-alive */
        } else if (j->http10) {
            /* HTTP/1.0 has no interim response to probe with (a 1xx would
             * be taken for the answer): a half-closed client still waits
             * for its answer, so the request goes on, and a client that
             * closed is noticed when the answer is written */
        } else {
            /* the handler runs with the connection suspended and nothing
             * sent yet: an interim response goes out before the answer */
            if (send(j->fd, k_probe, sizeof k_probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN &&
                errno != EWOULDBLOCK)
                gone = true;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return gone;
}

bool ns_http_client_probe_due(const ns_http_conn *c) {
    ns_http_job *j = c->job;
    if (!j) return false;
    pthread_mutex_lock(&j->mu);
    bool due = j->probe_due;
    j->probe_due = false;
    pthread_mutex_unlock(&j->mu);
    return due;
}

const char *ns_http_header(const ns_http_conn *c, const char *name) {
    if (!c->mc) return NULL;
    if (c->job) {
        pthread_mutex_lock(&c->job->mu);
        bool ok = !c->job->detached;
        pthread_mutex_unlock(&c->job->mu);
        if (!ok) return NULL;
    }
    return MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, name);
}

/* ---------------- names, hosts and origins ---------------- */

/* "Example.COM.:8080" -> "example.com"; "[::1]:80" -> "::1"; a bare IPv6
 * literal stays whole. False when empty or too long. */
static bool host_name(const char *h, char *out, size_t cap) {
    while (*h == ' ' || *h == '\t') h++;
    const char *start = h;
    size_t n;
    if (*h == '[') {
        const char *e = strchr(h, ']');
        if (!e) return false;
        start = h + 1;
        n = (size_t)(e - start);
    } else {
        const char *c = strchr(h, ':');
        n = c && !strchr(c + 1, ':') ? (size_t)(c - h) : strlen(h);
    }
    while (n && (start[n - 1] == '.' || start[n - 1] == ' ' || start[n - 1] == '\t')) n--;
    if (n == 0 || n >= cap) return false;
    for (size_t i = 0; i < n; i++) out[i] = (char)tolower((unsigned char)start[i]);
    out[n] = 0;
    return true;
}

static void str_list_free(str_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static bool str_list_add(str_list *l, const char *s) {
    char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
    if (!v) return false;
    l->v = v;
    if (!(l->v[l->n] = strdup(s))) return false;
    l->n++;
    return true;
}

static bool str_list_has(const str_list *l, const char *s) {
    for (int i = 0; i < l->n; i++)
        if (strcasecmp(l->v[i], s) == 0) return true;
    return false;
}

/* Splits a comma-separated list; hosts are normalized (host_name),
 * origins lowercased without a trailing '/'. */
static ns_status parse_list(const char *spec, bool hosts, str_list *l, const char *flag, ns_error *err) {
    if (!spec) return NS_OK;
    const char *p = spec;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char item[512];
        while (n && (*p == ' ' || *p == '\t')) p++, n--;
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n >= sizeof item) return ns_fail(err, NS_ERR_INVALID, "%s: an entry is too long", flag);
        memcpy(item, p, n);
        item[n] = 0;
        if (n) {
            char norm[512];
            if (strcmp(item, "*") == 0) {
                l->any = true;
            } else if (hosts) {
                if (!host_name(item, norm, sizeof norm))
                    return ns_fail(err, NS_ERR_INVALID, "%s: bad host '%s'", flag, item);
                if (!str_list_add(l, norm)) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
            } else {
                for (size_t i = 0; i <= n; i++) norm[i] = (char)tolower((unsigned char)item[i]);
                while (n && norm[n - 1] == '/') norm[--n] = 0;
                if (!strstr(norm, "://"))
                    return ns_fail(err, NS_ERR_INVALID, "%s: '%s' is not an origin (scheme://host[:port])", flag, item);
                if (!str_list_add(l, norm)) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
            }
        }
        if (!e) break;
        p = e + 1;
    }
    return NS_OK;
}

static bool sockaddr_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

static bool host_allowed(const ns_server *s, const char *host_hdr) {
    char h[256];
    if (!host_name(host_hdr, h, sizeof h)) return false;
    if (s->hosts.any || str_list_has(&s->hosts, h)) return true;
    return strcmp(h, "localhost") == 0 || strcmp(h, "127.0.0.1") == 0 || strcmp(h, "::1") == 0 ||
           strcmp(h, s->host) == 0;
}

/* An Origin in the CORS list (not merely the server's own). */
static bool origin_listed(const ns_server *s, const char *origin) {
    if (s->origins.any) return true;
    char o[512];
    size_t n = strlen(origin);
    if (n >= sizeof o) return false;
    for (size_t i = 0; i <= n; i++) o[i] = (char)tolower((unsigned char)origin[i]);
    while (n && o[n - 1] == '/') o[--n] = 0;
    return str_list_has(&s->origins, o);
}

/* The origin is the server itself: scheme://<the Host header>. */
static bool origin_same(const char *origin, const char *host_hdr) {
    const char *p = strstr(origin, "://");
    if (!p || !host_hdr) return false;
    p += 3;
    size_t n = strlen(p);
    while (n && p[n - 1] == '/') n--;
    return n == strlen(host_hdr) && strncasecmp(p, host_hdr, n) == 0;
}

/* ---------------- responses ---------------- */

static void count_status(ns_server *s, int status) {
    if (status == 499) atomic_fetch_add(&s->n_gone, 1);
    else if (status < 300) atomic_fetch_add(&s->n_2xx, 1);
    else if (status < 500) atomic_fetch_add(&s->n_4xx, 1);
    else atomic_fetch_add(&s->n_5xx, 1);
}

static const char *lookup(struct MHD_Connection *mc, const char *name) {
    return MHD_lookup_connection_value(mc, MHD_HEADER_KIND, name);
}

/* Headers every response carries (buffers, errors and streams alike). */
static void add_common_headers(ns_server *s, struct MHD_Connection *mc, struct MHD_Response *resp) {
    if (s->max_context_tokens) {
        long long v = s->max_context_tokens(s->ud);
        if (v >= 0) {
            char num[32];
            snprintf(num, sizeof num, "%lld", v);
            MHD_add_response_header(resp, "X-Nightshift-Max-Context-Tokens", num);
        }
    }
    const char *origin = s->origins.n || s->origins.any ? lookup(mc, "Origin") : NULL;
    if (origin && origin_listed(s, origin)) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(resp, "Vary", "Origin");
        MHD_add_response_header(resp, "Access-Control-Expose-Headers",
                                "X-Nightshift-Max-Context-Tokens, Retry-After");
    }
}

/* The handler's extra headers ("Name: value" lines; see server.h). A
 * line that is not printable ASCII or has no ": " is skipped. */
static void add_extra_headers(struct MHD_Response *resp, const char *h) {
    while (h && *h) {
        const char *end = strchr(h, '\n');
        size_t n = end ? (size_t)(end - h) : strlen(h);
        char line[1024];
        if (n < sizeof line) {
            memcpy(line, h, n);
            line[n] = 0;
            bool ok = true;
            for (size_t i = 0; i < n; i++) ok &= line[i] >= 0x20 && line[i] < 0x7f;
            char *sep = ok ? strstr(line, ": ") : NULL;
            if (sep && sep > line) {
                *sep = 0;
                MHD_add_response_header(resp, line, sep + 2);
            }
        }
        h = end ? end + 1 : NULL;
    }
}

static enum MHD_Result queue_buffer_h(ns_server *s, struct MHD_Connection *mc, int status, const char *ctype,
                                      char *body, size_t len, int retry_after, const char *headers);
static enum MHD_Result queue_buffer(ns_server *s, struct MHD_Connection *mc, int status, const char *ctype,
                                    char *body, size_t len, int retry_after) {
    return queue_buffer_h(s, mc, status, ctype, body, len, retry_after, NULL);
}

static enum MHD_Result queue_buffer_h(ns_server *s, struct MHD_Connection *mc, int status, const char *ctype,
                                      char *body, size_t len, int retry_after, const char *headers) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_common_headers(s, mc, resp);
    add_extra_headers(resp, headers);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (atomic_load(&s->draining)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    count_status(s, status);
    enum MHD_Result r = MHD_queue_response(mc, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

/* Renders e through the one error formatter in the shape of path's API
 * (Anthropic's under /v1/messages, even for a refusal before any handler
 * runs), and logs it: client errors
 * at INFO (what an agent got wrong is worth seeing), server errors at
 * WARN, 503s (loading, draining) and 499s (client gone) at DEBUG. */
static enum MHD_Result queue_error(ns_server *s, struct MHD_Connection *mc, const char *path, ns_http_error *e,
                                   int retry_after) {
    size_t len = 0;
    char *body = ns_http_error_json_shaped(e, ns_http_error_shape_of(path), &len);
    int status = e->status;
    if (status == 503 || status == 499) NS_DEBUG("http: %d %s", status, e->message);
    else if (status >= 500) NS_WARN("http: %d %s", status, e->message);
    else NS_INFO("http: %d %s%s%s%s", status, e->message, e->param[0] ? " [param " : "", e->param, e->param[0] ? "]" : "");
    ns_http_error_clear(e);
    if (!body) return MHD_NO;
    return queue_buffer(s, mc, status, "application/json", body, len, retry_after);
}

static enum MHD_Result queue_simple_error(ns_server *s, struct MHD_Connection *mc, const char *path, int status,
                                          const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result queue_simple_error(ns_server *s, struct MHD_Connection *mc, const char *path, int status,
                                          const char *code, const char *fmt, ...) {
    ns_http_error e = {0};
    char msg[sizeof e.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ns_http_error_set(&e, status, NULL, code, "%s", msg);
    return queue_error(s, mc, path, &e, 0);
}

/* ---------------- connections: the gate's records ---------------- */

static ns_gate_conn *conn_of(struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Starts (or, with on=false, stops) the wait for a complete request. */
static void conn_deadline(ns_server *s, struct MHD_Connection *mc, bool on) {
    ns_gate_wait(s->gate, conn_of(mc), on);
}

/* The gate screened a connection's first head: one of the daemons takes
 * it (and closes it, should it refuse). */
static bool handover(void *ud, int fd, const struct sockaddr *sa, socklen_t len) {
    ns_server *s = ud;
    unsigned i = atomic_fetch_add(&s->next_daemon, 1) % s->n_daemons;
    return MHD_add_connection(s->d[i], fd, sa, len) == MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    ns_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? ns_gate_adopt(s->gate, ci->connect_fd) : NULL;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        /* called before libmicrohttpd closes the descriptor */
        ns_gate_closed(s->gate, *socket_context);
        *socket_context = NULL;
    }
}

/* ---------------- jobs: handlers off the event loop ---------------- */

static void job_unref(ns_http_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    ns_http_response *r = &j->resp;
    if (!j->queued) {
        free(r->body);
        ns_http_error_clear(&r->err);
        if (r->stream.close) r->stream.close(r->stream.ctx, false);
    }
    ns_buf_free(&j->body);
    ns_buf_free(&j->pending);
    free(j->path);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Resumes the connection if it waits for this job (j->mu held). */
static void job_wake(ns_http_job *j) {
    if (j->suspended && j->mc) {
        j->suspended = false;
        MHD_resume_connection(j->mc);
    }
    pthread_cond_broadcast(&j->cv);
}

/* libmicrohttpd's content reader for a stream: hands out what the producer
 * appended; with nothing there yet, suspends the connection until it
 * appends (returning 0 without suspending would spin). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ns_http_job *j = cls;
    ssize_t ret;
    pthread_mutex_lock(&j->mu);
    size_t avail = j->pending.len - j->off;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, j->pending.data + j->off, n);
        j->off += n;
        if (j->off == j->pending.len) {
            ns_buf_reset(&j->pending);
            j->off = 0;
        } else if (j->off >= STREAM_COMPACT_BYTES && j->off * 2 >= j->pending.len) {
            /* a client that reads, but never all of it: what it read goes,
             * or the buffer would keep the whole stream */
            memmove(j->pending.data, j->pending.data + j->off, j->pending.len - j->off);
            j->pending.len -= j->off;
            j->off = 0;
        }
        pthread_cond_broadcast(&j->cv); /* room for a waiting producer */
        ret = (ssize_t)n;
    } else if (j->eof) {
        j->delivered = true;
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else if (j->failed || !j->mc) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
        j->suspended = true;
        MHD_suspend_connection(j->mc);
        ret = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return ret;
}

static void stream_response_free(void *cls) {
    ns_http_job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool delivered = j->delivered;
    pthread_mutex_unlock(&j->mu);
    if (!delivered) atomic_fetch_add(&j->srv->n_gone, 1);
    job_unref(j);
}

/* Runs the stream's next() until the end, the client's departure, the
 * server's stop, or a client that stopped reading, feeding the reader.
 * The producer never waits for the client: a stalled reader would hold
 * this thread (and its generation) until the connection timed out. When
 * more than stream_cap bytes are unread (queued here or in the socket's
 * send queue, which the kernel grows to megabytes), the generation is cancelled (the
 * scheduler keeps its committed KV pages in the cache) and this thread
 * ends. What was produced is still delivered as the client reads: from
 * this buffer (the connection, a descriptor and no thread, lives under
 * --timeout while it holds bytes) and then from the socket's send queue,
 * which the kernel keeps after the close. The stream ends without its
 * terminator, so the client sees it was cut. */
static void produce(ns_http_job *j) {
    ns_server *s = j->srv;
    ns_http_stream *st = &j->resp.stream;
    ns_buf chunk;
    ns_buf_init(&chunk, 0);
    ns_status rc = NS_OK;
    bool eof = false;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t unread = j->pending.len - j->off;
        int outq = 0; /* bytes in the socket's send queue: the kernel buffers for a stalled client too */
        if (!j->detached && ioctl(j->fd, SIOCOUTQ, &outq) == 0 && outq > 0) unread += (size_t)outq;
        bool stop = j->detached || atomic_load(&s->stopping);
        pthread_mutex_unlock(&j->mu);
        if (!stop && unread > s->stream_cap) {
            NS_WARN("http: the client stopped reading its stream (%zu bytes unread, --stream-buffer %zu): "
                    "generation cancelled; what was produced is still delivered if it reads",
                    unread, s->stream_cap);
            stop = true;
        }
        if (stop) {
            rc = NS_ERR_CANCELLED;
            break;
        }
        ns_buf_reset(&chunk);
        rc = st->next(st->ctx, &chunk, &eof);
        pthread_mutex_lock(&j->mu);
        if (rc == NS_OK && chunk.len) rc = ns_buf_append(&j->pending, chunk.data, chunk.len);
        if (rc != NS_OK) j->failed = true;
        else if (eof) j->eof = true;
        job_wake(j);
        pthread_mutex_unlock(&j->mu);
        if (rc != NS_OK || eof) break;
    }
    ns_buf_free(&chunk);
    if (rc != NS_OK) {
        /* the connection ends without the rest (a resumed reader ends it) */
        pthread_mutex_lock(&j->mu);
        j->failed = true;
        job_wake(j);
        pthread_mutex_unlock(&j->mu);
    }
    st->close(st->ctx, rc == NS_OK);
    st->close = NULL;
}

static void *job_main(void *arg) {
    ns_http_job *j = arg;
    ns_server *s = j->srv;
    /* a request id on every line this thread logs (a handler may set a
     * more telling one, e.g. the completion id) */
    ns_log_set_context("http %llu", (unsigned long long)atomic_fetch_add(&s->n_job_ids, 1) + 1);
    if (!j->handled) {
        ns_http_response r;
        memset(&r, 0, sizeof r);
        j->route->fn(s->ud, &j->req, &r);
        pthread_mutex_lock(&j->mu);
        j->resp = r;
        j->handled = true;
        job_wake(j);
        pthread_mutex_unlock(&j->mu);
    }
    if (j->resp.stream.next && !j->resp.err.status) produce(j);
    ns_log_clear_context();
    job_unref(j);
    pthread_mutex_lock(&s->jobs_mu);
    if (--s->n_jobs == 0) pthread_cond_broadcast(&s->jobs_cv);
    pthread_mutex_unlock(&s->jobs_mu);
    return NULL;
}

static ns_http_job *job_new(ns_server *s, struct MHD_Connection *mc, const ns_http_route *route, const char *method,
                            const char *url, const char *version, req_state *rs) {
    ns_http_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (!(j->path = strdup(url))) {
        free(j);
        return NULL;
    }
    j->srv = s;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1; /* the request's */
    j->mc = mc;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->http10 = version && strcmp(version, MHD_HTTP_VERSION_1_0) == 0;
    j->route = route;
    snprintf(j->method, sizeof j->method, "%s", method);
    j->body = rs->body; /* the job owns the body from here */
    memset(&rs->body, 0, sizeof rs->body);
    ns_buf_init(&j->pending, 0);
    j->req.method = j->method;
    j->req.path = j->path;
    j->req.body = j->body.data ? j->body.data : "";
    j->req.body_len = j->body.len;
    j->req.conn.mc = mc;
    j->req.conn.fd = j->fd;
    j->req.conn.keepalive_s = s->keepalive_s;
    j->req.conn.job = j;
    rs->job = j;
    return j;
}

/* Starts a thread for j (taking a reference for it); the connection is
 * suspended until the handler (or the first bytes of a stream) is ready. */
static bool job_spawn(ns_server *s, ns_http_job *j, bool suspend) {
    pthread_mutex_lock(&s->jobs_mu);
    s->n_jobs++;
    pthread_mutex_unlock(&s->jobs_mu);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_t th;
    bool ok = pthread_create(&th, &attr, job_main, j) == 0;
    if (ok && suspend) {
        /* the thread resumes the connection under j->mu, so only after this */
        j->suspended = true;
        MHD_suspend_connection(j->mc);
    }
    if (!ok) j->refs--;
    pthread_mutex_unlock(&j->mu);
    pthread_attr_destroy(&attr);
    if (!ok) {
        pthread_mutex_lock(&s->jobs_mu);
        if (--s->n_jobs == 0) pthread_cond_broadcast(&s->jobs_cv);
        pthread_mutex_unlock(&s->jobs_mu);
    }
    return ok;
}

static enum MHD_Result queue_stream(ns_server *s, struct MHD_Connection *mc, ns_http_job *j) {
    ns_http_response *r = &j->resp;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, j, stream_response_free);
    if (!resp) return MHD_NO;
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the response's, released by stream_response_free */
    pthread_mutex_unlock(&j->mu);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type ? r->content_type : "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_common_headers(s, mc, resp);
    add_extra_headers(resp, r->headers);
    int status = r->status ? r->status : 200;
    count_status(s, status);
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)status, resp);
    MHD_destroy_response(resp); /* libmicrohttpd keeps its own reference */
    return ok;
}

/* Queues what the handler produced (on the event loop). A stream goes on
 * being produced by its thread (a handler run inline gets one now). */
static enum MHD_Result queue_result(ns_server *s, struct MHD_Connection *mc, ns_http_job *j, bool need_thread) {
    ns_http_response *r = &j->resp;
    j->queued = true;
    if (r->stream.next && !r->err.status) {
        free(r->body);
        r->body = NULL;
        if (need_thread && !job_spawn(s, j, false)) {
            j->queued = false; /* job_unref closes the stream */
            return queue_simple_error(s, mc, j->path, 503, "overloaded", "cannot start a thread for the response");
        }
        return queue_stream(s, mc, j);
    }
    if (r->stream.close) r->stream.close(r->stream.ctx, false);
    r->stream.close = NULL;
    if (r->err.status) {
        free(r->body);
        r->body = NULL;
        return queue_error(s, mc, j->path, &r->err, r->retry_after_s);
    }
    char *body = r->body ? r->body : strdup("");
    size_t len = r->body ? r->body_len : 0;
    r->body = NULL;
    if (!body) return MHD_NO;
    return queue_buffer_h(s, mc, r->status ? r->status : 200, r->content_type ? r->content_type : "application/json",
                          body, len, r->retry_after_s, r->headers);
}

/* ---------------- the request path ---------------- */

/* Constant-time comparison so the key cannot be guessed byte by byte. */
static bool key_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < nb; i++) d |= (unsigned char)(a[i % (na ? na : 1)] ^ b[i]);
    return d == 0 && na == nb;
}

/* The request carries key (as a bearer token or x-api-key); true when no
 * key is required. */
static bool authorized(const char *key, struct MHD_Connection *mc) {
    if (!key) return true;
    const char *h = lookup(mc, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && strncasecmp(h, "Bearer ", 7) == 0) return key_equal(h + 7, key);
    const char *x = lookup(mc, "x-api-key");
    return x && key_equal(x, key);
}

typedef struct head_scan {
    size_t longest;
} head_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    head_scan *h = cls;
    size_t n = strlen(key) + (value ? strlen(value) : 0) + 2;
    if (n > h->longest) h->longest = n;
    return MHD_YES;
}

/* application/json, with or without parameters ("; charset=utf-8"). */
static bool is_json_type(const char *ct) {
    while (*ct == ' ' || *ct == '\t') ct++;
    static const char want[] = "application/json";
    if (strncasecmp(ct, want, sizeof want - 1) != 0) return false;
    const char *p = ct + sizeof want - 1;
    while (*p == ' ' || *p == '\t') p++;
    return *p == 0 || *p == ';';
}

static enum MHD_Result preflight(ns_server *s, struct MHD_Connection *mc) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_common_headers(s, mc, resp);
    const char *origin = lookup(mc, "Origin");
    if (origin && !(s->origins.n || s->origins.any)) /* the server's own origin */
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const char *want = lookup(mc, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            want && strlen(want) < 1024 ? want : "Authorization, Content-Type, X-Api-Key");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    count_status(s, 204);
    enum MHD_Result r = MHD_queue_response(mc, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    return r;
}

/* A route path ending in a slash and a star matches every longer path
 * under it (/v1/models/{id}); any other matches exactly. */
static bool route_matches(const char *route, const char *url) {
    const size_t n = strlen(route);
    if (n >= 2 && route[n - 1] == '*' && route[n - 2] == '/')
        return strncmp(route, url, n - 1) == 0 && url[n - 1] != 0;
    return strcmp(route, url) == 0;
}

/* Everything that can be decided from the head, before the body is read
 * (see server.h for the order). Returns MHD_YES with rs->checked set to go
 * on; otherwise a response was queued (or the connection fails). */
static enum MHD_Result check_head(ns_server *s, struct MHD_Connection *mc, const char *url, const char *method,
                                  req_state *rs) {
    if (rs->uri_len > MAX_URI_BYTES)
        return queue_simple_error(s, mc, url, 414, "uri_too_long", "the request URI is longer than %d bytes",
                                  MAX_URI_BYTES);
    head_scan hs = {0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, scan_header, &hs);
    if (hs.longest > MAX_HEADER_LINE_BYTES)
        return queue_simple_error(s, mc, url, 431, "header_too_large", "a request header line is longer than %d bytes",
                                  MAX_HEADER_LINE_BYTES);
    const union MHD_ConnectionInfo *hi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (hi && hi->header_size > MAX_HEAD_BYTES)
        return queue_simple_error(s, mc, url, 431, "header_too_large", "the request head is longer than %d bytes",
                                  MAX_HEAD_BYTES);
    const char *host = lookup(mc, MHD_HTTP_HEADER_HOST);
    if (s->host_check && host && !host_allowed(s, host))
        return queue_simple_error(s, mc, url, 403, "host_not_allowed",
                                  "Host '%.200s' is not allowed: this server answers only requests addressed to "
                                  "localhost, 127.0.0.1, [::1] or --allowed-hosts (DNS rebinding protection)",
                                  host);
    const char *origin = lookup(mc, "Origin");
    if (origin && !origin_listed(s, origin) && !origin_same(origin, host))
        return queue_simple_error(s, mc, url, 403, "origin_not_allowed",
                                  "cross-origin request from '%.200s' refused; allow the origin with --cors-origins",
                                  origin);
    if (origin && strcmp(method, "OPTIONS") == 0 && lookup(mc, "Access-Control-Request-Method"))
        return preflight(s, mc);
    /* refuse an announced oversize body before reading it */
    const char *cl = lookup(mc, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (errno || end == cl || v > s->max_body)
            return queue_simple_error(s, mc, url, 413, "body_too_large", "request body exceeds the limit of %zu bytes",
                                      s->max_body);
    }
    const ns_http_route *route = NULL;
    bool path_known = false;
    for (int i = 0; i < s->n_routes; i++) {
        if (!route_matches(s->routes[i].path, url)) continue;
        path_known = true;
        if (strcmp(s->routes[i].method, method) == 0) {
            route = &s->routes[i];
            break;
        }
    }
    if (!route) {
        /* with a key configured, an unauthenticated client learns nothing
         * about which paths exist: 401 before 404/405 (open paths such as
         * /health are public anyway) */
        bool open_path = false;
        for (int i = 0; i < s->n_routes; i++) open_path |= s->routes[i].open && route_matches(s->routes[i].path, url);
        if (!open_path && s->api_key && !authorized(s->api_key, mc) && !(s->admin_key && authorized(s->admin_key, mc)))
            return queue_simple_error(s, mc, url, 401, "invalid_api_key", "Incorrect or missing API key.");
        if (path_known)
            return queue_simple_error(s, mc, url, 405, "method_not_allowed", "method not allowed for this path");
        return queue_simple_error(s, mc, url, 404, "not_found", "unknown endpoint %.32s %.160s", method, url);
    }
    if (route->admin) {
        if (!authorized(s->admin_key ? s->admin_key : s->api_key, mc))
            return queue_simple_error(s, mc, url, 401, "invalid_api_key", "Incorrect or missing admin key.");
    } else if (!route->open && !authorized(s->api_key, mc)) {
        return queue_simple_error(s, mc, url, 401, "invalid_api_key", "Incorrect or missing API key.");
    }
    if (atomic_load(&s->draining) && !route->open)
        return queue_simple_error(s, mc, url, 503, "shutting_down", "the server is shutting down");
    if (strcmp(method, "POST") == 0) {
        const char *ct = lookup(mc, MHD_HTTP_HEADER_CONTENT_TYPE);
        if (ct && !is_json_type(ct))
            return queue_simple_error(s, mc, url, 415, "unsupported_media_type",
                                      "Content-Type must be application/json (got '%.100s'); with curl, add "
                                      "-H 'Content-Type: application/json'",
                                      ct);
    }
    rs->route = route;
    rs->checked = true;
    return MHD_YES;
}

/* The request is complete: answer inline (GET) or on a thread. */
static enum MHD_Result dispatch(ns_server *s, struct MHD_Connection *mc, const char *url, const char *method,
                                const char *version, req_state *rs) {
    conn_deadline(s, mc, false); /* complete: no deadline while it is answered */
    ns_http_job *j = job_new(s, mc, rs->route, method, url, version, rs);
    if (!j) return queue_simple_error(s, mc, url, 500, "internal_error", "out of memory");
    if (strcmp(rs->route->method, "GET") == 0) {
        memset(&j->resp, 0, sizeof j->resp);
        ns_http_request req = j->req;
        req.conn.job = NULL; /* nothing to poll: it answers at once */
        rs->route->fn(s->ud, &req, &j->resp);
        j->handled = true;
        return queue_result(s, mc, j, true);
    }
    if (!job_spawn(s, j, true))
        return queue_simple_error(s, mc, url, 503, "overloaded", "cannot start a thread for the request");
    return MHD_YES;
}

/* libmicrohttpd's URI log callback: the request line is in; its return
 * value becomes con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc) {
    (void)cls;
    (void)mc;
    req_state *rs = calloc(1, sizeof *rs);
    if (rs) rs->uri_len = uri ? strlen(uri) : 0;
    return rs;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    ns_server *s = cls;
    req_state *rs = *con_cls;
    if (!rs) {
        if (!(rs = calloc(1, sizeof *rs))) return MHD_NO;
        *con_cls = rs;
    }
    if (rs->job) {
        /* resumed: the handler is done (a spurious call queues nothing) */
        ns_http_job *j = rs->job;
        pthread_mutex_lock(&j->mu);
        bool ready = j->handled && !j->queued;
        pthread_mutex_unlock(&j->mu);
        return ready ? queue_result(s, mc, j, false) : MHD_YES;
    }
    if (!rs->checked) {
        /* the head is complete */
        rs->counted = true;
        atomic_fetch_add(&s->active, 1);
        atomic_fetch_add(&s->n_req, 1);
        ns_buf_init(&rs->body, s->max_body);
        return check_head(s, mc, url, method, rs);
    }
    if (*upload_data_size) {
        if (!rs->too_big && ns_buf_append(&rs->body, upload_data, *upload_data_size) != NS_OK) {
            rs->too_big = true; /* chunked upload past the cap: drain and refuse */
            ns_buf_free(&rs->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rs->too_big)
        return queue_simple_error(s, mc, url, 413, "body_too_large", "request body exceeds the limit of %zu bytes",
                                  s->max_body);
    return dispatch(s, mc, url, method, version, rs);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    ns_server *s = cls;
    req_state *rs = *con_cls;
    /* a kept-alive connection now waits for its next request */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !atomic_load(&s->stopping)) conn_deadline(s, mc, true);
    if (!rs) return;
    if (rs->job) {
        /* before libmicrohttpd closes the descriptor: the job stops using it */
        ns_http_job *j = rs->job;
        pthread_mutex_lock(&j->mu);
        j->detached = true;
        j->mc = NULL;
        j->suspended = false;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
    }
    ns_buf_free(&rs->body);
    if (rs->counted) atomic_fetch_sub(&s->active, 1);
    free(rs);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    NS_DEBUG("microhttpd: %s", line);
}

/* ---------------- start / stop ---------------- */

/* Raises the descriptor limit to its hard limit; returns how many
 * connections it leaves room for. */
static unsigned fd_room(unsigned want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return want;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t cur = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = cur;
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)want + FD_RESERVE) return want;
    return rl.rlim_cur > 2 * FD_RESERVE ? (unsigned)(rl.rlim_cur - FD_RESERVE) : (unsigned)(rl.rlim_cur / 2);
}

static void server_free(ns_server *s) {
    free(s->api_key);
    free(s->admin_key);
    str_list_free(&s->hosts);
    str_list_free(&s->origins);
    pthread_mutex_destroy(&s->jobs_mu);
    pthread_cond_destroy(&s->jobs_cv);
    free(s);
}

/* The listening socket (as libmicrohttpd would make it: SO_REUSEADDR,
 * IPv6 only on an IPv6 address, non-blocking); -1 with errno on failure.
 * *port gets the bound port (for --port 0). */
static int listen_socket(const struct addrinfo *ai, unsigned max_conns, int *port) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    int backlog = max_conns < 256 ? 256 : max_conns > 4096 ? 4096 : (int)max_conns;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* The event loops: libmicrohttpd daemons without a listen socket (the
 * gate accepts), one epoll thread each. False when one failed to start. */
static bool start_daemons(ns_server *s, unsigned timeout_s) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->n_daemons = ncpu >= 4 ? MAX_DAEMONS : 2;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    for (unsigned i = 0; i < s->n_daemons; i++) {
        /* caps are the gate's (it counts every connection of every daemon) */
        s->d[i] = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                   /* first, so that no message of the option parsing escapes it */
                                   MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                   MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                   MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                   MHD_OPTION_CONNECTION_LIMIT, s->max_conns,
                                   MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT, MHD_POOL_BYTES,
                                   MHD_OPTION_END);
        if (!s->d[i]) return false;
    }
    return true;
}

static void stop_daemons(ns_server *s) {
    for (unsigned i = 0; i < s->n_daemons; i++)
        if (s->d[i]) MHD_stop_daemon(s->d[i]);
    memset(s->d, 0, sizeof s->d);
}

ns_status ns_server_start(const ns_server_opts *o, const ns_http_route *routes, int n_routes, void *ud,
                          ns_server **out, ns_error *err) {
    *out = NULL;
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535) return ns_fail(err, NS_ERR_INVALID, "--port must be in [0, 65535]");
    ns_server *s = calloc(1, sizeof *s);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->jobs_mu, NULL);
    pthread_cond_init(&s->jobs_cv, NULL);
    ns_status prc = parse_list(o->allowed_hosts, true, &s->hosts, "--allowed-hosts", err);
    if (prc == NS_OK) prc = parse_list(o->cors_origins, false, &s->origins, "--cors-origins", err);
    if (prc != NS_OK) {
        server_free(s);
        return prc;
    }
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gr = getaddrinfo(host, port, &hints, &ai);
    if (gr != 0 || !ai) {
        server_free(s);
        return ns_fail(err, NS_ERR_INVALID, "--host %s: %s", host, gai_strerror(gr));
    }
    s->routes = routes;
    s->n_routes = n_routes;
    s->ud = ud;
    s->max_context_tokens = o->max_context_tokens;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : (size_t)32 << 20;
    s->ipv6 = ai->ai_family == AF_INET6;
    s->loopback = sockaddr_loopback(ai->ai_addr);
    if (!host_name(host, s->host, sizeof s->host)) snprintf(s->host, sizeof s->host, "%s", host);
    s->host_check = (o->check_host && s->loopback) || s->hosts.n || s->hosts.any;
    unsigned timeout_s = o->timeout_s ? o->timeout_s : DEFAULT_TIMEOUT_S;
    s->keepalive_s = timeout_s / 3.0 < KEEPALIVE_MAX_S ? timeout_s / 3.0 : KEEPALIVE_MAX_S;
    s->stream_cap = o->stream_buffer_bytes ? o->stream_buffer_bytes : STREAM_BUFFER_DEFAULT;
    s->request_timeout_ms = 1000 * (int64_t)(o->request_timeout_s ? o->request_timeout_s : DEFAULT_REQUEST_TIMEOUT_S);
    unsigned want = o->max_connections ? o->max_connections : DEFAULT_MAX_CONNECTIONS;
    s->max_conns = fd_room(want);
    if (s->max_conns < want)
        NS_WARN("http: the open-file limit leaves room for %u connections, not %u: --max-connections is %u "
                "(raise 'ulimit -n')", s->max_conns, want, s->max_conns);
    if ((o->api_key && *o->api_key && !(s->api_key = strdup(o->api_key))) ||
        (o->admin_key && *o->admin_key && !(s->admin_key = strdup(o->admin_key)))) {
        server_free(s);
        freeaddrinfo(ai);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    int lfd = listen_socket(ai, s->max_conns, &s->port);
    int lerr = errno;
    freeaddrinfo(ai);
    if (lfd < 0) {
        server_free(s);
        return ns_fail(err, NS_ERR_IO, "cannot listen on %s:%d: %s", host, o->port, strerror(lerr));
    }
    if (!start_daemons(s, timeout_s)) {
        close(lfd);
        stop_daemons(s);
        server_free(s);
        return ns_fail(err, NS_ERR_IO, "cannot start libmicrohttpd");
    }
    ns_gate_opts go = {.listen_fd = lfd, .max_conns = s->max_conns,
                       .max_per_peer = o->max_connections_per_peer,
                       .request_timeout_ms = s->request_timeout_ms, .max_body = s->max_body,
                       .handover = handover, .ud = s};
    ns_status grc = ns_gate_start(&go, &s->gate, err);
    if (grc != NS_OK) {
        stop_daemons(s);
        server_free(s);
        return grc;
    }
    *out = s;
    return NS_OK;
}

int ns_server_port(const ns_server *s) { return s->port; }

bool ns_server_is_loopback(const ns_server *s) { return s->loopback; }

void ns_server_url(const ns_server *s, char *out, size_t cap) {
    bool brackets = strchr(s->host, ':') != NULL;
    snprintf(out, cap, "http://%s%s%s:%d", brackets ? "[" : "", s->host, brackets ? "]" : "", s->port);
}

void ns_server_set_draining(ns_server *s) { atomic_store(&s->draining, true); }

/* The listener stays open: /health answers 503 shutting_down. */
void ns_server_quiesce(ns_server *s) { ns_server_set_draining(s); }

int ns_server_active(const ns_server *s) { return atomic_load(&((ns_server *)s)->active); }

void ns_server_stop(ns_server *s) {
    if (!s) return;
    atomic_store(&s->draining, true);
    atomic_store(&s->stopping, true); /* streams stop producing; clients count as gone */
    pthread_mutex_lock(&s->jobs_mu);
    while (s->n_jobs > 0) pthread_cond_wait(&s->jobs_cv, &s->jobs_mu);
    pthread_mutex_unlock(&s->jobs_mu);
    ns_gate_stop(s->gate); /* no new connections; those being screened close */
    stop_daemons(s);       /* libmicrohttpd closes the rest (ns_gate_closed) */
    ns_gate_free(s->gate);
    server_free(s);
}

void ns_server_get_counters(const ns_server *s, ns_server_counters *c) {
    ns_server *m = (ns_server *)s;
    c->requests = atomic_load(&m->n_req);
    c->responses_2xx = atomic_load(&m->n_2xx);
    c->responses_4xx = atomic_load(&m->n_4xx);
    c->responses_5xx = atomic_load(&m->n_5xx);
    c->disconnects = atomic_load(&m->n_gone);
    ns_gate_counters g;
    ns_gate_get_counters(m->gate, &g);
    c->requests += g.rejected; /* heads the gate refused never reach libmicrohttpd */
    c->responses_4xx += g.responses_4xx;
    c->responses_5xx += g.responses_5xx;
    c->connections_open = g.open;
    c->request_timeouts = g.reaped;
    c->evictions = g.evicted;
}
