/* cuda_batch.cu — the per-step batch of the CUDA backend: set_batch's
 * checks, the metadata it uploads (cu_meta) and the launch-shape choices
 * derived from the batch (decode split counts, prefill tiles), all of
 * which the graph key (tape_key, cuda_backend.cu) covers.
 *
 * Invariant: every value a kernel reads from the metadata, and every
 * region address, is a function of the batch set last; the addresses
 * depend only on the step's counts (meta_place), so a replayed graph
 * reads where it was captured to.
 */
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_kv_fp8.cuh"

static inline cu_impl *IMPL(ns_backend *be) { return (cu_impl *)be->impl; }

/* Decode partitions along the sequence (flash-decoding): enough CTAs to
 * fill the chip several times over, never fewer than 64 keys (one tile)
 * per split, at most 1024 splits (the merge keeps one weight per split in
 * shared memory). A power of two so graphs are keyed by few values. */
static int32_t choose_splits(const cu_impl *c, int32_t n_dec, int32_t n_kv_heads, int32_t max_len) {
    if (n_dec <= 0 || n_kv_heads <= 0) return 1;
    int64_t want = (8LL * c->n_sm + (int64_t)n_dec * n_kv_heads - 1) / ((int64_t)n_dec * n_kv_heads);
    const int64_t sk = c->split_keys;
    int64_t by_len = (max_len + sk - 1) / sk;
    int64_t s = want < by_len ? want : by_len;
    if (s < 1) s = 1;
    int32_t p = 1;
    while (p < s && p < 1024) p *= 2;
    return p;
}

/* Places the metadata regions in d_base (and, at the same offsets, in the
 * staging buffer) for a step of T tokens, S sequences, page-table stride
 * `stride`, L logits rows, TL prefill tiles and D decode sequences: packed
 * back to back, each CU_META_ALIGN ints aligned, so the step's metadata is
 * one contiguous span and set_batch uploads it with one copy (eight small
 * copies cost the host a few microseconds each and the stream as many DMA
 * round trips, between the previous step's sync and this step's first
 * kernel, while the GPU idles). The offsets are a function of the counts
 * alone, all of which are in the graph key (tape_key): a replayed graph
 * reads its metadata where it was captured to. The counts never exceed
 * the capacities, so the span fits meta_grow's allocation. */
static void meta_place(cu_meta *m, size_t T, size_t S, size_t stride, size_t L, size_t TL, size_t D) {
    const size_t sizes[9] = {T, T, T, S + 1, S, S * stride, L, 2 * TL, D};
    int32_t **regions[9] = {&m->tokens,   &m->positions,  &m->tok_seq, &m->seq_start, &m->seq_len,
                            &m->page_table, &m->logit_rows, &m->tiles,   &m->dec_seqs};
    size_t off = 0;
    for (int i = 0; i < 9; i++) {
        *regions[i] = m->d_base + off;
        off += (sizes[i] + CU_META_ALIGN - 1) / CU_META_ALIGN * CU_META_ALIGN;
    }
    m->used_ints = off;
}

/* Splits of the tensor-core decode kernel. choose_splits aims at >= 8
 * CTAs per SM with >= 64 keys each, right for the CUDA-core kernel; the
 * MMA kernel streams a split much faster, so:
 * - long contexts get fewer, longer splits (fewer partials to merge,
 *   longer copy streams): n_splits / NS_CUDA_DEC_MMA_DIV (default 8) once
 *   n_splits >= 64. Measured at 32k batch 1 (H200, docs/cuda.md v13):
 *   divisor 1 111.6 tok/s, 2 138.7, 4 149.5, 8 156.2.
 * - below that, where the count is bound by the length (L <= 64 keys x
 *   splits), it is halved until every split holds two 64-key tiles: at
 *   1k, 32 splits made 17 CTAs of one tile per KV head and 15 empty ones,
 *   all merged by the last; 16 splits of two tiles (both copied before
 *   the PDL wait, CU_EARLY_ATTN_KV) measured 1% faster at batch 1 and 7%
 *   at batch 8 (docs/cuda.md v26). NS_CUDA_DEC_MMA_TILES (default 2) is
 *   that least tile count; 1 keeps set_batch's count.
 * - then halved while the grid has more than NS_CUDA_DEC_MMA_CTAS
 *   (default 2; 0: no cap) CTAs per SM: every CTA pays a fixed chain (Q,
 *   the first tiles' round trip, its partial, the merge counter) that more
 *   keys per CTA amortize. Batches 8 and 32 at 1k-4k measured 3-9% faster
 *   with the cap of 2 than without, 32k batch 32 7%; batch 1 below 64
 *   splits is under the cap (docs/cuda.md v26).
 * It depends on max_len, so it is part of the graph key (tape_key): a
 * replayed graph has the grid and split count it was captured with. */
static int32_t choose_mma_splits(const cu_impl *c, int32_t n_splits, int32_t max_len, int32_t n_dec,
                                 int32_t n_kv_heads) {
    int32_t q = n_splits;
    if (n_splits >= 64) q = n_splits / c->dec_mma_div;
    else
        while (q > 1 && max_len <= 64LL * (c->dec_mma_tiles - 1) * q) q /= 2;
    if (c->dec_mma_ctas > 0)
        while (q > 1 && (int64_t)n_dec * n_kv_heads * q > (int64_t)c->dec_mma_ctas * c->n_sm) q /= 2;
    return q;
}

/* Splits of the FP8 register-tile decode (cuda_attn_fp8_reg.cu), 0 where
 * the step keeps the older FP8 kernels' choice (cuda_attn_fp8.cu). Enough
 * CTAs for one full wave at the kernel's occupancy (four per SM: its
 * shared memory is the raw stages only), each split holding at least
 * NS_CUDA_FP8R_TILES (default 1) 64-key tiles of the longest row (at 1k
 * batch 1, 16 splits of one tile measured 4.559 ms/step against 4.637
 * for 8 of two; docs/cuda.md v29). Short contexts at batches below 4
 * (max_len < NS_CUDA_FP8R_MIN_LEN, default 8192) keep the older choice:
 * there the per-CTA chain, not the bytes, sets the time, and the
 * measured 1k and 4k batch-1 steps were 0.05-0.1 ms faster with it; at
 * batch 8 and at 32k and beyond this kernel wins (v29). NS_CUDA_FP8R_CTAS
 * overrides the CTAs per SM aimed at. A function of max_len and n_dec, so
 * in the graph key (tape_key). */
static int32_t choose_fp8r_splits(cu_impl *c, int32_t n_dec, int32_t n_kv_heads, int32_t max_len) {
    if (n_dec <= 0 || n_kv_heads <= 0) return 0;
    if (n_dec < 4 && max_len < c->fp8r_min_len) return 0;
    const int64_t per_sm = c->fp8r_ctas_aim > 0 ? c->fp8r_ctas_aim : cu_attn_decode_fp8_reg_ctas(c);
    int64_t q = per_sm * c->n_sm / ((int64_t)n_dec * n_kv_heads);
    const int64_t by_len = ((int64_t)max_len + 64LL * c->fp8r_tiles - 1) / (64LL * c->fp8r_tiles);
    if (q > by_len) q = by_len;
    if (q > 1024) q = 1024; /* decode_merge's bound */
    return q < 1 ? 1 : (int32_t)q;
}

ns_status cu_meta_grow(ns_backend *be, int32_t need_tokens, int32_t need_seqs, int32_t need_stride,
                           int32_t need_logits, int32_t need_tiles, ns_error *err) {
    cu_impl *c = IMPL(be);
    cu_meta *m = &c->meta;
    if (m->d_base && need_tokens <= m->cap_tokens && need_seqs <= m->cap_seqs && need_stride <= m->cap_pt_stride &&
        need_logits <= m->cap_logits && need_tiles <= m->cap_tiles)
        return NS_OK;
#define GROW(cap, need, min)                   \
    do {                                       \
        int32_t v = (cap) < (min) ? (min) : (cap); \
        while (v < (need)) v *= 2;             \
        (cap) = v;                             \
    } while (0)
    GROW(m->cap_tokens, need_tokens, 512);
    GROW(m->cap_seqs, need_seqs, 128);
    GROW(m->cap_pt_stride, need_stride, 256);
    GROW(m->cap_logits, need_logits, 256);
    GROW(m->cap_tiles, need_tiles, 256);
#undef GROW
    cu_check(c, cudaStreamSynchronize(c->stream), "sync");
    if (m->d_base) cudaFree(m->d_base);
    if (m->h_base) cudaFreeHost(m->h_base);
    m->d_base = NULL;
    m->h_base = NULL;
    size_t T = (size_t)m->cap_tokens, S = (size_t)m->cap_seqs, L = (size_t)m->cap_logits, TL = (size_t)m->cap_tiles;
    /* + room for meta_place's region alignment */
    size_t total = 3 * T + (S + 1) + S + S * (size_t)m->cap_pt_stride + L + 2 * TL + S + 64 + 9 * CU_META_ALIGN;
    if (cudaMalloc(&m->d_base, total * 4) != cudaSuccess || cudaMallocHost(&m->h_base, total * 4) != cudaSuccess) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_NOMEM, "cuda: cannot allocate batch metadata (%zu bytes)", total * 4);
    }
    m->total_ints = total;
    meta_place(m, m->cap_tokens, m->cap_seqs, m->cap_pt_stride, m->cap_logits, m->cap_tiles, m->cap_seqs);
    cu_bump_generation(c);
    return NS_OK;
}

/* Same region offsets in the pinned staging buffer. */
static int32_t *staging(const cu_meta *m, const int32_t *dev) { return m->h_base + (dev - m->d_base); }

ns_status cu_set_batch(ns_backend *be, const ns_batch *b, ns_error *err) {
    cu_impl *c = IMPL(be);
    cudaSetDevice(c->device);
    cu_flush(be);
    if (c->err_status != NS_OK) return cu_report(c, err);
    if (b->n_tokens < 0 || b->n_seqs < 0 || b->n_logits < 0 || b->max_pages < 0)
        return ns_fail(err, NS_ERR_INVALID, "set_batch: negative size");
    if (b->n_seqs > 0 && (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens))
        return ns_fail(err, NS_ERR_INVALID, "set_batch: seq_start does not cover the tokens");
    const int32_t P = be->kv.page_tokens;
    int32_t need_stride = 1, n_tiles = 0, n_dec = 0, max_len = 0, n_pre = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t n = b->seq_start[s + 1] - b->seq_start[s];
        if (n < 0) return ns_fail(err, NS_ERR_INVALID, "set_batch: seq_start not ascending");
        if (n > b->seq_len[s]) return ns_fail(err, NS_ERR_INVALID, "set_batch: more new tokens than context");
        int32_t pages = P ? (b->seq_len[s] + P - 1) / P : 0;
        if (pages > b->max_pages) return ns_fail(err, NS_ERR_INVALID, "set_batch: page table too short");
        for (int32_t p = 0; p < pages; p++) {
            int32_t pg = b->page_table[(size_t)s * (size_t)b->max_pages + (size_t)p];
            if (pg < 0 || pg >= be->kv.n_pages) return ns_fail(err, NS_ERR_RANGE, "set_batch: bad page %d", pg);
        }
        for (int32_t t = b->seq_start[s]; t < b->seq_start[s + 1]; t++)
            if (b->positions[t] != b->seq_len[s] - n + (t - b->seq_start[s]))
                return ns_fail(err, NS_ERR_INVALID,
                               "set_batch: positions of a sequence must be consecutive and end at seq_len-1");
        if (pages > need_stride) need_stride = pages;
        if (n == 1) {
            n_dec++;
            if (b->seq_len[s] > max_len) max_len = b->seq_len[s];
        } else if (n > 1) {
            n_pre++;
            n_tiles += (n + 63) / 64;
        }
    }
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return ns_fail(err, NS_ERR_INVALID, "set_batch: logit row out of range");
    /* page-table stride: a power of two so decode graphs survive growth */
    int32_t stride = 16;
    while (stride < need_stride) stride *= 2;
    ns_status rc = cu_meta_grow(be, b->n_tokens, b->n_seqs, stride, b->n_logits, n_tiles, err);
    if (rc != NS_OK) return rc;
    cu_meta *m = &c->meta;
    if (c->staging_pending) {
        cu_check(c, cudaEventSynchronize(c->staging_done), "staging");
        c->staging_pending = false;
    }
    meta_place(m, (size_t)b->n_tokens, (size_t)b->n_seqs, (size_t)stride, (size_t)b->n_logits, (size_t)n_tiles,
               (size_t)n_dec);
    int32_t *h_tok_seq = staging(m, m->tok_seq), *h_pt = staging(m, m->page_table), *h_tiles = staging(m, m->tiles),
            *h_dec = staging(m, m->dec_seqs);
    memcpy(staging(m, m->tokens), b->tokens, (size_t)b->n_tokens * 4);
    memcpy(staging(m, m->positions), b->positions, (size_t)b->n_tokens * 4);
    memcpy(staging(m, m->seq_start), b->seq_start, ((size_t)b->n_seqs + 1) * 4);
    memcpy(staging(m, m->seq_len), b->seq_len, (size_t)b->n_seqs * 4);
    memcpy(staging(m, m->logit_rows), b->logit_rows, (size_t)b->n_logits * 4);
    int32_t ti = 0, di = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t n = b->seq_start[s + 1] - b->seq_start[s];
        int32_t pages = P ? (b->seq_len[s] + P - 1) / P : 0;
        memcpy(h_pt + (size_t)s * stride, b->page_table + (size_t)s * b->max_pages, (size_t)pages * 4);
        for (int32_t t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) h_tok_seq[t] = s;
        if (n == 1) {
            h_dec[di++] = s;
        } else if (n > 1) {
            /* last tiles first: they attend to the most keys, and starting
             * them early shortens the tail of the launch */
            for (int32_t q0 = ((n - 1) / 64) * 64; q0 >= 0; q0 -= 64) {
                h_tiles[2 * ti] = s;
                h_tiles[2 * ti + 1] = q0;
                ti++;
            }
        }
    }
    m->n_tokens = b->n_tokens;
    m->n_seqs = b->n_seqs;
    m->n_logits = b->n_logits;
    m->pt_stride = stride;
    m->n_tiles = n_tiles;
    m->n_dec = n_dec;
    m->n_prefill_seqs = n_pre;
    m->max_len = max_len;
    m->n_splits = choose_splits(c, n_dec, be->kv.n_kv_heads, max_len);
    m->long_splits = m->n_splits < 64 && max_len >= 1024LL * m->n_splits;
    m->mma_splits = choose_mma_splits(c, m->n_splits, max_len, n_dec, be->kv.n_kv_heads);
    m->fp8r_splits = be->kv.dtype == NS_DT_FP8_E4M3 ? choose_fp8r_splits(c, n_dec, be->kv.n_kv_heads, max_len) : 0;
    m->valid = true;
    if (c->gap_probe) {
        cu_check(c, cudaEventRecord(c->probe_begin, c->stream), "gap probe");
        c->probe_begun = true;
    }
    /* one copy of the packed span (meta_place); the alignment gaps it
     * carries are never read */
    cu_check(c, cudaMemcpyAsync(m->d_base, m->h_base, m->used_ints * 4, cudaMemcpyHostToDevice, c->stream),
             "set_batch upload");
    cu_check(c, cudaEventRecord(c->staging_done, c->stream), "set_batch event");
    if (c->probe_begun) cu_check(c, cudaEventRecord(c->probe_mid, c->stream), "gap probe");
    c->staging_pending = true;
    c->pdl_anchor = c->pdl_anchors != 0; /* the step's first kernel waits for these copies */
    /* Pure decode steps are recorded: fused at flush, and captured into
     * a graph / replayed when graphs are on. Other steps (prefill chunks,
     * mixed batches) are recorded too when prefill_fuse is on, only so
     * that try_fuse sees whole op sequences: their row ops (q/k-norm +
     * RoPE + KV store, add + RMSNorm) are ~16% of a prefill chunk's time
     * as separate passes over its f32 activations (docs/cuda.md v23). They
     * run eagerly at flush, never as graphs: their launch shapes (the
     * attention's tile count) change from step to step. */
    const bool pure_decode = b->n_seqs > 0 && n_dec == b->n_seqs && b->n_tokens <= 1024;
    c->tape_eager_only = !pure_decode && c->prefill_fuse && c->fusion && b->n_tokens > 0;
    c->recording = pure_decode || c->tape_eager_only;
    c->n_tape = 0;
    c->memo_pending = false; /* cu_flush above launched any */
    c->memo_in_tape = false;
    return cu_report(c, err);
}

