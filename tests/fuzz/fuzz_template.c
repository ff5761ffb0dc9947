/* fuzz_template — the Jinja2-subset engine: parse a template source, render
 * it with a JSON context.
 *
 * Input: byte 0 picks the template: % 3 == 0 the rest up to the first NUL
 * is the template source (fuzzed), 1 the chat template of tiny-qwen3, 2 the
 * one of tiny-llama3 (real templates, fuzzed contexts). The context is the
 * JSON after the first NUL (mode 0) or the whole rest (modes 1 and 2); a
 * context that is not a JSON object renders with an empty context.
 *
 * Oracles: parse and render either succeed or fail with a status and a
 * message; output is NUL-terminated, its length as reported, within
 * max_output; a parsed template renders twice to the same result (it is
 * immutable). Limits keep hostile templates bounded (steps, depth, output,
 * see template.h); libFuzzer's -timeout catches anything slower. */
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "fuzz_common.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

#define MAX_OUTPUT ((size_t)64 << 10)

static ns_template *g_chat[2];
static bool g_chat_timeless[2]; /* no strftime_now: renders are reproducible */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    static const char *names[2] = {"tiny-qwen3", "tiny-llama3"};
    for (int i = 0; i < 2; i++) {
        ns_tokenizer *tok = NULL;
        ns_error err = {0};
        const char *src;
        if (ns_tokenizer_load(fuzz_model_dir(names[i]), &tok, &err) != NS_OK ||
            !(src = ns_tokenizer_chat_template(tok, NULL)) ||
            ns_template_parse(src, strlen(src), &g_chat[i], &err) != NS_OK) {
            fprintf(stderr, "fuzz_template: %s: %s\n", names[i], err.msg);
            exit(1);
        }
        g_chat_timeless[i] = !strstr(src, "strftime");
        ns_tokenizer_free(tok);
    }
    return 0;
}

/* Renders t with ctx; when timeless, a second render must give the same
 * result (a parsed template is immutable; strftime_now is the only clock). */
static void render_checked(const ns_template *t, const json_t *ctx, bool timeless) {
    char *out = NULL, *out2 = NULL;
    size_t len = 0, len2 = 0;
    ns_error err = {0}, err2 = {0};
    ns_status st = ns_template_render(t, ctx, MAX_OUTPUT, &out, &len, &err);
    if (st != NS_OK) {
        FUZZ_CHECK(err.msg[0] != 0);
        free(out); /* (NULL on failure; ASan's leak check sees the rest) */
        out = NULL;
    } else {
        FUZZ_CHECK(out != NULL && len <= MAX_OUTPUT && out[len] == 0);
    }
    if (!timeless) {
        free(out);
        return;
    }
    ns_status st2 = ns_template_render(t, ctx, MAX_OUTPUT, &out2, &len2, &err2);
    FUZZ_CHECK(st2 == st);
    if (st == NS_OK) FUZZ_CHECK(len2 == len && memcmp(out, out2, len) == 0);
    else FUZZ_CHECK(strcmp(err.msg, err2.msg) == 0);
    free(out);
    free(out2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 3;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    const char *ctx_text = p;
    size_t ctx_len = n;
    ns_template *own = NULL;
    const ns_template *t;
    bool timeless;
    if (mode == 0) {
        const char *nul = memchr(p, 0, n);
        size_t src_len = nul ? (size_t)(nul - p) : n;
        ctx_text = nul ? nul + 1 : "";
        ctx_len = nul ? n - src_len - 1 : 0;
        ns_error err = {0};
        if (ns_template_parse(p, src_len, &own, &err) != NS_OK) {
            FUZZ_CHECK(own == NULL && err.msg[0] != 0);
            return 0;
        }
        t = own;
        timeless = !memmem(p, src_len, "strftime", 8);
    } else {
        t = g_chat[mode - 1];
        timeless = g_chat_timeless[mode - 1];
    }
    json_error_t je;
    json_t *ctx = ctx_len ? json_loadb(ctx_text, ctx_len, JSON_DECODE_ANY, &je) : NULL;
    if (ctx && !json_is_object(ctx)) {
        json_decref(ctx);
        ctx = NULL;
    }
    render_checked(t, ctx, timeless);
    json_decref(ctx);
    ns_template_free(own);
    return 0;
}
