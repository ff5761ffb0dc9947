#include "util/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/vec.h"

#define NS_BUF_DEFAULT_CAP ((size_t)1 << 30)

void ns_buf_init(ns_buf *b, size_t cap) {
    b->data = NULL;
    b->len = 0;
    b->alloc = 0;
    b->cap = cap ? cap : NS_BUF_DEFAULT_CAP;
}

void ns_buf_free(ns_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->alloc = 0;
}

void ns_buf_reset(ns_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

static ns_status reserve(ns_buf *b, size_t extra) {
    size_t cap = b->cap ? b->cap : NS_BUF_DEFAULT_CAP;
    if (extra > cap || b->len > cap - extra) return NS_ERR_NOMEM;
    return NS_VEC_GROW(b->data, b->alloc, b->len + extra + 1, cap + 1);
}

ns_status ns_buf_append(ns_buf *b, const void *p, size_t n) {
    ns_status st = reserve(b, n);
    if (st != NS_OK) return st;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return NS_OK;
}

ns_status ns_buf_puts(ns_buf *b, const char *s) { return ns_buf_append(b, s, strlen(s)); }
ns_status ns_buf_putc(ns_buf *b, char c) { return ns_buf_append(b, &c, 1); }

ns_status ns_buf_printf(ns_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NS_ERR_INVALID;
    ns_status st = reserve(b, (size_t)n);
    if (st != NS_OK) return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return NS_OK;
}

char *ns_buf_take(ns_buf *b, size_t *len_out) {
    if (!b->data && reserve(b, 0) != NS_OK) return NULL;
    b->data[b->len] = 0;
    char *p = b->data;
    if (len_out) *len_out = b->len;
    b->data = NULL;
    b->len = b->alloc = 0;
    return p;
}
