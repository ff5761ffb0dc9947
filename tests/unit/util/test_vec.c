/* util/vec: doubling growth, the cap, overflow checks, failure leaves the
 * array untouched. */
#include <stdint.h>

#include "test.h"
#include "util/vec.h"

TEST(vec_grows_by_doubling_and_keeps_contents) {
    int32_t *v = NULL;
    size_t cap = 0;
    CHECK(NS_VEC_GROW(v, cap, 0, 0) == NS_OK); /* nothing needed: no allocation */
    CHECK(v == NULL);
    CHECK_EQ_INT(cap, 0);
    CHECK(NS_VEC_GROW(v, cap, 1, 0) == NS_OK);
    CHECK(v != NULL);
    CHECK_EQ_INT(cap, NS_VEC_MIN_CAP);
    for (int32_t i = 0; i < 1000; i++) {
        size_t before = cap;
        CHECK(NS_VEC_GROW(v, cap, (size_t)i + 1, 0) == NS_OK);
        CHECK(cap >= (size_t)i + 1);
        CHECK(cap == before || cap == before * 2);
        v[i] = i * 3;
    }
    CHECK_EQ_INT(cap, 1024);
    int bad = 0;
    for (int32_t i = 0; i < 1000; i++) bad += v[i] != i * 3;
    CHECK_EQ_INT(bad, 0);
    /* a jump past double grows straight to the next power-of-two multiple */
    CHECK(NS_VEC_GROW(v, cap, 5000, 0) == NS_OK);
    CHECK_EQ_INT(cap, 8192);
    free(v);
}

TEST(vec_cap_clamps_and_refuses_beyond) {
    char *v = NULL;
    size_t cap = 0;
    CHECK(ns_vec_grow((void **)&v, &cap, 20, 1, 24) == NS_OK);
    CHECK_EQ_INT(cap, 24); /* 16 -> 32 clamped to the cap */
    CHECK(ns_vec_grow((void **)&v, &cap, 24, 1, 24) == NS_OK);
    CHECK_EQ_INT(cap, 24);
    char *before = v;
    CHECK(ns_vec_grow((void **)&v, &cap, 25, 1, 24) == NS_ERR_NOMEM);
    CHECK(v == before);
    CHECK_EQ_INT(cap, 24);
    free(v);
}

TEST(vec_overflow_is_refused) {
    uint64_t *v = NULL;
    size_t cap = 0;
    CHECK(NS_VEC_GROW(v, cap, SIZE_MAX / sizeof *v + 1, 0) == NS_ERR_NOMEM);
    CHECK(NS_VEC_GROW(v, cap, SIZE_MAX, 0) == NS_ERR_NOMEM);
    CHECK(v == NULL);
    CHECK_EQ_INT(cap, 0);
}

TEST(vec_struct_elements) {
    typedef struct {
        double a;
        int b;
    } pair;
    pair *v = NULL;
    size_t cap = 0, n = 0;
    for (int i = 0; i < 100; i++) {
        CHECK(NS_VEC_GROW(v, cap, n + 1, 64) == NS_OK || n >= 64);
        if (n < cap) v[n++] = (pair){i * 0.5, i};
    }
    CHECK_EQ_INT(n, 64);
    CHECK_EQ_INT(cap, 64);
    CHECK_EQ_INT(v[63].b, 63);
    CHECK(NS_VEC_GROW(v, cap, 65, 64) == NS_ERR_NOMEM);
    free(v);
}

int main(void) {
    RUN(vec_grows_by_doubling_and_keeps_contents);
    RUN(vec_cap_clamps_and_refuses_beyond);
    RUN(vec_overflow_is_refused);
    RUN(vec_struct_elements);
    TEST_MAIN_END;
}
