/* template_cases.h — rendering helpers shared by the template unit tests:
 * render a source with a JSON context, and check a table of cases whose
 * expectations came from Python Jinja2. */
#ifndef NS_TEST_TEMPLATE_CASES_H
#define NS_TEST_TEMPLATE_CASES_H

#include <jansson.h>

#include "template/template.h"
#include "test.h"

typedef struct {
    const char *src, *ctx, *want;
} rcase;

/* Parses and renders src with a JSON context (max_out 0: no output cap);
 * returns the malloc'd output or NULL, with the status in *st and the
 * message in err. */
static char *render_ctx(const char *src, const char *ctx_json, size_t max_out, ns_status *st, ns_error *err) {
    ns_template *t = NULL;
    json_t *ctx = NULL;
    char *out = NULL;
    memset(err, 0, sizeof *err);
    *st = ns_template_parse(src, strlen(src), &t, err);
    if (*st == NS_OK) {
        json_error_t je;
        ctx = ctx_json ? json_loads(ctx_json, 0, &je) : NULL;
        *st = ns_template_render(t, ctx, max_out, &out, NULL, err);
    }
    json_decref(ctx);
    ns_template_free(t);
    return out;
}

#define RUN_TABLE(t) run_table((t), sizeof(t) / sizeof((t)[0]), #t)

static void run_table(const rcase *cases, size_t n, const char *table) {
    for (size_t i = 0; i < n; i++) {
        ns_error err;
        ns_status st;
        char *out = render_ctx(cases[i].src, cases[i].ctx, 0, &st, &err);
        CHECKF(st == NS_OK, "%s[%zu] %s: %s", table, i, cases[i].src, err.msg);
        if (out)
            CHECKF(strcmp(out, cases[i].want) == 0, "%s[%zu] %s\n#   got:  [%s]\n#   want: [%s]", table, i,
                   cases[i].src, out, cases[i].want);
        free(out);
    }
}

#endif
