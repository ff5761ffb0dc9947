/* test_toolcall_formats.c — the Qwen3-Coder XML and Mistral tool-call
 * formats of the tool-call parser (src/api/toolcall.c), and the choice of
 * format from a chat template.
 *
 * Every case is fed whole, split at every byte boundary into two
 * fragments, byte by byte, and in 64 random multi-fragment splits; each
 * must give the same final state, and the stream of states must be
 * monotone (content and arguments only grow, names never change, calls
 * never disappear). Round trips: the fixture templates
 * (tests/fixtures/templates, see the README there) render an assistant
 * turn with tool calls in the model's own layout, and the parser must give
 * the same arguments back. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/toolcall.h"
#include "template/template.h"
#include "test.h"

#define MAXC 8

typedef struct {
    char content[4096];
    int n_calls;
    char names[MAXC][64];
    char args[MAXC][2048];
    char ids[MAXC][32];
    bool valid[MAXC], complete[MAXC];
    int violations; /* non-monotone steps */
} tc_res;

static json_t *g_schemas; /* tools array for set_schemas, or NULL */

/* Checks the state grew monotonically since the last snapshot, then
 * records it. */
static void snap(const ns_toolparse *p, tc_res *r) {
    const char *c = p->content.data ? p->content.data : "";
    if (strncmp(c, r->content, strlen(r->content)) != 0) r->violations++;
    if (p->n_calls < r->n_calls) r->violations++;
    snprintf(r->content, sizeof r->content, "%s", c);
    for (int i = 0; i < p->n_calls && i < MAXC; i++) {
        const char *n = p->calls[i].name.data ? p->calls[i].name.data : "";
        const char *a = p->calls[i].args.data ? p->calls[i].args.data : "";
        if (i < r->n_calls && (strcmp(n, r->names[i]) || strncmp(a, r->args[i], strlen(r->args[i])))) r->violations++;
        snprintf(r->names[i], sizeof r->names[i], "%s", n);
        snprintf(r->args[i], sizeof r->args[i], "%s", a);
        snprintf(r->ids[i], sizeof r->ids[i], "%s", p->calls[i].id);
        r->valid[i] = p->calls[i].valid;
        r->complete[i] = p->calls[i].complete;
    }
    r->n_calls = p->n_calls;
}

static void run_tc(tc_res *r, ns_toolfmt fmt, const char *const *names, int n_names, const char *text,
                   const size_t *cuts, int n_cuts) {
    memset(r, 0, sizeof *r);
    ns_toolparse p;
    CHECK(ns_toolparse_init(&p, fmt, names, n_names, 42) == NS_OK);
    CHECK(ns_toolparse_set_schemas(&p, g_schemas) == NS_OK);
    size_t len = strlen(text), prev = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        CHECK(ns_toolparse_feed(&p, text + prev, end - prev) == NS_OK);
        snap(&p, r);
        prev = end;
    }
    CHECK(ns_toolparse_finish(&p) == NS_OK);
    snap(&p, r);
    ns_toolparse_free(&p);
}

static bool tc_same(const tc_res *a, const tc_res *b) {
    if (strcmp(a->content, b->content) || a->n_calls != b->n_calls) return false;
    for (int i = 0; i < a->n_calls && i < MAXC; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i]) || a->valid[i] != b->valid[i] ||
            a->complete[i] != b->complete[i])
            return false;
    return true;
}

static uint64_t g_rng = 0x1234567;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* want_calls: "name|args|valid" strings. */
static void check_tc(ns_toolfmt fmt, const char *const *names, int n_names, const char *text, const char *want_content,
                     int want_n, const char *const *want_calls) {
    static tc_res w, r;
    run_tc(&w, fmt, names, n_names, text, NULL, 0);
    CHECK_EQ_STR(w.content, want_content);
    CHECK_EQ_INT(w.n_calls, want_n);
    CHECK_EQ_INT(w.violations, 0);
    for (int i = 0; i < want_n && i < w.n_calls; i++) {
        char got[2200];
        snprintf(got, sizeof got, "%s|%s|%d", w.names[i], w.args[i], w.valid[i]);
        CHECK_EQ_STR(got, want_calls[i]);
        if (fmt == NS_TOOLFMT_MISTRAL) {
            CHECK(strlen(w.ids[i]) == 9 && strspn(w.ids[i], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == 9);
        } else {
            CHECK(strncmp(w.ids[i], "call_", 5) == 0 && strlen(w.ids[i]) == 29);
        }
        if (w.valid[i]) { /* valid arguments are a JSON object */
            json_error_t je;
            json_t *v = json_loads(w.args[i], 0, &je);
            CHECKF(json_is_object(v), "args %s: %s", w.args[i], je.text);
            json_decref(v);
        }
    }
    size_t len = strlen(text);
    int bad = 0;
    for (size_t c = 1; c < len; c++) {
        run_tc(&r, fmt, names, n_names, text, &c, 1);
        if ((!tc_same(&w, &r) || r.violations) && bad++ < 3)
            CHECKF(0, "split at %zu differs: content [%s] calls %d violations %d", c, r.content, r.n_calls, r.violations);
    }
    static size_t cuts[4096];
    int nc = 0;
    for (size_t c = 1; c < len && nc < 4096; c++) cuts[nc++] = c;
    run_tc(&r, fmt, names, n_names, text, cuts, nc);
    CHECKF(tc_same(&w, &r) && r.violations == 0, "byte by byte: content [%s] calls %d", r.content, r.n_calls);
    for (int k = 0; k < 64 && len > 2; k++) {
        nc = 0;
        for (size_t c = 1 + rnd() % 7; c < len && nc < 4096; c += 1 + rnd() % 9) cuts[nc++] = c;
        run_tc(&r, fmt, names, n_names, text, cuts, nc);
        if ((!tc_same(&w, &r) || r.violations) && bad++ < 3) CHECKF(0, "random split %d differs", k);
    }
}

static const char *const TOOLS[] = {"read_file", "run_shell", "edit"};

static const char SCHEMAS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"parameters\": {\"type\": \"object\","
    "  \"properties\": {\"path\": {\"type\": \"string\"}, \"offset\": {\"type\": \"integer\"},"
    "  \"ratio\": {\"type\": \"number\"}, \"follow\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"},"
    "  \"lines\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"note\": {\"type\": [\"string\", \"null\"]},"
    "  \"mode\": {\"enum\": [\"r\", \"w\"]}, \"depth\": {\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"null\"}]},"
    "  \"any\": {}}}}},"
    " {\"type\": \"function\", \"name\": \"run_shell\", \"parameters\": {\"type\": \"object\","
    "  \"properties\": {\"command\": {\"type\": \"string\"}, \"timeout\": {\"type\": \"integer\"}}}},"
    " {\"name\": \"edit\", \"input_schema\": {\"type\": \"object\", \"properties\": {\"old\": {\"type\": \"string\"}}}}]";

static void use_schemas(bool on) {
    json_decref(g_schemas);
    g_schemas = NULL;
    if (on) {
        json_error_t je;
        g_schemas = json_loads(SCHEMAS, 0, &je);
        if (!g_schemas) fprintf(stdout, "# schemas: %s\n", je.text);
    }
}

TEST(qwen_xml_basic) {
    use_schemas(true);
    const char *c1[] = {"read_file|{\"path\": \"src/main.c\", \"offset\": 10}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "I'll read it.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/main.c\n</parameter>\n"
             "<parameter=offset>\n10\n</parameter>\n</function>\n</tool_call>",
             "I'll read it.", 1, c1);
    /* two calls, no parameters, text after; a bare <function= block */
    const char *c2[] = {"run_shell|{}|1", "run_shell|{\"command\": \"make -j2\", \"timeout\": 60}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<function=run_shell>\n</function>\n</tool_call>\n"
             "<function=run_shell>\n<parameter=command>\nmake -j2\n</parameter>\n<parameter=timeout>\n60\n</parameter>\n"
             "</function>\nDone.",
             "Done.", 2, c2);
    /* a JSON body inside <tool_call> is accepted too */
    const char *c3[] = {"run_shell|{\"command\": \"ls\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n{\"name\": \"run_shell\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>", "", 1, c3);
}

TEST(qwen_xml_strings) {
    use_schemas(true);
    /* a multi-line string keeps everything but the one leading and one
     * trailing newline: quotes, backslashes, tabs, tags that are not
     * </parameter>, a partial closing tag, blank lines */
    const char *c1[] = {"edit|{\"old\": \"line \\\"1\\\"\\n\\tC:\\\\x <parameter=y> </param </parameter \\u0001\\n\\n\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<function=edit>\n<parameter=old>\nline \"1\"\n\tC:\\x <parameter=y> </param </parameter \x01\n\n\n"
             "</parameter>\n</function>\n</tool_call>",
             "", 1, c1);
    /* values without the template's newlines, and UTF-8 */
    const char *c2[] = {"edit|{\"old\": \"h\xc3\xa9llo \xe2\x9c\x93\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call><function=edit><parameter=old>h\xc3\xa9llo \xe2\x9c\x93</parameter></function></tool_call>", "", 1,
             c2);
    /* empty values: "" as a string; an empty integer does not parse: "" too */
    const char *c4[] = {"read_file|{\"path\": \"\", \"offset\": \"\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<function=read_file>\n<parameter=path>\n\n</parameter>\n<parameter=offset>\n</parameter>\n"
             "</function>\n</tool_call>",
             "", 1, c4);
    /* no schemas: every value is a string */
    use_schemas(false);
    const char *c3[] = {"read_file|{\"offset\": \"10\", \"follow\": \"true\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, NULL, 0,
             "<tool_call>\n<function=read_file>\n<parameter=offset>\n10\n</parameter>\n<parameter=follow>\ntrue\n"
             "</parameter>\n</function>\n</tool_call>",
             "", 1, c3);
}

TEST(qwen_xml_typing) {
    use_schemas(true);
    const char *c1[] = {"read_file|{\"offset\": -3, \"ratio\": 1.5e3, \"follow\": true, \"opts\": {\"a\": [1, \"x\"]}, "
                        "\"lines\": [1,2], \"note\": null, \"mode\": \"w\", \"depth\": null, \"any\": 7, \"extra\": \"42\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<function=read_file>\n<parameter=offset>\n-3\n</parameter>\n<parameter=ratio>\n1.5e3\n</parameter>\n"
             "<parameter=follow>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, \"x\"]}\n</parameter>\n"
             "<parameter=lines>\n[1,2]\n</parameter>\n<parameter=note>\nNone\n</parameter>\n<parameter=mode>\nw\n</parameter>\n"
             "<parameter=depth>\nnull\n</parameter>\n<parameter=any>\n7\n</parameter>\n<parameter=extra>\n42\n</parameter>\n"
             "</function>\n</tool_call>",
             "", 1, c1);
    /* values that do not parse, or parse to a type the schema refuses,
     * become strings */
    const char *c2[] = {"read_file|{\"offset\": \"ten\", \"follow\": \"yes\", \"note\": \"5\", \"opts\": \"{bad\", "
                        "\"any\": \"plain words\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<function=read_file>\n<parameter=offset>\nten\n</parameter>\n<parameter=follow>\nyes\n</parameter>\n"
             "<parameter=note>\n5\n</parameter>\n<parameter=opts>\n{bad\n</parameter>\n"
             "<parameter=any>\nplain words\n</parameter>\n</function>\n</tool_call>",
             "", 1, c2);
}

TEST(qwen_xml_malformed) {
    use_schemas(true);
    /* an unknown function: the text is content, verbatim */
    const char *t1 = "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>";
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, t1, t1, 0, NULL);
    /* truncated before the name closes: content */
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "see <tool_call>\n<function=read_fi", "see <tool_call>\n<function=read_fi", 0,
             NULL);
    /* a newline inside the name: content */
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "<function=read\nfile>", "<function=read\nfile>", 0, NULL);
    /* a second opening tag: the first is content, the second a call */
    const char *c1[] = {"run_shell|{\"command\": \"ls\"}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3,
             "<tool_call>\n<tool_call>\n<function=run_shell>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>",
             "<tool_call>", 1, c1);
    /* truncated inside a value: committed, incomplete, invalid */
    const char *c2[] = {"read_file|{\"path\": \"src/ma|0"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/ma</para", "", 1, c2);
    /* text where a parameter should start: the call is invalid, the rest content */
    const char *c3[] = {"read_file|{|0"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "<tool_call>\n<function=read_file>\nhello</function>", "hello</function>", 1,
             c3);
    /* partial tags at the end are content */
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "a < b <tool_c", "a < b <tool_c", 0, NULL);
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "x <functio", "x <functio", 0, NULL);
    /* no closing </tool_call>: text after the call is content */
    const char *c4[] = {"run_shell|{}|1"};
    check_tc(NS_TOOLFMT_QWEN_XML, TOOLS, 3, "<tool_call><function=run_shell></function> and </tool_ca more",
             "and </tool_ca more", 1, c4);
}

TEST(mistral_formats) {
    use_schemas(false);
    /* v3: a JSON array after the marker */
    const char *c1[] = {"read_file|{\"path\": \"a.c\"}|1", "run_shell|{\"command\": \"ls -l\"}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3,
             "[TOOL_CALLS] [{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.c\"}, \"id\": \"abc123XYZ\"}, "
             "{\"name\": \"run_shell\", \"arguments\": {\"command\": \"ls -l\"}, \"id\": \"Zz9Zz9Zz9\"}]",
             "", 2, c1);
    /* v13: name[ARGS]{...}, one marker per call, content before */
    const char *c2[] = {"read_file|{\"path\": \"a.c\"}|1", "run_shell|{\"command\": \"echo \\\"}]\\\"\"}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3,
             "Let me check. [TOOL_CALLS]read_file[ARGS]{\"path\": \"a.c\"}[TOOL_CALLS]run_shell[ARGS]"
             "{\"command\": \"echo \\\"}]\\\"\"}",
             "Let me check.", 2, c2);
    /* [CALL_ID] between name and [ARGS]; v11: the arguments right after the name */
    const char *c3[] = {"read_file|{\"path\": \"a.c\", \"n\": [1, {\"m\": 2}]}|1", "run_shell|{}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3,
             "[TOOL_CALLS]read_file[CALL_ID]abc123XYZ[ARGS]{\"path\": \"a.c\", \"n\": [1, {\"m\": 2}]}"
             "[TOOL_CALLS]run_shell{}",
             "", 2, c3);
    /* arguments as a JSON-encoded string in the array layout */
    const char *c4[] = {"run_shell|{\"command\": \"pwd\"}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, NULL, 0,
             "[TOOL_CALLS][{\"name\": \"run_shell\", \"arguments\": \"{\\\"command\\\": \\\"pwd\\\"}\"}]", "", 1, c4);
}

TEST(mistral_malformed) {
    use_schemas(false);
    /* unknown tool: content */
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS]rm_rf[ARGS]{}", "[TOOL_CALLS]rm_rf[ARGS]{}", 0, NULL);
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS] [{\"name\": \"rm_rf\", \"arguments\": {}}]",
             "[TOOL_CALLS] [{\"name\": \"rm_rf\", \"arguments\": {}}]", 0, NULL);
    /* a marker that is not a call, brackets in text */
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "a[0] = [TOOL] [TOOL_CALLS]read_file[ARGX]",
             "a[0] = [TOOL] [TOOL_CALLS]read_file[ARGX]", 0, NULL);
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "x [TOOL_CAL", "x [TOOL_CAL", 0, NULL);
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS] hello world", "[TOOL_CALLS] hello world", 0, NULL);
    /* a second marker inside [ARGS] matching: the first is content */
    const char *c0[] = {"run_shell|{}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS]run_shell[AR[TOOL_CALLS]run_shell[ARGS]{}",
             "[TOOL_CALLS]run_shell[AR", 1, c0);
    /* truncated arguments: committed, invalid */
    const char *c1[] = {"read_file|{\"path\": \"a|0"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS]read_file[ARGS]{\"path\": \"a", "", 1, c1);
    /* arguments not an object */
    const char *c2[] = {"read_file||0"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS]read_file[ARGS]\"x\"", "\"x\"", 1, c2);
    const char *c3[] = {"read_file|[1]|0"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS] [{\"name\": \"read_file\", \"arguments\": [1]}]", "", 1, c3);
    /* an unclosed array after a call */
    const char *c4[] = {"run_shell|{}|1"};
    check_tc(NS_TOOLFMT_MISTRAL, TOOLS, 3, "[TOOL_CALLS] [{\"name\": \"run_shell\"}, oops", "oops", 1, c4);
}

/* Random outputs: well-formed calls of every format, cut short, with
 * pieces of tags and JSON inserted, between bits of text. Whatever the
 * input, the final state does not depend on the fragmentation, the stream
 * is monotone, and every call marked valid has a JSON object as
 * arguments. */
static const char *const CALLS[] = {
    "<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/a.c\n</parameter>\n<parameter=offset>\n3\n</parameter>\n"
    "</function>\n</tool_call>",
    "<function=run_shell>\n<parameter=command>\nls \"x\"\n</parameter>\n</function>",
    "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>",
    "[TOOL_CALLS]read_file[ARGS]{\"path\": \"a\", \"n\": [1, {\"b\": \"}\"}]}",
    "[TOOL_CALLS] [{\"name\": \"run_shell\", \"arguments\": {\"command\": \"pwd\"}, \"id\": \"abcdefghi\"}]",
    "[TOOL_CALLS]run_shell[CALL_ID]abc123XYZ[ARGS]{}",
    "{\"name\": \"run_shell\", \"parameters\": {\"command\": \"ls\"}}",
};
static const char *const PIECES[] = {
    "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", "[TOOL_CALLS]",
    "[ARGS]", "[CALL_ID]", "read_file", ">", "\n", " ", "{", "}", "[", "]", "\"", ",", "\\", "True", "<", "</",
    ";", "text", "\xc3\xa9"};

static void random_output(char *text, size_t cap) {
    text[0] = 0;
    int n = 1 + (int)(rnd() % 4);
    for (int i = 0; i < n; i++) {
        char part[512];
        snprintf(part, sizeof part, "%s", CALLS[rnd() % (sizeof CALLS / sizeof CALLS[0])]);
        size_t pl = strlen(part);
        switch (rnd() % 4) {
        case 0: /* cut short */
            part[rnd() % (pl + 1)] = 0;
            break;
        case 1: { /* a piece inserted somewhere */
            char tmp[sizeof part];
            size_t at = rnd() % (pl + 1);
            snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)at, part, PIECES[rnd() % (sizeof PIECES / sizeof PIECES[0])],
                     part + at);
            snprintf(part, sizeof part, "%s", tmp);
            break;
        }
        case 2: /* a byte dropped */
            if (pl) {
                size_t at = rnd() % pl;
                memmove(part + at, part + at + 1, pl - at);
            }
            break;
        default: /* intact */
            break;
        }
        if (rnd() % 2) strncat(text, PIECES[rnd() % (sizeof PIECES / sizeof PIECES[0])], cap - strlen(text) - 1);
        strncat(text, part, cap - strlen(text) - 1);
    }
}

TEST(random_outputs_are_consistent) {
    static const ns_toolfmt fmts[] = {NS_TOOLFMT_QWEN_XML, NS_TOOLFMT_MISTRAL, NS_TOOLFMT_HERMES, NS_TOOLFMT_LLAMA_JSON};
    use_schemas(true);
    static tc_res w, r;
    static size_t cuts[2048];
    int bad = 0, n_calls = 0, n_valid = 0;
    for (int iter = 0; iter < 600; iter++) {
        char text[2048];
        random_output(text, sizeof text);
        ns_toolfmt fmt = fmts[iter % 4];
        const char *const *names = iter % 3 ? TOOLS : NULL;
        int nn = iter % 3 ? 3 : 0;
        run_tc(&w, fmt, names, nn, text, NULL, 0);
        n_calls += w.n_calls;
        for (int i = 0; i < w.n_calls && i < MAXC; i++) {
            n_valid += w.valid[i];
            if (!w.valid[i]) continue;
            json_error_t je;
            json_t *v = json_loads(w.args[i], 0, &je);
            if (!json_is_object(v) && bad++ < 3) CHECKF(0, "valid call with args [%s] from [%s]", w.args[i], text);
            json_decref(v);
        }
        size_t len = strlen(text);
        for (int k = 0; k < 4 && len > 1; k++) {
            int nc = 0;
            for (size_t c = 1 + rnd() % 3; c < len && nc < 2048; c += 1 + rnd() % (k == 0 ? 1 : 6)) cuts[nc++] = c;
            run_tc(&r, fmt, names, nn, text, cuts, nc);
            if ((!tc_same(&w, &r) || r.violations || w.violations) && bad++ < 3)
                CHECKF(0, "fmt %d: a split run differs on [%s]: [%s] vs [%s]", fmt, text, w.content, r.content);
        }
    }
    CHECK_EQ_INT(bad, 0);
    printf("# 600 random outputs: %d calls committed, %d valid\n", n_calls, n_valid);
    CHECK(n_valid > 100); /* the mixes do reach the call paths */
}

/* ---------- templates ---------- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}

static char *fixture_template(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s", name);
    return read_text(test_shared_path(rel));
}

/* The chat template of a model directory under fixtures/models. */
static char *model_template(const char *model) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s/tokenizer_config.json", model);
    json_error_t je;
    json_t *cfg = json_load_file(test_shared_path(rel), JSON_DECODE_INT_AS_REAL, &je); /* model_max_length is huge */
    const char *t = json_string_value(json_object_get(cfg, "chat_template"));
    char *out = t ? strdup(t) : NULL;
    json_decref(cfg);
    return out;
}

TEST(template_detection) {
    static const struct { const char *file; ns_toolfmt want; } k[] = {
        {"qwen3-coder.jinja", NS_TOOLFMT_QWEN_XML},
        {"mistral-v3.jinja", NS_TOOLFMT_MISTRAL},
        {"mistral-v13.jinja", NS_TOOLFMT_MISTRAL},
        {"llama31-tools.jinja", NS_TOOLFMT_LLAMA_JSON},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char *src = fixture_template(k[i].file);
        CHECKF(src != NULL, "%s", k[i].file);
        CHECKF(ns_toolfmt_detect(src) == k[i].want, "%s: %s", k[i].file, ns_toolfmt_name(ns_toolfmt_detect(src)));
        free(src);
    }
    /* the real Qwen3 (Hermes) and Llama 3.1 templates of the fixture models */
    char *q = model_template("tiny-qwen3"), *l = model_template("tiny-llama3");
    CHECK(q && ns_toolfmt_detect(q) == NS_TOOLFMT_HERMES);
    CHECK(l && ns_toolfmt_detect(l) == NS_TOOLFMT_LLAMA_JSON);
    free(q);
    free(l);
    CHECK(ns_toolfmt_detect(NULL) == NS_TOOLFMT_NONE);
    CHECK_EQ_STR(ns_toolfmt_name(NS_TOOLFMT_QWEN_XML), "qwen-xml");
    CHECK_EQ_STR(ns_toolfmt_name(NS_TOOLFMT_MISTRAL), "mistral");
}

static const char ROUND_ARGS[] =
    "{\"path\": \"dir/a \\\"b\\\".c\\n\", \"offset\": 3, \"ratio\": 0.25, \"follow\": true, \"opts\": {\"k\": [1, \"v\"]},"
    " \"lines\": [4, 5], \"note\": null, \"mode\": \"w\"}";

/* Renders an assistant turn with two calls through template `file`, cuts
 * the model's output out of it (between `begin` and `end`) and parses it
 * back: the arguments must be the ones rendered. */
static void round_trip(const char *file, ns_toolfmt fmt, const char *begin, const char *end) {
    char *src = fixture_template(file);
    CHECKF(src != NULL, "%s", file);
    if (!src) return;
    ns_template *t = NULL;
    ns_error err = {0};
    CHECKF(ns_template_parse(src, strlen(src), &t, &err) == NS_OK, "%s: %s", file, err.msg);
    json_error_t je;
    json_t *args = json_loads(ROUND_ARGS, 0, &je);
    json_t *ctx = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:[{s:s,s:s,s:{s:s,s:O}},{s:s,s:s,s:{s:s,s:{s:s}}}]}],s:s,s:s}",
                            "messages", "role", "user", "content", "hi", "role", "assistant", "content", "",
                            "tool_calls", "id", "abcDEF123", "type", "function", "function", "name", "read_file",
                            "arguments", args, "id", "XYZ987abc", "type", "function", "function", "name", "run_shell",
                            "arguments", "command", "ls </parameter", "bos_token", "<s>", "eos_token", "</s>");
    char *out = NULL;
    if (t && ctx) CHECKF(ns_template_render(t, ctx, 0, &out, NULL, &err) == NS_OK, "%s: %s", file, err.msg);
    const char *b = out ? strstr(out, begin) : NULL;
    const char *e = b ? strstr(b + strlen(begin), end) : NULL;
    CHECKF(b && e, "%s rendered: %s", file, out ? out : "(null)");
    if (b && e) {
        b += strlen(begin);
        ns_toolparse p;
        ns_toolparse_init(&p, fmt, NULL, 0, 7);
        json_t *tools = json_loads(SCHEMAS, 0, &je);
        ns_toolparse_set_schemas(&p, tools);
        json_decref(tools);
        ns_toolparse_feed(&p, b, (size_t)(e - b));
        ns_toolparse_finish(&p);
        CHECKF(p.n_calls == 2 && ns_toolparse_all_valid(&p) && p.content.len == 0, "%s: %d calls, content [%s]", file,
               p.n_calls, p.content.data ? p.content.data : "");
        for (int i = 0; i < p.n_calls && i < 2; i++) {
            json_t *got = json_loads(p.calls[i].args.data ? p.calls[i].args.data : "", 0, &je);
            json_t *want = i == 0 ? json_incref(args) : json_pack("{s:s}", "command", "ls </parameter");
            CHECKF(json_equal(got, want), "%s call %d: %s", file, i, p.calls[i].args.data);
            json_decref(got);
            json_decref(want);
        }
        CHECK(p.n_calls < 2 || (strcmp(p.calls[0].name.data, "read_file") == 0 &&
                                strcmp(p.calls[1].name.data, "run_shell") == 0));
        ns_toolparse_free(&p);
    }
    free(out);
    json_decref(ctx);
    json_decref(args);
    ns_template_free(t);
    free(src);
}

TEST(template_round_trip) {
    round_trip("qwen3-coder.jinja", NS_TOOLFMT_QWEN_XML, "<|im_start|>assistant", "<|im_end|>");
    round_trip("mistral-v3.jinja", NS_TOOLFMT_MISTRAL, "[/INST]", "</s>");
    round_trip("mistral-v13.jinja", NS_TOOLFMT_MISTRAL, "[/INST]", "</s>");
}

int main(void) {
    RUN(qwen_xml_basic);
    RUN(qwen_xml_strings);
    RUN(qwen_xml_typing);
    RUN(qwen_xml_malformed);
    RUN(mistral_formats);
    RUN(mistral_malformed);
    RUN(random_outputs_are_consistent);
    RUN(template_detection);
    RUN(template_round_trip);
    use_schemas(false);
    TEST_MAIN_END;
}
