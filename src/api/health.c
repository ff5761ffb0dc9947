/* health.c — GET /health: 200 {"status":"ok"} once the model is loaded,
 * 503 {"status":"loading"} before (and "shutting_down" while draining),
 * so supervisors and tests can wait for readiness. Needs no API key. */
#include "api/api.h"

void ns_api_health(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)req;
    ns_api *a = ud;
    switch (atomic_load(&a->state)) {
    case NS_API_READY:
        ns_http_set_text(resp, 200, "application/json", "{\"status\":\"ok\"}");
        break;
    case NS_API_LOADING:
        ns_http_set_text(resp, 503, "application/json", "{\"status\":\"loading\"}");
        resp->retry_after_s = 1;
        break;
    case NS_API_DRAINING:
        ns_http_set_text(resp, 503, "application/json", "{\"status\":\"shutting_down\"}");
        break;
    default:
        ns_http_set_text(resp, 503, "application/json", "{\"status\":\"error\"}");
        break;
    }
}
