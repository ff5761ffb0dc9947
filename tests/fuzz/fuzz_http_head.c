/* fuzz_http_head — the gate's screen of a connection's first bytes
 * (ns_http_head_check, src/server/http_gate.h).
 *
 * Input: the bytes a client sent, as the gate peeks them.
 *
 * Oracles: "more" only while the head may still fit (at most
 * NS_HTTP_MAX_HEAD_BYTES); a refusal has one of the gate's statuses, a code
 * and a message, and stays a refusal when more bytes follow; an accepted
 * head ends with its blank line, is accepted alone with the same length,
 * and without its last byte is "more"; the path is a NUL-terminated run of
 * visible bytes within its buffer. */
#include <stdbool.h>
#include <stdint.h>

#include "fuzz_common.h"
#include "server/http_gate.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_BODY 65536

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static ns_head_verdict run(const char *p, size_t n, size_t *head_len, int *status) {
    ns_http_error e = {0};
    char path[32];
    memset(path, 'x', sizeof path);
    *head_len = 0;
    ns_head_verdict v = ns_http_head_check(p, n, MAX_BODY, head_len, &e, path, sizeof path);
    FUZZ_CHECK(memchr(path, 0, sizeof path) != NULL);
    for (const char *q = path; *q; q++) FUZZ_CHECK((unsigned char)*q > 0x20 && *q != 0x7f && *q != '?');
    *status = e.status;
    if (v == NS_HEAD_BAD) {
        FUZZ_CHECK(e.status == 400 || e.status == 413 || e.status == 414 || e.status == 431 || e.status == 501 ||
                   e.status == 505);
        FUZZ_CHECK(e.code[0] && e.message[0]);
    } else {
        FUZZ_CHECK(e.status == 0);
    }
    ns_http_error_clear(&e);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy with room for four more bytes */
    char *p = malloc(size + 4);
    if (!p) return 0;
    if (size) memcpy(p, data, size);
    size_t len = 0, len2 = 0;
    int st = 0, st2 = 0;
    ns_head_verdict v = run(p, size, &len, &st);
    if (v == NS_HEAD_MORE) FUZZ_CHECK(size <= NS_HTTP_MAX_HEAD_BYTES);
    if (v == NS_HEAD_OK) {
        FUZZ_CHECK(len > 0 && len <= size && len <= NS_HTTP_MAX_HEAD_BYTES && p[len - 1] == '\n');
        FUZZ_CHECK(run(p, len, &len2, &st2) == NS_HEAD_OK && len2 == len);
        FUZZ_CHECK(run(p, len - 1, &len2, &st2) == NS_HEAD_MORE);
    }
    if (v == NS_HEAD_BAD) {
        memcpy(p + size, "\r\n\r\n", 4);
        FUZZ_CHECK(run(p, size + 4, &len2, &st2) == NS_HEAD_BAD);
    }
    free(p);
    return 0;
}
