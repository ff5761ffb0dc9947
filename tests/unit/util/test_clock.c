/* ns_clock_now: monotonic seconds. */
#include <time.h>

#include "test.h"
#include "util/clock.h"

TEST(clock_monotonic_and_advances) {
    double a = ns_clock_now();
    CHECK(a > 0);
    double prev = a;
    for (int i = 0; i < 1000; i++) {
        double t = ns_clock_now();
        CHECK(t >= prev);
        prev = t;
    }
    struct timespec ts = {0, 20 * 1000 * 1000}; /* 20 ms */
    nanosleep(&ts, NULL);
    double d = ns_clock_now() - a;
    CHECKF(d >= 0.019 && d < 5.0, "slept 20 ms, clock advanced %.6f s", d);
}

TEST(clock_matches_clock_monotonic) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double ref = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    CHECK_NEAR(ns_clock_now(), ref, 0.5);
}

int main(void) {
    RUN(clock_monotonic_and_advances);
    RUN(clock_matches_clock_monotonic);
    TEST_MAIN_END;
}
