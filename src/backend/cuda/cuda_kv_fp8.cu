/* cuda_kv_fp8.cu — writing and copying FP8 (e4m3) KV pages (see
 * cuda_kv_fp8.cuh for the format's invariants; util/fp8.h for the scale
 * policy).
 *
 * Store: one warp per (page-head segment touched by the step, K or V).
 * The warp of a segment's first new row appends that row and the rows
 * after it in the same page, in position order, exactly as the CPU
 * reference appends them one at a time; warps of the other rows exit at
 * once. Appending row by row (rather than taking the chunk's maximum once)
 * is what makes the bytes independent of how a prompt was split into
 * steps, so a prefix cached by a prefill and one written by decode steps
 * hold the same codes.
 */
#include "backend/cuda/cuda_kv_fp8.cuh"

template <int D>
__global__ __launch_bounds__(128) void k_kv_store_fp8(uint8_t *kv, size_t page_bytes, size_t scale_off, int P,
                                                      int KVH, int layer, const float *__restrict__ k,
                                                      const float *__restrict__ v, int k_stride, int v_stride,
                                                      int n_tokens, const int32_t *__restrict__ positions,
                                                      const int32_t *__restrict__ tok_seq,
                                                      const int32_t *__restrict__ seq_start,
                                                      const int32_t *__restrict__ page_table, int pt_stride) {
    PDL_ENTRY();
    constexpr int E = (D + 31) / 32;
    const int w = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    const int t = w / (2 * KVH), kvh = (w % (2 * KVH)) >> 1, which = w & 1;
    if (t >= n_tokens) return;
    const int s = tok_seq[t], pos = positions[t], slot0 = pos % P;
    /* a segment's rows belong to the warp of its first row in this step */
    if (slot0 != 0 && t > seq_start[s]) return;
    int end = seq_start[s + 1];
    if (end > n_tokens) end = n_tokens;
    const int n = min(P - slot0, end - t);
    uint8_t *pg = kv + (size_t)page_table[(size_t)s * pt_stride + pos / P] * page_bytes;
    uint8_t *seg = pg + (((size_t)layer * 2 + which) * KVH + kvh) * (size_t)P * D;
    float *scale = reinterpret_cast<float *>(pg + scale_off) + ((size_t)layer * 2 + which) * KVH + kvh;
    const float *src = which ? v : k;
    const int stride = which ? v_stride : k_stride;
    for (int j = 0; j < n; j++) {
        const float *row = src + (size_t)(t + j) * stride + (size_t)kvh * D;
        float x[E];
#pragma unroll
        for (int e = 0; e < E; e++) x[e] = lane + 32 * e < D ? row[lane + 32 * e] : 0.f;
        cu_fp8_append_row<D>(seg, scale, slot0 + j, x);
    }
}

void cu_launch_kv_store_fp8(cu_impl *c, const ns_kv_layout *l, int layer, const float *k, const float *v,
                            int n_tokens, int k_stride, int v_stride) {
    if (n_tokens <= 0) return;
    if (n_tokens > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "kv_store fp8: more rows than the batch has tokens");
        return;
    }
    const int64_t warps = (int64_t)n_tokens * l->n_kv_heads * 2;
    const dim3 grid((unsigned)((warps + 3) / 4));
    const size_t so = ns_kv_scale_offset(l, 0, 0, 0);
#define KS_ARGS                                                                                                   \
    c->kv, l->page_size_bytes, so, l->page_tokens, l->n_kv_heads, layer, k, v, k_stride, v_stride, n_tokens,    \
        c->meta.positions, c->meta.tok_seq, c->meta.seq_start, c->meta.page_table, c->meta.pt_stride
    switch (l->head_dim) {
    case 16: cu_launch(c, k_kv_store_fp8<16>, grid, dim3(128), 0, KS_ARGS); break;
    case 32: cu_launch(c, k_kv_store_fp8<32>, grid, dim3(128), 0, KS_ARGS); break;
    case 64: cu_launch(c, k_kv_store_fp8<64>, grid, dim3(128), 0, KS_ARGS); break;
    case 128: cu_launch(c, k_kv_store_fp8<128>, grid, dim3(128), 0, KS_ARGS); break;
    case 256: cu_launch(c, k_kv_store_fp8<256>, grid, dim3(128), 0, KS_ARGS); break;
    default: cu_check(c, cudaErrorInvalidValue, "kv_store fp8: head_dim must be 16, 32, 64, 128 or 256"); return;
    }
#undef KS_ARGS
    CU_LAUNCHED(c, "kv_store fp8");
}

void cu_launch_kv_copy_fp8(cu_impl *c, const ns_kv_layout *l, int dst_page, int src_page, int n_slots) {
    const size_t row = (size_t)l->page_tokens * l->head_dim;
    uint8_t *dst = c->kv + (size_t)dst_page * l->page_size_bytes;
    const uint8_t *src = c->kv + (size_t)src_page * l->page_size_bytes;
    const size_t so = ns_kv_scale_offset(l, 0, 0, 0);
    cu_check(c,
             cudaMemcpy2DAsync(dst, row, src, row, (size_t)n_slots * l->head_dim,
                               (size_t)l->n_layers * 2 * l->n_kv_heads, cudaMemcpyDeviceToDevice, c->stream),
             "kv_page_copy fp8");
    /* the copied codes mean something only under their scales */
    cu_check(c, cudaMemcpyAsync(dst + so, src + so, l->page_size_bytes - so, cudaMemcpyDeviceToDevice, c->stream),
             "kv_page_copy fp8 scales");
}

__global__ void k_kv_fp8_fill(uint8_t *kv, size_t n_pages, size_t page_bytes, size_t scale_off, uint64_t seed) {
    PDL_ENTRY();
    const size_t total = n_pages * page_bytes;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t off = i % page_bytes;
        if (off >= scale_off) {
            if ((off - scale_off) % 4 == 0) *reinterpret_cast<float *>(kv + i) = 1.0f / 448.0f;
            continue;
        }
        uint8_t code = (uint8_t)(ns_splitmix64_mix(seed * 0x9e3779b97f4a7c15ULL + i) >> 56);
        if ((code & 0x7f) == 0x7f) code ^= 1; /* never the NaN code */
        kv[i] = code;
    }
}

void cu_kv_fp8_fill_random(cu_impl *c, const ns_kv_layout *l, uint64_t seed) {
    cu_launch(c, k_kv_fp8_fill, dim3(4 * (unsigned)c->n_sm), dim3(256), 0, c->kv, (size_t)l->n_pages,
              l->page_size_bytes, ns_kv_scale_offset(l, 0, 0, 0), seed);
    CU_LAUNCHED(c, "kv fill fp8");
}
