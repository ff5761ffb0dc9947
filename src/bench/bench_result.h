/* bench_result.h — turns the runs of `nightshift bench` into its JSON
 * result: per-server summaries, the identity gate's verdict, and the
 * paired comparison (bootstrap CIs of per-block log-ratios B/A).
 *
 * The identity gate (why ratios can be withheld): a speed ratio means
 * something only when both servers did the same work. In every block
 * both answered the same greedy, seeded probe; the gate passes when in
 * every block both probes succeeded, their texts are equal and their
 * usage (prompt and completion tokens) agrees, and the scenario's
 * reported prompt tokens add up to the same sum on both. Otherwise the
 * verdict is "fail" with one reason per mismatch, and every ratio is
 * withheld (the report shows why instead of a number). A metric missing
 * in some block (its requests failed there) is withheld on its own, with
 * the blocks named; the other metrics still compare.
 *
 * Ownership: runs and the scenario are borrowed; the returned json_t is
 * the caller's (json_decref). */
#ifndef NS_BENCH_RESULT_H
#define NS_BENCH_RESULT_H

#include <jansson.h>
#include <stdint.h>

#include "bench/bench_scenario.h"

#define NS_BENCH_MIN_RESAMPLES 1000

typedef struct ns_bench_result_in {
    const ns_bench_scenario *scenario;
    int n_servers;               /* 1 or 2 */
    const char *labels[2];       /* "A", "B" */
    const char *urls[2];
    int blocks;
    uint64_t seed;
    const uint64_t *block_seeds; /* [blocks] */
    const ns_bench_run *runs;    /* [blocks][n_servers], row-major */
    int resamples;
    double level;
} ns_bench_result_in;

/* The identity gate alone: "pass" / "fail" into *verdict (static string)
 * and one reason string per mismatch appended to reasons (a JSON array). */
void ns_bench_identity(const ns_bench_result_in *in, const char **verdict, json_t *reasons);

/* The whole result object (without "provenance", which the caller adds).
 * NULL on OOM. */
json_t *ns_bench_result_build(const ns_bench_result_in *in);

#endif
