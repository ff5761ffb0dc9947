/* bench_cpu — CPU prefill and decode throughput of the reference engine.
 *
 * usage: build/bench/bench_cpu MODEL_DIR [PROMPT_TOKENS] [DECODE_TOKENS] [REPEATS]
 * For 1 and 2 threads: prefill of a PROMPT_TOKENS prompt (tokens/s) and
 * greedy decode of DECODE_TOKENS tokens after it (tokens/s); median over
 * REPEATS runs. Prompt ids are deterministic pseudo-random. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/runner.h"
#include "util/clock.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [PROMPT_TOKENS] [DECODE_TOKENS] [REPEATS]\n", argv[0]);
        return 2;
    }
    int n_prompt = argc > 2 ? atoi(argv[2]) : 512, n_dec = argc > 3 ? atoi(argv[3]) : 128,
        reps = argc > 4 ? atoi(argv[4]) : 5;
    if (n_prompt < 1 || n_dec < 1 || reps < 1 || reps > 100) return 2;
    printf("model %s, prompt %d tokens, decode %d tokens, median of %d\n", argv[1], n_prompt, n_dec, reps);
    for (int threads = 1; threads <= 2; threads++) {
        ns_error err = {0};
        ns_backend *be = NULL;
        ns_model *m = NULL;
        ns_engine *e = NULL;
        if (ns_backend_cpu_create(threads, &be, &err) != NS_OK || ns_model_load(argv[1], be, &m, &err) != NS_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        ns_engine_opts eo = {.max_batch_tokens = 512, .max_logits = 1, .page_tokens = 16,
                             .n_pages = (n_prompt + n_dec) / 16 + 2, .kv_dtype = NS_DT_F32};
        if (ns_engine_create(m, &eo, &e, &err) != NS_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
        uint32_t x = 7;
        for (int i = 0; i < n_prompt; i++) {
            x = x * 1103515245u + 12345u;
            prompt[i] = (int32_t)((x >> 8) % (uint32_t)m->cfg.vocab_size);
        }
        double pre[100], dec[100];
        for (int r = 0; r < reps; r++) {
            ns_runner run;
            ns_runner_init(&run, e, &err);
            double t0 = ns_clock_now();
            ns_runner_feed(&run, prompt, n_prompt, false, NULL, NULL, &err);
            double t1 = ns_clock_now();
            for (int i = 0; i < n_dec; i++) {
                int32_t tok = 0;
                for (int32_t v = 1; v < m->cfg.vocab_size; v++)
                    if (run.logits[v] > run.logits[tok]) tok = v;
                ns_runner_feed(&run, &tok, 1, false, NULL, NULL, &err);
            }
            double t2 = ns_clock_now();
            pre[r] = n_prompt / (t1 - t0);
            dec[r] = n_dec / (t2 - t1);
            ns_runner_free(&run);
        }
        qsort(pre, (size_t)reps, sizeof(double), cmp_d);
        qsort(dec, (size_t)reps, sizeof(double), cmp_d);
        printf("threads %d: prefill %.1f tok/s, decode %.1f tok/s (weights %.1f MB)\n", threads, pre[reps / 2],
               dec[reps / 2], m->weight_bytes / 1e6);
        free(prompt);
        ns_engine_free(e);
        ns_model_free(m);
        be->ops->destroy(be);
    }
    return 0;
}
