/* model.c — binds safetensors tensors (or random weights) to ns_model.
 *
 * Name mapping is the Hugging Face one for LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases), Qwen3ForCausalLM and
 * Qwen3MoeForCausalLM (mlp.gate router, mlp.experts.E.{gate,up,down}_proj
 * on the sparse layers). Every expected tensor must exist with the exact shape
 * implied by the config; any tensor left over is an error too, because a
 * silently ignored tensor (a bias, a different norm) means wrong outputs.
 */
#include "model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xxhash.h>

#include "model/gguf_model.h"
#include "model/safetensors.h"
#include "util/log.h"

static ns_status bind(ns_model *m, ns_safetensors *st, const char *name, int64_t rows, int64_t cols,
                      ns_tensor *out, ns_error *err) {
    ns_st_tensor *t = ns_safetensors_find(st, name);
    if (!t) return ns_fail(err, NS_ERR_FORMAT, "model: missing tensor \"%s\"", name);
    bool ok = (cols == 0) ? false
              : (rows == 1) ? (t->n_dims == 1 && t->shape[0] == cols)
                            : (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!ok) {
        char got[96] = "";
        int o = 0;
        for (int32_t i = 0; i < t->n_dims && o < 80; i++)
            o += snprintf(got + o, sizeof got - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (rows == 1)
            return ns_fail(err, NS_ERR_FORMAT, "model: tensor \"%s\" has shape [%s], expected [%lld]", name, got,
                           (long long)cols);
        return ns_fail(err, NS_ERR_FORMAT, "model: tensor \"%s\" has shape [%s], expected [%lld, %lld]", name, got,
                       (long long)rows, (long long)cols);
    }
    t->used = true;
    if (!m->be) return NS_OK; /* validation only: names and shapes, no data */
    ns_status rc = m->be->ops->weight_from_host(m->be, out, t->data, t->dtype, rows, cols, err);
    if (rc == NS_OK) m->weight_bytes += ns_tensor_bytes(out);
    return rc;
}

static ns_status setup_common(ns_model *m, ns_error *err) {
    const ns_model_config *c = &m->cfg;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    float *inv = malloc((size_t)(c->head_dim / 2) * sizeof *inv);
    if (!inv) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_rope_inv_freq(c, inv);
    ns_status rc = m->be->ops->tensor_alloc(m->be, &m->rope_inv_freq, NS_DT_F32, 1, c->head_dim / 2, err);
    if (rc == NS_OK) rc = m->be->ops->tensor_upload(m->be, &m->rope_inv_freq, inv, err);
    free(inv);
    return rc;
}

typedef struct {
    const char *suffix;
    int64_t rows, cols;
    ns_tensor *t;
} bind_item;

static ns_status bind_items(ns_model *m, ns_safetensors *st, int32_t l, const bind_item *items, int n, ns_error *err) {
    char name[256];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", l, items[i].suffix);
        ns_status rc = bind(m, st, name, items[i].rows, items[i].cols, items[i].t, err);
        if (rc != NS_OK) return rc;
    }
    return NS_OK;
}

/* The router and every expert of MoE layer l. */
static ns_status bind_experts(ns_model *m, ns_safetensors *st, int32_t l, ns_error *err) {
    const ns_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, mff = c->moe_intermediate_size, E = c->n_experts;
    ns_layer_weights *w = &m->layers[l];
    w->experts = calloc((size_t)(3 * E), sizeof *w->experts);
    if (!w->experts) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    bind_item router = {"mlp.gate.weight", E, H, &w->router};
    ns_status rc = bind_items(m, st, l, &router, 1, err);
    char sfx[3][96];
    for (int64_t e = 0; e < E && rc == NS_OK; e++) {
        snprintf(sfx[0], sizeof sfx[0], "mlp.experts.%lld.gate_proj.weight", (long long)e);
        snprintf(sfx[1], sizeof sfx[1], "mlp.experts.%lld.up_proj.weight", (long long)e);
        snprintf(sfx[2], sizeof sfx[2], "mlp.experts.%lld.down_proj.weight", (long long)e);
        bind_item it[] = {{sfx[0], mff, H, &w->experts[e]},
                          {sfx[1], mff, H, &w->experts[E + e]},
                          {sfx[2], H, mff, &w->experts[2 * E + e]}};
        rc = bind_items(m, st, l, it, 3, err);
    }
    return rc;
}

static ns_status bind_layer(ns_model *m, ns_safetensors *st, int32_t l, ns_error *err) {
    const ns_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, q_dim = (int64_t)c->n_heads * c->head_dim,
                  kv_dim = (int64_t)c->n_kv_heads * c->head_dim, ff = c->intermediate_size;
    ns_layer_weights *w = &m->layers[l];
    const bind_item attn[] = {
        {"input_layernorm.weight", 1, H, &w->attn_norm},
        {"self_attn.q_proj.weight", q_dim, H, &w->wq},
        {"self_attn.k_proj.weight", kv_dim, H, &w->wk},
        {"self_attn.v_proj.weight", kv_dim, H, &w->wv},
        {"self_attn.o_proj.weight", H, q_dim, &w->wo},
        {"post_attention_layernorm.weight", 1, H, &w->ffn_norm},
    };
    const bind_item qk_norm[] = {
        {"self_attn.q_norm.weight", 1, c->head_dim, &w->q_norm},
        {"self_attn.k_norm.weight", 1, c->head_dim, &w->k_norm},
    };
    const bind_item bias[] = {
        {"self_attn.q_proj.bias", 1, q_dim, &w->bq},
        {"self_attn.k_proj.bias", 1, kv_dim, &w->bk},
        {"self_attn.v_proj.bias", 1, kv_dim, &w->bv},
    };
    const bind_item mlp[] = {
        {"mlp.gate_proj.weight", ff, H, &w->w_gate},
        {"mlp.up_proj.weight", ff, H, &w->w_up},
        {"mlp.down_proj.weight", H, ff, &w->w_down},
    };
    ns_status rc = bind_items(m, st, l, attn, 6, err);
    if (rc == NS_OK && c->qk_norm) rc = bind_items(m, st, l, qk_norm, 2, err);
    if (rc == NS_OK && c->attn_bias) rc = bind_items(m, st, l, bias, 3, err);
    if (rc != NS_OK) return rc;
    return ns_config_layer_is_moe(c, l) ? bind_experts(m, st, l, err) : bind_items(m, st, l, mlp, 3, err);
}

/* Binds every tensor the architecture needs from st to m, checking names
 * and shapes, and rejects tensors left over. With m->be NULL nothing is
 * uploaded: ns_model_validate_dir runs exactly the loader's checks. */
static ns_status bind_all(ns_model *m, ns_safetensors *st, ns_error *err) {
    const ns_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, V = c->vocab_size;
    ns_status rc;

    /* Tied embeddings may be stored under either name (tinystories-656k
     * keeps only lm_head.weight); untied models need both. */
    bool has_embed = ns_safetensors_find(st, "model.embed_tokens.weight") != NULL;
    bool has_head = ns_safetensors_find(st, "lm_head.weight") != NULL;
    if (!has_embed && !has_head) return ns_fail(err, NS_ERR_FORMAT, "model: missing tensor \"model.embed_tokens.weight\"");
    if (!c->tie_word_embeddings && (!has_embed || !has_head))
        return ns_fail(err, NS_ERR_FORMAT, "model: missing tensor \"%s\" (tie_word_embeddings is false)",
                       has_embed ? "lm_head.weight" : "model.embed_tokens.weight");
    rc = bind(m, st, has_embed ? "model.embed_tokens.weight" : "lm_head.weight", V, H, &m->embed, err);
    if (rc != NS_OK) return rc;
    if (has_embed && has_head) {
        rc = bind(m, st, "lm_head.weight", V, H, &m->lm_head, err);
        if (rc != NS_OK) return rc;
    } else {
        m->lm_head = m->embed;
        m->lm_head.alloc = NULL; /* alias: freed through embed */
        m->lm_head_tied = true;
    }
    rc = bind(m, st, "model.norm.weight", 1, H, &m->final_norm, err);
    if (rc != NS_OK) return rc;
    for (int32_t l = 0; l < c->n_layers; l++) {
        rc = bind_layer(m, st, l, err);
        if (rc != NS_OK) return rc;
    }
    for (int32_t i = 0; i < st->n_tensors; i++) {
        const ns_st_tensor *t = &st->tensors[i];
        if (t->used) continue;
        /* Older exports carry the RoPE table as a buffer: derived, harmless. */
        if (strstr(t->name, "rotary_emb.inv_freq")) continue;
        return ns_fail(err, NS_ERR_FORMAT, "model: unexpected tensor \"%s\" (not used by %s)", t->name, c->arch_name);
    }
    return NS_OK;
}

ns_status ns_model_check_backend(const ns_model_config *cfg, const ns_backend *be, ns_error *err) {
    if (cfg->attn_bias && !be->ops->add_bias)
        return ns_fail(err, NS_ERR_UNSUPPORTED,
                       "model: the %s backend cannot run %s yet (no add_bias op for its attention biases); "
                       "use the cpu device",
                       be->ops->name, cfg->arch_name);
    if (cfg->n_experts > 0 && !be->ops->moe_ffn)
        return ns_fail(err, NS_ERR_UNSUPPORTED,
                       "model: the %s backend cannot run %s yet (no moe_ffn op for its experts); use the cpu device",
                       be->ops->name, cfg->arch_name);
    return NS_OK;
}

ns_status ns_model_load(const char *dir, ns_backend *be, ns_model **out, ns_error *err) {
    *out = NULL;
    char *gguf = NULL;
    if (ns_gguf_model_path(dir, &gguf, err)) {
        free(gguf);
        return ns_gguf_model_load(dir, be, out, err);
    }
    ns_model *m = calloc(1, sizeof *m);
    if (!m) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    m->be = be;
    ns_status rc = ns_config_load(dir, &m->cfg, err);
    if (rc == NS_OK) rc = ns_model_check_backend(&m->cfg, be, err);
    if (rc != NS_OK) goto fail;
    if (m->cfg.sliding_window)
        NS_INFO("model: sliding_window %d: the context is limited to %d tokens (within the window, attention is "
                "full causal attention)", m->cfg.sliding_window, m->cfg.max_position_embeddings);
    m->dir = strdup(dir);
    if (!m->dir) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    rc = ns_safetensors_open_dir(dir, &m->files, err);
    if (rc != NS_OK) goto fail;
    rc = setup_common(m, err);
    if (rc != NS_OK) goto fail;
    rc = bind_all(m, m->files, err);
    if (rc != NS_OK) goto fail;
    const ns_model_config *c = &m->cfg;
    /* Fingerprint: weights identity plus the config that shapes the KV. */
    uint64_t parts[3] = {ns_safetensors_fingerprint(m->files), (uint64_t)c->n_layers, (uint64_t)c->head_dim};
    m->fingerprint = XXH64(parts, sizeof parts, 0x6e6967687473ULL);
    *out = m;
    return NS_OK;
fail:
    ns_model_free(m);
    return rc;
}

ns_status ns_model_validate_dir(const char *dir, ns_model_config *cfg, ns_error *err) {
    char *gguf = NULL;
    if (ns_gguf_model_path(dir, &gguf, err)) {
        free(gguf);
        return ns_gguf_model_validate(dir, cfg, err);
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) return ns_fail(err, NS_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ns_fail(err, NS_ERR_IO, "%s: not a directory", dir);
    /* A model with no backend: bind_all then checks without uploading,
     * and ns_model_free has no tensors to free. */
    ns_model m;
    memset(&m, 0, sizeof m);
    ns_safetensors *st = NULL;
    ns_status rc = ns_config_load(dir, &m.cfg, err);
    if (rc != NS_OK) goto cleanup;
    rc = ns_safetensors_open_dir(dir, &st, err);
    if (rc != NS_OK) goto cleanup;
    m.layers = calloc((size_t)m.cfg.n_layers, sizeof *m.layers);
    if (!m.layers) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    rc = bind_all(&m, st, err);
    if (rc == NS_OK && cfg) *cfg = m.cfg;
cleanup:
    for (int32_t l = 0; m.layers && l < m.cfg.n_layers; l++) free(m.layers[l].experts);
    free(m.layers);
    ns_safetensors_close(st);
    return rc;
}

ns_status ns_model_create_random(const ns_model_config *cfg, ns_backend *be, ns_dtype dt, uint64_t seed,
                                 ns_model **out, ns_error *err) {
    *out = NULL;
    ns_model *m = calloc(1, sizeof *m);
    if (!m) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    m->be = be;
    m->cfg = *cfg;
    m->dummy = true;
    ns_status rc = ns_model_check_backend(cfg, be, err);
    if (rc == NS_OK) rc = setup_common(m, err);
    if (rc != NS_OK) goto fail;
    const ns_model_config *c = &m->cfg;
    const int64_t H = c->hidden_size, q_dim = (int64_t)c->n_heads * c->head_dim,
                  kv_dim = (int64_t)c->n_kv_heads * c->head_dim, ff = c->intermediate_size, V = c->vocab_size;
    uint64_t s = seed * 1000003ULL + 17;
#define RAND(t, r, cc, sc)                                                                 \
    do {                                                                                   \
        rc = be->ops->weight_random(be, (t), dt, (r), (cc), s++, (float)(sc), err);        \
        if (rc != NS_OK) goto fail;                                                        \
        m->weight_bytes += ns_tensor_bytes(t);                                             \
    } while (0)
    /* Scales keep every layer's activations O(1): projections use
     * 1/sqrt(fan_in); norm weights are uniform in [-1, 1). The values only
     * have to be finite and deterministic: dummy models exist to measure
     * speed, never quality. */
    const double ws = 1.0 / sqrt((double)H), fs = 1.0 / sqrt((double)ff), os = 1.0 / sqrt((double)q_dim);
    RAND(&m->embed, V, H, 1.0);
    RAND(&m->final_norm, 1, H, 1.0);
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
        m->lm_head.alloc = NULL;
        m->lm_head_tied = true;
    } else {
        RAND(&m->lm_head, V, H, ws);
    }
    for (int32_t l = 0; l < c->n_layers; l++) {
        ns_layer_weights *w = &m->layers[l];
        RAND(&w->attn_norm, 1, H, 1.0);
        RAND(&w->wq, q_dim, H, ws);
        RAND(&w->wk, kv_dim, H, ws);
        RAND(&w->wv, kv_dim, H, ws);
        RAND(&w->wo, H, q_dim, os);
        RAND(&w->ffn_norm, 1, H, 1.0);
        if (c->attn_bias) {
            RAND(&w->bq, 1, q_dim, 0.1);
            RAND(&w->bk, 1, kv_dim, 0.1);
            RAND(&w->bv, 1, kv_dim, 0.1);
        }
        if (ns_config_layer_is_moe(c, l)) {
            const int64_t E = c->n_experts, mff = c->moe_intermediate_size;
            w->experts = calloc((size_t)(3 * E), sizeof *w->experts);
            if (!w->experts) {
                rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
                goto fail;
            }
            /* the router stays BF16 in quantized models, as llama-quantize
             * leaves it unquantized (and the CUDA router reads BF16) */
            rc = be->ops->weight_random(be, &w->router, ns_dtype_is_quant(dt) ? NS_DT_BF16 : dt, E, H, s++,
                                        (float)ws, err);
            if (rc != NS_OK) goto fail;
            m->weight_bytes += ns_tensor_bytes(&w->router);
            for (int64_t e = 0; e < E; e++) {
                RAND(&w->experts[e], mff, H, ws);
                RAND(&w->experts[E + e], mff, H, ws);
                RAND(&w->experts[2 * E + e], H, mff, 1.0 / sqrt((double)mff));
            }
        } else {
            RAND(&w->w_gate, ff, H, ws);
            RAND(&w->w_up, ff, H, ws);
            RAND(&w->w_down, H, ff, fs);
        }
        if (c->qk_norm) {
            RAND(&w->q_norm, 1, c->head_dim, 1.0);
            RAND(&w->k_norm, 1, c->head_dim, 1.0);
        }
    }
#undef RAND
    uint64_t parts[4] = {0x64756d6d79ULL, seed, (uint64_t)c->n_layers, (uint64_t)c->hidden_size};
    m->fingerprint = XXH64(parts, sizeof parts, 0);
    *out = m;
    return NS_OK;
fail:
    ns_model_free(m);
    return rc;
}

void ns_model_free(ns_model *m) {
    if (!m) return;
    ns_backend *be = m->be;
    if (m->layers) {
        for (int32_t l = 0; l < m->cfg.n_layers; l++) {
            ns_layer_weights *w = &m->layers[l];
            ns_tensor *ts[] = {&w->attn_norm, &w->wq, &w->wk,     &w->wv,     &w->wo, &w->q_norm, &w->k_norm,
                               &w->ffn_norm,  &w->w_gate, &w->w_up, &w->w_down, &w->bq, &w->bk,     &w->bv,
                               &w->router};
            for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
                if (ts[i]->data) be->ops->tensor_free(be, ts[i]);
            for (int32_t i = 0; w->experts && i < 3 * m->cfg.n_experts; i++)
                if (w->experts[i].data) be->ops->tensor_free(be, &w->experts[i]);
            free(w->experts);
        }
        free(m->layers);
    }
    if (m->embed.data) be->ops->tensor_free(be, &m->embed);
    if (!m->lm_head_tied && m->lm_head.data) be->ops->tensor_free(be, &m->lm_head);
    if (m->final_norm.data) be->ops->tensor_free(be, &m->final_norm);
    if (m->rope_inv_freq.data) be->ops->tensor_free(be, &m->rope_inv_freq);
    ns_safetensors_close(m->files);
    ns_gguf_model_release(m->gguf); /* after the tensors that borrow its maps */
    free(m->dir);
    free(m);
}
