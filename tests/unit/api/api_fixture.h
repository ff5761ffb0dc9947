/* api_fixture.h — the fixture of the API tests that run the real HTTP
 * server, the real tokenizer and the real chat template of tiny-qwen3 over
 * a real socket, but a scripted engine (test_api_stream.c,
 * test_api_events.c; each test binary includes it once).
 *
 * A fake ns_sched_submit (test code only) admits the request at once, as
 * the real engine would after its prefix lookup (n_cached 3, admitted), and
 * a thread pushes the tokens of a chosen model output (g_script, set with
 * script_text) through the real request channel, one a millisecond,
 * stopping at a cancel. While the gate is held (gate_set) the engine
 * pushes nothing, as during a long prefill. g_next, when set, is the
 * script of the next submission (a continuation request). Every ns_sched_*
 * the API links is faked here, or the linker would pull in the real
 * sched.o and the two ns_sched_submit would collide.
 *
 * Ownership: g_last holds a reference to the last submitted request
 * (released by the next submission and by teardown); setup() starts the
 * server and teardown() stops it, joins the engine threads and frees the
 * tokenizer and template.
 */
#ifndef NS_TEST_API_FIXTURE_H
#define NS_TEST_API_FIXTURE_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "sched/sched_internal.h"
#include "sched/sched_status.h"
#include "template/template.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---------- scripted engine ---------- */

static int32_t g_script[4096];
static int g_script_n;
static ns_finish g_script_finish = NS_FINISH_EOS;
static ns_request *g_last;          /* last submitted request (a reference) */
static pthread_t g_threads[64];
static int g_n_threads;
static atomic_int g_cancelled_seen;

/* The gate: while g_hold is set, the engine has admitted the request (its
 * prefix reuse is set) but pushes no token, as during a long prefill. */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static bool g_hold;

static inline void gate_set(bool hold) {
    pthread_mutex_lock(&g_gate_mu);
    g_hold = hold;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

static void *engine_main(void *arg) {
    ns_request *r = arg;
    pthread_mutex_lock(&g_gate_mu);
    while (g_hold) pthread_cond_wait(&g_gate_cv, &g_gate_mu);
    pthread_mutex_unlock(&g_gate_mu);
    int n = g_script_n;
    ns_finish fin = g_script_finish;
    for (int i = 0; i < n; i++) {
        if (atomic_load(&r->cancel)) {
            atomic_fetch_add(&g_cancelled_seen, 1);
            ns_request_finish(r, NS_FINISH_CANCELLED, NULL);
            ns_request_release(r);
            return NULL;
        }
        ns_token_event ev = {.token = g_script[i], .logprob = -0.5f};
        if (r->params.logprobs) {
            ev.n_top = 1;
            ev.top_ids[0] = g_script[i];
            ev.top_logprobs[0] = -0.5f;
        }
        ns_request_push(r, &ev);
        pthread_mutex_lock(&r->mu);
        r->result.n_generated = i + 1;
        pthread_mutex_unlock(&r->mu);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ns_request_finish(r, fin, NULL);
    ns_request_release(r);
    return NULL;
}

/* The script of the next submission when set (a continuation request):
 * the previous engine thread has finished reading g_script by then. */
static int32_t g_next[256];
static int g_next_n = -1;
static int32_t g_submitted_n_prompt[4];
static int g_submits;

ns_status ns_sched_submit(ns_sched *s, ns_request *r, ns_capacity *cap, ns_error *err) {
    (void)s;
    (void)cap;
    (void)err;
    if (g_submits < 4) g_submitted_n_prompt[g_submits] = r->n_prompt;
    if (g_submits++ > 0 && g_next_n >= 0) {
        memcpy(g_script, g_next, (size_t)g_next_n * sizeof *g_script);
        g_script_n = g_next_n;
        g_next_n = -1;
    }
    atomic_fetch_add(&r->refs, 2); /* the engine's, and the test's g_last */
    if (g_last) ns_request_release(g_last);
    g_last = r;
    pthread_mutex_lock(&r->mu);
    r->result.n_cached = 3; /* as the real engine at admission */
    r->result.admitted = true;
    pthread_mutex_unlock(&r->mu);
    pthread_create(&g_threads[g_n_threads++], NULL, engine_main, r);
    return NS_OK;
}

void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out) {
    (void)s;
    memset(out, 0, sizeof *out);
    out->page_tokens = 16; /* cache_creation_input_tokens counts whole pages */
}

ns_sched_status *ns_sched_status_of(struct ns_sched *s) {
    (void)s;
    return NULL;
}

/* Every ns_sched_* the API links must be faked here, or the linker pulls
 * in the real sched.o and the two ns_sched_submit collide. */
ns_status ns_sched_flush(ns_sched *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err) {
    (void)s;
    (void)timeout_ms;
    (void)out;
    return ns_fail(err, NS_ERR_UNSUPPORTED, "no SSD tier in this test");
}

void ns_sched_get_capacity(ns_sched *s, ns_sched_capacity *out) {
    (void)s;
    memset(out, 0, sizeof *out);
}

static inline void join_engines(void) {
    for (int i = 0; i < g_n_threads; i++) pthread_join(g_threads[i], NULL);
    g_n_threads = 0;
}

/* ---------- fixture: api + server ---------- */

static ns_api g_api;
static ns_server *g_srv;
static int g_port;

static inline void script_text(const char *text, ns_finish fin) {
    int32_t *ids = NULL;
    size_t n = 0;
    ns_error err;
    if (ns_tokenizer_encode(g_api.tok, text, strlen(text), false, &ids, &n, &err) != NS_OK) n = 0;
    g_script_n = 0;
    for (size_t i = 0; i < n && g_script_n < 4000; i++) g_script[g_script_n++] = ids[i];
    if (fin == NS_FINISH_EOS) g_script[g_script_n++] = 151645; /* <|im_end|> */
    g_script_finish = fin;
    free(ids);
}

static inline uint64_t fixed_seed(void) { return 7; }

static inline bool setup(void) {
    const char *dir = test_shared_path("models/tiny-qwen3");
    char dirc[4096];
    snprintf(dirc, sizeof dirc, "%s", dir);
    ns_error err = {0};
    ns_api_init(&g_api, "tiny-qwen3");
    ns_tokenizer *tok;
    if (ns_tokenizer_load(dirc, &tok, &err) != NS_OK) {
        printf("# tokenizer: %s\n", err.msg);
        return false;
    }
    g_api.tok = tok;
    const char *src = ns_tokenizer_chat_template(tok, NULL);
    ns_template *t;
    if (!src || ns_template_parse(src, strlen(src), &t, &err) != NS_OK) {
        printf("# template: %s\n", err.msg);
        return false;
    }
    g_api.tmpl = t;
    g_api.tmpl_src = src;
    g_api.tmpl_wants_string_args = true;
    g_api.toolfmt = NS_TOOLFMT_HERMES;
    g_api.reasoning = true;
    g_api.sched = (ns_sched *)&g_api; /* never dereferenced by the fake */
    g_api.random_seed = fixed_seed;
    snprintf(g_api.fingerprint, sizeof g_api.fingerprint, "fp_test");
    if (ns_config_load(dirc, &g_api.cfg, &err) != NS_OK) {
        printf("# config: %s\n", err.msg);
        return false;
    }
    atomic_store(&g_api.state, NS_API_READY);
    int n;
    const ns_http_route *routes = ns_api_routes(&n);
    ns_server_opts o = {.host = "127.0.0.1", .port = 0, .max_body_bytes = 65536, .api_key = NULL};
    if (ns_server_start(&o, routes, n, &g_api, &g_srv, &err) != NS_OK) {
        printf("# server: %s\n", err.msg);
        return false;
    }
    g_api.server = g_srv;
    g_port = ns_server_port(g_srv);
    return true;
}

static inline void teardown(void) {
    ns_server_stop(g_srv);
    join_engines();
    if (g_last) ns_request_release(g_last);
    g_last = NULL;
    ns_template_free(g_api.tmpl);
    ns_tokenizer_free(g_api.tok);
}

/* ---------- a minimal HTTP/1.0 client ---------- */

static inline int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline void send_request(int fd, const char *method, const char *path, const char *body) {
    char head[512];
    size_t bl = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", method,
                     path, bl);
    if (write(fd, head, (size_t)n) != n) return;
    if (bl && write(fd, body, bl) != (ssize_t)bl) return;
}

/* Sends a request, reads the whole response. Returns the status (or -1);
 * body gets the response body. */
static inline int http(const char *method, const char *path, const char *body, ns_buf *out) {
    int fd = connect_server();
    if (fd < 0) return -1;
    send_request(fd, method, path, body);
    ns_buf raw;
    ns_buf_init(&raw, 0);
    char buf[4096];
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) ns_buf_append(&raw, buf, (size_t)r);
    close(fd);
    int status = -1;
    if (raw.data && sscanf(raw.data, "HTTP/1.%*d %d", &status) == 1) {
        char *b = strstr(raw.data, "\r\n\r\n");
        if (b) ns_buf_append(out, b + 4, raw.len - (size_t)(b + 4 - raw.data));
    }
    ns_buf_free(&raw);
    return status;
}

/* Reads fd until want appears in what came (or 10 s pass). */
static inline bool read_until(int fd, ns_buf *got, const char *want) {
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    while (!(got->data && strstr(got->data, want))) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0) return false;
        ns_buf_append(got, buf, (size_t)r);
    }
    return true;
}

#endif
