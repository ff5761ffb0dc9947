/* bench_kv_ssd — throughput of the SSD KV tier (src/kv/kv_ssd.h) on the
 * disk that holds DIR.
 *
 * usage: build/bench/bench_kv_ssd [DIR] [N]     (defaults: /tmp, 256)
 * In a fresh directory under DIR, with records of 2 MiB pages:
 *  1. write: N puts then one flush; MB/s including every fdatasync and
 *     index commit (the store's own write path, group-committed);
 *  2. cold read: the segments are dropped from the page cache
 *     (POSIX_FADV_DONTNEED), the store reopened, and all N pages read and
 *     verified (checksum) one after another;
 *  3. warm read: the same again, now from the page cache.
 * The directory is removed at the end. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kv/kv_ssd.h"
#include "util/clock.h"

#define PAGE_TOKENS 16
#define PAGE_BYTES ((size_t)2 << 20)

/* Drops every segment of dir from the page cache; with remove, deletes all
 * files of dir and dir itself. */
static void sweep(const char *dir, int remove) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (remove) {
            unlink(p);
            continue;
        }
        int fd = open(p, O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
    if (remove) rmdir(dir);
}

static uint64_t page_hash(int i) { return 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1); }

/* Reads all n pages; returns seconds, or -1 on a failed read. */
static double read_all(ns_kv_ssd *s, int n, unsigned char *buf, int32_t *tok) {
    double t0 = ns_clock_now();
    for (int i = 0; i < n; i++) {
        ns_error err = {0};
        if (ns_kv_ssd_get(s, page_hash(i), tok, buf, &err) != NS_OK) {
            fprintf(stderr, "bench_kv_ssd: get %d: %s\n", i, err.msg);
            return -1;
        }
    }
    return ns_clock_now() - t0;
}

int main(int argc, char **argv) {
    const char *parent = argc > 1 ? argv[1] : "/tmp";
    int n = argc > 2 ? atoi(argv[2]) : 256;
    if (n <= 0) n = 256;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/nskv-bench-XXXXXX", parent);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ns_kv_ssd_opts o = {.dir = dir, .seed = 42, .page_tokens = PAGE_TOKENS, .page_bytes = PAGE_BYTES,
                        .cap_bytes = (int64_t)n * (int64_t)(PAGE_BYTES + 4096), .max_queue_pages = 64};
    const double rec_mb = (double)(48 + 4 * PAGE_TOKENS + PAGE_BYTES + 8) / 1e6;
    int rc = 1;
    ns_kv_ssd *s = NULL;
    ns_error err = {0};
    /* Four distinct random pages, each made unique per record by its first
     * 8 bytes: incompressible, and no two records alike. */
    unsigned char *src = malloc(4 * PAGE_BYTES), *buf = malloc(PAGE_BYTES);
    int32_t tok[PAGE_TOKENS];
    if (!src || !buf) goto cleanup;
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < 4 * PAGE_BYTES; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(src + i, &x, 8);
    }
    for (int i = 0; i < PAGE_TOKENS; i++) tok[i] = i;

    if (ns_kv_ssd_open(&o, &s, &err) != NS_OK) {
        fprintf(stderr, "bench_kv_ssd: %s\n", err.msg);
        goto cleanup;
    }
    double t0 = ns_clock_now();
    for (int i = 0; i < n; i++) {
        unsigned char *page = src + (size_t)(i % 4) * PAGE_BYTES;
        uint64_t h = page_hash(i);
        memcpy(page, &h, 8);
        ns_status st;
        while ((st = ns_kv_ssd_put(s, h, 0, tok, page)) == NS_ERR_FULL) usleep(200);
        if (st != NS_OK) {
            fprintf(stderr, "bench_kv_ssd: put %d: %s\n", i, ns_status_name(st));
            goto cleanup;
        }
    }
    ns_kv_ssd_flush_result fr;
    if (ns_kv_ssd_flush(s, -1, &fr, &err) != NS_OK || fr.durable != n) {
        fprintf(stderr, "bench_kv_ssd: flush: %lld durable of %d\n", (long long)fr.durable, n);
        goto cleanup;
    }
    double tw = ns_clock_now() - t0;
    ns_kv_ssd_stats st;
    ns_kv_ssd_get_stats(s, &st);
    printf("kv_ssd bench: %d records of %.2f MB in %s\n", n, rec_mb, parent);
    printf("  write (put+flush, incl. fdatasync + index commit): %8.1f MB/s  (%.2f s, %" PRIu64
           " fdatasyncs, mean %.2f ms)\n",
           n * rec_mb / tw, tw, st.fsync_count, st.fsync_count ? 1e3 * st.fsync_sum / (double)st.fsync_count : 0.0);
    ns_kv_ssd_close(s);
    s = NULL;

    sweep(dir, 0);
    double t1 = ns_clock_now();
    if (ns_kv_ssd_open(&o, &s, &err) != NS_OK) {
        fprintf(stderr, "bench_kv_ssd: reopen: %s\n", err.msg);
        goto cleanup;
    }
    double topen = ns_clock_now() - t1;
    double tc = read_all(s, n, buf, tok);
    if (tc < 0) goto cleanup;
    double th = read_all(s, n, buf, tok);
    if (th < 0) goto cleanup;
    printf("  read cold (page cache dropped, verified):          %8.1f MB/s  (%.2f s; reopen %.1f ms)\n",
           n * rec_mb / tc, tc, 1e3 * topen);
    printf("  read warm (page cache, verified):                  %8.1f MB/s  (%.2f s)\n", n * rec_mb / th, th);
    rc = 0;

cleanup:
    ns_kv_ssd_close(s);
    sweep(dir, 1);
    free(src);
    free(buf);
    return rc;
}
