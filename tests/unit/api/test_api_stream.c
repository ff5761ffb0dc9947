/* test_api_stream.c — the HTTP API end to end over a real socket, with the
 * real tokenizer and chat template of tiny-qwen3 but a scripted engine: a
 * fake ns_sched_submit (test code only) pushes the tokens of a chosen model
 * output through the real request channel. This exercises what a random-
 * weight model never produces: streamed tool calls (id and name first,
 * then arguments incrementally), reasoning_content, malformed calls coming
 * back as content, stop strings, and cancellation on client disconnect. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

static void *engine_main(void *arg) {
    ns_request *r = arg;
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

ns_status ns_sched_submit(ns_sched *s, ns_request *r, ns_capacity *cap, ns_error *err) {
    (void)s;
    (void)cap;
    (void)err;
    atomic_fetch_add(&r->refs, 2); /* the engine's, and the test's g_last */
    if (g_last) ns_request_release(g_last);
    g_last = r;
    pthread_mutex_lock(&r->mu);
    r->result.n_cached = 3;
    pthread_mutex_unlock(&r->mu);
    pthread_create(&g_threads[g_n_threads++], NULL, engine_main, r);
    return NS_OK;
}

void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out) {
    (void)s;
    memset(out, 0, sizeof *out);
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

/* GET /v1/status (status.c) reads the engine's published snapshot. */
ns_sched_status *ns_sched_status_of(struct ns_sched *s) {
    (void)s;
    return NULL;
}

static void join_engines(void) {
    for (int i = 0; i < g_n_threads; i++) pthread_join(g_threads[i], NULL);
    g_n_threads = 0;
}

/* ---------- fixture: api + server ---------- */

static ns_api g_api;
static ns_server *g_srv;
static int g_port;

static void script_text(const char *text, ns_finish fin) {
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

static uint64_t fixed_seed(void) { return 7; }

static bool setup(void) {
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

static void teardown(void) {
    ns_server_stop(g_srv);
    join_engines();
    if (g_last) ns_request_release(g_last);
    g_last = NULL;
    ns_template_free(g_api.tmpl);
    ns_tokenizer_free(g_api.tok);
}

/* ---------- a minimal HTTP/1.0 client ---------- */

static int connect_server(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void send_request(int fd, const char *method, const char *path, const char *body) {
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
static int http(const char *method, const char *path, const char *body, ns_buf *out) {
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

/* Parses an SSE body into an array of JSON events (the [DONE] marker sets
 * *done). */
static json_t *sse_events(const char *body, bool *done) {
    json_t *arr = json_array();
    *done = false;
    const char *p = body;
    while (p && *p) {
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (strncmp(p, "data: ", 6) == 0) {
            if (strncmp(p + 6, "[DONE]", 6) == 0) *done = true;
            else {
                json_error_t je;
                json_t *j = json_loadb(p + 6, (size_t)(e - p - 6), 0, &je);
                if (j) json_array_append_new(arr, j);
            }
        }
        p = e + 2;
    }
    return arr;
}

static const char *TOOLS =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"parameters\":{\"type\":\"object\"}}}]";

/* Accumulated view of a chat stream. */
typedef struct {
    char reasoning[4096], content[4096], name[256], args[4096], id[64], finish[32];
    int n_name_deltas, n_args_deltas, n_chunks;
    bool done, role_first, usage_last;
} stream_view;

static void view_stream(const char *body, stream_view *v) {
    memset(v, 0, sizeof *v);
    json_t *ev = sse_events(body, &v->done);
    size_t i;
    json_t *c;
    v->n_chunks = (int)json_array_size(ev);
    json_array_foreach(ev, i, c) {
        json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        if (!ch) {
            v->usage_last = i + 1 == json_array_size(ev) && json_is_object(json_object_get(c, "usage"));
            continue;
        }
        json_t *d = json_object_get(ch, "delta");
        if (i == 0) v->role_first = json_is_string(json_object_get(d, "role"));
        const char *s;
        if ((s = json_string_value(json_object_get(d, "reasoning_content"))))
            strncat(v->reasoning, s, sizeof v->reasoning - strlen(v->reasoning) - 1);
        if ((s = json_string_value(json_object_get(d, "content"))))
            strncat(v->content, s, sizeof v->content - strlen(v->content) - 1);
        json_t *tc = json_array_get(json_object_get(d, "tool_calls"), 0);
        if (tc) {
            json_t *fn = json_object_get(tc, "function");
            if ((s = json_string_value(json_object_get(fn, "name")))) {
                v->n_name_deltas++;
                snprintf(v->name, sizeof v->name, "%s", s);
                snprintf(v->id, sizeof v->id, "%s", json_string_value(json_object_get(tc, "id")));
                /* the name comes before any argument text */
                if (v->args[0]) v->n_name_deltas += 100;
            }
            if ((s = json_string_value(json_object_get(fn, "arguments"))) && *s) {
                v->n_args_deltas++;
                strncat(v->args, s, sizeof v->args - strlen(v->args) - 1);
            }
        }
        if ((s = json_string_value(json_object_get(ch, "finish_reason")))) snprintf(v->finish, sizeof v->finish, "%s", s);
    }
    json_decref(ev);
}

static const char *MODEL_OUT =
    "<think>\nThe user wants main.c.\nI should read it.\n</think>\n\nLet me look.\n<tool_call>\n"
    "{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.c\", \"lines\": [1, 2, 3]}}\n</tool_call>";

TEST(stream_tool_call_and_reasoning) {
    script_text(MODEL_OUT, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"show main.c\"}],%s,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", body, &out), 200);
    stream_view v;
    view_stream(out.data ? out.data : "", &v);
    CHECK(v.done);
    CHECK(v.role_first);
    CHECK(v.usage_last);
    CHECK_EQ_STR(v.reasoning, "The user wants main.c.\nI should read it.");
    CHECK_EQ_STR(v.content, "Let me look.");
    CHECK_EQ_STR(v.name, "read_file");
    CHECK_EQ_INT(v.n_name_deltas, 1);
    CHECK(strncmp(v.id, "call_", 5) == 0);
    CHECK_EQ_STR(v.args, "{\"path\": \"src/main.c\", \"lines\": [1, 2, 3]}");
    CHECKF(v.n_args_deltas > 1, "arguments should stream in pieces (%d)", v.n_args_deltas);
    CHECK_EQ_STR(v.finish, "tool_calls");
    ns_buf_free(&out);
}

TEST(whole_tool_call_and_reasoning) {
    script_text(MODEL_OUT, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"show main.c\"}],%s}", TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", body, &out), 200);
    json_error_t je;
    json_t *j = json_loads(out.data ? out.data : "", 0, &je);
    CHECK(j != NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *m = json_object_get(ch, "message");
    CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
    CHECK_EQ_STR(json_string_value(json_object_get(m, "content")), "Let me look.");
    CHECK_EQ_STR(json_string_value(json_object_get(m, "reasoning_content")), "The user wants main.c.\nI should read it.");
    json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 0);
    CHECK(strncmp(json_string_value(json_object_get(tc, "id")) ?: "", "call_", 5) == 0);
    CHECK_EQ_STR(json_string_value(json_object_get(tc, "type")), "function");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "read_file");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")),
                 "{\"path\": \"src/main.c\", \"lines\": [1, 2, 3]}");
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), g_script_n);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")), 3);
    json_decref(j);
    ns_buf_free(&out);
}

TEST(malformed_tool_call_is_content) {
    const char *bad = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": ";
    script_text(bad, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", body, &out), 200);
    json_t *j = json_loads(out.data ? out.data : "", 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *m = json_object_get(ch, "message");
    CHECK_EQ_STR(json_string_value(json_object_get(m, "content")), bad);
    CHECK(json_object_get(m, "tool_calls") == NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);
    /* an unknown tool: plain content, streaming too */
    const char *unk = "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>";
    script_text(unk, NS_FINISH_EOS);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"stream\":true}", TOOLS);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", body, &out), 200);
    stream_view v;
    view_stream(out.data ? out.data : "", &v);
    CHECK_EQ_STR(v.content, unk);
    CHECK_EQ_INT(v.n_name_deltas, 0);
    CHECK_EQ_STR(v.finish, "stop");
    /* without tools in the request, tags are just text */
    script_text(MODEL_OUT, NS_FINISH_LENGTH);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &out), 200);
    j = json_loads(out.data ? out.data : "", 0, NULL);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(strstr(json_string_value(json_object_get(json_object_get(ch, "message"), "content")) ?: "", "<tool_call>"));
    CHECK_EQ_STR(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_decref(j);
    ns_buf_free(&out);
}

TEST(stop_string_cancels) {
    script_text("Hello world, STOP here and more text that never shows", NS_FINISH_LENGTH);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"OP h\"],\"stream\":true}", &out),
                 200);
    stream_view v;
    view_stream(out.data ? out.data : "", &v);
    CHECK_EQ_STR(v.content, "Hello world, ST");
    CHECK_EQ_STR(v.finish, "stop");
    CHECK(g_last && atomic_load(&g_last->cancel));
    ns_buf_free(&out);
}

TEST(client_disconnect_cancels) {
    g_script_n = 0;
    for (int i = 0; i < 3000; i++) g_script[g_script_n++] = 64; /* 'a' */
    g_script_finish = NS_FINISH_LENGTH;
    int before = atomic_load(&g_cancelled_seen);
    int fd = connect_server();
    CHECK(fd >= 0);
    send_request(fd, "POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}");
    char buf[256];
    CHECK(read(fd, buf, sizeof buf) > 0); /* the stream started */
    close(fd);
    for (int i = 0; i < 300 && atomic_load(&g_cancelled_seen) == before; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(atomic_load(&g_cancelled_seen) > before);
    /* non-streaming too */
    before = atomic_load(&g_cancelled_seen);
    fd = connect_server();
    send_request(fd, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"y\"}]}");
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    close(fd);
    for (int i = 0; i < 300 && atomic_load(&g_cancelled_seen) == before; i++) {
        struct timespec t2 = {0, 10 * 1000 * 1000};
        nanosleep(&t2, NULL);
    }
    CHECK(atomic_load(&g_cancelled_seen) > before);
}

TEST(llama_json_tool_calls) {
    g_api.toolfmt = NS_TOOLFMT_LLAMA_JSON;
    script_text("{\"name\": \"read_file\", \"parameters\": {\"path\": \"a.c\"}}", NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s,\"stream\":true}", TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", body, &out), 200);
    stream_view v;
    view_stream(out.data ? out.data : "", &v);
    CHECK_EQ_STR(v.name, "read_file");
    CHECK_EQ_STR(v.args, "{\"path\": \"a.c\"}");
    CHECK_EQ_STR(v.content, "");
    CHECK_EQ_STR(v.finish, "tool_calls");
    g_api.toolfmt = NS_TOOLFMT_HERMES;
    ns_buf_free(&out);
}

TEST(params_reach_the_request) {
    script_text("ok", NS_FINISH_EOS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":99,\"temperature\":0.5,"
                      "\"top_p\":0.9,\"top_k\":40,\"max_completion_tokens\":17,\"logprobs\":true,\"top_logprobs\":1}",
                      &out),
                 200);
    CHECK(g_last != NULL);
    if (g_last) {
        CHECK_EQ_INT(g_last->params.sampling.seed, 99);
        CHECK_NEAR(g_last->params.sampling.temperature, 0.5, 1e-6);
        CHECK_NEAR(g_last->params.sampling.top_p, 0.9, 1e-6);
        CHECK_EQ_INT(g_last->params.sampling.top_k, 40);
        CHECK_EQ_INT(g_last->params.max_tokens, 17);
        CHECK(g_last->params.logprobs);
        CHECK_EQ_INT(g_last->params.top_logprobs, 1);
    }
    json_t *j = json_loads(out.data ? out.data : "", 0, NULL);
    json_t *lp = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    CHECK_EQ_INT(json_array_size(lp), g_script_n);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(lp, 0), "token")), "ok");
    json_decref(j);
    /* without a seed the server picks one (here the fixture's) */
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":3}", &out), 200);
    if (g_last) CHECK_EQ_INT(g_last->params.sampling.seed, 7);
    ns_buf_free(&out);
}

TEST(routing_and_limits) {
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("GET", "/nope", NULL, &out), 404);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("DELETE", "/v1/models", NULL, &out), 405);
    ns_buf_reset(&out);
    char *big = malloc(70000);
    memset(big, ' ', 69999);
    big[0] = '{';
    big[69998] = '}';
    big[69999] = 0;
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", big, &out), 413);
    CHECK(strstr(out.data ? out.data : "", "body_too_large") != NULL);
    free(big);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("GET", "/health", NULL, &out), 200);
    ns_buf_free(&out);
}

TEST(health_and_loading) {
    ns_buf out;
    ns_buf_init(&out, 0);
    atomic_store(&g_api.state, NS_API_LOADING);
    CHECK_EQ_INT(http("GET", "/health", NULL, &out), 503);
    CHECK(strstr(out.data ? out.data : "", "loading") != NULL);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &out),
                 503);
    json_t *j = json_loads(out.data ? out.data : "", 0, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")), "model_loading");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "server_error");
    json_decref(j);
    atomic_store(&g_api.state, NS_API_READY);
    ns_buf_reset(&out);
    CHECK_EQ_INT(http("GET", "/health", NULL, &out), 200);
    CHECK_EQ_STR(out.data, "{\"status\":\"ok\"}");
    ns_buf_free(&out);
}

int main(void) {
    if (!setup()) {
        printf("not ok - setup\n");
        return 1;
    }
    RUN(stream_tool_call_and_reasoning);
    RUN(whole_tool_call_and_reasoning);
    RUN(malformed_tool_call_is_content);
    RUN(stop_string_cancels);
    RUN(client_disconnect_cancels);
    RUN(llama_json_tool_calls);
    RUN(params_reach_the_request);
    RUN(routing_and_limits);
    RUN(health_and_loading);
    teardown();
    TEST_MAIN_END;
}
