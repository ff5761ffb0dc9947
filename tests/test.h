/* test.h — the tiny unit-test harness every C test binary uses.
 *
 * A test binary defines test functions with TEST(name), lists them in main
 * with RUN(name), and ends with TEST_MAIN_END. Each test prints one line,
 * "ok - name" or "not ok - name", TAP style; tests/run counts these lines
 * across all binaries and prints the "N passed, N failed" summary.
 * NS_SHARED (env) points at ../shared; tests that need it call
 * test_shared_path().
 */
#ifndef NS_TEST_H
#define NS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_failed_total = 0, t_passed_total = 0;
static int t_cur_failed = 0;

#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stdout, "#   %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            t_cur_failed++;                                                       \
        }                                                                         \
    } while (0)

#define CHECKF(cond, ...)                                                         \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stdout, "#   %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stdout, __VA_ARGS__);                                         \
            fputc('\n', stdout);                                                  \
            t_cur_failed++;                                                       \
        }                                                                         \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                        \
    do {                                                                          \
        long long _a = (long long)(a), _b = (long long)(b);                       \
        if (_a != _b) {                                                           \
            fprintf(stdout, "#   %s:%d: %s == %s: %lld != %lld\n", __FILE__, __LINE__, #a, #b, _a, _b); \
            t_cur_failed++;                                                       \
        }                                                                         \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                        \
    do {                                                                          \
        const char *_a = (a), *_b = (b);                                          \
        if (!_a || !_b || strcmp(_a, _b) != 0) {                                  \
            fprintf(stdout, "#   %s:%d: %s == %s: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a, #b, \
                    _a ? _a : "(null)", _b ? _b : "(null)");                      \
            t_cur_failed++;                                                       \
        }                                                                         \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                     \
    do {                                                                          \
        double _a = (double)(a), _b = (double)(b);                                \
        if (!(fabs(_a - _b) <= (tol))) {                                          \
            fprintf(stdout, "#   %s:%d: %s ~= %s: %.7g vs %.7g (tol %g)\n", __FILE__, __LINE__, #a, #b, \
                    _a, _b, (double)(tol));                                       \
            t_cur_failed++;                                                       \
        }                                                                         \
    } while (0)

#define TEST(name) static void name(void)

#define RUN(name)                                                                 \
    do {                                                                          \
        t_cur_failed = 0;                                                         \
        name();                                                                   \
        if (t_cur_failed) {                                                       \
            fprintf(stdout, "not ok - %s\n", #name);                              \
            t_failed_total++;                                                     \
        } else {                                                                  \
            fprintf(stdout, "ok - %s\n", #name);                                  \
            t_passed_total++;                                                     \
        }                                                                         \
        fflush(stdout);                                                           \
    } while (0)

#define TEST_MAIN_END return t_failed_total ? 1 : 0

/* Path under the shared assets dir (NS_SHARED env, default ../shared).
 * Returns a static buffer valid until the next call. */
static inline const char *test_shared_path(const char *rel) {
    static char buf[4096];
    const char *root = getenv("NS_SHARED");
    if (!root || !*root) root = "../shared";
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

#endif
