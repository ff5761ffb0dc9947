/* tok_gguf.h — the tokenizer embedded in a GGUF file, as an ns_tokenizer.
 *
 * GGUF stores the vocabulary as metadata (tokenizer.ggml.*): the token
 * strings, their types (normal, unknown, control, user-defined, unused,
 * byte) and, per tokenizer.ggml.model:
 *  - "llama": SentencePiece BPE with a score per token. llama.cpp merges
 *    the adjacent pair whose concatenation is the vocabulary piece of
 *    highest score (leftmost on ties), with a "▁" prefix on every text
 *    fragment (start and after each special token, add_space_prefix),
 *    spaces as "▁", and <0xXX> byte tokens for characters not in the vocab.
 *  - "gpt2": byte-level BPE with tokenizer.ggml.merges and a pre-tokenizer
 *    regex named by tokenizer.ggml.pre (default/gpt2, llama-bpe, qwen2,
 *    and the other names that share their regexes).
 * We translate that into an equivalent tokenizer.json + tokenizer_config
 * (chat template tokenizer.chat_template, bos/eos and add_bos/add_eos)
 * and load it with ns_tokenizer_load_json, so encode/decode/streaming and
 * the template path are the same code as for Hugging Face directories.
 * SentencePiece scores become merges with explicit shared ranks (bpe.h),
 * which reproduces "highest score, leftmost on ties" exactly.
 *
 * Control and unknown tokens become special added tokens, user-defined
 * tokens non-special added tokens (both are matched in text, as llama.cpp
 * does with parse_special). Unsupported tokenizer models or pre-tokenizer
 * names are NS_ERR_UNSUPPORTED naming the value.
 */
#ifndef NS_TOK_GGUF_H
#define NS_TOK_GGUF_H

#include "model/gguf.h"
#include "tokenizer/tokenizer.h"

/* Builds the tokenizer of g. *out owned by the caller (ns_tokenizer_free). */
ns_status ns_tokenizer_from_gguf(const ns_gguf *g, ns_tokenizer **out, ns_error *err);
/* Same, writing the generated tokenizer.json / tokenizer_config.json
 * texts instead (malloc'd, owned by the caller); for tests and tools. */
ns_status ns_tokenizer_gguf_json(const ns_gguf *g, char **tokenizer_json, char **config_json, ns_error *err);
/* ns_tokenizer_load for a GGUF path (file, first shard, or directory
 * holding one model, see gguf_model.h). */
ns_status ns_tokenizer_load_gguf(const char *path, ns_tokenizer **out, ns_error *err);

#endif
