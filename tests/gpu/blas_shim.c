/* blas_shim.c — a minimal stand-in for OpenBLAS on machines that lack it
 * (the bare GPU machine): cblas_sgemm (row- or column-major, any
 * transposes) and openblas_set_num_threads, enough for the CPU reference
 * backend in the GPU tests. tests/gpu/run.sh builds it into a
 * libopenblas.so only when the system has no OpenBLAS. Correct, not fast:
 * a plain loop with a float accumulator per output.
 */
#include <cblas.h>

void openblas_set_num_threads(int num_threads) { (void)num_threads; }

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float *C, OPENBLAS_CONST blasint ldc) {
    /* column-major C = op(A) op(B) is row-major C^T = op(B)^T op(A)^T */
    if (Order == CblasColMajor) {
        cblas_sgemm(CblasRowMajor, TransB, TransA, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        return;
    }
    const int ta = TransA != CblasNoTrans, tb = TransB != CblasNoTrans;
    for (blasint i = 0; i < M; i++)
        for (blasint j = 0; j < N; j++) {
            float s = 0.0f;
            for (blasint k = 0; k < K; k++) {
                float a = ta ? A[k * lda + i] : A[i * lda + k];
                float b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
            }
            C[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
        }
}
