/* stop.h — stop-string matcher over streamed text.
 *
 * Text arrives in arbitrary fragments (one detokenized token at a time);
 * a stop string may straddle fragments. The matcher releases only text
 * that can no longer be the beginning of a stop string: it holds back the
 * longest suffix that is a proper prefix of some stop string. Once a stop
 * string matched, the text before it is released, the stop string and
 * everything after it are dropped, and every later feed is ignored.
 *
 * Invariants: held text is always shorter than the longest stop string;
 * the concatenation of released text is independent of how the input was
 * fragmented. Input and stop strings are UTF-8; since a held suffix starts
 * where a stop string could start, released text never splits a character.
 */
#ifndef NS_API_STOP_H
#define NS_API_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"
#include "util/status.h"

#define NS_STOP_MAX 16          /* stop strings per request */
#define NS_STOP_MAX_LEN 1024    /* bytes per stop string */

typedef struct ns_stop {
    char *s[NS_STOP_MAX];
    size_t len[NS_STOP_MAX];
    int n;
    ns_buf held;
    bool matched;
} ns_stop;

/* Copies the stop strings (empty ones are ignored). NS_ERR_INVALID when
 * there are more than NS_STOP_MAX or one is longer than NS_STOP_MAX_LEN. */
ns_status ns_stop_init(ns_stop *st, const char *const *stops, int n, ns_error *err);
void ns_stop_free(ns_stop *st);
/* Feeds text; appends what is safe to emit to out. *matched becomes true
 * when a stop string completed in this call (or earlier). */
ns_status ns_stop_feed(ns_stop *st, const char *text, size_t n, ns_buf *out, bool *matched);
/* End of stream without a match: releases the held text. */
ns_status ns_stop_flush(ns_stop *st, ns_buf *out);

#endif
