/* test_api_stream.c — the HTTP API end to end over a real socket, with the
 * real tokenizer and chat template of tiny-qwen3 but a scripted engine
 * (api_fixture.h: a fake ns_sched_submit pushes the tokens of a chosen
 * model output through the real request channel). This exercises what a random-
 * weight model never produces: streamed tool calls (id and name first,
 * then arguments incrementally), reasoning_content, malformed calls coming
 * back as content, stop strings, and cancellation on client disconnect. */
#include "api_fixture.h"

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
    /* non-streaming too, on HTTP/1.1: there the server can tell a closed
     * client from a half-closed one (an interim 100 Continue draws a reset
     * from a closed socket); an HTTP/1.0 client's end of stream is taken
     * for a half-close and its answer is still written */
    before = atomic_load(&g_cancelled_seen);
    fd = connect_server();
    static const char req11[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: 44\r\n\r\n{\"messages\":[{\"role\":\"user\",\"content\":\"y\"}]}";
    CHECK(write(fd, req11, sizeof req11 - 1) == (ssize_t)(sizeof req11 - 1));
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
