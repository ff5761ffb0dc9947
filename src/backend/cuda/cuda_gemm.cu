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

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    float s = 0.f;
    s = fmaf(__uint_as_float(w.x << 16), a.x, s);
    s = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, s);
    s = fmaf(__uint_as_float(w.y << 16), a.z, s);
    s = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, s);
    s = fmaf(__uint_as_float(w.z << 16), b.x, s);
    s = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, s);
    s = fmaf(__uint_as_float(w.w << 16), b.z, s);
    s = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, s);
    return s;
}

/* Each warp computes 2 output rows for all N inputs; lanes stride the
 * row in 16-byte chunks, 4 chunks per row in flight per lane. The rows
 * may come from up to 3 weight matrices that share the input (q/k/v,
 * gate/up): one launch streams all of them, so the ramp-up and tail of a
 * launch are paid once per group. */
struct gemv_segs {
    const bf16 *w0, *w1, *w2;
    float *o0, *o1, *o2;
    int end0, end1, end2; /* cumulative row ends */
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

template <int N>
__global__ __launch_bounds__(128) void k_gemv(gemv_segs sg, const float *__restrict__ x, int K) {
    const int warp = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x & 31;
    const int total = sg.end2;
    const int row0 = warp * 2;
    if (row0 >= total) return;
    const int row1 = row0 + 1 < total ? row0 + 1 : row0;
    const bf16 *W0, *W1;
    float *O0, *O1;
    int l0, l1, M0, M1;
    gemv_row(sg, row0, W0, O0, l0, M0);
    gemv_row(sg, row1, W1, O1, l1, M1);
    const uint4 *w0 = reinterpret_cast<const uint4 *>(W0 + (size_t)l0 * K);
    const uint4 *w1 = reinterpret_cast<const uint4 *>(W1 + (size_t)l1 * K);
    const int nch = K / 8;
    float acc0[N], acc1[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc0[n] = acc1[n] = 0.f;
    int c = lane;
    for (; c + 96 < nch; c += 128) {
        uint4 a[4], b[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            a[u] = ld_stream(w0 + c + 32 * u);
            b[u] = ld_stream(w1 + c + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
#pragma unroll
            for (int n = 0; n < N; n++) {
                const float4 *xv = reinterpret_cast<const float4 *>(x + (size_t)n * K) + 2 * (c + 32 * u);
                float4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
                acc0[n] += dot8(a[u], x0, x1);
                acc1[n] += dot8(b[u], x0, x1);
            }
        }
    }
    for (; c < nch; c += 32) {
        uint4 a = ld_stream(w0 + c), b = ld_stream(w1 + c);
#pragma unroll
        for (int n = 0; n < N; n++) {
            const float4 *xv = reinterpret_cast<const float4 *>(x + (size_t)n * K) + 2 * c;
            float4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
            acc0[n] += dot8(a, x0, x1);
            acc1[n] += dot8(b, x0, x1);
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
    if (lane == 0) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            O0[(size_t)n * M0 + l0] = acc0[n];
            if (row1 != row0) O1[(size_t)n * M1 + l1] = acc1[n];
        }
    }
}

typedef void (*gemv_fn)(gemv_segs, const float *, int);

void cu_gemv_multi(cu_impl *c, int nseg, float *const *out, const bf16 *const *w, const int64_t *m, const float *x,
                   int n, int k) {
    static const gemv_fn fns[8] = {k_gemv<1>, k_gemv<2>, k_gemv<3>, k_gemv<4>,
                                   k_gemv<5>, k_gemv<6>, k_gemv<7>, k_gemv<8>};
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
        const unsigned blocks = (unsigned)((sg.end2 + 7) / 8);
        fns[nn - 1]<<<blocks, 128, 0, c->stream>>>(sg, x + (size_t)n0 * k, k);
        if (CU_LAUNCHED(c, "gemv")) return;
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

void cu_gemm(cu_impl *c, float *out, const bf16 *in_bf, const float *in_f32, const bf16 *w, int64_t n, int64_t m,
             int64_t k) {
    if (!in_bf) {
        launch_gemv(c, out, in_f32, w, (int)n, (int)m, (int)k);
        return;
    }
    int align = ptr_align(out);
    int a2 = ptr_align(in_bf), a3 = ptr_align(w);
    if (a2 < align) align = a2;
    if (a3 < align) align = a3;
    cu_gemm_plan *p = get_plan(c, m, n, k, align);
    if (!p) return;
    const float alpha = 1.0f, beta = 0.0f;
    cu_check_blas(c,
                  cublasLtMatmul(c->lt, p->op, &alpha, w, p->la, in_bf, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                                 c->lt_ws, c->lt_ws_bytes, c->stream),
                  "cublasLtMatmul");
}
