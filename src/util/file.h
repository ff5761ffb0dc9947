/* file.h — whole-file reads and read-only memory maps.
 *
 * ns_file_read caps the size it will read (files read whole are small:
 * JSON configs, tokenizers); big tensors are mapped with ns_mmap_open.
 */
#ifndef NS_FILE_H
#define NS_FILE_H

#include <stddef.h>

#include "util/status.h"

/* Reads path into a malloc'd NUL-terminated buffer owned by the caller.
 * Fails with NS_ERR_RANGE if the file is larger than max_bytes. */
ns_status ns_file_read(const char *path, size_t max_bytes, char **out, size_t *len_out, ns_error *err);

typedef struct ns_mmap {
    void *data;
    size_t size;
} ns_mmap;

/* Maps path read-only. The mapping is owned by m; ns_mmap_close unmaps. */
ns_status ns_mmap_open(const char *path, ns_mmap *m, ns_error *err);
void ns_mmap_close(ns_mmap *m);

int ns_file_exists(const char *path);
/* Joins dir and name into a malloc'd path owned by the caller (NULL on OOM). */
char *ns_path_join(const char *dir, const char *name);

#endif
