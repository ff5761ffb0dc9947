/* cuda_kv_fp8.cuh — FP8 (e4m3) KV pages on the GPU (--kv-dtype fp8):
 * the warp-level row append shared by the store kernels (cuda_kv_fp8.cu,
 * the fused q/k-norm+RoPE+store of cuda_fused.cu) and the entry points of
 * cuda_kv_fp8.cu / cuda_attn_fp8.cu. Included by the .cu files of
 * src/backend/cuda only.
 *
 * Format and scale policy: src/util/fp8.h (page = codes laid out like a
 * bf16 page with 1-byte elements, then one float scale per
 * [layer][k|v][kv_head]; ns_kv_scale_offset). The device code below calls
 * the same NS_HOSTDEV functions as the CPU backend, so a CUDA store writes
 * the bytes the CPU reference writes, bit for bit (tests/gpu/test_kv_fp8.c).
 *
 * Invariants
 * - Head dims 16, 32, 64, 128 or 256 (a warp owns a row; a lane holds
 *   head_dim / 32 values, or one); kv_alloc refuses others for FP8.
 * - A page-head segment is appended to by one warp at a time (one store
 *   kernel per layer; a writable page belongs to one sequence).
 */
#ifndef NS_CUDA_KV_FP8_CUH
#define NS_CUDA_KV_FP8_CUH

#include "backend/cuda/cuda_internal.cuh"

extern "C" {
#include "util/fp8.h"
}

/* Appends row x (lane holds x[e] = row[lane + 32 e], for lane + 32 e <
 * D) at slot of the segment seg (P rows of D codes) whose scale is
 * *scale: the policy of ns_fp8_append_row (util/fp8.h), each lane
 * re-quantizing and writing only its own columns. Every lane of the warp
 * must call it. */
template <int D>
__device__ __forceinline__ void cu_fp8_append_row(uint8_t *seg, float *scale, int slot,
                                                  const float (&x)[(D + 31) / 32]) {
    constexpr int E = (D + 31) / 32;
    const int lane = threadIdx.x & 31;
    float a = 0.f;
#pragma unroll
    for (int e = 0; e < E; e++)
        if (lane + 32 * e < D) a = fmaxf(a, fabsf(x[e]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float s_old = slot > 0 ? *scale : 0.f, want = ns_fp8_row_scale(a);
    const float s = want > s_old ? want : s_old;
    if (s > s_old && s_old > 0.f) /* rare after a page's first rows: the scale only grows */
        for (int r = 0; r < slot; r++) {
#pragma unroll
            for (int e = 0; e < E; e++) {
                if (lane + 32 * e >= D) continue;
                uint8_t *p = seg + (size_t)r * D + lane + 32 * e;
                *p = ns_fp8_requant(*p, s_old, s);
            }
        }
#pragma unroll
    for (int e = 0; e < E; e++)
        if (lane + 32 * e < D) seg[(size_t)slot * D + lane + 32 * e] = ns_fp8_encode(x[e], s);
    __syncwarp(); /* every lane has read the old scale */
    if (lane == 0) *scale = s;
}

/* FP8 store of k, v ([n_tokens, *_stride], this layer) at each token's
 * position: rows of one page-head appended in position order by one warp. */
void cu_launch_kv_store_fp8(cu_impl *c, const ns_kv_layout *l, int layer, const float *k, const float *v,
                            int n_tokens, int k_stride, int v_stride);
/* dst <- src for the first n_slots slots of every segment, and all the
 * scales (copy-on-write of a partial page). */
void cu_launch_kv_copy_fp8(cu_impl *c, const ns_kv_layout *l, int dst_page, int src_page, int n_slots);
/* Random finite codes and scale 1/448 in every page (benchmarks). */
void cu_kv_fp8_fill_random(cu_impl *c, const ns_kv_layout *l, uint64_t seed);
/* Attention over an FP8 pool (cuda_attn_fp8.cu): decode rows read the
 * codes directly (split-KV, scales folded into scores and probabilities);
 * prefill tiles run the bf16 kernels of cu_attention on a bf16 copy of
 * this layer of the pages the prefilling sequences reference (the
 * "dequantized once for a long suffix prefill" of the design brief). */
void cu_attention_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                      int n_heads, float scale);
/* FP8 decode rows on the tensor cores (cuda_attn_fp8_mma.cu: the mma
 * decode's tile step on a 16-bit tile converted from each staged FP8
 * tile): whether it covers this shape (head dim 64 or 128, G <= 8),
 * whether layer `layer` may come by page-segment bulk copies (the fast
 * path), and the launch over the step's decode rows with nsp splits
 * (partials in ws, counters cnt, as cu_attention's); bulk: the tiles
 * come by bulk copies (the caller checked cu_attn_decode_fp8_bulk_ok and
 * ns_cuda_set_fp8_bulk), else by 16-byte cp.async. */
bool cu_attn_decode_mma_fp8_ok(int head_dim, int G);
bool cu_attn_decode_fp8_bulk_ok(cu_impl *c, const ns_kv_layout *l, int layer);
void cu_attn_decode_mma_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                            int n_heads, float scale, int nsp, float *ws, int32_t *cnt, bool bulk);
/* FP8 decode rows on the tensor cores with register tiles
 * (cuda_attn_fp8_reg.cu: MMA operands built from the codes in registers,
 * no 16-bit tile): whether it covers this pool and shape (head dim 128,
 * G <= 8, pages of 16/32/64 keys, compute capability 9.0 with bulk copies,
 * a tensor map over the pool), its CTAs per SM (the occupancy its split
 * choice aims at; asked once), and the launch with nsp splits (partials
 * in ws, counters cnt, as cu_attention's). */
bool cu_attn_decode_fp8_reg_ok(cu_impl *c, const ns_kv_layout *l, int G);
int cu_attn_decode_fp8_reg_ctas(cu_impl *c);
void cu_attn_decode_fp8_reg(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                            int n_heads, float scale, int nsp, float *ws, int32_t *cnt);
/* Frees cuda_attn_fp8.cu's scratch (backend destroy). */
void cu_kv_fp8_free(cu_impl *c);

#endif
