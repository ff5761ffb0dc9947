/* bench_stats.h — the statistics of `nightshift bench`: a seeded PRNG,
 * the paired block order, percentiles, and percentile-bootstrap
 * confidence intervals of per-block log-ratios.
 *
 * Method (why each piece): two servers are measured in paired blocks; a
 * block runs the same workload (same seed) on both, A then B in even
 * blocks and B then A in odd ones (ns_bench_a_first), so drift of the
 * machine (thermal, other load, caches warming) cancels over pairs
 * instead of favouring whichever always runs second. Each block gives one
 * log-ratio ln(B/A) per metric; blocks are the independent units, so the
 * bootstrap resamples blocks (with replacement), never requests. The
 * estimate is exp(mean log-ratio) (a geometric-mean ratio: symmetric in
 * A/B, unlike a mean of ratios), the interval the 2.5/97.5 (or given)
 * percentiles of the resampled means, exponentiated.
 *
 * Everything is deterministic for a given seed (tests and re-runs give the
 * same interval); nothing here allocates except ns_bench_bootstrap's
 * scratch, freed before it returns. */
#ifndef NS_BENCH_STATS_H
#define NS_BENCH_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

/* splitmix64: small, seedable, good enough for resampling and workload
 * generation (not cryptographic). */
typedef struct ns_bench_rng {
    uint64_t s;
} ns_bench_rng;
void ns_bench_rng_seed(ns_bench_rng *r, uint64_t seed);
uint64_t ns_bench_rng_next(ns_bench_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t ns_bench_rng_below(ns_bench_rng *r, uint64_t n);
/* A seed derived from (seed, a, b): distinct workloads per block and
 * request that do not depend on run order. */
uint64_t ns_bench_mix(uint64_t seed, uint64_t a, uint64_t b);

/* The paired order: true when server A runs first in block b
 * (0-based): A,B in even blocks, B,A in odd ones. */
bool ns_bench_a_first(int block);

/* The p-quantile (0..1) of v[0..n) by linear interpolation between order
 * statistics (type 7, as numpy's default); sorts v in place. n > 0. */
double ns_bench_quantile(double *v, size_t n, double p);
double ns_bench_mean(const double *v, size_t n);

typedef struct ns_bench_ci {
    double estimate;  /* exp(mean of the log-ratios) */
    double lo, hi;    /* exp of the percentile bounds */
    double mean_log;  /* mean of the log-ratios */
    int n;            /* blocks */
    int resamples;
    double level;     /* e.g. 0.95 */
} ns_bench_ci;

/* Percentile bootstrap of the mean of x[0..n) (log-ratios): `resamples`
 * (>= 1) means of n values drawn with replacement using the PRNG seeded
 * with seed; lo/hi are their (1-level)/2 and (1+level)/2 quantiles, then
 * everything is exponentiated. n >= 1 (with n == 1 the interval is the
 * point). NS_ERR_INVALID for a non-finite x or bad arguments, NS_ERR_NOMEM. */
ns_status ns_bench_bootstrap(const double *x, int n, int resamples, double level, uint64_t seed, ns_bench_ci *out,
                             ns_error *err);

#endif
