/* status.h — the project-wide status codes and error message carrier.
 *
 * Invariant: every fallible function returns ns_status and, when it fails,
 * fills the caller's ns_error (if non-NULL) with one human-readable sentence
 * that names the offending file, field or value. Nothing below main.c exits.
 */
#ifndef NS_STATUS_H
#define NS_STATUS_H

#include <stddef.h>

typedef enum {
    NS_OK = 0,
    NS_ERR_IO,          /* open/read/mmap failed */
    NS_ERR_FORMAT,      /* file or payload is malformed/corrupt */
    NS_ERR_NOMEM,       /* allocation failed or a cap was hit */
    NS_ERR_INVALID,     /* caller passed an invalid argument */
    NS_ERR_UNSUPPORTED, /* valid but not supported (architecture, dtype) */
    NS_ERR_RANGE,       /* a size/index is out of range */
    NS_ERR_CANCELLED,   /* work was cancelled */
    NS_ERR_FULL,        /* a pool/queue has no room right now */
    NS_ERR_INTERNAL     /* a bug or a backend failure */
} ns_status;

typedef struct ns_error {
    ns_status status;
    char msg[512];
} ns_error;

/* Sets err (if non-NULL) and returns st, so callers can write
 *   return ns_fail(err, NS_ERR_FORMAT, "%s: bad header", path); */
ns_status ns_fail(ns_error *err, ns_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *ns_status_name(ns_status st);

#endif
