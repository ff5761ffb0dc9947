/* gguf_model.c — GGUF file(s) -> ns_model (see gguf_model.h). */
#include "model/gguf_model.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xxhash.h>

#include "util/file.h"

/* What a GGUF-loaded model owns beyond its tensors. */
struct ns_gguf_model {
    ns_gguf_set *set;
    void **owned; /* un-permuted q/k copies the backend may borrow */
    int n_owned;
    bool *used;   /* per tensor of each shard, flattened: bind bookkeeping */
};

/* ------------------------------------------------------------ paths */

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* "-00001-of-00003.gguf" at the end of name: shard number and count. */
static bool shard_suffix(const char *name, int *no, int *count) {
    size_t n = strlen(name);
    if (n < 20) return false;
    const char *s = name + n - 20;
    int a, b;
    char tail[8];
    if (sscanf(s, "-%5d-of-%5d%7s", &a, &b, tail) != 3 || strcmp(tail, ".gguf") != 0) return false;
    if (s[1] < '0' || s[1] > '9' || s[10] < '0' || s[10] > '9') return false;
    *no = a;
    *count = b;
    return true;
}

/* A file named otherwise is still GGUF when it starts with the magic. */
static bool has_magic(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char m[4] = {0};
    bool ok = fread(m, 1, 4, f) == 4 && memcmp(m, "GGUF", 4) == 0;
    fclose(f);
    return ok;
}

bool ns_gguf_model_path(const char *path, char **gguf_path, ns_error *err) {
    *gguf_path = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return false;
    if (S_ISREG(sb.st_mode)) {
        if (!ends_with(path, ".gguf") && !has_magic(path)) return false;
        *gguf_path = strdup(path);
        if (!*gguf_path) ns_fail(err, NS_ERR_NOMEM, "out of memory");
        return *gguf_path != NULL;
    }
    if (!S_ISDIR(sb.st_mode)) return false;
    char *cfg = ns_path_join(path, "config.json");
    if (!cfg) {
        ns_fail(err, NS_ERR_NOMEM, "out of memory");
        return false;
    }
    bool has_cfg = ns_file_exists(cfg);
    free(cfg);
    if (has_cfg) return false; /* a Hugging Face directory wins */
    DIR *d = opendir(path);
    if (!d) return false;
    char found[1024] = "";
    int n_models = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".gguf")) continue;
        int no, cnt;
        if (shard_suffix(e->d_name, &no, &cnt) && no != 1) continue; /* later shards follow the first */
        n_models++;
        snprintf(found, sizeof found, "%s", e->d_name);
    }
    closedir(d);
    if (n_models == 0) return false;
    if (n_models > 1) {
        ns_fail(err, NS_ERR_INVALID, "%s: holds %d GGUF models; pass the .gguf file to use", path, n_models);
        return false;
    }
    *gguf_path = ns_path_join(path, found);
    if (!*gguf_path) ns_fail(err, NS_ERR_NOMEM, "out of memory");
    return *gguf_path != NULL;
}

/* --------------------------------------------------------------- shards */

void ns_gguf_set_close(ns_gguf_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) ns_gguf_close(s->files[i]);
    free(s->files);
    free(s);
}

static ns_status split_key(const ns_gguf *g, const char *key, int64_t *v, bool *found, ns_error *err) {
    return ns_gguf_get_i64(g, key, v, found, err);
}

ns_status ns_gguf_set_open(const char *first, ns_gguf_set **out, ns_error *err) {
    *out = NULL;
    ns_gguf_set *s = calloc(1, sizeof *s);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_gguf *g0 = NULL;
    char *path = NULL;
    ns_status rc = ns_gguf_open(first, &g0, err);
    if (rc != NS_OK) goto fail;
    int64_t count = 1, no = 0, total = -1;
    bool has_count, f;
    if ((rc = split_key(g0, "split.count", &count, &has_count, err)) != NS_OK) goto fail;
    if ((rc = split_key(g0, "split.no", &no, &f, err)) != NS_OK) goto fail;
    if ((rc = split_key(g0, "split.tensors.count", &total, &f, err)) != NS_OK) goto fail;
    if (!has_count) count = 1;
    if (count < 1 || count > NS_GGUF_MAX_SHARDS || no != 0) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: split.count %lld / split.no %lld: not the first of 1..%d shards", first,
                     (long long)count, (long long)no, NS_GGUF_MAX_SHARDS);
        goto fail;
    }
    s->files = calloc((size_t)count, sizeof *s->files);
    if (!s->files) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->files[0] = g0;
    s->n = 1;
    g0 = NULL;
    if (count > 1) {
        int sno, scnt;
        if (!shard_suffix(first, &sno, &scnt) || sno != 1 || scnt != count) {
            rc = ns_fail(err, NS_ERR_FORMAT, "%s: split.count is %lld but the name is not NAME-00001-of-%05lld.gguf",
                         first, (long long)count, (long long)count);
            goto fail;
        }
        size_t plen = strlen(first) - 20;
        path = malloc(plen + 32);
        if (!path) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (int i = 1; i < count; i++) {
            snprintf(path, plen + 32, "%.*s-%05d-of-%05d.gguf", (int)plen, first, i + 1, (int)count);
            rc = ns_gguf_open(path, &s->files[i], err);
            if (rc != NS_OK) goto fail;
            s->n++;
            int64_t c2 = 0, n2 = -1;
            if ((rc = split_key(s->files[i], "split.count", &c2, &f, err)) != NS_OK) goto fail;
            if ((rc = split_key(s->files[i], "split.no", &n2, &f, err)) != NS_OK) goto fail;
            if (c2 != count || n2 != i) {
                rc = ns_fail(err, NS_ERR_FORMAT, "%s: split.count %lld / split.no %lld, expected %lld / %d", path,
                             (long long)c2, (long long)n2, (long long)count, i);
                goto fail;
            }
        }
    }
    uint64_t sum = 0;
    for (int i = 0; i < s->n; i++) sum += s->files[i]->n_tensors;
    if (total >= 0 && (uint64_t)total != sum) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: split.tensors.count is %lld but the shards hold %llu tensors", first,
                     (long long)total, (unsigned long long)sum);
        goto fail;
    }
    /* Names must be unique across shards too. */
    for (int i = 1; i < s->n; i++)
        for (uint64_t t = 0; t < s->files[i]->n_tensors; t++)
            for (int j = 0; j < i; j++) {
                const ns_gguf_tensor *a = &s->files[i]->tensors[t];
                char nm[256];
                snprintf(nm, sizeof nm, "%.*s", (int)(a->name_len < 255 ? a->name_len : 255), a->name);
                if (ns_gguf_find_tensor(s->files[j], nm)) {
                    rc = ns_fail(err, NS_ERR_FORMAT, "%s: tensor \"%s\" is in two shards", first, nm);
                    goto fail;
                }
            }
    free(path);
    *out = s;
    return NS_OK;
fail:
    free(path);
    ns_gguf_close(g0);
    ns_gguf_set_close(s);
    return rc;
}

const ns_gguf_tensor *ns_gguf_set_find(const ns_gguf_set *s, const char *name) {
    for (int i = 0; i < s->n; i++) {
        const ns_gguf_tensor *t = ns_gguf_find_tensor(s->files[i], name);
        if (t) return t;
    }
    return NULL;
}

/* --------------------------------------------------------------- config */

static ns_status arch_int(const ns_gguf *g, const char *arch, const char *suffix, int64_t lo, int64_t hi, bool required,
                          int32_t *out, ns_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    bool found;
    ns_status rc = ns_gguf_get_i64(g, key, &v, &found, err);
    if (rc != NS_OK) return rc;
    if (!found) return required ? ns_fail(err, NS_ERR_FORMAT, "%s: missing metadata \"%s\"", g->path, key) : NS_OK;
    if (v < lo || v > hi)
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" = %lld is out of range [%lld, %lld]", g->path, key,
                       (long long)v, (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return NS_OK;
}

static ns_status arch_float(const ns_gguf *g, const char *arch, const char *suffix, double lo, double hi, float *out,
                            ns_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    bool found;
    ns_status rc = ns_gguf_get_f64(g, key, &v, &found, err);
    if (rc != NS_OK || !found) return rc;
    if (!(v >= lo && v <= hi))
        return ns_fail(err, NS_ERR_FORMAT, "%s: metadata \"%s\" = %g is out of range [%g, %g]", g->path, key, v, lo, hi);
    *out = (float)v;
    return NS_OK;
}

/* bos / eos / eot / eom ids: in the vocabulary or ignored (llama.cpp
 * writes -1 as u32 0xffffffff for "none"). */
static void special_ids(const ns_gguf *g, ns_model_config *cfg) {
    int64_t v;
    bool f;
    if (ns_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &v, &f, NULL) == NS_OK && f && v >= 0 && v < cfg->vocab_size)
        cfg->bos_token_id = (int32_t)v;
    const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                              "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof eos_keys / sizeof eos_keys[0]; i++) {
        if (ns_gguf_get_i64(g, eos_keys[i], &v, &f, NULL) != NS_OK || !f || v < 0 || v >= cfg->vocab_size) continue;
        if (ns_config_is_eos(cfg, (int32_t)v) || cfg->n_eos == NS_MAX_EOS) continue;
        cfg->eos_token_ids[cfg->n_eos++] = (int32_t)v;
    }
}

static ns_status rope_config(const ns_gguf *g, const char *arch, ns_model_config *cfg, ns_error *err) {
    cfg->rope_theta = 10000.0f;
    ns_status rc = arch_float(g, arch, "rope.freq_base", 1, 1e12, &cfg->rope_theta, err);
    if (rc != NS_OK) return rc;
    int32_t rot = cfg->head_dim;
    if ((rc = arch_int(g, arch, "rope.dimension_count", 2, 1 << 16, false, &rot, err)) != NS_OK) return rc;
    if (rot != cfg->head_dim)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "%s: partial rotary embedding (%d of %d dims) is not supported", g->path,
                       rot, cfg->head_dim);
    char key[128], *type = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((rc = ns_gguf_get_str_dup(g, key, &type, err)) != NS_OK) return rc;
    cfg->rope_type = NS_ROPE_DEFAULT;
    if (type && strcmp(type, "linear") == 0) {
        cfg->rope_type = NS_ROPE_LINEAR;
        cfg->rope_factor = 1;
        rc = arch_float(g, arch, "rope.scaling.factor", 1e-6, 1e6, &cfg->rope_factor, err);
    } else if (type && strcmp(type, "none") != 0) {
        rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: rope scaling \"%.64s\" is not supported (none, linear)", g->path,
                     ns_gguf_printable(type, strlen(type)) ? type : "?");
    }
    free(type);
    return rc;
}

/* qwen3moe: every layer is sparse (llama.cpp has no dense layers in this
 * architecture), softmax router, top-k weights renormalized. */
static ns_status moe_config(const ns_gguf *g, const char *arch, ns_model_config *cfg, ns_error *err) {
    ns_status rc;
    if ((rc = arch_int(g, arch, "expert_count", 1, 4096, true, &cfg->n_experts, err)) != NS_OK) return rc;
    if ((rc = arch_int(g, arch, "expert_used_count", 1, 4096, true, &cfg->n_experts_per_tok, err)) != NS_OK) return rc;
    if ((rc = arch_int(g, arch, "expert_feed_forward_length", 1, 1 << 20, true, &cfg->moe_intermediate_size, err)) !=
        NS_OK)
        return rc;
    if (cfg->n_experts_per_tok > cfg->n_experts)
        return ns_fail(err, NS_ERR_FORMAT, "%s: expert_used_count %d exceeds expert_count %d", g->path,
                       cfg->n_experts_per_tok, cfg->n_experts);
    cfg->decoder_sparse_step = 1;
    cfg->norm_topk_prob = true;
    if (cfg->intermediate_size == 0) cfg->intermediate_size = cfg->moe_intermediate_size;
    return NS_OK;
}

ns_status ns_gguf_config(const ns_gguf *g, ns_model_config *cfg, ns_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = -1;
    char *arch = NULL;
    ns_status rc = ns_gguf_get_str_dup(g, "general.architecture", &arch, err);
    if (rc != NS_OK) return rc;
    if (!arch) return ns_fail(err, NS_ERR_FORMAT, "%s: missing metadata \"general.architecture\"", g->path);
    if (strcmp(arch, "llama") == 0) {
        cfg->arch = NS_ARCH_LLAMA;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "LlamaForCausalLM");
    } else if (strcmp(arch, "qwen3") == 0) {
        cfg->arch = NS_ARCH_QWEN3;
        cfg->qk_norm = true;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "Qwen3ForCausalLM");
    } else if (strcmp(arch, "qwen2") == 0) {
        cfg->arch = NS_ARCH_QWEN2;
        cfg->attn_bias = true;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "Qwen2ForCausalLM");
    } else if (strcmp(arch, "qwen3moe") == 0) {
        cfg->arch = NS_ARCH_QWEN3_MOE;
        cfg->qk_norm = true;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "Qwen3MoeForCausalLM");
    } else {
        rc = ns_fail(err, NS_ERR_UNSUPPORTED,
                     "%s: GGUF architecture \"%.64s\" is not supported (llama, qwen2, qwen3, qwen3moe)", g->path,
                     ns_gguf_printable(arch, strlen(arch)) ? arch : "?");
        free(arch);
        return rc;
    }
#define TRY(x) do { if ((rc = (x)) != NS_OK) goto done; } while (0)
    TRY(arch_int(g, arch, "embedding_length", 1, 1 << 16, true, &cfg->hidden_size, err));
    const bool moe = cfg->arch == NS_ARCH_QWEN3_MOE;
    TRY(arch_int(g, arch, "feed_forward_length", 1, 1 << 20, !moe, &cfg->intermediate_size, err));
    if (moe) TRY(moe_config(g, arch, cfg, err));
    TRY(arch_int(g, arch, "block_count", 1, 1024, true, &cfg->n_layers, err));
    TRY(arch_int(g, arch, "attention.head_count", 1, 1024, true, &cfg->n_heads, err));
    cfg->n_kv_heads = cfg->n_heads;
    TRY(arch_int(g, arch, "attention.head_count_kv", 1, 1024, false, &cfg->n_kv_heads, err));
    if (cfg->n_heads % cfg->n_kv_heads) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", g->path,
                     cfg->n_heads, cfg->n_kv_heads);
        goto done;
    }
    cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    TRY(arch_int(g, arch, "attention.key_length", 2, 1024, false, &cfg->head_dim, err));
    int32_t vlen = cfg->head_dim;
    TRY(arch_int(g, arch, "attention.value_length", 2, 1024, false, &vlen, err));
    if (cfg->head_dim < 2 || cfg->head_dim % 2 || vlen != cfg->head_dim) {
        rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: head dims k=%d v=%d (must be equal, even and >= 2)", g->path,
                     cfg->head_dim, vlen);
        goto done;
    }
    cfg->max_position_embeddings = 2048;
    TRY(arch_int(g, arch, "context_length", 1, 1 << 24, false, &cfg->max_position_embeddings, err));
    cfg->rms_norm_eps = 1e-6f;
    TRY(arch_float(g, arch, "attention.layer_norm_rms_epsilon", 0, 1, &cfg->rms_norm_eps, err));
    TRY(rope_config(g, arch, cfg, err));
    /* vocab: the token list is authoritative; the embedding must match */
    const ns_gguf_kv *toks = ns_gguf_find(g, "tokenizer.ggml.tokens");
    if (toks && toks->type == NS_GGUF_ARRAY && toks->arr_n > 0 && toks->arr_n <= (1u << 24))
        cfg->vocab_size = (int32_t)toks->arr_n;
    TRY(arch_int(g, arch, "vocab_size", 1, 1 << 24, cfg->vocab_size == 0, &cfg->vocab_size, err));
    cfg->tie_word_embeddings = ns_gguf_find_tensor(g, "output.weight") == NULL;
    special_ids(g, cfg);
#undef TRY
done:
    free(arch);
    return rc;
}

/* ----------------------------------------------------------- binding */

typedef struct {
    ns_model *m;
    struct ns_gguf_model *gm;
    ns_error *err;
} bind_ctx;

static bool ggml_to_ns(uint32_t t, ns_dtype *dt) {
    switch (t) {
    case NS_GGML_F32: *dt = NS_DT_F32; return true;
    case NS_GGML_F16: *dt = NS_DT_F16; return true;
    case NS_GGML_BF16: *dt = NS_DT_BF16; return true;
    case NS_GGML_Q8_0: *dt = NS_DT_Q8_0; return true;
    case NS_GGML_Q4_0: *dt = NS_DT_Q4_0; return true;
    case NS_GGML_Q4_K: *dt = NS_DT_Q4_K; return true;
    case NS_GGML_Q5_K: *dt = NS_DT_Q5_K; return true;
    case NS_GGML_Q6_K: *dt = NS_DT_Q6_K; return true;
    case NS_GGML_Q4_1: *dt = NS_DT_Q4_1; return true;
    case NS_GGML_Q5_0: *dt = NS_DT_Q5_0; return true;
    case NS_GGML_Q5_1: *dt = NS_DT_Q5_1; return true;
    default: return false;
    }
}

static void mark_used(bind_ctx *b, const ns_gguf_tensor *t) {
    const ns_gguf_set *s = b->gm->set;
    size_t base = 0;
    for (int i = 0; i < s->n; i++) {
        const ns_gguf *g = s->files[i];
        if (t >= g->tensors && t < g->tensors + g->n_tensors) {
            b->gm->used[base + (size_t)(t - g->tensors)] = true;
            return;
        }
        base += g->n_tensors;
    }
}

/* Rows of a llama q/k matrix back in Hugging Face order: within each head
 * of D rows, GGUF row 2i+s holds HF row s*D/2 + i. Returns a malloc'd
 * copy (recorded in gm->owned). */
static ns_status unpermute(bind_ctx *b, const ns_gguf_tensor *t, ns_dtype dt, int64_t rows, int64_t cols, int n_heads,
                           const void **src) {
    const size_t rb = ns_dtype_row_bytes(dt, cols);
    const int64_t D = rows / n_heads;
    if (D * n_heads != rows || D % 2)
        return ns_fail(b->err, NS_ERR_FORMAT, "gguf: tensor %.*s: %lld rows do not split into %d heads", (int)t->name_len,
                       t->name, (long long)rows, n_heads);
    void **owned = realloc(b->gm->owned, (size_t)(b->gm->n_owned + 1) * sizeof *owned);
    if (!owned) return ns_fail(b->err, NS_ERR_NOMEM, "out of memory");
    b->gm->owned = owned;
    uint8_t *dst = aligned_alloc(64, ((size_t)rows * rb + 63) / 64 * 64);
    if (!dst) return ns_fail(b->err, NS_ERR_NOMEM, "out of memory");
    owned[b->gm->n_owned++] = dst;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < D / 2; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(dst + (size_t)(h * D + s * (D / 2) + i) * rb, t->data + (size_t)(h * D + 2 * i + s) * rb, rb);
    *src = dst;
    return NS_OK;
}

/* Binds GGUF tensor name as rows x cols (rows 1: a vector) onto out.
 * perm_heads > 0: un-permute llama q/k rows over that many heads. */
static ns_status gbind(bind_ctx *b, const char *name, int64_t rows, int64_t cols, ns_tensor *out, int perm_heads) {
    const ns_gguf_tensor *t = ns_gguf_set_find(b->gm->set, name);
    if (!t) return ns_fail(b->err, NS_ERR_FORMAT, "gguf: missing tensor \"%s\"", name);
    bool ok = rows == 1 ? (t->n_dims == 1 && t->ne[0] == cols)
                        : (t->n_dims == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (!ok)
        return ns_fail(b->err, NS_ERR_FORMAT,
                       "gguf: tensor \"%s\" has shape [%lld, %lld, %lld, %lld] (%u dims), expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], t->n_dims,
                       (long long)cols, (long long)rows);
    ns_dtype dt;
    if (!ggml_to_ns(t->type, &dt))
        return ns_fail(b->err, NS_ERR_UNSUPPORTED,
                       "gguf: tensor \"%s\" is %s (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K)", name,
                       ns_ggml_type_name(t->type));
    if (rows == 1 && ns_dtype_is_quant(dt))
        return ns_fail(b->err, NS_ERR_UNSUPPORTED, "gguf: vector \"%s\" is quantized (%s)", name,
                       ns_ggml_type_name(t->type));
    mark_used(b, t);
    ns_backend *be = b->m->be;
    if (!be) return NS_OK;
    /* CUDA keeps quantized dense matrices as blocks (cuda_quant.cu); its
     * moe_ffn reads a BF16 router (llama-quantize never quantizes one) */
    if (ns_dtype_is_quant(dt) && strcmp(be->ops->name, "cpu") != 0 && strcmp(be->ops->name, "cuda") != 0)
        return ns_fail(b->err, NS_ERR_UNSUPPORTED, "gguf: %s weights are supported on the CPU backend only (not %s)",
                       ns_ggml_type_name(t->type), be->ops->name);
    if (ns_dtype_is_quant(dt) && strcmp(be->ops->name, "cuda") == 0 && strstr(name, "ffn_gate_inp"))
        return ns_fail(b->err, NS_ERR_UNSUPPORTED,
                       "gguf: router \"%s\" is %s: the cuda device's MoE router is BF16 (use --device cpu)", name,
                       ns_ggml_type_name(t->type));
    const void *src = t->data;
    if (perm_heads > 0) {
        ns_status rc = unpermute(b, t, dt, rows, cols, perm_heads, &src);
        if (rc != NS_OK) return rc;
    }
    ns_status rc = be->ops->weight_from_host(be, out, src, dt, rows, cols, b->err);
    if (rc == NS_OK) b->m->weight_bytes += ns_tensor_bytes(out);
    return rc;
}

/* Expert e of a 3-D expert tensor (ggml ne = [cols, rows, n_experts]). */
static ns_status bind_expert_stack(bind_ctx *b, const char *name, int64_t rows, int64_t cols, ns_tensor *out) {
    const int64_t E = b->m->cfg.n_experts;
    const ns_gguf_tensor *t = ns_gguf_set_find(b->gm->set, name);
    if (!t) return ns_fail(b->err, NS_ERR_FORMAT, "gguf: missing tensor \"%s\"", name);
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != E)
        return ns_fail(b->err, NS_ERR_FORMAT, "gguf: tensor \"%s\" has shape [%lld, %lld, %lld] (%u dims), expected [%lld, %lld, %lld]",
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], t->n_dims, (long long)cols,
                       (long long)rows, (long long)E);
    ns_dtype dt;
    if (!ggml_to_ns(t->type, &dt))
        return ns_fail(b->err, NS_ERR_UNSUPPORTED, "gguf: tensor \"%s\" is %s", name, ns_ggml_type_name(t->type));
    mark_used(b, t);
    ns_backend *be = b->m->be;
    if (!be) return NS_OK;
    /* the CPU and CUDA backends run block-quantized experts (CUDA: see
     * check_cuda_experts) */
    if (ns_dtype_is_quant(dt) && strcmp(be->ops->name, "cpu") != 0 && strcmp(be->ops->name, "cuda") != 0)
        return ns_fail(b->err, NS_ERR_UNSUPPORTED, "gguf: %s weights are supported on the CPU and CUDA backends only (not %s)",
                       ns_ggml_type_name(t->type), be->ops->name);
    const size_t slice = (size_t)rows * ns_dtype_row_bytes(dt, cols);
    for (int64_t e = 0; e < E; e++) {
        ns_status rc = be->ops->weight_from_host(be, &out[e], t->data + (size_t)e * slice, dt, rows, cols, b->err);
        if (rc != NS_OK) return rc;
        b->m->weight_bytes += ns_tensor_bytes(&out[e]);
    }
    return NS_OK;
}

/* CUDA's moe_ffn (cuda_moe.cu) takes BF16 experts (F16/F32 files are
 * converted at upload) or block-quantized ones whose gate and up stacks
 * share one type and whose down stack is quantized too (any block type).
 * Anything else is refused here, at load, naming the tensors, rather than
 * at the first forward. */
static ns_status check_cuda_experts(bind_ctx *b, int32_t l) {
    if (!b->m->be || strcmp(b->m->be->ops->name, "cuda") != 0) return NS_OK;
    static const char *const sfx[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    uint32_t ty[3];
    bool q[3];
    for (int i = 0; i < 3; i++) {
        char name[128];
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, sfx[i]);
        const ns_gguf_tensor *t = ns_gguf_set_find(b->gm->set, name);
        if (!t) return NS_OK; /* bind_expert_stack names the missing tensor */
        ns_dtype dt;
        ty[i] = t->type;
        q[i] = ggml_to_ns(t->type, &dt) && ns_dtype_is_quant(dt);
    }
    if (q[0] != q[1] || q[0] != q[2] || (q[0] && ty[0] != ty[1]))
        return ns_fail(b->err, NS_ERR_UNSUPPORTED,
                       "gguf: blk.%d.ffn_gate_exps (%s), ffn_up_exps (%s), ffn_down_exps (%s): the cuda device runs"
                       " quantized experts only with gate and up of one type and down quantized too (use --device cpu)",
                       l, ns_ggml_type_name(ty[0]), ns_ggml_type_name(ty[1]), ns_ggml_type_name(ty[2]));
    return NS_OK;
}

/* Router and experts of MoE layer l (blk.l.ffn_{gate_inp,gate_exps,up_exps,down_exps}). */
static ns_status bind_moe(bind_ctx *b, int32_t l) {
    const ns_model_config *c = &b->m->cfg;
    ns_layer_weights *w = &b->m->layers[l];
    const int64_t H = c->hidden_size, mff = c->moe_intermediate_size, E = c->n_experts;
    w->experts = calloc((size_t)(3 * E), sizeof *w->experts);
    if (!w->experts) return ns_fail(b->err, NS_ERR_NOMEM, "out of memory");
    char name[128];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
    ns_status rc = check_cuda_experts(b, l);
    if (rc == NS_OK) rc = gbind(b, name, E, H, &w->router, 0);
    snprintf(name, sizeof name, "blk.%d.ffn_gate_exps.weight", l);
    if (rc == NS_OK) rc = bind_expert_stack(b, name, mff, H, w->experts);
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
    if (rc == NS_OK) rc = bind_expert_stack(b, name, mff, H, w->experts + E);
    snprintf(name, sizeof name, "blk.%d.ffn_down_exps.weight", l);
    if (rc == NS_OK) rc = bind_expert_stack(b, name, H, mff, w->experts + 2 * E);
    return rc;
}

static ns_status bind_layers(bind_ctx *b) {
    const ns_model_config *c = &b->m->cfg;
    const int64_t H = c->hidden_size, q_dim = (int64_t)c->n_heads * c->head_dim,
                  kv_dim = (int64_t)c->n_kv_heads * c->head_dim, ff = c->intermediate_size;
    const bool llama = c->arch == NS_ARCH_LLAMA;
    char name[128];
    for (int32_t l = 0; l < c->n_layers; l++) {
        ns_layer_weights *w = &b->m->layers[l];
        struct {
            const char *suffix;
            int64_t rows, cols;
            ns_tensor *t;
            int perm;
        } items[] = {
            {"attn_norm.weight", 1, H, &w->attn_norm, 0},
            {"attn_q.weight", q_dim, H, &w->wq, llama ? c->n_heads : 0},
            {"attn_k.weight", kv_dim, H, &w->wk, llama ? c->n_kv_heads : 0},
            {"attn_v.weight", kv_dim, H, &w->wv, 0},
            {"attn_output.weight", H, q_dim, &w->wo, 0},
            {"ffn_norm.weight", 1, H, &w->ffn_norm, 0},
            {"ffn_gate.weight", ff, H, &w->w_gate, 0},
            {"ffn_up.weight", ff, H, &w->w_up, 0},
            {"ffn_down.weight", H, ff, &w->w_down, 0},
            {"attn_q_norm.weight", 1, c->head_dim, &w->q_norm, 0},
            {"attn_k_norm.weight", 1, c->head_dim, &w->k_norm, 0},
            {"attn_q.bias", 1, q_dim, &w->bq, 0},
            {"attn_k.bias", 1, kv_dim, &w->bk, 0},
            {"attn_v.bias", 1, kv_dim, &w->bv, 0},
        };
        const bool moe = ns_config_layer_is_moe(c, l);
        for (int i = 0; i < 14; i++) {
            if (moe && i >= 6 && i <= 8) continue;     /* the experts replace the dense MLP */
            if (!c->qk_norm && (i == 9 || i == 10)) continue;
            if (!c->attn_bias && i >= 11) continue;
            snprintf(name, sizeof name, "blk.%d.%s", l, items[i].suffix);
            ns_status rc = gbind(b, name, items[i].rows, items[i].cols, items[i].t, items[i].perm);
            if (rc != NS_OK) return rc;
        }
        if (moe) {
            ns_status rc = bind_moe(b, l);
            if (rc != NS_OK) return rc;
        }
    }
    return NS_OK;
}

/* llama3-style GGUFs carry the RoPE frequency factors as a tensor;
 * inv_freq[i] = theta^(-2i/d) / factor[i] (llama.cpp's freq_factors). */
static ns_status rope_factors(bind_ctx *b, float *inv) {
    const ns_gguf_tensor *t = ns_gguf_set_find(b->gm->set, "rope_freqs.weight");
    if (!t) return NS_OK;
    const int half = b->m->cfg.head_dim / 2;
    if (t->type != NS_GGML_F32 || t->n_dims != 1 || t->ne[0] != half)
        return ns_fail(b->err, NS_ERR_FORMAT, "gguf: rope_freqs.weight must be F32 [%d]", half);
    mark_used(b, t);
    for (int i = 0; i < half; i++) {
        float f;
        memcpy(&f, t->data + (size_t)i * 4, 4);
        if (!(f > 0 && isfinite(f))) return ns_fail(b->err, NS_ERR_FORMAT, "gguf: rope_freqs.weight[%d] = %g", i, f);
        inv[i] /= f;
    }
    return NS_OK;
}

static ns_status bind_all(bind_ctx *b) {
    ns_model *m = b->m;
    const ns_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    ns_status rc = gbind(b, "token_embd.weight", V, H, &m->embed, 0);
    if (rc != NS_OK) return rc;
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        m->lm_head.alloc = NULL;
        m->lm_head_tied = true;
    } else if ((rc = gbind(b, "output.weight", V, H, &m->lm_head, 0)) != NS_OK) {
        return rc;
    }
    if ((rc = gbind(b, "output_norm.weight", 1, H, &m->final_norm, 0)) != NS_OK) return rc;
    if ((rc = bind_layers(b)) != NS_OK) return rc;
    float *inv = malloc((size_t)(c->head_dim / 2) * sizeof *inv);
    if (!inv) return ns_fail(b->err, NS_ERR_NOMEM, "out of memory");
    ns_rope_inv_freq(c, inv);
    rc = rope_factors(b, inv);
    if (rc == NS_OK && m->be) {
        rc = m->be->ops->tensor_alloc(m->be, &m->rope_inv_freq, NS_DT_F32, 1, c->head_dim / 2, b->err);
        if (rc == NS_OK) rc = m->be->ops->tensor_upload(m->be, &m->rope_inv_freq, inv, b->err);
    }
    free(inv);
    if (rc != NS_OK) return rc;
    size_t k = 0;
    for (int i = 0; i < b->gm->set->n; i++)
        for (uint64_t t = 0; t < b->gm->set->files[i]->n_tensors; t++, k++)
            if (!b->gm->used[k]) {
                const ns_gguf_tensor *x = &b->gm->set->files[i]->tensors[t];
                return ns_fail(b->err, NS_ERR_FORMAT, "gguf: unexpected tensor \"%.*s\" (not used by %s)",
                               (int)(x->name_len < 100 ? x->name_len : 100), x->name, c->arch_name);
            }
    return NS_OK;
}

/* Weights identity: each shard's header (tensor names, shapes, types: the
 * quantization), its size and 16 sampled 4 KiB windows of its data. */
static uint64_t fingerprint(const ns_gguf_set *s, const ns_model_config *c) {
    XXH64_state_t *st = XXH64_createState();
    if (!st) return 0;
    XXH64_reset(st, 0x67677566ULL);
    for (int i = 0; i < s->n; i++) {
        const ns_gguf *g = s->files[i];
        size_t hdr = g->data_off < ((size_t)1 << 24) ? (size_t)g->data_off : ((size_t)1 << 24);
        XXH64_update(st, g->base, hdr);
        uint64_t sz = g->size;
        XXH64_update(st, &sz, sizeof sz);
        for (int k = 0; k < 16; k++) {
            size_t off = (size_t)((g->size / 16) * (uint64_t)k), len = g->size - off < 4096 ? g->size - off : 4096;
            XXH64_update(st, g->base + off, len);
        }
        for (uint64_t t = 0; t < g->n_tensors; t++) XXH64_update(st, &g->tensors[t].type, sizeof g->tensors[t].type);
    }
    uint64_t parts[2] = {(uint64_t)c->n_layers, (uint64_t)c->head_dim};
    XXH64_update(st, parts, sizeof parts);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

static ns_status open_model(const char *path, ns_model *m, ns_error *err) {
    struct ns_gguf_model *gm = calloc(1, sizeof *gm);
    if (!gm) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    m->gguf = gm;
    char *first = NULL;
    if (!ns_gguf_model_path(path, &first, err)) {
        if (err && err->status != NS_OK && err->msg[0]) return err->status;
        return ns_fail(err, NS_ERR_IO, "%s: not a GGUF model", path);
    }
    ns_status rc = ns_gguf_set_open(first, &gm->set, err);
    free(first);
    if (rc != NS_OK) return rc;
    if ((rc = ns_gguf_config(gm->set->files[0], &m->cfg, err)) != NS_OK) return rc;
    size_t n = 0;
    for (int i = 0; i < gm->set->n; i++) n += gm->set->files[i]->n_tensors;
    gm->used = calloc(n + 1, sizeof *gm->used);
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!gm->used || !m->layers) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    m->dir = strdup(path);
    if (!m->dir) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    if (m->be && (rc = ns_model_check_backend(&m->cfg, m->be, err)) != NS_OK) return rc;
    bind_ctx b = {m, gm, err};
    rc = bind_all(&b);
    if (rc == NS_OK) m->fingerprint = fingerprint(gm->set, &m->cfg);
    return rc;
}

ns_status ns_gguf_model_load(const char *path, ns_backend *be, ns_model **out, ns_error *err) {
    *out = NULL;
    ns_model *m = calloc(1, sizeof *m);
    if (!m) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    m->be = be;
    if (err) err->status = NS_OK;
    ns_status rc = open_model(path, m, err);
    if (rc != NS_OK) {
        ns_model_free(m);
        return rc;
    }
    *out = m;
    return NS_OK;
}

ns_status ns_gguf_model_validate(const char *path, ns_model_config *cfg, ns_error *err) {
    ns_model *m = calloc(1, sizeof *m);
    if (!m) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    if (err) err->status = NS_OK;
    ns_status rc = open_model(path, m, err);
    if (rc == NS_OK && cfg) *cfg = m->cfg;
    ns_model_free(m); /* no backend: no tensors to free */
    return rc;
}

void ns_gguf_model_release(struct ns_gguf_model *gm) {
    if (!gm) return;
    for (int i = 0; i < gm->n_owned; i++) free(gm->owned[i]);
    free(gm->owned);
    free(gm->used);
    ns_gguf_set_close(gm->set);
    free(gm);
}
