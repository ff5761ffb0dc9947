/* test_bench_stats.c — the statistics of `nightshift bench` against
 * hand-computed cases and a known distribution (bench_stats.h). */
#include <math.h>

#include "bench/bench_stats.h"
#include "test.h"

/* numpy.quantile([1, 2, 3, 4], p) (linear / type 7): 0.5 -> 2.5,
 * 0.25 -> 1.75, 0.1 -> 1.3, 0.9 -> 3.7 */
TEST(quantile_type7_hand_computed) {
    double v[4] = {4, 1, 3, 2};
    CHECK_NEAR(ns_bench_quantile(v, 4, 0.5), 2.5, 1e-12);
    CHECK_NEAR(ns_bench_quantile(v, 4, 0.25), 1.75, 1e-12);
    CHECK_NEAR(ns_bench_quantile(v, 4, 0.1), 1.3, 1e-12);
    CHECK_NEAR(ns_bench_quantile(v, 4, 0.9), 3.7, 1e-12);
    CHECK_NEAR(ns_bench_quantile(v, 4, 0.0), 1, 0);
    CHECK_NEAR(ns_bench_quantile(v, 4, 1.0), 4, 0);
    double one = 7;
    CHECK_NEAR(ns_bench_quantile(&one, 1, 0.3), 7, 0);
}

/* AB in even blocks, BA in odd ones: every even number of blocks puts
 * each server first equally often. */
TEST(pairing_order_alternates) {
    CHECK(ns_bench_a_first(0));
    CHECK(!ns_bench_a_first(1));
    CHECK(ns_bench_a_first(2));
    CHECK(!ns_bench_a_first(3));
    for (int n = 2; n <= 20; n += 2) {
        int a = 0;
        for (int b = 0; b < n; b++) a += ns_bench_a_first(b);
        CHECK_EQ_INT(a, n / 2);
    }
}

/* Block seeds differ per block and per request, and do not depend on the
 * order they are asked for. */
TEST(mix_distinct_and_stable) {
    uint64_t s[64];
    for (int b = 0; b < 8; b++)
        for (int r = 0; r < 8; r++) s[b * 8 + r] = ns_bench_mix(42, (uint64_t)b, (uint64_t)r);
    for (int i = 0; i < 64; i++)
        for (int j = i + 1; j < 64; j++) CHECK(s[i] != s[j]);
    CHECK(ns_bench_mix(42, 3, 5) == s[3 * 8 + 5]);
    CHECK(ns_bench_mix(43, 3, 5) != s[3 * 8 + 5]);
}

TEST(rng_below_in_range_and_roughly_uniform) {
    ns_bench_rng r;
    ns_bench_rng_seed(&r, 1);
    int counts[6] = {0};
    for (int i = 0; i < 60000; i++) {
        uint64_t x = ns_bench_rng_below(&r, 6);
        CHECK(x < 6);
        if (x < 6) counts[x]++;
    }
    /* chi-square with 5 degrees of freedom: 20.5 is its 0.999 quantile */
    double chi = 0;
    for (int k = 0; k < 6; k++) chi += (counts[k] - 10000.0) * (counts[k] - 10000.0) / 10000.0;
    CHECKF(chi < 20.5, "chi-square %.2f", chi);
}

/* x = {0, ln 2}: a resampled mean is 0 (p 1/4), ln2/2 (1/2) or ln2 (1/4),
 * so with 2000 resamples the 2.5% and 97.5% quantiles are 0 and ln 2
 * (P(fewer than 50 of 2000 are 0) is ~1e-90): ratio sqrt(2) in [1, 2]. */
TEST(bootstrap_two_values_hand_computed) {
    double x[2] = {0, log(2.0)};
    ns_bench_ci ci;
    ns_error err = {0};
    CHECK(ns_bench_bootstrap(x, 2, 2000, 0.95, 7, &ci, &err) == NS_OK);
    CHECK_NEAR(ci.estimate, sqrt(2.0), 1e-12);
    CHECK_NEAR(ci.lo, 1.0, 1e-12);
    CHECK_NEAR(ci.hi, 2.0, 1e-12);
    CHECK_EQ_INT(ci.n, 2);
    CHECK_EQ_INT(ci.resamples, 2000);
}

TEST(bootstrap_degenerate_cases) {
    ns_bench_ci ci;
    ns_error err = {0};
    double one = log(1.5);
    CHECK(ns_bench_bootstrap(&one, 1, 1000, 0.95, 1, &ci, &err) == NS_OK);
    CHECK_NEAR(ci.lo, 1.5, 1e-12);
    CHECK_NEAR(ci.hi, 1.5, 1e-12);
    double same[5] = {0.2, 0.2, 0.2, 0.2, 0.2};
    CHECK(ns_bench_bootstrap(same, 5, 1000, 0.95, 1, &ci, &err) == NS_OK);
    CHECK_NEAR(ci.lo, exp(0.2), 1e-12);
    CHECK_NEAR(ci.hi, exp(0.2), 1e-12);
    double bad[2] = {0.1, NAN};
    CHECK(ns_bench_bootstrap(bad, 2, 1000, 0.95, 1, &ci, &err) == NS_ERR_INVALID);
    CHECK(ns_bench_bootstrap(same, 0, 1000, 0.95, 1, &ci, &err) == NS_ERR_INVALID);
    CHECK(ns_bench_bootstrap(same, 5, 1000, 1.0, 1, &ci, &err) == NS_ERR_INVALID);
}

TEST(bootstrap_is_seeded) {
    double x[7] = {0.1, -0.3, 0.25, 0.05, 0.4, -0.1, 0.2};
    ns_bench_ci a, b, c;
    ns_error err = {0};
    CHECK(ns_bench_bootstrap(x, 7, 1000, 0.95, 11, &a, &err) == NS_OK);
    CHECK(ns_bench_bootstrap(x, 7, 1000, 0.95, 11, &b, &err) == NS_OK);
    CHECK(ns_bench_bootstrap(x, 7, 1000, 0.95, 12, &c, &err) == NS_OK);
    CHECK(a.lo == b.lo && a.hi == b.hi);
    CHECK(a.lo != c.lo || a.hi != c.hi);
    CHECK(a.lo < a.estimate && a.estimate < a.hi);
}

/* Normal draws (Box-Muller over the bench PRNG). */
static double normal(ns_bench_rng *r, double mu, double sd) {
    double u1 = ((double)(ns_bench_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(ns_bench_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
    return mu + sd * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

/* A known distribution: for n = 200 draws of N(0.1, 0.2) the bootstrap
 * interval of the mean must match the normal-theory one, mean +- 1.96 s /
 * sqrt(n), within 12% of its half-width (bootstrap noise at 4000
 * resamples is ~3%). */
TEST(bootstrap_matches_normal_theory) {
    enum { N = 200 };
    double x[N];
    ns_bench_rng r;
    ns_bench_rng_seed(&r, 2024);
    for (int i = 0; i < N; i++) x[i] = normal(&r, 0.1, 0.2);
    double m = ns_bench_mean(x, N), ss = 0;
    for (int i = 0; i < N; i++) ss += (x[i] - m) * (x[i] - m);
    const double se = sqrt(ss / (N - 1)) / sqrt((double)N), half = 1.959964 * se;
    ns_bench_ci ci;
    ns_error err = {0};
    CHECK(ns_bench_bootstrap(x, N, 4000, 0.95, 5, &ci, &err) == NS_OK);
    CHECK_NEAR(log(ci.lo), m - half, 0.12 * half);
    CHECK_NEAR(log(ci.hi), m + half, 0.12 * half);
    CHECK_NEAR(log(ci.estimate), m, 1e-12);
}

/* Coverage: over 300 samples of 20 draws of N(0.3, 0.5) the 95% interval
 * holds the true mean about 93-95% of the time (the percentile bootstrap
 * runs a little narrow at n = 20). Binomial noise at 300 trials: sd ~1.3%. */
TEST(bootstrap_coverage_known_mean) {
    ns_bench_rng r;
    ns_bench_rng_seed(&r, 99);
    int hit = 0;
    const int trials = 300;
    for (int t = 0; t < trials; t++) {
        double x[20];
        for (int i = 0; i < 20; i++) x[i] = normal(&r, 0.3, 0.5);
        ns_bench_ci ci;
        ns_error err = {0};
        CHECK(ns_bench_bootstrap(x, 20, 1000, 0.95, (uint64_t)t, &ci, &err) == NS_OK);
        hit += log(ci.lo) <= 0.3 && 0.3 <= log(ci.hi);
    }
    double cov = (double)hit / trials;
    CHECKF(cov > 0.88 && cov < 0.99, "coverage %.3f", cov);
}

int main(void) {
    RUN(quantile_type7_hand_computed);
    RUN(pairing_order_alternates);
    RUN(mix_distinct_and_stable);
    RUN(rng_below_in_range_and_roughly_uniform);
    RUN(bootstrap_two_values_hand_computed);
    RUN(bootstrap_degenerate_cases);
    RUN(bootstrap_is_seeded);
    RUN(bootstrap_matches_normal_theory);
    RUN(bootstrap_coverage_known_mean);
    TEST_MAIN_END;
}
