#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Workers spin this many iterations on the generation counter before
 * sleeping. A decode step issues ~20 ops per layer, each microseconds
 * long; waking a sleeping thread costs about as much as the op, so
 * between ops of one step the workers stay awake, and between steps
 * (idle server) they sleep and burn no CPU. */
#define SPIN_ITERS 20000

struct ns_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    atomic_uint_fast64_t generation; /* bumped per run; workers wake on change */
    atomic_int n_busy;               /* workers still inside the current run */
    atomic_int n_sleeping;           /* workers blocked on cv_work */
    atomic_int stop;
    /* current job (written before generation is bumped: release/acquire) */
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
    uint_fast64_t seen = 0;
    for (;;) {
        uint_fast64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS && !atomic_load(&p->stop); i++) {
            if (i % 64 == 63) sched_yield(); /* let a descheduled engine thread run */
            else CPU_RELAX();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (!atomic_load(&p->stop) && (g = atomic_load(&p->generation)) == seen)
                pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        drain(p, tid);
        atomic_fetch_sub_explicit(&p->n_busy, 1, memory_order_release);
    }
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
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_busy, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) goto oom;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n_threads = i;
            ns_pool_free(p);
            return ns_fail(err, NS_ERR_NOMEM, "out of memory");
        }
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
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        if (p->threads) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
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
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->n_busy, p->n_threads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
    drain(p, 0);
    /* Workers finish their last chunk within microseconds of us; yield
     * rather than pause, so a worker that shares our core (an
     * oversubscribed machine) gets to run instead of being spun against. */
    while (atomic_load_explicit(&p->n_busy, memory_order_acquire) > 0) sched_yield();
}
