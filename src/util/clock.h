/* clock.h — the one monotonic clock: seconds since an arbitrary fixed
 * point (CLOCK_MONOTONIC), for durations and timeouts. Never goes back;
 * unaffected by wall-clock changes. Thread-safe. */
#ifndef NS_CLOCK_H
#define NS_CLOCK_H

#include <stdint.h>
#include <time.h>

double ns_clock_now(void);
/* The absolute time ms milliseconds from now on clock clk, normalized: the
 * deadline pthread_cond_timedwait takes (CLOCK_REALTIME for a default
 * condition variable, CLOCK_MONOTONIC for one created with that clock). */
struct timespec ns_clock_deadline(clockid_t clk, int64_t ms);

#endif
