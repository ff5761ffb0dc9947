/* prompt_diff.c — cache-break attribution between two turns (see prompt_diff.h). */
#include "record/prompt_diff.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

#define DETAIL_CAP ((size_t)64 << 10)
#define CONTEXT 24   /* bytes of common text shown around a difference */
#define DIFF_CAP 160 /* bytes of each differing middle shown */

const char *ns_pdiff_kind_name(ns_pdiff_kind k) {
    switch (k) {
    case NS_PDIFF_SYSTEM_CHANGED: return "system_prompt_changed";
    case NS_PDIFF_TOOLS_CHANGED: return "tools_changed";
    case NS_PDIFF_MESSAGE_EDITED: return "message_edited";
    case NS_PDIFF_MESSAGE_REMOVED: return "message_removed";
    case NS_PDIFF_REASONING_STRIPPED: return "reasoning_stripped";
    case NS_PDIFF_WHITESPACE_TRIMMED: return "whitespace_trimmed";
    case NS_PDIFF_TEMPLATE_RERENDER: return "template_rerender";
    }
    return "unknown";
}

void ns_pdiff_result_free(ns_pdiff_result *r) {
    for (int i = 0; i < r->n_reasons; i++) free(r->reasons[i].detail);
    free(r->reasons);
    memset(r, 0, sizeof *r);
}

/* Steps back from i to a UTF-8 character start (never below lo). */
static size_t char_start(const char *s, size_t i, size_t lo) {
    while (i > lo && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Appends s[0..n) as one escaped line ("\n" for newlines), cut to cap
 * bytes on a character boundary with "…" when cut. */
static void put_escaped(ns_buf *b, const char *s, size_t n, size_t cap) {
    size_t end = n > cap ? char_start(s, cap, 0) : n;
    for (size_t i = 0; i < end; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') ns_buf_puts(b, "\\n");
        else if (ch == '\t') ns_buf_puts(b, "\\t");
        else if (ch == '\r') ns_buf_puts(b, "\\r");
        else if (ch == '"') ns_buf_puts(b, "\\\"");
        else if (ch == '\\') ns_buf_puts(b, "\\\\");
        else if (ch < 0x20) ns_buf_printf(b, "\\x%02x", ch);
        else ns_buf_putc(b, (char)ch);
    }
    if (end < n) ns_buf_puts(b, "…");
}

char *ns_pdiff_text_diff(const char *a, size_t na, const char *b, size_t nb, size_t cap) {
    size_t p = 0;
    while (p < na && p < nb && a[p] == b[p]) p++;
    p = char_start(a, p, 0);
    size_t s = 0;
    while (s < na - p && s < nb - p && a[na - 1 - s] == b[nb - 1 - s]) s++;
    while (s > 0 && ((unsigned char)a[na - s] & 0xC0) == 0x80) s--; /* the suffix starts on a character */
    ns_buf out;
    ns_buf_init(&out, DETAIL_CAP);
    size_t ctx = p > CONTEXT ? char_start(a, p - CONTEXT, 0) : 0;
    ns_buf_puts(&out, "at byte ");
    ns_buf_printf(&out, "%zu: \"", p);
    if (ctx > 0) ns_buf_puts(&out, "…");
    put_escaped(&out, a + ctx, p - ctx, CONTEXT * 2);
    ns_buf_puts(&out, "\" then -\"");
    put_escaped(&out, a + p, na - p - s, cap);
    ns_buf_puts(&out, "\" +\"");
    put_escaped(&out, b + p, nb - p - s, cap);
    ns_buf_puts(&out, "\"");
    char *r = ns_buf_take(&out, NULL);
    ns_buf_free(&out);
    return r;
}

/* A message's text: a string content, or its text parts joined with '\n'
 * (as the chat path renders them); "" for null/absent. */
static void msg_text(const json_t *m, const char *key, ns_buf *b) {
    ns_buf_reset(b);
    ns_buf_puts(b, "");
    const json_t *c = json_object_get(m, key);
    if (json_is_string(c)) {
        ns_buf_append(b, json_string_value(c), json_string_length(c));
        return;
    }
    size_t i, k = 0;
    json_t *part;
    json_array_foreach(c, i, part) {
        const json_t *t = json_is_string(part) ? part : json_object_get(part, "text");
        if (!json_is_string(t)) continue;
        if (k++) ns_buf_putc(b, '\n');
        ns_buf_append(b, json_string_value(t), json_string_length(t));
    }
}

static const char *role_of(const json_t *m) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r ? r : "";
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Equal once leading and trailing whitespace is cut from both. */
static bool trim_equal(const char *a, size_t na, const char *b, size_t nb) {
    while (na && is_ws(*a)) a++, na--;
    while (nb && is_ws(*b)) b++, nb--;
    while (na && is_ws(a[na - 1])) na--;
    while (nb && is_ws(b[nb - 1])) nb--;
    return na == nb && memcmp(a, b, na) == 0;
}

/* Leading/trailing whitespace bytes of s. */
static void ws_ends(const char *s, size_t n, size_t *lead, size_t *trail) {
    *lead = *trail = 0;
    while (*lead < n && is_ws(s[*lead])) (*lead)++;
    while (*trail < n - *lead && is_ws(s[n - 1 - *trail])) (*trail)++;
}

static bool add_reason(ns_pdiff_result *r, ns_pdiff_kind k, int msg, char *detail) {
    ns_pdiff_reason *nr = realloc(r->reasons, (size_t)(r->n_reasons + 1) * sizeof *nr);
    if (!nr || !detail) {
        free(detail);
        if (nr) r->reasons = nr;
        return false;
    }
    r->reasons = nr;
    r->reasons[r->n_reasons++] = (ns_pdiff_reason){k, msg, detail};
    return true;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    ns_buf b;
    ns_buf_init(&b, DETAIL_CAP);
    char tmp[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(tmp, sizeof tmp, f, ap);
    va_end(ap);
    ns_buf_puts(&b, tmp);
    char *s = ns_buf_take(&b, NULL);
    ns_buf_free(&b);
    return s;
}

/* WHITESPACE_TRIMMED or MESSAGE_EDITED for two texts of message i that differ. */
static bool text_reason(ns_pdiff_result *r, int i, const ns_buf *was, const ns_buf *now, const char *what) {
    if (trim_equal(was->data, was->len, now->data, now->len)) {
        size_t l0, t0, l1, t1;
        ws_ends(was->data, was->len, &l0, &t0);
        ws_ends(now->data, now->len, &l1, &t1);
        return add_reason(r, NS_PDIFF_WHITESPACE_TRIMMED, i,
                          fmt(l0 != l1 ? "%s: leading whitespace %zu -> %zu bytes" : "%s: trailing whitespace %zu -> %zu bytes",
                              what, l0 != l1 ? l0 : t0, l0 != l1 ? l1 : t1));
    }
    char *d = ns_pdiff_text_diff(was->data, was->len, now->data, now->len, DIFF_CAP);
    char *full = NULL;
    if (d) {
        ns_buf b;
        ns_buf_init(&b, DETAIL_CAP);
        ns_buf_printf(&b, "%s: %s", what, d);
        full = ns_buf_take(&b, NULL);
        ns_buf_free(&b);
    }
    free(d);
    return add_reason(r, NS_PDIFF_MESSAGE_EDITED, i, full);
}

/* The tool names (function.name or name) of a tools array, one line. */
static void tool_names(const json_t *tools, const json_t *other, ns_buf *b, const char *sign) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *n = json_string_value(json_object_get(fn ? fn : t, "name"));
        bool same = false;
        size_t j;
        json_t *u;
        json_array_foreach(other, j, u) same |= json_equal(t, u);
        if (!same) ns_buf_printf(b, " %s%s", sign, n ? n : "(unnamed)");
    }
}

static bool tools_reason(ns_pdiff_result *r, const json_t *pt, const json_t *ct) {
    if (json_is_null(pt)) pt = NULL;
    if (json_is_null(ct)) ct = NULL;
    if ((!pt && !ct) || (pt && ct && json_equal(pt, ct))) return true;
    ns_buf b;
    ns_buf_init(&b, DETAIL_CAP);
    ns_buf_puts(&b, "tools:");
    tool_names(pt, ct, &b, "-");
    tool_names(ct, pt, &b, "+");
    if (pt && ct && json_array_size(pt) == json_array_size(ct) && b.len == 6) ns_buf_puts(&b, " reordered");
    char *s = ns_buf_take(&b, NULL);
    ns_buf_free(&b);
    return add_reason(r, NS_PDIFF_TOOLS_CHANGED, -1, s);
}

/* Two versions of message i (from P and from C) that differ. */
static bool message_reason(ns_pdiff_result *r, int i, const json_t *pm, const json_t *cm, ns_buf *t0, ns_buf *t1) {
    char what[48];
    snprintf(what, sizeof what, "message %d (%s)", i, role_of(cm));
    if (strcmp(role_of(pm), role_of(cm)) != 0) {
        snprintf(what, sizeof what, "message %d", i);
        return add_reason(r, NS_PDIFF_MESSAGE_EDITED, i, fmt("%s: role %s -> %s", what, role_of(pm), role_of(cm)));
    }
    int before = r->n_reasons;
    if (strcmp(role_of(cm), "assistant") == 0) {
        msg_text(pm, "reasoning_content", t0);
        msg_text(cm, "reasoning_content", t1);
        if (t0->len > 0 && t1->len == 0 &&
            !add_reason(r, NS_PDIFF_REASONING_STRIPPED, i, fmt("%s: %zu bytes of reasoning_content removed", what, t0->len)))
            return false;
    }
    msg_text(pm, "content", t0);
    msg_text(cm, "content", t1);
    if ((t0->len != t1->len || memcmp(t0->data, t1->data, t0->len) != 0) && !text_reason(r, i, t0, t1, what))
        return false;
    if (r->n_reasons == before) /* other fields: tool_calls, name, tool_call_id, ... */
        return add_reason(r, NS_PDIFF_MESSAGE_EDITED, i, fmt("%s: fields other than the text differ", what));
    return true;
}

/* C's message at P's answer position against what P generated. */
static bool answer_reason(ns_pdiff_result *r, int i, const ns_pdiff_turn *p, const json_t *cm, ns_buf *t0, ns_buf *t1) {
    if (strcmp(role_of(cm), "assistant") != 0 || !p->out_content) return true;
    char what[64];
    snprintf(what, sizeof what, "message %d (the previous answer)", i);
    msg_text(cm, "reasoning_content", t1);
    if (p->out_reasoning && p->out_reasoning[0] && t1->len == 0 &&
        !add_reason(r, NS_PDIFF_REASONING_STRIPPED, i,
                    fmt("%s: the %zu bytes of reasoning generated are not sent back", what, strlen(p->out_reasoning))))
        return false;
    ns_buf_reset(t0);
    ns_buf_puts(t0, p->out_content);
    msg_text(cm, "content", t1);
    if (t0->len == t1->len && memcmp(t0->data, t1->data, t0->len) == 0) return true;
    if (json_array_size(json_object_get(cm, "tool_calls")) > 0 && t1->len == 0) return true; /* content left out of a tool call */
    return text_reason(r, i, t0, t1, what);
}

/* TEMPLATE_RERENDER's detail: where the rendered texts part. */
static char *rerender_detail(const ns_pdiff_turn *p, const ns_pdiff_turn *c, size_t d) {
    if (d >= p->n_ids)
        return fmt("the previous answer re-tokenizes differently from the tokens generated (%zu tokens into the "
                   "answer)",
                   d - p->n_ids);
    if (!p->text || !c->text) return fmt("the rendered prompt's tokens differ from token %zu on", d);
    size_t na = strlen(p->text), nb = strlen(c->text), k = 0;
    while (k < na && k < nb && p->text[k] == c->text[k]) k++;
    /* compare P's rendering with the same stretch of C's: C goes on past it */
    size_t span = na - k < 200 ? na - k : 200;
    size_t nb2 = nb - k < span ? nb - k : span;
    ns_buf b;
    ns_buf_init(&b, DETAIL_CAP);
    size_t ctx = k > CONTEXT ? char_start(p->text, k - CONTEXT, 0) : 0;
    ns_buf_printf(&b, "rendered prompt differs at token %zu (byte %zu): \"", d, k);
    put_escaped(&b, p->text + ctx, k - ctx, CONTEXT * 2);
    ns_buf_puts(&b, "\" then -\"");
    put_escaped(&b, p->text + k, span, 80);
    ns_buf_puts(&b, "\" +\"");
    put_escaped(&b, c->text + k, nb2, 80);
    ns_buf_puts(&b, "\"");
    char *s = ns_buf_take(&b, NULL);
    ns_buf_free(&b);
    return s;
}

/* Completions: the items are one prompt string each. */
static bool prompt_reasons(ns_pdiff_result *r, const json_t *ps, const json_t *cs) {
    const char *a = json_string_value(ps), *b = json_string_value(cs);
    size_t na = json_string_length(ps), nb = json_string_length(cs);
    if (nb >= na && memcmp(a, b, na) == 0)
        return add_reason(r, NS_PDIFF_TEMPLATE_RERENDER, 0,
                          fmt("the prompt text extends the previous one, but a token merges across the end of the "
                              "previous prompt (byte %zu), so its tokens differ there", na));
    return add_reason(r, NS_PDIFF_MESSAGE_EDITED, 0, ns_pdiff_text_diff(a, na, b, nb, DIFF_CAP));
}

static bool message_reasons(ns_pdiff_result *r, const ns_pdiff_turn *p, const ns_pdiff_turn *c, ns_buf *t0, ns_buf *t1) {
    size_t np = json_array_size(p->items), nc = json_array_size(c->items);
    if (json_is_string(json_array_get(p->items, 0)) && json_is_string(json_array_get(c->items, 0)))
        return prompt_reasons(r, json_array_get(p->items, 0), json_array_get(c->items, 0));
    const json_t *p0 = json_array_get(p->items, 0), *c0 = json_array_get(c->items, 0);
    bool ps = np && strcmp(role_of(p0), "system") == 0, cs = nc && strcmp(role_of(c0), "system") == 0;
    size_t start = 0;
    if (ps || cs) {
        msg_text(p0, "content", t0);
        msg_text(c0, "content", t1);
        if (ps && cs) {
            start = 1;
            if ((t0->len != t1->len || memcmp(t0->data, t1->data, t0->len) != 0)) {
                char *d = ns_pdiff_text_diff(t0->data, t0->len, t1->data, t1->len, DIFF_CAP);
                if (!add_reason(r, NS_PDIFF_SYSTEM_CHANGED, 0, d)) return false;
            }
        } else if (!add_reason(r, NS_PDIFF_SYSTEM_CHANGED, 0,
                               fmt("the system prompt was %s", ps ? "removed" : "added"))) {
            return false;
        }
    }
    if (!tools_reason(r, p->tools, c->tools)) return false;
    /* after an added/removed system message the indices shift by one */
    size_t op = ps && !cs ? 1 : 0, oc = cs && !ps ? 1 : 0;
    for (size_t i = start; i + op < np && i + oc < nc; i++) {
        const json_t *pm = json_array_get(p->items, i + op), *cm = json_array_get(c->items, i + oc);
        if (!json_equal(pm, cm) && !message_reason(r, (int)(i + oc), pm, cm, t0, t1)) return false;
    }
    if (nc - oc < np - op)
        return add_reason(r, NS_PDIFF_MESSAGE_REMOVED, (int)(nc - oc),
                          fmt("history: %zu of the previous turn's %zu messages are gone", (np - op) - (nc - oc), np - op));
    if (nc - oc > np - op) return answer_reason(r, (int)(np - op + oc), p, json_array_get(c->items, np - op + oc), t0, t1);
    return true;
}

bool ns_pdiff_compare(const ns_pdiff_turn *p, const ns_pdiff_turn *c, ns_pdiff_result *out) {
    memset(out, 0, sizeof *out);
    /* the cache holds P's prompt and what P generated, but the last token
     * generated was never fed back (no KV): it is not reusable */
    size_t n_out = p->out_ids && p->n_out_ids > 0 ? p->n_out_ids - 1 : 0;
    out->reusable = p->n_ids + n_out;
    size_t d = 0;
    while (d < c->n_ids && d < p->n_ids && c->ids[d] == p->ids[d]) d++;
    if (d == p->n_ids)
        while (d < c->n_ids && d - p->n_ids < n_out && c->ids[d] == p->out_ids[d - p->n_ids]) d++;
    out->diverge_at = d;
    out->append_only = d == out->reusable;
    if (out->append_only) return true;
    out->prefill_tokens = c->n_ids - d;
    out->lost_tokens = out->reusable - d;
    ns_buf t0, t1;
    ns_buf_init(&t0, (size_t)1 << 30);
    ns_buf_init(&t1, (size_t)1 << 30);
    bool ok = message_reasons(out, p, c, &t0, &t1);
    ns_buf_free(&t0);
    ns_buf_free(&t1);
    if (ok && out->n_reasons == 0) ok = add_reason(out, NS_PDIFF_TEMPLATE_RERENDER, -1, rerender_detail(p, c, d));
    if (!ok) ns_pdiff_result_free(out);
    return ok;
}
