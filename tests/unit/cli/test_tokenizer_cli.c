/* test_tokenizer_cli.c — `nightshift tokenize` (ns_cli_tokenize) driven
 * in-process with stdin/stdout/stderr redirected to temporary files. */
#include <fcntl.h>
#include <unistd.h>

#include "cli/cli_tokenize.h"
#include "test.h"

static char g_dir[64];

typedef struct cli_result {
    int rc;
    char out[8192];
    char err[8192];
} cli_result;

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

/* Runs ns_cli_tokenize(argv) with `input` on stdin. */
static void run_cli(const char *input, size_t input_len, int argc, char **argv, cli_result *r) {
    char in_p[128], out_p[128], err_p[128];
    snprintf(in_p, sizeof in_p, "%s/in", g_dir);
    snprintf(out_p, sizeof out_p, "%s/out", g_dir);
    snprintf(err_p, sizeof err_p, "%s/err", g_dir);
    FILE *f = fopen(in_p, "wb");
    if (f) {
        fwrite(input, 1, input_len, f);
        fclose(f);
    }
    fflush(stdout);
    fflush(stderr);
    int save_in = dup(0), save_out = dup(1), save_err = dup(2);
    int fi = open(in_p, O_RDONLY), fo = open(out_p, O_WRONLY | O_CREAT | O_TRUNC, 0600),
        fe = open(err_p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fi, 0);
    dup2(fo, 1);
    dup2(fe, 2);
    close(fi);
    close(fo);
    close(fe);
    clearerr(stdin);
    r->rc = ns_cli_tokenize(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(save_in, 0);
    dup2(save_out, 1);
    dup2(save_err, 2);
    close(save_in);
    close(save_out);
    close(save_err);
    clearerr(stdin);
    slurp(out_p, r->out, sizeof r->out);
    slurp(err_p, r->err, sizeof r->err);
}

static char *model(const char *name) {
    static char buf[4096];
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    snprintf(buf, sizeof buf, "%s", test_shared_path(rel));
    return buf;
}

/* Most cases use tinystories-656k: its tokenizer loads in milliseconds,
 * which keeps this binary fast under sanitizers. */
TEST(cli_plain_and_special) {
    cli_result r;
    char *argv1[] = {"--model", model("tiny-llama3"), "--add-special"};
    run_cli("Hello world", 11, 3, argv1, &r);
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_STR(r.out, "[128000,9906,1917]\n");
    char *argv2[] = {"--model", model("tinystories-656k")};
    run_cli("Hello world", 11, 2, argv2, &r);
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_STR(r.out, "[80,1288,139,410,555]\n");
    run_cli("", 0, 2, argv2, &r);
    CHECK_EQ_STR(r.out, "[]\n");
    char *argv3[] = {"--model", model("tinystories-656k"), "--add-special"};
    run_cli("Once upon a time", 16, 3, argv3, &r);
    CHECK_EQ_STR(r.out, "[1,80,147,201,282,57]\n"); /* the README's llama.cpp oracle */
    run_cli("", 0, 3, argv3, &r);
    CHECK_EQ_STR(r.out, "[1]\n");
}

TEST(cli_jsonl) {
    cli_result r;
    char *argv[] = {"--jsonl", "--model", model("tinystories-656k")};
    /* Blank lines are skipped; CRLF is fine; a special token mid-text. */
    const char *in = "\"Hello world\"\n\n\"<|start_story|>x\\n\"\r\n\"\"";
    run_cli(in, strlen(in), 3, argv, &r);
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_STR(r.out, "[80,1288,139,410,555]\n[1,76,3]\n[]\n");
    /* A bad line: the lines before it are printed, then one error. */
    in = "\"a\"\n[1]\n\"b\"\n";
    run_cli(in, strlen(in), 3, argv, &r);
    CHECK_EQ_INT(r.rc, 1);
    CHECK_EQ_STR(r.out, "[85]\n");
    CHECK(strstr(r.err, "line 2") != NULL);
}

TEST(cli_errors) {
    cli_result r;
    char *none[] = {"--add-special"};
    run_cli("x", 1, 1, none, &r);
    CHECK_EQ_INT(r.rc, 2);
    CHECK(strstr(r.err, "--model") != NULL);
    char *bogus[] = {"--model", model("tinystories-656k"), "--frobnicate"};
    run_cli("x", 1, 3, bogus, &r);
    CHECK_EQ_INT(r.rc, 2);
    CHECK(strstr(r.err, "--frobnicate") != NULL);
    char *dangling[] = {"--model"};
    run_cli("x", 1, 1, dangling, &r);
    CHECK_EQ_INT(r.rc, 2);
    char *missing[] = {"--model", "/nonexistent/dir"};
    run_cli("x", 1, 2, missing, &r);
    CHECK_EQ_INT(r.rc, 1);
    CHECK(strstr(r.err, "/nonexistent/dir/tokenizer.json") != NULL);
    char *ok[] = {"--model", model("tinystories-656k")};
    run_cli("a\xFF", 2, 2, ok, &r);
    CHECK_EQ_INT(r.rc, 1);
    CHECK(strstr(r.err, "UTF-8") != NULL);
    CHECK_EQ_STR(r.out, "");
    char *help[] = {"--help"};
    run_cli("", 0, 1, help, &r);
    CHECK_EQ_INT(r.rc, 0);
    CHECK(strstr(r.out, "usage") != NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ns_tokcli_XXXXXX");
    if (!mkdtemp(g_dir)) {
        printf("not ok - mkdtemp\n");
        return 1;
    }
    RUN(cli_plain_and_special);
    RUN(cli_jsonl);
    RUN(cli_errors);
    char p[128];
    const char *names[] = {"in", "out", "err"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    TEST_MAIN_END;
}
