#include "template/template.h"

#include <stdlib.h>
#include <string.h>

#include "template/ast.h"
#include "template/eval.h"
#include "template/lexer.h"
#include "template/parser.h"
#include "template/stackguard.h"
#include "util/utf8.h"

struct ns_template {
    ns_tarena arena; /* tokens, AST, string literals */
    ns_tnodes body;
};

ns_status ns_template_parse(const char *src, size_t len, ns_template **out, ns_error *err) {
    if (!out) return ns_fail(err, NS_ERR_INVALID, "ns_template_parse: no output pointer");
    *out = NULL;
    if (!src && len) return ns_fail(err, NS_ERR_INVALID, "ns_template_parse: no source");
    if (len > NS_TEMPLATE_MAX_SOURCE)
        return ns_fail(err, NS_ERR_RANGE, "template source is %zu bytes, over the %zu-byte limit", len,
                       NS_TEMPLATE_MAX_SOURCE);
    if (len && !ns_utf8_valid(src, len, NULL)) return ns_fail(err, NS_ERR_FORMAT, "template source is not valid UTF-8");
    ns_template *t = calloc(1, sizeof *t);
    if (!t) return ns_fail(err, NS_ERR_NOMEM, "out of memory parsing template");
    /* tokens and nodes are bounded by a small multiple of the source */
    ns_tarena_init(&t->arena, ((size_t)256 << 20));
    ns_ttok *toks = NULL;
    size_t ntoks = 0;
    ns_status st = ns_tlex(&t->arena, src ? src : "", len, &toks, &ntoks, err);
    if (st == NS_OK) st = ns_tparse(&t->arena, toks, ntoks, &t->body, err);
    if (st != NS_OK) {
        ns_template_free(t);
        return st;
    }
    *out = t;
    return NS_OK;
}

ns_status ns_template_render(const ns_template *t, const json_t *context, size_t max_output, char **out,
                             size_t *len_out, ns_error *err) {
    if (len_out) *len_out = 0;
    if (!out) return ns_fail(err, NS_ERR_INVALID, "ns_template_render: no output pointer");
    *out = NULL;
    if (!t) return ns_fail(err, NS_ERR_INVALID, "ns_template_render: no template");
    if (context && !json_is_object(context))
        return ns_fail(err, NS_ERR_INVALID, "template context must be a JSON object");
    if (!max_output) max_output = NS_TEMPLATE_DEFAULT_OUTPUT;
    if (max_output > ((size_t)1 << 32)) max_output = (size_t)1 << 32;

    ns_tarena arena;
    /* render memory: the output plus generous room for intermediates */
    ns_tarena_init(&arena, max_output * 4 + ((size_t)64 << 20));
    ns_tctx c;
    memset(&c, 0, sizeof c);
    c.a = &arena;
    c.err = err;
    c.max_output = max_output;
    c.max_steps = NS_TEMPLATE_MAX_STEPS;
    c.max_depth = NS_TEMPLATE_MAX_DEPTH;
    c.stack_floor = ns_tstack_floor();

    ns_status st = NS_OK;
    ns_tsb sb;
    ns_tsb_init_heap(&sb); /* handed to the caller as is */
    c.out = &sb;
    if (context) {
        ns_tv ctxv;
        st = ns_tv_from_json(&arena, context, &ctxv, err);
        if (st == NS_OK) c.context = ctxv.u.d;
    }
    if (st == NS_OK) {
        c.root = ns_tarena_alloc(&arena, sizeof *c.root);
        if (c.root) c.root->vars = ns_tdict_new(&arena, 8);
        if (!c.root || !c.root->vars) st = ns_fail(err, NS_ERR_NOMEM, "template memory limit exceeded");
        c.frame = c.root;
    }
    if (st == NS_OK) {
        int flow = NS_FLOW_NORMAL;
        st = ns_texec_body(&c, &t->body, &flow);
    }
    if (st == NS_OK) {
        size_t n = 0;
        char *res = ns_tsb_take(&sb, &n);
        if (!res) {
            st = ns_fail(err, NS_ERR_NOMEM, "out of memory building template output");
        } else {
            *out = res;
            if (len_out) *len_out = n;
        }
    }
    ns_tsb_release(&sb);
    ns_tarena_free(&arena);
    return st;
}

void ns_template_free(ns_template *t) {
    if (!t) return;
    ns_tarena_free(&t->arena);
    free(t);
}
