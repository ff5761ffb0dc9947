/* cuda_attn_common.cuh — what the split-KV decode kernels share
 * (cuda_attention.cu's bf16 kernels, cuda_attn_fp8.cu's FP8 kernel): the
 * layout of a split's partial, the merge of the splits, the reservation of
 * the partials and counters, and packing two floats into a bf16 pair.
 * Included by the .cu files of src/backend/cuda only.
 *
 * Invariants
 * - A split partial is CU_WS_ROW(D) floats: o[D] (unnormalized), m (the
 *   running max, exp2 domain), l (the sum), padding; the partial of
 *   (decode row di, query head h, split sp) is at
 *   ws + ((di * H + h) * nsp + sp) * CU_WS_ROW(D).
 * - The counters (one per decode row and kv head) are zero between
 *   launches: the merging CTA resets its counter.
 */
#ifndef NS_CUDA_ATTN_COMMON_CUH
#define NS_CUDA_ATTN_COMMON_CUH

#include "backend/cuda/cuda_internal.cuh"

/* Floats per split partial in p.ws: o[D], m, l, padded to 16 bytes so the
 * merge reads o as float4. */
#define CU_WS_ROW(D) ((D) + 4)

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Keys per tile of every split-KV decode kernel; a split's range starts
 * on a multiple of it. */
#define CU_DEC_TILE 64

/* The work of one split-KV decode CTA, grid (split, kv head, decode row):
 * the row's sequence s (L keys, token row t) and the split's keys [k0, k1)
 * (empty where k0 >= k1). The L keys are cut into nsp equal chunks rounded
 * up to whole tiles, so a chunk never starts inside a tile; every decode
 * kernel takes its range from here, so the splits of one row never
 * overlap or leave keys out whichever kernel a step picks. Params: any
 * kernel parameter struct with dec_seqs, seq_len and seq_start. */
struct dec_split {
    int split, kvh, di, nsp, s, L, t, k0, k1;
};
template <class Params>
__device__ __forceinline__ dec_split dec_split_of(const Params &p) {
    dec_split d;
    d.split = blockIdx.x;
    d.kvh = blockIdx.y;
    d.di = blockIdx.z;
    d.nsp = gridDim.x;
    d.s = p.dec_seqs[d.di];
    d.L = p.seq_len[d.s];
    d.t = p.seq_start[d.s];
    const int chunk = ((d.L + d.nsp - 1) / d.nsp + CU_DEC_TILE - 1) / CU_DEC_TILE * CU_DEC_TILE;
    d.k0 = d.split * chunk;
    d.k1 = min(d.L, d.k0 + chunk);
    return d;
}

/* Split-KV merge, run by every CTA of (sequence di, kv head kvh) after
 * it wrote its partial (o, m, l) per query head to p.ws: the last split to
 * finish merges all splits' partials: o = sum o_s 2^(m_s-M) / sum l_s
 * 2^(m_s-M), writing out (and out_bf) of token row t. Saves a combine
 * launch per layer. The counter resets itself, so the next launch (or
 * graph replay) starts from zero. Contains block barriers: every thread
 * of the CTA calls it. Params: any kernel parameter struct with the fields
 * used below (ws, cnt, H, KVH, G, q_stride, out, out_bf). */
template <int D, class Params>
__device__ __forceinline__ void decode_merge(const Params &p, int di, int kvh, int t, int nsp) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(p.cnt + (size_t)di * p.KVH + kvh, 1) == nsp - 1;
    __syncthreads();
    if (is_last) {
        __threadfence();
        /* warp w owns heads w, w+4, ...: lanes over splits find M,
         * the split weights 2^(m_s - M) and their sum; then every
         * thread sums its (head, dim) outputs over the splits with
         * independent loads. One block barrier in all. */
        __shared__ float wbuf[1024]; /* [8][128] split weights, or [1024] for one head */
        __shared__ float lsum[8];
        float (*wsp)[128] = reinterpret_cast<float (*)[128]>(wbuf);
        const bool small = nsp <= 128 && p.G <= 8;
        if (small) {
            for (int j = warp; j < p.G; j += 4) {
                const float *wb = p.ws + ((size_t)di * p.H + kvh * p.G + j) * nsp * CU_WS_ROW(D);
                float mloc = -INFINITY;
                for (int sp = lane; sp < nsp; sp += 32) mloc = fmaxf(mloc, __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D));
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, o));
                float lloc = 0.f;
                for (int sp = lane; sp < nsp; sp += 32) {
                    const float m = __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D);
                    const float w = m == -INFINITY ? 0.f : exp2f(m - mloc);
                    wsp[j][sp] = w;
                    lloc += __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D + 1) * w;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) lloc += __shfl_xor_sync(0xffffffffu, lloc, o);
                if (lane == 0) lsum[j] = lloc;
            }
            __syncthreads();
            /* one float4 of one head per thread, 16 splits' loads in
             * flight: this CTA is the last of the layer's attention, so
             * its dependent L2 loads are on the step's critical path */
            for (int i = tid; i < p.G * (D / 4); i += 128) {
                const int j = i / (D / 4), d = (i % (D / 4)) * 4, h = kvh * p.G + j;
                const float *wb = p.ws + ((size_t)di * p.H + h) * nsp * CU_WS_ROW(D) + d;
                float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
                for (int sp = 0; sp < nsp; sp++) {
                    const float4 v = __ldcg(reinterpret_cast<const float4 *>(wb + (size_t)sp * CU_WS_ROW(D)));
                    const float w = wsp[j][sp];
                    o.x = fmaf(v.x, w, o.x);
                    o.y = fmaf(v.y, w, o.y);
                    o.z = fmaf(v.z, w, o.z);
                    o.w = fmaf(v.w, w, o.w);
                }
                const size_t off = (size_t)t * p.q_stride + (size_t)h * D + d;
                const float inv = 1.0f / lsum[j];
                const float4 v = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
                *reinterpret_cast<float4 *>(p.out + off) = v;
                if (p.out_bf) {
                    uint2 u;
                    u.x = pack_bf16(v.x, v.y);
                    u.y = pack_bf16(v.z, v.w);
                    *reinterpret_cast<uint2 *>(p.out_bf + off) = u;
                }
            }
        } else {
            /* many splits: per head, threads over splits */
            float *wbig = wbuf;
            __shared__ float red2[4];
            for (int j = 0; j < p.G; j++) {
                const int h = kvh * p.G + j;
                const float *wb = p.ws + ((size_t)di * p.H + h) * nsp * CU_WS_ROW(D);
                float mloc = -INFINITY;
                for (int sp = tid; sp < nsp; sp += 128) mloc = fmaxf(mloc, __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D));
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) mloc = fmaxf(mloc, __shfl_xor_sync(0xffffffffu, mloc, o));
                if (lane == 0) red2[warp] = mloc;
                __syncthreads();
                const float M = fmaxf(fmaxf(red2[0], red2[1]), fmaxf(red2[2], red2[3]));
                __syncthreads();
                float lloc = 0.f;
                for (int sp = tid; sp < nsp; sp += 128) {
                    const float m = __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D);
                    const float w = m == -INFINITY ? 0.f : exp2f(m - M);
                    wbig[sp] = w;
                    lloc += __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + D + 1) * w;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) lloc += __shfl_xor_sync(0xffffffffu, lloc, o);
                if (lane == 0) red2[warp] = lloc;
                __syncthreads();
                const float Ls = (red2[0] + red2[1]) + (red2[2] + red2[3]);
                for (int d = tid; d < D; d += 128) {
                    float o = 0.f;
#pragma unroll 8
                    for (int sp = 0; sp < nsp; sp++) o += __ldcg(wb + (size_t)sp * CU_WS_ROW(D) + d) * wbig[sp];
                    const size_t off = (size_t)t * p.q_stride + (size_t)h * D + d;
                    const float v = o / Ls;
                    p.out[off] = v;
                    if (p.out_bf) p.out_bf[off] = __float2bfloat16_rn(v);
                }
                __syncthreads(); /* wbig and red2 are reused by the next head */
            }
        }
        if (tid == 0) p.cnt[(size_t)di * p.KVH + kvh] = 0;
    }
}

/* c->attn_ws / c->attn_cnt hold at least need floats and need_cnt
 * counters (grown by doubling, counters zeroed; graphs dropped since they
 * bake the old addresses). False when they cannot grow: under stream
 * capture (capture_failed is set, the step runs eagerly) or on an error
 * (recorded). Defined in cuda_attention.cu. */
bool cu_attn_reserve_partials(cu_impl *c, size_t need, size_t need_cnt);

#endif
