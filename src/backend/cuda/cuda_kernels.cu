/* cuda_kernels.cu — elementwise and row kernels of the CUDA backend:
 * random weights, dtype conversion, embedding, RMSNorm, RoPE, SwiGLU,
 * residual add, KV store into pages, row gather, argmax and page copy.
 *
 * All of these are memory-bound: each reads its inputs once and writes
 * its outputs once, with 16-byte accesses where the shapes allow. Kernels
 * that feed a matmul (rmsnorm, swiglu, gather) also write the BF16 shadow
 * of their output when the caller passes one, so the GEMM needs no extra
 * conversion pass. Per-token metadata (tokens, positions, page tables)
 * comes from the fixed device buffers of cu_meta, never from kernel
 * arguments, so a captured graph stays valid for the next step.
 * Arithmetic follows the CPU reference: float32 throughout, accurate
 * expf/sincosf (no fast-math), bf16 rounding to nearest even.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

static inline unsigned grid_for(size_t n, unsigned threads, unsigned cap = 65535u * 8u) {
    size_t g = (n + threads - 1) / threads;
    if (g < 1) g = 1;
    if (g > cap) g = cap;
    return (unsigned)g;
}

/* ------------------------------------------------------- random weights */

__global__ void k_fill_random(bf16 *dbf, float *df, size_t n, uint64_t seed, float scale, int round_bf) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = ns_random_weight(seed, (uint64_t)i); /* the CPU backend's values, bit for bit */
        float v = __fmul_rn(u, scale);
        if (dbf) dbf[i] = __float2bfloat16_rn(v);
        else df[i] = round_bf ? __bfloat162float(__float2bfloat16_rn(v)) : v;
    }
}

void cu_launch_fill_random(cu_impl *c, bf16 *dst_bf, float *dst_f, size_t n, uint64_t seed, float scale,
                           bool round_bf) {
    if (!n) return;
    cu_launch(c, k_fill_random, dim3(grid_for(n, 256, 132 * 64)), dim3(256), 0, dst_bf, dst_f, n, seed, scale, round_bf);
    CU_LAUNCHED(c, "fill_random");
}

/* ----------------------------------------------------------- conversion */

__global__ void k_f32_to_bf16(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n) {
    PDL_ENTRY();
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4;
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (; i + 3 < n; i += stride) {
        float4 v = *reinterpret_cast<const float4 *>(src + i);
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 o;
        o.x = *reinterpret_cast<uint32_t *>(&a);
        o.y = *reinterpret_cast<uint32_t *>(&b);
        *reinterpret_cast<uint2 *>(dst + i) = o;
    }
    for (; i < n; i++) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void k_f32_to_bf16_scalar(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

void cu_launch_f32_to_bf16(cu_impl *c, bf16 *dst, const float *src, size_t n) {
    if (!n) return;
    if (((uintptr_t)src % 16) == 0 && ((uintptr_t)dst % 8) == 0)
        cu_launch(c, k_f32_to_bf16, dim3(grid_for(n / 4 + 1, 256)), dim3(256), 0, dst, src, n);
    else
        cu_launch(c, k_f32_to_bf16_scalar, dim3(grid_for(n, 256)), dim3(256), 0, dst, src, n);
    CU_LAUNCHED(c, "f32_to_bf16");
}

__global__ void k_bf16_to_f32(float *__restrict__ dst, const bf16 *__restrict__ src, size_t n) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

void cu_launch_bf16_to_f32(cu_impl *c, float *dst, const bf16 *src, size_t n) {
    if (!n) return;
    cu_launch(c, k_bf16_to_f32, dim3(grid_for(n, 256)), dim3(256), 0, dst, src, n);
    CU_LAUNCHED(c, "bf16_to_f32");
}

/* ------------------------------------------------------------ embedding */

__global__ void k_embed(float *__restrict__ out, const void *__restrict__ table, int is_bf16, const int32_t *tokens,
                        int dim) {
    PDL_ENTRY();
    const int t = blockIdx.x;
    const size_t row = (size_t)tokens[t] * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float v = is_bf16 ? __bfloat162float(((const bf16 *)table)[row + d]) : ((const float *)table)[row + d];
        out[(size_t)t * dim + d] = v;
    }
}

void cu_launch_embed(cu_impl *c, float *out, const ns_tensor *table, int n_tokens, int dim) {
    if (n_tokens <= 0) return;
    if (n_tokens > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "embed: more rows than the batch has tokens");
        return;
    }
    cu_launch(c, k_embed, dim3(n_tokens), dim3(256), 0, out, table->data, table->dtype == NS_DT_BF16, c->meta.tokens, dim);
    CU_LAUNCHED(c, "embed");
}

/* -------------------------------------------------------------- rmsnorm */

/* One warp per row: rows of up to 1024 columns (q/k norm, small models). */
__global__ void k_rmsnorm_warp(float *out, bf16 *out_bf, const float *in, const float *__restrict__ w, int64_t rows,
                               int cols, float eps) {
    PDL_ENTRY();
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *x = in + r * cols;
    float v[32];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int d = lane + 32 * i;
        v[i] = d < cols ? x[d] : 0.f;
        ss += v[i] * v[i];
    }
    ss = cu_warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)cols + eps);
    float *o = out ? out + r * cols : NULL; /* NULL: only the bf16 shadow (cu_tape_f32_dead) */
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int d = lane + 32 * i;
        if (d < cols) {
            float y = (v[i] * inv) * w[d];
            if (out) o[d] = y;
            if (out_bf) out_bf[r * cols + d] = __float2bfloat16_rn(y);
        }
    }
}

/* One block per row for wide rows (hidden size). */
__global__ void k_rmsnorm_block(float *out, bf16 *out_bf, const float *in, const float *__restrict__ w, int cols,
                                float eps) {
    PDL_ENTRY();
    const int64_t r = blockIdx.x;
    const float *x = in + r * cols;
    __shared__ float part[32];
    float ss = 0.f;
    const bool vec = (cols % 4) == 0 && ((uintptr_t)x % 16) == 0;
    if (vec) {
        for (int d = threadIdx.x * 4; d < cols; d += blockDim.x * 4) {
            float4 a = *reinterpret_cast<const float4 *>(x + d);
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
    } else {
        for (int d = threadIdx.x; d < cols; d += blockDim.x) ss += x[d] * x[d];
    }
    const float inv = 1.0f / sqrtf(cu_block_sum(ss, part) / (float)cols + eps);
    float *o = out ? out + r * cols : NULL; /* NULL: only the bf16 shadow (cu_tape_f32_dead) */
    if (vec && ((uintptr_t)o % 16) == 0) {
        for (int d = threadIdx.x * 4; d < cols; d += blockDim.x * 4) {
            float4 a = *reinterpret_cast<const float4 *>(x + d);
            float4 ww = *reinterpret_cast<const float4 *>(w + d);
            float4 y = make_float4((a.x * inv) * ww.x, (a.y * inv) * ww.y, (a.z * inv) * ww.z, (a.w * inv) * ww.w);
            if (o) *reinterpret_cast<float4 *>(o + d) = y;
            if (out_bf) cu_store_bf16x4(out_bf + r * cols + d, y);
        }
    } else {
        for (int d = threadIdx.x; d < cols; d += blockDim.x) {
            float y = (x[d] * inv) * w[d];
            if (o) o[d] = y;
            if (out_bf) out_bf[r * cols + d] = __float2bfloat16_rn(y);
        }
    }
}

void cu_launch_rmsnorm(cu_impl *c, float *out, bf16 *out_bf, const float *in, const float *w, int64_t rows, int cols,
                       float eps) {
    if (rows <= 0 || cols <= 0) return;
    if (cols <= 1024) {
        const int rpb = 8;
        cu_launch(c, k_rmsnorm_warp, dim3((unsigned)((rows + rpb - 1) / rpb)), dim3(rpb * 32), 0, out, out_bf, in, w, rows, cols,
                                                                                         eps);
    } else {
        cu_launch(c, k_rmsnorm_block, dim3((unsigned)rows), dim3(512), 0, out, out_bf, in, w, cols, eps);
    }
    CU_LAUNCHED(c, "rmsnorm");
}

/* ----------------------------------------------------------------- rope */

__global__ void k_rope(float *x, const int32_t *__restrict__ positions, int n_tokens, int n_heads, int half,
                       int head_dim, int row_stride, const float *__restrict__ inv_freq) {
    PDL_ENTRY();
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t total = (int64_t)n_tokens * n_heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const int64_t th = idx / half;
    const int h = (int)(th % n_heads);
    const int t = (int)(th / n_heads);
    const float ang = (float)positions[t] * inv_freq[i];
    float s, co;
    sincosf(ang, &s, &co);
    float *p = x + (int64_t)t * row_stride + (int64_t)h * head_dim;
    const float x0 = p[i], x1 = p[i + half];
    p[i] = x0 * co - x1 * s;
    p[i + half] = x1 * co + x0 * s;
}

void cu_launch_rope(cu_impl *c, float *x, int n_tokens, int n_heads, int head_dim, int row_stride,
                    const float *inv_freq) {
    if (n_tokens <= 0) return;
    if (n_tokens > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "rope: more rows than the batch has tokens");
        return;
    }
    int64_t total = (int64_t)n_tokens * n_heads * (head_dim / 2);
    cu_launch(c, k_rope, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, x, c->meta.positions, n_tokens, n_heads,
                                                                   head_dim / 2, head_dim, row_stride, inv_freq);
    CU_LAUNCHED(c, "rope");
}

/* --------------------------------------------------------- swiglu / add */

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void k_swiglu4(float *out, bf16 *out_bf, const float *gate, const float *up, int64_t n4) {
    PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 g = reinterpret_cast<const float4 *>(gate)[i];
        float4 u = reinterpret_cast<const float4 *>(up)[i];
        float4 y = make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w);
        if (out) reinterpret_cast<float4 *>(out)[i] = y; /* NULL: only the bf16 shadow (cu_tape_f32_dead) */
        if (out_bf) cu_store_bf16x4(out_bf + 4 * i, y);
    }
}

__global__ void k_swiglu1(float *out, bf16 *out_bf, const float *gate, const float *up, int64_t n) {
    PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float y = silu(gate[i]) * up[i];
        if (out) out[i] = y;
        if (out_bf) out_bf[i] = __float2bfloat16_rn(y);
    }
}

static bool al16(const void *p) { return ((uintptr_t)p % 16) == 0; }

void cu_launch_swiglu(cu_impl *c, float *out, bf16 *out_bf, const float *gate, const float *up, int64_t n) {
    if (n <= 0) return;
    if (n % 4 == 0 && al16(out) && al16(gate) && al16(up) && ((uintptr_t)out_bf % 8) == 0)
        cu_launch(c, k_swiglu4, dim3(grid_for((size_t)n / 4, 256)), dim3(256), 0, out, out_bf, gate, up, n / 4);
    else
        cu_launch(c, k_swiglu1, dim3(grid_for((size_t)n, 256)), dim3(256), 0, out, out_bf, gate, up, n);
    CU_LAUNCHED(c, "swiglu");
}

__global__ void k_add4(float4 *out, const float4 *x, int64_t n4) {
    PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 a = out[i], b = x[i];
        out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
}

__global__ void k_add1(float *out, const float *x, int64_t n) {
    PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] += x[i];
}

void cu_launch_add(cu_impl *c, float *out, const float *x, int64_t n) {
    if (n <= 0) return;
    if (n % 4 == 0 && al16(out) && al16(x))
        cu_launch(c, k_add4, dim3(grid_for((size_t)n / 4, 256)), dim3(256), 0, (float4 *)out, (const float4 *)x, n / 4);
    else
        cu_launch(c, k_add1, dim3(grid_for((size_t)n, 256)), dim3(256), 0, out, x, n);
    CU_LAUNCHED(c, "add");
}

/* ------------------------------------------------------------- kv store */

/* One thread per (token, kv head, 8-element chunk), K and V both. */
__global__ void k_kv_store(uint8_t *kv, size_t page_bytes, int P, int n_kv_heads, int head_dim, int layer,
                           const float *__restrict__ k, const float *__restrict__ v, int k_stride, int v_stride,
                           int n_tokens, const int32_t *__restrict__ positions, const int32_t *__restrict__ tok_seq,
                           const int32_t *__restrict__ page_table, int pt_stride) {
    PDL_ENTRY();
    const int chunks = head_dim / 8;
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n_tokens * n_kv_heads * chunks) return;
    const int ch = (int)(idx % chunks);
    const int h = (int)((idx / chunks) % n_kv_heads);
    const int t = (int)(idx / ((int64_t)chunks * n_kv_heads));
    const int pos = positions[t];
    const int s = tok_seq[t];
    const int page = page_table[(size_t)s * pt_stride + pos / P];
    const int slot = pos % P;
    bf16 *pg = (bf16 *)(kv + (size_t)page * page_bytes);
    for (int which = 0; which < 2; which++) {
        const float *src = (which ? v + (size_t)t * v_stride : k + (size_t)t * k_stride) + (size_t)h * head_dim + ch * 8;
        size_t off = ((((size_t)layer * 2 + which) * n_kv_heads + h) * P + slot) * head_dim + ch * 8;
        __align__(16) bf16 tmp[8];
#pragma unroll
        for (int e = 0; e < 8; e++) tmp[e] = __float2bfloat16_rn(src[e]);
        *reinterpret_cast<uint4 *>(pg + off) = *reinterpret_cast<const uint4 *>(tmp);
    }
}

void cu_launch_kv_store(cu_impl *c, const ns_kv_layout *l, int layer, const float *k, const float *v, int n_tokens,
                        int k_stride, int v_stride) {
    if (l->dtype == NS_DT_FP8_E4M3) {
        cu_launch_kv_store_fp8(c, l, layer, k, v, n_tokens, k_stride, v_stride);
        return;
    }
    if (n_tokens <= 0) return;
    if (n_tokens > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "kv_store: more rows than the batch has tokens");
        return;
    }
    int64_t total = (int64_t)n_tokens * l->n_kv_heads * (l->head_dim / 8);
    cu_launch(c, k_kv_store, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, 
        c->kv, l->page_size_bytes, l->page_tokens, l->n_kv_heads, l->head_dim, layer, k, v, k_stride, v_stride,
        n_tokens, c->meta.positions, c->meta.tok_seq, c->meta.page_table, c->meta.pt_stride);
    CU_LAUNCHED(c, "kv_store");
}

/* --------------------------------------------------------------- gather */

template <bool NC> /* activation loads: cu_ld_act (cuda_internal.cuh) */
__global__ void k_gather(float *out, bf16 *out_bf, const float *__restrict__ in, const int32_t *__restrict__ rows,
                         int cols, int in_stride) {
    PDL_ENTRY();
    const int i = blockIdx.x;
    const float *src = in + (size_t)rows[i] * in_stride;
    for (int d = threadIdx.x; d < cols; d += blockDim.x) {
        float v = cu_ld_act<NC>(src + d);
        out[(size_t)i * cols + d] = v;
        if (out_bf) out_bf[(size_t)i * cols + d] = __float2bfloat16_rn(v);
    }
}

void cu_launch_gather(cu_impl *c, float *out, bf16 *out_bf, const float *in, int n_rows, int cols, int in_stride) {
    if (n_rows <= 0) return;
    cu_launch(c, c->act_nc ? k_gather<true> : k_gather<false>, dim3(n_rows), dim3(256), 0, out, out_bf, in, c->meta.logit_rows, cols, in_stride);
    CU_LAUNCHED(c, "gather_rows");
}

/* --------------------------------------------------------------- argmax */

/* Largest value, lowest index among equals (the reference sampler's rule;
 * +Inf beats everything). A row with a NaN, or with nothing above -Inf,
 * gives -1, as ns_sampler_sample: its logits are not finite. */
__device__ __forceinline__ void better(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

/* A row is cut into slices of ARGMAX_SLICE columns, one CTA each, so the
 * 151936 logits of a 150k vocabulary are read by ~38 SMs with 16 loads in
 * flight per thread; one CTA per row looping over the row spent ~40 us of
 * every decode step waiting on dependent L2 loads (bench/cupti_trace.c
 * timeline, docs/cuda.md v25). The CTAs of a row meet in a 64-bit
 * atomicMax of (value's order bits, ~index), which keeps "largest value,
 * lowest index" whatever order they finish in; the last CTA of the row
 * (a counter) writes the answer and resets the row's key, NaN flag and
 * counter to zero for the next launch (graph replays included). */
#define ARGMAX_THREADS 256
#define ARGMAX_PER_THREAD 16
#define ARGMAX_SLICE (ARGMAX_THREADS * ARGMAX_PER_THREAD)

/* Float bits -> unsigned with the same order (-Inf lowest, +Inf highest;
 * never called on NaN). */
__device__ __forceinline__ uint32_t argmax_order(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <bool NC> /* activation loads: cu_ld_act (cuda_internal.cuh) */
__global__ __launch_bounds__(ARGMAX_THREADS) void k_argmax(int32_t *out, unsigned long long *key, int32_t *aux,
                                                           const float *__restrict__ logits, int cols, int stride) {
    PDL_ENTRY();
    const int row = blockIdx.y;
    const float *x = logits + (size_t)row * stride;
    const int first = blockIdx.x * ARGMAX_SLICE + threadIdx.x;
    float v[ARGMAX_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; j++) {
        const int i = first + j * ARGMAX_THREADS;
        v[j] = i < cols ? cu_ld_act<NC>(x + i) : -INFINITY;
    }
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    int nan = 0;
#pragma unroll
    for (int j = 0; j < ARGMAX_PER_THREAD; j++) {
        nan |= isnan(v[j]);
        if (v[j] > -INFINITY) better(bv, bi, v[j], first + j * ARGMAX_THREADS);
    }
    nan = __syncthreads_or(nan);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(bv, bi, ov, oi);
    }
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x / 32] = bv;
        si[threadIdx.x / 32] = bi;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < ARGMAX_THREADS / 32; w++) better(bv, bi, sv[w], si[w]);
    if (bi != 0x7fffffff)
        atomicMax(key + row, ((unsigned long long)argmax_order(bv) << 32) | (unsigned long long)(0xffffffffu - (uint32_t)bi));
    if (nan) atomicOr(aux + 2 * row, 1);
    __threadfence();
    if (atomicAdd(aux + 2 * row + 1, 1) != (int)gridDim.x - 1) return;
    /* the row's last CTA: every other CTA's update is visible (their
     * fences came before their counter increments) */
    __threadfence();
    const unsigned long long k = atomicExch(key + row, 0ull);
    const int any_nan = atomicExch(aux + 2 * row, 0);
    aux[2 * row + 1] = 0;
    /* k == 0: nothing above -Inf (a found key's order bits are never 0) */
    out[row] = any_nan || k == 0 ? -1 : (int32_t)(0xffffffffu - (uint32_t)(k & 0xffffffffu));
}

void cu_launch_argmax(cu_impl *c, int32_t *out, const float *logits, int n_rows, int cols, int stride) {
    if (n_rows <= 0) return;
    const dim3 grid((unsigned)((cols + ARGMAX_SLICE - 1) / ARGMAX_SLICE), (unsigned)n_rows);
    cu_launch(c, c->act_nc ? k_argmax<true> : k_argmax<false>, grid, dim3(ARGMAX_THREADS), 0, out, c->d_argmax_key,
              c->d_argmax_aux, logits, cols, stride);
    CU_LAUNCHED(c, "argmax");
}

/* ------------------------------------------------------------ page copy */

void cu_launch_kv_copy(cu_impl *c, const ns_kv_layout *l, int dst_page, int src_page, int n_slots) {
    if (l->dtype == NS_DT_FP8_E4M3) {
        cu_launch_kv_copy_fp8(c, l, dst_page, src_page, n_slots);
        return;
    }
    const size_t row = (size_t)l->page_tokens * l->head_dim * 2;
    uint8_t *dst = c->kv + (size_t)dst_page * l->page_size_bytes;
    const uint8_t *src = c->kv + (size_t)src_page * l->page_size_bytes;
    cu_check(c,
             cudaMemcpy2DAsync(dst, row, src, row, (size_t)n_slots * l->head_dim * 2,
                               (size_t)l->n_layers * 2 * l->n_kv_heads, cudaMemcpyDeviceToDevice, c->stream),
             "kv_page_copy");
}
