/* fuzz_tokenizer — encode/decode of the fixture tokenizers: tiny-qwen3
 * (byte-level BPE, Qwen2 regex, NFC), tiny-llama3 (byte-level BPE, Llama 3
 * regex) and tinystories-656k (SentencePiece-style BPE, byte fallback).
 *
 * Input: byte 0 picks the tokenizer (% 3), add_special (bit 2),
 * skip_special (bit 3) and the mode (bit 4): text (the rest is the text)
 * or ids (the rest, 3 bytes per id, mod n_vocab + 16 so some are out of
 * range). Byte 1 also sets the bounded encoder's limit in text mode.
 *
 * Oracles (the contracts of tokenizer.h):
 * - encode fails exactly when the text is not UTF-8 (NS_ERR_INVALID);
 * - ns_tokenizer_encode_limit gives the same ids when they fit the limit,
 *   and "exceeded" with a lower bound above the limit when they do not;
 * - the streaming detokenizer's chunks plus its flush equal
 *   ns_tokenizer_decode of the same ids, and are valid UTF-8;
 * - decode fails (NS_ERR_RANGE) exactly when an id is out of range. */
#include <stdint.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"
#include "util/utf8.h"

#define N_TOK 3
static ns_tokenizer *g_tok[N_TOK];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    static const char *names[N_TOK] = {"tiny-qwen3", "tiny-llama3", "tinystories-656k"};
    for (int i = 0; i < N_TOK; i++) {
        ns_error err = {0};
        if (ns_tokenizer_load(fuzz_model_dir(names[i]), &g_tok[i], &err) != NS_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", names[i], err.msg);
            exit(1);
        }
    }
    return 0;
}

/* decode(ids) == detok stream of ids (every id in range). */
static void check_decode(const ns_tokenizer *t, const int32_t *ids, size_t n, bool skip_special) {
    char *text = NULL;
    size_t len = 0;
    ns_error err = {0};
    ns_status st = ns_tokenizer_decode(t, ids, n, skip_special, &text, &len, &err);
    FUZZ_CHECK(st == NS_OK);
    FUZZ_CHECK(text && strlen(text) <= len); /* may hold NUL from a NUL token */
    ns_detok *d = NULL;
    FUZZ_CHECK(ns_detok_create(t, skip_special, &d) == NS_OK);
    ns_buf out;
    ns_buf_init(&out, 0);
    for (size_t i = 0; i < n; i++) {
        size_t before = out.len;
        FUZZ_CHECK(ns_detok_push(d, ids[i], &out) == NS_OK);
        /* every chunk is whole characters */
        if (out.len > before) FUZZ_CHECK(ns_utf8_valid(out.data + before, out.len - before, NULL));
    }
    FUZZ_CHECK(ns_detok_flush(d, &out) == NS_OK);
    if (out.len != len || (len && memcmp(out.data, text, len) != 0)) {
        fprintf(stderr, "stream [%.*s] != decode [%.*s]\n", (int)out.len, out.data ? out.data : "", (int)len, text);
        FUZZ_CHECK(0);
    }
    FUZZ_CHECK(ns_utf8_valid(text, len, NULL));
    ns_buf_free(&out);
    ns_detok_free(d);
    free(text);
}

/* ns_tokenizer_encode_limit agrees with ns_tokenizer_encode (ids, n_ids). */
static void check_limit(const ns_tokenizer *t, const char *text, size_t n, bool add_special, const int32_t *ids,
                        size_t n_ids, uint8_t limit_byte) {
    size_t limit = limit_byte < 200 ? limit_byte : n_ids + (size_t)(limit_byte - 200);
    int32_t *lids = NULL;
    size_t ln = 0;
    bool exceeded = false;
    ns_error err = {0};
    ns_status st = ns_tokenizer_encode_limit(t, text, n, add_special, limit, &lids, &ln, &exceeded, &err);
    FUZZ_CHECK(st == NS_OK);
    if (n_ids <= limit) {
        FUZZ_CHECK(!exceeded && ln == n_ids && lids != NULL);
        FUZZ_CHECK(n_ids == 0 || memcmp(lids, ids, n_ids * sizeof *ids) == 0);
    } else {
        FUZZ_CHECK(exceeded && lids == NULL && ln > limit && ln <= n_ids);
    }
    free(lids);
}

static void text_mode(const ns_tokenizer *t, const uint8_t *p, size_t n, bool add_special, bool skip_special,
                      uint8_t limit_byte) {
    const char *text = (const char *)p;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ns_error err = {0};
    ns_status st = ns_tokenizer_encode(t, text, n, add_special, &ids, &n_ids, &err);
    bool valid = ns_utf8_valid(text, n, NULL);
    if (!valid) {
        FUZZ_CHECK(st == NS_ERR_INVALID);
        free(ids);
        return;
    }
    FUZZ_CHECK(st == NS_OK && ids != NULL);
    int32_t nv = ns_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n_ids; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv);

    check_limit(t, text, n, add_special, ids, n_ids, limit_byte);

    check_decode(t, ids, n_ids, skip_special);
    free(ids);
}

static void ids_mode(const ns_tokenizer *t, const uint8_t *p, size_t n, bool skip_special) {
    int32_t nv = ns_tokenizer_n_vocab(t);
    size_t m = n / 3;
    if (m > 4096) m = 4096;
    int32_t *ids = malloc((m ? m : 1) * sizeof *ids);
    int32_t *ok_ids = malloc((m ? m : 1) * sizeof *ids);
    FUZZ_CHECK(ids && ok_ids);
    size_t n_ok = 0;
    bool any_bad = false;
    for (size_t i = 0; i < m; i++) {
        uint32_t v = (uint32_t)p[3 * i] | (uint32_t)p[3 * i + 1] << 8 | (uint32_t)p[3 * i + 2] << 16;
        ids[i] = (int32_t)(v % (uint32_t)(nv + 16)) - (v & 0x800000 ? 8 : 0); /* a few negative ones too */
        if (ids[i] >= 0 && ids[i] < nv) ok_ids[n_ok++] = ids[i];
        else any_bad = true;
    }
    char *text = NULL;
    size_t len = 0;
    ns_error err = {0};
    ns_status st = ns_tokenizer_decode(t, ids, m, skip_special, &text, &len, &err);
    FUZZ_CHECK(any_bad ? st == NS_ERR_RANGE : st == NS_OK);
    free(text);
    /* out-of-range ids are refused one by one; the stream stays usable */
    ns_detok *d = NULL;
    FUZZ_CHECK(ns_detok_create(t, skip_special, &d) == NS_OK);
    ns_buf out;
    ns_buf_init(&out, 0);
    for (size_t i = 0; i < m; i++) {
        ns_status ps = ns_detok_push(d, ids[i], &out);
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < nv ? ps == NS_OK : ps == NS_ERR_RANGE);
    }
    FUZZ_CHECK(ns_detok_flush(d, &out) == NS_OK);
    char *ok_text = NULL;
    size_t ok_len = 0;
    FUZZ_CHECK(ns_tokenizer_decode(t, ok_ids, n_ok, skip_special, &ok_text, &ok_len, &err) == NS_OK);
    FUZZ_CHECK(out.len == ok_len && (ok_len == 0 || memcmp(out.data, ok_text, ok_len) == 0));
    free(ok_text);
    ns_buf_free(&out);
    ns_detok_free(d);
    check_decode(t, ok_ids, n_ok, !skip_special);
    free(ids);
    free(ok_ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    uint8_t sel = data[0];
    const ns_tokenizer *t = g_tok[sel % N_TOK];
    bool add_special = sel & 4, skip_special = sel & 8, ids = sel & 16;
    if (ids) ids_mode(t, data + 1, size - 1, skip_special);
    else text_mode(t, data + 2, size - 2, add_special, skip_special, data[1]);
    return 0;
}
