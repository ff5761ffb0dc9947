/* bench_scenario.h — the named workloads of `nightshift bench` and running
 * one of them against one server for one block.
 *
 * Scenarios (all over /v1/completions with a text prompt, so no chat
 * template or role chunk gets in the way of TTFT, except replay, which
 * re-sends recorded bodies to their own endpoint):
 *   cold-ttft-1k|8k|32k  --requests prompts of ~N tokens, each with a fresh
 *                        seeded prefix (never cached), one at a time:
 *                        ttft_s, prefill_tps (prompt tokens / TTFT)
 *   warm-ttft-1k|8k|32k  per request a ~N-token prompt is sent once (to
 *                        cache it), then again extended by 32 words: the
 *                        second one's ttft_s; cached_frac as reported
 *   decode-1|8|64        that many streams at once, --max-tokens each with
 *                        ignore_eos: per-stream decode tok/s (median),
 *                        aggregate tok/s, ttft_s (median)
 *   sweep                decode at 1, 2, 4, 8 and 16 streams: aggregate
 *                        tok/s per level
 *   pressure             32 streams of ~1k-token prompts at once (more KV
 *                        than a small pool holds): wall_s, ttft_p95_s,
 *                        completed (how many finished)
 *   replay:FILE          a recording (serve --record, record_gen.h format):
 *                        sessions (same first two messages) in parallel,
 *                        turns in order, as fast as possible: wall_s,
 *                        ttft_p50_s, cached tokens as reported
 *   restart-resume[-1k]  needs servers the bench starts itself
 *                        (--server-cmd, bench_server.h): per block a ~8k
 *                        (or 1k) prompt cold, then a graceful restart
 *                        (SIGTERM, start, ready), then the same prompt
 *                        again: cold_ttft_s, restart_s,
 *                        ttft_after_restart_s, cached_frac_after (as
 *                        reported); skipped, with the reason, when a
 *                        server was not started by the bench
 * Each block's workload comes from its seed (ns_bench_mix of --seed and
 * the block): the same prompts for both servers of a pair, different
 * ones in every block.
 *
 * Identity probe: after the scenario, each block sends one non-streamed
 * request at temperature 0 with a fixed seed (48-word prompt, 16 tokens);
 * its text and usage, and the sum of the scenario's reported prompt
 * tokens, are what the identity gate compares between servers.
 *
 * Ownership: ns_bench_scenario owns its replay records
 * (ns_bench_scenario_free); ns_bench_run owns its probe text
 * (ns_bench_run_free). Targets are borrowed. */
#ifndef NS_BENCH_SCENARIO_H
#define NS_BENCH_SCENARIO_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

#define NS_BENCH_MAX_METRICS 8

typedef struct ns_bench_metric_def {
    char name[32];
    char unit[12];
    bool higher_better;
    bool compare; /* a performance figure: ratios and CIs; else informational */
} ns_bench_metric_def;

typedef enum {
    NS_BENCH_COLD_TTFT,
    NS_BENCH_WARM_TTFT,
    NS_BENCH_DECODE,
    NS_BENCH_SWEEP,
    NS_BENCH_PRESSURE,
    NS_BENCH_REPLAY,
    NS_BENCH_RESTART,
} ns_bench_kind;

typedef struct ns_bench_scenario {
    char name[300];
    ns_bench_kind kind;
    int64_t prompt_words;
    int streams;
    int requests;      /* per block (TTFT scenarios) */
    int max_tokens;    /* decode / pressure / sweep */
    double timeout_s;  /* per request */
    int n_metrics;
    ns_bench_metric_def metrics[NS_BENCH_MAX_METRICS];
    bool skipped;
    char skip_reason[256];
    json_t *replay;    /* array of sessions, each an array of {endpoint, body} */
    int replay_skipped;
    char replay_note[256];
} ns_bench_scenario;

struct ns_bench_server;

typedef struct ns_bench_target {
    char root[512];           /* "http://host:port", no trailing slash */
    struct ns_bench_server *server; /* started by the bench (restartable), or NULL */
    char model[256];          /* the "model" field sent */
    const char *const *headers; /* auth headers (borrowed), NULL-terminated */
} ns_bench_target;

typedef struct ns_bench_run {
    double values[NS_BENCH_MAX_METRICS];
    bool have[NS_BENCH_MAX_METRICS];
    int n_requests, n_failed;
    char first_error[400];
    double wall_s;
    /* identity */
    bool probe_ok;
    char probe_error[320];
    char *probe_text;
    int64_t probe_prompt_tokens, probe_completion_tokens;
    int64_t prompt_tokens_sum; /* over the scenario's requests; -1 when a request did not report it */
} ns_bench_run;

/* Parses a scenario name (see above) with the run's settings.
 * NS_ERR_INVALID with a message for an unknown name or a bad recording. */
ns_status ns_bench_scenario_parse(const char *name, int requests, int max_tokens, double timeout_s,
                                  ns_bench_scenario *out, ns_error *err);
void ns_bench_scenario_free(ns_bench_scenario *s);

/* Runs one block of s against t with the block's workload seed, then the
 * identity probe. Never fails as a whole: failures are counted in out. */
void ns_bench_run_block(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t block_seed, ns_bench_run *out);
void ns_bench_run_free(ns_bench_run *r);

#endif
