/* request.c — the request object and its event channel (HTTP <-> engine).
 * See sched.h for the ownership rules. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/gmatch.h"
#include "sched/sched_internal.h"
#include "util/clock.h"

ns_request *ns_request_new(const int32_t *prompt, int32_t n_prompt, const ns_request_params *params) {
    if (n_prompt <= 0 || !params) return NULL;
    ns_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->prompt = malloc((size_t)n_prompt * sizeof(int32_t));
    if (!r->prompt) {
        free(r);
        return NULL;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    r->n_prompt = n_prompt;
    r->params = *params;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, false);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->result.n_prompt = n_prompt;
    r->result.diverge_at = -1;
    return r;
}

void ns_request_release(ns_request *r) {
    if (!r) return;
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    ns_gmatch_free(r->params.grammar);
    free(r->prompt);
    free(r->events);
    free(r);
}

void ns_request_set_label(ns_request *r, const char *label) {
    if (r && label) snprintf(r->label, sizeof r->label, "%s", label);
}

void ns_request_cancel(ns_request *r) {
    atomic_store(&r->cancel, true);
}

int ns_request_poll(ns_request *r, ns_token_event *out, int max, int timeout_ms, bool *done) {
    pthread_mutex_lock(&r->mu);
    if (timeout_ms != 0) {
        struct timespec ts = ns_clock_deadline(CLOCK_REALTIME, timeout_ms);
        while (r->ev_head == r->n_events && !r->finished) {
            if (timeout_ms < 0) pthread_cond_wait(&r->cv, &r->mu);
            else if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
        }
    }
    int n = 0;
    while (n < max && r->ev_head < r->n_events) out[n++] = r->events[r->ev_head++];
    if (r->ev_head == r->n_events) {
        r->ev_head = r->n_events = 0; /* everything consumed: reuse the buffer */
    }
    *done = r->finished && r->ev_head == r->n_events;
    pthread_mutex_unlock(&r->mu);
    return n;
}

bool ns_request_waiting(ns_request *r, bool *paused, int32_t *queue_pos) {
    pthread_mutex_lock(&r->mu);
    bool w = r->waiting && !r->finished;
    if (paused) *paused = r->paused;
    if (queue_pos) *queue_pos = r->queue_pos;
    pthread_mutex_unlock(&r->mu);
    return w;
}

void ns_request_result_get(ns_request *r, ns_request_result *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->result;
    pthread_mutex_unlock(&r->mu);
}

/* Engine side: append one event. The buffer is capped by construction
 * (at most max_tokens events are ever pushed), so growth is bounded. */
ns_status ns_request_push(ns_request *r, const ns_token_event *ev) {
    pthread_mutex_lock(&r->mu);
    ns_status rc = NS_OK;
    if (r->n_events == r->cap_events) {
        int ncap = r->cap_events ? r->cap_events * 2 : 16;
        ns_token_event *p = realloc(r->events, (size_t)ncap * sizeof *p);
        if (!p) {
            rc = NS_ERR_NOMEM;
            goto done;
        }
        r->events = p;
        r->cap_events = ncap;
    }
    r->events[r->n_events++] = *ev;
    pthread_cond_broadcast(&r->cv);
done:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void ns_request_finish(ns_request *r, ns_finish why, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (!r->finished) {
        r->result.finish = why;
        if (msg) snprintf(r->result.error, sizeof r->result.error, "%s", msg);
        r->finished = true;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}
