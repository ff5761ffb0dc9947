/* cuda.h — C-callable extras of the CUDA backend beyond the ns_backend_ops
 * vtable: device facts, ceilings measured on the device (copy bandwidth,
 * bf16 GEMM rate), per-op profiling and graph statistics for the
 * benchmarks. Only declared when the build has CUDA (NS_HAVE_CUDA); every
 * function takes a backend made by ns_backend_cuda_create.
 *
 * Invariant: none of these is called while a step is half enqueued (they
 * may synchronize the stream).
 */
#ifndef NS_BACKEND_CUDA_H
#define NS_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"

/* Free and total device memory, bytes. */
ns_status ns_cuda_mem_info(ns_backend *be, size_t *free_bytes, size_t *total_bytes, ns_error *err);
/* Device name and multiprocessor count (name: at least 64 bytes). */
void ns_cuda_device_desc(ns_backend *be, char *name, size_t name_len, int *n_sm);

/* Device-to-device copy of `bytes`, median over iters; GB/s counting bytes
 * read plus bytes written (2 * bytes per copy). */
ns_status ns_cuda_measure_copy_bw(ns_backend *be, size_t bytes, int iters, double *gbps, ns_error *err);
/* Square bf16 GEMM n x n x n through cuBLASLt (bf16 in/out, fp32
 * accumulate) on random data, median over iters; TFLOP/s. */
ns_status ns_cuda_measure_gemm(ns_backend *be, int n, int iters, double *tflops, ns_error *err);
/* Times the matmul op (out[n,m] = in[n,k] @ w[m,k]^T) with a fresh random
 * bf16 weight; path: 0 = backend's choice, 1 = force cuBLASLt, 2 = force
 * the GEMV kernel. Median milliseconds over iters. */
ns_status ns_cuda_time_matmul(ns_backend *be, int64_t n, int64_t m, int64_t k, int path, int iters, double *ms,
                              ns_error *err);
/* The same with a random weight of type dt (BF16, or a GGUF block type:
 * n <= 8 then runs the quantized GEMV, larger n the dequantization +
 * cuBLASLt path, whatever path says). */
ns_status ns_cuda_time_matmul_dt(ns_backend *be, ns_dtype dt, int64_t n, int64_t m, int64_t k, int path, int iters,
                                 double *ms, ns_error *err);

/* Fills every KV page with random bf16 values (FP8 pools: random finite
 * codes under scale 1/448) (benchmarks of decode at a given context need
 * finite, non-zero KV, not a prefill). */
ns_status ns_cuda_kv_fill_random(ns_backend *be, uint64_t seed, ns_error *err);

/* FP8 KV decode attention (cuda_attn_fp8.cu): 0 = e4m3 codes converted by
 * the hardware e4m3x2 -> f16x2 instruction (default), 1 = by integer bit
 * moves into f16 (scale folded into the page-head scale); env
 * NS_CUDA_FP8_DEC likewise. Process-wide; same results up to fp32
 * rounding. */
void ns_cuda_set_fp8_dec(ns_backend *be, int mode);
/* FP8 KV decode attention splits: where set_batch chose >= 64 splits, use
 * that / div (a power of two in [1, 64]; default 8: each CTA streams 8x
 * the keys); env NS_CUDA_FP8_SPLIT_DIV likewise. Process-wide. */
void ns_cuda_set_fp8_split_div(ns_backend *be, int div);
/* FP8 KV decode attention: 1 = each thread keeps its q values in registers
 * (head dims <= 128, up to 4 query heads per pass; default), 0 = q read
 * from shared memory per use; env NS_CUDA_FP8_QREG likewise. Process-wide;
 * same results up to fp32 summation order. */
void ns_cuda_set_fp8_qreg(ns_backend *be, int on);
/* FP8 KV decode attention on the tensor cores (each staged FP8 tile
 * converted to bf16, then the bf16 mma decode's tile step; head dims 64
 * and 128, up to 8 query heads per kv head, else the CUDA-core kernel):
 * 0 = never, 1 = always, 2 = auto (default: when the step's decode has
 * >= 64 splits, i.e. long contexts and few sequences, where it measured
 * faster); env NS_CUDA_FP8_MMA likewise. Process-wide; same results up to
 * fp32 summation order (q and p split into bf16 hi + lo as in the bf16
 * kernel). */
void ns_cuda_set_fp8_mma(ns_backend *be, int mode);
/* The tensor-core FP8 decode fetches each 64-key tile as whole page
 * segments by bulk copy (on: P dividing 64, compute capability 9.0) or as
 * 16-byte cp.async per row (off); env NS_CUDA_FP8_BULK, default on.
 * Process-wide; same results. */
void ns_cuda_set_fp8_bulk(ns_backend *be, int on);
int ns_cuda_get_fp8_bulk(ns_backend *be);
/* FP8 KV decode attention on the register-tile tensor-core kernel (MMA
 * operands converted from the codes in registers, no 16-bit tile in
 * shared memory; head dim 128, pages of 16/32/64 keys, compute capability
 * 9.0): on (default) wherever it covers the shape, else the choice above;
 * env NS_CUDA_FP8_REG likewise. Process-wide; same results up to fp32
 * summation order. */
void ns_cuda_set_fp8_reg(ns_backend *be, int on);
int ns_cuda_get_fp8_reg(ns_backend *be);

/* CUDA graphs for decode steps: on (default) or off. */
void ns_cuda_set_graphs(ns_backend *be, int on);
/* The step memo (backend.h memo_save / memo_replay): a decode step of the
 * last step's shape reuses its op tape instead of the engine issuing the
 * ops again; on (1, default; env NS_CUDA_MEMO), on without the direct
 * launch below (2, for A/B runs) or off (0). Same results either
 * way. ns_cuda_memo_replays counts the steps that reused a memo;
 * ns_cuda_memo_direct those of them whose graph launched without the tape
 * being assembled, hashed and compared (the memo's link to its graph). */
void ns_cuda_set_memo(ns_backend *be, int on);
int ns_cuda_get_memo(ns_backend *be);
int64_t ns_cuda_memo_replays(ns_backend *be);
int64_t ns_cuda_memo_direct(ns_backend *be);
/* With env NS_CUDA_GAP_PROBE=1 at backend creation, each sampled step is
 * timed by events: *idle_us the mean time the GPU waited between a step's
 * tokens and the next step's metadata upload (host time on the critical
 * path), *span_us the mean time from a step's upload to its tokens, of
 * which *upload_us the upload and *graph_us the step's kernels (the
 * graph's launch included) up to the tokens' copy, if any.
 * Returns the steps measured since the last call (0: probe off) and
 * starts a new count. */
int64_t ns_cuda_gap_stats(ns_backend *be, double *idle_us, double *span_us, double *upload_us, double *graph_us);
/* With env NS_CUDA_MLP_PROBE=1 at backend creation, each launch of the
 * persistent decode MLP (NS_CUDA_MLP) stamps the global timer per CTA at
 * four points: 0 its start (after the wait), 1 its gate/up rows done, 2
 * the grid barrier passed, 3 its down rows done. Returns how many
 * launches were complete since the last call (the last 64 launches; a
 * launch recorded in a CUDA graph reports its latest replay) and clears
 * them; ph_us[i] = {min, median, max} over the CTAs of stamp i, in us
 * after the launch's first start, averaged over those launches; *span_us
 * the mean first start -> last end. 0 when off. A diagnostic: two more
 * block barriers per launch while on. */
int64_t ns_cuda_mlp_probe_stats(ns_backend *be, double ph_us[4][3], double *span_us);
/* Fused kernels for the engine's fixed op sequences in decode steps: on
 * (default) or off. Fused and unfused give the same numbers. */
void ns_cuda_set_fusion(ns_backend *be, int on);
/* With fusion on: the RMSNorm before a decode GEMV group and the residual
 * add after a decode GEMV folded into those GEMVs (batch 1-2, bf16
 * weights; cuda_decode.cu): on or off (default: env NS_CUDA_DEC_FUSE, else
 * off). Same numbers either way. */
void ns_cuda_set_dec_fuse(ns_backend *be, int on);
int ns_cuda_get_dec_fuse(ns_backend *be);
/* With dec_fuse on: those GEMVs, when they follow another GEMV, issue
 * their first weight loads before the PDL wait (env NS_CUDA_DEC_EARLY,
 * default off). Same numbers either way. */
void ns_cuda_set_dec_early(ns_backend *be, int on);
int ns_cuda_get_dec_early(ns_backend *be);
/* Programmatic dependent launch between kernels: on (default) or off. */
void ns_cuda_set_pdl(ns_backend *be, int on);
/* With PDL on: whether a GEMV launched right after another GEMV uses it
 * too (env NS_CUDA_PDL_GEMV, default 0: fully ordered, which measured
 * ~3% faster at 1k batch 1, docs/cuda.md v18); 1 = PDL there too; 2 = PDL
 * there, with the bf16 GEMVs signalling their dependents after their
 * main loop instead of at entry. Same numbers either way. */
void ns_cuda_set_pdl_gemv(ns_backend *be, int on);
int ns_cuda_get_pdl_gemv(ns_backend *be);
/* Decode kernels' activation loads through ld.global.nc (1, env
 * NS_CUDA_ACT_NC default) or ld.global.cg (0). Same numbers either way. */
void ns_cuda_set_act_nc(ns_backend *be, int on);
int ns_cuda_get_act_nc(ns_backend *be);
/* L2 prefetch of the next GEMVs' weights by the small decode kernels
 * (add + RMSNorm, q/k-norm + RoPE + store): the first mb MB of them
 * (0 = off, default 4, at most 2/3 of L2 per kernel); env
 * NS_CUDA_PREFETCH likewise. Same results; for A/B runs. */
void ns_cuda_set_prefetch(ns_backend *be, int mb);
int ns_cuda_get_prefetch(ns_backend *be);
/* Small kernels of decode tapes (add+RMSNorm, q/k-norm+RoPE+KV store,
 * decode attention) read constants and batch metadata before their PDL
 * wait, overlapping the previous kernel: on (default; env
 * NS_CUDA_EARLY_LOADS) or off. Off from run B to v18: with them on, the
 * q/k-norm + RoPE + store kernel read v through .nc loads that ptxas
 * placed above its PDL wait (docs/cuda.md v18); those loads are coherent
 * now. */
void ns_cuda_set_early_loads(ns_backend *be, int on);
int ns_cuda_get_early_loads(ns_backend *be);
/* Batch 1-2 GEMVs fed by bulk copies into a shared-memory ring, one
 * persistent CTA per SM (cuda_gemv_bulk.cu; env NS_CUDA_GEMV_BULK,
 * default off; never below compute capability 9.0) or the register-streaming
 * GEMV. Results agree to float rounding; for A/B runs. */
void ns_cuda_set_gemv_bulk(ns_backend *be, int on);
int ns_cuda_get_gemv_bulk(ns_backend *be);
/* The dense MLP block of batch 1-2 decode steps (gate/up + SwiGLU, down)
 * as one persistent kernel with a grid barrier instead of two GEMV
 * launches (cuda_mlp.cu; env NS_CUDA_MLP): 1 = on (default), launched
 * without programmatic dependent launch; 2 = on, with it; 0 = off.
 * Bit-identical results in every mode; for A/B runs. */
void ns_cuda_set_mlp(ns_backend *be, int on);
int ns_cuda_get_mlp(ns_backend *be);
/* With it on: the residual add, the next layer's RMSNorm and its q/k/v
 * GEMVs in the same kernel after a second grid barrier, every CTA
 * normalizing the row itself (env NS_CUDA_MLP_TAIL, default off: measured
 * slower, docs/cuda.md v27). Bit-identical either way; for A/B runs. */
void ns_cuda_set_mlp_tail(ns_backend *be, int on);
int ns_cuda_get_mlp_tail(ns_backend *be);
/* The step's first and last row ops as one kernel each (env
 * NS_CUDA_ROW_FUSE, default 3): bit 1 = embed + the first RMSNorm, bit 2 =
 * the last residual add + gather of the logits rows + the final RMSNorm.
 * Bit-identical either way; 0 for A/B runs (docs/cuda.md v32). */
void ns_cuda_set_row_fuse(ns_backend *be, int mode);
int ns_cuda_get_row_fuse(ns_backend *be);
/* Prefill and mixed steps only (env NS_CUDA_PREFILL_LEAN, default 3): bit
 * 1 = an RMSNorm / SwiGLU output that only GEMMs read (through its bf16
 * copy) is not written as F32; bit 2 = the output and down projections add
 * into the residual inside the GEMM instead of a separate add. The same
 * logits bit for bit; less memory traffic. *dropped / *fused count the
 * F32 outputs skipped and the projections fused since the backend started. */
void ns_cuda_set_prefill_lean(ns_backend *be, int mode);
int ns_cuda_get_prefill_lean(ns_backend *be);
void ns_cuda_prefill_lean_stats(ns_backend *be, int64_t *dropped, int64_t *fused);
/* Prefill attention on Hopper (wgmma, warp-specialized; head dim 128,
 * even GQA ratio, compute capability 9.0): 0 = off (the mma.sync kernel);
 * on: 1 = S, softmax, PV in order per tile, 2 = pipelined (S of
 * tile k issued with PV of tile k - 1), 3 = pipelined with ping-pong
 * between the consumer warp groups; 4, 5, 6 = 1, 2, 3 with one producer
 * warp per K/V stage; 7 = 1 with the consumer groups started half a tile
 * apart; 8, 9 = 1, 3 with K/V tiles fetched by TMA (one tensor-map box per
 * page and 64-dim half; pages of 8, 16, 32, 64 or 128 tokens, else as 1,
 * 3); 10 = 8 with the two head pairs of a KV head as
 * a 2-CTA cluster fetching each K/V tile once by multicast (GQA ratio a
 * multiple of 4, else as 8); 11 = 10 with 9's consumers (else as 9);
 * 12 = 8 with 7's offset groups, 13 = 8 pipelined without ping-pong (the
 * default: docs/cuda.md v25), 14,
 * 15 = 12, 9 with the lean softmax (tree maxima, partial row sums, a
 * quarter of the exponentials by polynomial on the FMA pipe; docs/cuda.md
 * v22); without a tensor map 12, 14 run as 7, 13 as 2, 15 as 3. Env
 * NS_CUDA_ATTN_SM90 takes the same values. For A/B runs and tests; all
 * give the same results within bf16 rounding. */
void ns_cuda_set_attn_sm90(ns_backend *be, int on);
/* Decode attention on tensor cores (mma.sync; the GQA group's query heads
 * as the MMA N dimension, each K/V tile read once per group): 1 = where it
 * applies (default: head dim 64 or 128, GQA <= 8; it measured faster than
 * the CUDA-core kernel at every context from 256 keys, docs/cuda.md v26),
 * 2 = always (the same since v26), 0 = never (CUDA cores); env
 * NS_CUDA_ATTN_DEC_MMA likewise. */
void ns_cuda_set_attn_dec_mma(ns_backend *be, int on);
/* How the tensor-core decode kernel copies its K/V tiles: 0 = 16-byte
 * cp.async, page ids looked up per tile, 1 = the same with page ids
 * loaded a tile ahead, 2 = one cp.async.bulk per K/V row on an mbarrier
 * (compute capability >= 9.0, 1 elsewhere), 3 = 2 with
 * the next copies issued before the wait (two tiles in flight during it;
 * >= 9.0, else 1), 4 = whole pages by TMA through a tensor map of the
 * pool (the default; head dim 128, pages of 8-64 tokens, else as 2;
 * >= 9.0, else 1); env
 * NS_CUDA_DEC_LOAD likewise. Same results bit for bit; for A/B runs and
 * tests. */
void ns_cuda_set_attn_dec_load(ns_backend *be, int mode);
void ns_cuda_graph_stats(ns_backend *be, int64_t *replays, int64_t *captures, int64_t *eager);

/* Per-op timing with events (forces eager execution while on). */
void ns_cuda_set_profiling(ns_backend *be, int on);
/* Prints "label calls total_ms" lines sorted by time, then resets. */
void ns_cuda_profile_report(ns_backend *be, FILE *f);

#endif
