/* cuda_attn_fp8_reg.cu — decode attention over an FP8 (e4m3) pool on tensor
 * cores with the MMA operands built in registers straight from the codes
 * (`k_attn_decode_fp8_reg`, head dim 128, compute capability 9.0).
 *
 * Why (docs/cuda.md v29): k_attn_decode_mma_fp8 converts each staged tile
 * into a 16-bit tile in shared memory and reads it back with ldmatrix.
 * That round trip is a dependent chain per tile, and the 16-bit tiles
 * (34 KB) next to the raw stages keep it at two CTAs (eight warps) per SM,
 * too few to hide the chain: at 32k batch 1 it streamed ~1.5 TB/s, and
 * FP8 KV decoded no faster than bf16 although it reads half the bytes.
 * Here the tile never exists in 16 bits:
 * - Each warp owns 16 keys of every 64-key tile (as there) and fetches its
 *   K and V rows (16 x 128 codes each, inside one page) as two 2-D boxes
 *   of a tensor map over the pool, with the 128-byte swizzle, into its
 *   own ring of NST stages (one mbarrier per stage and warp).
 * - The MMA fragments come from plain 16-byte shared loads. The products
 *   are sums over dims (QK) and over keys (PV), so both orders are free:
 *   - S^T = K Q^T: lane (g, t) holds keys g and g + 8 of the warp's 16;
 *     it reads bytes 32 t .. 32 t + 31 of those rows and reads byte
 *     32 t + 4 kk + e as the k index {2t, 2t+1, 2t+8, 2t+9}[e] of k-block
 *     kk. q is loaded in the same order (dm_load_q's PERM).
 *   - O^T = V^T P^T: lane (g, t) needs keys 2t, 2t+1, 2t+8, 2t+9 (P^T's
 *     B fragment, as in dm_tile) and reads bytes 16 g .. 16 g + 15 of each
 *     of those rows; byte 16 g + 2 i (+1) is row g (g + 8) of dim block
 *     i. One byte_perm pairs the two keys' codes of a dim, one cvt turns
 *     the pair into the f16x2 the MMA takes; dm_finish's PERM writes the
 *     output dims back in memory order.
 *   With the swizzle every one of those loads is free of bank conflicts
 *   (the eight lanes of a quarter warp read eight different 16-byte
 *   columns).
 * - Shared memory is the raw stages only (16 KB per stage): three stages
 *   fit four CTAs per SM, sixteen warps to hide each other's chains.
 * - Scales, q pre-scale, V scale basis, softmax: as dm8_warp_loop (the
 *   page's K scale on the scores, its V scale on the probabilities; all
 *   powers of two, so the f16 products are exact).
 * Rows past the split's end arrive with whatever the slots hold; they
 * are zeroed in registers (a NaN code times P = 0 is NaN).
 * Same results as k_attn_decode_mma_fp8 up to fp32 summation order.
 */
#include <cuda.h> /* CUtensorMap (the encoder is fetched through the runtime: no -lcuda) */
#include <math.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_attn_dm.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

#define F8R_D 128              /* head dim: one K or V row = 128 codes = one swizzle row */
#define F8R_BOX (16 * F8R_D)   /* one warp's K (or V) rows of one tile */
#define F8R_STAGE (8 * F8R_BOX) /* four warps' K and V boxes */

__device__ __forceinline__ void f8r_cp_async4(float *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}

/* TMA: the 3-D box at (x, y, z) of tensor map m into shared memory at dst,
 * completing on mbarrier bar. Compute capability 9.0 (the only place the
 * caller selects this kernel). */
__device__ __forceinline__ void f8r_tma_3d(uint32_t dst, const void *m, int x, int y, int z, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
#else
    (void)dst, (void)m, (void)x, (void)y, (void)z, (void)bar;
    __trap();
#endif
}

/* Two e4m3 codes (the low 16 bits of w) -> f16x2 (exact: every e4m3 value
 * is an f16 value), the lower code in the lower half. */
__device__ __forceinline__ uint32_t f8r_cvt(uint32_t w) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* 16 bytes at chunk c (0..7) of row r (0..15) of a swizzled box. */
__device__ __forceinline__ uint4 f8r_ld(const uint8_t *box, int r, int c) {
    return *reinterpret_cast<const uint4 *>(box + r * F8R_D + ((c ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint32_t f8r_word(const uint4 &u, int j) {
    return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

/* One tile step of warp w on its K box Kw and V box Vw (16 keys from
 * key0; those >= k1 masked and zeroed). sk, po, pp: dm_tile's F16 step. */
__device__ __forceinline__ void f8r_tile(const uint8_t *Kw, const uint8_t *Vw, const uint32_t (&qh)[8][2],
                                         const uint32_t (&ql)[8][2], float (&o)[8][4], float &m_0, float &m_1,
                                         float &l_0, float &l_1, int key0, int k1, float sk, float po, float pp) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
    /* K rows g and g + 8, bytes 32 t .. 32 t + 31 */
    uint4 ka0 = f8r_ld(Kw, g, 2 * t), ka1 = f8r_ld(Kw, g, 2 * t + 1);
    uint4 kb0 = f8r_ld(Kw, g + 8, 2 * t), kb1 = f8r_ld(Kw, g + 8, 2 * t + 1);
    if (key0 + g >= k1) ka0 = ka1 = z4;
    if (key0 + g + 8 >= k1) kb0 = kb1 = z4;
    float sc[4] = {0.f, 0.f, 0.f, 0.f}, sl[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t wa = f8r_word(kk < 4 ? ka0 : ka1, kk & 3), wb = f8r_word(kk < 4 ? kb0 : kb1, kk & 3);
        const uint32_t a[4] = {f8r_cvt(wa), f8r_cvt(wb), f8r_cvt(wa >> 16), f8r_cvt(wb >> 16)};
        mma_16816<true>(sc, a, qh[kk][0], qh[kk][1]);
        mma_16816<true>(sl, a, ql[kk][0], ql[kk][1]);
    }
    /* V rows 2t, 2t + 1, 2t + 8, 2t + 9, bytes 16 g .. 16 g + 15: loaded
     * once the K codes are dead (all eight uint4 live at once cost 16
     * registers more than the 128 that four CTAs per SM allow: spills),
     * their latency under the softmax's shuffles */
    uint4 v0 = f8r_ld(Vw, 2 * t, g), v1 = f8r_ld(Vw, 2 * t + 1, g);
    uint4 v2 = f8r_ld(Vw, 2 * t + 8, g), v3 = f8r_ld(Vw, 2 * t + 9, g);
    if (key0 + 2 * t >= k1) v0 = z4;
    if (key0 + 2 * t + 1 >= k1) v1 = z4;
    if (key0 + 2 * t + 8 >= k1) v2 = z4;
    if (key0 + 2 * t + 9 >= k1) v3 = z4;
    uint32_t bh0, bh1, bl0, bl1;
    float ao0, ao1;
    dm_softmax<true>(sc, sl, m_0, m_1, l_0, l_1, key0 + g, k1, sk, po, pp, bh0, bh1, bl0, bl1, ao0, ao1);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        /* dims 16 g + 2 i (row g of block i) and + 1 (row g + 8) of keys
         * (2t, 2t + 1) and (2t + 8, 2t + 9): byte 2 i % 4 (+1) of word i / 2 */
        const unsigned sel = (i & 1) ? 0x7362u : 0x5140u;
        const uint32_t p01 = __byte_perm(f8r_word(v0, i >> 1), f8r_word(v1, i >> 1), sel);
        const uint32_t p23 = __byte_perm(f8r_word(v2, i >> 1), f8r_word(v3, i >> 1), sel);
        const uint32_t a[4] = {f8r_cvt(p01), f8r_cvt(p01 >> 16), f8r_cvt(p23), f8r_cvt(p23 >> 16)};
        o[i][0] *= ao0;
        o[i][1] *= ao1;
        o[i][2] *= ao0;
        o[i][3] *= ao1;
        mma_16816<true>(o[i], a, bh0, bh1);
        mma_16816<true>(o[i], a, bl0, bl1);
    }
}

/* Grid (splits, kv heads, decode rows), 128 threads; dynamic shared memory
 * NST stages of F8R_STAGE bytes (+1 KB for the 1024-byte alignment the
 * swizzle needs) and the stages' scales. seg_k / seg_v: the rows of this
 * layer's K / V segment of kv head 0 inside a page (in units of the
 * tensor map's rows: (layer * 2 + kv) * KVH * P). early: DM_EARLY_META
 * (the metadata is read before the PDL wait) and DM_EARLY_KV (with it: a
 * warp's first tiles whose page precedes the new token's page are copied
 * before the wait, as k_attn_decode_mma's; see below). */
template <int NST, int MINB>
__global__ __launch_bounds__(128, MINB) void k_attn_decode_fp8_reg(attn_params p, size_t ks_off, size_t vs_off,
                                                                   int seg_k, int seg_v, int early,
                                                                   const __grid_constant__ dm_tmap tm) {
    PDL_TRIGGER();
    const bool meta_early = (early & DM_EARLY_META) != 0;
    if (!meta_early) PDL_WAIT();
    extern __shared__ __align__(16) uint8_t f8r_raw[];
    uint8_t *dsm = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(f8r_raw) + 1023) & ~(uintptr_t)1023);
    float *Ksc = reinterpret_cast<float *>(dsm + NST * F8R_STAGE), *Vsc = Ksc + NST * 4; /* [stage][warp] */
    __shared__ __align__(8) uint64_t bars[NST * 4];                                        /* [stage][warp] */

    static_assert(DM_TK == CU_DEC_TILE, "splits start on whole tiles (dec_split_of)");
    const dec_split ds = dec_split_of(p);
    const int split = ds.split, kvh = ds.kvh, di = ds.di, nsp = ds.nsp, s = ds.s, L = ds.L, t = ds.t;
    const int k0 = ds.k0, k1 = ds.k1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0)
        for (int i = 0; i < NST; i++) dm_mbar_init((uint32_t)__cvta_generic_to_shared(&bars[i * 4 + warp]), 1);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();

    const int kw = k0 + 16 * warp;
    const int n_w = kw < k1 ? (k1 - kw + DM_TK - 1) / DM_TK : 0; /* tiles with keys of this warp */
    const bool issuer = lane < 2;                                 /* lane 0: K box, lane 1: V box */
    /* the issuing lane's constants (lane 0: K, lane 1: V), folded here so
     * that the loop keeps few registers for them (four CTAs per SM allow
     * 128 per thread) */
    const uint32_t box_dst = (uint32_t)__cvta_generic_to_shared(dsm) + (2 * warp + (lane & 1)) * F8R_BOX;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&bars[warp]);
    const int row0 = ((lane & 1) ? seg_v : seg_k) + kvh * p.P;
    const uint8_t *scale_src = p.kv + ((lane & 1) ? vs_off : ks_off) + (size_t)kvh * 4;
    float *scale_dst = ((lane & 1) ? Vsc : Ksc) + warp;
    int pg_next = issuer && n_w > 0 ? kv_page(p, s, kw) : 0;
    auto issue = [&](int it) {
        if (it < n_w && issuer) {
            const int st = it % NST, key = kw + it * DM_TK;
            const uint32_t bar = bar0 + st * 4 * 8;
            if (lane == 0) dm_mbar_expect(bar, 2u * F8R_BOX);
            const int slot = p.P_shift >= 0 ? key & (p.P - 1) : key % p.P;
            f8r_tma_3d(box_dst + st * F8R_STAGE, &tm, 0, row0 + slot, pg_next, bar);
            f8r_cp_async4(scale_dst + st * 4, scale_src + (size_t)pg_next * p.page_bytes);
        }
        pg_next = issuer && it + 1 < n_w ? kv_page(p, s, kw + (it + 1) * DM_TK) : 0;
        cp_async_commit();
    };
    /* The only key a kernel of this step stores before this one is the
     * decode token's, position L - 1, and its append may re-quantize the
     * rest of that page-head's codes and raise its scale (cu_fp8_append_row);
     * every other page was written by an earlier step, complete before
     * this step's first (anchored) launch. So a warp's first tiles whose
     * rows lie in an earlier page than L - 1's are copied before the PDL
     * wait (their latency overlaps the kernels before), the rest after
     * the wait and the proxy fence. */
    int n_pre = 0;
    if (meta_early && (early & DM_EARLY_KV)) {
        const int new_page = (L - 1) / p.P;
        while (n_pre < NST - 1 && (n_pre >= n_w || (kw + n_pre * DM_TK) / p.P < new_page)) issue(n_pre++);
    }
    if (meta_early) PDL_WAIT();
    /* the new token's codes (and a re-quantized page) were stored through
     * the generic proxy; the tensor copies read through the async proxy */
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    for (int j = n_pre; j < NST - 1; j++) issue(j);

    uint32_t qh[8][2], ql[8][2];
    const float qun = dm_load_q<F8R_D, true, true>(p, t, kvh * p.G, p.G, qh, ql);
    float o[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;

    float vbase = 0.f; /* the V scale basis (dm8_vbasis) */
    for (int it = 0; it < n_w; it++) {
        const int st = it % NST;
        __syncwarp(); /* every lane is done with stage (it + NST - 1) % NST = (it - 1) % NST */
        issue(it + NST - 1);
        dm_mbar_wait((uint32_t)__cvta_generic_to_shared(&bars[st * 4 + warp]), (it / NST) & 1);
        cp_async_wait<NST - 1>(); /* lanes 0-1: tile it's scales */
        __syncwarp();
        float po, pp;
        dm8_vbasis(Vsc[st * 4 + warp], vbase, po, pp);
        const uint8_t *box = dsm + st * F8R_STAGE + 2 * warp * F8R_BOX;
        f8r_tile(box, box + F8R_BOX, qh, ql, o, m_0, m_1, l_0, l_1, kw + it * DM_TK, k1, Ksc[st * 4 + warp] * qun, po,
                 pp);
    }
    cp_async_wait<0>();
    dm8_vbasis_end<8>(o, vbase);
    dm_finish<F8R_D, true>(p, dsm, o, m_0, m_1, l_0, l_1, di, kvh, t, split, nsp);
}

#define F8R_NST 3
#define F8R_MINB 4
static constexpr int f8r_smem = 1024 + F8R_NST * F8R_STAGE + 2 * F8R_NST * 4 * 4;
static_assert(F8R_NST * F8R_STAGE >= 4 * 8 * F8R_D * 4, "dm_finish reuses the stages for the warps' partial o");

/* The tensor map: the pool as [n_pages][segs * P rows][128 codes] (page
 * stride page_size_bytes, a multiple of 16; the scales after the codes
 * are outside every box), boxes of 16 rows with the 128-byte swizzle.
 * Cached per (pool address, pages, page bytes, rows per page). */
static bool f8r_tmap(cu_impl *c, const ns_kv_layout *l, dm_tmap *out) {
    const size_t rows = (size_t)l->n_layers * 2 * (size_t)l->n_kv_heads * (size_t)l->page_tokens;
    if (c->attn_tmap8_kv != c->kv || c->attn_tmap8_pages != l->n_pages || c->attn_tmap8_page_bytes != l->page_size_bytes ||
        c->attn_tmap8_rows != rows) {
        const PFN_cuTensorMapEncodeTiled_v12000 encode = cu_tmap_encoder();
        alignas(64) CUtensorMap m;
        memset(&m, 0, sizeof m);
        const cuuint64_t dims[3] = {F8R_D, (cuuint64_t)rows, (cuuint64_t)l->n_pages};
        const cuuint64_t strides[2] = {F8R_D, (cuuint64_t)l->page_size_bytes};
        const cuuint32_t box[3] = {F8R_D, 16, 1}, estr[3] = {1, 1, 1};
        c->attn_tmap8_ok = encode && encode(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)c->kv, dims, strides, box,
                                            estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
        static_assert(sizeof(CUtensorMap) == sizeof c->attn_tmap8, "opaque tensor map storage");
        memcpy(c->attn_tmap8, &m, sizeof m);
        c->attn_tmap8_kv = c->kv;
        c->attn_tmap8_pages = l->n_pages;
        c->attn_tmap8_page_bytes = l->page_size_bytes;
        c->attn_tmap8_rows = rows;
    }
    memcpy(out->w, c->attn_tmap8, sizeof out->w);
    return c->attn_tmap8_ok != 0;
}

bool cu_attn_decode_fp8_reg_ok(cu_impl *c, const ns_kv_layout *l, int G) {
    dm_tmap tm;
    return l->head_dim == F8R_D && G <= 8 && cu_attn_decode_load_mode(c) >= DM_LOAD_BULK && l->page_tokens % 16 == 0 &&
           DM_TK % l->page_tokens == 0 && l->page_size_bytes % 16 == 0 && (uintptr_t)c->kv % 16 == 0 &&
           l->n_pages > 0 && f8r_tmap(c, l, &tm);
}

int cu_attn_decode_fp8_reg_ctas(cu_impl *c) {
    if (c->fp8r_ctas == 0) {
        int n = 0;
        if (cudaFuncSetAttribute(k_attn_decode_fp8_reg<F8R_NST, F8R_MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 f8r_smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_decode_fp8_reg<F8R_NST, F8R_MINB>, 128,
                                                          f8r_smem) != cudaSuccess ||
            n < 1) {
            (void)cudaGetLastError();
            n = 1;
        }
        c->fp8r_ctas = n;
    }
    return c->fp8r_ctas;
}

void cu_attn_decode_fp8_reg(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                            int n_heads, float scale, int nsp, float *ws, int32_t *cnt) {
    const cu_meta *m = &c->meta;
    attn_params p;
    cu_attn_params_init(p, c, l, q, out, out_bf, n_heads, scale);
    p.ws = ws;
    p.cnt = cnt;
    dm_tmap tm;
    if (!f8r_tmap(c, l, &tm)) {
        cu_check(c, cudaErrorInvalidValue, "fp8 register-tile decode: no tensor map for this pool");
        return;
    }
    (void)cu_attn_decode_fp8_reg_ctas(c); /* sets the shared memory attribute */
    const int segs_per_kv = l->n_kv_heads * l->page_tokens;
    const int seg_k = (layer * 2 + 0) * segs_per_kv, seg_v = (layer * 2 + 1) * segs_per_kv;
    const size_t ks_off = ns_kv_scale_offset(l, layer, 0, 0), vs_off = ns_kv_scale_offset(l, layer, 1, 0);
    const dim3 grid((unsigned)nsp, (unsigned)l->n_kv_heads, (unsigned)m->n_dec);
    const int early = (cu_early(c, CU_EARLY_ATTN) ? DM_EARLY_META : 0) | (cu_early(c, CU_EARLY_ATTN_KV) ? DM_EARLY_KV : 0);
    cu_launch(c, k_attn_decode_fp8_reg<F8R_NST, F8R_MINB>, grid, dim3(128), (size_t)f8r_smem, p, ks_off, vs_off, seg_k,
              seg_v, early, tm);
    CU_LAUNCHED(c, "fp8 decode attention (register tiles)");
}
