/* fuzz_gguf — GGUF bytes through the parser, the hyper-parameters, the
 * embedded tokenizer and the model loader.
 *
 * Input: the GGUF file. It is parsed from memory (ns_gguf_open_mem); when
 * that succeeds the bytes are also written to a private temporary file
 * (the loaders take a path) and validated (ns_model_validate_dir) and, if
 * valid, loaded onto a one-thread CPU backend and run for one token.
 *
 * Oracles: every failure carries a message; every tensor of an opened file
 * lies inside the input with the byte size its dims and type imply; a
 * model that validates also loads (the validator promises the loader's
 * checks) and its one-token logits are finite or the step fails cleanly.
 *
 * Seeds (tests/fuzz/corpus/fuzz_gguf/): tiny llama and qwen3 models (hidden
 * 32, one layer, vocabulary of 8) with F32, F16, Q8_0 and Q4_0 weights and
 * SentencePiece or gpt2 tokenizers, written by
 * tests/fixtures/tools/make_gguf_fuzz_seeds.py with llama.cpp's gguf-py;
 * regress-* are inputs that once failed. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "engine/runner.h"
#include "fuzz_common.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "tokenizer/tok_gguf.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[256];
static ns_backend *g_be;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    const char *tmp = getenv("TMPDIR");
    char dir[200];
    snprintf(dir, sizeof dir, "%s/ns_fuzz_gguf_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("fuzz_gguf: mkdtemp");
        exit(1);
    }
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    ns_error err = {0};
    if (ns_backend_create("cpu", 1, &g_be, &err) != NS_OK) {
        fprintf(stderr, "fuzz_gguf: cpu backend: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

static void write_file(const uint8_t *p, size_t n) {
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FUZZ_CHECK(fd >= 0);
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        FUZZ_CHECK(w > 0);
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

static void run_model(void) {
    ns_error err = {0};
    ns_model_config cfg;
    if (ns_model_validate_dir(g_path, &cfg, &err) != NS_OK) {
        FUZZ_CHECK(err.msg[0] != 0);
        return;
    }
    /* keep the fuzzer fast: skip models too big to run per input */
    if ((int64_t)cfg.vocab_size * cfg.hidden_size > (1 << 20) || cfg.n_layers > 4 || cfg.hidden_size > 1024) return;
    ns_model *m = NULL;
    ns_status st = ns_model_load(g_path, g_be, &m, &err);
    FUZZ_CHECK(st == NS_OK); /* validated => loads */
    ns_engine_opts eo = {.max_batch_tokens = 4, .max_logits = 4, .page_tokens = 16, .n_pages = 2, .kv_dtype = NS_DT_F32};
    ns_engine *e = NULL;
    if (ns_engine_create(m, &eo, &e, &err) == NS_OK) {
        ns_runner r;
        if (ns_runner_init(&r, e, &err) == NS_OK) {
            int32_t tok = 0;
            (void)ns_runner_feed(&r, &tok, 1, false, NULL, NULL, &err);
            ns_runner_free(&r);
        }
        ns_engine_free(e);
    } else {
        FUZZ_CHECK(err.msg[0] != 0);
    }
    ns_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ns_gguf *g = NULL;
    ns_error err = {0};
    if (ns_gguf_open_mem(data, size, &g, &err) != NS_OK) {
        FUZZ_CHECK(err.msg[0] != 0);
        return 0;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ns_gguf_tensor *t = &g->tensors[i];
        int64_t be, bb;
        FUZZ_CHECK(ns_ggml_type_layout(t->type, &be, &bb));
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
        FUZZ_CHECK(n % (uint64_t)be == 0 && n / (uint64_t)be * (uint64_t)bb == t->nbytes);
        FUZZ_CHECK(t->data >= data && t->nbytes <= size && (size_t)(t->data - data) <= size - t->nbytes);
    }
    ns_model_config cfg;
    ns_error e2 = {0};
    if (ns_gguf_config(g, &cfg, &e2) != NS_OK) FUZZ_CHECK(e2.msg[0] != 0);
    ns_tokenizer *tok = NULL;
    ns_error e3 = {0};
    if (ns_tokenizer_from_gguf(g, &tok, &e3) == NS_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ns_tokenizer_encode(tok, "a ab\n\xc3\xa9<s>", 10, true, &ids, &n, &e3) == NS_OK) {
            char *text = NULL;
            size_t len = 0;
            if (ns_tokenizer_decode(tok, ids, n, false, &text, &len, &e3) == NS_OK) free(text);
            free(ids);
        }
        ns_tokenizer_free(tok);
    } else {
        FUZZ_CHECK(e3.msg[0] != 0);
    }
    ns_gguf_close(g);
    write_file(data, size);
    run_model();
    return 0;
}
