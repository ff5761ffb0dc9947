/* The grammar mask (structured output) on the CUDA backend's sample op:
 * masked rows — greedy, greedy with a penalty, temperature 1 — take the
 * host path and give exactly the CPU reference's tokens, always inside
 * their mask; unmasked greedy rows in the same call stay on the device
 * argmax and give the global argmax. Run by `make CUDA=1 gpu-tests`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "sample/sample.h"
#include "test.h"

static ns_backend *cpu, *gpu;

enum { R = 6, V = 151936 };

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static bool allowed(const uint32_t *m, int32_t t) { return t >= 0 && ((m[t >> 5] >> (t & 31)) & 1u); }

TEST(masked_rows_match_cpu_and_stay_in_mask) {
    ns_error e = {0};
    float *lg = malloc((size_t)R * V * sizeof(float));
    const size_t W = (V + 31) / 32;
    /* mask A: a few hundred scattered ids (a structural state); mask B:
     * everything but the 1000 best ids of each row's logits band */
    uint32_t *ma = calloc(W, sizeof(uint32_t)), *mb = malloc(W * sizeof(uint32_t));
    for (int32_t t = 7; t < V; t += 577) ma[t >> 5] |= 1u << (t & 31);
    memset(mb, 0xFF, W * sizeof(uint32_t));
    for (int32_t t = 0; t < 1000; t++) mb[t >> 5] &= ~(1u << (t & 31));
    const uint32_t *masks[R] = {ma, NULL, mb, ma, mb, NULL};
    ns_tensor c = {0}, g = {0};
    CHECK(cpu->ops->tensor_alloc(cpu, &c, NS_DT_F32, R, V, &e) == NS_OK);
    CHECK(gpu->ops->tensor_alloc(gpu, &g, NS_DT_F32, R, V, &e) == NS_OK);
    ns_sampler sc[R], sg[R];
    ns_sampler *pc[R], *pg[R];
    for (int i = 0; i < R; i++) {
        ns_sampling_params sp = ns_sampling_default();
        if (i == 3) sp.repetition_penalty = 1.2f;
        if (i == 4) {
            sp.temperature = 1.0f;
            sp.seed = 77;
        }
        CHECK(ns_sampler_init(&sc[i], &sp, V, &e) == NS_OK);
        CHECK(ns_sampler_init(&sg[i], &sp, V, &e) == NS_OK);
        pc[i] = &sc[i];
        pg[i] = &sg[i];
    }
    for (int rep = 0; rep < 5; rep++) {
        for (size_t k = 0; k < (size_t)R * V; k++) lg[k] = frand() * 6.0f;
        /* the best logits sit in the ids mask B excludes */
        for (int i = 0; i < R; i++)
            for (int32_t t = 0; t < 1000; t++) lg[(size_t)i * V + t] += 20.0f;
        CHECK(cpu->ops->tensor_upload(cpu, &c, lg, &e) == NS_OK);
        CHECK(gpu->ops->tensor_upload(gpu, &g, lg, &e) == NS_OK);
        for (int i = 0; i < R; i++) sc[i].allow = sg[i].allow = masks[i];
        int32_t tc[R], tg[R];
        CHECK(cpu->ops->sample(cpu, &c, R, pc, tc, &e) == NS_OK);
        CHECK(gpu->ops->sample(gpu, &g, R, pg, tg, &e) == NS_OK);
        for (int i = 0; i < R; i++) {
            sc[i].allow = sg[i].allow = NULL;
            CHECKF(tc[i] == tg[i], "rep %d row %d: cpu %d cuda %d", rep, i, tc[i], tg[i]);
            if (masks[i]) CHECKF(allowed(masks[i], tg[i]), "rep %d row %d: token %d outside its mask", rep, i, tg[i]);
            ns_sampler_accept(&sc[i], tc[i]);
            ns_sampler_accept(&sg[i], tg[i]);
        }
        for (int i = 1; i < R; i += 4) { /* rows 1 and 5: unmasked greedy = global argmax */
            int32_t best = 0;
            for (int32_t t = 1; t < V; t++)
                if (lg[(size_t)i * V + t] > lg[(size_t)i * V + best]) best = t;
            CHECK_EQ_INT(tg[i], best);
        }
    }
    for (int i = 0; i < R; i++) {
        ns_sampler_free(&sc[i]);
        ns_sampler_free(&sg[i]);
    }
    cpu->ops->tensor_free(cpu, &c);
    gpu->ops->tensor_free(gpu, &g);
    free(lg);
    free(ma);
    free(mb);
}

int main(void) {
    ns_error err = {0};
    if (ns_backend_cpu_create(4, &cpu, &err) != NS_OK) {
        printf("not ok - setup: cpu backend: %s\n", err.msg);
        return 1;
    }
    if (ns_backend_cuda_create(0, &gpu, &err) != NS_OK) {
        printf("not ok - setup: cuda backend: %s\n", err.msg);
        return 1;
    }
    RUN(masked_rows_match_cpu_and_stay_in_mask);
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END;
}
