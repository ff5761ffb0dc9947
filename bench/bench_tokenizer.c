/* bench_tokenizer.c — tokenizer throughput on ~1 MB of mixed text.
 *
 * Usage: build/bench/bench_tokenizer MODELS_DIR [N]
 * Builds the same text every run (a fixed LCG picks fragments of English
 * prose, C/Python code, CJK, emoji, numbers), then for each of tiny-qwen3,
 * tiny-llama3 and tinystories-656k loads the tokenizer and encodes the text
 * N times (default 5), printing load time and median MB/s. Also times the
 * streaming detokenizer over the resulting ids. Times are CPU seconds of
 * this single-threaded process, i.e. one core's throughput.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"
#include "util/buf.h"

/* CPU time of this (single-threaded) process: the per-core throughput,
 * robust to other load on the machine. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint32_t lcg_state = 12345;
static uint32_t lcg(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return lcg_state >> 8;
}

static const char *const prose[] = {
    "The quick brown fox jumps over the lazy dog. ",
    "Once upon a time, there was a little girl named Lily who loved to play outside in the park. ",
    "In 1969, astronauts landed on the Moon; it was, by any measure, an extraordinary achievement. ",
    "\"Don't worry,\" she said, \"we'll figure it out — we always do.\" ",
    "Researchers measured a 12.5% increase in throughput after the change (p < 0.01).\n",
    "Naïve café owners in Zürich serve crème brûlée and smørrebrød. ",
    "¿Dónde está la biblioteca? Привет, как дела? Γειά σου κόσμε! ",
};
static const char *const code[] = {
    "def add(a, b):\n    return a + b\n\n",
    "for (size_t i = 0; i < n; i++) {\n\tsum += v[i] * w[i];\n}\n",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n",
    "$ git commit -am 'fix: handle EOF' && make -j8 test 2>&1 | tee log.txt\n",
    "<div class=\"row\"><a href=\"https://example.com/a?b=c&d=e\">link</a></div>\n",
    "    if (err != NULL) { return ns_fail(err, NS_ERR_IO, \"%s: %s\", path, strerror(errno)); }\n",
};
static const char *const cjk[] = {
    "你好，世界！今天天气很好。", "こんにちは世界、カタカナとひらがな。", "안녕하세요 세계 ",
    "机器学习模型需要大量的数据进行训练。", "東京都は日本の首都です。\n",
};
static const char *const emoji[] = {"👍🏽 ", "👨‍👩‍👧‍👦 ", "🇺🇸🇯🇵 ", "🙂🙃 ", "🚀✨🔥 "};

static char *make_text(size_t target, size_t *len) {
    ns_buf b;
    ns_buf_init(&b, 0);
    while (b.len < target) {
        uint32_t r = lcg() % 100;
        if (r < 45) ns_buf_puts(&b, prose[lcg() % (sizeof prose / sizeof *prose)]);
        else if (r < 70) ns_buf_puts(&b, code[lcg() % (sizeof code / sizeof *code)]);
        else if (r < 82) ns_buf_puts(&b, cjk[lcg() % (sizeof cjk / sizeof *cjk)]);
        else if (r < 90) ns_buf_puts(&b, emoji[lcg() % (sizeof emoji / sizeof *emoji)]);
        else ns_buf_printf(&b, "%u.%02u %u,%03u ", lcg() % 100000, lcg() % 100, lcg() % 1000, lcg() % 1000);
    }
    return ns_buf_take(&b, len);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODELS_DIR [N]\n", argv[0]);
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 100) reps = 5;
    size_t len;
    char *text = make_text(1 << 20, &len);
    if (!text) return 1;
    printf("text: %zu bytes, %d runs each\n", len, reps);
    static const char *const names[] = {"tiny-qwen3", "tiny-llama3", "tinystories-656k"};
    int rc = 0;
    for (size_t m = 0; m < sizeof names / sizeof *names; m++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", argv[1], names[m]);
        ns_tokenizer *t = NULL;
        ns_error err = {0};
        double t0 = now();
        if (ns_tokenizer_load(dir, &t, &err) != NS_OK) {
            fprintf(stderr, "%s: %s\n", names[m], err.msg);
            rc = 1;
            continue;
        }
        double load = now() - t0;
        double secs[100];
        size_t n_ids = 0;
        int32_t *ids = NULL;
        for (int r = 0; r < reps; r++) {
            free(ids);
            ids = NULL;
            double a = now();
            if (ns_tokenizer_encode(t, text, len, false, &ids, &n_ids, &err) != NS_OK) {
                fprintf(stderr, "%s: %s\n", names[m], err.msg);
                rc = 1;
                break;
            }
            secs[r] = now() - a;
        }
        if (rc == 0) {
            qsort(secs, (size_t)reps, sizeof *secs, cmp_double);
            double med = secs[reps / 2];
            /* Streaming detokenizer over the same ids. */
            ns_detok *d = NULL;
            ns_buf out;
            ns_buf_init(&out, 0);
            double a = now();
            if (ns_detok_create(t, false, &d) == NS_OK) {
                for (size_t i = 0; i < n_ids; i++) ns_detok_push(d, ids[i], &out);
                ns_detok_flush(d, &out);
            }
            double dt = now() - a;
            printf("%-18s load %6.3f s   encode median %7.3f s = %7.2f MB/s (%zu ids)   detok %6.2f MB/s\n",
                   names[m], load, med, (double)len / 1e6 / med, n_ids, (double)out.len / 1e6 / dt);
            ns_detok_free(d);
            ns_buf_free(&out);
        }
        free(ids);
        ns_tokenizer_free(t);
    }
    free(text);
    return rc;
}
