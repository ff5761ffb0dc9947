/* api/structured.c: the grammars it builds for a request, checked on the
 * texts they must accept and reject — JSON Schema answers, the reasoning
 * block of thinking models (optional, already open, switched off), forced
 * tool calls in the Hermes and Llama 3 syntaxes (offered tools only, the
 * named one only, one call with max_calls 1) — and its errors (unknown
 * keyword named, unknown named tool, ignore_eos, a model without a
 * tool-call format), on the real tiny-qwen3 tokenizer and config. */
#include <jansson.h>

#include "api/structured.h"
#include "api/toolcall.h"
#include "grammar/gmatch.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static ns_api g_api;

static bool setup(void) {
    if (g_api.tok) return true;
    ns_error err = {0};
    ns_api_init(&g_api, "tiny-qwen3");
    ns_tokenizer *tok = NULL;
    const char *dir = test_shared_path("models/tiny-qwen3");
    if (ns_tokenizer_load(dir, &tok, &err) != NS_OK || ns_config_load(dir, &g_api.cfg, &err) != NS_OK) {
        printf("# %s\n", err.msg);
        return false;
    }
    g_api.tok = tok;
    g_api.toolfmt = NS_TOOLFMT_HERMES;
    g_api.reasoning = true;
    return true;
}

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}]";

/* Attaches spec with the given options; the matcher, or NULL with e set. */
static ns_gmatch *attach(const ns_struct_spec *sp, ns_gen_opts *o, ns_http_error *e) {
    memset(e, 0, sizeof *e);
    o->rp.grammar = NULL;
    if (!ns_structured_attach(&g_api, sp, o, e)) return NULL;
    return o->rp.grammar;
}

static bool accepts(ns_gmatch *m, const char *text) {
    ns_gmatch_reset(m);
    return ns_gmatch_accept_bytes(m, text, strlen(text)) && ns_gmatch_can_end(m);
}

#define ACCEPT(m, s) CHECKF(accepts(m, s), "should accept: %s", s)
#define REJECT(m, s) CHECKF(!accepts(m, s), "should reject: %s", s)

TEST(schema_answer_and_reasoning_block) {
    if (!setup()) return;
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}",
                                0, NULL);
    ns_struct_spec sp = {.kind = NS_STRUCT_JSON_SCHEMA, .schema = schema};
    ns_http_error e;
    ns_gen_opts o = {.reasoning = true};
    ns_gmatch *m = attach(&sp, &o, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        ACCEPT(m, "{\"x\": 1}");
        ACCEPT(m, "<think>\nLet me think: {\"x\" is < 2 </thin </think>\n\n{\"x\":2}");
        REJECT(m, "<think>no end {\"x\":1}");
        REJECT(m, "<think></think></think>{\"x\":1}");
        REJECT(m, "{\"x\":1} trailing");
        ns_structured_detach(&o);
    }
    /* the prompt opened <think>: free text up to </think> first */
    ns_gen_opts o2 = {.reasoning = true, .in_think = true};
    m = attach(&sp, &o2, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        ACCEPT(m, "some thoughts</think>\n{\"x\":3}");
        ACCEPT(m, "some thoughts</think>\n\n{\"x\":3}");
        REJECT(m, "some thoughts</think>\n\n\n\n{\"x\":3}"); /* bounded */
        REJECT(m, "{\"x\":3}");
        ns_structured_detach(&o2);
    }
    /* thinking switched off (the prompt closed an empty block): at once */
    ns_gen_opts oc = {.reasoning = true, .think_closed = true};
    m = attach(&sp, &oc, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        REJECT(m, "<think></think>{\"x\":1}");
        ACCEPT(m, "{\"x\":5}");
        ns_structured_detach(&oc);
    }
    /* no reasoning: the answer at once */
    ns_gen_opts o3 = {0};
    m = attach(&sp, &o3, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        REJECT(m, "<think></think>{\"x\":1}");
        ACCEPT(m, "{\"x\":-4}");
        ns_structured_detach(&o3);
    }
    json_decref(schema);
}

TEST(forced_tool_calls_hermes_and_llama) {
    if (!setup()) return;
    json_t *tools = json_loads(k_tools, 0, NULL);
    ns_http_error e;
    ns_struct_spec req = {.kind = NS_STRUCT_TOOL_REQUIRED, .tools = tools};
    ns_gen_opts o = {.toolfmt = NS_TOOLFMT_HERMES};
    ns_gmatch *m = attach(&req, &o, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        ACCEPT(m, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
        ACCEPT(m, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>\n<tool_call>{\"name\":\"add\","
                  "\"arguments\":{\"a\":2}}</tool_call>");
        REJECT(m, "");                                                               /* at least one call */
        REJECT(m, "Sure! <tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>"); /* no text */
        REJECT(m, "<tool_call>{\"name\":\"sub\",\"arguments\":{\"a\":1}}</tool_call>");    /* not offered */
        REJECT(m, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"town\":\"x\"}}</tool_call>");
        ns_structured_detach(&o);
    }
    /* named, Llama 3 JSON */
    ns_struct_spec named = {.kind = NS_STRUCT_TOOL_NAMED, .tools = tools, .tool_name = "add"};
    ns_gen_opts ol = {.toolfmt = NS_TOOLFMT_LLAMA_JSON};
    m = attach(&named, &ol, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        ACCEPT(m, "{\"name\": \"add\", \"parameters\": {\"a\": 5}}");
        REJECT(m, "{\"name\": \"add\", \"parameters\": {\"a\": 5}}; {\"name\": \"add\", \"parameters\": {\"a\": 6}}");
        REJECT(m, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}");
        REJECT(m, "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 5}}</tool_call>");
        ns_structured_detach(&ol);
    }
    /* max_calls 1 (parallel_tool_calls false) */
    ns_gen_opts o1 = {.toolfmt = NS_TOOLFMT_HERMES, .max_calls = 1};
    m = attach(&req, &o1, &e);
    CHECKF(m, "%s", e.message);
    if (m) {
        ACCEPT(m, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>");
        REJECT(m, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call><tool_call>{\"name\":\"add\","
                  "\"arguments\":{\"a\":2}}</tool_call>");
        ns_structured_detach(&o1);
    }
    json_decref(tools);
}

/* Qwen3-Coder XML: string parameters raw, others JSON, and the tool-call
 * parser reads an accepted call back as valid arguments */
TEST(forced_tool_calls_qwen_xml) {
    if (!setup()) return;
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"a city\"},\"unit\":{\"enum\":[\"c\",\"f\"]},"
        "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7},\"opts\":{\"$ref\":\"#/$defs/o\"}},"
        "\"required\":[\"city\",\"unit\"],\"$defs\":{\"o\":{\"type\":\"object\",\"properties\":{\"x\":"
        "{\"type\":\"boolean\"}},\"required\":[\"x\"],\"additionalProperties\":false}}}}}]",
        0, NULL);
    CHECK(tools != NULL);
    ns_http_error e;
    ns_struct_spec req = {.kind = NS_STRUCT_TOOL_REQUIRED, .tools = tools};
    ns_gen_opts o = {.toolfmt = NS_TOOLFMT_QWEN_XML};
    ns_gmatch *m = attach(&req, &o, &e);
    CHECKF(m, "%s", e.message);
    const char *good = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York <b> \"x\"\nline 2\n</parameter>\n"
                       "<parameter=unit>\nc\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n"
                       "{\"x\": true}\n</parameter>\n</function>\n</tool_call>";
    if (m) {
        ACCEPT(m, good);
        ACCEPT(m, "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n</parameter>\n<parameter=unit>\nf\n"
                  "</parameter>\n</function>\n</tool_call>");
        REJECT(m, "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>");
        REJECT(m, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=unit>\nk\n"
                  "</parameter>\n</function>\n</tool_call>");
        REJECT(m, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=unit>\nc\n"
                  "</parameter>\n<parameter=days>\n9\n</parameter>\n</function>\n</tool_call>");
        REJECT(m, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\x01\n</parameter>\n<parameter=unit>\nc\n"
                  "</parameter>\n</function>\n</tool_call>");
        ns_structured_detach(&o);
    }
    ns_toolparse tp;
    CHECK(ns_toolparse_init(&tp, NS_TOOLFMT_QWEN_XML, NULL, 0, 1) == NS_OK);
    CHECK(ns_toolparse_set_schemas(&tp, tools) == NS_OK);
    CHECK(ns_toolparse_feed(&tp, good, strlen(good)) == NS_OK && ns_toolparse_finish(&tp) == NS_OK);
    CHECK_EQ_INT(tp.n_calls, 1);
    if (tp.n_calls == 1) {
        json_t *args = json_loadb(tp.calls[0].args.data, tp.calls[0].args.len, 0, NULL);
        CHECKF(tp.calls[0].valid && args, "%.*s", (int)tp.calls[0].args.len, tp.calls[0].args.data);
        CHECK(json_is_string(json_object_get(args, "city")) &&
              !strcmp(json_string_value(json_object_get(args, "city")), "New York <b> \"x\"\nline 2"));
        CHECK(json_integer_value(json_object_get(args, "days")) == 3);
        CHECK(json_is_true(json_object_get(json_object_get(args, "opts"), "x")));
        json_decref(args);
    }
    ns_toolparse_free(&tp);
    /* a constraint raw text cannot carry: named */
    json_t *t2 = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
                            "\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":3}}}}}]",
                            0, NULL);
    ns_struct_spec r2 = {.kind = NS_STRUCT_TOOL_REQUIRED, .tools = t2};
    CHECK(!attach(&r2, &o, &e));
    CHECKF(strstr(e.message, "'maxLength'") != NULL, "%s", e.message);
    ns_http_error_clear(&e);
    json_decref(t2);
    json_decref(tools);
}

TEST(errors_name_the_problem) {
    if (!setup()) return;
    json_t *tools = json_loads(k_tools, 0, NULL);
    json_t *bad = json_loads("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"}}}", 0, NULL);
    ns_http_error e;
    ns_struct_spec sp = {.kind = NS_STRUCT_JSON_SCHEMA, .schema = bad};
    ns_gen_opts o = {0};
    CHECK(!attach(&sp, &o, &e));
    CHECK_EQ_INT(e.status, 400);
    CHECK_EQ_STR(e.param, "response_format");
    CHECK_EQ_STR(e.code, "unsupported_schema");
    CHECKF(strstr(e.message, "'format' at #/properties/d") != NULL, "%s", e.message);
    ns_http_error_clear(&e);
    /* a tool whose parameters use an unsupported keyword: param tools */
    json_t *t2 = json_pack("[{s:s,s:{s:s,s:O}}]", "type", "function", "function", "name", "f", "parameters", bad);
    ns_struct_spec st = {.kind = NS_STRUCT_TOOL_REQUIRED, .tools = t2};
    ns_gen_opts oh = {.toolfmt = NS_TOOLFMT_HERMES};
    CHECK(!attach(&st, &oh, &e));
    CHECK_EQ_STR(e.param, "tools");
    CHECKF(strstr(e.message, "tool 'f'") != NULL, "%s", e.message);
    ns_http_error_clear(&e);
    ns_struct_spec named = {.kind = NS_STRUCT_TOOL_NAMED, .tools = tools, .tool_name = "nope"};
    CHECK(!attach(&named, &oh, &e));
    CHECK_EQ_STR(e.param, "tool_choice");
    ns_http_error_clear(&e);
    ns_struct_spec obj = {.kind = NS_STRUCT_JSON_OBJECT};
    ns_gen_opts oi = {.rp.ignore_eos = true};
    CHECK(!attach(&obj, &oi, &e));
    CHECK_EQ_STR(e.param, "ignore_eos");
    ns_http_error_clear(&e);
    /* no tool-call format at all */
    ns_toolfmt saved = g_api.toolfmt;
    g_api.toolfmt = NS_TOOLFMT_NONE;
    ns_struct_spec req = {.kind = NS_STRUCT_TOOL_REQUIRED, .tools = tools};
    ns_gen_opts on = {0};
    CHECK(!attach(&req, &on, &e));
    CHECK_EQ_STR(e.code, "tools_not_supported");
    ns_http_error_clear(&e);
    g_api.toolfmt = saved;
    /* NONE attaches nothing */
    ns_struct_spec none = {0};
    CHECK(ns_structured_attach(&g_api, &none, &on, &e) && on.rp.grammar == NULL);
    json_decref(t2);
    json_decref(bad);
    json_decref(tools);
}

TEST(response_format_and_tool_choice_parsing) {
    ns_http_error e = {0};
    ns_struct_spec sp;
    json_t *b = json_loads("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
                           "{\"type\":\"string\"},\"strict\":true}}}",
                           0, NULL);
    CHECK(ns_structured_response_format(b, &sp, &e) && sp.kind == NS_STRUCT_JSON_SCHEMA && json_is_object(sp.schema));
    json_decref(b);
    b = json_loads("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}", 0, NULL);
    CHECK(!ns_structured_response_format(b, &sp, &e));
    CHECK_EQ_STR(e.param, "response_format.json_schema.schema");
    ns_http_error_clear(&e);
    json_decref(b);
    b = json_loads("{\"response_format\":{\"type\":\"text\"},\"tool_choice\":{\"type\":\"function\",\"function\":"
                   "{\"name\":\"add\"}},\"tools\":[]}",
                   0, NULL);
    CHECK(ns_structured_response_format(b, &sp, &e) && sp.kind == NS_STRUCT_NONE);
    ns_structured_tool_choice(b, &sp);
    CHECK(sp.kind == NS_STRUCT_TOOL_NAMED && sp.tool_name && !strcmp(sp.tool_name, "add") && json_is_array(sp.tools));
    json_decref(b);
    b = json_loads("{\"tool_choice\":\"auto\"}", 0, NULL);
    ns_struct_spec sp2 = {0};
    ns_structured_tool_choice(b, &sp2);
    CHECK(sp2.kind == NS_STRUCT_NONE);
    json_decref(b);
}

int main(void) {
    RUN(schema_answer_and_reasoning_block);
    RUN(forced_tool_calls_hermes_and_llama);
    RUN(forced_tool_calls_qwen_xml);
    RUN(errors_name_the_problem);
    RUN(response_format_and_tool_choice_parsing);
    TEST_MAIN_END;
}
