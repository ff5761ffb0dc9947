/* bench_prompt.c — seeded prompt text (see bench_prompt.h). */
#include "bench/bench_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_stats.h"
#include "util/buf.h"

/* Common words that are single tokens (with their leading space) in the
 * Llama 3, Qwen 2/3 and Mistral vocabularies. */
static const char *const g_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his",
    "it", "an", "were", "are", "which", "this", "be", "or", "has", "had", "first", "one", "their", "its", "new",
    "after", "but", "who", "not", "they", "have", "her", "she", "two", "been", "other", "when", "there", "all",
    "during", "into", "school", "time", "may", "years", "more", "most", "only", "over", "city", "some", "world",
    "would", "where", "later", "up", "such", "used", "many", "can", "state", "about", "national", "out", "known",
    "university", "united", "then", "made", "also", "than", "part", "team", "second", "year", "between", "both",
    "under", "while", "day", "work", "game", "house", "water", "music", "system", "number", "family", "group",
    "book", "film", "line", "road", "river", "power", "light", "field", "party", "order", "place", "name", "war",
    "high", "small", "large", "early", "long", "best", "open", "form", "point", "home", "side", "end", "case",
    "page", "code", "data", "file", "test", "value", "list", "table", "model", "tree", "stone", "cloud", "green",
    "blue", "red", "black", "white", "north", "south", "east", "west", "river", "market", "story", "song", "paper",
};
#define N_WORDS (sizeof g_words / sizeof g_words[0])

static char *words(ns_buf *b, uint64_t seed, int64_t n_words) {
    if (n_words < 0 || n_words > NS_BENCH_PROMPT_MAX_WORDS) {
        ns_buf_free(b);
        return NULL;
    }
    ns_bench_rng r;
    ns_bench_rng_seed(&r, seed);
    for (int64_t i = 0; i < n_words; i++) {
        if (ns_buf_putc(b, ' ') != NS_OK || ns_buf_puts(b, g_words[ns_bench_rng_below(&r, N_WORDS)]) != NS_OK) {
            ns_buf_free(b);
            return NULL;
        }
        /* a sentence now and then, so the text is not one endless run */
        if (i % 17 == 16 && ns_buf_putc(b, '.') != NS_OK) {
            ns_buf_free(b);
            return NULL;
        }
    }
    return ns_buf_take(b, NULL);
}

char *ns_bench_prompt(uint64_t seed, int64_t n_words) {
    ns_buf b;
    ns_buf_init(&b, 0);
    if (ns_buf_printf(&b, "[run %016llx]", (unsigned long long)seed) != NS_OK) {
        ns_buf_free(&b);
        return NULL;
    }
    return words(&b, seed, n_words);
}

char *ns_bench_prompt_extend(const char *prefix, uint64_t seed, int64_t n_words) {
    ns_buf b;
    ns_buf_init(&b, 0);
    if (ns_buf_puts(&b, prefix) != NS_OK) {
        ns_buf_free(&b);
        return NULL;
    }
    return words(&b, seed, n_words);
}
