/* cuda_bench.cu — measurements for the benchmarks (see cuda.h): device
 * copy bandwidth, the cuBLASLt bf16 GEMM rate, timing of the matmul op's
 * two paths, and random KV fill. These give the ceilings every benchmark
 * figure is divided by, measured in the same run on the same card.
 *
 * All timings use CUDA events on the backend's stream after warm-up and
 * report the median; inputs are random (never zeros, which run faster).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"


static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs op 3 times to warm up, then iters times, each between two events
 * on the backend's stream, into t[iters]; returns the median in ms, or -1
 * when op reported a failure (returned false). */
template <typename Op>
static double time_median_ms(cu_impl *c, cudaEvent_t e0, cudaEvent_t e1, double *t, int iters, Op op) {
    for (int i = 0; i < 3 + iters; i++) {
        cudaEventRecord(e0, c->stream);
        if (!op()) return -1;
        cudaEventRecord(e1, c->stream);
        cu_check(c, cudaEventSynchronize(e1), "sync");
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 3) t[i - 3] = ms;
    }
    return median(t, iters);
}

static ns_status take_error(cu_impl *c, ns_error *err) {
    if (c->err_status == NS_OK) return NS_OK;
    ns_status st = ns_fail(err, c->err_status, "%s", c->err_msg);
    c->err_status = NS_OK; /* a failed measurement must not poison the backend */
    c->err_msg[0] = 0;
    return st;
}

extern "C" ns_status ns_cuda_measure_copy_bw(ns_backend *be, size_t bytes, int iters, double *gbps, ns_error *err) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double *t = (double *)calloc((size_t)iters, sizeof(double));
    ns_status rc = NS_OK;
    if (!t) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    if (cu_check(c, cudaMalloc(&a, bytes), "bw alloc") || cu_check(c, cudaMalloc(&b, bytes), "bw alloc") ||
        cu_check(c, cudaEventCreate(&e0), "event") || cu_check(c, cudaEventCreate(&e1), "event"))
        goto done;
    cu_launch_fill_random(c, (bf16 *)a, NULL, bytes / 2, 1, 1.0f, true);
    {
        double ms = time_median_ms(c, e0, e1, t, iters, [&] {
            cu_check(c, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
            return true;
        });
        *gbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    }
done:
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(t);
    rc = take_error(c, err);
    return rc;
}

extern "C" ns_status ns_cuda_measure_gemm(ns_backend *be, int n, int iters, double *tflops, ns_error *err) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    const size_t N = (size_t)n;
    const int sets = 3; /* rotate inputs so no run is served from L2 */
    bf16 *A[3] = {NULL, NULL, NULL}, *B[3] = {NULL, NULL, NULL}, *C = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float alpha = 1.0f, beta = 0.0f;
    double *t = (double *)calloc((size_t)iters, sizeof(double));
    if (!t) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < sets; i++) {
        if (cu_check(c, cudaMalloc(&A[i], N * N * 2), "gemm alloc") || cu_check(c, cudaMalloc(&B[i], N * N * 2), "gemm alloc"))
            goto done;
        cu_launch_fill_random(c, A[i], NULL, N * N, 11 + i, 1.0f, true);
        cu_launch_fill_random(c, B[i], NULL, N * N, 21 + i, 1.0f, true);
    }
    if (cu_check(c, cudaMalloc(&C, N * N * 2), "gemm alloc") || cu_check(c, cudaEventCreate(&e0), "event") ||
        cu_check(c, cudaEventCreate(&e1), "event"))
        goto done;
    if (cu_check_blas(c, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc") ||
        cu_check_blas(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "ta") ||
        cu_check_blas(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "tb") ||
        cu_check_blas(c, cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, N, n), "layout") ||
        cu_check_blas(c, cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, N, n), "layout") ||
        cu_check_blas(c, cublasLtMatmulPreferenceCreate(&pref), "pref") ||
        cu_check_blas(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &c->lt_ws_bytes, sizeof c->lt_ws_bytes), "pref ws") ||
        cu_check_blas(c, cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, la, lc, lc, pref, 1, &res, &nres), "heuristic"))
        goto done;
    if (nres < 1) {
        cu_check_blas(c, CUBLAS_STATUS_NOT_SUPPORTED, "no bf16 GEMM algorithm");
        goto done;
    }
    {
        int run = 0;
        double ms = time_median_ms(c, e0, e1, t, iters, [&] {
            int k = run++ % sets;
            return !cu_check_blas(c, cublasLtMatmul(c->lt, op, &alpha, A[k], la, B[k], la, &beta, C, lc, C, lc, &res.algo,
                                                    c->lt_ws, c->lt_ws_bytes, c->stream), "gemm");
        });
        if (ms >= 0) *tflops = 2.0 * (double)N * N * N / (ms * 1e-3) / 1e12;
    }
done:
    for (int i = 0; i < sets; i++) {
        if (A[i]) cudaFree(A[i]);
        if (B[i]) cudaFree(B[i]);
    }
    if (C) cudaFree(C);
    if (op) cublasLtMatmulDescDestroy(op);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    free(t);
    return take_error(c, err);
}

extern "C" ns_status ns_cuda_time_matmul(ns_backend *be, int64_t n, int64_t m, int64_t k, int path, int iters,
                                         double *ms_out, ns_error *err) {
    return ns_cuda_time_matmul_dt(be, NS_DT_BF16, n, m, k, path, iters, ms_out, err);
}

extern "C" ns_status ns_cuda_time_matmul_dt(ns_backend *be, ns_dtype dt, int64_t n, int64_t m, int64_t k, int path,
                                            int iters, double *ms_out, ns_error *err) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    c->recording = false; /* time the op itself, not a tape */
    ns_tensor w, x, y;
    memset(&w, 0, sizeof w);
    memset(&x, 0, sizeof x);
    memset(&y, 0, sizeof y);
    cudaEvent_t e0 = NULL, e1 = NULL;
    int saved = c->gemv_max;
    double *t = (double *)calloc((size_t)iters, sizeof(double));
    ns_status rc;
    if (!t) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    rc = be->ops->weight_random(be, &w, dt, m, k, 77, 0.05f, err);
    if (rc == NS_OK) rc = be->ops->tensor_alloc(be, &x, NS_DT_F32, n, k, err);
    if (rc == NS_OK) rc = be->ops->tensor_alloc(be, &y, NS_DT_F32, n, m, err);
    if (rc != NS_OK) goto done;
    cu_launch_fill_random(c, NULL, (float *)x.data, (size_t)(n * k), 5, 1.0f, false);
    if (cu_check(c, cudaEventCreate(&e0), "event") || cu_check(c, cudaEventCreate(&e1), "event")) goto done;
    if (path == 1) c->gemv_max = 0;
    if (path == 2) c->gemv_max = 1 << 20;
    *ms_out = time_median_ms(c, e0, e1, t, iters, [&] {
        be->ops->matmul(be, &y, &x, &w);
        return true;
    });
done:
    c->gemv_max = saved;
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (w.data) be->ops->tensor_free(be, &w);
    if (x.data) be->ops->tensor_free(be, &x);
    if (y.data) be->ops->tensor_free(be, &y);
    free(t);
    if (rc != NS_OK) return rc;
    return take_error(c, err);
}

extern "C" ns_status ns_cuda_kv_fill_random(ns_backend *be, uint64_t seed, ns_error *err) {
    cu_impl *c = cu_impl_of(be);
    if (!c->kv) return ns_fail(err, NS_ERR_INVALID, "KV pool not allocated");
    cu_flush(be);
    if (be->kv.dtype == NS_DT_FP8_E4M3) {
        cu_kv_fp8_fill_random(c, &be->kv, seed);
        cu_check(c, cudaStreamSynchronize(c->stream), "kv fill");
        return take_error(c, err);
    }
    size_t n = (size_t)be->kv.n_pages * be->kv.page_size_bytes / 2;
    cu_launch_fill_random(c, (bf16 *)c->kv, NULL, n, seed, 1.0f, true);
    cu_check(c, cudaStreamSynchronize(c->stream), "kv fill");
    return take_error(c, err);
}
