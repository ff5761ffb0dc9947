/* cuda_moe.cu — the CUDA backend's mixture-of-experts MLP (moe_ffn, see
 * backend.h) and projection bias (add_bias).
 *
 * Everything runs on the device; the host never learns which experts a
 * token chose, so a decode step stays shape-static and CUDA graphs capture
 * it (expert choice lives in device memory).
 *
 * Per chunk of tokens (at most CU_MOE_CHUNK, so the scratch stays bounded):
 * 1. k_moe_logits: router logits (F32 activations x BF16 router weights,
 *    F32 sums), spread over many blocks; k_moe_topk: softmax, top k (ties
 *    to the lower expert), renormalized when norm_topk: ids and weights
 *    per (token, k) slot. In the grouped path it also counts slots per
 *    expert.
 * 2a. Few tokens (decode, T <= CU_MOE_GEMV_MAX): gathered GEMVs. Each
 *    (slot, output row) warp reads the chosen expert's weight row, found
 *    through the device table of expert pointers: only the active experts'
 *    bytes are read. gate/up with the SwiGLU epilogue into h (F32), then
 *    down with the combine of step 3 folded in (no y, no extra launch).
 * 2b. More tokens (prefill, batched decode): k_moe_scan turns the counts
 *    into per-expert segments and tile offsets (a counting sort), the
 *    scatter places every slot in its expert's segment, and two grouped
 *    GEMMs (BF16 tensor cores through WMMA, F32 accumulation) run over the
 *    segments: gate+up with the SwiGLU epilogue (A rows gathered from the
 *    token rows, h stored BF16), then down into y. The grid is sized by an
 *    upper bound on the number of 64-row tiles known from the shape alone;
 *    tiles past the real count exit at once, so no count goes to the host.
 * 3. k_moe_combine: out[t] += p_e * y[slot], the token's experts in
 *    ascending expert order (the CPU reference's summation order).
 *
 * Determinism: the order of slots inside a segment depends on atomics,
 * but every output row of a GEMM tile is computed independently of the
 * other rows, and the combine sums in a fixed order, so results are
 * bit-identical run to run and between eager and graph execution.
 *
 * Block-quantized experts (GGUF files: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K; gate and up of one type, down of any, as Q4_K_M files
 * have them) run cuda_quant.cu's kernels, whose block formats exist once:
 * decode (2a) quantizes the token rows to 8 bits and runs gathered GEMVs
 * on the chosen experts' blocks (gate/up + SwiGLU, then the SwiGLU output
 * quantized, then down into y and the combine of step 3), so only the
 * active experts' quantized bytes are read. Batched decode (2b with the
 * 16-row tile shape, a few slots per expert) runs grouped GEMVs on the
 * blocks: the slots' rows quantized in sorted order, each chosen expert's
 * rows streamed once for its segment, up to four slots per pass
 * (NS_CUDA_MOE_QGGEMV=0: the next path instead). More tokens (prefill)
 * dequantize the experts the router chose (counts > 0, known on the
 * device) into a bf16 scratch with a table of the copies, and the bf16
 * grouped GEMM runs unchanged on it. That costs a write and a read of 2
 * bytes per weight of every chosen expert per layer and 4096-token chunk
 * (Qwen3-30B-A3B: ~2.7 GB of traffic, ~0.7 ms per layer and chunk,
 * against ~3.6 ms for the whole bf16 layer at prefill 8k) -- chosen for
 * today because it reuses the tested tensor-core GEMM exactly; a GEMM
 * that dequantizes tiles while loading them would save that pass.
 *
 * Device tables of expert weight pointers are built once per distinct
 * set of weights (keyed by the experts array, checked pointer by
 * pointer) when the op is submitted, outside any capture; they are never
 * freed before the backend, so a captured graph's table stays valid.
 * Scratch grows at submit time too (sync, reallocate, drop graphs).
 */
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

using namespace nvcuda;

#define CU_MOE_CHUNK 4096  /* tokens per pass: bounds y to CHUNK * top_k * hidden floats */
#define CU_MOE_GEMV_MAX 4  /* tokens up to which the gathered GEMV path runs */
#define CU_MOE_MAX_E 1024  /* experts (router kernel's shared memory, one block scans) */
#define CU_MOE_MAX_K 32    /* experts per token */
#define CU_MOE_TABLES 4096 /* distinct expert weight sets (layers x models loaded) */
#define RT 4               /* tokens per router block */

/* grouped GEMM: K steps of 32 (tile shapes: mg_shape) */
#define MG_BK 32
#define MG_LD (MG_BK + 8) /* padded smem row (bf16): 80 bytes, keeps 32-byte fragment alignment */
#define MG_ST 3           /* cp.async pipeline stages (45 KB of static smem with gate and up) */

struct cu_moe_table {
    const ns_tensor *key;  /* the experts array of the op */
    const void **host;     /* [3E] the pointers, to confirm a match */
    const bf16 **dev;      /* [3E] device copy: gate [0,E), up [E,2E), down [2E,3E) (quantized: block bases) */
    int32_t n_experts;
    int32_t ff; /* moe_intermediate_size: gate/up rows */
    bool quant;       /* block-quantized experts (cuda_quant.cu's kernels) */
    ns_dtype dt[3];   /* gate, up, down types */
};

/* ------------------------------------------------------------- helpers */

static inline size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Scratch layout for one chunk of Tc tokens. */
struct moe_ws {
    int32_t *done, *counts, *cursor, *offs, *tile_off, *ids, *rows, *pos;
    float *wts, *logits;
    bf16 *xbf;
    void *h; /* F32 [TK, F] (GEMV path) or BF16 [TK, F] (GEMM path) */
    float *y;
    /* quantized experts only: activation quantization (GEMV path), and
     * (GEMM path) the bf16 copies of the chosen experts and their table */
    int8_t *xq;
    float *xd, *xs;
    bf16 *deq;
    const bf16 **bftab;
    size_t bytes;
};

/* quant: the experts are block-quantized (adds their regions). */
static moe_ws ws_layout(uint8_t *base, int64_t Tc, int K, int E, int64_t H, int64_t F, bool quant) {
    moe_ws w;
    const size_t TK = (size_t)Tc * (size_t)K;
    size_t o = 0;
#define TAKE(field, type, n)                       \
    w.field = (type *)(base ? base + o : NULL);    \
    o += al256((size_t)(n) * sizeof(type));
    TAKE(done, int32_t, 1);
    TAKE(counts, int32_t, E);
    TAKE(cursor, int32_t, E);
    TAKE(offs, int32_t, E + 1);
    TAKE(tile_off, int32_t, E + 1);
    TAKE(ids, int32_t, TK);
    TAKE(rows, int32_t, TK);
    TAKE(pos, int32_t, TK);
    TAKE(wts, float, TK);
    TAKE(logits, float, (size_t)Tc * E);
    TAKE(xbf, bf16, (size_t)Tc * H);
    w.h = base ? base + o : NULL;
    o += al256(TK * (size_t)F * sizeof(float));
    TAKE(y, float, TK * (size_t)H);
    /* the quantized activations: TK rows (grouped GEMVs: gathered, sorted)
     * of max(H, F), plus 4 spare rows the grouped GEMVs may read past the
     * last segment (TK >= Tc: the gathered path's Tc rows fit too) */
    const size_t nq = quant ? (TK + 4) * (size_t)(H > F ? H : F) : 0;
    TAKE(xq, int8_t, nq);
    TAKE(xd, float, nq / 32);
    TAKE(xs, float, nq / 16);
    const bool grouped = quant && Tc > CU_MOE_GEMV_MAX;
    TAKE(deq, bf16, grouped ? (size_t)3 * E * (size_t)(H * F) : 0);
    TAKE(bftab, const bf16 *, grouped ? (size_t)3 * E : 0);
#undef TAKE
    w.bytes = o;
    return w;
}

/* ------------------------------------------------------------- kernels */

__device__ __forceinline__ float moe_dot8(uint4 w, const float *x) {
    return cu_dot8(w, *reinterpret_cast<const float4 *>(x), *reinterpret_cast<const float4 *>(x + 4));
}

__device__ __forceinline__ float moe_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Two floats rounded to bf16 (nearest even), packed low then high. */
__device__ __forceinline__ uint32_t bf2_bits(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}

/* out[r, :] += b[:] */
__global__ void k_add_bias(float *__restrict__ out, const float *__restrict__ b, int64_t rows, int cols) {
    PDL_ENTRY();
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] += b[i % cols];
}

/* Softmax and top k of one token, by one warp: src = its E logits (read
 * through L2: in the fused router they come from other blocks), p = E
 * floats of the warp's shared memory. Writes the token's k ids and
 * weights (ties to the lower expert; renormalized when norm); counts
 * (grouped path only) gets one atomic increment per chosen slot. */
__device__ __forceinline__ void topk_warp(const float *src, float *p, int E, int K, int norm, int32_t *ids,
                                          float *wts, int32_t *counts) {
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < E; e += 32) p[e] = __ldcg(src + e);
    __syncwarp();
    float mx = p[0];
    for (int e = lane; e < E; e += 32) mx = p[e] > mx ? p[e] : mx;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = v > mx ? v : mx;
    }
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += (p[e] = expf(p[e] - mx));
    sum = cu_warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] /= sum;
    __syncwarp();
    float ksum = 0.f, wsel = 0.f;
    int isel = 0;
    for (int j = 0; j < K; j++) {
        float bv = -1.f;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (p[e] >= 0.f && p[e] > bv) bv = p[e], bi = e; /* ascending e: ties keep the lower */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        /* every lane holds the same (bv, bi) now */
        const int id = bi < 0 ? 0 : bi; /* NaN logits: a valid index, a poisoned weight */
        const float w = bi < 0 ? __int_as_float(0x7fc00000) : bv;
        if (bi >= 0) ksum += w;
        if (lane == j) isel = id, wsel = w;
        __syncwarp();
        if (lane == 0 && bi >= 0) p[bi] = -1.f; /* taken */
        __syncwarp();
    }
    if (lane < K) {
        if (norm) wsel /= ksum;
        ids[lane] = isel;
        wts[lane] = wsel;
        if (counts) atomicAdd(&counts[isel], 1);
    }
}

/* Router logits [T, E]: warp w of block (bx, by) computes expert
 * bx*8 + w for tokens by*RT .. by*RT+RT-1, streaming the router row once
 * for all of them. Spread over E/8 x T/RT blocks so that even one token
 * has every router row in flight at once (one block streaming the whole
 * router from HBM was latency-bound: ~4 KB in flight per SM).
 * FUSE (decode, T <= RT, one block row): the last block to finish (a
 * self-resetting counter, done) runs the top k of every token, which
 * saves a launch per layer. */
template <bool FUSE>
__global__ __launch_bounds__(256) void k_moe_logits(const float *__restrict__ x, const bf16 *__restrict__ router,
                                                     int T, int H, int E, float *__restrict__ logits,
                                                     int32_t *__restrict__ counts, int K, int norm,
                                                     int32_t *__restrict__ ids, float *__restrict__ wts,
                                                     int32_t *__restrict__ done) {
    PDL_ENTRY();
    /* the grouped path's per-expert counts start from zero every time
     * (k_moe_topk, the next kernel, increments them) */
    if (counts && blockIdx.x == 0 && blockIdx.y == 0)
        for (int i = threadIdx.x; i < E; i += blockDim.x) counts[i] = 0;
    const int e = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31, t0 = blockIdx.y * RT;
    const int nr = T - t0 < RT ? T - t0 : RT;
    if (e < E) {
        const int nch = H / 8;
        const uint4 *wr = reinterpret_cast<const uint4 *>(router + (size_t)e * H);
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; r++) acc[r] = 0.f;
#pragma unroll 4
        for (int c = lane; c < nch; c += 32) {
            const uint4 w = cu_ld_stream(wr + c);
#pragma unroll
            for (int r = 0; r < RT; r++)
                if (r < nr) acc[r] += moe_dot8(w, x + (size_t)(t0 + r) * H + 8 * c);
        }
#pragma unroll
        for (int r = 0; r < RT; r++) {
            const float s = cu_warp_sum(acc[r]);
            if (lane == 0 && r < nr) logits[(size_t)(t0 + r) * E + e] = s;
        }
    }
    if (!FUSE) return;
    __shared__ float lg[RT * CU_MOE_MAX_E];
    __shared__ int last;
    __threadfence(); /* this block's logits are visible before it counts itself done */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1) == (int)(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *done = 0; /* for the next call */
    const int w = threadIdx.x / 32;
    if (w < T && w < RT)
        topk_warp(logits + (size_t)w * E, lg + w * CU_MOE_MAX_E, E, K, norm, ids + (size_t)w * K,
                  wts + (size_t)w * K, NULL);
}

/* Softmax and top k, one warp per token (8 per block). */
__global__ __launch_bounds__(256) void k_moe_topk(const float *__restrict__ logits, int T, int E, int K, int norm,
                                                   int32_t *__restrict__ ids, float *__restrict__ wts,
                                                   int32_t *__restrict__ counts) {
    PDL_ENTRY();
    __shared__ float lg[8 * CU_MOE_MAX_E];
    const int warp = threadIdx.x / 32, t = blockIdx.x * 8 + warp;
    if (t >= T) return;
    topk_warp(logits + (size_t)t * E, lg + warp * CU_MOE_MAX_E, E, K, norm, ids + (size_t)t * K, wts + (size_t)t * K,
              counts);
}

/* Counting sort, step 2 (one block of 1024 threads, E <= 1024): segment
 * starts offs[E+1], bm-row tile starts tile_off[E+1], scatter cursors. */
__global__ __launch_bounds__(1024) void k_moe_scan(int32_t *__restrict__ counts, int32_t *__restrict__ cursor,
                                                    int32_t *__restrict__ offs, int32_t *__restrict__ tile_off, int E,
                                                    int bm) {
    PDL_ENTRY();
    __shared__ int32_t wc[32], wt[32];
    const int e = threadIdx.x, lane = e & 31, warp = e / 32;
    const int32_t c = e < E ? counts[e] : 0, tl = (c + bm - 1) / bm;
    int32_t ic = c, it = tl; /* inclusive scans within the warp */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) ic += a, it += b;
    }
    if (lane == 31) wc[warp] = ic, wt[warp] = it;
    __syncthreads();
    if (warp == 0) {
        int32_t a = wc[lane], b = wt[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
            if (lane >= o) a += x, b += y;
        }
        wc[lane] = a, wt[lane] = b;
    }
    __syncthreads();
    if (warp > 0) ic += wc[warp - 1], it += wt[warp - 1];
    if (e < E) {
        offs[e + 1] = ic;
        tile_off[e + 1] = it;
        cursor[e] = ic - c;
    }
    if (e == 0) offs[0] = 0, tile_off[0] = 0;
}

/* Counting sort, step 3: slot i goes to its expert's segment. */
__global__ void k_moe_scatter(const int32_t *__restrict__ ids, int32_t *__restrict__ cursor,
                              int32_t *__restrict__ rows, int32_t *__restrict__ pos, int TK) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= TK) return;
    const int p = atomicAdd(&cursor[ids[i]], 1);
    if (p >= TK) return; /* cannot happen with consistent counts; never write out of bounds */
    rows[p] = i;
    pos[i] = p;
}

/* Gathered GEMV, gate and up with SwiGLU: warp w of block (bx, slot)
 * computes rows f and f + 1 (f = 2 (bx*8 + w)) of the slot's expert;
 * h[slot, f] F32. Two rows per warp: 8 independent 16-byte loads per lane
 * per iteration, and at batch 1 the grid (F/16 x 8 slots) fits the chip
 * in one wave (one row per warp took 1.45 waves). */
__global__ __launch_bounds__(256) void k_moe_gemv_gu(const float *__restrict__ x, const bf16 *const *__restrict__ tab,
                                                      const int32_t *__restrict__ ids, int K, int E, int H, int F,
                                                      float *__restrict__ h) {
    PDL_ENTRY();
    const int f = 2 * (blockIdx.x * 8 + threadIdx.x / 32), lane = threadIdx.x & 31, slot = blockIdx.y;
    if (f >= F) return;
    const int f1 = f + 1 < F ? f + 1 : f; /* F is a multiple of 8, so f + 1 < F; kept safe anyway */
    const int e = ids[slot];
    const uint4 *wg0 = reinterpret_cast<const uint4 *>(tab[e] + (size_t)f * H);
    const uint4 *wu0 = reinterpret_cast<const uint4 *>(tab[E + e] + (size_t)f * H);
    const uint4 *wg1 = reinterpret_cast<const uint4 *>(tab[e] + (size_t)f1 * H);
    const uint4 *wu1 = reinterpret_cast<const uint4 *>(tab[E + e] + (size_t)f1 * H);
    const float *xr = x + (size_t)(slot / K) * H;
    float g0 = 0.f, u0 = 0.f, g1 = 0.f, u1 = 0.f;
    const int nch = H / 8;
#pragma unroll 2
    for (int c = lane; c < nch; c += 32) {
        const uint4 a0 = cu_ld_stream(wg0 + c), b0 = cu_ld_stream(wu0 + c), a1 = cu_ld_stream(wg1 + c), b1 = cu_ld_stream(wu1 + c);
        g0 += moe_dot8(a0, xr + 8 * c);
        u0 += moe_dot8(b0, xr + 8 * c);
        g1 += moe_dot8(a1, xr + 8 * c);
        u1 += moe_dot8(b1, xr + 8 * c);
    }
    g0 = cu_warp_sum(g0);
    u0 = cu_warp_sum(u0);
    g1 = cu_warp_sum(g1);
    u1 = cu_warp_sum(u1);
    if (lane == 0) {
        h[(size_t)slot * F + f] = moe_silu_mul(g0, u0);
        if (f1 != f) h[(size_t)slot * F + f1] = moe_silu_mul(g1, u1);
    }
}

/* Gathered GEMV, down, with the combine: warp w of block (bx, t)
 * computes output row r = bx*8 + w of token t over the token's experts in
 * ascending expert order: out[t, r] += p_e * (down_e[r, :] . h[slot, :]),
 * each added with one FMA as the CPU reference's axpy does. Up to 8
 * experts' rows are loaded at once. */
__global__ __launch_bounds__(256) void k_moe_gemv_down(const float *__restrict__ h,
                                                        const bf16 *const *__restrict__ tab,
                                                        const int32_t *__restrict__ ids,
                                                        const float *__restrict__ wts, int K, int E, int H, int F,
                                                        float *__restrict__ out) {
    PDL_ENTRY();
    __shared__ int32_t se[8][CU_MOE_MAX_K], ss[8][CU_MOE_MAX_K];
    __shared__ float sw[8][CU_MOE_MAX_K];
    const int warp = threadIdx.x / 32, r = blockIdx.x * 8 + warp, lane = threadIdx.x & 31, t = blockIdx.y;
    if (r >= H) return;
    /* rank of each slot by expert id (a token's experts are distinct) */
    const int32_t my_e = lane < K ? ids[(size_t)t * K + lane] : 0x7fffffff;
    int rank = 0;
    for (int j = 0; j < K; j++) rank += __shfl_sync(0xffffffffu, my_e, j) < my_e;
    if (lane < K) {
        se[warp][rank] = my_e;
        ss[warp][rank] = t * K + lane;
        sw[warp][rank] = wts[(size_t)t * K + lane];
    }
    __syncwarp();
    float acc = out[(size_t)t * H + r];
    const int nch = F / 8;
    for (int s0 = 0; s0 < K; s0 += 8) {
        /* chunk c of all 8 experts' rows per iteration: 8 independent
         * loads in flight per lane (a loop per expert waited 8 times) */
        const int nu = K - s0 < 8 ? K - s0 : 8;
        const uint4 *wd[8];
        const float *hr[8];
        float part[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int q = s0 + (u < nu ? u : 0);
            wd[u] = reinterpret_cast<const uint4 *>(tab[2 * E + se[warp][q]] + (size_t)r * F);
            hr[u] = h + (size_t)ss[warp][q] * F;
            part[u] = 0.f;
        }
        for (int c = lane; c < nch; c += 32) {
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (u < nu) part[u] += moe_dot8(cu_ld_stream(wd[u] + c), hr[u] + 8 * c);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const float d = cu_warp_sum(part[u]);
            if (s0 + u < K) acc = fmaf(sw[warp][s0 + u], d, acc);
        }
    }
    if (lane == 0) out[(size_t)t * H + r] = acc;
}

/* Grouped GEMV for batches of a few rows per expert (NS_CUDA_MOE_GGEMV=1;
 * off by default: at batch 64 it measured 40.3 ms/step against 31.6 for
 * the 16-row GEMM tiles): block (bx, e) streams rows 2 (bx*8 + w) and +1
 * of expert e's gate and up weights once, contiguously, and applies them
 * to every slot of e's segment, four at a time. h[pos, f] F32 (pos: the
 * slot's place in the sorted order). Empty experts exit at once. */
__global__ __launch_bounds__(256) void k_moe_ggemv_gu(const float *__restrict__ x, const bf16 *const *__restrict__ tab,
                                                       const int32_t *__restrict__ offs,
                                                       const int32_t *__restrict__ rows, int K, int E, int H, int F,
                                                       int TK, float *__restrict__ h) {
    PDL_ENTRY();
    const int f = 2 * (blockIdx.x * 8 + threadIdx.x / 32), lane = threadIdx.x & 31, e = blockIdx.y;
    const int s0 = offs[e], s1 = min(offs[e + 1], TK);
    if (f >= F || s0 >= s1) return;
    const uint4 *wg0 = reinterpret_cast<const uint4 *>(tab[e] + (size_t)f * H);
    const uint4 *wu0 = reinterpret_cast<const uint4 *>(tab[E + e] + (size_t)f * H);
    const uint4 *wg1 = reinterpret_cast<const uint4 *>(tab[e] + (size_t)(f + 1) * H); /* F % 8 == 0: f + 1 < F */
    const uint4 *wu1 = reinterpret_cast<const uint4 *>(tab[E + e] + (size_t)(f + 1) * H);
    const int nch = H / 8;
    for (int p0 = s0; p0 < s1; p0 += 4) {
        const int n = s1 - p0 < 4 ? s1 - p0 : 4;
        const float *xr[4];
#pragma unroll
        for (int j = 0; j < 4; j++) xr[j] = x + (size_t)(rows[p0 + (j < n ? j : 0)] / K) * H;
        float g0[4] = {0.f, 0.f, 0.f, 0.f}, u0[4] = {0.f, 0.f, 0.f, 0.f}, g1[4] = {0.f, 0.f, 0.f, 0.f},
              u1[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = lane; c < nch; c += 32) {
            const uint4 a0 = __ldg(wg0 + c), b0 = __ldg(wu0 + c), a1 = __ldg(wg1 + c), b1 = __ldg(wu1 + c);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < n) {
                    g0[j] += moe_dot8(a0, xr[j] + 8 * c);
                    u0[j] += moe_dot8(b0, xr[j] + 8 * c);
                    g1[j] += moe_dot8(a1, xr[j] + 8 * c);
                    u1[j] += moe_dot8(b1, xr[j] + 8 * c);
                }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float a = cu_warp_sum(g0[j]), b = cu_warp_sum(u0[j]), cc = cu_warp_sum(g1[j]),
                        d = cu_warp_sum(u1[j]);
            if (lane == 0 && j < n) {
                h[(size_t)(p0 + j) * F + f] = moe_silu_mul(a, b);
                h[(size_t)(p0 + j) * F + f + 1] = moe_silu_mul(cc, d);
            }
        }
    }
}

/* Grouped GEMV, down: y[pos, r] = down_e[r, :] . h[pos, :] for rows r and
 * r + 1 = 2 (bx*8 + w) of expert e = by, over e's segment. */
__global__ __launch_bounds__(256) void k_moe_ggemv_down(const float *__restrict__ h,
                                                         const bf16 *const *__restrict__ tab,
                                                         const int32_t *__restrict__ offs, int E, int H, int F,
                                                         int TK, float *__restrict__ y) {
    PDL_ENTRY();
    const int r = 2 * (blockIdx.x * 8 + threadIdx.x / 32), lane = threadIdx.x & 31, e = blockIdx.y;
    const int s0 = offs[e], s1 = min(offs[e + 1], TK);
    if (r >= H || s0 >= s1) return;
    const uint4 *w0 = reinterpret_cast<const uint4 *>(tab[2 * E + e] + (size_t)r * F);
    const uint4 *w1 = reinterpret_cast<const uint4 *>(tab[2 * E + e] + (size_t)(r + 1) * F); /* H % 8 == 0 */
    const int nch = F / 8;
    for (int p0 = s0; p0 < s1; p0 += 4) {
        const int n = s1 - p0 < 4 ? s1 - p0 : 4;
        float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = lane; c < nch; c += 32) {
            const uint4 x0 = __ldg(w0 + c), x1 = __ldg(w1 + c);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < n) {
                    const float *hr = h + (size_t)(p0 + j) * F + 8 * c;
                    a[j] += moe_dot8(x0, hr);
                    b[j] += moe_dot8(x1, hr);
                }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float sa = cu_warp_sum(a[j]), sb = cu_warp_sum(b[j]);
            if (lane == 0 && j < n) {
                y[(size_t)(p0 + j) * H + r] = sa;
                y[(size_t)(p0 + j) * H + r + 1] = sb;
            }
        }
    }
}

/* out[t, :] += sum over the token's experts, ascending, of p * y[row].
 * pos == NULL: slot i's row is i. */
__global__ __launch_bounds__(256) void k_moe_combine(float *__restrict__ out, const float *__restrict__ y,
                                                      const int32_t *__restrict__ ids, const float *__restrict__ wts,
                                                      const int32_t *__restrict__ pos, int K, int H) {
    PDL_ENTRY();
    __shared__ int32_t se[CU_MOE_MAX_K], sr[CU_MOE_MAX_K];
    __shared__ float sw[CU_MOE_MAX_K];
    const int t = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int k = 0; k < K; k++) { /* insertion sort by expert id (K is small) */
            const int i = t * K + k;
            const int32_t e = ids[i], r = pos ? pos[i] : i;
            const float w = wts[i];
            int j = k;
            while (j > 0 && se[j - 1] > e) {
                se[j] = se[j - 1], sr[j] = sr[j - 1], sw[j] = sw[j - 1];
                j--;
            }
            se[j] = e, sr[j] = r, sw[j] = w;
        }
    }
    __syncthreads();
    float *o = out + (size_t)t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        float acc = o[c];
        for (int k = 0; k < K; k++) acc = fmaf(sw[k], y[(size_t)sr[k] * H + c], acc);
        o[c] = acc;
    }
}

/* ---------------------------------------------------------- grouped GEMM */

__device__ __forceinline__ void cp16(void *smem, const void *g, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int sz = valid ? 16 : 0; /* 0: zero-fill, nothing read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(sz));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

struct moe_gemm_args {
    const bf16 *a;          /* A source rows, a_ld elements apart */
    int a_ld;
    const int32_t *a_slot;  /* gate/up: rows[pos] = slot, A row = slot / top_k; down: NULL (A row = pos) */
    int top_k;
    const bf16 *const *tab; /* expert pointer table */
    int w0, w1;             /* table offsets of the weight matrices (w1 < 0: one matrix) */
    int N, Kd;              /* output columns, reduction length (multiple of 8) */
    const int32_t *offs, *tile_off;
    int E;
    int rows;               /* T * top_k: no row at or past it is read or written */
    bf16 *out_bf;           /* gate/up: h = silu(gate) * up, BF16 [TK, N] */
    float *out_f;           /* down: y F32 [TK, N] */
};

/* Tile shapes (rows of one expert's segment x columns per weight matrix):
 * WM x WN warps, each FM x FN WMMA 16x16x16 fragments per matrix, so
 * BM = 16 WM FM and BN = 16 WN FN. NB = 2: gate and up tiles side by side
 * (same columns), SwiGLU in the epilogue. K in steps of 32 through a
 * three-stage cp.async pipeline in dynamic shared memory. The host picks
 * the shape from the expected rows per expert (T k / E): decode batches
 * (a few rows per expert) take 16-row tiles so the tensor cores do not
 * compute 60 empty rows per weight tile; prefill takes 128-row tiles
 * (more reuse of each weight tile, half the L2 traffic of 64-row ones). */
template <int WM, int WN, int FM, int FN, int NB>
struct mg_shape {
    static constexpr int BM = 16 * WM * FM, BN = 16 * WN * FN, THREADS = 32 * WM * WN;
    static constexpr int A_EL = BM * MG_LD, B_EL = NB * BN * MG_LD, STAGE_EL = A_EL + B_EL;
    static constexpr size_t SMEM = (size_t)MG_ST * STAGE_EL * sizeof(bf16);
};

/* The grouped GEMM's epilogue: each warp stages its fragments (NB x 16 x
 * 16 floats at st, in the stage memory, free by now) and writes the rows
 * of its segment: SwiGLU to BF16 h (NB = 2) or F32 y. */
template <int WM, int WN, int FM, int FN, int NB>
__device__ __forceinline__ void gemm_epilogue(const moe_gemm_args &g,
                                              wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[NB][FM][FN],
                                              float *st, int m0, int m_end, int n0, int wm, int wn, int lane) {
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) {
#pragma unroll
            for (int b = 0; b < NB; b++) wmma::store_matrix_sync(st + b * 256, acc[b][i][j], 16, wmma::mem_row_major);
            __syncwarp();
            /* lane: 8 consecutive columns of one row, stored as one 16-byte
             * (bf16) or two 16-byte (F32) writes; N and n are multiples of
             * 8, so the 8 columns are all in range or all out */
            const int r = lane / 2, c0 = (lane & 1) * 8;
            const int m = m0 + (wm * FM + i) * 16 + r, n = n0 + (wn * FN + j) * 16 + c0;
            if (m < m_end && n < g.N) {
                const float4 v0 = *reinterpret_cast<const float4 *>(st + r * 16 + c0),
                             v1 = *reinterpret_cast<const float4 *>(st + r * 16 + c0 + 4);
                if (NB == 2) {
                    const float4 u0 = *reinterpret_cast<const float4 *>(st + 256 + r * 16 + c0),
                                 u1 = *reinterpret_cast<const float4 *>(st + 256 + r * 16 + c0 + 4);
                    uint4 o;
                    o.x = bf2_bits(moe_silu_mul(v0.x, u0.x), moe_silu_mul(v0.y, u0.y));
                    o.y = bf2_bits(moe_silu_mul(v0.z, u0.z), moe_silu_mul(v0.w, u0.w));
                    o.z = bf2_bits(moe_silu_mul(v1.x, u1.x), moe_silu_mul(v1.y, u1.y));
                    o.w = bf2_bits(moe_silu_mul(v1.z, u1.z), moe_silu_mul(v1.w, u1.w));
                    *reinterpret_cast<uint4 *>(g.out_bf + (size_t)m * g.N + n) = o;
                } else {
                    float4 *o = reinterpret_cast<float4 *>(g.out_f + (size_t)m * g.N + n);
                    o[0] = v0;
                    o[1] = v1;
                }
            }
            __syncwarp();
        }
}

template <int WM, int WN, int FM, int FN, int NB>
__global__ __launch_bounds__(32 * WM * WN) void k_moe_gemm(moe_gemm_args g) {
    using S = mg_shape<WM, WN, FM, FN, NB>;
    PDL_ENTRY();
    extern __shared__ __align__(128) unsigned char mg_smem[];
    bf16 *sm = reinterpret_cast<bf16 *>(mg_smem);
    const int tile = blockIdx.y;
    if (tile >= g.tile_off[g.E]) return; /* past the real tile count */
    int lo = 0, hi = g.E;                /* tile_off[lo] <= tile < tile_off[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (g.tile_off[mid] <= tile) lo = mid;
        else hi = mid;
    }
    const int e = lo;
    const int m0 = g.offs[e] + (tile - g.tile_off[e]) * S::BM, m_end = min(g.offs[e + 1], g.rows);
    const int n0 = blockIdx.x * S::BN;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, wm = warp / WN, wn = warp % WN;
    const bf16 *W[NB];
    W[0] = g.tab[g.w0 + e];
    if (NB == 2) W[NB - 1] = g.tab[g.w1 + e];

    /* 16-byte chunks: 4 per 32-wide row; A has BM rows, B NB * BN */
    constexpr int A_CH = (S::BM * 4 + S::THREADS - 1) / S::THREADS, B_CH = (NB * S::BN * 4) / S::THREADS;
    static_assert((NB * S::BN * 4) % S::THREADS == 0, "B chunks must divide among the threads");
    const bf16 *arow[A_CH];
    bool aok[A_CH];
#pragma unroll
    for (int u = 0; u < A_CH; u++) {
        const int id = tid + S::THREADS * u, r = id / 4, m = m0 + r;
        aok[u] = id < S::BM * 4 && m < m_end;
        const int src = !aok[u] ? 0 : g.a_slot ? g.a_slot[m] / g.top_k : m;
        arow[u] = g.a + (size_t)src * g.a_ld;
    }
    const int kc = (tid & 3) * 8; /* THREADS is a multiple of 4: a thread's chunk column never changes */
    auto load = [&](int st, int k0) {
        bf16 *sa = sm + st * S::STAGE_EL, *sb = sa + S::A_EL;
        const bool kin = k0 + kc < g.Kd;
#pragma unroll
        for (int u = 0; u < A_CH; u++) {
            const int id = tid + S::THREADS * u;
            if (id < S::BM * 4) {
                const bool ok = aok[u] && kin;
                cp16(&sa[(id / 4) * MG_LD + kc], ok ? arow[u] + k0 + kc : g.a, ok);
            }
        }
#pragma unroll
        for (int u = 0; u < B_CH; u++) {
            const int r = (tid + S::THREADS * u) / 4, n = n0 + r % S::BN;
            const bf16 *wb = NB == 2 && r >= S::BN ? W[NB - 1] : W[0]; /* a select, not a local-memory index */
            const bool ok = n < g.N && kin;
            cp16(&sb[r * MG_LD + kc], ok ? wb + (size_t)n * g.Kd + k0 + kc : wb, ok);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][FM][FN];
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < FM; i++)
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[b][i][j], 0.f);

    /* step kt waits for its own group (two in flight); one barrier per
     * step both publishes stage kt and retires stage kt - 1, which the
     * load for step kt + 2 then overwrites */
    const int nk = (g.Kd + MG_BK - 1) / MG_BK;
    load(0, 0);
    cp_commit();
    if (nk > 1) load(1, MG_BK);
    cp_commit();
    for (int kt = 0; kt < nk; kt++) {
        cp_wait1(); /* groups 0..kt complete (kt + 2 committed) */
        __syncthreads();
        if (kt + 2 < nk) load((kt + 2) % MG_ST, (kt + 2) * MG_BK);
        cp_commit();
        const bf16 *a = sm + (kt % MG_ST) * S::STAGE_EL, *bb = a + S::A_EL;
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[FM];
#pragma unroll
            for (int i = 0; i < FM; i++)
                wmma::load_matrix_sync(fa[i], a + ((wm * FM + i) * 16) * MG_LD + kk, MG_LD);
#pragma unroll
            for (int b = 0; b < NB; b++)
#pragma unroll
                for (int j = 0; j < FN; j++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, bb + (b * S::BN + (wn * FN + j) * 16) * MG_LD + kk, MG_LD);
#pragma unroll
                    for (int i = 0; i < FM; i++) wmma::mma_sync(acc[b][i][j], fa[i], fb, acc[b][i][j]);
                }
        }
    }
    asm volatile("cp.async.wait_all;\n" ::); /* only empty groups are left; be explicit */
    __syncthreads();                          /* every warp is done reading the stages */

    gemm_epilogue<WM, WN, FM, FN, NB>(g, acc, reinterpret_cast<float *>(mg_smem) + warp * 512, m0, m_end, n0, wm,
                                      wn, lane);
}

/* ------------------------------------------------------------ host side */

template <int WM, int WN, int FM, int FN, int NB>
static void gemm_attr(cu_impl *c) {
    cu_check(c, cudaFuncSetAttribute(k_moe_gemm<WM, WN, FM, FN, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)mg_shape<WM, WN, FM, FN, NB>::SMEM),
             "moe gemm smem attribute");
}

template <int WM, int WN, int FM, int FN, int NB>
static void gemm_launch(cu_impl *c, const moe_gemm_args &g, int64_t max_tiles, const char *what) {
    using S = mg_shape<WM, WN, FM, FN, NB>;
    cu_launch(c, k_moe_gemm<WM, WN, FM, FN, NB>, dim3((unsigned)((g.N + S::BN - 1) / S::BN), (unsigned)max_tiles),
              dim3(S::THREADS), S::SMEM, g);
    CU_LAUNCHED(c, what);
}

/* Tile shape by the expected rows per expert (T k / E): 16-row tiles up to
 * 16 rows (decode batches), 64-row up to 128, else 128-row (prefill). */
enum { MG_SMALL = 0, MG_MEDIUM = 1, MG_LARGE = 2 };
static int gemm_shape(int TK, int E) { return TK <= 16 * E ? MG_SMALL : TK <= 128 * E ? MG_MEDIUM : MG_LARGE; }
static const int mg_bm[3] = {16, 64, 128};


void cu_moe_free(cu_impl *c) {
    for (int32_t i = 0; i < c->n_moe_tables; i++) {
        free(c->moe_tables[i].host);
        if (c->moe_tables[i].dev) cudaFree(c->moe_tables[i].dev);
    }
    free(c->moe_tables);
    c->moe_tables = NULL;
    c->n_moe_tables = 0;
    if (c->moe_ws) cudaFree(c->moe_ws);
    c->moe_ws = NULL;
    c->moe_ws_bytes = 0;
}

void cu_launch_add_bias(cu_impl *c, float *out, const float *b, int64_t rows, int cols) {
    const int64_t n = rows * cols;
    if (n <= 0) return;
    int64_t blocks = (n + 255) / 256;
    if (blocks > 132 * 32) blocks = 132 * 32;
    cu_launch(c, k_add_bias, dim3((unsigned)blocks), dim3(256), 0, out, b, rows, cols);
    CU_LAUNCHED(c, "add_bias");
}

/* The table index for this experts array (building it on first sight),
 * or -1 with the error recorded. */
static int32_t moe_table(cu_impl *c, const ns_tensor *experts, int E) {
    const size_t n = (size_t)3 * (size_t)E;
    for (int32_t i = c->n_moe_tables - 1; i >= 0; i--) {
        cu_moe_table *t = &c->moe_tables[i];
        /* the types too: freed weights' addresses can come back with other
         * types (a test's next weight set, a reloaded model) */
        if (t->key != experts || t->n_experts != E || t->ff != experts[0].rows ||
            t->dt[0] != (ns_dtype)experts[0].dtype || t->dt[1] != (ns_dtype)experts[E].dtype ||
            t->dt[2] != (ns_dtype)experts[2 * E].dtype)
            continue;
        size_t j = 0;
        while (j < n && t->host[j] == experts[j].data) j++;
        if (j == n) return i;
    }
    if (c->n_moe_tables >= CU_MOE_TABLES) {
        cu_set_error(c, NS_ERR_RANGE, "cuda moe_ffn: more than %d distinct expert weight sets", CU_MOE_TABLES);
        return -1;
    }
    if (c->n_moe_tables == c->cap_moe_tables) {
        const int32_t cap = c->cap_moe_tables ? 2 * c->cap_moe_tables : 64;
        cu_moe_table *p = (cu_moe_table *)realloc(c->moe_tables, (size_t)cap * sizeof *p);
        if (!p) {
            cu_set_error(c, NS_ERR_NOMEM, "cuda moe_ffn: out of host memory");
            return -1;
        }
        c->moe_tables = p;
        c->cap_moe_tables = cap;
    }
    cu_moe_table *t = &c->moe_tables[c->n_moe_tables];
    memset(t, 0, sizeof *t);
    t->host = (const void **)malloc(n * sizeof *t->host);
    if (!t->host) {
        cu_set_error(c, NS_ERR_NOMEM, "cuda moe_ffn: out of host memory");
        return -1;
    }
    for (size_t j = 0; j < n; j++) t->host[j] = experts[j].data;
    if (cu_check(c, cudaMalloc(&t->dev, n * sizeof *t->dev), "cudaMalloc(moe table)") ||
        /* on the compute stream: ordered before every kernel that reads it
         * (t->host stays alive with the table) */
        cu_check(c, cudaMemcpyAsync(t->dev, t->host, n * sizeof *t->dev, cudaMemcpyHostToDevice, c->stream),
                 "moe table upload")) {
        cudaStreamSynchronize(c->stream);
        free(t->host);
        if (t->dev) cudaFree(t->dev);
        return -1;
    }
    t->key = experts;
    t->n_experts = E;
    t->ff = (int32_t)experts[0].rows;
    t->quant = ns_dtype_is_quant((ns_dtype)experts[0].dtype);
    for (int s = 0; s < 3; s++) t->dt[s] = (ns_dtype)experts[(size_t)s * E].dtype;
    return c->n_moe_tables++;
}

/* Scratch for a chunk of Tc tokens (grown outside any capture). */
static bool moe_reserve(cu_impl *c, int64_t Tc, int K, int E, int64_t H, int64_t F, bool quant) {
    const moe_ws w = ws_layout(NULL, Tc, K, E, H, F, quant);
    if (w.bytes <= c->moe_ws_bytes) return true;
    if (c->capturing) {
        c->capture_failed = true;
        return false;
    }
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (c->moe_ws) cu_check(c, cudaFree(c->moe_ws), "cudaFree(moe scratch)");
    c->moe_ws = NULL;
    c->moe_ws_bytes = 0;
    cu_bump_generation(c);
    void *p = NULL;
    if (cu_check(c, cudaMalloc(&p, w.bytes), "cudaMalloc(moe scratch)")) return false;
    /* zeroed: the fused router's done counter starts at 0 (and resets itself) */
    if (cu_check(c, cudaMemsetAsync(p, 0, w.bytes, c->stream), "moe scratch clear")) {
        cudaFree(p);
        return false;
    }
    c->moe_ws = p;
    c->moe_ws_bytes = w.bytes;
    return true;
}

int32_t cu_moe_prepare(cu_impl *c, const ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                       const ns_tensor *experts, int E, int K) {
    if (out->dtype != NS_DT_F32 || in->dtype != NS_DT_F32) {
        cu_set_error(c, NS_ERR_INVALID, "cuda moe_ffn: activations must be F32");
        return -1;
    }
    if (E < 1 || E > CU_MOE_MAX_E || K < 1 || K > E || K > CU_MOE_MAX_K) {
        cu_set_error(c, NS_ERR_UNSUPPORTED, "cuda moe_ffn: %d experts, top %d (supported: up to %d experts, top %d)",
                     E, K, CU_MOE_MAX_E, CU_MOE_MAX_K);
        return -1;
    }
    const int64_t T = in->rows, H = in->cols, F = experts[0].rows;
    if (out->rows != T || out->cols != H || out->data == in->data || H % 8 || F % 8 || H > (1 << 20) ||
        F > (1 << 20) || ((uintptr_t)in->data % 16) || router->dtype != NS_DT_BF16 || router->rows != E ||
        router->cols != H) {
        cu_set_error(c, NS_ERR_INVALID,
                     "cuda moe_ffn: bad shapes (in [%lld,%lld], out [%lld,%lld], router [%lld,%lld] %s, expert ff %lld;"
                     " hidden and ff must be multiples of 8)",
                     (long long)T, (long long)H, (long long)out->rows, (long long)out->cols, (long long)router->rows,
                     (long long)router->cols, ns_dtype_name((ns_dtype)router->dtype), (long long)F);
        return -1;
    }
    /* BF16 experts, or block-quantized ones: each of the gate, up and
     * down stacks in one type, gate and up in the same (the GGUF loader
     * refuses other files at load, naming the tensors) */
    const bool quant = ns_dtype_is_quant((ns_dtype)experts[0].dtype);
    for (int i = 0; i < 3 * E; i++) {
        const ns_tensor *w = &experts[i];
        const bool down = i >= 2 * E;
        const ns_dtype want = quant ? (ns_dtype)experts[down ? 2 * E : 0].dtype : NS_DT_BF16;
        if (w->dtype != want || w->rows != (down ? H : F) || w->cols != (down ? F : H) ||
            ((uintptr_t)w->data % 16) || (quant && !cu_quant_check_shape(want, w->rows, w->cols))) {
            cu_set_error(c, quant ? NS_ERR_UNSUPPORTED : NS_ERR_INVALID,
                         "cuda moe_ffn: expert weight %d is %s [%lld,%lld]; expected %s [%lld,%lld] (experts are"
                         " BF16, or one block type per gate/up/down stack with gate and up alike, rows a multiple"
                         " of the block)",
                         i, ns_dtype_name((ns_dtype)w->dtype), (long long)w->rows, (long long)w->cols,
                         ns_dtype_name(want), (long long)(down ? H : F), (long long)(down ? F : H));
            return -1;
        }
    }
    if (T == 0) return -1;
    /* NS_CUDA_MOE_FUSE=0: decode routing in two launches (A/B, tests) */
    if (c->moe_fuse == CU_SW_UNSET) {
        const char *v = getenv("NS_CUDA_MOE_FUSE");
        c->moe_fuse = v && *v == '0' ? CU_SW_OFF : CU_SW_ON;
        /* NS_CUDA_MOE_GGEMV=1: decode batches through grouped GEMVs
         * instead of 16-row GEMM tiles (measured slower at batch 64:
         * 40.3 vs 31.6 ms/step; kept for A/B, tested) */
        v = getenv("NS_CUDA_MOE_GGEMV");
        c->moe_ggemv = v && *v == '1' ? CU_SW_ON : CU_SW_OFF;
        /* NS_CUDA_MOE_QGGEMV=0: quantized experts at a few rows per expert
         * through bf16 copies and 16-row tiles instead of grouped GEMVs on
         * the blocks (A/B; the GEMVs read ~1/4 of the bytes) */
        v = getenv("NS_CUDA_MOE_QGGEMV");
        c->moe_qggemv = v && *v == '0' ? CU_SW_OFF : CU_SW_ON;
        /* once per backend, outside any capture: the GEMMs' shared
         * memory (the 128-row shapes take 60 KB, above the default 48) */
        gemm_attr<1, 4, 1, 1, 2>(c);
        gemm_attr<1, 4, 1, 2, 1>(c);
        gemm_attr<2, 2, 2, 2, 2>(c);
        gemm_attr<2, 2, 2, 2, 1>(c);
        gemm_attr<4, 2, 2, 2, 2>(c);
        gemm_attr<4, 2, 2, 4, 1>(c);
        if (c->err_status != NS_OK) return -1;
    }
    const int32_t idx = moe_table(c, experts, E);
    if (idx < 0) return -1;
    const int64_t Tc = T < CU_MOE_CHUNK ? T : CU_MOE_CHUNK;
    if (!moe_reserve(c, Tc, K, E, H, F, quant)) return -1;
    return idx;
}

/* The BF16 copy of rows [r0, r0+n) of in: its valid shadow, else a
 * conversion into the scratch. */
static const bf16 *moe_x_bf(cu_impl *c, const ns_tensor *in, int64_t r0, int64_t n, bf16 *scratch) {
    const cu_shadow *s = cu_shadow_for(c, in->data);
    if (s && s->valid && s->bf && s->vrows == in->rows && s->vcols == in->cols) return s->bf + r0 * in->cols;
    cu_launch_f32_to_bf16(c, scratch, (const float *)in->data + r0 * in->cols, (size_t)(n * in->cols));
    return scratch;
}

/* Step 1: router logits and top k of Tc token rows x into w.ids / w.wts
 * (and, for the grouped path, w.counts). False on a launch error. */
static bool moe_route(cu_impl *c, const float *x, const bf16 *router, int Tc, int E, int K, bool norm, int H,
                      bool gemv, const moe_ws &w) {
    const dim3 rgrid((unsigned)((E + 7) / 8), (unsigned)((Tc + RT - 1) / RT));
    if (gemv && Tc <= RT && c->moe_fuse == CU_SW_ON) {
        cu_launch(c, k_moe_logits<true>, rgrid, dim3(256), 0, x, router, Tc, H, E, w.logits, (int32_t *)NULL, K,
                  (int)norm, w.ids, w.wts, w.done);
        return !CU_LAUNCHED(c, "moe router+top-k");
    }
    cu_launch(c, k_moe_logits<false>, rgrid, dim3(256), 0, x, router, Tc, H, E, w.logits,
              gemv ? (int32_t *)NULL : w.counts, K, (int)norm, (int32_t *)NULL, (float *)NULL, (int32_t *)NULL);
    if (CU_LAUNCHED(c, "moe router")) return false;
    cu_launch(c, k_moe_topk, dim3((unsigned)((Tc + 7) / 8)), dim3(256), 0, (const float *)w.logits, Tc, E, K,
              (int)norm, w.ids, w.wts, gemv ? (int32_t *)NULL : w.counts);
    return !CU_LAUNCHED(c, "moe top-k");
}

/* What cuda_quant.cu's expert kernels need of a quantized table and the
 * scratch (borrowed: the table and w own everything it points to). */
static cu_qmoe qmoe_of(const cu_moe_table &mt, int E, int K, int H, int F, const moe_ws &w) {
    cu_qmoe q;
    memset(&q, 0, sizeof q);
    q.tab = (const void *const *)mt.dev;
    for (int s = 0; s < 3; s++) q.dt[s] = mt.dt[s];
    q.E = E, q.K = K, q.H = H, q.F = F;
    q.xq = w.xq, q.xd = w.xd, q.xs = w.xs;
    return q;
}

static void moe_chunk(cu_impl *c, const cu_moe_table &mt, const bf16 *router, float *out, const ns_tensor *in,
                      int64_t r0, int Tc, int E, int K, bool norm, int H, int F, const moe_ws &w) {
    const float *x = (const float *)in->data + (size_t)r0 * H;
    const bf16 *const *tab = mt.dev;
    const cu_qmoe q = qmoe_of(mt, E, K, H, F, w); /* quantized experts: cuda_quant.cu's kernels */
    const int TK = Tc * K;
    const bool gemv = Tc <= CU_MOE_GEMV_MAX;
    if (!moe_route(c, x, router, Tc, E, K, norm, H, gemv, w)) return;
    if (gemv && mt.quant) {
        /* gathered GEMVs on the chosen experts' blocks into y, then the
         * combine in ascending expert order */
        if (!cu_quant_moe_gemv(c, q, x, Tc, w.ids, (float *)w.h, w.y)) return;
        cu_launch(c, k_moe_combine, dim3((unsigned)Tc), dim3(256), 0, out + (size_t)r0 * H, (const float *)w.y,
                  (const int32_t *)w.ids, (const float *)w.wts, (const int32_t *)NULL, K, H);
        CU_LAUNCHED(c, "moe combine");
        return;
    }
    if (gemv) {
        float *h = (float *)w.h;
        cu_launch(c, k_moe_gemv_gu, dim3((unsigned)((F + 15) / 16), (unsigned)TK), dim3(256), 0, x, tab,
                  (const int32_t *)w.ids, K, E, H, F, h);
        if (CU_LAUNCHED(c, "moe gemv gate/up")) return;
        cu_launch(c, k_moe_gemv_down, dim3((unsigned)((H + 7) / 8), (unsigned)Tc), dim3(256), 0, (const float *)h, tab,
                  (const int32_t *)w.ids, (const float *)w.wts, K, E, H, F, out + (size_t)r0 * H);
        CU_LAUNCHED(c, "moe gemv down+combine");
        return;
    }
    const int shape = gemm_shape(TK, E), bm = mg_bm[shape];
    cu_launch(c, k_moe_scan, dim3(1), dim3(1024), 0, w.counts, w.cursor, w.offs, w.tile_off, E, bm);
    if (CU_LAUNCHED(c, "moe scan")) return;
    cu_launch(c, k_moe_scatter, dim3((unsigned)((TK + 255) / 256)), dim3(256), 0, (const int32_t *)w.ids, w.cursor,
              w.rows, w.pos, TK);
    if (CU_LAUNCHED(c, "moe scatter")) return;
    if (mt.quant && shape == MG_SMALL && c->moe_qggemv == CU_SW_ON) {
        /* a few slots per expert: grouped GEMVs on the chosen experts'
         * blocks, each read once, then the combine through pos */
        if (!cu_quant_moe_grouped(c, q, x, TK, w.rows, w.offs, (float *)w.h, w.y)) return;
        cu_launch(c, k_moe_combine, dim3((unsigned)Tc), dim3(256), 0, out + (size_t)r0 * H, (const float *)w.y,
                  (const int32_t *)w.ids, (const float *)w.wts, (const int32_t *)w.pos, K, H);
        CU_LAUNCHED(c, "moe combine");
        return;
    }
    if (mt.quant) {
        /* the chosen experts to bf16 (the router's counts say which), then
         * the bf16 kernels below through the table of the copies */
        if (!cu_quant_moe_dequant(c, q, w.counts, w.deq, w.bftab)) return;
        tab = w.bftab;
    }
    if (shape == MG_SMALL && c->moe_ggemv == CU_SW_ON) {
        /* a few rows per expert: grouped GEMVs stream each weight row once */
        cu_launch(c, k_moe_ggemv_gu, dim3((unsigned)((F + 15) / 16), (unsigned)E), dim3(256), 0, x, tab,
                  (const int32_t *)w.offs, (const int32_t *)w.rows, K, E, H, F, TK, (float *)w.h);
        if (CU_LAUNCHED(c, "moe grouped gemv gate/up")) return;
        cu_launch(c, k_moe_ggemv_down, dim3((unsigned)((H + 15) / 16), (unsigned)E), dim3(256), 0,
                  (const float *)w.h, tab, (const int32_t *)w.offs, E, H, F, TK, w.y);
        if (CU_LAUNCHED(c, "moe grouped gemv down")) return;
        cu_launch(c, k_moe_combine, dim3((unsigned)Tc), dim3(256), 0, out + (size_t)r0 * H, (const float *)w.y,
                  (const int32_t *)w.ids, (const float *)w.wts, (const int32_t *)w.pos, K, H);
        CU_LAUNCHED(c, "moe combine");
        return;
    }
    const bf16 *xbf = moe_x_bf(c, in, r0, Tc, w.xbf);
    /* every expert has at most one partial tile: sum ceil(n_e / bm) <= TK / bm + E, and <= TK */
    int64_t max_tiles = (int64_t)TK / bm + E;
    if (max_tiles > TK) max_tiles = TK;
    if (max_tiles > 65535) { /* small tiles only below 16 E rows: <= 2 E <= 2048 */
        cu_set_error(c, NS_ERR_INTERNAL, "cuda moe_ffn: %lld tiles exceed the grid", (long long)max_tiles);
        return;
    }
    moe_gemm_args g1 = {};
    g1.a = xbf;
    g1.a_ld = H;
    g1.a_slot = w.rows;
    g1.top_k = K;
    g1.tab = tab;
    g1.w0 = 0;
    g1.w1 = E;
    g1.N = F;
    g1.Kd = H;
    g1.offs = w.offs;
    g1.tile_off = w.tile_off;
    g1.E = E;
    g1.rows = TK;
    g1.out_bf = (bf16 *)w.h;
    if (shape == MG_SMALL) gemm_launch<1, 4, 1, 1, 2>(c, g1, max_tiles, "moe grouped gemm gate/up");
    else if (shape == MG_MEDIUM) gemm_launch<2, 2, 2, 2, 2>(c, g1, max_tiles, "moe grouped gemm gate/up");
    else gemm_launch<4, 2, 2, 2, 2>(c, g1, max_tiles, "moe grouped gemm gate/up");
    if (c->err_status != NS_OK) return;
    moe_gemm_args g2 = g1;
    g2.a = (const bf16 *)w.h;
    g2.a_ld = F;
    g2.a_slot = NULL;
    g2.w0 = 2 * E;
    g2.w1 = -1;
    g2.N = H;
    g2.Kd = F;
    g2.out_bf = NULL;
    g2.out_f = w.y;
    if (shape == MG_SMALL) gemm_launch<1, 4, 1, 2, 1>(c, g2, max_tiles, "moe grouped gemm down");
    else if (shape == MG_MEDIUM) gemm_launch<2, 2, 2, 2, 1>(c, g2, max_tiles, "moe grouped gemm down");
    else gemm_launch<4, 2, 2, 4, 1>(c, g2, max_tiles, "moe grouped gemm down");
    if (c->err_status != NS_OK) return;
    cu_launch(c, k_moe_combine, dim3((unsigned)Tc), dim3(256), 0, out + (size_t)r0 * H, (const float *)w.y,
              (const int32_t *)w.ids, (const float *)w.wts, (const int32_t *)w.pos, K, H);
    CU_LAUNCHED(c, "moe combine");
}

/* Runs a recorded OP_MOE: a = out, b = in, c = router, i0 = experts,
 * i1 = top k, i2 = norm_topk, pad = table index (cu_moe_prepare). */
void cu_exec_moe(cu_impl *c, const cu_op *op) {
    const ns_tensor *out = &op->a, *in = &op->b, *router = &op->c;
    const int E = op->i0, K = op->i1, idx = op->pad;
    if (idx < 0 || idx >= c->n_moe_tables || c->moe_tables[idx].n_experts != E) {
        cu_set_error(c, NS_ERR_INTERNAL, "cuda moe_ffn: bad expert table %d", idx);
        return;
    }
    const int64_t T = in->rows, H = in->cols, Tc = T < CU_MOE_CHUNK ? T : CU_MOE_CHUNK;
    const cu_moe_table &mt = c->moe_tables[idx];
    const int64_t F = mt.ff;
    const moe_ws need = ws_layout(NULL, Tc, K, E, H, F, mt.quant);
    if (need.bytes > c->moe_ws_bytes) { /* cu_moe_prepare reserves it at submit: a bug if reached */
        if (c->capturing) c->capture_failed = true;
        else cu_set_error(c, NS_ERR_INTERNAL, "cuda moe_ffn: scratch not reserved");
        return;
    }
    const moe_ws w = ws_layout((uint8_t *)c->moe_ws, Tc, K, E, H, F, mt.quant);
    for (int64_t r0 = 0; r0 < T && c->err_status == NS_OK; r0 += Tc) {
        const int n = (int)(T - r0 < Tc ? T - r0 : Tc);
        moe_chunk(c, mt, (const bf16 *)router->data, (float *)out->data, in, r0, n, E, K,
                  op->i2 != 0, (int)H, (int)F, w);
    }
    cu_note_write(c, out);
}
