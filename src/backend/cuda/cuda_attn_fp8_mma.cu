/* cuda_attn_fp8_mma.cu — decode attention over an FP8 (e4m3) pool on
 * tensor cores: k_attn_decode_mma's pipeline (cuda_attn_dm.cuh) on tiles
 * converted from the codes. cuda_attn_fp8.cu chooses it (NS_CUDA_FP8_MMA)
 * for long contexts and runs the CUDA-core FP8 decode otherwise.
 */
#include <math.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_attn_dm.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

/* k_attn_decode_mma over an FP8 pool (cuda_attn_fp8.cu, cuda_kv_fp8.cuh):
 * the codes of each 64-key tile and their page-head scales stream through
 * DM_ST raw stages, then become a 16-bit tile that the bf16 kernel's tile
 * step (dm_tile), finish and split merge run on. Two ways:
 * - cp.async rows (any page size; the whole block): after a tile lands the
 *   block converts it into a bf16 tile, value = e4m3 * the row's scale
 *   (exact: the scales are powers of two and an e4m3 value has 4
 *   significant bits), between two block barriers;
 * - bulk copies (compute capability 9.0, pages of 16/32/64 keys): each
 *   warp streams, converts and computes its own 16 rows (dm8_warp_loop,
 *   no block barrier per tile) as f16 codes, one cvt per two codes (v20:
 *   the bf16 conversion was ~6 instructions per two codes and dominated
 *   the warp's chain); the page's K scale multiplies the scores and its V
 *   scale the probabilities, dm_tile's F16 step.
 * Half the HBM bytes of the bf16 pool. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

/* Raw codes and scales of tile `it` into stage it % DM_ST: rows of D
 * bytes, D / 16 threads per row (one 16-byte copy each), zero-filled past
 * k1 (codes and scales, so the converted rows are zeros). */
template <int D>
__device__ __forceinline__ void dm8_issue(const attn_params &p, int s, int kvh, int k0, int k1, int it, uint8_t *Kr,
                                          uint8_t *Vr, float *Ksc, float *Vsc, size_t k_off, size_t v_off,
                                          size_t ks_off, size_t vs_off) {
    constexpr int CHR = D / 16;
    const int tid = threadIdx.x, cc = tid % CHR, kb = k0 + it * DM_TK, st = it % DM_ST;
    for (int r = tid / CHR; r < DM_TK; r += 128 / CHR) {
        const bool ok = kb + r < k1;
        const int page = ok ? kv_page(p, s, kb + r) : 0;
        const uint8_t *kr = ok ? kv_row_at(p, page, kb + r, kvh, k_off) : p.kv;
        const uint8_t *vr = ok ? kr + (v_off - k_off) : p.kv;
        cp_async16(Kr + (st * DM_TK + r) * D + cc * 16, kr + cc * 16, ok ? 16 : 0);
        cp_async16(Vr + (st * DM_TK + r) * D + cc * 16, vr + cc * 16, ok ? 16 : 0);
        if (cc == 0) {
            const uint8_t *pg = p.kv + (size_t)page * p.page_bytes + (size_t)kvh * 4;
            cp_async4(Ksc + st * DM_TK + r, ok ? pg + ks_off : p.kv, ok ? 4 : 0);
            cp_async4(Vsc + st * DM_TK + r, ok ? pg + vs_off : p.kv, ok ? 4 : 0);
        }
    }
}

/* BULK variant of dm8_issue, one warp's part: a page keeps the codes of
 * one (layer, K|V, kv head) as P contiguous rows of D bytes, and with P a
 * multiple of 16 dividing the 64-key tile the 16 rows of warp w (keys
 * kb + 16w ..) lie in one page. So they are one segment of 16 * D codes
 * for K and one for V: lane 0 copies K, lane 1 V (cp.async.bulk on the
 * warp's own barrier of stage st), and the same lanes fetch the page's K
 * and V scale (cp.async, into Ksc/Vsc[st * 4 + w]). Each warp runs its own
 * ring of stages (dm8_warp_loop, which looks the page up a tile ahead:
 * waiting for the page-table load here stalled the whole warp), so no
 * block barrier orders the warps per tile (v20; v19 copied the whole tile
 * from four lanes of warp 0 and converted it between two block
 * barriers). A warp with no key of the tile below k1
 * issues nothing. Rows past k1 inside the segment arrive with whatever the
 * slots hold; dm8_convert_warp zeroes them. */
template <int D>
__device__ __forceinline__ void dm8_issue_warp(const attn_params &p, int page, int kvh, int kb, int k1, int st,
                                               uint8_t *Kr, uint8_t *Vr, float *Ksc, float *Vsc, uint64_t *bars,
                                               size_t k_off, size_t v_off, size_t ks_off, size_t vs_off) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, key = kb + 16 * warp;
    if (key >= k1 || lane > 1) return;
    const bool is_v = lane == 1;
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[st * 4 + warp]);
    if (lane == 0) dm_mbar_expect(bar, (uint32_t)(2 * 16 * D));
    uint8_t *dst = (is_v ? Vr : Kr) + (st * DM_TK + 16 * warp) * D;
    dm_bulk_copy((uint32_t)__cvta_generic_to_shared(dst), kv_row_at(p, page, key, kvh, is_v ? v_off : k_off),
                 (uint32_t)(16 * D), bar);
    const uint8_t *pg = p.kv + (size_t)page * p.page_bytes + (size_t)kvh * 4;
    cp_async4((is_v ? Vsc : Ksc) + st * 4 + warp, pg + (is_v ? vs_off : ks_off), 4);
}

/* 16 codes -> 16 values at dst (16-byte aligned): bf16 code * sc, or
 * (F16) the exact f16 codes, unscaled (the scales then act on scores and
 * probabilities, dm_tile's F16 step). */
template <bool F16>
__device__ __forceinline__ void dm8_cvt16(uint4 u, float sc, bf16 *dst) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    uint32_t o[8];
#pragma unroll
    for (int e = 0; e < 4; e++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const __half2_raw hr =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w[e] >> (16 * h)) & 0xffffu), __NV_E4M3);
            if constexpr (F16) {
                o[2 * e + h] = (uint32_t)hr.x | ((uint32_t)hr.y << 16);
            } else {
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
                o[2 * e + h] = pack_bf16(f.x * sc, f.y * sc);
            }
        }
    }
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* Warp w's 16 rows of stage st -> rows 16w.. of the f16 tile (padded to
 * LD; typed bf16 * for the shared tile step, the bits are f16 codes, see
 * dm8_cvt16); rows r >= nvalid become zeros (a free slot's codes could
 * be NaN, and P = 0 times NaN in V is NaN). */
template <int D>
__device__ __forceinline__ void dm8_convert_warp(const uint8_t *Kr, const uint8_t *Vr, int st, bf16 *Kb, bf16 *Vb,
                                                 int nvalid) {
    constexpr int LD = D + 8, CHR = D / 16, NC = 2 * 16 * CHR / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* all loads first, then the conversions (a branch per chunk for the
     * zero rows kept each load's latency in the chain: ncu, v20) */
    uint4 u[NC];
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const int c = lane + 32 * j;
        const bool is_v = c >= 16 * CHR;
        const int cr = is_v ? c - 16 * CHR : c;
        u[j] = *reinterpret_cast<const uint4 *>((is_v ? Vr : Kr) + (st * DM_TK + 16 * warp + cr / CHR) * D +
                                                (cr % CHR) * 16);
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const int c = lane + 32 * j;
        const bool is_v = c >= 16 * CHR;
        const int cr = is_v ? c - 16 * CHR : c;
        if (cr / CHR >= nvalid) u[j] = make_uint4(0u, 0u, 0u, 0u); /* e4m3 0x00 is +0 */
        dm8_cvt16<true>(u[j], 1.f, (is_v ? Vb : Kb) + (16 * warp + cr / CHR) * LD + (cr % CHR) * 16);
    }
}

/* Stage st's codes -> the bf16 tile (rows padded to LD), value * the
 * row's scale (the cp.async path, all threads of the block). */
template <int D>
__device__ __forceinline__ void dm8_convert(const uint8_t *Kr, const uint8_t *Vr, const float *Ksc, const float *Vsc,
                                            int st, bf16 *Kb, bf16 *Vb) {
    constexpr int LD = D + 8, CHR = D / 16;
    for (int c = threadIdx.x; c < 2 * DM_TK * CHR; c += 128) {
        const bool is_v = c >= DM_TK * CHR;
        const int cr = is_v ? c - DM_TK * CHR : c, r = cr / CHR, cc = cr % CHR;
        const uint4 u = *reinterpret_cast<const uint4 *>((is_v ? Vr : Kr) + (st * DM_TK + r) * D + cc * 16);
        dm8_cvt16<false>(u, (is_v ? Vsc : Ksc)[st * DM_TK + r], (is_v ? Vb : Kb) + r * LD + cc * 16);
    }
}

/* BULK: the main loop of k_attn_decode_mma_fp8 per warp (dm8_issue_warp),
 * NST raw stages: tile it + NST - 1 is issued into the stage the warp
 * converted at it - 1, then the warp waits for tile it on its own barrier,
 * converts its 16 rows and runs the tile step on them. Only __syncwarp
 * between the phases. */
template <int D, int NST>
__device__ __forceinline__ void dm8_warp_loop(const attn_params &p, int s, int kvh, int k0, int k1, uint8_t *dsm,
                                              uint64_t *bars, size_t k_off, size_t v_off, size_t ks_off,
                                              size_t vs_off, const uint32_t (&qh)[D / 16][2],
                                              const uint32_t (&ql)[D / 16][2], float qun, float (&o)[D / 16][4],
                                              float &m_0, float &m_1, float &l_0, float &l_1) {
    constexpr int LD = D + 8;
    bf16 *Kb = reinterpret_cast<bf16 *>(dsm), *Vb = Kb + DM_TK * LD;
    uint8_t *Kr = reinterpret_cast<uint8_t *>(Vb + DM_TK * LD), *Vr = Kr + NST * DM_TK * D;
    float *Ksc = reinterpret_cast<float *>(Vr + NST * DM_TK * D), *Vsc = Ksc + NST * DM_TK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = k0 + 16 * warp;
    /* tiles in which this warp has keys below k1 */
    const int n_w = kw < k1 ? (k1 - kw + DM_TK - 1) / DM_TK : 0;
    float vbase = 0.f; /* the V scale basis (0: every V page so far all zeros) */
    /* page of this warp's rows in the next tile to issue (lanes 0-1 issue;
     * looked up one tile ahead so the copy never waits for the load) */
    const bool issuer = (threadIdx.x & 31) < 2;
    int pg_next = issuer && n_w > 0 ? kv_page(p, s, kw) : 0;
    auto issue = [&](int it) {
        if (it < n_w)
            dm8_issue_warp<D>(p, pg_next, kvh, k0 + it * DM_TK, k1, it % NST, Kr, Vr, Ksc, Vsc, bars, k_off, v_off,
                              ks_off, vs_off);
        pg_next = issuer && it + 1 < n_w ? kv_page(p, s, kw + (it + 1) * DM_TK) : 0;
    };
#pragma unroll
    for (int j = 0; j < NST - 1; j++) {
        issue(j);
        cp_async_commit();
    }
    for (int it = 0; it < n_w; it++) {
        const int st = it % NST;
        /* every lane is done with the tile step of it - 1 (its 16-bit rows)
         * and the conversion of it - 1 (stage (it + NST - 1) % NST) */
        __syncwarp();
        issue(it + NST - 1);
        cp_async_commit();
        dm_mbar_wait((uint32_t)__cvta_generic_to_shared(&bars[st * 4 + warp]), (it / NST) & 1);
        cp_async_wait<NST - 1>(); /* lanes 0-1: tile it's scales (NST - 1 newer groups may be pending) */
        __syncwarp();             /* ... visible to the whole warp */
        dm8_convert_warp<D>(Kr, Vr, st, Kb, Vb, min(16, k1 - (kw + it * DM_TK)));
        float po, pp;
        dm8_vbasis(Vsc[st * 4 + warp], vbase, po, pp);
        __syncwarp();
        dm_tile<D, true>(Kb + warp * 16 * LD, Vb + warp * 16 * LD, qh, ql, o, m_0, m_1, l_0, l_1,
                         kw + it * DM_TK + (lane >> 2), k1, Ksc[st * 4 + warp] * qun, po, pp);
    }
    cp_async_wait<0>();
    dm8_vbasis_end<D / 16>(o, vbase);
}

template <int D, bool BULK, int NST>
__global__ __launch_bounds__(128, 2) void k_attn_decode_mma_fp8(attn_params p, size_t k_off, size_t v_off,
                                                                 size_t ks_off, size_t vs_off) {
    static_assert(BULK || NST == DM_ST, "the cp.async path streams through DM_ST stages");
    PDL_ENTRY();
    constexpr int LD = D + 8, NI = D / 16;
    extern __shared__ __align__(16) uint8_t dsm[];
    bf16 *Kb = reinterpret_cast<bf16 *>(dsm);                  /* [DM_TK][LD] */
    bf16 *Vb = Kb + DM_TK * LD;                                /* [DM_TK][LD] */
    uint8_t *Kr = reinterpret_cast<uint8_t *>(Vb + DM_TK * LD); /* [NST][DM_TK][D] codes */
    uint8_t *Vr = Kr + NST * DM_TK * D;
    float *Ksc = reinterpret_cast<float *>(Vr + NST * DM_TK * D); /* [NST][DM_TK] */
    float *Vsc = Ksc + NST * DM_TK;

    static_assert(DM_TK == CU_DEC_TILE, "splits start on whole tiles (dec_split_of)");
    const dec_split ds = dec_split_of(p);
    const int split = ds.split, kvh = ds.kvh, di = ds.di, nsp = ds.nsp, s = ds.s, t = ds.t;
    const int k0 = ds.k0, k1 = ds.k1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_tiles = k1 > k0 ? (k1 - k0 + DM_TK - 1) / DM_TK : 0;
    __shared__ __align__(8) uint64_t bars[NST * 4]; /* BULK: [stage][warp] "full" barriers of the codes */
    if constexpr (BULK) {
        /* the new token's codes were stored through the generic proxy, the
         * bulk copies read through the async proxy (see k_attn_decode_mma) */
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        if (lane == 0)
            for (int i = 0; i < NST; i++) dm_mbar_init((uint32_t)__cvta_generic_to_shared(&bars[i * 4 + warp]), 1);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp(); /* the warp's barriers initialised before its copies and waits */
    }
    auto issue = [&](int it) { dm8_issue<D>(p, s, kvh, k0, k1, it, Kr, Vr, Ksc, Vsc, k_off, v_off, ks_off, vs_off); };
    if (!BULK) {
        if (n_tiles > 0) issue(0);
        cp_async_commit();
        if (n_tiles > 1) issue(1);
        cp_async_commit();
    }

    uint32_t qh[NI][2], ql[NI][2];
    /* BULK: the f16 tile step; qun undoes q's pre-scale (dm_load_q) */
    const float qun = dm_load_q<D, BULK>(p, t, kvh * p.G, p.G, qh, ql);
    float o[NI][4];
#pragma unroll
    for (int i = 0; i < NI; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;

    if constexpr (BULK) {
        dm8_warp_loop<D, NST>(p, s, kvh, k0, k1, dsm, bars, k_off, v_off, ks_off, vs_off, qh, ql, qun, o, m_0, m_1, l_0,
                         l_1);
    } else {
        for (int it = 0; it < n_tiles; it++) {
            cp_async_wait<1>();
            __syncthreads(); /* tile it landed; every warp is done with the bf16 tile of it - 1 */
            if (it + 2 < n_tiles) issue(it + 2);
            cp_async_commit();
            dm8_convert<D>(Kr, Vr, Ksc, Vsc, it % DM_ST, Kb, Vb);
            __syncthreads();
            dm_tile<D>(Kb + warp * 16 * LD, Vb + warp * 16 * LD, qh, ql, o, m_0, m_1, l_0, l_1,
                       k0 + it * DM_TK + warp * 16 + (lane >> 2), k1);
        }
        cp_async_wait<0>();
    }
    dm_finish<D>(p, dsm, o, m_0, m_1, l_0, l_1, di, kvh, t, split, nsp);
}

template <int D, bool BULK, int NST>
static void launch_decode_mma_fp8(cu_impl *c, const attn_params &p, dim3 grid, size_t ks_off, size_t vs_off) {
    static bool attr_done = false;
    const int smem = 2 * DM_TK * (D + 8) * 2 + 2 * NST * DM_TK * D + 2 * NST * DM_TK * 4;
    if (!attr_done) {
        if (cu_check(c,
                     cudaFuncSetAttribute(k_attn_decode_mma_fp8<D, BULK, NST>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "fp8 decode mma smem attribute"))
            return;
        attr_done = true;
    }
    cu_launch(c, k_attn_decode_mma_fp8<D, BULK, NST>, grid, dim3(128), (size_t)smem, p, p.k_off, p.v_off, ks_off,
              vs_off);
    CU_LAUNCHED(c, "fp8 decode attention (tensor cores)");
}

/* The fields of attn_params every decode/prefill launch fills the same way
 * from the step's metadata and the pool's geometry (the rest is zeroed):
 * the caller adds its element layout (head_bytes, k_off, v_off) and its
 * workspace. */

bool cu_attn_decode_mma_fp8_ok(int head_dim, int G) { return (head_dim == 64 || head_dim == 128) && G <= 8; }

/* Whether the FP8 tensor-core decode can fetch layer `layer` by page
 * segments, one bulk copy per warp and tile: compute capability 9.0 (and
 * the bf16 decode's copy mode a bulk one), pages of 16, 32 or 64 keys,
 * 16-byte aligned segments. Otherwise it copies rows by 16-byte cp.async. */
bool cu_attn_decode_fp8_bulk_ok(cu_impl *c, const ns_kv_layout *l, int layer) {
    const size_t seg = (size_t)l->page_tokens * l->head_dim; /* 1-byte codes */
    return cu_attn_decode_load_mode(c) >= DM_LOAD_BULK && DM_TK % l->page_tokens == 0 && l->page_tokens % 16 == 0 &&
           seg % 16 == 0 && l->page_size_bytes % 16 == 0 && ns_kv_offset(l, layer, 0, 0, 0) % 16 == 0 &&
           ns_kv_offset(l, layer, 1, 0, 0) % 16 == 0;
}

void cu_attn_decode_mma_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                            int n_heads, float scale, int nsp, float *ws, int32_t *cnt, bool bulk) {
    const cu_meta *m = &c->meta;
    const int D = l->head_dim;
    attn_params p;
    cu_attn_params_init(p, c, l, q, out, out_bf, n_heads, scale);
    p.head_bytes = (size_t)l->page_tokens * D; /* 1-byte codes: kv_row's slot stride is head_bytes / P = D */
    p.k_off = ns_kv_offset(l, layer, 0, 0, 0);
    p.v_off = ns_kv_offset(l, layer, 1, 0, 0);
    p.ws = ws;
    p.cnt = cnt;
    const dim3 grid((unsigned)nsp, (unsigned)l->n_kv_heads, (unsigned)m->n_dec);
    const size_t ks_off = ns_kv_scale_offset(l, layer, 0, 0), vs_off = ns_kv_scale_offset(l, layer, 1, 0);
    /* Raw stages of the bulk path (docs/cuda.md v20, runs J and O): three
     * keep two tiles in flight per warp and fit two CTAs per SM, two fit
     * three. Four measured slower (32k batch 1: 6.02 against 5.96 ms);
     * two lose where the grid is one wave at two per SM (32k batch 1,
     * 256 CTAs: 6.20 against 5.80) and win where it is many (batch 8,
     * 2048 CTAs: 14.08 against 15.53). So two stages once the grid
     * exceeds two CTAs per SM; NS_CUDA_FP8_STAGES=2|3 (read at backend
     * creation) forces either. A function of the grid, which the graph
     * key fixes. */
    const int forced = c->fp8_stages;
    const unsigned ctas = grid.x * grid.y * grid.z;
    const bool st2 = forced == 2 || (forced == 0 && ctas > 2u * (unsigned)c->n_sm);
    if (D == 64 && bulk) launch_decode_mma_fp8<64, true, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 64) launch_decode_mma_fp8<64, false, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 128 && bulk && st2) launch_decode_mma_fp8<128, true, 2>(c, p, grid, ks_off, vs_off);
    else if (D == 128 && bulk) launch_decode_mma_fp8<128, true, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 128) launch_decode_mma_fp8<128, false, DM_ST>(c, p, grid, ks_off, vs_off);
    else cu_check(c, cudaErrorInvalidValue, "fp8 decode mma: head_dim must be 64 or 128");
}
