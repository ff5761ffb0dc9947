/* test_prompt_diff.c — the cache-break analysis (record/prompt_diff.h) on
 * hand-made turns. The "rendering" here is a stand-in template written
 * for the test (one token per byte of "<role>content\n" per message, then
 * "<assistant>"), independent of the module: each case checks the
 * divergence point and cost against positions computed from that text,
 * and the reason against the edit that was made. */
#include "record/prompt_diff.h"

#include <stdlib.h>
#include <string.h>

#include "test.h"

typedef struct fake {
    char text[4096];
    int32_t ids[4096];
    size_t n;
} fake;

static void render(const json_t *items, fake *f) {
    f->text[0] = 0;
    size_t i;
    json_t *m;
    json_array_foreach(items, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        strcat(f->text, "<");
        strcat(f->text, role);
        strcat(f->text, ">");
        if (json_is_string(c)) strcat(f->text, json_string_value(c));
        const json_t *rc = json_object_get(m, "reasoning_content");
        /* the stand-in template shows reasoning only on the last message */
        if (json_is_string(rc) && i + 1 == json_array_size(items)) strcat(f->text, json_string_value(rc));
        strcat(f->text, "\n");
    }
    strcat(f->text, "<assistant>");
    f->n = strlen(f->text);
    for (size_t k = 0; k < f->n; k++) f->ids[k] = (unsigned char)f->text[k];
}

static json_t *msg(const char *role, const char *content) { return json_pack("{s:s,s:s}", "role", role, "content", content); }

typedef struct pair {
    json_t *pi, *ci, *pt, *ct;
    fake pf, cf;
    ns_pdiff_turn p, c;
    int32_t out_ids[256];
} pair;

/* P = items p (+ generated out), C = items c. */
static void setup(pair *x, json_t *p, json_t *c, const char *out, const char *out_reasoning) {
    memset(x, 0, sizeof *x);
    x->pi = p;
    x->ci = c;
    render(p, &x->pf);
    render(c, &x->cf);
    x->p = (ns_pdiff_turn){.items = p, .ids = x->pf.ids, .n_ids = x->pf.n, .text = x->pf.text,
                           .out_content = out, .out_reasoning = out_reasoning};
    x->c = (ns_pdiff_turn){.items = c, .ids = x->cf.ids, .n_ids = x->cf.n, .text = x->cf.text};
    if (out) { /* generated: reasoning then content then an end token (its KV never exists) */
        size_t n = 0;
        for (const char *s = out_reasoning ? out_reasoning : ""; *s; s++) x->out_ids[n++] = (unsigned char)*s;
        for (const char *s = out; *s; s++) x->out_ids[n++] = (unsigned char)*s;
        x->out_ids[n++] = '\n';
        x->p.out_ids = x->out_ids;
        x->p.n_out_ids = n;
    }
}

static void teardown(pair *x) {
    json_decref(x->pi);
    json_decref(x->ci);
}

static const ns_pdiff_reason *only_reason(const ns_pdiff_result *r) { return r->n_reasons == 1 ? &r->reasons[0] : NULL; }

TEST(append_only) {
    pair x;
    setup(&x, json_pack("[o,o]", msg("system", "S"), msg("user", "u1")),
          json_pack("[o,o,o,o]", msg("system", "S"), msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2")),
          "a1", "");
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(r.append_only);
    CHECK_EQ_INT(r.n_reasons, 0);
    CHECK_EQ_INT(r.prefill_tokens, 0);
    /* the prompt and the answer minus its last generated token */
    CHECK_EQ_INT(r.reusable, x.pf.n + 2);
    CHECK_EQ_INT(r.diverge_at, r.reusable);
    ns_pdiff_result_free(&r);
    teardown(&x);
}

TEST(system_changed) {
    pair x;
    setup(&x, json_pack("[o,o]", msg("system", "Today is Monday."), msg("user", "u1")),
          json_pack("[o,o,o,o]", msg("system", "Today is Tuesday."), msg("user", "u1"), msg("assistant", "a1"),
                    msg("user", "u2")),
          NULL, NULL);
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    /* "<system>Today is " is common: 17 tokens */
    CHECK_EQ_INT(r.diverge_at, 17);
    CHECK_EQ_INT(r.prefill_tokens, x.cf.n - 17);
    CHECK_EQ_INT(r.lost_tokens, x.pf.n - 17);
    const ns_pdiff_reason *k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_SYSTEM_CHANGED && k->message == 0);
    CHECK(k && strstr(k->detail, "-\"Mon\" +\"Tues\"") != NULL);
    ns_pdiff_result_free(&r);
    teardown(&x);
}

TEST(tools_changed) {
    pair x;
    setup(&x, json_pack("[o]", msg("user", "u1")), json_pack("[o,o,o]", msg("user", "u1X"), msg("assistant", "a"), msg("user", "u2")),
          NULL, NULL);
    json_t *t1 = json_pack("[{s:s,s:{s:s}}]", "type", "function", "function", "name", "read");
    json_t *t2 = json_pack("[{s:s,s:{s:s}},{s:s,s:{s:s}}]", "type", "function", "function", "name", "read", "type",
                           "function", "function", "name", "write");
    x.p.tools = t1;
    x.c.tools = t2;
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    bool tools = false, edited = false;
    for (int i = 0; i < r.n_reasons; i++) {
        if (r.reasons[i].kind == NS_PDIFF_TOOLS_CHANGED) tools = strstr(r.reasons[i].detail, "+write") != NULL;
        if (r.reasons[i].kind == NS_PDIFF_MESSAGE_EDITED) edited = r.reasons[i].message == 0;
    }
    CHECK(tools);
    CHECK(edited);
    ns_pdiff_result_free(&r);
    json_decref(t1);
    json_decref(t2);
    teardown(&x);
}

TEST(message_edited_and_removed) {
    pair x;
    setup(&x, json_pack("[o,o,o,o]", msg("system", "S"), msg("user", "task"), msg("assistant", "ok"), msg("user", "fix main.c")),
          json_pack("[o,o,o,o,o,o]", msg("system", "S"), msg("user", "task"), msg("assistant", "ok"), msg("user", "fix util.c"),
                    msg("assistant", "done"), msg("user", "more")),
          NULL, NULL);
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    const ns_pdiff_reason *k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_MESSAGE_EDITED && k->message == 3);
    CHECK(k && strstr(k->detail, "-\"main\" +\"util\"") != NULL);
    /* "<system>S\n<user>task\n<assistant>ok\n<user>fix " */
    CHECK_EQ_INT(r.diverge_at, strlen("<system>S\n<user>task\n<assistant>ok\n<user>fix "));
    ns_pdiff_result_free(&r);
    teardown(&x);

    setup(&x, json_pack("[o,o,o,o]", msg("system", "S"), msg("user", "task"), msg("assistant", "ok"), msg("user", "q")),
          json_pack("[o,o]", msg("system", "S"), msg("user", "task")), NULL, NULL);
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_MESSAGE_REMOVED);
    ns_pdiff_result_free(&r);
    teardown(&x);
}

TEST(answer_boundary) {
    /* the generated answer had leading spaces; the client sent it back trimmed */
    pair x;
    setup(&x, json_pack("[o]", msg("user", "q")), json_pack("[o,o,o]", msg("user", "q"), msg("assistant", "Sure."), msg("user", "q2")),
          "  Sure.", "");
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    CHECK_EQ_INT(r.diverge_at, x.pf.n); /* right at the answer */
    const ns_pdiff_reason *k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_WHITESPACE_TRIMMED && k->message == 1);
    CHECK(k && strstr(k->detail, "leading whitespace 2 -> 0") != NULL);
    ns_pdiff_result_free(&r);
    teardown(&x);

    /* the generated reasoning was not sent back */
    setup(&x, json_pack("[o]", msg("user", "q")), json_pack("[o,o,o]", msg("user", "q"), msg("assistant", "Hi."), msg("user", "q2")),
          "Hi.", "think");
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_REASONING_STRIPPED && k->message == 1);
    ns_pdiff_result_free(&r);
    teardown(&x);
}

TEST(reasoning_stripped_from_history) {
    json_t *a1 = json_pack("{s:s,s:s,s:s}", "role", "assistant", "content", "c", "reasoning_content", "r");
    pair x;
    /* P ends with the assistant message carrying reasoning (rendered); C drops it */
    setup(&x, json_pack("[o,O]", msg("user", "q"), a1), json_pack("[o,o,o]", msg("user", "q"), msg("assistant", "c"), msg("user", "q2")),
          NULL, NULL);
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    const ns_pdiff_reason *k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_REASONING_STRIPPED && k->message == 1);
    ns_pdiff_result_free(&r);
    teardown(&x);
    /* the same messages sent back whole: the stand-in template drops the
     * reasoning once a message follows -> a template re-render */
    setup(&x, json_pack("[o,O]", msg("user", "q"), a1), json_pack("[o,O,o]", msg("user", "q"), a1, msg("user", "q2")), NULL, NULL);
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_TEMPLATE_RERENDER && k->message == -1);
    CHECK(k && strstr(k->detail, "rendered prompt differs at token") != NULL);
    ns_pdiff_result_free(&r);
    teardown(&x);
    json_decref(a1);
}

TEST(retokenized_answer) {
    /* the answer renders to other tokens than were generated: a re-render */
    pair x;
    setup(&x, json_pack("[o]", msg("user", "q")), json_pack("[o,o,o]", msg("user", "q"), msg("assistant", "ab"), msg("user", "q2")),
          "ab", "");
    x.out_ids[1] = 9999; /* "b" was generated as another token */
    ns_pdiff_result r;
    CHECK(ns_pdiff_compare(&x.p, &x.c, &r));
    CHECK(!r.append_only);
    CHECK_EQ_INT(r.diverge_at, x.pf.n + 1);
    const ns_pdiff_reason *k = only_reason(&r);
    CHECK(k && k->kind == NS_PDIFF_TEMPLATE_RERENDER && strstr(k->detail, "re-tokenizes") != NULL);
    ns_pdiff_result_free(&r);
    teardown(&x);
}

TEST(text_diff_utf8) {
    const char *a = "héllo wörld", *b = "héllo wärld";
    char *d = ns_pdiff_text_diff(a, strlen(a), b, strlen(b), 100);
    /* the cut never splits the two-byte ö/ä */
    CHECK(d && strstr(d, "-\"ö\" +\"ä\"") != NULL);
    free(d);
    char big[400];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    d = ns_pdiff_text_diff("", 0, big, strlen(big), 16);
    CHECK(d && strstr(d, "…") != NULL && strlen(d) < 100);
    free(d);
}

int main(void) {
    RUN(append_only);
    RUN(system_changed);
    RUN(tools_changed);
    RUN(message_edited_and_removed);
    RUN(answer_boundary);
    RUN(reasoning_stripped_from_history);
    RUN(retokenized_answer);
    RUN(text_diff_utf8);
    TEST_MAIN_END;
}
