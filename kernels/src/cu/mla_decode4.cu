// Concatenated after mla_decode.cu into the mla_decode module (lib.rs): v4 takes v3's constants
// (V3_*), its kernel arguments (MLA3_ARGS) and the split join (mla_join) from there.

// MLA decode v4 (sm_90a): v3's contract on Hopper's warpgroup MMAs, 64 heads per block, 64-key
// tiles (one cache block each, so splits are whole multiples of 64 keys: ops/mla.rs passes the
// tile to mla_combine).
//
// Why: at 128 heads (V3 on one GPU) v3 is bound by mma.sync and its three barriers per 32-key
// tile (162-165 TFLOP/s, kernels/NOTES.md "MLA decode v3"); wgmma reads its operands from shared
// memory (or from registers the accumulators already hold), and two warpgroups take alternate
// tiles so that one's softmax runs under the other's MMAs (FlashMLA's "seesaw" schedule).
// Warpgroup 0 holds output columns 0-255 (O_L), warpgroup 1 columns 256-511 (O_R); per pair of
// tiles A (buffer 0) and B (buffer 1), with one running maximum m in shared memory:
//   [0] S_A = Q K_A^T (64 heads x 64 keys, 36 m64n64k16 wgmmas);   [1] S_B = Q K_B^T
//   [0] m_A = max(m, rowmax S_A), c_A = exp(m - m_A); P_A = exp(S_A - m_A); O_L = c_A O_L + P_A V_A,L
//   [1] m_B = max(m_A, rowmax S_B), c_B = exp(m_A - m_B); P_B = exp(S_B - m_B); O_R = c_A c_B O_R + P_B V_B,R
//   [0] P_A *= c_B, to shared memory;  [1] O_R += P_A V_A,R;  [0] O_L = c_B O_L + P_B V_B,L
// Each warpgroup multiplies its own probabilities from registers and the other's from shared
// memory, where they take the place of that tile's rope columns (read by its scores only). Named
// barriers carry the scales and probabilities across; each key buffer's nine 64-column blocks
// have an mbarrier of their own, so a buffer's next tile is copied (cp.async) block by block as
// soon as both warpgroups are done with those columns, and the scores start on the first blocks
// while the rest land. Shared memory: the query and two key tiles (64 rows x 576 bf16 each, as 9
// swizzled 64-channel blocks: 72 KB), maxima, scales and sums: 218 KB with the alignment, one
// block an SM.
#define V4_TT 64
#define V4_HB 64
#define V4_NB (V3_W / 64)         // 64-channel blocks a key row
#define V4_MAT (V4_NB * 8192)     // one 64-row matrix of 576 bf16 columns
#define V4_VARS (3 * V4_MAT)      // floats: maximum, c_A, c_B [64] each, sums [2][64]
#define V4_BARS (V4_VARS + 5 * V4_HB * 4)  // mbarriers [buffer][block]
#define V4_SMEM (V4_BARS + 2 * V4_NB * 8 + 1023)  // with the worst alignment (ops/mla.rs MLA4_SMEM)
static_assert(V4_TT == V3_BS, "a v4 tile is one cache block: one lookup, one contiguous copy");
enum { V4_SCALE_A = 1, V4_SCALE_B = 2, V4_P_A = 3, V4_P_B = 4 };  // named barriers

// Byte offset of 16-byte chunk c of row r in a swizzled 64-row matrix (wgmma.cuh's layout).
__device__ __forceinline__ u32 v4_off(int r, int c) { return (c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4); }

extern "C" __global__ void __launch_bounds__(256, 1) mla_decode4_h64(MLA3_ARGS) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int row = blockIdx.x, split = blockIdx.y, h0 = blockIdx.z * V4_HB;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    unsigned char* sm = smem_raw + (base - raw);
    u32 dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (dyn_smem < V4_SMEM) __trap();  // the launcher's size is written in Rust too
    const u32 sQ = base, sK = base + V4_MAT;  // key buffer b at sK + b * V4_MAT
    float* sM = reinterpret_cast<float*>(sm + V4_VARS);
    float *sCA = sM + V4_HB, *sCB = sCA + V4_HB, *sL = sCB + V4_HB;
    const u32 bars = base + V4_BARS;
    const int tid = threadIdx.x, wg = tid >> 7, wt = tid & 127, warp = wt >> 5, lane = tid & 31, g = lane >> 2,
              t4 = lane & 3;
    const int r0 = warp * 16 + g;  // this thread's rows (heads) r0 and r0 + 8 of the block
    const KeySplit ks = key_split(row_len, row_tab, tables, row, split, splits, V4_TT);
    const int t_begin = ks.begin, t_end = ks.end, ntiles = ks.ntiles;
    const int* tab = ks.tab;
    const u64 blk_stride = (u64)layers * V3_BS * V3_W;
    if (ntiles == 0 && !o_lat) return;  // an empty split: mla_combine reads only those with keys
    auto join = [&]() {
        mla_join<V4_HB, 256>(part_o, part_ml, o_lat, reinterpret_cast<float*>(sm), row, split, splits, h0, heads,
                             splits_used(row_len[row], splits, V4_TT), sync);
    };

    auto page = [&](int tile) -> int { return tile < ntiles ? __ldg(tab + (t_begin + tile * V4_TT) / V3_BS) : 0; };
    auto tile_src = [&](int pg) { return cache + (u64)pg * blk_stride + (u64)layer * V3_BS * V3_W; };
    // As v3: the first tile's lookup and its bytes into L2 before the wait, its copy after.
    const int pg0 = page(0);
    if (tid == 0 && ntiles > 0) prefetch_l2_bulk(tile_src(pg0), V4_TT * V3_W * 2);
    if (tid == 0) {
        for (int i = 0; i < 2 * V4_NB; i++) mbar_init(bars + 8 * i, 128);
        mbar_init_fence();
    }
    if (tid < V4_HB) sM[tid] = NEG_INF;
    __syncthreads();
    pdl_enter();
    if (sync && ntiles == 0) {  // an empty split: it only meets the others and merges its share
        join();
        return;
    }
    // This warpgroup's share of tile `tile` into buffer b: 64-channel blocks [j0, j1), each
    // arriving on its mbarrier when this thread's copies have landed (128 arrivals a block).
    // Keys past the row's end are zero-filled; their addresses stay inside the cache block.
    auto load_blocks = [&](int b, int tile, int pg, int j0, int j1) {
        const int key0 = wt >> 3, c = wt & 7, t0 = t_begin + tile * V4_TT;
        const bf16_t* src = tile_src(pg) + key0 * V3_W + 8 * c;
        for (int j = j0; j < j1; j++) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int key = key0 + 16 * u;
                cp_async16(sK + b * V4_MAT + v4_off(key, 8 * j + c), src + 16 * u * V3_W + 64 * j,
                           t0 + key < t_end ? 16 : 0);
            }
            mbar_arrive_cp_async(bars + 8 * (V4_NB * b + j));
        }
    };
    if (wg < ntiles) load_blocks(wg, wg, wg == 0 ? pg0 : page(1), 0, V4_NB);
    // The block's query heads as bf16 (heads past `heads` zero): 18 16-byte chunks a thread, loaded
    // in two rounds of 9 (one chunk at a time, each load waited for, took 12% of the kernel).
    static_assert(V4_HB * (V3_W / 8) == 18 * 256, "18 query chunks a thread");
#pragma unroll
    for (int round = 0; round < 2; round++) {
        float v[9][8];
#pragma unroll
        for (int u = 0; u < 9; u++) {
            const int i = tid + (9 * round + u) * 256, r = i / (V3_W / 8), col = i % (V3_W / 8) * 8, h = h0 + r;
#pragma unroll
            for (int e = 0; e < 8; e++) v[u][e] = 0.f;
            if (h < heads && col < V3_L) {
                const float4* src = reinterpret_cast<const float4*>(q_lat + ((u64)row * heads + h) * V3_L + col);
                const float4 a = __ldg(src), b = __ldg(src + 1);
                v[u][0] = a.x, v[u][1] = a.y, v[u][2] = a.z, v[u][3] = a.w, v[u][4] = b.x, v[u][5] = b.y, v[u][6] = b.z, v[u][7] = b.w;
            } else if (h < heads) {
                const float* src = q + (u64)row * heads * qk + (u64)h * qk + nope + col - V3_L;
#pragma unroll
                for (int e = 0; e < 8; e++) v[u][e] = __ldg(src + e);
            }
        }
#pragma unroll
        for (int u = 0; u < 9; u++) {
            const int i = tid + (9 * round + u) * 256;
            *reinterpret_cast<uint4*>(sm + v4_off(i / (V3_W / 8), i % (V3_W / 8))) =
                make_uint4(pack_bf16(v[u][0], v[u][1]), pack_bf16(v[u][2], v[u][3]), pack_bf16(v[u][4], v[u][5]),
                           pack_bf16(v[u][6], v[u][7]));
        }
    }
    fence_proxy_async();
    __syncthreads();

    float o[128], s[32];
#pragma unroll
    for (int q4 = 0; q4 < 128; q4++) o[q4] = 0.f;
#pragma unroll
    for (int q4 = 0; q4 < 32; q4++) s[q4] = 0.f;
    float l_run[2] = {0.f, 0.f};
    const float sl2 = scale * 1.4426950408889634f;  // scores in log2 units: exp2 below
    // Issues s = Q K^T over blocks [j0, j1) of buffer b (its use `pass`), one commit group a block,
    // each once its copies have landed.
    auto scores = [&](int b, int pass, int j0, int j1) {
        const u32 kb = sK + b * V4_MAT;
        for (int j = j0; j < j1; j++) {
            mbar_wait_warp(bars + 8 * (V4_NB * b + j), pass & 1);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const u32 off = j * 8192 + kk * 32;
                wgmma_m64n64(s, wg_desc(sQ + off), wg_desc(kb + off), j + kk > 0);
            }
            wg_commit();
        }
    };
    // Masks and scales s (tile `tile`'s keys), returns its row maxima (quad-reduced).
    auto tile_max = [&](int tile, float (&mx)[2]) {
        const int tk = t_begin + tile * V4_TT + 2 * t4;  // s[4 j + 2 h + i]: row r0 + 8 h, key tk + 8 j + i
        mx[0] = mx[1] = NEG_INF;
#pragma unroll
        for (int q4 = 0; q4 < 32; q4++) {
            const int j = q4 >> 2, h = (q4 >> 1) & 1, i = q4 & 1;
            s[q4] = tk + 8 * j + i < t_end ? s[q4] * sl2 : NEG_INF;
            mx[h] = fmaxf(mx[h], s[q4]);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
    };
    // The running maximum after a tile with row maxima mx: its new value m_new and the rescale c
    // of what came before, both into shared memory (c at s_c, for the other warpgroup).
    auto update_max = [&](const float (&mx)[2], float (&m_new)[2], float (&c)[2], float* s_c) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m_old = sM[r0 + 8 * h];
            m_new[h] = fmaxf(m_old, mx[h]);
            c[h] = exp2f(m_old - m_new[h]);
        }
        __syncwarp();  // the quad's reads before its write
        if (t4 == 0)
#pragma unroll
            for (int h = 0; h < 2; h++) sM[r0 + 8 * h] = m_new[h], s_c[r0 + 8 * h] = c[h];
    };
    auto scale_o = [&](const float (&c)[2]) {
#pragma unroll
        for (int q4 = 0; q4 < 128; q4++) o[q4] *= c[(q4 >> 1) & 1];
    };
    // s = exp2(s - m) per row; returns the rows' sums of this thread's keys.
    auto tile_exp = [&](const float (&m)[2], float (&sum)[2]) {
        sum[0] = sum[1] = 0.f;
#pragma unroll
        for (int q4 = 0; q4 < 32; q4++) {
            const int h = (q4 >> 1) & 1;
            s[q4] = exp2f(s[q4] - m[h]);
            sum[h] += s[q4];
        }
    };
    // O += P V over output columns [256 wg, 256 wg + 256) of buffer b, P from s (registers); its
    // wgmma fence follows every write to o and to the packed P.
    auto pv_own = [&](int b) {
        const u32 vb = sK + b * V4_MAT + wg * 4 * 8192;
        u32 a[4][4];  // all packed first: the wgmmas read them until they complete
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int p = 0; p < 4; p++) a[kk][p] = pack_bf16(s[8 * kk + 2 * p], s[8 * kk + 2 * p + 1]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_m64n256_rs(o, a[kk], wg_desc_mn(vb + kk * 16 * 128, 8192));
    };
    // The same with P from buffer b's rope block, where the other warpgroup put it.
    auto pv_other = [&](int b) {
        const u32 kb = sK + b * V4_MAT;
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_m64n256<1>(o, wg_desc(kb + 8 * 8192 + kk * 32), wg_desc_mn(kb + wg * 4 * 8192 + kk * 16 * 128, 8192));
    };
    // s (bf16) into buffer b's rope block as the 64 x 64 A operand of pv_other.
    auto store_p = [&](int b) {
        unsigned char* pb = sm + V4_MAT + b * V4_MAT + 8 * 8192;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + 8 * h;  // keys 8 j + 2 t4 and the next: chunk j, bytes 4 t4
                *reinterpret_cast<u32*>(pb + v4_off(r, j) + 4 * t4) =
                    pack_bf16(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
            }
    };

    // Scores of the first pair.
    if (wg < ntiles) {
        scores(wg, 0, 0, V4_NB);
        wg_wait<0>();
        wg_fence_regs(s);
    }
    const int npairs = (ntiles + 1) / 2;
    for (int i = 0; i < npairs; i++) {
        const int ta = 2 * i, tb = ta + 1;
        const bool has_b = tb < ntiles, next_a = ta + 2 < ntiles, next_b = tb + 2 < ntiles;
        const int pg_a = page(ta + 2), pg_b = page(tb + 2);
        float mx[2], m_new[2], sum[2];
        if (wg == 0) {
            tile_max(ta, mx);
            float c_a[2];
            update_max(mx, m_new, c_a, sCA);  // m_new finite: tile A's first key is the split's
            bar_arrive(V4_SCALE_A, 256);
            tile_exp(m_new, sum);
#pragma unroll
            for (int h = 0; h < 2; h++) l_run[h] = l_run[h] * c_a[h] + sum[h];
            scale_o(c_a);
            pv_own(0);
            wg_commit();
            wg_wait<0>();
            wg_fence_regs(o);
            // Columns 0-255 of buffer 0 are free: the next tile A's start.
            if (next_a) load_blocks(0, ta + 2, pg_a, 0, 4);
            bar_sync(V4_SCALE_B, 256);
            const float c_b[2] = {sCB[r0], sCB[r0 + 8]};
#pragma unroll
            for (int q4 = 0; q4 < 32; q4++) s[q4] *= c_b[(q4 >> 1) & 1];
            store_p(0);
            fence_proxy_async();
            bar_arrive(V4_P_A, 256);
            if (has_b) {
#pragma unroll
                for (int h = 0; h < 2; h++) l_run[h] *= c_b[h];
                scale_o(c_b);
                bar_sync(V4_P_B, 256);
                wg_fence();
                pv_other(1);
                wg_commit();
            }
            // P_B V_B,L done: buffer 1's columns 0-255 and its rope block are free. Tile B's next
            // copies go out before this warpgroup can stall on tile A's in its scores: warpgroup 1
            // has nothing else to do until they land.
            wg_wait<0>();
            if (next_b) load_blocks(1, tb + 2, pg_b, 0, 4), load_blocks(1, tb + 2, pg_b, 8, 9);
            if (next_a) scores(0, i + 1, 0, V4_NB);
            wg_wait<0>();
            wg_fence_regs(s);
            wg_fence_regs(o);
        } else {
            bar_sync(V4_SCALE_A, 256);
            tile_max(tb, mx);  // all keys masked when tile B is past the split
            float c_b[2];
            update_max(mx, m_new, c_b, sCB);
            // O_R was last scaled to the maximum before tile A: both rescales.
            const float c[2] = {sCA[r0] * c_b[0], sCA[r0 + 8] * c_b[1]};
            bar_arrive(V4_SCALE_B, 256);
            tile_exp(m_new, sum);
#pragma unroll
            for (int h = 0; h < 2; h++) l_run[h] = l_run[h] * c[h] + sum[h];
            scale_o(c);
            if (has_b) {
                store_p(1);
                fence_proxy_async();
                bar_arrive(V4_P_B, 256);
            }
            // Without a tile B, P is 0 and tile A's columns stand in for its (unloaded) ones: under
            // a branch, ptxas would fence these wgmmas again and take 16 more registers.
            pv_own(has_b ? 1 : 0);
            wg_commit();
            bar_sync(V4_P_A, 256);
            pv_other(0);
            wg_commit();
            wg_wait<1>();  // P_B V_B,R done: buffer 1's columns 256-511 are free
            if (next_b) load_blocks(1, tb + 2, pg_b, 4, 8);
            wg_wait<0>();  // P_A V_A,R done: buffer 0's columns 256-511 and its rope block are free
            wg_fence_regs(o);
            if (next_a) load_blocks(0, ta + 2, pg_a, 4, V4_NB);
            if (next_b) {
                scores(1, i + 1, 0, V4_NB);
                wg_wait<0>();
                wg_fence_regs(s);
            }
        }
    }

    // Each row's sum: its quad's lanes, then both warpgroups'.
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        if (t4 == 0) sL[wg * V4_HB + r0 + 8 * h] = l_run[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int hh = h0 + r0 + 8 * h;
        if (hh >= heads) continue;
        const float l = sL[r0 + 8 * h] + sL[V4_HB + r0 + 8 * h];
        const int col = wg * 256 + 2 * t4;
        if (o_lat && !sync) {
            // One split: the output itself, normalized and rounded as mla_combine would.
            const float inv = l > 0.f ? 1.f / l : 0.f;
            bf16_t* dst = o_lat + ((u64)row * heads + hh) * V3_L + col;
#pragma unroll
            for (int j = 0; j < 32; j++)
                *reinterpret_cast<u32*>(dst + 8 * j) = pack_bf16(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        } else {
            const u64 p = ((u64)row * splits + split) * heads + hh;
            float* dst = part_o + p * V3_L + col;
#pragma unroll
            for (int j = 0; j < 32; j++)
                *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
            if (wg == 0 && t4 == 0) {
                part_ml[p * 2] = sM[r0 + 8 * h] * 0.6931471805599453f;  // back to natural-log units
                part_ml[p * 2 + 1] = l;
            }
        }
    }
    if (sync) join();
#else
    __trap();  // wgmma is sm_90a only; ops/mla.rs picks v4 on sm_90a alone
#endif
}
