/* test_ops.c — op conformance: every op of backend.h on the CPU backend
 * (the reference) and the CUDA backend, on random inputs, compared by
 * relative L2 error.
 *
 * Rules: inputs are random and never zeros; every output is poisoned with
 * NaN before the op, so an unwritten element fails the comparison; inputs
 * that the CUDA backend rounds to bf16 (matmul activations, KV) are drawn
 * bf16-exact where the test wants to see only accumulation-order error,
 * and plain float where it checks the bf16 tolerance (~1e-2). Tolerances:
 * elementwise ops 1e-5, GEMMs on bf16-exact inputs 1e-4, GEMMs on float
 * inputs and the tensor-core prefill attention 1e-2.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "sample/sample.h"
#include "test.h"

#define GPU_TEST_SEED 0x1234567887654321ULL
#define GPU_TEST_PAIRS
#define GPU_TEST_ATTENTION /* attn_cfg, seq_spec, batch_buf, check_by_seq */
#include "gpu_test.h"

static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float *rand_vec(size_t n, float scale, int bf_exact) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        float v = frand() * scale;
        x[i] = bf_exact ? bf16_round(v) : v;
        if (x[i] == 0.0f) x[i] = scale * 0.25f;
    }
    return x;
}

/* Downloads both and checks rel L2 <= tol over the first rows. */
static double pair_check(pair *p, int64_t rows, double tol, const char *what) {
    size_t n = (size_t)(rows * p->cols);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    ns_tensor vc = p->c, vg = p->g;
    vc.rows = vg.rows = rows;
    OK(cpu->ops->tensor_download(cpu, &vc, a, &_e));
    OK(gpu->ops->tensor_download(gpu, &vg, b, &_e));
    double e = rel_l2(b, a, n);
    CHECKF(e <= tol, "%s: rel L2 error %.3g > %.3g", what, e, tol);
    fprintf(stdout, "#   %-44s rel L2 %.3g\n", what, e);
    free(a);
    free(b);
    return e;
}

/* BF16 weight with the same (bf16-exact) values on both backends. */
static void weight_pair(ns_tensor *wc, ns_tensor *wg, const float *x, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(x[i]);
    OK(cpu->ops->weight_from_host(cpu, wc, h, NS_DT_BF16, rows, cols, &_e));
    OK(gpu->ops->weight_from_host(gpu, wg, h, NS_DT_BF16, rows, cols, &_e));
    /* the CPU backend may borrow h in place: keep it alive for the test */
    (void)h;
}

/* F32 vector weight (norms) on both backends. */
static void vec_pair(ns_tensor *wc, ns_tensor *wg, const float *x, int64_t cols) {
    OK(cpu->ops->weight_from_host(cpu, wc, x, NS_DT_F32, 1, cols, &_e));
    OK(gpu->ops->weight_from_host(gpu, wg, x, NS_DT_F32, 1, cols, &_e));
}

/* One sequence of T tokens ending at position end-1, no KV pool needed. */
static void simple_batch(int32_t T, int32_t end, int32_t n_logits, const int32_t *logit_rows, const int32_t *tokens) {
    int32_t *pos = malloc((size_t)T * 4), *tok = malloc((size_t)T * 4);
    for (int32_t i = 0; i < T; i++) {
        pos[i] = end - T + i;
        tok[i] = tokens ? tokens[i] : 1;
    }
    int32_t ss[2] = {0, T}, sl[1] = {end}, pt[1] = {0};
    ns_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .positions = pos, .seq_start = ss, .seq_len = sl,
                  .page_table = pt, .max_pages = 0, .logit_rows = logit_rows, .n_logits = n_logits};
    OK(cpu->ops->set_batch(cpu, &b, &_e));
    OK(gpu->ops->set_batch(gpu, &b, &_e));
    free(pos);
    free(tok);
}

/* ------------------------------------------------------------ weights */

TEST(test_weight_random_matches_cpu) {
    const int64_t R = 257, C = 1000;
    ns_tensor wc, wg, vc, vg;
    OK(cpu->ops->weight_random(cpu, &wc, NS_DT_BF16, R, C, 42, 0.125f, &_e));
    OK(gpu->ops->weight_random(gpu, &wg, NS_DT_BF16, R, C, 42, 0.125f, &_e));
    OK(cpu->ops->weight_random(cpu, &vc, NS_DT_BF16, 1, C, 43, 1.0f, &_e));
    OK(gpu->ops->weight_random(gpu, &vg, NS_DT_BF16, 1, C, 43, 1.0f, &_e));
    float *a = malloc(R * C * 4), *b = malloc(R * C * 4);
    OK(cpu->ops->tensor_download(cpu, &wc, a, &_e));
    OK(gpu->ops->tensor_download(gpu, &wg, b, &_e));
    size_t diff = 0, zeros = 0;
    for (int64_t i = 0; i < R * C; i++) {
        if (memcmp(&a[i], &b[i], 4) != 0) diff++;
        if (b[i] == 0.0f) zeros++;
    }
    CHECKF(diff == 0, "%zu of %lld matrix values differ", diff, (long long)(R * C));
    CHECKF(zeros < (size_t)(R * C) / 1000, "%zu zeros", zeros);
    OK(cpu->ops->tensor_download(cpu, &vc, a, &_e));
    OK(gpu->ops->tensor_download(gpu, &vg, b, &_e));
    diff = 0;
    for (int64_t i = 0; i < C; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) diff++;
    CHECKF(diff == 0, "%zu of %lld vector values differ", diff, (long long)C);
    free(a);
    free(b);
    cpu->ops->tensor_free(cpu, &wc);
    gpu->ops->tensor_free(gpu, &wg);
    cpu->ops->tensor_free(cpu, &vc);
    gpu->ops->tensor_free(gpu, &vg);
}

TEST(test_weight_from_host_f32_rounds_to_bf16) {
    const int64_t R = 33, C = 48;
    float *x = rand_vec((size_t)(R * C), 3.0f, 0);
    ns_tensor wg;
    OK(gpu->ops->weight_from_host(gpu, &wg, x, NS_DT_F32, R, C, &_e));
    CHECK_EQ_INT(wg.dtype, NS_DT_BF16);
    float *b = malloc(R * C * 4);
    OK(gpu->ops->tensor_download(gpu, &wg, b, &_e));
    size_t bad = 0;
    for (int64_t i = 0; i < R * C; i++)
        if (b[i] != bf16_round(x[i])) bad++;
    CHECKF(bad == 0, "%zu values not rounded to nearest bf16", bad);
    gpu->ops->tensor_free(gpu, &wg);
    free(x);
    free(b);
}

/* ---------------------------------------------------- elementwise ops */

TEST(test_embed) {
    const int64_t V = 1000, Dm = 256, T = 37;
    float *tab = rand_vec((size_t)(V * Dm), 1.0f, 1);
    ns_tensor tc, tg;
    weight_pair(&tc, &tg, tab, V, Dm);
    int32_t tok[37];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(next_u64() % V);
    simple_batch((int32_t)T, (int32_t)T, 0, NULL, tok);
    pair out;
    pair_alloc(&out, T, Dm);
    pair_poison(&out);
    cpu->ops->embed(cpu, &out.c, &tc);
    gpu->ops->embed(gpu, &out.g, &tg);
    pair_check(&out, T, 0.0, "embed (exact)");
    pair_free(&out);
    cpu->ops->tensor_free(cpu, &tc);
    gpu->ops->tensor_free(gpu, &tg);
}

static void rmsnorm_case(int64_t rows, int64_t cols, int in_place) {
    float *x = rand_vec((size_t)(rows * cols), 2.0f, 0), *w = rand_vec((size_t)cols, 1.0f, 0);
    ns_tensor wc, wg;
    vec_pair(&wc, &wg, w, cols);
    pair in, out;
    pair_alloc(&in, rows, cols);
    pair_set(&in, x);
    char what[64];
    if (in_place) {
        cpu->ops->rmsnorm(cpu, &in.c, &in.c, &wc, 1e-6f);
        gpu->ops->rmsnorm(gpu, &in.g, &in.g, &wg, 1e-6f);
        snprintf(what, sizeof what, "rmsnorm %lldx%lld in place", (long long)rows, (long long)cols);
        pair_check(&in, rows, 1e-5, what);
    } else {
        pair_alloc(&out, rows, cols);
        pair_poison(&out);
        cpu->ops->rmsnorm(cpu, &out.c, &in.c, &wc, 1e-5f);
        gpu->ops->rmsnorm(gpu, &out.g, &in.g, &wg, 1e-5f);
        snprintf(what, sizeof what, "rmsnorm %lldx%lld", (long long)rows, (long long)cols);
        pair_check(&out, rows, 1e-5, what);
        pair_free(&out);
    }
    pair_free(&in);
    cpu->ops->tensor_free(cpu, &wc);
    gpu->ops->tensor_free(gpu, &wg);
    free(x);
    free(w);
}

TEST(test_rmsnorm) {
    rmsnorm_case(17, 4096, 0);
    rmsnorm_case(300, 128, 0);
    rmsnorm_case(64 * 32, 128, 1);
    rmsnorm_case(5, 1000, 0);
    rmsnorm_case(3, 5001, 1);
}

TEST(test_rope) {
    const int T = 45, NH = 6, D = 128;
    float inv[64];
    for (int i = 0; i < D / 2; i++) inv[i] = powf(1e6f, -(float)(2 * i) / (float)D);
    pair invp, x;
    pair_alloc(&invp, 1, D / 2);
    pair_set(&invp, inv);
    pair_alloc(&x, T, NH * D);
    float *xv = rand_vec((size_t)T * NH * D, 1.0f, 0);
    pair_set(&x, xv);
    simple_batch(T, 40000, 0, NULL, NULL);
    cpu->ops->rope(cpu, &x.c, NH, D, &invp.c);
    gpu->ops->rope(gpu, &x.g, NH, D, &invp.g);
    pair_check(&x, T, 1e-5, "rope positions up to 40000");
    /* k with fewer heads inside a wider row stride is not an engine case;
     * a small head dim is */
    pair x2;
    pair_alloc(&x2, T, 4 * 16);
    float *xv2 = rand_vec((size_t)T * 64, 1.0f, 0);
    pair_set(&x2, xv2);
    simple_batch(T, T + 3, 0, NULL, NULL);
    cpu->ops->rope(cpu, &x2.c, 4, 16, &invp.c);
    gpu->ops->rope(gpu, &x2.g, 4, 16, &invp.g);
    pair_check(&x2, T, 1e-5, "rope head_dim 16");
    pair_free(&invp);
    pair_free(&x);
    pair_free(&x2);
    free(xv);
    free(xv2);
}

TEST(test_swiglu_add) {
    const int64_t T = 19, F = 1536;
    float *g = rand_vec((size_t)(T * F), 6.0f, 0), *u = rand_vec((size_t)(T * F), 2.0f, 0);
    pair pg, pu, po;
    pair_alloc(&pg, T, F);
    pair_alloc(&pu, T, F);
    pair_alloc(&po, T, F);
    pair_set(&pg, g);
    pair_set(&pu, u);
    pair_poison(&po);
    cpu->ops->swiglu(cpu, &po.c, &pg.c, &pu.c);
    gpu->ops->swiglu(gpu, &po.g, &pg.g, &pu.g);
    pair_check(&po, T, 1e-6, "swiglu");
    cpu->ops->swiglu(cpu, &pg.c, &pg.c, &pu.c); /* in place, as the engine calls it */
    gpu->ops->swiglu(gpu, &pg.g, &pg.g, &pu.g);
    pair_check(&pg, T, 1e-6, "swiglu in place");
    cpu->ops->add(cpu, &po.c, &pu.c);
    gpu->ops->add(gpu, &po.g, &pu.g);
    pair_check(&po, T, 1e-6, "add");
    /* odd sizes take the scalar paths */
    ns_tensor vc = pu.c, vg = pu.g;
    vc.rows = vg.rows = 1;
    vc.cols = vg.cols = 1001;
    ns_tensor oc = po.c, og = po.g;
    oc.rows = og.rows = 1;
    oc.cols = og.cols = 1001;
    cpu->ops->add(cpu, &oc, &vc);
    gpu->ops->add(gpu, &og, &vg);
    pair_check(&po, T, 1e-6, "add odd size");
    pair_free(&pg);
    pair_free(&pu);
    pair_free(&po);
    free(g);
    free(u);
}

TEST(test_gather_rows) {
    const int64_t T = 50, C = 700;
    float *x = rand_vec((size_t)(T * C), 1.0f, 0);
    pair in, out;
    pair_alloc(&in, T, C);
    pair_alloc(&out, 4, C);
    pair_set(&in, x);
    pair_poison(&out);
    int32_t rows[4] = {0, 7, 8, 49};
    simple_batch((int32_t)T, (int32_t)T, 4, rows, NULL);
    cpu->ops->gather_rows(cpu, &out.c, &in.c);
    gpu->ops->gather_rows(gpu, &out.g, &in.g);
    pair_check(&out, 4, 0.0, "gather_rows (exact)");
    pair_free(&in);
    pair_free(&out);
    free(x);
}

/* ---------------------------------------------------------------- matmul */

static void matmul_case(int64_t n, int64_t m, int64_t k, int bf_exact, int through_norm, double tol) {
    float *w = rand_vec((size_t)(m * k), 0.05f, 1), *x = rand_vec((size_t)(n * k), 1.0f, bf_exact);
    ns_tensor wc, wg;
    weight_pair(&wc, &wg, w, m, k);
    pair in, out;
    pair_alloc(&in, n, k);
    pair_alloc(&out, n, m);
    pair_set(&in, x);
    pair_poison(&out);
    ns_tensor nc = {0}, ng = {0};
    if (through_norm) {
        /* the engine's pattern: the producer writes the bf16 shadow */
        float *nw = rand_vec((size_t)k, 1.0f, 0);
        vec_pair(&nc, &ng, nw, k);
        free(nw);
        for (int rep = 0; rep < 2; rep++) {
            cpu->ops->rmsnorm(cpu, &in.c, &in.c, &nc, 1e-6f);
            gpu->ops->rmsnorm(gpu, &in.g, &in.g, &ng, 1e-6f);
            cpu->ops->matmul(cpu, &out.c, &in.c, &wc);
            gpu->ops->matmul(gpu, &out.g, &in.g, &wg);
        }
    } else {
        cpu->ops->matmul(cpu, &out.c, &in.c, &wc);
        gpu->ops->matmul(gpu, &out.g, &in.g, &wg);
    }
    char what[80];
    snprintf(what, sizeof what, "matmul n=%lld m=%lld k=%lld%s%s", (long long)n, (long long)m, (long long)k,
             bf_exact ? " bf16-exact" : "", through_norm ? " after rmsnorm" : "");
    pair_check(&out, n, tol, what);
    pair_free(&in);
    pair_free(&out);
    cpu->ops->tensor_free(cpu, &wc);
    gpu->ops->tensor_free(gpu, &wg);
    if (nc.data) cpu->ops->tensor_free(cpu, &nc);
    if (ng.data) gpu->ops->tensor_free(gpu, &ng);
    free(w);
    free(x);
}

TEST(test_matmul) {
    const int64_t ns[] = {1, 2, 4, 5, 8, 17, 64, 300};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) matmul_case(ns[i], 768, 1024, 1, 0, 1e-4);
    matmul_case(3, 1000, 4096, 1, 0, 1e-4);
    matmul_case(1, 130, 200, 1, 0, 1e-4);
    matmul_case(200, 96, 64, 0, 0, 1e-2);
    matmul_case(1, 512, 512, 0, 1, 1e-2);
    matmul_case(100, 512, 512, 0, 1, 1e-2);
}

/* Batch 1-2 matmuls through both GEMV kernels: the bulk-copy one
 * (cuda_gemv_bulk.cu) and the register-streaming one (switch off), at
 * shapes that cross its 16 KB stages (rows of 24 KB at k = 12288, of
 * 4.5 KB at k = 2304), give its CTAs uneven row counts (m not a multiple
 * of the SM count) or none (m = 50 < SMs), and the 8B model's q and down
 * projections. */
TEST(test_matmul_gemv_paths) {
    const int saved = ns_cuda_get_gemv_bulk(gpu);
    for (int on = 0; on < 2; on++) {
        ns_cuda_set_gemv_bulk(gpu, on);
        matmul_case(1, 1000, 12288, 1, 0, 1e-4);
        matmul_case(2, 1003, 2304, 1, 0, 1e-4);
        matmul_case(1, 50, 256, 1, 0, 1e-4);
        matmul_case(2, 4096, 4096, 1, 0, 1e-4);
        matmul_case(1, 4096, 12288, 0, 0, 1e-3);
    }
    ns_cuda_set_gemv_bulk(gpu, saved);
}

TEST(test_matmul_view_with_offset) {
    /* an input view that does not start at an allocation: scratch path */
    const int64_t n = 40, m = 256, k = 512;
    float *w = rand_vec((size_t)(m * k), 0.05f, 1), *x = rand_vec((size_t)((n + 1) * k), 1.0f, 1);
    ns_tensor wc, wg;
    weight_pair(&wc, &wg, w, m, k);
    pair in, out;
    pair_alloc(&in, n + 1, k);
    pair_alloc(&out, n, m);
    pair_set(&in, x);
    pair_poison(&out);
    ns_tensor vc = in.c, vg = in.g;
    vc.rows = vg.rows = n;
    vc.data = (float *)in.c.data + k;
    vg.data = (float *)in.g.data + k;
    vc.alloc = vg.alloc = NULL;
    cpu->ops->matmul(cpu, &out.c, &vc, &wc);
    gpu->ops->matmul(gpu, &out.g, &vg, &wg);
    pair_check(&out, n, 1e-4, "matmul on an offset view");
    pair_free(&in);
    pair_free(&out);
    cpu->ops->tensor_free(cpu, &wc);
    gpu->ops->tensor_free(gpu, &wg);
    free(w);
    free(x);
}

/* ------------------------------------------------------------- attention */

static void kv_layouts(const attn_cfg *cf, int layers, int pages, ns_kv_layout *lc, ns_kv_layout *lg) {
    memset(lc, 0, sizeof *lc);
    lc->n_pages = pages;
    lc->page_tokens = cf->P;
    lc->n_layers = layers;
    lc->n_kv_heads = cf->KVH;
    lc->head_dim = cf->D;
    *lg = *lc;
    lc->dtype = NS_DT_F32;
    lg->dtype = NS_DT_BF16;
    lc->page_size_bytes = (size_t)layers * 2 * cf->KVH * cf->P * cf->D * 4;
    lg->page_size_bytes = lc->page_size_bytes / 2;
}

/* Stores random bf16-exact K/V for every token of the batch in `layers`. */
static void store_random_kv(const batch_buf *bb, const attn_cfg *cf, int layers) {
    int32_t T = bb->b.n_tokens;
    pair k, v;
    pair_alloc(&k, T, cf->KVH * cf->D);
    pair_alloc(&v, T, cf->KVH * cf->D);
    for (int l = 0; l < layers; l++) {
        float *kx = rand_vec((size_t)T * cf->KVH * cf->D, 1.0f, 1), *vx = rand_vec((size_t)T * cf->KVH * cf->D, 1.0f, 1);
        pair_set(&k, kx);
        pair_set(&v, vx);
        cpu->ops->kv_store(cpu, l, &k.c, &v.c);
        gpu->ops->kv_store(gpu, l, &k.g, &v.g);
        free(kx);
        free(vx);
    }
    pair_free(&k);
    pair_free(&v);
}

/* Stores random K/V (store_random_kv) for the history of the ns
 * sequences fin, the ctx - n tokens before each one's new tokens, in one
 * batch over their page tables pt (ns rows of max_pages); sequences
 * without history are left out. */
static void store_history(const attn_cfg *cf, const seq_spec *fin, int ns, const int32_t *pt, int32_t max_pages,
                          int layers) {
    seq_spec *hist = calloc((size_t)ns, sizeof *hist);
    int32_t *hist_pt = calloc((size_t)ns * max_pages, 4);
    int nh = 0;
    for (int s = 0; s < ns; s++) {
        if (fin[s].ctx - fin[s].n <= 0) continue;
        hist[nh].ctx = hist[nh].n = fin[s].ctx - fin[s].n;
        memcpy(hist_pt + (size_t)nh * max_pages, pt + (size_t)s * max_pages, (size_t)max_pages * 4);
        nh++;
    }
    if (nh > 0) {
        batch_buf hb;
        batch_make(&hb, hist, nh, hist_pt, max_pages);
        OK(cpu->ops->set_batch(cpu, &hb.b, &_e));
        OK(gpu->ops->set_batch(gpu, &hb.b, &_e));
        store_random_kv(&hb, cf, layers);
        batch_free(&hb);
    }
    free(hist);
    free(hist_pt);
}

/* Buffers of one attention step, kept across repetitions so a repeated
 * decode step records the same tape (graph capture and replay). */
typedef struct {
    pair q, out, k[2], v[2];
    int32_t T;
} attn_bufs;

static void attn_bufs_alloc(attn_bufs *ab, int32_t T, const attn_cfg *cf) {
    ab->T = T;
    pair_alloc(&ab->q, T, cf->H * cf->D);
    pair_alloc(&ab->out, T, cf->H * cf->D);
    for (int l = 0; l < 2; l++) {
        pair_alloc(&ab->k[l], T, cf->KVH * cf->D);
        pair_alloc(&ab->v[l], T, cf->KVH * cf->D);
    }
}

static void attn_bufs_free(attn_bufs *ab) {
    pair_free(&ab->q);
    pair_free(&ab->out);
    for (int l = 0; l < 2; l++) {
        pair_free(&ab->k[l]);
        pair_free(&ab->v[l]);
    }
}

/* Uploads fresh q/k/v (before set_batch, so the step's ops form one
 * tape), poisons the output, sets the batch and stores the new tokens'
 * K/V in layers 0 and 1. */
static void attention_inputs(attn_bufs *ab, const batch_buf *bb, const attn_cfg *cf) {
    const int32_t T = ab->T;
    float *qx = rand_vec((size_t)T * cf->H * cf->D, 1.0f, 1);
    pair_set(&ab->q, qx);
    free(qx);
    for (int l = 0; l < 2; l++) {
        float *kx = rand_vec((size_t)T * cf->KVH * cf->D, 1.0f, 1), *vx = rand_vec((size_t)T * cf->KVH * cf->D, 1.0f, 1);
        pair_set(&ab->k[l], kx);
        pair_set(&ab->v[l], vx);
        free(kx);
        free(vx);
    }
    pair_poison(&ab->out);
    OK(cpu->ops->set_batch(cpu, &bb->b, &_e));
    OK(gpu->ops->set_batch(gpu, &bb->b, &_e));
    for (int l = 0; l < 2; l++) {
        cpu->ops->kv_store(cpu, l, &ab->k[l].c, &ab->v[l].c);
        gpu->ops->kv_store(gpu, l, &ab->k[l].g, &ab->v[l].g);
    }
}

/* One attention step on ab's buffers: fresh inputs (attention_inputs),
 * then attention in `layer`, compared over the whole batch. */
static void attention_run(attn_bufs *ab, const batch_buf *bb, const attn_cfg *cf, int layer, double tol,
                          const char *what) {
    attention_inputs(ab, bb, cf);
    float scale = 1.0f / sqrtf((float)cf->D);
    cpu->ops->attention(cpu, &ab->out.c, &ab->q.c, layer, cf->H, scale);
    gpu->ops->attention(gpu, &ab->out.g, &ab->q.g, layer, cf->H, scale);
    char buf[120];
    snprintf(buf, sizeof buf, "attention D=%d H=%d KVH=%d P=%d %s", cf->D, cf->H, cf->KVH, cf->P, what);
    pair_check(&ab->out, ab->T, tol, buf);
}

static void attention_step(const batch_buf *bb, const attn_cfg *cf, int layer, double tol, const char *what) {
    attn_bufs ab;
    attn_bufs_alloc(&ab, bb->b.n_tokens, cf);
    attention_run(&ab, bb, cf, layer, tol, what);
    attn_bufs_free(&ab);
}

static void attention_config(const attn_cfg *cf) {
    const int pages = 1024, layers = 2;
    ns_kv_layout lc, lg;
    kv_layouts(cf, layers, pages, &lc, &lg);
    OK(cpu->ops->kv_alloc(cpu, &lc, &_e));
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    /* sequences: fresh prefill, chunked prefill, two decodes, a 2-token
     * prefill, a tile-sized chunk; pages shuffled so no sequence is
     * contiguous in the pool */
    enum { NS = 6 };
    const seq_spec fin[NS] = {{100, 100}, {300, 37}, {1000, 1}, {17, 1}, {2, 2}, {200, 64}};
    int32_t max_pages = (1001 + cf->P - 1) / cf->P + 1;
    int32_t *perm = shuffled_pages(pages);
    int32_t *pt = calloc((size_t)NS * max_pages, 4);
    int used = 0;
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < max_pages && used < pages; p++) pt[s * max_pages + p] = perm[used++];
    /* history first (everything before the step's new tokens) */
    store_history(cf, fin, NS, pt, max_pages, layers);

    batch_buf bb;
    batch_make(&bb, fin, NS, pt, max_pages);
    /* tensor-core prefill rounds P to bf16: bf16 tolerance */
    attention_step(&bb, cf, 1, 1e-2, "mixed prefill+decode");
    batch_free(&bb);

    /* pure decode step, three times: eager, graph capture, graph replay;
     * each with fresh q and fresh KV for the new token */
    seq_spec dec[2] = {{1001, 1}, {18, 1}};
    int32_t *dpt = calloc((size_t)2 * max_pages, 4);
    memcpy(dpt, pt + 2 * max_pages, (size_t)max_pages * 4);
    memcpy(dpt + max_pages, pt + 3 * max_pages, (size_t)max_pages * 4);
    batch_buf db;
    batch_make(&db, dec, 2, dpt, max_pages);
    attn_bufs ab;
    attn_bufs_alloc(&ab, 2, cf);
    for (int rep = 0; rep < 3; rep++)
        attention_run(&ab, &db, cf, 1, 1e-4,
                      rep == 0 ? "decode (eager)" : rep == 1 ? "decode (capture)" : "decode (replay)");
    attn_bufs_free(&ab);
    batch_free(&db);
    cpu->ops->kv_free(cpu);
    gpu->ops->kv_free(gpu);
    free(perm);
    free(pt);
    free(dpt);
}

TEST(test_attention) {
    const attn_cfg cfgs[] = {
        {128, 2, 8, 16}, /* Qwen3-8B-like head, GQA 4 */
        {64, 4, 8, 32},  {32, 2, 4, 16}, /* tiny-qwen3 */
        {16, 1, 4, 16},                  /* tiny-llama3 */
        {16, 4, 8, 7},                   /* tinystories, odd page size */
        {96, 2, 4, 16},                  /* no fast kernel: row fallback */
        {256, 1, 2, 16},                 /* decode kernel, prefill fallback */
    };
    int64_t r0, c0, e0;
    ns_cuda_graph_stats(gpu, &r0, &c0, &e0);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) attention_config(&cfgs[i]);
    int64_t r1, c1, e1;
    ns_cuda_graph_stats(gpu, &r1, &c1, &e1);
    fprintf(stdout, "#   graphs: %lld replays, %lld captures, %lld eager tapes\n", (long long)(r1 - r0),
            (long long)(c1 - c0), (long long)(e1 - e0));
    CHECKF(r1 > r0 && c1 > c0, "decode steps were never captured and replayed");
}

TEST(test_attention_long_decode_splits) {
    /* long contexts: many splits, several pages per split */
    const attn_cfg cf = {128, 8, 32, 16};
    const int layers = 2; /* attention_step stores K/V of layers 0 and 1 */
    const int32_t ctx[3] = {5000, 3333, 129};
    int pages = 0;
    for (int s = 0; s < 3; s++) pages += (ctx[s] + cf.P - 1) / cf.P;
    ns_kv_layout lc, lg;
    kv_layouts(&cf, layers, pages, &lc, &lg);
    OK(cpu->ops->kv_alloc(cpu, &lc, &_e));
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    int32_t max_pages = (5000 + cf.P - 1) / cf.P;
    int32_t *pt = calloc((size_t)3 * max_pages, 4);
    int next = pages - 1;
    for (int s = 0; s < 3; s++)
        for (int p = 0; p < (ctx[s] + cf.P - 1) / cf.P; p++) pt[s * max_pages + p] = next--; /* reversed order */
    seq_spec dec[3];
    for (int s = 0; s < 3; s++) {
        dec[s].ctx = ctx[s];
        dec[s].n = 1;
    }
    store_history(&cf, dec, 3, pt, max_pages, layers); /* the ctx - 1 tokens before each decode row */
    batch_buf db;
    batch_make(&db, dec, 3, pt, max_pages);
    /* a recorded decode step (its kernels get the early-load flag) three
     * times (eager tape, graph capture, replay), for every K/V copy mode
     * of the tensor-core kernel (8 splits here; 4 is the default) */
    const int modes[] = {4, 0, 1, 2, 3};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        ns_cuda_set_attn_dec_load(gpu, modes[mi]);
        for (int rep = 0; rep < 3; rep++) {
            char what[96];
            snprintf(what, sizeof what, "long decode (splits) copy mode %d %s", modes[mi],
                     rep == 0 ? "eager" : rep == 1 ? "capture" : "replay");
            attention_step(&db, &cf, 0, 1e-4, what);
        }
    }
    ns_cuda_set_attn_dec_load(gpu, -1);
    batch_free(&db);
    cpu->ops->kv_free(cpu);
    gpu->ops->kv_free(gpu);
    free(pt);
}

/* ------------------------------------- long-context attention (issue 12) */

/* One attention step over sequences fin[] (each: context after the step,
 * new tokens), with their history (ctx - n tokens) stored first; pages
 * shuffled over the pool. Checks layer 1 per sequence. */
/* A kernel switch of the CUDA backend and the positions to test: the GPU
 * runs once per position against one CPU reference; the switch is left
 * at the first position (the default). */
typedef struct {
    void (*set)(ns_backend *, int);
    int n;
    int pos[16];
    const char *name[16];
} gpu_switch;

static void attention_batch(const attn_cfg *cf, const seq_spec *fin, int ns, double tol, double row_tol,
                            const char *what, const gpu_switch *sw) {
    const int layers = 2;
    int32_t max_pages = 1, pages = 0;
    for (int s = 0; s < ns; s++) {
        const int32_t np = (fin[s].ctx + cf->P - 1) / cf->P;
        pages += np;
        if (np > max_pages) max_pages = np;
    }
    ns_kv_layout lc, lg;
    kv_layouts(cf, layers, pages, &lc, &lg);
    OK(cpu->ops->kv_alloc(cpu, &lc, &_e));
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    int32_t *perm = shuffled_pages(pages);
    int32_t *pt = calloc((size_t)ns * max_pages, 4);
    int used = 0;
    for (int s = 0; s < ns; s++)
        for (int p = 0; p < (fin[s].ctx + cf->P - 1) / cf->P; p++) pt[s * max_pages + p] = perm[used++];
    store_history(cf, fin, ns, pt, max_pages, layers);
    batch_buf bb;
    batch_make(&bb, fin, ns, pt, max_pages);
    attn_bufs ab;
    attn_bufs_alloc(&ab, bb.b.n_tokens, cf);
    /* fresh q/k/v, new tokens' K/V stored, attention in layer 1 */
    attention_inputs(&ab, &bb, cf);
    const float scale = 1.0f / sqrtf((float)cf->D);
    cpu->ops->attention(cpu, &ab.out.c, &ab.q.c, 1, cf->H, scale);
    for (int i = 0; i < (sw ? sw->n : 1); i++) {
        if (sw) sw->set(gpu, sw->pos[i]);
        if (i > 0) pair_poison_gpu(&ab.out);
        gpu->ops->attention(gpu, &ab.out.g, &ab.q.g, 1, cf->H, scale);
        char buf[200];
        snprintf(buf, sizeof buf, "D=%d H=%d KVH=%d P=%d %s%s%s", cf->D, cf->H, cf->KVH, cf->P, what, sw ? " " : "",
                 sw ? sw->name[i] : "");
        check_by_seq(&ab.out, &bb, tol, row_tol, buf);
    }
    if (sw) sw->set(gpu, sw->pos[0]);
    attn_bufs_free(&ab);
    batch_free(&bb);
    cpu->ops->kv_free(cpu);
    gpu->ops->kv_free(gpu);
    free(perm);
    free(pt);
}

/* Prefill chunks of lengths 1, 15, 16, 17, 4095, 4097 after prefixes of
 * 0, 16, 4095, 17 and 1 tokens (crossing the 16-token pages, the 64-row
 * query tiles and the 128-key K/V tiles of the Hopper kernel), decode rows
 * in the same launch, GQA 1/4/8 at head dim 128; with the Hopper kernel
 * (where the device has it) and with the mma.sync kernel. */
TEST(test_attention_prefill_boundaries) {
    const seq_spec mixed[] = {
        {15, 15},     /* fresh, under one page */
        {32, 16},     /* one page after one page */
        {4112, 17},   /* 17 rows after a 4095-token prefix */
        {4097, 4097}, /* fresh, one past a power of two */
        {4112, 4095}, /* 4095 rows after a 17-token prefix */
        {4096, 1},    /* decode row in the same launch */
        {1, 1},       /* decode of a first token */
        {18, 17},     /* 17 rows after one token */
    };
    const seq_spec small[] = {{15, 15}, {33, 17}, {130, 64}, {300, 300}, {257, 1}};
    const attn_cfg g4 = {128, 2, 8, 16}, g8 = {128, 1, 8, 16}, g1 = {128, 2, 2, 16};
    /* on a device without the Hopper kernel all run the mma.sync kernel;
     * the first position is the default (the TMA producer) */
    const gpu_switch k = {ns_cuda_set_attn_sm90, 4, {13, 8, 1, 0},
                          {"(hopper, TMA, pipelined)", "(hopper, TMA)", "(hopper)", "(mma.sync)"}};
    attention_batch(&g4, mixed, (int)(sizeof mixed / sizeof mixed[0]), 1e-2, 3e-2, "prefill boundaries GQA4", &k);
    attention_batch(&g8, small, (int)(sizeof small / sizeof small[0]), 1e-2, 3e-2, "prefill GQA8", &k);
    attention_batch(&g1, small, (int)(sizeof small / sizeof small[0]), 1e-2, 3e-2, "prefill GQA1 (mma.sync)", NULL);
}

/* The other Hopper prefill variants (cuda.h) on the same boundary batch
 * (GQA 4: one 2-CTA cluster per tile and KV head in variant 10; GQA 8:
 * two), the TMA producers also with pages of 8 and 32 tokens and on a
 * 40000-token prefix. Run after the other tests: a variant that traps takes the CUDA context
 * with it. */
TEST(test_attention_prefill_variants) {
    const seq_spec mixed[] = {{15, 15}, {32, 16}, {4112, 17}, {4097, 4097}, {4112, 4095}, {4096, 1}, {1, 1}, {18, 17}};
    const attn_cfg g4 = {128, 2, 8, 16}, g8 = {128, 1, 8, 16};
    const gpu_switch k = {ns_cuda_set_attn_sm90,
                          15,
                          {13, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 8, 14, 15},
                          {"(hopper, pipelined, TMA)", "(hopper)", "(hopper, pipelined)", "(hopper, pipelined, ping-pong)",
                           "(hopper, warp producers)", "(hopper, pipelined, warp producers)",
                           "(hopper, pipelined, ping-pong, warp producers)", "(hopper, offset groups)",
                           "(hopper, pipelined, ping-pong, TMA)",
                           "(hopper, TMA multicast in 2-CTA clusters)",
                           "(hopper, pipelined, ping-pong, TMA multicast in 2-CTA clusters)",
                           "(hopper, offset groups, TMA)", "(hopper, TMA)",
                           "(hopper, offset groups, TMA, lean softmax)",
                           "(hopper, pipelined, ping-pong, TMA, lean softmax)"}};
    attention_batch(&g4, mixed, (int)(sizeof mixed / sizeof mixed[0]), 1e-2, 3e-2, "prefill variants GQA4", &k);
    const seq_spec small[] = {{15, 15}, {33, 17}, {130, 64}, {300, 300}, {257, 1}};
    attention_batch(&g8, small, (int)(sizeof small / sizeof small[0]), 1e-2, 3e-2, "prefill variants GQA8", &k);
    /* the TMA producer's boxes are one page: pages of 8 (64 boxes per
     * tile, more than a warp's lanes) and 32 tokens; chunks ending inside
     * a page, on a page edge and on a 128-key tile edge */
    const gpu_switch tma = {ns_cuda_set_attn_sm90,
                            9,
                            {13, 1, 9, 10, 11, 12, 8, 14, 15},
                            {"(hopper, pipelined, TMA)", "(hopper)", "(hopper, pipelined, ping-pong, TMA)",
                             "(hopper, TMA multicast)", "(hopper, pipelined, ping-pong, TMA multicast)",
                             "(hopper, offset groups, TMA)", "(hopper, TMA)", "(hopper, offset groups, TMA, lean)",
                             "(hopper, pipelined, ping-pong, TMA, lean)"}};
    const attn_cfg p8 = {128, 2, 8, 8}, p32 = {128, 2, 8, 32}, p64 = {128, 2, 8, 64};
    const seq_spec pages[] = {{15, 15}, {256, 100}, {1000, 1000}, {1313, 77}, {520, 7}, {129, 1}};
    attention_batch(&p8, pages, (int)(sizeof pages / sizeof pages[0]), 1e-2, 3e-2, "prefill TMA pages of 8", &tma);
    attention_batch(&p32, pages, (int)(sizeof pages / sizeof pages[0]), 1e-2, 3e-2, "prefill TMA pages of 32", &tma);
    /* 64-token pages: the CUDA server's default (two boxes per 128-key tile and half) */
    attention_batch(&p64, pages, (int)(sizeof pages / sizeof pages[0]), 1e-2, 3e-2, "prefill TMA pages of 64", &tma);
    /* a 40000-token prefix through the TMA producer: 313 tiles, row
     * coordinates deep into the pool */
    const seq_spec long_ctx[] = {{40017, 17}, {40001, 1}};
    attention_batch(&g4, long_ctx, 2, 1e-2, 3e-2, "prefill variants prefix 40000", &tma);
}

/* A 40000-token prefix: a 17-row prefill chunk and a decode row on top of
 * it in one launch (one configuration: the CPU reference is the cost). */
TEST(test_attention_40k_context) {
    const attn_cfg cf = {128, 2, 8, 16};
    const seq_spec sp[] = {{40017, 17}, {40001, 1}, {5, 1}};
    attention_batch(&cf, sp, 3, 1e-2, 3e-2, "prefix 40000: chunk 17 + decode", NULL);
}

/* Decode only, mixed lengths (1 ... 33000), GQA 1/4/8, head dims 64 and
 * 128, on the tensor-core decode kernel and on the CUDA-core kernel: both
 * within 1e-4 of the fp32 reference (the tensor-core kernel splits q and
 * p into bf16 hi + lo halves). */
TEST(test_attention_decode_mixed) {
    const seq_spec sp[] = {{33000, 1}, {1, 1}, {4097, 1}, {17, 1}, {16, 1}, {129, 1}, {8191, 1}};
    const attn_cfg cfgs[] = {{128, 2, 8, 16}, {128, 1, 8, 16}, {128, 2, 2, 16}, {64, 2, 8, 32}};
    const gpu_switch k = {ns_cuda_set_attn_dec_mma, 3, {1, 2, 0}, {"(auto)", "(tensor cores)", "(CUDA cores)", NULL, NULL, NULL, NULL, NULL}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "decode mixed lengths GQA%d", cfgs[i].H / cfgs[i].KVH);
        attention_batch(&cfgs[i], sp, (int)(sizeof sp / sizeof sp[0]), 1e-4, 1e-3, what, &k);
    }
}

/* The tensor-core decode kernel forced on, with K/V copy mode `mode`
 * (cuda.h ns_cuda_set_attn_dec_load). */
static void set_dec_load_forced(ns_backend *be, int mode) {
    ns_cuda_set_attn_dec_mma(be, 2);
    ns_cuda_set_attn_dec_load(be, mode);
}

/* The tensor-core decode kernel's K/V copy modes (16-byte cp.async; the
 * same with page ids loaded a tile ahead; one bulk copy per K/V row on an
 * mbarrier, where rows past a split's end are zero-filled by hand; the
 * same with the next tile issued before the wait; whole pages by TMA,
 * swizzled, head dim 128 only: D = 64 runs it as mode 2) within
 * 1e-4 of the CPU reference: batch 1 at 40001 tokens (128 splits of 320
 * keys, the last holding one key, two with none), batch 1 at 12001 tokens with
 * the Qwen3-8B head layout (32 splits, as a 32k decode step), a mixed
 * batch (1 ... 33000 tokens, tiles ending at every page offset that
 * matters), GQA 1/4/8, head dims 64 and 128, pages of 16, 32 and 64 tokens. */
TEST(test_attention_decode_load_modes) {
    const seq_spec b1_40k[] = {{40001, 1}}, b1_12k[] = {{12001, 1}};
    const seq_spec mixed[] = {{33000, 1}, {1, 1}, {4095, 1}, {17, 1}, {16, 1}, {15, 1}, {8191, 1}, {65, 1}};
    const attn_cfg g4 = {128, 2, 8, 16}, qwen = {128, 8, 32, 16}, g8 = {128, 1, 8, 16}, g1 = {128, 2, 2, 16},
                   d64 = {64, 2, 8, 32}, p64 = {128, 2, 8, 64};
    const gpu_switch k = {set_dec_load_forced,
                          5,
                          {4, 2, 0, 1, 3},
                          {"(TMA pages)", "(bulk rows)", "(cp.async)", "(page ids ahead)",
                           "(bulk rows, issued before the wait)"}};
    attention_batch(&g4, b1_40k, 1, 1e-4, 1e-3, "decode B1 40001 GQA4", &k);
    attention_batch(&qwen, b1_12k, 1, 1e-4, 1e-3, "decode B1 12001 Qwen3-8B heads", &k);
    const attn_cfg *mc[] = {&g4, &g8, &g1, &d64, &p64};
    for (size_t i = 0; i < sizeof mc / sizeof mc[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "decode load modes mixed GQA%d D=%d P=%d", mc[i]->H / mc[i]->KVH, mc[i]->D,
                 mc[i]->P);
        attention_batch(mc[i], mixed, (int)(sizeof mixed / sizeof mixed[0]), 1e-4, 1e-3, what, &k);
    }
    ns_cuda_set_attn_dec_mma(gpu, -1); /* back to the defaults */
    ns_cuda_set_attn_dec_load(gpu, -1);
}

/* ---------------------------------------------------------------- KV pages */

TEST(test_kv_pages) {
    const attn_cfg cf = {64, 2, 4, 16};
    ns_kv_layout lc, lg;
    kv_layouts(&cf, 3, 8, &lc, &lg);
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    size_t pb = lg.page_size_bytes;
    uint16_t *a = malloc(pb), *b = malloc(pb), *r = malloc(pb);
    for (size_t i = 0; i < pb / 2; i++) {
        a[i] = bf16_bits(frand());
        b[i] = bf16_bits(frand());
    }
    OK(gpu->ops->kv_page_write(gpu, 3, a, &_e));
    OK(gpu->ops->kv_page_write(gpu, 5, b, &_e));
    OK(gpu->ops->kv_page_read(gpu, 3, r, &_e));
    CHECK(memcmp(r, a, pb) == 0);
    gpu->ops->kv_page_copy(gpu, 5, 3, 7);
    OK(gpu->ops->kv_page_read(gpu, 5, r, &_e));
    size_t bad = 0;
    for (int l = 0; l < 3; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < cf.KVH; h++)
                for (int s = 0; s < cf.P; s++) {
                    size_t off = ns_kv_offset(&lg, l, kv, h, s) / 2;
                    const uint16_t *want = s < 7 ? a + off : b + off;
                    if (memcmp(r + off, want, (size_t)cf.D * 2) != 0) bad++;
                }
    CHECKF(bad == 0, "%zu rows wrong after kv_page_copy", bad);
    ns_error e = {0};
    CHECK(gpu->ops->kv_page_read(gpu, 8, r, &e) == NS_ERR_RANGE);
    gpu->ops->kv_free(gpu);
    free(a);
    free(b);
    free(r);
}

/* Asynchronous page transfers on the copy stream (the cache tiers):
 * pinned host pages in and out, bit-exact, fences in order, compute after a
 * fence sees the copied bytes. */
TEST(test_kv_pages_async) {
    const attn_cfg cf = {64, 2, 4, 16};
    ns_kv_layout lc, lg;
    kv_layouts(&cf, 3, 8, &lc, &lg);
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    const size_t pb = lg.page_size_bytes;
    uint16_t *h = gpu->ops->host_alloc(gpu, 4 * pb);
    CHECK(h != NULL);
    if (!h) return;
    uint16_t *a = h, *b = h + pb / 2, *r1 = h + pb, *r2 = h + 3 * pb / 2, *r = malloc(pb);
    for (size_t i = 0; i < pb / 2; i++) {
        a[i] = bf16_bits(frand());
        b[i] = bf16_bits(frand());
    }
    uint64_t f1 = gpu->ops->kv_page_write_async(gpu, 2, a);
    uint64_t f2 = gpu->ops->kv_page_write_async(gpu, 6, b);
    CHECK(f1 > 0 && f2 > f1);
    gpu->ops->compute_after(gpu, f2);
    gpu->ops->kv_page_copy(gpu, 7, 6, 16); /* compute-stream op ordered after the fence */
    uint64_t f3 = gpu->ops->kv_page_read_async(gpu, 2, r1);
    uint64_t f4 = gpu->ops->kv_page_read_async(gpu, 7, r2);
    gpu->ops->fence_wait(gpu, f4);
    CHECK(gpu->ops->fence_done(gpu, f1) && gpu->ops->fence_done(gpu, f3));
    CHECK(memcmp(r1, a, pb) == 0);
    CHECK(memcmp(r2, b, pb) == 0);
    OK(gpu->ops->kv_page_read(gpu, 6, r, &_e));
    CHECK(memcmp(r, b, pb) == 0);
    OK(gpu->ops->sync(gpu, &_e));
    gpu->ops->host_free(gpu, h);
    free(r);
    gpu->ops->kv_free(gpu);
}

/* ---------------------------------------------------------------- sample */

enum { SAMPLE_ROWS = 6 };
TEST(test_sample) {
    const int R = SAMPLE_ROWS, V = 5000;
    float *lg = rand_vec((size_t)R * V, 8.0f, 0);
    /* row 1: a tie at the maximum (lowest id must win) */
    lg[1 * V + 100] = 50.0f;
    lg[1 * V + 4000] = 50.0f;
    pair p;
    pair_alloc(&p, R, V);
    ns_sampler sc[SAMPLE_ROWS], sg[SAMPLE_ROWS];
    ns_sampler *pc[SAMPLE_ROWS], *pg[SAMPLE_ROWS];
    for (int i = 0; i < R; i++) {
        ns_sampling_params sp = ns_sampling_default();
        if (i == 3) sp.repetition_penalty = 1.3f; /* greedy with penalty: host path */
        if (i >= 4) {
            sp.temperature = 0.8f;
            sp.top_p = 0.9f;
            sp.top_k = i == 5 ? 40 : 0;
            sp.seed = 1000 + (uint64_t)i;
        }
        OK(ns_sampler_init(&sc[i], &sp, V, &_e));
        OK(ns_sampler_init(&sg[i], &sp, V, &_e));
        for (int t = 0; t < 5; t++) {
            ns_sampler_accept(&sc[i], t * 7);
            ns_sampler_accept(&sg[i], t * 7);
        }
        pc[i] = &sc[i];
        pg[i] = &sg[i];
    }
    for (int rep = 0; rep < 4; rep++) {
        pair_set(&p, lg);
        int32_t tc[SAMPLE_ROWS], tg[SAMPLE_ROWS];
        OK(cpu->ops->sample(cpu, &p.c, R, pc, tc, &_e));
        OK(gpu->ops->sample(gpu, &p.g, R, pg, tg, &_e));
        for (int i = 0; i < R; i++) CHECKF(tc[i] == tg[i], "rep %d row %d: cpu %d cuda %d", rep, i, tc[i], tg[i]);
        CHECK_EQ_INT(tg[1], 100);
        for (int i = 0; i < R; i++) {
            ns_sampler_accept(&sc[i], tc[i]);
            ns_sampler_accept(&sg[i], tg[i]);
        }
        for (size_t i = 0; i < (size_t)R * V; i++) lg[i] = frand() * 8.0f; /* fresh logits */
        lg[1 * V + 100] = 50.0f;
        lg[1 * V + 4000] = 50.0f;
    }
    for (int i = 0; i < R; i++) {
        ns_sampler_free(&sc[i]);
        ns_sampler_free(&sg[i]);
    }
    pair_free(&p);
    free(lg);
}

/* Greedy rows of a 151936-token vocabulary (the device argmax cuts a row
 * into slices of 4096 columns, one CTA each, meeting in an atomic
 * maximum): the maximum in the last slice and at the last column, a tie
 * across slices (the lowest id wins), +Inf, a NaN (-1), a row with
 * nothing above -Inf (-1); four rounds, so the per-row state the kernel
 * resets is reused, against the CPU sampler. */
TEST(test_argmax_large_vocab) {
    enum { R = 6, V = 151936 };
    float *lg = malloc((size_t)R * V * sizeof *lg);
    pair p;
    pair_alloc(&p, R, V);
    ns_sampler sc[R], sg[R];
    ns_sampler *pc[R], *pg[R];
    for (int i = 0; i < R; i++) {
        ns_sampling_params sp = ns_sampling_default();
        OK(ns_sampler_init(&sc[i], &sp, V, &_e));
        OK(ns_sampler_init(&sg[i], &sp, V, &_e));
        pc[i] = &sc[i];
        pg[i] = &sg[i];
    }
    for (int rep = 0; rep < 4; rep++) {
        for (size_t i = 0; i < (size_t)R * V; i++) lg[i] = frand() * 8.0f - 4.0f;
        lg[0 * V + V - 1] = 40.0f + (float)rep;     /* last column */
        lg[1 * V + 150000] = 30.0f;                 /* last slice */
        lg[2 * V + 100] = 30.0f;                    /* a tie across slices */
        lg[2 * V + 140000 - rep] = 30.0f;
        lg[3 * V + 77777] = INFINITY;
        lg[4 * V + 5000 + rep] = NAN;
        for (size_t i = 0; i < V; i++) lg[5 * V + i] = -INFINITY;
        pair_set(&p, lg);
        int32_t tc[R], tg[R];
        OK(cpu->ops->sample(cpu, &p.c, R, pc, tc, &_e));
        OK(gpu->ops->sample(gpu, &p.g, R, pg, tg, &_e));
        for (int i = 0; i < R; i++) CHECKF(tc[i] == tg[i], "rep %d row %d: cpu %d cuda %d", rep, i, tc[i], tg[i]);
        CHECK_EQ_INT(tg[0], V - 1);
        CHECK_EQ_INT(tg[1], 150000);
        CHECK_EQ_INT(tg[2], 100);
        CHECK_EQ_INT(tg[3], 77777);
        CHECK_EQ_INT(tg[4], -1);
        CHECK_EQ_INT(tg[5], -1);
    }
    for (int i = 0; i < R; i++) {
        ns_sampler_free(&sc[i]);
        ns_sampler_free(&sg[i]);
    }
    pair_free(&p);
    free(lg);
}

TEST(test_errors_are_reported) {
    /* a bad op is reported at the next sync point, not silently ignored */
    pair a, b;
    pair_alloc(&a, 4, 8);
    pair_alloc(&b, 4, 9);
    gpu->ops->add(gpu, &a.g, &b.g);
    ns_error e = {0};
    CHECK(gpu->ops->sync(gpu, &e) != NS_OK);
    pair_free(&a);
    pair_free(&b);
}

int main(void) {
    if (!gpu_test_open(8)) return 1;
    RUN(test_weight_random_matches_cpu);
    RUN(test_weight_from_host_f32_rounds_to_bf16);
    RUN(test_embed);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu_add);
    RUN(test_gather_rows);
    RUN(test_matmul);
    RUN(test_matmul_gemv_paths);
    RUN(test_matmul_view_with_offset);
    RUN(test_attention);
    RUN(test_attention_long_decode_splits);
    RUN(test_attention_prefill_boundaries);
    RUN(test_attention_40k_context);
    RUN(test_attention_decode_mixed);
    RUN(test_attention_decode_load_modes);
    RUN(test_kv_pages);
    RUN(test_kv_pages_async);
    RUN(test_sample);
    RUN(test_argmax_large_vocab);
    RUN(test_attention_prefill_variants); /* late: a trapping variant ends the context */
    RUN(test_errors_are_reported); /* last: leaves the backend in error */
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END;
}
