/* fp8.h — the FP8 E4M3 KV-cache element format and its per-page-head
 * scale policy, one definition shared by the CPU backend (the exact
 * reference) and the CUDA kernels (NS_HOSTDEV), so both write the same
 * bytes for the same K/V rows.
 *
 * E4M3 (OCP FP8 "e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa
 * bits; no infinities; S.1111.111 is NaN; the largest finite value is
 * 448 (0x7E); subnormals are m * 2^-9.
 *
 * Invariants
 * - Encoding rounds to nearest, ties to even, and saturates: any finite
 *   value (or infinity) beyond 448 becomes +-448, never NaN (e4m3 has no
 *   infinity, and a NaN in a page would poison every later attention).
 *   Only a NaN input gives the NaN code (0x7F with the input's sign).
 * - Decoding is exact (every e4m3 value is a float).
 * - Scale policy ("append as if one row at a time"): a page-head segment
 *   (one layer, K or V, one kv head of one page: P rows of head_dim codes)
 *   has one float scale s, a power of two; value = decode(code) * s.
 *   Appending row j (slot j) sets s' = max(s, ns_fp8_row_scale(amax(row)))
 *   (the smallest power of two >= amax / 448), where s is taken as 0 when
 *   j == 0 (a recycled page starts fresh); when s' > s the rows already in
 *   slots [0, j) are re-quantized to s' (code = enc(dec(code) * s / s')),
 *   then the row is encoded as enc(x / s'). Because a multi-row store is
 *   defined as these appends in slot order, the page bytes depend only on
 *   the rows, never on how a prompt was cut into steps (prefill chunk or
 *   decode): both backends and every chunking produce identical bytes.
 *   Every operation is a single IEEE multiply or divide (no fused
 *   multiply-add can form), so host and device agree bit for bit.
 */
#ifndef NS_UTIL_FP8_H
#define NS_UTIL_FP8_H

#include <stdint.h>
#include <string.h>

#include "util/hash.h" /* NS_HOSTDEV */

#define NS_FP8_E4M3_MAX 448.0f

static inline NS_HOSTDEV uint32_t ns_fp8_f2u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

static inline NS_HOSTDEV float ns_fp8_u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* float -> e4m3 code, round to nearest even, saturating (see above). */
static inline NS_HOSTDEV uint8_t ns_fp8_e4m3_from_float(float f) {
    const uint32_t u = ns_fp8_f2u(f);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN */
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (or inf): saturate */
    if (a >= 0x3c800000u) {                              /* >= 2^-6: normal in e4m3 */
        /* keep 3 mantissa bits, ties to even; a carry into the exponent is
         * the right result (1.111b rounds up to 2.0) */
        const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) & ~0xfffffu;
        const uint32_t e = (r >> 23) - 120u, m = (r >> 20) & 7u;
        uint32_t code = (e << 3) | m;
        if (code > 0x7eu) code = 0x7eu; /* unreachable below 448; kept as a guard */
        return (uint8_t)(sign | code);
    }
    /* subnormal range: multiples of 2^-9; x * 512 is exact, then round to
     * the nearest integer, ties to even (8 is 2^-6, the smallest normal,
     * whose code is 0x08 as well) */
    const float t = ns_fp8_u2f(a) * 512.0f;
    uint32_t q = (uint32_t)t;
    const float frac = t - (float)q;
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) q++;
    return (uint8_t)(sign | q);
}

/* e4m3 code -> float (exact). */
static inline NS_HOSTDEV float ns_fp8_e4m3_to_float(uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u) return ns_fp8_u2f(sign | 0x7fc00000u);
    if (e == 0u) return ns_fp8_u2f(sign | ns_fp8_f2u((float)m * 0.001953125f));
    return ns_fp8_u2f(sign | ((e + 120u) << 23) | (m << 20));
}

/* The scale a row of absolute maximum amax asks for: the smallest power
 * of two >= amax / 448 (at least 2^-126; 0 for an all-zero row). A power
 * of two makes x / scale, decode(code) * scale and the re-expression of a
 * code under a grown scale exact (only the e4m3 rounding of x / scale
 * remains), so dequantizing a page into bf16 or f32 loses nothing and a
 * grown scale adds no rounding to the codes already stored (except those
 * pushed into the subnormal range). It costs at most one binade of the
 * e4m3 range at the top (the largest |x| / scale lands in (224, 448]).
 * An infinite value is taken as FLT_MAX: an infinite scale would turn
 * inf / scale into NaN and every finite value of the segment into 0. */
static inline NS_HOSTDEV float ns_fp8_row_scale(float amax) {
    const float lim = 3.40282346638528859812e+38f;
    const float s = (amax > lim ? lim : amax) / NS_FP8_E4M3_MAX;
    if (!(s > 0.0f)) return 0.0f;
    if (s < 1.17549435082228750797e-38f) return 1.17549435082228750797e-38f;
    uint32_t u = ns_fp8_f2u(s);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x00800000u; /* up to the next power of two */
    return ns_fp8_u2f(u);
}

/* Value x under scale s (s == 0 only when every value so far is 0). */
static inline NS_HOSTDEV uint8_t ns_fp8_encode(float x, float s) {
    return ns_fp8_e4m3_from_float(s > 0.0f ? x / s : x);
}

/* A code stored under s_old, re-expressed under s_new > s_old. */
static inline NS_HOSTDEV uint8_t ns_fp8_requant(uint8_t c, float s_old, float s_new) {
    const float v = ns_fp8_e4m3_to_float(c) * s_old;
    return ns_fp8_e4m3_from_float(v / s_new);
}

/* Appends one row x[0..D) at slot of a page-head segment: seg holds the
 * segment's P rows of D codes, *scale its scale (read only when slot > 0).
 * The scalar reference of the policy above; the CUDA store kernels do
 * the same per lane. */
static inline void ns_fp8_append_row(uint8_t *seg, float *scale, int slot, const float *x, int D) {
    float amax = 0.0f;
    for (int d = 0; d < D; d++) {
        const float a = x[d] < 0 ? -x[d] : x[d];
        if (a > amax) amax = a; /* NaN never compares greater: ignored, as fmaxf */
    }
    const float s_old = slot > 0 ? *scale : 0.0f, want = ns_fp8_row_scale(amax);
    const float s = want > s_old ? want : s_old;
    if (s > s_old && s_old > 0.0f)
        for (size_t i = 0; i < (size_t)slot * (size_t)D; i++) seg[i] = ns_fp8_requant(seg[i], s_old, s);
    for (int d = 0; d < D; d++) seg[(size_t)slot * (size_t)D + (size_t)d] = ns_fp8_encode(x[d], s);
    *scale = s;
}

#endif
