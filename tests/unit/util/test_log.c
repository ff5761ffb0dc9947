/* ns_log: control characters escaped as \xNN (no forged lines), the
 * thread-local log context prefix, the prompt-logging switch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "util/log.h"

/* Runs fn with stderr redirected to a temporary file; returns what was
 * written (malloc'd, NUL-terminated). */
static char *capture(void (*fn)(void *), void *arg) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    if (!tmp) return NULL;
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long len = ftell(tmp);
    if (len < 0) len = lseek(fileno(tmp), 0, SEEK_END);
    char *s = calloc(1, (size_t)len + 1);
    rewind(tmp);
    if (s && len > 0 && fread(s, 1, (size_t)len, tmp) != (size_t)len) s[0] = 0;
    fclose(tmp);
    return s;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The message part of a single line: after "<time> <LEVEL> ". */
static const char *message_of(const char *line) {
    const char *p = strchr(line, ' ');
    if (!p) return "";
    p++;
    while (*p && *p != ' ') p++; /* level */
    while (*p == ' ') p++;
    return p;
}

static void log_forgery(void *arg) {
    (void)arg;
    /* what a URL with %0d%0a and %1b decodes to */
    NS_WARN("GET /v1/x\r\n2024-01-01T00:00:00.000Z ERROR forged \x1b[2Jline\x7f end");
}

TEST(escapes_cr_lf_esc_del) {
    char *out = capture(log_forgery, NULL);
    CHECK(out != NULL);
    if (!out) return;
    CHECKF(count_lines(out) == 1, "one line expected: %s", out);
    CHECKF(strstr(out, "GET /v1/x\\x0d\\x0a2024-01-01T00:00:00.000Z ERROR forged \\x1b[2Jline\\x7f end\n") != NULL,
           "got: %s", out);
    CHECK(strchr(out, '\r') == NULL);
    CHECK(strchr(out, 0x1b) == NULL);
    CHECK(strstr(out, " WARN  GET") != NULL);
    free(out);
}

static void log_all_c0(void *arg) {
    (void)arg;
    char buf[40];
    for (int i = 1; i < 32; i++) buf[i - 1] = (char)i;
    buf[31] = 0;
    NS_ERROR("%s|\t|%c", buf, 0x7f);
}

TEST(escapes_every_c0_control) {
    char *out = capture(log_all_c0, NULL);
    if (!out) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(count_lines(out), 1);
    for (const char *p = out; *p && *p != '\n'; p++)
        CHECKF((unsigned char)*p >= 0x20 && *p != 0x7f, "raw control byte 0x%02x", (unsigned char)*p);
    CHECK(strstr(out, "\\x01\\x02\\x03") != NULL);
    CHECK(strstr(out, "\\x1e\\x1f|\\x09|\\x7f\n") != NULL);
    free(out);
}

TEST(escape_function_utf8_and_c1) {
    char out[256];
    /* é and 世 stay; U+0085 (NEL) and U+009B (CSI), U+2028/U+2029 and the
     * invalid bytes 0x9b, 0xff, a cut sequence and an overlong form do not */
    const char in[] = "caf\xc3\xa9 \xe4\xb8\x96 \xc2\x85\xc2\x9b \xe2\x80\xa8\xe2\x80\xa9 \x9b\xff \xe4\xb8 \xc0\xaf \\x41";
    size_t used = ns_log_escape(in, sizeof in - 1, out, sizeof out);
    CHECK_EQ_INT(used, sizeof in - 1);
    CHECK_EQ_STR(out, "caf\xc3\xa9 \xe4\xb8\x96 \\xc2\\x85\\xc2\\x9b \\xe2\\x80\\xa8\\xe2\\x80\\xa9 \\x9b\\xff \\xe4\\xb8 "
                      "\\xc0\\xaf \\x41");
    /* NUL inside the range, and a buffer too small never cuts an escape */
    const char nul[] = {'a', 0, 'b'};
    ns_log_escape(nul, 3, out, sizeof out);
    CHECK_EQ_STR(out, "a\\x00b");
    char small[7];
    used = ns_log_escape("ab\r\ncd", 6, small, sizeof small);
    CHECK_EQ_INT(used, 3);
    CHECK_EQ_STR(small, "ab\\x0d");
    CHECK_EQ_INT(ns_log_escape("x", 1, small, 0), 0);
}

static void log_long(void *arg) {
    (void)arg;
    char *big = malloc(3 * NS_LOG_MAX_MESSAGE);
    if (!big) return;
    for (int i = 0; i < 3 * NS_LOG_MAX_MESSAGE - 1; i++) big[i] = i % 2 ? '\n' : 'a';
    big[3 * NS_LOG_MAX_MESSAGE - 1] = 0;
    NS_WARN("%s", big);
    free(big);
}

TEST(long_message_is_cut_on_one_line) {
    char *out = capture(log_long, NULL);
    if (!out) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(count_lines(out), 1);
    size_t len = strlen(out);
    CHECK(len > 4 && strcmp(out + len - 4, "...\n") == 0);
    CHECK(len < 64 + 4 * NS_LOG_MAX_MESSAGE + 8);
    free(out);
}

static void log_with_context(void *arg) {
    (void)arg;
    ns_log_set_context("req %d", 12);
    NS_WARN("first");
    ns_log_set_context("%s", "evil]\r\nx");
    NS_WARN("second");
    ns_log_clear_context();
    NS_WARN("third");
}

TEST(context_prefixes_every_line) {
    char *out = capture(log_with_context, NULL);
    if (!out) {
        CHECK(0);
        return;
    }
    CHECKF(count_lines(out) == 3, "%s", out);
    char *l1 = out, *l2 = strchr(l1, '\n') + 1, *l3 = strchr(l2, '\n') + 1;
    CHECKF(strncmp(message_of(l1), "[req 12] first\n", 15) == 0, "%s", l1);
    CHECKF(strncmp(message_of(l2), "[evil]\\x0d\\x0ax] second\n", 24) == 0, "%s", l2);
    CHECKF(strncmp(message_of(l3), "third\n", 6) == 0, "%s", l3);
    CHECK_EQ_STR(ns_log_context(), "");
    free(out);
}

TEST(context_is_cut_at_the_limit) {
    char big[4 * NS_LOG_MAX_CONTEXT];
    memset(big, 'c', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ns_log_set_context("%s", big);
    CHECK_EQ_INT(strlen(ns_log_context()), NS_LOG_MAX_CONTEXT);
    ns_log_clear_context();
}

typedef struct {
    pthread_barrier_t *bar;
    int id;
    char seen[NS_LOG_MAX_CONTEXT + 1];
} ctx_arg;

static void *ctx_thread(void *p) {
    ctx_arg *a = p;
    CHECK_EQ_STR(ns_log_context(), ""); /* a new thread starts without one */
    ns_log_set_context("req %d", a->id);
    pthread_barrier_wait(a->bar); /* all set */
    pthread_barrier_wait(a->bar); /* nobody set it again */
    snprintf(a->seen, sizeof a->seen, "%s", ns_log_context());
    NS_WARN("from %d", a->id);
    return NULL;
}

static void log_threads(void *arg) {
    ctx_arg *args = arg;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 4);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].bar = &bar;
        args[i].id = 100 + i;
        pthread_create(&th[i], NULL, ctx_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
}

TEST(context_is_thread_local) {
    ns_log_set_context("main");
    ctx_arg args[4];
    memset(args, 0, sizeof args);
    char *out = capture(log_threads, args);
    if (!out) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(count_lines(out), 4);
    for (int i = 0; i < 4; i++) {
        char want[64], seen[64];
        snprintf(want, sizeof want, "req %d", 100 + i);
        CHECK_EQ_STR(args[i].seen, want);
        snprintf(seen, sizeof seen, "[req %d] from %d\n", 100 + i, 100 + i);
        CHECKF(strstr(out, seen) != NULL, "missing %s in %s", seen, out);
    }
    CHECK_EQ_STR(ns_log_context(), "main");
    ns_log_clear_context();
    free(out);
}

static void log_levels(void *arg) {
    (void)arg;
    NS_DEBUG("hidden");
    NS_INFO("shown");
}

TEST(level_filters_and_prompt_switch) {
    ns_log_level old = ns_log_get_level();
    ns_log_set_level(NS_LOG_INFO);
    char *out = capture(log_levels, NULL);
    ns_log_set_level(old);
    if (!out) {
        CHECK(0);
        return;
    }
    CHECK(strstr(out, "hidden") == NULL);
    CHECK(strstr(out, " INFO  shown\n") != NULL);
    free(out);
    CHECK(!ns_log_prompts()); /* off by default */
    ns_log_set_prompts(true);
    CHECK(ns_log_prompts());
    ns_log_set_prompts(false);
    CHECK(!ns_log_prompts());
    CHECK_EQ_INT(ns_log_parse_level("debug"), NS_LOG_DEBUG);
    CHECK_EQ_INT(ns_log_parse_level("off"), NS_LOG_OFF);
    CHECK_EQ_INT(ns_log_parse_level("loud"), -1);
}

int main(void) {
    ns_log_set_level(NS_LOG_DEBUG);
    RUN(escapes_cr_lf_esc_del);
    RUN(escapes_every_c0_control);
    RUN(escape_function_utf8_and_c1);
    RUN(long_message_is_cut_on_one_line);
    RUN(context_prefixes_every_line);
    RUN(context_is_cut_at_the_limit);
    RUN(context_is_thread_local);
    RUN(level_filters_and_prompt_switch);
    TEST_MAIN_END;
}
