#include "cli/cli_generate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "engine/runner.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"

/* Defaults, shared by the parser and the usage text. */
#define GEN_DEFAULT_N 64
#define GEN_DEFAULT_TEMPERATURE 0.8f

static void usage(FILE *f) {
    ns_cli_engine_opts d;
    ns_cli_engine_opts_default(&d);
    ns_sampling_params sp = ns_sampling_default();
    fprintf(f,
            "usage: nightshift generate [--model DIR] (--prompt TEXT | --tokens 1,2,3) [options]\n"
            "  Runs one prompt and streams the generated text to stdout (or, with --ids, prints\n"
            "  the generated token ids as one JSON array). Example:\n"
            "    nightshift generate --prompt \"Hello\" -n 32\n"
            "  --prompt TEXT            prompt text, encoded with the model's tokenizer (BOS added)\n"
            "  --tokens 1,2,3           prompt as token ids instead\n"
            "  -n, --n-predict N        tokens to generate at most (default %d; stops early at EOS)\n"
            "  --ids                    print the generated ids as a JSON array instead of text\n"
            "sampling:\n"
            "  --temperature T          0 = greedy (default %.1f)\n"
            "  --top-p P                nucleus sampling (default %.1f = off)\n"
            "  --top-k K                0 = off (default %d)\n"
            "  --min-p P                (default %.1f = off)\n"
            "  --repeat-penalty R       (default %.1f = off)\n"
            "  --presence-penalty X     in [-2, 2] (default %.1f)\n"
            "  --frequency-penalty X    in [-2, 2] (default %.1f)\n"
            "  --seed S                 sampling seed (default: random)\n",
            GEN_DEFAULT_N, (double)GEN_DEFAULT_TEMPERATURE, (double)sp.top_p, sp.top_k, (double)sp.min_p,
            (double)sp.repetition_penalty, (double)sp.presence_penalty, (double)sp.frequency_penalty);
    ns_cli_engine_usage(f, &d);
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
    sp.temperature = GEN_DEFAULT_TEMPERATURE;
    const char *prompt = NULL, *tokens_arg = NULL;
    long n_gen = GEN_DEFAULT_N;
    bool want_ids = false, seeded = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (ns_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        ns_error ferr = {0};
        int r = ns_cli_parse_engine_flag(&o, argc, argv, &i, &ferr);
        if (r < 0) return ns_cli_usage_error("generate", usage, "%s", ferr.msg);
        if (r > 0) continue;
        if (strcmp(a, "--ids") == 0) {
            want_ids = true;
            continue;
        }
        static const char *const with_value[] = {"--prompt", "--tokens", "-n", "--n-predict", "--seed", "--top-k",
                                                 "--temperature", "--top-p", "--min-p", "--repeat-penalty",
                                                 "--presence-penalty", "--frequency-penalty"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= strcmp(a, with_value[k]) == 0;
        if (!known) return ns_cli_usage_error("generate", usage, "unknown option %s", a);
        const char *v = ns_cli_flag_value(argc, argv, &i);
        if (!v) return ns_cli_usage_error("generate", usage, "%s needs a value", a);
        float f;
        if (strcmp(a, "--prompt") == 0) prompt = v;
        else if (strcmp(a, "--tokens") == 0) tokens_arg = v;
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0) {
            char *end;
            errno = 0;
            n_gen = strtol(v, &end, 10);
            if (errno || end == v || *end || n_gen < 0 || n_gen > 1000000)
                return ns_cli_usage_error("generate", usage, "%s must be an integer in [0, 1000000], not \"%s\"", a,
                                          v);
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-')
                return ns_cli_usage_error("generate", usage, "--seed must be a non-negative integer, not \"%s\"", v);
            sp.seed = s;
            seeded = true;
        } else if (strcmp(a, "--top-k") == 0) {
            char *end;
            errno = 0;
            long k = strtol(v, &end, 10);
            if (errno || end == v || *end || k < 0 || k > 1000000)
                return ns_cli_usage_error("generate", usage, "--top-k must be an integer in [0, 1000000], not \"%s\"",
                                          v);
            sp.top_k = (int32_t)k;
        } else if (parse_float(v, &f) != 0) {
            return ns_cli_usage_error("generate", usage, "%s must be a number, not \"%s\"", a, v);
        } else if (strcmp(a, "--temperature") == 0) sp.temperature = f;
        else if (strcmp(a, "--top-p") == 0) sp.top_p = f;
        else if (strcmp(a, "--min-p") == 0) sp.min_p = f;
        else if (strcmp(a, "--repeat-penalty") == 0) sp.repetition_penalty = f;
        else if (strcmp(a, "--presence-penalty") == 0) sp.presence_penalty = f;
        else if (strcmp(a, "--frequency-penalty") == 0) sp.frequency_penalty = f;
    }
    if (!!prompt == !!tokens_arg)
        return ns_cli_usage_error("generate", usage, "give exactly one of --prompt or --tokens");
    ns_error err = {0};
    if (ns_sampling_validate(&sp, &err) != NS_OK) return ns_cli_usage_error("generate", usage, "%s", err.msg);
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
        if (t < 0) { /* NaN (or no finite) logits: the model is broken */
            fprintf(stderr, "\nnightshift generate: the model produced non-finite logits after %d tokens\n", n_out);
            goto done;
        }
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
