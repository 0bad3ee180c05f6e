// Token sampling on the device, one block per sampled row (engine/src/sampler.rs `pick` is the
// reference). Greedy rows take the first maximal logit. Random rows weigh each token by
// w = exp((l - max) / T) in (0, 1], cut the weights at one threshold (the largest of the top-k,
// top-p and min-p cuts; ties at the cut are kept), and take the first token, in vocabulary
// order, whose cumulative kept weight passes u * sum(kept). The top-k and top-p cuts are found by
// a radix select over the float bits (positive floats order as their bit patterns): four passes
// of a 256-bin histogram each, no sort.
// params per row: [row, temperature, top_k, top_p, min_p, u, mask] (floats as their bits); `mask`
// is the row's index into `masks` ([_, words] u32, bit i % 32 of word i / 32 allows token i) or
// 0xffffffff for none. A masked row picks among its allowed tokens as if the others' logits were
// -inf (no allowed token at all: the unmasked pick, which the engine then rejects).
// out per row: [token, logprob bits], the logprob under the unmodified distribution.

#define SAMPLE_THREADS 1024

struct SampleShared {
    float red_f[32];
    int red_i[32];
    float bcast_f;
    int bcast_i;
    u32 cnt[256];
    float sum[256];
    u32 chosen;
    int found;
};

__device__ __forceinline__ float sample_weight(float x, float m, float inv_t) {
    return isfinite(x) ? expf((x - m) * inv_t) : 0.f;
}

// Logit i as the pick sees it: -inf where the row's mask (if any) disallows it.
__device__ __forceinline__ float sample_logit(const float* l, const u32* mk, int i) {
    return (mk == nullptr || ((mk[i >> 5] >> (i & 31)) & 1u)) ? l[i] : NEG_INF;
}

// Block-wide sum; every thread gets the total.
__device__ float sample_block_sum(float v, SampleShared& sh) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sh.red_f[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < (int)(blockDim.x >> 5) ? sh.red_f[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) sh.bcast_f = t;
    }
    __syncthreads();
    const float r = sh.bcast_f;
    __syncthreads();
    return r;
}

// Block-wide (max value, smallest index holding it); every thread gets both.
__device__ void sample_block_argmax(float& m, int& idx, SampleShared& sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (om > m || (om == m && oi < idx)) { m = om; idx = oi; }
    }
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sh.red_f[w] = m; sh.red_i[w] = idx; }
    __syncthreads();
    if (w == 0) {
        const bool has = lane < (int)(blockDim.x >> 5);
        m = has ? sh.red_f[lane] : NEG_INF;
        idx = has ? sh.red_i[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, m, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (om > m || (om == m && oi < idx)) { m = om; idx = oi; }
        }
        if (lane == 0) { sh.bcast_f = m; sh.bcast_i = idx; }
    }
    __syncthreads();
    m = sh.bcast_f;
    idx = sh.bcast_i;
    __syncthreads();
}

// The bit pattern of the largest weight t (among those with bits >= floor) such that the count
// (by_sum = false) or the weight sum (by_sum = true) of weights >= t reaches `target`; 0 when even
// all of them fall short (keep everything).
__device__ u32 sample_select(const float* l, const u32* mk, int vocab, float m, float inv_t, u32 floor, bool by_sum,
                             float target, SampleShared& sh) {
    u32 prefix = 0, mask = 0;
    float above = 0.f;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) { sh.cnt[b] = 0; sh.sum[b] = 0.f; }
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float w = sample_weight(sample_logit(l, mk, i), m, inv_t);
            const u32 bits = __float_as_uint(w);
            if (w > 0.f && bits >= floor && (bits & mask) == prefix) {
                const u32 b = (bits >> shift) & 255u;
                if (by_sum) atomicAdd(&sh.sum[b], w);
                else atomicAdd(&sh.cnt[b], 1u);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int chosen = -1;
            for (int b = 255; b >= 0; --b) {
                const float here = by_sum ? sh.sum[b] : (float)sh.cnt[b];
                if (above + here >= target) { chosen = b; break; }
                above += here;
            }
            sh.found = chosen >= 0;
            sh.chosen = chosen >= 0 ? (u32)chosen : 0u;
        }
        __syncthreads();
        if (!sh.found) { __syncthreads(); return 0u; }
        prefix |= sh.chosen << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_rows(const float* logits, const u32* params,
                                                                         const u32* masks, u32* out, int vocab,
                                                                         int words) {
    __shared__ SampleShared sh;
    const u32* p = params + blockIdx.x * 7;
    const float* l = logits + (u64)p[0] * vocab;
    const float temp = __uint_as_float(p[1]);
    const u32 top_k = p[2];
    const float top_p = __uint_as_float(p[3]), min_p = __uint_as_float(p[4]), u = __uint_as_float(p[5]);

    float m = NEG_INF;
    int am = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = l[i];
        if (x > m) { m = x; am = i; }
    }
    sample_block_argmax(m, am, sh);
    float s = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(l[i] - m);
    const float lse = m + logf(sample_block_sum(s, sh));

    const u32* mk = p[6] == 0xffffffffu ? nullptr : masks + (u64)p[6] * words;
    if (mk != nullptr) {
        float mm = NEG_INF;
        int ami = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float x = sample_logit(l, mk, i);
            if (x > mm) { mm = x; ami = i; }
        }
        sample_block_argmax(mm, ami, sh);
        if (mm == NEG_INF) mk = nullptr;  // nothing allowed: leave the row unmasked
        else { m = mm; am = ami; }
    }

    int token = am;
    if (temp > 1e-5f) {
        const float inv_t = 1.f / temp;
        u32 tau = 1u;  // the smallest positive weight: keep every token with w > 0
        if (top_k > 0 && top_k < (u32)vocab) tau = max(tau, sample_select(l, mk, vocab, m, inv_t, 1u, false, (float)top_k, sh));
        if (top_p < 1.f) {
            float kept = 0.f;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                const float w = sample_weight(sample_logit(l, mk, i), m, inv_t);
                if (__float_as_uint(w) >= tau && w > 0.f) kept += w;
            }
            kept = sample_block_sum(kept, sh);
            tau = max(tau, sample_select(l, mk, vocab, m, inv_t, tau, true, top_p * kept, sh));
        }
        if (min_p > 0.f) tau = max(tau, __float_as_uint(min_p));

        // Each thread owns a contiguous chunk; an exclusive scan of chunk sums finds the chunk
        // where the cumulative kept weight passes u * total, and its owner walks it.
        const int per = (vocab + blockDim.x - 1) / blockDim.x;
        const int lo = threadIdx.x * per, hi = min(vocab, lo + per);
        float mine = 0.f;
        int last = -1;
        for (int i = lo; i < hi; ++i) {
            const float w = sample_weight(sample_logit(l, mk, i), m, inv_t);
            if (w > 0.f && __float_as_uint(w) >= tau) { mine += w; last = i; }
        }
        // Inclusive warp scan, then across warps.
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        float inc = mine;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float t = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += t;
        }
        if (lane == 31) sh.red_f[wid] = inc;
        __syncthreads();
        if (wid == 0) {
            float t = lane < (int)(blockDim.x >> 5) ? sh.red_f[lane] : 0.f;
            float ti = t;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float x = __shfl_up_sync(0xffffffffu, ti, o);
                if (lane >= o) ti += x;
            }
            sh.red_f[lane] = ti - t;  // exclusive prefix of warp totals
            if (lane == 31) sh.bcast_f = ti;
            if (lane == 0) sh.chosen = 0x7fffffffu;
        }
        __syncthreads();
        const float total = sh.bcast_f;
        const float excl = sh.red_f[wid] + inc - mine;
        const float target = u * total;
        if (mine > 0.f && excl <= target && target < excl + mine) {
            float acc = excl;
            int pick = last;
            for (int i = lo; i < hi; ++i) {
                const float w = sample_weight(sample_logit(l, mk, i), m, inv_t);
                if (w > 0.f && __float_as_uint(w) >= tau) {
                    acc += w;
                    if (acc > target) { pick = i; break; }
                }
            }
            atomicMin(&sh.chosen, (u32)pick);
        }
        __syncthreads();
        // Rounding can leave u * total past the last chunk: take the last kept token.
        float lm = (float)last;
        int li = last;
        if (sh.chosen == 0x7fffffffu) {
            sample_block_argmax(lm, li, sh);
            token = li >= 0 ? li : am;
        } else {
            token = (int)sh.chosen;
        }
    }
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = (u32)token;
        out[2 * blockIdx.x + 1] = __float_as_uint(l[token] - lse);
    }
}
