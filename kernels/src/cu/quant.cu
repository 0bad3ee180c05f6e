// Quantized weights kept compressed on the GPU: AWQ int4 (FMT 0) and FP8 e4m3 (FMT 1), in one
// "fragment order" layout packed at load by kernels/src/quant.rs. For expert e, column block nb
// (8 output columns) and k unit ku (32 input channels) there are 32 lanes x WPL u32 (WPL 1 for
// int4, 2 for fp8); lane l = 4 g + t holds column 8 nb + g at the k offsets that lane's m16n8k16
// B fragments need:
//   int4 nibble j (bits 4j..4j+3): k = 32 ku + 2t + 8 (j & 3) + (j >> 2)
//   fp8 byte b (of the lane's 8):  k = 32 ku + 2t + 8 (b >> 1) + (b & 1)
// so ((w >> 4p) & 0x000F000F) is B register p (k pair 2t + 8p, +1) of the unit's two k16 steps.
// Scales per (group of G input channels, G a power of two >= 32, column): AWQ f16, FP8 f32 (its block scale repeated per
// column); AWQ zero points as nibbles [group][Np / 8], nibble j = column 8 w + j.
//
// The weights become bf16 exactly ((q - z) for AWQ, the e4m3 value itself for FP8); each group's
// scale multiplies the f32 partial sums when the group ends. The activations' bf16 rounding is the
// only rounding, so the result equals an f32 GEMM on the dequantized weights up to summation order.

// Two e4m3 values (the low 16 bits, low byte first) to an f16 pair, exactly.
__device__ __forceinline__ u32 e4m3x2_f16x2(u32 v) {
    u32 h;
    const unsigned short s = (unsigned short)v;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.rn.f16x2.e4m3x2 %0, t; }" : "=r"(h) : "h"(s));
    return h;
}
// Two e4m3 values to a bf16 pair (exact: e4m3 fits in bf16).
__device__ __forceinline__ u32 e4m3x2_bf16x2(u32 v) {
    const u32 h = e4m3x2_f16x2(v);
    return pack_bf16(h2f((unsigned short)(h & 0xffff)), h2f((unsigned short)(h >> 16)));
}
__device__ __forceinline__ float e4m3_f32(u32 byte) { return h2f((unsigned short)(e4m3x2_f16x2(byte & 0xff) & 0xffff)); }

// Y[rs + r, n] = sum_k X[row(rs + r), k] W[e, n, k] for each tile (expert e, rows rs..rs+rc) of
// `tiles`/`meta` (from moe_align), or, when `tiles` is null, for row tiles of BM over M rows of one
// matrix; M is the rows of Y either way. 128 output columns per block, ST-stage cp.async pipeline
// of BK input channels. Split-K over gridDim.z: split z stores f32 partials at Y + z * M * N
// (qgemm_reduce adds them; EPI 0 only). EPI 0 stores f32, EPI 1 takes interleaved gate/up columns and stores bf16 silu(gate) * up.
template <int FMT, int BM, int WM, int WN, int BK, int ST, int EPI>
__device__ __forceinline__ void qgemm(const bf16_t* __restrict__ X, const int* __restrict__ rowidx,
                                      const u32* __restrict__ Wq, const void* __restrict__ S,
                                      const u32* __restrict__ Z, void* Y, const int* __restrict__ tiles,
                                      const int* __restrict__ meta, int M, int N, int K, int Np, int Kp, int G) {
    constexpr int BN = 128, NTH = 32 * WM * WN, SA = BK + 8, KU = BK / 32;
    constexpr int MT = BM / WM / 16, NT = BN / WN / 8, WPL = FMT == 0 ? 1 : 2;
    static_assert(MT >= 1 && NT >= 1 && MT * WM * 16 == BM && NT * WN * 8 == BN && KU * 32 == BK, "shape");
    constexpr int SAS = BM * SA, SBS = 16 * KU * 32 * WPL;  // elements per stage
    // Dynamic shared memory: ST stages of A (bf16) then ST stages of B (u32); the launcher passes
    // ST * (SAS * 2 + SBS * 4) bytes.
    extern __shared__ __align__(16) unsigned char qsmem[];
    bf16_t* sA = reinterpret_cast<bf16_t*>(qsmem);
    u32* sB = reinterpret_cast<u32*>(qsmem + ST * SAS * 2);
    int e, rs, rc;
    if (tiles) {
        const int tile = blockIdx.y;
        if (tile >= meta[0]) return;
        e = tiles[3 * tile], rs = tiles[3 * tile + 1], rc = tiles[3 * tile + 2];
    } else {
        e = 0, rs = blockIdx.y * BM, rc = min(BM, M - rs);
        if (rc <= 0) return;
    }
    const int n0 = blockIdx.x * BN, nb0 = n0 / 8, KUT = Kp / 32, KT = Kp / BK, KG = (K + G - 1) / G;
    const int ushift = __ffs(G) - 6;  // G = 32 << ushift: the group of k unit u is u >> ushift
    const int per = (KT + gridDim.z - 1) / gridDim.z;
    const int kt0 = blockIdx.z * per, nk = min(KT, kt0 + per) - kt0;
    const u32* We = Wq + (u64)e * (Np / 8) * KUT * 32 * WPL;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = warp / WN, wn = warp % WN;
    // Each thread's cp.async chunks, resolved once per block (the row indirection, the column
    // block's run in the packed weights); a stage then only adds its k offset.
    constexpr int AC = BM * (BK / 8), CA = (AC + NTH - 1) / NTH;
    constexpr int CH = KU * 32 * WPL / 4, BC = 16 * CH, CB = (BC + NTH - 1) / NTH;  // CH: chunks per column block
    const bf16_t* a_src[CA];
    int a_dst[CA], a_col[CA];
    bool a_ok[CA];
#pragma unroll
    for (int j = 0; j < CA; j++) {
        const int i = tid + j * NTH, r = i / (BK / 8), c = (i % (BK / 8)) * 8;
        a_ok[j] = i < AC && r < rc;
        const int row = a_ok[j] ? (rowidx ? rowidx[rs + r] : rs + r) : 0;
        a_src[j] = X + (u64)row * K + c, a_col[j] = c, a_dst[j] = r * SA + c;
    }
    const u32* b_src[CB];
    int b_dst[CB];
    bool b_ok[CB];
#pragma unroll
    for (int j = 0; j < CB; j++) {
        const int i = tid + j * NTH, nb = i / CH, c = i % CH;
        b_ok[j] = i < BC && (nb0 + nb) * 8 < Np;
        b_src[j] = b_ok[j] ? We + (u64)(nb0 + nb) * KUT * 32 * WPL + c * 4 : Wq;
        b_dst[j] = nb * KU * 32 * WPL + c * 4;
    }
    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int j = 0; j < CA; j++) {
            if (CA * NTH > AC && tid + j * NTH >= AC) break;
            const bool ok = a_ok[j] && k0 + a_col[j] < K;
            cp_async16(&sA[stage * SAS + a_dst[j]], ok ? a_src[j] + k0 : X, ok ? 16 : 0);
        }
#pragma unroll
        for (int j = 0; j < CB; j++) {
            if (CB * NTH > BC && tid + j * NTH >= BC) break;
            cp_async16(&sB[stage * SBS + b_dst[j]], b_ok[j] ? b_src[j] + (u64)kt * KU * 32 * WPL : Wq, b_ok[j] ? 16 : 0);
        }
    };
    float acc[MT][NT][4], part[MT][NT][4];
#pragma unroll
    for (int a = 0; a < MT; a++)
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[a][b][q] = part[a][b][q] = 0.f;
    // Per group, for this thread's columns: AWQ -(128 + z) as a bf16 pair (the B column g of each
    // n-tile) and the scales of its accumulator columns (2 t4, 2 t4 + 1). The next group's are
    // loaded one group ahead, so no group boundary waits on a global load.
    u32 zz[NT], zn[NT];
    float sc[NT][2], sn[NT][2];
    const int cw = wn * (BN / WN);  // first column of this warp within the block
    auto fetch = [&](int grp, u32(&z)[NT], float(&sv)[NT][2]) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int col = n0 + cw + nt * 8 + 2 * t4;
            sv[nt][0] = sv[nt][1] = 0.f;
            if (col < Np) {  // Np is a multiple of 8: col + 1 < Np too
                if (FMT == 0) {
                    const unsigned short* sp = reinterpret_cast<const unsigned short*>(S) + ((u64)e * KG + grp) * Np + col;
                    sv[nt][0] = h2f(sp[0]), sv[nt][1] = h2f(sp[1]);
                } else {
                    const float* sp = reinterpret_cast<const float*>(S) + ((u64)e * KG + grp) * Np + col;
                    sv[nt][0] = sp[0], sv[nt][1] = sp[1];
                }
            }
            if (FMT == 0) {
                const int n = n0 + cw + nt * 8 + g;
                const u32 zv = n < Np ? (Z[((u64)e * KG + grp) * (Np / 8) + n / 8] >> (4 * g)) & 0xfu : 0u;
                z[nt] = awq_zero(zv);
            }
        }
    };
    int cur = -1, nxt = -1;
    auto fold = [&]() {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                acc[mt][nt][0] += sc[nt][0] * part[mt][nt][0], acc[mt][nt][1] += sc[nt][1] * part[mt][nt][1];
                acc[mt][nt][2] += sc[nt][0] * part[mt][nt][2], acc[mt][nt][3] += sc[nt][1] * part[mt][nt][3];
                part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
            }
    };
    auto set_group = [&](int grp) {
        if (grp == nxt) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) zz[nt] = zn[nt], sc[nt][0] = sn[nt][0], sc[nt][1] = sn[nt][1];
        } else {
            fetch(grp, zz, sc);
        }
        cur = grp;
        nxt = grp + 1 < KG ? grp + 1 : -1;
        if (nxt >= 0) fetch(nxt, zn, sn);
    };
    if (nk > 0) set_group(min((kt0 * KU) >> ushift, KG - 1));  // overlaps the pipeline's first loads
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nk) load(s, kt0 + s);
        cp_async_commit();
    }
    for (int i = 0; i < nk; i++) {
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (i + ST - 1 < nk) load((i + ST - 1) % ST, kt0 + i + ST - 1);
        cp_async_commit();
        const bf16_t* a = sA + (i % ST) * SAS;
        const u32* b = sB + (i % ST) * SBS;
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int grp = min(((kt0 + i) * KU + u) >> ushift, KG - 1);
            if (grp != cur) {  // block-uniform
                if (cur >= 0) fold();
                set_group(grp);
            }
            u32 bf[2][NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const u32* wp = b + ((cw / 8 + nt) * KU + u) * 32 * WPL + lane * WPL;
                if (FMT == 0) {
                    const u32 w = wp[0];
#pragma unroll
                    for (int p = 0; p < 4; p++)
                        bf[p >> 1][nt][p & 1] = awq_pair(w, p, zz[nt]);
                } else {
                    const u32 w0 = wp[0], w1 = wp[1];
                    bf[0][nt][0] = e4m3x2_bf16x2(w0), bf[0][nt][1] = e4m3x2_bf16x2(w0 >> 16);
                    bf[1][nt][0] = e4m3x2_bf16x2(w1), bf[1][nt][1] = e4m3x2_bf16x2(w1 >> 16);
                }
            }
#pragma unroll
            for (int step = 0; step < 2; step++) {
                const int kk = u * 32 + step * 16;
                u32 af[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int r = wm * (BM / WM) + mt * 16 + (lane & 15);
                    ldsm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], a + r * SA + kk + (lane >> 4) * 8);
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mma_bf16(part[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[step][nt][0], bf[step][nt][1]);
            }
        }
    }
    cp_async_wait<0>();
    if (cur >= 0) fold();
    float* yz = reinterpret_cast<float*>(Y) + (u64)blockIdx.z * M * N;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int col = n0 + cw + nt * 8 + 2 * t4;
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int r = wm * (BM / WM) + mt * 16 + g + hh * 8;
                if (r >= rc) continue;
                if (gridDim.z > 1)
                    gg_store<0>(yz, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
                else
                    gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
            }
        }
    }
}

#define QG_ARGS                                                                                                    \
    const bf16_t *X, const int *rowidx, const u32 *Wq, const void *S, const u32 *Z, void *Y, const int *tiles,    \
        const int *meta, int M, int N, int K, int Np, int Kp, int G
#define QG_PASS X, rowidx, Wq, S, Z, Y, tiles, meta, M, N, K, Np, Kp, G
// Decode: 16-row tiles, 8 warps over the columns (16 each: few registers per thread, so two blocks
// of 8 warps fit an SM), deep pipelines so that each block keeps 40-56 KB of weights in flight:
// int4 6 stages of 128 input channels, fp8 8 stages of 64. Prefill: 64-row tiles, 8 warps (2 x 4),
// 4 stages of 32 channels. Kp is a multiple of 128. ops/quant.rs (QG_SHAPES) mirrors these.
extern "C" __global__ void __launch_bounds__(256, 2) qg16_awq_f32(QG_ARGS) { qgemm<0, 16, 1, 8, 128, 6, 0>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg16_awq_silu(QG_ARGS) { qgemm<0, 16, 1, 8, 128, 6, 1>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg64_awq_f32(QG_ARGS) { qgemm<0, 64, 2, 4, 32, 4, 0>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg64_awq_silu(QG_ARGS) { qgemm<0, 64, 2, 4, 32, 4, 1>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg16_fp8_f32(QG_ARGS) { qgemm<1, 16, 1, 8, 64, 8, 0>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg16_fp8_silu(QG_ARGS) { qgemm<1, 16, 1, 8, 64, 8, 1>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg64_fp8_f32(QG_ARGS) { qgemm<1, 64, 2, 4, 32, 4, 0>(QG_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) qg64_fp8_silu(QG_ARGS) { qgemm<1, 64, 2, 4, 32, 4, 1>(QG_PASS); }

// The f32 [rows, n] result (total = rows n values) of a dense GEMM, the sum over splits s of
// part[s * total + i] (split-K partials; one split is a copy), into y; with first < n cut after
// column `first`: columns [0, first) to y as [rows, first], the rest to y2 as [rows, n - first]
// (MLA's q and kv_a projections stacked in one weight).
extern "C" __global__ void qgemm_reduce(const float* __restrict__ part, float* __restrict__ y, int splits, u64 total,
                                        float* __restrict__ y2, int n, int first) {
    pdl_enter();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int z = 0; z < splits; z++) s += part[(u64)z * total + i];
        if (first == n) {
            y[i] = s;
        } else {
            const u64 r = i / n;
            const int c = (int)(i - r * n);
            if (c < first)
                y[r * first + c] = s;
            else
                y2[r * (n - first) + (c - first)] = s;
        }
    }
}

// The e4m3 byte of FP8 weight (e, n, k) in the fragment layout (two words per lane per unit).
__device__ __forceinline__ u32 fp8_at(const u32* __restrict__ Wq, int e, int n, int k, int Np, int Kp) {
    const int kk = k & 31, lane = (n & 7) * 4 + ((kk & 7) >> 1), b = 2 * (kk >> 3) + (kk & 1);
    const u64 base = ((((u64)e * (Np / 8) + (n >> 3)) * (Kp / 32) + (k >> 5)) * 32 + lane) * 2;
    return (Wq[base + (b >> 2)] >> (8 * (b & 3))) & 0xffu;
}

// The plain reference, and the expansion for cuBLAS prefill GEMMs and for MLA's kv_b_proj:
// out[e * N + n, k] = bf16(W[e, n, k]) (AWQ (q - z) * s, FP8 q * s, in f32 then rounded once).
template <int FMT>
__device__ __forceinline__ void qdequant(const u32* __restrict__ Wq, const void* __restrict__ S,
                                         const u32* __restrict__ Z, bf16_t* __restrict__ out, int E, int N, int K,
                                         int Np, int Kp, int G) {
    const int KUT = Kp / 32, KG = (K + G - 1) / G;
    const u64 total = (u64)E * N * K;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int k = (int)(i % K), n = (int)((i / K) % N), e = (int)(i / ((u64)N * K));
        const int kk = k & 31, grp = k / G;
        const u64 sg = ((u64)e * KG + grp) * Np + n;
        float v;
        if (FMT == 0) {
            const int lane = (n & 7) * 4 + ((kk & 7) >> 1);
            const u64 base = (((u64)e * (Np / 8) + (n >> 3)) * KUT + (k >> 5)) * 32 + lane;
            const int j = (kk >> 3) + 4 * (kk & 1);
            const u32 q = (Wq[base] >> (4 * j)) & 0xfu;
            const u32 z = (Z[((u64)e * KG + grp) * (Np / 8) + (n >> 3)] >> (4 * (n & 7))) & 0xfu;
            v = ((float)q - (float)z) * h2f(reinterpret_cast<const unsigned short*>(S)[sg]);
        } else {
            v = e4m3_f32(fp8_at(Wq, e, n, k, Np, Kp)) * reinterpret_cast<const float*>(S)[sg];
        }
        out[((u64)e * N + n) * K + k] = f2bf(v);
    }
}
#define QD_ARGS const u32 *Wq, const void *S, const u32 *Z, bf16_t *out, int E, int N, int K, int Np, int Kp, int G
extern "C" __global__ void qdequant_awq(QD_ARGS) { qdequant<0>(Wq, S, Z, out, E, N, K, Np, Kp, G); }
extern "C" __global__ void qdequant_fp8(QD_ARGS) { qdequant<1>(Wq, S, Z, out, E, N, K, Np, Kp, G); }

// The AWQ expansion of prefill (the values equal qdequant's: the same f32 product, rounded once;
// N % 8 == 0, groups multiples of 32 and K % 32 == 0, so a k-tile of 32 lies in one group), by
// rows: a block of 8 warps
// takes one packed column block (8 output rows, warp w row 8 nb + w) and 16 k-tiles of it; lane
// (s, a) = (lane / 4, lane % 4) writes k-tiles s and s + 8 at k offsets 8a..8a+7, so each store
// instruction writes 512 contiguous bytes of one row. The 8 values come from nibbles a and a + 4
// of the tile's four words (k = 8a + 2t + b: word t, nibble a + 4b), which the four lanes of a
// tile load together (one 16-byte load, broadcast). A nibble becomes a float exactly by its bits
// under 2^23's exponent: (2^23 + q) - (2^23 + z) = q - z, then times the scale, rounded once.
// H200 (run 106): the V3 gate/up stack (36864 x 7168) in 296 us, 2.27 TB/s read + written,
// where a thread per row k-tile (four 16-byte stores into four rows' half sectors each) took 435.
// Four k-tiles per lane measured the same (-5% on that stack, +8% on q_b_proj's).
extern "C" __global__ void __launch_bounds__(256) qdequant_awq_rows(QD_ARGS) {
    constexpr int KPL = 2;  // k-tiles per lane
    const int KUT = Kp / 32, KT = K / 32, KG = (K + G - 1) / G, NB = N / 8, KC = (KT + 8 * KPL - 1) / (8 * KPL);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane >> 2, a = lane & 3;
    const int items = E * NB * KC;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int kc = item % KC, nb = (item / KC) % NB, e = item / (KC * NB);
        const int n = nb * 8 + warp;
        const u32* wrow = Wq + ((u64)e * (Np / 8) + nb) * KUT * 32 + warp * 4;
        const u32* zrow = Z + (u64)e * KG * (Np / 8) + nb;
        const unsigned short* srow = reinterpret_cast<const unsigned short*>(S) + (u64)e * KG * Np + n;
        bf16_t* orow = out + ((u64)e * N + n) * K + 8 * a;
        uint4 w[KPL];
        int kt[KPL];
#pragma unroll
        for (int h = 0; h < KPL; h++) {
            kt[h] = kc * 8 * KPL + sub + 8 * h;
            w[h] = kt[h] < KT ? *reinterpret_cast<const uint4*>(wrow + kt[h] * 32) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int h = 0; h < KPL; h++) {
            if (kt[h] >= KT) continue;
            const int grp = kt[h] * 32 / G;
            const u32 z = (zrow[(u64)grp * (Np / 8)] >> (4 * warp)) & 0xfu;
            const float zb = __uint_as_float(0x4B000000u | z);
            const float sc = h2f(srow[(u64)grp * Np]);
            const u32 ws[4] = {w[h].x >> (4 * a), w[h].y >> (4 * a), w[h].z >> (4 * a), w[h].w >> (4 * a)};
            u32 pk[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float v0 = (__uint_as_float(0x4B000000u | (ws[t] & 0xfu)) - zb) * sc;
                const float v1 = (__uint_as_float(0x4B000000u | ((ws[t] >> 16) & 0xfu)) - zb) * sc;
                pk[t] = pack_bf16(v0, v1);
            }
            *reinterpret_cast<uint4*>(orow + kt[h] * 32) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        }
    }
}

// Matrix 0 of an FP8 stack as row-major e4m3 bytes `[N, K]` (K % 4 == 0), for the block-scaled
// tensor-core GEMM of prefill: four bytes per thread.
extern "C" __global__ void qbytes_fp8(const u32* __restrict__ Wq, u32* __restrict__ out, int N, int K, int Np, int Kp) {
    const u64 total = (u64)N * K / 4;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int n = (int)(i * 4 / K), k = (int)(i * 4 % K);
        u32 w = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) w |= fp8_at(Wq, 0, n, k + j, Np, Kp) << (8 * j);
        out[i] = w;
    }
}

// Two floats to packed e4m3x2, rounded to nearest even and saturated to +-448; `lo` in the low byte.
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// DeepSeek's activation quantization (kernels/src/fp8.rs is the reference): per token and 128
// input channels, s = max(amax, 1e-10) / 448 and q = e4m3(x / s). One warp per block of 128, four
// channels per lane. X [M, K] (K % 128 == 0), f32 or (BF16) bf16.
//   PERM 0 (the block-scaled prefill GEMM): Q e4m3 [Mp, K]; S f32 [K / 128, Mp] (token-major);
//          rows M..Mp are zeros.
//   PERM 1 (qg_persistent): Q [M, K] permuted within each 32-channel unit (channel k at position
//          16 (k >> 4) + 4 ((k & 7) >> 1) + 2 ((k >> 3) & 1) + (k & 1), the inverse of qdecode.cu's pi);
//          S f32 [M, K / 128]; Mp == M.
//   PERM 2 (the FP8 wgmma grouped GEMM, wgmma.cu): as PERM 1 with channel k at position
//          8 ((k >> 1) & 3) + 2 (k >> 3) + (k & 1), where the weights' fragment layout keeps it in
//          a column's 32 bytes of the unit.
template <bool BF16, int PERM>
__device__ __forceinline__ void act_quant(const void* __restrict__ X, unsigned char* __restrict__ Q,
                                          float* __restrict__ S, int M, int Mp, int K) {
    pdl_enter();
    const int KB = K / 128, lane = threadIdx.x & 31;
    const int w = (int)(((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (w >= Mp * KB) return;
    const int r = w / KB, b = w % KB;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (r < M) {
        const u64 at = (u64)r * K + b * 128 + lane * 4;
        if (BF16) {
            const uint2 p = *reinterpret_cast<const uint2*>(reinterpret_cast<const bf16_t*>(X) + at);
            v[0] = __uint_as_float(p.x << 16), v[1] = __uint_as_float(p.x & 0xffff0000u);
            v[2] = __uint_as_float(p.y << 16), v[3] = __uint_as_float(p.y & 0xffff0000u);
        } else {
            const float4 p = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(X) + at);
            v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w;
        }
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    amax = warp_max(amax);
    const float s = fmaxf(amax, 1e-10f) / 448.f;
    const u32 q = e4m3x2(v[0] / s, v[1] / s) | (e4m3x2(v[2] / s, v[3] / s) << 16);
    unsigned char* row = Q + (u64)r * K + b * 128;
    if (PERM) {
        // Channels 4 lane .. 4 lane + 3: unit lane / 8, offsets o .. o + 3 (o = 4 (lane % 8)); the
        // pairs (o, o + 1) and (o + 2, o + 3) stay adjacent.
        const int unit = lane >> 3, o = 4 * (lane & 7);
        auto pos = [](int k) {
            return PERM == 1 ? 16 * (k >> 4) + 4 * ((k & 7) >> 1) + 2 * ((k >> 3) & 1) + (k & 1)
                             : 8 * ((k >> 1) & 3) + 2 * (k >> 3) + (k & 1);
        };
        unsigned short* d = reinterpret_cast<unsigned short*>(row + unit * 32);
        d[pos(o) >> 1] = (unsigned short)(q & 0xffffu);
        d[pos(o + 2) >> 1] = (unsigned short)(q >> 16);
        if (lane == 0) S[(u64)r * KB + b] = s;
    } else {
        reinterpret_cast<u32*>(row)[lane] = q;
        if (lane == 0) S[(u64)b * Mp + r] = s;
    }
}
#define AQ_ARGS const void *X, unsigned char *Q, float *S, int M, int Mp, int K
extern "C" __global__ void act_quant_fp8(AQ_ARGS) { act_quant<false, 0>(X, Q, S, M, Mp, K); }
extern "C" __global__ void act_quant_fp8_mma_f32(AQ_ARGS) { act_quant<false, 1>(X, Q, S, M, Mp, K); }
extern "C" __global__ void act_quant_fp8_mma_bf16(AQ_ARGS) { act_quant<true, 1>(X, Q, S, M, Mp, K); }
extern "C" __global__ void act_quant_fp8_wg_f32(AQ_ARGS) { act_quant<false, 2>(X, Q, S, M, Mp, K); }
extern "C" __global__ void act_quant_fp8_wg_bf16(AQ_ARGS) { act_quant<true, 2>(X, Q, S, M, Mp, K); }
