/* gvocab_tok.h — a tokenizer's vocabulary as grammar token bytes
 * (gvocab.h): the one place that knows how pieces spell bytes. Byte-level
 * BPE (GPT-2's byte-to-character table: Qwen, Llama 3) maps each piece
 * character back to its byte; SentencePiece-style vocabularies spell a
 * space as U+2581 and raw bytes as <0xXX>. Added tokens that are not
 * special (Qwen's <tool_call>, <think>) are their literal text; special
 * tokens are left out, except the end-of-sequence ids, which the matcher
 * allows where the grammar may end.
 *
 * Kept apart from gvocab.c so the engine's core (which links the grammar
 * matcher) does not depend on the tokenizer.
 */
#ifndef NS_GRAMMAR_GVOCAB_TOK_H
#define NS_GRAMMAR_GVOCAB_TOK_H

#include "grammar/gvocab.h"

struct ns_tokenizer;

/* Builds the vocabulary of t for a model of n_vocab ids (ids past the
 * tokenizer are never allowed). eos_ids (the model's end-of-sequence ids)
 * plus the tokenizer's eos token are the end ids. *out is owned by the
 * caller (ns_gvocab_free). NS_ERR_NOMEM / NS_ERR_INVALID. */
ns_status ns_gvocab_from_tokenizer(const struct ns_tokenizer *t, int32_t n_vocab, const int32_t *eos_ids, int n_eos_ids,
                                   ns_gvocab **out, ns_error *err);

#endif
