/* sched.c — the engine thread: admission, step planning (continuous
 * batching), prefix-cache reuse and commit, sampling, and events.
 *
 * Memory safety by arithmetic: a request is admitted only when the pages
 * it can ever need (prompt + max_tokens, minus the cached pages it shares)
 * fit in what the pool can give after every running request's own
 * promise. So a running request never finds the pool empty, and nothing
 * admitted is ever aborted for lack of memory. (Pausing and demotion to
 * lower tiers, which relax this promise, are a later issue.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_pages.h"
#include "kv/prefix_index.h"
#include "sched/sched_internal.h"
#include "util/log.h"

struct ns_sched {
    ns_engine *e;
    ns_sched_opts opts;
    int32_t P;
    ns_kv_pages pages;
    ns_prefix_index *index;

    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* guards incoming, stop, stats */
    pthread_cond_t cv;
    ns_request *in_head, *in_tail;
    int32_t n_incoming;
    bool stop;

    /* engine thread only */
    ns_request **waiting;
    int32_t n_waiting, cap_waiting;
    ns_request **running;
    int32_t n_running;
    int64_t reserved; /* sum of running requests' reserve_pages */
    uint64_t next_id;
    /* seconds per unit of step work, learned from measured steps (EMA);
     * work = tokens + attention pairs / ATTN_PAIRS_PER_UNIT */
    double sec_per_unit;
    /* step scratch */
    int32_t *b_tokens, *b_pos, *b_seq_start, *b_seq_len, *b_pt, *b_rows, *b_chunk;
    ns_request **b_reqs;
    ns_sampler **b_samplers;
    int32_t *b_sampled;
    float *host_logits;
    int32_t *match_pages;

    ns_sched_stats stats;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
static int64_t pool_tokens(const ns_sched *s) { return (int64_t)s->pages.n_pages * s->P; }

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
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    ns_status rc = ns_kv_pages_init(&s->pages, e->opts.n_pages, err);
    if (rc != NS_OK) goto fail;
    rc = ns_prefix_index_create(&s->pages, s->P, ns_prefix_seed(e->model->fingerprint, e->opts.kv_dtype, s->P),
                                &s->index, err);
    if (rc != NS_OK) goto fail;
    const size_t T = (size_t)s->opts.max_batch_tokens, R = (size_t)s->opts.max_running;
    s->b_tokens = malloc(T * sizeof(int32_t));
    s->b_pos = malloc(T * sizeof(int32_t));
    s->b_seq_start = malloc((R + 1) * sizeof(int32_t));
    s->b_seq_len = malloc(R * sizeof(int32_t));
    s->b_rows = malloc(R * sizeof(int32_t));
    s->b_chunk = malloc(R * sizeof(int32_t));
    s->b_reqs = malloc(R * sizeof(ns_request *));
    s->b_samplers = malloc(R * sizeof(ns_sampler *));
    s->b_sampled = malloc(R * sizeof(int32_t));
    s->running = malloc(R * sizeof(ns_request *));
    s->match_pages = malloc((size_t)s->pages.n_pages * sizeof(int32_t));
    s->host_logits = malloc(R * (size_t)e->model->cfg.vocab_size * sizeof(float));
    if (!s->b_tokens || !s->b_pos || !s->b_seq_start || !s->b_seq_len || !s->b_rows || !s->b_chunk || !s->b_reqs ||
        !s->b_samplers || !s->b_sampled || !s->running || !s->match_pages || !s->host_logits) {
        rc = ns_fail(err, NS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    hist_init(&s->stats.step_seconds, 0.0005, 2.0);
    hist_init(&s->stats.batch_tokens, 1, 2.0);
    hist_init(&s->stats.ttft_seconds, 0.005, 2.0);
    hist_init(&s->stats.itl_seconds, 0.001, 2.0);
    s->stats.pages_total = s->pages.n_pages;
    s->stats.pages_free = s->pages.n_pages;
    s->stats.page_tokens = s->P;
    *out = s;
    return NS_OK;
fail:
    ns_sched_free(s);
    return rc;
}

void ns_sched_free(ns_sched *s) {
    if (!s) return;
    ns_sched_stop(s);
    /* requests never picked up by the engine thread */
    for (ns_request *r = s->in_head, *n; r; r = n) {
        n = r->next;
        ns_request_finish(r, NS_FINISH_CANCELLED, "server shutting down");
        ns_request_release(r);
    }
    ns_prefix_index_free(s->index);
    ns_kv_pages_free(&s->pages);
    free(s->waiting);
    free(s->running);
    free(s->b_tokens);
    free(s->b_pos);
    free(s->b_seq_start);
    free(s->b_seq_len);
    free(s->b_pt);
    free(s->b_rows);
    free(s->b_chunk);
    free(s->b_reqs);
    free(s->b_samplers);
    free(s->b_sampled);
    free(s->match_pages);
    free(s->host_logits);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
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
    if (r->n_prompt >= ctx)
        return ns_fail(err, NS_ERR_RANGE, "the prompt has %d tokens; the model's context is %lld tokens", r->n_prompt,
                       (long long)ctx);
    if (r->params.max_tokens <= 0) r->params.max_tokens = (int32_t)(limit - r->n_prompt);
    if (r->params.max_tokens <= 0 || r->n_prompt + (int64_t)r->params.max_tokens > pool) {
        pthread_mutex_lock(&s->mu);
        s->stats.requests_rejected++;
        pthread_mutex_unlock(&s->mu);
        return ns_fail(err, NS_ERR_RANGE,
                       "the request needs %lld tokens of KV (prompt %d + max_tokens %d) but this server's KV pool "
                       "holds at most %lld tokens for one request",
                       (long long)r->n_prompt + r->params.max_tokens, r->n_prompt, r->params.max_tokens,
                       (long long)pool);
    }
    if (r->n_prompt + (int64_t)r->params.max_tokens > ctx) r->params.max_tokens = (int32_t)(ctx - r->n_prompt);
    if (cap) cap->max_tokens = r->params.max_tokens;
    ns_status rc = ns_sampler_init(&r->sampler, &r->params.sampling, c->vocab_size, err);
    if (rc != NS_OK) return rc;
    r->sampler_ready = true;
    r->t_submit = now_s();
    atomic_fetch_add(&r->refs, 1); /* the engine's reference */
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_sub(&r->refs, 1);
        return ns_fail(err, NS_ERR_CANCELLED, "the server is shutting down");
    }
    r->next = NULL;
    if (s->in_tail) s->in_tail->next = r;
    else s->in_head = r;
    s->in_tail = r;
    s->n_incoming++;
    s->stats.requests_total++;
    s->stats.requests_waiting++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NS_OK;
}

/* ------------------------------------------------------------ engine side */

static void release_pages(ns_sched *s, ns_request *r) {
    /* Leave the last, partially filled page in the index so a prompt that
     * extends this sequence can copy it instead of recomputing it. */
    if (r->n_pages > 0 && r->n_committed == r->n_pages - 1 && r->n_ctx > r->n_committed * s->P)
        ns_prefix_index_commit_partial(s->index, r->last_hash, r->tokens + (size_t)r->n_committed * (size_t)s->P,
                                       r->n_ctx - r->n_committed * s->P, r->pages[r->n_pages - 1]);
    for (int32_t i = 0; i < r->n_pages; i++)
        ns_kv_pages_unref(&s->pages, r->pages[i], ns_prefix_index_has_page(s->index, r->pages[i]));
    r->n_pages = 0;
    s->reserved -= r->reserve_pages;
    r->reserve_pages = 0;
}

static void finish(ns_sched *s, ns_request *r, ns_finish why, const char *msg) {
    release_pages(s, r);
    r->state = RS_DONE;
    pthread_mutex_lock(&r->mu);
    r->result.n_generated = r->n_generated;
    pthread_mutex_unlock(&r->mu);
    ns_request_finish(r, why, msg);
    pthread_mutex_lock(&s->mu);
    if (why == NS_FINISH_CANCELLED) s->stats.requests_cancelled++;
    pthread_mutex_unlock(&s->mu);
    ns_request_release(r);
}

static void remove_running(ns_sched *s, int32_t i) {
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

static ns_status grow_i32(int32_t **p, int32_t *cap, int32_t need) {
    if (need <= *cap) return NS_OK;
    int32_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    int32_t *q = realloc(*p, (size_t)n * sizeof(int32_t));
    if (!q) return NS_ERR_NOMEM;
    *p = q;
    *cap = n;
    return NS_OK;
}

static void log_admission(ns_sched *s, ns_request *r, const ns_prefix_match *m, int32_t cached) {
    if (ns_log_get_level() > NS_LOG_INFO) return;
    char line[1024];
    int o = snprintf(line, sizeof line, "request %llu: prompt %d tokens, reused %d (%d pages + %d copied), prefill %d",
                     (unsigned long long)++s->next_id, r->n_prompt, cached, m->n_full, m->n_partial,
                     r->n_prompt - cached);
    if (m->diverge_at >= 0 && o > 0 && (size_t)o < sizeof line) {
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
    NS_INFO("%s", line);
}

/* Tries to admit r now. Returns true when admitted (it joins running). */
static bool try_admit(ns_sched *s, ns_request *r) {
    ns_prefix_match m = {.pages = s->match_pages};
    /* keep >= 1 prompt token to compute: its logits give the first token */
    ns_prefix_index_lookup(s->index, r->prompt, r->n_prompt, r->n_prompt - 1, s->pages.n_pages, &m);
    const int32_t total = pages_for(s, (int64_t)r->n_prompt + r->params.max_tokens);
    const int32_t fresh = total - m.n_full;
    int32_t shared_in_lru = 0;
    for (int32_t i = 0; i < m.n_full; i++) shared_in_lru += s->pages.in_lru[m.pages[i]] ? 1 : 0;
    int64_t avail = (int64_t)ns_kv_pages_available(&s->pages) - shared_in_lru - s->reserved;
    if (fresh > avail) return false;
    if (grow_i32(&r->pages, &r->cap_pages, total) != NS_OK ||
        grow_i32(&r->tokens, &r->cap_tokens, r->n_prompt + r->params.max_tokens + 1) != NS_OK)
        return false; /* retried next step; OOM here is transient or fatal either way */
    for (int32_t i = 0; i < m.n_full; i++) {
        ns_kv_pages_ref(&s->pages, m.pages[i]);
        r->pages[i] = m.pages[i];
    }
    r->n_pages = m.n_full;
    r->n_committed = m.n_full;
    r->last_hash = m.last_hash;
    r->reserve_pages = fresh;
    s->reserved += fresh;
    memcpy(r->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    r->n_tokens = r->n_prompt;
    int32_t cached = m.n_full * s->P;
    if (m.n_partial > 0) {
        /* copy on write: pin the source while allocating the copy, since
         * the allocation could otherwise evict it */
        ns_kv_pages_ref(&s->pages, m.partial_page);
        int32_t dst = ns_kv_pages_alloc(&s->pages);
        if (dst >= 0) {
            s->e->be->ops->kv_page_copy(s->e->be, dst, m.partial_page, m.n_partial);
            r->pages[r->n_pages++] = dst;
            r->reserve_pages--;
            s->reserved--;
            cached += m.n_partial;
        }
        ns_kv_pages_unref(&s->pages, m.partial_page, true);
    }
    r->n_ctx = cached;
    for (int32_t i = 0; i < r->n_prompt; i++) ns_sampler_accept(&r->sampler, r->prompt[i]);
    pthread_mutex_lock(&r->mu);
    r->result.n_cached = cached;
    r->result.diverge_at = m.diverge_at;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    s->stats.prefix_lookup_tokens_total += (uint64_t)r->n_prompt;
    s->stats.prefix_hit_tokens_total += (uint64_t)cached;
    s->stats.prompt_tokens_total += (uint64_t)r->n_prompt;
    pthread_mutex_unlock(&s->mu);
    log_admission(s, r, &m, cached);
    r->state = RS_PREFILLING;
    s->running[s->n_running++] = r;
    return true;
}

static void admit(ns_sched *s) {
    const double t = now_s();
    int32_t kept = 0;
    bool blocked = false;
    for (int32_t i = 0; i < s->n_waiting; i++) {
        ns_request *r = s->waiting[i];
        if (atomic_load(&r->cancel)) {
            r->state = RS_DONE;
            ns_request_finish(r, NS_FINISH_CANCELLED, NULL);
            pthread_mutex_lock(&s->mu);
            s->stats.requests_cancelled++;
            pthread_mutex_unlock(&s->mu);
            ns_request_release(r);
            continue;
        }
        if (!blocked && s->n_running < s->opts.max_running && try_admit(s, r)) continue;
        /* FIFO with aging: once the oldest waiter has waited long enough,
         * nobody behind it may take the pages it is waiting for. */
        if (t - r->t_submit > s->opts.aging_seconds) blocked = true;
        s->waiting[kept++] = r;
    }
    s->n_waiting = kept;
}

static void take_incoming(ns_sched *s) {
    pthread_mutex_lock(&s->mu);
    ns_request *r = s->in_head;
    s->in_head = s->in_tail = NULL;
    s->n_incoming = 0;
    pthread_mutex_unlock(&s->mu);
    for (ns_request *n; r; r = n) {
        n = r->next;
        r->next = NULL;
        if (s->n_waiting == s->cap_waiting) {
            int32_t nc = s->cap_waiting ? s->cap_waiting * 2 : 64;
            ns_request **p = realloc(s->waiting, (size_t)nc * sizeof *p);
            if (!p) {
                ns_request_finish(r, NS_FINISH_ERROR, "out of memory queueing the request");
                ns_request_release(r);
                continue;
            }
            s->waiting = p;
            s->cap_waiting = nc;
        }
        r->state = RS_WAITING;
        s->waiting[s->n_waiting++] = r;
    }
}

static void commit_full_pages(ns_sched *s, ns_request *r) {
    while ((r->n_committed + 1) * s->P <= r->n_ctx) {
        const int32_t *t = r->tokens + (size_t)r->n_committed * (size_t)s->P;
        uint64_t h = ns_prefix_hash(r->last_hash, t, s->P);
        ns_prefix_index_commit(s->index, r->last_hash, h, t, r->pages[r->n_committed]);
        r->last_hash = h;
        r->n_committed++;
    }
}

/* A step's cost grows with its tokens (weights are read once per step,
 * matmuls scale with tokens) and with attention pairs (each new token
 * attends to its whole context). One unit ~ one token's non-attention
 * work; the ratio is a rough constant, the scale is learned online. */
#define ATTN_PAIRS_PER_UNIT 256.0

static double work_units(int64_t tokens, double attn_pairs) { return (double)tokens + attn_pairs / ATTN_PAIRS_PER_UNIT; }

/* Largest prefill chunk (<= want) for a sequence at context ctx such that
 * the step stays within the latency target, given work already planned.
 * Only applies while some stream decodes: alone, prefill takes the whole
 * budget (throughput wins when nobody waits for tokens). */
static int32_t bounded_chunk(const ns_sched *s, int32_t want, int32_t ctx, double planned_units) {
    if (s->sec_per_unit <= 0) return want;
    double budget_units = s->opts.target_step_ms * 1e-3 / s->sec_per_unit - planned_units;
    int32_t c = want;
    while (c > 16 && work_units(c, (double)c * ((double)ctx + c / 2.0)) > budget_units) c /= 2;
    return c;
}

/* Plans and runs one step. Returns false when there was nothing to do. */
static bool step(ns_sched *s) {
    ns_engine *e = s->e;
    const ns_model_config *c = &e->model->cfg;
    /* cancellations first: a disconnected client frees its slot now */
    for (int32_t i = 0; i < s->n_running;) {
        ns_request *r = s->running[i];
        if (atomic_load(&r->cancel)) {
            remove_running(s, i);
            finish(s, r, NS_FINISH_CANCELLED, NULL);
        } else {
            i++;
        }
    }
    admit(s);
    if (s->n_running == 0) return false;

    int32_t budget = s->opts.max_batch_tokens, nt = 0, ns = 0, n_logits = 0, max_pages = 0;
    double attn_pairs = 0;
    bool decoding = false;
    for (int32_t i = 0; i < s->n_running; i++) decoding |= s->running[i]->state == RS_DECODING;
    /* decode tokens first: they bound every stream's inter-token latency */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < s->n_running && budget > 0; i++) {
            ns_request *r = s->running[i];
            int32_t chunk;
            if (pass == 0) {
                if (r->state != RS_DECODING) continue;
                chunk = 1;
            } else {
                if (r->state != RS_PREFILLING) continue;
                chunk = r->n_prompt - r->n_ctx;
                if (chunk > s->opts.prefill_chunk) chunk = s->opts.prefill_chunk;
                if (chunk > budget) chunk = budget;
                if (decoding) chunk = bounded_chunk(s, chunk, r->n_ctx, work_units(nt, attn_pairs));
            }
            int32_t need = pages_for(s, r->n_ctx + chunk);
            bool ok = true;
            while (r->n_pages < need) {
                int32_t pg = ns_kv_pages_alloc(&s->pages);
                if (pg < 0) {
                    ok = false;
                    break;
                }
                r->pages[r->n_pages++] = pg;
                if (r->reserve_pages > 0) {
                    r->reserve_pages--;
                    s->reserved--;
                }
            }
            if (!ok) {
                /* cannot happen while the admission arithmetic holds */
                NS_ERROR("scheduler: KV pool exhausted for a running request (accounting bug)");
                continue;
            }
            s->b_seq_start[ns] = nt;
            for (int32_t j = 0; j < chunk; j++) {
                s->b_tokens[nt + j] = r->tokens[r->n_ctx + j];
                s->b_pos[nt + j] = r->n_ctx + j;
            }
            nt += chunk;
            budget -= chunk;
            attn_pairs += (double)chunk * ((double)r->n_ctx + chunk / 2.0);
            s->b_seq_len[ns] = r->n_ctx + chunk;
            s->b_chunk[ns] = chunk;
            s->b_reqs[ns] = r;
            if (r->n_ctx + chunk == r->n_tokens) s->b_rows[n_logits++] = nt - 1;
            if (r->n_pages > max_pages) max_pages = r->n_pages;
            ns++;
        }
    }
    if (ns == 0) return false;
    s->b_seq_start[ns] = nt;
    size_t pt_n = (size_t)ns * (size_t)max_pages;
    int32_t *pt = realloc(s->b_pt, (pt_n + 1) * sizeof(int32_t));
    if (!pt) return false;
    s->b_pt = pt;
    for (int32_t i = 0; i < ns; i++) {
        ns_request *r = s->b_reqs[i];
        memcpy(pt + (size_t)i * (size_t)max_pages, r->pages, (size_t)r->n_pages * sizeof(int32_t));
        for (int32_t j = r->n_pages; j < max_pages; j++) pt[(size_t)i * (size_t)max_pages + (size_t)j] = r->pages[0];
    }
    ns_batch b = {
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
    const double t0 = now_s();
    ns_error err = {0};
    ns_status rc = ns_engine_forward(e, &b, &err);
    /* which requests own the logit rows, in row order */
    int32_t li = 0;
    bool want_lp = false;
    for (int32_t i = 0; i < ns; i++) {
        ns_request *r = s->b_reqs[i];
        if (r->n_ctx + s->b_chunk[i] == r->n_tokens) {
            s->b_samplers[li++] = &r->sampler;
            want_lp |= r->params.logprobs || r->params.top_logprobs > 0;
        }
    }
    if (rc == NS_OK && want_lp) {
        ns_tensor lv = e->logits;
        lv.rows = n_logits;
        rc = e->be->ops->tensor_download(e->be, &lv, s->host_logits, &err);
    }
    if (rc == NS_OK && n_logits > 0)
        rc = e->be->ops->sample(e->be, &e->logits, n_logits, s->b_samplers, s->b_sampled, &err);
    if (rc == NS_OK && n_logits == 0) rc = e->be->ops->sync(e->be, &err);
    const double t1 = now_s();
    if (rc != NS_OK) {
        NS_ERROR("engine step failed: %s", err.msg);
        for (int32_t i = 0; i < ns; i++) {
            ns_request *r = s->b_reqs[i];
            for (int32_t j = 0; j < s->n_running; j++)
                if (s->running[j] == r) {
                    remove_running(s, j);
                    break;
                }
            finish(s, r, NS_FINISH_ERROR, err.msg);
        }
        return true;
    }
    li = 0;
    uint64_t generated = 0;
    for (int32_t i = 0; i < ns; i++) {
        ns_request *r = s->b_reqs[i];
        bool has_row = r->n_ctx + s->b_chunk[i] == r->n_tokens;
        r->n_ctx += s->b_chunk[i];
        commit_full_pages(s, r);
        if (!has_row) continue;
        const float *row = s->host_logits + (size_t)li * (size_t)c->vocab_size;
        int32_t tok = s->b_sampled[li++];
        ns_token_event ev = {.token = tok};
        if (r->params.logprobs || r->params.top_logprobs > 0) {
            ev.logprob = (float)(row[tok] - ns_logsumexp(row, c->vocab_size));
            if (r->params.top_logprobs > 0) {
                ev.n_top = r->params.top_logprobs;
                ns_top_logprobs(row, c->vocab_size, ev.n_top, ev.top_ids, ev.top_logprobs);
            }
        }
        ns_sampler_accept(&r->sampler, tok);
        r->tokens[r->n_tokens++] = tok;
        r->n_generated++;
        generated++;
        if (r->state == RS_PREFILLING) {
            r->t_first = t1;
            r->state = RS_DECODING;
            pthread_mutex_lock(&s->mu);
            hist_add(&s->stats.ttft_seconds, t1 - r->t_submit);
            pthread_mutex_unlock(&s->mu);
        } else {
            pthread_mutex_lock(&s->mu);
            hist_add(&s->stats.itl_seconds, t1 - r->t_last);
            pthread_mutex_unlock(&s->mu);
        }
        r->t_last = t1;
        pthread_mutex_lock(&r->mu);
        r->result.n_generated = r->n_generated;
        pthread_mutex_unlock(&r->mu);
        ns_finish why = NS_FINISH_NONE;
        if (ns_request_push(r, &ev) != NS_OK) why = NS_FINISH_ERROR;
        else if (!r->params.ignore_eos && ns_config_is_eos(c, tok)) why = NS_FINISH_EOS;
        else if (r->n_generated >= r->params.max_tokens) why = NS_FINISH_LENGTH;
        else if (r->n_tokens >= c->max_position_embeddings) why = NS_FINISH_CONTEXT;
        if (why != NS_FINISH_NONE) {
            for (int32_t j = 0; j < s->n_running; j++)
                if (s->running[j] == r) {
                    remove_running(s, j);
                    break;
                }
            finish(s, r, why, why == NS_FINISH_ERROR ? "out of memory" : NULL);
        }
    }
    {
        double per = (t1 - t0) / work_units(nt, attn_pairs);
        s->sec_per_unit = s->sec_per_unit <= 0 ? per : 0.8 * s->sec_per_unit + 0.2 * per;
    }
    pthread_mutex_lock(&s->mu);
    hist_add(&s->stats.step_seconds, t1 - t0);
    hist_add(&s->stats.batch_tokens, nt);
    s->stats.generated_tokens_total += generated;
    pthread_mutex_unlock(&s->mu);
    return true;
}

static void update_gauges(ns_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stats.requests_running = s->n_running;
    s->stats.requests_waiting = s->n_waiting + s->n_incoming;
    s->stats.pages_free = s->pages.n_free;
    s->stats.pages_cached = s->pages.n_cached;
    s->stats.pages_used = s->pages.n_pages - s->pages.n_free - s->pages.n_cached;
    pthread_mutex_unlock(&s->mu);
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
        update_gauges(s);
        if (!worked) {
            pthread_mutex_lock(&s->mu);
            /* sleep until a submit, or re-check waiters/cancels shortly */
            if (!s->stop && !s->in_head) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 20 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            }
            pthread_mutex_unlock(&s->mu);
        }
    }
    /* shutting down: everyone still here ends as cancelled */
    while (s->n_running > 0) {
        ns_request *r = s->running[s->n_running - 1];
        s->n_running--;
        finish(s, r, NS_FINISH_CANCELLED, "server shutting down");
    }
    take_incoming(s);
    for (int32_t i = 0; i < s->n_waiting; i++) {
        ns_request_finish(s->waiting[i], NS_FINISH_CANCELLED, "server shutting down");
        ns_request_release(s->waiting[i]);
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
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = false;
}

void ns_sched_get_stats(ns_sched *s, ns_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}
