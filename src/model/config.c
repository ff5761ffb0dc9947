/* config.c — config.json / generation_config.json -> ns_model_config.
 * Every field is type- and range-checked: a config is untrusted input and a
 * wrong value here would become an out-of-bounds access in the forward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/file.h"

#define CONFIG_MAX_BYTES (4u << 20)

static ns_status get_int(const json_t *o, const char *key, int32_t lo, int32_t hi, bool required, int32_t *out,
                         ns_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return ns_fail(err, NS_ERR_FORMAT, "config.json: missing \"%s\"", key);
        return NS_OK;
    }
    if (!json_is_integer(v)) return ns_fail(err, NS_ERR_FORMAT, "config.json: \"%s\" must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ns_fail(err, NS_ERR_FORMAT, "config.json: \"%s\" = %lld is out of range [%d, %d]", key, (long long)x,
                       lo, hi);
    *out = (int32_t)x;
    return NS_OK;
}

static ns_status get_float(const json_t *o, const char *key, double lo, double hi, bool required, float *out,
                           ns_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return ns_fail(err, NS_ERR_FORMAT, "config.json: missing \"%s\"", key);
        return NS_OK;
    }
    if (!json_is_number(v)) return ns_fail(err, NS_ERR_FORMAT, "config.json: \"%s\" must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return ns_fail(err, NS_ERR_FORMAT, "config.json: \"%s\" = %g is out of range [%g, %g]", key, x, lo, hi);
    *out = (float)x;
    return NS_OK;
}

static int32_t token_or_none(json_int_t v, int32_t vocab_size) { return v >= 0 && v < vocab_size ? (int32_t)v : -1; }

static ns_status read_eos(const json_t *v, ns_model_config *cfg, const char *file, ns_error *err) {
    if (!v || json_is_null(v)) return NS_OK;
    /* range-checked as JSON integers: a cast first would turn 2^32 + 2 into 2 */
    json_int_t ids[NS_MAX_EOS];
    int32_t n = 0;
    if (json_is_integer(v)) {
        ids[n++] = json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e)) return ns_fail(err, NS_ERR_FORMAT, "%s: eos_token_id entries must be integers", file);
            if (n == NS_MAX_EOS) return ns_fail(err, NS_ERR_FORMAT, "%s: more than %d eos_token_id entries", file, NS_MAX_EOS);
            ids[n++] = json_integer_value(e);
        }
    } else {
        return ns_fail(err, NS_ERR_FORMAT, "%s: eos_token_id must be an integer or a list", file);
    }
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab_size)
            return ns_fail(err, NS_ERR_FORMAT, "%s: eos_token_id %lld is outside the vocabulary", file,
                           (long long)ids[i]);
    for (int32_t i = 0; i < n; i++) cfg->eos_token_ids[i] = (int32_t)ids[i];
    cfg->n_eos = n;
    return NS_OK;
}

static const struct {
    const char *cls, *model_type;
    ns_arch arch;
} k_archs[] = {
    {"LlamaForCausalLM", "llama", NS_ARCH_LLAMA},     {"MistralForCausalLM", "mistral", NS_ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", NS_ARCH_QWEN2},     {"Qwen3ForCausalLM", "qwen3", NS_ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", "qwen3_moe", NS_ARCH_QWEN3_MOE},
};

/* "architectures"[0], else "model_type" -> cfg->arch and arch_name. */
static ns_status parse_arch(const json_t *c, ns_model_config *cfg, ns_error *err) {
    const char *arch = NULL;
    json_t *archs = json_object_get(c, "architectures");
    if (json_is_array(archs) && json_array_size(archs) > 0 && json_is_string(json_array_get(archs, 0)))
        arch = json_string_value(json_array_get(archs, 0));
    const char *mtype = json_string_value(json_object_get(c, "model_type"));
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++) {
        if (arch ? strcmp(arch, k_archs[i].cls) != 0 : (!mtype || strcmp(mtype, k_archs[i].model_type) != 0))
            continue;
        cfg->arch = k_archs[i].arch;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", k_archs[i].cls);
        cfg->qk_norm = cfg->arch == NS_ARCH_QWEN3 || cfg->arch == NS_ARCH_QWEN3_MOE;
        cfg->attn_bias = cfg->arch == NS_ARCH_QWEN2; /* hard-wired in Qwen2's attention */
        return NS_OK;
    }
    return ns_fail(err, NS_ERR_UNSUPPORTED,
                   "config.json: unknown architecture \"%s\" (supported: LlamaForCausalLM, MistralForCausalLM, "
                   "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)",
                   arch ? arch : (mtype ? mtype : "(none)"));
}

/* Qwen3-MoE's experts. Keys absent or num_experts 0: a dense model. */
static ns_status parse_moe(const json_t *c, ns_model_config *cfg, ns_error *err) {
    ns_status st;
#define TRY(x) do { if ((st = (x)) != NS_OK) return st; } while (0)
    /* transformers 5 writes num_local_experts, earlier versions num_experts */
    TRY(get_int(c, "num_experts", 0, 1 << 16, false, &cfg->n_experts, err));
    TRY(get_int(c, "num_local_experts", 0, 1 << 16, false, &cfg->n_experts, err));
    if (cfg->arch != NS_ARCH_QWEN3_MOE) {
        if (cfg->n_experts > 0)
            return ns_fail(err, NS_ERR_UNSUPPORTED, "config.json: experts are only supported for Qwen3MoeForCausalLM");
        return NS_OK;
    }
    if (cfg->n_experts == 0) return NS_OK;
    TRY(get_int(c, "num_experts_per_tok", 1, cfg->n_experts, true, &cfg->n_experts_per_tok, err));
    TRY(get_int(c, "moe_intermediate_size", 1, 1 << 20, true, &cfg->moe_intermediate_size, err));
    cfg->decoder_sparse_step = 1;
    TRY(get_int(c, "decoder_sparse_step", 1, 1024, false, &cfg->decoder_sparse_step, err));
    json_t *nt = json_object_get(c, "norm_topk_prob");
    if (nt && !json_is_boolean(nt)) return ns_fail(err, NS_ERR_FORMAT, "config.json: norm_topk_prob must be a boolean");
    cfg->norm_topk_prob = nt && json_is_true(nt); /* HF's default is false */
    json_t *mo = json_object_get(c, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo)) return ns_fail(err, NS_ERR_FORMAT, "config.json: mlp_only_layers must be a list");
        size_t i;
        json_t *v;
        json_array_foreach(mo, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= cfg->n_layers)
                return ns_fail(err, NS_ERR_FORMAT, "config.json: mlp_only_layers entries must be layer indices");
            json_int_t l = json_integer_value(v);
            cfg->mlp_only[l / 64] |= 1ull << (l % 64);
        }
    }
#undef TRY
    return NS_OK;
}

/* A sliding window is not implemented: within the window, sliding
 * attention equals full causal attention (HF masks keys more than
 * window - 1 positions back), so the context is clamped to the window and
 * outputs stay exact. Mistral applies "sliding_window" when it is set;
 * the Qwen models only with use_sliding_window (or a "sliding_attention"
 * entry in layer_types). */
static ns_status parse_window(const json_t *c, ns_model_config *cfg, ns_error *err) {
    int32_t w = 0;
    ns_status st = get_int(c, "sliding_window", 1, 1 << 24, false, &w, err);
    if (st != NS_OK || w == 0) return st;
    bool on = cfg->arch == NS_ARCH_MISTRAL || json_is_true(json_object_get(c, "use_sliding_window"));
    json_t *lt = json_object_get(c, "layer_types");
    size_t i;
    json_t *v;
    if (json_is_array(lt)) {
        on = false;
        json_array_foreach(lt, i, v) on = on || (json_is_string(v) && strcmp(json_string_value(v), "sliding_attention") == 0);
    }
    if (!on) return NS_OK;
    cfg->sliding_window = w;
    if (w < cfg->max_position_embeddings) cfg->max_position_embeddings = w;
    return NS_OK;
}

/* RoPE base and scaling -> cfg (rope_theta read already). */
static ns_status parse_rope(const json_t *c, ns_model_config *cfg, ns_error *err) {
    ns_status st;
#define TRY(x) do { if ((st = (x)) != NS_OK) return st; } while (0)
    /* transformers 5 writes rope_parameters (with rope_theta inside);
     * earlier versions rope_theta and rope_scaling at the top level */
    json_t *rs = json_object_get(c, "rope_parameters");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return ns_fail(err, NS_ERR_FORMAT, "config.json: rope_parameters must be an object");
        TRY(get_float(rs, "rope_theta", 1, 1e12, false, &cfg->rope_theta, err));
    } else {
        rs = json_object_get(c, "rope_scaling");
    }
    cfg->rope_type = NS_ROPE_DEFAULT;
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return ns_fail(err, NS_ERR_FORMAT, "config.json: rope_scaling must be an object");
        const char *rt = json_string_value(json_object_get(rs, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rs, "type"));
        if (!rt) return ns_fail(err, NS_ERR_FORMAT, "config.json: rope_scaling has no rope_type");
        if (strcmp(rt, "default") == 0) {
            cfg->rope_type = NS_ROPE_DEFAULT;
        } else if (strcmp(rt, "llama3") == 0) {
            cfg->rope_type = NS_ROPE_LLAMA3;
            TRY(get_float(rs, "factor", 1, 1e6, true, &cfg->rope_factor, err));
            TRY(get_float(rs, "low_freq_factor", 1e-6, 1e6, true, &cfg->rope_low_freq_factor, err));
            TRY(get_float(rs, "high_freq_factor", 1e-6, 1e6, true, &cfg->rope_high_freq_factor, err));
            TRY(get_int(rs, "original_max_position_embeddings", 1, 1 << 24, true, &cfg->rope_original_max_pos, err));
            if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
                return ns_fail(err, NS_ERR_FORMAT, "config.json: rope_scaling high_freq_factor must exceed low_freq_factor");
        } else if (strcmp(rt, "linear") == 0) {
            cfg->rope_type = NS_ROPE_LINEAR;
            TRY(get_float(rs, "factor", 1e-6, 1e6, true, &cfg->rope_factor, err));
        } else {
            return ns_fail(err, NS_ERR_UNSUPPORTED, "config.json: rope_scaling type \"%s\" is not supported", rt);
        }
    }
#undef TRY
    return NS_OK;
}

bool ns_config_layer_is_moe(const ns_model_config *cfg, int32_t l) {
    if (cfg->n_experts <= 0 || l < 0 || l >= 1024) return false;
    if (cfg->mlp_only[l / 64] & (1ull << (l % 64))) return false;
    return cfg->decoder_sparse_step > 0 && (l + 1) % cfg->decoder_sparse_step == 0;
}

ns_status ns_config_from_json(const json_t *c, const json_t *gen, ns_model_config *cfg, ns_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_token_id = -1;
    if (!json_is_object(c)) return ns_fail(err, NS_ERR_FORMAT, "config.json: not a JSON object");
    ns_status st = parse_arch(c, cfg, err);
    if (st != NS_OK) return st;

#define TRY(x) do { if ((st = (x)) != NS_OK) return st; } while (0)
    TRY(get_int(c, "vocab_size", 1, 1 << 24, true, &cfg->vocab_size, err));
    TRY(get_int(c, "hidden_size", 1, 1 << 16, true, &cfg->hidden_size, err));
    TRY(get_int(c, "intermediate_size", 1, 1 << 20, true, &cfg->intermediate_size, err));
    TRY(get_int(c, "num_hidden_layers", 1, 1024, true, &cfg->n_layers, err));
    TRY(get_int(c, "num_attention_heads", 1, 1024, true, &cfg->n_heads, err));
    cfg->n_kv_heads = cfg->n_heads;
    TRY(get_int(c, "num_key_value_heads", 1, 1024, false, &cfg->n_kv_heads, err));
    /* head_dim: given, or hidden_size / num_attention_heads ("head_dim": null
     * is absent, as for every optional key) */
    json_t *hd = json_object_get(c, "head_dim");
    if (cfg->hidden_size % cfg->n_heads != 0 && (!hd || json_is_null(hd)))
        return ns_fail(err, NS_ERR_FORMAT, "config.json: hidden_size is not a multiple of num_attention_heads");
    cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    TRY(get_int(c, "head_dim", 2, 1024, false, &cfg->head_dim, err));
    if (cfg->head_dim < 2 || cfg->head_dim % 2)
        return ns_fail(err, NS_ERR_FORMAT, "config.json: head_dim %d must be even and at least 2", cfg->head_dim);
    if (cfg->n_heads % cfg->n_kv_heads)
        return ns_fail(err, NS_ERR_FORMAT, "config.json: num_attention_heads %% num_key_value_heads != 0");
    cfg->max_position_embeddings = 2048;
    TRY(get_int(c, "max_position_embeddings", 1, 1 << 24, false, &cfg->max_position_embeddings, err));
    cfg->rms_norm_eps = 1e-6f;
    TRY(get_float(c, "rms_norm_eps", 0, 1, false, &cfg->rms_norm_eps, err));
    cfg->rope_theta = 10000.0f;
    TRY(get_float(c, "rope_theta", 1, 1e12, false, &cfg->rope_theta, err));
    json_t *tie = json_object_get(c, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie)) return ns_fail(err, NS_ERR_FORMAT, "config.json: tie_word_embeddings must be a boolean");
    /* HF's PretrainedConfig default is true when the key is absent. */
    cfg->tie_word_embeddings = tie ? json_is_true(tie) : true;
    json_t *ab = json_object_get(c, "attention_bias");
    if (ab && json_is_true(ab) && cfg->arch != NS_ARCH_QWEN2) /* these would bias o_proj too */
        return ns_fail(err, NS_ERR_UNSUPPORTED, "config.json: attention_bias=true is not supported for %s",
                       cfg->arch_name);
    json_t *mb = json_object_get(c, "mlp_bias");
    if (mb && json_is_true(mb)) return ns_fail(err, NS_ERR_UNSUPPORTED, "config.json: mlp_bias=true is not supported");
    const char *act = json_string_value(json_object_get(c, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "config.json: hidden_act \"%s\" is not supported (silu only)", act);

    TRY(parse_rope(c, cfg, err));
    TRY(parse_window(c, cfg, err));
    TRY(parse_moe(c, cfg, err));
    /* bos: an id of the vocabulary, else none (-1) */
    json_t *bos = json_object_get(c, "bos_token_id");
    if (json_is_integer(bos)) cfg->bos_token_id = token_or_none(json_integer_value(bos), cfg->vocab_size);
    TRY(read_eos(json_object_get(c, "eos_token_id"), cfg, "config.json", err));
    if (gen && json_is_object(gen)) {
        bos = json_object_get(gen, "bos_token_id");
        if (json_is_integer(bos)) cfg->bos_token_id = token_or_none(json_integer_value(bos), cfg->vocab_size);
        TRY(read_eos(json_object_get(gen, "eos_token_id"), cfg, "generation_config.json", err));
    }
#undef TRY
    return NS_OK;
}

ns_status ns_config_load(const char *dir, ns_model_config *cfg, ns_error *err) {
    char *path = ns_path_join(dir, "config.json");
    char *gpath = ns_path_join(dir, "generation_config.json");
    char *text = NULL;
    json_t *c = NULL, *g = NULL;
    ns_status st = NS_OK;
    if (!path || !gpath) {
        st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    st = ns_file_read(path, CONFIG_MAX_BYTES, &text, NULL, err);
    if (st != NS_OK) goto done;
    json_error_t je;
    c = json_loads(text, 0, &je);
    if (!c) {
        st = ns_fail(err, NS_ERR_FORMAT, "%s:%d:%d: bad JSON: %s", path, je.line, je.column, je.text);
        goto done;
    }
    free(text);
    text = NULL;
    if (ns_file_exists(gpath)) {
        st = ns_file_read(gpath, CONFIG_MAX_BYTES, &text, NULL, err);
        if (st != NS_OK) goto done;
        g = json_loads(text, 0, &je);
        if (!g) {
            st = ns_fail(err, NS_ERR_FORMAT, "%s:%d:%d: bad JSON: %s", gpath, je.line, je.column, je.text);
            goto done;
        }
    }
    st = ns_config_from_json(c, g, cfg, err);
done:
    free(text);
    free(path);
    free(gpath);
    json_decref(c);
    json_decref(g);
    return st;
}

void ns_rope_inv_freq(const ns_model_config *cfg, float *inv_freq) {
    const int half = cfg->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        float expo = (float)(2 * i) / (float)cfg->head_dim;
        float f = 1.0f / powf(cfg->rope_theta, expo);
        if (cfg->rope_type == NS_ROPE_LINEAR) {
            f /= cfg->rope_factor;
        } else if (cfg->rope_type == NS_ROPE_LLAMA3) {
            const float factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            const float old_ctx = (float)cfg->rope_original_max_pos;
            const float low_wl = old_ctx / lo, high_wl = old_ctx / hi;
            const float wl = 2.0f * (float)M_PI / f;
            float g = wl > low_wl ? f / factor : f;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float smooth = (old_ctx / wl - lo) / (hi - lo);
                g = (1.0f - smooth) * g / factor + smooth * g;
            }
            f = g;
        }
        inv_freq[i] = f;
    }
}

bool ns_config_is_eos(const ns_model_config *cfg, int32_t token) {
    for (int32_t i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] == token) return true;
    return false;
}
