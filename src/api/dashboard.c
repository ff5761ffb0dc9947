/* dashboard.c — GET /dashboard: one self-contained HTML page (inline CSS
 * and JS, no external assets, so it works offline and under a strict
 * network policy) that polls GET /v1/status once a second and draws the
 * requests, KV tiers, cache breaks and step charts.
 *
 * The page's source is src/dashboard/dashboard.html; the build turns it
 * into a C array (src/dashboard/embed.sh -> $(BUILD)/gen/dashboard_page.h),
 * so the binary carries it and there is no file to find at run time.
 *
 * The page itself is open (route flag `open`): it is static and holds no
 * data, and a browser navigation cannot carry a bearer token. The data
 * comes from /v1/status, which needs the API key when one is configured;
 * the page asks for the key on a 401 and sends it as a bearer token (kept
 * in the tab's sessionStorage only). */
#include "api/api.h"
#include "dashboard_page.h"

void ns_api_dashboard(void *ud, const ns_http_request *req, ns_http_response *resp) {
    (void)ud, (void)req;
    /* the array ends with a NUL added by embed.sh: it is a C string */
    ns_http_set_text(resp, 200, "text/html; charset=utf-8", (const char *)ns_dashboard_page);
}
