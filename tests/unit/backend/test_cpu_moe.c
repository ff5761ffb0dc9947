/* test_cpu_moe.c — the CPU backend's moe_ffn and add_bias ops
 * (src/backend/cpu/cpu_moe.c) against a direct double-precision
 * evaluation of their contract in backend.h: softmax router, top k (ties
 * to the lower index), optional renormalization, SwiGLU experts, results
 * added to out. Batches of 1 (decode), a few and many tokens (prefill
 * groups), F32 and BF16 expert weights, and an expert whose weights sit
 * in unreadable memory and that the router never picks: the op must not
 * touch it (a read would crash the test). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 40) / 8388608.0 - 1.0);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    int E, K, H, F;
    bool norm, bf16;
    float *router;  /* [E, H] */
    float *w[3];    /* gate/up [E][F][H], down [E][H][F], as the op sees them (bf16-rounded when bf16) */
    void *store[3]; /* what the tensors point to */
    int dead;       /* expert whose weights are unreadable and never chosen (-1: none) */
    size_t dead_bytes;
    void *dead_map[3];
} moe_case;

/* Fills a case; the dead expert's router row is pushed far down. */
static void make_case(moe_case *m) {
    m->router = malloc(sizeof(float) * (size_t)m->E * (size_t)m->H);
    for (int i = 0; i < m->E * m->H; i++) m->router[i] = frand();
    if (m->dead >= 0)
        for (int j = 0; j < m->H; j++) m->router[m->dead * m->H + j] = 0; /* logit 0 */
    const size_t per = (size_t)m->F * (size_t)m->H, esz = m->bf16 ? 2 : 4;
    for (int k = 0; k < 3; k++) {
        m->w[k] = malloc(sizeof(float) * per * (size_t)m->E);
        m->store[k] = malloc(esz * per * (size_t)m->E);
        for (size_t i = 0; i < per * (size_t)m->E; i++) {
            float v = frand() * 0.5f;
            if (m->bf16) {
                ((uint16_t *)m->store[k])[i] = to_bf16(v);
                v = from_bf16(to_bf16(v));
            } else {
                ((float *)m->store[k])[i] = v;
            }
            m->w[k][i] = v;
        }
    }
    if (m->dead >= 0) {
        m->dead_bytes = (per * esz + 4095) / 4096 * 4096;
        for (int k = 0; k < 3; k++) {
            m->dead_map[k] = mmap(NULL, m->dead_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(m->dead_map[k] != MAP_FAILED);
        }
    }
}

static void free_case(moe_case *m) {
    free(m->router);
    for (int k = 0; k < 3; k++) {
        free(m->w[k]);
        free(m->store[k]);
        if (m->dead >= 0) munmap(m->dead_map[k], m->dead_bytes);
    }
}

/* out[t] += the contract's value, in double. in: [T, H]. */
static void reference(const moe_case *m, const float *in, int T, double *out) {
    const int E = m->E, K = m->K, H = m->H, F = m->F;
    double *p = malloc(sizeof(double) * (size_t)E), *g = malloc(sizeof(double) * (size_t)F);
    int *sel = malloc(sizeof(int) * (size_t)K);
    double *ws = malloc(sizeof(double) * (size_t)K);
    for (int t = 0; t < T; t++) {
        const float *x = in + (size_t)t * H;
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) {
            double s = 0;
            for (int j = 0; j < H; j++) s += (double)m->router[e * H + j] * x[j];
            p[e] = s;
            mx = s > mx ? s : mx;
        }
        for (int e = 0; e < E; e++) sum += (p[e] = exp(p[e] - mx));
        double ksum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < k; q++) taken = taken || sel[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[k] = best;
            ws[k] = p[best] / sum;
            ksum += ws[k];
        }
        for (int k = 0; k < K; k++) {
            int e = sel[k];
            double wk = m->norm ? ws[k] / ksum : ws[k];
            const float *wg = m->w[0] + (size_t)e * F * H, *wu = m->w[1] + (size_t)e * F * H,
                        *wd = m->w[2] + (size_t)e * H * F;
            for (int f = 0; f < F; f++) {
                double a = 0, b = 0;
                for (int j = 0; j < H; j++) {
                    a += (double)wg[f * H + j] * x[j];
                    b += (double)wu[f * H + j] * x[j];
                }
                g[f] = a / (1 + exp(-a)) * b;
            }
            for (int h = 0; h < H; h++) {
                double s = 0;
                for (int f = 0; f < F; f++) s += (double)wd[h * F + f] * g[f];
                out[(size_t)t * H + h] += wk * s;
            }
        }
    }
    free(p);
    free(g);
    free(sel);
    free(ws);
}

static void weight(ns_backend *be, ns_tensor *t, const void *src, bool bf16, int64_t rows, int64_t cols) {
    ns_error err = {0};
    CHECKF(be->ops->weight_from_host(be, t, src, bf16 ? NS_DT_BF16 : NS_DT_F32, rows, cols, &err) == NS_OK, "%s", err.msg);
}

/* Runs the op on T tokens and compares with the reference. */
static void run_case(ns_backend *be, moe_case *m, int T) {
    const int E = m->E, H = m->H, F = m->F;
    const size_t esz = m->bf16 ? 2 : 4, per = (size_t)F * H;
    ns_tensor router, *ex = calloc((size_t)(3 * E), sizeof *ex);
    weight(be, &router, m->router, false, E, H);
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            const void *src = e == m->dead ? m->dead_map[k] : (const uint8_t *)m->store[k] + (size_t)e * per * esz;
            weight(be, &ex[k * E + e], src, m->bf16, k == 2 ? H : F, k == 2 ? F : H);
        }
    ns_tensor in, out;
    ns_error err = {0};
    CHECK(be->ops->tensor_alloc(be, &in, NS_DT_F32, T, H, &err) == NS_OK);
    CHECK(be->ops->tensor_alloc(be, &out, NS_DT_F32, T, H, &err) == NS_OK);
    double *want = calloc((size_t)T * H, sizeof *want);
    for (int i = 0; i < T * H; i++) {
        ((float *)in.data)[i] = frand();
        ((float *)out.data)[i] = frand(); /* the op adds to what is there */
        want[i] = ((float *)out.data)[i];
    }
    reference(m, in.data, T, want);
    be->ops->moe_ffn(be, &out, &in, &router, ex, E, m->K, m->norm);
    double maxerr = 0;
    for (int i = 0; i < T * H; i++) {
        double d = fabs(((float *)out.data)[i] - want[i]);
        if (!(d <= maxerr)) maxerr = d; /* NaN propagates */
    }
    CHECKF(maxerr < 1e-4, "E=%d K=%d T=%d norm=%d bf16=%d: max error %g", E, m->K, T, m->norm, m->bf16, maxerr);
    free(want);
    be->ops->tensor_free(be, &in);
    be->ops->tensor_free(be, &out);
    be->ops->tensor_free(be, &router);
    for (int i = 0; i < 3 * E; i++)
        if (ex[i].alloc) be->ops->tensor_free(be, &ex[i]);
    free(ex);
}

static ns_backend *cpu(void) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECKF(ns_backend_cpu_create(2, &be, &err) == NS_OK, "%s", err.msg);
    return be;
}

TEST(moe_matches_reference) {
    ns_backend *be = cpu();
    if (!be) return;
    static const struct { int E, K, H, F; bool norm, bf16; } k[] = {
        {8, 2, 64, 32, true, false}, {8, 2, 64, 32, false, true}, {4, 1, 48, 16, false, false},
        {16, 4, 32, 24, true, true}, {3, 3, 40, 8, true, false},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        moe_case m = {.E = k[i].E, .K = k[i].K, .H = k[i].H, .F = k[i].F, .norm = k[i].norm, .bf16 = k[i].bf16, .dead = -1};
        make_case(&m);
        static const int Ts[] = {1, 3, 9, 37, 130}; /* decode, small and BLAS-sized groups */
        for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) run_case(be, &m, Ts[t]);
        free_case(&m);
    }
    be->ops->destroy(be);
}

TEST(moe_never_reads_unchosen_experts) {
    ns_backend *be = cpu();
    if (!be) return;
    /* Expert 5's weights are PROT_NONE. Its router logit is 0, every other
     * expert's is (50 + e) * x[0] >= 25 since the inputs below keep
     * x[0] >= 0.5: it is never in the top 2, so reading it is a bug. */
    moe_case m = {.E = 8, .K = 2, .H = 32, .F = 16, .norm = true, .bf16 = true, .dead = 5};
    make_case(&m);
    for (int e = 0; e < m.E; e++)
        for (int j = 0; j < m.H; j++) m.router[e * m.H + j] = e != m.dead && j == 0 ? 50.0f + (float)e : 0;
    ns_tensor router, *ex = calloc(3 * (size_t)(unsigned)m.E, sizeof *ex);
    weight(be, &router, m.router, false, m.E, m.H);
    const size_t per = (size_t)m.F * m.H;
    for (int e = 0; e < m.E; e++)
        for (int k = 0; k < 3; k++) {
            const void *src = e == m.dead ? m.dead_map[k] : (const uint8_t *)m.store[k] + (size_t)e * per * 2;
            weight(be, &ex[k * m.E + e], src, true, k == 2 ? m.H : m.F, k == 2 ? m.F : m.H);
        }
    ns_tensor in, out;
    ns_error err = {0};
    const size_t T = 50;
    CHECK(be->ops->tensor_alloc(be, &in, NS_DT_F32, (int64_t)T, m.H, &err) == NS_OK);
    CHECK(be->ops->tensor_alloc(be, &out, NS_DT_F32, (int64_t)T, m.H, &err) == NS_OK);
    double *want = calloc(T * (size_t)m.H, sizeof *want);
    for (size_t t = 0; t < T; t++)
        for (int j = 0; j < m.H; j++) {
            float v = frand();
            ((float *)in.data)[t * m.H + j] = j == 0 ? 0.5f + 0.5f * fabsf(v) : v; /* live logits >= 25 */
            ((float *)out.data)[t * m.H + j] = 0;
        }
    reference(&m, in.data, (int)T, want);
    be->ops->moe_ffn(be, &out, &in, &router, ex, m.E, m.K, m.norm);
    double maxerr = 0;
    for (size_t i = 0; i < T * (size_t)m.H; i++) {
        double d = fabs(((float *)out.data)[i] - want[i]);
        if (!(d <= maxerr)) maxerr = d;
    }
    CHECKF(maxerr < 1e-4, "max error %g", maxerr);
    free(want);
    be->ops->tensor_free(be, &in);
    be->ops->tensor_free(be, &out);
    be->ops->tensor_free(be, &router);
    for (int i = 0; i < 3 * m.E; i++)
        if (ex[i].alloc) be->ops->tensor_free(be, &ex[i]);
    free(ex);
    free_case(&m);
    be->ops->destroy(be);
}

TEST(add_bias_adds_to_every_row) {
    ns_backend *be = cpu();
    if (!be) return;
    ns_tensor x, b;
    ns_error err = {0};
    float bias[5] = {1, -2, 0.5f, 4, -0.25f};
    CHECK(be->ops->tensor_alloc(be, &x, NS_DT_F32, 7, 5, &err) == NS_OK);
    weight(be, &b, bias, false, 1, 5);
    CHECK(b.dtype == NS_DT_F32);
    for (int i = 0; i < 35; i++) ((float *)x.data)[i] = (float)i;
    be->ops->add_bias(be, &x, &b);
    int bad = 0;
    for (int i = 0; i < 35; i++) bad += ((float *)x.data)[i] != (float)i + bias[i % 5];
    CHECK_EQ_INT(bad, 0);
    be->ops->tensor_free(be, &x);
    be->ops->tensor_free(be, &b);
    be->ops->destroy(be);
}

int main(void) {
    RUN(moe_matches_reference);
    RUN(moe_never_reads_unchosen_experts);
    RUN(add_bias_adds_to_every_row);
    TEST_MAIN_END;
}
