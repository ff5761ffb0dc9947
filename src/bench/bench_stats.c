/* bench_stats.c — see bench_stats.h. */
#include "bench/bench_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ns_bench_rng_seed(ns_bench_rng *r, uint64_t seed) { r->s = seed; }

uint64_t ns_bench_rng_next(ns_bench_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t ns_bench_rng_below(ns_bench_rng *r, uint64_t n) {
    /* rejection: values in the incomplete last copy of [0, n) are redrawn */
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = ns_bench_rng_next(r);
    while (x >= lim);
    return x % n;
}

uint64_t ns_bench_mix(uint64_t seed, uint64_t a, uint64_t b) {
    ns_bench_rng r;
    ns_bench_rng_seed(&r, seed ^ 0x6a09e667f3bcc909ull);
    uint64_t h = ns_bench_rng_next(&r);
    ns_bench_rng_seed(&r, h ^ (a * 0x9e3779b97f4a7c15ull));
    h = ns_bench_rng_next(&r);
    ns_bench_rng_seed(&r, h ^ (b * 0xc2b2ae3d27d4eb4full));
    return ns_bench_rng_next(&r);
}

bool ns_bench_a_first(int block) { return block % 2 == 0; }

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

double ns_bench_quantile(double *v, size_t n, double p) {
    qsort(v, n, sizeof *v, cmp_double);
    if (n == 1 || p <= 0) return v[0];
    if (p >= 1) return v[n - 1];
    const double h = (double)(n - 1) * p;
    const size_t i = (size_t)floor(h);
    const double f = h - (double)i;
    return i + 1 < n ? v[i] + f * (v[i + 1] - v[i]) : v[i];
}

double ns_bench_mean(const double *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    return n ? s / (double)n : NAN;
}

ns_status ns_bench_bootstrap(const double *x, int n, int resamples, double level, uint64_t seed, ns_bench_ci *out,
                             ns_error *err) {
    memset(out, 0, sizeof *out);
    if (n < 1 || resamples < 1 || !(level > 0 && level < 1))
        return ns_fail(err, NS_ERR_INVALID, "bootstrap: need >= 1 value, >= 1 resample and a level in (0, 1)");
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return ns_fail(err, NS_ERR_INVALID, "bootstrap: value %d is not finite", i);
    double *means = malloc((size_t)resamples * sizeof *means);
    if (!means) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_bench_rng r;
    ns_bench_rng_seed(&r, seed);
    for (int k = 0; k < resamples; k++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += x[ns_bench_rng_below(&r, (uint64_t)n)];
        means[k] = s / n;
    }
    const double m = ns_bench_mean(x, (size_t)n);
    const double lo = ns_bench_quantile(means, (size_t)resamples, (1 - level) / 2);
    const double hi = ns_bench_quantile(means, (size_t)resamples, (1 + level) / 2);
    free(means);
    out->mean_log = m;
    out->estimate = exp(m);
    out->lo = exp(lo);
    out->hi = exp(hi);
    out->n = n;
    out->resamples = resamples;
    out->level = level;
    return NS_OK;
}
