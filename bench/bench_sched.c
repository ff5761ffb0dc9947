/* bench_sched — the scheduler under the agent workload (CPU backend).
 *
 * usage: build/bench/bench_sched MODEL_DIR [THREADS]
 *  1. aggregate decode tokens/s with 1, 4 and 16 concurrent sequences;
 *  2. TTFT of a long prompt, cold vs served from the prefix cache;
 *  3. p50/p99 inter-token latency of one decoding stream, alone and while
 *     another client prefills a long prompt.
 * Medians over 3 repeats where it says so. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/sched.h"
#include "util/clock.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void make_prompt(int32_t *p, int32_t n, uint32_t seed, int32_t vocab) {
    uint32_t x = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(vocab - 3));
    }
}

static ns_request *submit(ns_sched *s, const int32_t *p, int32_t n, int32_t max_tokens) {
    ns_request_params rp = {.sampling = ns_sampling_default(), .max_tokens = max_tokens, .ignore_eos = true};
    ns_request *r = ns_request_new(p, n, &rp);
    ns_error err = {0};
    if (ns_sched_submit(s, r, NULL, &err) != NS_OK) {
        fprintf(stderr, "submit: %s\n", err.msg);
        exit(1);
    }
    return r;
}

/* Drains r; records arrival time of each token in times (if non-NULL). */
static int32_t drain(ns_request *r, double *times, int32_t cap) {
    int32_t n = 0;
    bool done = false;
    ns_token_event ev[16];
    while (!done) {
        int k = ns_request_poll(r, ev, 16, -1, &done);
        double t = ns_clock_now();
        for (int i = 0; i < k; i++, n++)
            if (times && n < cap) times[n] = t;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [THREADS]\n", argv[0]);
        return 2;
    }
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    ns_error err = {0};
    ns_backend *be = NULL;
    ns_model *m = NULL;
    ns_engine *e = NULL;
    ns_sched *s = NULL;
    if (ns_backend_cpu_create(threads, &be, &err) != NS_OK || ns_model_load(argv[1], be, &m, &err) != NS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int32_t V = m->cfg.vocab_size, ctx = m->cfg.max_position_embeddings;
    ns_engine_opts eo = {.max_batch_tokens = 256, .max_logits = 16, .page_tokens = 16, .n_pages = 4096, .kv_dtype = NS_DT_F32};
    ns_sched_opts so = {.max_batch_tokens = 256, .max_running = 16, .prefill_chunk = 256};
    if (ns_engine_create(m, &eo, &e, &err) != NS_OK || ns_sched_create(e, &so, &s, &err) != NS_OK ||
        ns_sched_start(s, &err) != NS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("model %s, %d threads, page 16, step budget 256 tokens\n", argv[1], threads);
    int32_t *prompt = malloc(65536 * sizeof(int32_t));
    const int32_t gen = 64;
    int concs[3] = {1, 4, 16};
    for (int ci = 0; ci < 3; ci++) {
        int c = concs[ci];
        double reps[3];
        for (int rep = 0; rep < 3; rep++) {
            ns_request *rs[16];
            double t0 = ns_clock_now();
            for (int i = 0; i < c; i++) {
                make_prompt(prompt, 32, (uint32_t)(rep * 100 + i + 1), V);
                rs[i] = submit(s, prompt, 32, gen);
            }
            int32_t total = 0;
            for (int i = 0; i < c; i++) {
                total += drain(rs[i], NULL, 0);
                ns_request_release(rs[i]);
            }
            reps[rep] = total / (ns_clock_now() - t0);
        }
        qsort(reps, 3, sizeof(double), cmp_d);
        printf("decode, %2d concurrent sequences: %.1f tokens/s aggregate (median of 3)\n", c, reps[1]);
    }
    int32_t long_n = ctx - 64 < 8192 ? ctx - 64 : 8192;
    make_prompt(prompt, long_n, 4242, V);
    double t0 = ns_clock_now();
    ns_request *r = submit(s, prompt, long_n, 1);
    double tt[1];
    drain(r, tt, 1);
    double cold = tt[0] - t0;
    ns_request_release(r);
    t0 = ns_clock_now();
    r = submit(s, prompt, long_n, 1);
    drain(r, tt, 1);
    ns_request_result res;
    ns_request_result_get(r, &res);
    double warm = tt[0] - t0;
    ns_request_release(r);
    printf("TTFT, %d-token prompt: cold %.3f s, cached %.4f s (%d tokens reused), %.0fx\n", long_n, cold, warm,
           res.n_cached, cold / warm);
    for (int phase = 0; phase < 2; phase++) {
        make_prompt(prompt, 16, 777 + (uint32_t)phase, V);
        ns_request *dec = submit(s, prompt, 16, 200);
        ns_request *pre = NULL;
        if (phase == 1) {
            make_prompt(prompt, long_n, 999, V);
            pre = submit(s, prompt, long_n, 1);
        }
        double *times = malloc(256 * sizeof(double));
        int32_t n = drain(dec, times, 256);
        double *itl = malloc(256 * sizeof(double));
        int32_t k = 0;
        for (int32_t i = 1; i < n && i < 256; i++) itl[k++] = times[i] - times[i - 1];
        qsort(itl, (size_t)k, sizeof(double), cmp_d);
        printf("ITL of a decoding stream %s: p50 %.2f ms, p99 %.2f ms\n",
               phase ? "while another client prefills" : "alone", itl[k / 2] * 1e3, itl[(k * 99) / 100] * 1e3);
        if (pre) {
            drain(pre, NULL, 0);
            ns_request_release(pre);
        }
        ns_request_release(dec);
        free(times);
        free(itl);
    }
    free(prompt);
    ns_sched_free(s);
    ns_engine_free(e);
    ns_model_free(m);
    be->ops->destroy(be);
    return 0;
}
