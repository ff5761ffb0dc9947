/* cuda_attention.cu — causal paged attention over a ragged batch.
 *
 * Three kernels, chosen per sequence by set_batch's lists (on Hopper,
 * prefill of head dim 128 runs cuda_attn_sm90.cu's kernel instead, and
 * long or batched decode the tensor-core kernel k_attn_decode_mma, which
 * by default fetches each K/V row with one cp.async.bulk):
 * - prefill (sequences with > 1 new token): flash-attention-2 style. A CTA
 *   of 4 warps owns 64 query rows of one head of one sequence (the tile
 *   list holds (sequence, first row) pairs, so sequences of any lengths
 *   share one launch). K/V tiles of 64 keys are gathered from the pages
 *   with cp.async into padded shared memory (double buffered), S = QK^T
 *   and O += PV run on bf16 tensor cores (mma.sync m16n8k16, fp32
 *   accumulate) with an online softmax in registers (exp2 domain).
 *   Head dims 16/32/64/128; others use a simple warp-per-row kernel.
 * - decode (sequences with exactly 1 new token): flash-decoding. A CTA
 *   owns (split, kv head, sequence) and all query heads of that kv group,
 *   so each K/V byte is read once per group; the sequence is cut into
 *   n_splits ranges (chosen by set_batch from the batch shape) whose
 *   partial (o, m, l) the last CTA of the group to finish merges. Pure bandwidth: K rows are
 *   read 64 contiguous bytes per 4 lanes, V rows 256 contiguous bytes per
 *   warp.
 * Semantics (both): query at position p attends keys [0, p]; GQA head h
 * reads kv head h / (H / KVH); softmax in fp32; Q is rounded to bf16 for
 * the tensor-core path only, KV is bf16 in the pool.
 * The parameters, primitives and tensor-core decode building blocks are
 * in cuda_attn_dm.cuh, shared with the FP8 tensor-core decode
 * (cuda_attn_fp8_mma.cu).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_attn_dm.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

/* ============================================================ prefill */



#define PF_BM 64
#define PF_BN 64

/* 3 CTAs per SM (12 warps): shared memory is the two K/V buffers only
 * (68 KB at D=128); the Q tile is staged in K buffer 1 and moved to
 * registers before that buffer is first filled. */
template <int D>
__global__ __launch_bounds__(128, 3) void k_attn_prefill(attn_params p, size_t k_off, size_t v_off) {
    PDL_ENTRY();
    constexpr int LD = D + 8; /* padded row: 16 bytes of skew per row keeps ldmatrix conflict-free */
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    static_assert(PF_BM == PF_BN, "Q staging reuses a K buffer");
    extern __shared__ __align__(16) uint8_t smem_raw[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem_raw);
    bf16 *Vs = Ks + 2 * PF_BN * LD;
    bf16 *Qs = Ks + PF_BN * LD; /* aliases K buffer 1 until the Q fragments are in registers */

    const int tile = blockIdx.x, h = blockIdx.y;
    const int s = p.tiles[2 * tile], q0 = p.tiles[2 * tile + 1];
    const int t0 = p.seq_start[s], n = p.seq_start[s + 1] - t0, L = p.seq_len[s];
    const int rows = min(PF_BM, n - q0);
    const int pos0 = L - n + q0;     /* position of tile row 0 */
    const int n_keys = pos0 + rows;  /* keys [0, last row's position] */
    const int kvh = h / p.G;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* Q tile -> bf16 smem (rows past the sequence are zeros) */
    for (int i = tid; i < PF_BM * (D / 4); i += 128) {
        const int r = i / (D / 4), c4 = i % (D / 4);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < rows) v = *reinterpret_cast<const float4 *>(p.q + (size_t)(t0 + q0 + r) * p.q_stride + (size_t)h * D + c4 * 4);
        uint2 u;
        u.x = pack_bf16(v.x, v.y);
        u.y = pack_bf16(v.z, v.w);
        *reinterpret_cast<uint2 *>(Qs + r * LD + c4 * 4) = u;
    }

    /* two threads per key row, each copying half the row: one page
     * lookup per row and thread (address arithmetic was a large share of
     * the instructions when every 16-byte chunk looked its page up) */
    static_assert(PF_BN * 2 == 128, "two threads per K/V row");
    auto load_kv = [&](int kt, int buf) {
        bf16 *kd = Ks + buf * PF_BN * LD, *vd = Vs + buf * PF_BN * LD;
        const int r = tid >> 1, c0 = (tid & 1) * (CH / 2);
        const int key = kt * PF_BN + r;
        const bool ok = key < n_keys;
        const uint8_t *kr = ok ? kv_row(p, s, key, kvh, k_off) : p.kv;
        const uint8_t *vr = ok ? kr + (v_off - k_off) : p.kv;
#pragma unroll
        for (int ch = c0; ch < c0 + CH / 2; ch++) {
            cp_async16(kd + r * LD + ch * 8, kr + ch * 16, ok ? 16 : 0);
            cp_async16(vd + r * LD + ch * 8, vr + ch * 16, ok ? 16 : 0);
        }
        cp_async_commit();
    };

    const int nt = (n_keys + PF_BN - 1) / PF_BN;
    load_kv(0, 0);
    __syncthreads();

    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    __syncthreads(); /* K buffer 1 (the Q staging area) is refilled next */

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int rpos0 = pos0 + warp * 16 + (lane >> 2), rpos1 = rpos0 + 8;
    const int warp_min_pos = pos0 + warp * 16;

    for (int kt = 0; kt < nt; kt++) {
        if (kt + 1 < nt) {
            load_kv(kt + 1, (kt + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *Kt = Ks + (kt & 1) * PF_BN * LD, *Vt = Vs + (kt & 1) * PF_BN * LD;

        float sc[PF_BN / 8][4];
#pragma unroll
        for (int i = 0; i < PF_BN / 8; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int nb = 0; nb < PF_BN / 8; nb += 2) {
                uint32_t b[4];
                ldsm_x4(b, Kt + (nb * 8 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                mma_16816(sc[nb], qf[kk], b[0], b[1]);
                mma_16816(sc[nb + 1], qf[kk], b[2], b[3]);
            }
        }
        const int kbase = kt * PF_BN;
        const bool need_mask = kbase + PF_BN - 1 > warp_min_pos;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < PF_BN / 8; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = sc[nb][e] * p.scale_log2;
                if (need_mask) {
                    const int key = kbase + nb * 8 + (lane & 3) * 2 + (e & 1);
                    if (key > (e < 2 ? rpos0 : rpos1)) v = -INFINITY;
                }
                sc[nb][e] = v;
            }
            mx0 = fmaxf(mx0, fmaxf(sc[nb][0], sc[nb][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nb][2], sc[nb][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int nb = 0; nb < PF_BN / 8; nb++) {
            sc[nb][0] = exp2f(sc[nb][0] - mn0);
            sc[nb][1] = exp2f(sc[nb][1] - mn0);
            sc[nb][2] = exp2f(sc[nb][2] - mn1);
            sc[nb][3] = exp2f(sc[nb][3] - mn1);
            rs0 += sc[nb][0] + sc[nb][1];
            rs1 += sc[nb][2] + sc[nb][3];
        }
        l0 = l0 * a0 + rs0;
        l1 = l1 * a1 + rs1;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
#pragma unroll
        for (int kk = 0; kk < PF_BN / 16; kk++) {
            uint32_t a[4];
            a[0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
            a[1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
            a[2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            a[3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
            for (int nd = 0; nd < D / 8; nd += 2) {
                uint32_t b[4];
                ldsm_x4_t(b, Vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + nd * 8 + (lane >> 4) * 8);
                mma_16816(o[nd], a, b[0], b[1]);
                mma_16816(o[nd + 1], a, b[2], b[3]);
            }
        }
        __syncthreads(); /* this buffer is refilled two tiles later */
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
        const int col = h * D + nd * 8 + (lane & 3) * 2;
        if (r0 < rows) {
            size_t off = (size_t)(t0 + q0 + r0) * p.q_stride + col;
            float2 v = make_float2(o[nd][0] * i0, o[nd][1] * i0);
            *reinterpret_cast<float2 *>(p.out + off) = v;
            if (p.out_bf) *reinterpret_cast<uint32_t *>(p.out_bf + off) = pack_bf16(v.x, v.y);
        }
        if (r1 < rows) {
            size_t off = (size_t)(t0 + q0 + r1) * p.q_stride + col;
            float2 v = make_float2(o[nd][2] * i1, o[nd][3] * i1);
            *reinterpret_cast<float2 *>(p.out + off) = v;
            if (p.out_bf) *reinterpret_cast<uint32_t *>(p.out_bf + off) = pack_bf16(v.x, v.y);
        }
    }
}

/* Generic fallback: one warp per (token, head), for head dims the tensor
 * core kernel does not cover. Tokens of decode sequences are skipped (the
 * decode kernel owns them). */
__global__ void k_attn_rows(attn_params p, size_t k_off, size_t v_off, int D, int include_decode) {
    PDL_ENTRY();
    const int t = blockIdx.x, h = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (h >= p.H) return;
    const int s = p.tok_seq[t];
    const int n = p.seq_start[s + 1] - p.seq_start[s];
    if (n == 1 && !include_decode) return;
    const int pos = p.seq_len[s] - n + (t - p.seq_start[s]);
    const int kvh = h / p.G;
    float q[8], acc[8];
    for (int i = 0; i < 8; i++) {
        int d = lane + 32 * i;
        q[i] = d < D ? p.q[(size_t)t * p.q_stride + (size_t)h * D + d] * p.scale_log2 : 0.f;
        acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int key = 0; key <= pos; key++) {
        const bf16 *kr = reinterpret_cast<const bf16 *>(kv_row(p, s, key, kvh, k_off));
        const bf16 *vr = reinterpret_cast<const bf16 *>(kv_row(p, s, key, kvh, v_off));
        float d = 0.f;
        for (int i = 0; i < 8; i++) {
            int dd = lane + 32 * i;
            if (dd < D) d += q[i] * __bfloat162float(kr[dd]);
        }
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        const float mn = fmaxf(m, d), a = exp2f(m - mn), pr = exp2f(d - mn);
        l = l * a + pr;
        for (int i = 0; i < 8; i++) {
            int dd = lane + 32 * i;
            acc[i] = acc[i] * a + (dd < D ? pr * __bfloat162float(vr[dd]) : 0.f);
        }
        m = mn;
    }
    for (int i = 0; i < 8; i++) {
        int d = lane + 32 * i;
        if (d < D) {
            size_t off = (size_t)t * p.q_stride + (size_t)h * D + d;
            float v = acc[i] / l;
            p.out[off] = v;
            if (p.out_bf) p.out_bf[off] = __float2bfloat16_rn(v);
        }
    }
}

/* ============================================================= decode */

#define DC_TK 64 /* keys per tile staged in shared memory */

template <int DPL>
__device__ __forceinline__ void load_v(const bf16 *src, float v[DPL]) {
    if constexpr (DPL == 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(src);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else if constexpr (DPL == 4) {
        uint2 u = *reinterpret_cast<const uint2 *>(src);
        v[0] = __uint_as_float(u.x << 16);
        v[1] = __uint_as_float(u.x & 0xffff0000u);
        v[2] = __uint_as_float(u.y << 16);
        v[3] = __uint_as_float(u.y & 0xffff0000u);
    } else if constexpr (DPL == 2) {
        uint32_t u = *reinterpret_cast<const uint32_t *>(src);
        v[0] = __uint_as_float(u << 16);
        v[1] = __uint_as_float(u & 0xffff0000u);
    } else {
        v[0] = __bfloat162float(src[0]);
    }
}

/* K/V tiles of DC_TK keys are gathered from the pages into shared memory
 * with cp.async, two stages deep: every load of a tile is in flight at
 * once and the next tile loads while this one is computed, so a CTA waits
 * for memory about once per tile instead of once per key group. */
template <int D, int GB>
__global__ __launch_bounds__(128) void k_attn_decode(attn_params p, size_t k_off, size_t v_off, int early) {
    /* early: the batch metadata (sequence, length, page table) comes from
     * set_batch's uploads, never from an earlier kernel, so its chain of
     * dependent loads runs before the PDL wait, overlapping the previous
     * kernel; only q and the K/V rows wait. */
    PDL_TRIGGER();
    if (!early) PDL_WAIT();
    constexpr int TPK = (D / 8) >= 4 ? 4 : (D / 8); /* threads per key in the QK phase */
    constexpr int CPT = (D / 8) / TPK;              /* 16-byte chunks per thread per key */
    constexpr int KPP = 128 / TPK;                  /* keys per pass */
    constexpr int DPL = D >= 32 ? D / 32 : 1;       /* dims per lane in the PV phase */
    constexpr int CH = D / 8;                       /* 16-byte chunks per row */
    extern __shared__ __align__(16) uint8_t dsm[];
    bf16 *Kst = reinterpret_cast<bf16 *>(dsm);      /* [2][DC_TK][D] */
    bf16 *Vst = Kst + 2 * DC_TK * D;                /* [2][DC_TK][D] */
    __shared__ __align__(16) float qs[GB][D];
    __shared__ float sc[GB][DC_TK];
    __shared__ float ms[GB], ls[GB], al[GB];
    __shared__ float red[4][GB][D];

    static_assert(DC_TK == CU_DEC_TILE, "splits start on whole tiles (dec_split_of)");
    const dec_split ds = dec_split_of(p);
    const int split = ds.split, kvh = ds.kvh, di = ds.di, nsp = ds.nsp, s = ds.s, t = ds.t;
    const int k0 = ds.k0, k1 = ds.k1;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_tiles = k1 > k0 ? (k1 - k0 + DC_TK - 1) / DC_TK : 0;

    static_assert(DC_TK * 2 == 128, "two threads per K/V row");
    /* this thread's K row of the first tile (every head group starts there) */
    const uint8_t *kr_first = k0 + (tid >> 1) < k1 ? kv_row(p, s, k0 + (tid >> 1), kvh, k_off) : p.kv;
    if (early) PDL_WAIT();
    auto issue = [&](int it, int buf) {
        const int kb = k0 + it * DC_TK;
        bf16 *kd = Kst + buf * DC_TK * D, *vd = Vst + buf * DC_TK * D;
        const int r = tid >> 1, c0 = (tid & 1) * (CH / 2);
        const bool ok = kb + r < k1;
        const uint8_t *kr = !ok ? p.kv : it == 0 ? kr_first : kv_row(p, s, kb + r, kvh, k_off);
        const uint8_t *vr = ok ? kr + (v_off - k_off) : p.kv;
#pragma unroll
        for (int ch = c0; ch < c0 + CH / 2; ch++) {
            cp_async16(kd + r * D + ch * 8, kr + ch * 16, ok ? 16 : 0);
            cp_async16(vd + r * D + ch * 8, vr + ch * 16, ok ? 16 : 0);
        }
        cp_async_commit();
    };

    for (int hg = 0; hg < p.G / GB; hg++) {
        const int h_first = kvh * p.G + hg * GB;
        if (n_tiles > 0) issue(0, 0);
        for (int i = tid; i < GB * D; i += 128) {
            const int j = i / D, d = i % D;
            qs[j][d] = p.q[(size_t)t * p.q_stride + (size_t)(h_first + j) * D + d] * p.scale_log2;
        }
        if (tid < GB) {
            ms[tid] = -INFINITY;
            ls[tid] = 0.f;
        }
        float acc[GB][DPL];
#pragma unroll
        for (int j = 0; j < GB; j++)
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[j][e] = 0.f;

        for (int it = 0; it < n_tiles; it++) {
            const int kb = k0 + it * DC_TK, nk = min(DC_TK, k1 - kb);
            if (it + 1 < n_tiles) {
                issue(it + 1, (it + 1) & 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const bf16 *Kt = Kst + (it & 1) * DC_TK * D, *Vt = Vst + (it & 1) * DC_TK * D;
            /* scores */
#pragma unroll
            for (int pass = 0; pass < DC_TK / KPP; pass++) {
                const int kl = pass * KPP + tid / TPK, sub = tid % TPK;
                float dt[GB];
#pragma unroll
                for (int j = 0; j < GB; j++) dt[j] = 0.f;
                const uint4 *kr = reinterpret_cast<const uint4 *>(Kt + kl * D);
#pragma unroll
                for (int i = 0; i < CPT; i++) {
                    const uint4 kc = kr[sub + TPK * i];
                    const int d0 = (sub + TPK * i) * 8;
                    const uint32_t w[4] = {kc.x, kc.y, kc.z, kc.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float lo = __uint_as_float(w[e] << 16), hi = __uint_as_float(w[e] & 0xffff0000u);
#pragma unroll
                        for (int j = 0; j < GB; j++) {
                            const float2 qq = *reinterpret_cast<const float2 *>(&qs[j][d0 + 2 * e]);
                            dt[j] = fmaf(lo, qq.x, fmaf(hi, qq.y, dt[j]));
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < GB; j++) {
#pragma unroll
                    for (int o = 1; o < TPK; o <<= 1) dt[j] += __shfl_xor_sync(0xffffffffu, dt[j], o);
                }
                if (sub == 0) {
#pragma unroll
                    for (int j = 0; j < GB; j++) sc[j][kl] = kl < nk ? dt[j] : -INFINITY;
                }
            }
            __syncthreads();
            /* online softmax per head: warp w owns heads w, w+4, ... */
            for (int j = warp; j < GB; j += 4) {
                float mx = -INFINITY;
                for (int i = lane; i < DC_TK; i += 32) mx = fmaxf(mx, sc[j][i]);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float m_old = ms[j], m_new = fmaxf(m_old, mx);
                float sum = 0.f;
                for (int i = lane; i < DC_TK; i += 32) {
                    const float e = exp2f(sc[j][i] - m_new);
                    sc[j][i] = e;
                    sum += e;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                __syncwarp();
                if (lane == 0) {
                    const float a = exp2f(m_old - m_new);
                    al[j] = a;
                    ls[j] = ls[j] * a + sum;
                    ms[j] = m_new;
                }
            }
            __syncthreads();
            /* PV: warp w takes keys w, w+4, ...; lane owns DPL dims */
#pragma unroll
            for (int j = 0; j < GB; j++) {
                const float a = al[j];
#pragma unroll
                for (int e = 0; e < DPL; e++) acc[j][e] *= a;
            }
            if (lane * DPL < D) {
                for (int kl = warp; kl < nk; kl += 4) {
                    float v[DPL];
                    load_v<DPL>(Vt + kl * D + lane * DPL, v);
#pragma unroll
                    for (int j = 0; j < GB; j++) {
                        const float pj = sc[j][kl];
#pragma unroll
                        for (int e = 0; e < DPL; e++) acc[j][e] = fmaf(pj, v[e], acc[j][e]);
                    }
                }
            }
            __syncthreads(); /* sc and this K/V buffer are rewritten next */
        }
        /* reduce the 4 warps' partial sums */
        if (lane * DPL < D) {
#pragma unroll
            for (int j = 0; j < GB; j++)
#pragma unroll
                for (int e = 0; e < DPL; e++) red[warp][j][lane * DPL + e] = acc[j][e];
        }
        __syncthreads();
        for (int i = tid; i < GB * D; i += 128) {
            const int j = i / D, d = i % D, h = h_first + j;
            const float o = red[0][j][d] + red[1][j][d] + red[2][j][d] + red[3][j][d];
            if (nsp == 1) {
                const size_t off = (size_t)t * p.q_stride + (size_t)h * D + d;
                const float v = o / ls[j];
                p.out[off] = v;
                if (p.out_bf) p.out_bf[off] = __float2bfloat16_rn(v);
            } else {
                float *w = p.ws + (((size_t)di * p.H + h) * nsp + split) * CU_WS_ROW(D);
                w[d] = o;
                if (d == 0) {
                    w[D] = ms[j];
                    w[D + 1] = ls[j];
                }
            }
        }
        __syncthreads(); /* qs, ms, ls, red are reused by the next head group */
    }
    if (nsp > 1) decode_merge<D>(p, di, kvh, t, nsp);
}

/* Flash-decoding on mma.sync: CTA = (split, kv head, sequence), 4 warps,
 * all G <= 8 query heads of the kv head at once, so each K/V byte is read
 * once per group. K/V tiles of 64 keys stream through three stages (LOAD:
 * how they are copied, see DM_LOAD_*); warp w owns keys 16w..16w+15 of
 * every tile and keeps its own online softmax (no block barrier per tile
 * besides the stage handoff). S^T[16 keys x 8 heads] = K Q^T (M = keys,
 * N = heads padded to 8, K = dims), O^T[dims x 8 heads] += V^T P^T (M =
 * dims, N = heads, K = keys); the S accumulator becomes the P^T operand by
 * an 8x8 register transpose (movmatrix). q and p are split into bf16 hi +
 * lo halves (two MMAs each) so the result matches the fp32 CUDA-core
 * kernel to ~1e-5: decode error would otherwise compound over generated
 * tokens. The four warps' states merge in shared memory; the splits merge
 * in decode_merge.
 * early: DM_EARLY_META, the metadata chain runs before the PDL wait;
 * DM_EARLY_KV (with it), so do the first two tiles' copies of a split
 * whose keys all predate this step (see kv_early below). */
template <int D, int LOAD>
__global__ __launch_bounds__(128, 2) void k_attn_decode_mma(attn_params p, size_t k_off, size_t v_off, int early,
                                                             const __grid_constant__ dm_tmap tm) {
    PDL_TRIGGER();
    const bool meta_early = (early & DM_EARLY_META) != 0;
    if (!meta_early) PDL_WAIT();
    constexpr bool SWZ = LOAD == DM_LOAD_TMA;
    static_assert(!SWZ || D == 128, "TMA tiles: rows of 128 dims");
    constexpr int LD = SWZ ? D : D + 8; /* padded rows: ldmatrix conflict-free; TMA: unpadded, swizzled */
    constexpr int NI = D / 16;
    using R = dm_rows<D, LOAD>;
    constexpr bool BULK = R::BULK;
    extern __shared__ __align__(16) uint8_t dsm[];
    /* TMA: the swizzle pattern needs 1024-byte aligned stages (the launch
     * adds 1024 bytes of room) */
    uint8_t *sbase = SWZ ? dsm + ((1024u - ((uint32_t)__cvta_generic_to_shared(dsm) & 1023u)) & 1023u) : dsm;
    bf16 *Ks = reinterpret_cast<bf16 *>(sbase);
    bf16 *Vs = Ks + DM_ST * DM_TK * LD;
    __shared__ __align__(8) uint64_t bars[DM_ST]; /* DM_LOAD_BULK: stage "full" barriers */

    static_assert(DM_TK == CU_DEC_TILE, "splits start on whole tiles (dec_split_of)");
    const dec_split ds = dec_split_of(p);
    const int split = ds.split, kvh = ds.kvh, di = ds.di, nsp = ds.nsp, s = ds.s, L = ds.L, t = ds.t;
    const int k0 = ds.k0, k1 = ds.k1;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_tiles = k1 > k0 ? (k1 - k0 + DM_TK - 1) / DM_TK : 0;
    const int G = p.G, h_first = kvh * G;
    /* page ids of this thread's rows in the next tile to issue (read
     * before the PDL wait: metadata is final at launch in recorded tapes) */
    int pg[R::NR];
#pragma unroll
    for (int j = 0; j < R::NR; j++) {
        const int key = k0 + R::key(j, p.P);
        pg[j] = key < k1 ? kv_page(p, s, key) : 0;
    }
    if (BULK) {
        if (tid == 0)
            for (int i = 0; i < DM_ST; i++) dm_mbar_init((uint32_t)__cvta_generic_to_shared(&bars[i]), 1);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads(); /* barriers initialised before any copy or wait */
    }

    auto issue = [&](int it) { dm_issue<D, LOAD>(p, s, kvh, k0, k1, it, Ks, Vs, bars, pg, k_off, v_off, &tm); };
    auto issue_first = [&]() {
        if (n_tiles > 0) issue(0);
        if (!BULK) cp_async_commit();
        if (n_tiles > 1) issue(1);
        if (!BULK) cp_async_commit();
    };
    /* The only key a kernel of this step stores before this one is the
     * decode token's own, position L - 1 (the q/k-norm kernel); every
     * other key of the sequence was stored by an earlier step, whose
     * kernels completed before this step's first launch (an anchored,
     * non-PDL launch after set_batch's copies; page copies anchor the
     * launch after them too). A split that ends before L - 1 copies its
     * first tiles before the wait, so their HBM latency overlaps the
     * kernels before instead of following it on the step's critical path.
     * The split holding L - 1 copies after the wait and the proxy fence. */
    const bool kv_early = meta_early && (early & DM_EARLY_KV) && k1 < L;
    if (kv_early) issue_first();
    if (meta_early) PDL_WAIT();
    /* The new token's K/V row was stored by the kernel before, through the
     * generic proxy; the bulk copies read through the async proxy, and the
     * PTX memory model orders the two only across a proxy fence. With the
     * wait first (!early) the shared::cta fence above happened to follow
     * it; on the early path it preceded the wait, so nothing ordered the
     * copies after the store: the suspected cause of the timing-dependent
     * fused-decode errors with early loads (docs/cuda.md v17, v18). */
    if (BULK) asm volatile("fence.proxy.async.global;\n" ::: "memory");
    if (!kv_early) issue_first();

    uint32_t qh[NI][2], ql[NI][2];
    dm_load_q<D>(p, t, h_first, G, qh, ql);

    float o[NI][4];
#pragma unroll
    for (int i = 0; i < NI; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f; /* heads (lane % 4) * 2 + 0 / 1 */

    for (int it = 0; it < n_tiles; it++) {
        const int st = it % DM_ST;
        const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&bars[st]);
        if constexpr (LOAD == DM_LOAD_BULK_DEEP) {
            /* every warp is done with tile it - 1, whose stage tile it + 2
             * takes; the zero rows of tiles issued so far are visible */
            __syncthreads();
            if (it + 2 < n_tiles) issue(it + 2);
            dm_mbar_wait(bar, (it / DM_ST) & 1);
        } else {
            if constexpr (LOAD == DM_LOAD_BULK || SWZ) dm_mbar_wait(bar, (it / DM_ST) & 1);
            else cp_async_wait<1>();
            __syncthreads(); /* tile it landed for all threads; stage (it + 2) % 3 was consumed at it - 1 */
            if (it + 2 < n_tiles) issue(it + 2);
            if (!BULK) cp_async_commit();
        }
        const int kw = k0 + it * DM_TK + warp * 16; /* this warp's first key of the tile */
        if constexpr (SWZ) {
            /* this warp's V rows past k1 (stale slots of the last page, or
             * pages not copied): zeros, as P = 0 times NaN is NaN (K rows
             * there only make scores that are masked) */
            if (kw + 16 > k1) {
                uint8_t *vrow = reinterpret_cast<uint8_t *>(Vs + st * DM_TK * LD) + warp * 16 * 128;
                for (int c = lane; c < 16 * 16; c += 32) {
                    const int r = c >> 4, ch = c & 15;
                    if (kw + r >= k1)
                        *reinterpret_cast<uint4 *>(vrow + (ch >> 3) * (DM_TK * 128) + r * 128 + (ch & 7) * 16) =
                            make_uint4(0u, 0u, 0u, 0u);
                }
                __syncwarp();
            }
            dm_tile<D, false, true>(Ks + st * DM_TK * LD + warp * 16 * 64, Vs + st * DM_TK * LD + warp * 16 * 64, qh,
                                    ql, o, m_0, m_1, l_0, l_1, kw + (lane >> 2), k1);
        } else {
            const bf16 *Kt = Ks + st * DM_TK * LD + warp * 16 * LD, *Vt = Vs + st * DM_TK * LD + warp * 16 * LD;
            dm_tile<D>(Kt, Vt, qh, ql, o, m_0, m_1, l_0, l_1, kw + (lane >> 2), k1);
        }
    }
    if (!BULK) cp_async_wait<0>();
    dm_finish<D>(p, dsm, o, m_0, m_1, l_0, l_1, di, kvh, t, split, nsp);
}

/* ============================================================ launcher */

template <int D>
static bool launch_prefill_mma(cu_impl *c, const attn_params &p, size_t k_off, size_t v_off, int n_tiles) {
    static bool attr_done = false;
    const int smem = 4 * PF_BN * (D + 8) * 2;
    if (!attr_done) {
        if (cu_check(c, cudaFuncSetAttribute(k_attn_prefill<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "attention smem attribute"))
            return false;
        attr_done = true;
    }
    cu_launch(c, k_attn_prefill<D>, dim3(dim3((unsigned)n_tiles, (unsigned)p.H)), dim3(128), smem, p, k_off, v_off);
    return !CU_LAUNCHED(c, "attention prefill");
}

template <int D, int GB>
static bool launch_decode_t(cu_impl *c, const attn_params &p, dim3 grid) {
    static bool attr_done = false;
    const int smem = 2 * 2 * DC_TK * D * 2;
    if (!attr_done) {
        if (cu_check(c, cudaFuncSetAttribute(k_attn_decode<D, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "attention decode smem attribute"))
            return false;
        attr_done = true;
    }
    cu_launch(c, k_attn_decode<D, GB>, dim3(grid), dim3(128), smem, p, p.k_off, p.v_off, cu_early(c, CU_EARLY_ATTN));
    return !CU_LAUNCHED(c, "attention decode");
}

template <int D, int LOAD>
static bool launch_decode_mma_t(cu_impl *c, const attn_params &p, dim3 grid, const dm_tmap &tm) {
    static bool attr_done = false;
    const int smem = LOAD == DM_LOAD_TMA ? 2 * DM_ST * DM_TK * D * 2 + 1024 : 2 * DM_ST * DM_TK * (D + 8) * 2;
    if (!attr_done) {
        if (cu_check(c, cudaFuncSetAttribute(k_attn_decode_mma<D, LOAD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "attention decode smem attribute"))
            return false;
        attr_done = true;
    }
    const int early = (cu_early(c, CU_EARLY_ATTN) ? DM_EARLY_META : 0) | (cu_early(c, CU_EARLY_ATTN_KV) ? DM_EARLY_KV : 0);
    cu_launch(c, k_attn_decode_mma<D, LOAD>, dim3(grid), dim3(128), smem, p, p.k_off, p.v_off, early,
              tm);
    return !CU_LAUNCHED(c, "attention decode mma");
}

/* (cuda_attn_dm.cuh) */
int cu_attn_decode_load_mode(cu_impl *c) {
    int mode = cu_attn_switch(&c->attn_dec_load, "NS_CUDA_DEC_LOAD", CU_ATTN_DEC_LOAD_MAX, CU_ATTN_DEC_LOAD_DEFAULT);
    if (mode >= DM_LOAD_BULK) {
        if (c->attn_dec_cc9 == 0) {
            int major = 0;
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
            c->attn_dec_cc9 = major >= 9 ? 1 : 2;
        }
        if (c->attn_dec_cc9 != 1) mode = DM_LOAD_AHEAD;
    }
    return mode;
}

template <int D>
static bool launch_decode_mma(cu_impl *c, const ns_kv_layout *l, const attn_params &p, dim3 grid) {
    dm_tmap tm;
    memset(&tm, 0, sizeof tm);
    int mode = cu_attn_decode_load_mode(c);
    if (mode == DM_LOAD_TMA) {
        /* head dim 128 and pages dividing the tile in whole boxes (P a
         * multiple of 8), and a map the driver could encode; else mode 2 */
        const bool ok = D == 128 && p.P % 8 == 0 && DM_TK % p.P == 0 &&
                        cu_attn_kv_tmap(c, p.kv, (size_t)l->n_pages * l->page_size_bytes, p.page_bytes, p.head_bytes,
                                        p.k_off, p.v_off, p.P, tm.w);
        if (!ok) mode = DM_LOAD_BULK;
    }
    switch (mode) {
    case DM_LOAD_AHEAD: return launch_decode_mma_t<D, DM_LOAD_AHEAD>(c, p, grid, tm);
    case DM_LOAD_BULK: return launch_decode_mma_t<D, DM_LOAD_BULK>(c, p, grid, tm);
    case DM_LOAD_BULK_DEEP: return launch_decode_mma_t<D, DM_LOAD_BULK_DEEP>(c, p, grid, tm);
    case DM_LOAD_TMA:
        if constexpr (D == 128) return launch_decode_mma_t<D, DM_LOAD_TMA>(c, p, grid, tm);
        else return launch_decode_mma_t<D, DM_LOAD_BULK>(c, p, grid, tm);
    default: return launch_decode_mma_t<D, DM_LOAD_CPASYNC>(c, p, grid, tm);
    }
}


template <int D>
static bool launch_decode(cu_impl *c, const attn_params &p, dim3 grid, int gb) {
    switch (gb) {
    case 8:
        if constexpr (D <= 128) return launch_decode_t<D, 8>(c, p, grid);
        else return launch_decode_t<D, 4>(c, p, grid);
    case 4: return launch_decode_t<D, 4>(c, p, grid);
    case 2: return launch_decode_t<D, 2>(c, p, grid);
    default: return launch_decode_t<D, 1>(c, p, grid);
    }
}

int cu_attn_switch(int *field, const char *env, int max, int def) {
    if (*field == 0) {
        const char *e = getenv(env);
        int v = e ? atoi(e) : def;
        if (v < 0 || v > max) v = def;
        *field = 1 + v;
    }
    return *field - 1;
}

/* Switch setters (cuda.h). Graphs bake the kernel choice: drop them. A
 * tape already recorded runs with the new setting, which only picks
 * between kernels with the same semantics. */
static void set_attn_switch(ns_backend *be, int cu_impl::*field, int on, int max, int def) {
    cu_impl *c = (cu_impl *)be->impl;
    cu_bump_generation(c);
    c->*field = 1 + (on < 0 || on > max ? def : on);
}
extern "C" void ns_cuda_set_attn_sm90(ns_backend *be, int on) {
    set_attn_switch(be, &cu_impl::attn_sm90, on, CU_ATTN_SM90_MAX, CU_ATTN_SM90_DEFAULT);
}
extern "C" void ns_cuda_set_attn_dec_mma(ns_backend *be, int on) {
    set_attn_switch(be, &cu_impl::attn_dec_mma, on, CU_ATTN_DEC_MMA_MAX, 1);
}
extern "C" void ns_cuda_set_attn_dec_load(ns_backend *be, int mode) {
    set_attn_switch(be, &cu_impl::attn_dec_load, mode, CU_ATTN_DEC_LOAD_MAX, CU_ATTN_DEC_LOAD_DEFAULT);
}

bool cu_attn_reserve_partials(cu_impl *c, size_t need, size_t need_cnt) {
    if (need <= c->attn_ws_floats && need_cnt <= c->attn_cnt_n) return true;
    if (c->capturing) {
        c->capture_failed = true;
        return false;
    }
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (c->attn_ws) cudaFree(c->attn_ws);
    if (c->attn_cnt) cudaFree(c->attn_cnt);
    c->attn_ws = NULL;
    c->attn_cnt = NULL;
    c->attn_ws_floats = 0;
    c->attn_cnt_n = 0;
    const size_t want = need * 2, want_cnt = need_cnt * 2 + 64;
    if (cu_check(c, cudaMalloc(&c->attn_ws, want * 4), "cudaMalloc(attention partials)") ||
        cu_check(c, cudaMalloc(&c->attn_cnt, want_cnt * 4), "cudaMalloc(attention counters)") ||
        cu_check(c, cudaMemset(c->attn_cnt, 0, want_cnt * 4), "memset(attention counters)"))
        return false;
    c->attn_ws_floats = want;
    c->attn_cnt_n = want_cnt;
    cu_bump_generation(c); /* graphs may hold the old addresses */
    return true;
}

void cu_attention(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer, int n_heads,
                  float scale) {
    const cu_meta *m = &c->meta;
    const int D = l->head_dim;
    attn_params p;
    cu_attn_params_init(p, c, l, q, out, out_bf, n_heads, scale);
    p.head_bytes = (size_t)l->page_tokens * D * 2;
    p.k_off = ((size_t)layer * 2 + 0) * l->n_kv_heads * p.head_bytes;
    p.v_off = ((size_t)layer * 2 + 1) * l->n_kv_heads * p.head_bytes;
    p.ws = c->attn_ws;
    p.cnt = c->attn_cnt;

    const bool dec_ok = D == 16 || D == 32 || D == 64 || D == 128 || D == 256;
    if (!dec_ok) {
        /* head dims no fast kernel covers: the row kernel does every token */
        cu_launch(c, k_attn_rows, dim3(dim3((unsigned)m->n_tokens, (unsigned)((n_heads + 3) / 4))), dim3(128), 0, p, p.k_off,
                                                                                                     p.v_off, D, 1);
        CU_LAUNCHED(c, "attention rows");
        return;
    }
    if (m->n_tiles > 0 && m->n_tiles <= 65535 && cu_attn_sm90_usable(c, D, p.G)) { /* tiles are grid.y */
        cu_sm90_params sp;
        sp.q = q;
        /* an output whose F32 values only GEMMs read (run_tape's
         * cu_tape_f32_dead): this kernel writes just the bf16 shadow. The
         * other kernels (and decode rows of a mixed step) write both,
         * which is merely wasted then. */
        const bool drop = c->out_f32_dead && out_bf && m->n_dec == 0;
        sp.out = drop ? NULL : out;
        if (drop) c->stat_f32_dropped++;
        sp.out_bf = out_bf;
        sp.kv = c->kv;
        sp.page_bytes = p.page_bytes;
        sp.k_off = p.k_off;
        sp.v_off = p.v_off;
        sp.head_bytes = p.head_bytes;
        sp.kv_bytes = (size_t)l->n_pages * l->page_size_bytes;
        sp.seq_start = m->seq_start;
        sp.seq_len = m->seq_len;
        sp.page_table = m->page_table;
        sp.tiles = m->tiles;
        sp.pt_stride = p.pt_stride;
        sp.P = p.P;
        sp.P_shift = p.P_shift;
        sp.H = n_heads;
        sp.G = p.G;
        sp.q_stride = p.q_stride;
        sp.scale_log2 = p.scale_log2;
        if (!cu_attn_prefill_sm90(c, &sp, m->n_tiles)) return;
    } else if (m->n_tiles > 0) {
        bool ok = false;
        switch (D) {
        case 16: ok = launch_prefill_mma<16>(c, p, p.k_off, p.v_off, m->n_tiles); break;
        case 32: ok = launch_prefill_mma<32>(c, p, p.k_off, p.v_off, m->n_tiles); break;
        case 64: ok = launch_prefill_mma<64>(c, p, p.k_off, p.v_off, m->n_tiles); break;
        case 128: ok = launch_prefill_mma<128>(c, p, p.k_off, p.v_off, m->n_tiles); break;
        default:
            cu_launch(c, k_attn_rows, dim3(dim3((unsigned)m->n_tokens, (unsigned)((n_heads + 3) / 4))), dim3(128), 0, 
                p, p.k_off, p.v_off, D, 0);
            ok = !CU_LAUNCHED(c, "attention rows");
            break;
        }
        if (!ok) return;
    }
    if (m->n_dec > 0) {
        const int G = p.G;
        const int gb = G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
        /* tensor cores wherever the kernel applies: with its own split
         * count (choose_mma_splits, v26) it measured faster than the
         * CUDA-core kernel at every context from 256 keys on, batch 1
         * (-0.4 to -2%) and 8 (-4 to -10%) (docs/cuda.md v26; in v13, at
         * set_batch's split count, the CUDA-core kernel had been 2%
         * faster at 1k batch 1). Mode 1 (auto) and 2 (always) now agree;
         * 0 keeps the CUDA-core kernel. */
        const int dm = cu_attn_switch(&c->attn_dec_mma, "NS_CUDA_ATTN_DEC_MMA", CU_ATTN_DEC_MMA_MAX, 1);
        const bool use_mma = (D == 64 || D == 128) && G <= 8 && dm >= 1;
        int nsp = use_mma ? m->mma_splits : m->n_splits; /* choose_mma_splits (cuda_backend.cu) */
        if (nsp > 1) {
            if (!cu_attn_reserve_partials(c, (size_t)m->n_dec * n_heads * nsp * CU_WS_ROW(D),
                                          (size_t)m->n_dec * l->n_kv_heads))
                return;
            p.ws = c->attn_ws;
            p.cnt = c->attn_cnt;
        }
        const dim3 grid((unsigned)nsp, (unsigned)l->n_kv_heads, (unsigned)m->n_dec);
        if (use_mma) {
            if (D == 64) launch_decode_mma<64>(c, l, p, grid);
            else launch_decode_mma<128>(c, l, p, grid);
            return;
        }
        switch (D) {
        case 16: launch_decode<16>(c, p, grid, gb); break;
        case 32: launch_decode<32>(c, p, grid, gb); break;
        case 64: launch_decode<64>(c, p, grid, gb); break;
        case 128: launch_decode<128>(c, p, grid, gb); break;
        case 256: launch_decode<256>(c, p, grid, gb > 4 ? 4 : gb); break;
        default: cu_check(c, cudaErrorInvalidValue, "attention decode: unsupported head_dim"); break;
        }
    }
}
