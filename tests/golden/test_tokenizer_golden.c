/* test_tokenizer_golden.c — every case of tests/fixtures/goldens/tokenizer-*.json:
 * encode without and with special tokens, decode, and the streaming
 * detokenizer (one id at a time, each chunk valid UTF-8, total == decode). */
#include <jansson.h>
#include <time.h>

#include "test.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokutil.h"

typedef struct model_case {
    const char *name;
    ns_tokenizer *tok;
    json_t *cases;
} model_case;

static model_case models[] = {{"tiny-qwen3", NULL, NULL}, {"tiny-llama3", NULL, NULL}, {"tinystories-656k", NULL, NULL}};

static bool load_model(model_case *m) {
    if (m->tok) return true;
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", m->name);
    ns_error err = {0};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ns_status st = ns_tokenizer_load(test_shared_path(rel), &m->tok, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    CHECKF(st == NS_OK, "load %s: %s", m->name, err.msg);
    if (st != NS_OK) return false;
    printf("# %s: loaded in %.3f s, n_vocab %d\n", m->name,
           (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9, ns_tokenizer_n_vocab(m->tok));
    snprintf(rel, sizeof rel, "goldens/tokenizer-%s.json", m->name);
    json_error_t je;
    json_t *g = json_load_file(test_shared_path(rel), 0, &je);
    CHECKF(g != NULL, "golden %s: %s", rel, je.text);
    if (!g) return false;
    m->cases = json_incref(json_object_get(g, "cases"));
    json_decref(g);
    CHECK(json_is_array(m->cases) && json_array_size(m->cases) > 0);
    return m->cases != NULL;
}

static int32_t *json_ids(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

static void show(const char *s) {
    printf("\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\x%02x", c);
        else putchar(c);
    }
    printf("\"");
}

/* Compares encode output with the expected ids; prints the first difference. */
static bool ids_equal(const char *what, const char *text, const int32_t *got, size_t ng, const int32_t *exp,
                      size_t ne) {
    size_t i = 0;
    while (i < ng && i < ne && got[i] == exp[i]) i++;
    if (i == ng && i == ne) return true;
    printf("#   %s mismatch for ", what);
    show(strlen(text) > 80 ? "(long text)" : text);
    printf(": %zu vs %zu ids, first difference at %zu: got %d want %d\n", ng, ne, i, i < ng ? got[i] : -1,
           i < ne ? exp[i] : -1);
    return false;
}

static void check_encode(model_case *m, const char *field, bool add_special) {
    if (!load_model(m)) return;
    int bad = 0;
    for (size_t i = 0; i < json_array_size(m->cases); i++) {
        const json_t *c = json_array_get(m->cases, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t tl = json_string_length(json_object_get(c, "text"));
        size_t ne;
        int32_t *exp = json_ids(json_object_get(c, field), &ne);
        int32_t *got = NULL;
        size_t ng = 0;
        ns_error err = {0};
        ns_status st = ns_tokenizer_encode(m->tok, text, tl, add_special, &got, &ng, &err);
        CHECKF(st == NS_OK, "encode case %zu: %s", i, err.msg);
        if (st == NS_OK && !ids_equal(field, text, got, ng, exp, ne)) bad++;
        free(got);
        free(exp);
    }
    CHECKF(bad == 0, "%s: %d of %zu cases differ in %s", m->name, bad, json_array_size(m->cases), field);
}

static void check_decode(model_case *m) {
    if (!load_model(m)) return;
    int bad = 0;
    for (size_t i = 0; i < json_array_size(m->cases); i++) {
        const json_t *c = json_array_get(m->cases, i);
        const char *want = json_string_value(json_object_get(c, "decoded"));
        size_t n;
        int32_t *ids = json_ids(json_object_get(c, "ids"), &n);
        char *got = NULL;
        size_t gl = 0;
        ns_error err = {0};
        ns_status st = ns_tokenizer_decode(m->tok, ids, n, false, &got, &gl, &err);
        CHECKF(st == NS_OK, "decode case %zu: %s", i, err.msg);
        if (st == NS_OK && (gl != json_string_length(json_object_get(c, "decoded")) || memcmp(got, want, gl) != 0)) {
            bad++;
            printf("#   decode case %zu: got ", i);
            show(gl > 200 ? "(long)" : got);
            printf(" want ");
            show(strlen(want) > 200 ? "(long)" : want);
            printf("\n");
        }
        free(got);
        free(ids);
    }
    CHECKF(bad == 0, "%s: %d decode mismatches", m->name, bad);
}

/* Streams `field` ids one at a time; the result must equal decode(). */
static void check_stream(model_case *m, const char *field, bool skip_special) {
    if (!load_model(m)) return;
    int bad = 0, invalid = 0;
    for (size_t i = 0; i < json_array_size(m->cases); i++) {
        const json_t *c = json_array_get(m->cases, i);
        size_t n;
        int32_t *ids = json_ids(json_object_get(c, field), &n);
        char *want = NULL;
        size_t wl = 0;
        CHECK(ns_tokenizer_decode(m->tok, ids, n, skip_special, &want, &wl, NULL) == NS_OK);
        ns_detok *d = NULL;
        CHECK(ns_detok_create(m->tok, skip_special, &d) == NS_OK);
        ns_buf all, chunk;
        ns_buf_init(&all, 0);
        ns_buf_init(&chunk, 0);
        for (size_t k = 0; k <= n && d; k++) {
            ns_buf_reset(&chunk);
            ns_status st = k < n ? ns_detok_push(d, ids[k], &chunk) : ns_detok_flush(d, &chunk);
            CHECK(st == NS_OK);
            if (!ns_utf8_valid(chunk.data ? chunk.data : "", chunk.len, NULL)) invalid++;
            ns_buf_append(&all, chunk.data ? chunk.data : "", chunk.len);
        }
        if (want && (all.len != wl || (wl && memcmp(all.data, want, wl) != 0))) {
            bad++;
            printf("#   stream case %zu: got ", i);
            show(all.len > 200 || !all.data ? "(long/empty)" : all.data);
            printf(" want ");
            show(wl > 200 ? "(long)" : want);
            printf("\n");
        }
        ns_buf_free(&all);
        ns_buf_free(&chunk);
        ns_detok_free(d);
        free(want);
        free(ids);
    }
    CHECKF(bad == 0, "%s: %d stream mismatches", m->name, bad);
    CHECKF(invalid == 0, "%s: %d chunks were not valid UTF-8", m->name, invalid);
}

#define MODEL_TESTS(tag, idx)                                                               \
    TEST(tag##_encode) { check_encode(&models[idx], "ids", false); }                       \
    TEST(tag##_encode_specials) { check_encode(&models[idx], "ids_with_specials", true); } \
    TEST(tag##_decode) { check_decode(&models[idx]); }                                     \
    TEST(tag##_stream) { check_stream(&models[idx], "ids", false); }                       \
    TEST(tag##_stream_specials) {                                                          \
        check_stream(&models[idx], "ids_with_specials", false);                            \
        check_stream(&models[idx], "ids_with_specials", true);                             \
    }

MODEL_TESTS(qwen3, 0)
MODEL_TESTS(llama3, 1)
MODEL_TESTS(tinystories, 2)

int main(void) {
    RUN(qwen3_encode);
    RUN(qwen3_encode_specials);
    RUN(qwen3_decode);
    RUN(qwen3_stream);
    RUN(qwen3_stream_specials);
    RUN(llama3_encode);
    RUN(llama3_encode_specials);
    RUN(llama3_decode);
    RUN(llama3_stream);
    RUN(llama3_stream_specials);
    RUN(tinystories_encode);
    RUN(tinystories_encode_specials);
    RUN(tinystories_decode);
    RUN(tinystories_stream);
    RUN(tinystories_stream_specials);
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        ns_tokenizer_free(models[i].tok);
        json_decref(models[i].cases);
    }
    TEST_MAIN_END;
}
