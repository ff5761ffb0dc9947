/* stop.c — stop-string matcher (see stop.h). */
#include "api/stop.h"

#include <stdlib.h>
#include <string.h>

ns_status ns_stop_init(ns_stop *st, const char *const *stops, int n, ns_error *err) {
    memset(st, 0, sizeof *st);
    /* held never exceeds the longest stop string plus one fragment; the
     * fragment size is bounded by the detokenizer, so a few MiB is ample. */
    ns_buf_init(&st->held, 16u << 20);
    if (n < 0 || n > NS_STOP_MAX) return ns_fail(err, NS_ERR_INVALID, "at most %d stop strings are allowed", NS_STOP_MAX);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) continue;
        if (l > NS_STOP_MAX_LEN) {
            ns_stop_free(st);
            return ns_fail(err, NS_ERR_INVALID, "stop strings are limited to %d bytes", NS_STOP_MAX_LEN);
        }
        st->s[st->n] = malloc(l + 1);
        if (!st->s[st->n]) {
            ns_stop_free(st);
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
        memcpy(st->s[st->n], stops[i], l + 1);
        st->len[st->n] = l;
        st->n++;
    }
    return NS_OK;
}

void ns_stop_free(ns_stop *st) {
    for (int i = 0; i < st->n; i++) free(st->s[i]);
    ns_buf_free(&st->held);
    memset(st, 0, sizeof *st);
}

/* The match that completes first when the text is read byte by byte (the
 * smallest end offset; on a tie the longer one, which starts earlier), so
 * the result does not depend on fragmentation even when one stop string
 * contains another. Returns the match's start, or n if none. */
static size_t find_first(const ns_stop *st, const char *h, size_t n) {
    size_t best_start = n, best_end = (size_t)-1;
    for (int i = 0; i < st->n; i++) {
        size_t l = st->len[i];
        if (l > n) continue;
        for (size_t p = 0; p + l <= n && p + l <= best_end; p++) {
            if (h[p] == st->s[i][0] && memcmp(h + p, st->s[i], l) == 0) {
                if (p + l < best_end || p < best_start) {
                    best_end = p + l;
                    best_start = p;
                }
                break;
            }
        }
    }
    return best_start;
}

/* Length of the longest suffix of h[0..n) that is a proper prefix of a stop
 * string. */
static size_t partial_suffix(const ns_stop *st, const char *h, size_t n) {
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        size_t maxk = st->len[i] - 1 < n ? st->len[i] - 1 : n;
        for (size_t k = maxk; k > best; k--) {
            if (memcmp(h + n - k, st->s[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

ns_status ns_stop_feed(ns_stop *st, const char *text, size_t n, ns_buf *out, bool *matched) {
    *matched = st->matched;
    if (st->matched || n == 0) return NS_OK;
    if (st->n == 0) return ns_buf_append(out, text, n);
    ns_status rc = ns_buf_append(&st->held, text, n);
    if (rc != NS_OK) return rc;
    const char *h = st->held.data;
    size_t hn = st->held.len;
    size_t at = find_first(st, h, hn);
    if (at < hn) {
        rc = ns_buf_append(out, h, at);
        st->matched = true;
        *matched = true;
        ns_buf_reset(&st->held);
        return rc;
    }
    size_t keep = partial_suffix(st, h, hn);
    rc = ns_buf_append(out, h, hn - keep);
    if (rc != NS_OK) return rc;
    memmove(st->held.data, h + hn - keep, keep);
    st->held.len = keep;
    st->held.data[keep] = 0;
    return NS_OK;
}

ns_status ns_stop_flush(ns_stop *st, ns_buf *out) {
    if (st->matched || st->held.len == 0) return NS_OK;
    ns_status rc = ns_buf_append(out, st->held.data, st->held.len);
    ns_buf_reset(&st->held);
    return rc;
}
