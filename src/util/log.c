#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/utf8.h"

static ns_log_level g_level = NS_LOG_WARN;
static atomic_bool g_prompts;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char t_ctx[NS_LOG_MAX_CONTEXT + 1];

void ns_log_set_level(ns_log_level lvl) { g_level = lvl; }
ns_log_level ns_log_get_level(void) { return g_level; }

bool ns_log_prompts(void) { return atomic_load_explicit(&g_prompts, memory_order_relaxed); }
void ns_log_set_prompts(bool on) { atomic_store(&g_prompts, on); }

int ns_log_parse_level(const char *s) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

void ns_log_set_context(const char *fmt, ...) {
    t_ctx[0] = 0;
    if (!fmt) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t_ctx, sizeof t_ctx, fmt, ap);
    va_end(ap);
    if (n < 0) t_ctx[0] = 0;
}

void ns_log_clear_context(void) { t_ctx[0] = 0; }
const char *ns_log_context(void) { return t_ctx; }

/* Length of the well-formed UTF-8 sequence at s[i] (2..4), 0 if none. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    size_t len = ns_utf8_len(s[i]);
    if (s[i] < 0xC2 || s[i] > 0xF4 || len < 2 || len > n - i) return 0;
    if (!ns_utf8_valid((const char *)s + i, len, NULL)) return 0;
    ns_utf8_decode((const char *)s, n, i, cp);
    return len;
}

size_t ns_log_escape(const char *str, size_t n, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, k = 0;
    if (!cap) return 0;
    while (i < n) {
        unsigned char b = s[i];
        size_t len = 1;
        bool esc;
        if (b < 0x80) {
            esc = b < 0x20 || b == 0x7f;
        } else {
            uint32_t cp = 0;
            len = utf8_seq(s, n, i, &cp);
            if (len == 0) {
                len = 1; /* not well-formed: this byte alone */
                esc = true;
            } else {
                esc = (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029;
            }
        }
        size_t need = esc ? 4 * len : len;
        if (k + need + 1 > cap) break;
        for (size_t j = 0; j < len; j++) {
            unsigned char c = s[i + j];
            if (esc) {
                out[k++] = '\\';
                out[k++] = 'x';
                out[k++] = hex[c >> 4];
                out[k++] = hex[c & 15];
            } else {
                out[k++] = (char)c;
            }
        }
        i += len;
    }
    out[k] = 0;
    return i;
}

void ns_log(ns_log_level lvl, const char *fmt, ...) {
    if (lvl < g_level || lvl >= NS_LOG_OFF) return;
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char msg[NS_LOG_MAX_MESSAGE + 1];
    /* prefix + escaped context + escaped message + "...\n" */
    char line[64 + 4 * NS_LOG_MAX_CONTEXT + 4 * NS_LOG_MAX_MESSAGE + 8];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0) m = snprintf(msg, sizeof msg, "(unformattable log message: %s)", fmt);
    if (m < 0) m = 0, msg[0] = 0;
    size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;

    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     tags[lvl]);
    size_t k = n > 0 ? (size_t)n : 0;
    if (t_ctx[0]) {
        line[k++] = '[';
        ns_log_escape(t_ctx, strlen(t_ctx), line + k, sizeof line - k);
        k += strlen(line + k);
        line[k++] = ']';
        line[k++] = ' ';
    }
    ns_log_escape(msg, mlen, line + k, sizeof line - k - 5);
    k += strlen(line + k);
    if ((size_t)m > mlen) {
        memcpy(line + k, "...", 3);
        k += 3;
    }
    line[k++] = '\n';
    pthread_mutex_lock(&g_log_mu);
    fwrite(line, 1, k, stderr);
    pthread_mutex_unlock(&g_log_mu);
}
