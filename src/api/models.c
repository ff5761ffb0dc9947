/* models.c — GET /v1/models: the one model this server serves.
 * context_length is the effective context: the model's, or less when the KV
 * pool holds fewer tokens for one request; model_context_length is the
 * model's own (max_position_embeddings). Both only once the model is ready. */
#include "api/api.h"

void ns_api_models(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", a->model_name, "object", "model", "created", (json_int_t)a->created,
                          "owned_by", "nightshift");
    if (m && atomic_load(&a->state) == NS_API_READY) {
        ns_sched_capacity c;
        ns_sched_get_capacity(a->sched, &c);
        json_object_set_new(m, "context_length", json_integer(c.largest_fits_alone_tokens));
        json_object_set_new(m, "model_context_length", json_integer(a->cfg.max_position_embeddings));
    }
    json_t *root = json_pack("{s:s,s:[o]}", "object", "list", "data", m);
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}
