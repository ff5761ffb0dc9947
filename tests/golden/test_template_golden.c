/* test_template_golden.c — renders every case of the template goldens
 * (tests/fixtures/goldens/template-*.json: transformers' apply_chat_template
 * output for tiny-qwen3 and tiny-llama3) and requires byte-identical text,
 * or a refusal where transformers raised.
 *
 * The context mirrors what apply_chat_template hands the template: messages,
 * add_generation_prompt, the tokenizer's special tokens as strings, tools
 * when given, and the case's extra kwargs merged at top level.
 */
#include <jansson.h>

#include "template/template.h"
#include "test.h"

/* tokenizer_config special tokens are strings or {"content": ...} objects */
static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* Returns the template source: "chat_template" is a string or a list of
 * {"name", "template"} entries of which "default" is used. */
static const char *chat_template(const json_t *cfg) {
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) return json_string_value(ct);
    size_t i;
    const json_t *e;
    json_array_foreach(ct, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && strcmp(name, "default") == 0) return json_string_value(json_object_get(e, "template"));
    }
    return NULL;
}

static json_t *make_context(const json_t *cfg, const json_t *c) {
    json_t *ctx = json_object();
    json_object_set(ctx, "messages", json_object_get(c, "messages"));
    const json_t *tools = json_object_get(c, "tools");
    if (tools && !json_is_null(tools)) json_object_set(ctx, "tools", (json_t *)tools);
    json_object_set(ctx, "add_generation_prompt", json_object_get(c, "add_generation_prompt"));
    static const char *const specials[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        const char *tok = token_text(json_object_get(cfg, specials[i]));
        if (tok) json_object_set_new(ctx, specials[i], json_string(tok));
    }
    const json_t *kw = json_object_get(c, "kwargs");
    if (json_is_object(kw)) json_object_update(ctx, (json_t *)kw);
    return ctx;
}

/* Prints where two renders first differ, with a little context. */
static void report_diff(const char *got, size_t got_len, const char *want) {
    size_t wl = strlen(want), i = 0, line = 1, col = 1;
    while (i < got_len && i < wl && got[i] == want[i]) {
        if (got[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
        i++;
    }
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stdout, "#     first difference at byte %zu (line %zu, col %zu); got %zu bytes, want %zu\n", i, line, col,
            got_len, wl);
    fprintf(stdout, "#     got:  ...%.*s|%.*s\n", (int)(i - from), got + from, (int)(got_len - i < 60 ? got_len - i : 60),
            got + i);
    fprintf(stdout, "#     want: ...%.*s|%.*s\n", (int)(i - from), want + from, (int)(wl - i < 60 ? wl - i : 60),
            want + i);
}

static void run_golden(const char *model) {
    char path[512];
    json_error_t je;
    snprintf(path, sizeof path, "models/%s/tokenizer_config.json", model);
    /* configs may hold integers beyond 64 bits (model_max_length): read
     * numbers as reals, only strings are used from this file */
    json_t *cfg = json_load_file(test_shared_path(path), JSON_DECODE_INT_AS_REAL, &je);
    CHECKF(cfg != NULL, "%s: %s", path, je.text);
    snprintf(path, sizeof path, "goldens/template-%s.json", model);
    json_t *gold = json_load_file(test_shared_path(path), 0, &je);
    CHECKF(gold != NULL, "%s: %s", path, je.text);
    if (!cfg || !gold) goto cleanup;
    const char *src = chat_template(cfg);
    CHECK(src != NULL);
    if (!src) goto cleanup;
    ns_template *t = NULL;
    ns_error err = {0};
    ns_status st = ns_template_parse(src, strlen(src), &t, &err);
    CHECKF(st == NS_OK, "%s: parse: %s", model, err.msg);
    if (st != NS_OK) goto cleanup;
    const json_t *cases = json_object_get(gold, "cases");
    CHECK(json_array_size(cases) > 0);
    size_t i;
    const json_t *c;
    int passed = 0;
    json_array_foreach(cases, i, c) {
        json_t *ctx = make_context(cfg, c);
        char *out = NULL;
        size_t len = 0;
        st = ns_template_render(t, ctx, 0, &out, &len, &err);
        const json_t *want = json_object_get(c, "rendered");
        if (json_is_string(want)) {
            CHECKF(st == NS_OK, "%s case %zu: render failed: %s", model, i, err.msg);
            if (st == NS_OK) {
                int same = len == json_string_length(want) && memcmp(out, json_string_value(want), len) == 0;
                CHECKF(same, "%s case %zu: output differs", model, i);
                if (!same) report_diff(out, len, json_string_value(want));
                passed += same;
            }
        } else {
            /* transformers raised: the engine must refuse as well */
            CHECKF(st != NS_OK, "%s case %zu: rendered but transformers raised %s", model, i,
                   json_string_value(json_object_get(c, "error")));
            passed += st != NS_OK;
        }
        free(out);
        json_decref(ctx);
    }
    fprintf(stdout, "#   %s: %d/%zu golden cases match\n", model, passed, json_array_size(cases));
    ns_template_free(t);
cleanup:
    json_decref(cfg);
    json_decref(gold);
}

TEST(golden_tiny_qwen3) { run_golden("tiny-qwen3"); }
TEST(golden_tiny_llama3) { run_golden("tiny-llama3"); }

int main(void) {
    RUN(golden_tiny_qwen3);
    RUN(golden_tiny_llama3);
    TEST_MAIN_END;
}
