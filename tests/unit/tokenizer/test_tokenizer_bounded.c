/* test_tokenizer_bounded.c — the bounded encode (ns_tokenizer_encode_limit)
 * against the whole one, and the incremental pre-tokenizer against
 * ns_pretok_run:
 *  - below the limit the ids are identical, at every limit around the
 *    true count, for the three fixture tokenizers (NFC + Split/ByteLevel,
 *    Split/ByteLevel with ignore_merges, Metaspace with normalized added
 *    tokens) on random text with added tokens, combining marks, long runs;
 *  - past it: exceeded, no ids, and a count in (limit, true count];
 *  - the incremental first stage yields exactly ns_pretok_run's pieces for
 *    every Split behavior (inverted too), regex and literal patterns, and
 *    ByteLevel's regex;
 *  - a 20 MB text against a 40960-token limit is refused after a bounded
 *    prefix: peak RSS (VmHWM) grows by < 16 MiB, where the whole encode
 *    needed hundreds. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"

static ns_tokenizer *g_tok[3];
static const char *const g_names[3] = {"tiny-qwen3", "tiny-llama3", "tinystories-656k"};

static uint32_t g_seed = 12345;
static uint32_t rnd(void) {
    g_seed = g_seed * 1664525u + 1013904223u;
    return g_seed >> 8;
}

static ns_tokenizer *load_shared(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "models/%s", name);
    ns_tokenizer *t = NULL;
    ns_error err = {0};
    ns_status st = ns_tokenizer_load(test_shared_path(rel), &t, &err);
    CHECKF(st == NS_OK, "load %s: %s", name, err.msg);
    return t;
}

static const char *const k_parts[] = {
    "a", "Z", " ", "  ", "\n", "\t", "1", "23", "4567", "'s", "'LL", "\xC3\xA9", "e\xCC\x81", "\xC3\x9F", "\xCC\x81",
    "\xE4\xBD\xA0", "\xE5\xA5\xBD", "\xF0\x9F\x99\x82", "\xE2\x80\x8D", "\xC2\x85", "\xE1\xA0\x8E", "<|im_start|>",
    "<|im_end|>", "<|endoftext|>", "<think>", "<|eot_id|>", "<|begin_of_text|>", "<unk>", "<|start_story|>", ".",
    "!!", "\r\n", "\xC2\xA0", "\xE2\x96\x81", "\xC4\xA0", "hello", " world", "   x", "\n\n\n", "\xEF\xBC\xA1",
    "\xEF\xAC\x81", "\xE2\x84\xAB", "\xED\x95\x9C", "\xE1\x84\x80\xE1\x85\xA1", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "==============================", "--------------------------------------------------", "\xF0\x9F\x98\x80",
    "                                                              ", "def f(x):\n    return x\n",
};

static char *random_text(size_t max, size_t *len) {
    char *s = malloc(max + 64);
    size_t n = 0;
    size_t k = 1 + rnd() % 400;
    for (size_t i = 0; i < k; i++) {
        const char *p = k_parts[rnd() % (sizeof k_parts / sizeof *k_parts)];
        size_t pl = strlen(p);
        int rep = rnd() % 16 == 0 ? 1 + (int)(rnd() % 200) : 1; /* sometimes a long run */
        for (int r = 0; r < rep && n + pl <= max; r++) {
            memcpy(s + n, p, pl);
            n += pl;
        }
    }
    s[n] = 0;
    *len = n;
    return s;
}

static int check_limits(const ns_tokenizer *t, const char *s, size_t len, bool special) {
    int fails = 0;
    int32_t *full = NULL;
    size_t n = 0;
    ns_error err = {0};
    if (ns_tokenizer_encode(t, s, len, special, &full, &n, &err) != NS_OK) {
        printf("#   encode failed: %s\n", err.msg);
        return 1;
    }
    const size_t limits[] = {0, 1, 2, n / 3, n / 2, n ? n - 1 : 0, n, n + 1, n + 1000, SIZE_MAX};
    for (size_t k = 0; k < sizeof limits / sizeof *limits; k++) {
        const size_t lim = limits[k];
        int32_t *ids = NULL;
        size_t m = 0;
        bool over = false;
        if (ns_tokenizer_encode_limit(t, s, len, special, lim, &ids, &m, &over, &err) != NS_OK) {
            fails++;
            continue;
        }
        if (n <= lim) {
            if (over || m != n || !ids || (n && memcmp(ids, full, n * sizeof *ids) != 0)) {
                printf("#   limit %zu, %zu ids: over=%d m=%zu\n", lim, n, over, m);
                fails++;
            }
        } else if (!over || ids || m <= lim || m > n) {
            printf("#   limit %zu, %zu ids: over=%d m=%zu ids=%p\n", lim, n, over, m, (void *)ids);
            fails++;
        }
        free(ids);
    }
    /* without *exceeded, passing the limit is an error */
    if (n > 0) {
        int32_t *ids = NULL;
        size_t m = 0;
        if (ns_tokenizer_encode_limit(t, s, len, special, n - 1, &ids, &m, NULL, &err) != NS_ERR_RANGE || ids) fails++;
        free(ids);
    }
    free(full);
    return fails;
}

TEST(limit_matches_whole_encode) {
    for (int m = 0; m < 3; m++) {
        int fails = 0;
        for (int rep = 0; rep < 150; rep++) {
            size_t len;
            char *s = random_text(6000, &len);
            fails += check_limits(g_tok[m], s, len, rep & 1);
            free(s);
        }
        fails += check_limits(g_tok[m], "", 0, true);
        fails += check_limits(g_tok[m], "", 0, false);
        CHECKF(fails == 0, "%s: %d mismatches", g_names[m], fails);
    }
}

/* Long words: the lower bound refuses them before their merge, and never
 * refuses one that fits. */
TEST(limit_long_words) {
    const size_t sizes[] = {300, 5000, 100000};
    const char fill[] = {'a', '=', ' ', '7', '-'};
    for (int m = 0; m < 3; m++) {
        int fails = 0;
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            for (size_t f = 0; f < sizeof fill; f++) {
                char *s = malloc(sizes[i] + 1);
                memset(s, fill[f], sizes[i]);
                s[sizes[i]] = 0;
                fails += check_limits(g_tok[m], s, sizes[i], false);
                free(s);
            }
        CHECKF(fails == 0, "%s: %d mismatches", g_names[m], fails);
    }
}

/* ---- incremental pre-tokenizer ---- */

static void join_pieces(const ns_pieces *p, ns_buf *out) {
    ns_buf_reset(out);
    for (size_t i = 0; i < p->n; i++) {
        ns_buf_printf(out, "%s%d:", i ? "|" : "", p->v[i].first);
        ns_buf_append(out, p->text.data + p->v[i].off, p->v[i].len);
    }
}

static int compare_pretok(const char *json, const char *s, size_t n, bool first) {
    json_t *j = json_loads(json, 0, NULL);
    ns_pretok *p = NULL;
    ns_error err = {0};
    if (!j || ns_pretok_parse(j, &p, &err) != NS_OK) {
        printf("#   bad pre-tokenizer %s: %s\n", json, err.msg);
        json_decref(j);
        return 1;
    }
    json_decref(j);
    ns_rx_ctx rx = {0};
    ns_pieces whole = {0}, lazy = {0}, tmp = {0};
    ns_pieces_add(&whole, s, n, first);
    int fails = ns_pretok_run(p, &rx, &whole, &tmp, &err) != NS_OK;
    ns_pretok_iter it;
    ns_pretok_rest rest;
    if (!ns_pretok_iter_init(&it, p, s, n, first, &rest)) {
        printf("#   not incremental: %s\n", json);
        fails++;
    } else {
        /* first-stage pieces in batches of random size, the later stages
         * run on each batch (as the encoder does) */
        ns_pieces batch = {0};
        for (bool more = true; more;) {
            size_t a, b;
            bool f, found;
            if (ns_pretok_iter_next(&it, &rx, &a, &b, &f, &found, &err) != NS_OK) {
                fails++;
                break;
            }
            if (found) ns_pieces_add(&batch, s + a, b - a, f);
            more = found;
            if (!found || rnd() % 5 == 0) {
                if (ns_pretok_run_rest(p, &rx, &batch, &tmp, &err) != NS_OK) fails++;
                for (size_t i = 0; i < batch.n; i++)
                    ns_pieces_add(&lazy, batch.text.data + batch.v[i].off, batch.v[i].len, batch.v[i].first);
                ns_pieces_reset(&batch);
            }
        }
        ns_pieces_free(&batch);
    }
    ns_buf x, y;
    ns_buf_init(&x, 0);
    ns_buf_init(&y, 0);
    join_pieces(&whole, &x);
    join_pieces(&lazy, &y);
    if (x.len != y.len || (x.len && memcmp(x.data, y.data, x.len) != 0)) {
        printf("#   %s on \"%.60s\": whole %.120s / lazy %.120s\n", json, s, x.data ? x.data : "",
               y.data ? y.data : "");
        fails++;
    }
    ns_buf_free(&x);
    ns_buf_free(&y);
    ns_pieces_free(&whole);
    ns_pieces_free(&lazy);
    ns_pieces_free(&tmp);
    ns_rx_ctx_free(&rx);
    ns_pretok_free(p);
    return fails;
}

TEST(incremental_pretokenizer_equals_whole) {
    static const char *const behaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
    static const char *const patterns[] = {
        "{\"String\":\"-\"}", "{\"String\":\"==\"}", "{\"Regex\":\"\\\\s+\"}", "{\"Regex\":\"\\\\p{N}\"}",
        "{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}",
        "{\"Regex\":\"a*\"}", /* empty matches are skipped */
    };
    char json[1024];
    int fails = 0;
    for (int rep = 0; rep < 60; rep++) {
        size_t len;
        char *s = random_text(1500, &len);
        for (size_t b = 0; b < sizeof behaviors / sizeof *behaviors; b++)
            for (size_t p = 0; p < sizeof patterns / sizeof *patterns; p++)
                for (int inv = 0; inv < 2; inv++) {
                    snprintf(json, sizeof json, "{\"type\":\"Split\",\"pattern\":%s,\"behavior\":\"%s\",\"invert\":%s}",
                             patterns[p], behaviors[b], inv ? "true" : "false");
                    fails += compare_pretok(json, s, len, rep & 1);
                    snprintf(json, sizeof json,
                             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":%s,"
                             "\"behavior\":\"%s\",\"invert\":%s},{\"type\":\"ByteLevel\",\"add_prefix_space\":%s,"
                             "\"use_regex\":false}]}",
                             patterns[p], behaviors[b], inv ? "true" : "false", rep & 2 ? "true" : "false");
                    fails += compare_pretok(json, s, len, true);
                }
        fails += compare_pretok("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", s, len, true);
        fails += compare_pretok("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\","
                                "\"add_prefix_space\":false,\"use_regex\":true},{\"type\":\"Split\","
                                "\"pattern\":{\"String\":\"\xC4\xA0\"},\"behavior\":\"MergedWithNext\"}]}",
                                s, len, false);
        free(s);
    }
    CHECKF(fails == 0, "%d mismatches", fails);
}

/* ---- a huge text stays cheap ---- */

/* Resets VmHWM to the current RSS (Linux >= 4.0), so what the encode adds
 * shows even below an earlier peak (the tokenizers' load). */
static void reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

static long vm_hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

TEST(huge_text_bounded_memory) {
    const size_t n = (size_t)20 << 20;
    char *hello = malloc(n + 1), *run = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        hello[i] = "hello world "[i % 12];
        run[i] = 'a';
    }
    hello[n] = run[n] = 0;
    const char *texts[] = {hello, run};
    for (int m = 0; m < 3; m++)
        for (int k = 0; k < 2; k++) {
            reset_hwm();
            long before = vm_hwm_kb();
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int32_t *ids = NULL;
            size_t got = 0;
            bool over = false;
            ns_error err = {0};
            ns_status st = ns_tokenizer_encode_limit(g_tok[m], texts[k], n, true, 40960, &ids, &got, &over, &err);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long grew = vm_hwm_kb() - before;
            double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            printf("# %s, %s: more than 40960 ids after %.3f s, peak RSS +%ld KiB\n", g_names[m],
                   k ? "20 MB of 'a'" : "20 MB of 'hello world '", s, grew);
            CHECKF(st == NS_OK && over && !ids && got > 40960, "%s %d: %s", g_names[m], k, err.msg);
            CHECKF(grew < 16 * 1024, "%s %d: peak RSS grew by %ld KiB", g_names[m], k, grew);
            free(ids);
        }
    free(hello);
    free(run);
}

int main(void) {
    for (int m = 0; m < 3; m++)
        if (!(g_tok[m] = load_shared(g_names[m]))) {
            printf("not ok - load %s\n", g_names[m]);
            return 1;
        }
    RUN(limit_matches_whole_encode);
    RUN(limit_long_words);
    RUN(incremental_pretokenizer_equals_whole);
    RUN(huge_text_bounded_memory);
    for (int m = 0; m < 3; m++) ns_tokenizer_free(g_tok[m]);
    TEST_MAIN_END;
}
