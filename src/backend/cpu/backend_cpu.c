/* backend_cpu.c — the CPU reference backend.
 *
 * Everything computes in float32 (weights F32 or BF16 read in place from
 * the safetensors mapping, converted on the fly; F16 converted at load).
 * This backend defines the reference results the goldens check, so
 * clarity wins over speed where they conflict; the hot loops (dot
 * products, attention) still use AVX2/FMA when the compiler targets it.
 * Ops run synchronously, spread over the thread pool.
 */
#include <math.h>
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "sample/sample.h"
#include "util/fp8.h"
#include "util/vec.h"

/* ------------------------------------------------------------------ memory */

static ns_status cpu_tensor_alloc(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols,
                                  ns_error *err) {
    memset(t, 0, sizeof *t);
    if (rows < 0 || cols < 0 || (cols && (uint64_t)rows > (SIZE_MAX / 8) / (uint64_t)cols))
        return ns_fail(err, NS_ERR_RANGE, "tensor of %lld x %lld is too large", (long long)rows, (long long)cols);
    size_t bytes = (size_t)rows * ns_dtype_row_bytes(dt, cols);
    /* 64-byte alignment for vector loads; round the size up as
     * aligned_alloc requires a multiple of the alignment. */
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
    ns_tensor_own(t, dt, rows, cols, p);
    return NS_OK;
}

static void cpu_tensor_free(ns_backend *be, ns_tensor *t) {
    free(t->alloc);
    memset(t, 0, sizeof *t);
}

static ns_status cpu_weight_from_host(ns_backend *be, ns_tensor *t, const void *src, ns_dtype src_dt, int64_t rows,
                                      int64_t cols, ns_error *err) {
    /* Matrices in F32/BF16/F16 are used in place (zero copy from the mmap)
     * when suitably aligned. The safetensors format does not promise
     * alignment (a header whose length is not a multiple of 4 shifts all
     * data), so misaligned matrices are copied into aligned memory.
     * Vectors (norm weights) are converted to owned F32 so the
     * elementwise ops only ever see F32. */
    if (ns_dtype_is_quant(src_dt)) { /* GGUF blocks: byte-addressed, used in place (quant.h) */
        memset(t, 0, sizeof *t);
        t->dtype = src_dt;
        t->rows = rows;
        t->cols = cols;
        t->data = (void *)src;
        return NS_OK;
    }
    const size_t esz = ns_dtype_size(src_dt), n = (size_t)rows * (size_t)cols;
    const bool aligned = ((uintptr_t)src % esz) == 0;
    if (rows > 1 && (src_dt == NS_DT_F32 || src_dt == NS_DT_BF16 || src_dt == NS_DT_F16)) {
        if (aligned) {
            memset(t, 0, sizeof *t);
            t->dtype = src_dt;
            t->rows = rows;
            t->cols = cols;
            t->data = (void *)src;
            return NS_OK;
        }
        ns_status rc = cpu_tensor_alloc(be, t, src_dt, rows, cols, err);
        if (rc == NS_OK) memcpy(t->data, src, n * esz);
        return rc;
    }
    ns_status rc = cpu_tensor_alloc(be, t, NS_DT_F32, rows, cols, err);
    if (rc != NS_OK) return rc;
    float *dst = t->data;
    const unsigned char *p = src;
    for (size_t i = 0; i < n; i++) {
        if (src_dt == NS_DT_F32) {
            memcpy(&dst[i], p + i * 4, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + i * 2, 2);
            dst[i] = src_dt == NS_DT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    return NS_OK;
}

static ns_status cpu_weight_random(ns_backend *be, ns_tensor *t, ns_dtype dt, int64_t rows, int64_t cols,
                                   uint64_t seed, float scale, ns_error *err) {
    ns_dtype store = rows > 1 && dt == NS_DT_BF16 ? NS_DT_BF16 : NS_DT_F32;
    ns_status rc = cpu_tensor_alloc(be, t, store, rows, cols, err);
    if (rc != NS_OK) return rc;
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++) {
        float v = ns_random_weight(seed, i) * scale;
        if (store == NS_DT_BF16) ((uint16_t *)t->data)[i] = f32_to_bf16(v);
        else ((float *)t->data)[i] = dt == NS_DT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
    }
    return NS_OK;
}

static ns_status cpu_tensor_upload(ns_backend *be, ns_tensor *t, const float *src, ns_error *err) {
    if (t->dtype != NS_DT_F32) return ns_fail(err, NS_ERR_INVALID, "tensor_upload: tensor is not F32");
    memcpy(t->data, src, ns_tensor_bytes(t));
    return NS_OK;
}

static ns_status cpu_tensor_download(ns_backend *be, const ns_tensor *t, float *dst, ns_error *err) {
    if (t->dtype == NS_DT_F32) {
        memcpy(dst, t->data, ns_tensor_bytes(t));
        return NS_OK;
    }
    float *tmp = malloc((size_t)t->cols * sizeof *tmp);
    if (!tmp) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < t->rows; r++) memcpy(dst + r * t->cols, row_f32(t, r, tmp), (size_t)t->cols * 4);
    free(tmp);
    return NS_OK;
}

/* ---------------------------------------------------------------- KV pool */

static ns_status cpu_kv_alloc(ns_backend *be, const ns_kv_layout *layout, ns_error *err) {
    cpu_impl *c = be->impl;
    if (layout->dtype != NS_DT_F32 && layout->dtype != NS_DT_FP8_E4M3)
        return ns_fail(err, NS_ERR_UNSUPPORTED, "cpu backend: KV dtype must be f32 or fp8 (got %s)",
                       ns_dtype_name(layout->dtype));
    if (c->kv) return ns_fail(err, NS_ERR_INVALID, "cpu backend: KV pool already allocated");
    if (layout->n_pages <= 0 || layout->page_tokens <= 0 || layout->head_dim <= 0 || layout->n_kv_heads <= 0 ||
        layout->n_layers <= 0 || layout->page_size_bytes == 0 ||
        (size_t)layout->n_pages > SIZE_MAX / layout->page_size_bytes)
        return ns_fail(err, NS_ERR_RANGE, "cpu backend: bad KV pool geometry");
    size_t expect = ns_kv_page_bytes(layout->n_layers, layout->n_kv_heads, layout->page_tokens, layout->head_dim,
                                     layout->dtype);
    if (layout->page_size_bytes != expect)
        return ns_fail(err, NS_ERR_INVALID, "cpu backend: page_size_bytes %zu != %zu implied by the layout",
                       layout->page_size_bytes, expect);
    size_t bytes = (size_t)layout->n_pages * layout->page_size_bytes;
    c->kv = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!c->kv) return ns_fail(err, NS_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes of KV pool", bytes);
    /* Fill with NaN: reading a slot nothing wrote must poison the result
     * visibly instead of silently attending to zeros. */
    if (layout->dtype == NS_DT_FP8_E4M3) {
        for (int i = 0; i < 256; i++) c->fp8_lut[i] = ns_fp8_e4m3_to_float((uint8_t)i);
        /* 0x7f is the e4m3 NaN code; the scales (0x7f7f7f7f would be a
         * finite float) are set to NaN separately */
        memset(c->kv, 0x7f, bytes);
        for (int32_t p = 0; p < layout->n_pages; p++)
            for (size_t o = ns_kv_scale_offset(layout, 0, 0, 0); o < layout->page_size_bytes; o += 4) {
                float nan = NAN;
                memcpy(c->kv + (size_t)p * layout->page_size_bytes + o, &nan, 4);
            }
    } else {
        float nan = NAN;
        for (size_t i = 0; i < bytes / 4; i++) ((float *)c->kv)[i] = nan;
    }
    be->kv = *layout;
    /* attention: accumulator + scores, and (FP8) one page's K and V rows dequantized */
    size_t need = (size_t)layout->head_dim + (size_t)layout->page_tokens;
    if (layout->dtype == NS_DT_FP8_E4M3) need += 2 * (size_t)layout->page_tokens * (size_t)layout->head_dim;
    if (ns_cpu_scratch_reserve(c, need) != 0) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    return NS_OK;
}

static void cpu_kv_free(ns_backend *be) {
    cpu_impl *c = be->impl;
    free(c->kv);
    c->kv = NULL;
    memset(&be->kv, 0, sizeof be->kv);
}

static ns_status check_page(ns_backend *be, int32_t page, ns_error *err) {
    cpu_impl *c = be->impl;
    if (!c->kv) return ns_fail(err, NS_ERR_INVALID, "KV pool not allocated");
    if (page < 0 || page >= be->kv.n_pages) return ns_fail(err, NS_ERR_RANGE, "KV page %d out of range", page);
    return NS_OK;
}

static ns_status cpu_kv_page_read(ns_backend *be, int32_t page, void *dst, ns_error *err) {
    ns_status rc = check_page(be, page, err);
    if (rc != NS_OK) return rc;
    cpu_impl *c = be->impl;
    memcpy(dst, c->kv + (size_t)page * be->kv.page_size_bytes, be->kv.page_size_bytes);
    return NS_OK;
}

static ns_status cpu_kv_page_write(ns_backend *be, int32_t page, const void *src, ns_error *err) {
    ns_status rc = check_page(be, page, err);
    if (rc != NS_OK) return rc;
    cpu_impl *c = be->impl;
    memcpy(c->kv + (size_t)page * be->kv.page_size_bytes, src, be->kv.page_size_bytes);
    return NS_OK;
}

static void cpu_kv_page_copy(ns_backend *be, int32_t dst_page, int32_t src_page, int32_t n_slots) {
    cpu_impl *c = be->impl;
    const ns_kv_layout *l = &be->kv;
    uint8_t *dst = c->kv + (size_t)dst_page * l->page_size_bytes;
    const uint8_t *src = c->kv + (size_t)src_page * l->page_size_bytes;
    size_t run = (size_t)n_slots * (size_t)l->head_dim * ns_dtype_size(l->dtype);
    for (int layer = 0; layer < l->n_layers; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < l->n_kv_heads; h++) {
                size_t off = ns_kv_offset(l, layer, kv, h, 0);
                memcpy(dst + off, src + off, run);
            }
    /* FP8: the copied codes mean something only under their scales */
    if (l->dtype == NS_DT_FP8_E4M3) {
        const size_t so = ns_kv_scale_offset(l, 0, 0, 0);
        memcpy(dst + so, src + so, l->page_size_bytes - so);
    }
}

/* ------------------------------------------------------------------ batch */

static ns_status grow(int32_t **p, size_t *cap, size_t need, ns_error *err) {
    if (NS_VEC_GROW(*p, *cap, need, 0) != NS_OK) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    return NS_OK;
}

static ns_status cpu_set_batch(ns_backend *be, const ns_batch *b, ns_error *err) {
    cpu_impl *c = be->impl;
    if (b->n_tokens < 0 || b->n_seqs < 0 || b->n_logits < 0 || b->max_pages < 0)
        return ns_fail(err, NS_ERR_INVALID, "set_batch: negative size");
    size_t nt = (size_t)b->n_tokens + 1, ns = (size_t)b->n_seqs + 1;
    ns_status rc = grow(&c->tokens, &c->cap_tok, nt, err);
    if (rc == NS_OK) rc = grow(&c->positions, &c->cap_pos, nt, err);
    if (rc == NS_OK) rc = grow(&c->tok_seq, &c->cap_tseq, nt, err);
    if (rc == NS_OK) rc = grow(&c->seq_start, &c->cap_ss, ns, err);
    if (rc == NS_OK) rc = grow(&c->seq_len, &c->cap_sl, ns, err);
    if (rc == NS_OK) rc = grow(&c->page_table, &c->cap_pt, (size_t)b->n_seqs * (size_t)b->max_pages + 1, err);
    if (rc == NS_OK) rc = grow(&c->logit_rows, &c->cap_lr, (size_t)b->n_logits + 1, err);
    if (rc != NS_OK) return rc;
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return ns_fail(err, NS_ERR_INVALID, "set_batch: seq_start does not cover the tokens");
    memcpy(c->tokens, b->tokens, (size_t)b->n_tokens * 4);
    memcpy(c->positions, b->positions, (size_t)b->n_tokens * 4);
    memcpy(c->seq_start, b->seq_start, ((size_t)b->n_seqs + 1) * 4);
    memcpy(c->seq_len, b->seq_len, (size_t)b->n_seqs * 4);
    memcpy(c->page_table, b->page_table, (size_t)b->n_seqs * (size_t)b->max_pages * 4);
    memcpy(c->logit_rows, b->logit_rows, (size_t)b->n_logits * 4);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        if (b->seq_start[s + 1] < b->seq_start[s])
            return ns_fail(err, NS_ERR_INVALID, "set_batch: seq_start not ascending");
        int32_t need_pages = be->kv.page_tokens ? (b->seq_len[s] + be->kv.page_tokens - 1) / be->kv.page_tokens : 0;
        if (need_pages > b->max_pages) return ns_fail(err, NS_ERR_INVALID, "set_batch: page table too short");
        for (int32_t p = 0; p < need_pages; p++) {
            int32_t pg = b->page_table[(size_t)s * (size_t)b->max_pages + (size_t)p];
            if (pg < 0 || pg >= be->kv.n_pages) return ns_fail(err, NS_ERR_RANGE, "set_batch: bad page %d", pg);
        }
        for (int32_t t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            if (b->positions[t] < 0 || b->positions[t] >= b->seq_len[s])
                return ns_fail(err, NS_ERR_INVALID, "set_batch: position outside the sequence");
            c->tok_seq[t] = s;
        }
    }
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return ns_fail(err, NS_ERR_INVALID, "set_batch: logit row out of range");
    c->n_tokens = b->n_tokens;
    c->n_seqs = b->n_seqs;
    c->max_pages = b->max_pages;
    c->n_logits = b->n_logits;
    return NS_OK;
}


static void cpu_destroy(ns_backend *be) {
    if (!be) return;
    cpu_impl *c = be->impl;
    if (c) {
        if (c->pool) {
            for (int i = 0; i < ns_pool_threads(c->pool); i++) free(c->scratch ? c->scratch[i] : NULL);
            ns_pool_free(c->pool);
        }
        free(c->scratch);
        free(c->moe_f);
        free(c->moe_i);
        free(c->kv);
        free(c->tokens);
        free(c->positions);
        free(c->tok_seq);
        free(c->seq_start);
        free(c->seq_len);
        free(c->page_table);
        free(c->logit_rows);
        free(c);
    }
    free(be);
}

int ns_cpu_scratch_reserve(cpu_impl *c, size_t n) {
    if (n <= c->scratch_len) return 0;
    for (int i = 0; i < ns_pool_threads(c->pool); i++) {
        float *p = realloc(c->scratch[i], n * sizeof(float));
        if (!p) return -1;
        c->scratch[i] = p;
    }
    c->scratch_len = n;
    return 0;
}

static ns_status cpu_sync(ns_backend *be, ns_error *err) { return NS_OK; }

/* The reference sampler row by row; -1 for a row whose logits are not
 * finite (see backend.h). */
static ns_status cpu_sample(ns_backend *be, const ns_tensor *logits, int n_rows, struct ns_sampler *const *samplers,
                            int32_t *out_tokens, ns_error *err) {
    for (int i = 0; i < n_rows; i++) {
        float *row = (float *)logits->data + (size_t)i * (size_t)logits->cols;
        out_tokens[i] = ns_sampler_sample(samplers[i], row);
    }
    return NS_OK;
}

static const ns_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .tensor_alloc = cpu_tensor_alloc,
    .tensor_free = cpu_tensor_free,
    .weight_from_host = cpu_weight_from_host,
    .weight_random = cpu_weight_random,
    .tensor_upload = cpu_tensor_upload,
    .tensor_download = cpu_tensor_download,
    .kv_alloc = cpu_kv_alloc,
    .kv_free = cpu_kv_free,
    .kv_page_read = cpu_kv_page_read,
    .kv_page_write = cpu_kv_page_write,
    .kv_page_copy = cpu_kv_page_copy,
    .set_batch = cpu_set_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .gather_rows = cpu_gather_rows,
    .add_bias = cpu_add_bias,
    .moe_ffn = cpu_moe_ffn,
    .sample = cpu_sample,
    .sync = cpu_sync,
};

ns_status ns_backend_cpu_create(int n_threads, ns_backend **out, ns_error *err) {
    *out = NULL;
    ns_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    be->ops = &cpu_ops;
    be->impl = c;
    ns_status rc = ns_pool_create(n_threads, &c->pool, err);
    if (rc != NS_OK) {
        cpu_destroy(be);
        return rc;
    }
    be->n_threads = ns_pool_threads(c->pool);
    /* Our pool already splits each product across cores; BLAS threads on
     * top would oversubscribe them. */
    openblas_set_num_threads(1);
    c->scratch = calloc((size_t)be->n_threads, sizeof *c->scratch);
    if (!c->scratch) {
        cpu_destroy(be);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    *out = be;
    return NS_OK;
}
