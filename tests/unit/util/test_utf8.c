/* util/utf8: strict validation, the two decoders, walking back and forth,
 * encoding, counting, whole-character prefixes and lossy decoding. */
#include <stdint.h>

#include "test.h"
#include "util/utf8.h"

/* A straightforward reference validator (decode, then reject overlongs,
 * surrogates and values above U+10FFFF). */
static int ref_valid(const unsigned char *u, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t min;
        if ((c & 0xE0) == 0xC0) len = 2, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, min = 0x10000;
        else return 0;
        if (i + (size_t)len > n) return 0;
        uint32_t cp = c & (0x3Fu >> (len - 1));
        for (int j = 1; j < len; j++) {
            if ((u[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

TEST(utf8_valid_cases) {
    size_t bad = 99;
    CHECK(ns_utf8_valid("", 0, NULL));
    CHECK(ns_utf8_valid("plain ascii, long enough for the fast path", 42, NULL));
    CHECK(ns_utf8_valid("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80", 15, NULL));
    CHECK(!ns_utf8_valid("ab\xC0\xAF", 4, &bad)); /* overlong '/' */
    CHECK_EQ_INT(bad, 2);
    CHECK(!ns_utf8_valid("\xED\xA0\x80", 3, &bad)); /* surrogate U+D800 */
    CHECK_EQ_INT(bad, 0);
    CHECK(!ns_utf8_valid("\xF4\x90\x80\x80", 4, NULL)); /* U+110000 */
    CHECK(!ns_utf8_valid("abcdefgh\xE2\x82", 10, &bad)); /* truncated after the fast path */
    CHECK_EQ_INT(bad, 8);
    CHECK(!ns_utf8_valid("\x80", 1, NULL));
    CHECK(!ns_utf8_valid("\xFF", 1, NULL));
}

TEST(utf8_valid_matches_reference_fuzz) {
    static const unsigned char alphabet[] = {'a', 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                                             0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4,
                                             0xF5, 0xF7, 0xF8, 0xFF};
    int mismatches = 0;
    for (int it = 0; it < 200000; it++) {
        unsigned char s[12];
        size_t n = rnd() % sizeof s;
        for (size_t i = 0; i < n; i++) s[i] = alphabet[rnd() % sizeof alphabet];
        if (ns_utf8_valid((const char *)s, n, NULL) != (ref_valid(s, n) == 1)) mismatches++;
    }
    CHECK_EQ_INT(mismatches, 0);
}

TEST(utf8_encode_decode_roundtrip) {
    static const uint32_t cps[] = {0, 'A', 0x7F, 0x80, 0x7FF, 0x800, 0xFFFD, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF};
    for (size_t k = 0; k < sizeof cps / sizeof *cps; k++) {
        char b[4];
        size_t n = ns_utf8_encode(cps[k], b);
        CHECK_EQ_INT(n, cps[k] < 0x80 ? 1 : cps[k] < 0x800 ? 2 : cps[k] < 0x10000 ? 3 : 4);
        CHECK(ns_utf8_valid(b, n, NULL));
        CHECK_EQ_INT(ns_utf8_len((unsigned char)b[0]), n);
        uint32_t cp = 0;
        CHECK_EQ_INT(ns_utf8_decode(b, n, 0, &cp), n);
        CHECK_EQ_INT(cp, cps[k]);
        size_t i = 0;
        CHECK_EQ_INT(ns_utf8_next(b, n, &i), cps[k]);
        CHECK_EQ_INT(i, n);
        i = n;
        CHECK_EQ_INT(ns_utf8_prev(b, &i), cps[k]);
        CHECK_EQ_INT(i, 0);
    }
}

TEST(utf8_walkers_agree_on_valid_text) {
    const char *s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
    size_t n = strlen(s);
    CHECK_EQ_INT(ns_utf8_count(s, n), 5);
    size_t i = 0, k = 0;
    uint32_t fwd[8];
    while (i < n) {
        uint32_t a, b;
        size_t l = ns_utf8_decode(s, n, i, &a);
        size_t j = i;
        b = ns_utf8_next(s, n, &j);
        CHECK_EQ_INT(a, b);
        CHECK_EQ_INT(j, i + l);
        CHECK_EQ_INT(ns_utf8_offset(s, n, k), i);
        fwd[k++] = a;
        i = j;
    }
    CHECK_EQ_INT(k, 5);
    CHECK_EQ_INT(ns_utf8_offset(s, n, 5), n);
    CHECK_EQ_INT(ns_utf8_offset(s, n, 99), n);
    i = n;
    while (i > 0) CHECK_EQ_INT(ns_utf8_prev(s, &i), fwd[--k]);
    CHECK_EQ_INT(k, 0);
}

TEST(utf8_tolerant_walkers_on_invalid_bytes) {
    /* a stray continuation, a truncated 3-byte sequence, a bad lead */
    const char *s = "\x80" "\xE2\x82" "\xFF";
    size_t n = 4, i = 0;
    CHECK_EQ_INT(ns_utf8_next(s, n, &i), 0x80);
    CHECK_EQ_INT(i, 1);
    CHECK_EQ_INT(ns_utf8_next(s, n, &i), 0xE2); /* truncated: its lead byte alone */
    CHECK_EQ_INT(i, 2);
    CHECK_EQ_INT(ns_utf8_next(s, n, &i), 0x82);
    CHECK_EQ_INT(ns_utf8_next(s, n, &i), 0xFF);
    CHECK_EQ_INT(i, 4);
    i = 3;
    CHECK_EQ_INT(ns_utf8_prev(s, &i), 0x82); /* malformed tail: last byte alone */
    CHECK_EQ_INT(i, 2);
    /* the valid-input decoder never reads past n on a cut sequence */
    uint32_t cp;
    CHECK_EQ_INT(ns_utf8_decode("\xF0\x9F", 2, 0, &cp), 1);
    CHECK_EQ_INT(cp, 0xF0);
}

TEST(utf8_complete_prefix) {
    const char *s = "ab\xE2\x82\xAC" "c\xF0\x9F\x98\x80";
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 0), 0);
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 2), 2);
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 3), 2); /* lead byte only */
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 4), 2); /* 2 of 3 bytes */
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 5), 5);
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 9), 6); /* 3 of 4 bytes */
    CHECK_EQ_INT(ns_utf8_complete(s, 0, 10), 10);
    CHECK_EQ_INT(ns_utf8_complete(s, 3, 4), 4); /* from inside a character: nothing to hold back */
    CHECK_EQ_INT(ns_utf8_complete(s, 2, 4), 2);
}

TEST(utf8_lossy_like_rust) {
    ns_buf b;
    ns_buf_init(&b, 0);
    size_t used = 0;
    /* from_utf8_lossy("Hello\xF0\x90\x80World") == "Hello\u{FFFD}World" */
    CHECK(ns_utf8_lossy(&b, (const unsigned char *)"Hello\xF0\x90\x80World", 13, true, &used) == NS_OK);
    CHECK_EQ_STR(b.data, "Hello\xEF\xBF\xBDWorld");
    CHECK_EQ_INT(used, 13);
    /* each maximal invalid subpart is one U+FFFD: C0 and AF separately */
    ns_buf_reset(&b);
    CHECK(ns_utf8_lossy(&b, (const unsigned char *)"\xC0\xAF", 2, true, &used) == NS_OK);
    CHECK_EQ_STR(b.data, "\xEF\xBF\xBD\xEF\xBF\xBD");
    /* not final: an incomplete tail is held back */
    ns_buf_reset(&b);
    CHECK(ns_utf8_lossy(&b, (const unsigned char *)"ok\xE2\x82", 4, false, &used) == NS_OK);
    CHECK_EQ_STR(b.data, "ok");
    CHECK_EQ_INT(used, 2);
    ns_buf_free(&b);
}

int main(void) {
    RUN(utf8_valid_cases);
    RUN(utf8_valid_matches_reference_fuzz);
    RUN(utf8_encode_decode_roundtrip);
    RUN(utf8_walkers_agree_on_valid_text);
    RUN(utf8_tolerant_walkers_on_invalid_bytes);
    RUN(utf8_complete_prefix);
    RUN(utf8_lossy_like_rust);
    TEST_MAIN_END;
}
