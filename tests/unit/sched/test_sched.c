/* Scheduler tests on the CPU backend with tinystories-656k:
 * batching identity, prefix-cache identity and accounting, agent replay,
 * cancel mid-prefill, small-pool waiting and never-fits rejection. */
#include <pthread.h>
#include <unistd.h>

#include "engine/runner.h"
#include "sched/sched.h"
#include "test.h"

#define P 16

static ns_backend *g_be;
static ns_model *g_model;

static void setup(void) {
    ns_error err = {0};
    if (g_model) return;
    if (ns_backend_cpu_create(2, &g_be, &err) != NS_OK) return;
    if (ns_model_load(test_shared_path("models/tinystories-656k"), g_be, &g_model, &err) != NS_OK)
        printf("# %s\n", err.msg);
}

static ns_engine *make_engine(int32_t n_pages, int32_t max_batch, int32_t max_logits) {
    ns_error err = {0};
    ns_engine *e = NULL;
    ns_engine_opts eo = {.max_batch_tokens = max_batch, .max_logits = max_logits, .page_tokens = P, .n_pages = n_pages,
                         .kv_dtype = NS_DT_F32};
    if (ns_engine_create(g_model, &eo, &e, &err) != NS_OK) printf("# %s\n", err.msg);
    return e;
}

/* Deterministic prompt: shared prefix `base` tokens from seed 1, rest from `seed`. */
static void make_prompt(int32_t *out, int32_t n, int32_t shared, uint32_t seed) {
    uint32_t x = 12345;
    for (int32_t i = 0; i < n; i++) {
        if (i == shared) x = seed * 2654435761u;
        x = x * 1103515245u + 12345u;
        out[i] = 3 + (int32_t)((x >> 8) % 2000);
    }
}

static int32_t greedy_alone_eos(ns_engine *e, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out,
                                bool stop_at_eos);
static int32_t greedy_alone(ns_engine *e, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out) {
    return greedy_alone_eos(e, prompt, n, n_gen, out, true);
}
static int32_t greedy_alone_eos(ns_engine *e, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out,
                                bool stop_at_eos) {
    ns_runner r;
    ns_error err = {0};
    if (ns_runner_init(&r, e, &err) != NS_OK) return -1;
    int32_t got = 0;
    if (ns_runner_feed(&r, prompt, n, false, NULL, NULL, &err) != NS_OK) goto done;
    const int32_t V = e->model->cfg.vocab_size;
    while (got < n_gen) {
        int32_t tok = 0;
        for (int32_t v = 1; v < V; v++)
            if (r.logits[v] > r.logits[tok]) tok = v;
        out[got++] = tok;
        if (stop_at_eos && ns_config_is_eos(&e->model->cfg, tok)) break;
        if (got < n_gen && ns_runner_feed(&r, &tok, 1, false, NULL, NULL, &err) != NS_OK) break;
    }
done:
    ns_runner_free(&r);
    return got;
}

static ns_request *submit(ns_sched *s, const int32_t *prompt, int32_t n, int32_t max_tokens, ns_status *st) {
    ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = max_tokens};
    ns_request *r = ns_request_new(prompt, n, &p);
    ns_error err = {0};
    ns_capacity cap;
    *st = ns_sched_submit(s, r, &cap, &err);
    return r;
}

/* Drains r's events into out; returns the number of tokens. */
static int32_t collect(ns_request *r, int32_t *out, int32_t cap) {
    int32_t n = 0;
    bool done = false;
    ns_token_event ev[8];
    while (!done) {
        int k = ns_request_poll(r, ev, 8, 10000, &done);
        for (int i = 0; i < k; i++)
            if (n < cap) out[n++] = ev[i].token;
        if (k == 0 && !done) break; /* timeout: fail the caller's checks */
    }
    return n;
}

static ns_sched *make_sched_tiers(ns_engine *e, int32_t max_running, int64_t ram_bytes, const char *ssd_dir) {
    ns_sched_opts so = {.max_batch_tokens = e->opts.max_batch_tokens, .max_running = max_running, .prefill_chunk = 32,
                        .ram_cache_bytes = ram_bytes, .ssd_dir = ssd_dir, .ssd_bytes = 64 << 20};
    ns_sched *s = NULL;
    ns_error err = {0};
    if (ns_sched_create(e, &so, &s, &err) != NS_OK || ns_sched_start(s, &err) != NS_OK) printf("# %s\n", err.msg);
    return s;
}

static ns_sched *make_sched(ns_engine *e, int32_t max_running) { return make_sched_tiers(e, max_running, 0, NULL); }

/* Runs one greedy request to the end; returns its token count, fills res. */
static int32_t run_one(ns_sched *s, const int32_t *prompt, int32_t n, int32_t gen, int32_t *out, ns_request_result *res) {
    ns_status st;
    ns_request *r = submit(s, prompt, n, gen, &st);
    int32_t k = st == NS_OK ? collect(r, out, gen) : -1;
    ns_request_result_get(r, res);
    ns_request_release(r);
    return k;
}

TEST(batched_equals_alone) {
    setup();
    CHECK(g_model != NULL);
    if (!g_model) return;
    ns_engine *e = make_engine(256, 64, 8);
    enum { N = 6, GEN = 24 };
    static const int32_t lens[N] = {5, 40, 17, 70, 33, 90};
    static const int32_t shared[N] = {5, 20, 17, 20, 0, 40};
    int32_t prompts[N][128], want[N][GEN], n_want[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], lens[i], shared[i], (uint32_t)i + 7);
        prompts[i][0] = 1; /* BOS */
        n_want[i] = greedy_alone(e, prompts[i], lens[i], GEN, want[i]);
    }
    ns_engine_free(e);
    e = make_engine(256, 64, 8);
    ns_sched *s = make_sched(e, 8);
    ns_request *rs[N];
    for (int i = 0; i < N; i++) {
        ns_status st;
        rs[i] = submit(s, prompts[i], lens[i], GEN, &st);
        CHECK(st == NS_OK);
    }
    for (int i = 0; i < N; i++) {
        int32_t got[GEN];
        int32_t n = collect(rs[i], got, GEN);
        CHECKF(n == n_want[i] && memcmp(got, want[i], (size_t)n * 4) == 0, "request %d differs from its solo run", i);
        ns_request_release(rs[i]);
    }
    /* same prompts again, now served from the cache: same tokens */
    for (int i = 0; i < N; i++) {
        ns_status st;
        ns_request *r = submit(s, prompts[i], lens[i], GEN, &st);
        int32_t got[GEN];
        int32_t n = collect(r, got, GEN);
        ns_request_result res;
        ns_request_result_get(r, &res);
        CHECKF(res.n_cached == lens[i] - 1, "prompt %d: cached %d of %d", i, res.n_cached, lens[i]);
        CHECKF(n == n_want[i] && memcmp(got, want[i], (size_t)n * 4) == 0, "cached request %d differs", i);
        ns_request_release(r);
    }
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(agent_replay_hits_cache) {
    setup();
    if (!g_model) return;
    ns_engine *e = make_engine(512, 64, 4);
    ns_sched *s = make_sched(e, 4);
    int32_t *conv = malloc(4096 * sizeof(int32_t));
    int32_t n = 30, prev = 0;
    make_prompt(conv, n, n, 99);
    conv[0] = 1;
    for (int turn = 0; turn < 20; turn++) {
        ns_status st;
        ns_request *r = submit(s, conv, n, 8, &st);
        CHECK(st == NS_OK);
        int32_t ans[8];
        int32_t k = collect(r, ans, 8);
        ns_request_result res;
        ns_request_result_get(r, &res);
        if (turn > 0) CHECKF(res.n_cached >= prev - P, "turn %d: cached %d < previous prompt %d - page", turn, res.n_cached, prev);
        ns_request_release(r);
        prev = n;
        memcpy(conv + n, ans, (size_t)k * 4); /* the answer joins the conversation */
        n += k;
        int32_t extra = 4 + turn;             /* plus a new "tool result" */
        make_prompt(conv + n, extra, 0, (uint32_t)turn + 1000);
        n += extra;
    }
    free(conv);
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(cancel_mid_prefill_keeps_pages) {
    setup();
    if (!g_model) return;
    ns_engine *e = make_engine(256, 32, 2);
    ns_sched *s = make_sched(e, 2);
    int32_t prompt[480];
    make_prompt(prompt, 480, 480, 5);
    prompt[0] = 1;
    ns_status st;
    ns_request *r = submit(s, prompt, 480, 4, &st);
    /* wait until some prefill steps ran, then cancel */
    ns_sched_stats stats;
    for (int i = 0; i < 2000; i++) {
        ns_sched_get_stats(s, &stats);
        if (stats.batch_tokens.count >= 3) break;
        usleep(1000);
    }
    ns_request_cancel(r);
    int32_t dummy[4];
    collect(r, dummy, 4);
    ns_request_result res;
    ns_request_result_get(r, &res);
    CHECK(res.finish == NS_FINISH_CANCELLED || res.finish == NS_FINISH_LENGTH);
    ns_request_release(r);
    ns_request *r2 = submit(s, prompt, 480, 4, &st);
    collect(r2, dummy, 4);
    ns_request_result res2;
    ns_request_result_get(r2, &res2);
    CHECKF(res2.n_cached >= 3 * 32 - P, "re-sent prompt reused only %d tokens", res2.n_cached);
    ns_request_release(r2);
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(small_pool_waits_and_rejects) {
    setup();
    if (!g_model) return;
    /* 12 pages of 16 = 192 tokens: each request needs 5 pages, so at most
     * two run at once; the rest must wait, and all must complete. */
    ns_engine *e = make_engine(12, 64, 4);
    ns_sched *s = make_sched(e, 4);
    enum { N = 6 };
    ns_request *rs[N];
    int32_t prompt[60];
    for (int i = 0; i < N; i++) {
        make_prompt(prompt, 60, 0, (uint32_t)i + 50);
        prompt[0] = 1;
        ns_status st;
        rs[i] = submit(s, prompt, 60, 16, &st);
        CHECK(st == NS_OK);
    }
    for (int i = 0; i < N; i++) {
        int32_t got[16];
        int32_t n = collect(rs[i], got, 16);
        ns_request_result res;
        ns_request_result_get(rs[i], &res);
        CHECKF(res.finish == NS_FINISH_LENGTH || res.finish == NS_FINISH_EOS, "request %d finish %d (%d tokens)", i, res.finish, n);
        ns_request_release(rs[i]);
    }
    /* never fits: a 200-token prompt > 192 pool tokens */
    int32_t big[200];
    make_prompt(big, 200, 0, 77);
    ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = 100};
    ns_request *r = ns_request_new(big, 200, &p);
    ns_capacity cap;
    ns_error err = {0};
    CHECK(ns_sched_submit(s, r, &cap, &err) == NS_ERR_RANGE);
    CHECK_EQ_INT(cap.pool_tokens, 192);
    CHECK_EQ_INT(cap.prompt_tokens, 200);
    ns_request_release(r);
    /* fits once max_tokens is clamped: 150 + 100 > 192 runs with 42 */
    r = ns_request_new(big, 150, &p);
    CHECK(ns_sched_submit(s, r, &cap, &err) == NS_OK);
    CHECK_EQ_INT(cap.max_tokens, 42);
    int32_t got[100];
    CHECK(collect(r, got, 100) <= 42);
    ns_request_release(r);
    ns_sched_free(s);
    ns_engine_free(e);
}

/* Requests without max_tokens reserve up to a whole context: with a pool of
 * four contexts, two of them must run at the same time, not one after the
 * other. */
TEST(unbounded_requests_share_a_larger_pool) {
    setup();
    if (!g_model) return;
    const int32_t ctx = g_model->cfg.max_position_embeddings;
    ns_engine *e = make_engine(4 * ctx / P, 64, 4);
    ns_sched *s = make_sched(e, 4);
    int32_t prompt[20];
    ns_request *rs[2];
    for (int i = 0; i < 2; i++) {
        make_prompt(prompt, 20, 0, (uint32_t)i + 300);
        prompt[0] = 1;
        ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = 0, .ignore_eos = true};
        rs[i] = ns_request_new(prompt, 20, &p);
        ns_capacity cap;
        ns_error err = {0};
        CHECK(ns_sched_submit(s, rs[i], &cap, &err) == NS_OK);
        CHECK_EQ_INT(cap.max_tokens, ctx - 20);
    }
    int32_t max_running = 0;
    for (int i = 0; i < 20000; i++) {
        ns_sched_stats st;
        ns_sched_get_stats(s, &st);
        if (st.requests_running > max_running) max_running = st.requests_running;
        if (max_running == 2) break;
        usleep(500);
    }
    CHECK_EQ_INT(max_running, 2);
    for (int i = 0; i < 2; i++) {
        ns_request_cancel(rs[i]);
        int32_t dummy[8];
        collect(rs[i], dummy, 8);
        ns_request_release(rs[i]);
    }
    ns_sched_free(s);
    ns_engine_free(e);
}

/* Evicting part of a long cached prompt keeps the longest prefix: the
 * chain's tail is evicted first, never its head. */
TEST(partial_eviction_keeps_longest_prefix) {
    setup();
    if (!g_model) return;
    ns_engine *e = make_engine(24, 64, 2); /* 24 pages of 16 */
    ns_sched *s = make_sched(e, 2);
    int32_t a[337], b[40], out[4];
    make_prompt(a, 337, 337, 11); /* 21 full pages + 1 token */
    a[0] = 1;
    ns_request_result res;
    run_one(s, a, 337, 1, out, &res);
    /* b needs 3 pages: 1 free + 2 evicted from a's 22 cached pages */
    make_prompt(b, 40, 0, 12);
    b[0] = 1;
    run_one(s, b, 40, 1, out, &res);
    run_one(s, a, 337, 1, out, &res);
    CHECKF(res.n_cached >= 19 * P, "after evicting 2-3 pages the prompt reused only %d tokens", res.n_cached);
    ns_sched_free(s);
    ns_engine_free(e);
}

/* Session A, then enough others to push A out of the pool, then A again:
 * served from the RAM tier, token-identical to the cold run. */
TEST(churned_session_comes_back_from_ram) {
    setup();
    if (!g_model) return;
    ns_engine *e = make_engine(32, 64, 2);
    ns_sched *s = make_sched_tiers(e, 2, 4 << 20, NULL);
    int32_t a[300], o[100], cold[8], warm[8];
    make_prompt(a, 300, 300, 21);
    a[0] = 1;
    ns_request_result res;
    int32_t n_cold = run_one(s, a, 300, 8, cold, &res);
    for (int i = 0; i < 4; i++) {
        make_prompt(o, 100, 0, (uint32_t)i + 400);
        o[0] = 1;
        run_one(s, o, 100, 8, warm, &res);
    }
    int32_t n_warm = run_one(s, a, 300, 8, warm, &res);
    CHECKF(res.n_cached >= 300 - P, "cached %d", res.n_cached);
    CHECKF(res.n_cached_by_tier[NS_TIER_RAM] > 0, "nothing came from RAM (device %d, ram %d)",
           res.n_cached_by_tier[NS_TIER_DEVICE], res.n_cached_by_tier[NS_TIER_RAM]);
    CHECK(n_cold == n_warm && memcmp(cold, warm, (size_t)n_cold * 4) == 0);
    ns_sched_stats st;
    ns_sched_get_stats(s, &st);
    CHECK(st.kv.demotions > 0 && st.kv.promotions[NS_TIER_RAM] > 0);
    ns_sched_free(s);
    ns_engine_free(e);
}

/* A restart: a new scheduler over a fresh pool and the same SSD
 * directory serves the prompt from SSD, token-identical. */
TEST(restart_serves_from_ssd) {
    setup();
    if (!g_model) return;
    char dir[] = "/tmp/ns_sched_ssd_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int32_t a[200], cold[8], warm[8];
    make_prompt(a, 200, 200, 31);
    a[0] = 1;
    ns_request_result res;
    ns_engine *e = make_engine(64, 64, 2);
    ns_sched *s = make_sched_tiers(e, 2, 0, dir);
    int32_t n_cold = run_one(s, a, 200, 8, cold, &res);
    ns_kv_ssd_flush_result fr;
    ns_error err = {0};
    CHECK(ns_sched_flush(s, 10000, &fr, &err) == NS_OK);
    CHECKF(fr.durable >= 12, "durable %lld", (long long)fr.durable);
    ns_sched_free(s);
    ns_engine_free(e);
    e = make_engine(64, 64, 2);
    s = make_sched_tiers(e, 2, 0, dir);
    int32_t n_warm = run_one(s, a, 200, 8, warm, &res);
    CHECKF(res.n_cached_by_tier[NS_TIER_SSD] >= 200 - 2 * P, "from SSD: %d", res.n_cached_by_tier[NS_TIER_SSD]);
    CHECK(n_cold == n_warm && memcmp(cold, warm, (size_t)n_cold * 4) == 0);
    ns_sched_free(s);
    ns_engine_free(e);
    CHECK(test_rmtree(dir) == 0);
}

/* Pressure: three long requests and a pool for ~1.5 of them. Admission is
 * optimistic, so all three start; when the pool runs dry the newest is
 * paused and resumed later. All complete, none aborted, each output
 * token-identical to the same request run alone. */
static void pressure_case(int64_t ram, int32_t pause_every, const char *label) {
    enum { N = 3, LEN = 100, GEN = 150 };
    ns_engine *e = make_engine(64, 64, 4);
    int32_t prompts[N][LEN], want[N][GEN], n_want[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], LEN, 0, (uint32_t)i + 900);
        prompts[i][0] = 1;
        n_want[i] = greedy_alone_eos(e, prompts[i], LEN, GEN, want[i], false);
    }
    ns_engine_free(e);
    e = make_engine(24, 64, 4); /* 24 pages x 16 = 384 tokens: 1.5 x (100 + 150) */
    ns_sched *s = make_sched_tiers(e, 4, ram, NULL) /* default policy: pause */;
    ns_request *rs[N];
    for (int i = 0; i < N; i++) {
        ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = GEN, .ignore_eos = true,
                               .test_pause_every = pause_every};
        rs[i] = ns_request_new(prompts[i], LEN, &p);
        ns_capacity cap;
        ns_error err = {0};
        CHECK(ns_sched_submit(s, rs[i], &cap, &err) == NS_OK);
    }
    for (int i = 0; i < N; i++) {
        int32_t got[GEN];
        int32_t n = collect(rs[i], got, GEN);
        ns_request_result res;
        ns_request_result_get(rs[i], &res);
        CHECKF(res.finish == NS_FINISH_LENGTH, "%s: request %d finish %d after %d tokens", label, i, res.finish, n);
        int32_t same = 0;
        while (same < n && same < n_want[i] && got[same] == want[i][same]) same++;
        CHECKF(n == n_want[i] && same == n, "%s: request %d differs from its solo run at token %d of %d", label, i,
               same, n);
        ns_request_release(rs[i]);
    }
    ns_sched_stats st;
    ns_sched_get_stats(s, &st);
    CHECKF(st.pauses_total > 0 && st.resumes_total == st.pauses_total, "%s: pauses %llu resumes %llu", label,
           (unsigned long long)st.pauses_total, (unsigned long long)st.resumes_total);
    CHECK_EQ_INT(st.requests_cancelled, 0);
    ns_sched_free(s);
    ns_engine_free(e);
}

TEST(pressure_pauses_and_resumes_exactly) {
    setup();
    if (!g_model) return;
    pressure_case(0, 0, "no lower tier (recompute)");
    pressure_case(4 << 20, 0, "RAM tier");
}

TEST(forced_pauses_give_identical_output) {
    setup();
    if (!g_model) return;
    pressure_case(4 << 20, 7, "pause every 7 tokens, RAM tier");
    pressure_case(0, 5, "pause every 5 tokens, recompute");
}

/* Optimistic admission: two requests without max_tokens in a pool of ~1.5
 * contexts both stream tokens before either finishes. */
TEST(unbounded_requests_run_together_in_a_small_pool) {
    setup();
    if (!g_model) return;
    const int32_t ctx = g_model->cfg.max_position_embeddings;
    ns_engine *e = make_engine(3 * ctx / (2 * P), 64, 4);
    ns_sched *s = make_sched(e, 4);
    ns_request *rs[2];
    int32_t prompt[20];
    for (int i = 0; i < 2; i++) {
        make_prompt(prompt, 20, 0, (uint32_t)i + 700);
        prompt[0] = 1;
        ns_request_params p = {.sampling = ns_sampling_default(), .max_tokens = 0, .ignore_eos = true};
        rs[i] = ns_request_new(prompt, 20, &p);
        ns_capacity cap;
        ns_error err = {0};
        CHECK(ns_sched_submit(s, rs[i], &cap, &err) == NS_OK);
    }
    /* both have tokens before either is done */
    int32_t got[2] = {0, 0};
    for (int it = 0; it < 20000 && (got[0] == 0 || got[1] == 0); it++) {
        for (int i = 0; i < 2; i++) {
            ns_token_event ev[8];
            bool done = false;
            got[i] += ns_request_poll(rs[i], ev, 8, 1, &done);
            CHECK(!done);
        }
    }
    CHECK(got[0] > 0 && got[1] > 0);
    for (int i = 0; i < 2; i++) {
        ns_request_cancel(rs[i]);
        int32_t dummy[8];
        collect(rs[i], dummy, 8);
        ns_request_release(rs[i]);
    }
    ns_sched_free(s);
    ns_engine_free(e);
}

/* Two agents send the same long prompt at once: the second waits for the
 * first one's pages instead of prefilling the same tokens again. */
TEST(concurrent_shared_prefix_is_prefilled_once) {
    setup();
    if (!g_model) return;
    ns_engine *e = make_engine(256, 64, 4);
    ns_sched *s = make_sched(e, 4);
    int32_t prompt[400];
    make_prompt(prompt, 400, 400, 61);
    prompt[0] = 1;
    ns_request *rs[2];
    for (int i = 0; i < 2; i++) {
        ns_status st;
        rs[i] = submit(s, prompt, 400, 4, &st);
        CHECK(st == NS_OK);
    }
    ns_request_result res[2];
    for (int i = 0; i < 2; i++) {
        int32_t got[4];
        collect(rs[i], got, 4);
        ns_request_result_get(rs[i], &res[i]);
        ns_request_release(rs[i]);
    }
    CHECKF(res[1].n_cached >= 400 - P, "the second request prefilled again: cached %d", res[1].n_cached);
    ns_sched_stats st;
    ns_sched_get_stats(s, &st);
    CHECKF(st.prompt_tokens_total - st.prefix_hit_tokens_total <= 400 + P, "prefilled %llu tokens for two copies",
           (unsigned long long)(st.prompt_tokens_total - st.prefix_hit_tokens_total));
    ns_sched_free(s);
    ns_engine_free(e);
}

int main(void) {
    RUN(batched_equals_alone);
    RUN(agent_replay_hits_cache);
    RUN(cancel_mid_prefill_keeps_pages);
    RUN(small_pool_waits_and_rejects);
    RUN(unbounded_requests_share_a_larger_pool);
    RUN(partial_eviction_keeps_longest_prefix);
    RUN(churned_session_comes_back_from_ram);
    RUN(restart_serves_from_ssd);
    RUN(pressure_pauses_and_resumes_exactly);
    RUN(forced_pauses_give_identical_output);
    RUN(unbounded_requests_run_together_in_a_small_pool);
    RUN(concurrent_shared_prefix_is_prefilled_once);
    ns_model_free(g_model);
    if (g_be) g_be->ops->destroy(g_be);
    TEST_MAIN_END;
}
