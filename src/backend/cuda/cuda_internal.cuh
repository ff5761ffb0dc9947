/* cuda_internal.cuh — private state and kernel entry points of the CUDA
 * backend (included by the .cu files of src/backend/cuda only).
 *
 * Invariants
 * - One stream per backend; every op is enqueued on it in call order.
 * - Errors are sticky: the first CUDA/cuBLAS failure is kept in cu_impl
 *   and reported at the next sync point; later ops become no-ops.
 * - Per-step metadata lives in one device buffer (cu_meta), its regions
 *   packed per step at offsets that depend only on the step's counts (all
 *   part of the graph key); the buffer only moves when a capacity grows,
 *   and every growth bumps `generation`, which drops all captured graphs
 *   (they bake addresses).
 * - F32 activations allocated through tensor_alloc may own a BF16
 *   "shadow" (cu_shadow): producers that feed matmuls (rmsnorm, swiglu,
 *   attention, gather_rows) write it in the same kernel, so a GEMM never
 *   needs a separate conversion pass. A shadow is trusted only if it is
 *   marked valid for exactly the view (rows, cols) being read; any other
 *   write into the allocation invalidates it.
 */
#ifndef NS_CUDA_INTERNAL_CUH
#define NS_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* the driver entry points' function types (nothing links -lcuda) */
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
}

typedef __nv_bfloat16 bf16;

/* ------------------------------------------------------------ op tape */

/* Ops of a graphable step are recorded here and executed at the next sync
 * point, either eagerly, by capturing them into a CUDA graph, or by
 * replaying a graph captured from an identical tape. */
typedef enum {
    OP_EMBED = 0,
    OP_RMSNORM,
    OP_MATMUL,
    OP_ROPE,
    OP_SWIGLU,
    OP_ADD,
    OP_KV_STORE,
    OP_ATTENTION,
    OP_GATHER,
    OP_KV_COPY,
    OP_ARGMAX,
    OP_ADD_BIAS, /* a += b (bias row); no tape fusion consumes it */
    OP_MOE,      /* cuda_moe.cu: a += experts(b), router c; i0 experts, i1 top k, i2 norm, pad table */
    OP_COUNT
} cu_op_kind;

typedef struct cu_op {
    int32_t kind;
    int32_t i0, i1, i2;
    float f0;
    int32_t pad;
    ns_tensor a, b, c; /* out, in, weight (meaning per kind) */
} cu_op;

/* ------------------------------------------------------------ metadata */

#define CU_META_ALIGN 16 /* ints: each metadata region starts 64-byte aligned */

typedef struct cu_meta {
    /* capacities (device buffers are sized by these) */
    int32_t cap_tokens, cap_seqs, cap_pt_stride, cap_logits, cap_tiles;
    /* device regions (int32), placed per step by meta_place (cuda_backend.cu) */
    int32_t *d_base;
    int32_t *tokens, *positions, *tok_seq, *seq_start, *seq_len, *page_table, *logit_rows, *tiles, *dec_seqs;
    /* pinned host staging, same layout */
    int32_t *h_base;
    size_t total_ints;
    size_t used_ints; /* this step's packed span from d_base (meta_place in cuda_backend.cu) */
    /* this step's values */
    int32_t n_tokens, n_seqs, n_logits, pt_stride, n_tiles, n_dec, n_splits, max_len;
    int32_t n_prefill_seqs; /* sequences with more than one new token */
    /* 1 when n_splits < 64 and a split of the longest decode row holds
     * >= 1024 keys (the FP8 decode's choice of kernel, in the graph key) */
    int32_t long_splits;
    int32_t mma_splits; /* splits of the tensor-core decode kernel (choose_mma_splits; in the graph key) */
    int32_t fp8r_splits; /* splits of the FP8 register-tile decode, 0: not this step (choose_fp8r_splits; in the graph key) */
    bool valid;
} cu_meta;

typedef struct cu_shadow {
    void *base;    /* F32 allocation (tensor_alloc'd) */
    size_t bytes;  /* of the F32 allocation */
    bf16 *bf;      /* BF16 shadow, NULL until first needed */
    int64_t vrows, vcols;
    bool valid;
} cu_shadow;

typedef struct cu_gemm_plan {
    int64_t m, n, k;
    int align; /* min alignment of the pointers, bytes */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    bool ok;
} cu_gemm_plan;

typedef struct cu_graph_entry {
    uint64_t key;
    uint64_t generation;
    int32_t n_ops;
    cu_op *ops; /* copy of the tape, to rule out hash collisions */
    cudaGraphExec_t exec;
    int32_t seen;
    bool no_graph; /* capture failed once: always eager */
    uint64_t last_use;
    uint64_t serial; /* which insert made this entry (a slot is reused) */
} cu_graph_entry;

#define CU_MAX_GRAPHS 128
#define CU_MAX_PLANS 256
#define CU_PROF_LABELS 96
#define CU_PROF_EVENTS 8192

typedef struct cu_prof_label {
    char name[48];
    double ms;
    int64_t calls;
} cu_prof_label;

/* Fence events of the copy stream (a ring: fence f uses slot f % size). */
#define CU_FENCES 4096
/* Launch slots of the persistent MLP's phase probe (cuda_mlp.cu): the
 * stamps of the last this many launches (a decode step has one per layer). */
#define CU_MLP_PROBE_SLOTS 64

typedef struct cu_impl {
    int device;
    int n_sm;
    size_t smem_optin;
    cudaStream_t stream;
    /* cache-tier page transfers: their own stream, ordered after compute
     * through compute_ev, completion told by the fence ring */
    cudaStream_t copy_stream;
    cudaEvent_t compute_ev;
    cudaEvent_t *fence_ev;     /* [CU_FENCES] */
    uint64_t next_fence;       /* the next fence to hand out (from 1) */
    uint64_t fences_done;      /* every fence <= this has completed */
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    cu_gemm_plan plans[CU_MAX_PLANS];
    int n_plans;

    /* sticky error */
    ns_status err_status;
    char err_msg[400];

    /* KV pool */
    uint8_t *kv;

    /* metadata */
    cu_meta meta;
    cudaEvent_t staging_done;
    /* NS_CUDA_GAP_PROBE (default 0): events around each sampled step
     * (set_batch's upload -> the tokens' copy) to measure how long the GPU
     * idles between steps and how long a step takes from its upload to
     * its tokens (ns_cuda_gap_stats; bench-engine prints them) */
    int gap_probe;
    cudaEvent_t probe_begin, probe_end[2];
    cudaEvent_t probe_mid, probe_graph; /* after the upload; after the step's kernels (before the tokens' copy) */
    double probe_upload_ms, probe_graph_ms;
    bool probe_begun, probe_prev;
    int probe_cur;
    double probe_idle_ms, probe_span_ms;
    int64_t probe_n;
    bool staging_pending;

    /* shadows */
    cu_shadow *shadows;
    int n_shadows;
    size_t cap_shadows;

    /* scratch */
    bf16 *conv;            /* bf16 conversion scratch for matmul inputs */
    size_t conv_elems;
    float *attn_ws;        /* split-KV partials: o[D], m, l per (dec, head, split), rows of D + 4 floats */
    size_t attn_ws_floats;
    int32_t *attn_cnt;     /* per (dec seq, kv head): splits finished (self-resetting) */
    size_t attn_cnt_n;
    int32_t *d_argmax;     /* [cap] */
    unsigned long long *d_argmax_key; /* [cap] per-row running (value, ~index) maxima, zero between launches */
    int32_t *d_argmax_aux; /* [2 cap] per row: a NaN was seen, CTAs finished; zero between launches */
    int32_t *h_argmax;     /* pinned [cap], mapped */
    int32_t *d_argmax_mapped; /* h_argmax's device address: with argmax_mapped the argmax writes the tokens there */
    int argmax_mapped;     /* NS_CUDA_ARGMAX_MAPPED (default 1): no copy of the tokens after the step's graph */
    int32_t argmax_cap;
    float *h_rows;         /* pinned host copy of logits rows for host sampling */
    size_t h_rows_floats;

    /* tape + graphs */
    bool recording;      /* this step's ops go to the tape */
    bool tape_eager_only; /* the tape is a prefill or mixed step's: fused and run at flush, never a graph */
    int prefill_fuse;     /* NS_CUDA_PREFILL_FUSE (default 1): record non-decode steps for the row-op fusions */
    /* NS_CUDA_PREFILL_LEAN (default 3), in prefill tapes only: bit 1 drops
     * the F32 output of an RMSNorm / SwiGLU whose only readers are GEMMs
     * through its bf16 shadow (cu_tape_f32_dead); bit 2 adds the output
     * and down projections into the residual inside the GEMM (beta 1)
     * instead of writing them out for a separate add */
    int prefill_lean;
    bool out_f32_dead; /* run_tape -> exec_op: the op at hand may skip its F32 output (set per op) */
    int64_t stat_f32_dropped, stat_gemm_residual; /* what prefill_lean did (ns_cuda_prefill_lean_stats) */
    bool capturing;      /* inside cudaStreamBeginCapture */
    bool capture_failed; /* an op could not run under capture */
    cu_op *tape;
    int32_t n_tape;
    size_t cap_tape;
    uint64_t generation;
    uint64_t use_clock;
    cu_graph_entry graphs[CU_MAX_GRAPHS];
    int graphs_enabled;
    int fusion; /* fuse fixed op sequences of recorded tapes */
    int dec_fuse; /* with fusion: RMSNorm / residual add folded into decode GEMVs (cuda_decode.cu) */
    int dec_early; /* with dec_fuse: their first weight loads before the PDL wait after a GEMV */
    int act_nc; /* activation loads of decode kernels through ld.global.nc (1) or ld.global.cg (0): cu_ld_act4<NC> */
    int pdl_anchors; /* NS_CUDA_PDL_ANCHOR (default 1): the first launch after a copy drops the PDL attribute */
    bool pdl_anchor; /* set after a copy on the stream, cleared by cu_launch */
    int pdl;    /* programmatic dependent launch between our kernels */
    int pdl_gemv; /* NS_CUDA_PDL_GEMV (default 0): 0 = a GEMV launched right after a GEMV drops the PDL attribute;
                   * 1 = PDL there too; 2 = PDL there, and the bf16 GEMVs trigger after their main loop */
    bool gemv_next, gemv_prev; /* the launch about to happen / the last launch is a GEMV (cu_launch) */
    /* the bulk-copy GEMV (cuda_gemv_bulk.cu) for batch 1-2: on/off, CTAs
     * per SM, ring stage bytes, shared-memory budget per CTA (bytes) */
    int gemv_bulk, gemv_bulk_ctas, gemv_bulk_stage, gemv_bulk_smem;
    /* the persistent decode MLP kernel (cuda_mlp.cu): on/off (NS_CUDA_MLP),
     * most CTAs per SM (NS_CUDA_MLP_CTAS), each instance's occupancy, and
     * its grid-barrier word (device, zeroed once) */
    int mlp_persist, mlp_ctas, mlp_tail;
    /* the step's row patterns (cuda_tape_fuse.cu 5, 6; NS_CUDA_ROW_FUSE,
     * default 3): bit 1 embed + RMSNorm, bit 2 add + gather + RMSNorm */
    int row_fuse;
    int mlp_occ[4];
    unsigned *mlp_bar;
    /* the MLP's phase probe (NS_CUDA_MLP_PROBE=1 at creation, cuda_mlp.cu):
     * per-CTA globaltimer stamps [CU_MLP_PROBE_SLOTS][mlp_probe_cap][4]
     * (device; NULL: off), each launch's grid by slot (0: unused), the
     * next slot a launch takes */
    unsigned long long *mlp_probe;
    int mlp_probe_cap, mlp_probe_next;
    int mlp_probe_grid[CU_MLP_PROBE_SLOTS];
    int cc_major; /* compute capability of the device */
    int prefetch; /* MB of the next GEMVs' weights each small decode kernel prefetches into L2 (0: none) */
    int split_keys; /* fewest keys per decode-attention split */
    int dec_mma_div; /* NS_CUDA_DEC_MMA_DIV: long contexts' tensor-core decode splits = n_splits / this */
    int dec_mma_tiles; /* NS_CUDA_DEC_MMA_TILES: shorter ones halved until a split holds this many tiles */
    int dec_mma_ctas;  /* NS_CUDA_DEC_MMA_CTAS: and until there are at most this many CTAs per SM (0: no cap) */
    int fp8_stages;    /* NS_CUDA_FP8_STAGES: 2 or 3 forces the FP8 tensor-core decode's raw stages (0: by grid) */
    int qgemv_early;   /* NS_CUDA_QGEMV_EARLY: the quantized GEMVs' early weight loads (default 0; cuda_quant.cu) */
    /* attention kernel switches (cuda.h: ns_cuda_set_attn_sm90,
     * ns_cuda_set_attn_dec_mma): 1 + the switch value once set, 0 = not
     * set yet (the env var decides at first use); see cu_attn_switch */
    int attn_sm90;    /* Hopper prefill attention (cuda_attn_sm90.cu) where usable */
    int attn_sm90_cc; /* 0 = not checked yet, 1 = this device runs the sm_90a kernel, 2 = it does not */
    int attn_dec_mma; /* decode attention on tensor cores (GQA group as the MMA N dimension) */
    int attn_dec_load; /* how the tensor-core decode kernel copies K/V tiles (ns_cuda_set_attn_dec_load) */
    int attn_dec_cc9;  /* 0 = not checked yet, 1 = compute capability >= 9.0 (cp.async.bulk), 2 = below */
    /* the Hopper prefill's TMA tensor map over the KV pool (an opaque
     * 128-byte CUtensorMap), valid for (attn_tmap_kv, attn_tmap_bytes) */
    uint64_t attn_tmap[16];
    const void *attn_tmap_kv;
    size_t attn_tmap_bytes;
    int attn_tmap_ok;
    /* the FP8 register-tile decode's tensor map over the pool's codes
     * (cuda_attn_fp8_reg.cu), valid for (kv, pages, page bytes, rows) */
    uint64_t attn_tmap8[16];
    const void *attn_tmap8_kv;
    int32_t attn_tmap8_pages;
    size_t attn_tmap8_page_bytes, attn_tmap8_rows;
    int attn_tmap8_ok;
    int fp8r_ctas; /* its CTAs per SM (occupancy; 0 = not asked yet) */
    /* its split choice (choose_fp8r_splits): NS_CUDA_FP8R_CTAS, CTAs per SM
     * aimed at (0: the occupancy); NS_CUDA_FP8R_TILES, fewest 64-key tiles
     * per split; NS_CUDA_FP8R_MIN_LEN, the length below which batches under
     * 4 keep the older kernels */
    int fp8r_ctas_aim, fp8r_tiles, fp8r_min_len;
    int early_loads; /* decode tapes: small kernels read constants and metadata before the PDL wait */
    bool tape_early; /* run_tape: this tape's norm weights / RoPE frequencies are written by none of its ops */
    int tape_early_mask; /* run_tape: the CU_EARLY_* kernels that read before their PDL wait in this tape (cu_early) */
    int early_mask;  /* NS_CUDA_EARLY_MASK (default all): which small kernels take early loads (CU_EARLY_*) */
    uintptr_t *wr;   /* run_tape scratch: written ranges [lo, hi) pairs */
    int32_t cap_wr;
    size_t l2_bytes;
    int64_t stat_replays, stat_captures, stat_eager;
    /* step memo (backend.h memo_save / memo_replay): the op tape of the
     * last recorded decode step, valid while `generation` is unchanged */
    cu_op *memo;
    int32_t n_memo;
    size_t cap_memo;
    uint64_t memo_id, memo_generation;
    bool memo_valid;
    int memo_enabled; /* NS_CUDA_MEMO (default 1) */
    int64_t stat_memo;
    /* The memo's direct launch (flush): a replayed memo is not copied into
     * the tape (memo_pending: the tape is logically memo + tape). When the
     * last flush of the memo's ops (+ the ops recorded after them, the
     * tail: the step's argmax) launched graph memo_g, the next replay
     * with the same tail and launch shape launches it again without the
     * copy, the hash and the compare of a ~90 KB tape, host time that the
     * GPU idles through between two decode steps (docs/cuda.md v32). */
    bool memo_pending, memo_in_tape;
    cu_graph_entry *memo_g; /* NULL: no link */
    uint64_t memo_g_serial;
    int32_t memo_g_shape[10];
    int32_t memo_g_tail_n;
    cu_op memo_g_tail[4];
    uint64_t graph_serial;
    int64_t stat_memo_direct;

    /* mixture of experts (cuda_moe.cu): device tables of expert weight
     * pointers (kept until destroy: graphs bake them) and the scratch */
    struct cu_moe_table *moe_tables;
    int32_t n_moe_tables, cap_moe_tables;
    void *moe_ws;
    size_t moe_ws_bytes;
    int moe_fuse; /* CU_SW_*: decode router + top-k in one launch (NS_CUDA_MOE_FUSE=0: off) */
    int moe_ggemv; /* CU_SW_*: grouped GEMVs for a few rows per expert (NS_CUDA_MOE_GGEMV=1; default: 16-row tiles) */
    int moe_qggemv; /* CU_SW_*: quantized experts, a few rows per expert: grouped GEMVs on the blocks (NS_CUDA_MOE_QGGEMV=0: bf16 copies + tiles) */

    /* quantized weights (cuda_quant.cu): activation and dequantization
     * scratch, created by the first quantized weight's upload */
    struct cu_quant *quant;

    /* FP8 KV pages (cuda_attn_fp8.cu): the prefill path's bf16 copy of a
     * layer and its remap tables, created by the first FP8 prefill */
    struct cu_kv_fp8 *kv_fp8;

    /* options */
    int gemv_max; /* use the GEMV kernel for n <= gemv_max */
    int gemv_warps; /* split K until the GEMV has this many warps per SM */

    /* profiling (eager only): events around each op, resolved at sync */
    int profiling;
    cudaEvent_t *prof_ev;
    int32_t *prof_label_of; /* label index per event pair */
    int n_prof_ev;
    cu_prof_label prof[CU_PROF_LABELS];
    int n_prof;
} cu_impl;

/* ------------------------------------------------------------ helpers */

/* Records the first error; returns true if e is a failure. */
bool cu_check(cu_impl *c, cudaError_t e, const char *what);
bool cu_check_blas(cu_impl *c, cublasStatus_t s, const char *what);
/* Records a sticky error (the first one wins). */
void cu_set_error(cu_impl *c, ns_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Checks the launch that just happened. */
#define CU_LAUNCHED(c, what) cu_check((c), cudaGetLastError(), (what))

/* Shadow bookkeeping (host side, in enqueue order). */
cu_shadow *cu_shadow_for(cu_impl *c, const void *base);
/* The shadow a producer should write for output view t, or NULL; marks
 * it valid for t's shape. Invalidates overlapping shadows otherwise. */
bf16 *cu_shadow_produce(cu_impl *c, const ns_tensor *t);
/* Call after writing t without writing a shadow. */
void cu_note_write(cu_impl *c, const ns_tensor *t);
void cu_shadow_invalidate_all(cu_impl *c);
/* Memory a captured graph may reference moved: drop all graphs. */
void cu_bump_generation(cu_impl *c);
/* The backend's state (cuda_backend.cu). */
cu_impl *cu_impl_of(ns_backend *be);
/* Runs what the tape holds (cuda_backend.cu): eagerly, captured or replayed. */
void cu_flush(ns_backend *be);
/* The sticky error as a status (NS_OK when none), copied into err. */
ns_status cu_report(cu_impl *c, ns_error *err);

/* The step's batch (cuda_batch.cu): checks b, uploads its metadata in one
 * copy, chooses the decode split counts and starts recording the step
 * (decode, or prefill with fusion). cu_meta_grow sizes the metadata
 * buffers for at least these counts (a growth drops every graph). */
ns_status cu_set_batch(ns_backend *be, const ns_batch *b, ns_error *err);
ns_status cu_meta_grow(ns_backend *be, int32_t need_tokens, int32_t need_seqs, int32_t need_stride,
                       int32_t need_logits, int32_t need_tiles, ns_error *err);

/* Profiling (ns_cuda_set_profiling): events around what is enqueued
 * between begin and end, summed under label; *pi is -1 when off or out
 * of events. */
void cu_prof_begin(cu_impl *c, const char *label, int *pi);
void cu_prof_end(cu_impl *c, int pi);

/* Tape fusions (cuda_tape_fuse.cu): at ops[i] of a recorded tape of n ops,
 * launch the fused kernels of a known pattern and return how many ops
 * they replace, or 0 (nothing launched: run ops[i] as it is). */
int32_t cu_tape_try_fuse(ns_backend *be, const cu_op *ops, int32_t i, int32_t n);
/* True when no op of the tape writes (as its output) any byte of a weight,
 * norm weight or RoPE frequency table that the fused decode kernels read
 * before their PDL wait. *kv_copy: whether the tape copies a KV page
 * (set on the same pass; left false when it returns early). */
bool cu_tape_weights_unwritten(cu_impl *c, const cu_op *ops, int32_t n, bool *kv_copy);
/* Whether the F32 values of t are never read from ops[from] on: the ops
 * after it leave t alone, or read it only as the input of a cuBLASLt GEMM
 * through t's bf16 shadow (the same view; only with shadow_ok), until an
 * op overwrites all of t without reading it. False when the tape ends
 * first (what a step leaves behind may be read after it) and for any op
 * whose reads it does not know. */
bool cu_tape_f32_dead(cu_impl *c, const cu_op *ops, int32_t from, int32_t n, const ns_tensor *t, bool shadow_ok);
/* The producers' question: prefill_lean bit 1 is on, the tape is a
 * prefill's, and t (written with a shadow) is dead from ops[from] on. */
bool cu_prefill_out_dead(cu_impl *c, const cu_op *ops, int32_t from, int32_t n, const ns_tensor *t);

/* ------------------------------------------------------------ kernels */

/* Programmatic dependent launch (Hopper): every kernel of this backend
 * starts with PDL_ENTRY. It lets the next kernel in the stream be launched
 * right away (its CTAs are placed as SMs free up, so launch latency and
 * the previous kernel's tail overlap) and then waits until the previous
 * grid has completed and its memory is visible, before any global access.
 * Without the launch attribute both instructions are no-ops. In recorded
 * decode tapes the small kernels (add+RMSNorm, q/k-norm+RoPE+KV store,
 * decode attention) split it: trigger, read constants and batch metadata
 * (never written by an earlier kernel of the tape), then wait. */
#define PDL_ENTRY() asm volatile("griddepcontrol.launch_dependents;\n\tgriddepcontrol.wait;\n" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")

/* Weights the next GEMV will stream, prefetched into L2 by a latency-bound
 * kernel that runs before it: the kernel gets CU_PF_BLOCKS extra CTAs
 * that issue per-line prefetches (no completion is tracked, so they exit
 * at once) before their PDL wait -- weights never depend on earlier
 * kernels. Turns HBM idle time during small kernels and kernel boundaries
 * into useful transfer. The amount is what that idle time moves (c->
 * prefetch, 4 MB, ~1 us of HBM): up to 2/3 of L2 per kernel overran into
 * the GEMV and competed with its streams (docs/cuda.md v7, v21). (A bulk
 * prefetch from one CTA was tried first: it ran at ~0.2 TB/s and held the
 * kernel; see docs/cuda.md.) */
#define CU_PF_BLOCKS 64
typedef struct cu_prefetch {
    const void *p[3];
    uint32_t bytes[3];
} cu_prefetch;

static inline bool cu_pf_any(const cu_prefetch *pf) { return pf && (pf->bytes[0] | pf->bytes[1] | pf->bytes[2]); }

/* Loads of activations (what an earlier kernel of the stream wrote) in the
 * decode kernels. With programmatic dependent launch a kernel runs while
 * the kernel before it is still writing, which ld.global.nc (__ldg, and
 * what const __restrict__ pointers compile to) does not allow: the
 * read-only path need not see those stores even after the PDL wait
 * (cuda_quant.cu's early-load defect was this). nc = 0 reads through
 * ld.global.cg (L2, coherent) instead: NS_CUDA_ACT_NC=0 (c->act_nc picks
 * the kernel instance); 1 (default) keeps the .nc loads of earlier
 * versions until measured. */
template <bool NC>
__device__ __forceinline__ float4 cu_ld_act4(const float *p) {
    if constexpr (NC) return __ldg(reinterpret_cast<const float4 *>(p));
    float4 r;
    /* volatile: stays after the PDL wait (itself volatile asm) */
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
    return r;
}
template <bool NC>
__device__ __forceinline__ float cu_ld_act(const float *p) {
    if constexpr (NC) return __ldg(p);
    float r;
    asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(r) : "l"(p));
    return r;
}

/* Four floats rounded to bf16 (round to nearest even) and stored as one
 * 8-byte write at dst (8-byte aligned): the bf16 shadow rows the norm
 * kernels write beside their f32 output. */
__device__ __forceinline__ void cu_store_bf16x4(bf16 *dst, float4 v) {
    __nv_bfloat162 p0 = __floats2bfloat162_rn(v.x, v.y), p1 = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&p0);
    u.y = *reinterpret_cast<uint32_t *>(&p1);
    *reinterpret_cast<uint2 *>(dst) = u;
}

/* 16 bytes of a weight row, streamed: read once, not kept in L1. */
__device__ __forceinline__ uint4 cu_ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* The dot product of 8 BF16 weights (w, little-endian pairs) with 8 F32
 * values a (the first 4) and b (the next 4), in that order, fp32 fused
 * multiply-adds from 0: the GEMVs' inner step (cuda_gemm.cu,
 * cuda_gemv_bulk.cu, cuda_moe.cu, cuda_mlp.cu). */
__device__ __forceinline__ float cu_dot8(uint4 w, float4 a, float4 b) {
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

/* Sum of v over the 32 lanes of a warp; every lane gets it. */
__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024)
 * through part (__shared__ float[32]); every thread gets it. Contains
 * __syncthreads: all threads of the block must call it. */
__device__ __forceinline__ float cu_block_sum(float v, float *part) {
    v = cu_warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
        t = cu_warp_sum(t);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return part[0];
}

/* TMA: the box at (x, y) of a 2-D tensor map m (a CUtensorMap in param,
 * const or global memory) into shared memory at dst, completing on the
 * mbarrier bar (its bytes count against the expected tx). Compute
 * capability 9.0; the callers select it only there. */
__device__ __forceinline__ void cu_tma_2d(uint32_t dst, const void *m, int x, int y, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(bar)
        : "memory");
#else
    (void)dst, (void)m, (void)x, (void)y, (void)bar;
    __trap();
#endif
}

/* Called by prefetch CTA number pb (0..CU_PF_BLOCKS-1). */
__device__ __forceinline__ void l2_prefetch(const cu_prefetch &pf, int pb) {
    const size_t stride = (size_t)CU_PF_BLOCKS * blockDim.x * 128;
#pragma unroll
    for (int sgi = 0; sgi < 3; sgi++) {
        const char *base = (const char *)pf.p[sgi];
        for (size_t off = ((size_t)pb * blockDim.x + threadIdx.x) * 128; off < pf.bytes[sgi]; off += stride)
            asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + off));
    }
}

/* Which small kernels read constants before their PDL wait when the tape
 * allows it (c->tape_early): a bisection switch for the early-load fault
 * (docs/cuda.md v17, v18), NS_CUDA_EARLY_MASK, all by default.
 * CU_EARLY_ATTN_KV (with CU_EARLY_ATTN): the bf16 tensor-core decode also
 * copies the first K/V tiles of splits that end before the new token
 * (docs/cuda.md v25); never in a tape that copies a KV page. run_tape
 * resolves the mask once per tape (c->tape_early_mask). */
enum { CU_EARLY_ADDNORM = 1, CU_EARLY_QKNORM = 2, CU_EARLY_ATTN = 4, CU_EARLY_ATTN_KV = 8 };
static inline int cu_early(const cu_impl *c, int kernel) { return (c->tape_early_mask & kernel) ? 1 : 0; }

/* Launches kernel on c->stream (with the PDL attribute when c->pdl) and
 * records a launch failure. */
template <typename... KArgs, typename... Args>
static inline void cu_launch(cu_impl *c, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    /* pdl_anchor: the stream's last operation is a copy (set_batch's
     * metadata, an upload, a KV page copy): this launch fully waits for it,
     * so no kernel of the PDL chain that follows can start -- and read
     * before its wait -- ahead of the copy. */
    /* pdl_gemv == 0: a GEMV after a GEMV waits for it fully; with PDL its
     * CTAs become resident during the first one's last wave and spin at
     * their wait (measured in docs/cuda.md v18) */
    const bool gemv_after_gemv = !c->pdl_gemv && c->gemv_next && c->gemv_prev;
    cfg.numAttrs = c->pdl && !c->pdl_anchor && !gemv_after_gemv ? 1 : 0;
    c->pdl_anchor = false;
    c->gemv_prev = c->gemv_next;
    c->gemv_next = false;
    cu_check(c, cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...), "kernel launch");
}

/* All launchers enqueue on c->stream and check the launch. */
/* Exactly the CPU backend's hash_uniform(seed, i) * scale; with round_bf
 * an F32 destination keeps the bf16-rounded value. */
void cu_launch_fill_random(cu_impl *c, bf16 *dst_bf, float *dst_f, size_t n, uint64_t seed, float scale,
                           bool round_bf);
void cu_launch_f32_to_bf16(cu_impl *c, bf16 *dst, const float *src, size_t n);
void cu_launch_bf16_to_f32(cu_impl *c, float *dst, const bf16 *src, size_t n);
void cu_launch_embed(cu_impl *c, float *out, const ns_tensor *table, int n_tokens, int dim);
/* rmsnorm, swiglu (and add_rmsnorm below): out NULL writes only the bf16
 * shadow out_bf (an F32 output cu_tape_f32_dead proved unread) */
void cu_launch_rmsnorm(cu_impl *c, float *out, bf16 *out_bf, const float *in, const float *w, int64_t rows, int cols,
                       float eps);
void cu_launch_rope(cu_impl *c, float *x, int n_tokens, int n_heads, int head_dim, int row_stride,
                    const float *inv_freq);
void cu_launch_swiglu(cu_impl *c, float *out, bf16 *out_bf, const float *gate, const float *up, int64_t n);
void cu_launch_add(cu_impl *c, float *out, const float *x, int64_t n);
void cu_launch_kv_store(cu_impl *c, const ns_kv_layout *l, int layer, const float *k, const float *v, int n_tokens,
                        int k_stride, int v_stride);
void cu_launch_gather(cu_impl *c, float *out, bf16 *out_bf, const float *in, int n_rows, int cols, int in_stride);
void cu_launch_argmax(cu_impl *c, int32_t *out, const float *logits, int n_rows, int cols, int stride);
void cu_launch_kv_copy(cu_impl *c, const ns_kv_layout *l, int dst_page, int src_page, int n_slots);

/* attention: out/out_bf [T, H*D], q [T, H*D] */
void cu_attention(cu_impl *c, const ns_kv_layout *l, float *out, bf16 *out_bf, const float *q, int layer,
                  int n_heads, float scale);
/* Hopper prefill attention (cuda_attn_sm90.cu): head dim 128, even GQA
 * ratio, compute capability 9.0. Same semantics as cu_attention's
 * prefill tiles (set_batch's 64-row tile list). */
typedef struct cu_sm90_params {
    const float *q;
    float *out;
    bf16 *out_bf;
    const uint8_t *kv;
    size_t page_bytes;
    size_t k_off, v_off; /* bytes from a page's start to (layer, K|V, head 0, slot 0) */
    size_t head_bytes;   /* P * D * 2 */
    size_t kv_bytes;     /* bytes addressable from kv (the pool): bounds of the TMA variants' tensor map */
    const int32_t *seq_start, *seq_len, *page_table, *tiles;
    int pt_stride, P, P_shift, H, G, q_stride;
    float scale_log2;
} cu_sm90_params;
/* The driver's cuTensorMapEncodeTiled (fetched once through the runtime,
 * so nothing links -lcuda), or NULL where the driver lacks it. */
PFN_cuTensorMapEncodeTiled_v12000 cu_tmap_encoder(void);
/* The pool [kv, kv + kv_bytes) as a TMA tensor map (rows of 128 bf16,
 * boxes of 64 x P, 128-byte swizzle; cached per pool in cu_impl), shared
 * by the Hopper prefill and the decode's copy mode 4: false where a box
 * cannot express the pages (P not a multiple of 8 dividing 128, offsets
 * or sizes not multiples of 256 bytes) or the driver has no encoder. */
bool cu_attn_kv_tmap(cu_impl *c, const uint8_t *kv, size_t kv_bytes, size_t page_bytes, size_t head_bytes, size_t k_off,
                     size_t v_off, int P, uint64_t out[16]);
/* Whether the Hopper kernel runs here for this shape (and the switch is
 * on); the first call checks the device and sets the kernel's smem limit. */
bool cu_attn_sm90_usable(cu_impl *c, int head_dim, int G);
/* Tri-state feature switch (also used outside attention, e.g. cuda_moe.cu):
 * not set yet (env decides at first use), on, off. */
enum { CU_SW_UNSET = 0, CU_SW_ON = 1, CU_SW_OFF = 2 };
/* The value of an attention kernel switch (0 = off): once set, *field
 * holds 1 + the value; unset, env var `env` gives it (absent or outside
 * [0, max]: def). Values: Hopper prefill 0 off / 1..15 variants (cuda.h),
 * decode 0 off / 1 auto / 2 always, decode copy mode 0..4 (cuda.h). */
int cu_attn_switch(int *field, const char *env, int max, int def);
#define CU_ATTN_SM90_MAX 15
/* defaults, the fastest measured: the TMA producer with pipelined
 * consumers (variant 13; docs/cuda.md v25: with 64-token pages it beats
 * variant 8, the default from v16 to v24, by 3% at 32k and 6% on a 100k
 * prompt; with 16-token pages the producer bounded both); whole pages by
 * TMA in decode (v20: 32k batch 8 15.17 against 16.46 ms/step with one
 * bulk copy per K/V row) */
#define CU_ATTN_SM90_DEFAULT 13
#define CU_ATTN_DEC_LOAD_DEFAULT 4
#define CU_ATTN_DEC_MMA_MAX 2
#define CU_ATTN_DEC_LOAD_MAX 4
/* grid (G / 2, n_tiles, KVH); returns false on a launch error (recorded). */
bool cu_attn_prefill_sm90(cu_impl *c, const cu_sm90_params *p, int n_tiles);
/* GEMV over up to 3 weight matrices sharing the F32 input x [n, k]:
 * out[i][n, m[i]] = x @ w[i]^T. */
void cu_gemv_multi(cu_impl *c, int nseg, float *const *out, const bf16 *const *w, const int64_t *m, const float *x,
                   int n, int k);
/* cuda_gemv_bulk.cu: the batch 1-2 GEMV fed by bulk copies. init sets
 * its kernels' shared-memory limit (or turns it off below compute
 * capability 9.0); cu_gemv_bulk launches it and returns true, or returns
 * false without launching anything when the shape is not one it takes.
 * sw_out: SwiGLU epilogue (nseg 2 = gate, up), as cu_gemv_swiglu. */
bool cu_gemv_bulk_init(cu_impl *c);
bool cu_gemv_bulk(cu_impl *c, int nseg, float *const *out, const bf16 *const *w, const int64_t *m, const float *x,
                  int n, int k, float *sw_out, bf16 *sw_bf);
/* Whether the byte ranges of two tensors overlap (the tape patterns'
 * aliasing checks: cuda_decode.cu, cuda_tape_fuse.cu). */
static inline bool cu_tensors_overlap(const ns_tensor *a, const ns_tensor *b) {
    const uintptr_t a0 = (uintptr_t)a->data, a1 = a0 + ns_tensor_bytes(a);
    const uintptr_t b0 = (uintptr_t)b->data, b1 = b0 + ns_tensor_bytes(b);
    return a0 < b1 && b0 < a1;
}
/* The split-K factor (1, 2 or 4) k_gemv uses for `pairs` row pairs of
 * length k (cuda_gemm.cu); cuda_mlp.cu splits the same way so that its
 * sums are bit-identical. */
int cu_gemv_ks(const cu_impl *c, int64_t pairs, int k);
/* cuda_mlp.cu: the dense MLP block of a batch 1-2 decode step in one
 * persistent kernel, bit-identical to gate/up+SwiGLU then down by k_gemv;
 * optionally with the residual add, the next layer's RMSNorm and its
 * q/k/v GEMVs (the tail), bit-identical to k_add_rmsnorm and k_gemv.
 * init: occupancy of its instances and the barrier word (false: no
 * memory); cu_mlp_fits: it is on and takes this shape; cu_mlp_decode
 * launches it (only after cu_mlp_fits said yes). */
typedef struct cu_mlp_shape {
    const float *x;           /* [n, k] */
    const bf16 *wg, *wu, *wd; /* [m, k], [m, k], [h, m] */
    float *gate, *up, *s;     /* [n, m]; s = silu(gate) * up, may alias gate */
    bf16 *s_bf;               /* s's bf16 shadow or NULL */
    float *d;                 /* [n, h]; may alias x, not s */
    int n;
    int64_t k, m, h;
    /* the tail (qkv_n 1-3; 0: none): res += d; xn = rmsnorm(res) * norm_w
     * (bf16 shadow xn_bf or NULL; xn is d's buffer or apart from
     * everything else); qkv_out[j] = xn qkv_w[j]^T ([qkv_m[j], h]) */
    int qkv_n;
    float *res, *xn;
    bf16 *xn_bf;
    const float *norm_w;
    float eps;
    const bf16 *qkv_w[3];
    float *qkv_out[3];
    int64_t qkv_m[3];
} cu_mlp_shape;
bool cu_mlp_init(cu_impl *c);
void cu_mlp_free(cu_impl *c);
bool cu_mlp_fits(const cu_impl *c, const cu_mlp_shape *s);
/* The probe's launches since the last call (their stamps relative to each
 * launch's first start, averaged: ph_us[i] = {min, median, max} over the
 * CTAs of stamp i: 0 start, 1 gate/up done, 2 barrier passed, 3 down
 * done), and *span_us the mean first start -> last end; clears the
 * stamps. 0 when the probe is off or nothing complete was recorded. */
int64_t cu_mlp_probe_read(cu_impl *c, double ph_us[4][3], double *span_us);
void cu_mlp_decode(cu_impl *c, const cu_mlp_shape *s);
/* gate/up GEMV with the SwiGLU epilogue: gate = x Wg^T, up = x Wu^T,
 * out = silu(gate) * up (out may alias gate); out_bf optional shadow. */
void cu_gemv_swiglu(cu_impl *c, float *gate, float *up, float *out, bf16 *out_bf, const bf16 *wg, const bf16 *wu,
                    int64_t m, const float *x, int n, int k);
/* Decode GEMVs with a neighbouring row op folded in (cuda_gemm.cu; the
 * tape patterns are matched in cuda_decode.cu, switch NS_CUDA_DEC_FUSE):
 * norm_w set: x is the residual [n, k], the input is rmsnorm(x) * norm_w
 * (equal to the unfused RMSNorm up to float rounding: the sums are
 * scaled by 1/rms at the end), also written to xn [n, k];
 * swiglu: 2 segments gate/up, sw_out = silu(gate) * up (+ bf16 shadow);
 * res set (1 segment): res += out, after out is written. n is 1 or 2.
 * Returns false on an unsupported shape or launch error (recorded). */
typedef struct cu_gemv_dec_args {
    int nseg;
    float *out[3];
    const bf16 *w[3];
    int64_t m[3];
    const float *x;
    int n;
    int64_t k;
    const float *norm_w;
    float *xn;
    float eps;
    bool swiglu;
    float *sw_out;
    bf16 *sw_out_bf;
    bool add_res;
    float *res;
    bool early; /* first weight loads before the PDL wait (set by cu_dec_run) */
} cu_gemv_dec_args;
bool cu_gemv_dec(cu_impl *c, const cu_gemv_dec_args *g);
/* The tape matcher for them: when ops[i..] is one of the patterns
 * (rmsnorm + 1-3 GEMVs sharing its output; rmsnorm + gate/up GEMVs +
 * swiglu; GEMV + the residual add of its output), fills *g and *label and
 * returns the number of ops it covers, else 0. Nothing is launched. */
int32_t cu_dec_match(const cu_impl *c, const cu_op *ops, int32_t i, int32_t n, cu_gemv_dec_args *g,
                     const char **label);
/* Launches a matched pattern and does the shadow bookkeeping of its
 * outputs (ops, i: as given to cu_dec_match). */
void cu_dec_run(cu_impl *c, const cu_op *ops, int32_t i, int32_t used, const cu_gemv_dec_args *g);
/* fused decode kernels (cuda_fused.cu) */
void cu_launch_qk_norm_rope_store(cu_impl *c, const ns_kv_layout *l, int layer, float *q, float *k, const float *v,
                                  int n_tokens, int n_heads, const float *q_norm, const float *k_norm, float eps,
                                  const float *inv_freq, const cu_prefetch *pf);
void cu_launch_add_rmsnorm(cu_impl *c, float *x, const float *y, float *out, bf16 *out_bf, const float *w,
                           int64_t rows, int cols, float eps, const cu_prefetch *pf);
/* x += y over all rows; out row i = rmsnorm(x[logit_rows[i]]) * w for
 * i < n_out (the step's add, gather_rows and final norm, bit-identical) */
void cu_launch_add_gather_rmsnorm(cu_impl *c, float *x, const float *y, float *out, bf16 *out_bf, const float *w,
                                  int64_t rows, int cols, float eps, int n_out, const cu_prefetch *pf);
/* x = table[tokens] (bf16 or f32 table); out = rmsnorm(x) * w: the step's
 * embed and first norm, bit-identical */
void cu_launch_embed_rmsnorm(cu_impl *c, float *x, const ns_tensor *table, float *out, bf16 *out_bf, const float *w,
                             int64_t rows, int cols, float eps, const cu_prefetch *pf);
/* projection bias (cuda_moe.cu): out[r, :] += b[:] for rows x cols */
void cu_launch_add_bias(cu_impl *c, float *out, const float *b, int64_t rows, int cols);
/* mixture of experts (cuda_moe.cu). cu_moe_prepare runs when the op is
 * submitted (never under capture): checks shapes and dtypes, builds the
 * device table of the experts' pointers on first sight and reserves the
 * scratch; returns the table index for the op, or -1 (error recorded, or
 * nothing to do for 0 tokens). cu_exec_moe runs a recorded OP_MOE. */
int32_t cu_moe_prepare(cu_impl *c, const ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                       const ns_tensor *experts, int n_experts, int top_k);
void cu_exec_moe(cu_impl *c, const cu_op *op);
/* Frees the tables and the scratch (backend destroy). */
void cu_moe_free(cu_impl *c);
/* matmul: out[n,m] = in[n,k] @ w[m,k]^T with w BF16 and in given as BF16 */
void cu_gemm(cu_impl *c, float *out, const bf16 *in_bf, const float *in_f32, const bf16 *w, int64_t n, int64_t m,
             int64_t k);
/* out[n,m] += in_bf[n,k] @ w[m,k]^T (cuBLASLt, beta 1) */
void cu_gemm_acc(cu_impl *c, float *out, const bf16 *in_bf, const bf16 *w, int64_t n, int64_t m, int64_t k);
/* The matmul op (cuda_backend.cu): checks, the input's bf16 shadow or a
 * conversion, then the GEMV, cuBLASLt or quantized path. accumulate: out
 * += product (bf16 weights, more rows than the GEMV path takes; the
 * residual pattern of cuda_tape_fuse.cu). */
void cu_matmul_op(cu_impl *c, const ns_tensor *out, const ns_tensor *in, const ns_tensor *w, bool accumulate);

/* ---- quantized weights (cuda_quant.cu) ----
 * Weights of a GGUF block type (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K)
 * hold the file's bytes,
 * rearranged at upload (layout in cuda_quant.cu). Products with n <=
 * CU_QGEMV_MAX input rows run a GEMV on the blocks; larger n dequantize
 * the weight into a bf16 scratch and use cuBLASLt (in_bf required). */
#define CU_QGEMV_MAX 8
/* Whether the quantized kernels take type dt at all. */
bool cu_quant_type_ok(ns_dtype dt);
/* Whether rows x cols is a shape the quantized kernels take. */
bool cu_quant_check_shape(ns_dtype dt, int64_t rows, int64_t cols);
/* t allocated with its quantized dtype: ggml blocks at src -> device;
 * also sizes the scratch. False on error (recorded in c). */
bool cu_quant_upload(cu_impl *c, ns_tensor *t, const void *src);
/* Random blocks (dummy weights), |value| about <= scale. */
bool cu_quant_random(cu_impl *c, ns_tensor *t, uint64_t seed, float scale);
void cu_quant_free(cu_impl *c);
size_t cu_quant_scratch_bytes(const cu_impl *c);
void cu_quant_matmul(cu_impl *c, float *out, const float *in, const bf16 *in_bf, const ns_tensor *w, int64_t n);
/* Up to 3 quantized weights of one type and k sharing the input x [n, k]. */
void cu_quant_gemv_multi(cu_impl *c, int nseg, float *const *out, const ns_tensor *const *w, const float *x, int n,
                         int k);
void cu_quant_gemv_swiglu(cu_impl *c, float *gate, float *up, float *out, bf16 *out_bf, const ns_tensor *wg,
                          const ns_tensor *wu, const float *x, int n, int k);
void cu_quant_embed(cu_impl *c, float *out, const ns_tensor *table, int n_tokens);
/* Quantized MoE experts (cuda_quant.cu's kernels for cuda_moe.cu, which
 * fills this in and owns every buffer it names). */
typedef struct cu_qmoe {
    const void *const *tab; /* device [3E] expert base pointers: gate, up, down */
    ns_dtype dt[3];         /* gate, up (the same), down types */
    int E, K, H, F;
    int8_t *xq;             /* quantized activation scratch, max(Tc H, Tc K F) values */
    float *xd, *xs;         /* its per-32 scales and per-16 scaled sums */
} cu_qmoe;
/* Decode (Tc <= CU_MOE_GEMV_MAX tokens): quantizes x [Tc, H], gathered
 * gate/up GEMV with SwiGLU into h [Tc K, F], quantizes h, gathered down
 * GEMV into y [Tc K, H] (combined by the caller). False on a launch error. */
bool cu_quant_moe_gemv(cu_impl *c, const cu_qmoe &m, const float *x, int Tc, const int32_t *ids, float *h, float *y);
/* Batched decode: the TK slots' rows of x gathered in sorted order
 * (rows[p] = slot, offs the experts' segments) and quantized, grouped
 * gate/up GEMVs on each chosen expert's blocks into h [TK, F] (sorted),
 * h quantized, grouped down GEMVs into y [TK, H] (sorted; the combine
 * reads it through pos). xq must hold TK + 4 rows of max(H, F). */
bool cu_quant_moe_grouped(cu_impl *c, const cu_qmoe &m, const float *x, int TK, const int32_t *rows,
                          const int32_t *offs, float *h, float *y);
/* Grouped path: every expert with counts[e] > 0 dequantized to bf16 into
 * deq ([3][E][F H]) and bftab[3E] pointed at the copies (all of them). */
bool cu_quant_moe_dequant(cu_impl *c, const cu_qmoe &m, const int32_t *counts, bf16 *deq, const bf16 **bftab);

#endif
