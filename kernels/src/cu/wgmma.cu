// Hopper warpgroup MMA (wgmma, sm_90a; its primitives in wgmma.cuh) for prefill-sized grouped
// GEMMs over expert row tiles, bf16 and FP8. For bf16, one or two warpgroups per block compute a
// row tile against a column block; for FP8, a producer warpgroup feeds two consumer warpgroups
// (gg_wgmma_fp8). Both operands are read by the tensor cores straight from shared memory. Each
// operand row's 128 bytes of a stage (64 bf16 or 128 e4m3 channels) are copied there by cp.async
// in the 128-byte swizzle the wgmma descriptors name, each stage 1024-byte aligned. References
// (kernels-check): moe.cu's mma.sync grouped_gemm for bf16, on every row (stage experts); the
// CPU's linears fed the same quantized activations for FP8 (stage qdecode).

// Grouped GEMM over expert row tiles, as moe.cu's grouped_gemm: for each tile (expert e, sorted rows
// rs..rs+rc, from moe_align with BM) and column block n0..n0+BN, Y[rs + r, n] = sum_k X[row(rs + r), k]
// W[e, n, k] with row(p) = rowidx[p] (or p when null); EPI 0 stores f32 [*, N], EPI 1 takes
// interleaved gate/up columns and stores bf16 silu(gate) * up [*, N/2]. K % 8 == 0.
// WG warpgroups of 128 threads; warpgroup w computes rows 64 MW w .. 64 MW (w + 1) of the tile
// against all BN = NB columns (MW m64nNBk16 wgmmas per 16 channels), so BM = 64 MW WG. ST stages of
// dynamic shared memory ((BM + BN) * 128 bytes each, plus 1 KB for the alignment).
template <int WG, int MW, int NB, int ST, int EPI>
__device__ __forceinline__ void gg_wgmma(const bf16_t* __restrict__ X, const int* __restrict__ rowidx,
                                         const bf16_t* __restrict__ Wt, void* Y, const int* __restrict__ tiles,
                                         const int* __restrict__ meta, int N, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int T = 128 * WG, BM = 64 * MW * WG, BN = NB, BK = 64, A_BYTES = BM * 128, STAGE = (BM + BN) * 128;
    constexpr int RSTEP = T / 8;  // rows between one thread's consecutive chunks
    extern __shared__ __align__(16) unsigned char wsm[];
    const int tile = blockIdx.y;
    if (tile >= meta[0]) return;
    const int e = tiles[3 * tile], rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
    const int n0 = blockIdx.x * BN;
    const u32 raw = smem_u32(wsm), base = (raw + 1023u) & ~1023u;
    unsigned char* sm = wsm + (base - raw);
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    // This thread copies 16-byte chunk c of rows r0 + RSTEP j of both operands; all its rows share r % 8.
    const int c = tid & 7, r0 = tid >> 3, swz = ((c ^ (r0 & 7)) << 4) + r0 * 128;
    const bf16_t* Wb = Wt + (u64)e * N * K;
    int a_row[BM / RSTEP];
#pragma unroll
    for (int j = 0; j < BM / RSTEP; j++) {
        const int r = r0 + RSTEP * j;
        a_row[j] = r < rc ? (rowidx ? rowidx[rs + r] : rs + r) : -1;
    }
    auto load = [&](int stage, int kt) {
        unsigned char* st = sm + stage * STAGE + swz;
        const int k = kt * BK + c * 8;
        const bool kin = k < K;
#pragma unroll
        for (int j = 0; j < BM / RSTEP; j++) {
            const bool ok = kin && a_row[j] >= 0;
            cp_async16(st + j * RSTEP * 128, ok ? X + (u64)a_row[j] * K + k : X, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < BN / RSTEP; j++) {
            const int n = n0 + r0 + RSTEP * j;
            const bool ok = kin && n < N;
            cp_async16(st + A_BYTES + j * RSTEP * 128, ok ? Wb + (u64)n * K + k : Wt, ok ? 16 : 0);
        }
    };
    float acc[MW][NB / 2];
#pragma unroll
    for (int mw = 0; mw < MW; mw++)
#pragma unroll
        for (int q = 0; q < NB / 2; q++) acc[mw][q] = 0.f;
    // Tiles copied ahead of the one multiplied. A warpgroup's wg_wait<1> frees the stage its
    // previous group read; with one warpgroup that stage is refilled at once, with two only after
    // the next barrier (the other warpgroup's group may still read it), so one stage less ahead.
    constexpr int AHEAD = WG == 1 ? ST - 1 : ST - 2;
    static_assert(AHEAD >= 1, "stages");
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<AHEAD - 1>();
        fence_proxy_async();
        __syncthreads();
        if (WG > 1) {
            if (kt + AHEAD < KT) load((kt + AHEAD) % ST, kt + AHEAD);
            cp_async_commit();
        }
        const u32 st = base + (kt % ST) * STAGE, sa = st + wg * MW * 8192;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int mw = 0; mw < MW; mw++)
                wgmma_m64<NB>(acc[mw], wg_desc(sa + mw * 8192 + kk * 32), wg_desc(st + A_BYTES + kk * 32));
        wg_commit();
        wg_wait<1>();
        if (WG == 1) {
            if (kt + AHEAD < KT) load((kt + AHEAD) % ST, kt + AHEAD);
            cp_async_commit();
        }
    }
    wg_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int mw = 0; mw < MW; mw++)
#pragma unroll
        for (int j = 0; j < NB / 8; j++) {
            const int col = n0 + 8 * j + 2 * t4;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = (wg * MW + mw) * 64 + warp * 16 + g + 8 * hh;
                if (r < rc) gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mw][4 * j + 2 * hh], acc[mw][4 * j + 2 * hh + 1]);
            }
        }
#else
    __trap();  // wgmma is sm_90a only; ops/moe.rs launches these on sm_90a alone
#endif
}

// d[64] (+)= A (64 x 32 e4m3) * B (128 x 32 e4m3, K-major); `acc` 0 overwrites d. Layout as
// wgmma_m64n128.
__device__ __forceinline__ void wgmma_m64n128_e4m3(float (&d)[64], u64 da, u64 db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(acc)
        : "memory");
}

// Grouped GEMM over FP8 expert weights in quant.cu's fragment layout, DeepSeek's W8A8 scheme on FP8
// tensor cores: Y[rs + r, n] = sum over 128-channel groups b of sx[row, b] sw[b, n] sum_k
// Xq[row, k] Wq[e, n, k], tiles and epilogues as gg_wgmma. Xq: e4m3 [*, K] quantized per token
// per 128 channels with act_quant PERM 2, so that each 32-channel unit of a row holds its channels
// in the order the weights keep a column's 32 bytes of the unit (which then need no reordering:
// a column's 128-channel k-tile is four 32-byte pieces, 256 bytes apart); XS f32 [*, K / 128].
// S: f32 scales per (group, column), [e][K / 128][Np]. K % 128 == 0. COLS reads every column's
// scale; without it, S must hold two scales per 128-column block and group, one for the even
// columns and one for the odd (DeepSeek's 128 x 128 blocks, gate/up interleaved or not), and a
// thread's scale-add takes 4 products instead of 64.
// Persistent and warp-specialized: each block walks the (tile, 256-column block) items
// blockIdx.x, + gridDim.x, ... One producer warpgroup copies a 128 x 256 tile's stages (one
// 128-channel group each; the scales in their own ring) by cp.async, each stage handed over by an
// mbarrier. Two consumer warpgroups of 64 rows each take a stage's two 128-column halves in turn:
// four m64n128k32 wgmmas into fresh accumulators, then the scale-add into that half's result
// (two results and one fresh set fit the registers where m64n256 pairs would not). The consumers
// run unsynchronized with each other, so one's scale-add overlaps the other's wgmmas, and the
// producer fills the next item's stages during their epilogue. A consumer whose 64 rows are all
// past the tile's end skips its wgmmas (an expert's last tile is often half full).
template <int ST, int EPI, bool COLS>
__device__ __forceinline__ void gg_wgmma_fp8(const unsigned char* __restrict__ X, const float* __restrict__ XS,
                                             const int* __restrict__ rowidx, const u32* __restrict__ Wq,
                                             const float* __restrict__ S, void* Y, const int* __restrict__ tiles,
                                             const int* __restrict__ meta, int N, int K, int Np) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 128, BN = 256, A_BYTES = BM * 128, STAGE = A_BYTES + BN * 128;
    constexpr int SC_STAGE = (BN + BM) * 4;  // a stage's column scales, then its row scales (f32)
    extern __shared__ __align__(16) unsigned char wsm[];
    __shared__ __align__(8) unsigned long long bars[2 * ST];  // full[ST], then empty[ST]
    const int KB = K / 128, KUT = K / 32, nblk = (N + BN - 1) / BN, items = meta[0] * nblk;
    const u32 raw = smem_u32(wsm), base = (raw + 1023u) & ~1023u, full0 = smem_u32(bars), empty0 = full0 + 8 * ST;
    const u32 scb = base + ST * STAGE;
    const int tid = threadIdx.x, wg = tid >> 7, p = tid & 127;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < ST; s++) mbar_init(full0 + 8 * s, 128), mbar_init(empty0 + 8 * s, 8);
        mbar_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 64;");
        // A: chunk c of rows r0 + 16 j. B: 16-byte half bh of column (8 (bnb + 2 j) + bg)'s 32
        // bytes of unit bu; a column's row in the stage keeps r % 8 == bg.
        const int c = p & 7, r0 = p >> 3, a_swz = ((c ^ (r0 & 7)) << 4) + r0 * 128;
        const int bh = p & 1, bg = (p >> 1) & 7, bu = (p >> 4) & 3, bnb = p >> 6;
        const int b_swz = (bnb * 8 + bg) * 128 + (((2 * bu + bh) ^ bg) << 4);
        // Column scales: every 16-byte chunk (COLS) or the first of each 128-column half.
        const bool sc_mine = COLS ? p < BN / 4 : (p & 31) == 0 && p < BN / 4;
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const int tile = item / nblk, n0 = (item - tile * nblk) * BN;
            const int e = tiles[3 * tile], rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
            u32 a_off[8], a_ok = 0, b_ok = 0;  // byte offsets into X (the launcher checks they fit)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int r = r0 + 16 * j;
                const int row = r < rc ? (rowidx ? rowidx[rs + r] : rs + r) : 0;
                a_off[j] = (u32)row * (u32)K + c * 16;
                a_ok |= (u32)(r < rc) << j;
            }
#pragma unroll
            for (int j = 0; j < 16; j++) b_ok |= (u32)((n0 / 8 + bnb + 2 * j) * 8 < Np) << j;
            const unsigned char* b_src = reinterpret_cast<const unsigned char*>(Wq) + (u64)e * (Np / 8) * KUT * 256 +
                                         ((u64)(n0 / 8 + bnb) * KUT + bu) * 256 + bg * 32 + bh * 16;
            const u64 b_step = (u64)2 * KUT * 256;
            const u32 sc_ok = sc_mine && n0 + 4 * p < Np, xs_ok = p < rc;
            const float* sc_src = S + (u64)e * KB * Np + n0 + 4 * p;
            const float* xs_src = XS + (u64)(p < rc ? (rowidx ? rowidx[rs + p] : rs + p) : 0) * KB;
            for (int kt = 0; kt < KB; kt++, it++) {
                const int s = it % ST;
                if (it >= ST) mbar_wait(empty0 + 8 * s, ((it / ST) & 1) ^ 1);
                const u32 st = base + s * STAGE, ss = scb + s * SC_STAGE;
#pragma unroll
                for (int j = 0; j < 8; j++) cp_async16_if(st + a_swz + j * 2048, X + a_off[j] + kt * 128, (a_ok >> j) & 1);
#pragma unroll
                for (int j = 0; j < 16; j++)
                    cp_async16_if(st + A_BYTES + b_swz + j * 2048, b_src + j * b_step + kt * 1024, (b_ok >> j) & 1);
                if (sc_mine) cp_async16_if(ss + 16 * p, sc_src + (u64)kt * Np, sc_ok);
                cp_async4_if(ss + BN * 4 + 4 * p, xs_src + kt, xs_ok);
                mbar_arrive_cp_async(full0 + 8 * s);
            }
        }
        cp_async_wait<0>();
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 216;");
        const int cw = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
        const int r = cw * 64 + warp * 16 + g;
        // Stage 0's descriptors; a stage, half or k32 step further is a plain add (shared
        // addresses stay below the descriptors' 18-bit window).
        const u64 da0 = wg_desc(base + cw * 8192), db0 = wg_desc(base + A_BYTES);
        int it = 0;
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            const int tile = item / nblk, n0 = (item - tile * nblk) * BN;
            const int rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
            if (cw * 64 >= rc) {  // no rows of this tile: only keep the stages' count
                for (int kt = 0; kt < KB; kt++, it++) {
                    const int s = it % ST;
                    mbar_wait(full0 + 8 * s, (it / ST) & 1);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(empty0 + 8 * s);
                }
                continue;
            }
            float acc[2][64], part[64];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int q = 0; q < 64; q++) acc[h][q] = 0.f;
            for (int kt = 0; kt < KB; kt++, it++) {
                const int s = it % ST;
                mbar_wait(full0 + 8 * s, (it / ST) & 1);
                const u64 so = (u64)(s * STAGE) >> 4;
                const float* sc = reinterpret_cast<const float*>(wsm + (scb - raw) + s * SC_STAGE);
                const float x0 = sc[BN + r], x1 = sc[BN + r + 8];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
                        wgmma_m64n128_e4m3(part, da0 + so + 2 * kk, db0 + so + h * 1024 + 2 * kk, kk);
                    wg_commit();
                    const float* sh = sc + 128 * h;
                    if constexpr (COLS) {
                        // The column scales read after the wait, one pair at a time (registers).
                        wg_wait<0>();
                        wg_fence_regs(part);
#pragma unroll
                        for (int j = 0; j < 16; j++) {
                            const float2 cs = *reinterpret_cast<const float2*>(sh + 8 * j + 2 * t4);
                            acc[h][4 * j] += part[4 * j] * (x0 * cs.x), acc[h][4 * j + 1] += part[4 * j + 1] * (x0 * cs.y);
                            acc[h][4 * j + 2] += part[4 * j + 2] * (x1 * cs.x);
                            acc[h][4 * j + 3] += part[4 * j + 3] * (x1 * cs.y);
                        }
                        if (h == 1) {
                            __syncwarp();
                            if (lane == 0) mbar_arrive(empty0 + 8 * s);
                        }
                    } else {
                        const float2 c2 = *reinterpret_cast<const float2*>(sh);
                        const float s00 = x0 * c2.x, s01 = x0 * c2.y, s10 = x1 * c2.x, s11 = x1 * c2.y;
                        wg_wait<0>();
                        wg_fence_regs(part);
                        if (h == 1) {
                            __syncwarp();
                            if (lane == 0) mbar_arrive(empty0 + 8 * s);
                        }
#pragma unroll
                        for (int j = 0; j < 16; j++) {
                            acc[h][4 * j] += part[4 * j] * s00, acc[h][4 * j + 1] += part[4 * j + 1] * s01;
                            acc[h][4 * j + 2] += part[4 * j + 2] * s10, acc[h][4 * j + 3] += part[4 * j + 3] * s11;
                        }
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const int col = n0 + 128 * h + 8 * j + 2 * t4;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++)
                        if (r + 8 * hh < rc)
                            gg_store<EPI>(Y, (u64)(rs + r + 8 * hh), col, N, acc[h][4 * j + 2 * hh],
                                          acc[h][4 * j + 2 * hh + 1]);
                }
        }
    }
#else
    __trap();  // wgmma is sm_90a only; ops/moe.rs launches these on sm_90a alone
#endif
}

#define GGW_ARGS const bf16_t *X, const int *rowidx, const bf16_t *Wt, void *Y, const int *tiles, const int *meta, int N, int K
#define GGW_PASS X, rowidx, Wt, Y, tiles, meta, N, K
// Names: ggw_<BM>x<BN>_<ST>_<f32|silu>; ops/moe.rs (GGW_SHAPES, GGW_KERNELS) mirrors them.
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_3_f32(GGW_ARGS) { gg_wgmma<1, 2, 128, 3, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggw_128x128_3_silu(GGW_ARGS) { gg_wgmma<1, 2, 128, 3, 1>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(256, 1) ggw_128x256_3_f32(GGW_ARGS) { gg_wgmma<2, 1, 256, 3, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(256, 1) ggw_128x256_3_silu(GGW_ARGS) { gg_wgmma<2, 1, 256, 3, 1>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(256, 1) ggw_128x256_4_f32(GGW_ARGS) { gg_wgmma<2, 1, 256, 4, 0>(GGW_PASS); }
extern "C" __global__ void __launch_bounds__(256, 1) ggw_128x256_4_silu(GGW_ARGS) { gg_wgmma<2, 1, 256, 4, 1>(GGW_PASS); }

#define GGWF_ARGS                                                                                                 \
    const unsigned char *X, const float *XS, const int *rowidx, const u32 *Wq, const float *S, void *Y,           \
        const int *tiles, const int *meta, int N, int K, int Np
#define GGWF_PASS X, XS, rowidx, Wq, S, Y, tiles, meta, N, K, Np
// Names: ggw_fp8[c]_128x256_<ST>_<f32|silu> (c: per-column scales); ops/moe.rs (GGW_FP8_STAGES)
// mirrors them.
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8_128x256_4_f32(GGWF_ARGS) { gg_wgmma_fp8<4, 0, false>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8_128x256_4_silu(GGWF_ARGS) { gg_wgmma_fp8<4, 1, false>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8_128x256_3_f32(GGWF_ARGS) { gg_wgmma_fp8<3, 0, false>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8_128x256_3_silu(GGWF_ARGS) { gg_wgmma_fp8<3, 1, false>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8c_128x256_4_f32(GGWF_ARGS) { gg_wgmma_fp8<4, 0, true>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8c_128x256_4_silu(GGWF_ARGS) { gg_wgmma_fp8<4, 1, true>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8c_128x256_3_f32(GGWF_ARGS) { gg_wgmma_fp8<3, 0, true>(GGWF_PASS); }
extern "C" __global__ void __launch_bounds__(384, 1) ggw_fp8c_128x256_3_silu(GGWF_ARGS) { gg_wgmma_fp8<3, 1, true>(GGWF_PASS); }
