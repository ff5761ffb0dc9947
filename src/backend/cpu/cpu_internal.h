/* cpu_internal.h — state and helpers shared by the CPU backend's files.
 * Private to src/backend/cpu/. */
#ifndef NS_CPU_INTERNAL_H
#define NS_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/backend.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/quant.h"

typedef struct cpu_impl {
    ns_pool *pool;
    /* batch copy */
    int32_t n_tokens, n_seqs, max_pages, n_logits;
    int32_t *tokens, *positions, *seq_start, *seq_len, *page_table, *logit_rows, *tok_seq;
    size_t cap_tok, cap_pos, cap_tseq, cap_ss, cap_sl, cap_pt, cap_lr;
    /* KV pool */
    uint8_t *kv;
    /* e4m3 code -> float, filled by kv_alloc for FP8 pools (attention
     * dequantizes pages through it; threads only read it) */
    float fp8_lut[256];
    /* per-thread scratch: a dequantized weight row / attention temp */
    float **scratch;
    size_t scratch_len;
    /* moe_ffn's routing and activations (cpu_moe.c), engine thread only */
    float *moe_f;
    size_t moe_f_cap;
    int32_t *moe_i;
    size_t moe_i_cap;
} cpu_impl;

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000 | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Row r of a weight tensor as f32: F32 rows are returned in place, BF16
 * rows converted into buf (cols floats). */
static inline const float *row_f32(const ns_tensor *w, int64_t r, float *buf) {
    if (w->dtype == NS_DT_F32) return (const float *)w->data + r * w->cols;
    if (ns_dtype_is_quant(w->dtype) || w->dtype == NS_DT_F16) { /* GGUF blocks, F16 (quant.h) */
        ns_quant_dequant_row(w->dtype, (const uint8_t *)w->data + (size_t)r * ns_dtype_row_bytes(w->dtype, w->cols), buf,
                             w->cols);
        return buf;
    }
    const uint16_t *src = (const uint16_t *)w->data + r * w->cols;
    int64_t i = 0;
#ifdef __AVX2__
    for (; i + 8 <= w->cols; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(u));
    }
#endif
    for (; i < w->cols; i++) buf[i] = bf16_to_f32(src[i]);
    return buf;
}

#ifdef __AVX2__
/* Sum of the 8 lanes of v. */
static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

static inline float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0;
#ifdef __AVX2__
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    s = hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* dot(a (f32), b (bf16)) without materializing b as f32: decode reads
 * each weight once, so converting into scratch first doubled the memory
 * traffic of the hottest loop. */
static inline float dot_bf16(const float *a, const uint16_t *b, int64_t n) {
    int64_t i = 0;
    float s = 0;
#ifdef __AVX2__
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + i))), 16));
        __m256 b1 = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + i + 8))), 16));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * bf16_to_f32(b[i]);
    return s;
}

/* y += a * x */
static inline void axpy(float *y, float a, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef __AVX2__
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++) y[i] += a * x[i];
}


/* Grows every thread's scratch to at least n floats. Call from the engine
 * thread only (outside ns_pool_run). */
int ns_cpu_scratch_reserve(cpu_impl *c, size_t n);

void cpu_embed(ns_backend *be, ns_tensor *out, const ns_tensor *table);
void cpu_rmsnorm(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w, float eps);
void cpu_matmul(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w);
void cpu_rope(ns_backend *be, ns_tensor *x, int n_heads, int head_dim, const ns_tensor *inv_freq);
void cpu_swiglu(ns_backend *be, ns_tensor *out, const ns_tensor *gate, const ns_tensor *up);
void cpu_add(ns_backend *be, ns_tensor *out, const ns_tensor *x);
void cpu_kv_store(ns_backend *be, int layer, const ns_tensor *k, const ns_tensor *v);
void cpu_attention(ns_backend *be, ns_tensor *out, const ns_tensor *q, int layer, int n_heads, float scale);
void cpu_gather_rows(ns_backend *be, ns_tensor *out, const ns_tensor *in);
void cpu_add_bias(ns_backend *be, ns_tensor *out, const ns_tensor *b);
void cpu_moe_ffn(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                 const ns_tensor *experts, int n_experts, int top_k, bool norm_topk);

#endif
