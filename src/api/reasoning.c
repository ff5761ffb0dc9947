/* reasoning.c — <think> … </think> splitter (see reasoning.h). */
#include "api/reasoning.h"

#include <string.h>

static const char OPEN[] = "<think>";
static const char CLOSE[] = "</think>";
#define OPEN_N (sizeof OPEN - 1)
#define CLOSE_N (sizeof CLOSE - 1)

void ns_reason_init(ns_reason *r, bool enabled, bool in_think) {
    memset(r, 0, sizeof *r);
    ns_buf_init(&r->hold, 16u << 20);
    r->state = !enabled ? NS_REASON_CONTENT : in_think ? NS_REASON_THINK : NS_REASON_START;
}

void ns_reason_free(ns_reason *r) { ns_buf_free(&r->hold); }

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Longest suffix of h[0..n) that is a proper prefix of tag. */
static size_t tag_partial(const char *h, size_t n, const char *tag, size_t tn) {
    size_t k = tn - 1 < n ? tn - 1 : n;
    for (; k > 0; k--)
        if (memcmp(h + n - k, tag, k) == 0) return k;
    return 0;
}

/* Keeps h[from..n) in the hold buffer (h may alias hold's data). */
static void keep_tail(ns_reason *r, size_t from) {
    size_t k = r->hold.len - from;
    memmove(r->hold.data, r->hold.data + from, k);
    r->hold.len = k;
    r->hold.data[k] = 0;
}

/* Processes the hold buffer as far as possible; final = end of output. */
static ns_status run(ns_reason *r, ns_buf *reasoning, ns_buf *content, bool final) {
    ns_status rc = NS_OK;
    for (;;) {
        char *h = r->hold.data;
        size_t n = r->hold.len;
        if (n == 0) return NS_OK;
        switch (r->state) {
        case NS_REASON_START: {
            size_t i = 0;
            while (i < n && is_ws(h[i])) i++;
            size_t rest = n - i;
            if (rest >= OPEN_N && memcmp(h + i, OPEN, OPEN_N) == 0) {
                keep_tail(r, i + OPEN_N);
                r->state = NS_REASON_THINK;
                continue;
            }
            if (!final && (rest == 0 || memcmp(h + i, OPEN, rest < OPEN_N ? rest : OPEN_N) == 0))
                return NS_OK; /* could still become <think> */
            r->state = NS_REASON_CONTENT;
            continue;
        }
        case NS_REASON_THINK: {
            size_t i = 0;
            if (!r->think_began) { /* strip leading newlines of the reasoning */
                while (i < n && h[i] == '\n') i++;
                if (i) {
                    keep_tail(r, i);
                    continue;
                }
            }
            char *c = memmem(h, n, CLOSE, CLOSE_N);
            if (c) {
                size_t end = (size_t)(c - h), e = end;
                while (e > 0 && h[e - 1] == '\n') e--;
                if (e) rc = ns_buf_append(reasoning, h, e);
                if (rc != NS_OK) return rc;
                r->think_began = true;
                keep_tail(r, end + CLOSE_N);
                r->state = NS_REASON_AFTER;
                continue;
            }
            size_t hold = final ? 0 : tag_partial(h, n, CLOSE, CLOSE_N);
            size_t e = n - hold;
            /* newlines just before the held part may be the trailing ones */
            size_t e2 = e;
            while (e2 > 0 && h[e2 - 1] == '\n') e2--;
            if (final) e = e2;
            else if (e2 < e) e = e2;
            if (e) {
                rc = ns_buf_append(reasoning, h, e);
                if (rc != NS_OK) return rc;
                r->think_began = true;
            }
            if (final) {
                ns_buf_reset(&r->hold);
                return NS_OK;
            }
            keep_tail(r, e);
            return NS_OK;
        }
        case NS_REASON_AFTER: {
            size_t i = 0;
            while (i < n && h[i] == '\n') i++;
            if (i == n) {
                ns_buf_reset(&r->hold);
                return NS_OK;
            }
            keep_tail(r, i);
            r->state = NS_REASON_CONTENT;
            continue;
        }
        case NS_REASON_CONTENT:
            rc = ns_buf_append(content, h, n);
            ns_buf_reset(&r->hold);
            return rc;
        }
    }
}

ns_status ns_reason_feed(ns_reason *r, const char *text, size_t n, ns_buf *reasoning, ns_buf *content) {
    if (n == 0) return NS_OK;
    if (r->state == NS_REASON_CONTENT && r->hold.len == 0) return ns_buf_append(content, text, n);
    ns_status rc = ns_buf_append(&r->hold, text, n);
    if (rc != NS_OK) return rc;
    return run(r, reasoning, content, false);
}

ns_status ns_reason_flush(ns_reason *r, ns_buf *reasoning, ns_buf *content) {
    return run(r, reasoning, content, true);
}

bool ns_reason_prompt_opens_think(const char *prompt, size_t n) {
    while (n > 0 && is_ws(prompt[n - 1])) n--;
    if (n < OPEN_N || memcmp(prompt + n - OPEN_N, OPEN, OPEN_N) != 0) return false;
    return true;
}
