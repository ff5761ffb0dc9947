/* test_bench_result.c — the identity gate and the paired comparison of
 * `nightshift bench` on synthetic runs (bench_result.h), and scenario
 * parsing including a recording's grouping into sessions
 * (bench_scenario.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench_result.h"
#include "bench/bench_scenario.h"
#include "test.h"

enum { NB = 5 };
static ns_bench_run g_runs[NB * 2];
static uint64_t g_seeds[NB] = {1, 2, 3, 4, 5};
static char g_text[NB * 2][32];

/* Five blocks where B's ttft is 2x A's and prefill_tps half, with equal
 * probes: the baseline each test then breaks in one way. */
static void make_runs(void) {
    memset(g_runs, 0, sizeof g_runs);
    for (int b = 0; b < NB; b++)
        for (int s = 0; s < 2; s++) {
            ns_bench_run *r = &g_runs[b * 2 + s];
            const double a_ttft = 0.1 + 0.01 * b;
            r->values[0] = s ? 2 * a_ttft : a_ttft;
            r->values[1] = s ? 500.0 : 1000.0;
            r->have[0] = r->have[1] = true;
            r->n_requests = 3;
            r->probe_ok = true;
            snprintf(g_text[b * 2 + s], sizeof g_text[0], "hello %d", b);
            r->probe_text = g_text[b * 2 + s];
            r->probe_prompt_tokens = 50;
            r->probe_completion_tokens = 16;
            r->prompt_tokens_sum = 3000;
        }
}

static ns_bench_result_in input(const ns_bench_scenario *sc, int n_servers) {
    ns_bench_result_in in = {.scenario = sc, .n_servers = n_servers, .labels = {"A", "B"}, .urls = {"http://a", "http://b"},
                             .blocks = NB, .seed = 1, .block_seeds = g_seeds, .runs = g_runs, .resamples = 1000,
                             .level = 0.95};
    return in;
}

static json_t *metric_named(json_t *root, const char *name) {
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(json_object_get(root, "comparison"), "metrics"), i, m) if (
        !strcmp(json_string_value(json_object_get(m, "name")), name)) return m;
    return NULL;
}

static ns_bench_scenario cold(void) {
    ns_bench_scenario sc;
    ns_error err = {0};
    CHECK(ns_bench_scenario_parse("cold-ttft-1k", 3, 64, 60, &sc, &err) == NS_OK);
    return sc;
}

TEST(gate_passes_and_ratios_are_exact) {
    make_runs();
    ns_bench_scenario sc = cold();
    ns_bench_result_in in = input(&sc, 2);
    json_t *r = ns_bench_result_build(&in);
    CHECK(r != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(r, "identity"), "verdict")), "pass");
    json_t *t = metric_named(r, "ttft_s"), *p = metric_named(r, "prefill_tps");
    CHECK(t && p);
    /* every block's log-ratio is ln 2: the estimate and both bounds are 2 */
    CHECK_NEAR(json_number_value(json_object_get(t, "ratio")), 2.0, 1e-12);
    CHECK_NEAR(json_number_value(json_object_get(t, "ci_lo")), 2.0, 1e-12);
    CHECK_NEAR(json_number_value(json_object_get(t, "ci_hi")), 2.0, 1e-12);
    CHECK_EQ_STR(json_string_value(json_object_get(t, "better")), "A"); /* lower ttft is better */
    CHECK_NEAR(json_number_value(json_object_get(p, "ratio")), 0.5, 1e-12);
    CHECK_EQ_STR(json_string_value(json_object_get(p, "better")), "A"); /* higher rate is better */
    CHECK(json_is_false(json_object_get(json_object_get(r, "comparison"), "withheld")));
    /* blocks alternate AB / BA */
    json_t *bl = json_object_get(r, "block_runs");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(bl, 0), "order")), "AB");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(bl, 1), "order")), "BA");
    json_decref(r);
}

TEST(different_output_withholds_every_ratio) {
    make_runs();
    g_runs[3 * 2 + 1].probe_text = "hellO 3";
    ns_bench_scenario sc = cold();
    ns_bench_result_in in = input(&sc, 2);
    json_t *r = ns_bench_result_build(&in);
    json_t *id = json_object_get(r, "identity");
    CHECK_EQ_STR(json_string_value(json_object_get(id, "verdict")), "fail");
    CHECK_EQ_INT(json_array_size(json_object_get(id, "reasons")), 1);
    const char *why = json_string_value(json_array_get(json_object_get(id, "reasons"), 0));
    CHECKF(why && strstr(why, "block 3") && strstr(why, "at byte 4"), "%s", why ? why : "(null)");
    json_decref(r);
    /* texts that part inside a multi-byte character show whole characters */
    make_runs();
    g_runs[1 * 2 + 0].probe_text = "ab\xc3\xa9z";     /* abéz */
    g_runs[1 * 2 + 1].probe_text = "ab\xc3\xa8z";     /* abèz */
    r = ns_bench_result_build(&in);
    why = json_string_value(json_array_get(json_object_get(json_object_get(r, "identity"), "reasons"), 0));
    CHECKF(why && strstr(why, "at byte 2: \"\xc3\xa9z\" vs \"\xc3\xa8z\""), "%s", why ? why : "(null)");
    CHECK(json_is_true(json_object_get(json_object_get(r, "comparison"), "withheld")));
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(json_object_get(r, "comparison"), "metrics"), i, m) {
        CHECK(json_is_true(json_object_get(m, "withheld")));
        CHECK(json_object_get(m, "ratio") == NULL);
    }
    json_decref(r);
}

TEST(usage_and_prompt_token_mismatches_fail_the_gate) {
    make_runs();
    g_runs[0 * 2 + 1].probe_completion_tokens = 15;
    g_runs[2 * 2 + 0].prompt_tokens_sum = 2999;
    ns_bench_scenario sc = cold();
    ns_bench_result_in in = input(&sc, 2);
    const char *v;
    json_t *reasons = json_array();
    ns_bench_identity(&in, &v, reasons);
    CHECK_EQ_STR(v, "fail");
    CHECK_EQ_INT(json_array_size(reasons), 2);
    CHECK(strstr(json_string_value(json_array_get(reasons, 0)), "completion_tokens 16 vs 15") != NULL);
    CHECK(strstr(json_string_value(json_array_get(reasons, 1)), "2999") != NULL);
    json_decref(reasons);
    /* a failed probe cannot vouch for identity either */
    make_runs();
    g_runs[4 * 2].probe_ok = false;
    snprintf(g_runs[4 * 2].probe_error, sizeof g_runs[0].probe_error, "HTTP 500: boom");
    reasons = json_array();
    ns_bench_identity(&in, &v, reasons);
    CHECK_EQ_STR(v, "fail");
    CHECK(strstr(json_string_value(json_array_get(reasons, 0)), "HTTP 500: boom") != NULL);
    json_decref(reasons);
}

TEST(missing_value_withholds_that_metric_only) {
    make_runs();
    g_runs[3 * 2 + 0].have[1] = false; /* A's prefill_tps missing in block 3 */
    g_runs[3 * 2 + 0].n_failed = 1;
    ns_bench_scenario sc = cold();
    ns_bench_result_in in = input(&sc, 2);
    json_t *r = ns_bench_result_build(&in);
    json_t *p = metric_named(r, "prefill_tps"), *t = metric_named(r, "ttft_s");
    CHECK(json_is_true(json_object_get(p, "withheld")));
    CHECK(strstr(json_string_value(json_object_get(p, "withheld_reason")), "block(s) 3") != NULL);
    CHECK(json_is_null(json_array_get(json_object_get(p, "log_ratios"), 3)));
    CHECK(json_is_false(json_object_get(t, "withheld")));
    json_decref(r);
}

TEST(single_server_has_no_comparison) {
    make_runs();
    for (int b = 0; b < NB; b++) g_runs[b] = g_runs[b * 2]; /* [blocks][1] */
    ns_bench_scenario sc = cold();
    ns_bench_result_in in = input(&sc, 1);
    json_t *r = ns_bench_result_build(&in);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(r, "identity"), "verdict")), "not_applicable");
    CHECK(json_is_null(json_object_get(r, "comparison")));
    json_t *sum = json_object_get(json_object_get(json_array_get(json_object_get(r, "servers"), 0), "summary"), "ttft_s");
    CHECK_NEAR(json_number_value(json_object_get(sum, "median")), 0.12, 1e-12);
    CHECK(json_object_get(sum, "geomean") != NULL);
    json_decref(r);
}

TEST(scenario_names) {
    ns_bench_scenario sc;
    ns_error err = {0};
    const char *good[] = {"cold-ttft-1k", "cold-ttft-8k", "cold-ttft-32k", "warm-ttft-8k", "decode-1", "decode-64",
                          "sweep", "pressure", "restart-resume", "restart-resume-1k"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        CHECKF(ns_bench_scenario_parse(good[i], 0, 0, 0, &sc, &err) == NS_OK, "%s", good[i]);
        CHECK(sc.n_metrics > 0 || sc.skipped);
        ns_bench_scenario_free(&sc);
    }
    CHECK(ns_bench_scenario_parse("decode-2", 0, 0, 0, &sc, &err) == NS_ERR_INVALID);
    CHECK(strstr(err.msg, "unknown scenario") != NULL);
    CHECK(ns_bench_scenario_parse("cold-ttft-2k", 0, 0, 0, &sc, &err) == NS_ERR_INVALID);
    CHECK(ns_bench_scenario_parse("replay:/nonexistent/file", 0, 0, 0, &sc, &err) == NS_ERR_IO);
    ns_bench_scenario_free(&sc);
    /* skipped later by the CLI when a server is not started by the bench */
    CHECK(ns_bench_scenario_parse("restart-resume", 0, 0, 0, &sc, &err) == NS_OK && sc.prompt_words == 8000);
    CHECK(ns_bench_scenario_parse("restart-resume-1k", 0, 0, 0, &sc, &err) == NS_OK && sc.prompt_words == 1000);
    CHECK_EQ_STR(sc.metrics[2].name, "ttft_after_restart_s");
}

/* A recording: two sessions (same system + first user message), turns
 * ordered by arrival "t" (the file is in completion order), and the
 * records that cannot be replayed skipped and counted. */
TEST(replay_groups_sessions) {
    char path[] = "/tmp/ns_test_replay_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    const char *S1 = "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"one\"}";
    const char *S2 = "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"two\"}";
    fprintf(f, "{\"t\":3,\"endpoint\":\"/v1/chat/completions\",\"status\":200,\"request\":{\"messages\":%s,{\"role\":\"assistant\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"more\"}]}}\n", S1);
    fprintf(f, "{\"t\":1,\"endpoint\":\"/v1/chat/completions\",\"status\":200,\"request\":{\"messages\":%s]}}\n", S1);
    fprintf(f, "{\"t\":2,\"endpoint\":\"/v1/chat/completions\",\"status\":200,\"request\":{\"messages\":%s]}}\n", S2);
    fprintf(f, "{\"t\":4,\"endpoint\":\"/v1/chat/completions\",\"status\":400,\"request\":{\"messages\":%s]}}\n", S2);
    fprintf(f, "{\"t\":5,\"endpoint\":\"/v1/chat/completions\",\"status\":200,\"redacted\":true,\"request\":{\"messages\":%s]}}\n", S2);
    fprintf(f, "{\"t\":6,\"endpoint\":\"/v1/messages\",\"status\":200,\"request\":{\"messages\":%s]}}\n", S2);
    fclose(f);
    char name[300];
    snprintf(name, sizeof name, "replay:%s", path);
    ns_bench_scenario sc;
    ns_error err = {0};
    CHECKF(ns_bench_scenario_parse(name, 0, 0, 0, &sc, &err) == NS_OK, "%s", err.msg);
    CHECK_EQ_INT(json_array_size(sc.replay), 2);
    CHECK_EQ_INT(sc.replay_skipped, 3);
    json_t *s1 = json_array_get(sc.replay, 0);
    CHECK_EQ_INT(json_array_size(s1), 2);
    /* t=1 before t=3 although the file had them the other way round */
    CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(json_array_get(s1, 0), "body"), "messages")), 2);
    CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(json_array_get(s1, 1), "body"), "messages")), 4);
    ns_bench_scenario_free(&sc);
    f = fopen(path, "w");
    fputs("not json\n", f);
    fclose(f);
    CHECK(ns_bench_scenario_parse(name, 0, 0, 0, &sc, &err) == NS_ERR_INVALID);
    CHECK(strstr(err.msg, "line 1") != NULL);
    ns_bench_scenario_free(&sc);
    remove(path);
}

int main(void) {
    RUN(gate_passes_and_ratios_are_exact);
    RUN(different_output_withholds_every_ratio);
    RUN(usage_and_prompt_token_mismatches_fail_the_gate);
    RUN(missing_value_withholds_that_metric_only);
    RUN(single_server_has_no_comparison);
    RUN(scenario_names);
    RUN(replay_groups_sessions);
    TEST_MAIN_END;
}
