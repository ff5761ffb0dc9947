/* cli_serve.c — `nightshift serve` (see cli_serve.h). */
#include "cli/cli_serve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "cli/cli_common.h"
#include "record/recorder.h"
#include "server/server.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/log.h"

typedef struct serve_opts {
    ns_cli_engine_opts eng;
    ns_server_opts http;
    int32_t max_running;
    const char *model_name;
    double shutdown_timeout_s;
    /* KV cache tiers (see src/kv/kv_cache.h) */
    int64_t ram_cache_bytes;    /* -1 = default: a quarter of RAM on CUDA, off on CPU */
    const char *ssd_dir;        /* NULL = default directory */
    bool no_ssd_cache;
    ns_pause_policy pause_policy;
    bool log_prompts;
    int64_t ssd_cache_bytes;
    char ssd_dir_buf[4096];
    /* --record DIR (record/recorder.h) */
    const char *record_dir;
    bool record_redact;
    int64_t record_max_bytes;
    int record_keep;
} serve_opts;

/* What the loader thread brings up; torn down by the main thread. */
typedef struct loader {
    serve_opts *o;
    ns_api *api;
    ns_cli_engine ce;
    ns_tokenizer *tok;
    ns_template *tmpl;
    ns_sched *sched;
    atomic_int done; /* 1 ok, -1 failed */
    ns_error err;
} loader;

/* Defaults, shared by ns_cli_serve and the usage text (the server's own
 * defaults for 0 are the same values). */
#define SERVE_DEFAULT_HOST "127.0.0.1"
#define SERVE_DEFAULT_PORT 8080
#define SERVE_DEFAULT_MAX_RUNNING 16
#define SERVE_DEFAULT_MAX_BODY ((size_t)32 << 20)
#define SERVE_DEFAULT_TIMEOUT_S 300u
#define SERVE_DEFAULT_REQUEST_TIMEOUT_S 30u
#define SERVE_DEFAULT_MAX_CONNECTIONS 1024u
#define SERVE_DEFAULT_SHUTDOWN_S 10
/* serve keeps several contexts in the pool so that requests without
 * max_tokens (each reserves up to a whole context) can run at once */
#define SERVE_DEFAULT_POOL_CONTEXTS 4
#define SERVE_DEFAULT_SSD_BYTES (32ll << 30)

static void serve_defaults(serve_opts *o) {
    memset(o, 0, sizeof *o);
    ns_cli_engine_opts_default(&o->eng);
    o->eng.default_pool_contexts = SERVE_DEFAULT_POOL_CONTEXTS;
    o->http.host = SERVE_DEFAULT_HOST;
    o->http.port = SERVE_DEFAULT_PORT;
    o->http.max_body_bytes = SERVE_DEFAULT_MAX_BODY;
    o->http.timeout_s = SERVE_DEFAULT_TIMEOUT_S;
    o->http.request_timeout_s = SERVE_DEFAULT_REQUEST_TIMEOUT_S;
    o->http.max_connections = SERVE_DEFAULT_MAX_CONNECTIONS;
    o->http.check_host = true; /* on loopback: Host must name this machine */
    o->max_running = SERVE_DEFAULT_MAX_RUNNING;
    o->shutdown_timeout_s = SERVE_DEFAULT_SHUTDOWN_S;
    o->ram_cache_bytes = -1;
    o->ssd_cache_bytes = SERVE_DEFAULT_SSD_BYTES;
}

/* $XDG_CACHE_HOME/nightshift, else ~/.cache/nightshift; NULL if neither
 * variable is set (the SSD tier is then off unless --ssd-cache is given). */
static const char *default_ssd_dir(char *buf, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(buf, cap, "%s/nightshift", xdg);
    else if (home && *home) n = snprintf(buf, cap, "%s/.cache/nightshift", home);
    else return NULL;
    return n > 0 && (size_t)n < cap ? buf : NULL;
}

/* Resolves the tier defaults once the device is known. */
static void resolve_tiers(serve_opts *o) {
    if (o->ram_cache_bytes < 0) {
        o->ram_cache_bytes = 0; /* CPU: the pool already is RAM */
        if (o->eng.device && strcmp(o->eng.device, "cuda") == 0) {
            long phys = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
            if (phys > 0 && psz > 0) o->ram_cache_bytes = (int64_t)phys * psz / 4;
        }
    }
    if (o->no_ssd_cache) o->ssd_dir = NULL;
    else if (!o->ssd_dir) o->ssd_dir = default_ssd_dir(o->ssd_dir_buf, sizeof o->ssd_dir_buf);
}

static void usage(FILE *f) {
    serve_opts d;
    serve_defaults(&d);
    fprintf(f,
            "usage: nightshift serve [--model DIR | --dummy-weights CONFIG_JSON] [--host H] [--port P] [options]\n"
            "  OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models,\n"
            "  /health, /metrics). The model directory is checked before the port opens; the\n"
            "  weights then load in the background (GET /health answers 503 until ready).\n"
            "  SIGINT/SIGTERM: stop accepting, let running requests finish, exit. Example:\n"
            "    nightshift serve --model DIR --port 8080\n"
            "    nightshift serve --dummy-weights CONFIG_JSON --port 8080\n"
            "  --dummy-weights CONFIG_JSON  benchmarks without a checkpoint: a model of this config.json\n"
            "                           with RANDOM bf16 weights generated on the device, the demo\n"
            "                           byte-level tokenizer and ChatML template (default: off;\n"
            "                           excludes --model)\n"
            "  --host H                 listen address (default %s)\n"
            "  --port P                 listen port; 0 = any free port, the log says which (default %d)\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' (default: $NIGHTSHIFT_API_KEY,\n"
            "                           or none)\n"
            "  --served-model-name N    model id reported by the API (default: the directory name,\n"
            "                           the config name, or nightshift-demo); --alias N is the same\n"
            "  --max-running N          sequences decoded at once (default %d)\n"
            "  --max-body-bytes N       request body cap in bytes (default %zu)\n"
            "  --timeout S              idle limit in seconds (default %u) of a connection the server\n"
            "                           writes to; streams send a keep-alive every min(15, S/3) s\n"
            "  --request-timeout S      seconds (default %u) for a request to arrive complete after the\n"
            "                           connection opens or the previous answer, else it is closed\n"
            "                           (a request being answered has no limit)\n"
            "  --max-connections N      open connections at most (default %u); near it, those waiting\n"
            "                           longest for a request are closed\n"
            "  --max-connections-per-peer N  connections per client address (default 0 = no cap)\n"
            "  --stream-buffer SIZE     unread bytes (default 4M) a stream may queue for a client that\n"
            "                           stopped reading; past it the generation is cancelled\n"
            "  --allowed-hosts H,...    more Host names to accept (default none; '*' = any) besides\n"
            "                           localhost, 127.0.0.1, [::1] and --host; Host is checked on\n"
            "                           loopback, or whenever this is given\n"
            "  --cors-origins O,...     origins (scheme://host[:port]) browsers may call from (default\n"
            "                           none: requests with another Origin get 403; '*' = any)\n"
            "  --shutdown-timeout S     seconds running requests may take to finish on SIGTERM (default %d)\n"
            "  --admin-key KEY          key for /admin/* (default: the --api-key, or none)\n"
            "KV cache tiers below the pool (evicted pages are demoted, hits promoted back):\n"
            "  --ram-cache SIZE         host-RAM tier, e.g. 16G; 0 = off (default: a quarter of RAM\n"
            "                           with --device cuda; off on the CPU, where the pool is RAM)\n"
            "  --ssd-cache DIR          durable SSD tier, kept across restarts (default\n"
            "                           $XDG_CACHE_HOME/nightshift or ~/.cache/nightshift)\n"
            "  --ssd-cache-size SIZE    SSD tier size cap (default 32G); least recently used pages go\n"
            "                           first\n"
            "  --no-ssd-cache           no SSD tier (default: the tier is on)\n"
            "When the KV pool is full:\n"
            "  --pause-policy P         pause (default): admit on the pages a request needs now and,\n"
            "                           when the pool runs dry, pause the newest request (its KV goes\n"
            "                           to the cache tiers, it resumes exactly when room returns);\n"
            "                           reserve: admit only when prompt + max_tokens fit, never pause\n"
            "  --log-prompts            log prompt text at INFO (default off: only at --log-level\n"
            "                           debug), e.g. where a prompt left the cache\n"
            "Recording (for nightshift replay / check-prompts):\n"
            "  --record DIR             (default off) append one JSON line per completion request to\n"
            "                           DIR/requests.jsonl: body, arrival, prompt/cached tokens, TTFT, status\n"
            "  --record-redact          (default off) message texts -> their token count and a hash\n"
            "  --record-max-bytes SIZE  rotate the file past this size (default 256M)\n"
            "  --record-keep N          rotated files kept, requests.jsonl.1 .. .N (default 8)\n",
            d.http.host, d.http.port, d.max_running, d.http.max_body_bytes, d.http.timeout_s,
            d.http.request_timeout_s, d.http.max_connections, (int)d.shutdown_timeout_s);
    ns_cli_engine_usage(f, &d.eng);
}

static int parse_ll(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Renders token ids for the scheduler's "prompt diverged at" log line. */
static void describe_tokens(void *ctx, const int32_t *tokens, int32_t n, char *out, size_t cap) {
    if (!cap) return;
    out[0] = 0;
    char *s = NULL;
    size_t len = 0;
    ns_error err;
    if (ns_tokenizer_decode(ctx, tokens, (size_t)n, false, &s, &len, &err) != NS_OK) return;
    size_t k = 0;
    for (size_t i = 0; i < len && k + 1 < cap; i++) out[k++] = s[i] == '\n' ? ' ' : s[i];
    out[k] = 0;
    free(s);
}

static bool contains(const char *s, const char *needle) { return s && strstr(s, needle) != NULL; }

static void *load_main(void *arg) {
    loader *L = arg;
    ns_api *a = L->api;
    serve_opts *o = L->o;
    ns_status rc = ns_cli_engine_open(&o->eng, &L->ce, &L->err);
    if (rc == NS_OK && !L->tok) rc = ns_cli_engine_tokenizer(&o->eng, &L->ce, &L->tok, &L->err);
    if (rc != NS_OK) goto fail;
    const char *src = ns_tokenizer_chat_template(L->tok, NULL);
    if (src) {
        ns_error terr = {0};
        if (ns_template_parse(src, strlen(src), &L->tmpl, &terr) != NS_OK) {
            NS_WARN("serve: the chat template does not parse (%s); chat completions are disabled", terr.msg);
            L->tmpl = NULL;
        }
    } else {
        NS_WARN("serve: the model has no chat template; only /v1/completions can be used");
    }
    ns_sched_opts so = {
        .max_batch_tokens = o->eng.max_batch_tokens,
        .max_running = o->max_running,
        .describe = describe_tokens,
        .describe_ctx = L->tok,
        .ram_cache_bytes = o->ram_cache_bytes,
        .ssd_dir = o->ssd_dir,
        .ssd_bytes = o->ssd_cache_bytes,
        .pause_policy = o->pause_policy,
        .log_prompts = o->log_prompts,
    };
    rc = ns_sched_create(L->ce.engine, &so, &L->sched, &L->err);
    if (rc == NS_OK) rc = ns_sched_start(L->sched, &L->err);
    if (rc != NS_OK) goto fail;

    a->tok = L->tok;
    a->tmpl = L->tmpl;
    a->tmpl_src = L->tmpl ? src : NULL;
    /* pass client-sent argument strings through when the template can
     * print a string itself (HF behaviour); otherwise it would tojson them */
    a->tmpl_wants_string_args = contains(src, "arguments is string") || contains(src, "arguments is not string");
    a->toolfmt = ns_toolfmt_detect(src ? src : "");
    a->reasoning = contains(src, "<think>");
    a->sched = L->sched;
    a->cfg = L->ce.model->cfg;
    snprintf(a->fingerprint, sizeof a->fingerprint, "fp_%012llx",
             (unsigned long long)(L->ce.model->fingerprint & 0xffffffffffffull));
    a->random_seed = ns_cli_random_seed;
    int expect = NS_API_LOADING;
    if (!atomic_compare_exchange_strong(&a->state, &expect, NS_API_READY)) {
        atomic_store(&L->done, 1); /* shutdown began while loading */
        return NULL;
    }
    NS_INFO("serve: model ready (%s, context %d, vocab %d, tools: %s, reasoning: %s)", a->model_name,
            a->cfg.max_position_embeddings, a->cfg.vocab_size, ns_toolfmt_name(a->toolfmt),
            a->reasoning ? "think" : "off");
    atomic_store(&L->done, 1);
    return NULL;
fail:
    {
        int expect2 = NS_API_LOADING;
        atomic_compare_exchange_strong(&a->state, &expect2, NS_API_FAILED);
    }
    atomic_store(&L->done, -1);
    return NULL;
}

static void model_name_from_dir(const char *dir, char *out, size_t cap) {
    if (!dir) {
        snprintf(out, cap, "nightshift-demo");
        return;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    snprintf(out, cap, "%.*s", (int)(n - s), dir + s);
}

/* "bench/configs/qwen3-8b.json" -> "qwen3-8b" */
static void dummy_model_name(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && strcmp(b + n - 5, ".json") == 0) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, b);
}

/* Returns 0 to go on, or an exit code to return at once (1 after --help:
 * the caller maps it to 0; 2 on a usage error). */
static int parse_args(int argc, char **argv, serve_opts *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (ns_cli_is_help(a)) {
            usage(stdout);
            return 1;
        }
        ns_error ferr = {0};
        int r = ns_cli_parse_engine_flag(&o->eng, argc, argv, &i, &ferr);
        if (r < 0) return ns_cli_usage_error("serve", usage, "%s", ferr.msg);
        if (r > 0) continue;
        if (strcmp(a, "--no-ssd-cache") == 0) {
            o->no_ssd_cache = true;
            continue;
        }
        if (strcmp(a, "--log-prompts") == 0) {
            o->log_prompts = true;
            continue;
        }
        if (strcmp(a, "--record-redact") == 0) {
            o->record_redact = true;
            continue;
        }
        static const char *const with_value[] = {"--host", "--port", "--api-key", "--served-model-name", "--alias",
                                                 "--max-running", "--max-body-bytes", "--timeout",
                                                 "--shutdown-timeout", "--admin-key", "--ram-cache",
                                                 "--ssd-cache", "--ssd-cache-size", "--dummy-weights",
                                                 "--pause-policy", "--request-timeout", "--max-connections",
                                                 "--max-connections-per-peer", "--allowed-hosts", "--cors-origins",
                                                 "--stream-buffer",
                                                 "--record", "--record-max-bytes", "--record-keep"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= strcmp(a, with_value[k]) == 0;
        if (!known) return ns_cli_usage_error("serve", usage, "unknown option %s", a);
        const char *v = ns_cli_flag_value(argc, argv, &i);
        if (!v) return ns_cli_usage_error("serve", usage, "%s needs a value", a);
        long long x;
        double sz;
        if (strcmp(a, "--host") == 0) o->http.host = v;
        else if (strcmp(a, "--allowed-hosts") == 0) o->http.allowed_hosts = v;
        else if (strcmp(a, "--cors-origins") == 0) o->http.cors_origins = v;
        else if (strcmp(a, "--request-timeout") == 0) {
            if (parse_ll(v, 1, 1 << 20, &x)) goto bad;
            o->http.request_timeout_s = (unsigned)x;
        } else if (strcmp(a, "--max-connections") == 0) {
            if (parse_ll(v, 16, 1 << 20, &x)) goto bad;
            o->http.max_connections = (unsigned)x;
        } else if (strcmp(a, "--max-connections-per-peer") == 0) {
            if (parse_ll(v, 0, 1 << 20, &x)) goto bad;
            o->http.max_connections_per_peer = (unsigned)x;
        } else if (strcmp(a, "--stream-buffer") == 0) {
            if (ns_cli_parse_size(v, &sz) != 0 || sz < 4096 || sz > (double)((size_t)1 << 30)) goto bad;
            o->http.stream_buffer_bytes = (size_t)sz;
        }
        else if (strcmp(a, "--admin-key") == 0) o->http.admin_key = v;
        else if (strcmp(a, "--record") == 0) o->record_dir = v;
        else if (strcmp(a, "--record-max-bytes") == 0) {
            if (ns_cli_parse_size(v, &sz) != 0 || sz < 1024) goto bad;
            o->record_max_bytes = (int64_t)sz;
        } else if (strcmp(a, "--record-keep") == 0) {
            if (parse_ll(v, 1, 1000, &x)) goto bad;
            o->record_keep = (int)x;
        }
        else if (strcmp(a, "--ssd-cache") == 0) o->ssd_dir = v;
        else if (strcmp(a, "--dummy-weights") == 0) o->eng.dummy_config = v;
        else if (strcmp(a, "--pause-policy") == 0) {
            if (strcmp(v, "pause") == 0) o->pause_policy = NS_PAUSE_POLICY_PAUSE;
            else if (strcmp(v, "reserve") == 0) o->pause_policy = NS_PAUSE_POLICY_RESERVE;
            else goto bad;
        }
        else if (strcmp(a, "--ram-cache") == 0) {
            if (strcmp(v, "0") == 0 || strcmp(v, "off") == 0) o->ram_cache_bytes = 0;
            else if (ns_cli_parse_size(v, &sz) != 0) goto bad;
            else o->ram_cache_bytes = (int64_t)sz;
        } else if (strcmp(a, "--ssd-cache-size") == 0) {
            if (ns_cli_parse_size(v, &sz) != 0 || sz < (1 << 20)) goto bad;
            o->ssd_cache_bytes = (int64_t)sz;
        }
        else if (strcmp(a, "--api-key") == 0) o->http.api_key = v;
        else if (strcmp(a, "--served-model-name") == 0 || strcmp(a, "--alias") == 0) o->model_name = v;
        else if (strcmp(a, "--port") == 0) {
            if (parse_ll(v, 0, 65535, &x)) goto bad;
            o->http.port = (int)x;
        } else if (strcmp(a, "--max-running") == 0) {
            if (parse_ll(v, 1, 4096, &x)) goto bad;
            o->max_running = (int32_t)x;
        } else if (strcmp(a, "--max-body-bytes") == 0) {
            if (parse_ll(v, 1024, (long long)1 << 32, &x)) goto bad;
            o->http.max_body_bytes = (size_t)x;
        } else if (strcmp(a, "--timeout") == 0) {
            if (parse_ll(v, 1, 1 << 30, &x)) goto bad;
            o->http.timeout_s = (unsigned)x;
        } else if (strcmp(a, "--shutdown-timeout") == 0) {
            if (parse_ll(v, 0, 1 << 20, &x)) goto bad;
            o->shutdown_timeout_s = (double)x;
        }
        continue;
    bad:
        return ns_cli_usage_error("serve", usage, "bad value for %s: \"%s\"", a, v);
    }
    return 0;
}

/* Checks, before the port opens, everything about --model that a load
 * would reject and that is cheap to check: config.json (parses, supported
 * architecture), the safetensors headers (every tensor the loader binds,
 * with its shape; nothing unexpected) and tokenizer.json, which is loaded
 * for real and handed to the loader (it is needed anyway). Without this a
 * bad directory left a server that logged "listening" and then died, or
 * that a client could only see as 503s. The weight data itself is read by
 * the background load. */
static ns_status check_model_dir(const char *dir, ns_tokenizer **tok_out, ns_error *err) {
    *tok_out = NULL;
    ns_model_config cfg;
    ns_status rc = ns_model_validate_dir(dir, &cfg, err);
    if (rc == NS_OK) rc = ns_tokenizer_load(dir, tok_out, err);
    if (rc == NS_OK)
        NS_INFO("serve: %s: config, weight headers and tokenizer OK (%s, %d layers, hidden %d, vocab %d)", dir,
                cfg.arch_name, cfg.n_layers, cfg.hidden_size, cfg.vocab_size);
    return rc;
}

int ns_cli_serve(int argc, char **argv) {
    if (!getenv("NS_LOG_LEVEL")) ns_log_set_level(NS_LOG_INFO); /* one line per request */
    /* static: a loader left behind by a shutdown during a stuck load
     * still reads it */
    static serve_opts o;
    serve_defaults(&o);
    o.http.api_key = getenv("NIGHTSHIFT_API_KEY");
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : pr;
    if (o.eng.model_dir && o.eng.dummy_config)
        return ns_cli_usage_error("serve", usage, "give at most one of --model DIR or --dummy-weights CONFIG_JSON");
    if (!o.record_dir && (o.record_redact || o.record_max_bytes || o.record_keep))
        return ns_cli_usage_error("serve", usage, "--record-redact, --record-max-bytes and --record-keep need --record DIR");
    {   /* --kv-dtype against --device, before listening (the engine opens after) */
        ns_dtype kd;
        ns_error kerr = {0};
        if (ns_kv_dtype_choose(o.eng.kv_dtype, o.eng.device, &kd, &kerr) != NS_OK)
            return ns_cli_usage_error("serve", usage, "%s", kerr.msg);
    }
    resolve_tiers(&o);
    ns_tokenizer *checked_tok = NULL;
    if (o.eng.model_dir) {
        ns_error verr = {0};
        if (check_model_dir(o.eng.model_dir, &checked_tok, &verr) != NS_OK) {
            fprintf(stderr, "nightshift serve: --model %s is not a usable model directory: %s\n", o.eng.model_dir,
                    verr.msg);
            return 1;
        }
    } else if (o.eng.dummy_config) {
        ns_model_config cfg;
        ns_error verr = {0};
        if (ns_cli_dummy_config(o.eng.dummy_config, &cfg, &verr) != NS_OK) {
            fprintf(stderr, "nightshift serve: --dummy-weights: %s\n", verr.msg);
            return 1;
        }
    }
    o.eng.max_batch_tokens = ns_cli_batch_tokens(&o.eng); /* the scheduler's budget = the engine's */
    /* the engine computes logits for every running sequence each step */
    if (o.eng.max_logits < o.max_running) o.eng.max_logits = o.max_running;
    if (o.eng.max_logits > o.eng.max_batch_tokens) o.eng.max_logits = o.eng.max_batch_tokens;

    char name[256];
    if (o.model_name) snprintf(name, sizeof name, "%s", o.model_name);
    else if (o.eng.dummy_config) dummy_model_name(o.eng.dummy_config, name, sizeof name);
    else model_name_from_dir(o.eng.model_dir, name, sizeof name);
    if (o.eng.dummy_config)
        NS_WARN("serve: WARNING: --dummy-weights: serving RANDOM bf16 weights shaped by %s, with the demo "
                "tokenizer (for benchmarks; the output is noise)", o.eng.dummy_config);
    else if (!o.eng.model_dir)
        NS_WARN("serve: WARNING: no --model given: serving the built-in RANDOM-WEIGHT demo model (its output is noise)");

    /* Signals are taken synchronously by this thread only: block them
     * before any thread starts so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe, old_xfsz;
    sigaction(SIGPIPE, &ign, &old_pipe);
    /* a file-size limit hit by the SSD tier must fail the write (EFBIG,
     * which degrades the tier), not kill the server */
    sigaction(SIGXFSZ, &ign, &old_xfsz);

    ns_api *api = calloc(1, sizeof *api);
    loader *L = calloc(1, sizeof *L);
    int rc = 1;
    ns_server *srv = NULL;
    pthread_t th;
    bool th_started = false;
    bool abandoned = false; /* the loader is stuck: exit without it */
    ns_recorder *recorder = NULL; /* --record; closed after the server stopped (no handler pushes then) */
    if (!api || !L) {
        fprintf(stderr, "nightshift serve: out of memory\n");
        ns_tokenizer_free(checked_tok);
        goto out;
    }
    L->tok = checked_tok; /* the loader takes it over; freed with L */
    ns_api_init(api, name);
    if (o.record_dir) {
        ns_error rerr = {0};
        ns_recorder_opts ro = {.dir = o.record_dir, .max_bytes = o.record_max_bytes, .keep = o.record_keep};
        if (ns_recorder_open(&ro, &recorder, &rerr) != NS_OK) {
            fprintf(stderr, "nightshift serve: --record %s: %s\n", o.record_dir, rerr.msg);
            goto out;
        }
        api->recorder = recorder;
        api->record_redact = o.record_redact;
        NS_INFO("serve: recording requests to %s/%s%s", o.record_dir, NS_RECORDER_FILE,
                o.record_redact ? " (message texts redacted)" : "");
    }
    int n_routes;
    const ns_http_route *routes = ns_api_routes(&n_routes);
    ns_error err = {0};
    o.http.max_context_tokens = ns_api_max_context_tokens; /* X-Nightshift-Max-Context-Tokens */
    if (ns_server_start(&o.http, routes, n_routes, api, &srv, &err) != NS_OK) {
        fprintf(stderr, "nightshift serve: %s\n", err.msg);
        goto out;
    }
    api->server = srv;
    char url[300];
    ns_server_url(srv, url, sizeof url);
    NS_INFO("serve: listening on %s (model %s)", url, name);
    if (!ns_server_is_loopback(srv) && !(o.http.api_key && *o.http.api_key))
        NS_WARN("serve: WARNING: listening on %s, beyond this machine, without an API key: anyone who can "
                "reach it can use it (set --api-key or NIGHTSHIFT_API_KEY)", o.http.host);
    L->o = &o;
    L->api = api;
    if (pthread_create(&th, NULL, load_main, L) != 0) {
        fprintf(stderr, "nightshift serve: cannot start the loader thread\n");
        goto out;
    }
    th_started = true;

    /* serve until a signal (or a failed load) */
    int signals = 0;
    for (;;) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        int s = sigtimedwait(&sigs, NULL, &ts);
        if (s == SIGINT || s == SIGTERM) {
            signals++;
            NS_INFO("serve: %s received; shutting down", s == SIGINT ? "SIGINT" : "SIGTERM");
            break;
        }
        if (atomic_load(&L->done) < 0) {
            fprintf(stderr, "nightshift serve: loading the model failed: %s\n", L->err.msg);
            break;
        }
    }
    bool load_failed = atomic_load(&L->done) < 0;

    /* graceful shutdown: no new work, let running requests finish */
    atomic_store(&api->state, atomic_load(&api->state) == NS_API_READY ? NS_API_DRAINING : atomic_load(&api->state));
    {
        int expect = NS_API_LOADING;
        atomic_compare_exchange_strong(&api->state, &expect, NS_API_DRAINING);
    }
    ns_server_quiesce(srv);
    double deadline = ns_clock_now() + o.shutdown_timeout_s;
    while (ns_server_active(srv) > 0 && ns_clock_now() < deadline) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        int s = sigtimedwait(&sigs, NULL, &ts);
        if (s == SIGINT || s == SIGTERM) {
            NS_INFO("serve: second signal: cancelling running requests");
            break;
        }
    }
    /* A load that does not finish (a stuck disk, a locked SSD index)
     * must not hold a SIGTERM hostage: wait up to the shutdown timeout,
     * or until a second signal, then exit without it. */
    if (atomic_load(&L->done) == 0) {
        const double dl = ns_clock_now() + (o.shutdown_timeout_s > 1 ? o.shutdown_timeout_s : 1);
        while (atomic_load(&L->done) == 0 && ns_clock_now() < dl) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            int sg = sigtimedwait(&sigs, NULL, &ts);
            if (sg == SIGINT || sg == SIGTERM) break;
        }
        if (atomic_load(&L->done) == 0) {
            NS_WARN("serve: the model is still loading; exiting without waiting for it");
            abandoned = true;
        }
    }
    if (!abandoned) pthread_join(th, NULL);
    th_started = false;
    if (!abandoned && L->sched) ns_sched_stop(L->sched); /* remaining requests end as cancelled */
    /* let the cancelled ones write their last event before sockets close */
    deadline = ns_clock_now() + 3.0;
    while (ns_server_active(srv) > 0 && ns_clock_now() < deadline) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ns_server_stop(srv); /* joins the connection threads */
    srv = NULL;
    api->recorder = NULL;
    ns_recorder_close(recorder); /* writes what is queued */
    recorder = NULL;
    /* The SSD tier's write-behind drains in ns_sched_free (every committed
     * page made durable): before "stopped", so that the line means the
     * cache survives this restart; a supervisor that reads the log, or
     * kills the process after it, loses nothing. No handler runs now. */
    if (!abandoned && L->sched) {
        api->sched = NULL;
        ns_sched_free(L->sched);
        L->sched = NULL;
    }
    rc = load_failed ? 1 : 0;
    NS_INFO("serve: stopped");
out:
    if (th_started) pthread_join(th, NULL);
    if (srv) ns_server_stop(srv);
    if (!abandoned) ns_recorder_close(recorder); /* else a handler may still hold it: the exit ends it */
    if (abandoned) L = NULL, api = NULL; /* still in the loader's hands: the process exit frees them */
    if (L) {
        ns_sched_free(L->sched);
        ns_template_free(L->tmpl);
        ns_tokenizer_free(L->tok);
        ns_cli_engine_close(&L->ce);
    }
    free(L);
    free(api);
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigaction(SIGXFSZ, &old_xfsz, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
