/* test_fp8.c — the e4m3 element format and the per-page-head scale
 * policy of util/fp8.h, checked against the OCP FP8 definition (values
 * computed here from sign/exponent/mantissa, not by the code under test),
 * and the KV page arithmetic of backend.h for FP8 pages. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "kv/prefix_index.h"
#include "test.h"
#include "util/fp8.h"

/* The value of code c by the OCP definition (bias 7, subnormals m * 2^-9,
 * S.1111.111 NaN, no infinities). */
static double e4m3_ref(uint8_t c) {
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

TEST(fp8_decode_matches_definition) {
    for (int c = 0; c < 256; c++) {
        const double ref = e4m3_ref((uint8_t)c);
        const float got = ns_fp8_e4m3_to_float((uint8_t)c);
        if (isnan(ref)) CHECKF(isnan(got), "code 0x%02x", c);
        else CHECKF((double)got == ref && !!signbit(got) == ((c & 0x80) != 0), "code 0x%02x: %g vs %g", c, got, ref);
    }
    CHECK(ns_fp8_e4m3_to_float(0x7e) == 448.0f);
    CHECK(ns_fp8_e4m3_to_float(0x38) == 1.0f);
    CHECK(ns_fp8_e4m3_to_float(0x01) == ldexpf(1.0f, -9));
    CHECK(ns_fp8_e4m3_to_float(0x08) == ldexpf(1.0f, -6));
}

/* Every code survives decode + encode, including -0 and both NaNs. */
TEST(fp8_all_codes_round_trip) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        const uint8_t back = ns_fp8_e4m3_from_float(ns_fp8_e4m3_to_float((uint8_t)c));
        if (back != (uint8_t)c && bad++ < 5) CHECKF(back == (uint8_t)c, "0x%02x -> 0x%02x", c, back);
    }
    CHECK_EQ_INT(bad, 0);
}

/* Encoding is round-to-nearest, ties to even, over every float between
 * neighbouring codes: midpoints and a point either side of each. */
TEST(fp8_rounding_nearest_even) {
    int bad = 0;
    for (int c = 0; c < 0x7e; c++) { /* positive finite neighbours c, c + 1 */
        const double lo = e4m3_ref((uint8_t)c), hi = e4m3_ref((uint8_t)(c + 1)), mid = (lo + hi) / 2;
        const uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        const struct {
            double x;
            uint8_t want;
        } k[] = {{mid, even}, {nextafter(mid, lo), (uint8_t)c}, {nextafter(mid, hi), (uint8_t)(c + 1)}, {lo, (uint8_t)c}};
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
            const float x = (float)k[i].x;
            if ((double)x != k[i].x) continue; /* only points a float holds exactly */
            const uint8_t got = ns_fp8_e4m3_from_float(x), gotn = ns_fp8_e4m3_from_float(-x);
            if ((got != k[i].want || gotn != (uint8_t)(k[i].want | 0x80)) && bad++ < 5)
                CHECKF(0, "%.9g -> 0x%02x / -x -> 0x%02x, want 0x%02x", x, got, gotn, k[i].want);
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(1.0625f), 0x38);  /* tie between 1 and 1.125: even mantissa 0 */
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(1.1875f), 0x3a);  /* tie between 1.125 and 1.25: even mantissa 2 */
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(ldexpf(1.5f, -9)), 0x02);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(ldexpf(0.5f, -9)), 0x00);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(ldexpf(0.75f, -9)), 0x01);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(ldexpf(1.9375f, -7)), 0x08); /* 7.75 * 2^-9 rounds up to the first normal */
}

/* Beyond 448 (including the 464 midpoint and infinity) saturates to +-448;
 * only NaN encodes as NaN. */
TEST(fp8_saturation_and_nan) {
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(448.0f), 0x7e);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(432.0f), 0x7e); /* tie 416 / 448: even */
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(464.0f), 0x7e);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(1e30f), 0x7e);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(INFINITY), 0x7e);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(-INFINITY), 0xfe);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(-500.0f), 0xfe);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(NAN) & 0x7f, 0x7f);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(1e-30f), 0x00);
    CHECK_EQ_INT(ns_fp8_e4m3_from_float(-0.0f), 0x80);
}

static uint64_t rs = 0x243f6a8885a308d3ULL;
static float frand(void) { return test_rand_nz(&rs); }

/* The smallest power of two >= amax / 448 (float division first), by
 * frexp: the reference for ns_fp8_row_scale. */
static float pow2_scale(float amax) {
    const float r = amax / 448.0f;
    if (!(r > 0)) return 0;
    int e;
    const float m = frexpf(r, &e); /* r = m * 2^e, m in [0.5, 1) */
    return m == 0.5f ? r : ldexpf(1.0f, e);
}

/* The scale policy: the scale is the running max of the rows' power-of-two
 * scales (pow2_scale), a fresh
 * page starts from zero, earlier rows are re-quantized when it grows, and
 * every stored value is within half an e4m3 step (relative 2^-4) of the
 * row value per rounding: one, plus one per growth after the row. */
TEST(fp8_append_policy) {
    enum { P = 16, D = 24 };
    uint8_t seg[P * D];
    float scale = 12345.0f; /* stale: slot 0 must ignore it */
    float rows[P][D];
    for (int r = 0; r < P; r++)
        for (int d = 0; d < D; d++) rows[r][d] = frand() * (float)(1 + r % 5) * (r == 7 ? 10.0f : 1.0f);
    float want = 0;
    int growths[P] = {0}, n_grow = 0;
    for (int r = 0; r < P; r++) {
        ns_fp8_append_row(seg, &scale, r, rows[r], D);
        float amax = 0;
        for (int d = 0; d < D; d++) amax = fmaxf(amax, fabsf(rows[r][d]));
        if (pow2_scale(amax) > want && r > 0) {
            n_grow++;
            for (int q = 0; q < r; q++) growths[q]++;
        }
        want = fmaxf(want, pow2_scale(amax));
        CHECKF(scale == want, "row %d: scale %g, want %g", r, scale, want);
    }
    CHECK(n_grow > 0); /* the rows above make the scale grow mid-page */
    for (int r = 0; r < P; r++)
        for (int d = 0; d < D; d++) {
            const double v = (double)ns_fp8_e4m3_to_float(seg[r * D + d]) * scale, x = rows[r][d];
            /* relative to |x|, or below the normal range to its bottom (2^-6 scale units) */
            const double err = fabs(v - x) / fmax(fabs(x), (double)scale * ldexp(1.0, -6));
            const double bound = (1 + growths[r]) * (1.0 / 16) * 1.001;
            CHECKF(err <= bound, "row %d col %d: %g vs %g, relative error %g > %g", r, d, v, x, err, bound);
        }
    /* an all-zero first row keeps scale 0 and codes 0; the next row sets it */
    float zero[D] = {0}, one[D];
    for (int d = 0; d < D; d++) one[d] = (float)(d + 1);
    ns_fp8_append_row(seg, &scale, 0, zero, D);
    CHECK(scale == 0.0f && seg[0] == 0 && seg[D - 1] == 0);
    ns_fp8_append_row(seg, &scale, 1, one, D);
    CHECK(scale == 0.0625f); /* 24 / 448 = 0.054 -> 2^-4 */
    CHECK(seg[0] == 0 && seg[D + D - 1] == 0x7c); /* 24 / 2^-4 = 384 = 1.5 * 2^8 */
    /* huge rows saturate, never NaN */
    float big[D];
    for (int d = 0; d < D; d++) big[d] = d == 0 ? INFINITY : 1e30f;
    ns_fp8_append_row(seg, &scale, 0, big, D);
    CHECK(isfinite(scale) && scale > 0);
    CHECK_EQ_INT(seg[0], 0x7e);
    for (int d = 0; d < D; d++) CHECK(!isnan(ns_fp8_e4m3_to_float(seg[d])));
}

/* Slot 0 starts a fresh page: a stale scale left by the page's previous
 * owner never leaks into the new rows. */
TEST(fp8_append_fresh_page_ignores_stale_scale) {
    enum { P = 16, D = 8 };
    float rows[P][D];
    for (int r = 0; r < P; r++)
        for (int d = 0; d < D; d++) rows[r][d] = frand() * (float)(1 << (r % 4));
    uint8_t a[P * D], b[P * D];
    float sa = 0, sb = 0;
    for (int r = 0; r < P; r++) ns_fp8_append_row(a, &sa, r, rows[r], D);
    /* the same rows again, interleaved with a stale scale value that slot 0 must reset */
    sb = 99.0f;
    for (int r = 0; r < P; r++) ns_fp8_append_row(b, &sb, r, rows[r], D);
    CHECK(sa == sb);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

/* Page geometry: codes of 1 byte laid out like a bf16 page, then one
 * float per (layer, K|V, head); the engine's page bytes agree. */
TEST(fp8_page_arithmetic) {
    ns_kv_layout l = {.n_pages = 4, .page_tokens = 16, .n_layers = 3, .n_kv_heads = 2, .head_dim = 32,
                      .dtype = NS_DT_FP8_E4M3};
    const size_t codes = 3 * 2 * 2 * 16 * 32;
    l.page_size_bytes = ns_kv_page_bytes(l.n_layers, l.n_kv_heads, l.page_tokens, l.head_dim, l.dtype);
    CHECK_EQ_INT(l.page_size_bytes, codes + 3 * 2 * 2 * 4);
    CHECK_EQ_INT(ns_kv_page_bytes(3, 2, 16, 32, NS_DT_BF16), codes * 2);
    CHECK_EQ_INT(ns_kv_page_bytes(3, 2, 16, 32, NS_DT_F32), codes * 4);
    CHECK_EQ_INT(ns_dtype_size(NS_DT_FP8_E4M3), 1);
    CHECK(!ns_dtype_is_quant(NS_DT_FP8_E4M3));
    CHECK_EQ_STR(ns_dtype_name(NS_DT_FP8_E4M3), "fp8");
    CHECK_EQ_INT(ns_kv_offset(&l, 2, 1, 1, 15), codes - 32);
    CHECK_EQ_INT(ns_kv_scale_offset(&l, 0, 0, 0), codes);
    CHECK_EQ_INT(ns_kv_scale_offset(&l, 2, 1, 1), l.page_size_bytes - 4);
    CHECK_EQ_INT(ns_kv_scale_offset(&l, 1, 0, 1) % 4, 0);
    /* odd geometries are padded: codes and scales each to 16 bytes */
    ns_kv_layout o = {.n_pages = 2, .page_tokens = 5, .n_layers = 3, .n_kv_heads = 1, .head_dim = 3,
                      .dtype = NS_DT_FP8_E4M3};
    o.page_size_bytes = ns_kv_page_bytes(3, 1, 5, 3, NS_DT_FP8_E4M3);
    CHECK_EQ_INT(ns_kv_scale_offset(&o, 0, 0, 0), 96); /* 6 x 5 x 3 = 90 codes -> 96 */
    CHECK_EQ_INT(o.page_size_bytes, 96 + 32);          /* 6 scales = 24 bytes -> 32 */
    CHECK_EQ_INT(ns_kv_scale_offset(&o, 2, 1, 0), 96 + 20);
}

/* A KV format is part of the prefix-hash seed: FP8 pages never match
 * BF16 or F32 pages of the same model and page size. */
TEST(fp8_prefix_seed_separates_formats) {
    const uint64_t fp = 0x1234abcdULL;
    const uint64_t f8 = ns_prefix_seed(fp, NS_DT_FP8_E4M3, 16), bf = ns_prefix_seed(fp, NS_DT_BF16, 16),
                   f32 = ns_prefix_seed(fp, NS_DT_F32, 16);
    CHECK(f8 != bf && f8 != f32 && bf != f32);
    const int32_t toks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    CHECK(ns_prefix_hash(f8, toks, 16) != ns_prefix_hash(bf, toks, 16));
    CHECK(ns_prefix_hash(f8, toks, 16) != ns_prefix_hash(f32, toks, 16));
}

int main(void) {
    RUN(fp8_decode_matches_definition);
    RUN(fp8_all_codes_round_trip);
    RUN(fp8_rounding_nearest_even);
    RUN(fp8_saturation_and_nan);
    RUN(fp8_append_policy);
    RUN(fp8_append_fresh_page_ignores_stale_scale);
    RUN(fp8_page_arithmetic);
    RUN(fp8_prefix_seed_separates_formats);
    TEST_MAIN_END;
}
