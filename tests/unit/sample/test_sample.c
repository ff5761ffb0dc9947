/* Sampler semantics: greedy, seeded reproducibility, top-k/top-p/min-p
 * restriction, penalties; non-finite rows (NaN / all -Inf -> -1, +Inf
 * wins, -Inf never drawn) and temperatures below the greedy floor. */
#include "backend/backend.h"
#include "sample/sample.h"
#include "test.h"

#define V 64

static void fill(float *l) {
    for (int i = 0; i < V; i++) l[i] = (float)((i * 37) % V) / 8.0f; /* argmax at i where (i*37)%64==63 */
}

TEST(greedy_is_argmax) {
    ns_sampling_params p = ns_sampling_default();
    ns_sampler s;
    CHECK(ns_sampler_init(&s, &p, V, NULL) == NS_OK);
    float l[V];
    fill(l);
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    CHECK_EQ_INT(ns_sampler_sample(&s, l), best);
    ns_sampler_free(&s);
}

TEST(seed_reproducible) {
    ns_sampling_params p = ns_sampling_default();
    p.temperature = 1.5f;
    p.seed = 42;
    int32_t a[50], b[50];
    for (int run = 0; run < 2; run++) {
        ns_sampler s;
        ns_sampler_init(&s, &p, V, NULL);
        for (int i = 0; i < 50; i++) {
            float l[V];
            fill(l);
            (run ? b : a)[i] = ns_sampler_sample(&s, l);
        }
        ns_sampler_free(&s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    int distinct = 0;
    for (int i = 1; i < 50; i++) distinct += a[i] != a[0];
    CHECK(distinct > 0); /* temperature 1.5 over a flat-ish distribution varies */
}

TEST(top_k_restricts) {
    ns_sampling_params p = ns_sampling_default();
    p.temperature = 5.0f;
    p.top_k = 3;
    p.seed = 1;
    ns_sampler s;
    ns_sampler_init(&s, &p, V, NULL);
    for (int i = 0; i < 200; i++) {
        float l[V];
        fill(l);
        int32_t t = ns_sampler_sample(&s, l);
        float f[V];
        fill(f);
        int higher = 0;
        for (int j = 0; j < V; j++) higher += f[j] > f[t];
        CHECKF(higher < 3, "token %d has %d better tokens", t, higher);
    }
    ns_sampler_free(&s);
}

TEST(top_p_and_min_p_restrict) {
    ns_sampling_params p = ns_sampling_default();
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    p.min_p = 0.2f;
    p.seed = 3;
    ns_sampler s;
    ns_sampler_init(&s, &p, V, NULL);
    for (int i = 0; i < 200; i++) {
        float l[V] = {0};
        for (int j = 0; j < V; j++) l[j] = -10.0f;
        l[5] = 3.0f; /* p ~ 0.88: top-p 0.5 keeps only it */
        l[9] = 1.0f;
        CHECK_EQ_INT(ns_sampler_sample(&s, l), 5);
    }
    ns_sampler_free(&s);
}

TEST(penalties_change_choice) {
    ns_sampling_params p = ns_sampling_default();
    p.repetition_penalty = 2.0f;
    ns_sampler s;
    ns_sampler_init(&s, &p, V, NULL);
    float l[V];
    for (int j = 0; j < V; j++) l[j] = 0.0f;
    l[7] = 2.0f;
    l[8] = 1.5f;
    ns_sampler_accept(&s, 7); /* 7 seen: 2.0 / 2 = 1.0 < 1.5 */
    CHECK_EQ_INT(ns_sampler_sample(&s, l), 8);
    ns_sampler_free(&s);
    p = ns_sampling_default();
    p.frequency_penalty = 0.4f;
    ns_sampler_init(&s, &p, V, NULL);
    for (int j = 0; j < V; j++) l[j] = 0.0f;
    l[7] = 2.0f;
    l[8] = 1.5f;
    ns_sampler_accept(&s, 7);
    ns_sampler_accept(&s, 7); /* 2.0 - 0.8 = 1.2 < 1.5 */
    CHECK_EQ_INT(ns_sampler_sample(&s, l), 8);
    ns_sampler_free(&s);
}

TEST(validation_names_param) {
    ns_sampling_params p = ns_sampling_default();
    p.top_p = 1.5f;
    ns_error err = {0};
    CHECK(ns_sampling_validate(&p, &err) == NS_ERR_INVALID);
    CHECK(strstr(err.msg, "top_p") != NULL);
}

TEST(logsumexp_matches_naive) {
    float l[1000];
    for (int i = 0; i < 1000; i++) l[i] = (float)((i * 7919) % 1000) / 37.0f - 10.0f;
    double mx = -1e30, s = 0;
    for (int i = 0; i < 1000; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < 1000; i++) s += exp(l[i] - mx);
    CHECK_NEAR(ns_logsumexp(l, 1000), mx + log(s), 1e-5);
}

/* Samplers for the non-finite tests: greedy, sampled, sampled with every
 * restriction and penalties on (so each path meets the row). */
static int make_samplers(ns_sampler *s) {
    ns_sampling_params p[4];
    for (int k = 0; k < 4; k++) p[k] = ns_sampling_default();
    p[1].temperature = 1.0f;
    p[1].seed = 7;
    p[2].temperature = 0.7f;
    p[2].top_k = 5;
    p[2].top_p = 0.9f;
    p[2].min_p = 0.05f;
    p[2].repetition_penalty = 1.3f;
    p[2].presence_penalty = 0.5f;
    p[2].seed = 9;
    p[3] = p[2];
    p[3].temperature = 0.0f;
    for (int k = 0; k < 4; k++) {
        CHECK(ns_sampler_init(&s[k], &p[k], V, NULL) == NS_OK);
        ns_sampler_accept(&s[k], 3);
    }
    return 4;
}

TEST(nan_row_gives_minus_one) {
    ns_sampler s[4];
    int ns = make_samplers(s);
    float l[V];
    for (int k = 0; k < ns; k++) {
        for (int i = 0; i < V; i++) l[i] = NAN; /* every logit NaN (ASan: read before scratch_ids) */
        CHECK_EQ_INT(ns_sampler_sample(&s[k], l), -1);
        fill(l);
        l[V / 2] = NAN; /* one NaN poisons the row */
        CHECK_EQ_INT(ns_sampler_sample(&s[k], l), -1);
        fill(l);
        l[0] = NAN; /* ... wherever it is */
        CHECK_EQ_INT(ns_sampler_sample(&s[k], l), -1);
        fill(l); /* and a finite row after it samples normally */
        int32_t t = ns_sampler_sample(&s[k], l);
        CHECK(t >= 0 && t < V);
        ns_sampler_free(&s[k]);
    }
}

TEST(all_neg_inf_row_gives_minus_one) {
    ns_sampler s[4];
    int ns = make_samplers(s);
    float l[V];
    for (int k = 0; k < ns; k++) {
        for (int i = 0; i < V; i++) l[i] = -INFINITY;
        CHECK_EQ_INT(ns_sampler_sample(&s[k], l), -1);
        ns_sampler_free(&s[k]);
    }
}

TEST(neg_inf_never_sampled) {
    ns_sampling_params p = ns_sampling_default();
    p.temperature = 2.0f;
    p.seed = 11;
    ns_sampler s;
    CHECK(ns_sampler_init(&s, &p, V, NULL) == NS_OK);
    for (int r = 0; r < 300; r++) {
        float l[V];
        for (int i = 0; i < V; i++) l[i] = (i % 3) ? -INFINITY : 0.0f; /* only multiples of 3 allowed */
        int32_t t = ns_sampler_sample(&s, l);
        CHECKF(t >= 0 && t % 3 == 0, "draw %d gave %d", r, t);
    }
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -INFINITY;
    l[42] = -1e30f; /* the one finite logit wins, however small */
    CHECK_EQ_INT(ns_sampler_sample(&s, l), 42);
    ns_sampler_free(&s);
}

TEST(pos_inf_wins) {
    ns_sampler s[4];
    int ns = make_samplers(s);
    float l[V];
    for (int k = 0; k < ns; k++) {
        for (int r = 0; r < 20; r++) {
            fill(l);
            l[40] = INFINITY;
            l[50] = INFINITY;
            l[10] = -INFINITY;
            CHECK_EQ_INT(ns_sampler_sample(&s[k], l), 40); /* the lowest +Inf id */
        }
        ns_sampler_free(&s[k]);
    }
}

TEST(tiny_temperature_is_greedy) {
    const float temps[] = {1e-38f, 1e-30f, 1e-20f, 1e-6f, 9.9e-6f, 1.5e-45f /* denormal */};
    for (size_t k = 0; k < sizeof temps / sizeof temps[0]; k++) {
        ns_sampling_params p = ns_sampling_default();
        p.temperature = temps[k];
        p.seed = 5;
        ns_sampler s;
        CHECK(ns_sampler_init(&s, &p, V, NULL) == NS_OK);
        CHECK(ns_sampler_is_greedy(&s));
        for (int r = 0; r < 50; r++) {
            float l[V];
            for (int i = 0; i < V; i++) l[i] = -5.0f + (float)((i * 13) % V) * 1e-3f;
            l[17] = -4.0f; /* the top token, by a small margin */
            CHECKF(ns_sampler_sample(&s, l) == 17, "temperature %g", (double)temps[k]);
        }
        ns_sampler_free(&s);
    }
    /* at the floor it samples, and 1/t scaling huge logits does not make
     * a NaN or pick a low-probability token */
    ns_sampling_params p = ns_sampling_default();
    p.temperature = NS_SAMPLE_MIN_TEMPERATURE;
    p.seed = 5;
    ns_sampler s;
    CHECK(ns_sampler_init(&s, &p, V, NULL) == NS_OK);
    CHECK(!ns_sampler_is_greedy(&s));
    for (int r = 0; r < 50; r++) {
        float l[V];
        for (int i = 0; i < V; i++) l[i] = (float)i * 1e33f; /* * 1e5 overflows */
        l[63] = 3e38f;
        CHECK_EQ_INT(ns_sampler_sample(&s, l), 63);
        for (int i = 0; i < V; i++) l[i] = 0.0f;
        l[20] = 1.0f;
        CHECK_EQ_INT(ns_sampler_sample(&s, l), 20);
    }
    ns_sampler_free(&s);
}

/* The CPU backend's sample op: a NaN row gets -1, the batch's other rows
 * their usual tokens, and the op itself succeeds. */
TEST(backend_sample_op_isolates_bad_rows) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    if (!be) return;
    ns_tensor t;
    memset(&t, 0, sizeof t);
    CHECK(be->ops->tensor_alloc(be, &t, NS_DT_F32, 3, V, &err) == NS_OK);
    float *l = t.data;
    fill(l);
    for (int i = 0; i < V; i++) l[V + i] = NAN;
    fill(l + 2 * V);
    l[2 * V + 5] = 100.0f;
    ns_sampling_params p = ns_sampling_default();
    ns_sampler s[3], *sp[3] = {&s[0], &s[1], &s[2]};
    for (int k = 0; k < 3; k++) CHECK(ns_sampler_init(&s[k], &p, V, NULL) == NS_OK);
    int32_t out[3] = {-7, -7, -7};
    CHECK(be->ops->sample(be, &t, 3, sp, out, &err) == NS_OK);
    float f[V];
    fill(f);
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (f[i] > f[best]) best = i;
    CHECK_EQ_INT(out[0], best);
    CHECK_EQ_INT(out[1], -1);
    CHECK_EQ_INT(out[2], 5);
    for (int k = 0; k < 3; k++) ns_sampler_free(&s[k]);
    be->ops->tensor_free(be, &t);
    be->ops->destroy(be);
}

static const float *g_ref_vals;
static int ref_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float u = g_ref_vals[x], w = g_ref_vals[y];
    if (u != w) return u > w ? -1 : 1;
    return (x > y) - (x < y);
}

/* The radix candidate order equals the comparison order (value
 * descending, ties by ascending id, -0 == +0) on a large row with many
 * ties, signed zeros and negative values; a mask leaves only allowed ids. */
TEST(radix_order_matches_comparison_sort_and_mask) {
    const int32_t n = 50000;
    float *v = malloc((size_t)n * sizeof(float));
    int32_t *a = malloc((size_t)n * sizeof(int32_t)), *b = malloc((size_t)n * sizeof(int32_t));
    uint32_t *keys = malloc((size_t)n * sizeof(uint32_t)), *sort = malloc((size_t)n * 2 * sizeof(uint32_t));
    uint64_t x = 12345;
    for (int32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int r = (int)((x >> 33) % 1000);
        v[i] = r < 50 ? (r % 2 ? -0.0f : 0.0f) : (float)(r - 500) / 16.0f;
        a[i] = b[i] = i;
    }
    ns_sample_order(v, a, n, keys, sort);
    g_ref_vals = v;
    qsort(b, (size_t)n, sizeof(int32_t), ref_cmp);
    int32_t diff = 0;
    for (int32_t i = 0; i < n; i++) diff += a[i] != b[i];
    CHECK_EQ_INT(diff, 0);
    /* a mask: only even ids below 1000 may be drawn, at any temperature */
    uint32_t *allow = calloc((size_t)(n + 31) / 32, sizeof(uint32_t));
    for (int32_t i = 0; i < 1000; i += 2) allow[i >> 5] |= 1u << (i & 31);
    ns_sampling_params p = ns_sampling_default();
    p.temperature = 1.0f;
    p.seed = 9;
    ns_sampler s;
    CHECK(ns_sampler_init(&s, &p, n, NULL) == NS_OK);
    s.allow = allow;
    int bad = 0;
    for (int k = 0; k < 200; k++) {
        for (int32_t i = 0; i < n; i++) v[i] = (float)((i * 7919 + k * 31) % 997) / 50.0f;
        int32_t t = ns_sampler_sample(&s, v);
        bad += !(t >= 0 && t < 1000 && t % 2 == 0);
    }
    CHECK_EQ_INT(bad, 0);
    ns_sampler_free(&s);
    free(allow);
    free(v);
    free(a);
    free(b);
    free(keys);
    free(sort);
}

int main(void) {
    RUN(greedy_is_argmax);
    RUN(seed_reproducible);
    RUN(top_k_restricts);
    RUN(top_p_and_min_p_restrict);
    RUN(penalties_change_choice);
    RUN(validation_names_param);
    RUN(logsumexp_matches_naive);
    RUN(nan_row_gives_minus_one);
    RUN(all_neg_inf_row_gives_minus_one);
    RUN(neg_inf_never_sampled);
    RUN(pos_inf_wins);
    RUN(tiny_temperature_is_greedy);
    RUN(backend_sample_op_isolates_bad_rows);
    RUN(radix_order_matches_comparison_sort_and_mask);
    TEST_MAIN_END;
}
