/* models.c — GET /v1/models: the one model this server serves, and
 * GET /v1/models/{id}: that model by its id (404 model_not_found for any
 * other id, as OpenAI answers).
 * context_length is the effective context: the model's, or less when the KV
 * pool holds fewer tokens for one request; model_context_length is the
 * model's own (max_position_embeddings). Both only once the model is ready. */
#include <string.h>

#include "api/api.h"

static json_t *model_object(ns_api *a) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", a->model_name, "object", "model", "created", (json_int_t)a->created,
                          "owned_by", "nightshift");
    if (m && atomic_load(&a->state) == NS_API_READY) {
        ns_sched_capacity c;
        ns_sched_get_capacity(a->sched, &c);
        json_object_set_new(m, "context_length", json_integer(c.largest_fits_alone_tokens));
        json_object_set_new(m, "model_context_length", json_integer(a->cfg.max_position_embeddings));
    }
    return m;
}

void ns_api_models(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    json_t *root = json_pack("{s:s,s:[o]}", "object", "list", "data", model_object(a));
    ns_http_set_json(resp, 200, root ? json_dumps(root, JSON_COMPACT) : NULL);
    json_decref(root);
}

void ns_api_model_get(void *ud, const ns_http_request *req, ns_http_response *resp) {
    ns_api *a = ud;
    const char *id = strrchr(req->path, '\0');
    static const char *const prefixes[] = {"/v1/models/", "/models/"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncmp(req->path, prefixes[i], strlen(prefixes[i])) == 0) id = req->path + strlen(prefixes[i]);
    if (strcmp(id, a->model_name) != 0) {
        ns_http_error_set(&resp->err, 404, "model", "model_not_found",
                          "The model '%.200s' does not exist; this server serves '%s'", id, a->model_name);
        return;
    }
    json_t *m = model_object(a);
    ns_http_set_json(resp, 200, m ? json_dumps(m, JSON_COMPACT) : NULL);
    json_decref(m);
}
