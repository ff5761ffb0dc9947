#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct ns_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    uint64_t generation; /* bumped per run; workers wake on change */
    int n_busy;          /* workers still inside the current run */
    int stop;
    /* current job */
    ns_pool_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_llong next;
};

typedef struct {
    ns_pool *p;
    int tid;
} worker_arg;

static void drain(ns_pool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n) break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    ns_pool *p = wa->p;
    int tid = wa->tid;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ns_status ns_pool_create(int n_threads, ns_pool **out, ns_error *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) return ns_fail(err, NS_ERR_INVALID, "threads: %d is too many (max 256)", n_threads);
    ns_pool *p = calloc(1, sizeof *p);
    if (!p) return ns_fail(err, NS_ERR_NOMEM, "out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) goto oom;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto oom;
        wa->p = p;
        wa->tid = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* join only those that started */
            ns_pool_free(p);
            return ns_fail(err, NS_ERR_INTERNAL, "threads: pthread_create failed");
        }
    }
    *out = p;
    return NS_OK;
oom:
    p->n_threads = 1;
    ns_pool_free(p);
    return ns_fail(err, NS_ERR_NOMEM, "out of memory");
}

void ns_pool_free(ns_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        if (p->threads) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int ns_pool_threads(const ns_pool *p) { return p->n_threads; }

void ns_pool_run(ns_pool *p, int64_t n, int64_t grain, ns_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* ~4 chunks per thread balances uneven work without much contention */
    int64_t chunk = n / ((int64_t)p->n_threads * 4);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->n_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
