/* Model loading on bad input: every case must fail with one clear message
 * (naming the file or tensor), never crash. Each case builds a damaged copy
 * of tinystories-656k in a temp directory. */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"
#include "util/file.h"

static char g_dir[256];
static char *g_st;      /* original safetensors bytes */
static size_t g_st_len;
static char *g_config;

static void write_file(const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void reset_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ns_model_test_%d", (int)getpid());
    mkdir(g_dir, 0700);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", g_dir);
    unlink(p);
    write_file("config.json", g_config, strlen(g_config));
    write_file("model.safetensors", g_st, g_st_len);
}

/* Rewrites the safetensors header through fn, keeping the data section. */
static void write_with_header(void (*fn)(json_t *h)) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)g_st[i] << (8 * i);
    json_t *h = json_loadb(g_st + 8, (size_t)hlen, 0, NULL);
    fn(h);
    char *txt = json_dumps(h, JSON_COMPACT);
    size_t n = strlen(txt), data = g_st_len - 8 - (size_t)hlen;
    char *out = malloc(8 + n + data);
    for (int i = 0; i < 8; i++) out[i] = (char)((uint64_t)n >> (8 * i));
    memcpy(out + 8, txt, n);
    memcpy(out + 8 + n, g_st + 8 + hlen, data);
    write_file("model.safetensors", out, 8 + n + data);
    free(out);
    free(txt);
    json_decref(h);
}

static ns_status load(ns_error *err) {
    ns_backend *be = NULL;
    ns_model *m = NULL;
    ns_status rc = ns_backend_cpu_create(1, &be, err);
    if (rc == NS_OK) rc = ns_model_load(g_dir, be, &m, err);
    ns_model_free(m);
    if (be) be->ops->destroy(be);
    return rc;
}

#define EXPECT_FAIL(substr)                                                      \
    do {                                                                         \
        ns_error err = {0};                                                      \
        ns_status rc = load(&err);                                               \
        CHECKF(rc != NS_OK, "load unexpectedly succeeded");                      \
        CHECKF(strstr(err.msg, substr) != NULL, "message \"%s\" lacks \"%s\"", err.msg, substr); \
    } while (0)

TEST(intact_copy_loads) {
    reset_dir();
    ns_error err = {0};
    CHECKF(load(&err) == NS_OK, "%s", err.msg);
}

TEST(bad_config_json) {
    reset_dir();
    write_file("config.json", "{\"architectures\": [", 19);
    EXPECT_FAIL("config.json");
}

TEST(missing_config) {
    reset_dir();
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", g_dir);
    unlink(p);
    EXPECT_FAIL("config.json");
}

TEST(unknown_architecture) {
    reset_dir();
    const char *c = "{\"architectures\": [\"GPTNeoXForCausalLM\"], \"vocab_size\": 10}";
    write_file("config.json", c, strlen(c));
    EXPECT_FAIL("unknown architecture");
}

TEST(config_value_out_of_range) {
    reset_dir();
    json_t *c = json_loads(g_config, 0, NULL);
    json_object_set_new(c, "num_hidden_layers", json_integer(-3));
    char *t = json_dumps(c, 0);
    write_file("config.json", t, strlen(t));
    free(t);
    json_decref(c);
    EXPECT_FAIL("num_hidden_layers");
}

TEST(truncated_file) {
    reset_dir();
    write_file("model.safetensors", g_st, g_st_len / 2);
    EXPECT_FAIL("past the end");
}

TEST(corrupt_header_length) {
    reset_dir();
    char *c = malloc(g_st_len);
    memcpy(c, g_st, g_st_len);
    c[6] = 0x7f; /* header length ~ 2^55 */
    write_file("model.safetensors", c, g_st_len);
    free(c);
    EXPECT_FAIL("header length");
}

TEST(garbage_header) {
    reset_dir();
    char *c = malloc(g_st_len);
    memcpy(c, g_st, g_st_len);
    memset(c + 8, '#', 32);
    write_file("model.safetensors", c, g_st_len);
    free(c);
    EXPECT_FAIL("not valid JSON");
}

TEST(empty_file) {
    reset_dir();
    write_file("model.safetensors", "", 0);
    EXPECT_FAIL("empty");
}

static void drop_norm(json_t *h) { json_object_del(h, "model.norm.weight"); }
TEST(missing_tensor) {
    reset_dir();
    write_with_header(drop_norm);
    EXPECT_FAIL("missing tensor \"model.norm.weight\"");
}

static void add_bias(json_t *h) {
    /* empty: its data may not overlap another tensor's */
    json_t *t = json_pack("{s:s,s:[i],s:[i,i]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0);
    json_object_set_new(h, "model.layers.0.self_attn.q_proj.bias", t);
}
TEST(unexpected_tensor) {
    reset_dir();
    write_with_header(add_bias);
    EXPECT_FAIL("unexpected tensor \"model.layers.0.self_attn.q_proj.bias\"");
}

/* data_offsets of model.norm.weight moved by `shift` bytes onto the start of
 * layer 0's input_layernorm.weight (same shape): the two share bytes. */
static void overlap_by(json_t *h, json_int_t shift) {
    json_t *a = json_object_get(json_object_get(h, "model.layers.0.input_layernorm.weight"), "data_offsets");
    json_t *b = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    json_int_t begin = json_integer_value(json_array_get(a, 0)) + shift;
    json_int_t len = json_integer_value(json_array_get(b, 1)) - json_integer_value(json_array_get(b, 0));
    json_array_set_new(b, 0, json_integer(begin));
    json_array_set_new(b, 1, json_integer(begin + len));
}
static void overlap_same(json_t *h) { overlap_by(h, 0); }
static void overlap_partly(json_t *h) { overlap_by(h, 2); }
TEST(overlapping_data_offsets) {
    reset_dir();
    write_with_header(overlap_same);
    EXPECT_FAIL("overlap");
    reset_dir();
    write_with_header(overlap_partly);
    EXPECT_FAIL("overlap");
}

static void transpose_gate(json_t *h) {
    json_t *t = json_object_get(h, "model.layers.0.mlp.gate_proj.weight");
    json_object_set_new(t, "shape", json_pack("[i,i]", 128, 384));
}
TEST(wrong_shape) {
    reset_dir();
    write_with_header(transpose_gate);
    EXPECT_FAIL("has shape [128, 384], expected [384, 128]");
}

static void bad_offsets(json_t *h) {
    json_t *t = json_object_get(h, "model.norm.weight");
    json_object_set_new(t, "data_offsets", json_pack("[i,i]", 0, 100));
}
TEST(size_mismatch) {
    reset_dir();
    write_with_header(bad_offsets);
    EXPECT_FAIL("does not match its shape");
}

static void bad_dtype(json_t *h) {
    json_object_set_new(json_object_get(h, "model.norm.weight"), "dtype", json_string("I64"));
}
TEST(unsupported_dtype) {
    reset_dir();
    write_with_header(bad_dtype);
    EXPECT_FAIL("unsupported dtype");
}

TEST(bad_shard_index) {
    reset_dir();
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", g_dir);
    unlink(p);
    const char *ix = "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}";
    write_file("model.safetensors.index.json", ix, strlen(ix));
    EXPECT_FAIL("bad shard name");
}

/* A sharded checkpoint: the index names two shard files; each holds part
 * of the tensors (rewritten headers over the same data section). */
static const char *g_keep_prefix;
static void keep_only(json_t *h) {
    const char *key;
    void *tmp;
    json_t *v;
    json_object_foreach_safe(h, tmp, key, v) {
        bool layer0 = strncmp(key, "model.layers.0.", 15) == 0;
        bool keep = strcmp(g_keep_prefix, "layer0") == 0 ? layer0 : !layer0;
        if (strcmp(key, "__metadata__") != 0 && !keep) json_object_del(h, key);
    }
}
TEST(sharded_checkpoint_loads) {
    reset_dir();
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/model.safetensors", g_dir);
    g_keep_prefix = "layer0";
    write_with_header(keep_only);
    snprintf(b, sizeof b, "%s/model-00001-of-00002.safetensors", g_dir);
    CHECK(rename(a, b) == 0);
    g_keep_prefix = "rest";
    write_with_header(keep_only);
    snprintf(b, sizeof b, "%s/model-00002-of-00002.safetensors", g_dir);
    CHECK(rename(a, b) == 0);
    const char *ix = "{\"metadata\": {}, \"weight_map\": {\"model.layers.0.mlp.up_proj.weight\": "
                     "\"model-00001-of-00002.safetensors\", \"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}";
    write_file("model.safetensors.index.json", ix, strlen(ix));
    ns_error e0 = {0};
    CHECKF(load(&e0) == NS_OK, "%s", e0.msg);
    /* a shard that is missing */
    unlink(b);
    EXPECT_FAIL("model-00002-of-00002.safetensors");
}

int main(void) {
    ns_error err = {0};
    char p[512];
    snprintf(p, sizeof p, "%s", test_shared_path("models/tinystories-656k/model.safetensors"));
    if (ns_file_read(p, 64u << 20, &g_st, &g_st_len, &err) != NS_OK ||
        ns_file_read(test_shared_path("models/tinystories-656k/config.json"), 1 << 20, &g_config, NULL, &err) != NS_OK) {
        printf("not ok - setup: %s\n", err.msg);
        return 1;
    }
    RUN(intact_copy_loads);
    RUN(bad_config_json);
    RUN(missing_config);
    RUN(unknown_architecture);
    RUN(config_value_out_of_range);
    RUN(truncated_file);
    RUN(corrupt_header_length);
    RUN(garbage_header);
    RUN(empty_file);
    RUN(missing_tensor);
    RUN(unexpected_tensor);
    RUN(wrong_shape);
    RUN(size_mismatch);
    RUN(unsupported_dtype);
    RUN(bad_shard_index);
    RUN(sharded_checkpoint_loads);
    RUN(overlapping_data_offsets);
    if (test_rmtree(g_dir) != 0) printf("# could not remove %s\n", g_dir);
    free(g_st);
    free(g_config);
    TEST_MAIN_END;
}
