/* cuda_attn_sm90.cu — prefill attention for Hopper (sm_90a), head dim 128.
 *
 * FlashAttention-3 style: one CTA = three warp groups.
 * - Warp group 0 (producer) fills K/V tiles of S9_BN keys from the paged
 *   pool into 128-byte-swizzled shared memory (the layout wgmma reads
 *   without bank conflicts), S9_STAGES deep, and signals each stage on a
 *   "full" mbarrier; it waits on the stage's "empty" mbarrier before
 *   overwriting it. Variants 8-15: one warp issues TMA boxes of one
 *   page and 64 dims through a tensor map over the pool (s9_producer_tma;
 *   a tile's last partial part goes through cp.async, zero-filled).
 *   Variants 1-7: cp.async, 16 threads per key row so every instruction
 *   of a warp reads two whole 256-byte rows; one page lookup per (thread,
 *   row), shared by K and V.
 * - Warp groups 1 and 2 (consumers) each own one query head of the same
 *   KV head (GQA: the two heads share every K/V tile, halving K/V traffic
 *   per head) for the same 64 query rows (a tile of set_batch's tile
 *   list). S = Q K^T with wgmma m64n128k16 (Q and K from shared memory),
 *   online softmax in fp32 registers (exp2 domain), P rounded to bf16 and
 *   fed from registers to O += P V (wgmma, V transposed from shared
 *   memory). Causal: key tiles stop at the tile's last row; only tiles
 *   that cross a row's position are masked.
 * Registers: setmaxnreg moves the producer to 56 and the consumers to
 * 224 per thread (S and O accumulators are 64 fp32 each).
 *
 * Same semantics as the other prefill kernels (cuda_attention.cu): query
 * at position p attends keys [0, p]; the chunk's rows start at position
 * seq_len - n; Q rounded to bf16, softmax and accumulation fp32.
 *
 * Failure containment: every mbarrier wait is bounded (S9_SPIN_MAX
 * polls, each of which may suspend the thread for a while in hardware)
 * and traps when exceeded, so a broken pipeline fails the launch with an
 * error instead of hanging the stream.
 *
 * Built for sm_90a only (wgmma and setmaxnreg do not exist elsewhere);
 * cu_attention selects it only on compute capability 9.0.
 */
#include <cuda.h> /* the driver API's CUtensorMap types; the encoder is fetched through the runtime (no -lcuda) */
#include <string.h>

#include "backend/cuda/cuda_internal.cuh"

#define S9_BM 64       /* query rows per consumer warp group */
#define S9_BN 128      /* keys per K/V tile */
#define S9_D 128       /* head dim */
#define S9_STAGES 3
#define S9_Q_BYTES (2 * S9_BM * 128)  /* one consumer's Q: two 64-column halves */
#define S9_KV_BYTES (2 * S9_BN * 128) /* one K or V tile */
#define S9_SMEM (1024 + 2 * S9_Q_BYTES + 2 * S9_STAGES * S9_KV_BYTES + 64)
#define S9_SPIN_MAX (1u << 22)
static_assert(S9_STAGES <= 4, "one producer warp per stage");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define S9_ENABLED 1
#else
#define S9_ENABLED 0
#endif

#if S9_ENABLED
/* ------------------------------------------------------------ primitives */

__device__ __forceinline__ uint32_t s9_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void s9_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void s9_mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* Waits until the phase with the given parity of bar has completed. */
__device__ __forceinline__ void s9_mbar_wait(uint32_t bar, uint32_t parity) {
    for (uint32_t i = 0; i < S9_SPIN_MAX; i++) {
        uint32_t done;
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
        if (done) return;
    }
    __trap(); /* pipeline broken: fail the launch rather than hang */
}
__device__ __forceinline__ void s9_cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void s9_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Arrives on bar and adds bytes to the transaction count its phase waits for. */
__device__ __forceinline__ void s9_mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void s9_named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ uint32_t s9_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Shared-memory matrix descriptor, 128-byte swizzle. lbo/sbo in bytes. */
__device__ __forceinline__ uint64_t s9_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

/* Byte offset of 16-byte chunk c (0..15) of row r in a [rows][128 bf16]
 * tile kept as two [rows][64] halves with 128-byte rows, 128-byte swizzle
 * (chunk index XOR row mod 8), as wgmma's SW128 layouts expect. Buffers
 * are 1024-byte aligned. */
__device__ __forceinline__ uint32_t s9_sw(int rows, int r, int c) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void s9_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void s9_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

/* D[64x128] (+)= A[64x16] * B[16x128]; A and B K-major in shared memory
 * (descriptors), fp32 accumulate; scale_d = 0 overwrites D. */
__device__ __forceinline__ void wgmma_ss_m64n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

/* D[64x128] = A[64x16] * B[16x128] (scale-d 0: D is only written, so the
 * accumulator registers are not inputs of this wgmma — ptxas serializes
 * every wgmma when an input register is written by other instructions
 * while any wgmma is in flight, as the masking of the previous scores is
 * in the pipelined variant). */
__device__ __forceinline__ void wgmma_ss_m64n128_first(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 0, 1, 1, 0, 0;\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
        : "l"(da), "l"(db));
}
/* D[64x128] += A[64x16] * B[16x128]; A in registers (the m16n8k16 A
 * fragment layout per warp), B MN-major in shared memory (transposed). */
__device__ __forceinline__ void wgmma_rs_m64n128_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* Waits for all of this warp group's wgmma; the accumulator registers are
 * operands so the compiler cannot move their uses above the wait. */
__device__ __forceinline__ void wgmma_wait0(float (&d)[64]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) :: "memory");
}
/* Waits until at most one wgmma group of this warp group is pending (the
 * older group, whose accumulators are d, is complete). */
__device__ __forceinline__ void wgmma_wait1(float (&d)[64]) {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) :: "memory");
}
/* Orders register writes before the next wgmma reads them (accumulators). */
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[64]) {
    asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) :: "memory");
}

/* Cluster variant (10): the two CTAs of a cluster are the two head pairs
 * of one KV head on the same query tile, so they read the same K/V tiles;
 * each fetches one 64-dim half of every page with a multicast TMA that
 * lands in both CTAs' shared memory (halving L2-to-SM traffic) and
 * signals both CTAs' "full" barriers. A stage is then free only when the
 * consumers of both CTAs are done with it: lane 0 of every consumer warp
 * arrives on the "empty" barrier of both CTAs (16 arrivals). */
__device__ __forceinline__ uint32_t s9_cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void s9_mbar_arrive_cta(uint32_t bar, uint32_t cta) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(bar), "r"(cta));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(r) : "memory");
}
__device__ __forceinline__ void s9_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void s9_tma_2d_mc(uint32_t dst, const CUtensorMap *m, int x, int y, uint32_t bar,
                                             uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
                 "{%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(bar), "h"(mask)
                 : "memory");
}
/* A consumer's release of a stage once its wgmma reads are complete: every
 * thread arrives (count 256), or with CL lane 0 of each warp arrives on
 * both CTAs' barriers (count 16). */
template <bool CL>
__device__ __forceinline__ void s9_release(uint32_t bar) {
    if constexpr (!CL) {
        s9_mbar_arrive(bar);
    } else {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) {
            s9_mbar_arrive_cta(bar, 0);
            s9_mbar_arrive_cta(bar, 1);
        }
    }
}

/* ---------------------------------------------------------------- kernel */

/* One 16-byte chunk (c of 16) of key `key`'s K and V rows into row r of
 * the stage at kd/vd: the page-table lookup (shift for power-of-two
 * pages), then two cp.async; keys past n_keys are zero-filled. Shared by
 * both producer layouts. */
__device__ __forceinline__ void s9_copy_kv_chunk(const cu_sm90_params &p, const int32_t *pt, int kvh, int key,
                                                 int n_keys, uint32_t kd, uint32_t vd, int r, int c) {
    const bool ok = key < n_keys;
    const uint8_t *src = p.kv;
    if (ok) {
        int pi, slot;
        if (p.P_shift >= 0) {
            pi = key >> p.P_shift;
            slot = key & (p.P - 1);
        } else {
            pi = key / p.P;
            slot = key - pi * p.P;
        }
        src = p.kv + (size_t)pt[pi] * p.page_bytes + p.k_off + (size_t)kvh * p.head_bytes +
              (size_t)slot * ((size_t)S9_D * 2) + (size_t)c * 16;
    }
    const uint32_t off = s9_sw(S9_BN, r, c);
    s9_cp_async16(kd + off, src, ok ? 16 : 0);
    s9_cp_async16(vd + off, ok ? src + (p.v_off - p.k_off) : src, ok ? 16 : 0);
}

/* Producer: K/V tiles 0..nt-1 of kv head kvh of sequence s into the two
 * stages. Tile kt's "full" barrier is arrived by all 128 producer threads
 * once their own copies of it have landed (cp.async.wait_group) and been
 * made visible to the async proxy that wgmma reads through. */
__device__ __forceinline__ void s9_producer(const cu_sm90_params &p, uint8_t *smem, uint32_t bar_full,
                                            uint32_t bar_empty, int s, int kvh, int n_keys, int nt) {
    const int tid = threadIdx.x; /* 0..127 */
    const int c = tid & 15, rb = tid >> 4;
    const uint32_t kbase = s9_smem_addr(smem + 2 * S9_Q_BYTES), vbase = kbase + S9_STAGES * S9_KV_BYTES;
    const int32_t *pt = p.page_table + (size_t)s * p.pt_stride;
    for (int kt = 0; kt < nt; kt++) {
        const int st = kt % S9_STAGES;
        if (kt >= S9_STAGES) s9_mbar_wait(bar_empty + 8 * st, (kt / S9_STAGES - 1) & 1);
        const uint32_t kd = kbase + st * S9_KV_BYTES, vd = vbase + st * S9_KV_BYTES;
#pragma unroll 4
        for (int j = 0; j < S9_BN / 8; j++) {
            const int r = rb + 8 * j;
            s9_copy_kv_chunk(p, pt, kvh, kt * S9_BN + r, n_keys, kd, vd, r, c);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (kt > 0) {
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            s9_fence_async_smem();
            s9_mbar_arrive(bar_full + 8 * ((kt - 1) % S9_STAGES));
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    s9_fence_async_smem();
    s9_mbar_arrive(bar_full + 8 * ((nt - 1) % S9_STAGES));
}

/* Producer, one warp per stage: warp w of the producer group fills the
 * tiles of stage w (w, w + S9_STAGES, ...) on its own (16 lanes per row,
 * two rows per instruction), waits for its copies and arrives on the
 * stage's "full" barrier (32 arrivals); the last warp idles. The warps do
 * not wait for each other, so all stages can be in flight at once (with
 * the whole group on every tile, a tile's signal waits until the group
 * has issued the next one and at most two tiles are in flight). One warp
 * per stage, not per tile: a warp that owned tiles of several stages
 * could reach a stage's "empty" wait two phases early, and a parity wait
 * cannot tell phase k from phase k + 2 (it passed at once and the warp
 * overwrote a stage in use: run 2 trapped there). */
__device__ __forceinline__ void s9_producer_warps(const cu_sm90_params &p, uint8_t *smem, uint32_t bar_full,
                                                  uint32_t bar_empty, int s, int kvh, int n_keys, int nt) {
    const int pw = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c = lane & 15, rb = lane >> 4;
    const uint32_t kbase = s9_smem_addr(smem + 2 * S9_Q_BYTES), vbase = kbase + S9_STAGES * S9_KV_BYTES;
    const int32_t *pt = p.page_table + (size_t)s * p.pt_stride;
    if (pw >= S9_STAGES) return;
    for (int kt = pw; kt < nt; kt += S9_STAGES) {
        const int st = pw;
        if (kt >= S9_STAGES) s9_mbar_wait(bar_empty + 8 * st, (kt / S9_STAGES - 1) & 1);
        const uint32_t kd = kbase + st * S9_KV_BYTES, vd = vbase + st * S9_KV_BYTES;
#pragma unroll 4
        for (int j = 0; j < S9_BN / 2; j++) {
            const int r = rb + 2 * j;
            s9_copy_kv_chunk(p, pt, kvh, kt * S9_BN + r, n_keys, kd, vd, r, c);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        s9_fence_async_smem();
        s9_mbar_arrive(bar_full + 8 * st);
    }
}

/* Producer with TMA (variants 8, 9): every tile whose 128 keys all lie
 * below n_keys is fetched by one warp as 4 x 128 / P tensor-map boxes
 * (K and V, two 64-dim halves, one page of P rows each; the map views the
 * pool as rows of 128 bf16 with a 128-byte swizzle, so a box lands in
 * exactly the SW128 layout s9_sw describes, pages at 1024-byte aligned
 * offsets): ~32 copy instructions per tile instead of 4096 cp.async and
 * their address arithmetic. Lane 0 arms the stage's "full" barrier with
 * the tile's bytes; the other 127 producer threads just arrive. The last,
 * partial tile goes through the cp.async path, which zero-fills the keys
 * past n_keys (pool slots past a sequence's end hold stale bytes or the
 * NaN poison, and a zero probability times NaN is NaN). Selected only when
 * P divides 128 and is a multiple of 8 (cu_attn_prefill_sm90). */
template <bool MC>
__device__ __forceinline__ void s9_producer_tma(const cu_sm90_params &p, const CUtensorMap *tm, uint8_t *smem,
                                                uint32_t bar_full, uint32_t bar_empty, int s, int kvh, int n_keys,
                                                int nt) {
    const int tid = threadIdx.x, lane = tid & 31;
    const int rank = MC ? (int)s9_cluster_rank() : 0; /* MC: this CTA fetches half `rank` of every page */
    const int c = tid & 15, rb = tid >> 4;
    const uint32_t kbase = s9_smem_addr(smem + 2 * S9_Q_BYTES), vbase = kbase + S9_STAGES * S9_KV_BYTES;
    const int32_t *pt = p.page_table + (size_t)s * p.pt_stride;
    const int ppt = S9_BN / p.P; /* pages per tile */
    const long long page_rows = (long long)(p.page_bytes / 256);
    const long long row_k = (long long)((p.k_off + (size_t)kvh * p.head_bytes) / 256);
    const long long row_v = (long long)((p.v_off + (size_t)kvh * p.head_bytes) / 256);
    for (int kt = 0; kt < nt; kt++) {
        const int st = kt % S9_STAGES;
        if (kt >= S9_STAGES) s9_mbar_wait(bar_empty + 8 * st, (kt / S9_STAGES - 1) & 1);
        const uint32_t kd = kbase + st * S9_KV_BYTES, vd = vbase + st * S9_KV_BYTES, bf = bar_full + 8 * st;
        if ((kt + 1) * S9_BN <= n_keys) {
            if (tid < 32) {
                if (lane == 0) s9_mbar_expect(bf, 2 * S9_KV_BYTES);
                __syncwarp();
                for (int op = MC ? 2 * lane + rank : lane; op < 4 * ppt; op += MC ? 64 : 32) {
                    const int is_v = op >= 2 * ppt, i = (op % (2 * ppt)) >> 1, half = op & 1;
                    const long long page = pt[kt * ppt + i];
                    const int y = (int)(page * page_rows + (is_v ? row_v : row_k));
                    const uint32_t dst = (is_v ? vd : kd) + half * (S9_BN * 128) + i * p.P * 128;
                    if constexpr (MC) s9_tma_2d_mc(dst, tm, half * 64, y, bf, (uint16_t)3);
                    else cu_tma_2d(dst, tm, half * 64, y, bf);
                }
                if (lane != 0) s9_mbar_arrive(bf);
            } else {
                s9_mbar_arrive(bf);
            }
        } else {
#pragma unroll 4
            for (int j = 0; j < S9_BN / 8; j++) {
                const int r = rb + 8 * j;
                s9_copy_kv_chunk(p, pt, kvh, kt * S9_BN + r, n_keys, kd, vd, r, c);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            s9_fence_async_smem();
            s9_mbar_arrive(bf);
        }
    }
}

/* Per-thread softmax state of one consumer: rows rl0 and rl0 + 8 of the
 * warp group's 64 (o/sc[4i+0,1] and [4i+2,3]). */
struct s9_rows {
    float m0, m1, l0, l1;
    int rpos0, rpos1, warp_min_pos, lane;
};

/* S = Q K^T for the K tile at ka (not waited for): 8 k-steps of 16 dims;
 * a step's 32 bytes sit inside one 128-byte swizzle row (the halves of 64
 * dims are separate blocks). */
__device__ __forceinline__ void s9_issue_s(float (&sc)[64], uint32_t qaddr, uint32_t ka) {
    s9_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < S9_D / 16; kk++) {
        const uint32_t off = (kk & 3) * 32;
        const uint64_t da = s9_desc(qaddr + (kk >> 2) * (S9_BM * 128) + off, 16, 1024);
        const uint64_t db = s9_desc(ka + (kk >> 2) * (S9_BN * 128) + off, 16, 1024);
        if (kk == 0) wgmma_ss_m64n128_first(sc, da, db);
        else wgmma_ss_m64n128(sc, da, db, 1);
    }
    s9_wgmma_commit();
}

/* O += P V for the V tile at va (not waited for): 8 k-steps of 16 keys; V
 * is MN-major (dims contiguous): the two 64-dim halves are LBO apart,
 * 8-key groups 1024 bytes. */
__device__ __forceinline__ void s9_issue_pv(float (&o)[64], const uint32_t (&pa)[S9_BN / 16][4], uint32_t va) {
    s9_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < S9_BN / 16; kk++) {
        const uint64_t db = s9_desc(va + kk * 16 * 128, S9_BN * 128, 1024);
        wgmma_rs_m64n128_tb(o, pa[kk], db);
    }
    s9_wgmma_commit();
}

/* 2^x on the special function unit, flushing denormals (exp2f adds a
 * range fix-up of three instructions around it; probabilities below
 * 2^-126 do not matter next to the row's maximum of 1). */
__device__ __forceinline__ float s9_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 2^x for x <= 0 on the FMA and integer pipes instead of the SFU (FA4's
 * trick, variants 12-15's lean softmax): x = j + f with j = round(x) by
 * the 1.5 * 2^23 shift, 2^f on [-0.5, 0.5] by a degree-3 polynomial
 * (coefficients fitted for relative error, max 7.5e-5: far below the bf16
 * rounding of P, 3.9e-3), then j added to the exponent bits: one IMAD of
 * t's bits (whose low bits are j) times 2^23. x is clamped at -125 so a
 * masked score (-inf) gives 2^-125 (a normal float, ~2e-38; next to the
 * row maximum's 1 it is nothing) instead of the NaN the shift would make.
 * Why: the profile (docs/cuda.md v22) shows the SFU queue as a fifth of
 * the softmax's stalls, one EX2 per score at 8 cycles per warp
 * instruction per scheduler. */
__device__ __forceinline__ float s9_ex2_poly(float x) {
    x = fmaxf(x, -125.f);
    const float t = x + 12582912.f; /* 1.5 * 2^23: t's low mantissa bits = round(x) */
    const float f = x - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.0551716685f, f, 0.242611125f), f, 0.693260968f), f, 0.999928057f);
    return __int_as_float(__float_as_int(t) * (1 << 23) + __float_as_int(p));
}

/* Online softmax of the scores of key tile kt: masks keys past each row's
 * position, updates m (kept unscaled: the scale is positive, so the max
 * commutes with it and each probability is one FFMA + EX2) and l, writes
 * P (bf16, the wgmma A-fragment layout) and returns the factors a0/a1 that
 * the previous O must be scaled by. The softmax is a large share of the
 * instructions per tile next to the wgmma time (one EX2 per score, 16 per
 * clock per SM), hence the lean form. */
/* LEAN (variants 12-15): the row maxima as trees instead of two chains of
 * 16 dependent FMNMX, the row sums in four partial sums each, and one n8
 * block in four (a quarter of the exponentials) through s9_ex2_poly, so
 * the SFU and the FMA pipe share the exponentials. Measured 2.3% slower
 * than the plain form at 32k (docs/cuda.md v22): kept for A/B runs. */
template <bool LEAN>
__device__ __forceinline__ void s9_softmax(float (&sc)[64], uint32_t (&pa)[S9_BN / 16][4], s9_rows &r, int kt,
                                           float scale_log2, float &a0, float &a1) {
    const int kb = kt * S9_BN;
    if (kb + S9_BN - 1 > r.warp_min_pos) {
#pragma unroll
        for (int i = 0; i < S9_BN / 8; i++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kb + i * 8 + (r.lane & 3) * 2 + (e & 1);
                if (key > (e < 2 ? r.rpos0 : r.rpos1)) sc[4 * i + e] = -INFINITY;
            }
        }
    }
    float mx0 = r.m0, mx1 = r.m1;
    if constexpr (LEAN) {
        float t0[S9_BN / 8], t1[S9_BN / 8];
#pragma unroll
        for (int i = 0; i < S9_BN / 8; i++) {
            t0[i] = fmaxf(sc[4 * i], sc[4 * i + 1]);
            t1[i] = fmaxf(sc[4 * i + 2], sc[4 * i + 3]);
        }
        /* four levels, strides 8 4 2 1, each a constant (a stride loop
         * was left rolled and put t0/t1 in local memory) */
#define S9_TREE_LEVEL(W)                         \
    _Pragma("unroll") for (int i = 0; i < (W); i++) { \
        t0[i] = fmaxf(t0[i], t0[i + (W)]);       \
        t1[i] = fmaxf(t1[i], t1[i + (W)]);       \
    }
        static_assert(S9_BN / 8 == 16, "the tree below has four levels");
        S9_TREE_LEVEL(8)
        S9_TREE_LEVEL(4)
        S9_TREE_LEVEL(2)
        S9_TREE_LEVEL(1)
#undef S9_TREE_LEVEL
        mx0 = fmaxf(mx0, t0[0]);
        mx1 = fmaxf(mx1, t1[0]);
    } else {
#pragma unroll
        for (int i = 0; i < S9_BN / 8; i++) {
            mx0 = fmaxf(mx0, fmaxf(sc[4 * i], sc[4 * i + 1]));
            mx1 = fmaxf(mx1, fmaxf(sc[4 * i + 2], sc[4 * i + 3]));
        }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* tile 0 always holds key 0, which every row sees, and tiles run in
     * order: m is finite from then on, so a fully masked row in a later
     * tile gives 2^(-inf) = 0, never NaN; the first tile's factor is
     * 2^(-inf) = 0 against O = 0 */
    a0 = s9_ex2((r.m0 - mx0) * scale_log2);
    a1 = s9_ex2((r.m1 - mx1) * scale_log2);
    r.m0 = mx0;
    r.m1 = mx1;
    const float b0 = -mx0 * scale_log2, b1 = -mx1 * scale_log2;
    float rs0 = 0.f, rs1 = 0.f;
    float ps0[4] = {0.f, 0.f, 0.f, 0.f}, ps1[4] = {0.f, 0.f, 0.f, 0.f}; /* LEAN's partial sums */
#pragma unroll
    for (int i = 0; i < S9_BN / 8; i++) {
        float e0, e1, e2, e3;
        if (LEAN && (i & 3) == 3) {
            e0 = s9_ex2_poly(fmaf(sc[4 * i], scale_log2, b0));
            e1 = s9_ex2_poly(fmaf(sc[4 * i + 1], scale_log2, b0));
            e2 = s9_ex2_poly(fmaf(sc[4 * i + 2], scale_log2, b1));
            e3 = s9_ex2_poly(fmaf(sc[4 * i + 3], scale_log2, b1));
        } else {
            e0 = s9_ex2(fmaf(sc[4 * i], scale_log2, b0));
            e1 = s9_ex2(fmaf(sc[4 * i + 1], scale_log2, b0));
            e2 = s9_ex2(fmaf(sc[4 * i + 2], scale_log2, b1));
            e3 = s9_ex2(fmaf(sc[4 * i + 3], scale_log2, b1));
        }
        if constexpr (LEAN) {
            ps0[i & 3] += e0 + e1;
            ps1[i & 3] += e2 + e3;
        } else {
            rs0 += e0 + e1;
            rs1 += e2 + e3;
        }
        /* the S accumulator layout of n8 block i is the A-fragment layout
         * of keys [16(i/2), 16(i/2)+16): regs 0/1 from even i, 2/3 from
         * odd i */
        pa[i >> 1][(i & 1) * 2 + 0] = s9_pack_bf16(e0, e1);
        pa[i >> 1][(i & 1) * 2 + 1] = s9_pack_bf16(e2, e3);
    }
    if constexpr (LEAN) {
        rs0 = (ps0[0] + ps0[1]) + (ps0[2] + ps0[3]);
        rs1 = (ps1[0] + ps1[1]) + (ps1[2] + ps1[3]);
    }
    r.l0 = r.l0 * a0 + rs0;
    r.l1 = r.l1 * a1 + rs1;
}

/* O *= a per row; skipped when no row of the warp changed its maximum
 * (the common case once the first tiles are done). */
__device__ __forceinline__ void s9_scale_o(float (&o)[64], float a0, float a1) {
    if (!__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) return;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        o[4 * i] *= a0;
        o[4 * i + 1] *= a0;
        o[4 * i + 2] *= a1;
        o[4 * i + 3] *= a1;
    }
}

/* Consumer warp group w (0/1): query head h, rows [q0, q0 + rows) of the
 * sequence's chunk. PIPE: the S product of tile kt is issued together
 * with the PV product of tile kt - 1, so the softmax of tile kt runs
 * while the tensor cores do PV (FA3's intra-warpgroup overlap; P of two
 * tiles live in registers). Without PIPE each tile runs S, softmax, PV
 * in order (the two consumer warp groups still overlap each other).
 * PINGPONG (with PIPE): the two consumer warp groups take turns issuing
 * their products (named barriers 3 and 4, FA3's warp-scheduler barrier),
 * so one group's softmax runs while the other's products use the tensor
 * cores. Each group passes the turn after each of its nt + 1 issue points
 * except group 1's last, so every barrier phase completes before exit. */
template <bool PIPE, bool PINGPONG, bool OFFSET, bool CL, bool LEAN>
__device__ __forceinline__ void s9_consumer(const cu_sm90_params &p, uint8_t *smem, uint32_t bar_full,
                                            uint32_t bar_empty, int w, int h, int t0, int q0, int rows, int pos0,
                                            int nt) {
    const int ct = threadIdx.x - 128 * (w + 1); /* 0..127 */
    const int warp = ct >> 5, lane = ct & 31;
    uint8_t *qs = smem + w * S9_Q_BYTES;
    /* Q rows -> bf16, swizzled; rows past the chunk are zeros */
    {
        const int c = ct & 15, rb = ct >> 4;
#pragma unroll 2
        for (int j = 0; j < S9_BM / 8; j++) {
            const int r = rb + 8 * j;
            uint4 u = make_uint4(0, 0, 0, 0);
            if (r < rows) {
                const float4 *src =
                    reinterpret_cast<const float4 *>(p.q + (size_t)(t0 + q0 + r) * p.q_stride + (size_t)h * S9_D + c * 8);
                const float4 a = src[0], b = src[1];
                u.x = s9_pack_bf16(a.x, a.y);
                u.y = s9_pack_bf16(a.z, a.w);
                u.z = s9_pack_bf16(b.x, b.y);
                u.w = s9_pack_bf16(b.z, b.w);
            }
            *reinterpret_cast<uint4 *>(qs + s9_sw(S9_BM, r, c)) = u;
        }
    }
    s9_fence_async_smem();
    s9_named_sync(1 + w, 128);

    const uint32_t qaddr = s9_smem_addr(qs);
    const uint32_t kbase = s9_smem_addr(smem + 2 * S9_Q_BYTES), vbase = kbase + S9_STAGES * S9_KV_BYTES;
    float o[64], sc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = sc[i] = 0.f;
    s9_rows r;
    r.m0 = r.m1 = -INFINITY;
    r.l0 = r.l1 = 0.f;
    const int rl0 = warp * 16 + (lane >> 2);
    r.rpos0 = pos0 + rl0;
    r.rpos1 = r.rpos0 + 8;
    r.warp_min_pos = pos0 + warp * 16;
    r.lane = lane;
    float a0, a1;

    if constexpr (!PIPE) {
        for (int kt = 0; kt < nt; kt++) {
            const int st = kt % S9_STAGES;
            s9_mbar_wait(bar_full + 8 * st, (kt / S9_STAGES) & 1);
            /* OFFSET: group 1 starts once group 0's first S product is
             * done, so the groups run half a tile apart (one's softmax
             * while the other's products use the tensor cores) instead
             * of in lockstep off the same "full" barrier; both have the
             * same nt, so the one arrive meets the one sync */
            if constexpr (OFFSET) {
                if (w == 1 && kt == 0) asm volatile("bar.sync 3, 256;\n" ::: "memory");
            }
            s9_issue_s(sc, qaddr, kbase + st * S9_KV_BYTES);
            wgmma_wait0(sc);
            if constexpr (OFFSET) {
                if (w == 0 && kt == 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
            }
            uint32_t pa[S9_BN / 16][4];
            s9_softmax<LEAN>(sc, pa, r, kt, p.scale_log2, a0, a1);
            s9_scale_o(o, a0, a1);
            wgmma_fence_regs(o);
            s9_issue_pv(o, pa, vbase + st * S9_KV_BYTES);
            wgmma_wait0(o);
            s9_release<CL>(bar_empty + 8 * st);
        }
    } else {
        /* turn-taking: wait for my turn, issue, hand the turn over */
        auto my_turn = [&]() {
            if constexpr (PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(3 + w) : "memory");
        };
        auto pass_turn = [&](bool last) {
            if constexpr (PINGPONG) {
                if (!(last && w == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(4 - w) : "memory");
            }
        };
        if constexpr (PINGPONG) {
            if (w == 1) asm volatile("bar.arrive 3, 256;\n" ::: "memory"); /* group 0 goes first */
        }
        /* P of tile k lives in pb[k & 1] (two named buffers, the loop
         * unrolled by two): copying a new P into the buffer a PV product
         * reads made ptxas serialize every wgmma (C7513) */
        uint32_t pb0[S9_BN / 16][4], pb1[S9_BN / 16][4];
        s9_mbar_wait(bar_full, 0);
        my_turn();
        s9_issue_s(sc, qaddr, kbase);
        pass_turn(false);
        wgmma_wait0(sc);
        s9_softmax<LEAN>(sc, pb0, r, 0, p.scale_log2, a0, a1); /* O is zero: nothing to scale */
        /* tile kt: issue S(kt) with PV(kt - 1) from pin, softmax into pout */
        auto step = [&](int kt, uint32_t (&pin)[S9_BN / 16][4], uint32_t (&pout)[S9_BN / 16][4]) {
            const int st = kt % S9_STAGES, sp = (kt - 1) % S9_STAGES;
            s9_mbar_wait(bar_full + 8 * st, (kt / S9_STAGES) & 1);
            wgmma_fence_regs(o);
            my_turn();
            s9_issue_s(sc, qaddr, kbase + st * S9_KV_BYTES);
            s9_issue_pv(o, pin, vbase + sp * S9_KV_BYTES);
            pass_turn(false);
            wgmma_wait1(sc); /* S of tile kt done; PV of tile kt - 1 may still run */
            s9_softmax<LEAN>(sc, pout, r, kt, p.scale_log2, a0, a1);
            wgmma_wait0(o);
            s9_release<CL>(bar_empty + 8 * sp);
            s9_scale_o(o, a0, a1);
        };
        /* the last tile's PV */
        auto finish = [&](uint32_t (&pin)[S9_BN / 16][4]) {
            const int sl = (nt - 1) % S9_STAGES;
            wgmma_fence_regs(o);
            my_turn();
            s9_issue_pv(o, pin, vbase + sl * S9_KV_BYTES);
            pass_turn(true);
            wgmma_wait0(o);
            s9_release<CL>(bar_empty + 8 * sl);
        };
        for (int kt = 1;; kt += 2) {
            if (kt >= nt) {
                finish(pb0);
                break;
            }
            step(kt, pb0, pb1);
            if (kt + 1 >= nt) {
                finish(pb1);
                break;
            }
            step(kt + 1, pb1, pb0);
        }
    }

    float l0 = r.l0, l1 = r.l1;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float i0 = 1.0f / l0, i1 = 1.0f / l1;
    const int r0 = rl0, r1 = rl0 + 8;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int col = h * S9_D + i * 8 + (lane & 3) * 2;
        if (r0 < rows) {
            const size_t off = (size_t)(t0 + q0 + r0) * p.q_stride + col;
            const float2 v = make_float2(o[4 * i] * i0, o[4 * i + 1] * i0);
            if (p.out) *reinterpret_cast<float2 *>(p.out + off) = v; /* NULL: shadow only (cu_tape_f32_dead) */
            if (p.out_bf) *reinterpret_cast<uint32_t *>(p.out_bf + off) = s9_pack_bf16(v.x, v.y);
        }
        if (r1 < rows) {
            const size_t off = (size_t)(t0 + q0 + r1) * p.q_stride + col;
            const float2 v = make_float2(o[4 * i + 2] * i1, o[4 * i + 3] * i1);
            if (p.out) *reinterpret_cast<float2 *>(p.out + off) = v; /* NULL: shadow only (cu_tape_f32_dead) */
            if (p.out_bf) *reinterpret_cast<uint32_t *>(p.out_bf + off) = s9_pack_bf16(v.x, v.y);
        }
    }
}
#endif /* S9_ENABLED */

/* grid (G / 2, n_tiles, KVH), 384 threads; CTA (pair, tile, kv head)
 * takes query heads kvh G + 2 pair and kvh G + 2 pair + 1. Blocks are
 * started x fastest, then y, then z: the CTAs running at any time belong
 * to one or two KV heads, so their K/V (16.8 MB per KV head and layer at
 * 32k) stays in L2 while every tile of that head streams it; head-pair
 * order (all KV heads at once) keeps 8x that working set, more than L2
 * at long contexts. Within a KV head the longest tiles (first in the
 * list) start first. */
template <bool PIPE, bool PINGPONG, bool WARP_PRODUCER, bool OFFSET = false, bool TMA = false, bool CL = false,
          bool LEAN = false>
__global__ __launch_bounds__(384, 1) void k_attn_prefill_sm90(const __grid_constant__ cu_sm90_params p,
                                                              const __grid_constant__ CUtensorMap tmap) {
#if S9_ENABLED
    PDL_ENTRY();
    /* the chunk's K/V rows were stored by the kernel before through the
     * generic proxy; the TMA loads read through the async proxy, which the
     * PTX memory model orders after them only across a proxy fence */
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    extern __shared__ uint8_t s9_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)s9_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem + 2 * S9_Q_BYTES + 2 * S9_STAGES * S9_KV_BYTES);
    const uint32_t bar_full = s9_smem_addr(bars), bar_empty = bar_full + 8 * S9_STAGES;

    const int tile = blockIdx.y, h0 = blockIdx.z * p.G + 2 * blockIdx.x;
    const int s = p.tiles[2 * tile], q0 = p.tiles[2 * tile + 1];
    const int t0 = p.seq_start[s], n = p.seq_start[s + 1] - t0, L = p.seq_len[s];
    const int rows = min(S9_BM, n - q0);
    const int pos0 = L - n + q0;    /* position of tile row 0 */
    const int n_keys = pos0 + rows; /* keys [0, last row's position] */
    const int nt = (n_keys + S9_BN - 1) / S9_BN;
    const int kvh = h0 / p.G;

    if (threadIdx.x == 0) {
        for (int i = 0; i < S9_STAGES; i++) {
            s9_mbar_init(bar_full + 8 * i, WARP_PRODUCER ? 32 : 128); /* the lanes that copied the tile */
            s9_mbar_init(bar_empty + 8 * i, CL ? 16 : 256); /* every consumer thread (CL: warp of either CTA) */
        }
        if constexpr (CL) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    /* CL: the peer's barriers are initialised before any multicast or
     * remote arrival reaches them */
    if constexpr (CL) s9_cluster_sync();
    else __syncthreads();
    const int wg = threadIdx.x >> 7;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        if constexpr (TMA) s9_producer_tma<CL>(p, &tmap, smem, bar_full, bar_empty, s, kvh, n_keys, nt);
        else if constexpr (WARP_PRODUCER) s9_producer_warps(p, smem, bar_full, bar_empty, s, kvh, n_keys, nt);
        else s9_producer(p, smem, bar_full, bar_empty, s, kvh, n_keys, nt);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
        s9_consumer<PIPE, PINGPONG, OFFSET, CL, LEAN>(p, smem, bar_full, bar_empty, wg - 1, h0 + wg - 1, t0, q0, rows, pos0,
                                                nt);
    }
    /* CL: no CTA leaves while its peer may still arrive on its barriers */
    if constexpr (CL) s9_cluster_sync();
#else
    (void)p;
    (void)tmap;
    __trap(); /* never selected without sm_90a code (cu_attn_sm90_usable) */
#endif
}

/* ---------------------------------------------------------------- host */

static bool s9_set_smem(cu_impl *c, void (*k)(cu_sm90_params, CUtensorMap)) {
    return !cu_check(c, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, S9_SMEM),
                     "attention sm90 smem attribute");
}

bool cu_attn_sm90_usable(cu_impl *c, int head_dim, int G) {
    if (head_dim != S9_D || G < 2 || G % 2 != 0 ||
        !cu_attn_switch(&c->attn_sm90, "NS_CUDA_ATTN_SM90", CU_ATTN_SM90_MAX, CU_ATTN_SM90_DEFAULT))
        return false;
    if (c->attn_sm90_cc == 0) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device);
        /* sm_90a code runs on exactly 9.0 */
        c->attn_sm90_cc = (major == 9 && minor == 0 && c->smem_optin >= (size_t)S9_SMEM) ? 1 : 2;
        if (c->attn_sm90_cc == 1 && !(s9_set_smem(c, k_attn_prefill_sm90<false, false, false>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, false, false>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, true, false>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, true, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, false, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, true, false, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, false, false, true, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, true, false, false, true, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, false, true, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, false, false, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<false, false, false, true, true, false, true>) &&
                                      s9_set_smem(c, k_attn_prefill_sm90<true, true, false, false, true, false, true>)))
            c->attn_sm90_cc = 2;
    }
    return c->attn_sm90_cc == 1;
}

/* The tensor map of the TMA variants (and of the decode's copy mode 4,
 * cuda_internal.cuh): the pool at kv as a 2-D tensor
 * of rows of 128 bf16 (256 bytes: one K or V row of one head; page_bytes,
 * k_off, v_off and head_bytes are multiples of it), boxes of 64 x P with a
 * 128-byte swizzle. Cached per (pool address, size): the FP8 path runs
 * this kernel on its own bf16 scratch pool. False (use the cp.async
 * producer) where a TMA box cannot express the pages: P not a multiple of
 * 8 dividing 128, row coordinates past 2^31, or no encoder in the driver. */
PFN_cuTensorMapEncodeTiled_v12000 cu_tmap_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    static bool tried = false;
    if (!tried) {
        tried = true;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        else
            (void)cudaGetLastError();
    }
    return encode;
}

bool cu_attn_kv_tmap(cu_impl *c, const uint8_t *kv, size_t kv_bytes, size_t page_bytes, size_t head_bytes, size_t k_off,
                     size_t v_off, int P, uint64_t out[16]) {
    if (P < 8 || P % 8 || S9_BN % P || kv_bytes == 0 || page_bytes % 256 || head_bytes % 256 || k_off % 256 ||
        v_off % 256 || kv_bytes / 256 >= (1ull << 31))
        return false;
    if (c->attn_tmap_kv != kv || c->attn_tmap_bytes != kv_bytes) {
        const PFN_cuTensorMapEncodeTiled_v12000 encode = cu_tmap_encoder();
        alignas(64) CUtensorMap m;
        memset(&m, 0, sizeof m);
        const cuuint64_t dims[2] = {128, (cuuint64_t)(kv_bytes / 256)}, strides[1] = {256};
        const cuuint32_t box[2] = {64, (cuuint32_t)P}, estr[2] = {1, 1};
        c->attn_tmap_ok = encode && encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)kv, dims, strides, box, estr,
                                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
        static_assert(sizeof(CUtensorMap) == sizeof c->attn_tmap, "opaque tensor map storage");
        memcpy(c->attn_tmap, &m, sizeof m);
        c->attn_tmap_kv = kv;
        c->attn_tmap_bytes = kv_bytes;
    }
    memcpy(out, c->attn_tmap, sizeof c->attn_tmap);
    return c->attn_tmap_ok != 0;
}

/* Launch with clusters of 2 CTAs along x (the head pairs of a KV head). */
static void s9_launch_cluster(cu_impl *c, void (*k)(cu_sm90_params, CUtensorMap), dim3 grid, dim3 block, size_t smem,
                              const cu_sm90_params &p, const CUtensorMap &tm) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c->pdl ? 2 : 1;
    cu_check(c, cudaLaunchKernelEx(&cfg, k, p, tm), "kernel launch (cluster)");
}

bool cu_attn_prefill_sm90(cu_impl *c, const cu_sm90_params *p, int n_tiles) {
    const dim3 grid((unsigned)(p->G / 2), (unsigned)n_tiles, (unsigned)(p->H / p->G)), block(384);
    const size_t sm = (size_t)S9_SMEM;
    alignas(64) CUtensorMap tm;
    memset(&tm, 0, sizeof tm);
    int v = c->attn_sm90 - 1;
    /* the TMA variants fall back to their cp.async twins where no map fits */
    if ((v == 10 || v == 11) && (p->G / 2) % 2 != 0) v = v == 10 ? 8 : 9; /* clusters pair head pairs: G % 4 == 0 */
    if (v >= 8 &&
        !cu_attn_kv_tmap(c, p->kv, p->kv_bytes, p->page_bytes, p->head_bytes, p->k_off, p->v_off, p->P,
                         reinterpret_cast<uint64_t *>(&tm)))
        v = (v == 9 || v == 11 || v == 15) ? 3 : v == 13 ? 2 : (v == 12 || v == 14) ? 7 : 1;
    /* variants (cuda.h): 1 in order per tile (the fastest cp.async
     * producer, v13), 2 pipelined, 3 pipelined + ping-pong; 4-6 the same with
     * one producer warp per stage; 7 = 1 with the consumer groups half a
     * tile apart; 8, 9 = 1, 3 with the TMA producer (8: the default,
     * +17% on prefill 32k over 1, v16); 10 = 8 with the two
     * head pairs of a KV head as a 2-CTA cluster sharing K/V by multicast,
     * 11 = the same with 9's pipelined ping-pong consumers; 12 = 8 with
     * 7's offset groups, 13 = 8 pipelined without ping-pong (the overlaps
     * measured only with the cp.async producer, v13), 14, 15 = 12, 9
     * with the lean softmax (docs/cuda.md v22) */
    switch (v) {
    case 2: cu_launch(c, k_attn_prefill_sm90<true, false, false>, grid, block, sm, *p, tm); break;
    case 3: cu_launch(c, k_attn_prefill_sm90<true, true, false>, grid, block, sm, *p, tm); break;
    case 4: cu_launch(c, k_attn_prefill_sm90<false, false, true>, grid, block, sm, *p, tm); break;
    case 5: cu_launch(c, k_attn_prefill_sm90<true, false, true>, grid, block, sm, *p, tm); break;
    case 6: cu_launch(c, k_attn_prefill_sm90<true, true, true>, grid, block, sm, *p, tm); break;
    case 7: cu_launch(c, k_attn_prefill_sm90<false, false, false, true>, grid, block, sm, *p, tm); break;
    case 8: cu_launch(c, k_attn_prefill_sm90<false, false, false, false, true>, grid, block, sm, *p, tm); break;
    case 9: cu_launch(c, k_attn_prefill_sm90<true, true, false, false, true>, grid, block, sm, *p, tm); break;
    case 10: s9_launch_cluster(c, k_attn_prefill_sm90<false, false, false, false, true, true>, grid, block, sm, *p, tm); break;
    case 11: s9_launch_cluster(c, k_attn_prefill_sm90<true, true, false, false, true, true>, grid, block, sm, *p, tm); break;
    case 12: cu_launch(c, k_attn_prefill_sm90<false, false, false, true, true>, grid, block, sm, *p, tm); break;
    case 13: cu_launch(c, k_attn_prefill_sm90<true, false, false, false, true>, grid, block, sm, *p, tm); break;
    case 14: cu_launch(c, k_attn_prefill_sm90<false, false, false, true, true, false, true>, grid, block, sm, *p, tm); break;
    case 15: cu_launch(c, k_attn_prefill_sm90<true, true, false, false, true, false, true>, grid, block, sm, *p, tm); break;
    default: cu_launch(c, k_attn_prefill_sm90<false, false, false>, grid, block, sm, *p, tm); break;
    }
    return !CU_LAUNCHED(c, "attention prefill sm90");
}
