/* vec.h — growing a heap array: the one copy of the realloc-doubling
 * pattern.
 *
 * ns_vec_grow makes room for at least `need` elements of elem_size bytes in
 * the array *p whose capacity (in elements) is *cap: nothing happens when
 * need <= *cap; otherwise the capacity doubles, starting from *cap (or
 * NS_VEC_MIN_CAP for an empty array), until it holds need, and is then
 * clamped to max_elems. Sizes are overflow-checked. Returns NS_ERR_NOMEM
 * (leaving *p and *cap untouched, the old array still valid) when need
 * exceeds max_elems, the byte size would overflow, or realloc fails.
 * max_elems 0 means no limit beyond SIZE_MAX / elem_size. Elements past the
 * old capacity are uninitialized.
 *
 *   int32_t *ids = NULL; size_t cap = 0, n = 0;
 *   if (NS_VEC_GROW(ids, cap, n + 1, 0) != NS_OK) return NS_ERR_NOMEM;
 *   ids[n++] = tok;
 */
#ifndef NS_VEC_H
#define NS_VEC_H

#include <stddef.h>

#include "util/status.h"

#define NS_VEC_MIN_CAP 16

/* The slow path of ns_vec_grow (need > *cap). */
ns_status ns_vec_realloc(void **p, size_t *cap, size_t need, size_t elem_size, size_t max_elems);

/* p is the address of the array pointer (a T ** cast to void **). */
static inline ns_status ns_vec_grow(void **p, size_t *cap, size_t need, size_t elem_size, size_t max_elems) {
    return need <= *cap ? NS_OK : ns_vec_realloc(p, cap, need, elem_size, max_elems);
}

/* Shorthand that derives elem_size from the array: ptr is a T * lvalue,
 * cap a size_t lvalue. */
#define NS_VEC_GROW(ptr, cap, need, max_elems) \
    ns_vec_grow((void **)&(ptr), &(cap), (need), sizeof *(ptr), (max_elems))

#endif
