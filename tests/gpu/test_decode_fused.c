/* test_decode_fused.c — the decode GEMVs with RMSNorm / residual add
 * folded in (cuda_decode.cu, k_gemv_dec in cuda_gemm.cu;
 * NS_CUDA_DEC_FUSE / ns_cuda_set_dec_fuse).
 *
 * Op level: the engine's op sequences around the decode GEMVs (RMSNorm +
 * q/k/v group, RMSNorm + gate/up + SwiGLU, output projection + residual
 * add, down projection + residual add, chained as forward.c chains them,
 * the normalized buffer reused as the projection output) are recorded as a
 * decode step on random never-zero inputs and run with the switch on:
 * eagerly (profiled, to see the fused kernels really ran), captured into a
 * graph and replayed with new inputs. Every output must equal the same
 * tape run with the switch off (the older fusions and plain kernels) to
 * float rounding (rel L2 <= 1e-6: the norm folds scale the sums by 1/rms
 * at the end instead of normalizing the input; the GEMV + add alone is
 * bit-identical), and be within bf16 GEMV tolerance of the CPU reference.
 * Shapes cover 1 and 2 rows, hidden sizes with and without a multiple of
 * 2048, an odd segment (a row pair straddling two matrices) and a hidden
 * size of 1024 (the small models' width).
 * Model level: a dummy Qwen3-shaped and a Qwen3-MoE-shaped model decode
 * six steps at batch 1 and 2 with the switch on and off: logits equal to
 * float rounding (rel L2 <= 1e-5), and close to the CPU backend.
 * The attention block (q/k RMSNorm, RoPE, KV store, attention) of decode
 * steps at op level: the fused q/k-norm + RoPE + store kernel must give
 * bit-identical q, k and attention output to the unfused ops, also with
 * the tensor-core decode kernel over 140 steps (pages, tiles and splits
 * crossed; GQA ratios 1, 4, 8).
 * The step memo and the packed metadata upload (test_step_memo): decode
 * steps of changing shapes replayed from the memo give bit-identical
 * logits to steps recorded op by op.
 * The step's first and last row ops fused (test_row_fuse): embed +
 * RMSNorm and add + gather + RMSNorm, bit-identical to the ops in
 * prefill and decode, also with two logits rows naming one token.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "engine/engine.h"
#include "model/model.h"
#include "test.h"

#define GPU_TEST_SEED 0x5eed0fdec0de5eedULL
#include "gpu_test.h"

static ns_error _e;
#define OK(x)                                                                                                         \
    do {                                                                                                              \
        ns_status _rc = (x);                                                                                          \
        CHECKF(_rc == NS_OK, "%s: %s", #x, _e.msg);                                                                   \
    } while (0)

static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------ op level */

/* A tensor on both backends. */
typedef struct {
    ns_tensor c, g;
    int64_t rows, cols;
    void *host; /* weights: the upload source, which the CPU backend may borrow; freed after c */
} pair;

static void act_pair(pair *p, int64_t rows, int64_t cols) {
    p->rows = rows;
    p->cols = cols;
    OK(cpu->ops->tensor_alloc(cpu, &p->c, NS_DT_F32, rows, cols, &_e));
    OK(gpu->ops->tensor_alloc(gpu, &p->g, NS_DT_F32, rows, cols, &_e));
}

/* BF16 matrix (rows > 1) or F32 vector (rows == 1), same values on both. */
static void weight_pair(pair *p, int64_t rows, int64_t cols, float scale, float offset) {
    size_t n = (size_t)(rows * cols);
    p->rows = rows;
    p->cols = cols;
    if (rows == 1) {
        float *h = malloc(n * 4);
        for (size_t i = 0; i < n; i++) h[i] = offset + frand() * scale;
        OK(cpu->ops->weight_from_host(cpu, &p->c, h, NS_DT_F32, 1, cols, &_e));
        OK(gpu->ops->weight_from_host(gpu, &p->g, h, NS_DT_F32, 1, cols, &_e));
        p->host = h;
        return;
    }
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = bf16_bits(frand() * scale);
    OK(cpu->ops->weight_from_host(cpu, &p->c, h, NS_DT_BF16, rows, cols, &_e));
    OK(gpu->ops->weight_from_host(gpu, &p->g, h, NS_DT_BF16, rows, cols, &_e));
    p->host = h;
}

static void pair_free(pair *p) {
    if (p->c.data) cpu->ops->tensor_free(cpu, &p->c);
    if (p->g.data) gpu->ops->tensor_free(gpu, &p->g);
    free(p->host);
    p->host = NULL;
}

/* A decode step of n sequences (one token each), no KV pool: the CUDA
 * backend records the ops that follow and runs them at the next sync. */
static void decode_batch(ns_backend *be, int32_t n) {
    int32_t tok[2] = {1, 2}, pos[2] = {5, 9}, ss[3] = {0, 1, 2}, sl[2] = {6, 10}, pt[2] = {0, 0};
    ns_batch b = {.n_tokens = n, .n_seqs = n, .tokens = tok, .positions = pos, .seq_start = ss, .seq_len = sl,
                  .page_table = pt, .max_pages = 0, .logit_rows = NULL, .n_logits = 0};
    OK(be->ops->set_batch(be, &b, &_e));
}

typedef struct {
    int n;           /* rows (sequences) */
    int64_t H, FF;   /* hidden, intermediate */
    int64_t mq, mk;  /* q and k/v widths */
    pair x, xn, att, q, k, v, gate, up;
    pair wq, wk, wv, wo, wg, wu, wd, n1, n2;
} chain;

static void chain_init(chain *ch, int n, int64_t H, int64_t FF, int64_t mq, int64_t mk) {
    memset(ch, 0, sizeof *ch);
    ch->n = n;
    ch->H = H;
    ch->FF = FF;
    ch->mq = mq;
    ch->mk = mk;
    act_pair(&ch->x, n, H);
    act_pair(&ch->xn, n, H);
    act_pair(&ch->att, n, mq);
    act_pair(&ch->q, n, mq);
    act_pair(&ch->k, n, mk);
    act_pair(&ch->v, n, mk);
    act_pair(&ch->gate, n, FF);
    act_pair(&ch->up, n, FF);
    weight_pair(&ch->wq, mq, H, 0.05f, 0);
    weight_pair(&ch->wk, mk, H, 0.05f, 0);
    weight_pair(&ch->wv, mk, H, 0.05f, 0);
    weight_pair(&ch->wo, H, mq, 0.05f, 0);
    weight_pair(&ch->wg, FF, H, 0.05f, 0);
    weight_pair(&ch->wu, FF, H, 0.05f, 0);
    weight_pair(&ch->wd, H, FF, 0.05f, 0);
    weight_pair(&ch->n1, 1, H, 0.5f, 1.0f);
    weight_pair(&ch->n2, 1, H, 0.5f, 1.0f);
}

static void chain_free(chain *ch) {
    pair *ps[] = {&ch->x,  &ch->xn, &ch->att, &ch->q,  &ch->k,  &ch->v,  &ch->gate, &ch->up, &ch->wq,
                  &ch->wk, &ch->wv, &ch->wo,  &ch->wg, &ch->wu, &ch->wd, &ch->n1,   &ch->n2};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) pair_free(ps[i]);
}

/* forward.c's sequence around the GEMVs of one layer, attention replaced
 * by the given `att` input: norm + q/k/v, then output projection + add,
 * norm + gate/up + SwiGLU, down + add, and the next layer's norm + q/k/v. */
static void chain_ops(ns_backend *be, chain *ch, int cpu_side) {
#define T(p) (cpu_side ? &ch->p.c : &ch->p.g)
    const ns_backend_ops *o = be->ops;
    const float eps = 1e-6f;
    o->rmsnorm(be, T(xn), T(x), T(n1), eps);
    o->matmul(be, T(q), T(xn), T(wq));
    o->matmul(be, T(k), T(xn), T(wk));
    o->matmul(be, T(v), T(xn), T(wv));
    o->matmul(be, T(xn), T(att), T(wo));
    o->add(be, T(x), T(xn));
    o->rmsnorm(be, T(xn), T(x), T(n2), eps);
    o->matmul(be, T(gate), T(xn), T(wg));
    o->matmul(be, T(up), T(xn), T(wu));
    o->swiglu(be, T(gate), T(gate), T(up));
    o->matmul(be, T(xn), T(gate), T(wd));
    o->add(be, T(x), T(xn));
    o->rmsnorm(be, T(xn), T(x), T(n1), eps);
    o->matmul(be, T(q), T(xn), T(wq));
    o->matmul(be, T(k), T(xn), T(wk));
#undef T
}

#define N_OUT 7
static void chain_outputs(chain *ch, pair **outs) {
    pair *ps[N_OUT] = {&ch->x, &ch->xn, &ch->q, &ch->k, &ch->v, &ch->gate, &ch->up};
    memcpy(outs, ps, sizeof ps);
}

static void free_bufs(float **bufs) {
    for (int j = 0; j < N_OUT; j++) free(bufs[j]);
}

/* The GPU's profile report (which also resets it) as text; the caller
 * frees it. NULL when it cannot be captured. */
static char *profile_text(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    ns_cuda_profile_report(gpu, f);
    fclose(f);
    return text;
}

/* Which fused decode kernels the profile report names: bit 0 the norm +
 * q/k/v group, bit 1 the norm + gate/up + SwiGLU, bit 2 GEMV + add. */
static int profile_dec_kinds(void) {
    char *text = profile_text();
    int kinds = 0;
    if (text) {
        /* labels are padded with spaces in the report */
        if (strstr(text, "dec norm+gemv  ")) kinds |= 1;
        if (strstr(text, "dec norm+gemv gate/up+swiglu")) kinds |= 2;
        if (strstr(text, "dec gemv+add")) kinds |= 4;
    }
    free(text);
    return kinds;
}

/* One run of the chain on backend be from inputs (x0, a0); outputs into
 * bufs (allocated here). */
static void chain_run(ns_backend *be, chain *ch, const float *x0, const float *a0, float **bufs) {
    const int cpu_side = be == cpu;
    OK(be->ops->tensor_upload(be, cpu_side ? &ch->x.c : &ch->x.g, x0, &_e));
    OK(be->ops->tensor_upload(be, cpu_side ? &ch->att.c : &ch->att.g, a0, &_e));
    decode_batch(be, ch->n);
    chain_ops(be, ch, cpu_side);
    pair *outs[N_OUT];
    chain_outputs(ch, outs);
    for (int j = 0; j < N_OUT; j++) {
        bufs[j] = malloc((size_t)(outs[j]->rows * outs[j]->cols) * 4);
        OK(be->ops->tensor_download(be, cpu_side ? &outs[j]->c : &outs[j]->g, bufs[j], &_e));
    }
}

/* Two random input sets (x never zero-centred, attention output halved)
 * for the chain and the CPU reference outputs of each; the caller frees
 * xin, ain (free) and ref (free_bufs). */
static void chain_inputs(chain *ch, float **xin, float **ain, float *(*ref)[N_OUT]) {
    const size_t nx = (size_t)(ch->n * ch->H), na = (size_t)(ch->n * ch->mq);
    for (int s = 0; s < 2; s++) {
        xin[s] = malloc(nx * 4);
        ain[s] = malloc(na * 4);
        for (size_t i = 0; i < nx; i++) xin[s][i] = frand();
        for (size_t i = 0; i < na; i++) ain[s][i] = frand() * 0.5f;
        chain_run(cpu, ch, xin[s], ain[s], ref[s]);
    }
}

/* Runs the chain on two input sets A and B: CPU reference and GPU with
 * the switch off for both; then, switch on (graphs dropped by the switch,
 * so the tape is new): A eager with events (the profile must name the
 * three fused kernels, or only GEMV + add when !expect_fused), A eager,
 * A captured, B replayed twice; all of it again with the early weight
 * loads on (ns_cuda_set_dec_early). Every switch-on output must equal
 * the switch-off output of its inputs to rel L2 1e-6, and be within 1e-4
 * of the CPU (F32 activations, bf16 weights on both: only the summation
 * order differs). */
static void chain_check(int n, int64_t H, int64_t FF, int64_t mq, int64_t mk, bool expect_fused) {
    chain ch;
    chain_init(&ch, n, H, FF, mq, mk);
    pair *outs[N_OUT];
    chain_outputs(&ch, outs);
    float *xin[2], *ain[2], *ref[2][N_OUT], *off[2][N_OUT];
    chain_inputs(&ch, xin, ain, ref);
    ns_cuda_set_dec_fuse(gpu, 0);
    for (int s = 0; s < 2; s++) chain_run(gpu, &ch, xin[s], ain[s], off[s]);
    /* pass 0: the switch alone; pass 1: with the early weight loads too */
    const int early_default = ns_cuda_get_early_loads(gpu);
    for (int early = 0; early < 2; early++) {
        int64_t rep0, cap0, eag0, rep1, cap1, eag1;
        ns_cuda_set_dec_fuse(gpu, 1);
        ns_cuda_set_dec_early(gpu, early);
        /* the early weight loads need the tape's early loads; no
         * q/k-norm+RoPE+store or attention here */
        ns_cuda_set_early_loads(gpu, early);
        ns_cuda_graph_stats(gpu, &rep0, &cap0, &eag0);
        static const int order[5] = {0, 0, 0, 1, 1};
        for (int r = 0; r < 5; r++) {
            const int s = order[r];
            if (r == 0) ns_cuda_set_profiling(gpu, 1);
            float *on[N_OUT];
            chain_run(gpu, &ch, xin[s], ain[s], on);
            if (r == 0) {
                OK(gpu->ops->sync(gpu, &_e));
                const int kinds = profile_dec_kinds(), want = expect_fused ? 7 : 4;
                ns_cuda_set_profiling(gpu, 0);
                CHECKF(kinds == want, "n=%d H=%lld: fused decode kernels seen %d, expected %d (1 norm+q/k/v, "
                       "2 norm+gate/up, 4 gemv+add)", n, (long long)H, kinds, want);
            }
            for (int j = 0; j < N_OUT; j++) {
                const size_t cnt = (size_t)(outs[j]->rows * outs[j]->cols);
                const double d = rel_l2(on[j], off[s][j], cnt);
                CHECKF(d <= 1e-6, "n=%d H=%lld early=%d output %d, run %d: switch on differs from off (rel L2 %.3g)",
                       n, (long long)H, early, j, r, d);
                double e = rel_l2(on[j], ref[s][j], cnt);
                CHECKF(e <= 1e-4, "n=%d H=%lld output %d, run %d: cuda vs cpu rel L2 %.3g", n, (long long)H, j, r,
                       e);
            }
            free_bufs(on);
        }
        ns_cuda_graph_stats(gpu, &rep1, &cap1, &eag1);
        ns_cuda_set_dec_fuse(gpu, 0);
        ns_cuda_set_dec_early(gpu, 0);
        ns_cuda_set_early_loads(gpu, early_default);
        CHECKF(cap1 > cap0 && rep1 >= rep0 + 2,
               "n=%d H=%lld early=%d: graph captures %lld, replays %lld (expected 1 and 2)", n, (long long)H, early,
               (long long)(cap1 - cap0), (long long)(rep1 - rep0));
    }
    for (int s = 0; s < 2; s++) {
        free_bufs(ref[s]);
        free_bufs(off[s]);
        free(xin[s]);
        free(ain[s]);
    }
    chain_free(&ch);
}

TEST(test_chain_batch1) { chain_check(1, 2048, 2816, 2048, 512, true); }
TEST(test_chain_batch2) { chain_check(2, 2048, 2816, 2048, 512, true); }
/* the same chains with the unfused side's GEMVs (q/k/v group, gate/up +
 * SwiGLU, output and down projections) on the bulk-copy kernel
 * (cuda_gemv_bulk.cu): K = 2048 and 2816 are multiples of 256 */
TEST(test_chain_bulk_gemv) {
    const int saved = ns_cuda_get_gemv_bulk(gpu);
    ns_cuda_set_gemv_bulk(gpu, 1);
    chain_check(1, 2048, 2816, 2048, 512, true);
    chain_check(2, 2048, 2816, 2048, 512, true);
    ns_cuda_set_gemv_bulk(gpu, saved);
}
/* hidden 1064: the norm's 2048-element stride ends mid-way; k/v of 135
 * rows: a GEMV row pair spans k and v */
TEST(test_chain_odd_shapes) {
    chain_check(1, 1064, 1000, 1064, 135, true);
    chain_check(2, 1064, 1000, 1064, 135, true);
}
/* hidden 1024 (Qwen3-0.6B's width): the unfused RMSNorm is the warp
 * kernel there; the folds apply all the same */
TEST(test_chain_hidden_1024) {
    chain_check(1, 1024, 1000, 1024, 256, true);
    chain_check(2, 1024, 1000, 1024, 256, true);
}

/* The persistent MLP kernel (cuda_mlp.cu, ns_cuda_set_mlp): the same
 * chain with it on must give every output bit-identical to the two GEMV
 * launches it replaces (same split-K and summation order), eagerly (the
 * profile must name it), captured and replayed with new inputs, and stay
 * within GEMV tolerance of the CPU. */
static void mlp_chain_check(int n, int64_t H, int64_t FF, int tail) {
    chain ch;
    chain_init(&ch, n, H, FF, H, H / 4);
    pair *outs[N_OUT];
    chain_outputs(&ch, outs);
    float *xin[2], *ain[2], *ref[2][N_OUT], *off[2][N_OUT];
    chain_inputs(&ch, xin, ain, ref);
    const int saved = ns_cuda_get_mlp(gpu);
    ns_cuda_set_dec_fuse(gpu, 0);
    ns_cuda_set_mlp(gpu, 0);
    for (int s = 0; s < 2; s++) chain_run(gpu, &ch, xin[s], ain[s], off[s]);
    ns_cuda_set_mlp(gpu, 1);
    const int tail0 = ns_cuda_get_mlp_tail(gpu);
    ns_cuda_set_mlp_tail(gpu, tail);
    int64_t rep0, cap0, eag0, rep1, cap1, eag1;
    ns_cuda_graph_stats(gpu, &rep0, &cap0, &eag0);
    static const int order[5] = {0, 0, 0, 1, 1};
    for (int r = 0; r < 5; r++) {
        const int s = order[r];
        if (r == 0) ns_cuda_set_profiling(gpu, 1);
        float *on[N_OUT];
        chain_run(gpu, &ch, xin[s], ain[s], on);
        if (r == 0) {
            OK(gpu->ops->sync(gpu, &_e));
            char *text = profile_text();
            /* with the tail: the chain's MLP is followed by add, norm, q, k */
            const int seen = text && strstr(text, tail ? "persistent mlp + norm + q/k/v" : "persistent mlp gate/up") != NULL;
            free(text);
            ns_cuda_set_profiling(gpu, 0);
            CHECKF(seen, "n=%d H=%lld FF=%lld tail=%d: the persistent MLP kernel did not run", n, (long long)H,
                   (long long)FF, tail);
        }
        for (int j = 0; j < N_OUT; j++) {
            const size_t cnt = (size_t)(outs[j]->rows * outs[j]->cols);
            CHECKF(memcmp(on[j], off[s][j], cnt * 4) == 0,
                   "n=%d H=%lld FF=%lld tail=%d output %d, run %d: persistent MLP differs from the GEMVs (rel L2 "
                   "%.3g)", n, (long long)H, (long long)FF, tail, j, r, rel_l2(on[j], off[s][j], cnt));
            const double e = rel_l2(on[j], ref[s][j], cnt);
            CHECKF(e <= 1e-4, "n=%d H=%lld output %d, run %d: cuda vs cpu rel L2 %.3g", n, (long long)H, j, r, e);
        }
        free_bufs(on);
    }
    ns_cuda_graph_stats(gpu, &rep1, &cap1, &eag1);
    /* the phase probe (NS_CUDA_MLP_PROBE, set by main): every CTA stamps
     * its gate/up rows done before it arrives at the grid barrier, and
     * passes it only after all have arrived, so the last "gate/up done"
     * cannot follow the first "barrier passed" in any launch (the global
     * timer is one clock for all SMs) */
    double ph[4][3], span;
    const int64_t launches = ns_cuda_mlp_probe_stats(gpu, ph, &span);
    CHECKF(launches >= 1, "n=%d H=%lld tail=%d: the MLP probe recorded no launch", n, (long long)H, tail);
    CHECKF(ph[0][0] == 0 && ph[1][2] <= ph[2][0] + 1e-6 && ph[2][2] <= ph[3][2] + 1e-6 && fabs(span - ph[3][2]) < 1e-6,
           "n=%d H=%lld tail=%d: MLP probe stamps out of order: start max %.3f, gate/up done %.3f-%.3f, barrier "
           "passed %.3f-%.3f, down done max %.3f, span %.3f us",
           n, (long long)H, tail, ph[0][2], ph[1][0], ph[1][2], ph[2][0], ph[2][2], ph[3][2], span);
    if (n == 1 && H == 4096 && tail == 0)
        printf("#   persistent MLP probe (%lld launches): gate/up done %.2f-%.2f us, barrier passed %.2f-%.2f us, "
               "down done by %.2f us\n",
               (long long)launches, ph[1][0], ph[1][2], ph[2][0], ph[2][2], ph[3][2]);
    ns_cuda_set_mlp(gpu, saved);
    ns_cuda_set_mlp_tail(gpu, tail0);
    CHECKF(cap1 > cap0 && rep1 >= rep0 + 2, "n=%d H=%lld: graph captures %lld, replays %lld (expected 1 and 2)", n,
           (long long)H, (long long)(cap1 - cap0), (long long)(rep1 - rep0));
    for (int s = 0; s < 2; s++) {
        free_bufs(ref[s]);
        free_bufs(off[s]);
        free(xin[s]);
        free(ain[s]);
    }
    chain_free(&ch);
}

/* split-K 2 / 2 (2048 x 2816), odd widths (1064 x 1000: chunk counts not
 * multiples of 32; the tail's q/k rows 1064 + 266, a pair spanning the
 * two), and Qwen3-8B's MLP (4096 x 12288: split-K 2 for gate/up, 4 for
 * down and q/k); each without and with the tail (the chain's add, RMSNorm
 * and q/k GEMVs after the MLP in the same kernel) */
TEST(test_mlp_persistent) {
    for (int tail = 0; tail < 2; tail++) {
        mlp_chain_check(1, 2048, 2816, tail);
        mlp_chain_check(2, 2048, 2816, tail);
        mlp_chain_check(1, 1064, 1000, tail);
        mlp_chain_check(2, 1064, 1000, tail);
        mlp_chain_check(1, 4096, 12288, tail);
    }
}

/* ------------------------------------------ attention block, op level */

/* forward.c's attention block of a decode step on given q/k/v (what the
 * q/k/v GEMVs left): q/k RMSNorm per head, RoPE, KV store, attention. On
 * the GPU with fusion on this is the fused q/k-norm + RoPE + store kernel
 * (cuda_fused.cu) and the decode attention; with fusion off the plain
 * kernels. Not this file's kernels: it tells a fault of that path from one
 * of the GEMV folds when the model cases fail. */
static void attn_block(ns_backend *be, int cpu_side, pair *q, pair *k, pair *v, pair *att, pair *qn, pair *kn,
                       pair *inv, int T, int H, int KVH, int D) {
#define TS(p) (cpu_side ? &(p)->c : &(p)->g)
    ns_tensor qh = *TS(q), kh = *TS(k);
    qh.rows = (int64_t)T * H;
    qh.cols = D;
    qh.alloc = NULL;
    kh.rows = (int64_t)T * KVH;
    kh.cols = D;
    kh.alloc = NULL;
    be->ops->rmsnorm(be, &qh, &qh, TS(qn), 1e-6f);
    be->ops->rmsnorm(be, &kh, &kh, TS(kn), 1e-6f);
    be->ops->rope(be, TS(q), H, D, TS(inv));
    be->ops->rope(be, TS(k), KVH, D, TS(inv));
    be->ops->kv_store(be, 0, TS(k), TS(v));
    be->ops->attention(be, TS(att), TS(q), 0, H, 1.0f / sqrtf((float)D));
#undef TS
}

/* Whether the profile report names the fused q/k-norm + RoPE + store
 * kernel (cuda_fused.cu). */
static int profile_has_qk_store(void) {
    char *text = profile_text();
    const int seen = text && strstr(text, "fused qk_norm+rope+kv_store") != NULL;
    free(text);
    return seen;
}

/* Decode steps at positions 0..steps-1 of n sequences (pages of 16 in
 * scattered, descending order), H query heads over 4 KV heads: CPU; GPU
 * with fusion on (graphs: eager, captured, replayed; the profile of the
 * first step must name the fused q/k-norm + RoPE + store kernel); GPU
 * with fusion off. q, k and the attention output of every step must be
 * bit-identical between the two GPU runs and close to the CPU. mma: the
 * tensor-core decode kernel for every step (ns_cuda_set_attn_dec_mma 2),
 * else the CUDA-core kernel (0; the default chooses tensor cores).
 * Steps past 64 cross pages, tiles (64 keys) and splits, so the new
 * token's row falls in every warp's quarter of a tile and in the first,
 * middle and last split. */
static void attn_block_check(int n, int D, int H, int steps, int mma) {
    const int KVH = 4, P = 16, pps = (steps + P - 1) / P;
    ns_kv_layout lc = {.n_pages = n * pps + 1, .page_tokens = P, .n_layers = 1, .n_kv_heads = KVH, .head_dim = D,
                       .dtype = NS_DT_F32};
    lc.page_size_bytes = ns_kv_page_bytes(1, KVH, P, D, NS_DT_F32);
    ns_kv_layout lg = lc;
    lg.dtype = NS_DT_BF16;
    lg.page_size_bytes = ns_kv_page_bytes(1, KVH, P, D, NS_DT_BF16);
    OK(cpu->ops->kv_alloc(cpu, &lc, &_e));
    OK(gpu->ops->kv_alloc(gpu, &lg, &_e));
    pair q, k, v, att, qn, kn, inv;
    memset(&q, 0, sizeof q);
    memset(&k, 0, sizeof k);
    memset(&v, 0, sizeof v);
    memset(&att, 0, sizeof att);
    act_pair(&q, n, (int64_t)H * D);
    act_pair(&k, n, (int64_t)KVH * D);
    act_pair(&v, n, (int64_t)KVH * D);
    act_pair(&att, n, (int64_t)H * D);
    weight_pair(&qn, 1, D, 0.5f, 1.0f);
    weight_pair(&kn, 1, D, 0.5f, 1.0f);
    {
        float *f = malloc((size_t)D / 2 * 4);
        for (int i = 0; i < D / 2; i++) f[i] = powf(10000.0f, -2.0f * (float)i / (float)D);
        memset(&inv, 0, sizeof inv);
        inv.rows = 1;
        inv.cols = D / 2;
        OK(cpu->ops->weight_from_host(cpu, &inv.c, f, NS_DT_F32, 1, D / 2, &_e));
        OK(gpu->ops->weight_from_host(gpu, &inv.g, f, NS_DT_F32, 1, D / 2, &_e));
        inv.host = f;
    }
    int32_t *pt = malloc((size_t)n * pps * sizeof *pt);
    for (int i = 0; i < n * pps; i++) pt[i] = n * pps - i; /* pages n*pps .. 1 */
    const size_t nq = (size_t)n * H * D, nk = (size_t)n * KVH * D;
    float **in = malloc((size_t)steps * 3 * sizeof *in), **out = malloc((size_t)3 * steps * 3 * sizeof *out);
    for (int st = 0; st < steps; st++)
        for (int j = 0; j < 3; j++) {
            const size_t cnt = j == 0 ? nq : nk;
            in[st * 3 + j] = malloc(cnt * 4);
            for (size_t i = 0; i < cnt; i++) in[st * 3 + j][i] = frand();
        }
    /* run 0 cpu, 1 fusion, 2 no fusion */
    int fused_seen = 0;
    for (int run = 0; run < 3; run++) {
        ns_backend *be = run == 0 ? cpu : gpu;
        const int cs = run == 0;
        if (run > 0) {
            ns_cuda_set_fusion(gpu, run == 1);
            ns_cuda_set_attn_dec_mma(gpu, mma ? 2 : 0);
        }
        for (int st = 0; st < steps; st++) {
            int32_t tok[2] = {1, 2}, pos[2] = {st, st}, ss[3] = {0, 1, 2}, sl[2] = {st + 1, st + 1};
            OK(be->ops->tensor_upload(be, cs ? &q.c : &q.g, in[st * 3 + 0], &_e));
            OK(be->ops->tensor_upload(be, cs ? &k.c : &k.g, in[st * 3 + 1], &_e));
            OK(be->ops->tensor_upload(be, cs ? &v.c : &v.g, in[st * 3 + 2], &_e));
            ns_batch b = {.n_tokens = n, .n_seqs = n, .tokens = tok, .positions = pos, .seq_start = ss,
                          .seq_len = sl, .page_table = pt, .max_pages = pps, .logit_rows = NULL, .n_logits = 0};
            OK(be->ops->set_batch(be, &b, &_e));
            if (run == 1 && st == 0) ns_cuda_set_profiling(gpu, 1);
            attn_block(be, cs, &q, &k, &v, &att, &qn, &kn, &inv, n, H, KVH, D);
            if (run == 1 && st == 0) {
                OK(gpu->ops->sync(gpu, &_e));
                fused_seen = profile_has_qk_store();
                ns_cuda_set_profiling(gpu, 0);
            }
            pair *ps[3] = {&q, &k, &att};
            for (int j = 0; j < 3; j++) {
                float **o = &out[(run * steps + st) * 3 + j];
                *o = malloc((size_t)(ps[j]->rows * ps[j]->cols) * 4);
                OK(be->ops->tensor_download(be, cs ? &ps[j]->c : &ps[j]->g, *o, &_e));
            }
        }
    }
    ns_cuda_set_fusion(gpu, 1);
    ns_cuda_set_attn_dec_mma(gpu, 1);
    CHECKF(fused_seen, "n=%d D=%d H=%d: the fused q/k-norm + RoPE + store kernel did not run", n, D, H);
    static const char *names[3] = {"q", "k", "attention"};
    double worst[3] = {0, 0, 0};
    int bad = 0;
    for (int st = 0; st < steps; st++)
        for (int j = 0; j < 3; j++) {
            const size_t cnt = j == 1 ? nk : nq;
            const float *o = out[(steps + st) * 3 + j], *ref = out[(2 * steps + st) * 3 + j];
            if (bad < 8 && memcmp(o, ref, cnt * 4) != 0) {
                bad++;
                CHECKF(0, "n=%d D=%d H=%d step %d %s: fused differs from unfused (rel L2 %.3g)", n, D, H, st,
                       names[j], rel_l2(o, ref, cnt));
            }
            for (int r = 1; r < 3; r++) {
                const double e = rel_l2(out[(r * steps + st) * 3 + j], out[st * 3 + j], cnt);
                if (e > worst[j]) worst[j] = e;
            }
        }
    printf("#   attention block n=%d D=%d H=%d, %d steps%s: cuda vs cpu worst rel L2 q %.3g, k %.3g, attention %.3g\n",
           n, D, H, steps, mma ? " (tensor cores)" : "", worst[0], worst[1], worst[2]);
    CHECKF(worst[0] <= 1e-5 && worst[1] <= 1e-5, "n=%d D=%d: q/k after norm + RoPE differ from cpu", n, D);
    /* K/V are stored as bf16 on the GPU, F32 on the CPU */
    CHECKF(worst[2] <= 1e-2, "n=%d D=%d: attention differs from cpu: %.3g", n, D, worst[2]);
    for (int i = 0; i < steps * 3; i++) free(in[i]);
    for (int i = 0; i < 3 * steps * 3; i++) free(out[i]);
    free(in);
    free(out);
    free(pt);
    pair *ps[7] = {&q, &k, &v, &att, &qn, &kn, &inv};
    for (int j = 0; j < 7; j++) pair_free(ps[j]);
    cpu->ops->kv_free(cpu);
    gpu->ops->kv_free(gpu);
}

TEST(test_attention_block_fused_vs_unfused) {
    attn_block_check(1, 128, 16, 5, 0);
    attn_block_check(2, 128, 16, 5, 0);
    attn_block_check(1, 64, 16, 5, 0);
}

/* the tensor-core decode kernel (TMA tiles at head dim 128) through 140
 * steps: GQA ratios 1, 4 and 8, one and two sequences */
TEST(test_attention_block_long) {
    attn_block_check(1, 128, 16, 140, 1);
    attn_block_check(2, 128, 32, 140, 1);
    attn_block_check(1, 128, 4, 140, 1);
    attn_block_check(2, 64, 16, 70, 1);
}

/* --------------------------------------------------------- model level */

#define PAGE 16

typedef struct {
    int32_t pt[8];
    int32_t ctx;
} seq;

/* One forward of ns sequences with nnew[i] tokens each (toks[i * 64 + j]);
 * the logits rows are lr when given, else each sequence's last token; with
 * dst, the logits are read into it. */
static ns_status step_rows(ns_engine *e, seq *ss, int ns, const int32_t *toks, const int32_t *nnew, const int32_t *lr,
                           float *dst, ns_error *err) {
    int32_t tok[128], pos[128], st[3], len[2], pt[16], lrc[2];
    int32_t t = 0;
    for (int i = 0; i < ns; i++) {
        st[i] = t;
        len[i] = ss[i].ctx + nnew[i];
        memcpy(pt + i * 8, ss[i].pt, sizeof ss[i].pt);
        for (int32_t j = 0; j < nnew[i]; j++, t++) {
            tok[t] = toks[i * 64 + j];
            pos[t] = ss[i].ctx + j;
        }
        lrc[i] = lr ? lr[i] : t - 1;
    }
    st[ns] = t;
    ns_batch b = {.n_tokens = t, .n_seqs = ns, .tokens = tok, .positions = pos, .seq_start = st, .seq_len = len,
                  .page_table = pt, .max_pages = 8, .logit_rows = lrc, .n_logits = ns};
    ns_status rc = ns_engine_forward(e, &b, err);
    if (rc == NS_OK && dst) rc = ns_engine_read_logits(e, ns, dst, err);
    if (rc == NS_OK)
        for (int i = 0; i < ns; i++) ss[i].ctx += nnew[i];
    return rc;
}

static ns_status step(ns_engine *e, seq *ss, int ns, const int32_t *toks, const int32_t *nnew, ns_error *err) {
    return step_rows(e, ss, ns, toks, nnew, NULL, NULL, err);
}

/* A random-weight model of a config.json text on the CPU (F32 KV) and on
 * the GPU (BF16 KV) from one seed, each with an engine of 128 tokens, 2
 * logits rows and 32 pages of PAGE tokens. On failure err says why;
 * model_pair_free frees whatever was made either way. */
typedef struct {
    ns_model_config cfg;
    ns_model *mc, *mg;
    ns_engine *ec, *eg;
} model_pair;

static ns_status model_pair_open(model_pair *mp, const char *cfg_text, uint64_t seed, ns_error *err) {
    memset(mp, 0, sizeof *mp);
    json_error_t je;
    json_t *root = json_loads(cfg_text, 0, &je);
    ns_status rc = root ? ns_config_from_json(root, NULL, &mp->cfg, err) : NS_ERR_INVALID;
    json_decref(root);
    if (rc == NS_OK) rc = ns_model_create_random(&mp->cfg, cpu, NS_DT_BF16, seed, &mp->mc, err);
    if (rc == NS_OK) rc = ns_model_create_random(&mp->cfg, gpu, NS_DT_BF16, seed, &mp->mg, err);
    ns_engine_opts oc = {.max_batch_tokens = 128, .max_logits = 2, .page_tokens = PAGE, .n_pages = 32,
                         .kv_dtype = NS_DT_F32};
    ns_engine_opts og = oc;
    og.kv_dtype = NS_DT_BF16;
    if (rc == NS_OK) rc = ns_engine_create(mp->mc, &oc, &mp->ec, err);
    if (rc == NS_OK) rc = ns_engine_create(mp->mg, &og, &mp->eg, err);
    return rc;
}

static void model_pair_free(model_pair *mp) {
    ns_engine_free(mp->ec);
    ns_engine_free(mp->eg);
    ns_model_free(mp->mc);
    ns_model_free(mp->mg);
}

/* Prefill, then STEPS decode steps of ns sequences: CPU; CUDA with the
 * switch off; CUDA with it on (graphs on in both), early weight loads as
 * given (they act only with the tape's early loads, which stay at their
 * default: off since run B, see cuda_backend.cu). */
typedef void (*gpu_switch)(ns_backend *, int);

/* dec_fuse with early weight loads as given; or another switch (sw),
 * whose results must then be bit-identical */
static void model_check_sw(const char *cfg_text, const char *what, int ns, int early, gpu_switch sw);
static void model_check(const char *cfg_text, const char *what, int ns, int early) {
    model_check_sw(cfg_text, what, ns, early, ns_cuda_set_dec_fuse);
}

static void model_check_sw(const char *cfg_text, const char *what, int ns, int early, gpu_switch sw) {
    enum { STEPS = 6 };
    ns_error err = {0};
    model_pair mp;
    ns_status rc = model_pair_open(&mp, cfg_text, 11, &err);
    CHECKF(rc == NS_OK, "%s setup: %s", what, err.msg);
    if (rc != NS_OK) {
        model_pair_free(&mp);
        return;
    }
    ns_engine *ec = mp.ec, *eg = mp.eg;
    const int32_t V = mp.cfg.vocab_size;
    float *lc = malloc((size_t)STEPS * 2 * V * 4), *lo = malloc((size_t)STEPS * 2 * V * 4),
          *ln = malloc((size_t)2 * V * 4);
    int32_t prompt[2 * 64], nn[2] = {29, 7}, one[2] = {1, 1}, dt[STEPS][2 * 64];
    for (int i = 0; i < 2 * 64; i++) prompt[i] = (i * 977 + 131) % V;
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < 2; i++) dt[k][i * 64] = (k * 31 + i * 7 + 1) % V;
    seq sc[2], so[2], sn[2], s0[2];
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < 8; p++) sc[i].pt[p] = 31 - (i * 8 + p); /* scattered, descending pages */
        sc[i].ctx = 0;
    }
    memcpy(so, sc, sizeof sc);
    double worst_cpu = 0, worst_off_cpu = 0, worst_on_off = 0;
    int bitwise = 1, repeatable = 1;
    const size_t row = (size_t)ns * V;
    if (rc == NS_OK) rc = step(ec, sc, ns, prompt, nn, &err);
    ns_cuda_set_dec_fuse(gpu, 0);
    sw(gpu, 0);
    if (rc == NS_OK) rc = step(eg, so, ns, prompt, nn, &err);
    /* every GPU pass starts from the same prefilled pages and rewrites the
     * same slots (with the same values when it is bit-identical) */
    memcpy(s0, so, sizeof so);
    for (int k = 0; k < STEPS && rc == NS_OK; k++) {
        rc = step(ec, sc, ns, dt[k], one, &err);
        if (rc == NS_OK) rc = ns_engine_read_logits(ec, ns, lc + k * row, &err);
        if (rc == NS_OK) rc = step(eg, so, ns, dt[k], one, &err);
        if (rc == NS_OK) rc = ns_engine_read_logits(eg, ns, lo + k * row, &err);
        if (rc == NS_OK) {
            const double e = rel_l2(lo + k * row, lc + k * row, row);
            if (e > worst_off_cpu) worst_off_cpu = e;
        }
    }
    /* the switch-off pass again: the reference itself must be repeatable
     * (a difference here is not the switch's) */
    memcpy(sn, s0, sizeof s0);
    for (int k = 0; k < STEPS && rc == NS_OK; k++) {
        rc = step(eg, sn, ns, dt[k], one, &err);
        if (rc == NS_OK) rc = ns_engine_read_logits(eg, ns, ln, &err);
        if (rc == NS_OK && memcmp(lo + k * row, ln, row * 4) != 0) {
            repeatable = 0;
            printf("#   %s step %d: switch off, second pass vs first rel L2 %.3g\n", what, k,
                   rel_l2(ln, lo + k * row, row));
        }
    }
    /* switch on for all steps: eager, captured, then replayed */
    memcpy(sn, s0, sizeof s0);
    sw(gpu, 1);
    if (sw == ns_cuda_set_dec_fuse) ns_cuda_set_dec_early(gpu, early);
    int64_t rep0, cap0, eag0, rep1, cap1, eag1;
    ns_cuda_graph_stats(gpu, &rep0, &cap0, &eag0);
    for (int k = 0; k < STEPS && rc == NS_OK; k++) {
        rc = step(eg, sn, ns, dt[k], one, &err);
        if (rc == NS_OK) rc = ns_engine_read_logits(eg, ns, ln, &err);
        if (rc != NS_OK) break;
        const double e = rel_l2(ln, lc + k * row, row);
        if (memcmp(lo + k * row, ln, row * 4) != 0) {
            bitwise = 0;
            const double d = rel_l2(ln, lo + k * row, row);
            if (d > worst_on_off) worst_on_off = d;
            printf("#   %s step %d: switch on vs off rel L2 %.3g (on vs cpu %.3g, off vs cpu %.3g)\n", what, k, d, e,
                   rel_l2(lo + k * row, lc + k * row, row));
        }
        if (e > worst_cpu) worst_cpu = e;
    }
    ns_cuda_graph_stats(gpu, &rep1, &cap1, &eag1);
    CHECKF(rep1 > rep0, "%s: no decode step was replayed from a graph with the switch on", what);
    sw(gpu, 0);
    ns_cuda_set_dec_early(gpu, 0);
    CHECKF(rc == NS_OK, "%s decode: %s", what, err.msg);
    printf("#   %s, %d seqs, early loads %s: switch on vs off %s (worst rel L2 %.3g); cuda vs cpu worst rel L2 %.3g "
           "(switch off: %.3g, %s)\n",
           what, ns, early ? "on" : "off", bitwise ? "bit-identical" : "rounding apart", worst_on_off, worst_cpu,
           worst_off_cpu, repeatable ? "repeatable" : "NOT REPEATABLE");
    CHECKF(repeatable, "%s: the switch-off decode is not repeatable (not the switch's doing)", what);
    CHECKF(worst_on_off <= 1e-5, "%s: decode logits with the switch on differ from off: %.3g", what, worst_on_off);
    CHECKF(bitwise || sw == ns_cuda_set_dec_fuse, "%s: decode logits with the switch on are not bit-identical", what);
    CHECKF(worst_cpu <= 2e-2, "%s: cuda decode logits differ from cpu: %.3g", what, worst_cpu);
    free(lc);
    free(lo);
    free(ln);
    model_pair_free(&mp);
}

static const char *QWEN3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 4096, \"hidden_size\": 2048, "
    "\"intermediate_size\": 2816, \"num_hidden_layers\": 2, \"num_attention_heads\": 16, "
    "\"num_key_value_heads\": 4, \"head_dim\": 128, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, "
    "\"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}";

static const char *QWEN3MOE =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 4096, \"hidden_size\": 2048, "
    "\"intermediate_size\": 2816, \"moe_intermediate_size\": 256, \"num_experts\": 16, "
    "\"num_experts_per_tok\": 4, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, "
    "\"mlp_only_layers\": [], \"num_hidden_layers\": 2, \"num_attention_heads\": 16, "
    "\"num_key_value_heads\": 4, \"head_dim\": 128, \"rms_norm_eps\": 1e-6, "
    "\"rope_theta\": 1000000, \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}";

TEST(test_model_qwen3_batch1) {
    model_check(QWEN3, "qwen3-shaped", 1, 0);
    model_check(QWEN3, "qwen3-shaped", 1, 1);
}
TEST(test_model_qwen3_batch2) { model_check(QWEN3, "qwen3-shaped", 2, 1); }
/* the persistent MLP kernel (cuda_mlp.cu) in whole decode steps */
TEST(test_model_qwen3_mlp) {
    const int saved = ns_cuda_get_mlp(gpu), tail = ns_cuda_get_mlp_tail(gpu);
    for (int t = 0; t < 2; t++) {
        ns_cuda_set_mlp_tail(gpu, t);
        model_check_sw(QWEN3, t ? "qwen3-shaped, persistent MLP + tail" : "qwen3-shaped, persistent MLP", 1, 0,
                       ns_cuda_set_mlp);
        model_check_sw(QWEN3, t ? "qwen3-shaped, persistent MLP + tail" : "qwen3-shaped, persistent MLP", 2, 0,
                       ns_cuda_set_mlp);
    }
    ns_cuda_set_mlp(gpu, saved);
    ns_cuda_set_mlp_tail(gpu, tail);
}
/* The chunk runs test_prefill_lean and test_row_fuse repeat per setting:
 * `steps` forwards of two sequences from empty, on the pages of `pages`
 * (toks[k], nnew[k] as step_rows takes them; the last step asks for the
 * logits rows last_rows when given). With ref NULL each step's logits go
 * to out + k * row (the reference run); else to out (one step's rows) and
 * *bitwise is cleared for a step that differs from ref + k * row. With
 * cpu_ref, *worst is the largest rel L2 against cpu_ref + k * row. */
static ns_status run_chunks(ns_engine *e, const seq pages[2], int steps, const int32_t (*toks)[2 * 64],
                            const int32_t (*nnew)[2], const int32_t *last_rows, size_t row, float *out,
                            const float *ref, const float *cpu_ref, const char *label, int *bitwise, double *worst,
                            ns_error *err) {
    seq sg[2];
    for (int i = 0; i < 2; i++) {
        memcpy(sg[i].pt, pages[i].pt, sizeof sg[i].pt);
        sg[i].ctx = 0;
    }
    *bitwise = 1;
    *worst = 0;
    for (int k = 0; k < steps; k++) {
        float *got = ref ? out : out + k * row;
        ns_status rc = step_rows(e, sg, 2, toks[k], nnew[k], k == steps - 1 ? last_rows : NULL, got, err);
        if (rc != NS_OK) return rc;
        if (ref && memcmp(got, ref + k * row, row * 4) != 0) {
            *bitwise = 0;
            printf("#   %s step %d: rel L2 %.3g against the reference run\n", label, k, rel_l2(got, ref + k * row, row));
        }
        const double d = cpu_ref ? rel_l2(got, cpu_ref + k * row, row) : 0;
        if (d > *worst) *worst = d;
    }
    return NS_OK;
}

/* NS_CUDA_PREFILL_LEAN (cu_tape_f32_dead; the residual added inside the
 * GEMM): two prefill chunks of two sequences (the second against the
 * first's cached pages) and a decode step that reads what they stored,
 * with each part off and on. The logits must be bit-identical to both
 * parts off, each part must have acted (its counter moved) exactly when
 * on, and all must stay near the CPU's. */
TEST(test_prefill_lean) {
    enum { STEPS = 3 };
    ns_error err = {0};
    model_pair mp;
    ns_status rc = model_pair_open(&mp, QWEN3, 13, &err);
    CHECKF(rc == NS_OK, "prefill lean setup: %s", err.msg);
    if (rc != NS_OK) {
        model_pair_free(&mp);
        return;
    }
    const int saved = ns_cuda_get_prefill_lean(gpu);
    const int32_t V = mp.cfg.vocab_size;
    const size_t row = (size_t)2 * V;
    float *lc = malloc(STEPS * row * 4), *l0 = malloc(STEPS * row * 4), *ln = malloc(row * 4);
    int32_t toks[STEPS][2 * 64];
    const int32_t nnew[STEPS][2] = {{29, 40}, {21, 13}, {1, 1}};
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < 2 * 64; i++) toks[k][i] = (k * 7919 + i * 977 + 131) % V;
    seq sc[2];
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < 8; p++) sc[i].pt[p] = 2 + i * 8 + p;
        sc[i].ctx = 0;
    }
    int bitwise = 1;
    double worst_cpu = 0;
    rc = run_chunks(mp.ec, sc, STEPS, toks, nnew, NULL, row, lc, NULL, NULL, "cpu", &bitwise, &worst_cpu, &err);
    for (int mode = 0; mode < 4 && rc == NS_OK; mode++) {
        ns_cuda_set_prefill_lean(gpu, mode);
        int64_t d0, f0, d1, f1;
        ns_cuda_prefill_lean_stats(gpu, &d0, &f0);
        char label[32];
        snprintf(label, sizeof label, "prefill lean %d", mode);
        rc = run_chunks(mp.eg, sc, STEPS, toks, nnew, NULL, row, mode ? ln : l0, mode ? l0 : NULL, lc, label,
                        &bitwise, &worst_cpu, &err);
        ns_cuda_prefill_lean_stats(gpu, &d1, &f1);
        CHECKF(rc == NS_OK, "prefill lean %d: %s", mode, err.msg);
        printf("#   prefill lean %d: %lld F32 outputs dropped, %lld projections added in the GEMM; %s lean 0; "
               "cuda vs cpu worst rel L2 %.3g\n",
               mode, (long long)(d1 - d0), (long long)(f1 - f0), bitwise ? "bit-identical to" : "DIFFERS from",
               worst_cpu);
        CHECKF(bitwise, "prefill lean %d: logits differ from lean 0", mode);
        CHECKF((d1 > d0) == ((mode & 1) != 0), "prefill lean %d: F32 outputs dropped %lld times", mode,
               (long long)(d1 - d0));
        CHECKF((f1 > f0) == ((mode & 2) != 0), "prefill lean %d: residual GEMMs %lld", mode, (long long)(f1 - f0));
        CHECKF(worst_cpu <= 2e-2, "prefill lean %d: cuda logits differ from cpu: %.3g", mode, worst_cpu);
    }
    ns_cuda_set_prefill_lean(gpu, saved);
    free(lc);
    free(l0);
    free(ln);
    model_pair_free(&mp);
}

/* The step's first and last row ops fused (NS_CUDA_ROW_FUSE;
 * cuda_tape_fuse.cu 5: embed + RMSNorm, 6: add + gather + RMSNorm).
 * Decode at batch 1 and 2 through model_check_sw (eager, captured,
 * replayed); then two prefill chunks of two sequences (the second against
 * the first's pages), two decode steps and a step whose two logits rows
 * name the same token, with the fusions off and on: the logits must be
 * bit-identical, both fused kernels must have run (profile labels), and
 * all must stay near the CPU's. */
static void row_fuse_sw(ns_backend *be, int on) { ns_cuda_set_row_fuse(be, on ? 3 : 0); }

TEST(test_row_fuse) {
    enum { STEPS = 5 };
    const int saved = ns_cuda_get_row_fuse(gpu);
    model_check_sw(QWEN3, "qwen3-shaped, row fusions", 1, 0, row_fuse_sw);
    model_check_sw(QWEN3, "qwen3-shaped, row fusions", 2, 0, row_fuse_sw);
    ns_error err = {0};
    model_pair mp;
    ns_status rc = model_pair_open(&mp, QWEN3, 19, &err);
    CHECKF(rc == NS_OK, "row fusions setup: %s", err.msg);
    if (rc != NS_OK) {
        model_pair_free(&mp);
        ns_cuda_set_row_fuse(gpu, saved);
        return;
    }
    const int32_t V = mp.cfg.vocab_size;
    const size_t row = (size_t)2 * V;
    float *lc = malloc(STEPS * row * 4), *l0 = malloc(STEPS * row * 4), *ln = malloc(row * 4);
    int32_t toks[STEPS][2 * 64];
    const int32_t nnew[STEPS][2] = {{29, 40}, {21, 13}, {1, 1}, {1, 1}, {3, 2}};
    /* the last step's two logits rows both name sequence 0's last token */
    const int32_t dup[2] = {2, 2};
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < 2 * 64; i++) toks[k][i] = (k * 7717 + i * 389 + 57) % V;
    seq sc[2];
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < 8; p++) sc[i].pt[p] = 2 + i * 8 + p;
        sc[i].ctx = 0;
    }
    int bitwise = 1;
    double worst_cpu = 0;
    rc = run_chunks(mp.ec, sc, STEPS, toks, nnew, dup, row, lc, NULL, NULL, "cpu", &bitwise, &worst_cpu, &err);
    for (int mode = 0; mode < 2 && rc == NS_OK; mode++) {
        ns_cuda_set_row_fuse(gpu, mode ? 3 : 0);
        ns_cuda_set_profiling(gpu, 1);
        rc = run_chunks(mp.eg, sc, STEPS, toks, nnew, dup, row, mode ? ln : l0, mode ? l0 : NULL, lc, "row fusions",
                        &bitwise, &worst_cpu, &err);
        char *text = profile_text(); /* also resets it */
        ns_cuda_set_profiling(gpu, 0);
        const int ran = text && strstr(text, "fused embed+rmsnorm") && strstr(text, "fused add+gather+rmsnorm");
        free(text);
        CHECKF(rc == NS_OK, "row fusions %d: %s", mode, err.msg);
        printf("#   row fusions %s: fused kernels %s; %s unfused; cuda vs cpu worst rel L2 %.3g\n", mode ? "on" : "off",
               ran ? "ran" : "did not run", bitwise ? "bit-identical to" : "DIFFERS from", worst_cpu);
        CHECKF(bitwise, "row fusions: logits differ from unfused");
        CHECKF(ran == mode, "row fusions %s: the fused kernels %s", mode ? "on" : "off", ran ? "ran" : "did not run");
        CHECKF(worst_cpu <= 2e-2, "row fusions %d: cuda logits differ from cpu: %.3g", mode, worst_cpu);
    }
    ns_cuda_set_row_fuse(gpu, saved);
    free(lc);
    free(l0);
    free(ln);
    model_pair_free(&mp);
}

/* experts follow the post-attention norm (no GEMV there) */
TEST(test_model_qwen3moe_batch1) { model_check(QWEN3MOE, "qwen3moe-shaped", 1, 1); }

/* The step memo (backend.h memo_save / memo_replay) and the packed
 * metadata upload: a prefill, then decode steps whose shape changes (two
 * sequences, one, two again; the memo holds only the last shape) and a
 * captured setting flipped half way (its generation bump drops the memo),
 * run with the memo off and again with it on from the same prefilled
 * pages. Every step's logits must be bit-identical, the memo must have
 * served steps, and CUDA must stay within bf16 tolerance of the CPU. */
TEST(test_step_memo) {
    enum { STEPS = 12 };
    static const int nseq[STEPS] = {2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 1, 2};
    ns_error err = {0};
    model_pair mp;
    ns_status rc = model_pair_open(&mp, QWEN3, 17, &err);
    CHECKF(rc == NS_OK, "setup: %s", err.msg);
    if (rc != NS_OK) {
        model_pair_free(&mp);
        return;
    }
    ns_engine *ec = mp.ec, *eg = mp.eg;
    const int32_t V = mp.cfg.vocab_size;
    const size_t row = (size_t)2 * V;
    float *lc = malloc(STEPS * row * 4), *loff = malloc(STEPS * row * 4), *lon = malloc(STEPS * row * 4);
    int32_t prompt[2 * 64], nn[2] = {13, 30}, one[2] = {1, 1}, dt[STEPS][2 * 64];
    for (int i = 0; i < 2 * 64; i++) prompt[i] = (i * 613 + 29) % V;
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < 2; i++) dt[k][i * 64] = (k * 53 + i * 11 + 5) % V;
    seq sc[2], sg[2], s0[2];
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < 8; p++) sc[i].pt[p] = 2 + i * 8 + p;
        sc[i].ctx = 0;
    }
    memcpy(sg, sc, sizeof sc);
    if (rc == NS_OK) rc = step(ec, sc, 2, prompt, nn, &err);
    if (rc == NS_OK) rc = step(eg, sg, 2, prompt, nn, &err);
    memcpy(s0, sg, sizeof sg);
    const int memo0 = ns_cuda_get_memo(gpu), pf = ns_cuda_get_prefetch(gpu);
    double worst_cpu = 0;
    int64_t served[2] = {0, 0}, direct[2] = {0, 0};
    for (int pass = 0; pass < 2 && rc == NS_OK; pass++) {
        ns_cuda_set_memo(gpu, pass);
        memcpy(sg, s0, sizeof s0);
        const int64_t m0 = ns_cuda_memo_replays(gpu), d0 = ns_cuda_memo_direct(gpu);
        float *lg = pass ? lon : loff;
        for (int k = 0; k < STEPS && rc == NS_OK; k++) {
            if (k == 8) ns_cuda_set_prefetch(gpu, pf); /* same value: only the generation bump */
            rc = step(eg, sg, nseq[k], dt[k], one, &err);
            if (rc == NS_OK) rc = ns_engine_read_logits(eg, nseq[k], lg + k * row, &err);
            if (rc == NS_OK && pass == 0) {
                rc = step(ec, sc, nseq[k], dt[k], one, &err);
                if (rc == NS_OK) rc = ns_engine_read_logits(ec, nseq[k], lc + k * row, &err);
                const double e = rel_l2(lg + k * row, lc + k * row, (size_t)nseq[k] * V);
                if (e > worst_cpu) worst_cpu = e;
            }
        }
        served[pass] = ns_cuda_memo_replays(gpu) - m0;
        direct[pass] = ns_cuda_memo_direct(gpu) - d0;
    }
    ns_cuda_set_memo(gpu, memo0);
    CHECKF(rc == NS_OK, "decode: %s", err.msg);
    int identical = 1;
    for (int k = 0; k < STEPS && rc == NS_OK; k++)
        if (memcmp(loff + k * row, lon + k * row, (size_t)nseq[k] * V * 4) != 0) {
            identical = 0;
            printf("#   step %d (%d seqs): memo on vs off rel L2 %.3g\n", k, nseq[k],
                   rel_l2(lon + k * row, loff + k * row, (size_t)nseq[k] * V));
        }
    /* the memo serves a step whose shape matches the last recorded step's,
     * unless the generation moved in between: steps 1, 2, 4, 5, 7 and 9
     * (8 follows the bump) */
    printf("#   step memo: %lld of %d decode steps served, %lld of them launched directly (memo off: %lld); cuda vs "
           "cpu worst rel L2 %.3g\n",
           (long long)served[1], STEPS, (long long)direct[1], (long long)served[0], worst_cpu);
    CHECK(identical);
    CHECK_EQ_INT((int)served[0], 0);
    CHECK_EQ_INT((int)served[1], 6);
    /* a direct launch needs a graph launched from the same memo before
     * (the first replay of a memo links it): at most steps 2 and 5 */
    CHECK_EQ_INT((int)direct[0], 0);
    CHECKF(direct[1] >= 1 && direct[1] <= 2, "%lld steps launched directly from the memo", (long long)direct[1]);
    CHECKF(worst_cpu <= 2e-2, "cuda decode logits differ from cpu: %.3g", worst_cpu);
    free(lc);
    free(loff);
    free(lon);
    model_pair_free(&mp);
}

int main(void) {
    /* the persistent MLP's phase probe, read by mlp_chain_check (it adds
     * two block barriers to each launch and changes no result) */
    setenv("NS_CUDA_MLP_PROBE", "1", 1);
    if (!gpu_test_open(2)) return 1;
    RUN(test_chain_batch1);
    RUN(test_chain_batch2);
    RUN(test_chain_bulk_gemv);
    RUN(test_chain_odd_shapes);
    RUN(test_chain_hidden_1024);
    RUN(test_mlp_persistent);
    RUN(test_attention_block_fused_vs_unfused);
    RUN(test_attention_block_long);
    RUN(test_model_qwen3_batch1);
    RUN(test_model_qwen3_batch2);
    RUN(test_model_qwen3_mlp);
    RUN(test_prefill_lean);
    RUN(test_model_qwen3moe_batch1);
    RUN(test_step_memo);
    RUN(test_row_fuse);
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END;
}
