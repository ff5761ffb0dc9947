/* test_moe_cuda.c — the CUDA backend's add_bias and moe_ffn ops against
 * the CPU backend (the reference), on random inputs that are never zero.
 *
 * moe_ffn runs at several shapes: tokens 1, 2, 4, 5, 7, 64, 300, 1000,
 * 2100 (and a chunked 4100), experts 8/16/64/128, top-k 1/2/4/8, with and
 * without renormalisation, covering the gathered GEMV (up to 4 tokens)
 * and the grouped GEMM's 16-, 64- and 128-row tile shapes;
 * hidden and expert widths that are not multiples of the kernels' tiles
 * (so every tail is exercised) and the Qwen3-30B-A3B layer shape. Each
 * shape runs as a prefill batch (one sequence, eager) and, up to 64
 * tokens, as a decode batch (one token per sequence): decode steps are
 * recorded, so the same step runs eagerly, is captured into a CUDA graph
 * and is replayed, each time with new inputs, and each result must match
 * the CPU — and a replay must actually have happened. A second backend
 * runs the alternative paths (unfused decode routing, grouped GEMVs
 * instead of 16-row GEMM tiles for a few rows per expert).
 *
 * Tolerances (relative L2 per comparison): the gathered-GEMV path (up to
 * 4 tokens) keeps activations in F32: 1e-4. The grouped-GEMM path rounds
 * the activations and the SwiGLU output to bf16 for the tensor cores:
 * 1e-2. Tokens whose top-k choice is a near tie (the k-th and (k+1)-th
 * router logits within 1e-4, computed on the host in double) may pick a
 * different expert on either backend: those rows are left out and
 * counted (there are a handful at most).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "engine/engine.h"
#include "engine/runner.h"
#include "model/model.h"
#include "test.h"

#define GPU_TEST_SEED 0x9e3779b97f4a7c15ULL
#define GPU_TEST_PAIRS /* OK(), pair (pair_alloc/upload/free) */
#define GPU_TEST_MODELS /* loaded, load_model, unload_model */
#include "gpu_test.h"

static float *rand_vec(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}

/* T tokens as one sequence (prefill: eager) or as T one-token sequences
 * (decode: recorded, captured, replayed). No KV pool: no attention runs. */
static void batch(int32_t T, int decode) {
    int32_t *pos = malloc((size_t)T * 4), *tok = calloc((size_t)T, 4), *ss = malloc(((size_t)T + 1) * 4),
            *sl = malloc((size_t)T * 4), pt[1] = {0};
    int32_t ns = decode ? T : 1;
    for (int32_t i = 0; i < T; i++) pos[i] = decode ? 9 : i;
    for (int32_t s = 0; s <= ns; s++) ss[s] = decode ? s : (s ? T : 0);
    for (int32_t s = 0; s < ns; s++) sl[s] = decode ? 10 : T;
    ns_batch b = {.n_tokens = T, .n_seqs = ns, .tokens = tok, .positions = pos, .seq_start = ss, .seq_len = sl,
                  .page_table = pt, .max_pages = 0, .logit_rows = NULL, .n_logits = 0};
    OK(cpu->ops->set_batch(cpu, &b, &_e));
    OK(gpu->ops->set_batch(gpu, &b, &_e));
    free(pos);
    free(tok);
    free(ss);
    free(sl);
}

static double rel_l2_rows(const float *a, const float *ref, int64_t rows, int64_t cols, const uint8_t *skip) {
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (skip && skip[r]) continue;
        for (int64_t i = r * cols; i < (r + 1) * cols; i++) {
            if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
            const double d = (double)a[i] - ref[i];
            num += d * d;
            den += (double)ref[i] * ref[i];
        }
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------ add_bias */

static void bias_case(int64_t rows, int64_t cols, int decode) {
    pair out;
    pair_alloc(&out, rows, cols);
    ns_tensor bc, bg;
    float *b = rand_vec((size_t)cols, 1.0f);
    OK(cpu->ops->weight_from_host(cpu, &bc, b, NS_DT_F32, 1, cols, &_e));
    OK(gpu->ops->weight_from_host(gpu, &bg, b, NS_DT_F32, 1, cols, &_e));
    const size_t n = (size_t)(rows * cols);
    float *a = malloc(n * 4), *g = malloc(n * 4);
    int64_t r0, c0, r1, c1;
    ns_cuda_graph_stats(gpu, &r0, &c0, &c0);
    (void)c1;
    for (int rep = 0; rep < (decode ? 3 : 1); rep++) {
        batch((int32_t)rows, decode);
        float *x = rand_vec(n, 2.0f);
        pair_upload(&out, x);
        cpu->ops->add_bias(cpu, &out.c, &bc);
        gpu->ops->add_bias(gpu, &out.g, &bg);
        OK(cpu->ops->tensor_download(cpu, &out.c, a, &_e));
        OK(gpu->ops->tensor_download(gpu, &out.g, g, &_e));
        size_t diff = 0;
        for (size_t i = 0; i < n; i++) diff += a[i] != g[i] || a[i] != x[i] + b[i % (size_t)cols];
        CHECKF(diff == 0, "add_bias %lldx%lld (%s, run %d): %zu values differ", (long long)rows, (long long)cols,
               decode ? "decode" : "prefill", rep, diff);
        free(x);
    }
    ns_cuda_graph_stats(gpu, &r1, &c1, &c1);
    if (decode) CHECKF(r1 > r0, "add_bias %lldx%lld: the decode step was never replayed from a graph", (long long)rows,
                       (long long)cols);
    free(a);
    free(g);
    free(b);
    cpu->ops->tensor_free(cpu, &bc);
    gpu->ops->tensor_free(gpu, &bg);
    pair_free(&out);
}

TEST(test_add_bias) {
    bias_case(1, 200, 0);
    bias_case(7, 200, 0);
    bias_case(300, 1024, 0);
    bias_case(1, 4096, 1);
    bias_case(64, 200, 1);
}

/* ------------------------------------------------------------- moe_ffn */

typedef struct {
    int E, H, F;
    ns_tensor rc, rg;     /* router */
    ns_tensor *xc, *xg;   /* experts, 3E each */
    float *router_host;   /* [E, H] as stored (bf16-rounded) */
    double tol;           /* 0: the BF16 tolerances (see the header); quantized experts: their own */
    uint8_t **host;       /* quantized experts: the 3E host block buffers (the CPU backend uses them in place) */
} moe_w;

/* The shape, the BF16 router (random with seed, on both backends, and its
 * host copy) and the empty 3E expert slots of w; moe_w_free frees them. */
static void moe_router_make(moe_w *w, int E, int H, int F, uint64_t seed) {
    memset(w, 0, sizeof *w);
    w->E = E, w->H = H, w->F = F;
    const float rs_ = 2.0f / sqrtf((float)H);
    OK(cpu->ops->weight_random(cpu, &w->rc, NS_DT_BF16, E, H, seed, rs_, &_e));
    OK(gpu->ops->weight_random(gpu, &w->rg, NS_DT_BF16, E, H, seed, rs_, &_e));
    w->router_host = malloc((size_t)E * H * 4);
    OK(cpu->ops->tensor_download(cpu, &w->rc, w->router_host, &_e));
    w->xc = calloc((size_t)3 * E, sizeof *w->xc);
    w->xg = calloc((size_t)3 * E, sizeof *w->xg);
}

static void moe_w_make(moe_w *w, int E, int H, int F, uint64_t seed) {
    moe_router_make(w, E, H, F, seed);
    const float gs = 1.0f / sqrtf((float)H), ds = 1.0f / sqrtf((float)F);
    for (int i = 0; i < 3 * E; i++) {
        const int down = i >= 2 * E;
        const int64_t r = down ? H : F, cl = down ? F : H;
        OK(cpu->ops->weight_random(cpu, &w->xc[i], NS_DT_BF16, r, cl, seed + 1 + (uint64_t)i, down ? ds : gs, &_e));
        OK(gpu->ops->weight_random(gpu, &w->xg[i], NS_DT_BF16, r, cl, seed + 1 + (uint64_t)i, down ? ds : gs, &_e));
    }
}

static void moe_w_free(moe_w *w) {
    for (int i = 0; i < 3 * w->E; i++) {
        cpu->ops->tensor_free(cpu, &w->xc[i]);
        gpu->ops->tensor_free(gpu, &w->xg[i]);
    }
    cpu->ops->tensor_free(cpu, &w->rc);
    gpu->ops->tensor_free(gpu, &w->rg);
    free(w->xc);
    free(w->xg);
    free(w->router_host);
    if (w->host)
        for (int i = 0; i < 3 * w->E; i++) free(w->host[i]);
    free(w->host);
}

/* Marks tokens whose k-th and (k+1)-th router logits are within 1e-4
 * (double precision on the host): either expert may be chosen. */
static int near_ties(const moe_w *w, const float *x, int T, int K, uint8_t *skip) {
    int n = 0;
    double *lg = malloc((size_t)w->E * sizeof *lg);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < w->E; e++) {
            double s = 0;
            for (int h = 0; h < w->H; h++) s += (double)x[(size_t)t * w->H + h] * w->router_host[(size_t)e * w->H + h];
            lg[e] = s;
        }
        /* k-th and (k+1)-th largest by partial selection */
        double kth = 0, next = -INFINITY;
        uint8_t *used = calloc((size_t)w->E, 1);
        for (int j = 0; j <= K && j < w->E; j++) {
            int best = -1;
            for (int e = 0; e < w->E; e++)
                if (!used[e] && (best < 0 || lg[e] > lg[best])) best = e;
            used[best] = 1;
            if (j == K - 1) kth = lg[best];
            if (j == K) next = lg[best];
        }
        free(used);
        skip[t] = K < w->E && kth - next < 1e-4;
        n += skip[t];
    }
    free(lg);
    return n;
}

/* One moe_ffn comparison at T tokens; returns the worst rel L2. */
static double moe_run(const moe_w *w, pair *in, pair *out, int T, int K, bool norm, int decode, int reps,
                      const char *what) {
    const size_t nx = (size_t)T * w->H;
    float *a = malloc(nx * 4), *g = malloc(nx * 4);
    uint8_t *skip = calloc((size_t)T, 1);
    const double tol = w->tol > 0 ? w->tol : T <= 4 ? 1e-4 : 1e-2;
    double worst = 0;
    int64_t r0, c0, r1, c1;
    ns_cuda_graph_stats(gpu, &r0, &c0, &c0);
    ns_tensor ic = in->c, ig = in->g, oc = out->c, og = out->g;
    ic.rows = ig.rows = oc.rows = og.rows = T;
    for (int rep = 0; rep < reps; rep++) {
        batch(T, decode);
        float *x = rand_vec(nx, 1.0f), *o = rand_vec(nx, 0.5f);
        OK(cpu->ops->tensor_upload(cpu, &ic, x, &_e));
        OK(gpu->ops->tensor_upload(gpu, &ig, x, &_e));
        OK(cpu->ops->tensor_upload(cpu, &oc, o, &_e));
        OK(gpu->ops->tensor_upload(gpu, &og, o, &_e));
        cpu->ops->moe_ffn(cpu, &oc, &ic, &w->rc, w->xc, w->E, K, norm);
        gpu->ops->moe_ffn(gpu, &og, &ig, &w->rg, w->xg, w->E, K, norm);
        OK(cpu->ops->tensor_download(cpu, &oc, a, &_e));
        OK(gpu->ops->tensor_download(gpu, &og, g, &_e));
        const int ties = near_ties(w, x, T, K, skip);
        /* the MoE contribution alone, so the residual does not hide errors */
        for (size_t i = 0; i < nx; i++) {
            a[i] -= o[i];
            g[i] -= o[i];
        }
        const double e = rel_l2_rows(g, a, T, w->H, skip);
        if (e > worst) worst = e;
        CHECKF(e <= tol, "%s run %d: rel L2 %.3g > %.3g (%d near-tie tokens left out)", what, rep, e, tol, ties);
        CHECKF(ties * 20 <= T + 20, "%s: %d of %d tokens are near ties", what, ties, T);
        free(x);
        free(o);
    }
    ns_cuda_graph_stats(gpu, &r1, &c1, &c1);
    if (decode && reps >= 3) CHECKF(r1 > r0, "%s: the decode step was never replayed from a graph", what);
    printf("#   %-52s rel L2 %.3g\n", what, worst);
    free(a);
    free(g);
    free(skip);
    return worst;
}

typedef struct {
    int T, E, K;
    bool norm;
} moe_case;

static void moe_cases(int H, int F, const moe_case *cs, int n, const char *shape) {
    int maxT = 0;
    for (int i = 0; i < n; i++) maxT = cs[i].T > maxT ? cs[i].T : maxT;
    pair in, out;
    pair_alloc(&in, maxT, H);
    pair_alloc(&out, maxT, H);
    for (int i = 0; i < n; i++) {
        moe_w w;
        moe_w_make(&w, cs[i].E, H, F, 1000 + (uint64_t)i * 7919);
        char what[96];
        snprintf(what, sizeof what, "%s T=%d E=%d K=%d%s prefill", shape, cs[i].T, cs[i].E, cs[i].K,
                 cs[i].norm ? " norm" : "");
        moe_run(&w, &in, &out, cs[i].T, cs[i].K, cs[i].norm, 0, 1, what);
        if (cs[i].T <= 64) {
            snprintf(what, sizeof what, "%s T=%d E=%d K=%d%s decode x3", shape, cs[i].T, cs[i].E, cs[i].K,
                     cs[i].norm ? " norm" : "");
            moe_run(&w, &in, &out, cs[i].T, cs[i].K, cs[i].norm, 1, 3, what);
        }
        moe_w_free(&w);
    }
    pair_free(&in);
    pair_free(&out);
}

TEST(test_moe_shapes) {
    /* hidden 200 and expert width 104: neither is a multiple of the GEMM
     * tiles (64) or K step (32), so every tail runs */
    static const moe_case cs[] = {
        {1, 8, 2, true},    {2, 8, 1, false},    {7, 8, 2, true},    {64, 8, 8, true},   {300, 8, 1, true},
        {1, 64, 8, true},   {7, 64, 8, false},   {64, 64, 8, true},  {300, 64, 8, false}, {1, 128, 8, true},
        {2, 128, 8, false}, {7, 128, 1, true},   {64, 128, 2, false}, {300, 128, 8, true}, {4, 128, 8, true},
        {5, 128, 8, true},  {300, 8, 2, false},  {300, 8, 8, true},  {1000, 16, 4, true},
    };
    moe_cases(200, 104, cs, (int)(sizeof cs / sizeof cs[0]), "H=200 F=104");
}

TEST(test_moe_qwen3_30b_layer) {
    /* one Qwen3-30B-A3B layer: hidden 2048, 128 experts of 768, top 8:
     * gathered GEMV at 1 token, the grouped GEMM's 16-, 64- and 128-row
     * tiles at 64, 300 and 2100 */
    static const moe_case cs[] = {{1, 128, 8, true}, {64, 128, 8, true}, {300, 128, 8, true}, {2100, 128, 8, true}};
    pair in, out;
    pair_alloc(&in, 2100, 2048);
    pair_alloc(&out, 2100, 2048);
    moe_w w;
    moe_w_make(&w, 128, 2048, 768, 77);
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        char what[96];
        snprintf(what, sizeof what, "qwen3-30b layer T=%d prefill", cs[i].T);
        moe_run(&w, &in, &out, cs[i].T, 8, true, 0, 1, what);
        if (cs[i].T <= 64) {
            snprintf(what, sizeof what, "qwen3-30b layer T=%d decode x3", cs[i].T);
            moe_run(&w, &in, &out, cs[i].T, 8, true, 1, 3, what);
        }
    }
    moe_w_free(&w);
    pair_free(&in);
    pair_free(&out);
}

TEST(test_moe_chunked_prefill) {
    /* more tokens than one pass takes (CU_MOE_CHUNK = 4096) */
    static const moe_case cs[] = {{4100, 8, 2, true}};
    moe_cases(64, 32, cs, 1, "H=64 F=32");
}

/* A second CUDA backend made with the environment switches names[i] =
 * values[i] set, and unset again right after, so the main backend and
 * later ones keep the defaults. NULL (and a failed CHECKF) when it cannot
 * be made; the caller destroys it. */
static ns_backend *alt_backend(const char *const *names, const char *const *values, int n) {
    for (int i = 0; i < n; i++) setenv(names[i], values[i], 1);
    ns_backend *g2 = NULL;
    ns_error err = {0};
    ns_status rc = ns_backend_cuda_create(0, &g2, &err);
    for (int i = 0; i < n; i++) unsetenv(names[i]);
    CHECKF(rc == NS_OK, "second cuda backend: %s", err.msg);
    return rc == NS_OK ? g2 : NULL;
}

TEST(test_moe_alternative_paths) {
    /* NS_CUDA_MOE_FUSE=0: decode routing as two launches (router logits,
     * then top-k) instead of the fused router whose last block selects;
     * NS_CUDA_MOE_GGEMV=1: a few rows per expert through grouped GEMVs
     * instead of 16-row GEMM tiles */
    static const char *const names[] = {"NS_CUDA_MOE_FUSE", "NS_CUDA_MOE_GGEMV"}, *const values[] = {"0", "1"};
    ns_backend *g2 = alt_backend(names, values, 2), *keep = gpu;
    if (!g2) return;
    gpu = g2;
    static const moe_case cs[] = {{1, 128, 8, true},  {2, 8, 2, false},  {4, 64, 8, true},
                                  {7, 8, 2, true},    {64, 128, 8, true}, {64, 64, 2, false}};
    moe_cases(200, 104, cs, (int)(sizeof cs / sizeof cs[0]), "alt paths H=200 F=104");
    gpu = keep;
    g2->ops->destroy(g2);
}

/* ------------------------------------------------- quantized experts */

/* Experts as random GGUF blocks (gpu_test.h): gate and up of type tgu,
 * down of type td, the same host bytes uploaded to both backends; the
 * router BF16 as in moe_w_make. */
static void qmoe_w_make(moe_w *w, int E, int H, int F, ns_dtype tgu, ns_dtype td, uint64_t seed) {
    moe_router_make(w, E, H, F, seed);
    w->host = calloc((size_t)3 * E, sizeof *w->host);
    for (int i = 0; i < 3 * E; i++) {
        const int down = i >= 2 * E;
        const ns_dtype dt = down ? td : tgu;
        const int64_t r = down ? H : F, cl = down ? F : H;
        /* kept until moe_w_free: the CPU backend reads GGUF blocks in
         * place (a GGUF file's mmap), it does not copy them */
        w->host[i] = random_weight(dt, r, cl);
        OK(cpu->ops->weight_from_host(cpu, &w->xc[i], w->host[i], dt, r, cl, &_e));
        OK(gpu->ops->weight_from_host(gpu, &w->xg[i], w->host[i], dt, r, cl, &_e));
    }
    /* Both sides quantize activations (the token rows and the SwiGLU
     * output) to 8 bits, CUDA per 32 values with F32 scales, the CPU per
     * 32 (Q8_0, f16 scales) or per 256 (Q8_K, for k-quants); the grouped
     * GEMM path instead multiplies bf16 copies of the weights with bf16
     * activations. On these random blocks the CPU itself is 1.0-2.1%
     * (relative L2) from the exact product of the dequantized weights
     * (measured on the host: Q8_0 1.0%, Q4_0 1.0%, Q6_K 1.6%, Q4_K 1.7%,
     * Q5_K 2.1%), so CUDA against the CPU can differ by the sum: 5e-2. A
     * wrong block format, row or expert gives O(1). */
    w->tol = 5e-2;
}

typedef struct {
    ns_dtype gu, down;
} qpair;

/* Every (gate/up, down) type pair at hidden 256, expert width 512, 8
 * experts, top 2: the gathered GEMVs (1, 4 tokens; decode steps captured
 * and replayed), the grouped GEMVs on the blocks (7 and 64 tokens: up to
 * 16 slots per expert) and the dequantize-then-grouped-GEMM path (300
 * tokens, 64-row tiles). */
static void qmoe_cases(const qpair *ts, int n, const char *label) {
    static const moe_case cs[] = {{1, 8, 2, true}, {4, 8, 2, false}, {7, 8, 2, true}, {64, 8, 2, true},
                                  {300, 8, 2, true}};
    const int H = 256, F = 512;
    pair in, out;
    pair_alloc(&in, 300, H);
    pair_alloc(&out, 300, H);
    for (int t = 0; t < n; t++) {
        moe_w w;
        qmoe_w_make(&w, 8, H, F, ts[t].gu, ts[t].down, 500 + (uint64_t)t);
        for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
            char what[112];
            const int dec = cs[i].T <= 64 && cs[i].T != 4;
            snprintf(what, sizeof what, "%s %s/%s T=%d %s", label, ns_dtype_name(ts[t].gu), ns_dtype_name(ts[t].down),
                     cs[i].T, dec ? "decode x3" : "prefill");
            moe_run(&w, &in, &out, cs[i].T, cs[i].K, cs[i].norm, dec, dec ? 3 : 1, what);
        }
        moe_w_free(&w);
    }
    pair_free(&in);
    pair_free(&out);
}

static const qpair QPAIRS[] = {{NS_DT_Q8_0, NS_DT_Q8_0}, {NS_DT_Q4_0, NS_DT_Q4_0}, {NS_DT_Q4_K, NS_DT_Q4_K},
                               {NS_DT_Q5_K, NS_DT_Q5_K}, {NS_DT_Q6_K, NS_DT_Q6_K}, {NS_DT_Q4_1, NS_DT_Q4_1},
                               {NS_DT_Q5_0, NS_DT_Q5_0}, {NS_DT_Q5_1, NS_DT_Q5_1}, {NS_DT_Q4_K, NS_DT_Q6_K},
                               {NS_DT_Q5_K, NS_DT_Q8_0}};

TEST(test_moe_quant_types) { qmoe_cases(QPAIRS, (int)(sizeof QPAIRS / sizeof QPAIRS[0]), "quant"); }

TEST(test_moe_quant_qwen3_30b_layer) {
    /* one Qwen3-30B-A3B layer as a Q4_K_M file holds it: gate/up Q4_K,
     * down Q6_K; hidden 2048, 128 experts of 768, top 8 */
    static const moe_case cs[] = {{1, 128, 8, true}, {64, 128, 8, true}, {300, 128, 8, true}};
    pair in, out;
    pair_alloc(&in, 300, 2048);
    pair_alloc(&out, 300, 2048);
    moe_w w;
    qmoe_w_make(&w, 128, 2048, 768, NS_DT_Q4_K, NS_DT_Q6_K, 91);
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        char what[96];
        const int dec = cs[i].T <= 64;
        snprintf(what, sizeof what, "qwen3-30b Q4_K/Q6_K layer T=%d %s", cs[i].T, dec ? "decode x3" : "prefill");
        moe_run(&w, &in, &out, cs[i].T, 8, true, dec, dec ? 3 : 1, what);
    }
    moe_w_free(&w);
    pair_free(&in);
    pair_free(&out);
}

TEST(test_moe_quant_alternative_paths) {
    /* batched decode through the experts' bf16 copies (NS_CUDA_MOE_QGGEMV=0)
     * and the bf16 grouped GEMVs (NS_CUDA_MOE_GGEMV=1), and the unfused
     * decode routing */
    static const char *const names[] = {"NS_CUDA_MOE_FUSE", "NS_CUDA_MOE_GGEMV", "NS_CUDA_MOE_QGGEMV"},
                             *const values[] = {"0", "1", "0"};
    ns_backend *g2 = alt_backend(names, values, 3), *keep = gpu;
    if (!g2) return;
    gpu = g2;
    static const qpair ts[] = {{NS_DT_Q4_K, NS_DT_Q6_K}, {NS_DT_Q8_0, NS_DT_Q4_0}};
    qmoe_cases(ts, 2, "alt paths quant");
    gpu = keep;
    g2->ops->destroy(g2);
}

TEST(test_moe_quant_mixed_stack_fails) {
    /* gate Q4_K, up Q5_K: refused with an error naming the types (the
     * GGUF loader refuses such a file at load already). On a backend of
     * its own: the error stays with it. */
    ns_backend *g2 = NULL, *keepb = gpu;
    ns_error e2 = {0};
    if (ns_backend_cuda_create(0, &g2, &e2) != NS_OK) {
        CHECKF(0, "second cuda backend: %s", e2.msg);
        return;
    }
    gpu = g2;
    moe_w w;
    qmoe_w_make(&w, 8, 256, 256, NS_DT_Q4_K, NS_DT_Q4_K, 7);
    ns_tensor up5 = {0};
    uint8_t *b = random_weight(NS_DT_Q5_K, 256, 256);
    OK(gpu->ops->weight_from_host(gpu, &up5, b, NS_DT_Q5_K, 256, 256, &_e));
    free(b);
    ns_tensor keep = w.xg[8];
    w.xg[8] = up5; /* expert 0's up */
    pair in, out;
    pair_alloc(&in, 1, 256);
    pair_alloc(&out, 1, 256);
    batch(1, 0);
    gpu->ops->moe_ffn(gpu, &out.g, &in.g, &w.rg, w.xg, 8, 2, true);
    ns_error err = {0};
    const ns_status rc = gpu->ops->sync(gpu, &err);
    CHECKF(rc != NS_OK, "moe_ffn with gate Q4_K and one up expert Q5_K did not fail");
    if (rc != NS_OK) printf("#   error as expected: %s\n", err.msg);
    CHECKF(rc == NS_OK || strstr(err.msg, "q5_k") != NULL, "the error does not name the type: %s", err.msg);
    w.xg[8] = keep;
    gpu->ops->tensor_free(gpu, &up5);
    pair_free(&in);
    pair_free(&out);
    moe_w_free(&w);
    gpu = keepb;
    g2->ops->destroy(g2);
}

/* ------------------------------------------------- GGUF MoE fixtures */

typedef struct {
    int32_t vocab, n;
    float *last; /* the prompt's last row */
} last_ctx;

static void on_rows(void *p, int32_t first, int32_t n_rows, const float *logits) {
    last_ctx *x = p;
    if (first + n_rows == x->n) memcpy(x->last, logits + (size_t)(n_rows - 1) * x->vocab, (size_t)x->vocab * 4);
}

static int32_t argmax_of(const float *row, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[b]) b = i;
    return b;
}

static int32_t json_ints(json_t *a, int32_t *out, int32_t cap) {
    const int32_t n = (int32_t)json_array_size(a);
    for (int32_t i = 0; i < n && i < cap; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n < cap ? n : cap;
}

/* One prompt of the fixture (a line of its .llama.jsonl): the last
 * position's 64 largest llama.cpp logits against CUDA, and CUDA against
 * the CPU backend there; then llama.cpp's 32 greedy tokens are fed to
 * both engines and, at every step where llama.cpp's top-2 margin is clear
 * (above 2 tol), CUDA's argmax must be llama.cpp's token. */
static void gguf_prompt(const char *file, loaded *C, loaded *G, json_t *j, double tol, double *err_llama,
                        double *err_cpu, int *steps) {
    ns_error err = {0};
    int32_t ids[256], greedy[64];
    const int32_t n = json_ints(json_object_get(j, "ids"), ids, 256);
    const int32_t ng = json_ints(json_object_get(j, "greedy"), greedy, 64);
    json_t *gm = json_object_get(j, "greedy_margin"), *top = json_object_get(j, "top");
    const int32_t V = C->m->cfg.vocab_size;
    last_ctx lc = {V, n, malloc((size_t)V * 4)}, lg = {V, n, malloc((size_t)V * 4)};
    ns_runner rc, rg;
    CHECK(ns_runner_init(&rc, C->e, &err) == NS_OK);
    CHECK(ns_runner_init(&rg, G->e, &err) == NS_OK);
    CHECKF(ns_runner_feed(&rc, ids, n, true, on_rows, &lc, &err) == NS_OK, "cpu: %s", err.msg);
    CHECKF(ns_runner_feed(&rg, ids, n, true, on_rows, &lg, &err) == NS_OK, "cuda: %s", err.msg);
    int bad_l = 0, bad_c = 0;
    for (size_t i = 0; i < json_array_size(top); i++) {
        json_t *pr = json_array_get(top, i);
        const int32_t id = (int32_t)json_integer_value(json_array_get(pr, 0));
        if (id < 0 || id >= V) continue;
        const double want = json_number_value(json_array_get(pr, 1));
        const double el = fabs((double)lg.last[id] - want), ec = fabs((double)lg.last[id] - lc.last[id]);
        bad_l += !(el <= tol);
        bad_c += !(ec <= tol);
        if (el > *err_llama || isnan(el)) *err_llama = el;
        if (ec > *err_cpu || isnan(ec)) *err_cpu = ec;
    }
    CHECKF(bad_l == 0 && json_array_size(top) == 64, "%s: %d of llama.cpp's top-64 logits differ by more than %g", file,
           bad_l, tol);
    CHECKF(bad_c == 0, "%s: %d of the top-64 logits differ from the CPU backend's by more than %g", file, bad_c, tol);
    const float *row = lg.last;
    for (int32_t i = 0; i < ng; i++) {
        const double m = json_number_value(json_array_get(gm, (size_t)i));
        if (m > 2 * tol) {
            const int32_t got = argmax_of(row, V);
            CHECKF(got == greedy[i], "%s: greedy step %d: cuda %d, llama.cpp %d (margin %.3g)", file, i, got, greedy[i],
                   m);
            (*steps)++;
        }
        if (ns_runner_feed(&rg, &greedy[i], 1, false, NULL, NULL, &err) != NS_OK ||
            ns_runner_feed(&rc, &greedy[i], 1, false, NULL, NULL, &err) != NS_OK) {
            CHECKF(0, "%s: decode: %s", file, err.msg);
            break;
        }
        row = rg.logits;
    }
    ns_runner_free(&rc);
    ns_runner_free(&rg);
    free(lc.last);
    free(lg.last);
}

/* Tolerance 1.0 (logits of magnitude ~30): CUDA quantizes activations
 * per 32 values with F32 scales, llama.cpp and the CPU backend per 256
 * (Q8_K) for k-quant weights; tiny-qwen3-k's files measure 0.56-0.72 the
 * same way (test_quant_cuda). The CPU backend matches llama.cpp to 1.4e-5
 * on these files (tests/unit/model/test_gguf_logits.c). */
static void gguf_moe_fixture(const char *name) {
    const double tol = 1.0;
    char ref[1024];
    loaded C, G;
    FILE *f = NULL;
    if (!fixture_open(name, &C, &G, ref, sizeof ref, &f)) return;
    int64_t r0 = 0, r1 = 0, cap, eager;
    ns_cuda_graph_stats(gpu, &r0, &cap, &eager);
    double el = 0, ec = 0;
    int steps = 0, prompts = 0;
    static char line[1 << 16];
    while (f && fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) continue;
        gguf_prompt(name, &C, &G, j, tol, &el, &ec, &steps);
        prompts++;
        json_decref(j);
    }
    if (f) fclose(f);
    ns_cuda_graph_stats(gpu, &r1, &cap, &eager);
    CHECKF(prompts == 3, "%s: %d prompts", ref, prompts);
    CHECKF(steps >= 10, "%s: only %d clear greedy steps compared", name, steps);
    CHECKF(r1 > r0, "%s: decode never replayed a graph", name);
    printf("#   %s: max |cuda - llama.cpp| %.3g, |cuda - cpu| %.3g over the top-64 (tolerance %g); %d greedy steps; "
           "%lld graph replays\n",
           name, el, ec, tol, steps, (long long)(r1 - r0));
    unload_model(&G);
    unload_model(&C);
}

TEST(test_moe_gguf_q4_k) { gguf_moe_fixture("tiny-qwen3moe-k-Q4_K"); }

/* tiny-qwen3moe-k-Q4_K.gguf with blk.0.ffn_up_exps relabelled Q4_0 (the
 * same 0.5625 bytes per value, so the file stays well-formed): the CPU
 * loads it (any type per tensor), the CUDA device refuses it at load,
 * naming the tensors and both types, instead of failing at the first
 * forward. */
TEST(test_moe_gguf_mixed_gate_up_refused_at_load) {
    char path[1024], tmp[] = "/tmp/ns_moe_mixed_XXXXXX";
    snprintf(path, sizeof path, "%s/gguf/tiny-qwen3moe-k-Q4_K.gguf", test_shared_path(""));
    FILE *f = fopen(path, "rb");
    CHECKF(f != NULL, "%s: cannot open", path);
    if (!f) return;
    static uint8_t buf[1 << 20];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    CHECKF(n > 0 && n < sizeof buf, "%s: %zu bytes", path, n);
    static const char name[] = "blk.0.ffn_up_exps.weight";
    const size_t nl = sizeof name - 1;
    uint8_t *at = NULL;
    for (size_t i = 8; i + nl + 4 + 24 + 4 <= n && !at; i++)
        if (!memcmp(buf + i, name, nl) && buf[i - 8] == nl) at = buf + i + nl; /* after the u64 length */
    CHECKF(at != NULL, "%s: tensor %s not found", path, name);
    if (!at) return;
    uint32_t dims, type;
    memcpy(&dims, at, 4);
    memcpy(&type, at + 4 + 8 * dims, 4);
    CHECKF(dims == 3 && type == 12, "%s: %s has %u dims, type %u (expected 3, Q4_K = 12)", path, name, dims, type);
    type = 2; /* Q4_0 */
    memcpy(at + 4 + 8 * dims, &type, 4);
    const int fd = mkstemp(tmp);
    CHECKF(fd >= 0, "mkstemp failed");
    if (fd < 0) return;
    FILE *o = fdopen(fd, "wb");
    CHECK(o && fwrite(buf, 1, n, o) == n);
    if (o) fclose(o);
    ns_model *m = NULL;
    ns_error err = {0};
    ns_status rc = ns_model_load(tmp, cpu, &m, &err);
    CHECKF(rc == NS_OK, "cpu refused the mixed file: %s", err.msg);
    ns_model_free(m);
    m = NULL;
    memset(&err, 0, sizeof err);
    rc = ns_model_load(tmp, gpu, &m, &err);
    CHECKF(rc != NS_OK, "cuda loaded a file with gate Q4_K and up Q4_0 experts");
    CHECKF(rc == NS_OK || (strstr(err.msg, "ffn_up_exps") && strstr(err.msg, "Q4_0") && strstr(err.msg, "Q4_K")),
           "the error does not name the tensor and the types: %s", err.msg);
    if (rc != NS_OK) printf("#   refused as expected: %s\n", err.msg);
    ns_model_free(m);
    unlink(tmp);
}
TEST(test_moe_gguf_q4_k_m) { gguf_moe_fixture("tiny-qwen3moe-k-Q4_K_M"); }

TEST(test_moe_bad_shapes_fail) {
    /* a hidden size that is not a multiple of 8 is refused with an error
     * at the next sync, never run */
    ns_backend *g2 = NULL;
    ns_error err = {0};
    if (ns_backend_cuda_create(0, &g2, &err) != NS_OK) {
        CHECKF(0, "second cuda backend: %s", err.msg);
        return;
    }
    ns_tensor in, out, r, ex[3];
    OK(g2->ops->tensor_alloc(g2, &in, NS_DT_F32, 2, 12, &_e));
    OK(g2->ops->tensor_alloc(g2, &out, NS_DT_F32, 2, 12, &_e));
    OK(g2->ops->weight_random(g2, &r, NS_DT_BF16, 1 + 1, 12, 1, 1.0f, &_e));
    OK(g2->ops->weight_random(g2, &ex[0], NS_DT_BF16, 8, 12, 2, 1.0f, &_e));
    OK(g2->ops->weight_random(g2, &ex[1], NS_DT_BF16, 8, 12, 3, 1.0f, &_e));
    OK(g2->ops->weight_random(g2, &ex[2], NS_DT_BF16, 12, 8, 4, 1.0f, &_e));
    int32_t tok[2] = {0, 0}, pos[2] = {0, 1}, ss[2] = {0, 2}, sl[1] = {2}, pt[1] = {0};
    ns_batch b = {.n_tokens = 2, .n_seqs = 1, .tokens = tok, .positions = pos, .seq_start = ss, .seq_len = sl,
                  .page_table = pt, .max_pages = 0};
    OK(g2->ops->set_batch(g2, &b, &_e));
    ns_tensor r1 = r;
    r1.rows = 1;
    g2->ops->moe_ffn(g2, &out, &in, &r1, ex, 1, 1, true);
    ns_status rc = g2->ops->sync(g2, &err);
    CHECKF(rc != NS_OK, "moe_ffn with hidden 12 did not fail");
    if (rc != NS_OK) printf("#   error as expected: %s\n", err.msg);
    g2->ops->tensor_free(g2, &in);
    g2->ops->tensor_free(g2, &out);
    g2->ops->tensor_free(g2, &r);
    for (int i = 0; i < 3; i++) g2->ops->tensor_free(g2, &ex[i]);
    g2->ops->destroy(g2);
}

int main(void) {
    if (!gpu_test_open(8)) return 1;
    RUN(test_add_bias);
    RUN(test_moe_shapes);
    RUN(test_moe_qwen3_30b_layer);
    RUN(test_moe_chunked_prefill);
    RUN(test_moe_alternative_paths);
    RUN(test_moe_bad_shapes_fail);
    RUN(test_moe_quant_types);
    RUN(test_moe_quant_qwen3_30b_layer);
    RUN(test_moe_quant_alternative_paths);
    RUN(test_moe_quant_mixed_stack_fails);
    RUN(test_moe_gguf_q4_k);
    RUN(test_moe_gguf_q4_k_m);
    RUN(test_moe_gguf_mixed_gate_up_refused_at_load);
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END;
}
