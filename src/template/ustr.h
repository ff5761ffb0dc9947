/* ustr.h — Unicode character classes and case mappings with Python str
 * semantics.
 *
 * Template strings are (pointer, length) UTF-8 byte ranges; Python counts
 * and indexes them by code point and classifies characters with Unicode
 * properties, so everything here works on code points. Walking the bytes
 * (ns_utf8_next/prev/count/offset/encode) is util/utf8.h: input is assumed
 * to be valid UTF-8 (sources and JSON are validated on entry); a stray
 * invalid byte decodes as itself rather than crashing.
 */
#ifndef NS_TEMPLATE_USTR_H
#define NS_TEMPLATE_USTR_H

#include <stddef.h>
#include <stdint.h>

/* Python's str.isspace() for one code point (also what re's \s matches). */
int ns_u_isspace(uint32_t cp);
/* Python str.isprintable() for one code point (repr escapes the rest). */
int ns_u_isprintable(uint32_t cp);
int ns_u_isalpha(uint32_t cp);
int ns_u_isdigit(uint32_t cp);
int ns_u_isnumeric(uint32_t cp);
int ns_u_iscased(uint32_t cp);
int ns_u_islower(uint32_t cp);
int ns_u_isupper(uint32_t cp);
/* Simple (one-to-one) case mappings; Python's few one-to-many mappings
 * such as 'ß'.upper() == 'SS' are not reproduced. */
uint32_t ns_u_lower(uint32_t cp);
uint32_t ns_u_upper(uint32_t cp);
uint32_t ns_u_title(uint32_t cp);
/* Python str.splitlines() line boundary (\n \r \v \f \x1c-\x1e \x85
 * \u2028 \u2029; \r\n is handled by the caller). */
int ns_u_islinebreak(uint32_t cp);

#endif
