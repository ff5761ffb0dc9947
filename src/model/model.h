/* model.h — model configuration and weights: Llama (and Mistral), Qwen2,
 * Qwen3 and Qwen3-MoE.
 *
 * A model is loaded from a Hugging Face directory (config.json,
 * generation_config.json, model.safetensors or a sharded index) or built
 * from a config alone with random weights (--dummy-weights, the built-in
 * demo model). Weights live in the backend (ns_tensor); on the CPU backend
 * they may point straight into the memory-mapped safetensors files, which
 * the model then keeps mapped until ns_model_free.
 *
 * Invariants after a successful load: every tensor the architecture needs
 * is present with the exact shape the config implies; lm_head may alias
 * embed (tied embeddings, whichever of the two names the file holds);
 * fingerprint identifies the weights (used to key the prefix cache); the
 * backend has every op the architecture needs (ns_model_check_backend:
 * attention biases need add_bias, experts need moe_ffn), so a backend that
 * lacks one fails the load with a message naming it instead of crashing
 * in the forward.
 *
 * Architectures: Mistral is Llama's graph (a sliding window, when the
 * config sets one, limits the context to the window: within it, sliding
 * attention is full causal attention). Qwen2 adds biases to the q/k/v
 * projections. Qwen3 normalizes q and k per head. Qwen3-MoE is Qwen3 whose
 * MLP is, on its sparse layers (ns_config_layer_is_moe), a router over
 * n_experts SwiGLU experts of moe_intermediate_size of which each token
 * uses n_experts_per_tok.
 */
#ifndef NS_MODEL_H
#define NS_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "backend/backend.h"
#include "util/status.h"

typedef enum { NS_ARCH_LLAMA = 0, NS_ARCH_QWEN3 = 1, NS_ARCH_QWEN2 = 2, NS_ARCH_MISTRAL = 3, NS_ARCH_QWEN3_MOE = 4 } ns_arch;
typedef enum { NS_ROPE_DEFAULT = 0, NS_ROPE_LLAMA3 = 1, NS_ROPE_LINEAR = 2 } ns_rope_type;

#define NS_MAX_EOS 8

typedef struct ns_model_config {
    ns_arch arch;
    char arch_name[64];   /* e.g. "LlamaForCausalLM" */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    ns_rope_type rope_type;
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    int32_t rope_original_max_pos;
    bool tie_word_embeddings;
    bool qk_norm;          /* Qwen3: RMSNorm on q and k per head */
    bool attn_bias;        /* Qwen2: biases on the q, k and v projections */
    int32_t sliding_window; /* the window the config asks for (0: none); the
                             * context (max_position_embeddings) is clamped to it */
    /* mixture of experts (n_experts == 0: every layer is dense) */
    int32_t n_experts;             /* num_experts / num_local_experts */
    int32_t n_experts_per_tok;     /* top k */
    int32_t moe_intermediate_size; /* one expert's ff width */
    int32_t decoder_sparse_step;   /* layer l is sparse when (l + 1) % step == 0 ... */
    bool norm_topk_prob;           /* renormalize the top-k probabilities to sum 1 */
    uint64_t mlp_only[16];         /* ... and l is not in mlp_only_layers (bitset, l < 1024) */
    int32_t bos_token_id;  /* -1 if none */
    int32_t eos_token_ids[NS_MAX_EOS];
    int32_t n_eos;
} ns_model_config;

/* Parses config.json (and merges generation_config.json's eos/bos if
 * gen is non-NULL). Checks every value's type and range. */
ns_status ns_config_from_json(const json_t *config, const json_t *gen, ns_model_config *cfg, ns_error *err);
/* Reads dir/config.json and dir/generation_config.json (optional). */
ns_status ns_config_load(const char *dir, ns_model_config *cfg, ns_error *err);
/* Fills inv_freq[head_dim/2] including llama3 scaling. */
void ns_rope_inv_freq(const ns_model_config *cfg, float *inv_freq);
bool ns_config_is_eos(const ns_model_config *cfg, int32_t token);
/* True when layer l's MLP is the mixture of experts (HF's rule: experts
 * exist, l is not in mlp_only_layers, and (l + 1) % decoder_sparse_step == 0). */
bool ns_config_layer_is_moe(const ns_model_config *cfg, int32_t l);

typedef struct ns_layer_weights {
    ns_tensor attn_norm; /* [1, hidden] */
    ns_tensor wq;        /* [n_heads*head_dim, hidden] */
    ns_tensor wk;        /* [n_kv_heads*head_dim, hidden] */
    ns_tensor wv;        /* [n_kv_heads*head_dim, hidden] */
    ns_tensor wo;        /* [hidden, n_heads*head_dim] */
    ns_tensor q_norm;    /* [1, head_dim] (qk_norm only) */
    ns_tensor k_norm;    /* [1, head_dim] (qk_norm only) */
    ns_tensor ffn_norm;  /* [1, hidden] */
    ns_tensor w_gate;    /* [ff, hidden] */
    ns_tensor w_up;      /* [ff, hidden] */
    ns_tensor w_down;    /* [hidden, ff] */
    ns_tensor bq, bk, bv; /* [1, q_dim], [1, kv_dim], [1, kv_dim] (attn_bias only) */
    /* MoE layers (ns_config_layer_is_moe) instead of w_gate/w_up/w_down: */
    ns_tensor router;    /* [n_experts, hidden] */
    ns_tensor *experts;  /* owned array of 3 * n_experts: gate [moe_ff, hidden] at
                          * [e], up [moe_ff, hidden] at [n_experts + e], down
                          * [hidden, moe_ff] at [2 * n_experts + e] */
} ns_layer_weights;

struct ns_safetensors;

typedef struct ns_model {
    ns_model_config cfg;
    ns_backend *be;            /* borrowed; must outlive the model */
    ns_layer_weights *layers;  /* [n_layers] */
    ns_tensor embed;           /* [vocab, hidden] */
    ns_tensor final_norm;      /* [1, hidden] */
    ns_tensor lm_head;         /* [vocab, hidden]; may alias embed (lm_head_tied) */
    bool lm_head_tied;
    ns_tensor rope_inv_freq;   /* F32 [1, head_dim/2] */
    uint64_t fingerprint;      /* weights identity (see ns_model_load) */
    bool dummy;                /* random weights */
    char *dir;                 /* source directory (NULL for dummy) */
    struct ns_safetensors *files; /* kept mapped while weights borrow them */
    size_t weight_bytes;       /* bytes of all weights as stored in the backend */
    struct ns_gguf_model *gguf; /* GGUF source (mapped files, owned copies); NULL otherwise */
} ns_model;

/* Loads a Hugging Face checkpoint directory onto be. *out owned by caller.
 * A GGUF file, or a directory holding one and no config.json, is loaded by
 * ns_gguf_model_load (gguf_model.h); ns_model_validate_dir dispatches the
 * same way. */
ns_status ns_model_load(const char *dir, ns_backend *be, ns_model **out, ns_error *err);
/* Builds a model from cfg with deterministic random weights (seed) in
 * dtype dt, generated by the backend. */
ns_status ns_model_create_random(const ns_model_config *cfg, ns_backend *be, ns_dtype dt, uint64_t seed,
                                 ns_model **out, ns_error *err);
void ns_model_free(ns_model *m);
/* Checks a checkpoint directory the way ns_model_load would, without
 * reading any weight data: config.json (and generation_config.json) parse
 * and are supported, the safetensors headers are readable and consistent
 * with their files, and every tensor the architecture needs is present
 * with the shape the config implies, with none left over. Cheap (headers
 * only), so a server can refuse a bad directory before it starts. Fills
 * *cfg (if non-NULL) on success. */
ns_status ns_model_validate_dir(const char *dir, ns_model_config *cfg, ns_error *err);
/* NS_ERR_UNSUPPORTED (naming the backend and the missing op) when be lacks
 * an op cfg's architecture needs; every loader calls it before binding
 * weights. */
ns_status ns_model_check_backend(const ns_model_config *cfg, const ns_backend *be, ns_error *err);

#endif
