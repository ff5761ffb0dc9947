/* bench_prompt.h — seeded prompt text for `nightshift bench`.
 *
 * The bench drives servers it knows nothing about (this one, llama.cpp,
 * vLLM), so it cannot tokenize: a prompt of "about N tokens" is N common
 * English words, each preceded by a space — one token each in the BPE
 * vocabularies of current models (the actual count is what the server's
 * usage reports, and the report uses that). The text starts with a tag
 * made from the seed ("[run 3f2a...]"), so two seeds never share a
 * leading page: a "cold" prompt is never warm by accident, and blocks do
 * not warm each other.
 *
 * Ownership: the returned string is malloc'd; the caller frees it. */
#ifndef NS_BENCH_PROMPT_H
#define NS_BENCH_PROMPT_H

#include <stdint.h>

/* A prompt of about n_words words from seed; NULL on OOM or n_words
 * beyond NS_BENCH_PROMPT_MAX_WORDS. */
#define NS_BENCH_PROMPT_MAX_WORDS 1000000
char *ns_bench_prompt(uint64_t seed, int64_t n_words);
/* prefix + about n_words more words from seed (a turn that extends a
 * cached prompt); NULL on OOM. */
char *ns_bench_prompt_extend(const char *prefix, uint64_t seed, int64_t n_words);

#endif
