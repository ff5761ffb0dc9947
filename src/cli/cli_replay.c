/* cli_replay.c — `nightshift replay` (see cli_replay.h). */
#include "cli/cli_replay.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_common.h"
#include "client/http_client.h"
#include "record/session.h"
#include "util/clock.h"

#define MAX_CONCURRENCY 256

typedef struct replay_opts {
    const char *file, *url, *json_out, *api_key, *model;
    bool speed_max, expect_cached, force_stream;
    int concurrency;  /* 0 = every session at once (up to MAX_CONCURRENCY) */
    double timeout_s; /* per request */
} replay_opts;

/* One replayed request. -1 = not reported. */
typedef struct result {
    long status, rec_status;
    double ttft, decode, latency, t_first, t_last;
    long prompt, cached, output, rec_cached, content_events;
    bool stream, sent;
    char error[600];
} result;

typedef struct replay {
    const replay_opts *o;
    const ns_recording *r;
    result *res;          /* one per entry */
    atomic_int next_session;
    double t0, t_min;     /* replay start (ns_clock_now), first recorded arrival */
    pthread_mutex_t out_mu;
} replay;

static void usage(FILE *f) {
    fprintf(f,
            "usage: nightshift replay FILE --url ROOT [--json OUT] [--speed recorded|max] [--concurrency N]\n"
            "                         [--api-key KEY] [--model NAME] [--timeout S] [--expect-cached] [--stream]\n"
            "  Re-sends a recording (serve --record DIR: DIR/requests.jsonl) to the server at ROOT,\n"
            "  sessions in parallel, turns in order, and reports TTFT, decode rate and cached tokens.\n"
            "  Example:\n"
            "    nightshift replay rec/requests.jsonl --url http://127.0.0.1:8080 --json out.json\n"
            "  --url ROOT         the server's root, e.g. http://127.0.0.1:8080 (required)\n"
            "  --json OUT         also write every result and the summary as JSON to OUT (default: none)\n"
            "  --speed S          recorded (default): the recorded start offsets and think times;\n"
            "                     max: each turn as soon as the previous one ended\n"
            "  --concurrency N    sessions at once (default: all of them, at most %d)\n"
            "  --api-key KEY      (default: $NIGHTSHIFT_API_KEY) sent as 'Authorization: Bearer KEY'\n"
            "                     and 'x-api-key: KEY'\n"
            "  --model NAME       (default: as recorded) the \"model\" sent, for a server that serves\n"
            "                     the model under another name\n"
            "  --timeout S        per request (default 600)\n"
            "  --expect-cached    exit 1 when a request's cached tokens differ from the recording (default off)\n"
            "  --stream           (default off: as recorded) stream every request, so TTFT and decode rate\n"
            "                     are measured for the requests recorded without streaming too\n"
            "A redacted recording (serve --record-redact) cannot be replayed: its texts are gone.\n",
            MAX_CONCURRENCY);
}

static int parse_args(int argc, char **argv, replay_opts *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (ns_cli_is_help(a)) {
            usage(stdout);
            return 1;
        }
        if (strcmp(a, "--expect-cached") == 0) {
            o->expect_cached = true;
            continue;
        }
        if (strcmp(a, "--stream") == 0) {
            o->force_stream = true;
            continue;
        }
        if (a[0] != '-' || a[1] == 0) {
            if (o->file) return ns_cli_usage_error("replay", usage, "give one recording file (got %s too)", a);
            o->file = a;
            continue;
        }
        static const char *const with_value[] = {"--url", "--json", "--speed", "--concurrency", "--api-key",
                                                 "--timeout", "--model"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof *with_value; k++) known |= strcmp(a, with_value[k]) == 0;
        if (!known) return ns_cli_usage_error("replay", usage, "unknown option %s", a);
        const char *v = ns_cli_flag_value(argc, argv, &i);
        if (!v) return ns_cli_usage_error("replay", usage, "%s needs a value", a);
        char *end;
        if (strcmp(a, "--url") == 0) o->url = v;
        else if (strcmp(a, "--json") == 0) o->json_out = v;
        else if (strcmp(a, "--api-key") == 0) o->api_key = v;
        else if (strcmp(a, "--model") == 0) o->model = v;
        else if (strcmp(a, "--speed") == 0) {
            if (strcmp(v, "max") == 0) o->speed_max = true;
            else if (strcmp(v, "recorded") == 0) o->speed_max = false;
            else return ns_cli_usage_error("replay", usage, "bad value for --speed: \"%s\" (recorded or max)", v);
        } else if (strcmp(a, "--concurrency") == 0) {
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > MAX_CONCURRENCY)
                return ns_cli_usage_error("replay", usage, "bad value for --concurrency: \"%s\" (1..%d)", v,
                                          MAX_CONCURRENCY);
            o->concurrency = (int)n;
        } else if (strcmp(a, "--timeout") == 0) {
            double t = strtod(v, &end);
            if (*end || end == v || !(t > 0 && t < 1e6))
                return ns_cli_usage_error("replay", usage, "bad value for --timeout: \"%s\"", v);
            o->timeout_s = t;
        }
    }
    if (!o->file) return ns_cli_usage_error("replay", usage, "give the recording FILE");
    if (!o->url) return ns_cli_usage_error("replay", usage, "give --url ROOT");
    if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0)
        return ns_cli_usage_error("replay", usage, "--url must start with http:// or https://");
    return 0;
}

/* ---- usage and content in responses ---- */

static long int_at(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

/* Takes the usage numbers of u (any of the four APIs' shapes) into res;
 * a later usage (a stream's last event) overrides an earlier one. */
static void take_usage(const json_t *u, ns_rec_api kind, result *res) {
    if (!json_is_object(u)) return;
    long out = int_at(u, "completion_tokens");
    if (out < 0) out = int_at(u, "output_tokens");
    if (out >= 0) res->output = out;
    long cached = int_at(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    if (cached < 0) cached = int_at(json_object_get(u, "input_tokens_details"), "cached_tokens");
    if (cached < 0) cached = int_at(u, "cache_read_input_tokens");
    if (cached >= 0) res->cached = cached;
    long prompt = int_at(u, "prompt_tokens");
    if (prompt < 0 && kind == NS_REC_MESSAGES && int_at(u, "input_tokens") >= 0) {
        /* Anthropic's input_tokens leaves out the cache reads and writes */
        long cr = int_at(u, "cache_read_input_tokens"), cw = int_at(u, "cache_creation_input_tokens");
        prompt = int_at(u, "input_tokens") + (cr > 0 ? cr : 0) + (cw > 0 ? cw : 0);
    }
    if (prompt < 0) prompt = int_at(u, "input_tokens");
    if (prompt >= 0) res->prompt = prompt;
}

static void find_usage(const json_t *v, ns_rec_api kind, result *res) {
    take_usage(json_object_get(v, "usage"), kind, res);
    take_usage(json_object_get(json_object_get(v, "message"), "usage"), kind, res);  /* Anthropic message_start */
    take_usage(json_object_get(json_object_get(v, "response"), "usage"), kind, res); /* Responses response.completed */
}

static bool nonempty_str(const json_t *v) { return json_is_string(v) && json_string_length(v) > 0; }

/* Whether a stream event carries generated output (text, reasoning or a
 * tool call), by API. */
static bool has_content(const json_t *v, ns_rec_api kind) {
    if (kind == NS_REC_MESSAGES) {
        const char *t = json_string_value(json_object_get(v, "type"));
        return t && strcmp(t, "content_block_delta") == 0;
    }
    if (kind == NS_REC_RESPONSES) {
        const char *t = json_string_value(json_object_get(v, "type"));
        size_t n = t ? strlen(t) : 0;
        return n > 6 && strcmp(t + n - 6, ".delta") == 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, "choices"), i, c) {
        if (nonempty_str(json_object_get(c, "text"))) return true;
        const json_t *d = json_object_get(c, "delta");
        if (nonempty_str(json_object_get(d, "content")) || nonempty_str(json_object_get(d, "reasoning_content")) ||
            json_array_size(json_object_get(d, "tool_calls")) > 0)
            return true;
    }
    return false;
}

typedef struct stream_ctx {
    result *res;
    ns_rec_api kind;
} stream_ctx;

static bool on_event(void *ctx, const char *event, const char *data, size_t len, double t) {
    stream_ctx *s = ctx;
    (void)event;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) return true;
    json_t *v = json_loadb(data, len, 0, NULL);
    if (!v) return true; /* not JSON: nothing to measure */
    if (has_content(v, s->kind)) {
        if (s->res->content_events++ == 0) s->res->t_first = t;
        s->res->t_last = t;
    }
    find_usage(v, s->kind, s->res);
    const json_t *e = json_object_get(v, "error"); /* Responses objects carry "error": null */
    if (json_is_object(e) && !s->res->error[0]) {
        const char *m = json_string_value(json_object_get(e, "message"));
        snprintf(s->res->error, sizeof s->res->error, "stream error: %s", m ? m : "(no message)");
    }
    json_decref(v);
    return true;
}

/* ---- sending ---- */

static void sleep_until(double t) {
    for (;;) {
        double d = t - ns_clock_now();
        if (d <= 0) return;
        struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void send_one(replay *rp, ns_hc *hc, const ns_rec_entry *e, result *res) {
    res->status = res->prompt = res->cached = res->output = -1;
    res->ttft = res->decode = res->latency = -1;
    res->rec_cached = int_at(e->rec, "cached_tokens");
    res->rec_status = int_at(e->rec, "status");
    json_t *body = json_deep_copy(e->body);
    if (!body) {
        snprintf(res->error, sizeof res->error, "out of memory");
        return;
    }
    if (rp->o->force_stream) json_object_set_new(body, "stream", json_true());
    if (rp->o->model) json_object_set_new(body, "model", json_string(rp->o->model));
    res->stream = json_is_true(json_object_get(body, "stream"));
    if (res->stream && (e->kind == NS_REC_CHAT || e->kind == NS_REC_COMPLETIONS)) {
        json_t *so = json_object_get(body, "stream_options");
        if (!json_is_object(so)) json_object_set_new(body, "stream_options", so = json_object());
        json_object_set_new(so, "include_usage", json_true());
    }
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    char url[4096], auth[1100], xkey[1100];
    size_t ul = strlen(rp->o->url);
    while (ul > 0 && rp->o->url[ul - 1] == '/') ul--;
    snprintf(url, sizeof url, "%.*s%s", (int)ul, rp->o->url, e->endpoint);
    const char *hdr[5];
    int nh = 0;
    if (rp->o->api_key && *rp->o->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %.1000s", rp->o->api_key);
        snprintf(xkey, sizeof xkey, "x-api-key: %.1000s", rp->o->api_key);
        hdr[nh++] = auth;
        hdr[nh++] = xkey;
    }
    if (e->kind == NS_REC_MESSAGES) hdr[nh++] = "anthropic-version: 2023-06-01";
    hdr[nh] = NULL;
    /* a whole (non-streamed) answer sends nothing until it is done: idle = the whole limit */
    const double limit = rp->o->timeout_s > 0 ? rp->o->timeout_s : 600;
    ns_hc_opts ho = {.timeout_s = limit, .idle_timeout_s = limit};
    ns_hc_response hr;
    ns_error err = {0};
    stream_ctx sc = {res, e->kind};
    ns_status rc = text ? ns_hc_post(hc, url, hdr, text, strlen(text), &ho, on_event, &sc, &hr, &err) : NS_ERR_NOMEM;
    free(text);
    res->sent = true;
    if (rc != NS_OK) {
        snprintf(res->error, sizeof res->error, "%s", text ? err.msg : "out of memory");
        if (text) ns_hc_response_free(&hr);
        return;
    }
    res->status = hr.status;
    res->latency = hr.t_end - hr.t_start;
    if (hr.streamed) {
        if (res->content_events > 0) res->ttft = res->t_first - hr.t_start;
        if (res->output > 1 && res->t_last > res->t_first)
            res->decode = (double)(res->output - 1) / (res->t_last - res->t_first);
    } else if (hr.body) {
        json_t *v = json_loadb(hr.body, hr.body_len, 0, NULL);
        find_usage(v, e->kind, res);
        const json_t *je = json_object_get(v, "error");
        if (json_is_object(je)) {
            const char *m = json_string_value(json_object_get(je, "message"));
            snprintf(res->error, sizeof res->error, "%s", m ? m : "error");
        }
        json_decref(v);
    }
    ns_hc_response_free(&hr);
}

static void print_result(replay *rp, const ns_rec_entry *e, const result *res) {
    char ttft[32] = "-", dec[32] = "-", cached[48] = "-";
    if (res->ttft >= 0) snprintf(ttft, sizeof ttft, "%.3fs", res->ttft);
    if (res->decode >= 0) snprintf(dec, sizeof dec, "%.1f tok/s", res->decode);
    if (res->cached >= 0) snprintf(cached, sizeof cached, "%ld/%ld", res->cached, res->prompt);
    pthread_mutex_lock(&rp->out_mu);
    printf("session %d turn %d %s: status %ld ttft %s decode %s cached %s (recorded %ld) out %ld latency %.3fs%s%s\n",
           e->session, e->turn, e->endpoint, res->status, ttft, dec, cached, res->rec_cached, res->output,
           res->latency >= 0 ? res->latency : 0.0, res->error[0] ? " error: " : "", res->error);
    fflush(stdout);
    pthread_mutex_unlock(&rp->out_mu);
}

static void *worker(void *arg) {
    replay *rp = arg;
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    for (;;) {
        int s = atomic_fetch_add(&rp->next_session, 1);
        if (s >= rp->r->n_sessions) break;
        const ns_rec_session *ss = &rp->r->s[s];
        for (int k = 0; k < ss->n; k++) {
            const ns_rec_entry *e = &rp->r->e[ss->idx[k]];
            result *res = &rp->res[ss->idx[k]];
            if (!hc) {
                snprintf(res->error, sizeof res->error, "%s", err.msg);
                res->status = -1;
                continue;
            }
            if (!rp->o->speed_max) {
                if (k == 0) {
                    sleep_until(rp->t0 + (e->t - rp->t_min));
                } else {
                    const ns_rec_entry *p = &rp->r->e[ss->idx[k - 1]];
                    double think = e->t - (p->t + p->duration_s);
                    if (think > 0) sleep_until(ns_clock_now() + think);
                }
            }
            send_one(rp, hc, e, res);
            print_result(rp, e, res);
        }
    }
    ns_hc_free(hc);
    return NULL;
}

/* ---- summary ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and p90 (nearest rank) of the values >= 0 of field; null when none. */
static json_t *dist(const result *res, int n, size_t off) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    int k = 0;
    for (int i = 0; v && i < n; i++) {
        double x = *(const double *)((const char *)&res[i] + off);
        if (x >= 0) v[k++] = x;
    }
    json_t *o = json_null();
    if (k > 0) {
        qsort(v, (size_t)k, sizeof *v, cmp_double);
        int i90 = (int)ceil(0.9 * k) - 1;
        o = json_pack("{s:i,s:f,s:f,s:f,s:f}", "n", k, "median", k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2,
                      "p90", v[i90 < 0 ? 0 : i90], "min", v[0], "max", v[k - 1]);
    }
    free(v);
    return o;
}

static json_t *num_or_null(double x) { return x >= 0 ? json_real(x) : json_null(); }
static json_t *int_or_null(long x) { return x >= 0 ? json_integer(x) : json_null(); }

/* The JSON report; counts failures into *failed and cache mismatches into *mismatch. */
static json_t *report(replay *rp, int *failed, int *mismatch) {
    const ns_recording *r = rp->r;
    json_t *reqs = json_array();
    long cached = 0, rec_cached = 0;
    *failed = *mismatch = 0;
    for (int i = 0; i < r->n; i++) {
        const ns_rec_entry *e = &r->e[i];
        const result *x = &rp->res[i];
        bool fail = x->status < 0 || (x->rec_status >= 0 && x->status != x->rec_status);
        /* a failed request (recorded 4xx/5xx) has no usage to compare */
        bool mism = x->rec_cached >= 0 && x->rec_status >= 200 && x->rec_status < 300 && x->cached != x->rec_cached;
        *failed += fail;
        *mismatch += mism;
        if (x->cached > 0) cached += x->cached;
        if (x->rec_cached > 0) rec_cached += x->rec_cached;
        json_t *o = json_pack("{s:i,s:i,s:i,s:s,s:s?,s:b,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:b}", "record", e->line,
                              "session", e->session, "turn", e->turn, "endpoint", e->endpoint, "id",
                              json_string_value(json_object_get(e->rec, "id")), "stream", x->stream, "status",
                              int_or_null(x->status), "recorded_status", int_or_null(x->rec_status), "ttft_s",
                              num_or_null(x->ttft), "decode_tok_s", num_or_null(x->decode), "latency_s",
                              num_or_null(x->latency), "prompt_tokens", int_or_null(x->prompt), "cached_tokens",
                              int_or_null(x->cached), "recorded_cached_tokens", int_or_null(x->rec_cached),
                              "output_tokens", int_or_null(x->output), "error",
                              x->error[0] ? json_string(x->error) : json_null(), "cached_matches_recording", !mism);
        json_array_append_new(reqs, o);
    }
    json_t *sum = json_pack("{s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:I,s:I,s:i}", "requests", r->n, "sessions",
                            r->n_sessions, "failed", *failed, "skipped_records", r->n_skipped, "ttft_s",
                            dist(rp->res, r->n, offsetof(result, ttft)), "decode_tok_s",
                            dist(rp->res, r->n, offsetof(result, decode)), "latency_s",
                            dist(rp->res, r->n, offsetof(result, latency)), "cached_tokens", (json_int_t)cached,
                            "recorded_cached_tokens", (json_int_t)rec_cached, "cached_mismatches", *mismatch);
    return json_pack("{s:s,s:s,s:s,s:i,s:o,s:o}", "file", rp->o->file, "url", rp->o->url, "speed",
                     rp->o->speed_max ? "max" : "recorded", "concurrency", rp->o->concurrency, "summary", sum,
                     "requests", reqs);
}

static void print_dist(const char *name, const json_t *d, const char *unit) {
    if (!json_is_object(d)) {
        printf("  %-8s -\n", name);
        return;
    }
    printf("  %-8s median %.3f%s  p90 %.3f%s  (n=%lld)\n", name, json_real_value(json_object_get(d, "median")), unit,
           json_real_value(json_object_get(d, "p90")), unit, (long long)json_integer_value(json_object_get(d, "n")));
}

int ns_cli_replay(int argc, char **argv) {
    replay_opts o = {0};
    o.api_key = getenv("NIGHTSHIFT_API_KEY");
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : pr;
    ns_recording r;
    ns_error err = {0};
    if (ns_recording_load(o.file, &r, &err) != NS_OK) {
        fprintf(stderr, "nightshift replay: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    replay rp = {.o = &o, .r = &r};
    pthread_t th[MAX_CONCURRENCY];
    int n_th = 0;
    json_t *rep = NULL;
    if (r.any_redacted) {
        fprintf(stderr,
                "nightshift replay: %s is a redacted recording (serve --record-redact): its message texts were "
                "replaced by token counts and hashes, so its requests cannot be replayed verbatim; record without "
                "--record-redact to replay\n",
                o.file);
        goto out;
    }
    if (r.n == 0) {
        fprintf(stderr, "nightshift replay: %s has no replayable requests (%d records without a body)\n", o.file,
                r.n_skipped);
        goto out;
    }
    rp.res = calloc((size_t)r.n, sizeof *rp.res);
    if (!rp.res || ns_hc_global_init() != NS_OK) {
        fprintf(stderr, "nightshift replay: cannot initialize (out of memory or libcurl)\n");
        goto out;
    }
    pthread_mutex_init(&rp.out_mu, NULL);
    rp.t_min = r.e[0].t;
    if (o.concurrency == 0) o.concurrency = r.n_sessions < MAX_CONCURRENCY ? r.n_sessions : MAX_CONCURRENCY;
    printf("replay: %d requests in %d sessions from %s to %s (speed %s, %d at once)\n", r.n, r.n_sessions, o.file,
           o.url, o.speed_max ? "max" : "recorded", o.concurrency);
    rp.t0 = ns_clock_now();
    for (int i = 0; i < o.concurrency && i < r.n_sessions; i++) {
        if (pthread_create(&th[n_th], NULL, worker, &rp) != 0) break;
        n_th++;
    }
    if (n_th == 0) worker(&rp); /* no thread could start: run them here */
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&rp.out_mu);
    int failed = 0, mismatch = 0;
    rep = report(&rp, &failed, &mismatch);
    if (!rep) {
        fprintf(stderr, "nightshift replay: out of memory\n");
        goto out;
    }
    json_t *sum = json_object_get(rep, "summary");
    printf("summary: %d requests, %d sessions, %d failed, cached tokens %lld (recorded %lld), %d differ from the "
           "recording\n",
           r.n, r.n_sessions, failed, (long long)json_integer_value(json_object_get(sum, "cached_tokens")),
           (long long)json_integer_value(json_object_get(sum, "recorded_cached_tokens")), mismatch);
    print_dist("ttft", json_object_get(sum, "ttft_s"), "s");
    print_dist("decode", json_object_get(sum, "decode_tok_s"), " tok/s");
    print_dist("latency", json_object_get(sum, "latency_s"), "s");
    if (o.json_out && json_dump_file(rep, o.json_out, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "nightshift replay: cannot write %s: %s\n", o.json_out, strerror(errno));
        goto out;
    }
    rc = failed || (o.expect_cached && mismatch) ? 1 : 0;
out:
    json_decref(rep);
    free(rp.res);
    ns_recording_free(&r);
    return rc;
}
