/* tokenize.c — POST /tokenize (llama.cpp shape):
 *   {"content": "...", "add_special": false, "with_pieces": false}
 *   -> {"tokens": [ids]} or, with pieces, {"tokens": [{"id", "piece"}]}. */
#include <stdlib.h>

#include "api/api.h"
#include "tokenizer/tokenizer.h"

void ns_api_tokenize(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    json_t *c = json_object_get(body, "content");
    bool add_special = false, with_pieces = false;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!c) {
        ns_http_error_set(&resp->err, 400, "content", "missing_required_parameter", "'content' is required");
        goto done;
    }
    if (!json_is_string(c)) {
        ns_http_error_set(&resp->err, 400, "content", "invalid_type", "'content' must be a string");
        goto done;
    }
    if (!ns_api_get_bool(body, "add_special", &add_special, &resp->err)) goto done;
    if (!ns_api_get_bool(body, "with_pieces", &with_pieces, &resp->err)) goto done;
    ns_error err = {0};
    /* bounded like the generation endpoints: a text far longer than any
     * prompt the model can take is refused once it passes 4 contexts,
     * without tokenizing (or holding ids for) the rest of it */
    const size_t limit = (size_t)(a->cfg.max_position_embeddings > 0 ? a->cfg.max_position_embeddings : 32768) * 4;
    bool exceeded = false;
    ns_status rc = ns_tokenizer_encode_limit(a->tok, json_string_value(c), json_string_length(c), add_special, limit,
                                             &ids, &n, &exceeded, &err);
    if (rc != NS_OK) {
        ids = NULL;
        ns_http_error_from_status(&resp->err, rc, "content", err.msg);
        goto done;
    }
    if (exceeded) {
        ns_http_error_set(&resp->err, 400, "content", "content_too_long",
                          "the content has more than %zu tokens (4 x the model's context); /tokenize stops there", limit);
        goto done;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (!with_pieces) {
            json_array_append_new(arr, json_integer(ids[i]));
            continue;
        }
        char *s = NULL;
        size_t len = 0;
        if (ns_tokenizer_decode(a->tok, &ids[i], 1, false, &s, &len, &err) != NS_OK) s = NULL;
        json_t *piece = s ? json_stringn(s, len) : NULL;
        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", ids[i], "piece", piece ? piece : json_string("")));
        free(s);
    }
    json_t *root = json_pack("{s:o}", "tokens", arr);
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
done:
    free(ids);
    json_decref(body);
}
