/* tokutil.h — small building blocks shared by the tokenizer modules.
 *
 * - Strict UTF-8 validation/decoding with Rust `str` rules (no overlongs, no
 *   surrogates, nothing above U+10FFFF), because Hugging Face tokenizers only
 *   ever sees valid Rust strings.
 * - Lossy UTF-8 decoding that replaces each maximal invalid subpart with one
 *   U+FFFD, exactly like Rust's String::from_utf8_lossy, and can run
 *   incrementally (holding back an incomplete trailing sequence).
 * - Unicode predicates as Rust defines them (char::is_whitespace,
 *   char::is_alphanumeric) and the GPT-2 byte<->char tables of ByteLevel.
 * - ns_strmap: an open-addressing string -> int32 map (xxh3). Keys are NOT
 *   copied: they must outlive the map (the tokenizer keeps them in an arena).
 * - ns_ids / ns_strlist: growable id arrays and string lists (own their memory).
 * - ns_json_int: integers from JSON parsed with JSON_DECODE_INT_AS_REAL (the
 *   tokenizer parses that way because tokenizer_config.json files carry
 *   integers, like model_max_length = 1e30, that overflow jansson's int).
 *
 * Invariant: every function that takes UTF-8 marked "valid" assumes the caller
 * validated it; none of them reads past the given length.
 */
#ifndef NS_TOKUTIL_H
#define NS_TOKUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/status.h"

/* ---- UTF-8 ---- */

/* Returns true when s[0..n) is valid UTF-8. When false and bad_at is
 * non-NULL, *bad_at is the byte offset of the first invalid sequence. */
bool ns_utf8_valid(const char *s, size_t n, size_t *bad_at);
/* Decodes the character at s[i] of VALID UTF-8; returns its byte length. */
size_t ns_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp);
/* Encodes cp (<= 0x10FFFF, not a surrogate) into out; returns 1..4. */
size_t ns_utf8_encode(uint32_t cp, char out[4]);
/* Byte length of the character starting with lead byte b of VALID UTF-8. */
static inline size_t ns_utf8_len(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* Appends the lossy decoding of s[0..n) to out. When final is false, an
 * incomplete (but so far valid) sequence at the very end is not consumed;
 * *consumed tells how many bytes were. When final is true all n bytes are
 * consumed and a trailing incomplete sequence becomes one U+FFFD. */
ns_status ns_utf8_lossy(ns_buf *out, const unsigned char *s, size_t n, bool final, size_t *consumed);

/* ---- Unicode predicates (Rust semantics) ---- */
bool ns_uni_is_whitespace(uint32_t cp); /* White_Space property */
bool ns_uni_is_alnum(uint32_t cp);      /* letters and numbers (L*, N*) */

/* ---- GPT-2 ByteLevel alphabet ---- */
/* Codepoint that stands for byte b. */
uint32_t ns_bytelevel_char(unsigned char b);
/* Byte that codepoint cp stands for, or -1 when cp is not in the alphabet. */
int ns_bytelevel_byte(uint32_t cp);

/* ---- string -> int32 map ---- */
#define NS_STRMAP_HEAD 12
typedef struct ns_strmap_ent {
    const char *key; /* NULL = empty slot */
    uint32_t len;
    uint32_t hash32;
    int32_t val;
    /* The key's first bytes, so most lookups never touch the key memory
     * (the map is probed ~1M times while loading a large vocabulary). */
    char head[NS_STRMAP_HEAD];
} ns_strmap_ent;

typedef struct ns_strmap {
    ns_strmap_ent *e;
    size_t cap; /* power of two */
    size_t n;
} ns_strmap;

uint64_t ns_strhash(const char *s, size_t n);
/* Sizes the map for `expect` keys. The map owns its slot array only. */
ns_status ns_strmap_init(ns_strmap *m, size_t expect);
void ns_strmap_free(ns_strmap *m);
/* Inserts or overwrites. The key bytes are referenced, not copied. */
ns_status ns_strmap_put(ns_strmap *m, const char *key, size_t len, int32_t val);
/* Returns the value or -1 when absent. */
int32_t ns_strmap_get(const ns_strmap *m, const char *key, size_t len);

/* ---- JSON ---- */
/* True when j is a JSON number with an integral value in [lo, hi]. */
bool ns_json_int(const json_t *j, int64_t lo, int64_t hi, int64_t *out);

/* ---- growable int32 array ---- */
typedef struct ns_ids {
    int32_t *v;
    size_t n, cap;
} ns_ids;

ns_status ns_ids_push(ns_ids *a, int32_t id);
ns_status ns_ids_append(ns_ids *a, const int32_t *ids, size_t n);
void ns_ids_free(ns_ids *a);

/* ---- list of strings stored back to back in one buffer ---- */
typedef struct ns_strlist {
    ns_buf text;     /* all strings, concatenated */
    size_t *off;     /* n+1 offsets into text: string i is [off[i], off[i+1]) */
    size_t n, cap;
} ns_strlist;

void ns_strlist_init(ns_strlist *l);
void ns_strlist_reset(ns_strlist *l);
void ns_strlist_free(ns_strlist *l);
ns_status ns_strlist_push(ns_strlist *l, const char *s, size_t n);
/* Starts a new empty string that subsequent ns_strlist_extend calls grow. */
ns_status ns_strlist_begin(ns_strlist *l);
ns_status ns_strlist_extend(ns_strlist *l, const char *s, size_t n);
static inline const char *ns_strlist_at(const ns_strlist *l, size_t i, size_t *len) {
    *len = l->off[i + 1] - l->off[i];
    return l->text.data ? l->text.data + l->off[i] : "";
}

#endif
