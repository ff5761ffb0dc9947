/* completions.c — POST /v1/completions: a raw prompt (text, or token ids)
 * continued by the model, streaming and not. The shared request path is
 * ns_gen_handle (gen.h); this file adds the prompt forms, the
 * unsupported-parameter checks, the "text" output and the completions
 * logprobs object. No chat template, no reasoning or tool-call parsing;
 * stop strings apply. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/gen.h"
#include "api/structured.h"
#include "tokenizer/tokenizer.h"

#define MAX_PROMPT_IDS (1 << 24)

typedef struct cmpl_job {
    ns_gen_job base; /* first: the shared path allocates and frees the job */
    int32_t *ids;
    size_t n_ids;
    size_t sent_text, text_off; /* streaming cursors: text, logprobs text_offset */
} cmpl_job;

static bool ids_from_array(ns_api *a, json_t *arr, cmpl_job *j, ns_http_error *e) {
    size_t n = json_array_size(arr);
    if (n > MAX_PROMPT_IDS || (n > 0 && n >= ns_api_prompt_limit(a))) { /* never fits: no copy of it */
        ns_api_context_error(a, (int64_t)n, false, "prompt", e);
        return false;
    }
    j->ids = malloc((n ? n : 1) * sizeof *j->ids);
    if (!j->ids) {
        ns_http_error_set(e, 500, NULL, "internal_error", "out of memory");
        return false;
    }
    int32_t vocab = a->cfg.vocab_size;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            ns_http_error_set(e, 400, "prompt", "invalid_value",
                              "'prompt[%zu]' must be a token id in [0, %d)", i, vocab);
            return false;
        }
        j->ids[i] = (int32_t)json_integer_value(v);
    }
    j->n_ids = n;
    return true;
}

static bool parse_prompt(ns_api *a, json_t *body, cmpl_job *j, ns_http_error *e) {
    json_t *p = json_object_get(body, "prompt");
    if (!p || json_is_null(p)) {
        ns_http_error_set(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        return false;
    }
    if (json_is_array(p) && json_array_size(p) >= 1 && !json_is_integer(json_array_get(p, 0))) {
        if (json_array_size(p) > 1) {
            ns_http_error_set(e, 400, "prompt", "unsupported_value", "only one prompt per request is supported");
            return false;
        }
        p = json_array_get(p, 0); /* ["text"] or [[ids]] */
    }
    if (json_is_string(p)) {
        /* tokenizing stops once the prompt cannot fit the context */
        ns_error err = {0};
        bool too_long = false;
        ns_status rc = ns_tokenizer_encode_limit(a->tok, json_string_value(p), json_string_length(p), true,
                                                 ns_api_prompt_limit(a), &j->ids, &j->n_ids, &too_long, &err);
        if (rc != NS_OK) {
            j->ids = NULL;
            ns_http_error_from_status(e, rc, "prompt", err.msg);
            return false;
        }
        if (too_long) {
            ns_api_context_error(a, (int64_t)j->n_ids, true, "prompt", e);
            return false;
        }
        return true;
    }
    if (json_is_array(p)) return ids_from_array(a, p, j, e);
    ns_http_error_set(e, 400, "prompt", "invalid_type",
                      "'prompt' must be a string, an array of token ids, or a one-element array of either");
    return false;
}

static bool check_unsupported(json_t *body, ns_http_error *e) {
    bool echo = false;
    if (!ns_api_get_bool(body, "echo", &echo, e)) return false;
    if (echo) {
        ns_http_error_set(e, 400, "echo", "unsupported_value", "'echo' is not supported");
        return false;
    }
    const char *suffix = NULL;
    if (!ns_api_get_str(body, "suffix", &suffix, e)) return false;
    if (suffix && *suffix) {
        ns_http_error_set(e, 400, "suffix", "unsupported_value", "'suffix' is not supported");
        return false;
    }
    int64_t best_of = 1;
    if (!ns_api_get_int(body, "best_of", 1, 1, &best_of, e)) {
        snprintf(e->message, sizeof e->message, "only best_of = 1 is supported");
        return false;
    }
    return true;
}

static bool cmpl_prepare(ns_gen_job *gj, ns_gen_opts *o, ns_http_error *e) {
    cmpl_job *j = (cmpl_job *)gj;
    if (!check_unsupported(gj->body, e)) return false;
    if (!parse_prompt(gj->a, gj->body, j, e)) return false;
    gj->prompt = j->ids;
    gj->n_prompt = j->n_ids;
    /* response_format json_object / json_schema: the raw completion text
     * is constrained (no reasoning block: there is no template) */
    ns_struct_spec spec;
    return ns_structured_response_format(gj->body, &spec, e) && ns_structured_attach(gj->a, &spec, o, e);
}

static void cmpl_release(ns_gen_job *gj) { free(((cmpl_job *)gj)->ids); }

static json_t *cmpl_logprobs(ns_gen_job *gj, int32_t from, int32_t to) {
    return ns_gen_completion_logprobs(&gj->g, from, to, &((cmpl_job *)gj)->text_off);
}

static ns_status cmpl_stream_delta(ns_gen_job *gj, ns_buf *out) {
    json_t *s;
    ns_status rc = ns_gen_new_text(&gj->g.text, &((cmpl_job *)gj)->sent_text, &s);
    if (rc != NS_OK || !s) return rc;
    return ns_gen_job_emit(gj, out, s, NULL);
}

static json_t *cmpl_final_delta(ns_gen_job *gj) { return json_string(""); }

static json_t *cmpl_whole_output(ns_gen_job *gj, const char *finish) {
    return json_stringn(gj->g.text.data ? gj->g.text.data : "", gj->g.text.len);
}

static const ns_gen_endpoint k_completions = {
    .job_size = sizeof(cmpl_job),
    .chat = false,
    .kind = "completion",
    .id_prefix = "cmpl-",
    .object = "text_completion",
    .chunk_object = "text_completion",
    .whole_key = "text",
    .delta_key = "text",
    .prompt_param = "prompt",
    .prepare = cmpl_prepare,
    .stream_delta = cmpl_stream_delta,
    .final_delta = cmpl_final_delta,
    .logprobs = cmpl_logprobs,
    .whole_output = cmpl_whole_output,
    .release = cmpl_release,
};

void ns_api_completions(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_gen_handle(&k_completions, ud, req, resp);
}
