// Shared helpers for every cleave kernel module. No CUDA headers: bf16 is a raw 16-bit pattern,
// conversions and tensor-core instructions are inline PTX, so NVRTC needs no include path.
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;
#define NEG_INF __int_as_float(0xff800000)
// A cache slot that writes nothing (ops/kv.rs `NO_SLOT`).
#define NO_SLOT 0xffffffffu

// The keys each of `splits` splits takes of a row of `len` keys: the row's tiles of `tile` keys
// dealt evenly, so that a launch's shape does not depend on its rows' lengths (a captured decode
// step replays with any contexts).
__device__ __forceinline__ int split_span(int len, int splits, int tile) {
    return ((len + tile - 1) / tile + splits - 1) / splits * tile;
}
// The keys [begin, end) that split `split` of `splits` takes (split_span). Splits past the row's
// end are empty.
__device__ __forceinline__ void split_keys(int len, int split, int splits, int tile, int& begin, int& end) {
    const int per = split_span(len, splits, tile);
    begin = min(len, split * per);
    end = min(len, begin + per);
}
// How many of a row's first splits hold keys (split_keys): ceil(len / span).
__device__ __forceinline__ int splits_used(int len, int splits, int tile) {
    const int per = split_span(len, splits, tile);
    return per > 0 ? min(splits, (len + per - 1) / per) : 0;
}
// One block's share of a row's keys in the split decode kernels: keys [begin, end) of the row
// (split_keys), `ntiles` tiles of `tile` keys, and the row's block table.
struct KeySplit {
    int begin, end, ntiles;
    const int* tab;
};
__device__ __forceinline__ KeySplit key_split(const int* row_len, const int* row_tab, const int* tables, int row,
                                              int split, int splits, int tile) {
    KeySplit k;
    split_keys(row_len[row], split, splits, tile, k.begin, k.end);
    k.ntiles = k.end > k.begin ? (k.end - k.begin + tile - 1) / tile : 0;
    k.tab = tables + row_tab[row];
    return k;
}

// N consecutive words of shared memory from p (aligned to the widest load N allows: 16 bytes
// when N % 4 == 0, 8 when N % 2 == 0), in as few loads as N allows.
template <int N>
__device__ __forceinline__ void lds_words(u32 (&w)[N], const u32* p) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[i];
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const uint2 v = reinterpret_cast<const uint2*>(p)[i];
            w[2 * i] = v.x, w[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = p[i];
    }
}

// Programmatic dependent launch (Hopper): a kernel launched with it (ops::pdl_kernels) may be
// scheduled while the kernel before it on the stream still runs. pdl_wait() returns once that
// kernel has finished and its writes are visible: call it before reading or writing anything an
// earlier kernel touches (a buffer freed by an earlier op may be this kernel's output).
// pdl_trigger() then lets the next kernel be scheduled. Without the launch attribute both return
// at once.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A hint to bring `bytes` (a multiple of 16) from the 16-byte aligned `p` into L2, one instruction.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_trigger();
}
// Flags between the blocks of one launch (gpu scope: stream-K's hand-over, release after the
// partial sums, acquire before reading them) and between GPUs (sys scope: the peer all-reduce).
__device__ __forceinline__ void st_release_gpu(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// Every block of the launch meets here; all must be resident at once (the launcher's rule), and
// `sync` is one word that starts at 0 and is never reset: block 0 adds 2^31 - (n - 1), the other
// n - 1 blocks 1 each, so a whole round adds 2^31 and only the last arrival flips the top bit
// (the low bits return to 0). Writes before the barrier are visible to every block after it.
__device__ __forceinline__ void grid_barrier(u32* sync) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const u32 n = gridDim.x * gridDim.y * gridDim.z;
        const bool first = (blockIdx.x | blockIdx.y | blockIdx.z) == 0;
        __threadfence();
        const u32 old = atomicAdd(sync, first ? 0x80000000u - (n - 1) : 1u);
        while (((ld_acquire_gpu(sync) ^ old) & 0x80000000u) == 0) {
        }
        __threadfence();
    }
    __syncthreads();
}
__device__ __forceinline__ void st_relaxed_sys(u32* p, u32 v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_acquire_sys(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ bf16_t f2bf(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}
// Two floats to packed bf16x2, `lo` in the low half (the lower address in memory).
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum over the block; every thread gets the total. Uses static shared memory: call once per kernel.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        const int nw = (blockDim.x + 31) >> 5;
        float t = lane < nw ? part[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) total = t;
    }
    __syncthreads();
    return total;
}
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16-byte asynchronous global->shared copy to a shared-window address (smem_u32); `src_bytes` 0
// reads nothing and fills the destination with zeros.
__device__ __forceinline__ void cp_async16(u32 smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    cp_async16(smem_u32(smem), gmem, src_bytes);
}
// cp_async16 of 16 bytes or, where ok is 0, of zeros (PTX's ignore-src: a predicate, where a byte
// count costs ptxas address arithmetic per copy).
__device__ __forceinline__ void cp_async16_if(u32 smem, const void* gmem, u32 ok) {
    asm volatile("{ .reg .pred p; setp.eq.u32 p, %2, 0; cp.async.cg.shared.global [%0], [%1], 16, p; }" ::"r"(smem),
                 "l"(gmem), "r"(ok));
}
// 4-byte asynchronous global->shared copy (cached at all levels); `src_bytes` 0 writes a zero.
__device__ __forceinline__ void cp_async4(u32 smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
    cp_async4(smem_u32(smem), gmem, src_bytes);
}
__device__ __forceinline__ void cp_async4_if(u32 smem, const void* gmem, u32 ok) {
    asm volatile("{ .reg .pred p; setp.eq.u32 p, %2, 0; cp.async.ca.shared.global [%0], [%1], 4, p; }" ::"r"(smem),
                 "l"(gmem), "r"(ok));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D (f32). Fragment layout (g = lane/4, t = lane%4):
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1].
__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 ld_u32(const bf16_t* p) { return *reinterpret_cast<const u32*>(p); }
// ldmatrix: four (or two) 8x8 b16 matrices from shared memory; lane l supplies the address of
// row l % 8 of matrix l / 8. `.trans` delivers each matrix transposed.
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(p));
}
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    ldsm_x4(r0, r1, r2, r3, smem_u32(p));
}
__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x2(u32& r0, u32& r1, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// The grouped GEMM epilogues for output columns col, col + 1 (col even) of sorted row p.
template <int EPI>
__device__ __forceinline__ void gg_store(void* Y, u64 p, int col, int N, float c0, float c1) {
    if (EPI == 0) {
        float* y = reinterpret_cast<float*>(Y) + p * N;
        if (col < N) y[col] = c0;
        if (col + 1 < N) y[col + 1] = c1;
    } else {
        bf16_t* y = reinterpret_cast<bf16_t*>(Y) + p * (N / 2);
        if (col + 1 < N) y[col / 2] = f2bf(c0 / (1.0f + expf(-c0)) * c1);
    }
}
__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// AWQ int4 in the fragment layout of quant.cu: zero point z (0..15) as the bf16 pair -(128 + z),
// and pair p of a packed word (nibbles p and 4 + p) as the exact bf16 pair q - z: OR-ing a nibble
// into the mantissa of 128.0 gives 128 + q.
__device__ __forceinline__ u32 awq_zero(u32 z) { return (0xC300u | z) * 0x10001u; }
// awq_zero of the nibble at bit `shift` of a packed word of zero points.
__device__ __forceinline__ u32 awq_zero_at(u32 word, int shift) {
    u32 v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(word >> shift), "r"(0xFu), "r"(0xC300u));
    return v * 0x10001u;
}
__device__ __forceinline__ u32 awq_pair(u32 w, int p, u32 zero) {
    // (w & mask) | magic as one LOP3: written out, ptxas emits an AND and an OR (a LOP3 takes one
    // immediate).
    u32 v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w >> (4 * p)), "r"(0x000F000Fu), "r"(0x43004300u));
    return fma_bf16x2(v, 0x3F803F80u, zero);
}
