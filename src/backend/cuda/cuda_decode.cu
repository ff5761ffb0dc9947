/* cuda_decode.cu — tape patterns of batch-1/2 decode whose row ops are
 * folded into the neighbouring GEMV (kernels: k_gemv_dec in cuda_gemm.cu).
 *
 * A decode step at batch 1 is ~8 kernels per layer with the older tape
 * fusions (cuda_fused.cu); two of them, the residual add + RMSNorm after
 * the output projection and after the down projection, move only a few
 * kilobytes but each costs a kernel boundary (launch, PDL wait, a chain of
 * dependent loads). With NS_CUDA_DEC_FUSE=1 (or ns_cuda_set_dec_fuse) the
 * tape runs instead:
 *   matmul y = in W^T ; add x += y            -> one GEMV, add in the epilogue
 *   rmsnorm xn = norm(x) ; 1-3 matmuls of xn  -> one GEMV of x * w, scaled
 *                                                by 1/rms at the end
 *   rmsnorm ; gate, up matmuls ; swiglu       -> the same, + SwiGLU
 * which leaves 6 kernels per dense layer. With NS_CUDA_DEC_EARLY=1 as well
 * (ns_cuda_set_dec_early), such a GEMV that follows another GEMV issues its
 * first weight loads before its PDL wait. The GEMV + add is bit-identical
 * to the unfused ops; the norm folds differ from them by float rounding
 * (inv * (W . (x * w)) against W . ((x * inv) * w), see cuda_gemm.cu);
 * tests/gpu/test_decode_fused.c checks both op by op and on whole decode
 * steps.
 *
 * Invariant: a pattern is taken only when it is checked completely here
 * (kinds, dtypes, shapes, alignment, no overlap between what the fused
 * kernel reads and writes); otherwise the older fusions or the plain ops
 * run. Only the GEMV path (1 or 2 input rows) is affected.
 */
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

static bool same_view(const ns_tensor *a, const ns_tensor *b) {
    return a->data == b->data && a->rows == b->rows && a->cols == b->cols && a->dtype == b->dtype;
}

static bool al16(const void *p) { return ((uintptr_t)p % 16) == 0; }

/* The GEMV path of op_matmul (bf16 weight, F32 in/out, 1-2 rows here). */
static bool dec_gemv(const cu_impl *c, const cu_op *op) {
    const ns_tensor *out = &op->a, *in = &op->b, *w = &op->c;
    return op->kind == OP_MATMUL && out->dtype == NS_DT_F32 && in->dtype == NS_DT_F32 && w->dtype == NS_DT_BF16 &&
           in->rows >= 1 && in->rows <= 2 && in->rows <= c->gemv_max && in->cols % 8 == 0 && w->cols == in->cols &&
           out->rows == in->rows && out->cols == w->rows && w->rows <= INT32_MAX / 2 && al16(w->data) &&
           al16(in->data) && !cu_tensors_overlap(out, in);
}

/* matmul y = in W^T followed by x += y */
static int32_t match_add(const cu_op *ops, int32_t i, int32_t n, cu_gemv_dec_args *g) {
    if (i + 1 >= n || ops[i + 1].kind != OP_ADD) return 0;
    const ns_tensor *y = &ops[i].a, *x = &ops[i + 1].a;
    if (!same_view(&ops[i + 1].b, y) || x->dtype != NS_DT_F32 || x->rows != y->rows || x->cols != y->cols ||
        cu_tensors_overlap(x, y) || cu_tensors_overlap(x, &ops[i].b) || cu_tensors_overlap(x, &ops[i].c))
        return 0;
    g->nseg = 1;
    g->out[0] = (float *)y->data;
    g->w[0] = (const bf16 *)ops[i].c.data;
    g->m[0] = ops[i].c.rows;
    g->x = (const float *)ops[i].b.data;
    g->n = (int)ops[i].b.rows;
    g->k = ops[i].b.cols;
    g->add_res = true;
    g->res = (float *)x->data;
    return 2;
}

/* rmsnorm xn = norm(x) * w followed by GEMVs of xn (a group, or gate/up +
 * swiglu) */
static int32_t match_norm(const cu_impl *c, const cu_op *ops, int32_t i, int32_t n, cu_gemv_dec_args *g) {
    const ns_tensor *xn = &ops[i].a, *x = &ops[i].b, *nw = &ops[i].c;
    if (xn->dtype != NS_DT_F32 || x->dtype != NS_DT_F32 || nw->dtype != NS_DT_F32 || x->rows < 1 || x->rows > 2 ||
        xn->rows != x->rows || xn->cols != x->cols || x->cols % 8 || x->cols > INT32_MAX / 2 ||
        nw->rows * nw->cols != x->cols || !al16(x->data) || !al16(xn->data) || !al16(nw->data) || cu_tensors_overlap(x, xn))
        return 0;
    int32_t gcount = 0;
    while (gcount < 3 && i + 1 + gcount < n && dec_gemv(c, &ops[i + 1 + gcount]) &&
           same_view(&ops[i + 1 + gcount].b, xn) && !cu_tensors_overlap(&ops[i + 1 + gcount].a, x) &&
           !cu_tensors_overlap(&ops[i + 1 + gcount].a, nw))
        gcount++;
    if (gcount == 0) return 0;
    g->x = (const float *)x->data;
    g->n = (int)x->rows;
    g->k = x->cols;
    g->norm_w = (const float *)nw->data;
    g->xn = (float *)xn->data;
    g->eps = ops[i].f0;
    if (gcount >= 2 && i + 3 < n && ops[i + 3].kind == OP_SWIGLU) {
        const cu_op *go = &ops[i + 1], *uo = &ops[i + 2], *sw = &ops[i + 3];
        const ns_tensor *gt = &go->a, *up = &uo->a, *out = &sw->a;
        if (same_view(&sw->b, gt) && same_view(&sw->c, up) && gt->cols == up->cols && out->dtype == NS_DT_F32 &&
            out->rows == gt->rows && out->cols == gt->cols && !cu_tensors_overlap(gt, up) && !cu_tensors_overlap(out, up) &&
            !cu_tensors_overlap(out, xn) && !cu_tensors_overlap(out, x) && !cu_tensors_overlap(out, nw)) {
            g->nseg = 2;
            g->swiglu = true;
            g->out[0] = (float *)gt->data;
            g->out[1] = (float *)up->data;
            g->w[0] = (const bf16 *)go->c.data;
            g->w[1] = (const bf16 *)uo->c.data;
            g->m[0] = g->m[1] = gt->cols;
            g->sw_out = (float *)out->data;
            return 4;
        }
    }
    g->nseg = gcount > 3 ? 3 : gcount;
    for (int32_t j = 0; j < g->nseg; j++) {
        g->out[j] = (float *)ops[i + 1 + j].a.data;
        g->w[j] = (const bf16 *)ops[i + 1 + j].c.data;
        g->m[j] = ops[i + 1 + j].c.rows;
    }
    if (g->m[0] + (g->nseg > 1 ? g->m[1] : 0) + (g->nseg > 2 ? g->m[2] : 0) > INT32_MAX / 2) return 0;
    return 1 + g->nseg;
}

int32_t cu_dec_match(const cu_impl *c, const cu_op *ops, int32_t i, int32_t n, cu_gemv_dec_args *g,
                     const char **label) {
    memset(g, 0, sizeof *g);
    *label = NULL;
    const cu_op *o = &ops[i];
    int32_t used = 0;
    if (dec_gemv(c, o)) {
        used = match_add(ops, i, n, g);
        if (used) *label = "dec gemv+add";
    } else if (o->kind == OP_RMSNORM) {
        used = match_norm(c, ops, i, n, g);
        if (used) *label = g->swiglu ? "dec norm+gemv gate/up+swiglu" : "dec norm+gemv";
    }
    if (!used) memset(g, 0, sizeof *g);
    return used;
}

/* Whether the kernel before ops[i] is a GEMV streaming weights: its
 * pattern's last op is the residual add (GEMV + add) or the SwiGLU (norm +
 * gate/up). Only then do early weight loads pay: they fill the HBM idle
 * time of that GEMV's tail. After a latency-bound kernel (attention,
 * embed, experts) they would queue ahead of its dependent loads (v9). */
static bool after_gemv(const cu_op *ops, int32_t i) {
    return i > 0 && (ops[i - 1].kind == OP_ADD || ops[i - 1].kind == OP_SWIGLU || ops[i - 1].kind == OP_MATMUL);
}

void cu_dec_run(cu_impl *c, const cu_op *ops, int32_t i, int32_t used, const cu_gemv_dec_args *g) {
    cu_gemv_dec_args a = *g;
    /* tape_early: no op of this tape writes a matmul weight, so weights may
     * be read before the PDL wait */
    a.early = c->dec_early && c->tape_early && after_gemv(ops, i);
    if (a.add_res) {
        cu_note_write(c, &ops[i].a);
        cu_note_write(c, &ops[i + 1].a);
    } else {
        cu_note_write(c, &ops[i].a); /* xn: written without its bf16 shadow */
        if (a.swiglu) {
            cu_note_write(c, &ops[i + 1].a);
            cu_note_write(c, &ops[i + 2].a);
            a.sw_out_bf = cu_shadow_produce(c, &ops[i + 3].a);
        } else {
            for (int32_t j = 1; j < used; j++) cu_note_write(c, &ops[i + j].a);
        }
    }
    cu_gemv_dec(c, &a);
}
