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
