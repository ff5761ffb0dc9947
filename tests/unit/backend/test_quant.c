/* quant.c: block formats and the dot products on quantized blocks.
 *
 * Oracles (independent of the kernels under test):
 *  - dequantization of hand-built blocks against the ggml layouts' defining
 *    formulas, written out here per element;
 *  - ns_quant_dot(w, quantized x) against the plain float dot product of
 *    the dequantized weight row and the dequantized activation blocks
 *    (Q8_0: d*q; Q8_K: d*q), which the integer kernels must equal up to
 *    float summation order (relative 1e-5), for random blocks of every
 *    type, AVX2 and scalar builds alike;
 *  - f16 conversion round trips and round-to-nearest-even;
 *  - the reference Q8_0/Q4_0 weight quantizers reproduce values within
 *    their quantization step. */
#include <stdint.h>

#include "backend/cpu/quant.h"
#include "test.h"

static uint64_t rs = 88172645463325252ULL;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static float frnd(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

static void put_f16(uint8_t *p, float f) {
    uint16_t h = ns_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* Random weight blocks of type dt with sane scales (n values). */
static void random_blocks(ns_dtype dt, uint8_t *b, int64_t n) {
    size_t bytes = ns_dtype_row_bytes(dt, n);
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rnd();
    int64_t nb = dt == NS_DT_Q4_K || dt == NS_DT_Q5_K || dt == NS_DT_Q6_K ? n / 256 : n / 32;
    size_t bb = bytes / (size_t)nb;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *p = b + (size_t)i * bb;
        switch (dt) {
        case NS_DT_Q8_0: case NS_DT_Q4_0: case NS_DT_Q5_0: put_f16(p, 0.01f + 0.02f * frnd()); break;
        case NS_DT_Q4_1: case NS_DT_Q5_1: put_f16(p, 0.01f + 0.02f * frnd()); put_f16(p + 2, 0.1f * frnd()); break;
        case NS_DT_Q4_K: case NS_DT_Q5_K: put_f16(p, 0.003f * (1 + frnd())); put_f16(p + 2, 0.002f * (1 + frnd())); break;
        case NS_DT_Q6_K: put_f16(p + 208, 0.002f * (1 + frnd())); break;
        default: break;
        }
    }
}

/* The activation blocks' values: Q8_0 {f16 d; int8[32]}, Q8_1 {f16 d;
 * f16 s; int8[32]}, Q8_K {f32 d; int8[256]; int16[16]}. The dot of a
 * weight with a min m against Q8_1 is d_w*d_a*Σq_w*q_a + m*s, so for
 * Q8_1 the values are d*q and the test's reference uses s for the min. */
static void act_values(ns_dtype dt, const uint8_t *a, float *y, int64_t n) {
    if (dt == NS_DT_Q4_1 || dt == NS_DT_Q5_1) {
        for (int64_t i = 0; i < n / 32; i++, a += 36) {
            uint16_t h;
            memcpy(&h, a, 2);
            for (int j = 0; j < 32; j++) y[i * 32 + j] = ns_fp16_to_fp32(h) * (float)(int8_t)a[4 + j];
        }
        return;
    }
    if (dt == NS_DT_Q8_0 || dt == NS_DT_Q4_0 || dt == NS_DT_Q5_0) {
        for (int64_t i = 0; i < n / 32; i++, a += 34) {
            uint16_t h;
            memcpy(&h, a, 2);
            for (int j = 0; j < 32; j++) y[i * 32 + j] = ns_fp16_to_fp32(h) * (float)(int8_t)a[2 + j];
        }
        return;
    }
    for (int64_t i = 0; i < n / 256; i++, a += 292) {
        float d;
        memcpy(&d, a, 4);
        int sum = 0;
        for (int j = 0; j < 256; j++) {
            y[i * 256 + j] = d * (float)(int8_t)a[4 + j];
            sum += (int8_t)a[4 + j];
        }
        int16_t bs[16];
        memcpy(bs, a + 260, sizeof bs);
        int bsum = 0;
        for (int j = 0; j < 16; j++) bsum += bs[j];
        CHECK_EQ_INT(bsum, sum); /* block sums consistent with the values */
    }
}

TEST(dot_matches_dequantized) {
    const ns_dtype types[] = {NS_DT_Q8_0, NS_DT_Q4_0, NS_DT_Q4_K, NS_DT_Q5_K, NS_DT_Q6_K,
                              NS_DT_Q4_1, NS_DT_Q5_0, NS_DT_Q5_1};
    const int64_t n = 1024;
    static uint8_t w[2048], act[2048];
    static float wf[1024], x[1024], y[1024];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int bad = 0;
        double worst = 0;
        for (int rep = 0; rep < 50; rep++) {
            random_blocks(types[t], w, n);
            for (int64_t i = 0; i < n; i++) x[i] = frnd() * (rep % 2 ? 3.0f : 0.5f);
            if (rep == 7) x[5] = -4.0f; /* an extreme negative value: the Q8_K -127 code */
            ns_quant_act_row(types[t], x, act, n);
            ns_quant_dequant_row(types[t], w, wf, n);
            act_values(types[t], act, y, n);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                ref += (double)wf[i] * y[i];
                mag += fabs((double)wf[i] * y[i]);
            }
            if (types[t] == NS_DT_Q4_1 || types[t] == NS_DT_Q5_1) {
                /* min terms: the dequantized value is d*q + m; the kernel
                 * takes m * s (s = the f16 of d_a*Σq_a) instead of m * Σ y */
                for (int64_t b = 0; b < n / 32; b++) {
                    uint16_t hm, hs;
                    memcpy(&hm, w + b * (types[t] == NS_DT_Q4_1 ? 20 : 24) + 2, 2);
                    memcpy(&hs, act + b * 36 + 2, 2);
                    double ysum = 0;
                    for (int j = 0; j < 32; j++) ysum += y[b * 32 + j];
                    ref += (double)ns_fp16_to_fp32(hm) * ((double)ns_fp16_to_fp32(hs) - ysum);
                    mag += fabs((double)ns_fp16_to_fp32(hm) * ysum);
                }
            }
            double got = ns_quant_dot(types[t], w, act, n), e = fabs(got - ref) / (mag + 1e-30);
            if (e > worst) worst = e;
            if (e > 1e-5) bad++;
        }
        CHECKF(bad == 0, "%s: %d of 50 dots differ from the dequantized dot (worst relative %.3g)",
               ns_dtype_name(types[t]), bad, worst);
    }
}

/* Activation quantization itself: |x - dequant(quant(x))| <= half a step. */
TEST(activation_quantization_error) {
    const ns_dtype types[] = {NS_DT_Q8_0, NS_DT_Q4_K};
    static float x[512], y[512];
    static uint8_t a[1024];
    for (size_t t = 0; t < 2; t++) {
        for (int i = 0; i < 512; i++) x[i] = frnd() * 7.0f;
        ns_quant_act_row(types[t], x, a, 512);
        act_values(types[t], a, y, 512);
        int bad = 0;
        int blk = t == 0 ? 32 : 256;
        for (int b = 0; b < 512 / blk; b++) {
            float amax = 0;
            for (int j = 0; j < blk; j++) amax = fmaxf(amax, fabsf(x[b * blk + j]));
            float step = amax / 127.f;
            for (int j = 0; j < blk; j++)
                /* half a step, plus (Q8_0) the f16 rounding of the scale: 127 * 2^-11 steps */
                if (fabsf(x[b * blk + j] - y[b * blk + j]) > (t == 0 ? 0.57f : 0.501f) * step) bad++;
        }
        CHECK_EQ_INT(bad, 0);
    }
}

/* Hand-built blocks against the layouts' formulas. */
TEST(dequant_layouts) {
    uint8_t b[256];
    float y[256];
    /* Q4_0: d = 0.5, byte j = (j & 15) | ((15 - (j & 15)) << 4) */
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    ns_quant_dequant_row(NS_DT_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        CHECK_NEAR(y[j], 0.5f * (float)(j - 8), 0);
        CHECK_NEAR(y[16 + j], 0.5f * (float)(15 - j - 8), 0);
    }
    /* Q8_0 */
    put_f16(b, 0.25f);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    ns_quant_dequant_row(NS_DT_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) CHECK_NEAR(y[j], 0.25f * (float)(j - 16), 0);
    /* Q6_K: d = 1, scales[g] = g + 1, value k of 256 = q - 32 with q = k % 64
     * placed per the layout: for half h (128 values), l < 32:
     *   v[l]    = ql[l] low  | qh[l] bits 0-1
     *   v[l+32] = ql[l+32] low | qh[l] bits 2-3
     *   v[l+64] = ql[l] high | qh[l] bits 4-5
     *   v[l+96] = ql[l+32] high | qh[l] bits 6-7 */
    uint8_t q6[210] = {0};
    int8_t want[256];
    for (int k = 0; k < 256; k++) want[k] = (int8_t)((k * 7) % 64);
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int8_t *v = want + h * 128;
            uint8_t *ql = q6 + h * 64, *qh = q6 + 128 + h * 32;
            ql[l] = (uint8_t)((v[l] & 15) | ((v[l + 64] & 15) << 4));
            ql[l + 32] = (uint8_t)((v[l + 32] & 15) | ((v[l + 96] & 15) << 4));
            qh[l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
        }
    for (int g = 0; g < 16; g++) q6[192 + g] = (uint8_t)(g + 1);
    put_f16(q6 + 208, 1.0f);
    ns_quant_dequant_row(NS_DT_Q6_K, q6, y, 256);
    int bad = 0;
    for (int k = 0; k < 256; k++)
        if (y[k] != (float)((k / 16) + 1) * (float)(want[k] - 32)) bad++;
    CHECK_EQ_INT(bad, 0);
    /* Q4_K: d = 1, dmin = 0.5; sub-block j scale j+1, min 2j (j < 4: low 6
     * bits of scales[j] / scales[j+4]; j >= 4: low nibble / high nibble of
     * scales[j+4] with the top bits in scales[j-4] / scales[j]) */
    uint8_t q4[144] = {0};
    put_f16(q4, 1.0f);
    put_f16(q4 + 2, 0.5f);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) sc[j] = j + 1, mn[j] = 2 * j;
    for (int j = 0; j < 4; j++) {
        q4[4 + j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q4[4 + j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q4[4 + j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int i = 0; i < 128; i++) q4[16 + i] = (uint8_t)((i % 16) | (((i + 3) % 16) << 4));
    ns_quant_dequant_row(NS_DT_Q4_K, q4, y, 256);
    bad = 0;
    for (int k = 0; k < 256; k++) {
        int chunk = k / 64, l = k % 32, hi = (k % 64) >= 32, j = k / 32;
        int qv = hi ? ((chunk * 32 + l) + 3) % 16 : (chunk * 32 + l) % 16;
        if (y[k] != (float)sc[j] * (float)qv - 0.5f * (float)mn[j]) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(fp16_conversion) {
    CHECK_EQ_INT(ns_fp32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(ns_fp32_to_fp16(-2.0f), 0xc000);
    CHECK_EQ_INT(ns_fp32_to_fp16(65504.0f), 0x7bff);
    CHECK_EQ_INT(ns_fp32_to_fp16(1e6f), 0x7c00);
    CHECK_EQ_INT(ns_fp32_to_fp16(5.9604645e-08f), 0x0001); /* smallest subnormal */
    CHECK_EQ_INT(ns_fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00); /* tie -> even */
    CHECK_EQ_INT(ns_fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02); /* tie -> even (up) */
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (ns_fp32_to_fp16(ns_fp16_to_fp32((uint16_t)h)) != h) bad++;
    CHECK_EQ_INT(bad, 0);
}

TEST(reference_weight_quantizers) {
    float x[64], y[64];
    uint8_t b[80];
    for (int i = 0; i < 64; i++) x[i] = frnd();
    ns_quant_weight_row_ref(NS_DT_Q8_0, x, b, 64);
    ns_quant_dequant_row(NS_DT_Q8_0, b, y, 64);
    for (int i = 0; i < 64; i++) CHECK(fabsf(x[i] - y[i]) <= 1.0f / 127 * 0.51f + 1e-3f);
    ns_quant_weight_row_ref(NS_DT_Q4_0, x, b, 64);
    ns_quant_dequant_row(NS_DT_Q4_0, b, y, 64);
    /* Q4_0 codes -8..7 of d = max / -8: half a step, except values of the
     * sign opposite to max near |max|, clamped to code 15: one step. */
    for (int i = 0; i < 64; i++) CHECK(fabsf(x[i] - y[i]) <= 1.0f / 8 * 1.01f);
}

/* A NaN or Inf activation (a corrupt model) makes the product NaN, and is
 * never cast to an 8-bit code (undefined behaviour; found by fuzz_gguf). */
TEST(non_finite_activations) {
    const ns_dtype types[] = {NS_DT_Q8_0, NS_DT_Q4_0, NS_DT_Q4_K, NS_DT_Q5_K, NS_DT_Q6_K,
                              NS_DT_Q4_1, NS_DT_Q5_0, NS_DT_Q5_1};
    static uint8_t w[2048], act[2048];
    static float x[256];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        for (int k = 0; k < 2; k++) {
            random_blocks(types[t], w, 256);
            for (int i = 0; i < 256; i++) x[i] = frnd();
            x[17] = k ? INFINITY : NAN;
            ns_quant_act_row(types[t], x, act, 256);
            CHECKF(isnan(ns_quant_dot(types[t], w, act, 256)), "%s", ns_dtype_name(types[t]));
        }
    }
}

/* A block whose largest activation is subnormal: 127 / amax overflows to
 * inf, and the codes must still come from finite values (0 * inf is NaN,
 * which UBSan reports when cast to int8; found by fuzz_gguf) with a
 * finite product. */
TEST(subnormal_block_maximum) {
    const ns_dtype types[] = {NS_DT_Q8_0, NS_DT_Q4_0, NS_DT_Q4_K, NS_DT_Q6_K, NS_DT_Q4_1};
    static uint8_t w[2048], act[2048];
    static float x[256];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        random_blocks(types[t], w, 256);
        for (int i = 0; i < 256; i++) x[i] = i % 3 == 0 ? 0.0f : (i % 2 ? 1e-40f : -3e-41f);
        ns_quant_act_row(types[t], x, act, 256);
        CHECKF(isfinite(ns_quant_dot(types[t], w, act, 256)), "%s", ns_dtype_name(types[t]));
        if (types[t] == NS_DT_Q8_0) {
            /* the codes are round(x / amax * 127): 127, -38 and 0 (the
             * first block: f16 scale, then 32 codes) */
            for (int i = 0; i < 32; i++) {
                const int want = i % 3 == 0 ? 0 : i % 2 ? 127 : -38;
                CHECKF((int8_t)act[2 + i] == want, "Q8_0 code %d: %d, want %d", i, (int8_t)act[2 + i], want);
            }
        }
    }
}

/* F16 rows: dequantized and dotted in place, against the scalar
 * conversion (f16 values are exact in f32). */
TEST(f16_rows) {
    static uint16_t h[100];
    static float a[100], y[100];
    for (int i = 0; i < 100; i++) {
        h[i] = ns_fp32_to_fp16(frnd() * 4.0f);
        a[i] = frnd();
    }
    ns_quant_dequant_row(NS_DT_F16, h, y, 100);
    double ref = 0;
    int bad = 0;
    for (int i = 0; i < 100; i++) {
        if (y[i] != ns_fp16_to_fp32(h[i])) bad++;
        ref += (double)a[i] * ns_fp16_to_fp32(h[i]);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(ns_dot_f16(a, h, 100), ref, 1e-4);
}

/* The backend's matmul on quantized weights, for more input rows than one
 * tile of quantized activations holds (k = 64: 240 rows per tile; 600
 * rows = 3 tiles), equals the per-row dot products, for 1, 2 and 4
 * threads. */
TEST(matmul_tiles) {
    const int64_t k = 64, m = 40, n = 600;
    static uint8_t w[40 * 68], act[68];
    static float x[600 * 64], got[600 * 40];
    for (int64_t j = 0; j < m; j++) {
        float row[64];
        for (int i = 0; i < 64; i++) row[i] = frnd();
        ns_quant_weight_row_ref(NS_DT_Q8_0, row, w + j * 68, k);
    }
    for (int64_t i = 0; i < n * k; i++) x[i] = frnd() * 2;
    for (int threads = 1; threads <= 4; threads *= 2) {
        ns_backend *be = NULL;
        ns_error err = {0};
        CHECK(ns_backend_cpu_create(threads, &be, &err) == NS_OK);
        if (!be) return;
        ns_tensor wt, in, out;
        CHECK(be->ops->weight_from_host(be, &wt, w, NS_DT_Q8_0, m, k, &err) == NS_OK);
        CHECK(be->ops->tensor_alloc(be, &in, NS_DT_F32, n, k, &err) == NS_OK);
        CHECK(be->ops->tensor_alloc(be, &out, NS_DT_F32, n, m, &err) == NS_OK);
        CHECK(be->ops->tensor_upload(be, &in, x, &err) == NS_OK);
        be->ops->matmul(be, &out, &in, &wt);
        CHECK(be->ops->tensor_download(be, &out, got, &err) == NS_OK);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            ns_quant_act_row(NS_DT_Q8_0, x + i * k, act, k);
            for (int64_t j = 0; j < m; j++)
                if (got[i * m + j] != ns_quant_dot(NS_DT_Q8_0, w + j * 68, act, k)) bad++;
        }
        CHECKF(bad == 0, "%d threads: %d outputs differ", threads, bad);
        be->ops->tensor_free(be, &in);
        be->ops->tensor_free(be, &out);
        be->ops->tensor_free(be, &wt);
        be->ops->destroy(be);
    }
}

int main(void) {
    RUN(dot_matches_dequantized);
    RUN(activation_quantization_error);
    RUN(dequant_layouts);
    RUN(fp16_conversion);
    RUN(reference_weight_quantizers);
    RUN(non_finite_activations);
    RUN(subnormal_block_maximum);
    RUN(f16_rows);
    RUN(matmul_tiles);
    TEST_MAIN_END;
}
