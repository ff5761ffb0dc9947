/* sched.c — the engine thread: admission, step planning (continuous
 * batching), prefix-cache reuse (restore vs recompute) and commit,
 * sampling, and events. KV state is reached only through kv_cache.h.
 *
 * Memory safety by arithmetic: a sequence is admitted only when the pages
 * it can ever need (prompt + max_tokens, minus the device pages it shares)
 * fit in what the pool can give after every running sequence's own
 * promise. So a running sequence never finds the pool empty, and nothing
 * admitted is ever aborted for lack of memory. (Pausing, which relaxes
 * this promise, is a later issue.) */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_cache.h"
#include "grammar/gmatch.h"
#include "sched/sched_grammar.h"
#include "sched/sched_internal.h"
#include "sched/sched_status.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/vec.h"

struct ns_sched {
    ns_engine *e;
    ns_sched_opts opts;
    int32_t P;
    int32_t n_pages;
    ns_kv_cache *kv;

    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* guards incoming, stop, stats */
    pthread_cond_t cv;
    ns_seq *in_head, *in_tail;
    int32_t n_incoming;
    bool stop;
    /* flush tickets: HTTP threads take one, the engine serves them all
     * by handing every pending page to the SSD tier */
    uint64_t flush_asked, flush_served;
    pthread_cond_t flush_cv;
    uint64_t flush_served_engine; /* engine thread's copy of flush_served */
    int32_t persist_per_step;     /* SSD write-behind pages per busy step */

    /* engine thread only */
    ns_seq **waiting;
    int32_t n_waiting, cap_waiting;
    ns_seq **running;
    int32_t n_running;
    int64_t reserved; /* sum of running requests' reserve_pages */
    uint64_t admit_counter; /* admission order of new sequences */
    bool warned_nonfinite;
    /* seconds per unit of step work, learned from measured steps (EMA);
     * work = tokens + attention pairs / pairs_per_unit */
    double sec_per_unit;
    double pairs_per_unit; /* attention pairs costing one token's other work */
    /* the same, from large steps only (>= BULK_STEP_TOKENS new tokens):
     * small steps are dominated by fixed costs (weights read once per
     * step), so their rate overstates what a long prefill costs per token
     * and would make recomputing look dearer than it is */
    double sec_per_unit_bulk;
    /* step seconds = fixed + marginal * units, fitted over recent steps
     * (least squares with exponential forgetting): the marginal rate says
     * what more prefill tokens cost in a step that also decodes (a decode
     * step on a GPU is mostly fixed cost: using its average per-unit cost
     * shrank prefill chunks to 16 tokens and a warm turn took 1.8 s) */
    double fit_w, fit_sx, fit_sy, fit_sxx, fit_sxy;
    /* step scratch */
    int32_t *b_tokens, *b_pos, *b_seq_start, *b_seq_len, *b_pt, *b_rows, *b_chunk;
    ns_seq **b_seqs;
    ns_seq **plan_q;     /* this step's sequences and their token counts */
    ns_seq **plan_order; /* the same, oldest admitted first */
    int32_t *plan_chunk;
    int32_t *acq_pages;
    ns_sampler **b_samplers;
    int32_t *b_sampled;
    float *host_logits;
    /* structured output (sched_grammar.h): each sampled row's request,
     * rows whose mask failed, the grammar requests to precompute */
    ns_sched_grammar *grammar;
    ns_request **b_reqs, **b_greqs;
    bool *b_gfail;

    ns_sched_stats stats;
    ns_sched_status *status; /* GET /v1/status snapshot (sched_status.h) */
};

static void hist_init(ns_histogram *h, double first, double factor) {
    memset(h, 0, sizeof *h);
    double b = first;
    for (int i = 0; i < NS_HIST_BUCKETS - 1; i++, b *= factor) h->bounds[i] = b;
    h->bounds[NS_HIST_BUCKETS - 1] = INFINITY;
}

static void hist_add(ns_histogram *h, double v) {
    for (int i = 0; i < NS_HIST_BUCKETS; i++)
        if (v <= h->bounds[i]) {
            h->counts[i]++;
            break;
        }
    h->sum += v;
    h->count++;
}

static int32_t pages_for(const ns_sched *s, int64_t tokens) { return (int32_t)((tokens + s->P - 1) / s->P); }

/* Tokens one request can use at most: pool and context. */
static int64_t pool_tokens(const ns_sched *s) { return (int64_t)s->n_pages * s->P; }

/* Attention pairs that cost one token's non-attention work (see
 * work_units): 2 x layer weights per token / 4 x heads x head_dim per pair. */
static double pairs_per_unit_of(const ns_model_config *c) {
    const double h = c->hidden_size, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    const double layer_params = h * (qd + 2 * kvd) + qd * h + 3 * h * (double)c->intermediate_size;
    const double pair_flops = 4.0 * qd;
    double r = pair_flops > 0 ? 2 * layer_params / pair_flops : 256;
    return r < 16 ? 16 : r;
}

/* Frees an engine-owned sequence and drops the engine's reference on its
 * request. Its pages must have been released. */
static void seq_free(ns_seq *q) {
    if (!q) return;
    free(q->saved_page);
    ns_sampler_free(&q->sampler);
    free(q->tokens);
    free(q->pages);
    ns_request_release(q->req);
    free(q);
}

ns_status ns_sched_create(ns_engine *e, const ns_sched_opts *opts, ns_sched **out, ns_error *err) {
    *out = NULL;
    ns_sched *s = calloc(1, sizeof *s);
    if (!s) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    s->e = e;
    s->opts = *opts;
    if (s->opts.max_batch_tokens <= 0 || s->opts.max_batch_tokens > e->opts.max_batch_tokens)
        s->opts.max_batch_tokens = e->opts.max_batch_tokens;
    if (s->opts.max_running <= 0 || s->opts.max_running > e->opts.max_logits) s->opts.max_running = e->opts.max_logits;
    if (s->opts.prefill_chunk <= 0 || s->opts.prefill_chunk > s->opts.max_batch_tokens)
        s->opts.prefill_chunk = s->opts.max_batch_tokens;
    if (s->opts.aging_seconds <= 0) s->opts.aging_seconds = 2.0;
    if (s->opts.target_step_ms <= 0) s->opts.target_step_ms = 50.0;
    s->P = e->opts.page_tokens;
    s->n_pages = e->opts.n_pages;
    s->pairs_per_unit = pairs_per_unit_of(&e->model->cfg);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->flush_cv, NULL);
    ns_kv_cache_opts ko = {
        .be = e->be,
        .seed = ns_prefix_seed(e->model->fingerprint, e->opts.kv_dtype, s->P),
        .ram_bytes = opts->ram_cache_bytes,
        .ssd_dir = opts->ssd_dir,
        .ssd_bytes = opts->ssd_bytes,
    };
    ns_status rc = ns_kv_cache_create(&ko, &s->kv, err);
    if (rc != NS_OK) goto fail;
    {
        /* ~64 MiB of page reads per busy step at most */
        size_t pb = e->be->kv.page_size_bytes ? e->be->kv.page_size_bytes : 1;
        size_t n = (64u << 20) / pb;
        s->persist_per_step = n < 4 ? 4 : n > 4096 ? 4096 : (int32_t)n;
    }
    const size_t T = (size_t)s->opts.max_batch_tokens, R = (size_t)s->opts.max_running;
    s->b_tokens = malloc(T * sizeof(int32_t));
    s->b_pos = malloc(T * sizeof(int32_t));
    s->b_seq_start = malloc((R + 1) * sizeof(int32_t));
    s->b_seq_len = malloc(R * sizeof(int32_t));
    s->b_rows = malloc(R * sizeof(int32_t));
    s->b_chunk = malloc(R * sizeof(int32_t));
    s->b_seqs = malloc(R * sizeof(ns_seq *));
    s->plan_q = malloc(R * sizeof(ns_seq *));
    s->plan_order = malloc(R * sizeof(ns_seq *));
    s->plan_chunk = malloc(R * sizeof(int32_t));
    s->acq_pages = malloc((size_t)s->n_pages * sizeof(int32_t));
    s->b_samplers = malloc(R * sizeof(ns_sampler *));
    s->b_sampled = malloc(R * sizeof(int32_t));
    s->b_reqs = malloc(R * sizeof(ns_request *));
    s->b_greqs = malloc(R * sizeof(ns_request *));
    s->b_gfail = calloc(R, sizeof(bool));
    s->grammar = ns_sched_grammar_new((int32_t)R);
    s->running = malloc(R * sizeof(ns_seq *));
    s->host_logits = malloc(R * (size_t)e->model->cfg.vocab_size * sizeof(float));
    if (!s->b_tokens || !s->b_pos || !s->b_seq_start || !s->b_seq_len || !s->b_rows || !s->b_chunk || !s->b_seqs || !s->plan_q || !s->plan_order || !s->plan_chunk ||
        !s->acq_pages || !s->b_samplers || !s->b_sampled || !s->running || !s->host_logits || !s->b_reqs ||
        !s->b_greqs || !s->b_gfail || !s->grammar) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->status = ns_sched_status_new();
    if (!s->status) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    hist_init(&s->stats.step_seconds, 0.0005, 2.0);
    hist_init(&s->stats.batch_tokens, 1, 2.0);
    hist_init(&s->stats.ttft_seconds, 0.005, 2.0);
    hist_init(&s->stats.itl_seconds, 0.001, 2.0);
    s->stats.pages_total = s->n_pages;
    s->stats.pages_free = s->n_pages;
    ns_kv_cache_get_stats(s->kv, &s->stats.kv);
    s->stats.page_tokens = s->P;
    s->stats.kv_dtype = (int32_t)e->opts.kv_dtype;
    s->stats.kv_bytes_per_token = (int64_t)((ns_engine_page_bytes(&e->model->cfg, s->P, e->opts.kv_dtype) + (size_t)s->P - 1) /
                                            (size_t)s->P);
    *out = s;
    return NS_OK;
fail:
    ns_sched_free(s);
    return rc;
}

void ns_sched_free(ns_sched *s) {
    if (!s) return;
    ns_sched_stop(s);
    /* sequences never picked up by the engine thread */
    for (ns_seq *q = s->in_head, *n; q; q = n) {
        n = q->next;
        ns_request_finish(q->req, NS_FINISH_CANCELLED, "server shutting down");
        seq_free(q);
    }
    ns_kv_cache_free(s->kv);
    ns_sched_status_free(s->status);
    free(s->waiting);
    free(s->running);
    free(s->b_tokens);
    free(s->b_pos);
    free(s->b_seq_start);
    free(s->b_seq_len);
    free(s->b_pt);
    free(s->b_rows);
    free(s->b_chunk);
    free(s->b_seqs);
    free(s->plan_q);
    free(s->plan_order);
    free(s->plan_chunk);
    free(s->acq_pages);
    free(s->b_samplers);
    free(s->b_sampled);
    free(s->host_logits);
    ns_sched_grammar_free(s->grammar); /* joins its worker: after the engine thread stopped */
    free(s->b_reqs);
    free(s->b_greqs);
    free(s->b_gfail);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->flush_cv);
    free(s);
}

ns_status ns_sched_submit(ns_sched *s, ns_request *r, ns_capacity *cap, ns_error *err) {
    const ns_model_config *c = &s->e->model->cfg;
    const int64_t ctx = c->max_position_embeddings, pool = pool_tokens(s);
    int64_t limit = ctx < pool ? ctx : pool;
    if (cap) {
        cap->prompt_tokens = r->n_prompt;
        cap->max_tokens = r->params.max_tokens;
        cap->pool_tokens = pool;
        cap->context_tokens = ctx;
    }
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
            return ns_fail(err, NS_ERR_INVALID, "prompt token %d is outside the vocabulary (%d)", r->prompt[i],
                           c->vocab_size);
    if (r->params.grammar && ns_grammar_vocab(ns_gmatch_grammar(r->params.grammar))->n_vocab != c->vocab_size)
        return ns_fail(err, NS_ERR_INVALID, "the request's grammar was built for another vocabulary");
    if (r->n_prompt >= ctx)
        return ns_fail(err, NS_ERR_RANGE, "the prompt has %d tokens; the model's context is %lld tokens", r->n_prompt,
                       (long long)ctx);
    if (r->n_prompt >= limit) {
        pthread_mutex_lock(&s->mu);
        s->stats.requests_rejected++;
        pthread_mutex_unlock(&s->mu);
        return ns_fail(err, NS_ERR_RANGE,
                       "the prompt has %d tokens but this server's KV pool holds at most %lld tokens for one "
                       "request (the model's context is %lld)",
                       r->n_prompt, (long long)pool, (long long)ctx);
    }
    /* max_tokens beyond what fits is clamped, never an error: the request
     * ends with finish LENGTH there (agents send 8000 or 64000 blindly) */
    if (r->params.max_tokens <= 0 || r->params.max_tokens > limit - r->n_prompt)
        r->params.max_tokens = (int32_t)(limit - r->n_prompt);
    if (cap) cap->max_tokens = r->params.max_tokens;
    ns_seq *q = calloc(1, sizeof *q);
    if (!q) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    ns_status rc = ns_sampler_init(&q->sampler, &r->params.sampling, c->vocab_size, err);
    if (rc != NS_OK) {
        free(q);
        return rc;
    }
    q->t_submit = q->t_served = ns_clock_now();
    q->req = r;
    atomic_fetch_add(&r->refs, 1); /* the engine's reference, held by q */
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        seq_free(q);
        return ns_fail(err, NS_ERR_CANCELLED, "the server is shutting down");
    }
    if (s->in_tail) s->in_tail->next = q;
    else s->in_head = q;
    s->in_tail = q;
    s->n_incoming++;
    s->stats.requests_total++;
    s->stats.requests_waiting++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NS_OK;
}

ns_status ns_sched_flush(ns_sched *s, int timeout_ms, ns_kv_ssd_flush_result *out, ns_error *err) {
    memset(out, 0, sizeof *out);
    if (!ns_kv_cache_tier_on(s->kv, NS_TIER_SSD))
        return ns_fail(err, NS_ERR_UNSUPPORTED, "the SSD cache tier is off (--no-ssd-cache, or it failed to open)");
    const double deadline = ns_clock_now() + timeout_ms / 1000.0;
    pthread_mutex_lock(&s->mu);
    uint64_t ticket = ++s->flush_asked;
    pthread_cond_signal(&s->cv);
    while (s->flush_served < ticket && !s->stop) {
        struct timespec ts = ns_clock_deadline(CLOCK_REALTIME, 50);
        pthread_cond_timedwait(&s->flush_cv, &s->mu, &ts);
        if (ns_clock_now() > deadline) break;
    }
    bool served = s->flush_served >= ticket;
    pthread_mutex_unlock(&s->mu);
    if (!served) {
        ns_kv_ssd_flush_result partial;
        ns_kv_cache_ssd_flush(s->kv, 0, &partial, NULL);
        *out = partial;
        out->pending += 1; /* at least one page never reached the tier */
        return ns_fail(err, NS_ERR_CANCELLED, "flush timed out before every committed page reached the SSD tier");
    }
    int left = (int)((deadline - ns_clock_now()) * 1000.0);
    return ns_kv_cache_ssd_flush(s->kv, left > 0 ? left : 0, out, err);
}

/* ------------------------------------------------------------ engine side */

static void release_pages(ns_sched *s, ns_seq *q) {
    /* The last, partially filled page stays indexed as a partial
     * continuation, so a prompt that extends this sequence copies it
     * instead of recomputing it. */
    int32_t n_fill = 0;
    if (q->n_pages > 0 && q->n_committed == q->n_pages - 1) n_fill = q->n_ctx - q->n_committed * s->P;
    ns_kv_cache_release(s->kv, q->pages, q->n_pages, q->last_hash,
                        q->tokens + (size_t)q->n_committed * (size_t)s->P, n_fill > 0 ? n_fill : 0);
    q->n_pages = 0;
    s->reserved -= q->reserve_pages;
    q->reserve_pages = 0;
}

static void finish(ns_sched *s, ns_seq *q, ns_finish why, const char *msg) {
    release_pages(s, q);
    q->state = RS_DONE;
    pthread_mutex_lock(&q->req->mu);
    q->req->result.n_generated = q->n_generated;
    pthread_mutex_unlock(&q->req->mu);
    ns_request_finish(q->req, why, msg);
    pthread_mutex_lock(&s->mu);
    if (why == NS_FINISH_CANCELLED) s->stats.requests_cancelled++;
    pthread_mutex_unlock(&s->mu);
    seq_free(q);
}

static void remove_running(ns_sched *s, int32_t i) {
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

static void remove_running_seq(ns_sched *s, ns_seq *q) {
    for (int32_t j = 0; j < s->n_running; j++)
        if (s->running[j] == q) {
            remove_running(s, j);
            return;
        }
}

/* A step's cost grows with its tokens (weights are read once per step,
 * matmuls scale with tokens) and with attention pairs (each new token
 * attends to its whole context). One unit = one token's non-attention
 * work; an attention pair costs 1/pairs_per_unit of it, the ratio of their
 * FLOPs from the model's shape (2 x layer weights per token vs 4 x layers
 * x heads x head_dim per pair: ~240 for tiny-qwen3, ~23k for an 8B), so
 * the one learned scale predicts a 30k-token prefill from short steps. */
static double work_units(const ns_sched *s, int64_t tokens, double attn_pairs) {
    return (double)tokens + attn_pairs / s->pairs_per_unit;
}

#define BULK_STEP_TOKENS 128

static void cost_fit_add(ns_sched *s, double units, double seconds) {
    const double k = 0.98; /* ~50 steps of memory */
    s->fit_w = k * s->fit_w + 1;
    s->fit_sx = k * s->fit_sx + units;
    s->fit_sy = k * s->fit_sy + seconds;
    s->fit_sxx = k * s->fit_sxx + units * units;
    s->fit_sxy = k * s->fit_sxy + units * seconds;
}

/* The fitted step model; false until steps of different sizes were seen. */
static bool cost_fit_get(const ns_sched *s, double *fixed, double *marginal) {
    const double den = s->fit_w * s->fit_sxx - s->fit_sx * s->fit_sx;
    if (s->fit_w < 4 || !(den > 1e-9 * s->fit_w * s->fit_sxx)) return false;
    double b = (s->fit_w * s->fit_sxy - s->fit_sx * s->fit_sy) / den;
    double a = (s->fit_sy - b * s->fit_sx) / s->fit_w;
    if (!(b > 0)) return false;
    *fixed = a > 0 ? a : 0;
    *marginal = b;
    return true;
}

/* Marginal seconds per unit of work: the fit, else the large-step average,
 * else the plain average. 0 before any step. */
static double marginal_rate(const ns_sched *s) {
    double a, b;
    if (cost_fit_get(s, &a, &b)) return b;
    return s->sec_per_unit_bulk > 0 ? s->sec_per_unit_bulk : s->sec_per_unit;
}

/* Predicted seconds to prefill tokens [from, n) of a prompt. */
static double recompute_seconds(const ns_sched *s, int64_t from, int64_t n) {
    int64_t t = n - from;
    /* one rate for every length, so the estimate has no step in it that
     * the planner could "win" by dropping cached pages */
    double fixed = 0, rate = 0;
    if (!cost_fit_get(s, &fixed, &rate)) rate = marginal_rate(s), fixed = 0;
    const double steps = (double)t / (double)s->opts.max_batch_tokens; /* continuous: no jump to "win" */
    return rate * work_units(s, t, (double)t * ((double)from + t / 2.0)) + fixed * steps;
}

/* Restore vs recompute: how many of the matched pages to reuse. Device
 * pages cost nothing; a page in RAM or on SSD costs its measured
 * transfer time; what is not reused is prefilled at the measured rate.
 * Picks the prefix length with the least predicted time (all of it
 * until a step has been measured). */
static int32_t plan_reuse(const ns_sched *s, const ns_kv_lookup *lk, int32_t n_prompt, double *t_restore,
                          double *t_recompute) {
    const int32_t n_full = lk->m.n_full;
    double restore = 0;
    for (int32_t i = 0; i < n_full; i++) restore += ns_kv_cache_restore_seconds(s->kv, (ns_kv_tier)lk->tier[i]);
    *t_restore = restore;
    *t_recompute = s->sec_per_unit > 0 ? recompute_seconds(s, 0, n_prompt) : 0;
    if (s->sec_per_unit <= 0 || n_full == 0) return n_full;
    /* the leading device pages cost nothing to reuse: always kept */
    int32_t k0 = 0;
    while (k0 < n_full && lk->tier[k0] == NS_TIER_DEVICE) k0++;
    int32_t best = k0;
    double best_restore = 0, best_cost = recompute_seconds(s, (int64_t)k0 * s->P, n_prompt);
    restore = 0;
    for (int32_t k = k0 + 1; k <= n_full; k++) {
        restore += ns_kv_cache_restore_seconds(s->kv, (ns_kv_tier)lk->tier[k - 1]);
        double cost = restore + recompute_seconds(s, (int64_t)k * s->P, n_prompt);
        if (cost <= best_cost) {
            best_cost = cost;
            best = k;
            best_restore = restore;
        }
    }
    *t_restore = best_restore;
    return best;
}

/* The engine thread logs a request's lines under its label (the API id),
 * so they line up with the HTTP thread's. */
static void log_as(const ns_seq *q) {
    if (q->req->label[0]) ns_log_set_context("%s", q->req->label);
    else ns_log_set_context("request %llu", (unsigned long long)q->admit_order);
}

static void log_admission(ns_sched *s, ns_seq *q, const ns_kv_lookup *lk, int32_t n_use, int32_t cached,
                          const int32_t tok_by_tier[NS_TIER_COUNT], double t_restore, double t_recompute) {
    if (ns_log_get_level() > NS_LOG_INFO) return;
    const ns_request *r = q->req;
    const ns_prefix_match *m = &lk->m;
    char line[1024];
    int o = snprintf(line, sizeof line, "request %llu: prompt %d tokens, reused %d (", (unsigned long long)q->admit_order,
                     r->n_prompt, cached);
    bool first = true;
    for (int t = 0; t < NS_TIER_COUNT && o > 0 && (size_t)o < sizeof line; t++) {
        if (!tok_by_tier[t] && !(t == 0 && first && cached == 0)) continue;
        o += snprintf(line + o, sizeof line - (size_t)o, "%s%d %s", first ? "" : ", ", tok_by_tier[t],
                      ns_kv_tier_name((ns_kv_tier)t));
        first = false;
    }
    if (o > 0 && (size_t)o < sizeof line)
        o += snprintf(line + o, sizeof line - (size_t)o, "), prefill %d", r->n_prompt - cached);
    if (n_use < m->n_full && o > 0 && (size_t)o < sizeof line)
        o += snprintf(line + o, sizeof line - (size_t)o,
                      "; recomputing %d cached tokens: restore %.3f s > recompute %.3f s",
                      (m->n_full - n_use) * s->P, t_restore, t_recompute);
    /* Where the prompt diverged: the token index always; the text around
     * it only at DEBUG or with --log-prompts (opts.log_prompts), since
     * prompt text at the default level would put secrets in the log. */
    if (m->diverge_at >= 0 && o > 0 && (size_t)o < sizeof line && !s->opts.log_prompts &&
        ns_log_get_level() > NS_LOG_DEBUG) {
        snprintf(line + o, sizeof line - (size_t)o, "; diverged from the cache at token %d", m->diverge_at);
    } else if (m->diverge_at >= 0 && o > 0 && (size_t)o < sizeof line) {
        char before[160] = "", after[160] = "", cached_txt[160] = "";
        if (s->opts.describe) {
            int32_t a = m->diverge_at > 12 ? m->diverge_at - 12 : 0;
            int32_t b = m->diverge_at + 12 < r->n_prompt ? m->diverge_at + 12 : r->n_prompt;
            s->opts.describe(s->opts.describe_ctx, r->prompt + a, m->diverge_at - a, before, sizeof before);
            s->opts.describe(s->opts.describe_ctx, r->prompt + m->diverge_at, b - m->diverge_at, after, sizeof after);
            s->opts.describe(s->opts.describe_ctx, m->diverge_cached, m->n_diverge_cached, cached_txt,
                             sizeof cached_txt);
        }
        snprintf(line + o, sizeof line - (size_t)o, "; diverged from the cache at token %d: ...%s[prompt: %s | cached: %s]",
                 m->diverge_at, before, after, cached_txt);
    }
    log_as(q);
    NS_INFO("%s", line);
    ns_log_clear_context();
}

/* A cache break for the dashboard's ring (sched_status.h): positions only. */
static void note_break(ns_sched *s, const ns_seq *q, int32_t diverge_at, int32_t cached,
                       const int32_t tok_by_tier[NS_TIER_COUNT]) {
    ns_status_break b = {.n_prompt = q->req->n_prompt, .diverge_at = diverge_at, .n_cached = cached};
    if (q->req->label[0]) snprintf(b.id, sizeof b.id, "%s", q->req->label);
    else snprintf(b.id, sizeof b.id, "request %llu", (unsigned long long)q->admit_order);
    for (int t = 0; t < NS_TIER_COUNT; t++) b.cached_by_tier[t] = tok_by_tier[t];
    ns_sched_status_break(s->status, &b);
}

ns_sched_status *ns_sched_status_of(ns_sched *s) { return s->status; }

/* Publishes q's queue state to its channel (the stream's keep-alives
 * say "paused" / the queue position). */
static void set_waiting(ns_seq *q, bool waiting, int32_t pos) {
    pthread_mutex_lock(&q->req->mu);
    q->req->waiting = waiting;
    q->req->paused = waiting && q->state == RS_PAUSED;
    q->req->queue_pos = pos;
    pthread_mutex_unlock(&q->req->mu);
}

/* A prompt that shares more than a page beyond what is cached with a
 * sequence still prefilling that very part waits for its pages to be
 * committed instead of computing them a second time. */
static bool prefix_in_flight(const ns_sched *s, const int32_t *toks, int32_t n, int32_t cached) {
    for (int32_t i = 0; i < s->n_running; i++) {
        const ns_seq *p = s->running[i];
        if (p->state != RS_PREFILLING || p->n_ctx >= p->n_tokens) continue;
        int32_t m = n < p->n_tokens ? n : p->n_tokens, lcp = 0;
        while (lcp < m && toks[lcp] == p->tokens[lcp]) lcp++;
        if (lcp >= cached + s->P && p->n_ctx < lcp) return true;
    }
    return false;
}

/* Tries to admit q now (a new request, or a paused sequence resuming).
 * Returns true when admitted (it joins running). Pages: under the PAUSE
 * policy q reserves what its prefill needs now (uncached prompt + one
 * token); decode pages are taken as it goes, and when the pool runs dry
 * the newest sequence is paused (plan_pages). Under RESERVE it reserves
 * prompt + max_tokens. A resuming sequence also needs room for every
 * running sequence's next page (the thrash guard: it must not be paused
 * again at once). */
static bool try_admit(ns_sched *s, ns_seq *q) {
    ns_request *r = q->req;
    const bool resume = q->primed;
    const int32_t *toks = resume ? q->tokens : r->prompt;
    const int32_t n = resume ? q->n_tokens : r->n_prompt;
    ns_kv_lookup lk;
    /* keep >= 1 token to compute: its logits give the next token */
    ns_kv_cache_lookup(s->kv, toks, n, n - 1, &lk);
    double t_restore = 0, t_recompute = 0;
    const int32_t n_use = plan_reuse(s, &lk, n, &t_restore, &t_recompute);
    if (!resume && prefix_in_flight(s, toks, n, n_use * s->P)) return false;
    int32_t dev_shared = 0;
    for (int32_t i = 0; i < n_use; i++) dev_shared += lk.tier[i] == NS_TIER_DEVICE;
    const int32_t worst = pages_for(s, (int64_t)r->n_prompt + r->params.max_tokens);
    int32_t total = s->opts.pause_policy == NS_PAUSE_POLICY_RESERVE ? worst : pages_for(s, (int64_t)n + 1);
    if (total > worst) total = worst;
    const int32_t need = total - dev_shared;
    const int32_t guard = resume ? s->n_running + 1 : 0;
    int64_t avail = (int64_t)ns_kv_cache_available(s->kv) - ns_kv_cache_lookup_reclaimable(s->kv, &lk, n_use) -
                    s->reserved;
    if (need + guard > avail) return false;
    if (NS_VEC_GROW(q->pages, q->cap_pages, (size_t)worst, 0) != NS_OK ||
        NS_VEC_GROW(q->tokens, q->cap_tokens, (size_t)r->n_prompt + (size_t)r->params.max_tokens + 1, 0) != NS_OK)
        return false; /* retried next step; OOM here is transient or fatal either way */
    int32_t by_tier[NS_TIER_COUNT];
    const int32_t got = ns_kv_cache_acquire(s->kv, &lk, n_use, q->pages, by_tier, &q->ready_fence);
    q->n_pages = got;
    q->n_committed = got;
    q->last_hash = got > 0 ? ns_kv_cache_lookup_hash(s->kv, &lk, got) : ns_kv_cache_seed(s->kv);
    q->reserve_pages = total > got ? total - got : 0;
    s->reserved += q->reserve_pages;
    if (!resume) {
        memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        q->n_tokens = r->n_prompt;
    }
    int32_t cached = got * s->P;
    int32_t tok_by_tier[NS_TIER_COUNT];
    for (int t = 0; t < NS_TIER_COUNT; t++) tok_by_tier[t] = by_tier[t] * s->P;
    if (resume && q->saved_page && got * s->P == q->saved_base && q->n_pages < worst) {
        /* the paused sequence's own last page, byte for byte */
        int32_t dst = ns_kv_cache_alloc(s->kv);
        ns_error err = {0};
        if (dst >= 0 && ns_kv_cache_page_write(s->kv, dst, q->saved_page, &err) == NS_OK) {
            q->pages[q->n_pages++] = dst;
            if (q->reserve_pages > 0) {
                q->reserve_pages--;
                s->reserved--;
            }
            cached += q->saved_fill;
            tok_by_tier[NS_TIER_DEVICE] += q->saved_fill;
        } else if (dst >= 0) {
            ns_kv_cache_release(s->kv, &dst, 1, 0, NULL, 0);
        }
    } else if (got == lk.m.n_full && lk.m.n_partial > 0) {
        int32_t dst = ns_kv_cache_copy_partial(s->kv, lk.m.partial_node, lk.m.n_partial);
        if (dst >= 0) {
            q->pages[q->n_pages++] = dst;
            if (q->reserve_pages > 0) {
                q->reserve_pages--;
                s->reserved--;
            }
            cached += lk.m.n_partial;
            tok_by_tier[NS_TIER_DEVICE] += lk.m.n_partial;
        }
    }
    q->n_ctx = cached;
    ns_kv_cache_count_hits(s->kv, tok_by_tier);
    if (!resume) {
        for (int32_t i = 0; i < r->n_prompt; i++) ns_sampler_accept(&q->sampler, r->prompt[i]);
        q->primed = true;
        q->admit_order = ++s->admit_counter;
        pthread_mutex_lock(&r->mu);
        r->result.n_cached = cached;
        for (int t = 0; t < NS_TIER_COUNT; t++) r->result.n_cached_by_tier[t] = tok_by_tier[t];
        r->result.diverge_at = lk.m.diverge_at;
        r->result.admitted = true;
        pthread_mutex_unlock(&r->mu);
        pthread_mutex_lock(&s->mu);
        s->stats.prefix_lookup_tokens_total += (uint64_t)r->n_prompt;
        s->stats.prefix_hit_tokens_total += (uint64_t)cached;
        s->stats.prompt_tokens_total += (uint64_t)r->n_prompt;
        pthread_mutex_unlock(&s->mu);
        log_admission(s, q, &lk, n_use, cached, tok_by_tier, t_restore, t_recompute);
        if (lk.m.diverge_at >= 0) note_break(s, q, lk.m.diverge_at, cached, tok_by_tier);
    } else {
        pthread_mutex_lock(&s->mu);
        s->stats.resumes_total++;
        pthread_mutex_unlock(&s->mu);
        log_as(q);
        NS_INFO("request %llu resumed after pause %d: %d of %d tokens restored (%d device, %d ram, %d ssd), "
                "%d recomputed",
                (unsigned long long)q->admit_order, q->n_pauses, cached, n, tok_by_tier[NS_TIER_DEVICE],
                tok_by_tier[NS_TIER_RAM], tok_by_tier[NS_TIER_SSD], n - cached);
        ns_log_clear_context();
    }
    free(q->saved_page);
    q->saved_page = NULL;
    q->state = RS_PREFILLING;
    set_waiting(q, false, 0);
    s->running[s->n_running++] = q;
    return true;
}

/* Inserts q into the waiting list in arrival order (a paused sequence
 * goes back ahead of everything that came after it: FIFO resume). */
static bool enqueue_waiting(ns_sched *s, ns_seq *q) {
    if (s->n_waiting == s->cap_waiting) {
        int32_t nc = s->cap_waiting ? s->cap_waiting * 2 : 64;
        ns_seq **p = realloc(s->waiting, (size_t)nc * sizeof *p);
        if (!p) return false;
        s->waiting = p;
        s->cap_waiting = nc;
    }
    int32_t at = s->n_waiting;
    while (at > 0 && s->waiting[at - 1]->t_submit > q->t_submit) at--;
    memmove(&s->waiting[at + 1], &s->waiting[at], (size_t)(s->n_waiting - at) * sizeof *s->waiting);
    s->waiting[at] = q;
    s->n_waiting++;
    return true;
}

/* Pauses a running sequence: its KV goes back to the cache (full pages
 * stay indexed and are demoted, not dropped, when the pool needs them;
 * the partial last page is kept as a copy-on-write continuation), and its
 * sampler/RNG, tokens and budget stay in q. It resumes through try_admit,
 * re-prefilling only what the tiers no longer hold. */
static void pause_seq(ns_sched *s, ns_seq *q, const char *why) {
    remove_running_seq(s, q);
    const int32_t held = q->n_pages;
    /* keep the partial last page's bytes: recomputing it would not give
     * the same bits (other kernels, other batch), so the resumed output
     * could differ from an uninterrupted run */
    const int32_t fill = q->n_ctx - q->n_committed * s->P;
    free(q->saved_page);
    q->saved_page = NULL;
    if (fill > 0 && q->n_pages == q->n_committed + 1) {
        ns_error err = {0};
        q->saved_page = malloc(ns_kv_cache_page_bytes(s->kv));
        if (q->saved_page &&
            ns_kv_cache_page_read(s->kv, q->pages[q->n_committed], q->saved_page, &err) == NS_OK) {
            q->saved_base = q->n_committed * s->P;
            q->saved_fill = fill;
        } else {
            free(q->saved_page);
            q->saved_page = NULL;
        }
    }
    release_pages(s, q);
    q->n_ctx = 0;
    q->n_committed = 0;
    q->last_hash = ns_kv_cache_seed(s->kv);
    q->state = RS_PAUSED;
    q->n_pauses++;
    if (!enqueue_waiting(s, q)) {
        /* cannot queue it: end it rather than lose it silently */
        finish(s, q, NS_FINISH_ERROR, "out of memory pausing the request");
        return;
    }
    set_waiting(q, true, 0);
    pthread_mutex_lock(&s->mu);
    s->stats.pauses_total++;
    pthread_mutex_unlock(&s->mu);
    log_as(q);
    NS_INFO("request %llu paused (%s) after %d generated tokens; %d pages back to the cache tiers",
            (unsigned long long)q->admit_order, why, q->n_generated, held);
    ns_log_clear_context();
}

static void admit(ns_sched *s) {
    const double t = ns_clock_now();
    int32_t kept = 0;
    bool blocked = false;
    for (int32_t i = 0; i < s->n_waiting; i++) {
        ns_seq *q = s->waiting[i];
        if (atomic_load(&q->req->cancel)) {
            q->state = RS_DONE;
            ns_request_finish(q->req, NS_FINISH_CANCELLED, NULL);
            pthread_mutex_lock(&s->mu);
            s->stats.requests_cancelled++;
            pthread_mutex_unlock(&s->mu);
            seq_free(q);
            continue;
        }
        if (!blocked && s->n_running < s->opts.max_running && try_admit(s, q)) continue;
        /* FIFO with aging: once the oldest waiter has waited long enough
         * (a paused sequence always has), nobody behind it may take the
         * pages it is waiting for. */
        if (q->state == RS_PAUSED || t - q->t_submit > s->opts.aging_seconds) blocked = true;
        s->waiting[kept++] = q;
        set_waiting(q, true, kept);
    }
    s->n_waiting = kept;
}

static void take_incoming(ns_sched *s) {
    pthread_mutex_lock(&s->mu);
    ns_seq *q = s->in_head;
    s->in_head = s->in_tail = NULL;
    s->n_incoming = 0;
    pthread_mutex_unlock(&s->mu);
    for (ns_seq *n; q; q = n) {
        n = q->next;
        q->next = NULL;
        q->state = RS_WAITING;
        if (!enqueue_waiting(s, q)) {
            ns_request_finish(q->req, NS_FINISH_ERROR, "out of memory queueing the request");
            seq_free(q);
            continue;
        }
        set_waiting(q, true, s->n_waiting);
    }
}

static void commit_full_pages(ns_sched *s, ns_seq *q) {
    while ((q->n_committed + 1) * s->P <= q->n_ctx) {
        const int32_t *t = q->tokens + (size_t)q->n_committed * (size_t)s->P;
        uint64_t h = ns_prefix_hash(q->last_hash, t, s->P);
        ns_kv_cache_commit(s->kv, q->last_hash, h, t, q->pages[q->n_committed]);
        q->last_hash = h;
        q->n_committed++;
    }
}
/* Largest prefill chunk (<= want) for a sequence at context ctx such that
 * the step stays within the latency target, given work already planned.
 * Only applies while some stream decodes: alone, prefill takes the whole
 * budget (throughput wins when nobody waits for tokens). */
static int32_t bounded_chunk(const ns_sched *s, int32_t want, int32_t ctx, double planned_units, double target_s) {
    double fixed = 0, rate = 0;
    if (!cost_fit_get(s, &fixed, &rate)) rate = marginal_rate(s), fixed = 0;
    if (rate <= 0) return want;
    double budget_units = (target_s - fixed) / rate - planned_units;
    int32_t c = want;
    while (c > 16 && work_units(s, c, (double)c * ((double)ctx + c / 2.0)) > budget_units) c /= 2;
    return c;
}

/* Prefill order: fewest remaining prompt tokens first; every second a
 * sequence went without a prefill chunk counts as AGING_TOKENS_PER_S fewer
 * tokens, so a long prompt is never starved by a stream of short ones
 * (but a long prompt that is being served does not age into a block). */
#define AGING_TOKENS_PER_S 2048.0

static double prefill_key(const ns_seq *q, double now) {
    return (double)(q->n_tokens - q->n_ctx) - (now - q->t_served) * AGING_TOKENS_PER_S;
}

static void sort_prefill(ns_seq **v, int32_t n, double now) {
    for (int32_t i = 1; i < n; i++) { /* insertion sort: n <= max_running */
        ns_seq *x = v[i];
        double kx = prefill_key(x, now);
        int32_t j = i;
        while (j > 0 && prefill_key(v[j - 1], now) > kx) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

/* The running sequence admitted last (the pause victim). */
static ns_seq *newest_running(const ns_sched *s) {
    ns_seq *v = NULL;
    for (int32_t i = 0; i < s->n_running; i++)
        if (!v || s->running[i]->admit_order > v->admit_order) v = s->running[i];
    return v;
}

/* Drops q from the step's plan (it was paused). */
static void unplan(ns_sched *s, int32_t *n_plan, ns_seq *q) {
    for (int32_t k = 0; k < *n_plan; k++)
        if (s->plan_q[k] == q) {
            memmove(&s->plan_q[k], &s->plan_q[k + 1], (size_t)(*n_plan - k - 1) * sizeof *s->plan_q);
            memmove(&s->plan_chunk[k], &s->plan_chunk[k + 1], (size_t)(*n_plan - k - 1) * sizeof *s->plan_chunk);
            (*n_plan)--;
            return;
        }
}

/* Gives every planned sequence the pages its chunk needs, oldest admitted
 * first. A sequence takes from its own reservation first, then from what
 * no one has reserved; when neither has a page, the newest running
 * sequence is paused (its reservation and pages come back) and the
 * allocation retried. The newest is always processed last, so a pause
 * never hits a sequence already given its pages this step; the oldest
 * always fits (a prompt that cannot fit alone was refused at submit). */
static void plan_pages(ns_sched *s, int32_t *n_plan) {
    ns_seq **order = s->plan_order;
    int32_t n = 0;
    for (int32_t k = 0; k < *n_plan; k++) order[n++] = s->plan_q[k];
    for (int32_t i = 1; i < n; i++) {
        ns_seq *x = order[i];
        int32_t j = i;
        while (j > 0 && order[j - 1]->admit_order > x->admit_order) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = x;
    }
    for (int32_t i = 0; i < n; i++) {
        ns_seq *q = order[i];
        if (q->state == RS_PAUSED) continue; /* paused for an older one */
        int32_t chunk = 0;
        for (int32_t k = 0; k < *n_plan; k++)
            if (s->plan_q[k] == q) chunk = s->plan_chunk[k];
        const int32_t need = pages_for(s, q->n_ctx + chunk);
        while (q->n_pages < need) {
            const bool own = q->reserve_pages > 0;
            int32_t pg = -1;
            if (own || ns_kv_cache_available(s->kv) - s->reserved > 0) pg = ns_kv_cache_alloc(s->kv);
            if (pg >= 0) {
                q->pages[q->n_pages++] = pg;
                if (own) {
                    q->reserve_pages--;
                    s->reserved--;
                }
                continue;
            }
            ns_seq *v = newest_running(s);
            if (!v) break;
            if (s->opts.pause_policy == NS_PAUSE_POLICY_RESERVE)
                NS_ERROR("scheduler: KV pool exhausted under the reserve policy (accounting bug); pausing");
            unplan(s, n_plan, v);
            pause_seq(s, v, "KV pool full");
            if (v == q) break;
        }
    }
}

/* Plans and runs one step. Returns false when there was nothing to do. */
/* Advances q's grammar on its sampled token. False (q finished with an
 * error) when its mask could not be computed this step (failed: the token
 * was drawn unmasked) or the grammar refuses the token; neither happens
 * to a token drawn under a mask unless the automaton ran out of memory. */
static bool grammar_accept(ns_sched *s, ns_seq *q, int32_t tok, bool failed, const char *msg) {
    ns_error gerr = {0};
    if (!failed && ns_gmatch_accept(q->req->params.grammar, tok, &gerr) == NS_OK) return true;
    const char *m = failed ? msg : gerr.msg;
    NS_WARN("request %llu: %s", (unsigned long long)q->admit_order, m);
    remove_running_seq(s, q);
    finish(s, q, NS_FINISH_ERROR, m);
    return false;
}

/* The first part of a step: plans each running sequence's tokens for this step into
 * s->plan_q / s->plan_chunk and returns how many are planned: decode
 * tokens first (they bound every stream's inter-token latency), then
 * prefill chunks, shortest remaining prompt first with aging, so a short
 * prompt never waits behind a long prefill. *n_unready counts the
 * sequences left out because their promoted pages are still being copied
 * in. */
static int32_t plan_step(ns_sched *s, int32_t *n_unready_out) {
    int32_t budget = s->opts.max_batch_tokens, np = 0;
    double planned_pairs = 0;
    int32_t planned_tokens = 0;
    bool decoding = false;
    for (int32_t i = 0; i < s->n_running; i++) decoding |= s->running[i]->state == RS_DECODING;
    for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
        ns_seq *q = s->running[i];
        if (q->state != RS_DECODING) continue;
        s->plan_q[np] = q;
        s->plan_chunk[np++] = 1;
        budget--;
        planned_tokens++;
        planned_pairs += (double)q->n_ctx + 0.5;
    }
    const int32_t n_dec = np;
    /* a sequence whose promoted pages are still being copied in waits:
     * the step does not wait for a promotion it does not need */
    int32_t n_unready = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        ns_seq *q = s->running[i];
        if (q->state != RS_PREFILLING) continue;
        if (q->ready_fence && !ns_kv_cache_ready(s->kv, q->ready_fence) && s->n_running > 1) {
            n_unready++;
            continue;
        }
        if (q->ready_fence) ns_kv_cache_compute_after(s->kv, q->ready_fence); /* alone: the device waits */
        q->ready_fence = 0;
        s->plan_q[np++] = q;
    }
    sort_prefill(s->plan_q + n_dec, np - n_dec, ns_clock_now());
    /* The latency target of a step that decodes grows with the prompts
     * waiting for their first token (+50% for each, at most x4): eight
     * agents' warm turns arriving together otherwise trickle through one
     * 50 ms step each while the first ones' streams decode (H200, 8B, 30k
     * context: warm-turn TTFT median 0.71 s at a fixed 50 ms target). */
    const int32_t n_pre = np - n_dec;
    double grow = 1.0 + 0.5 * (double)(n_pre > 0 ? n_pre - 1 : 0);
    if (grow > 4.0) grow = 4.0;
    const double target_s = s->opts.target_step_ms * 1e-3 * grow;
    int32_t n_plan = n_dec;
    for (int32_t i = n_dec; i < np && budget > 0; i++) {
        ns_seq *q = s->plan_q[i];
        int32_t chunk = q->n_tokens - q->n_ctx;
        if (chunk > s->opts.prefill_chunk) chunk = s->opts.prefill_chunk;
        if (chunk > budget) chunk = budget;
        if (decoding)
            chunk = bounded_chunk(s, chunk, q->n_ctx, work_units(s, planned_tokens, planned_pairs), target_s);
        if (chunk <= 0) continue;
        q->t_served = ns_clock_now();
        s->plan_q[n_plan] = q;
        s->plan_chunk[n_plan++] = chunk;
        budget -= chunk;
        planned_tokens += chunk;
        planned_pairs += (double)chunk * ((double)q->n_ctx + chunk / 2.0);
    }
    *n_unready_out = n_unready;
    return n_plan;
}

/* After the forward pass: hands the token sampled for q's logit row (row: its
 * logits on the host, when logprobs were asked for) to its request:
 * refuses an invalid token (non-finite logits) or one its grammar rejects
 * (gfail, gmsg), else records it, pushes the event and ends, pauses or
 * continues the sequence. t1: when the step's forward ended; *generated
 * counts the tokens delivered. True when q goes on under a grammar, whose
 * next mask is to be computed. */
static bool take_token(ns_sched *s, ns_seq *q, int32_t tok, const float *row, bool gfail, const char *gmsg, double t1,
                       uint64_t *generated) {
    const ns_model_config *c = &s->e->model->cfg;
    ns_request *r = q->req;
    if (tok < 0 || tok >= c->vocab_size) {
        /* the sampler saw NaN (or no finite) logits for this row: this
         * request ends with a clear error, the batch's others go on */
        if (!s->warned_nonfinite) {
            NS_WARN("request %llu: the model produced non-finite logits; the request fails with "
                    "model_output_invalid (logged once)",
                    (unsigned long long)q->admit_order);
            s->warned_nonfinite = true;
        }
        remove_running_seq(s, q);
        finish(s, q, NS_FINISH_ERROR, "model_output_invalid: the model produced non-finite logits");
        return false;
    }
    if (r->params.grammar && !grammar_accept(s, q, tok, gfail, gmsg)) return false;
    ns_token_event ev = {.token = tok};
    if (r->params.logprobs || r->params.top_logprobs > 0) {
        ev.logprob = (float)(row[tok] - ns_logsumexp(row, c->vocab_size));
        if (r->params.top_logprobs > 0) {
            ev.n_top = r->params.top_logprobs;
            ns_top_logprobs(row, c->vocab_size, ev.n_top, ev.top_ids, ev.top_logprobs);
        }
    }
    ns_sampler_accept(&q->sampler, tok);
    q->tokens[q->n_tokens++] = tok;
    q->n_generated++;
    (*generated)++;
    const bool first = q->n_generated == 1;
    q->state = RS_DECODING;
    if (first) {
        q->t_first = t1;
        pthread_mutex_lock(&s->mu);
        hist_add(&s->stats.ttft_seconds, t1 - q->t_submit);
        pthread_mutex_unlock(&s->mu);
    } else {
        pthread_mutex_lock(&s->mu);
        hist_add(&s->stats.itl_seconds, t1 - q->t_last);
        pthread_mutex_unlock(&s->mu);
    }
    q->t_last = t1;
    pthread_mutex_lock(&r->mu);
    r->result.n_generated = q->n_generated;
    pthread_mutex_unlock(&r->mu);
    ns_finish why = NS_FINISH_NONE;
    if (ns_request_push(r, &ev) != NS_OK) why = NS_FINISH_ERROR;
    else if ((!r->params.ignore_eos || r->params.grammar) && ns_config_is_eos(c, tok)) why = NS_FINISH_EOS;
    else if (q->n_generated >= r->params.max_tokens) why = NS_FINISH_LENGTH;
    else if (q->n_tokens >= c->max_position_embeddings) why = NS_FINISH_CONTEXT;
    if (why != NS_FINISH_NONE) {
        remove_running_seq(s, q);
        finish(s, q, why, why == NS_FINISH_ERROR ? "out of memory" : NULL);
    } else if (r->params.test_pause_every > 0 && q->n_generated % r->params.test_pause_every == 0) {
        pause_seq(s, q, "test_pause_every");
    } else if (r->params.grammar) {
        return true; /* its next mask is computed during the next forward pass */
    }
    return false;
}

/* Step part 3: the ragged batch of the plan's n_plan sequences, in plan
 * order, into *b (its arrays are the scheduler's b_* buffers and b_pt, a
 * page table padded to the longest sequence's pages); *attn_pairs: the
 * attention work, for the step's cost model. False when there is nothing
 * to run or no memory for the page table. */
static bool build_batch(ns_sched *s, int32_t n_plan, ns_batch *b, double *attn_pairs) {
    int32_t nt = 0, ns = 0, n_logits = 0, max_pages = 0;
    *attn_pairs = 0;
    for (int32_t k = 0; k < n_plan; k++) {
        ns_seq *q = s->plan_q[k];
        const int32_t chunk = s->plan_chunk[k];
        s->b_seq_start[ns] = nt;
        for (int32_t j = 0; j < chunk; j++) {
            s->b_tokens[nt + j] = q->tokens[q->n_ctx + j];
            s->b_pos[nt + j] = q->n_ctx + j;
        }
        nt += chunk;
        *attn_pairs += (double)chunk * ((double)q->n_ctx + chunk / 2.0);
        s->b_seq_len[ns] = q->n_ctx + chunk;
        s->b_chunk[ns] = chunk;
        s->b_seqs[ns] = q;
        if (q->n_ctx + chunk == q->n_tokens) s->b_rows[n_logits++] = nt - 1;
        if (q->n_pages > max_pages) max_pages = q->n_pages;
        ns++;
    }
    if (ns == 0) return false;
    s->b_seq_start[ns] = nt;
    size_t pt_n = (size_t)ns * (size_t)max_pages;
    int32_t *pt = realloc(s->b_pt, (pt_n + 1) * sizeof(int32_t));
    if (!pt) return false;
    s->b_pt = pt;
    for (int32_t i = 0; i < ns; i++) {
        ns_seq *q = s->b_seqs[i];
        memcpy(pt + (size_t)i * (size_t)max_pages, q->pages, (size_t)q->n_pages * sizeof(int32_t));
        for (int32_t j = q->n_pages; j < max_pages; j++) pt[(size_t)i * (size_t)max_pages + (size_t)j] = q->pages[0];
    }
    *b = (ns_batch){
        .n_tokens = nt,
        .n_seqs = ns,
        .tokens = s->b_tokens,
        .positions = s->b_pos,
        .seq_start = s->b_seq_start,
        .seq_len = s->b_seq_len,
        .page_table = pt,
        .max_pages = max_pages,
        .logit_rows = s->b_rows,
        .n_logits = n_logits,
    };
    return true;
}

static bool step(ns_sched *s) {
    ns_engine *e = s->e;
    const ns_model_config *c = &e->model->cfg;
    /* cancellations first: a disconnected client frees its slot now */
    for (int32_t i = 0; i < s->n_running;) {
        ns_seq *q = s->running[i];
        if (atomic_load(&q->req->cancel)) {
            remove_running(s, i);
            finish(s, q, NS_FINISH_CANCELLED, NULL);
        } else {
            i++;
        }
    }
    admit(s);
    if (s->n_running == 0) return false;

    /* 1. plan each sequence's tokens for this step (plan_step) */
    int32_t n_unready = 0;
    int32_t n_plan = plan_step(s, &n_unready);
    /* 2. pages for the plan, oldest admitted first; when the pool is dry
     * the newest running sequence is paused (possibly the one asking) */
    plan_pages(s, &n_plan);
    if (n_plan == 0) {
        /* only promotions in flight: let the device catch up, not spin */
        for (int32_t i = 0; i < s->n_running && n_unready; i++)
            if (s->running[i]->ready_fence) ns_kv_cache_compute_after(s->kv, s->running[i]->ready_fence);
        return false;
    }

    /* 3. the ragged batch, in plan order (build_batch) */
    ns_batch b;
    double attn_pairs = 0;
    if (!build_batch(s, n_plan, &b, &attn_pairs)) return false;
    const int32_t nt = b.n_tokens, ns = b.n_seqs, n_logits = b.n_logits;
    const double t0 = ns_clock_now();
    ns_error err = {0};
    ns_status rc = ns_engine_forward(e, &b, &err);
    /* which requests own the logit rows, in row order */
    int32_t li = 0;
    bool want_lp = false;
    for (int32_t i = 0; i < ns; i++) {
        ns_seq *q = s->b_seqs[i];
        if (q->n_ctx + s->b_chunk[i] == q->n_tokens) {
            s->b_reqs[li] = q->req;
            s->b_samplers[li++] = &q->sampler;
            want_lp |= q->req->params.logprobs || q->req->params.top_logprobs > 0;
        }
    }
    if (rc == NS_OK && want_lp) {
        ns_tensor lv = e->logits;
        lv.rows = n_logits;
        rc = e->be->ops->tensor_download(e->be, &lv, s->host_logits, &err);
    }
    char gmsg[256] = "";
    if (rc == NS_OK && n_logits > 0) {
        ns_sched_grammar_prepare(s->grammar, s->b_reqs, s->b_samplers, n_logits, s->b_gfail, gmsg, sizeof(gmsg));
        rc = e->be->ops->sample(e->be, &e->logits, n_logits, s->b_samplers, s->b_sampled, &err);
        ns_sched_grammar_clear(s->b_samplers, n_logits);
    }
    int32_t n_greqs = 0;
    if (rc == NS_OK && n_logits == 0) rc = e->be->ops->sync(e->be, &err);
    const double t1 = ns_clock_now();
    if (rc != NS_OK) {
        NS_ERROR("engine step failed: %s", err.msg);
        for (int32_t i = 0; i < ns; i++) {
            ns_seq *q = s->b_seqs[i];
            remove_running_seq(s, q);
            finish(s, q, NS_FINISH_ERROR, err.msg);
        }
        return true;
    }
    li = 0;
    uint64_t generated = 0;
    for (int32_t i = 0; i < ns; i++) {
        ns_seq *q = s->b_seqs[i];
        ns_request *r = q->req;
        bool has_row = q->n_ctx + s->b_chunk[i] == q->n_tokens;
        q->n_ctx += s->b_chunk[i];
        commit_full_pages(s, q);
        if (!has_row) continue;
        const float *row = s->host_logits + (size_t)li * (size_t)c->vocab_size;
        const int32_t tok = s->b_sampled[li];
        const bool gfail = s->b_gfail[li++];
        if (take_token(s, q, tok, row, gfail, gmsg, t1, &generated)) s->b_greqs[n_greqs++] = r;
    }
    /* the next masks are computed while the next forward pass runs */
    ns_sched_grammar_kick(s->grammar, s->b_greqs, n_greqs);
    {
        double per = (t1 - t0) / work_units(s, nt, attn_pairs);
        s->sec_per_unit = s->sec_per_unit <= 0 ? per : 0.8 * s->sec_per_unit + 0.2 * per;
        if (nt >= BULK_STEP_TOKENS)
            s->sec_per_unit_bulk = s->sec_per_unit_bulk <= 0 ? per : 0.8 * s->sec_per_unit_bulk + 0.2 * per;
        cost_fit_add(s, work_units(s, nt, attn_pairs), t1 - t0);
    }
    pthread_mutex_lock(&s->mu);
    hist_add(&s->stats.step_seconds, t1 - t0);
    hist_add(&s->stats.batch_tokens, nt);
    s->stats.generated_tokens_total += generated;
    pthread_mutex_unlock(&s->mu);
    ns_sched_status_step(s->status, t1 - t0, nt, ns);
    return true;
}

/* Write-behind to the SSD tier: a bounded number of pages per step while
 * there is work (so a step is not delayed by much), everything when idle
 * or when an HTTP thread waits in ns_sched_flush. */
static void serve_flushes(ns_sched *s, bool worked) {
    pthread_mutex_lock(&s->mu);
    uint64_t asked = s->flush_asked;
    pthread_mutex_unlock(&s->mu);
    bool flushing = asked > s->flush_served_engine;
    int32_t left = ns_kv_cache_persist(s->kv, worked && !flushing ? s->persist_per_step : INT32_MAX);
    if (flushing && left == 0) {
        s->flush_served_engine = asked;
        pthread_mutex_lock(&s->mu);
        s->flush_served = asked;
        pthread_cond_broadcast(&s->flush_cv);
        pthread_mutex_unlock(&s->mu);
    }
}

static void update_gauges(ns_sched *s) {
    ns_kv_cache_stats kst;
    ns_kv_cache_get_stats(s->kv, &kst);
    pthread_mutex_lock(&s->mu);
    s->stats.kv = kst;
    s->stats.requests_running = s->n_running;
    const int32_t incoming = s->n_incoming; /* guarded by mu */
    s->stats.requests_waiting = s->n_waiting + incoming;
    s->stats.requests_paused = 0;
    for (int32_t i = 0; i < s->n_waiting; i++) s->stats.requests_paused += s->waiting[i]->state == RS_PAUSED;
    s->stats.requests_waiting -= s->stats.requests_paused;
    s->stats.reserved_pages = s->reserved;
    s->stats.pages_free = s->stats.kv.pool_free;
    s->stats.pages_cached = s->stats.kv.pool_cached;
    s->stats.pages_used = s->stats.kv.pool_held;
    pthread_mutex_unlock(&s->mu);
    ns_sched_status_publish(s->status, false, s->running, s->n_running, s->waiting, s->n_waiting, incoming, &kst,
                            s->n_pages, s->opts.ssd_bytes);
}

void ns_sched_get_capacity(ns_sched *s, ns_sched_capacity *out) {
    ns_sched_stats st;
    ns_sched_get_stats(s, &st);
    const ns_kv_cache_stats *k = &st.kv;
    const int64_t P = s->P;
    memset(out, 0, sizeof *out);
    out->running = st.requests_running;
    out->waiting = st.requests_waiting;
    out->paused = st.requests_paused;
    out->context_tokens = s->e->model->cfg.max_position_embeddings;
    out->pool_tokens = (int64_t)s->n_pages * P;
    out->largest_fits_alone_tokens = out->pool_tokens < out->context_tokens ? out->pool_tokens : out->context_tokens;
    int64_t adm = ((int64_t)k->pool_free + k->pool_cached - st.reserved_pages) * P;
    if (adm < 0) adm = 0;
    if (adm > out->largest_fits_alone_tokens) adm = out->largest_fits_alone_tokens;
    if (out->running >= s->opts.max_running) adm = 0; /* a new request would wait for a slot */
    out->admissible_tokens = adm;
    ns_tier_capacity *d = &out->tiers[NS_TIER_DEVICE];
    d->enabled = true;
    d->free_tokens = ((int64_t)k->pool_free + k->pool_cached) * P;
    d->used_tokens = (int64_t)k->pool_held * P;
    d->cached_tokens = (int64_t)k->pages[NS_TIER_DEVICE] * P;
    ns_tier_capacity *r = &out->tiers[NS_TIER_RAM];
    r->enabled = k->capacity[NS_TIER_RAM] >= 0;
    if (r->enabled) {
        r->cached_tokens = k->pages[NS_TIER_RAM] * P;
        r->free_tokens = (k->capacity[NS_TIER_RAM] - k->pages[NS_TIER_RAM]) * P;
    }
    ns_tier_capacity *d2 = &out->tiers[NS_TIER_SSD];
    d2->enabled = k->ssd_on;
    if (d2->enabled) {
        d2->cached_tokens = k->pages[NS_TIER_SSD] * P;
        int64_t rec = k->page_bytes > 0 ? (int64_t)(s->opts.ssd_bytes > 0 ? s->opts.ssd_bytes : (32ll << 30)) /
                                              (k->page_bytes + (int64_t)P * 4 + 64)
                                        : 0;
        d2->free_tokens = rec > k->pages[NS_TIER_SSD] ? (rec - k->pages[NS_TIER_SSD]) * P : 0;
    }
}

/* The scheduler's invariants (NS_DEBUG_CHECKS builds: sanitizer runs):
 * promises add up, nothing is both running and waiting, a running
 * sequence's pages cover its context, a paused one holds no page. */
static void check_invariants(const ns_sched *s) {
#ifdef NS_DEBUG_CHECKS
    int64_t promised = 0;
    assert(s->n_running <= s->opts.max_running);
    for (int32_t i = 0; i < s->n_running; i++) {
        const ns_seq *q = s->running[i];
        assert(q->state == RS_PREFILLING || q->state == RS_DECODING);
        assert(q->reserve_pages >= 0);
        promised += q->reserve_pages;
        assert((int64_t)q->n_pages * s->P >= q->n_ctx);
        assert(q->n_ctx <= q->n_tokens && q->n_committed * s->P <= q->n_ctx);
        for (int32_t j = 0; j < s->n_waiting; j++) assert(s->waiting[j] != q);
    }
    assert(promised == s->reserved);
    for (int32_t j = 0; j < s->n_waiting; j++) {
        const ns_seq *q = s->waiting[j];
        assert(q->state == RS_WAITING || q->state == RS_PAUSED);
        assert(q->n_pages == 0 && q->reserve_pages == 0);
        if (j > 0) assert(s->waiting[j - 1]->t_submit <= q->t_submit); /* FIFO */
    }
#else
    (void)s;
#endif
}

static void *engine_main(void *arg) {
    ns_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        take_incoming(s);
        bool worked = step(s);
        serve_flushes(s, worked);
        ns_kv_cache_check(s->kv);
        check_invariants(s);
        update_gauges(s);
        if (!worked) {
            pthread_mutex_lock(&s->mu);
            /* sleep until a submit, or re-check waiters/cancels shortly */
            if (!s->stop && !s->in_head) {
                struct timespec ts = ns_clock_deadline(CLOCK_REALTIME, 20);
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    /* shutting down: everyone still here ends as cancelled */
    while (s->n_running > 0) {
        ns_seq *q = s->running[s->n_running - 1];
        s->n_running--;
        finish(s, q, NS_FINISH_CANCELLED, "server shutting down");
    }
    take_incoming(s);
    for (int32_t i = 0; i < s->n_waiting; i++) {
        ns_request_finish(s->waiting[i]->req, NS_FINISH_CANCELLED, "server shutting down");
        seq_free(s->waiting[i]);
    }
    s->n_waiting = 0;
    update_gauges(s);
    return NULL;
}

ns_status ns_sched_start(ns_sched *s, ns_error *err) {
    if (s->started) return NS_OK;
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0)
        return ns_fail(err, NS_ERR_INTERNAL, "cannot start the engine thread");
    s->started = true;
    return NS_OK;
}

void ns_sched_stop(ns_sched *s) {
    if (!s || !s->started) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->flush_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = false;
}

void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}
