// DeepSeek MoE routing on the GPU: noaux_tc routing, the assignment sort into per-expert row
// tiles (both in one block at small batches), and the weighted combine of the experts' outputs
// (alone, or with the residual add and the next RMSNorm). Nothing here needs the host to know
// how many tokens each expert received.

// Order-preserving u32 key of a float (not NaN): a < b as floats iff key(a) < key(b), except that
// -0 sorts below +0; key 0 is below every float's key.
__device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ u32 warp_max_u32(u32 v) {
    u32 r;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ u32 warp_min_u32(u32 v) {
    u32 r;
    asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}
// The lowest index `idx` (0xffffffff: none) among the warp's largest keys `key` (0: no candidate).
__device__ __forceinline__ u32 warp_argmax_key(u32 key, u32 idx) {
    const u32 m = warp_max_u32(key);
    return warp_min_u32(key == m && key != 0u ? idx : 0xffffffffu);
}

// Routes token `tok` with one warp; E <= 256 (8 experts per lane), n_group <= 32, top_k + shared
// <= 32. The token's row of ids/wts holds its top_k routed experts, then the `shared`
// always-chosen experts E..E+shared-1 with weight 1 (shared experts folded into the grouped GEMMs).
__device__ __forceinline__ void route_token(const float* logits, const float* bias, u32* ids, float* wts, int tok, int E, int n_group,
                            int topk_group, int top_k, int shared, int norm, float scaling) {
    const int lane = threadIdx.x & 31;
    const float* lg = logits + (u64)tok * E;
    float sc[8], ch[8];
    bool taken[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int e = lane + 32 * j;
        taken[j] = e >= E;
        if (e < E) {
            const float s = 1.0f / (1.0f + expf(-lg[e]));
            sc[j] = s;
            ch[j] = s + bias[e];
        } else {
            sc[j] = 0.f;
            ch[j] = NEG_INF;
        }
    }
    const int gs = E / n_group;
    if (topk_group < n_group) {
        float mine = NEG_INF;  // lane g holds group g's score
        const bool lanes = gs <= 32 && (gs & (gs - 1)) == 0;
        if (lanes) {
            // A group is gs consecutive lanes of one of the eight expert columns (V3/R1: every
            // lane's expert j is group j; 64 experts in 8 groups: four groups per column): all
            // groups' top two reduced side by side within their lanes, the same values as the
            // loop below, then handed to lane g.
            float b1[8], b2[8];
#pragma unroll
            for (int j = 0; j < 8; j++) b1[j] = ch[j], b2[j] = NEG_INF;
            for (int o = gs >> 1; o > 0; o >>= 1)
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float o1 = __shfl_xor_sync(0xffffffffu, b1[j], o), o2 = __shfl_xor_sync(0xffffffffu, b2[j], o);
                    const float n1 = fmaxf(b1[j], o1), n2 = fmaxf(fminf(b1[j], o1), fmaxf(b2[j], o2));
                    b1[j] = n1;
                    b2[j] = n2;
                }
            const int per_col = 32 / gs;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float v = __shfl_sync(0xffffffffu, gs >= 2 ? b1[j] + b2[j] : b1[j], (lane % per_col) * gs);
                if (lane / per_col == j && lane < n_group) mine = v;
            }
        }
        for (int grp = 0; grp < n_group && !lanes; grp++) {
            float b1 = NEG_INF, b2 = NEG_INF;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int e = lane + 32 * j;
                if (e < E && e / gs == grp) {
                    const float v = ch[j];
                    if (v > b1) {
                        b2 = b1;
                        b1 = v;
                    } else if (v > b2) {
                        b2 = v;
                    }
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float o1 = __shfl_xor_sync(0xffffffffu, b1, o), o2 = __shfl_xor_sync(0xffffffffu, b2, o);
                const float n1 = fmaxf(b1, o1), n2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
                b1 = n1;
                b2 = n2;
            }
            const float score = gs >= 2 ? b1 + b2 : b1;
            if (lane == grp) mine = score;
        }
        bool gtaken = lane >= n_group;
        u32 keep = 0;
        for (int i = 0; i < topk_group; i++) {
            const u32 idx = warp_argmax_key(gtaken ? 0u : order_key(mine), (u32)lane);
            if (idx != 0xffffffffu) {
                keep |= 1u << idx;
                if ((u32)lane == idx) gtaken = true;
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int e = lane + 32 * j;
            if (e < E && !((keep >> (e / gs)) & 1u)) ch[j] = NEG_INF;
        }
    }
    float my_w = 0.f;
    u32 my_id = 0;
    for (int i = 0; i < top_k; i++) {
        // The largest untaken score, the lowest expert among equals (keys: one reduction each for
        // the score and the index, where a float argmax takes five rounds of two shuffles).
        u32 key = 0u, mi = 0xffffffffu;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const u32 k = taken[j] ? 0u : order_key(ch[j]);
            if (k > key) key = k, mi = (u32)(lane + 32 * j);
        }
        const u32 best = warp_argmax_key(key, mi);
        const int idx = best == 0xffffffffu ? 0x7fffffff : (int)best;
        float w = 0.f;
        if (idx != 0x7fffffff && (idx & 31) == lane) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (j == (idx >> 5)) {
                    taken[j] = true;
                    w = sc[j];
                }
            }
        }
        w = __shfl_sync(0xffffffffu, w, idx & 31);
        if (lane == i) {
            my_w = w;
            my_id = (u32)idx;
        }
    }
    const float total = warp_sum(lane < top_k ? my_w : 0.f);
    if (norm) my_w /= total + 1e-20f;
    const int kk = top_k + shared;
    if (lane < top_k) {
        ids[(u64)tok * kk + lane] = my_id;
        wts[(u64)tok * kk + lane] = my_w * scaling;
    } else if (lane < kk) {
        ids[(u64)tok * kk + lane] = (u32)(E + lane - top_k);
        wts[(u64)tok * kk + lane] = 1.0f;
    }
}

// One warp per token.
extern "C" __global__ void moe_route(const float* logits, const float* bias, u32* ids, float* wts, int n, int E, int n_group,
                                     int topk_group, int top_k, int shared, int norm, float scaling) {
    pdl_enter();
    const int tok = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (tok < n) route_token(logits, bias, ids, wts, tok, E, n_group, topk_group, top_k, shared, norm, scaling);
}

// Assignment i's expert among this rank's E (experts first..first+E-1), or -1 with inv[i] = -1
// for an expert of another rank (expert parallelism: no row, skipped by the combine).
__device__ __forceinline__ int local_expert(const u32* ids, int* inv, int i, int E, int first) {
    const int e = (int)ids[i] - first;
    if (e >= 0 && e < E) return e;
    inv[i] = -1;
    return -1;
}

// An expert of c rows: its tiles in `tiles` (every BM rows, the last one elsewhere when `halves`
// takes it), and whether `halves` gets its last tile (c % BM in 1..BM / 2).
__device__ __forceinline__ bool half_tile(int c, int BM, bool halves) {
    const int rest = c % BM;
    return halves && rest > 0 && rest <= BM / 2;
}
__device__ __forceinline__ int main_tiles(int c, int BM, bool halves) {
    return (c + BM - 1) / BM - (half_tile(c, BM, halves) ? 1 : 0);
}

// Writes expert e's tiles: c rows from sorted row `row`, the main ones from index t, its half tile
// (if any) at index h of `halves`.
__device__ __forceinline__ void write_tiles(int e, int c, int row, int t, int h, int BM, int* tiles, int* halves) {
    const int m = main_tiles(c, BM, halves != nullptr);
    for (int j = 0; j < m; j++) {
        tiles[3 * (t + j)] = e;
        tiles[3 * (t + j) + 1] = row + j * BM;
        tiles[3 * (t + j) + 2] = min(BM, c - j * BM);
    }
    if (half_tile(c, BM, halves != nullptr)) {
        halves[3 * h] = e;
        halves[3 * h + 1] = row + m * BM;
        halves[3 * h + 2] = c - m * BM;
    }
}

// The whole block (1024 threads; `sh` holds 6 E + 1 ints, then 32 E u16). Sorts the n*top_k
// assignments by expert, stably: sorted_tok[p] is the token of sorted position p, inv[i] the sorted
// position of assignment i, an expert's rows in assignment order (so a row's tile, and a stream-K
// GEMM's summation order, never depend on timing); tiles[3t..3t+3] = (expert, first sorted row,
// rows) for row tiles of at most BM rows; meta[0] = number of tiles; with `halves` non-null, an
// expert's last tile of at most BM / 2 rows goes to `halves` instead (same triple, their count in
// meta[1]), for a GEMM with tiles of half the rows; row_expert[p] (when non-null)
// the expert of sorted row p. This rank holds experts first..first+E-1 (expert parallelism): other
// assignments get inv -1 and no row, and the unused rows at the end point at token 0 of local
// expert 0 (computed, never combined). `ops::routing::align_reference` is the host reference.
__device__ __forceinline__ void align_assignments(const u32* ids, int A, int top_k, int E, int first, int BM, int* sorted_tok, int* inv,
                                  int* tiles, int* halves, int* meta, int* row_expert, int* sh) {
    int* cnt = sh;
    int* off = sh + E;
    int* cur = sh + 2 * E;
    int* toff = sh + 3 * E;
    int* chunk = sh + 4 * E;
    int* hoff = sh + 5 * E;
    int* total = sh + 6 * E;
    const bool split = halves != nullptr;
    // wc[w * E + e]: warp w's rows of expert e in the current chunk, then their exclusive prefix over warps.
    unsigned short* wc = reinterpret_cast<unsigned short*>(sh + 6 * E + 1);
    const int tid = threadIdx.x, bd = blockDim.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < E; e += bd) {
        cnt[e] = 0;
        cur[e] = 0;
    }
    for (int j = tid; j < (bd >> 5) * E; j += bd) wc[j] = 0;
    __syncthreads();
    for (int i = tid; i < A; i += bd) {
        const int e = (int)ids[i] - first;
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) {  // offsets by an exclusive scan over warp 0, a run of experts per lane
        const int per = (E + 31) / 32, e0 = tid * per, e1 = min(E, e0 + per);
        int o = 0, t = 0, h = 0;
        for (int e = e0; e < e1; e++) {
            o += cnt[e];
            t += main_tiles(cnt[e], BM, split);
            h += half_tile(cnt[e], BM, split);
        }
        int so = o, st = t, sv = h;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int po = __shfl_up_sync(0xffffffffu, so, d), pt = __shfl_up_sync(0xffffffffu, st, d);
            const int ph = __shfl_up_sync(0xffffffffu, sv, d);
            if (tid >= d) so += po, st += pt, sv += ph;
        }
        o = so - o;
        t = st - t;
        h = sv - h;
        for (int e = e0; e < e1; e++) {
            off[e] = o;
            toff[e] = t;
            hoff[e] = h;
            o += cnt[e];
            t += main_tiles(cnt[e], BM, split);
            h += half_tile(cnt[e], BM, split);
        }
        if (tid == 31) {
            meta[0] = st;
            if (split) meta[1] = sv;
            *total = so;
        }
    }
    __syncthreads();
    // Placement a chunk of bd assignments at a time: a row's rank among its expert's rows is the
    // earlier chunks' count, the earlier warps' count in this chunk, and its rank in its warp.
    for (int base = 0; base < A; base += bd) {
        const int i = base + tid, warps = min(bd, A - base + 31) >> 5;
        const int e = i < A ? local_expert(ids, inv, i, E, first) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(peers & ((1u << lane) - 1u));
        if (e >= 0 && rank == 0) wc[warp * E + e] = (unsigned short)__popc(peers);
        __syncthreads();
        for (int x = tid; x < E; x += bd) {
            int s = 0;
            for (int w = 0; w < warps; w++) {
                const int c = wc[w * E + x];
                wc[w * E + x] = (unsigned short)s;
                s += c;
            }
            chunk[x] = s;
        }
        __syncthreads();
        if (e >= 0) {
            const int p = off[e] + cur[e] + wc[warp * E + e] + rank;
            sorted_tok[p] = i / top_k;
            inv[i] = p;
            if (row_expert) row_expert[p] = e;
        }
        __syncthreads();
        for (int x = tid; x < E; x += bd) cur[x] += chunk[x];
        for (int j = tid; j < warps * E; j += bd) wc[j] = 0;
        __syncthreads();
    }
    for (int p = *total + tid; p < A; p += bd) {
        sorted_tok[p] = 0;
        if (row_expert) row_expert[p] = 0;
    }
    for (int e = tid; e < E; e += bd) write_tiles(e, cnt[e], off[e], toff[e], hoff[e], BM, tiles, halves);
}

// align_assignments for at most 32 assignments, by one warp without shared memory or barriers
// (a decode step of a few tokens): lane i holds assignment i; its expert's rows before it are its
// rank among its warp peers of that expert, and the rows (tiles) of lower experts are counted over
// the other lanes. The same results as align_assignments.
__device__ __forceinline__ void align_warp(const u32* ids, int A, int top_k, int E, int first, int BM, int* sorted_tok,
                                           int* inv, int* tiles, int* halves, int* meta, int* row_expert) {
    const int lane = threadIdx.x & 31;
    const bool split = halves != nullptr;
    const int e = lane < A ? local_expert(ids, inv, lane, E, first) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u)), cnt = __popc(peers);
    const bool lead = e >= 0 && rank == 0;
    const int ntiles = lead ? main_tiles(cnt, BM, split) : 0, nhalf = lead ? half_tile(cnt, BM, split) : 0;
    int before = 0, tiles_before = 0, tiles_total = 0, halves_before = 0, halves_total = 0;
    for (int j = 0; j < A; j++) {
        const int ej = __shfl_sync(0xffffffffu, e, j), tj = __shfl_sync(0xffffffffu, ntiles, j);
        const int hj = __shfl_sync(0xffffffffu, nhalf, j);
        tiles_total += tj;
        halves_total += hj;
        if (ej >= 0 && ej < e) before++, tiles_before += tj, halves_before += hj;
    }
    const int total = __popc(__ballot_sync(0xffffffffu, e >= 0));
    if (e >= 0) {
        const int p = before + rank;
        sorted_tok[p] = lane / top_k;
        inv[lane] = p;
        if (row_expert) row_expert[p] = e;
    }
    for (int p = total + lane; p < A; p += 32) {
        sorted_tok[p] = 0;
        if (row_expert) row_expert[p] = 0;
    }
    if (lead) write_tiles(e, cnt, before, tiles_before, halves_before, BM, tiles, halves);
    if (lane == 0) {
        meta[0] = tiles_total;
        if (split) meta[1] = halves_total;
    }
}
// The most assignments align_warp takes (one per lane); ops/routing.rs launches one warp's worth
// of threads (per token, for moe_route_align) for them.
#define ALIGN_WARP_MAX 32

#define ALIGN_ARGS int A, int top_k, int E, int first, int BM, int *sorted_tok, int *inv, int *tiles, int *halves, int *meta, int *row_expert
#define ALIGN_PASS A, top_k, E, first, BM, sorted_tok, inv, tiles, halves, meta, row_expert

extern "C" __global__ void moe_align(const u32* ids, ALIGN_ARGS) {
    pdl_enter();
    extern __shared__ int sh[];
    if (A <= ALIGN_WARP_MAX) {
        if (threadIdx.x < 32) align_warp(ids, ALIGN_PASS);
        return;
    }
    align_assignments(ids, ALIGN_PASS, sh);
}

// Small batches: moe_route (`route_k` routed experts of `n_experts`) and moe_align (`A` = n *
// (route_k + shared) assignments, `top_k` = route_k + shared, its `E` and `first` the local
// experts) in one block, warp w routing tokens w, w + 32, ...; the sort reads the ids just written.
extern "C" __global__ void moe_route_align(const float* logits, const float* bias, u32* ids, float* wts, int n,
                                           int n_experts, int n_group, int topk_group, int route_k, int shared, int norm,
                                           float scaling, ALIGN_ARGS) {
    pdl_enter();
    extern __shared__ int sh[];
    for (int tok = threadIdx.x >> 5; tok < n; tok += blockDim.x >> 5)
        route_token(logits, bias, ids, wts, tok, n_experts, n_group, topk_group, route_k, shared, norm, scaling);
    __syncthreads();
    if (A <= ALIGN_WARP_MAX) {
        if (threadIdx.x < 32) align_warp(ids, ALIGN_PASS);
        return;
    }
    align_assignments(ids, ALIGN_PASS, sh);
}

// out[t] = sum_j wts[t, j] * Y[inv[t, j]]: the weighted sum of token t's expert outputs. Grid
// (ceil(H / 4 / blockDim), n): each thread owns 4 columns of one token, the top_k rows' loads
// independent of each other (float4 when H % 4 == 0).
extern "C" __global__ void moe_combine(const float* __restrict__ Y, const int* __restrict__ inv,
                                       const float* __restrict__ wts, float* __restrict__ out, int n, int top_k, int H) {
    pdl_enter();
    const int t = blockIdx.y, c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (t >= n || c >= H) return;
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const bool vec = (H & 3) == 0;
#pragma unroll 8
    for (int j = 0; j < top_k; j++) {
        const int p = inv[(u64)t * top_k + j];
        if (p < 0) continue;  // an expert of another rank
        const float wj = wts[(u64)t * top_k + j];
        const float* y = Y + (u64)p * H + c;
        if (vec) {
            const float4 v = *reinterpret_cast<const float4*>(y);
            s[0] += wj * v.x, s[1] += wj * v.y, s[2] += wj * v.z, s[3] += wj * v.w;
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (c + q < H) s[q] += wj * y[q];
        }
    }
    float* o = out + (u64)t * H + c;
    if (vec) {
        *reinterpret_cast<float4*>(o) = make_float4(s[0], s[1], s[2], s[3]);
    } else {
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (c + q < H) o[q] = s[q];
    }
}
