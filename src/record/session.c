/* session.c — recordings and their sessions (see session.h). */
#include "record/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

ns_rec_api ns_rec_api_of(const char *ep) {
    if (!ep) return NS_REC_OTHER;
    if (strcmp(ep, "/v1/chat/completions") == 0) return NS_REC_CHAT;
    if (strcmp(ep, "/v1/completions") == 0) return NS_REC_COMPLETIONS;
    if (strcmp(ep, "/v1/messages") == 0) return NS_REC_MESSAGES;
    if (strcmp(ep, "/v1/responses") == 0) return NS_REC_RESPONSES;
    return NS_REC_OTHER;
}

/* "system"/"instructions" as a first message. */
static json_t *lead_message(const json_t *v) {
    return json_pack("{s:s,s:O}", "role", "system", "content", (json_t *)v);
}

json_t *ns_session_items(const json_t *body, ns_rec_api kind) {
    if (!json_is_object(body)) return NULL;
    json_t *out = json_array();
    if (!out) return NULL;
    const json_t *msgs = NULL;
    switch (kind) {
    case NS_REC_COMPLETIONS: {
        const json_t *p = json_object_get(body, "prompt");
        if (!p) goto none;
        json_array_append(out, (json_t *)p);
        return out;
    }
    case NS_REC_MESSAGES: {
        const json_t *sys = json_object_get(body, "system");
        if (sys && !json_is_null(sys)) json_array_append_new(out, lead_message(sys));
        msgs = json_object_get(body, "messages");
        break;
    }
    case NS_REC_RESPONSES: {
        const json_t *ins = json_object_get(body, "instructions");
        if (ins && !json_is_null(ins)) json_array_append_new(out, lead_message(ins));
        msgs = json_object_get(body, "input");
        if (json_is_string(msgs)) {
            json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", (json_t *)msgs));
            return out;
        }
        break;
    }
    default:
        msgs = json_object_get(body, "messages");
        break;
    }
    if (!json_is_array(msgs)) goto none;
    json_array_extend(out, (json_t *)msgs);
    return out;
none:
    json_decref(out);
    return NULL;
}

/* Leading items equal in a and b. */
static size_t common_prefix(const json_t *a, const json_t *b) {
    size_t n = json_array_size(a) < json_array_size(b) ? json_array_size(a) : json_array_size(b), i = 0;
    while (i < n && json_equal(json_array_get(a, i), json_array_get(b, i))) i++;
    return i;
}

static const json_t *first_user(const json_t *items) {
    size_t i;
    json_t *m;
    json_array_foreach(items, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && strcmp(role, "user") == 0) return json_object_get(m, "content");
    }
    return NULL;
}

/* Rule 1 for completions: the last prompt is a proper string prefix. */
static bool prompt_extends(const json_t *last, const json_t *cur) {
    const json_t *a = json_array_get(last, 0), *b = json_array_get(cur, 0);
    if (!json_is_string(a) || !json_is_string(b)) return false;
    size_t la = json_string_length(a), lb = json_string_length(b);
    return la < lb && memcmp(json_string_value(a), json_string_value(b), la) == 0;
}

static ns_status add_turn(ns_recording *r, int sess, int idx) {
    ns_rec_session *s = &r->s[sess];
    int *ni = realloc(s->idx, (size_t)(s->n + 1) * sizeof *ni);
    if (!ni) return NS_ERR_NOMEM;
    s->idx = ni;
    s->idx[s->n] = idx;
    r->e[idx].session = sess;
    r->e[idx].turn = s->n++;
    return NS_OK;
}

/* Picks the session entry i continues (-1: a new one). */
static int pick_session(const ns_recording *r, int i) {
    const ns_rec_entry *e = &r->e[i];
    int best = -1;
    size_t best_pre = 0;
    for (int s = 0; s < r->n_sessions; s++) { /* rule 1 */
        const ns_rec_entry *last = &r->e[r->s[s].idx[r->s[s].n - 1]];
        if (last->kind != e->kind || strcmp(last->endpoint, e->endpoint) != 0) continue;
        size_t nl = json_array_size(last->items), ne = json_array_size(e->items);
        bool ext;
        size_t pre;
        if (e->kind == NS_REC_COMPLETIONS) {
            ext = prompt_extends(last->items, e->items);
            pre = ext ? json_string_length(json_array_get(last->items, 0)) : 0;
        } else {
            pre = common_prefix(last->items, e->items);
            ext = nl > 0 && pre == nl && ne > nl;
        }
        if (ext && (best < 0 || pre >= best_pre)) best = s, best_pre = pre;
    }
    if (best >= 0 || e->kind == NS_REC_COMPLETIONS) return best;
    const json_t *fu = first_user(e->items);
    if (!fu) return -1;
    for (int s = r->n_sessions - 1; s >= 0; s--) { /* rule 2: the most recent session first */
        const ns_rec_entry *last = &r->e[r->s[s].idx[r->s[s].n - 1]];
        if (last->kind != e->kind || strcmp(last->endpoint, e->endpoint) != 0) continue;
        const json_t *lu = first_user(last->items);
        if (lu && json_equal(lu, fu) && json_array_size(e->items) >= json_array_size(last->items)) return s;
    }
    return -1;
}

static int by_time(const void *a, const void *b) {
    const ns_rec_entry *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->line - y->line; /* stable: file order for equal times */
}

void ns_recording_free(ns_recording *r) {
    for (int i = 0; i < r->n; i++) {
        json_decref(r->e[i].rec);
        json_decref(r->e[i].items);
    }
    for (int s = 0; s < r->n_sessions; s++) free(r->s[s].idx);
    free(r->e);
    free(r->s);
    memset(r, 0, sizeof *r);
}

ns_status ns_recording_from(json_t **recs, int n, ns_recording *out, ns_error *err) {
    memset(out, 0, sizeof *out);
    ns_status rc = NS_OK;
    out->e = calloc(n > 0 ? (size_t)n : 1, sizeof *out->e);
    out->s = calloc(n > 0 ? (size_t)n : 1, sizeof *out->s);
    if (!out->e || !out->s) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        json_t *rec = recs[i];
        recs[i] = NULL;
        const json_t *body = json_object_get(rec, "request");
        if (!json_is_object(body)) {
            out->n_skipped++;
            json_decref(rec);
            continue;
        }
        ns_rec_entry *e = &out->e[out->n++];
        e->rec = rec;
        e->body = body;
        e->line = i + 1;
        e->endpoint = json_string_value(json_object_get(rec, "endpoint"));
        if (!e->endpoint) e->endpoint = "/v1/chat/completions";
        e->kind = ns_rec_api_of(e->endpoint);
        e->t = json_number_value(json_object_get(rec, "t"));
        e->duration_s = json_number_value(json_object_get(rec, "duration_s"));
        e->redacted = json_is_true(json_object_get(rec, "redacted"));
        out->any_redacted |= e->redacted;
        e->items = ns_session_items(body, e->kind);
        if (!e->items) e->items = json_array();
    }
    for (int i = 0; i < n; i++) json_decref(recs[i]); /* the rest, on an early failure */
    qsort(out->e, (size_t)out->n, sizeof *out->e, by_time);
    for (int i = 0; i < out->n; i++) {
        int s = pick_session(out, i);
        if (s < 0) s = out->n_sessions++;
        if (add_turn(out, s, i) != NS_OK) {
            rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    return NS_OK;
fail:
    for (int i = 0; i < n; i++) json_decref(recs[i]);
    ns_recording_free(out);
    return rc;
}

/* Reads one line (without its newline) into b, whose cap bounds it.
 * 1: a line; 0: end of file; -1: over the cap; -2: read error. */
static int read_line(FILE *f, ns_buf *b) {
    char chunk[65536];
    ns_buf_reset(b);
    bool any = false;
    while (fgets(chunk, sizeof chunk, f)) {
        any = true;
        size_t n = strlen(chunk);
        bool nl = n > 0 && chunk[n - 1] == '\n';
        if (ns_buf_append(b, chunk, nl ? n - 1 : n) != NS_OK) return -1;
        if (nl) return 1;
    }
    if (ferror(f)) return -2;
    return any ? 1 : 0;
}

ns_status ns_recording_load(const char *path, ns_recording *out, ns_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return ns_fail(err, NS_ERR_IO, "%s: cannot open", path);
    json_t **recs = NULL;
    int n = 0, cap = 0, lineno = 0, got;
    ns_buf line;
    ns_buf_init(&line, NS_RECORDING_MAX_LINE);
    ns_status rc = NS_OK;
    while ((got = read_line(f, &line)) == 1) {
        lineno++;
        size_t k = line.len;
        while (k && (line.data[k - 1] == '\r' || line.data[k - 1] == ' ')) k--;
        if (k == 0) continue;
        if (n >= NS_RECORDING_MAX_RECORDS) {
            rc = ns_fail(err, NS_ERR_RANGE, "%s: more than %d records", path, NS_RECORDING_MAX_RECORDS);
            goto done;
        }
        json_error_t je;
        json_t *v = json_loadb(line.data, k, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(v)) {
            json_decref(v);
            rc = ns_fail(err, NS_ERR_FORMAT, "%s:%d: not a JSON object (%s)", path, lineno,
                         v ? "another JSON value" : je.text);
            goto done;
        }
        if (n == cap) {
            int nc = cap ? cap * 2 : 64;
            json_t **nr = realloc(recs, (size_t)nc * sizeof *nr);
            if (!nr) {
                json_decref(v);
                rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
                goto done;
            }
            recs = nr;
            cap = nc;
        }
        recs[n++] = v;
    }
    if (got == -1)
        rc = ns_fail(err, NS_ERR_RANGE, "%s:%d: line longer than %zu bytes", path, lineno + 1, NS_RECORDING_MAX_LINE);
    else if (got == -2)
        rc = ns_fail(err, NS_ERR_IO, "%s: read error", path);
done:
    ns_buf_free(&line);
    fclose(f);
    if (rc == NS_OK) rc = ns_recording_from(recs, n, out, err);
    else
        for (int i = 0; i < n; i++) json_decref(recs[i]);
    free(recs);
    return rc;
}
