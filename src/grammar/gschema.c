/* gschema.c — JSON Schema to the grammar automaton (see gschema.h). */
#include "grammar/gschema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gregex.h"

#define MAX_REFS 256
#define JS_SAFE_INT 9007199254740991LL

typedef struct gs {
    ns_gnfa *n;
    const json_t *root;
    struct {
        const json_t *target;
        uint32_t rule;
    } refs[MAX_REFS];
    int n_refs;
    char *err;
    size_t errcap;
    bool failed;
    char path[512];
} gs;

static uint32_t fail(gs *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint32_t fail(gs *c, const char *fmt, ...) {
    if (!c->failed) {
        char msg[384];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        snprintf(c->err, c->errcap, "%s at #%s", msg, c->path);
        c->failed = true;
    }
    return 0;
}

/* Appends "/seg" to the path; returns the old length to restore. */
static size_t path_push(gs *c, const char *seg) {
    size_t l = strlen(c->path);
    snprintf(c->path + l, sizeof(c->path) - l, "/%s", seg);
    return l;
}
static void path_pop(gs *c, size_t l) { c->path[l] = 0; }

static const char *const k_annotations[] = {"$schema", "$id", "$comment", "title", "description", "default",
                                            "examples", "deprecated", "readOnly", "writeOnly", "$defs",
                                            "definitions", NULL};
static const char *const k_supported[] = {"type", "properties", "required", "additionalProperties", "items",
                                          "enum", "const", "anyOf", "allOf", "$ref", "minLength", "maxLength",
                                          "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "pattern", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static uint32_t value(gs *c, const json_t *sch, uint32_t s, int depth);

/* A non-negative integer keyword (-1 when absent); false on a bad value. */
static bool count_kw(gs *c, const json_t *sch, const char *k, int64_t *out) {
    *out = -1;
    const json_t *v = json_object_get(sch, k);
    if (!v) return true;
    double d = json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : -1;
    if (d < 0 || d != floor(d)) {
        fail(c, "'%s' must be a non-negative integer", k);
        return false;
    }
    if (d > NS_GSCHEMA_MAX_UNROLL) {
        fail(c, "'%s' above %d is not supported", k, NS_GSCHEMA_MAX_UNROLL);
        return false;
    }
    *out = (int64_t)d;
    return true;
}

static uint32_t literal(gs *c, const json_t *v, uint32_t s) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return fail(c, "out of memory");
    uint32_t e = ns_gnfa_lits(c->n, s, t);
    free(t);
    return e;
}

static bool type_matches(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

static bool any_type_matches(const json_t *v, const json_t *type) {
    if (!type) return true;
    if (json_is_string(type)) return type_matches(v, json_string_value(type));
    size_t i;
    const json_t *t;
    json_array_foreach(type, i, t) if (json_is_string(t) && type_matches(v, json_string_value(t))) return true;
    return false;
}

static uint32_t enum_values(gs *c, const json_t *sch, uint32_t s) {
    const json_t *en = json_object_get(sch, "enum"), *cn = json_object_get(sch, "const"),
                 *type = json_object_get(sch, "type");
    uint32_t e = ns_gnfa_state(c->n);
    size_t kept = 0;
    if (cn) {
        if (!any_type_matches(cn, type)) return fail(c, "'const' does not match 'type'");
        return literal(c, cn, s);
    }
    if (!json_is_array(en) || json_array_size(en) == 0) return fail(c, "'enum' must be a non-empty array");
    size_t i;
    const json_t *v;
    json_array_foreach(en, i, v) {
        if (!any_type_matches(v, type)) continue;
        uint32_t t = literal(c, v, s);
        if (!t) return 0;
        ns_gnfa_eps(c->n, t, e);
        kept++;
    }
    if (!kept) return fail(c, "no 'enum' value matches 'type'");
    return e;
}

static uint32_t string_value(gs *c, const json_t *sch, uint32_t s) {
    int64_t mn, mx;
    if (!count_kw(c, sch, "minLength", &mn) || !count_kw(c, sch, "maxLength", &mx)) return 0;
    const json_t *pat = json_object_get(sch, "pattern");
    if (pat) {
        if (!json_is_string(pat)) return fail(c, "'pattern' must be a string");
        if (mn >= 0 || mx >= 0) return fail(c, "'pattern' together with 'minLength'/'maxLength' is not supported");
        char msg[256];
        uint32_t e;
        s = ns_gnfa_lits(c->n, s, "\"");
        if (!ns_gregex_emit(c->n, json_string_value(pat), s, &e, msg, sizeof(msg)))
            return fail(c, "'pattern' %s", msg);
        return ns_gnfa_lits(c->n, e, "\"");
    }
    if (mn < 0) mn = 0;
    if (mx >= 0 && mx < mn) return fail(c, "'maxLength' is below 'minLength'");
    return ns_gnfa_string(c->n, s, mn, mx);
}

/* An integer bound keyword; false on a bad value. */
static bool bound_kw(gs *c, const json_t *sch, const char *k, double *out, bool *has) {
    const json_t *v = json_object_get(sch, k);
    *has = false;
    if (!v) return true;
    if (!json_is_number(v)) {
        fail(c, "'%s' must be a number", k);
        return false;
    }
    *out = json_number_value(v);
    *has = true;
    return true;
}

static uint32_t integer_value(gs *c, const json_t *sch, uint32_t s) {
    double lo = -(double)JS_SAFE_INT, hi = (double)JS_SAFE_INT, v;
    bool h;
    if (!bound_kw(c, sch, "minimum", &v, &h)) return 0;
    if (h && ceil(v) > lo) lo = ceil(v);
    if (!bound_kw(c, sch, "exclusiveMinimum", &v, &h)) return 0;
    if (h && floor(v) + 1 > lo) lo = floor(v) + 1;
    if (!bound_kw(c, sch, "maximum", &v, &h)) return 0;
    if (h && floor(v) < hi) hi = floor(v);
    if (!bound_kw(c, sch, "exclusiveMaximum", &v, &h)) return 0;
    if (h && ceil(v) - 1 < hi) hi = ceil(v) - 1;
    if (lo > hi) return fail(c, "no integer satisfies 'minimum'/'maximum'");
    return ns_gnfa_int_range(c->n, s, (int64_t)lo, (int64_t)hi);
}

/* One "key": value member from s (key already JSON-encoded in kjson). */
static uint32_t member(gs *c, const char *kjson, const json_t *vs, uint32_t s, int depth) {
    s = ns_gnfa_ws(c->n, ns_gnfa_lits(c->n, ns_gnfa_ws(c->n, ns_gnfa_lits(c->n, s, kjson)), ":"));
    s = value(c, vs, s, depth);
    return s ? ns_gnfa_ws(c->n, s) : 0;
}

static uint32_t map_object(gs *c, const json_t *vs, uint32_t s, int depth) {
    /* "{" ws ( string ws ":" ws V ws ( "," ws ... )* )? "}" */
    ns_gnfa *n = c->n;
    s = ns_gnfa_ws(n, ns_gnfa_lits(n, s, "{"));
    uint32_t close = ns_gnfa_state(n), k = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, close);
    ns_gnfa_eps(n, s, k);
    uint32_t v = ns_gnfa_ws(n, ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_string(n, k, 0, -1)), ":"));
    size_t pl = path_push(c, "additionalProperties");
    uint32_t after = value(c, vs, v, depth);
    path_pop(c, pl);
    if (!after) return 0;
    after = ns_gnfa_ws(n, after);
    ns_gnfa_eps(n, after, close);
    ns_gnfa_eps(n, ns_gnfa_ws(n, ns_gnfa_lits(n, after, ",")), k);
    return ns_gnfa_lits(n, close, "}");
}

static bool is_required(const json_t *req, const char *name) {
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) if (json_is_string(r) && !strcmp(json_string_value(r), name)) return true;
    return false;
}

static uint32_t object_value(gs *c, const json_t *sch, uint32_t s, int depth) {
    ns_gnfa *n = c->n;
    const json_t *props = json_object_get(sch, "properties"), *req = json_object_get(sch, "required"),
                 *addl = json_object_get(sch, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, "'properties' must be an object");
    if (req && !json_is_array(req)) return fail(c, "'required' must be an array");
    if (addl && !json_is_object(addl) && !json_is_boolean(addl))
        return fail(c, "'additionalProperties' must be a boolean or a schema");
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r) {
        if (!json_is_string(r)) return fail(c, "'required' must list strings");
        if (!json_object_get(props, json_string_value(r)) && json_is_false(addl))
            return fail(c, "required property '%s' is not in 'properties' and additionalProperties is false",
                        json_string_value(r));
    }
    if (json_object_size(props) == 0 && json_array_size(req) == 0) {
        if (json_is_false(addl)) return ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_lits(n, s, "{")), "}");
        if (json_is_object(addl)) return map_object(c, addl, s, depth);
        return ns_gnfa_callr(n, s, ns_gnfa_any_object_rule(n));
    }
    /* A_i: nothing written yet; B_i: something written; K_i joins them
     * before property i (a comma first from B_i). */
    uint32_t A = ns_gnfa_ws(n, ns_gnfa_lits(n, s, "{")), B = 0;
    const json_t *any = json_true();
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: the listed properties in order; pass 1: required names
         * that "properties" does not list (any value, or addl's schema) */
        const char *key;
        const json_t *vs;
        void *it = pass == 0 ? json_object_iter((json_t *)props) : NULL;
        size_t ri = 0;
        for (;;) {
            if (pass == 0) {
                if (!it) break;
                key = json_object_iter_key(it);
                vs = json_object_iter_value(it);
                it = json_object_iter_next((json_t *)props, it);
            } else {
                if (ri >= json_array_size(req)) break;
                key = json_string_value(json_array_get(req, ri++));
                if (json_object_get(props, key)) continue;
                vs = json_is_object(addl) ? addl : any;
            }
            bool required = is_required(req, key);
            uint32_t K = ns_gnfa_state(n), A2 = ns_gnfa_state(n), B2 = ns_gnfa_state(n);
            if (A) ns_gnfa_eps(n, A, K);
            if (B) ns_gnfa_eps(n, ns_gnfa_ws(n, ns_gnfa_lits(n, B, ",")), K);
            if (!required) {
                if (A) ns_gnfa_eps(n, A, A2);
                if (B) ns_gnfa_eps(n, B, B2);
            }
            json_t *kj = json_string(key);
            char *kjson = kj ? json_dumps(kj, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            json_decref(kj);
            if (!kjson) return fail(c, "out of memory");
            size_t pl = path_push(c, pass == 0 ? "properties" : "required");
            size_t pl2 = path_push(c, key);
            uint32_t e = member(c, kjson, vs, K, depth);
            path_pop(c, pl2);
            path_pop(c, pl);
            free(kjson);
            if (!e) return 0;
            ns_gnfa_eps(n, e, B2);
            A = required ? 0 : A2;
            B = B2;
        }
    }
    uint32_t close = ns_gnfa_state(n);
    if (A) ns_gnfa_eps(n, A, close);
    if (B) ns_gnfa_eps(n, B, close);
    return ns_gnfa_lits(n, close, "}");
}

static uint32_t array_value(gs *c, const json_t *sch, uint32_t s, int depth) {
    ns_gnfa *n = c->n;
    int64_t mn, mx;
    if (!count_kw(c, sch, "minItems", &mn) || !count_kw(c, sch, "maxItems", &mx)) return 0;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mx < mn) return fail(c, "'maxItems' is below 'minItems'");
    const json_t *items = json_object_get(sch, "items");
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return fail(c, "'items' must be a schema (tuple 'items' arrays are not supported)");
    uint32_t item;
    if (!items || json_is_true(items)) {
        item = ns_gnfa_any_rule(n);
    } else if (json_is_false(items)) {
        if (mn > 0) return fail(c, "'items' is false but 'minItems' is above 0");
        mx = 0;
        item = ns_gnfa_any_rule(n);
    } else {
        item = ns_gnfa_rule(n);
        size_t pl = path_push(c, "items");
        uint32_t e = value(c, items, item, depth);
        path_pop(c, pl);
        if (!e) return 0;
        ns_gnfa_end(n, e);
    }
    s = ns_gnfa_ws(n, ns_gnfa_lits(n, s, "["));
    uint32_t close = ns_gnfa_state(n);
    if (mn == 0) ns_gnfa_eps(n, s, close);
    if (mx != 0) {
        uint32_t cur = ns_gnfa_ws(n, ns_gnfa_callr(n, s, item));
        int64_t k = 1;
        for (; k < mn; k++) cur = ns_gnfa_ws(n, ns_gnfa_callr(n, ns_gnfa_ws(n, ns_gnfa_lits(n, cur, ",")), item));
        if (mx < 0) {
            uint32_t l = ns_gnfa_state(n);
            ns_gnfa_eps(n, cur, l);
            ns_gnfa_eps(n, ns_gnfa_ws(n, ns_gnfa_callr(n, ns_gnfa_ws(n, ns_gnfa_lits(n, l, ",")), item)), l);
            ns_gnfa_eps(n, l, close);
        } else {
            for (; k < mx; k++) {
                ns_gnfa_eps(n, cur, close);
                cur = ns_gnfa_ws(n, ns_gnfa_callr(n, ns_gnfa_ws(n, ns_gnfa_lits(n, cur, ",")), item));
            }
            ns_gnfa_eps(n, cur, close);
        }
    }
    return ns_gnfa_lits(n, close, "]");
}

static uint32_t typed(gs *c, const json_t *sch, const char *t, uint32_t s, int depth) {
    ns_gnfa *n = c->n;
    if (!strcmp(t, "string")) return string_value(c, sch, s);
    if (!strcmp(t, "integer")) return integer_value(c, sch, s);
    if (!strcmp(t, "number")) {
        static const char *const nk[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (json_object_get(sch, nk[i]))
                return fail(c, "'%s' is supported for type integer only, not number", nk[i]);
        return ns_gnfa_callr(n, s, ns_gnfa_number_rule(n));
    }
    if (!strcmp(t, "boolean")) {
        uint32_t e = ns_gnfa_state(n);
        ns_gnfa_eps(n, ns_gnfa_lits(n, s, "true"), e);
        ns_gnfa_eps(n, ns_gnfa_lits(n, s, "false"), e);
        return e;
    }
    if (!strcmp(t, "null")) return ns_gnfa_lits(n, s, "null");
    if (!strcmp(t, "object")) return object_value(c, sch, s, depth);
    if (!strcmp(t, "array")) return array_value(c, sch, s, depth);
    return fail(c, "unknown type '%s'", t);
}

/* Resolves "#", "#/a/b" (with ~0 ~1 escapes) in the root. */
static const json_t *resolve(gs *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t l = 0;
        while (*p && *p != '/' && l + 1 < sizeof(seg)) {
            if (p[0] == '~' && p[1] == '0') seg[l++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') seg[l++] = '/', p += 2;
            else seg[l++] = *p++;
        }
        seg[l] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, seg);
        else if (json_is_array(cur)) {
            char *endp;
            unsigned long idx = strtoul(seg, &endp, 10);
            cur = *endp ? NULL : json_array_get(cur, idx);
        } else cur = NULL;
        if (!cur) return NULL;
    }
    return *p ? NULL : cur;
}

static uint32_t ref_value(gs *c, const json_t *sch, uint32_t s, int depth) {
    const json_t *ref = json_object_get(sch, "$ref");
    if (!json_is_string(ref)) return fail(c, "'$ref' must be a string");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)sch, k, v) if (strcmp(k, "$ref") && !in_list(k_annotations, k))
        return fail(c, "'$ref' next to '%s' is not supported", k);
    const json_t *target = resolve(c, json_string_value(ref));
    if (!target) return fail(c, "'$ref' %s does not resolve in this schema", json_string_value(ref));
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target) return ns_gnfa_callr(c->n, s, c->refs[i].rule);
    if (c->n_refs >= MAX_REFS) return fail(c, "more than %d distinct '$ref' targets", MAX_REFS);
    uint32_t r = ns_gnfa_rule(c->n);
    c->refs[c->n_refs].target = target;
    c->refs[c->n_refs++].rule = r;
    char saved[sizeof(c->path)];
    memcpy(saved, c->path, sizeof(saved));
    snprintf(c->path, sizeof(c->path), "%s", json_string_value(ref) + 1);
    uint32_t e = value(c, target, r, depth);
    memcpy(c->path, saved, sizeof(saved));
    if (!e) return 0;
    ns_gnfa_end(c->n, e);
    return ns_gnfa_callr(c->n, s, r);
}

static uint32_t any_of(gs *c, const json_t *sch, uint32_t s, int depth) {
    const json_t *alts = json_object_get(sch, "anyOf");
    if (!json_is_array(alts) || json_array_size(alts) == 0) return fail(c, "'anyOf' must be a non-empty array");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)sch, k, v) if (strcmp(k, "anyOf") && !in_list(k_annotations, k))
        return fail(c, "'anyOf' next to '%s' is not supported (move it into each branch)", k);
    uint32_t e = ns_gnfa_state(c->n);
    size_t i;
    json_array_foreach(alts, i, v) {
        char seg[32];
        snprintf(seg, sizeof(seg), "anyOf/%zu", i);
        size_t pl = path_push(c, seg);
        uint32_t t = value(c, v, s, depth);
        path_pop(c, pl);
        if (!t) return 0;
        ns_gnfa_eps(c->n, t, e);
    }
    return e;
}

static uint32_t value(gs *c, const json_t *sch, uint32_t s, int depth) {
    if (c->failed) return 0;
    if (++depth > NS_GSCHEMA_MAX_DEPTH) return fail(c, "schema nested deeper than %d", NS_GSCHEMA_MAX_DEPTH);
    if (json_is_true(sch)) return ns_gnfa_callr(c->n, s, ns_gnfa_any_rule(c->n));
    if (json_is_false(sch)) return fail(c, "schema 'false' can never be satisfied");
    if (!json_is_object(sch)) return fail(c, "a schema must be an object or a boolean");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)sch, k, v) if (!in_list(k_annotations, k) && !in_list(k_supported, k))
        return fail(c, "unsupported JSON Schema keyword '%s'", k);
    if (json_object_get(sch, "$ref")) return ref_value(c, sch, s, depth);
    if (json_object_get(sch, "anyOf")) return any_of(c, sch, s, depth);
    const json_t *all = json_object_get(sch, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            return fail(c, "'allOf' with more than one subschema is not supported");
        json_object_foreach((json_t *)sch, k, v) if (strcmp(k, "allOf") && !in_list(k_annotations, k))
            return fail(c, "'allOf' next to '%s' is not supported", k);
        size_t pl = path_push(c, "allOf/0");
        uint32_t e = value(c, json_array_get(all, 0), s, depth);
        path_pop(c, pl);
        return e;
    }
    if (json_object_get(sch, "enum") || json_object_get(sch, "const")) return enum_values(c, sch, s);
    const json_t *type = json_object_get(sch, "type");
    if (json_is_string(type)) return typed(c, sch, json_string_value(type), s, depth);
    if (json_is_array(type)) {
        if (json_array_size(type) == 0) return fail(c, "'type' must not be an empty list");
        uint32_t e = ns_gnfa_state(c->n);
        size_t i;
        json_array_foreach(type, i, v) {
            if (!json_is_string(v)) return fail(c, "'type' must list strings");
            uint32_t t = typed(c, sch, json_string_value(v), s, depth);
            if (!t) return 0;
            ns_gnfa_eps(c->n, t, e);
        }
        return e;
    }
    if (type) return fail(c, "'type' must be a string or a list of strings");
    /* no type: the keywords say which one; none at all is any value */
    if (json_object_get(sch, "properties") || json_object_get(sch, "required") ||
        json_object_get(sch, "additionalProperties"))
        return object_value(c, sch, s, depth);
    if (json_object_get(sch, "items") || json_object_get(sch, "minItems") || json_object_get(sch, "maxItems"))
        return array_value(c, sch, s, depth);
    if (json_object_get(sch, "minLength") || json_object_get(sch, "maxLength") || json_object_get(sch, "pattern"))
        return string_value(c, sch, s);
    if (json_object_get(sch, "minimum") || json_object_get(sch, "maximum") ||
        json_object_get(sch, "exclusiveMinimum") || json_object_get(sch, "exclusiveMaximum"))
        return fail(c, "'minimum'/'maximum' without \"type\": \"integer\" is not supported");
    return ns_gnfa_callr(c->n, s, ns_gnfa_any_rule(c->n));
}

bool ns_gschema_emit(ns_gnfa *n, const json_t *schema, uint32_t s, uint32_t *end, char *err, size_t errcap) {
    return ns_gschema_emit_in(n, schema, schema, "", s, end, err, errcap);
}

bool ns_gschema_emit_in(ns_gnfa *n, const json_t *root, const json_t *schema, const char *path, uint32_t s,
                        uint32_t *end, char *err, size_t errcap) {
    gs *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errcap, "out of memory");
        return false;
    }
    c->n = n;
    c->root = root;
    snprintf(c->path, sizeof(c->path), "%s", path ? path : "");
    c->err = err;
    c->errcap = errcap;
    uint32_t e = value(c, schema, s, 0);
    bool ok = e != 0 && !c->failed;
    if (ok && n->oom) {
        snprintf(err, errcap, "schema too large (its automaton needs more than %u states)", NS_GNFA_MAX_STATES);
        ok = false;
    }
    *end = e;
    free(c);
    return ok;
}
