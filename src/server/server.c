/* server.c — libmicrohttpd listener, routing and response plumbing (see
 * server.h). */
#include "server/server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "util/log.h"

struct ns_server {
    struct MHD_Daemon *d;
    const ns_http_route *routes;
    int n_routes;
    void *ud;
    long long (*max_context_tokens)(void *ud);
    char *api_key;
    char *admin_key; /* NULL: admin routes are guarded by api_key */
    size_t max_body;
    int port;
    atomic_int active;
    atomic_bool draining;
    atomic_uint_fast64_t n_req, n_2xx, n_4xx, n_5xx, n_gone;
};

/* Per-request state, kept in MHD's con_cls across handler calls. */
typedef struct req_state {
    ns_buf body;
    bool too_big;
} req_state;

/* Streaming wrapper handed to MHD_create_response_from_callback. */
typedef struct stream_state {
    ns_server *srv;
    ns_http_stream s;
    ns_buf pending;
    size_t off;
    bool eof, completed, failed;
} stream_state;

bool ns_http_client_gone(const ns_http_conn *c) {
    if (c->fd < 0) return false;
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        /* readable: either a pipelined request (alive) or EOF (gone) */
        char b;
        ssize_t r = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0;
    }
    return false;
}

const char *ns_http_header(const ns_http_conn *c, const char *name) {
    if (!c->mc) return NULL;
    return MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, name);
}

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

static void count_status(ns_server *s, int status) {
    if (status == 499) atomic_fetch_add(&s->n_gone, 1);
    else if (status < 300) atomic_fetch_add(&s->n_2xx, 1);
    else if (status < 500) atomic_fetch_add(&s->n_4xx, 1);
    else atomic_fetch_add(&s->n_5xx, 1);
}

/* Headers every response carries (buffers, errors and streams alike). */
static void add_common_headers(ns_server *s, struct MHD_Response *resp) {
    if (!s->max_context_tokens) return;
    long long v = s->max_context_tokens(s->ud);
    if (v < 0) return;
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    MHD_add_response_header(resp, "X-Nightshift-Max-Context-Tokens", num);
}

static enum MHD_Result queue_buffer(ns_server *s, struct MHD_Connection *mc, int status, const char *ctype,
                                    char *body, size_t len, int retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_common_headers(s, resp);
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

/* Renders e through the one error formatter, and logs it: client errors
 * at INFO (what an agent got wrong is worth seeing), server errors at
 * WARN, 503s (loading, draining) and 499s (client gone) at DEBUG. */
static enum MHD_Result queue_error(ns_server *s, struct MHD_Connection *mc, ns_http_error *e, int retry_after) {
    size_t len = 0;
    char *body = ns_http_error_json(e, &len);
    int status = e->status;
    if (status == 503 || status == 499) NS_DEBUG("http: %d %s", status, e->message);
    else if (status >= 500) NS_WARN("http: %d %s", status, e->message);
    else NS_INFO("http: %d %s%s%s%s", status, e->message, e->param[0] ? " [param " : "", e->param, e->param[0] ? "]" : "");
    ns_http_error_clear(e);
    if (!body) return MHD_NO;
    return queue_buffer(s, mc, status, "application/json", body, len, retry_after);
}

static enum MHD_Result queue_simple_error(ns_server *s, struct MHD_Connection *mc, int status, const char *param,
                                          const char *code, const char *msg) {
    ns_http_error e = {0};
    ns_http_error_set(&e, status, param, code, "%s", msg);
    return queue_error(s, mc, &e, 0);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_state *st = cls;
    while (st->off >= st->pending.len) {
        if (st->eof) {
            st->completed = true;
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        ns_buf_reset(&st->pending);
        st->off = 0;
        ns_status rc = st->s.next(st->s.ctx, &st->pending, &st->eof);
        if (rc != NS_OK) {
            st->failed = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = st->pending.len - st->off;
    if (n > max) n = max;
    memcpy(buf, st->pending.data + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_state *st = cls;
    if (!st->completed) atomic_fetch_add(&st->srv->n_gone, 1);
    if (st->s.close) st->s.close(st->s.ctx, st->completed);
    ns_buf_free(&st->pending);
    free(st);
}

static enum MHD_Result queue_stream(ns_server *s, struct MHD_Connection *mc, ns_http_response *r) {
    stream_state *st = calloc(1, sizeof *st);
    if (!st) {
        r->stream.close(r->stream.ctx, false);
        return MHD_NO;
    }
    st->srv = s;
    st->s = r->stream;
    ns_buf_init(&st->pending, 0);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                                                  stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type ? r->content_type : "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_common_headers(s, resp);
    int status = r->status ? r->status : 200;
    count_status(s, status);
    enum MHD_Result ok = MHD_queue_response(mc, (unsigned)status, resp);
    MHD_destroy_response(resp); /* MHD keeps its own reference; frees st later */
    return ok;
}

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
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && strncasecmp(h, "Bearer ", 7) == 0) return key_equal(h + 7, key);
    const char *x = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key");
    return x && key_equal(x, key);
}

static enum MHD_Result dispatch(ns_server *s, struct MHD_Connection *mc, const char *url, const char *method,
                                req_state *rs) {
    const ns_http_route *route = NULL;
    bool path_known = false;
    for (int i = 0; i < s->n_routes; i++) {
        if (strcmp(s->routes[i].path, url) != 0) continue;
        path_known = true;
        if (strcmp(s->routes[i].method, method) == 0) {
            route = &s->routes[i];
            break;
        }
    }
    if (!route) {
        if (path_known)
            return queue_simple_error(s, mc, 405, NULL, "method_not_allowed", "method not allowed for this path");
        char msg[256];
        snprintf(msg, sizeof msg, "unknown endpoint %s %.160s", method, url);
        return queue_simple_error(s, mc, 404, NULL, "not_found", msg);
    }
    if (route->admin) {
        if (!authorized(s->admin_key ? s->admin_key : s->api_key, mc))
            return queue_simple_error(s, mc, 401, NULL, "invalid_api_key", "Incorrect or missing admin key.");
    } else if (!route->open && !authorized(s->api_key, mc)) {
        return queue_simple_error(s, mc, 401, NULL, "invalid_api_key", "Incorrect or missing API key.");
    }
    if (atomic_load(&s->draining) && !route->open)
        return queue_simple_error(s, mc, 503, NULL, "shutting_down", "the server is shutting down");

    ns_http_request req = {.method = method, .path = url, .body = rs->body.data ? rs->body.data : "",
                           .body_len = rs->body.len};
    req.conn.mc = mc;
    req.conn.fd = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) req.conn.fd = ci->connect_fd;

    ns_http_response resp;
    memset(&resp, 0, sizeof resp);
    route->fn(s->ud, &req, &resp);
    if (resp.stream.next && !resp.err.status) {
        free(resp.body);
        return queue_stream(s, mc, &resp);
    }
    if (resp.stream.close) resp.stream.close(resp.stream.ctx, false);
    if (resp.err.status) {
        free(resp.body);
        return queue_error(s, mc, &resp.err, resp.retry_after_s);
    }
    char *body = resp.body ? resp.body : strdup("");
    if (!body) return MHD_NO;
    return queue_buffer(s, mc, resp.status ? resp.status : 200,
                        resp.content_type ? resp.content_type : "application/json", body,
                        resp.body ? resp.body_len : 0, resp.retry_after_s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    ns_server *s = cls;
    req_state *rs = *con_cls;
    if (!rs) {
        rs = calloc(1, sizeof *rs);
        if (!rs) return MHD_NO;
        ns_buf_init(&rs->body, s->max_body);
        *con_cls = rs;
        atomic_fetch_add(&s->active, 1);
        atomic_fetch_add(&s->n_req, 1);
        /* refuse an announced oversize body before reading it */
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->max_body) {
                rs->too_big = true;
                char msg[160];
                snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", s->max_body);
                return queue_simple_error(s, mc, 413, NULL, "body_too_large", msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rs->too_big && ns_buf_append(&rs->body, upload_data, *upload_data_size) != NS_OK) {
            rs->too_big = true; /* chunked upload past the cap: drain and refuse */
            ns_buf_free(&rs->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rs->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", s->max_body);
        return queue_simple_error(s, mc, 413, NULL, "body_too_large", msg);
    }
    return dispatch(s, mc, url, method, rs);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)mc;
    (void)toe;
    ns_server *s = cls;
    req_state *rs = *con_cls;
    if (!rs) return;
    ns_buf_free(&rs->body);
    free(rs);
    *con_cls = NULL;
    atomic_fetch_sub(&s->active, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    NS_DEBUG("microhttpd: %s", line);
}

ns_status ns_server_start(const ns_server_opts *o, const ns_http_route *routes, int n_routes, void *ud,
                          ns_server **out, ns_error *err) {
    *out = NULL;
    const char *host = o->host && *o->host ? o->host : "127.0.0.1";
    if (o->port < 0 || o->port > 65535) return ns_fail(err, NS_ERR_INVALID, "--port must be in [0, 65535]");
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gr = getaddrinfo(host, port, &hints, &ai);
    if (gr != 0 || !ai) return ns_fail(err, NS_ERR_INVALID, "--host %s: %s", host, gai_strerror(gr));

    ns_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    s->routes = routes;
    s->n_routes = n_routes;
    s->ud = ud;
    s->max_context_tokens = o->max_context_tokens;
    s->max_body = o->max_body_bytes ? o->max_body_bytes : (size_t)32 << 20;
    if ((o->api_key && *o->api_key && !(s->api_key = strdup(o->api_key))) ||
        (o->admin_key && *o->admin_key && !(s->admin_key = strdup(o->admin_key)))) {
        free(s->api_key);
        free(s);
        freeaddrinfo(ai);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_LIMIT, o->max_connections ? o->max_connections : 512u,
                            MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s ? o->timeout_s : 3600u,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 256u,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        int e = errno;
        free(s->api_key);
        free(s->admin_key);
        free(s);
        return ns_fail(err, NS_ERR_IO, "cannot listen on %s:%d: %s", host, o->port,
                       e ? strerror(e) : "microhttpd refused to start");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return NS_OK;
}

int ns_server_port(const ns_server *s) { return s->port; }

void ns_server_set_draining(ns_server *s) { atomic_store(&s->draining, true); }

void ns_server_quiesce(ns_server *s) {
    atomic_store(&s->draining, true);
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int ns_server_active(const ns_server *s) { return atomic_load(&((ns_server *)s)->active); }

void ns_server_stop(ns_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->d);
    free(s->api_key);
    free(s->admin_key);
    free(s);
}

void ns_server_get_counters(const ns_server *s, ns_server_counters *c) {
    ns_server *m = (ns_server *)s;
    c->requests = atomic_load(&m->n_req);
    c->responses_2xx = atomic_load(&m->n_2xx);
    c->responses_4xx = atomic_load(&m->n_4xx);
    c->responses_5xx = atomic_load(&m->n_5xx);
    c->disconnects = atomic_load(&m->n_gone);
}
