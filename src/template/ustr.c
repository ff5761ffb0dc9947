#include "template/ustr.h"

#include <utf8proc.h>

uint32_t ns_u8_next(const char *s, size_t n, size_t *i) {
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

uint32_t ns_u8_prev(const char *s, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    size_t start = k - 1;
    int back = 0;
    while (start > 0 && (u[start] & 0xC0) == 0x80 && back < 3) {
        start--;
        back++;
    }
    size_t j = start;
    uint32_t cp = ns_u8_next(s, k, &j);
    if (j != k) { /* malformed tail: treat the last byte alone */
        start = k - 1;
        cp = u[start];
    }
    *i = start;
    return cp;
}

size_t ns_u8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int ns_u8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
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
        uint32_t cp = c & (0x3F >> (len - 1));
        for (int j = 1; j < len; j++) {
            if ((u[i + j] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

size_t ns_u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t ns_u8_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (k > 0 && i < n) {
        ns_u8_next(s, n, &i);
        k--;
    }
    return i;
}

int ns_u_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int ns_u_isprintable(uint32_t c) {
    if (c == ' ') return 1;
    if (c < 0x7F) return c > 0x20;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

int ns_u_isalpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

int ns_u_isdigit(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND;
}

int ns_u_isnumeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

int ns_u_iscased(uint32_t c) {
    if (c < 0x80) return ns_u_isalpha(c);
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           utf8proc_islower((utf8proc_int32_t)c) || utf8proc_isupper((utf8proc_int32_t)c);
}

int ns_u_islower(uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z';
    return utf8proc_islower((utf8proc_int32_t)c);
}

int ns_u_isupper(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z';
    return utf8proc_isupper((utf8proc_int32_t)c);
}

uint32_t ns_u_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

uint32_t ns_u_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
}

uint32_t ns_u_title(uint32_t c) {
    if (c < 0x80) return ns_u_upper(c);
    return (uint32_t)utf8proc_totitle((utf8proc_int32_t)c);
}

int ns_u_islinebreak(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
}
