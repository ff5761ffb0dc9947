/* cuda_switches.cu — the C-callable device facts and A/B switches of
 * cuda.h (memory, device name, graphs, fusions, PDL, prefetch, early
 * loads, the bulk GEMV, the persistent MLP, the step memo).
 *
 * Invariant: a switch that captured graphs embody goes through
 * set_captured_setting, which runs what is recorded and bumps the graph
 * generation, so no graph captured under the old value is replayed.
 */
#include <stdio.h>

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda.h"

extern "C" ns_status ns_cuda_mem_info(ns_backend *be, size_t *free_bytes, size_t *total_bytes, ns_error *err) {
    cu_impl *c = cu_impl_of(be);
    cudaSetDevice(c->device);
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return ns_fail(err, NS_ERR_INTERNAL, "cuda: cudaMemGetInfo failed");
    }
    return NS_OK;
}

extern "C" void ns_cuda_device_desc(ns_backend *be, char *name, size_t name_len, int *n_sm) {
    cu_impl *c = cu_impl_of(be);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, c->device) == cudaSuccess) snprintf(name, name_len, "%s", prop.name);
    else snprintf(name, name_len, "?");
    *n_sm = c->n_sm;
}

extern "C" void ns_cuda_set_graphs(ns_backend *be, int on) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    c->graphs_enabled = on;
}

/* Changes a setting that captured graphs embody: they are recaptured. */
static void set_captured_setting(ns_backend *be, int cu_impl::*setting, int on) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    cu_bump_generation(c);
    c->*setting = on;
}

extern "C" void ns_cuda_set_fusion(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::fusion, on); }
extern "C" void ns_cuda_set_dec_fuse(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::dec_fuse, on); }
extern "C" int ns_cuda_get_dec_fuse(ns_backend *be) { return cu_impl_of(be)->dec_fuse; }
extern "C" void ns_cuda_set_dec_early(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::dec_early, on); }
extern "C" int ns_cuda_get_dec_early(ns_backend *be) { return cu_impl_of(be)->dec_early; }
extern "C" void ns_cuda_set_pdl(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::pdl, on); }
extern "C" void ns_cuda_set_pdl_gemv(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::pdl_gemv, on); }
extern "C" int ns_cuda_get_pdl_gemv(ns_backend *be) { return cu_impl_of(be)->pdl_gemv; }
extern "C" void ns_cuda_set_act_nc(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::act_nc, on != 0); }
extern "C" int ns_cuda_get_act_nc(ns_backend *be) { return cu_impl_of(be)->act_nc; }
extern "C" void ns_cuda_set_prefetch(ns_backend *be, int mb) {
    set_captured_setting(be, &cu_impl::prefetch, mb < 0 || mb > 1024 ? 4 : mb);
}
extern "C" int ns_cuda_get_prefetch(ns_backend *be) { return cu_impl_of(be)->prefetch; }
extern "C" void ns_cuda_set_early_loads(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::early_loads, on); }
extern "C" int ns_cuda_get_early_loads(ns_backend *be) { return cu_impl_of(be)->early_loads; }
extern "C" void ns_cuda_set_gemv_bulk(ns_backend *be, int on) {
    /* below compute capability 9.0 it stays off (cu_gemv_bulk_init) */
    set_captured_setting(be, &cu_impl::gemv_bulk, on && cu_impl_of(be)->cc_major >= 9);
}
extern "C" int ns_cuda_get_gemv_bulk(ns_backend *be) { return cu_impl_of(be)->gemv_bulk; }
extern "C" void ns_cuda_set_mlp(ns_backend *be, int on) {
    set_captured_setting(be, &cu_impl::mlp_persist, on < 0 || on > 2 ? 1 : on);
}
extern "C" int ns_cuda_get_mlp(ns_backend *be) { return cu_impl_of(be)->mlp_persist; }
extern "C" void ns_cuda_set_mlp_tail(ns_backend *be, int on) { set_captured_setting(be, &cu_impl::mlp_tail, on != 0); }
extern "C" int ns_cuda_get_mlp_tail(ns_backend *be) { return cu_impl_of(be)->mlp_tail; }
extern "C" void ns_cuda_set_row_fuse(ns_backend *be, int mode) { set_captured_setting(be, &cu_impl::row_fuse, mode & 3); }
extern "C" int ns_cuda_get_row_fuse(ns_backend *be) { return cu_impl_of(be)->row_fuse; }
/* prefill tapes are never captured: a flush is enough */
extern "C" void ns_cuda_set_prefill_lean(ns_backend *be, int mode) {
    cu_flush(be);
    cu_impl_of(be)->prefill_lean = mode & 3;
}
extern "C" int ns_cuda_get_prefill_lean(ns_backend *be) { return cu_impl_of(be)->prefill_lean; }
extern "C" void ns_cuda_prefill_lean_stats(ns_backend *be, int64_t *dropped, int64_t *fused) {
    const cu_impl *c = cu_impl_of(be);
    *dropped = c->stat_f32_dropped;
    *fused = c->stat_gemm_residual;
}

extern "C" void ns_cuda_graph_stats(ns_backend *be, int64_t *replays, int64_t *captures, int64_t *eager) {
    cu_impl *c = cu_impl_of(be);
    *replays = c->stat_replays;
    *captures = c->stat_captures;
    *eager = c->stat_eager;
}

extern "C" void ns_cuda_set_memo(ns_backend *be, int on) {
    cu_impl *c = cu_impl_of(be);
    cu_flush(be);
    c->memo_enabled = on < 0 || on > 2 ? 1 : on;
    c->memo_valid = false;
}
extern "C" int ns_cuda_get_memo(ns_backend *be) { return cu_impl_of(be)->memo_enabled; }
extern "C" int64_t ns_cuda_memo_replays(ns_backend *be) { return cu_impl_of(be)->stat_memo; }
extern "C" int64_t ns_cuda_memo_direct(ns_backend *be) { return cu_impl_of(be)->stat_memo_direct; }

extern "C" int64_t ns_cuda_mlp_probe_stats(ns_backend *be, double ph_us[4][3], double *span_us) {
    return cu_mlp_probe_read(cu_impl_of(be), ph_us, span_us);
}

extern "C" int64_t ns_cuda_gap_stats(ns_backend *be, double *idle_us, double *span_us, double *upload_us,
                                     double *graph_us) {
    cu_impl *c = cu_impl_of(be);
    const int64_t n = c->probe_n;
    *idle_us = n ? 1e3 * c->probe_idle_ms / (double)n : 0;
    *span_us = n ? 1e3 * c->probe_span_ms / (double)n : 0;
    *upload_us = n ? 1e3 * c->probe_upload_ms / (double)n : 0;
    *graph_us = n ? 1e3 * c->probe_graph_ms / (double)n : 0;
    c->probe_idle_ms = c->probe_span_ms = c->probe_upload_ms = c->probe_graph_ms = 0;
    c->probe_n = 0;
    c->probe_prev = false;
    return n;
}

