/* engine.h — the forward pass over a ragged batch, on any backend.
 *
 * An engine binds a model to its backend, owns the step workspace (sized
 * for max_batch_tokens new tokens and max_logits logits rows) and the KV
 * page pool geometry. ns_engine_forward runs one step: embeddings, every
 * layer (norm, q/k/v projections, optional q/k norm, RoPE, KV store into
 * pages, paged attention, output projection, SwiGLU MLP), final norm, and
 * the LM head for the batch's logit_rows only. The caller (scheduler or
 * CLI runner) owns page allocation and the page tables it puts in the
 * batch; the engine never decides which page a token goes to.
 *
 * Threading: an engine is used by exactly one thread (the engine thread).
 */
#ifndef NS_ENGINE_H
#define NS_ENGINE_H

#include "backend/backend.h"
#include "model/model.h"
#include "sample/sample.h"

typedef struct ns_engine_opts {
    int32_t max_batch_tokens; /* new tokens per step (workspace rows) */
    int32_t max_logits;       /* logits rows per step */
    int32_t page_tokens;      /* P */
    int32_t n_pages;          /* pool size in pages */
    ns_dtype kv_dtype;        /* F32 on CPU; BF16 on CUDA */
} ns_engine_opts;

typedef struct ns_engine {
    ns_model *model;      /* borrowed */
    ns_backend *be;       /* borrowed (== model->be) */
    ns_engine_opts opts;
    /* workspace, F32 */
    ns_tensor x, xn, q, k, v, att, gate, up, hid, logits;
} ns_engine;

/* Allocates the workspace and the KV pool on the backend. */
ns_status ns_engine_create(ns_model *m, const ns_engine_opts *opts, ns_engine **out, ns_error *err);
void ns_engine_free(ns_engine *e);
/* Runs one step. b->n_tokens <= max_batch_tokens, b->n_logits <= max_logits.
 * Afterwards e->logits rows [0, n_logits) hold the logits (enqueued). */
ns_status ns_engine_forward(ns_engine *e, const ns_batch *b, ns_error *err);
/* Copies the first n rows of logits to host (sync point). */
ns_status ns_engine_read_logits(ns_engine *e, int32_t n, float *dst, ns_error *err);
/* KV bytes of one page for this model (all layers, K and V). */
size_t ns_engine_page_bytes(const ns_model_config *cfg, int32_t page_tokens, ns_dtype kv_dtype);

#endif
