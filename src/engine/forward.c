/* forward.c — one engine step over a ragged batch (see engine.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

size_t ns_engine_page_bytes(const ns_model_config *cfg, int32_t page_tokens, ns_dtype kv_dtype) {
    return ns_kv_page_bytes(cfg->n_layers, cfg->n_kv_heads, page_tokens, cfg->head_dim, kv_dtype);
}

ns_status ns_engine_create(ns_model *m, const ns_engine_opts *opts, ns_engine **out, ns_error *err) {
    *out = NULL;
    const ns_model_config *c = &m->cfg;
    if (opts->max_batch_tokens <= 0 || opts->max_logits <= 0 || opts->max_logits > opts->max_batch_tokens)
        return ns_fail(err, NS_ERR_INVALID, "engine: max_batch_tokens must be > 0 and >= max_logits > 0");
    if (opts->page_tokens <= 0 || opts->page_tokens > 4096)
        return ns_fail(err, NS_ERR_INVALID, "engine: page size must be in [1, 4096] tokens");
    if (opts->n_pages <= 0) return ns_fail(err, NS_ERR_INVALID, "engine: KV pool needs at least one page");
    /* whatever loaded the model: refuse ops the backend lacks before a step can call a NULL op */
    ns_status crc = ns_model_check_backend(c, m->be, err);
    if (crc != NS_OK) return crc;
    ns_engine *e = calloc(1, sizeof *e);
    if (!e) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    e->model = m;
    e->be = m->be;
    e->opts = *opts;
    ns_backend *be = m->be;
    const int64_t T = opts->max_batch_tokens, H = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim,
                  kvd = (int64_t)c->n_kv_heads * c->head_dim, ff = c->intermediate_size;
    struct {
        ns_tensor *t;
        int64_t rows, cols;
    } ws[] = {
        {&e->x, T, H},      {&e->xn, T, H},    {&e->q, T, qd},   {&e->k, T, kvd},
        {&e->v, T, kvd},    {&e->att, T, qd},  {&e->gate, T, ff}, {&e->up, T, ff},
        {&e->hid, opts->max_logits, H},        {&e->logits, opts->max_logits, c->vocab_size},
    };
    ns_status rc = NS_OK;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        rc = be->ops->tensor_alloc(be, ws[i].t, NS_DT_F32, ws[i].rows, ws[i].cols, err);
        if (rc != NS_OK) goto fail;
    }
    ns_kv_layout l = {
        .n_pages = opts->n_pages,
        .page_tokens = opts->page_tokens,
        .n_layers = c->n_layers,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .dtype = opts->kv_dtype,
        .page_size_bytes = ns_engine_page_bytes(c, opts->page_tokens, opts->kv_dtype),
    };
    rc = be->ops->kv_alloc(be, &l, err);
    if (rc != NS_OK) goto fail;
    *out = e;
    return NS_OK;
fail:
    ns_engine_free(e);
    return rc;
}

void ns_engine_free(ns_engine *e) {
    if (!e) return;
    ns_backend *be = e->be;
    ns_tensor *ts[] = {&e->x, &e->xn, &e->q, &e->k, &e->v, &e->att, &e->gate, &e->up, &e->hid, &e->logits};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (ts[i]->data) be->ops->tensor_free(be, ts[i]);
    if (be->kv.n_pages) be->ops->kv_free(be);
    free(e);
}

static inline ns_tensor view(const ns_tensor *t, int64_t rows, int64_t cols) {
    ns_tensor v = *t;
    v.rows = rows;
    v.cols = cols;
    v.alloc = NULL;
    return v;
}

ns_status ns_engine_forward(ns_engine *e, const ns_batch *b, ns_error *err) {
    const ns_model *m = e->model;
    const ns_model_config *c = &m->cfg;
    ns_backend *be = e->be;
    const ns_backend_ops *o = be->ops;
    if (b->n_tokens <= 0 || b->n_tokens > e->opts.max_batch_tokens)
        return ns_fail(err, NS_ERR_INVALID, "forward: %d tokens (max %d)", b->n_tokens, e->opts.max_batch_tokens);
    if (b->n_logits < 0 || b->n_logits > e->opts.max_logits)
        return ns_fail(err, NS_ERR_INVALID, "forward: %d logits rows (max %d)", b->n_logits, e->opts.max_logits);
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return ns_fail(err, NS_ERR_RANGE, "forward: token id %d is outside the vocabulary (%d)", b->tokens[i],
                           c->vocab_size);
    ns_status rc = o->set_batch(be, b, err);
    if (rc != NS_OK) return rc;
    /* Everything below depends only on the model, this engine's workspace
     * and (n_tokens, n_logits): the step memo's id (backend.h). The
     * engine's address tells engines sharing a backend apart; a freed
     * engine's tensors invalidate the backend's memo. */
    const uint64_t memo_id =
        ns_mix64((uint64_t)(uintptr_t)e ^ ns_mix64(((uint64_t)(uint32_t)b->n_tokens << 32) | (uint32_t)b->n_logits));
    if (o->memo_replay && o->memo_replay(be, memo_id)) return NS_OK;

    const int64_t T = b->n_tokens, H = c->hidden_size, D = c->head_dim, NH = c->n_heads, NKV = c->n_kv_heads;
    ns_tensor x = view(&e->x, T, H), xn = view(&e->xn, T, H), q = view(&e->q, T, NH * D),
              k = view(&e->k, T, NKV * D), v = view(&e->v, T, NKV * D), att = view(&e->att, T, NH * D),
              gate = view(&e->gate, T, c->intermediate_size), up = view(&e->up, T, c->intermediate_size);
    const float scale = 1.0f / sqrtf((float)D);

    o->embed(be, &x, &m->embed);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const ns_layer_weights *w = &m->layers[l];
        o->rmsnorm(be, &xn, &x, &w->attn_norm, c->rms_norm_eps);
        o->matmul(be, &q, &xn, &w->wq);
        o->matmul(be, &k, &xn, &w->wk);
        o->matmul(be, &v, &xn, &w->wv);
        if (c->attn_bias) { /* Qwen2 */
            o->add_bias(be, &q, &w->bq);
            o->add_bias(be, &k, &w->bk);
            o->add_bias(be, &v, &w->bv);
        }
        if (c->qk_norm) {
            /* Qwen3 normalizes each head of q and k before RoPE */
            ns_tensor qh = view(&q, T * NH, D), kh = view(&k, T * NKV, D);
            o->rmsnorm(be, &qh, &qh, &w->q_norm, c->rms_norm_eps);
            o->rmsnorm(be, &kh, &kh, &w->k_norm, c->rms_norm_eps);
        }
        o->rope(be, &q, (int)NH, (int)D, &m->rope_inv_freq);
        o->rope(be, &k, (int)NKV, (int)D, &m->rope_inv_freq);
        o->kv_store(be, l, &k, &v);
        o->attention(be, &att, &q, l, (int)NH, scale);
        o->matmul(be, &xn, &att, &w->wo);
        o->add(be, &x, &xn);
        o->rmsnorm(be, &xn, &x, &w->ffn_norm, c->rms_norm_eps);
        if (w->experts) { /* a sparse layer: the experts add straight into the residual */
            o->moe_ffn(be, &x, &xn, &w->router, w->experts, c->n_experts, c->n_experts_per_tok, c->norm_topk_prob);
            continue;
        }
        o->matmul(be, &gate, &xn, &w->w_gate);
        o->matmul(be, &up, &xn, &w->w_up);
        o->swiglu(be, &gate, &gate, &up);
        o->matmul(be, &xn, &gate, &w->w_down);
        o->add(be, &x, &xn);
    }
    if (b->n_logits > 0) {
        ns_tensor hid = view(&e->hid, b->n_logits, H), logits = view(&e->logits, b->n_logits, c->vocab_size);
        o->gather_rows(be, &hid, &x);
        o->rmsnorm(be, &hid, &hid, &m->final_norm, c->rms_norm_eps);
        o->matmul(be, &logits, &hid, &m->lm_head);
    }
    if (o->memo_save) o->memo_save(be, memo_id);
    return NS_OK;
}

ns_status ns_engine_read_logits(ns_engine *e, int32_t n, float *dst, ns_error *err) {
    if (n < 0 || n > e->opts.max_logits) return ns_fail(err, NS_ERR_RANGE, "read_logits: bad row count %d", n);
    ns_tensor l = view(&e->logits, n, e->logits.cols);
    return e->be->ops->tensor_download(e->be, &l, dst, err);
}
