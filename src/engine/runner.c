#include "engine/runner.h"

#include <stdlib.h>
#include <string.h>

ns_status ns_runner_init(ns_runner *r, ns_engine *e, ns_error *err) {
    memset(r, 0, sizeof *r);
    r->e = e;
    ns_status rc = ns_kv_pages_init(&r->pages, e->opts.n_pages, err);
    if (rc != NS_OK) return rc;
    r->max_pages = e->opts.n_pages;
    r->page_table = malloc((size_t)r->max_pages * sizeof(int32_t));
    size_t nl = (size_t)e->opts.max_logits * (size_t)e->model->cfg.vocab_size;
    r->logits = malloc(nl * sizeof(float));
    if (!r->page_table || !r->logits) {
        ns_runner_free(r);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory for %zu logits", nl);
    }
    return NS_OK;
}

void ns_runner_free(ns_runner *r) {
    ns_kv_pages_free(&r->pages);
    free(r->page_table);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

void ns_runner_reset(ns_runner *r) {
    for (int32_t i = 0; i < r->n_held; i++) ns_kv_pages_unref(&r->pages, r->page_table[i], false);
    r->n_held = 0;
    r->n_ctx = 0;
}

ns_status ns_runner_feed(ns_runner *r, const int32_t *tokens, int32_t n, bool all_logits, ns_runner_logits_fn on_logits,
                         void *ctx, ns_error *err) {
    ns_engine *e = r->e;
    const int32_t P = e->opts.page_tokens;
    const int32_t chunk_max = all_logits ? e->opts.max_logits : e->opts.max_batch_tokens;
    int32_t *pos = malloc((size_t)chunk_max * sizeof(int32_t));
    int32_t *rows = malloc((size_t)chunk_max * sizeof(int32_t));
    ns_status rc = NS_OK;
    if (!pos || !rows) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int32_t done_n = 0; done_n < n;) {
        int32_t cn = n - done_n < chunk_max ? n - done_n : chunk_max;
        int32_t new_len = r->n_ctx + cn;
        if (new_len > e->model->cfg.max_position_embeddings) {
            rc = ns_fail(err, NS_ERR_FULL, "sequence of %d tokens exceeds the model's context (%d)", new_len,
                         e->model->cfg.max_position_embeddings);
            goto done;
        }
        while (r->n_held * P < new_len) {
            int32_t pg = r->n_held < r->max_pages ? ns_kv_pages_alloc(&r->pages) : -1;
            if (pg < 0) {
                rc = ns_fail(err, NS_ERR_FULL, "KV pool is full (%d pages of %d tokens)", r->max_pages, P);
                goto done;
            }
            r->page_table[r->n_held++] = pg;
        }
        for (int32_t i = 0; i < cn; i++) pos[i] = r->n_ctx + i;
        int32_t n_logits = 0;
        bool last_chunk = done_n + cn == n;
        if (all_logits) {
            for (int32_t i = 0; i < cn; i++) rows[i] = i;
            n_logits = cn;
        } else if (last_chunk) {
            rows[0] = cn - 1;
            n_logits = 1;
        }
        int32_t seq_start[2] = {0, cn};
        ns_batch b = {
            .n_tokens = cn,
            .n_seqs = 1,
            .tokens = tokens + done_n,
            .positions = pos,
            .seq_start = seq_start,
            .seq_len = &new_len,
            .page_table = r->page_table,
            .max_pages = r->n_held,
            .logit_rows = rows,
            .n_logits = n_logits,
        };
        rc = ns_engine_forward(e, &b, err);
        if (rc != NS_OK) goto done;
        r->n_ctx = new_len;
        if (n_logits > 0) {
            rc = ns_engine_read_logits(e, n_logits, r->logits, err);
            if (rc != NS_OK) goto done;
            if (on_logits) on_logits(ctx, all_logits ? new_len - cn : new_len - 1, n_logits, r->logits);
        } else {
            rc = e->be->ops->sync(e->be, err);
            if (rc != NS_OK) goto done;
        }
        done_n += cn;
    }
done:
    free(pos);
    free(rows);
    return rc;
}
