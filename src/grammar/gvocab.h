/* gvocab.h — the model's vocabulary as the grammar sees it: the bytes of
 * every token and a byte trie of them in depth-first order, so the set of
 * tokens a grammar state allows is found by one walk that skips every
 * subtree whose prefix the grammar already rejects (gmatch.c).
 *
 * Tokens without bytes (special added tokens, padding ids past the
 * tokenizer, empty pieces) are never in the trie: a grammar never allows
 * them. The end-of-sequence ids are kept apart: the matcher allows them
 * exactly where the grammar may end.
 *
 * Layout: node i (preorder, i = 0..n_nodes-1) has its last byte byte[i],
 * its depth depth[i] (1 = a first byte), end[i] = the index after its
 * subtree, and tok[i] = a token whose bytes end there (-1: none; further
 * tokens with the same bytes chain through dup[tok]).
 *
 * Ownership: an ns_gvocab owns all its arrays (ns_gvocab_free). Read-only
 * once built: any number of threads and grammars may share it; it must
 * outlive every grammar built on it.
 */
#ifndef NS_GRAMMAR_GVOCAB_H
#define NS_GRAMMAR_GVOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

#define NS_GVOCAB_MAX_EOS 8
#define NS_GVOCAB_MAX_TOKEN_BYTES 1024 /* longer tokens are left out */

typedef struct ns_gvocab {
    int32_t n_vocab;   /* mask width in bits (the model's vocabulary) */
    uint32_t n_words;  /* (n_vocab + 31) / 32 */
    /* token bytes (len 0: not in the trie) */
    uint64_t *off;
    uint32_t *len;
    uint8_t *bytes;
    /* trie */
    uint32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *end;
    int32_t *tok;
    int32_t *dup;      /* [n_vocab] next token with the same bytes, -1 */
    /* plain[i]: every byte of node i's subtree (i included) is a plain
     * JSON string byte (0x20-0x7F but '"' and '\\'), so a grammar state
     * that loops on those bytes allows the whole subtree at once; its
     * tokens (duplicates included) are sub_toks[tok_start[i] ..
     * tok_start[end[i]]) */
    uint8_t *plain;
    /* sok[i]: likewise with well-formed UTF-8 too: from node i's byte on,
     * every token below is plain bytes and whole UTF-8 characters (the
     * last one possibly cut at the token's end), so a state that returns
     * to itself after any such character allows the subtree whole */
    uint8_t *sok;
    uint16_t *height; /* [n_nodes] levels of node i's subtree (1: a leaf) */
    uint16_t *maxch;  /* [n_nodes] most characters (UTF-8 lead or ASCII bytes) on a
                       * path from node i down to a token end */
    uint32_t *tok_start; /* [n_nodes + 1] */
    int32_t *sub_toks;
    uint16_t max_depth;
    int32_t eos[NS_GVOCAB_MAX_EOS];
    int n_eos;
} ns_gvocab;

/* Builds the vocabulary: token i (< n_tokens <= n_vocab) has tok_len[i]
 * bytes at tok_bytes[i] (NULL or 0: never allowed); eos lists the
 * end-of-sequence ids (at most NS_GVOCAB_MAX_EOS, each < n_vocab). The
 * bytes are copied. NS_ERR_NOMEM / NS_ERR_INVALID. */
ns_status ns_gvocab_build(int32_t n_vocab, int32_t n_tokens, const char *const *tok_bytes, const uint32_t *tok_len,
                          const int32_t *eos, int n_eos, ns_gvocab **out, ns_error *err);
void ns_gvocab_free(ns_gvocab *v);
bool ns_gvocab_is_eos(const ns_gvocab *v, int32_t tok);
/* A plain JSON string byte (see ns_gvocab.plain). */
static inline bool ns_gvocab_plain_byte(uint8_t b) { return b >= 0x20 && b <= 0x7F && b != '"' && b != '\\'; }

#endif
