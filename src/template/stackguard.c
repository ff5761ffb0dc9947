#include "template/stackguard.h"

#include <pthread.h>

/* Room kept free below the last checked frame for library calls made
 * between checks (printf-family, strtod, utf8proc) and sanitizer
 * instrumentation: a quarter of the stack, between 32 KiB and 192 KiB. */
#define MARGIN_MIN ((uintptr_t)32 * 1024)
#define MARGIN_MAX ((uintptr_t)192 * 1024)
/* Used when the thread's stack bounds cannot be determined. */
#define FALLBACK_BUDGET ((uintptr_t)256 * 1024)

static _Thread_local uintptr_t t_stack_lo;  /* 0 = not looked up, 1 = unknown */
static _Thread_local uintptr_t t_margin;

uintptr_t ns_tstack_floor(void) {
    char here;
    uintptr_t sp = (uintptr_t)&here;
    if (!t_stack_lo) {
        pthread_attr_t at;
        t_stack_lo = 1;
        if (pthread_getattr_np(pthread_self(), &at) == 0) {
            void *addr;
            size_t size;
            if (pthread_attr_getstack(&at, &addr, &size) == 0 && addr) {
                t_stack_lo = (uintptr_t)addr;
                t_margin = size / 4;
                if (t_margin < MARGIN_MIN) t_margin = MARGIN_MIN;
                if (t_margin > MARGIN_MAX) t_margin = MARGIN_MAX;
            }
            pthread_attr_destroy(&at);
        }
    }
    if (t_stack_lo > 1 && t_stack_lo < sp && sp - t_stack_lo > t_margin) return t_stack_lo + t_margin;
    return sp > FALLBACK_BUDGET ? sp - FALLBACK_BUDGET : 0;
}
