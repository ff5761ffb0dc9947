/* test_model_arch.c — the Qwen2, Mistral and Qwen3-MoE architectures:
 * config parsing (which layers are sparse, the sliding window, transformers
 * 5's rope_parameters and num_local_experts, what is refused), the
 * tensors each needs (checked on the fixture checkpoints and on copies
 * whose config claims another architecture), a backend without the ops
 * an architecture needs (a clear load error, no crash), and random-weight
 * MoE models running a forward step. The logits themselves are checked
 * against transformers in tests/golden/test_logits_golden.c. */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/model.h"
#include "test.h"

/* config.json text with one field set (value is JSON text), then parsed. */
static ns_status parse_with(const char *base, const char *key, const char *value, ns_model_config *cfg,
                            ns_error *err) {
    json_error_t je;
    json_t *c = json_loads(base, 0, &je);
    if (!c) {
        fprintf(stdout, "# bad base config: %s\n", je.text);
        return NS_ERR_FORMAT;
    }
    if (key) json_object_set_new(c, key, json_loads(value, JSON_DECODE_ANY, &je));
    ns_status rc = ns_config_from_json(c, NULL, cfg, err);
    json_decref(c);
    return rc;
}

static const char MOE[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64,"
    " \"intermediate_size\": 128, \"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 16, \"max_position_embeddings\": 512, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 32, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3, 5],"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}}";

TEST(moe_config) {
    ns_model_config c;
    ns_error err = {0};
    CHECKF(parse_with(MOE, NULL, NULL, &c, &err) == NS_OK, "%s", err.msg);
    CHECK(c.arch == NS_ARCH_QWEN3_MOE && c.qk_norm && !c.attn_bias);
    CHECK_EQ_INT(c.n_experts, 8);
    CHECK_EQ_INT(c.n_experts_per_tok, 2);
    CHECK_EQ_INT(c.moe_intermediate_size, 32);
    CHECK(!c.norm_topk_prob); /* HF's default */
    CHECK_NEAR(c.rope_theta, 1e6, 1);
    /* step 2: layers 1, 3, 5, 7 are sparse, less mlp_only_layers 3 and 5 */
    int want[8] = {0, 1, 0, 0, 0, 0, 0, 1};
    for (int l = 0; l < 8; l++) CHECKF(ns_config_layer_is_moe(&c, l) == want[l], "layer %d", l);
    CHECK(!ns_config_layer_is_moe(&c, 8) && !ns_config_layer_is_moe(&c, -1));
    /* transformers 5's name for the expert count */
    json_t *j = json_loads(MOE, 0, NULL);
    json_object_del(j, "num_experts");
    json_object_set_new(j, "num_local_experts", json_integer(16));
    json_object_set_new(j, "norm_topk_prob", json_true());
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.n_experts == 16 && c.norm_topk_prob);
    json_decref(j);
    /* num_experts 0: a dense model */
    CHECK(parse_with(MOE, "num_experts", "0", &c, &err) == NS_OK && c.n_experts == 0 && !ns_config_layer_is_moe(&c, 1));
}

TEST(moe_config_refused) {
    ns_model_config c;
    ns_error err = {0};
    CHECK(parse_with(MOE, "num_experts_per_tok", "9", &c, &err) == NS_ERR_FORMAT); /* more than the experts */
    CHECK(strstr(err.msg, "num_experts_per_tok") != NULL);
    CHECK(parse_with(MOE, "mlp_only_layers", "[8]", &c, &err) == NS_ERR_FORMAT);
    CHECK(parse_with(MOE, "mlp_only_layers", "\"1\"", &c, &err) == NS_ERR_FORMAT);
    CHECK(parse_with(MOE, "norm_topk_prob", "1", &c, &err) == NS_ERR_FORMAT);
    CHECK(parse_with(MOE, "decoder_sparse_step", "0", &c, &err) == NS_ERR_FORMAT);
    json_t *j = json_loads(MOE, 0, NULL);
    json_object_del(j, "moe_intermediate_size");
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_ERR_FORMAT && strstr(err.msg, "moe_intermediate_size"));
    json_decref(j);
    /* experts on an architecture without them */
    CHECK(parse_with(MOE, "architectures", "[\"LlamaForCausalLM\"]", &c, &err) == NS_ERR_UNSUPPORTED);
}

static const char MISTRAL[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64,"
    " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32768, \"sliding_window\": 4096, \"rope_theta\": 1000000.0}";

TEST(sliding_window) {
    ns_model_config c;
    ns_error err = {0};
    /* Mistral applies its window: the context is clamped to it */
    CHECKF(parse_with(MISTRAL, NULL, NULL, &c, &err) == NS_OK, "%s", err.msg);
    CHECK(c.arch == NS_ARCH_MISTRAL && !c.qk_norm && !c.attn_bias);
    CHECK_EQ_INT(c.sliding_window, 4096);
    CHECK_EQ_INT(c.max_position_embeddings, 4096);
    CHECK(parse_with(MISTRAL, "sliding_window", "null", &c, &err) == NS_OK && c.sliding_window == 0 &&
          c.max_position_embeddings == 32768);
    /* a window wider than the context changes nothing */
    CHECK(parse_with(MISTRAL, "sliding_window", "65536", &c, &err) == NS_OK && c.max_position_embeddings == 32768);
    /* Qwen: only with use_sliding_window, or a sliding layer in layer_types */
    json_t *j = json_loads(MISTRAL, 0, NULL);
    json_object_set_new(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.sliding_window == 0 && c.max_position_embeddings == 32768);
    CHECK(c.arch == NS_ARCH_QWEN2 && c.attn_bias);
    json_object_set_new(j, "use_sliding_window", json_true());
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.max_position_embeddings == 4096);
    json_object_set_new(j, "layer_types", json_pack("[s,s]", "full_attention", "full_attention"));
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.max_position_embeddings == 32768);
    json_object_set_new(j, "layer_types", json_pack("[s,s]", "full_attention", "sliding_attention"));
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.max_position_embeddings == 4096);
    json_decref(j);
}

TEST(arch_names_and_refusals) {
    ns_model_config c;
    ns_error err = {0};
    /* no architectures and no model_type */
    CHECK(parse_with(MISTRAL, "architectures", "null", &c, &err) == NS_ERR_UNSUPPORTED);
    json_t *j = json_loads(MISTRAL, 0, NULL);
    json_object_del(j, "architectures");
    static const struct { const char *mt; ns_arch arch; } k[] = {
        {"mistral", NS_ARCH_MISTRAL}, {"qwen2", NS_ARCH_QWEN2}, {"qwen3_moe", NS_ARCH_QWEN3_MOE}, {"llama", NS_ARCH_LLAMA}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        json_object_set_new(j, "model_type", json_string(k[i].mt));
        ns_status rc = ns_config_from_json(j, NULL, &c, &err);
        CHECKF(rc == NS_OK && c.arch == k[i].arch, "model_type %s: %s", k[i].mt, err.msg);
    }
    json_decref(j);
    CHECK(parse_with(MISTRAL, "architectures", "[\"MixtralForCausalLM\"]", &c, &err) == NS_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "Qwen3MoeForCausalLM") != NULL); /* the message lists what is supported */
    /* Llama-style attention_bias would bias o_proj too: refused; Qwen2's is built in */
    CHECK(parse_with(MISTRAL, "attention_bias", "true", &c, &err) == NS_ERR_UNSUPPORTED);
    j = json_loads(MISTRAL, 0, NULL);
    json_object_set_new(j, "architectures", json_pack("[s]", "Qwen2ForCausalLM"));
    json_object_set_new(j, "attention_bias", json_true());
    CHECK(ns_config_from_json(j, NULL, &c, &err) == NS_OK && c.attn_bias);
    json_decref(j);
    /* rope_parameters with llama3 scaling */
    CHECK(parse_with(MISTRAL, "rope_parameters",
                     "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                     " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
                     &c, &err) == NS_OK);
    CHECK(c.rope_type == NS_ROPE_LLAMA3 && fabsf(c.rope_theta - 500000.0f) < 1 && c.rope_factor == 8.0f);
    CHECK(parse_with(MISTRAL, "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", &c, &err) ==
          NS_ERR_UNSUPPORTED);
}

TEST(fixture_checkpoints_validate) {
    static const struct { const char *dir; ns_arch arch; } k[] = {
        {"models/tiny-qwen2", NS_ARCH_QWEN2}, {"models/tiny-mistral", NS_ARCH_MISTRAL},
        {"models/tiny-qwen3moe", NS_ARCH_QWEN3_MOE}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        ns_model_config c;
        ns_error err = {0};
        CHECKF(ns_model_validate_dir(test_shared_path(k[i].dir), &c, &err) == NS_OK, "%s: %s", k[i].dir, err.msg);
        CHECK(c.arch == k[i].arch);
    }
}

/* A temp directory with a fixture's weights (symlinked) and its config
 * edited by fn. */
static char g_dir[256];
static void make_variant(const char *model, void (*fn)(json_t *c)) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ns_arch_test_%d", (int)getpid());
    mkdir(g_dir, 0700);
    char src[1024], dst[512];
    snprintf(src, sizeof src, "%s/model.safetensors", test_shared_path(model));
    snprintf(dst, sizeof dst, "%s/model.safetensors", g_dir);
    unlink(dst);
    CHECK(symlink(src, dst) == 0);
    snprintf(src, sizeof src, "%s/config.json", test_shared_path(model));
    json_t *c = json_load_file(src, 0, NULL);
    fn(c);
    snprintf(dst, sizeof dst, "%s/config.json", g_dir);
    CHECK(json_dump_file(c, dst, 0) == 0);
    json_decref(c);
}

static void cleanup_variant(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", g_dir);
    unlink(p);
    rmdir(g_dir);
}

static void as_mistral(json_t *c) { json_object_set_new(c, "architectures", json_pack("[s]", "MistralForCausalLM")); }
static void as_qwen2(json_t *c) { json_object_set_new(c, "architectures", json_pack("[s]", "Qwen2ForCausalLM")); }
static void all_dense(json_t *c) { json_object_set_new(c, "mlp_only_layers", json_pack("[i,i,i]", 0, 1, 2)); }
static void no_dense(json_t *c) { json_object_set_new(c, "mlp_only_layers", json_array()); }

TEST(tensors_must_match_the_architecture) {
    ns_error err = {0};
    /* Qwen2 weights read as Mistral: the biases are left over */
    make_variant("models/tiny-qwen2", as_mistral);
    CHECK(ns_model_validate_dir(g_dir, NULL, &err) == NS_ERR_FORMAT);
    CHECKF(strstr(err.msg, "unexpected tensor") && strstr(err.msg, "_proj.bias"), "%s", err.msg);
    /* Mistral weights read as Qwen2: the biases are missing */
    make_variant("models/tiny-mistral", as_qwen2);
    CHECK(ns_model_validate_dir(g_dir, NULL, &err) == NS_ERR_FORMAT);
    CHECKF(strstr(err.msg, "missing tensor") && strstr(err.msg, "q_proj.bias"), "%s", err.msg);
    /* an MoE checkpoint whose config makes every layer dense, or none */
    make_variant("models/tiny-qwen3moe", all_dense);
    CHECK(ns_model_validate_dir(g_dir, NULL, &err) == NS_ERR_FORMAT);
    CHECKF(strstr(err.msg, "missing tensor \"model.layers.0.mlp.gate_proj.weight\""), "%s", err.msg);
    make_variant("models/tiny-qwen3moe", no_dense);
    CHECK(ns_model_validate_dir(g_dir, NULL, &err) == NS_ERR_FORMAT);
    CHECKF(strstr(err.msg, "layers.1.mlp.gate.weight"), "%s", err.msg);
    cleanup_variant();
}

/* The CPU backend with some ops taken away: a backend that lacks them. */
static ns_backend_ops g_crippled;

TEST(backend_without_the_ops_refuses_the_model) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    if (!be) return;
    const ns_backend_ops *real = be->ops;
    g_crippled = *real;
    g_crippled.name = "lacking";
    g_crippled.moe_ffn = NULL;
    g_crippled.add_bias = NULL;
    be->ops = &g_crippled;
    static const struct { const char *dir, *op; } k[] = {{"models/tiny-qwen3moe", "moe_ffn"},
                                                         {"models/tiny-qwen2", "add_bias"}};
    for (size_t i = 0; i < 2; i++) {
        ns_model *m = NULL;
        ns_status rc = ns_model_load(test_shared_path(k[i].dir), be, &m, &err);
        CHECKF(rc == NS_ERR_UNSUPPORTED && m == NULL, "%s: %d", k[i].dir, rc);
        CHECKF(strstr(err.msg, "lacking") && strstr(err.msg, k[i].op), "%s", err.msg);
        ns_model_free(m);
    }
    /* random weights and a model loaded elsewhere meet the same check */
    ns_model_config c;
    CHECK(parse_with(MOE, NULL, NULL, &c, &err) == NS_OK);
    ns_model *m = NULL;
    CHECK(ns_model_create_random(&c, be, NS_DT_F32, 1, &m, &err) == NS_ERR_UNSUPPORTED && !m);
    be->ops = real;
    CHECK(ns_model_create_random(&c, be, NS_DT_F32, 1, &m, &err) == NS_OK);
    if (m) {
        be->ops = &g_crippled;
        ns_engine *e = NULL;
        ns_engine_opts eo = {.max_batch_tokens = 8, .max_logits = 8, .page_tokens = 16, .n_pages = 4, .kv_dtype = NS_DT_F32};
        CHECK(ns_engine_create(m, &eo, &e, &err) == NS_ERR_UNSUPPORTED && !e);
        be->ops = real;
        ns_model_free(m);
    }
    be->ops->destroy(be);
}

/* A random-weight MoE model (dense and sparse layers, BF16) runs a
 * prefill of several tokens and a decode step with finite logits. */
TEST(random_moe_model_runs) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(2, &be, &err) == NS_OK);
    if (!be) return;
    ns_model_config c;
    CHECK(parse_with(MOE, NULL, NULL, &c, &err) == NS_OK);
    ns_model *m = NULL;
    ns_engine *e = NULL;
    CHECKF(ns_model_create_random(&c, be, NS_DT_BF16, 7, &m, &err) == NS_OK, "%s", err.msg);
    ns_engine_opts eo = {.max_batch_tokens = 16, .max_logits = 16, .page_tokens = 16, .n_pages = 4, .kv_dtype = NS_DT_F32};
    if (m) CHECKF(ns_engine_create(m, &eo, &e, &err) == NS_OK, "%s", err.msg);
    if (e) {
        int32_t toks[12], pos[12], start[2] = {0, 12}, len[1] = {12}, pages[1] = {0}, rows[1] = {11};
        for (int i = 0; i < 12; i++) {
            toks[i] = (i * 37) % 100;
            pos[i] = i;
        }
        ns_batch b = {.n_tokens = 12, .n_seqs = 1, .tokens = toks, .positions = pos, .seq_start = start,
                      .seq_len = len, .page_table = pages, .max_pages = 1, .logit_rows = rows, .n_logits = 1};
        float logits[100];
        CHECKF(ns_engine_forward(e, &b, &err) == NS_OK, "%s", err.msg);
        CHECK(ns_engine_read_logits(e, 1, logits, &err) == NS_OK);
        int finite = 0;
        for (int i = 0; i < 100; i++) finite += isfinite(logits[i]) != 0;
        CHECK_EQ_INT(finite, 100);
        int32_t t1[1] = {5}, p1[1] = {12}, s1[2] = {0, 1}, l1[1] = {13}, r1[1] = {0};
        ns_batch d = {.n_tokens = 1, .n_seqs = 1, .tokens = t1, .positions = p1, .seq_start = s1,
                      .seq_len = l1, .page_table = pages, .max_pages = 1, .logit_rows = r1, .n_logits = 1};
        CHECKF(ns_engine_forward(e, &d, &err) == NS_OK, "%s", err.msg);
        CHECK(ns_engine_read_logits(e, 1, logits, &err) == NS_OK);
        finite = 0;
        for (int i = 0; i < 100; i++) finite += isfinite(logits[i]) != 0;
        CHECK_EQ_INT(finite, 100);
    }
    ns_engine_free(e);
    ns_model_free(m);
    be->ops->destroy(be);
}

int main(void) {
    RUN(moe_config);
    RUN(moe_config_refused);
    RUN(sliding_window);
    RUN(arch_names_and_refusals);
    RUN(fixture_checkpoints_validate);
    RUN(tensors_must_match_the_architecture);
    RUN(backend_without_the_ops_refuses_the_model);
    RUN(random_moe_model_runs);
    TEST_MAIN_END;
}
