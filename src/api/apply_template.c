/* apply_template.c — POST /apply-template (llama.cpp shape): a chat
 * request body (messages, tools, add_generation_prompt — default true —,
 * chat_template_kwargs) -> {"prompt": the rendered chat template}. The
 * same code path as /v1/chat/completions renders it, so what this returns
 * is exactly what the model would be given. */
#include "api/api.h"
#include "api/chat.h"

void ns_api_apply_template(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    if (!ns_api_require_ready(a, resp)) return;
    json_t *body = ns_api_parse_body(a, req, resp);
    if (!body) return;
    ns_chat_prompt cp;
    if (ns_chat_prompt_build(a, body, false, &cp, &resp->err)) {
        json_t *root = json_pack("{s:s%}", "prompt", cp.text, cp.len);
        ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
        json_decref(root);
        ns_chat_prompt_free(&cp);
    }
    json_decref(body);
}
