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

#include "api/api.h"
#include "cli/cli_common.h"
#include "server/server.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

typedef struct serve_opts {
    ns_cli_engine_opts eng;
    ns_server_opts http;
    int32_t max_running;
    const char *model_name;
    double shutdown_timeout_s;
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

static void usage(FILE *f) {
    fprintf(f,
            "usage: nightshift serve [--model DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
            "  --model DIR             Hugging Face model directory (omit: random-weight demo model)\n"
            "  --host H / --port P     listen address (port 0: any free port; the log says which)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' (also $NIGHTSHIFT_API_KEY)\n"
            "  --served-model-name N   model id reported by the API (default: the directory name)\n"
            "  --max-running N         sequences decoded at once (default 16)\n"
            "  --max-body-bytes N      request body cap (default 33554432)\n"
            "  --timeout S             idle connection timeout in seconds (default 3600)\n"
            "  --shutdown-timeout S    how long running requests may finish on SIGTERM (default 10)\n"
            "  --log-level L           debug|info|warn|error|off (default info)\n"
            "  engine: --device cpu|cuda --threads N --page-size P --max-batch-tokens N\n"
            "          KV pool: --kv-tokens N | --kv-pages N | --kv-memory SIZE | --gpu-memory FRACTION_OR_SIZE\n");
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
    if (rc == NS_OK) rc = ns_cli_tokenizer_open(o->eng.model_dir, &L->tok, &L->err);
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
    a->toolfmt = contains(src, "<tool_call>") ? NS_TOOLFMT_HERMES : NS_TOOLFMT_LLAMA_JSON;
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
            a->cfg.max_position_embeddings, a->cfg.vocab_size, a->toolfmt == NS_TOOLFMT_HERMES ? "hermes" : "llama-json",
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

static int parse_args(int argc, char **argv, serve_opts *o) {
    for (int i = 0; i < argc; i++) {
        int r = ns_cli_parse_engine_flag(&o->eng, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "nightshift serve: unknown argument or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--host") == 0) o->http.host = v;
        else if (strcmp(a, "--api-key") == 0) o->http.api_key = v;
        else if (strcmp(a, "--served-model-name") == 0 || strcmp(a, "--alias") == 0) o->model_name = v;
        else if (strcmp(a, "--log-level") == 0) {
            int l = ns_log_parse_level(v);
            if (l < 0) {
                fprintf(stderr, "nightshift serve: --log-level must be debug|info|warn|error|off\n");
                return 2;
            }
            ns_log_set_level((ns_log_level)l);
        } else if (strcmp(a, "--port") == 0) {
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
        } else {
            fprintf(stderr, "nightshift serve: unknown argument %s\n", a);
            usage(stderr);
            return 2;
        }
        continue;
    bad:
        fprintf(stderr, "nightshift serve: bad value for %s: %s\n", a, v);
        return 2;
    }
    return 0;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ns_cli_serve(int argc, char **argv) {
    if (!getenv("NS_LOG_LEVEL")) ns_log_set_level(NS_LOG_INFO); /* one line per request */
    serve_opts o;
    memset(&o, 0, sizeof o);
    ns_cli_engine_opts_default(&o.eng);
    o.eng.default_pool_contexts = 4;
    o.http.host = "127.0.0.1";
    o.http.port = 8080;
    o.http.api_key = getenv("NIGHTSHIFT_API_KEY");
    o.max_running = 16;
    o.shutdown_timeout_s = 10;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : pr;
    /* the engine computes logits for every running sequence each step */
    if (o.eng.max_logits < o.max_running) o.eng.max_logits = o.max_running;
    if (o.eng.max_logits > o.eng.max_batch_tokens) o.eng.max_logits = o.eng.max_batch_tokens;

    char name[256];
    if (o.model_name) snprintf(name, sizeof name, "%s", o.model_name);
    else model_name_from_dir(o.eng.model_dir, name, sizeof name);
    if (!o.eng.model_dir)
        NS_WARN("serve: WARNING: no --model given: serving the built-in RANDOM-WEIGHT demo model (its output is noise)");

    /* Signals are taken synchronously by this thread only: block them
     * before any thread starts so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe;
    sigaction(SIGPIPE, &ign, &old_pipe);

    ns_api *api = calloc(1, sizeof *api);
    loader *L = calloc(1, sizeof *L);
    int rc = 1;
    ns_server *srv = NULL;
    pthread_t th;
    bool th_started = false;
    if (!api || !L) {
        fprintf(stderr, "nightshift serve: out of memory\n");
        goto out;
    }
    ns_api_init(api, name);
    int n_routes;
    const ns_http_route *routes = ns_api_routes(&n_routes);
    ns_error err = {0};
    if (ns_server_start(&o.http, routes, n_routes, api, &srv, &err) != NS_OK) {
        fprintf(stderr, "nightshift serve: %s\n", err.msg);
        goto out;
    }
    api->server = srv;
    NS_INFO("serve: listening on http://%s:%d (model %s)", o.http.host, ns_server_port(srv), name);
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
    double deadline = mono_s() + o.shutdown_timeout_s;
    while (ns_server_active(srv) > 0 && mono_s() < deadline) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        int s = sigtimedwait(&sigs, NULL, &ts);
        if (s == SIGINT || s == SIGTERM) {
            NS_INFO("serve: second signal: cancelling running requests");
            break;
        }
    }
    pthread_join(th, NULL);
    th_started = false;
    if (L->sched) ns_sched_stop(L->sched); /* remaining requests end as cancelled */
    /* let the cancelled ones write their last event before sockets close */
    deadline = mono_s() + 3.0;
    while (ns_server_active(srv) > 0 && mono_s() < deadline) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ns_server_stop(srv); /* joins the connection threads */
    srv = NULL;
    rc = load_failed ? 1 : 0;
    NS_INFO("serve: stopped");
out:
    if (th_started) pthread_join(th, NULL);
    if (srv) ns_server_stop(srv);
    if (L) {
        ns_sched_free(L->sched);
        ns_template_free(L->tmpl);
        ns_tokenizer_free(L->tok);
        ns_cli_engine_close(&L->ce);
    }
    free(L);
    free(api);
    sigaction(SIGPIPE, &old_pipe, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
