/* quant.h — GGUF block-quantized weights on the CPU: block layouts,
 * dequantization of one row, and matrix products computed directly on the
 * quantized blocks.
 *
 * Formats (ggml's, bit for bit, so GGUF data is used straight from the
 * memory map): Q8_0, Q4_0, Q5_0 (blocks of 32 with an f16 scale), Q4_1,
 * Q5_1 (blocks of 32 with an f16 scale and min), Q4_K, Q5_K, Q6_K
 * (super-blocks of 256 with 6/8-bit sub-block scales); F16 rows too. A
 * weight row is a whole number of blocks (the loader checks).
 *
 * Products: like llama.cpp, the activation row is quantized once per
 * matmul to 8 bits (Q8_0 blocks for Q8_0/Q4_0/Q5_0 weights, Q8_1 blocks
 * with their sums for Q4_1/Q5_1, Q8_K super-blocks with block sums for the
 * k-quants) and each output is an integer dot
 * product per block scaled by the two block scales. That keeps the weights
 * in their quantized bytes (no dequantized copy of the model) and gives
 * the same arithmetic as the reference implementation up to the order of
 * the float additions. AVX2 kernels when the compiler targets it
 * (-march=native), a scalar fallback otherwise; both compute the same
 * integer sums.
 *
 * Thread safety: pure functions; ns_cpu_quant_matmul runs on the engine
 * thread and spreads work over the backend's pool.
 */
#ifndef NS_CPU_QUANT_H
#define NS_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* f16 <-> f32 (IEEE half, round to nearest even). */
float ns_fp16_to_fp32(uint16_t h);
uint16_t ns_fp32_to_fp16(float f);

/* dst[0..n) = the values of a row of n (a multiple of the block size)
 * quantized values of type dt starting at src. Also F16 (block of 1):
 * F16 matrices are used in place too. */
void ns_quant_dequant_row(ns_dtype dt, const void *src, float *dst, int64_t n);

/* dot(a (f32), b (f16)) without materializing b as f32 (decode reads
 * each weight once). F16C conversion where available. */
float ns_dot_f16(const float *a, const uint16_t *b, int64_t n);

/* Bytes needed to hold one activation row of n values quantized for
 * products with weights of type dt (Q8_0 or Q8_K blocks). */
size_t ns_quant_act_row_bytes(ns_dtype dt, int64_t n);
/* Quantizes x[0..n) into dst (ns_quant_act_row_bytes(dt, n) bytes). */
void ns_quant_act_row(ns_dtype dt, const float *x, void *dst, int64_t n);
/* Dot product of a weight row (type dt, n values) with an activation row
 * quantized by ns_quant_act_row(dt, ...). */
float ns_quant_dot(ns_dtype dt, const void *w, const void *act, int64_t n);

/* Quantizes x[0..n) into weight blocks of type dt with llama.cpp's
 * reference round-to-nearest scheme for Q8_0 / Q4_0 (no importance
 * search; tests and random dummy weights use it). dt must be Q8_0 or
 * Q4_0. */
void ns_quant_weight_row_ref(ns_dtype dt, const float *x, void *dst, int64_t n);

struct cpu_impl;
/* out[n, m] = in[n, k] @ w[m, k]^T with w quantized: activations are
 * quantized into the calling thread's scratch (scratch[0], which this
 * reserves), then weight rows are split over the pool. On scratch
 * allocation failure the output is set to NaN, which the engine reports. */
void ns_cpu_quant_matmul(struct cpu_impl *c, ns_tensor *out, const ns_tensor *in, const ns_tensor *w);

#endif
