/* structured.c — structured output requests to grammar matchers (see
 * structured.h): the vocabulary as token bytes (built once per tokenizer),
 * the grammar for a JSON Schema / JSON object / forced tool call in the
 * model's tool-call syntax, optionally after a reasoning block, and a
 * cache of compiled grammars shared by requests that ask the same. */
#include "api/structured.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmatch.h"
#include "grammar/gschema.h"
#include "grammar/gvocab.h"
#include "grammar/gvocab_tok.h"

/* Forced tool calls: how many calls one "required" answer may hold (a
 * named tool_choice gets exactly one; parallel_tool_calls false, i.e.
 * o->max_calls 1, one). Bounded so a model that never picks the
 * end-of-sequence token still finishes. */
#define NS_STRUCT_MAX_CALLS 4
#define GRAMMAR_CACHE 32
#define KEY_CAP ((size_t)4 << 20) /* a longer spec is compiled uncached */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
/* the vocabulary of the one tokenizer seen last (a server has one model) */
static const struct ns_tokenizer *g_vocab_tok;
static int32_t g_vocab_n;
static ns_gvocab *g_vocab;
static struct {
    char *key;
    ns_grammar *g;
    uint64_t used;
} g_cache[GRAMMAR_CACHE];
static uint64_t g_tick;

/* ---- grammars ---- */

/* Text up to and including pat (a byte automaton for "does not contain
 * pat yet"; pat's first byte occurs in it only once, so a mismatch falls
 * back to state 0, or 1 on that byte), from s. strict: the text is
 * well-formed UTF-8 without control characters other than tab, newline
 * and carriage return (an XML parameter value); otherwise any bytes (a
 * reasoning block). */
static uint32_t text_until(ns_gnfa *n, uint32_t s, const char *pat, bool strict) {
    const int L = (int)strlen(pat);
    uint32_t k[32], done = ns_gnfa_state(n);
    if (L < 1 || L > 32) return 0;
    const uint8_t first = (uint8_t)pat[0];
    k[0] = s;
    for (int i = 1; i < L; i++) k[i] = ns_gnfa_state(n);
    for (int i = 0; i < L; i++) {
        uint8_t want = (uint8_t)pat[i];
        ns_gnfa_byte(n, k[i], want, want, i + 1 < L ? k[i + 1] : done);
        int top = strict ? 0x7F : 0xFF;
        for (int b = 0; b <= top; b++) {
            if (b == want || (strict && b < 0x20 && b != '\t' && b != '\n' && b != '\r')) continue;
            int hi = b;
            if (b != first)
                while (hi + 1 <= top && hi + 1 != want && hi + 1 != first && (!strict || hi + 1 >= 0x20)) hi++;
            ns_gnfa_byte(n, k[i], (uint8_t)b, (uint8_t)hi, b == first ? k[1] : k[0]);
            b = hi;
        }
        if (strict) ns_gnfa_utf8_multi(n, k[i], k[0], false);
    }
    return done;
}

/* After "</think>": up to two newlines (Qwen3 writes "</think>\n\n",
 * one token); the answer's own bounded whitespace follows (build()). */
static uint32_t after_think(ns_gnfa *n, uint32_t s) {
    uint32_t e = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, e);
    uint32_t a = ns_gnfa_lits(n, s, "\n");
    ns_gnfa_eps(n, a, e);
    ns_gnfa_eps(n, ns_gnfa_lits(n, a, "\n"), e);
    return e;
}

/* The reasoning block the answer may (or must) start with, from s. */
static uint32_t think_prefix(ns_gnfa *n, uint32_t s, const ns_gen_opts *o) {
    if (o->in_think) return after_think(n, text_until(n, s, "</think>", false));
    if (!o->reasoning || o->think_closed) return s;
    uint32_t e = ns_gnfa_state(n);
    ns_gnfa_eps(n, s, e);
    ns_gnfa_eps(n, after_think(n, text_until(n, ns_gnfa_lits(n, s, "<think>"), "</think>", false)), e);
    return e;
}

/* ---- Qwen3-Coder XML calls ----
 * <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
 * </function>\n</tool_call>. The parser (toolcall.c) keeps a value as
 * raw text when the parameter's schema allows only strings, and reads it
 * as JSON otherwise; the grammar writes each value the way it is read. */

enum { XT_STR = 1, XT_OTHER = 2 };

/* Which kinds of JSON values a schema names, as the parser sees it
 * (types, enum and const values, through anyOf/oneOf/allOf). */
static unsigned xml_kinds(const json_t *s, int depth) {
    if (!json_is_object(s) || depth > 16) return 0;
    unsigned m = 0;
    const json_t *t = json_object_get(s, "type"), *e;
    size_t i;
    if (json_is_string(t)) m |= strcmp(json_string_value(t), "string") ? XT_OTHER : XT_STR;
    json_array_foreach(t, i, e) m |= json_is_string(e) && !strcmp(json_string_value(e), "string") ? XT_STR : XT_OTHER;
    static const char *const combos[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) json_array_foreach(json_object_get(s, combos[k]), i, e) m |= xml_kinds(e, depth + 1);
    json_array_foreach(json_object_get(s, "enum"), i, e) m |= json_is_string(e) ? XT_STR : XT_OTHER;
    if ((e = json_object_get(s, "const"))) m |= json_is_string(e) ? XT_STR : XT_OTHER;
    return m;
}

/* A raw string value (then "\n</parameter>"): free text, or one of the
 * enum / const strings. False with msg set for a constraint raw text
 * cannot carry here. */
static bool xml_raw(ns_gnfa *n, const json_t *ps, uint32_t s, uint32_t *end, char *msg, size_t cap) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)ps, k, v) {
        if (!strcmp(k, "type") || !strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "description") ||
            !strcmp(k, "title") || !strcmp(k, "default") || !strcmp(k, "examples") || !strcmp(k, "$comment"))
            continue;
        snprintf(msg, cap, "'%s' on a string parameter is not supported for forced calls in this model's "
                 "Qwen3-Coder XML format", k);
        return false;
    }
    const json_t *en = json_object_get(ps, "enum"), *cn = json_object_get(ps, "const");
    if (!en && !cn) {
        *end = ns_gnfa_lits(n, text_until(n, s, "\n</parameter>", true), "\n");
        return true;
    }
    uint32_t e = ns_gnfa_state(n);
    size_t i;
    json_array_foreach(en, i, v) if (json_is_string(v)) ns_gnfa_eps(n, ns_gnfa_lits(n, s, json_string_value(v)), e);
    if (json_is_string(cn)) ns_gnfa_eps(n, ns_gnfa_lits(n, s, json_string_value(cn)), e);
    *end = ns_gnfa_lits(n, e, "\n</parameter>\n");
    return true;
}

/* The parameters of one XML call (tool schema `params`), from s. */
static bool xml_params(ns_gnfa *n, const json_t *params, uint32_t s, uint32_t *end, char *msg, size_t cap) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)params, k, v) {
        static const char *const ok[] = {"type", "properties", "required", "additionalProperties", "$defs",
                                         "definitions", "$schema", "$id", "$comment", "title", "description",
                                         "default", "examples", NULL};
        bool known = false;
        for (int j = 0; ok[j]; j++) known |= !strcmp(ok[j], k);
        if (!known) {
            snprintf(msg, cap, "'%s' at the top of the parameters is not supported for forced calls in this "
                     "model's Qwen3-Coder XML format", k);
            return false;
        }
    }
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    size_t i;
    json_array_foreach(req, i, v) if (!json_is_string(v) || !json_object_get(props, json_string_value(v))) {
        snprintf(msg, cap, "a required parameter missing from 'properties' is not supported for forced calls in "
                 "this model's Qwen3-Coder XML format");
        return false;
    }
    json_object_foreach((json_t *)props, k, v) {
        bool required = false;
        const json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), k);
        uint32_t skip = ns_gnfa_state(n);
        if (!required) ns_gnfa_eps(n, s, skip);
        char open[300];
        if (snprintf(open, sizeof(open), "<parameter=%s>\n", k) >= (int)sizeof(open)) {
            snprintf(msg, cap, "a parameter name is too long");
            return false;
        }
        uint32_t t = ns_gnfa_lits(n, s, open), e;
        if (xml_kinds(v, 0) == XT_STR) {
            if (!xml_raw(n, v, t, &e, msg, cap)) return false;
        } else {
            char path[300], err[384];
            snprintf(path, sizeof(path), "/properties/%s", k);
            if (!ns_gschema_emit_in(n, params, v, path, t, &e, err, sizeof(err))) {
                snprintf(msg, cap, "%s", err);
                return false;
            }
            e = ns_gnfa_lits(n, e, "\n</parameter>\n");
        }
        ns_gnfa_eps(n, e, skip);
        s = skip;
    }
    *end = s;
    return true;
}

static bool emit_xml_call(ns_gnfa *n, const json_t *name, const json_t *params, uint32_t s, uint32_t *end, char *msg,
                          size_t cap) {
    char open[300];
    if (snprintf(open, sizeof(open), "<tool_call>\n<function=%s>\n", json_string_value(name)) >= (int)sizeof(open)) {
        snprintf(msg, cap, "a tool name is too long");
        return false;
    }
    char err[400];
    if (!xml_params(n, params, ns_gnfa_lits(n, s, open), &s, err, sizeof(err))) {
        snprintf(msg, cap, "tool '%s' parameters: %s", json_string_value(name), err);
        return false;
    }
    *end = ns_gnfa_lits(n, s, "</function>\n</tool_call>");
    return true;
}

static const json_t *tool_fn(const json_t *tool) {
    const json_t *fn = json_object_get(tool, "function");
    return json_is_object(fn) ? fn : tool;
}

/* One call of `tool` in the model's syntax, from s. */
static bool emit_call(ns_gnfa *n, ns_toolfmt fmt, const json_t *tool, uint32_t s, uint32_t *end, char *msg, size_t cap) {
    const json_t *fn = tool_fn(tool);
    const json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
    if (!json_is_string(name)) {
        snprintf(msg, cap, "a tool without a function name");
        return false;
    }
    json_t *obj_any = NULL;
    if (!params || json_is_null(params)) params = obj_any = json_pack("{s:s}", "type", "object");
    if (fmt == NS_TOOLFMT_QWEN_XML) {
        bool r = emit_xml_call(n, name, params, s, end, msg, cap);
        json_decref(obj_any);
        return r;
    }
    char *nj = json_dumps(name, JSON_COMPACT | JSON_ENCODE_ANY);
    bool ok = nj != NULL;
    if (ok) {
        if (fmt == NS_TOOLFMT_HERMES) s = ns_gnfa_ws(n, ns_gnfa_lits(n, s, "<tool_call>"));
        s = ns_gnfa_ws(n, ns_gnfa_lits(n, s, "{"));
        s = ns_gnfa_ws(n, ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_lits(n, s, "\"name\"")), ":"));
        s = ns_gnfa_ws(n, ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_lits(n, s, nj)), ","));
        const char *akey = fmt == NS_TOOLFMT_HERMES ? "\"arguments\"" : "\"parameters\"";
        s = ns_gnfa_ws(n, ns_gnfa_lits(n, ns_gnfa_ws(n, ns_gnfa_lits(n, s, akey)), ":"));
        char err[384];
        uint32_t e;
        ok = ns_gschema_emit(n, params, s, &e, err, sizeof(err));
        if (!ok) snprintf(msg, cap, "tool '%s' parameters: %s", json_string_value(name), err);
        else {
            s = ns_gnfa_lits(n, ns_gnfa_ws(n, e), "}");
            if (fmt == NS_TOOLFMT_HERMES) s = ns_gnfa_lits(n, ns_gnfa_ws(n, s), "</tool_call>");
            *end = s;
        }
    } else {
        snprintf(msg, cap, "out of memory");
    }
    free(nj);
    json_decref(obj_any);
    return ok;
}

/* One call to any of the offered tools (or the named one), from s. */
static bool emit_any_call(ns_gnfa *n, const ns_struct_spec *sp, ns_toolfmt fmt, uint32_t s, uint32_t *end, char *msg,
                          size_t cap, const char **param) {
    uint32_t e = ns_gnfa_state(n);
    size_t i, used = 0;
    const json_t *t;
    json_array_foreach(sp->tools, i, t) {
        const json_t *name = json_object_get(tool_fn(t), "name");
        if (sp->kind == NS_STRUCT_TOOL_NAMED &&
            (!json_is_string(name) || strcmp(json_string_value(name), sp->tool_name) != 0))
            continue;
        uint32_t te;
        *param = "tools";
        if (!emit_call(n, fmt, t, s, &te, msg, cap)) return false;
        ns_gnfa_eps(n, te, e);
        used++;
    }
    if (!used) {
        *param = "tool_choice";
        snprintf(msg, cap, "tool_choice names the function '%.64s', which is not among the request's tools",
                 sp->tool_name ? sp->tool_name : "");
        return false;
    }
    *end = e;
    return true;
}

/* The whole grammar: [reasoning] answer [ws], root rule of n. */
static bool build(ns_gnfa *n, const ns_struct_spec *sp, const ns_gen_opts *o, ns_toolfmt fmt, char *msg, size_t cap,
                  const char **param) {
    uint32_t r = ns_gnfa_rule(n);
    n->root = r;
    uint32_t s = ns_gnfa_ws(n, think_prefix(n, r, o)), e = 0;
    bool ok = true;
    if (sp->kind == NS_STRUCT_JSON_OBJECT) {
        e = ns_gnfa_callr(n, s, ns_gnfa_any_object_rule(n));
    } else if (sp->kind == NS_STRUCT_JSON_SCHEMA) {
        *param = "response_format";
        ok = ns_gschema_emit(n, sp->schema, s, &e, msg, cap);
    } else {
        int max = sp->kind == NS_STRUCT_TOOL_NAMED ? 1 : NS_STRUCT_MAX_CALLS;
        if (o->max_calls > 0 && o->max_calls < max) max = o->max_calls; /* parallel_tool_calls false */
        ok = emit_any_call(n, sp, fmt, s, &e, msg, cap, param);
        uint32_t done = ns_gnfa_state(n);
        for (int k = 1; ok && k < max; k++) {
            ns_gnfa_eps(n, e, done);
            uint32_t sep = ns_gnfa_ws(n, e);
            if (fmt == NS_TOOLFMT_LLAMA_JSON) sep = ns_gnfa_ws(n, ns_gnfa_lits(n, sep, ";"));
            ok = emit_any_call(n, sp, fmt, sep, &e, msg, cap, param);
        }
        if (ok) ns_gnfa_eps(n, e, done);
        e = done;
    }
    if (!ok) return false;
    ns_gnfa_end(n, ns_gnfa_ws(n, e));
    if (n->oom) {
        snprintf(msg, cap, "the grammar is too large");
        return false;
    }
    return true;
}

/* The cache key of a spec: everything the grammar depends on. */
static char *spec_key(const ns_struct_spec *sp, const ns_gen_opts *o, ns_toolfmt fmt) {
    json_t *k = json_pack("{s:i,s:i,s:i,s:b,s:b,s:O?,s:O?,s:s?}", "kind", (int)sp->kind, "fmt", (int)fmt, "calls", o->max_calls, "reasoning",
                          o->reasoning && !o->think_closed, "in_think", o->in_think, "schema", (json_t *)sp->schema, "tools",
                          (json_t *)sp->tools, "name", sp->tool_name);
    /* key order kept: the grammar writes properties in the schema's order */
    char *s = k ? json_dumps(k, JSON_COMPACT) : NULL;
    json_decref(k);
    if (s && strlen(s) > KEY_CAP) {
        free(s);
        s = NULL;
    }
    return s;
}

static ns_grammar *cache_get(const char *key) {
    for (int i = 0; key && i < GRAMMAR_CACHE; i++)
        if (g_cache[i].key && !strcmp(g_cache[i].key, key)) {
            g_cache[i].used = ++g_tick;
            ns_grammar_retain(g_cache[i].g);
            return g_cache[i].g;
        }
    return NULL;
}

/* Keeps g (one more reference) under key (taken over). */
static void cache_put(char *key, ns_grammar *g) {
    if (!key) return;
    int victim = 0;
    for (int i = 0; i < GRAMMAR_CACHE; i++) {
        if (!g_cache[i].key) {
            victim = i;
            break;
        }
        if (g_cache[i].used < g_cache[victim].used) victim = i;
    }
    free(g_cache[victim].key);
    if (g_cache[victim].g) ns_grammar_release(g_cache[victim].g);
    ns_grammar_retain(g);
    g_cache[victim].key = key;
    g_cache[victim].g = g;
    g_cache[victim].used = ++g_tick;
}

/* The vocabulary for a (g_mu held). */
static ns_status vocab_for(ns_api *a, ns_error *err) {
    if (g_vocab && g_vocab_tok == a->tok && g_vocab_n == a->cfg.vocab_size) return NS_OK;
    ns_gvocab *v = NULL;
    int32_t eos[NS_GVOCAB_MAX_EOS];
    int n_eos = 0;
    for (int i = 0; i < a->cfg.n_eos && n_eos < NS_GVOCAB_MAX_EOS; i++) eos[n_eos++] = a->cfg.eos_token_ids[i];
    ns_status rc = ns_gvocab_from_tokenizer(a->tok, a->cfg.vocab_size, eos, n_eos, &v, err);
    if (rc != NS_OK) return rc;
    /* grammars of the previous model keep pointing at its vocabulary: a
     * server loads one model, so it is replaced only in tests */
    for (int i = 0; i < GRAMMAR_CACHE; i++) {
        free(g_cache[i].key);
        if (g_cache[i].g) ns_grammar_release(g_cache[i].g);
        g_cache[i].key = NULL;
        g_cache[i].g = NULL;
    }
    g_vocab = v; /* the old one leaks on purpose: live grammars may use it */
    g_vocab_tok = a->tok;
    g_vocab_n = a->cfg.vocab_size;
    return NS_OK;
}

static bool check_spec(const ns_struct_spec *sp, ns_toolfmt fmt, const ns_gen_opts *o, ns_http_error *e) {
    if (o->rp.ignore_eos) {
        ns_http_error_set(e, 400, "ignore_eos", "invalid_value",
                          "'ignore_eos' cannot be combined with structured output (response_format or a forced "
                          "tool_choice): the grammar decides where the answer ends");
        return false;
    }
    if (sp->kind == NS_STRUCT_JSON_SCHEMA && !json_is_object(sp->schema) && !json_is_boolean(sp->schema)) {
        ns_http_error_set(e, 400, "response_format", "invalid_value", "the JSON schema must be an object");
        return false;
    }
    if (sp->kind == NS_STRUCT_TOOL_REQUIRED || sp->kind == NS_STRUCT_TOOL_NAMED) {
        if (!json_is_array(sp->tools) || json_array_size(sp->tools) == 0) {
            ns_http_error_set(e, 400, "tool_choice", "invalid_value",
                              "a forced tool_choice needs a non-empty 'tools' array");
            return false;
        }
        if (sp->kind == NS_STRUCT_TOOL_NAMED && !sp->tool_name) {
            ns_http_error_set(e, 400, "tool_choice", "invalid_value", "tool_choice names no function");
            return false;
        }
        if (fmt != NS_TOOLFMT_HERMES && fmt != NS_TOOLFMT_LLAMA_JSON && fmt != NS_TOOLFMT_QWEN_XML) {
            ns_http_error_set(e, 400, "tool_choice", fmt == NS_TOOLFMT_NONE ? "tools_not_supported" : "unsupported_value",
                              fmt == NS_TOOLFMT_NONE
                                  ? "this model's chat template has no tool-call format, so tool calls cannot be forced"
                                  : "forced tool calls are not supported for this model's tool-call format yet "
                                    "(Hermes <tool_call>, Llama 3 JSON and Qwen3-Coder XML are)");
            return false;
        }
    }
    return true;
}

bool ns_structured_attach(ns_api *a, const ns_struct_spec *sp, ns_gen_opts *o, ns_http_error *e) {
    if (!sp || sp->kind == NS_STRUCT_NONE) return true;
    ns_toolfmt fmt = o->toolfmt != NS_TOOLFMT_NONE ? o->toolfmt : a->toolfmt;
    if (!check_spec(sp, fmt, o, e)) return false;
    char *key = spec_key(sp, o, fmt);
    ns_error err = {0};
    ns_grammar *g = NULL;
    ns_gnfa nfa;
    ns_gnfa_init(&nfa);
    pthread_mutex_lock(&g_mu);
    ns_status rc = vocab_for(a, &err);
    if (rc == NS_OK) g = cache_get(key);
    if (rc == NS_OK && !g) {
        char msg[512] = "";
        const char *param = "response_format";
        if (!build(&nfa, sp, o, fmt, msg, sizeof(msg), &param)) {
            pthread_mutex_unlock(&g_mu);
            ns_gnfa_free(&nfa);
            free(key);
            ns_http_error_set(e, 400, param, "unsupported_schema", "%s", msg);
            return false;
        }
        rc = ns_grammar_new(&nfa, g_vocab, &g, &err);
        if (rc == NS_OK) {
            cache_put(key, g);
            key = NULL;
        }
    }
    pthread_mutex_unlock(&g_mu);
    free(key);
    ns_gnfa_free(&nfa);
    ns_gmatch *m = NULL;
    if (rc == NS_OK) {
        rc = ns_gmatch_new(g, &m, &err);
        ns_grammar_release(g);
    }
    if (rc != NS_OK) {
        ns_http_error_from_status(e, rc, "response_format", err.msg);
        return false;
    }
    o->rp.grammar = m;
    return true;
}

void ns_structured_detach(ns_gen_opts *o) {
    ns_gmatch_free(o->rp.grammar);
    o->rp.grammar = NULL;
}

bool ns_structured_response_format(json_t *body, ns_struct_spec *spec, ns_http_error *e) {
    memset(spec, 0, sizeof(*spec));
    json_t *rf = json_object_get(body, "response_format");
    if (!rf || json_is_null(rf)) return true;
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (!t || !strcmp(t, "text")) return true; /* shape checked by ns_api_parse_gen_params */
    if (!strcmp(t, "json_object")) {
        spec->kind = NS_STRUCT_JSON_OBJECT;
        return true;
    }
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js)) {
        ns_http_error_set(e, 400, "response_format.json_schema", "invalid_value",
                          "response_format type 'json_schema' needs a 'json_schema' object with a 'schema'");
        return false;
    }
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict"),
           *schema = json_object_get(js, "schema");
    if (name && !json_is_string(name)) {
        ns_http_error_set(e, 400, "response_format.json_schema.name", "invalid_value", "'name' must be a string");
        return false;
    }
    if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
        ns_http_error_set(e, 400, "response_format.json_schema.strict", "invalid_value", "'strict' must be a boolean");
        return false;
    }
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        ns_http_error_set(e, 400, "response_format.json_schema.schema", "invalid_value",
                          "response_format.json_schema needs a 'schema' object");
        return false;
    }
    /* strict false is enforced too: the output always follows the schema */
    spec->kind = NS_STRUCT_JSON_SCHEMA;
    spec->schema = schema;
    return true;
}

void ns_structured_tool_choice(json_t *body, ns_struct_spec *spec) {
    json_t *tc = json_object_get(body, "tool_choice");
    if (json_is_string(tc) && !strcmp(json_string_value(tc), "required")) {
        spec->kind = NS_STRUCT_TOOL_REQUIRED;
    } else if (json_is_object(tc)) {
        const char *n = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (!n) return;
        spec->kind = NS_STRUCT_TOOL_NAMED;
        spec->tool_name = n;
    } else {
        return;
    }
    spec->tools = json_object_get(body, "tools");
}
