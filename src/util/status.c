#include "util/status.h"

#include <stdarg.h>
#include <stdio.h>

ns_status ns_fail(ns_error *err, ns_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = st;
    }
    return st;
}

const char *ns_status_name(ns_status st) {
    switch (st) {
    case NS_OK: return "ok";
    case NS_ERR_IO: return "io";
    case NS_ERR_FORMAT: return "format";
    case NS_ERR_NOMEM: return "nomem";
    case NS_ERR_INVALID: return "invalid";
    case NS_ERR_UNSUPPORTED: return "unsupported";
    case NS_ERR_RANGE: return "range";
    case NS_ERR_CANCELLED: return "cancelled";
    case NS_ERR_FULL: return "full";
    case NS_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}
