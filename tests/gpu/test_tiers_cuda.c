/* test_tiers_cuda.c — the KV cache tiers and pausing on the CUDA backend
 * through the scheduler (tiny-qwen3, bf16 KV): a session pushed out of a
 * small pool comes back from the pinned RAM tier (asynchronous copies on
 * the copy stream) token-identical to its cold run; three long requests in
 * a pool for 1.5 of them, with forced pauses, give the tokens each gives
 * alone. */
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "test.h"

#define P 16

static ns_backend *gpu;
static ns_model *model;

static ns_engine *make_engine(int32_t n_pages) {
    ns_engine_opts eo = {.max_batch_tokens = 256, .max_logits = 4, .page_tokens = P, .n_pages = n_pages,
                         .kv_dtype = NS_DT_BF16};
    ns_engine *e = NULL;
    ns_error err = {0};
    if (ns_engine_create(model, &eo, &e, &err) != NS_OK) printf("# %s\n", err.msg);
    return e;
}

static ns_sched *make_sched(ns_engine *e, int64_t ram) {
    ns_sched_opts so = {.max_batch_tokens = 256, .max_running = 4, .prefill_chunk = 64, .ram_cache_bytes = ram};
    ns_sched *s = NULL;
    ns_error err = {0};
    if (ns_sched_create(e, &so, &s, &err) != NS_OK || ns_sched_start(s, &err) != NS_OK) printf("# %s\n", err.msg);
    return s;
}

static void make_prompt(int32_t *p, int32_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 100 + (int32_t)((x >> 8) % 20000);
    }
}

static ns_request *submit(ns_sched *s, const int32_t *p, int32_t n, int32_t gen, int32_t pause_every) {
    ns_request_params rp = {.sampling = ns_sampling_default(), .max_tokens = gen, .ignore_eos = true,
                            .test_pause_every = pause_every};
    ns_request *r = ns_request_new(p, n, &rp);
    ns_error err = {0};
    if (ns_sched_submit(s, r, NULL, &err) != NS_OK) printf("# submit: %s\n", err.msg);
    return r;
}

static int32_t collect(ns_request *r, int32_t *out, int32_t cap, ns_request_result *res) {
    int32_t n = 0;
    bool done = false;
    ns_token_event ev[8];
    while (!done) {
        int k = ns_request_poll(r, ev, 8, 20000, &done);
        for (int i = 0; i < k; i++)
            if (n < cap) out[n++] = ev[i].token;
        if (k == 0 && !done) break;
    }
    ns_request_result_get(r, res);
    ns_request_release(r);
    return n;
}

TEST(ram_tier_round_trip_is_exact) {
    ns_engine *e = make_engine(48); /* 768 tokens: A (600) and B (600) do not both fit */
    ns_sched *s = make_sched(e, 64 << 20);
    int32_t a[600], b[600], cold[16], warm[16], tmp[16];
    make_prompt(a, 600, 1);
    make_prompt(b, 600, 2);
    ns_request_result res;
    int32_t n_cold = collect(submit(s, a, 600, 16, 0), cold, 16, &res);
    collect(submit(s, b, 600, 16, 0), tmp, 16, &res);
    int32_t n_warm = collect(submit(s, a, 600, 16, 0), warm, 16, &res);
    CHECKF(res.n_cached_by_tier[NS_TIER_RAM] > 0, "not served from RAM: device %d ram %d",
           res.n_cached_by_tier[NS_TIER_DEVICE], res.n_cached_by_tier[NS_TIER_RAM]);
    CHECK(n_cold == 16 && n_warm == 16 && memcmp(cold, warm, sizeof cold) == 0);
    ns_sched_stats st;
    ns_sched_get_stats(s, &st);
    CHECK(st.kv.demotions > 0 && st.kv.promotions[NS_TIER_RAM] > 0);
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(pauses_on_the_gpu_are_exact) {
    enum { N = 3, LEN = 200, GEN = 120 };
    int32_t prompts[N][LEN], want[N][GEN], got[GEN];
    ns_request_result res;
    ns_engine *e = make_engine(256);
    ns_sched *s = make_sched(e, 0);
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], LEN, 10u + (uint32_t)i);
        CHECK(collect(submit(s, prompts[i], LEN, GEN, 0), want[i], GEN, &res) == GEN);
    }
    ns_sched_free(s);
    ns_engine_free(e);
    for (int tier = 0; tier < 2; tier++) {
        e = make_engine(30); /* 480 tokens: 1.5 x (200 + 120) */
        s = make_sched(e, tier ? (64 << 20) : 0);
        ns_request *rs[N];
        for (int i = 0; i < N; i++) rs[i] = submit(s, prompts[i], LEN, GEN, 9);
        for (int i = 0; i < N; i++) {
            int32_t n = collect(rs[i], got, GEN, &res);
            int32_t same = 0;
            while (same < n && got[same] == want[i][same]) same++;
            CHECKF(n == GEN && same == GEN && res.finish == NS_FINISH_LENGTH,
                   "tier %d request %d: %d tokens, first difference at %d", tier, i, n, same);
        }
        ns_sched_stats st;
        ns_sched_get_stats(s, &st);
        CHECK(st.pauses_total > 0 && st.resumes_total == st.pauses_total);
        ns_sched_free(s);
        ns_engine_free(e);
    }
}

int main(void) {
    ns_error err = {0};
    if (ns_backend_create("cuda", 0, &gpu, &err) != NS_OK ||
        ns_model_load(test_shared_path("models/tiny-qwen3"), gpu, &model, &err) != NS_OK) {
        printf("not ok - setup: %s\n", err.msg);
        return 1;
    }
    RUN(ram_tier_round_trip_is_exact);
    RUN(pauses_on_the_gpu_are_exact);
    ns_model_free(model);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END;
}
