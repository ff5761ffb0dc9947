/* tok_gguf.c — GGUF tokenizer metadata -> tokenizer.json (see tok_gguf.h). */
#include "tokenizer/tok_gguf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_model.h"

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define MAX_VOCAB (1 << 24)

/* Pre-tokenizer regexes by tokenizer.ggml.pre (the Hugging Face tokenizer
 * files these names stand for use these patterns). */
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static json_t *bytelevel(bool use_regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", use_regex);
}

/* The pre_tokenizer object for a gpt2-style vocabulary, or NULL (unsupported). */
static json_t *gpt2_pretok(const char *pre) {
    const char *re = NULL;
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2")) return bytelevel(true);
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "smaug-bpe")) re = RE_LLAMA3;
    else if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen") || !strcmp(pre, "qwen35")) re = RE_QWEN2;
    if (!re) return NULL;
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", re, "behavior", "Isolated", "invert", 0, bytelevel(false));
}

typedef struct {
    const ns_gguf *g;
    const ns_gguf_kv *toks, *types, *scores;
    uint64_t n;
    json_t *vocab;  /* piece -> id */
    ns_error *err;
} vctx;

static int tok_type(const vctx *v, uint64_t i) {
    return v->types ? (int)ns_gguf_arr_i64(v->types, i) : TT_NORMAL;
}

/* vocab object and added_tokens array. */
static ns_status build_vocab(vctx *v, json_t *added) {
    for (uint64_t i = 0; i < v->n; i++) {
        uint64_t len;
        const char *s = ns_gguf_arr_str(v->g, v->toks, i, &len);
        if (!s || memchr(s, 0, (size_t)len))
            return ns_fail(v->err, NS_ERR_FORMAT, "%s: token %llu is not a valid string", v->g->path,
                           (unsigned long long)i);
        json_t *id = json_integer((json_int_t)i);
        /* the first of duplicate pieces keeps its id (llama.cpp's map does) */
        if (!id || (!json_object_getn(v->vocab, s, (size_t)len) && json_object_setn_new(v->vocab, s, (size_t)len, id)))
            return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
        if (json_object_getn(v->vocab, s, (size_t)len) != id) json_decref(id);
        int tt = tok_type(v, i);
        if (tt != TT_CONTROL && tt != TT_UNKNOWN && tt != TT_USER) continue;
        if (len == 0) continue; /* an empty special can never match text */
        json_t *a = json_pack("{s:I, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i, "content", s, (size_t)len,
                              "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", tt != TT_USER);
        if (!a || json_array_append_new(added, a))
            return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    }
    return NS_OK;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* Dense rank of score s among the distinct scores (sorted descending). */
static uint32_t score_rank(const float *uniq, size_t n, float s) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uniq[mid] > s) lo = mid + 1;
        else hi = mid;
    }
    return (uint32_t)lo;
}

/* SentencePiece: every split of every piece into two vocabulary pieces is
 * a merge ranked by the whole piece's score (shared ranks, see bpe.h). */
static ns_status spm_merges(vctx *v, json_t *merges) {
    if (!v->scores || v->scores->arr_n != v->n)
        return ns_fail(v->err, NS_ERR_FORMAT, "%s: tokenizer.ggml.scores must have one score per token", v->g->path);
    float *sc = malloc((size_t)v->n * sizeof *sc);
    if (!sc) return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    size_t nu = 0;
    for (uint64_t i = 0; i < v->n; i++) {
        double d = ns_gguf_arr_f64(v->scores, i);
        sc[i] = isfinite(d) ? (float)d : -INFINITY;
    }
    float *uniq = malloc((size_t)v->n * sizeof *uniq);
    if (!uniq) {
        free(sc);
        return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    }
    memcpy(uniq, sc, (size_t)v->n * sizeof *uniq);
    qsort(uniq, (size_t)v->n, sizeof *uniq, cmp_desc);
    for (uint64_t i = 0; i < v->n; i++)
        if (nu == 0 || uniq[nu - 1] != uniq[i]) uniq[nu++] = uniq[i];
    ns_status rc = NS_OK;
    for (uint64_t i = 0; i < v->n && rc == NS_OK; i++) {
        uint64_t len;
        const char *s = ns_gguf_arr_str(v->g, v->toks, i, &len);
        json_t *own = json_object_getn(v->vocab, s, (size_t)len);
        if (!own || json_integer_value(own) != (json_int_t)i) continue; /* a duplicate piece */
        const uint32_t rank = score_rank(uniq, nu, sc[i]);
        for (uint64_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80) continue; /* split at character boundaries only */
            if (!json_object_getn(v->vocab, s, (size_t)k) || !json_object_getn(v->vocab, s + k, (size_t)(len - k)))
                continue;
            json_t *m = json_pack("[s%, s%, I]", s, (size_t)k, s + k, (size_t)(len - k), (json_int_t)rank);
            if (!m || json_array_append_new(merges, m)) rc = ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
        }
    }
    free(uniq);
    free(sc);
    return rc;
}

static ns_status gpt2_merges(vctx *v, json_t *merges) {
    const ns_gguf_kv *mk = ns_gguf_find(v->g, "tokenizer.ggml.merges");
    if (!mk) return NS_OK;
    if (mk->type != NS_GGUF_ARRAY || mk->arr_type != NS_GGUF_STRING)
        return ns_fail(v->err, NS_ERR_FORMAT, "%s: tokenizer.ggml.merges must be an array of strings", v->g->path);
    for (uint64_t i = 0; i < mk->arr_n; i++) {
        uint64_t len;
        const char *s = ns_gguf_arr_str(v->g, mk, i, &len);
        json_t *m = json_stringn(s, (size_t)len);
        if (!m) return ns_fail(v->err, NS_ERR_FORMAT, "%s: merge %llu is not valid UTF-8", v->g->path, (unsigned long long)i);
        if (json_array_append_new(merges, m)) return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    }
    return NS_OK;
}

static const char *piece_of(const vctx *v, int64_t id, char *buf, size_t cap) {
    if (id < 0 || (uint64_t)id >= v->n) return NULL;
    uint64_t len;
    const char *s = ns_gguf_arr_str(v->g, v->toks, (uint64_t)id, &len);
    if (!s || len >= cap) return NULL;
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    return buf;
}

/* tokenizer_config.json: bos/eos tokens, add_bos/add_eos, chat template. */
static ns_status build_config(vctx *v, bool spm, json_t **out) {
    json_t *c = json_object();
    if (!c) return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    *out = c;
    char buf[512];
    int64_t id;
    bool f, b;
    ns_status rc;
    const char *keys[2][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"}, {"tokenizer.ggml.eos_token_id", "eos_token"}};
    for (int i = 0; i < 2; i++) {
        if ((rc = ns_gguf_get_i64(v->g, keys[i][0], &id, &f, v->err)) != NS_OK) return rc;
        const char *p = f ? piece_of(v, id, buf, sizeof buf) : NULL;
        if (p && json_object_set_new(c, keys[i][1], json_string(p))) return ns_fail(v->err, NS_ERR_NOMEM, "out of memory");
    }
    b = spm; /* llama.cpp's defaults: SentencePiece adds BOS, gpt2 does not */
    if ((rc = ns_gguf_get_bool(v->g, "tokenizer.ggml.add_bos_token", &b, &f, v->err)) != NS_OK) return rc;
    json_object_set_new(c, "add_bos_token", json_boolean(b));
    b = false;
    if ((rc = ns_gguf_get_bool(v->g, "tokenizer.ggml.add_eos_token", &b, &f, v->err)) != NS_OK) return rc;
    json_object_set_new(c, "add_eos_token", json_boolean(b));
    char *tmpl = NULL;
    if ((rc = ns_gguf_get_str_dup(v->g, "tokenizer.chat_template", &tmpl, v->err)) != NS_OK) return rc;
    if (tmpl) {
        json_t *s = json_string(tmpl);
        free(tmpl);
        if (!s) return ns_fail(v->err, NS_ERR_FORMAT, "%s: tokenizer.chat_template is not valid UTF-8", v->g->path);
        json_object_set_new(c, "chat_template", s);
    }
    return NS_OK;
}

static ns_status build(const ns_gguf *g, json_t **tok_out, json_t **cfg_out, ns_error *err) {
    *tok_out = *cfg_out = NULL;
    char *model = NULL, *pre = NULL;
    json_t *tok = NULL, *added = json_array(), *merges = json_array();
    vctx v = {g, ns_gguf_find(g, "tokenizer.ggml.tokens"), ns_gguf_find(g, "tokenizer.ggml.token_type"),
              ns_gguf_find(g, "tokenizer.ggml.scores"), 0, json_object(), err};
    ns_status rc = NS_OK;
    if (!added || !merges || !v.vocab) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = ns_gguf_get_str_dup(g, "tokenizer.ggml.model", &model, err)) != NS_OK) goto done;
    if ((rc = ns_gguf_get_str_dup(g, "tokenizer.ggml.pre", &pre, err)) != NS_OK) goto done;
    if (!model || !v.toks) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: no embedded tokenizer (tokenizer.ggml.model / tokens)", g->path);
        goto done;
    }
    if (v.toks->type != NS_GGUF_ARRAY || v.toks->arr_type != NS_GGUF_STRING || v.toks->arr_n == 0 ||
        v.toks->arr_n > MAX_VOCAB) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: tokenizer.ggml.tokens must be 1..%d strings", g->path, MAX_VOCAB);
        goto done;
    }
    v.n = v.toks->arr_n;
    if (v.types && (v.types->type != NS_GGUF_ARRAY || v.types->arr_n != v.n || v.types->arr_type == NS_GGUF_STRING ||
                    v.types->arr_type == NS_GGUF_ARRAY)) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: tokenizer.ggml.token_type must hold one integer per token", g->path);
        goto done;
    }
    if (v.scores && (v.scores->type != NS_GGUF_ARRAY || v.scores->arr_type == NS_GGUF_STRING ||
                     v.scores->arr_type == NS_GGUF_ARRAY)) {
        rc = ns_fail(err, NS_ERR_FORMAT, "%s: tokenizer.ggml.scores must be numbers", g->path);
        goto done;
    }
    const bool spm = strcmp(model, "llama") == 0;
    if (!spm && strcmp(model, "gpt2") != 0) {
        rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: tokenizer model \"%.64s\" is not supported (llama, gpt2)", g->path,
                     ns_gguf_printable(model, strlen(model)) ? model : "?");
        goto done;
    }
    if ((rc = build_vocab(&v, added)) != NS_OK) goto done;
    if ((rc = spm ? spm_merges(&v, merges) : gpt2_merges(&v, merges)) != NS_OK) goto done;
    json_t *pretok = NULL, *norm = NULL, *dec, *bpe;
    if (spm) {
        bool prefix = true;
        if ((rc = ns_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix, NULL, err)) != NS_OK) goto done;
        norm = prefix ? json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence", "normalizers",
                                  "type", "Prepend", "prepend", "\xe2\x96\x81", "type", "Replace", "pattern", "String",
                                  " ", "content", "\xe2\x96\x81")
                      : json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ", "content",
                                  "\xe2\x96\x81");
        dec = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}", "type", "Sequence",
                        "decoders", "type", "Replace", "pattern", "String", "\xe2\x96\x81", "content", " ", "type",
                        "ByteFallback", "type", "Fuse", "type", "Strip", "content", " ", "start", prefix ? 1 : 0,
                        "stop", 0);
    } else {
        pretok = gpt2_pretok(pre);
        if (!pretok) {
            rc = ns_fail(err, NS_ERR_UNSUPPORTED, "%s: pre-tokenizer \"%.64s\" is not supported", g->path,
                         ns_gguf_printable(pre, strlen(pre)) ? pre : "?");
            goto done;
        }
        dec = bytelevel(true);
    }
    int64_t unk = -1;
    char ubuf[256];
    if (spm) {
        bool f;
        if ((rc = ns_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &unk, &f, err)) != NS_OK) goto done;
    }
    const char *unk_s = spm ? piece_of(&v, unk, ubuf, sizeof ubuf) : NULL;
    bpe = json_pack("{s:s, s:o, s:o, s:b, s:b, s:b}", "type", "BPE", "vocab", v.vocab, "merges", merges, "byte_fallback",
                    spm, "fuse_unk", spm, "ignore_merges", 0);
    v.vocab = merges = NULL; /* stolen by bpe */
    if (bpe && unk_s) json_object_set_new(bpe, "unk_token", json_string(unk_s));
    tok = json_pack("{s:s, s:o, s:o*, s:o*, s:n, s:o, s:o}", "version", "1.0", "added_tokens", added, "normalizer", norm,
                    "pre_tokenizer", pretok, "post_processor", "model", bpe, "decoder", dec);
    added = NULL;
    if (!tok) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto done;
    }
    rc = build_config(&v, spm, cfg_out);
    if (rc == NS_OK) {
        *tok_out = tok;
        tok = NULL;
    } else {
        json_decref(*cfg_out);
        *cfg_out = NULL;
    }
done:
    free(model);
    free(pre);
    json_decref(tok);
    json_decref(added);
    json_decref(merges);
    json_decref(v.vocab);
    return rc;
}

ns_status ns_tokenizer_gguf_json(const ns_gguf *g, char **tokenizer_json, char **config_json, ns_error *err) {
    *tokenizer_json = *config_json = NULL;
    json_t *t, *c;
    ns_status rc = build(g, &t, &c, err);
    if (rc != NS_OK) return rc;
    *tokenizer_json = json_dumps(t, JSON_COMPACT);
    *config_json = json_dumps(c, JSON_COMPACT);
    json_decref(t);
    json_decref(c);
    if (!*tokenizer_json || !*config_json) {
        free(*tokenizer_json);
        free(*config_json);
        *tokenizer_json = *config_json = NULL;
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    return NS_OK;
}

ns_status ns_tokenizer_from_gguf(const ns_gguf *g, ns_tokenizer **out, ns_error *err) {
    *out = NULL;
    char *tj, *cj;
    ns_status rc = ns_tokenizer_gguf_json(g, &tj, &cj, err);
    if (rc != NS_OK) return rc;
    rc = ns_tokenizer_load_json(tj, cj, out, err);
    free(tj);
    free(cj);
    return rc;
}

ns_status ns_tokenizer_load_gguf(const char *path, ns_tokenizer **out, ns_error *err) {
    *out = NULL;
    char *first = NULL;
    if (err) err->status = NS_OK;
    if (!ns_gguf_model_path(path, &first, err)) {
        if (err && err->status != NS_OK && err->msg[0]) return err->status;
        return ns_fail(err, NS_ERR_IO, "%s: not a GGUF model", path);
    }
    ns_gguf *g = NULL;
    ns_status rc = ns_gguf_open(first, &g, err);
    free(first);
    if (rc != NS_OK) return rc;
    rc = ns_tokenizer_from_gguf(g, out, err);
    ns_gguf_close(g);
    return rc;
}
