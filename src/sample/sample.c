#include "sample/sample.h"
#include "util/hash.h"
#include "util/vmath.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

ns_sampling_params ns_sampling_default(void) {
    ns_sampling_params p = {0};
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

ns_status ns_sampling_validate(const ns_sampling_params *p, ns_error *err) {
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return ns_fail(err, NS_ERR_INVALID, "temperature must be in [0, 100]");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return ns_fail(err, NS_ERR_INVALID, "top_p must be in (0, 1]");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return ns_fail(err, NS_ERR_INVALID, "min_p must be in [0, 1]");
    if (p->top_k < 0) return ns_fail(err, NS_ERR_INVALID, "top_k must be >= 0");
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 100.0f))
        return ns_fail(err, NS_ERR_INVALID, "repetition_penalty must be in (0, 100]");
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return ns_fail(err, NS_ERR_INVALID, "presence_penalty must be in [-2, 2]");
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return ns_fail(err, NS_ERR_INVALID, "frequency_penalty must be in [-2, 2]");
    if (p->penalty_last_n > (1 << 24)) return ns_fail(err, NS_ERR_INVALID, "penalty_last_n is too large");
    return NS_OK;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0); }

bool ns_sampler_has_penalties(const ns_sampler *s) {
    return s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f;
}

bool ns_sampler_is_greedy(const ns_sampler *s) { return !(s->p.temperature >= NS_SAMPLE_MIN_TEMPERATURE); }

ns_status ns_sampler_init(ns_sampler *s, const ns_sampling_params *p, int32_t n_vocab, ns_error *err) {
    memset(s, 0, sizeof *s);
    ns_status st = ns_sampling_validate(p, err);
    if (st != NS_OK) return st;
    if (n_vocab <= 0) return ns_fail(err, NS_ERR_INVALID, "sampler: empty vocabulary");
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = ns_splitmix64(&x);
    if (ns_sampler_has_penalties(s)) {
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        if (!s->counts) goto oom;
        if (p->penalty_last_n > 0) {
            s->ring = malloc((size_t)p->penalty_last_n * sizeof *s->ring);
            if (!s->ring) goto oom;
        }
    }
    return NS_OK;
oom:
    ns_sampler_free(s);
    return ns_fail(err, NS_ERR_NOMEM, "sampler: out of memory");
}

void ns_sampler_free(ns_sampler *s) {
    free(s->counts);
    free(s->ring);
    free(s->scratch_ids);
    free(s->scratch_vals);
    free(s->scratch_sort);
    s->counts = NULL;
    s->ring = NULL;
    s->scratch_ids = NULL;
    s->scratch_vals = NULL;
    s->scratch_sort = NULL;
}

ns_status ns_sampler_copy(ns_sampler *dst, const ns_sampler *src) {
    *dst = *src;
    dst->counts = NULL;
    dst->ring = NULL;
    dst->scratch_ids = NULL;
    dst->scratch_vals = NULL;
    dst->scratch_sort = NULL;
    if (src->counts) {
        dst->counts = malloc((size_t)src->n_vocab * sizeof *dst->counts);
        if (!dst->counts) goto oom;
        memcpy(dst->counts, src->counts, (size_t)src->n_vocab * sizeof *dst->counts);
    }
    if (src->ring) {
        dst->ring = malloc((size_t)src->p.penalty_last_n * sizeof *dst->ring);
        if (!dst->ring) goto oom;
        memcpy(dst->ring, src->ring, (size_t)src->p.penalty_last_n * sizeof *dst->ring);
    }
    return NS_OK;
oom:
    ns_sampler_free(dst);
    return NS_ERR_NOMEM;
}

void ns_sampler_accept(ns_sampler *s, int32_t token) {
    if (!s->counts || token < 0 || token >= s->n_vocab) {
        s->n_seen++;
        return;
    }
    if (s->ring) {
        int32_t n = s->p.penalty_last_n;
        int64_t slot = s->n_seen % n;
        if (s->n_seen >= n) {
            int32_t old = s->ring[slot];
            if (s->counts[old]) s->counts[old]--;
        }
        s->ring[slot] = token;
    }
    s->counts[token]++;
    s->n_seen++;
}

static void apply_penalties(const ns_sampler *s, float *logits) {
    const ns_sampling_params *p = &s->p;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        uint32_t c = s->counts[i];
        if (!c) continue;
        float l = logits[i];
        if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        l -= p->presence_penalty + p->frequency_penalty * (float)c;
        logits[i] = l;
    }
}

/* The row's usable argmax (largest value, lowest id among equals; +Inf
 * beats everything), or -1 when the row has a NaN or no value above -Inf:
 * then no token can be chosen sensibly. */
static int32_t checked_argmax(const float *x, int32_t n) {
    int32_t best = -1;
    float bv = -INFINITY;
    bool nan = false;
    for (int32_t i = 0; i < n; i++) {
        const float v = x[i];
        nan |= v != v;
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return nan ? -1 : best;
}

/* Candidates sorted by value descending, ties by id ascending, so the
 * result never depends on qsort's instability. qsort has no context
 * argument in C11; a thread-local pointer keeps this safe when several
 * threads sample at once. */
static _Thread_local const float *t_vals;
static int cmp_desc(const void *a, const void *b) {
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float va = t_vals[ia], vb = t_vals[ib];
    if (va > vb) return -1;
    if (va < vb) return 1;
    return (ia > ib) - (ia < ib);
}

/* Below this many candidates qsort is as fast as four radix passes. */
#define RADIX_MIN 4096

void ns_sample_order(const float *v, int32_t *ids, int32_t n, uint32_t *keys, uint32_t *sort) {
    if (n < RADIX_MIN || !keys || !sort) {
        t_vals = v;
        qsort(ids, (size_t)n, sizeof(int32_t), cmp_desc);
        return;
    }
    /* key: the float's bits made unsigned-ordered, then inverted so that
     * ascending keys are descending values; a stable sort of ids that
     * start ascending keeps equal values in ascending id order, as cmp_desc */
    for (int32_t i = 0; i < n; i++) {
        float f = v[ids[i]];
        uint32_t b;
        if (f == 0.0f) f = 0.0f; /* -0 == +0 for cmp_desc */
        memcpy(&b, &f, sizeof b);
        b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
        keys[i] = ~b;
    }
    uint32_t *k0 = keys, *k1 = sort;
    int32_t *i0 = ids, *i1 = (int32_t *)(void *)(sort + n);
    for (int shift = 0; shift < 32; shift += 8) {
        uint32_t cnt[257] = {0};
        for (int32_t i = 0; i < n; i++) cnt[((k0[i] >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++) cnt[b + 1] += cnt[b];
        for (int32_t i = 0; i < n; i++) {
            uint32_t d = cnt[(k0[i] >> shift) & 0xFF]++;
            k1[d] = k0[i];
            i1[d] = i0[i];
        }
        uint32_t *tk = k0;
        k0 = k1;
        k1 = tk;
        int32_t *ti = i0;
        i0 = i1;
        i1 = ti;
    }
    /* four passes: the data is back in keys/ids */
}

void ns_sample_apply_mask(float *logits, int32_t n, const uint32_t *allow) {
    for (int32_t w = 0; w * 32 < n; w++) {
        uint32_t bits = allow[w];
        if (bits == UINT32_MAX) continue;
        int32_t end = w * 32 + 32 < n ? w * 32 + 32 : n;
        for (int32_t i = w * 32; i < end; i++)
            if (!((bits >> (i & 31)) & 1u)) logits[i] = -INFINITY;
    }
}

int32_t ns_sampler_sample(ns_sampler *s, float *logits) {
    const int32_t n = s->n_vocab;
    if (s->allow) ns_sample_apply_mask(logits, n, s->allow);
    if (s->counts) apply_penalties(s, logits);
    /* Non-finite rows first: NaN anywhere, or nothing above -Inf, has no
     * answer (-1); a +Inf is a point mass on the first +Inf (its argmax). */
    const int32_t best = checked_argmax(logits, n);
    if (best < 0 || ns_sampler_is_greedy(s) || logits[best] == INFINITY) return best;

    if (!s->scratch_ids) {
        s->scratch_ids = malloc((size_t)n * sizeof *s->scratch_ids);
        s->scratch_vals = malloc((size_t)n * sizeof *s->scratch_vals);
        if (!s->scratch_ids || !s->scratch_vals) return best; /* degrade, never crash */
    }
    /* temperature >= NS_SAMPLE_MIN_TEMPERATURE: 1/t is finite */
    const float inv_t = 1.0f / s->p.temperature;
    for (int32_t i = 0; i < n; i++) logits[i] *= inv_t;

    /* Candidate set: all tokens, cut to top-k. To keep full sorts rare,
     * pre-filter tokens whose probability is below 1e-12 of the max
     * (exp(-27.6)): they can never be drawn in double precision anyway.
     * -Inf logits never pass it. A finite logit that 1/t scaled past
     * FLT_MAX dominates every other: that is the greedy token. */
    float mx = logits[best];
    if (!isfinite(mx)) return best;
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] >= mx - 27.6f) s->scratch_ids[nc++] = i;
    if (!s->scratch_sort && nc >= RADIX_MIN) s->scratch_sort = malloc((size_t)n * 2 * sizeof *s->scratch_sort);
    /* scratch_vals is free until the probabilities: it holds the keys */
    ns_sample_order(logits, s->scratch_ids, nc, (uint32_t *)(void *)s->scratch_vals, s->scratch_sort);
    if (s->p.top_k > 0 && s->p.top_k < nc) nc = s->p.top_k;

    double sum = 0;
    for (int32_t i = 0; i < nc; i++) {
        double e = exp((double)logits[s->scratch_ids[i]] - (double)mx);
        s->scratch_vals[i] = (float)e;
        sum += e;
    }
    for (int32_t i = 0; i < nc; i++) s->scratch_vals[i] = (float)(s->scratch_vals[i] / sum);
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        int32_t keep = nc;
        for (int32_t i = 0; i < nc; i++) {
            cum += s->scratch_vals[i];
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        nc = keep;
    }
    if (s->p.min_p > 0.0f) {
        float thr = s->p.min_p * s->scratch_vals[0];
        int32_t keep = 1;
        while (keep < nc && s->scratch_vals[keep] >= thr) keep++;
        nc = keep;
    }
    double tot = 0;
    for (int32_t i = 0; i < nc; i++) tot += s->scratch_vals[i];
    double r = rng_uniform(s->rng) * tot, acc = 0;
    for (int32_t i = 0; i < nc; i++) {
        acc += s->scratch_vals[i];
        if (r < acc) return s->scratch_ids[i];
    }
    return s->scratch_ids[nc - 1];
}

double ns_logsumexp(const float *logits, int32_t n) {
    float mx = -FLT_MAX;
    for (int32_t i = 0; i < n; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    int32_t i = 0;
#ifdef __AVX2__
    const __m256 vm = _mm256_set1_ps(mx);
    while (i + 8 <= n) {
        /* float partial sums over blocks of <= 1024, accumulated in double */
        __m256 acc = _mm256_setzero_ps();
        int32_t end = i + 1024 < n ? i + 1024 : n;
        for (; i + 8 <= end; i += 8) acc = _mm256_add_ps(acc, ns_exp8(_mm256_sub_ps(_mm256_loadu_ps(logits + i), vm)));
        float t[8];
        _mm256_storeu_ps(t, acc);
        for (int k = 0; k < 8; k++) sum += t[k];
    }
#endif
    for (; i < n; i++) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

void ns_top_logprobs(const float *logits, int32_t n, int32_t k, int32_t *ids, float *logprobs) {
    if (k > n) k = n;
    double lse = ns_logsumexp(logits, n);
    /* insertion into a k-sized descending list: k is small (<= 20..100) */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (m == k && v <= logits[ids[m - 1]]) continue;
        int32_t j = m < k ? m++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < v) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int32_t i = 0; i < m; i++) logprobs[i] = (float)(logits[ids[i]] - lse);
}
