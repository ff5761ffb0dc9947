#include "cli/cli_common.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "model/demo.h"
#ifdef NS_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif
#include "tokenizer/tokenizer.h"
#include "util/clock.h"
#include "util/log.h"

void ns_cli_engine_opts_default(ns_cli_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->page_tokens = 0;      /* per backend, see ns_cli_page_tokens */
    o->max_batch_tokens = 0; /* per backend, see ns_cli_batch_tokens */
    o->max_logits = 1;
    o->default_pool_contexts = 1;
}

int32_t ns_cli_batch_tokens(const ns_cli_engine_opts *o) {
    if (o->max_batch_tokens > 0) return o->max_batch_tokens;
    return o->device && strcmp(o->device, "cuda") == 0 ? NS_CLI_BATCH_TOKENS_CUDA : NS_CLI_BATCH_TOKENS_CPU;
}

int32_t ns_cli_page_tokens(const ns_cli_engine_opts *o) {
    if (o->page_tokens > 0) return o->page_tokens;
    return ns_cli_default_page_tokens(o->device);
}

ns_status ns_cli_dummy_config(const char *path, ns_model_config *cfg, ns_error *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root && je.line > 0) return ns_fail(err, NS_ERR_IO, "%s: %s (line %d)", path, je.text, je.line);
    if (!root) return ns_fail(err, NS_ERR_IO, "%s", je.text);
    ns_status rc = ns_config_from_json(root, NULL, cfg, err);
    json_decref(root);
    return rc;
}

int ns_cli_default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "512M", "8G", "1.5GiB", "4096" -> bytes (K/M/G are powers of 1024). */
int ns_cli_parse_size(const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (mult > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (errno || end == s || *end || !(x > 0) || x * mult > 1e15) return -1;
    *out = x * mult;
    return 0;
}

bool ns_cli_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

const char *ns_cli_flag_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

int ns_cli_usage_error(const char *cmd, ns_cli_usage_fn usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nightshift %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (usage) usage(stderr);
    return 2;
}

static const char *log_level_name(ns_log_level l) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    return (unsigned)l < 5 ? names[l] : "?";
}

void ns_cli_engine_usage(FILE *f, const ns_cli_engine_opts *d) {
    char batch[64], page[64];
    if (d->max_batch_tokens > 0) snprintf(batch, sizeof batch, "%d", (int)d->max_batch_tokens);
    else snprintf(batch, sizeof batch, "%d on the CPU, %d on CUDA", NS_CLI_BATCH_TOKENS_CPU, NS_CLI_BATCH_TOKENS_CUDA);
    if (d->page_tokens > 0) snprintf(page, sizeof page, "%d", (int)d->page_tokens);
    else snprintf(page, sizeof page, "%d on the CPU, %d on CUDA", NS_CLI_PAGE_TOKENS_CPU, NS_CLI_PAGE_TOKENS_CUDA);
    fprintf(f,
            "engine options:\n"
            "  --model DIR              Hugging Face checkpoint directory: config.json, *.safetensors,\n"
            "                           tokenizer.json; or a GGUF file (FILE.gguf, NAME-00001-of-0000N.gguf)\n"
            "                           (default: the built-in demo model, RANDOM weights)\n"
            "  --device cpu|cuda        backend (default %s)\n"
            "  --threads N              CPU threads (default: one per core, at most 64; %d here)\n"
            "  --page-size P            KV page size in tokens (default %s)\n"
            "  --max-batch-tokens N     tokens per engine step (default %s)\n"
            "  --kv-dtype auto|bf16|f32|fp8  KV cache element type (default auto: f32 on the CPU, bf16\n"
            "                           on CUDA); fp8 = e4m3 with a scale per page and head, half the\n"
            "                           bytes of bf16 (CPU: f32 or fp8; CUDA: bf16 or fp8)\n"
            "  --log-level L            debug|info|warn|error|off (default %s; also $NS_LOG_LEVEL)\n"
            "KV pool size: the first of these that is given, in this order, decides (default: %d\n"
            "model context%s on the CPU, capped at a quarter of RAM; 90%% of the device memory free\n"
            "after loading on CUDA):\n"
            "  --kv-pages N             in pages\n"
            "  --kv-memory SIZE         in bytes, e.g. 512M, 8G\n"
            "  --gpu-memory F|SIZE      CUDA: a fraction (0, 1] of the free device memory, or a size\n"
            "  --kv-tokens N            in tokens, rounded up to whole pages\n",
            d->device, ns_cli_default_threads(), page, batch, log_level_name(ns_log_get_level()),
            d->default_pool_contexts, d->default_pool_contexts == 1 ? "" : "s");
}

int ns_cli_parse_engine_flag(ns_cli_engine_opts *o, int argc, char **argv, int *i, ns_error *err) {
    const char *a = argv[*i];
    const char *val = NULL;
    long long v;
    static const char *const known[] = {"--model", "--device", "--threads", "--page-size", "--max-batch-tokens",
                                        "--kv-tokens", "--kv-pages", "--kv-memory", "--gpu-memory", "--log-level",
                                        "--kv-dtype"};
    bool is_known = false;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= strcmp(a, known[k]) == 0;
    if (!is_known) return 0;
    val = ns_cli_flag_value(argc, argv, i);
    if (!val) {
        ns_fail(err, NS_ERR_INVALID, "%s needs a value", a);
        return -1;
    }
#define INT_FLAG(name, lo, hi, field)                                                                            \
    if (strcmp(a, name) == 0) {                                                                                  \
        if (parse_int(val, lo, hi, &v) != 0) {                                                                   \
            ns_fail(err, NS_ERR_INVALID, "%s must be an integer in [%lld, %lld], not \"%s\"", a, (long long)(lo), \
                    (long long)(hi), val);                                                                       \
            return -1;                                                                                           \
        }                                                                                                        \
        o->field = v;                                                                                            \
        return 1;                                                                                                \
    }
    if (strcmp(a, "--model") == 0) {
        o->model_dir = val;
        return 1;
    }
    if (strcmp(a, "--device") == 0) {
        if (strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0) {
            ns_fail(err, NS_ERR_INVALID, "--device must be cpu or cuda, not \"%s\"", val);
            return -1;
        }
#ifndef NS_HAVE_CUDA
        if (strcmp(val, "cuda") == 0) {
            ns_fail(err, NS_ERR_INVALID, "--device cuda: this build has no CUDA backend (rebuild with make CUDA=1)");
            return -1;
        }
#endif
        o->device = val;
        return 1;
    }
    if (strcmp(a, "--kv-dtype") == 0) {
        ns_dtype dt;
        /* the name is checked here; whether the backend stores it, at open */
        if (strcmp(val, "auto") != 0 && ns_kv_dtype_choose(val, "cpu", &dt, err) != NS_OK &&
            ns_kv_dtype_choose(val, "cuda", &dt, err) != NS_OK)
            return -1;
        o->kv_dtype = val;
        return 1;
    }
    if (strcmp(a, "--log-level") == 0) {
        int l = ns_log_parse_level(val);
        if (l < 0) {
            ns_fail(err, NS_ERR_INVALID, "--log-level must be debug|info|warn|error|off, not \"%s\"", val);
            return -1;
        }
        ns_log_set_level((ns_log_level)l);
        return 1;
    }
    INT_FLAG("--threads", 1, 256, threads)
    INT_FLAG("--page-size", 1, 4096, page_tokens)
    INT_FLAG("--max-batch-tokens", 1, 1 << 20, max_batch_tokens)
    INT_FLAG("--kv-tokens", 1, (long long)1 << 32, kv_tokens)
    INT_FLAG("--kv-pages", 1, INT32_MAX, kv_pages)
#undef INT_FLAG
    if (strcmp(a, "--gpu-memory") == 0) {
        double x;
        /* a bare number <= 1 is a fraction; otherwise a size */
        if (ns_cli_parse_size(val, &x) != 0 || (x > 1 && x < 1024)) {
            ns_fail(err, NS_ERR_INVALID, "--gpu-memory must be a fraction in (0, 1] or a size like 40G, not \"%s\"",
                    val);
            return -1;
        }
        o->gpu_memory = x;
        return 1;
    }
    if (strcmp(a, "--kv-memory") == 0) {
        double x;
        if (ns_cli_parse_size(val, &x) != 0 || x < 1) {
            ns_fail(err, NS_ERR_INVALID, "--kv-memory must be a size like 512M or 8G, not \"%s\"", val);
            return -1;
        }
        o->kv_memory = (int64_t)x;
        return 1;
    }
    ns_fail(err, NS_ERR_INTERNAL, "%s is listed as an engine flag but not handled", a);
    return -1;
}

ns_status ns_cli_engine_open(const ns_cli_engine_opts *o, ns_cli_engine *ce, ns_error *err) {
    memset(ce, 0, sizeof *ce);
    ns_status rc = ns_backend_create(o->device, o->threads ? o->threads : ns_cli_default_threads(), &ce->be, err);
    if (rc != NS_OK) return rc;
    if (o->model_dir) {
        rc = ns_model_load(o->model_dir, ce->be, &ce->model, err);
    } else if (o->dummy_config) {
        ns_model_config cfg;
        rc = ns_cli_dummy_config(o->dummy_config, &cfg, err);
        double t0 = ns_clock_now();
        if (rc == NS_OK) rc = ns_model_create_random(&cfg, ce->be, NS_DT_BF16, NS_DEMO_SEED, &ce->model, err);
        if (rc == NS_OK)
            NS_INFO("dummy weights: %s (%d layers, hidden %d, vocab %d), random bf16, generated in %.2f s",
                    o->dummy_config, cfg.n_layers, cfg.hidden_size, cfg.vocab_size, ns_clock_now() - t0);
    } else {
        ns_model_config cfg;
        ns_demo_config(&cfg);
        rc = ns_model_create_random(&cfg, ce->be, NS_DT_F32, NS_DEMO_SEED, &ce->model, err);
    }
    if (rc != NS_OK) goto fail;
    const int32_t batch = ns_cli_batch_tokens(o), P = ns_cli_page_tokens(o);
    ns_engine_opts eo = {
        .max_batch_tokens = batch,
        .max_logits = o->max_logits > batch ? batch : o->max_logits,
        .page_tokens = P,
    };
    rc = ns_kv_dtype_choose(o->kv_dtype, ce->be->ops->name, &eo.kv_dtype, err);
    if (rc != NS_OK) goto fail;
    /* Pool size: exactly one of --kv-pages / --kv-memory / --kv-tokens, or
     * enough for one full-context sequence. */
    int64_t pages;
    if (o->kv_pages) {
        pages = o->kv_pages;
    } else if (o->kv_memory) {
        pages = o->kv_memory / (int64_t)ns_engine_page_bytes(&ce->model->cfg, P, eo.kv_dtype);
        if (pages < 1) {
            rc = ns_fail(err, NS_ERR_INVALID, "--kv-memory %lld bytes is less than one KV page (%zu bytes)",
                         (long long)o->kv_memory, ns_engine_page_bytes(&ce->model->cfg, P, eo.kv_dtype));
            goto fail;
        }
    } else if (o->gpu_memory > 0 || (!o->kv_tokens && strcmp(ce->be->ops->name, "cuda") == 0)) {
        double bytes = o->gpu_memory > 0 ? o->gpu_memory : 0.9;
        if (bytes <= 1.0) {
#ifdef NS_HAVE_CUDA
            size_t free_b = 0, total_b = 0;
            if (strcmp(ce->be->ops->name, "cuda") != 0) {
                rc = ns_fail(err, NS_ERR_INVALID, "--gpu-memory as a fraction needs --device cuda");
                goto fail;
            }
            rc = ns_cuda_mem_info(ce->be, &free_b, &total_b, err);
            if (rc != NS_OK) goto fail;
            /* keep room for the step workspace and cuBLAS: 2 GiB or 5% */
            double reserve = (double)total_b * 0.05 > 2.0 * (1 << 30) ? (double)total_b * 0.05 : 2.0 * (1 << 30);
            bytes = ((double)free_b - reserve) * bytes; /* bytes holds the fraction here */
#else
            rc = ns_fail(err, NS_ERR_UNSUPPORTED, "--gpu-memory as a fraction needs a CUDA build (make CUDA=1)");
            goto fail;
#endif
        }
        pages = (int64_t)(bytes / (double)ns_engine_page_bytes(&ce->model->cfg, P, eo.kv_dtype));
        if (o->gpu_memory <= 0) {
            /* Default sizing: a small model would get tens of millions of
             * pages (and host-side page tables to match); 64 contexts is
             * more than any workload of it needs. */
            int64_t cap = 64 * (((int64_t)ce->model->cfg.max_position_embeddings + P - 1) / P);
            if (pages > cap) pages = cap;
        }
        if (pages < 1) {
            rc = ns_fail(err, NS_ERR_INVALID, "--gpu-memory leaves no room for a single KV page");
            goto fail;
        }
    } else if (o->kv_tokens) {
        pages = (o->kv_tokens + P - 1) / P;
    } else {
        /* A request without max_tokens reserves up to a whole context, so a
         * pool of one context would serialize such requests. Default to
         * several contexts, but never more than a quarter of the RAM. */
        const int64_t ctx = ce->model->cfg.max_position_embeddings;
        const int64_t page_bytes = (int64_t)ns_engine_page_bytes(&ce->model->cfg, P, eo.kv_dtype);
        int64_t want = ((int64_t)ctx * (o->default_pool_contexts > 0 ? o->default_pool_contexts : 1) + P - 1) /
                       P;
        long phys = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
        int64_t cap = phys > 0 && psz > 0 ? (int64_t)phys * psz / 4 / page_bytes : want;
        int64_t one_ctx = (ctx + P - 1) / P;
        pages = want < cap ? want : cap;
        if (pages < one_ctx) pages = one_ctx;
    }
    if (pages > INT32_MAX) pages = INT32_MAX;
    eo.n_pages = (int32_t)pages;
    rc = ns_engine_create(ce->model, &eo, &ce->engine, err);
    if (rc != NS_OK) goto fail;
    NS_INFO("KV pool: %d pages of %d tokens = %lld tokens, %.1f MiB (%s)", eo.n_pages, eo.page_tokens,
            (long long)eo.n_pages * eo.page_tokens,
            (double)eo.n_pages * (double)ns_engine_page_bytes(&ce->model->cfg, eo.page_tokens, eo.kv_dtype) / 1048576.0,
            ns_dtype_name(eo.kv_dtype));
    return NS_OK;
fail:
    ns_cli_engine_close(ce);
    return rc;
}

void ns_cli_engine_close(ns_cli_engine *ce) {
    ns_engine_free(ce->engine);
    ns_model_free(ce->model);
    if (ce->be) ce->be->ops->destroy(ce->be);
    memset(ce, 0, sizeof *ce);
}

ns_status ns_cli_parse_tokens(const char *s, int32_t **out, int32_t *n_out, ns_error *err) {
    *out = NULL;
    *n_out = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    if (cap > (1u << 24)) return ns_fail(err, NS_ERR_RANGE, "--tokens: too many tokens");
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    int32_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return ns_fail(err, NS_ERR_INVALID, "--tokens: expected comma-separated non-negative integers");
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        free(ids);
        return ns_fail(err, NS_ERR_INVALID, "--tokens: empty list");
    }
    *out = ids;
    *n_out = n;
    return NS_OK;
}

ns_status ns_cli_tokenizer_open(const char *model_dir, struct ns_tokenizer **out, ns_error *err) {
    if (model_dir) return ns_tokenizer_load(model_dir, out, err);
    return ns_tokenizer_load_json(ns_demo_tokenizer_json(), ns_demo_tokenizer_config_json(), out, err);
}

ns_status ns_cli_engine_tokenizer(const ns_cli_engine_opts *o, const ns_cli_engine *ce, struct ns_tokenizer **out,
                                  ns_error *err) {
    if (o->model_dir || !ce->model) return ns_cli_tokenizer_open(o->model_dir, out, err);
    char *json = ns_demo_tokenizer_json_n(ce->model->cfg.vocab_size);
    if (!json) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status rc = ns_tokenizer_load_json(json, ns_demo_tokenizer_config_json(), out, err);
    free(json);
    return rc;
}

uint64_t ns_cli_random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid();
    }
    return s;
}
