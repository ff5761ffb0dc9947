/* The scheduler's grammar hook on the CPU backend (tiny-qwen3): rows
 * with a grammar sample only what it allows and end where it may end,
 * unconstrained rows of the same batches are untouched (identical to a
 * greedy run alone), and a request paused every few tokens produces the
 * same constrained tokens as an uninterrupted one (the matcher and its
 * precomputed mask survive the pause). */
#include <jansson.h>

#include "engine/runner.h"
#include "grammar/gmatch.h"
#include "grammar/gschema.h"
#include "grammar/gvocab_tok.h"
#include "sched/sched.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/utf8.h"

#define P 16

static ns_backend *g_be;
static ns_model *g_model;
static ns_gvocab *g_vocab;
static ns_grammar *g_gram;

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99},"
    "\"w\":{\"enum\":[\"cat\",\"dog\"]},\"s\":{\"type\":\"string\",\"maxLength\":3}},"
    "\"required\":[\"n\",\"w\"],\"additionalProperties\":false}";

static void setup(void) {
    ns_error err = {0};
    if (g_gram) return;
    if (ns_backend_cpu_create(2, &g_be, &err) != NS_OK) return;
    if (ns_model_load(test_shared_path("models/tiny-qwen3"), g_be, &g_model, &err) != NS_OK) {
        printf("# %s\n", err.msg);
        return;
    }
    ns_tokenizer *tok = NULL;
    if (ns_tokenizer_load(test_shared_path("models/tiny-qwen3"), &tok, &err) != NS_OK) {
        printf("# %s\n", err.msg);
        return;
    }
    const ns_model_config *c = &g_model->cfg;
    if (ns_gvocab_from_tokenizer(tok, c->vocab_size, c->eos_token_ids, c->n_eos, &g_vocab, &err) != NS_OK)
        printf("# %s\n", err.msg);
    ns_tokenizer_free(tok);
    if (!g_vocab) return;
    json_t *j = json_loads(k_schema, 0, NULL);
    ns_gnfa n;
    ns_gnfa_init(&n);
    uint32_t r = ns_gnfa_rule(&n), e;
    n.root = r;
    char msg[256];
    if (ns_gschema_emit(&n, j, r, &e, msg, sizeof msg)) {
        ns_gnfa_end(&n, ns_gnfa_ws(&n, e));
        if (ns_grammar_new(&n, g_vocab, &g_gram, &err) != NS_OK) printf("# %s\n", err.msg);
    } else {
        printf("# %s\n", msg);
    }
    ns_gnfa_free(&n);
    json_decref(j);
}

static ns_engine *make_engine(void) {
    ns_error err = {0};
    ns_engine *e = NULL;
    ns_engine_opts eo = {.max_batch_tokens = 256, .max_logits = 8, .page_tokens = P, .n_pages = 256, .kv_dtype = NS_DT_F32};
    if (ns_engine_create(g_model, &eo, &e, &err) != NS_OK) printf("# %s\n", err.msg);
    return e;
}

static ns_sched *make_sched(ns_engine *e) {
    ns_sched_opts so = {.max_batch_tokens = 256, .max_running = 8, .prefill_chunk = 64};
    ns_sched *s = NULL;
    ns_error err = {0};
    if (ns_sched_create(e, &so, &s, &err) != NS_OK || ns_sched_start(s, &err) != NS_OK) printf("# %s\n", err.msg);
    return s;
}

static void make_prompt(int32_t *out, int32_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 7;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        out[i] = 3 + (int32_t)((x >> 8) % 400);
    }
}

static ns_request *submit(ns_sched *s, const int32_t *prompt, int32_t n, float temp, uint64_t seed, bool grammar,
                          int32_t pause_every) {
    ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = 200, .test_pause_every = pause_every};
    p.sampling.temperature = temp;
    p.sampling.seed = seed;
    ns_error err = {0};
    if (grammar && ns_gmatch_new(g_gram, &p.grammar, &err) != NS_OK) return NULL;
    ns_request *r = ns_request_new(prompt, n, &p);
    ns_capacity cap;
    if (r && ns_sched_submit(s, r, &cap, &err) != NS_OK) printf("# submit: %s\n", err.msg);
    return r;
}

static int32_t collect(ns_request *r, int32_t *out, int32_t cap) {
    int32_t n = 0;
    bool done = false;
    ns_token_event ev[8];
    while (!done) {
        int k = ns_request_poll(r, ev, 8, 20000, &done);
        for (int i = 0; i < k; i++)
            if (n < cap) out[n++] = ev[i].token;
        if (k == 0 && !done) break;
    }
    return n;
}

/* The bytes of the tokens before a final EOS, checked against the schema
 * by hand (an independent reading of its rules). */
static bool valid_output(const int32_t *ids, int32_t n, char *text, size_t cap) {
    size_t l = 0;
    if (n < 1 || !ns_gvocab_is_eos(g_vocab, ids[n - 1])) return false;
    for (int32_t i = 0; i + 1 < n; i++) {
        uint32_t tl = g_vocab->len[ids[i]];
        if (tl == 0 || l + tl >= cap) return false;
        memcpy(text + l, g_vocab->bytes + g_vocab->off[ids[i]], tl);
        l += tl;
    }
    text[l] = 0;
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!json_is_object(j)) return false;
    bool ok = json_object_size(j) <= 3;
    json_t *nn = json_object_get(j, "n"), *w = json_object_get(j, "w"), *s = json_object_get(j, "s");
    ok &= json_is_integer(nn) && json_integer_value(nn) >= 0 && json_integer_value(nn) <= 99;
    ok &= json_is_string(w) && (!strcmp(json_string_value(w), "cat") || !strcmp(json_string_value(w), "dog"));
    ok &= !s || (json_is_string(s) && ns_utf8_count(json_string_value(s), json_string_length(s)) <= 3);
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) ok &= !strcmp(k, "n") || !strcmp(k, "w") || !strcmp(k, "s");
    json_decref(j);
    return ok;
}

TEST(grammar_rows_follow_it_and_others_are_untouched) {
    setup();
    if (!g_gram) return;
    ns_engine *e = make_engine();
    ns_sched *s = make_sched(e);
    if (!s) return;
    enum { NG = 5, NF = 2, L = 24 };
    int32_t prompts[NG + NF][L], out[NG + NF][256], n_out[NG + NF];
    ns_request *rs[NG + NF];
    for (int i = 0; i < NG + NF; i++) {
        make_prompt(prompts[i], L, (uint32_t)i + 1);
        rs[i] = submit(s, prompts[i], L, i < NG ? 1.0f : 0.0f, 100 + (uint64_t)i, i < NG, 0);
    }
    for (int i = 0; i < NG + NF; i++) {
        n_out[i] = rs[i] ? collect(rs[i], out[i], 256) : 0;
        ns_request_result res;
        if (rs[i]) ns_request_result_get(rs[i], &res);
        if (i < NG) {
            char text[4096];
            CHECKF(rs[i] && res.finish == NS_FINISH_EOS, "grammar request %d: finish %d (%s)", i, rs[i] ? (int)res.finish : -1,
                   rs[i] ? res.error : "");
            CHECKF(valid_output(out[i], n_out[i], text, sizeof text), "grammar request %d: %s", i, text);
        }
        ns_request_release(rs[i]);
    }
    ns_sched_stop(s);
    ns_sched_free(s);
    /* the unconstrained greedy rows equal the same requests alone */
    s = make_sched(e);
    for (int i = NG; i < NG + NF; i++) {
        ns_request *r = submit(s, prompts[i], L, 0.0f, 0, false, 0);
        int32_t alone[256];
        int32_t n = r ? collect(r, alone, 256) : -1;
        CHECK_EQ_INT(n, n_out[i]);
        CHECK(n > 0 && !memcmp(alone, out[i], (size_t)n * sizeof(int32_t)));
        ns_request_release(r);
    }
    ns_sched_stop(s);
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(paused_grammar_requests_resume_exactly) {
    setup();
    if (!g_gram) return;
    ns_engine *e = make_engine();
    int32_t prompt[20], a[256], b[256];
    make_prompt(prompt, 20, 99);
    ns_sched *s = make_sched(e);
    ns_request *r = submit(s, prompt, 20, 1.0f, 4242, true, 0);
    int32_t na = r ? collect(r, a, 256) : -1;
    ns_request_release(r);
    r = submit(s, prompt, 20, 1.0f, 4242, true, 3);
    int32_t nb = r ? collect(r, b, 256) : -2;
    ns_request_release(r);
    CHECK(na > 1);
    CHECK_EQ_INT(na, nb);
    CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof(int32_t)));
    char text[4096];
    CHECKF(valid_output(b, nb, text, sizeof text), "%s", text);
    ns_sched_stop(s);
    ns_sched_free(s);
    ns_engine_free(e);
}

int main(void) {
    RUN(grammar_rows_follow_it_and_others_are_untouched);
    RUN(paused_grammar_requests_resume_exactly);
    ns_grammar_release(g_gram);
    ns_gvocab_free(g_vocab);
    if (g_model) ns_model_free(g_model);
    if (g_be) g_be->ops->destroy(g_be);
    TEST_MAIN_END;
}
