// Decode GEMMs over compressed weights (the fragment-order layout of quant.cu), persistent like
// gg_persistent (moe.cu): one wave of resident blocks, block b taking the work items
// [b T / G, (b + 1) T / G) and streaming their k-tiles through one cp.async pipeline, so that no
// block starts cold and the next item's weights load under the current item's MMAs.
//   FMT 0: AWQ int4, unpacked in registers to exact bf16 (q - z) for bf16 MMAs; each k-tile's f32
//          partial sums are multiplied by its group's scales (as qgemm, so the result equals an
//          f32 GEMM on the dequantized weights up to summation order).
//   FMT 1: FP8 e4m3 weights straight into FP8 MMAs (m16n8k32) against activations quantized per
//          token per 128 channels (DeepSeek's scheme, as the block-scaled prefill GEMM): each
//          k-tile's partial sums are multiplied by the token's and the weight block's scales.
// The FP8 activations are stored permuted within each 32-channel unit (act_quant_fp8 with PERM,
// quant.cu): position s holds channel pi(s) = 16 (s >> 4) + 2 ((s >> 2) & 3) + 8 ((s >> 1) & 1)
// + (s & 1), the channel the weights' fragment layout puts in MMA k-slot s, so that both operands
// are plain 16-byte rows (ldmatrix for A, one 8-byte shared load per lane for B).

__device__ __forceinline__ void mma_e4m3(float* c, const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The f32 value of a dense result's row `row` at column `col` < N: [rows, N] at Y, or with a cut
// after column `first` < N, columns [0, first) to Y as [rows, first] and the rest to Y2 as
// [rows, N - first].
__device__ __forceinline__ void store_cut(float* Y, float* Y2, u64 row, int col, int N, int first, float v) {
    if (col < first)
        Y[row * first + col] = v;
    else
        Y2[row * (N - first) + (col - first)] = v;
}
// Byte offset of 16-byte chunk c of row r in rows of CH chunks, XOR-swizzled so that ldmatrix over
// eight consecutive rows touches distinct banks.
template <int CH>
__device__ __forceinline__ int qswz(int r, int c) {
    return (r * CH + (c ^ ((CH >= 8 ? r : r >> 1) & (CH >= 8 ? 7 : CH - 1)))) * 16;
}

// Y[rs + r, n] = sum_k X[row(rs + r), k] W[e, n, k] over work items (row tile of at most BM = 16 MT
// rows, column block of BN, input split z): the tiles of `tiles`/`meta` (moe_align with BM; items
// tile-major, so that consecutive items share their rows), or, when `tiles` is null, BM-row tiles
// of M rows of matrix 0 (items column-block-major, so that consecutive items share their weights
// through L2). `splits` (> 1 only for EPI 0) cuts the k-tiles into equal parts, split z storing
// f32 partials at Y + z * M * N for qgemm_reduce. EPI 0 stores f32, EPI 1 takes interleaved
// gate/up columns and stores bf16 silu(gate) * up. BK <= G (one group per k-tile); Kp % BK == 0,
// (Kp / BK) % splits == 0. FMT 1: X holds e4m3 bytes [*, K], XS f32 scales [*, K / 128], K % 128 == 0.
// 4 warps, each over BN / 4 columns (NT n-tiles of 8), every k step and all MT 16-row tiles (the
// weights are unpacked once for MT MMAs).
// Blocks take whole items, or with stream-K (`sk_ws` non-null, one split) equal runs of the
// items' k-tiles, so that every block streams the same bytes whatever the item count. An item
// cut between blocks is finished by the block holding its first k-tile, which reaches it last:
// the later pieces' blocks (which start with them) leave their partial sums in their slot of
// `sk_ws` (BM x BN floats per block) and raise their flag in `sk_flag`; the first piece's block
// adds them in block order (so the result does not depend on timing), lowers the flags and
// stores. The grid must fit on the GPU at once (the launcher's resident blocks): a block waits
// only on blocks after it, which never wait before they hand over. Dense f32 results of one
// split are cut after column `first` (< N) into Y and Y2 (first == N: no cut).
template <int FMT, int MT, int BN, int BK, int ST, int EPI, int TOK = 16, bool WG = false>
__device__ __forceinline__ void qg_persistent(const void* __restrict__ X, const int* __restrict__ rowidx,
                                              const u32* __restrict__ Wq, const void* __restrict__ S,
                                              const u32* __restrict__ Z, void* Y, const int* __restrict__ tiles,
                                              const int* __restrict__ meta, int M, int N, int K, int Np, int Kp,
                                              int G, const float* __restrict__ XS, int splits,
                                              float* __restrict__ sk_ws, u32* __restrict__ sk_flag,
                                              float* __restrict__ Y2, int first) {
    constexpr int WPL = FMT == 0 ? 1 : 2, KU = BK / 32, NT = BN / 32, XB = FMT == 0 ? 2 : 1, SB = FMT == 0 ? 2 : 4;
    constexpr int ACH = BK * XB / 16;                     // A chunks per row
    constexpr int BM = TOK * MT, A_BYTES = BM * ACH * 16, UCH = KU * 8 * WPL;  // UCH: B chunks per column block
    constexpr int B_BYTES = (BN / 8) * UCH * 16, S_BYTES = BN * SB;
    constexpr int Z_WORDS = FMT == 0 ? BN / 8 : 0, XS_ROWS = FMT == 1 ? BM : 0;
    constexpr int S_OFF = A_BYTES + B_BYTES, Z_OFF = S_OFF + S_BYTES;
    // wgmma reads the token tile as a 128-byte-swizzled operand: stages 1024-byte aligned.
    constexpr int STAGE_USED = Z_OFF + (Z_WORDS + XS_ROWS) * 4, MT_BYTES = TOK * ACH * 16;
    constexpr int STAGE = WG ? (STAGE_USED + 1023) / 1024 * 1024 : STAGE_USED;
    constexpr int NJ = TOK == 16 ? NT : NT / 2;  // accumulator tiles per row tile and warp
    constexpr int CA = (BM * ACH + 127) / 128, CB = (BN / 8) * UCH / 128, SCH = S_BYTES / 16;
    static_assert(NT >= 1 && NT * 32 == BN && KU * 32 == BK && STAGE % 16 == 0 && SCH <= 64 && (WG || MT <= 4), "shape");
    static_assert(TOK == 16 || (TOK == 8 && FMT == 0 && NT % 2 == 0), "tokens as N: AWQ only, column-group pairs");
    static_assert(!WG || (TOK == 8 && BK == 64 && BN % 64 == 0 && MT == 8), "wgmma: 64-column slabs, 64 tokens");
    extern __shared__ __align__(128) unsigned char qsm[];
    const bool dense = tiles == nullptr;
    // Launched with programmatic dependent launch (ops::Pdl), the kernel waits for the one
    // before it before reading what that one wrote: expert tiles at once, dense GEMMs once their
    // first weights are on their way into L2 (below). It lets the next kernel launch only when
    // its work is done (pdl_trigger at the end), so that kernel's blocks do not wait beside it.
    if (!dense) pdl_wait();
    const int ntiles = dense ? (M + BM - 1) / BM : meta[0];
    const int NB = (N + BN - 1) / BN, KT = Kp / BK, KTI = KT / splits, KUT = Kp / 32, KG = (K + G - 1) / G;
    const int gshift = __ffs(G) - __ffs(BK);  // k-tile kt lies in group kt >> gshift
    const long long total = (long long)ntiles * NB * splits;
    // Block b's k-tile steps over all items: [start(b), start(b + 1)).
    const bool sk = sk_ws != nullptr;
    auto start = [&](int b) -> long long { return sk ? total * KTI * b / gridDim.x : total * b / gridDim.x * KTI; };
    const long long w0 = start(blockIdx.x), w1 = start(blockIdx.x + 1);
    if (w0 >= w1) return;
    const int steps = (int)(w1 - w0), i0 = (int)(w0 / KTI), i1 = (int)((w1 - 1) / KTI) + 1, kt_first = (int)(w0 % KTI);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int cw = warp * (BN / 4);  // this warp's first column within the item (mma.sync)
    // The 8-column group of the item holding this warp's n-tile nt (TOK 8: pair nt / 2's half nt % 2):
    // the warp's own BN / 4 columns, or with wgmma rows 16 warp .. 16 warp + 15 of 64-column slab nt / 2.
    auto grp8 = [&](int nt) { return WG ? 8 * (nt >> 1) + 2 * warp + (nt & 1) : cw / 8 + nt; };
    // Item -> (tile, column block, split).
    auto decode = [&](int it, int& t, int& cb, int& z) {
        if (dense) {
            t = it % ntiles, z = (it / ntiles) % splits, cb = it / (ntiles * splits);
        } else {
            cb = it % NB, t = it / NB, z = 0;
        }
    };
    auto tile_rows = [&](int t, int& e, int& rs, int& rc) {
        if (dense) {
            e = 0, rs = BM * t, rc = min(BM, M - rs);
        } else {
            e = tiles[3 * t], rs = tiles[3 * t + 1], rc = tiles[3 * t + 2];
        }
    };
    if (dense) {
        // The weights never change during a step: the first item's first stages (one bulk
        // prefetch per 8-column group, its k-tiles contiguous) leave for L2 while the kernel
        // before this one finishes.
        int t, cb, z;
        decode(i0, t, cb, z);
        const int nb = cb * (BN / 8) + tid;
        if (tid < BN / 8 && nb * 8 < Np)
            prefetch_l2_bulk(Wq + ((u64)nb * KUT + (u64)(z * KTI + kt_first) * KU) * 32 * WPL,
                             min(min(KTI - kt_first, steps), ST - 1) * KU * 128 * WPL);
        pdl_wait();
    }
    // Loader: item l_it, its k-tile l_kt (of KTI), and this thread's sources at that k-tile. Each
    // source moves by one k-tile per load, so a copy costs an add, not its address computed again
    // (ncu, run 62: the per-copy 64-bit address arithmetic was a fifth of the AWQ kernel's issued
    // instructions). Sources of rows, columns or channels past the end stay at a valid address
    // and copy 0 bytes (zeros).
    int l_it = i0, l_kt = kt_first, l_kt0 = 0;
    const unsigned char* a_src[CA];
    u32 a_ok[CA];  // 1 or 0: cp_async16_if's flag
    // A thread's CB weight chunks lie in NGP 8-column groups, CPG in each: chunks r, r + L, ...
    // of the group's k-tile (L threads a group), so that one source pointer and one flag serve a
    // group's chunks, with the offsets immediates. L = max(UCH / CB, 8): a warp's copy writes runs
    // of at least 8 chunks (128 bytes) and so meets every shared-memory bank once (runs of 4, 256
    // bytes apart, met half the banks twice: runs 169-170).
    constexpr int L = UCH / CB >= 8 ? UCH / CB : 8, NGP = L / (UCH / CB), CPG = UCH / L;
    static_assert((BN / 8) * UCH % 128 == 0 && UCH % L == 0 && CB == NGP * CPG, "weight chunks per thread");
    const int b_r = tid % L;
    auto b_grp = [&](int k) { return tid / L + k * (128 / L); };
    const u32* b_src[NGP];
    u32 b_ok[NGP];
    const unsigned char* s_src = reinterpret_cast<const unsigned char*>(S);  // group 0 of the item's scales
    const u32* z_src = Z;
    const float* xs_src = XS;
    u32 s_ok = 0, z_ok = 0, xs_ok = 0;
    const int a_c = (tid % ACH) * (16 / XB);  // the channel of this thread's A chunks within a k-tile
    auto set_item = [&]() {
        int t, cb, z, e, rs, rc;
        decode(l_it, t, cb, z);
        tile_rows(t, e, rs, rc);
        l_kt0 = z * KTI;
        const int kt_at = l_kt0 + l_kt;  // the item's first k-tile here (mid-item for a stream-K piece)
#pragma unroll
        for (int j = 0; j < CA; j++) {
            const int i = tid + 128 * j, r = i / ACH;
            const bool ok = i < BM * ACH && r < rc;
            const int row = ok ? (rowidx ? rowidx[rs + r] : rs + r) : 0;
            a_ok[j] = ok;
            a_src[j] = reinterpret_cast<const unsigned char*>(X) + ((u64)row * K + (u64)kt_at * BK) * XB + (i % ACH) * 16;
        }
#pragma unroll
        for (int k = 0; k < NGP; k++) {
            const int nb = cb * (BN / 8) + b_grp(k);
            b_ok[k] = nb * 8 < Np;
            b_src[k] = Wq + (((u64)e * (Np / 8) + (b_ok[k] ? nb : 0)) * KUT + (u64)kt_at * KU) * 32 * WPL + b_r * 4;
        }
        if (tid < SCH) {
            const int col = cb * BN + tid * (16 / SB);
            s_ok = col < Np;
            s_src = reinterpret_cast<const unsigned char*>(S) + ((u64)e * KG * Np + (col < Np ? col : 0)) * SB;
        }
        if (FMT == 0 && tid >= 64 && tid < 64 + Z_WORDS) {
            const int w = cb * (BN / 8) + tid - 64;
            z_ok = w < Np / 8;
            z_src = Z + (u64)e * KG * (Np / 8) + (w < Np / 8 ? w : 0);
        }
        if (FMT == 1 && tid >= 64 && tid < 64 + XS_ROWS) {
            const int r = tid - 64;
            xs_ok = r < rc;
            xs_src = XS + (u64)(r < rc ? (rowidx ? rowidx[rs + r] : rs + r) : 0) * (K / 128);
        }
    };
    const u32 sq = WG ? (smem_u32(qsm) + 1023u) & ~1023u : smem_u32(qsm);
    unsigned char* const qs = qsm + (sq - smem_u32(qsm));
    auto load = [&](int stage) {
        const u32 st = sq + stage * STAGE;
        const int kt = l_kt0 + l_kt, k0 = kt * BK, grp = min(kt >> gshift, KG - 1);  // padding k-tiles: zeros
#pragma unroll
        for (int j = 0; j < CA; j++) {
            const int i = tid + 128 * j;
            if (CA * 128 > BM * ACH && i >= BM * ACH) break;
            cp_async16_if(st + qswz<ACH>(i / ACH, i % ACH), a_src[j], k0 + a_c < K ? a_ok[j] : 0u);
            a_src[j] += BK * XB;
        }
#pragma unroll
        for (int k = 0; k < NGP; k++) {
            const u32 b_dst = st + A_BYTES + (b_grp(k) * UCH + b_r) * 16;
#pragma unroll
            for (int m = 0; m < CPG; m++) cp_async16_if(b_dst + m * L * 16, b_src[k] + m * L * 4, b_ok[k]);
            b_src[k] += KU * 32 * WPL;
        }
        if (tid < SCH) cp_async16_if(st + S_OFF + tid * 16, s_src + grp * (Np * SB), s_ok);
        if (FMT == 0 && tid >= 64 && tid < 64 + Z_WORDS)
            cp_async4_if(st + Z_OFF + (tid - 64) * 4, z_src + grp * (Np / 8), z_ok);
        if (FMT == 1 && tid >= 64 && tid < 64 + XS_ROWS) cp_async4_if(st + Z_OFF + (tid - 64) * 4, xs_src + (k0 >> 7), xs_ok);
        if (++l_kt == KTI) {
            l_kt = 0;
            if (++l_it < i1) set_item();
        }
    };
    set_item();
    float acc[MT][NJ][4], part[MT][NJ][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NJ; nt++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[mt][nt][q] = 0.f;
    // This lane's ldmatrix rows of the first 16-row A tile, per k16 step (AWQ) or 32-channel unit
    // (FP8); the swizzle repeats every 8 rows, so tile mt is MT_BYTES further.
    int a_off[2 * KU];
#pragma unroll
    for (int j = 0; j < 2 * KU; j++)
        a_off[j] = TOK == 8  ? qswz<ACH>(lane & 7, 4 * j + (lane >> 3))
                   : FMT == 0 ? qswz<ACH>(lane & 15, 2 * j + (lane >> 4))
                              : qswz<ACH>(lane & 15, 2 * (j >> 1) + (lane >> 4));
    int c_it = i0, c_kt = kt_first, c_first = kt_first, cs = 0, ls = ST - 1;  // c_first: the piece's first k-tile
#pragma unroll 1
    for (int s = 0; s < ST - 1; s++) {
        if (s < steps) load(s);
        cp_async_commit();
    }
    for (int s = 0; s < steps; s++) {
        cp_async_wait<ST - 2>();
        if (WG) fence_proxy_async();
        __syncthreads();
        if (s + ST - 1 < steps) load(ls);
        cp_async_commit();
        ls = ls + 1 == ST ? 0 : ls + 1;
        const unsigned char* st = qs + cs * STAGE;
        const u32 sst = sq + cs * STAGE;
        const u32* sb = reinterpret_cast<const u32*>(st + A_BYTES);
        auto word = [&](int nt, int u) { return sb[(grp8(nt) * KU + u) * 32 + lane]; };  // AWQ: unit u of n-tile nt
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NJ; nt++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (!WG) part[mt][nt][q] = 0.f;  // wgmma: the k-tile's first overwrites
        // AWQ: this lane's column's zero point in each of the warp's column groups.
        u32 zz[NT];
        if (FMT == 0) {
            const u32* sz = reinterpret_cast<const u32*>(st + Z_OFF);
            if (WG) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) zz[nt] = sz[grp8(nt)];
            } else {
                lds_words(zz, sz + cw / 8);  // the warp's groups are consecutive
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) zz[nt] = awq_zero_at(zz[nt], 4 * g);
        }
        if (FMT == 0 && TOK == 8) {
            if constexpr (WG) {
                // As TOK 8, with the four warps' A fragments one 64-row operand per slab j (columns
                // 64 j .. 64 j + 63) and the k-tile's 64 tokens as B, read by the tensor cores from
                // the swizzled tile; each weight is unpacked once for all 64 tokens.
#pragma unroll
                for (int u = 0; u < KU; u++) {
                    u32 a[NJ][2][4];
#pragma unroll
                    for (int j = 0; j < NJ; j++) {
                        const u32 w0 = word(2 * j, u), w1 = word(2 * j + 1, u);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            a[j][h][0] = awq_pair(w0, 2 * h, zz[2 * j]), a[j][h][1] = awq_pair(w1, 2 * h, zz[2 * j + 1]);
                            a[j][h][2] = awq_pair(w0, 2 * h + 1, zz[2 * j]), a[j][h][3] = awq_pair(w1, 2 * h + 1, zz[2 * j + 1]);
                        }
                    }
                    wg_fence();
#pragma unroll
                    for (int j = 0; j < NJ; j++)
#pragma unroll
                        for (int h = 0; h < 2; h++) wgmma_tok_rs(part, j, a[j][h], wg_desc(sst + (2 * u + h) * 32), u + h);
                }
                wg_commit();
                wg_wait<0>();
                wg_fence_regs(reinterpret_cast<float(&)[MT * NJ * 4]>(part));
            } else {
                // Weights as the 16-row A operand (column groups 2j and 2j + 1 of the warp as rows g and
                // g + 8: pairs 0 and 1 of their words are the k16 step's a0..a3, pairs 2 and 3 the next
                // one's), this k-tile's 8-token rows as B (one ldmatrix per unit and row tile).
#pragma unroll
                for (int u = 0; u < KU; u++) {
                    u32 xf[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) ldsm_x4(xf[mt][0], xf[mt][1], xf[mt][2], xf[mt][3], sst + a_off[u] + mt * MT_BYTES);
#pragma unroll
                    for (int j = 0; j < NJ; j++) {
                        const u32 w0 = word(2 * j, u), w1 = word(2 * j + 1, u);
                        u32 a[4][2];
#pragma unroll
                        for (int p = 0; p < 4; p++) a[p][0] = awq_pair(w0, p, zz[2 * j]), a[p][1] = awq_pair(w1, p, zz[2 * j + 1]);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_bf16(part[mt][j], a[0][0], a[0][1], a[1][0], a[1][1], xf[mt][0], xf[mt][1]);
                            mma_bf16(part[mt][j], a[2][0], a[2][1], a[3][0], a[3][1], xf[mt][2], xf[mt][3]);
                        }
                    }
                }
            }
            // part[mt][j]: columns 8 grp8(2 j) + g (0, 1) and 8 grp8(2 j + 1) + g (2, 3), tokens
            // 8 mt + 2 t4 and 8 mt + 2 t4 + 1.
            const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + S_OFF);
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const float s0 = h2f(ss[8 * grp8(2 * j) + g]), s1 = h2f(ss[8 * grp8(2 * j + 1) + g]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    acc[mt][j][0] += s0 * part[mt][j][0], acc[mt][j][1] += s0 * part[mt][j][1];
                    acc[mt][j][2] += s1 * part[mt][j][2], acc[mt][j][3] += s1 * part[mt][j][3];
                }
            }
        } else if (FMT == 0) {
#pragma unroll
            for (int u = 0; u < KU; u++) {
                u32 af[MT][2][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        ldsm_x4(af[mt][h][0], af[mt][h][1], af[mt][h][2], af[mt][h][3], sst + a_off[2 * u + h] + mt * MT_BYTES);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const u32 w = word(nt, u);
                    u32 b[4];
#pragma unroll
                    for (int p = 0; p < 4; p++) b[p] = awq_pair(w, p, zz[nt]);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16(part[mt][nt], af[mt][0][0], af[mt][0][1], af[mt][0][2], af[mt][0][3], b[0], b[1]);
                        mma_bf16(part[mt][nt], af[mt][1][0], af[mt][1][1], af[mt][1][2], af[mt][1][3], b[2], b[3]);
                    }
                }
            }
            const unsigned short* ss = reinterpret_cast<const unsigned short*>(st + S_OFF);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const u32 s01 = *reinterpret_cast<const u32*>(ss + cw + nt * 8 + 2 * t4);  // one load, two columns
                const float s0 = h2f((unsigned short)s01), s1 = h2f((unsigned short)(s01 >> 16));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    acc[mt][nt][0] += s0 * part[mt][nt][0], acc[mt][nt][1] += s1 * part[mt][nt][1];
                    acc[mt][nt][2] += s0 * part[mt][nt][2], acc[mt][nt][3] += s1 * part[mt][nt][3];
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < KU; u++) {
                u32 af[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldsm_x4(af[mt][0], af[mt][1], af[mt][2], af[mt][3], sst + a_off[2 * u] + mt * MT_BYTES);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint2 b = *reinterpret_cast<const uint2*>(sb + (((cw / 8 + nt) * KU + u) * 32 + lane) * 2);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) mma_e4m3(part[mt][nt], af[mt], b.x, b.y);
                }
            }
            const float* ss = reinterpret_cast<const float*>(st + S_OFF);
            const float* sx = reinterpret_cast<const float*>(st + Z_OFF);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int c = cw + nt * 8 + 2 * t4;
                const float s0 = ss[c], s1 = ss[c + 1];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const float x0 = sx[16 * mt + g], x1 = sx[16 * mt + g + 8];
                    acc[mt][nt][0] += x0 * s0 * part[mt][nt][0], acc[mt][nt][1] += x0 * s1 * part[mt][nt][1];
                    acc[mt][nt][2] += x1 * s0 * part[mt][nt][2], acc[mt][nt][3] += x1 * s1 * part[mt][nt][3];
                }
            }
        }
        cs = cs + 1 == ST ? 0 : cs + 1;
        if (++c_kt < KTI && s + 1 < steps) continue;
        // The piece's last k-tile: the item's (store its rows), or the block's last of a cut item.
        if (sk && c_first > 0) {
            // A later piece (the block's first): hand the partial sums over.
            float* slot = sk_ws + (u64)blockIdx.x * (MT * NJ * 4 * 128);
            float* a = &acc[0][0][0];
#pragma unroll
            for (int i = 0; i < MT * NJ * 4; i++) {
                __stcg(slot + i * 128 + tid, a[i]);
                a[i] = 0.f;
            }
            __syncthreads();
            if (tid == 0) st_release_gpu(sk_flag + blockIdx.x, 1u);
            c_it++, c_kt = 0, c_first = 0;
            continue;
        }
        if (sk && c_kt < KTI) {
            // The item's first piece, this block's last: add the later pieces, blocks
            // blockIdx.x + 1 .. bend - 1 (those starting inside the item), in block order. A
            // thread per block waits for its flag (and lowers it: read once, the next launch
            // raises it again); the slots are then read SK_BATCH at a time, their loads issued
            // together, so that the hand-over costs a few L2 round trips whatever the pieces.
            const long long T = total * KTI, iend = (long long)(c_it + 1) * KTI;
            const int bend = (int)min((long long)gridDim.x, (iend * gridDim.x + T - 1) / T);
            for (int b = blockIdx.x + 1 + tid; b < bend; b += 128)
                if (start(b + 1) > start(b))  // an empty block hands nothing over
                    while (ld_acquire_gpu(sk_flag + b) == 0u) {
                    }
            __syncthreads();
            for (int b = blockIdx.x + 1 + tid; b < bend; b += 128) sk_flag[b] = 0u;
            // Up to 64 values in flight per thread; 32 in tiles of 32 rows or more (in the 64-row
            // tiles, 64 took from 160 registers to 194, two blocks an SM instead of three: run 138).
            constexpr int NV = MT * NJ * 4, SK_VALS = MT >= 4 ? 32 : 64, SK_BATCH = NV >= SK_VALS ? 1 : SK_VALS / NV;
            float* a = &acc[0][0][0];
            for (int b0 = blockIdx.x + 1; b0 < bend; b0 += SK_BATCH) {
                float v[SK_BATCH][NV];
#pragma unroll
                for (int u = 0; u < SK_BATCH; u++) {
                    const int b = b0 + u;
                    const bool has = b < bend && start(b + 1) > start(b);
                    const float* other = sk_ws + (u64)(has ? b : 0) * (NV * 128);
#pragma unroll
                    for (int i = 0; i < NV; i++) v[u][i] = has ? __ldcg(other + i * 128 + tid) : 0.f;
                }
#pragma unroll
                for (int u = 0; u < SK_BATCH; u++)
#pragma unroll
                    for (int i = 0; i < NV; i++) a[i] += v[u][i];
            }
        }
        c_kt = 0, c_first = 0;
        int t, cb, z, e, rs, rc;
        decode(c_it, t, cb, z);
        tile_rows(t, e, rs, rc);
        float* yz = reinterpret_cast<float*>(Y) + (u64)z * M * N;
        if (TOK == 8) {
            // Each lane holds one column for two tokens; SiLU's gate (even column) meets its up
            // value in the lane of column + 1 (g + 1: lane + 4).
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NJ; j++) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const int col = cb * BN + 8 * grp8(2 * j + (q >> 1)) + g, r = 8 * mt + 2 * t4 + (q & 1);
                        const float v = acc[mt][j][q];
                        if (EPI == 1 && splits == 1) {
                            const float up = __shfl_xor_sync(0xffffffffu, v, 4);
                            if ((g & 1) == 0 && r < rc) gg_store<1>(Y, (u64)(rs + r), col, N, v, up);
                        } else if (r < rc && col < N) {
                            if (splits > 1)
                                yz[(u64)(rs + r) * N + col] = v;
                            else
                                store_cut(yz, Y2, (u64)(rs + r), col, N, first, v);
                        }
                        acc[mt][j][q] = 0.f;
                    }
                }
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int col = cb * BN + cw + nt * 8 + 2 * t4;
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int r = 16 * mt + g + 8 * hh;
                        if (r >= rc) continue;
                        if (splits > 1) {
                            gg_store<0>(yz, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
                        } else if (EPI == 0) {
                            if (col < N) store_cut(yz, Y2, (u64)(rs + r), col, N, first, acc[mt][nt][2 * hh]);
                            if (col + 1 < N) store_cut(yz, Y2, (u64)(rs + r), col + 1, N, first, acc[mt][nt][2 * hh + 1]);
                        } else {
                            gg_store<EPI>(Y, (u64)(rs + r), col, N, acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
                        }
                    }
#pragma unroll
                    for (int q = 0; q < 4; q++) acc[mt][nt][q] = 0.f;
                }
        }
        c_it++;
    }
    pdl_trigger();
    cp_async_wait<0>();
}

// qgemm's operands (quant.cu), then the FP8 activation scales and the split count.
#define QGP_ARGS                                                                                                   \
    const void *X, const int *rowidx, const u32 *Wq, const void *S, const u32 *Z, void *Y, const int *tiles,      \
        const int *meta, int M, int N, int K, int Np, int Kp, int G, const float *XS, int splits, float *sk_ws,   \
        u32 *sk_flag, float *Y2, int first
#define QGP_PASS X, rowidx, Wq, S, Z, Y, tiles, meta, M, N, K, Np, Kp, G, XS, splits, sk_ws, sk_flag, Y2, first
// Names: qg<p|w>[8|64]_<awq|fp8>_<BN>_<BK>_<ST>_<f32|silu> (qgp: mma.sync; qgw: AWQ on wgmma with
// the 64 tokens as N, sm_90a; 64: row tiles of 64; 8: of 8, tokens as the MMAs' N); ops/qdecode.rs
// (QGP_KERNELS) mirrors them.
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_64_8_f32(QGP_ARGS) { qg_persistent<0, 1, 64, 64, 8, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_64_8_silu(QGP_ARGS) { qg_persistent<0, 1, 64, 64, 8, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_128_4_f32(QGP_ARGS) { qg_persistent<0, 1, 64, 128, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_128_4_silu(QGP_ARGS) { qg_persistent<0, 1, 64, 128, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_128_6_f32(QGP_ARGS) { qg_persistent<0, 1, 64, 128, 6, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_64_128_6_silu(QGP_ARGS) { qg_persistent<0, 1, 64, 128, 6, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_6_f32(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 6, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_6_silu(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 6, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_32_128_6_f32(QGP_ARGS) { qg_persistent<0, 1, 32, 128, 6, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_32_128_6_silu(QGP_ARGS) { qg_persistent<0, 1, 32, 128, 6, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_4_f32(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_4_silu(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_8_f32(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 8, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_64_8_silu(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 8, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_128_4_f32(QGP_ARGS) { qg_persistent<0, 1, 128, 128, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_128_128_4_silu(QGP_ARGS) { qg_persistent<0, 1, 128, 128, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_256_64_4_f32(QGP_ARGS) { qg_persistent<0, 1, 256, 64, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_awq_256_64_4_silu(QGP_ARGS) { qg_persistent<0, 1, 256, 64, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp8_awq_256_64_4_f32(QGP_ARGS) { qg_persistent<0, 1, 256, 64, 4, 0, 8>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp8_awq_256_64_4_silu(QGP_ARGS) { qg_persistent<0, 1, 256, 64, 4, 1, 8>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp8_awq_128_64_6_f32(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 6, 0, 8>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp8_awq_128_64_6_silu(QGP_ARGS) { qg_persistent<0, 1, 128, 64, 6, 1, 8>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp64_awq_64_64_4_f32(QGP_ARGS) { qg_persistent<0, 4, 64, 64, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp64_awq_64_64_4_silu(QGP_ARGS) { qg_persistent<0, 4, 64, 64, 4, 1>(QGP_PASS); }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QGW(MT, BN, ST, EPI) qg_persistent<0, MT, BN, 64, ST, EPI, 8, true>(QGP_PASS)
#else
#define QGW(MT, BN, ST, EPI) __trap()  // ops/qdecode.rs launches these on sm_90a alone
#endif
extern "C" __global__ void __launch_bounds__(128) qgw64_awq_64_64_4_f32(QGP_ARGS) { QGW(8, 64, 4, 0); }
extern "C" __global__ void __launch_bounds__(128) qgw64_awq_64_64_4_silu(QGP_ARGS) { QGW(8, 64, 4, 1); }
extern "C" __global__ void __launch_bounds__(128) qgp64_fp8_64_128_4_f32(QGP_ARGS) { qg_persistent<1, 4, 64, 128, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp64_fp8_64_128_4_silu(QGP_ARGS) { qg_persistent<1, 4, 64, 128, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_128_4_f32(QGP_ARGS) { qg_persistent<1, 1, 64, 128, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_128_4_silu(QGP_ARGS) { qg_persistent<1, 1, 64, 128, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_128_6_f32(QGP_ARGS) { qg_persistent<1, 1, 64, 128, 6, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_128_6_silu(QGP_ARGS) { qg_persistent<1, 1, 64, 128, 6, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_128_128_4_f32(QGP_ARGS) { qg_persistent<1, 1, 128, 128, 4, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_128_128_4_silu(QGP_ARGS) { qg_persistent<1, 1, 128, 128, 4, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_32_128_8_f32(QGP_ARGS) { qg_persistent<1, 1, 32, 128, 8, 0>(QGP_PASS); }
// ptxas held this one at 128 registers (four blocks an SM) with a spill; three blocks, as before run 169.
extern "C" __global__ void __launch_bounds__(128, 3) qgp_fp8_32_128_8_silu(QGP_ARGS) { qg_persistent<1, 1, 32, 128, 8, 1>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_64_8_f32(QGP_ARGS) { qg_persistent<1, 1, 64, 64, 8, 0>(QGP_PASS); }
extern "C" __global__ void __launch_bounds__(128) qgp_fp8_64_64_8_silu(QGP_ARGS) { qg_persistent<1, 1, 64, 64, 8, 1>(QGP_PASS); }
