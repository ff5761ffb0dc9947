/* cuda_attn_fp8.cu — causal paged attention over FP8 (e4m3) KV pages.
 *
 * - Decode rows (one new token): flash-decoding straight from the codes,
 *   half the bytes of the bf16 pool, which is the point of the format at
 *   long context. A CTA owns (split, kv head, sequence) and all query
 *   heads of the kv group (each K/V byte is read once per group); K/V
 *   tiles of 64 keys and their page-head scales are staged in shared
 *   memory with cp.async, two stages deep. The scale is folded in once per
 *   key, not per element: score = (q . code_k) * s_k, and the probability
 *   is multiplied by s_v before PV. Splits are merged by the last CTA of
 *   the (sequence, kv head) with the bf16 kernels' decode_merge
 *   (cuda_attn_common.cuh). At >= 64 splits (long context, few sequences)
 *   the decode rows go to cu_attn_decode_mma_fp8 (tensor cores,
 *   cuda_attn_fp8_mma.cu) instead: NS_CUDA_FP8_MMA.
 * - Prefill tiles (more than one new token): the pages the prefilling
 *   sequences reference are dequantized once per layer into a compact
 *   bf16 copy (scratch pool of one layer, remapped page table), and the
 *   bf16 prefill kernels of cu_attention run on it: the design brief's
 *   "a restored quantized prefix is dequantized once for a long suffix
 *   prefill rather than attended page by page". The dequantization reads
 *   1 byte and writes 2 per element of the referenced prefix, per layer
 *   and step: small next to the prefill's attention FLOPs.
 * Semantics as cu_attention: the query at position p attends keys [0, p]
 * with softmax in fp32 over the dequantized values decode(code) * scale.
 */
#include <math.h>
#include <stdlib.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_attn_common.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

#define F8_TK 64            /* keys per tile */
#define CU_WS_ROW(D) ((D) + 4) /* floats per split partial: o[D], m, l, pad */
#define F8_LOG2E 1.4426950408889634f

struct f8_params {
    const float *q;
    float *out;
    bf16 *out_bf;
    const uint8_t *kv;
    size_t page_bytes;
    size_t k_off, v_off;   /* bytes from a page's start to (layer, K|V, head 0, slot 0) */
    size_t ks_off, vs_off; /* bytes from a page's start to the scale of (layer, K|V, head 0) */
    int seg_bytes;         /* P * D */
    const int32_t *seq_start, *seq_len, *page_table, *dec_seqs;
    int pt_stride, P, P_shift, H, KVH, G, q_stride;
    float scale_log2;
    float *ws;
    int32_t *cnt;
};

struct cu_kv_fp8 {
    bf16 *scratch; /* compact bf16 pool of one layer */
    size_t scratch_pages;
    int32_t *ints; /* remapped page table, source pages, per-sequence bases */
    size_t ints_cap;
};

__device__ __forceinline__ void f8_cp16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void f8_cp4(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void f8_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void f8_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Two e4m3 codes (low byte first) -> two floats, exactly (every e4m3
 * value is an f16). */
__device__ __forceinline__ float2 f8x2_to_float2(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2 *>(&h));
}

/* Four codes (byte k of w) -> v[k] * 2^-8 on the integer path (INT):
 * each code's sign and exponent/mantissa bits moved into an f16 (its
 * value is then the e4m3 value times 2^-8, subnormals included; the NaN
 * code reads as 1.875 * 2^-8, and a page never holds one unless a NaN was
 * stored), then f16 -> f32. Two byte permutes, shifts and masks per pair
 * instead of the e4m3x2 -> f16x2 conversion instruction (!INT, exact
 * values). Which is faster on the H200 is what NS_CUDA_FP8_DEC measures;
 * the 2^-8 is folded into the page-head scales. */
template <bool INT>
__device__ __forceinline__ void f8x4_to_float(uint32_t w, float (&v)[4]) {
    if constexpr (INT) {
        const uint32_t r0 = __byte_perm(w, 0, 0x1404), r1 = __byte_perm(w, 0, 0x3424);
        const uint32_t h0 = (r0 & 0x80008000u) | ((r0 >> 1) & 0x3f803f80u),
                       h1 = (r1 & 0x80008000u) | ((r1 >> 1) & 0x3f803f80u);
        const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&h0)),
                     b = __half22float2(*reinterpret_cast<const __half2 *>(&h1));
        v[0] = a.x;
        v[1] = a.y;
        v[2] = b.x;
        v[3] = b.y;
    } else {
        const float2 a = f8x2_to_float2(w), b = f8x2_to_float2(w >> 16);
        v[0] = a.x;
        v[1] = a.y;
        v[2] = b.x;
        v[3] = b.y;
    }
}

/* Tiling of k_attn_decode_fp8 (QREG: see there). */
template <int D, int GB, bool QREG>
struct f8_shape {
    static constexpr int LCH = D / 16;              /* 16-byte copies per row (head dim 16: one) */
    static constexpr int CB = D >= 32 ? 16 : 8;     /* bytes per score chunk */
    static constexpr int CH = D / CB;               /* score chunks per row */
    static constexpr bool QR = QREG && D <= 128 && GB * CB <= 64;
    static constexpr int TPK = QR ? CH : CH >= 4 ? 4 : CH; /* threads per key for the scores */
    static constexpr int CPT = CH / TPK;            /* chunks per thread per key */
    static constexpr int KPP = 128 / TPK;           /* keys per pass */
    static constexpr int DPL = D >= 32 ? D / 32 : 1; /* V dims per lane (lanes past D idle) */
    static constexpr int QG = QR ? GB : 1, QC = QR ? CB : 1; /* q registers per thread */
    static_assert(KPP <= F8_TK && F8_TK % KPP == 0, "a pass covers part of a tile");
};

/* Stages keys [kb, min(kb + F8_TK, k1)) of sequence s, kv head kvh: K and
 * V code rows (two threads per row, 16-byte cp.async, zero-filled past k1)
 * and each row's page-head scales; one commit group. */
template <int D>
__device__ __forceinline__ void f8_issue(const f8_params &p, int s, int kvh, int kb, int k1, uint8_t *Kd, uint8_t *Vd,
                                         float *ksd, float *vsd) {
    constexpr int LCH = D / 16;
    const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
    const bool ok = kb + r < k1;
    const uint8_t *pg = p.kv, *kr = p.kv, *vr = p.kv;
    if (ok) {
        const int pos = kb + r;
        int pi, slot;
        if (p.P_shift >= 0) {
            pi = pos >> p.P_shift;
            slot = pos & (p.P - 1);
        } else {
            pi = pos / p.P;
            slot = pos - pi * p.P;
        }
        pg = p.kv + (size_t)p.page_table[(size_t)s * p.pt_stride + pi] * p.page_bytes;
        kr = pg + p.k_off + (size_t)kvh * p.seg_bytes + (size_t)slot * D;
        vr = pg + p.v_off + (size_t)kvh * p.seg_bytes + (size_t)slot * D;
    }
    uint8_t *kd = Kd + r * D, *vd = Vd + r * D;
    const int c_lo = LCH >= 2 ? half * (LCH / 2) : 0, c_hi = LCH >= 2 ? c_lo + LCH / 2 : 1 - half;
#pragma unroll
    for (int ch = c_lo; ch < c_hi; ch++) {
        f8_cp16(kd + ch * 16, kr + ch * 16, ok ? 16 : 0);
        f8_cp16(vd + ch * 16, vr + ch * 16, ok ? 16 : 0);
    }
    if (half == 0) {
        f8_cp4(ksd + r, ok ? pg + p.ks_off + (size_t)kvh * 4 : p.kv, ok ? 4 : 0);
        f8_cp4(vsd + r, ok ? pg + p.vs_off + (size_t)kvh * 4 : p.kv, ok ? 4 : 0);
    }
    f8_commit();
}

/* Scores of a staged tile: sc[j][kl] = (q_j . code_kl) * s_kl (q already
 * times scale * log2 e), -inf past nk. TPK threads per key; without QR odd
 * keys start at the other half of the row, so the 8 keys of a warp spread
 * over all banks. */
template <int D, int GB, bool INT, bool QREG>
__device__ __forceinline__ void f8_scores(const uint8_t *Kt, const float *kst, int nk, const float (*qs)[D],
                                          const float (&qreg)[f8_shape<D, GB, QREG>::QG][f8_shape<D, GB, QREG>::QC],
                                          float (*sc)[F8_TK]) {
    using S = f8_shape<D, GB, QREG>;
    constexpr int CB = S::CB, TPK = S::TPK, CPT = S::CPT, KPP = S::KPP;
    const int tid = threadIdx.x;
#pragma unroll
    for (int pass = 0; pass < F8_TK / KPP; pass++) {
        const int kl = pass * KPP + tid / TPK, sub = tid % TPK;
        float dt[GB];
#pragma unroll
        for (int j = 0; j < GB; j++) dt[j] = 0.f;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int ci = sub + TPK * ((i + kl) % CPT);
            uint32_t w[CB / 4];
            if constexpr (CB == 16) {
                const uint4 kc = reinterpret_cast<const uint4 *>(Kt + kl * D)[ci];
                w[0] = kc.x;
                w[1] = kc.y;
                w[2] = kc.z;
                w[3] = kc.w;
            } else {
                const uint2 kc = reinterpret_cast<const uint2 *>(Kt + kl * D)[ci];
                w[0] = kc.x;
                w[1] = kc.y;
            }
#pragma unroll
            for (int e = 0; e < CB / 4; e++) {
                float f[4];
                f8x4_to_float<INT>(w[e], f);
                const int d = ci * CB + 4 * e;
#pragma unroll
                for (int j = 0; j < GB; j++) {
                    float4 qq;
                    if constexpr (S::QR)
                        qq = make_float4(qreg[j][4 * e], qreg[j][4 * e + 1], qreg[j][4 * e + 2], qreg[j][4 * e + 3]);
                    else
                        qq = *reinterpret_cast<const float4 *>(&qs[j][d]);
                    dt[j] = fmaf(f[0], qq.x, fmaf(f[1], qq.y, fmaf(f[2], qq.z, fmaf(f[3], qq.w, dt[j]))));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < GB; j++) {
#pragma unroll
            for (int o = 1; o < TPK; o <<= 1) dt[j] += __shfl_xor_sync(0xffffffffu, dt[j], o);
        }
        if (sub == 0) {
            const float ks = INT ? kst[kl] * 256.0f : kst[kl];
#pragma unroll
            for (int j = 0; j < GB; j++) sc[j][kl] = kl < nk ? dt[j] * ks : -INFINITY;
        }
    }
}

/* Online softmax of a tile's scores, warp w owning heads w, w + 4, ...:
 * sc becomes 2^(score - m), ms/ls the running max and sum, al the factor
 * the accumulators are rescaled by. */
template <int GB>
__device__ __forceinline__ void f8_softmax(float (*sc)[F8_TK], float *ms, float *ls, float *al) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp; j < GB; j += 4) {
        float mx = -INFINITY;
        for (int i = lane; i < F8_TK; i += 32) mx = fmaxf(mx, sc[j][i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_old = ms[j], m_new = fmaxf(m_old, mx);
        float sum = 0.f;
        for (int i = lane; i < F8_TK; i += 32) {
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
}

/* PV of a staged tile: warp w takes keys w, w + 4, ...; lane owns DPL
 * dims; the V scale rides on the probability. */
template <int D, int GB, bool INT, int DPL>
__device__ __forceinline__ void f8_pv(const uint8_t *Vt, const float *vst, int nk, const float (*sc)[F8_TK],
                                      const float *al, float (&acc)[GB][DPL]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < GB; j++) {
        const float a = al[j];
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[j][e] *= a;
    }
    for (int kl = warp; kl < nk && lane * DPL < D; kl += 4) {
        float v[DPL];
        const uint8_t *vr = Vt + kl * D + lane * DPL;
        if constexpr (DPL <= 2) {
            float f[4];
            f8x4_to_float<INT>(DPL == 1 ? (uint32_t)*vr : (uint32_t)*reinterpret_cast<const uint16_t *>(vr), f);
#pragma unroll
            for (int e = 0; e < DPL; e++) v[e] = f[e];
        } else {
#pragma unroll
            for (int w4 = 0; w4 < DPL / 4; w4++) {
                float f[4];
                f8x4_to_float<INT>(reinterpret_cast<const uint32_t *>(vr)[w4], f);
#pragma unroll
                for (int e = 0; e < 4; e++) v[4 * w4 + e] = f[e];
            }
        }
        const float vs = INT ? vst[kl] * 256.0f : vst[kl];
#pragma unroll
        for (int j = 0; j < GB; j++) {
            const float pj = sc[j][kl] * vs;
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[j][e] = fmaf(pj, v[e], acc[j][e]);
        }
    }
}

/* The 4 warps' sums of a head group -> out (one split) or the split's
 * partial (o, m, l) in p.ws. Contains a block barrier. */
template <int D, int GB, int DPL>
__device__ __forceinline__ void f8_finish(const f8_params &p, const float (&acc)[GB][DPL], float (*red)[GB][D],
                                          const float *ms, const float *ls, int di, int t, int h_first, int split,
                                          int nsp) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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
}

/* grid (splits, kv heads, decode rows), 128 threads; GB query heads of the
 * group per pass (G / GB passes over the split's keys). QREG (head dims up
 * to 128, GB * 16 <= 64): one 16-byte chunk of a K row per thread, the
 * thread's q values for it held in registers for the whole split, instead
 * of GB float4 shared-memory loads per 4 codes (NS_CUDA_FP8_QREG). */
template <int D, int GB, bool INT, bool QREG>
__global__ __launch_bounds__(128) void k_attn_decode_fp8(f8_params p) {
    PDL_ENTRY();
    using S = f8_shape<D, GB, QREG>;
    constexpr int DPL = S::DPL;
    extern __shared__ __align__(16) uint8_t dsm[];
    uint8_t *Kst = dsm;                                          /* [2][F8_TK][D] */
    uint8_t *Vst = Kst + 2 * F8_TK * D;                          /* [2][F8_TK][D] */
    float *kss = reinterpret_cast<float *>(Vst + 2 * F8_TK * D); /* [2][F8_TK] */
    float *vss = kss + 2 * F8_TK;                                /* [2][F8_TK] */
    __shared__ __align__(16) float qs[GB][D];
    __shared__ float sc[GB][F8_TK];
    __shared__ float ms[GB], ls[GB], al[GB];
    __shared__ float red[4][GB][D];

    static_assert(F8_TK == CU_DEC_TILE, "splits start on whole tiles (dec_split_of)");
    const dec_split ds = dec_split_of(p);
    const int split = ds.split, kvh = ds.kvh, di = ds.di, nsp = ds.nsp, s = ds.s, t = ds.t;
    const int k0 = ds.k0, k1 = ds.k1;
    const int tid = threadIdx.x;
    const int n_tiles = k1 > k0 ? (k1 - k0 + F8_TK - 1) / F8_TK : 0;
    auto issue = [&](int it, int buf) {
        f8_issue<D>(p, s, kvh, k0 + it * F8_TK, k1, Kst + buf * F8_TK * D, Vst + buf * F8_TK * D, kss + buf * F8_TK,
                    vss + buf * F8_TK);
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
        float qreg[S::QG][S::QC];
        if constexpr (S::QR) { /* this thread's chunk of every key: dims [sub * CB, sub * CB + CB) */
            __syncthreads();
            const int d0 = (tid % S::TPK) * S::CB;
#pragma unroll
            for (int j = 0; j < GB; j++)
#pragma unroll
                for (int e = 0; e < S::CB; e++) qreg[j][e] = qs[j][d0 + e];
        }
        for (int it = 0; it < n_tiles; it++) {
            const int buf = it & 1, kb = k0 + it * F8_TK, nk = min(F8_TK, k1 - kb);
            if (it + 1 < n_tiles) {
                issue(it + 1, buf ^ 1);
                f8_wait<1>();
            } else {
                f8_wait<0>();
            }
            __syncthreads();
            f8_scores<D, GB, INT, QREG>(Kst + buf * F8_TK * D, kss + buf * F8_TK, nk, qs, qreg, sc);
            __syncthreads();
            f8_softmax<GB>(sc, ms, ls, al);
            __syncthreads();
            f8_pv<D, GB, INT, DPL>(Vst + buf * F8_TK * D, vss + buf * F8_TK, nk, sc, al, acc);
            __syncthreads(); /* sc and this K/V buffer are rewritten next */
        }
        f8_finish<D, GB, DPL>(p, acc, red, ms, ls, di, t, h_first, split, nsp);
        __syncthreads(); /* qs, ms, ls, red are reused by the next head group */
    }
    if (nsp > 1) decode_merge<D>(p, di, kvh, t, nsp);
}

template <int D, int GB, bool INT, bool QREG>
static void launch_decode_fp8_k(cu_impl *c, const f8_params &p, dim3 grid) {
    static bool attr_done = false;
    const int smem = 4 * F8_TK * D + 4 * F8_TK * 4;
    if (!attr_done) {
        if (cu_check(c,
                     cudaFuncSetAttribute(k_attn_decode_fp8<D, GB, INT, QREG>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                     "fp8 decode attention smem attribute"))
            return;
        attr_done = true;
    }
    cu_launch(c, k_attn_decode_fp8<D, GB, INT, QREG>, grid, dim3(128), (size_t)smem, p);
    CU_LAUNCHED(c, "fp8 decode attention");
}

/* The FP8 attention's process-wide A/B switches (benchmark and test
 * switches): read from the environment variable the first time, set by
 * the ns_cuda_set_fp8_* calls, which bump the graph generation (graphs
 * bake the kernel choice). `fix` maps any int, the environment's atoi
 * included, to one of the switch's values; `dflt` is the value where the
 * variable is unset. Values are >= 0; -1 means not read yet. */
struct fp8_switch {
    const char *env;
    int dflt;
    int (*fix)(int v);
    int value;
};
static int fp8_switch_get(fp8_switch *sw) {
    if (sw->value < 0) {
        const char *e = getenv(sw->env);
        sw->value = sw->fix(e ? atoi(e) : sw->dflt);
    }
    return sw->value;
}
static void fp8_switch_set(ns_backend *be, fp8_switch *sw, int v) {
    sw->value = sw->fix(v);
    cu_bump_generation((cu_impl *)be->impl);
}
static int fix_on(int v) { return v != 0; }

/* NS_CUDA_FP8_DEC / ns_cuda_set_fp8_dec: 0 = codes through the e4m3x2 ->
 * f16x2 conversion instruction (default until measured), 1 = the integer
 * path (f8x4_to_float). */
static int fix_dec(int v) { return v == 1; }
static fp8_switch sw_dec = {"NS_CUDA_FP8_DEC", 0, fix_dec, -1};
extern "C" void ns_cuda_set_fp8_dec(ns_backend *be, int mode) { fp8_switch_set(be, &sw_dec, mode); }

/* NS_CUDA_FP8_SPLIT_DIV / ns_cuda_set_fp8_split_div: set_batch picks
 * n_splits for the bf16 CUDA-core decode (>= 64 keys per split); where
 * that gives >= 64 splits, the FP8 kernel uses n_splits / div, so each CTA
 * streams more keys (per-CTA setup, the q load and the merge amortized)
 * -- what the tensor-core bf16 decode does with its 8. Default 8 until
 * measured; 1 = set_batch's own choice. A power of two in [1, 64]. */
static int fix_split_div(int v) { return v >= 1 && v <= 64 && (v & (v - 1)) == 0 ? v : 8; }
static fp8_switch sw_split_div = {"NS_CUDA_FP8_SPLIT_DIV", 8, fix_split_div, -1};
extern "C" void ns_cuda_set_fp8_split_div(ns_backend *be, int div) { fp8_switch_set(be, &sw_split_div, div); }

/* NS_CUDA_FP8_QREG / ns_cuda_set_fp8_qreg: 1 = q in registers (see
 * k_attn_decode_fp8; default: run B, 32k B1 8.05 ms/step against 12.10
 * with q from shared memory, B8 18.7 against 35.3), 0 = q read from
 * shared memory. */
static fp8_switch sw_qreg = {"NS_CUDA_FP8_QREG", 1, fix_on, -1};
extern "C" void ns_cuda_set_fp8_qreg(ns_backend *be, int on) { fp8_switch_set(be, &sw_qreg, on); }

/* NS_CUDA_FP8_MMA / ns_cuda_set_fp8_mma: decode rows on the tensor cores
 * (cu_attn_decode_mma_fp8 in cuda_attn_fp8_mma.cu, where the shape allows) or
 * on the CUDA-core kernel here: 0 = never, 1 = always, 2 = auto (default):
 * tensor cores when set_batch chose >= 64 splits (long contexts, few
 * sequences), or, on the bulk-copy path, when each split holds >= 1024
 * keys (m->long_splits). Run C, 32k context: batch 1 (256 splits) 6.63
 * ms/step on the tensor cores against 8.07 on CUDA cores; batch 8 (32
 * splits) 21.35 against 18.21. Since v20 (per-warp bulk pipeline, f16
 * tiles; runs I, J): 32k batch 8 16.03 against 16.57, 4k batch 64 (4
 * splits of 1024) 16.65 against 17.54, but 4k batch 8 (splits of 128)
 * 8.13 against 7.85 and 1k batch 64 10.00 against 9.87. */
static int fix_mma(int v) { return v >= 0 && v <= 2 ? v : 2; }
static fp8_switch sw_mma = {"NS_CUDA_FP8_MMA", 2, fix_mma, -1};
extern "C" void ns_cuda_set_fp8_mma(ns_backend *be, int mode) { fp8_switch_set(be, &sw_mma, mode); }

/* NS_CUDA_FP8_BULK / ns_cuda_set_fp8_bulk: the tensor-core FP8 decode
 * fetches each tile as page segments by bulk copy (1, default, where the
 * layout allows and the bf16 decode copy mode is a bulk one) or as
 * 16-byte cp.async per row (0). */
static fp8_switch sw_bulk = {"NS_CUDA_FP8_BULK", 1, fix_on, -1};
extern "C" int ns_cuda_get_fp8_bulk(ns_backend *be) {
    (void)be;
    return fp8_switch_get(&sw_bulk);
}
extern "C" void ns_cuda_set_fp8_bulk(ns_backend *be, int on) { fp8_switch_set(be, &sw_bulk, on); }

/* NS_CUDA_FP8_REG / ns_cuda_set_fp8_reg: decode rows on the register-tile
 * tensor-core kernel (cuda_attn_fp8_reg.cu) wherever it covers the pool
 * and shape and set_batch gave it splits (1, default: contexts >= 8k or
 * batches >= 4, cuda_batch.cu), or the choice of NS_CUDA_FP8_MMA (0). */
static fp8_switch sw_reg = {"NS_CUDA_FP8_REG", 1, fix_on, -1};
extern "C" int ns_cuda_get_fp8_reg(ns_backend *be) {
    (void)be;
    return fp8_switch_get(&sw_reg);
}
extern "C" void ns_cuda_set_fp8_reg(ns_backend *be, int on) { fp8_switch_set(be, &sw_reg, on); }

template <int D, int GB>
static void launch_decode_fp8(cu_impl *c, const f8_params &p, dim3 grid) {
    const bool in = fp8_switch_get(&sw_dec) == 1, qr = fp8_switch_get(&sw_qreg) == 1;
    if (in && qr) launch_decode_fp8_k<D, GB, true, true>(c, p, grid);
    else if (in) launch_decode_fp8_k<D, GB, true, false>(c, p, grid);
    else if (qr) launch_decode_fp8_k<D, GB, false, true>(c, p, grid);
    else launch_decode_fp8_k<D, GB, false, false>(c, p, grid);
}

template <int D>
static void launch_decode_fp8_d(cu_impl *c, const f8_params &p, dim3 grid) {
    const int G = p.G, lim = D >= 256 ? 4 : 8;
    const int gb = G % 8 == 0 && lim >= 8 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
    switch (gb) {
    case 8:
        if constexpr (D <= 128) launch_decode_fp8<D, 8>(c, p, grid);
        break;
    case 4: launch_decode_fp8<D, 4>(c, p, grid); break;
    case 2: launch_decode_fp8<D, 2>(c, p, grid); break;
    default: launch_decode_fp8<D, 1>(c, p, grid); break;
    }
}

static void decode_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                       int n_heads, float scale) {
    const cu_meta *m = &c->meta;
    const int D = l->head_dim, KVH = l->n_kv_heads;
    f8_params p;
    p.q = q;
    p.out = out;
    p.out_bf = out_bf;
    p.kv = c->kv;
    p.page_bytes = l->page_size_bytes;
    p.seg_bytes = l->page_tokens * D;
    p.k_off = ns_kv_offset(l, layer, 0, 0, 0);
    p.v_off = ns_kv_offset(l, layer, 1, 0, 0);
    p.ks_off = ns_kv_scale_offset(l, layer, 0, 0);
    p.vs_off = ns_kv_scale_offset(l, layer, 1, 0);
    p.seq_start = m->seq_start;
    p.seq_len = m->seq_len;
    p.page_table = m->page_table;
    p.dec_seqs = m->dec_seqs;
    p.pt_stride = m->pt_stride;
    p.P = l->page_tokens;
    p.P_shift = -1;
    for (int b = 0; b < 31; b++)
        if ((1 << b) == p.P) p.P_shift = b;
    p.H = n_heads;
    p.KVH = KVH;
    p.G = n_heads / KVH;
    p.q_stride = n_heads * D;
    p.scale_log2 = scale * F8_LOG2E;
    p.ws = c->attn_ws;
    p.cnt = c->attn_cnt;
    const bool reg = fp8_switch_get(&sw_reg) && m->fp8r_splits > 0 && cu_attn_decode_fp8_reg_ok(c, l, p.G);
    int nsp = m->n_splits > 0 ? m->n_splits : 1;
    if (reg) nsp = m->fp8r_splits;
    else if (nsp >= 64) nsp /= fp8_switch_get(&sw_split_div); /* a divisor <= 64: at least 1 split */
    if (nsp > 1024) nsp = 1024; /* decode_merge's bound (set_batch never asks for more) */
    if (nsp > 1) {
        if (!cu_attn_reserve_partials(c, (size_t)m->n_dec * n_heads * nsp * CU_WS_ROW(D), (size_t)m->n_dec * KVH)) return;
        p.ws = c->attn_ws;
        p.cnt = c->attn_cnt;
    }
    if (reg) {
        cu_attn_decode_fp8_reg(c, l, out, out_bf, q, layer, n_heads, scale, nsp, p.ws, p.cnt);
        return;
    }
    const int mma = fp8_switch_get(&sw_mma);
    const bool bulk = fp8_switch_get(&sw_bulk) && cu_attn_decode_fp8_bulk_ok(c, l, layer);
    if ((mma == 1 || (mma == 2 && (m->n_splits >= 64 || (m->long_splits && bulk)))) && cu_attn_decode_mma_fp8_ok(D, p.G)) {
        cu_attn_decode_mma_fp8(c, l, out, out_bf, q, layer, n_heads, scale, nsp, p.ws, p.cnt, bulk);
        return;
    }
    const dim3 grid((unsigned)nsp, (unsigned)KVH, (unsigned)m->n_dec);
    switch (D) {
    case 16: launch_decode_fp8_d<16>(c, p, grid); break;
    case 32: launch_decode_fp8_d<32>(c, p, grid); break;
    case 64: launch_decode_fp8_d<64>(c, p, grid); break;
    case 128: launch_decode_fp8_d<128>(c, p, grid); break;
    case 256: launch_decode_fp8_d<256>(c, p, grid); break;
    default: cu_check(c, cudaErrorInvalidValue, "fp8 attention: head_dim must be 16, 32, 64, 128 or 256"); break;
    }
}

/* ------------------------------------------------------------- prefill */

/* One CTA: base[s] = first compact page of prefilling sequence s (pages of
 * the other sequences are not copied), remap[s * stride + i] = base[s] +
 * i and src[base[s] + i] = the pool page, for every page of those
 * sequences. */
__global__ void k_fp8_remap(const int32_t *__restrict__ seq_start, const int32_t *__restrict__ seq_len,
                            const int32_t *__restrict__ page_table, int n_seqs, int stride, int P, int32_t *remap,
                            int32_t *src, int32_t *base) {
    PDL_ENTRY();
    if (threadIdx.x == 0) {
        int b = 0;
        for (int s = 0; s < n_seqs; s++) {
            base[s] = b;
            if (seq_start[s + 1] - seq_start[s] > 1) b += (seq_len[s] + P - 1) / P;
        }
    }
    __syncthreads();
    for (int s = 0; s < n_seqs; s++) {
        if (seq_start[s + 1] - seq_start[s] <= 1) continue;
        const int pages = (seq_len[s] + P - 1) / P, b = base[s];
        for (int i = threadIdx.x; i < pages; i += blockDim.x) {
            remap[(size_t)s * stride + i] = b + i;
            src[b + i] = page_table[(size_t)s * stride + i];
        }
    }
}

/* grid (compact pages, 2 * kv heads): segment (K|V, head) of this layer of
 * page src[i] -> bf16(decode(code) * scale) in compact page i. */
__global__ __launch_bounds__(128) void k_fp8_dequant(const uint8_t *__restrict__ kv, size_t page_bytes,
                                                     size_t seg_off, size_t scale_off, int seg_bytes,
                                                     const int32_t *__restrict__ src, bf16 *dst) {
    PDL_ENTRY();
    const int i = blockIdx.x, sg = blockIdx.y, n_seg = gridDim.y;
    const uint8_t *pg = kv + (size_t)src[i] * page_bytes;
    const uint8_t *codes = pg + seg_off + (size_t)sg * seg_bytes;
    const float s = reinterpret_cast<const float *>(pg + scale_off)[sg];
    bf16 *o = dst + ((size_t)i * n_seg + sg) * seg_bytes;
    for (int c0 = threadIdx.x * 16; c0 < seg_bytes; c0 += blockDim.x * 16) {
        const uint4 u = *reinterpret_cast<const uint4 *>(codes + c0);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
        __align__(16) bf16 tmp[16];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 a = f8x2_to_float2(w[e]), b = f8x2_to_float2(w[e] >> 16);
            tmp[4 * e] = __float2bfloat16_rn(a.x * s);
            tmp[4 * e + 1] = __float2bfloat16_rn(a.y * s);
            tmp[4 * e + 2] = __float2bfloat16_rn(b.x * s);
            tmp[4 * e + 3] = __float2bfloat16_rn(b.y * s);
        }
        reinterpret_cast<uint4 *>(o + c0)[0] = reinterpret_cast<const uint4 *>(tmp)[0];
        reinterpret_cast<uint4 *>(o + c0)[1] = reinterpret_cast<const uint4 *>(tmp)[1];
    }
}

/* Scratch for n compact pages and the remap tables; false on failure
 * (recorded). Grows with headroom, never under capture (prefill steps are
 * not captured; the check keeps a future change from baking a freed
 * address into a graph). */
static bool reserve_prefill(cu_impl *c, const ns_kv_layout *l, size_t n_pages, size_t ints) {
    cu_kv_fp8 *f = c->kv_fp8;
    if (!f) {
        f = (cu_kv_fp8 *)calloc(1, sizeof *f);
        if (!f) {
            cu_set_error(c, NS_ERR_NOMEM, "fp8 attention: out of memory");
            return false;
        }
        c->kv_fp8 = f;
    }
    const size_t page_bf = (size_t)2 * l->n_kv_heads * l->page_tokens * l->head_dim * sizeof(bf16);
    if (n_pages <= f->scratch_pages && ints <= f->ints_cap) return true;
    if (c->capturing) {
        c->capture_failed = true;
        return false;
    }
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (n_pages > f->scratch_pages) {
        if (f->scratch) cudaFree(f->scratch);
        f->scratch = NULL;
        f->scratch_pages = 0;
        size_t want = n_pages + n_pages / 4 + 16;
        if (want > (size_t)l->n_pages) want = (size_t)l->n_pages;
        if (want < n_pages) want = n_pages;
        if (cu_check(c, cudaMalloc(&f->scratch, want * page_bf), "cudaMalloc(fp8 prefill scratch)")) return false;
        f->scratch_pages = want;
    }
    if (ints > f->ints_cap) {
        if (f->ints) cudaFree(f->ints);
        f->ints = NULL;
        f->ints_cap = 0;
        const size_t want = ints * 2 + 1024;
        if (cu_check(c, cudaMalloc(&f->ints, want * sizeof(int32_t)), "cudaMalloc(fp8 prefill tables)")) return false;
        f->ints_cap = want;
    }
    cu_bump_generation(c);
    return true;
}

static void prefill_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                        int n_heads, float scale) {
    cu_meta *m = &c->meta;
    const int P = l->page_tokens;
    /* the step's sequence spans, from set_batch's pinned staging copy
     * (same offsets as the device regions; valid until the next set_batch) */
    const int32_t *h_ss = m->h_base + (m->seq_start - m->d_base), *h_sl = m->h_base + (m->seq_len - m->d_base);
    size_t n_pages = 0;
    for (int32_t s = 0; s < m->n_seqs; s++)
        if (h_ss[s + 1] - h_ss[s] > 1) n_pages += (size_t)((h_sl[s] + P - 1) / P);
    if (n_pages == 0) return;
    const size_t tab = (size_t)m->n_seqs * m->pt_stride;
    if (!reserve_prefill(c, l, n_pages, tab + n_pages + (size_t)m->n_seqs + 1)) return;
    cu_kv_fp8 *f = c->kv_fp8;
    int32_t *remap = f->ints, *src = remap + tab, *base = src + n_pages;
    cu_launch(c, k_fp8_remap, dim3(1), dim3(1024), 0, (const int32_t *)m->seq_start, (const int32_t *)m->seq_len,
              (const int32_t *)m->page_table, m->n_seqs, m->pt_stride, P, remap, src, base);
    if (CU_LAUNCHED(c, "fp8 prefill remap")) return;
    const int seg = P * l->head_dim;
    cu_launch(c, k_fp8_dequant, dim3((unsigned)n_pages, (unsigned)(2 * l->n_kv_heads)), dim3(128), 0,
              (const uint8_t *)c->kv, l->page_size_bytes, ns_kv_offset(l, layer, 0, 0, 0),
              ns_kv_scale_offset(l, layer, 0, 0), seg, (const int32_t *)src, f->scratch);
    if (CU_LAUNCHED(c, "fp8 prefill dequant")) return;
    /* the bf16 kernels on the compact one-layer pool: decode rows are done
     * by decode_fp8 from the codes, so cu_attention sees none */
    ns_kv_layout l1 = *l;
    l1.n_layers = 1;
    l1.n_pages = (int32_t)f->scratch_pages;
    l1.dtype = NS_DT_BF16;
    l1.page_size_bytes = ns_kv_page_bytes(1, l->n_kv_heads, P, l->head_dim, NS_DT_BF16);
    uint8_t *kv_save = c->kv;
    int32_t *pt_save = m->page_table;
    const int32_t dec_save = m->n_dec;
    c->kv = reinterpret_cast<uint8_t *>(f->scratch);
    m->page_table = remap;
    m->n_dec = 0;
    cu_attention(c, &l1, out, out_bf, q, 0, n_heads, scale);
    c->kv = kv_save;
    m->page_table = pt_save;
    m->n_dec = dec_save;
}

void cu_attention_fp8(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                      int n_heads, float scale) {
    if (c->meta.n_tiles > 0) prefill_fp8(c, l, out, out_bf, q, layer, n_heads, scale);
    if (c->meta.n_dec > 0) decode_fp8(c, l, out, out_bf, q, layer, n_heads, scale);
}

void cu_kv_fp8_free(cu_impl *c) {
    cu_kv_fp8 *f = c->kv_fp8;
    if (!f) return;
    if (f->scratch) cudaFree(f->scratch);
    if (f->ints) cudaFree(f->ints);
    free(f);
    c->kv_fp8 = NULL;
}
