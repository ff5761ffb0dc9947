/* Sampler semantics: greedy, seeded reproducibility, top-k/top-p/min-p
 * restriction, penalties. */
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

int main(void) {
    RUN(greedy_is_argmax);
    RUN(seed_reproducible);
    RUN(top_k_restricts);
    RUN(top_p_and_min_p_restrict);
    RUN(penalties_change_choice);
    RUN(validation_names_param);
    RUN(logsumexp_matches_naive);
    TEST_MAIN_END;
}
