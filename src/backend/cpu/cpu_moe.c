/* cpu_moe.c — the CPU backend's mixture-of-experts MLP (moe_ffn, see
 * backend.h) and projection bias (add_bias).
 *
 * moe_ffn routes on the calling (engine) thread — router logits through
 * cpu_matmul, then softmax and top-k per token — and groups the chosen
 * (token, expert) pairs by expert with a counting sort, so each expert
 * runs once per step over the rows of its tokens: a prefill chunk becomes
 * one matmul per used expert (BLAS when it has 8 or more rows), and a
 * decode step reads only the chosen experts' weights. Results are added
 * expert by expert in ascending order, the order Hugging Face's loop
 * sums them in.
 *
 * Scratch (routing arrays and the gathered activations) lives in cpu_impl,
 * grown to the largest step seen and capped at NS_CPU_MOE_CAP bytes; past
 * the cap (or out of memory) the output is poisoned with NaN, which the
 * engine reports as non-finite logits, as cpu_matmul does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

#define NS_CPU_MOE_CAP ((size_t)4 << 30)

/* ------------------------------------------------------------- add_bias */

typedef struct {
    ns_tensor *out;
    const float *b;
} bias_ctx;

static void bias_task(void *p, int64_t b, int64_t e, int tid) {
    bias_ctx *x = p;
    const int64_t n = x->out->cols;
    for (int64_t r = b; r < e; r++) axpy((float *)x->out->data + r * n, 1.0f, x->b, n);
}

void cpu_add_bias(ns_backend *be, ns_tensor *out, const ns_tensor *b) {
    cpu_impl *c = be->impl;
    bias_ctx x = {out, b->data};
    ns_pool_run(c->pool, out->rows, 16, bias_task, &x);
}

/* -------------------------------------------------------------- moe_ffn */

static void poison(ns_tensor *out) {
    for (int64_t i = 0; i < out->rows * out->cols; i++) ((float *)out->data)[i] = NAN;
}

/* Grows the float and int scratch to nf / ni elements within the cap. */
static int reserve(cpu_impl *c, size_t nf, size_t ni) {
    if (nf > NS_CPU_MOE_CAP / sizeof(float) || ni > NS_CPU_MOE_CAP / sizeof(int32_t)) return -1;
    if (nf > c->moe_f_cap) {
        float *p = realloc(c->moe_f, nf * sizeof *p);
        if (!p) return -1;
        c->moe_f = p;
        c->moe_f_cap = nf;
    }
    if (ni > c->moe_i_cap) {
        int32_t *p = realloc(c->moe_i, ni * sizeof *p);
        if (!p) return -1;
        c->moe_i = p;
        c->moe_i_cap = ni;
    }
    return 0;
}

/* Softmax over one token's router logits, then its top k (largest first,
 * ties to the lower index), renormalized when norm. */
static void route_token(float *logits, int E, int K, bool norm, int32_t *sel, float *w) {
    float mx = logits[0];
    for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0;
    for (int e = 0; e < E; e++) sum += (logits[e] = expf(logits[e] - mx));
    for (int e = 0; e < E; e++) logits[e] /= sum;
    float ksum = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (logits[e] >= 0 && (best < 0 || logits[e] > logits[best])) best = e;
        if (best < 0) { /* NaN logits: a valid index, a poisoned weight */
            sel[j] = 0;
            w[j] = NAN;
            continue;
        }
        sel[j] = best;
        w[j] = logits[best];
        ksum += w[j];
        logits[best] = -1; /* taken */
    }
    if (norm)
        for (int j = 0; j < K; j++) w[j] /= ksum;
}

static ns_tensor f32_view(float *p, int64_t rows, int64_t cols) {
    ns_tensor t = {.dtype = NS_DT_F32, .rows = rows, .cols = cols, .data = p, .alloc = NULL};
    return t;
}

void cpu_moe_ffn(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *router,
                 const ns_tensor *experts, int E, int K, bool norm_topk) {
    cpu_impl *c = be->impl;
    const int64_t T = in->rows, H = in->cols, F = experts[0].rows;
    const size_t TK = (size_t)T * (size_t)K;
    /* floats: logits [T, E], weights [T*K], xs and ys [T, H], g and u [T, F];
     * ints: chosen experts [T*K], per-expert starts [E+1], slots by expert [T*K] */
    const size_t nf = (size_t)T * (size_t)E + TK + 2 * (size_t)T * (size_t)H + 2 * (size_t)T * (size_t)F;
    if (T <= 0 || K <= 0 || K > E || reserve(c, nf, 2 * TK + (size_t)E + 1) != 0) {
        poison(out);
        return;
    }
    float *logits = c->moe_f, *wts = logits + (size_t)T * E, *xs = wts + TK, *ys = xs + (size_t)T * H,
          *g = ys + (size_t)T * H, *u = g + (size_t)T * F;
    int32_t *sel = c->moe_i, *start = sel + TK, *slots = start + E + 1;

    ns_tensor lt = f32_view(logits, T, E);
    cpu_matmul(be, &lt, in, router);
    for (int64_t t = 0; t < T; t++) route_token(logits + t * E, E, K, norm_topk, sel + t * K, wts + t * K);

    /* counting sort of the (token, k) slots by expert, tokens ascending */
    memset(start, 0, ((size_t)E + 1) * sizeof *start);
    for (size_t i = 0; i < TK; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (size_t i = 0; i < TK; i++) slots[start[sel[i]]++] = (int32_t)i;
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;

    for (int e = 0; e < E; e++) {
        const int64_t n = start[e + 1] - start[e];
        if (n == 0) continue; /* an expert no token chose: its weights are never read */
        const int32_t *sl = slots + start[e];
        for (int64_t i = 0; i < n; i++)
            memcpy(xs + i * H, (const float *)in->data + (sl[i] / K) * H, (size_t)H * sizeof(float));
        ns_tensor xv = f32_view(xs, n, H), gv = f32_view(g, n, F), uv = f32_view(u, n, F), yv = f32_view(ys, n, H);
        cpu_matmul(be, &gv, &xv, &experts[e]);
        cpu_matmul(be, &uv, &xv, &experts[E + e]);
        cpu_swiglu(be, &gv, &gv, &uv);
        cpu_matmul(be, &yv, &gv, &experts[2 * E + e]);
        for (int64_t i = 0; i < n; i++) axpy((float *)out->data + (sl[i] / K) * H, wts[sl[i]], ys + i * H, H);
    }
}
