/* fuzz_http_body — request bodies through every endpoint handler of the
 * API, without a socket: the real body parsing, parameter validation, chat
 * template rendering, tokenization, and the output pipeline (streaming
 * detokenizer, stop strings, reasoning and tool-call parsers, SSE and whole
 * responses) -- with a scripted engine in place of the scheduler, as in
 * tests/unit/api/api_fixture.h: the fake ns_sched_submit pushes the
 * tokens of a "model output" taken from the input, synchronously.
 *
 * Input: byte 0 picks the endpoint (% N_EP), the model (bit 4: tiny-qwen3
 * with its Hermes/<think> template, or tiny-llama3 with Llama 3 JSON tool
 * calls) and how the scripted output ends (bit 5: EOS, else max_tokens /
 * LENGTH); bits 6-7 pick the API state (mostly READY). Then the body, up to
 * the first NUL; after it, the model output text (tokenized with the
 * model's tokenizer; special tokens such as <tool_call> or <think> are
 * recognized).
 *
 * Oracles: every response is a body (valid JSON for application/json), an
 * error in the one error shape (status 4xx/5xx, a message), or a stream
 * that ends within a bounded number of next() calls; ns_log_escape of the
 * body leaves no control byte. ASan/UBSan/LSan catch the rest. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "api/api.h"
#include "fuzz_common.h"
#include "model/model.h"
#include "sched/sched_internal.h"
#include "sched/sched_status.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---------- scripted engine (the API links only these ns_sched_*) ---------- */

static const int32_t *g_out_ids;
static size_t g_out_n;
static bool g_out_eos;
static int32_t g_eos_id;

ns_status ns_sched_submit(ns_sched *s, ns_request *r, ns_capacity *cap, ns_error *err) {
    (void)s, (void)cap, (void)err;
    atomic_fetch_add(&r->refs, 1); /* the engine's */
    pthread_mutex_lock(&r->mu);
    r->result.n_prompt = r->n_prompt;
    r->result.n_cached = r->n_prompt / 2;
    pthread_mutex_unlock(&r->mu);
    int32_t max = r->params.max_tokens > 0 ? r->params.max_tokens : 1 << 30;
    int32_t n = 0;
    ns_finish fin = NS_FINISH_LENGTH;
    for (size_t i = 0; i <= g_out_n; i++) {
        if (n >= max) break;
        int32_t id;
        if (i < g_out_n) id = g_out_ids[i];
        else if (g_out_eos && g_eos_id >= 0) id = g_eos_id;
        else break;
        if (atomic_load(&r->cancel)) {
            fin = NS_FINISH_CANCELLED;
            break;
        }
        ns_token_event ev = {.token = id, .logprob = -0.25f * (float)(i % 7)};
        if (r->params.logprobs) {
            ev.n_top = r->params.top_logprobs > 0 ? r->params.top_logprobs : 1;
            if (ev.n_top > NS_MAX_TOP_LOGPROBS) ev.n_top = NS_MAX_TOP_LOGPROBS;
            for (int k = 0; k < ev.n_top; k++) {
                ev.top_ids[k] = (id + k) % 1000;
                ev.top_logprobs[k] = -0.5f * (float)k;
            }
        }
        FUZZ_CHECK(ns_request_push(r, &ev) == NS_OK);
        n++;
        if (i == g_out_n) {
            fin = NS_FINISH_EOS;
            break;
        }
    }
    pthread_mutex_lock(&r->mu);
    r->result.n_generated = n;
    pthread_mutex_unlock(&r->mu);
    ns_request_finish(r, fin, NULL);
    ns_request_release(r);
    return NS_OK;
}

void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out) {
    (void)s;
    memset(out, 0, sizeof *out);
}

ns_status ns_sched_flush(ns_sched *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err) {
    (void)s, (void)timeout_ms, (void)out;
    return ns_fail(err, NS_ERR_UNSUPPORTED, "no SSD tier in the fuzzer");
}

void ns_sched_get_capacity(ns_sched *s, ns_sched_capacity *out) {
    (void)s;
    memset(out, 0, sizeof *out);
}

/* GET /v1/status (status.c) reads the engine's published snapshot: an
 * empty one here (the engine never publishes). Every ns_sched_* the API
 * links must be faked, or the linker pulls in the real sched.o and its
 * ns_sched_submit collides with the fake. */
ns_sched_status *ns_sched_status_of(struct ns_sched *s) {
    (void)s;
    static ns_sched_status *st;
    if (!st) st = ns_sched_status_new(); /* lives as long as the fuzzer */
    FUZZ_CHECK(st != NULL);
    return st;
}

/* ---------- fixture ---------- */

typedef struct model_api {
    ns_api api;
    ns_tokenizer *tok;
    ns_template *tmpl;
} model_api;

static model_api g_m[2];
static const ns_http_route *g_routes;
static int g_n_routes;

static uint64_t fixed_seed(void) { return 42; }

static void load_model(model_api *m, const char *name) {
    const char *dir = fuzz_model_dir(name);
    ns_error err = {0};
    ns_api_init(&m->api, name);
    if (ns_tokenizer_load(dir, &m->tok, &err) != NS_OK) goto fail;
    const char *src = ns_tokenizer_chat_template(m->tok, NULL);
    if (!src || ns_template_parse(src, strlen(src), &m->tmpl, &err) != NS_OK) goto fail;
    if (ns_config_load(dir, &m->api.cfg, &err) != NS_OK) goto fail;
    m->api.tok = m->tok;
    m->api.tmpl = m->tmpl;
    m->api.tmpl_src = src;
    m->api.tmpl_wants_string_args = strstr(src, "arguments is string") || strstr(src, "arguments is not string");
    m->api.toolfmt = strstr(src, "<tool_call>") ? NS_TOOLFMT_HERMES : NS_TOOLFMT_LLAMA_JSON;
    m->api.reasoning = strstr(src, "<think>") != NULL;
    m->api.sched = (ns_sched *)m; /* never dereferenced by the fakes */
    m->api.random_seed = fixed_seed;
    snprintf(m->api.fingerprint, sizeof m->api.fingerprint, "fp_fuzz");
    atomic_store(&m->api.state, NS_API_READY);
    return;
fail:
    fprintf(stderr, "fuzz_http_body: %s: %s\n", name, err.msg);
    exit(1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    load_model(&g_m[0], "tiny-qwen3");
    load_model(&g_m[1], "tiny-llama3");
    g_routes = ns_api_routes(&g_n_routes);
    return 0;
}

/* ---------- one request ---------- */

/* A finished SSE body: events separated by a blank line, each a comment
 * (": ...") or "data: " + one JSON object, the last one "data: [DONE]". */
static void check_sse(const char *s, size_t n) {
    const char *p = s, *end = s + n;
    bool done = false;
    while (p < end) {
        const char *e = memmem(p, (size_t)(end - p), "\n\n", 2);
        FUZZ_CHECK(e != NULL); /* every event is terminated */
        FUZZ_CHECK(!done);     /* nothing after [DONE] */
        if (*p == ':') {
            /* a keep-alive comment */
        } else {
            FUZZ_CHECK(e - p >= 6 && memcmp(p, "data: ", 6) == 0);
            if (e - p == 12 && memcmp(p + 6, "[DONE]", 6) == 0) {
                done = true;
            } else {
                json_error_t je;
                json_t *v = json_loadb(p + 6, (size_t)(e - p - 6), JSON_ALLOW_NUL, &je);
                /* (jansson cannot read a key holding U+0000, such as a
                 * top_logprobs entry for a NUL token: valid JSON all the same) */
                if (!v && !strstr(je.text, "NUL byte in object key")) {
                    fprintf(stderr, "bad SSE event (%s): %.*s\n", je.text, (int)(e - p), p);
                    FUZZ_CHECK(0);
                }
                FUZZ_CHECK(!v || json_is_object(v));
                json_decref(v);
            }
        }
        p = e + 2;
    }
    FUZZ_CHECK(done);
}

static void check_response(ns_http_response *resp) {
    if (resp->err.status) {
        FUZZ_CHECK(resp->err.status >= 400 && resp->err.status < 600);
        FUZZ_CHECK(resp->err.message[0] != 0);
        size_t len = 0;
        char *j = ns_http_error_json(&resp->err, &len);
        FUZZ_CHECK(j != NULL);
        json_error_t je;
        json_t *v = json_loadb(j, len, JSON_ALLOW_NUL, &je);
        FUZZ_CHECK(v != NULL && json_is_object(json_object_get(v, "error")));
        json_decref(v);
        free(j);
    } else if (resp->stream.next) {
        ns_buf out;
        ns_buf_init(&out, 0);
        bool eof = false, failed = false;
        for (int i = 0; i < 100000 && !eof; i++) {
            if (resp->stream.next(resp->stream.ctx, &out, &eof) != NS_OK) {
                failed = true;
                break;
            }
        }
        FUZZ_CHECK(eof || failed);
        resp->stream.close(resp->stream.ctx, eof);
        if (eof) check_sse(out.data ? out.data : "", out.len);
        ns_buf_free(&out);
    } else if (resp->body) {
        const char *ct = resp->content_type ? resp->content_type : "application/json";
        if (strcmp(ct, "application/json") == 0) {
            json_error_t je;
            /* JSON_ALLOW_NUL: model output may hold U+0000 (as \u0000) */
            json_t *v = json_loadb(resp->body, resp->body_len, JSON_ALLOW_NUL, &je);
            if (!v && !strstr(je.text, "NUL byte in object key")) {
                fprintf(stderr, "not JSON (%s): %.*s\n", je.text, (int)resp->body_len, resp->body);
                FUZZ_CHECK(0);
            }
            json_decref(v);
        }
    }
    free(resp->body);
    ns_http_error_clear(&resp->err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    model_api *m = &g_m[(sel >> 4) & 1];
    const ns_http_route *route = &g_routes[(sel & 15) % g_n_routes];
    static const int states[4] = {NS_API_READY, NS_API_READY, NS_API_READY, NS_API_DRAINING};
    atomic_store(&m->api.state, states[sel >> 6]);

    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(p, 0, n);
    size_t body_len = nul ? (size_t)(nul - p) : n;
    char *body = malloc(body_len + 1);
    FUZZ_CHECK(body != NULL);
    memcpy(body, p, body_len);
    body[body_len] = 0;

    /* the scripted model output */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (nul) {
        ns_error err = {0};
        if (ns_tokenizer_encode(m->tok, nul + 1, n - body_len - 1, false, &ids, &n_ids, &err) != NS_OK) n_ids = 0;
        if (n_ids > 512) n_ids = 512;
    }
    g_out_ids = ids;
    g_out_n = n_ids;
    g_out_eos = sel & 32;
    g_eos_id = m->api.cfg.n_eos > 0 ? m->api.cfg.eos_token_ids[0] : ns_tokenizer_eos_id(m->tok);

    /* what the log would write of it: one line, no control byte */
    char *esc = malloc(4 * body_len + 1);
    FUZZ_CHECK(esc != NULL);
    FUZZ_CHECK(ns_log_escape(body, body_len, esc, 4 * body_len + 1) == body_len);
    for (const char *q = esc; *q; q++) FUZZ_CHECK((unsigned char)*q >= 0x20 && *q != 0x7f);
    free(esc);

    ns_http_request req = {
        .method = route->method,
        .path = route->path,
        .body = body,
        .body_len = body_len,
        .conn = {.mc = NULL, .fd = -1},
    };
    ns_http_response resp;
    memset(&resp, 0, sizeof resp);
    route->fn(&m->api, &req, &resp);
    check_response(&resp);

    free(ids);
    free(body);
    return 0;
}
