/* test.h — the tiny unit-test harness every C test binary uses.
 *
 * A test binary defines test functions with TEST(name), lists them in main
 * with RUN(name), and ends with TEST_MAIN_END. Each test prints one line,
 * "ok - name" or "not ok - name", TAP style; tests/run counts these lines
 * across all binaries and prints the "N passed, N failed" summary.
 * Test assets (models/, goldens/) live in tests/fixtures; NS_SHARED (env)
 * overrides that with a directory of the same layout. Tests that need them
 * call test_shared_path().
 */
#ifndef NS_TEST_H
#define NS_TEST_H

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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


/* A uniform value in [-1, 1) from the xorshift state *s, never exactly
 * zero (0 becomes 0.5): inputs for tests that must not hide a bug behind
 * zeros. Each test keeps its own state (and seed). */
static inline float test_rand_nz(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    float f = (float)((double)(*s >> 40) / 8388608.0 - 1.0);
    return f == 0.0f ? 0.5f : f;
}

static inline int t_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}
/* Removes a scratch directory the test made (mkdtemp) and everything in
 * it, without a shell (a path with quotes or spaces stays one path).
 * Returns 0 when it is gone. */
static inline int test_rmtree(const char *dir) {
    return nftw(dir, t_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
/* Finds DIR/tests/fixtures, DIR/../tests/fixtures, ... (8 levels) and
 * writes its absolute path to out; 0 if found. */
static inline int test_find_fixtures(const char *dir, char *out, size_t cap) {
    char cand[4096];
    for (int depth = 0; depth < 8; depth++) {
        int n = snprintf(cand, sizeof cand, "%s/", dir);
        for (int k = 0; k < depth && n > 0 && (size_t)n < sizeof cand; k++)
            n += snprintf(cand + n, sizeof cand - (size_t)n, "../");
        if (n < 0 || (size_t)n >= sizeof cand - 32) return -1;
        snprintf(cand + n, sizeof cand - (size_t)n, "tests/fixtures/models");
        char *abs = realpath(cand, NULL);
        if (abs) {
            abs[strlen(abs) - strlen("/models")] = 0;
            snprintf(out, cap, "%s", abs);
            free(abs);
            return 0;
        }
    }
    return -1;
}

/* Path under the test assets dir: $NS_SHARED when set (a directory laid out
 * like tests/fixtures: models/, goldens/), else the absolute path of the
 * repository's tests/fixtures, looked for upwards from the working directory
 * (tests/run runs the binaries from the repository root), then upwards from
 * the test binary (build/tests/test_x). Returns a static buffer valid until
 * the next call. */
static inline const char *test_shared_path(const char *rel) {
    static char root[2048], buf[4096];
    const char *env = getenv("NS_SHARED");
    if (env && *env) {
        snprintf(buf, sizeof buf, "%s/%s", env, rel);
        return buf;
    }
    if (!root[0] && test_find_fixtures(".", root, sizeof root) != 0) {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
        if (slash) *slash = 0;
        if (!slash || test_find_fixtures(exe, root, sizeof root) != 0)
            snprintf(root, sizeof root, "tests/fixtures"); /* not found: relative */
    }
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

#endif
