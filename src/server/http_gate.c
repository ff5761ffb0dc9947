/* http_gate.c — the listener in front of libmicrohttpd: accept, caps,
 * deadlines, and the screen of each connection's first request head (see
 * http_gate.h). */
#include "server/http_gate.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <netinet/in.h>

#include "util/clock.h"
#include "util/log.h"

#define TICK_MS 100
#define EAGER_PEEK_BYTES 4096          /* below this, a head is re-peeked on every arrival */
#define LINGER_MS 2000                 /* how long a refused client may go on sending */
#define LINGER_DRAIN_MAX ((size_t)1 << 20)
#define ACCEPT_BATCH 64

/* ---------------- the head check ---------------- */

static bool is_tchar(unsigned char c) {
    return c && (isalnum(c) || strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static ns_head_verdict bad(ns_http_error *e, int status, const char *code, const char *msg) {
    ns_http_error_set(e, status, NULL, code, "%s", msg);
    return NS_HEAD_BAD;
}

/* The next line from *i: [*start, *start + *len) without its CR LF (or bare
 * LF). 1 = a line; 0 = no line end yet; -1 = a NUL or a CR not followed by
 * LF (libmicrohttpd refuses the one and cuts the request at the other). */
static int next_line(const char *p, size_t n, size_t *i, size_t *start, size_t *len) {
    size_t s = *i;
    const char *lf = memchr(p + s, '\n', n - s);
    size_t end = lf ? (size_t)(lf - p) : n;
    for (size_t k = s; k < end; k++) {
        if (p[k] == 0) return -1;
        if (p[k] == '\r' && (k + 1 < end || (!lf && k + 1 < n))) return -1;
    }
    if (!lf) return 0;
    *start = s;
    *len = end - s - (end > s && p[end - 1] == '\r');
    *i = end + 1;
    return 1;
}

/* METHOD SP target SP HTTP/d.d; the path goes to path. */
static ns_head_verdict check_request_line(const char *s, size_t len, ns_http_error *e, char *path, size_t path_cap,
                                          bool *http10) {
    static const char k_shape[] = "malformed request line: expected 'METHOD /path HTTP/1.1'";
    if (len > NS_HTTP_MAX_URI_BYTES + 64) {
        /* as when it is still arriving: more bytes never turn a refusal
         * into an acceptance */
        ns_http_error_set(e, 414, NULL, "uri_too_long", "the request URI is longer than %d bytes",
                          NS_HTTP_MAX_URI_BYTES);
        return NS_HEAD_BAD;
    }
    size_t k = 0;
    while (k < len && is_tchar((unsigned char)s[k])) k++;
    if (k == 0 || k == len || s[k] != ' ') return bad(e, 400, "bad_request", k_shape);
    size_t t = k + 1, u = t;
    while (u < len && (unsigned char)s[u] > 0x20 && s[u] != 0x7f) u++;
    if (u == t) return bad(e, 400, "bad_request", k_shape);
    size_t plen = 0;
    while (t + plen < u && s[t + plen] != '?' && plen + 1 < path_cap) plen++;
    memcpy(path, s + t, plen);
    path[plen] = 0;
    if (u - t > NS_HTTP_MAX_URI_BYTES) {
        ns_http_error_set(e, 414, NULL, "uri_too_long", "the request URI is longer than %d bytes",
                          NS_HTTP_MAX_URI_BYTES);
        return NS_HEAD_BAD;
    }
    if (u == len) return bad(e, 400, "bad_request", "malformed request line: no HTTP version (HTTP/0.9 is not supported)");
    const char *v = s + u + 1;
    size_t vn = len - u - 1;
    if (s[u] != ' ' || vn != 8 || memcmp(v, "HTTP/", 5) != 0 || !isdigit((unsigned char)v[5]) || v[6] != '.' ||
        !isdigit((unsigned char)v[7]))
        return bad(e, 400, "bad_request", k_shape);
    if (v[5] != '1')
        return bad(e, 505, "http_version_not_supported", "HTTP version not supported: use HTTP/1.1 or HTTP/1.0");
    *http10 = v[7] == '0';
    return NS_HEAD_OK;
}

typedef struct framing {
    bool has_cl, has_te;
    unsigned long long cl;
} framing;

/* Content-Length and Transfer-Encoding: what libmicrohttpd would refuse
 * with its own page, and what the RFCs say a server must refuse. */
static ns_head_verdict check_framing(const char *name, size_t nlen, const char *val, size_t vlen, size_t max_body,
                                     framing *f, ns_http_error *e) {
    if (nlen == 14 && strncasecmp(name, "content-length", 14) == 0) {
        if (vlen == 0) return bad(e, 400, "bad_request", "invalid Content-Length: not a number");
        unsigned long long v = 0;
        bool over = false;
        for (size_t k = 0; k < vlen; k++) {
            if (!isdigit((unsigned char)val[k])) return bad(e, 400, "bad_request", "invalid Content-Length: not a number");
            if (v > (~0ull - 9) / 10) over = true;
            else v = v * 10 + (unsigned)(val[k] - '0');
        }
        if (over || v > max_body) {
            ns_http_error_set(e, 413, NULL, "body_too_large", "request body exceeds the limit of %zu bytes", max_body);
            return NS_HEAD_BAD;
        }
        if (f->has_cl && f->cl != v) return bad(e, 400, "bad_request", "conflicting Content-Length headers");
        f->has_cl = true;
        f->cl = v;
    } else if (nlen == 17 && strncasecmp(name, "transfer-encoding", 17) == 0) {
        if (f->has_te) return bad(e, 400, "bad_request", "more than one Transfer-Encoding header");
        if (vlen != 7 || strncasecmp(val, "chunked", 7) != 0)
            return bad(e, 501, "unsupported_transfer_encoding", "unsupported Transfer-Encoding: only chunked is supported");
        f->has_te = true;
    }
    return NS_HEAD_OK;
}

/* One header line (not a continuation). */
static ns_head_verdict check_header_line(const char *s, size_t len, size_t max_body, framing *f, ns_http_error *e) {
    size_t k = 0;
    while (k < len && is_tchar((unsigned char)s[k])) k++;
    if (k == 0) return bad(e, 400, "bad_request", "malformed header line: no field name");
    if (k == len || s[k] != ':') {
        if (k < len && (s[k] == ' ' || s[k] == '\t'))
            return bad(e, 400, "bad_request", "malformed header line: whitespace between the field name and the colon");
        return bad(e, 400, "bad_request", "malformed header line: no colon after the field name");
    }
    size_t a = k + 1, b = len;
    while (a < b && (s[a] == ' ' || s[a] == '\t')) a++;
    while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) b--;
    return check_framing(s, k, s + a, b - a, max_body, f, e);
}

static ns_head_verdict too_large(ns_http_error *e, bool line) {
    if (line)
        ns_http_error_set(e, 431, NULL, "header_too_large", "a request header line is longer than %d bytes",
                          NS_HTTP_MAX_HEADER_LINE_BYTES);
    else
        ns_http_error_set(e, 431, NULL, "header_too_large", "the request head is longer than %d bytes",
                          NS_HTTP_MAX_HEAD_BYTES);
    return NS_HEAD_BAD;
}

ns_head_verdict ns_http_head_check(const char *p, size_t n, size_t max_body, size_t *head_len, ns_http_error *e,
                                   char *path, size_t path_cap) {
    path[0] = 0;
    size_t i = 0, st = 0, len = 0;
    while (i < n && (p[i] == '\r' || p[i] == '\n')) { /* blank lines before the request line */
        if (p[i] == '\r' && i + 1 < n && p[i + 1] != '\n') return bad(e, 400, "bad_request", "malformed request: a bare CR");
        i++;
    }
    size_t line0 = i;
    int r = next_line(p, n, &i, &st, &len);
    if (r < 0) return bad(e, 400, "bad_request", "malformed request line: a NUL or a bare CR");
    if (r == 0) {
        if (n - line0 > NS_HTTP_MAX_URI_BYTES + 64) {
            ns_http_error_set(e, 414, NULL, "uri_too_long", "the request URI is longer than %d bytes",
                              NS_HTTP_MAX_URI_BYTES);
            return NS_HEAD_BAD;
        }
        return n > NS_HTTP_MAX_HEAD_BYTES ? too_large(e, false) : NS_HEAD_MORE;
    }
    bool http10 = false;
    if (check_request_line(p + st, len, e, path, path_cap, &http10) != NS_HEAD_OK) return NS_HEAD_BAD;
    framing f = {0};
    bool prev_framing = false, any = false;
    for (;;) {
        size_t ls = i;
        r = next_line(p, n, &i, &st, &len);
        if (r < 0) return bad(e, 400, "bad_request", "malformed header line: a NUL or a bare CR");
        if (r == 0) {
            if (n - ls > NS_HTTP_MAX_HEADER_LINE_BYTES) return too_large(e, true);
            return n > NS_HTTP_MAX_HEAD_BYTES ? too_large(e, false) : NS_HEAD_MORE;
        }
        if (i > NS_HTTP_MAX_HEAD_BYTES) return too_large(e, false);
        if (len == 0) break;
        if (len > NS_HTTP_MAX_HEADER_LINE_BYTES) return too_large(e, true);
        const char *s = p + st;
        if (s[0] == ' ' || s[0] == '\t') {
            /* obs-fold: libmicrohttpd joins it to the previous line; never
             * for the lines that frame the body */
            if (!any || prev_framing) return bad(e, 400, "bad_request", "malformed header: a folded line");
            continue;
        }
        if (check_header_line(s, len, max_body, &f, e) != NS_HEAD_OK) return NS_HEAD_BAD;
        any = true;
        prev_framing = (len >= 14 && strncasecmp(s, "content-length", 14) == 0) ||
                       (len >= 17 && strncasecmp(s, "transfer-encoding", 17) == 0);
    }
    if (f.has_cl && f.has_te)
        return bad(e, 400, "bad_request", "both Content-Length and Transfer-Encoding: the body's length is ambiguous");
    if (f.has_te && http10) return bad(e, 400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request");
    *head_len = i;
    return NS_HEAD_OK;
}

/* ---------------- the connection table ---------------- */

typedef enum {
    GC_SCREEN, /* the gate reads the first head */
    GC_HANDED, /* given to libmicrohttpd, not yet adopted */
    GC_MHD,    /* libmicrohttpd's */
    GC_LINGER, /* answered by the gate; draining before the close */
} gc_state;

struct ns_gate_conn {
    ns_gate_conn *prev, *next;
    ns_gate_conn *dead_next; /* the graveyard: freed after the current batch of events */
    int fd;
    gc_state state;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    int64_t since_ms;    /* when the wait for the current request began */
    int64_t deadline_ms; /* request (or linger) deadline; 0 = none */
    size_t scanned;      /* bytes seen by the last peek */
    size_t drained;      /* bytes discarded while lingering */
    bool dirty;          /* bytes arrived that the throttle did not peek yet */
    bool shut;           /* shut down (reaped or evicted); libmicrohttpd closes it */
    bool dead;
};

struct ns_gate {
    ns_gate_opts o;
    int lfd, ep, wake;
    pthread_t th;
    bool started;
    atomic_bool stop;
    pthread_mutex_t mu;
    ns_gate_conn *head, *tail;
    unsigned n;
    ns_gate_conn *graveyard;
    bool listen_paused;
    int64_t listen_resume_ms;
    double last_evict_warn, last_emfile_warn;
    atomic_uint_fast64_t n_reaped, n_evicted, n_refused, n_rejected, n_4xx, n_5xx;
    char buf[NS_HTTP_MAX_HEAD_BYTES + 2];
};

static int64_t now_ms(void) { return (int64_t)(ns_clock_now() * 1000.0); }

static void unlink_conn(ns_gate *g, ns_gate_conn *c) {
    if (c->prev) c->prev->next = c->next;
    else g->head = c->next;
    if (c->next) c->next->prev = c->prev;
    else g->tail = c->prev;
    c->prev = c->next = NULL;
    g->n--;
}

/* Closes a connection the gate owns (mu held); the record is freed after
 * the current batch of events, which may still name it. */
static void close_owned(ns_gate *g, ns_gate_conn *c) {
    if (c->dead) return;
    epoll_ctl(g->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    unlink_conn(g, c);
    c->dead = true;
    c->dead_next = g->graveyard;
    g->graveyard = c;
}

static void bury(ns_gate *g) {
    pthread_mutex_lock(&g->mu);
    ns_gate_conn *c = g->graveyard;
    g->graveyard = NULL;
    pthread_mutex_unlock(&g->mu);
    while (c) {
        ns_gate_conn *nx = c->dead_next;
        free(c);
        c = nx;
    }
}

static const char *reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* Writes e as a complete response (Connection: close) without blocking:
 * the socket's send buffer is empty, the reply small. Logged as the
 * server logs its errors (quiet: at DEBUG, for a client that is most
 * likely gone). */
static void send_error(ns_gate *g, int fd, ns_http_error *e, const char *path, bool quiet) {
    size_t blen = 0;
    char *body = ns_http_error_json_shaped(e, ns_http_error_shape_of(path), &blen);
    int status = e->status;
    atomic_fetch_add(status >= 500 ? &g->n_5xx : &g->n_4xx, 1);
    if (quiet || status == 503 || status == 429) NS_DEBUG("http: %d %s", status, e->message);
    else NS_INFO("http: %d %s", status, e->message);
    ns_http_error_clear(e);
    if (!body) return;
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      status, reason(status), blen);
    char *msg = malloc((size_t)hn + blen);
    if (msg) {
        memcpy(msg, head, (size_t)hn);
        memcpy(msg + hn, body, blen);
        (void)!send(fd, msg, (size_t)hn + blen, MSG_NOSIGNAL | MSG_DONTWAIT);
        free(msg);
    }
    free(body);
}

/* Answers a connection the gate owns and lingers (mu held). */
static void answer(ns_gate *g, ns_gate_conn *c, ns_http_error *e, const char *path, bool quiet) {
    send_error(g, c->fd, e, path, quiet);
    shutdown(c->fd, SHUT_WR);
    c->state = GC_LINGER;
    c->deadline_ms = now_ms() + LINGER_MS;
}

/* Near max_conns: shuts down the connection that has waited longest for a
 * complete request, never `keep` (mu held). force: at the cap already. */
static bool make_room(ns_gate *g, ns_gate_conn *keep, bool force) {
    unsigned cap = g->o.max_conns;
    unsigned margin = cap / 16 > 4 ? cap / 16 : 4;
    if (!force && g->n + margin < cap) return true;
    ns_gate_conn *victim = NULL;
    for (ns_gate_conn *c = g->head; c; c = c->next)
        if (c != keep && c->deadline_ms && !c->shut && (c->state == GC_SCREEN || c->state == GC_MHD) &&
            (!victim || c->since_ms < victim->since_ms))
            victim = c;
    if (!victim) return false;
    if (victim->state == GC_SCREEN) {
        close_owned(g, victim);
    } else {
        victim->shut = true;
        shutdown(victim->fd, SHUT_RDWR);
    }
    atomic_fetch_add(&g->n_evicted, 1);
    double now = ns_clock_now();
    if (now - g->last_evict_warn > 10.0) {
        g->last_evict_warn = now;
        NS_WARN("http: %u of %u connections open: closing the ones waiting longest for a request "
                "(raise --max-connections, or lower --request-timeout)", g->n, cap);
    }
    return true;
}

static bool same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return true;
}

static void refuse(ns_gate *g, int fd, int status, const char *msg) {
    ns_http_error e = {0};
    ns_http_error_set(&e, status, NULL, "too_many_connections", "%s", msg);
    send_error(g, fd, &e, NULL, false);
    shutdown(fd, SHUT_WR);
    close(fd);
    atomic_fetch_add(&g->n_refused, 1);
}

/* A new connection: caps, then the table and the screen. */
static void admit(ns_gate *g, int fd, const struct sockaddr_storage *ss, socklen_t sl) {
    pthread_mutex_lock(&g->mu);
    unsigned same = 0;
    for (ns_gate_conn *c = g->head, *nx; c; c = nx) {
        nx = c->next;
        if (c->fd == fd && c->state == GC_HANDED) {
            /* libmicrohttpd refused it after taking it (and closed it):
             * the descriptor is free again */
            unlink_conn(g, c);
            free(c);
            continue;
        }
        if (c->state != GC_LINGER && !c->shut && same_peer(&c->peer, ss)) same++;
    }
    if (g->o.max_per_peer && same >= g->o.max_per_peer) {
        pthread_mutex_unlock(&g->mu);
        refuse(g, fd, 429, "too many connections from this address (--max-connections-per-peer)");
        return;
    }
    if (g->n >= g->o.max_conns && !make_room(g, NULL, true)) {
        pthread_mutex_unlock(&g->mu);
        refuse(g, fd, 503, "too many connections (--max-connections); try again later");
        return;
    }
    ns_gate_conn *c = calloc(1, sizeof *c);
    if (!c) {
        pthread_mutex_unlock(&g->mu);
        close(fd);
        return;
    }
    c->fd = fd;
    c->state = GC_SCREEN;
    c->peer = *ss;
    c->peer_len = sl;
    c->since_ms = now_ms();
    c->deadline_ms = c->since_ms + g->o.request_timeout_ms;
    c->prev = g->tail;
    if (g->tail) g->tail->next = c;
    else g->head = c;
    g->tail = c;
    g->n++;
    make_room(g, c, false);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev) != 0) close_owned(g, c);
    pthread_mutex_unlock(&g->mu);
}

static void accept_some(ns_gate *g) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(g->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            admit(g, fd, &ss, sl);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* out of descriptors: stop accepting for a tick instead of
             * spinning on a listener that stays readable */
            double now = ns_clock_now();
            if (now - g->last_emfile_warn > 10.0) {
                g->last_emfile_warn = now;
                NS_WARN("http: cannot accept a connection: %s (raise 'ulimit -n' or lower --max-connections)",
                        strerror(errno));
            }
            struct epoll_event ev = {.events = 0, .data.ptr = &g->lfd};
            epoll_ctl(g->ep, EPOLL_CTL_MOD, g->lfd, &ev);
            g->listen_paused = true;
            g->listen_resume_ms = now_ms() + TICK_MS;
        }
        return;
    }
}

/* Reads what the client sent so far (without consuming it) and decides. */
static void screen(ns_gate *g, ns_gate_conn *c, bool eof, bool from_tick) {
    int q = 0;
    if (ioctl(c->fd, FIONREAD, &q) != 0) q = 0;
    size_t avail = (size_t)q;
    if (!eof && avail <= c->scanned) return;
    if (!eof && !from_tick && c->scanned >= EAGER_PEEK_BYTES && avail < 2 * c->scanned &&
        avail <= NS_HTTP_MAX_HEAD_BYTES) {
        c->dirty = true; /* a large head in small pieces: peek on the next tick */
        return;
    }
    c->dirty = false;
    size_t want = avail < sizeof g->buf - 1 ? avail : sizeof g->buf - 1;
    ssize_t r = want ? recv(c->fd, g->buf, want, MSG_PEEK | MSG_DONTWAIT) : 0;
    pthread_mutex_lock(&g->mu);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    if (r <= 0) {
        /* closed (or failed) before sending anything */
        close_owned(g, c);
        pthread_mutex_unlock(&g->mu);
        return;
    }
    c->scanned = (size_t)r;
    ns_http_error e = {0};
    char path[256];
    size_t head_len = 0;
    ns_head_verdict v = ns_http_head_check(g->buf, (size_t)r, g->o.max_body, &head_len, &e, path, sizeof path);
    bool cut = v == NS_HEAD_MORE && eof;
    if (cut) v = bad(&e, 400, "bad_request", "the client ended its request before the end of the request head");
    if (v == NS_HEAD_BAD) {
        atomic_fetch_add(&g->n_rejected, 1);
        answer(g, c, &e, path, cut);
        pthread_mutex_unlock(&g->mu);
        return;
    }
    if (v == NS_HEAD_MORE) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    epoll_ctl(g->ep, EPOLL_CTL_DEL, c->fd, NULL);
    c->state = GC_HANDED;
    int fd = c->fd;
    struct sockaddr_storage peer = c->peer;
    socklen_t plen = c->peer_len;
    pthread_mutex_unlock(&g->mu);
    if (!g->o.handover(g->o.ud, fd, (const struct sockaddr *)&peer, plen)) {
        /* closed by the callee; the record goes with it, unless
         * libmicrohttpd adopted and closed (and freed) it already: look it
         * up instead of touching it (only this thread allocates records,
         * so the address cannot have been reused meanwhile) */
        pthread_mutex_lock(&g->mu);
        ns_gate_conn *x = g->tail;
        while (x && x != c) x = x->prev;
        if (x && x->state == GC_HANDED) {
            unlink_conn(g, x);
            x->dead = true;
            x->dead_next = g->graveyard;
            g->graveyard = x;
        }
        pthread_mutex_unlock(&g->mu);
    }
}

/* Discards what a client answered by the gate still sends. */
static void drain(ns_gate *g, ns_gate_conn *c) {
    for (;;) {
        ssize_t r = recv(c->fd, g->buf, sizeof g->buf, MSG_DONTWAIT);
        if (r > 0) {
            c->drained += (size_t)r;
            if (c->drained < LINGER_DRAIN_MAX) continue;
        } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            return;
        }
        pthread_mutex_lock(&g->mu);
        close_owned(g, c);
        pthread_mutex_unlock(&g->mu);
        return;
    }
}

static void on_event(ns_gate *g, ns_gate_conn *c, uint32_t ev) {
    if (c->dead) return;
    if (c->state == GC_LINGER) {
        drain(g, c);
        return;
    }
    if (c->state != GC_SCREEN) return;
    if (ev & (EPOLLERR | EPOLLHUP)) {
        pthread_mutex_lock(&g->mu);
        close_owned(g, c);
        pthread_mutex_unlock(&g->mu);
        return;
    }
    screen(g, c, (ev & EPOLLRDHUP) != 0, false);
}

/* Every tick: deadlines, throttled peeks, a paused listener. */
static void tick(ns_gate *g) {
    int64_t now = now_ms();
    if (g->listen_paused && now >= g->listen_resume_ms) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->lfd};
        epoll_ctl(g->ep, EPOLL_CTL_MOD, g->lfd, &ev);
        g->listen_paused = false;
    }
    pthread_mutex_lock(&g->mu);
    for (ns_gate_conn *c = g->head, *nx; c; c = nx) {
        nx = c->next;
        if (!c->deadline_ms || c->shut || now < c->deadline_ms) continue;
        if (c->state == GC_LINGER) {
            close_owned(g, c);
        } else if (c->state == GC_SCREEN) {
            /* closed without a reply, as libmicrohttpd's are below: a
             * client that sends nothing for this long is usually not
             * reading either, and a reply would only keep it open */
            atomic_fetch_add(&g->n_reaped, 1);
            NS_DEBUG("http: closing a connection that sent no complete request in %lld ms",
                     (long long)g->o.request_timeout_ms);
            close_owned(g, c);
        } else {
            /* libmicrohttpd's: it closes the connection once shut down */
            c->shut = true;
            shutdown(c->fd, SHUT_RDWR);
            atomic_fetch_add(&g->n_reaped, 1);
            NS_DEBUG("http: closing a connection that sent no complete request in %lld ms",
                     (long long)g->o.request_timeout_ms);
        }
    }
    /* throttled peeks (the screen takes the lock itself) */
    ns_gate_conn *dirty[64];
    int nd = 0;
    for (ns_gate_conn *c = g->head; c && nd < 64; c = c->next)
        if (c->state == GC_SCREEN && c->dirty) dirty[nd++] = c;
    pthread_mutex_unlock(&g->mu);
    for (int k = 0; k < nd; k++)
        if (!dirty[k]->dead && dirty[k]->state == GC_SCREEN) screen(g, dirty[k], false, true);
}

static void *gate_main(void *arg) {
    ns_gate *g = arg;
    ns_log_set_context("http gate");
    struct epoll_event evs[64];
    int64_t next_tick = now_ms() + TICK_MS;
    while (!atomic_load(&g->stop)) {
        int64_t wait = next_tick - now_ms();
        int n = epoll_wait(g->ep, evs, 64, wait < 0 ? 0 : (int)wait);
        for (int k = 0; k < n; k++) {
            void *p = evs[k].data.ptr;
            if (p == &g->lfd) accept_some(g);
            else if (p == &g->wake) continue;
            else on_event(g, p, evs[k].events);
        }
        if (now_ms() >= next_tick) {
            tick(g);
            next_tick = now_ms() + TICK_MS;
        }
        bury(g);
    }
    ns_log_clear_context();
    return NULL;
}

/* ---------------- lifecycle and libmicrohttpd's side ---------------- */

ns_status ns_gate_start(const ns_gate_opts *o, ns_gate **out, ns_error *err) {
    *out = NULL;
    ns_gate *g = calloc(1, sizeof *g);
    if (!g) {
        close(o->listen_fd);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    g->o = *o;
    g->lfd = o->listen_fd;
    g->ep = epoll_create1(EPOLL_CLOEXEC);
    g->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&g->mu, NULL);
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &g->lfd};
    struct epoll_event we = {.events = EPOLLIN, .data.ptr = &g->wake};
    if (g->ep < 0 || g->wake < 0 || epoll_ctl(g->ep, EPOLL_CTL_ADD, g->lfd, &le) != 0 ||
        epoll_ctl(g->ep, EPOLL_CTL_ADD, g->wake, &we) != 0 || pthread_create(&g->th, NULL, gate_main, g) != 0) {
        int e = errno;
        ns_gate_stop(g);
        ns_gate_free(g);
        return ns_fail(err, NS_ERR_INTERNAL, "cannot start the HTTP listener: %s", strerror(e));
    }
    g->started = true;
    *out = g;
    return NS_OK;
}

void ns_gate_stop(ns_gate *g) {
    if (!g) return;
    atomic_store(&g->stop, true);
    if (g->started) {
        uint64_t one = 1;
        (void)!write(g->wake, &one, sizeof one);
        pthread_join(g->th, NULL);
        g->started = false;
    }
    if (g->lfd >= 0) close(g->lfd);
    g->lfd = -1;
    pthread_mutex_lock(&g->mu);
    for (ns_gate_conn *c = g->head, *nx; c; c = nx) {
        nx = c->next;
        if (c->state == GC_SCREEN || c->state == GC_LINGER) close_owned(g, c);
    }
    pthread_mutex_unlock(&g->mu);
    bury(g);
}

void ns_gate_free(ns_gate *g) {
    if (!g) return;
    /* what is left was handed over and never adopted (libmicrohttpd
     * closed those descriptors itself) */
    while (g->head) {
        ns_gate_conn *c = g->head;
        unlink_conn(g, c);
        free(c);
    }
    if (g->ep >= 0) close(g->ep);
    if (g->wake >= 0) close(g->wake);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

ns_gate_conn *ns_gate_adopt(ns_gate *g, int fd) {
    pthread_mutex_lock(&g->mu);
    ns_gate_conn *c = g->tail;
    while (c && !(c->fd == fd && c->state == GC_HANDED)) c = c->prev;
    if (c) c->state = GC_MHD;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void ns_gate_wait(ns_gate *g, ns_gate_conn *c, bool on) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    if (on) {
        c->since_ms = now_ms();
        c->deadline_ms = c->since_ms + g->o.request_timeout_ms;
    } else {
        c->deadline_ms = 0;
    }
    pthread_mutex_unlock(&g->mu);
}

void ns_gate_closed(ns_gate *g, ns_gate_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&g->mu);
    unlink_conn(g, c);
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void ns_gate_get_counters(ns_gate *g, ns_gate_counters *out) {
    pthread_mutex_lock(&g->mu);
    out->open = g->n;
    pthread_mutex_unlock(&g->mu);
    out->reaped = atomic_load(&g->n_reaped);
    out->evicted = atomic_load(&g->n_evicted);
    out->refused = atomic_load(&g->n_refused);
    out->rejected = atomic_load(&g->n_rejected);
    out->responses_4xx = atomic_load(&g->n_4xx);
    out->responses_5xx = atomic_load(&g->n_5xx);
}
