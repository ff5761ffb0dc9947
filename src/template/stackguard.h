/* stackguard.h — how deep the template engine may recurse on this thread.
 *
 * The parser and interpreter recurse over the template's structure. Depth
 * caps bound that in principle, but the C stack a caller's thread has is
 * unknown (a server worker may have far less than the main thread's 8 MiB),
 * so recursion points also compare the current stack position against the
 * lowest address that leaves a safety margin, and fail cleanly past it.
 *
 * Invariant: ns_tstack_floor() returns an address the stack pointer may go
 * down to (never above the caller's current position); the thread's stack
 * bounds are looked up once per thread and cached.
 */
#ifndef NS_TEMPLATE_STACKGUARD_H
#define NS_TEMPLATE_STACKGUARD_H

#include <stdint.h>

/* Lowest stack address recursion may reach on the calling thread. */
uintptr_t ns_tstack_floor(void);

/* 1 when the current frame is below floor (recursing further is unsafe). */
static inline int ns_tstack_exhausted(uintptr_t floor) {
    char here;
    return (uintptr_t)&here < floor;
}

#endif
