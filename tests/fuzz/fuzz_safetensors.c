/* fuzz_safetensors — a checkpoint directory through the validator and the
 * loader: config.json, an optional model.safetensors.index.json (sharded
 * checkpoints) and the safetensors bytes, written to a private temporary
 * directory (the loaders take a directory path; the files are rewritten
 * for every input).
 *
 * Input: byte 0 flags: bit 0 the input carries its own config.json (text up
 * to the first NUL; else a built-in tiny Llama config that the seeds
 * match), bit 1 an index (text up to the next NUL; the safetensors bytes
 * are then written under every shard name it lists, else as
 * model.safetensors), bit 2 also load the model onto a CPU backend when
 * the directory validates. The rest is the safetensors file.
 *
 * Oracles: ns_safetensors_open_dir / ns_model_validate_dir succeed or fail
 * with a message; every tensor they accept lies inside its file with the
 * byte size its shape and dtype imply; a directory that validates also
 * loads (ns_model_validate_dir promises to check what the load checks). */
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>

#include <jansson.h>

#include "backend/backend.h"
#include "fuzz_common.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "util/file.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 1 layer, hidden 8, 2 heads (head_dim 4), 1 KV head, ff 16, vocab 16, tied */
static const char TINY_CONFIG[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":16,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"max_position_embeddings\":64,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":true,\"eos_token_id\":2,"
    "\"bos_token_id\":1}";

static char g_dir[256];
static ns_backend *g_be;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/ns_fuzz_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("fuzz_safetensors: mkdtemp");
        exit(1);
    }
    ns_error err = {0};
    if (ns_backend_create("cpu", 1, &g_be, &err) != NS_OK) {
        fprintf(stderr, "fuzz_safetensors: cpu backend: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

static void put(const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FUZZ_CHECK(fd >= 0);
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        FUZZ_CHECK(w > 0);
        c += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* Files written for the previous input (removed before the next). */
static char g_written[16][128];
static int g_n_written;

static void put_tracked(const char *name, const void *p, size_t n) {
    put(name, p, n);
    if (g_n_written < 16) snprintf(g_written[g_n_written++], sizeof g_written[0], "%s", name);
}

static void clear_dir(void) {
    char path[512];
    for (int i = 0; i < g_n_written; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, g_written[i]);
        unlink(path);
    }
    g_n_written = 0;
}

/* A shard name the harness is willing to create (the loader refuses
 * others itself: '/' and ".."). */
static bool plain_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 100 || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20) return false;
    return strcmp(s, "config.json") != 0 && strcmp(s, "model.safetensors.index.json") != 0 &&
           strcmp(s, "model.safetensors") != 0;
}

static void check_tensors(const ns_safetensors *st) {
    for (int32_t i = 0; i < st->n_tensors; i++) {
        const ns_st_tensor *t = &st->tensors[i];
        FUZZ_CHECK(t->file >= 0 && t->file < st->n_files);
        const ns_mmap *m = &st->files[t->file];
        const uint8_t *base = m->data, *d = t->data;
        FUZZ_CHECK(d >= base && (size_t)(d - base) <= m->size && t->n_bytes <= m->size - (size_t)(d - base));
        uint64_t numel = 1;
        for (int32_t d = 0; d < t->n_dims; d++) numel *= (uint64_t)t->shape[d];
        FUZZ_CHECK(numel * ns_dtype_size(t->dtype) == t->n_bytes);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    clear_dir();

    if (flags & 1) {
        const char *nul = memchr(p, 0, (size_t)(end - p));
        if (!nul) return 0;
        put_tracked("config.json", p, (size_t)(nul - p));
        p = nul + 1;
    } else {
        put_tracked("config.json", TINY_CONFIG, sizeof TINY_CONFIG - 1);
    }
    if (flags & 2) {
        const char *nul = memchr(p, 0, (size_t)(end - p));
        if (!nul) return 0;
        put_tracked("model.safetensors.index.json", p, (size_t)(nul - p));
        json_error_t je;
        json_t *idx = json_loadb(p, (size_t)(nul - p), 0, &je);
        p = nul + 1;
        const char *key;
        json_t *v;
        int written = 0;
        json_object_foreach(json_object_get(idx, "weight_map"), key, v) {
            const char *f = json_string_value(v);
            if (f && plain_name(f) && written < 8) {
                put_tracked(f, p, (size_t)(end - p));
                written++;
            }
        }
        json_decref(idx);
    } else {
        put_tracked("model.safetensors", p, (size_t)(end - p));
    }

    ns_error err = {0};
    ns_safetensors *st = NULL;
    if (ns_safetensors_open_dir(g_dir, &st, &err) == NS_OK) {
        check_tensors(st);
        ns_safetensors_close(st);
    } else {
        FUZZ_CHECK(err.msg[0] != 0);
    }
    ns_model_config cfg;
    ns_status vs = ns_model_validate_dir(g_dir, &cfg, &err);
    if (vs != NS_OK) FUZZ_CHECK(err.msg[0] != 0);
    if (vs == NS_OK && (flags & 4)) {
        ns_model *m = NULL;
        ns_status ls = ns_model_load(g_dir, g_be, &m, &err);
        if (ls != NS_OK) fprintf(stderr, "validated but failed to load: %s\n", err.msg);
        FUZZ_CHECK(ls == NS_OK || ls == NS_ERR_NOMEM);
        ns_model_free(m);
    }
    return 0;
}
