/* test_recorder.c — the recorder's file side (record/recorder.h): lines
 * are appended whole, a restart appends, rotation keeps `keep` files of at
 * most max_bytes, and a full queue drops lines (counted) instead of
 * blocking the caller behind a slow disk. */
#include "record/recorder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

static char g_dir[64];

static void push(ns_recorder *r, const char *s) {
    char *l = strdup(s);
    ns_recorder_push(r, l, strlen(l));
}

static long file_lines(const char *name) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static long file_size(const char *name) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

TEST(append_and_restart) {
    ns_recorder_opts o = {.dir = g_dir};
    ns_recorder *r = NULL;
    ns_error err = {0};
    CHECK(ns_recorder_open(&o, &r, &err) == NS_OK);
    if (!r) return;
    push(r, "{\"a\":1}");
    push(r, "{\"a\":2}");
    ns_recorder_close(r);
    CHECK_EQ_INT(file_lines(NS_RECORDER_FILE), 2);
    CHECK(ns_recorder_open(&o, &r, &err) == NS_OK);
    push(r, "{\"a\":3}");
    ns_recorder_close(r);
    CHECK_EQ_INT(file_lines(NS_RECORDER_FILE), 3);
}

TEST(rotation) {
    ns_recorder_opts o = {.dir = g_dir, .max_bytes = 100, .keep = 2};
    ns_recorder *r = NULL;
    ns_error err = {0};
    CHECK(ns_recorder_open(&o, &r, &err) == NS_OK);
    if (!r) return;
    /* 3 lines already there (24 bytes); 20 more of 30 bytes each */
    for (int i = 0; i < 20; i++) push(r, "{\"line\":\"xxxxxxxxxxxxxxxxxx\"}");
    for (int i = 0; i < 200; i++) {
        ns_recorder_stats st;
        ns_recorder_stats_get(r, &st);
        if (st.written == 20) break;
        usleep(5000);
    }
    ns_recorder_stats st;
    ns_recorder_stats_get(r, &st);
    ns_recorder_close(r);
    CHECK_EQ_INT(st.written, 20);
    CHECK(st.rotations >= 5);
    CHECK(file_size(NS_RECORDER_FILE) <= 100);
    CHECK(file_size(NS_RECORDER_FILE ".1") <= 100 && file_size(NS_RECORDER_FILE ".1") > 0);
    CHECK(file_size(NS_RECORDER_FILE ".2") > 0);
    CHECK_EQ_INT(file_size(NS_RECORDER_FILE ".3"), -1);
    CHECK_EQ_INT(file_lines(NS_RECORDER_FILE) + file_lines(NS_RECORDER_FILE ".1"), 6);
}

TEST(full_queue_drops) {
    char sub[96];
    snprintf(sub, sizeof sub, "%s/slow", g_dir);
    /* a disk that takes 50 ms a line, a queue of 300 bytes (9 lines):
     * pushing 40 lines does not wait for the disk but drops what does not
     * fit (a push that waited for room would drop none) */
    ns_recorder_opts o = {.dir = sub, .queue_bytes = 300, .writer_delay_ms = 50};
    ns_recorder *r = NULL;
    ns_error err = {0};
    CHECK(ns_recorder_open(&o, &r, &err) == NS_OK);
    if (!r) return;
    for (int i = 0; i < 40; i++) push(r, "{\"line\":\"xxxxxxxxxxxxxxxxxx\"}");
    ns_recorder_stats st;
    ns_recorder_stats_get(r, &st);
    CHECKF(st.dropped >= 25, "dropped %llu", (unsigned long long)st.dropped);
    ns_recorder_close(r); /* writes what was queued */
    CHECK_EQ_INT(st.written + st.dropped <= 40, 1);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_recorder_%d", (int)getpid());
    RUN(append_and_restart);
    RUN(rotation);
    RUN(full_queue_drops);
    if (test_rmtree(g_dir) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_MAIN_END;
}
