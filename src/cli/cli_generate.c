#include "cli/cli_generate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "engine/runner.h"
#include "engine/sample.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

static void usage(void) {
    fprintf(stderr,
            "usage: nightshift generate [--model DIR] (--prompt TEXT | --tokens 1,2,3) [-n N] [--temperature T]\n"
            "         [--top-p P] [--top-k K] [--min-p P] [--repeat-penalty R] [--presence-penalty X]\n"
            "         [--frequency-penalty X] [--seed S] [--ids] [--threads N] [--device cpu|cuda]\n");
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = (float)v;
    return 0;
}

int ns_cli_generate(int argc, char **argv) {
    ns_cli_engine_opts o;
    ns_cli_engine_opts_default(&o);
    ns_sampling_params sp = ns_sampling_default();
    sp.temperature = 0.8f;
    const char *prompt = NULL, *tokens_arg = NULL;
    long n_gen = 64;
    bool want_ids = false, seeded = false;
    for (int i = 0; i < argc; i++) {
        int r = ns_cli_parse_engine_flag(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        float f;
        if (strcmp(a, "--ids") == 0) {
            want_ids = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "nightshift generate: unknown or incomplete argument %s\n", a);
            usage();
            return 2;
        }
        i++;
        if (strcmp(a, "--prompt") == 0) prompt = v;
        else if (strcmp(a, "--tokens") == 0) tokens_arg = v;
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0) {
            char *end;
            n_gen = strtol(v, &end, 10);
            if (*end || n_gen < 0 || n_gen > 1000000) {
                fprintf(stderr, "nightshift generate: -n must be an integer in [0, 1000000]\n");
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || *end) {
                fprintf(stderr, "nightshift generate: --seed must be a non-negative integer\n");
                return 2;
            }
            sp.seed = s;
            seeded = true;
        } else if (strcmp(a, "--top-k") == 0) {
            char *end;
            long k = strtol(v, &end, 10);
            if (*end || k < 0 || k > 1000000) {
                fprintf(stderr, "nightshift generate: --top-k must be a non-negative integer\n");
                return 2;
            }
            sp.top_k = (int32_t)k;
        } else if (parse_float(v, &f) == 0 && strcmp(a, "--temperature") == 0) sp.temperature = f;
        else if (parse_float(v, &f) == 0 && strcmp(a, "--top-p") == 0) sp.top_p = f;
        else if (parse_float(v, &f) == 0 && strcmp(a, "--min-p") == 0) sp.min_p = f;
        else if (parse_float(v, &f) == 0 && strcmp(a, "--repeat-penalty") == 0) sp.repetition_penalty = f;
        else if (parse_float(v, &f) == 0 && strcmp(a, "--presence-penalty") == 0) sp.presence_penalty = f;
        else if (parse_float(v, &f) == 0 && strcmp(a, "--frequency-penalty") == 0) sp.frequency_penalty = f;
        else {
            fprintf(stderr, "nightshift generate: bad argument %s %s\n", a, v);
            usage();
            return 2;
        }
    }
    if (!!prompt == !!tokens_arg) {
        fprintf(stderr, "nightshift generate: give exactly one of --prompt or --tokens\n");
        usage();
        return 2;
    }
    ns_error err = {0};
    if (ns_sampling_validate(&sp, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg);
        return 2;
    }
    if (!seeded) sp.seed = ns_cli_random_seed();
    int rc = 1;
    ns_cli_engine ce = {0};
    ns_tokenizer *tok = NULL;
    ns_detok *dt = NULL;
    ns_runner run = {0};
    ns_sampler smp = {0};
    int32_t *ids = NULL, n_ids = 0, *out_ids = NULL, n_out = 0;
    ns_buf text;
    ns_buf_init(&text, 1 << 20);
    if (ns_cli_tokenizer_open(o.model_dir, &tok, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg);
        goto done;
    }
    if (prompt) {
        size_t n = 0;
        if (ns_tokenizer_encode(tok, prompt, strlen(prompt), true, &ids, &n, &err) != NS_OK) {
            fprintf(stderr, "nightshift generate: %s\n", err.msg);
            goto done;
        }
        n_ids = (int32_t)n;
    } else if (ns_cli_parse_tokens(tokens_arg, &ids, &n_ids, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg);
        rc = 2;
        goto done;
    }
    if (n_ids == 0) {
        fprintf(stderr, "nightshift generate: the prompt encodes to no tokens\n");
        goto done;
    }
    if (ns_cli_engine_open(&o, &ce, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg);
        goto done;
    }
    if (!o.model_dir) NS_WARN("no --model: using the built-in demo model (RANDOM weights, output is noise)");
    const ns_model_config *cfg = &ce.model->cfg;
    out_ids = malloc(((size_t)n_gen + 1) * sizeof *out_ids);
    if (!out_ids || ns_sampler_init(&smp, &sp, cfg->vocab_size, &err) != NS_OK ||
        ns_detok_create(tok, false, &dt) != NS_OK || ns_runner_init(&run, ce.engine, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n_ids; i++) ns_sampler_accept(&smp, ids[i]);
    if (ns_runner_feed(&run, ids, n_ids, false, NULL, NULL, &err) != NS_OK) {
        fprintf(stderr, "nightshift generate: %s\n", err.msg);
        goto done;
    }
    while (n_out < n_gen) {
        int32_t t = ns_sampler_sample(&smp, run.logits);
        ns_sampler_accept(&smp, t);
        out_ids[n_out++] = t;
        if (ns_config_is_eos(cfg, t)) break;
        if (!want_ids) {
            ns_buf_reset(&text);
            ns_detok_push(dt, t, &text);
            fwrite(text.data ? text.data : "", 1, text.len, stdout);
            fflush(stdout);
        }
        if (n_out < n_gen && ns_runner_feed(&run, &t, 1, false, NULL, NULL, &err) != NS_OK) {
            fprintf(stderr, "\nnightshift generate: %s\n", err.msg);
            goto done;
        }
    }
    if (want_ids) {
        printf("[");
        for (int32_t i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out_ids[i]);
        printf("]\n");
    } else {
        ns_buf_reset(&text);
        ns_detok_flush(dt, &text);
        fwrite(text.data ? text.data : "", 1, text.len, stdout);
        printf("\n");
    }
    rc = 0;
done:
    ns_buf_free(&text);
    ns_runner_free(&run);
    ns_sampler_free(&smp);
    ns_detok_free(dt);
    ns_tokenizer_free(tok);
    ns_cli_engine_close(&ce);
    free(ids);
    free(out_ids);
    return rc;
}
