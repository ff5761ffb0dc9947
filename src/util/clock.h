/* clock.h — the one monotonic clock: seconds since an arbitrary fixed
 * point (CLOCK_MONOTONIC), for durations and timeouts. Never goes back;
 * unaffected by wall-clock changes. Thread-safe. */
#ifndef NS_CLOCK_H
#define NS_CLOCK_H

double ns_clock_now(void);

#endif
