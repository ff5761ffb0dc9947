/* toolcall.c — tool-call parser: a byte-at-a-time automaton (see toolcall.h). */
#include "api/toolcall.h"

#include <stdlib.h>
#include <string.h>

#include "util/hash.h"
#include "util/vec.h"

/* modes: where the automaton is */
enum {
    M_TEXT = 0, /* content, watching for the format's opening tags */
    M_PLAIN,    /* content for good (no calls can follow) */
    M_JSTART,   /* Llama JSON: before the first '{' */
    M_PRE,      /* after <tool_call>: JSON or <function= body */
    M_OBJ,      /* inside a call's JSON object */
    M_POST,     /* after the body: </tool_call> */
    M_JAFTER,   /* Llama JSON: between calls */
    M_XFUNC,    /* after <tool_call>: matching <function= */
    M_XNAME,    /* <function=NAME> */
    M_XBODY,    /* between parameters: <parameter= or </function> */
    M_XPNAME,   /* <parameter=NAME> */
    M_XPVAL,    /* a parameter value, up to </parameter> */
    M_MSTART,   /* after [TOOL_CALLS]: '[' (array) or a name */
    M_MNAME,    /* a name-first call's name */
    M_MTAG,     /* [ARGS] or [CALL_ID] after the name */
    M_MCALLID,  /* the call id, up to [ARGS] */
    M_MARGS,    /* the arguments object of a name-first call */
    M_MARR,     /* inside the v3 array: expecting an object */
    M_MARR_AFTER /* inside the v3 array: ',' or ']' */
};
/* what opened the current call, which decides what follows its end */
enum { C_NONE = 0, C_HERMES_TAG, C_LLAMA, C_XML_TAG, C_XML_BARE, C_MISTRAL_ARR, C_MISTRAL_NAME };
enum { O_KEY_OR_END = 0, O_KEY_START, O_KEY, O_COLON, O_VAL_START, O_VAL, O_AFTER_VAL };
enum { T_SKIP = 0, T_NAME, T_ARGS_STREAM, T_ARGS_PEND, T_ARGS_STR };
enum { R_OK = 0, R_MAL, R_END, R_ERR };
enum { TAG_HOLD = 0, TAG_FULL, TAG_MISS };
/* JSON types a parameter schema allows */
enum { J_STR = 1, J_INT = 2, J_NUM = 4, J_BOOL = 8, J_NULL = 16, J_OBJ = 32, J_ARR = 64 };

static const char T_OPEN[] = "<tool_call>";
static const char T_CLOSE[] = "</tool_call>";
static const char T_FUNC[] = "<function=";
static const char T_FUNC_END[] = "</function>";
static const char T_PARAM[] = "<parameter=";
static const char T_PARAM_END[] = "</parameter>";
static const char T_MCALLS[] = "[TOOL_CALLS]";
static const char T_MARGS[] = "[ARGS]";
static const char T_MCALLID[] = "[CALL_ID]";
#define MAX_KEY 256
#define MAX_NAME 256
#define MAX_CALL_ID 64
#define MAX_DEPTH 512
#define MAX_SCHEMA_DEPTH 8
#define BUF_CAP ((size_t)64 << 20)

static ns_status step(ns_toolparse *p, char c);

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
    p->mode = fmt == NS_TOOLFMT_LLAMA_JSON ? M_JSTART : fmt == NS_TOOLFMT_NONE ? M_PLAIN : M_TEXT;
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

ns_status ns_toolparse_set_schemas(ns_toolparse *p, const json_t *tools) {
    if (!json_is_array(tools)) return NS_OK;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_is_object(json_object_get(t, "function")) ? json_object_get(t, "function") : t;
        const char *name = json_string_value(json_object_get(fn, "name"));
        const json_t *schema = json_object_get(fn, "parameters");
        if (!schema) schema = json_object_get(fn, "input_schema");
        const json_t *props = json_object_get(schema, "properties");
        if (!name || !json_is_object(props)) continue;
        if (!p->schemas && !(p->schemas = json_object())) return NS_ERR_NOMEM;
        json_t *copy = json_deep_copy(props);
        if (!copy || json_object_set_new(p->schemas, name, copy) != 0) return NS_ERR_NOMEM;
    }
    return NS_OK;
}

void ns_toolparse_free(ns_toolparse *p) {
    for (int i = 0; i < p->n_names; i++) free(p->names[i]);
    free(p->names);
    json_decref(p->schemas);
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

/* ---------- content ---------- */

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

/* Matches c against tags, continuing the bytes held in p->tag. No tag is
 * a prefix of another in a set, and every tag's first byte occurs nowhere
 * else in it, so after a miss the held bytes can be released as they are
 * and c looked at afresh: no match is ever missed across fragments. */
static int tag_step(ns_toolparse *p, char c, const char *const *tags, int n, int *which) {
    size_t k = (size_t)p->tagpos;
    for (int i = 0; i < n; i++) {
        size_t tl = strlen(tags[i]);
        if (k < tl && memcmp(tags[i], p->tag, k) == 0 && tags[i][k] == c) {
            if (k + 1 == tl) {
                p->tagpos = 0;
                *which = i;
                return TAG_FULL;
            }
            p->tag[k] = c;
            p->tagpos++;
            return TAG_HOLD;
        }
    }
    return TAG_MISS;
}

/* Feeds held bytes through the automaton again (a partial tag that turned
 * out to begin something else). */
static ns_status replay(ns_toolparse *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ns_status rc = step(p, s[i]);
        if (rc != NS_OK) return rc;
    }
    return NS_OK;
}

static int base_mode(const ns_toolparse *p) {
    return p->fmt == NS_TOOLFMT_LLAMA_JSON || p->fmt == NS_TOOLFMT_NONE ? M_PLAIN : M_TEXT;
}

static void reset_call_state(ns_toolparse *p) {
    ns_buf_reset(&p->raw);
    ns_buf_reset(&p->key);
    ns_buf_reset(&p->val);
    ns_buf_reset(&p->pend_args);
    p->sub = O_KEY_OR_END;
    p->val_target = T_SKIP;
    p->depth = 0;
    p->tagpos = 0;
    p->in_str = p->esc = p->scalar = p->vstarted = false;
    p->have_name = p->have_args = false;
    p->cur_committed = false;
    p->pmask = 0;
    p->pstream = false;
    p->val_sent = 0;
    p->n_params = 0;
}

/* An uncommitted call turned out not to be one: its text is content,
 * except its last `keep` bytes (a partial tag, which may begin another
 * call), which are looked at again. */
static ns_status revert_keep(ns_toolparse *p, size_t keep) {
    char held[sizeof p->tag];
    if (keep > p->raw.len) keep = p->raw.len;
    if (keep > sizeof held) keep = sizeof held;
    if (keep) memcpy(held, p->raw.data + p->raw.len - keep, keep);
    ns_status rc = text_str(p, p->raw.data ? p->raw.data : "", p->raw.len - keep);
    reset_call_state(p);
    p->mode = base_mode(p);
    if (rc == NS_OK) rc = replay(p, held, keep);
    return rc;
}

static ns_status revert(ns_toolparse *p) { return revert_keep(p, 0); }

static ns_tool_call *cur_call(ns_toolparse *p) { return &p->calls[p->n_calls - 1]; }

/* A committed call went bad (tags out of order, not an object): it stays,
 * invalid and incomplete; the held partial tag is replayed as text and the
 * caller looks at the current byte again. */
static ns_status abandon(ns_toolparse *p) {
    char held[sizeof p->tag];
    size_t keep = (size_t)p->tagpos;
    memcpy(held, p->tag, keep);
    cur_call(p)->complete = false;
    cur_call(p)->valid = false;
    reset_call_state(p);
    p->mode = base_mode(p);
    return replay(p, held, keep);
}

/* ---------- calls ---------- */

/* ids only need to be unique, not secret */
static uint64_t next_rand(ns_toolparse *p) { return ns_splitmix64(&p->rng); }

static bool name_allowed(const ns_toolparse *p, const char *s) {
    if (p->n_names == 0) return true;
    for (int i = 0; i < p->n_names; i++)
        if (strcmp(p->names[i], s) == 0) return true;
    return false;
}

static void make_id(ns_toolparse *p, char *id) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if (p->fmt == NS_TOOLFMT_MISTRAL) { /* the templates demand [A-Za-z0-9]{9} */
        for (int i = 0; i < 9; i++) id[i] = alnum[next_rand(p) % 62];
        id[9] = 0;
        return;
    }
    memcpy(id, "call_", 5);
    for (int i = 0; i < 24; i++) id[5 + i] = alnum[next_rand(p) % 62];
    id[29] = 0;
}

/* The call's name is complete: commit the call. R_MAL when it is not a
 * usable name (empty, NUL inside, not offered, too many calls). */
static int commit_name(ns_toolparse *p, const char *name, size_t len) {
    if (len == 0 || len > MAX_NAME || memchr(name, 0, len)) return R_MAL;
    char buf[MAX_NAME + 1];
    memcpy(buf, name, len);
    buf[len] = 0;
    if (!name_allowed(p, buf) || p->n_calls >= NS_TOOL_MAX_CALLS) return R_MAL;
    if (NS_VEC_GROW(p->calls, p->cap_calls, (size_t)p->n_calls + 1, NS_TOOL_MAX_CALLS) != NS_OK) return R_ERR;
    ns_tool_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    ns_buf_init(&c->name, 4096);
    ns_buf_init(&c->args, BUF_CAP);
    make_id(p, c->id);
    if (ns_buf_puts(&c->name, buf) != NS_OK) {
        ns_buf_free(&c->name);
        ns_buf_free(&c->args);
        return R_ERR;
    }
    p->n_calls++;
    if (p->pend_args.len && ns_buf_append(&c->args, p->pend_args.data, p->pend_args.len) != NS_OK) return R_ERR;
    ns_buf_reset(&p->pend_args);
    ns_buf_reset(&p->raw);
    ns_buf_reset(&p->ws); /* blanks between content and the call */
    p->drop_ws = true;    /* ... and between the call and what follows */
    p->cur_committed = true;
    p->have_name = true;
    return R_OK;
}

/* The JSON "name" value (in p->val) is complete: commit the call. */
static int commit(ns_toolparse *p) {
    json_error_t je;
    json_t *v = json_loadb(p->val.data ? p->val.data : "", p->val.len, JSON_DECODE_ANY, &je);
    int r = R_MAL;
    if (v && json_is_string(v)) r = commit_name(p, json_string_value(v), json_string_length(v));
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

static void start_call(ns_toolparse *p, int ctx) {
    reset_call_state(p);
    p->ctx = ctx;
}

/* The call's body closed: check its arguments and go on to what may
 * follow it in its format. */
static ns_status end_call(ns_toolparse *p) {
    ns_tool_call *c = cur_call(p);
    c->complete = true;
    if (!p->have_args && ns_buf_puts(&c->args, "{}") != NS_OK) return NS_ERR_NOMEM;
    json_error_t je;
    json_t *v = json_loadb(c->args.data ? c->args.data : "", c->args.len, 0, &je);
    c->valid = v && json_is_object(v);
    json_decref(v);
    reset_call_state(p);
    switch (p->ctx) {
    case C_HERMES_TAG:
    case C_XML_TAG:
        p->mode = M_POST;
        break;
    case C_LLAMA:
        p->mode = M_JAFTER;
        break;
    case C_MISTRAL_ARR:
        p->mode = M_MARR_AFTER;
        break;
    default:
        p->mode = M_TEXT;
        break;
    }
    return NS_OK;
}

/* ---------- JSON escaping and XML parameter typing ---------- */

static ns_status put_escaped(ns_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        ns_status rc;
        switch (c) {
        case '"': rc = ns_buf_puts(b, "\\\""); break;
        case '\\': rc = ns_buf_puts(b, "\\\\"); break;
        case '\n': rc = ns_buf_puts(b, "\\n"); break;
        case '\r': rc = ns_buf_puts(b, "\\r"); break;
        case '\t': rc = ns_buf_puts(b, "\\t"); break;
        case '\b': rc = ns_buf_puts(b, "\\b"); break;
        case '\f': rc = ns_buf_puts(b, "\\f"); break;
        default:
            rc = c < 0x20 ? ns_buf_printf(b, "\\u%04x", c) : ns_buf_putc(b, (char)c);
            break;
        }
        if (rc != NS_OK) return rc;
    }
    return NS_OK;
}

static ns_status put_json_string(ns_buf *b, const char *s, size_t n) {
    ns_status rc = ns_buf_putc(b, '"');
    if (rc == NS_OK) rc = put_escaped(b, s, n);
    if (rc == NS_OK) rc = ns_buf_putc(b, '"');
    return rc;
}

static unsigned type_bit(const char *t) {
    static const struct { const char *name; unsigned bit; } k[] = {
        {"string", J_STR}, {"integer", J_INT}, {"number", J_NUM}, {"boolean", J_BOOL},
        {"null", J_NULL},  {"object", J_OBJ},  {"array", J_ARR},
    };
    for (size_t i = 0; t && i < sizeof k / sizeof k[0]; i++)
        if (strcmp(t, k[i].name) == 0) return k[i].bit;
    return 0;
}

static unsigned value_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: return J_STR;
    case JSON_INTEGER: return J_INT;
    case JSON_REAL: return J_NUM;
    case JSON_TRUE:
    case JSON_FALSE: return J_BOOL;
    case JSON_NULL: return J_NULL;
    case JSON_OBJECT: return J_OBJ;
    default: return J_ARR;
    }
}

/* The JSON types a schema allows: its "type", the types of its anyOf /
 * oneOf / allOf members, enum and const values. 0: not said (any). */
static unsigned schema_types(const json_t *s, int depth) {
    if (!json_is_object(s) || depth > MAX_SCHEMA_DEPTH) return 0;
    unsigned m = 0;
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) m |= type_bit(json_string_value(t));
    size_t i;
    const json_t *e;
    if (json_is_array(t)) json_array_foreach(t, i, e) m |= type_bit(json_string_value(e));
    static const char *const combos[] = {"anyOf", "oneOf", "allOf"};
    for (size_t k = 0; k < 3; k++) {
        const json_t *arr = json_object_get(s, combos[k]);
        if (json_is_array(arr)) json_array_foreach(arr, i, e) m |= schema_types(e, depth + 1);
    }
    const json_t *en = json_object_get(s, "enum");
    if (json_is_array(en)) json_array_foreach(en, i, e) m |= value_bit(e);
    if (json_object_get(s, "const")) m |= value_bit(json_object_get(s, "const"));
    return m;
}

/* How the current parameter's value is typed: a string (no schema for it,
 * or its schema allows only strings) or JSON of the allowed types. */
static void param_kind(ns_toolparse *p) {
    const json_t *props = json_object_get(p->schemas, cur_call(p)->name.data);
    const json_t *s = props ? json_object_get(props, p->key.data) : NULL;
    p->pmask = s ? schema_types(s, 0) : J_STR;
    p->pstream = p->pmask == J_STR;
}

/* A finished non-string value as JSON text: the model's text when it
 * parses to an allowed type, Python's True/False/None spelled the JSON
 * way, else the text as a string. */
static ns_status put_typed(ns_buf *b, const char *s, size_t n, unsigned mask) {
    size_t a = 0, z = n;
    while (a < z && is_ws(s[a])) a++;
    while (z > a && is_ws(s[z - 1])) z--;
    json_error_t je;
    json_t *v = json_loadb(s + a, z - a, JSON_DECODE_ANY, &je);
    if (v) {
        unsigned bit = value_bit(v);
        /* a number is a number: 5.0 for an integer stays as written */
        bool ok = mask == 0 || (bit & mask) || ((bit & (J_INT | J_NUM)) && (mask & (J_INT | J_NUM)));
        json_decref(v);
        if (ok) return ns_buf_append(b, s + a, z - a);
    } else {
        static const struct { const char *py, *js; unsigned bit; } lit[] = {
            {"True", "true", J_BOOL}, {"False", "false", J_BOOL}, {"None", "null", J_NULL}};
        for (size_t i = 0; i < 3; i++)
            if (z - a == strlen(lit[i].py) && memcmp(s + a, lit[i].py, z - a) == 0 && (mask == 0 || (mask & lit[i].bit)))
                return ns_buf_puts(b, lit[i].js);
    }
    return put_json_string(b, s, n);
}

/* <parameter=NAME> closed: the key (and, for a string, the opening quote)
 * go out at once so the client sees the parameter start. */
static ns_status param_open(ns_toolparse *p) {
    param_kind(p);
    ns_buf_reset(&p->val);
    p->val_sent = 0;
    p->vstarted = false;
    if (!p->pstream) return NS_OK;
    ns_buf *a = &cur_call(p)->args;
    ns_status rc = p->n_params ? ns_buf_puts(a, ", ") : NS_OK;
    if (rc == NS_OK) rc = put_json_string(a, p->key.data, p->key.len);
    if (rc == NS_OK) rc = ns_buf_puts(a, ": \"");
    return rc;
}

/* A string value's new bytes, holding back a trailing newline (it is
 * dropped when </parameter> follows). */
static ns_status param_stream(ns_toolparse *p) {
    size_t end = p->val.len;
    if (end > p->val_sent && p->val.data[end - 1] == '\n') end--;
    if (end <= p->val_sent) return NS_OK;
    ns_status rc = put_escaped(&cur_call(p)->args, p->val.data + p->val_sent, end - p->val_sent);
    p->val_sent = end;
    return rc;
}

static ns_status param_close(ns_toolparse *p) {
    if (p->val.len && p->val.data[p->val.len - 1] == '\n') p->val.len--;
    ns_buf *a = &cur_call(p)->args;
    const char *v = p->val.data ? p->val.data : ""; /* an empty value has no buffer */
    ns_status rc;
    if (p->pstream) {
        rc = put_escaped(a, v + p->val_sent, p->val.len - p->val_sent);
        if (rc == NS_OK) rc = ns_buf_putc(a, '"');
    } else {
        rc = p->n_params ? ns_buf_puts(a, ", ") : NS_OK;
        if (rc == NS_OK) rc = put_json_string(a, p->key.data, p->key.len);
        if (rc == NS_OK) rc = ns_buf_puts(a, ": ");
        if (rc == NS_OK) rc = put_typed(a, v, p->val.len, p->pmask);
    }
    p->n_params++;
    ns_buf_reset(&p->val);
    ns_buf_reset(&p->key);
    p->mode = M_XBODY;
    return rc;
}

/* ---------- the automaton, one handler per mode ----------
 * A handler consumes c, or sets *again to have it looked at in the new
 * mode. */

static ns_status on_text(ns_toolparse *p, char c, bool *again) {
    static const char *const hermes[] = {T_OPEN};
    static const char *const xml[] = {T_OPEN, T_FUNC};
    static const char *const mistral[] = {T_MCALLS};
    const char *const *tags = p->fmt == NS_TOOLFMT_QWEN_XML ? xml : p->fmt == NS_TOOLFMT_MISTRAL ? mistral : hermes;
    int n = p->fmt == NS_TOOLFMT_QWEN_XML ? 2 : 1, w = 0;
    int r = tag_step(p, c, tags, n, &w);
    if (r == TAG_HOLD) return NS_OK;
    if (r == TAG_MISS) {
        if (!p->tagpos) return text_char(p, c);
        ns_status rc = text_str(p, p->tag, (size_t)p->tagpos);
        p->tagpos = 0;
        *again = true;
        return rc;
    }
    if (tags[w] == T_FUNC) {
        start_call(p, C_XML_BARE);
        p->mode = M_XNAME;
    } else if (tags[w] == T_MCALLS) {
        start_call(p, C_MISTRAL_NAME);
        p->mode = M_MSTART;
    } else {
        start_call(p, C_HERMES_TAG);
        p->mode = M_PRE;
    }
    return ns_buf_puts(&p->raw, tags[w]);
}

/* After <tool_call>: a JSON object or a <function=...> block. */
static ns_status on_pre(ns_toolparse *p, char c, bool *again) {
    if (is_ws(c)) return ns_buf_putc(&p->raw, c);
    if (c == '{') {
        p->ctx = C_HERMES_TAG;
        p->mode = M_OBJ;
        p->sub = O_KEY_OR_END;
        return ns_buf_putc(&p->raw, c);
    }
    *again = true;
    if (c == '<') {
        p->ctx = C_XML_TAG;
        p->mode = M_XFUNC;
        return NS_OK;
    }
    return revert(p);
}

static ns_status on_obj(ns_toolparse *p, char c, bool *again) {
    int r = obj_char(p, c);
    if (r == R_ERR) return NS_ERR_NOMEM;
    if (r == R_MAL) {
        *again = true;
        if (p->cur_committed) return abandon(p); /* too late to take the name back */
        return revert(p);
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

/* After a call's body: blanks, then </tool_call>; else text again. */
static ns_status on_post(ns_toolparse *p, char c, bool *again) {
    static const char *const close[] = {T_CLOSE};
    if (p->tagpos == 0 && is_ws(c)) return NS_OK;
    int w, r = tag_step(p, c, close, 1, &w);
    if (r == TAG_FULL) p->mode = M_TEXT;
    if (r != TAG_MISS) return NS_OK;
    ns_status rc = text_str(p, p->tag, (size_t)p->tagpos);
    p->tagpos = 0;
    p->mode = M_TEXT;
    *again = true;
    return rc;
}

/* Llama JSON: a '{' opens a call; anything else makes the rest of the
 * output plain text. */
static ns_status on_json_open(ns_toolparse *p, char c, bool *again) {
    if (c != '{') {
        p->mode = M_PLAIN;
        *again = true;
        return NS_OK;
    }
    start_call(p, C_LLAMA);
    p->mode = M_OBJ;
    return ns_buf_putc(&p->raw, c);
}

/* After <tool_call> and blanks: <function= (uncommitted). */
static ns_status on_xfunc(ns_toolparse *p, char c, bool *again) {
    static const char *const func[] = {T_FUNC};
    int w, r = tag_step(p, c, func, 1, &w);
    if (r == TAG_MISS) {
        size_t keep = (size_t)p->tagpos;
        p->tagpos = 0;
        *again = true;
        return revert_keep(p, keep);
    }
    if (r == TAG_FULL) {
        ns_buf_reset(&p->val);
        p->mode = M_XNAME;
    }
    return ns_buf_putc(&p->raw, c);
}

/* <function=NAME>: the name commits the call at '>'. */
static ns_status on_xname(ns_toolparse *p, char c, bool *again) {
    if (c == '\n' || c == '<' || (c != '>' && p->val.len >= MAX_NAME)) {
        *again = true;
        return revert(p);
    }
    ns_status rc = ns_buf_putc(&p->raw, c);
    if (rc != NS_OK) return rc;
    if (c != '>') return ns_buf_putc(&p->val, c);
    int r = commit_name(p, p->val.data ? p->val.data : "", p->val.len);
    if (r == R_ERR) return NS_ERR_NOMEM;
    if (r != R_OK) return revert(p);
    p->have_args = true;
    p->mode = M_XBODY;
    return ns_buf_putc(&cur_call(p)->args, '{');
}

/* Between parameters: <parameter=, </function>, or blanks. */
static ns_status on_xbody(ns_toolparse *p, char c, bool *again) {
    static const char *const tags[] = {T_PARAM, T_FUNC_END};
    if (p->tagpos == 0 && is_ws(c)) return NS_OK;
    int w, r = tag_step(p, c, tags, 2, &w);
    if (r == TAG_HOLD) return NS_OK;
    if (r == TAG_MISS) {
        *again = true;
        return abandon(p);
    }
    if (w == 0) {
        ns_buf_reset(&p->key);
        p->mode = M_XPNAME;
        return NS_OK;
    }
    if (ns_buf_putc(&cur_call(p)->args, '}') != NS_OK) return NS_ERR_NOMEM;
    return end_call(p);
}

static ns_status on_xpname(ns_toolparse *p, char c, bool *again) {
    if (c == '>' && p->key.len) return (p->mode = M_XPVAL, param_open(p));
    if (c == '\n' || c == '<' || c == '>' || p->key.len >= MAX_KEY || c == 0) {
        *again = true;
        return abandon(p);
    }
    return ns_buf_putc(&p->key, c);
}

/* A value up to </parameter>, less its first newline. */
static ns_status on_xpval(ns_toolparse *p, char c, bool *again) {
    static const char *const end[] = {T_PARAM_END};
    if (!p->vstarted) {
        p->vstarted = true;
        if (c == '\n') return NS_OK;
    }
    int w, r = tag_step(p, c, end, 1, &w);
    if (r == TAG_HOLD) return NS_OK;
    if (r == TAG_FULL) return param_close(p);
    ns_status rc;
    if (p->tagpos) { /* not the closing tag after all: those bytes are value */
        rc = ns_buf_append(&p->val, p->tag, (size_t)p->tagpos);
        p->tagpos = 0;
        *again = true;
    } else {
        rc = ns_buf_putc(&p->val, c);
    }
    if (rc != NS_OK) { /* a value past the cap: the call cannot be right; c is looked at again as text */
        *again = true;
        return abandon(p);
    }
    return p->pstream ? param_stream(p) : NS_OK;
}

/* Mistral name-first calls: any byte but blanks and JSON/marker
 * punctuation can be part of a name (the offered list decides). */
static bool mname_char(char c) { return (unsigned char)c > ' ' && !strchr("[]{}\"<>,", c); }

/* After [TOOL_CALLS]: '[' starts a v3 array, a name a name-first call. */
static ns_status on_mstart(ns_toolparse *p, char c, bool *again) {
    if (is_ws(c)) return ns_buf_putc(&p->raw, c);
    if (c == '[') {
        p->ctx = C_MISTRAL_ARR;
        p->mode = M_MARR;
        return ns_buf_putc(&p->raw, c);
    }
    *again = true;
    if (!mname_char(c)) return revert(p);
    ns_buf_reset(&p->val);
    p->mode = M_MNAME;
    return NS_OK;
}

static ns_status on_mname(ns_toolparse *p, char c, bool *again) {
    if (mname_char(c) && p->val.len < MAX_NAME) {
        ns_status rc = ns_buf_putc(&p->raw, c);
        return rc == NS_OK ? ns_buf_putc(&p->val, c) : rc;
    }
    *again = true;
    if (c == '[' && p->val.len) {
        p->mode = M_MTAG;
        return NS_OK;
    }
    if (c == '{' && p->val.len) { /* v11: the arguments right after the name */
        int r = commit_name(p, p->val.data, p->val.len);
        if (r == R_ERR) return NS_ERR_NOMEM;
        if (r == R_OK) {
            p->mode = M_MARGS;
            return NS_OK;
        }
    }
    return revert(p);
}

/* [ARGS] or [CALL_ID] after the name; either completes it. */
static ns_status on_mtag(ns_toolparse *p, char c, bool *again) {
    static const char *const tags[] = {T_MARGS, T_MCALLID};
    int w, r = tag_step(p, c, tags, 2, &w);
    if (r == TAG_MISS) {
        size_t keep = (size_t)p->tagpos;
        p->tagpos = 0;
        *again = true;
        return revert_keep(p, keep);
    }
    ns_status rc = ns_buf_putc(&p->raw, c);
    if (rc != NS_OK || r == TAG_HOLD) return rc;
    r = commit_name(p, p->val.data, p->val.len);
    if (r == R_ERR) return NS_ERR_NOMEM;
    if (r != R_OK) return revert(p);
    ns_buf_reset(&p->key);
    p->mode = w == 0 ? M_MARGS : M_MCALLID;
    return NS_OK;
}

/* The model's own call id up to [ARGS] (ours is kept: ids must be
 * unique across the response, and the model's need not be). */
static ns_status on_mcallid(ns_toolparse *p, char c, bool *again) {
    static const char *const args[] = {T_MARGS};
    int w, r = tag_step(p, c, args, 1, &w);
    if (r == TAG_FULL) p->mode = M_MARGS;
    if (r != TAG_MISS) return NS_OK;
    if (p->tagpos || !mname_char(c) || p->key.len >= MAX_CALL_ID) {
        *again = true;
        return abandon(p);
    }
    return ns_buf_putc(&p->key, c);
}

/* The arguments object of a name-first call, streamed as written. */
static ns_status on_margs(ns_toolparse *p, char c, bool *again) {
    if (!p->vstarted) {
        if (is_ws(c)) return NS_OK;
        if (c != '{') {
            *again = true;
            return abandon(p);
        }
        p->vstarted = true;
        p->have_args = true;
    }
    ns_status rc = ns_buf_putc(&cur_call(p)->args, c);
    if (rc != NS_OK) {
        *again = true;
        return abandon(p);
    }
    if (p->in_str) {
        if (p->esc) p->esc = false;
        else if (c == '\\') p->esc = true;
        else if (c == '"') p->in_str = false;
        return NS_OK;
    }
    if (c == '"') p->in_str = true;
    else if (c == '{' || c == '[') {
        if (++p->depth > MAX_DEPTH) {
            *again = false;
            return abandon(p);
        }
    } else if ((c == '}' || c == ']') && --p->depth == 0) {
        return end_call(p);
    }
    return NS_OK;
}

/* v3 array: an object starts a call; ']' ends the array. */
static ns_status on_marr(ns_toolparse *p, char c, bool *again) {
    bool first = p->raw.len > 0; /* nothing committed in this array yet */
    if (is_ws(c)) return first ? ns_buf_putc(&p->raw, c) : NS_OK;
    if (c == '{') {
        if (!first) start_call(p, C_MISTRAL_ARR);
        p->mode = M_OBJ;
        p->sub = O_KEY_OR_END;
        return ns_buf_putc(&p->raw, c);
    }
    if (c == ']' && !first) {
        p->mode = M_TEXT;
        return NS_OK;
    }
    *again = true;
    if (first) return revert(p);
    p->mode = M_TEXT;
    return NS_OK;
}

static ns_status on_marr_after(ns_toolparse *p, char c, bool *again) {
    if (is_ws(c)) return NS_OK;
    if (c == ',') {
        p->mode = M_MARR;
        return NS_OK;
    }
    p->mode = M_TEXT;
    if (c == ']') return NS_OK;
    *again = true;
    return NS_OK;
}

static ns_status step(ns_toolparse *p, char c) {
    for (;;) {
        bool again = false;
        ns_status rc;
        switch (p->mode) {
        case M_PLAIN: return text_char(p, c);
        case M_TEXT: rc = on_text(p, c, &again); break;
        case M_JSTART:
            if (is_ws(c)) return ns_buf_putc(&p->ws, c);
            rc = on_json_open(p, c, &again);
            break;
        case M_JAFTER:
            if (is_ws(c) || c == ';') return NS_OK;
            rc = on_json_open(p, c, &again);
            break;
        case M_PRE: rc = on_pre(p, c, &again); break;
        case M_OBJ: rc = on_obj(p, c, &again); break;
        case M_POST: rc = on_post(p, c, &again); break;
        case M_XFUNC: rc = on_xfunc(p, c, &again); break;
        case M_XNAME: rc = on_xname(p, c, &again); break;
        case M_XBODY: rc = on_xbody(p, c, &again); break;
        case M_XPNAME: rc = on_xpname(p, c, &again); break;
        case M_XPVAL: rc = on_xpval(p, c, &again); break;
        case M_MSTART: rc = on_mstart(p, c, &again); break;
        case M_MNAME: rc = on_mname(p, c, &again); break;
        case M_MTAG: rc = on_mtag(p, c, &again); break;
        case M_MCALLID: rc = on_mcallid(p, c, &again); break;
        case M_MARGS: rc = on_margs(p, c, &again); break;
        case M_MARR: rc = on_marr(p, c, &again); break;
        case M_MARR_AFTER: rc = on_marr_after(p, c, &again); break;
        default: return NS_ERR_INTERNAL;
        }
        if (rc != NS_OK || !again) return rc;
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
    case M_POST:
        rc = text_str(p, p->tag, (size_t)p->tagpos);
        break;
    case M_PLAIN:
    case M_JSTART:
    case M_JAFTER:
    case M_MARR_AFTER:
        break;
    default: /* inside a call */
        if (p->cur_committed) {
            cur_call(p)->complete = false;
            cur_call(p)->valid = false;
            reset_call_state(p);
        } else {
            rc = revert(p);
        }
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

/* ---------- choosing the format ---------- */

ns_toolfmt ns_toolfmt_detect(const char *src) {
    if (!src) return NS_TOOLFMT_NONE;
    /* Qwen3-Coder prints its calls as <function=NAME> with <parameter=P>
     * blocks (and also says <tool_call>, so it is looked at first) */
    if (strstr(src, "<function=") && strstr(src, "<parameter=")) return NS_TOOLFMT_QWEN_XML;
    if (strstr(src, "[TOOL_CALLS]")) return NS_TOOLFMT_MISTRAL;
    if (strstr(src, "<tool_call>")) return NS_TOOLFMT_HERMES;
    return NS_TOOLFMT_LLAMA_JSON;
}

const char *ns_toolfmt_name(ns_toolfmt fmt) {
    switch (fmt) {
    case NS_TOOLFMT_HERMES: return "hermes";
    case NS_TOOLFMT_LLAMA_JSON: return "llama-json";
    case NS_TOOLFMT_QWEN_XML: return "qwen-xml";
    case NS_TOOLFMT_MISTRAL: return "mistral";
    default: return "none";
    }
}
