// MLA prefill in the expanded form (the backend's choice for prefill chunks of many rows): the
// sequence's latent rows are gathered from the paged cache (`gather_latent`), expanded once by a
// cuBLAS GEMM with kv_b to per-head k_nope and v, and `mla_prefill_flash` computes, per head h and
// query row i of the chunk, softmax(scale * [q_nope | q_rope] . [k_nope_h | k_rope]) . v_h over
// the causally visible keys, flash-attention style: online softmax over key tiles, scores never
// leave the SM.

// Expanded prefill: the sequence's latent rows, gathered from the paged cache into [ctx, W].
extern "C" __global__ void gather_latent(const bf16_t* cache, const int* tab, bf16_t* out, int ctx, int layers, int layer, int bs, int W) {
    const int cpr = W / 8;
    const u64 total = (u64)ctx * cpr;
    const u64 blk_stride = (u64)layers * bs * W;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int t = (int)(i / cpr), c = (int)(i % cpr) * 8;
        const uint4* src = reinterpret_cast<const uint4*>(cache + (u64)tab[t / bs] * blk_stride + ((u64)layer * bs + t % bs) * W + c);
        *reinterpret_cast<uint4*>(out + (u64)t * W + c) = *src;
    }
}

// Expanded prefill, flash form: causal attention of one prefill chunk for every head, over keys
// and values already expanded per head (see the file header). Operands (row-major, `*_ld` in
// elements; q/out point at the chunk's first row, kv/k_rope at the sequence's first key):
//   q      bf16 [q_len, q_ld]   head h: columns h*(nope+rope) ..: [q_nope | q_rope]
//   kv     bf16 [ctx, kv_ld]    head h: k_nope at h*(nope+v) .. + nope, its value right after
//   k_rope bf16 [ctx, kr_ld]    the rope part of each key, shared by all heads
//   out    f32  [q_len, out_ld] head h: columns h*v .. + v
// out[i, h] = sum_j softmax_j(scale * q[i, h] . [k_nope[j, h] | k_rope[j]]) v[j, h] over the keys
// j <= ctx - q_len + i (query i of the chunk is position ctx - q_len + i of the sequence).
//
// Grid (ceil(q_len / PF_Q), heads), 128 threads, PF_Q = 64 query rows of one head per block,
// query tiles in reverse order so that the longest (last) ones start first. Each warp owns 16
// query rows; its Q (zero-padded to QKP = nope + rope rounded up to 16 columns) stays in
// registers as m16n8k16 A fragments. 64-key tiles of K [k_nope | k_rope] and V stream through
// shared memory with cp.async, double-buffered (rows padded by 8 elements: conflict-free
// ldmatrix). Per tile and warp: S = Q K^T (bf16 MMA, f32 accumulators, K by ldmatrix), scaled to
// log2 units, causal mask where the tile reaches past a row's last key, online softmax (running
// max and sum per row in f32), P re-packed from the S accumulators as bf16 A fragments, and
// O = O * rescale + P V (V by ldmatrix.trans). O is divided by the row sum at the end. Supported:
// nope, rope, v multiples of 8, nope + rope <= 192, v <= 128 (checked by the launcher).
#define PF_Q 64
#define PF_K 64
#define PF_QK 192
#define PF_V 128

// NOPE, ROPE, V > 0 compile the head dims in (the DeepSeek shape: every stride, tile loop and
// guard a constant; ncu found the generic kernel issue-bound on address arithmetic, ALU the
// busiest pipe); 0 reads them from the arguments.
template <int NOPE, int ROPE, int V>
__device__ __forceinline__ void prefill_flash(const bf16_t* __restrict__ q, const bf16_t* __restrict__ kv,
                                              const bf16_t* __restrict__ k_rope, float* __restrict__ out, int q_len,
                                              int ctx, int nope_, int rope_, int v_, int q_ld, int kv_ld, int kr_ld,
                                              int out_ld, float scale) {
    const int nope = NOPE ? NOPE : nope_, rope = NOPE ? ROPE : rope_, v = NOPE ? V : v_;
    const int h = blockIdx.y;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * PF_Q;
    const int qk = nope + rope;
    const int QKP = (qk + 15) & ~15, VP = (v + 15) & ~15;
    const int SK = QKP + 8, SV = VP + 8;  // shared row strides (elements)
    const int nks = QKP / 16, nvt = VP / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);  // [PF_Q][SK]
    bf16_t* sK = sQ + PF_Q * SK;                         // [2][PF_K][SK]
    bf16_t* sV = sK + 2 * PF_K * SK;                     // [2][PF_K][SV]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int mi = lane >> 3, r8 = lane & 7;  // ldmatrix: this lane addresses row r8 of matrix mi
    const int off = ctx - q_len;              // keys before the chunk
    const int key_end = off + min(q0 + PF_Q, q_len);
    const int ntiles = (key_end + PF_K - 1) / PF_K;
    const int hq = h * qk, hkv = h * (nope + v);
    // Loads: thread tid copies 16-byte chunks lc, lc + 8, .. of rows lr, lr + 16, lr + 32, lr + 48.
    const int lr = tid >> 3, lc = tid & 7;

    for (int c = lc; c < QKP / 8; c += 8) {
        const int col = c * 8;
#pragma unroll
        for (int p = 0; p < PF_Q / 16; p++) {
            const int r = lr + 16 * p;
            const bool ok = col < qk && q0 + r < q_len;
            cp_async16(sQ + r * SK + col, ok ? q + (u64)(q0 + r) * q_ld + hq + col : q, ok ? 16 : 0);
        }
    }
    cp_async_commit();
    // Tile kt: keys kt * PF_K .. + PF_K into buffer `buf`; columns and keys past the data are zeros.
    auto load_tile = [&](int buf, int kt) {
        bf16_t* dK = sK + buf * PF_K * SK;
        bf16_t* dV = sV + buf * PF_K * SV;
        const int k0 = kt * PF_K;
        for (int c = lc; c < QKP / 8; c += 8) {
            const int col = c * 8;
            const bool in = col < qk;
            const bf16_t* base = col < nope ? kv + hkv + col : k_rope + (col - nope);
            const u64 ld = col < nope ? (u64)kv_ld : (u64)kr_ld;
#pragma unroll
            for (int p = 0; p < PF_K / 16; p++) {
                const int r = lr + 16 * p;
                const bool ok = in && k0 + r < ctx;
                cp_async16(dK + r * SK + col, ok ? base + (u64)(k0 + r) * ld : kv, ok ? 16 : 0);
            }
        }
        for (int c = lc; c < VP / 8; c += 8) {
            const int col = c * 8;
            const bool in = col < v;
            const bf16_t* base = kv + hkv + nope + col;
#pragma unroll
            for (int p = 0; p < PF_K / 16; p++) {
                const int r = lr + 16 * p;
                const bool ok = in && k0 + r < ctx;
                cp_async16(dV + r * SV + col, ok ? base + (u64)(k0 + r) * kv_ld : kv, ok ? 16 : 0);
            }
        }
    };
    load_tile(0, 0);
    cp_async_commit();
    cp_async_wait<1>();  // Q has landed (tile 0 may still be in flight)
    __syncthreads();

    // Q A fragments: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
    // (rows 8-15, cols 8-15) of the warp's 16 rows and k-step ks give a0..a3.
    u32 qf[PF_QK / 16][4];
#pragma unroll
    for (int ks = 0; ks < PF_QK / 16; ks++) {
        qf[ks][0] = qf[ks][1] = qf[ks][2] = qf[ks][3] = 0u;
        if (ks < nks)
            ldsm_x4(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], sQ + (warp * 16 + (mi & 1) * 8 + r8) * SK + ks * 16 + (mi >> 1) * 8);
    }

    float o[PF_V / 8][4];
#pragma unroll
    for (int j = 0; j < PF_V / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    // This thread's rows g and g + 8 of the warp: running max (log2 units) and partial sum of its
    // columns (the quad's four partial sums are added at the end).
    float mA = NEG_INF, mB = NEG_INF, lA = 0.f, lB = 0.f;
    const float sl2 = scale * 1.4426950408889634f;
    const int wrow = q0 + warp * 16;      // the warp's first query row in the chunk
    const int limA = off + wrow + g;      // last visible key of row g
    const int limB = limA + 8;            // and of row g + 8
    const int wfirst = off + wrow, wlast = off + wrow + 15;

    for (int kt = 0; kt < ntiles; kt++) {
        if (kt + 1 < ntiles) load_tile((kt + 1) & 1, kt + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int k0 = kt * PF_K;
        if (k0 <= wlast) {  // else every key of the tile is in the future of all the warp's rows
            const bf16_t* bK = sK + (kt & 1) * PF_K * SK;
            const bf16_t* bV = sV + (kt & 1) * PF_K * SV;
            float s[PF_K / 8][4];
#pragma unroll
            for (int nt = 0; nt < PF_K / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            // S = Q K^T. K B fragments: matrices (keys 0-7, cols 0-7), (keys 0-7, cols 8-15),
            // (keys 8-15, cols 0-7), (keys 8-15, cols 8-15) give b0, b1 of n-tiles 2np and 2np + 1.
#pragma unroll
            for (int ks = 0; ks < PF_QK / 16; ks++) {
                if (ks < nks) {
#pragma unroll
                    for (int np = 0; np < PF_K / 16; np++) {
                        u32 b0, b1, b2, b3;
                        ldsm_x4(b0, b1, b2, b3, bK + (np * 16 + (mi >> 1) * 8 + r8) * SK + ks * 16 + (mi & 1) * 8);
                        mma_bf16(s[2 * np], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
                        mma_bf16(s[2 * np + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b2, b3);
                    }
                }
            }
            // s[nt] holds keys k0 + nt*8 + 2*t4 (+1) of rows g (s[nt][0..1]) and g + 8 (s[nt][2..3]).
            const bool mask = k0 + PF_K - 1 > wfirst;
#pragma unroll
            for (int nt = 0; nt < PF_K / 8; nt++) {
                const int key = k0 + nt * 8 + 2 * t4;
                s[nt][0] = (mask && key > limA) ? NEG_INF : s[nt][0] * sl2;
                s[nt][1] = (mask && key + 1 > limA) ? NEG_INF : s[nt][1] * sl2;
                s[nt][2] = (mask && key > limB) ? NEG_INF : s[nt][2] * sl2;
                s[nt][3] = (mask && key + 1 > limB) ? NEG_INF : s[nt][3] * sl2;
            }
            float xA = mA, xB = mB;
#pragma unroll
            for (int nt = 0; nt < PF_K / 8; nt++) {
                xA = fmaxf(xA, fmaxf(s[nt][0], s[nt][1]));
                xB = fmaxf(xB, fmaxf(s[nt][2], s[nt][3]));
            }
            xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 1));
            xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, 2));
            xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 1));
            xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, 2));
            // A row with no visible key yet keeps max -inf: subtract 0 instead (all p are 0 then).
            const float bA = xA == NEG_INF ? 0.f : xA, bB = xB == NEG_INF ? 0.f : xB;
            const float cA = exp2f(mA - bA), cB = exp2f(mB - bB);
            mA = xA;
            mB = xB;
            float sumA = 0.f, sumB = 0.f;
#pragma unroll
            for (int nt = 0; nt < PF_K / 8; nt++) {
                s[nt][0] = exp2f(s[nt][0] - bA);
                s[nt][1] = exp2f(s[nt][1] - bA);
                s[nt][2] = exp2f(s[nt][2] - bB);
                s[nt][3] = exp2f(s[nt][3] - bB);
                sumA += s[nt][0] + s[nt][1];
                sumB += s[nt][2] + s[nt][3];
            }
            lA = lA * cA + sumA;
            lB = lB * cB + sumB;
#pragma unroll
            for (int j = 0; j < PF_V / 8; j++) {
                o[j][0] *= cA;
                o[j][1] *= cA;
                o[j][2] *= cB;
                o[j][3] *= cB;
            }
            // O += P V over keys 16kk .. 16kk + 15: P's A fragment is the accumulators of n-tiles
            // 2kk (a0, a1) and 2kk + 1 (a2, a3); V B fragments by ldmatrix.trans: matrices (keys
            // 0-7, n-tile j), (keys 8-15, j), (keys 0-7, j + 1), (keys 8-15, j + 1).
#pragma unroll
            for (int kk = 0; kk < PF_K / 16; kk++) {
                const u32 a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                const u32 a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                const u32 a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                const u32 a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int j = 0; j < PF_V / 8; j += 2) {
                    if (j < nvt) {
                        u32 b0, b1, b2, b3;
                        ldsm_x4_t(b0, b1, b2, b3, bV + (kk * 16 + (mi & 1) * 8 + r8) * SV + (j + (mi >> 1)) * 8);
                        mma_bf16(o[j], a0, a1, a2, a3, b0, b1);
                        mma_bf16(o[j + 1], a0, a1, a2, a3, b2, b3);
                    }
                }
            }
        }
        __syncthreads();  // the next iteration's load overwrites this buffer
    }

    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    const float iA = lA > 0.f ? 1.f / lA : 0.f, iB = lB > 0.f ? 1.f / lB : 0.f;
    const int rA = wrow + g, rB = rA + 8;
#pragma unroll
    for (int j = 0; j < PF_V / 8; j++) {
        const int col = j * 8 + 2 * t4;
        if (j * 8 < v) {  // v is a multiple of 8: col + 1 < v too
            if (rA < q_len) {
                float2 f;
                f.x = o[j][0] * iA;
                f.y = o[j][1] * iA;
                *reinterpret_cast<float2*>(out + (u64)rA * out_ld + h * v + col) = f;
            }
            if (rB < q_len) {
                float2 f;
                f.x = o[j][2] * iB;
                f.y = o[j][3] * iB;
                *reinterpret_cast<float2*>(out + (u64)rB * out_ld + h * v + col) = f;
            }
        }
    }
}

#define PF_ARGS                                                                                                   \
    const bf16_t *q, const bf16_t *kv, const bf16_t *k_rope, float *out, int q_len, int ctx, int nope, int rope, \
        int v, int q_ld, int kv_ld, int kr_ld, int out_ld, float scale
#define PF_PASS q, kv, k_rope, out, q_len, ctx, nope, rope, v, q_ld, kv_ld, kr_ld, out_ld, scale
extern "C" __global__ void __launch_bounds__(128, 2) mla_prefill_flash(PF_ARGS) { prefill_flash<0, 0, 0>(PF_PASS); }
// DeepSeek's head dims (nope 128, rope 64, v 128); ops/attention.rs picks it when they match.
extern "C" __global__ void __launch_bounds__(128, 2) mla_prefill_flash_ds(PF_ARGS) { prefill_flash<128, 64, 128>(PF_PASS); }
