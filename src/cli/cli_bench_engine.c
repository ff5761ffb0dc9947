/* cli_bench_engine.c — `nightshift bench-engine` (see cli_bench_engine.h).
 *
 * What is measured, and against what:
 * - ceilings, in the same run: device copy bandwidth (a large copy,
 *   counting bytes read + written) and the bf16 GEMM rate (8192^3 through
 *   cuBLASLt); on --device cpu, memcpy bandwidth and the backend's own
 *   matmul rate.
 * - every point is timed --repeats times (default 3) and reported as the
 *   median, with the spread (min-max) beside it.
 * - prefill of one prompt of L tokens (chunks of --chunk tokens, logits
 *   for the last token only): tokens/s and FLOP/s,
 *   FLOPs = 2 * L * (layer weight params) + causal attention 4*H*D*L(L+1)/2
 *   per layer; roofline = FLOPs / measured GEMM rate.
 * - decode: `batch` sequences each with `ctx` tokens of (random) KV
 *   already in the pool, one token per sequence per step, greedy sampling
 *   on the device, warm-up steps first (graph capture), then timed steps:
 *   tokens/s; roofline = (weight bytes + KV bytes read per step) / copy
 *   bandwidth. MoE: FLOPs count the top-k experts per token, and a step's
 *   weight bytes the experts its tokens are expected to choose (uniform
 *   routing). Where distinct KV for every sequence does not fit (long
 *   contexts at large batch), sequences share copies of the context
 *   prefix; bytes are still counted per sequence and the line says so
 *   (shared pages can be served partly from L2, so such figures are
 *   optimistic).
 * Invariant: never exits; returns the exit code. All memory it allocates
 * is released on every path (goto cleanup).
 */
#include "cli/cli_bench_engine.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend/backend.h"
#include "cli/cli_common.h"
#include "engine/engine.h"
#include "sample/sample.h"
#include "model/model.h"
#include "util/clock.h"
#ifdef NS_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

#define MAX_LIST 8

#define MAX_REPEATS 15

typedef struct bopts {
    const char *model_dir, *dummy_cfg, *device;
    int32_t page_tokens, chunk, steps, threads;
    int32_t repeats; /* timed windows per point; the median is reported */
    int32_t prefill[MAX_LIST], batches[MAX_LIST], contexts[MAX_LIST];
    int n_prefill, n_batches, n_contexts;
    bool profile, micro;
    bool no_ablation; /* --no-ablation: skip the cuda decode ablation rows */
    uint64_t seed;
    double kv_gb; /* cpu: KV pool budget */
    ns_dtype weight_type; /* dummy weights: bf16, or a GGUF block type (cuda) */
    const char *kv_dtype; /* --kv-dtype (NULL = auto: bf16 on CUDA, f32 on the CPU) */
} bopts;

typedef struct bench {
    bopts o;
    ns_backend *be;
    ns_model *m;
    ns_engine *e;
    bool cuda;
    double bw_gbs;     /* measured copy bandwidth, GB/s (read + write) */
    double gemm_tfs;   /* measured bf16 GEMM rate, TFLOP/s */
    double weight_read_bytes; /* weights read per decode step (MoE: less the experts) */
    double layer_params;      /* matrix params of all layers a token goes through */
    double expert_bytes;      /* MoE: bytes of one expert in every sparse layer */
    int32_t *tok, *pos, *ss, *sl, *pt, *lr; /* batch arrays */
    size_t cap_tok, cap_pt;
    uint64_t rng;
} bench;

static uint64_t rnd(bench *B) {
    B->rng ^= B->rng << 13;
    B->rng ^= B->rng >> 7;
    B->rng ^= B->rng << 17;
    return B->rng;
}

static void usage(FILE *f) {
#ifdef NS_HAVE_CUDA
    const char *default_device = "cuda";
#else
    const char *default_device = "cpu";
#endif
    fprintf(f,
            "usage: nightshift bench-engine (--model DIR | --dummy-weights CONFIG_JSON) [options]\n"
            "  Engine throughput (prefill and decode) with no HTTP in the way, each figure also\n"
            "  as a fraction of the roofline measured in the same run. Examples:\n"
            "    nightshift bench-engine --device cuda --dummy-weights bench/configs/qwen3-8b.json\n"
            "    nightshift bench-engine --device cpu --dummy-weights CONFIG_JSON --prefill 64 --batches 1 --contexts 64\n"
            "  --model DIR              Hugging Face checkpoint directory\n"
            "  --dummy-weights CONFIG   a config.json; random bf16 weights are generated on the device\n"
            "  --device cuda|cpu        backend (default %s)\n"
            "  --prefill LIST           prompt lengths, or none (default 512,8k,32k)\n"
            "  --batches LIST           decode batch sizes, or none (default 1,8,32,64)\n"
            "  --contexts LIST          decode contexts, or none (default 1k,32k)\n"
            "  --steps N                timed decode steps per point (default 24)\n"
            "  --repeats N              timed runs per point, median reported with min-max (default 3, at most 15)\n"
            "  --chunk N                prefill tokens per step (default 8192)\n"
            "  --page-tokens N          KV page size in tokens (default: the server's, 16 on the CPU, 64 on CUDA)\n"
            "  --threads N              CPU threads (default: one per core)\n"
            "  --kv-gb X                CPU KV pool budget in GB (default 4)\n"
            "  --kv-dtype auto|bf16|f32|fp8  KV element type (default auto: bf16 on CUDA, f32 on the CPU)\n"
            "  --profile                per-kernel times (cuda; default off): decode b1@1k and b64@1k, and a\n"
            "                           prefill of the longest --prefill point (else 8k)\n"
            "  --micro                  matmul path micro-benchmark (cuda; default off)\n"
            "  --no-ablation            skip the cuda decode ablation rows (default: run them after\n"
            "                           the decode points; ~15 s at --repeats 3)\n"
            "  --seed N                 dummy-weight seed (default 1)\n"
            "  --weight-type T          dummy-weight type: bf16 (default), or GGUF blocks q8_0, q4_0,\n"
            "                           q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (cuda; every matrix of\n"
            "                           that type, random blocks; the roofline counts their bytes)\n"
            "  LIST: comma-separated counts, k = 1024 (e.g. 512,8k)\n",
            default_device);
}

static int parse_count(const char *s, int32_t *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s) return -1;
    if (*end == 'k' || *end == 'K') {
        v *= 1024;
        end++;
    }
    if (*end || v < 1 || v > 1e9) return -1;
    *out = (int32_t)v;
    return 0;
}

static int parse_list(const char *s, int32_t *v, int *n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == MAX_LIST || parse_count(tok, &v[*n]) != 0) return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_args(int argc, char **argv, bopts *o) {
    memset(o, 0, sizeof *o);
#ifdef NS_HAVE_CUDA
    o->device = "cuda";
#else
    o->device = "cpu";
#endif
    o->page_tokens = 0; /* the server's default for the device (ns_cli_default_page_tokens) */
    o->chunk = 8192;
    o->steps = 24;
    o->repeats = 3;
    o->seed = 1;
    o->kv_gb = 4;
    o->weight_type = NS_DT_BF16;
    o->n_prefill = 3;
    o->prefill[0] = 512, o->prefill[1] = 8192, o->prefill[2] = 32768;
    o->n_batches = 4;
    o->batches[0] = 1, o->batches[1] = 8, o->batches[2] = 32, o->batches[3] = 64;
    o->n_contexts = 2;
    o->contexts[0] = 1024, o->contexts[1] = 32768;
    /* argv holds the options only (see cli_common.h), as for every
     * subcommand: main.c strips "nightshift bench-engine", the standalone
     * driver its program name. */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE                                                               \
    do {                                                                         \
        if (!v) {                                                                \
            fprintf(stderr, "nightshift bench-engine: %s needs a value\n", a);   \
            return -1;                                                           \
        }                                                                        \
        i++;                                                                     \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--model")) {
            NEED_VALUE;
            o->model_dir = v;
        } else if (!strcmp(a, "--dummy-weights")) {
            NEED_VALUE;
            o->dummy_cfg = v;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE;
            if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
                fprintf(stderr, "nightshift bench-engine: --device must be cpu or cuda, not \"%s\"\n", v);
                return -1;
            }
            o->device = v;
        } else if (!strcmp(a, "--prefill") || !strcmp(a, "--batches") || !strcmp(a, "--contexts")) {
            NEED_VALUE;
            int32_t *dst = a[2] == 'p' ? o->prefill : a[2] == 'b' ? o->batches : o->contexts;
            int *n = a[2] == 'p' ? &o->n_prefill : a[2] == 'b' ? &o->n_batches : &o->n_contexts;
            if (!strcmp(v, "none")) {
                *n = 0;
            } else if (parse_list(v, dst, n) != 0) {
                fprintf(stderr, "nightshift bench-engine: bad list for %s: \"%s\" (at most %d counts)\n", a, v,
                        MAX_LIST);
                return -1;
            }
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--chunk") || !strcmp(a, "--page-tokens") ||
                   !strcmp(a, "--threads") || !strcmp(a, "--repeats")) {
            NEED_VALUE;
            int32_t x;
            if (parse_count(v, &x) != 0) {
                fprintf(stderr, "nightshift bench-engine: bad value for %s: \"%s\"\n", a, v);
                return -1;
            }
            if (!strcmp(a, "--repeats") && x > MAX_REPEATS) {
                fprintf(stderr, "nightshift bench-engine: --repeats is at most %d, not %d\n", MAX_REPEATS, x);
                return -1;
            }
            if (!strcmp(a, "--steps")) o->steps = x;
            else if (!strcmp(a, "--repeats")) o->repeats = x;
            else if (!strcmp(a, "--chunk")) o->chunk = x;
            else if (!strcmp(a, "--page-tokens")) o->page_tokens = x;
            else o->threads = x;
        } else if (!strcmp(a, "--kv-gb")) {
            NEED_VALUE;
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || !(x > 0 && x < 1e6)) {
                fprintf(stderr, "nightshift bench-engine: --kv-gb must be a positive number, not \"%s\"\n", v);
                return -1;
            }
            o->kv_gb = x;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE;
            char *end;
            o->seed = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-') {
                fprintf(stderr, "nightshift bench-engine: --seed must be a non-negative integer, not \"%s\"\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--kv-dtype")) {
            NEED_VALUE;
            ns_dtype dt;
            ns_error kerr = {0};
            if (strcmp(v, "auto") != 0 && ns_kv_dtype_choose(v, "cpu", &dt, &kerr) != NS_OK &&
                ns_kv_dtype_choose(v, "cuda", &dt, &kerr) != NS_OK) {
                fprintf(stderr, "nightshift bench-engine: %s\n", kerr.msg);
                return -1;
            }
            o->kv_dtype = v;
        } else if (!strcmp(a, "--weight-type")) {
            NEED_VALUE;
            static const struct {
                const char *name;
                ns_dtype dt;
            } types[] = {{"bf16", NS_DT_BF16}, {"q8_0", NS_DT_Q8_0}, {"q4_0", NS_DT_Q4_0}, {"q4_1", NS_DT_Q4_1},
                         {"q5_0", NS_DT_Q5_0}, {"q5_1", NS_DT_Q5_1}, {"q4_k", NS_DT_Q4_K}, {"q5_k", NS_DT_Q5_K},
                         {"q6_k", NS_DT_Q6_K}};
            size_t t = 0;
            while (t < sizeof types / sizeof types[0] && strcasecmp(v, types[t].name) != 0) t++;
            if (t == sizeof types / sizeof types[0]) {
                fprintf(stderr, "nightshift bench-engine: --weight-type must be bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                                "q4_k, q5_k or q6_k, "
                                "not \"%s\"\n", v);
                return -1;
            }
            o->weight_type = types[t].dt;
        } else if (!strcmp(a, "--profile")) {
            o->profile = true;
        } else if (!strcmp(a, "--micro")) {
            o->micro = true;
        } else if (!strcmp(a, "--no-ablation")) {
            o->no_ablation = true;
        } else {
            fprintf(stderr, "nightshift bench-engine: unknown option %s\n", a);
            return -1;
        }
#undef NEED_VALUE
    }
    if (!!o->model_dir == !!o->dummy_cfg) {
        fprintf(stderr, "nightshift bench-engine: give exactly one of --model DIR or --dummy-weights CONFIG_JSON\n");
        return -1;
    }
    /* the CPU backend's random weights are bf16/f32 only; a checkpoint
     * brings its own types */
    if (o->weight_type != NS_DT_BF16 && (!o->dummy_cfg || strcmp(o->device, "cuda") != 0)) {
        fprintf(stderr, "nightshift bench-engine: --weight-type applies to --dummy-weights on --device cuda "
                        "(use --model FILE.gguf for a quantized checkpoint)\n");
        return -1;
    }
    if (o->page_tokens <= 0) o->page_tokens = ns_cli_default_page_tokens(o->device);
    return 0;
}

/* ---------------------------------------------------------- ceilings */

static ns_status cpu_ceilings(bench *B, ns_error *err) {
    const size_t bytes = (size_t)512 << 20;
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    ns_status rc = NS_OK;
    ns_tensor w = {0}, x = {0}, y = {0};
    if (!a || !b) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < bytes; i++) a[i] = (uint8_t)(i * 2654435761u >> 13);
    memcpy(b, a, bytes);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = ns_clock_now();
        memcpy(b, a, bytes);
        double t = ns_clock_now() - t0;
        if (t < best) best = t;
    }
    B->bw_gbs = 2.0 * (double)bytes / best / 1e9;
    const int64_t n = 256, k = 2048, m = 2048;
    rc = B->be->ops->weight_random(B->be, &w, NS_DT_BF16, m, k, 5, 0.05f, err);
    if (rc == NS_OK) rc = B->be->ops->tensor_alloc(B->be, &x, NS_DT_F32, n, k, err);
    if (rc == NS_OK) rc = B->be->ops->tensor_alloc(B->be, &y, NS_DT_F32, n, m, err);
    if (rc != NS_OK) goto cleanup;
    float *xv = x.data;
    for (int64_t i = 0; i < n * k; i++) xv[i] = (float)((int64_t)(rnd(B) % 2001) - 1000) / 1000.0f + 1e-3f;
    best = 1e30;
    for (int i = 0; i < 4; i++) {
        double t0 = ns_clock_now();
        B->be->ops->matmul(B->be, &y, &x, &w);
        rc = B->be->ops->sync(B->be, err);
        if (rc != NS_OK) goto cleanup;
        double t = ns_clock_now() - t0;
        if (i && t < best) best = t;
    }
    B->gemm_tfs = 2.0 * n * m * k / best / 1e12;
cleanup:
    free(a);
    free(b);
    if (w.data) B->be->ops->tensor_free(B->be, &w);
    if (x.data) B->be->ops->tensor_free(B->be, &x);
    if (y.data) B->be->ops->tensor_free(B->be, &y);
    return rc;
}

static ns_status measure_ceilings(bench *B, ns_error *err) {
#ifdef NS_HAVE_CUDA
    if (B->cuda) {
        ns_status rc = ns_cuda_measure_copy_bw(B->be, (size_t)2 << 30, 20, &B->bw_gbs, err);
        if (rc == NS_OK) rc = ns_cuda_measure_gemm(B->be, 8192, 20, &B->gemm_tfs, err);
        return rc;
    }
#endif
    return cpu_ceilings(B, err);
}

/* ------------------------------------------------------------- model */

static void model_costs(bench *B) {
    const ns_model *m = B->m;
    double bytes = 0, params = 0;
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        const ns_layer_weights *w = &m->layers[l];
        const ns_tensor *ts[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo, &w->q_norm,
                                 &w->k_norm, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            if (!ts[i]->data) continue;
            bytes += (double)ns_tensor_bytes(ts[i]);
            if (ts[i]->rows > 1) params += (double)ts[i]->rows * (double)ts[i]->cols;
        }
        if (!w->experts) continue;
        /* MoE: the router always, each token through top-k experts; a
         * decode step reads the experts its tokens chose (decode_weight_bytes) */
        const int32_t E = m->cfg.n_experts;
        bytes += (double)ns_tensor_bytes(&w->router);
        params += (double)w->router.rows * (double)w->router.cols;
        for (int k = 0; k < 3; k++) {
            B->expert_bytes += (double)ns_tensor_bytes(&w->experts[k * E]);
            params += (double)m->cfg.n_experts_per_tok * (double)w->experts[k * E].rows * (double)w->experts[k * E].cols;
        }
    }
    bytes += (double)ns_tensor_bytes(&m->final_norm) + (double)ns_tensor_bytes(&m->lm_head);
    B->weight_read_bytes = bytes;
    B->layer_params = params;
}

static ns_status open_model(bench *B, ns_error *err) {
    if (B->o.model_dir) return ns_model_load(B->o.model_dir, B->be, &B->m, err);
    json_error_t je;
    json_t *root = json_load_file(B->o.dummy_cfg, 0, &je);
    if (!root) return ns_fail(err, NS_ERR_IO, "%s: %s (line %d)", B->o.dummy_cfg, je.text, je.line);
    ns_model_config cfg;
    ns_status rc = ns_config_from_json(root, NULL, &cfg, err);
    json_decref(root);
    if (rc != NS_OK) return rc;
    double t0 = ns_clock_now();
    rc = ns_model_create_random(&cfg, B->be, B->o.weight_type, B->o.seed, &B->m, err);
    if (rc == NS_OK)
        printf("dummy %s weights generated on the device in %.2f s\n", ns_dtype_name(B->o.weight_type),
               ns_clock_now() - t0);
    return rc;
}

static int32_t max_i32(const int32_t *v, int n) {
    int32_t m = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > m) m = v[i];
    return m;
}

static ns_status open_engine(bench *B, ns_error *err) {
    const ns_model_config *c = &B->m->cfg;
    const int32_t P = B->o.page_tokens;
    int32_t max_b = max_i32(B->o.batches, B->o.n_batches), max_ctx = max_i32(B->o.contexts, B->o.n_contexts),
            max_p = max_i32(B->o.prefill, B->o.n_prefill);
    /* --profile also runs decode at batch 64 and context 1024, whatever
     * the lists say (a --batches none run failed there on max_logits) */
    if (B->o.profile) {
        if (max_b < 64) max_b = 64;
        if (max_ctx < 1024) max_ctx = 1024;
    }
    ns_engine_opts eo = {0};
    eo.max_batch_tokens = B->o.chunk > max_b ? B->o.chunk : max_b;
    if (max_p && max_p < eo.max_batch_tokens && max_p > max_b) eo.max_batch_tokens = max_p;
    eo.max_logits = max_b > 1 ? max_b : 1;
    eo.page_tokens = P;
    ns_status krc = ns_kv_dtype_choose(B->o.kv_dtype, B->cuda ? "cuda" : "cpu", &eo.kv_dtype, err);
    if (krc != NS_OK) return krc;
    size_t page_bytes = ns_engine_page_bytes(c, P, eo.kv_dtype);
    int64_t tail = (int64_t)B->o.steps + 16;
    int64_t need = (max_p + P - 1) / P + 2;
    int64_t need_dec = (int64_t)max_b * ((max_ctx + tail + P - 1) / P + 1);
    if (need_dec > need) need = need_dec;
    if (need < 16) need = 16; /* small runs (tiny configs, CI) still get the minimum pool */
    double budget = B->o.kv_gb * 1e9;
#ifdef NS_HAVE_CUDA
    if (B->cuda) {
        size_t fr = 0, tot = 0;
        ns_status rc = ns_cuda_mem_info(B->be, &fr, &tot, err);
        if (rc != NS_OK) return rc;
        /* workspace: F32 activations plus bf16 shadows, logits, margin */
        double T = eo.max_batch_tokens, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
        double ws = T * (2.0 * c->hidden_size + 2 * qd + 2 * kvd + 2.0 * c->intermediate_size) * 6.0 +
                    (double)eo.max_logits * c->vocab_size * 6.0 + 3e9;
        budget = ((double)fr - ws) * 0.97;
    }
#endif
    int64_t fit = budget > 0 ? (int64_t)(budget / (double)page_bytes) : 0;
    eo.n_pages = (int32_t)(need < fit ? need : fit);
    if (eo.n_pages < 16) return ns_fail(err, NS_ERR_NOMEM, "no memory left for a KV pool");
    printf("engine: %d tokens/step, KV pool %d pages of %d tokens (%.2f GB, %s)\n", eo.max_batch_tokens, eo.n_pages, P,
           (double)eo.n_pages * (double)page_bytes / 1e9, ns_dtype_name(eo.kv_dtype));
    return ns_engine_create(B->m, &eo, &B->e, err);
}

static ns_status fill_kv(bench *B, ns_error *err) {
#ifdef NS_HAVE_CUDA
    if (B->cuda) return ns_cuda_kv_fill_random(B->be, 99, err);
#endif
    size_t pb = B->be->kv.page_size_bytes;
    float *page = malloc(pb);
    if (!page) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < pb / 4; i++) page[i] = (float)((int64_t)(rnd(B) % 2001) - 1000) / 1000.0f + 1e-3f;
    if (B->be->kv.dtype == NS_DT_FP8_E4M3) { /* finite codes (never 0x7f/0xff), scale 1/448 */
        const size_t so = ns_kv_scale_offset(&B->be->kv, 0, 0, 0);
        uint8_t *bytes = (uint8_t *)page;
        for (size_t i = 0; i < so; i++)
            if ((bytes[i] & 0x7f) == 0x7f) bytes[i] ^= 1;
        for (size_t o = so; o + 4 <= pb; o += 4) {
            const float s = 1.0f / 448.0f;
            memcpy(bytes + o, &s, 4);
        }
    }
    ns_status rc = NS_OK;
    for (int32_t p = 0; p < B->be->kv.n_pages && rc == NS_OK; p++) rc = B->be->ops->kv_page_write(B->be, p, page, err);
    free(page);
    return rc;
}

/* --------------------------------------------------------- batches */

static ns_status reserve(bench *B, size_t tokens, size_t pt, ns_error *err) {
    if (tokens > B->cap_tok) {
        int32_t **arrs[] = {&B->tok, &B->pos, &B->ss, &B->sl, &B->lr};
        for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
            int32_t *p = realloc(*arrs[i], (tokens + 1) * sizeof(int32_t));
            if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
            *arrs[i] = p;
        }
        B->cap_tok = tokens;
    }
    if (pt > B->cap_pt) {
        int32_t *p = realloc(B->pt, pt * sizeof(int32_t));
        if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        B->pt = p;
        B->cap_pt = pt;
    }
    return NS_OK;
}

/* ---------------------------------------------------------- prefill */

static double prefill_flops(const bench *B, int32_t L) {
    const ns_model_config *c = &B->m->cfg;
    double lin = 2.0 * (double)L * B->layer_params + 2.0 * (double)c->vocab_size * c->hidden_size;
    double att = 4.0 * c->n_heads * c->head_dim * ((double)L * (L + 1) / 2.0) * c->n_layers;
    return lin + att;
}

static ns_status run_prefill(bench *B, int32_t L, double *secs, ns_error *err) {
    const int32_t P = B->o.page_tokens, pages = (L + P - 1) / P;
    if (pages > B->be->kv.n_pages) return ns_fail(err, NS_ERR_NOMEM, "prompt of %d tokens does not fit the pool", L);
    ns_status rc = reserve(B, (size_t)B->o.chunk + 1, (size_t)pages, err);
    if (rc != NS_OK) return rc;
    for (int32_t i = 0; i < pages; i++) B->pt[i] = i;
    rc = B->be->ops->sync(B->be, err);
    if (rc != NS_OK) return rc;
    double t0 = ns_clock_now();
    for (int32_t c0 = 0; c0 < L; c0 += B->o.chunk) {
        int32_t n = L - c0 < B->o.chunk ? L - c0 : B->o.chunk;
        for (int32_t i = 0; i < n; i++) {
            B->tok[i] = (int32_t)(rnd(B) % (uint64_t)B->m->cfg.vocab_size);
            B->pos[i] = c0 + i;
        }
        B->ss[0] = 0;
        B->ss[1] = n;
        B->sl[0] = c0 + n;
        bool last = c0 + n == L;
        B->lr[0] = n - 1;
        ns_batch b = {.n_tokens = n, .n_seqs = 1, .tokens = B->tok, .positions = B->pos, .seq_start = B->ss,
                      .seq_len = B->sl, .page_table = B->pt, .max_pages = pages, .logit_rows = B->lr,
                      .n_logits = last ? 1 : 0};
        rc = ns_engine_forward(B->e, &b, err);
        if (rc != NS_OK) return rc;
    }
    rc = B->be->ops->sync(B->be, err);
    *secs = ns_clock_now() - t0;
    return rc;
}

/* ----------------------------------------------------------- decode */

typedef struct dec_result {
    double step_s, tok_s, bytes, floor_s;
    /* host seconds per step inside ns_engine_forward (recording the step;
     * on CUDA the previous step has been synced, so the GPU idles then)
     * and inside sample (the launch, then waiting for the GPU) */
    double host_fwd_s, host_sample_s;
    int copies;
    bool skipped;
    /* NS_CUDA_GAP_PROBE=1: the GPU's mean idle time between steps and a
     * step's upload -> tokens time (ns_cuda_gap_stats), over gap_n steps */
    double gap_idle_us, gap_span_us, gap_upload_us, gap_graph_us;
    int64_t gap_n;
    /* NS_CUDA_MLP_PROBE=1: the persistent MLP's phase stamps
     * (ns_cuda_mlp_probe_stats) over mlp_n launches */
    double mlp_ph_us[4][3], mlp_span_us;
    int64_t mlp_n;
} dec_result;

/* Weights one decode step of `batch` tokens reads: the dense part, and
 * for MoE the experts expected to be chosen by at least one token,
 * n_experts * (1 - (1 - k/n_experts)^batch) per sparse layer (routing
 * taken as uniform, which random weights give). */
static double decode_weight_bytes(const bench *B, int32_t batch) {
    const ns_model_config *c = &B->m->cfg;
    if (B->expert_bytes == 0 || c->n_experts <= 0) return B->weight_read_bytes;
    double E = c->n_experts, used = E * (1.0 - pow(1.0 - (double)c->n_experts_per_tok / E, (double)batch));
    return B->weight_read_bytes + B->expert_bytes * used;
}

static ns_status run_decode(bench *B, int32_t ctx, int32_t batch, int steps, int warm, dec_result *r, ns_error *err) {
    const int32_t P = B->o.page_tokens;
    const ns_model_config *c = &B->m->cfg;
    memset(r, 0, sizeof *r);
    const int32_t shared = ctx / P; /* full pages of context: shareable */
    const int32_t tail = (ctx + warm + steps + 1 + P - 1) / P - shared + 1;
    const int32_t max_pages = shared + tail;
    int64_t avail = (int64_t)B->be->kv.n_pages - (int64_t)batch * tail;
    int64_t copies = shared ? avail / shared : batch;
    if (copies > batch) copies = batch;
    if (copies < 1) {
        r->skipped = true;
        return NS_OK;
    }
    r->copies = (int)copies;
    ns_status rc = reserve(B, (size_t)batch, (size_t)batch * (size_t)max_pages, err);
    if (rc != NS_OK) return rc;
    int32_t next = (int32_t)(copies * shared);
    for (int32_t s = 0; s < batch; s++) {
        int32_t base = (int32_t)(s % copies) * shared;
        for (int32_t p = 0; p < shared; p++) B->pt[s * max_pages + p] = base + p;
        for (int32_t p = 0; p < tail; p++) B->pt[s * max_pages + shared + p] = next++;
    }
    ns_sampler *smp = calloc((size_t)batch, sizeof *smp);
    ns_sampler **sp = calloc((size_t)batch, sizeof *sp);
    int32_t *cur = malloc((size_t)batch * sizeof *cur);
    if (!smp || !sp || !cur) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    ns_sampling_params gp = ns_sampling_default();
    for (int32_t s = 0; s < batch; s++) {
        rc = ns_sampler_init(&smp[s], &gp, c->vocab_size, err);
        if (rc != NS_OK) goto cleanup;
        sp[s] = &smp[s];
        cur[s] = (int32_t)(rnd(B) % (uint64_t)c->vocab_size);
    }
    double t0 = 0, kv_tokens = 0;
    for (int k = 0; k < warm + steps; k++) {
        if (k == warm) {
            rc = B->be->ops->sync(B->be, err);
            if (rc != NS_OK) goto cleanup;
#ifdef NS_HAVE_CUDA
            if (B->cuda) { /* a new count */
                (void)ns_cuda_gap_stats(B->be, &r->gap_idle_us, &r->gap_span_us, &r->gap_upload_us, &r->gap_graph_us);
                (void)ns_cuda_mlp_probe_stats(B->be, r->mlp_ph_us, &r->mlp_span_us);
            }
#endif
            t0 = ns_clock_now();
        }
        for (int32_t s = 0; s < batch; s++) {
            B->tok[s] = cur[s];
            B->pos[s] = ctx + k;
            B->ss[s] = s;
            B->sl[s] = ctx + k + 1;
            B->lr[s] = s;
        }
        B->ss[batch] = batch;
        ns_batch b = {.n_tokens = batch, .n_seqs = batch, .tokens = B->tok, .positions = B->pos,
                      .seq_start = B->ss, .seq_len = B->sl, .page_table = B->pt, .max_pages = max_pages,
                      .logit_rows = B->lr, .n_logits = batch};
        const double h0 = ns_clock_now();
        rc = ns_engine_forward(B->e, &b, err);
        const double h1 = ns_clock_now();
        if (rc == NS_OK) rc = B->be->ops->sample(B->be, &B->e->logits, batch, sp, cur, err);
        if (rc != NS_OK) goto cleanup;
        if (k >= warm) {
            kv_tokens += (double)batch * (ctx + k + 1);
            r->host_fwd_s += h1 - h0;
            r->host_sample_s += ns_clock_now() - h1;
        }
    }
    double dt = ns_clock_now() - t0;
#ifdef NS_HAVE_CUDA
    if (B->cuda) {
        r->gap_n = ns_cuda_gap_stats(B->be, &r->gap_idle_us, &r->gap_span_us, &r->gap_upload_us, &r->gap_graph_us);
        r->mlp_n = ns_cuda_mlp_probe_stats(B->be, r->mlp_ph_us, &r->mlp_span_us);
    }
#endif
    r->host_fwd_s /= steps;
    r->host_sample_s /= steps;
    r->step_s = dt / steps;
    r->tok_s = (double)batch * steps / dt;
    double kv_bytes_tok = (double)c->n_layers * 2 * c->n_kv_heads * c->head_dim * ns_dtype_size(B->be->kv.dtype);
    r->bytes = decode_weight_bytes(B, batch) + kv_bytes_tok * kv_tokens / steps;
    r->floor_s = r->bytes / (B->bw_gbs * 1e9);
cleanup:
    if (smp)
        for (int32_t s = 0; s < batch; s++) ns_sampler_free(&smp[s]);
    free(smp);
    free(sp);
    free(cur);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (the mean of the middle two for even n); v is
 * sorted in place. */
static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* run_decode B->o.repeats times: r is the run whose step time is closest
 * to the median, its step time and rate set to the median's (for an even
 * count the mean of the middle two); lo/hi the fastest and slowest step
 * times. */
static ns_status run_decode_median(bench *B, int32_t ctx, int32_t batch, dec_result *r, double *lo, double *hi,
                                   ns_error *err) {
    const int n = B->o.repeats;
    dec_result runs[MAX_REPEATS];
    double t[MAX_REPEATS];
    for (int i = 0; i < n; i++) {
        ns_status rc = run_decode(B, ctx, batch, B->o.steps, 3, &runs[i], err);
        if (rc != NS_OK) return rc;
        if (runs[i].skipped) {
            *r = runs[i];
            return NS_OK;
        }
        t[i] = runs[i].step_s;
    }
    const double med = median_of(t, n);
    *lo = t[0];
    *hi = t[n - 1];
    int best = 0;
    for (int i = 1; i < n; i++)
        if (fabs(runs[i].step_s - med) < fabs(runs[best].step_s - med)) best = i;
    *r = runs[best];
    r->tok_s = r->tok_s * r->step_s / med;
    r->step_s = med;
    return NS_OK;
}

/* ------------------------------------------------------------ report */

static ns_status bench_run(bench *B, ns_error *err) {
    ns_status rc;
    const ns_model_config *c;
#ifdef NS_HAVE_CUDA
    if (B->cuda) {
        char name[128];
        int n_sm = 0;
        ns_cuda_device_desc(B->be, name, sizeof name, &n_sm);
        printf("device: %s (%d SMs)\n", name, n_sm);
    }
#endif
    rc = measure_ceilings(B, err);
    if (rc != NS_OK) return rc;
    printf("ceilings (measured now): copy bandwidth %.0f GB/s (read+write); bf16 GEMM %.1f TFLOP/s\n", B->bw_gbs,
           B->gemm_tfs);
    rc = open_model(B, err);
    if (rc != NS_OK) return rc;
    c = &B->m->cfg;
    model_costs(B);
    printf("model: %s, %d layers, hidden %d, ff %d, heads %d/%d x %d, vocab %d; weights %.2f GB (%.2f GB read per "
           "decode step)\n",
           B->o.model_dir ? B->o.model_dir : B->o.dummy_cfg, c->n_layers, c->hidden_size, c->intermediate_size,
           c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, (double)B->m->weight_bytes / 1e9,
           decode_weight_bytes(B, 1) / 1e9);
    rc = open_engine(B, err);
    if (rc != NS_OK) return rc;
    rc = fill_kv(B, err);
    if (rc != NS_OK) return rc;

#ifdef NS_HAVE_CUDA
    if (B->cuda && B->o.micro) {
        const int64_t shapes[][2] = {{(int64_t)c->n_heads * c->head_dim, c->hidden_size},
                                     {(int64_t)c->n_kv_heads * c->head_dim, c->hidden_size},
                                     {c->intermediate_size, c->hidden_size},
                                     {c->hidden_size, c->intermediate_size},
                                     {c->vocab_size, c->hidden_size}};
        const int64_t ns[] = {1, 4, 8, 64};
        printf("matmul micro-benchmark (weight bytes / time; GB/s):\n");
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                double t_lt = 0, t_gv = 0;
                rc = ns_cuda_time_matmul(B->be, ns[ni], shapes[si][0], shapes[si][1], 1, 20, &t_lt, err);
                if (rc == NS_OK && ns[ni] <= 8)
                    rc = ns_cuda_time_matmul(B->be, ns[ni], shapes[si][0], shapes[si][1], 2, 20, &t_gv, err);
                if (rc != NS_OK) return rc;
                double wb = 2.0 * (double)shapes[si][0] * (double)shapes[si][1];
                printf("  %6lldx%-6lld n=%-3lld cublasLt %8.1f us %6.0f GB/s", (long long)shapes[si][0],
                       (long long)shapes[si][1], (long long)ns[ni], t_lt * 1e3, wb / (t_lt * 1e-3) / 1e9);
                if (t_gv > 0) printf("   gemv %8.1f us %6.0f GB/s", t_gv * 1e3, wb / (t_gv * 1e-3) / 1e9);
                if (ns_dtype_is_quant(B->o.weight_type)) {
                    /* the same product on --weight-type blocks: GEMV on the
                     * blocks (n <= 8) or dequantization + cuBLASLt; GB/s
                     * of the quantized bytes */
                    double t_q = 0;
                    rc = ns_cuda_time_matmul_dt(B->be, B->o.weight_type, ns[ni], shapes[si][0], shapes[si][1], 0, 20,
                                                &t_q, err);
                    if (rc != NS_OK) return rc;
                    const double qb = (double)shapes[si][0] *
                                      (double)ns_dtype_row_bytes(B->o.weight_type, shapes[si][1]);
                    printf("   %s %8.1f us %6.0f GB/s", ns_dtype_name(B->o.weight_type), t_q * 1e3,
                           qb / (t_q * 1e-3) / 1e9);
                }
                printf("\n");
            }
    }
#endif

    /* prefill */
    if (B->o.n_prefill) {
        /* warm-up (plans, allocations): never longer than the longest
         * measured prompt, which the pool is sized for */
        int32_t warm = 512 < B->o.chunk ? 512 : B->o.chunk, longest = max_i32(B->o.prefill, B->o.n_prefill);
        double warm_s;
        rc = run_prefill(B, warm < longest ? warm : longest, &warm_s, err);
        if (rc != NS_OK) return rc;
    }
    for (int i = 0; i < B->o.n_prefill; i++) {
        int32_t L = B->o.prefill[i];
        const int reps = B->o.repeats;
        double t[MAX_REPEATS];
        for (int r = 0; r < reps; r++) {
            rc = run_prefill(B, L, &t[r], err);
            if (rc != NS_OK) return rc;
        }
        const double med = median_of(t, reps);
        double fl = prefill_flops(B, L);
        printf("prefill %6d tokens: %8.3f s  %9.0f tok/s  %7.3g TFLOP/s = %5.1f%% of measured GEMM rate (chunks of "
               "%d; median of %d, %.3f-%.3f s)\n",
               L, med, L / med, fl / med / 1e12, 100.0 * fl / med / 1e12 / B->gemm_tfs, B->o.chunk, reps, t[0],
               t[reps - 1]);
        fflush(stdout);
    }

    /* decode */
    for (int ci = 0; ci < B->o.n_contexts; ci++) {
        double tok1 = 0;
        for (int bi = 0; bi < B->o.n_batches; bi++) {
            dec_result r;
            double lo = 0, hi = 0;
            int32_t ctx = B->o.contexts[ci], batch = B->o.batches[bi];
            rc = run_decode_median(B, ctx, batch, &r, &lo, &hi, err);
            if (rc != NS_OK) return rc;
            if (r.skipped) {
                printf("decode ctx %6d batch %3d: skipped (KV does not fit)\n", ctx, batch);
                continue;
            }
            if (batch == 1) tok1 = r.tok_s;
            printf("decode ctx %6d batch %3d: %8.3f ms/step %9.1f tok/s  %6.2f GB/step  floor %7.3f ms = %5.1f%% of "
                   "bandwidth roofline",
                   ctx, batch, r.step_s * 1e3, r.tok_s, r.bytes / 1e9, r.floor_s * 1e3, 100.0 * r.floor_s / r.step_s);
            if (tok1 > 0 && batch > 1) printf("  (%.1fx batch 1)", r.tok_s / tok1);
            if (r.copies < batch) printf("  [context KV shared: %d copies for %d seqs]", r.copies, batch);
            printf("  host: forward %.0f us, sample %.0f us", r.host_fwd_s * 1e6, r.host_sample_s * 1e6);
            if (r.gap_n > 0)
                printf("  gpu: idle %.1f us between steps, %.1f us upload -> tokens (upload %.1f, kernels %.1f)",
                       r.gap_idle_us, r.gap_span_us, r.gap_upload_us, r.gap_graph_us);
            printf("  (median of %d, %.3f-%.3f ms)\n", B->o.repeats, lo * 1e3, hi * 1e3);
            if (r.mlp_n > 0) {
                static const char *stamp[3] = {"gate/up done", "barrier passed", "down done"};
                printf("  persistent MLP, %lld launches, us after the first CTA's start (min/median/max over CTAs):",
                       (long long)r.mlp_n);
                for (int i = 0; i < 3; i++)
                    printf(" %s %.2f/%.2f/%.2f;", stamp[i], r.mlp_ph_us[i + 1][0], r.mlp_ph_us[i + 1][1],
                           r.mlp_ph_us[i + 1][2]);
                printf(" last end %.2f\n", r.mlp_span_us);
            }
            fflush(stdout);
        }
    }
#ifdef NS_HAVE_CUDA
    if (B->cuda) {
        int64_t rep, cap, eag;
        ns_cuda_graph_stats(B->be, &rep, &cap, &eag);
        printf("cuda graphs: %lld replays, %lld captures, %lld eager decode tapes; %lld steps from the step memo, %lld "
               "of them launched directly\n",
               (long long)rep, (long long)cap, (long long)eag, (long long)ns_cuda_memo_replays(B->be),
               (long long)ns_cuda_memo_direct(B->be));
    }
    if (B->cuda && B->o.n_batches && B->o.n_contexts && !B->o.no_ablation) {
        /* what each decode-path feature is worth: batch 1, 1k context,
         * each flipped from its setting in turn (prefetch is off by
         * default, the others on) */
        const int early = ns_cuda_get_early_loads(B->be); /* NS_CUDA_EARLY_LOADS */
        const int dec_fuse = ns_cuda_get_dec_fuse(B->be);   /* NS_CUDA_DEC_FUSE */
        const int dec_early = ns_cuda_get_dec_early(B->be); /* NS_CUDA_DEC_EARLY: only with dec_fuse */
        const int pdl_gemv = ns_cuda_get_pdl_gemv(B->be);   /* NS_CUDA_PDL_GEMV */
        const int act_nc = ns_cuda_get_act_nc(B->be);       /* NS_CUDA_ACT_NC */
        const int pf = ns_cuda_get_prefetch(B->be);         /* NS_CUDA_PREFETCH, MB */
        const int bulk = ns_cuda_get_gemv_bulk(B->be);      /* NS_CUDA_GEMV_BULK */
        const int memo = ns_cuda_get_memo(B->be);           /* NS_CUDA_MEMO */
        const int mlp = ns_cuda_get_mlp(B->be);             /* NS_CUDA_MLP */
        const int mlp_tail = ns_cuda_get_mlp_tail(B->be);   /* NS_CUDA_MLP_TAIL */
        const int row_fuse = ns_cuda_get_row_fuse(B->be);   /* NS_CUDA_ROW_FUSE */
        /* each row: set(alt), measure, set(dflt) */
        struct {
            const char *name;
            void (*set)(ns_backend *, int);
            int dflt, alt;
        } feats[] = {{pf ? "L2 prefetch off" : "L2 prefetch 4 MB", ns_cuda_set_prefetch, pf, pf ? 0 : 4},
                     {"L2 prefetch 2/3 of L2", ns_cuda_set_prefetch, pf, 1024},
                     {early ? "early constant loads off" : "early constant loads on", ns_cuda_set_early_loads, early,
                      !early},
                     {"programmatic dependent launch off", ns_cuda_set_pdl, 1, 0},
                     {"fused kernels off", ns_cuda_set_fusion, 1, 0},
                     {"CUDA graphs off", ns_cuda_set_graphs, 1, 0},
                     {dec_fuse ? "norm/add folded into decode GEMVs off" : "norm/add folded into decode GEMVs on",
                      ns_cuda_set_dec_fuse, dec_fuse, !dec_fuse},
                     {dec_early ? "their early weight loads off" : "their early weight loads on",
                      ns_cuda_set_dec_early, dec_early, !dec_early},
                     {pdl_gemv ? "PDL between two GEMVs off" : "PDL between two GEMVs on", ns_cuda_set_pdl_gemv,
                      pdl_gemv, !pdl_gemv},
                     {act_nc ? "activation loads .cg" : "activation loads .nc", ns_cuda_set_act_nc, act_nc, !act_nc},
                     {bulk ? "bulk-copy GEMV off" : "bulk-copy GEMV on", ns_cuda_set_gemv_bulk, bulk, !bulk},
                     {memo ? "step memo off" : "step memo on", ns_cuda_set_memo, memo, !memo},
                     {memo == 1 ? "memo's direct graph launch off" : "memo's direct graph launch on", ns_cuda_set_memo,
                      memo, memo == 1 ? 2 : 1},
                     {mlp ? "persistent MLP off" : "persistent MLP on", ns_cuda_set_mlp, mlp, !mlp},
                     {mlp_tail ? "its norm + q/k/v tail off" : "its norm + q/k/v tail on", ns_cuda_set_mlp_tail,
                      mlp_tail, !mlp_tail},
                     {row_fuse ? "step's first/last row ops unfused" : "step's first/last row ops fused",
                      ns_cuda_set_row_fuse, row_fuse, row_fuse ? 0 : 3}};
        dec_result base;
        double lo, hi;
        rc = run_decode_median(B, 1024, 1, &base, &lo, &hi, err);
        if (rc != NS_OK) return rc;
        /* the pool is sized for the requested contexts; 1k may not fit */
        if (base.skipped) printf("ablation, decode ctx 1024 batch 1: skipped (KV does not fit)");
        else
            printf("ablation, decode ctx 1024 batch 1 (ms/step, medians of %d): defaults %.3f", B->o.repeats,
                   base.step_s * 1e3);
        for (size_t i = 0; i < sizeof feats / sizeof feats[0] && !base.skipped; i++) {
            dec_result r;
            feats[i].set(B->be, feats[i].alt);
            rc = run_decode_median(B, 1024, 1, &r, &lo, &hi, err);
            feats[i].set(B->be, feats[i].dflt);
            if (rc != NS_OK) return rc;
            printf("; %s %.3f", feats[i].name, r.step_s * 1e3);
        }
        /* the defaults once more at the end: rows measured in a fixed
         * order drift with the GPU's clock and power state, and on
         * 2026-12-03 the first defaults read up to 0.05 ms above the row
         * after them in every process (docs/cuda.md v30); a row counts
         * only against both */
        if (!base.skipped) {
            dec_result again;
            rc = run_decode_median(B, 1024, 1, &again, &lo, &hi, err);
            if (rc != NS_OK) return rc;
            printf("; defaults again %.3f", again.step_s * 1e3);
        }
        printf("\n");
    }
    if (B->cuda && B->be->kv.dtype == NS_DT_FP8_E4M3 && B->o.n_batches && B->o.n_contexts && !B->o.no_ablation) {
        /* FP8 decode variants at the longest context, batch 1 and the
         * largest batch <= 8 (cuda.h: ns_cuda_set_fp8_split_div /
         * ns_cuda_set_fp8_dec; defaults 8 and 0) */
        int32_t ctx = 0, bmax = 1;
        for (int i = 0; i < B->o.n_contexts; i++)
            if (B->o.contexts[i] > ctx) ctx = B->o.contexts[i];
        for (int i = 0; i < B->o.n_batches; i++)
            if (B->o.batches[i] <= 8 && B->o.batches[i] > bmax) bmax = B->o.batches[i];
        const int32_t bs[2] = {1, bmax};
        for (int bi = 0; bi < (bmax > 1 ? 2 : 1); bi++) {
            static const struct {
                const char *name;
                int div, dec, qreg, mma, bulk, reg; /* bulk, reg: -1 = the process default */
            } var[] = {{"defaults (register tiles where they apply)", 8, 0, 1, 2, -1, -1},
                       {"register tiles off (auto: tensor cores at >= 64 splits)", 8, 0, 1, 2, -1, 0},
                       {"tensor cores, cp.async rows", 8, 0, 1, 1, 0, 0},
                       {"tensor cores, bulk page segments", 8, 0, 1, 1, 1, 0},
                       {"CUDA cores", 8, 0, 1, 0, -1, 0},
                       {"CUDA cores, splits / 4", 4, 0, 1, 0, -1, 0}};
            const int bulk0 = ns_cuda_get_fp8_bulk(B->be), reg0 = ns_cuda_get_fp8_reg(B->be);
            printf("ablation fp8, decode ctx %d batch %d (ms/step):", ctx, bs[bi]);
            for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) {
                dec_result r;
                ns_cuda_set_fp8_split_div(B->be, var[i].div);
                ns_cuda_set_fp8_dec(B->be, var[i].dec);
                ns_cuda_set_fp8_qreg(B->be, var[i].qreg);
                ns_cuda_set_fp8_mma(B->be, var[i].mma);
                ns_cuda_set_fp8_bulk(B->be, var[i].bulk < 0 ? bulk0 : var[i].bulk);
                ns_cuda_set_fp8_reg(B->be, var[i].reg < 0 ? reg0 : var[i].reg);
                double lo, hi;
                rc = run_decode_median(B, ctx, bs[bi], &r, &lo, &hi, err);
                if (rc != NS_OK) return rc;
                if (r.skipped) printf(" %s skipped;", var[i].name);
                else printf(" %s %.3f;", var[i].name, r.step_s * 1e3);
            }
            ns_cuda_set_fp8_split_div(B->be, 8);
            ns_cuda_set_fp8_dec(B->be, 0);
            ns_cuda_set_fp8_qreg(B->be, 1);
            ns_cuda_set_fp8_mma(B->be, 2);
            ns_cuda_set_fp8_bulk(B->be, bulk0);
            ns_cuda_set_fp8_reg(B->be, reg0);
            printf("\n");
            fflush(stdout);
        }
    }
    if (B->cuda && B->o.profile) {
        dec_result r;
        ns_cuda_set_profiling(B->be, 1);
        rc = run_decode(B, 1024, 1, 8, 1, &r, err);
        if (rc != NS_OK) return rc;
        printf("profile: decode ctx 1024 batch 1, 9 steps, eager with events (%.3f ms/step incl. event overhead):\n",
               r.step_s * 1e3);
        ns_cuda_profile_report(B->be, stdout);
        rc = run_decode(B, 1024, 64, 4, 1, &r, err);
        if (rc != NS_OK) return rc;
        printf("profile: decode ctx 1024 batch 64, 5 steps:\n");
        ns_cuda_profile_report(B->be, stdout);
        double s;
        /* the longest --prefill point in --chunk steps (the 100k prompt's
         * split by kernel class), or one 8k step without one */
        int32_t L = B->o.n_prefill ? max_i32(B->o.prefill, B->o.n_prefill) : B->o.chunk < 8192 ? B->o.chunk : 8192;
        if (L <= B->be->kv.n_pages * B->o.page_tokens) {
            rc = run_prefill(B, L, &s, err);
            if (rc != NS_OK) return rc;
            printf("profile: prefill %d tokens (%.3f s):\n", L, s);
            ns_cuda_profile_report(B->be, stdout);
        }
        ns_cuda_set_profiling(B->be, 0);
    }
#endif
    return NS_OK;
}

int ns_cli_bench_engine(int argc, char **argv) {
    bench B;
    memset(&B, 0, sizeof B);
    int pr = parse_args(argc, argv, &B.o);
    if (pr != 0) {
        if (pr < 0) usage(stderr);
        return pr < 0 ? 2 : 0;
    }
    B.rng = 0x9e3779b97f4a7c15ULL ^ B.o.seed;
    ns_error err = {0};
    ns_status rc;
    B.cuda = strcmp(B.o.device, "cuda") == 0;
    if (B.cuda) {
#ifdef NS_HAVE_CUDA
        rc = ns_backend_cuda_create(0, &B.be, &err);
#else
        rc = ns_fail(&err, NS_ERR_UNSUPPORTED, "this build has no CUDA backend (rebuild with make CUDA=1)");
#endif
    } else if (strcmp(B.o.device, "cpu") == 0) {
        rc = ns_backend_cpu_create(B.o.threads, &B.be, &err);
    } else {
        rc = ns_fail(&err, NS_ERR_INVALID, "unknown device \"%s\" (cpu or cuda)", B.o.device);
    }
    if (rc == NS_OK) rc = bench_run(&B, &err);
    if (rc != NS_OK) fprintf(stderr, "nightshift bench-engine: %s\n", err.msg);
    ns_engine_free(B.e);
    ns_model_free(B.m);
    if (B.be) B.be->ops->destroy(B.be);
    free(B.tok);
    free(B.pos);
    free(B.ss);
    free(B.sl);
    free(B.pt);
    free(B.lr);
    return rc == NS_OK ? 0 : 1;
}
