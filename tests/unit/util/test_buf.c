#include "test.h"
#include "util/buf.h"

TEST(buf_append_and_cap) {
    ns_buf b;
    ns_buf_init(&b, 8);
    CHECK(ns_buf_puts(&b, "abcd") == NS_OK);
    CHECK(ns_buf_printf(&b, "%d", 123) == NS_OK);
    CHECK_EQ_STR(b.data, "abcd123");
    CHECK(ns_buf_puts(&b, "xy") == NS_ERR_NOMEM); /* 9 > cap 8 */
    CHECK_EQ_STR(b.data, "abcd123");
    size_t n;
    char *s = ns_buf_take(&b, &n);
    CHECK_EQ_INT(n, 7);
    free(s);
    ns_buf_free(&b);
}

int main(void) {
    RUN(buf_append_and_cap);
    TEST_MAIN_END;
}
