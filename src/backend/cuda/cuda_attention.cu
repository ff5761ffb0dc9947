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
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_attn_common.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

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

/* ============================================================ prefill */

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

    const int split = blockIdx.x, kvh = blockIdx.y, di = blockIdx.z, nsp = gridDim.x;
    const int s = p.dec_seqs[di];
    const int L = p.seq_len[s], t = p.seq_start[s];
    const int chunk = (((L + nsp - 1) / nsp) + 63) / 64 * 64;
    const int k0 = split * chunk, k1 = min(L, k0 + chunk);
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
 * (A mode that issued the first tiles before the PDL wait was tried and
 * removed: docs/cuda.md v16.) */
enum { DM_LOAD_CPASYNC = 0, DM_LOAD_AHEAD = 1, DM_LOAD_BULK = 2, DM_LOAD_BULK_DEEP = 3, DM_LOAD_TMA = 4 };

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
 * Contains block barriers: every thread calls it. */
template <int D>
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
        const int d = i * 16 + (lane >> 2), hd = (lane & 3) * 2;
        wo[(warp * 8 + hd) * D + d] = o[i][0];
        wo[(warp * 8 + hd + 1) * D + d] = o[i][1];
        wo[(warp * 8 + hd) * D + d + 8] = o[i][2];
        wo[(warp * 8 + hd + 1) * D + d + 8] = o[i][3];
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
    const float ao0 = F16 ? a0 * po : a0, ao1 = F16 ? a1 * po : a1;
    const uint32_t bh0 = movmatrix_t(h01), bh1 = movmatrix_t(h23), bl0 = movmatrix_t(l01), bl1 = movmatrix_t(l23);
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
 * above f16's subnormals (dm_tile's sk folds it in). */
template <int D, bool F16 = false>
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
            const int d = kk * 16 + (lane & 3) * 2 + r * 8;
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
 * in decode_merge. */
template <int D, int LOAD>
__global__ __launch_bounds__(128, 2) void k_attn_decode_mma(attn_params p, size_t k_off, size_t v_off, int early,
                                                             const __grid_constant__ dm_tmap tm) {
    PDL_TRIGGER();
    if (!early) PDL_WAIT();
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

    const int split = blockIdx.x, kvh = blockIdx.y, di = blockIdx.z, nsp = gridDim.x;
    const int s = p.dec_seqs[di];
    const int L = p.seq_len[s], t = p.seq_start[s];
    const int chunk = (((L + nsp - 1) / nsp) + DM_TK - 1) / DM_TK * DM_TK;
    const int k0 = split * chunk, k1 = min(L, k0 + chunk);
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
    if (early) PDL_WAIT();
    /* The new token's K/V row was stored by the kernel before, through the
     * generic proxy; the bulk copies read through the async proxy, and the
     * PTX memory model orders the two only across a proxy fence. With the
     * wait first (!early) the shared::cta fence above happened to follow
     * it; on the early path it preceded the wait, so nothing ordered the
     * copies after the store: the suspected cause of the timing-dependent
     * fused-decode errors with early loads (docs/cuda.md v17, v18). */
    if (BULK) asm volatile("fence.proxy.async.global;\n" ::: "memory");
    if (n_tiles > 0) issue(0);
    if (!BULK) cp_async_commit();
    if (n_tiles > 1) issue(1);
    if (!BULK) cp_async_commit();

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

/* ------------------------------------------ decode on tensor cores, FP8 KV */

static int decode_load_mode(cu_impl *c); /* the launcher section below */

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
        /* V scale basis f: o holds o_true / (f 2^-14); a page with a larger
         * scale raises f (o rescaled by f_old / f <= 1), a smaller one
         * enters through p times vs / f <= 1 (all powers of two: exact) */
        const float vs = Vsc[st * 4 + warp];
        float po = 1.f;
        if (vs > vbase) {
            po = vbase > 0.f ? vbase / vs : 1.f;
            vbase = vs;
        }
        const float pp = vbase > 0.f ? 16384.f * (vs / vbase) : 0.f;
        __syncwarp();
        dm_tile<D, true>(Kb + warp * 16 * LD, Vb + warp * 16 * LD, qh, ql, o, m_0, m_1, l_0, l_1,
                         kw + it * DM_TK + (lane >> 2), k1, Ksc[st * 4 + warp] * qun, po, pp);
    }
    cp_async_wait<0>();
    const float fo = vbase * (1.f / 16384.f);
#pragma unroll
    for (int i = 0; i < D / 16; i++) o[i][0] *= fo, o[i][1] *= fo, o[i][2] *= fo, o[i][3] *= fo;
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

    const int split = blockIdx.x, kvh = blockIdx.y, di = blockIdx.z, nsp = gridDim.x;
    const int s = p.dec_seqs[di];
    const int L = p.seq_len[s], t = p.seq_start[s];
    const int chunk = (((L + nsp - 1) / nsp) + DM_TK - 1) / DM_TK * DM_TK;
    const int k0 = split * chunk, k1 = min(L, k0 + chunk);
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
static void attn_params_init(attn_params &p, const cu_impl *c, const ns_kv_layout *l, const float *q, float *out,
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

bool cu_attn_decode_mma_fp8_ok(int head_dim, int G) { return (head_dim == 64 || head_dim == 128) && G <= 8; }

/* Whether the FP8 tensor-core decode can fetch layer `layer` by page
 * segments, one bulk copy per warp and tile: compute capability 9.0 (and
 * the bf16 decode's copy mode a bulk one), pages of 16, 32 or 64 keys,
 * 16-byte aligned segments. Otherwise it copies rows by 16-byte cp.async. */
bool cu_attn_decode_fp8_bulk_ok(cu_impl *c, const ns_kv_layout *l, int layer) {
    const size_t seg = (size_t)l->page_tokens * l->head_dim; /* 1-byte codes */
    return decode_load_mode(c) >= DM_LOAD_BULK && DM_TK % l->page_tokens == 0 && l->page_tokens % 16 == 0 &&
           seg % 16 == 0 && l->page_size_bytes % 16 == 0 && ns_kv_offset(l, layer, 0, 0, 0) % 16 == 0 &&
           ns_kv_offset(l, layer, 1, 0, 0) % 16 == 0;
}

void cu_attn_decode_mma_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                            int n_heads, float scale, int nsp, float *ws, int32_t *cnt, bool bulk) {
    const cu_meta *m = &c->meta;
    const int D = l->head_dim;
    attn_params p;
    attn_params_init(p, c, l, q, out, out_bf, n_heads, scale);
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
     * exceeds two CTAs per SM; NS_CUDA_FP8_STAGES=2|3 forces either. A
     * function of the grid, which the graph key fixes. */
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("NS_CUDA_FP8_STAGES");
        forced = e && (atoi(e) == 2 || atoi(e) == 3) ? atoi(e) : 0;
    }
    const unsigned ctas = grid.x * grid.y * grid.z;
    const bool st2 = forced == 2 || (forced == 0 && ctas > 2u * (unsigned)c->n_sm);
    if (D == 64 && bulk) launch_decode_mma_fp8<64, true, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 64) launch_decode_mma_fp8<64, false, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 128 && bulk && st2) launch_decode_mma_fp8<128, true, 2>(c, p, grid, ks_off, vs_off);
    else if (D == 128 && bulk) launch_decode_mma_fp8<128, true, DM_ST>(c, p, grid, ks_off, vs_off);
    else if (D == 128) launch_decode_mma_fp8<128, false, DM_ST>(c, p, grid, ks_off, vs_off);
    else cu_check(c, cudaErrorInvalidValue, "fp8 decode mma: head_dim must be 64 or 128");
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
    cu_launch(c, k_attn_decode_mma<D, LOAD>, dim3(grid), dim3(128), smem, p, p.k_off, p.v_off, cu_early(c, CU_EARLY_ATTN),
              tm);
    return !CU_LAUNCHED(c, "attention decode mma");
}

/* The K/V copy mode (cuda.h ns_cuda_set_attn_dec_load); bulk copies need
 * compute capability 9.0, below it modes 2-3 run as mode 1. */
static int decode_load_mode(cu_impl *c) {
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
    int mode = decode_load_mode(c);
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

/* Splits of the tensor-core decode kernel. set_batch's count (in the
 * graph key) aims at >= 8 CTAs per SM with >= 64 keys each, right for the
 * CUDA-core kernel; the MMA kernel streams a split much faster, so long
 * contexts get fewer, longer splits (fewer partials to merge, longer
 * cp.async streams): n_splits / NS_CUDA_DEC_MMA_DIV (default 8) once
 * n_splits >= 64. Measured at 32k batch 1 (H200, docs/cuda.md v13):
 * divisor 1 111.6 tok/s, 2 138.7, 4 149.5, 8 156.2 (256 CTAs of 1024
 * keys: one wave at two CTAs per SM). A function of n_splits only, so a
 * replayed graph always has the grid it was captured with. */
static int decode_mma_splits(int n_splits) {
    static int div = 0;
    if (div == 0) {
        const char *e = getenv("NS_CUDA_DEC_MMA_DIV");
        div = e ? atoi(e) : 8;
        if (div < 1 || div > 64 || (div & (div - 1))) div = 8;
    }
    return n_splits >= 64 ? n_splits / div : n_splits;
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
    attn_params_init(p, c, l, q, out, out_bf, n_heads, scale);
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
        sp.out = out;
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
        /* tensor cores where they measured faster: long contexts (many
         * splits) and large batches; at 1k batch 1 the CUDA-core kernel
         * was 2% faster per step (docs/cuda.md v13) */
        const int dm = cu_attn_switch(&c->attn_dec_mma, "NS_CUDA_ATTN_DEC_MMA", CU_ATTN_DEC_MMA_MAX, 1);
        const bool use_mma =
            (D == 64 || D == 128) && G <= 8 && (dm == 2 || (dm == 1 && (m->n_splits >= 32 || m->n_dec >= 16)));
        int nsp = use_mma ? decode_mma_splits(m->n_splits) : m->n_splits;
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
