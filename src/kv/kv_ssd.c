/* kv_ssd.c — the durable SSD tier of the KV cache (see kv_ssd.h).
 *
 * On disk, in opts->dir:
 *   seg-%08u.dat  append-only segment files of records (below). A store
 *                 never appends to a segment written by an earlier open: it
 *                 starts a new one on its first write, and rolls to a new one
 *                 when the current one would pass SEG_TARGET bytes.
 *   index.db      SQLite (WAL): table records, one row per durable record
 *                 (key (seed, hash)), and table meta (schema_version).
 *   lock          flock()ed while a store is open: one process per dir, so
 *                 open may delete segments nobody indexes without racing a
 *                 writer.
 *
 * Record (all integers little-endian; tokens and page bytes as the host
 * holds them, which is little-endian on every platform we build for):
 *   off  size
 *     0     4  magic "NSKV"
 *     4     4  format version (REC_VERSION)
 *     8     8  seed
 *    16     8  hash
 *    24     8  parent
 *    32     4  n_tokens (i32, = page_tokens)
 *    36     4  reserved, 0
 *    40     8  data_len (= page_bytes)
 *    48  4*n   tokens (i32)
 *     .  len   page bytes
 *     .     8  XXH3_64bits(header + tokens + page bytes)
 *
 * Durability: the writer thread appends a batch of records to the current
 * segment, fdatasyncs it (and fsyncs the directory when it created a
 * segment), and only then commits the batch's index rows in one SQLite
 * transaction. The index connection runs synchronous=FULL, so each commit
 * fsyncs the WAL before returning: a committed row is as durable as its
 * bytes, at every moment and not only after a flush. (NORMAL would leave
 * the last commits in an unsynced WAL, so "flush returned" would not mean
 * "survives power loss" without a checkpoint protocol of its own; FULL costs
 * one small WAL fsync per batch, next to the data fsync of megabytes.)
 * A kill -9 or power loss between the two steps leaves unindexed bytes at
 * a segment's tail, or a segment no row points to; open deletes the
 * latter, the former is never read.
 *
 * In memory: every record of this seed (queued, being written, or durable)
 * has an entry in a hash map keyed by its hash; durable ones are also on an
 * LRU list (head = most recent) that drives the size cap. get and contains
 * never touch SQLite: only the writer thread uses the connection once open
 * has returned. Changes the other threads make to the index (rows to delete
 * after a failed verification or an eviction, last_used of records read)
 * are handed to the writer, which commits them with its next batch.
 *
 * Locking: one mutex (mu) guards everything below "under mu" in the struct;
 * two condition variables: cv_work wakes the writer, cv_done wakes flush.
 * No thread holds mu during file or SQLite I/O: the writer takes a batch
 * off the queue, writes it unlocked, and relocks to publish the result;
 * get pins a queued page (refcount) or copies the record's location, and
 * reads unlocked. Segments are append-only and a segment id is never
 * reused, so a location read under mu stays valid until the segment is
 * unlinked, and then opening it fails (ENOENT) instead of returning other
 * bytes.
 *
 * Signals: a write past RLIMIT_FSIZE raises SIGXFSZ, whose default action
 * kills the process. A library must not change process-wide dispositions,
 * so the program (main/serve) ignores SIGXFSZ; the write then fails with
 * EFBIG and the tier degrades like on ENOSPC.
 */
#include "kv/kv_ssd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>
#include <xxhash.h>

#include "util/clock.h"
#include "util/log.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "kv_ssd stores tokens and page bytes in host order, which the format defines as little-endian");

#define REC_VERSION 1u
#define REC_HDR 48u          /* header bytes */
#define REC_SUM 8u           /* trailing checksum bytes */
#define SCHEMA_VERSION 1
#define SEG_TARGET (256ull << 20)            /* roll to a new segment past this */
#define MAX_PAGE_BYTES ((size_t)1 << 30)     /* sanity bounds on opts: the record */
#define MAX_PAGE_TOKENS (1 << 20)            /* length must not overflow anywhere */
#define DEFAULT_QUEUE 256

enum { ST_QUEUED, ST_WRITING, ST_LIVE };

/* A queued page: the copy put made. Refcounted because get copies out of
 * it without holding mu while the writer may finish (and drop) the entry. */
typedef struct item {
    int refs;
    int32_t *tokens; /* page_tokens entries, inside this allocation */
    unsigned char *data; /* page_bytes, inside this allocation */
} item;

typedef struct entry {
    uint64_t hash, parent;
    uint64_t seq;       /* insertion order (persisted: enumerate's order) */
    uint64_t last_used; /* logical clock (s->tick) of the last put/get */
    uint64_t ticket;    /* flush ticket (queued entries) */
    int state;          /* ST_* */
    uint32_t seg;       /* ST_LIVE: where the record is */
    int64_t off;
    item *it;           /* ST_QUEUED / ST_WRITING: the page (one ref) */
    struct entry *q_next;                 /* queue / batch FIFO */
    struct entry *lru_prev, *lru_next;    /* ST_LIVE only */
    struct entry *dirty_prev, *dirty_next; /* last_used not yet in the index */
    bool dirty;
} entry;

typedef struct seg {
    uint32_t id;
    int64_t live;        /* index rows (any seed) pointing into it */
    int64_t pending_del; /* rows dropped in memory, delete not yet committed */
    int64_t size;        /* file size seen at open (validation only) */
} seg;

typedef struct ins_rec {
    uint64_t hash, parent, last_used, seq;
    uint32_t seg;
    int64_t off;
} ins_rec;
typedef struct upd_rec {
    uint64_t hash, last_used;
} upd_rec;
typedef struct del_rec {
    uint64_t seed, hash;
    int64_t seg; /* as stored: open also deletes rows naming no valid segment */
    int64_t off;
} del_rec;

struct ns_kv_ssd {
    /* immutable after open */
    char *dir;
    uint64_t seed;
    int32_t P;
    size_t page_bytes, tok_bytes, rec_len;
    int64_t cap;
    int32_t max_q;
    int dir_fd, lock_fd;
    sqlite3 *db;
    sqlite3_stmt *st_begin, *st_commit, *st_rollback, *st_insert, *st_touch, *st_delete;
    pthread_t writer;
    bool writer_started;

    /* writer thread only (open/close before/after it runs) */
    int cur_fd;         /* segment being appended, -1 none */
    uint32_t cur_id;    /* its id (0 = none) */
    int64_t cur_size;
    bool cur_unsynced;
    XXH3_state_t *xs;
    ins_rec *ins;       /* [max_q] batch rows */

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    entry **map;        /* open addressing, linear probing, NULL = empty */
    size_t map_cap, map_n;
    entry *q_head, *q_tail;
    int64_t n_pending;  /* queued + being written */
    entry *lru_head, *lru_tail;
    entry *dirty_head;
    size_t n_dirty;
    del_rec *dels;
    size_t n_dels, cap_dels;
    seg *segs;          /* sorted by id */
    size_t n_segs, cap_segs;
    uint32_t next_seg_id;
    uint64_t tick, next_seq, last_ticket, done_ticket;
    bool stop, maint_wanted;
    char warn[256];     /* degradation message the writer logs once unlocked */
    ns_kv_ssd_stats st; /* records, bytes, degraded, counters, histogram */
};

/* ---- little helpers ---------------------------------------------------- */

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_le32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
/* SQLite integers are signed 64-bit; hashes and seeds are stored bit-for-bit. */
static int64_t u2i(uint64_t v) {
    int64_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
static uint64_t i2u(int64_t v) {
    uint64_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static void seg_path(const ns_kv_ssd *s, uint32_t id, char *buf, size_t n) {
    snprintf(buf, n, "%s/seg-%08" PRIu32 ".dat", s->dir, id);
}

/* Writes/reads all of iov at off, retrying short transfers and EINTR.
 * Returns 0, an errno, or -1 for a read that hit end of file. */
static int pwritev_all(int fd, struct iovec *iov, int n, int64_t off) {
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        off += w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++, n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}
static int preadv_all(int fd, struct iovec *iov, int n, int64_t off) {
    while (n > 0) {
        ssize_t r = preadv(fd, iov, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) return -1;
        off += r;
        while (n > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++, n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return 0;
}

static void encode_header(unsigned char *h, uint64_t seed, uint64_t hash, uint64_t parent, int32_t P,
                          size_t page_bytes) {
    memcpy(h, "NSKV", 4);
    put_le32(h + 4, REC_VERSION);
    put_le64(h + 8, seed);
    put_le64(h + 16, hash);
    put_le64(h + 24, parent);
    put_le32(h + 32, (uint32_t)P);
    put_le32(h + 36, 0);
    put_le64(h + 40, (uint64_t)page_bytes);
}

/* True if h is the header this store would write for (hash, parent). */
static bool header_ok(const ns_kv_ssd *s, const unsigned char *h, uint64_t hash, uint64_t parent) {
    return memcmp(h, "NSKV", 4) == 0 && get_le32(h + 4) == REC_VERSION && get_le64(h + 8) == s->seed &&
           get_le64(h + 16) == hash && get_le64(h + 24) == parent && get_le32(h + 32) == (uint32_t)s->P &&
           get_le32(h + 36) == 0 && get_le64(h + 40) == (uint64_t)s->page_bytes;
}

/* ---- the hash map (under mu) -------------------------------------------- */

static size_t map_slot(uint64_t h, size_t cap) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static entry *map_find(ns_kv_ssd *s, uint64_t h) {
    if (!s->map_cap) return NULL;
    for (size_t i = map_slot(h, s->map_cap); s->map[i]; i = (i + 1) & (s->map_cap - 1))
        if (s->map[i]->hash == h) return s->map[i];
    return NULL;
}

static void map_place(entry **map, size_t cap, entry *e) {
    size_t i = map_slot(e->hash, cap);
    while (map[i]) i = (i + 1) & (cap - 1);
    map[i] = e;
}

/* Inserts e (its hash must not be present). Fails only on OOM. */
static bool map_insert(ns_kv_ssd *s, entry *e) {
    if ((s->map_n + 1) * 2 > s->map_cap) {
        size_t cap = s->map_cap ? s->map_cap * 2 : 64;
        entry **m = calloc(cap, sizeof *m);
        if (!m) return false;
        for (size_t i = 0; i < s->map_cap; i++)
            if (s->map[i]) map_place(m, cap, s->map[i]);
        free(s->map);
        s->map = m;
        s->map_cap = cap;
    }
    map_place(s->map, s->map_cap, e);
    s->map_n++;
    return true;
}

/* Removes e, shifting later members of its probe run back (no tombstones). */
static void map_remove(ns_kv_ssd *s, entry *e) {
    size_t mask = s->map_cap - 1, i = map_slot(e->hash, s->map_cap);
    while (s->map[i] != e) i = (i + 1) & mask;
    s->map[i] = NULL;
    for (size_t j = (i + 1) & mask; s->map[j]; j = (j + 1) & mask) {
        size_t k = map_slot(s->map[j]->hash, s->map_cap);
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        s->map[i] = s->map[j];
        s->map[j] = NULL;
        i = j;
    }
    s->map_n--;
}

/* ---- LRU list, dirty list, segments, deletes (under mu) ----------------- */

static void lru_unlink(ns_kv_ssd *s, entry *e) {
    if (e->lru_prev) e->lru_prev->lru_next = e->lru_next;
    else s->lru_head = e->lru_next;
    if (e->lru_next) e->lru_next->lru_prev = e->lru_prev;
    else s->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}
static void lru_push_head(ns_kv_ssd *s, entry *e) {
    e->lru_prev = NULL;
    e->lru_next = s->lru_head;
    if (s->lru_head) s->lru_head->lru_prev = e;
    else s->lru_tail = e;
    s->lru_head = e;
}

static void dirty_mark(ns_kv_ssd *s, entry *e) {
    if (e->dirty) return;
    e->dirty = true;
    e->dirty_prev = NULL;
    e->dirty_next = s->dirty_head;
    if (s->dirty_head) s->dirty_head->dirty_prev = e;
    s->dirty_head = e;
    s->n_dirty++;
}
static void dirty_unlink(ns_kv_ssd *s, entry *e) {
    if (!e->dirty) return;
    if (e->dirty_prev) e->dirty_prev->dirty_next = e->dirty_next;
    else s->dirty_head = e->dirty_next;
    if (e->dirty_next) e->dirty_next->dirty_prev = e->dirty_prev;
    e->dirty = false;
    e->dirty_prev = e->dirty_next = NULL;
    s->n_dirty--;
}

/* A put or get of e: the LRU clock moves; durable entries move to the head
 * and their new last_used is written to the index lazily. */
static void touch(ns_kv_ssd *s, entry *e) {
    e->last_used = ++s->tick;
    if (e->state == ST_LIVE) {
        lru_unlink(s, e);
        lru_push_head(s, e);
        dirty_mark(s, e);
    }
}

static seg *seg_find(ns_kv_ssd *s, uint32_t id) {
    size_t lo = 0, hi = s->n_segs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->segs[mid].id == id) return &s->segs[mid];
        if (s->segs[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Appends a segment; ids only grow after open, so the array stays sorted
 * (open sorts what it found on disk once). */
static bool seg_add(ns_kv_ssd *s, uint32_t id, int64_t size) {
    if (s->n_segs == s->cap_segs) {
        size_t cap = s->cap_segs ? s->cap_segs * 2 : 16;
        seg *n = realloc(s->segs, cap * sizeof *n);
        if (!n) return false;
        s->segs = n;
        s->cap_segs = cap;
    }
    s->segs[s->n_segs++] = (seg){.id = id, .size = size};
    return true;
}

static void item_release(item *it) {
    if (it && --it->refs == 0) free(it);
}

/* Queues the deletion of a row for the writer's next transaction. On OOM the
 * row simply stays in the index: it is found again (and dropped again) at
 * the next open, which is harmless for a cache. */
static seg *seg_find_row(ns_kv_ssd *s, int64_t segid) {
    return segid > 0 && segid <= UINT32_MAX ? seg_find(s, (uint32_t)segid) : NULL;
}

static void del_push(ns_kv_ssd *s, uint64_t seed, uint64_t hash, int64_t segid, int64_t off) {
    if (s->n_dels == s->cap_dels) {
        size_t cap = s->cap_dels ? s->cap_dels * 2 : 64;
        del_rec *n = realloc(s->dels, cap * sizeof *n);
        if (!n) return;
        s->dels = n;
        s->cap_dels = cap;
    }
    s->dels[s->n_dels++] = (del_rec){seed, hash, segid, off};
    seg *g = seg_find_row(s, segid);
    if (g) g->pending_del++;
}

/* Forgets a durable entry (evicted or failed verification): out of the map
 * and the LRU list, its row queued for deletion, its segment one row
 * emptier. Frees e. */
static void drop_live(ns_kv_ssd *s, entry *e) {
    map_remove(s, e);
    lru_unlink(s, e);
    dirty_unlink(s, e);
    seg *g = seg_find(s, e->seg);
    if (g) g->live--;
    del_push(s, s->seed, e->hash, e->seg, e->off);
    s->st.records--;
    s->st.bytes -= (int64_t)s->rec_len;
    free(e);
}

/* Drops least recently used records until live bytes fit the cap. */
static void evict_locked(ns_kv_ssd *s) {
    bool any = false;
    while (s->st.bytes > s->cap && s->lru_tail) {
        drop_live(s, s->lru_tail);
        s->st.evicted++;
        any = true;
    }
    if (any) s->maint_wanted = true;
}

/* Drops the record (hash, seq) after a failed verification, unless it was
 * already dropped or replaced meanwhile. Counted in checksum_failures. */
static void drop_corrupt(ns_kv_ssd *s, uint64_t hash, uint64_t seq) {
    pthread_mutex_lock(&s->mu);
    entry *e = map_find(s, hash);
    if (e && e->state == ST_LIVE && e->seq == seq) {
        drop_live(s, e);
        s->st.checksum_failures++;
        s->maint_wanted = true;
        pthread_cond_signal(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
}

static void hist_add(ns_kv_ssd *s, double dt) {
    pthread_mutex_lock(&s->mu);
    int b = 0;
    while (b < NS_KV_SSD_FSYNC_BUCKETS - 1 && dt > s->st.fsync_bounds[b]) b++;
    s->st.fsync_counts[b]++;
    s->st.fsync_sum += dt;
    s->st.fsync_count++;
    pthread_mutex_unlock(&s->mu);
}

/* Sets degraded, once per store (under mu); the writer logs the message
 * (warn) after it lets go of mu. */
static void degrade_locked(ns_kv_ssd *s, const char *what, const char *why) {
    if (s->st.degraded) return;
    s->st.degraded = true;
    snprintf(s->warn, sizeof s->warn, "%s failed (%s)", what, why);
}

/* ---- SQLite --------------------------------------------------------------- */

static int db_exec(sqlite3 *db, const char *sql) { return sqlite3_exec(db, sql, NULL, NULL, NULL); }

static int step_reset(sqlite3_stmt *st) {
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* One transaction: insert a batch's rows, update last_used, delete rows.
 * Runs without mu (only the writer, or open/close, uses the connection).
 * Returns an SQLite result code. */
static int run_txn(ns_kv_ssd *s, const ins_rec *ins, size_t n_ins, const upd_rec *ups, size_t n_ups,
                   const del_rec *dels, size_t n_dels) {
    if (!n_ins && !n_ups && !n_dels) return SQLITE_OK;
    int rc = step_reset(s->st_begin);
    if (rc != SQLITE_OK) return rc;
    for (size_t i = 0; i < n_ins && rc == SQLITE_OK; i++) {
        sqlite3_stmt *q = s->st_insert;
        sqlite3_bind_int64(q, 1, u2i(s->seed));
        sqlite3_bind_int64(q, 2, u2i(ins[i].hash));
        sqlite3_bind_int64(q, 3, u2i(ins[i].parent));
        sqlite3_bind_int64(q, 4, ins[i].seg);
        sqlite3_bind_int64(q, 5, ins[i].off);
        sqlite3_bind_int64(q, 6, (int64_t)s->rec_len);
        sqlite3_bind_int64(q, 7, u2i(ins[i].last_used));
        sqlite3_bind_int64(q, 8, u2i(ins[i].seq));
        rc = step_reset(q);
    }
    for (size_t i = 0; i < n_ups && rc == SQLITE_OK; i++) {
        sqlite3_stmt *q = s->st_touch;
        sqlite3_bind_int64(q, 1, u2i(ups[i].last_used));
        sqlite3_bind_int64(q, 2, u2i(s->seed));
        sqlite3_bind_int64(q, 3, u2i(ups[i].hash));
        rc = step_reset(q);
    }
    /* A delete names the row's location too: if the same hash was put again
     * meanwhile (a new row at another place), the new row must survive. */
    for (size_t i = 0; i < n_dels && rc == SQLITE_OK; i++) {
        sqlite3_stmt *q = s->st_delete;
        sqlite3_bind_int64(q, 1, u2i(dels[i].seed));
        sqlite3_bind_int64(q, 2, u2i(dels[i].hash));
        sqlite3_bind_int64(q, 3, dels[i].seg);
        sqlite3_bind_int64(q, 4, dels[i].off);
        rc = step_reset(q);
    }
    if (rc == SQLITE_OK) rc = step_reset(s->st_commit);
    if (rc != SQLITE_OK) step_reset(s->st_rollback);
    return rc;
}

/* ---- the writer ----------------------------------------------------------- */

static int timed_sync(ns_kv_ssd *s, int fd) {
    double t0 = ns_clock_now();
    int r = fdatasync(fd) ? errno : 0;
    hist_add(s, ns_clock_now() - t0);
    return r;
}

/* Makes the current segment durable, closes it and creates the next one. */
static int roll_segment(ns_kv_ssd *s, const char **what) {
    if (s->cur_fd >= 0) {
        if (s->cur_unsynced) {
            int r = timed_sync(s, s->cur_fd);
            if (r) {
                *what = "segment fdatasync";
                return r;
            }
            s->cur_unsynced = false;
        }
        close(s->cur_fd);
        s->cur_fd = -1;
    }
    pthread_mutex_lock(&s->mu);
    uint32_t id = s->next_seg_id++;
    bool ok = seg_add(s, id, 0);
    pthread_mutex_unlock(&s->mu);
    if (!ok) {
        *what = "segment bookkeeping";
        return ENOMEM;
    }
    char path[4096];
    seg_path(s, id, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        *what = "segment create";
        return errno;
    }
    s->cur_fd = fd;
    s->cur_id = id;
    s->cur_size = 0;
    return 0;
}

/* Appends every record of batch (no lock held) and makes them durable:
 * fdatasync of each segment written, fsync of the directory if a segment
 * was created. Fills ins[i] with where record i went. Returns 0 or an errno
 * with *what naming the step that failed. */
static int write_batch(ns_kv_ssd *s, entry *batch, ins_rec *ins, const char **what) {
    bool created = false;
    size_t i = 0;
    for (entry *e = batch; e; e = e->q_next, i++) {
        if (s->cur_fd < 0 || (s->cur_size > 0 && (uint64_t)s->cur_size + s->rec_len > SEG_TARGET)) {
            int r = roll_segment(s, what);
            if (r) return r;
            created = true;
        }
        unsigned char hdr[REC_HDR], sum[REC_SUM];
        encode_header(hdr, s->seed, e->hash, e->parent, s->P, s->page_bytes);
        XXH3_64bits_reset(s->xs);
        XXH3_64bits_update(s->xs, hdr, sizeof hdr);
        XXH3_64bits_update(s->xs, e->it->tokens, s->tok_bytes);
        XXH3_64bits_update(s->xs, e->it->data, s->page_bytes);
        put_le64(sum, XXH3_64bits_digest(s->xs));
        struct iovec iov[4] = {{hdr, sizeof hdr}, {e->it->tokens, s->tok_bytes},
                               {e->it->data, s->page_bytes}, {sum, sizeof sum}};
        s->cur_unsynced = true;
        int r = pwritev_all(s->cur_fd, iov, 4, s->cur_size);
        if (r) {
            *what = "segment write";
            return r;
        }
        ins[i] = (ins_rec){.hash = e->hash, .parent = e->parent, .seq = e->seq, .seg = s->cur_id,
                           .off = s->cur_size};
        s->cur_size += (int64_t)s->rec_len;
    }
    if (s->cur_fd >= 0 && s->cur_unsynced) {
        int r = timed_sync(s, s->cur_fd);
        if (r) {
            *what = "segment fdatasync";
            return r;
        }
        s->cur_unsynced = false;
    }
    /* A new file's directory entry must be durable before a row names it. */
    if (created && fsync(s->dir_fd)) {
        *what = "directory fsync";
        return errno;
    }
    return 0;
}

/* Unlinks segments no row points to any more (and none is about to: no
 * uncommitted delete names them), except the one being appended. Called
 * with mu held; drops it around the unlinks. */
static void unlink_empty_locked(ns_kv_ssd *s) {
    uint32_t ids[64];
    size_t n = 0;
    for (size_t i = 0; i < s->n_segs && n < 64;) {
        seg *g = &s->segs[i];
        if (g->live <= 0 && g->pending_del <= 0 && g->id != s->cur_id) {
            ids[n++] = g->id;
            memmove(g, g + 1, (s->n_segs - i - 1) * sizeof *g);
            s->n_segs--;
        } else {
            i++;
        }
    }
    if (!n) return;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        seg_path(s, ids[i], path, sizeof path);
        if (unlink(path) && errno != ENOENT)
            NS_DEBUG("kv_ssd: unlink %s: %s", path, strerror(errno));
    }
    pthread_mutex_lock(&s->mu);
    if (n == 64) s->maint_wanted = true; /* more may be left: next pass */
}

/* The writer thread: one pass = take the whole queue as a batch, write and
 * sync it unlocked, commit its rows together with the pending last_used
 * updates and deletes, publish the result, evict over the cap, unlink
 * emptied segments. Exits once stop is set and nothing is left to do. */
static void *writer_main(void *arg) {
    ns_kv_ssd *s = arg;
    upd_rec *ups = NULL;
    size_t ups_cap = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->q_head && !s->maint_wanted) {
            if (s->stop) {
                if (s->dirty_head || s->n_dels) break; /* last lazy updates at close */
                goto out;
            }
            pthread_cond_wait(&s->cv_work, &s->mu);
        }
        s->maint_wanted = false;
        entry *batch = s->q_head;
        s->q_head = s->q_tail = NULL;
        size_t nb = 0;
        uint64_t last_ticket = 0;
        for (entry *e = batch; e; e = e->q_next, nb++) {
            e->state = ST_WRITING;
            last_ticket = e->ticket;
        }
        bool skip_write = s->st.degraded;
        pthread_mutex_unlock(&s->mu);

        int werr = 0;
        const char *what = "";
        if (nb && !skip_write) werr = write_batch(s, batch, s->ins, &what);
        size_t n_ins = (nb && !skip_write && !werr) ? nb : 0;

        /* Snapshot the lazy work other threads queued. */
        pthread_mutex_lock(&s->mu);
        size_t i = 0;
        for (entry *e = batch; e && n_ins; e = e->q_next) s->ins[i++].last_used = e->last_used;
        size_t n_ups = 0;
        if (s->n_dirty > ups_cap) {
            upd_rec *n = realloc(ups, s->n_dirty * sizeof *n);
            if (n) ups = n, ups_cap = s->n_dirty;
        }
        while (s->dirty_head && n_ups < ups_cap) {
            entry *e = s->dirty_head;
            ups[n_ups++] = (upd_rec){e->hash, e->last_used};
            dirty_unlink(s, e);
        }
        if (s->stop) /* closing: what did not fit (OOM) is lost, harmlessly */
            while (s->dirty_head) dirty_unlink(s, s->dirty_head);
        del_rec *dels = s->dels;
        size_t n_dels = s->n_dels;
        s->dels = NULL;
        s->n_dels = s->cap_dels = 0;
        pthread_mutex_unlock(&s->mu);

        int rc = run_txn(s, s->ins, n_ins, ups, n_ups, dels, n_dels);

        pthread_mutex_lock(&s->mu);
        for (size_t k = 0; k < n_dels; k++) {
            seg *g = seg_find_row(s, dels[k].seg);
            if (g) g->pending_del--;
        }
        free(dels);
        if (rc != SQLITE_OK) degrade_locked(s, "index commit", sqlite3_errstr(rc));
        if (nb) {
            bool ok = n_ins && rc == SQLITE_OK;
            if (!ok && werr) degrade_locked(s, what, strerror(werr));
            i = 0;
            for (entry *e = batch, *next; e; e = next, i++) {
                next = e->q_next;
                e->q_next = NULL;
                item_release(e->it);
                e->it = NULL;
                if (!ok) {
                    map_remove(s, e);
                    free(e);
                    continue;
                }
                e->state = ST_LIVE;
                e->seg = s->ins[i].seg;
                e->off = s->ins[i].off;
                lru_push_head(s, e);
                if (e->last_used != s->ins[i].last_used) dirty_mark(s, e); /* read while written */
                seg *g = seg_find(s, e->seg);
                if (g) g->live++;
                s->st.records++;
                s->st.bytes += (int64_t)s->rec_len;
                s->st.writes++;
                s->st.bytes_written += (int64_t)s->rec_len;
            }
            if (!ok) s->st.failed += (int64_t)nb;
            s->n_pending -= (int64_t)nb;
            s->done_ticket = last_ticket;
            pthread_cond_broadcast(&s->cv_done);
        }
        evict_locked(s);
        if (rc == SQLITE_OK) unlink_empty_locked(s);
        if (s->warn[0]) {
            char msg[sizeof s->warn];
            memcpy(msg, s->warn, sizeof msg);
            s->warn[0] = 0;
            pthread_mutex_unlock(&s->mu);
            NS_WARN("kv_ssd: %s: %s; SSD tier degraded: new pages are no longer written, stored pages are still "
                    "served",
                    s->dir, msg);
            pthread_mutex_lock(&s->mu);
        }
    }
out:
    pthread_mutex_unlock(&s->mu);
    free(ups);
    return NULL;
}

/* ---- open / close --------------------------------------------------------- */

/* mkdir -p with mode 0700 for every directory it creates. */
static int mkdir_p(const char *dir) {
    char *p = strdup(dir);
    if (!p) return ENOMEM;
    int r = 0;
    for (char *q = p + 1;; q++) {
        if (*q == '/' || *q == 0) {
            char c = *q;
            *q = 0;
            if (mkdir(p, 0700) && errno != EEXIST) {
                r = errno;
                break;
            }
            *q = c;
            if (!c) break;
        }
    }
    free(p);
    if (r) return r;
    struct stat sb;
    if (stat(dir, &sb)) return errno;
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
}

/* Frees a store in any state of construction: the writer must be stopped. */
static void store_free(ns_kv_ssd *s) {
    for (size_t i = 0; i < s->map_cap; i++) {
        entry *e = s->map ? s->map[i] : NULL;
        if (!e) continue;
        item_release(e->it);
        free(e);
    }
    free(s->map);
    free(s->segs);
    free(s->dels);
    free(s->ins);
    sqlite3_stmt *sts[] = {s->st_begin, s->st_commit, s->st_rollback, s->st_insert, s->st_touch, s->st_delete};
    for (size_t i = 0; i < sizeof sts / sizeof sts[0]; i++) sqlite3_finalize(sts[i]);
    if (s->db) sqlite3_close(s->db); /* the last connection checkpoints the WAL */
    if (s->xs) XXH3_freeState(s->xs);
    if (s->cur_fd >= 0) close(s->cur_fd);
    if (s->dir_fd >= 0) close(s->dir_fd);
    if (s->lock_fd >= 0) close(s->lock_fd); /* releases the flock */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s->dir);
    free(s);
}

static int seg_cmp(const void *a, const void *b) {
    uint32_t x = ((const seg *)a)->id, y = ((const seg *)b)->id;
    return x < y ? -1 : x > y;
}

/* Lists seg-NNNNNNNN.dat files with their sizes into s->segs. */
static ns_status scan_segments(ns_kv_ssd *s, ns_error *err) {
    DIR *d = opendir(s->dir);
    if (!d) return ns_fail(err, NS_ERR_IO, "%s: cannot list directory: %s", s->dir, strerror(errno));
    ns_status st = NS_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strlen(n) != 16 || strncmp(n, "seg-", 4) != 0 || strcmp(n + 12, ".dat") != 0) continue;
        uint32_t id = 0;
        bool digits = true;
        for (int i = 4; i < 12; i++) {
            if (n[i] < '0' || n[i] > '9') digits = false;
            else id = id * 10 + (uint32_t)(n[i] - '0');
        }
        if (!digits || id == 0) continue;
        struct stat sb;
        if (fstatat(dirfd(d), n, &sb, 0) || !S_ISREG(sb.st_mode)) continue;
        if (!seg_add(s, id, (int64_t)sb.st_size)) {
            st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory listing segments", s->dir);
            break;
        }
        if (id >= s->next_seg_id) s->next_seg_id = id + 1;
    }
    closedir(d);
    if (s->n_segs) qsort(s->segs, s->n_segs, sizeof *s->segs, seg_cmp);
    return st;
}

/* Opens index.db, sets WAL + synchronous=FULL (see the top comment), creates
 * or checks the schema, prepares the statements the writer uses. */
static ns_status open_index(ns_kv_ssd *s, ns_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/index.db", s->dir);
    int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK)
        return ns_fail(err, NS_ERR_IO, "%s: cannot open index: %s", path,
                       s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
    sqlite3_busy_timeout(s->db, 5000);
    sqlite3_stmt *q = NULL;
    rc = sqlite3_prepare_v2(s->db, "PRAGMA journal_mode=WAL", -1, &q, NULL);
    bool wal = rc == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW &&
               sqlite3_column_text(q, 0) && strcmp((const char *)sqlite3_column_text(q, 0), "wal") == 0;
    sqlite3_finalize(q);
    if (!wal) return ns_fail(err, NS_ERR_IO, "%s: cannot switch the index to WAL mode: %s", path, sqlite3_errmsg(s->db));
    rc = db_exec(s->db,
                 "PRAGMA synchronous=FULL;"
                 "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
                 "INSERT OR IGNORE INTO meta VALUES('schema_version', 1);"
                 "CREATE TABLE IF NOT EXISTS records("
                 " seed INTEGER NOT NULL, hash INTEGER NOT NULL, parent INTEGER NOT NULL,"
                 " segment INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL,"
                 " last_used INTEGER NOT NULL, seq INTEGER NOT NULL,"
                 " PRIMARY KEY(seed, hash)) WITHOUT ROWID;");
    if (rc != SQLITE_OK) return ns_fail(err, NS_ERR_IO, "%s: cannot create the index schema: %s", path, sqlite3_errmsg(s->db));
    int64_t version = -1;
    if (sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key='schema_version'", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        version = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    if (version != SCHEMA_VERSION)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: index schema version %" PRId64 ", this build reads %d (move the directory away)",
                       path, version, SCHEMA_VERSION);
    struct {
        sqlite3_stmt **st;
        const char *sql;
    } stmts[] = {
        {&s->st_begin, "BEGIN IMMEDIATE"},
        {&s->st_commit, "COMMIT"},
        {&s->st_rollback, "ROLLBACK"},
        {&s->st_insert, "INSERT OR REPLACE INTO records(seed,hash,parent,segment,offset,length,last_used,seq) "
                        "VALUES(?,?,?,?,?,?,?,?)"},
        {&s->st_touch, "UPDATE records SET last_used=? WHERE seed=? AND hash=?"},
        {&s->st_delete, "DELETE FROM records WHERE seed=? AND hash=? AND segment=? AND offset=?"},
    };
    for (size_t i = 0; i < sizeof stmts / sizeof stmts[0]; i++)
        if (sqlite3_prepare_v2(s->db, stmts[i].sql, -1, stmts[i].st, NULL) != SQLITE_OK)
            return ns_fail(err, NS_ERR_IO, "%s: cannot prepare \"%s\": %s", path, stmts[i].sql, sqlite3_errmsg(s->db));
    return NS_OK;
}

/* Loads every row: this seed's valid ones become live entries (LRU order =
 * last_used order), other seeds' are counted (n_foreign) and pin their
 * segments. A row whose segment is missing or too short, or whose length is
 * not this store's record length, is queued for deletion and counted in
 * checksum_failures. Full verification is left to get. */
static ns_status load_index(ns_kv_ssd *s, ns_error *err) {
    sqlite3_stmt *q = NULL;
    ns_status st = NS_OK;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT seed,hash,parent,segment,offset,length,last_used,seq FROM records "
                           "ORDER BY last_used, seq",
                           -1, &q, NULL) != SQLITE_OK)
        return ns_fail(err, NS_ERR_IO, "%s: cannot read the index: %s", s->dir, sqlite3_errmsg(s->db));
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        uint64_t seed = i2u(sqlite3_column_int64(q, 0)), hash = i2u(sqlite3_column_int64(q, 1));
        int64_t segid = sqlite3_column_int64(q, 3), off = sqlite3_column_int64(q, 4), len = sqlite3_column_int64(q, 5);
        uint64_t last_used = i2u(sqlite3_column_int64(q, 6)), seq = i2u(sqlite3_column_int64(q, 7));
        seg *g = seg_find_row(s, segid);
        bool mine = seed == s->seed;
        bool valid = g && off >= 0 && len > 0 && len <= g->size && off <= g->size - len &&
                     (!mine || len == (int64_t)s->rec_len);
        if (segid > 0 && segid < UINT32_MAX && (uint32_t)segid >= s->next_seg_id) s->next_seg_id = (uint32_t)segid + 1;
        if (last_used >= s->tick) s->tick = last_used;
        if (seq >= s->next_seq) s->next_seq = seq + 1;
        if (!valid) {
            s->st.checksum_failures++;
            del_push(s, seed, hash, segid, off);
            continue;
        }
        g->live++;
        if (!mine) {
            s->st.n_foreign++;
            continue;
        }
        entry *e = malloc(sizeof *e);
        if (e)
            *e = (entry){.hash = hash, .parent = i2u(sqlite3_column_int64(q, 2)), .seq = seq, .last_used = last_used,
                         .state = ST_LIVE, .seg = (uint32_t)segid, .off = off};
        if (!e || !map_insert(s, e)) {
            free(e);
            st = ns_fail(err, NS_ERR_NOMEM, "%s: out of memory loading the index", s->dir);
            break;
        }
        lru_push_head(s, e); /* rows come oldest first: the tail ends up oldest */
        s->st.records++;
        s->st.bytes += (int64_t)s->rec_len;
    }
    if (st == NS_OK && rc != SQLITE_DONE)
        st = ns_fail(err, NS_ERR_IO, "%s: cannot read the index: %s", s->dir, sqlite3_errmsg(s->db));
    sqlite3_finalize(q);
    return st;
}

ns_status ns_kv_ssd_open(const ns_kv_ssd_opts *opts, ns_kv_ssd **out, ns_error *err) {
    if (!out) return ns_fail(err, NS_ERR_INVALID, "kv_ssd: no output pointer");
    *out = NULL;
    if (!opts || !opts->dir || !opts->dir[0])
        return ns_fail(err, NS_ERR_INVALID, "kv_ssd: no directory given");
    if (opts->page_tokens <= 0 || opts->page_tokens > MAX_PAGE_TOKENS || opts->page_bytes == 0 ||
        opts->page_bytes > MAX_PAGE_BYTES || opts->cap_bytes <= 0 || opts->max_queue_pages < 0)
        return ns_fail(err, NS_ERR_INVALID,
                       "kv_ssd: %s: bad options (page_tokens %d, page_bytes %zu, cap_bytes %" PRId64 ", max_queue_pages %d)",
                       opts->dir, opts->page_tokens, opts->page_bytes, opts->cap_bytes, opts->max_queue_pages);
    /* With the bounds above, record sizes fit easily in size_t and int64. */
    ns_status st = NS_OK;
    ns_kv_ssd *s = calloc(1, sizeof *s);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "kv_ssd: out of memory");
    s->dir_fd = s->lock_fd = s->cur_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* flush timeouts ignore wall-clock jumps */
    pthread_cond_init(&s->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    s->dir = strdup(opts->dir);
    s->seed = opts->seed;
    s->P = opts->page_tokens;
    s->page_bytes = opts->page_bytes;
    s->tok_bytes = (size_t)opts->page_tokens * sizeof(int32_t);
    s->rec_len = REC_HDR + s->tok_bytes + s->page_bytes + REC_SUM;
    s->cap = opts->cap_bytes;
    s->max_q = opts->max_queue_pages ? opts->max_queue_pages : DEFAULT_QUEUE;
    s->next_seg_id = 1;
    for (int b = 0; b < NS_KV_SSD_FSYNC_BUCKETS - 1; b++) s->st.fsync_bounds[b] = 0.0005 * (double)(1u << b);
    s->st.fsync_bounds[NS_KV_SSD_FSYNC_BUCKETS - 1] = INFINITY;
    s->xs = XXH3_createState();
    s->ins = calloc((size_t)s->max_q, sizeof *s->ins);
    if (!s->dir || !s->xs || !s->ins) {
        st = ns_fail(err, NS_ERR_NOMEM, "kv_ssd: out of memory");
        goto cleanup;
    }

    int r = mkdir_p(s->dir);
    if (r) {
        st = ns_fail(err, NS_ERR_IO, "%s: cannot create the SSD cache directory: %s", s->dir, strerror(r));
        goto cleanup;
    }
    s->dir_fd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dir_fd < 0) {
        st = ns_fail(err, NS_ERR_IO, "%s: cannot open directory: %s", s->dir, strerror(errno));
        goto cleanup;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/lock", s->dir);
    s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lock_fd < 0) {
        st = ns_fail(err, NS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto cleanup;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB)) {
        st = ns_fail(err, NS_ERR_IO, "%s: the SSD cache directory is in use by another store (%s)", s->dir,
                     strerror(errno));
        goto cleanup;
    }
    if ((st = open_index(s, err)) != NS_OK) goto cleanup;
    if ((st = scan_segments(s, err)) != NS_OK) goto cleanup;
    if ((st = load_index(s, err)) != NS_OK) goto cleanup;
    evict_locked(s); /* the cap may have shrunk since the last run */

    /* Commit the deletes found so far, then drop segments no row names: the
     * tails of crashed runs, or segments whose rows were all dropped before
     * their unlink happened. (No thread runs yet: no locking needed.) */
    int rc = run_txn(s, NULL, 0, NULL, 0, s->dels, s->n_dels);
    if (rc != SQLITE_OK) {
        st = ns_fail(err, NS_ERR_IO, "%s: cannot update the index: %s", s->dir, sqlite3_errstr(rc));
        goto cleanup;
    }
    for (size_t i = 0; i < s->n_dels; i++) {
        seg *g = seg_find_row(s, s->dels[i].seg);
        if (g) g->pending_del--;
    }
    s->n_dels = 0;
    s->maint_wanted = false;
    pthread_mutex_lock(&s->mu);
    unlink_empty_locked(s);
    pthread_mutex_unlock(&s->mu);
    fsync(s->dir_fd); /* index.db may be new: make its directory entry durable */
    if (s->st.checksum_failures)
        NS_WARN("kv_ssd: %s: dropped %" PRId64 " index rows naming a missing or short segment, or of a wrong length",
                s->dir,
                s->st.checksum_failures);
    NS_INFO("kv_ssd: %s: %" PRId64 " records (%" PRId64 " bytes), %" PRId64 " of other seeds, %" PRId64 " evicted",
            s->dir, s->st.records, s->st.bytes, s->st.n_foreign, s->st.evicted);

    if ((r = pthread_create(&s->writer, NULL, writer_main, s)) != 0) {
        st = ns_fail(err, NS_ERR_INTERNAL, "%s: cannot start the writer thread: %s", s->dir, strerror(r));
        goto cleanup;
    }
    s->writer_started = true;
    *out = s;
    return NS_OK;

cleanup:
    store_free(s);
    return st;
}

void ns_kv_ssd_close(ns_kv_ssd *s) {
    if (!s) return;
    if (s->writer_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
    }
    store_free(s);
}

/* ---- the API -------------------------------------------------------------- */

ns_status ns_kv_ssd_put(ns_kv_ssd *s, uint64_t hash, uint64_t parent, const int32_t *tokens, const void *data) {
    if (!s || !tokens || !data) return NS_ERR_INVALID;
    /* Cheap checks first, so a refused put costs no copy. */
    pthread_mutex_lock(&s->mu);
    ns_status st = NS_OK;
    entry *e = map_find(s, hash);
    if (e) touch(s, e);
    else if (s->st.degraded) st = NS_ERR_IO;
    else if (s->n_pending >= s->max_q) st = NS_ERR_FULL;
    if (st != NS_OK) s->st.dropped++;
    pthread_mutex_unlock(&s->mu);
    if (e || st != NS_OK) return st;

    /* Copy outside mu (pages are megabytes). The item is owned by the entry
     * from here on; get may pin it with an extra ref. */
    size_t tok_off = (sizeof(item) + 15) & ~(size_t)15, data_off = (tok_off + s->tok_bytes + 63) & ~(size_t)63;
    item *it = malloc(data_off + s->page_bytes);
    entry *ne = calloc(1, sizeof *ne);
    if (!it || !ne) {
        free(it);
        free(ne);
        pthread_mutex_lock(&s->mu);
        s->st.dropped++;
        pthread_mutex_unlock(&s->mu);
        return NS_ERR_NOMEM;
    }
    it->refs = 1;
    it->tokens = (int32_t *)(void *)((char *)it + tok_off);
    it->data = (unsigned char *)it + data_off;
    memcpy(it->tokens, tokens, s->tok_bytes);
    memcpy(it->data, data, s->page_bytes);

    ne->hash = hash;
    ne->parent = parent;
    ne->state = ST_QUEUED;
    ne->it = it;

    pthread_mutex_lock(&s->mu);
    /* Re-check: another thread may have put the same page, the queue may
     * have filled, or the tier degraded while we copied. */
    if ((e = map_find(s, hash)) != NULL) touch(s, e);
    else if (s->st.degraded) st = NS_ERR_IO;
    else if (s->n_pending >= s->max_q) st = NS_ERR_FULL;
    else if (!map_insert(s, ne)) st = NS_ERR_NOMEM;
    if (e || st != NS_OK) {
        if (st != NS_OK) s->st.dropped++;
        pthread_mutex_unlock(&s->mu);
        free(it);
        free(ne);
        return st;
    }
    ne->seq = s->next_seq++;
    ne->last_used = ++s->tick;
    ne->ticket = ++s->last_ticket;
    if (s->q_tail) s->q_tail->q_next = ne;
    else s->q_head = ne;
    s->q_tail = ne;
    s->n_pending++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return NS_OK;
}

bool ns_kv_ssd_contains(ns_kv_ssd *s, uint64_t hash) {
    if (!s) return false;
    pthread_mutex_lock(&s->mu);
    bool r = map_find(s, hash) != NULL;
    pthread_mutex_unlock(&s->mu);
    return r;
}

ns_status ns_kv_ssd_get(ns_kv_ssd *s, uint64_t hash, int32_t *tokens, void *data, ns_error *err) {
    if (!s || !data) return ns_fail(err, NS_ERR_INVALID, "kv_ssd: get without a store or buffer");
    pthread_mutex_lock(&s->mu);
    entry *e = map_find(s, hash);
    if (!e) {
        pthread_mutex_unlock(&s->mu);
        return ns_fail(err, NS_ERR_RANGE, "kv_ssd: page %016" PRIx64 " not stored", hash);
    }
    touch(s, e);
    if (e->state != ST_LIVE) {
        /* Not yet durable: copy from the queued page, pinned so that the
         * writer's completion cannot free it under us. */
        item *it = e->it;
        it->refs++;
        pthread_mutex_unlock(&s->mu);
        memcpy(data, it->data, s->page_bytes);
        if (tokens) memcpy(tokens, it->tokens, s->tok_bytes);
        pthread_mutex_lock(&s->mu);
        item_release(it);
        s->st.reads++;
        pthread_mutex_unlock(&s->mu);
        return NS_OK;
    }
    uint32_t segid = e->seg;
    int64_t off = e->off;
    uint64_t seq = e->seq, parent = e->parent;
    pthread_mutex_unlock(&s->mu);

    ns_status st = NS_OK;
    int32_t *tok = tokens ? tokens : malloc(s->tok_bytes); /* owned here when the caller gave none */
    int fd = -1;
    if (!tok) {
        st = ns_fail(err, NS_ERR_NOMEM, "kv_ssd: out of memory");
        goto cleanup;
    }
    char path[4096];
    seg_path(s, segid, path, sizeof path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e0 = errno;
        /* Evicted since we looked (its segment unlinked), or the file is gone
         * under a live row: the latter cannot be served again. */
        pthread_mutex_lock(&s->mu);
        entry *now = map_find(s, hash);
        bool still = now && now->state == ST_LIVE && now->seq == seq;
        pthread_mutex_unlock(&s->mu);
        if (!still) st = ns_fail(err, NS_ERR_RANGE, "kv_ssd: page %016" PRIx64 " not stored", hash);
        else if (e0 == ENOENT) {
            drop_corrupt(s, hash, seq);
            st = ns_fail(err, NS_ERR_FORMAT, "%s: missing; page %016" PRIx64 " dropped", path, hash);
        } else {
            st = ns_fail(err, NS_ERR_IO, "%s: %s", path, strerror(e0));
        }
        goto cleanup;
    }
    unsigned char hdr[REC_HDR], sum[REC_SUM];
    struct iovec iov[4] = {{hdr, sizeof hdr}, {tok, s->tok_bytes}, {data, s->page_bytes}, {sum, sizeof sum}};
    int r = preadv_all(fd, iov, 4, off);
    if (r > 0) {
        st = ns_fail(err, NS_ERR_IO, "%s: read at %" PRId64 ": %s", path, off, strerror(r));
        goto cleanup;
    }
    bool ok = r == 0 && header_ok(s, hdr, hash, parent);
    if (ok) {
        XXH3_state_t *xs = XXH3_createState();
        if (!xs) {
            st = ns_fail(err, NS_ERR_NOMEM, "kv_ssd: out of memory");
            goto cleanup;
        }
        XXH3_64bits_reset(xs);
        XXH3_64bits_update(xs, hdr, sizeof hdr);
        XXH3_64bits_update(xs, tok, s->tok_bytes);
        XXH3_64bits_update(xs, data, s->page_bytes);
        ok = XXH3_64bits_digest(xs) == get_le64(sum);
        XXH3_freeState(xs);
    }
    if (!ok) {
        drop_corrupt(s, hash, seq);
        st = ns_fail(err, NS_ERR_FORMAT, "%s: record at %" PRId64 " (page %016" PRIx64 ") failed verification; dropped",
                     path, off, hash);
        goto cleanup;
    }
    pthread_mutex_lock(&s->mu);
    s->st.reads++;
    s->st.read_bytes += (int64_t)s->rec_len;
    pthread_mutex_unlock(&s->mu);

cleanup:
    if (fd >= 0) close(fd);
    if (tok != tokens) free(tok);
    return st;
}

typedef struct enum_rec {
    uint64_t hash, parent, seq;
    uint32_t seg;
    int64_t off;
} enum_rec;

static int enum_cmp(const void *a, const void *b) {
    uint64_t x = ((const enum_rec *)a)->seq, y = ((const enum_rec *)b)->seq;
    return x < y ? -1 : x > y;
}

int64_t ns_kv_ssd_enumerate(ns_kv_ssd *s, ns_kv_ssd_visit_fn fn, void *ctx) {
    if (!s || !fn) return 0;
    /* Snapshot the durable records (owned here), then read each one's
     * header and tokens without mu. */
    pthread_mutex_lock(&s->mu);
    size_t n = (size_t)s->st.records, k = 0;
    enum_rec *recs = malloc((n ? n : 1) * sizeof *recs);
    for (entry *e = s->lru_head; recs && e && k < n; e = e->lru_next)
        recs[k++] = (enum_rec){e->hash, e->parent, e->seq, e->seg, e->off};
    pthread_mutex_unlock(&s->mu);
    int32_t *tok = malloc(s->tok_bytes);
    int64_t visited = 0;
    if (!recs || !tok) {
        NS_WARN("kv_ssd: %s: out of memory enumerating records", s->dir);
        goto cleanup;
    }
    qsort(recs, k, sizeof *recs, enum_cmp);
    int fd = -1;
    uint32_t fd_seg = 0;
    for (size_t i = 0; i < k; i++) {
        if (fd < 0 || fd_seg != recs[i].seg) {
            if (fd >= 0) close(fd);
            char path[4096];
            seg_path(s, recs[i].seg, path, sizeof path);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            fd_seg = recs[i].seg;
            if (fd < 0) continue; /* evicted meanwhile; a truly missing file fails at get */
        }
        unsigned char hdr[REC_HDR];
        struct iovec iov[2] = {{hdr, sizeof hdr}, {tok, s->tok_bytes}};
        int r = preadv_all(fd, iov, 2, recs[i].off);
        if (r > 0) continue; /* I/O error: not known bad, get will tell */
        if (r < 0 || !header_ok(s, hdr, recs[i].hash, recs[i].parent)) {
            drop_corrupt(s, recs[i].hash, recs[i].seq);
            continue;
        }
        fn(ctx, recs[i].hash, recs[i].parent, tok);
        visited++;
    }
    if (fd >= 0) close(fd);
cleanup:
    free(recs);
    free(tok);
    return visited;
}

ns_status ns_kv_ssd_flush(ns_kv_ssd *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err) {
    if (!s) return ns_fail(err, NS_ERR_INVALID, "kv_ssd: flush without a store");
    struct timespec dl = ns_clock_deadline(CLOCK_MONOTONIC, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->last_ticket;
    while (s->done_ticket < target) {
        if (timeout_ms < 0) pthread_cond_wait(&s->cv_done, &s->mu);
        else if (timeout_ms == 0 || pthread_cond_timedwait(&s->cv_done, &s->mu, &dl) == ETIMEDOUT) break;
    }
    /* Tickets go to queued pages only and complete in order, so this is the
     * number of pages queued before the call that are still in flight. */
    int64_t pending = s->done_ticket < target ? (int64_t)(target - s->done_ticket) : 0;
    if (out) *out = (ns_kv_ssd_flush_result){s->st.records, pending, s->st.failed};
    pthread_mutex_unlock(&s->mu);
    if (pending)
        return ns_fail(err, NS_ERR_CANCELLED, "%s: flush timed out after %d ms with %" PRId64 " pages pending", s->dir,
                       timeout_ms, pending);
    return NS_OK;
}

void ns_kv_ssd_get_stats(ns_kv_ssd *s, ns_kv_ssd_stats *out) {
    if (!s || !out) return;
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queue_depth = s->n_pending;
    pthread_mutex_unlock(&s->mu);
}
