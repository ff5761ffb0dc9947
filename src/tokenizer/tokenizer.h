/* tokenizer.h — Hugging Face compatible text <-> token id conversion.
 *
 * Loads MODEL_DIR/tokenizer.json (required) and MODEL_DIR/tokenizer_config.json
 * (optional) and reproduces what Hugging Face transformers 5 / tokenizers 0.23
 * produce for them: encode(text, add_special_tokens) and
 * decode(ids, skip_special_tokens).
 *
 * Pipeline (encode): added tokens are cut out of the raw text first
 * (leftmost-longest; lstrip/rstrip/single_word honored; "normalized" tokens
 * are matched after normalization), each remaining piece is normalized,
 * pre-tokenized and run through the BPE model, then the post-processor adds
 * BOS/EOS when add_special is true. Supported component types are listed in
 * normalize.h, pretok.h, decoder.h and bpe.h; an unknown "type" fails the
 * load with NS_ERR_UNSUPPORTED and names the component.
 *
 * transformers-5 compatibility (what the goldens were made with):
 *  - tokenizer_class "LlamaTokenizer"/"LlamaTokenizerFast" with a BPE model:
 *    transformers rebuilds the pipeline from the vocab and merges, ignoring
 *    the file's normalizer, pre_tokenizer, decoder and the model's unk_token:
 *    no normalizer; Metaspace("▁", prepend_scheme "first" — "always" when
 *    legacy is true, "never" when add_prefix_space is false — split=false);
 *    BPE with byte_fallback and fuse_unk but no unk token (unknown characters
 *    are dropped); decoder Replace("▁"," "), ByteFallback, Fuse and, when
 *    add_prefix_space, Strip(" ", 1, 0). We do the same.
 *  - tokenizer_config "add_bos_token"/"add_eos_token": when either key is
 *    present, the post-processor becomes [bos] $A [eos] per those flags (with
 *    the config's bos_token/eos_token), replacing tokenizer.json's.
 *  - bos/eos/unk/pad/additional special tokens named in the config that are
 *    in the vocabulary but not added tokens become special added tokens.
 *  - decode never applies clean_up_tokenization_spaces (transformers skips it
 *    for BPE models).
 *
 * Thread safety: a loaded tokenizer is immutable; every function below may be
 * called concurrently on the same tokenizer. An ns_detok belongs to one thread.
 */
#ifndef NS_TOKENIZER_H
#define NS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/status.h"

typedef struct ns_tokenizer ns_tokenizer;

/* Loads model_dir/tokenizer.json and model_dir/tokenizer_config.json (the
 * latter optional; when it has no chat_template, model_dir/chat_template.jinja
 * is used if present). *out is owned by the caller (ns_tokenizer_free).
 * Errors: NS_ERR_IO (missing/unreadable), NS_ERR_FORMAT (malformed JSON or
 * fields), NS_ERR_UNSUPPORTED (unknown component type), NS_ERR_RANGE/NOMEM. */
ns_status ns_tokenizer_load(const char *model_dir, ns_tokenizer **out, ns_error *err);
/* Same from in-memory texts: tokenizer_json (required) and config_json
 * (NULL = none). Used for the built-in demo model. */
ns_status ns_tokenizer_load_json(const char *tokenizer_json, const char *config_json, ns_tokenizer **out,
                                 ns_error *err);
void ns_tokenizer_free(ns_tokenizer *t);

/* Max id + 1, added tokens included. */
int32_t ns_tokenizer_n_vocab(const ns_tokenizer *t);

/* Encodes UTF-8 text[0..len) (may contain NUL). Invalid UTF-8 ->
 * NS_ERR_INVALID. *ids_out is malloc'd (never NULL on success, even for zero
 * ids) and owned by the caller. add_special applies the post-processor. */
ns_status ns_tokenizer_encode(const ns_tokenizer *t, const char *text, size_t len, bool add_special,
                              int32_t **ids_out, size_t *n_out, ns_error *err);

/* Bounded encode: the same ids as ns_tokenizer_encode when the text has at
 * most max_ids of them (then *exceeded is false). Otherwise it stops soon
 * after passing max_ids: *exceeded is true, *ids_out NULL and *n_out a
 * lower bound (> max_ids) on the whole count. Work and memory follow
 * max_ids rather than len: added tokens are cut out lazily, text the
 * normalizer leaves unchanged is read in place, the pre-tokenizer's first
 * stage (a Split or ByteLevel regex) runs as a generator, and a long word
 * is refused before its merge once a lower bound on its ids passes the
 * limit. Exceptions, which cost memory in proportion to the text: a
 * segment the normalizer changes is normalized whole; a pre-tokenizer
 * that starts with a Metaspace (or with a ByteLevel that prepends a
 * space) cuts the segment whole; one word (pre-tokenizer piece) whose
 * bound stays under the limit is merged whole (~40 bytes per character).
 * exceeded NULL: passing max_ids is NS_ERR_RANGE. Errors as
 * ns_tokenizer_encode. */
ns_status ns_tokenizer_encode_limit(const ns_tokenizer *t, const char *text, size_t len, bool add_special,
                                    size_t max_ids, int32_t **ids_out, size_t *n_out, bool *exceeded,
                                    ns_error *err);

/* Decodes ids to a malloc'd NUL-terminated string owned by the caller.
 * Out-of-range id -> NS_ERR_RANGE. skip_special drops special added tokens.
 * Ids inside the range that name no token are skipped (as HF does). */
ns_status ns_tokenizer_decode(const ns_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                              size_t *len_out, ns_error *err);

/* Exact vocab/added-token lookup; -1 if absent. */
int32_t ns_tokenizer_token_id(const ns_tokenizer *t, const char *piece);
/* Raw vocab string (added-token content for added tokens) or NULL; owned by t. */
const char *ns_tokenizer_piece(const ns_tokenizer *t, int32_t id);
/* True for added tokens with special=true. */
bool ns_tokenizer_is_special(const ns_tokenizer *t, int32_t id);

/* From tokenizer_config bos_token / eos_token (a string or {"content": ...});
 * -1 / NULL if none or not in the vocabulary. Strings are owned by t. */
int32_t ns_tokenizer_bos_id(const ns_tokenizer *t);
int32_t ns_tokenizer_eos_id(const ns_tokenizer *t);
const char *ns_tokenizer_bos_token(const ns_tokenizer *t);
const char *ns_tokenizer_eos_token(const ns_tokenizer *t);

/* chat_template from tokenizer_config.json: a string, or a list of
 * {name, template}. name NULL means "default" (or the only one). NULL if
 * none. Owned by t. */
const char *ns_tokenizer_chat_template(const ns_tokenizer *t, const char *name);

/* Streaming detokenizer: push ids one at a time; the text appended to `out`
 * is always whole UTF-8 characters, and all chunks plus the flush equal
 * ns_tokenizer_decode of all ids (including SentencePiece-style Strip of the
 * leading space). Text is held back only while it may still change: an
 * incomplete UTF-8 sequence, a run of <0xXX> byte-fallback tokens (validity
 * is decided on the whole run), trailing characters a Strip may remove.
 * The ns_detok is owned by the caller (ns_detok_free); t must outlive it. */
typedef struct ns_detok ns_detok;

/* Errors: NS_ERR_NOMEM. */
ns_status ns_detok_create(const ns_tokenizer *t, bool skip_special, ns_detok **out);
/* Appends newly completed text to out. Out-of-range id -> NS_ERR_RANGE
 * (the id is ignored and the stream stays usable). */
ns_status ns_detok_push(ns_detok *d, int32_t id, ns_buf *out);
/* End of stream: emits any held text (invalid bytes as U+FFFD like HF).
 * The detokenizer is reset and may be reused for a new stream. */
ns_status ns_detok_flush(ns_detok *d, ns_buf *out);
void ns_detok_free(ns_detok *d);

#endif
