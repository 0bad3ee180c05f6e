// DeepSeek MoE on the GPU: a grouped bf16 tensor-core GEMM over every (expert tile, column tile)
// pair in one launch (tiled, persistent), over the row tiles routing.cu's sort made, and the
// reference-precision f32 experts.

// One k16 step of a warp's tensor-core MMAs from shared memory with ldmatrix fragments: MT
// 16-row A blocks from row a0, NT 8-column B blocks (weight rows) from row b0, at column kk.
// `at(r, k)` is the element offset of row r, column k (a multiple of 8) within a stage.
template <int MT, int NT, class At>
__device__ __forceinline__ void mma_k16(float (&acc)[MT][NT][4], const bf16_t* a, const bf16_t* b, int a0, int b0, int kk,
                                        int lane, At at) {
    u32 af[MT][4], bfr[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r = a0 + mt * 16 + (lane & 15);
        ldsm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], a + at(r, kk + (lane >> 4) * 8));
    }
#pragma unroll
    for (int nt = 0; nt + 1 < NT; nt += 2) {
        const int n = b0 + nt * 8 + ((lane >> 4) & 1) * 8 + (lane & 7);
        ldsm_x4(bfr[nt][0], bfr[nt][1], bfr[nt + 1][0], bfr[nt + 1][1], b + at(n, kk + ((lane >> 3) & 1) * 8));
    }
    if (NT % 2) {
        const int n = b0 + (NT - 1) * 8 + (lane & 7);
        ldsm_x2(bfr[NT - 1][0], bfr[NT - 1][1], b + at(n, kk + ((lane >> 3) & 1) * 8));
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma_bf16(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bfr[nt][0], bfr[nt][1]);
}

// Grouped GEMM: for each tile (expert e, sorted rows rs..rs+rc) and column block n0..n0+128,
// Y[rs + r, n] = sum_k X[row(rs + r), k] * W[e, n, k], with row(p) = rowidx[p] (or p when null).
// EPI 0 stores f32 [*, N]; EPI 1 takes interleaved gate/up columns (2j gate, 2j+1 up) and stores
// bf16 silu(gate) * up as [*, N/2]. K % 8 == 0. 128 threads, ST-stage cp.async pipeline, BK = 32.
// Two generations share this template (V2 is a compile-time constant): v1 (ST 3) loads MMA
// fragments with 32-bit shared loads; v2 (the default) loads them with ldmatrix and prefetches
// weight lines into L2 ahead of the pipeline.
template <int BM, int WM, int WN, int EPI, int ST, bool V2>
__device__ __forceinline__ void grouped_gemm(const bf16_t* __restrict__ X, const int* __restrict__ rowidx,
                                            const bf16_t* __restrict__ Wt, void* Y, const int* __restrict__ tiles,
                                            const int* __restrict__ meta, int N, int K) {
    constexpr int BN = 128, BK = 32, SA = BK + 8;
    constexpr int MT = BM / WM / 16, NT = BN / WN / 8;
    __shared__ __align__(16) bf16_t sA[ST][BM * SA];
    __shared__ __align__(16) bf16_t sB[ST][BN * SA];
    const int tile = blockIdx.y;
    if (tile >= meta[0]) return;
    const int e = tiles[3 * tile], rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
    const int n0 = blockIdx.x * BN;
    const bf16_t* Wb = Wt + (u64)e * N * K;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = warp / WN, wn = warp % WN;
    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
        for (int i = tid; i < BM * (BK / 8); i += 128) {
            const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
            const bool ok = r < rc && k0 + c < K;
            const bf16_t* src = X;
            if (ok) {
                const int p = rs + r;
                const int row = rowidx ? rowidx[p] : p;
                src = X + (u64)row * K + k0 + c;
            }
            cp_async16(&sA[stage][r * SA + c], src, ok ? 16 : 0);
        }
        for (int i = tid; i < BN * (BK / 8); i += 128) {
            const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
            const bool ok = n0 + r < N && k0 + c < K;
            const bf16_t* src = ok ? Wb + (u64)(n0 + r) * K + k0 + c : Wt;
            cp_async16(&sB[stage][r * SA + c], src, ok ? 16 : 0);
        }
    };
    float acc[MT][NT][4];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < NT; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.f;
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < KT) load(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (kt + ST - 1 < KT) load((kt + ST - 1) % ST, kt + ST - 1);
        cp_async_commit();
        if (V2) {  // each thread pulls one weight row's 128-byte line four tiles past the pipeline into L2
            const int k_pf = (kt + ST + 3) * BK;
            if (k_pf < K && n0 + tid < N && (kt & 1) == 0) prefetch_l2(Wb + (u64)(n0 + tid) * K + k_pf);
        }
        const bf16_t* a = sA[kt % ST];
        const bf16_t* b = sB[kt % ST];
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            if (V2) {
                mma_k16(acc, a, b, wm * (BM / WM), wn * (BN / WN), kk, lane, [](int r, int k) { return r * SA + k; });
            } else {
                u32 af[MT][4], bfr[NT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int r = wm * (BM / WM) + mt * 16 + g;
                    af[mt][0] = ld_u32(a + r * SA + kk + 2 * t4);
                    af[mt][1] = ld_u32(a + (r + 8) * SA + kk + 2 * t4);
                    af[mt][2] = ld_u32(a + r * SA + kk + 8 + 2 * t4);
                    af[mt][3] = ld_u32(a + (r + 8) * SA + kk + 8 + 2 * t4);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int n = wn * (BN / WN) + nt * 8 + g;
                    bfr[nt][0] = ld_u32(b + n * SA + kk + 2 * t4);
                    bfr[nt][1] = ld_u32(b + n * SA + kk + 8 + 2 * t4);
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mma_bf16(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bfr[nt][0], bfr[nt][1]);
            }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int col = n0 + wn * (BN / WN) + nt * 8 + 2 * t4;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = wm * (BM / WM) + mt * 16 + g + hh * 8;
                if (r >= rc) continue;
                gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
            }
        }
    }
}

#define GG_ARGS const bf16_t *X, const int *rowidx, const bf16_t *Wt, void *Y, const int *tiles, const int *meta, int N, int K
#define GG_PASS X, rowidx, Wt, Y, tiles, meta, N, K
extern "C" __global__ void __launch_bounds__(128) gg16_f32(GG_ARGS) { grouped_gemm<16, 1, 4, 0, 3, false>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg16_silu(GG_ARGS) { grouped_gemm<16, 1, 4, 1, 3, false>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg64_f32(GG_ARGS) { grouped_gemm<64, 2, 2, 0, 3, false>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg64_silu(GG_ARGS) { grouped_gemm<64, 2, 2, 1, 3, false>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg16_f32_v2(GG_ARGS) { grouped_gemm<16, 1, 4, 0, 4, true>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg16_silu_v2(GG_ARGS) { grouped_gemm<16, 1, 4, 1, 4, true>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg64_f32_v2(GG_ARGS) { grouped_gemm<64, 2, 2, 0, 3, true>(GG_PASS); }
extern "C" __global__ void __launch_bounds__(128) gg64_silu_v2(GG_ARGS) { grouped_gemm<64, 2, 2, 1, 3, true>(GG_PASS); }

// Reference-precision experts, f32 weights and activations, one block per sorted row.
// gate_up is [E, 2I, H] with gate/up rows interleaved; act[p] = silu(gate) * up.
extern "C" __global__ void moe_f32_gateup(const float* X, const int* sorted_tok, const int* row_expert, const float* Wgu,
                                          float* act, int H, int I) {
    const int p = blockIdx.x;
    const float* x = X + (u64)sorted_tok[p] * H;
    const float* w = Wgu + (u64)row_expert[p] * 2 * I * H;
    for (int j = threadIdx.x; j < I; j += blockDim.x) {
        float g = 0.f, u = 0.f;
        for (int k = 0; k < H; k++) {
            g += x[k] * w[(u64)(2 * j) * H + k];
            u += x[k] * w[(u64)(2 * j + 1) * H + k];
        }
        act[(u64)p * I + j] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" __global__ void moe_f32_down(const float* act, const int* row_expert, const float* Wd, float* Y, int H, int I) {
    const int p = blockIdx.x;
    const float* a = act + (u64)p * I;
    const float* w = Wd + (u64)row_expert[p] * H * I;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        float s = 0.f;
        for (int k = 0; k < I; k++) s += a[k] * w[(u64)c * I + k];
        Y[(u64)p * H + c] = s;
    }
}

// Persistent decode grouped GEMM (row tiles of at most BM = 16 or 32 rows from moe_align): the
// products and epilogues of `grouped_gemm`, over work items (tile, column block of BN) in
// tile-major order. The grid is one wave of resident blocks; block b takes the items
// [b T / G, (b + 1) T / G) of T = meta[0] * ceil(N / BN) and runs one ST-stage cp.async pipeline
// over its flattened (item, k-tile) sequence, so the next item's first k-tiles load while the
// current item's last ones are multiplied; an item's epilogue runs right after its last k-tile.
// 4 warps: WN over the item's columns x WK over the k16 steps of each k-tile (WK 2 sums the halves
// through shared memory; BM 16 only). BM 32 serves 16-32 rows per expert with one read of its
// weights where two 16-row tiles would read them twice. Stages are unpadded, 16-byte chunks XOR-swizzled (conflict-free
// ldmatrix). pf > 0 prefetches weight lines into L2 pf k-tiles past the loader (also into the next
// item of the same tile). K % 8 == 0; EPI 1 needs BN even (column pairs stay in one item).
template <int BK>
__device__ __forceinline__ int swz(int r, int k) {
    constexpr int CH = BK / 8;
    return r * BK + (((k >> 3) ^ ((CH >= 8 ? r : r >> 1) & (CH >= 8 ? 7 : CH - 1))) << 3);
}

template <int BM, int BN, int BK, int ST, int WK, int EPI>
__device__ __forceinline__ void gg_persistent(const bf16_t* __restrict__ X, const int* __restrict__ rowidx,
                                             const bf16_t* __restrict__ Wt, void* Y, const int* __restrict__ tiles,
                                             const int* __restrict__ meta, int N, int K, int pf) {
    pdl_enter();
    constexpr int MT = BM / 16, CH = BK / 8, WN = 4 / WK, NT = BN / WN / 8;
    constexpr int CA = (BM * CH + 127) / 128, CB = (BN * CH + 127) / 128;  // 16-byte chunks per thread
    static_assert((BK == 32 || BK == 64) && WN * WK == 4 && NT * WN * 8 == BN && BK % (16 * WK) == 0, "shape");
    static_assert((BM == 16 || BM == 32) && (BM == 16 || WK == 1), "rows");
    __shared__ __align__(128) bf16_t sA[ST][BM * BK];
    __shared__ __align__(128) bf16_t sB[ST][BN * BK];
    __shared__ float sR[WK > 1 ? (WK - 1) * WN * NT * 4 * 32 : 1];
    const int NB = (N + BN - 1) / BN, KT = (K + BK - 1) / BK;
    const long long total = (long long)meta[0] * NB;
    const int i0 = (int)(total * blockIdx.x / gridDim.x), i1 = (int)(total * (blockIdx.x + 1) / gridDim.x);
    if (i0 >= i1) return;
    const int S = (i1 - i0) * KT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wn = warp % WN, wk = WK > 1 ? warp / WN : 0;
    // Loader cursor: item l_item = (l_tile, column block at l_n0), k-tile l_kt; this thread's
    // A and B source rows (column offset included) and whether they exist.
    int l_item = i0, l_tile = i0 / NB, l_n0 = (i0 % NB) * BN, l_kt = 0;
    const bf16_t* l_w = Wt;
    const bf16_t* l_a[CA];
    const bf16_t* l_b[CB];
    bool a_ok[CA], b_ok[CB];
    auto set_tile = [&]() {
        const int e = tiles[3 * l_tile], rs = tiles[3 * l_tile + 1], rc = tiles[3 * l_tile + 2];
        l_w = Wt + (u64)e * N * K;
#pragma unroll
        for (int j = 0; j < CA; j++) {
            const int i = tid + 128 * j, r = i / CH;
            a_ok[j] = i < BM * CH && r < rc;
            const int row = a_ok[j] ? (rowidx ? rowidx[rs + r] : rs + r) : 0;
            l_a[j] = X + (u64)row * K + (i % CH) * 8;
        }
    };
    auto set_cols = [&]() {
#pragma unroll
        for (int j = 0; j < CB; j++) {
            const int i = tid + 128 * j, n = l_n0 + i / CH;
            b_ok[j] = i < BN * CH && n < N;
            l_b[j] = l_w + (u64)(b_ok[j] ? n : 0) * K + (i % CH) * 8;
        }
    };
    auto load = [&](int stage) {
        const int k0 = l_kt * BK;
#pragma unroll
        for (int j = 0; j < CA; j++) {
            const int i = tid + 128 * j;
            if (CA * 128 > BM * CH && i >= BM * CH) break;
            const bool ok = a_ok[j] && k0 + (i % CH) * 8 < K;
            cp_async16(&sA[stage][swz<BK>(i / CH, (i % CH) * 8)], ok ? l_a[j] + k0 : X, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < CB; j++) {
            const int i = tid + 128 * j;
            if (CB * 128 > BN * CH && i >= BN * CH) break;
            const bool ok = b_ok[j] && k0 + (i % CH) * 8 < K;
            cp_async16(&sB[stage][swz<BK>(i / CH, (i % CH) * 8)], ok ? l_b[j] + k0 : Wt, ok ? 16 : 0);
        }
        if (pf > 0) {  // one 128-byte line per (row, 64 columns): threads tid % BN = row, tid / BN = line
            int kt2 = l_kt + pf, n2 = l_n0;
            if (kt2 >= KT) kt2 -= KT, n2 += BN;  // the next item of this tile (none when n2 >= N)
            const int r = tid % BN, kl = kt2 * BK + (tid / BN) * 64;
            if (tid < BN * (BK / 64 > 1 ? BK / 64 : 1) && kt2 < KT && n2 + r < N && kl < K && (BK >= 64 || (kt2 & 1) == 0))
                prefetch_l2(l_w + (u64)(n2 + r) * K + kl);
        }
        if (++l_kt == KT) {  // advance to the next item
            l_kt = 0;
            l_n0 += BN;
            if (++l_item < i1) {
                if (l_n0 >= N) {
                    l_n0 = 0;
                    l_tile++;
                    set_tile();
                }
                set_cols();
            }
        }
    };
    set_tile();
    set_cols();
    float acc[MT][NT][4];
    auto clear = [&]() {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    };
    clear();
    int c_tile = i0 / NB, c_n0 = (i0 % NB) * BN, c_kt = 0, cs = 0, ls = ST - 1;
#pragma unroll 1
    for (int s = 0; s < ST - 1; s++) {
        if (s < S) load(s);
        cp_async_commit();
    }
    // Commit group j holds step j (empty past S): waiting for all but ST - 2 groups at step s
    // lands step s; the barrier also retires every warp's reads of stage (s - 1) % ST = ls.
    for (int s = 0; s < S; s++) {
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (s + ST - 1 < S) load(ls);
        cp_async_commit();
        ls = ls + 1 == ST ? 0 : ls + 1;
#pragma unroll
        for (int j = 0; j < BK / (16 * WK); j++)  // k16 steps wk, wk + WK, ...
            mma_k16(acc, sA[cs], sB[cs], 0, wn * (BN / WN), 16 * (j * WK + wk), lane,
                    [](int r, int k) { return swz<BK>(r, k); });
        cs = cs + 1 == ST ? 0 : cs + 1;
        if (++c_kt < KT) continue;
        // Epilogue of the item whose last k-tile this was (block-uniform).
        c_kt = 0;
        if (WK > 1) {  // sR is rewritten only after the next step's barrier
            if (wk > 0)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int q = 0; q < 4; q++) sR[((((wk - 1) * WN + wn) * NT + nt) * 4 + q) * 32 + lane] = acc[0][nt][q];
            __syncthreads();
            if (wk == 0)
#pragma unroll
                for (int w = 1; w < WK; w++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int q = 0; q < 4; q++) acc[0][nt][q] += sR[((((w - 1) * WN + wn) * NT + nt) * 4 + q) * 32 + lane];
        }
        if (wk == 0) {
            const int rs = tiles[3 * c_tile + 1], rc = tiles[3 * c_tile + 2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int col = c_n0 + wn * (BN / WN) + nt * 8 + 2 * t4;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int r = mt * 16 + g + 8 * hh;
                        if (r < rc) gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
                    }
                }
        }
        clear();
        c_n0 += BN;
        if (c_n0 >= N) c_n0 = 0, c_tile++;
    }
    cp_async_wait<0>();
}

// Names: ggp<BN>_<BK>_<ST>_{f32,silu}; BN 16 splits each k-tile's k16 steps over two warp pairs.
#define GGP_ARGS GG_ARGS, int pf
#define GGP_PASS GG_PASS, pf
extern "C" __global__ void __launch_bounds__(128) ggp16_32_8_f32(GGP_ARGS) { gg_persistent<16, 16, 32, 8, 2, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp16_32_8_silu(GGP_ARGS) { gg_persistent<16, 16, 32, 8, 2, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp16_64_4_f32(GGP_ARGS) { gg_persistent<16, 16, 64, 4, 2, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp16_64_4_silu(GGP_ARGS) { gg_persistent<16, 16, 64, 4, 2, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp16_64_8_f32(GGP_ARGS) { gg_persistent<16, 16, 64, 8, 2, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp16_64_8_silu(GGP_ARGS) { gg_persistent<16, 16, 64, 8, 2, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_32_4_f32(GGP_ARGS) { gg_persistent<16, 32, 32, 4, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_32_4_silu(GGP_ARGS) { gg_persistent<16, 32, 32, 4, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_32_8_f32(GGP_ARGS) { gg_persistent<16, 32, 32, 8, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_32_8_silu(GGP_ARGS) { gg_persistent<16, 32, 32, 8, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_64_4_f32(GGP_ARGS) { gg_persistent<16, 32, 64, 4, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_64_4_silu(GGP_ARGS) { gg_persistent<16, 32, 64, 4, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_64_6_f32(GGP_ARGS) { gg_persistent<16, 32, 64, 6, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp32_64_6_silu(GGP_ARGS) { gg_persistent<16, 32, 64, 6, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_4_f32(GGP_ARGS) { gg_persistent<16, 64, 32, 4, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_4_silu(GGP_ARGS) { gg_persistent<16, 64, 32, 4, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_6_f32(GGP_ARGS) { gg_persistent<16, 64, 32, 6, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_6_silu(GGP_ARGS) { gg_persistent<16, 64, 32, 6, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_8_f32(GGP_ARGS) { gg_persistent<16, 64, 32, 8, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggp64_32_8_silu(GGP_ARGS) { gg_persistent<16, 64, 32, 8, 1, 1>(GGP_PASS); }
// 32-row tiles (16-32 rows per expert): ggpr32_<BN>_<BK>_<ST>_{f32,silu}.
extern "C" __global__ void __launch_bounds__(128) ggpr32_32_64_4_f32(GGP_ARGS) { gg_persistent<32, 32, 64, 4, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_32_64_4_silu(GGP_ARGS) { gg_persistent<32, 32, 64, 4, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_32_64_5_f32(GGP_ARGS) { gg_persistent<32, 32, 64, 5, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_32_64_5_silu(GGP_ARGS) { gg_persistent<32, 32, 64, 5, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_64_32_6_f32(GGP_ARGS) { gg_persistent<32, 64, 32, 6, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_64_32_6_silu(GGP_ARGS) { gg_persistent<32, 64, 32, 6, 1, 1>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_64_64_3_f32(GGP_ARGS) { gg_persistent<32, 64, 64, 3, 1, 0>(GGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) ggpr32_64_64_3_silu(GGP_ARGS) { gg_persistent<32, 64, 64, 3, 1, 1>(GGP_PASS); }
