/* arena.h — a bump allocator with a hard byte cap, used by the template engine.
 *
 * A template's AST lives in one arena (freed by ns_template_free) and every
 * value made while rendering lives in another (freed when the render ends),
 * so the interpreter never tracks ownership of individual values.
 *
 * Invariants: allocations are 16-byte aligned and zero-filled (except
 * ns_tarena_alloc_raw); the total of
 * all chunk sizes never exceeds cap (0 = unlimited), so a hostile template
 * that builds ever larger strings fails with NULL instead of exhausting
 * memory; nothing is freed before ns_tarena_free.
 */
#ifndef NS_TEMPLATE_ARENA_H
#define NS_TEMPLATE_ARENA_H

#include <stddef.h>

typedef struct ns_tarena_chunk ns_tarena_chunk;

typedef struct ns_tarena {
    ns_tarena_chunk *head; /* chunk being filled; older chunks follow */
    size_t used;           /* bytes reserved from the system, all chunks */
    size_t cap;            /* byte cap on used; 0 = unlimited */
} ns_tarena;

void ns_tarena_init(ns_tarena *a, size_t cap);
/* Returns n zeroed bytes owned by the arena, or NULL when the cap is hit or
 * malloc fails. n == 0 returns a valid unique pointer. */
void *ns_tarena_alloc(ns_tarena *a, size_t n);
/* Like ns_tarena_alloc but the bytes are not zeroed (for buffers that are
 * written before they are read, such as string contents). */
void *ns_tarena_alloc_raw(ns_tarena *a, size_t n);
/* Arena copy of n bytes plus a terminating NUL (NULL on failure). */
char *ns_tarena_strndup(ns_tarena *a, const char *s, size_t n);
/* Grows an arena array: returns a new block of new_n bytes holding the first
 * old_n bytes of old (the old block stays allocated until the arena dies). */
void *ns_tarena_grow(ns_tarena *a, void *old, size_t old_n, size_t new_n);
/* Releases every chunk; the arena may be reused after ns_tarena_init. */
void ns_tarena_free(ns_tarena *a);

#endif
