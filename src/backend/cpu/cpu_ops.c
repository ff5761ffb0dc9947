/* cpu_ops.c — the compute ops of the CPU backend (see backend.h for the
 * contract of each). Each op splits its rows over the thread pool; per
 * thread scratch (cpu_impl.scratch) holds dequantized weight rows and the
 * attention accumulator, so no op allocates on the hot path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend/cpu/cpu_internal.h"
#include "util/fp8.h"
#include "util/vmath.h"

/* ---------------------------------------------------------------- embed */

typedef struct {
    cpu_impl *c;
    ns_tensor *out;
    const ns_tensor *table;
} embed_ctx;

static void embed_task(void *p, int64_t b, int64_t e, int tid) {
    embed_ctx *x = p;
    for (int64_t t = b; t < e; t++) {
        float *dst = (float *)x->out->data + t * x->out->cols;
        const float *src = row_f32(x->table, x->c->tokens[t], dst);
        if (src != dst) memcpy(dst, src, (size_t)x->out->cols * sizeof(float));
    }
}

void cpu_embed(ns_backend *be, ns_tensor *out, const ns_tensor *table) {
    cpu_impl *c = be->impl;
    embed_ctx x = {c, out, table};
    ns_pool_run(c->pool, c->n_tokens, 16, embed_task, &x);
}

/* -------------------------------------------------------------- rmsnorm */

typedef struct {
    ns_tensor *out;
    const ns_tensor *in, *w;
    float eps;
} norm_ctx;

static void norm_task(void *p, int64_t b, int64_t e, int tid) {
    norm_ctx *x = p;
    const int64_t n = x->in->cols;
    const float *w = x->w->data;
    for (int64_t r = b; r < e; r++) {
        const float *src = (const float *)x->in->data + r * n;
        float *dst = (float *)x->out->data + r * n;
        float ss = dot(src, src, n);
        float inv = 1.0f / sqrtf(ss / (float)n + x->eps);
        for (int64_t i = 0; i < n; i++) dst[i] = w[i] * (src[i] * inv);
    }
}

void cpu_rmsnorm(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w, float eps) {
    cpu_impl *c = be->impl;
    norm_ctx x = {out, in, w, eps};
    ns_pool_run(c->pool, in->rows, 8, norm_task, &x);
}

/* --------------------------------------------------------------- matmul */

typedef struct {
    cpu_impl *c;
    ns_tensor *out;
    const ns_tensor *in, *w;
} mm_ctx;

/* Decode-shaped products (few input rows): task = a block of weight rows,
 * each dequantized once into the thread's scratch and dotted with every
 * input row. Memory-bound: one pass over the weights. */
static void mm_task(void *p, int64_t b, int64_t e, int tid) {
    mm_ctx *x = p;
    const int64_t n = x->in->rows, k = x->in->cols, m = x->out->cols;
    float *scratch = x->c->scratch[tid];
    const float *in = x->in->data;
    float *out = x->out->data;
    if (x->w->dtype == NS_DT_BF16 && n <= 2) {
        const uint16_t *w = x->w->data;
        for (int64_t j = b; j < e; j++)
            for (int64_t i = 0; i < n; i++) out[i * m + j] = dot_bf16(in + i * k, w + j * k, k);
        return;
    }
    if (x->w->dtype == NS_DT_F16 && n <= 2) { /* F16 in place (quant.h) */
        const uint16_t *w = x->w->data;
        for (int64_t j = b; j < e; j++)
            for (int64_t i = 0; i < n; i++) out[i * m + j] = ns_dot_f16(in + i * k, w + j * k, k);
        return;
    }
    for (int64_t j = b; j < e; j++) {
        const float *wr = row_f32(x->w, j, scratch);
        for (int64_t i = 0; i < n; i++) out[i * m + j] = dot(in + i * k, wr, k);
    }
}

/* Prefill-shaped products: task = a block of MM_BLOCK weight rows,
 * dequantized into scratch (BF16) or used in place (F32), multiplied by
 * all input rows with a single-threaded sgemm. Compute-bound: BLAS's
 * register blocking is ~10x the plain dot loop. */
#define MM_BLOCK 64
static void mm_blas_task(void *p, int64_t b, int64_t e, int tid) {
    mm_ctx *x = p;
    const int64_t n = x->in->rows, k = x->in->cols, m = x->out->cols;
    float *scratch = x->c->scratch[tid];
    for (int64_t blk = b; blk < e; blk++) {
        const int64_t j0 = blk * MM_BLOCK, nj = j0 + MM_BLOCK <= x->w->rows ? MM_BLOCK : x->w->rows - j0;
        const float *wb;
        if (x->w->dtype == NS_DT_F32) {
            wb = (const float *)x->w->data + j0 * k;
        } else {
            for (int64_t j = 0; j < nj; j++) row_f32(x->w, j0 + j, scratch + j * k);
            wb = scratch;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nj, (int)k, 1.0f, x->in->data, (int)k, wb,
                    (int)k, 0.0f, (float *)x->out->data + j0, (int)m);
    }
}

void cpu_matmul(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w) {
    cpu_impl *c = be->impl;
    if (ns_dtype_is_quant(w->dtype)) { /* GGUF blocks: dot products on the blocks (quant.c) */
        ns_cpu_quant_matmul(c, out, in, w);
        return;
    }
    const bool blas = in->rows >= 8;
    if (ns_cpu_scratch_reserve(c, (size_t)w->cols * (blas ? MM_BLOCK : 1)) != 0) {
        /* No memory for scratch: poison the output so the step's result
         * is visibly wrong (NaN logits are caught by the engine). */
        for (int64_t i = 0; i < out->rows * out->cols; i++) ((float *)out->data)[i] = NAN;
        return;
    }
    mm_ctx x = {c, out, in, w};
    if (blas) ns_pool_run(c->pool, (w->rows + MM_BLOCK - 1) / MM_BLOCK, 1, mm_blas_task, &x);
    else ns_pool_run(c->pool, w->rows, 4, mm_task, &x);
}

/* ----------------------------------------------------------------- rope */

typedef struct {
    cpu_impl *c;
    ns_tensor *x;
    int n_heads, head_dim;
    const float *inv_freq;
} rope_ctx;

static void rope_task(void *p, int64_t b, int64_t e, int tid) {
    rope_ctx *r = p;
    const int half = r->head_dim / 2;
    for (int64_t t = b; t < e; t++) {
        const float pos = (float)r->c->positions[t];
        float *row = (float *)r->x->data + t * r->x->cols;
        for (int i = 0; i < half; i++) {
            /* float32 angle, as HF computes inv_freq @ position_ids */
            const float ang = pos * r->inv_freq[i];
            const float cs = cosf(ang), sn = sinf(ang);
            for (int h = 0; h < r->n_heads; h++) {
                float *v = row + (size_t)h * (size_t)r->head_dim;
                const float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * cs - x2 * sn;
                v[i + half] = x2 * cs + x1 * sn;
            }
        }
    }
}

void cpu_rope(ns_backend *be, ns_tensor *x, int n_heads, int head_dim, const ns_tensor *inv_freq) {
    cpu_impl *c = be->impl;
    rope_ctx r = {c, x, n_heads, head_dim, inv_freq->data};
    ns_pool_run(c->pool, c->n_tokens, 8, rope_task, &r);
}

/* ------------------------------------------------------- swiglu and add */

typedef struct {
    ns_tensor *out;
    const ns_tensor *a, *b;
} ew_ctx;

static void swiglu_task(void *p, int64_t b, int64_t e, int tid) {
    ew_ctx *x = p;
    float *o = x->out->data;
    const float *g = x->a->data, *u = x->b->data;
    for (int64_t i = b; i < e; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_swiglu(ns_backend *be, ns_tensor *out, const ns_tensor *gate, const ns_tensor *up) {
    cpu_impl *c = be->impl;
    ew_ctx x = {out, gate, up};
    ns_pool_run(c->pool, gate->rows * gate->cols, 4096, swiglu_task, &x);
}

static void add_task(void *p, int64_t b, int64_t e, int tid) {
    ew_ctx *x = p;
    float *o = x->out->data;
    const float *a = x->a->data;
    for (int64_t i = b; i < e; i++) o[i] += a[i];
}

void cpu_add(ns_backend *be, ns_tensor *out, const ns_tensor *x) {
    cpu_impl *c = be->impl;
    ew_ctx a = {out, x, NULL};
    ns_pool_run(c->pool, out->rows * out->cols, 4096, add_task, &a);
}

/* ------------------------------------------------------------- KV store */

static inline float *kv_ptr(cpu_impl *c, const ns_kv_layout *l, int32_t seq, int32_t pos, int layer, int kv, int head) {
    int32_t page = c->page_table[(size_t)seq * (size_t)c->max_pages + (size_t)(pos / l->page_tokens)];
    return (float *)(c->kv + (size_t)page * l->page_size_bytes +
                     ns_kv_offset(l, layer, kv, head, pos % l->page_tokens));
}

/* FP8 pages: the tokens of a step are appended in order (tokens of one
 * sequence come in position order), each row through the scale policy of
 * util/fp8.h, so the bytes match the CUDA store kernels exactly. */
static void kv_store_fp8(cpu_impl *c, const ns_kv_layout *l, int layer, const ns_tensor *k, const ns_tensor *v) {
    const int D = l->head_dim, P = l->page_tokens;
    for (int32_t t = 0; t < c->n_tokens; t++) {
        const int32_t s = c->tok_seq[t], pos = c->positions[t];
        uint8_t *page = c->kv + (size_t)c->page_table[(size_t)s * (size_t)c->max_pages + (size_t)(pos / P)] *
                                    l->page_size_bytes;
        for (int h = 0; h < l->n_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++) {
                const ns_tensor *src = kv ? v : k;
                ns_fp8_append_row(page + ns_kv_offset(l, layer, kv, h, 0),
                                  (float *)(page + ns_kv_scale_offset(l, layer, kv, h)), pos % P,
                                  (const float *)src->data + t * src->cols + h * D, D);
            }
    }
}

void cpu_kv_store(ns_backend *be, int layer, const ns_tensor *k, const ns_tensor *v) {
    cpu_impl *c = be->impl;
    const ns_kv_layout *l = &be->kv;
    if (l->dtype == NS_DT_FP8_E4M3) {
        kv_store_fp8(c, l, layer, k, v);
        return;
    }
    const size_t d = (size_t)l->head_dim * sizeof(float);
    for (int32_t t = 0; t < c->n_tokens; t++) {
        const int32_t s = c->tok_seq[t], pos = c->positions[t];
        for (int h = 0; h < l->n_kv_heads; h++) {
            memcpy(kv_ptr(c, l, s, pos, layer, 0, h), (const float *)k->data + t * k->cols + h * l->head_dim, d);
            memcpy(kv_ptr(c, l, s, pos, layer, 1, h), (const float *)v->data + t * v->cols + h * l->head_dim, d);
        }
    }
}

/* ------------------------------------------------------------ attention */

typedef struct {
    ns_backend *be;
    cpu_impl *c;
    ns_tensor *out;
    const ns_tensor *q;
    int layer, n_heads;
    float scale;
} att_ctx;

/* n rows of D e4m3 codes under the float scale at sp -> dst (lut: code
 * -> value, cpu_impl.fp8_lut). */
static const float *dequant_rows(float *dst, const float *lut, const uint8_t *codes, const uint8_t *sp, int32_t n,
                                 int D) {
    float s;
    memcpy(&s, sp, sizeof s);
    for (size_t i = 0; i < (size_t)n * (size_t)D; i++) dst[i] = lut[codes[i]] * s;
    return dst;
}

/* Task index = token * n_heads + head. Softmax over the token's causal
 * window one page at a time: inside a page the K (and V) rows of one
 * layer and kv head are contiguous, so a page is a dense block of scores;
 * one online-softmax rescale per page, vectorized exp, then the weighted V
 * rows. (Scalar expf and per-key page arithmetic made attention ~90% of a
 * long CPU prefill.) */
static void att_task(void *p, int64_t b, int64_t e, int tid) {
    att_ctx *a = p;
    cpu_impl *c = a->c;
    const ns_kv_layout *l = &a->be->kv;
    const int D = l->head_dim, group = a->n_heads / l->n_kv_heads, P = l->page_tokens;
    const bool fp8 = l->dtype == NS_DT_FP8_E4M3;
    /* FP8: the scratch also holds one page's K and V rows dequantized (kv_alloc reserved them) */
    float *acc = c->scratch[tid], *sc = acc + D, *kq = fp8 ? sc + P : NULL, *vq = fp8 ? kq + (size_t)P * (size_t)D : NULL;
    for (int64_t task = b; task < e; task++) {
        const int32_t t = (int32_t)(task / a->n_heads);
        const int h = (int)(task % a->n_heads), kvh = h / group;
        const int32_t s = c->tok_seq[t], pos = c->positions[t];
        const float *q = (const float *)a->q->data + (size_t)t * (size_t)a->q->cols + (size_t)h * (size_t)D;
        const int32_t *pt = c->page_table + (size_t)s * (size_t)c->max_pages;
        const size_t k_off = ns_kv_offset(l, a->layer, 0, kvh, 0), v_off = ns_kv_offset(l, a->layer, 1, kvh, 0);
        float mx = -INFINITY, sum = 0.0f;
        memset(acc, 0, (size_t)D * sizeof(float));
        for (int32_t j0 = 0; j0 <= pos; j0 += P) {
            const int32_t n = pos + 1 - j0 < P ? pos + 1 - j0 : P;
            const uint8_t *page = c->kv + (size_t)pt[j0 / P] * l->page_size_bytes;
            const float *kr = (const float *)(page + k_off), *vr = (const float *)(page + v_off);
            if (fp8) { /* the reference attends to the dequantized rows: decode(code) * scale */
                kr = dequant_rows(kq, c->fp8_lut, page + k_off, page + ns_kv_scale_offset(l, a->layer, 0, kvh), n, D);
                vr = dequant_rows(vq, c->fp8_lut, page + v_off, page + ns_kv_scale_offset(l, a->layer, 1, kvh), n, D);
            }
            float bm = -INFINITY;
            for (int32_t jj = 0; jj < n; jj++) {
                sc[jj] = dot(q, kr + (size_t)jj * (size_t)D, D) * a->scale;
                if (sc[jj] > bm) bm = sc[jj];
            }
            if (bm > mx) {
                const float corr = expf(mx - bm);
                sum *= corr;
                for (int i = 0; i < D; i++) acc[i] *= corr;
                mx = bm;
            }
            ns_vexp_inplace(sc, n, mx);
            for (int32_t jj = 0; jj < n; jj++) {
                sum += sc[jj];
                axpy(acc, sc[jj], vr + (size_t)jj * (size_t)D, D);
            }
        }
        float *o = (float *)a->out->data + (size_t)t * (size_t)a->out->cols + (size_t)h * (size_t)D;
        const float inv = 1.0f / sum;
        for (int i = 0; i < D; i++) o[i] = acc[i] * inv;
    }
}

void cpu_attention(ns_backend *be, ns_tensor *out, const ns_tensor *q, int layer, int n_heads, float scale) {
    cpu_impl *c = be->impl;
    size_t need = (size_t)be->kv.head_dim + (size_t)be->kv.page_tokens;
    if (be->kv.dtype == NS_DT_FP8_E4M3) need += 2 * (size_t)be->kv.page_tokens * (size_t)be->kv.head_dim;
    if (ns_cpu_scratch_reserve(c, need) != 0) {
        for (int64_t i = 0; i < out->rows * out->cols; i++) ((float *)out->data)[i] = NAN;
        return;
    }
    att_ctx a = {be, c, out, q, layer, n_heads, scale};
    ns_pool_run(c->pool, (int64_t)c->n_tokens * n_heads, 1, att_task, &a);
}

/* ---------------------------------------------------------- gather rows */

void cpu_gather_rows(ns_backend *be, ns_tensor *out, const ns_tensor *in) {
    cpu_impl *c = be->impl;
    for (int32_t i = 0; i < c->n_logits; i++)
        memmove((float *)out->data + (size_t)i * (size_t)in->cols,
                (const float *)in->data + (size_t)c->logit_rows[i] * (size_t)in->cols, (size_t)in->cols * sizeof(float));
}
