/* kv_ssd.h — the durable SSD tier of the KV cache: page records in
 * append-only segment files, indexed by SQLite (WAL mode).
 *
 * A record is one full KV page of one model/format: a fixed header (magic,
 * format version, the chain seed that names model + KV format + page size,
 * the page's chained hash and its parent hash, token count, data length),
 * the page's tokens, the page bytes, and an XXH3-64 checksum over all of
 * it. Records are written behind: ns_kv_ssd_put copies the page into a
 * bounded queue and returns; a writer thread appends queued records to the
 * current segment, fsyncs the segment, and only then commits their index
 * rows in one SQLite transaction. So an index row never points at bytes
 * that are not on disk, and a kill -9 at any moment leaves, at worst,
 * unindexed tail bytes in a segment (ignored) — never a corrupt hit.
 *
 * Invariants
 * - Only records whose seed equals the store's seed are ever returned;
 *   others are skipped and counted at open (n_foreign) and never served.
 * - A record is verified (checksum, header fields, tokens) on every read;
 *   a failing record is counted (checksum_failures), its row deleted, and
 *   the read fails: corrupt bytes are never served.
 * - Size cap: when live bytes exceed cap_bytes the least recently used
 *   records (by last put/get) are dropped from the index; a segment with
 *   no live record left (and not the one being written) is unlinked. The
 *   cap counts this seed's records; other seeds' records are kept as they
 *   are (a later open with their seed serves them again).
 * - An I/O error or a full disk (ENOSPC, EFBIG, EDQUOT) degrades the tier:
 *   logged once at WARN, `degraded` set in the stats, further puts are
 *   dropped (counted), reads of already-durable records keep working.
 *   Nothing is fatal to the server. A write past RLIMIT_FSIZE raises
 *   SIGXFSZ, which kills by default: the program (main) must ignore
 *   SIGXFSZ so that it becomes EFBIG; the library does not touch signal
 *   dispositions.
 * - One store per directory at a time (an flock on dir/lock).
 *
 * Threads: put/get/contains/flush/stats may be called from any thread (one
 * mutex inside); the engine thread calls put and get, HTTP threads call
 * flush and stats. The writer thread is owned by the store.
 *
 * Ownership: ns_kv_ssd_open returns a store the caller frees with
 * ns_kv_ssd_close (which drains the queue first). put copies its inputs;
 * get writes into caller buffers.
 */
#ifndef NS_KV_SSD_H
#define NS_KV_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

typedef struct ns_kv_ssd ns_kv_ssd;

typedef struct ns_kv_ssd_opts {
    const char *dir;          /* created if missing (mode 0700) */
    uint64_t seed;            /* chain seed: model fingerprint + KV format + page size */
    int32_t page_tokens;      /* tokens per page */
    size_t page_bytes;        /* KV bytes per page */
    int64_t cap_bytes;        /* LRU size cap for live records (> 0) */
    int32_t max_queue_pages;  /* write-behind queue bound (0 = 256) */
} ns_kv_ssd_opts;

/* Opens (or creates) the store in opts->dir. A directory that cannot be
 * created or an index that cannot be opened is an error (the caller then
 * runs without the tier): NS_ERR_INVALID for bad opts, NS_ERR_IO for the
 * directory/index (also: the directory is held by another open store),
 * NS_ERR_UNSUPPORTED for an index of another schema version. Corrupt or
 * foreign records are not errors. */
ns_status ns_kv_ssd_open(const ns_kv_ssd_opts *opts, ns_kv_ssd **out, ns_error *err);
/* Drains the write-behind queue (durably), stops the writer, frees. */
void ns_kv_ssd_close(ns_kv_ssd *s);

/* Called once per live (durable) record of this seed, parents before
 * children is NOT guaranteed (order of insertion is). tokens has
 * page_tokens entries and is valid only during the call. Used at startup
 * so the prefix index learns every page the SSD holds. Reads each record's
 * header and tokens (not the page bytes: get verifies those); a record
 * whose header is wrong is dropped like a failed get and not visited.
 * Returns the number of records visited. */
typedef void (*ns_kv_ssd_visit_fn)(void *ctx, uint64_t hash, uint64_t parent, const int32_t *tokens);
int64_t ns_kv_ssd_enumerate(ns_kv_ssd *s, ns_kv_ssd_visit_fn fn, void *ctx);

/* Queues a page for writing (copies tokens and data). Returns NS_OK when
 * queued or already stored; NS_ERR_FULL when the queue is full (the page
 * is simply not written: counted in dropped); NS_ERR_IO when degraded;
 * NS_ERR_NOMEM when the copy cannot be allocated (also counted). */
ns_status ns_kv_ssd_put(ns_kv_ssd *s, uint64_t hash, uint64_t parent, const int32_t *tokens, const void *data);
/* True if the record is queued or durable. */
bool ns_kv_ssd_contains(ns_kv_ssd *s, uint64_t hash);
/* Reads and verifies a record into data (page_bytes) and, if tokens is
 * non-NULL, its tokens (page_tokens). Served from the queue if not yet
 * written. NS_ERR_RANGE: not present; NS_ERR_FORMAT: failed verification
 * (now dropped); NS_ERR_IO: read error. On failure the contents of data
 * and tokens are unspecified. */
ns_status ns_kv_ssd_get(ns_kv_ssd *s, uint64_t hash, int32_t *tokens, void *data, ns_error *err);

/* Blocks until every page queued before the call is durable (data fsynced
 * and index row committed) or has failed. Counts are over the store's
 * lifetime at return: durable = records durable now (live), pending =
 * pages queued before the call still in flight (0 unless timeout),
 * failed = puts that failed to write. timeout_ms < 0 waits without limit,
 * 0 only polls. On timeout returns NS_ERR_CANCELLED, *out filled. */
typedef struct ns_kv_ssd_flush_result {
    int64_t durable, pending, failed;
} ns_kv_ssd_flush_result;
ns_status ns_kv_ssd_flush(ns_kv_ssd *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err);

#define NS_KV_SSD_FSYNC_BUCKETS 12
typedef struct ns_kv_ssd_stats {
    int64_t records, bytes;            /* live records of this seed and their bytes on disk */
    int64_t n_foreign;                 /* records of other seeds seen at open (never served) */
    int64_t queue_depth;               /* pages queued or being written (not yet durable) */
    int64_t writes, bytes_written;     /* records written since open */
    int64_t reads, read_bytes;         /* records served since open (from disk or the
                                          queue); bytes read from disk */
    int64_t dropped;                   /* puts refused: queue full, degraded or no memory */
    int64_t failed;                    /* writes that failed (I/O) */
    int64_t checksum_failures;         /* reads (or open checks: row names a missing or
                                          short segment) that failed verification */
    int64_t evicted;                   /* records dropped by the size cap */
    bool degraded;                     /* an I/O error / full disk stopped writes */
    /* fsync latency histogram (seconds) of segment fdatasyncs: upper bounds
     * 0.5 ms doubling, last = +Inf; counts per bucket (not cumulative) */
    double fsync_bounds[NS_KV_SSD_FSYNC_BUCKETS];
    uint64_t fsync_counts[NS_KV_SSD_FSYNC_BUCKETS];
    double fsync_sum;
    uint64_t fsync_count;
} ns_kv_ssd_stats;
void ns_kv_ssd_get_stats(ns_kv_ssd *s, ns_kv_ssd_stats *out);

#endif
