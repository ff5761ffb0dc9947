/* test_grammar.c — the grammar module: JSON Schema and regex compilation
 * (accepted and refused keywords), the byte automaton against strings
 * whose validity is known from the JSON / JSON Schema rules, integer
 * ranges against brute force, and token masks over the real Qwen3
 * vocabulary against a token-by-token check at random states. */
#include <jansson.h>
#include <stdint.h>

#include "grammar/gmatch.h"
#include "grammar/gnfa.h"
#include "grammar/gschema.h"
#include "grammar/gvocab.h"
#include "grammar/gvocab_tok.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* A vocabulary of the 256 single bytes (ids 0..255) and EOS = 256. */
static ns_gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *ptr[256];
    uint32_t len[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        ptr[i] = &bytes[i];
        len[i] = 1;
    }
    int32_t eos = 256;
    ns_gvocab *v = NULL;
    ns_error err = {0};
    if (ns_gvocab_build(257, 256, ptr, len, &eos, 1, &v, &err) != NS_OK) return NULL;
    return v;
}

/* Compiles a schema (JSON text) into a grammar on v; NULL with msg set. */
static ns_grammar *compile(const ns_gvocab *v, const char *schema, char *msg, size_t cap) {
    json_error_t je;
    json_t *j = json_loads(schema, JSON_DECODE_ANY, &je);
    if (!j) {
        snprintf(msg, cap, "bad test JSON: %s", je.text);
        return NULL;
    }
    ns_gnfa n;
    ns_gnfa_init(&n);
    uint32_t r = ns_gnfa_rule(&n), e;
    n.root = r;
    bool ok = ns_gschema_emit(&n, j, ns_gnfa_ws(&n, r), &e, msg, cap);
    json_decref(j);
    ns_grammar *g = NULL;
    if (ok) {
        ns_gnfa_end(&n, ns_gnfa_ws(&n, e));
        ns_error err = {0};
        if (ns_grammar_new(&n, v, &g, &err) != NS_OK) snprintf(msg, cap, "%s", err.msg);
    }
    ns_gnfa_free(&n);
    return g;
}

/* Whether the whole text is a complete sentence of g. */
static bool accepts(ns_grammar *g, const char *text) {
    ns_gmatch *m = NULL;
    ns_error err = {0};
    if (ns_gmatch_new(g, &m, &err) != NS_OK) return false;
    bool ok = ns_gmatch_accept_bytes(m, text, strlen(text)) && ns_gmatch_can_end(m);
    ns_gmatch_free(m);
    return ok;
}

#define ACCEPT(g, s) CHECKF(accepts(g, s), "should accept: %s", s)
#define REJECT(g, s) CHECKF(!accepts(g, s), "should reject: %s", s)

static ns_gvocab *g_bytes;

TEST(object_properties_required_and_bounds) {
    char msg[512] = "";
    ns_grammar *g = compile(g_bytes,
                            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-5,"
                            "\"maximum\":120},\"b\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"a\"],"
                            "\"additionalProperties\":false}",
                            msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (!g) return;
    ACCEPT(g, "{\"a\":0}");
    ACCEPT(g, "{\"a\":-5,\"b\":\"xyz\"}");
    ACCEPT(g, "{ \"a\" : 120 , \"b\" : \"\\u00e9\" }");
    REJECT(g, "{\"a\":1\t}");
    ACCEPT(g, "{\n  \"a\": 7,\n  \"b\": \"a\\\"b\"\n}");
    ACCEPT(g, "{\"a\":1,\"b\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"); /* 3 characters, 9 bytes */
    REJECT(g, "{\"a\":121}");
    REJECT(g, "{\"a\":-6}");
    REJECT(g, "{\"a\":01}");
    REJECT(g, "{\"a\":-0}");
    REJECT(g, "{\"b\":\"x\"}");
    REJECT(g, "{\"a\":1,\"c\":2}");
    REJECT(g, "{\"a\":1,\"b\":\"abcd\"}");
    REJECT(g, "{\"a\":1,}");
    REJECT(g, "{\"a\":1");
    REJECT(g, "{\"a\":1,\"b\":\"\xc3\"}");      /* a cut UTF-8 character */
    REJECT(g, "{\"a\":1,\"b\":\"\xed\xa0\x80\"}"); /* an encoded surrogate */
    ns_grammar_release(g);
}

TEST(enum_const_anyof_ref_recursion) {
    char msg[512] = "";
    ns_grammar *g = compile(g_bytes, "{\"enum\":[\"red\",\"green\",3,null,{\"k\":[1,2]}]}", msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "\"red\"");
        ACCEPT(g, "3");
        ACCEPT(g, "null");
        ACCEPT(g, "{\"k\":[1,2]}");
        REJECT(g, "\"blue\"");
        REJECT(g, "30");
        ns_grammar_release(g);
    }
    g = compile(g_bytes,
                "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":"
                "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"]}},"
                "\"$ref\":\"#/$defs/node\"}",
                msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}");
        ACCEPT(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":4}]}]}");
        REJECT(g, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3},{\"v\":4}]}");
        REJECT(g, "{\"v\":1,\"kids\":[{}]}");
        ns_grammar_release(g);
    }
    g = compile(g_bytes,
                "{\"anyOf\":[{\"type\":\"string\",\"const\":\"x\"},{\"type\":\"array\",\"items\":{\"type\":"
                "\"boolean\"},\"minItems\":1,\"maxItems\":2},{\"type\":[\"number\",\"null\"]}]}",
                msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "\"x\"");
        ACCEPT(g, "[true]");
        ACCEPT(g, "[ true , false ]");
        ACCEPT(g, "-1.5e10");
        ACCEPT(g, "0.25");
        ACCEPT(g, "null");
        REJECT(g, "[]");
        REJECT(g, "[true,true,true]");
        REJECT(g, "\"y\"");
        REJECT(g, "01");
        REJECT(g, "1.");
        REJECT(g, ".5");
        ns_grammar_release(g);
    }
}

TEST(strings_escapes_patterns_whitespace) {
    char msg[512] = "";
    ns_grammar *g = compile(g_bytes, "{\"type\":\"string\"}", msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "\"a\\n\\u00e9\\\"\\\\\\/\\t\"");
        ACCEPT(g, "\"\"");
        REJECT(g, "\"\\ud800\"");  /* a surrogate escape */
        REJECT(g, "\"\x01\"");     /* a raw control character */
        REJECT(g, "\"\\x\"");
        REJECT(g, "\"abc");
        ns_grammar_release(g);
    }
    g = compile(g_bytes, "{\"type\":\"string\",\"pattern\":\"^[a-z]{2}-\\\\d+$\"}", msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "\"ab-12\"");
        REJECT(g, "\"abc-1\"");
        REJECT(g, "\"ab-\"");
        REJECT(g, "\"xab-1\"");
        ns_grammar_release(g);
    }
    g = compile(g_bytes, "{\"type\":\"string\",\"pattern\":\"a(b|c\\\"d)?e\"}", msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "\"xxaeyy\"");
        ACCEPT(g, "\"abe\"");
        ACCEPT(g, "\"ac\\\"de\"");
        REJECT(g, "\"xay\"");
        ns_grammar_release(g);
    }
    g = compile(g_bytes, "{\"type\":\"object\"}", msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        char buf[64];
        snprintf(buf, sizeof buf, "{\n%*s}", NS_GNFA_MAX_WS, "");
        ACCEPT(g, buf);
        snprintf(buf, sizeof buf, "{\n%*s}", NS_GNFA_MAX_WS + 1, "");
        REJECT(g, buf);
        REJECT(g, "{  }");
        REJECT(g, "{\n\n}");
        ACCEPT(g, "{ }");
        ACCEPT(g, "{\"any\":[1,{\"x\":null},\"s\",true]}");
        REJECT(g, "[1]");
        ns_grammar_release(g);
    }
}

TEST(unsupported_keywords_are_named) {
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        {"{\"type\":\"string\",\"format\":\"email\"}", "'format' at #"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "'oneOf'"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":1}}}",
         "'minimum' is supported for type integer only, not number at #/properties/x"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}", "'$ref' next to 'type'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"patternProperties\":{}}}}",
         "'patternProperties' at #/properties/a"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char msg[512] = "";
        ns_grammar *g = compile(g_bytes, bad[i].schema, msg, sizeof msg);
        CHECKF(!g, "accepted: %s", bad[i].schema);
        CHECKF(strstr(msg, bad[i].needle) != NULL, "%s: message '%s' lacks '%s'", bad[i].schema, msg, bad[i].needle);
        if (g) ns_grammar_release(g);
    }
    /* annotations are accepted and ignored */
    char msg[512] = "";
    ns_grammar *g = compile(g_bytes,
                            "{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"title\":\"t\",\"description\":"
                            "\"d\",\"type\":\"integer\",\"default\":1,\"examples\":[2],\"$id\":\"x\"}",
                            msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ACCEPT(g, "42");
        ns_grammar_release(g);
    }
}

TEST(integer_ranges_match_brute_force) {
    static const long long ranges[][2] = {{0, 0},    {-5, 120}, {7, 7},     {-1000, -37}, {13, 4567},
                                          {-99, 99}, {1, 10},   {990, 1010}, {-1, 0},     {100, 199}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        long long lo = ranges[r][0], hi = ranges[r][1];
        char schema[128], msg[512] = "";
        snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", lo, hi);
        ns_grammar *g = compile(g_bytes, schema, msg, sizeof msg);
        CHECKF(g, "%s", msg);
        if (!g) continue;
        int bad = 0;
        for (long long x = lo - 1100; x <= hi + 1100; x++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            if (accepts(g, t) != (x >= lo && x <= hi)) bad++;
        }
        CHECKF(bad == 0, "[%lld, %lld]: %d integers misjudged", lo, hi, bad);
        REJECT(g, "-0");
        REJECT(g, "00");
        REJECT(g, "1.0");
        ns_grammar_release(g);
    }
}

/* xorshift for reproducible walks */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Walks random allowed tokens; at each state the mask must equal the
 * token-by-token answer for every token of the vocabulary. */
static void walk_check(ns_grammar *g, const ns_gvocab *v, uint64_t seed, int steps, int *checked, int *bad) {
    ns_gmatch *m = NULL;
    ns_error err = {0};
    if (ns_gmatch_new(g, &m, &err) != NS_OK) {
        (*bad)++;
        return;
    }
    int32_t *allowed = malloc((size_t)v->n_vocab * sizeof(int32_t));
    char text[8192];
    size_t tl = 0;
    for (int s = 0; s < steps && !ns_gmatch_done(m); s++) {
        if (ns_gmatch_fill_mask(m, &err) != NS_OK) {
            (*bad)++;
            break;
        }
        const uint32_t *mask = ns_gmatch_mask(m);
        int32_t n_allowed = 0;
        for (int32_t t = 0; t < v->n_vocab; t++) {
            bool bit = (mask[t >> 5] >> (t & 31)) & 1;
            bool want = ns_gvocab_is_eos(v, t) ? ns_gmatch_can_end(m)
                        : v->len[t] ? ns_gmatch_would_accept_bytes(m, (const char *)v->bytes + v->off[t], v->len[t])
                                    : false;
            if (bit != want && (*bad)++ < 5)
                printf("#   step %d token %d: mask %d, brute force %d\n", s, t, bit, want);
            if (bit) allowed[n_allowed++] = t;
        }
        (*checked)++;
        if (n_allowed == 0) {
            (*bad)++;
            break;
        }
        int32_t t = allowed[rng_next(&seed) % (uint64_t)n_allowed];
        if (ns_gmatch_accept(m, t, &err) != NS_OK) {
            (*bad)++;
            break;
        }
        if (!ns_gvocab_is_eos(v, t) && tl + v->len[t] < sizeof text) {
            memcpy(text + tl, v->bytes + v->off[t], v->len[t]);
            tl += v->len[t];
        }
    }
    if (getenv("NS_TEST_VERBOSE")) {
        json_t *js = json_stringn_nocheck(text, tl);
        char *d = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
        printf("#   walk: %s\n", d ? d : "?");
        free(d);
        json_decref(js);
    }
    if (ns_gmatch_done(m)) { /* a finished walk is JSON */
        json_error_t je;
        json_t *j = json_loadb(text, tl, JSON_DECODE_ANY, &je);
        CHECKF(j != NULL, "walk output is not JSON (%s): %.*s", je.text, (int)tl, text);
        json_decref(j);
    }
    free(allowed);
    ns_gmatch_free(m);
}

/* The mask after prefix against the token-by-token answer; mismatches. */
static int check_state(ns_grammar *g, const ns_gvocab *v, const char *prefix) {
    ns_gmatch *m = NULL;
    ns_error err = {0};
    if (ns_gmatch_new(g, &m, &err) != NS_OK) return 1;
    int bad = 0;
    if (!ns_gmatch_accept_bytes(m, prefix, strlen(prefix)) || ns_gmatch_fill_mask(m, &err) != NS_OK) bad++;
    const uint32_t *mask = bad ? NULL : ns_gmatch_mask(m);
    for (int32_t t = 0; mask && t < v->n_vocab; t++) {
        bool bit = (mask[t >> 5] >> (t & 31)) & 1;
        bool want = ns_gvocab_is_eos(v, t) ? ns_gmatch_can_end(m)
                    : v->len[t] ? ns_gmatch_would_accept_bytes(m, (const char *)v->bytes + v->off[t], v->len[t])
                                : false;
        if (bit != want && bad++ < 3) printf("#   after '%s': token %d mask %d, brute force %d\n", prefix, t, bit, want);
    }
    ns_gmatch_free(m);
    return bad;
}

TEST(masks_match_token_by_token_check_on_qwen3_vocab) {
    ns_tokenizer *tok = NULL;
    ns_error err = {0};
    if (ns_tokenizer_load(test_shared_path("models/tiny-qwen3"), &tok, &err) != NS_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return;
    }
    int32_t eos = 151645;
    ns_gvocab *v = NULL;
    CHECK(ns_gvocab_from_tokenizer(tok, 151936, &eos, 1, &v, &err) == NS_OK);
    if (!v) {
        ns_tokenizer_free(tok);
        return;
    }
    CHECK(v->n_nodes > 100000);
    /* <tool_call> and <think> are non-special added tokens: in the trie */
    int32_t tc = ns_tokenizer_token_id(tok, "<tool_call>");
    CHECK(tc >= 0 && v->len[tc] == 11 && !memcmp(v->bytes + v->off[tc], "<tool_call>", 11));
    int32_t sp = ns_tokenizer_token_id(tok, "\xc4\xa0{"); /* "Ġ{" = " {" */
    CHECK(sp >= 0 && v->len[sp] == 2 && !memcmp(v->bytes + v->off[sp], " {", 2));
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":"
        "\"integer\",\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\","
        "\"b\"]},\"maxItems\":3}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\",\"pattern\":\"^x[0-9]+$\"},{\"type\":\"boolean\"}]}",
        "{\"type\":\"object\"}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":5},\"maxItems\":3}",
    };
    int checked = 0, bad = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        char msg[512] = "";
        ns_grammar *g = compile(v, schemas[i], msg, sizeof msg);
        CHECKF(g, "%s", msg);
        if (!g) continue;
        for (uint64_t seed = 1; seed <= 2; seed++) walk_check(g, v, seed * 0x9E3779B97F4A7C15ULL + i, 40, &checked, &bad);
        ns_grammar_stats st;
        ns_grammar_get_stats(g, &st);
        CHECK(st.mask_misses > 0);
        ns_grammar_release(g);
    }
    /* chosen states: inside length-bounded strings at every position,
     * unbounded strings, a pattern, escapes, UTF-8 mid-character */
    {
        char msg[512] = "";
        ns_grammar *g = compile(v,
                                "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":2,"
                                "\"maxLength\":6},\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"string\",\"pattern\":"
                                "\"^[a-c]+x$\"}},\"required\":[\"a\",\"b\",\"c\"]}",
                                msg, sizeof msg);
        CHECKF(g, "%s", msg);
        static const char *const prefixes[] = {
            "{\"a\":\"",       "{\"a\":\"x",          "{\"a\":\"xy",          "{\"a\":\"xyz",
            "{\"a\":\"xyzw",   "{\"a\":\"xyzwv",      "{\"a\":\"xyzwvu",      "{\"a\":\"\xc3",
            "{\"a\":\"x\\",  "{\"a\":\"ab\",\"b\":\"", "{\"a\":\"ab\",\"b\":\"\xe4\xbd", "{\"a\":\"ab\",\"b\":\"q\",\"c\":\"ab",
        };
        for (size_t k = 0; g && k < sizeof prefixes / sizeof prefixes[0]; k++) {
            bad += check_state(g, v, prefixes[k]);
            checked++;
        }
        if (g) ns_grammar_release(g);
    }
    printf("#   %d states checked against every token\n", checked);
    CHECKF(bad == 0, "%d mismatches over %d states", bad, checked);
    CHECK(checked >= 20);
    /* a tiny memory cap: the shared automaton is emptied and rebuilt from
     * the live matchers' states again and again; masks stay right */
    char msg[512] = "";
    ns_grammar *g = compile(v, schemas[0], msg, sizeof msg);
    CHECKF(g, "%s", msg);
    if (g) {
        ns_grammar_set_memory_cap(g, 64 << 10);
        ns_gmatch *other = NULL; /* a second live matcher, mid-answer, survives the resets */
        ns_error err2 = {0};
        CHECK(ns_gmatch_new(g, &other, &err2) == NS_OK);
        CHECK(other && ns_gmatch_accept_bytes(other, "{\"name\": \"ab", 12));
        int c2 = 0, b2 = 0;
        walk_check(g, v, 77, 40, &c2, &b2);
        ns_grammar_stats st;
        ns_grammar_get_stats(g, &st);
        CHECKF(st.resets > 0, "no reset happened (%zu bytes)", st.bytes);
        CHECKF(b2 == 0, "%d mismatches over %d states with resets", b2, c2);
        CHECK(other && ns_gmatch_accept_bytes(other, "c\", \"age\": 7}", 13) && ns_gmatch_can_end(other));
        ns_gmatch_free(other);
        ns_grammar_release(g);
    }
    ns_gvocab_free(v);
    ns_tokenizer_free(tok);
}

/* SentencePiece-style pieces spell a space as U+2581 */
TEST(sentencepiece_vocab_bytes) {
    ns_tokenizer *tok = NULL;
    ns_error err = {0};
    if (ns_tokenizer_load(test_shared_path("models/tinystories-656k"), &tok, &err) != NS_OK) {
        CHECKF(0, "tokenizer: %s", err.msg);
        return;
    }
    int32_t eos = 2;
    ns_gvocab *v = NULL;
    CHECK(ns_gvocab_from_tokenizer(tok, ns_tokenizer_n_vocab(tok), &eos, 1, &v, &err) == NS_OK);
    int32_t id = ns_tokenizer_token_id(tok, "\xe2\x96\x81" "a"); /* "▁a" */
    CHECK(v && id >= 0 && v->len[id] == 2 && !memcmp(v->bytes + v->off[id], " a", 2));
    ns_gvocab_free(v);
    ns_tokenizer_free(tok);
}

int main(void) {
    g_bytes = byte_vocab();
    if (!g_bytes) {
        printf("not ok - byte_vocab\n");
        return 1;
    }
    RUN(object_properties_required_and_bounds);
    RUN(enum_const_anyof_ref_recursion);
    RUN(strings_escapes_patterns_whitespace);
    RUN(unsupported_keywords_are_named);
    RUN(integer_ranges_match_brute_force);
    RUN(masks_match_token_by_token_check_on_qwen3_vocab);
    RUN(sentencepiece_vocab_bytes);
    ns_gvocab_free(g_bytes);
    TEST_MAIN_END;
}
