/* fuzz_common.h — shared by the libFuzzer harnesses of tests/fuzz/.
 *
 * Each harness is one fuzz_<name>.c defining LLVMFuzzerTestOneInput (and
 * usually LLVMFuzzerInitialize for what it loads once: tokenizers, chat
 * templates). `make fuzz` builds them with clang, -fsanitize=fuzzer,
 * address,undefined, into build/fuzz/; `make fuzz-smoke` runs each on its
 * seeds (tests/fuzz/corpus/<name>/) for FUZZ_SECONDS (tests/fuzz/smoke).
 *
 * Fixtures (models/ of tests/fixtures) are found through $NS_SHARED, else
 * tests/fixtures relative to the working directory, else relative to the
 * fuzzer binary (build/fuzz/ -> ../../tests/fixtures).
 *
 * FUZZ_CHECK aborts on a broken invariant, so libFuzzer records the input
 * as a crash like any sanitizer report.
 */
#ifndef NS_FUZZ_COMMON_H
#define NS_FUZZ_COMMON_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Directory of the fixture model `name` (static buffer), or exits. */
static inline const char *fuzz_model_dir(const char *name) {
    static char path[PATH_MAX];
    const char *shared = getenv("NS_SHARED");
    char base[PATH_MAX];
    if (shared && *shared) {
        snprintf(base, sizeof base, "%s", shared);
    } else if (access("tests/fixtures/models", R_OK) == 0) {
        snprintf(base, sizeof base, "tests/fixtures");
    } else {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) {
            fprintf(stderr, "fuzz: cannot find tests/fixtures (set NS_SHARED)\n");
            exit(1);
        }
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(base, sizeof base, "%s/../../tests/fixtures", exe);
    }
    snprintf(path, sizeof path, "%s/models/%s", base, name);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "fuzz: fixture %s missing (set NS_SHARED)\n", path);
        exit(1);
    }
    return path;
}

/* The code under test logs; a fuzzer's stderr is for its own reports. */
static inline void fuzz_quiet_logs(void) { ns_log_set_level(NS_LOG_OFF); }

#endif
