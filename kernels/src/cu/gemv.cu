// Dense linears of a few rows (decode at small batches): y[r, n] = x[r, :] . w[n, :] (+ beta y).
// Memory bound on w, where cuBLAS's GEMMs at one to eight rows reach a fraction of HBM. A block of
// GEMV_THREADS threads owns GEMV_COLS output columns; its warps split K, each thread reading 16
// bytes of every one of its columns per pass (GEMV_COLS independent loads in flight), summed by
// shuffles and then across warps in shared memory. One launch, no workspace and no atomics.
// With bf16 weights, x is rounded to bf16 first (read from `xb`, its bf16 shadow, when there is
// one): the same products as the cuBLAS GEMM over the cast operand, summed in another order.
// f32 weights (the MoE router) take x as it is.
#define GEMV_COLS 8
#define GEMV_THREADS 256

// 16 bytes of weights as floats: eight bf16 or four f32.
__device__ __forceinline__ void gemv_unpack(const uint4& u, float* f, const bf16_t*) {
    const u32 v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void gemv_unpack(const uint4& u, float* f, const float*) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}

// The V inputs of row r at channel k0 (as the GEMM reads them: rounded to bf16 for bf16 weights).
template <int V, bool ROUND>
__device__ __forceinline__ void gemv_x(const float* x, const bf16_t* xb, int ldx, int r, int k0, float* f) {
    const u64 at = (u64)r * ldx + k0;
    if constexpr (ROUND) {
        if (xb) {
            gemv_unpack(*reinterpret_cast<const uint4*>(xb + at), f, xb);
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(x + at + i);
        f[i] = ROUND ? bf2f(f2bf(v.x)) : v.x;
        f[i + 1] = ROUND ? bf2f(f2bf(v.y)) : v.y;
        f[i + 2] = ROUND ? bf2f(f2bf(v.z)) : v.z;
        f[i + 3] = ROUND ? bf2f(f2bf(v.w)) : v.w;
    }
}

// R: the rows this instance is compiled for; block row y takes rows [y R, y R + R) of `rows`.
// Needs k and ldx multiples of V and 16-byte aligned x, xb and w (checked by the launcher).
// Two weights over the same x may share the launch (MLA's q and kv_a projections): the blocks
// past the first weight's (n) columns compute the second's (w2, y2, n2).
template <typename W, int R>
__device__ __forceinline__ void gemv(const float* __restrict__ x, const bf16_t* __restrict__ xb, int ldx,
                                     const W* __restrict__ w, float* __restrict__ y, int n, const W* __restrict__ w2,
                                     float* __restrict__ y2, int n2, int rows, int k, float beta) {
    constexpr int V = 16 / sizeof(W);
    constexpr bool ROUND = sizeof(W) == 2;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, first = (n + GEMV_COLS - 1) / GEMV_COLS;
    // Row groups of R along y (the router's GEMV at decode batches beyond R rows).
    if (blockIdx.y > 0) {
        const u64 r0 = (u64)blockIdx.y * R;
        x += r0 * ldx;
        if (xb) xb += r0 * ldx;
        y += r0 * n;
        y2 += r0 * n2;
        rows -= (int)r0;
    }
    rows = min(R, rows);
    int col0 = blockIdx.x * GEMV_COLS;
    if ((int)blockIdx.x >= first) {
        w = w2;
        y = y2;
        col0 = (blockIdx.x - first) * GEMV_COLS;
        n = n2;
    }
    float acc[R][GEMV_COLS];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < GEMV_COLS; c++) acc[r][c] = 0.f;
    // f32 weights at one or two rows (the router at small batches) take U passes' loads at once:
    // one pass of 256 threads covers 1,024 channels, so V3's 7,168 would otherwise be seven
    // dependent rounds of 8 loads a thread, with only 32 blocks (256 experts) in flight.
    constexpr int U = ROUND ? 1 : (R == 1 ? 4 : R == 2 ? 2 : 1);
    constexpr int STEP = GEMV_THREADS * V;
    bool waited = false;
    for (int k0 = t * V; k0 < k; k0 += STEP * U) {
        uint4 wr[U][GEMV_COLS];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int c = 0; c < GEMV_COLS; c++) {
                // Columns past n read the last one (valid memory); their sums are dropped.
                const int col = min(col0 + c, n - 1);
                wr[u][c] = k0 + u * STEP < k ? __ldg(reinterpret_cast<const uint4*>(w + (u64)col * k + k0 + u * STEP))
                                             : make_uint4(0, 0, 0, 0);
            }
        // Weights are never written during a step: the first ones are in flight while the kernel
        // before this one (launched with programmatic dependent launch) finishes.
        if (!waited) {
            pdl_enter();
            waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int ku = k0 + u * STEP;
            if (U > 1 && ku >= k) break;
            if constexpr (ROUND) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < rows) {
                        float xv[V];
                        gemv_x<V, ROUND>(x, xb, ldx, r, ku, xv);
#pragma unroll
                        for (int c = 0; c < GEMV_COLS; c++) {
                            float wv[V];
                            gemv_unpack(wr[u][c], wv, w);
#pragma unroll
                            for (int i = 0; i < V; i++) acc[r][c] = fmaf(xv[i], wv[i], acc[r][c]);
                        }
                    }
                }
            } else {
                // f32 (the router, up to hundreds of rows in groups): every row's inputs are
                // loaded before any product (rows past `rows` repeat the last, their sums
                // dropped), so their latencies overlap instead of adding up row by row. (bf16
                // weights keep the loop above: hoisted, their 4-row instance took 172 registers
                // against 104.)
                float xv[R][V];
#pragma unroll
                for (int r = 0; r < R; r++) gemv_x<V, ROUND>(x, xb, ldx, min(r, rows - 1), ku, xv[r]);
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++) {
                    float wv[V];
                    gemv_unpack(wr[u][c], wv, w);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int i = 0; i < V; i++) acc[r][c] = fmaf(xv[r][i], wv[i], acc[r][c]);
                }
            }
        }
    }
    if (!waited) pdl_enter();
    __shared__ float part[GEMV_THREADS / 32][R * GEMV_COLS];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < GEMV_COLS; c++) {
            const float s = warp_sum(acc[r][c]);
            if (lane == 0) part[warp][r * GEMV_COLS + c] = s;
        }
    __syncthreads();
    if (t < R * GEMV_COLS) {
        const int r = t / GEMV_COLS, col = col0 + t % GEMV_COLS;
        if (r < rows && col < n) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < GEMV_THREADS / 32; i++) s += part[i][t];
            float* o = y + (u64)r * n + col;
            *o = beta != 0.f ? s + beta * *o : s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_bf16_r1(const float* x, const bf16_t* xb, int ldx, const bf16_t* w, float* y, int n, const bf16_t* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<bf16_t, 1>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_bf16_r2(const float* x, const bf16_t* xb, int ldx, const bf16_t* w, float* y, int n, const bf16_t* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<bf16_t, 2>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_bf16_r4(const float* x, const bf16_t* xb, int ldx, const bf16_t* w, float* y, int n, const bf16_t* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<bf16_t, 4>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_bf16_r8(const float* x, const bf16_t* xb, int ldx, const bf16_t* w, float* y, int n, const bf16_t* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<bf16_t, 8>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f32_r1(const float* x, const bf16_t* xb, int ldx, const float* w, float* y, int n, const float* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<float, 1>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f32_r2(const float* x, const bf16_t* xb, int ldx, const float* w, float* y, int n, const float* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<float, 2>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f32_r4(const float* x, const bf16_t* xb, int ldx, const float* w, float* y, int n, const float* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<float, 4>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f32_r8(const float* x, const bf16_t* xb, int ldx, const float* w, float* y, int n, const float* w2, float* y2,
                                                                int n2, int rows, int k, float beta) {
    gemv<float, 8>(x, xb, ldx, w, y, n, w2, y2, n2, rows, k, beta);
}

// MLA's absorbed projections at one row (batch-1 decode), per head h of `heads`, over kv_b_proj's
// bf16 rows [h (nope + v) .. (h + 1)(nope + v)) of L channels each (nope = 128), where cuBLAS's
// batched GEMM took 7-11 us a call. Like the GEMV: every weight a thread reads in flight before
// the PDL wait, f32 sums of exact bf16 products, no workspace. One row only: run 177's 4-row
// instances were 1-2% slower than cuBLAS at batch 4.
#define ABSORB_THREADS 128
#define ABSORB_UK_COLS 256  // q_lat columns per block (8 a thread)
#define ABSORB_NOPE 128

// q_lat[h, c] = sum_{k < 128} q[h qk + k] W[h (128 + v) + k, c]: grid (heads, L / 256); thread t
// owns columns 8 (t % 32) .. + 8 of the block's and k-group t / 32 (32 rows).
extern "C" __global__ void __launch_bounds__(ABSORB_THREADS) mla_absorb_uk_r1(const bf16_t* __restrict__ q, int qk,
                                                                           const bf16_t* __restrict__ w, int v, int L,
                                                                           float* __restrict__ out) {
    constexpr int PER = ABSORB_NOPE / 4;
    const int h = blockIdx.x, t = threadIdx.x, kg = t >> 5;
    const int c0 = blockIdx.y * ABSORB_UK_COLS + (t & 31) * 8;
    const bf16_t* wr = w + ((u64)h * (ABSORB_NOPE + v) + kg * PER) * L + c0;
    __shared__ float xs[ABSORB_NOPE];
    __shared__ float part[4][ABSORB_UK_COLS + 4];
    uint4 wv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) wv[i] = __ldg(reinterpret_cast<const uint4*>(wr + (u64)i * L));
    // The weights are on their way; q is the kernel before this one's output.
    pdl_enter();
    static_assert(ABSORB_THREADS == ABSORB_NOPE, "a thread per q channel");
    xs[t] = bf2f(q[(u64)h * qk + t]);
    __syncthreads();
    float acc[8];
#pragma unroll
    for (int c = 0; c < 8; c++) acc[c] = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        float f[8];
        gemv_unpack(wv[i], f, w);
        const float x = xs[kg * PER + i];
#pragma unroll
        for (int c = 0; c < 8; c++) acc[c] = fmaf(x, f[c], acc[c]);
    }
#pragma unroll
    for (int c = 0; c < 8; c++) part[kg][(t & 31) * 8 + c] = acc[c];
    __syncthreads();
    for (int c = t; c < ABSORB_UK_COLS; c += ABSORB_THREADS)
        out[(u64)h * L + blockIdx.y * ABSORB_UK_COLS + c] = part[0][c] + part[1][c] + part[2][c] + part[3][c];
}

// y[h v + j] = sum_{c < 512} o[h 512 + c] W[h (128 + v) + 128 + j, c], also rounded to bf16 into
// `yb` when it is not null (the bf16 operand of the output projection that follows): grid
// (heads, v / 32); warp w owns outputs j = 32 blockIdx.y + 8 w .. + 8, lane l channels 16 l ..
// 16 l + 15 (L = 512).
extern "C" __global__ void __launch_bounds__(ABSORB_THREADS) mla_absorb_uv_r1(const bf16_t* __restrict__ o,
                                                                           const bf16_t* __restrict__ w, int v,
                                                                           float* __restrict__ y, bf16_t* __restrict__ yb) {
    constexpr int L = 512;
    const int h = blockIdx.x, lane = threadIdx.x & 31, j0 = blockIdx.y * 32 + (threadIdx.x >> 5) * 8;
    const bf16_t* wr = w + ((u64)h * (ABSORB_NOPE + v) + ABSORB_NOPE + j0) * L + lane * 16;
    uint4 wv[8][2];
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int i = 0; i < 2; i++) wv[j][i] = __ldg(reinterpret_cast<const uint4*>(wr + (u64)j * L + 8 * i));
    pdl_enter();
    float x[16];
#pragma unroll
    for (int i = 0; i < 2; i++) gemv_unpack(*reinterpret_cast<const uint4*>(o + (u64)h * L + lane * 16 + 8 * i), x + 8 * i, o);
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float f[8];
            gemv_unpack(wv[j][i], f, w);
#pragma unroll
            for (int c = 0; c < 8; c++) s = fmaf(x[8 * i + c], f[c], s);
        }
        acc[j] = warp_sum(s);
    }
    if (lane < 8) {
        float s = acc[0];
#pragma unroll
        for (int j = 1; j < 8; j++) s = lane == j ? acc[j] : s;
        y[(u64)h * v + j0 + lane] = s;
        if (yb) yb[(u64)h * v + j0 + lane] = f2bf(s);
    }
}
