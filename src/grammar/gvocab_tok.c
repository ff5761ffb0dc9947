/* gvocab_tok.c — token bytes from a tokenizer (see gvocab_tok.h). */
#include "grammar/gvocab_tok.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokutil.h"
#include "util/buf.h"
#include "util/utf8.h"

/* The bytes of piece: byte-level BPE maps every byte to one code point
 * (GPT-2's table); SentencePiece-style vocabularies spell a space as U+2581
 * and raw bytes as <0xXX>. Added tokens are their literal text. */
static bool piece_bytes(const char *piece, bool bytelevel, bool added, ns_buf *out) {
    ns_buf_reset(out);
    size_t n = strlen(piece);
    if (!bytelevel && n == 6 && piece[0] == '<' && piece[1] == '0' && piece[2] == 'x' && piece[5] == '>') {
        char hex[3] = {piece[3], piece[4], 0};
        char *end;
        long v = strtol(hex, &end, 16);
        if (!*end) {
            char b = (char)v;
            return ns_buf_append(out, &b, 1) == NS_OK;
        }
    }
    if (added) return ns_buf_append(out, piece, n) == NS_OK;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = ns_utf8_decode(piece, n, i, &cp);
        if (l == 0) return ns_buf_append(out, piece, n) == NS_OK;
        if (bytelevel) {
            int b = ns_bytelevel_byte(cp);
            if (b < 0) return false;
            char c = (char)b;
            if (ns_buf_append(out, &c, 1) != NS_OK) return false;
        } else if (cp == 0x2581) {
            if (ns_buf_append(out, " ", 1) != NS_OK) return false;
        } else if (ns_buf_append(out, piece + i, l) != NS_OK) {
            return false;
        }
        i += l;
    }
    return true;
}

ns_status ns_gvocab_from_tokenizer(const struct ns_tokenizer *t, int32_t n_vocab, const int32_t *eos_ids, int n_eos_ids,
                                   ns_gvocab **out, ns_error *err) {
    int32_t n_tok = ns_tokenizer_n_vocab(t);
    if (n_tok > n_vocab) n_tok = n_vocab;
    /* GPT-2's byte table spells a space as U+0120: byte-level vocabularies
     * (Qwen, Llama 3) always hold that piece; SentencePiece ones never do */
    bool bytelevel = ns_tokenizer_token_id(t, "\xc4\xa0") >= 0;
    char **bytes = calloc((size_t)(n_tok > 0 ? n_tok : 1), sizeof(char *));
    uint32_t *lens = calloc((size_t)(n_tok > 0 ? n_tok : 1), sizeof(uint32_t));
    ns_buf b;
    ns_buf_init(&b, 1 << 16);
    ns_status rc = NS_OK;
    if (!bytes || !lens) rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; rc == NS_OK && i < n_tok; i++) {
        const char *p = ns_tokenizer_piece(t, i);
        if (!p || ns_tokenizer_is_special(t, i)) continue;
        if (!piece_bytes(p, bytelevel, false, &b)) {
            /* not a byte-level piece: an added token's literal text (whose
             * printable ASCII spells the same either way) */
            if (!piece_bytes(p, false, true, &b)) continue;
        }
        if (b.len == 0) continue;
        bytes[i] = malloc(b.len);
        if (!bytes[i]) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(bytes[i], b.data, b.len);
        lens[i] = (uint32_t)b.len;
    }
    int32_t eos[NS_GVOCAB_MAX_EOS];
    int n_eos = 0;
    for (int i = 0; i < n_eos_ids && n_eos < NS_GVOCAB_MAX_EOS; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < n_vocab) eos[n_eos++] = eos_ids[i];
    int32_t te = ns_tokenizer_eos_id(t);
    bool have = false;
    for (int i = 0; i < n_eos; i++) have |= eos[i] == te;
    if (te >= 0 && te < n_vocab && !have && n_eos < NS_GVOCAB_MAX_EOS) eos[n_eos++] = te;
    if (rc == NS_OK)
        rc = ns_gvocab_build(n_vocab, n_tok, (const char *const *)bytes, lens, eos, n_eos, out, err);
    for (int32_t i = 0; bytes && i < n_tok; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    ns_buf_free(&b);
    return rc;
}

