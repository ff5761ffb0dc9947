#include "tokenizer/pretok.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokutil.h"
#include "util/vec.h"

typedef enum { P_SEQ, P_SPLIT, P_BYTELEVEL, P_METASPACE } pretok_type;
typedef enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS } split_behavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

/* The regex ByteLevel applies when use_regex is true (GPT-2's). */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct ns_pretok {
    pretok_type type;
    ns_pretok **kids;
    size_t n_kids;
    ns_pattern *pat;         /* P_SPLIT, P_BYTELEVEL (when use_regex) */
    split_behavior behavior; /* P_SPLIT */
    bool invert;             /* P_SPLIT */
    bool add_prefix_space;   /* P_BYTELEVEL */
    char repl[4];            /* P_METASPACE replacement character */
    size_t repl_len;
    prepend_scheme scheme;   /* P_METASPACE */
    bool split;              /* P_METASPACE */
    char bl[256][2];         /* P_BYTELEVEL: UTF-8 of each byte's character */
    unsigned char bl_len[256];
};

/* ---- pieces ---- */

void ns_pieces_reset(ns_pieces *p) {
    ns_buf_reset(&p->text);
    p->n = 0;
}

void ns_pieces_free(ns_pieces *p) {
    ns_buf_free(&p->text);
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

static ns_status pieces_slot(ns_pieces *p) { return NS_VEC_GROW(p->v, p->cap, p->n + 1, 0); }

ns_status ns_pieces_add(ns_pieces *p, const char *s, size_t n, bool first) {
    if (n == 0) return NS_OK;
    ns_status st = pieces_slot(p);
    if (st != NS_OK) return st;
    size_t off = p->text.len;
    if ((st = ns_buf_append(&p->text, s, n)) != NS_OK) return st;
    p->v[p->n++] = (ns_piece){off, n, first};
    return NS_OK;
}

/* ---- parsing ---- */

void ns_pretok_free(ns_pretok *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_kids; i++) ns_pretok_free(p->kids[i]);
    free(p->kids);
    ns_pattern_free(p->pat);
    free(p);
}

static bool get_bool(const json_t *o, const char *k, bool dflt) {
    const json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static ns_status compile_builtin(const char *rx, ns_pattern **out, ns_error *err) {
    json_t *j = json_pack("{s:s}", "Regex", rx);
    if (!j) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status st = ns_pattern_parse(j, "ByteLevel", out, err);
    json_decref(j);
    return st;
}

ns_status ns_pretok_parse(const json_t *j, ns_pretok **out, ns_error *err) {
    *out = NULL;
    if (!j || json_is_null(j)) return NS_OK;
    if (!json_is_object(j)) return ns_fail(err, NS_ERR_FORMAT, "pre_tokenizer must be an object or null");
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return ns_fail(err, NS_ERR_FORMAT, "pre_tokenizer has no \"type\"");
    ns_pretok *p = calloc(1, sizeof *p);
    if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status st = NS_OK;
    if (!strcmp(type, "Sequence")) {
        p->type = P_SEQ;
        const json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) {
            st = ns_fail(err, NS_ERR_FORMAT, "pre_tokenizer Sequence needs a \"pretokenizers\" array");
            goto done;
        }
        size_t cnt = json_array_size(arr);
        if (!(p->kids = calloc(cnt ? cnt : 1, sizeof *p->kids))) {
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < cnt; i++) {
            if ((st = ns_pretok_parse(json_array_get(arr, i), &p->kids[i], err)) != NS_OK) goto done;
            p->n_kids++;
        }
    } else if (!strcmp(type, "Split")) {
        p->type = P_SPLIT;
        const char *b = json_string_value(json_object_get(j, "behavior"));
        if (!b) {
            st = ns_fail(err, NS_ERR_FORMAT, "pre_tokenizer Split needs a \"behavior\"");
            goto done;
        }
        if (!strcmp(b, "Removed")) p->behavior = B_REMOVED;
        else if (!strcmp(b, "Isolated")) p->behavior = B_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) p->behavior = B_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p->behavior = B_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p->behavior = B_CONTIGUOUS;
        else {
            st = ns_fail(err, NS_ERR_UNSUPPORTED, "pre_tokenizer Split behavior \"%s\" is not supported", b);
            goto done;
        }
        p->invert = get_bool(j, "invert", false);
        st = ns_pattern_parse(json_object_get(j, "pattern"), "pre_tokenizer Split", &p->pat, err);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = P_BYTELEVEL;
        p->add_prefix_space = get_bool(j, "add_prefix_space", true);
        if (get_bool(j, "use_regex", true)) st = compile_builtin(GPT2_REGEX, &p->pat, err);
        for (unsigned b = 0; b < 256; b++) {
            char tmp[4];
            p->bl_len[b] = (unsigned char)ns_utf8_encode(ns_bytelevel_char((unsigned char)b), tmp);
            memcpy(p->bl[b], tmp, p->bl_len[b]);
        }
    } else if (!strcmp(type, "Metaspace")) {
        p->type = P_METASPACE;
        const json_t *r = json_object_get(j, "replacement");
        const char *rs = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        size_t rl = strlen(rs);
        if (rl == 0 || rl > 4 || ns_utf8_len((unsigned char)rs[0]) != rl) {
            st = ns_fail(err, NS_ERR_FORMAT, "pre_tokenizer Metaspace replacement must be one character");
            goto done;
        }
        memcpy(p->repl, rs, rl);
        p->repl_len = rl;
        const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
        if (!scheme) p->scheme = get_bool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        else if (!strcmp(scheme, "always")) p->scheme = PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) p->scheme = PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) p->scheme = PREPEND_NEVER;
        else {
            st = ns_fail(err, NS_ERR_UNSUPPORTED, "pre_tokenizer Metaspace prepend_scheme \"%s\" is not supported",
                         scheme);
            goto done;
        }
        p->split = get_bool(j, "split", true);
    } else {
        st = ns_fail(err, NS_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", type);
    }
done:
    if (st != NS_OK) {
        ns_pretok_free(p);
        return st;
    }
    *out = p;
    return NS_OK;
}

/* ---- running ---- */

/* Cuts piece s[0..n) along spans with the given behavior and appends the
 * kept sub-pieces to out (tokenizers' NormalizedString::split). */
static ns_status split_spans(const char *s, bool first, ns_spans *sp, split_behavior beh, bool invert,
                             ns_pieces *out) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
    /* Reduce spans in place to (start, end, remove) according to behavior.
     * `match` is reused as the "remove" flag in the result. */
    size_t m = 0;
    bool prev_match = false;
    switch (beh) {
    case B_ISOLATED:
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = false;
        m = sp->n;
        break;
    case B_REMOVED: m = sp->n; break;
    case B_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool is_match = sp->v[i].match;
            if (is_match == prev_match && m > 0) sp->v[m - 1].end = sp->v[i].end;
            else sp->v[m++] = (ns_span){sp->v[i].start, sp->v[i].end, false};
            prev_match = is_match;
        }
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            bool is_match = sp->v[i].match;
            if (is_match && !prev_match && m > 0) sp->v[m - 1].end = sp->v[i].end;
            else sp->v[m++] = (ns_span){sp->v[i].start, sp->v[i].end, false};
            prev_match = is_match;
        }
        break;
    case B_MERGED_NEXT: {
        /* Walk backwards, building the result from the end of the array. */
        size_t w = sp->n;
        for (size_t k = sp->n; k-- > 0;) {
            ns_span cur = sp->v[k];
            if (cur.match && !prev_match && w < sp->n) sp->v[w].start = cur.start;
            else sp->v[--w] = (ns_span){cur.start, cur.end, false};
            prev_match = cur.match;
        }
        memmove(sp->v, sp->v + w, (sp->n - w) * sizeof *sp->v);
        m = sp->n - w;
        break;
    }
    }
    for (size_t i = 0; i < m; i++) {
        if (sp->v[i].match) continue; /* removed */
        ns_status st = ns_pieces_add(out, s + sp->v[i].start, sp->v[i].end - sp->v[i].start,
                                     first && sp->v[i].start == 0);
        if (st != NS_OK) return st;
    }
    return NS_OK;
}

static ns_status run_split(const ns_pretok *p, ns_rx_ctx *ctx, const ns_pieces *in, ns_pieces *out, ns_error *err) {
    ns_spans sp = {0};
    ns_status st = NS_OK;
    for (size_t i = 0; i < in->n && st == NS_OK; i++) {
        const char *s = in->text.data + in->v[i].off;
        size_t n = in->v[i].len;
        if ((st = ns_pattern_spans(p->pat, ctx, s, n, &sp, err)) != NS_OK) break;
        if ((st = split_spans(s, in->v[i].first, &sp, p->behavior, p->invert, out)) != NS_OK)
            st = ns_fail(err, st, "pre_tokenizer: out of memory");
    }
    ns_spans_free(&sp);
    return st;
}

/* map_only: the byte mapping alone, without add_prefix_space and the
 * regex (the incremental path already applied them). */
static ns_status run_bytelevel(const ns_pretok *p, ns_rx_ctx *ctx, const ns_pieces *in, ns_pieces *out, bool map_only,
                               ns_error *err) {
    ns_spans sp = {0};
    ns_span whole;
    ns_buf tmp;
    ns_buf_init(&tmp, 0);
    ns_status st = NS_OK;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.data + in->v[i].off;
        size_t n = in->v[i].len;
        if (!map_only && p->add_prefix_space && s[0] != ' ') {
            ns_buf_reset(&tmp);
            if ((st = ns_buf_putc(&tmp, ' ')) != NS_OK || (st = ns_buf_append(&tmp, s, n)) != NS_OK) goto oom;
            s = tmp.data;
            n = tmp.len;
        }
        const ns_span *v = &whole;
        size_t nv = 1;
        whole = (ns_span){0, n, false};
        if (p->pat && !map_only) {
            if ((st = ns_pattern_spans(p->pat, ctx, s, n, &sp, err)) != NS_OK) goto done;
            v = sp.v;
            nv = sp.n;
        }
        for (size_t k = 0; k < nv; k++) {
            /* Each sub-piece becomes its bytes spelled in the GPT-2 alphabet. */
            if (v[k].end == v[k].start) continue;
            if ((st = pieces_slot(out)) != NS_OK) goto oom;
            size_t off = out->text.len;
            for (size_t b = v[k].start; b < v[k].end; b++) {
                unsigned char c = (unsigned char)s[b];
                if ((st = ns_buf_append(&out->text, p->bl[c], p->bl_len[c])) != NS_OK) goto oom;
            }
            out->v[out->n++] = (ns_piece){off, out->text.len - off, in->v[i].first && v[k].start == 0};
        }
    }
    goto done;
oom:
    st = ns_fail(err, st, "pre_tokenizer ByteLevel: out of memory");
done:
    ns_buf_free(&tmp);
    ns_spans_free(&sp);
    return st;
}

static ns_status run_metaspace(const ns_pretok *p, const ns_pieces *in, ns_pieces *out, ns_error *err) {
    ns_buf tmp;
    ns_buf_init(&tmp, 0);
    ns_status st = NS_OK;
    for (size_t i = 0; i < in->n && st == NS_OK; i++) {
        const char *s = in->text.data + in->v[i].off;
        size_t n = in->v[i].len;
        ns_buf_reset(&tmp);
        for (size_t b = 0; b < n && st == NS_OK; b++) {
            if (s[b] == ' ') st = ns_buf_append(&tmp, p->repl, p->repl_len);
            else st = ns_buf_putc(&tmp, s[b]);
        }
        if (st != NS_OK) break;
        bool starts = tmp.len >= p->repl_len && memcmp(tmp.data, p->repl, p->repl_len) == 0;
        bool prepend = !starts && (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && in->v[i].first));
        size_t off = out->text.len;
        if (prepend && (st = ns_buf_append(&out->text, p->repl, p->repl_len)) != NS_OK) break;
        if ((st = ns_buf_append(&out->text, tmp.data, tmp.len)) != NS_OK) break;
        size_t len = out->text.len - off;
        if (!p->split) {
            if ((st = pieces_slot(out)) != NS_OK) break;
            if (len) out->v[out->n++] = (ns_piece){off, len, in->v[i].first};
            continue;
        }
        /* Split on the replacement, each occurrence merged with what follows. */
        size_t start = 0;
        const char *t = out->text.data + off;
        for (size_t b = 1; b + p->repl_len <= len; b++) {
            if (memcmp(t + b, p->repl, p->repl_len) != 0) continue;
            if ((st = pieces_slot(out)) != NS_OK) break;
            out->v[out->n++] = (ns_piece){off + start, b - start, in->v[i].first && start == 0};
            start = b;
            b += p->repl_len - 1;
        }
        if (st != NS_OK) break;
        if (len > start) {
            if ((st = pieces_slot(out)) != NS_OK) break;
            out->v[out->n++] = (ns_piece){off + start, len - start, in->v[i].first && start == 0};
        }
    }
    ns_buf_free(&tmp);
    return st == NS_OK ? NS_OK : ns_fail(err, st, "pre_tokenizer Metaspace: out of memory");
}

ns_status ns_pretok_run(const ns_pretok *p, ns_rx_ctx *ctx, ns_pieces *io, ns_pieces *tmp, ns_error *err) {
    if (!p) return NS_OK;
    if (p->type == P_SEQ) {
        for (size_t i = 0; i < p->n_kids; i++) {
            ns_status st = ns_pretok_run(p->kids[i], ctx, io, tmp, err);
            if (st != NS_OK) return st;
        }
        return NS_OK;
    }
    ns_pieces_reset(tmp);
    ns_status st;
    switch (p->type) {
    case P_SPLIT: st = run_split(p, ctx, io, tmp, err); break;
    case P_BYTELEVEL: st = run_bytelevel(p, ctx, io, tmp, false, err); break;
    case P_METASPACE: st = run_metaspace(p, io, tmp, err); break;
    default: st = ns_fail(err, NS_ERR_INTERNAL, "pre_tokenizer: bad type");
    }
    if (st != NS_OK) return st;
    ns_pieces t = *io;
    *io = *tmp;
    *tmp = t;
    return NS_OK;
}

/* ---- incremental first stage ---- */

bool ns_pretok_iter_init(ns_pretok_iter *it, const ns_pretok *p, const char *s, size_t n, bool first,
                         ns_pretok_rest *rest) {
    memset(it, 0, sizeof *it);
    *rest = NS_PRETOK_REST_OTHER;
    if (!p) return false;
    const ns_pretok *f = p;
    const ns_pretok *const *later = NULL;
    size_t n_later = 0;
    if (p->type == P_SEQ) {
        if (p->n_kids == 0) return false;
        f = p->kids[0];
        later = (const ns_pretok *const *)p->kids + 1;
        n_later = p->n_kids - 1;
    }
    if (f->type == P_SPLIT) {
        if (n_later == 0) *rest = NS_PRETOK_REST_NONE;
        else if (n_later == 1 && later[0]->type == P_BYTELEVEL && !later[0]->pat) *rest = NS_PRETOK_REST_BYTELEVEL;
    } else if (f->type == P_BYTELEVEL && f->pat) {
        /* add_prefix_space would run the regex on " " + text: not in place */
        if (f->add_prefix_space && n > 0 && s[0] != ' ') return false;
        if (n_later == 0) *rest = NS_PRETOK_REST_BYTELEVEL;
    } else {
        return false;
    }
    it->first = f;
    it->s = s;
    it->n = n;
    it->first_flag = first;
    return true;
}

/* The next span of the match / non-match partition (ns_pattern_spans). */
static ns_status next_span(ns_pretok_iter *it, ns_rx_ctx *ctx, size_t *a, size_t *b, bool *match, bool *found,
                           ns_error *err) {
    *found = false;
    if (it->have_match) {
        it->have_match = false;
        *a = it->ma;
        *b = it->prev = it->mb;
        *match = *found = true;
        return NS_OK;
    }
    if (it->prev >= it->n) return NS_OK;
    bool hit;
    size_t ms, me;
    ns_status st = ns_pattern_find(it->first->pat, ctx, it->s, it->n, it->prev, &hit, &ms, &me, err);
    if (st != NS_OK) return st;
    *found = true;
    if (!hit) {
        *a = it->prev;
        *b = it->prev = it->n;
        *match = false;
        return NS_OK;
    }
    if (ms > it->prev) {
        *a = it->prev;
        *b = ms;
        *match = false;
        it->have_match = true;
        it->ma = ms;
        it->mb = me;
        return NS_OK;
    }
    *a = ms;
    *b = it->prev = me;
    *match = true;
    return NS_OK;
}

/* split_spans, one span at a time: when span [a, b) completes a piece,
 * *ready is set and the piece is [*ps, *pe). The caller flushes the
 * pending piece at the end. */
static void transduce(ns_pretok_iter *it, split_behavior beh, size_t a, size_t b, bool match, bool *ready,
                      size_t *ps, size_t *pe) {
    *ready = false;
    switch (beh) {
    case B_ISOLATED:
        *ready = true, *ps = a, *pe = b;
        return;
    case B_REMOVED:
        if (!match) *ready = true, *ps = a, *pe = b;
        return;
    case B_CONTIGUOUS:
        if (it->have_pend && match == it->prev_match) {
            it->pe = b;
        } else {
            if (it->have_pend) *ready = true, *ps = it->ps, *pe = it->pe;
            it->have_pend = true, it->ps = a, it->pe = b;
        }
        it->prev_match = match;
        return;
    case B_MERGED_PREV:
        if (it->have_pend && match && !it->prev_match) {
            it->pe = b;
        } else {
            if (it->have_pend) *ready = true, *ps = it->ps, *pe = it->pe;
            it->have_pend = true, it->ps = a, it->pe = b;
        }
        it->prev_match = match;
        return;
    case B_MERGED_NEXT:
        if (it->have_pend) { /* a match waiting for what follows */
            if (!match) {
                it->have_pend = false;
                *ready = true, *ps = it->ps, *pe = b;
                return;
            }
            *ready = true, *ps = it->ps, *pe = it->pe;
            it->ps = a, it->pe = b; /* this match waits in turn */
            return;
        }
        if (match) it->have_pend = true, it->ps = a, it->pe = b;
        else *ready = true, *ps = a, *pe = b;
        return;
    }
}

ns_status ns_pretok_iter_next(ns_pretok_iter *it, ns_rx_ctx *ctx, size_t *start, size_t *end, bool *first,
                              bool *found, ns_error *err) {
    *found = false;
    const bool bytelevel = it->first->type == P_BYTELEVEL;
    const split_behavior beh = bytelevel ? B_ISOLATED : it->first->behavior;
    const bool invert = !bytelevel && it->first->invert;
    while (!it->done) {
        size_t a, b;
        bool match, got, ready;
        ns_status st = next_span(it, ctx, &a, &b, &match, &got, err);
        if (st != NS_OK) return st;
        if (!got) {
            it->done = true;
            if (!it->have_pend) break;
            it->have_pend = false;
            if (it->ps == it->pe) break;
            *start = it->ps, *end = it->pe;
            *first = it->first_flag && it->ps == 0;
            *found = true;
            return NS_OK;
        }
        transduce(it, beh, a, b, invert ? !match : match, &ready, start, end);
        if (ready && *end > *start) { /* empty pieces are dropped, as ns_pieces_add does */
            *first = it->first_flag && *start == 0;
            *found = true;
            return NS_OK;
        }
    }
    return NS_OK;
}

ns_status ns_pretok_run_rest(const ns_pretok *p, ns_rx_ctx *ctx, ns_pieces *io, ns_pieces *tmp, ns_error *err) {
    if (!p) return NS_OK;
    const ns_pretok *f = p->type == P_SEQ ? p->kids[0] : p;
    ns_status st;
    if (f->type == P_BYTELEVEL) { /* its byte mapping is still to do */
        ns_pieces_reset(tmp);
        if ((st = run_bytelevel(f, ctx, io, tmp, true, err)) != NS_OK) return st;
        ns_pieces t = *io;
        *io = *tmp;
        *tmp = t;
    }
    if (p->type != P_SEQ) return NS_OK;
    for (size_t i = 1; i < p->n_kids; i++)
        if ((st = ns_pretok_run(p->kids[i], ctx, io, tmp, err)) != NS_OK) return st;
    return NS_OK;
}

bool ns_pretok_is_metaspace(const ns_pretok *p, uint32_t *repl) {
    if (!p || p->type != P_METASPACE) return false;
    ns_utf8_decode(p->repl, p->repl_len, 0, repl);
    return true;
}
