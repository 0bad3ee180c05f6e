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

// R: the rows this instance is compiled for (rows <= R). Needs k and ldx multiples of V and
// 16-byte aligned x, xb and w (checked by the launcher).
// Two weights over the same x may share the launch (MLA's q and kv_a projections): the blocks
// past the first weight's (n) columns compute the second's (w2, y2, n2).
template <typename W, int R>
__device__ __forceinline__ void gemv(const float* __restrict__ x, const bf16_t* __restrict__ xb, int ldx,
                                     const W* __restrict__ w, float* __restrict__ y, int n, const W* __restrict__ w2,
                                     float* __restrict__ y2, int n2, int rows, int k, float beta) {
    constexpr int V = 16 / sizeof(W);
    constexpr bool ROUND = sizeof(W) == 2;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, first = (n + GEMV_COLS - 1) / GEMV_COLS;
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
    bool waited = false;
    for (int k0 = t * V; k0 < k; k0 += GEMV_THREADS * V) {
        uint4 wr[GEMV_COLS];
#pragma unroll
        for (int c = 0; c < GEMV_COLS; c++) {
            // Columns past n read the last one (valid memory); their sums are dropped.
            const int col = min(col0 + c, n - 1);
            wr[c] = __ldg(reinterpret_cast<const uint4*>(w + (u64)col * k + k0));
        }
        // Weights are never written during a step: the first ones are in flight while the kernel
        // before this one (launched with programmatic dependent launch) finishes.
        if (!waited) {
            pdl_enter();
            waited = true;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < rows) {
                float xv[V];
                gemv_x<V, ROUND>(x, xb, ldx, r, k0, xv);
#pragma unroll
                for (int c = 0; c < GEMV_COLS; c++) {
                    float wv[V];
                    gemv_unpack(wr[c], wv, w);
#pragma unroll
                    for (int i = 0; i < V; i++) acc[r][c] = fmaf(xv[i], wv[i], acc[r][c]);
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

// MLA's absorbed products at a few rows, per head h (kv_b: [heads (nope + v), L] bf16; head h's
// rows from h (nope + v) are its W_UK, nope of them, then its W_UV, v of them):
// - mla_uk: q_lat[r, h, :] = q[r, h qk .. h qk + nope] W_UK[h]       (f32 [rows, heads, L])
// - mla_uv: out[r, h v + j] = o_lat[r, h, :] . W_UV[h][j, :]         (f32 [rows, heads v])
// The products of cuBLAS's batched GEMMs over the same bf16 operands, summed in another order. At
// decode sizes each reads a few MB, and cuBLAS's kernels, which take no programmatic dependent
// launch, cost more in latency than in bytes. Weights are read before pdl_enter (never written
// during a step).
#define UK_COLS 64     // latent columns per mla_uk block: 8 threads of 8 columns
#define UK_THREADS 128 // 16 groups of 8 threads, each over every 16th row of W_UK
#define UK_LOADS 8     // rows per thread and pass: 128 rows (V3's nope) in one pass
#define UV_OUTS 16     // value columns per mla_uv block: 4 per warp
#define UV_THREADS 128

template <int R>
__device__ __forceinline__ void mla_uk(const bf16_t* __restrict__ q, int qk, const bf16_t* __restrict__ kv_b,
                                       int nope, int hv, int L, float* __restrict__ q_lat, int heads, int rows) {
    constexpr int RG = UK_THREADS / 8;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, seg = t & 7, rg = t >> 3, h = blockIdx.y;
    const int c0 = blockIdx.x * UK_COLS + seg * 8;
    const bf16_t* w = kv_b + (u64)h * hv * L + c0;
    float acc[R][8];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r][j] = 0.f;
    bool waited = false;
    for (int i0 = 0; i0 < nope; i0 += RG * UK_LOADS) {
        uint4 wr[UK_LOADS];
#pragma unroll
        for (int k = 0; k < UK_LOADS; k++) {
            const int i = i0 + rg + RG * k;
            wr[k] = i < nope ? __ldg(reinterpret_cast<const uint4*>(w + (u64)i * L)) : make_uint4(0, 0, 0, 0);
        }
        if (!waited) {
            pdl_enter();
            waited = true;
        }
#pragma unroll
        for (int k = 0; k < UK_LOADS; k++) {
            const int i = i0 + rg + RG * k;
            if (i >= nope) break;
            float wf[8];
            gemv_unpack(wr[k], wf, q);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < rows) {
                    const float x = bf2f(q[((u64)r * heads + h) * qk + i]);
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[r][j] = fmaf(x, wf[j], acc[r][j]);
                }
            }
        }
    }
    if (!waited) pdl_enter();
    // Lanes 8 apart hold the same columns: sum a warp's four row groups, then the four warps.
    __shared__ float part[UK_THREADS / 32][R][UK_COLS];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float s = acc[r][j];
            s += __shfl_xor_sync(0xffffffffu, s, 8);
            s += __shfl_xor_sync(0xffffffffu, s, 16);
            if (lane < 8) part[warp][r][seg * 8 + j] = s;
        }
    __syncthreads();
    for (int o = t; o < R * UK_COLS; o += UK_THREADS) {
        const int r = o / UK_COLS, c = o % UK_COLS;
        if (r < rows) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < UK_THREADS / 32; i++) s += part[i][r][c];
            q_lat[((u64)r * heads + h) * L + blockIdx.x * UK_COLS + c] = s;
        }
    }
}

// L <= 512: a lane's 8 columns at lane * 8 and 256 on.
template <int R>
__device__ __forceinline__ void mla_uv(const bf16_t* __restrict__ o_lat, const bf16_t* __restrict__ kv_b, int nope,
                                       int hv, int v, int L, float* __restrict__ out, int heads, int rows) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, h = blockIdx.y;
    const int j0 = blockIdx.x * UV_OUTS + warp * 4;
    const bf16_t* w = kv_b + ((u64)h * hv + nope) * L;
    uint4 wr[4][2];
#pragma unroll
    for (int jj = 0; jj < 4; jj++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int j = j0 + jj, c = lane * 8 + 256 * u;
            wr[jj][u] = j < v && c < L ? __ldg(reinterpret_cast<const uint4*>(w + (u64)j * L + c)) : make_uint4(0, 0, 0, 0);
        }
    pdl_enter();
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= rows) break;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int c = lane * 8 + 256 * u;
            if (c >= L) break;
            float x[8];
            gemv_unpack(*reinterpret_cast<const uint4*>(o_lat + ((u64)r * heads + h) * L + c), x, o_lat);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                float wf[8];
                gemv_unpack(wr[jj][u], wf, o_lat);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[jj] = fmaf(x[i], wf[i], acc[jj]);
            }
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const float s = warp_sum(acc[jj]);
            if (lane == 0 && j0 + jj < v) out[(u64)r * heads * v + (u64)h * v + j0 + jj] = s;
        }
    }
}

extern "C" __global__ void __launch_bounds__(UK_THREADS) mla_uk_r1(const bf16_t* q, int qk, const bf16_t* kv_b, int nope, int hv, int L, float* q_lat, int heads, int rows) {
    mla_uk<1>(q, qk, kv_b, nope, hv, L, q_lat, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UK_THREADS) mla_uk_r2(const bf16_t* q, int qk, const bf16_t* kv_b, int nope, int hv, int L, float* q_lat, int heads, int rows) {
    mla_uk<2>(q, qk, kv_b, nope, hv, L, q_lat, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UK_THREADS) mla_uk_r4(const bf16_t* q, int qk, const bf16_t* kv_b, int nope, int hv, int L, float* q_lat, int heads, int rows) {
    mla_uk<4>(q, qk, kv_b, nope, hv, L, q_lat, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UK_THREADS) mla_uk_r8(const bf16_t* q, int qk, const bf16_t* kv_b, int nope, int hv, int L, float* q_lat, int heads, int rows) {
    mla_uk<8>(q, qk, kv_b, nope, hv, L, q_lat, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UV_THREADS) mla_uv_r1(const bf16_t* o_lat, const bf16_t* kv_b, int nope, int hv, int v, int L, float* out, int heads, int rows) {
    mla_uv<1>(o_lat, kv_b, nope, hv, v, L, out, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UV_THREADS) mla_uv_r2(const bf16_t* o_lat, const bf16_t* kv_b, int nope, int hv, int v, int L, float* out, int heads, int rows) {
    mla_uv<2>(o_lat, kv_b, nope, hv, v, L, out, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UV_THREADS) mla_uv_r4(const bf16_t* o_lat, const bf16_t* kv_b, int nope, int hv, int v, int L, float* out, int heads, int rows) {
    mla_uv<4>(o_lat, kv_b, nope, hv, v, L, out, heads, rows);
}
extern "C" __global__ void __launch_bounds__(UV_THREADS) mla_uv_r8(const bf16_t* o_lat, const bf16_t* kv_b, int nope, int hv, int v, int L, float* out, int heads, int rows) {
    mla_uv<8>(o_lat, kv_b, nope, hv, v, L, out, heads, rows);
}
