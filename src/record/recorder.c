/* recorder.c — queue, writer thread and rotation (see recorder.h). */
#include "record/recorder.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

typedef struct qline {
    char *s;
    size_t len;
} qline;

struct ns_recorder {
    char dir[4096];
    char path[4200];
    int64_t max_bytes;
    int keep;
    size_t queue_bytes;
    int delay_ms;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    qline q[NS_RECORDER_QUEUE_LINES]; /* ring */
    size_t head, n, qbytes;
    bool stop;
    pthread_t th;

    int fd;
    int64_t size; /* of the current file */
    bool warned;  /* writer thread only: a write failure was logged */
    ns_recorder_stats st;
};

/* requests.jsonl -> .1 -> .2 ... -> .keep (deleted past it). Called on the
 * writer thread only. A failed rename is logged; writing goes on into a
 * fresh file either way. */
static void rotate(ns_recorder *r, ns_recorder_stats *d) {
    char from[4300], to[4300];
    snprintf(to, sizeof to, "%s.%d", r->path, r->keep);
    unlink(to);
    for (int i = r->keep - 1; i >= 1; i--) {
        snprintf(from, sizeof from, "%s.%d", r->path, i);
        snprintf(to, sizeof to, "%s.%d", r->path, i + 1);
        if (rename(from, to) != 0 && errno != ENOENT) NS_WARN("record: rename %s: %s", from, strerror(errno));
    }
    if (r->fd >= 0) close(r->fd);
    snprintf(to, sizeof to, "%s.1", r->path);
    if (rename(r->path, to) != 0) NS_WARN("record: rename %s: %s", r->path, strerror(errno));
    r->fd = open(r->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (r->fd < 0) NS_WARN("record: open %s: %s", r->path, strerror(errno));
    r->size = 0;
    d->rotations++;
}

/* Writes one line; what happened is added to *d (the caller folds it into
 * r->st under the mutex, so stats_get never races the writer). */
static void write_line(ns_recorder *r, qline *l, ns_recorder_stats *d) {
    if (r->delay_ms > 0) {
        struct timespec ts = {r->delay_ms / 1000, (long)(r->delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const int64_t need = (int64_t)l->len;
    if (r->size > 0 && r->size + need > r->max_bytes) rotate(r, d);
    if (r->fd < 0) { /* a failed open: try again for each line */
        r->fd = open(r->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (r->fd < 0) {
            d->write_errors++;
            return;
        }
    }
    size_t off = 0;
    while (off < l->len) {
        ssize_t w = write(r->fd, l->s + off, l->len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            d->write_errors++;
            if (!r->warned) NS_WARN("record: write %s: %s (later failures are counted, not logged)", r->path,
                                    strerror(errno));
            r->warned = true;
            return;
        }
        off += (size_t)w;
    }
    r->size += need;
    d->bytes += (uint64_t)need;
    d->written++;
}

static void *writer_main(void *arg) {
    ns_recorder *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->n == 0 && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
        if (r->n == 0 && r->stop) break;
        qline l = r->q[r->head];
        r->head = (r->head + 1) % NS_RECORDER_QUEUE_LINES;
        r->n--;
        r->qbytes -= l.len;
        pthread_mutex_unlock(&r->mu);
        ns_recorder_stats d = {0};
        write_line(r, &l, &d);
        free(l.s);
        pthread_mutex_lock(&r->mu);
        r->st.written += d.written;
        r->st.bytes += d.bytes;
        r->st.rotations += d.rotations;
        r->st.write_errors += d.write_errors;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

ns_status ns_recorder_open(const ns_recorder_opts *o, ns_recorder **out, ns_error *err) {
    *out = NULL;
    if (!o->dir || !*o->dir) return ns_fail(err, NS_ERR_INVALID, "record: no directory given");
    ns_recorder *r = calloc(1, sizeof *r);
    if (!r) return ns_fail(err, NS_ERR_NOMEM, "record: out of memory");
    int n = snprintf(r->dir, sizeof r->dir, "%s", o->dir);
    if (n < 0 || (size_t)n >= sizeof r->dir) {
        free(r);
        return ns_fail(err, NS_ERR_INVALID, "record: directory name too long");
    }
    snprintf(r->path, sizeof r->path, "%s/%s", r->dir, NS_RECORDER_FILE);
    r->max_bytes = o->max_bytes > 0 ? o->max_bytes : NS_RECORDER_DEFAULT_MAX_BYTES;
    r->keep = o->keep > 0 ? o->keep : NS_RECORDER_DEFAULT_KEEP;
    r->queue_bytes = o->queue_bytes ? o->queue_bytes : NS_RECORDER_DEFAULT_QUEUE_BYTES;
    r->delay_ms = o->writer_delay_ms;
    if (mkdir(r->dir, 0755) != 0 && errno != EEXIST) {
        ns_status st = ns_fail(err, NS_ERR_IO, "record: cannot create %s: %s", r->dir, strerror(errno));
        free(r);
        return st;
    }
    r->fd = open(r->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (r->fd < 0) {
        ns_status st = ns_fail(err, NS_ERR_IO, "record: cannot open %s: %s", r->path, strerror(errno));
        free(r);
        return st;
    }
    struct stat sb;
    r->size = fstat(r->fd, &sb) == 0 ? (int64_t)sb.st_size : 0; /* a restart appends */
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->th, NULL, writer_main, r) != 0) {
        close(r->fd);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
        return ns_fail(err, NS_ERR_INTERNAL, "record: cannot start the writer thread");
    }
    *out = r;
    return NS_OK;
}

void ns_recorder_push(ns_recorder *r, char *line, size_t len) {
    if (!r || !line) {
        free(line);
        return;
    }
    line[len] = '\n'; /* the caller's buffer holds len + 1 bytes: its NUL becomes the newline */
    len++;
    pthread_mutex_lock(&r->mu);
    if (r->stop || r->n == NS_RECORDER_QUEUE_LINES || len > r->queue_bytes || r->qbytes > r->queue_bytes - len) {
        uint64_t d = ++r->st.dropped;
        pthread_mutex_unlock(&r->mu);
        free(line);
        if (d == 1 || d % 1000 == 0) /* the first, then every thousandth: a slow disk must not flood the log */
            NS_WARN("record: queue full (the disk is slower than the requests): %llu records dropped so far",
                    (unsigned long long)d);
        return;
    }
    r->q[(r->head + r->n) % NS_RECORDER_QUEUE_LINES] = (qline){line, len};
    r->n++;
    r->qbytes += len;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void ns_recorder_stats_get(ns_recorder *r, ns_recorder_stats *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

void ns_recorder_close(ns_recorder *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);
    if (r->fd >= 0) close(r->fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
