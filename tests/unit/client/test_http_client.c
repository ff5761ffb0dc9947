/* test_http_client.c — the SSE parser of the HTTP client (any chunking,
 * CRLF/CR/LF line ends, multi-line data, comments, the per-event cap, a
 * handler that stops), and a transport failure reported as such. The
 * client against the real server is exercised by
 * tests/integration/test_record_replay.sh. */
#include "client/http_client.h"

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
    RUN(refused_connection);
    TEST_MAIN_END;
}
