#include "util/vec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

ns_status ns_vec_realloc(void **p, size_t *cap, size_t need, size_t elem_size, size_t max_elems) {
    if (need <= *cap) return NS_OK;
    size_t limit = SIZE_MAX / elem_size;
    if (max_elems && max_elems < limit) limit = max_elems;
    if (need > limit) return NS_ERR_NOMEM;
    size_t nc = *cap ? *cap : NS_VEC_MIN_CAP;
    while (nc < need) nc = nc > limit / 2 ? limit : nc * 2;
    if (nc > limit) nc = limit;
    /* *p is really a T *: read and write it as bytes (memcpy), not as a
     * void * lvalue (all object pointers share one representation here). */
    void *old;
    memcpy(&old, p, sizeof old);
    void *q = realloc(old, nc * elem_size);
    if (!q) return NS_ERR_NOMEM;
    memcpy(p, &q, sizeof q);
    *cap = nc;
    return NS_OK;
}
