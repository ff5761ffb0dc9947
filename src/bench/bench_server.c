/* bench_server.c — a server started by the bench (see bench_server.h). */
#include "bench/bench_server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/http_client.h"
#include "util/clock.h"

ns_status ns_bench_server_init(ns_bench_server *s, const char *cmd, const char *root, const char *log_path,
                               ns_error *err) {
    memset(s, 0, sizeof *s);
    s->cmd = strdup(cmd);
    s->root = strdup(root);
    s->log_path = strdup(log_path);
    if (!s->cmd || !s->root || !s->log_path) {
        ns_bench_server_free(s);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    return NS_OK;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* True when the child (the sh wrapper) has exited (reaped). */
static bool exited(ns_bench_server *s, int *status) {
    pid_t r = waitpid(s->pid, status, WNOHANG);
    return r == s->pid || (r < 0 && errno == ECHILD);
}

/* True when no process of the group is left: reaps every member that is
 * our child (the wrapper, and, with the subreaper on, whatever it
 * orphaned: the server itself when sh ran it in a subshell). Without the
 * subreaper, orphans belong to init and only the kernel can say (a
 * zombie init never reaps counts as alive: we then wait the grace out). */
static bool group_gone(const ns_bench_server *s) {
    for (;;) {
        int st;
        pid_t r = waitpid(-s->pid, &st, WNOHANG);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return false; /* a child of ours in the group still runs */
        break;                    /* ECHILD: none left among our children */
    }
    return s->subreaper || (kill(-s->pid, 0) < 0 && errno == ESRCH);
}

static bool ready(ns_hc *hc, const char *root) {
    static const char *const paths[] = {"/health", "/v1/models"};
    for (int i = 0; i < 2; i++) {
        char url[1100];
        snprintf(url, sizeof url, "%s%s", root, paths[i]);
        ns_hc_opts o = {.timeout_s = 2, .connect_timeout_s = 1, .max_response_bytes = 1 << 20};
        ns_hc_response r;
        ns_error err = {0};
        ns_status st = ns_hc_get(hc, url, NULL, &o, &r, &err);
        long status = r.status;
        ns_hc_response_free(&r);
        if (st != NS_OK) return false; /* not listening yet */
        /* a server with /health says itself whether it is ready (503 while
         * loading, when /v1/models may already answer); only one without
         * it is asked for /v1/models */
        if (i == 0 && status != 404) return status == 200;
        if (i == 1) return status == 200;
    }
    return false;
}

ns_status ns_bench_server_spawn(ns_bench_server *s, ns_error *err) {
    if (s->pid > 0) return NS_OK;
    /* Orphans of the group become our children, so that stop can wait for
     * (and reap) the server itself and not only the sh wrapper, which dies
     * at the first SIGTERM. Without this, stop saw sh gone within a
     * millisecond and SIGKILLed the server in the middle of its graceful
     * shutdown, before its SSD tier was durable (the restart-resume
     * scenario then found nothing cached, about one run in 15). */
    if (!s->subreaper) s->subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1L, 0L, 0L, 0L) == 0;
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return ns_fail(err, NS_ERR_IO, "cannot open the server log %s", s->log_path);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        return ns_fail(err, NS_ERR_IO, "fork failed");
    }
    if (pid == 0) {
        /* the child: its own process group, output to the log, default signals */
        setpgid(0, 0);
        /* its own group does not get the terminal's Ctrl-C: if the bench
         * dies without stopping it, the kernel sends it SIGTERM (sh -c
         * execs a simple command, so this reaches the server itself) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(127); /* the bench already died */
        /* sh may fork the command instead of exec'ing it, and the death
         * signal reaches only sh: its trap passes SIGTERM on to the group */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, STDIN_FILENO);
        execl("/bin/sh", "sh", "-c", "trap 'trap - TERM; kill -TERM 0' TERM; eval \"$1\" & wait $!", "sh", s->cmd,
              (char *)NULL);
        _exit(127);
    }
    close(fd);
    setpgid(pid, pid); /* also here: no race with the first kill */
    s->pid = pid;
    return NS_OK;
}

ns_status ns_bench_server_start(ns_bench_server *s, double timeout_s, ns_error *err) {
    if (s->pid > 0) return NS_OK;
    ns_status src = ns_bench_server_spawn(s, err);
    if (src != NS_OK) return src;
    ns_error e2 = {0};
    ns_hc *hc = ns_hc_new(&e2);
    if (!hc) {
        ns_bench_server_stop(s, 1);
        return ns_fail(err, NS_ERR_IO, "http client: %.200s", e2.msg);
    }
    const double deadline = ns_clock_now() + timeout_s;
    ns_status rc = NS_OK;
    int status = 0;
    for (;;) {
        if (ready(hc, s->root)) break;
        if (exited(s, &status)) {
            ns_bench_server_stop(s, 2); /* whatever the command left behind */
            rc = ns_fail(err, NS_ERR_IO, "the server command exited (status %d) before %s was ready; see %s",
                         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), s->root, s->log_path);
            break;
        }
        if (ns_clock_now() > deadline) {
            ns_bench_server_stop(s, 2);
            rc = ns_fail(err, NS_ERR_IO, "the server was not ready at %s within %.0f s; see %s", s->root, timeout_s,
                         s->log_path);
            break;
        }
        sleep_ms(50);
    }
    ns_hc_free(hc);
    return rc;
}

void ns_bench_server_stop(ns_bench_server *s, double grace_s) {
    if (s->pid <= 0) return;
    kill(-s->pid, SIGTERM);
    /* the whole group, not just sh: the server exits only after its
     * graceful shutdown (requests finished, SSD write-behind durable) */
    const double deadline = ns_clock_now() + grace_s;
    bool gone;
    while (!(gone = group_gone(s)) && ns_clock_now() < deadline) sleep_ms(20);
    if (!gone) {
        kill(-s->pid, SIGKILL);
        /* SIGKILL is not instant either (exit closes files, a process in
         * D state waits for its I/O): a next start must not find the old
         * server still holding the port or the SSD directory's lock */
        const double kill_deadline = ns_clock_now() + 10;
        while (!group_gone(s) && ns_clock_now() < kill_deadline) sleep_ms(10);
    }
    s->pid = 0;
}

void ns_bench_server_free(ns_bench_server *s) {
    if (!s) return;
    ns_bench_server_stop(s, 10);
    free(s->cmd);
    free(s->root);
    free(s->log_path);
    memset(s, 0, sizeof *s);
}
