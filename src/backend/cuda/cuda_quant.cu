/* cuda_quant.cu — GGUF block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K) on the CUDA backend: upload, decode GEMV on the
 * blocks, prefill
 * through a bf16 dequantization scratch and cuBLASLt, embedding lookup.
 *
 * Device layout. A quantized weight holds exactly the file's bytes
 * (ns_tensor_bytes), but rearranged at upload from ggml's array of blocks
 * into up to three arrays over all nbt blocks of the tensor, so that every
 * load of the GEMV is an aligned, coalesced 16-byte load (ggml blocks of
 * 34, 18, 20, 22, 24 and 210 bytes are not 16-byte aligned):
 *   A: the quant bytes of each block      Q8_0 qs[32]; Q4_0/Q4_1/Q5_x qs[16];
 *                                          Q4_K qs[128]; Q5_K qh[32] qs[128];
 *                                          Q6_K ql[128] qh[64]
 *   B: 16 bytes of per-block scales        Q4_K/Q5_K d, dmin, scales[12];
 *                                          Q6_K scales[16]
 *   C: the f16 block scale                 Q8_0, Q4_0, Q6_K, Q5_0 d;
 *                                          Q4_1, Q5_1 d, m
 *   (Q5_0 and Q5_1 keep their 32 fifth bits, 4 bytes, as B.)
 * A = base, B = A + nbt*|A|, C = B + nbt*|B|. Nothing else is stored: no
 * dequantized copy of a weight stays in device memory.
 *
 * Decode GEMV (n <= CU_QGEMV_MAX rows). The activation rows are quantized
 * once per launch group (k_quant_x) into int8 blocks of 32 with an f32
 * scale dx and, per 16 values, s16 = dx * sum(q) (the k-quants' min term
 * and the Q4_0/Q6_K offsets need it). One warp per pair of weight rows
 * (the gate and up rows in the SwiGLU variant); lane l takes work units
 * l, l+32, ... of each row's A bytes (32 bytes for Q8_0/Q4_K/Q5_K, 16 for
 * Q4_0/Q6_K; consecutive lanes read consecutive bytes), unpacks them to
 * int8 in registers, dots them with the int8 activations (dp4a) and
 * accumulates in f32 with the block scales. Opt-in
 * (NS_CUDA_QGEMV_EARLY=1): inside recorded decode tapes the first weight
 * loads are issued before the PDL wait (the kernel before is the
 * activation quantization), by separate kernel instances (EARLY) that
 * read the activations with coherent ld.global.cg loads after one
 * converged wait; the first version read them through the read-only
 * ld.global.nc path after a divergent in-loop wait and gave wrong greedy
 * tokens for the Q6_K fixture on the H200 (see docs/cuda.md). Off by
 * default: measured 2.5-2.8x slower (GPU run A, 2026-12-01). The
 * result is exactly the product of the dequantized weights with the
 * 8-bit-quantized activations, up to f32 rounding: the same scheme as
 * llama.cpp and the CPU backend (whose activation blocks are Q8_0 / Q8_K;
 * ours have per-32 f32 scales, so results agree to the activation
 * rounding: ~2e-4 rel L2 for Q8_0/Q4_0, ~5e-3 for the k-quants, where
 * the CPU's Q8_K scales cover 256 values).
 *
 * Prefill (n > CU_QGEMV_MAX): the weight is dequantized into one bf16
 * scratch (sized for the largest quantized matrix, allocated at upload so
 * graph capture never allocates) and multiplied by cuBLASLt (cu_gemm).
 * That costs one extra pass of 2 bytes per weight written and read per
 * matmul; see docs/cuda.md.
 *
 * All kernels are graph-capturable (fixed scratch addresses, no host
 * synchronization) and their loops are bounded by the shapes.
 */
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

/* ------------------------------------------------------------ layout */

struct cu_quant {
    int8_t *xq;      /* [CU_QGEMV_MAX][x_k] quantized activations */
    float *xd;       /* [CU_QGEMV_MAX][x_k / 32] block scales */
    float *xs;       /* [CU_QGEMV_MAX][x_k / 16] dx * sum of 16 quants */
    int64_t x_k;     /* capacity in columns */
    bf16 *deq;       /* dequantization scratch for prefill */
    size_t deq_elems;
};

typedef struct qlayout {
    int qe;              /* values per block */
    int a, b, c;         /* bytes per block in the A/B/C arrays */
    int a_off, b_off, c_off; /* where they sit in ggml's block */
    int gb;              /* ggml block bytes */
} qlayout;

static bool layout_of(ns_dtype dt, qlayout *l) {
    switch (dt) {
    case NS_DT_Q8_0: *l = {32, 32, 0, 2, 2, 0, 0, 34}; return true;
    case NS_DT_Q4_0: *l = {32, 16, 0, 2, 2, 0, 0, 18}; return true;
    case NS_DT_Q4_K: *l = {256, 128, 16, 0, 16, 0, 0, 144}; return true;
    case NS_DT_Q5_K: *l = {256, 160, 16, 0, 16, 0, 0, 176}; return true;
    case NS_DT_Q6_K: *l = {256, 192, 16, 2, 0, 192, 208, 210}; return true;
    case NS_DT_Q4_1: *l = {32, 16, 0, 4, 4, 0, 0, 20}; return true;
    case NS_DT_Q5_0: *l = {32, 16, 4, 2, 6, 2, 0, 22}; return true;
    case NS_DT_Q5_1: *l = {32, 16, 4, 4, 8, 4, 0, 24}; return true;
    default: return false;
    }
}

/* Compile-time traits for the kernels (same numbers as layout_of).
 * CPB: GEMV work units per block (a lane's unit: 32 A bytes for Q8_0, Q4_K,
 * Q5_K and Q6_K, so the per-unit scale decoding is paid once per 64
 * values; 16 bytes for Q4_0); U: units of each row a lane loads before
 * using any.
 * MINB: CTAs of 128 threads per SM the GEMV is compiled for (its register
 * budget) for 1-2 input rows: as many warps as fit without spilling;
 * 3-8 rows (small decode batches) get more registers. */
template <int T> struct QT;
template <> struct QT<NS_DT_Q8_0> { enum { QE = 32, A = 32, B = 0, CPB = 1, MINB = 6, U = 2 }; };
template <> struct QT<NS_DT_Q4_0> { enum { QE = 32, A = 16, B = 0, CPB = 1, MINB = 6, U = 2 }; };
template <> struct QT<NS_DT_Q4_K> { enum { QE = 256, A = 128, B = 16, CPB = 4, MINB = 4, U = 2 }; };
template <> struct QT<NS_DT_Q5_K> { enum { QE = 256, A = 160, B = 16, CPB = 4, MINB = 4, U = 1 }; };
template <> struct QT<NS_DT_Q6_K> { enum { QE = 256, A = 192, B = 16, CPB = 4, MINB = 4, U = 1 }; };
template <> struct QT<NS_DT_Q4_1> { enum { QE = 32, A = 16, B = 0, CPB = 1, MINB = 6, U = 2 }; };
template <> struct QT<NS_DT_Q5_0> { enum { QE = 32, A = 16, B = 4, CPB = 1, MINB = 6, U = 2 }; };
template <> struct QT<NS_DT_Q5_1> { enum { QE = 32, A = 16, B = 4, CPB = 1, MINB = 6, U = 2 }; };
/* bytes per block of the C array */
template <int T> struct QC { enum { C = (T == NS_DT_Q4_1 || T == NS_DT_Q5_1) ? 4 : (T == NS_DT_Q4_K || T == NS_DT_Q5_K) ? 0 : 2 }; };

/* The three arrays of a weight of nbt blocks. */
struct qview {
    const uint8_t *a, *b, *c;
};

template <int T> __device__ __forceinline__ qview make_view(const uint8_t *base, size_t nbt) {
    qview v;
    v.a = base;
    v.b = base + nbt * QT<T>::A;
    v.c = v.b + nbt * QT<T>::B;
    return v;
}

__device__ __forceinline__ float ld_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short *>(p))));
}

__device__ __forceinline__ uint4 ldg4(const uint8_t *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block from the
 * scale words q[0..3] = m.y, q[4..7] = m.z, q[8..11] = m.w (ggml's
 * get_scale_min_k4 without indexing a register array). */
__device__ __forceinline__ void scale_min(int j, const uint4 &m, int &sc, int &mn) {
    const int jj = j & 3, sh = 8 * jj;
    const uint32_t a = (m.y >> sh) & 0xFF, b = (m.z >> sh) & 0xFF, c = (m.w >> sh) & 0xFF;
    if (j < 4) {
        sc = (int)(a & 63);
        mn = (int)(b & 63);
    } else {
        sc = (int)((c & 0xF) | ((a >> 6) << 4));
        mn = (int)((c >> 4) | ((b >> 6) << 4));
    }
}

/* --------------------------------------------- activation quantization */

/* One warp per block of 32 values: dx = amax / 127, q = rint(x / dx);
 * s16 = dx * sum of each half's quants. gather != NULL: the source rows
 * are gathered (row_blocks blocks per row). A non-finite value gives dx = NaN
 * (q = 0), so the products stay NaN and the engine reports the row. */
__global__ void k_quant_x(const float *__restrict__ x, int8_t *__restrict__ xq, float *__restrict__ xd,
                          float *__restrict__ xs, int64_t n_blocks, const int32_t *__restrict__ gather, int topk,
                          int64_t row_blocks) {
    PDL_ENTRY();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    /* gather (MoE, grouped): output row p holds token row gather[p] / topk */
    const int64_t src = gather ? (int64_t)(gather[b / row_blocks] / topk) * row_blocks + b % row_blocks : b;
    const float v = x[src * 32 + lane];
    float amax = fabsf(v);
    bool finite = amax <= 3.402823466e38f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __all_sync(0xffffffffu, finite);
    int q = 0;
    float d = 0.f;
    if (!finite) {
        d = __int_as_float(0x7fc00000);
    } else if (amax > 0.f) {
        d = amax / 127.f;
        q = __float2int_rn(v * (127.f / amax));
        q = q > 127 ? 127 : q < -127 ? -127 : q;
    }
    xq[b * 32 + lane] = (int8_t)q;
    int s = q;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) xd[b] = d;
    if ((lane & 15) == 0) xs[b * 2 + lane / 16] = finite ? d * (float)s : d;
}

/* ------------------------------------------------------------ GEMV */

/* One work unit of a weight row with what it needs besides. */
struct qraw {
    uint4 w, w2; /* A bytes (w2: second 16 bytes of 32-byte units) */
    uint4 h, h2; /* Q5_K/Q6_K high bits */
    uint4 m;     /* B bytes (Q4_K/Q5_K/Q6_K) */
    float d;     /* C scale (Q8_0, Q4_0, Q6_K, Q4_1, Q5_0, Q5_1) */
    float mn;    /* C minimum (Q4_1, Q5_1) */
    uint32_t qh; /* fifth bits (Q5_0, Q5_1) */
};

template <int T> __device__ __forceinline__ void chunk_load(const qview &v, size_t blk, int c, qraw &r) {
    if constexpr (T == NS_DT_Q8_0) {
        r.w = ldg4(v.a + blk * 32);
        r.w2 = ldg4(v.a + blk * 32 + 16);
        r.d = ld_f16(v.c + blk * 2);
    } else if constexpr (T == NS_DT_Q4_0) {
        r.w = ldg4(v.a + blk * 16);
        r.d = ld_f16(v.c + blk * 2);
    } else if constexpr (T == NS_DT_Q4_1 || T == NS_DT_Q5_0 || T == NS_DT_Q5_1) {
        r.w = ldg4(v.a + blk * 16);
        if constexpr (T == NS_DT_Q5_0) {
            r.d = ld_f16(v.c + blk * 2);
        } else {
            const uint32_t dm = __ldg(reinterpret_cast<const uint32_t *>(v.c + blk * 4));
            r.d = __half2float(__ushort_as_half((unsigned short)(dm & 0xFFFF)));
            r.mn = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
        }
        if constexpr (T != NS_DT_Q4_1) r.qh = __ldg(reinterpret_cast<const uint32_t *>(v.b + blk * 4));
    } else if constexpr (T == NS_DT_Q4_K) { /* unit c: qs[32c, 32c+32), sub-blocks 2c and 2c+1 */
        r.w = ldg4(v.a + blk * 128 + 32 * c);
        r.w2 = ldg4(v.a + blk * 128 + 32 * c + 16);
        r.m = ldg4(v.b + blk * 16);
    } else if constexpr (T == NS_DT_Q5_K) {
        r.w = ldg4(v.a + blk * 160 + 32 + 32 * c);
        r.w2 = ldg4(v.a + blk * 160 + 48 + 32 * c);
        r.h = ldg4(v.a + blk * 160);
        r.h2 = ldg4(v.a + blk * 160 + 16);
        r.m = ldg4(v.b + blk * 16);
    } else { /* unit c: ql[32c, 32c+32) = half c/2, positions 32(c&1)..+32 */
        const int h = c >> 1;
        r.w = ldg4(v.a + blk * 192 + 32 * c);
        r.w2 = ldg4(v.a + blk * 192 + 32 * c + 16);
        r.h = ldg4(v.a + blk * 192 + 128 + 32 * h);
        r.h2 = ldg4(v.a + blk * 192 + 128 + 32 * h + 16);
        r.m = ldg4(v.b + blk * 16);
        r.d = ld_f16(v.c + blk * 2);
    }
}

__device__ __forceinline__ int dot16(uint4 q, uint4 x) {
    int s = __dp4a((int)q.x, (int)x.x, 0);
    s = __dp4a((int)q.y, (int)x.y, s);
    s = __dp4a((int)q.z, (int)x.z, s);
    return __dp4a((int)q.w, (int)x.w, s);
}

__device__ __forceinline__ uint4 lo4(uint4 w) {
    return make_uint4(w.x & 0x0F0F0F0Fu, w.y & 0x0F0F0F0Fu, w.z & 0x0F0F0F0Fu, w.w & 0x0F0F0F0Fu);
}
__device__ __forceinline__ uint4 hi4(uint4 w) {
    return make_uint4((w.x >> 4) & 0x0F0F0F0Fu, (w.y >> 4) & 0x0F0F0F0Fu, (w.z >> 4) & 0x0F0F0F0Fu,
                      (w.w >> 4) & 0x0F0F0F0Fu);
}
/* q | ((h >> s) & mask) << 4, per byte */
__device__ __forceinline__ uint4 addhi(uint4 q, uint4 h, int s, uint32_t mask) {
    return make_uint4(q.x | (((h.x >> s) & mask) << 4), q.y | (((h.y >> s) & mask) << 4),
                      q.z | (((h.z >> s) & mask) << 4), q.w | (((h.w >> s) & mask) << 4));
}

/* Bits 0..3 of b as bit 4 of bytes 0..3 (the four multiplied copies of b
 * do not overlap, so the product is their OR). */
__device__ __forceinline__ uint32_t spread4(uint32_t b) { return ((b * 0x00204081u) & 0x01010101u) << 4; }

/* The 32 codes of a Q4_1/Q5_0/Q5_1 block: low nibbles (values 0..15) and
 * high nibbles (16..31), with the fifth bits of qh for Q5. */
template <int T> __device__ __forceinline__ void legacy_codes(const qraw &r, uint4 &lo, uint4 &hi) {
    lo = lo4(r.w);
    hi = hi4(r.w);
    if constexpr (T != NS_DT_Q4_1) {
        lo.x |= spread4(r.qh & 0xF), lo.y |= spread4((r.qh >> 4) & 0xF);
        lo.z |= spread4((r.qh >> 8) & 0xF), lo.w |= spread4((r.qh >> 12) & 0xF);
        hi.x |= spread4((r.qh >> 16) & 0xF), hi.y |= spread4((r.qh >> 20) & 0xF);
        hi.z |= spread4((r.qh >> 24) & 0xF), hi.w |= spread4(r.qh >> 28);
    }
}

/* Activation rows: n-th row's int8 values, block scales, 16-sums. */
struct qx {
    const int8_t *q;
    const float *d, *s;
    int K;
};

/* Activation loads. The activations are written by the kernel just
 * before (k_quant_x). CG = false: ld.global.nc, the read-only path, which
 * the PTX ISA allows only for data that stays unchanged for the whole life
 * of the kernel -- true enough when the PDL wait is the kernel's first
 * instruction. CG = true (early weight loads): ld.global.cg, an ordinary
 * coherent load from L2, which griddepcontrol.wait orders after the
 * producer's writes; nothing in the ISA orders a .nc load after it, the
 * most likely cause (not proven) of the early-load defect, see
 * docs/cuda.md. */
template <bool CG> __device__ __forceinline__ uint4 xl4(const uint8_t *p) {
    if constexpr (CG) return __ldcg(reinterpret_cast<const uint4 *>(p));
    else return __ldg(reinterpret_cast<const uint4 *>(p));
}
template <bool CG, typename V> __device__ __forceinline__ V xl(const V *p) {
    if constexpr (CG) return __ldcg(p);
    else return __ldg(p);
}

/* acc[n] += chunk c of block (row-local element offset xe) . x row n */
template <int T, int N, bool CG>
__device__ __forceinline__ void chunk_dot(const qraw &r, int c, int xe, const qx &x, float (&acc)[N]) {
    const int K = x.K;
    if constexpr (T == NS_DT_Q8_0) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint8_t *xr = (const uint8_t *)(x.q + (size_t)n * K + xe);
            const int s = dot16(r.w, xl4<CG>(xr)) + dot16(r.w2, xl4<CG>(xr + 16));
            acc[n] += r.d * xl<CG>(x.d + (size_t)n * (K / 32) + xe / 32) * (float)s;
        }
    } else if constexpr (T == NS_DT_Q4_0) {
        const uint4 ql = lo4(r.w), qh = hi4(r.w);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint8_t *xr = (const uint8_t *)(x.q + (size_t)n * K + xe);
            const int s = dot16(ql, xl4<CG>(xr)) + dot16(qh, xl4<CG>(xr + 16));
            const float *s16 = x.s + (size_t)n * (K / 16) + xe / 16;
            acc[n] += r.d * (xl<CG>(x.d + (size_t)n * (K / 32) + xe / 32) * (float)s - 8.f * (xl<CG>(s16) + xl<CG>(s16 + 1)));
        }
    } else if constexpr (T == NS_DT_Q4_1 || T == NS_DT_Q5_0 || T == NS_DT_Q5_1) {
        uint4 ql, qh;
        legacy_codes<T>(r, ql, qh);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint8_t *xr = (const uint8_t *)(x.q + (size_t)n * K + xe);
            const int s = dot16(ql, xl4<CG>(xr)) + dot16(qh, xl4<CG>(xr + 16));
            const float2 s16 = xl<CG>(reinterpret_cast<const float2 *>(x.s + (size_t)n * (K / 16) + xe / 16));
            const float dxs = xl<CG>(x.d + (size_t)n * (K / 32) + xe / 32) * (float)s, sx = s16.x + s16.y;
            if constexpr (T == NS_DT_Q5_0) acc[n] += r.d * (dxs - 16.f * sx);
            else acc[n] += r.d * dxs + r.mn * sx;
        }
    } else if constexpr (T == NS_DT_Q4_K || T == NS_DT_Q5_K) {
        /* unit c: sub-block 2c from the low nibbles, 2c+1 from the high */
        int sc0, m0, sc1, m1;
        scale_min(2 * c, r.m, sc0, m0);
        scale_min(2 * c + 1, r.m, sc1, m1);
        const float d = __half2float(__ushort_as_half((unsigned short)(r.m.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(r.m.x >> 16)));
        uint4 q0a = lo4(r.w), q0b = lo4(r.w2), q1a = hi4(r.w), q1b = hi4(r.w2);
        if constexpr (T == NS_DT_Q5_K) {
            q0a = addhi(q0a, r.h, 2 * c, 0x01010101u);
            q0b = addhi(q0b, r.h2, 2 * c, 0x01010101u);
            q1a = addhi(q1a, r.h, 2 * c + 1, 0x01010101u);
            q1b = addhi(q1b, r.h2, 2 * c + 1, 0x01010101u);
        }
        const int e0 = xe + 64 * c; /* x block e0/32 (even) and the next */
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint8_t *xr = (const uint8_t *)(x.q + (size_t)n * K + e0);
            const int s0 = dot16(q0a, xl4<CG>(xr)) + dot16(q0b, xl4<CG>(xr + 16));
            const int s1 = dot16(q1a, xl4<CG>(xr + 32)) + dot16(q1b, xl4<CG>(xr + 48));
            const float2 dx = xl<CG>(reinterpret_cast<const float2 *>(x.d + (size_t)n * (K / 32) + e0 / 32));
            const float4 xs = xl<CG>(reinterpret_cast<const float4 *>(x.s + (size_t)n * (K / 16) + e0 / 16));
            acc[n] += d * ((float)sc0 * dx.x * (float)s0 + (float)sc1 * dx.y * (float)s1) -
                      dmin * ((float)m0 * (xs.x + xs.y) + (float)m1 * (xs.z + xs.w));
        }
    } else {
        /* unit c of a Q6_K block: half h = c/2, positions l = 32q + 0..31
         * (q = c&1) of ql and qh[l] (bits 2q..2q+1 low, 2q+4.. high): the
         * values 128h + 32q + i (low nibbles) and the same + 64 (high),
         * groups of 16: 8h+2q, +1 (low) and 8h+2q+4, +5 (high) */
        const int h = c >> 1, q = c & 1, sh = 2 * q;
        const uint4 qla = addhi(lo4(r.w), r.h, sh, 0x03030303u), qlb = addhi(lo4(r.w2), r.h2, sh, 0x03030303u);
        const uint4 qha = addhi(hi4(r.w), r.h, sh + 4, 0x03030303u), qhb = addhi(hi4(r.w2), r.h2, sh + 4, 0x03030303u);
        const uint32_t wl = h ? r.m.z : r.m.x, wh = h ? r.m.w : r.m.y;
        const float sa = (float)(int8_t)(wl >> (16 * q)), sb = (float)(int8_t)(wl >> (16 * q + 8));
        const float sc = (float)(int8_t)(wh >> (16 * q)), sd = (float)(int8_t)(wh >> (16 * q + 8));
        const int e0 = xe + 128 * h + 32 * q, e1 = e0 + 64;
#pragma unroll
        for (int n = 0; n < N; n++) {
            const uint8_t *xr = (const uint8_t *)(x.q + (size_t)n * K);
            const int s_la = dot16(qla, xl4<CG>(xr + e0)), s_lb = dot16(qlb, xl4<CG>(xr + e0 + 16));
            const int s_ha = dot16(qha, xl4<CG>(xr + e1)), s_hb = dot16(qhb, xl4<CG>(xr + e1 + 16));
            const float *xd = x.d + (size_t)n * (K / 32);
            const float dx0 = xl<CG>(xd + e0 / 32), dx1 = xl<CG>(xd + e1 / 32);
            const float2 s0 = xl<CG>(reinterpret_cast<const float2 *>(x.s + (size_t)n * (K / 16) + e0 / 16));
            const float2 s1 = xl<CG>(reinterpret_cast<const float2 *>(x.s + (size_t)n * (K / 16) + e1 / 16));
            acc[n] += r.d * (sa * (dx0 * (float)s_la - 32.f * s0.x) + sb * (dx0 * (float)s_lb - 32.f * s0.y) +
                             sc * (dx1 * (float)s_ha - 32.f * s1.x) + sd * (dx1 * (float)s_hb - 32.f * s1.y));
        }
    }
}

/* Warp-wide dot products of two weight rows (v0, r0) and (v1, r1) with
 * the N activation rows (every lane gets the sums). Per lane, U units of
 * each row are loaded before any is used (2-4 KB in flight per warp), and
 * the two rows share the activation loads.
 * CG: the activations are read through coherent loads (xl4/xl).
 * early (NS_CUDA_QGEMV_EARLY=1, only with CG): the kernel has not waited
 * for the previous one (the activations' quantization) yet; the first
 * round of weight loads is issued, then every lane of the warp executes
 * the PDL wait at the same point, converged (lanes with no block of their
 * own included), and only then is any activation read. */
template <int T, int N, bool CG>
__device__ __forceinline__ void rows_dot2(const qview &v0, int64_t r0, const qview &v1, int64_t r1, const qx &x,
                                          float (&a0)[N], float (&a1)[N], bool early) {
    constexpr int QE = QT<T>::QE, CPB = QT<T>::CPB, U = QT<T>::U;
    /* lane l takes unit l % CPB of blocks l / CPB, + 32 / CPB, ...: its
     * unit inside a block never changes, and there is no division in the
     * loop */
    constexpr int BS = 32 / CPB;
    const int lane = threadIdx.x & 31, c = lane % CPB, first = lane / CPB;
    const int nb = x.K / QE;
    const size_t b0 = (size_t)r0 * nb, b1 = (size_t)r1 * nb;
#pragma unroll
    for (int n = 0; n < N; n++) a0[n] = a1[n] = 0.f;
    for (int bl = first, round = 0;; bl += BS * U, round++) {
        if (!early && bl >= nb) break;
        qraw p[U], q[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = bl + BS * u;
            if (b < nb) {
                chunk_load<T>(v0, b0 + b, c, p[u]);
                chunk_load<T>(v1, b1 + b, c, q[u]);
            }
        }
        if (CG && early) {
            if (round == 0) {
                __syncwarp();
                PDL_WAIT();
            }
            if (bl >= nb) break;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = bl + BS * u;
            if (b < nb) {
                chunk_dot<T, N, CG>(p[u], c, b * QE, x, a0);
                chunk_dot<T, N, CG>(q[u], c, b * QE, x, a1);
            }
        }
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
        a0[n] = cu_warp_sum(a0[n]);
        a1[n] = cu_warp_sum(a1[n]);
    }
}

/* Up to 3 weight matrices of one type sharing the input; SwiGLU mode:
 * segment 0 is gate, 1 is up, o[2] the SwiGLU output (obf its shadow). */
struct qsegs {
    const uint8_t *w[3];
    size_t nbt[3];
    float *o[3];
    bf16 *obf;
    int end[3]; /* cumulative row ends */
    int early;  /* weights loaded before the PDL wait (see qgemv_early; CG kernels only) */
};

/* Segment, row inside it and its row count for concatenated row r. */
template <int T>
__device__ __forceinline__ qview seg_of(const qsegs &sg, int64_t r, float *&o, int64_t &local, int &M) {
    const int s = r >= sg.end[1] ? 2 : r >= sg.end[0] ? 1 : 0;
    local = s == 2 ? r - sg.end[1] : s == 1 ? r - sg.end[0] : r;
    M = s == 2 ? sg.end[2] - sg.end[1] : s == 1 ? sg.end[1] - sg.end[0] : sg.end[0];
    o = s == 2 ? sg.o[2] : s == 1 ? sg.o[1] : sg.o[0];
    return make_view<T>(s == 2 ? sg.w[2] : s == 1 ? sg.w[1] : sg.w[0],
                        s == 2 ? sg.nbt[2] : s == 1 ? sg.nbt[1] : sg.nbt[0]);
}

/* One warp per pair of weight rows: rows 2p and 2p+1 of the concatenated
 * segments, or (SwiGLU) row p of gate and of up. */
template <int T, int N, bool SW, bool CG>
__global__ __launch_bounds__(128, N == 1 ? (int)QT<T>::MINB : N == 2 ? (int)QT<T>::MINB * 3 / 4 : N <= 4 ? 3 : 2) void k_qgemv(qsegs sg, qx x) {
    const bool early = CG && sg.early != 0;
    if (early) PDL_TRIGGER(); /* rows_dot2 waits */
    else PDL_ENTRY();
    const int64_t pair = (int64_t)blockIdx.x * 4 + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    float a0[N], a1[N];
    if constexpr (SW) {
        const int M = sg.end[0];
        if (pair >= M) return; /* whole warps leave together; no barrier follows */
        rows_dot2<T, N, CG>(make_view<T>(sg.w[0], sg.nbt[0]), pair, make_view<T>(sg.w[1], sg.nbt[1]), pair, x, a0, a1,
                            early);
        if (lane == 0) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                /* what the unfused ops leave: gate, up, then silu(gate)*up
                 * (the output may be gate itself, so it is written last) */
                const float g = a0[n], u = a1[n], y = g / (1.0f + expf(-g)) * u;
                sg.o[0][(size_t)n * M + pair] = g;
                sg.o[1][(size_t)n * M + pair] = u;
                sg.o[2][(size_t)n * M + pair] = y;
                if (sg.obf) sg.obf[(size_t)n * M + pair] = __float2bfloat16_rn(y);
            }
        }
    } else {
        const int64_t ra = 2 * pair;
        if (ra >= sg.end[2]) return;
        const int64_t rb = ra + 1 < sg.end[2] ? ra + 1 : ra;
        float *oa, *ob;
        int64_t la, lb;
        int Ma, Mb;
        const qview va = seg_of<T>(sg, ra, oa, la, Ma), vb = seg_of<T>(sg, rb, ob, lb, Mb);
        rows_dot2<T, N, CG>(va, la, vb, lb, x, a0, a1, early);
        if (lane == 0) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                oa[(size_t)n * Ma + la] = a0[n];
                if (rb != ra) ob[(size_t)n * Mb + lb] = a1[n];
            }
        }
    }
}

typedef void (*qgemv_fn)(qsegs, qx);

#define QG_ROW(T, SW, EA)                                                                                \
    {k_qgemv<T, 1, SW, EA>, k_qgemv<T, 2, SW, EA>, k_qgemv<T, 3, SW, EA>, k_qgemv<T, 4, SW, EA>,       \
     k_qgemv<T, 5, SW, EA>, k_qgemv<T, 6, SW, EA>, k_qgemv<T, 7, SW, EA>, k_qgemv<T, 8, SW, EA>}

static int type_index(ns_dtype dt) {
    switch (dt) {
    case NS_DT_Q8_0: return 0;
    case NS_DT_Q4_0: return 1;
    case NS_DT_Q4_K: return 2;
    case NS_DT_Q5_K: return 3;
    case NS_DT_Q6_K: return 4;
    case NS_DT_Q4_1: return 5;
    case NS_DT_Q5_0: return 6;
    case NS_DT_Q5_1: return 7;
    default: return -1;
    }
}

#define QG_TYPES(SW, EA)                                                                                     \
    {QG_ROW(NS_DT_Q8_0, SW, EA), QG_ROW(NS_DT_Q4_0, SW, EA), QG_ROW(NS_DT_Q4_K, SW, EA),                     \
     QG_ROW(NS_DT_Q5_K, SW, EA), QG_ROW(NS_DT_Q6_K, SW, EA), QG_ROW(NS_DT_Q4_1, SW, EA),                     \
     QG_ROW(NS_DT_Q5_0, SW, EA), QG_ROW(NS_DT_Q5_1, SW, EA)}

static qgemv_fn pick_gemv(ns_dtype dt, int n, bool sw, bool cg) {
    static const qgemv_fn fns[2][2][8][8] = {{QG_TYPES(false, false), QG_TYPES(true, false)},
                                             {QG_TYPES(false, true), QG_TYPES(true, true)}};
    const int ti = type_index(dt);
    if (ti < 0 || n < 1 || n > CU_QGEMV_MAX) return NULL;
    return fns[cg][sw][ti][n - 1];
}

/* Quantizes rows [0, n) of x (n <= CU_QGEMV_MAX, k <= x_k) into the
 * activation scratch. */
static bool quantize_x(cu_impl *c, const float *x, int n, int k, qx *out) {
    cu_quant *q = c->quant;
    if (!q || !q->xq || k > q->x_k || k % 32) {
        cu_check(c, cudaErrorInvalidValue, "quantized GEMV: activation scratch missing or too small");
        return false;
    }
    const int64_t nblk = (int64_t)n * (k / 32);
    cu_launch(c, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, x, q->xq, q->xd, q->xs, nblk,
              (const int32_t *)NULL, 1, (int64_t)1);
    if (CU_LAUNCHED(c, "quantize activations")) return false;
    out->q = q->xq;
    out->d = q->xd;
    out->s = q->xs;
    out->K = k;
    return true;
}

/* Weight loads before the PDL wait (NS_CUDA_QGEMV_EARLY=1; default off
 * since the 2026-12-01 H200 run, where the first version, reading the
 * activations through ld.global.nc, made test_quant_cuda's Q6_K greedy
 * continuation leave the CPU backend's; the EARLY kernels now read them
 * with coherent loads after one converged wait, see xl4 and docs/cuda.md):
 * only inside recorded decode tapes whose ops write no weight
 * (c->tape_early), where the kernel before the GEMV is the small
 * activation quantization, so the first weight bytes stream while it
 * runs. */
static int qgemv_early(const cu_impl *c) { return c->qgemv_early && c->tape_early; }

/* The CG kernels (coherent activation loads) run for early loads and
 * with NS_CUDA_ACT_NC=0 (c->act_nc, the switch of the other decode
 * kernels' activation loads); otherwise the .nc ones. */
static bool qgemv_cg(const cu_impl *c, const qsegs &sg) { return sg.early || !c->act_nc; }

static size_t nblocks(const ns_tensor *w) {
    qlayout l;
    if (!layout_of((ns_dtype)w->dtype, &l)) return 0;
    return (size_t)w->rows * (size_t)(w->cols / l.qe);
}

void cu_quant_gemv_multi(cu_impl *c, int nseg, float *const *out, const ns_tensor *const *w, const float *x, int n,
                         int k) {
    const ns_dtype dt = (ns_dtype)w[0]->dtype;
    for (int n0 = 0; n0 < n; n0 += CU_QGEMV_MAX) {
        const int nn = n - n0 < CU_QGEMV_MAX ? n - n0 : CU_QGEMV_MAX;
        qx xv;
        if (!quantize_x(c, x + (size_t)n0 * k, nn, k, &xv)) return;
        qsegs sg;
        memset(&sg, 0, sizeof sg);
        sg.early = qgemv_early(c);
        int end = 0;
        for (int s = 0; s < 3; s++) {
            if (s < nseg) {
                sg.w[s] = (const uint8_t *)w[s]->data;
                sg.nbt[s] = nblocks(w[s]);
                sg.o[s] = out[s] + (size_t)n0 * w[s]->rows;
                end += (int)w[s]->rows;
            }
            sg.end[s] = end;
        }
        const qgemv_fn fn = pick_gemv(dt, nn, false, qgemv_cg(c, sg));
        if (!fn) {
            cu_check(c, cudaErrorInvalidValue, "quantized GEMV: unsupported type");
            return;
        }
        const int pairs = (end + 1) / 2;
        cu_launch(c, fn, dim3((unsigned)((pairs + 3) / 4)), dim3(128), 0, sg, xv);
        if (CU_LAUNCHED(c, "quantized GEMV")) return;
    }
}

void cu_quant_gemv_swiglu(cu_impl *c, float *gate, float *up, float *out, bf16 *out_bf, const ns_tensor *wg,
                          const ns_tensor *wu, const float *x, int n, int k) {
    const int64_t m = wg->rows;
    for (int n0 = 0; n0 < n; n0 += CU_QGEMV_MAX) {
        const int nn = n - n0 < CU_QGEMV_MAX ? n - n0 : CU_QGEMV_MAX;
        qx xv;
        if (!quantize_x(c, x + (size_t)n0 * k, nn, k, &xv)) return;
        qsegs sg;
        memset(&sg, 0, sizeof sg);
        sg.early = qgemv_early(c);
        sg.w[0] = (const uint8_t *)wg->data;
        sg.w[1] = (const uint8_t *)wu->data;
        sg.nbt[0] = nblocks(wg);
        sg.nbt[1] = nblocks(wu);
        sg.o[0] = gate + (size_t)n0 * m;
        sg.o[1] = up + (size_t)n0 * m;
        sg.o[2] = out + (size_t)n0 * m;
        sg.obf = out_bf ? out_bf + (size_t)n0 * m : NULL;
        sg.end[0] = (int)m;
        sg.end[1] = sg.end[2] = (int)(2 * m);
        const qgemv_fn fn = pick_gemv((ns_dtype)wg->dtype, nn, true, qgemv_cg(c, sg));
        if (!fn) {
            cu_check(c, cudaErrorInvalidValue, "quantized GEMV: unsupported type");
            return;
        }
        cu_launch(c, fn, dim3((unsigned)((m + 3) / 4)), dim3(128), 0, sg, xv);
        if (CU_LAUNCHED(c, "quantized GEMV+SwiGLU")) return;
    }
}

/* ------------------------------------------------------- dequantization */

/* The 16 values of group g (0 .. QE/16-1) of block blk. */
template <int T> __device__ __forceinline__ void deq16(const qview &v, size_t blk, int g, float (&y)[16]) {
    uint8_t q[16];
    if constexpr (T == NS_DT_Q8_0) {
        const float d = ld_f16(v.c + blk * 2);
        *reinterpret_cast<uint4 *>(q) = ldg4(v.a + blk * 32 + 16 * g);
#pragma unroll
        for (int i = 0; i < 16; i++) y[i] = d * (float)(int8_t)q[i];
    } else if constexpr (T == NS_DT_Q4_0) {
        const float d = ld_f16(v.c + blk * 2);
        *reinterpret_cast<uint4 *>(q) = ldg4(v.a + blk * 16);
#pragma unroll
        for (int i = 0; i < 16; i++) y[i] = d * (float)((g ? q[i] >> 4 : q[i] & 0xF) - 8);
    } else if constexpr (T == NS_DT_Q4_1 || T == NS_DT_Q5_0 || T == NS_DT_Q5_1) {
        qraw r;
        chunk_load<T>(v, blk, 0, r);
        uint4 lo, hi;
        legacy_codes<T>(r, lo, hi);
        *reinterpret_cast<uint4 *>(q) = g ? hi : lo;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            if constexpr (T == NS_DT_Q5_0) y[i] = r.d * (float)((int)q[i] - 16);
            else y[i] = (float)q[i] * r.d + r.mn;
        }
    } else if constexpr (T == NS_DT_Q4_K || T == NS_DT_Q5_K) {
        const uint4 m = ldg4(v.b + blk * 16);
        const int j = g >> 1, hh = g & 1;
        int sc, mn;
        scale_min(j, m, sc, mn);
        const float d = __half2float(__ushort_as_half((unsigned short)(m.x & 0xFFFF))) * (float)sc;
        const float dm = __half2float(__ushort_as_half((unsigned short)(m.x >> 16))) * (float)mn;
        const int qoff = T == NS_DT_Q5_K ? 32 : 0, bb = T == NS_DT_Q5_K ? 160 : 128;
        *reinterpret_cast<uint4 *>(q) = ldg4(v.a + blk * bb + qoff + 32 * (j >> 1) + 16 * hh);
        uint8_t qh[16];
        if constexpr (T == NS_DT_Q5_K) *reinterpret_cast<uint4 *>(qh) = ldg4(v.a + blk * 160 + 16 * hh);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int val = (j & 1) ? q[i] >> 4 : q[i] & 0xF;
            if constexpr (T == NS_DT_Q5_K) val += ((qh[i] >> j) & 1) << 4;
            y[i] = d * (float)val - dm;
        }
    } else {
        const int h = g >> 3, e = 16 * (g & 7), qq = e >> 5, l = e & 31;
        const float d = ld_f16(v.c + blk * 2) * (float)(int8_t)__ldg(v.b + blk * 16 + g);
        *reinterpret_cast<uint4 *>(q) = ldg4(v.a + blk * 192 + 64 * h + l + 32 * (qq & 1));
        uint8_t qh[16];
        *reinterpret_cast<uint4 *>(qh) = ldg4(v.a + blk * 192 + 128 + 32 * h + l);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int lo = qq >= 2 ? q[i] >> 4 : q[i] & 0xF;
            y[i] = d * (float)((lo | (((qh[i] >> (2 * qq)) & 3) << 4)) - 32);
        }
    }
}

/* The whole weight (groups of 16) to bf16, row-major. */
template <int T> __global__ void k_dequant_bf16(const uint8_t *w, size_t nbt, bf16 *out, size_t n_groups) {
    PDL_ENTRY();
    const size_t gi = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= n_groups) return;
    constexpr int GPB = QT<T>::QE / 16;
    float y[16];
    deq16<T>(make_view<T>(w, nbt), gi / GPB, (int)(gi % GPB), y);
    __align__(16) bf16 o[16];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i] = __float2bfloat16_rn(y[i]);
    uint4 *dst = reinterpret_cast<uint4 *>(out + gi * 16);
    dst[0] = reinterpret_cast<const uint4 *>(o)[0];
    dst[1] = reinterpret_cast<const uint4 *>(o)[1];
}

/* out[t, :] = table[tokens[t], :], one block per token. */
template <int T>
__global__ void k_qembed(float *out, const uint8_t *w, size_t nbt, const int32_t *tokens, int dim) {
    PDL_ENTRY();
    constexpr int GPB = QT<T>::QE / 16;
    const int t = blockIdx.x;
    const qview v = make_view<T>(w, nbt);
    const size_t row_blk = (size_t)tokens[t] * (size_t)(dim / QT<T>::QE);
    for (int g = threadIdx.x; g < dim / 16; g += blockDim.x) {
        float y[16];
        deq16<T>(v, row_blk + g / GPB, g % GPB, y);
        float4 *dst = reinterpret_cast<float4 *>(out + (size_t)t * dim + 16 * g);
#pragma unroll
        for (int i = 0; i < 4; i++) dst[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
    }
}

void cu_quant_embed(cu_impl *c, float *out, const ns_tensor *table, int n_tokens) {
    if (n_tokens <= 0) return;
    if (n_tokens > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "embed: more rows than the batch has tokens");
        return;
    }
    const size_t nbt = nblocks(table);
    const uint8_t *w = (const uint8_t *)table->data;
    const int dim = (int)table->cols;
    switch ((ns_dtype)table->dtype) {
    case NS_DT_Q8_0: cu_launch(c, k_qembed<NS_DT_Q8_0>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q4_0: cu_launch(c, k_qembed<NS_DT_Q4_0>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q4_K: cu_launch(c, k_qembed<NS_DT_Q4_K>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q5_K: cu_launch(c, k_qembed<NS_DT_Q5_K>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q6_K: cu_launch(c, k_qembed<NS_DT_Q6_K>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q4_1: cu_launch(c, k_qembed<NS_DT_Q4_1>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q5_0: cu_launch(c, k_qembed<NS_DT_Q5_0>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    case NS_DT_Q5_1: cu_launch(c, k_qembed<NS_DT_Q5_1>, dim3(n_tokens), dim3(128), 0, out, w, nbt, c->meta.tokens, dim); break;
    default: cu_check(c, cudaErrorInvalidValue, "embed: not a quantized table"); return;
    }
    CU_LAUNCHED(c, "quantized embed");
}

static void launch_dequant(cu_impl *c, const ns_tensor *w, bf16 *dst) {
    const size_t nbt = nblocks(w), groups = (size_t)w->rows * (size_t)w->cols / 16;
    const dim3 grid((unsigned)((groups + 255) / 256)), block(256);
    const uint8_t *p = (const uint8_t *)w->data;
    switch ((ns_dtype)w->dtype) {
    case NS_DT_Q8_0: cu_launch(c, k_dequant_bf16<NS_DT_Q8_0>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q4_0: cu_launch(c, k_dequant_bf16<NS_DT_Q4_0>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q4_K: cu_launch(c, k_dequant_bf16<NS_DT_Q4_K>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q5_K: cu_launch(c, k_dequant_bf16<NS_DT_Q5_K>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q6_K: cu_launch(c, k_dequant_bf16<NS_DT_Q6_K>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q4_1: cu_launch(c, k_dequant_bf16<NS_DT_Q4_1>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q5_0: cu_launch(c, k_dequant_bf16<NS_DT_Q5_0>, grid, block, 0, p, nbt, dst, groups); break;
    case NS_DT_Q5_1: cu_launch(c, k_dequant_bf16<NS_DT_Q5_1>, grid, block, 0, p, nbt, dst, groups); break;
    default: cu_check(c, cudaErrorInvalidValue, "dequantize: not a quantized weight"); return;
    }
    CU_LAUNCHED(c, "dequantize weight");
}

void cu_quant_matmul(cu_impl *c, float *out, const float *in, const bf16 *in_bf, const ns_tensor *w, int64_t n) {
    const int64_t m = w->rows, k = w->cols;
    if (n <= CU_QGEMV_MAX) {
        float *o[1] = {out};
        const ns_tensor *ws[1] = {w};
        cu_quant_gemv_multi(c, 1, o, ws, in, (int)n, (int)k);
        return;
    }
    cu_quant *q = c->quant;
    if (!q || !q->deq || (size_t)(m * k) > q->deq_elems || !in_bf) {
        cu_check(c, cudaErrorInvalidValue, "quantized matmul: dequantization scratch missing or too small");
        return;
    }
    launch_dequant(c, w, q->deq);
    if (c->err_status != NS_OK) return;
    cu_gemm(c, out, in_bf, in, q->deq, n, m, k);
}

/* -------------------------------------------------- MoE experts on blocks */

/* cuda_moe.cu's quantized experts (the op and its scratch are there).
 * tab holds the 3E expert base pointers (gate [0,E), up [E,2E), down
 * [2E,3E)), each expert uploaded on its own in this file's A/B/C layout.
 * Gate and up share one type (cu_moe_prepare checks it; the GGUF loader
 * refuses other files at load); down may differ (Q4_K_M files keep some
 * layers' down in Q6_K). The dot products are rows_dot2's and the
 * dequantization deq16's: one implementation of each block format. */

/* Row `row` of the quantized activation rows x, as a one-row qx. */
__device__ __forceinline__ qx qx_row(const qx &x, int64_t row) {
    qx r = x;
    r.q += row * x.K;
    r.d += row * (x.K / 32);
    r.s += row * (x.K / 16);
    return r;
}

/* Gathered GEMV gate/up with SwiGLU: warp w of block (bx, slot) computes
 * row f = 4 bx + w of the slot's expert's gate and up (one row pair per
 * warp, rows_dot2's shared activation loads): h[slot, f] = silu(g) u.
 * x: one quantized row of H per token. Only the chosen experts' blocks
 * are read. */
template <int T>
__global__ __launch_bounds__(128) void k_qmoe_gu(const uint8_t *const *__restrict__ tab,
                                                  const int32_t *__restrict__ ids, int K, int E, int F, qx x,
                                                  float *__restrict__ h) {
    PDL_ENTRY();
    const int f = blockIdx.x * 4 + threadIdx.x / 32, slot = blockIdx.y;
    if (f >= F) return; /* whole warps leave together */
    const int e = ids[slot];
    const size_t nbt = (size_t)F * (size_t)(x.K / QT<T>::QE);
    float g[1], u[1];
    rows_dot2<T, 1, false>(make_view<T>(tab[e], nbt), f, make_view<T>(tab[E + e], nbt), f, qx_row(x, slot / K), g,
                           u, false);
    if ((threadIdx.x & 31) == 0) h[(size_t)slot * F + f] = g[0] / (1.0f + expf(-g[0])) * u[0];
}

/* Gathered GEMV, down: warp w of block (bx, slot) computes rows r and r+1
 * (r = 2 (4 bx + w)) of the slot's expert's down projection on the slot's
 * quantized h row (K = F): y[slot, r]. The combine (cuda_moe.cu) adds the
 * token's experts in ascending order. */
template <int T>
__global__ __launch_bounds__(128) void k_qmoe_down(const uint8_t *const *__restrict__ tab,
                                                    const int32_t *__restrict__ ids, int E, int H, qx hq,
                                                    float *__restrict__ y) {
    PDL_ENTRY();
    const int r = 2 * (blockIdx.x * 4 + threadIdx.x / 32), slot = blockIdx.y;
    if (r >= H) return;
    const int r1 = r + 1 < H ? r + 1 : r;
    const int e = ids[slot];
    const qview v = make_view<T>(tab[2 * E + e], (size_t)H * (size_t)(hq.K / QT<T>::QE));
    float a0[1], a1[1];
    rows_dot2<T, 1, false>(v, r, v, r1, qx_row(hq, slot), a0, a1, false);
    if ((threadIdx.x & 31) == 0) {
        y[(size_t)slot * H + r] = a0[0];
        if (r1 != r) y[(size_t)slot * H + r1] = a1[0];
    }
}

/* Grouped GEMVs for a few slots per expert (batched decode): block
 * (bx, e) walks expert e's segment [offs[e], offs[e+1]) of the sorted
 * slots up to four at a time. The segment's quantized activation rows are
 * contiguous (quantized in sorted order, gathered), so rows_dot2 takes n
 * rows at once, n = the slots left (1-4; the kernels are issue-bound, so
 * a pass never computes rows it drops). Each weight row is streamed from
 * HBM once per expert (later passes hit L2).
 * Gate/up: warp w computes row f = 4 bx + w, h[p, f] = silu(g) u. */
template <int T, int N>
__device__ __forceinline__ void ggu_pass(const qview &vg, const qview &vu, int f, const qx &x, int p0, int F,
                                         float *__restrict__ h) {
    float g[N], u[N];
    rows_dot2<T, N, false>(vg, f, vu, f, qx_row(x, p0), g, u, false);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < N; j++) h[(size_t)(p0 + j) * F + f] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

template <int T>
__global__ __launch_bounds__(128) void k_qmoe_ggu(const uint8_t *const *__restrict__ tab,
                                                   const int32_t *__restrict__ offs, int E, int F, int TK, qx x,
                                                   float *__restrict__ h) {
    PDL_ENTRY();
    const int f = blockIdx.x * 4 + threadIdx.x / 32, e = blockIdx.y;
    const int s0 = offs[e], s1 = min(offs[e + 1], TK);
    if (f >= F || s0 >= s1) return;
    const size_t nbt = (size_t)F * (size_t)(x.K / QT<T>::QE);
    const qview vg = make_view<T>(tab[e], nbt), vu = make_view<T>(tab[E + e], nbt);
    for (int p0 = s0; p0 < s1; p0 += 4) {
        switch (s1 - p0) { /* the same for the whole block: no divergence */
        case 1: ggu_pass<T, 1>(vg, vu, f, x, p0, F, h); break;
        case 2: ggu_pass<T, 2>(vg, vu, f, x, p0, F, h); break;
        case 3: ggu_pass<T, 3>(vg, vu, f, x, p0, F, h); break;
        default: ggu_pass<T, 4>(vg, vu, f, x, p0, F, h); break;
        }
    }
}

/* Down: warp w of block (bx, e) computes rows r, r+1 (r = 2 (4 bx + w))
 * of expert e's down projection for its segment: y[p, r]. */
template <int T, int N>
__device__ __forceinline__ void gdown_pass(const qview &v, int r, int r1, const qx &hq, int p0, int H,
                                           float *__restrict__ y) {
    float a0[N], a1[N];
    rows_dot2<T, N, false>(v, r, v, r1, qx_row(hq, p0), a0, a1, false);
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int j = 0; j < N; j++) {
            y[(size_t)(p0 + j) * H + r] = a0[j];
            if (r1 != r) y[(size_t)(p0 + j) * H + r1] = a1[j];
        }
    }
}

template <int T>
__global__ __launch_bounds__(128) void k_qmoe_gdown(const uint8_t *const *__restrict__ tab,
                                                     const int32_t *__restrict__ offs, int E, int H, int TK, qx hq,
                                                     float *__restrict__ y) {
    PDL_ENTRY();
    const int r = 2 * (blockIdx.x * 4 + threadIdx.x / 32), e = blockIdx.y;
    const int s0 = offs[e], s1 = min(offs[e + 1], TK);
    if (r >= H || s0 >= s1) return;
    const int r1 = r + 1 < H ? r + 1 : r;
    const qview v = make_view<T>(tab[2 * E + e], (size_t)H * (size_t)(hq.K / QT<T>::QE));
    for (int p0 = s0; p0 < s1; p0 += 4) {
        switch (s1 - p0) {
        case 1: gdown_pass<T, 1>(v, r, r1, hq, p0, H, y); break;
        case 2: gdown_pass<T, 2>(v, r, r1, hq, p0, H, y); break;
        case 3: gdown_pass<T, 3>(v, r, r1, hq, p0, H, y); break;
        default: gdown_pass<T, 4>(v, r, r1, hq, p0, H, y); break;
        }
    }
}

/* Experts w0 .. w0+E-1 of the table (each rows x cols) to bf16 at
 * out + e rows cols, groups of 16 values per thread; experts no token
 * chose (counts[e] == 0, from the router on the device) are skipped. The
 * first thread of every expert writes its bf16 pointer to bftab[w0 + e],
 * so the grouped GEMM reads the copies through an ordinary table. */
template <int T>
__global__ void k_qmoe_deq(const uint8_t *const *__restrict__ tab, int w0, int E, int64_t rows, int64_t cols,
                           const int32_t *__restrict__ counts, bf16 *__restrict__ out, const bf16 **bftab) {
    PDL_ENTRY();
    constexpr int GPB = QT<T>::QE / 16;
    const int64_t gpe = rows * cols / 16; /* groups per expert */
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= gpe * E) return;
    const int e = (int)(gi / gpe);
    const int64_t li = gi - (int64_t)e * gpe;
    bf16 *dst = out + (size_t)e * (size_t)(rows * cols);
    if (li == 0) bftab[w0 + e] = dst;
    if (counts[e] == 0) return;
    float yv[16];
    deq16<T>(make_view<T>(tab[w0 + e], (size_t)rows * (size_t)(cols / QT<T>::QE)), (size_t)(li / GPB),
             (int)(li % GPB), yv);
    __align__(16) bf16 o[16];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i] = __float2bfloat16_rn(yv[i]);
    uint4 *d4 = reinterpret_cast<uint4 *>(dst + li * 16);
    d4[0] = reinterpret_cast<const uint4 *>(o)[0];
    d4[1] = reinterpret_cast<const uint4 *>(o)[1];
}

/* Calls LAUNCH(T) with T the compile-time type of dt; false when dt is
 * not a quantized type this file takes. */
#define QMOE_DISPATCH(dt, LAUNCH)                      \
    switch (dt) {                                      \
    case NS_DT_Q8_0: LAUNCH(NS_DT_Q8_0); break;        \
    case NS_DT_Q4_0: LAUNCH(NS_DT_Q4_0); break;        \
    case NS_DT_Q4_K: LAUNCH(NS_DT_Q4_K); break;        \
    case NS_DT_Q5_K: LAUNCH(NS_DT_Q5_K); break;        \
    case NS_DT_Q6_K: LAUNCH(NS_DT_Q6_K); break;        \
    case NS_DT_Q4_1: LAUNCH(NS_DT_Q4_1); break;        \
    case NS_DT_Q5_0: LAUNCH(NS_DT_Q5_0); break;        \
    case NS_DT_Q5_1: LAUNCH(NS_DT_Q5_1); break;        \
    default: ok = false; break;                        \
    }

bool cu_quant_moe_gemv(cu_impl *c, const cu_qmoe &m, const float *x, int Tc, const int32_t *ids, float *h, float *y) {
    const int TK = Tc * m.K;
    bool ok = true;
    /* activations: Tc rows of H */
    int64_t nblk = (int64_t)Tc * (m.H / 32);
    cu_launch(c, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, x, m.xq, m.xd, m.xs, nblk,
              (const int32_t *)NULL, 1, (int64_t)1);
    if (CU_LAUNCHED(c, "moe quantize activations")) return false;
    const qx xv = {m.xq, m.xd, m.xs, m.H};
    const uint8_t *const *tab = (const uint8_t *const *)m.tab;
#define QMOE_GU(TT)                                                                                            \
    cu_launch(c, k_qmoe_gu<TT>, dim3((unsigned)((m.F + 3) / 4), (unsigned)TK), dim3(128), 0, tab, ids, m.K, m.E, \
              m.F, xv, h)
    QMOE_DISPATCH(m.dt[0], QMOE_GU)
#undef QMOE_GU
    if (!ok) return !cu_check(c, cudaErrorInvalidValue, "moe: unsupported gate/up expert type");
    if (CU_LAUNCHED(c, "moe quantized gemv gate/up")) return false;
    /* the SwiGLU output: TK rows of F */
    nblk = (int64_t)TK * (m.F / 32);
    cu_launch(c, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, (const float *)h, m.xq, m.xd, m.xs, nblk,
              (const int32_t *)NULL, 1, (int64_t)1);
    if (CU_LAUNCHED(c, "moe quantize h")) return false;
    const qx hv = {m.xq, m.xd, m.xs, m.F};
#define QMOE_DOWN(TT)                                                                                             \
    cu_launch(c, k_qmoe_down<TT>, dim3((unsigned)((m.H + 7) / 8), (unsigned)TK), dim3(128), 0, tab, ids, m.E, m.H, \
              hv, y)
    QMOE_DISPATCH(m.dt[2], QMOE_DOWN)
#undef QMOE_DOWN
    if (!ok) return !cu_check(c, cudaErrorInvalidValue, "moe: unsupported down expert type");
    return !CU_LAUNCHED(c, "moe quantized gemv down");
}

bool cu_quant_moe_grouped(cu_impl *c, const cu_qmoe &m, const float *x, int TK, const int32_t *rows,
                          const int32_t *offs, float *h, float *y) {
    bool ok = true;
    const uint8_t *const *tab = (const uint8_t *const *)m.tab;
    /* the slots' token rows in sorted order */
    int64_t nblk = (int64_t)TK * (m.H / 32);
    cu_launch(c, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, x, m.xq, m.xd, m.xs, nblk, rows, m.K,
              (int64_t)(m.H / 32));
    if (CU_LAUNCHED(c, "moe quantize gathered activations")) return false;
    const qx xv = {m.xq, m.xd, m.xs, m.H};
#define QMOE_GGU(TT)                                                                                               \
    cu_launch(c, k_qmoe_ggu<TT>, dim3((unsigned)((m.F + 3) / 4), (unsigned)m.E), dim3(128), 0, tab, offs, m.E, m.F, \
              TK, xv, h)
    QMOE_DISPATCH(m.dt[0], QMOE_GGU)
#undef QMOE_GGU
    if (!ok) return !cu_check(c, cudaErrorInvalidValue, "moe: unsupported gate/up expert type");
    if (CU_LAUNCHED(c, "moe quantized grouped gemv gate/up")) return false;
    nblk = (int64_t)TK * (m.F / 32);
    cu_launch(c, k_quant_x, dim3((unsigned)((nblk + 7) / 8)), dim3(256), 0, (const float *)h, m.xq, m.xd, m.xs, nblk,
              (const int32_t *)NULL, 1, (int64_t)1);
    if (CU_LAUNCHED(c, "moe quantize h")) return false;
    const qx hv = {m.xq, m.xd, m.xs, m.F};
#define QMOE_GDOWN(TT)                                                                                            \
    cu_launch(c, k_qmoe_gdown<TT>, dim3((unsigned)((m.H + 7) / 8), (unsigned)m.E), dim3(128), 0, tab, offs, m.E, \
              m.H, TK, hv, y)
    QMOE_DISPATCH(m.dt[2], QMOE_GDOWN)
#undef QMOE_GDOWN
    if (!ok) return !cu_check(c, cudaErrorInvalidValue, "moe: unsupported down expert type");
    return !CU_LAUNCHED(c, "moe quantized grouped gemv down");
}

bool cu_quant_moe_dequant(cu_impl *c, const cu_qmoe &m, const int32_t *counts, bf16 *deq, const bf16 **bftab) {
    const int64_t ff = (int64_t)m.F * m.H; /* values per expert matrix */
    for (int s = 0; s < 3; s++) {
        const int64_t rows = s == 2 ? m.H : m.F, cols = s == 2 ? m.F : m.H;
        const int64_t groups = (int64_t)m.E * ff / 16;
        const dim3 grid((unsigned)((groups + 255) / 256));
        bf16 *out = deq + (size_t)s * (size_t)m.E * (size_t)ff;
        const uint8_t *const *tab = (const uint8_t *const *)m.tab;
        bool ok = true;
#define QMOE_DEQ(TT) \
    cu_launch(c, k_qmoe_deq<TT>, grid, dim3(256), 0, tab, s * m.E, m.E, rows, cols, counts, out, bftab)
        QMOE_DISPATCH(m.dt[s], QMOE_DEQ)
#undef QMOE_DEQ
        if (!ok) return !cu_check(c, cudaErrorInvalidValue, "moe: unsupported expert type");
        if (CU_LAUNCHED(c, "moe dequantize experts")) return false;
    }
    return true;
}
#undef QMOE_DISPATCH

/* ------------------------------------------------------------- memory */

/* Grows the scratch buffers for a quantized weight of rows x cols. Runs
 * at upload, before any step, so graphs never see an allocation; growth
 * drops captured graphs anyway (they would hold the old addresses). */
static bool reserve(cu_impl *c, int64_t rows, int64_t cols) {
    if (!c->quant) {
        c->quant = (cu_quant *)calloc(1, sizeof *c->quant);
        if (!c->quant) return !cu_check(c, cudaErrorMemoryAllocation, "quant state");
    }
    cu_quant *q = c->quant;
    bool grew = false;
    if (cols > q->x_k) {
        const size_t nq = (size_t)CU_QGEMV_MAX * (size_t)cols;
        int8_t *xq = NULL;
        float *xd = NULL, *xs = NULL;
        if (cu_check(c, cudaStreamSynchronize(c->stream), "sync") || cu_check(c, cudaMalloc(&xq, nq), "cudaMalloc(xq)"))
            return false;
        if (cu_check(c, cudaMalloc(&xd, nq / 32 * sizeof(float)), "cudaMalloc(xd)") ||
            cu_check(c, cudaMalloc(&xs, nq / 16 * sizeof(float)), "cudaMalloc(xs)")) {
            cudaFree(xq);
            if (xd) cudaFree(xd);
            return false;
        }
        if (q->xq) cudaFree(q->xq);
        if (q->xd) cudaFree(q->xd);
        if (q->xs) cudaFree(q->xs);
        q->xq = xq, q->xd = xd, q->xs = xs, q->x_k = cols;
        grew = true;
    }
    const size_t elems = (size_t)rows * (size_t)cols;
    if (elems > q->deq_elems) {
        bf16 *p = NULL;
        if (cu_check(c, cudaStreamSynchronize(c->stream), "sync")) return false;
        if (q->deq) cudaFree(q->deq);
        q->deq = NULL;
        q->deq_elems = 0;
        if (cu_check(c, cudaMalloc(&p, elems * sizeof(bf16)), "cudaMalloc(dequantization scratch)")) return false;
        q->deq = p;
        q->deq_elems = elems;
        grew = true;
    }
    if (grew) cu_bump_generation(c);
    return true;
}

void cu_quant_free(cu_impl *c) {
    cu_quant *q = c->quant;
    if (!q) return;
    if (q->xq) cudaFree(q->xq);
    if (q->xd) cudaFree(q->xd);
    if (q->xs) cudaFree(q->xs);
    if (q->deq) cudaFree(q->deq);
    free(q);
    c->quant = NULL;
}

size_t cu_quant_scratch_bytes(const cu_impl *c) {
    const cu_quant *q = c->quant;
    if (!q) return 0;
    return (size_t)q->x_k * CU_QGEMV_MAX * (1 + 4 / 32.0 + 4 / 16.0) + q->deq_elems * sizeof(bf16);
}

bool cu_quant_type_ok(ns_dtype dt) {
    qlayout l;
    return layout_of(dt, &l);
}

bool cu_quant_check_shape(ns_dtype dt, int64_t rows, int64_t cols) {
    qlayout l;
    return layout_of(dt, &l) && rows >= 1 && cols >= l.qe && cols % l.qe == 0 && cols <= (1 << 30) &&
           rows <= (1 << 30);
}

/* Host ggml blocks -> the A/B/C arrays of t (already allocated), through
 * a bounded staging buffer. */
bool cu_quant_upload(cu_impl *c, ns_tensor *t, const void *src) {
    qlayout l;
    if (!layout_of((ns_dtype)t->dtype, &l)) return !cu_check(c, cudaErrorInvalidValue, "upload: not a quantized type");
    if (!reserve(c, t->rows, t->cols)) return false;
    const size_t nbt = nblocks(t), chunk = 1 << 16; /* blocks per staging round */
    uint8_t *stage = (uint8_t *)malloc(chunk * (size_t)(l.a + l.b + l.c));
    if (!stage) return !cu_check(c, cudaErrorMemoryAllocation, "upload staging");
    uint8_t *dst = (uint8_t *)t->data, *sa = stage, *sb = stage + chunk * l.a, *sc = sb + chunk * l.b;
    const uint8_t *s = (const uint8_t *)src;
    bool ok = true;
    for (size_t b0 = 0; b0 < nbt && ok; b0 += chunk) {
        const size_t nb = nbt - b0 < chunk ? nbt - b0 : chunk;
        for (size_t i = 0; i < nb; i++) {
            const uint8_t *g = s + (b0 + i) * (size_t)l.gb;
            memcpy(sa + i * l.a, g + l.a_off, (size_t)l.a);
            if (l.b) memcpy(sb + i * l.b, g + l.b_off, (size_t)l.b);
            if (l.c) memcpy(sc + i * l.c, g + l.c_off, (size_t)l.c);
        }
        ok = !cu_check(c, cudaMemcpy(dst + b0 * l.a, sa, nb * l.a, cudaMemcpyHostToDevice), "upload weight");
        if (ok && l.b)
            ok = !cu_check(c, cudaMemcpy(dst + nbt * l.a + b0 * l.b, sb, nb * l.b, cudaMemcpyHostToDevice),
                           "upload weight");
        if (ok && l.c)
            ok = !cu_check(c,
                           cudaMemcpy(dst + nbt * (l.a + l.b) + b0 * l.c, sc, nb * l.c, cudaMemcpyHostToDevice),
                           "upload weight");
    }
    free(stage);
    return ok;
}

/* Random blocks for --dummy-weights: random quants and sub-block scales,
 * block scales chosen so |value| <= about `scale` with mean about 0. One
 * thread per block writes its A/B/C bytes. */
template <int T> __global__ void k_qrandom(uint8_t *base, size_t nbt, uint64_t seed, float scale) {
    const size_t blk = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= nbt) return;
    uint8_t *a = base + blk * QT<T>::A, *b = base + nbt * QT<T>::A + blk * QT<T>::B;
    uint8_t *cc = base + nbt * (QT<T>::A + QT<T>::B) + blk * QC<T>::C;
    const uint64_t s0 = seed * 0x9e3779b97f4a7c15ULL + blk * 0x100000001b3ULL;
    for (int i = 0; i < QT<T>::A / 8; i++) {
        const uint64_t r = ns_splitmix64_mix(s0 + (uint64_t)i);
        uint8_t by[8];
        memcpy(by, &r, 8);
#pragma unroll
        for (int j = 0; j < 8; j++) a[8 * i + j] = (T == NS_DT_Q8_0 && by[j] == 0x80) ? 0x81 : by[j];
    }
    const uint64_t r = ns_splitmix64_mix(s0 + 1000);
    if constexpr (T == NS_DT_Q8_0 || T == NS_DT_Q4_0) {
        const __half d = __float2half_rn(scale / (T == NS_DT_Q8_0 ? 127.f : 8.f));
        memcpy(cc, &d, 2);
    } else if constexpr (T == NS_DT_Q4_1 || T == NS_DT_Q5_0 || T == NS_DT_Q5_1) {
        /* codes 0..15 or 0..31 around the middle: d * q + m with m = -16 d
         * (Q5_1) / -8 d (Q4_1) */
        const float dv = scale / (T == NS_DT_Q4_1 ? 8.f : 16.f);
        const __half d = __float2half_rn(dv);
        memcpy(cc, &d, 2);
        if constexpr (T != NS_DT_Q5_0) {
            const __half m = __float2half_rn(-dv * (T == NS_DT_Q4_1 ? 8.f : 16.f));
            memcpy(cc + 2, &m, 2);
        }
        if constexpr (T != NS_DT_Q4_1) memcpy(b, &r, 4);
    } else if constexpr (T == NS_DT_Q4_K || T == NS_DT_Q5_K) {
        const float dv = scale / (T == NS_DT_Q4_K ? 63.f * 15.f : 63.f * 31.f);
        const __half d = __float2half_rn(dv), dm = __float2half_rn(dv * (T == NS_DT_Q4_K ? 7.5f : 15.5f));
        memcpy(b, &d, 2);
        memcpy(b + 2, &dm, 2);
        const uint64_t r2 = ns_splitmix64_mix(s0 + 1001);
        memcpy(b + 4, &r, 8);
        memcpy(b + 12, &r2, 4);
    } else {
        const uint64_t r2 = ns_splitmix64_mix(s0 + 1001);
        memcpy(b, &r, 8);
        memcpy(b + 8, &r2, 8);
        const __half d = __float2half_rn(scale / (128.f * 32.f));
        memcpy(cc, &d, 2);
    }
}

bool cu_quant_random(cu_impl *c, ns_tensor *t, uint64_t seed, float scale) {
    if (!reserve(c, t->rows, t->cols)) return false;
    const size_t nbt = nblocks(t);
    const dim3 grid((unsigned)((nbt + 255) / 256)), block(256);
    uint8_t *p = (uint8_t *)t->data;
    switch ((ns_dtype)t->dtype) {
    case NS_DT_Q8_0: k_qrandom<NS_DT_Q8_0><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q4_0: k_qrandom<NS_DT_Q4_0><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q4_K: k_qrandom<NS_DT_Q4_K><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q5_K: k_qrandom<NS_DT_Q5_K><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q6_K: k_qrandom<NS_DT_Q6_K><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q4_1: k_qrandom<NS_DT_Q4_1><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q5_0: k_qrandom<NS_DT_Q5_0><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    case NS_DT_Q5_1: k_qrandom<NS_DT_Q5_1><<<grid, block, 0, c->stream>>>(p, nbt, seed, scale); break;
    default: return !cu_check(c, cudaErrorInvalidValue, "random: not a quantized type");
    }
    return !CU_LAUNCHED(c, "random quantized weight");
}
