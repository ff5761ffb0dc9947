/* cuda_gemv_bulk.cu — the batch 1-2 GEMV fed by bulk copies (TMA, 1-D)
 * into a shared-memory ring, one persistent CTA per SM.
 *
 * Why: k_gemv (cuda_gemm.cu) streams each weight row with register loads
 * from thousands of short-lived CTAs. Each launch pays a ramp (the first
 * loads go out only after the PDL wait, so HBM idles from the previous
 * kernel's last bytes to this one's first) and a tail (the last wave's
 * CTAs finish unevenly), ~3 us per GEMV at batch 1 on an H200, ~13 us of
 * the ~26 us per layer above the bandwidth floor (docs/cuda.md v24).
 * Here:
 * - grid = one CTA per SM (c->gemv_bulk_ctas per SM); CTA b owns the
 *   contiguous rows [m*b/G, m*(b+1)/G) of every segment, so every CTA
 *   streams the same number of bytes (within one row) and all finish
 *   together: no tail wave;
 * - one producer lane copies the CTA's rows, which are contiguous bytes,
 *   in stages of stage_bytes by cp.async.bulk into n_stages ring slots
 *   ("full" mbarrier per slot, completed by the copy's bytes; "empty"
 *   mbarrier per slot, one arrival per consumer warp);
 * - with `early` (a recorded tape whose weights no op writes) the first
 *   n_stages copies are issued before the PDL wait: the CTA is resident
 *   while the kernel before it runs (its shared memory is sized so two of
 *   these CTAs fit on one SM), so HBM is busy across the boundary;
 * - the consumers (8 warps) wait for the previous kernel (PDL), stage
 *   the input rows x in shared memory as F32 (never rounded: same inputs
 *   as k_gemv), then each warp sums the rows it owns (every 8th) from the
 *   stages they lie in, one shuffle reduction per row (gb_consume). The
 *   result is deterministic (not bit-identical to k_gemv, whose lanes
 *   partition K differently).
 * Epilogues as k_gemv's: plain stores per segment, or SwiGLU (segments
 * gate and up of equal rows: gate, up, silu(gate) * up and its bf16
 * shadow).
 *
 * Status: measured slower than k_gemv in the decode step (1k batch 1
 * 4.54 -> 6.75 ms/step; isolated GEMVs within 5-35%), so off by default
 * (NS_CUDA_GEMV_BULK); docs/cuda.md v24 has the numbers and what they
 * mean for a persistent per-layer kernel.
 *
 * Invariants
 * - Shapes the host accepts: 1 <= n <= 2, K % 256 == 0, 16-byte aligned
 *   weights, rows per CTA within the shared-memory budget; otherwise
 *   cu_gemv_bulk returns false and nothing is launched (k_gemv runs).
 * - Compute capability >= 9.0 (cp.async.bulk, mbarrier tx counts).
 * - Every mbarrier wait after the PDL wait is bounded and traps (the
 *   launch fails) instead of hanging the stream.
 */
#include <string.h>

#include "backend/cuda/cuda_attn_dm.cuh" /* the mbarrier and bulk-copy primitives (dm_*) */
#include "backend/cuda/cuda_internal.cuh"

#define GB_CONSUMERS 8
#define GB_THREADS ((GB_CONSUMERS + 1) * 32)
#define GB_MAX_STAGES 8
#define GB_XU 12 /* x loads per thread in flight when staging x */

struct gb_args {
    const bf16 *w[3];
    float *o[3];
    int m[3];
    int nseg;
    int K;
    const float *x;
    float *sw_out; /* SW: silu(gate) * up [N, m], and its bf16 shadow (or NULL) */
    bf16 *sw_bf;
    int stage_bytes, n_stages;
    int rows_cap; /* part[] rows: at least the CTA's rows over all segments */
    int early;    /* first n_stages copies before the PDL wait */
};

__device__ __forceinline__ uint32_t gb_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Rows [r0, r1) of a segment of m rows owned by CTA b of G. */
__device__ __forceinline__ void gb_range(int m, int b, int G, int &r0, int &r1) {
    r0 = (int)((int64_t)m * b / G);
    r1 = (int)((int64_t)m * (b + 1) / G);
}

/* The producer lane: every stage of the CTA's rows, in stream order. */
__device__ __forceinline__ void gb_produce(const gb_args &a, uint8_t *stages, uint64_t *full, uint64_t *empty) {
    const int G = gridDim.x, b = blockIdx.x, SB = a.stage_bytes, NS = a.n_stages;
    if (!a.early) PDL_WAIT();
    bool waited = !a.early;
    int it = 0;
    for (int s = 0; s < a.nseg; s++) {
        int r0, r1;
        gb_range(a.m[s], b, G, r0, r1);
        const uint8_t *src = reinterpret_cast<const uint8_t *>(a.w[s] + (size_t)r0 * a.K);
        const size_t bytes = (size_t)(r1 - r0) * a.K * 2;
        for (size_t off = 0; off < bytes; off += SB, it++) {
            const int slot = it % NS, use = it / NS;
            if (use > 0) {
                /* the consumers free slots only after their PDL wait:
                 * wait for it too, so the bounded wait below never
                 * times a long previous kernel */
                if (!waited) {
                    PDL_WAIT();
                    waited = true;
                }
                dm_mbar_wait(gb_addr(&empty[slot]), (uint32_t)((use - 1) & 1));
            }
            const uint32_t len = (uint32_t)(bytes - off < (size_t)SB ? bytes - off : (size_t)SB);
            dm_mbar_expect(gb_addr(&full[slot]), len);
            dm_bulk_copy(gb_addr(stages + (size_t)slot * SB), src + off, len, gb_addr(&full[slot]));
        }
    }
}

/* Consumer warp `warp` owns the CTA's local rows lr (counted over the
 * segments in order) with lr % GB_CONSUMERS == warp and sums each of them
 * alone: lanes stride the row's chunks in the stages it spans (its sums
 * carry across a stage boundary), 4 chunks in flight per lane, and one
 * shuffle reduction per row stores part[lr][n]. Every warp waits for
 * every stage and releases it (its own rows' chunks read or none there),
 * so a stage is refilled once all its rows' owners are done with it and
 * warps work on different stages at once. (The first version split every
 * stage across all 8 warps, 32 chunks each, with a shuffle reduction and
 * a read-modify-write of part per 32 chunks: its latency chain, ~1300
 * cycles per 16 KB stage with 2 warps per scheduler, held the kernel to
 * ~1.5 TB/s; docs/cuda.md v24.) */
template <int N>
__device__ __forceinline__ void gb_consume(const gb_args &a, const uint8_t *stages, const float4 *xs, float *part,
                                           uint64_t *full, uint64_t *empty, int warp, int lane) {
    const int G = gridDim.x, b = blockIdx.x, SB = a.stage_bytes, NS = a.n_stages, cpr = a.K / 8;
    int it = 0, lbase = 0;
    float acc[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc[n] = 0.f;
    for (int s = 0; s < a.nseg; s++) {
        int r0, r1;
        gb_range(a.m[s], b, G, r0, r1);
        const size_t bytes = (size_t)(r1 - r0) * a.K * 2;
        for (size_t off = 0; off < bytes; off += SB, it++) {
            const int slot = it % NS, use = it / NS;
            dm_mbar_wait(gb_addr(&full[slot]), (uint32_t)(use & 1));
            const int g0 = (int)(off / 16);
            const int g1 = g0 + (int)((bytes - off < (size_t)SB ? bytes - off : (size_t)SB) / 16);
            const uint4 *ws = reinterpret_cast<const uint4 *>(stages + (size_t)slot * SB) - g0;
            /* the first row of this stage that the warp owns */
            int r = g0 / cpr;
            r += (warp - (lbase + r) % GB_CONSUMERS + GB_CONSUMERS) % GB_CONSUMERS;
            for (; r * cpr < g1; r += GB_CONSUMERS) {
                const int rb = r * cpr, c1 = g1 < rb + cpr ? g1 : rb + cpr;
                /* chunk ranges start and end on multiples of 32 (K % 256
                 * == 0, stages of whole 4 KB): every lane runs the same
                 * trip counts */
                int c = (g0 > rb ? g0 : rb) + lane;
                for (; c + 96 < c1; c += 128) {
                    uint4 w4[4];
#pragma unroll
                    for (int u = 0; u < 4; u++) w4[u] = ws[c + 32 * u];
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const int col = c + 32 * u - rb;
#pragma unroll
                        for (int n = 0; n < N; n++)
                            acc[n] += cu_dot8(w4[u], xs[(2 * n) * cpr + col], xs[(2 * n + 1) * cpr + col]);
                    }
                }
                for (; c < c1; c += 32) {
                    const uint4 wv = ws[c];
                    const int col = c - rb;
#pragma unroll
                    for (int n = 0; n < N; n++)
                        acc[n] += cu_dot8(wv, xs[(2 * n) * cpr + col], xs[(2 * n + 1) * cpr + col]);
                }
                if (c1 == rb + cpr) { /* the row ends in this stage */
#pragma unroll
                    for (int n = 0; n < N; n++) {
                        const float v = cu_warp_sum(acc[n]);
                        if (lane == 0) part[(lbase + r) * N + n] = v;
                        acc[n] = 0.f;
                    }
                }
            }
            __syncwarp();
            if (lane == 0) asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                                            gb_addr(&empty[slot]))
                                        : "memory");
        }
        lbase += r1 - r0;
    }
}

template <int N, bool SW>
__global__ __launch_bounds__(GB_THREADS, 2) void k_gemv_bulk(const __grid_constant__ gb_args a) {
    extern __shared__ __align__(128) uint8_t gb_smem[];
    PDL_TRIGGER();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, K = a.K, cpr = K / 8;
    uint8_t *stages = gb_smem;
    float4 *xs = reinterpret_cast<float4 *>(gb_smem + (size_t)a.n_stages * a.stage_bytes); /* [N][2][cpr] */
    float *part = reinterpret_cast<float *>(xs + (size_t)N * 2 * cpr); /* [rows_cap][N] */
    const size_t part_bytes = ((size_t)a.rows_cap * N * 4 + 15) & ~(size_t)15;
    uint64_t *full = reinterpret_cast<uint64_t *>(reinterpret_cast<uint8_t *>(part) + part_bytes);
    uint64_t *empty = full + GB_MAX_STAGES;
    if (threadIdx.x == 0) {
        for (int i = 0; i < a.n_stages; i++) {
            dm_mbar_init(gb_addr(&full[i]), 1);
            dm_mbar_init(gb_addr(&empty[i]), GB_CONSUMERS);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads(); /* barriers initialised: the last block-wide barrier */
    if (warp == GB_CONSUMERS) {
        if (lane == 0) gb_produce(a, stages, full, empty);
        return;
    }
    const int tid = threadIdx.x, nthr = GB_CONSUMERS * 32;
    PDL_WAIT();
    /* x[n][8c + 4h .. +3] -> xs[(2n + h) * cpr + c]: a warp's float4 loads
     * of one half are consecutive (no bank conflicts) */
    for (int i0 = tid; i0 < N * 2 * cpr; i0 += GB_XU * nthr) {
        /* all of a thread's loads in flight at once (12 float4 cover
         * K = 12288 at one row), then the stores: this is on the path
         * from the PDL wait to the first dot product */
        float4 v[GB_XU];
#pragma unroll
        for (int u = 0; u < GB_XU; u++)
            if (i0 + u * nthr < N * 2 * cpr) v[u] = cu_ld_act4<false>(a.x + 4 * (size_t)(i0 + u * nthr));
#pragma unroll
        for (int u = 0; u < GB_XU; u++) {
            const int i = i0 + u * nthr, n = i / (2 * cpr), j = i - n * 2 * cpr;
            if (i < N * 2 * cpr) xs[(2 * n + (j & 1)) * cpr + (j >> 1)] = v[u];
        }
    }
    asm volatile("bar.sync 1, %0;\n" ::"r"(nthr) : "memory");
    gb_consume<N>(a, stages, xs, part, full, empty, warp, lane);
    asm volatile("bar.sync 1, %0;\n" ::"r"(nthr) : "memory");
    const int G = gridDim.x, b = blockIdx.x;
    if constexpr (SW) {
        int r0, r1;
        gb_range(a.m[0], b, G, r0, r1);
        const int nr = r1 - r0, M = a.m[0];
        for (int r = tid; r < nr; r += nthr) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                /* k_gemv's SwiGLU epilogue: gate, up, then silu(gate) * up */
                const float g = part[r * N + n], u = part[(nr + r) * N + n];
                const float y = g / (1.0f + expf(-g)) * u;
                const size_t o = (size_t)n * M + r0 + r;
                a.o[0][o] = g;
                a.o[1][o] = u;
                a.sw_out[o] = y;
                if (a.sw_bf) a.sw_bf[o] = __float2bfloat16_rn(y);
            }
        }
    } else {
        int lbase = 0;
        for (int s = 0; s < a.nseg; s++) {
            int r0, r1;
            gb_range(a.m[s], b, G, r0, r1);
            for (int r = tid; r < r1 - r0; r += nthr) {
#pragma unroll
                for (int n = 0; n < N; n++) a.o[s][(size_t)n * a.m[s] + r0 + r] = part[(lbase + r) * N + n];
            }
            lbase += r1 - r0;
        }
    }
}

typedef void (*gb_fn)(gb_args);
static const gb_fn gb_fns[2][2] = {{k_gemv_bulk<1, false>, k_gemv_bulk<2, false>},
                                   {k_gemv_bulk<1, true>, k_gemv_bulk<2, true>}};

bool cu_gemv_bulk_init(cu_impl *c) {
    /* the limit is set even when the switch is off: ns_cuda_set_gemv_bulk
     * may turn it on later */
    if (c->cc_major < 9) {
        c->gemv_bulk = 0;
        return true;
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (cu_check(c, cudaFuncSetAttribute(gb_fns[i][j], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 c->smem_optin),
                         "gemv_bulk smem"))
                return false;
    return true;
}

bool cu_gemv_bulk(cu_impl *c, int nseg, float *const *out, const bf16 *const *w, const int64_t *m, const float *x,
                  int n, int k, float *sw_out, bf16 *sw_bf) {
    if (!c->gemv_bulk || n < 1 || n > 2 || k < 256 || k % 256 || nseg < 1 || nseg > 3 || (sw_out && nseg != 2))
        return false;
    const int G = c->n_sm * c->gemv_bulk_ctas;
    gb_args a;
    memset(&a, 0, sizeof a);
    int64_t rows_cap = 0;
    for (int s = 0; s < nseg; s++) {
        if (m[s] < 1 || m[s] > INT32_MAX / 2 || ((uintptr_t)w[s] % 16)) return false;
        a.w[s] = w[s];
        a.o[s] = out[s];
        a.m[s] = (int)m[s];
        rows_cap += (m[s] + G - 1) / G;
    }
    if (sw_out && m[0] != m[1]) return false;
    a.nseg = nseg;
    a.K = k;
    a.x = x;
    a.sw_out = sw_out;
    a.sw_bf = sw_bf;
    a.rows_cap = (int)rows_cap;
    a.stage_bytes = c->gemv_bulk_stage;
    /* shared memory: the ring, x (N x K F32), part, 2 x GB_MAX_STAGES barriers */
    const size_t fixed = (size_t)n * k * 4 + (((size_t)rows_cap * n * 4 + 15) & ~(size_t)15) + 2 * GB_MAX_STAGES * 8;
    if (fixed + 2 * (size_t)a.stage_bytes > (size_t)c->gemv_bulk_smem) return false;
    size_t ns = ((size_t)c->gemv_bulk_smem - fixed) / (size_t)a.stage_bytes;
    if (ns > GB_MAX_STAGES) ns = GB_MAX_STAGES;
    a.n_stages = (int)ns;
    a.early = c->tape_early ? 1 : 0;
    const size_t smem = ns * (size_t)a.stage_bytes + fixed;
    /* the CTAs must all be resident at once and should share an SM with
     * the next kernel's: PDL stays on after a GEMV (cu_launch) */
    c->gemv_next = false;
    cu_launch(c, gb_fns[sw_out ? 1 : 0][n - 1], dim3((unsigned)G), dim3(GB_THREADS), smem, a);
    return true;
}
