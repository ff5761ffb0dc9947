/* utf8.h — the one set of UTF-8 helpers (byte strings, code points).
 *
 * Validation is strict, with Rust `str` / Unicode "well-formed" rules: no
 * overlong forms, no surrogates, nothing above U+10FFFF (what Hugging Face
 * tokenizers, Python and JSON all agree on).
 *
 * Two kinds of decoding:
 * - ns_utf8_decode / ns_utf8_len take VALID UTF-8 (the caller validated
 *   it) and are the fast path of the tokenizer;
 * - ns_utf8_next / ns_utf8_prev tolerate anything: a byte that does not
 *   start a complete sequence decodes as itself (one byte), so a stray
 *   invalid byte never crashes a walker (the template engine's strings).
 * On valid input both kinds agree.
 *
 * ns_utf8_lossy replaces each maximal invalid subpart with one U+FFFD,
 * exactly like Rust's String::from_utf8_lossy, and can run incrementally.
 *
 * Invariant: no function reads outside the range it is given.
 */
#ifndef NS_UTF8_H
#define NS_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/status.h"

/* True when s[0..n) is well-formed UTF-8. When false and bad_at is
 * non-NULL, *bad_at is the byte offset of the first invalid sequence. */
bool ns_utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Byte length of the character starting with lead byte b of VALID UTF-8. */
static inline size_t ns_utf8_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }
/* Decodes the character at s[i] (i < n) of VALID UTF-8; returns its byte
 * length. A sequence cut by n decodes as its lead byte, length 1. */
size_t ns_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp);

/* Decodes the code point at s[*i] (*i < n) and advances *i past it; an
 * invalid or truncated sequence yields its first byte alone. */
uint32_t ns_utf8_next(const char *s, size_t n, size_t *i);
/* Steps back from byte offset *i (> 0) to the start of the previous code
 * point and returns it (a malformed tail: the last byte alone). */
uint32_t ns_utf8_prev(const char *s, size_t *i);

/* Encodes cp (<= 0x10FFFF) into out; returns the byte count 1..4. */
size_t ns_utf8_encode(uint32_t cp, char out[4]);

/* Number of code points in s[0..n) (bytes that are not continuations). */
size_t ns_utf8_count(const char *s, size_t n);
/* Byte offset of code point number k (k >= count gives n). */
size_t ns_utf8_offset(const char *s, size_t n, size_t k);
/* End of the longest prefix of s[from..to) that does not end inside a
 * character: `to` unless the last (up to 4) bytes are an incomplete
 * sequence, then where that sequence starts. For cutting a growing text
 * into whole characters (a JSON string must not end mid-character). */
size_t ns_utf8_complete(const char *s, size_t from, size_t to);

/* Appends the lossy decoding of s[0..n) to out. When final is false, an
 * incomplete (but so far valid) sequence at the very end is not consumed;
 * *consumed tells how many bytes were. When final is true all n bytes are
 * consumed and a trailing incomplete sequence becomes one U+FFFD. */
ns_status ns_utf8_lossy(ns_buf *out, const unsigned char *s, size_t n, bool final, size_t *consumed);

#endif
