/* cuda_tape_fuse.cu — the fused kernels a recorded op tape runs instead
 * of its ops (cu_tape_try_fuse, called by cuda_backend.cu's run_tape for
 * each op), the check that lets the decode kernels read constants
 * before their PDL wait (cu_tape_weights_unwritten), and the walk that
 * finds a prefill's F32 outputs nobody reads (cu_tape_f32_dead).
 *
 * Invariant: a pattern is taken only when it is checked completely here
 * (kinds, aliasing, shapes, alignment) before anything is launched; a
 * pattern that does not match consumes nothing and the plain op runs.
 * The fused kernels compute what the ops would (bit for bit, or to float
 * rounding where cuda_decode.cu says so).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

static bool same_view(const ns_tensor *a, const ns_tensor *b) {
    return a->data == b->data && a->rows == b->rows && a->cols == b->cols && a->dtype == b->dtype;
}

static bool al16p(const void *p) { return ((uintptr_t)p % 16) == 0; }

/* Would op_matmul take the GEMV path for this op? */
static bool gemv_eligible(const cu_impl *c, const cu_op *op) {
    const ns_tensor *out = &op->a, *in = &op->b, *w = &op->c;
    return op->kind == OP_MATMUL && out->dtype == NS_DT_F32 && in->dtype == NS_DT_F32 && w->dtype == NS_DT_BF16 &&
           in->rows >= 1 && in->rows <= c->gemv_max && in->cols % 8 == 0 && w->cols == in->cols &&
           out->rows == in->rows && out->cols == w->rows && al16p(w->data) && al16p(in->data) &&
           out->data != in->data;
}


/* Prefetch plan: the weights of the first matmuls at or after ops[j]
 * (stopping at the first non-matmul after a matmul), their first
 * c->prefetch MB (at most 2/3 of L2). */
static void plan_prefetch(const cu_impl *c, const cu_op *ops, int32_t j, int32_t n, cu_prefetch *pf) {
    memset(pf, 0, sizeof *pf);
    if (c->prefetch <= 0 || !c->l2_bytes) return;
    size_t budget = c->l2_bytes * 2 / 3;
    if (((size_t)c->prefetch << 20) < budget) budget = (size_t)c->prefetch << 20;
    int k = 0;
    bool seen = false;
    for (; j < n && k < 3 && budget > 0; j++) {
        if (ops[j].kind != OP_MATMUL) {
            if (seen) break;
            if (ops[j].kind == OP_RMSNORM || ops[j].kind == OP_ADD || ops[j].kind == OP_GATHER) break;
            continue; /* skip attention / kv ops between here and the matmul */
        }
        seen = true;
        if (ops[j].c.dtype != NS_DT_BF16) break;
        size_t b = ns_tensor_bytes(&ops[j].c);
        if (b > budget) b = budget;
        if (b > 0xFFFF0000u) b = 0xFFFF0000u;
        pf->p[k] = ops[j].c.data;
        pf->bytes[k] = (uint32_t)b;
        budget -= b;
        k++;
    }
}

/* Would op_matmul take the quantized GEMV path (cuda_quant.cu) for this op? */
static bool qgemv_eligible(const cu_op *op) {
    const ns_tensor *out = &op->a, *in = &op->b, *w = &op->c;
    return op->kind == OP_MATMUL && ns_dtype_is_quant((ns_dtype)w->dtype) && out->dtype == NS_DT_F32 &&
           in->dtype == NS_DT_F32 && in->rows >= 1 && in->rows <= CU_QGEMV_MAX && w->cols == in->cols &&
           out->rows == in->rows && out->cols == w->rows && out->data != in->data;
}

/* try_fuse's GEMV patterns on quantized weights: gate/up + SwiGLU in one
 * launch, and up to 3 matmuls sharing the input in one launch (one
 * activation quantization each). Weights of a group must share the type;
 * anything else runs unfused through op_matmul. */
static int32_t try_fuse_quant(cu_impl *c, const cu_op *ops, int32_t i, int32_t n) {
    const cu_op *o = &ops[i];
    int pi;
    int32_t g = 1;
    while (g < 3 && i + g < n && qgemv_eligible(&ops[i + g]) && same_view(&ops[i + g].b, &o->b) &&
           ops[i + g].c.dtype == o->c.dtype)
        g++;
    if (g >= 2 && i + 2 < n && ops[i + 2].kind == OP_SWIGLU) {
        const cu_op *u = &ops[i + 1], *sw = &ops[i + 2];
        const ns_tensor *gt = &o->a, *up = &u->a, *out = &sw->a;
        if (same_view(&sw->b, gt) && same_view(&sw->c, up) && gt->cols == up->cols && out->dtype == NS_DT_F32 &&
            out->rows == gt->rows && out->cols == gt->cols && gt->data != up->data && out->data != up->data &&
            out->data != o->b.data) {
            cu_prof_begin(c, "fused qgemv gate/up+swiglu", &pi);
            cu_note_write(c, gt);
            cu_note_write(c, up);
            bf16 *obf = cu_shadow_produce(c, out);
            cu_quant_gemv_swiglu(c, (float *)gt->data, (float *)up->data, (float *)out->data, obf, &o->c, &u->c,
                                 (const float *)o->b.data, (int)o->b.rows, (int)o->b.cols);
            cu_prof_end(c, pi);
            return 3;
        }
    }
    if (g < 2) return 0;
    float *outs[3];
    const ns_tensor *ws[3];
    for (int32_t j = 0; j < g; j++) {
        outs[j] = (float *)ops[i + j].a.data;
        ws[j] = &ops[i + j].c;
    }
    cu_prof_begin(c, "fused qgemv", &pi);
    cu_quant_gemv_multi(c, g, outs, ws, (const float *)o->b.data, (int)o->b.rows, (int)o->b.cols);
    cu_prof_end(c, pi);
    for (int32_t j = 0; j < g; j++) cu_note_write(c, &ops[i + j].a);
    return g;
}

/* After the MLP ops (down output d): x += d; xn = rmsnorm(x) into d's own
 * buffer; 1-3 GEMVs of xn (forward.c's next layer up to q/k/v). Fills the
 * tail of ms and returns how many ops it covers (0: no tail; ms keeps
 * qkv_n 0). Checked as pattern 3 and 1b check theirs, plus: no output
 * overlaps what the kernel reads or another output. */
static int32_t match_mlp_tail(const cu_impl *c, const cu_op *ops, int32_t j, int32_t n, const ns_tensor *d,
                              cu_mlp_shape *ms) {
    if (!c->mlp_tail || j + 2 >= n || ops[j].kind != OP_ADD || ops[j + 1].kind != OP_RMSNORM) return 0;
    const cu_op *ad = &ops[j], *nm = &ops[j + 1];
    const ns_tensor *x = &ad->a, *y = &ad->b, *xn = &nm->a, *w = &nm->c;
    if (!same_view(y, d) || !same_view(&nm->b, x) || !same_view(xn, d) || x->dtype != NS_DT_F32 ||
        w->dtype != NS_DT_F32 || x->rows != d->rows || x->cols != d->cols || w->rows * w->cols != x->cols ||
        !al16p(x->data) || !al16p(d->data) || !al16p(w->data) || cu_tensors_overlap(x, d))
        return 0;
    int32_t g = 0;
    while (g < 3 && j + 2 + g < n && gemv_eligible(c, &ops[j + 2 + g]) && same_view(&ops[j + 2 + g].b, xn)) {
        const ns_tensor *o = &ops[j + 2 + g].a;
        if (cu_tensors_overlap(o, x) || cu_tensors_overlap(o, d)) break;
        bool apart = true;
        for (int32_t q = 0; q < g; q++) apart = apart && !cu_tensors_overlap(o, &ops[j + 2 + q].a);
        if (!apart) break;
        g++;
    }
    if (g == 0) return 0;
    ms->qkv_n = g;
    ms->res = (float *)x->data;
    ms->xn = (float *)xn->data;
    ms->norm_w = (const float *)w->data;
    ms->eps = nm->f0;
    for (int32_t q = 0; q < g; q++) {
        ms->qkv_w[q] = (const bf16 *)ops[j + 2 + q].c.data;
        ms->qkv_out[q] = (float *)ops[j + 2 + q].a.data;
        ms->qkv_m[q] = ops[j + 2 + q].c.rows;
    }
    return 2 + g;
}

/* Is t a contiguous F32 row block the norm kernels take with float4
 * lanes (k_rmsnorm_block's vector path, whose sums they reproduce)? */
static bool norm_rows_ok(const ns_tensor *t) {
    return t->dtype == NS_DT_F32 && t->cols > 1024 && t->cols % 4 == 0 && al16p(t->data);
}

/* 5. x = embed(tokens); xn = rmsnorm(x): one kernel (the step's first
 * two; bf16 or F32 tables, the quantized ones keep their embed op).
 * 6. x += y; hid = gather_rows(x); hid = rmsnorm(hid): one kernel (the
 * step's last row ops before the LM head; x stays fully added).
 * Returns the ops consumed, 0 for no match (cuda_fused.cu
 * k_add_rmsnorm's SRC modes; bit-identical to the ops). */
static int32_t try_fuse_rows(cu_impl *c, const cu_op *ops, int32_t i, int32_t n) {
    const cu_op *o = &ops[i];
    int pi;
    cu_prefetch pf;
    if ((c->row_fuse & 1) && o->kind == OP_EMBED && i + 1 < n && ops[i + 1].kind == OP_RMSNORM) {
        const cu_op *nm = &ops[i + 1];
        const ns_tensor *x = &o->a, *tab = &o->b, *out = &nm->a, *w = &nm->c;
        if (!same_view(&nm->b, x) || !norm_rows_ok(x) || !norm_rows_ok(out) || out->rows != x->rows ||
            out->cols != x->cols || (tab->dtype != NS_DT_BF16 && tab->dtype != NS_DT_F32) || tab->cols != x->cols ||
            !al16p(tab->data) || w->dtype != NS_DT_F32 || w->rows * w->cols != x->cols || !al16p(w->data) ||
            cu_tensors_overlap(out, x) || x->rows > c->meta.n_tokens)
            return 0;
        plan_prefetch(c, ops, i + 2, n, &pf); /* layer 0's q/k/v */
        cu_prof_begin(c, "fused embed+rmsnorm", &pi);
        cu_note_write(c, x);
        bf16 *obf = cu_shadow_produce(c, out);
        const bool dead = obf && cu_prefill_out_dead(c, ops, i + 2, n, out);
        if (dead) c->stat_f32_dropped++;
        cu_launch_embed_rmsnorm(c, (float *)x->data, tab, dead ? NULL : (float *)out->data, obf,
                                (const float *)w->data, x->rows, (int)x->cols, nm->f0, &pf);
        cu_prof_end(c, pi);
        return 2;
    }
    if ((c->row_fuse & 2) && o->kind == OP_ADD && i + 2 < n && ops[i + 1].kind == OP_GATHER &&
        ops[i + 2].kind == OP_RMSNORM) {
        const cu_op *ga = &ops[i + 1], *nm = &ops[i + 2];
        const ns_tensor *x = &o->a, *y = &o->b, *hid = &ga->a, *w = &nm->c;
        if (!same_view(&ga->b, x) || !same_view(&nm->a, hid) || !same_view(&nm->b, hid) || !norm_rows_ok(x) ||
            !norm_rows_ok(y) || !norm_rows_ok(hid) || y->rows * y->cols != x->rows * x->cols ||
            hid->cols != x->cols || hid->rows > c->meta.n_logits || w->dtype != NS_DT_F32 ||
            w->rows * w->cols != x->cols || !al16p(w->data) || cu_tensors_overlap(hid, x) ||
            cu_tensors_overlap(hid, y))
            return 0;
        plan_prefetch(c, ops, i + 3, n, &pf); /* the LM head */
        cu_prof_begin(c, "fused add+gather+rmsnorm", &pi);
        cu_note_write(c, x);
        bf16 *obf = cu_shadow_produce(c, hid);
        cu_launch_add_gather_rmsnorm(c, (float *)x->data, (const float *)y->data, (float *)hid->data, obf,
                                     (const float *)w->data, x->rows, (int)x->cols, nm->f0, (int)hid->rows, &pf);
        cu_prof_end(c, pi);
        return 3;
    }
    return 0;
}

/* Runs the engine's fixed op sequences of a recorded tape as fused
 * kernels (see cuda_fused.cu). Returns the number of ops consumed, 0 when
 * nothing at ops[i] can be fused. Each pattern is checked completely
 * (kinds, aliasing, shapes) before anything runs. */
int32_t cu_tape_try_fuse(ns_backend *be, const cu_op *ops, int32_t i, int32_t n) {
    cu_impl *c = cu_impl_of(be);
    const cu_op *o = &ops[i];
    int pi;
    if (qgemv_eligible(o)) return try_fuse_quant(c, ops, i, n);
    /* 0. batch-1/2 decode: RMSNorm / residual add folded into the GEMVs
     * (cuda_decode.cu), ahead of the patterns below that they replace */
    if (c->dec_fuse) {
        cu_gemv_dec_args dg;
        const char *label;
        const int32_t used = cu_dec_match(c, ops, i, n, &dg, &label);
        if (used > 0) {
            cu_prof_begin(c, label, &pi);
            cu_dec_run(c, ops, i, used, &dg);
            cu_prof_end(c, pi);
            return used;
        }
    }
    /* 5, 6. the step's first and last row ops */
    if (c->row_fuse) {
        const int32_t used = try_fuse_rows(c, ops, i, n);
        if (used > 0) return used;
    }
    /* 1a. gate and up GEMVs followed by swiglu: one launch with the
     * SwiGLU epilogue */
    if (gemv_eligible(c, o) && i + 2 < n && gemv_eligible(c, &ops[i + 1]) && same_view(&ops[i + 1].b, &o->b) &&
        ops[i + 2].kind == OP_SWIGLU) {
        const cu_op *u = &ops[i + 1], *sw = &ops[i + 2];
        const ns_tensor *gt = &o->a, *up = &u->a, *out = &sw->a;
        if (same_view(&sw->b, gt) && same_view(&sw->c, up) && gt->cols == up->cols && out->dtype == NS_DT_F32 &&
            out->rows == gt->rows && out->cols == gt->cols && gt->data != up->data && out->data != up->data &&
            out->data != o->b.data) {
            /* 1a'. followed by the down GEMV of the SwiGLU output: the
             * persistent MLP kernel (cuda_mlp.cu), when it is on; its
             * output may alias x (forward.c writes it into xn), not what
             * phase A writes */
            const cu_op *dn = i + 3 < n ? &ops[i + 3] : NULL;
            if (c->mlp_persist && dn && gemv_eligible(c, dn) && same_view(&dn->b, out) &&
                !cu_tensors_overlap(&dn->a, out) && !cu_tensors_overlap(&dn->a, up) && !cu_tensors_overlap(&dn->a, gt)) {
                cu_mlp_shape ms;
                memset(&ms, 0, sizeof ms);
                ms.x = (const float *)o->b.data;
                ms.wg = (const bf16 *)o->c.data;
                ms.wu = (const bf16 *)u->c.data;
                ms.wd = (const bf16 *)dn->c.data;
                ms.gate = (float *)gt->data;
                ms.up = (float *)up->data;
                ms.s = (float *)out->data;
                ms.d = (float *)dn->a.data;
                ms.n = (int)o->b.rows;
                ms.k = o->b.cols;
                ms.m = gt->cols;
                ms.h = dn->c.rows;
                int32_t tail = match_mlp_tail(c, ops, i + 4, n, &dn->a, &ms);
                if (tail && !cu_mlp_fits(c, &ms)) { /* a shape only the tail cannot take */
                    tail = 0;
                    ms.qkv_n = 0;
                }
                if (cu_mlp_fits(c, &ms)) {
                    cu_prof_begin(c, tail ? "persistent mlp + norm + q/k/v" : "persistent mlp gate/up+swiglu+down",
                                  &pi);
                    cu_note_write(c, gt);
                    cu_note_write(c, up);
                    ms.s_bf = cu_shadow_produce(c, out); /* after gt's note: out may be gt */
                    cu_note_write(c, &dn->a);
                    if (tail) {
                        cu_note_write(c, &ops[i + 4].a);                     /* the residual */
                        ms.xn_bf = cu_shadow_produce(c, &ops[i + 5].a);      /* the norm's output (d's buffer) */
                        for (int32_t j = 0; j < ms.qkv_n; j++) cu_note_write(c, &ops[i + 6 + j].a);
                    }
                    cu_mlp_decode(c, &ms);
                    cu_prof_end(c, pi);
                    return 4 + tail;
                }
            }
            cu_prof_begin(c, "fused gemv gate/up+swiglu", &pi);
            cu_note_write(c, gt);
            cu_note_write(c, up);
            bf16 *obf = cu_shadow_produce(c, out);
            cu_gemv_swiglu(c, (float *)gt->data, (float *)up->data, (float *)out->data, obf,
                           (const bf16 *)o->c.data, (const bf16 *)u->c.data, gt->cols, (const float *)o->b.data,
                           (int)o->b.rows, (int)o->b.cols);
            cu_prof_end(c, pi);
            return 3;
        }
    }
    /* 1b. matmuls sharing one input, GEMV path: one launch */
    if (gemv_eligible(c, o)) {
        int32_t g = 1;
        while (g < 3 && i + g < n && gemv_eligible(c, &ops[i + g]) && same_view(&ops[i + g].b, &o->b)) g++;
        if (g < 2) return 0;
        float *outs[3];
        const bf16 *ws[3];
        int64_t ms[3];
        for (int32_t j = 0; j < g; j++) {
            outs[j] = (float *)ops[i + j].a.data;
            ws[j] = (const bf16 *)ops[i + j].c.data;
            ms[j] = ops[i + j].c.rows;
        }
        char label[48];
        snprintf(label, sizeof label, "fused gemv x%d k=%lld", g, (long long)o->b.cols);
        cu_prof_begin(c, label, &pi);
        cu_gemv_multi(c, g, outs, ws, ms, (const float *)o->b.data, (int)o->b.rows, (int)o->b.cols);
        cu_prof_end(c, pi);
        for (int32_t j = 0; j < g; j++) cu_note_write(c, &ops[i + j].a);
        return g;
    }
    /* 2. [rmsnorm q heads, rmsnorm k heads,] rope q, rope k, kv_store k v */
    if (c->kv && (o->kind == OP_RMSNORM || o->kind == OP_ROPE)) {
        const ns_kv_layout *l = &be->kv;
        const int D = l->head_dim;
        const bool norm = o->kind == OP_RMSNORM;
        const int32_t base = norm ? i + 2 : i;
        if (base + 3 > n || D % 64 || D > 256) return 0;
        /* FP8 pages append a page-head's rows in order, rescaling the rows
         * before when the scale grows (cu_fp8_append_row): one warp per
         * row is safe only with one new row per sequence (decode) */
        if (l->dtype == NS_DT_FP8_E4M3 && c->tape_eager_only) return 0;
        const cu_op *rq = &ops[base], *rk = &ops[base + 1], *st = &ops[base + 2];
        if (rq->kind != OP_ROPE || rk->kind != OP_ROPE || st->kind != OP_KV_STORE) return 0;
        const ns_tensor *q = &rq->a, *k = &rk->a, *v = &st->b;
        const int T = c->meta.n_tokens, H = rq->i0, KVH = l->n_kv_heads;
        if (q->rows != T || k->rows != T || v->rows != T || rq->i1 != D || rk->i1 != D || rk->i0 != KVH ||
            q->cols != (int64_t)H * D || k->cols != (int64_t)KVH * D || v->cols != (int64_t)KVH * D ||
            st->a.data != k->data || st->a.cols != k->cols || rq->b.data != rk->b.data ||
            rq->b.dtype != NS_DT_F32 || q->dtype != NS_DT_F32 || k->dtype != NS_DT_F32 || v->dtype != NS_DT_F32 ||
            q->data == k->data || v->data == k->data || v->data == q->data || st->i0 < 0 || st->i0 >= l->n_layers)
            return 0;
        const float *qn = NULL, *kn = NULL;
        float eps = 0.f;
        if (norm) {
            const cu_op *nq = &ops[i], *nk = &ops[i + 1];
            if (nk->kind != OP_RMSNORM || nq->a.data != q->data || nq->b.data != q->data || nk->a.data != k->data ||
                nk->b.data != k->data || nq->a.cols != D || nk->a.cols != D || nq->a.rows != (int64_t)T * H ||
                nk->a.rows != (int64_t)T * KVH || nq->c.dtype != NS_DT_F32 || nk->c.dtype != NS_DT_F32 ||
                nq->c.rows * nq->c.cols != D || nk->c.rows * nk->c.cols != D || nq->f0 != nk->f0)
                return 0;
            qn = (const float *)nq->c.data;
            kn = (const float *)nk->c.data;
            eps = nq->f0;
        }
        cu_prefetch pf;
        plan_prefetch(c, ops, base + 3, n, &pf); /* the output projection after attention */
        cu_prof_begin(c, norm ? "fused qk_norm+rope+kv_store" : "fused rope+kv_store", &pi);
        cu_launch_qk_norm_rope_store(c, l, st->i0, (float *)q->data, (float *)k->data, (const float *)v->data, T, H,
                                     qn, kn, eps, (const float *)rq->b.data, &pf);
        cu_prof_end(c, pi);
        cu_note_write(c, q);
        cu_note_write(c, k);
        return base + 3 - i;
    }
    /* 4. (prefill) t = in @ w^T; x += t, with t read by nobody after:
     * the GEMM adds into x (beta 1) and t is never written. One F32
     * write and read of t less per projection; the RMSNorm after runs as
     * its own op (not pattern 3), the same sums as k_add_rmsnorm. */
    if ((c->prefill_lean & 2) && c->tape_eager_only && o->kind == OP_MATMUL && i + 1 < n &&
        ops[i + 1].kind == OP_ADD) {
        const ns_tensor *t = &o->a, *in = &o->b, *w = &o->c, *x = &ops[i + 1].a;
        if (same_view(&ops[i + 1].b, t) && t->dtype == NS_DT_F32 && in->dtype == NS_DT_F32 &&
            x->dtype == NS_DT_F32 && w->dtype == NS_DT_BF16 && in->rows > c->gemv_max && x->rows == t->rows &&
            x->cols == t->cols && w->rows == t->cols && w->cols == in->cols && in->rows == t->rows &&
            !cu_tensors_overlap(x, t) && !cu_tensors_overlap(x, in) && !cu_tensors_overlap(x, w) &&
            cu_tape_f32_dead(c, ops, i + 2, n, t, false)) {
            cu_prof_begin(c, "matmul + residual (beta 1)", &pi);
            cu_matmul_op(c, x, in, w, true);
            cu_prof_end(c, pi);
            c->stat_gemm_residual++;
            cu_note_write(c, t); /* its shadow, if any, no longer describes it */
            return 2;
        }
    }
    /* 3. x += y; xn = rmsnorm(x) */
    if (o->kind == OP_ADD && i + 1 < n && ops[i + 1].kind == OP_RMSNORM) {
        const cu_op *nm = &ops[i + 1];
        const ns_tensor *x = &o->a, *y = &o->b, *out = &nm->a, *w = &nm->c;
        if (!same_view(&nm->b, x) || x->dtype != NS_DT_F32 || y->dtype != NS_DT_F32 || out->dtype != NS_DT_F32 ||
            w->dtype != NS_DT_F32 || x->cols <= 1024 || x->cols % 4 || y->rows * y->cols != x->rows * x->cols ||
            out->rows != x->rows || out->cols != x->cols || w->rows * w->cols != x->cols || !al16p(x->data) ||
            !al16p(y->data) || !al16p(out->data) || !al16p(w->data))
            return 0;
        /* out may alias y (the engine normalizes into the buffer it just
         * added from): each thread reads its y elements before writing the
         * same out elements. */
        cu_prefetch pf;
        plan_prefetch(c, ops, i + 2, n, &pf); /* q/k/v or gate/up next */
        cu_prof_begin(c, "fused add+rmsnorm", &pi);
        cu_note_write(c, x);
        bf16 *obf = cu_shadow_produce(c, out);
        /* prefill: no F32 xn when only GEMMs read it (through obf) */
        const bool dead = obf && cu_prefill_out_dead(c, ops, i + 2, n, out);
        if (dead) c->stat_f32_dropped++;
        cu_launch_add_rmsnorm(c, (float *)x->data, (const float *)y->data, dead ? NULL : (float *)out->data, obf,
                              (const float *)w->data, x->rows, (int)x->cols, nm->f0, &pf);
        cu_prof_end(c, pi);
        return 2;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* True when no op of the tape writes (as its output `a`) any byte of a
 * constant the fused decode kernels read before their PDL wait: RMSNorm
 * weights and RoPE frequencies (and matmul weights). Kernels before the
 * tape cannot overlap it: set_batch's uploads sit between them in the
 * stream. */
bool cu_tape_weights_unwritten(cu_impl *c, const cu_op *ops, int32_t n, bool *kv_copy) {
    *kv_copy = false;
    if (n > c->cap_wr) {
        uintptr_t *p = (uintptr_t *)realloc(c->wr, (size_t)n * 2 * sizeof *p);
        if (!p) return false;
        c->wr = p;
        c->cap_wr = n;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (ops[i].kind == OP_KV_COPY) *kv_copy = true;
        if (!ops[i].a.data) continue;
        c->wr[2 * k] = (uintptr_t)ops[i].a.data;
        c->wr[2 * k + 1] = (uintptr_t)ops[i].a.data + ns_tensor_bytes(&ops[i].a);
        k++;
    }
    qsort(c->wr, (size_t)k, 2 * sizeof *c->wr, cmp_range);
    /* prefix maximum of the range ends: a weight [lo, hi) overlaps some
     * written range iff the last range starting below hi ends above lo */
    for (int32_t j = 1; j < k; j++)
        if (c->wr[2 * j + 1] < c->wr[2 * j - 1]) c->wr[2 * j + 1] = c->wr[2 * j - 1];
    for (int32_t i = 0; i < n; i++) {
        const ns_tensor *w = ops[i].kind == OP_MATMUL || ops[i].kind == OP_RMSNORM ? &ops[i].c
                             : ops[i].kind == OP_ROPE                            ? &ops[i].b
                                                                                 : NULL;
        if (!w || !w->data) continue;
        const uintptr_t lo = (uintptr_t)w->data, hi = lo + ns_tensor_bytes(w);
        int32_t a = 0, b = k; /* first range with start >= hi */
        while (a < b) {
            const int32_t m = (a + b) / 2;
            if (c->wr[2 * m] < hi) a = m + 1;
            else b = m;
        }
        if (a > 0 && c->wr[2 * (a - 1) + 1] > lo) return false;
    }
    return true;
}

/* ---------------------------------------------------- F32 liveness
 *
 * A prefill step's activations are F32 with a bf16 shadow for the GEMMs
 * (cuda_internal.cuh). Most RMSNorm and SwiGLU outputs are read only by
 * GEMMs, through the shadow, and then overwritten: their F32 copy is
 * written for nobody (~24 GB of writes in an 8k chunk of the Qwen3-8B
 * shape). This walk proves that for one output so its producer can skip
 * it; any op it does not know ends the walk as "live". */

/* How op reads the bytes of t: 0 not at all, 1 only as a bf16 GEMM's input
 * through t's shadow (same view, more rows than the GEMV path takes, so
 * cu_matmul_op uses the shadow), 2 any other way. */
static int op_reads(const cu_impl *c, const cu_op *op, const ns_tensor *t) {
    switch (op->kind) {
    case OP_EMBED:
    case OP_ATTENTION:
    case OP_GATHER: return cu_tensors_overlap(&op->b, t) ? 2 : 0;
    case OP_RMSNORM:
    case OP_SWIGLU: return cu_tensors_overlap(&op->b, t) || cu_tensors_overlap(&op->c, t) ? 2 : 0;
    case OP_ROPE:
    case OP_ADD:
    case OP_ADD_BIAS:
    case OP_KV_STORE: return cu_tensors_overlap(&op->a, t) || cu_tensors_overlap(&op->b, t) ? 2 : 0;
    case OP_ARGMAX: return cu_tensors_overlap(&op->a, t) ? 2 : 0;
    case OP_KV_COPY: return 0; /* pool pages only */
    case OP_MATMUL:
        if (cu_tensors_overlap(&op->c, t)) return 2;
        if (!cu_tensors_overlap(&op->b, t)) return 0;
        return same_view(&op->b, t) && op->c.dtype == NS_DT_BF16 && op->b.rows > c->gemv_max ? 1 : 2;
    default: return 2; /* MoE and anything newer: unknown reads */
    }
}

/* The tensor op writes, or NULL (KV_STORE, KV_COPY and ARGMAX write only
 * the pool or the backend's own buffers). */
static const ns_tensor *op_output(const cu_op *op) {
    switch (op->kind) {
    case OP_EMBED:
    case OP_RMSNORM:
    case OP_MATMUL:
    case OP_SWIGLU:
    case OP_ATTENTION:
    case OP_GATHER:
    case OP_ROPE:
    case OP_ADD:
    case OP_ADD_BIAS:
    case OP_MOE: return &op->a;
    default: return NULL;
    }
}

bool cu_tape_f32_dead(cu_impl *c, const cu_op *ops, int32_t from, int32_t n, const ns_tensor *t, bool shadow_ok) {
    if (!t->data || t->dtype != NS_DT_F32) return false;
    const uintptr_t t0 = (uintptr_t)t->data, t1 = t0 + ns_tensor_bytes(t);
    /* A shadow read needs the shadow still valid, and any write into its
     * F32 allocation, t or not, invalidates it (cu_note_write): such a
     * write ends the walk unless it overwrites all of t. */
    uintptr_t r0 = t0, r1 = t1;
    if (shadow_ok) {
        const cu_shadow *s = cu_shadow_for(c, t->data);
        if (!s) return false;
        r1 = r0 + s->bytes;
        if (r1 < t1) return false;
    }
    for (int32_t j = from; j < n; j++) {
        const int r = op_reads(c, &ops[j], t);
        if (r == 2 || (r == 1 && !shadow_ok)) return false;
        const ns_tensor *w = op_output(&ops[j]);
        if (!w || !w->data) continue;
        const uintptr_t w0 = (uintptr_t)w->data, w1 = w0 + ns_tensor_bytes(w);
        if (w0 < r1 && r0 < w1) return r == 0 && w0 <= t0 && t1 <= w1;
    }
    return false;
}

bool cu_prefill_out_dead(cu_impl *c, const cu_op *ops, int32_t from, int32_t n, const ns_tensor *t) {
    return (c->prefill_lean & 1) && c->tape_eager_only && cu_tape_f32_dead(c, ops, from, n, t, true);
}
