#include "util/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static ns_log_level g_level = NS_LOG_WARN;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

void ns_log_set_level(ns_log_level lvl) { g_level = lvl; }
ns_log_level ns_log_get_level(void) { return g_level; }

int ns_log_parse_level(const char *s) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

void ns_log(ns_log_level lvl, const char *fmt, ...) {
    if (lvl < g_level || lvl >= NS_LOG_OFF) return;
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     tags[lvl]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log_mu);
    fprintf(stderr, "%s\n", line);
    pthread_mutex_unlock(&g_log_mu);
}
