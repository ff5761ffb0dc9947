/* tokutil.h — small building blocks shared by the tokenizer modules.
 *
 * - UTF-8 (strict validation with Rust `str` rules, decoding, lossy
 *   decoding like String::from_utf8_lossy) lives in util/utf8.h, which this
 *   header includes for the tokenizer modules.
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
#include "util/utf8.h"

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
