/* test_tokenizer.c — tokenizer unit tests: input validation, load errors,
 * added-token matching rules, byte fallback, the streaming detokenizer
 * (never half a character, always equal to decode), config accessors. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include <utf8proc.h>

#include "tokenizer/normalize.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokutil.h"

static ns_tokenizer *load_shared(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    ns_status st = ns_tokenizer_load(test_shared_path(rel), &t, &err);
    CHECKF(st == NS_OK, "load %s: %s", name, err.msg);
    return t;
}

static ns_tokenizer *g_qwen, *g_llama, *g_stories;

/* ---- helpers ---- */

static int32_t *enc(const ns_tokenizer *t, const char *s, bool special, size_t *n) {
    int32_t *ids = NULL;
    ns_error err = {0};
    ns_status st = ns_tokenizer_encode(t, s, strlen(s), special, &ids, n, &err);
    CHECKF(st == NS_OK, "encode \"%s\": %s", s, err.msg);
    return ids;
}

static char *dec(const ns_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *s = NULL;
    ns_error err = {0};
    ns_status st = ns_tokenizer_decode(t, ids, n, skip, &s, NULL, &err);
    CHECKF(st == NS_OK, "decode: %s", err.msg);
    return s;
}

static bool ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

#define CHECK_IDS(t, text, special, ...)                                                      \
    do {                                                                                      \
        const int32_t _want[] = {__VA_ARGS__};                                                \
        size_t _n = 0;                                                                        \
        int32_t *_got = enc((t), (text), (special), &_n);                                     \
        bool _ok = _got && ids_eq(_got, _n, _want, sizeof _want / sizeof *_want);             \
        CHECKF(_ok, "encode \"%s\": got %zu ids (first %d)", (text), _n, _n ? _got[0] : -1); \
        free(_got);                                                                           \
    } while (0)

/* Streams ids through a detokenizer; every chunk must be valid UTF-8 and
 * the total must equal decode(). Returns false on any mismatch. */
static bool stream_matches(const ns_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *want = NULL;
    size_t want_len = 0;
    CHECK(ns_tokenizer_decode(t, ids, n, skip, &want, &want_len, NULL) == NS_OK);
    ns_detok *d = NULL;
    if (ns_detok_create(t, skip, &d) != NS_OK) return false;
    ns_buf all, chunk;
    ns_buf_init(&all, 0);
    ns_buf_init(&chunk, 0);
    bool ok = want != NULL;
    for (size_t k = 0; k <= n; k++) {
        ns_buf_reset(&chunk);
        ns_status st = k < n ? ns_detok_push(d, ids[k], &chunk) : ns_detok_flush(d, &chunk);
        if (st != NS_OK) ok = false;
        if (!ns_utf8_valid(chunk.data ? chunk.data : "", chunk.len, NULL)) {
            printf("#   chunk %zu is not valid UTF-8\n", k);
            ok = false;
        }
        ns_buf_append(&all, chunk.data ? chunk.data : "", chunk.len);
    }
    if (ok && (all.len != want_len || memcmp(all.data ? all.data : "", want, all.len) != 0)) {
        printf("#   stream != decode for ids");
        for (size_t k = 0; k < n; k++) printf(" %d", ids[k]);
        printf("\n#   stream:");
        for (size_t k = 0; k < all.len; k++) printf(" %02x", (unsigned char)all.data[k]);
        printf("\n#   decode:");
        for (size_t k = 0; k < want_len; k++) printf(" %02x", (unsigned char)want[k]);
        printf("\n");
        ok = false;
    }
    ns_buf_free(&all);
    ns_buf_free(&chunk);
    ns_detok_free(d);
    free(want);
    return ok;
}

/* A SentencePiece-style BPE with byte fallback, built in memory:
 * <unk>=0 <s>=1 </s>=2 <0x00>..<0xFF>=3..258 ▁=259 a=260 b=261 ▁a=262 ab=263. */
static ns_tokenizer *make_bytefallback(const char *decoder_json) {
    ns_buf b;
    ns_buf_init(&b, 0);
    ns_buf_puts(&b, "{\"version\":\"1.0\",\"added_tokens\":["
                    "{\"id\":1,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
                    "{\"id\":2,\"content\":\"</s>\",\"normalized\":false,\"special\":true}],"
                    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
                    "{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
                    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
                    "\"pre_tokenizer\":null,\"decoder\":");
    ns_buf_puts(&b, decoder_json);
    ns_buf_puts(&b, ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
                    "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
                    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
                    "\"merges\":[\"\xE2\x96\x81 a\",\"a b\"],\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,");
    for (int i = 0; i < 256; i++) ns_buf_printf(&b, "\"<0x%02X>\":%d,", i, 3 + i);
    ns_buf_puts(&b, "\"\xE2\x96\x81\":259,\"a\":260,\"b\":261,\"\xE2\x96\x81" "a\":262,\"ab\":263}}}");
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    ns_status st = ns_tokenizer_load_json(b.data, NULL, &t, &err);
    CHECKF(st == NS_OK, "load_json: %s", err.msg);
    ns_buf_free(&b);
    return t;
}

static const char SP_DECODER[] =
    "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}";

/* ---- tests ---- */

TEST(invalid_utf8_rejected) {
    static const char *const bad[] = {
        "\xFF", "a\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80" /* surrogate */, "\xF4\x90\x80\x80" /* > 10FFFF */,
        "\xE2\x82", "abc\xF0\x9F\x98" /* truncated emoji */, "\xC3\x28",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        ns_error err = {0};
        ns_status st = ns_tokenizer_encode(g_qwen, bad[i], strlen(bad[i]), false, &ids, &n, &err);
        CHECKF(st == NS_ERR_INVALID, "case %zu: status %s", i, ns_status_name(st));
        CHECK(ids == NULL && n == 0);
        CHECK(strstr(err.msg, "UTF-8") != NULL);
    }
    /* NUL is valid UTF-8 and must survive a round trip. */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(ns_tokenizer_encode(g_llama, "a\0b", 3, false, &ids, &n, NULL) == NS_OK);
    char *s = NULL;
    size_t len = 0;
    CHECK(ns_tokenizer_decode(g_llama, ids, n, false, &s, &len, NULL) == NS_OK);
    CHECK(len == 3 && s && memcmp(s, "a\0b", 3) == 0);
    free(s);
    free(ids);
    /* Empty input: zero ids but a valid pointer. */
    CHECK(ns_tokenizer_encode(g_qwen, "", 0, false, &ids, &n, NULL) == NS_OK);
    CHECK(ids != NULL && n == 0);
    free(ids);
}

static char g_tmpdir[64];

static void write_file(const char *name, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_tmpdir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_tmpdir, name);
    unlink(p);
}

static ns_status try_load(ns_error *err) {
    ns_tokenizer *t = NULL;
    memset(err, 0, sizeof *err);
    ns_status st = ns_tokenizer_load(g_tmpdir, &t, err);
    ns_tokenizer_free(t);
    return st;
}

#define MINI_MODEL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

TEST(load_errors_are_clear) {
    ns_error err;
    /* Missing directory / file. */
    ns_tokenizer *t = NULL;
    CHECK(ns_tokenizer_load("/nonexistent/model", &t, &err) == NS_ERR_IO && t == NULL);
    CHECK(strstr(err.msg, "/nonexistent/model/tokenizer.json") != NULL);
    CHECK(try_load(&err) == NS_ERR_IO);

    /* Truncated / corrupt JSON: file, line and column are named. */
    write_file("tokenizer.json", "{\"version\":\"1.0\",\n\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0");
    CHECK(try_load(&err) == NS_ERR_FORMAT);
    CHECKF(strstr(err.msg, "tokenizer.json:2:") != NULL, "%s", err.msg);
    write_file("tokenizer.json", "[1,2,3]");
    CHECK(try_load(&err) == NS_ERR_FORMAT);
    write_file("tokenizer.json", "{\"version\":\"1.0\"}");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "model") != NULL);

    /* Semantic errors. */
    write_file("tokenizer.json", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED && strstr(err.msg, "WordPiece") != NULL);
    write_file("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "merge 0") != NULL);
    write_file("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "vocab") != NULL);
    write_file("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1e12},\"merges\":[]}}");
    CHECK(try_load(&err) == NS_ERR_FORMAT);
    write_file("tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}");
    CHECK(try_load(&err) == NS_ERR_FORMAT);
    write_file("tokenizer.json", "{\"pre_tokenizer\":{\"type\":\"Whatever\"}," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED && strstr(err.msg, "Whatever") != NULL &&
          strstr(err.msg, "tokenizer.json") != NULL);
    write_file("tokenizer.json", "{\"normalizer\":{\"type\":\"BertNormalizer\"}," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED && strstr(err.msg, "BertNormalizer") != NULL);
    write_file("tokenizer.json", "{\"decoder\":{\"type\":\"WordPiece\"}," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED && strstr(err.msg, "WordPiece") != NULL);
    write_file("tokenizer.json", "{\"post_processor\":{\"type\":\"BertProcessing\"}," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED);
    write_file("tokenizer.json", "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                                 "\"behavior\":\"Isolated\"}," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_UNSUPPORTED && strstr(err.msg, "regex") != NULL);
    write_file("tokenizer.json", "{\"added_tokens\":[{\"content\":\"x\"}]," MINI_MODEL "}");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "added_tokens[0]") != NULL);

    /* A valid tokenizer.json with a corrupt tokenizer_config.json. */
    write_file("tokenizer.json", "{" MINI_MODEL "}");
    CHECK(try_load(&err) == NS_OK);
    write_file("tokenizer_config.json", "{\"bos_token\": ");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "tokenizer_config.json") != NULL);
    write_file("tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(try_load(&err) == NS_ERR_FORMAT && strstr(err.msg, "chat_template") != NULL);
    remove_file("tokenizer_config.json");
    remove_file("tokenizer.json");
}

TEST(config_and_templates) {
    /* Huge integers (model_max_length) and {"content":...} tokens are fine;
     * chat templates come as a list, or from chat_template.jinja. */
    write_file("tokenizer.json", "{\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"special\":true}]," MINI_MODEL "}");
    write_file("tokenizer_config.json",
               "{\"model_max_length\": 1000000000000000019884624838656, \"bos_token\": {\"content\": \"<s>\"},"
               " \"eos_token\": \"</nope>\", \"add_bos_token\": true,"
               " \"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\","
               " \"template\": \"T\"}]}");
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    CHECKF(ns_tokenizer_load(g_tmpdir, &t, &err) == NS_OK, "%s", err.msg);
    if (t) {
        CHECK_EQ_STR(ns_tokenizer_bos_token(t), "<s>");
        CHECK_EQ_INT(ns_tokenizer_bos_id(t), 3);
        CHECK_EQ_STR(ns_tokenizer_eos_token(t), "</nope>");
        CHECK_EQ_INT(ns_tokenizer_eos_id(t), -1);
        CHECK_EQ_STR(ns_tokenizer_chat_template(t, NULL), "D");
        CHECK_EQ_STR(ns_tokenizer_chat_template(t, "tool_use"), "T");
        CHECK(ns_tokenizer_chat_template(t, "nope") == NULL);
        CHECK_EQ_INT(ns_tokenizer_n_vocab(t), 4);
        CHECK_IDS(t, "ab", true, 3, 2); /* add_bos_token from the config */
        CHECK_IDS(t, "ab<s>a", false, 2, 3, 0);
        ns_tokenizer_free(t);
    }
    write_file("tokenizer_config.json", "{}");
    write_file("chat_template.jinja", "{{ messages }}");
    t = NULL;
    CHECKF(ns_tokenizer_load(g_tmpdir, &t, &err) == NS_OK, "%s", err.msg);
    if (t) {
        CHECK_EQ_STR(ns_tokenizer_chat_template(t, NULL), "{{ messages }}");
        CHECK(ns_tokenizer_bos_id(t) == -1 && ns_tokenizer_bos_token(t) == NULL);
        ns_tokenizer_free(t);
    }
    remove_file("chat_template.jinja");
    remove_file("tokenizer_config.json");
    remove_file("tokenizer.json");

    /* The shared models. */
    CHECK(ns_tokenizer_chat_template(g_qwen, NULL) != NULL);
    CHECK(strstr(ns_tokenizer_chat_template(g_llama, NULL), "start_header_id") != NULL);
    CHECK(ns_tokenizer_chat_template(g_stories, NULL) == NULL);
    CHECK_EQ_INT(ns_tokenizer_bos_id(g_qwen), -1);
    CHECK_EQ_INT(ns_tokenizer_eos_id(g_qwen), 151645);
    CHECK_EQ_STR(ns_tokenizer_eos_token(g_qwen), "<|im_end|>");
    CHECK_EQ_INT(ns_tokenizer_bos_id(g_llama), 128000);
    CHECK_EQ_INT(ns_tokenizer_eos_id(g_llama), 128009);
    CHECK_EQ_INT(ns_tokenizer_bos_id(g_stories), 1);
    CHECK_EQ_INT(ns_tokenizer_eos_id(g_stories), 2);
    CHECK_EQ_INT(ns_tokenizer_n_vocab(g_qwen), 151669);
    CHECK_EQ_INT(ns_tokenizer_n_vocab(g_llama), 128256);
    CHECK_EQ_INT(ns_tokenizer_n_vocab(g_stories), 2048);
}

TEST(json_paths) {
    /* Escapes and surrogate pairs in vocab keys and merges (fast scanner). */
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u0120a\":0,\"\\ud83d\\ude00\":1,"
                     "\"x\\\"y\":2,\"\\u0120\":3,\"a\":4},\"merges\":[[\"\\u0120\",\"a\"]]}}";
    CHECKF(ns_tokenizer_load_json(tj, NULL, &t, &err) == NS_OK, "%s", err.msg);
    if (t) {
        CHECK_EQ_INT(ns_tokenizer_token_id(t, "\xC4\xA0" "a"), 0);
        CHECK_EQ_INT(ns_tokenizer_token_id(t, "\xF0\x9F\x98\x80"), 1);
        CHECK_EQ_INT(ns_tokenizer_token_id(t, "x\"y"), 2);
        CHECK_IDS(t, "\xC4\xA0" "a\xF0\x9F\x98\x80", false, 0, 1);
        ns_tokenizer_free(t);
    }
    /* Lone surrogates and raw control characters are rejected like jansson. */
    t = NULL;
    CHECK(ns_tokenizer_load_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\ud83d\":0},\"merges\":[]}}", NULL,
                                 &t, &err) == NS_ERR_FORMAT);
    CHECK(ns_tokenizer_load_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\tb\":0},\"merges\":[]}}", NULL, &t,
                                 &err) == NS_ERR_FORMAT);
    /* An escaped top-level key defeats the scanner: the jansson fallback
     * must give the same tokenizer. */
    tj = "{\"\\u006dodel\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";
    CHECKF(ns_tokenizer_load_json(tj, NULL, &t, &err) == NS_OK, "%s", err.msg);
    if (t) {
        CHECK_IDS(t, "abba", false, 2, 1, 0);
        ns_tokenizer_free(t);
    }
}

TEST(vocab_lookup) {
    CHECK_EQ_INT(ns_tokenizer_token_id(g_qwen, "<|im_start|>"), 151644);
    CHECK_EQ_INT(ns_tokenizer_token_id(g_qwen, "Hello"), 9707);
    CHECK_EQ_INT(ns_tokenizer_token_id(g_qwen, "\xC4\xA0world"), 1879); /* "Ġworld" */
    CHECK_EQ_INT(ns_tokenizer_token_id(g_qwen, "no such piece at all"), -1);
    CHECK_EQ_STR(ns_tokenizer_piece(g_qwen, 151667), "<think>");
    CHECK_EQ_STR(ns_tokenizer_piece(g_qwen, 9707), "Hello");
    CHECK(ns_tokenizer_piece(g_qwen, -1) == NULL && ns_tokenizer_piece(g_qwen, 151669) == NULL);
    CHECK(ns_tokenizer_is_special(g_qwen, 151643));
    CHECK(!ns_tokenizer_is_special(g_qwen, 151667)); /* <think> is added but not special */
    CHECK(!ns_tokenizer_is_special(g_qwen, 9707));
    CHECK(ns_tokenizer_is_special(g_llama, 128255));
    CHECK_EQ_STR(ns_tokenizer_piece(g_stories, 0), "<unk>");
}

TEST(added_token_matching) {
    /* Vocabulary: single characters; added tokens with every flag. */
    const char *tj =
        "{\"added_tokens\":["
        "{\"id\":20,\"content\":\"<x>\",\"special\":true,\"lstrip\":true,\"normalized\":false},"
        "{\"id\":21,\"content\":\"[y]\",\"special\":false,\"rstrip\":true,\"normalized\":false},"
        "{\"id\":22,\"content\":\"zz\",\"special\":false,\"single_word\":true,\"normalized\":false},"
        "{\"id\":23,\"content\":\"<a>\",\"special\":true,\"normalized\":false},"
        "{\"id\":24,\"content\":\"<a>b\",\"special\":true,\"normalized\":false},"
        "{\"id\":25,\"content\":\"hey\",\"special\":false,\"normalized\":true},"
        "{\"id\":26,\"content\":\"ABC\",\"special\":false,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"Lowercase\"},"
        "\"decoder\":{\"type\":\"Fuse\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\" \":0,\"a\":1,\"b\":2,\"c\":3,\"z\":4,\"h\":5,\"e\":6,\"y\":7,"
        "\"<\":8,\">\":9},\"merges\":[]}}";
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    CHECKF(ns_tokenizer_load_json(tj, NULL, &t, &err) == NS_OK, "%s", err.msg);
    if (!t) return;
    CHECK_IDS(t, "a <x> b", false, 1, 20, 0, 2);    /* lstrip eats the space before */
    CHECK_IDS(t, "a   <x>", false, 1, 20);          /* ... all of it */
    CHECK_IDS(t, "[y]   c", false, 21, 3);          /* rstrip eats the spaces after */
    CHECK_IDS(t, "zz azz zz", false, 22, 0, 1, 4, 4, 0, 22); /* single_word */
    CHECK_IDS(t, "zz_", false, 4, 4);               /* '_' is a word character */
    CHECK_IDS(t, "<a>b<a>c", false, 24, 23, 3);     /* leftmost-longest */
    CHECK_IDS(t, "HEY hey", false, 25, 0, 25);      /* normalized: matched after lowercasing */
    CHECK_IDS(t, "ABC abc", false, 26, 0, 1, 2, 3); /* not normalized: matched in raw text only */
    /* Decoding: added tokens pass through the decoder; skip_special drops 20, 23, 24. */
    const int32_t ids[] = {23, 1, 20, 22, 24};
    char *s = dec(t, ids, 5, false);
    CHECK_EQ_STR(s, "<a>a<x>zz<a>b");
    free(s);
    s = dec(t, ids, 5, true);
    CHECK_EQ_STR(s, "azz");
    free(s);
    CHECK(stream_matches(t, ids, 5, false));
    CHECK(stream_matches(t, ids, 5, true));
    ns_tokenizer_free(t);

    /* The real models: special tokens in running text. */
    CHECK_IDS(g_qwen, "x<|im_end|>y", false, 87, 151645, 88);
    CHECK_IDS(g_llama, "<|begin_of_text|>hi", true, 128000, 128000, 6151);
}

TEST(byte_fallback_and_detok_never_splits_chars) {
    ns_tokenizer *t = make_bytefallback(SP_DECODER);
    if (!t) return;
    /* "a😀b" -> ▁a, the emoji as four byte tokens, b. */
    CHECK_IDS(t, "a\xF0\x9F\x98\x80" "b", false, 262, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 261);
    CHECK_IDS(t, "ab", true, 1, 262, 261);
    const int32_t emoji[] = {262, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 261};
    char *s = dec(t, emoji, 6, false);
    CHECK_EQ_STR(s, "a\xF0\x9F\x98\x80" "b");
    free(s);
    /* Push one id at a time: no chunk may end inside the emoji. */
    ns_detok *d = NULL;
    CHECK(ns_detok_create(t, false, &d) == NS_OK);
    ns_buf out;
    ns_buf_init(&out, 0);
    for (int i = 0; i < 6; i++) {
        size_t before = out.len;
        CHECK(ns_detok_push(d, emoji[i], &out) == NS_OK);
        CHECK(ns_utf8_valid(out.data + before, out.len - before, NULL));
        if (i >= 1 && i <= 3) CHECK(out.len == before); /* emoji incomplete: nothing new */
    }
    CHECK(ns_detok_flush(d, &out) == NS_OK);
    CHECK_EQ_STR(out.data, "a\xF0\x9F\x98\x80" "b");
    /* Invalid runs become one U+FFFD per byte, exactly like decode(). */
    const int32_t broken[] = {260, 3 + 0xF0, 3 + 0x9F, 261, 3 + 0x80, 3 + 0xE2, 3 + 0x82, 3 + 0xAC};
    s = dec(t, broken, 8, false);
    CHECK_EQ_STR(s, "a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    CHECK(stream_matches(t, broken, 8, false));
    /* A detokenizer is reusable after flush, and range-checks ids. */
    ns_buf_reset(&out);
    CHECK(ns_detok_push(d, 99999, &out) == NS_ERR_RANGE);
    CHECK(ns_detok_push(d, 262, &out) == NS_OK); /* "▁a" at stream start: the Strip applies again */
    CHECK(ns_detok_flush(d, &out) == NS_OK);
    CHECK_EQ_STR(out.data, "a");
    ns_buf_free(&out);
    ns_detok_free(d);
    ns_tokenizer_free(t);
}

TEST(detok_byte_level_emoji) {
    /* Qwen3 and Llama 3 spread emoji over byte-level tokens. */
    const char *texts[] = {"\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok",
                           "\xF0\x9F\x87\xBA\xF0\x9F\x87\xB8 \xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x99\x82",
                           "emoji\xF0\x9F\x99\x82in\xF0\x9F\x99\x83text"};
    ns_tokenizer *models[] = {g_qwen, g_llama};
    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            size_t n = 0;
            int32_t *ids = enc(models[m], texts[i], false, &n);
            CHECK(ids && n > 0);
            CHECK(stream_matches(models[m], ids, n, false));
            char *s = dec(models[m], ids, n, false);
            CHECK_EQ_STR(s, texts[i]);
            free(s);
            free(ids);
        }
    }
    /* A lone lead byte then ASCII: U+FFFD like from_utf8_lossy, in both paths. */
    int32_t f0 = ns_tokenizer_token_id(g_qwen, "\xC3\xB0"); /* byte 0xF0 as "ð" */
    int32_t a = ns_tokenizer_token_id(g_qwen, "a");
    CHECK(f0 >= 0 && a >= 0);
    const int32_t ids[] = {a, f0, a, f0};
    char *s = dec(g_qwen, ids, 4, false);
    CHECK_EQ_STR(s, "a\xEF\xBF\xBD" "a\xEF\xBF\xBD");
    free(s);
    CHECK(stream_matches(g_qwen, ids, 4, false));
}

TEST(decode_errors) {
    const int32_t bad[] = {5, -1};
    char *s = (char *)1;
    ns_error err = {0};
    CHECK(ns_tokenizer_decode(g_qwen, bad, 2, false, &s, NULL, &err) == NS_ERR_RANGE);
    CHECK(s == NULL && strstr(err.msg, "-1") != NULL);
    const int32_t big[] = {151669};
    CHECK(ns_tokenizer_decode(g_qwen, big, 1, false, &s, NULL, &err) == NS_ERR_RANGE);
    CHECK(ns_tokenizer_decode(g_qwen, NULL, 0, false, &s, NULL, &err) == NS_OK);
    CHECK(s && s[0] == 0);
    free(s);
}

/* Deterministic pseudo-random data. */
static uint32_t rng = 99;
static uint32_t rnd(void) {
    rng = rng * 1103515245u + 12345u;
    return rng >> 8;
}

TEST(stream_equals_decode_random_ids) {
    /* Random id sequences (any token, specials too) through every decoder. */
    ns_tokenizer *sp = make_bytefallback(SP_DECODER);
    ns_tokenizer *strip2 = make_bytefallback(
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Metaspace\","
        "\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"always\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\"a\",\"start\":2,\"stop\":2}]}");
    /* Not streamable (multi-character Replace after Fuse): held until flush. */
    ns_tokenizer *held = make_bytefallback(
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81" "a\"},\"content\":\"A\"}]}");
    ns_tokenizer *nodec = make_bytefallback("null"); /* tokens joined with spaces */
    /* Per-token Strip and regex Replace before the fuse; Metaspace after it. */
    ns_tokenizer *mixed = make_bytefallback(
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Strip\",\"content\":\"a\",\"start\":1,\"stop\":1},"
        "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"b+|<0x4[0-9]>\"},\"content\":\"B\"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Metaspace\","
        "\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"never\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":3,\"stop\":3}]}");
    ns_tokenizer *models[] = {g_qwen, g_llama, g_stories, sp, strip2, held, nodec, mixed};
    int fails = 0;
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        if (!models[m]) continue;
        int32_t nv = ns_tokenizer_n_vocab(models[m]);
        for (int rep = 0; rep < 60; rep++) {
            int32_t ids[24];
            size_t n = 1 + rnd() % 24;
            for (size_t i = 0; i < n; i++) {
                uint32_t r = rnd() % 10;
                /* Bias towards low ids (bytes, byte tokens) and small pieces. */
                ids[i] = r < 4 ? (int32_t)(rnd() % (nv < 300 ? nv : 300)) : (int32_t)(rnd() % (uint32_t)nv);
            }
            if (!stream_matches(models[m], ids, n, false) || !stream_matches(models[m], ids, n, true)) fails++;
        }
    }
    CHECKF(fails == 0, "%d random sequences streamed differently from decode", fails);
    ns_tokenizer_free(sp);
    ns_tokenizer_free(strip2);
    ns_tokenizer_free(held);
    ns_tokenizer_free(nodec);
    ns_tokenizer_free(mixed);
}

TEST(roundtrip_random_text) {
    /* Llama 3 has no normalizer: decode(encode(x)) == x for any valid text. */
    static const char *const parts[] = {"a", "Z", " ", "  ", "\n", "\t", "1", "23", "'s", "'S", "é", "ß", "\xCC\x81",
                                        "你", "好", "\xF0\x9F\x99\x82", "\xE2\x80\x8D", "\xC2\x85", "\xE1\xA0\x8E",
                                        "<|", "|>", "<|eot_id|>", ".", "!!", "\r\n", "\xC2\xA0"};
    int fails = 0;
    for (int rep = 0; rep < 200; rep++) {
        char text[512];
        size_t len = 0;
        int k = 1 + (int)(rnd() % 40);
        for (int i = 0; i < k; i++) {
            const char *p = parts[rnd() % (sizeof parts / sizeof *parts)];
            size_t pl = strlen(p);
            if (len + pl >= sizeof text) break;
            memcpy(text + len, p, pl);
            len += pl;
        }
        text[len] = 0;
        size_t n = 0;
        int32_t *ids = enc(g_llama, text, false, &n);
        char *s = dec(g_llama, ids, n, false);
        if (!s || strcmp(s, text) != 0) fails++;
        if (!stream_matches(g_llama, ids, n, false)) fails++;
        free(s);
        free(ids);
    }
    CHECKF(fails == 0, "%d round-trip failures", fails);
}

/* Runs a pre-tokenizer (JSON) over text; returns the pieces joined by '|'. */
static void pretok_pieces(const char *json, const char *text, char *out, size_t cap) {
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    ns_pretok *p = NULL;
    ns_error err = {0};
    out[0] = 0;
    CHECKF(j && ns_pretok_parse(j, &p, &err) == NS_OK, "%s %s", je.text, err.msg);
    json_decref(j);
    if (!p) return;
    ns_pieces io = {0}, tmp = {0};
    ns_rx_ctx rx = {0};
    ns_pieces_add(&io, text, strlen(text), true);
    CHECK(ns_pretok_run(p, &rx, &io, &tmp, &err) == NS_OK);
    size_t len = 0;
    for (size_t i = 0; i < io.n && len + io.v[i].len + 2 < cap; i++) {
        if (i) out[len++] = '|';
        memcpy(out + len, io.text.data + io.v[i].off, io.v[i].len);
        len += io.v[i].len;
    }
    out[len] = 0;
    ns_pieces_free(&io);
    ns_pieces_free(&tmp);
    ns_rx_ctx_free(&rx);
    ns_pretok_free(p);
}

#define CHECK_PIECES(json, text, want)                   \
    do {                                                 \
        char _got[512];                                  \
        pretok_pieces((json), (text), _got, sizeof _got); \
        CHECK_EQ_STR(_got, (want));                      \
    } while (0)

TEST(pretokenizer_behaviors) {
    /* The examples of tokenizers' SplitDelimiterBehavior documentation. */
    const char *t = "the-final--countdown";
#define SPLIT(b, inv) "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"" b "\",\"invert\":" inv "}"
    CHECK_PIECES(SPLIT("Removed", "false"), t, "the|final|countdown");
    CHECK_PIECES(SPLIT("Isolated", "false"), t, "the|-|final|-|-|countdown");
    CHECK_PIECES(SPLIT("MergedWithPrevious", "false"), t, "the-|final-|-|countdown");
    CHECK_PIECES(SPLIT("MergedWithNext", "false"), t, "the|-final|-|-countdown");
    CHECK_PIECES(SPLIT("Contiguous", "false"), t, "the|-|final|--|countdown");
    CHECK_PIECES(SPLIT("Removed", "true"), t, "-|-|-");
    CHECK_PIECES(SPLIT("MergedWithPrevious", "true"), "-a-b", "-a|-b");
#undef SPLIT
    /* Regex split (Isolated) with Unicode classes. */
    CHECK_PIECES("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+\"},\"behavior\":\"Isolated\"}",
                 "ab12cd\xD9\xA3\xD9\xA4", "ab|12|cd|\xD9\xA3\xD9\xA4");
    /* \\s is Unicode White_Space: NEL (U+0085) counts, U+180E does not. */
    CHECK_PIECES("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Removed\"}",
                 "a\xC2\x85" "b\xE1\xA0\x8E" "c", "a|b\xE1\xA0\x8E" "c");
    /* ByteLevel with the GPT-2 regex; spaces become "Ġ" (U+0120). */
    CHECK_PIECES("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}",
                 "Hello my friend, how's it?", "Hello|\xC4\xA0" "my|\xC4\xA0" "friend|,|\xC4\xA0" "how|'s|\xC4\xA0" "it|?");
    CHECK_PIECES("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}", "hi\n",
                 "\xC4\xA0" "hi\xC4\x8A");
    /* Metaspace: prepend + split on the replacement, merged with what follows. */
    CHECK_PIECES("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"always\","
                 "\"split\":true}",
                 "Hey  friend!", "\xE2\x96\x81Hey|\xE2\x96\x81|\xE2\x96\x81" "friend!");
    CHECK_PIECES("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"never\","
                 "\"split\":false}",
                 "Hey friend", "Hey\xE2\x96\x81" "friend");
    /* Sequence: Split then Metaspace "first": only the piece at offset 0 gets the prefix. */
    CHECK_PIECES("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":\",\"},"
                 "\"behavior\":\"Removed\"},{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                 "\"prepend_scheme\":\"first\",\"split\":false}]}",
                 "a,b", "\xE2\x96\x81" "a|b");
}

TEST(nfc_fast_path_matches_utf8proc) {
    /* Characters around every NFC corner: combining marks, composites,
     * Hangul jamo, singletons, exclusions, ccc=0 second elements. */
    static const uint32_t pool[] = {
        'a', 'e', 'A', ' ', 0x0300, 0x0301, 0x0327, 0x0323, 0x031B, 0x0308, 0x00E9, 0x1EC5, 0x0344, 0x0958,
        0x0915, 0x093C, 0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0x4E00, 0xF900, 0x212B, 0x2126, 0x03B1,
        0x0CC6, 0x0CD5, 0x0CC2, 0x0DD9, 0x0DCF, 0x0DCA, 0x0F73, 0x0F71, 0x0F72, 0x11099, 0x110BA, 0x1D157,
        0x1D165, 0x1D15E, 0x1F44D, 0x1F3FD, 0x3099, 0x304B, 0x309B, 0x0627, 0x0653, 0x05D0, 0x05B8, 0x0345,
        0x1E0A, 0x0307, 0x01B0, 0x2ADC, 0x0338, 0x226F, 0x003E, 0x00C5, 0x030A,
    };
    ns_normalizer *nfc = NULL;
    json_t *j = json_pack("{s:s}", "type", "NFC");
    CHECK(ns_normalizer_parse(j, &nfc, NULL) == NS_OK);
    json_decref(j);
    ns_rx_ctx rx = {0};
    ns_buf out;
    ns_buf_init(&out, 0);
    int fails = 0, changed = 0;
    for (int rep = 0; rep < 3000 && nfc; rep++) {
        char text[256];
        size_t len = 0;
        int k = 1 + (int)(rnd() % 12);
        for (int i = 0; i < k; i++) len += ns_utf8_encode(pool[rnd() % (sizeof pool / sizeof *pool)], text + len);
        text[len] = 0;
        utf8proc_uint8_t *want = utf8proc_NFC((const utf8proc_uint8_t *)text);
        if (ns_normalize(nfc, &rx, text, len, &out, NULL) != NS_OK || !want || out.len != strlen((char *)want) ||
            memcmp(out.data, want, out.len) != 0)
            fails++;
        if (want && strcmp((char *)want, text) != 0) changed++;
        free(want);
    }
    CHECKF(fails == 0, "%d NFC mismatches", fails);
    CHECKF(changed > 300, "only %d inputs changed under NFC: the test lost its teeth", changed);
    ns_buf_free(&out);
    ns_rx_ctx_free(&rx);
    ns_normalizer_free(nfc);
}

/* Several threads share one tokenizer: results must equal the serial ones. */
static const char *const k_thread_texts[] = {
    "The quick brown fox jumps over the lazy dog. ",
    "def add(a, b):\n    return a + b\n<|im_end|>",
    "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
    "   spaces\t\ttabs\n\nnewlines 12345 6.78e9",
};
typedef struct thread_job {
    const ns_tokenizer *t;
    int32_t *expect[4];
    size_t n_expect[4];
    int fails;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    for (int rep = 0; rep < 25; rep++) {
        for (int i = 0; i < 4; i++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (ns_tokenizer_encode(j->t, k_thread_texts[i], strlen(k_thread_texts[i]), true, &ids, &n, NULL) != NS_OK ||
                !ids_eq(ids, n, j->expect[i], j->n_expect[i]))
                j->fails++;
            char *s = NULL;
            if (ns_tokenizer_decode(j->t, ids, n, true, &s, NULL, NULL) != NS_OK) j->fails++;
            free(s);
            free(ids);
        }
    }
    return NULL;
}

TEST(concurrent_encode) {
    ns_tokenizer *models[] = {g_qwen, g_stories};
    for (int m = 0; m < 2; m++) {
        thread_job jobs[4];
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < 4; i++) {
            size_t n = 0;
            int32_t *ids = enc(models[m], k_thread_texts[i], true, &n);
            for (int k = 0; k < 4; k++) {
                jobs[k].t = models[m];
                jobs[k].expect[i] = ids;
                jobs[k].n_expect[i] = n;
            }
        }
        pthread_t th[4];
        for (int k = 0; k < 4; k++) pthread_create(&th[k], NULL, thread_main, &jobs[k]);
        int fails = 0;
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            fails += jobs[k].fails;
        }
        CHECKF(fails == 0, "model %d: %d concurrent mismatches", m, fails);
        for (int i = 0; i < 4; i++) free(jobs[0].expect[i]);
    }
}

int main(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/ns_tok_test_XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        printf("not ok - mkdtemp\n");
        return 1;
    }
    g_qwen = load_shared("tiny-qwen3");
    g_llama = load_shared("tiny-llama3");
    g_stories = load_shared("tinystories-656k");
    if (!g_qwen || !g_llama || !g_stories) {
        printf("not ok - load shared tokenizers\n");
        return 1;
    }
    RUN(invalid_utf8_rejected);
    RUN(load_errors_are_clear);
    RUN(config_and_templates);
    RUN(json_paths);
    RUN(vocab_lookup);
    RUN(added_token_matching);
    RUN(byte_fallback_and_detok_never_splits_chars);
    RUN(detok_byte_level_emoji);
    RUN(decode_errors);
    RUN(stream_equals_decode_random_ids);
    RUN(roundtrip_random_text);
    RUN(pretokenizer_behaviors);
    RUN(nfc_fast_path_matches_utf8proc);
    RUN(concurrent_encode);
    ns_tokenizer_free(g_qwen);
    ns_tokenizer_free(g_llama);
    ns_tokenizer_free(g_stories);
    rmdir(g_tmpdir);
    TEST_MAIN_END;
}
