/* cuda_mlp.cu — the dense MLP block of a batch 1-2 decode step as one
 * persistent kernel: gate/up GEMV + SwiGLU, a grid barrier, the down GEMV.
 *
 * Why: at batch 1 each GEMV kernel pays a ramp (its loads start only once
 * the previous kernel has drained) and a tail (its last wave's latency
 * chain with HBM mostly idle), ~3-4 us per GEMV against 22-44 us of
 * streaming (docs/cuda.md v25's timeline). Here the down GEMV's first
 * weight loads are issued by every warp as soon as its gate/up rows are
 * done, before the grid barrier, so HBM keeps streaming through what was
 * the kernel boundary (docs/cuda.md "What issue 12 still needs", v27).
 *
 * Shape of the work: CTAs of 8 warps, as many as are resident at once
 * (cu_mlp_init's occupancy x SMs). Each phase splits its row pairs among
 * groups of KS warps exactly as k_gemv (cuda_gemm.cu) does for the same
 * shape (cu_gemv_ks), with the same per-lane chunks, the same shuffle
 * reduction and the same order of the split-K partial sums, so every
 * output is bit-identical to the gate/up+SwiGLU k_gemv followed by the
 * down k_gemv. A group walks its pairs g, g + G, g + 2G, ...; its KS
 * warps meet at a named barrier per pair (double-buffered partials).
 *
 * The tail (NS_CUDA_MLP_TAIL, off by default): when the tape goes on with
 * the residual add, the next layer's RMSNorm and its q/k/v GEMVs, a second
 * barrier, then every CTA adds and normalizes the row into shared memory
 * itself (k_add_rmsnorm's summation order, so bit-identical), streams its
 * q/k/v rows from there, and CTA 0 writes the residual and the norm's
 * output once every CTA has read them. Measured 0.12 ms slower per step
 * at 1k batch 1 than without it (docs/cuda.md v27): kept for A/B runs.
 *
 * It is launched without programmatic dependent launch (cu_mlp_decode says
 * why); the kernel after it may start early (PDL trigger after the last
 * barrier).
 *
 * Invariants that keep it correct:
 * - every CTA must be resident at once (the grid barrier spins): the grid
 *   is the occupancy the driver reports for this kernel times the SMs, and
 *   the dependent launch is triggered only after the barrier, so no later
 *   kernel can take a slot one of ours still needs. A wait that cannot end
 *   (an SM-limited MPS client) traps after ~2^22 polls instead of hanging.
 * - phase B reads the SwiGLU output that other CTAs wrote in phase A with
 *   plain loads after the barrier's acquire (never through ld.global.nc);
 *   its output may alias phase A's input (forward.c writes the down
 *   projection into xn): every CTA has consumed its xn loads before it
 *   arrives at the barrier.
 * - the barrier word (c->mlp_bar, zeroed once) flips its top bit once per
 *   barrier whatever the grid size (block 0 adds 2^31 - (G - 1), the
 *   others 1), so it needs no reset between launches.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

#define MLP_WARPS 8
#define MLP_THREADS (MLP_WARPS * 32)
/* polls of a barrier word before a trap: far beyond any real wait */
#define MLP_SPIN_LIMIT (1u << 22)
/* k_add_rmsnorm's geometry (cuda_fused.cu), which the tail emulates so
 * that its sums come out in the same order: 512 threads, AR_REG float4
 * per thread before the strided remainder */
#define MLP_AR_THREADS 512
#define MLP_AR_REG 4
/* the tail keeps n rows of the normalized input in shared memory */
#define MLP_TAIL_SMEM_MAX (48 * 1024)

struct mlp_args {
    const float *x;           /* xn [n, k] */
    const bf16 *wg, *wu, *wd; /* [m, k], [m, k], [h, m] */
    float *gate, *up, *s;     /* [n, m]; s = silu(gate) * up, may alias gate */
    bf16 *s_bf;               /* its bf16 shadow, or NULL */
    float *d;                 /* [n, h] = s @ wd^T */
    unsigned *bar;            /* bar[0]: the grid barriers; bar[1]: the tail's reads-done count */
    int k, m, h;
    int ksa, ksb, ksq; /* split-K of each phase: 1, 2 or 4 (cu_gemv_ks) */
    /* the tail (QKV): res += d; xn = rmsnorm(res) * norm_w; q/k/v = xn W^T */
    float *res;
    const float *norm_w;
    float eps;
    float *xn;
    bf16 *xn_bf;
    const bf16 *wq[3];
    float *oq[3];
    int qend[3]; /* cumulative row ends of the q/k/v segments */
    unsigned long long *probe; /* the phase probe's slot for this launch ([grid][4]) or NULL */
};

/* The phase probe: thread 0 of each CTA stamps the global timer (ns) at
 * stamp i (0 start, 1 gate/up done, 2 barrier passed, 3 down done). The
 * callers put a block barrier before stamps 1 and 3 so that they stand
 * for the whole CTA. */
__device__ __forceinline__ void mlp_stamp(const mlp_args &a, int i) {
    if (a.probe && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        a.probe[blockIdx.x * 4 + i] = t;
    }
}

__device__ __forceinline__ void mlp_named_sync(int id, int n_threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n_threads) : "memory");
}

__device__ __forceinline__ unsigned mlp_ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Thread 0 of each CTA adds its arrival to *bar (the top bit flips once
 * every CTA has arrived, whatever the grid size: block 0 adds 2^31 -
 * (G - 1), the others 1) and returns the word as it found it. */
__device__ __forceinline__ unsigned mlp_arrive(unsigned *bar) {
    __threadfence();
    return atomicAdd(bar, blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u);
}

__device__ __forceinline__ void mlp_wait_flip(const unsigned *bar, unsigned old) {
    unsigned polls = 0;
    while (((old ^ mlp_ld_acquire(bar)) & 0x80000000u) == 0)
        if (++polls > MLP_SPIN_LIMIT) __trap();
    __threadfence();
}

/* Every CTA arrives once; returns when all have (see the invariants). */
__device__ __forceinline__ void mlp_grid_sync(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) mlp_wait_flip(bar, mlp_arrive(bar));
    __syncthreads();
}

/* x loads: phase A's input is read-only while phase A runs (__ldg, as
 * k_gemv); the others were written by this kernel (plain coherent loads,
 * or shared memory). */
template <bool NC>
__device__ __forceinline__ float4 mlp_ld_x(const float *p) {
    if constexpr (NC) return __ldg(reinterpret_cast<const float4 *>(p));
    return *reinterpret_cast<const float4 *>(p);
}

/* k_gemv's inner block: 4 chunks of 8 per lane per row, in order. */
template <int N, bool NC>
__device__ __forceinline__ void mlp_block(const uint4 (&a)[4], const uint4 (&b)[4], const float *x, int k, int c,
                                          float (&acc0)[N], float (&acc1)[N]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float *xv = x + (size_t)n * k + 8 * (c + 32 * u);
            const float4 x0 = mlp_ld_x<NC>(xv), x1 = mlp_ld_x<NC>(xv + 4);
            acc0[n] += cu_dot8(a[u], x0, x1);
            acc1[n] += cu_dot8(b[u], x0, x1);
        }
    }
}

/* The chunk range [cb, ce) of split kp of ks over k / 8 chunks (k_gemv's). */
__device__ __forceinline__ void mlp_range(int k, int ks, int kp, int &cb, int &ce) {
    const int nch = k / 8;
    cb = kp * (nch / ks);
    ce = kp == ks - 1 ? nch : cb + nch / ks;
}

/* The first block of a pair's rows, loaded ahead (before a barrier);
 * false when some lane has no full first block (then nothing is loaded:
 * mlp_pair's shuffles need the whole warp on one path). */
__device__ __forceinline__ bool mlp_preload(const bf16 *W0, const bf16 *W1, int k, int ks, int kp, int lane,
                                            uint4 (&pa)[4], uint4 (&pb)[4]) {
    int cb, ce;
    mlp_range(k, ks, kp, cb, ce);
    if (!(cb + 31 + 96 < ce)) return false;
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W0), *w1 = reinterpret_cast<const uint4 *>(W1);
    const int c = cb + lane;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        pa[u] = cu_ld_stream(w0 + c + 32 * u);
        pb[u] = cu_ld_stream(w1 + c + 32 * u);
    }
    return true;
}

/* One warp's share (split kp) of the dot products of rows w0, w1 with the
 * n inputs, reduced over the warp. PRE: the first block's weights were
 * loaded already (pa, pb; a template flag so that they are not kept live
 * across the later pairs' loops, which spilled at 64 registers). */
template <int N, bool NC, bool PRE>
__device__ __forceinline__ void mlp_pair(const bf16 *W0, const bf16 *W1, const float *x, int k, int ks, int kp,
                                         int lane, const uint4 (&pa)[4], const uint4 (&pb)[4], float (&acc0)[N],
                                         float (&acc1)[N]) {
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W0), *w1 = reinterpret_cast<const uint4 *>(W1);
    int cb, ce;
    mlp_range(k, ks, kp, cb, ce);
#pragma unroll
    for (int n = 0; n < N; n++) acc0[n] = acc1[n] = 0.f;
    int c = cb + lane;
    if constexpr (PRE) {
        mlp_block<N, NC>(pa, pb, x, k, c, acc0, acc1);
        c += 128;
    }
    for (; c + 96 < ce; c += 128) {
        uint4 a[4], b[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            a[u] = cu_ld_stream(w0 + c + 32 * u);
            b[u] = cu_ld_stream(w1 + c + 32 * u);
        }
        mlp_block<N, NC>(a, b, x, k, c, acc0, acc1);
    }
    for (; c < ce; c += 32) {
        const uint4 a = cu_ld_stream(w0 + c), b = cu_ld_stream(w1 + c);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float *xv = x + (size_t)n * k + 8 * c;
            const float4 x0 = mlp_ld_x<NC>(xv), x1 = mlp_ld_x<NC>(xv + 4);
            acc0[n] += cu_dot8(a, x0, x1);
            acc1[n] += cu_dot8(b, x0, x1);
        }
    }
#pragma unroll
    for (int n = 0; n < N; n++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc0[n] += __shfl_xor_sync(0xffffffffu, acc0[n], o);
            acc1[n] += __shfl_xor_sync(0xffffffffu, acc1[n], o);
        }
    }
}

/* The ks partial sums of a group meet in shared memory (k_gemv's order);
 * returns true in the warp that holds the totals (kp == 0). */
template <int N>
__device__ __forceinline__ bool mlp_combine(float (*part)[MLP_WARPS][2][N], int &parity, int ks, int wib, int lane,
                                            float (&acc0)[N], float (&acc1)[N]) {
    if (ks == 1) return true;
    const int kp = wib % ks;
    if (lane == 0) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            part[parity][wib][0][n] = acc0[n];
            part[parity][wib][1][n] = acc1[n];
        }
    }
    mlp_named_sync(1 + wib / ks, ks * 32);
    const int p = parity;
    parity ^= 1; /* the next pair writes the other buffer: no second barrier */
    if (kp != 0) return false;
#pragma unroll
    for (int n = 0; n < N; n++) {
        acc0[n] = part[p][wib][0][n];
        acc1[n] = part[p][wib][1][n];
#pragma unroll
        for (int q = 1; q < 4; q++) {
            if (q < ks) {
                acc0[n] += part[p][wib + q][0][n];
                acc1[n] += part[p][wib + q][1][n];
            }
        }
    }
    return true;
}

/* Rows 2p, 2p + 1 of up to three concatenated matrices (k_gemv's
 * gemv_row): weight row, output column, output width. */
__device__ __forceinline__ void mlp_seg_row(const mlp_args &a, int r, const bf16 *&w, float *&o, int &col,
                                            int &width) {
    const int sg = r < a.qend[0] ? 0 : r < a.qend[1] ? 1 : 2;
    const int lo = sg == 0 ? 0 : a.qend[sg - 1];
    w = a.wq[sg] + (size_t)(r - lo) * a.h;
    o = a.oq[sg];
    col = r - lo;
    width = a.qend[sg] - lo;
}

/* The part of k_add_rmsnorm's thread t for one row: xs = x + y of its
 * elements, and its sum of squares in that kernel's order. */
__device__ __forceinline__ float mlp_ss_thread(const float *xr, const float *yr, float *xs, int t, int cols) {
    const int step = MLP_AR_THREADS * 4;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < MLP_AR_REG; i++) {
        const int d = t * 4 + i * step;
        if (d < cols) {
            const float4 x4 = *reinterpret_cast<const float4 *>(xr + d), y4 = *reinterpret_cast<const float4 *>(yr + d);
            const float4 q = make_float4(x4.x + y4.x, x4.y + y4.y, x4.z + y4.z, x4.w + y4.w);
            *reinterpret_cast<float4 *>(xs + d) = q;
            ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        }
    }
    for (int d = t * 4 + MLP_AR_REG * step; d < cols; d += step) {
        const float4 x4 = *reinterpret_cast<const float4 *>(xr + d), y4 = *reinterpret_cast<const float4 *>(yr + d);
        const float4 q = make_float4(x4.x + y4.x, x4.y + y4.y, x4.z + y4.z, x4.w + y4.w);
        *reinterpret_cast<float4 *>(xs + d) = q;
        ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
    }
    return ss;
}

/* res + d of row n and its normalized form into xs, summed exactly as
 * k_add_rmsnorm's 512 threads and cu_block_sum do (each thread plays
 * threads t and t + 256 of that kernel). */
__device__ __forceinline__ void mlp_tail_norm(const mlp_args &a, int n, float *xs, float *red) {
    const int cols = a.h;
    const float *xr = a.res + (size_t)n * cols, *yr = a.d + (size_t)n * cols;
    float ss[2];
    ss[0] = mlp_ss_thread(xr, yr, xs, threadIdx.x, cols);
    ss[1] = mlp_ss_thread(xr, yr, xs, threadIdx.x + MLP_THREADS, cols);
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    const float s0 = cu_warp_sum(ss[0]), s1 = cu_warp_sum(ss[1]);
    if (lane == 0) {
        red[wib] = s0;
        red[wib + MLP_WARPS] = s1;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < MLP_AR_THREADS / 32 ? red[threadIdx.x] : 0.f;
        t = cu_warp_sum(t);
        if (threadIdx.x == 0) red[32] = t;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(red[32] / (float)cols + a.eps);
    for (int d = threadIdx.x * 4; d < cols; d += MLP_THREADS * 4) {
        const float4 q = *reinterpret_cast<const float4 *>(xs + d), w = *reinterpret_cast<const float4 *>(a.norm_w + d);
        *reinterpret_cast<float4 *>(xs + d) =
            make_float4((q.x * inv) * w.x, (q.y * inv) * w.y, (q.z * inv) * w.z, (q.w * inv) * w.w);
    }
    __syncthreads(); /* red is reused by the next row */
}

/* CTA 0, once every CTA has read res and d: res += d and xn (the RMSNorm
 * output, which may be d's buffer) with its bf16 shadow, from xs. */
__device__ __forceinline__ void mlp_tail_write(const mlp_args &a, int n_rows, const float *xs) {
    const int cols = a.h;
    for (int n = 0; n < n_rows; n++) {
        float *xr = a.res + (size_t)n * cols;
        const float *yr = a.d + (size_t)n * cols, *xsn = xs + (size_t)n * cols;
        float *o = a.xn + (size_t)n * cols;
        for (int d = threadIdx.x * 4; d < cols; d += MLP_THREADS * 4) {
            const float4 x4 = *reinterpret_cast<const float4 *>(xr + d), y4 = *reinterpret_cast<const float4 *>(yr + d);
            const float4 v = *reinterpret_cast<const float4 *>(xsn + d);
            /* every thread reads its d elements before writing the same xn elements */
            *reinterpret_cast<float4 *>(xr + d) = make_float4(x4.x + y4.x, x4.y + y4.y, x4.z + y4.z, x4.w + y4.w);
            *reinterpret_cast<float4 *>(o + d) = v;
            if (a.xn_bf) cu_store_bf16x4(a.xn_bf + (size_t)n * cols + d, v);
        }
    }
}

/* Phase B's epilogue for pair p: rows 2p, 2p + 1 of d (k_gemv's stores). */
template <int N>
__device__ __forceinline__ void mlp_down_store(const mlp_args &a, float (*part)[MLP_WARPS][2][N], int &parity, int p,
                                               int ks, int wib, int lane, float (&acc0)[N], float (&acc1)[N]) {
    if (!mlp_combine<N>(part, parity, ks, wib, lane, acc0, acc1) || lane != 0) return;
    const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
#pragma unroll
    for (int n = 0; n < N; n++) {
        a.d[(size_t)n * a.h + r0] = acc0[n];
        if (r1 != r0) a.d[(size_t)n * a.h + r1] = acc1[n];
    }
}

/* Phase Q's epilogue for pair p of the q/k/v rows (k_gemv's stores). */
template <int N>
__device__ __forceinline__ void mlp_qkv_store(const mlp_args &a, float (*part)[MLP_WARPS][2][N], int &parity, int p,
                                              int wib, int lane, float (&acc0)[N], float (&acc1)[N]) {
    if (!mlp_combine<N>(part, parity, a.ksq, wib, lane, acc0, acc1) || lane != 0) return;
    const int total = a.qend[2], r0 = 2 * p, r1 = r0 + 1 < total ? r0 + 1 : r0;
    const bf16 *w;
    float *o0, *o1;
    int c0, c1, m0, m1;
    mlp_seg_row(a, r0, w, o0, c0, m0);
    mlp_seg_row(a, r1, w, o1, c1, m1);
#pragma unroll
    for (int n = 0; n < N; n++) {
        o0[(size_t)n * m0 + c0] = acc0[n];
        if (r1 != r0) o1[(size_t)n * m1 + c1] = acc1[n];
    }
}

/* Phase Q: the next layer's q/k/v GEMVs of the normalized rows xs. */
template <int N>
__device__ __forceinline__ void mlp_phase_q(const mlp_args &a, float (*part)[MLP_WARPS][2][N], int &parity,
                                            const float *xs, int p) {
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31, ks = a.ksq, kp = wib % ks;
    const int pairs = (a.qend[2] + 1) / 2, stride = gridDim.x * (MLP_WARPS / ks);
    const uint4 none[4] = {};
    for (; p < pairs; p += stride) {
        const int r0 = 2 * p, r1 = r0 + 1 < a.qend[2] ? r0 + 1 : r0;
        const bf16 *W0, *W1;
        float *o;
        int c, m;
        mlp_seg_row(a, r0, W0, o, c, m);
        mlp_seg_row(a, r1, W1, o, c, m);
        float acc0[N], acc1[N];
        mlp_pair<N, false, false>(W0, W1, xs, a.h, ks, kp, lane, none, none, acc0, acc1);
        mlp_qkv_store<N>(a, part, parity, p, wib, lane, acc0, acc1);
    }
}

/* The weights of this warp's first q/k/v pair into L2 (no registers held
 * across the barrier and the norm): HBM streams them meanwhile. */
__device__ __forceinline__ void mlp_q_prefetch(const mlp_args &a, int p, int kp, int lane) {
    if (p >= (a.qend[2] + 1) / 2) return;
    const int r0 = 2 * p, r1 = r0 + 1 < a.qend[2] ? r0 + 1 : r0;
    const bf16 *W0, *W1;
    float *o;
    int c, m, cb, ce;
    mlp_seg_row(a, r0, W0, o, c, m);
    mlp_seg_row(a, r1, W1, o, c, m);
    mlp_range(a.h, a.ksq, kp, cb, ce);
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W0), *w1 = reinterpret_cast<const uint4 *>(W1);
    for (int ch = cb + lane; ch < ce; ch += 32) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w0 + ch));
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w1 + ch));
    }
}

template <int N, bool QKV>
__global__ __launch_bounds__(MLP_THREADS, 4) void k_mlp(const __grid_constant__ mlp_args a) {
    __shared__ float part[2][MLP_WARPS][2][N];
    extern __shared__ float4 mlp_dyn[]; /* QKV: the normalized rows [N, h] */
    /* no trigger here: dependents launch only after the last grid barrier */
    PDL_WAIT();
    mlp_stamp(a, 0);
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int parity = 0;
    const uint4 none[4] = {};
    /* phase A: pair p = gate row p and up row p, SwiGLU epilogue */
    {
        const int ks = a.ksa, kp = wib % ks, groups = MLP_WARPS / ks;
        const int stride = gridDim.x * groups;
        for (int p = blockIdx.x * groups + wib / ks; p < a.m; p += stride) {
            float acc0[N], acc1[N];
            mlp_pair<N, true, false>(a.wg + (size_t)p * a.k, a.wu + (size_t)p * a.k, a.x, a.k, ks, kp, lane, none,
                                     none, acc0, acc1);
            if (!mlp_combine<N>(part, parity, ks, wib, lane, acc0, acc1) || lane != 0) continue;
#pragma unroll
            for (int n = 0; n < N; n++) {
                /* k_gemv's SwiGLU epilogue: gate, up, then s (s may be gate) */
                const float g = acc0[n], u = acc1[n];
                const float y = g / (1.0f + expf(-g)) * u;
                const size_t o = (size_t)n * a.m + p;
                a.gate[o] = g;
                a.up[o] = u;
                a.s[o] = y;
                if (a.s_bf) a.s_bf[o] = __float2bfloat16_rn(y);
            }
        }
    }
    /* phase B's first weights, before the barrier: rows 2p, 2p + 1 */
    const int ksb = a.ksb, kpb = wib % ksb, pairs = (a.h + 1) / 2;
    const int stride = gridDim.x * (MLP_WARPS / ksb);
    int p = blockIdx.x * (MLP_WARPS / ksb) + wib / ksb;
    uint4 pa[4], pb[4];
    bool pre = false;
    const bf16 *W0 = a.wd, *W1 = a.wd;
    if (p < pairs) {
        const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
        W0 = a.wd + (size_t)r0 * a.m;
        W1 = a.wd + (size_t)r1 * a.m;
        pre = mlp_preload(W0, W1, a.m, ksb, kpb, lane, pa, pb);
    }
    if (a.probe) {
        __syncthreads();
        mlp_stamp(a, 1);
    }
    mlp_grid_sync(a.bar);
    mlp_stamp(a, 2);
    /* every CTA is resident and past the barrier: the next kernel may
     * start its pre-wait part */
    if constexpr (!QKV) PDL_TRIGGER();
    /* phase B: the down projection of s; the first pair separately, as
     * the only one that may start from the prefetched block */
    if (p < pairs) {
        float acc0[N], acc1[N];
        if (pre) mlp_pair<N, false, true>(W0, W1, a.s, a.m, ksb, kpb, lane, pa, pb, acc0, acc1);
        else mlp_pair<N, false, false>(W0, W1, a.s, a.m, ksb, kpb, lane, none, none, acc0, acc1);
        mlp_down_store<N>(a, part, parity, p, ksb, wib, lane, acc0, acc1);
    }
    for (p += stride; p < pairs; p += stride) {
        const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
        float acc0[N], acc1[N];
        mlp_pair<N, false, false>(a.wd + (size_t)r0 * a.m, a.wd + (size_t)r1 * a.m, a.s, a.m, ksb, kpb, lane, none,
                                  none, acc0, acc1);
        mlp_down_store<N>(a, part, parity, p, ksb, wib, lane, acc0, acc1);
    }
    if (a.probe) {
        __syncthreads();
        mlp_stamp(a, 3);
    }
    if constexpr (QKV) {
        /* the tail: q/k/v's first weights into L2 before the barrier, then
         * every CTA normalizes res + d into shared memory itself */
        float *xs = reinterpret_cast<float *>(mlp_dyn);
        __shared__ float red[33];
        const int ksq = a.ksq;
        const int pq = blockIdx.x * (MLP_WARPS / ksq) + wib / ksq;
        mlp_q_prefetch(a, pq, wib % ksq, lane);
        mlp_grid_sync(a.bar);
        PDL_TRIGGER();
#pragma unroll
        for (int n = 0; n < N; n++) mlp_tail_norm(a, n, xs + (size_t)n * a.h, red);
        unsigned old = 0;
        if (threadIdx.x == 0) old = mlp_arrive(a.bar + 1); /* this CTA is done reading res and d */
        mlp_phase_q<N>(a, part, parity, xs, pq);
        if (blockIdx.x == 0) {
            if (threadIdx.x == 0) mlp_wait_flip(a.bar + 1, old);
            __syncthreads();
            mlp_tail_write(a, N, xs);
        }
    }
}

typedef void (*mlp_fn)(const mlp_args);

/* [n - 1][with the tail] */
static const mlp_fn mlp_fns[2][2] = {{k_mlp<1, false>, k_mlp<1, true>}, {k_mlp<2, false>, k_mlp<2, true>}};

bool cu_mlp_init(cu_impl *c) {
    c->mlp_bar = NULL;
    memset(c->mlp_occ, 0, sizeof c->mlp_occ);
    for (int i = 0; i < 4; i++) {
        int occ = 0;
        /* the tail's instances at the most shared memory they take */
        const size_t smem = i % 2 ? MLP_TAIL_SMEM_MAX : 0;
        if (cudaFuncSetAttribute(mlp_fns[i / 2][i % 2], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mlp_fns[i / 2][i % 2], MLP_THREADS, smem) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            occ = 0;
        }
        c->mlp_occ[i] = occ;
    }
    if (cudaMalloc(&c->mlp_bar, 2 * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(c->mlp_bar, 0, 2 * sizeof(unsigned)) != cudaSuccess) {
        (void)cudaGetLastError();
        if (c->mlp_bar) cudaFree(c->mlp_bar);
        c->mlp_bar = NULL;
        return false;
    }
    /* the phase probe, when asked for (mlp_probe_cap 1): room for the
     * largest grid (8 CTAs per SM) in each slot */
    memset(c->mlp_probe_grid, 0, sizeof c->mlp_probe_grid);
    c->mlp_probe_next = 0;
    if (c->mlp_probe_cap == 1) {
        c->mlp_probe_cap = 8 * c->n_sm;
        const size_t bytes = (size_t)CU_MLP_PROBE_SLOTS * (size_t)c->mlp_probe_cap * 4 * sizeof(unsigned long long);
        if (cudaMalloc(&c->mlp_probe, bytes) != cudaSuccess || cudaMemset(c->mlp_probe, 0, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            if (c->mlp_probe) cudaFree(c->mlp_probe);
            c->mlp_probe = NULL;
            return false;
        }
    } else {
        c->mlp_probe_cap = 0;
    }
    return true;
}

void cu_mlp_free(cu_impl *c) {
    if (c->mlp_bar) cudaFree(c->mlp_bar);
    c->mlp_bar = NULL;
    if (c->mlp_probe) cudaFree(c->mlp_probe);
    c->mlp_probe = NULL;
}

static int cmp_u64(const void *x, const void *y) {
    const unsigned long long a = *(const unsigned long long *)x, b = *(const unsigned long long *)y;
    return a < b ? -1 : a > b;
}

/* One slot's launch, if every CTA stamped all four times: each stamp's
 * min / median / max over the CTAs (ns after the first start) added to
 * sum, the launch's span added to *span; v: scratch of grid entries. */
static bool probe_slot(const unsigned long long *r, int grid, unsigned long long *v, double sum[4][3], double *span) {
    unsigned long long t0 = ~0ull, t_end = 0;
    for (int b = 0; b < grid; b++) {
        for (int i = 0; i < 4; i++)
            if (!r[b * 4 + i]) return false;
        if (r[b * 4] < t0) t0 = r[b * 4];
        if (r[b * 4 + 3] > t_end) t_end = r[b * 4 + 3];
    }
    *span += (double)(t_end - t0);
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < grid; b++) v[b] = r[b * 4 + i] - t0;
        qsort(v, (size_t)grid, sizeof *v, cmp_u64);
        sum[i][0] += (double)v[0];
        sum[i][1] += (double)v[grid / 2];
        sum[i][2] += (double)v[grid - 1];
    }
    return true;
}

int64_t cu_mlp_probe_read(cu_impl *c, double ph_us[4][3], double *span_us) {
    memset(ph_us, 0, 4 * 3 * sizeof(double));
    *span_us = 0;
    if (!c->mlp_probe) return 0;
    const size_t per_slot = (size_t)c->mlp_probe_cap * 4, n = CU_MLP_PROBE_SLOTS * per_slot;
    unsigned long long *h = (unsigned long long *)malloc(n * sizeof *h);
    unsigned long long *v = (unsigned long long *)malloc((size_t)c->mlp_probe_cap * sizeof *v);
    int64_t used = 0;
    double sum[4][3] = {{0}}, span = 0;
    if (!h || !v || cudaStreamSynchronize(c->stream) != cudaSuccess ||
        cudaMemcpy(h, c->mlp_probe, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemset(c->mlp_probe, 0, n * sizeof *h) != cudaSuccess) {
        (void)cudaGetLastError();
        goto out;
    }
    for (int sl = 0; sl < CU_MLP_PROBE_SLOTS; sl++) {
        const int grid = c->mlp_probe_grid[sl];
        if (grid > 0 && probe_slot(h + sl * per_slot, grid, v, sum, &span)) used++;
    }
    for (int i = 0; used && i < 4; i++)
        for (int j = 0; j < 3; j++) ph_us[i][j] = sum[i][j] / 1e3 / (double)used;
    if (used) *span_us = span / 1e3 / (double)used;
out:
    free(h);
    free(v);
    return used;
}

/* CTAs per SM for this shape (0: it cannot run) and its instance. */
static int mlp_pick(const cu_impl *c, const cu_mlp_shape *s, int *fi) {
    /* the bulk-copy GEMV (an A/B switch for the GEMVs themselves) takes
     * the MLP's GEMVs too while it is on */
    if (!c->mlp_persist || c->gemv_bulk || !c->mlp_bar || s->n < 1 || s->n > 2 || s->k % 8 || s->m % 8 ||
        s->k < 8 || s->m < 8 || s->k > INT32_MAX / 2 || s->m > INT32_MAX / 2 || s->h < 1 || s->h > INT32_MAX / 2)
        return 0;
    const bool tail = s->qkv_n > 0;
    if (tail) {
        /* k_add_rmsnorm's shapes (cuda_tape_fuse.cu pattern 3), q/k/v rows
         * of the normalized width, the rows in shared memory */
        int64_t rows = 0;
        for (int j = 0; j < s->qkv_n; j++) rows += s->qkv_m[j];
        if (s->qkv_n > 3 || s->h % 8 || s->h <= 1024 || rows < 1 || rows > INT32_MAX / 2 ||
            (int64_t)s->n * s->h * 4 > MLP_TAIL_SMEM_MAX || c->mlp_tail == 0)
            return 0;
    }
    *fi = (s->n - 1) * 2 + (tail ? 1 : 0);
    const int per_sm = c->mlp_occ[*fi];
    return per_sm < c->mlp_ctas ? per_sm : c->mlp_ctas;
}

bool cu_mlp_fits(const cu_impl *c, const cu_mlp_shape *s) {
    int fi;
    return mlp_pick(c, s, &fi) > 0;
}

void cu_mlp_decode(cu_impl *c, const cu_mlp_shape *s) {
    int fi = 0;
    const int per_sm = mlp_pick(c, s, &fi);
    if (per_sm < 1) return;
    mlp_args a;
    memset(&a, 0, sizeof a);
    a.x = s->x;
    a.wg = s->wg;
    a.wu = s->wu;
    a.wd = s->wd;
    a.gate = s->gate;
    a.up = s->up;
    a.s = s->s;
    a.s_bf = s->s_bf;
    a.d = s->d;
    a.bar = c->mlp_bar;
    a.k = (int)s->k;
    a.m = (int)s->m;
    a.h = (int)s->h;
    a.ksa = cu_gemv_ks(c, s->m, (int)s->k);
    a.ksb = cu_gemv_ks(c, (s->h + 1) / 2, (int)s->m);
    size_t smem = 0;
    if (s->qkv_n > 0) {
        int64_t end = 0;
        for (int j = 0; j < 3; j++) {
            if (j < s->qkv_n) {
                end += s->qkv_m[j];
                a.wq[j] = s->qkv_w[j];
                a.oq[j] = s->qkv_out[j];
            } else {
                a.wq[j] = a.wq[j - 1];
                a.oq[j] = a.oq[j - 1];
            }
            a.qend[j] = (int)end;
        }
        a.ksq = cu_gemv_ks(c, (end + 1) / 2, (int)s->h);
        a.res = s->res;
        a.norm_w = s->norm_w;
        a.eps = s->eps;
        a.xn = s->xn;
        a.xn_bf = s->xn_bf;
        smem = (size_t)s->n * s->h * 4;
    }
    const int grid = per_sm * c->n_sm;
    if (c->mlp_probe && grid <= c->mlp_probe_cap) {
        /* a launch recorded into a graph keeps its slot in every replay */
        const int sl = c->mlp_probe_next;
        c->mlp_probe_next = (sl + 1) % CU_MLP_PROBE_SLOTS;
        c->mlp_probe_grid[sl] = grid;
        a.probe = c->mlp_probe + (size_t)sl * (size_t)c->mlp_probe_cap * 4;
    }
    c->gemv_next = true;
    /* Launched without PDL (NS_CUDA_MLP=1, the default): none of its CTAs
     * becomes resident before the kernel in front of it has finished.
     * With PDL (2) the whole decode step measured 0.4 ms slower at 1k
     * batch 1 (docs/cuda.md v27, runs 1-2), not understood yet. */
    if (c->mlp_persist != 2) c->pdl_anchor = true;
    cu_launch(c, mlp_fns[fi / 2][fi % 2], dim3((unsigned)grid), dim3(MLP_THREADS), smem, a);
}
