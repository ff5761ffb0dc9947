/* test_bench_server.c — stopping a server the bench started
 * (bench_server.h): stop returns only when every process of the command's
 * group has exited, so a graceful shutdown is never cut short, and a
 * group that ignores SIGTERM is killed after the grace period.
 *
 * The regression: the command runs under an sh wrapper that dies at the
 * first SIGTERM; stop took that for the server's exit and SIGKILLed the
 * group a millisecond later, in the middle of the server's shutdown
 * (restart-resume then found the SSD tier without the last request's
 * pages). Here the "server" is a shell whose TERM handler takes 0.3 s and
 * then writes a file: the file must exist when stop returns. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_server.h"
#include "test.h"

static char g_dir[] = "/tmp/ns_bench_server_XXXXXX";

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

static bool file_has(const char *name, const char *want) {
    char p[256], got[64] = {0};
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "r");
    if (!f) return false;
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = 0;
    return strstr(got, want) != NULL;
}

/* Polls (up to 10 s) until the command has written name: its TERM trap is
 * in place only from then on. */
static bool wait_file(const char *name) {
    for (int i = 0; i < 1000; i++) {
        if (file_has(name, "")) return true;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return false;
}

static bool group_alive(pid_t pgid) { return kill(-pgid, 0) == 0 || errno != ESRCH; }

/* Spawns tmpl (each @ = the test directory) under a fresh
 * ns_bench_server; the caller frees it. */
static bool spawn(ns_bench_server *s, const char *tmpl) {
    char cmd[1024], log[256];
    size_t k = 0;
    for (const char *c = tmpl; *c && k + sizeof g_dir + 1 < sizeof cmd; c++) {
        if (*c == '@') k += (size_t)snprintf(cmd + k, sizeof cmd - k, "%s", g_dir);
        else cmd[k++] = *c;
    }
    cmd[k] = 0;
    path_of(log, sizeof log, "server.log");
    ns_error err = {0};
    if (ns_bench_server_init(s, cmd, "http://127.0.0.1:1", log, &err) != NS_OK) return false;
    if (ns_bench_server_spawn(s, &err) != NS_OK) {
        printf("# spawn: %s\n", err.msg);
        return false;
    }
    return s->pid > 0;
}

TEST(stop_waits_for_the_graceful_exit_of_the_whole_group) {
    ns_bench_server s;
    CHECK(spawn(&s, "trap 'sleep 0.3; echo graceful > @/done; exit 0' TERM; echo up > @/started; "
                    "while :; do sleep 0.02; done"));
    CHECK(wait_file("started"));
    const pid_t pgid = s.pid;
    ns_bench_server_stop(&s, 10);
    CHECK_EQ_INT(s.pid, 0);
    CHECKF(file_has("done", "graceful"), "stop returned before the command's SIGTERM handler finished");
    CHECK(pgid > 0 && !group_alive(pgid));
    ns_bench_server_free(&s);
}

TEST(stop_kills_a_group_that_ignores_sigterm_after_the_grace) {
    ns_bench_server s;
    CHECK(spawn(&s, "trap '' TERM; echo up > @/started2; while :; do sleep 0.02; done"));
    CHECK(wait_file("started2"));
    const pid_t pgid = s.pid;
    ns_bench_server_stop(&s, 0.3);
    CHECK_EQ_INT(s.pid, 0);
    CHECK(pgid > 0 && !group_alive(pgid)); /* only SIGKILL can have ended it */
    ns_bench_server_free(&s);
}

/* The command's output goes to the log; a stop after the command ended
 * by itself is quiet and leaves nothing behind. */
TEST(command_output_goes_to_the_log_and_an_ended_command_stops_cleanly) {
    ns_bench_server s;
    CHECK(spawn(&s, "echo hello-from-@; exit 3"));
    char log[256];
    path_of(log, sizeof log, "server.log");
    for (int i = 0; i < 1000 && !file_has("server.log", "hello-from"); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(file_has("server.log", "hello-from"));
    const pid_t pgid = s.pid;
    ns_bench_server_stop(&s, 5);
    CHECK_EQ_INT(s.pid, 0);
    CHECK(pgid > 0 && !group_alive(pgid));
    ns_bench_server_free(&s);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        printf("not ok - mkdtemp\n");
        return 1;
    }
    RUN(stop_waits_for_the_graceful_exit_of_the_whole_group);
    RUN(stop_kills_a_group_that_ignores_sigterm_after_the_grace);
    RUN(command_output_goes_to_the_log_and_an_ended_command_stops_cleanly);
    if (test_rmtree(g_dir) != 0) printf("# could not remove %s\n", g_dir);
    TEST_MAIN_END;
}
