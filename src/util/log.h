/* log.h — leveled logging to stderr, safe from any thread.
 *
 * One line per call, prefixed with time, level and thread role. Level is set
 * once at start-up (NS_LOG_LEVEL env or --log-level) before threads start.
 */
#ifndef NS_LOG_H
#define NS_LOG_H

typedef enum { NS_LOG_DEBUG = 0, NS_LOG_INFO, NS_LOG_WARN, NS_LOG_ERROR, NS_LOG_OFF } ns_log_level;

void ns_log_set_level(ns_log_level lvl);
ns_log_level ns_log_get_level(void);
/* Parses "debug|info|warn|error|off"; returns -1 when unknown. */
int ns_log_parse_level(const char *s);
void ns_log(ns_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define NS_DEBUG(...) ns_log(NS_LOG_DEBUG, __VA_ARGS__)
#define NS_INFO(...) ns_log(NS_LOG_INFO, __VA_ARGS__)
#define NS_WARN(...) ns_log(NS_LOG_WARN, __VA_ARGS__)
#define NS_ERROR(...) ns_log(NS_LOG_ERROR, __VA_ARGS__)

#endif
