/* toolcall.c — tool-call parser: a byte-at-a-time automaton (see toolcall.h). */
#include "api/toolcall.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"
#include "util/vec.h"

enum { M_TEXT = 0, M_PLAIN, M_JSTART, M_PRE, M_OBJ, M_POST, M_JAFTER };
enum { O_KEY_OR_END = 0, O_KEY_START, O_KEY, O_COLON, O_VAL_START, O_VAL, O_AFTER_VAL };
enum { T_SKIP = 0, T_NAME, T_ARGS_STREAM, T_ARGS_PEND, T_ARGS_STR };
enum { R_OK = 0, R_MAL, R_END, R_ERR };

static const char OPEN[] = "<tool_call>";
static const char CLOSE[] = "</tool_call>";
#define OPEN_N (sizeof OPEN - 1)
#define CLOSE_N (sizeof CLOSE - 1)
#define MAX_KEY 256
#define MAX_DEPTH 512
#define BUF_CAP ((size_t)64 << 20)

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

ns_status ns_toolparse_init(ns_toolparse *p, ns_toolfmt fmt, const char *const *names, int n_names, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    ns_buf_init(&p->content, BUF_CAP);
    ns_buf_init(&p->ws, BUF_CAP);
    ns_buf_init(&p->raw, BUF_CAP);
    ns_buf_init(&p->key, MAX_KEY + 8);
    ns_buf_init(&p->val, BUF_CAP);
    ns_buf_init(&p->pend_args, BUF_CAP);
    p->mode = fmt == NS_TOOLFMT_LLAMA_JSON ? M_JSTART : fmt == NS_TOOLFMT_HERMES ? M_TEXT : M_PLAIN;
    if (n_names > 0 && names) {
        p->names = calloc((size_t)n_names, sizeof *p->names);
        if (!p->names) return NS_ERR_NOMEM;
        for (int i = 0; i < n_names; i++) {
            p->names[i] = strdup(names[i]);
            if (!p->names[i]) {
                p->n_names = i;
                ns_toolparse_free(p);
                return NS_ERR_NOMEM;
            }
        }
        p->n_names = n_names;
    }
    return NS_OK;
}

void ns_toolparse_free(ns_toolparse *p) {
    for (int i = 0; i < p->n_names; i++) free(p->names[i]);
    free(p->names);
    for (int i = 0; i < p->n_calls; i++) {
        ns_buf_free(&p->calls[i].name);
        ns_buf_free(&p->calls[i].args);
    }
    free(p->calls);
    ns_buf_free(&p->content);
    ns_buf_free(&p->ws);
    ns_buf_free(&p->raw);
    ns_buf_free(&p->key);
    ns_buf_free(&p->val);
    ns_buf_free(&p->pend_args);
    memset(p, 0, sizeof *p);
}

/* Content text, with whitespace held back until something non-blank
 * follows (so blanks before a tool call can be dropped). */
static ns_status text_char(ns_toolparse *p, char c) {
    if (is_ws(c)) return p->drop_ws ? NS_OK : ns_buf_putc(&p->ws, c);
    p->drop_ws = false;
    if (p->ws.len) {
        ns_status rc = ns_buf_append(&p->content, p->ws.data, p->ws.len);
        if (rc != NS_OK) return rc;
        ns_buf_reset(&p->ws);
    }
    return ns_buf_putc(&p->content, c);
}

static ns_status text_str(ns_toolparse *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ns_status rc = text_char(p, s[i]);
        if (rc != NS_OK) return rc;
    }
    return NS_OK;
}

static void reset_call_state(ns_toolparse *p) {
    ns_buf_reset(&p->raw);
    ns_buf_reset(&p->key);
    ns_buf_reset(&p->val);
    ns_buf_reset(&p->pend_args);
    p->sub = O_KEY_OR_END;
    p->val_target = T_SKIP;
    p->depth = 0;
    p->in_str = p->esc = p->scalar = false;
    p->have_name = p->have_args = false;
    p->cur_committed = false;
}

/* An uncommitted call turned out not to be one: its text is content. */
static ns_status revert(ns_toolparse *p) {
    ns_status rc = text_str(p, p->raw.data ? p->raw.data : "", p->raw.len);
    reset_call_state(p);
    p->mode = p->fmt == NS_TOOLFMT_HERMES ? M_TEXT : M_PLAIN;
    return rc;
}

/* ids only need to be unique, not secret */
static uint64_t next_rand(ns_toolparse *p) { return ns_splitmix64(&p->rng); }

static bool name_allowed(const ns_toolparse *p, const char *s) {
    if (p->n_names == 0) return true;
    for (int i = 0; i < p->n_names; i++)
        if (strcmp(p->names[i], s) == 0) return true;
    return false;
}

static ns_tool_call *cur_call(ns_toolparse *p) { return &p->calls[p->n_calls - 1]; }

/* The "name" value is complete: commit the call. Returns R_MAL when it is
 * not a usable name. */
static int commit(ns_toolparse *p) {
    json_error_t je;
    json_t *v = json_loadb(p->val.data ? p->val.data : "", p->val.len, JSON_DECODE_ANY, &je);
    int r = R_MAL;
    if (!v || !json_is_string(v) || json_string_length(v) == 0 ||
        strlen(json_string_value(v)) != json_string_length(v) || !name_allowed(p, json_string_value(v)))
        goto done;
    if (p->n_calls >= NS_TOOL_MAX_CALLS) goto done;
    if (NS_VEC_GROW(p->calls, p->cap_calls, (size_t)p->n_calls + 1, NS_TOOL_MAX_CALLS) != NS_OK) {
        r = R_ERR;
        goto done;
    }
    ns_tool_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    ns_buf_init(&c->name, 4096);
    ns_buf_init(&c->args, BUF_CAP);
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    memcpy(c->id, "call_", 5);
    for (int i = 0; i < 24; i++) c->id[5 + i] = alnum[next_rand(p) % 62];
    c->id[29] = 0;
    if (ns_buf_puts(&c->name, json_string_value(v)) != NS_OK) {
        ns_buf_free(&c->name);
        ns_buf_free(&c->args);
        goto done; /* absurdly long name: not a call */
    }
    p->n_calls++;
    if (p->pend_args.len && ns_buf_append(&c->args, p->pend_args.data, p->pend_args.len) != NS_OK) {
        r = R_ERR;
        goto done;
    }
    ns_buf_reset(&p->pend_args);
    ns_buf_reset(&p->raw);
    ns_buf_reset(&p->ws); /* blanks between content and the call */
    p->drop_ws = true;    /* ... and between the call and what follows */
    p->cur_committed = true;
    p->have_name = true;
    r = R_OK;
done:
    json_decref(v);
    return r;
}

static int value_done(ns_toolparse *p) {
    switch (p->val_target) {
    case T_NAME:
        return commit(p);
    case T_ARGS_STR: {
        /* arguments given as a JSON-encoded string: its content is the text */
        json_error_t je;
        json_t *v = json_loadb(p->val.data ? p->val.data : "", p->val.len, JSON_DECODE_ANY, &je);
        if (!v || !json_is_string(v)) {
            json_decref(v);
            return R_MAL;
        }
        ns_buf *dst = p->cur_committed ? &cur_call(p)->args : &p->pend_args;
        ns_status rc = ns_buf_append(dst, json_string_value(v), json_string_length(v));
        json_decref(v);
        if (rc != NS_OK) return R_ERR;
        p->have_args = true;
        return R_OK;
    }
    case T_ARGS_STREAM:
    case T_ARGS_PEND:
        p->have_args = true;
        return R_OK;
    default:
        return R_OK;
    }
}

static int emit_val(ns_toolparse *p, char c) {
    ns_status rc = NS_OK;
    switch (p->val_target) {
    case T_NAME:
    case T_ARGS_STR:
        rc = ns_buf_putc(&p->val, c);
        break;
    case T_ARGS_STREAM:
        rc = ns_buf_putc(&cur_call(p)->args, c);
        break;
    case T_ARGS_PEND:
        rc = ns_buf_putc(&p->pend_args, c);
        break;
    default:
        break;
    }
    return rc == NS_OK ? R_OK : R_ERR;
}

static bool key_is(const ns_toolparse *p, const char *k) {
    return p->key.len == strlen(k) && memcmp(p->key.data, k, p->key.len) == 0;
}

/* One byte inside the call's JSON object. */
static int obj_char(ns_toolparse *p, char c) {
    switch (p->sub) {
    case O_KEY_OR_END:
        if (is_ws(c)) return R_OK;
        if (c == '"') {
            ns_buf_reset(&p->key);
            p->esc = false;
            p->sub = O_KEY;
            return R_OK;
        }
        return c == '}' ? R_END : R_MAL;
    case O_KEY_START:
        if (is_ws(c)) return R_OK;
        if (c != '"') return R_MAL;
        ns_buf_reset(&p->key);
        p->esc = false;
        p->sub = O_KEY;
        return R_OK;
    case O_KEY:
        if (!p->esc && c == '"') {
            p->sub = O_COLON;
            return R_OK;
        }
        p->esc = !p->esc && c == '\\';
        if (p->key.len >= MAX_KEY) return R_MAL;
        return ns_buf_putc(&p->key, c) == NS_OK ? R_OK : R_ERR;
    case O_COLON:
        if (is_ws(c)) return R_OK;
        if (c != ':') return R_MAL;
        p->sub = O_VAL_START;
        return R_OK;
    case O_VAL_START:
        if (is_ws(c)) return R_OK;
        if (c == ',' || c == '}' || c == ']' || c == ':') return R_MAL;
        ns_buf_reset(&p->val);
        if (key_is(p, "name") && !p->have_name) {
            p->val_target = T_NAME;
        } else if ((key_is(p, "arguments") || key_is(p, "parameters")) && !p->have_args) {
            p->val_target = c == '"' ? T_ARGS_STR : p->cur_committed ? T_ARGS_STREAM : T_ARGS_PEND;
        } else {
            p->val_target = T_SKIP;
        }
        p->depth = (c == '{' || c == '[') ? 1 : 0;
        p->in_str = c == '"';
        p->esc = false;
        p->scalar = !p->depth && !p->in_str;
        p->sub = O_VAL;
        return emit_val(p, c);
    case O_VAL:
        if (p->scalar) {
            if (c == ',' || c == '}' || is_ws(c)) {
                int r = value_done(p);
                if (r != R_OK) return r;
                p->sub = O_AFTER_VAL;
                return obj_char(p, c);
            }
            if (c == '{' || c == '[' || c == ']' || c == '"' || c == ':') return R_MAL;
            return emit_val(p, c);
        }
        {
            int r = emit_val(p, c);
            if (r != R_OK) return r;
        }
        if (p->in_str) {
            if (p->esc) p->esc = false;
            else if (c == '\\') p->esc = true;
            else if (c == '"') {
                p->in_str = false;
                if (p->depth == 0) {
                    p->sub = O_AFTER_VAL;
                    return value_done(p);
                }
            }
            return R_OK;
        }
        if (c == '"') p->in_str = true;
        else if (c == '{' || c == '[') {
            if (++p->depth > MAX_DEPTH) return R_MAL;
        } else if (c == '}' || c == ']') {
            if (--p->depth == 0) {
                p->sub = O_AFTER_VAL;
                return value_done(p);
            }
        }
        return R_OK;
    case O_AFTER_VAL:
        if (is_ws(c)) return R_OK;
        if (c == ',') {
            p->sub = O_KEY_START;
            return R_OK;
        }
        return c == '}' ? R_END : R_MAL;
    }
    return R_MAL;
}

static void start_call(ns_toolparse *p) {
    reset_call_state(p);
    p->sub = O_KEY_OR_END;
}

/* Where a Llama-JSON call may start: '{' opens one (true, *rc set);
 * anything else makes the rest of the output plain text (false). */
static bool json_call_open(ns_toolparse *p, char c, ns_status *rc) {
    if (c != '{') {
        p->mode = M_PLAIN;
        return false;
    }
    start_call(p);
    p->mode = M_OBJ;
    *rc = ns_buf_putc(&p->raw, c);
    return true;
}

static ns_status end_call(ns_toolparse *p) {
    ns_tool_call *c = cur_call(p);
    c->complete = true;
    if (!p->have_args && ns_buf_puts(&c->args, "{}") != NS_OK) return NS_ERR_NOMEM;
    json_error_t je;
    json_t *v = json_loadb(c->args.data ? c->args.data : "", c->args.len, 0, &je);
    c->valid = v && json_is_object(v);
    json_decref(v);
    reset_call_state(p);
    p->tagpos = 0;
    p->mode = p->fmt == NS_TOOLFMT_HERMES ? M_POST : M_JAFTER;
    return NS_OK;
}

static ns_status step(ns_toolparse *p, char c) {
    ns_status rc;
    for (;;) {
        switch (p->mode) {
        case M_PLAIN:
            return text_char(p, c);
        case M_TEXT:
            if (c == OPEN[p->tagpos]) {
                if (++p->tagpos == OPEN_N) {
                    p->tagpos = 0;
                    start_call(p);
                    p->mode = M_PRE;
                    return ns_buf_puts(&p->raw, OPEN);
                }
                return NS_OK;
            }
            if (p->tagpos) { /* '<' occurs only first in the tag: restart */
                rc = text_str(p, OPEN, (size_t)p->tagpos);
                p->tagpos = 0;
                if (rc != NS_OK) return rc;
                continue;
            }
            return text_char(p, c);
        case M_JSTART:
            if (is_ws(c)) return ns_buf_putc(&p->ws, c);
            if (json_call_open(p, c, &rc)) return rc;
            continue;
        case M_PRE:
            if (is_ws(c)) return ns_buf_putc(&p->raw, c);
            if (c == '{') {
                p->mode = M_OBJ;
                p->sub = O_KEY_OR_END;
                return ns_buf_putc(&p->raw, c);
            }
            rc = revert(p);
            if (rc != NS_OK) return rc;
            continue;
        case M_OBJ: {
            int r = obj_char(p, c);
            if (r == R_ERR) return NS_ERR_NOMEM;
            if (r == R_MAL) {
                if (p->cur_committed) {
                    /* too late to take the name back: the call ends here
                     * (invalid) and the byte is looked at again as text */
                    cur_call(p)->complete = false;
                    cur_call(p)->valid = false;
                    reset_call_state(p);
                    p->mode = p->fmt == NS_TOOLFMT_HERMES ? M_TEXT : M_PLAIN;
                    continue;
                }
                rc = revert(p);
                if (rc != NS_OK) return rc;
                continue;
            }
            if (r == R_END) {
                if (!p->cur_committed) {
                    if (ns_buf_putc(&p->raw, c) != NS_OK) return NS_ERR_NOMEM;
                    return revert(p);
                }
                return end_call(p);
            }
            if (!p->cur_committed) return ns_buf_putc(&p->raw, c);
            return NS_OK;
        }
        case M_POST:
            if (p->tagpos == 0 && is_ws(c)) return NS_OK;
            if (c == CLOSE[p->tagpos]) {
                if (++p->tagpos == (int)CLOSE_N) {
                    p->tagpos = 0;
                    p->mode = M_TEXT;
                }
                return NS_OK;
            }
            /* no closing tag: whatever follows is text again */
            rc = text_str(p, CLOSE, (size_t)p->tagpos);
            p->tagpos = 0;
            p->mode = M_TEXT;
            if (rc != NS_OK) return rc;
            continue;
        case M_JAFTER:
            if (is_ws(c) || c == ';') return NS_OK;
            if (json_call_open(p, c, &rc)) return rc;
            continue;
        default:
            return NS_ERR_INTERNAL;
        }
    }
}

ns_status ns_toolparse_feed(ns_toolparse *p, const char *text, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ns_status rc = step(p, text[i]);
        if (rc != NS_OK) return rc;
    }
    return NS_OK;
}

ns_status ns_toolparse_finish(ns_toolparse *p) {
    ns_status rc = NS_OK;
    switch (p->mode) {
    case M_TEXT:
        rc = text_str(p, OPEN, (size_t)p->tagpos);
        break;
    case M_PRE:
    case M_OBJ:
        if (p->cur_committed) {
            cur_call(p)->complete = false;
            cur_call(p)->valid = false;
            reset_call_state(p);
        } else {
            rc = revert(p);
        }
        break;
    case M_POST:
        rc = text_str(p, CLOSE, (size_t)p->tagpos);
        break;
    default:
        break;
    }
    p->tagpos = 0;
    p->mode = M_PLAIN;
    if (rc != NS_OK) return rc;
    if (p->n_calls == 0 && p->ws.len) rc = ns_buf_append(&p->content, p->ws.data, p->ws.len);
    ns_buf_reset(&p->ws);
    return rc;
}

int ns_toolparse_n_valid(const ns_toolparse *p) {
    int n = 0;
    for (int i = 0; i < p->n_calls; i++) n += p->calls[i].valid;
    return n;
}

bool ns_toolparse_all_valid(const ns_toolparse *p) {
    for (int i = 0; i < p->n_calls; i++)
        if (!p->calls[i].valid) return false;
    return true;
}
