/* detokenize.c — POST /detokenize (llama.cpp shape):
 *   {"tokens": [ids]} -> {"content": "..."}; special tokens are kept.
 * Ids are accepted in [0, max(model vocab_size, tokenizer size)): every id
 * /v1/completions takes as a prompt (config.json's vocab_size, often
 * padded past the tokenizer) decodes here. Ids the tokenizer has no piece
 * for (the padding) have no text, as generated ones have none and as
 * Hugging Face's decode skips them. */
#include <stdlib.h>

#include "api/api.h"
#include "tokenizer/tokenizer.h"

#define MAX_IDS (1 << 24)

void ns_api_detokenize(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0;
    json_t *t = json_object_get(body, "tokens");
    if (!t) {
        ns_http_error_set(&resp->err, 400, "tokens", "missing_required_parameter", "'tokens' is required");
        goto done;
    }
    if (!json_is_array(t) || json_array_size(t) > MAX_IDS) {
        ns_http_error_set(&resp->err, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
        goto done;
    }
    size_t n = json_array_size(t);
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        ns_http_error_set(&resp->err, 500, NULL, "internal_error", "out of memory");
        goto done;
    }
    const int32_t n_tok = ns_tokenizer_n_vocab(a->tok);
    const int32_t vocab = a->cfg.vocab_size > n_tok ? a->cfg.vocab_size : n_tok;
    size_t i, k = 0;
    json_t *v;
    json_array_foreach(t, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            ns_http_error_set(&resp->err, 400, "tokens", "invalid_value", "'tokens[%zu]' must be a token id in [0, %d)",
                              i, vocab);
            goto done;
        }
        if (json_integer_value(v) < n_tok) ids[k++] = (int32_t)json_integer_value(v); /* else: no text */
    }
    ns_error err = {0};
    ns_status rc = ns_tokenizer_decode(a->tok, ids, k, false, &text, &len, &err);
    if (rc != NS_OK) {
        text = NULL;
        ns_http_error_from_status(&resp->err, rc, "tokens", err.msg);
        goto done;
    }
    json_t *root = json_pack("{s:s%}", "content", text, len);
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
done:
    free(text);
    free(ids);
    json_decref(body);
}
