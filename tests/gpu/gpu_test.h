/* gpu_test.h — what the GPU conformance tests (tests/gpu/test_*.c) share:
 * the pair of backends they compare (the CPU reference and CUDA device 0)
 * and a seeded xorshift64 source of random values.
 *
 * Inputs are random and never exactly zero: a kernel that skips work or
 * reads the wrong element must not pass by multiplying zeros. Each test
 * binary includes this once; GPU_TEST_SEED (defined before the include)
 * picks its stream, so a file's inputs do not change when another file's
 * tests do. Also random GGUF blocks (random_block / random_weight: scales
 * and quants random and nonzero), as the host bytes of a quantized weight.
 * Opt-in sections, each defined before the include: GPU_TEST_PAIRS (OK(),
 * rel_l2, a tensor on both backends), GPU_TEST_ATTENTION (ragged paged
 * batches and the per-sequence check), GPU_TEST_MODELS (a GGUF fixture
 * with an engine). Header-only (static), like tests/test.h. */
#ifndef NS_TESTS_GPU_TEST_H
#define NS_TESTS_GPU_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/quant.h"
#include "backend/cuda/cuda.h"

#ifndef GPU_TEST_SEED
#define GPU_TEST_SEED 0x9e3779b97f4a7c15ULL
#endif

static ns_backend *cpu, *gpu;
static uint64_t rs = GPU_TEST_SEED;

static uint64_t next_u64(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* uniform in [-1, 1), never exactly zero */
static float frand(void) {
    float f = (float)((double)(next_u64() >> 40) / 8388608.0 - 1.0);
    return f == 0.0f ? 0.5f : f;
}

/* Creates `cpu` (cpu_threads threads) and `gpu`; on failure prints the TAP
 * setup failure and returns false (the caller exits 1). */
static bool gpu_test_open(int cpu_threads) {
    ns_error err = {0};
    if (ns_backend_cuda_create(0, &gpu, &err) != NS_OK) {
        printf("not ok - setup: cuda backend: %s\n", err.msg);
        return false;
    }
    if (ns_backend_cpu_create(cpu_threads, &cpu, &err) != NS_OK) {
        printf("not ok - setup: cpu backend: %s\n", err.msg);
        return false;
    }
    return true;
}

/* ------------------------------------------------------ random blocks
 * (GGUF block types, for test_quant_cuda and test_moe_cuda) */

static inline uint32_t rnd(uint32_t n) { return (uint32_t)(next_u64() >> 33) % n; }


static inline void put_f16(uint8_t *p, float f) {
    const uint16_t h = ns_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

static inline uint8_t nz_nibble(void) { return (uint8_t)(1 + rnd(15)); }

/* One random block of type dt at b: scales random and nonzero, quants
 * random and nonzero (Q4_0: never the zero code 8). Values stay O(0.1). */
static inline void random_block(ns_dtype dt, uint8_t *b) {
    switch (dt) {
    case NS_DT_Q8_0:
        put_f16(b, (0.2f + 0.8f * fabsf(frand())) / 127.f);
        for (int i = 0; i < 32; i++) {
            int q = (int)rnd(254) - 127;
            b[2 + i] = (uint8_t)(int8_t)(q == 0 ? 1 : q);
        }
        break;
    case NS_DT_Q4_0:
        put_f16(b, (0.2f + 0.8f * fabsf(frand())) / 8.f * (frand() < 0 ? -1.f : 1.f));
        for (int i = 0; i < 16; i++) {
            uint8_t lo = (uint8_t)rnd(16), hi = (uint8_t)rnd(16);
            if (lo == 8) lo = 9;
            if (hi == 8) hi = 7;
            b[2 + i] = (uint8_t)(lo | hi << 4);
        }
        break;
    case NS_DT_Q4_K:
    case NS_DT_Q5_K: {
        const bool q5 = dt == NS_DT_Q5_K;
        const float dv = (0.2f + 0.8f * fabsf(frand())) / (63.f * (q5 ? 31.f : 15.f));
        put_f16(b, dv);
        put_f16(b + 2, dv * (q5 ? 15.f : 7.f) * (0.5f + fabsf(frand())));
        for (int i = 0; i < 12; i++) b[4 + i] = (uint8_t)(1 + rnd(255)); /* 6-bit scales nonzero in practice */
        /* make every sub-block's 6-bit scale nonzero */
        for (int j = 0; j < 4; j++)
            if ((b[4 + j] & 63) == 0) b[4 + j] |= 1;
        for (int j = 0; j < 4; j++)
            if ((b[12 + j] & 0xF) == 0 && (b[4 + j] >> 6) == 0) b[12 + j] |= 1;
        uint8_t *q = b + 16;
        if (q5) {
            for (int i = 0; i < 32; i++) b[16 + i] = (uint8_t)rnd(256);
            q = b + 48;
        }
        for (int i = 0; i < 128; i++) q[i] = (uint8_t)(nz_nibble() | nz_nibble() << 4);
        break;
    }
    case NS_DT_Q6_K:
        for (int i = 0; i < 128; i++) b[i] = (uint8_t)(nz_nibble() | nz_nibble() << 4);
        for (int i = 0; i < 64; i++) b[128 + i] = (uint8_t)rnd(256);
        for (int i = 0; i < 16; i++) {
            int s = (int)rnd(255) - 127;
            b[192 + i] = (uint8_t)(int8_t)(s == 0 ? 3 : s);
        }
        put_f16(b + 208, (0.2f + 0.8f * fabsf(frand())) / (64.f * 32.f));
        break;
    case NS_DT_Q4_1:
    case NS_DT_Q5_0:
    case NS_DT_Q5_1: { /* d, [m], [qh], qs */
        const bool m = dt != NS_DT_Q5_0, h = dt != NS_DT_Q4_1;
        put_f16(b, (0.2f + 0.8f * fabsf(frand())) / 16.f);
        if (m) put_f16(b + 2, -(0.2f + 0.8f * fabsf(frand())) * 0.5f);
        uint8_t *qh = b + (m ? 4 : 2), *qs = h ? qh + 4 : b + 4;
        if (h)
            for (int i = 0; i < 4; i++) qh[i] = (uint8_t)rnd(256);
        for (int i = 0; i < 16; i++) qs[i] = (uint8_t)(nz_nibble() | nz_nibble() << 4);
        break;
    }
    default: break;
    }
}

static inline int block_elems(ns_dtype dt) {
    return dt == NS_DT_Q4_K || dt == NS_DT_Q5_K || dt == NS_DT_Q6_K ? 256 : 32;
}

static inline uint8_t *random_weight(ns_dtype dt, int64_t rows, int64_t cols) {
    const size_t rb = ns_dtype_row_bytes(dt, cols), bb = rb / (size_t)(cols / block_elems(dt));
    uint8_t *w = malloc((size_t)rows * rb);
    for (size_t i = 0; i < (size_t)rows * (size_t)(cols / block_elems(dt)); i++) random_block(dt, w + i * bb);
    return w;
}

#ifdef GPU_TEST_PAIRS
/* Opt-in (define GPU_TEST_PAIRS before the include, after test.h): the
 * OK() status check, rel_l2 and a tensor on both backends with its
 * helpers, shared by test_ops.c, test_kv_fp8.c, test_moe_cuda.c and
 * test_quant_cuda.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Relative L2 error of a against ref; a NaN anywhere is infinitely wrong. */
static inline double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define OK(expr)                                                                          \
    do {                                                                                  \
        ns_error _e = {0};                                                                \
        ns_status _s = (expr);                                                            \
        if (_s != NS_OK) {                                                                \
            fprintf(stdout, "#   %s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, _e.msg); \
            t_cur_failed++;                                                               \
        }                                                                                 \
    } while (0)
/* the expression must use &_e as its ns_error */

/* An F32 tensor of the same shape on the CPU (c) and the GPU (g). */
typedef struct {
    ns_tensor c, g;
    int64_t rows, cols;
} pair;

static inline void pair_alloc(pair *p, int64_t rows, int64_t cols) {
    memset(p, 0, sizeof *p);
    p->rows = rows;
    p->cols = cols;
    OK(cpu->ops->tensor_alloc(cpu, &p->c, NS_DT_F32, rows, cols, &_e));
    OK(gpu->ops->tensor_alloc(gpu, &p->g, NS_DT_F32, rows, cols, &_e));
}

static inline void pair_upload(pair *p, const float *x) {
    OK(cpu->ops->tensor_upload(cpu, &p->c, x, &_e));
    OK(gpu->ops->tensor_upload(gpu, &p->g, x, &_e));
}

static inline void pair_set(pair *p, const float *x) { pair_upload(p, x); }

/* NaN into both sides: an element an op does not write fails the check. */
static inline void pair_poison(pair *p) {
    size_t n = (size_t)(p->rows * p->cols);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    pair_upload(p, x);
    free(x);
}

/* NaN into the GPU side only (the CPU side keeps its reference). */
static inline void pair_poison_gpu(pair *p) {
    size_t n = (size_t)(p->rows * p->cols);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    OK(gpu->ops->tensor_upload(gpu, &p->g, x, &_e));
    free(x);
}

static inline void pair_free(pair *p) {
    if (p->c.data) cpu->ops->tensor_free(cpu, &p->c);
    if (p->g.data) gpu->ops->tensor_free(gpu, &p->g);
}

/* The page ids 0..pages-1 in a random order (malloc'd, the caller frees
 * it): page tables built from it leave no sequence contiguous in the
 * pool. */
static inline int32_t *shuffled_pages(int pages) {
    int32_t *perm = malloc((size_t)pages * 4);
    for (int i = 0; i < pages; i++) perm[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        int j = (int)(next_u64() % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}
#endif /* GPU_TEST_PAIRS */

#ifdef GPU_TEST_ATTENTION
/* Opt-in (define GPU_TEST_ATTENTION with GPU_TEST_PAIRS): ragged paged
 * attention batches and their per-sequence check, shared by test_ops.c
 * (BF16 KV) and test_kv_fp8.c (FP8 KV). */

/* head dim, KV heads, query heads, page tokens */
typedef struct {
    int D, KVH, H, P;
} attn_cfg;

typedef struct {
    int32_t ctx; /* context after the step */
    int32_t n;   /* new tokens in the step */
} seq_spec;

/* A batch over sequences: each contributes tokens [ctx - n, ctx). */
typedef struct {
    ns_batch b;
    int32_t *tok, *pos, *ss, *sl, *lr;
} batch_buf;

/* Fills bb for the ns sequences sp (page table pt borrowed: it must
 * outlive bb's use); bb owns its arrays until batch_free. */
static inline void batch_make(batch_buf *bb, const seq_spec *sp, int ns, const int32_t *pt, int32_t max_pages) {
    int32_t T = 0;
    for (int s = 0; s < ns; s++) T += sp[s].n;
    bb->tok = calloc((size_t)T + 1, 4);
    bb->pos = calloc((size_t)T + 1, 4);
    bb->ss = calloc((size_t)ns + 1, 4);
    bb->sl = calloc((size_t)ns + 1, 4);
    bb->lr = calloc((size_t)T + 1, 4);
    int32_t t = 0;
    for (int s = 0; s < ns; s++) {
        bb->ss[s] = t;
        bb->sl[s] = sp[s].ctx;
        for (int32_t i = 0; i < sp[s].n; i++, t++) {
            bb->pos[t] = sp[s].ctx - sp[s].n + i;
            bb->tok[t] = 1;
        }
    }
    bb->ss[ns] = t;
    memset(&bb->b, 0, sizeof bb->b);
    bb->b.n_tokens = T;
    bb->b.n_seqs = ns;
    bb->b.tokens = bb->tok;
    bb->b.positions = bb->pos;
    bb->b.seq_start = bb->ss;
    bb->b.seq_len = bb->sl;
    bb->b.page_table = pt;
    bb->b.max_pages = max_pages;
    bb->b.logit_rows = bb->lr;
    bb->b.n_logits = 0;
}

static inline void batch_free(batch_buf *bb) {
    free(bb->tok);
    free(bb->pos);
    free(bb->ss);
    free(bb->sl);
    free(bb->lr);
}

/* Compares GPU with CPU output per sequence (rel L2 <= tol over the
 * sequence's rows) and per row (rel L2 <= row_tol), so one wrong tile or
 * row of a long sequence cannot hide in a batch-wide norm. */
static inline void check_by_seq(pair *out, const batch_buf *bb, double tol, double row_tol, const char *what) {
    const int32_t T = bb->b.n_tokens;
    const size_t C = (size_t)out->cols, n = (size_t)T * C;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    OK(cpu->ops->tensor_download(cpu, &out->c, a, &_e));
    OK(gpu->ops->tensor_download(gpu, &out->g, b, &_e));
    double worst_seq = 0, worst_row = 0;
    for (int32_t s = 0; s < bb->b.n_seqs; s++) {
        const int32_t t0 = bb->b.seq_start[s], t1 = bb->b.seq_start[s + 1];
        const double e = rel_l2(b + (size_t)t0 * C, a + (size_t)t0 * C, (size_t)(t1 - t0) * C);
        CHECKF(e <= tol, "%s: sequence %d (ctx %d, %d new): rel L2 %.3g > %.3g", what, s, bb->b.seq_len[s], t1 - t0, e,
               tol);
        if (e > worst_seq) worst_seq = e;
        int bad_rows = 0;
        for (int32_t t = t0; t < t1; t++) {
            const double r = rel_l2(b + (size_t)t * C, a + (size_t)t * C, C);
            if (r > worst_row) worst_row = r;
            if (!(r <= row_tol) && bad_rows++ < 3)
                CHECKF(r <= row_tol, "%s: sequence %d row %d (position %d): rel L2 %.3g > %.3g", what, s, t - t0,
                       bb->b.seq_len[s] - (t1 - t0) + (t - t0), r, row_tol);
        }
    }
    fprintf(stdout, "#   %-52s worst sequence %.3g, worst row %.3g\n", what, worst_seq, worst_row);
    free(a);
    free(b);
}
#endif /* GPU_TEST_ATTENTION */

#ifdef GPU_TEST_MODELS
/* Opt-in (define GPU_TEST_MODELS after test.h): a GGUF fixture loaded on
 * a backend with a small engine, and on both with its reference, shared by test_quant_cuda.c and
 * test_moe_cuda.c (they compare the same file on the CPU and CUDA). */
#include "engine/engine.h"
#include "model/model.h"

typedef struct {
    ns_model *m;
    ns_engine *e;
} loaded;

/* Loads path on be with an engine of 64 batch tokens, 64 logit rows and
 * 64 pages of 16 tokens (KV BF16 on the GPU, F32 on the CPU). False (and
 * a failed CHECKF) when either fails; L owns what was made either way:
 * unload_model frees it. */
static inline bool load_model(ns_backend *be, const char *path, loaded *L) {
    ns_error err = {0};
    memset(L, 0, sizeof *L);
    CHECKF(ns_model_load(path, be, &L->m, &err) == NS_OK, "%s (%s): %s", path, be->ops->name, err.msg);
    if (!L->m) return false;
    ns_engine_opts eo = {.max_batch_tokens = 64, .max_logits = 64, .page_tokens = 16, .n_pages = 64,
                         .kv_dtype = be == gpu ? NS_DT_BF16 : NS_DT_F32};
    CHECKF(ns_engine_create(L->m, &eo, &L->e, &err) == NS_OK, "%s", err.msg);
    return L->e != NULL;
}

static inline void unload_model(loaded *L) {
    ns_engine_free(L->e);
    ns_model_free(L->m);
}

/* The fixture gguf/<name>.gguf (under test_shared_path) loaded on the CPU
 * (C) and the GPU (G), and its llama.cpp reference gguf/<name>.llama.jsonl
 * opened into *f (the caller closes it; NULL after a failed CHECKF when it
 * cannot be opened); ref receives that path, for messages. False when a
 * load failed: then nothing is left loaded and no file is open. */
static inline bool fixture_open(const char *name, loaded *C, loaded *G, char *ref, size_t ref_size, FILE **f) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf/%s.gguf", test_shared_path(""), name);
    snprintf(ref, ref_size, "%s/gguf/%s.llama.jsonl", test_shared_path(""), name);
    if (!load_model(cpu, path, C)) return false;
    if (!load_model(gpu, path, G)) {
        unload_model(C);
        return false;
    }
    *f = fopen(ref, "r");
    CHECKF(*f != NULL, "%s: cannot open", ref);
    return true;
}
#endif /* GPU_TEST_MODELS */

#endif
