/* sample.h — token sampling: the reference semantics every backend matches.
 *
 * Pipeline per logits row (in this order, as Hugging Face's processors):
 *   0. a grammar mask (s->allow), when set: disallowed tokens get -Inf;
 *   1. penalties over the sequence's token history (prompt + generated,
 *      or the last penalty_last_n of them): repetition (HF: divide positive
 *      logits, multiply negative ones), then presence and frequency
 *      (OpenAI: logit -= presence*[count>0] + frequency*count);
 *   2. non-finite rows: a NaN anywhere, or no logit above -Inf, gives -1
 *      (no token: "this row's logits are not finite"; the caller fails the
 *      request); a +Inf logit wins outright (the lowest such id), at any
 *      temperature; -Inf logits are never drawn;
 *   3. temperature < NS_SAMPLE_MIN_TEMPERATURE (0 included) -> greedy
 *      argmax (lowest id wins ties), done;
 *   4. logits / temperature; top-k; softmax; top-p (smallest prefix of the
 *      sorted distribution whose mass >= p, at least one token); min-p
 *      (drop p < min_p * p_max); renormalize; draw with the sampler's RNG.
 * Reproducibility: the RNG is xoshiro256** seeded from `seed` through
 * splitmix64, and draws exactly one double per sampled token, so the same
 * seed, logits and params give the same tokens on every backend.
 * Ownership: a sampler owns its history/count arrays; ns_sampler_free
 * releases them. The struct is plain so a paused request can keep it.
 * Layering: depends on src/util only; the backends (sample op) and the
 * engine both build on it, so no backend needs an engine header.
 */
#ifndef NS_SAMPLE_H
#define NS_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "util/status.h"

/* Temperatures below this are greedy: 1/t would overflow (t < ~3e-39) or
 * scale logits past FLT_MAX, and at t = 1e-5 a logit gap of 0.0003 is
 * already e^-30 — sampling is argmax in all but name. */
#define NS_SAMPLE_MIN_TEMPERATURE 1e-5f

typedef struct ns_sampling_params {
    float temperature;        /* < NS_SAMPLE_MIN_TEMPERATURE: greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; must be > 0 */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int32_t penalty_last_n;   /* <= 0: whole history */
    uint64_t seed;
} ns_sampling_params;

/* Greedy, no penalties, seed 0. */
ns_sampling_params ns_sampling_default(void);
/* Checks ranges; fills err naming the offending parameter. */
ns_status ns_sampling_validate(const ns_sampling_params *p, ns_error *err);

typedef struct ns_sampler {
    ns_sampling_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    /* penalty state (allocated only when a penalty is on) */
    uint32_t *counts;    /* [n_vocab] occurrences inside the window */
    int32_t *ring;       /* [penalty_last_n] when windowed */
    int64_t n_seen;      /* tokens accepted so far */
    /* Grammar mask (structured output), borrowed for one step: bit t set
     * = token t may be drawn; every other logit becomes -Inf before
     * anything else (step 0 of the pipeline). NULL: no constraint. Set by
     * the engine right before sampling and cleared after; never owned. */
    const uint32_t *allow;
    /* scratch for sorting candidates (allocated lazily) */
    int32_t *scratch_ids;
    float *scratch_vals;
    uint32_t *scratch_sort; /* [2 * n_vocab]: radix sort buffers (ns_sample_order) */
} ns_sampler;

ns_status ns_sampler_init(ns_sampler *s, const ns_sampling_params *p, int32_t n_vocab, ns_error *err);
void ns_sampler_free(ns_sampler *s);
/* Records a token of the sequence (prompt tokens and each sampled token). */
void ns_sampler_accept(ns_sampler *s, int32_t token);
bool ns_sampler_has_penalties(const ns_sampler *s);
/* temperature < NS_SAMPLE_MIN_TEMPERATURE (or NaN) */
bool ns_sampler_is_greedy(const ns_sampler *s);
/* Sets every logit whose bit in allow is clear to -Inf (n bits). */
void ns_sample_apply_mask(float *logits, int32_t n, const uint32_t *allow);
/* Samples from logits (modified in place: penalties/temperature applied).
 * Returns a token id in [0, n_vocab), or -1 when the row has a NaN or no
 * logit above -Inf (see step 2 above; the RNG does not advance then).
 * Does NOT call accept; the engine accepts the token it keeps. */
int32_t ns_sampler_sample(ns_sampler *s, float *logits);

/* Deep copy (for pausing/forking); dst is overwritten. */
ns_status ns_sampler_copy(ns_sampler *dst, const ns_sampler *src);

/* Sorts ids[0..n) by v[id] descending, ties by ascending id — the
 * candidate order of step 4. Large n use a stable LSD radix sort on the
 * float bits (-0 counted as +0; v must hold no NaN) with keys (n words) and
 * sort (2n words) as scratch; small n, or NULL scratch, use qsort. Both
 * give the same order. */
void ns_sample_order(const float *v, int32_t *ids, int32_t n, uint32_t *keys, uint32_t *sort);

/* Log-softmax helpers on raw logits (model distribution, as OpenAI's
 * logprobs report it). */
double ns_logsumexp(const float *logits, int32_t n);
/* Writes the k most likely ids and their log-probs, descending. */
void ns_top_logprobs(const float *logits, int32_t n, int32_t k, int32_t *ids, float *logprobs);

#endif
