/* bench_server.h — a server that `nightshift bench` starts itself
 * (--server-cmd), so that the restart-resume scenario can stop and start
 * it again.
 *
 * The command runs under /bin/sh -c in a process group of its own, with
 * stdout and stderr appended to a log file, so stopping it reaches every
 * process it started (a wrapper script's children too). Ready means
 * GET root/health answers 200 (or, for servers without /health, GET
 * root/v1/models does). Stopping sends SIGTERM to the group (a graceful
 * shutdown: this server then makes its SSD tier durable), waits up to
 * grace seconds until EVERY process of the group has exited (not just
 * the sh wrapper, which dies at once), then SIGKILLs what is left and
 * waits for that too; so a stop that returns within grace was a complete
 * graceful shutdown, and a next start never races the old server for the
 * port or the SSD directory. To wait for processes sh orphaned, the first
 * spawn makes this process a child subreaper (prctl
 * PR_SET_CHILD_SUBREAPER; process-wide, and harmless for the bench: it
 * reaps them). If the bench dies first (Ctrl-C reaches only its own
 * process group), the server gets SIGTERM from the kernel
 * (PR_SET_PDEATHSIG), so it is never left running.
 *
 * Ownership: ns_bench_server owns its command and log path copies; the
 * caller stops and frees it (ns_bench_server_free stops it first). Not
 * thread-safe: the bench's main thread drives it. */
#ifndef NS_BENCH_SERVER_H
#define NS_BENCH_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

#include "util/status.h"

typedef struct ns_bench_server {
    char *cmd;
    char *root;      /* "http://host:port" to wait for */
    char *log_path;
    pid_t pid;       /* 0 when not running; also the process group id */
    bool subreaper;  /* this process reaps the group's orphans */
} ns_bench_server;

/* Copies cmd/root/log_path; starts nothing. NS_ERR_NOMEM. */
ns_status ns_bench_server_init(ns_bench_server *s, const char *cmd, const char *root, const char *log_path,
                               ns_error *err);
/* Starts the command (no wait for readiness); NS_ERR_IO if the log
 * cannot be opened or fork fails. No-op when running. */
ns_status ns_bench_server_spawn(ns_bench_server *s, ns_error *err);
/* Spawns the command and waits until it is ready (timeout_s). On failure
 * the process is stopped and err says why (the log's path included). */
ns_status ns_bench_server_start(ns_bench_server *s, double timeout_s, ns_error *err);
/* SIGTERM to the group; returns once every process of it has exited,
 * SIGKILL after grace_s; no-op when not running. */
void ns_bench_server_stop(ns_bench_server *s, double grace_s);
void ns_bench_server_free(ns_bench_server *s);

#endif
