/* http_client.c — HTTP client over libcurl (see http_client.h). */
#include "client/http_client.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/clock.h"

struct ns_hc {
    CURL *curl;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc = CURLE_OK;

static void global_init_once(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

ns_status ns_hc_global_init(void) {
    pthread_once(&g_once, global_init_once);
    return g_init_rc == CURLE_OK ? NS_OK : NS_ERR_INTERNAL;
}

ns_hc *ns_hc_new(ns_error *err) {
    if (ns_hc_global_init() != NS_OK) {
        ns_fail(err, NS_ERR_INTERNAL, "libcurl failed to initialize");
        return NULL;
    }
    ns_hc *c = calloc(1, sizeof *c);
    if (!c) {
        ns_fail(err, NS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->curl = curl_easy_init();
    if (!c->curl) {
        free(c);
        ns_fail(err, NS_ERR_INTERNAL, "curl_easy_init failed");
        return NULL;
    }
    return c;
}

void ns_hc_free(ns_hc *c) {
    if (!c) return;
    curl_easy_cleanup(c->curl);
    free(c);
}

void ns_hc_response_free(ns_hc_response *resp) {
    if (!resp) return;
    free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
}

/* ---- SSE parser ---- */

void ns_hc_sse_init(ns_hc_sse *p, size_t cap, ns_hc_event_fn fn, void *ctx) {
    memset(p, 0, sizeof *p);
    p->cap = cap ? cap : NS_HC_DEFAULT_MAX_RESPONSE;
    p->fn = fn;
    p->ctx = ctx;
}

void ns_hc_sse_free(ns_hc_sse *p) {
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
}

/* Appends n bytes to a capped growable array; false over the cap or
 * without memory (the array is left as it was). */
static bool grow_append(char **buf, size_t *len, size_t *alloc, size_t cap, const char *s, size_t n) {
    if (n > cap || *len > cap - n) return false;
    if (*len + n + 1 > *alloc) {
        size_t na = *alloc ? *alloc : 256;
        while (na < *len + n + 1) na *= 2;
        char *nb = realloc(*buf, na);
        if (!nb) return false;
        *buf = nb;
        *alloc = na;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* One complete line (without its terminator). */
static ns_status sse_line(ns_hc_sse *p, const char *l, size_t n, double t) {
    if (n == 0) { /* blank line: dispatch */
        ns_status rc = NS_OK;
        if (p->have_data) {
            p->n_events++;
            if (p->fn && !p->fn(p->ctx, p->event, p->data ? p->data : "", p->data_len, t)) rc = NS_ERR_CANCELLED;
        }
        p->data_len = 0;
        if (p->data) p->data[0] = 0;
        p->have_data = false;
        p->event[0] = 0;
        return rc;
    }
    if (l[0] == ':') return NS_OK; /* a comment (keep-alive) */
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vl = colon ? n - fl - 1 : 0;
    if (vl && *v == ' ') v++, vl--;
    if (fl == 4 && memcmp(l, "data", 4) == 0) {
        if (p->have_data && !grow_append(&p->data, &p->data_len, &p->data_alloc, p->cap, "\n", 1))
            return NS_ERR_NOMEM;
        if (!grow_append(&p->data, &p->data_len, &p->data_alloc, p->cap, v, vl)) return NS_ERR_NOMEM;
        p->have_data = true;
    } else if (fl == 5 && memcmp(l, "event", 5) == 0) {
        snprintf(p->event, sizeof p->event, "%.*s", (int)vl, v);
    } /* id, retry and unknown fields: not needed by the tools */
    return NS_OK;
}

ns_status ns_hc_sse_feed(ns_hc_sse *p, const char *bytes, size_t n, double t_arrival) {
    for (size_t i = 0; i < n;) {
        if (p->skip_lf) { /* the \n of a \r\n split across chunks */
            p->skip_lf = false;
            if (bytes[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < n && bytes[j] != '\n' && bytes[j] != '\r') j++;
        if (j > i && !grow_append(&p->line, &p->line_len, &p->line_alloc, p->cap, bytes + i, j - i))
            return NS_ERR_NOMEM;
        if (j == n) break; /* an incomplete line: wait for more */
        if (bytes[j] == '\r') p->skip_lf = true;
        ns_status rc = sse_line(p, p->line ? p->line : "", p->line_len, t_arrival);
        p->line_len = 0;
        if (rc != NS_OK) return rc;
        i = j + 1;
    }
    return NS_OK;
}

/* ---- transfers ---- */

typedef struct xfer {
    ns_hc_response *resp;
    size_t cap;
    size_t total;
    ns_hc_sse sse;
    bool want_sse, decided, use_sse;
    CURL *curl;
    ns_status fail;   /* why a callback stopped the transfer */
    double idle_s;    /* the idle limit */
    double last_rx;   /* when the last body byte arrived (or the start) */
    curl_off_t seen;  /* body bytes the progress callback has seen */
} xfer;

static void decide(xfer *x) {
    if (x->decided) return;
    x->decided = true;
    long st = 0;
    curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &st);
    char *ct = NULL;
    curl_easy_getinfo(x->curl, CURLINFO_CONTENT_TYPE, &ct);
    if (ct) snprintf(x->resp->content_type, sizeof x->resp->content_type, "%s", ct);
    x->resp->status = st;
    x->resp->t_headers = ns_clock_now();
    x->use_sse = x->want_sse && st >= 200 && st < 300 && ct && strncasecmp(ct, "text/event-stream", 17) == 0;
    x->resp->streamed = x->use_sse;
}

/* The whole-body path keeps its own capacity (curl hands chunks of up to
 * CURL_MAX_WRITE_SIZE, so amortized doubling matters for a large body). */
typedef struct body_acc {
    xfer *x;
    size_t alloc;
} body_acc;

static size_t on_write_body(char *ptr, size_t size, size_t nmemb, void *ud) {
    body_acc *b = ud;
    xfer *x = b->x;
    size_t n = size * nmemb;
    double t = ns_clock_now();
    decide(x);
    x->last_rx = t;
    if (n > x->cap || x->total > x->cap - n) {
        x->fail = NS_ERR_NOMEM;
        return 0;
    }
    x->total += n;
    if (x->use_sse) {
        ns_status rc = ns_hc_sse_feed(&x->sse, ptr, n, t);
        x->resp->n_events = x->sse.n_events;
        if (rc != NS_OK) {
            x->fail = rc;
            return 0;
        }
        return n;
    }
    if (!grow_append(&x->resp->body, &x->resp->body_len, &b->alloc, x->cap, ptr, n)) {
        x->fail = NS_ERR_NOMEM;
        return 0;
    }
    return n;
}

/* The idle limit: libcurl's low-speed check averages over a window, so a
 * burst (the headers) followed by silence passes it for long; this ends
 * the transfer once no body byte came for idle_s. libcurl calls it at
 * least once a second while the transfer waits. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)ultotal, (void)ulnow;
    xfer *x = ud;
    double now = ns_clock_now();
    if (dlnow != x->seen) {
        x->seen = dlnow;
        x->last_rx = now;
    }
    if (now - x->last_rx > x->idle_s) {
        x->fail = NS_ERR_IO;
        return 1;
    }
    return 0;
}

static ns_status perform(ns_hc *c, const char *url, const char *const *headers, const char *body, size_t body_len,
                         bool post, const ns_hc_opts *o, ns_hc_event_fn on_event, void *ctx, ns_hc_response *resp,
                         ns_error *err) {
    memset(resp, 0, sizeof *resp);
    ns_hc_opts d = {0};
    if (!o) o = &d;
    xfer x = {.resp = resp, .cap = o->max_response_bytes ? o->max_response_bytes : NS_HC_DEFAULT_MAX_RESPONSE,
              .want_sse = on_event != NULL, .curl = c->curl};
    ns_hc_sse_init(&x.sse, x.cap, on_event, ctx);
    body_acc acc = {.x = &x};
    struct curl_slist *hl = NULL;
    bool have_ct = false;
    ns_status rc = NS_OK;
    for (size_t i = 0; headers && headers[i]; i++) {
        have_ct |= strncasecmp(headers[i], "content-type:", 13) == 0;
        struct curl_slist *nl = curl_slist_append(hl, headers[i]);
        if (!nl) goto nomem;
        hl = nl;
    }
    if (post && !have_ct) {
        struct curl_slist *nl = curl_slist_append(hl, "Content-Type: application/json");
        if (!nl) goto nomem;
        hl = nl;
    }
    {
        /* no "Expect: 100-continue" round trip on large bodies */
        struct curl_slist *nl = curl_slist_append(hl, "Expect:");
        if (!nl) goto nomem;
        hl = nl;
    }
    CURL *h = c->curl;
    curl_easy_reset(h); /* keeps the live connections, clears the last request's options */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &acc);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)((o->connect_timeout_s > 0 ? o->connect_timeout_s : 10) * 1000));
    if (o->timeout_s > 0) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s * 1000));
    x.idle_s = o->idle_timeout_s > 0 ? o->idle_timeout_s : 300;
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, NULL);
    if (post) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    } else {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
    }
    resp->t_start = x.last_rx = ns_clock_now();
    CURLcode cc = curl_easy_perform(h);
    resp->t_end = ns_clock_now();
    decide(&x); /* a response without a body */
    if (cc != CURLE_OK) {
        if (x.fail == NS_ERR_NOMEM) {
            rc = ns_fail(err, NS_ERR_NOMEM, "%s: response too large (cap %zu bytes)", url, x.cap);
        } else if (x.fail == NS_ERR_CANCELLED) {
            rc = ns_fail(err, NS_ERR_CANCELLED, "%s: stopped by the event handler", url);
        } else if (x.fail == NS_ERR_IO) {
            rc = ns_fail(err, NS_ERR_IO, "%s: no data for %.0f s (idle timeout)", url, x.idle_s);
        } else {
            long st = 0;
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
            resp->status = st;
            rc = ns_fail(err, NS_ERR_IO, "%s: %s", url, curl_easy_strerror(cc));
        }
        snprintf(resp->error, sizeof resp->error, "%s", err->msg);
    } else if (x.use_sse && x.sse.line_len > 0) {
        /* a last event without its blank line: deliver what is complete */
        ns_status r2 = ns_hc_sse_feed(&x.sse, "\n\n", 2, resp->t_end);
        resp->n_events = x.sse.n_events;
        if (r2 == NS_ERR_CANCELLED) rc = NS_ERR_CANCELLED;
    }
    goto out;
nomem:
    rc = ns_fail(err, NS_ERR_NOMEM, "out of memory building the request headers");
    snprintf(resp->error, sizeof resp->error, "out of memory");
out:
    curl_slist_free_all(hl);
    ns_hc_sse_free(&x.sse);
    return rc;
}

/* perform needs an ns_error for resp->error: the caller's, or a local one */
ns_status ns_hc_post(ns_hc *c, const char *url, const char *const *headers, const char *body, size_t body_len,
                     const ns_hc_opts *o, ns_hc_event_fn on_event, void *ctx, ns_hc_response *resp, ns_error *err) {
    ns_error local;
    return perform(c, url, headers, body, body_len, true, o, on_event, ctx, resp, err ? err : &local);
}

ns_status ns_hc_get(ns_hc *c, const char *url, const char *const *headers, const ns_hc_opts *o, ns_hc_response *resp,
                    ns_error *err) {
    ns_error local;
    return perform(c, url, headers, NULL, 0, false, o, NULL, NULL, resp, err ? err : &local);
}
