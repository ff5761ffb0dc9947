/* test_api_convert.c — the Anthropic Messages and OpenAI Responses request
 * converters: each request must become exactly the chat request (messages
 * with tool_calls, tool results, reasoning_content; OpenAI-shaped tools;
 * tool_choice; the thinking switch) that a chat client would send for the
 * same conversation, and bad or unknown fields must be refused naming the
 * field. The expected chat bodies are written out by hand here. */
#include <jansson.h>
#include <string.h>

#include "api/messages_conv.h"
#include "api/responses_conv.h"
#include "test.h"

static json_t *J(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j) fprintf(stdout, "#   bad test JSON: %s (%s)\n", je.text, text);
    return j;
}

static bool same(json_t *got, const char *want_text) {
    json_t *want = J(want_text);
    bool eq = got && want && json_equal(got, want);
    if (!eq) {
        char *g = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        char *w = want ? json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        fprintf(stdout, "#   got:  %s\n#   want: %s\n", g ? g : "(null)", w ? w : "(null)");
        free(g);
        free(w);
    }
    json_decref(want);
    return eq;
}

/* ---------- Anthropic ---------- */

TEST(msgs_conversation) {
    json_t *b = J("{\"model\":\"m\",\"max_tokens\":100,\"system\":[{\"type\":\"text\",\"text\":\"A\",\"cache_control\":{\"type\":"
                  "\"ephemeral\"}},{\"type\":\"text\",\"text\":\"B\"}],\"messages\":["
                  "{\"role\":\"user\",\"content\":\"hi\"},"
                  "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
                  "{\"type\":\"redacted_thinking\",\"data\":\"x\"},{\"type\":\"text\",\"text\":\"ok\"},"
                  "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{\"a\":1}}]},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"r1\"},{\"type\":\"text\",\"text\":\"r2\"}],\"is_error\":true},"
                  "{\"type\":\"text\",\"text\":\"next\"}]},"
                  "{\"role\":\"system\",\"content\":\"mid\"}],"
                  "\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":{\"$schema\":\"http://json-schema.org/"
                  "draft-07/schema#\",\"type\":\"object\"}},{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
                  "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},\"thinking\":{\"type\":"
                  "\"adaptive\"},\"stop_sequences\":[\"X\"],\"temperature\":0.5,\"top_k\":5,\"metadata\":{\"user_id\":\"u\"},"
                  "\"context_management\":{},\"output_config\":{\"effort\":\"high\"},\"stream\":true}");
    ns_msgs_conv c;
    ns_http_error e = {0};
    CHECK(ns_msgs_convert(b, false, &c, &e));
    CHECK(same(c.chat,
               "{\"messages\":["
               "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\",\"text\":\"B\"}]},"
               "{\"role\":\"user\",\"content\":\"hi\"},"
               "{\"role\":\"assistant\",\"content\":\"ok\",\"reasoning_content\":\"hmm\",\"tool_calls\":[{\"id\":\"t1\","
               "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"Error: r1\\nr2\"},"
               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"next\"}]},"
               "{\"role\":\"system\",\"content\":\"mid\"}],"
               "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{"
               "\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"type\":\"object\"}}}],"
               "\"parallel_tool_calls\":false,\"tool_choice\":\"required\",\"enable_thinking\":true}"));
    CHECK_EQ_STR(c.ignored_tools, "web_search");
    CHECK_EQ_INT(c.n_ignored, 1);
    CHECK_EQ_INT(c.choice, NS_MSGS_CHOICE_ANY);
    CHECK(c.single_call);
    CHECK(c.stream);
    CHECK_EQ_INT(c.max_tokens, 100);
    CHECK_EQ_INT(c.n_stops, 1);
    CHECK_EQ_STR(c.stops[0], "X");
    CHECK_NEAR(c.temperature, 0.5, 1e-9);
    CHECK_EQ_INT(c.top_k, 5);
    ns_msgs_conv_free(&c);
    json_decref(b);
}

TEST(msgs_choices_and_thinking) {
    json_t *b = J("{\"model\":\"m\",\"max_tokens\":2000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{"
                  "\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"thinking\":{"
                  "\"type\":\"enabled\",\"budget_tokens\":1024}}");
    ns_msgs_conv c;
    ns_http_error e = {0};
    CHECK(ns_msgs_convert(b, false, &c, &e));
    CHECK(same(json_object_get(c.chat, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"));
    CHECK(same(json_object_get(c.chat, "enable_thinking"), "true"));
    CHECK_EQ_INT(c.choice, NS_MSGS_CHOICE_TOOL);
    CHECK_EQ_STR(c.choice_name, "f");
    ns_msgs_conv_free(&c);
    json_decref(b);
    b = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"disabled\"},"
          "\"tool_choice\":{\"type\":\"none\"}}");
    CHECK(ns_msgs_convert(b, true, &c, &e)); /* count_tokens: no max_tokens */
    CHECK(same(json_object_get(c.chat, "enable_thinking"), "false"));
    CHECK(same(json_object_get(c.chat, "tool_choice"), "\"none\""));
    ns_msgs_conv_free(&c);
    json_decref(b);
}

/* A final assistant message is a prefill the reply continues. */
TEST(msgs_prefill) {
    json_t *b = J("{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
                  "\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"The answer is\"}]}]}");
    ns_msgs_conv c;
    ns_http_error e = {0};
    CHECK(ns_msgs_convert(b, false, &c, &e));
    CHECK(c.prefill);
    CHECK(same(c.chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":"
                       "\"The answer is\"}],\"continue_final_message\":true}"));
    ns_msgs_conv_free(&c);
    json_decref(b);
}

/* Each body must be refused with a 400 whose param names the field. */
TEST(msgs_refusals) {
    static const char *const cases[][2] = {
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"bogus\":1}", "bogus"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", "messages"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
         "messages[0].content[0]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "temperature"},
        {"{\"model\":\"m\",\"max_tokens\":1000,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},\"messages\":[{"
         "\"role\":\"user\",\"content\":\"x\"}]}",
         "thinking.budget_tokens"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         "tool_choice"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"name\":\"f\"}],\"messages\":[{\"role\":\"user\",\"content\":"
         "\"x\"}]}",
         "tools[0].input_schema"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"output_config\":{\"effort\":\"low\",\"zap\":1},\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         "output_config.zap"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
         "\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}",
         "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *b = J(cases[i][0]);
        ns_msgs_conv c;
        ns_http_error e = {0};
        bool ok = ns_msgs_convert(b, false, &c, &e);
        CHECKF(!ok && e.status == 400 && strcmp(e.param, cases[i][1]) == 0, "case %zu: param '%s' (%s)", i, e.param,
               e.message);
        if (ok) ns_msgs_conv_free(&c);
        ns_http_error_clear(&e);
        json_decref(b);
    }
}

/* ---------- Responses ---------- */

TEST(resp_items) {
    json_t *b = J("{\"model\":\"m\",\"instructions\":\"I\",\"input\":["
                  "{\"type\":\"message\",\"id\":\"a\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":"
                  "\"D\"}]},"
                  "{\"role\":\"user\",\"content\":\"U\"},"
                  "{\"type\":\"reasoning\",\"id\":\"r\",\"summary\":[],\"content\":null,\"encrypted_content\":"
                  "\"" NS_RESP_REASONING_TAG "think\"},"
                  "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"A\"}]},"
                  "{\"type\":\"function_call\",\"id\":\"fc\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
                  "{\"type\":\"custom_tool_call\",\"call_id\":\"c2\",\"name\":\"p\",\"input\":\"patch\"},"
                  "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"o1\"},"
                  "{\"type\":\"custom_tool_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":"
                  "\"o2\"}]},"
                  "{\"type\":\"reasoning\",\"id\":\"r2\",\"summary\":[],\"content\":null,\"encrypted_content\":\"opaque\"},"
                  "{\"type\":\"function_call\",\"call_id\":\"c3\",\"name\":\"g\",\"arguments\":\"{}\"}],"
                  "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"},\"strict\":false},"
                  "{\"type\":\"custom\",\"name\":\"p\",\"format\":{\"type\":\"grammar\"}},"
                  "{\"type\":\"namespace\",\"name\":\"ns\",\"description\":\"N\",\"tools\":[{\"type\":\"function\",\"name\":"
                  "\"g\",\"description\":\"G\"}]},{\"type\":\"web_search\"},{\"type\":\"tool_search\"}],"
                  "\"reasoning\":{\"effort\":\"low\",\"summary\":\"auto\"},\"parallel_tool_calls\":false,\"store\":false,"
                  "\"include\":[\"reasoning.encrypted_content\"],\"prompt_cache_key\":\"k\",\"client_metadata\":{},"
                  "\"text\":{\"verbosity\":\"low\"},\"stream\":true,\"max_output_tokens\":9}");
    ns_resp_conv c;
    ns_http_error e = {0};
    CHECK(ns_resp_convert(b, &c, &e));
    CHECK(same(c.chat,
               "{\"messages\":["
               "{\"role\":\"system\",\"content\":\"I\"},{\"role\":\"system\",\"content\":\"D\"},"
               "{\"role\":\"user\",\"content\":\"U\"},"
               "{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":\"think\",\"tool_calls\":["
               "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}},"
               "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"p\",\"arguments\":{\"input\":\"patch\"}}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"o1\"},"
               "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"o2\"},"
               "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c3\",\"type\":\"function\","
               "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}],"
               "\"tools\":["
               "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}},"
               "{\"type\":\"function\",\"function\":{\"name\":\"p\",\"parameters\":{\"type\":\"object\",\"properties\":{"
               "\"input\":{\"type\":\"string\"}},\"required\":[\"input\"]}}},"
               "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"G\",\"parameters\":{\"type\":"
               "\"object\",\"properties\":{}}}}],"
               "\"reasoning_effort\":\"low\"}"));
    CHECK(same(c.tool_info, "{\"f\":{\"custom\":false,\"namespace\":null},\"p\":{\"custom\":true,\"namespace\":null},"
                            "\"g\":{\"custom\":false,\"namespace\":\"ns\"}}"));
    CHECK_EQ_STR(c.ignored_tools, "web_search,tool_search");
    CHECK_EQ_INT(c.max_calls, 1);
    CHECK(c.include_reasoning);
    CHECK(c.stream);
    CHECK_EQ_INT(c.max_tokens, 9);
    ns_resp_conv_free(&c);
    json_decref(b);
}

TEST(resp_refusals) {
    static const char *const cases[][2] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"r\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"conversation\":\"c\"}", "conversation"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"nope\":1}", "nope"},
        {"{}", "input"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0].type"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}",
         "input[0].content[0]"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}", "tool_choice"},
        {"{\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{\"type\":\"function\",\"name\":\"f\"}]}",
         "tools[1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *b = J(cases[i][0]);
        ns_resp_conv c;
        ns_http_error e = {0};
        bool ok = ns_resp_convert(b, &c, &e);
        CHECKF(!ok && e.status == 400 && strcmp(e.param, cases[i][1]) == 0, "case %zu: param '%s' (%s)", i, e.param,
               e.message);
        if (ok) ns_resp_conv_free(&c);
        ns_http_error_clear(&e);
        json_decref(b);
    }
}

/* Many text parts join in linear time (a body of 200k parts: joining by
 * string concatenation would copy gigabytes) and exactly: n parts of "ab"
 * joined with newlines are 3n - 1 bytes. */
TEST(many_parts) {
    const size_t n = 200000;
    json_t *blocks = json_array(), *parts = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(blocks, json_pack("{s:s,s:s}", "type", "text", "text", "ab"));
        json_array_append_new(parts, json_pack("{s:s,s:s}", "type", "input_text", "text", "ab"));
    }
    json_t *mb = json_pack("{s:s,s:i,s:[{s:s,s:s},{s:s,s:o}]}", "model", "m", "max_tokens", 1, "messages", "role", "user",
                           "content", "x", "role", "assistant", "content", blocks);
    ns_msgs_conv c;
    ns_http_error e = {0};
    CHECK(ns_msgs_convert(mb, false, &c, &e));
    json_t *m = json_array_get(json_object_get(c.chat, "messages"), 1);
    CHECK_EQ_INT(json_string_length(json_object_get(m, "content")), 3 * n - 1);
    ns_msgs_conv_free(&c);
    json_t *rb = json_pack("{s:[{s:s,s:o}]}", "input", "role", "user", "content", parts);
    ns_resp_conv r;
    CHECK(ns_resp_convert(rb, &r, &e));
    m = json_array_get(json_object_get(r.chat, "messages"), 0);
    CHECK_EQ_INT(json_string_length(json_object_get(m, "content")), 3 * n - 1);
    ns_resp_conv_free(&r);
    json_decref(mb);
    json_decref(rb);
}

/* The custom input decoded from every prefix of the arguments text is a
 * prefix of the whole input, and the whole text gives all of it: escapes,
 * \\u escapes and surrogate pairs split at every byte. */
TEST(custom_input_prefix) {
    const char *args = "{ \"input\" : \"*** Begin Patch\\n+caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" \\\\ t\\tx\"}";
    const char *want = "*** Begin Patch\n+caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\" \\ t\tx";
    ns_buf b;
    ns_buf_init(&b, 0);
    size_t n = strlen(args);
    size_t prev = 0;
    for (size_t k = 0; k <= n; k++) {
        bool ok = ns_resp_custom_input_prefix(args, k, &b);
        const bool started = k >= 13; /* past `{ "input" : "` */
        CHECKF(ok == started, "k=%zu ok=%d", k, ok);
        if (!ok) continue;
        CHECKF(b.len <= strlen(want) && memcmp(b.data ? b.data : "", want, b.len) == 0, "k=%zu: not a prefix", k);
        CHECKF(b.len >= prev, "k=%zu: shrank", k);
        prev = b.len;
    }
    CHECK(ns_resp_custom_input_prefix(args, n, &b));
    CHECK(b.len == strlen(want) && memcmp(b.data, want, b.len) == 0);
    CHECK(!ns_resp_custom_input_prefix("{\"path\": \"x\"}", 14, &b));
    ns_buf_free(&b);
}

int main(void) {
    RUN(msgs_conversation);
    RUN(msgs_choices_and_thinking);
    RUN(msgs_prefill);
    RUN(msgs_refusals);
    RUN(resp_items);
    RUN(resp_refusals);
    RUN(many_parts);
    RUN(custom_input_prefix);
    TEST_MAIN_END;
}
