/* fuzz_config — config.json (+ generation_config.json) -> ns_model_config.
 *
 * Input: config.json text, optionally a NUL and generation_config.json.
 * Texts that are not JSON are parsed anyway as far as jansson goes (its
 * parser is fuzzed along); any JSON value is handed over, objects or not.
 *
 * Oracles: ns_config_from_json succeeds or fails with a message; a config
 * it accepts is one the engine can size without overflow: positive
 * dimensions, heads that divide evenly, an even head_dim, EOS ids in range,
 * finite positive rope frequencies (ns_rope_inv_freq runs on it). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "fuzz_common.h"
#include "model/model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet_logs();
    return 0;
}

static void check_accepted(const ns_model_config *c) {
    FUZZ_CHECK(c->vocab_size > 0 && c->hidden_size > 0 && c->intermediate_size > 0 && c->n_layers > 0);
    FUZZ_CHECK(c->n_heads > 0 && c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0);
    FUZZ_CHECK(c->head_dim > 0 && c->head_dim % 2 == 0);
    FUZZ_CHECK(c->max_position_embeddings > 0);
    FUZZ_CHECK(isfinite(c->rms_norm_eps) && c->rms_norm_eps >= 0);
    FUZZ_CHECK(isfinite(c->rope_theta) && c->rope_theta > 0);
    FUZZ_CHECK(c->n_eos >= 0 && c->n_eos <= NS_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++) FUZZ_CHECK(c->eos_token_ids[i] >= 0);
    FUZZ_CHECK(c->bos_token_id >= -1);
    FUZZ_CHECK(memchr(c->arch_name, 0, sizeof c->arch_name) != NULL);
    /* sizes the engine computes from it stay in 64 bits */
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    FUZZ_CHECK(q > 0 && kv > 0);
    if (c->head_dim <= 4096) {
        float *f = malloc((size_t)c->head_dim / 2 * sizeof *f);
        FUZZ_CHECK(f != NULL);
        ns_rope_inv_freq(c, f);
        for (int i = 0; i < c->head_dim / 2; i++) FUZZ_CHECK(isfinite(f[i]) && f[i] >= 0);
        free(f);
    }
}

/* True when v (an integer or an array of them) holds exactly id. */
static bool json_has_id(const json_t *v, int32_t id) {
    if (json_is_integer(v)) return json_integer_value(v) == id;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) if (json_is_integer(e) && json_integer_value(e) == id) return true;
    return false;
}

/* The ids in cfg are the ones the files give, never a wrapped value
 * (2^32 + 2 read as 2): EOS from generation_config.json when it has them,
 * else config.json; BOS likewise, or -1. */
static void check_ids(const ns_model_config *c, const json_t *cfg, const json_t *gen) {
    const json_t *ge = json_is_object(gen) ? json_object_get(gen, "eos_token_id") : NULL;
    const json_t *eos = ge && !json_is_null(ge) ? ge : json_object_get(cfg, "eos_token_id");
    for (int i = 0; i < c->n_eos; i++) FUZZ_CHECK(json_has_id(eos, c->eos_token_ids[i]));
    if (c->bos_token_id >= 0) {
        FUZZ_CHECK(c->bos_token_id < c->vocab_size);
        const json_t *gb = json_is_object(gen) ? json_object_get(gen, "bos_token_id") : NULL;
        FUZZ_CHECK((json_is_integer(gb) && json_integer_value(gb) == c->bos_token_id) ||
                   (json_is_integer(json_object_get(cfg, "bos_token_id")) &&
                    json_integer_value(json_object_get(cfg, "bos_token_id")) == c->bos_token_id));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data;
    const char *nul = memchr(p, 0, size);
    size_t n1 = nul ? (size_t)(nul - p) : size;
    json_error_t je;
    json_t *cfg = json_loadb(p, n1, JSON_DECODE_ANY, &je);
    json_t *gen = nul ? json_loadb(nul + 1, size - n1 - 1, JSON_DECODE_ANY, &je) : NULL;
    if (cfg) {
        ns_model_config c;
        ns_error err = {0};
        memset(&c, 0xa5, sizeof c);
        ns_status st = ns_config_from_json(cfg, gen, &c, &err);
        if (st == NS_OK) {
            check_accepted(&c);
            check_ids(&c, cfg, gen);
        }
        else FUZZ_CHECK(err.msg[0] != 0);
    }
    json_decref(cfg);
    json_decref(gen);
    return 0;
}
