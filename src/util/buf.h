/* buf.h — a growable byte buffer with a hard cap.
 *
 * Invariant: data is always NUL-terminated (data[len] == 0) once anything was
 * appended, so it can be handed to C string functions. Growth never exceeds
 * cap bytes; an append that would returns NS_ERR_NOMEM and leaves the buffer
 * unchanged. The buffer owns data; ns_buf_free releases it.
 */
#ifndef NS_BUF_H
#define NS_BUF_H

#include <stddef.h>

#include "util/status.h"

typedef struct ns_buf {
    char *data;
    size_t len;
    size_t alloc;
    size_t cap; /* 0 = default cap (1 GiB) */
} ns_buf;

void ns_buf_init(ns_buf *b, size_t cap);
void ns_buf_free(ns_buf *b);
void ns_buf_reset(ns_buf *b);
ns_status ns_buf_append(ns_buf *b, const void *p, size_t n);
ns_status ns_buf_puts(ns_buf *b, const char *s);
ns_status ns_buf_putc(ns_buf *b, char c);
ns_status ns_buf_printf(ns_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Transfers ownership of the bytes to the caller (never NULL on success:
 * an empty buffer yields a malloc'd ""), leaving b empty. */
char *ns_buf_take(ns_buf *b, size_t *len_out);

#endif
