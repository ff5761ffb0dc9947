/* cuda_gemm.cu — the matmul op: out[n,m] = in[n,k] @ w[m,k]^T, w BF16.
 *
 * Two paths:
 * - n <= gemv_max (decode of small batches): a GEMV kernel that streams
 *   the BF16 weight rows once with 16-byte non-caching loads and reads the
 *   F32 activations directly (they stay in L1), so the activations are
 *   never rounded to bf16 on this path. The time is the weight bytes over
 *   HBM bandwidth.
 * - otherwise cuBLASLt with BF16 A/B (activations come as their BF16
 *   shadow, see cuda_internal.cuh), FP32 accumulation and FP32 output.
 *   Plans (descriptors + heuristic algorithm) are cached per shape and
 *   pointer alignment; all of it is capturable in a CUDA graph since the
 *   workspace is preallocated.
 * Row-major out[n,m] is column-major out^T[m,n] = W (col-major k x m, op T)
 * times in^T (col-major k x n), which is how the Lt layouts are set.
 */
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

/* ----------------------------------------------------------------- GEMV */

/* Each warp computes 2 output rows for all N inputs; lanes stride the
 * row in 16-byte chunks, 4 chunks per row in flight per lane. The rows
 * may come from up to 3 weight matrices that share the input (q/k/v,
 * gate/up): one launch streams all of them, so the ramp-up and tail of a
 * launch are paid once per group. */
struct gemv_segs {
    const bf16 *w0, *w1, *w2;
    float *o0, *o1, *o2; /* SwiGLU mode: o2 is the swiglu output */
    bf16 *obf;           /* SwiGLU mode: its bf16 shadow, or NULL */
    int end0, end1, end2; /* cumulative row ends */
    int late; /* NS_CUDA_PDL_GEMV=2: trigger the dependent launch after the main loop, not at entry */
};

__device__ __forceinline__ void gemv_row(const gemv_segs &s, int r, const bf16 *&w, float *&o, int &local, int &M) {
    if (r < s.end0) {
        w = s.w0, o = s.o0, local = r, M = s.end0;
    } else if (r < s.end1) {
        w = s.w1, o = s.o1, local = r - s.end0, M = s.end1 - s.end0;
    } else {
        w = s.w2, o = s.o2, local = r - s.end1, M = s.end2 - s.end1;
    }
}

/* KS warps share a row pair, each summing 1/KS of K (split-K), so short
 * matrices (few rows per SM) still put enough warps on the memory system;
 * the partial sums meet in shared memory. */
template <int N, int KS, bool SW, bool NC>
__global__ __launch_bounds__(128) void k_gemv(gemv_segs sg, const float *__restrict__ x, int K) {
    if (!sg.late) PDL_TRIGGER();
    PDL_WAIT();
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int pair = blockIdx.x * (4 / KS) + wib / KS, kp = wib % KS;
    /* SW: the pair is row `pair` of gate (segment 0) and of up (segment
     * 1), and the epilogue applies SwiGLU; else rows 2*pair, 2*pair+1 of
     * the concatenated segments */
    const int total = SW ? sg.end0 : sg.end2;
    const int row0 = SW ? pair : pair * 2;
    const bool active = row0 < total;
    const int row1 = SW ? pair + sg.end0 : (row0 + 1 < total ? row0 + 1 : row0);
    const int nch = K / 8;
    const int cb = kp * (nch / KS), ce = kp == KS - 1 ? nch : cb + nch / KS;
    float acc0[N], acc1[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc0[n] = acc1[n] = 0.f;
    const bf16 *W0 = NULL, *W1 = NULL;
    float *O0 = NULL, *O1 = NULL;
    int l0 = 0, l1 = 0, M0 = 0, M1 = 0;
    if (active) {
        gemv_row(sg, row0, W0, O0, l0, M0);
        gemv_row(sg, row1, W1, O1, l1, M1);
        const uint4 *w0 = reinterpret_cast<const uint4 *>(W0 + (size_t)l0 * K);
        const uint4 *w1 = reinterpret_cast<const uint4 *>(W1 + (size_t)l1 * K);
        int c = cb + lane;
        for (; c + 96 < ce; c += 128) {
            uint4 a[4], b[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                a[u] = cu_ld_stream(w0 + c + 32 * u);
                b[u] = cu_ld_stream(w1 + c + 32 * u);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int n = 0; n < N; n++) {
                    const float *xv = x + (size_t)n * K + 8 * (c + 32 * u);
                    float4 x0 = cu_ld_act4<NC>(xv), x1 = cu_ld_act4<NC>(xv + 4);
                    acc0[n] += cu_dot8(a[u], x0, x1);
                    acc1[n] += cu_dot8(b[u], x0, x1);
                }
            }
        }
        for (; c < ce; c += 32) {
            uint4 a = cu_ld_stream(w0 + c), b = cu_ld_stream(w1 + c);
#pragma unroll
            for (int n = 0; n < N; n++) {
                const float *xv = x + (size_t)n * K + 8 * c;
                float4 x0 = cu_ld_act4<NC>(xv), x1 = cu_ld_act4<NC>(xv + 4);
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
    /* late: the next kernel's CTAs may start once every CTA of this one
     * has streamed its rows (they then overlap only the epilogues) */
    if (sg.late) PDL_TRIGGER();
    if constexpr (KS > 1) {
        __shared__ float part[4][2][N];
        if (lane == 0) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                part[wib][0][n] = acc0[n];
                part[wib][1][n] = acc1[n];
            }
        }
        __syncthreads();
        if (kp != 0) return;
#pragma unroll
        for (int n = 0; n < N; n++) {
            acc0[n] = part[wib][0][n];
            acc1[n] = part[wib][1][n];
#pragma unroll
            for (int q = 1; q < KS; q++) {
                acc0[n] += part[wib + q][0][n];
                acc1[n] += part[wib + q][1][n];
            }
        }
    }
    if (active && lane == 0) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            if constexpr (SW) {
                /* exactly what the unfused ops leave: gate and up as the
                 * GEMMs wrote them, then out = silu(gate) * up (out may
                 * be gate itself, written last) */
                const float g = acc0[n], u = acc1[n];
                const float y = g / (1.0f + expf(-g)) * u;
                O0[(size_t)n * M0 + l0] = g;
                O1[(size_t)n * M1 + l1] = u;
                sg.o2[(size_t)n * M0 + l0] = y;
                if (sg.obf) sg.obf[(size_t)n * M0 + l0] = __float2bfloat16_rn(y);
            } else {
                O0[(size_t)n * M0 + l0] = acc0[n];
                if (row1 != row0) O1[(size_t)n * M1 + l1] = acc1[n];
            }
        }
    }
}

typedef void (*gemv_fn)(gemv_segs, const float *, int);

/* [NC][n - 1][ks] tables: NC = c->act_nc (cu_ld_act4) */
#define GEMV_ROW(N, SW, NC) {k_gemv<N, 1, SW, NC>, k_gemv<N, 2, SW, NC>, k_gemv<N, 4, SW, NC>}
#define GEMV_ROWS8(NC)                                                                                                \
    {GEMV_ROW(1, false, NC), GEMV_ROW(2, false, NC), GEMV_ROW(3, false, NC), GEMV_ROW(4, false, NC),                  \
     GEMV_ROW(5, false, NC), GEMV_ROW(6, false, NC), GEMV_ROW(7, false, NC), GEMV_ROW(8, false, NC)}

/* gemv_warps per SM (default 128, ~17k warps on an H200): split K when
 * there are fewer row pairs, keeping >= 64 chunks of 8 per warp. */
int cu_gemv_ks(const cu_impl *c, int64_t pairs, int k) {
    const int64_t want_warps = (int64_t)c->gemv_warps * c->n_sm;
    int ks = 1;
    while (ks < 4 && pairs * ks < want_warps && (k / 8) / (ks * 2) >= 64) ks *= 2;
    return ks;
}

void cu_gemv_multi(cu_impl *c, int nseg, float *const *out, const bf16 *const *w, const int64_t *m, const float *x,
                   int n, int k) {
    static const gemv_fn fns[2][8][3] = {GEMV_ROWS8(false), GEMV_ROWS8(true)};
    if (n <= 2 && cu_gemv_bulk(c, nseg, out, w, m, x, n, k, NULL, NULL)) return;
    /* inputs beyond 8 rows: repeat in groups of 8 */
    for (int n0 = 0; n0 < n; n0 += 8) {
        int nn = n - n0 < 8 ? n - n0 : 8;
        gemv_segs sg;
        memset(&sg, 0, sizeof sg);
        sg.w0 = w[0];
        sg.o0 = out[0] + (size_t)n0 * m[0];
        sg.end0 = (int)m[0];
        sg.end1 = sg.end0 + (nseg > 1 ? (int)m[1] : 0);
        sg.end2 = sg.end1 + (nseg > 2 ? (int)m[2] : 0);
        if (nseg > 1) sg.w1 = w[1], sg.o1 = out[1] + (size_t)n0 * m[1];
        if (nseg > 2) sg.w2 = w[2], sg.o2 = out[2] + (size_t)n0 * m[2];
        const int64_t pairs = (sg.end2 + 1) / 2;
        const int ks = cu_gemv_ks(c, pairs, k);
        const int ki = ks == 1 ? 0 : ks == 2 ? 1 : 2;
        const int64_t pairs_per_block = 4 / ks;
        const unsigned blocks = (unsigned)((pairs + pairs_per_block - 1) / pairs_per_block);
        sg.late = c->pdl_gemv == 2;
        c->gemv_next = true;
        cu_launch(c, fns[c->act_nc ? 1 : 0][nn - 1][ki], dim3(blocks), dim3(128), 0, sg, x + (size_t)n0 * k, k);
        if (c->err_status != NS_OK) return;
    }
}

void cu_gemv_swiglu(cu_impl *c, float *gate, float *up, float *out, bf16 *out_bf, const bf16 *wg, const bf16 *wu,
                    int64_t m, const float *x, int n, int k) {
    static const gemv_fn fns[2][2][3] = {{GEMV_ROW(1, true, false), GEMV_ROW(2, true, false)},
                                         {GEMV_ROW(1, true, true), GEMV_ROW(2, true, true)}};
    if (n <= 2) {
        float *outs[2] = {gate, up};
        const bf16 *ws[2] = {wg, wu};
        const int64_t ms[2] = {m, m};
        if (cu_gemv_bulk(c, 2, outs, ws, ms, x, n, k, out, out_bf)) return;
    }
    for (int n0 = 0; n0 < n; n0 += 2) {
        int nn = n - n0 < 2 ? n - n0 : 2;
        gemv_segs sg;
        memset(&sg, 0, sizeof sg);
        sg.w0 = wg;
        sg.w1 = wu;
        sg.o0 = gate + (size_t)n0 * m;
        sg.o1 = up + (size_t)n0 * m;
        sg.o2 = out + (size_t)n0 * m;
        sg.obf = out_bf ? out_bf + (size_t)n0 * m : NULL;
        sg.end0 = (int)m;
        sg.end1 = sg.end2 = (int)(2 * m);
        const int ks = cu_gemv_ks(c, m, k);
        const int ki = ks == 1 ? 0 : ks == 2 ? 1 : 2;
        const int64_t pairs_per_block = 4 / ks;
        const unsigned blocks = (unsigned)((m + pairs_per_block - 1) / pairs_per_block);
        sg.late = c->pdl_gemv == 2;
        c->gemv_next = true;
        cu_launch(c, fns[c->act_nc ? 1 : 0][nn - 1][ki], dim3(blocks), dim3(128), 0, sg, x + (size_t)n0 * k, k);
        if (c->err_status != NS_OK) return;
    }
}

static void launch_gemv(cu_impl *c, float *out, const float *x, const bf16 *w, int n, int m, int k) {
    int64_t mm = m;
    cu_gemv_multi(c, 1, &out, &w, &mm, x, n, k);
}

/* ------------------------------------------------------------- cuBLASLt */

static int ptr_align(const void *p) {
    uintptr_t v = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (v % (uintptr_t)a)) a >>= 1;
    return a;
}

static cu_gemm_plan *get_plan(cu_impl *c, int64_t m, int64_t n, int64_t k, int align) {
    for (int i = 0; i < c->n_plans; i++) {
        cu_gemm_plan *p = &c->plans[i];
        if (p->m == m && p->n == n && p->k == k && p->align == align) return p->ok ? p : NULL;
    }
    if (c->capturing) {
        /* heuristic queries are host-only, but keep capture minimal */
    }
    cu_gemm_plan *p;
    if (c->n_plans < CU_MAX_PLANS) {
        p = &c->plans[c->n_plans++];
    } else {
        /* table full (many distinct batch sizes): recycle the oldest slot */
        p = &c->plans[0];
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        memmove(&c->plans[0], &c->plans[1], (CU_MAX_PLANS - 1) * sizeof *p);
        p = &c->plans[CU_MAX_PLANS - 1];
    }
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    p->k = k;
    p->align = align;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    uint32_t al = (uint32_t)align;
    if (cu_check_blas(c, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate") ||
        cu_check_blas(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA") ||
        cu_check_blas(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB") ||
        cu_check_blas(c, cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)k, (uint64_t)m, k), "layout A") ||
        cu_check_blas(c, cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k), "layout B") ||
        cu_check_blas(c, cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m), "layout C") ||
        cu_check_blas(c, cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate"))
        goto done;
    if (cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &c->lt_ws_bytes, sizeof c->lt_ws_bytes),
                      "pref workspace") ||
        cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al,
                                                               sizeof al), "pref align A") ||
        cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al,
                                                               sizeof al), "pref align B") ||
        cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al,
                                                               sizeof al), "pref align C") ||
        cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al,
                                                               sizeof al), "pref align D"))
        goto done;
    if (cu_check_blas(c, cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres),
                      "AlgoGetHeuristic"))
        goto done;
    if (nres < 1) {
        cu_check_blas(c, CUBLAS_STATUS_NOT_SUPPORTED, "no cuBLASLt algorithm for this bf16 GEMM");
        goto done;
    }
    p->algo = res.algo;
    p->ok = true;
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return p->ok ? p : NULL;
}

/* out (+)= in_bf @ w^T through cuBLASLt; beta 1 adds to what out holds
 * (D = C = out: the epilogue computes acc + out once in f32, the same
 * rounding as a separate residual add of the product). */
static void gemm_lt(cu_impl *c, float *out, const bf16 *in_bf, const bf16 *w, int64_t n, int64_t m, int64_t k,
                    float beta) {
    int align = ptr_align(out);
    int a2 = ptr_align(in_bf), a3 = ptr_align(w);
    if (a2 < align) align = a2;
    if (a3 < align) align = a3;
    cu_gemm_plan *p = get_plan(c, m, n, k, align);
    if (!p) return;
    const float alpha = 1.0f;
    cu_check_blas(c,
                  cublasLtMatmul(c->lt, p->op, &alpha, w, p->la, in_bf, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                                 c->lt_ws, c->lt_ws_bytes, c->stream),
                  "cublasLtMatmul");
}

void cu_gemm(cu_impl *c, float *out, const bf16 *in_bf, const float *in_f32, const bf16 *w, int64_t n, int64_t m,
             int64_t k) {
    if (!in_bf) {
        launch_gemv(c, out, in_f32, w, (int)n, (int)m, (int)k);
        return;
    }
    gemm_lt(c, out, in_bf, w, n, m, k, 0.0f);
}

void cu_gemm_acc(cu_impl *c, float *out, const bf16 *in_bf, const bf16 *w, int64_t n, int64_t m, int64_t k) {
    gemm_lt(c, out, in_bf, w, n, m, k, 1.0f);
}

/* ------------------------------------------- decode GEMVs with row ops
 *
 * At batch 1-2 the RMSNorm before a GEMV group and the residual add after
 * a GEMV are kernels of their own that move a few kilobytes each, and each
 * costs a launch, a PDL wait and a latency chain (~3-4 us in a graph).
 * These variants of k_gemv fold them in (cuda_decode.cu matches the tape
 * patterns; NS_CUDA_DEC_FUSE switches them):
 * - NORM: the input is the residual x (not normalized). The dot products
 *   run on x * w (w the norm weight, read beside x through L1), and each
 *   warp sums x^2 from the very x values it loads: with one warp per row
 *   pair (KS = 1) the lanes cover all of K, with KS > 1 the K-slices'
 *   sums meet in shared memory with the dot products. Every warp sums in
 *   the same order, so every row gets the same inv = 1 / sqrt(mean + eps)
 *   (deterministic), and the epilogue scales the sums by it:
 *   y = inv * (W . (x * w)) instead of W . ((x * inv) * w) -- equal up to
 *   float rounding (~1e-7 relative), not bit-identical to the unfused ops.
 *   Warp 0 of block 0 also writes the normalized rows to xn, as the
 *   unfused RMSNorm leaves them. No prologue: v17's first version
 *   normalized the row in every block before its dot products (two
 *   barriers, 16 KB of shared memory) and was 1.5 ms per step slower.
 * - ADD: the epilogue also does res += out (the residual add that follows
 *   the output and down projections), res[i] = res[i] + y as k_add4 does.
 * With `early` (NS_CUDA_DEC_EARLY, only after another GEMV, see
 * cuda_decode.cu) the weight loads of a lane's first iteration are issued
 * before the PDL wait. */
struct dec_side {
    const float *nw; /* NORM: norm weight [K] */
    float *xn;       /* NORM: normalized rows out [N, K] */
    float eps;
    float *res; /* ADD: residual [N, M] */
    int early;  /* first weight loads before the PDL wait */
};

__device__ __forceinline__ float4 mul4(float4 a, float4 w) { return make_float4(a.x * w.x, a.y * w.y, a.z * w.z, a.w * w.w); }
__device__ __forceinline__ float sq4(float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; }

/* The 8 input values of chunk ch of row xr (F32, read through cu_ld_act4);
 * under NORM also ss += their squares, and they come back times the norm
 * weights. */
template <bool NORM, bool NC>
__device__ __forceinline__ void dec_xin(const float *xr, const float *nw, int ch, float4 &x0, float4 &x1, float &ss) {
    x0 = cu_ld_act4<NC>(xr + 8 * ch);
    x1 = cu_ld_act4<NC>(xr + 8 * ch + 4);
    if constexpr (NORM) {
        ss += sq4(x0) + sq4(x1);
        x0 = mul4(x0, __ldg(reinterpret_cast<const float4 *>(nw) + 2 * ch));
        x1 = mul4(x1, __ldg(reinterpret_cast<const float4 *>(nw) + 2 * ch + 1));
    }
}

/* NORM: warp 0 of block 0 writes the normalized rows (x * inv) * w to xn,
 * the unfused RMSNorm's output, for any later reader. */
template <int N, bool NC>
__device__ __forceinline__ void dec_write_xn(const float *x, int K, const dec_side &sd, const float (&inv)[N]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < N; n++)
        for (int d = lane * 4; d < K; d += 128) {
            const float4 v = cu_ld_act4<NC>(x + (size_t)n * K + d), w = __ldg(reinterpret_cast<const float4 *>(sd.nw + d));
            *reinterpret_cast<float4 *>(sd.xn + (size_t)n * K + d) =
                make_float4((v.x * inv[n]) * w.x, (v.y * inv[n]) * w.y, (v.z * inv[n]) * w.z, (v.w * inv[n]) * w.w);
        }
}

/* The epilogue of k_gemv_dec for one row pair (lane 0 of the warp that
 * owns it): what k_gemv stores, plus the residual add under ADD. */
template <int N, bool SW, bool ADD>
__device__ __forceinline__ void dec_store(const gemv_segs &sg, const dec_side &sd, const float (&acc0)[N],
                                          const float (&acc1)[N], float *O0, float *O1, int l0, int l1, int M0,
                                          int M1, bool two) {
#pragma unroll
    for (int n = 0; n < N; n++) {
        if constexpr (SW) {
            const float g = acc0[n], u = acc1[n];
            const float y = g / (1.0f + expf(-g)) * u;
            O0[(size_t)n * M0 + l0] = g;
            O1[(size_t)n * M1 + l1] = u;
            sg.o2[(size_t)n * M0 + l0] = y;
            if (sg.obf) sg.obf[(size_t)n * M0 + l0] = __float2bfloat16_rn(y);
        } else {
            O0[(size_t)n * M0 + l0] = acc0[n];
            if (two) O1[(size_t)n * M1 + l1] = acc1[n];
            if constexpr (ADD) {
                /* one segment: rows index the residual as they index O0 */
                float *r = sd.res + (size_t)n * M0;
                r[l0] = r[l0] + acc0[n];
                if (two) r[l1] = r[l1] + acc1[n];
            }
        }
    }
}

/* Batch 1 runs under __launch_bounds__(128, 7): without a bound ptxas gives
 * the folds 70-80 registers against k_gemv's 56-64, and the lost
 * occupancy (35-39% against 46-54%, ncu) cost more than the two kernels
 * the folds remove. 7 blocks (72 registers, no spill in the NC variants)
 * measured 4.79 ms/step at 1k against 5.08 under 8 (64 registers, spills)
 * and 5.06 unbounded, still above the unfused 4.57 (docs/cuda.md v20).
 * Batch 2 stays unbounded (under 8 it spills ~400 bytes). */
template <int N, int KS, bool SW, bool NORM, bool ADD, bool NC>
__global__ __launch_bounds__(128, N == 1 ? 7 : 1) void k_gemv_dec(gemv_segs sg, const float *__restrict__ x, int K,
                                                                 dec_side sd) {
    /* sd.early: the first weight loads go out before the PDL wait (weights
     * are never written by a kernel of the tape), so they stream during
     * the tail of the GEMV before instead of after its end */
    PDL_TRIGGER();
    if (!sd.early) PDL_WAIT();
    const int wib = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int pair = blockIdx.x * (4 / KS) + wib / KS, kp = wib % KS;
    const int total = SW ? sg.end0 : sg.end2;
    const int row0 = SW ? pair : pair * 2;
    const bool active = row0 < total;
    const int row1 = SW ? pair + sg.end0 : (row0 + 1 < total ? row0 + 1 : row0);
    const int nch = K / 8;
    const int cb = kp * (nch / KS), ce = kp == KS - 1 ? nch : cb + nch / KS;
    float acc0[N], acc1[N], ss[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc0[n] = acc1[n] = ss[n] = 0.f;
    const bf16 *W0 = NULL, *W1 = NULL;
    float *O0 = NULL, *O1 = NULL;
    int l0 = 0, l1 = 0, M0 = 0, M1 = 0;
    const uint4 *w0 = NULL, *w1 = NULL;
    int c = cb + lane;
    bool full = false;
    uint4 a[4], b[4];
    if (active) {
        gemv_row(sg, row0, W0, O0, l0, M0);
        gemv_row(sg, row1, W1, O1, l1, M1);
        w0 = reinterpret_cast<const uint4 *>(W0 + (size_t)l0 * K);
        w1 = reinterpret_cast<const uint4 *>(W1 + (size_t)l1 * K);
        full = c + 96 < ce;
        if (full) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                a[u] = cu_ld_stream(w0 + c + 32 * u);
                b[u] = cu_ld_stream(w1 + c + 32 * u);
            }
        }
    }
    if (sd.early) PDL_WAIT();
    if (active) {
        /* k_gemv's loop (loads at the top of each iteration), the first
         * iteration's loads already issued above */
        for (bool first = true; c + 96 < ce; c += 128, first = false) {
            if (!first) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    a[u] = cu_ld_stream(w0 + c + 32 * u);
                    b[u] = cu_ld_stream(w1 + c + 32 * u);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int n = 0; n < N; n++) {
                    float4 x0, x1;
                    dec_xin<NORM, NC>(x + (size_t)n * K, sd.nw, c + 32 * u, x0, x1, ss[n]);
                    acc0[n] += cu_dot8(a[u], x0, x1);
                    acc1[n] += cu_dot8(b[u], x0, x1);
                }
            }
        }
        for (; c < ce; c += 32) {
            uint4 wa = cu_ld_stream(w0 + c), wb = cu_ld_stream(w1 + c);
#pragma unroll
            for (int n = 0; n < N; n++) {
                float4 x0, x1;
                dec_xin<NORM, NC>(x + (size_t)n * K, sd.nw, c, x0, x1, ss[n]);
                acc0[n] += cu_dot8(wa, x0, x1);
                acc1[n] += cu_dot8(wb, x0, x1);
            }
        }
#pragma unroll
        for (int n = 0; n < N; n++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                acc0[n] += __shfl_xor_sync(0xffffffffu, acc0[n], o);
                acc1[n] += __shfl_xor_sync(0xffffffffu, acc1[n], o);
                if constexpr (NORM) ss[n] += __shfl_xor_sync(0xffffffffu, ss[n], o);
            }
        }
    }
    /* the warp that stores its pair (with KS > 1, the first of its K
     * slices, which collects the others' sums) */
    bool owner = active;
    if constexpr (KS > 1) {
        __shared__ float kpart[4][3][N];
        if (lane == 0) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                kpart[wib][0][n] = acc0[n];
                kpart[wib][1][n] = acc1[n];
                kpart[wib][2][n] = ss[n];
            }
        }
        __syncthreads();
        owner = owner && kp == 0;
        if (owner) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                acc0[n] = kpart[wib][0][n];
                acc1[n] = kpart[wib][1][n];
                ss[n] = kpart[wib][2][n];
#pragma unroll
                for (int q = 1; q < KS; q++) {
                    acc0[n] += kpart[wib + q][0][n];
                    acc1[n] += kpart[wib + q][1][n];
                    ss[n] += kpart[wib + q][2][n];
                }
            }
        }
    }
    if (!owner) return;
    if constexpr (NORM) {
        float inv[N];
#pragma unroll
        for (int n = 0; n < N; n++) {
            inv[n] = 1.0f / sqrtf(ss[n] / (float)K + sd.eps);
            acc0[n] *= inv[n];
            acc1[n] *= inv[n];
        }
        if (blockIdx.x == 0 && wib == 0) dec_write_xn<N, NC>(x, K, sd, inv);
    }
    if (lane == 0) dec_store<N, SW, ADD>(sg, sd, acc0, acc1, O0, O1, l0, l1, M0, M1, row1 != row0);
}

typedef void (*gemv_dec_fn)(gemv_segs, const float *, int, dec_side);

#define GEMV_DEC_ROW(N, SW, NORM, ADD, NC)                                                                            \
    {k_gemv_dec<N, 1, SW, NORM, ADD, NC>, k_gemv_dec<N, 2, SW, NORM, ADD, NC>, k_gemv_dec<N, 4, SW, NORM, ADD, NC>}
#define GEMV_DEC_MODES(NC)                                                                                            \
    {{GEMV_DEC_ROW(1, false, true, false, NC), GEMV_DEC_ROW(2, false, true, false, NC)},                              \
     {GEMV_DEC_ROW(1, true, true, false, NC), GEMV_DEC_ROW(2, true, true, false, NC)},                                \
     {GEMV_DEC_ROW(1, false, false, true, NC), GEMV_DEC_ROW(2, false, false, true, NC)}}

bool cu_gemv_dec(cu_impl *c, const cu_gemv_dec_args *g) {
    /* [NC][mode][n - 1][ks]: NC = c->act_nc (cu_ld_act4); mode 0 = norm +
     * group, 1 = norm + gate/up SwiGLU, 2 = matmul + residual add */
    static const gemv_dec_fn fns[2][3][2][3] = {GEMV_DEC_MODES(false), GEMV_DEC_MODES(true)};
    const int mode = g->add_res ? 2 : g->swiglu ? 1 : 0;
    if (g->n < 1 || g->n > 2 || g->k % 8 || g->nseg < 1 || g->nseg > 3 || (g->swiglu && g->nseg != 2) ||
        (g->add_res && g->nseg != 1) || (mode < 2 && (!g->norm_w || !g->xn))) {
        cu_check(c, cudaErrorInvalidValue, "gemv_dec: unsupported shape");
        return false;
    }
    gemv_segs sg;
    memset(&sg, 0, sizeof sg);
    int64_t rows;
    sg.w0 = g->w[0];
    sg.o0 = g->out[0];
    sg.end0 = (int)g->m[0];
    if (g->swiglu) {
        sg.w1 = g->w[1];
        sg.o1 = g->out[1];
        sg.o2 = g->sw_out;
        sg.obf = g->sw_out_bf;
        sg.end1 = sg.end2 = (int)(2 * g->m[0]);
        rows = g->m[0]; /* row pairs: (gate r, up r) */
    } else {
        sg.end1 = sg.end0 + (g->nseg > 1 ? (int)g->m[1] : 0);
        sg.end2 = sg.end1 + (g->nseg > 2 ? (int)g->m[2] : 0);
        if (g->nseg > 1) sg.w1 = g->w[1], sg.o1 = g->out[1];
        if (g->nseg > 2) sg.w2 = g->w[2], sg.o2 = g->out[2];
        rows = (sg.end2 + 1) / 2;
    }
    dec_side sd;
    sd.nw = g->norm_w;
    sd.xn = g->xn;
    sd.eps = g->eps;
    sd.res = g->res;
    sd.early = g->early ? 1 : 0;
    const int ks = cu_gemv_ks(c, rows, (int)g->k);
    const int ki = ks == 1 ? 0 : ks == 2 ? 1 : 2;
    const int64_t pairs_per_block = 4 / ks;
    const unsigned blocks = (unsigned)((rows + pairs_per_block - 1) / pairs_per_block);
    c->gemv_next = true;
    /* early: the x loads follow a PDL wait that is not the kernel's first
     * instruction, so they must not be .nc (ptxas may hoist those above
     * it, see k_qk_norm_rope_store) */
    cu_launch(c, fns[c->act_nc && !g->early ? 1 : 0][mode][g->n - 1][ki], dim3(blocks), dim3(128), 0, sg, g->x, (int)g->k, sd);
    return !CU_LAUNCHED(c, "gemv_dec");
}
