/* cpu_pool.h — a fixed pool of worker threads for data-parallel ops.
 *
 * ns_pool_run(pool, n, fn, ctx) splits [0, n) into chunks that the calling
 * thread and the workers claim with an atomic counter, and returns when all
 * are done. Only one thread (the engine thread) may call ns_pool_run; the
 * pool is not re-entrant. Workers sleep on a condition variable between
 * runs, so an idle server burns no CPU.
 */
#ifndef NS_CPU_POOL_H
#define NS_CPU_POOL_H

#include <stdint.h>

#include "util/status.h"

typedef void (*ns_pool_fn)(void *ctx, int64_t begin, int64_t end, int tid);
typedef struct ns_pool ns_pool;

/* n_threads total including the caller; 1 = run inline. */
ns_status ns_pool_create(int n_threads, ns_pool **out, ns_error *err);
void ns_pool_free(ns_pool *p);
int ns_pool_threads(const ns_pool *p);
/* Runs fn over [0, n) in chunks of at least `grain` items. */
void ns_pool_run(ns_pool *p, int64_t n, int64_t grain, ns_pool_fn fn, void *ctx);

#endif
