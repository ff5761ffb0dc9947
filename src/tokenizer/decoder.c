#include "tokenizer/decoder.h"

#include <stdlib.h>
#include <string.h>

typedef enum { D_BYTELEVEL, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_METASPACE } dec_type;

typedef struct stage {
    dec_type type;
    ns_pattern *pat; /* D_REPLACE */
    char *content;   /* D_REPLACE: replacement text */
    size_t content_len;
    char ch[4]; /* D_STRIP: content char; D_METASPACE: replacement char */
    size_t ch_len;
    size_t start, stop; /* D_STRIP */
    bool prepend;       /* D_METASPACE: prepend_scheme != never */
} stage;

struct ns_decoder {
    stage *st;
    size_t n;
};

static const char FFFD[] = "\xEF\xBF\xBD";

void ns_decoder_free(ns_decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) {
        ns_pattern_free(d->st[i].pat);
        free(d->st[i].content);
    }
    free(d->st);
    free(d);
}

static ns_status one_char(const json_t *j, const char *what, char out[4], size_t *len, ns_error *err) {
    const char *s = json_string_value(j);
    size_t n = json_string_length(j);
    if (!s || n == 0 || n > 4 || ns_utf8_len((unsigned char)s[0]) != n)
        return ns_fail(err, NS_ERR_FORMAT, "decoder %s must be a single character", what);
    memcpy(out, s, n);
    *len = n;
    return NS_OK;
}

static ns_status add_stage(ns_decoder *d, const json_t *j, int depth, ns_error *err) {
    if (depth > 16) return ns_fail(err, NS_ERR_FORMAT, "decoder nesting too deep");
    if (!json_is_object(j)) return ns_fail(err, NS_ERR_FORMAT, "decoder must be an object");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return ns_fail(err, NS_ERR_FORMAT, "decoder has no \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) return ns_fail(err, NS_ERR_FORMAT, "decoder Sequence needs a \"decoders\" array");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            ns_status st = add_stage(d, json_array_get(arr, i), depth + 1, err);
            if (st != NS_OK) return st;
        }
        return NS_OK;
    }
    stage s;
    memset(&s, 0, sizeof s);
    ns_status st = NS_OK;
    if (!strcmp(type, "ByteLevel")) s.type = D_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) s.type = D_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) s.type = D_FUSE;
    else if (!strcmp(type, "Replace")) {
        s.type = D_REPLACE;
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(c)) return ns_fail(err, NS_ERR_FORMAT, "decoder Replace needs a \"content\" string");
        if ((st = ns_pattern_parse(json_object_get(j, "pattern"), "decoder Replace", &s.pat, err)) != NS_OK) return st;
        s.content_len = json_string_length(c);
        if (!(s.content = malloc(s.content_len + 1))) {
            ns_pattern_free(s.pat);
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
        memcpy(s.content, json_string_value(c), s.content_len + 1);
    } else if (!strcmp(type, "Strip")) {
        s.type = D_STRIP;
        int64_t a = 0, b = 0;
        if ((st = one_char(json_object_get(j, "content"), "Strip content", s.ch, &s.ch_len, err)) != NS_OK) return st;
        if (!ns_json_int(json_object_get(j, "start"), 0, 1 << 20, &a) ||
            !ns_json_int(json_object_get(j, "stop"), 0, 1 << 20, &b))
            return ns_fail(err, NS_ERR_FORMAT, "decoder Strip needs small non-negative \"start\" and \"stop\"");
        s.start = (size_t)a;
        s.stop = (size_t)b;
    } else if (!strcmp(type, "Metaspace")) {
        s.type = D_METASPACE;
        const json_t *r = json_object_get(j, "replacement");
        if (r) {
            if ((st = one_char(r, "Metaspace replacement", s.ch, &s.ch_len, err)) != NS_OK) return st;
        } else {
            memcpy(s.ch, "\xE2\x96\x81", 3);
            s.ch_len = 3;
        }
        const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
        if (scheme) s.prepend = strcmp(scheme, "never") != 0;
        else s.prepend = !json_is_false(json_object_get(j, "add_prefix_space"));
    } else {
        return ns_fail(err, NS_ERR_UNSUPPORTED, "decoder type \"%s\" is not supported", type);
    }
    stage *v = realloc(d->st, (d->n + 1) * sizeof *v);
    if (!v) {
        ns_pattern_free(s.pat);
        free(s.content);
        return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    }
    d->st = v;
    d->st[d->n++] = s;
    return NS_OK;
}

ns_status ns_decoder_parse(const json_t *j, ns_decoder **out, ns_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return NS_OK;
    ns_decoder *d = calloc(1, sizeof *d);
    if (!d) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status st = add_stage(d, j, 0, err);
    if (st != NS_OK) {
        ns_decoder_free(d);
        return st;
    }
    *out = d;
    return NS_OK;
}

/* ---- per-token helpers shared by batch and stream ---- */

/* Byte value of a "<0xXX>" token (Rust's u8::from_str_radix accepts "+X"). */
static int byte_token(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c == '+' && i == 3) continue;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Appends the bytes a ByteLevel decoder makes of one token: the GPT-2
 * alphabet mapped back to bytes, or the raw token if any character is not in
 * that alphabet. */
static ns_status bytelevel_bytes(const char *t, size_t n, ns_buf *out) {
    size_t mark = out->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += ns_utf8_decode(t, n, i, &cp);
        int b = ns_bytelevel_byte(cp);
        if (b < 0) {
            out->len = mark;
            return ns_buf_append(out, t, n);
        }
        char c = (char)b;
        ns_status st = ns_buf_append(out, &c, 1);
        if (st != NS_OK) return st;
    }
    return NS_OK;
}

static ns_status strip_token(const stage *s, const char *t, size_t n, ns_buf *out) {
    size_t a = 0, b = n;
    for (size_t k = 0; k < s->start && a + s->ch_len <= n && !memcmp(t + a, s->ch, s->ch_len); k++) a += s->ch_len;
    for (size_t k = 0; k < s->stop && b >= a + s->ch_len && !memcmp(t + b - s->ch_len, s->ch, s->ch_len); k++)
        b -= s->ch_len;
    return ns_buf_append(out, t + a, b - a);
}

/* Metaspace: the replacement becomes ' ', or vanishes in the first token. */
static ns_status metaspace_token(const stage *s, bool first, const char *t, size_t n, ns_buf *out) {
    ns_status st = NS_OK;
    size_t run = 0;
    for (size_t i = 0; i < n && st == NS_OK;) {
        if (i + s->ch_len <= n && !memcmp(t + i, s->ch, s->ch_len)) {
            st = ns_buf_append(out, t + run, i - run);
            if (st == NS_OK && !(first && s->prepend)) st = ns_buf_putc(out, ' ');
            i += s->ch_len;
            run = i;
        } else {
            i += ns_utf8_len((unsigned char)t[i]);
        }
    }
    if (st == NS_OK) st = ns_buf_append(out, t + run, n - run);
    return st;
}

static ns_status replace_token(const stage *s, ns_rx_ctx *ctx, ns_spans *sp, const char *t, size_t n, ns_buf *out,
                               ns_error *err) {
    ns_status st = ns_pattern_spans(s->pat, ctx, t, n, sp, err);
    for (size_t i = 0; i < sp->n && st == NS_OK; i++) {
        if (sp->v[i].match) st = ns_buf_append(out, s->content, s->content_len);
        else st = ns_buf_append(out, t + sp->v[i].start, sp->v[i].end - sp->v[i].start);
    }
    return st;
}

/* Flushes a ByteFallback run into list form: the run as one string when it
 * is valid UTF-8, else one U+FFFD per byte. */
static ns_status run_to_list(const ns_buf *run, ns_strlist *out) {
    if (ns_utf8_valid(run->data, run->len, NULL)) return ns_strlist_push(out, run->data, run->len);
    for (size_t i = 0; i < run->len; i++) {
        ns_status st = ns_strlist_push(out, FFFD, 3);
        if (st != NS_OK) return st;
    }
    return NS_OK;
}

/* ---- batch ---- */

ns_status ns_decoder_run(const ns_decoder *d, ns_rx_ctx *ctx, const ns_strlist *tokens, ns_buf *out, ns_error *err) {
    ns_status st = NS_OK;
    if (!d) {
        for (size_t i = 0; i < tokens->n && st == NS_OK; i++) {
            size_t n;
            const char *t = ns_strlist_at(tokens, i, &n);
            if (i) st = ns_buf_putc(out, ' ');
            if (st == NS_OK) st = ns_buf_append(out, t, n);
        }
        return st == NS_OK ? NS_OK : ns_fail(err, st, "decode: out of memory");
    }
    ns_strlist a, b;
    ns_strlist_init(&a);
    ns_strlist_init(&b);
    ns_buf run;
    ns_buf_init(&run, 0);
    ns_spans sp = {0};
    for (size_t i = 0; i < tokens->n && st == NS_OK; i++) {
        size_t n;
        const char *t = ns_strlist_at(tokens, i, &n);
        st = ns_strlist_push(&a, t, n);
    }
    for (size_t k = 0; k < d->n && st == NS_OK; k++) {
        const stage *s = &d->st[k];
        ns_strlist_reset(&b);
        switch (s->type) {
        case D_FUSE:
        case D_BYTELEVEL:
            if ((st = ns_strlist_begin(&b)) != NS_OK) break;
            ns_buf_reset(&run);
            for (size_t i = 0; i < a.n && st == NS_OK; i++) {
                size_t n;
                const char *t = ns_strlist_at(&a, i, &n);
                st = s->type == D_FUSE ? ns_buf_append(&run, t, n) : bytelevel_bytes(t, n, &run);
            }
            if (st != NS_OK) break;
            if (s->type == D_FUSE) {
                st = ns_strlist_extend(&b, run.data ? run.data : "", run.len);
            } else {
                ns_buf txt;
                ns_buf_init(&txt, 0);
                st = ns_utf8_lossy(&txt, (const unsigned char *)(run.data ? run.data : ""), run.len, true, NULL);
                if (st == NS_OK) st = ns_strlist_extend(&b, txt.data ? txt.data : "", txt.len);
                ns_buf_free(&txt);
            }
            break;
        case D_BYTEFALLBACK:
            ns_buf_reset(&run);
            for (size_t i = 0; i < a.n && st == NS_OK; i++) {
                size_t n;
                const char *t = ns_strlist_at(&a, i, &n);
                int v = byte_token(t, n);
                if (v >= 0) {
                    char c = (char)v;
                    st = ns_buf_append(&run, &c, 1);
                    continue;
                }
                if (run.len) {
                    st = run_to_list(&run, &b);
                    ns_buf_reset(&run);
                }
                if (st == NS_OK) st = ns_strlist_push(&b, t, n);
            }
            if (st == NS_OK && run.len) st = run_to_list(&run, &b);
            break;
        case D_REPLACE:
        case D_STRIP:
        case D_METASPACE:
            for (size_t i = 0; i < a.n && st == NS_OK; i++) {
                size_t n;
                const char *t = ns_strlist_at(&a, i, &n);
                if ((st = ns_strlist_begin(&b)) != NS_OK) break;
                ns_buf_reset(&run);
                if (s->type == D_REPLACE) st = replace_token(s, ctx, &sp, t, n, &run, err);
                else if (s->type == D_STRIP) st = strip_token(s, t, n, &run);
                else st = metaspace_token(s, i == 0, t, n, &run);
                if (st == NS_OK) st = ns_strlist_extend(&b, run.data ? run.data : "", run.len);
            }
            break;
        }
        ns_strlist t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n && st == NS_OK; i++) {
        size_t n;
        const char *t = ns_strlist_at(&a, i, &n);
        st = ns_buf_append(out, t, n);
    }
    ns_strlist_free(&a);
    ns_strlist_free(&b);
    ns_buf_free(&run);
    ns_spans_free(&sp);
    if (st == NS_ERR_NOMEM) return ns_fail(err, st, "decode: out of memory");
    return st;
}

/* ---- stream ---- */

typedef struct sstate {
    size_t count;   /* tokens seen (Metaspace) */
    ns_buf pend;    /* ByteFallback run / ByteLevel incomplete UTF-8 tail */
    ns_buf tmp;     /* scratch for this stage's output */
    size_t lead_left; /* Strip (text phase): leading chars still strippable */
    bool lead_done;
    size_t held;      /* Strip (text phase): trailing content chars held back */
} sstate;

struct ns_decstream {
    const ns_decoder *d;
    size_t fuse_at; /* first fusing stage, or d->n */
    bool streamable;
    bool any; /* no decoder: a token was already emitted */
    sstate *s;
    ns_rx_ctx rx;
    ns_spans sp;
};

void ns_decstream_free(ns_decstream *s) {
    if (!s) return;
    size_t n = s->d ? s->d->n : 0;
    for (size_t i = 0; s->s && i < n; i++) {
        ns_buf_free(&s->s[i].pend);
        ns_buf_free(&s->s[i].tmp);
    }
    free(s->s);
    ns_rx_ctx_free(&s->rx);
    ns_spans_free(&s->sp);
    free(s);
}

bool ns_decstream_streamable(const ns_decstream *s) { return s->streamable; }

ns_status ns_decstream_create(const ns_decoder *d, ns_decstream **out) {
    *out = NULL;
    ns_decstream *s = calloc(1, sizeof *s);
    if (!s) return NS_ERR_NOMEM;
    s->d = d;
    s->streamable = true;
    size_t n = d ? d->n : 0;
    s->fuse_at = n;
    if (n && !(s->s = calloc(n, sizeof *s->s))) {
        free(s);
        return NS_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        ns_buf_init(&s->s[i].pend, 0);
        ns_buf_init(&s->s[i].tmp, 0);
        const stage *g = &d->st[i];
        s->s[i].lead_left = g->start;
        if (s->fuse_at == n) {
            if (g->type == D_BYTELEVEL || g->type == D_FUSE) s->fuse_at = i;
            continue;
        }
        /* Text phase: only character-local or prefix/suffix stages stream. */
        if (g->type == D_BYTELEVEL || g->type == D_BYTEFALLBACK ||
            (g->type == D_REPLACE && !ns_pattern_is_single_char(g->pat)))
            s->streamable = false;
    }
    *out = s;
    return NS_OK;
}

static ns_status text_feed(ns_decstream *s, size_t k, const char *t, size_t n, ns_buf *out);

static ns_status text_emit(ns_decstream *s, size_t k, const char *t, size_t n, ns_buf *out) {
    return n ? text_feed(s, k, t, n, out) : NS_OK;
}

/* Text phase: t is a run of whole characters of the single fused token. */
static ns_status text_feed(ns_decstream *s, size_t k, const char *t, size_t n, ns_buf *out) {
    if (k >= s->d->n) return ns_buf_append(out, t, n);
    const stage *g = &s->d->st[k];
    sstate *z = &s->s[k];
    ns_status st = NS_OK;
    switch (g->type) {
    case D_FUSE: return text_feed(s, k + 1, t, n, out);
    case D_METASPACE:
        ns_buf_reset(&z->tmp);
        /* After fusion there is one token, index 0. */
        if ((st = metaspace_token(g, true, t, n, &z->tmp)) != NS_OK) return st;
        return text_emit(s, k + 1, z->tmp.data, z->tmp.len, out);
    case D_REPLACE: {
        /* Streamable only for a one-character literal (checked at create). */
        size_t ll;
        const char *lit = ns_pattern_lit(g->pat, &ll);
        ns_buf_reset(&z->tmp);
        size_t run = 0;
        for (size_t i = 0; i < n && st == NS_OK;) {
            size_t cl = ns_utf8_len((unsigned char)t[i]);
            if (cl == ll && !memcmp(t + i, lit, cl)) {
                st = ns_buf_append(&z->tmp, t + run, i - run);
                if (st == NS_OK) st = ns_buf_append(&z->tmp, g->content, g->content_len);
                run = i + cl;
            }
            i += cl;
        }
        if (st == NS_OK) st = ns_buf_append(&z->tmp, t + run, n - run);
        if (st != NS_OK) return st;
        return text_emit(s, k + 1, z->tmp.data, z->tmp.len, out);
    }
    case D_STRIP:
        ns_buf_reset(&z->tmp);
        for (size_t i = 0; i < n && st == NS_OK;) {
            size_t cl = ns_utf8_len((unsigned char)t[i]);
            bool is_c = cl == g->ch_len && !memcmp(t + i, g->ch, cl);
            if (!z->lead_done) {
                if (z->lead_left > 0 && is_c) {
                    z->lead_left--;
                    i += cl;
                    continue;
                }
                z->lead_done = true;
            }
            if (g->stop > 0 && is_c) {
                if (z->held < g->stop) z->held++;
                else st = ns_buf_append(&z->tmp, g->ch, g->ch_len); /* oldest held one is safe now */
            } else {
                for (; z->held > 0 && st == NS_OK; z->held--) st = ns_buf_append(&z->tmp, g->ch, g->ch_len);
                if (st == NS_OK) st = ns_buf_append(&z->tmp, t + i, cl);
            }
            i += cl;
        }
        if (st != NS_OK) return st;
        return text_emit(s, k + 1, z->tmp.data, z->tmp.len, out);
    case D_BYTELEVEL:
    case D_BYTEFALLBACK: break; /* excluded by ns_decstream_streamable */
    }
    return NS_ERR_INTERNAL;
}

static ns_status tok_feed(ns_decstream *s, size_t k, const char *t, size_t n, ns_buf *out);

/* Sends a ByteFallback run downstream as tokens (see run_to_list). */
static ns_status flush_run(ns_decstream *s, size_t k, ns_buf *out) {
    sstate *z = &s->s[k];
    ns_status st = NS_OK;
    if (!z->pend.len) return NS_OK;
    if (ns_utf8_valid(z->pend.data, z->pend.len, NULL)) {
        st = tok_feed(s, k + 1, z->pend.data, z->pend.len, out);
    } else {
        for (size_t i = 0; i < z->pend.len && st == NS_OK; i++) st = tok_feed(s, k + 1, FFFD, 3, out);
    }
    ns_buf_reset(&z->pend);
    return st;
}

/* Token phase: t is one whole token arriving at stage k. */
static ns_status tok_feed(ns_decstream *s, size_t k, const char *t, size_t n, ns_buf *out) {
    if (k >= s->d->n) return ns_buf_append(out, t, n); /* no fusing stage: final join("") */
    const stage *g = &s->d->st[k];
    sstate *z = &s->s[k];
    ns_status st;
    switch (g->type) {
    case D_FUSE: return text_emit(s, k + 1, t, n, out);
    case D_BYTELEVEL: {
        if ((st = bytelevel_bytes(t, n, &z->pend)) != NS_OK) return st;
        size_t used = 0;
        ns_buf_reset(&z->tmp);
        st = ns_utf8_lossy(&z->tmp, (const unsigned char *)z->pend.data, z->pend.len, false, &used);
        if (st != NS_OK) return st;
        memmove(z->pend.data, z->pend.data + used, z->pend.len - used);
        z->pend.len -= used;
        return text_emit(s, k + 1, z->tmp.data, z->tmp.len, out);
    }
    case D_BYTEFALLBACK: {
        int v = byte_token(t, n);
        if (v >= 0) {
            char c = (char)v;
            return ns_buf_append(&z->pend, &c, 1);
        }
        if ((st = flush_run(s, k, out)) != NS_OK) return st;
        return tok_feed(s, k + 1, t, n, out);
    }
    case D_REPLACE:
        ns_buf_reset(&z->tmp);
        if ((st = replace_token(g, &s->rx, &s->sp, t, n, &z->tmp, NULL)) != NS_OK) return st;
        break;
    case D_STRIP:
        ns_buf_reset(&z->tmp);
        if ((st = strip_token(g, t, n, &z->tmp)) != NS_OK) return st;
        break;
    case D_METASPACE:
        ns_buf_reset(&z->tmp);
        if ((st = metaspace_token(g, z->count++ == 0, t, n, &z->tmp)) != NS_OK) return st;
        break;
    }
    return tok_feed(s, k + 1, z->tmp.data ? z->tmp.data : "", z->tmp.len, out);
}

ns_status ns_decstream_push(ns_decstream *s, const char *tok, size_t n, ns_buf *out) {
    if (!s->d) {
        ns_status st = s->any ? ns_buf_putc(out, ' ') : NS_OK;
        s->any = true;
        return st == NS_OK ? ns_buf_append(out, tok, n) : st;
    }
    if (!s->streamable) return NS_ERR_UNSUPPORTED;
    return tok_feed(s, 0, tok, n, out);
}

ns_status ns_decstream_flush(ns_decstream *s, ns_buf *out) {
    if (!s->d) return NS_OK;
    if (!s->streamable) return NS_ERR_UNSUPPORTED;
    ns_status st = NS_OK;
    for (size_t k = 0; k < s->d->n && st == NS_OK; k++) {
        const stage *g = &s->d->st[k];
        sstate *z = &s->s[k];
        if (k < s->fuse_at && g->type == D_BYTEFALLBACK) {
            st = flush_run(s, k, out);
        } else if (k == s->fuse_at && g->type == D_BYTELEVEL && z->pend.len) {
            ns_buf_reset(&z->tmp);
            st = ns_utf8_lossy(&z->tmp, (const unsigned char *)z->pend.data, z->pend.len, true, NULL);
            ns_buf_reset(&z->pend);
            if (st == NS_OK) st = text_emit(s, k + 1, z->tmp.data, z->tmp.len, out);
        } else if (k > s->fuse_at && g->type == D_STRIP) {
            z->held = 0; /* trailing content characters are stripped at the end */
        }
    }
    return st;
}

void ns_decstream_reset(ns_decstream *s) {
    s->any = false;
    size_t n = s->d ? s->d->n : 0;
    for (size_t k = 0; k < n; k++) {
        sstate *z = &s->s[k];
        z->count = 0;
        ns_buf_reset(&z->pend);
        z->lead_left = s->d->st[k].start;
        z->lead_done = false;
        z->held = 0;
    }
}
