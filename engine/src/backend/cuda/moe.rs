//! DeepSeek MoE on the GPU: routing and the sort into expert row tiles (one kernel for both at
//! small batches), then the experts as two grouped GEMMs over the row tiles that received tokens
//! (gate/up with SiLU-mul fused, then down) and a weighted combine (with the residual add and the
//! next RMSNorm when the layer's end is asked for). No host synchronization: tile counts stay on
//! the device.

use cleave_kernels::fp8::BLOCK;
use cleave_kernels::ops::{Align, Fp8Order, GemmKernel, GroupedGemm, QGemm, QWeights, Route, WgmmaGemm, GGW_FP8_BM};
use cleave_kernels::quant::QFormat;
use cleave_kernels::{ptr, Gpu};

use super::quant::{QIn, QuantWeight};
use super::{kerr, CudaBackend, CudaExperts, CudaRouting, CudaTensor, ExpertData, QRows, ROWS32_MIN_AVG};
use crate::backend::{AddNorm, Backend, Router, RouterParams};
use crate::error::{EngineError, Result};

/// Rows up to which shared experts folded in are computed in the routed experts' grouped GEMM
/// (every format; measured on bf16). Beyond, their row tiles (16 or 32 rows each) re-read their weights once per tile:
/// V2-Lite's bf16 step (run 44, CUDA graphs) went from 14.79 to 15.14 ms at batch 256 folded,
/// where batch 1 gained 8% (3.52 -> 3.25 ms) and batch 64 1% (11.34 -> 11.19 ms).
const FOLDED_SHARED_MAX_ROWS: usize = 64;

/// Where a MoE op's routing comes from.
pub(super) enum Routing<'a> {
    /// Computed already ([`Backend::moe_route`]).
    Done(&'a CudaRouting),
    /// The router, run by the MoE op itself: with the assignment sort in one kernel at batches
    /// of up to `Fusion::route_align` tokens.
    Router(Router<'a, CudaTensor>),
}

pub(super) fn route(be: &CudaBackend, logits: &CudaTensor, bias: &CudaTensor, p: RouterParams) -> Result<CudaRouting> {
    let (r, launch) = routing_for(be, logits, bias, p)?;
    // SAFETY: the router's logits, bias, and the id and weight outputs are live buffers of this
    // GPU sized for these tokens and experts.
    unsafe { be.gpu().moe_route(&launch) }.map_err(kerr)?;
    Ok(r)
}

/// The routing's buffers and the launch that fills them.
fn routing_for(
    be: &CudaBackend,
    logits: &CudaTensor,
    bias: &CudaTensor,
    p: RouterParams,
) -> Result<(CudaRouting, Route)> {
    if logits.cols != p.n_experts || bias.len() != p.n_experts {
        return Err(EngineError::Backend(format!(
            "moe_route: {} logits and {} biases for {} experts",
            logits.cols,
            bias.len(),
            p.n_experts
        )));
    }
    let (n, k) = (logits.rows, p.top_k + p.shared);
    let ids = be.scratch::<u32>(n * k)?;
    let weights = be.alloc_f32(n * k)?;
    let launch = Route {
        logits: logits.ptr(),
        bias: bias.ptr(),
        ids: ptr(&ids),
        wts: ptr(&weights),
        n,
        experts: p.n_experts,
        n_group: p.n_group,
        topk_group: p.topk_group,
        top_k: p.top_k,
        shared: p.shared,
        norm: p.norm_topk_prob,
        scaling: p.scaling,
    };
    Ok((CudaRouting { ids, weights, rows: n, top_k: k }, launch))
}

/// Whether `n` tokens, `top_k` routed experts each, give the layer's `group_routed` routed
/// experts (over the whole group: a rank holds only some with expert parallelism) 32 rows or
/// more on average: prefill-sized tiles.
fn prefill_sized(n: usize, top_k: usize, group_routed: usize) -> bool {
    n * top_k >= 32 * group_routed
}

/// The routed assignments a rank holding `local` of the `group_routed` routed experts expects
/// from `n` tokens with `top_k` each (all of them in a group of one).
fn local_assignments(n: usize, top_k: usize, local: usize, group_routed: usize) -> usize {
    n * top_k * local / group_routed
}

/// The routed experts' weighted sum per token or, with `end`, the next input (the combine, the
/// residual add and the RMSNorm in one kernel where no dense shared MLP comes between).
pub(super) fn experts(
    be: &CudaBackend,
    x: &CudaTensor,
    routing: Routing<'_>,
    ex: &CudaExperts,
    end: Option<AddNorm<'_, CudaTensor>>,
) -> Result<CudaTensor> {
    let (n, h, e, i) = (x.rows, x.cols, ex.experts, ex.inter);
    let (rows, k) = match &routing {
        Routing::Done(r) => (r.rows, r.top_k),
        Routing::Router(r) => (r.logits.rows, r.params.top_k + r.params.shared),
    };
    if h != ex.hidden || rows != n {
        return Err(EngineError::Backend(format!(
            "moe_experts: {n}x{h} input, routing of {rows} rows, experts of width {}",
            ex.hidden
        )));
    }
    if n == 0 {
        return joined(be, be.tensor(0, h)?, end);
    }
    let gpu = be.gpu();
    let a = n * k;
    let v = be.variants();
    // Row tiles of 64 once routed experts average 32 rows or more (prefill; AWQ experts keep
    // decode tiles until their bf16 expansion), 32 from ROWS32_MIN_AVG rows (bf16 experts on the
    // persistent kernel), else 16 or 8 (decode).
    let s = ex.shared;
    if k <= s {
        return Err(EngineError::Backend(format!("moe_experts: {k} experts per token, {s} of them shared")));
    }
    // Tile sizes follow the rows each expert gets on average: the routed assignments spread over
    // the whole layer's routed experts, of which a rank holds `e - s` with expert parallelism.
    let group_routed = match &routing {
        Routing::Router(r) => r.params.n_experts,
        Routing::Done(_) => e - s,
    }
    .max(e - s);
    let prefill = prefill_sized(n, k - s, group_routed);
    // Shared experts folded in run as dense GEMMs over their slots of the stack at prefill sizes
    // (cuBLAS there beats the grouped GEMM's 64-row tiles) and beyond FOLDED_SHARED_MAX_ROWS
    // rows (compressed slots are then expanded to bf16 per call). Aligning only the routed
    // experts gives the shared assignments no row and no weight in the combine.
    let dense_shared = s > 0 && (prefill || n > FOLDED_SHARED_MAX_ROWS) && !matches!(ex.data, ExpertData::F32 { .. });
    let (aligned, routed_a) = if dense_shared { (e - s, n * (k - s)) } else { (e, a) };
    // The assignments this rank's experts expect: its share of the routed ones, and the shared
    // experts' rows when they are folded in.
    let local_a = local_assignments(n, k - s, e - s, group_routed) + if dense_shared { 0 } else { n * s };
    let rows32 = match (&ex.data, v.moe_persistent, v.moe_rows32) {
        (ExpertData::Bf16 { .. }, Some(_), Some(cfg)) if local_a >= ROWS32_MIN_AVG * aligned => Some(cfg),
        _ => None,
    };
    // Prefill-sized batches on Hopper's warpgroup MMA, with its row tiles: bf16 experts, and FP8
    // experts on FP8 tensor cores where both GEMMs' inputs are whole 128-channel blocks.
    let bf16_wgmma = v.prefill_gemm.filter(|_| prefill && gpu.has_wgmma());
    let wgmma = bf16_wgmma.filter(|_| matches!(ex.data, ExpertData::Bf16 { .. }));
    let fp8_wgmma = match (&ex.data, v.prefill_fp8) {
        (ExpertData::Quant { gate_up, down }, Some(stages))
            if prefill
                && gpu.has_wgmma()
                && v.fp8_tensor_cores
                && Gpu::wgmma_fp8_takes(&gate_up.view().shape)
                && Gpu::wgmma_fp8_takes(&down.view().shape) =>
        {
            Some(stages)
        }
        _ => None,
    };
    // Prefill-sized AWQ experts with enough rows each: expanded to bf16 for this call, on the
    // same bf16 wgmma GEMM.
    let awq_expand = bf16_wgmma.filter(|_| match &ex.data {
        ExpertData::Quant { gate_up, .. } => {
            gate_up.view().shape.format == QFormat::AwqInt4
                && v.awq_prefill_rows > 0
                && local_a >= v.awq_prefill_rows * aligned
        }
        _ => false,
    });
    // Decode-sized compressed experts: the persistent shape's tiles when both GEMMs have one (8
    // rows for AWQ experts of a few rows each; `qgemm_decode` asks the same question); None: the
    // tiled kernel's 16.
    let persistent_bm = match &ex.data {
        ExpertData::Quant { gate_up, down } => {
            let avg = local_a.div_ceil(aligned.max(1));
            let rows = QRows::Tiles(if avg <= v.qgemm_rows8 { 8 } else { 16 });
            let shape = |w: &QuantWeight| be.qgemm_shape(w, rows).map(|c| c.bm);
            match (shape(gate_up), shape(down)) {
                (Some(a), Some(b)) if a == b => Some(a),
                _ => None,
            }
        }
        _ => None,
    };
    // AWQ experts stay on the persistent decode tiles until the bf16 expansion takes them: the
    // 64-row int4 tiles run at about 62 TFLOP/s, below what the decode tiles reach streaming
    // each expert once per 16 rows (run 120).
    let awq_decode_tiles = match &ex.data {
        ExpertData::Quant { gate_up, .. } => gate_up.shape.format == QFormat::AwqInt4 && persistent_bm.is_some(),
        _ => false,
    };
    let bm = if let Some(cfg) = wgmma.or(awq_expand) {
        cfg.bm
    } else if fp8_wgmma.is_some() {
        GGW_FP8_BM
    } else if prefill && !awq_decode_tiles {
        64
    } else if rows32.is_some() {
        32
    } else {
        persistent_bm.unwrap_or(16)
    };
    // With 16-row AWQ tiles on the persistent kernel, each expert's last tile of at most 8 rows
    // goes to the 8-row kernel (a launch of its own: one kernel with both bodies needs registers
    // that cost a block an SM, run 165), which unpacks each weight for 8 rows where the 16-row
    // one pays MMAs and folds for 16.
    let halves = match (&ex.data, v.qgemm_halves) {
        (ExpertData::Quant { gate_up, down }, Some(min_bytes))
            if bm == 16 && persistent_bm == Some(16) && gate_up.shape.format == QFormat::AwqInt4 =>
        {
            let eight = |w: &QuantWeight| be.qgemm_shape(w, QRows::Tiles(8)).is_some_and(|c| c.bm == 8);
            eight(gate_up) && eight(down) && gate_up.shape.bytes() + down.shape.bytes() >= min_bytes
        }
        _ => false,
    };
    let max_tiles = Gpu::moe_max_tiles(a, aligned, bm);
    let max_halves = if halves { Gpu::moe_max_halves(a, aligned) } else { 0 };
    let sorted_tok = be.buf::<i32>(a)?;
    let inv = be.buf::<i32>(a)?;
    // The tiles, then the half tiles; meta holds both counts.
    let tiles = be.buf::<i32>(3 * (max_tiles + max_halves))?;
    let meta = be.buf::<i32>(2)?;
    let halves_at = |base: u64| base + (3 * max_tiles * 4) as u64;
    // The reference-precision experts read each sorted row's expert.
    let row_expert = match ex.data {
        ExpertData::F32 { .. } => Some(be.buf::<i32>(a)?),
        _ => None,
    };
    let align = Align {
        ids: 0,
        assignments: a,
        top_k: k,
        experts: aligned,
        first: ex.first,
        bm,
        sorted_tok: ptr(&sorted_tok),
        inv: ptr(&inv),
        tiles: ptr(&tiles),
        halves: if halves { halves_at(ptr(&tiles)) } else { 0 },
        meta: ptr(&meta),
        row_expert: row_expert.as_ref().map_or(0, |b| ptr(b)),
    };
    let routed;
    let r = match routing {
        Routing::Done(r) => {
            // SAFETY: the assignment ids and the sort's outputs (sized for the most tiles these
            // assignments can make) are live buffers of this GPU.
            unsafe { gpu.moe_align(&Align { ids: ptr(&r.ids), ..align }) }.map_err(kerr)?;
            r
        }
        Routing::Router(rt) => {
            let (r, route) = routing_for(be, rt.logits, rt.bias, rt.params)?;
            let align = Align { ids: route.ids, ..align };
            if n <= v.fusion.route_align {
                // SAFETY: the routing's and the sort's buffers are live buffers of this GPU sized for these
                // tokens, experts and tiles.
                unsafe { gpu.moe_route_align(&route, &align) }.map_err(kerr)?;
            } else {
                // SAFETY: the router's logits, bias, and the id and weight outputs are live buffers of this
                // GPU sized for these tokens and experts.
                unsafe { gpu.moe_route(&route) }.map_err(kerr)?;
                // SAFETY: the assignment ids and the sort's outputs (sized for the most tiles these
                // assignments can make) are live buffers of this GPU.
                unsafe { gpu.moe_align(&align) }.map_err(kerr)?;
            }
            routed = r;
            &routed
        }
    };
    let y = be.alloc_f32(a * h)?;
    if let (ExpertData::F32 { gate_up, down }, Some(row_expert)) = (&ex.data, &row_expert) {
        let act = be.alloc_f32(a * i)?;
        let (gu, dn) = (ptr(gate_up), ptr(down));
        // SAFETY: the tokens, the sorted rows, the f32 expert weights, the activation scratch and the
        // output are live buffers of this GPU of the sizes moe_f32 reads and writes.
        unsafe { gpu.moe_f32(x.ptr(), ptr(&sorted_tok), ptr(row_expert), gu, dn, ptr(&act), ptr(&y), a, h, i) }
            .map_err(kerr)?;
        return combine(be, x, ptr(&y), ptr(&inv), r, ex, false, end);
    }
    // The input's bf16 shadow (an RMSNorm output) when it has one.
    let xb = be.bf16_in(x)?;
    let act = be.alloc_u16(a * i)?;
    let (tiles, meta) = (ptr(&tiles), ptr(&meta));
    // The gate/up GEMM over bf16 weights (at `w`), SiLU-gated into `act`.
    let bf16_gate_up = GroupedGemm {
        silu: true,
        x: xb.ptr(),
        rowidx: ptr(&sorted_tok),
        w: 0,
        y: ptr(&act),
        tiles,
        meta,
        max_tiles,
        n: 2 * i,
        k: h,
    };
    match &ex.data {
        ExpertData::Bf16 { gate_up, down } => {
            let kernel = match (wgmma, v.moe_persistent, rows32) {
                (Some(cfg), _, _) => GemmKernel::Wgmma(cfg),
                (_, _, Some(cfg)) if bm == 32 => GemmKernel::Persistent(cfg),
                (_, Some(cfg), _) if bm == 16 => GemmKernel::Persistent(cfg),
                _ => GemmKernel::Tiled { v2: v.gemm_v2, bm },
            };
            let gate_up = GroupedGemm { w: ptr(gate_up), ..bf16_gate_up };
            // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
            // launch are live buffers of this GPU of the sizes it gives.
            unsafe { gpu.grouped_gemm(kernel, &gate_up) }.map_err(kerr)?;
            // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
            // launch are live buffers of this GPU of the sizes it gives.
            unsafe { gpu.grouped_gemm(kernel, &down_of(&gate_up, ptr(down), ptr(&y))) }.map_err(kerr)?;
        }
        ExpertData::Quant { gate_up, down } => {
            let g = QGemm {
                silu: true,
                x: 0,
                x_scales: 0,
                rowidx: ptr(&sorted_tok),
                y: ptr(&act),
                tiles,
                meta,
                max_tiles,
                rows: a,
                bm,
                splits: 1,
                streamk: false,
            };
            // Decode-sized tiles as the variants pick; prefill's expanded to bf16 (AWQ with enough
            // rows), on FP8 wgmma, or 64 rows each on the tiled kernel.
            if let Some(cfg) = awq_expand {
                awq_expanded_experts(be, [gate_up, down], aligned, bf16_gate_up, ptr(&y), cfg)?;
            } else if let Some(stages) = fp8_wgmma {
                // Only the routed rows are aligned (and computed): the SiLU output's others are never read.
                let g = QGemm { rows: routed_a, ..g };
                fp8_wgmma_experts(be, x, [gate_up, down], g, ptr(&y), stages)?;
            } else if bm <= 16 {
                // The row tiles, then the half tiles on the 8-row kernel.
                let half = QGemm { tiles: halves_at(tiles), meta: meta + 4, max_tiles: max_halves, bm: 8, ..g };
                let runs = [Some(g), halves.then_some(half)];
                // AWQ reads x's bf16 shadow; FP8 quantizes it from f32.
                let x_in = || match gate_up.shape.format {
                    QFormat::AwqInt4 => QIn::Bf16 { ptr: xb.ptr(), rows: n },
                    QFormat::Fp8E4m3 => QIn::F32(x),
                };
                for g in runs.into_iter().flatten() {
                    be.qgemm_decode(gate_up, x_in(), g, None)?;
                }
                for g in runs.into_iter().flatten() {
                    let g = QGemm { silu: false, rowidx: 0, y: ptr(&y), ..g };
                    be.qgemm_decode(down, QIn::Bf16 { ptr: ptr(&act), rows: a }, g, None)?;
                }
            } else {
                // SAFETY: the weights, the input rows, the tile lists and the outputs named in the launch are
                // live buffers of this GPU sized for these rows and this weight.
                unsafe { gpu.qgemm(&gate_up.view(), &QGemm { x: xb.ptr(), ..g }) }.map_err(kerr)?;
                // SAFETY: the weights, the input rows, the tile lists and the outputs named in the launch are
                // live buffers of this GPU sized for these rows and this weight.
                unsafe { gpu.qgemm(&down.view(), &QGemm { silu: false, x: ptr(&act), rowidx: 0, y: ptr(&y), ..g }) }
                    .map_err(kerr)?;
            }
        }
        ExpertData::F32 { .. } => unreachable!("reference precision returned above"),
    }
    if let Some(stats) = be.expert_stats.borrow_mut().as_mut() {
        // Routed experts only (the shared ones run for every token).
        let (ids, _) = be.routing_to_host(r)?;
        let routed = e - s;
        let mut used = vec![false; routed];
        ids.iter().filter(|&&id| (id as usize) < routed).for_each(|&id| used[id as usize] = true);
        stats.push(used.iter().filter(|&&u| u).count());
    }
    combine(be, x, ptr(&y), ptr(&inv), r, ex, dense_shared, end)
}

/// Each token's expert rows of `y` (sorted positions `inv`) weighted and summed, plus the shared
/// experts as dense GEMMs when `dense_shared`; with `end`, joined to the residual
/// ([`joined`]). The combine, the residual add and the RMSNorm are one kernel where they can be:
/// the dense shared experts then accumulate into the residual first.
#[allow(clippy::too_many_arguments)]
fn combine(
    be: &CudaBackend,
    x: &CudaTensor,
    y: u64,
    inv: u64,
    r: &CudaRouting,
    ex: &CudaExperts,
    dense_shared: bool,
    end: Option<AddNorm<'_, CudaTensor>>,
) -> Result<CudaTensor> {
    let (n, h, k, gpu) = (x.rows, x.cols, r.top_k, be.gpu());
    match end {
        // The fused kernel normalizes whole rows of whole float4s; anything else (or a bad shape,
        // which add_rms_norm then reports) takes the two kernels.
        Some(e)
            if be.variants().fusion.moe_end
                && h.is_multiple_of(4)
                && e.w.len() == h
                && (e.residual.rows, e.residual.cols) == (n, h) =>
        {
            let res = e.residual.ptr_mut();
            if dense_shared {
                shared_dense(be, x, ex, res)?;
            }
            let out = be.tensor_shadowed(n, h)?;
            let yb = out.bf16_ptr().unwrap_or(0);
            // SAFETY: the expert rows, their index and weight lists, the residual, the norm weight and
            // the outputs are live buffers of this GPU of the sizes moe_combine_norm reads and writes.
            unsafe { gpu.moe_combine_norm(y, inv, ptr(&r.weights), k, res, e.w.ptr(), out.ptr(), yb, n, h, e.eps) }
                .map_err(kerr)?;
            Ok(out)
        }
        end => {
            let out = be.tensor(n, h)?;
            // SAFETY: the expert rows, their index and weight lists and the output are live buffers of
            // this GPU of the sizes moe_combine reads and writes.
            unsafe { gpu.moe_combine(y, inv, ptr(&r.weights), out.ptr(), n, k, h) }.map_err(kerr)?;
            if dense_shared {
                shared_dense(be, x, ex, out.ptr())?;
            }
            joined(be, out, end)
        }
    }
}

/// `y`, or with `end` the next input ([`Backend::add_rms_norm`](crate::backend::Backend::add_rms_norm)).
fn joined(be: &CudaBackend, y: CudaTensor, end: Option<AddNorm<'_, CudaTensor>>) -> Result<CudaTensor> {
    match end {
        Some(e) => be.add_rms_norm(e.residual, &y, e.w, e.eps),
        None => Ok(y),
    }
}

/// The gate/up (`gate_up`'s SiLU-gated GEMM) and down (into `y`) GEMMs over the first `experts`
/// AWQ experts of the stacks, each stack expanded to bf16 (one buffer, gate/up's then down's)
/// just before its GEMM on the bf16 wgmma kernel in shape `cfg`.
fn awq_expanded_experts(
    be: &CudaBackend,
    [gate_up, down]: [&QuantWeight; 2],
    experts: usize,
    gemm: GroupedGemm,
    y: u64,
    cfg: WgmmaGemm,
) -> Result<()> {
    let gpu = be.gpu();
    let (gu, dn) = (gate_up.view(), down.view());
    let (gu, dn) = match (gu.matrices(0, experts), dn.matrices(0, experts)) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            return Err(EngineError::Backend(format!(
                "moe_experts: {experts} experts of a stack of {}",
                gu.shape.experts
            )))
        }
    };
    let values = |q: &QWeights| q.shape.experts * q.shape.n * q.shape.k;
    let wide = be.buf::<u16>(values(&gu).max(values(&dn)))?;
    // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
    // GPU.
    unsafe { gpu.qdequant(&gu, ptr(&wide)) }.map_err(kerr)?;
    // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
    // launch are live buffers of this GPU of the sizes it gives.
    unsafe { gpu.grouped_gemm(GemmKernel::Wgmma(cfg), &GroupedGemm { w: ptr(&wide), ..gemm }) }.map_err(kerr)?;
    // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
    // GPU.
    unsafe { gpu.qdequant(&dn, ptr(&wide)) }.map_err(kerr)?;
    // SAFETY: the input rows, the expert weights, the tile lists and the output rows named in the
    // launch are live buffers of this GPU of the sizes it gives.
    unsafe { gpu.grouped_gemm(GemmKernel::Wgmma(cfg), &down_of(&gemm, ptr(&wide), y)) }.map_err(kerr)
}

/// The down GEMM after the gate/up GEMM `gate_up`: its SiLU output through bf16 weights at `w`
/// into `y`.
fn down_of(gate_up: &GroupedGemm, w: u64, y: u64) -> GroupedGemm {
    GroupedGemm { silu: false, x: gate_up.y, rowidx: 0, w, y, n: gate_up.k, k: gate_up.n / 2, ..*gate_up }
}

/// The routed experts' gate/up (SiLU into `g.y`, `rows` rows of the intermediate size) and down (f32
/// into `y`) GEMMs over FP8 weights on the FP8 wgmma grouped GEMM: `x` quantized per token per 128
/// channels in its order, then the SiLU output likewise.
fn fp8_wgmma_experts(
    be: &CudaBackend,
    x: &CudaTensor,
    [gate_up, down]: [&QuantWeight; 2],
    g: QGemm,
    y: u64,
    stages: usize,
) -> Result<()> {
    let gpu = be.gpu();
    let (h, i, a) = (gate_up.shape.k, down.shape.k, g.rows);
    // SAFETY: the FP8 weights, the e4m3 activations and scales, the tile lists and the outputs
    // named in the launch are live buffers of this GPU sized for them.
    let gemm = |w: &QuantWeight, g: &QGemm| {
        unsafe { gpu.qgemm_wgmma_fp8(&w.view(), g, stages, w.paired_scales) }.map_err(kerr)
    };
    let (xq, xs) = (be.buf::<u32>(x.rows * h / 4)?, be.buf::<f32>(x.rows * h / BLOCK)?);
    // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
    // for these rows and channels.
    unsafe { gpu.act_quant_fp8_mma(Fp8Order::Wgmma, x.ptr(), false, x.rows, h, ptr(&xq), ptr(&xs)) }.map_err(kerr)?;
    gemm(gate_up, &QGemm { x: ptr(&xq), x_scales: ptr(&xs), ..g })?;
    let (aq, asc) = (be.buf::<u32>(a * i / 4)?, be.buf::<f32>(a * i / BLOCK)?);
    // SAFETY: the activations and the e4m3 and scale outputs are live buffers of this GPU sized
    // for these rows and channels.
    unsafe { gpu.act_quant_fp8_mma(Fp8Order::Wgmma, g.y, true, a, i, ptr(&aq), ptr(&asc)) }.map_err(kerr)?;
    let dn = QGemm { silu: false, x: ptr(&aq), x_scales: ptr(&asc), rowidx: 0, y, ..g };
    gemm(down, &dn)
}

/// `out += shared(x)` for the shared experts folded into the last slots of `ex`, as dense GEMMs
/// over those slots (compressed ones expanded to bf16 first): one GEMM for every slot's
/// interleaved gate/up rows, SiLU-mul over the pairs, then each slot's down projection
/// accumulated into `out` (f32 `[x.rows, hidden]`, an allocation of `be`).
fn shared_dense(be: &CudaBackend, x: &CudaTensor, ex: &CudaExperts, out: u64) -> Result<()> {
    let (n, h, i, s, gpu) = (x.rows, ex.hidden, ex.inter, ex.shared, be.gpu());
    let first = ex.experts - s;
    let expanded;
    let (wgu, wdn) = match &ex.data {
        ExpertData::Bf16 { gate_up, down } => {
            (ptr(gate_up) + (first * 2 * i * h * 2) as u64, ptr(down) + (first * h * i * 2) as u64)
        }
        ExpertData::Quant { gate_up, down } => {
            let slots = |q: &super::quant::QuantWeight| {
                q.view().matrices(first, s).ok_or_else(|| {
                    EngineError::Backend(format!("{s} shared experts from slot {first}: not in the stack"))
                })
            };
            let (bgu, bdn) = (be.buf::<u16>(s * 2 * i * h)?, be.buf::<u16>(s * h * i)?);
            // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
            // GPU.
            unsafe { gpu.qdequant(&slots(gate_up)?, ptr(&bgu)) }.map_err(kerr)?;
            // SAFETY: the compressed weight and the bf16 output of all its values are live buffers of this
            // GPU.
            unsafe { gpu.qdequant(&slots(down)?, ptr(&bdn)) }.map_err(kerr)?;
            expanded = (bgu, bdn);
            (ptr(&expanded.0), ptr(&expanded.1))
        }
        ExpertData::F32 { .. } => unreachable!("reference precision folds shared experts at every size"),
    };
    let xb = be.bf16_in(x)?;
    let gu = be.alloc_f32(n * s * 2 * i)?;
    let act = be.alloc_u16(n * s * i)?;
    // SAFETY: input, weight and output are live buffers of this GPU of the GEMM's sizes.
    unsafe { gpu.linear_bf16(xb.ptr(), wgu, ptr(&gu), n, s * 2 * i, h) }.map_err(kerr)?;
    // SAFETY: input (rows x 2 half) and outputs (rows x half) are live buffers of this GPU.
    unsafe { gpu.silu_mul(ptr(&gu), 0, ptr(&act), n, s * i, true) }.map_err(kerr)?;
    for j in 0..s {
        let (a, w) = (ptr(&act) + (j * i * 2) as u64, wdn + (j * h * i * 2) as u64);
        // SAFETY: input (rows at its leading dimension), weight and output are live buffers of this
        // GPU of the GEMM's sizes.
        unsafe { gpu.linear_bf16_acc(a, s * i, w, out, n, h, i) }.map_err(kerr)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{local_assignments, prefill_sized};

    #[test]
    fn tile_rows_follow_the_whole_groups_experts() {
        // One GPU: V3's 256 routed experts at decode batch 256 (8 rows each), a 4k prompt (128).
        assert!(!prefill_sized(256, 8, 256));
        assert!(prefill_sized(4096, 8, 256));
        assert_eq!(local_assignments(256, 8, 256, 256), 2048, "a group of one expects every assignment");
        // A rank of a 4-way expert-parallel group holds 64 of them: at batch 256 it expects a
        // quarter of the 2,048 assignments, 8 rows per expert, decode tiles. Judged by its own 64
        // experts (the rule before run 99), the 2,048 looked like 32 rows each: prefill tiles.
        assert_eq!(local_assignments(256, 8, 64, 256) / 64, 8);
        assert!(prefill_sized(256, 8, 64));
        assert!(prefill_sized(1024, 8, 256));
        // V2-Lite's 64 experts, 6 per token: decode at 256 rows, prefill from 342 tokens.
        assert!(!prefill_sized(256, 6, 64));
        assert!(prefill_sized(342, 6, 64));
    }
}
