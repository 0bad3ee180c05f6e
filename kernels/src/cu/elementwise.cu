// Row-wise and element-wise kernels: embedding, RMSNorm (+ residual), SiLU-mul, add, gather,
// RoPE, KV-cache writes and block copies, dtype conversion at load, random fill.

extern "C" __global__ void embedding_f32(const float* table, const u32* ids, float* out, int n, int cols) {
    const int r = blockIdx.x;
    if (r >= n) return;
    const float* src = table + (u64)ids[r] * cols;
    float* dst = out + (u64)r * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

// One block per row. With `res` non-null: res += x, then y = rmsnorm(res). RMSNorm covers the
// first `wc` columns; later columns are copied through. With `yb` non-null, also writes y as bf16
// (the next GEMM's operand, the same rounding as cast_f32_bf16) in the same pass. The row stays in
// registers (at most RMS_PER_THREAD values per thread, cols <= RMS_PER_THREAD * blockDim.x): all
// loads are issued before the reduction, nothing is read twice. x, res and y must not overlap.
#define RMS_PER_THREAD 16
// The norm's weights a thread holds in registers from before the PDL wait: the first NORM_W of
// its values, the rest read from L2 (prefetched there before the wait). Up to 8,192 columns (V3's
// 7,168 included) that is every value, and it stays within a 1,024-thread launch's 64 registers a
// thread (run 132's build, holding every value's weight, could not launch moe_combine_norm at
// 7,168 columns).
#define NORM_W 8
// `n` f32 weights brought into L2 (one instruction; where they are 16-byte aligned and sized).
__device__ __forceinline__ void prefetch_weights(const float* w, int n) {
    if (n % 4 == 0 && (reinterpret_cast<u64>(w) & 15) == 0) prefetch_l2_bulk(w, (u32)n * 4);
}
extern "C" __global__ void __launch_bounds__(1024) rms_norm_f32(const float* __restrict__ x, float* __restrict__ res, const float* __restrict__ w,
                                        float* __restrict__ y, bf16_t* __restrict__ yb, int cols, int wc, float eps) {
    const int r = blockIdx.x, nt = blockDim.x;
    // The norm's weights are no kernel's output: read before the wait, off the critical path.
    float g[NORM_W];
#pragma unroll
    for (int i = 0; i < NORM_W; i++) {
        const int c = threadIdx.x + i * nt;
        g[i] = c < wc ? w[c] : 0.f;
    }
    if (threadIdx.x == 0 && wc > NORM_W * nt) prefetch_weights(w, wc);
    pdl_enter();
    const float* xr = x + (u64)r * cols;
    float* yr = y + (u64)r * cols;
    float* rr = res ? res + (u64)r * cols : 0;
    bf16_t* br = yb ? yb + (u64)r * cols : 0;
    float v[RMS_PER_THREAD];
#pragma unroll
    for (int i = 0; i < RMS_PER_THREAD; i++) {
        const int c = threadIdx.x + i * nt;
        v[i] = c < cols ? xr[c] + (rr ? rr[c] : 0.f) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RMS_PER_THREAD; i++) {
        const int c = threadIdx.x + i * nt;
        if (c >= cols) continue;
        if (rr) rr[c] = v[i];
        if (c < wc) {
            ss += v[i] * v[i];
        } else {
            yr[c] = v[i];
            if (br) br[c] = f2bf(v[i]);
        }
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)wc + eps);
#pragma unroll
    for (int i = 0; i < RMS_PER_THREAD; i++) {
        const int c = threadIdx.x + i * nt;
        if (c >= wc) continue;
        const float o = v[i] * inv * (i < NORM_W ? g[i] : w[c]);
        yr[c] = o;
        if (br) br[c] = f2bf(o);
    }
}

// A MoE layer's end: token r's expert rows of Y combined (moe_combine's arithmetic: its top_k rows
// in order, inv < 0 skipped), added to the residual `res`, and the sum RMS-normalized as rms_norm_f32
// with `res` does, one block per token. Each thread owns up to CN_CHUNKS float4 column chunks
// (cols % 4 == 0, cols <= 4 CN_CHUNKS blockDim.x); the top_k rows' loads are independent.
#define CN_CHUNKS 4
#define CN_W (NORM_W / 4)
extern "C" __global__ void __launch_bounds__(1024) moe_combine_norm(const float* __restrict__ Y, const int* __restrict__ inv,
                                            const float* __restrict__ wts, int top_k, float* __restrict__ res,
                                            const float* __restrict__ w, float* __restrict__ y, bf16_t* __restrict__ yb,
                                            int cols, float eps) {
    const int r = blockIdx.x, nt = blockDim.x, n4 = cols / 4;
    // The norm's weights before the wait (as rms_norm_f32: NORM_W values, CN_W float4 chunks, in
    // registers); after it, the routes and the residual row are loaded together, so that the
    // expert rows' loads are the only ones after them.
    const float4* wr = reinterpret_cast<const float4*>(w);
    float4 g[CN_W];
#pragma unroll
    for (int i = 0; i < CN_W; i++) {
        const int c4 = threadIdx.x + i * nt;
        g[i] = c4 < n4 ? wr[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (threadIdx.x == 0 && n4 > CN_W * nt) prefetch_weights(w, cols);
    pdl_enter();
    __shared__ int s_row[32];
    __shared__ float s_wt[32];
    if (threadIdx.x < top_k) {
        const int p = inv[(u64)r * top_k + threadIdx.x];
        s_row[threadIdx.x] = p;
        s_wt[threadIdx.x] = p < 0 ? 0.f : wts[(u64)r * top_k + threadIdx.x];
    }
    float4* rr = reinterpret_cast<float4*>(res + (u64)r * cols);
    float4 a[CN_CHUNKS];
#pragma unroll
    for (int i = 0; i < CN_CHUNKS; i++) {
        const int c4 = threadIdx.x + i * nt;
        a[i] = c4 < n4 ? rr[c4] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    float4 v[CN_CHUNKS];
#pragma unroll
    for (int i = 0; i < CN_CHUNKS; i++) v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int j = 0; j < top_k; j++) {
        const int p = s_row[j];
        if (p < 0) continue;  // an expert of another rank
        const float wj = s_wt[j];
        const float4* yr = reinterpret_cast<const float4*>(Y + (u64)p * cols);
#pragma unroll
        for (int i = 0; i < CN_CHUNKS; i++) {
            const int c4 = threadIdx.x + i * nt;
            if (c4 >= n4) break;
            const float4 t = yr[c4];
            v[i].x += wj * t.x, v[i].y += wj * t.y, v[i].z += wj * t.z, v[i].w += wj * t.w;
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < CN_CHUNKS; i++) {
        const int c4 = threadIdx.x + i * nt;
        if (c4 >= n4) break;
        v[i].x += a[i].x, v[i].y += a[i].y, v[i].z += a[i].z, v[i].w += a[i].w;
        rr[c4] = v[i];
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    ss = block_sum(ss);
    const float inv_rms = 1.0f / sqrtf(ss / (float)cols + eps);
    float4* yr = reinterpret_cast<float4*>(y + (u64)r * cols);
#pragma unroll
    for (int i = 0; i < CN_CHUNKS; i++) {
        const int c4 = threadIdx.x + i * nt;
        if (c4 >= n4) break;
        const float4 gi = i < CN_W ? g[i] : wr[c4];
        const float4 o = make_float4(v[i].x * inv_rms * gi.x, v[i].y * inv_rms * gi.y, v[i].z * inv_rms * gi.z,
                                     v[i].w * inv_rms * gi.w);
        yr[c4] = o;
        if (yb) {
            u32* br = reinterpret_cast<u32*>(yb + (u64)r * cols) + 2 * c4;
            br[0] = pack_bf16(o.x, o.y);
            br[1] = pack_bf16(o.z, o.w);
        }
    }
}

// y = silu(gate) * up per row of [gate | up]; with `yb` non-null also y as bf16.
// Rows of [gate | up] (or, `pairs`, of interleaved gate/up columns: the experts' layout) to
// silu(gate) * up; `y` (f32) and `yb` (bf16) are each written when non-null.
extern "C" __global__ void silu_mul_f32(const float* x, float* y, bf16_t* yb, int rows, int half, int pairs) {
    const u64 n = (u64)rows * half;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / half, c = i % half;
        const float* row = x + r * 2 * half;
        const float g = pairs ? row[2 * c] : row[c], u = pairs ? row[2 * c + 1] : row[half + c];
        const float v = g / (1.0f + expf(-g)) * u;
        if (y) y[i] = v;
        if (yb) yb[i] = f2bf(v);
    }
}

extern "C" __global__ void add_f32(float* a, const float* b, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) a[i] += b[i];
}

extern "C" __global__ void gather_rows_f32(const float* x, const u32* rows, float* y, int n, int cols) {
    const int r = blockIdx.x;
    if (r >= n) return;
    const float* src = x + (u64)rows[r] * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(u64)r * cols + c] = src[c];
}

// In place: for every row and head, rotates `rope` columns starting at offset + h * stride.
extern "C" __global__ void rope_f32(float* x, const float* cos_sin, const u32* pos, int n, int cols, int heads, int offset,
                                    int stride, int rope, int interleaved) {
    const int half = rope / 2;
    const u64 total = (u64)n * heads * half;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int p = (int)(i % half);
        const u64 rh = i / half;
        const int h = (int)(rh % heads);
        const u64 r = rh / heads;
        const float* cs = cos_sin + (u64)pos[r] * rope;
        const float c = cs[p], s = cs[half + p];
        float* v = x + r * cols + offset + (u64)h * stride;
        const int a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
    }
}

__device__ __forceinline__ void store_as(bf16_t* p, float v) { *p = f2bf(v); }
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }

// The cache is block-major: [num_blocks, layers, block_size, width], bf16 (fast path) or f32
// (reference precision, write_kv_f32 below).
template <typename T>
__device__ __forceinline__ void write_kv(const float* latent, const u32* slots, T* cache, int n, int width, int layers,
                                         int layer, int bs) {
    const u64 total = (u64)n * width;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / width, c = i % width;
        const u32 slot = slots[r];
        if (slot == NO_SLOT) continue;  // a padding row of a captured step
        const u64 blk = slot / bs, off = slot % bs;
        store_as(&cache[((blk * layers + layer) * bs + off) * width + c], latent[i]);
    }
}

extern "C" __global__ void write_kv_bf16(const float* latent, const u32* slots, bf16_t* cache, int n, int width, int layers,
                                         int layer, int bs) {
    write_kv(latent, slots, cache, n, width, layers, layer, bs);
}

extern "C" __global__ void kv_export_f32(const bf16_t* cache, const u32* blocks, float* out, int nb, u64 per_block) {
    const u64 total = (u64)nb * per_block;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 b = i / per_block, j = i % per_block;
        out[i] = bf2f(cache[(u64)blocks[b] * per_block + j]);
    }
}

extern "C" __global__ void kv_import_f32(const float* in, const u32* blocks, bf16_t* cache, int nb, u64 per_block) {
    const u64 total = (u64)nb * per_block;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 b = i / per_block, j = i % per_block;
        cache[(u64)blocks[b] * per_block + j] = f2bf(in[i]);
    }
}

extern "C" __global__ void cast_f32_bf16(const float* x, bf16_t* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) y[i] = f2bf(x[i]);
}

extern "C" __global__ void cast_bf16_f32(const bf16_t* x, float* y, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) y[i] = bf2f(x[i]);
}

__device__ __forceinline__ float fp8_e4m3(unsigned char x) {
    const int e = (x >> 3) & 15, m = x & 7;
    float v;
    if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(8 + m), e - 10);
    return (x & 0x80) ? -v : v;
}

// Converts a stored [rows, cols] weight to bf16 into dst rows `row_base + r * row_mul + row_off`.
// dtype: 0 bf16, 1 f16, 2 f32, 3 fp8 e4m3 with f32 block scales [ceil(rows/sb0), ceil(cols/sb1)].
extern "C" __global__ void convert_weight(const unsigned char* src, int dtype, int rows, int cols, const float* scale,
                                          int sb0, int sb1, bf16_t* dst, int row_base, int row_mul, int row_off) {
    const u64 total = (u64)rows * cols;
    const int scols = sb1 > 0 ? (cols + sb1 - 1) / sb1 : 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const int r = (int)(i / cols), c = (int)(i % cols);
        float v;
        if (dtype == 0) v = bf2f(reinterpret_cast<const bf16_t*>(src)[i]);
        else if (dtype == 1) v = h2f(reinterpret_cast<const unsigned short*>(src)[i]);
        else if (dtype == 2) v = reinterpret_cast<const float*>(src)[i];
        else {
            v = fp8_e4m3(src[i]);
            if (scale) v *= scale[(r / sb0) * scols + c / sb1];
        }
        dst[((u64)row_base + (u64)r * row_mul + row_off) * cols + c] = f2bf(v);
    }
}

__device__ __forceinline__ u32 hash_u32(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (u32)x;
}

// Uniform values in [lo, hi) from a counter hash: benchmark caches and weights, never zeros.
extern "C" __global__ void fill_uniform_bf16(bf16_t* dst, u64 n, u64 seed, float lo, float hi) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float u = (hash_u32(i * 0x9E3779B97F4A7C15ULL + seed) >> 8) * (1.0f / 16777216.0f);
        dst[i] = f2bf(lo + (hi - lo) * u);
    }
}

// Reference-precision (f32) cache: same block-major layout, f32 values.
extern "C" __global__ void write_kv_f32(const float* latent, const u32* slots, float* cache, int n, int width, int layers,
                                       int layer, int bs) {
    write_kv(latent, slots, cache, n, width, layers, layer, bs);
}

extern "C" __global__ void kv_gather_f32(const float* cache, const u32* blocks, float* out, int nb, u64 per_block) {
    const u64 total = (u64)nb * per_block;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x)
        out[i] = cache[(u64)blocks[i / per_block] * per_block + i % per_block];
}

extern "C" __global__ void kv_scatter_f32(const float* in, const u32* blocks, float* cache, int nb, u64 per_block) {
    const u64 total = (u64)nb * per_block;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x)
        cache[(u64)blocks[i / per_block] * per_block + i % per_block] = in[i];
}

// MLA's step between the projections and attention (replaces rope_f32 on q, rms_norm_f32, rope_f32
// on the latent and write_kv, with their arithmetic). Grid (rows, 1 + Q): block (r, 0) takes token r's latent row (`lora` values, then the shared rope key): RMS-normalized
// by `w` over its first `lora` columns, its key rotated, and written to the cache at the token's
// slot (nothing for NO_SLOT). Block (r, 1 + j) takes heads [j H, (j + 1) H) of q, H = ceil(heads /
// Q) (each
// `qstride` = nope + rope columns, the rope ones from `qoff` on): RoPE in place and, with `qb`
// non-null, the rotated row also written as bf16 there (the absorbed attention's GEMM operand).
// One block per token did all of it: at 128 heads a serial 37 us (run 51).
#define PROLOGUE_W 4  // the latent norm's weights a thread holds from before the wait (lora 512: 2)
template <typename T>
__device__ __forceinline__ void mla_prologue(float* q, bf16_t* qb, int qcols, int heads, int qoff, int qstride, const float* kv,
                                             const float* w, float eps, const float* cos_sin, const u32* pos,
                                             const u32* slots, T* cache, int lora, int rope, int layers, int layer,
                                             int bs, int interleaved) {
    // Positions and slots are the step's inputs (uploaded before its first kernel), the rotation
    // table and the norm's weights constants: all read before the wait.
    const int r = blockIdx.x, t = threadIdx.x, half = rope / 2, width = lora + rope;
    const float* cs = cos_sin + (u64)pos[r] * rope;
    if (blockIdx.y > 0) {
        pdl_enter();
        const int per = (heads + gridDim.y - 2) / (gridDim.y - 1);
        const int h0 = (blockIdx.y - 1) * per, nh = min(per, heads - h0);
        float* qr = q + (u64)r * qcols + (u64)h0 * qstride;
        bf16_t* br = qb ? qb + (u64)r * qcols + (u64)h0 * qstride : nullptr;
        for (int i = t; i < nh * qstride; i += blockDim.x) {
            const int p = i % qstride - qoff;  // this column's place among the head's rope columns
            if (p < 0) {
                if (br) br[i] = f2bf(qr[i]);
                continue;
            }
            // The thread of a pair's first column rotates both.
            const bool first = interleaved ? (p & 1) == 0 : p < half;
            if (!first) continue;
            const int j = interleaved ? p >> 1 : p, a = i, b = interleaved ? i + 1 : i + half;
            const float c = cs[j], s = cs[half + j], x0 = qr[a], x1 = qr[b];
            const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
            qr[a] = y0;
            qr[b] = y1;
            if (br) br[a] = f2bf(y0), br[b] = f2bf(y1);
        }
        return;
    }
    const u32 slot = slots[r];
    float g[PROLOGUE_W];
#pragma unroll
    for (int k = 0; k < PROLOGUE_W; k++) {
        const int c = t + k * blockDim.x;
        g[k] = c < lora ? w[c] : 0.f;
    }
    pdl_enter();
    const float* kr = kv + (u64)r * width;
    float ss = 0.f;
    for (int c = t; c < lora; c += blockDim.x) ss += kr[c] * kr[c];
    ss = block_sum(ss);
    if (slot == NO_SLOT) return;  // a padding row of a captured step
    const float inv = 1.0f / sqrtf(ss / (float)lora + eps);
    T* dst = cache + (((u64)(slot / bs) * layers + layer) * bs + slot % bs) * width;
#pragma unroll
    for (int k = 0; k < PROLOGUE_W; k++) {
        const int c = t + k * blockDim.x;
        if (c < lora) store_as(&dst[c], kr[c] * inv * g[k]);
    }
    for (int c = t + PROLOGUE_W * blockDim.x; c < lora; c += blockDim.x) store_as(&dst[c], kr[c] * inv * w[c]);
    for (int p = t; p < half; p += blockDim.x) {
        const int a = interleaved ? 2 * p : p, b = interleaved ? 2 * p + 1 : p + half;
        const float c = cs[p], s = cs[half + p], x0 = kr[lora + a], x1 = kr[lora + b];
        store_as(&dst[lora + a], x0 * c - x1 * s);
        store_as(&dst[lora + b], x1 * c + x0 * s);
    }
}

extern "C" __global__ void mla_prologue_bf16(float* q, bf16_t* qb, int qcols, int heads, int qoff, int qstride,
                                  const float* kv, const float* w, float eps, const float* cos_sin, const u32* pos,
                                  const u32* slots, bf16_t* cache, int lora, int rope, int layers, int layer, int bs,
                                  int interleaved) {
    mla_prologue(q, qb, qcols, heads, qoff, qstride, kv, w, eps, cos_sin, pos, slots, cache, lora, rope, layers, layer,
                 bs, interleaved);
}
extern "C" __global__ void mla_prologue_f32(float* q, bf16_t* qb, int qcols, int heads, int qoff, int qstride,
                                  const float* kv, const float* w, float eps, const float* cos_sin, const u32* pos,
                                  const u32* slots, float* cache, int lora, int rope, int layers, int layer, int bs,
                                  int interleaved) {
    mla_prologue(q, qb, qcols, heads, qoff, qstride, kv, w, eps, cos_sin, pos, slots, cache, lora, rope, layers, layer,
                 bs, interleaved);
}
