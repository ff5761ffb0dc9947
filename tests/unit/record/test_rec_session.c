/* test_rec_session.c — grouping a recording into sessions
 * (record/session.h): append-only turns join their session, parallel
 * sessions stay apart, an edited history joins by its first user message,
 * completions by prompt prefix, arrival order wins over file order, and
 * records without a body are skipped. */
#include "record/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

static json_t *m(const char *role, const char *content) { return json_pack("{s:s,s:s}", "role", role, "content", content); }

static json_t *chat(double t, json_t *msgs) {
    return json_pack("{s:i,s:f,s:s,s:i,s:{s:o}}", "v", 1, "t", t, "endpoint", "/v1/chat/completions", "status", 200,
                     "request", "messages", msgs);
}

static json_t *compl(double t, const char *prompt) {
    return json_pack("{s:f,s:s,s:{s:s}}", "t", t, "endpoint", "/v1/completions", "request", "prompt", prompt);
}

TEST(groups) {
    json_t *recs[9];
    int n = 0;
    /* two chat sessions interleaved, out of file order by time */
    recs[n++] = chat(2.0, json_pack("[o,o,o,o]", m("system", "S"), m("user", "A"), m("assistant", "a"), m("user", "A2")));
    recs[n++] = chat(1.0, json_pack("[o,o]", m("system", "S"), m("user", "A")));
    recs[n++] = chat(1.5, json_pack("[o,o]", m("system", "S"), m("user", "B")));
    recs[n++] = chat(2.5, json_pack("[o,o,o,o]", m("system", "S"), m("user", "B"), m("assistant", "b"), m("user", "B2")));
    /* B's history edited (system changed): joins B by its first user message */
    recs[n++] = chat(3.0, json_pack("[o,o,o,o,o,o]", m("system", "S2"), m("user", "B"), m("assistant", "b"), m("user", "B2"),
                                    m("assistant", "c"), m("user", "B3")));
    /* completions by prefix */
    recs[n++] = compl(1.2, "once upon");
    recs[n++] = compl(2.2, "once upon a time");
    recs[n++] = compl(2.3, "twice");
    /* a 400 for a body that was not JSON */
    recs[n++] = json_pack("{s:f,s:n}", "t", 0.5, "request");
    ns_recording r;
    ns_error err = {0};
    CHECK(ns_recording_from(recs, n, &r, &err) == NS_OK);
    CHECK_EQ_INT(r.n, 8);
    CHECK_EQ_INT(r.n_skipped, 1);
    CHECK_EQ_INT(r.n_sessions, 4);
    /* sorted by arrival: A(1.0) first */
    CHECK_EQ_INT(r.e[0].t, 1.0);
    int sa = r.e[0].session;
    CHECK_EQ_INT(r.s[sa].n, 2);
    CHECK_EQ_INT(r.e[r.s[sa].idx[1]].t * 10, 20);
    int sb = -1;
    for (int i = 0; i < r.n; i++)
        if (r.e[i].t == 1.5) sb = r.e[i].session;
    CHECK(sb >= 0 && sb != sa);
    if (sb >= 0) {
        CHECK_EQ_INT(r.s[sb].n, 3);
        CHECK_EQ_INT(r.e[r.s[sb].idx[2]].t, 3.0);
        CHECK_EQ_INT(r.e[r.s[sb].idx[2]].turn, 2);
    }
    int sc = -1, st = -1;
    for (int i = 0; i < r.n; i++) {
        if (r.e[i].t == 1.2) sc = r.e[i].session;
        if (r.e[i].t == 2.3) st = r.e[i].session;
    }
    CHECK(sc >= 0 && r.s[sc].n == 2);
    CHECK(st >= 0 && st != sc && r.s[st].n == 1);
    ns_recording_free(&r);
}

TEST(load_file) {
    char path[] = "/tmp/test_rec_session_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *txt = "{\"t\":1,\"redacted\":true,\"endpoint\":\"/v1/messages\",\"request\":{\"system\":\"S\",\"messages\":[]}}\n"
                      "\n"
                      "{\"t\":2,\"request\":{\"input\":\"hi\",\"instructions\":\"I\"},\"endpoint\":\"/v1/responses\"}\n";
    CHECK(write(fd, txt, strlen(txt)) == (ssize_t)strlen(txt));
    close(fd);
    ns_recording r;
    ns_error err = {0};
    CHECK(ns_recording_load(path, &r, &err) == NS_OK);
    CHECK_EQ_INT(r.n, 2);
    CHECK(r.any_redacted);
    CHECK(r.e[0].kind == NS_REC_MESSAGES);
    CHECK_EQ_INT(json_array_size(r.e[0].items), 1); /* system as a first message */
    CHECK(r.e[1].kind == NS_REC_RESPONSES);
    CHECK_EQ_INT(json_array_size(r.e[1].items), 2); /* instructions + the input string */
    ns_recording_free(&r);
    FILE *f = fopen(path, "w");
    fputs("{\"t\":1}\n[1,2]\n", f);
    fclose(f);
    CHECK(ns_recording_load(path, &r, &err) == NS_ERR_FORMAT);
    CHECK(strstr(err.msg, ":2:") != NULL);
    unlink(path);
}

int main(void) {
    RUN(groups);
    RUN(load_file);
    TEST_MAIN_END;
}
