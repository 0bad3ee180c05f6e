// Hopper warpgroup MMA (wgmma, sm_90a) for the prefill-sized grouped GEMM over expert row tiles.
// One warpgroup (128 threads) per block computes a BM x BN tile (BM = 64 MW, BN = 128 NW) as MW x NW
// m64n128k16 wgmmas per 16 channels, both operands read by the tensor cores straight from shared
// memory. Tiles of 64 channels (one 128-byte row per row) are copied there by cp.async into the
// 128-byte swizzle the wgmma descriptors name: 16-byte chunk c of row r at r * 128 + 16 (c ^ (r % 8)),
// each stage 1024-byte aligned. moe.cu's grouped_gemm (mma.sync) is the reference it is checked
// against (kernels-check stage experts).

// Shared-memory matrix descriptor: K-major operand, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ u64 wg_desc(u32 saddr) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Makes this thread's shared-memory writes (cp.async included) visible to the tensor cores'
// async proxy; each writing thread runs it before the barrier that precedes the wgmmas.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d[64] += A (64 x 16, descriptor da) * B (128 x 16, K-major, descriptor db). Accumulator layout
// (warp w of the group, g = lane / 4, t = lane % 4): d[4 j + 2 h + i] = D[16 w + g + 8 h][8 j + 2 t + i].
__device__ __forceinline__ void wgmma_m64n128(float (&d)[64], u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1)
        : "memory");
}

// Grouped GEMM over expert row tiles, as moe.cu's grouped_gemm: for each tile (expert e, sorted rows
// rs..rs+rc, from moe_align with BM) and column block n0..n0+BN, Y[rs + r, n] = sum_k X[row(rs + r), k]
// W[e, n, k] with row(p) = rowidx[p] (or p when null); EPI 0 stores f32 [*, N], EPI 1 takes
// interleaved gate/up columns and stores bf16 silu(gate) * up [*, N/2]. K % 8 == 0. ST stages of
// dynamic shared memory ((BM + BN) * 128 bytes each, plus 1 KB for the alignment).
template <int MW, int NW, int ST, int EPI>
__device__ __forceinline__ void gg_wgmma(const bf16_t* __restrict__ X, const int* __restrict__ rowidx,
                                         const bf16_t* __restrict__ Wt, void* Y, const int* __restrict__ tiles,
                                         const int* __restrict__ meta, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 64 * MW, BN = 128 * NW, BK = 64, A_BYTES = BM * 128, STAGE = (BM + BN) * 128;
    extern __shared__ __align__(16) unsigned char wsm[];
    const int tile = blockIdx.y;
    if (tile >= meta[0]) return;
    const int e = tiles[3 * tile], rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
    const int n0 = blockIdx.x * BN;
    const u32 raw = smem_u32(wsm), base = (raw + 1023u) & ~1023u;
    unsigned char* sm = wsm + (base - raw);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // This thread copies 16-byte chunk c of rows r0 + 16 j of both operands; all its rows share r % 8.
    const int c = tid & 7, r0 = tid >> 3, swz = ((c ^ (r0 & 7)) << 4) + r0 * 128;
    const bf16_t* Wb = Wt + (u64)e * N * K;
    int a_row[BM / 16];
#pragma unroll
    for (int j = 0; j < BM / 16; j++) {
        const int r = r0 + 16 * j;
        a_row[j] = r < rc ? (rowidx ? rowidx[rs + r] : rs + r) : -1;
    }
    auto load = [&](int stage, int kt) {
        unsigned char* st = sm + stage * STAGE + swz;
        const int k = kt * BK + c * 8;
        const bool kin = k < K;
#pragma unroll
        for (int j = 0; j < BM / 16; j++) {
            const bool ok = kin && a_row[j] >= 0;
            cp_async16(st + j * 2048, ok ? X + (u64)a_row[j] * K + k : X, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < BN / 16; j++) {
            const int n = n0 + r0 + 16 * j;
            const bool ok = kin && n < N;
            cp_async16(st + A_BYTES + j * 2048, ok ? Wb + (u64)n * K + k : Wt, ok ? 16 : 0);
        }
    };
    float acc[MW][NW][64];
#pragma unroll
    for (int mw = 0; mw < MW; mw++)
#pragma unroll
        for (int nw = 0; nw < NW; nw++)
#pragma unroll
            for (int q = 0; q < 64; q++) acc[mw][nw][q] = 0.f;
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<ST - 2>();
        fence_proxy_async();
        __syncthreads();
        const u32 st = base + (kt % ST) * STAGE;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int mw = 0; mw < MW; mw++)
#pragma unroll
                for (int nw = 0; nw < NW; nw++)
                    wgmma_m64n128(acc[mw][nw], wg_desc(st + mw * 8192 + kk * 32), wg_desc(st + A_BYTES + nw * 16384 + kk * 32));
        wg_commit();
        // The group before this one has finished reading its stage, which the next copy refills.
        wg_wait<1>();
        if (kt + ST - 1 < KT) load((kt + ST - 1) % ST, kt + ST - 1);
        cp_async_commit();
    }
    wg_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int mw = 0; mw < MW; mw++)
#pragma unroll
        for (int nw = 0; nw < NW; nw++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int col = n0 + nw * 128 + 8 * j + 2 * t4;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int r = mw * 64 + warp * 16 + g + 8 * hh;
                    if (r < rc)
                        gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mw][nw][4 * j + 2 * hh], acc[mw][nw][4 * j + 2 * hh + 1]);
                }
            }
#else
    __trap();  // wgmma is sm_90a only; ops/moe.rs launches these on sm_90a alone
#endif
}

#define GGW_ARGS const bf16_t *X, const int *rowidx, const bf16_t *Wt, void *Y, const int *tiles, const int *meta, int N, int K
#define GGW_PASS X, rowidx, Wt, Y, tiles, meta, N, K
// Names: ggw_<BM>x<BN>_<ST>_<f32|silu>; ops/moe.rs (GGW_KERNELS) mirrors them.
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_3_f32(GGW_ARGS) { gg_wgmma<2, 1, 3, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_3_silu(GGW_ARGS) { gg_wgmma<2, 1, 3, 1>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_4_f32(GGW_ARGS) { gg_wgmma<2, 1, 4, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_4_silu(GGW_ARGS) { gg_wgmma<2, 1, 4, 1>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_64x256_3_f32(GGW_ARGS) { gg_wgmma<1, 2, 3, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_64x256_3_silu(GGW_ARGS) { gg_wgmma<1, 2, 3, 1>(GGW_PASS); }
