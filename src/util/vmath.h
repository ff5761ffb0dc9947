/* vmath.h — small vectorized math kernels shared by the CPU paths.
 *
 * ns_exp8: exp of 8 floats (AVX2): Cody-Waite reduction to |r| <= ln2/2 and
 * a degree-6 polynomial; relative error ~1e-7, inputs clamped to
 * [-87, 88] (so exp(-inf) gives ~1e-38, never NaN). Used where libm's
 * scalar exp dominated: logsumexp over the vocabulary, softmax weights in
 * CPU attention. ns_vexp_inplace applies it to an array.
 */
#ifndef NS_VMATH_H
#define NS_VMATH_H

#include <math.h>
#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>

static inline __m256 ns_exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* x[i] = exp(x[i] - shift) for i < n. */
static inline void ns_vexp_inplace(float *x, int64_t n, float shift) {
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 vs = _mm256_set1_ps(shift);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, ns_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs)));
#endif
    for (; i < n; i++) x[i] = expf(x[i] - shift);
}

#endif
