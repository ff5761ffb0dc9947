/* KV cache tests on the CPU backend with a tiny page geometry and random
 * (never zero) page bytes: leaf-first eviction keeps the longest prefix,
 * demotion to the RAM tier and promotion back are bit-exact, partial
 * continuations, and the SSD tier across a close/reopen (also with more
 * pages to write at shutdown than the write-behind queue holds). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/kv_cache.h"
#include "util/log.h"
#include "test.h"

#define P 4

static ns_backend *make_backend(int32_t n_pages) {
    ns_backend *be = NULL;
    ns_error err = {0};
    if (ns_backend_cpu_create(1, &be, &err) != NS_OK) return NULL;
    ns_kv_layout l = {.n_pages = n_pages, .page_tokens = P, .n_layers = 2, .n_kv_heads = 1, .head_dim = 8,
                      .dtype = NS_DT_F32};
    l.page_size_bytes = (size_t)P * 2 * 2 * 1 * 8 * sizeof(float);
    if (be->ops->kv_alloc(be, &l, &err) != NS_OK) {
        printf("# %s\n", err.msg);
        be->ops->destroy(be);
        return NULL;
    }
    return be;
}

static void free_backend(ns_backend *be) {
    if (!be) return;
    be->ops->kv_free(be);
    be->ops->destroy(be);
}

/* Page content derived from the chain position, never zero. */
static void fill_page(float *buf, size_t n_floats, uint32_t key) {
    uint32_t x = key * 2654435761u + 1;
    for (size_t i = 0; i < n_floats; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = 0.5f + (float)(x >> 9) / (float)(1u << 23);
    }
}

/* A "sequence" of n_pages full pages of tokens base+i, computed (written)
 * into fresh pages and committed; then released. */
static void run_sequence(ns_kv_cache *kc, ns_backend *be, int32_t first_token, int32_t n_pages, int32_t *pages) {
    const size_t nf = be->kv.page_size_bytes / sizeof(float);
    float *buf = malloc(be->kv.page_size_bytes);
    uint64_t h = ns_kv_cache_seed(kc);
    for (int32_t i = 0; i < n_pages; i++) {
        int32_t toks[P];
        for (int k = 0; k < P; k++) toks[k] = first_token + i * P + k;
        pages[i] = ns_kv_cache_alloc(kc);
        fill_page(buf, nf, (uint32_t)(first_token + i));
        be->ops->kv_page_write(be, pages[i], buf, NULL);
        uint64_t hn = ns_prefix_hash(h, toks, P);
        ns_kv_cache_commit(kc, h, hn, toks, pages[i]);
        h = hn;
    }
    free(buf);
}

static void make_tokens(int32_t *out, int32_t first_token, int32_t n) {
    for (int32_t i = 0; i < n; i++) out[i] = first_token + i;
}

/* Every acquired page holds exactly the bytes that were computed for it. */
static int check_bytes(ns_backend *be, const int32_t *pages, int32_t n, int32_t first_token) {
    const size_t nf = be->kv.page_size_bytes / sizeof(float);
    float *want = malloc(be->kv.page_size_bytes), *got = malloc(be->kv.page_size_bytes);
    int bad = 0;
    for (int32_t i = 0; i < n; i++) {
        fill_page(want, nf, (uint32_t)(first_token + i));
        be->ops->kv_page_read(be, pages[i], got, NULL);
        bad += memcmp(want, got, be->kv.page_size_bytes) != 0;
    }
    free(want);
    free(got);
    return bad;
}

TEST(evicting_part_of_a_chain_keeps_the_longest_prefix) {
    ns_backend *be = make_backend(24);
    ns_kv_cache *kc = NULL;
    ns_error err = {0};
    ns_kv_cache_opts o = {.be = be, .seed = 42};
    CHECK(be && ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) return;
    int32_t pages[24], other[5];
    run_sequence(kc, be, 1000, 21, pages);
    ns_kv_cache_release(kc, pages, 21, 0, NULL, 0);
    /* take every free page and two more: two cached pages are evicted */
    for (int i = 0; i < 5; i++) other[i] = ns_kv_cache_alloc(kc);
    CHECK(other[4] >= 0);
    int32_t toks[21 * P];
    make_tokens(toks, 1000, 21 * P);
    ns_kv_lookup lk;
    ns_kv_cache_lookup(kc, toks, 21 * P, 21 * P, &lk);
    CHECK_EQ_INT(lk.m.n_full, 19); /* the two leaves went, the 19-page prefix stays */
    CHECK_EQ_INT(lk.n_by_tier[NS_TIER_DEVICE], 19);
    ns_kv_cache_check(kc);
    ns_kv_cache_free(kc);
    free_backend(be);
}

TEST(ram_tier_demotes_and_promotes_exactly) {
    ns_backend *be = make_backend(8);
    ns_kv_cache *kc = NULL;
    ns_error err = {0};
    ns_kv_cache_opts o = {.be = be, .seed = 7, .ram_bytes = (int64_t)be->kv.page_size_bytes * 32};
    CHECK(be && ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) return;
    int32_t pa[8], pb[8];
    run_sequence(kc, be, 100, 6, pa); /* session A: 6 pages */
    ns_kv_cache_release(kc, pa, 6, 0, NULL, 0);
    run_sequence(kc, be, 5000, 8, pb); /* session B churns the whole pool */
    ns_kv_cache_release(kc, pb, 8, 0, NULL, 0);
    int32_t toks[6 * P + 1];
    make_tokens(toks, 100, 6 * P + 1);
    ns_kv_lookup lk;
    ns_kv_cache_lookup(kc, toks, 6 * P + 1, 6 * P, &lk);
    CHECK_EQ_INT(lk.m.n_full, 6);
    CHECK_EQ_INT(lk.n_by_tier[NS_TIER_RAM], 6);
    int32_t got_pages[8], by_tier[NS_TIER_COUNT];
    int32_t got = ns_kv_cache_acquire(kc, &lk, 6, got_pages, by_tier, NULL);
    CHECK_EQ_INT(got, 6);
    CHECK_EQ_INT(by_tier[NS_TIER_RAM], 6);
    CHECK_EQ_INT(check_bytes(be, got_pages, got, 100), 0);
    ns_kv_cache_check(kc);
    ns_kv_cache_stats st;
    ns_kv_cache_get_stats(kc, &st);
    CHECK(st.demotions >= 6);
    CHECK_EQ_INT(st.promotions[NS_TIER_RAM], 6);
    ns_kv_cache_release(kc, got_pages, got, 0, NULL, 0);
    /* B's pages were demoted too, leaf first: its head is still reachable */
    int32_t tb[8 * P];
    make_tokens(tb, 5000, 8 * P);
    ns_kv_cache_lookup(kc, tb, 8 * P, 8 * P, &lk);
    CHECK(lk.m.n_full >= 2);
    ns_kv_cache_check(kc);
    ns_kv_cache_free(kc);
    free_backend(be);
}

TEST(partial_page_is_copied_on_write) {
    ns_backend *be = make_backend(8);
    ns_kv_cache *kc = NULL;
    ns_error err = {0};
    ns_kv_cache_opts o = {.be = be, .seed = 9};
    CHECK(be && ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) return;
    int32_t pages[3];
    run_sequence(kc, be, 300, 2, pages);
    pages[2] = ns_kv_cache_alloc(kc);
    int32_t tail[P] = {308, 309, 310, 0};
    uint64_t h = ns_kv_cache_seed(kc);
    int32_t t0[P] = {300, 301, 302, 303}, t1[P] = {304, 305, 306, 307};
    h = ns_prefix_hash(ns_prefix_hash(h, t0, P), t1, P);
    ns_kv_cache_release(kc, pages, 3, h, tail, 3);
    int32_t toks[12] = {300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 999, 1000};
    ns_kv_lookup lk;
    ns_kv_cache_lookup(kc, toks, 12, 11, &lk);
    CHECK_EQ_INT(lk.m.n_full, 2);
    CHECK_EQ_INT(lk.m.n_partial, 2); /* 308, 309 match; 999 diverges from 310 */
    CHECK_EQ_INT(lk.m.diverge_at, 10);
    int32_t dst = ns_kv_cache_copy_partial(kc, lk.m.partial_node, lk.m.n_partial);
    CHECK(dst >= 0 && dst != pages[2]);
    ns_kv_cache_release(kc, &dst, 1, 0, NULL, 0);
    ns_kv_cache_check(kc);
    ns_kv_cache_free(kc);
    free_backend(be);
}

TEST(ssd_tier_survives_reopen) {
    char dir[] = "/tmp/ns_kvcache_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ns_backend *be = make_backend(8);
    ns_error err = {0};
    ns_kv_cache *kc = NULL;
    ns_kv_cache_opts o = {.be = be, .seed = 77, .ssd_dir = dir, .ssd_bytes = 1 << 20};
    CHECK(be && ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) return;
    int32_t pages[6];
    run_sequence(kc, be, 700, 6, pages);
    ns_kv_cache_release(kc, pages, 6, 0, NULL, 0);
    CHECK_EQ_INT(ns_kv_cache_persist(kc, INT32_MAX), 0);
    ns_kv_ssd_flush_result fr;
    CHECK(ns_kv_cache_ssd_flush(kc, 10000, &fr, &err) == NS_OK);
    CHECK(fr.durable >= 6);
    ns_kv_cache_free(kc);
    /* a fresh cache over a fresh pool: everything comes from SSD */
    kc = NULL;
    CHECK(ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) return;
    int32_t toks[6 * P + 1];
    make_tokens(toks, 700, 6 * P + 1);
    ns_kv_lookup lk;
    ns_kv_cache_lookup(kc, toks, 6 * P + 1, 6 * P, &lk);
    CHECK_EQ_INT(lk.n_by_tier[NS_TIER_SSD], 6);
    int32_t got_pages[6], by_tier[NS_TIER_COUNT];
    int32_t got = ns_kv_cache_acquire(kc, &lk, 6, got_pages, by_tier, NULL);
    CHECK_EQ_INT(got, 6);
    CHECK_EQ_INT(by_tier[NS_TIER_SSD], 6);
    CHECK_EQ_INT(check_bytes(be, got_pages, got, 700), 0);
    ns_kv_cache_release(kc, got_pages, got, 0, NULL, 0);
    ns_kv_cache_check(kc);
    ns_kv_cache_free(kc);
    /* another model (seed) over the same directory sees nothing */
    o.seed = 78;
    kc = NULL;
    CHECK(ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (kc) {
        ns_kv_cache_lookup(kc, toks, 6 * P + 1, 6 * P, &lk);
        CHECK_EQ_INT(lk.m.n_full, 0);
        ns_kv_cache_free(kc);
    }
    free_backend(be);
    CHECK(test_rmtree(dir) == 0);
}

/* A graceful shutdown makes every committed page durable, however many:
 * ns_kv_cache_free once made one persist pass, which stops at the
 * write-behind queue's bound, and the rest of a long prompt was lost on
 * every restart (the queue is 256 MiB: 2k tokens of Llama-3-8B). Here
 * the queue holds 16 pages and 150 are committed, none persisted yet. */
TEST(shutdown_persists_more_pages_than_the_queue_holds) {
    enum { N = 150 };
    char dir[] = "/tmp/ns_kvcache_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ns_backend *be = make_backend(N + 8);
    ns_error err = {0};
    ns_kv_cache *kc = NULL;
    ns_kv_cache_opts o = {.be = be, .seed = 91, .ssd_dir = dir, .ssd_bytes = 16 << 20, .ssd_queue_pages = 16};
    CHECK(be && ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (!kc) {
        free_backend(be);
        return;
    }
    static int32_t pages[N];
    run_sequence(kc, be, 5000, N, pages);
    ns_kv_cache_release(kc, pages, N, 0, NULL, 0);
    ns_kv_cache_stats st;
    ns_kv_cache_get_stats(kc, &st);
    CHECK_EQ_INT(st.ssd_pending, N); /* nothing handed to the SSD store yet */
    ns_kv_cache_free(kc);
    /* a fresh cache (the pool's pages all free): the whole chain comes from SSD */
    kc = NULL;
    CHECK(ns_kv_cache_create(&o, &kc, &err) == NS_OK);
    if (kc) {
        static int32_t toks[N * P + 1], got_pages[N];
        make_tokens(toks, 5000, N * P + 1);
        ns_kv_lookup lk;
        ns_kv_cache_lookup(kc, toks, N * P + 1, N * P, &lk);
        CHECK_EQ_INT(lk.n_by_tier[NS_TIER_SSD], N);
        int32_t by_tier[NS_TIER_COUNT];
        int32_t got = ns_kv_cache_acquire(kc, &lk, lk.m.n_full, got_pages, by_tier, NULL);
        CHECK_EQ_INT(got, N);
        CHECK_EQ_INT(check_bytes(be, got_pages, got, 5000), 0);
        ns_kv_cache_release(kc, got_pages, got, 0, NULL, 0);
        ns_kv_cache_free(kc);
    }
    free_backend(be);
    CHECK(test_rmtree(dir) == 0);
}

int main(void) {
    if (getenv("NS_LOG_LEVEL")) ns_log_set_level(ns_log_parse_level(getenv("NS_LOG_LEVEL")));
    RUN(evicting_part_of_a_chain_keeps_the_longest_prefix);
    RUN(ram_tier_demotes_and_promotes_exactly);
    RUN(partial_page_is_copied_on_write);
    RUN(ssd_tier_survives_reopen);
    RUN(shutdown_persists_more_pages_than_the_queue_holds);
    TEST_MAIN_END;
}
