#include "cli/cli_tokenize.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_common.h"
#include "tokenizer/tokenizer.h"
#include "util/buf.h"

static void usage(FILE *f) {
    fprintf(f, "usage: nightshift tokenize --model DIR [--add-special] [--jsonl] < text\n"
               "  Reads all of stdin and prints its token ids as one JSON array on one line.\n"
               "  Example:\n"
               "    echo 'Hello world' | nightshift tokenize --model DIR\n"
               "  --model DIR     model directory holding tokenizer.json (required)\n"
               "  --add-special   add BOS/EOS as the model's post-processor does (default: off)\n"
               "  --jsonl         one JSON string per input line, one ids array per output line (default:\n"
               "                  off, stdin is one text); blank input lines are skipped\n");
}

/* Encodes text and appends "[id,id,...]\n" to out. */
static int emit_ids(const ns_tokenizer *tok, const char *text, size_t len, bool add_special, ns_buf *out,
                    const char *where) {
    int32_t *ids = NULL;
    size_t n = 0;
    ns_error err = {0};
    if (ns_tokenizer_encode(tok, text, len, add_special, &ids, &n, &err) != NS_OK) {
        fprintf(stderr, "nightshift tokenize: %s%s\n", where, err.msg);
        return 1;
    }
    ns_status st = ns_buf_putc(out, '[');
    for (size_t i = 0; i < n && st == NS_OK; i++) st = ns_buf_printf(out, i ? ",%d" : "%d", ids[i]);
    if (st == NS_OK) st = ns_buf_puts(out, "]\n");
    free(ids);
    if (st != NS_OK) {
        fprintf(stderr, "nightshift tokenize: out of memory\n");
        return 1;
    }
    return 0;
}

static int flush_out(ns_buf *out) {
    if (out->len && fwrite(out->data, 1, out->len, stdout) != out->len) {
        fprintf(stderr, "nightshift tokenize: cannot write to stdout\n");
        return 1;
    }
    ns_buf_reset(out);
    return 0;
}

int ns_cli_tokenize(int argc, char **argv) {
    const char *model = NULL;
    bool add_special = false, jsonl = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--add-special")) add_special = true;
        else if (!strcmp(a, "--jsonl")) jsonl = true;
        else if (ns_cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            model = ns_cli_flag_value(argc, argv, &i);
            if (!model) return ns_cli_usage_error("tokenize", usage, "--model needs a value");
        } else if (!strncmp(a, "--model=", 8)) {
            model = a + 8;
        } else {
            return ns_cli_usage_error("tokenize", usage, "unknown option %s", a);
        }
    }
    if (!model || !*model) return ns_cli_usage_error("tokenize", usage, "--model DIR is required");

    int rc = 1;
    ns_tokenizer *tok = NULL;
    ns_buf in, out;
    ns_buf_init(&in, 0);
    ns_buf_init(&out, 0);
    ns_error err = {0};
    if (ns_tokenizer_load(model, &tok, &err) != NS_OK) {
        fprintf(stderr, "nightshift tokenize: %s\n", err.msg);
        goto done;
    }
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (ns_buf_append(&in, chunk, got) != NS_OK) {
            fprintf(stderr, "nightshift tokenize: input too large\n");
            goto done;
        }
    }
    if (ferror(stdin)) {
        fprintf(stderr, "nightshift tokenize: cannot read stdin\n");
        goto done;
    }
    const char *text = in.data ? in.data : "";
    if (!jsonl) {
        if (emit_ids(tok, text, in.len, add_special, &out, "") || flush_out(&out)) goto done;
    } else {
        size_t line_no = 0;
        for (size_t pos = 0; pos < in.len;) {
            const char *nl = memchr(text + pos, '\n', in.len - pos);
            size_t end = nl ? (size_t)(nl - text) : in.len;
            const char *line = text + pos;
            size_t ll = end - pos;
            pos = end + 1;
            line_no++;
            size_t k = 0;
            while (k < ll && strchr(" \t\r", line[k])) k++;
            if (k == ll) continue; /* blank line */
            json_error_t je;
            json_t *j = json_loadb(line, ll, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!json_is_string(j)) {
                fprintf(stderr, "nightshift tokenize: stdin line %zu: %s\n", line_no,
                        j ? "not a JSON string" : je.text);
                json_decref(j);
                goto done;
            }
            char where[64];
            snprintf(where, sizeof where, "stdin line %zu: ", line_no);
            int r = emit_ids(tok, json_string_value(j), json_string_length(j), add_special, &out, where);
            json_decref(j);
            if (r || (out.len > (1u << 20) && flush_out(&out))) goto done;
        }
        if (flush_out(&out)) goto done;
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "nightshift tokenize: cannot write to stdout\n");
        goto done;
    }
    rc = 0;
done:
    if (out.len) flush_out(&out); /* --jsonl: lines before an error still count */
    ns_buf_free(&in);
    ns_buf_free(&out);
    ns_tokenizer_free(tok);
    return rc;
}
