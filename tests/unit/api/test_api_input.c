/* test_api_input.c — request-input helpers of the API (api.c) without a
 * server: body parsing never echoes the body, sampling ranges (top_p in
 * (0, 1] however small), the context-length messages, and the body
 * budget that caps memory for request bodies handled at once. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "api/api.h"
#include "test.h"

static ns_api g_api;

static ns_http_request body_req(const char *body) {
    ns_http_request r;
    memset(&r, 0, sizeof r);
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = body;
    r.body_len = strlen(body);
    return r;
}

TEST(invalid_json_does_not_echo_the_body) {
    static const char *const bodies[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"sk-SECRET-1234\"}], oops}",
        "{\"api_key\": sk-SECRET-1234}",
        "sk-SECRET-1234",
        "{\"a\": \"sk-SECRET-1234\" \"b\"}",
        "{\"a\": 1}\x1b[31m sk-SECRET-1234",
        "[\"sk-SECRET-1234\"",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        ns_http_request req = body_req(bodies[i]);
        ns_http_response resp;
        memset(&resp, 0, sizeof resp);
        json_t *j = ns_api_parse_body(&g_api, &req, &resp);
        CHECK(j == NULL);
        json_decref(j);
        CHECK_EQ_INT(resp.err.status, 400);
        CHECK_EQ_STR(resp.err.code, "invalid_json");
        CHECKF(strstr(resp.err.message, "SECRET") == NULL, "body %zu echoed: %s", i, resp.err.message);
        CHECKF(strstr(resp.err.message, "sk-") == NULL, "body %zu echoed: %s", i, resp.err.message);
        for (const char *m = resp.err.message; *m; m++)
            CHECKF((unsigned char)*m >= 0x20 && (unsigned char)*m < 0x7f, "body %zu: control byte in \"%s\"", i,
                   resp.err.message);
        CHECKF(strstr(resp.err.message, "line 1") != NULL, "no position: %s", resp.err.message);
        ns_http_error_clear(&resp.err);
    }
}

static bool gen_params(const char *json, ns_api_gen_params *p, ns_http_error *e) {
    json_t *body = json_loads(json, 0, NULL);
    CHECKF(body != NULL, "bad test JSON %s", json);
    memset(e, 0, sizeof *e);
    bool ok = body && ns_api_parse_gen_params(&g_api, body, true, p, e);
    json_decref(body);
    return ok;
}

TEST(top_p_accepts_any_positive_value) {
    static const char *const ok[] = {"{\"top_p\": 1e-300}", "{\"top_p\": 5e-324}", "{\"top_p\": 1e-45}",
                                     "{\"top_p\": 1e-30}", "{\"top_p\": 0.5}", "{\"top_p\": 1}"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ns_api_gen_params p;
        ns_http_error e;
        CHECKF(gen_params(ok[i], &p, &e), "%s: %s", ok[i], e.message);
        CHECKF(p.rp.sampling.top_p > 0.0f && p.rp.sampling.top_p <= 1.0f, "%s -> %g", ok[i],
               (double)p.rp.sampling.top_p);
        ns_http_error_clear(&e);
    }
    static const char *const bad[] = {"{\"top_p\": 0}", "{\"top_p\": -1e-300}", "{\"top_p\": 1.0000001}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ns_api_gen_params p;
        ns_http_error e;
        CHECKF(!gen_params(bad[i], &p, &e), "%s accepted", bad[i]);
        CHECK_EQ_INT(e.status, 400);
        CHECK_EQ_STR(e.param, "top_p");
        ns_http_error_clear(&e);
    }
}

TEST(context_messages) {
    ns_http_error e;
    memset(&e, 0, sizeof e);
    CHECK(ns_api_check_context(&g_api, 100, 0, "prompt", &e));
    /* max_tokens absent (0) or given: the message names the prompt only,
     * never "0 requested" or a negative number */
    int64_t mts[] = {0, 5, INT32_MAX};
    for (size_t i = 0; i < 3; i++) {
        CHECK(!ns_api_check_context(&g_api, 5000, mts[i], "prompt", &e));
        CHECK_EQ_INT(e.status, 400);
        CHECK_EQ_STR(e.code, "context_length_exceeded");
        CHECKF(strstr(e.message, "requested") == NULL && strchr(e.message, '-') == NULL, "%s", e.message);
        CHECKF(strstr(e.message, "maximum context length is 4096 tokens") && strstr(e.message, "has 5000 tokens"), "%s",
               e.message);
        CHECK_EQ_INT(json_integer_value(json_object_get(e.extra, "prompt_tokens")), 5000);
        CHECK(json_is_true(json_object_get(e.extra, "prompt_tokens_exact")));
        ns_http_error_clear(&e);
    }
    /* tokenizing stopped past the context: "more than <context>" and a
     * lower bound */
    ns_api_context_error(&g_api, 4100, true, "messages", &e);
    CHECK_EQ_STR(e.code, "context_length_exceeded");
    CHECK_EQ_STR(e.param, "messages");
    CHECKF(strstr(e.message, "has more than 4096 tokens") != NULL, "%s", e.message);
    CHECK_EQ_INT(json_integer_value(json_object_get(e.extra, "prompt_tokens")), 4100);
    CHECK(json_is_false(json_object_get(e.extra, "prompt_tokens_exact")));
    CHECK_EQ_INT(json_integer_value(json_object_get(e.extra, "context_tokens")), 4096);
    ns_http_error_clear(&e);
    CHECK_EQ_INT(ns_api_prompt_limit(&g_api), 4096);
}

TEST(body_budget) {
    ns_api a;
    ns_api_init(&a, "t");
    a.body_budget = 1000;
    ns_http_response r;
    memset(&r, 0, sizeof r);
    CHECK(ns_api_body_admit(&a, 5000, &r)); /* alone: always admitted */
    CHECK(!ns_api_body_admit(&a, 1, &r));
    CHECK_EQ_INT(r.err.status, 503);
    CHECK_EQ_STR(r.err.code, "server_busy");
    CHECK_EQ_INT(r.retry_after_s, 1);
    ns_http_error_clear(&r.err);
    ns_api_body_release(&a, 5000);
    CHECK(ns_api_body_admit(&a, 600, &r));
    CHECK(ns_api_body_admit(&a, 400, &r)); /* exactly the budget */
    memset(&r, 0, sizeof r);
    CHECK(!ns_api_body_admit(&a, 1, &r));
    ns_http_error_clear(&r.err);
    ns_api_body_release(&a, 600);
    CHECK(ns_api_body_admit(&a, 0, &r));
    CHECK(ns_api_body_admit(&a, 600, &r));
    ns_api_body_release(&a, 600);
    ns_api_body_release(&a, 0);
    ns_api_body_release(&a, 400);
    CHECK_EQ_INT(atomic_load(&a.body_inflight), 0);
}

/* Threads admitting and releasing at once never see more than the budget
 * in flight and leave it at zero. */
static ns_api g_shared;
static atomic_size_t g_peak;
static void *budget_thread(void *arg) {
    size_t bytes = (size_t)(uintptr_t)arg;
    for (int i = 0; i < 2000; i++) {
        ns_http_response r;
        memset(&r, 0, sizeof r);
        if (!ns_api_body_admit(&g_shared, bytes, &r)) {
            ns_http_error_clear(&r.err);
            continue;
        }
        size_t now = atomic_load(&g_shared.body_inflight), p = atomic_load(&g_peak);
        while (now > p && !atomic_compare_exchange_weak(&g_peak, &p, now)) {
        }
        ns_api_body_release(&g_shared, bytes);
    }
    return NULL;
}

TEST(body_budget_threads) {
    ns_api_init(&g_shared, "t");
    g_shared.body_budget = 1000;
    atomic_store(&g_peak, 0);
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, budget_thread, (void *)(uintptr_t)(100 + 50 * i));
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    CHECK_EQ_INT(atomic_load(&g_shared.body_inflight), 0);
    CHECKF(atomic_load(&g_peak) <= 1000, "peak %zu", atomic_load(&g_peak));
}

int main(void) {
    ns_api_init(&g_api, "test");
    g_api.cfg.max_position_embeddings = 4096;
    RUN(invalid_json_does_not_echo_the_body);
    RUN(top_p_accepts_any_positive_value);
    RUN(context_messages);
    RUN(body_budget);
    RUN(body_budget_threads);
    TEST_MAIN_END;
}
