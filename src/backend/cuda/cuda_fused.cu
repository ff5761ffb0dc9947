/* cuda_fused.cu — fused kernels for recorded (decode) tapes.
 *
 * A decode step is launch-bound at small batch: ~18 kernels per layer, most
 * moving a few kilobytes. When a recorded tape holds the engine's fixed op
 * sequences, cuda_backend.cu runs them through these kernels instead:
 * - q/k RMSNorm (optional) + RoPE of q and k + KV store of k and v: one
 *   kernel, one warp per (token, head), instead of five;
 * - residual add + the RMSNorm that follows it: one kernel instead of two;
 *   in its other modes the step's embedding + first RMSNorm, and its last
 *   add + gather of the logits rows + final RMSNorm.
 * Each fused kernel performs exactly the arithmetic of the unfused kernels
 * in the same order (same per-lane element assignment, same reduction
 * tree), so fusing changes no result bit; tests/gpu checks fused against
 * unfused decode.
 */
#include "backend/cuda/cuda_kv_fp8.cuh"

/* E = head_dim / 32 elements per lane: lane holds d = lane + 32 e, so the
 * rotate-half partner of e < E/2 is e + E/2 (head_dim a multiple of 64).
 * NC: q/k loads plain or .cg (c->act_nc). v is always read with the
 * volatile .cg load: an ld.global.nc declares its data constant for the
 * kernel's whole life, and ptxas scheduled this kernel's .nc loads of v
 * above the early path's griddepcontrol.wait (SASS of run E: four
 * LDG.E.CONSTANT before the ACQBULK), so v was read before the q/k/v
 * GEMV wrote it -- the early-load fault of docs/cuda.md v17/v18. Each
 * element is read once: the read-only path bought nothing here. */
template <int E, bool NC>
__global__ __launch_bounds__(128) void k_qk_norm_rope_store(
    float *q, float *k, const float *__restrict__ v, int T, int H, int KVH, const float *__restrict__ qn,
    const float *__restrict__ kn, float eps, const float *__restrict__ inv_freq, const int32_t *__restrict__ positions,
    const int32_t *__restrict__ tok_seq, const int32_t *__restrict__ page_table, int pt_stride, uint8_t *kv,
    size_t page_bytes, int P, int layer, cu_prefetch pf, int main_blocks, int early, size_t fp8_scales) {
    PDL_TRIGGER();
    if ((int)blockIdx.x >= main_blocks) {
        l2_prefetch(pf, (int)blockIdx.x - main_blocks);
        PDL_WAIT();
        return;
    }
    /* early: the norm weights, RoPE frequencies and batch metadata (and so
     * the rotation and the KV slot address) never come from an earlier
     * kernel of the tape; they are read and computed before the PDL wait,
     * overlapping the previous kernel. Only q, k and v wait. */
    if (!early) PDL_WAIT();
    constexpr int D = 32 * E;
    const int w = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x & 31;
    const int t = w / (H + KVH), h = w % (H + KVH);
    if (t >= T) {
        if (early) PDL_WAIT();
        return;
    }
    const bool is_q = h < H;
    float *vec = is_q ? q + ((size_t)t * H + h) * D : k + ((size_t)t * KVH + (h - H)) * D;
    const float *nw = is_q ? qn : kn;
    float wn[E];
    if (nw) {
#pragma unroll
        for (int e = 0; e < E; e++) wn[e] = nw[lane + 32 * e];
    }
    const int pos = positions[t];
    float sn[E / 2], cs[E / 2];
#pragma unroll
    for (int e = 0; e < E / 2; e++) {
        const int i = lane + 32 * e;
        const float ang = (float)pos * inv_freq[i];
        sincosf(ang, &sn[e], &cs[e]);
    }
    bf16 *kd = NULL, *vd = NULL;
    /* FP8 pool (fp8_scales = offset of the scales in a page, 0 for bf16):
     * the K and V page-head segments and their scales (cuda_kv_fp8.cuh) */
    uint8_t *k8 = NULL, *v8 = NULL;
    float *ks8 = NULL;
    int slot = 0;
    if (!is_q) {
        const int kvh = h - H;
        const int seq = tok_seq[t];
        const int page = page_table[(size_t)seq * pt_stride + pos / P];
        slot = pos % P;
        if (fp8_scales) {
            uint8_t *pg8 = kv + (size_t)page * page_bytes;
            k8 = pg8 + (((size_t)layer * 2 + 0) * KVH + kvh) * (size_t)P * D;
            v8 = pg8 + (((size_t)layer * 2 + 1) * KVH + kvh) * (size_t)P * D;
            ks8 = reinterpret_cast<float *>(pg8 + fp8_scales) + ((size_t)layer * 2 + 0) * KVH + kvh;
        } else {
            bf16 *pg = (bf16 *)(kv + (size_t)page * page_bytes);
            kd = pg + ((((size_t)layer * 2 + 0) * KVH + kvh) * P + slot) * D;
            vd = pg + ((((size_t)layer * 2 + 1) * KVH + kvh) * P + slot) * D;
        }
    }
    if (early) PDL_WAIT();
    float x[E], vv[E];
#pragma unroll
    for (int e = 0; e < E; e++) x[e] = NC ? vec[lane + 32 * e] : cu_ld_act<false>(vec + lane + 32 * e);
    if (!is_q) {
        const float *vs = v + ((size_t)t * KVH + (h - H)) * D;
#pragma unroll
        for (int e = 0; e < E; e++) vv[e] = cu_ld_act<false>(vs + lane + 32 * e);
    }
    if (nw) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) ss += x[e] * x[e];
        ss = cu_warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
#pragma unroll
        for (int e = 0; e < E; e++) x[e] = (x[e] * inv) * wn[e];
    }
#pragma unroll
    for (int e = 0; e < E / 2; e++) {
        const float s = sn[e], co = cs[e];
        const float x0 = x[e], x1 = x[e + E / 2];
        x[e] = x0 * co - x1 * s;
        x[e + E / 2] = x1 * co + x0 * s;
    }
#pragma unroll
    for (int e = 0; e < E; e++) vec[lane + 32 * e] = x[e];
    if (!is_q && k8) {
        cu_fp8_append_row<D>(k8, ks8, slot, x);
        cu_fp8_append_row<D>(v8, ks8 + KVH, slot, vv);
    } else if (!is_q) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            kd[lane + 32 * e] = __float2bfloat16_rn(x[e]);
            vd[lane + 32 * e] = __float2bfloat16_rn(vv[e]);
        }
    }
}

void cu_launch_qk_norm_rope_store(cu_impl *c, const ns_kv_layout *l, int layer, float *q, float *k, const float *v,
                                  int n_tokens, int n_heads, const float *q_norm, const float *k_norm, float eps,
                                  const float *inv_freq, const cu_prefetch *pf) {
    const int warps = n_tokens * (n_heads + l->n_kv_heads);
    const unsigned blocks = (unsigned)((warps + 3) / 4);
    const unsigned extra = cu_pf_any(pf) ? CU_PF_BLOCKS : 0;
#define QKRS_ARGS                                                                                                     \
    q, k, v, n_tokens, n_heads, l->n_kv_heads, q_norm, k_norm, eps, inv_freq, c->meta.positions, c->meta.tok_seq,     \
        c->meta.page_table, c->meta.pt_stride, c->kv, l->page_size_bytes, l->page_tokens, layer, *pf, (int)blocks, \
        cu_early(c, CU_EARLY_QKNORM), l->dtype == NS_DT_FP8_E4M3 ? ns_kv_scale_offset(l, 0, 0, 0) : (size_t)0
    if (!c->act_nc) {
        switch (l->head_dim) {
        case 64: cu_launch(c, k_qk_norm_rope_store<2, false>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        case 128: cu_launch(c, k_qk_norm_rope_store<4, false>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        case 256: cu_launch(c, k_qk_norm_rope_store<8, false>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        default: cu_check(c, cudaErrorInvalidValue, "qk_norm_rope_store: head_dim must be 64, 128 or 256"); return;
        }
    } else {
        switch (l->head_dim) {
        case 64: cu_launch(c, k_qk_norm_rope_store<2, true>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        case 128: cu_launch(c, k_qk_norm_rope_store<4, true>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        case 256: cu_launch(c, k_qk_norm_rope_store<8, true>, dim3(blocks + extra), dim3(128), 0, QKRS_ARGS); break;
        default: cu_check(c, cudaErrorInvalidValue, "qk_norm_rope_store: head_dim must be 64, 128 or 256"); return;
        }
    }
#undef QKRS_ARGS
    CU_LAUNCHED(c, "qk_norm_rope_store");
}

/* x += y; out = rmsnorm(x) * w, one 512-thread block per row, float4
 * lanes: the same element order and reduction as k_add4 + k_rmsnorm_block.
 * y (the GEMV's output, written by the kernel before) is read with the
 * volatile .cg load, never .nc, which ptxas may schedule above the PDL
 * wait (see k_qk_norm_rope_store).
 * The first AR_REG float4 of each thread stay in registers between the
 * two passes, and their norm weights are read before the PDL wait when
 * early (norm weights never come from an earlier kernel of the tape).
 *
 * SRC picks where the row comes from (the other two of the step's row
 * patterns, cuda_tape_fuse.cu 5 and 6; each replaced two or three
 * latency-bound one-row kernels on a batch-1 step's critical path,
 * ~10 us at the step's start and ~7 us at its end, docs/cuda.md v32):
 * - AR_ADD: x[r] += y[r]. With idx (the logits rows of a gather), out
 *   row i is the norm of x[idx[i]] for every i < n_idx, written by the
 *   block of that row (so repeated rows race on nothing), and a row no
 *   i names is only added: x keeps the add + gather + norm semantics.
 * - AR_EMBED_BF16 / AR_EMBED_F32: x[r] = table[idx[r]] (y is the table,
 *   idx the step's tokens), then out[r] = its norm: embed + RMSNorm.
 * The values are the unfused kernels' bit for bit: the add and the
 * bf16 -> f32 widening are exact per element, the norm is this kernel's
 * in every mode. */
#define AR_REG 4
enum { AR_ADD = 0, AR_EMBED_BF16 = 1, AR_EMBED_F32 = 2 };

/* The four values of a row at d (a multiple of 4) that the norm takes:
 * the sum (written back to the residual) or the embedding row's. */
template <bool NC, int SRC>
__device__ __forceinline__ float4 ar_load(float *xr, const void *__restrict__ src, int64_t src_off, int d) {
    float4 a;
    if constexpr (SRC == AR_ADD) {
        a = NC ? *reinterpret_cast<const float4 *>(xr + d) : cu_ld_act4<false>(xr + d);
        const float4 b = cu_ld_act4<false>((const float *)src + src_off + d);
        a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    } else if constexpr (SRC == AR_EMBED_BF16) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>((const bf16 *)src + src_off + d));
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x)),
                     hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
        a = make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
        a = __ldg(reinterpret_cast<const float4 *>((const float *)src + src_off + d));
    }
    *reinterpret_cast<float4 *>(xr + d) = a;
    return a;
}

template <bool NC, int SRC>
__global__ void k_add_rmsnorm(float *x, const void *__restrict__ y, float *out, bf16 *out_bf,
                              const float *__restrict__ w, int cols, float eps, cu_prefetch pf, int64_t rows,
                              int early, const int32_t *__restrict__ idx, int n_idx) {
    PDL_TRIGGER();
    if ((int64_t)blockIdx.x >= rows) {
        l2_prefetch(pf, (int)(blockIdx.x - rows));
        PDL_WAIT();
        return;
    }
    if (!early) PDL_WAIT();
    const int step = blockDim.x * 4;
    float4 wv[AR_REG], xv[AR_REG];
#pragma unroll
    for (int i = 0; i < AR_REG; i++) {
        const int d = threadIdx.x * 4 + i * step;
        if (d < cols) wv[i] = *reinterpret_cast<const float4 *>(w + d);
    }
    if (early) PDL_WAIT();
    const int64_t r = blockIdx.x;
    float *xr = x + r * cols;
    /* the source row's offset in y: the residual's own row, or the
     * embedding row of the token (metadata, uploaded before the step) */
    const int64_t src_off = SRC == AR_ADD ? r * cols : (int64_t)idx[r] * cols;
    __shared__ float part[32];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < AR_REG; i++) {
        const int d = threadIdx.x * 4 + i * step;
        if (d < cols) {
            const float4 a = ar_load<NC, SRC>(xr, y, src_off, d);
            xv[i] = a;
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
    }
    for (int d = threadIdx.x * 4 + AR_REG * step; d < cols; d += step) {
        const float4 a = ar_load<NC, SRC>(xr, y, src_off, d);
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    /* gather mode: the first out row that names this row, if any (the
     * same for every thread of the block, so the barriers below agree) */
    int64_t orow = r;
    if (SRC == AR_ADD && idx) {
        orow = -1;
        for (int i = 0; i < n_idx; i++)
            if (idx[i] == r) {
                orow = i;
                break;
            }
        if (orow < 0) return;
    }
    const float inv = 1.0f / sqrtf(cu_block_sum(ss, part) / (float)cols + eps);
    while (orow >= 0) {
        float *o = out ? out + orow * cols : NULL; /* NULL: only the bf16 shadow (cu_tape_f32_dead) */
        bf16 *ob = out_bf ? out_bf + orow * cols : NULL;
        auto emit = [&](int d, float4 a, float4 ww) {
            float4 yv = make_float4((a.x * inv) * ww.x, (a.y * inv) * ww.y, (a.z * inv) * ww.z, (a.w * inv) * ww.w);
            if (o) *reinterpret_cast<float4 *>(o + d) = yv;
            if (ob) cu_store_bf16x4(ob + d, yv);
        };
#pragma unroll
        for (int i = 0; i < AR_REG; i++) {
            const int d = threadIdx.x * 4 + i * step;
            if (d < cols) emit(d, xv[i], wv[i]);
        }
        for (int d = threadIdx.x * 4 + AR_REG * step; d < cols; d += step)
            emit(d, *reinterpret_cast<const float4 *>(xr + d), *reinterpret_cast<const float4 *>(w + d));
        /* a later logits row naming the same row (never from the
         * scheduler, which asks one row per sequence) */
        int64_t next = -1;
        if (SRC == AR_ADD && idx)
            for (int i = (int)orow + 1; i < n_idx; i++)
                if (idx[i] == r) {
                    next = i;
                    break;
                }
        orow = next;
    }
}

typedef void (*ar_fn)(float *, const void *, float *, bf16 *, const float *, int, float, cu_prefetch, int64_t, int,
                      const int32_t *, int);

/* The one launch shape of k_add_rmsnorm for the three launchers below: a
 * block of 512 threads per row, then the prefetch CTAs, if any. */
static void ar_launch(cu_impl *c, ar_fn fn, float *x, const void *y, float *out, bf16 *out_bf, const float *w,
                      int64_t rows, int cols, float eps, const cu_prefetch *pf, const int32_t *idx, int n_idx,
                      const char *what) {
    const unsigned extra = cu_pf_any(pf) ? CU_PF_BLOCKS : 0;
    cu_launch(c, fn, dim3((unsigned)rows + extra), dim3(512), 0, x, y, out, out_bf, w, cols, eps, *pf, rows,
              cu_early(c, CU_EARLY_ADDNORM), idx, n_idx);
    CU_LAUNCHED(c, what);
}

void cu_launch_add_rmsnorm(cu_impl *c, float *x, const float *y, float *out, bf16 *out_bf, const float *w,
                           int64_t rows, int cols, float eps, const cu_prefetch *pf) {
    if (rows <= 0) return;
    ar_launch(c, c->act_nc ? k_add_rmsnorm<true, AR_ADD> : k_add_rmsnorm<false, AR_ADD>, x, y, out, out_bf, w, rows,
              cols, eps, pf, NULL, 0, "add_rmsnorm");
}

void cu_launch_add_gather_rmsnorm(cu_impl *c, float *x, const float *y, float *out, bf16 *out_bf, const float *w,
                                  int64_t rows, int cols, float eps, int n_out, const cu_prefetch *pf) {
    if (rows <= 0) return;
    if (n_out > c->meta.n_logits) {
        cu_check(c, cudaErrorInvalidValue, "add_gather_rmsnorm: more rows than the batch has logits");
        return;
    }
    ar_launch(c, c->act_nc ? k_add_rmsnorm<true, AR_ADD> : k_add_rmsnorm<false, AR_ADD>, x, y, out, out_bf, w, rows,
              cols, eps, pf, c->meta.logit_rows, n_out, "add_gather_rmsnorm");
}

void cu_launch_embed_rmsnorm(cu_impl *c, float *x, const ns_tensor *table, float *out, bf16 *out_bf, const float *w,
                             int64_t rows, int cols, float eps, const cu_prefetch *pf) {
    if (rows <= 0) return;
    if (rows > c->meta.n_tokens) {
        cu_check(c, cudaErrorInvalidValue, "embed_rmsnorm: more rows than the batch has tokens");
        return;
    }
    const bool b16 = table->dtype == NS_DT_BF16;
    ar_launch(c, b16 ? k_add_rmsnorm<true, AR_EMBED_BF16> : k_add_rmsnorm<true, AR_EMBED_F32>, x, table->data, out,
              out_bf, w, rows, cols, eps, pf, c->meta.tokens, (int)rows, "embed_rmsnorm");
}
