/* sched_grammar.c — masks for the grammar rows of a step, computed ahead
 * on a worker thread (see sched_grammar.h). */
#include "sched/sched_grammar.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmatch.h"
#include "sched/sched_internal.h"

struct ns_sched_grammar {
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ns_request **jobs;   /* the batch the worker computes (references held) */
    int32_t n_jobs, cap;
    bool busy;           /* a batch is queued or running */
    bool quit;
};

static void *worker(void *arg) {
    ns_sched_grammar *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->busy && !h->quit) pthread_cond_wait(&h->cv, &h->mu);
        if (h->quit && !h->busy) break;
        int32_t n = h->n_jobs;
        pthread_mutex_unlock(&h->mu);
        for (int32_t i = 0; i < n; i++) {
            ns_error err = {0};
            /* a failure is retried (and reported) by prepare on the engine thread */
            if (!atomic_load(&h->jobs[i]->cancel)) (void)ns_gmatch_fill_mask(h->jobs[i]->params.grammar, &err);
            ns_request_release(h->jobs[i]);
        }
        pthread_mutex_lock(&h->mu);
        h->n_jobs = 0;
        h->busy = false;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

ns_sched_grammar *ns_sched_grammar_new(int32_t max_rows) {
    ns_sched_grammar *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    h->cap = max_rows > 0 ? max_rows : 1;
    h->jobs = malloc((size_t)h->cap * sizeof(ns_request *));
    if (!h->jobs) {
        free(h);
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    return h;
}

/* Waits until the worker has finished its batch. */
static void join(ns_sched_grammar *h) {
    pthread_mutex_lock(&h->mu);
    while (h->busy) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void ns_sched_grammar_free(ns_sched_grammar *h) {
    if (!h) return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->quit = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->th, NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->jobs);
    free(h);
}

void ns_sched_grammar_prepare(ns_sched_grammar *h, ns_request *const *reqs, ns_sampler *const *samplers, int32_t n,
                              bool *failed, char *msg, size_t cap) {
    bool any = false;
    for (int32_t i = 0; i < n; i++) any |= reqs[i]->params.grammar != NULL;
    if (!any) return;
    join(h);
    for (int32_t i = 0; i < n; i++) {
        failed[i] = false;
        ns_gmatch *m = reqs[i]->params.grammar;
        if (!m) continue;
        ns_error err = {0};
        if (ns_gmatch_fill_mask(m, &err) != NS_OK) {
            failed[i] = true;
            snprintf(msg, cap, "structured output: %s", err.msg);
            continue;
        }
        const uint32_t *mask = ns_gmatch_mask(m);
        uint32_t w = 0, nw = (uint32_t)(((int64_t)samplers[i]->n_vocab + 31) / 32);
        while (w < nw && !mask[w]) w++;
        if (w == nw) { /* e.g. a schema needing a character the vocabulary cannot spell */
            failed[i] = true;
            snprintf(msg, cap, "structured output: no token of this model's vocabulary can continue the grammar here");
            continue;
        }
        samplers[i]->allow = mask;
    }
}

void ns_sched_grammar_clear(ns_sampler *const *samplers, int32_t n) {
    for (int32_t i = 0; i < n; i++) samplers[i]->allow = NULL;
}

void ns_sched_grammar_kick(ns_sched_grammar *h, ns_request *const *reqs, int32_t n) {
    if (n <= 0) return;
    join(h);
    pthread_mutex_lock(&h->mu);
    if (!h->started) {
        if (pthread_create(&h->th, NULL, worker, h) != 0) {
            /* no worker: prepare computes every mask inline */
            pthread_mutex_unlock(&h->mu);
            return;
        }
        h->started = true;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n && k < h->cap; i++) {
        if (!reqs[i]->params.grammar) continue;
        atomic_fetch_add(&reqs[i]->refs, 1);
        h->jobs[k++] = reqs[i];
    }
    h->n_jobs = k;
    h->busy = k > 0;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}
