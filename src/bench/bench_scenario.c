/* bench_scenario.c — named workloads, run against one server per block
 * (see bench_scenario.h). */
#include "bench/bench_scenario.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_prompt.h"
#include "bench/bench_req.h"
#include "bench/bench_server.h"
#include "bench/bench_stats.h"
#include "util/clock.h"

#define SWEEP_LEVELS 5
static const int g_sweep[SWEEP_LEVELS] = {1, 2, 4, 8, 16};
#define MAX_STREAMS 256
#define REPLAY_MAX_SESSIONS 64

static void metric(ns_bench_scenario *s, const char *name, const char *unit, bool higher, bool compare) {
    ns_bench_metric_def *m = &s->metrics[s->n_metrics++];
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->unit, sizeof m->unit, "%s", unit);
    m->higher_better = higher;
    m->compare = compare;
}

/* "1k" / "8k" / "32k" -> words */
static int64_t size_suffix(const char *p) {
    if (strcmp(p, "1k") == 0) return 1000;
    if (strcmp(p, "8k") == 0) return 8000;
    if (strcmp(p, "32k") == 0) return 32000;
    return -1;
}

/* ---- replay: the recording, grouped into sessions ---- */

/* A session key: the endpoint and the first two messages (system prompt
 * and first user turn) or, for completions, the first 256 bytes of the
 * prompt. Turns of one agent session share it; different sessions almost
 * never do. Returns a malloc'd string or NULL. */
static char *session_key(const char *endpoint, json_t *body) {
    json_t *msgs = json_object_get(body, "messages");
    json_t *key = json_array();
    json_array_append_new(key, json_string(endpoint));
    if (json_is_array(msgs)) {
        for (size_t i = 0; i < 2 && i < json_array_size(msgs); i++) json_array_append(key, json_array_get(msgs, i));
    } else {
        json_t *p = json_object_get(body, "prompt");
        const char *ps = json_is_string(p) ? json_string_value(p) : "";
        json_array_append_new(key, json_stringn(ps, strnlen(ps, 256)));
    }
    char *s = json_dumps(key, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(key);
    return s;
}

/* One record -> {endpoint, body} appended to its session, or counted as
 * skipped (a failure, a redacted body, another endpoint). */
static void replay_add(ns_bench_scenario *s, json_t *rec, json_t *keys) {
    json_t *ep = json_object_get(rec, "endpoint"), *body = json_object_get(rec, "request");
    json_t *st = json_object_get(rec, "status");
    const char *e = json_is_string(ep) ? json_string_value(ep) : "";
    bool chat = strcmp(e, "/v1/chat/completions") == 0 || strcmp(e, "/chat/completions") == 0;
    bool comp = strcmp(e, "/v1/completions") == 0 || strcmp(e, "/completions") == 0;
    if (!json_is_object(body) || json_is_true(json_object_get(rec, "redacted")) || !(chat || comp) ||
        (json_is_integer(st) && json_integer_value(st) != 200)) {
        s->replay_skipped++;
        return;
    }
    char *k = session_key(e, body);
    if (!k) {
        s->replay_skipped++;
        return;
    }
    json_t *idx = json_object_get(keys, k);
    json_t *sess;
    if (idx) {
        sess = json_array_get(s->replay, (size_t)json_integer_value(idx));
    } else if (json_array_size(s->replay) >= REPLAY_MAX_SESSIONS) {
        free(k);
        s->replay_skipped++;
        return;
    } else {
        sess = json_array();
        json_object_set_new(keys, k, json_integer((json_int_t)json_array_size(s->replay)));
        json_array_append_new(s->replay, sess);
    }
    free(k);
    json_array_append_new(sess, json_pack("{s:s,s:O}", "endpoint", chat ? "/v1/chat/completions" : "/v1/completions",
                                          "body", body));
}

/* Reads a recording (JSON lines, record_gen.h). Records are replayed in
 * the order of their "t" within a session (lines are written when a
 * request ends, so the file order is not the arrival order). */
static ns_status replay_load(ns_bench_scenario *s, const char *path, ns_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ns_fail(err, NS_ERR_IO, "replay: cannot open %s", path);
    json_t *recs = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int lineno = 0;
    ns_status rc = NS_OK;
    while ((n = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (n > (64 << 20)) { /* one request body: the server's cap is 32 MiB */
            rc = ns_fail(err, NS_ERR_INVALID, "replay: %s line %d is longer than 64 MiB", path, lineno);
            break;
        }
        json_error_t je;
        json_t *rec = json_loadb(line, (size_t)n, 0, &je);
        if (!json_is_object(rec)) {
            json_decref(rec);
            rc = ns_fail(err, NS_ERR_INVALID, "replay: %s line %d is not a JSON object (%s)", path, lineno, je.text);
            break;
        }
        json_array_append_new(recs, rec);
    }
    free(line);
    fclose(f);
    if (rc == NS_OK && json_array_size(recs) == 0) rc = ns_fail(err, NS_ERR_INVALID, "replay: %s has no records", path);
    if (rc == NS_OK) {
        /* stable insertion sort by arrival time (recordings are small) */
        size_t m = json_array_size(recs);
        json_t **v = malloc(m * sizeof *v);
        if (!v) rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        for (size_t i = 0; v && i < m; i++) {
            json_t *x = json_array_get(recs, i);
            double t = json_number_value(json_object_get(x, "t"));
            size_t j = i;
            while (j > 0 && json_number_value(json_object_get(v[j - 1], "t")) > t) {
                v[j] = v[j - 1];
                j--;
            }
            v[j] = x;
        }
        json_t *keys = json_object();
        s->replay = json_array();
        for (size_t i = 0; v && i < m; i++) replay_add(s, v[i], keys);
        json_decref(keys);
        free(v);
        if (rc == NS_OK && json_array_size(s->replay) == 0)
            rc = ns_fail(err, NS_ERR_INVALID,
                         "replay: %s has no replayable records (%d skipped: failed, redacted or other endpoints)", path,
                         s->replay_skipped);
        snprintf(s->replay_note, sizeof s->replay_note, "%zu sessions; %d records skipped (failed, redacted, other endpoints)",
                 json_array_size(s->replay), s->replay_skipped);
    }
    json_decref(recs);
    return rc;
}

ns_status ns_bench_scenario_parse(const char *name, int requests, int max_tokens, double timeout_s,
                                  ns_bench_scenario *s, ns_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->requests = requests > 0 ? requests : 3;
    s->max_tokens = max_tokens > 0 ? max_tokens : 64;
    s->timeout_s = timeout_s > 0 ? timeout_s : 600;
    if (strncmp(name, "cold-ttft-", 10) == 0 && size_suffix(name + 10) > 0) {
        s->kind = NS_BENCH_COLD_TTFT;
        s->prompt_words = size_suffix(name + 10);
        metric(s, "ttft_s", "s", false, true);
        metric(s, "prefill_tps", "tok/s", true, true);
    } else if (strncmp(name, "warm-ttft-", 10) == 0 && size_suffix(name + 10) > 0) {
        s->kind = NS_BENCH_WARM_TTFT;
        s->prompt_words = size_suffix(name + 10);
        metric(s, "ttft_s", "s", false, true);
        metric(s, "cached_frac", "", true, false);
    } else if (strcmp(name, "decode-1") == 0 || strcmp(name, "decode-8") == 0 || strcmp(name, "decode-64") == 0) {
        s->kind = NS_BENCH_DECODE;
        s->streams = atoi(name + 7);
        s->prompt_words = 64;
        metric(s, "decode_tps_per_stream", "tok/s", true, true);
        metric(s, "aggregate_tps", "tok/s", true, true);
        metric(s, "ttft_s", "s", false, true);
    } else if (strcmp(name, "sweep") == 0) {
        s->kind = NS_BENCH_SWEEP;
        s->prompt_words = 64;
        for (int i = 0; i < SWEEP_LEVELS; i++) {
            char m[32];
            snprintf(m, sizeof m, "aggregate_tps_c%d", g_sweep[i]);
            metric(s, m, "tok/s", true, true);
        }
    } else if (strcmp(name, "pressure") == 0) {
        s->kind = NS_BENCH_PRESSURE;
        s->streams = 32;
        s->prompt_words = 1000;
        metric(s, "wall_s", "s", false, true);
        metric(s, "ttft_p95_s", "s", false, true);
        metric(s, "completed", "", true, false);
    } else if (strncmp(name, "replay:", 7) == 0 && name[7]) {
        s->kind = NS_BENCH_REPLAY;
        metric(s, "wall_s", "s", false, true);
        metric(s, "ttft_p50_s", "s", false, true);
        metric(s, "cached_tokens", "tok", true, false);
        return replay_load(s, name + 7, err);
    } else if (strcmp(name, "restart-resume") == 0 || strcmp(name, "restart-resume-1k") == 0) {
        s->kind = NS_BENCH_RESTART;
        s->prompt_words = name[14] ? 1000 : 8000;
        metric(s, "cold_ttft_s", "s", false, true);
        metric(s, "restart_s", "s", false, true);
        metric(s, "ttft_after_restart_s", "s", false, true);
        metric(s, "cached_frac_after", "", true, false);
    } else {
        return ns_fail(err, NS_ERR_INVALID,
                       "unknown scenario \"%s\" (cold-ttft-1k|8k|32k, warm-ttft-1k|8k|32k, decode-1|8|64, sweep, "
                       "pressure, replay:FILE, restart-resume[-1k])",
                       name);
    }
    return NS_OK;
}

void ns_bench_scenario_free(ns_bench_scenario *s) {
    json_decref(s->replay);
    s->replay = NULL;
}

/* ---- running requests ---- */

typedef struct job {
    const ns_bench_target *t;
    const char *path;      /* endpoint */
    char *body;            /* owned */
    bool whole;            /* not streamed */
    double timeout_s;
    ns_bench_req_result res;
} job;

/* A completions body; NULL on OOM. */
static char *completion_body(const ns_bench_target *t, const char *prompt, int max_tokens, uint64_t seed,
                             bool ignore_eos, bool stream) {
    json_t *b = json_pack("{s:s,s:s,s:i,s:f,s:I,s:b}", "model", t->model, "prompt", prompt, "max_tokens", max_tokens,
                          "temperature", 0.0, "seed", (json_int_t)(seed & 0x7fffffff), "stream", stream);
    if (!b) return NULL;
    if (stream) json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void job_exec(ns_hc *hc, job *j) {
    char url[700];
    snprintf(url, sizeof url, "%s%s", j->t->root, j->path);
    if (!j->body) {
        memset(&j->res, 0, sizeof j->res);
        snprintf(j->res.error, sizeof j->res.error, "out of memory building the request");
        return;
    }
    if (j->whole) ns_bench_req_run_whole(hc, url, j->t->headers, j->body, j->timeout_s, &j->res);
    else ns_bench_req_run(hc, url, j->t->headers, j->body, j->timeout_s, &j->res);
}

typedef struct lane {
    job *jobs;   /* run in order on one connection */
    int n;
    pthread_t th;
    bool started;
} lane;

static void *lane_main(void *arg) {
    lane *l = arg;
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    for (int i = 0; i < l->n; i++) {
        if (hc) {
            job_exec(hc, &l->jobs[i]);
        } else {
            memset(&l->jobs[i].res, 0, sizeof l->jobs[i].res);
            snprintf(l->jobs[i].res.error, sizeof l->jobs[i].res.error, "http client: %.200s", err.msg);
        }
    }
    ns_hc_free(hc);
    return NULL;
}

/* Runs the lanes at once (each lane's jobs in order); a lane whose thread
 * cannot start runs on this thread afterwards. Returns the wall time. */
static double run_lanes(lane *ls, int n) {
    const double t0 = ns_clock_now();
    for (int i = 0; i < n; i++) ls[i].started = pthread_create(&ls[i].th, NULL, lane_main, &ls[i]) == 0;
    for (int i = 0; i < n; i++)
        if (ls[i].started) pthread_join(ls[i].th, NULL);
    for (int i = 0; i < n; i++)
        if (!ls[i].started) lane_main(&ls[i]);
    return ns_clock_now() - t0;
}

/* Counts one finished request into out (failures, prompt tokens). */
static void tally(ns_bench_run *out, const ns_bench_req_result *r) {
    out->n_requests++;
    if (!r->ok) {
        if (out->n_failed++ == 0) snprintf(out->first_error, sizeof out->first_error, "%s", r->error);
        return;
    }
    if (r->prompt_tokens < 0) out->prompt_tokens_sum = -1;
    else if (out->prompt_tokens_sum >= 0) out->prompt_tokens_sum += r->prompt_tokens;
}

static void set(ns_bench_run *out, int k, double v) {
    if (!isfinite(v)) return;
    out->values[k] = v;
    out->have[k] = true;
}

static double median_of(double *v, int n) { return n > 0 ? ns_bench_quantile(v, (size_t)n, 0.5) : NAN; }

/* One request at a time on one connection. */
static void run_ttft(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t seed, ns_bench_run *out) {
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    if (!hc) {
        out->n_failed++;
        snprintf(out->first_error, sizeof out->first_error, "http client: %.200s", err.msg);
        return;
    }
    double ttft[64], rate[64], cached[64];
    int n = 0;
    const double t0 = ns_clock_now();
    for (int i = 0; i < s->requests && i < 64; i++) {
        char *prompt = ns_bench_prompt(ns_bench_mix(seed, 1, (uint64_t)i), s->prompt_words);
        job j = {.t = t, .path = "/v1/completions", .timeout_s = s->timeout_s};
        if (s->kind == NS_BENCH_WARM_TTFT && prompt) {
            /* cache the prefix first (not measured, but it must work) */
            j.body = completion_body(t, prompt, 1, seed, false, true);
            job_exec(hc, &j);
            free(j.body);
            if (!j.res.ok) {
                tally(out, &j.res);
                ns_bench_req_result_free(&j.res);
                free(prompt);
                continue;
            }
            ns_bench_req_result_free(&j.res);
            char *ext = ns_bench_prompt_extend(prompt, ns_bench_mix(seed, 2, (uint64_t)i), 32);
            free(prompt);
            prompt = ext;
        }
        j.body = prompt ? completion_body(t, prompt, 2, seed, false, true) : NULL;
        free(prompt);
        job_exec(hc, &j);
        free(j.body);
        tally(out, &j.res);
        if (j.res.ok) {
            ttft[n] = j.res.ttft_s;
            rate[n] = j.res.prompt_tokens > 0 && j.res.ttft_s > 0 ? (double)j.res.prompt_tokens / j.res.ttft_s : NAN;
            cached[n] = j.res.prompt_tokens > 0 && j.res.cached_tokens >= 0
                            ? (double)j.res.cached_tokens / (double)j.res.prompt_tokens
                            : NAN;
            n++;
        }
        ns_bench_req_result_free(&j.res);
    }
    out->wall_s = ns_clock_now() - t0;
    ns_hc_free(hc);
    if (n == 0) return;
    set(out, 0, median_of(ttft, n));
    if (s->kind == NS_BENCH_COLD_TTFT) {
        set(out, 1, median_of(rate, n));
    } else {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (isfinite(cached[i])) cached[m++] = cached[i];
        if (m == n) set(out, 1, median_of(cached, m)); /* withheld when a request did not report it */
    }
}

typedef struct stream_stats {
    double agg_tps, per_stream_tps, ttft_med, ttft_p95, wall;
    int ok;
} stream_stats;

/* `streams` requests at once, one per connection. */
static void run_streams(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t seed, int streams,
                        int64_t words, bool ignore_eos, ns_bench_run *out, stream_stats *st) {
    memset(st, 0, sizeof *st);
    if (streams > MAX_STREAMS) streams = MAX_STREAMS;
    job *js = calloc((size_t)streams, sizeof *js);
    lane *ls = calloc((size_t)streams, sizeof *ls);
    double *tps = calloc((size_t)streams, sizeof *tps), *ttft = calloc((size_t)streams, sizeof *ttft);
    if (!js || !ls || !tps || !ttft) {
        out->n_failed++;
        snprintf(out->first_error, sizeof out->first_error, "out of memory");
        goto done;
    }
    for (int i = 0; i < streams; i++) {
        char *prompt = ns_bench_prompt(ns_bench_mix(seed, 3, (uint64_t)i), words);
        js[i] = (job){.t = t, .path = "/v1/completions", .timeout_s = s->timeout_s};
        js[i].body = prompt ? completion_body(t, prompt, s->max_tokens, seed, ignore_eos, true) : NULL;
        free(prompt);
        ls[i] = (lane){.jobs = &js[i], .n = 1};
    }
    st->wall = run_lanes(ls, streams);
    int64_t gen = 0;
    for (int i = 0; i < streams; i++) {
        tally(out, &js[i].res);
        if (js[i].res.ok) {
            tps[st->ok] = js[i].res.decode_tps;
            ttft[st->ok++] = js[i].res.ttft_s;
            gen += js[i].res.completion_tokens >= 0 ? js[i].res.completion_tokens : js[i].res.n_text_events;
        }
        ns_bench_req_result_free(&js[i].res);
        free(js[i].body);
    }
    st->agg_tps = st->wall > 0 ? (double)gen / st->wall : NAN;
    st->per_stream_tps = median_of(tps, st->ok);
    if (st->ok > 0) {
        st->ttft_p95 = ns_bench_quantile(ttft, (size_t)st->ok, 0.95);
        st->ttft_med = ns_bench_quantile(ttft, (size_t)st->ok, 0.5);
    }
done:
    free(js);
    free(ls);
    free(tps);
    free(ttft);
}

/* A body of the recording, made to stream with usage and to name this
 * server's model. NULL on OOM. */
static char *replay_body(const ns_bench_target *t, json_t *body) {
    json_t *b = json_deep_copy(body);
    if (!b) return NULL;
    json_object_set_new(b, "model", json_string(t->model));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void run_replay(const ns_bench_scenario *s, const ns_bench_target *t, ns_bench_run *out) {
    const size_t ns = json_array_size(s->replay);
    size_t total = 0;
    for (size_t i = 0; i < ns; i++) total += json_array_size(json_array_get(s->replay, i));
    job *js = calloc(total ? total : 1, sizeof *js);
    lane *ls = calloc(ns ? ns : 1, sizeof *ls);
    double *ttft = calloc(total ? total : 1, sizeof *ttft);
    if (!js || !ls || !ttft) {
        out->n_failed++;
        snprintf(out->first_error, sizeof out->first_error, "out of memory");
        goto done;
    }
    size_t k = 0;
    for (size_t i = 0; i < ns; i++) {
        json_t *sess = json_array_get(s->replay, i);
        ls[i] = (lane){.jobs = &js[k], .n = (int)json_array_size(sess)};
        for (size_t j = 0; j < json_array_size(sess); j++, k++) {
            json_t *r = json_array_get(sess, j);
            js[k] = (job){.t = t, .path = json_string_value(json_object_get(r, "endpoint")), .timeout_s = s->timeout_s};
            js[k].body = replay_body(t, json_object_get(r, "body"));
        }
    }
    out->wall_s = run_lanes(ls, (int)ns);
    int ok = 0;
    double cached = 0;
    bool cached_all = true;
    for (size_t i = 0; i < total; i++) {
        tally(out, &js[i].res);
        if (js[i].res.ok) {
            ttft[ok++] = js[i].res.ttft_s;
            if (js[i].res.cached_tokens >= 0) cached += (double)js[i].res.cached_tokens;
            else cached_all = false;
        }
        ns_bench_req_result_free(&js[i].res);
        free(js[i].body);
    }
    if (out->n_failed == 0) set(out, 0, out->wall_s); /* a wall time with failures compares nothing */
    if (ok > 0) set(out, 1, median_of(ttft, ok));
    if (ok > 0 && cached_all) set(out, 2, cached);
done:
    free(js);
    free(ls);
    free(ttft);
}

/* One streamed request of prompt on its own connection; counted in out. */
static bool one_request(const ns_bench_scenario *s, const ns_bench_target *t, const char *prompt, uint64_t seed,
                        ns_bench_run *out, ns_bench_req_result *res) {
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    job j = {.t = t, .path = "/v1/completions", .timeout_s = s->timeout_s};
    j.body = completion_body(t, prompt, 2, seed, false, true);
    if (hc) job_exec(hc, &j);
    else snprintf(j.res.error, sizeof j.res.error, "http client: %.200s", err.msg);
    ns_hc_free(hc);
    free(j.body);
    tally(out, &j.res);
    *res = j.res;
    return res->ok;
}

/* Cold prompt, graceful restart, the same prompt again (see the header). */
static void run_restart(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t seed, ns_bench_run *out) {
    ns_bench_server *srv = t->server;
    ns_error err = {0};
    if (!srv) {
        out->n_failed++;
        snprintf(out->first_error, sizeof out->first_error, "this server was not started by the bench");
        return;
    }
    /* a restart that failed in an earlier block: try again first */
    if (srv->pid <= 0 && ns_bench_server_start(srv, 300, &err) != NS_OK) {
        out->n_failed++;
        snprintf(out->first_error, sizeof out->first_error, "start: %.300s", err.msg);
        return;
    }
    const double t0 = ns_clock_now();
    char *prompt = ns_bench_prompt(ns_bench_mix(seed, 5, 0), s->prompt_words);
    ns_bench_req_result a, b;
    if (!prompt || !one_request(s, t, prompt, seed, out, &a)) {
        if (prompt) ns_bench_req_result_free(&a);
        free(prompt);
        return;
    }
    set(out, 0, a.ttft_s);
    ns_bench_req_result_free(&a);
    const double r0 = ns_clock_now();
    ns_bench_server_stop(srv, 60);
    if (ns_bench_server_start(srv, 300, &err) != NS_OK) {
        out->n_failed++;
        if (!out->first_error[0]) snprintf(out->first_error, sizeof out->first_error, "restart: %.300s", err.msg);
        free(prompt);
        out->wall_s = ns_clock_now() - t0;
        return;
    }
    set(out, 1, ns_clock_now() - r0);
    if (one_request(s, t, prompt, seed, out, &b)) {
        set(out, 2, b.ttft_s);
        if (b.prompt_tokens > 0 && b.cached_tokens >= 0) set(out, 3, (double)b.cached_tokens / (double)b.prompt_tokens);
    }
    ns_bench_req_result_free(&b);
    free(prompt);
    out->wall_s = ns_clock_now() - t0;
}

/* The identity probe: one greedy, seeded, non-streamed request. */
static void run_probe(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t seed, ns_bench_run *out) {
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    char *prompt = ns_bench_prompt(ns_bench_mix(seed, 0xfeed, 0), 48);
    job j = {.t = t, .path = "/v1/completions", .whole = true, .timeout_s = s->timeout_s};
    j.body = prompt ? completion_body(t, prompt, 16, seed, false, false) : NULL;
    free(prompt);
    if (hc) job_exec(hc, &j);
    else snprintf(j.res.error, sizeof j.res.error, "http client: %.200s", err.msg);
    out->probe_ok = j.res.ok;
    snprintf(out->probe_error, sizeof out->probe_error, "%s", j.res.error);
    out->probe_text = j.res.text;
    j.res.text = NULL;
    out->probe_prompt_tokens = j.res.prompt_tokens;
    out->probe_completion_tokens = j.res.completion_tokens;
    free(j.body);
    ns_hc_free(hc);
}

void ns_bench_run_block(const ns_bench_scenario *s, const ns_bench_target *t, uint64_t seed, ns_bench_run *out) {
    memset(out, 0, sizeof *out);
    if (s->skipped) return;
    stream_stats st;
    switch (s->kind) {
    case NS_BENCH_COLD_TTFT:
    case NS_BENCH_WARM_TTFT: run_ttft(s, t, seed, out); break;
    case NS_BENCH_DECODE:
        run_streams(s, t, seed, s->streams, s->prompt_words, true, out, &st);
        out->wall_s = st.wall;
        if (st.ok > 0) {
            set(out, 0, st.per_stream_tps);
            if (out->n_failed == 0) set(out, 1, st.agg_tps);
            set(out, 2, st.ttft_med);
        }
        break;
    case NS_BENCH_SWEEP:
        for (int i = 0; i < SWEEP_LEVELS; i++) {
            run_streams(s, t, ns_bench_mix(seed, 4, (uint64_t)i), g_sweep[i], s->prompt_words, true, out, &st);
            out->wall_s += st.wall;
            if (st.ok == g_sweep[i]) set(out, i, st.agg_tps);
        }
        break;
    case NS_BENCH_PRESSURE:
        run_streams(s, t, seed, s->streams, s->prompt_words, true, out, &st);
        out->wall_s = st.wall;
        if (out->n_failed == 0) set(out, 0, st.wall);
        if (st.ok > 0) set(out, 1, st.ttft_p95);
        set(out, 2, st.ok);
        break;
    case NS_BENCH_REPLAY: run_replay(s, t, out); break;
    case NS_BENCH_RESTART: run_restart(s, t, seed, out); break;
    }
    run_probe(s, t, seed, out);
}

void ns_bench_run_free(ns_bench_run *r) {
    free(r->probe_text);
    r->probe_text = NULL;
}
