// MLA attention in the absorbed form over the paged latent cache (block-major
// [num_blocks, layers, block_size, L + R] bf16). Every query row carries its own number of visible
// keys, so one launch serves decode rows and causal prefill chunks of many sequences together.
//
// scores[h, t] = (q_lat[h] . c_t[:L] + q_rope[h] . c_t[L:]) * scale over the row's visible keys;
// o_lat[h] = softmax(scores[h]) . c[:, :L]. q_lat = q_nope W_UK and out = o_lat W_UV^T are
// batched GEMMs outside this kernel.
//
// Grid (rows, splits, ceil(heads / 16)); 128 threads. A block takes 16 heads of one row as the
// M = 16 dimension of m16n8k16 tensor-core MMAs, streams 32-key tiles of its split of the context
// through shared memory with cp.async (double-buffered), keeps an online softmax per head and
// writes an unnormalized partial output plus (max, sum) per head; mla_combine merges the splits.
//
// Prefill chunks of many rows take the expanded form instead (the backend's choice): prefill.cu.

#define HB 16
#define TT 32
#define NWARP 4
#define MAX_NT 16  // L <= 32 * MAX_NT

// The decode kernels' epilogue: this block's unnormalized partial output (the MMA accumulators of
// its 16 heads; warp w holds n-tiles j * NWARP + w) and per-head (max, sum) at split row `pbase`.
__device__ __forceinline__ void store_partial(const float (&acc)[MAX_NT][4], int nt, const float* sM, const float* sL,
                                              float* part_o, float* part_ml, u64 pbase, int h0, int heads, int L) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int hA = h0 + g, hB = h0 + g + 8;
#pragma unroll
    for (int j = 0; j < MAX_NT; j++) {
        if (j < nt) {
            const int col = (j * NWARP + warp) * 8 + 2 * t4;
            if (hA < heads) {
                if (col < L) part_o[(pbase + hA) * L + col] = acc[j][0];
                if (col + 1 < L) part_o[(pbase + hA) * L + col + 1] = acc[j][1];
            }
            if (hB < heads) {
                if (col < L) part_o[(pbase + hB) * L + col] = acc[j][2];
                if (col + 1 < L) part_o[(pbase + hB) * L + col + 1] = acc[j][3];
            }
        }
    }
    if (tid < HB && h0 + tid < heads) {
        part_ml[(pbase + h0 + tid) * 2] = sM[tid];
        part_ml[(pbase + h0 + tid) * 2 + 1] = sL[tid];
    }
}

extern "C" __global__ void __launch_bounds__(128) mla_decode(
    const float* __restrict__ q_lat, const float* __restrict__ q, const bf16_t* __restrict__ cache,
    const int* __restrict__ row_len, const int* __restrict__ row_tab, const int* __restrict__ tables,
    float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int L, int R, int nope, int qk, int layers,
    int layer, int bs, int splits, float scale) {
    const int row = blockIdx.x, split = blockIdx.y, h0 = blockIdx.z * HB;
    const int W = L + R, Wp = (W + 15) & ~15, S = Wp + 8;
    const int KBUF = TT * S + 64;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sK = sQ + HB * S;
    float* sS = reinterpret_cast<float*>(sK + 2 * KBUF);
    bf16_t* sP = reinterpret_cast<bf16_t*>(sS + HB * TT);
    const int PS = TT + 8;
    float* sM = reinterpret_cast<float*>(sP + HB * PS);
    float* sL = sM + HB;
    float* sSc = sL + HB;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const KeySplit ks = key_split(row_len, row_tab, tables, row, split, splits, TT);
    const int t_begin = ks.begin, t_end = ks.end, ntiles = ks.ntiles;
    const int* tab = ks.tab;
    const u64 blk_stride = (u64)layers * bs * W;

    for (int i = tid; i < HB * Wp; i += blockDim.x) {
        const int h = i / Wp, c = i % Wp;
        float v = 0.f;
        if (h0 + h < heads) {
            if (c < L) v = q_lat[((u64)row * heads + h0 + h) * L + c];
            else if (c < W) v = q[(u64)row * heads * qk + (u64)(h0 + h) * qk + nope + (c - L)];
        }
        sQ[h * S + c] = f2bf(v);
    }
    if (tid < HB) {
        sM[tid] = NEG_INF;
        sL[tid] = 0.f;
        sSc[tid] = 1.f;
    }
    const int nt = (L + 31) / 32;
    float acc[MAX_NT][4];
#pragma unroll
    for (int j = 0; j < MAX_NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    const int cpr = Wp / 8;
    auto load_tile = [&](int buf, int tile) {
        bf16_t* dst = sK + buf * KBUF;
        const int t0 = t_begin + tile * TT;
        for (int i = tid; i < TT * cpr; i += blockDim.x) {
            const int tok = i / cpr, c8 = (i % cpr) * 8, pos = t0 + tok;
            const bool ok = pos < t_end && c8 < W;
            const bf16_t* src = cache;
            if (ok) src = cache + (u64)tab[pos / bs] * blk_stride + ((u64)layer * bs + pos % bs) * W + c8;
            cp_async16(dst + tok * S + c8, src, ok ? 16 : 0);
        }
    };
    if (ntiles > 0) load_tile(0, 0);
    cp_async_commit();
    __syncthreads();

    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) load_tile((it + 1) & 1, it + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16_t* kb = sK + (it & 1) * KBUF;
        const int t0 = t_begin + it * TT;
        {  // scores for keys warp*8 .. warp*8+7
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            const bf16_t* kr = kb + (warp * 8 + g) * S;
            for (int k0 = 0; k0 < Wp; k0 += 16) {
                const u32 a0 = ld_u32(sQ + g * S + k0 + 2 * t4);
                const u32 a1 = ld_u32(sQ + (g + 8) * S + k0 + 2 * t4);
                const u32 a2 = ld_u32(sQ + g * S + k0 + 8 + 2 * t4);
                const u32 a3 = ld_u32(sQ + (g + 8) * S + k0 + 8 + 2 * t4);
                mma_bf16(c, a0, a1, a2, a3, ld_u32(kr + k0 + 2 * t4), ld_u32(kr + k0 + 8 + 2 * t4));
            }
            const int tok = warp * 8 + 2 * t4;
            sS[g * TT + tok] = (t0 + tok < t_end) ? c[0] * scale : NEG_INF;
            sS[g * TT + tok + 1] = (t0 + tok + 1 < t_end) ? c[1] * scale : NEG_INF;
            sS[(g + 8) * TT + tok] = (t0 + tok < t_end) ? c[2] * scale : NEG_INF;
            sS[(g + 8) * TT + tok + 1] = (t0 + tok + 1 < t_end) ? c[3] * scale : NEG_INF;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < HB / NWARP; rr++) {  // online softmax, one head per pass, one key per lane
            const int h = warp * (HB / NWARP) + rr;
            const float s = sS[h * TT + lane];
            const float m_old = sM[h];
            const float m_new = fmaxf(m_old, warp_max(s));
            const float p = (m_new == NEG_INF) ? 0.f : expf(s - m_new);
            const float sum = warp_sum(p);
            if (lane == 0) {
                const float sc = (m_new == NEG_INF) ? 1.f : expf(m_old - m_new);
                sSc[h] = sc;
                sL[h] = sL[h] * sc + sum;
                sM[h] = m_new;
            }
            sP[h * PS + lane] = f2bf(p);
        }
        __syncthreads();
        {  // O = O * rescale + P V over the latent columns of this warp
            const float sc0 = sSc[g], sc1 = sSc[g + 8];
#pragma unroll
            for (int j = 0; j < MAX_NT; j++) {
                if (j < nt) {
                    acc[j][0] *= sc0;
                    acc[j][1] *= sc0;
                    acc[j][2] *= sc1;
                    acc[j][3] *= sc1;
                }
            }
#pragma unroll
            for (int k0 = 0; k0 < TT; k0 += 16) {
                const u32 a0 = ld_u32(sP + g * PS + k0 + 2 * t4);
                const u32 a1 = ld_u32(sP + (g + 8) * PS + k0 + 2 * t4);
                const u32 a2 = ld_u32(sP + g * PS + k0 + 8 + 2 * t4);
                const u32 a3 = ld_u32(sP + (g + 8) * PS + k0 + 8 + 2 * t4);
                const bf16_t* v0 = kb + (k0 + 2 * t4) * S;
#pragma unroll
                for (int j = 0; j < MAX_NT; j++) {
                    if (j < nt) {
                        const int col = (j * NWARP + warp) * 8 + g;
                        const u32 b0 = (u32)v0[col] | ((u32)v0[S + col] << 16);
                        const u32 b1 = (u32)v0[8 * S + col] | ((u32)v0[9 * S + col] << 16);
                        mma_bf16(acc[j], a0, a1, a2, a3, b0, b1);
                    }
                }
            }
        }
        __syncthreads();
    }

    store_partial(acc, nt, sM, sL, part_o, part_ml, ((u64)row * splits + split) * heads, h0, heads, L);
}

// Merges the splits of each (row, head): o_lat = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s, as bf16.
// Only the splits that hold keys are read (splits_used: split_keys deals a row's `row_len` keys
// to its first splits in whole tiles of `tile`; at a short context under a captured step's split
// count, half of them or more are empty).
// One round trip after the wait: the row's length is a step input (read before it), and every
// used split's (max, sum) and this thread's column of each of the first MAXS splits are loaded
// together. MAXS bounds the registers (at 64, 100 or so a thread: one 512-thread block per SM,
// which would make the thousand blocks of a 64-row step run in eight waves), so the launcher
// takes the smallest instance that holds its split count.
template <int MAXS>
__device__ __forceinline__ void mla_combine_t(const float* part_o, const float* part_ml, bf16_t* o_lat, int heads, int L,
                                              int splits, const int* row_len, int tile) {
    const int row = blockIdx.x, h = blockIdx.y;
    const int used = splits_used(row_len[row], splits, tile);
    pdl_enter();
    __shared__ float wts[MAXS];
    __shared__ float inv_denom;
    constexpr int MK = (MAXS + 31) / 32;
    float m[MK], l[MK];
    if (threadIdx.x < 32) {  // one warp: lane s (and s + 32) holds split s's (max, sum)
        const int lane = threadIdx.x;
#pragma unroll
        for (int k = 0; k < MK; k++) {
            const int sp = lane + 32 * k;
            const u64 b = (((u64)row * splits + sp) * heads + h) * 2;
            m[k] = sp < used ? part_ml[b] : NEG_INF;
            l[k] = sp < used ? part_ml[b + 1] : 0.f;
        }
    }
    const u64 sstride = (u64)heads * L;
    const float* base = part_o + ((u64)row * splits * heads + h) * L;
    const int c = threadIdx.x;  // a thread per column (the launcher's rule)
    float x[MAXS];
#pragma unroll
    for (int s = 0; s < MAXS; s++) x[s] = s < used && c < L ? base[s * sstride + c] : 0.f;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float M = NEG_INF;
#pragma unroll
        for (int k = 0; k < MK; k++) M = fmaxf(M, m[k]);
        M = warp_max(M);
        float denom = 0.f;
#pragma unroll
        for (int k = 0; k < MK; k++) {
            const float w = (m[k] == NEG_INF) ? 0.f : expf(m[k] - M);
            if (lane + 32 * k < used) wts[lane + 32 * k] = w;
            denom += w * l[k];
        }
        denom = warp_sum(denom);
        if (lane == 0) inv_denom = denom > 0.f ? 1.f / denom : 0.f;
    }
    __syncthreads();
    if (c >= L) return;
    float o = 0.f;
#pragma unroll
    for (int s = 0; s < MAXS; s++) {
        if (s < used) {
            const float w = wts[s];
            o += w != 0.f ? w * x[s] : 0.f;
        }
    }
    o_lat[((u64)row * heads + h) * L + c] = f2bf(o * inv_denom);
}

// The instances and their split bounds: ops/mla.rs MLA_COMBINE_KERNELS and MLA_COMBINE_SPLITS.
#define COMBINE_ARGS const float *part_o, const float *part_ml, bf16_t *o_lat, int heads, int L, int splits, const int *row_len, int tile
#define COMBINE_PASS part_o, part_ml, o_lat, heads, L, splits, row_len, tile
extern "C" __global__ void __launch_bounds__(512) mla_combine8(COMBINE_ARGS) { mla_combine_t<8>(COMBINE_PASS); }
extern "C" __global__ void __launch_bounds__(512) mla_combine16(COMBINE_ARGS) { mla_combine_t<16>(COMBINE_PASS); }
extern "C" __global__ void __launch_bounds__(512) mla_combine(COMBINE_ARGS) { mla_combine_t<64>(COMBINE_PASS); }

// Reference-precision MLA attention, f32 throughout (f32 cache and kv_b): the CPU backend's
// absorbed form, one block per (row, head). For small models and checks, not for speed.
extern "C" __global__ void mla_ref_f32(const float* __restrict__ q, const float* __restrict__ cache,
                                       const int* __restrict__ row_len, const int* __restrict__ row_tab,
                                       const int* __restrict__ tables, const float* __restrict__ kv_b, float* __restrict__ out,
                                       int heads, int L, int R, int nope, int V, int layers, int layer, int bs, float scale) {
    const int row = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, nt = blockDim.x;
    const int W = L + R, qk = nope + R;
    __shared__ float ql[512 + 64];
    __shared__ float ol[512];
    __shared__ float p[128];
    __shared__ float red[32];
    __shared__ float m_run, l_run, corr;
    const float* qr = q + (u64)row * heads * qk + (u64)h * qk;
    const float* wk = kv_b + (u64)h * (nope + V) * L;
    for (int l = tid; l < L; l += nt) {
        float a = 0.f;
        for (int i = 0; i < nope; i++) a += qr[i] * wk[(u64)i * L + l];
        ql[l] = a;
        ol[l] = 0.f;
    }
    for (int r = tid; r < R; r += nt) ql[L + r] = qr[nope + r];
    if (tid == 0) {
        m_run = NEG_INF;
        l_run = 0.f;
    }
    __syncthreads();
    const int kv_len = row_len[row];
    const int* tab = tables + row_tab[row];
    const u64 blk = (u64)layers * bs * W;
    for (int t0 = 0; t0 < kv_len; t0 += 128) {
        const int t = t0 + tid;
        float s = NEG_INF;
        if (tid < 128 && t < kv_len) {
            const float* c = cache + (u64)tab[t / bs] * blk + ((u64)layer * bs + t % bs) * W;
            float a = 0.f;
            for (int j = 0; j < W; j++) a += ql[j] * c[j];
            s = a * scale;
        }
        float mx = warp_max(s);
        if ((tid & 31) == 0) red[tid >> 5] = mx;
        __syncthreads();
        if (tid == 0) {
            float m = m_run;
            for (int w = 0; w < (nt + 31) / 32; w++) m = fmaxf(m, red[w]);
            corr = (m_run == NEG_INF) ? 0.f : expf(m_run - m);
            m_run = m;
        }
        __syncthreads();
        const float e = (s == NEG_INF) ? 0.f : expf(s - m_run);
        if (tid < 128) p[tid] = e;
        float sum = warp_sum(e);
        __syncthreads();
        if ((tid & 31) == 0) red[tid >> 5] = sum;
        __syncthreads();
        if (tid == 0) {
            float tot = 0.f;
            for (int w = 0; w < (nt + 31) / 32; w++) tot += red[w];
            l_run = l_run * corr + tot;
        }
        const int nk = min(128, kv_len - t0);
        for (int l = tid; l < L; l += nt) {
            float a = ol[l] * corr;
            for (int k = 0; k < nk; k++) {
                const int tt = t0 + k;
                a += p[k] * cache[(u64)tab[tt / bs] * blk + ((u64)layer * bs + tt % bs) * W + l];
            }
            ol[l] = a;
        }
        __syncthreads();
    }
    const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
    const float* wv = kv_b + ((u64)h * (nope + V) + nope) * L;
    for (int j = tid; j < V; j += nt) {
        float a = 0.f;
        for (int l = 0; l < L; l++) a += wv[(u64)j * L + l] * ol[l];
        out[(u64)row * heads * V + (u64)h * V + j] = a * inv;
    }
}

// Version 2 of mla_decode, same contract. Differences: each warp loads whole latent rows (block
// table lookups one tile ahead, one parallel load per tile), Q staged with independent loads,
// scores over two independent MMA chains, and the P.V operand fetched with ldmatrix.trans (two
// n-tiles per instruction) instead of four 16-bit loads per fragment. The kernel is bound by
// instruction latency (2 warps per scheduler), so fewer instructions per key is what pays:
// LC, RC, BSC > 0 fix the latent width, rope width and cache block size at compile time (the
// DeepSeek shape: 512, 64, 64), which turns the per-key index arithmetic into shifts and unrolls
// the score loop; 0 keeps the runtime arguments.
template <int LC, int RC, int BSC>
__device__ __forceinline__ void mla_decode2_t(
    const float* __restrict__ q_lat, const float* __restrict__ q, const bf16_t* __restrict__ cache,
    const int* __restrict__ row_len, const int* __restrict__ row_tab, const int* __restrict__ tables,
    float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int L, int R, int nope, int qk, int layers,
    int layer, int bs, int splits, float scale) {
    if (LC > 0) L = LC, R = RC, bs = BSC;
    const int row = blockIdx.x, split = blockIdx.y, h0 = blockIdx.z * HB;
    const int W = L + R, Wp = (W + 15) & ~15, S = Wp + 8;
    const int KBUF = TT * S + 64;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sK = sQ + HB * S;
    float* sS = reinterpret_cast<float*>(sK + 2 * KBUF);
    bf16_t* sP = reinterpret_cast<bf16_t*>(sS + HB * TT);
    const int PS = TT + 8;
    float* sM = reinterpret_cast<float*>(sP + HB * PS);
    float* sL = sM + HB;
    float* sSc = sL + HB;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const KeySplit ks = key_split(row_len, row_tab, tables, row, split, splits, TT);
    const int t_begin = ks.begin, t_end = ks.end, ntiles = ks.ntiles;
    const int* tab = ks.tab;
    const u64 blk_stride = (u64)layers * bs * W;
    const int cpr = Wp / 8;
    // Block-table lookups run one tile ahead of the copies that need them: lane i < KPW holds the
    // page of key warp + i * NWARP of a tile (the keys this warp copies), issued as one parallel
    // load per tile, so no copy waits on a dependent table read (cp.async's memory clobber would
    // serialize them). No L2 prefetch: it measured slower (the copies queue behind it).
    constexpr int KPW = TT / NWARP;
    auto pages = [&](int tile) -> int {
        const int pos = t_begin + tile * TT + warp + lane * NWARP;
        return (lane < KPW && tile < ntiles && pos < t_end) ? __ldg(tab + pos / bs) : 0;
    };
    auto load_tile = [&](int buf, int tile, int pg) {
        bf16_t* dst = sK + buf * KBUF;
        const int t0 = t_begin + tile * TT;
#pragma unroll
        for (int i = 0; i < KPW; i++) {
            const int tok = warp + i * NWARP, pos = t0 + tok;
            const int page = __shfl_sync(0xffffffffu, pg, i);
            const bool ok = pos < t_end;
            const bf16_t* src = ok ? cache + (u64)page * blk_stride + ((u64)layer * bs + pos % bs) * W : cache;
#pragma unroll
            for (int c = lane; c < cpr; c += 32) {
                const bool in = ok && c * 8 < W;
                cp_async16(dst + tok * S + c * 8, in ? src + c * 8 : cache, in ? 16 : 0);
            }
        }
    };
    int pg = pages(0);
    if (ntiles > 0) load_tile(0, 0, pg);
    cp_async_commit();
    pg = pages(1);
    // Q: 16 heads x Wp columns of bf16, 16 independent loads per thread in flight.
    for (int i0 = 0; i0 < HB * Wp; i0 += 16 * 128) {
        float v[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {
            const int i = i0 + u * 128 + tid, h = i / Wp, c = i % Wp;
            v[u] = 0.f;
            if (i < HB * Wp && h0 + h < heads) {
                if (c < L)
                    v[u] = __ldg(q_lat + ((u64)row * heads + h0 + h) * L + c);
                else if (c < W)
                    v[u] = __ldg(q + (u64)row * heads * qk + (u64)(h0 + h) * qk + nope + c - L);
            }
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
            const int i = i0 + u * 128 + tid;
            if (i < HB * Wp) sQ[(i / Wp) * S + i % Wp] = f2bf(v[u]);
        }
    }
    if (tid < HB) {
        sM[tid] = NEG_INF;
        sL[tid] = 0.f;
        sSc[tid] = 1.f;
    }
    const int nt = (L + 31) / 32;
    float acc[MAX_NT][4];
#pragma unroll
    for (int j = 0; j < MAX_NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    __syncthreads();

    for (int it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) load_tile((it + 1) & 1, it + 1, pg);
        cp_async_commit();
        pg = pages(it + 2);
        cp_async_wait<1>();
        __syncthreads();
        const bf16_t* kb = sK + (it & 1) * KBUF;
        const int t0 = t_begin + it * TT;
        {
            float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
            const bf16_t* kr = kb + (warp * 8 + g) * S;
            int k0 = 0;
            for (; k0 + 16 < Wp; k0 += 32) {
                mma_bf16(c0, ld_u32(sQ + g * S + k0 + 2 * t4), ld_u32(sQ + (g + 8) * S + k0 + 2 * t4), ld_u32(sQ + g * S + k0 + 8 + 2 * t4),
                         ld_u32(sQ + (g + 8) * S + k0 + 8 + 2 * t4), ld_u32(kr + k0 + 2 * t4), ld_u32(kr + k0 + 8 + 2 * t4));
                const int k1 = k0 + 16;
                mma_bf16(c1, ld_u32(sQ + g * S + k1 + 2 * t4), ld_u32(sQ + (g + 8) * S + k1 + 2 * t4), ld_u32(sQ + g * S + k1 + 8 + 2 * t4),
                         ld_u32(sQ + (g + 8) * S + k1 + 8 + 2 * t4), ld_u32(kr + k1 + 2 * t4), ld_u32(kr + k1 + 8 + 2 * t4));
            }
            if (k0 < Wp) {
                mma_bf16(c0, ld_u32(sQ + g * S + k0 + 2 * t4), ld_u32(sQ + (g + 8) * S + k0 + 2 * t4), ld_u32(sQ + g * S + k0 + 8 + 2 * t4),
                         ld_u32(sQ + (g + 8) * S + k0 + 8 + 2 * t4), ld_u32(kr + k0 + 2 * t4), ld_u32(kr + k0 + 8 + 2 * t4));
            }
            const int tok = warp * 8 + 2 * t4;
            sS[g * TT + tok] = (t0 + tok < t_end) ? (c0[0] + c1[0]) * scale : NEG_INF;
            sS[g * TT + tok + 1] = (t0 + tok + 1 < t_end) ? (c0[1] + c1[1]) * scale : NEG_INF;
            sS[(g + 8) * TT + tok] = (t0 + tok < t_end) ? (c0[2] + c1[2]) * scale : NEG_INF;
            sS[(g + 8) * TT + tok + 1] = (t0 + tok + 1 < t_end) ? (c0[3] + c1[3]) * scale : NEG_INF;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < HB / NWARP; rr++) {
            const int h = warp * (HB / NWARP) + rr;
            const float s = sS[h * TT + lane];
            const float m_old = sM[h];
            const float m_new = fmaxf(m_old, warp_max(s));
            const float p = (m_new == NEG_INF) ? 0.f : __expf(s - m_new);
            const float sum = warp_sum(p);
            if (lane == 0) {
                const float sc = (m_new == NEG_INF) ? 1.f : __expf(m_old - m_new);
                sSc[h] = sc;
                sL[h] = sL[h] * sc + sum;
                sM[h] = m_new;
            }
            sP[h * PS + lane] = f2bf(p);
        }
        __syncthreads();
        {
            const float sc0 = sSc[g], sc1 = sSc[g + 8];
#pragma unroll
            for (int j = 0; j < MAX_NT; j++) {
                if (j < nt) {
                    acc[j][0] *= sc0;
                    acc[j][1] *= sc0;
                    acc[j][2] *= sc1;
                    acc[j][3] *= sc1;
                }
            }
            // ldmatrix.x4.trans over keys k0..k0+15 and columns col..col+7 of n-tiles j and j+1
            // (warp's n-tiles are j*NWARP+warp): matrices (k 0-7, tile j), (k 8-15, tile j),
            // (k 0-7, tile j+1), (k 8-15, tile j+1).
            const int mi = lane >> 3, r8 = lane & 7;
#pragma unroll
            for (int k0 = 0; k0 < TT; k0 += 16) {
                const u32 a0 = ld_u32(sP + g * PS + k0 + 2 * t4);
                const u32 a1 = ld_u32(sP + (g + 8) * PS + k0 + 2 * t4);
                const u32 a2 = ld_u32(sP + g * PS + k0 + 8 + 2 * t4);
                const u32 a3 = ld_u32(sP + (g + 8) * PS + k0 + 8 + 2 * t4);
#pragma unroll
                for (int j = 0; j < MAX_NT; j += 2) {
                    if (j < nt) {
                        const int jj = j + (mi >> 1);
                        const int col = (jj * NWARP + warp) * 8;
                        const bf16_t* addr = kb + (k0 + (mi & 1) * 8 + r8) * S + col;
                        u32 b0, b1, b2, b3;
                        ldsm_x4_t(b0, b1, b2, b3, addr);
                        mma_bf16(acc[j], a0, a1, a2, a3, b0, b1);
                        if (j + 1 < nt) mma_bf16(acc[j + 1], a0, a1, a2, a3, b2, b3);
                    }
                }
            }
        }
        __syncthreads();
    }

    store_partial(acc, nt, sM, sL, part_o, part_ml, ((u64)row * splits + split) * heads, h0, heads, L);
}

#define MLA2_ARGS const float* __restrict__ q_lat, const float* __restrict__ q, const bf16_t* __restrict__ cache, const int* __restrict__ row_len, const int* __restrict__ row_tab, const int* __restrict__ tables, float* __restrict__ part_o, float* __restrict__ part_ml, int heads, int L, int R, int nope, int qk, int layers, int layer, int bs, int splits, float scale
#define MLA2_PASS q_lat, q, cache, row_len, row_tab, tables, part_o, part_ml, heads, L, R, nope, qk, layers, layer, bs, splits, scale
extern "C" __global__ void __launch_bounds__(128) mla_decode2(MLA2_ARGS) { mla_decode2_t<0, 0, 0>(MLA2_PASS); }
extern "C" __global__ void __launch_bounds__(128) mla_decode2_dsv(MLA2_ARGS) { mla_decode2_t<512, 64, 64>(MLA2_PASS); }
