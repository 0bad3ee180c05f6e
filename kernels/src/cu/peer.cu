// One-shot all-reduce over peer memory, for the decode-sized sums of a TP group whose GPUs can
// read each other's memory (NVLink). NCCL's ring or tree takes tens of microseconds for a few
// KB; here every rank copies its values into its own staging buffer, tells each peer so through
// a flag in the peer's memory, waits for every peer's flag, and sums all ranks' staging buffers
// itself, reading the peers' over the link. Every rank sums in rank order, so all ranks hold the
// same bits.
//
// Each rank's region (peer.rs lays it out): two staging buffers of `cap` bytes (alternate calls
// use alternate buffers), then two flag arrays [PEER_BLOCKS][PEER_MAX_RANKS] (flag [b][r] of
// array 0: the last call in which rank r's block b had staged its slices; of array 1: reduced
// its chunk's slice, two-shot only), then one call counter per block, then a status word (1
// after a wait timed out). Every call has PEER_BLOCKS blocks, block b owning the
// same slice on every rank, and counts its own calls, so the counters agree across ranks without
// any host input: a captured CUDA graph replays the kernel as it is.
//
// Why two buffers suffice: a rank writes buffer p in call c only after its call c - 1 saw every
// peer's first flag for c - 1, so every peer had finished call c - 2, the last reader of buffer p.
// A flag may run ahead of the waiter (a fast peer already in the next call), so the wait is for
// flag >= call, not ==.

#define PEER_MAX_RANKS 8
#define PEER_BLOCKS 32
// Well above any host skew between ranks, below the step's 60 s settle deadline.
#define PEER_TIMEOUT_NS 30000000000ull

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Raises this block's flag `call` in every rank's flag array `arr` (0: staged, 1: reduced) and
// waits until every rank raised its own in ours (threads 0..ranks-1; the caller syncs after).
__device__ __forceinline__ void peer_barrier(const u64* __restrict__ bases, int arr, int blk, int rank, int ranks,
                                             u64 cap, u32 call, u32* status) {
    const int tid = threadIdx.x;
    if (tid < ranks) {
        // The block's writes before the flag, to every peer (cumulative over the caller's barrier).
        __threadfence_system();
        const u64 off = 2 * cap + (u64)arr * PEER_BLOCKS * PEER_MAX_RANKS * 4;
        u32* theirs = reinterpret_cast<u32*>(reinterpret_cast<unsigned char*>(bases[tid]) + off);
        st_relaxed_sys(theirs + blk * PEER_MAX_RANKS + rank, call);
        const u32* wait = reinterpret_cast<const u32*>(reinterpret_cast<unsigned char*>(bases[rank]) + off) +
                          blk * PEER_MAX_RANKS + tid;
        const u64 t0 = global_ns();
        while ((int)(ld_acquire_sys(wait) - call) < 0) {
            if (global_ns() - t0 > PEER_TIMEOUT_NS) {
                atomicExch(status, 1u);
                break;
            }
        }
    }
}

// Rank r's staging buffer of this call, as float4s (L2 loads: the owner's, over the link for a
// peer, never a stale L1 line).
__device__ __forceinline__ float4 staged(const u64* __restrict__ bases, int r, u64 half, int i) {
    return __ldcg(reinterpret_cast<const float4*>(reinterpret_cast<const unsigned char*>(bases[r]) + half) + i);
}
__device__ __forceinline__ float4 sum_ranks(const u64* __restrict__ bases, int ranks, u64 half, int i) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < ranks; r++) {
        const float4 v = staged(bases, r, half, i);
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    return s;
}

// x: this rank's n f32 values (n % 4 == 0), summed in place; bases: every rank's region (device
// addresses this GPU can read), `ranks` of them; cap: bytes per staging buffer (>= 4 n).
// One-shot (two_shot 0): every rank sums all of x from every rank's buffer. Two-shot: x is cut
// into `ranks` chunks; rank c sums chunk c from every buffer into its own buffer (only rank c
// reads chunk c of anyone's buffer in this phase, so in place is safe), raises the second flag,
// and every rank copies each chunk from its owner: each rank reads 2 (ranks - 1) / ranks of x
// over the links instead of ranks - 1 times x. Block b always owns slice b of every chunk.
extern "C" __global__ void __launch_bounds__(512) peer_all_reduce_f32(const u64* __restrict__ bases, float* x, int n,
                                                                       int rank, int ranks, u64 cap, int two_shot) {
    const int blk = blockIdx.x, tid = threadIdx.x;
    unsigned char* own = reinterpret_cast<unsigned char*>(bases[rank]);
    u32* counters = reinterpret_cast<u32*>(own + 2 * cap) + 2 * PEER_BLOCKS * PEER_MAX_RANKS;
    u32* status = counters + PEER_BLOCKS;
    __shared__ u32 s_call;
    if (tid == 0) {
        s_call = counters[blk] + 1;
        counters[blk] = s_call;
    }
    __syncthreads();
    const u32 call = s_call;
    const u64 half = (u64)(call & 1) * cap;
    const int n4 = n / 4, chunks = two_shot ? ranks : 1;
    const int cs = (n4 + chunks - 1) / chunks, per = (cs + PEER_BLOCKS - 1) / PEER_BLOCKS;
    // Slice b of chunk c: [lo(c), hi(c)).
    auto lo = [&](int c) { return min(n4, min((c + 1) * cs, c * cs + blk * per)); };
    auto hi = [&](int c) { return min(n4, min((c + 1) * cs, c * cs + (blk + 1) * per)); };
    float4* x4 = reinterpret_cast<float4*>(x);
    float4* mine = reinterpret_cast<float4*>(own + half);
    for (int c = 0; c < chunks; c++)
        for (int i = lo(c) + tid; i < hi(c); i += blockDim.x) mine[i] = x4[i];
    __syncthreads();
    peer_barrier(bases, 0, blk, rank, ranks, cap, call, status);
    __syncthreads();
    if (!two_shot) {
        for (int i = lo(0) + tid; i < hi(0); i += blockDim.x) x4[i] = sum_ranks(bases, ranks, half, i);
        return;
    }
    for (int i = lo(rank) + tid; i < hi(rank); i += blockDim.x) {
        const float4 s = sum_ranks(bases, ranks, half, i);
        mine[i] = s;
        x4[i] = s;
    }
    __syncthreads();
    peer_barrier(bases, 1, blk, rank, ranks, cap, call, status);
    __syncthreads();
    for (int c = 0; c < chunks; c++) {
        if (c == rank) continue;
        for (int i = lo(c) + tid; i < hi(c); i += blockDim.x) x4[i] = staged(bases, c, half, i);
    }
}
