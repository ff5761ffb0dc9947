#include "util/utf8.h"

#include <string.h>

/* ---- validation ---- */

/* Length of the valid sequence starting at s[i], or 0 if the sequence is
 * invalid, or -(k) when the k bytes available are a valid but incomplete
 * prefix (only possible at the end of the input). The second-byte ranges are
 * the Unicode "well-formed byte sequences" table, which is what Rust uses. */
static int seq_len(const unsigned char *s, size_t n, size_t i, size_t *bad_len) {
    unsigned char b = s[i];
    if (b < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else {
        *bad_len = 1;
        return 0;
    }
    size_t k = 1;
    for (int j = 0; j < need; j++, k++) {
        if (i + k >= n) return -(int)k; /* ran out of input: incomplete */
        unsigned char c = s[i + k];
        unsigned char l = j == 0 ? lo : 0x80, h = j == 0 ? hi : 0xBF;
        if (c < l || c > h) {
            *bad_len = k; /* maximal subpart: lead + valid continuations */
            return 0;
        }
    }
    return need + 1;
}

bool ns_utf8_valid(const char *str, size_t n, size_t *bad_at) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad = 0;
        int l = seq_len(s, n, i, &bad);
        if (l <= 0) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += (size_t)l;
    }
    return true;
}

size_t ns_utf8_decode(const char *str, size_t n, size_t i, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned char b = s[i];
    if (b < 0x80 || i + 1 >= n) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
        return 2;
    }
    if (b < 0xF0) {
        if (i + 2 >= n) return *cp = b, 1;
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
        return 3;
    }
    if (i + 3 >= n) return *cp = b, 1;
    *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
          ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    return 4;
}

size_t ns_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- tolerant walkers ---- */

uint32_t ns_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    unsigned c = u[k];
    if (c < 0x80) {
        *i = k + 1;
        return c;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (len == 1 || k + (size_t)len > n) {
        *i = k + 1;
        return c;
    }
    uint32_t cp = c & (0x3F >> (len - 1));
    for (int j = 1; j < len; j++) {
        if ((u[k + j] & 0xC0) != 0x80) {
            *i = k + 1;
            return c;
        }
        cp = (cp << 6) | (u[k + j] & 0x3F);
    }
    *i = k + (size_t)len;
    return cp;
}

uint32_t ns_utf8_prev(const char *s, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    size_t start = k - 1;
    int back = 0;
    while (start > 0 && (u[start] & 0xC0) == 0x80 && back < 3) {
        start--;
        back++;
    }
    size_t j = start;
    uint32_t cp = ns_utf8_next(s, k, &j);
    if (j != k) { /* malformed tail: treat the last byte alone */
        start = k - 1;
        cp = u[start];
    }
    *i = start;
    return cp;
}

size_t ns_utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t ns_utf8_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k > 0 && i < n) {
        ns_utf8_next(s, n, &i);
        k--;
    }
    return i;
}

size_t ns_utf8_complete(const char *s, size_t from, size_t to) {
    size_t i = to;
    while (i > from && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && to - i < 3) i--;
    if (i == from) return to;
    unsigned char b = (unsigned char)s[i - 1];
    if (b < 0x80) return to;
    size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    return to - (i - 1) >= need ? to : i - 1;
}

/* ---- lossy decoding ---- */

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

ns_status ns_utf8_lossy(ns_buf *out, const unsigned char *s, size_t n, bool final, size_t *consumed) {
    size_t i = 0, run = 0; /* [run, i) is a pending valid run to copy */
    ns_status st = NS_OK;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad = 0;
        int l = seq_len(s, n, i, &bad);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if ((st = ns_buf_append(out, s + run, i - run)) != NS_OK) return st;
        if (l < 0) { /* incomplete at end of input */
            if (!final) {
                if (consumed) *consumed = i;
                return NS_OK;
            }
            if ((st = ns_buf_append(out, REPLACEMENT, 3)) != NS_OK) return st;
            i = n;
        } else {
            if ((st = ns_buf_append(out, REPLACEMENT, 3)) != NS_OK) return st;
            i += bad;
        }
        run = i;
    }
    if ((st = ns_buf_append(out, s + run, n - run)) != NS_OK) return st;
    if (consumed) *consumed = n;
    return NS_OK;
}
