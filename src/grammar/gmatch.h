/* gmatch.h — the token-level matcher: which tokens a grammar allows next,
 * as a bitmask over the vocabulary, and advancing on the sampled token.
 *
 * ns_grammar is a compiled grammar (its NFA, gnfa.h) bound to a vocabulary
 * (gvocab.h), plus a lazily built deterministic automaton over it that
 * every matcher of the grammar shares: a DFA state is a set of pushdown
 * configurations (stacks of NFA states, hash-consed so equal stacks are
 * one id); its byte transitions and its token mask are computed on first
 * use and cached. Masks come from one depth-first walk of the vocabulary
 * trie through the cached transitions, skipping every subtree the grammar
 * rejects, and deciding string subtrees whole where every character leads
 * to one same next state (see run_len in gmatch.c); a later visit of the
 * same state costs a copy.
 *
 * ns_gmatch is one generation's position in the grammar. The end-of-
 * sequence tokens are allowed exactly where the grammar may end; once it
 * can only end, nothing else is allowed. Configuration stacks deeper than
 * NS_GMATCH_MAX_DEPTH are dropped (a value nested deeper cannot be
 * generated), which also makes left recursion terminate.
 *
 * Caps: the shared automaton's memory is capped (NS_GMATCH_MAX_BYTES per
 * grammar); when a step would pass it, the cache is emptied and rebuilt
 * from the live matchers' states. A configuration set larger than
 * NS_GMATCH_MAX_SET fails the step (NS_ERR_FULL) rather than growing.
 *
 * Threads: every call locks the grammar; matchers of one grammar may be
 * used from different threads. A matcher itself is used by one thread at
 * a time. The mask buffer of a matcher is owned by it and valid until its
 * next ns_gmatch_accept / ns_gmatch_free.
 */
#ifndef NS_GRAMMAR_GMATCH_H
#define NS_GRAMMAR_GMATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/gnfa.h"
#include "grammar/gvocab.h"
#include "util/status.h"

#define NS_GMATCH_MAX_DEPTH 96
#define NS_GMATCH_MAX_SET 4096
/* 32 MB holds ~1600 cached masks of a 151k vocabulary, far more than a
 * schema's answers visit; with the 32 grammars api/structured.c caches
 * the shared automata stay below ~1 GB even for hostile schemas. */
#define NS_GMATCH_MAX_BYTES ((size_t)32 << 20)

typedef struct ns_grammar ns_grammar;
typedef struct ns_gmatch ns_gmatch;

/* Takes over nfa (its contents are moved; nfa is left empty) and borrows
 * v, which must outlive the grammar. One reference is returned. */
ns_status ns_grammar_new(ns_gnfa *nfa, const ns_gvocab *v, ns_grammar **out, ns_error *err);
void ns_grammar_retain(ns_grammar *g);
void ns_grammar_release(ns_grammar *g);
const ns_gvocab *ns_grammar_vocab(const ns_grammar *g);
/* Statistics of the shared automaton (tests, the benchmark). */
typedef struct ns_grammar_stats {
    uint32_t stacks, sets, masks;
    size_t bytes;
    uint64_t mask_hits, mask_misses, resets;
} ns_grammar_stats;
void ns_grammar_get_stats(ns_grammar *g, ns_grammar_stats *out);
/* Overrides the memory cap of the shared automaton (default
 * NS_GMATCH_MAX_BYTES); tests use a small one to exercise resets. */
void ns_grammar_set_memory_cap(ns_grammar *g, size_t bytes);

/* A matcher at the grammar's start (holds a reference to g). */
ns_status ns_gmatch_new(ns_grammar *g, ns_gmatch **out, ns_error *err);
void ns_gmatch_free(ns_gmatch *m);
/* The matcher's grammar (borrowed). */
ns_grammar *ns_gmatch_grammar(const ns_gmatch *m);
/* Computes the mask of allowed tokens for the current state into the
 * matcher's buffer (a cached mask is copied). NS_ERR_NOMEM / NS_ERR_FULL. */
ns_status ns_gmatch_fill_mask(ns_gmatch *m, ns_error *err);
/* The mask for the current state (n_words words, bit t = token t is
 * allowed), or NULL when ns_gmatch_fill_mask has not run since the last
 * accept. */
const uint32_t *ns_gmatch_mask(const ns_gmatch *m);
/* Advances on a token. NS_ERR_INVALID when the grammar does not allow it
 * (the state is unchanged). An end-of-sequence token is allowed only where
 * the grammar may end; afterwards the matcher is done. */
ns_status ns_gmatch_accept(ns_gmatch *m, int32_t token, ns_error *err);
/* Advances on raw bytes (tests): false (state unchanged) if rejected. */
bool ns_gmatch_accept_bytes(ns_gmatch *m, const char *bytes, size_t len);
/* Whether the bytes would be accepted from the current state (the state
 * is unchanged). A failure inside the automaton counts as not accepted. */
bool ns_gmatch_would_accept_bytes(ns_gmatch *m, const char *bytes, size_t len);
/* The grammar may end here (an end-of-sequence token would be allowed). */
bool ns_gmatch_can_end(ns_gmatch *m);
/* An end-of-sequence token was accepted. */
bool ns_gmatch_done(const ns_gmatch *m);
/* Resets to the start (tests). */
void ns_gmatch_reset(ns_gmatch *m);

#endif
