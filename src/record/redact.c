/* redact.c — message texts -> token counts and hashes (see redact.h). */
#include "record/redact.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static const char *const k_bearing[] = {"messages", "prompt", "system", "instructions", "input"};
static const char *const k_structural[] = {"role", "type", "name", "id", "tool_call_id", "tool_use_id", "call_id",
                                           "status"};

static bool in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, l[i]) == 0) return true;
    return false;
}

static json_t *placeholder(const void *bytes, size_t n, long long tokens) {
    XXH128_hash_t h = XXH3_128bits(bytes, n);
    char hex[33];
    snprintf(hex, sizeof hex, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    return json_pack("{s:o,s:I,s:s}", "redacted_tokens", tokens >= 0 ? json_integer(tokens) : json_null(), "chars",
                     (json_int_t)n, "xxh3", hex);
}

int ns_redact_is_placeholder(const json_t *v) {
    return json_is_object(v) && json_object_get(v, "redacted_tokens") && json_object_get(v, "xxh3");
}

/* An array of integers only (a tokenized prompt). */
static bool int_array(const json_t *v) {
    if (!json_is_array(v) || json_array_size(v) == 0) return false;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) if (!json_is_integer(x)) return false;
    return true;
}

static json_t *ids_placeholder(const json_t *arr) {
    size_t n = json_array_size(arr);
    int32_t *ids = n <= SIZE_MAX / sizeof *ids ? malloc(n * sizeof *ids) : NULL;
    if (!ids) return NULL;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    json_t *p = placeholder(ids, n * sizeof *ids, (long long)n);
    free(ids);
    return p;
}

/* Depth is bounded by the body's own (the API caps parsed JSON depth). */
static json_t *redact_value(const json_t *v, ns_redact_count_fn count, void *ctx) {
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        return placeholder(s, n, count ? count(ctx, s, n) : -1);
    }
    if (int_array(v)) return ids_placeholder(v);
    if (json_is_array(v)) {
        json_t *out = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            json_t *c = redact_value(x, count, ctx);
            if (!out || !c || json_array_append_new(out, c) != 0) {
                json_decref(out);
                return NULL;
            }
        }
        return out;
    }
    if (json_is_object(v)) {
        json_t *out = json_object();
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
            bool keep = json_is_string(x) && in_list(k, k_structural, sizeof k_structural / sizeof *k_structural);
            json_t *c = keep ? json_copy(x) : redact_value(x, count, ctx);
            if (!out || !c || json_object_set_new(out, k, c) != 0) {
                json_decref(out);
                return NULL;
            }
        }
        return out;
    }
    return json_copy((json_t *)v); /* numbers, booleans, null */
}

json_t *ns_redact_body(const json_t *body, ns_redact_count_fn count, void *ctx) {
    if (!json_is_object(body)) return redact_value(body, count, ctx);
    json_t *out = json_object();
    if (!out) return NULL;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)body, k, x) {
        bool bearing = in_list(k, k_bearing, sizeof k_bearing / sizeof *k_bearing);
        json_t *c = bearing ? redact_value(x, count, ctx) : json_deep_copy(x);
        if (!c || json_object_set_new(out, k, c) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}
