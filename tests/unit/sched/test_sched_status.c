/* test_sched_status.c — the status snapshot behind GET /v1/status
 * (sched_status.h): what a published snapshot says about each sequence,
 * the publication rate limit, the cache-break ring and the per-second
 * step buckets. The sequences are built by hand (sched_internal.h), as
 * the engine thread holds them. */
#include <string.h>

#include "sched/sched_internal.h"
#include "sched/sched_status.h"
#include "test.h"
#include "util/clock.h"

static ns_request *req(int32_t n_prompt, const char *label) {
    int32_t prompt[64] = {0};
    ns_request_params p = {.max_tokens = 32};
    p.sampling = ns_sampling_default();
    ns_request *r = ns_request_new(prompt, n_prompt, &p);
    if (r && label) ns_request_set_label(r, label);
    return r;
}

static ns_kv_cache_stats kv_stats(void) {
    ns_kv_cache_stats k;
    memset(&k, 0, sizeof k);
    k.page_tokens = 16;
    k.page_bytes = 4096;
    k.pool_held = 5;
    k.pages[NS_TIER_DEVICE] = 7;
    k.pages[NS_TIER_RAM] = 3;
    k.capacity[NS_TIER_RAM] = 100;
    k.capacity[NS_TIER_SSD] = 12; /* the record count: not a capacity */
    k.pages[NS_TIER_SSD] = 12;
    k.ssd_on = true;
    return k;
}

TEST(snapshot_describes_each_sequence) {
    ns_sched_status *st = ns_sched_status_new();
    ns_seq a, b, c;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&c, 0, sizeof c);
    a.req = req(40, "chatcmpl-a");
    a.state = RS_PREFILLING;
    a.n_tokens = 40, a.n_ctx = 16;
    const double now = ns_clock_now();
    a.t_submit = now - 2;
    b.req = req(10, "cmpl-b");
    b.state = RS_DECODING;
    b.n_tokens = 15, b.n_ctx = 14, b.n_generated = 5;
    b.t_submit = now - 3, b.t_first = now - 2, b.t_last = now - 1; /* 4 tokens in 1 s */
    b.req->result.n_cached = 8;
    b.req->result.n_cached_by_tier[NS_TIER_RAM] = 8;
    c.req = req(20, NULL);
    c.state = RS_PAUSED;
    c.admit_order = 9, c.n_pauses = 2;
    ns_seq *running[] = {&a, &b}, *waiting[] = {&c};
    ns_kv_cache_stats k = kv_stats();
    ns_sched_status_publish(st, true, running, 2, waiting, 1, 3, &k, 64, 1 << 20);
    static ns_status_snapshot s;
    ns_sched_status_get(st, &s);
    CHECK_EQ_INT(s.n_requests, 6); /* 2 running + 1 waiting + 3 incoming */
    CHECK_EQ_INT(s.n_listed, 3);
    CHECK_EQ_INT(s.n_incoming, 3);
    CHECK_EQ_STR(s.reqs[0].id, "chatcmpl-a");
    CHECK(s.reqs[0].state == NS_STATUS_PREFILLING);
    CHECK_EQ_INT(s.reqs[0].prefill_done, 16);
    CHECK_EQ_INT(s.reqs[0].prefill_total, 40);
    CHECK(s.reqs[0].ttft_s < 0);
    CHECK(s.reqs[1].state == NS_STATUS_DECODING);
    CHECK_NEAR(s.reqs[1].decode_tps, 4.0, 1e-6);
    CHECK_NEAR(s.reqs[1].ttft_s, 1.0, 1e-6);
    CHECK_EQ_INT(s.reqs[1].cached_by_tier[NS_TIER_RAM], 8);
    CHECK_EQ_STR(s.reqs[2].id, "request 9");
    CHECK(s.reqs[2].state == NS_STATUS_PAUSED);
    CHECK_EQ_INT(s.reqs[2].queue_pos, 1);
    CHECK_EQ_INT(s.reqs[2].n_pauses, 2);
    CHECK_EQ_INT(s.reqs[2].prefill_total, 20); /* no tokens yet: the prompt */
    CHECK_EQ_STR(ns_status_state_name(s.reqs[2].state), "paused");
    /* tiers: device pool, RAM pages/capacity, SSD capacity from bytes */
    CHECK_EQ_INT(s.tiers[NS_TIER_DEVICE].used_pages, 5);
    CHECK_EQ_INT(s.tiers[NS_TIER_DEVICE].cached_pages, 7);
    CHECK_EQ_INT(s.tiers[NS_TIER_DEVICE].capacity_pages, 64);
    CHECK(s.tiers[NS_TIER_RAM].enabled);
    CHECK_EQ_INT(s.tiers[NS_TIER_RAM].capacity_pages, 100);
    CHECK_EQ_INT(s.tiers[NS_TIER_SSD].capacity_pages, (1 << 20) / (4096 + 16 * 4 + 64));
    ns_request_release(a.req), ns_request_release(b.req), ns_request_release(c.req);
    ns_sched_status_free(st);
}

/* A publication within 100 ms of the last is skipped unless forced: the
 * engine calls publish every loop, readers see at most 10 copies a second. */
TEST(publications_are_rate_limited) {
    ns_sched_status *st = ns_sched_status_new();
    ns_kv_cache_stats k = kv_stats();
    static ns_status_snapshot s;
    ns_sched_status_publish(st, false, NULL, 0, NULL, 0, 0, &k, 64, 0);
    ns_sched_status_get(st, &s);
    const uint64_t first = s.seq;
    CHECK_EQ_INT(first, 1);
    ns_sched_status_publish(st, false, NULL, 0, NULL, 0, 5, &k, 64, 0);
    ns_sched_status_get(st, &s);
    CHECK_EQ_INT(s.seq, first);        /* skipped */
    CHECK_EQ_INT(s.n_incoming, 0);
    ns_sched_status_publish(st, true, NULL, 0, NULL, 0, 5, &k, 64, 0);
    ns_sched_status_get(st, &s);
    CHECK_EQ_INT(s.seq, first + 1);    /* forced */
    CHECK_EQ_INT(s.n_incoming, 5);
    ns_sched_status_free(st);
}

/* The last NS_STATUS_BREAKS breaks, newest first; the total keeps counting. */
TEST(break_ring_keeps_the_newest) {
    ns_sched_status *st = ns_sched_status_new();
    for (int i = 0; i < NS_STATUS_BREAKS + 5; i++) {
        ns_status_break b = {.n_prompt = 100 + i, .diverge_at = i, .n_cached = i / 16 * 16};
        snprintf(b.id, sizeof b.id, "r%d", i);
        ns_sched_status_break(st, &b);
    }
    ns_kv_cache_stats k = kv_stats();
    ns_sched_status_publish(st, true, NULL, 0, NULL, 0, 0, &k, 64, 0);
    static ns_status_snapshot s;
    ns_sched_status_get(st, &s);
    CHECK_EQ_INT(s.breaks_total, NS_STATUS_BREAKS + 5);
    CHECK_EQ_INT(s.n_breaks, NS_STATUS_BREAKS);
    CHECK_EQ_INT(s.breaks[0].diverge_at, NS_STATUS_BREAKS + 4);
    CHECK_EQ_STR(s.breaks[0].id, "r36");
    CHECK_EQ_INT(s.breaks[NS_STATUS_BREAKS - 1].diverge_at, 5);
    CHECK(s.breaks[0].unix_time > 1.7e9);
    ns_sched_status_free(st);
}

/* Steps of one second land in one bucket: count, mean and max. */
TEST(step_buckets_aggregate_per_second) {
    ns_sched_status *st = ns_sched_status_new();
    /* stay inside one wall-clock second (retry once if it turned over) */
    static ns_status_snapshot s;
    for (int attempt = 0; attempt < 2; attempt++) {
        ns_sched_status_free(st);
        st = ns_sched_status_new();
        ns_sched_status_step(st, 0.010, 16, 1);
        ns_sched_status_step(st, 0.030, 48, 3);
        ns_kv_cache_stats k = kv_stats();
        ns_sched_status_publish(st, true, NULL, 0, NULL, 0, 0, &k, 64, 0);
        ns_sched_status_get(st, &s);
        if (s.n_seconds == 1) break;
    }
    CHECK_EQ_INT(s.n_seconds, 1);
    CHECK_EQ_INT(s.seconds[0].steps, 2);
    CHECK_NEAR(s.seconds[0].sum_step_s, 0.040, 1e-12);
    CHECK_NEAR(s.seconds[0].max_step_s, 0.030, 1e-12);
    CHECK_EQ_INT(s.seconds[0].sum_batch_tokens, 64);
    CHECK_EQ_INT(s.seconds[0].max_batch_tokens, 48);
    CHECK_EQ_INT(s.seconds[0].max_seqs, 3);
    ns_sched_status_free(st);
}

int main(void) {
    RUN(snapshot_describes_each_sequence);
    RUN(publications_are_rate_limited);
    RUN(break_ring_keeps_the_newest);
    RUN(step_buckets_aggregate_per_second);
    TEST_MAIN_END;
}
