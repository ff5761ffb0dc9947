/* recorder.h — the request recorder's file side (`serve --record DIR`):
 * appends one line of JSON per request to DIR/requests.jsonl from a writer
 * thread of its own, and rotates the file by size.
 *
 * Why a queue and a thread: the lines are produced on HTTP threads at the
 * end of a request; a slow or stalled disk must never hold a request (or
 * the engine) for long. ns_recorder_push only takes a mutex and appends to
 * a bounded queue (NS_RECORDER_QUEUE_LINES lines and queue_bytes bytes at
 * most); when the queue is full the line is dropped and counted
 * (ns_recorder_stats.dropped, exported by /metrics) instead of waiting.
 *
 * Files: DIR/requests.jsonl is opened for append, so a restart continues
 * it. When a line would take it past max_bytes, it is renamed to
 * requests.jsonl.1 (an older .1 moves to .2, ... up to .keep; the oldest is
 * deleted), so the disk used stays within (keep + 1) x max_bytes. A line is
 * written with one write(2) to an O_APPEND descriptor: a crash loses at
 * most the queued lines and never leaves two lines interleaved. Each line
 * is written whole; a line longer than max_bytes still goes into a file of
 * its own (rotation happens before it).
 *
 * Threads: push and stats from any thread; open/close from one thread
 * (serve's main thread). close drains the queue, then joins the writer.
 */
#ifndef NS_RECORD_RECORDER_H
#define NS_RECORD_RECORDER_H

#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

#define NS_RECORDER_QUEUE_LINES 4096
#define NS_RECORDER_DEFAULT_QUEUE_BYTES ((size_t)64 << 20)
#define NS_RECORDER_DEFAULT_MAX_BYTES ((int64_t)256 << 20)
#define NS_RECORDER_DEFAULT_KEEP 8
#define NS_RECORDER_FILE "requests.jsonl"

typedef struct ns_recorder ns_recorder;

typedef struct ns_recorder_opts {
    const char *dir;     /* created when missing (one level) */
    int64_t max_bytes;   /* rotate past this; 0 = NS_RECORDER_DEFAULT_MAX_BYTES */
    int keep;            /* rotated files kept; 0 = NS_RECORDER_DEFAULT_KEEP */
    size_t queue_bytes;  /* bytes of queued lines at most; 0 = default */
    int writer_delay_ms; /* tests only: the writer sleeps this long per line (a slow disk) */
} ns_recorder_opts;

typedef struct ns_recorder_stats {
    uint64_t written;      /* lines written */
    uint64_t dropped;      /* lines dropped: queue full */
    uint64_t write_errors; /* lines lost to a failed write */
    uint64_t rotations;
    uint64_t bytes;        /* bytes written (all files) */
} ns_recorder_stats;

/* Opens (creates) DIR and DIR/requests.jsonl and starts the writer.
 * The caller owns *out: ns_recorder_close. */
ns_status ns_recorder_open(const ns_recorder_opts *o, ns_recorder **out, ns_error *err);
/* Queues one line of len bytes, without its '\n': line must be a malloc'd
 * buffer of at least len + 1 bytes (a NUL-terminated string, as json_dumps
 * returns), whose last byte becomes the newline. Takes ownership of line
 * in every case. Never blocks on the
 * disk: a full queue drops it (counted). */
void ns_recorder_push(ns_recorder *r, char *line, size_t len);
void ns_recorder_stats_get(ns_recorder *r, ns_recorder_stats *out);
/* Writes what is queued, stops the writer and frees r (NULL: no-op). */
void ns_recorder_close(ns_recorder *r);

#endif
