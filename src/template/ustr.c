#include "template/ustr.h"

#include <utf8proc.h>

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
