/* test_redact.c — --record-redact (record/redact.h): every message text
 * under the message-bearing fields becomes a placeholder with the count
 * the callback gives, the byte length and an XXH3-128 (equal texts, equal
 * hashes); structural fields, sampling parameters and tools stay; token
 * id prompts are hidden too; the input is left unchanged. */
#include "record/redact.h"

#include <string.h>

#include "test.h"

static long long count_words(void *ctx, const char *s, size_t n) {
    (*(int *)ctx)++;
    long long w = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && (i == 0 || s[i - 1] == ' ')) w++;
    return w;
}

TEST(chat_body) {
    json_error_t je;
    json_t *body = json_loads(
        "{\"model\":\"m\",\"temperature\":0.5,\"messages\":["
        "{\"role\":\"system\",\"content\":\"secret system words\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"secret part\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"read\",\"arguments\":\"{\\\"path\\\":\\\"/secret\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"secret system words\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"read\",\"description\":\"reads\"}}]}",
        0, &je);
    CHECK(body != NULL);
    char *before = json_dumps(body, JSON_SORT_KEYS);
    int calls = 0;
    json_t *r = ns_redact_body(body, count_words, &calls);
    CHECK(r != NULL);
    char *after = json_dumps(r, JSON_COMPACT);
    CHECK(strstr(after, "secret") == NULL);
    char *again = json_dumps(body, JSON_SORT_KEYS);
    CHECK_EQ_STR(before, again); /* the input is untouched */
    json_t *msgs = json_object_get(r, "messages");
    json_t *sys = json_object_get(json_array_get(msgs, 0), "content");
    CHECK(ns_redact_is_placeholder(sys));
    CHECK_EQ_INT(json_integer_value(json_object_get(sys, "redacted_tokens")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(sys, "chars")), 19);
    CHECK_EQ_INT(strlen(json_string_value(json_object_get(sys, "xxh3"))), 32);
    /* equal texts, equal hashes */
    json_t *tool = json_object_get(json_array_get(msgs, 3), "content");
    CHECK(json_equal(json_object_get(sys, "xxh3"), json_object_get(tool, "xxh3")));
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 3), "tool_call_id")), "call_1");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(msgs, 1), "role")), "user");
    json_t *part = json_array_get(json_object_get(json_array_get(msgs, 1), "content"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(part, "type")), "text");
    CHECK(ns_redact_is_placeholder(json_object_get(part, "text")));
    json_t *fn = json_object_get(json_array_get(json_object_get(json_array_get(msgs, 2), "tool_calls"), 0), "function");
    CHECK_EQ_STR(json_string_value(json_object_get(fn, "name")), "read");
    CHECK(ns_redact_is_placeholder(json_object_get(fn, "arguments")));
    CHECK(json_is_null(json_object_get(json_array_get(msgs, 2), "content")));
    CHECK(json_equal(json_object_get(r, "tools"), json_object_get(body, "tools")));
    CHECK_EQ_INT(json_real_value(json_object_get(r, "temperature")) * 10, 5);
    CHECK_EQ_INT(calls, 4);
    free(before);
    free(again);
    free(after);
    json_decref(r);
    json_decref(body);
}

TEST(prompts) {
    json_t *body = json_pack("{s:[i,i,i],s:s}", "prompt", 1, 2, 3, "model", "m");
    json_t *r = ns_redact_body(body, NULL, NULL);
    json_t *p = json_object_get(r, "prompt");
    CHECK(ns_redact_is_placeholder(p));
    CHECK_EQ_INT(json_integer_value(json_object_get(p, "redacted_tokens")), 3);
    json_decref(r);
    json_decref(body);
    body = json_pack("{s:s,s:s}", "instructions", "hidden", "input", "hidden too");
    r = ns_redact_body(body, NULL, NULL);
    CHECK(json_is_null(json_object_get(json_object_get(r, "input"), "redacted_tokens")));
    char *s = json_dumps(r, 0);
    CHECK(strstr(s, "hidden") == NULL);
    free(s);
    json_decref(r);
    json_decref(body);
}

int main(void) {
    RUN(chat_body);
    RUN(prompts);
    TEST_MAIN_END;
}
