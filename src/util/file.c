#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

ns_status ns_file_read(const char *path, size_t max_bytes, char **out, size_t *len_out, ns_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ns_fail(err, NS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    char *buf = NULL;
    ns_status rc = NS_OK;
    if (fstat(fd, &st) != 0) {
        rc = ns_fail(err, NS_ERR_IO, "%s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = ns_fail(err, NS_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        rc = ns_fail(err, NS_ERR_RANGE, "%s: file is %lld bytes, over the %zu-byte limit", path,
                     (long long)st.st_size, max_bytes);
        goto done;
    }
    size_t size = (size_t)st.st_size;
    buf = malloc(size + 1);
    if (!buf) {
        rc = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            rc = ns_fail(err, NS_ERR_IO, "%s: short read", path);
            goto done;
        }
        got += (size_t)n;
    }
    buf[size] = 0;
    *out = buf;
    buf = NULL;
    if (len_out) *len_out = size;
done:
    free(buf);
    close(fd);
    return rc;
}

ns_status ns_mmap_open(const char *path, ns_mmap *m, ns_error *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ns_fail(err, NS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    ns_status rc = NS_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = ns_fail(err, NS_ERR_IO, "%s: not a readable regular file", path);
        goto done;
    }
    if (st.st_size == 0) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: file is empty", path);
        goto done;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = ns_fail(err, NS_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        goto done;
    }
    m->data = p;
    m->size = (size_t)st.st_size;
done:
    close(fd);
    return rc;
}

void ns_mmap_close(ns_mmap *m) {
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int ns_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

char *ns_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}
