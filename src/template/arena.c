#include "template/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN ((size_t)64 * 1024)

struct ns_tarena_chunk {
    ns_tarena_chunk *next;
    size_t size; /* usable bytes in data */
    size_t off;  /* next free byte */
    _Alignas(16) unsigned char data[];
};

void ns_tarena_init(ns_tarena *a, size_t cap) {
    a->head = NULL;
    a->used = 0;
    a->cap = cap;
}

static void *alloc(ns_tarena *a, size_t n, int zero);

void *ns_tarena_alloc(ns_tarena *a, size_t n) { return alloc(a, n, 1); }
void *ns_tarena_alloc_raw(ns_tarena *a, size_t n) { return alloc(a, n, 0); }

static void *alloc(ns_tarena *a, size_t n, int zero) {
    if (n > SIZE_MAX / 2) return NULL;
    size_t need = (n + 15) & ~(size_t)15;
    if (need == 0) need = 16;
    ns_tarena_chunk *c = a->head;
    if (!c || c->size - c->off < need) {
        /* Big requests get a chunk of their own so small ones keep filling
         * the current chunk instead of wasting its tail. */
        size_t size = need > CHUNK_MIN / 4 ? need : CHUNK_MIN;
        size_t total = sizeof(ns_tarena_chunk) + size;
        if (a->cap && (total > a->cap || a->used > a->cap - total)) return NULL;
        ns_tarena_chunk *nc = malloc(total);
        if (!nc) return NULL;
        nc->size = size;
        nc->off = 0;
        a->used += total;
        if (c && size != CHUNK_MIN) {
            /* keep filling the older, partly used chunk */
            nc->next = c->next;
            c->next = nc;
            nc->off = need;
            if (zero) memset(nc->data, 0, need);
            return nc->data;
        }
        nc->next = c;
        a->head = nc;
        c = nc;
    }
    void *p = c->data + c->off;
    c->off += need;
    if (zero) memset(p, 0, need);
    return p;
}

char *ns_tarena_strndup(ns_tarena *a, const char *s, size_t n) {
    char *p = ns_tarena_alloc_raw(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void *ns_tarena_grow(ns_tarena *a, void *old, size_t old_n, size_t new_n) {
    void *p = ns_tarena_alloc_raw(a, new_n);
    if (!p) return NULL;
    size_t keep = old && old_n ? (old_n < new_n ? old_n : new_n) : 0;
    if (keep) memcpy(p, old, keep);
    memset((char *)p + keep, 0, new_n - keep);
    return p;
}

void ns_tarena_free(ns_tarena *a) {
    ns_tarena_chunk *c = a->head;
    while (c) {
        ns_tarena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}
