/* test_api_events.c — the Anthropic Messages and OpenAI Responses streams
 * and whole responses end to end over a real socket, with the real
 * tokenizer and chat template of tiny-qwen3 but a scripted engine
 * (api_fixture.h: a fake ns_sched_submit pushes the tokens of a chosen
 * model output through the real request channel). A random-weight
 * model never writes reasoning or tool calls; the script does, so this
 * checks what the SDK tests cannot: thinking blocks with their signature
 * delta, text and tool_use blocks in order, input_json_delta fragments that
 * add up to the input, stop_sequence, usage counters that add up, and the
 * Responses reasoning / message / function_call / custom_tool_call items
 * with their delta and done events. */
#include "api_fixture.h"

/* ---------- named SSE events ---------- */

/* "event: X\ndata: {...}\n\n" blocks -> [{"event": X, "data": {...}}]
 * (comments skipped); *bad counts blocks that do not parse. */
static json_t *named_events(const char *body, int *bad) {
    json_t *arr = json_array();
    *bad = 0;
    const char *p = body;
    while (p && *p) {
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (*p != ':') {
            const char *d = strstr(p, "\ndata: ");
            json_error_t je;
            json_t *j = d && d < e && strncmp(p, "event: ", 7) == 0 ? json_loadb(d + 7, (size_t)(e - d - 7), 0, &je) : NULL;
            if (j) json_array_append_new(arr, json_pack("{s:s%,s:o}", "event", p + 7, (size_t)(d - p - 7), "data", j));
            else (*bad)++;
        }
        p = e + 2;
    }
    return arr;
}

/* POSTs body to path: the answer must be 200 with named SSE events that
 * all parse. Returns them (the caller decrefs). */
static json_t *post_events(const char *path, const char *body) {
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", path, body, &out), 200);
    int bad = 0;
    json_t *evs = named_events(out.data ? out.data : "", &bad);
    CHECK_EQ_INT(bad, 0);
    ns_buf_free(&out);
    return evs;
}

static const char *ev_name(json_t *ev) { return json_string_value(json_object_get(ev, "event")); }
static json_t *ev_data(json_t *ev) { return json_object_get(ev, "data"); }
static const char *sget(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static long long iget(json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }

static const char *MODEL_OUT =
    "<think>\nThe user wants main.c.\nI should read it.\n</think>\n\nLet me look.\n<tool_call>\n"
    "{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.c\", \"lines\": [1, 2, 3]}}\n</tool_call>";
static const char *ARGS = "{\"path\": \"src/main.c\", \"lines\": [1, 2, 3]}";
static const char *MSG_TOOLS = "\"tools\":[{\"name\":\"read_file\",\"input_schema\":{\"type\":\"object\"}}]";

/* ---------- Anthropic ---------- */

TEST(messages_stream_blocks) {
    script_text(MODEL_OUT, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":200,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"show "
             "main.c\"}],%s}",
             MSG_TOOLS);
    json_t *evs = post_events("/v1/messages?beta=true", body);
    /* the sequence, with deltas folded */
    char seq[2048] = "";
    char thinking[512] = "", text[512] = "", args[512] = "", sig[128] = "", name[64] = "";
    int open = -1, n_args = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        const char *n = ev_name(ev);
        json_t *d = ev_data(ev);
        CHECK_EQ_STR(sget(d, "type"), n);
        if (strcmp(n, "content_block_delta") == 0) {
            json_t *dl = json_object_get(d, "delta");
            const char *t = sget(dl, "type");
            CHECK_EQ_INT(iget(d, "index"), open);
            if (!strcmp(t, "thinking_delta")) strncat(thinking, sget(dl, "thinking"), sizeof thinking - strlen(thinking) - 1);
            else if (!strcmp(t, "text_delta")) strncat(text, sget(dl, "text"), sizeof text - strlen(text) - 1);
            else if (!strcmp(t, "input_json_delta")) {
                strncat(args, sget(dl, "partial_json"), sizeof args - strlen(args) - 1);
                n_args++;
            } else if (!strcmp(t, "signature_delta")) {
                snprintf(sig, sizeof sig, "%s", sget(dl, "signature"));
                strncat(seq, "sig,", sizeof seq - strlen(seq) - 1);
            }
            continue;
        }
        if (strcmp(n, "content_block_start") == 0) {
            json_t *b = json_object_get(d, "content_block");
            open = (int)iget(d, "index");
            strncat(seq, sget(b, "type"), sizeof seq - strlen(seq) - 1);
            strncat(seq, "(", sizeof seq - strlen(seq) - 1);
            if (sget(b, "name")) snprintf(name, sizeof name, "%s", sget(b, "name"));
            if (sget(b, "id")) CHECK(strncmp(sget(b, "id"), "call_", 5) == 0);
            continue;
        }
        if (strcmp(n, "content_block_stop") == 0) {
            CHECK_EQ_INT(iget(d, "index"), open);
            strncat(seq, "),", sizeof seq - strlen(seq) - 1);
            continue;
        }
        if (strcmp(n, "message_delta") == 0) {
            json_t *u = json_object_get(d, "usage");
            CHECK_EQ_STR(sget(json_object_get(d, "delta"), "stop_reason"), "tool_use");
            CHECK(json_is_null(json_object_get(json_object_get(d, "delta"), "stop_sequence")));
            CHECK_EQ_INT(iget(u, "output_tokens"), g_script_n);
            CHECK_EQ_INT(iget(u, "cache_read_input_tokens"), 3);
            /* whole pages past the reused 3 tokens are newly committed */
            long long prompt = iget(u, "input_tokens") + iget(u, "cache_read_input_tokens") +
                               iget(u, "cache_creation_input_tokens");
            CHECK_EQ_INT(iget(u, "cache_creation_input_tokens"), prompt / 16 * 16 - 3);
        }
        strncat(seq, n, sizeof seq - strlen(seq) - 1);
        strncat(seq, ",", sizeof seq - strlen(seq) - 1);
    }
    CHECK_EQ_STR(seq, "message_start,ping,thinking(sig,),text(),tool_use(),message_delta,message_stop,");
    CHECK_EQ_STR(thinking, "The user wants main.c.\nI should read it.");
    CHECK(strncmp(sig, "nightshift-", 11) == 0);
    CHECK_EQ_STR(text, "Let me look.");
    CHECK_EQ_STR(name, "read_file");
    CHECK_EQ_STR(args, ARGS);
    CHECKF(n_args > 1, "the input should stream in pieces (%d)", n_args);
    json_decref(evs);
}

TEST(messages_whole_and_stop_sequence) {
    script_text(MODEL_OUT, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":200,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", MSG_TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/messages", body, &out), 200);
    json_error_t je;
    json_t *j = json_loads(out.data ? out.data : "", 0, &je);
    json_t *c = json_object_get(j, "content");
    CHECK_EQ_INT(json_array_size(c), 3);
    CHECK_EQ_STR(sget(json_array_get(c, 0), "type"), "thinking");
    CHECK_EQ_STR(sget(json_array_get(c, 0), "thinking"), "The user wants main.c.\nI should read it.");
    CHECK_EQ_STR(sget(json_array_get(c, 1), "text"), "Let me look.");
    json_t *use = json_array_get(c, 2);
    CHECK_EQ_STR(sget(use, "type"), "tool_use");
    CHECK_EQ_STR(sget(use, "name"), "read_file");
    CHECK_EQ_STR(sget(json_object_get(use, "input"), "path"), "src/main.c");
    CHECK_EQ_STR(sget(j, "stop_reason"), "tool_use");
    json_decref(j);
    ns_buf_reset(&out);
    /* a stop sequence: the text before it, and which one matched */
    script_text("alpha beta STOP gamma", NS_FINISH_EOS);
    CHECK_EQ_INT(http("POST", "/v1/messages",
                      "{\"model\":\"m\",\"max_tokens\":50,\"stop_sequences\":[\"zzz\",\"STOP\",\"ST\"],\"thinking\":{"
                      "\"type\":\"disabled\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      &out),
                 200);
    j = json_loads(out.data ? out.data : "", 0, &je);
    CHECK_EQ_STR(sget(j, "stop_reason"), "stop_sequence");
    CHECK_EQ_STR(sget(j, "stop_sequence"), "ST");
    CHECK_EQ_STR(sget(json_array_get(json_object_get(j, "content"), 0), "text"), "alpha beta ");
    json_decref(j);
    ns_buf_free(&out);
}

TEST(messages_single_call) {
    script_text("<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>\n<tool_call>\n"
                "{\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}\n</tool_call>",
                NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"max_tokens\":200,\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
             "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}",
             MSG_TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/messages", body, &out), 200);
    json_error_t je;
    json_t *j = json_loads(out.data ? out.data : "", 0, &je);
    json_t *c = json_object_get(j, "content");
    CHECK_EQ_INT(json_array_size(c), 1);
    CHECK_EQ_STR(sget(json_object_get(json_array_get(c, 0), "input"), "path"), "a");
    CHECK_EQ_STR(sget(j, "stop_reason"), "tool_use");
    CHECK(iget(json_object_get(j, "usage"), "output_tokens") < g_script_n); /* cut after the first call */
    json_decref(j);
    ns_buf_free(&out);
}

/* ---------- Responses ---------- */

static const char *RESP_TOOLS =
    "\"tools\":[{\"type\":\"function\",\"name\":\"read_file\",\"parameters\":{\"type\":\"object\"}},"
    "{\"type\":\"namespace\",\"name\":\"mcp\",\"description\":\"d\",\"tools\":[{\"type\":\"custom\",\"name\":\"apply_patch\"}]},"
    "{\"type\":\"web_search\"}]";

TEST(responses_stream_items) {
    script_text(MODEL_OUT, NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"input\":\"show main.c\",\"stream\":true,\"include\":[\"reasoning.encrypted_content\"],%s}", RESP_TOOLS);
    json_t *evs = post_events("/v1/responses", body);
    char seq[2048] = "", reasoning[512] = "", text[512] = "", args[512] = "";
    size_t i;
    json_t *ev, *final = NULL;
    json_array_foreach(evs, i, ev) {
        const char *n = ev_name(ev);
        json_t *d = ev_data(ev);
        CHECK_EQ_STR(sget(d, "type"), n);
        CHECK_EQ_INT(iget(d, "sequence_number"), (long long)i);
        if (!strcmp(n, "response.reasoning_text.delta")) strncat(reasoning, sget(d, "delta"), sizeof reasoning - strlen(reasoning) - 1);
        else if (!strcmp(n, "response.output_text.delta")) strncat(text, sget(d, "delta"), sizeof text - strlen(text) - 1);
        else if (!strcmp(n, "response.function_call_arguments.delta")) strncat(args, sget(d, "delta"), sizeof args - strlen(args) - 1);
        else {
            if (!strcmp(n, "response.completed")) final = json_object_get(d, "response");
            if (!strcmp(n, "response.output_item.added") || !strcmp(n, "response.output_item.done")) {
                strncat(seq, n + 21, sizeof seq - strlen(seq) - 1); /* "added" / "done" */
                strncat(seq, ":", sizeof seq - strlen(seq) - 1);
                strncat(seq, sget(json_object_get(d, "item"), "type"), sizeof seq - strlen(seq) - 1);
            } else {
                strncat(seq, n + 9, sizeof seq - strlen(seq) - 1);
            }
            strncat(seq, ",", sizeof seq - strlen(seq) - 1);
        }
    }
    CHECK_EQ_STR(seq, "created,in_progress,added:reasoning,reasoning_text.done,done:reasoning,added:message,"
                      "content_part.added,output_text.done,content_part.done,done:message,added:function_call,"
                      "function_call_arguments.done,done:function_call,completed,");
    CHECK_EQ_STR(reasoning, "The user wants main.c.\nI should read it.");
    CHECK_EQ_STR(text, "Let me look.");
    CHECK_EQ_STR(args, ARGS);
    json_t *o = json_object_get(final, "output");
    CHECK_EQ_INT(json_array_size(o), 3);
    CHECK_EQ_STR(sget(json_array_get(o, 0), "encrypted_content"), "nightshift-reasoning:The user wants main.c.\nI should read it.");
    CHECK_EQ_STR(sget(json_array_get(o, 2), "arguments"), ARGS);
    CHECK(strncmp(sget(json_array_get(o, 2), "call_id"), "call_", 5) == 0);
    json_t *u = json_object_get(final, "usage");
    CHECK_EQ_INT(iget(json_object_get(u, "input_tokens_details"), "cached_tokens"), 3);
    CHECK_EQ_INT(iget(u, "output_tokens"), g_script_n);
    CHECK(iget(json_object_get(u, "output_tokens_details"), "reasoning_tokens") > 5);
    json_decref(evs);
}

TEST(responses_custom_tool_call) {
    script_text("<tool_call>\n{\"name\": \"apply_patch\", \"arguments\": {\"input\": \"*** Begin Patch\\n*** End Patch\"}}\n"
                "</tool_call>",
                NS_FINISH_EOS);
    char body[1024];
    snprintf(body, sizeof body, "{\"input\":\"patch it\",%s}", RESP_TOOLS);
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/responses", body, &out), 200);
    json_error_t je;
    json_t *j = json_loads(out.data ? out.data : "", 0, &je);
    json_t *it = json_array_get(json_object_get(j, "output"), 0);
    CHECK_EQ_STR(sget(it, "type"), "custom_tool_call");
    CHECK_EQ_STR(sget(it, "name"), "apply_patch");
    CHECK_EQ_STR(sget(it, "namespace"), "mcp");
    CHECK_EQ_STR(sget(it, "input"), "*** Begin Patch\n*** End Patch");
    CHECK_EQ_STR(sget(j, "status"), "completed");
    json_decref(j);
    /* streamed: the input decoded as it grows; the deltas add up to it */
    ns_buf_free(&out);
    snprintf(body, sizeof body, "{\"input\":\"patch it\",\"stream\":true,%s}", RESP_TOOLS);
    json_t *evs = post_events("/v1/responses", body);
    char deltas[256] = "";
    int n_deltas = 0;
    bool done = false;
    size_t i;
    json_t *ev;
    json_array_foreach(evs, i, ev) {
        if (!strcmp(ev_name(ev), "response.custom_tool_call_input.delta")) {
            strncat(deltas, sget(ev_data(ev), "delta"), sizeof deltas - strlen(deltas) - 1);
            n_deltas++;
        }
        if (!strcmp(ev_name(ev), "response.custom_tool_call_input.done"))
            done = !strcmp(sget(ev_data(ev), "input"), "*** Begin Patch\n*** End Patch");
    }
    CHECK_EQ_STR(deltas, "*** Begin Patch\n*** End Patch");
    CHECKF(n_deltas > 1, "the input should stream in pieces (%d)", n_deltas);
    CHECK(done);
    json_decref(evs);
}

/* An engine failure mid-stream: Anthropic's error event after what was
 * sent; Responses' response.failed with the items finished so far. */
TEST(stream_failures) {
    script_text("partial answer", NS_FINISH_ERROR);
    json_t *evs = post_events("/v1/messages", "{\"model\":\"m\",\"max_tokens\":50,\"stream\":true,\"messages\":[{"
                                              "\"role\":\"user\",\"content\":\"x\"}]}");
    json_t *last = json_array_get(evs, json_array_size(evs) - 1);
    CHECK_EQ_STR(ev_name(last), "error");
    CHECK_EQ_STR(sget(json_object_get(ev_data(last), "error"), "type"), "api_error");
    CHECK_EQ_STR(ev_name(json_array_get(evs, 0)), "message_start");
    json_decref(evs);
    script_text("partial answer", NS_FINISH_ERROR);
    evs = post_events("/v1/responses", "{\"input\":\"x\",\"stream\":true}");
    last = json_array_get(evs, json_array_size(evs) - 1);
    CHECK_EQ_STR(ev_name(last), "response.failed");
    json_t *r = json_object_get(ev_data(last), "response");
    CHECK_EQ_STR(sget(r, "status"), "failed");
    CHECK_EQ_STR(sget(json_object_get(r, "error"), "code"), "engine_error");
    json_t *msg = json_array_get(json_object_get(r, "output"), 0);
    CHECK_EQ_STR(sget(json_array_get(json_object_get(msg, "content"), 0), "text"), "partial answer");
    json_decref(evs);
}

/* thinking.budget_tokens: after the budget the request is cut inside
 * <think>, and a continuation request (prompt + tokens so far + the
 * closing tag) writes the answer. */
TEST(thinking_budget) {
    static char out_text[16384];
    size_t k = (size_t)snprintf(out_text, sizeof out_text, "<think>\n");
    for (int i = 0; i < 1500 && k + 8 < sizeof out_text; i++) k += (size_t)snprintf(out_text + k, sizeof out_text - k, " w%d", i % 10);
    script_text(out_text, NS_FINISH_EOS);
    CHECK(g_script_n > 1100);
    /* the continuation's output */
    int32_t *ids = NULL;
    size_t n = 0;
    ns_error err;
    CHECK(ns_tokenizer_encode(g_api.tok, "Final answer.", 13, false, &ids, &n, &err) == NS_OK);
    for (size_t i = 0; i < n; i++) g_next[i] = ids[i];
    g_next[n] = 151645; /* <|im_end|> */
    g_next_n = (int)n + 1;
    free(ids);
    g_submits = 0;
    ns_buf out;
    ns_buf_init(&out, 0);
    CHECK_EQ_INT(http("POST", "/v1/messages",
                      "{\"model\":\"m\",\"max_tokens\":3000,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},"
                      "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                      &out),
                 200);
    json_error_t je;
    json_t *j = json_loads(out.data ? out.data : "", 0, &je);
    json_t *c = json_object_get(j, "content");
    CHECK_EQ_INT(g_submits, 2);
    CHECK_EQ_INT(json_array_size(c), 2);
    CHECK_EQ_STR(sget(json_array_get(c, 0), "type"), "thinking");
    CHECK_EQ_STR(sget(json_array_get(c, 1), "text"), "Final answer.");
    CHECK_EQ_STR(sget(j, "stop_reason"), "end_turn");
    json_t *u = json_object_get(j, "usage");
    const long long outn = iget(u, "output_tokens");
    /* the budget's tokens (from <think> on), the closing tag's, the answer's */
    CHECKF(outn > 1024 && outn < 1024 + 20 + (long long)n, "output_tokens %lld", outn);
    CHECK_EQ_INT(iget(u, "cache_read_input_tokens"), 3); /* the first request's reuse */
    /* the continuation's prompt is the first one plus everything written before it */
    CHECK_EQ_INT(g_submitted_n_prompt[1], g_submitted_n_prompt[0] + outn - (long long)n - 1);
    const char *th = sget(json_array_get(c, 0), "thinking");
    CHECK(th && strlen(th) > 1000 && strstr(th, "</think>") == NULL);
    json_decref(j);
    ns_buf_free(&out);
}

/* The stream opens as soon as the request is admitted, not at the first
 * token: an Anthropic message_start (with the prefix reuse already in its
 * usage) and Responses' response.created / response.in_progress arrive
 * while the engine holds every token back, as during a long prefill. */
TEST(stream_opens_before_first_token) {
    script_text("Hello there.", NS_FINISH_EOS);
    const char *paths[2] = {"/v1/messages", "/v1/responses"};
    const char *bodies[2] = {
        "{\"model\":\"m\",\"max_tokens\":50,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        "{\"model\":\"m\",\"max_output_tokens\":50,\"stream\":true,\"input\":\"hi\"}"};
    const char *opened[2] = {"event: ping\n", "event: response.in_progress\n"};
    for (int k = 0; k < 2; k++) {
        gate_set(true);
        int fd = connect_server();
        CHECK(fd >= 0);
        if (fd < 0) break;
        send_request(fd, "POST", paths[k], bodies[k]);
        ns_buf got;
        ns_buf_init(&got, 0);
        /* the whole of that event: its block ends with a blank line */
        bool whole = read_until(fd, &got, opened[k]);
        while (whole && !strstr(strstr(got.data, opened[k]), "\n\n")) {
            char more[4096];
            ssize_t r = read(fd, more, sizeof more);
            if (r <= 0) whole = false;
            else ns_buf_append(&got, more, (size_t)r);
        }
        CHECK(whole);
        const char *b = got.data ? strstr(got.data, "\r\n\r\n") : NULL;
        CHECK(b != NULL);
        int bad = 0;
        json_t *evs = named_events(b ? b + 4 : "", &bad);
        CHECK_EQ_INT(bad, 0);
        CHECK(g_script_n > 0 && !strstr(b ? b : "", "delta")); /* no token yet */
        if (k == 0) {
            CHECK_EQ_INT((int)json_array_size(evs), 2);
            CHECK_EQ_STR(ev_name(json_array_get(evs, 0)), "message_start");
            json_t *u = json_object_get(json_object_get(ev_data(json_array_get(evs, 0)), "message"), "usage");
            CHECK_EQ_INT(iget(u, "cache_read_input_tokens"), 3);
            CHECK(iget(u, "input_tokens") > 0);
            CHECK_EQ_INT(iget(u, "output_tokens"), 0);
        } else {
            CHECK_EQ_INT((int)json_array_size(evs), 2);
            CHECK_EQ_STR(ev_name(json_array_get(evs, 0)), "response.created");
        }
        json_decref(evs);
        gate_set(false);
        /* the rest of the stream: the text, and the stream opened once */
        char buf[4096];
        ssize_t r;
        while ((r = read(fd, buf, sizeof buf)) > 0) ns_buf_append(&got, buf, (size_t)r);
        close(fd);
        b = got.data ? strstr(got.data, "\r\n\r\n") : NULL;
        evs = named_events(b ? b + 4 : "", &bad);
        CHECK_EQ_INT(bad, 0);
        int n_open = 0, n_delta = 0;
        size_t i;
        json_t *ev;
        json_array_foreach(evs, i, ev) {
            n_open += !strcmp(ev_name(ev), k == 0 ? "message_start" : "response.created");
            n_delta += strstr(ev_name(ev), "delta") != NULL;
        }
        CHECK_EQ_INT(n_open, 1);
        CHECK(n_delta > 0);
        CHECK_EQ_STR(ev_name(json_array_get(evs, json_array_size(evs) - 1)),
                     k == 0 ? "message_stop" : "response.completed");
        json_decref(evs);
        ns_buf_free(&got);
    }
    gate_set(false);
    join_engines();
}

/* The shape of an error follows the path, also for the refusals the
 * server makes before any handler (unknown path, wrong method, body over
 * the cap): Anthropic's under /v1/messages, OpenAI's elsewhere (a path
 * that only starts with the same letters included). */
TEST(error_shape_by_path) {
    struct {
        const char *method, *path, *body;
        int status;
        const char *anthropic_type; /* NULL: the OpenAI shape */
    } cases[] = {
        {"POST", "/v1/messages/nope", "{}", 404, "not_found_error"},
        {"GET", "/v1/messages", NULL, 405, "invalid_request_error"},
        {"GET", "/v1/messages/count_tokens", NULL, 405, "invalid_request_error"},
        {"POST", "/v1/messages", "{\"model\":\"m\"}", 400, "invalid_request_error"},
        {"POST", "/v1/messagesX", "{}", 404, NULL},
        {"GET", "/v1/chat/completions", NULL, 405, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ns_buf out;
        ns_buf_init(&out, 0);
        CHECK_EQ_INT(http(cases[i].method, cases[i].path, cases[i].body, &out), cases[i].status);
        json_error_t je;
        json_t *j = json_loadb(out.data ? out.data : "", out.len, 0, &je);
        CHECK(j != NULL);
        json_t *e = json_object_get(j, "error");
        CHECK(json_is_string(json_object_get(e, "message")));
        if (cases[i].anthropic_type) {
            CHECK_EQ_STR(sget(j, "type"), "error");
            CHECK_EQ_STR(sget(e, "type"), cases[i].anthropic_type);
            CHECK(json_object_get(e, "code") == NULL);
        } else {
            CHECK(json_object_get(j, "type") == NULL);
            CHECK(json_is_string(json_object_get(e, "code")));
        }
        json_decref(j);
        ns_buf_free(&out);
    }
    /* a body announced over the server's cap (65536 here): 413 from the
     * head, before the body is read or any handler runs */
    int fd = connect_server();
    CHECK(fd >= 0);
    if (fd >= 0) {
        static const char head[] =
            "POST /v1/messages HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 70000\r\n\r\n";
        CHECK(write(fd, head, sizeof head - 1) == (ssize_t)(sizeof head - 1));
        ns_buf got;
        ns_buf_init(&got, 0);
        CHECK(read_until(fd, &got, "}}"));
        CHECK(got.data && strncmp(got.data, "HTTP/1.", 7) == 0 && strstr(got.data, " 413 "));
        CHECK(got.data && strstr(got.data, "{\"type\":\"error\",\"error\":{\"type\":\"request_too_large\""));
        ns_buf_free(&got);
        close(fd);
    }
}

int main(void) {
    if (!setup()) {
        printf("not ok - setup\n");
        return 1;
    }
    RUN(messages_stream_blocks);
    RUN(messages_whole_and_stop_sequence);
    RUN(messages_single_call);
    RUN(responses_stream_items);
    RUN(responses_custom_tool_call);
    RUN(stream_failures);
    RUN(thinking_budget);
    RUN(stream_opens_before_first_token);
    RUN(error_shape_by_path);
    teardown();
    TEST_MAIN_END;
}
