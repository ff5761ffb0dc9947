/* quant.c — ggml block formats on the CPU (see quant.h).
 *
 * Block layouts (little-endian, packed, as in GGUF files):
 *   Q8_0  { f16 d; int8 qs[32]; }                         x = d * q
 *   Q4_0  { f16 d; u8 qs[16]; }     q = nibble - 8, low nibbles are values
 *                                   0..15, high nibbles 16..31
 *   Q4_K  { f16 d, dmin; u8 scales[12]; u8 qs[128]; }      8 sub-blocks of
 *         32 with 6-bit scale/min: x = d*sc*q - dmin*m
 *   Q5_K  { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; } as Q4_K
 *         with a fifth bit from qh
 *   Q6_K  { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d; } 16 groups of
 *         16: x = d*sc*(q - 32), q 6-bit
 *   Q4_1  { f16 d, m; u8 qs[16]; }                        x = d*q + m, q 0..15
 *   Q5_0  { f16 d; u32 qh; u8 qs[16]; }  q = nibble | bit j of qh << 4, x = d*(q - 16)
 *   Q5_1  { f16 d, m; u32 qh; u8 qs[16]; }                 x = d*q + m, q 0..31
 * Activation blocks: Q8_0 as above; Q8_1 { f16 d; f16 s = d*Σq; int8
 * qs[32]; } for the weights with a min (Q4_1, Q5_1); Q8_K { f32 d; int8 qs[256];
 * int16 bsums[16]; } (bsums = sums of 16 consecutive qs, for the k-quants'
 * min and offset terms).
 */
#include "backend/cpu/quant.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#define QK 32
#define QKK 256
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q8_K_BYTES (4 + 256 + 32)
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q8_1_BYTES 36

float ns_fp16_to_fp32(uint16_t h) { return f16_to_f32(h); }

uint16_t ns_fp32_to_fp16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000;
    u &= 0x7fffffff;
    if (u > 0x7f800000) return (uint16_t)(sign | 0x7e00);           /* NaN */
    if (u >= 0x477ff000) return (uint16_t)(sign | 0x7c00);          /* overflow -> inf */
    if (u < 0x38800000) {                                            /* subnormal or zero */
        if (u < 0x33000000) return (uint16_t)sign;
        const uint32_t e = u >> 23, m = (u & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((u >> 13) - (112u << 10));
    const uint32_t rem = u & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static inline float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block. */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ------------------------------------------------------- dequantization */

static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += Q8_0_BYTES, y += QK) {
        const float d = ld_f16(b);
        for (int j = 0; j < QK; j++) y[j] = d * (float)(int8_t)b[2 + j];
    }
}

static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += Q4_0_BYTES, y += QK) {
        const float d = ld_f16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[2 + j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

/* The 32 codes of a Q4_1 / Q5_0 / Q5_1 block in element order: 0..15 or
 * 0..31 (Q5_0 still to be offset by -16). */
static inline void legacy_codes(ns_dtype dt, const uint8_t *b, uint8_t *q) {
    const uint8_t *qs = b + (dt == NS_DT_Q4_1 ? 4 : dt == NS_DT_Q5_0 ? 6 : 8);
    uint32_t qh = 0;
    if (dt != NS_DT_Q4_1) memcpy(&qh, b + (dt == NS_DT_Q5_0 ? 2 : 4), 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
        q[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
}

static size_t legacy_bytes(ns_dtype dt) { return dt == NS_DT_Q4_1 ? Q4_1_BYTES : dt == NS_DT_Q5_0 ? Q5_0_BYTES : Q5_1_BYTES; }

static void deq_legacy(ns_dtype dt, const uint8_t *b, float *y, int64_t nb) {
    uint8_t q[32];
    for (int64_t i = 0; i < nb; i++, b += legacy_bytes(dt), y += QK) {
        const float d = ld_f16(b), m = dt == NS_DT_Q5_0 ? 0.f : ld_f16(b + 2);
        legacy_codes(dt, b, q);
        for (int j = 0; j < QK; j++) y[j] = dt == NS_DT_Q5_0 ? d * (float)(q[j] - 16) : (float)q[j] * d + m;
    }
}

static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += Q4_K_BYTES) {
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        const uint8_t *sc = b + 4, *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t s1, m1, s2, m2;
            scale_min_k4(j, sc, &s1, &m1);
            scale_min_k4(j + 1, sc, &s2, &m2);
            for (int l = 0; l < 32; l++) *y++ = d * s1 * (float)(q[l] & 0xF) - dmin * m1;
            for (int l = 0; l < 32; l++) *y++ = d * s2 * (float)(q[l] >> 4) - dmin * m2;
        }
    }
}

static void deq_q5_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += Q5_K_BYTES) {
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
        for (int j = 0; j < 8; j += 2, ql += 32) {
            uint8_t s1, m1, s2, m2;
            scale_min_k4(j, sc, &s1, &m1);
            scale_min_k4(j + 1, sc, &s2, &m2);
            for (int l = 0; l < 32; l++)
                *y++ = d * s1 * (float)((ql[l] & 0xF) + (((qh[l] >> j) & 1) << 4)) - dmin * m1;
            for (int l = 0; l < 32; l++)
                *y++ = d * s2 * (float)((ql[l] >> 4) + (((qh[l] >> (j + 1)) & 1) << 4)) - dmin * m2;
        }
    }
}

/* The 256 6-bit values of a Q6_K block minus 32, in element order. */
static void q6_k_values(const uint8_t *b, int8_t *q) {
    const uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, q += 128)
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
}

static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    int8_t q[256];
    for (int64_t i = 0; i < nb; i++, b += Q6_K_BYTES, y += QKK) {
        const float d = ld_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        q6_k_values(b, q);
        for (int j = 0; j < 256; j++) y[j] = d * (float)sc[j / 16] * (float)q[j];
    }
}

void ns_quant_dequant_row(ns_dtype dt, const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    switch (dt) {
    case NS_DT_Q8_0: deq_q8_0(b, dst, n / QK); break;
    case NS_DT_Q4_0: deq_q4_0(b, dst, n / QK); break;
    case NS_DT_Q4_K: deq_q4_k(b, dst, n / QKK); break;
    case NS_DT_Q5_K: deq_q5_k(b, dst, n / QKK); break;
    case NS_DT_Q6_K: deq_q6_k(b, dst, n / QKK); break;
    case NS_DT_Q4_1: case NS_DT_Q5_0: case NS_DT_Q5_1: deq_legacy(dt, b, dst, n / QK); break;
    case NS_DT_F16: {
        const uint16_t *h = src;
        int64_t i = 0;
#ifdef __F16C__
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
        for (; i < n; i++) dst[i] = f16_to_f32(h[i]);
        break;
    }
    default: memset(dst, 0, (size_t)n * sizeof *dst); break;
    }
}

float ns_dot_f16(const float *a, const uint16_t *b, int64_t n) {
    int64_t i = 0;
    float s = 0;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        const __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        const __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    s = hsum8(_mm256_add_ps(acc0, acc1));
#endif
    for (; i < n; i++) s += a[i] * f16_to_f32(b[i]);
    return s;
}

/* ------------------------------------------------ activation quantization */

static bool is_k(ns_dtype dt) { return dt == NS_DT_Q4_K || dt == NS_DT_Q5_K || dt == NS_DT_Q6_K; }

static bool has_min(ns_dtype dt) { return dt == NS_DT_Q4_1 || dt == NS_DT_Q5_1; }

size_t ns_quant_act_row_bytes(ns_dtype dt, int64_t n) {
    return is_k(dt) ? (size_t)(n / QKK) * Q8_K_BYTES : (size_t)(n / QK) * (has_min(dt) ? Q8_1_BYTES : Q8_0_BYTES);
}

/* The codes of a block are x * id, llama.cpp's arithmetic, with id =
 * lim / amax. When the block's largest magnitude is so small (subnormal)
 * that id overflows to inf, x * id is inf or NaN (0 * inf), and casting
 * those to an integer is undefined behaviour (found by fuzz_gguf): such a
 * block is coded from x / amax * lim instead, which stays finite. The
 * choice is per block, so the common loop stays x * id alone. */

/* Q8_0: d = amax/127 stored as f16; q = round-half-even(x * 127/amax),
 * which is what llama.cpp's x86 path computes (see above for a block
 * whose 127/amax overflows). */
static void act_q8_0(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK, b += Q8_0_BYTES) {
        float amax = 0;
        bool finite = true;
        for (int j = 0; j < QK; j++) {
            finite &= fabsf(x[j]) <= FLT_MAX;
            amax = fmaxf(amax, fabsf(x[j]));
        }
        if (!finite) { /* NaN scale, zero codes: the products stay NaN (a
                        * corrupt model's NaN reaches the logits, where the
                        * engine reports it) and no NaN is cast to int8 */
            memset(b, 0, Q8_0_BYTES);
            b[0] = 0x00, b[1] = 0x7e;
            continue;
        }
        const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
        uint16_t h = ns_fp32_to_fp16(d);
        memcpy(b, &h, 2);
        if (isinf(id))
            for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)nearbyintf(x[j] / amax * 127.f);
        else
            for (int j = 0; j < QK; j++) b[2 + j] = (uint8_t)(int8_t)nearbyintf(x[j] * id);
    }
}

/* Q8_K: the value of largest magnitude maps to -127 (llama.cpp's current
 * scheme; q spans -127..127), scale d = max / -127. */
static void act_q8_k(const float *x, uint8_t *b, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QKK, b += Q8_K_BYTES) {
        float amax = 0, mx = 0;
        bool finite = true;
        for (int j = 0; j < QKK; j++) {
            finite &= fabsf(x[j]) <= FLT_MAX;
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        }
        int8_t *q = (int8_t *)(b + 4);
        int16_t bs[16];
        if (amax == 0 || !finite) { /* zero, or NaN scale (see act_q8_0) */
            memset(b, 0, Q8_K_BYTES);
            if (!finite) {
                const float nan = NAN;
                memcpy(b, &nan, 4);
            }
            continue;
        }
        const float iscale = -127.f / mx;
        const bool id_inf = isinf(iscale); /* see act_q8_0 */
        for (int j = 0; j < QKK; j++) {
            long v = lrintf(id_inf ? x[j] / -mx * 127.f : iscale * x[j]);
            q[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[j * 16 + l];
            bs[j] = (int16_t)s;
        }
        const float d = 1.f / iscale;
        memcpy(b, &d, 4);
        memcpy(b + 4 + 256, bs, sizeof bs);
    }
}

/* Q8_1: Q8_0's codes with the block's f16 sum d*Σq after the scale. */
static void act_q8_1(const float *x, uint8_t *b, int64_t nb) {
    uint8_t tmp[Q8_0_BYTES];
    for (int64_t i = 0; i < nb; i++, x += QK, b += Q8_1_BYTES) {
        act_q8_0(x, tmp, 1);
        int sum = 0;
        float amax = 0;
        for (int j = 0; j < QK; j++) {
            sum += (int8_t)tmp[2 + j];
            amax = fmaxf(amax, fabsf(x[j]));
        }
        memcpy(b, tmp, 2);
        /* s from the unrounded scale amax/127, as llama.cpp computes it */
        const uint16_t s = (tmp[1] & 0x7c) == 0x7c ? 0x7e00 : ns_fp32_to_fp16(amax / 127.f * (float)sum);
        memcpy(b + 2, &s, 2);
        memcpy(b + 4, tmp + 2, QK);
    }
}

void ns_quant_act_row(ns_dtype dt, const float *x, void *dst, int64_t n) {
    if (is_k(dt)) act_q8_k(x, dst, n / QKK);
    else if (has_min(dt)) act_q8_1(x, dst, n / QK);
    else act_q8_0(x, dst, n / QK);
}

void ns_quant_weight_row_ref(ns_dtype dt, const float *x, void *dst, int64_t n) {
    uint8_t *b = dst;
    if (dt == NS_DT_Q8_0) {
        act_q8_0(x, b, n / QK);
        return;
    }
    /* Q4_0 reference: d = max / -8 (the signed value of largest magnitude),
     * q = min(15, (int)(x/d + 8.5)). */
    for (int64_t i = 0; i < n / QK; i++, x += QK, b += Q4_0_BYTES) {
        float amax = 0, mx = 0;
        for (int j = 0; j < QK; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        const float d = mx / -8.f, id = d != 0 ? 1.f / d : 0.f;
        uint16_t h = ns_fp32_to_fp16(d);
        memcpy(b, &h, 2);
        for (int j = 0; j < 16; j++) {
            int a = (int)(x[j] * id + 8.5f), c = (int)(x[j + 16] * id + 8.5f);
            a = a > 15 ? 15 : a;
            c = c > 15 ? 15 : c;
            b[2 + j] = (uint8_t)(a | (c << 4));
        }
    }
}

/* ---------------------------------------------------------- dot products */

#ifdef __AVX2__
static inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 8 int32 partial sums of x (signed int8) * y (signed int8), 32 lanes. */
static inline __m256i dot_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}
#endif

static float dot_q8_0(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float s = 0;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, w += Q8_0_BYTES, a += Q8_0_BYTES) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(w + 2)), y = _mm256_loadu_si256((const __m256i *)(a + 2));
        const __m256 d = _mm256_set1_ps(ld_f16(w) * ld_f16(a));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(x, y)), acc);
    }
    s = hsum8(acc);
#else
    for (int64_t i = 0; i < nb; i++, w += Q8_0_BYTES, a += Q8_0_BYTES) {
        int sum = 0;
        for (int j = 0; j < QK; j++) sum += (int8_t)w[2 + j] * (int8_t)a[2 + j];
        s += (float)sum * (ld_f16(w) * ld_f16(a));
    }
#endif
    return s;
}

static float dot_q4_0(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float s = 0;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    const __m256i lo = _mm256_set1_epi8(0xF), eight = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < nb; i++, w += Q4_0_BYTES, a += Q8_0_BYTES) {
        const __m128i t = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i x = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        x = _mm256_sub_epi8(_mm256_and_si256(x, lo), eight);
        const __m256i y = _mm256_loadu_si256((const __m256i *)(a + 2));
        const __m256 d = _mm256_set1_ps(ld_f16(w) * ld_f16(a));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(x, y)), acc);
    }
    s = hsum8(acc);
#else
    for (int64_t i = 0; i < nb; i++, w += Q4_0_BYTES, a += Q8_0_BYTES) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((w[2 + j] & 0xF) - 8) * (int8_t)a[2 + j] + ((w[2 + j] >> 4) - 8) * (int8_t)a[2 + 16 + j];
        s += (float)sum * (ld_f16(w) * ld_f16(a));
    }
#endif
    return s;
}

/* Q4_K / Q5_K share the scale/min structure: sum = d*yd*Σ sc_j*Σ(q*y)
 * - dmin*yd*Σ m_j*(bsum_2j + bsum_2j+1). q5 selects the fifth bit. */
static float dot_q45_k(const uint8_t *w, const uint8_t *a, int64_t nb, bool q5) {
    float s = 0;
    for (int64_t i = 0; i < nb; i++, w += q5 ? Q5_K_BYTES : Q4_K_BYTES, a += Q8_K_BYTES) {
        float yd;
        memcpy(&yd, a, 4);
        const int8_t *y = (const int8_t *)(a + 4);
        int16_t bs[16];
        memcpy(bs, a + 4 + 256, sizeof bs);
        const uint8_t *sc = w + 4, *qh = w + 16, *q = w + (q5 ? 48 : 16);
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t s1, m1, s2, m2;
            scale_min_k4(j, sc, &s1, &m1);
            scale_min_k4(j + 1, sc, &s2, &m2);
            summ += m1 * (bs[2 * j] + bs[2 * j + 1]) + m2 * (bs[2 * j + 2] + bs[2 * j + 3]);
            int d1, d2;
#ifdef __AVX2__
            const __m256i qv = _mm256_loadu_si256((const __m256i *)q), lo = _mm256_set1_epi8(0xF);
            __m256i x1 = _mm256_and_si256(qv, lo), x2 = _mm256_and_si256(_mm256_srli_epi16(qv, 4), lo);
            if (q5) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)qh), one = _mm256_set1_epi8(1);
                x1 = _mm256_or_si256(x1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4));
                x2 = _mm256_or_si256(x2, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j + 1), one), 4));
            }
            const __m256i ones = _mm256_set1_epi16(1);
            d1 = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(x1, _mm256_loadu_si256((const __m256i *)y)), ones));
            d2 = hsum_i32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(x2, _mm256_loadu_si256((const __m256i *)(y + 32))), ones));
#else
            d1 = d2 = 0;
            for (int l = 0; l < 32; l++) {
                int v1 = q[l] & 0xF, v2 = q[l] >> 4;
                if (q5) {
                    v1 += ((qh[l] >> j) & 1) << 4;
                    v2 += ((qh[l] >> (j + 1)) & 1) << 4;
                }
                d1 += v1 * y[l];
                d2 += v2 * y[32 + l];
            }
#endif
            sumi += s1 * d1 + s2 * d2;
        }
        s += yd * ld_f16(w) * (float)sumi - yd * ld_f16(w + 2) * (float)summ;
    }
    return s;
}

static float dot_q6_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float s = 0;
    int8_t q[256];
    for (int64_t i = 0; i < nb; i++, w += Q6_K_BYTES, a += Q8_K_BYTES) {
        float yd;
        memcpy(&yd, a, 4);
        const int8_t *y = (const int8_t *)(a + 4), *sc = (const int8_t *)(w + 192);
        q6_k_values(w, q);
        int sumi = 0;
#ifdef __AVX2__
        /* Unsigned q+32 (0..63) times signed y, then minus 32*Σy per group
         * from the activation's block sums (maddubs needs one unsigned side;
         * the sign trick of dot_i8 would also do, as y >= -127). */
        int16_t bs[16];
        memcpy(bs, a + 4 + 256, sizeof bs);
        __m256i acc = _mm256_setzero_si256();
        const __m256i off = _mm256_set1_epi8(32);
        for (int g = 0; g < 16; g += 2) {
            /* 32 values = groups g and g+1; scale each half by its group's scale */
            const __m256i x = _mm256_add_epi8(_mm256_loadu_si256((const __m256i *)(q + g * 16)), off);
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(y + g * 16));
            const __m256i p = _mm256_maddubs_epi16(x, yv);
            const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv));
        }
        sumi = hsum_i32(acc);
        for (int g = 0; g < 16; g++) sumi -= 32 * sc[g] * bs[g];
#else
        for (int g = 0; g < 16; g++) {
            int d = 0;
            for (int l = 0; l < 16; l++) d += q[g * 16 + l] * y[g * 16 + l];
            sumi += sc[g] * d;
        }
#endif
        s += yd * ld_f16(w + 208) * (float)sumi;
    }
    return s;
}

/* Q4_1 / Q5_0 / Q5_1: codes unpacked per block, then an integer dot with
 * the activation codes; Q5_0 offsets its codes by -16 (activation Q8_0),
 * the others add min * (the activation block's d*Σq) (activation Q8_1). */
static float dot_legacy(ns_dtype dt, const uint8_t *w, const uint8_t *a, int64_t nb) {
    float s = 0;
    uint8_t q[32];
    const bool q50 = dt == NS_DT_Q5_0;
    const size_t ab = q50 ? Q8_0_BYTES : Q8_1_BYTES, qoff = q50 ? 2 : 4;
    for (int64_t i = 0; i < nb; i++, w += legacy_bytes(dt), a += ab) {
        legacy_codes(dt, w, q);
        const int8_t *y = (const int8_t *)(a + qoff);
        int sumi;
#ifdef __AVX2__
        const __m256i x = _mm256_loadu_si256((const __m256i *)q), yv = _mm256_loadu_si256((const __m256i *)y);
        sumi = hsum_i32(_mm256_madd_epi16(_mm256_maddubs_epi16(x, yv), _mm256_set1_epi16(1)));
#else
        sumi = 0;
        for (int j = 0; j < QK; j++) sumi += q[j] * y[j];
#endif
        if (q50) {
            int ysum = 0;
            for (int j = 0; j < QK; j++) ysum += y[j];
            s += (float)(sumi - 16 * ysum) * (ld_f16(w) * ld_f16(a));
        } else {
            s += (float)sumi * (ld_f16(w) * ld_f16(a)) + ld_f16(w + 2) * ld_f16(a + 2);
        }
    }
    return s;
}

float ns_quant_dot(ns_dtype dt, const void *w, const void *act, int64_t n) {
    switch (dt) {
    case NS_DT_Q8_0: return dot_q8_0(w, act, n / QK);
    case NS_DT_Q4_0: return dot_q4_0(w, act, n / QK);
    case NS_DT_Q4_K: return dot_q45_k(w, act, n / QKK, false);
    case NS_DT_Q5_K: return dot_q45_k(w, act, n / QKK, true);
    case NS_DT_Q6_K: return dot_q6_k(w, act, n / QKK);
    case NS_DT_Q4_1: case NS_DT_Q5_0: case NS_DT_Q5_1: return dot_legacy(dt, w, act, n / QK);
    default: return NAN;
    }
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
    ns_tensor *out;
    const ns_tensor *w;
    const uint8_t *act;
    size_t act_row, w_row;
    int64_t n;
} qmm_ctx;

static void qmm_task(void *p, int64_t b, int64_t e, int tid) {
    const qmm_ctx *x = p;
    const int64_t m = x->out->cols, k = x->w->cols;
    float *out = x->out->data;
    const uint8_t *w = x->w->data;
    for (int64_t j = b; j < e; j++) {
        const uint8_t *wr = w + (size_t)j * x->w_row;
        for (int64_t i = 0; i < x->n; i++)
            out[i * m + j] = ns_quant_dot(x->w->dtype, wr, x->act + (size_t)i * x->act_row, k);
    }
}

void ns_cpu_quant_matmul(struct cpu_impl *c, ns_tensor *out, const ns_tensor *in, const ns_tensor *w) {
    const int64_t n = in->rows, k = in->cols;
    const size_t act_row = ns_quant_act_row_bytes(w->dtype, k);
    /* The quantized activations live in scratch[0]; every thread's scratch
     * grows to the same size, so cap it at what a prefill BLAS block
     * already takes (64 rows of k floats) and walk the input rows in tiles
     * of that many quantized rows (each tile re-reads the weights, which a
     * tile of >= 60 rows amortizes). */
    const size_t cap_floats = (size_t)k * 64, want = (act_row * (size_t)n + sizeof(float) - 1) / sizeof(float);
    const size_t reserve = want < cap_floats ? want : cap_floats;
    if (ns_cpu_scratch_reserve(c, reserve) != 0) {
        for (int64_t i = 0; i < out->rows * out->cols; i++) ((float *)out->data)[i] = NAN;
        return;
    }
    int64_t tile = (int64_t)(reserve * sizeof(float) / act_row);
    if (tile < 1) tile = 1;
    uint8_t *act = (uint8_t *)c->scratch[0];
    for (int64_t r0 = 0; r0 < n; r0 += tile) {
        const int64_t nr = n - r0 < tile ? n - r0 : tile;
        for (int64_t i = 0; i < nr; i++)
            ns_quant_act_row(w->dtype, (const float *)in->data + (r0 + i) * k, act + (size_t)i * act_row, k);
        ns_tensor o = *out;
        o.data = (float *)out->data + r0 * out->cols;
        o.rows = nr;
        qmm_ctx x = {&o, w, act, act_row, ns_dtype_row_bytes(w->dtype, k), nr};
        ns_pool_run(c->pool, w->rows, 4, qmm_task, &x);
    }
}
