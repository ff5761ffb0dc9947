/* test_forward_memo.c — the engine's side of the step memo (backend.h
 * memo_save / memo_replay): which ids a step asks for and saves under
 * (one per shape), that a replayed step issues no ops of its
 * own, and that a refused replay issues all of them. The CUDA memo itself
 * (a replayed step's logits bit-identical to a recorded one's) is tested
 * in tests/gpu/test_decode_fused.c. */
#include <jansson.h>

#include "engine/engine.h"
#include "model/model.h"
#include "test.h"

/* The CPU backend with fake memo ops that only remember the id, and its
 * matmul wrapped to count the ops the engine issues. */
static ns_backend_ops g_ops;
static const ns_backend_ops *g_real;
static int g_matmuls, g_saves, g_replays_asked, g_replays_done;
static uint64_t g_saved_id, g_asked_id;
static bool g_saved, g_refuse;

static void count_matmul(ns_backend *be, ns_tensor *out, const ns_tensor *in, const ns_tensor *w) {
    g_matmuls++;
    g_real->matmul(be, out, in, w);
}

static void fake_save(ns_backend *be, uint64_t id) {
    (void)be;
    g_saves++;
    g_saved_id = id;
    g_saved = true;
}

static bool fake_replay(ns_backend *be, uint64_t id) {
    (void)be;
    g_replays_asked++;
    g_asked_id = id;
    if (g_refuse || !g_saved || id != g_saved_id) return false;
    g_replays_done++;
    return true;
}

static const char CFG[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 64, \"hidden_size\": 32,"
    " \"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 8, \"max_position_embeddings\": 256, \"rope_theta\": 10000.0}";

typedef struct {
    int32_t tok[4], pos[4], start[3], len[2], pages[4], rows[2];
} step_buf;

/* A batch of n_seqs sequences, each with n_new tokens after ctx tokens,
 * n_logits rows of logits. Sequence s uses pages 2s, 2s + 1. */
static ns_batch make_batch(step_buf *sb, int n_seqs, int n_new, int ctx, int n_logits) {
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        sb->start[s] = t;
        sb->len[s] = ctx + n_new;
        sb->pages[2 * s] = 2 * s;
        sb->pages[2 * s + 1] = 2 * s + 1;
        for (int j = 0; j < n_new; j++, t++) {
            sb->tok[t] = (7 * t + 3 * ctx + s) % 64;
            sb->pos[t] = ctx + j;
        }
        if (s < n_logits) sb->rows[s] = t - 1;
    }
    sb->start[n_seqs] = t;
    return (ns_batch){.n_tokens = t, .n_seqs = n_seqs, .tokens = sb->tok, .positions = sb->pos,
                      .seq_start = sb->start, .seq_len = sb->len, .page_table = sb->pages, .max_pages = 2,
                      .logit_rows = sb->rows, .n_logits = n_logits};
}

TEST(memo_ids_and_skipped_ops) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    if (!be) return;
    g_real = be->ops;
    g_ops = *g_real;
    g_ops.matmul = count_matmul;
    g_ops.memo_save = fake_save;
    g_ops.memo_replay = fake_replay;
    be->ops = &g_ops;
    json_t *j = json_loads(CFG, 0, NULL);
    ns_model_config c;
    CHECKF(ns_config_from_json(j, NULL, &c, &err) == NS_OK, "%s", err.msg);
    json_decref(j);
    ns_model *m = NULL;
    ns_engine *e = NULL;
    CHECKF(ns_model_create_random(&c, be, NS_DT_F32, 3, &m, &err) == NS_OK, "%s", err.msg);
    ns_engine_opts eo = {.max_batch_tokens = 4, .max_logits = 2, .page_tokens = 16, .n_pages = 4,
                         .kv_dtype = NS_DT_F32};
    if (m) CHECK(ns_engine_create(m, &eo, &e, &err) == NS_OK);
    if (!e) goto done;
    step_buf sb;
    /* a 2-token prefill of one sequence: asked, refused, all ops, saved */
    ns_batch b = make_batch(&sb, 1, 2, 0, 1);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    const int per_step = g_matmuls; /* 7 per layer + the LM head */
    CHECK_EQ_INT(per_step, 2 * 7 + 1);
    CHECK(g_replays_asked == 1 && g_replays_done == 0 && g_saves == 1 && g_asked_id == g_saved_id);
    const uint64_t id_prefill = g_saved_id;
    /* a decode step: another shape, another id, all ops again */
    b = make_batch(&sb, 1, 1, 2, 1);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    CHECK_EQ_INT(g_matmuls, 2 * per_step);
    CHECK(g_saves == 2 && g_saved_id != id_prefill && g_replays_done == 0);
    const uint64_t id_decode = g_saved_id;
    /* the next decode step of that shape is replayed: no op is issued
     * by the engine and nothing is saved again */
    b = make_batch(&sb, 1, 1, 3, 1);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    CHECK_EQ_INT(g_matmuls, 2 * per_step);
    CHECK(g_replays_done == 1 && g_saves == 2 && g_asked_id == id_decode);
    /* refused by the backend: the engine issues every op and saves */
    g_refuse = true;
    b = make_batch(&sb, 1, 1, 4, 1);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    CHECK_EQ_INT(g_matmuls, 3 * per_step);
    CHECK(g_saves == 3 && g_saved_id == id_decode);
    g_refuse = false;
    /* no logits rows, two sequences: each its own id */
    b = make_batch(&sb, 1, 1, 5, 0);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    CHECK(g_asked_id != id_decode && g_asked_id != id_prefill);
    const uint64_t id_nolog = g_asked_id;
    b = make_batch(&sb, 2, 1, 5, 2);
    CHECK(ns_engine_forward(e, &b, &err) == NS_OK);
    CHECK(g_asked_id != id_decode && g_asked_id != id_prefill && g_asked_id != id_nolog);
    /* a step that fails validation asks for nothing */
    const int asked = g_replays_asked;
    b = make_batch(&sb, 1, 1, 7, 1);
    sb.tok[0] = 64; /* outside the vocabulary */
    CHECK(ns_engine_forward(e, &b, &err) == NS_ERR_RANGE);
    CHECK_EQ_INT(g_replays_asked, asked);
done:
    be->ops = g_real;
    ns_engine_free(e);
    ns_model_free(m);
    be->ops->destroy(be);
}

/* The CPU backend has no memo: every step issues its ops. */
TEST(cpu_backend_has_no_memo) {
    ns_backend *be = NULL;
    ns_error err = {0};
    CHECK(ns_backend_cpu_create(1, &be, &err) == NS_OK);
    if (!be) return;
    CHECK(be->ops->memo_save == NULL && be->ops->memo_replay == NULL);
    be->ops->destroy(be);
}

int main(void) {
    RUN(memo_ids_and_skipped_ops);
    RUN(cpu_backend_has_no_memo);
    TEST_MAIN_END;
}
