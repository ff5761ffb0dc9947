/* test_http_client.c — the HTTP client: its SSE parser (any chunking,
 * CRLF/CR/LF line ends, multi-line data, comments, the per-event cap, a
 * handler that stops), and whole exchanges with a scripted server on a
 * loopback socket written here (the request as sent, SSE events with
 * their arrival times, an error status kept whole, the response cap, the
 * idle timeout, a refused connection). The client against the real server
 * is exercised by tests/integration/test_record_replay.sh. */
#include "client/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

typedef struct got {
    char ev[8][64];
    char data[8][256];
    double t[8];
    int n;
    int stop_after; /* 0 = never */
} got;

static bool collect(void *ctx, const char *event, const char *data, size_t len, double t) {
    got *g = ctx;
    if (g->n < 8) {
        snprintf(g->ev[g->n], sizeof g->ev[0], "%s", event);
        snprintf(g->data[g->n], sizeof g->data[0], "%.*s", (int)len, data);
        g->t[g->n] = t;
    }
    g->n++;
    return !(g->stop_after && g->n >= g->stop_after);
}

static const char k_stream[] = ": keep-alive\n\n"
                               "data: {\"a\":1}\n\n"
                               "event: message_start\r\ndata: x\r\ndata: y\r\n\r\n"
                               "data:nospace\r\rdata: [DONE]\n\n";

static void check_stream(const got *g) {
    CHECK_EQ_INT(g->n, 4);
    CHECK_EQ_STR(g->data[0], "{\"a\":1}");
    CHECK_EQ_STR(g->ev[0], "");
    CHECK_EQ_STR(g->ev[1], "message_start");
    CHECK_EQ_STR(g->data[1], "x\ny");
    CHECK_EQ_STR(g->data[2], "nospace");
    CHECK_EQ_STR(g->data[3], "[DONE]");
}

TEST(sse_whole) {
    got g = {0};
    ns_hc_sse p;
    ns_hc_sse_init(&p, 0, collect, &g);
    CHECK(ns_hc_sse_feed(&p, k_stream, sizeof k_stream - 1, 1.0) == NS_OK);
    check_stream(&g);
    ns_hc_sse_free(&p);
}

/* every split point, byte by byte: the CRLF split across chunks must not
 * yield an extra blank line (an empty event) */
TEST(sse_any_chunking) {
    const size_t n = sizeof k_stream - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        got g = {0};
        ns_hc_sse p;
        ns_hc_sse_init(&p, 0, collect, &g);
        CHECK(ns_hc_sse_feed(&p, k_stream, cut, 1.0) == NS_OK);
        CHECK(ns_hc_sse_feed(&p, k_stream + cut, n - cut, 2.0) == NS_OK);
        check_stream(&g);
        ns_hc_sse_free(&p);
    }
    got g = {0};
    ns_hc_sse p;
    ns_hc_sse_init(&p, 0, collect, &g);
    for (size_t i = 0; i < n; i++) CHECK(ns_hc_sse_feed(&p, k_stream + i, 1, (double)i) == NS_OK);
    check_stream(&g);
    /* the arrival time is that of the byte that completed the event */
    CHECK(g.t[0] > 0 && g.t[0] < g.t[1]);
    ns_hc_sse_free(&p);
}

TEST(sse_cap_and_stop) {
    got g = {0};
    ns_hc_sse p;
    ns_hc_sse_init(&p, 16, collect, &g);
    CHECK(ns_hc_sse_feed(&p, "data: 0123456789abcdefXYZ\n\n", 27, 1.0) == NS_ERR_NOMEM);
    ns_hc_sse_free(&p);
    got g2 = {.stop_after = 1};
    ns_hc_sse_init(&p, 0, collect, &g2);
    CHECK(ns_hc_sse_feed(&p, "data: a\n\ndata: b\n\n", 18, 1.0) == NS_ERR_CANCELLED);
    CHECK_EQ_INT(g2.n, 1);
    ns_hc_sse_free(&p);
}


/* ---- a scripted server: one connection, one canned answer ---- */

typedef struct script {
    int lfd, port;
    const char *parts[4]; /* written in turn, with pause_ms between them */
    int pause_ms;
    char request[4096];   /* what arrived */
    size_t req_len;
} script;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *serve_one(void *arg) {
    script *sc = arg;
    int fd = accept(sc->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    /* read the head and the body (Content-Length) */
    for (;;) {
        ssize_t n = read(fd, sc->request + sc->req_len, sizeof sc->request - 1 - sc->req_len);
        if (n <= 0) break;
        sc->req_len += (size_t)n;
        sc->request[sc->req_len] = 0;
        char *end = strstr(sc->request, "\r\n\r\n");
        const char *cl = strcasestr(sc->request, "content-length:");
        if (end && (!cl || sc->req_len >= (size_t)(end + 4 - sc->request) + (size_t)atol(cl + 15))) break;
    }
    for (int i = 0; i < 4 && sc->parts[i]; i++) {
        if (i) sleep_ms(sc->pause_ms);
        if (write(fd, sc->parts[i], strlen(sc->parts[i])) < 0) break;
    }
    close(fd);
    return NULL;
}

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

/* Runs one exchange against the script; returns the client's status. */
static ns_status exchange(script *sc, const ns_hc_opts *o, ns_hc_event_fn fn, void *ctx, ns_hc_response *r) {
    sc->lfd = listen_any(&sc->port);
    CHECK(sc->lfd >= 0);
    pthread_t th;
    pthread_create(&th, NULL, serve_one, sc);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", sc->port);
    ns_error err = {0};
    ns_hc *c = ns_hc_new(&err);
    const char *hdr[] = {"Authorization: Bearer k-123", NULL};
    ns_status rc = ns_hc_post(c, url, hdr, "{\"a\":1}", 7, o, fn, ctx, r, &err);
    ns_hc_free(c);
    pthread_join(th, NULL);
    close(sc->lfd);
    return rc;
}

TEST(post_and_sse_events) {
    script sc = {.pause_ms = 100,
                 .parts = {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                           "data: {\"n\":1}\n\n",
                           "data: {\"n\":2}\n\n", "data: [DONE]\n\n"}};
    got g = {0};
    ns_hc_response r;
    CHECK(exchange(&sc, NULL, collect, &g, &r) == NS_OK);
    /* the request as sent */
    static const char k_line[] = "POST /v1/chat/completions HTTP/1.1\r\n";
    CHECK(strncmp(sc.request, k_line, sizeof k_line - 1) == 0);
    CHECK(strcasestr(sc.request, "\r\nAuthorization: Bearer k-123\r\n") != NULL);
    CHECK(strcasestr(sc.request, "\r\nContent-Type: application/json\r\n") != NULL);
    CHECK(strstr(sc.request, "\r\n\r\n{\"a\":1}") != NULL);
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.streamed && r.body == NULL);
    CHECK_EQ_INT(g.n, 3);
    CHECK_EQ_STR(g.data[1], "{\"n\":2}");
    /* each event carries its own arrival: the server paused 100 ms between them */
    CHECK(g.t[0] >= r.t_start && g.t[1] - g.t[0] >= 0.09 && g.t[2] >= g.t[1] && r.t_end >= g.t[2]);
    ns_hc_response_free(&r);
}

TEST(error_status_whole) {
    script sc = {.parts = {"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                           "Connection: close\r\n\r\n{\"error\":{\"message\":\"no\"}}"}};
    got g = {0};
    ns_hc_response r;
    /* an error answer is JSON, not events, even when the caller wants events */
    CHECK(exchange(&sc, NULL, collect, &g, &r) == NS_OK);
    CHECK_EQ_INT(r.status, 400);
    CHECK(!r.streamed);
    CHECK_EQ_STR(r.body, "{\"error\":{\"message\":\"no\"}}");
    CHECK_EQ_INT(g.n, 0);
    ns_hc_response_free(&r);
}

TEST(response_cap) {
    static char big[6000];
    int n = snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n");
    memset(big + n, 'x', sizeof big - 1 - (size_t)n);
    script sc = {.parts = {big}};
    ns_hc_opts o = {.max_response_bytes = 1000};
    ns_hc_response r;
    CHECK(exchange(&sc, &o, NULL, NULL, &r) == NS_ERR_NOMEM);
    CHECK(strstr(r.error, "too large") != NULL);
    CHECK(r.body == NULL || r.body_len <= 1000);
    ns_hc_response_free(&r);
}

TEST(idle_timeout) {
    /* headers, then nothing for 3 s: the 1 s idle limit ends it first */
    script sc = {.pause_ms = 3000,
                 .parts = {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
                           "data: late\n\n"}};
    ns_hc_opts o = {.idle_timeout_s = 1};
    got g = {0};
    ns_hc_response r;
    CHECK(exchange(&sc, &o, collect, &g, &r) == NS_ERR_IO);
    CHECK_EQ_INT(g.n, 0);
    CHECK(strstr(r.error, "idle timeout") != NULL);
    ns_hc_response_free(&r);
}

TEST(refused_connection) {
    ns_error err = {0};
    ns_hc *c = ns_hc_new(&err);
    CHECK(c != NULL);
    if (!c) return;
    ns_hc_response r;
    ns_hc_opts o = {.connect_timeout_s = 2};
    /* port 1 on loopback: nothing listens there */
    ns_status rc = ns_hc_post(c, "http://127.0.0.1:1/v1/chat/completions", NULL, "{}", 2, &o, NULL, NULL, &r, &err);
    CHECK(rc == NS_ERR_IO);
    CHECK_EQ_INT(r.status, 0);
    CHECK(r.error[0] != 0);
    ns_hc_response_free(&r);
    ns_hc_free(c);
}

int main(void) {
    RUN(sse_whole);
    RUN(sse_any_chunking);
    RUN(sse_cap_and_stop);
    RUN(post_and_sse_events);
    RUN(error_status_whole);
    RUN(response_cap);
    RUN(idle_timeout);
    RUN(refused_connection);
    TEST_MAIN_END;
}
