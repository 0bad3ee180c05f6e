//! Expert routing (`moe_route`) against the CPU backend, the assignment sort (`moe_align`)
//! against its host reference, exactly (each expert's rows in assignment order), the two in
//! one block (`moe_route_align`) against both kernels' own results, exactly, and a MoE layer's
//! entry in one kernel (`moe_gate`) against the three kernels it replaces.

use anyhow::Result;
use cleave_engine::backend::{Backend, RouterParams};
use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::{align_reference, Align, Gate, GemvOut, GemvWeight, Route};
use cleave_kernels::{ptr, Gpu};

use super::ops::{kerr, Ctx};
use super::{rel_err, Ceiling};

impl Ctx<'_> {
    pub fn router(&mut self) -> Result<()> {
        let odd = (
            "odd",
            RouterParams {
                n_experts: 12,
                n_group: 4,
                topk_group: 2,
                top_k: 4,
                norm_topk_prob: true,
                scaling: 2.5,
                shared: 0,
            },
        );
        let [lite, v3, v3_64] = models();
        let cases = [lite, v3, v3_64, odd];
        let sizes: &[usize] = if self.quick { &[7] } else { &[1, 64, 4096] };
        for (label, p) in cases {
            for &n in sizes {
                let logits = self.rng.vec(n * p.n_experts, 4.0);
                let bias = self.rng.vec(p.n_experts, 0.3);
                let (lc, lg) = self.up(&logits, n, p.n_experts)?;
                let (bc, bg) = self.up(&bias, 1, p.n_experts)?;
                let want = self.cpu.moe_route(&lc, &bc, p)?;
                let (ids, w) = self.cu.routing_to_host(&self.cu.moe_route(&lg, &bg, p)?)?;
                // Per token and expert (shared ones included), the weight given.
                let (k, width) = (p.top_k + p.shared, p.n_experts + p.shared);
                let dense = |ids: &[u32], w: &[f32]| {
                    let mut d = vec![0f32; n * width];
                    for (i, (&e, &x)) in ids.iter().zip(w).enumerate() {
                        d[(i / k) * width + (e as usize).min(width - 1)] += x;
                    }
                    d
                };
                let err = rel_err(&dense(&ids, &w), &dense(&want.ids, &want.weights));
                let us = self.time(|| self.cu.moe_route(&lg, &bg, p).map(drop))?;
                self.push(
                    "moe_route",
                    format!("{label}: {n} tokens, {} experts, top {}, {} shared", p.n_experts, p.top_k, p.shared),
                    err,
                    1e-3,
                    us,
                    (n * p.n_experts * 4) as f64,
                    0.0,
                    Ceiling::Mem,
                );
            }
        }
        Ok(())
    }

    /// `moe_route_align` at the batch sizes it takes (the one-warp sort up to 32 assignments, the
    /// block's above): its ids and weights equal `moe_route`'s bit for bit, its sort equals the
    /// host reference on those ids.
    pub fn route_align(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        let [lite, v3, v3_64] = models();
        // (model, local experts, first local expert, bm, half tiles)
        let cases = [
            (lite, 66, 0, 8, false),
            (v3, 257, 0, 16, false),
            (("V3 rank 2 of EP4", v3.1), 64, 128, 16, false),
            (v3_64, 65, 0, 16, false),
            (v3_64, 65, 0, 16, true),
        ];
        let sizes: &[usize] = if self.quick { &[1, 5] } else { &[1, 3, 4, 16, 64] };
        for ((label, p), local, first, bm, halves) in cases {
            let (experts, top_k) = (p.n_experts, p.top_k);
            for &n in sizes {
                let k = top_k + p.shared;
                let a = n * k;
                let (logits, bias) = (self.rng.vec(n * experts, 4.0), self.rng.vec(experts, 0.3));
                let (lg, bg) = (g.alloc::<f32>(logits.len()).map_err(kerr)?, g.alloc::<f32>(experts).map_err(kerr)?);
                g.htod(&logits, ptr(&lg)).map_err(kerr)?;
                g.htod(&bias, ptr(&bg)).map_err(kerr)?;
                // moe_route's results (0), moe_route_align's (1).
                let (ids0, w0) = (g.alloc::<u32>(a).map_err(kerr)?, g.alloc::<f32>(a).map_err(kerr)?);
                let (ids1, w1) = (g.alloc::<u32>(a).map_err(kerr)?, g.alloc::<f32>(a).map_err(kerr)?);
                let route = |ids: u64, wts: u64| Route {
                    logits: ptr(&lg),
                    bias: ptr(&bg),
                    ids,
                    wts,
                    n,
                    experts,
                    n_group: p.n_group,
                    topk_group: p.topk_group,
                    top_k,
                    shared: p.shared,
                    norm: p.norm_topk_prob,
                    scaling: p.scaling,
                };
                g.moe_route(&route(ptr(&ids0), ptr(&w0))).map_err(kerr)?;
                let sort = SortBufs::new(g, a, local, bm)?;
                let align = sort.align(ptr(&ids1), a, k, local, first, bm, halves);
                let fused = route(ptr(&ids1), ptr(&w1));
                g.moe_route_align(&fused, &align).map_err(kerr)?;
                let (mut want_ids, mut want_w, mut ids, mut w) =
                    (vec![0u32; a], vec![0f32; a], vec![0u32; a], vec![0f32; a]);
                g.dtoh(ptr(&ids0), &mut want_ids).map_err(kerr)?;
                g.dtoh(ptr(&w0), &mut want_w).map_err(kerr)?;
                g.dtoh(ptr(&ids1), &mut ids).map_err(kerr)?;
                g.dtoh(ptr(&w1), &mut w).map_err(kerr)?;
                let (sort_differing, sort_total) = sort.against_reference(g, &align, &ids)?;
                let differing = ids.iter().zip(&want_ids).filter(|(x, y)| x != y).count()
                    + w.iter().zip(&want_w).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
                    + sort_differing;
                let us = self.time(|| g.moe_route_align(&fused, &align).map_err(kerr))?;
                let half = if halves { format!(" and {}", bm / 2) } else { String::new() };
                self.push_exact(
                    "moe_route_align",
                    format!("{label}: {n} tokens, {local} local experts from {first}, tiles of {bm}{half}"),
                    differing,
                    2 * a + sort_total,
                    us,
                    (n * experts * 4) as f64,
                );
            }
        }
        Ok(())
    }

    /// `moe_gate` at the few tokens it takes against the kernels it replaces, on the same inputs
    /// (`rms_norm_f32` with the residual, the f32 GEMV, `moe_route_align`): the residual, the
    /// normalized input (f32 and bf16), the logits and the routing weights within 1e-5 (the
    /// norm's sum meets in another order), the routed ids and the sort exactly.
    pub fn moe_gate(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        let [lite, v3, v3_64] = models();
        let sizes: &[usize] = if self.quick { &[1, 3] } else { &[1, 2, 3, 4] };
        for ((label, p), h, bm) in [(lite, 2048, 8), (v3, 7168, 16), (v3_64, 7168, 16)] {
            let (e, k) = (p.n_experts, p.top_k + p.shared);
            for &n in sizes.iter().filter(|&&n| Gpu::moe_gate_takes(n, h, n * k)) {
                let a = n * k;
                let mut up = |len: usize, scale: f32| -> Result<CudaSlice<f32>> {
                    let buf = g.alloc::<f32>(len).map_err(kerr)?;
                    g.htod(&self.rng.vec(len, scale), ptr(&buf)).map_err(kerr)?;
                    Ok(buf)
                };
                let (att, norm, gate, bias) = (up(n * h, 1.0)?, up(h, 1.0)?, up(e * h, (3.0 / h as f32).sqrt())?, up(e, 0.3)?);
                let res0 = up(n * h, 1.0)?;
                let res1 = g.alloc::<f32>(n * h).map_err(kerr)?;
                g.dtod(ptr(&res1), ptr(&res0), n * h * 4).map_err(kerr)?;
                // The separate kernels' outputs (0) and moe_gate's (1).
                let path = || -> Result<_> {
                    Ok((
                        g.alloc::<f32>(n * h).map_err(kerr)?,
                        g.alloc::<u16>(n * h).map_err(kerr)?,
                        g.alloc::<f32>(n * e).map_err(kerr)?,
                        g.alloc::<u32>(a).map_err(kerr)?,
                        g.alloc::<f32>(a).map_err(kerr)?,
                        SortBufs::new(g, a, e + p.shared, bm)?,
                    ))
                };
                let ((y0, yb0, lg0, ids0, w0, sort0), (y1, yb1, lg1, ids1, w1, sort1)) = (path()?, path()?);
                let route = |logits: u64, ids: u64, wts: u64| Route {
                    logits,
                    bias: ptr(&bias),
                    ids,
                    wts,
                    n,
                    experts: e,
                    n_group: p.n_group,
                    topk_group: p.topk_group,
                    top_k: p.top_k,
                    shared: p.shared,
                    norm: p.norm_topk_prob,
                    scaling: p.scaling,
                };
                let eps = 1e-6;
                g.rms_norm(ptr(&att), ptr(&res0), ptr(&norm), ptr(&y0), ptr(&yb0), n, h, h, eps).map_err(kerr)?;
                let out = GemvOut { w: GemvWeight::F32(ptr(&gate)), y: ptr(&lg0), n: e };
                // SAFETY: y0 holds n x h f32, the gate e x h, lg0 n x e: allocations of this GPU.
                unsafe { g.gemv(ptr(&y0), 0, h, n, h, &[out], 0.0) }.map_err(kerr)?;
                let al0 = sort0.align(ptr(&ids0), a, k, e + p.shared, 0, bm, false);
                g.moe_route_align(&route(ptr(&lg0), ptr(&ids0), ptr(&w0)), &al0).map_err(kerr)?;
                let gate_in = Gate {
                    a: ptr(&att),
                    res: ptr(&res1),
                    norm: ptr(&norm),
                    y: ptr(&y1),
                    yb: ptr(&yb1),
                    cols: h,
                    eps,
                    gate: ptr(&gate),
                };
                let (r1, al1) = (route(ptr(&lg1), ptr(&ids1), ptr(&w1)), sort1.align(ptr(&ids1), a, k, e + p.shared, 0, bm, false));
                // SAFETY: every buffer above is sized for n tokens of h channels and e experts.
                unsafe { g.moe_gate(&gate_in, &r1, &al1) }.map_err(kerr)?;
                let f32s = |b: &CudaSlice<f32>, len: usize| -> Result<Vec<f32>> {
                    let mut v = vec![0f32; len];
                    g.dtoh(ptr(b), &mut v).map_err(kerr)?;
                    Ok(v)
                };
                let bf16s = |b: &CudaSlice<u16>| -> Result<Vec<f32>> {
                    let mut v = vec![0u16; n * h];
                    g.dtoh(ptr(b), &mut v).map_err(kerr)?;
                    Ok(v.iter().map(|&x| f32::from_bits((x as u32) << 16)).collect())
                };
                let err = [
                    rel_err(&f32s(&res1, n * h)?, &f32s(&res0, n * h)?),
                    rel_err(&f32s(&y1, n * h)?, &f32s(&y0, n * h)?),
                    rel_err(&bf16s(&yb1)?, &bf16s(&yb0)?),
                    rel_err(&f32s(&lg1, n * e)?, &f32s(&lg0, n * e)?),
                    rel_err(&f32s(&w1, a)?, &f32s(&w0, a)?),
                ]
                .into_iter()
                .fold(0f64, f64::max);
                let (mut ids, mut want) = (vec![0u32; a], vec![0u32; a]);
                g.dtoh(ptr(&ids1), &mut ids).map_err(kerr)?;
                g.dtoh(ptr(&ids0), &mut want).map_err(kerr)?;
                let (sort_differing, sort_total) = sort1.against_reference(g, &al1, &ids)?;
                let differing = ids.iter().zip(&want).filter(|(x, y)| x != y).count() + sort_differing;
                // Each timed launch adds the input to the residual again: harmless to the timing.
                // SAFETY: as above.
                let us = self.time(|| unsafe { g.moe_gate(&gate_in, &r1, &al1) }.map_err(kerr))?;
                let shape = format!("{label}: {n} tokens of {h}, {e} experts, top {}, {} shared", p.top_k, p.shared);
                let bytes = (e * h * 4 + 4 * n * h * 4) as f64;
                self.push("moe_gate", shape.clone(), err, 1e-5, us, bytes, 0.0, Ceiling::Mem);
                self.push_exact("moe_gate ids, sort", shape, differing, a + sort_total, us, bytes);
            }
        }
        Ok(())
    }

    /// `moe_align` on random routes (with the shared experts each token also takes) at decode and
    /// prefill sizes, over all experts and over one rank's share of them.
    pub fn align(&mut self) -> Result<()> {
        let g = self.cu.gpu();
        // (label, routed experts, top_k, shared, local experts, first local expert, bm, half tiles)
        let cases = [
            ("V2-Lite", 64, 6, 2, 66, 0, 8, false),
            ("V2-Lite", 64, 6, 2, 66, 0, 16, false),
            ("V2-Lite", 64, 6, 2, 66, 0, 16, true),
            ("V3", 256, 8, 1, 257, 0, 16, false),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 16, false),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 16, true),
            ("V3 rank 2 of EP4", 256, 8, 1, 64, 128, 64, false),
        ];
        let sizes: &[usize] = if self.quick { &[1, 37] } else { &[1, 8, 64, 256, 4096] };
        for (label, routed, top_k, shared, experts, first, bm, halves) in cases {
            for &n in sizes {
                let k = top_k + shared;
                let ids: Vec<u32> = self
                    .rng
                    .routes(n, routed, top_k)
                    .chunks(top_k)
                    .flat_map(|r| r.iter().copied().chain((0..shared).map(|s| (routed + s) as u32)))
                    .collect();
                let a = ids.len();
                let id_buf = g.alloc::<u32>(a).map_err(kerr)?;
                g.htod(&ids, ptr(&id_buf)).map_err(kerr)?;
                let sort = SortBufs::new(g, a, experts, bm)?;
                let align = sort.align(ptr(&id_buf), a, k, experts, first, bm, halves);
                g.moe_align(&align).map_err(kerr)?;
                let (differing, total) = sort.against_reference(g, &align, &ids)?;
                let us = self.time(|| g.moe_align(&align).map_err(kerr))?;
                let half = if halves { format!(" and {}", bm / 2) } else { String::new() };
                self.push_exact(
                    "moe_align",
                    format!("{label}: {n} tokens, {experts} local experts from {first}, tiles of {bm}{half}"),
                    differing,
                    total,
                    us,
                    (a * 4 * 3) as f64,
                );
            }
        }
        Ok(())
    }
}

/// The sort's device outputs for `a` assignments over `experts` local experts in tiles of `bm`
/// (and half tiles).
struct SortBufs {
    sorted: CudaSlice<i32>,
    inv: CudaSlice<i32>,
    tiles: CudaSlice<i32>,
    halves: CudaSlice<i32>,
    meta: CudaSlice<i32>,
}

impl SortBufs {
    fn new(g: &Gpu, a: usize, experts: usize, bm: usize) -> Result<Self> {
        let max_tiles = Gpu::moe_max_tiles(a, experts, bm);
        Ok(SortBufs {
            sorted: g.alloc::<i32>(a).map_err(kerr)?,
            inv: g.alloc::<i32>(a).map_err(kerr)?,
            tiles: g.alloc::<i32>(3 * max_tiles).map_err(kerr)?,
            halves: g.alloc::<i32>(3 * Gpu::moe_max_halves(a, experts).max(1)).map_err(kerr)?,
            meta: g.alloc::<i32>(2).map_err(kerr)?,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn align(&self, ids: u64, a: usize, top_k: usize, experts: usize, first: usize, bm: usize, halves: bool) -> Align {
        Align {
            ids,
            assignments: a,
            top_k,
            experts,
            first,
            bm,
            sorted_tok: ptr(&self.sorted),
            inv: ptr(&self.inv),
            tiles: ptr(&self.tiles),
            halves: if halves { ptr(&self.halves) } else { 0 },
            meta: ptr(&self.meta),
            row_expert: 0,
        }
    }

    /// (entries differing from `align_reference` on the host `ids`, entries compared): the
    /// placed rows, `inv`, the tiles, the half tiles and their counts.
    fn against_reference(&self, g: &Gpu, al: &Align, ids: &[u32]) -> Result<(usize, usize)> {
        let want = align_reference(ids, al.top_k, al.experts, al.first, al.bm, al.halves != 0);
        let (mut sorted, mut inv, mut meta) = (vec![0i32; ids.len()], vec![0i32; ids.len()], [0i32; 2]);
        g.dtoh(ptr(&self.sorted), &mut sorted).map_err(kerr)?;
        g.dtoh(ptr(&self.inv), &mut inv).map_err(kerr)?;
        g.dtoh(ptr(&self.meta), &mut meta).map_err(kerr)?;
        let triples = |buf: &CudaSlice<i32>, want: &[[i32; 3]]| -> Result<(usize, usize)> {
            let mut got = vec![0i32; 3 * want.len()];
            g.dtoh(ptr(buf), &mut got).map_err(kerr)?;
            Ok((got.iter().zip(want.iter().flatten()).filter(|(x, y)| x != y).count(), got.len()))
        };
        let (tiles_diff, tiles_n) = triples(&self.tiles, &want.tiles)?;
        let (halves_diff, halves_n) = triples(&self.halves, &want.halves)?;
        let counts = (meta[0] as usize != want.tiles.len()) as usize
            + (al.halves != 0 && meta[1] as usize != want.halves.len()) as usize;
        let differing = sorted.iter().zip(&want.sorted_tok).filter(|(x, y)| x != y).count()
            + inv.iter().zip(&want.inv).filter(|(x, y)| x != y).count()
            + tiles_diff
            + halves_diff
            + counts;
        Ok((differing, want.sorted_tok.len() + inv.len() + tiles_n + halves_n + 2))
    }
}

/// The routers of the models checked: V2-Lite, V3/R1, and V3's routing over 64 experts (the
/// V3-shaped bench models: groups of 8 experts, four per lane column).
fn models() -> [(&'static str, RouterParams); 3] {
    let v3 = RouterParams {
        n_experts: 256,
        n_group: 8,
        topk_group: 4,
        top_k: 8,
        norm_topk_prob: true,
        scaling: 2.5,
        shared: 1,
    };
    let lite = RouterParams {
        n_experts: 64,
        n_group: 1,
        topk_group: 1,
        top_k: 6,
        norm_topk_prob: false,
        scaling: 1.0,
        shared: 2,
    };
    [("V2-Lite", lite), ("V3", v3), ("V3, 64 experts", RouterParams { n_experts: 64, ..v3 })]
}
