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
 * It is launched without programmatic dependent launch (cu_mlp_decode says
 * why); the kernel after it may start early (PDL trigger after the
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
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

#define MLP_WARPS 8
#define MLP_THREADS (MLP_WARPS * 32)
/* polls of the barrier word before a trap: far beyond any real wait */
#define MLP_SPIN_LIMIT (1u << 22)

struct mlp_args {
    const float *x;           /* xn [n, k] */
    const bf16 *wg, *wu, *wd; /* [m, k], [m, k], [h, m] */
    float *gate, *up, *s;     /* [n, m]; s = silu(gate) * up, may alias gate */
    bf16 *s_bf;               /* its bf16 shadow, or NULL */
    float *d;                 /* [n, h] = s @ wd^T */
    unsigned *bar;
    int k, m, h;
};

__device__ __forceinline__ void mlp_named_sync(int id, int n_threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n_threads) : "memory");
}

/* Every CTA arrives once; returns when all have (see the invariants). */
__device__ __forceinline__ void mlp_grid_sync(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(bar, add);
        unsigned now, polls = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(bar) : "memory");
            if (++polls > MLP_SPIN_LIMIT) __trap();
        } while (((old ^ now) & 0x80000000u) == 0);
        __threadfence();
    }
    __syncthreads();
}

/* x loads: phase A's input is read-only while phase A runs (__ldg, as
 * k_gemv); phase B's was written by this kernel (plain coherent loads). */
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

/* The chunk range [cb, ce) of split kp of KS over k / 8 chunks (k_gemv's). */
template <int KS>
__device__ __forceinline__ void mlp_range(int k, int kp, int &cb, int &ce) {
    const int nch = k / 8;
    cb = kp * (nch / KS);
    ce = kp == KS - 1 ? nch : cb + nch / KS;
}

/* One warp's share (split kp) of the dot products of rows w0, w1 with the
 * n inputs, reduced over the warp. PRE: the first block's weights were
 * loaded already (pa, pb; a template flag so that they are not kept live
 * across the later pairs' loops, which spilled at 64 registers). */
template <int N, int KS, bool NC, bool PRE>
__device__ __forceinline__ void mlp_pair(const bf16 *W0, const bf16 *W1, const float *x, int k, int kp, int lane,
                                         const uint4 (&pa)[4], const uint4 (&pb)[4], float (&acc0)[N],
                                         float (&acc1)[N]) {
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W0), *w1 = reinterpret_cast<const uint4 *>(W1);
    int cb, ce;
    mlp_range<KS>(k, kp, cb, ce);
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

/* The KS partial sums of a group meet in shared memory (k_gemv's order);
 * returns true in the warp that holds the totals (kp == 0). */
template <int N, int KS>
__device__ __forceinline__ bool mlp_combine(float (*part)[MLP_WARPS][2][N], int &parity, int wib, int lane,
                                            float (&acc0)[N], float (&acc1)[N]) {
    if constexpr (KS == 1) return true;
    const int kp = wib % KS;
    if (lane == 0) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            part[parity][wib][0][n] = acc0[n];
            part[parity][wib][1][n] = acc1[n];
        }
    }
    mlp_named_sync(1 + wib / KS, KS * 32);
    const int p = parity;
    parity ^= 1; /* the next pair writes the other buffer: no second barrier */
    if (kp != 0) return false;
#pragma unroll
    for (int n = 0; n < N; n++) {
        acc0[n] = part[p][wib][0][n];
        acc1[n] = part[p][wib][1][n];
#pragma unroll
        for (int q = 1; q < KS; q++) {
            acc0[n] += part[p][wib + q][0][n];
            acc1[n] += part[p][wib + q][1][n];
        }
    }
    return true;
}

/* Phase B's epilogue for pair p: rows 2p, 2p + 1 of d (k_gemv's stores). */
template <int N, int KS>
__device__ __forceinline__ void mlp_down_store(const mlp_args &a, float (*part)[MLP_WARPS][2][N], int &parity, int p,
                                               int wib, int lane, float (&acc0)[N], float (&acc1)[N]) {
    if (!mlp_combine<N, KS>(part, parity, wib, lane, acc0, acc1) || lane != 0) return;
    const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
#pragma unroll
    for (int n = 0; n < N; n++) {
        a.d[(size_t)n * a.h + r0] = acc0[n];
        if (r1 != r0) a.d[(size_t)n * a.h + r1] = acc1[n];
    }
}

template <int N, int KSA, int KSB>
__global__ __launch_bounds__(MLP_THREADS, 4) void k_mlp(const __grid_constant__ mlp_args a) {
    __shared__ float part[2][MLP_WARPS][2][N];
    /* no trigger here: dependents launch only after the grid barrier */
    PDL_WAIT();
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    int parity = 0;
    const uint4 none[4] = {};
    /* phase A: pair p = gate row p and up row p, SwiGLU epilogue */
    {
        const int groups = MLP_WARPS / KSA, kp = wib % KSA;
        const int stride = gridDim.x * groups;
        for (int p = blockIdx.x * groups + wib / KSA; p < a.m; p += stride) {
            float acc0[N], acc1[N];
            mlp_pair<N, KSA, true, false>(a.wg + (size_t)p * a.k, a.wu + (size_t)p * a.k, a.x, a.k, kp, lane, none,
                                          none, acc0, acc1);
            if (!mlp_combine<N, KSA>(part, parity, wib, lane, acc0, acc1) || lane != 0) continue;
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
    const int groups = MLP_WARPS / KSB, kp = wib % KSB, pairs = (a.h + 1) / 2;
    const int stride = gridDim.x * groups;
    int p = blockIdx.x * groups + wib / KSB;
    uint4 pa[4], pb[4];
    bool pre = false;
    const bf16 *W0 = a.wd, *W1 = a.wd;
    if (p < pairs) {
        const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
        W0 = a.wd + (size_t)r0 * a.m;
        W1 = a.wd + (size_t)r1 * a.m;
        int cb, ce;
        mlp_range<KSB>(a.m, kp, cb, ce);
        const int c = cb + lane;
        /* warp-uniform (mlp_pair's shuffles need the whole warp on one
         * path): only when every lane has a full first block */
        pre = cb + 31 + 96 < ce;
        if (pre) {
            const uint4 *w0 = reinterpret_cast<const uint4 *>(W0), *w1 = reinterpret_cast<const uint4 *>(W1);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                pa[u] = cu_ld_stream(w0 + c + 32 * u);
                pb[u] = cu_ld_stream(w1 + c + 32 * u);
            }
        }
    }
    mlp_grid_sync(a.bar);
    /* every CTA is resident and past the barrier: the next kernel may
     * start its pre-wait part */
    PDL_TRIGGER();
    /* phase B: the down projection of s; the first pair separately, as
     * the only one that may start from the prefetched block */
    if (p < pairs) {
        float acc0[N], acc1[N];
        if (pre) mlp_pair<N, KSB, false, true>(W0, W1, a.s, a.m, kp, lane, pa, pb, acc0, acc1);
        else mlp_pair<N, KSB, false, false>(W0, W1, a.s, a.m, kp, lane, none, none, acc0, acc1);
        mlp_down_store<N, KSB>(a, part, parity, p, wib, lane, acc0, acc1);
    }
    for (p += stride; p < pairs; p += stride) {
        const int r0 = 2 * p, r1 = r0 + 1 < a.h ? r0 + 1 : r0;
        float acc0[N], acc1[N];
        mlp_pair<N, KSB, false, false>(a.wd + (size_t)r0 * a.m, a.wd + (size_t)r1 * a.m, a.s, a.m, kp, lane, none,
                                       none, acc0, acc1);
        mlp_down_store<N, KSB>(a, part, parity, p, wib, lane, acc0, acc1);
    }
}

typedef void (*mlp_fn)(const mlp_args);

#define MLP_KSB(N, KSA) {k_mlp<N, KSA, 1>, k_mlp<N, KSA, 2>, k_mlp<N, KSA, 4>}
#define MLP_KSA(N) {MLP_KSB(N, 1), MLP_KSB(N, 2), MLP_KSB(N, 4)}
/* [n - 1][ksa index][ksb index], index 0/1/2 = split 1/2/4 */
static const mlp_fn mlp_fns[2][3][3] = {MLP_KSA(1), MLP_KSA(2)};

static int ks_index(int ks) { return ks == 1 ? 0 : ks == 2 ? 1 : 2; }

bool cu_mlp_init(cu_impl *c) {
    c->mlp_bar = NULL;
    memset(c->mlp_occ, 0, sizeof c->mlp_occ);
    for (int i = 0; i < 18; i++) {
        int occ = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, mlp_fns[i / 9][(i / 3) % 3][i % 3], MLP_THREADS, 0) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            occ = 0;
        }
        c->mlp_occ[i] = occ;
    }
    if (cudaMalloc(&c->mlp_bar, sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(c->mlp_bar, 0, sizeof(unsigned)) != cudaSuccess) {
        (void)cudaGetLastError();
        if (c->mlp_bar) cudaFree(c->mlp_bar);
        c->mlp_bar = NULL;
        return false;
    }
    return true;
}

void cu_mlp_free(cu_impl *c) {
    if (c->mlp_bar) cudaFree(c->mlp_bar);
    c->mlp_bar = NULL;
}

/* The kernel instance for this shape (index into mlp_fns / mlp_occ) and
 * its CTAs per SM; 0 CTAs when it cannot run. */
static int mlp_pick(const cu_impl *c, const cu_mlp_shape *s, int *fi) {
    /* the bulk-copy GEMV (an A/B switch for the GEMVs themselves) takes
     * the MLP's GEMVs too while it is on */
    if (!c->mlp_persist || c->gemv_bulk || !c->mlp_bar || s->n < 1 || s->n > 2 || s->k % 8 || s->m % 8 || s->k < 8 || s->m < 8 ||
        s->k > INT32_MAX / 2 || s->m > INT32_MAX / 2 || s->h < 1 || s->h > INT32_MAX / 2)
        return 0;
    const int ksa = cu_gemv_ks(c, s->m, (int)s->k), ksb = cu_gemv_ks(c, (s->h + 1) / 2, (int)s->m);
    *fi = (s->n - 1) * 9 + ks_index(ksa) * 3 + ks_index(ksb);
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
    c->gemv_next = true;
    /* Launched without PDL (NS_CUDA_MLP=1, the default): none of its CTAs
     * becomes resident before the add + RMSNorm in front of it has
     * finished. With PDL (2) the whole decode step measured 0.4 ms slower
     * at 1k batch 1 (docs/cuda.md v27, runs 1-2), not understood yet. */
    if (c->mlp_persist != 2) c->pdl_anchor = true;
    cu_launch(c, mlp_fns[fi / 9][(fi / 3) % 3][fi % 3], dim3((unsigned)(per_sm * c->n_sm)), dim3(MLP_THREADS), 0, a);
}
