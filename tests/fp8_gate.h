/* fp8_gate.h — the FP8 KV accuracy gate, shared by
 * tests/unit/backend/test_kv_fp8_cpu.c (FP8 against F32 KV on the CPU) and
 * tests/gpu/test_kv_fp8.c (FP8 against BF16 KV on the GPU): the bounds
 * (docs/cuda.md "FP8 KV cache" derives them) and the per-position
 * comparison of a reference run's logits with an FP8 run's.
 * Header-only (static), like tests/test.h; include it after test.h. */
#ifndef NS_TESTS_FP8_GATE_H
#define NS_TESTS_FP8_GATE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* at every position: |change of the reference's top-token log-probability|
 * <= FP8_MAX_DLP, KL(reference || fp8) <= FP8_MAX_KL; mean KL <= FP8_MEAN_KL */
#define FP8_MAX_DLP 0.5
#define FP8_MAX_KL 0.05
#define FP8_MEAN_KL 0.01

typedef struct {
    double worst_dlp, worst_kl, sum_kl;
    int positions;
} fp8_gate;

static void fp8_gate_log_softmax(const float *x, int32_t V, double *lp) {
    double mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < V; i++) mx = fmax(mx, x[i]);
    for (int32_t i = 0; i < V; i++) s += exp(x[i] - mx);
    const double lse = mx + log(s);
    for (int32_t i = 0; i < V; i++) lp[i] = x[i] - lse;
}

/* Adds n positions: ref and fp8 are [n, V] logits; la, lb scratch of V. */
static void fp8_gate_add(fp8_gate *g, const float *ref, const float *fp8, int32_t n, int32_t V, double *la,
                         double *lb) {
    for (int32_t t = 0; t < n; t++) {
        fp8_gate_log_softmax(ref + (size_t)t * (size_t)V, V, la);
        fp8_gate_log_softmax(fp8 + (size_t)t * (size_t)V, V, lb);
        int32_t top = 0;
        double kl = 0;
        for (int32_t i = 0; i < V; i++) {
            if (la[i] > la[top]) top = i;
            kl += exp(la[i]) * (la[i] - lb[i]);
        }
        g->worst_dlp = fmax(g->worst_dlp, fabs(la[top] - lb[top]));
        g->worst_kl = fmax(g->worst_kl, kl);
        g->sum_kl += kl;
        g->positions++;
    }
}

/* Prints the figures ("what": model and comparison) and checks the bounds. */
static void fp8_gate_check(const fp8_gate *g, const char *what) {
    const double mean = g->positions ? g->sum_kl / g->positions : 0.0;
    printf("#   %s over %d positions: max |dlogprob(top)| %.4g, max KL %.3g, mean KL %.3g\n", what, g->positions,
           g->worst_dlp, g->worst_kl, mean);
    CHECK(g->positions > 0);
    CHECKF(g->worst_dlp <= FP8_MAX_DLP, "%s: max |dlogprob| %g > %g", what, g->worst_dlp, FP8_MAX_DLP);
    CHECKF(g->worst_kl <= FP8_MAX_KL, "%s: max KL %g > %g", what, g->worst_kl, FP8_MAX_KL);
    CHECKF(mean <= FP8_MEAN_KL, "%s: mean KL %g > %g", what, mean, FP8_MEAN_KL);
}

#endif
