/* bench_tiers — TTFT of a repeated long prompt served from each KV cache
 * tier (device pool, host RAM, SSD) against a cold recompute, through the
 * scheduler (the same path serve takes), with the restore-vs-recompute
 * choice it made.
 *
 * usage: bench_tiers (--model DIR | --dummy-weights CONFIG_JSON) [--device cpu|cuda]
 *                    [--tokens N] [--repeats R] [--threads T] [--ssd-dir DIR] [--chunk C]
 *
 * Per repeat (a fresh prompt each time, medians reported):
 *   cold    a prompt never seen
 *   device  the same prompt again (pages still in the pool)
 *   ram     after another prompt of the same length pushed it out of a pool
 *           that holds ~1.3 prompts (pages demoted to the RAM tier)
 *   ssd     a new scheduler over a fresh pool with no RAM tier and the same
 *           SSD directory, after the segment files were dropped from the OS
 *           page cache (posix_fadvise DONTNEED; a VM host may still cache)
 * Each line says how many prompt tokens came from which tier. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "sched/sched.h"
#include "util/clock.h"

typedef struct bench_opts {
    const char *model_dir, *dummy_cfg, *device, *ssd_dir;
    int32_t tokens, repeats, threads, chunk;
} bench_opts;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void make_prompt(int32_t *p, int32_t n, uint32_t seed, int32_t vocab) {
    uint32_t x = seed * 2654435761u + 1;
    for (int32_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(vocab - 3));
    }
}

/* Submits and waits for the first token; returns seconds (-1 on error). */
static double ttft(ns_sched *s, const int32_t *p, int32_t n, ns_request_result *res) {
    ns_request_params rp = {.sampling = ns_sampling_default(), .max_tokens = 1, .ignore_eos = true};
    ns_request *r = ns_request_new(p, n, &rp);
    ns_error err = {0};
    double t0 = ns_clock_now();
    if (!r || ns_sched_submit(s, r, NULL, &err) != NS_OK) {
        fprintf(stderr, "submit: %s\n", err.msg);
        ns_request_release(r);
        return -1;
    }
    bool done = false;
    ns_token_event ev[4];
    double t1 = -1;
    while (!done) {
        int k = ns_request_poll(r, ev, 4, -1, &done);
        if (k > 0 && t1 < 0) t1 = ns_clock_now();
    }
    ns_request_result_get(r, res);
    ns_request_release(r);
    return t1 < 0 ? -1 : t1 - t0;
}

static void drop_page_cache(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "seg-", 4) != 0) continue;
        char path[4608];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}

static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.device = "cpu", .tokens = 8192, .repeats = 3, .threads = 2, .chunk = 512};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        if (!strcmp(a, "--model")) o->model_dir = v;
        else if (!strcmp(a, "--dummy-weights")) o->dummy_cfg = v;
        else if (!strcmp(a, "--device")) o->device = v;
        else if (!strcmp(a, "--ssd-dir")) o->ssd_dir = v;
        else if (!strcmp(a, "--tokens")) o->tokens = atoi(v);
        else if (!strcmp(a, "--repeats")) o->repeats = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--chunk")) o->chunk = atoi(v);
        else return -1;
        i++;
    }
    if (!!o->model_dir == !!o->dummy_cfg || o->tokens < 64 || o->repeats < 1 || o->repeats > 32) return -1;
    return 0;
}

static ns_status open_model(const bench_opts *o, ns_backend *be, ns_model **m, ns_error *err) {
    if (o->model_dir) return ns_model_load(o->model_dir, be, m, err);
    json_error_t je;
    json_t *root = json_load_file(o->dummy_cfg, 0, &je);
    if (!root) return ns_fail(err, NS_ERR_IO, "%s: %s", o->dummy_cfg, je.text);
    ns_model_config cfg;
    ns_status rc = ns_config_from_json(root, NULL, &cfg, err);
    json_decref(root);
    if (rc != NS_OK) return rc;
    return ns_model_create_random(&cfg, be, NS_DT_BF16, 1, m, err);
}

static ns_sched *new_sched(ns_engine *e, const bench_opts *o, int64_t ram_bytes, const char *ssd) {
    ns_sched_opts so = {.max_batch_tokens = o->chunk, .max_running = 4, .prefill_chunk = o->chunk,
                        .ram_cache_bytes = ram_bytes, .ssd_dir = ssd, .ssd_bytes = 64ll << 30};
    ns_sched *s = NULL;
    ns_error err = {0};
    if (ns_sched_create(e, &so, &s, &err) != NS_OK || ns_sched_start(s, &err) != NS_OK) {
        fprintf(stderr, "scheduler: %s\n", err.msg);
        ns_sched_free(s);
        return NULL;
    }
    return s;
}

static void print_line(const char *what, double med, const ns_request_result *res) {
    printf("%-7s TTFT median %8.4f s   reused %6d tokens (device %d, ram %d, ssd %d)\n", what, med, res->n_cached,
           res->n_cached_by_tier[NS_TIER_DEVICE], res->n_cached_by_tier[NS_TIER_RAM],
           res->n_cached_by_tier[NS_TIER_SSD]);
}

int main(int argc, char **argv) {
    bench_opts o;
    if (parse_args(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: %s (--model DIR | --dummy-weights CONFIG) [--device cpu|cuda] [--tokens N] "
                        "[--repeats R] [--threads T] [--ssd-dir DIR] [--chunk C]\n", argv[0]);
        return 2;
    }
    char tmpl[] = "/tmp/ns_bench_tiers_XXXXXX";
    const char *ssd = o.ssd_dir ? o.ssd_dir : mkdtemp(tmpl);
    ns_error err = {0};
    ns_backend *be = NULL;
    ns_model *m = NULL;
    ns_engine *e = NULL;
    int rc = 1;
    if (ns_backend_create(o.device, o.threads, &be, &err) != NS_OK || open_model(&o, be, &m, &err) != NS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    const int32_t P = 16, N = o.tokens;
    const bool cuda = strcmp(o.device, "cuda") == 0;
    /* a pool of ~1.3 prompts: a second prompt pushes most of the first out */
    ns_engine_opts eo = {.max_batch_tokens = o.chunk, .max_logits = 4, .page_tokens = P,
                         .n_pages = (int32_t)((int64_t)N * 13 / 10 / P + 8), .kv_dtype = cuda ? NS_DT_BF16 : NS_DT_F32};
    if (ns_engine_create(m, &eo, &e, &err) != NS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    const size_t page_bytes = ns_engine_page_bytes(&m->cfg, P, eo.kv_dtype);
    const int64_t ram = (int64_t)page_bytes * (3 * N / P + 16);
    printf("bench_tiers: %s, %d-token prompt, page %d tokens = %.2f MB, pool %d pages, RAM tier %.2f GB, SSD %s\n",
           o.device, N, P, page_bytes / 1e6, eo.n_pages, ram / 1e9, ssd);
    int32_t *a = malloc((size_t)N * sizeof(int32_t)), *b = malloc((size_t)N * sizeof(int32_t));
    double t_cold[32], t_dev[32], t_ram[32], t_ssd[32];
    ns_request_result r_cold = {0}, r_dev = {0}, r_ram = {0}, r_ssd = {0};
    const int32_t V = m->cfg.vocab_size;
    for (int rep = 0; rep < o.repeats; rep++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/rep%d", ssd, rep);
        ns_sched *s = new_sched(e, &o, ram, dir);
        if (!s) goto out;
        make_prompt(a, N, 1000u + (uint32_t)rep, V);
        make_prompt(b, N, 5000u + (uint32_t)rep, V);
        if (rep == 0) { /* warm-up: first-call costs, learns the step rate */
            make_prompt(b, 2048 < N ? 2048 : N, 7000u, V);
            ttft(s, b, 2048 < N ? 2048 : N, &r_cold);
            make_prompt(b, N, 5000u + (uint32_t)rep, V);
        }
        t_cold[rep] = ttft(s, a, N, &r_cold);
        t_dev[rep] = ttft(s, a, N, &r_dev);
        ttft(s, b, N, &r_ram); /* pushes a out of the pool, into RAM */
        t_ram[rep] = ttft(s, a, N, &r_ram);
        ns_kv_ssd_flush_result fr;
        if (ns_sched_flush(s, 600000, &fr, &err) != NS_OK) fprintf(stderr, "flush: %s\n", err.msg);
        const double t_flush = ns_clock_now();
        ns_sched_free(s);
        drop_page_cache(dir);
        s = new_sched(e, &o, 0, dir);
        if (!s) goto out;
        printf("repeat %d: flush of %lld durable pages + reopen %.2f s\n", rep, (long long)fr.durable,
               ns_clock_now() - t_flush);
        /* the step rate is learned per scheduler: warm up on a prompt the
         * cache has never seen, long enough for a bulk-rate measurement */
        make_prompt(b, 2048 < N ? 2048 : N, 9000u + (uint32_t)rep, V);
        ttft(s, b, 2048 < N ? 2048 : N, &r_ssd);
        t_ssd[rep] = ttft(s, a, N, &r_ssd);
        ns_sched_free(s);
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    print_line("cold", median(t_cold, o.repeats), &r_cold);
    print_line("device", median(t_dev, o.repeats), &r_dev);
    print_line("ram", median(t_ram, o.repeats), &r_ram);
    print_line("ssd", median(t_ssd, o.repeats), &r_ssd);
    free(a);
    free(b);
    rc = 0;
out:
    ns_engine_free(e);
    ns_model_free(m);
    if (be) be->ops->destroy(be);
    return rc;
}
