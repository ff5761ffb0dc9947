/* backend.h — the op layer every compute backend (CPU, CUDA) implements.
 *
 * The engine's forward pass (src/engine/forward.c) is written once against
 * this vtable; a backend only provides memory, the per-step batch upload and
 * the ops. All ops are *enqueued* in call order on the backend's single
 * stream (the CPU backend simply runs them, spreading each op over its
 * thread pool); nothing is visible to the host until a sync point:
 * tensor_download, sample, kv_page_read, kv_page_write, or sync.
 *
 * Invariants
 * - Tensors are 2-D, row-major, rows x cols with cols contiguous. A tensor
 *   struct is a *view*: copying the struct and changing rows/cols/data
 *   (e.g. to see q [T, H*D] as [T*H, D]) is allowed as long as the bytes
 *   stay inside the allocation. Only tensor_alloc'd views are freed.
 * - Activations are always NS_DT_F32. Weights may be F32, BF16 or F16; a
 *   backend may store them converted (the CUDA backend keeps BF16).
 * - Every op reads its per-token metadata (ids, positions, page slots,
 *   sequence spans, logit rows) from the batch given to set_batch; the
 *   batch must be set before the first op of a step and stays valid until
 *   the next set_batch. Keeping metadata in one upload is what lets the
 *   CUDA backend capture a step in a graph and replay it.
 * - KV lives in a page pool (ns_kv_layout): page p holds P tokens of all
 *   layers, K and V, as one contiguous block of page_size_bytes, laid out
 *   [layer][k|v][kv_head][slot][head_dim]. Ops index layers inside a page,
 *   so demotion/promotion/SSD writes of a page are one contiguous copy.
 * - Ops never fail at run time except through backend errors, which are
 *   sticky: the next sync point reports them.
 */
#ifndef NS_BACKEND_H
#define NS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/hash.h"
#include "util/status.h"

/* NS_DT_Q* are GGUF's block-quantized weight formats (ggml layouts; see
 * src/backend/cpu/quant.h): weights only, rows made of whole blocks, never
 * activations or KV. The CPU backend and the CUDA backend
 * (src/backend/cuda/cuda_quant.cu) accept them as matrices; CUDA's moe_ffn
 * does not (BF16 router and experts). */
typedef enum {
    NS_DT_F32 = 0,
    NS_DT_BF16 = 1,
    NS_DT_F16 = 2,
    NS_DT_Q8_0 = 3, /* 32 values: f16 scale + 32 int8 (34 bytes) */
    NS_DT_Q4_0 = 4, /* 32 values: f16 scale + 16 bytes of nibbles (18 bytes) */
    NS_DT_Q4_K = 5, /* 256 values, 144 bytes */
    NS_DT_Q5_K = 6, /* 256 values, 176 bytes */
    NS_DT_Q6_K = 7, /* 256 values, 210 bytes */
    NS_DT_Q4_1 = 8, /* 32 values: f16 scale, f16 min + nibbles (20 bytes) */
    NS_DT_Q5_0 = 9, /* 32 values: f16 scale + 5th bits + nibbles (22 bytes) */
    NS_DT_Q5_1 = 10, /* 32 values: f16 scale, f16 min + 5th bits + nibbles (24 bytes) */
    /* KV pages only (--kv-dtype fp8): 1-byte e4m3 codes plus a float scale
     * per page-head stored at the end of the page (ns_kv_scale_offset;
     * format and scale policy in src/util/fp8.h). Never a weight or an
     * activation. */
    NS_DT_FP8_E4M3 = 11
} ns_dtype;

/* Inline: it sits inside ns_kv_offset, on the attention hot path. Only
 * meaningful for F32/BF16/F16 (element types); block types use
 * ns_dtype_row_bytes. */
static inline size_t ns_dtype_size(ns_dtype dt) { return dt == NS_DT_F32 ? 4 : dt == NS_DT_FP8_E4M3 ? 1 : 2; }
static inline bool ns_dtype_is_quant(ns_dtype dt) { return dt >= NS_DT_Q8_0 && dt <= NS_DT_Q5_1; }
/* Bytes of one row of cols values (cols a multiple of the block size for
 * block types, which the loaders check). */
static inline size_t ns_dtype_row_bytes(ns_dtype dt, int64_t cols) {
    switch (dt) {
    case NS_DT_Q8_0: return (size_t)(cols / 32) * 34;
    case NS_DT_Q4_0: return (size_t)(cols / 32) * 18;
    case NS_DT_Q4_K: return (size_t)(cols / 256) * 144;
    case NS_DT_Q5_K: return (size_t)(cols / 256) * 176;
    case NS_DT_Q6_K: return (size_t)(cols / 256) * 210;
    case NS_DT_Q4_1: return (size_t)(cols / 32) * 20;
    case NS_DT_Q5_0: return (size_t)(cols / 32) * 22;
    case NS_DT_Q5_1: return (size_t)(cols / 32) * 24;
    default: return (size_t)cols * ns_dtype_size(dt);
    }
}
const char *ns_dtype_name(ns_dtype dt);
/* The KV dtype that --kv-dtype `name` (NULL or "auto": F32 on backend
 * "cpu", BF16 otherwise) stands for on backend `backend` ("cpu" or
 * "cuda"): NS_OK and *out, or NS_ERR_INVALID naming the flag for a name
 * that is not auto|bf16|f32|fp8 or a dtype that backend does not store
 * (bf16 on the CPU, f32 on CUDA). */
ns_status ns_kv_dtype_choose(const char *name, const char *backend, ns_dtype *out, ns_error *err);

typedef struct ns_tensor {
    ns_dtype dtype;
    int64_t rows;
    int64_t cols;
    void *data;  /* backend memory: host pointer (cpu) or device pointer (cuda) */
    void *alloc; /* what tensor_free releases; NULL for views and for weights
                  * the CPU backend borrows from a memory map */
} ns_tensor;

static inline size_t ns_tensor_bytes(const ns_tensor *t) {
    return (size_t)t->rows * ns_dtype_row_bytes(t->dtype, t->cols);
}

/* Makes t the owner of allocation p holding rows x cols of dt (what a
 * backend's tensor_alloc returns). */
static inline void ns_tensor_own(ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols, void *p) {
    t->dtype = dt;
    t->rows = rows;
    t->cols = cols;
    t->data = p;
    t->alloc = p;
}

/* The pseudo-random value of element i for seed (weight_random): uniform
 * in [-1, 1), the same bits on the host and in CUDA device code. */
static inline NS_HOSTDEV float ns_random_weight(uint64_t seed, uint64_t i) {
    uint64_t z = ns_splitmix64_mix(seed * 0x9e3779b97f4a7c15ULL + i * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL);
    return (float)((double)(z >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* Geometry of the KV page pool. page_size_bytes covers all layers, K and V. */
typedef struct ns_kv_layout {
    int32_t n_pages;
    int32_t page_tokens;  /* P: tokens per page */
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    ns_dtype dtype;       /* F32 (CPU default, exact reference), BF16 (CUDA default) or FP8_E4M3 */
    size_t page_size_bytes;
} ns_kv_layout;

/* Byte offset of (layer, k_or_v, kv_head, slot) inside one page. */
static inline size_t ns_kv_offset(const ns_kv_layout *l, int layer, int kv, int head, int slot) {
    size_t idx = ((((size_t)layer * 2 + (size_t)kv) * (size_t)l->n_kv_heads + (size_t)head) *
                      (size_t)l->page_tokens + (size_t)slot) * (size_t)l->head_dim;
    return idx * ns_dtype_size(l->dtype);
}

/* FP8 pages: the codes, padded to 16 bytes, then one float scale per
 * (layer, K|V, kv head), padded to 16 bytes, so a page stays one
 * contiguous block (tier moves and SSD records copy it without
 * re-quantizing) and every page of the pool starts 16-byte aligned (the
 * CUDA kernels read codes 16 bytes at a time). */
static inline size_t ns_kv_fp8_codes_bytes(size_t segs, int32_t page_tokens, int32_t head_dim) {
    return (segs * (size_t)page_tokens * (size_t)head_dim + 15) / 16 * 16;
}
/* Byte offset of the scale of (layer, k_or_v, kv_head) in an FP8 page. */
static inline size_t ns_kv_scale_offset(const ns_kv_layout *l, int layer, int kv, int head) {
    const size_t segs = (size_t)l->n_layers * 2 * (size_t)l->n_kv_heads;
    return ns_kv_fp8_codes_bytes(segs, l->page_tokens, l->head_dim) +
           (((size_t)layer * 2 + (size_t)kv) * (size_t)l->n_kv_heads + (size_t)head) * sizeof(float);
}

/* Bytes of one page of this geometry and KV dtype (F32, BF16 or
 * FP8_E4M3; FP8 adds its scales and the padding above). */
static inline size_t ns_kv_page_bytes(int32_t n_layers, int32_t n_kv_heads, int32_t page_tokens, int32_t head_dim,
                                      ns_dtype dt) {
    const size_t segs = (size_t)n_layers * 2 * (size_t)n_kv_heads;
    if (dt == NS_DT_FP8_E4M3)
        return ns_kv_fp8_codes_bytes(segs, page_tokens, head_dim) + (segs * sizeof(float) + 15) / 16 * 16;
    return segs * (size_t)page_tokens * (size_t)head_dim * ns_dtype_size(dt);
}

/* One step's ragged batch, as host arrays (borrowed; set_batch copies).
 * Sequence s contributes tokens [seq_start[s], seq_start[s+1]) whose
 * positions are consecutive and end at seq_len[s]-1: it attends to
 * positions [0, seq_len[s]) through its page table
 * page_table[s*max_pages + i] (page of positions [i*P, (i+1)*P)).
 * KV for the new tokens is written at their positions before attention. */
typedef struct ns_batch {
    int32_t n_tokens;
    int32_t n_seqs;
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *positions;  /* [n_tokens] */
    const int32_t *seq_start;  /* [n_seqs+1], seq_start[0]=0, seq_start[n_seqs]=n_tokens */
    const int32_t *seq_len;    /* [n_seqs] context length after this step */
    const int32_t *page_table; /* [n_seqs * max_pages] */
    int32_t max_pages;
    const int32_t *logit_rows; /* [n_logits] token rows whose logits are wanted, ascending */
    int32_t n_logits;
} ns_batch;

/* A sequence's sampling parameters and state (RNG, penalty counts), used
 * by the sample op for one logits row. Defined in src/sample/sample.h,
 * which sits below both the backends and the engine; opaque here. */
struct ns_sampler;

typedef struct ns_backend ns_backend;

typedef struct ns_backend_ops {
    const char *name;
    void (*destroy)(ns_backend *be);

    /* ---- memory ---- */
    ns_status (*tensor_alloc)(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols,
                              ns_error *err);
    void (*tensor_free)(ns_backend *be, ns_tensor *t);
    /* Makes a weight tensor from host data of dtype src_dt (rows x cols).
     * The backend decides the stored dtype (t->dtype on return) and may
     * borrow src when it can use it in place (CPU + mmap): src must then
     * outlive the tensor. */
    ns_status (*weight_from_host)(ns_backend *be, ns_tensor *t, const void *src, ns_dtype src_dt,
                                  int64_t rows, int64_t cols, ns_error *err);
    /* Fills a new weight tensor with deterministic pseudo-random values,
     * element i (row-major) = ns_random_weight(seed, i) * scale, uniform in
     * [-scale, scale), generated where the backend computes (so
     * --dummy-weights needs no host copy of a full-size model). Same
     * (seed, rows, cols) gives the same values on every backend up to the
     * stored dtype's rounding. */
    ns_status (*weight_random)(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols,
                               uint64_t seed, float scale, ns_error *err);
    /* Host f32 -> tensor (t must be F32) and back. Download is a sync point. */
    ns_status (*tensor_upload)(ns_backend *be, ns_tensor *t, const float *src, ns_error *err);
    ns_status (*tensor_download)(ns_backend *be, const ns_tensor *t, float *dst, ns_error *err);

    /* ---- KV page pool ---- */
    ns_status (*kv_alloc)(ns_backend *be, const ns_kv_layout *layout, ns_error *err);
    void (*kv_free)(ns_backend *be);
    /* Whole-page transfers (sync points): host buffers are page_size_bytes. */
    ns_status (*kv_page_read)(ns_backend *be, int32_t page, void *dst, ns_error *err);
    ns_status (*kv_page_write)(ns_backend *be, int32_t page, const void *src, ns_error *err);
    /* dst <- src for the first n_slots slots of every layer/K/V/head
     * (copy-on-write of a partial page). Enqueued, not a sync point. */
    void (*kv_page_copy)(ns_backend *be, int32_t dst_page, int32_t src_page, int32_t n_slots);

    /* ---- per-step ---- */
    ns_status (*set_batch)(ns_backend *be, const ns_batch *b, ns_error *err);

    /* ---- ops (enqueued) ---- */
    /* out[T, d] = table[tokens[t], :] */
    void (*embed)(ns_backend *be, ns_tensor *out, const ns_tensor *table);
    /* out[r, :] = in[r, :] / rms(in[r, :]) * w  (w is [1, cols]); out may alias in */
    void (*rmsnorm)(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w, float eps);
    /* out[n, m] = in[n, k] @ w[m, k]^T */
    void (*matmul)(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w);
    /* Rotary embedding in place, "rotate half" (HF) pairing: dims i and
     * i + rot_dim/2 of each head, angle = positions[t] * inv_freq[i].
     * x is [T, n_heads*head_dim]; inv_freq is F32 [1, head_dim/2]. */
    void (*rope)(ns_backend *be, ns_tensor *x, int n_heads, int head_dim, const ns_tensor *inv_freq);
    /* out = silu(gate) * up, elementwise over [T, ff] */
    void (*swiglu)(ns_backend *be, ns_tensor *out, const ns_tensor *gate, const ns_tensor *up);
    /* out += x */
    void (*add)(ns_backend *be, ns_tensor *out, const ns_tensor *x);
    /* Writes k, v ([T, n_kv_heads*head_dim]) of this layer into the pool at
     * each token's position through its sequence's page table. */
    void (*kv_store)(ns_backend *be, int layer, const ns_tensor *k, const ns_tensor *v);
    /* Causal paged attention for every sequence of the batch:
     * out[T, n_heads*head_dim]; query token t of sequence s attends to
     * positions [0, positions[t]] of s. GQA: head h uses kv head
     * h / (n_heads / n_kv_heads). scale = 1/sqrt(head_dim) typically. */
    void (*attention)(ns_backend *be, ns_tensor *out, const ns_tensor *q, int layer, int n_heads,
                      float scale);
    /* out[i, :] = in[logit_rows[i], :] for i < n_logits */
    void (*gather_rows)(ns_backend *be, ns_tensor *out, const ns_tensor *in);

    /* ---- sampling (sync point) ----
     * Samples one token per row of logits (F32 [n_rows, vocab]) with
     * samplers[i]; writes out_tokens[i]. The reference semantics are
     * ns_sampler_sample (src/sample/sample.c); a backend must match them.
     * out_tokens[i] = -1 means "this row's logits are not finite" (a NaN,
     * or no value above -Inf): no token; the caller fails that request
     * and the other rows are unaffected. That is not an op failure.
     * A sampler's RNG advances when it draws; the sampled token is not
     * accepted into its penalty history (the caller does that with
     * ns_sampler_accept). */
    ns_status (*sample)(ns_backend *be, const ns_tensor *logits, int n_rows, struct ns_sampler *const *samplers,
                        int32_t *out_tokens, ns_error *err);

    /* Waits for all enqueued work; reports a sticky error if any. */
    ns_status (*sync)(ns_backend *be, ns_error *err);

    /* ---- host memory for lower KV tiers (optional) ----
     * Memory the backend copies pages to and from fastest (CUDA: pinned,
     * page-locked host memory, so kv_page_read/write run at the full PCIe
     * rate without a staging copy). NULL: the caller uses malloc/free. */
    void *(*host_alloc)(ns_backend *be, size_t bytes);
    void (*host_free)(ns_backend *be, void *p);

    /* ---- asynchronous page transfers for the cache tiers (optional) ----
     * On a copy stream of their own, so demotions and promotions overlap
     * with compute. Each is ordered after every op enqueued before it and
     * returns a fence (> 0; 0 = complete already, or the op failed and
     * the error is sticky). The host buffer must come from host_alloc and
     * stay untouched until the fence is done. Copies complete in the order
     * they were issued. NULL: callers use the synchronous kv_page_read /
     * kv_page_write instead. */
    uint64_t (*kv_page_read_async)(ns_backend *be, int32_t page, void *dst);
    uint64_t (*kv_page_write_async)(ns_backend *be, int32_t page, const void *src);
    bool (*fence_done)(ns_backend *be, uint64_t fence);
    /* The host waits for the fence. */
    void (*fence_wait)(ns_backend *be, uint64_t fence);
    /* Compute ops enqueued from now on wait for the fence on the device;
     * the host does not block (a page being demoted is not overwritten, a
     * promoted page is not read, before its copy is done). */
    void (*compute_after)(ns_backend *be, uint64_t fence);

    /* ---- ops some architectures need (optional; last in the struct, so
     * backends that initialize the table by position stay valid) ---- */
    /* out[r, :] += b[0, :] for every row r (b is F32 [1, out->cols]).
     * Optional: NULL means models with projection biases (Qwen2) cannot
     * run on this backend, and their load fails saying so. */
    void (*add_bias)(ns_backend *be, ns_tensor *out, const ns_tensor *b);
    /* Mixture-of-experts SwiGLU MLP (Qwen3-MoE), added to out:
     * for each token t (row of in, [T, hidden]): router logits
     * in[t] @ router^T ([n_experts, hidden]), softmax over the experts in
     * F32, the top_k largest probabilities (ties: the lower expert index),
     * divided by their sum when norm_topk; then
     *   out[t] += sum over the chosen e, ascending e, of
     *             p_e * down_e(silu(gate_e in[t]) * up_e in[t]).
     * experts holds 3 * n_experts weight tensors: gate_e at [e], up_e at
     * [n_experts + e] (both [moe_ff, hidden]), down_e at [2 * n_experts + e]
     * ([hidden, moe_ff]). An implementation reads only the chosen experts'
     * weights (tokens grouped by expert in prefill). out must not alias
     * in. Optional: NULL means MoE models cannot run on this backend (their
     * load fails saying so). */
    void (*moe_ffn)(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                    const ns_tensor *experts, int n_experts, int top_k, bool norm_topk);

    /* ---- step memo (optional) ----
     * The engine issues the same ops, with the same tensors, in every step
     * of one shape (token and logits-row counts): everything per-step is
     * batch metadata, which ops read from set_batch. A backend that records
     * its steps (CUDA: a tape replayed as a graph) can keep the last step's
     * op sequence, so that a decode step skips issuing ~300 op calls while
     * the device idles between steps.
     * memo_save(be, id): called right after a step's last op; remembers
     *   the ops issued since set_batch under id (any earlier memo is
     *   dropped), or forgets everything if it cannot keep them.
     * memo_replay(be, id): called right after set_batch; if the backend
     *   holds a memo saved under id, still valid (no allocation or setting
     *   that ops depend on has changed since) and nothing was issued since
     *   set_batch, it issues those ops again and returns true; otherwise
     *   false, and the caller issues the ops itself.
     * The caller owns the promise that equal ids mean equal op sequences.
     * NULL: no memo (the CPU backend runs ops as they come). */
    void (*memo_save)(ns_backend *be, uint64_t id);
    bool (*memo_replay)(ns_backend *be, uint64_t id);
} ns_backend_ops;

struct ns_backend {
    const ns_backend_ops *ops;
    ns_kv_layout kv;    /* valid after kv_alloc */
    int n_threads;      /* CPU worker threads (cpu backend) */
    void *impl;         /* backend private state */
};

/* Constructors. Each returns a backend the caller owns (ops->destroy).
 * The KV pool is sized later, by kv_alloc. */
ns_status ns_backend_cpu_create(int n_threads, ns_backend **out, ns_error *err);
#ifdef NS_HAVE_CUDA
/* Opens CUDA device `device` (NS_ERR_RANGE if it does not exist,
 * NS_ERR_UNSUPPORTED without a GPU or below sm_80). */
ns_status ns_backend_cuda_create(int device, ns_backend **out, ns_error *err);
#endif
/* Creates "cpu" (also for name NULL) or "cuda" (device 0; n_threads is
 * ignored) by name; NS_ERR_UNSUPPORTED if CUDA is not built in,
 * NS_ERR_INVALID for any other name. */
ns_status ns_backend_create(const char *name, int n_threads, ns_backend **out, ns_error *err);

#endif
