/* cuda_attn_dm.cuh — what the bf16 attention kernels (cuda_attention.cu)
 * and the FP8 tensor-core decode (cuda_attn_fp8_mma.cu) share: the kernel
 * parameters over the paged pool (attn_params, kv_row / kv_page /
 * kv_row_at), the cp.async / ldmatrix / mma.sync primitives, and the
 * tensor-core decode's building blocks (DM_*: tile copy modes, the
 * 128-byte swizzle, mbarrier waits, the tile step dm_tile, q as the MMA
 * operand dm_load_q, the CTA's end dm_finish).
 * Included by the .cu files of src/backend/cuda only.
 *
 * Invariants
 * - A K/V tile is DM_TK keys; warp w of a decode CTA owns keys 16w..16w+15
 *   of every tile (dm_tile); the stages hold DM_ST tiles.
 * - The V row of a key is its K row plus (v_off - k_off): same page, same
 *   slot (kv_row).
 * - dm_mbar_wait traps after DM_SPIN_MAX polls instead of hanging the
 *   stream on a broken pipeline.
 */
#ifndef NS_CUDA_ATTN_DM_CUH
#define NS_CUDA_ATTN_DM_CUH

#include <string.h>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_attn_common.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define LOG2E 1.4426950408889634f

struct attn_params {
    const float *q;
    float *out;
    bf16 *out_bf;
    const uint8_t *kv;
    size_t page_bytes;
    size_t k_off, v_off;   /* bytes from a page's start to (layer, K|V, head 0, slot 0) */
    size_t head_bytes;     /* P * D * 2 */
    const int32_t *seq_start, *seq_len, *page_table, *tiles, *dec_seqs, *tok_seq;
    int pt_stride, P, H, KVH, G;
    int P_shift;           /* log2(P) when P is a power of two, else -1 */
    int q_stride;          /* floats per token row of q and out */
    float scale_log2;      /* softmax scale * log2(e) */
    float *ws;             /* split partials */
    int32_t *cnt;          /* per (dec seq, kv head): finished splits */
    int n_tokens;
};

/* Address of K (off = k_off) or V (off = v_off) of kv head kvh at
 * position pos of sequence s. The matching V row is always the K row plus
 * (v_off - k_off): same page, same slot. */
__device__ __forceinline__ const uint8_t *kv_row(const attn_params &p, int s, int pos, int kvh, size_t off) {
    int pi, slot;
    if (p.P_shift >= 0) {
        pi = pos >> p.P_shift;
        slot = pos & (p.P - 1);
    } else {
        pi = pos / p.P;
        slot = pos - pi * p.P;
    }
    const int page = p.page_table[(size_t)s * p.pt_stride + pi];
    return p.kv + (size_t)page * p.page_bytes + off + (size_t)kvh * p.head_bytes + (size_t)slot * (p.head_bytes / p.P);
}

/* Page id of position pos of sequence s, and the address of K (off =
 * k_off) or V (off = v_off) of kv head kvh at pos given that page id:
 * kv_row split in two, so a kernel can load the page id a tile ahead and
 * keep the page-table load off the chain between a tile's arrival and the
 * next tile's copy. */
__device__ __forceinline__ int kv_page(const attn_params &p, int s, int pos) {
    const int pi = p.P_shift >= 0 ? pos >> p.P_shift : pos / p.P;
    return p.page_table[(size_t)s * p.pt_stride + pi];
}
__device__ __forceinline__ const uint8_t *kv_row_at(const attn_params &p, int page, int pos, int kvh, size_t off) {
    const int slot = p.P_shift >= 0 ? pos & (p.P - 1) : pos % p.P;
    return p.kv + (size_t)page * p.page_bytes + off + (size_t)kvh * p.head_bytes + (size_t)slot * (p.head_bytes / p.P);
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* d += a b (m16n8k16, f32 accumulate) on bf16 operands, or F16 on f16
 * ones (the FP8 decode's tiles: an e4m3 code is exact in f16, one cvt per
 * two codes). */
template <bool F16 = false>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#define MMA_16816(T)                                                                                                  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "     \
                 "{%0,%1,%2,%3};\n"                                                                                  \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
    if constexpr (F16) MMA_16816("f16");
    else MMA_16816("bf16");
#undef MMA_16816
}

/* ------------------------------------------------- decode on tensor cores */

#define DM_TK 64    /* keys per tile (16 per warp) */
#define DM_ST 3     /* cp.async stages */

__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* x = hi + lo with hi, lo bf16: the pair carries ~16 mantissa bits, so two
 * bf16 MMAs reproduce an fp32 product with bf16-exact K/V to ~1e-5. F16:
 * the f16 pair (~22 bits; the values are pre-scaled into f16's normal
 * range, see dm_load_q and dm_tile). */
template <bool F16 = false>
__device__ __forceinline__ void split_hilo(float a, float b, uint32_t &hi, uint32_t &lo) {
    if constexpr (F16) {
        const __half2 h = __floats2half2_rn(a, b);
        const float2 hf = __half22float2(h);
        const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
        hi = *reinterpret_cast<const uint32_t *>(&h);
        lo = *reinterpret_cast<const uint32_t *>(&l);
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        const float2 hf = __bfloat1622float2(h);
        const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
        hi = *reinterpret_cast<const uint32_t *>(&h);
        lo = *reinterpret_cast<const uint32_t *>(&l);
    }
}

/* K/V tile loading of k_attn_decode_mma (NS_CUDA_DEC_LOAD, cuda.h):
 * DM_LOAD_CPASYNC  16-byte cp.async per thread and row chunk, page ids
 *                  looked up when the tile is issued (v13);
 * DM_LOAD_AHEAD    the same copies, but each thread's page ids for the
 *                  next tile are loaded while this one is issued, so the
 *                  dependent page-table load (an L2 round trip) no longer
 *                  sits between a tile's arrival and the next tile's
 *                  copies;
 * DM_LOAD_BULK     one cp.async.bulk (TMA, 1-D) per K/V row: thread r
 *                  copies K row r, thread 64 + r V row r of the tile (256
 *                  contiguous bytes at D = 128) into the same padded
 *                  layout, completing on a per-stage mbarrier; 128 copy
 *                  instructions per tile instead of 2048, no copy
 *                  registers held, page ids a tile ahead as above;
 * DM_LOAD_BULK_DEEP the bulk copies with the block barrier moved before
 *                  the wait: tile k + 2 is issued as soon as every warp is
 *                  done with tile k - 1, then tile k is waited for, so two
 *                  tiles (64 KB per CTA) stay in flight during the wait
 *                  instead of one (each thread's mbarrier wait makes the
 *                  copies visible to it; no barrier needed after it).
 * DM_LOAD_TMA      (head dim 128, pages of 8-64 keys dividing the tile)
 *                  whole pages by TMA through the pool's tensor map
 *                  (cu_attn_kv_tmap: rows of 128 bf16, 128-byte swizzle,
 *                  the Hopper prefill's map): 4 boxes per page (K, V x two
 *                  halves of 64 dims), spread over the four warps, instead
 *                  of 128 row copies that each warp issued one lane at a
 *                  time (the bulk copy takes uniform registers: ncu put
 *                  ~35% of the 32k kernel's stall samples in that loop,
 *                  v20); the tile lands unpadded and swizzled (dm_at);
 *                  rows past the end are zeroed after it lands.
 * (A copy mode that issued the first tiles before the PDL wait was tried
 * and removed: docs/cuda.md v16; it returned as DM_EARLY_KV, v25.) */
enum { DM_LOAD_CPASYNC = 0, DM_LOAD_AHEAD = 1, DM_LOAD_BULK = 2, DM_LOAD_BULK_DEEP = 3, DM_LOAD_TMA = 4 };
/* k_attn_decode_mma's early flags: the metadata chain, and the first K/V tiles of
 * splits that predate the step, before the PDL wait */
enum { DM_EARLY_META = 1, DM_EARLY_KV = 2 };

/* The pool's tensor map as a kernel parameter (an opaque 128-byte
 * CUtensorMap; zeros for the modes that do not use it). */
struct __align__(64) dm_tmap {
    uint64_t w[16];
};

/* Element (row, 16-byte chunk) of a K/V tile: padded rows of D + 8 (the
 * copy modes 0-3), or (SWZ, DM_LOAD_TMA) two unpadded halves of [DM_TK
 * rows][64 dims] with the 128-byte swizzle (chunk index XOR row mod 8;
 * base 1024-byte aligned up to a multiple of 8 rows). */
template <int D, bool SWZ>
__device__ __forceinline__ const bf16 *dm_at(const bf16 *base, int row, int chunk) {
    if constexpr (SWZ)
        return reinterpret_cast<const bf16 *>(reinterpret_cast<const uint8_t *>(base) + (chunk >> 3) * (DM_TK * 128) +
                                              row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
    else return base + row * (D + 8) + chunk * 8;
}
#define DM_SPIN_MAX (1u << 22)

__device__ __forceinline__ void dm_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Arrives on bar and adds bytes to its expected transaction count. The
 * stage's bulk copies may complete before this (the tx-count is signed);
 * the phase cannot finish before this single expected arrival. */
__device__ __forceinline__ void dm_mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* Bounded wait for the phase of the given parity: a broken pipeline traps
 * (the launch fails with an error) instead of hanging the stream. */
__device__ __forceinline__ void dm_mbar_wait(uint32_t bar, uint32_t parity) {
    for (uint32_t i = 0; i < DM_SPIN_MAX; i++) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
        if (done) return;
    }
    __trap();
}
__device__ __forceinline__ void dm_bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
    __trap(); /* the bulk variant is only selected on compute capability >= 9.0 */
#endif
}

/* The end of k_attn_decode_mma: the four warps' (o, m, l) merge in shared
 * memory (the K stages are reused; every copy has landed), then either the
 * output row (one split) or this split's partial, then the split merge.
 * PERM: o's rows are in the FP8 register-tile decode's dim order (row g of
 * block i is dim 16 g + 2 i, row g + 8 dim 16 g + 2 i + 1; see
 * cuda_attn_fp8_reg.cu) instead of dim 16 i + g (+ 8).
 * Contains block barriers: every thread calls it. */
template <int D, bool PERM = false>
__device__ __forceinline__ void dm_finish(const attn_params &p, uint8_t *dsm, float (&o)[D / 16][4], float m_0, float m_1,
                                          float l_0, float l_1, int di, int kvh, int t, int split, int nsp) {
    constexpr int NI = D / 16;
    __shared__ float wm[4][8], wl[4][8];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = p.G, h_first = kvh * G;
    /* per-thread l covers its two keys; the warp's l sums lanes of equal
     * lane % 4 (same heads) */
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        l_0 += __shfl_xor_sync(0xffffffffu, l_0, off);
        l_1 += __shfl_xor_sync(0xffffffffu, l_1, off);
    }
    __syncthreads(); /* the K stages are reused for the warps' partial O */
    float *wo = reinterpret_cast<float *>(dsm); /* [4][8][D] */
    if (lane < 4) {
        wm[warp][lane * 2] = m_0;
        wm[warp][lane * 2 + 1] = m_1;
        wl[warp][lane * 2] = l_0;
        wl[warp][lane * 2 + 1] = l_1;
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int d = PERM ? (D / 8) * (lane >> 2) + 2 * i : i * 16 + (lane >> 2), d2 = PERM ? d + 1 : d + 8;
        const int hd = (lane & 3) * 2;
        wo[(warp * 8 + hd) * D + d] = o[i][0];
        wo[(warp * 8 + hd + 1) * D + d] = o[i][1];
        wo[(warp * 8 + hd) * D + d2] = o[i][2];
        wo[(warp * 8 + hd + 1) * D + d2] = o[i][3];
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += 128) {
        const int j = i / D, d = i % D, h = h_first + j;
        const float M = fmaxf(fmaxf(wm[0][j], wm[1][j]), fmaxf(wm[2][j], wm[3][j]));
        float ov = 0.f, lv = 0.f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const float f = exp2f(wm[w][j] - M);
                ov += wo[(w * 8 + j) * D + d] * f;
                lv += wl[w][j] * f;
            }
        }
        if (nsp == 1) {
            const size_t off = (size_t)t * p.q_stride + (size_t)h * D + d;
            const float v = ov / lv;
            p.out[off] = v;
            if (p.out_bf) p.out_bf[off] = __float2bfloat16_rn(v);
        } else {
            float *wsp = p.ws + (((size_t)di * p.H + h) * nsp + split) * CU_WS_ROW(D);
            wsp[d] = ov;
            if (d == 0) {
                wsp[D] = M;
                wsp[D + 1] = lv;
            }
        }
    }
    if (nsp > 1) decode_merge<D>(p, di, kvh, t, nsp);
}

/* The softmax part of a tile step (dm_tile, and the FP8 register-tile
 * decode of cuda_attn_fp8_reg.cu): the warp's 16 x 8 scores S^T in sc
 * (hi-half products) and sl (lo-half products), keys key (rows g) and
 * key + 8 (rows g + 8) of which those >= k1 are masked; updates the
 * running maxima and sums, returns P^T as the B operand of the PV product
 * (bh/bl: bf16 or f16 hi + lo halves) and the factors ao0/ao1 that o must
 * be scaled by first. F16: sk, po, pp as in dm_tile. */
template <bool F16>
__device__ __forceinline__ void dm_softmax(float (&sc)[4], const float (&sl)[4], float &m_0, float &m_1, float &l_0,
                                           float &l_1, int key, int k1, float sk, float po, float pp, uint32_t &bh0,
                                           uint32_t &bh1, uint32_t &bl0, uint32_t &bl1, float &ao0, float &ao1) {
#pragma unroll
    for (int e = 0; e < 4; e++) sc[e] = F16 ? (sc[e] + sl[e]) * sk : sc[e] + sl[e];
    if (key >= k1) sc[0] = sc[1] = -INFINITY;
    if (key + 8 >= k1) sc[2] = sc[3] = -INFINITY;
    float mx0 = fmaxf(sc[0], sc[2]), mx1 = fmaxf(sc[1], sc[3]);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m_0, mx0), mn1 = fmaxf(m_1, mx1);
    /* a warp whose keys are all past the end has mn = -inf: use 0 as the
     * reference so exp2 gives 0, never NaN */
    const float r0 = mn0 == -INFINITY ? 0.f : mn0, r1 = mn1 == -INFINITY ? 0.f : mn1;
    const float a0 = exp2f(m_0 - r0), a1 = exp2f(m_1 - r1);
    m_0 = mn0;
    m_1 = mn1;
    const float p0 = exp2f(sc[0] - r0), p1 = exp2f(sc[1] - r1), p2 = exp2f(sc[2] - r0), p3 = exp2f(sc[3] - r1);
    l_0 = l_0 * a0 + p0 + p2;
    l_1 = l_1 * a1 + p1 + p3;
    uint32_t h01, l01, h23, l23;
    split_hilo<F16>(F16 ? p0 * pp : p0, F16 ? p1 * pp : p1, h01, l01);
    split_hilo<F16>(F16 ? p2 * pp : p2, F16 ? p3 * pp : p3, h23, l23);
    ao0 = F16 ? a0 * po : a0;
    ao1 = F16 ? a1 * po : a1;
    bh0 = movmatrix_t(h01);
    bh1 = movmatrix_t(h23);
    bl0 = movmatrix_t(l01);
    bl1 = movmatrix_t(l23);
}

/* The FP8 decodes' V scale basis (k_attn_decode_mma_fp8's bulk path and
 * k_attn_decode_fp8_reg): o holds o_true / (f 2^-14) for the basis f, the
 * largest V scale of the pages so far. A page with V scale vs > f raises
 * f (po = f_old / f <= 1 rescales o), a smaller one enters through p
 * (pp = 2^14 vs / f <= 2^14): all powers of two, so exact. vbase = 0: no
 * page with a nonzero scale yet (pp = 0: its V is all zeros). */
__device__ __forceinline__ void dm8_vbasis(float vs, float &vbase, float &po, float &pp) {
    po = 1.f;
    if (vs > vbase) {
        po = vbase > 0.f ? vbase / vs : 1.f;
        vbase = vs;
    }
    pp = vbase > 0.f ? 16384.f * (vs / vbase) : 0.f;
}
/* o back from the basis at the end: o_true = o f 2^-14. */
template <int NI>
__device__ __forceinline__ void dm8_vbasis_end(float (&o)[NI][4], float vbase) {
    const float fo = vbase * (1.f / 16384.f);
#pragma unroll
    for (int i = 0; i < NI; i++) o[i][0] *= fo, o[i][1] *= fo, o[i][2] *= fo, o[i][3] *= fo;
}

/* One K/V tile of k_attn_decode_mma for warp `warp`: S^T = K Q^T, online
 * softmax per head, O^T += V^T P^T (see the kernel's comment).
 * F16 (the FP8 pool, dm8_warp_loop): K, V and the q / p halves are f16,
 * and three scalars carry what f16 cannot: sk turns the products into
 * scores (the page's K scale times q's pre-scale), po rescales o when the
 * V scale basis grows, pp scales p into the f16 operand (2^14 times this
 * page's V scale over the basis). */
template <int D, bool F16 = false, bool SWZ = false>
__device__ __forceinline__ void dm_tile(const bf16 *Kt, const bf16 *Vt, const uint32_t (&qh)[D / 16][2],
                                        const uint32_t (&ql)[D / 16][2], float (&o)[D / 16][4], float &m_0, float &m_1,
                                        float &l_0, float &l_1, int key, int k1, float sk = 1.f, float po = 1.f,
                                        float pp = 1.f) {
    constexpr int NI = D / 16;
    const int lane = threadIdx.x & 31;
    /* hi and lo products in separate accumulators: two chains of NI
     * dependent MMAs instead of one of 2 NI */
    float sc[4] = {0.f, 0.f, 0.f, 0.f}, sl[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < NI; kk++) {
        uint32_t a[4];
        ldsm_x4(a, dm_at<D, SWZ>(Kt, lane & 15, kk * 2 + (lane >> 4)));
        mma_16816<F16>(sc, a, qh[kk][0], qh[kk][1]);
        mma_16816<F16>(sl, a, ql[kk][0], ql[kk][1]);
    }
    uint32_t bh0, bh1, bl0, bl1;
    float ao0, ao1;
    dm_softmax<F16>(sc, sl, m_0, m_1, l_0, l_1, key, k1, sk, po, pp, bh0, bh1, bl0, bl1, ao0, ao1);
#pragma unroll
    for (int i = 0; i < NI; i++) {
        o[i][0] *= ao0;
        o[i][1] *= ao1;
        o[i][2] *= ao0;
        o[i][3] *= ao1;
        uint32_t a[4];
        ldsm_x4_t(a, dm_at<D, SWZ>(Vt, (lane & 7) + ((lane >> 4) << 3), i * 2 + ((lane >> 3) & 1)));
        mma_16816<F16>(o[i], a, bh0, bh1);
        mma_16816<F16>(o[i], a, bl0, bl1);
    }
}

/* Rows of a K/V tile this thread copies in k_attn_decode_mma: the bulk
 * modes one (thread r: K row r, thread 64 + r: V row r); the cp.async
 * modes NPASS, CH = D / 8 threads per row with one 16-byte chunk each, so
 * a warp instruction reads whole rows (2 rows of 256 bytes at D = 128) and
 * every 32-byte sector is fetched once. */
template <int D, int LOAD>
struct dm_rows {
    static constexpr bool BULK = LOAD >= DM_LOAD_BULK;
    static constexpr int CH = D / 8, RPP = 128 / CH, NPASS = DM_TK / RPP;
    static constexpr int NR = BULK ? 1 : NPASS;
    static_assert(!BULK || DM_TK == 64, "bulk loads: one K or V row per thread");
    /* this thread's j-th row */
    static __device__ __forceinline__ int row(int j) {
        return BULK ? (int)(threadIdx.x & (DM_TK - 1)) : (int)(threadIdx.x / CH) + j * RPP;
    }
    /* the key (from the tile's first) whose page id this thread's j-th
     * copy needs: DM_LOAD_TMA copies page `lane` of the tile (pages of P) */
    static __device__ __forceinline__ int key(int j, int P) {
        return LOAD == DM_LOAD_TMA ? (int)(threadIdx.x & 31) * P : row(j);
    }
};

/* Issues the copies of K/V tile `it` of the split [k0, k1) of sequence s,
 * kv head kvh, into stage it % DM_ST (see DM_LOAD_*); pg holds this
 * thread's page ids of the tile (dm_rows) and, for the modes that load
 * them ahead, receives those of the next tile. */
template <int D, int LOAD>
__device__ __forceinline__ void dm_issue(const attn_params &p, int s, int kvh, int k0, int k1, int it, bf16 *Ks,
                                         bf16 *Vs, uint64_t *bars, int (&pg)[dm_rows<D, LOAD>::NR], size_t k_off,
                                         size_t v_off, const dm_tmap *tm) {
    using R = dm_rows<D, LOAD>;
    constexpr int LD = D + 8, CH = R::CH;
    constexpr bool BULK = R::BULK;
    const int tid = threadIdx.x, cc = tid % CH;
    const int kb = k0 + it * DM_TK, st = it % DM_ST;
    bf16 *kd = Ks + st * DM_TK * LD, *vd = Vs + st * DM_TK * LD;
    if constexpr (LOAD == DM_LOAD_TMA) {
        /* warp w copies part w (K dims 0-63, K 64-127, V 0-63, V 64-127)
         * of page `lane` of the tile; pages holding no key below k1 are
         * not copied (the kernel zeroes those rows after the wait) */
        const int P = p.P, lane = tid & 31, warp = tid >> 5;
        const int pages = (min(DM_TK, k1 - kb) + P - 1) / P;
        const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[st]);
        if (tid == 0) dm_mbar_expect(bar, (uint32_t)(pages * P * 4 * 128));
        if (lane < pages) {
            const bool is_v = warp >= 2;
            const int half = warp & 1;
            const long long y = (long long)pg[0] * (long long)(p.page_bytes / 256) +
                                (long long)(((is_v ? v_off : k_off) + (size_t)kvh * p.head_bytes) / 256);
            const uint32_t stage = (uint32_t)__cvta_generic_to_shared(is_v ? Vs : Ks) + st * (DM_TK * D * 2);
            cu_tma_2d(stage + half * (DM_TK * 128) + lane * P * 128, tm, half * 64, (int)y, bar);
        }
    } else if constexpr (BULK) {
        const int r = tid & (DM_TK - 1), nvalid = min(DM_TK, k1 - kb);
        const bool is_v = tid >= DM_TK;
        const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[st]);
        if (tid == 0) dm_mbar_expect(bar, (uint32_t)(nvalid * 2 * D * 2));
        bf16 *dst = (is_v ? vd : kd) + r * LD;
        if (r < nvalid) {
            dm_bulk_copy((uint32_t)__cvta_generic_to_shared(dst), kv_row_at(p, pg[0], kb + r, kvh, is_v ? v_off : k_off),
                         D * 2, bar);
        } else {
            /* rows past the end: zeros (stale bytes could be NaN, and
             * P = 0 times NaN in V is NaN); read after the tile's barrier
             * wait and a block barrier */
#pragma unroll
            for (int c = 0; c < CH; c++) reinterpret_cast<uint4 *>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
        }
    } else {
#pragma unroll
        for (int j = 0; j < R::NPASS; j++) {
            const int r = R::row(j);
            const bool ok = kb + r < k1;
            const uint8_t *kr = !ok                                 ? p.kv
                                : LOAD == DM_LOAD_CPASYNC && it > 0 ? kv_row(p, s, kb + r, kvh, k_off)
                                                                    : kv_row_at(p, pg[j], kb + r, kvh, k_off);
            const uint8_t *vr = ok ? kr + (v_off - k_off) : p.kv;
            cp_async16(kd + r * LD + cc * 8, kr + cc * 16, ok ? 16 : 0);
            cp_async16(vd + r * LD + cc * 8, vr + cc * 16, ok ? 16 : 0);
        }
    }
    if (LOAD != DM_LOAD_CPASYNC) {
        /* the next tile's page ids: the load completes while this tile and
         * the ones before it are computed */
#pragma unroll
        for (int j = 0; j < R::NR; j++) {
            const int key = kb + DM_TK + R::key(j, p.P);
            pg[j] = key < k1 ? kv_page(p, s, key) : 0;
        }
    }
}

/* Q^T of token row t as the B operand of k_attn_decode_mma, split into
 * bf16 hi + lo halves: head n = lane / 4 of the group starting at h_first,
 * dims (lane % 4) * 2 (+1), +8 for the second register; heads past G are
 * zero. Returns the factor the scores must be multiplied by: 1, or (F16,
 * the FP8 decode's f16 tile step) 2^(x - 14), which undoes the power of
 * two 2^(14 - x) the values were multiplied by first, x the binary
 * exponent of the warp's largest |value|: f16 has 5 exponent bits, so
 * nothing overflows, and the lo halves of small components stay far
 * above f16's subnormals (dm_tile's sk folds it in). PERM: the dims of
 * block kk are another order (see the line that picks d). */
template <int D, bool F16 = false, bool PERM = false>
__device__ __forceinline__ float dm_load_q(const attn_params &p, int t, int h_first, int G, uint32_t (&qh)[D / 16][2],
                                           uint32_t (&ql)[D / 16][2]) {
    const int lane = threadIdx.x & 31, n = lane >> 2;
    const float *qr = p.q + (size_t)t * p.q_stride + (size_t)(h_first + n) * D;
    float2 v[D / 16][2];
    float mx = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* PERM: the FP8 register-tile decode's dim order (cuda_attn_fp8_reg.cu):
             * lane % 4 = t holds dims 32 t + 4 kk .. + 3 of block kk */
            const int d = PERM ? (D / 4) * (lane & 3) + 4 * kk + 2 * r : kk * 16 + (lane & 3) * 2 + r * 8;
            v[kk][r] = make_float2(0.f, 0.f);
            if (n < G) v[kk][r] = *reinterpret_cast<const float2 *>(qr + d);
            v[kk][r].x *= p.scale_log2;
            v[kk][r].y *= p.scale_log2;
            if constexpr (F16) mx = fmaxf(mx, fmaxf(fabsf(v[kk][r].x), fabsf(v[kk][r].y)));
        }
    int x = 14; /* bf16: no pre-scale */
    if constexpr (F16) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        x = 0;
        if (mx > 0.f && mx <= 3.402823466e38f) frexpf(mx, &x); /* mx < 2^x */
    }
    const float up = ldexpf(1.f, 14 - x);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            split_hilo<F16>(F16 ? v[kk][r].x * up : v[kk][r].x, F16 ? v[kk][r].y * up : v[kk][r].y, qh[kk][r],
                            ql[kk][r]);
    return ldexpf(1.f, x - 14);
}

static inline void cu_attn_params_init(attn_params &p, const cu_impl *c, const ns_kv_layout *l, const float *q, float *out,
                             bf16 *out_bf, int n_heads, float scale) {
    const cu_meta *m = &c->meta;
    memset(&p, 0, sizeof p);
    p.q = q;
    p.out = out;
    p.out_bf = out_bf;
    p.kv = c->kv;
    p.page_bytes = l->page_size_bytes;
    p.seq_start = m->seq_start;
    p.seq_len = m->seq_len;
    p.page_table = m->page_table;
    p.tiles = m->tiles;
    p.dec_seqs = m->dec_seqs;
    p.tok_seq = m->tok_seq;
    p.pt_stride = m->pt_stride;
    p.P = l->page_tokens;
    p.P_shift = -1;
    for (int b = 0; b < 31; b++)
        if ((1 << b) == p.P) p.P_shift = b;
    p.H = n_heads;
    p.KVH = l->n_kv_heads;
    p.G = n_heads / l->n_kv_heads;
    p.q_stride = n_heads * l->head_dim;
    p.scale_log2 = scale * LOG2E;
    p.n_tokens = m->n_tokens;
}

/* The tensor-core decode's K/V copy mode for this device
 * (ns_cuda_set_attn_dec_load; bulk copies need compute capability 9.0,
 * below it modes 2-4 run as mode 1). Defined in cuda_attention.cu. */
int cu_attn_decode_load_mode(cu_impl *c);

#endif
