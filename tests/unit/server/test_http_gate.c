/* ns_http_head_check: the screen of a connection's first request head.
 * Every prefix of a valid head is "more", the whole head is OK with its
 * length; each refusal has the status and code the gate answers with; the
 * limits hold whether the head is complete or still arriving. */
#include <stdlib.h>

#include "server/http_gate.h"
#include "test.h"

static ns_head_verdict check(const char *p, size_t n, size_t *head_len, ns_http_error *e, char *path) {
    memset(e, 0, sizeof *e);
    return ns_http_head_check(p, n, 1000, head_len, e, path, 64);
}

/* A valid head (followed by extra bytes: a body or the next request). */
static void valid(const char *head, const char *extra, const char *want_path) {
    size_t hn = strlen(head), xn = strlen(extra);
    char *buf = malloc(hn + xn + 1);
    memcpy(buf, head, hn);
    memcpy(buf + hn, extra, xn + 1);
    ns_http_error e;
    char path[64];
    size_t len = 0;
    for (size_t k = 0; k < hn; k++) {
        ns_head_verdict v = check(buf, k, &len, &e, path);
        CHECKF(v == NS_HEAD_MORE, "prefix %zu of %s: verdict %d (%s)", k, want_path, v, e.message);
        ns_http_error_clear(&e);
    }
    ns_head_verdict v = check(buf, hn + xn, &len, &e, path);
    CHECKF(v == NS_HEAD_OK, "%s: verdict %d (%s)", want_path, v, e.message);
    CHECK_EQ_INT((int)len, (int)hn);
    CHECK_EQ_STR(path, want_path);
    ns_http_error_clear(&e);
    free(buf);
}

TEST(valid_heads) {
    valid("GET /health HTTP/1.1\r\nHost: a\r\n\r\n", "", "/health");
    valid("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n", "{}", "/v1/chat/completions");
    valid("GET /a HTTP/1.0\n\n", "GET /b HTTP/1.0\r\n\r\n", "/a");                  /* bare LF; pipelined */
    valid("\r\n\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n", "", "/a");                     /* blank lines first */
    valid("GET /a HTTP/1.1\r\nX-A: b\r\n  c\r\nHost: a\r\n\r\n", "", "/a");          /* a folded line */
    valid("POST /a HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", "0\r\n\r\n", "/a");
    valid("POST /a HTTP/1.1\r\nContent-Length: 7\r\ncontent-length: 7\r\n\r\n", "", "/a"); /* equal duplicates */
    valid("GET /a HTTP/1.2\r\nX: \x01\x7f\xc3\xa9\r\n\r\n", "", "/a");               /* HTTP/1.x; odd bytes in a value */
    valid("M-SEARCH * HTTP/1.1\r\n\r\n", "", "*");
}

static void refused(const char *p, size_t n, int status, const char *code) {
    ns_http_error e;
    char path[64];
    size_t len = 0;
    ns_head_verdict v = check(p, n, &len, &e, path);
    CHECKF(v == NS_HEAD_BAD && e.status == status && strcmp(e.code, code) == 0, "'%.40s': verdict %d status %d code %s",
           p, v, e.status, e.code);
    ns_http_error_clear(&e);
}
#define REFUSED(lit, status, code) refused(lit, sizeof lit - 1, status, code)

TEST(malformed_heads) {
    REFUSED("GARBAGE\r\n\r\n", 400, "bad_request");
    REFUSED("GET\t/a\tHTTP/1.1\r\n\r\n", 400, "bad_request");
    REFUSED("GET  /a HTTP/1.1\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a  HTTP/1.1\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTPX\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.11\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/2.0\r\n\r\n", 505, "http_version_not_supported");
    REFUSED("GET /a HTTP/0.9\r\n\r\n", 505, "http_version_not_supported");
    REFUSED("G(T /a HTTP/1.1\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\nNoColon\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\nX-A : b\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\n: b\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\n b\r\n\r\n", 400, "bad_request");                  /* a fold with nothing before */
    REFUSED("GET /a HTTP/1.1\rHost: a\r\n\r\n", 400, "bad_request");                /* a bare CR */
    REFUSED("GET /a HTTP/1.1\r\nX: a\rb\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a\0b HTTP/1.1\r\n\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\nX: a\0b\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413, "body_too_large");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 99999999999999999999999999\r\n\r\n", 413, "body_too_large");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 5\r\n  6\r\n\r\n", 400, "bad_request"); /* folded framing */
    REFUSED("POST /a HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported_transfer_encoding");
    REFUSED("POST /a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "unsupported_transfer_encoding");
    REFUSED("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "bad_request");
    REFUSED("POST /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "bad_request");
    /* wrong early: refused before the head is complete */
    REFUSED("GARBAGE\r\n", 400, "bad_request");
    REFUSED("GET /a HTTP/1.1\r\nBad Header\r\n", 400, "bad_request");
}

static char *repeat(const char *head, char c, size_t n, const char *tail) {
    size_t hn = strlen(head), tn = strlen(tail);
    char *p = malloc(hn + n + tn + 1);
    memcpy(p, head, hn);
    memset(p + hn, c, n);
    memcpy(p + hn + n, tail, tn + 1);
    return p;
}

TEST(limits) {
    ns_http_error e;
    char path[64];
    size_t len = 0, n;
    /* a target over the URI limit: 414, complete or not */
    char *p = repeat("GET /", 'a', NS_HTTP_MAX_URI_BYTES, " HTTP/1.1\r\n\r\n");
    n = strlen(p);
    CHECK(check(p, n, &len, &e, path) == NS_HEAD_BAD && e.status == 414);
    ns_http_error_clear(&e);
    CHECK(check(p, NS_HTTP_MAX_URI_BYTES + 100, &len, &e, path) == NS_HEAD_BAD && e.status == 414);
    ns_http_error_clear(&e);
    free(p);
    /* a request line too long by its method: refused complete as it was
     * while arriving (more bytes never turn a refusal into an acceptance) */
    p = repeat("", 'A', NS_HTTP_MAX_URI_BYTES + 100, " / HTTP/1.1\r\n\r\n");
    CHECK(check(p, strlen(p), &len, &e, path) == NS_HEAD_BAD && e.status == 414);
    ns_http_error_clear(&e);
    CHECK(check(p, NS_HTTP_MAX_URI_BYTES + 90, &len, &e, path) == NS_HEAD_BAD && e.status == 414);
    ns_http_error_clear(&e);
    free(p);
    /* just under: fine, and the path is cut to its buffer */
    p = repeat("GET /", 'a', NS_HTTP_MAX_URI_BYTES - 1, " HTTP/1.1\r\n\r\n");
    CHECK(check(p, strlen(p), &len, &e, path) == NS_HEAD_OK && strlen(path) == 63);
    free(p);
    /* one header line over its limit: 431, complete or not */
    p = repeat("GET /a HTTP/1.1\r\nX: ", 'a', NS_HTTP_MAX_HEADER_LINE_BYTES, "\r\n\r\n");
    n = strlen(p);
    CHECK(check(p, n, &len, &e, path) == NS_HEAD_BAD && e.status == 431);
    ns_http_error_clear(&e);
    CHECK(check(p, n - 4, &len, &e, path) == NS_HEAD_BAD && e.status == 431);
    ns_http_error_clear(&e);
    free(p);
    /* the whole head over its limit in short lines: 431, complete or not */
    size_t lines = NS_HTTP_MAX_HEAD_BYTES / 10 + 10;
    char *h = malloc(lines * 16 + 64);
    size_t k = (size_t)sprintf(h, "GET /a HTTP/1.1\r\n");
    for (size_t i = 0; i < lines; i++) k += (size_t)sprintf(h + k, "X%05zu: a\r\n", i % 100000);
    CHECK(check(h, k, &len, &e, path) == NS_HEAD_BAD && e.status == 431);
    ns_http_error_clear(&e);
    memcpy(h + k, "\r\n", 3);
    CHECK(check(h, k + 2, &len, &e, path) == NS_HEAD_BAD && e.status == 431);
    ns_http_error_clear(&e);
    free(h);
}

int main(void) {
    RUN(valid_heads);
    RUN(malformed_heads);
    RUN(limits);
    TEST_MAIN_END;
}
