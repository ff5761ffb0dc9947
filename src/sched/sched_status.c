/* sched_status.c — the live status snapshot (see sched_status.h). */
#include "sched/sched_status.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/sched_internal.h"
#include "util/clock.h"

struct ns_sched_status {
    /* engine thread only */
    ns_status_break breaks[NS_STATUS_BREAKS]; /* ring: next write at break_head */
    int32_t break_head, n_breaks;
    uint64_t breaks_total;
    ns_status_second seconds[NS_STATUS_SECONDS]; /* ring indexed by unix_sec % N */
    double last_publish;                          /* monotonic seconds; 0 = never */
    uint64_t seq;
    ns_status_snapshot *scratch;                  /* filled, then copied under mu */

    pthread_mutex_t mu;                           /* guards pub */
    ns_status_snapshot *pub;
};

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *ns_status_state_name(ns_status_state s) {
    switch (s) {
    case NS_STATUS_WAITING: return "waiting";
    case NS_STATUS_PAUSED: return "paused";
    case NS_STATUS_PREFILLING: return "prefilling";
    case NS_STATUS_DECODING: return "decoding";
    }
    return "unknown";
}

ns_sched_status *ns_sched_status_new(void) {
    ns_sched_status *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->scratch = calloc(1, sizeof *st->scratch);
    st->pub = calloc(1, sizeof *st->pub);
    if (!st->scratch || !st->pub) {
        free(st->scratch);
        free(st->pub);
        free(st);
        return NULL;
    }
    st->pub->unix_time = unix_now();
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

void ns_sched_status_free(ns_sched_status *st) {
    if (!st) return;
    pthread_mutex_destroy(&st->mu);
    free(st->scratch);
    free(st->pub);
    free(st);
}

void ns_sched_status_step(ns_sched_status *st, double step_s, int32_t batch_tokens, int32_t n_seqs) {
    if (!st) return;
    const int64_t sec = (int64_t)unix_now();
    ns_status_second *b = &st->seconds[sec % NS_STATUS_SECONDS];
    if (b->unix_sec != sec) { /* a slot from NS_STATUS_SECONDS ago (or never used) */
        memset(b, 0, sizeof *b);
        b->unix_sec = sec;
    }
    b->steps++;
    b->sum_step_s += step_s;
    if (step_s > b->max_step_s) b->max_step_s = step_s;
    b->sum_batch_tokens += batch_tokens;
    b->sum_seqs += n_seqs;
    if (batch_tokens > b->max_batch_tokens) b->max_batch_tokens = batch_tokens;
    if (n_seqs > b->max_seqs) b->max_seqs = n_seqs;
}

void ns_sched_status_break(ns_sched_status *st, const ns_status_break *b) {
    if (!st) return;
    ns_status_break *d = &st->breaks[st->break_head];
    *d = *b;
    d->unix_time = unix_now();
    d->id[sizeof d->id - 1] = 0;
    st->break_head = (st->break_head + 1) % NS_STATUS_BREAKS;
    if (st->n_breaks < NS_STATUS_BREAKS) st->n_breaks++;
    st->breaks_total++;
}

/* One sequence as the dashboard shows it. Engine thread: q is its own. */
static void fill_req(ns_status_req *o, const ns_seq *q, int32_t queue_pos, double now) {
    const ns_request *r = q->req;
    memset(o, 0, sizeof *o);
    if (r->label[0]) snprintf(o->id, sizeof o->id, "%s", r->label);
    else snprintf(o->id, sizeof o->id, "request %llu", (unsigned long long)q->admit_order);
    switch (q->state) {
    case RS_PAUSED: o->state = NS_STATUS_PAUSED; break;
    case RS_PREFILLING: o->state = NS_STATUS_PREFILLING; break;
    case RS_DECODING: o->state = NS_STATUS_DECODING; break;
    default: o->state = NS_STATUS_WAITING; break;
    }
    o->queue_pos = queue_pos;
    o->n_prompt = r->n_prompt;
    /* a waiting request has no KV yet (n_tokens 0 before admission) */
    o->prefill_total = q->n_tokens > 0 ? q->n_tokens : r->n_prompt;
    o->prefill_done = q->n_ctx;
    /* the result's admission fields are written by this (the engine)
     * thread only, so reading them here needs no lock */
    o->n_cached = r->result.n_cached;
    for (int t = 0; t < NS_TIER_COUNT; t++) o->cached_by_tier[t] = r->result.n_cached_by_tier[t];
    o->n_generated = q->n_generated;
    o->max_tokens = r->params.max_tokens;
    o->n_pauses = q->n_pauses;
    o->age_s = now - q->t_submit;
    o->ttft_s = q->n_generated > 0 ? q->t_first - q->t_submit : -1;
    o->decode_tps = q->n_generated > 1 && q->t_last > q->t_first ? (q->n_generated - 1) / (q->t_last - q->t_first) : 0;
}

static void fill_tiers(ns_status_snapshot *s, const ns_kv_cache_stats *kv, int32_t n_pages, int64_t ssd_bytes) {
    ns_status_tier *d = &s->tiers[NS_TIER_DEVICE];
    d->enabled = true;
    d->used_pages = kv->pool_held;
    d->cached_pages = kv->pages[NS_TIER_DEVICE];
    d->capacity_pages = n_pages;
    for (int t = NS_TIER_RAM; t < NS_TIER_COUNT; t++) {
        ns_status_tier *x = &s->tiers[t];
        x->enabled = t == NS_TIER_SSD ? kv->ssd_on : kv->capacity[t] >= 0;
        x->used_pages = x->enabled ? kv->pages[t] : 0;
        x->cached_pages = x->used_pages;
        x->capacity_pages = x->enabled && kv->capacity[t] >= 0 ? kv->capacity[t] : -1;
    }
    /* the SSD tier is bounded by bytes, not pages: the kv stats' "capacity"
     * is its record count there. Pages that fit the byte cap, with the
     * per-page overhead ns_sched_get_capacity counts (tokens + record). */
    ns_status_tier *d2 = &s->tiers[NS_TIER_SSD];
    if (d2->enabled && kv->page_bytes > 0)
        d2->capacity_pages = (ssd_bytes > 0 ? ssd_bytes : (32ll << 30)) / (kv->page_bytes + (int64_t)kv->page_tokens * 4 + 64);
}

/* Copies the step buckets of the last NS_STATUS_SECONDS seconds, oldest
 * first (a slot whose second is older than that is stale, not shown). */
static void fill_seconds(const ns_sched_status *st, ns_status_snapshot *s) {
    const int64_t now = (int64_t)s->unix_time;
    s->n_seconds = 0;
    for (int64_t sec = now - NS_STATUS_SECONDS + 1; sec <= now; sec++) {
        const ns_status_second *b = &st->seconds[sec % NS_STATUS_SECONDS];
        if (b->unix_sec == sec && b->steps > 0) s->seconds[s->n_seconds++] = *b;
    }
}

/* Copies only what is valid (the arrays are large and mostly empty): the
 * one copy of a snapshot, for publishing (scratch -> pub) and for reading
 * (pub -> the caller's); a field added to the snapshot is added here. */
static void copy_valid(ns_status_snapshot *dst, const ns_status_snapshot *src) {
    dst->unix_time = src->unix_time;
    dst->seq = src->seq;
    dst->page_tokens = src->page_tokens;
    dst->n_requests = src->n_requests;
    dst->n_listed = src->n_listed;
    dst->n_incoming = src->n_incoming;
    memcpy(dst->reqs, src->reqs, (size_t)src->n_listed * sizeof *src->reqs);
    memcpy(dst->tiers, src->tiers, sizeof src->tiers);
    dst->n_breaks = src->n_breaks;
    dst->breaks_total = src->breaks_total;
    memcpy(dst->breaks, src->breaks, (size_t)src->n_breaks * sizeof *src->breaks);
    dst->n_seconds = src->n_seconds;
    memcpy(dst->seconds, src->seconds, (size_t)src->n_seconds * sizeof *src->seconds);
}

void ns_sched_status_publish(ns_sched_status *st, bool force, struct ns_seq *const *running, int32_t n_running,
                             struct ns_seq *const *waiting, int32_t n_waiting, int32_t n_incoming,
                             const ns_kv_cache_stats *kv, int32_t n_pages, int64_t ssd_bytes) {
    if (!st) return;
    const double now = ns_clock_now();
    if (!force && st->last_publish > 0 && now - st->last_publish < NS_STATUS_PUBLISH_MS * 1e-3) return;
    st->last_publish = now;
    ns_status_snapshot *s = st->scratch;
    s->unix_time = unix_now();
    s->seq = ++st->seq;
    s->page_tokens = kv->page_tokens;
    s->n_incoming = n_incoming;
    s->n_requests = n_running + n_waiting + n_incoming;
    s->n_listed = 0;
    /* running first (what the engine works on), then the queue in order */
    for (int32_t i = 0; i < n_running && s->n_listed < NS_STATUS_MAX_REQS; i++)
        fill_req(&s->reqs[s->n_listed++], running[i], 0, now);
    for (int32_t i = 0; i < n_waiting && s->n_listed < NS_STATUS_MAX_REQS; i++)
        fill_req(&s->reqs[s->n_listed++], waiting[i], i + 1, now);
    fill_tiers(s, kv, n_pages, ssd_bytes);
    s->breaks_total = st->breaks_total;
    s->n_breaks = st->n_breaks;
    for (int32_t i = 0; i < st->n_breaks; i++) /* newest first */
        s->breaks[i] = st->breaks[(st->break_head - 1 - i + 2 * NS_STATUS_BREAKS) % NS_STATUS_BREAKS];
    fill_seconds(st, s);
    pthread_mutex_lock(&st->mu);
    copy_valid(st->pub, s);
    pthread_mutex_unlock(&st->mu);
}

void ns_sched_status_get(ns_sched_status *st, ns_status_snapshot *out) {
    pthread_mutex_lock(&st->mu);
    copy_valid(out, st->pub);
    pthread_mutex_unlock(&st->mu);
}
