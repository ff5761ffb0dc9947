#include "model/demo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/utf8.h"

static const char *k_demo_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                        "</think>",      "<tool_call>",  "</tool_call>"};
#define N_SPECIALS (sizeof k_demo_specials / sizeof k_demo_specials[0])

void ns_demo_config(ns_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = NS_ARCH_LLAMA;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "LlamaForCausalLM");
    cfg->vocab_size = 256 + (int32_t)N_SPECIALS;
    cfg->hidden_size = 64;
    cfg->intermediate_size = 128;
    cfg->n_layers = 2;
    cfg->n_heads = 4;
    cfg->n_kv_heads = 2;
    cfg->head_dim = 16;
    cfg->max_position_embeddings = 32768;
    cfg->rms_norm_eps = 1e-5f;
    cfg->rope_theta = 10000.0f;
    cfg->tie_word_embeddings = true;
    cfg->bos_token_id = -1;
    cfg->eos_token_ids[0] = 256;     /* <|endoftext|> */
    cfg->eos_token_ids[1] = 256 + 2; /* <|im_end|> */
    cfg->n_eos = 2;
}

/* GPT-2 byte-to-unicode map: printable Latin-1 bytes stand for themselves,
 * the rest are shifted to U+0100.. so every byte is a visible character. */
static void byte_char(int b, char out[4]) {
    static int map[256];
    static int built = 0;
    if (!built) {
        int n = 0;
        for (int i = 0; i < 256; i++) {
            int printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
            map[i] = printable ? i : 256 + n++;
        }
        built = 1;
    }
    out[ns_utf8_encode((uint32_t)map[b], out)] = 0; /* map[b] < 0x800: at most 2 bytes */
}

static char *g_tok_json, *g_cfg_json;

const char *ns_demo_tokenizer_json(void) {
    if (!g_tok_json) g_tok_json = ns_demo_tokenizer_json_n(0);
    return g_tok_json;
}

char *ns_demo_tokenizer_json_n(int32_t n_vocab) {
    json_t *root = json_object(), *model = json_object(), *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char s[4];
        byte_char(b, s);
        json_object_set_new(vocab, s, json_integer(b));
    }
    for (size_t i = 0; i < N_SPECIALS; i++) {
        json_object_set_new(vocab, k_demo_specials[i], json_integer(256 + (json_int_t)i));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 256 + (int)i, "content",
                                               k_demo_specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    }
    /* filler pieces " t<id>" (U+0120 is the byte-level space) so that every
     * id of a wider model has text */
    for (int32_t id = 256 + (int32_t)N_SPECIALS; id < n_vocab; id++) {
        char s[32];
        snprintf(s, sizeof s, "\xc4\xa0t%d", (int)id);
        json_object_set_new(vocab, s, json_integer(id));
    }
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_array());
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                  "use_regex", 0));
    json_object_set_new(root, "post_processor", json_null());
    json_object_set_new(root, "decoder",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                  "use_regex", 0));
    json_object_set_new(root, "model", model);
    char *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

const char *ns_demo_tokenizer_config_json(void) {
    if (g_cfg_json) return g_cfg_json;
    /* A ChatML template with tools and <think> handling, enough for every
     * server path to be exercised against the demo model. */
    static const char *tmpl =
        "{%- if tools %}{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
        "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- '\\n</tools>\\n\\nFor each function call, return a json object within <tool_call></tool_call> "
        "tags.<|im_end|>\\n' }}"
        "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "
        "'<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message.role == 'system' %}{%- if not loop.first %}{{- '<|im_start|>system\\n' + message.content + "
        "'<|im_end|>\\n' }}{%- endif %}"
        "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
        "'\\n</tool_response><|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
        "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function else "
        "tc %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
        "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
        "{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
    json_t *root = json_pack("{s:s, s:s, s:n, s:b, s:s}", "eos_token", "<|im_end|>", "pad_token", "<|endoftext|>",
                             "bos_token", "add_bos_token", 0, "chat_template", tmpl);
    g_cfg_json = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return g_cfg_json;
}
