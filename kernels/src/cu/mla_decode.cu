// MLA decode v3: the absorbed attention of attention.cu's mla_decode2 (same contract, same
// partial outputs for mla_combine; with one split and `o_lat` non-null, the bf16 output that
// mla_combine would write, written directly), compiled for the DeepSeek shape only (latent 512, rope 64,
// cache block 64) and sharing each key tile among G groups of 16 heads.
//
// Why: v2 takes 16 heads per block, so V3's 128 heads read every key 8 times, and its score
// MMAs load both operands from shared memory (six 32-bit loads per MMA). Here a block of
// 4G warps holds 16G heads; each 32-key tile is copied once and read by all of them:
// - scores: warp q of a group keeps its k-steps q, q+4, .. of the group's query (9 of the 36
//   16-column steps) in registers for the whole kernel and multiplies them by the tile's keys
//   (one ldmatrix per two MMAs); the four partial score tiles are summed in the softmax;
// - softmax: 8 lanes per head, 4 keys per lane (3 shuffle rounds per reduction, not 5 per head);
// - P.V: each warp owns every head of the block (G m-tiles) and 16/G of the 64 8-column n-tiles
//   of the latent, so the value tile is read from shared memory once per block.
// ST - 1 tiles are in flight ahead of the one computed; each is loaded right after the barrier
// that frees its buffer, so a tile takes three barriers.
// A tile of 32 keys lies inside one cache block (chunks are whole tiles, blocks 64 keys), so it
// is one contiguous run of 32 x 576 bf16 and takes one block-table lookup.

#define V3_L 512
#define V3_R 64
#define V3_W 576
#define V3_BS 64
#define V3_TT 32
#define V3_S (V3_W + 8)              // key row stride (elements): ldmatrix rows on distinct banks
#define V3_KSTEPS (V3_W / 16)        // 36 k-steps of the score MMAs
#define V3_QSTEPS (V3_KSTEPS / 4)    // 9 per warp of a group
#define V3_SP (V3_TT + 8)            // partial-score row stride (floats)
#define V3_PS (V3_TT + 8)            // probability row stride (bf16)
#define V3_CHUNKS (V3_TT * V3_W / 8) // 16-byte copies per tile

// The split combine inside the decode kernel (`sync` non-null; ops/attention.rs MlaOut::Joined):
// after a grid barrier (every block has written its partials), the `splits` blocks of (row, head
// block h0..h0+HBK) share that head block's HBK x 512 outputs in equal runs of whole float4s;
// each merges its run over the row's `used` splits as mla_combine does (the same weights, sums
// and rounding) and writes the bf16 output. `sW` is shared memory for HBK x 64 weights and HBK
// reciprocals, free once the barrier is passed.
template <int HBK, int NT>
__device__ __noinline__ void mla_join(const float* part_o, const float* part_ml, bf16_t* __restrict__ o_lat,
                                         float* sW, int row, int split, int splits, int h0, int heads, int used,
                                         u32* sync) {
    grid_barrier(sync);
    constexpr int SPAN = HBK * V3_L;
    const int per = (SPAN / 4 + splits - 1) / splits * 4;
    const int b0 = split * per, b1 = min(SPAN, b0 + per);
    if (b0 >= b1) return;
    const int hs = b0 / V3_L, nh = (b1 - 1) / V3_L - hs + 1;
    float* sInv = sW + HBK * 64;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp; j < nh; j += NT / 32) {  // a warp per head: lane s holds splits s and s + 32
        const int h = h0 + hs + j;
        float m[2], l[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int sp = lane + 32 * k;
            const bool ok = sp < used && h < heads;
            const u64 b = (((u64)row * splits + sp) * heads + h) * 2;
            m[k] = ok ? __ldcg(part_ml + b) : NEG_INF;
            l[k] = ok ? __ldcg(part_ml + b + 1) : 0.f;
        }
        const float M = warp_max(fmaxf(m[0], m[1]));
        float denom = 0.f;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float w = m[k] == NEG_INF ? 0.f : expf(m[k] - M);
            sW[j * 64 + lane + 32 * k] = w;
            denom += w * l[k];
        }
        denom = warp_sum(denom);
        if (lane == 0) sInv[j] = denom > 0.f ? 1.f / denom : 0.f;
    }
    __syncthreads();
    const u64 sstride = (u64)heads * V3_L;
    for (int i = b0 + 4 * (int)threadIdx.x; i < b1; i += 4 * NT) {
        const int j = i / V3_L - hs, c = i % V3_L, h = h0 + hs + j;
        if (h >= heads) break;
        const float* src = part_o + ((u64)row * splits * heads + h) * V3_L + c;
        const float* w = sW + j * 64;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int sp = 0; sp < used; sp++) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(src + sp * sstride));
            const float ws = w[sp];
            if (ws != 0.f) o.x += ws * v.x, o.y += ws * v.y, o.z += ws * v.z, o.w += ws * v.w;
        }
        const float inv = sInv[j];
        *reinterpret_cast<uint2*>(o_lat + ((u64)row * heads + h) * V3_L + c) =
            make_uint2(pack_bf16(o.x * inv, o.y * inv), pack_bf16(o.z * inv, o.w * inv));
    }
}

template <int G, int ST>
__device__ __forceinline__ void mla_decode3_t(
    const float* __restrict__ q_lat, const float* __restrict__ q, const bf16_t* __restrict__ cache,
    const int* __restrict__ row_len, const int* __restrict__ row_tab, const int* __restrict__ tables,
    float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int nope, int qk, int layers, int layer,
    int splits, float scale, bf16_t* __restrict__ o_lat, u32* sync) {
    constexpr int HBK = 16 * G, NW = 4 * G, NT = 32 * NW, NJ = 16 / G;
    const int row = blockIdx.x, split = blockIdx.y, h0 = blockIdx.z * HBK;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);                // [ST][TT][S]
    float* sSp = reinterpret_cast<float*>(sK + ST * V3_TT * V3_S);    // [G][4][16][SP]
    bf16_t* sP = reinterpret_cast<bf16_t*>(sSp + G * 4 * 16 * V3_SP); // [HBK][PS]
    float* sM = reinterpret_cast<float*>(sP + HBK * V3_PS);
    float* sL = sM + HBK;
    float* sSc = sL + HBK;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int grp = warp >> 2, wq = warp & 3;
    const int mi = lane >> 3, r8 = lane & 7;
    const KeySplit ks = key_split(row_len, row_tab, tables, row, split, splits, V3_TT);
    const int t_begin = ks.begin, t_end = ks.end, ntiles = ks.ntiles;
    const int* tab = ks.tab;
    const u64 blk_stride = (u64)layers * V3_BS * V3_W;
    if (ntiles == 0 && !o_lat) return;  // an empty split: mla_combine reads only those with keys
    auto join = [&]() {
        mla_join<HBK, NT>(part_o, part_ml, o_lat, reinterpret_cast<float*>(smem_raw), row, split, splits, h0, heads,
                          splits_used(row_len[row], splits, V3_TT), sync);
    };

    auto page = [&](int tile) -> int { return tile < ntiles ? __ldg(tab + (t_begin + tile * V3_TT) / V3_BS) : 0; };
    // The row lengths and block tables are the step's inputs and the cache's keys before this
    // step's are no kernel's output in flight: the first tile's lookup happens, and its bytes are
    // brought into L2, before the wait (the copy itself waits: this step's key may be in it).
    const int pg0 = page(0);
    if (tid == 0 && ntiles > 0)
        prefetch_l2_bulk(cache + (u64)pg0 * blk_stride + ((u64)layer * V3_BS + t_begin % V3_BS) * V3_W, V3_TT * V3_W * 2);
    pdl_enter();
    if (sync && ntiles == 0) {  // an empty split: it only meets the others and merges its share
        join();
        return;
    }
    auto load_tile = [&](int buf, int tile, int pg) {
        bf16_t* dst = sK + buf * V3_TT * V3_S;
        const int t0 = t_begin + tile * V3_TT;
        const bf16_t* src = cache + (u64)pg * blk_stride + ((u64)layer * V3_BS + t0 % V3_BS) * V3_W;
#pragma unroll
        for (int u = 0; u < (V3_CHUNKS + NT - 1) / NT; u++) {
            const int i = tid + u * NT;
            if (V3_CHUNKS % NT == 0 || i < V3_CHUNKS) {
                // Keys past the row's end are zero-filled; their addresses stay inside the block.
                const int key = i / (V3_W / 8);
                cp_async16(dst + i * 8 + key * 8, src + i * 8, t0 + key < t_end ? 16 : 0);
            }
        }
    };
    // ST - 1 tiles in flight ahead of the one being computed.
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < ntiles) load_tile(s, s, s == 0 ? pg0 : page(s));
        cp_async_commit();
    }
    int pg = page(ST - 1);

    // This warp's k-steps of its group's 16 query heads as A fragments (rows = heads).
    u32 qa[V3_QSTEPS][4];
    {
        const int hA = h0 + grp * 16 + g, hB = hA + 8;
        auto qv = [&](int h, int c) -> float {
            if (h >= heads) return 0.f;
            return c < V3_L ? __ldg(q_lat + ((u64)row * heads + h) * V3_L + c)
                            : __ldg(q + (u64)row * heads * qk + (u64)h * qk + nope + c - V3_L);
        };
#pragma unroll
        for (int i = 0; i < V3_QSTEPS; i++) {
            const int c = (wq + 4 * i) * 16 + 2 * t4;
            qa[i][0] = pack_bf16(qv(hA, c), qv(hA, c + 1));
            qa[i][1] = pack_bf16(qv(hB, c), qv(hB, c + 1));
            qa[i][2] = pack_bf16(qv(hA, c + 8), qv(hA, c + 9));
            qa[i][3] = pack_bf16(qv(hB, c + 8), qv(hB, c + 9));
        }
    }
    if (tid < HBK) {
        sM[tid] = NEG_INF;
        sL[tid] = 0.f;
        sSc[tid] = 1.f;
    }
    float acc[G][NJ][4];
#pragma unroll
    for (int m = 0; m < G; m++)
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.f;

    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<ST - 2>();
        // After this barrier tile `it` has landed and every warp is done with iteration it - 1:
        // its buffer (the one refilled next), scores, probabilities and scales are free.
        __syncthreads();
        if (it + ST - 1 < ntiles) load_tile((it + ST - 1) % ST, it + ST - 1, pg);
        cp_async_commit();
        pg = page(it + ST);
        const bf16_t* kb = sK + (it % ST) * V3_TT * V3_S;
        const int t0 = t_begin + it * V3_TT;
        // Partial scores of this warp's k-steps: 16 heads x 32 keys, NP n-tile pairs at a time
        // (all at once needs 8 more registers than the larger blocks have).
        {
            constexpr int NP = G == 1 ? 2 : 1;
            float* sp = sSp + ((grp * 4 + wq) * 16) * V3_SP;
#pragma unroll
            for (int p0 = 0; p0 < 2; p0 += NP) {
                float c[2 * NP][4];
#pragma unroll
                for (int n = 0; n < 2 * NP; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
                for (int i = 0; i < V3_QSTEPS; i++) {
                    const int k0 = (wq + 4 * i) * 16 + (mi & 1) * 8;
#pragma unroll
                    for (int np = 0; np < NP; np++) {
                        u32 b0, b1, b2, b3;
                        ldsm_x4(b0, b1, b2, b3, kb + ((p0 + np) * 16 + (mi >> 1) * 8 + r8) * V3_S + k0);
                        mma_bf16(c[2 * np], qa[i][0], qa[i][1], qa[i][2], qa[i][3], b0, b1);
                        mma_bf16(c[2 * np + 1], qa[i][0], qa[i][1], qa[i][2], qa[i][3], b2, b3);
                    }
                }
#pragma unroll
                for (int n = 0; n < 2 * NP; n++) {
                    const int col = (2 * p0 + n) * 8 + 2 * t4;
                    *reinterpret_cast<float2*>(sp + g * V3_SP + col) = make_float2(c[n][0], c[n][1]);
                    *reinterpret_cast<float2*>(sp + (g + 8) * V3_SP + col) = make_float2(c[n][2], c[n][3]);
                }
            }
        }
        __syncthreads();
        // Online softmax: warp w takes heads 4w..4w+3 of the block, 8 lanes per head, 4 keys per lane.
        {
            const int h = warp * 4 + (lane >> 3), k0 = (lane & 7) * 4;
            const float* sp = sSp + ((h >> 4) * 4 * 16 + (h & 15)) * V3_SP + k0;
            float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                const float4 v = *reinterpret_cast<const float4*>(sp + q4 * 16 * V3_SP);
                s[0] += v.x, s[1] += v.y, s[2] += v.z, s[3] += v.w;
            }
            float mx = NEG_INF;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                s[u] = t0 + k0 + u < t_end ? s[u] * scale : NEG_INF;
                mx = fmaxf(mx, s[u]);
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = sM[h];
            const float m_new = fmaxf(m_old, mx);
            float p[4], sum = 0.f;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                p[u] = (m_new == NEG_INF) ? 0.f : __expf(s[u] - m_new);
                sum += p[u];
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            __syncwarp();
            if ((lane & 7) == 0) {
                const float sc = (m_new == NEG_INF) ? 1.f : __expf(m_old - m_new);
                sSc[h] = sc;
                sL[h] = sL[h] * sc + sum;
                sM[h] = m_new;
            }
            *reinterpret_cast<uint2*>(sP + h * V3_PS + k0) = make_uint2(pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]));
        }
        __syncthreads();
        // P.V: every head of the block against this warp's n-tiles j * NW + warp.
#pragma unroll
        for (int m = 0; m < G; m++) {
            const float sc0 = sSc[m * 16 + g], sc1 = sSc[m * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                acc[m][j][0] *= sc0;
                acc[m][j][1] *= sc0;
                acc[m][j][2] *= sc1;
                acc[m][j][3] *= sc1;
            }
        }
#pragma unroll
        for (int k0 = 0; k0 < V3_TT; k0 += 16) {
            u32 a[G][4];
#pragma unroll
            for (int m = 0; m < G; m++)
                ldsm_x4(a[m][0], a[m][1], a[m][2], a[m][3], sP + (m * 16 + (mi & 1) * 8 + r8) * V3_PS + k0 + (mi >> 1) * 8);
#pragma unroll
            for (int j = 0; j < NJ; j += 2) {
                const int col = ((j + (mi >> 1)) * NW + warp) * 8;
                u32 b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, kb + (k0 + (mi & 1) * 8 + r8) * V3_S + col);
#pragma unroll
                for (int m = 0; m < G; m++) {
                    mma_bf16(acc[m][j], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
                    mma_bf16(acc[m][j + 1], a[m][0], a[m][1], a[m][2], a[m][3], b2, b3);
                }
            }
        }
    }

    if (o_lat && !sync) {
        // One split (the launcher's rule): the row's output itself, normalized and rounded as
        // mla_combine would (its weight is e^0 = 1), so that no combine runs.
        __syncthreads();
#pragma unroll
        for (int m = 0; m < G; m++) {
            const int hA = h0 + m * 16 + g, hB = hA + 8;
            const float lA = sL[m * 16 + g], lB = sL[m * 16 + g + 8];
            const float iA = lA > 0.f ? 1.f / lA : 0.f, iB = lB > 0.f ? 1.f / lB : 0.f;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int col = (j * NW + warp) * 8 + 2 * t4;
                u32* dA = reinterpret_cast<u32*>(o_lat + ((u64)row * heads + hA) * V3_L + col);
                u32* dB = reinterpret_cast<u32*>(o_lat + ((u64)row * heads + hB) * V3_L + col);
                if (hA < heads) *dA = pack_bf16(acc[m][j][0] * iA, acc[m][j][1] * iA);
                if (hB < heads) *dB = pack_bf16(acc[m][j][2] * iB, acc[m][j][3] * iB);
            }
        }
        return;
    }
    const u64 pbase = ((u64)row * splits + split) * heads;
#pragma unroll
    for (int m = 0; m < G; m++) {
        const int hA = h0 + m * 16 + g, hB = hA + 8;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int col = (j * NW + warp) * 8 + 2 * t4;
            if (hA < heads) *reinterpret_cast<float2*>(part_o + (pbase + hA) * V3_L + col) = make_float2(acc[m][j][0], acc[m][j][1]);
            if (hB < heads) *reinterpret_cast<float2*>(part_o + (pbase + hB) * V3_L + col) = make_float2(acc[m][j][2], acc[m][j][3]);
        }
    }
    if (tid < HBK && h0 + tid < heads) {
        part_ml[(pbase + h0 + tid) * 2] = sM[tid];
        part_ml[(pbase + h0 + tid) * 2 + 1] = sL[tid];
    }
    if (sync) join();
}

#define MLA3_ARGS const float* __restrict__ q_lat, const float* __restrict__ q, const bf16_t* __restrict__ cache, const int* __restrict__ row_len, const int* __restrict__ row_tab, const int* __restrict__ tables, float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int nope, int qk, int layers, int layer, int splits, float scale, bf16_t* __restrict__ o_lat, u32* sync
#define MLA3_PASS q_lat, q, cache, row_len, row_tab, tables, part_o, part_ml, heads, nope, qk, layers, layer, splits, scale, o_lat, sync
// Pipeline stages by heads per block (kernels-check, run 33): 16 and 32 heads keep two stages
// (two blocks of 16 heads fit per SM; three at 32 heads measured mixed, run 105), 64 heads take
// three. 32 heads (a TP4 rank of V3) are held to 128 registers so that two blocks share an SM
// and one's softmax runs under the other's MMAs: 256 x 2,048 keys 324 -> 269 us, 64 x 8,192
// 311 -> 278 us (run 106).
extern "C" __global__ void __launch_bounds__(128) mla_decode3_h16(MLA3_ARGS) { mla_decode3_t<1, 2>(MLA3_PASS); }
extern "C" __global__ void __launch_bounds__(256, 2) mla_decode3_h32(MLA3_ARGS) { mla_decode3_t<2, 2>(MLA3_PASS); }
extern "C" __global__ void __launch_bounds__(512) mla_decode3_h64(MLA3_ARGS) { mla_decode3_t<4, 3>(MLA3_PASS); }

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
