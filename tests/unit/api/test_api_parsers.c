/* test_api_parsers.c — stop-string matcher, reasoning splitter and tool-call
 * parser, each fed whole, byte by byte and split at every byte boundary:
 * the result must never depend on the fragmentation. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "api/reasoning.h"
#include "api/stop.h"
#include "api/toolcall.h"
#include "test.h"

/* ---------- stop strings ---------- */

typedef struct {
    char out[4096];
    bool matched;
} stop_res;

/* cuts: sorted split offsets (n_cuts of them) */
static stop_res run_stop(const char *const *stops, int n_stops, const char *text, const size_t *cuts, int n_cuts) {
    stop_res r = {{0}, false};
    ns_stop st;
    ns_error err;
    if (ns_stop_init(&st, stops, n_stops, &err) != NS_OK) return r;
    ns_buf out;
    ns_buf_init(&out, 0);
    size_t len = strlen(text), prev = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        bool m;
        ns_stop_feed(&st, text + prev, end - prev, &out, &m);
        if (m) r.matched = true;
        prev = end;
    }
    if (!r.matched) ns_stop_flush(&st, &out);
    snprintf(r.out, sizeof r.out, "%s", out.data ? out.data : "");
    ns_buf_free(&out);
    ns_stop_free(&st);
    return r;
}

static void check_stop_all_splits(const char *const *stops, int n, const char *text, const char *want, bool want_m) {
    stop_res whole = run_stop(stops, n, text, NULL, 0);
    CHECK_EQ_STR(whole.out, want);
    CHECK_EQ_INT(whole.matched, want_m);
    size_t len = strlen(text);
    for (size_t c = 1; c < len; c++) {
        stop_res r = run_stop(stops, n, text, &c, 1);
        CHECKF(strcmp(r.out, want) == 0 && r.matched == want_m, "split at %zu: \"%s\"", c, r.out);
    }
    size_t cuts[512];
    int nc = 0;
    for (size_t c = 1; c < len && nc < 512; c++) cuts[nc++] = c;
    stop_res b = run_stop(stops, n, text, cuts, nc);
    CHECK_EQ_STR(b.out, want);
    CHECK_EQ_INT(b.matched, want_m);
}

TEST(stop_basic) {
    const char *s1[] = {"STOP"};
    check_stop_all_splits(s1, 1, "hello STOP world", "hello ", true);
    check_stop_all_splits(s1, 1, "hello STO world", "hello STO world", false);
    check_stop_all_splits(s1, 1, "hello ST", "hello ST", false);
    check_stop_all_splits(s1, 1, "STOP", "", true);
    check_stop_all_splits(s1, 1, "SSSTOP", "SS", true);
    const char *s2[] = {"\n\n", "</end>", "abcabd"};
    check_stop_all_splits(s2, 3, "line\nnext\n\nafter", "line\nnext", true);
    check_stop_all_splits(s2, 3, "x abcabcabd y", "x abc", true);
    check_stop_all_splits(s2, 3, "x </en </end> y", "x </en ", true);
    check_stop_all_splits(s2, 3, "no match at all", "no match at all", false);
    /* the match that completes first wins (as if read byte by byte) */
    const char *s3[] = {"abcdef", "cd"};
    check_stop_all_splits(s3, 2, "xxabcdefyy", "xxab", true);
    const char *s5[] = {"bc", "abc"};
    check_stop_all_splits(s5, 2, "xabcx", "x", true);
    /* UTF-8 stop string */
    const char *s4[] = {"\xe4\xbd\xa0\xe5\xa5\xbd"};
    check_stop_all_splits(s4, 1, "say \xe4\xbd\xa0\xe5\xa5\xbd!", "say ", true);
}

TEST(stop_none_and_limits) {
    check_stop_all_splits(NULL, 0, "anything goes", "anything goes", false);
    const char *e[] = {""};
    check_stop_all_splits(e, 1, "empty stop ignored", "empty stop ignored", false);
    const char *many[NS_STOP_MAX + 1];
    for (int i = 0; i <= NS_STOP_MAX; i++) many[i] = "x";
    ns_stop st;
    ns_error err;
    CHECK(ns_stop_init(&st, many, NS_STOP_MAX + 1, &err) == NS_ERR_INVALID);
    /* after a match later input is ignored */
    const char *s1[] = {"END"};
    CHECK(ns_stop_init(&st, s1, 1, &err) == NS_OK);
    ns_buf out;
    ns_buf_init(&out, 0);
    bool m;
    ns_stop_feed(&st, "aEN", 3, &out, &m);
    CHECK(!m);
    ns_stop_feed(&st, "Dzz", 3, &out, &m);
    CHECK(m);
    ns_stop_feed(&st, "more", 4, &out, &m);
    CHECK(m);
    CHECK_EQ_STR(out.data, "a");
    ns_buf_free(&out);
    ns_stop_free(&st);
}

/* ---------- reasoning ---------- */

typedef struct {
    char reasoning[4096], content[4096];
} reason_res;

static reason_res run_reason(bool in_think, const char *text, const size_t *cuts, int n_cuts) {
    reason_res r;
    ns_reason p;
    ns_reason_init(&p, true, in_think);
    ns_buf a, b;
    ns_buf_init(&a, 0);
    ns_buf_init(&b, 0);
    size_t len = strlen(text), prev = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        ns_reason_feed(&p, text + prev, end - prev, &a, &b);
        prev = end;
    }
    ns_reason_flush(&p, &a, &b);
    snprintf(r.reasoning, sizeof r.reasoning, "%s", a.data ? a.data : "");
    snprintf(r.content, sizeof r.content, "%s", b.data ? b.data : "");
    ns_buf_free(&a);
    ns_buf_free(&b);
    ns_reason_free(&p);
    return r;
}

static void check_reason(bool in_think, const char *text, const char *want_r, const char *want_c) {
    reason_res w = run_reason(in_think, text, NULL, 0);
    CHECK_EQ_STR(w.reasoning, want_r);
    CHECK_EQ_STR(w.content, want_c);
    size_t len = strlen(text);
    for (size_t c = 1; c < len; c++) {
        reason_res r = run_reason(in_think, text, &c, 1);
        CHECKF(strcmp(r.reasoning, want_r) == 0 && strcmp(r.content, want_c) == 0, "split at %zu: [%s] [%s]", c,
               r.reasoning, r.content);
    }
    size_t cuts[1024];
    int nc = 0;
    for (size_t c = 1; c < len && nc < 1024; c++) cuts[nc++] = c;
    reason_res b = run_reason(in_think, text, cuts, nc);
    CHECK_EQ_STR(b.reasoning, want_r);
    CHECK_EQ_STR(b.content, want_c);
}

TEST(reasoning_split) {
    check_reason(false, "<think>\nLet me think.\nMore.\n</think>\n\nThe answer is 4.", "Let me think.\nMore.",
                 "The answer is 4.");
    check_reason(false, "No thinking here.", "", "No thinking here.");
    check_reason(false, "  <think>x</think>y", "x", "y");
    check_reason(false, "<think>\n\n</think>\n\nOnly content", "", "Only content");
    check_reason(false, "<thin>not a tag", "", "<thin>not a tag");
    check_reason(false, "<think", "", "<think");
    check_reason(false, "content then <think>inline</think>", "", "content then <think>inline</think>");
    check_reason(false, "<think>unfinished reasoning\n\n", "unfinished reasoning", "");
    check_reason(false, "<think>a\n\nb</thinkx</think>c", "a\n\nb</thinkx", "c");
    check_reason(false, "<think>partial close </thi", "partial close </thi", "");
    check_reason(true, "\nalready inside\n</think>\n\nanswer", "already inside", "answer");
    check_reason(true, "no close at all", "no close at all", "");
    check_reason(false, "\n\n", "", "\n\n");
}

TEST(reasoning_prompt_detect) {
    CHECK(ns_reason_prompt_opens_think("<|im_start|>assistant\n<think>\n", 29));
    const char *p = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(!ns_reason_prompt_opens_think(p, strlen(p)));
    CHECK(!ns_reason_prompt_opens_think("x", 1));
    ns_reason r;
    ns_reason_init(&r, false, false);
    ns_buf a, b;
    ns_buf_init(&a, 0);
    ns_buf_init(&b, 0);
    ns_reason_feed(&r, "<think>x</think>", 16, &a, &b);
    ns_reason_flush(&r, &a, &b);
    CHECK_EQ_STR(b.data, "<think>x</think>");
    CHECK(a.len == 0);
    ns_buf_free(&a);
    ns_buf_free(&b);
    ns_reason_free(&r);
}

/* ---------- tool calls ---------- */

typedef struct {
    char content[4096];
    int n_calls;
    char names[8][64];
    char args[8][1024];
    bool valid[8];
    char ids[8][32];
    /* concatenation of streamed diffs, to check they rebuild the state */
    char streamed_args[8][1024];
    char streamed_content[4096];
} tc_res;

static void snap(ns_toolparse *p, tc_res *r, size_t *sent_content, size_t *sent_args) {
    if (p->content.len > *sent_content) {
        strncat(r->streamed_content, p->content.data + *sent_content,
                sizeof r->streamed_content - strlen(r->streamed_content) - 1);
        *sent_content = p->content.len;
    }
    for (int i = 0; i < p->n_calls && i < 8; i++) {
        if (p->calls[i].args.len > sent_args[i]) {
            strncat(r->streamed_args[i], p->calls[i].args.data + sent_args[i],
                    sizeof r->streamed_args[i] - strlen(r->streamed_args[i]) - 1);
            sent_args[i] = p->calls[i].args.len;
        }
    }
}

static tc_res run_tc(ns_toolfmt fmt, const char *const *names, int n_names, const char *text, const size_t *cuts,
                     int n_cuts) {
    tc_res r;
    memset(&r, 0, sizeof r);
    ns_toolparse p;
    ns_toolparse_init(&p, fmt, names, n_names, 42);
    size_t len = strlen(text), prev = 0, sc = 0, sa[8] = {0};
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        ns_toolparse_feed(&p, text + prev, end - prev);
        snap(&p, &r, &sc, sa);
        prev = end;
    }
    ns_toolparse_finish(&p);
    snap(&p, &r, &sc, sa);
    snprintf(r.content, sizeof r.content, "%s", p.content.data ? p.content.data : "");
    r.n_calls = p.n_calls;
    for (int i = 0; i < p.n_calls && i < 8; i++) {
        snprintf(r.names[i], sizeof r.names[i], "%s", p.calls[i].name.data ? p.calls[i].name.data : "");
        snprintf(r.args[i], sizeof r.args[i], "%s", p.calls[i].args.data ? p.calls[i].args.data : "");
        r.valid[i] = p.calls[i].valid;
        snprintf(r.ids[i], sizeof r.ids[i], "%s", p.calls[i].id);
    }
    ns_toolparse_free(&p);
    return r;
}

static bool tc_same(const tc_res *a, const tc_res *b) {
    if (strcmp(a->content, b->content) || a->n_calls != b->n_calls) return false;
    for (int i = 0; i < a->n_calls && i < 8; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i]) || a->valid[i] != b->valid[i])
            return false;
    return true;
}

static bool tc_stream_consistent(const tc_res *a) {
    if (strcmp(a->content, a->streamed_content)) return false;
    for (int i = 0; i < a->n_calls && i < 8; i++)
        if (strcmp(a->args[i], a->streamed_args[i])) return false;
    return true;
}

/* want_calls: "name|args|valid" strings */
static void check_tc(ns_toolfmt fmt, const char *const *names, int n_names, const char *text, const char *want_content,
                     int want_n, const char *const *want_calls) {
    tc_res w = run_tc(fmt, names, n_names, text, NULL, 0);
    CHECK_EQ_STR(w.content, want_content);
    CHECK_EQ_INT(w.n_calls, want_n);
    for (int i = 0; i < want_n && i < w.n_calls; i++) {
        char got[1200];
        snprintf(got, sizeof got, "%s|%s|%d", w.names[i], w.args[i], w.valid[i]);
        CHECK_EQ_STR(got, want_calls[i]);
        CHECK(strncmp(w.ids[i], "call_", 5) == 0 && strlen(w.ids[i]) == 29);
    }
    CHECK(tc_stream_consistent(&w));
    size_t len = strlen(text);
    int bad = 0;
    for (size_t c = 1; c < len; c++) {
        tc_res r = run_tc(fmt, names, n_names, text, &c, 1);
        if (!tc_same(&w, &r) || !tc_stream_consistent(&r)) {
            if (bad++ < 3) CHECKF(0, "split at %zu differs: content [%s] calls %d", c, r.content, r.n_calls);
        }
    }
    size_t cuts[2048];
    int nc = 0;
    for (size_t c = 1; c < len && nc < 2048; c++) cuts[nc++] = c;
    tc_res b = run_tc(fmt, names, n_names, text, cuts, nc);
    CHECK(tc_same(&w, &b));
    CHECK(tc_stream_consistent(&b));
}

static const char *const TOOLS[] = {"read_file", "run_shell"};

TEST(toolcall_hermes) {
    const char *c1[] = {"read_file|{\"path\": \"src/main.c\", \"offset\": 1}|1"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2,
             "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.c\", \"offset\": 1}}\n</tool_call>",
             "", 1, c1);
    const char *c2[] = {"run_shell|{\"command\": \"ls\"}|1", "run_shell|{\"command\": \"make\", \"timeout_s\": 60}|1"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2,
             "Doing both.\n<tool_call>\n{\"name\": \"run_shell\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n"
             "<tool_call>\n{\"name\": \"run_shell\", \"arguments\": \"{\\\"command\\\": \\\"make\\\", \\\"timeout_s\\\": 60}\"}\n</tool_call>",
             "Doing both.", 2, c2);
    /* arguments before the name; strings with braces, escapes, </tool_call> */
    const char *c3[] = {"run_shell|{\"command\": \"echo '}{' \\\"</tool_call>\\\"\"}|1"};
    check_tc(NS_TOOLFMT_HERMES, NULL, 0,
             "<tool_call>{\"arguments\": {\"command\": \"echo '}{' \\\"</tool_call>\\\"\"}, \"name\": \"run_shell\"}</tool_call>",
             "", 1, c3);
    /* parameters synonym, missing args, nested arrays, trailing text */
    const char *c4[] = {"read_file|{\"a\": [1, {\"b\": [2, 3]}], \"c\": null}|1", "run_shell|{}|1"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2,
             "<tool_call>{\"name\":\"read_file\",\"parameters\":{\"a\": [1, {\"b\": [2, 3]}], \"c\": null}}</tool_call>"
             "<tool_call>{\"name\":\"run_shell\"}</tool_call> done",
             "done", 2, c4);
}

TEST(toolcall_malformed) {
    /* not JSON after the tag: plain content */
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "x <tool_call>oops</tool_call> y", "x <tool_call>oops</tool_call> y", 0, NULL);
    /* unknown tool name: content */
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
             "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", 0, NULL);
    /* name is not a string */
    check_tc(NS_TOOLFMT_HERMES, NULL, 0, "<tool_call>{\"name\": 5}</tool_call>", "<tool_call>{\"name\": 5}</tool_call>", 0,
             NULL);
    /* truncated before the name is complete */
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "text <tool_call>{\"name\": \"read_fi", "text <tool_call>{\"name\": \"read_fi", 0,
             NULL);
    /* truncated inside the arguments: committed but invalid */
    const char *c1[] = {"read_file|{\"path\": \"a|0"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"a", "", 1, c1);
    /* arguments not an object */
    const char *c2[] = {"read_file|[1,2]|0"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "<tool_call>{\"name\": \"read_file\", \"arguments\": [1,2]}</tool_call>", "", 1,
             c2);
    /* a partial tag at the end is content */
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "see <tool_ca", "see <tool_ca", 0, NULL);
    /* a tag inside text followed by another tag */
    const char *c3[] = {"run_shell|{\"command\": \"ls\"}|1"};
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "<tool_call><tool_call>{\"name\": \"run_shell\", \"arguments\": {\"command\": \"ls\"}}",
             "<tool_call>", 1, c3);
    /* empty object */
    check_tc(NS_TOOLFMT_HERMES, TOOLS, 2, "<tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", 0, NULL);
}

TEST(toolcall_llama_json) {
    const char *c1[] = {"read_file|{\"path\": \"x.c\"}|1"};
    check_tc(NS_TOOLFMT_LLAMA_JSON, TOOLS, 2, "  {\"name\": \"read_file\", \"parameters\": {\"path\": \"x.c\"}}", "", 1, c1);
    const char *c2[] = {"read_file|{\"path\": \"x.c\"}|1", "run_shell|{\"command\": \"ls\"}|1"};
    check_tc(NS_TOOLFMT_LLAMA_JSON, TOOLS, 2,
             "{\"name\": \"read_file\", \"parameters\": {\"path\": \"x.c\"}}; {\"name\": \"run_shell\", \"arguments\": {\"command\": \"ls\"}}",
             "", 2, c2);
    /* plain text answer */
    check_tc(NS_TOOLFMT_LLAMA_JSON, TOOLS, 2, "Hello {\"name\": \"read_file\"}", "Hello {\"name\": \"read_file\"}", 0, NULL);
    /* JSON that is not a call of an offered tool: content */
    check_tc(NS_TOOLFMT_LLAMA_JSON, TOOLS, 2, "{\"name\": \"Bob\", \"age\": 3}", "{\"name\": \"Bob\", \"age\": 3}", 0, NULL);
    check_tc(NS_TOOLFMT_LLAMA_JSON, TOOLS, 2, "{\"answer\": 42}", "{\"answer\": 42}", 0, NULL);
}

TEST(toolcall_none_passthrough) {
    check_tc(NS_TOOLFMT_NONE, NULL, 0, "<tool_call>{\"name\": \"f\"}</tool_call>  ",
             "<tool_call>{\"name\": \"f\"}</tool_call>  ", 0, NULL);
}

int main(void) {
    RUN(stop_basic);
    RUN(stop_none_and_limits);
    RUN(reasoning_split);
    RUN(reasoning_prompt_detect);
    RUN(toolcall_hermes);
    RUN(toolcall_malformed);
    RUN(toolcall_llama_json);
    RUN(toolcall_none_passthrough);
    TEST_MAIN_END;
}
