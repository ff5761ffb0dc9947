/* cli_bench.c — `nightshift bench` (see cli_bench.h). */
#include "cli/cli_bench.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_report.h"
#include "bench/bench_result.h"
#include "bench/bench_scenario.h"
#include "bench/bench_server.h"
#include "bench/bench_stats.h"
#include "cli/cli_common.h"
#include "client/http_client.h"

#define MAX_BLOCKS 1000
#define MIN_PAIRED_BLOCKS 5

static void usage(FILE *f) {
    fprintf(f,
            "usage: nightshift bench --url A [--url B] --scenario NAME [options]\n"
            "  Drives OpenAI-compatible servers (nightshift, llama.cpp's server, vLLM) with a named\n"
            "  workload; with two --url, in paired blocks (A,B then B,A ...) with an identity gate and\n"
            "  bootstrap confidence intervals of the per-block ratios B/A. Example:\n"
            "    nightshift bench --url http://127.0.0.1:8080 --url http://127.0.0.1:8081 \\\n"
            "        --scenario cold-ttft-8k --blocks 6 --seed 1 --json out.json --html out.html\n"
            "  --url ROOT          a server's root, e.g. http://127.0.0.1:8080 (required; once, or twice to compare)\n"
            "  --scenario NAME     (required) cold-ttft-1k|8k|32k, warm-ttft-1k|8k|32k, decode-1|8|64,\n"
            "                      sweep, pressure, replay:FILE (a serve --record file), restart-resume\n"
            "  --blocks N          blocks (default 6; with two servers at least %d)\n"
            "  --seed S            workload and bootstrap seed (default 1)\n"
            "  --warmup N          unrecorded warm-up blocks on each server first (default 1)\n"
            "  --json FILE         write the result as JSON (default: none)\n"
            "  --html FILE         write the single-file offline HTML report (default: none)\n"
            "  --requests N        requests per block of the TTFT scenarios (default 3)\n"
            "  --max-tokens N      tokens per stream of decode/sweep/pressure (default 64)\n"
            "  --model NAME        the \"model\" sent (default: each server's first /v1/models id)\n"
            "  --server-cmd CMD    (default: none, the server is already running) start this server\n"
            "                      (sh -c CMD) for the matching --url, in order, wait until it is\n"
            "                      ready, stop it at the end; needed by restart-resume; its output\n"
            "                      goes to bench-server-A.log / -B.log next to --json (or here)\n"
            "  --api-key KEY       sent as 'Authorization: Bearer KEY' (default: $NIGHTSHIFT_API_KEY, else none)\n"
            "  --timeout S         per-request limit in seconds (default 600)\n"
            "  --resamples N       bootstrap resamples (default 2000, at least %d)\n"
            "  --level L           confidence level (default 0.95)\n",
            MIN_PAIRED_BLOCKS, NS_BENCH_MIN_RESAMPLES);
}

typedef struct opts {
    const char *urls[2];
    int n_urls;
    const char *server_cmds[2]; /* the k-th starts the k-th --url's server */
    int n_cmds;
    const char *scenario, *json_path, *html_path, *model, *api_key;
    int blocks, requests, max_tokens, resamples, warmup;
    long long seed;
    double timeout_s, level;
} opts;

static int parse_int(const char *v, long long lo, long long hi, long long *out) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* Returns 0, or the usage-error exit code. */
static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->blocks = 6, o->requests = 3, o->max_tokens = 64, o->resamples = 2000, o->seed = 1, o->warmup = 1;
    o->timeout_s = 600, o->level = 0.95;
    o->api_key = getenv("NIGHTSHIFT_API_KEY");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long long n;
        if (!strcmp(a, "--url") || !strcmp(a, "--scenario") || !strcmp(a, "--blocks") || !strcmp(a, "--seed") ||
            !strcmp(a, "--json") || !strcmp(a, "--html") || !strcmp(a, "--requests") || !strcmp(a, "--max-tokens") ||
            !strcmp(a, "--model") || !strcmp(a, "--api-key") || !strcmp(a, "--timeout") || !strcmp(a, "--resamples") ||
            !strcmp(a, "--level") || !strcmp(a, "--warmup") ||
            !strcmp(a, "--server-cmd")) {
            v = ns_cli_flag_value(argc, argv, &i);
            if (!v) return ns_cli_usage_error("bench", usage, "%s needs a value", a);
        }
        if (!strcmp(a, "--url")) {
            if (o->n_urls == 2) return ns_cli_usage_error("bench", usage, "at most two --url");
            if (strncmp(v, "http://", 7) != 0 && strncmp(v, "https://", 8) != 0)
                return ns_cli_usage_error("bench", usage, "--url must start with http:// or https:// (got \"%s\")", v);
            if (strlen(v) > 400) return ns_cli_usage_error("bench", usage, "--url is too long");
            o->urls[o->n_urls++] = v;
        } else if (!strcmp(a, "--server-cmd")) {
            if (o->n_cmds == 2) return ns_cli_usage_error("bench", usage, "at most two --server-cmd");
            o->server_cmds[o->n_cmds++] = v;
        } else if (!strcmp(a, "--scenario")) o->scenario = v;
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--html")) o->html_path = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--blocks")) {
            if (parse_int(v, 1, MAX_BLOCKS, &n)) return ns_cli_usage_error("bench", usage, "--blocks must be 1..%d", MAX_BLOCKS);
            o->blocks = (int)n;
        } else if (!strcmp(a, "--seed")) {
            if (parse_int(v, 0, INT64_MAX, &n)) return ns_cli_usage_error("bench", usage, "--seed must be an integer >= 0");
            o->seed = n;
        } else if (!strcmp(a, "--requests")) {
            if (parse_int(v, 1, 64, &n)) return ns_cli_usage_error("bench", usage, "--requests must be 1..64");
            o->requests = (int)n;
        } else if (!strcmp(a, "--max-tokens")) {
            if (parse_int(v, 1, 1 << 20, &n)) return ns_cli_usage_error("bench", usage, "--max-tokens must be 1..1048576");
            o->max_tokens = (int)n;
        } else if (!strcmp(a, "--warmup")) {
            if (parse_int(v, 0, 100, &n)) return ns_cli_usage_error("bench", usage, "--warmup must be 0..100");
            o->warmup = (int)n;
        } else if (!strcmp(a, "--resamples")) {
            if (parse_int(v, NS_BENCH_MIN_RESAMPLES, 1000000, &n))
                return ns_cli_usage_error("bench", usage, "--resamples must be %d..1000000", NS_BENCH_MIN_RESAMPLES);
            o->resamples = (int)n;
        } else if (!strcmp(a, "--timeout") || !strcmp(a, "--level")) {
            char *end;
            double x = strtod(v, &end);
            bool lvl = !strcmp(a, "--level");
            if (*end || !(lvl ? x > 0.5 && x < 1 : x > 0 && x <= 86400))
                return ns_cli_usage_error("bench", usage, lvl ? "--level must be in (0.5, 1)" : "--timeout must be in (0, 86400]");
            if (lvl) o->level = x;
            else o->timeout_s = x;
        } else {
            return ns_cli_usage_error("bench", usage, "unknown option \"%s\"", a);
        }
    }
    if (!o->n_urls) return ns_cli_usage_error("bench", usage, "give --url (once, or twice to compare)");
    if (!o->scenario) return ns_cli_usage_error("bench", usage, "give --scenario");
    if (o->n_cmds > o->n_urls)
        return ns_cli_usage_error("bench", usage, "--server-cmd %d has no --url to answer on", o->n_cmds);
    if (o->n_urls == 2 && o->blocks < MIN_PAIRED_BLOCKS)
        return ns_cli_usage_error("bench", usage,
                                  "comparing two servers needs --blocks %d or more (paired AB/BA blocks are the unit "
                                  "of the confidence interval)",
                                  MIN_PAIRED_BLOCKS);
    if (!o->json_path && !o->html_path) fprintf(stderr, "nightshift bench: no --json or --html: the summary goes to stdout only\n");
    return 0;
}

/* A GET of root+path as JSON (NULL when not 200 JSON). */
static json_t *get_json(ns_hc *hc, const char *root, const char *path, const char *const *headers, char *why, size_t cap) {
    char url[600];
    snprintf(url, sizeof url, "%s%s", root, path);
    ns_hc_opts ho = {.timeout_s = 30, .max_response_bytes = 1 << 20};
    ns_hc_response r;
    ns_error err = {0};
    json_t *j = NULL;
    if (ns_hc_get(hc, url, headers, &ho, &r, &err) != NS_OK) snprintf(why, cap, "%.300s", r.error[0] ? r.error : err.msg);
    else if (r.status != 200) snprintf(why, cap, "HTTP %ld", r.status);
    else if (!(j = json_loadb(r.body ? r.body : "", r.body_len, 0, NULL))) snprintf(why, cap, "not JSON");
    ns_hc_response_free(&r);
    return j;
}

/* What this binary says to --version (its commit and backends). */
static void self_version(char *out, size_t cap) {
    snprintf(out, cap, "unknown");
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "'%s' --version 2>/dev/null", exe);
    if (strchr(exe, '\'')) return;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    size_t m = fread(out, 1, cap - 1, p);
    out[m] = 0;
    pclose(p);
    for (char *c = out; *c; c++)
        if (*c == '\n') *c = c[1] ? ';' : 0;
}

static json_t *machine(void) {
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(model, sizeof model, "%s", c + 2);
                model[strcspn(model, "\n")] = 0;
            }
            break;
        }
    }
    if (f) fclose(f);
    struct utsname u;
    char os[400] = "unknown";
    if (uname(&u) == 0) snprintf(os, sizeof os, "%s %s %s", u.sysname, u.release, u.machine);
    return json_pack("{s:s,s:I,s:s}", "cpu_model", model, "cores", (json_int_t)sysconf(_SC_NPROCESSORS_ONLN), "os", os);
}

static void redact_into(const char *cmd, char *out, size_t cap);

static json_t *provenance(const opts *o, int argc, char **argv, json_t *servers) {
    char date[64], ver[512];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    self_version(ver, sizeof ver);
    char cmd[4096];
    int off = snprintf(cmd, sizeof cmd, "nightshift bench");
    for (int i = 0; i < argc && off > 0 && (size_t)off < sizeof cmd; i++) {
        /* the key is never written to a report */
        const bool secret = i > 0 && !strcmp(argv[i - 1], "--api-key");
        char red[4096];
        if (i > 0 && !strcmp(argv[i - 1], "--server-cmd")) redact_into(argv[i], red, sizeof red);
        off += snprintf(cmd + off, sizeof cmd - (size_t)off, " %s",
                        secret ? "<redacted>" : i > 0 && !strcmp(argv[i - 1], "--server-cmd") ? red : argv[i]);
    }
    (void)o;
    return json_pack("{s:s,s:s,s:s,s:o,s:O}", "date", date, "command", cmd, "bench_version", ver, "machine", machine(),
                     "servers", servers);
}

/* A --server-cmd for the report, with the value after --api-key /
 * --admin-key replaced: keys never reach a report. */
static void redact_into(const char *cmd, char *out, size_t cap) {
    size_t o = 0;
    const char *p = cmd;
    while (*p && o + 16 < cap) {
        if (!strncmp(p, "--api-key", 9) || !strncmp(p, "--admin-key", 11)) {
            const size_t k = p[2] == 'a' && p[3] == 'p' ? 9 : 11;
            memcpy(out + o, p, k);
            o += k;
            p += k;
            if (*p == '=' || *p == ' ') {
                out[o++] = *p++;
                while (*p == ' ') p++;
                while (*p && *p != ' ') p++;
                memcpy(out + o, "<redacted>", 10);
                o += 10;
            }
            continue;
        }
        out[o++] = *p++;
    }
    out[o] = 0;
}

static json_t *redacted_cmd(const char *cmd) {
    char out[4096];
    redact_into(cmd, out, sizeof out);
    return json_string(out);
}

/* Finds each server's model and provenance; 0 or 1 (unreachable). */
static int discover(const opts *o, ns_bench_target *t, const char *const *headers, json_t *servers) {
    ns_error err = {0};
    ns_hc *hc = ns_hc_new(&err);
    if (!hc) {
        fprintf(stderr, "nightshift bench: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < o->n_urls && rc == 0; i++) {
        snprintf(t[i].root, sizeof t[i].root, "%s", o->urls[i]);
        size_t n = strlen(t[i].root);
        while (n > 0 && t[i].root[n - 1] == '/') t[i].root[--n] = 0;
        t[i].headers = headers;
        char why[400] = "";
        json_t *models = get_json(hc, t[i].root, "/v1/models", headers, why, sizeof why);
        json_t *data = json_object_get(models, "data"), *id = json_object_get(json_array_get(data, 0), "id");
        if (o->model) {
            snprintf(t[i].model, sizeof t[i].model, "%s", o->model);
        } else if (json_is_string(id)) {
            snprintf(t[i].model, sizeof t[i].model, "%s", json_string_value(id));
        } else {
            fprintf(stderr, "nightshift bench: %s/v1/models: %s; is the server up? (--model NAME skips this)\n",
                    t[i].root, why[0] ? why : "no model listed");
            rc = 1;
        }
        char w2[400];
        json_t *s = json_pack("{s:s,s:s,s:s,s:o}", "label", i ? "B" : "A", "url", t[i].root, "model", t[i].model,
                              "models", models ? models : json_null());
        /* optional: vLLM answers /version, llama.cpp /props */
        if (i < o->n_cmds) json_object_set_new(s, "command", redacted_cmd(o->server_cmds[i]));
        json_t *v = get_json(hc, t[i].root, "/version", headers, w2, sizeof w2);
        if (v) json_object_set_new(s, "version", v);
        json_t *p = get_json(hc, t[i].root, "/props", headers, w2, sizeof w2);
        if (p) json_object_set_new(s, "props", p);
        json_array_append_new(servers, s);
    }
    ns_hc_free(hc);
    return rc;
}

static int write_json(const char *path, json_t *root) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(root, tmp, JSON_INDENT(1)) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        fprintf(stderr, "nightshift bench: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* One line per compared metric (or why it is withheld). */
static void print_summary(json_t *root) {
    json_t *id = json_object_get(root, "identity");
    printf("scenario %s: identity gate %s\n", json_string_value(json_object_get(root, "scenario")),
           json_string_value(json_object_get(id, "verdict")));
    if (json_is_true(json_object_get(root, "skipped")))
        printf("  skipped: %s\n", json_string_value(json_object_get(root, "skip_reason")));
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(root, "servers"), i, s) {
        printf("  %s %s: %lld requests, %lld failed\n", json_string_value(json_object_get(s, "label")),
               json_string_value(json_object_get(s, "url")), (long long)json_integer_value(json_object_get(s, "requests")),
               (long long)json_integer_value(json_object_get(s, "failed")));
        const char *k;
        json_t *m;
        json_object_foreach(json_object_get(s, "summary"), k, m) {
            json_t *med = json_object_get(m, "median");
            if (med) printf("    %-24s median %.4g\n", k, json_number_value(med));
            else printf("    %-24s no value\n", k);
        }
    }
    json_t *c = json_object_get(root, "comparison"), *m;
    json_array_foreach(json_object_get(c, "metrics"), i, m) {
        if (json_is_true(json_object_get(m, "withheld")))
            printf("  B/A %-22s withheld: %s\n", json_string_value(json_object_get(m, "name")),
                   json_string_value(json_object_get(m, "withheld_reason")));
        else
            printf("  B/A %-22s %.4g [%.4g, %.4g] better: %s\n", json_string_value(json_object_get(m, "name")),
                   json_number_value(json_object_get(m, "ratio")), json_number_value(json_object_get(m, "ci_lo")),
                   json_number_value(json_object_get(m, "ci_hi")), json_string_value(json_object_get(m, "better")));
    }
}

/* Starts the --server-cmd servers (t[i].server set); 0, or 1 with a
 * message. Each logs next to --json (or in the working directory). */
static int start_servers(const opts *o, ns_bench_server *srv, ns_bench_target *t) {
    char dir[3000] = ".";
    if (o->json_path && strrchr(o->json_path, '/')) {
        snprintf(dir, sizeof dir, "%s", o->json_path);
        *strrchr(dir, '/') = 0;
        if (!dir[0]) snprintf(dir, sizeof dir, "/");
    }
    for (int i = 0; i < o->n_cmds; i++) {
        char root[512], log[3100];
        snprintf(root, sizeof root, "%s", o->urls[i]);
        size_t n = strlen(root);
        while (n > 0 && root[n - 1] == '/') root[--n] = 0;
        snprintf(log, sizeof log, "%s/bench-server-%c.log", dir, i ? 'B' : 'A');
        ns_error err = {0};
        if (ns_bench_server_init(&srv[i], o->server_cmds[i], root, log, &err) != NS_OK ||
            ns_bench_server_start(&srv[i], 300, &err) != NS_OK) {
            fprintf(stderr, "nightshift bench: server %c: %s\n", i ? 'B' : 'A', err.msg);
            return 1;
        }
        fprintf(stderr, "nightshift bench: started server %c (pid %d, log %s)\n", i ? 'B' : 'A', (int)srv[i].pid, log);
        t[i].server = &srv[i];
    }
    return 0;
}

/* Runs every block in AB/BA order; returns the runs ([blocks][n]). */
static ns_bench_run *run_blocks(const opts *o, const ns_bench_scenario *sc, const ns_bench_target *t, uint64_t *seeds) {
    ns_bench_run *runs = calloc((size_t)o->blocks * (size_t)o->n_urls, sizeof *runs);
    if (!runs) return NULL;
    /* warm-up blocks (not recorded): a fresh server's first requests pay
     * one-time costs (first touch of its KV pool, thread start-up, lazy
     * initialisation) that would otherwise land in block 0 */
    for (int w = 0; w < o->warmup && !sc->skipped; w++)
        for (int i = 0; i < o->n_urls; i++) {
            ns_bench_run r;
            ns_bench_run_block(sc, &t[i], ns_bench_mix((uint64_t)o->seed, 0x3a3a, (uint64_t)w), &r);
            fprintf(stderr, "nightshift bench: warm-up %d/%d server %s: %d requests, %d failed, %.2f s\n", w + 1,
                    o->warmup, i ? "B" : "A", r.n_requests, r.n_failed, r.wall_s);
            ns_bench_run_free(&r);
        }
    for (int b = 0; b < o->blocks; b++) {
        seeds[b] = ns_bench_mix((uint64_t)o->seed, 0xb10c, (uint64_t)b) >> 1; /* fits a JSON integer */
        for (int k = 0; k < o->n_urls; k++) {
            const int i = o->n_urls == 1 || ns_bench_a_first(b) ? k : 1 - k;
            ns_bench_run *r = &runs[b * o->n_urls + i];
            ns_bench_run_block(sc, &t[i], seeds[b], r);
            fprintf(stderr, "nightshift bench: block %d/%d server %s: %d requests, %d failed, %.2f s%s%s\n", b + 1,
                    o->blocks, i ? "B" : "A", r->n_requests, r->n_failed, r->wall_s, r->n_failed ? ": " : "",
                    r->n_failed ? r->first_error : "");
        }
    }
    return runs;
}

int ns_cli_bench(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (ns_cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        }
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    ns_bench_scenario sc;
    ns_error err = {0};
    if (ns_bench_scenario_parse(o.scenario, o.requests, o.max_tokens, o.timeout_s, &sc, &err) != NS_OK) {
        ns_bench_scenario_free(&sc);
        return ns_cli_usage_error("bench", usage, "%s", err.msg);
    }
    char auth[1100];
    const char *hdrs[2] = {NULL, NULL};
    if (o.api_key && *o.api_key) {
        if (strlen(o.api_key) > 1000 || strpbrk(o.api_key, "\r\n")) {
            ns_bench_scenario_free(&sc);
            return ns_cli_usage_error("bench", usage, "--api-key is too long or holds a line break");
        }
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o.api_key);
        hdrs[0] = auth;
    }
    ns_hc_global_init();
    ns_bench_target t[2];
    memset(t, 0, sizeof t);
    json_t *servers = json_array();
    uint64_t *seeds = calloc((size_t)o.blocks, sizeof *seeds);
    ns_bench_run *runs = NULL;
    json_t *root = NULL;
    ns_bench_server srv[2];
    memset(srv, 0, sizeof srv);
    rc = 1;
    if (!servers || !seeds) goto done;
    if (start_servers(&o, srv, t) != 0) goto done;
    if (sc.kind == NS_BENCH_RESTART && o.n_cmds < o.n_urls) {
        sc.skipped = true;
        snprintf(sc.skip_reason, sizeof sc.skip_reason,
                 "restart-resume stops and restarts the server, so it needs servers the bench starts itself: give "
                 "a --server-cmd for every --url");
    }
    if (discover(&o, t, hdrs, servers) != 0) goto done;
    if (!(runs = run_blocks(&o, &sc, t, seeds))) goto done;
    ns_bench_result_in in = {.scenario = &sc, .n_servers = o.n_urls, .labels = {"A", "B"}, .urls = {t[0].root, t[1].root},
                             .blocks = o.blocks, .seed = (uint64_t)o.seed, .block_seeds = seeds, .runs = runs,
                             .resamples = o.resamples, .level = o.level};
    root = ns_bench_result_build(&in);
    if (!root) goto done;
    json_object_set_new(root, "warmup_blocks", json_integer(sc.skipped ? 0 : o.warmup));
    json_object_set_new(root, "provenance", provenance(&o, argc, argv, servers));
    print_summary(root);
    rc = 0;
    if (o.json_path && write_json(o.json_path, root) != 0) rc = 1;
    if (o.html_path && ns_bench_report_html(root, o.html_path, &err) != NS_OK) {
        fprintf(stderr, "nightshift bench: %s\n", err.msg);
        rc = 1;
    }
done:
    if (rc && !root && servers) fprintf(stderr, "nightshift bench: stopped before any result\n");
    for (int i = 0; runs && i < o.blocks * o.n_urls; i++) ns_bench_run_free(&runs[i]);
    free(runs);
    free(seeds);
    json_decref(root);
    json_decref(servers);
    ns_bench_scenario_free(&sc);
    for (int i = 0; i < 2; i++) ns_bench_server_free(&srv[i]);
    return rc;
}
