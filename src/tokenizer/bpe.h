/* bpe.h — the BPE model of tokenizer.json ("model": {"type": "BPE", ...}).
 *
 * Owns the model vocabulary (piece strings in one arena, a piece->id hash map
 * and an id->piece table) and the merge table ((left id, right id) ->
 * (rank, merged id), open addressing). Merges may be "a b" strings or
 * ["a", "b"] pairs; every merge must name pieces of the vocabulary, as in
 * Hugging Face tokenizers.
 *
 * Encoding one pre-tokenized word follows tokenizers' BPE::merge_word and
 * Word::merge_all exactly: characters (with continuing_subword_prefix /
 * end_of_word_suffix) become symbols; unknown characters go to byte fallback
 * (<0xXX> pieces, all bytes or none), else to the unk token (fused when
 * fuse_unk), else are dropped; then the lowest-rank pair (leftmost on ties)
 * is merged until none is left. ignore_merges looks the whole word up first.
 * dropout > 0 is rejected (it is a training-time randomization).
 *
 * An ns_bpe is immutable after creation and safe to share between threads;
 * all per-call state (symbols, heap, word cache) lives in ns_bpe_scratch.
 */
#ifndef NS_BPE_H
#define NS_BPE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokutil.h"
#include "util/status.h"

typedef struct ns_bpe ns_bpe;

/* Builds the model from the "model" object's options and the JSON text of
 * its "vocab" object and "merges" array (read with jscan.h, see there for
 * why; merges may be empty text = no merges). *out is owned by the caller
 * (ns_bpe_free). `where` prefixes error messages (e.g. the file path). */
ns_status ns_bpe_create(const json_t *model, const char *vocab, size_t vocab_len, const char *merges,
                        size_t merges_len, const char *where, ns_bpe **out, ns_error *err);
void ns_bpe_free(ns_bpe *b);

/* Largest id in the vocabulary + 1 (0 for an empty vocabulary). */
int32_t ns_bpe_n_ids(const ns_bpe *b);
/* Piece string of id (NUL-terminated, owned by the model) or NULL. */
const char *ns_bpe_piece(const ns_bpe *b, int32_t id, size_t *len);
/* Id of an exact piece or -1. */
int32_t ns_bpe_id(const ns_bpe *b, const char *s, size_t n);

/* A lower bound on the number of ids ns_bpe_word appends for word w[0..n)
 * (valid UTF-8), without encoding it: the sum over its characters of
 * ns_bpe_char_weight. Each character that is a one-character piece gives
 * its own initial symbol, and a final token covering k symbols is a piece
 * of >= k characters, so it covers at most (longest piece containing c)
 * of them for any c it holds: the weights of a token's characters sum to
 * <= 1. Characters the model may drop, fuse (unk) or split into bytes
 * weigh 0. Always 0 for models with a continuing-subword prefix or an
 * end-of-word suffix. O(n), no allocation: for refusing a huge word
 * before the O(n)-memory merge. */
double ns_bpe_min_ids(const ns_bpe *b, const char *w, size_t n);
/* 1 / (length in characters of the longest piece containing cp) for a
 * character that is itself a piece, else 0 (see ns_bpe_min_ids). */
double ns_bpe_char_weight(const ns_bpe *b, uint32_t cp);

/* Per-call scratch: zero-initialize; ns_bpe_scratch_free releases it. */
typedef struct ns_bpe_scratch {
    void *syms;
    size_t syms_cap;
    void *heap;
    size_t heap_cap;
    void *cache; /* word -> ids memo, created on first use */
    void *bq;    /* bucket queue for very long words, created on first use */
    ns_buf tmp;
} ns_bpe_scratch;

void ns_bpe_scratch_free(ns_bpe_scratch *s);

/* Appends the ids of word w[0..n) (valid UTF-8) to out. */
ns_status ns_bpe_word(const ns_bpe *b, ns_bpe_scratch *s, const char *w, size_t n, ns_ids *out, ns_error *err);

#endif
