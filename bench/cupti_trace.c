/* bench/cupti_trace.c — a kernel timeline of any CUDA process, CUDA graph
 * nodes included, for the decode-step accounting in docs/cuda.md.
 *
 * Why: ncu runs kernels one at a time (no PDL overlap, every kernel pays
 * its own ramp and tail) and the per-op `--profile` of bench-engine runs
 * eagerly with events; neither shows what a kernel costs inside a replayed
 * graph, where programmatic dependent launch overlaps neighbours. CUPTI's
 * concurrent-kernel activity records carry the GPU start and end of every
 * kernel, graph kernel nodes included, without serializing them.
 *
 * Use (the GPU machine; `make CUDA=1 cupti-trace` builds it):
 *   NS_TRACE_OUT=trace.csv NS_TRACE_MAX=200000 \
 *     LD_PRELOAD=build/cuda/libns_cupti_trace.so build/cuda/gpu-tests/bench_engine ...
 * LD_PRELOAD reaches every process the command starts: under a wrapper,
 * put it after the wrapper (`timeout 90 env LD_PRELOAD=... bench_engine`).
 * A process that recorded no kernel (the wrapper itself) leaves the file
 * alone, so it cannot replace the real trace with an empty one at its
 * exit, as `LD_PRELOAD=... timeout 90 bench_engine` did (2026-12-03).
 *   python3 bench/trace_step.py trace.csv   (per-kernel cost inside one decode step)
 * Writes "Start (ns)","Duration (ns)","Name" rows (the first NS_TRACE_MAX
 * kernels, default 200000) when the process exits. Kernel names are
 * mangled. A measuring tool only: nothing in the server links it.
 *
 * Ownership: CUPTI's activity buffers are malloc'd in buffer_requested and
 * freed in buffer_completed; rows are kept in one growable array (capped
 * at NS_TRACE_MAX) written and freed at exit. Names point into CUPTI's
 * storage, valid for the process's life.
 */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 trace_kernel_rec;
#else
typedef CUpti_ActivityKernel9 trace_kernel_rec;
#endif

typedef struct {
    uint64_t start, end;
    const char *name;
} trace_row;

static trace_row *rows;
static size_t n_rows, cap_rows, max_rows = 200000;
static int enabled;

#define TRACE_BUF_BYTES (8u << 20)

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, TRACE_BUF_BYTES);
    *size = *buf ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

static void keep(const trace_kernel_rec *k) {
    if (n_rows >= max_rows) return;
    if (n_rows == cap_rows) {
        size_t cap = cap_rows ? 2 * cap_rows : 65536;
        if (cap > max_rows) cap = max_rows;
        trace_row *r = realloc(rows, cap * sizeof *r);
        if (!r) return;
        rows = r;
        cap_rows = cap;
    }
    rows[n_rows].start = k->start;
    rows[n_rows].end = k->end;
    rows[n_rows].name = k->name;
    n_rows++;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            keep((const trace_kernel_rec *)rec);
    }
    free(buf);
}

__attribute__((constructor)) static void trace_start(void) {
    const char *m = getenv("NS_TRACE_MAX");
    if (m && atol(m) > 0) max_rows = (size_t)atol(m);
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: CUPTI activity tracing could not be enabled\n");
        return;
    }
    enabled = 1;
}

__attribute__((destructor)) static void trace_stop(void) {
    if (!enabled) return;
    cuptiActivityFlushAll(1);
    if (n_rows == 0) return; /* no kernel ran here: not the traced process */
    const char *path = getenv("NS_TRACE_OUT");
    FILE *f = fopen(path ? path : "cupti_trace.csv", "w");
    if (!f) {
        fprintf(stderr, "cupti_trace: cannot write %s\n", path ? path : "cupti_trace.csv");
    } else {
        fprintf(f, "\"Start (ns)\",\"Duration (ns)\",\"Name\"\n");
        for (size_t i = 0; i < n_rows; i++)
            fprintf(f, "%llu,%llu,\"%s\"\n", (unsigned long long)rows[i].start,
                    (unsigned long long)(rows[i].end - rows[i].start), rows[i].name ? rows[i].name : "?");
        fclose(f);
        fprintf(stderr, "cupti_trace: %zu kernels -> %s\n", n_rows, path ? path : "cupti_trace.csv");
    }
    free(rows);
}
