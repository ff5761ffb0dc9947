/* bench_result.c — summaries, identity gate and paired comparison (see
 * bench_result.h). */
#include "bench/bench_result.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_stats.h"

static const ns_bench_run *run_at(const ns_bench_result_in *in, int block, int server) {
    return &in->runs[block * in->n_servers + server];
}

/* First byte where a and b differ, and a short excerpt of each from there. */
static void text_diff(const char *a, const char *b, char *out, size_t cap) {
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    /* show whole characters: back to the start of the one that differs,
     * and cut the excerpts at a character boundary */
    while (i > 0 && ((unsigned char)a[i] & 0xC0) == 0x80) i--;
    size_t na = strnlen(a + i, 24), nb = strnlen(b + i, 24);
    while (na > 0 && ((unsigned char)a[i + na] & 0xC0) == 0x80) na--;
    while (nb > 0 && ((unsigned char)b[i + nb] & 0xC0) == 0x80) nb--;
    json_t *ea = json_stringn(a + i, na), *eb = json_stringn(b + i, nb);
    char *sa = ea ? json_dumps(ea, JSON_ENCODE_ANY) : NULL, *sb = eb ? json_dumps(eb, JSON_ENCODE_ANY) : NULL;
    snprintf(out, cap, "at byte %zu: %s vs %s", i, sa ? sa : "?", sb ? sb : "?");
    free(sa);
    free(sb);
    json_decref(ea);
    json_decref(eb);
}

void ns_bench_identity(const ns_bench_result_in *in, const char **verdict, json_t *reasons) {
    *verdict = "pass";
    if (in->n_servers < 2) {
        *verdict = "not_applicable";
        return;
    }
    char why[600];
    for (int b = 0; b < in->blocks; b++) {
        const ns_bench_run *A = run_at(in, b, 0), *B = run_at(in, b, 1);
        if (!A->probe_ok || !B->probe_ok) {
            const ns_bench_run *f = !A->probe_ok ? A : B;
            snprintf(why, sizeof why, "block %d: the identity probe failed on %s (%s), so the outputs could not be compared",
                     b, !A->probe_ok ? in->labels[0] : in->labels[1], f->probe_error);
            json_array_append_new(reasons, json_string(why));
            continue;
        }
        const char *ta = A->probe_text ? A->probe_text : "", *tb = B->probe_text ? B->probe_text : "";
        if (strcmp(ta, tb) != 0) {
            char d[200];
            text_diff(ta, tb, d, sizeof d);
            snprintf(why, sizeof why, "block %d: greedy outputs differ (temperature 0, same seed) %s", b, d);
            json_array_append_new(reasons, json_string(why));
        }
        if (A->probe_prompt_tokens != B->probe_prompt_tokens || A->probe_completion_tokens != B->probe_completion_tokens) {
            snprintf(why, sizeof why,
                     "block %d: probe usage differs: prompt_tokens %lld vs %lld, completion_tokens %lld vs %lld", b,
                     (long long)A->probe_prompt_tokens, (long long)B->probe_prompt_tokens,
                     (long long)A->probe_completion_tokens, (long long)B->probe_completion_tokens);
            json_array_append_new(reasons, json_string(why));
        }
        if (A->prompt_tokens_sum >= 0 && B->prompt_tokens_sum >= 0 && A->n_failed == 0 && B->n_failed == 0 &&
            A->prompt_tokens_sum != B->prompt_tokens_sum) {
            snprintf(why, sizeof why, "block %d: the scenario's prompts count %lld tokens on %s but %lld on %s", b,
                     (long long)A->prompt_tokens_sum, in->labels[0], (long long)B->prompt_tokens_sum, in->labels[1]);
            json_array_append_new(reasons, json_string(why));
        }
    }
    if (json_array_size(reasons) > 0) *verdict = "fail";
}

/* Per-server per-metric: median, min, max over blocks and a bootstrap CI
 * of the geometric mean (values > 0). */
static json_t *metric_summary(const ns_bench_result_in *in, int server, int k) {
    double *v = malloc((size_t)in->blocks * sizeof *v), *lv = malloc((size_t)in->blocks * sizeof *lv);
    json_t *o = json_object();
    int n = 0, nl = 0;
    for (int b = 0; v && lv && b < in->blocks; b++) {
        const ns_bench_run *r = run_at(in, b, server);
        if (!r->have[k]) continue;
        v[n++] = r->values[k];
        if (r->values[k] > 0) lv[nl++] = log(r->values[k]);
    }
    json_object_set_new(o, "blocks_with_value", json_integer(n));
    if (n > 0) {
        double lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < n; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
        json_object_set_new(o, "median", json_real(ns_bench_quantile(v, (size_t)n, 0.5)));
        json_object_set_new(o, "min", json_real(lo));
        json_object_set_new(o, "max", json_real(hi));
    }
    ns_bench_ci ci;
    ns_error err = {0};
    if (nl == n && n >= 2 &&
        ns_bench_bootstrap(lv, n, in->resamples, in->level, in->seed ^ (uint64_t)(k + 1) * 0x51ull, &ci, &err) == NS_OK)
        json_object_set_new(o, "geomean", json_pack("{s:f,s:f,s:f}", "estimate", ci.estimate, "ci_lo", ci.lo, "ci_hi", ci.hi));
    free(v);
    free(lv);
    return o;
}

/* One metric's paired comparison: the per-block log-ratios ln(B/A) and
 * their bootstrap CI, or why it is withheld. */
static json_t *compare_metric(const ns_bench_result_in *in, int k, const char *gate_withheld) {
    const ns_bench_metric_def *m = &in->scenario->metrics[k];
    json_t *o = json_pack("{s:s,s:s,s:b}", "name", m->name, "unit", m->unit, "higher_better", m->higher_better);
    json_t *lr = json_array();
    double *x = malloc((size_t)in->blocks * sizeof *x);
    char missing[200] = "";
    int n = 0, mo = 0;
    for (int b = 0; x && b < in->blocks; b++) {
        const ns_bench_run *A = run_at(in, b, 0), *B = run_at(in, b, 1);
        if (A->have[k] && B->have[k] && A->values[k] > 0 && B->values[k] > 0) {
            x[n] = log(B->values[k] / A->values[k]);
            json_array_append_new(lr, json_real(x[n++]));
        } else {
            json_array_append_new(lr, json_null());
            if (mo >= 0 && (size_t)mo < sizeof missing)
                mo += snprintf(missing + mo, sizeof missing - (size_t)mo, "%s%d", mo ? ", " : "", b);
        }
    }
    json_object_set_new(o, "log_ratios", lr);
    const char *withheld = NULL;
    char why[300];
    if (gate_withheld) {
        withheld = gate_withheld;
    } else if (n < in->blocks) {
        snprintf(why, sizeof why, "no value in block(s) %s on one of the servers (its requests failed there)", missing);
        withheld = why;
    }
    ns_bench_ci ci;
    ns_error err = {0};
    if (!withheld && x &&
        ns_bench_bootstrap(x, n, in->resamples, in->level, in->seed ^ (uint64_t)(k + 1) * 0x9e37ull, &ci, &err) != NS_OK) {
        snprintf(why, sizeof why, "bootstrap failed: %.250s", err.msg);
        withheld = why;
    }
    if (withheld) {
        json_object_set_new(o, "withheld", json_true());
        json_object_set_new(o, "withheld_reason", json_string(withheld));
    } else {
        json_object_set_new(o, "withheld", json_false());
        json_object_set_new(o, "ratio", json_real(ci.estimate));
        json_object_set_new(o, "ci_lo", json_real(ci.lo));
        json_object_set_new(o, "ci_hi", json_real(ci.hi));
        /* which server the interval says is better, if it excludes 1 */
        const char *better = "inconclusive";
        if (ci.lo > 1) better = m->higher_better ? in->labels[1] : in->labels[0];
        else if (ci.hi < 1) better = m->higher_better ? in->labels[0] : in->labels[1];
        json_object_set_new(o, "better", json_string(better));
    }
    free(x);
    return o;
}

static json_t *run_json(const ns_bench_result_in *in, const ns_bench_run *r) {
    json_t *vals = json_object();
    for (int k = 0; k < in->scenario->n_metrics; k++)
        json_object_set_new(vals, in->scenario->metrics[k].name, r->have[k] ? json_real(r->values[k]) : json_null());
    json_t *probe = json_pack("{s:b,s:s,s:I,s:I}", "ok", r->probe_ok, "text", r->probe_text ? r->probe_text : "",
                              "prompt_tokens", (json_int_t)r->probe_prompt_tokens, "completion_tokens",
                              (json_int_t)r->probe_completion_tokens);
    if (probe && !r->probe_ok) json_object_set_new(probe, "error", json_string(r->probe_error));
    json_t *o = json_pack("{s:o,s:f,s:i,s:i,s:I,s:o}", "values", vals, "wall_s", r->wall_s, "requests", r->n_requests,
                          "failed", r->n_failed, "prompt_tokens_sum", (json_int_t)r->prompt_tokens_sum, "probe", probe);
    if (o && r->n_failed) json_object_set_new(o, "first_error", json_string(r->first_error));
    return o;
}

json_t *ns_bench_result_build(const ns_bench_result_in *in) {
    const ns_bench_scenario *s = in->scenario;
    json_t *root = json_pack("{s:i,s:s,s:b,s:i,s:I,s:{s:i,s:f,s:s}}", "nightshift_bench", 1, "scenario", s->name,
                             "skipped", s->skipped, "blocks", in->blocks, "seed", (json_int_t)in->seed, "bootstrap",
                             "resamples", in->resamples, "level", in->level, "method",
                             "percentile bootstrap over blocks of the mean per-block log-ratio");
    if (!root) return NULL;
    if (s->skipped) json_object_set_new(root, "skip_reason", json_string(s->skip_reason));
    if (s->replay_note[0]) json_object_set_new(root, "replay", json_string(s->replay_note));
    json_t *metrics = json_array();
    for (int k = 0; k < s->n_metrics; k++)
        json_array_append_new(metrics, json_pack("{s:s,s:s,s:b,s:b}", "name", s->metrics[k].name, "unit",
                                                 s->metrics[k].unit, "higher_better", s->metrics[k].higher_better,
                                                 "compare", s->metrics[k].compare));
    json_object_set_new(root, "metrics", metrics);
    /* servers and their summaries */
    json_t *servers = json_array();
    for (int i = 0; i < in->n_servers; i++) {
        json_t *sum = json_object();
        int req = 0, failed = 0;
        for (int b = 0; b < in->blocks; b++) req += run_at(in, b, i)->n_requests, failed += run_at(in, b, i)->n_failed;
        for (int k = 0; k < s->n_metrics; k++) json_object_set_new(sum, s->metrics[k].name, metric_summary(in, i, k));
        json_array_append_new(servers, json_pack("{s:s,s:s,s:i,s:i,s:o}", "label", in->labels[i], "url", in->urls[i],
                                                 "requests", req, "failed", failed, "summary", sum));
    }
    json_object_set_new(root, "servers", servers);
    /* blocks, in run order */
    json_t *blocks = json_array();
    for (int b = 0; b < in->blocks; b++) {
        json_t *runs = json_object();
        for (int i = 0; i < in->n_servers; i++) json_object_set_new(runs, in->labels[i], run_json(in, run_at(in, b, i)));
        const char *order = in->n_servers < 2 ? in->labels[0] : ns_bench_a_first(b) ? "AB" : "BA";
        json_array_append_new(blocks, json_pack("{s:i,s:I,s:s,s:o}", "block", b, "seed", (json_int_t)in->block_seeds[b],
                                                "order", order, "runs", runs));
    }
    json_object_set_new(root, "block_runs", blocks);
    /* identity gate and comparison */
    json_t *reasons = json_array();
    const char *verdict;
    ns_bench_identity(in, &verdict, reasons);
    json_object_set_new(root, "identity", json_pack("{s:s,s:o}", "verdict", verdict, "reasons", reasons));
    if (in->n_servers == 2 && !s->skipped) {
        char gate[400];
        const char *gw = NULL;
        if (strcmp(verdict, "pass") != 0) {
            snprintf(gate, sizeof gate, "the identity gate failed (%zu mismatch%s, first: %.250s): the servers did not do "
                     "the same work, so their speed ratio would not mean anything",
                     json_array_size(reasons), json_array_size(reasons) == 1 ? "" : "es",
                     json_string_value(json_array_get(reasons, 0)));
            gw = gate;
        }
        json_t *cm = json_array();
        char per[120];
        snprintf(per, sizeof per, "the identity gate failed (%zu mismatch%s: see identity.reasons)",
                 json_array_size(reasons), json_array_size(reasons) == 1 ? "" : "es");
        for (int k = 0; k < s->n_metrics; k++)
            if (s->metrics[k].compare) json_array_append_new(cm, compare_metric(in, k, gw ? per : NULL));
        json_t *cmp = json_pack("{s:s,s:b,s:o}", "ratio", "B/A", "withheld", gw != NULL, "metrics", cm);
        if (cmp && gw) json_object_set_new(cmp, "withheld_reason", json_string(gw));
        json_object_set_new(root, "comparison", cmp);
    } else {
        json_object_set_new(root, "comparison", json_null());
    }
    return root;
}
