/* cuda_backend.cu — the CUDA backend: memory, per-step metadata, the op
 * vtable, sampling and CUDA-graph capture/replay of decode steps.
 *
 * Execution model. Ops are enqueued on one stream. For a step whose batch
 * is pure decode (one new token per sequence), ops are not launched at
 * once but recorded on a tape (cu_op copies of the arguments); at the next
 * sync point (sample, download, sync, page read/write, next set_batch) the
 * tape is executed: eagerly the first time a tape is seen, captured into a
 * CUDA graph the second time, and replayed from that graph afterwards.
 * Tapes are matched by a hash plus a full comparison of the recorded
 * arguments and of the batch shape, so a replay is only ever used for a
 * step that would have launched exactly the same kernels with the same
 * arguments; everything a kernel reads that changes between such steps
 * (tokens, positions, page tables, lengths) lives in the fixed metadata
 * buffers that set_batch refreshes with one async copy per region before
 * the step. The engine needs no changes for this. Other steps (prefill
 * chunks, mixed batches) are recorded too while fusion and
 * NS_CUDA_PREFILL_FUSE are on, but only for the fusions: their tape runs
 * eagerly at the sync point and is never hashed or captured (their launch
 * shapes differ from step to step). While a tape runs,
 * the engine's fixed op sequences are executed by fused kernels
 * (try_fuse: grouped GEMVs, GEMV+SwiGLU, q/k-norm+RoPE+KV store,
 * add+RMSNorm), bit-identical to the unfused ops.
 *
 * Invariants
 * - A captured graph bakes device addresses: any free or reallocation of
 *   memory a graph may reference bumps `generation` and drops all graphs.
 * - No allocation happens while capturing; an op that would need one marks
 *   the capture failed and the tape runs eagerly instead.
 * - Errors are sticky (cu_impl.err_status) and surface at sync points.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

extern "C" {
#include "sample/sample.h"
#include "util/vec.h"
}

static inline cu_impl *IMPL(ns_backend *be) { return (cu_impl *)be->impl; }

/* ================================================================ errors */

/* The first error sticks until reported. */
static void set_error_v(cu_impl *c, ns_status st, const char *fmt, va_list ap) {
    if (c->err_status != NS_OK) return;
    c->err_status = st;
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
}

__attribute__((format(printf, 3, 4))) static void set_error(cu_impl *c, ns_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(c, st, fmt, ap);
    va_end(ap);
}

void cu_set_error(cu_impl *c, ns_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error_v(c, st, fmt, ap);
    va_end(ap);
}

/* A failed CUDA or cuBLAS call; returns true. A failure under capture
 * (unsupported call, invalidated capture) is not an error of the step: it
 * only fails the capture, and the tape is re-run eagerly, which reports any
 * real problem. */
__attribute__((format(printf, 2, 3))) static bool call_failed(cu_impl *c, const char *fmt, ...) {
    if (c->capturing) {
        c->capture_failed = true;
        return true;
    }
    va_list ap;
    va_start(ap, fmt);
    set_error_v(c, NS_ERR_INTERNAL, fmt, ap);
    va_end(ap);
    return true;
}

bool cu_check(cu_impl *c, cudaError_t e, const char *what) {
    return e != cudaSuccess && call_failed(c, "cuda: %s: %s", what, cudaGetErrorString(e));
}

bool cu_check_blas(cu_impl *c, cublasStatus_t s, const char *what) {
    return s != CUBLAS_STATUS_SUCCESS && call_failed(c, "cublas: %s: status %d", what, (int)s);
}

/* Reports (and keeps) the sticky error. */
ns_status cu_report(cu_impl *c, ns_error *err) {
    if (c->err_status == NS_OK) return NS_OK;
    return ns_fail(err, c->err_status, "%s", c->err_msg);
}

/* ============================================================== shadows */

cu_shadow *cu_shadow_for(cu_impl *c, const void *base) {
    for (int i = 0; i < c->n_shadows; i++)
        if (c->shadows[i].base == base) return &c->shadows[i];
    return NULL;
}

void cu_note_write(cu_impl *c, const ns_tensor *t) {
    const uint8_t *lo = (const uint8_t *)t->data, *hi = lo + ns_tensor_bytes(t);
    for (int i = 0; i < c->n_shadows; i++) {
        cu_shadow *s = &c->shadows[i];
        const uint8_t *b = (const uint8_t *)s->base;
        if (lo < b + s->bytes && b < hi) s->valid = false;
    }
}

bf16 *cu_shadow_produce(cu_impl *c, const ns_tensor *t) {
    cu_shadow *s = cu_shadow_for(c, t->data);
    if (s && s->bf && ns_tensor_bytes(t) <= s->bytes) {
        s->valid = true;
        s->vrows = t->rows;
        s->vcols = t->cols;
        return s->bf;
    }
    cu_note_write(c, t);
    return NULL;
}

void cu_shadow_invalidate_all(cu_impl *c) {
    for (int i = 0; i < c->n_shadows; i++) c->shadows[i].valid = false;
}

static ns_status shadow_register(cu_impl *c, void *base, size_t bytes, ns_error *err) {
    if (NS_VEC_GROW(c->shadows, c->cap_shadows, (size_t)c->n_shadows + 1, INT32_MAX) != NS_OK)
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    cu_shadow *s = &c->shadows[c->n_shadows++];
    memset(s, 0, sizeof *s);
    s->base = base;
    s->bytes = bytes;
    return NS_OK;
}

static void shadow_unregister(cu_impl *c, void *base) {
    for (int i = 0; i < c->n_shadows; i++) {
        if (c->shadows[i].base != base) continue;
        if (c->shadows[i].bf) cu_check(c, cudaFree(c->shadows[i].bf), "cudaFree(shadow)");
        c->shadows[i] = c->shadows[--c->n_shadows];
        return;
    }
}

/* =============================================================== graphs */

static void graph_entry_clear(cu_graph_entry *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g->ops);
    memset(g, 0, sizeof *g);
}

static void graphs_clear(cu_impl *c) {
    for (int i = 0; i < CU_MAX_GRAPHS; i++) graph_entry_clear(&c->graphs[i]);
}

/* Memory a graph may reference is about to move or disappear. */
void cu_bump_generation(cu_impl *c) {
    c->generation++;
    graphs_clear(c);
    c->memo_valid = false;
}
#define bump_generation cu_bump_generation

/* The step's launch shape: what a graph bakes besides its ops. */
static void tape_shape(const cu_impl *c, int32_t shape[10]) {
    const cu_meta *m = &c->meta;
    const int32_t s[10] = {m->n_tokens, m->n_seqs,      m->n_logits,   m->pt_stride, m->n_dec,
                           m->n_splits, m->n_tiles,     m->long_splits, m->mma_splits, m->fp8r_splits};
    memcpy(shape, s, sizeof s);
}

/* The graph cache key of the recorded step: its launch shape and its op
 * tape (~650 ops of 144 bytes, ~94 KB, for a 36-layer model). Hashed with
 * XXH3: the tape is hashed on the host between the previous step's sync
 * and this step's launch, while the GPU idles, and a byte-wise FNV-1a of
 * it took tens of microseconds of every decode step. */
static uint64_t tape_key(const cu_impl *c) {
    int32_t shape[10];
    tape_shape(c, shape);
    return XXH3_64bits_withSeed(c->tape, (size_t)c->n_tape * sizeof(cu_op), XXH3_64bits(shape, 10 * sizeof(int32_t)));
}

static cu_graph_entry *graph_find(cu_impl *c, uint64_t key) {
    for (int i = 0; i < CU_MAX_GRAPHS; i++) {
        cu_graph_entry *g = &c->graphs[i];
        if (g->ops && g->key == key && g->generation == c->generation && g->n_ops == c->n_tape &&
            memcmp(g->ops, c->tape, (size_t)c->n_tape * sizeof(cu_op)) == 0)
            return g;
    }
    return NULL;
}

static cu_graph_entry *graph_insert(cu_impl *c, uint64_t key) {
    cu_graph_entry *victim = &c->graphs[0];
    for (int i = 0; i < CU_MAX_GRAPHS; i++) {
        cu_graph_entry *g = &c->graphs[i];
        if (!g->ops) {
            victim = g;
            break;
        }
        if (g->last_use < victim->last_use) victim = g;
    }
    graph_entry_clear(victim);
    victim->ops = (cu_op *)malloc((size_t)c->n_tape * sizeof(cu_op));
    if (!victim->ops) return NULL;
    memcpy(victim->ops, c->tape, (size_t)c->n_tape * sizeof(cu_op));
    victim->n_ops = c->n_tape;
    victim->key = key;
    victim->generation = c->generation;
    victim->serial = ++c->graph_serial;
    return victim;
}

/* ============================================================ profiling */

static int prof_label(cu_impl *c, const char *name) {
    for (int i = 0; i < c->n_prof; i++)
        if (strcmp(c->prof[i].name, name) == 0) return i;
    if (c->n_prof == CU_PROF_LABELS) return CU_PROF_LABELS - 1;
    snprintf(c->prof[c->n_prof].name, sizeof c->prof[0].name, "%s", name);
    c->prof[c->n_prof].ms = 0;
    c->prof[c->n_prof].calls = 0;
    return c->n_prof++;
}

static void prof_resolve(cu_impl *c) {
    if (!c->n_prof_ev) return;
    cudaEventSynchronize(c->prof_ev[2 * c->n_prof_ev - 1]);
    for (int i = 0; i < c->n_prof_ev; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->prof_ev[2 * i], c->prof_ev[2 * i + 1]) == cudaSuccess) {
            c->prof[c->prof_label_of[i]].ms += ms;
            c->prof[c->prof_label_of[i]].calls++;
        }
    }
    (void)cudaGetLastError();
    c->n_prof_ev = 0;
}

static void op_label(const cu_op *op, char *buf, size_t n) {
    static const char *names[OP_COUNT] = {"embed", "rmsnorm", "matmul", "rope", "swiglu", "add",
                                          "kv_store", "attention", "gather_rows", "kv_page_copy", "argmax",
                                          "add_bias", "moe_ffn"};
    switch (op->kind) {
    case OP_MATMUL:
        snprintf(buf, n, "matmul %lldx%lld n%s%lld", (long long)op->c.rows, (long long)op->c.cols,
                 op->b.rows <= 8 ? "=" : ">", (long long)(op->b.rows <= 8 ? op->b.rows : 8));
        break;
    case OP_RMSNORM: snprintf(buf, n, "rmsnorm cols=%lld", (long long)op->a.cols); break;
    case OP_ATTENTION: snprintf(buf, n, "attention"); break;
    default: snprintf(buf, n, "%s", names[op->kind]); break;
    }
}

/* ============================================================ op bodies */

static bool need_f32(cu_impl *c, const ns_tensor *t, const char *op) {
    if (t->dtype == NS_DT_F32) return true;
    set_error(c, NS_ERR_INVALID, "cuda %s: expected an F32 tensor, got %s", op, ns_dtype_name((ns_dtype)t->dtype));
    return false;
}

/* Returns bf16 scratch of n elements, growing it when allowed. */
static bf16 *conv_scratch(cu_impl *c, size_t n) {
    if (n <= c->conv_elems) return c->conv;
    if (c->capturing) {
        c->capture_failed = true;
        return NULL;
    }
    size_t want = n < ((size_t)1 << 20) ? ((size_t)1 << 20) : n;
    bf16 *p = NULL;
    if (c->conv) {
        cu_check(c, cudaStreamSynchronize(c->stream), "sync");
        cu_check(c, cudaFree(c->conv), "cudaFree(conv)");
        c->conv = NULL;
        c->conv_elems = 0;
        bump_generation(c);
    }
    if (cu_check(c, cudaMalloc(&p, want * sizeof(bf16)), "cudaMalloc(conv)")) return NULL;
    c->conv = p;
    c->conv_elems = want;
    return p;
}

void cu_matmul_op(cu_impl *c, const ns_tensor *out, const ns_tensor *in, const ns_tensor *w, bool accumulate) {
    if (!need_f32(c, out, "matmul") || !need_f32(c, in, "matmul")) return;
    const bool quant = ns_dtype_is_quant((ns_dtype)w->dtype); /* GGUF blocks: cuda_quant.cu */
    if (accumulate && (quant || w->dtype != NS_DT_BF16 || in->rows <= c->gemv_max)) {
        set_error(c, NS_ERR_INTERNAL, "cuda matmul: accumulating product outside its pattern");
        return;
    }
    if (w->dtype != NS_DT_BF16 && !quant) {
        set_error(c, NS_ERR_UNSUPPORTED, "cuda matmul: weights must be bf16 (got %s)", ns_dtype_name((ns_dtype)w->dtype));
        return;
    }
    const int64_t n = in->rows, k = in->cols, m = w->rows;
    if (w->cols != k || out->rows != n || out->cols != m) {
        set_error(c, NS_ERR_INVALID, "cuda matmul: shapes [%lld,%lld] x [%lld,%lld]^T -> [%lld,%lld] do not match",
                  (long long)n, (long long)k, (long long)w->rows, (long long)w->cols, (long long)out->rows,
                  (long long)out->cols);
        return;
    }
    if (n == 0 || m == 0) return;
    const bool gemv = quant ? n <= CU_QGEMV_MAX
                            : n <= c->gemv_max && k % 8 == 0 && ((uintptr_t)w->data % 16) == 0 &&
                                  ((uintptr_t)in->data % 16) == 0;
    const bf16 *in_bf = NULL;
    if (!gemv) {
        cu_shadow *s = cu_shadow_for(c, in->data);
        if (s && s->valid && s->bf && s->vrows == in->rows && s->vcols == in->cols) {
            in_bf = s->bf;
        } else if (s && (s->bf || !c->capturing)) {
            if (!s->bf) {
                bf16 *p = NULL;
                if (cu_check(c, cudaMalloc(&p, s->bytes / 2 + 16), "cudaMalloc(shadow)")) return;
                s->bf = p;
            }
            cu_launch_f32_to_bf16(c, s->bf, (const float *)in->data, (size_t)(n * k));
            s->valid = true;
            s->vrows = n;
            s->vcols = k;
            in_bf = s->bf;
        } else {
            bf16 *p = conv_scratch(c, (size_t)(n * k));
            if (!p) return;
            cu_launch_f32_to_bf16(c, p, (const float *)in->data, (size_t)(n * k));
            in_bf = p;
        }
    }
    if (quant) cu_quant_matmul(c, (float *)out->data, (const float *)in->data, in_bf, w, n);
    else if (accumulate) cu_gemm_acc(c, (float *)out->data, in_bf, (const bf16 *)w->data, n, m, k);
    else cu_gemm(c, (float *)out->data, in_bf, (const float *)in->data, (const bf16 *)w->data, n, m, k);
    cu_note_write(c, out);
}

void cu_prof_begin(cu_impl *c, const char *label, int *pi) {
    *pi = -1;
    if (!c->profiling || c->n_prof_ev >= CU_PROF_EVENTS) return;
    *pi = c->n_prof_ev++;
    c->prof_label_of[*pi] = prof_label(c, label);
    cudaEventRecord(c->prof_ev[2 * *pi], c->stream);
}

void cu_prof_end(cu_impl *c, int pi) {
    if (pi >= 0) cudaEventRecord(c->prof_ev[2 * pi + 1], c->stream);
}

/* prof_begin for one op; its label is built only when profiling. */
static int prof_begin_op(cu_impl *c, const cu_op *op) {
    int pi = -1;
    if (c->profiling && c->n_prof_ev < CU_PROF_EVENTS) {
        char name[48];
        op_label(op, name, sizeof name);
        cu_prof_begin(c, name, &pi);
    }
    return pi;
}

static void exec_op(cu_impl *c, const cu_op *op) {
    if (c->err_status != NS_OK) return;
    int pi = prof_begin_op(c, op);
    switch (op->kind) {
    case OP_EMBED: {
        const ns_tensor *out = &op->a, *tab = &op->b;
        if (!need_f32(c, out, "embed")) break;
        if (tab->cols != out->cols) {
            set_error(c, NS_ERR_INVALID, "cuda embed: table width %lld != %lld", (long long)tab->cols,
                      (long long)out->cols);
            break;
        }
        if (ns_dtype_is_quant((ns_dtype)tab->dtype)) cu_quant_embed(c, (float *)out->data, tab, (int)out->rows);
        else cu_launch_embed(c, (float *)out->data, tab, (int)out->rows, (int)out->cols);
        cu_note_write(c, out);
        break;
    }
    case OP_RMSNORM: {
        const ns_tensor *out = &op->a, *in = &op->b, *w = &op->c;
        if (!need_f32(c, out, "rmsnorm") || !need_f32(c, in, "rmsnorm") || !need_f32(c, w, "rmsnorm weight")) break;
        if (w->rows * w->cols != in->cols || out->cols != in->cols || out->rows != in->rows) {
            set_error(c, NS_ERR_INVALID, "cuda rmsnorm: shapes do not match");
            break;
        }
        bf16 *obf = cu_shadow_produce(c, out);
        /* with no shadow the F32 output is what the reader gets: kept */
        float *of = obf && c->out_f32_dead ? NULL : (float *)out->data;
        if (!of) c->stat_f32_dropped++;
        cu_launch_rmsnorm(c, of, obf, (const float *)in->data, (const float *)w->data, in->rows, (int)in->cols, op->f0);
        break;
    }
    case OP_MATMUL: cu_matmul_op(c, &op->a, &op->b, &op->c, false); break;
    case OP_ROPE: {
        const ns_tensor *x = &op->a, *inv = &op->b;
        int nh = op->i0, hd = op->i1;
        if (!need_f32(c, x, "rope") || !need_f32(c, inv, "rope inv_freq")) break;
        if ((int64_t)nh * hd > x->cols || hd % 2 || inv->rows * inv->cols < hd / 2) {
            set_error(c, NS_ERR_INVALID, "cuda rope: %d heads x %d does not fit %lld columns", nh, hd,
                      (long long)x->cols);
            break;
        }
        cu_launch_rope(c, (float *)x->data, (int)x->rows, nh, hd, (int)x->cols, (const float *)inv->data);
        cu_note_write(c, x);
        break;
    }
    case OP_SWIGLU: {
        const ns_tensor *out = &op->a, *g = &op->b, *u = &op->c;
        if (!need_f32(c, out, "swiglu") || !need_f32(c, g, "swiglu") || !need_f32(c, u, "swiglu")) break;
        int64_t n = out->rows * out->cols;
        if (g->rows * g->cols != n || u->rows * u->cols != n) {
            set_error(c, NS_ERR_INVALID, "cuda swiglu: shapes do not match");
            break;
        }
        bf16 *obf = cu_shadow_produce(c, out);
        float *of = obf && c->out_f32_dead ? NULL : (float *)out->data;
        if (!of) c->stat_f32_dropped++;
        cu_launch_swiglu(c, of, obf, (const float *)g->data, (const float *)u->data, n);
        break;
    }
    case OP_ADD: {
        const ns_tensor *out = &op->a, *x = &op->b;
        if (!need_f32(c, out, "add") || !need_f32(c, x, "add")) break;
        int64_t n = out->rows * out->cols;
        if (x->rows * x->cols != n) {
            set_error(c, NS_ERR_INVALID, "cuda add: shapes do not match");
            break;
        }
        cu_launch_add(c, (float *)out->data, (const float *)x->data, n);
        cu_note_write(c, out);
        break;
    }
    case OP_ADD_BIAS: {
        const ns_tensor *out = &op->a, *b = &op->b;
        if (!need_f32(c, out, "add_bias") || !need_f32(c, b, "add_bias")) break;
        if (b->rows * b->cols != out->cols) {
            set_error(c, NS_ERR_INVALID, "cuda add_bias: bias of %lld values for %lld columns",
                      (long long)(b->rows * b->cols), (long long)out->cols);
            break;
        }
        cu_launch_add_bias(c, (float *)out->data, (const float *)b->data, out->rows, (int)out->cols);
        cu_note_write(c, out);
        break;
    }
    case OP_MOE: cu_exec_moe(c, op); break;
    default: break;
    }
    cu_prof_end(c, pi);
}

/* ops that need the backend (KV layout) are executed here */
static void exec_op_be(ns_backend *be, const cu_op *op) {
    cu_impl *c = IMPL(be);
    if (c->err_status != NS_OK) return;
    switch (op->kind) {
    case OP_KV_STORE:
    case OP_ATTENTION:
    case OP_GATHER:
    case OP_KV_COPY:
    case OP_ARGMAX: break;
    default: exec_op(c, op); return;
    }
    int pi = prof_begin_op(c, op);
    const ns_kv_layout *l = &be->kv;
    switch (op->kind) {
    case OP_KV_STORE: {
        const ns_tensor *k = &op->a, *v = &op->b;
        if (!c->kv) {
            set_error(c, NS_ERR_INVALID, "cuda kv_store: KV pool not allocated");
            break;
        }
        if (!need_f32(c, k, "kv_store") || !need_f32(c, v, "kv_store")) break;
        if (k->cols < (int64_t)l->n_kv_heads * l->head_dim || v->cols < (int64_t)l->n_kv_heads * l->head_dim ||
            op->i0 < 0 || op->i0 >= l->n_layers || k->rows != v->rows) {
            set_error(c, NS_ERR_INVALID, "cuda kv_store: bad shapes or layer %d", op->i0);
            break;
        }
        cu_launch_kv_store(c, l, op->i0, (const float *)k->data, (const float *)v->data, (int)k->rows, (int)k->cols,
                           (int)v->cols);
        break;
    }
    case OP_ATTENTION: {
        const ns_tensor *out = &op->a, *q = &op->b;
        int nh = op->i1;
        if (!c->kv) {
            set_error(c, NS_ERR_INVALID, "cuda attention: KV pool not allocated");
            break;
        }
        if (!need_f32(c, out, "attention") || !need_f32(c, q, "attention")) break;
        if (nh <= 0 || nh % l->n_kv_heads || q->cols != (int64_t)nh * l->head_dim || out->cols != q->cols ||
            out->rows != q->rows || q->rows != c->meta.n_tokens || op->i0 < 0 || op->i0 >= l->n_layers) {
            set_error(c, NS_ERR_INVALID, "cuda attention: bad shapes (%d heads, layer %d)", nh, op->i0);
            break;
        }
        bf16 *obf = cu_shadow_produce(c, out);
        if (l->dtype == NS_DT_FP8_E4M3)
            cu_attention_fp8(c, l, (float *)out->data, obf, (const float *)q->data, op->i0, nh, op->f0);
        else
            cu_attention(c, l, (float *)out->data, obf, (const float *)q->data, op->i0, nh, op->f0);
        break;
    }
    case OP_GATHER: {
        const ns_tensor *out = &op->a, *in = &op->b;
        if (!need_f32(c, out, "gather_rows") || !need_f32(c, in, "gather_rows")) break;
        if (out->cols != in->cols || out->rows > c->meta.n_logits) {
            set_error(c, NS_ERR_INVALID, "cuda gather_rows: bad shapes");
            break;
        }
        bf16 *obf = cu_shadow_produce(c, out);
        cu_launch_gather(c, (float *)out->data, obf, (const float *)in->data, (int)out->rows, (int)out->cols,
                         (int)in->cols);
        break;
    }
    case OP_KV_COPY:
        if (!c->kv) break;
        cu_launch_kv_copy(c, l, op->i0, op->i1, op->i2);
        c->pdl_anchor = c->pdl_anchors != 0;
        break;
    case OP_ARGMAX: {
        const ns_tensor *lg = &op->a;
        /* mapped: the last CTA of a row writes its token straight to the
         * pinned host buffer, so no copy waits in the stream after the
         * step's graph (the graph bakes the address; ensure_argmax bumps
         * the generation when it moves) */
        cu_launch_argmax(c, c->argmax_mapped ? c->d_argmax_mapped : c->d_argmax, (const float *)lg->data, op->i0,
                         (int)lg->cols, (int)lg->cols);
        break;
    }
    default: break;
    }
    cu_prof_end(c, pi);
}

/* ================================================================= tape */

static void run_tape(ns_backend *be, const cu_op *ops, int32_t n) {
    cu_impl *c = IMPL(be);
    bool kv_copy = false;
    c->tape_early = c->early_loads && c->pdl && cu_tape_weights_unwritten(c, ops, n, &kv_copy);
    /* a KV page copy in the tape rewrites keys older than the step's new
     * tokens: the decode attention must not read any K/V before its wait
     * (CU_EARLY_ATTN_KV; the anchor after the copy orders it too, but the
     * kernel's premise is simpler kept true) */
    c->tape_early_mask = c->tape_early ? c->early_mask & ~(kv_copy ? CU_EARLY_ATTN_KV : 0) : 0;
    for (int32_t i = 0; i < n;) {
        if (c->err_status != NS_OK) break;
        int32_t used = c->fusion ? cu_tape_try_fuse(be, ops, i, n) : 0;
        if (used > 0) {
            i += used;
            continue;
        }
        /* prefill: an RMSNorm, SwiGLU or attention whose F32 output only
         * GEMMs read (through the shadow it writes) may skip writing it */
        const cu_op *op = &ops[i];
        c->out_f32_dead = (op->kind == OP_RMSNORM || op->kind == OP_SWIGLU || op->kind == OP_ATTENTION) &&
                          cu_prefill_out_dead(c, ops, i + 1, n, &op->a);
        exec_op_be(be, op);
        c->out_f32_dead = false;
        i++;
    }
    c->tape_early = false;
    c->tape_early_mask = 0;
}

/* Puts a pending memo's ops in front of what was recorded after them,
 * so the tape holds the whole step (memo_in_tape then says so, for the
 * link made when its graph launches). */
static void memo_materialize(cu_impl *c) {
    if (!c->memo_pending) return;
    c->memo_pending = false;
    if (NS_VEC_GROW(c->tape, c->cap_tape, (size_t)c->n_memo + (size_t)c->n_tape, INT32_MAX) != NS_OK) {
        set_error(c, NS_ERR_NOMEM, "cuda: out of host memory for the op tape");
        c->n_tape = 0;
        return;
    }
    memmove(c->tape + c->n_memo, c->tape, (size_t)c->n_tape * sizeof(cu_op));
    memcpy(c->tape, c->memo, (size_t)c->n_memo * sizeof(cu_op));
    c->n_tape += c->n_memo;
    c->memo_in_tape = true;
}

/* After the tape launched as graph g: when the tape began with the memo's
 * ops, remember g, the ops after them and the launch shape, so the next
 * replay of the same memo can launch g directly (memo_launch_direct). */
static void memo_link(cu_impl *c, cu_graph_entry *g) {
    if (!c->memo_in_tape) return;
    c->memo_in_tape = false;
    const int32_t tail = c->n_tape - c->n_memo;
    if (!g || tail < 0 || tail > 4) return;
    c->memo_g = g;
    c->memo_g_serial = g->serial;
    tape_shape(c, c->memo_g_shape);
    c->memo_g_tail_n = tail;
    memcpy(c->memo_g_tail, c->tape + c->n_memo, (size_t)tail * sizeof(cu_op));
}

/* A pending memo whose link still holds (the same graph entry, not
 * recaptured or evicted since, the same ops after the memo's, the same
 * launch shape): its graph is launched without assembling the tape. The
 * link was made from a tape that graph_find matched byte for byte, and
 * the memo's ops cannot change while its generation holds. */
static bool memo_launch_direct(cu_impl *c) {
    cu_graph_entry *g = c->memo_g;
    if (!c->memo_pending || c->memo_enabled != 1 || !g || !g->exec || g->serial != c->memo_g_serial ||
        g->generation != c->generation || c->memo_generation != c->generation ||
        g->n_ops != c->n_memo + c->n_tape || c->n_tape != c->memo_g_tail_n ||
        memcmp(c->memo_g_tail, c->tape, (size_t)c->n_tape * sizeof(cu_op)) != 0)
        return false;
    int32_t shape[10];
    tape_shape(c, shape);
    if (memcmp(shape, c->memo_g_shape, sizeof shape) != 0) return false;
    c->use_clock++;
    g->last_use = c->use_clock;
    cu_check(c, cudaGraphLaunch(g->exec, c->stream), "cudaGraphLaunch");
    c->stat_replays++;
    c->stat_memo_direct++;
    c->memo_pending = false;
    c->n_tape = 0;
    return true;
}

/* Executes the recorded tape (eager / capture / replay). */
static void flush(ns_backend *be) {
    cu_impl *c = IMPL(be);
    if (!c->n_tape && !c->memo_pending) return;
    if (c->err_status != NS_OK) {
        c->n_tape = 0;
        c->memo_pending = false;
        return;
    }
    cu_shadow_invalidate_all(c);
    if (!c->tape_eager_only && c->graphs_enabled && !c->profiling && memo_launch_direct(c)) {
        cu_shadow_invalidate_all(c);
        return;
    }
    memo_materialize(c);
    if (!c->n_tape) return;
    /* eager: a prefill / mixed step's tape (fusions only, set_batch), or
     * graphs off, or per-kernel profiling */
    if (c->tape_eager_only || !c->graphs_enabled || c->profiling) {
        run_tape(be, c->tape, c->n_tape);
        c->stat_eager++;
        cu_shadow_invalidate_all(c);
        c->n_tape = 0;
        c->memo_in_tape = false;
        return;
    }
    uint64_t key = tape_key(c);
    cu_graph_entry *g = graph_find(c, key);
    c->use_clock++;
    if (g && g->exec) {
        g->last_use = c->use_clock;
        cu_check(c, cudaGraphLaunch(g->exec, c->stream), "cudaGraphLaunch");
        c->stat_replays++;
        memo_link(c, g);
        cu_shadow_invalidate_all(c);
        c->n_tape = 0;
        return;
    }
    if (g && g->seen >= 1 && !g->no_graph) {
        g->last_use = c->use_clock;
        cudaGraph_t graph = NULL;
        c->capturing = true;
        c->capture_failed = false;
        cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
        if (e == cudaSuccess) {
            run_tape(be, c->tape, c->n_tape);
            e = cudaStreamEndCapture(c->stream, &graph);
        }
        c->capturing = false;
        bool ok = e == cudaSuccess && !c->capture_failed && graph;
        cudaGraphExec_t exec = NULL;
        if (ok) ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
        if (graph) cudaGraphDestroy(graph);
        (void)cudaGetLastError(); /* capture problems are not step errors */
        cu_shadow_invalidate_all(c);
        if (ok) {
            g->exec = exec;
            c->stat_captures++;
            cu_check(c, cudaGraphLaunch(exec, c->stream), "cudaGraphLaunch");
            memo_link(c, g);
            cu_shadow_invalidate_all(c);
            c->n_tape = 0;
            return;
        }
        g->no_graph = true;
    }
    if (!g) g = graph_insert(c, key);
    if (g) {
        g->seen++;
        g->last_use = c->use_clock;
    }
    run_tape(be, c->tape, c->n_tape);
    c->stat_eager++;
    cu_shadow_invalidate_all(c);
    c->n_tape = 0;
    c->memo_in_tape = false;
}

static void submit(ns_backend *be, const cu_op *op) {
    cu_impl *c = IMPL(be);
    if (c->err_status != NS_OK) return;
    if (!c->recording) {
        exec_op_be(be, op);
        return;
    }
    if (NS_VEC_GROW(c->tape, c->cap_tape, (size_t)c->n_tape + 1, INT32_MAX) != NS_OK) {
        set_error(c, NS_ERR_NOMEM, "cuda: out of host memory for the op tape");
        return;
    }
    c->tape[c->n_tape++] = *op;
}

/* ============================================================ step memo */

/* A decode step's ops are recorded into the tape and only then hashed,
 * looked up and replayed as a graph; recording ~650 ops is host time
 * between the previous step's sync and this step's launch, so the GPU
 * idles through it. The memo keeps the last decode step's tape so the
 * engine can skip issuing the same ops again (backend.h), and flush can
 * launch the graph it last became without looking it up
 * (memo_launch_direct). Only recorded,
 * graph-eligible steps are kept: an eager-only (prefill) tape is not
 * replayed, and a tape with a MoE op is not kept because that op prepares
 * its expert table at submit time (cu_moe_ffn_op). Any change that drops
 * graphs (cu_bump_generation: an allocation moved, a captured setting
 * changed) drops the memo too. */
static void cu_memo_save(ns_backend *be, uint64_t id) {
    cu_impl *c = IMPL(be);
    c->memo_valid = false;
    if (!c->memo_enabled || c->err_status != NS_OK || !c->recording || c->tape_eager_only || c->n_tape <= 0) return;
    for (int32_t i = 0; i < c->n_tape; i++)
        if (c->tape[i].kind == OP_MOE || c->tape[i].kind == OP_KV_COPY) return;
    if (NS_VEC_GROW(c->memo, c->cap_memo, (size_t)c->n_tape, INT32_MAX) != NS_OK) return; /* no memo: record */
    memcpy(c->memo, c->tape, (size_t)c->n_tape * sizeof(cu_op));
    c->n_memo = c->n_tape;
    c->memo_g = NULL; /* a new memo: no graph launched from it yet */
    c->memo_id = id;
    c->memo_generation = c->generation;
    c->memo_valid = true;
}

static bool cu_memo_replay(ns_backend *be, uint64_t id) {
    cu_impl *c = IMPL(be);
    if (!c->memo_valid || !c->memo_enabled || c->memo_id != id || c->memo_generation != c->generation ||
        c->err_status != NS_OK || !c->recording || c->tape_eager_only || c->n_tape != 0 || c->memo_pending)
        return false;
    /* not copied here: flush launches the linked graph directly or puts
     * the memo's ops in front of the ops recorded after this call */
    c->memo_pending = true;
    c->stat_memo++;
    return true;
}

/* Copies the fields that define a tensor (not padding or alloc), so tapes
 * compare byte for byte. */
static void put_tensor(ns_tensor *dst, const ns_tensor *src) {
    if (!src) return;
    dst->dtype = src->dtype;
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->data = src->data;
}

static void make_op(cu_op *op, int kind, const ns_tensor *a, const ns_tensor *b, const ns_tensor *cc) {
    memset(op, 0, sizeof *op);
    op->kind = kind;
    put_tensor(&op->a, a);
    put_tensor(&op->b, b);
    put_tensor(&op->c, cc);
}

/* ============================================================== memory */

static ns_status cu_tensor_alloc(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols, ns_error *err) {
    cu_impl *c = IMPL(be);
    memset(t, 0, sizeof *t);
    if (rows < 0 || cols < 0 || (cols && (uint64_t)rows > ((uint64_t)1 << 40) / (uint64_t)cols))
        return ns_fail(err, NS_ERR_RANGE, "tensor of %lld x %lld is too large", (long long)rows, (long long)cols);
    size_t bytes = (size_t)rows * ns_dtype_row_bytes(dt, cols); /* block types: whole blocks */
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    if (dt == NS_DT_F32) {
        ns_status rc = shadow_register(c, p, bytes, err);
        if (rc != NS_OK) {
            cudaFree(p);
            return rc;
        }
    }
    ns_tensor_own(t, dt, rows, cols, p);
    return NS_OK;
}

static void cu_tensor_free(ns_backend *be, ns_tensor *t) {
    cu_impl *c = IMPL(be);
    if (t->alloc) {
        flush(be);
        cu_check(c, cudaStreamSynchronize(c->stream), "sync before free");
        shadow_unregister(c, t->alloc);
        cu_check(c, cudaFree(t->alloc), "cudaFree");
        bump_generation(c);
    }
    memset(t, 0, sizeof *t);
}

static uint16_t host_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float host_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (ex == 0) {
        if (mant == 0) {
            u = sign;
        } else {
            ex = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                ex--;
            }
            u = sign | (ex << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (ex == 31) {
        u = sign | 0x7f800000 | (mant << 13);
    } else {
        u = sign | ((ex + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float host_to_f32(const void *src, ns_dtype dt, size_t i) {
    if (dt == NS_DT_F32) return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    if (dt == NS_DT_F16) return host_f16_to_f32(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A quantized matrix (GGUF blocks, cuda_quant.cu) from host blocks src,
 * or random blocks when src is NULL. Synchronous; on failure t is freed
 * and the error is returned, not left sticky. */
static ns_status cu_weight_quant(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols,
                                 const void *src, uint64_t seed, float scale, ns_error *err) {
    cu_impl *c = IMPL(be);
    memset(t, 0, sizeof *t);
    if (!cu_quant_type_ok(dt))
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cuda: %s weights are not supported (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K are)",
                       ns_dtype_name(dt));
    if (!cu_quant_check_shape(dt, rows, cols))
        return ns_fail(err, NS_ERR_INVALID, "cuda: %s weight of %lld x %lld is not made of whole blocks",
                       ns_dtype_name(dt), (long long)rows, (long long)cols);
    ns_status rc = cu_tensor_alloc(be, t, dt, rows, cols, err);
    if (rc != NS_OK) return rc;
    bool ok = src ? cu_quant_upload(c, t, src) : cu_quant_random(c, t, seed, scale);
    if (ok) ok = !cu_check(c, cudaStreamSynchronize(c->stream), "quantized weight");
    if (ok) return NS_OK;
    cu_tensor_free(be, t);
    rc = cu_report(c, err);
    c->err_status = NS_OK; /* reported to the caller; not sticky for later ops */
    return rc;
}

/* Matrices are stored BF16 (what the GEMMs read); vectors (norm weights,
 * rows == 1) F32, so elementwise ops read them exactly as given.
 * Quantized matrices keep their blocks (cuda_quant.cu). */
static ns_status cu_weight_from_host(ns_backend *be, ns_tensor *t, const void *src, ns_dtype src_dt, int64_t rows,
                                     int64_t cols, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (ns_dtype_is_quant(src_dt)) {
        if (rows > 1) return cu_weight_quant(be, t, src_dt, rows, cols, src, 0, 0.f, err);
        memset(t, 0, sizeof *t);
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cuda: quantized vectors (%s, 1 x %lld) are not supported",
                       ns_dtype_name(src_dt), (long long)cols);
    }
    ns_dtype store = rows > 1 ? NS_DT_BF16 : NS_DT_F32;
    ns_status rc = cu_tensor_alloc(be, t, store, rows, cols, err);
    if (rc != NS_OK) return rc;
    size_t n = (size_t)rows * (size_t)cols;
    if (store == NS_DT_BF16 && src_dt == NS_DT_BF16) {
        if (cu_check(c, cudaMemcpy(t->data, src, n * 2, cudaMemcpyHostToDevice), "upload weight")) goto fail;
        return NS_OK;
    }
    {
        const size_t chunk = (size_t)1 << 22;
        size_t esz = ns_dtype_size(store);
        void *buf = malloc((n < chunk ? n : chunk) * esz);
        if (!buf) {
            cu_tensor_free(be, t);
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
        for (size_t off = 0; off < n; off += chunk) {
            size_t m = n - off < chunk ? n - off : chunk;
            for (size_t i = 0; i < m; i++) {
                float f = host_to_f32(src, src_dt, off + i);
                if (store == NS_DT_F32) ((float *)buf)[i] = f;
                else ((uint16_t *)buf)[i] = host_f32_to_bf16(f);
            }
            if (cu_check(c, cudaMemcpy((uint8_t *)t->data + off * esz, buf, m * esz, cudaMemcpyHostToDevice),
                         "upload weight")) {
                free(buf);
                goto fail;
            }
        }
        free(buf);
    }
    return NS_OK;
fail:
    cu_tensor_free(be, t);
    rc = cu_report(c, err);
    c->err_status = NS_OK; /* reported to the caller; not sticky for later ops */
    return rc;
}

static ns_status cu_weight_random(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols, uint64_t seed,
                                  float scale, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (ns_dtype_is_quant(dt) && rows > 1) return cu_weight_quant(be, t, dt, rows, cols, NULL, seed, scale, err);
    ns_dtype store = rows > 1 ? NS_DT_BF16 : NS_DT_F32;
    ns_status rc = cu_tensor_alloc(be, t, store, rows, cols, err);
    if (rc != NS_OK) return rc;
    size_t n = (size_t)rows * (size_t)cols;
    /* F32 vectors of a BF16 model keep the bf16-rounded values, as the CPU
     * backend does, so both backends hold the same numbers. */
    bool round_bf = dt == NS_DT_BF16;
    if (store == NS_DT_BF16) cu_launch_fill_random(c, (bf16 *)t->data, NULL, n, seed, scale, true);
    else cu_launch_fill_random(c, NULL, (float *)t->data, n, seed, scale, round_bf);
    cu_check(c, cudaStreamSynchronize(c->stream), "weight_random");
    if (c->err_status != NS_OK) {
        rc = cu_report(c, err);
        c->err_status = NS_OK;
        cu_tensor_free(be, t);
        return rc;
    }
    return NS_OK;
}

static ns_status cu_tensor_upload(ns_backend *be, ns_tensor *t, const float *src, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (t->dtype != NS_DT_F32) return ns_fail(err, NS_ERR_INVALID, "tensor_upload: tensor is not F32");
    flush(be);
    cu_check(c, cudaMemcpyAsync(t->data, src, ns_tensor_bytes(t), cudaMemcpyHostToDevice, c->stream), "upload");
    c->pdl_anchor = c->pdl_anchors != 0;
    cu_check(c, cudaStreamSynchronize(c->stream), "upload");
    cu_note_write(c, t);
    return cu_report(c, err);
}

static ns_status cu_tensor_download(ns_backend *be, const ns_tensor *t, float *dst, ns_error *err) {
    cu_impl *c = IMPL(be);
    flush(be);
    size_t n = (size_t)t->rows * (size_t)t->cols;
    if (t->dtype == NS_DT_F32) {
        cu_check(c, cudaMemcpyAsync(dst, t->data, n * 4, cudaMemcpyDeviceToHost, c->stream), "download");
    } else if (t->dtype == NS_DT_BF16) {
        float *tmp = NULL;
        if (!cu_check(c, cudaMallocAsync(&tmp, n * 4, c->stream), "download tmp")) {
            cu_launch_bf16_to_f32(c, tmp, (const bf16 *)t->data, n);
            cu_check(c, cudaMemcpyAsync(dst, tmp, n * 4, cudaMemcpyDeviceToHost, c->stream), "download");
            cu_check(c, cudaFreeAsync(tmp, c->stream), "download tmp");
        }
    } else {
        return ns_fail(err, NS_ERR_UNSUPPORTED, "tensor_download: f16 tensors are not kept on cuda");
    }
    cu_check(c, cudaStreamSynchronize(c->stream), "download");
    return cu_report(c, err);
}

/* ============================================================= KV pool */

static ns_status cu_kv_alloc(ns_backend *be, const ns_kv_layout *layout, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (layout->dtype != NS_DT_BF16 && layout->dtype != NS_DT_FP8_E4M3)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cuda backend: KV dtype must be bf16 or fp8 (got %s)",
                       ns_dtype_name(layout->dtype));
    if (layout->dtype == NS_DT_FP8_E4M3 && layout->head_dim != 16 && layout->head_dim != 32 &&
        layout->head_dim != 64 && layout->head_dim != 128 && layout->head_dim != 256)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cuda backend: fp8 KV needs head_dim 16, 32, 64, 128 or 256 (got %d)",
                       layout->head_dim);
    if (c->kv) return ns_fail(err, NS_ERR_INVALID, "cuda backend: KV pool already allocated");
    if (layout->n_pages <= 0 || layout->page_tokens <= 0 || layout->head_dim <= 0 || layout->head_dim % 8 ||
        layout->head_dim > 256 || layout->n_kv_heads <= 0 || layout->n_layers <= 0)
        return ns_fail(err, NS_ERR_RANGE, "cuda backend: unsupported KV geometry (head_dim %d must be a multiple of 8, <= 256)",
                       layout->head_dim);
    size_t expect = ns_kv_page_bytes(layout->n_layers, layout->n_kv_heads, layout->page_tokens, layout->head_dim,
                                     layout->dtype);
    if (layout->page_size_bytes != expect)
        return ns_fail(err, NS_ERR_INVALID, "cuda backend: page_size_bytes %zu != %zu implied by the layout",
                       layout->page_size_bytes, expect);
    size_t bytes = (size_t)layout->n_pages * layout->page_size_bytes;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes of KV pool: %s", bytes,
                       cudaGetErrorString(e));
    }
    /* 0xFFFF is a bf16 NaN (0xFF an e4m3 NaN, 0xFFFFFFFF a NaN scale): a
     * slot read before anything wrote it poisons the result visibly. */
    cu_check(c, cudaMemset(p, 0xFF, bytes), "kv poison");
    c->kv = (uint8_t *)p;
    be->kv = *layout;
    bump_generation(c);
    return cu_report(c, err);
}

static void cu_kv_free(ns_backend *be) {
    cu_impl *c = IMPL(be);
    flush(be);
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (c->kv) cu_check(c, cudaFree(c->kv), "cudaFree(kv)");
    c->kv = NULL;
    cu_kv_fp8_free(c); /* its scratch is sized by this layout */
    memset(&be->kv, 0, sizeof be->kv);
    bump_generation(c);
}

static ns_status check_page(ns_backend *be, int32_t page, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (!c->kv) return ns_fail(err, NS_ERR_INVALID, "KV pool not allocated");
    if (page < 0 || page >= be->kv.n_pages) return ns_fail(err, NS_ERR_RANGE, "KV page %d out of range", page);
    return NS_OK;
}

static ns_status cu_kv_page_read(ns_backend *be, int32_t page, void *dst, ns_error *err) {
    cu_impl *c = IMPL(be);
    ns_status rc = check_page(be, page, err);
    if (rc != NS_OK) return rc;
    flush(be);
    cu_check(c, cudaMemcpyAsync(dst, c->kv + (size_t)page * be->kv.page_size_bytes, be->kv.page_size_bytes,
                                cudaMemcpyDeviceToHost, c->stream), "kv_page_read");
    cu_check(c, cudaStreamSynchronize(c->stream), "kv_page_read");
    return cu_report(c, err);
}

static ns_status cu_kv_page_write(ns_backend *be, int32_t page, const void *src, ns_error *err) {
    cu_impl *c = IMPL(be);
    ns_status rc = check_page(be, page, err);
    if (rc != NS_OK) return rc;
    flush(be);
    cu_check(c, cudaMemcpyAsync(c->kv + (size_t)page * be->kv.page_size_bytes, src, be->kv.page_size_bytes,
                                cudaMemcpyHostToDevice, c->stream), "kv_page_write");
    cu_check(c, cudaStreamSynchronize(c->stream), "kv_page_write");
    return cu_report(c, err);
}

/* ---- asynchronous page transfers (the cache tiers' demotions and
 * promotions) on the copy stream; see backend.h ---- */

/* The copy stream waits for everything enqueued on the compute stream so
 * far (including a pending tape: flushed first). */
static void copy_after_compute(ns_backend *be) {
    cu_impl *c = IMPL(be);
    flush(be);
    cu_check(c, cudaEventRecord(c->compute_ev, c->stream), "fence: record compute");
    cu_check(c, cudaStreamWaitEvent(c->copy_stream, c->compute_ev, 0), "fence: copy waits for compute");
}

static uint64_t fence_issue(cu_impl *c) {
    const uint64_t f = c->next_fence++;
    cudaEvent_t ev = c->fence_ev[f % CU_FENCES];
    /* the slot's previous fence (f - CU_FENCES) finished long ago in
     * practice; waiting keeps the ring correct if it did not */
    if (f > CU_FENCES && f - CU_FENCES > c->fences_done) cu_check(c, cudaEventSynchronize(ev), "fence: ring");
    cu_check(c, cudaEventRecord(ev, c->copy_stream), "fence: record");
    return f;
}

static uint64_t cu_kv_page_read_async(ns_backend *be, int32_t page, void *dst) {
    cu_impl *c = IMPL(be);
    if (check_page(be, page, NULL) != NS_OK) return 0;
    copy_after_compute(be);
    cu_check(c, cudaMemcpyAsync(dst, c->kv + (size_t)page * be->kv.page_size_bytes, be->kv.page_size_bytes,
                                cudaMemcpyDeviceToHost, c->copy_stream), "kv_page_read_async");
    return fence_issue(c);
}

static uint64_t cu_kv_page_write_async(ns_backend *be, int32_t page, const void *src) {
    cu_impl *c = IMPL(be);
    if (check_page(be, page, NULL) != NS_OK) return 0;
    copy_after_compute(be); /* earlier steps may still read the page's old content */
    cu_check(c, cudaMemcpyAsync(c->kv + (size_t)page * be->kv.page_size_bytes, src, be->kv.page_size_bytes,
                                cudaMemcpyHostToDevice, c->copy_stream), "kv_page_write_async");
    return fence_issue(c);
}

static bool cu_fence_done(ns_backend *be, uint64_t f) {
    cu_impl *c = IMPL(be);
    if (f == 0 || f <= c->fences_done) return true;
    cudaError_t e = cudaEventQuery(c->fence_ev[f % CU_FENCES]);
    if (e == cudaErrorNotReady) return false;
    if (!cu_check(c, e, "fence: query")) return true; /* sticky error: the next sync reports it */
    c->fences_done = f; /* one stream: fences complete in order */
    return true;
}

static void cu_fence_wait(ns_backend *be, uint64_t f) {
    cu_impl *c = IMPL(be);
    if (cu_fence_done(be, f)) return;
    if (cu_check(c, cudaEventSynchronize(c->fence_ev[f % CU_FENCES]), "fence: wait")) c->fences_done = f;
}

static void cu_compute_after(ns_backend *be, uint64_t f) {
    cu_impl *c = IMPL(be);
    if (cu_fence_done(be, f)) return;
    flush(be);
    cu_check(c, cudaStreamWaitEvent(c->stream, c->fence_ev[f % CU_FENCES], 0), "fence: compute waits");
    c->pdl_anchor = c->pdl_anchors != 0; /* a promoted page: the next kernel waits for the event */
}

static void cu_kv_page_copy(ns_backend *be, int32_t dst_page, int32_t src_page, int32_t n_slots) {
    cu_impl *c = IMPL(be);
    if (dst_page < 0 || src_page < 0 || dst_page >= be->kv.n_pages || src_page >= be->kv.n_pages || n_slots < 0 ||
        n_slots > be->kv.page_tokens) {
        set_error(c, NS_ERR_RANGE, "kv_page_copy: page %d <- %d, %d slots out of range", dst_page, src_page, n_slots);
        return;
    }
    if (n_slots == 0 || dst_page == src_page) return;
    cu_op op;
    make_op(&op, OP_KV_COPY, NULL, NULL, NULL);
    op.i0 = dst_page;
    op.i1 = src_page;
    op.i2 = n_slots;
    submit(be, &op);
}

/* ================================================================== ops */

/* Records (or runs) an op over tensors a, b, cc that takes no scalars. */
static void submit_plain(ns_backend *be, int kind, const ns_tensor *a, const ns_tensor *b, const ns_tensor *cc) {
    cu_op op;
    make_op(&op, kind, a, b, cc);
    submit(be, &op);
}

static void cu_embed(ns_backend *be, ns_tensor *out, const ns_tensor *table) {
    submit_plain(be, OP_EMBED, out, table, NULL);
}

static void cu_rmsnorm(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w, float eps) {
    cu_op op;
    make_op(&op, OP_RMSNORM, out, in, w);
    op.f0 = eps;
    submit(be, &op);
}

static void cu_matmul(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w) {
    submit_plain(be, OP_MATMUL, out, in, w);
}

static void cu_rope(ns_backend *be, ns_tensor *x, int n_heads, int head_dim, const ns_tensor *inv_freq) {
    cu_op op;
    make_op(&op, OP_ROPE, x, inv_freq, NULL);
    op.i0 = n_heads;
    op.i1 = head_dim;
    submit(be, &op);
}

static void cu_swiglu(ns_backend *be, ns_tensor *out, const ns_tensor *gate, const ns_tensor *up) {
    submit_plain(be, OP_SWIGLU, out, gate, up);
}

static void cu_add(ns_backend *be, ns_tensor *out, const ns_tensor *x) { submit_plain(be, OP_ADD, out, x, NULL); }

static void cu_kv_store(ns_backend *be, int layer, const ns_tensor *k, const ns_tensor *v) {
    cu_op op;
    make_op(&op, OP_KV_STORE, k, v, NULL);
    op.i0 = layer;
    submit(be, &op);
}

static void cu_attention_op(ns_backend *be, ns_tensor *out, const ns_tensor *q, int layer, int n_heads, float scale) {
    cu_op op;
    make_op(&op, OP_ATTENTION, out, q, NULL);
    op.i0 = layer;
    op.i1 = n_heads;
    op.f0 = scale;
    submit(be, &op);
}

static void cu_gather_rows(ns_backend *be, ns_tensor *out, const ns_tensor *in) {
    submit_plain(be, OP_GATHER, out, in, NULL);
}

static void cu_add_bias_op(ns_backend *be, ns_tensor *out, const ns_tensor *b) {
    submit_plain(be, OP_ADD_BIAS, out, b, NULL);
}

/* The expert table and scratch are prepared now, at submit time, so
 * that executing the op (possibly under graph capture) allocates
 * nothing; the op records the table's index. */
static void cu_moe_ffn_op(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                          const ns_tensor *experts, int n_experts, int top_k, bool norm_topk) {
    cu_impl *c = IMPL(be);
    if (c->err_status != NS_OK) return;
    const int32_t idx = cu_moe_prepare(c, out, in, router, experts, n_experts, top_k);
    if (idx < 0) return;
    cu_op op;
    make_op(&op, OP_MOE, out, in, router);
    op.i0 = n_experts;
    op.i1 = top_k;
    op.i2 = norm_topk ? 1 : 0;
    op.pad = idx;
    submit(be, &op);
}

/* ============================================================= sampling */

static ns_status ensure_argmax(cu_impl *c, int n, ns_error *err) {
    if (n <= c->argmax_cap) return NS_OK;
    int cap = c->argmax_cap ? c->argmax_cap : 1024;
    while (cap < n) cap *= 2;
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (c->d_argmax) cudaFree(c->d_argmax);
    if (c->d_argmax_key) cudaFree(c->d_argmax_key);
    if (c->d_argmax_aux) cudaFree(c->d_argmax_aux);
    if (c->h_argmax) cudaFreeHost(c->h_argmax);
    c->d_argmax = NULL;
    c->d_argmax_key = NULL;
    c->d_argmax_aux = NULL;
    c->h_argmax = NULL;
    c->argmax_cap = 0;
    /* the key and aux rows start at zero; k_argmax leaves them so */
    if (cudaMalloc(&c->d_argmax, (size_t)cap * 4) != cudaSuccess ||
        cudaMalloc(&c->d_argmax_key, (size_t)cap * 8) != cudaSuccess ||
        cudaMalloc(&c->d_argmax_aux, (size_t)cap * 8) != cudaSuccess ||
        cudaMemsetAsync(c->d_argmax_key, 0, (size_t)cap * 8, c->stream) != cudaSuccess ||
        cudaMemsetAsync(c->d_argmax_aux, 0, (size_t)cap * 8, c->stream) != cudaSuccess ||
        cudaHostAlloc(&c->h_argmax, (size_t)cap * 4, cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&c->d_argmax_mapped, c->h_argmax, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate sampling buffers");
    }
    c->argmax_cap = cap;
    bump_generation(c);
    return NS_OK;
}

/* Greedy rows without penalties and without a grammar mask are reduced on
 * the device (argmax, lowest id wins ties, -1 for a row with a NaN or
 * nothing above -Inf, as ns_sampler_sample); the rest copy their row to
 * pinned host memory and run the reference sampler there, which keeps
 * every sampler's RNG stream and penalty state exactly as on the CPU (and
 * returns -1 the same way) and applies the grammar mask (sampler->allow)
 * as the CPU does: structured-output rows cost one row copy each, the
 * unconstrained greedy rows stay on the fast path. */
static bool on_device(const ns_sampler *s) {
    return ns_sampler_is_greedy(s) && !ns_sampler_has_penalties(s) && !s->allow;
}

/* After a probed step's sync: its span (upload -> tokens copied) and,
 * when the step before was probed too, the GPU's idle time between that
 * step's tokens and this step's upload (host time on the critical path:
 * the sync's wake-up, the token's use, recording or the memo, set_batch). */
static void probe_account(cu_impl *c) {
    float span = 0, idle = 0;
    c->probe_begun = false;
    if (cudaEventElapsedTime(&span, c->probe_begin, c->probe_end[c->probe_cur]) != cudaSuccess) {
        (void)cudaGetLastError();
        c->probe_prev = false;
        return;
    }
    float up = 0, gr = 0;
    if (c->probe_prev && cudaEventElapsedTime(&idle, c->probe_end[c->probe_cur ^ 1], c->probe_begin) == cudaSuccess &&
        cudaEventElapsedTime(&up, c->probe_begin, c->probe_mid) == cudaSuccess &&
        cudaEventElapsedTime(&gr, c->probe_mid, c->probe_graph) == cudaSuccess) {
        c->probe_idle_ms += idle;
        c->probe_span_ms += span;
        c->probe_upload_ms += up;
        c->probe_graph_ms += gr;
        c->probe_n++;
    }
    (void)cudaGetLastError();
    c->probe_prev = true;
    c->probe_cur ^= 1;
}

static ns_status cu_sample(ns_backend *be, const ns_tensor *logits, int n_rows, struct ns_sampler *const *samplers,
                           int32_t *out_tokens, ns_error *err) {
    cu_impl *c = IMPL(be);
    if (n_rows <= 0) return NS_OK;
    if (logits->dtype != NS_DT_F32 || logits->rows < n_rows)
        return ns_fail(err, NS_ERR_INVALID, "sample: logits must be F32 with at least %d rows", n_rows);
    int n_host = 0;
    for (int i = 0; i < n_rows; i++)
        if (!on_device(samplers[i])) n_host++;
    ns_status rc = ensure_argmax(c, n_rows, err);
    if (rc != NS_OK) return rc;
    const size_t V = (size_t)logits->cols;
    if (n_host) {
        size_t need = (size_t)n_host * V;
        if (need > c->h_rows_floats) {
            if (c->h_rows) cudaFreeHost(c->h_rows);
            c->h_rows = NULL;
            c->h_rows_floats = 0;
            if (cudaMallocHost(&c->h_rows, need * 4) != cudaSuccess) {
                (void)cudaGetLastError();
                return ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate %zu bytes of pinned memory", need * 4);
            }
            c->h_rows_floats = need;
        }
    }
    if (n_host < n_rows) {
        cu_op op;
        make_op(&op, OP_ARGMAX, logits, NULL, NULL);
        op.a.rows = n_rows;
        op.i0 = n_rows;
        submit(be, &op);
    }
    flush(be);
    if (c->probe_begun) cu_check(c, cudaEventRecord(c->probe_graph, c->stream), "gap probe");
    if (n_host < n_rows && !c->argmax_mapped)
        cu_check(c, cudaMemcpyAsync(c->h_argmax, c->d_argmax, (size_t)n_rows * 4, cudaMemcpyDeviceToHost, c->stream),
                 "sample: tokens");
    if (c->probe_begun) cu_check(c, cudaEventRecord(c->probe_end[c->probe_cur], c->stream), "gap probe");
    int j = 0;
    for (int i = 0; i < n_rows; i++) {
        if (on_device(samplers[i])) continue;
        cu_check(c, cudaMemcpyAsync(c->h_rows + (size_t)j * V, (const float *)logits->data + (size_t)i * V, V * 4,
                                    cudaMemcpyDeviceToHost, c->stream), "sample: row");
        j++;
    }
    cu_check(c, cudaStreamSynchronize(c->stream), "sample");
    if (c->err_status != NS_OK) return cu_report(c, err);
    if (c->probe_begun) probe_account(c);
    j = 0;
    for (int i = 0; i < n_rows; i++) {
        if (on_device(samplers[i])) {
            out_tokens[i] = c->h_argmax[i];
        } else {
            out_tokens[i] = ns_sampler_sample(samplers[i], c->h_rows + (size_t)j * V);
            j++;
        }
    }
    return NS_OK;
}

static ns_status cu_sync(ns_backend *be, ns_error *err) {
    cu_impl *c = IMPL(be);
    flush(be);
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (c->profiling) prof_resolve(c);
    return cu_report(c, err);
}

/* ============================================================ lifecycle */

static void cu_destroy(ns_backend *be) {
    if (!be) return;
    cu_impl *c = IMPL(be);
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) {
            flush(be);
            cudaStreamSynchronize(c->stream);
        }
        if (c->copy_stream) cudaStreamSynchronize(c->copy_stream);
        graphs_clear(c);
        for (int i = 0; i < c->n_plans; i++) {
            cu_gemm_plan *p = &c->plans[i];
            if (p->op) cublasLtMatmulDescDestroy(p->op);
            if (p->la) cublasLtMatrixLayoutDestroy(p->la);
            if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
            if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
        }
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->lt_ws) cudaFree(c->lt_ws);
        for (int i = 0; i < c->n_shadows; i++)
            if (c->shadows[i].bf) cudaFree(c->shadows[i].bf);
        free(c->shadows);
        if (c->kv) cudaFree(c->kv);
        if (c->meta.d_base) cudaFree(c->meta.d_base);
        if (c->meta.h_base) cudaFreeHost(c->meta.h_base);
        if (c->conv) cudaFree(c->conv);
        cu_quant_free(c);
        cu_kv_fp8_free(c);
        if (c->attn_ws) cudaFree(c->attn_ws);
        if (c->attn_cnt) cudaFree(c->attn_cnt);
        cu_mlp_free(c);
        if (c->d_argmax) cudaFree(c->d_argmax);
        if (c->d_argmax_key) cudaFree(c->d_argmax_key);
        if (c->d_argmax_aux) cudaFree(c->d_argmax_aux);
        if (c->h_argmax) cudaFreeHost(c->h_argmax);
        if (c->h_rows) cudaFreeHost(c->h_rows);
        if (c->staging_done) cudaEventDestroy(c->staging_done);
        if (c->probe_begin) cudaEventDestroy(c->probe_begin);
        if (c->probe_mid) cudaEventDestroy(c->probe_mid);
        if (c->probe_graph) cudaEventDestroy(c->probe_graph);
        for (int i = 0; i < 2; i++)
            if (c->probe_end[i]) cudaEventDestroy(c->probe_end[i]);
        if (c->prof_ev) {
            for (int i = 0; i < 2 * CU_PROF_EVENTS; i++)
                if (c->prof_ev[i]) cudaEventDestroy(c->prof_ev[i]);
            free(c->prof_ev);
        }
        free(c->prof_label_of);
        free(c->tape);
        free(c->memo);
        free(c->wr);
        cu_moe_free(c);
        if (c->fence_ev) {
            for (int i = 0; i < CU_FENCES; i++)
                if (c->fence_ev[i]) cudaEventDestroy(c->fence_ev[i]);
            free(c->fence_ev);
        }
        if (c->compute_ev) cudaEventDestroy(c->compute_ev);
        if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

/* Pinned host memory for the RAM cache tier: page copies to and from it
 * are DMA transfers at the PCIe rate (pageable memory goes through a
 * driver staging buffer at a fraction of it). NULL on failure (the KV
 * cache then falls back to malloc). */
static void *cu_host_alloc(ns_backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear: not a sticky backend error */
        return NULL;
    }
    return p;
}

static void cu_host_free(ns_backend *be, void *p) {
    (void)be;
    if (p) cudaFreeHost(p);
}

static const ns_backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cu_destroy,
    /* .tensor_alloc = */ cu_tensor_alloc,
    /* .tensor_free = */ cu_tensor_free,
    /* .weight_from_host = */ cu_weight_from_host,
    /* .weight_random = */ cu_weight_random,
    /* .tensor_upload = */ cu_tensor_upload,
    /* .tensor_download = */ cu_tensor_download,
    /* .kv_alloc = */ cu_kv_alloc,
    /* .kv_free = */ cu_kv_free,
    /* .kv_page_read = */ cu_kv_page_read,
    /* .kv_page_write = */ cu_kv_page_write,
    /* .kv_page_copy = */ cu_kv_page_copy,
    /* .set_batch = */ cu_set_batch,
    /* .embed = */ cu_embed,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .matmul = */ cu_matmul,
    /* .rope = */ cu_rope,
    /* .swiglu = */ cu_swiglu,
    /* .add = */ cu_add,
    /* .kv_store = */ cu_kv_store,
    /* .attention = */ cu_attention_op,
    /* .gather_rows = */ cu_gather_rows,
    /* .sample = */ cu_sample,
    /* .sync = */ cu_sync,
    /* .host_alloc = */ cu_host_alloc,
    /* .host_free = */ cu_host_free,
    /* .kv_page_read_async = */ cu_kv_page_read_async,
    /* .kv_page_write_async = */ cu_kv_page_write_async,
    /* .fence_done = */ cu_fence_done,
    /* .fence_wait = */ cu_fence_wait,
    /* .compute_after = */ cu_compute_after,
    /* .add_bias = */ cu_add_bias_op,
    /* .moe_ffn = */ cu_moe_ffn_op,
    /* .memo_save = */ cu_memo_save,
    /* .memo_replay = */ cu_memo_replay,
};

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    return atoi(s);
}

extern "C" ns_status ns_backend_cuda_create(int device, ns_backend **out, ns_error *err) {
    *out = NULL;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cuda: no usable GPU (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (device < 0 || device >= n_dev)
        return ns_fail(err, NS_ERR_RANGE, "cuda: device %d does not exist (%d found)", device, n_dev);
    ns_backend *be = (ns_backend *)calloc(1, sizeof *be);
    cu_impl *c = (cu_impl *)calloc(1, sizeof *c);
    ns_status rc = NS_OK;
    if (!be || !c) {
        free(be);
        free(c);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    be->ops = &cuda_ops;
    be->impl = c;
    c->device = device;
    cudaDeviceProp prop;
    if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cannot open device %d", device);
        goto fail;
    }
    if (prop.major < 8) {
        rc = ns_fail(err, NS_ERR_UNSUPPORTED, "cuda: %s (sm_%d%d) lacks bf16 tensor cores; need sm_80 or newer",
                     prop.name, prop.major, prop.minor);
        goto fail;
    }
    c->n_sm = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    c->cc_major = prop.major;
    if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->staging_done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->compute_ev, cudaEventDisableTiming) != cudaSuccess) {
        rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cannot create a stream");
        goto fail;
    }
    c->gap_probe = env_int("NS_CUDA_GAP_PROBE", 0) != 0;
    c->argmax_mapped = env_int("NS_CUDA_ARGMAX_MAPPED", 1) != 0;
    if (c->gap_probe && (cudaEventCreate(&c->probe_begin) != cudaSuccess ||
                         cudaEventCreate(&c->probe_end[0]) != cudaSuccess ||
                         cudaEventCreate(&c->probe_end[1]) != cudaSuccess ||
                         cudaEventCreate(&c->probe_mid) != cudaSuccess ||
                         cudaEventCreate(&c->probe_graph) != cudaSuccess)) {
        rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cannot create the gap probe's events");
        goto fail;
    }
    c->fence_ev = (cudaEvent_t *)calloc(CU_FENCES, sizeof(cudaEvent_t));
    if (!c->fence_ev) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < CU_FENCES; i++)
        if (cudaEventCreateWithFlags(&c->fence_ev[i], cudaEventDisableTiming) != cudaSuccess) {
            rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cannot create the copy fences");
            goto fail;
        }
    c->next_fence = 1;
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cublasLtCreate failed");
        goto fail;
    }
    c->lt_ws_bytes = (size_t)64 << 20;
    if (cudaMalloc(&c->lt_ws, c->lt_ws_bytes) != cudaSuccess) {
        rc = ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate the GEMM workspace");
        goto fail;
    }
    c->graphs_enabled = env_int("NS_CUDA_GRAPHS", 1);
    /* the step memo (cu_memo_save): 1 with its direct launch, 2 without
     * (memo_launch_direct), 0 off */
    c->memo_enabled = env_int("NS_CUDA_MEMO", 1);
    if (c->memo_enabled < 0 || c->memo_enabled > 2) c->memo_enabled = 1;
    c->fusion = env_int("NS_CUDA_FUSION", 1);
    /* off until measured on the H200 (docs/cuda.md, v17) */
    c->dec_fuse = env_int("NS_CUDA_DEC_FUSE", 0);
    c->dec_early = env_int("NS_CUDA_DEC_EARLY", 0);
    /* docs/cuda.md v23: prefill steps' q/k-norm + RoPE + KV store and
     * add + RMSNorm fused like decode's (the tape run eagerly) */
    c->prefill_fuse = env_int("NS_CUDA_PREFILL_FUSE", 1) != 0;
    c->prefill_lean = env_int("NS_CUDA_PREFILL_LEAN", 3) & 3;
    c->act_nc = env_int("NS_CUDA_ACT_NC", 1) != 0; /* cu_ld_act4 (cuda_internal.cuh) */
    /* cu_launch: a kernel launched right after a copy does not use PDL */
    c->pdl_anchors = env_int("NS_CUDA_PDL_ANCHOR", 1);
    c->pdl = env_int("NS_CUDA_PDL", 1);
    c->pdl_gemv = env_int("NS_CUDA_PDL_GEMV", 0); /* v18: 0 measured 3% faster at 1k batch 1 */
    /* off by default: measured slower on H200 (docs/cuda.md, v7) */
    c->prefetch = env_int("NS_CUDA_PREFETCH", 4); /* MB; docs/cuda.md v21 */
    if (c->prefetch < 0 || c->prefetch > 1024) c->prefetch = 4;
    /* on: ~1.5% at 1k batch 1. Off from run B to v18 (docs/cuda.md): with
     * them on, the q/k-norm + RoPE + store kernel's .nc loads of v were
     * scheduled above its PDL wait, so the cache got the previous step's
     * V row; those loads are coherent (.cg) now. */
    c->early_loads = env_int("NS_CUDA_EARLY_LOADS", 1);
    c->early_mask =
        env_int("NS_CUDA_EARLY_MASK", CU_EARLY_ADDNORM | CU_EARLY_QKNORM | CU_EARLY_ATTN | CU_EARLY_ATTN_KV);
    /* fewest keys per decode-attention split (a multiple of 64) */
    c->dec_mma_div = env_int("NS_CUDA_DEC_MMA_DIV", 8); /* choose_mma_splits */
    if (c->dec_mma_div < 1 || c->dec_mma_div > 64 || (c->dec_mma_div & (c->dec_mma_div - 1))) c->dec_mma_div = 8;
    c->dec_mma_tiles = env_int("NS_CUDA_DEC_MMA_TILES", 2);
    if (c->dec_mma_tiles < 1 || c->dec_mma_tiles > 16) c->dec_mma_tiles = 2;
    c->dec_mma_ctas = env_int("NS_CUDA_DEC_MMA_CTAS", 2);
    if (c->dec_mma_ctas < 0 || c->dec_mma_ctas > 64) c->dec_mma_ctas = 2;
    c->fp8_stages = env_int("NS_CUDA_FP8_STAGES", 0); /* cu_attn_decode_mma_fp8 */
    if (c->fp8_stages != 2 && c->fp8_stages != 3) c->fp8_stages = 0;
    c->qgemv_early = env_int("NS_CUDA_QGEMV_EARLY", 0) == 1; /* qgemv_early (cuda_quant.cu) */
    c->fp8r_ctas_aim = env_int("NS_CUDA_FP8R_CTAS", 0); /* choose_fp8r_splits */
    if (c->fp8r_ctas_aim < 0) c->fp8r_ctas_aim = 0;
    c->fp8r_tiles = env_int("NS_CUDA_FP8R_TILES", 1);
    if (c->fp8r_tiles < 1) c->fp8r_tiles = 1;
    c->fp8r_min_len = env_int("NS_CUDA_FP8R_MIN_LEN", 8192);
    if (c->fp8r_min_len < 0) c->fp8r_min_len = 8192;
    c->split_keys = env_int("NS_CUDA_SPLIT_KEYS", 64);
    if (c->split_keys < 64 || c->split_keys % 64) c->split_keys = 64;
    c->l2_bytes = (size_t)prop.l2CacheSize;
    /* measured on H200 (docs/cuda.md): the GEMV kernel beats cuBLASLt up
     * to 2 input rows; from 4 rows on cuBLASLt is as fast or faster */
    c->gemv_max = env_int("NS_CUDA_GEMV_MAX", 2);
    /* 128 warps/SM splits gate/up (12288 row pairs) in two along K:
     * measured 1% faster decode on H200 than 64 (docs/cuda.md, v11) */
    c->gemv_warps = env_int("NS_CUDA_GEMV_WARPS", 128);
    if (c->gemv_warps < 1) c->gemv_warps = 128;
    /* cuda_gemv_bulk.cu: off until its decode step measures faster than
     * k_gemv's (docs/cuda.md v24) */
    c->gemv_bulk = env_int("NS_CUDA_GEMV_BULK", 0);
    c->gemv_bulk_ctas = env_int("NS_CUDA_GEMV_BULK_CTAS", 1);
    if (c->gemv_bulk_ctas < 1 || c->gemv_bulk_ctas > 4) c->gemv_bulk_ctas = 1;
    c->gemv_bulk_stage = env_int("NS_CUDA_GEMV_BULK_STAGE_KB", 16) * 1024;
    if (c->gemv_bulk_stage < 4096 || c->gemv_bulk_stage > 65536 || c->gemv_bulk_stage % 4096)
        c->gemv_bulk_stage = 16384;
    /* two CTAs per SM: the next GEMV's CTAs are resident (and copying)
     * while this one's run */
    c->gemv_bulk_smem = env_int("NS_CUDA_GEMV_BULK_SMEM_KB", 112) * 1024;
    if (c->gemv_bulk_smem < 16384 || c->gemv_bulk_smem > (int)c->smem_optin)
        c->gemv_bulk_smem = (int)(c->smem_optin < 114688 ? c->smem_optin : 114688);
    if (!cu_gemv_bulk_init(c)) {
        rc = ns_fail(err, NS_ERR_INTERNAL, "cuda: cannot configure the bulk GEMV");
        goto fail;
    }
    /* cuda_mlp.cu: 1 = on, launched without PDL (default: 1k batch 1
     * -0.08 ms, batch 2 -0.5 ms, docs/cuda.md v27); 2 = on with PDL; 0 = off */
    c->mlp_persist = env_int("NS_CUDA_MLP", 1);
    if (c->mlp_persist < 0 || c->mlp_persist > 2) c->mlp_persist = 1;
    c->mlp_ctas = env_int("NS_CUDA_MLP_CTAS", 4);
    if (c->mlp_ctas < 1 || c->mlp_ctas > 8) c->mlp_ctas = 4;
    /* its tail: the residual add, the next RMSNorm and q/k/v in the same
     * kernel; off: measured +0.12 ms at 1k batch 1 (docs/cuda.md v27) */
    c->mlp_tail = env_int("NS_CUDA_MLP_TAIL", 0);
    /* NS_CUDA_MLP_PROBE=1: the persistent MLP stamps its phases per CTA
     * (cu_mlp_probe_read, ns_cuda_mlp_probe_stats; cu_mlp_init sizes it) */
    c->mlp_probe_cap = env_int("NS_CUDA_MLP_PROBE", 0) == 1 ? 1 : 0;
    /* the step's first and last row ops fused (cuda_tape_fuse.cu 5, 6) */
    c->row_fuse = env_int("NS_CUDA_ROW_FUSE", 3) & 3;
    if (!cu_mlp_init(c)) {
        rc = ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate the decode MLP barrier");
        goto fail;
    }
    c->prof_ev = (cudaEvent_t *)calloc(2 * CU_PROF_EVENTS, sizeof(cudaEvent_t));
    c->prof_label_of = (int32_t *)calloc(CU_PROF_EVENTS, sizeof(int32_t));
    if (!c->prof_ev || !c->prof_label_of) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rc = ensure_argmax(c, 1024, err);
    if (rc != NS_OK) goto fail;
    rc = cu_meta_grow(be, 512, 128, 256, 256, 256, err);
    if (rc != NS_OK) goto fail;
    if (env_int("NS_CUDA_PROFILE", 0)) ns_cuda_set_profiling(be, 1);
    *out = be;
    return NS_OK;
fail:
    (void)cudaGetLastError();
    cu_destroy(be);
    return rc;
}

/* ================================================================ extras
 * (the switches and device facts of cuda.h: cuda_switches.cu) */

extern "C" void ns_cuda_set_profiling(ns_backend *be, int on) {
    cu_impl *c = IMPL(be);
    flush(be);
    if (on && !c->prof_ev[0]) {
        for (int i = 0; i < 2 * CU_PROF_EVENTS; i++)
            if (cudaEventCreate(&c->prof_ev[i]) != cudaSuccess) {
                (void)cudaGetLastError();
                return;
            }
    }
    c->profiling = on;
}

extern "C" void ns_cuda_profile_report(ns_backend *be, FILE *f) {
    cu_impl *c = IMPL(be);
    flush(be);
    cudaStreamSynchronize(c->stream);
    prof_resolve(c);
    double total = 0;
    for (int i = 0; i < c->n_prof; i++) total += c->prof[i].ms;
    /* selection sort by time: a handful of labels */
    for (int i = 0; i < c->n_prof; i++) {
        int best = i;
        for (int j = i + 1; j < c->n_prof; j++)
            if (c->prof[j].ms > c->prof[best].ms) best = j;
        cu_prof_label t = c->prof[i];
        c->prof[i] = c->prof[best];
        c->prof[best] = t;
        fprintf(f, "    %-34s %7lld calls %10.3f ms %5.1f%%\n", c->prof[i].name, (long long)c->prof[i].calls,
                c->prof[i].ms, total > 0 ? 100.0 * c->prof[i].ms / total : 0.0);
    }
    c->n_prof = 0;
}

/* Internal accessors for cuda_bench.cu */
cu_impl *cu_impl_of(ns_backend *be) { return IMPL(be); }
void cu_flush(ns_backend *be) { flush(be); }
